/*
 * kernels/: every numeric op of RetroInfer (docs/architecture.md), each as a
 * scalar reference ("ref"), an optimised CPU version ("cpu": AVX2+FMA+F16C
 * chosen at run time, scalar fallback, threads from the common pool) and,
 * later, a CUDA version ("cuda"), behind one ops table (kn_ops_t).
 *
 * Workload: decode, i.e. one query token per sequence against a long fp16 K/V
 * cache (8K..1M tokens), memory bound; plus the wave-index build (k-means,
 * compute bound) at prefill and every 1024 generated tokens.
 *
 * ---------------------------------------------------------------------------
 * Memory layouts (all element counts, not bytes)
 * ---------------------------------------------------------------------------
 *  q      fp32 [n_q_heads][head_dim], one row per query head.  Query head h
 *         belongs to KV head h / (n_q_heads / n_kv_heads) (GQA: consecutive
 *         query heads share a KV head, as in Llama).
 *  out    fp32 [n_q_heads][head_dim], same layout as q.
 *  lse    fp32 [n_q_heads], natural-log log-sum-exp of the scaled logits
 *         (logit = scale * q.k); -INFINITY for an empty token set.
 *  K, V   fp16 (IEEE binary16) rows of head_dim values, described by a
 *         kn_kv_view_t: the row of token t, KV head h starts at
 *             k + t * token_stride + h * head_stride
 *         Common layouts:
 *           token-major [n_tokens][n_kv_heads][d]: token_stride = n_kv*d,
 *                                                  head_stride  = d
 *           head-major  [n_kv_heads][n_tokens][d]: token_stride = d,
 *                                                  head_stride  = cap*d
 *         Rows must be contiguous (head_dim values in a row).  Head-major
 *         streams best; both run at full speed on the CPU backend.
 *  pages  a gathered token set for exact attention (steady zone, retrieved
 *         clusters from a block cache or an execution buffer) is a list of
 *         kn_page_t: n_tokens rows of one KV head, row i at k + i*stride.
 *
 * Group-level ops (attn_pages, rank, estimate, merge, quest_score) work on one
 * GQA group (one KV head and its g query heads) and are single-threaded, so
 * that callers can run many of them from a cm_pool loop.  Layer-level calls
 * (kn_attn_decode, the kn_wave_* and kn_quest_* objects) spread work over
 * the common thread pool (cm_pool_default(), or kn_set_pool()).
 *
 * Every op accumulates in fp32.  Errors: RI_ERR_INVALID for bad shapes or
 * NULL pointers, RI_ERR_NOMEM, RI_ERR_UNSUPPORTED when no backend can do it.
 */
#ifndef KN_OPS_H
#define KN_OPS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "common/cm_half.h"
#include "common/cm_runtime.h"
#include "common/cm_thread.h"
#include "retroinfer/status.h"

/* Storage type of K/V.  Only fp16 is implemented now (the index's
 * centroids are int8 whatever it is). */
typedef enum kn_dtype {
    KN_DTYPE_F16 = 0,
    KN_DTYPE_BF16 = 1,
} kn_dtype_t;

/* Attention geometry of one layer (or of one group: n_kv_heads = 1). */
typedef struct kn_shape {
    uint32_t n_q_heads;   /* query heads; a multiple of n_kv_heads */
    uint32_t n_kv_heads;  /* KV heads */
    uint32_t head_dim;    /* d */
    float scale;          /* logit scale; 0 means 1/sqrt(d) */
} kn_shape_t;

/* K/V of one sequence, one layer (see the layouts above).  Borrowed. */
typedef struct kn_kv_view {
    const cm_fp16_t *k;   /* row of token 0, KV head 0 */
    const cm_fp16_t *v;   /* same layout as k */
    size_t n_tokens;      /* tokens in the sequence */
    size_t token_stride;  /* elements from token t to t+1 (same head) */
    size_t head_stride;   /* elements from KV head h to h+1 (same token) */
} kn_kv_view_t;

/* A run of token rows of ONE KV head.  Borrowed. */
typedef struct kn_page {
    const cm_fp16_t *k;   /* first K row */
    const cm_fp16_t *v;   /* first V row */
    uint32_t n_tokens;    /* rows in the page (0 allowed) */
    uint32_t stride;      /* elements between consecutive rows (>= head_dim) */
} kn_page_t;

/* Op identifiers for supports(). */
typedef enum kn_op {
    KN_OP_ATTN_DECODE = 0, /* full attention decode, split-K */
    KN_OP_ATTN_PAGES,      /* exact partial attention over pages -> (o, lse) */
    KN_OP_RANK,            /* cluster ranking */
    KN_OP_ESTIMATE,        /* estimation zone -> (o, lse) */
    KN_OP_MERGE,           /* log-sum-exp merge of parts */
    KN_OP_INDEX_BUILD,     /* segmented spherical k-means */
    KN_OP_QUEST_SCORE,     /* Quest page upper bounds */
    KN_OP_WAVE_STEP,       /* layer-level tripartite decode step of every KV head */
    KN_OP_COUNT
} kn_op_t;

const char *kn_op_name(kn_op_t op);

/* ---------------------------------------------------------------------------
 * Wave index of one KV head (docs/architecture.md).
 * Clusters are numbered 0..n_clusters-1; cluster j holds the tokens
 * perm[offsets[j] .. offsets[j+1]) (token positions in the sequence).
 * Appending (decode-time update) adds clusters and perm entries at the end.
 * ------------------------------------------------------------------------- */
typedef struct kn_index {
    uint32_t head_dim;      /* d */
    uint32_t n_clusters;    /* C */
    uint32_t n_tokens;      /* tokens indexed (= offsets[C]) */
    uint32_t cap_clusters;  /* allocated clusters */
    uint32_t cap_tokens;    /* allocated perm entries */
    int8_t *centroids;      /* [cap][d] the plain mean of the real keys, quantized
                               by the build (kn_vq_quantize, the value means' rule):
                               mean ~= centroids * cscale[j].  Ranking reads
                               cscale[j] * dot(q, centroids[j]) in fp32; the k-means
                               itself runs in fp32 and only its result is quantized */
    float *cscale;          /* [cap] one scale a cluster (0 for an all-zero mean) */
    float *vsum;            /* [cap][d] sum of the values, fp32: the build's scratch.
                               kn_index_build drops it (NULL) once vq is filled,
                               so a built index carries int8 centroids + int8 means
                               (2d + 8 bytes a cluster); a backend's index_build
                               called directly, or an index made by hand, keeps it */
    uint32_t *sizes;        /* [cap] tokens per cluster (0 = empty) */
    uint32_t *offsets;      /* [cap+1] start of each cluster in perm */
    uint32_t *perm;         /* [cap_tokens] token ids, cluster-major */
    int8_t *vq;             /* [cap][d] the value mean VS_j / n_j quantized
                               (kn_vq_quantize): mean ~= vq * vscale[j]; filled by
                               kn_index_build: what every decode reads (dequantized
                               in fp32), a quarter of the bytes of vsum.  Only the
                               estimation reads it (ranking reads the centroids), so
                               the retrieval does not depend on it.  NULL in an index
                               made by hand (the decode reads vsum then) */
    float *vscale;          /* [cap] one scale a cluster (0 for an all-zero mean);
                               NULL exactly when vq is */
    uint32_t fixed_clusters; /* 0: the arrays are the index's own (heap).  > 0: all seven
                                (centroids, cscale, vq, vscale, sizes, offsets, perm) live at fixed
                                addresses, room for this many clusters and fixed_tokens
                                perm entries, which the caller owns and frees after the
                                index (kn_wave_place: a shared prefix's rows and tables
                                mapped copy-on-write); never moved, and growing past
                                either room copies all seven to the heap (sharing lost,
                                contents kept) */
    uint32_t fixed_tokens;   /* perm entries of room at the fixed home (0 when not fixed) */
} kn_index_t;

/* Fixed homes for an index's arrays (kn_wave_place), owned by the caller:
 * room for cap_clusters clusters and cap_tokens perm entries. */
typedef struct kn_index_homes {
    int8_t *centroids;    /* [cap_clusters][d], 64-byte aligned */
    float *cscale;        /* [cap_clusters] */
    int8_t *vq;           /* [cap_clusters][d], 64-byte aligned */
    float *vscale;        /* [cap_clusters] */
    uint32_t *sizes;      /* [cap_clusters] */
    uint32_t *offsets;    /* [cap_clusters + 1] */
    uint32_t *perm;       /* [cap_tokens] */
    uint32_t cap_clusters, cap_tokens;
} kn_index_homes_t;

/* One KV head of a layer-level tripartite step (the wave_step op): its
 * index and its K/V, in the memory the backend reads (host for ref and cpu,
 * device for cuda). */
typedef struct kn_wave_head {
    const int8_t *centroids;     /* [n_clusters][d] int8 centroids (times cscale) */
    const float *cscale;         /* [n_clusters] their scales */
    const uint32_t *sizes;       /* [n_clusters] */
    const uint32_t *offsets;     /* [n_clusters]: cluster j's first row in ck / cv */
    const int8_t *vq;            /* [n_clusters][d]: int8 value means (what the
                                    estimation reads: vq * vscale, times the size) */
    const float *vscale;         /* [n_clusters] their scales */
    const cm_fp16_t *ck, *cv;    /* the indexed rows, cluster-major, stride d */
    uint32_t n_clusters;
    kn_page_t steady[2];         /* the steady zone: sinks and window (n_tokens 0: none) */
} kn_wave_head_t;

/* Clustering settings (defaults in docs/architecture.md). */
typedef struct kn_build_params {
    uint32_t iters;          /* spherical k-means iterations per segment, at most (9) */
    float stop_moved;        /* a segment stops iterating once a round moved at most this
                                share of its tokens to another cluster (0.001; 0 = only
                                when none moved, which changes nothing).  The CPU builds;
                                the CUDA build runs every iteration */
    int32_t final_neighbours;/* final reassignment: -1 = against all centroids;
                                k >= 0 = own segment and k segments each side */
    uint64_t seed;           /* reserved for randomised inits; strided init ignores it */
} kn_build_params_t;

void kn_build_params_default(kn_build_params_t *p);

/* Bytes an index holds allocated now: centroids and means (int8) and
 * their scales (fp32), sizes, offsets, perm at their capacities (none of
 * the seven when they live at fixed homes: the caller's), and the sums when
 * present (fp32: a hand-made index, or a backend build's result). */
uint64_t kn_index_resident_bytes(const kn_index_t *idx);

/* Quantize one cluster's value mean (or its centroid: mul = 1), mean[i] =
 * v[i] * mul (mul = 1 / n_j turns a sum into the mean), to int8 with one
 * scale: symmetric,
 * *scale_p = max_i |mean[i]| / 127 and q[i] = round(mean[i] / *scale_p), so
 * |q[i] * *scale_p - mean[i]| <= *scale_p / 2.  An all-zero mean (or an
 * empty cluster, mul = 0) gives scale 0 and q = 0.  The scale is fp32: an
 * fp16 one would add its own rounding to every element of the row and lose
 * precision below 6e-5 (subnormal), for 2 bytes a cluster (< 1% of the
 * meta entry).  The decode reads mean[i] as (float)q[i] * scale. */
void kn_vq_quantize(const float *v, float mul, uint32_t d, int8_t *q, float *scale_p);

/* Initialise an empty index for head_dim d (no allocation). */
void kn_index_init(kn_index_t *idx, uint32_t head_dim);

/* Free the arrays of an index; leaves it empty.  Arrays at fixed homes are
 * not freed, and stay its homes (a rebuild writes there again).  NULL is a
 * no-op. */
void kn_index_cleanup(kn_index_t *idx);

/* Number of clusters for n indexed tokens: round(n/tpc) rounded to a multiple
 * of lcm(8, S); *n_segments_p gets S = max(round(n/seg_tokens), 1).  0 when
 * n == 0. */
uint32_t kn_index_plan(uint32_t n_tokens, uint32_t tokens_per_cluster, uint32_t segment_tokens,
                       uint32_t *n_segments_p);

/* ---------------------------------------------------------------------------
 * The ops table.  All function pointers are set for every backend; call
 * supports() first (the kn_* wrappers below do, and fall back to ref).
 * ------------------------------------------------------------------------- */
typedef struct kn_ops {
    const char *name;   /* "ref", "cpu", "cuda" */

    /* True when this backend handles op for this shape and K/V dtype. */
    bool (*supports)(kn_op_t op, const kn_shape_t *shape, kn_dtype_t dtype);

    /* Full attention for n_seq sequences: q and out are [n_seq][n_q][d],
     * lse [n_seq][n_q] or NULL, kv[n_seq] (lengths may differ, 0 allowed). */
    ri_status_t (*attn_decode)(const kn_shape_t *shape, size_t n_seq, const float *q,
                               const kn_kv_view_t *kv, float *out, float *lse);

    /* Exact attention of one group (shape->n_kv_heads == 1) over pages:
     * q, o [g][d], lse [g]. */
    ri_status_t (*attn_pages)(const kn_shape_t *grp, const float *q, const kn_page_t *pages,
                              size_t n_pages, float *o, float *lse);

    /* Rank clusters for one group: score s_j = sum over the g query heads of
     * softmax_j(scale*q.c_j) over non-empty clusters.  Writes the n_r best
     * ids to ids[0..n_r) and the next n_e to ids[n_r..n_r+n_e) (each part in
     * no particular order); both are cut to the non-empty clusters available
     * (*n_r_p, *n_e_p get the counts).  ids has room for n_r + n_e. */
    ri_status_t (*rank)(const kn_shape_t *grp, const float *q, const kn_index_t *idx,
                        uint32_t n_r, uint32_t n_e, uint32_t *ids, uint32_t *n_r_p,
                        uint32_t *n_e_p);

    /* Estimation zone of one group over clusters ids[0..n): logit
     * scale*q.c_j + ln n_j, value VS_j / n_j.  o [g][d], lse [g]. */
    ri_status_t (*estimate)(const kn_shape_t *grp, const float *q, const kn_index_t *idx,
                            const uint32_t *ids, size_t n, float *o, float *lse);

    /* Merge n_parts (o, lse) parts of n_rows rows of d values:
     * o_parts[p] [n_rows][d], lse_parts[p] [n_rows]; out may alias none. */
    ri_status_t (*merge)(size_t n_rows, uint32_t d, size_t n_parts, const float *const *o_parts,
                         const float *const *lse_parts, float *o, float *lse);

    /* Cluster n tokens of one KV head (rows k/v + i*stride, token ids
     * token_base + i) into n_clusters clusters over n_segments segments and
     * APPEND them to idx (grows its arrays).  Deterministic. */
    ri_status_t (*index_build)(const kn_build_params_t *p, const cm_fp16_t *k, const cm_fp16_t *v,
                               size_t stride, uint32_t n, uint32_t token_base, uint32_t n_clusters,
                               uint32_t n_segments, kn_index_t *idx);

    /* Quest page scores of one group: for each page p, max over the g heads
     * of sum_i max(q_i*kmin[p][i], q_i*kmax[p][i]) * scale.  kmin/kmax fp16
     * [n_pages][d]; scores [n_pages]. */
    ri_status_t (*quest_score)(const kn_shape_t *grp, const float *q, const cm_fp16_t *kmin,
                               const cm_fp16_t *kmax, size_t n_pages, float *scores);

    /* One decode step of tripartite attention for every KV head of a layer
     * (shape->n_kv_heads heads[]): per head, rank the clusters (n_r to
     * retrieve, the next n_e to estimate: the rank's contract), estimate
     * the n_e from the centroids and int8 value means, attend exactly over
     * the steady zone and the n_r retrieved clusters, and merge the two
     * parts.  q, out [n_q][d], lse [n_q].  ids (NULL: not wanted) gets per
     * head n_r + n_e slots: the retrieved ids, then the estimated ones, each
     * set in ascending id order; counts (NULL: not wanted) per head
     * {retrieved, estimated}.  ref and cpu: the group ops above, head by
     * head (kn_wave_step_host); cuda: kn_cuda_wave_step, on the device
     * from end to end (its pointer rules: kn_cuda.h). */
    ri_status_t (*wave_step)(const kn_shape_t *shape, const float *q, const kn_wave_head_t *heads, uint32_t n_r,
                             uint32_t n_e, float *out, float *lse, uint32_t *ids, uint32_t *counts);
} kn_ops_t;

/* wave_step on the host over ops' rank, estimate, attn_pages and merge,
 * head by head (the ref and cpu backends' wave_step).  RI_ERR_INVALID for
 * an invalid shape, RI_ERR_NOMEM. */
ri_status_t kn_wave_step_host(const kn_ops_t *ops, const kn_shape_t *shape, const float *q,
                              const kn_wave_head_t *heads, uint32_t n_r, uint32_t n_e, float *out, float *lse,
                              uint32_t *ids, uint32_t *counts);

/* The scalar reference (the oracle: plain loops, double accumulation where it matters). */
const kn_ops_t *kn_ops_ref(void);
/* The optimised CPU backend (AVX2/FMA/F16C when present, else scalar). */
const kn_ops_t *kn_ops_cpu(void);
/* The CUDA backend, or NULL when not linked in (library ri_kernels_cuda) or
 * no device is present. */
const kn_ops_t *kn_ops_cuda(void);
/* Called by the CUDA backend at load time (borrowed, static lifetime). */
void kn_ops_register_cuda(const kn_ops_t *ops);

/* A backend's fused rank + estimation of one group (one read of the
 * centroids): the rank op's contract, then the estimate op's over the
 * estimation zone ids[*n_r_p, *n_r_p + *n_e_p) into (o_e, lse_e). */
typedef ri_status_t (*kn_rank_estimate_fn_t)(const kn_shape_t *grp, const float *q, const kn_index_t *idx,
                                             uint32_t n_r, uint32_t n_e, uint32_t *ids, uint32_t *n_r_p,
                                             uint32_t *n_e_p, float *o_e, float *lse_e);

/* The CUDA backend's fused op, registered with its table (kn_cuda_init)
 * because ri_kernels cannot link the CUDA library; NULL until then. */
void kn_ops_register_cuda_fused(kn_rank_estimate_fn_t fn);
kn_rank_estimate_fn_t kn_ops_cuda_fused(void);
/* The backend kn_ops_select chose, else the best available (cuda if
 * present, else cpu). */
const kn_ops_t *kn_ops_default(void);
/* Choose what kn_ops_default returns: "ref", "cpu", "cuda" (falls back to
 * the best available where CUDA is absent), or NULL / "" for the best
 * available.  Called once at start-up (programs pass their --kernels /
 * RI_KERNELS setting).  RI_ERR_INVALID for another name (nothing changes). */
ri_status_t kn_ops_select(const char *name);
/* Apply the kernel settings of rt (kernels, kernels-no-simd; see
 * cm_runtime.h).  RI_ERR_INVALID with err set for a bad backend name. */
ri_status_t kn_runtime_apply(const cm_runtime_t *rt, char *err, size_t errlen);
/* Fill up to max backends that run here (ref first); returns how many. */
size_t kn_ops_list(const kn_ops_t **out, size_t max);

/* Which SIMD path the cpu backend uses: "avx2" or "scalar". */
const char *kn_cpu_isa(void);
/* Let the CPU backend use AVX2 where the CPU has it (default on); off runs
 * its scalar paths (programs pass !--kernels-no-simd / RI_KERNELS_NO_SIMD).
 * Call at start-up, before kernels run. */
void kn_cpu_simd_enable(bool on);

/* Pool used by layer-level calls (NULL = cm_pool_default()).  Borrowed; must
 * outlive its use.  Never call layer-level functions from inside a loop of
 * the same pool. */
void kn_set_pool(cm_pool_t *pool);
cm_pool_t *kn_pool(void);

/* ---------------------------------------------------------------------------
 * Checked wrappers: validate arguments, use ops (NULL = kn_ops_default()) when
 * it supports the case, else the cpu backend, else the reference.  Same
 * contracts as the table.
 * ------------------------------------------------------------------------- */
ri_status_t kn_attn_decode(const kn_ops_t *ops, const kn_shape_t *shape, size_t n_seq,
                           const float *q, const kn_kv_view_t *kv, float *out, float *lse);
ri_status_t kn_attn_pages(const kn_ops_t *ops, const kn_shape_t *grp, const float *q,
                          const kn_page_t *pages, size_t n_pages, float *o, float *lse);
ri_status_t kn_rank(const kn_ops_t *ops, const kn_shape_t *grp, const float *q,
                    const kn_index_t *idx, uint32_t n_r, uint32_t n_e, uint32_t *ids,
                    uint32_t *n_r_p, uint32_t *n_e_p);
ri_status_t kn_estimate(const kn_ops_t *ops, const kn_shape_t *grp, const float *q,
                        const kn_index_t *idx, const uint32_t *ids, size_t n, float *o,
                        float *lse);
ri_status_t kn_merge(const kn_ops_t *ops, size_t n_rows, uint32_t d, size_t n_parts,
                     const float *const *o_parts, const float *const *lse_parts, float *o,
                     float *lse);
/* kn_index_build appends n tokens as n_clusters clusters (the backend's
 * index_build), fills their int8 means (kn_vq_quantize) and drops the fp32 sums: the index it
 * leaves is the compact one (vsum NULL). */
ri_status_t kn_index_build(const kn_ops_t *ops, const kn_build_params_t *p, const cm_fp16_t *k,
                           const cm_fp16_t *v, size_t stride, uint32_t n, uint32_t token_base,
                           uint32_t n_clusters, uint32_t n_segments, kn_index_t *idx);

/* The k-th largest of v[0..n) (1 <= k <= n); reorders v so that v[0..k-1)
 * hold values >= it.  O(n) expected (quickselect, median of three): for
 * callers choosing a top-k on the host, e.g. a device bench's Quest pages. */
float kn_kth_largest(float *v, size_t n, size_t k);

/* Logit scale of a shape (scale, or 1/sqrt(d) when 0). */
float kn_shape_scale(const kn_shape_t *shape);

/* True when the shape is valid (non-zero, n_q a multiple of n_kv). */
bool kn_shape_valid(const kn_shape_t *shape);

#endif /* KN_OPS_H */
