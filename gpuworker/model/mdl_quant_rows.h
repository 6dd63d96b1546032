/*
 * Internal to mdl_quant.c: the AVX2 decode products of four Q5_0, Q4_1,
 * Q4_K or Q6_K weight rows at a time with one row of int16 activations (per
 * 32-block scales xd and exact block sums xs, as mdl_quant.c quantises
 * them).  Each row's arithmetic is
 * that of mdl_quant.c's one-row kernel, in the same order, so a row's
 * result is the same bits whichever kernel computes it (test_model_quant
 * checks it); the scalar reference of both is mdl_dot_ref.  x86-64 only;
 * the caller checks that the CPU has AVX2, FMA and F16C.
 */
#ifndef MDL_QUANT_ROWS_H
#define MDL_QUANT_ROWS_H

#include <stddef.h>
#include <stdint.h>

/* Weight rows the kernels below take at once. */
#define MDL_ROWS4 4

/* out[i] = row i of the MDL_ROWS4 Q5_0 rows at p (row_bytes apart, nb
 * blocks each) times the activations (the -16 offset through the block
 * sums xs). */
void mdl_dot4_q5_0_q16act_avx2(const uint8_t *p, size_t row_bytes, size_t nb, const int16_t *xq, const float *xd,
                               const float *xs, float *out);

/* The same for Q4_1 rows (the min through xs).  The rows are consecutive,
 * so the prefetch runs one stream over the next group. */
void mdl_dot4_q4_1_q16act_avx2(const uint8_t *p, size_t row_bytes, size_t nb, const int16_t *xq, const float *xd,
                               const float *xs, float *out);

/* The same for Q4_K rows of nsb super-blocks (mins through xs) and Q6_K
 * rows (xs not needed: the -32 is applied in int16). */
void mdl_dot4_q4_k_q16act_avx2(const uint8_t *p, size_t row_bytes, size_t nsb, const int16_t *xq, const float *xd,
                               const float *xs, float *out);
void mdl_dot4_q6_k_q16act_avx2(const uint8_t *p, size_t row_bytes, size_t nsb, const int16_t *xq, const float *xd,
                               float *out);

#endif /* MDL_QUANT_ROWS_H */
