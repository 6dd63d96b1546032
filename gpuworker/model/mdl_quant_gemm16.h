/*
 * Prefill matrix products with int16 activations and AVX-512 VNNI (internal
 * to mdl_quant.c; see mdl_quant.h for the public entry points).  The
 * activation rows come quantised per 32-block (int16 values, a scale and
 * the exact fp32 block sum per block, as the decode products take them);
 * a tile of up to 48 weight rows is unpacked once into an int16 panel laid
 * out for an outer-product micro-kernel (vpdpwssd: 32 int16 multiply-adds
 * per instruction, twice the fp32 FMA's 16), then multiplied with every
 * activation row.  Workload: prefill chunks of 16-128 rows, so each weight
 * row's unpacking is shared by many activation rows.
 */
#ifndef MDL_QUANT_GEMM16_H
#define MDL_QUANT_GEMM16_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "gpuworker/model/mdl_quant.h"

/* Output rows per tile (three 16-row vectors). */
#define MDL_G16_TILE 48

/* True when this CPU has AVX-512F/BW and AVX-512 VNNI (decided once). */
bool mdl_gemm16_cpu(void);

/* True for the weight types the kernels take (Q4_0, Q4_1, Q8_0, Q5_0,
 * Q4_K, Q6_K); the caller checks mdl_gemm16_cpu and the settings. */
bool mdl_gemm16_type(mdl_ggml_type_t type);

/* Bytes of scratch one worker needs for rows of `cols` elements (64-byte
 * aligned by the caller). */
size_t mdl_gemm16_scratch_bytes(size_t cols);

/* y[i][r] = sum_k x[i][k] W[r][k] for i < n, r0 <= r < r1 (y row stride
 * w->rows), from the activations quantised per 32-block: xq[n][cols] int16,
 * xd[n][cols/32] scales, xs[n][cols/32] block sums (all borrowed).  scratch:
 * mdl_gemm16_scratch_bytes(w->cols), 64-byte aligned, the caller's.  Only
 * on a CPU with mdl_gemm16_cpu, for a type with mdl_gemm16_type. */
void mdl_gemm16_rows(const mdl_weight_t *w, size_t r0, size_t r1, const int16_t *xq, const float *xd, const float *xs,
                     size_t n, float *y, void *scratch);

#endif /* MDL_QUANT_GEMM16_H */
