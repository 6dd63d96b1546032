/*
 * Private interface of the CPU backend: the flash-attention block state and
 * the AVX2+FMA+F16C kernels (kn_cpu_simd.c, compiled with target attributes
 * and only called after the run-time CPU check).
 */
#ifndef KN_CPU_SIMD_H
#define KN_CPU_SIMD_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "common/cm_half.h"

#define KN_GMAX 8          /* largest GQA group of the SIMD path */
#define KN_GMAX_STATE 64   /* largest GQA group of the CPU backend */
#define KN_BLK 64          /* tokens per online-softmax block */

/* Running online-softmax state of one group: acc = sum p_t v_t with
 * p_t = exp(s_t - m), l = sum p_t. */
typedef struct kn_fa_state {
    uint32_t g, d;
    const float *q;            /* [g][d], pre-scaled */
    float *acc;                /* [g][d], 64-byte aligned */
    float m[KN_GMAX_STATE];    /* running max */
    float l[KN_GMAX_STATE];    /* running denominator */
    bool simd;                 /* use the AVX2 path */
} kn_fa_state_t;

/* q [g][d] is scaled into qbuf; qbuf and acc hold g*d floats, 64-byte aligned. */
void kn_fa_init(kn_fa_state_t *fs, const float *q, uint32_t g, uint32_t d, float scale,
                float *qbuf, float *acc);
/* Fold n rows (row i at k/v + i*stride) into the state. */
void kn_fa_rows(kn_fa_state_t *fs, const cm_fp16_t *k, const cm_fp16_t *v, size_t stride, size_t n);
/* o [g][d] = acc / l, lse [g] = m + ln l (-inf when empty). */
void kn_fa_finish(const kn_fa_state_t *fs, float *o, float *lse);

/* Merge n_parts contiguous parts o_parts [p][n_rows][d], lse_parts [p][n_rows]
 * into o [n_rows][d] and lse (may be NULL). */
void kn_merge_contig(uint32_t n_rows, uint32_t d, size_t n_parts, const float *o_parts,
                     const float *lse_parts, float *o, float *lse);

/* AVX2 kernels: g <= KN_GMAX, d % 16 == 0 (assign: d % 8 == 0). */
void kn_fa_rows_avx2(kn_fa_state_t *fs, const cm_fp16_t *k, const cm_fp16_t *v, size_t stride,
                     size_t n);
/* out[h*out_stride + t] = qs_h . row_t for n fp16 rows. */
void kn_scores_avx2(const float *qs, uint32_t g, uint32_t d, const cm_fp16_t *rows, size_t stride,
                    size_t n, float *out, size_t out_stride);
/* The same over int8 rows (d bytes each, row j's scale sc[j]), the rank's
 * int8 centroids: out[h*os + t] = sc_t * (qs_h . row_t) for n rows, and
 * out[h*os + e] = sc_id * (qs_h . row(id)) for id = ids[e] (fastest when
 * ids ascend). */
void kn_scores_q_avx2(const float *qs, uint32_t g, uint32_t d, const int8_t *c8, const float *sc, size_t n, float *out,
                      size_t os);
void kn_scores_gather_q_avx2(const float *qs, uint32_t g, uint32_t d, const int8_t *c8, const float *sc,
                             const uint32_t *ids, size_t n, float *out, size_t os);
/* x[i] = exp(x[i] - m); returns the sum. */
float kn_exp_sub_sum_avx2(float *x, size_t n, float m);
/* max of x[0..n), -inf when n == 0 (comparisons as CM_MAX). */
float kn_max_avx2(const float *x, size_t n);
/* y += a * x, d % 8 == 0. */
void kn_axpy_avx2(float *y, const float *x, float a, uint32_t d);
/* acc [g][d] += sum_e w[h*n+e] * vsum[ids[e]][:] (d % 16 == 0). */
void kn_est_accum_avx2(float *acc, const float *vsum, const uint32_t *ids, const float *w,
                       size_t n, uint32_t g, uint32_t d);
/* acc [g][d] += sum_e w[h*n+e] * vs[ids[e]] * vq[ids[e]][:] over int8 rows
 * (d % 16 == 0). */
void kn_est_accum_q_avx2(float *acc, const int8_t *vq, const float *vs, const uint32_t *ids, const float *w, size_t n,
                         uint32_t g, uint32_t d);
/* Fold the rows of np pages, in order, into the state (blocks of KN_BLK
 * rows across page boundaries). */
struct kn_page;
void kn_fa_pages_avx2(kn_fa_state_t *fs, const struct kn_page *pages, size_t np);
void kn_assign_avx2(const float *x, size_t n, const float *c, size_t nc, uint32_t d,
                    uint32_t *best);
void kn_quest_score_avx2(const float *q, uint32_t g, uint32_t d, const cm_fp16_t *kmin,
                         const cm_fp16_t *kmax, size_t n_pages, float scale, float *scores);

#endif /* KN_CPU_SIMD_H */
