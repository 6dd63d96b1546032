/*
 * The optimised CPU backend.  Decode attention is memory bound: one K row and
 * one V row (fp16) per token and KV head, read once and used by the g query
 * heads of the group.  So the kernels work per GQA group on blocks of up to
 * KN_BLK tokens (flash-attention style online softmax): scores of the block
 * for all g heads (each K row converted once), a vectorised exp, then the V
 * rows accumulated into fp32 registers.  AVX2+FMA+F16C is chosen at run time
 * (__builtin_cpu_supports) when head_dim % 16 == 0 and g <= 8; otherwise a
 * portable scalar path of the same structure runs.
 *
 * Threads: kn_cpu_attn_decode splits every (sequence, KV head) into token
 * ranges (flash-decoding split-K), runs them on the pool and merges the
 * (o, lse) partials.  Group-level ops are single-threaded (see kn_ops.h).
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "common/cm_status.h"
#include "kernels/kn_cpu_simd.h"
#include "kernels/kn_internal.h"

/* ---- dispatch ---- */

static int kn_cpu_avx2_state = -1;
static bool kn_cpu_simd_on = true;   /* kn_cpu_simd_enable */

static bool kn_cpu_have_avx2(void)
{
    if (kn_cpu_avx2_state < 0) {
        __builtin_cpu_init();
        kn_cpu_avx2_state = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") &&
                            __builtin_cpu_supports("f16c");
    }
    return kn_cpu_avx2_state == 1 && kn_cpu_simd_on;
}

void kn_cpu_simd_enable(bool on)
{
    kn_cpu_simd_on = on;
}

const char *kn_cpu_isa(void)
{
    return kn_cpu_have_avx2() ? "avx2" : "scalar";
}

static bool kn_cpu_simd_ok(uint32_t g, uint32_t d)
{
    return kn_cpu_have_avx2() && g >= 1 && g <= KN_GMAX && d % 16 == 0;
}

static bool kn_cpu_supports(kn_op_t op, const kn_shape_t *shape, kn_dtype_t dtype)
{
    (void)op;
    return dtype == KN_DTYPE_F16 &&
           (shape == NULL ||
            (kn_shape_valid(shape) && shape->n_q_heads / shape->n_kv_heads <= KN_GMAX_STATE));
}

/* ---- scalar flash-attention block (portable fallback) ---- */

static void kn_fa_rows_scalar(kn_fa_state_t *fs, const cm_fp16_t *k, const cm_fp16_t *v,
                              size_t stride, size_t n)
{
    uint32_t g = fs->g, d = fs->d;
    for (size_t t = 0; t < n; t++) {
        const cm_fp16_t *kt = k + t * stride, *vt = v + t * stride;
        for (uint32_t h = 0; h < g; h++) {
            const float *qh = fs->q + (size_t)h * d;
            float s = 0.0f, p;
            float *acc = fs->acc + (size_t)h * d;
            for (uint32_t i = 0; i < d; i++)
                s += qh[i] * cm_fp16_to_f32(kt[i]);
            if (s > fs->m[h]) {
                float c = expf(fs->m[h] - s);
                for (uint32_t i = 0; i < d; i++)
                    acc[i] *= c;
                fs->l[h] *= c;
                fs->m[h] = s;
            }
            p = expf(s - fs->m[h]);
            fs->l[h] += p;
            for (uint32_t i = 0; i < d; i++)
                acc[i] += p * cm_fp16_to_f32(vt[i]);
        }
    }
}

void kn_fa_init(kn_fa_state_t *fs, const float *q, uint32_t g, uint32_t d, float scale,
                float *qbuf, float *acc)
{
    fs->g = g;
    fs->d = d;
    fs->q = qbuf;
    fs->acc = acc;
    for (size_t i = 0; i < (size_t)g * d; i++)
        qbuf[i] = q[i] * scale;
    memset(acc, 0, (size_t)g * d * sizeof(float));
    for (uint32_t h = 0; h < g; h++) {
        fs->m[h] = -INFINITY;
        fs->l[h] = 0.0f;
    }
    fs->simd = kn_cpu_simd_ok(g, d);
}

void kn_fa_rows(kn_fa_state_t *fs, const cm_fp16_t *k, const cm_fp16_t *v, size_t stride, size_t n)
{
    if (n == 0)
        return;
    if (fs->simd)
        kn_fa_rows_avx2(fs, k, v, stride, n);
    else
        kn_fa_rows_scalar(fs, k, v, stride, n);
}

void kn_fa_finish(const kn_fa_state_t *fs, float *o, float *lse)
{
    uint32_t d = fs->d;
    for (uint32_t h = 0; h < fs->g; h++) {
        float inv = fs->l[h] > 0.0f ? 1.0f / fs->l[h] : 0.0f;
        for (uint32_t i = 0; i < d; i++)
            o[(size_t)h * d + i] = fs->acc[(size_t)h * d + i] * inv;
        lse[h] = fs->l[h] > 0.0f ? fs->m[h] + logf(fs->l[h]) : -INFINITY;
    }
}

/* ---- attn_pages ---- */

static ri_status_t kn_cpu_attn_pages(const kn_shape_t *grp, const float *q, const kn_page_t *pages,
                                     size_t n_pages, float *o, float *lse)
{
    uint32_t g = grp->n_q_heads, d = grp->head_dim;
    float *buf = cm_malloc_aligned(&kn_tag, (size_t)2 * g * d * sizeof(float), 64);
    kn_fa_state_t fs;

    if (buf == NULL)
        return RI_ERR_NOMEM;
    kn_fa_init(&fs, q, g, d, kn_shape_scale(grp), buf, buf + (size_t)g * d);
    if (fs.simd) {
        kn_fa_pages_avx2(&fs, pages, n_pages);
    } else {
        for (size_t p = 0; p < n_pages; p++)
            kn_fa_rows(&fs, pages[p].k, pages[p].v, pages[p].stride, pages[p].n_tokens);
    }
    kn_fa_finish(&fs, o, lse);
    cm_free(buf);
    return RI_OK;
}

/* ---- attn_decode: split-K over the pool ---- */

/* One work item: heads [kvh0, kvh0 + nh) of one sequence, tokens [t0, t1).
 * Head-major caches get one head per item; token-major caches get all heads
 * per item, walked block by block, so that each item streams whole rows of
 * memory (and touches each page once) instead of 1/n_kv of every page. */
typedef struct kn_dec_item {
    uint32_t seq, kvh0, nh;
    size_t t0, t1;
    size_t part;    /* partial of head kvh0; head kvh0+i is at part + i*stride_h */
    size_t stride_h;
} kn_dec_item_t;

typedef struct kn_dec_job {
    const kn_shape_t *shape;
    const float *q;
    const kn_kv_view_t *kv;
    const kn_dec_item_t *items;
    float *part_o;          /* [n_parts][g][d] */
    float *part_lse;        /* [n_parts][g] */
    float *scratch;         /* [threads][n_kv][2][g][d] */
    kn_fa_state_t *states;  /* [threads][n_kv] */
} kn_dec_job_t;

#define KN_DEC_STEP 256  /* tokens per head before moving to the next head */

static void kn_dec_task(void *arg, size_t begin, size_t end, unsigned worker)
{
    kn_dec_job_t *job = arg;
    uint32_t d = job->shape->head_dim, nkv = job->shape->n_kv_heads;
    uint32_t g = job->shape->n_q_heads / nkv;
    float *sc = job->scratch + (size_t)worker * nkv * 2 * g * d;
    kn_fa_state_t *fs = job->states + (size_t)worker * nkv;
    for (size_t it = begin; it < end; it++) {
        const kn_dec_item_t *w = &job->items[it];
        const kn_kv_view_t *kv = &job->kv[w->seq];
        for (uint32_t i = 0; i < w->nh; i++) {
            size_t qrow = (size_t)w->seq * job->shape->n_q_heads + (size_t)(w->kvh0 + i) * g;
            float *qb = sc + (size_t)i * 2 * g * d;
            kn_fa_init(&fs[i], job->q + qrow * d, g, d, kn_shape_scale(job->shape), qb,
                       qb + (size_t)g * d);
        }
        for (size_t tb = w->t0; tb < w->t1; tb += KN_DEC_STEP) {
            size_t n = CM_MIN((size_t)KN_DEC_STEP, w->t1 - tb);
            for (uint32_t i = 0; i < w->nh; i++) {
                size_t off = (size_t)(w->kvh0 + i) * kv->head_stride + tb * kv->token_stride;
                kn_fa_rows(&fs[i], kv->k + off, kv->v + off, kv->token_stride, n);
            }
        }
        for (uint32_t i = 0; i < w->nh; i++) {
            size_t part = w->part + i * w->stride_h;
            kn_fa_finish(&fs[i], job->part_o + part * g * d, job->part_lse + part * g);
        }
    }
}

static ri_status_t kn_cpu_attn_decode(const kn_shape_t *shape, size_t n_seq, const float *q,
                                      const kn_kv_view_t *kv, float *out, float *lse)
{
    uint32_t d = shape->head_dim, nkv = shape->n_kv_heads, g = shape->n_q_heads / nkv;
    cm_pool_t *pool = kn_pool();
    unsigned nthr = cm_pool_size(pool);
    size_t total = 0, n_items = 0, n_parts = 0, split;
    kn_dec_item_t *items = NULL;
    size_t *ns = NULL;
    float *part_o = NULL, *part_lse = NULL, *scratch = NULL;
    kn_fa_state_t *states = NULL;
    ri_status_t st = RI_ERR_NOMEM;

    for (size_t s = 0; s < n_seq; s++)
        total += kv[s].n_tokens;
    /* Split length: long enough to stream well (>= 128 tokens: 32-64 KB of
     * K and V a head at d = 64-256), short enough that every thread gets
     * several items to balance uneven lengths; a decode over a 512-token
     * window with one KV head (Gemma 3's local layers) is then four items
     * rather than one thread's work. */
    split = total * nkv / ((size_t)nthr * 4 + 1);
    split = CM_MAX(split, (size_t)128);
    split = CM_MIN(split, (size_t)16384);
    ns = cm_malloc(&kn_tag, (n_seq + 1) * sizeof(size_t));
    if (ns == NULL)
        goto out;
    for (size_t s = 0; s < n_seq; s++) {
        bool all_heads = kv[s].head_stride < kv[s].token_stride;  /* token-major */
        size_t sp = all_heads ? CM_MAX(split / nkv, (size_t)128) : split;
        ns[s] = CM_MAX((kv[s].n_tokens + sp - 1) / sp, (size_t)1);
        n_items += ns[s] * (all_heads ? 1 : nkv);
        n_parts += ns[s] * nkv;
    }
    items = cm_malloc(&kn_tag, n_items * sizeof(*items));
    part_o = cm_malloc_aligned(&kn_tag, n_parts * g * d * sizeof(float), 64);
    part_lse = cm_malloc(&kn_tag, n_parts * g * sizeof(float));
    scratch = cm_malloc_aligned(&kn_tag, (size_t)nthr * nkv * 2 * g * d * sizeof(float), 64);
    states = cm_malloc(&kn_tag, (size_t)nthr * nkv * sizeof(*states));
    if (!items || !part_o || !part_lse || !scratch || !states)
        goto out;
    n_items = 0;
    n_parts = 0;
    for (size_t s = 0; s < n_seq; s++) {
        bool all_heads = kv[s].head_stride < kv[s].token_stride;
        for (uint32_t h = 0; h < nkv; h += all_heads ? nkv : 1) {
            for (size_t i = 0; i < ns[s]; i++) {
                kn_dec_item_t *w = &items[n_items++];
                w->seq = (uint32_t)s;
                w->kvh0 = h;
                w->nh = all_heads ? nkv : 1;
                w->t0 = i * kv[s].n_tokens / ns[s];
                w->t1 = (i + 1) * kv[s].n_tokens / ns[s];
                /* partials of (seq, head) are contiguous over the splits */
                w->part = n_parts + (size_t)h * ns[s] + i;
                w->stride_h = ns[s];
            }
        }
        n_parts += ns[s] * nkv;
    }
    kn_dec_job_t job = {shape, q, kv, items, part_o, part_lse, scratch, states};
    cm_pool_parallel_for(pool, n_items, 1, kn_dec_task, &job);

    /* merge the splits of each (seq, kv head) */
    n_parts = 0;
    for (size_t s = 0; s < n_seq; s++) {
        for (uint32_t h = 0; h < nkv; h++) {
            size_t p0 = n_parts + (size_t)h * ns[s], row = s * shape->n_q_heads + (size_t)h * g;
            kn_merge_contig(g, d, ns[s], part_o + p0 * g * d, part_lse + p0 * g, out + row * d,
                            lse ? lse + row : NULL);
        }
        n_parts += ns[s] * nkv;
    }
    st = RI_OK;
out:
    cm_free(ns);
    cm_free(items);
    cm_free(part_o);
    cm_free(part_lse);
    cm_free(scratch);
    cm_free(states);
    return st;
}

/* ---- merge ---- */

void kn_merge_contig(uint32_t n_rows, uint32_t d, size_t n_parts, const float *o_parts,
                     const float *lse_parts, float *o, float *lse)
{
    for (uint32_t r = 0; r < n_rows; r++) {
        float m = -INFINITY, den = 0.0f;
        float *dst = o + (size_t)r * d;
        for (size_t p = 0; p < n_parts; p++)
            m = CM_MAX(m, lse_parts[p * n_rows + r]);
        memset(dst, 0, d * sizeof(float));
        if (m == -INFINITY) {
            if (lse)
                lse[r] = -INFINITY;
            continue;
        }
        for (size_t p = 0; p < n_parts; p++) {
            float w = expf(lse_parts[p * n_rows + r] - m);
            const float *src = o_parts + (p * n_rows + r) * d;
            if (w == 0.0f)
                continue;
            den += w;
            for (uint32_t i = 0; i < d; i++)
                dst[i] += w * src[i];
        }
        for (uint32_t i = 0; i < d; i++)
            dst[i] /= den;
        if (lse)
            lse[r] = m + logf(den);
    }
}

static ri_status_t kn_cpu_merge(size_t n_rows, uint32_t d, size_t n_parts,
                                const float *const *o_parts, const float *const *lse_parts,
                                float *o, float *lse)
{
    for (size_t r = 0; r < n_rows; r++) {
        float m = -INFINITY, den = 0.0f;
        float *dst = o + r * d;
        for (size_t p = 0; p < n_parts; p++)
            m = CM_MAX(m, lse_parts[p][r]);
        memset(dst, 0, d * sizeof(float));
        if (m == -INFINITY) {
            lse[r] = -INFINITY;
            continue;
        }
        for (size_t p = 0; p < n_parts; p++) {
            float w = expf(lse_parts[p][r] - m);
            const float *src = o_parts[p] + r * d;
            if (w == 0.0f)
                continue;
            den += w;
            for (uint32_t i = 0; i < d; i++)
                dst[i] += w * src[i];
        }
        for (uint32_t i = 0; i < d; i++)
            dst[i] /= den;
        lse[r] = m + logf(den);
    }
    return RI_OK;
}

/* ---- rank ---- */

/* logits [g][n] of scaled q against n fp16 rows (stride d). */
static void kn_cpu_scores(const float *qs, uint32_t g, uint32_t d, const cm_fp16_t *rows,
                          size_t stride, size_t n, float *out, bool simd)
{
    if (simd) {
        for (size_t t0 = 0; t0 < n; t0 += 4096)  /* out stride is n; blocks keep rows in L2 */
            kn_scores_avx2(qs, g, d, rows + t0 * stride, stride, CM_MIN((size_t)4096, n - t0),
                           out + t0, n);
        return;
    }
    for (size_t t = 0; t < n; t++)
        for (uint32_t h = 0; h < g; h++) {
            float s = 0.0f;
            for (uint32_t i = 0; i < d; i++)
                s += qs[(size_t)h * d + i] * cm_fp16_to_f32(rows[t * stride + i]);
            out[(size_t)h * n + t] = s;
        }
}

/* logits [g][C] of scaled q against the index's int8 centroids, each
 * cluster's dot times its scale (kn_cq_dot). */
static void kn_cpu_cscores(const float *qs, uint32_t g, uint32_t d, const kn_index_t *idx, float *out, bool simd)
{
    size_t n = idx->n_clusters;
    if (simd) {
        for (size_t t0 = 0; t0 < n; t0 += 4096) /* out stride is n; blocks keep rows in L2 */
            kn_scores_q_avx2(qs, g, d, idx->centroids + t0 * d, idx->cscale + t0, CM_MIN((size_t)4096, n - t0),
                             out + t0, n);
        return;
    }
    for (size_t t = 0; t < n; t++)
        for (uint32_t h = 0; h < g; h++)
            out[(size_t)h * n + t] = kn_cq_dot(qs + (size_t)h * d, idx->centroids, idx->cscale, t, d);
}

void kn_group_scores(const float *qs, uint32_t g, uint32_t d, const cm_fp16_t *rows, size_t stride,
                     size_t n, float *out)
{
    kn_cpu_scores(qs, g, d, rows, stride, n, out, kn_cpu_simd_ok(g, d));
}

/* acc [g][d] += sum_e w[h*n+e] * row_e over the estimation zone ids[0..n):
 * row_e is the int8 mean VS_j / n_j times its scale when the index has them
 * (a quarter of the bytes; w then carries the n_j), else the fp32 sum VS_j. */
static void kn_est_accum(float *acc, const kn_index_t *idx, const uint32_t *ids, const float *w,
                         size_t n, uint32_t g, uint32_t d, bool simd)
{
    if (simd) {
        if (idx->vq != NULL)
            kn_est_accum_q_avx2(acc, idx->vq, idx->vscale, ids, w, n, g, d);
        else
            kn_est_accum_avx2(acc, idx->vsum, ids, w, n, g, d);
        return;
    }
    for (uint32_t h = 0; h < g; h++)
        for (size_t e = 0; e < n; e++) {
            const float we = w[(size_t)h * n + e];
            const size_t row = (size_t)ids[e] * d;
            for (uint32_t i = 0; i < d; i++)
                acc[(size_t)h * d + i] +=
                    we * (idx->vq ? kn_vq_at(idx->vq, idx->vscale, ids[e], d, i) : idx->vsum[row + i]);
        }
}

/* Estimation from the rank's exponentiated logits ex [g][C] = e^{s_hj - m_h}:
 * den_h = sum_j n_j ex_hj, o_h = sum_j ex_hj VS_j / den_h, lse_h = m_h + ln den_h.
 * Terms that underflowed against the best cluster are negligible next to the
 * exact part, which holds that cluster. */
static ri_status_t kn_cpu_estimate_from_exp(uint32_t g, uint32_t d, const kn_index_t *idx,
                                            const float *ex, uint32_t C, const float *mh,
                                            const uint32_t *ids, size_t n, bool simd, float *o,
                                            float *lse)
{
    float *w = cm_malloc(&kn_tag, ((size_t)g * n + 1) * sizeof(float));
    float *acc = cm_calloc(&kn_tag, (size_t)g * d, sizeof(float));
    if (w == NULL || acc == NULL) {
        cm_free(w);
        cm_free(acc);
        return RI_ERR_NOMEM;
    }
    for (uint32_t h = 0; h < g; h++) {
        float den = 0.0f;
        for (size_t e = 0; e < n; e++) {
            float x = ex[(size_t)h * C + ids[e]], xn = x * (float)idx->sizes[ids[e]];
            w[(size_t)h * n + e] = idx->vq ? xn : x;
            den += xn;
        }
        lse[h] = den > 0.0f ? mh[h] + logf(den) : -INFINITY;
        o[(size_t)h * d] = den;  /* stash; divided below */
    }
    kn_est_accum(acc, idx, ids, w, n, g, d, simd);
    for (uint32_t h = 0; h < g; h++) {
        float den = o[(size_t)h * d], inv = den > 0.0f ? 1.0f / den : 0.0f;
        for (uint32_t i = 0; i < d; i++)
            o[(size_t)h * d + i] = acc[(size_t)h * d + i] * inv;
    }
    cm_free(w);
    cm_free(acc);
    return RI_OK;
}

/* score [C] = sum over the g heads of softmax_j(logit [g][C]) over the
 * non-empty clusters; logit becomes e^{s_hj - m_h} (0 for an empty cluster)
 * and mh [g] the maxima.  The empty clusters are listed once (empty [C]
 * scratch) and masked in each head. */
static void kn_rank_softmax(uint32_t g, const kn_index_t *idx, float *logit, float *mh,
                            float *score, uint32_t *empty, bool simd)
{
    uint32_t C = idx->n_clusters, n_empty = 0;
    for (uint32_t j = 0; j < C; j++)
        if (idx->sizes[j] == 0)
            empty[n_empty++] = j;
    memset(score, 0, C * sizeof(float));
    for (uint32_t h = 0; h < g; h++) {
        float *lg = logit + (size_t)h * C, m = -INFINITY, sum = 0.0f, inv;
        for (uint32_t e = 0; e < n_empty; e++)
            lg[empty[e]] = -INFINITY;
        if (simd) {
            m = kn_max_avx2(lg, C);
        } else {
            for (uint32_t j = 0; j < C; j++)
                m = CM_MAX(m, lg[j]);
        }
        mh[h] = m;
        if (m == -INFINITY)
            continue;
        sum = simd ? kn_exp_sub_sum_avx2(lg, C, m) : 0.0f;
        if (!simd)
            for (uint32_t j = 0; j < C; j++)
                sum += (lg[j] = expf(lg[j] - m));
        inv = 1.0f / sum;
        for (uint32_t j = 0; j < C; j++)
            score[j] += lg[j] * inv;
    }
}

/* Radix selection of the rank's two thresholds.  Scores are sums of
 * probabilities, >= 0, so their bit patterns order like the values: one
 * histogram of the top bits (exponent and 3 mantissa bits) finds the bucket
 * of the k-th largest, and only that bucket's members are quickselected.
 * This replaced two quickselects over all C scores (7% of a 128K step). */
#define KN_RS_SHIFT 20
#define KN_RS_BUCKETS (1u << (31 - KN_RS_SHIFT)) /* the sign bit is 0 */

typedef struct kn_rs_pick {
    uint32_t k;      /* wanted rank (1 = largest) */
    uint32_t bucket; /* its bucket */
    uint32_t above;  /* scores in higher buckets */
    float thr;       /* the k-th largest score */
    uint32_t gt;     /* scores > thr */
} kn_rs_pick_t;

static void kn_rs_bucket(const uint32_t *hist, kn_rs_pick_t *pk)
{
    uint32_t cum = 0, b = KN_RS_BUCKETS;
    while (b-- > 0) {
        if (cum + hist[b] >= pk->k)
            break;
        cum += hist[b];
    }
    pk->bucket = b;
    pk->above = cum;
}

/* The k-th largest of score over the non-empty clusters, for each of the
 * n_pk picks (k >= 1, at most the non-empty count); mem is scratch for C
 * floats.  False when a score is negative or NaN (the caller falls back). */
static bool kn_rs_select(const kn_index_t *idx, const float *score, kn_rs_pick_t *pk, int n_pk,
                         float *mem)
{
    uint32_t hist[KN_RS_BUCKETS], C = idx->n_clusters;
    memset(hist, 0, sizeof(hist));
    for (uint32_t j = 0; j < C; j++) {
        uint32_t u;
        memcpy(&u, &score[j], sizeof(u));
        if (idx->sizes[j] == 0)
            continue;
        if ((u >> KN_RS_SHIFT) >= KN_RS_BUCKETS || u > 0x7f800000u)
            return false;
        hist[u >> KN_RS_SHIFT]++;
    }
    /* one pass gathers both buckets' members: the first from the front of
     * mem, the second (when it is another bucket) from the back */
    uint32_t m0 = 0, m1 = 0;
    for (int p = 0; p < n_pk; p++)
        kn_rs_bucket(hist, &pk[p]);
    bool two = n_pk > 1 && pk[1].bucket != pk[0].bucket;
    for (uint32_t j = 0; j < C; j++) {
        uint32_t u, b;
        memcpy(&u, &score[j], sizeof(u));
        b = u >> KN_RS_SHIFT;
        if (idx->sizes[j] == 0)
            continue;
        if (b == pk[0].bucket)
            mem[m0++] = score[j];
        else if (two && b == pk[1].bucket)
            mem[C - ++m1] = score[j];
    }
    for (int p = 0; p < n_pk; p++) {
        float *v = p == 1 && two ? mem + C - m1 : mem;
        uint32_t m = p == 1 && two ? m1 : m0;
        pk[p].thr = kn_kth_largest(v, m, pk[p].k - pk[p].above);
        pk[p].gt = pk[p].above;
        for (uint32_t i = 0; i < m; i++)
            pk[p].gt += v[i] > pk[p].thr;
    }
    return true;
}

/* The same thresholds by quickselect over all scores (any float). */
static void kn_qs_select(const kn_index_t *idx, const float *score, kn_rs_pick_t *pk, int n_pk,
                         float *mem)
{
    uint32_t C = idx->n_clusters;
    for (int p = 0; p < n_pk; p++) {
        uint32_t m = 0;
        for (uint32_t j = 0; j < C; j++)
            if (idx->sizes[j] != 0)
                mem[m++] = score[j];
        pk[p].thr = kn_kth_largest(mem, m, pk[p].k);
        pk[p].gt = 0;
        for (uint32_t j = 0; j < C; j++)
            pk[p].gt += idx->sizes[j] != 0 && score[j] > pk[p].thr;
    }
}

/* Rank, and when o_e != NULL also the estimation zone from the same
 * exponentiated logits (no second pass over the centroids). */
static ri_status_t kn_cpu_rank_impl(const kn_shape_t *grp, const float *q, const kn_index_t *idx,
                                    uint32_t n_r, uint32_t n_e, uint32_t *ids, uint32_t *n_r_p,
                                    uint32_t *n_e_p, float *o_e, float *lse_e)
{
    float mh[KN_GMAX_STATE];
    uint32_t g = grp->n_q_heads, d = grp->head_dim, C = idx->n_clusters, avail = 0;
    float scale = kn_shape_scale(grp);
    bool simd = kn_cpu_simd_ok(g, d);
    /* one block: q scaled, logits [g][C], scores [C], scratch [C] */
    size_t gd = ((size_t)g * d + 15) & ~(size_t)15, gc = ((size_t)g * C + 15) & ~(size_t)15;
    float *qs = cm_malloc_aligned(&kn_tag, (gd + gc + 2 * ((size_t)C + 1)) * sizeof(float), 64);
    float *logit, *score, *scratch;
    ri_status_t st = RI_ERR_NOMEM;

    if (qs == NULL)
        goto out;
    logit = qs + gd;
    score = logit + gc;
    scratch = score + C + 1;
    for (size_t i = 0; i < (size_t)g * d; i++)
        qs[i] = q[i] * scale;
    kn_cpu_cscores(qs, g, d, idx, logit, simd);
    kn_rank_softmax(g, idx, logit, mh, score, (uint32_t *)scratch, simd);
    for (uint32_t j = 0; j < C; j++)
        avail += idx->sizes[j] != 0;
    n_r = CM_MIN(n_r, avail);
    n_e = CM_MIN(n_e, avail - n_r);
    if (n_r + n_e > 0) {
        /* thresholds instead of moving ids around: the (R+E)-th and R-th
         * largest scores, then one ascending pass emits both parts in
         * cluster order (ties go to the smaller id, as in ref) */
        kn_rs_pick_t pk[2] = {{.k = n_r + n_e}, {.k = n_r}};
        int n_pk = n_r ? 2 : 1;
        float thr_e, thr_r;
        uint32_t ties_r, quota_e, a = 0, b = n_r;
        if (!kn_rs_select(idx, score, pk, n_pk, scratch))
            kn_qs_select(idx, score, pk, n_pk, scratch);
        thr_e = pk[0].thr;
        thr_r = n_r ? pk[1].thr : INFINITY;
        ties_r = n_r - (n_r ? pk[1].gt : 0);
        /* E-part: the clusters above thr_e that R did not take, then ties at thr_e */
        quota_e = n_e - (pk[0].gt - (thr_r > thr_e ? n_r : (n_r ? pk[1].gt : 0)));
        for (uint32_t j = 0; j < C; j++) {
            float x = score[j];
            if (idx->sizes[j] == 0)
                continue;
            if (x > thr_r || (x == thr_r && ties_r > 0 && (ties_r--, true)))
                ids[a++] = j;
            else if (x > thr_e || (x == thr_e && quota_e > 0 && (quota_e--, true)))
                ids[b++] = j;
        }
    }
    *n_r_p = n_r;
    *n_e_p = n_e;
    st = RI_OK;
    if (o_e != NULL)
        st = kn_cpu_estimate_from_exp(g, d, idx, logit, C, mh, ids + n_r, n_e, simd, o_e, lse_e);
out:
    cm_free(qs);
    return st;
}

static ri_status_t kn_cpu_rank(const kn_shape_t *grp, const float *q, const kn_index_t *idx,
                               uint32_t n_r, uint32_t n_e, uint32_t *ids, uint32_t *n_r_p,
                               uint32_t *n_e_p)
{
    return kn_cpu_rank_impl(grp, q, idx, n_r, n_e, ids, n_r_p, n_e_p, NULL, NULL);
}

ri_status_t kn_cpu_rank_estimate(const kn_shape_t *grp, const float *q, const kn_index_t *idx,
                                 uint32_t n_r, uint32_t n_e, uint32_t *ids, uint32_t *n_r_p,
                                 uint32_t *n_e_p, float *o_e, float *lse_e)
{
    return kn_cpu_rank_impl(grp, q, idx, n_r, n_e, ids, n_r_p, n_e_p, o_e, lse_e);
}

/* ---- estimate ---- */

static ri_status_t kn_cpu_estimate(const kn_shape_t *grp, const float *q, const kn_index_t *idx,
                                   const uint32_t *ids, size_t n, float *o, float *lse)
{
    uint32_t g = grp->n_q_heads, d = grp->head_dim;
    float scale = kn_shape_scale(grp);
    bool simd = kn_cpu_simd_ok(g, d);
    float *qs = cm_malloc_aligned(&kn_tag, (size_t)g * d * sizeof(float), 64);
    float *w = cm_malloc_aligned(&kn_tag, ((size_t)g * n + 1) * sizeof(float), 64);
    float *acc = cm_malloc_aligned(&kn_tag, (size_t)g * d * sizeof(float), 64);
    float *lnsz = cm_malloc(&kn_tag, (2 * n + 1) * sizeof(float)), *invsz;
    float den_h[KN_GMAX_STATE];
    ri_status_t st = RI_ERR_NOMEM;

    if (!qs || !w || !acc || !lnsz)
        goto out;
    invsz = lnsz + n;
    for (size_t i = 0; i < (size_t)g * d; i++)
        qs[i] = q[i] * scale;
    /* logits of the listed centroids */
    if (simd) {
        kn_scores_gather_q_avx2(qs, g, d, idx->centroids, idx->cscale, ids, n, w, n);
    } else {
        for (size_t e = 0; e < n; e++)
            for (uint32_t h = 0; h < g; h++)
                w[(size_t)h * n + e] = kn_cq_dot(qs + (size_t)h * d, idx->centroids, idx->cscale, ids[e], d);
    }
    /* per cluster once: ln n_j and 1/n_j (0 for an empty cluster) */
    for (size_t e = 0; e < n; e++) {
        uint32_t sz = idx->sizes[ids[e]];
        lnsz[e] = sz ? logf((float)sz) : -INFINITY;
        invsz[e] = sz ? 1.0f / (float)sz : 0.0f;
    }
    /* weights: p_j = n_j e^{s_j - m} (denominator), p_j / n_j multiplies VS_j */
    memset(acc, 0, (size_t)g * d * sizeof(float));
    for (uint32_t h = 0; h < g; h++) {
        float *wh = w + (size_t)h * n, m = -INFINITY, den = 0.0f;
        for (size_t e = 0; e < n; e++) {
            wh[e] += lnsz[e];  /* logit + ln n_j; -inf when empty */
            m = CM_MAX(m, wh[e]);
        }
        den_h[h] = 0.0f;
        lse[h] = m;
        if (m == -INFINITY) {
            memset(wh, 0, n * sizeof(float));
            continue;
        }
        if (simd) {
            den = kn_exp_sub_sum_avx2(wh, n, m);
        } else {
            for (size_t e = 0; e < n; e++)
                den += (wh[e] = expf(wh[e] - m));
        }
        if (idx->vq == NULL) /* the sums need p_j / n_j, the means p_j */
            for (size_t e = 0; e < n; e++)
                wh[e] *= invsz[e];
        den_h[h] = den;
    }
    kn_est_accum(acc, idx, ids, w, n, g, d, simd);
    for (uint32_t h = 0; h < g; h++) {
        float inv = den_h[h] > 0.0f ? 1.0f / den_h[h] : 0.0f;
        for (uint32_t i = 0; i < d; i++)
            o[(size_t)h * d + i] = acc[(size_t)h * d + i] * inv;
        lse[h] = den_h[h] > 0.0f ? lse[h] + logf(den_h[h]) : -INFINITY;
    }
    st = RI_OK;
out:
    cm_free(qs);
    cm_free(w);
    cm_free(acc);
    cm_free(lnsz);
    return st;
}

/* ---- index build (assignment kernel) ---- */

static void kn_cpu_assign_scalar(const float *x, size_t n, const float *c, size_t nc, uint32_t d,
                                 uint32_t *best)
{
    for (size_t i = 0; i < n; i++) {
        float bs = -INFINITY;
        uint32_t bj = 0;
        for (size_t j = 0; j < nc; j++) {
            float s = 0.0f;
            for (uint32_t t = 0; t < d; t++)
                s += x[i * d + t] * c[j * d + t];
            if (s > bs) {
                bs = s;
                bj = (uint32_t)j;
            }
        }
        best[i] = bj;
    }
}

static ri_status_t kn_cpu_index_build(const kn_build_params_t *p, const cm_fp16_t *k,
                                      const cm_fp16_t *v, size_t stride, uint32_t n,
                                      uint32_t token_base, uint32_t n_clusters,
                                      uint32_t n_segments, kn_index_t *idx)
{
    kn_assign_fn_t fn = kn_cpu_have_avx2() && idx->head_dim % 8 == 0 ? kn_assign_avx2
                                                                       : kn_cpu_assign_scalar;
    return kn_index_build_impl(p, k, v, stride, n, token_base, n_clusters, n_segments, idx, fn);
}

/* ---- quest ---- */

static ri_status_t kn_cpu_quest_score(const kn_shape_t *grp, const float *q, const cm_fp16_t *kmin,
                                      const cm_fp16_t *kmax, size_t n_pages, float *scores)
{
    uint32_t g = grp->n_q_heads, d = grp->head_dim;
    float scale = kn_shape_scale(grp);
    if (kn_cpu_simd_ok(g, d)) {
        kn_quest_score_avx2(q, g, d, kmin, kmax, n_pages, scale, scores);
        return RI_OK;
    }
    for (size_t pg = 0; pg < n_pages; pg++) {
        float best = -INFINITY;
        for (uint32_t h = 0; h < g; h++) {
            float s = 0.0f;
            for (uint32_t i = 0; i < d; i++) {
                float qi = q[(size_t)h * d + i];
                float a = qi * cm_fp16_to_f32(kmin[pg * d + i]);
                float b = qi * cm_fp16_to_f32(kmax[pg * d + i]);
                s += a > b ? a : b;
            }
            best = CM_MAX(best, s);
        }
        scores[pg] = best * scale;
    }
    return RI_OK;
}

/* The layer-level tripartite step: the cpu group ops head by head. */
static ri_status_t kn_cpu_wave_step(const kn_shape_t *shape, const float *q, const kn_wave_head_t *heads,
                                    uint32_t n_r, uint32_t n_e, float *out, float *lse, uint32_t *ids,
                                    uint32_t *counts)
{
    return kn_wave_step_host(&kn_cpu_ops, shape, q, heads, n_r, n_e, out, lse, ids, counts);
}

const kn_ops_t kn_cpu_ops = {
    .name = "cpu",
    .supports = kn_cpu_supports,
    .attn_decode = kn_cpu_attn_decode,
    .attn_pages = kn_cpu_attn_pages,
    .rank = kn_cpu_rank,
    .estimate = kn_cpu_estimate,
    .merge = kn_cpu_merge,
    .index_build = kn_cpu_index_build,
    .quest_score = kn_cpu_quest_score,
    .wave_step = kn_cpu_wave_step,
};
