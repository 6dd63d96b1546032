/*
 * Private plumbing shared by the backends of kernels/: the k-means driver
 * (one algorithm, the assignment kernel pluggable per backend), index array
 * growth, and small helpers.  Not for use outside kernels/.
 */
#ifndef KN_INTERNAL_H
#define KN_INTERNAL_H

#include <math.h>

#include "common/cm_alloc.h"
#include "kernels/kn_ops.h"

extern cm_alloc_tag_t kn_tag;

/* best[i] = argmax_j x_i . c_j over j in [0, nc) (ties: lowest j); x [n][d],
 * c [nc][d], fp32.  nc >= 1. */
typedef void (*kn_assign_fn_t)(const float *x, size_t n, const float *c, size_t nc, uint32_t d,
                               uint32_t *best);

/* The segmented spherical k-means of docs/architecture.md with the given
 * assignment kernel; appends to idx. */
ri_status_t kn_index_build_impl(const kn_build_params_t *p, const cm_fp16_t *k, const cm_fp16_t *v,
                                size_t stride, uint32_t n, uint32_t token_base,
                                uint32_t n_clusters, uint32_t n_segments, kn_index_t *idx,
                                kn_assign_fn_t assign);

/* Make room for add_clusters more clusters and add_tokens more perm entries. */
ri_status_t kn_index_reserve(kn_index_t *idx, uint32_t add_clusters, uint32_t add_tokens);

/* The backends' tables. */
extern const kn_ops_t kn_ref_ops;
extern const kn_ops_t kn_cpu_ops;

bool kn_ref_supports(kn_op_t op, const kn_shape_t *shape, kn_dtype_t dtype);

/* Reference group ops reused by the cpu backend for its scalar fallback. */
ri_status_t kn_ref_attn_decode(const kn_shape_t *shape, size_t n_seq, const float *q,
                               const kn_kv_view_t *kv, float *out, float *lse);
ri_status_t kn_ref_attn_pages(const kn_shape_t *grp, const float *q, const kn_page_t *pages,
                              size_t n_pages, float *o, float *lse);
ri_status_t kn_ref_rank(const kn_shape_t *grp, const float *q, const kn_index_t *idx, uint32_t n_r,
                        uint32_t n_e, uint32_t *ids, uint32_t *n_r_p, uint32_t *n_e_p);
ri_status_t kn_ref_estimate(const kn_shape_t *grp, const float *q, const kn_index_t *idx,
                            const uint32_t *ids, size_t n, float *o, float *lse);
ri_status_t kn_ref_merge(size_t n_rows, uint32_t d, size_t n_parts, const float *const *o_parts,
                         const float *const *lse_parts, float *o, float *lse);
ri_status_t kn_ref_index_build(const kn_build_params_t *p, const cm_fp16_t *k, const cm_fp16_t *v,
                               size_t stride, uint32_t n, uint32_t token_base,
                               uint32_t n_clusters, uint32_t n_segments, kn_index_t *idx);
ri_status_t kn_ref_quest_score(const kn_shape_t *grp, const float *q, const cm_fp16_t *kmin,
                               const cm_fp16_t *kmax, size_t n_pages, float *scores);

/* cpu backend: rank and the estimation zone in one pass (the estimation
 * reuses the rank's logits instead of reading the centroids again).  Same
 * contracts as rank + estimate over ids[n_r .. n_r+n_e). */
ri_status_t kn_cpu_rank_estimate(const kn_shape_t *grp, const float *q, const kn_index_t *idx,
                                 uint32_t n_r, uint32_t n_e, uint32_t *ids, uint32_t *n_r_p,
                                 uint32_t *n_e_p, float *o_e, float *lse_e);

/* Partial selection: reorder ids[0..n) (keyed by score[ids[i]]) so that the
 * k largest come first (ties broken by smaller id), in O(n) expected. */
void kn_select_top(uint32_t *ids, size_t n, size_t k, const float *score);

/* out[h*n + t] = qs_h . row_t for the g pre-scaled query rows qs [g][d] and n
 * fp16 rows (row t at rows + t*stride); SIMD when the CPU allows. */
void kn_group_scores(const float *qs, uint32_t g, uint32_t d, const cm_fp16_t *rows, size_t stride,
                     size_t n, float *out);

/* Largest GQA group the layer-level helpers keep on the stack. */
#define KN_GMAX_LOCAL 64

/* splitmix64 step, for seeded streams. */
static inline uint64_t kn_splitmix64(uint64_t *state)
{
    uint64_t z = (*state += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

/* Element i of cluster j's value mean as the decode reads it: the int8
 * mean times the cluster's scale, in fp32 (kn_vq_quantize).  Every backend
 * dequantizes so; the CUDA kernels write the same product. */
static inline float kn_vq_at(const int8_t *vq, const float *vscale, size_t j, size_t d, size_t i)
{
    return (float)vq[j * d + i] * vscale[j];
}

/* Logit numerator of cluster j as ranking reads it: cscale[j] * dot(q,
 * c8[j]) in fp32 (the int8 centroid times its scale, kn_vq_quantize's
 * rule).  The scale multiplies the finished dot, once a cluster: what the
 * SIMD and CUDA paths do too. */
static inline float kn_cq_dot(const float *q, const int8_t *c8, const float *cscale, size_t j, uint32_t d)
{
    const int8_t *c = c8 + j * d;
    float s = 0.0f;
    for (uint32_t i = 0; i < d; i++)
        s += q[i] * (float)c[i];
    return s * cscale[j];
}

#endif /* KN_INTERNAL_H */
