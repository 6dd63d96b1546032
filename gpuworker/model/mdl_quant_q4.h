/*
 * Internal to mdl_quant.c: the AVX-512 decode product of Q4_1 weights with
 * int16 activations (per 32-block scales xd and exact block sums xs, as
 * mdl_quant.c quantises them).  x86-64 only; the caller checks that the CPU
 * has AVX-512F/BW/DQ.
 */
#ifndef MDL_QUANT_Q4_H
#define MDL_QUANT_Q4_H

#include <stddef.h>
#include <stdint.h>

/* One row of int16 activations (cols a multiple of 32) regrouped for the
 * product into out[cols], and each block's xd and xs side by side into
 * xds[2 * cols / 32]. */
void mdl_q4_pairs_layout(const int16_t *xq, const float *xd, const float *xs, size_t cols, int16_t *out,
                         float *xds);

/* The Q4_1 row of nb blocks at p times activations that went through
 * mdl_q4_pairs_layout (xq, xds). */
float mdl_dot_q4_1_q16act_avx512(const uint8_t *p, size_t nb, const int16_t *xq, const float *xds);

#endif /* MDL_QUANT_Q4_H */
