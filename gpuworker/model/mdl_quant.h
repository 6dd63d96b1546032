/*
 * Dequantising matrix products for the model runtime: weights stay in their
 * GGUF storage type (Q4_0, Q4_1, Q5_0, Q8_0, Q4_K, Q6_K, F16, BF16, F32) and are expanded block
 * by block while multiplying fp32 activations.  Each operation has a scalar
 * reference (mdl_*_ref, plain loops, the oracle of the tests) and an optimised
 * version (AVX2/FMA/F16C chosen at run time, threads through cm_pool; the
 * decode products with int16 activations in AVX-512 where the CPU has it,
 * the prefill products with int16 activations on AVX-512 VNNI where it has
 * that).
 * Workload: decode multiplies one activation row per sequence (memory bound:
 * each weight byte read once per step); prefill multiplies chunks of 16-128
 * rows (compute bound: each weight row is expanded once and reused).
 */
#ifndef MDL_QUANT_H
#define MDL_QUANT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "common/cm_thread.h"
#include "gpuworker/model/mdl_gguf.h"
#include "retroinfer/status.h"

/* A weight matrix: rows of `cols` elements in storage type `type`. */
typedef struct mdl_weight {
    mdl_ggml_type_t type;  /* storage type */
    size_t rows;           /* output features */
    size_t cols;           /* input features (row length) */
    size_t row_bytes;      /* bytes per stored row */
    const void *data;      /* borrowed (usually the GGUF mapping) */
} mdl_weight_t;

/* True for the storage types the matmul handles. */
bool mdl_quant_supported(mdl_ggml_type_t type);

/* Describe a GGUF tensor as a weight (2-D, or 1-D as one row). */
ri_status_t mdl_weight_from_tensor(const mdl_gguf_tensor_t *t, mdl_weight_t *w_p);

/* Expand row r of w into out[cols]: reference and optimised. */
void mdl_dequant_row_ref(const mdl_weight_t *w, size_t r, float *out);
void mdl_dequant_row(const mdl_weight_t *w, size_t r, float *out);

/* Dot product of row r of w with x[cols]: reference (double accumulation)
 * and optimised. */
double mdl_dot_ref(const mdl_weight_t *w, size_t r, const float *x);
float mdl_dot(const mdl_weight_t *w, size_t r, const float *x);

/* y[i][j] = sum_k x[i][k] * W[j][k] for i < n, j < rows (y row stride = rows).
 * Threads from pool (NULL: the caller alone).  Errors only on out of memory. */
ri_status_t mdl_matmul(cm_pool_t *pool, const mdl_weight_t *w, const float *x, size_t n, float *y);

/* Several products of the same input in one parallel loop (Q/K/V, gate/up):
 * y[k] = x W[k]^T for k < nw (nw <= 4, all W[k] with the same cols).
 * Products smaller than mdl_quant_set_par_min multiply-adds (default 512K;
 * a quarter of it while the pool's workers spin, cm_pool_spinning) run on
 * the caller's thread.  RI_ERR_INVALID for mismatched shapes. */
ri_status_t mdl_matmul_multi(cm_pool_t *pool, const mdl_weight_t *const *w, size_t nw, const float *x, size_t n,
                             float *const *y);
/* The threshold above (0 = the default); programs pass their
 * --model-par-min / RI_MODEL_PAR_MIN setting at start-up. */
void mdl_quant_set_par_min(size_t macs);

/* Reference matmul: single thread, mdl_dot_ref. */
void mdl_matmul_ref(const mdl_weight_t *w, const float *x, size_t n, float *y);

/* How decode products (n <= 2) of Q4_0/Q4_1/Q8_0 weights (int16 also
 * Q5_0/Q4_K/Q6_K, which take int16 under int8 too) take their
 * activations: fp32 (weights expanded to fp32), int16 per 32-block (default:
 * integer madd, relative error 1.5e-5), or int8 per 32-block (maddubs, as
 * ggml; fastest, ~1e-2 of the logit range).  Prefill products (more than
 * 4 rows) take int16 only in the default mode and only on the VNNI GEMM
 * (mdl_quant_gemm16_active), fp32 otherwise.  Programs set the initial mode
 * from their --model-act / RI_MODEL_ACT setting (f32|i16|i8). */
typedef enum mdl_act_mode { MDL_ACT_F32 = 0, MDL_ACT_I16 = 1, MDL_ACT_I8 = 2 } mdl_act_mode_t;
void mdl_quant_set_act(mdl_act_mode_t mode);
mdl_act_mode_t mdl_quant_get_act(void);
/* Shorthand: on = int8, off = the default int16. */
void mdl_quant_q8_activations(bool on);

/* True when the optimised paths use AVX2+FMA on this CPU. */
bool mdl_quant_have_simd(void);

/* The AVX-512BW decode products (Q8_0, Q5_0, Q4_1, Q4_K, Q6_K weights, int16 activations):
 * used where the CPU has AVX-512BW unless turned off here (programs pass
 * --model-avx512 / RI_MODEL_AVX512).  Off selects
 * the AVX2 ones (tests, A/B timing); on re-enables them where supported. */
void mdl_quant_set_avx512(bool on);
/* True when the AVX-512BW decode products are in use. */
bool mdl_quant_avx512_active(void);

/* True when prefill products (more than 4 activation rows) of weights of
 * this type take the int16-activation GEMM (AVX-512 VNNI: Q4_0, Q4_1, Q8_0,
 * Q5_0, Q4_K, Q6_K) under the current settings: default int16 activations,
 * AVX-512 on (mdl_quant_set_avx512), not forced scalar, a CPU with VNNI.
 * Otherwise they expand the weights to fp32. */
bool mdl_quant_gemm16_active(mdl_ggml_type_t type);

/* Force the scalar paths in the optimised entry points (tests, comparisons). */
void mdl_quant_force_scalar(bool on);

#endif /* MDL_QUANT_H */
