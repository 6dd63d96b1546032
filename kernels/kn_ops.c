/*
 * The ops table plumbing: backend lookup, the checked wrappers (validate,
 * dispatch, fall back to the reference), index arrays, partial selection.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/cm_log.h"
#include "common/cm_status.h"
#include "kernels/kn_internal.h"

CM_ALLOC_TAG(kn_tag, "kernels");

static cm_pool_t *kn_pool_override;
static const kn_ops_t *_Atomic kn_cuda_registered;

const char *kn_op_name(kn_op_t op)
{
    static const char *names[KN_OP_COUNT] = {
        "attn_decode", "attn_pages", "rank", "estimate", "merge", "index_build", "quest_score", "wave_step",
    };
    return (unsigned)op < KN_OP_COUNT ? names[op] : "unknown";
}

float kn_shape_scale(const kn_shape_t *shape)
{
    return shape->scale != 0.0f ? shape->scale : 1.0f / sqrtf((float)shape->head_dim);
}

bool kn_shape_valid(const kn_shape_t *shape)
{
    return shape != NULL && shape->n_kv_heads > 0 && shape->n_q_heads > 0 && shape->head_dim > 0 &&
           shape->head_dim <= 4096 && shape->n_q_heads % shape->n_kv_heads == 0 &&
           isfinite(shape->scale);
}

void kn_build_params_default(kn_build_params_t *p)
{
    p->iters = 9;
    p->stop_moved = 0.001f;
    p->final_neighbours = -1;
    p->seed = 0x5EEDull;
}

void kn_set_pool(cm_pool_t *pool)
{
    kn_pool_override = pool;
}

cm_pool_t *kn_pool(void)
{
    return kn_pool_override ? kn_pool_override : cm_pool_default();
}

const kn_ops_t *kn_ops_ref(void)
{
    return &kn_ref_ops;
}

const kn_ops_t *kn_ops_cpu(void)
{
    return &kn_cpu_ops;
}

/* The CUDA backend (kernels/cuda/, library ri_kernels_cuda) registers itself
 * when it is linked in and a device is present. */
void kn_ops_register_cuda(const kn_ops_t *ops)
{
    kn_cuda_registered = ops;
}

const kn_ops_t *kn_ops_cuda(void)
{
    return kn_cuda_registered;
}

static kn_rank_estimate_fn_t kn_cuda_fused_fn;

void kn_ops_register_cuda_fused(kn_rank_estimate_fn_t fn)
{
    kn_cuda_fused_fn = fn;
}

kn_rank_estimate_fn_t kn_ops_cuda_fused(void)
{
    return kn_cuda_fused_fn;
}

static char kn_ops_want[8];   /* kn_ops_select: "", "ref", "cpu" or "cuda" */

ri_status_t kn_ops_select(const char *name)
{
    if (name == NULL)
        name = "";
    if (name[0] != '\0' && strcmp(name, "ref") != 0 && strcmp(name, "cpu") != 0 && strcmp(name, "cuda") != 0)
        return RI_ERR_INVALID;
    snprintf(kn_ops_want, sizeof(kn_ops_want), "%s", name);
    return RI_OK;
}

const kn_ops_t *kn_ops_default(void)
{
    if (strcmp(kn_ops_want, "ref") == 0)
        return kn_ops_ref();
    if (strcmp(kn_ops_want, "cpu") == 0)
        return kn_ops_cpu();
    return kn_ops_cuda() ? kn_ops_cuda() : kn_ops_cpu();
}

ri_status_t kn_runtime_apply(const cm_runtime_t *rt, char *err, size_t errlen)
{
    if (kn_ops_select(rt->kernels) != RI_OK) {
        snprintf(err, errlen, "kernels (RI_KERNELS) '%s' is not one of ref, cpu, cuda", rt->kernels);
        return RI_ERR_INVALID;
    }
    kn_cpu_simd_enable(!rt->kernels_no_simd);
    return RI_OK;
}

size_t kn_ops_list(const kn_ops_t **out, size_t max)
{
    const kn_ops_t *all[3] = {kn_ops_ref(), kn_ops_cpu(), kn_ops_cuda()};
    size_t n = 0;
    for (size_t i = 0; i < 3; i++)
        if (all[i] != NULL && n < max)
            out[n++] = all[i];
    return n;
}

/* ---- index arrays ---- */

void kn_index_init(kn_index_t *idx, uint32_t head_dim)
{
    memset(idx, 0, sizeof(*idx));
    idx->head_dim = head_dim;
}

uint64_t kn_index_resident_bytes(const kn_index_t *idx)
{
    uint64_t c = idx->cap_clusters, d = idx->head_dim, b = 0;
    if (idx->vsum != NULL)
        b += c * d * sizeof(float);
    if (idx->fixed_clusters) /* the other seven are the caller's */
        return b;
    if (idx->centroids != NULL) /* int8 centroids and their fp32 scales */
        b += c * (d * sizeof(int8_t) + sizeof(float));
    if (idx->vq != NULL) /* int8 means and their fp32 scales */
        b += c * (d * sizeof(int8_t) + sizeof(float));
    return b + c * 2 * sizeof(uint32_t) + (uint64_t)idx->cap_tokens * sizeof(uint32_t);
}

void kn_index_cleanup(kn_index_t *idx)
{
    kn_index_t home;

    if (idx == NULL)
        return;
    home = *idx;
    if (!idx->fixed_clusters) {
        cm_free(idx->centroids);
        cm_free(idx->cscale);
        cm_free(idx->vq);
        cm_free(idx->vscale);
        cm_free(idx->sizes);
        cm_free(idx->offsets);
        cm_free(idx->perm);
    }
    cm_free(idx->vsum);
    kn_index_init(idx, idx->head_dim);
    if (home.fixed_clusters) { /* the caller's arrays: still where the next build writes */
        idx->centroids = home.centroids;
        idx->cscale = home.cscale;
        idx->vq = home.vq;
        idx->vscale = home.vscale;
        idx->sizes = home.sizes;
        idx->offsets = home.offsets;
        idx->perm = home.perm;
        idx->fixed_clusters = home.fixed_clusters;
        idx->fixed_tokens = home.fixed_tokens;
    }
}

/* A heap copy of the first n bytes of src in a block of cap bytes (at least
 * one byte), or NULL: line-aligned for the means (as kn_index_grow_clusters
 * keeps them), else a block cm_realloc can grow. */
static void *kn_index_dup(const void *src, size_t n, size_t cap, bool aligned)
{
    void *c = aligned ? cm_malloc_aligned(&kn_tag, cap ? cap : 1, 64) : cm_malloc(&kn_tag, cap ? cap : 1);
    if (c != NULL && n > 0)
        memcpy(c, src, n);
    return c;
}

/* Past the fixed homes' room: all seven arrays move to the heap at the
 * index's capacities, contents kept (the caller still owns and frees the
 * homes; the index never touches them again). */
static ri_status_t kn_index_unfix(kn_index_t *idx)
{
    size_t c = idx->cap_clusters, n = idx->n_clusters;
    size_t u = sizeof(uint32_t), qrow = idx->head_dim;
    void *a[7] = {
        kn_index_dup(idx->centroids, n * qrow, c * qrow, true),
        kn_index_dup(idx->cscale, n * sizeof(float), c * sizeof(float), false),
        kn_index_dup(idx->vq, n * qrow, c * qrow, true),
        kn_index_dup(idx->vscale, n * sizeof(float), c * sizeof(float), false),
        kn_index_dup(idx->sizes, n * u, c * u, false),
        kn_index_dup(idx->offsets, (n + 1) * u, (c + 1) * u, false),
        kn_index_dup(idx->perm, (size_t)idx->n_tokens * u, (size_t)idx->cap_tokens * u, false),
    };

    if (!a[0] || !a[1] || !a[2] || !a[3] || !a[4] || !a[5] || !a[6]) {
        for (int i = 0; i < 7; i++)
            cm_free(a[i]);
        return RI_ERR_NOMEM;
    }
    idx->centroids = a[0];
    idx->cscale = a[1];
    idx->vq = a[2];
    idx->vscale = a[3];
    idx->sizes = a[4];
    idx->offsets = a[5];
    idx->perm = a[6];
    idx->fixed_clusters = 0;
    idx->fixed_tokens = 0;
    return RI_OK;
}

void kn_vq_quantize(const float *v, float mul, uint32_t d, int8_t *q, float *scale_p)
{
    float m = 0.0f, scale;
    for (uint32_t i = 0; i < d; i++)
        m = CM_MAX(m, fabsf(v[i] * mul));
    if (!(m > 0.0f) || !isfinite(m)) { /* all zero: scale 0; no finite bound: the */
        memset(q, 0, d);               /* scale carries the inf / NaN to the output */
        *scale_p = m == 0.0f ? 0.0f : m;
        return;
    }
    scale = m / 127.0f;
    for (uint32_t i = 0; i < d; i++) {
        float r = v[i] * mul / scale; /* in [-127, 127] up to rounding */
        r = r > 127.0f ? 127.0f : (r < -127.0f ? -127.0f : r);
#ifdef KN_VQ_MUTANT_TRUNCATE /* the tests' mutant: toward zero, off by up to a whole step */
        q[i] = (int8_t)r;
        continue;
#endif
        q[i] = (int8_t)lroundf(r);
    }
    *scale_p = scale;
}

/* The int8 means of clusters [first, n_clusters) from their sums.  Here,
 * after whichever backend built them, so that no index reaches a decode
 * with its means missing. */
static void kn_index_fill_means(kn_index_t *idx, uint32_t first)
{
    size_t d = idx->head_dim;
    for (size_t j = first; j < idx->n_clusters; j++)
        kn_vq_quantize(idx->vsum + j * d, idx->sizes[j] ? 1.0f / (float)idx->sizes[j] : 0.0f, (uint32_t)d,
                       idx->vq + j * d, &idx->vscale[j]);
}

/* *rows [n][d] int8 moved into a new line-aligned block of cap rows: a
 * gathered row of d = 64 is then one cache line, not two. */
static ri_status_t kn_index_grow_rows(int8_t **rows, size_t n, size_t cap, size_t d)
{
    int8_t *c = cm_malloc_aligned(&kn_tag, cap ? cap * d : 1, 64);
    if (c == NULL)
        return RI_ERR_NOMEM;
    if (*rows != NULL)
        memcpy(c, *rows, n * d);
    cm_free(*rows);
    *rows = c;
    return RI_OK;
}

/* Grow the heap arrays of clusters (centroids and their scales, the sums,
 * means, sizes, offsets) to cap; at fixed homes only the sums (the homes
 * have room). */
static ri_status_t kn_index_grow_clusters(kn_index_t *idx, uint32_t cap)
{
    size_t d = idx->head_dim;
    void *c;

    if (idx->vsum != NULL) { /* a backend's build without the means dropped them */
        c = cm_realloc(&kn_tag, idx->vsum, (size_t)(cap ? cap : 1) * d * sizeof(float));
        if (c == NULL)
            return RI_ERR_NOMEM;
        idx->vsum = c;
    }
    if (idx->fixed_clusters)
        return RI_OK;
    if (kn_index_grow_rows(&idx->centroids, idx->n_clusters, cap, d) != RI_OK ||
        kn_index_grow_rows(&idx->vq, idx->n_clusters, cap, d) != RI_OK)
        return RI_ERR_NOMEM;
    c = cm_realloc(&kn_tag, idx->cscale, (size_t)(cap ? cap : 1) * sizeof(float));
    if (c == NULL)
        return RI_ERR_NOMEM;
    idx->cscale = c;
    c = cm_realloc(&kn_tag, idx->vscale, (size_t)(cap ? cap : 1) * sizeof(float));
    if (c == NULL)
        return RI_ERR_NOMEM;
    idx->vscale = c;
    c = cm_realloc(&kn_tag, idx->sizes, (size_t)(cap ? cap : 1) * sizeof(uint32_t));
    if (c == NULL)
        return RI_ERR_NOMEM;
    idx->sizes = c;
    c = cm_realloc(&kn_tag, idx->offsets, ((size_t)cap + 1) * sizeof(uint32_t));
    if (c == NULL)
        return RI_ERR_NOMEM;
    if (idx->offsets == NULL)
        ((uint32_t *)c)[0] = 0;
    idx->offsets = c;
    return RI_OK;
}

ri_status_t kn_index_reserve(kn_index_t *idx, uint32_t add_clusters, uint32_t add_tokens)
{
    uint64_t need_c = (uint64_t)idx->n_clusters + add_clusters;
    uint64_t need_t = (uint64_t)idx->n_tokens + add_tokens;
    size_t d = idx->head_dim;

    if (need_c > UINT32_MAX / 2 || need_t > UINT32_MAX / 2)
        return RI_ERR_RANGE;
    if (idx->fixed_clusters && (need_c > idx->fixed_clusters || need_t > idx->fixed_tokens) &&
        kn_index_unfix(idx) != RI_OK)
        return RI_ERR_NOMEM;
    if (need_c > idx->cap_clusters || idx->offsets == NULL) {
        uint32_t cap = (uint32_t)CM_MAX(need_c, (uint64_t)idx->cap_clusters * 3 / 2);
        if (idx->fixed_clusters) /* the homes have room: only the sums grow */
            cap = CM_MIN(cap, idx->fixed_clusters);
        if (kn_index_grow_clusters(idx, cap) != RI_OK)
            return RI_ERR_NOMEM;
        idx->cap_clusters = cap;
    }
    if (idx->vsum == NULL) { /* the build's scratch: only the new clusters' rows are written */
        idx->vsum = cm_malloc(&kn_tag, (size_t)(idx->cap_clusters ? idx->cap_clusters : 1) * d * sizeof(float));
        if (idx->vsum == NULL)
            return RI_ERR_NOMEM;
    }
    if (need_t > idx->cap_tokens || idx->perm == NULL) {
        uint32_t cap = (uint32_t)CM_MAX(need_t, (uint64_t)idx->cap_tokens * 3 / 2);
        void *c = idx->perm;
        if (idx->fixed_clusters)
            cap = CM_MIN(cap, idx->fixed_tokens);
        else if ((c = cm_realloc(&kn_tag, idx->perm, (size_t)(cap ? cap : 1) * sizeof(uint32_t))) == NULL)
            return RI_ERR_NOMEM;
        idx->perm = c;
        idx->cap_tokens = cap;
    }
    return RI_OK;
}

static uint32_t kn_gcd(uint32_t a, uint32_t b)
{
    while (b) {
        uint32_t t = a % b;
        a = b;
        b = t;
    }
    return a;
}

uint32_t kn_index_plan(uint32_t n_tokens, uint32_t tokens_per_cluster, uint32_t segment_tokens,
                       uint32_t *n_segments_p)
{
    uint32_t S, C, l;
    if (tokens_per_cluster == 0)
        tokens_per_cluster = 16;
    if (segment_tokens == 0)
        segment_tokens = 8192;
    S = (uint32_t)llround((double)n_tokens / segment_tokens);
    S = S ? S : 1;
    if (n_segments_p)
        *n_segments_p = S;
    if (n_tokens == 0)
        return 0;
    l = 8 / kn_gcd(8, S) * S;  /* lcm(8, S) */
    C = (uint32_t)llround((double)n_tokens / tokens_per_cluster);
    C = (uint32_t)(llround((double)C / l) * l);
    return C ? C : l;
}

/* ---- partial selection ----
 * Quickselect on a copy of the scores (direct floats, no indirection) finds
 * the k-th largest value; one pass then moves the ids above it to the front
 * and fills up with the tied ids of smallest number.  O(n) expected. */

float kn_kth_largest(float *v, size_t n, size_t k)
{
    size_t lo = 0, hi = n - 1;  /* answer is v[k-1] once [0,k-1) >= it >= (k-1,n) */
    size_t want = k - 1;
    while (lo < hi) {
        float a = v[lo], b = v[lo + (hi - lo) / 2], c = v[hi], pivot, t;
        size_t i = lo, j = hi;
        /* median of three */
        pivot = a > b ? (b > c ? b : (a > c ? c : a)) : (a > c ? a : (b > c ? c : b));
        while (i <= j) {
            while (v[i] > pivot)
                i++;
            while (v[j] < pivot)
                j--;
            if (i <= j) {
                t = v[i];
                v[i] = v[j];
                v[j] = t;
                i++;
                if (j == 0)
                    break;
                j--;
            }
        }
        if (want <= j)
            hi = j;
        else if (want >= i)
            lo = i;
        else
            return v[want];
    }
    return v[want];
}

static int kn_cmp_u32(const void *a, const void *b)
{
    uint32_t x = *(const uint32_t *)a, y = *(const uint32_t *)b;
    return (x > y) - (x < y);
}

void kn_select_top(uint32_t *ids, size_t n, size_t k, const float *score)
{
    float *v, thr;
    uint32_t *out;
    size_t gt = 0, ties = 0, w = 0;

    if (k == 0 || k >= n)
        return;
    v = cm_malloc(&kn_tag, n * sizeof(float));
    out = cm_malloc(&kn_tag, n * sizeof(uint32_t));
    if (v == NULL || out == NULL) {
        /* no memory: a simple O(n k) selection keeps the contract */
        for (size_t i = 0; i < k; i++) {
            size_t best = i;
            for (size_t j = i + 1; j < n; j++)
                if (score[ids[j]] > score[ids[best]] ||
                    (score[ids[j]] == score[ids[best]] && ids[j] < ids[best]))
                    best = j;
            uint32_t t = ids[i];
            ids[i] = ids[best];
            ids[best] = t;
        }
        cm_free(v);
        cm_free(out);
        return;
    }
    for (size_t i = 0; i < n; i++)
        v[i] = score[ids[i]];
    thr = kn_kth_largest(v, n, k);
    for (size_t i = 0; i < n; i++) {
        gt += score[ids[i]] > thr;
        ties += score[ids[i]] == thr;
    }
    /* front: everything above thr; then the ties (smallest ids first); then the rest */
    for (size_t i = 0; i < n; i++)
        if (score[ids[i]] > thr)
            out[w++] = ids[i];
    for (size_t i = 0; i < n; i++)
        if (score[ids[i]] == thr)
            out[w++] = ids[i];
    if (ties > k - gt) {
        /* only the smallest tied ids may go to the front; they usually come
         * in ascending order already (e.g. many underflowed zero scores) */
        bool sorted = true;
        for (size_t i = gt + 1; i < gt + ties && sorted; i++)
            sorted = out[i - 1] < out[i];
        if (!sorted)
            qsort(out + gt, ties, sizeof(uint32_t), kn_cmp_u32);
    }
    for (size_t i = 0; i < n; i++)
        if (score[ids[i]] < thr || isnan(score[ids[i]]))
            out[w++] = ids[i];
    memcpy(ids, out, n * sizeof(uint32_t));
    cm_free(v);
    cm_free(out);
}

/* ---- checked wrappers ---- */

static const kn_ops_t *kn_pick(const kn_ops_t *ops, kn_op_t op, const kn_shape_t *shape)
{
    if (ops == NULL)
        ops = kn_ops_default();
    if (ops->supports(op, shape, KN_DTYPE_F16))
        return ops;
    if (kn_ops_cpu()->supports(op, shape, KN_DTYPE_F16))
        return kn_ops_cpu();
    return kn_ops_ref();
}

static bool kn_grp_valid(const kn_shape_t *grp)
{
    return kn_shape_valid(grp) && grp->n_kv_heads == 1;
}

ri_status_t kn_attn_decode(const kn_ops_t *ops, const kn_shape_t *shape, size_t n_seq,
                           const float *q, const kn_kv_view_t *kv, float *out, float *lse)
{
    if (!kn_shape_valid(shape) || (n_seq && (q == NULL || kv == NULL || out == NULL)))
        return RI_ERR_INVALID;
    for (size_t s = 0; s < n_seq; s++)
        if (kv[s].n_tokens && (kv[s].k == NULL || kv[s].v == NULL))
            return RI_ERR_INVALID;
    return kn_pick(ops, KN_OP_ATTN_DECODE, shape)->attn_decode(shape, n_seq, q, kv, out, lse);
}

ri_status_t kn_attn_pages(const kn_ops_t *ops, const kn_shape_t *grp, const float *q,
                          const kn_page_t *pages, size_t n_pages, float *o, float *lse)
{
    if (!kn_grp_valid(grp) || q == NULL || o == NULL || lse == NULL || (n_pages && !pages))
        return RI_ERR_INVALID;
    for (size_t p = 0; p < n_pages; p++)
        if (pages[p].n_tokens && (!pages[p].k || !pages[p].v || pages[p].stride < grp->head_dim))
            return RI_ERR_INVALID;
    return kn_pick(ops, KN_OP_ATTN_PAGES, grp)->attn_pages(grp, q, pages, n_pages, o, lse);
}

ri_status_t kn_rank(const kn_ops_t *ops, const kn_shape_t *grp, const float *q,
                    const kn_index_t *idx, uint32_t n_r, uint32_t n_e, uint32_t *ids,
                    uint32_t *n_r_p, uint32_t *n_e_p)
{
    if (!kn_grp_valid(grp) || !q || !idx || !ids || !n_r_p || !n_e_p ||
        idx->head_dim != grp->head_dim)
        return RI_ERR_INVALID;
    return kn_pick(ops, KN_OP_RANK, grp)->rank(grp, q, idx, n_r, n_e, ids, n_r_p, n_e_p);
}

ri_status_t kn_estimate(const kn_ops_t *ops, const kn_shape_t *grp, const float *q,
                        const kn_index_t *idx, const uint32_t *ids, size_t n, float *o,
                        float *lse)
{
    if (!kn_grp_valid(grp) || !q || !idx || (n && !ids) || !o || !lse ||
        idx->head_dim != grp->head_dim)
        return RI_ERR_INVALID;
    for (size_t i = 0; i < n; i++)
        if (ids[i] >= idx->n_clusters)
            return RI_ERR_RANGE;
    return kn_pick(ops, KN_OP_ESTIMATE, grp)->estimate(grp, q, idx, ids, n, o, lse);
}

ri_status_t kn_merge(const kn_ops_t *ops, size_t n_rows, uint32_t d, size_t n_parts,
                     const float *const *o_parts, const float *const *lse_parts, float *o,
                     float *lse)
{
    if (d == 0 || !o || !lse || (n_parts && (!o_parts || !lse_parts)))
        return RI_ERR_INVALID;
    kn_shape_t sh = {.n_q_heads = 1, .n_kv_heads = 1, .head_dim = d};
    return kn_pick(ops, KN_OP_MERGE, &sh)->merge(n_rows, d, n_parts, o_parts, lse_parts, o, lse);
}

ri_status_t kn_index_build(const kn_ops_t *ops, const kn_build_params_t *p, const cm_fp16_t *k,
                           const cm_fp16_t *v, size_t stride, uint32_t n, uint32_t token_base,
                           uint32_t n_clusters, uint32_t n_segments, kn_index_t *idx)
{
    kn_build_params_t def;
    if (idx == NULL || idx->head_dim == 0 || stride < idx->head_dim || (n && (!k || !v)) ||
        n_clusters == 0 || n_segments == 0 || n_segments > n_clusters)
        return RI_ERR_INVALID;
    if (p == NULL) {
        kn_build_params_default(&def);
        p = &def;
    }
    kn_shape_t sh = {.n_q_heads = 1, .n_kv_heads = 1, .head_dim = idx->head_dim};
    uint32_t first = idx->n_clusters;
    ri_status_t st = kn_pick(ops, KN_OP_INDEX_BUILD, &sh)->index_build(p, k, v, stride, n, token_base,
                                                                       n_clusters, n_segments, idx);
    if (st == RI_OK)
        kn_index_fill_means(idx, first);
    /* The fp32 sums were only the means' source: a decode reads the int8
     * means, so a built index keeps a quarter of the value bytes (the compact
     * meta entry of kn_ops.h).  The next build allocates them again as
     * scratch. */
    cm_free(idx->vsum);
    idx->vsum = NULL;
    return st;
}
