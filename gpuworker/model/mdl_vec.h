/*
 * Small fp32 vector helpers of the model runtime (dot, axpy, scale, exp,
 * RMSNorm, SiLU), AVX2/FMA when the CPU has it, scalar otherwise.  The exp is
 * a range-reduced degree-6 polynomial (relative error < 2e-7 on the
 * arguments softmax produces: x <= 0).
 */
#ifndef MDL_VEC_H
#define MDL_VEC_H

#include <stdbool.h>
#include <stddef.h>

/* sum a[i]*b[i] */
float mdl_vec_dot(const float *a, const float *b, size_t n);
/* y += a * x */
void mdl_vec_axpy(float *y, float a, const float *x, size_t n);
/* y *= a */
void mdl_vec_scale(float *y, float a, size_t n);
/* max of s[0..n), -INFINITY when n == 0 */
float mdl_vec_max(const float *s, size_t n);
/* s[i] = exp(s[i] - m); returns the sum */
float mdl_vec_exp_sub(float *s, size_t n, float m);
/* out = x / rms(x) * w  (rms over n, eps inside the root); out may be x */
void mdl_vec_rmsnorm(float *out, const float *x, const float *w, size_t n, float eps);
/* s[j] = scale * q.K[j] for nk rows of K (row length d) */
void mdl_vec_scores(const float *q, const float *K, size_t nk, size_t d, float scale, float *s);
/* acc[0..d) += sum_j p[j] * V[j] */
void mdl_vec_pv(float *acc, const float *p, const float *V, size_t nk, size_t d);
/* The same for nr query rows sharing the keys / values (the query heads of
 * one KV head): s[r * nk + j] = scale * q[r * d ..].K[j], and
 * acc[r * d ..] += sum_j p[r * p_stride + j] * V[j].  Each K / V row is read
 * once for each group of 4 rows (AVX2 when d is a multiple of 16 other than
 * 64, AVX-512 where the CPU has it unless mdl_vec_set_avx512(false); d = 64
 * and leftover rows use the one-row kernels). */
void mdl_vec_scores_rows(const float *q, size_t nr, const float *K, size_t nk, size_t d, float scale, float *s);
void mdl_vec_pv_rows(float *acc, size_t nr, const float *p, size_t p_stride, const float *V, size_t nk, size_t d);
/* Let the row kernels use AVX-512 where the CPU has it (default on);
 * programs pass their --model-avx512 / RI_MODEL_AVX512 setting. */
void mdl_vec_set_avx512(bool on);
/* g[i] = silu(g[i]) * u[i] */
void mdl_vec_swiglu(float *g, const float *u, size_t n);
/* g[i] = gelu(g[i]) * u[i], GELU in its tanh form (Gemma's GeGLU) */
void mdl_vec_geglu(float *g, const float *u, size_t n);

#endif /* MDL_VEC_H */
