/*
 * Baselines (kn_baselines.h): StreamingLLM, Quest, oracle top-B, random-B.
 * Each reduces to exact attention over a page list per GQA group, so they
 * share the backend's attn_pages kernel and differ only in the selection.
 */
#include <math.h>
#include <stdatomic.h>
#include <string.h>

#include "common/cm_status.h"
#include "kernels/kn_baselines.h"
#include "kernels/kn_internal.h"

/* A per-head selection callback: fill pages (room for max_pages) for head h. */
typedef struct kn_bl_job kn_bl_job_t;
typedef ri_status_t (*kn_bl_select_fn_t)(kn_bl_job_t *job, uint32_t h, kn_page_t **pages_p,
                                         size_t *n_p);

struct kn_bl_job {
    const kn_ops_t *ops;
    const kn_shape_t *shape;
    const float *q;
    const kn_kv_view_t *kv;
    float *out, *lse;
    kn_bl_select_fn_t select;
    uint32_t n_sink, n_window, budget;
    uint64_t seed;
    kn_quest_t *quest;
    _Atomic int status;
    _Atomic uint64_t bytes;
};

static void kn_bl_task(void *arg, size_t begin, size_t end, unsigned worker)
{
    kn_bl_job_t *job = arg;
    uint32_t d = job->shape->head_dim, g = job->shape->n_q_heads / job->shape->n_kv_heads;
    kn_shape_t grp = {.n_q_heads = g, .n_kv_heads = 1, .head_dim = d, .scale = job->shape->scale};
    float lse_tmp[KN_GMAX_LOCAL];
    (void)worker;
    for (size_t h = begin; h < end; h++) {
        kn_page_t *pages = NULL;
        size_t np = 0;
        ri_status_t st = job->select(job, (uint32_t)h, &pages, &np);
        if (st == RI_OK)
            st = kn_attn_pages(job->ops, &grp, job->q + h * g * d, pages, np, job->out + h * g * d,
                               job->lse ? job->lse + h * g : lse_tmp);
        cm_free(pages);
        if (st != RI_OK) {
            int expect = RI_OK;
            atomic_compare_exchange_strong(&job->status, &expect, (int)st);
        }
    }
}

static ri_status_t kn_bl_run(kn_bl_job_t *job)
{
    if (!kn_shape_valid(job->shape) || !job->q || !job->kv || !job->out ||
        (job->kv->n_tokens && (!job->kv->k || !job->kv->v)) ||
        job->shape->n_q_heads / job->shape->n_kv_heads > KN_GMAX_LOCAL)
        return RI_ERR_INVALID;
    if (job->ops == NULL)
        job->ops = kn_ops_default();
    atomic_init(&job->status, RI_OK);
    atomic_init(&job->bytes, 0);
    cm_pool_parallel_for(kn_pool(), job->shape->n_kv_heads, 1, kn_bl_task, job);
    return (ri_status_t)atomic_load(&job->status);
}

static kn_page_t kn_bl_page(const kn_kv_view_t *kv, uint32_t h, size_t t0, size_t n)
{
    size_t off = (size_t)h * kv->head_stride + t0 * kv->token_stride;
    return (kn_page_t){kv->k + off, kv->v + off, (uint32_t)n, (uint32_t)kv->token_stride};
}

/* ---- StreamingLLM ---- */

static ri_status_t kn_streaming_select(kn_bl_job_t *job, uint32_t h, kn_page_t **pages_p,
                                       size_t *n_p)
{
    size_t n = job->kv->n_tokens, s = CM_MIN((size_t)job->n_sink, n);
    size_t w0 = n > job->n_window ? n - job->n_window : 0;
    kn_page_t *pg = cm_malloc(&kn_tag, 2 * sizeof(kn_page_t));
    if (pg == NULL)
        return RI_ERR_NOMEM;
    w0 = CM_MAX(w0, s);
    pg[0] = kn_bl_page(job->kv, h, 0, s);
    pg[1] = kn_bl_page(job->kv, h, w0, n - w0);
    *pages_p = pg;
    *n_p = 2;
    return RI_OK;
}

ri_status_t kn_streaming_decode(const kn_ops_t *ops, const kn_shape_t *shape, const float *q,
                                const kn_kv_view_t *kv, uint32_t n_sink, uint32_t n_window,
                                float *out, float *lse)
{
    kn_bl_job_t job = {.ops = ops, .shape = shape, .q = q, .kv = kv, .out = out, .lse = lse,
                       .select = kn_streaming_select, .n_sink = n_sink, .n_window = n_window};
    return kn_bl_run(&job);
}

/* ---- Quest ---- */

struct kn_quest {
    kn_shape_t shape;
    uint32_t page;          /* tokens per page */
    size_t n_pages, cap;    /* pages summarised, allocated */
    size_t n_tokens;        /* tokens summarised */
    cm_fp16_t **kmin, **kmax; /* [n_kv][cap][d] */
};

ri_status_t kn_quest_create(const kn_shape_t *shape, uint32_t page_tokens, kn_quest_t **quest_p)
{
    kn_quest_t *qt;
    if (!kn_shape_valid(shape) || quest_p == NULL)
        return RI_ERR_INVALID;
    qt = cm_calloc(&kn_tag, 1, sizeof(*qt));
    if (qt == NULL)
        return RI_ERR_NOMEM;
    qt->shape = *shape;
    qt->page = page_tokens ? page_tokens : 16;
    qt->kmin = cm_calloc(&kn_tag, shape->n_kv_heads, sizeof(*qt->kmin));
    qt->kmax = cm_calloc(&kn_tag, shape->n_kv_heads, sizeof(*qt->kmax));
    if (!qt->kmin || !qt->kmax) {
        kn_quest_destroy(qt);
        return RI_ERR_NOMEM;
    }
    *quest_p = qt;
    return RI_OK;
}

void kn_quest_destroy(kn_quest_t *qt)
{
    if (qt == NULL)
        return;
    for (uint32_t h = 0; h < qt->shape.n_kv_heads; h++) {
        if (qt->kmin)
            cm_free(qt->kmin[h]);
        if (qt->kmax)
            cm_free(qt->kmax[h]);
    }
    cm_free(qt->kmin);
    cm_free(qt->kmax);
    cm_free(qt);
}

ri_status_t kn_quest_update(kn_quest_t *qt, const kn_kv_view_t *kv)
{
    uint32_t d = qt->shape.head_dim, P = qt->page;
    size_t np, first;
    float *mn, *mx, *row;

    if (kv == NULL || kv->n_tokens < qt->n_tokens)
        return RI_ERR_INVALID;
    np = (kv->n_tokens + P - 1) / P;
    if (np > qt->cap) {
        size_t cap = CM_MAX(np, qt->cap * 3 / 2);
        for (uint32_t h = 0; h < qt->shape.n_kv_heads; h++) {
            cm_fp16_t *a = cm_realloc(&kn_tag, qt->kmin[h], cap * d * sizeof(cm_fp16_t));
            if (a == NULL)
                return RI_ERR_NOMEM;
            qt->kmin[h] = a;
            a = cm_realloc(&kn_tag, qt->kmax[h], cap * d * sizeof(cm_fp16_t));
            if (a == NULL)
                return RI_ERR_NOMEM;
            qt->kmax[h] = a;
        }
        qt->cap = cap;
    }
    mn = cm_malloc(&kn_tag, (size_t)3 * d * sizeof(float));
    if (mn == NULL)
        return RI_ERR_NOMEM;
    mx = mn + d;
    row = mx + d;
    first = qt->n_tokens / P;  /* the last partial page is redone */
    for (uint32_t h = 0; h < qt->shape.n_kv_heads; h++) {
        for (size_t pg = first; pg < np; pg++) {
            size_t t0 = pg * P, t1 = CM_MIN(t0 + P, kv->n_tokens);
            for (uint32_t i = 0; i < d; i++) {
                mn[i] = INFINITY;
                mx[i] = -INFINITY;
            }
            for (size_t t = t0; t < t1; t++) {
                cm_fp16_to_f32_n(row, kv->k + (size_t)h * kv->head_stride + t * kv->token_stride, d);
                for (uint32_t i = 0; i < d; i++) {
                    mn[i] = CM_MIN(mn[i], row[i]);
                    mx[i] = CM_MAX(mx[i], row[i]);
                }
            }
            /* fp16 rounding must not shrink the box: values came from fp16, so exact */
            cm_f32_to_fp16_n(qt->kmin[h] + pg * d, mn, d);
            cm_f32_to_fp16_n(qt->kmax[h] + pg * d, mx, d);
        }
    }
    cm_free(mn);
    qt->n_pages = np;
    qt->n_tokens = kv->n_tokens;
    return RI_OK;
}

static ri_status_t kn_quest_select(kn_bl_job_t *job, uint32_t h, kn_page_t **pages_p, size_t *n_p)
{
    kn_quest_t *qt = job->quest;
    uint32_t d = qt->shape.head_dim, g = qt->shape.n_q_heads / qt->shape.n_kv_heads, P = qt->page;
    kn_shape_t grp = {.n_q_heads = g, .n_kv_heads = 1, .head_dim = d, .scale = qt->shape.scale};
    size_t np = qt->n_pages, want = CM_MIN(((size_t)job->budget + P - 1) / P, np);
    float *score = cm_malloc(&kn_tag, (np + 1) * sizeof(float));
    uint32_t *ids = cm_malloc(&kn_tag, (np + 1) * sizeof(uint32_t));
    kn_page_t *pg = cm_malloc(&kn_tag, (want + 1) * sizeof(kn_page_t));
    const kn_ops_t *ops = job->ops->supports(KN_OP_QUEST_SCORE, &grp, KN_DTYPE_F16) ? job->ops
                                                                                      : kn_ops_ref();
    ri_status_t st = RI_ERR_NOMEM;
    uint64_t tok = 0;

    if (!score || !ids || !pg)
        goto out;
    st = ops->quest_score(&grp, job->q + (size_t)h * g * d, qt->kmin[h], qt->kmax[h], np, score);
    if (st != RI_OK)
        goto out;
    if (np > 0)
        score[np - 1] = INFINITY;  /* the newest page is always attended */
    for (size_t i = 0; i < np; i++)
        ids[i] = (uint32_t)i;
    kn_select_top(ids, np, want, score);
    for (size_t i = 0; i < want; i++) {
        size_t t0 = (size_t)ids[i] * P;
        size_t n = CM_MIN((size_t)P, job->kv->n_tokens - t0);
        pg[i] = kn_bl_page(job->kv, h, t0, n);
        tok += n;
    }
    atomic_fetch_add(&job->bytes, tok * 4 * d + (uint64_t)np * 4 * d);
    *pages_p = pg;
    pg = NULL;
    *n_p = want;
out:
    cm_free(score);
    cm_free(ids);
    cm_free(pg);
    return st;
}

ri_status_t kn_quest_decode(const kn_ops_t *ops, kn_quest_t *quest, const float *q,
                            const kn_kv_view_t *kv, uint32_t budget_tokens, float *out,
                            float *lse, uint64_t *bytes_p)
{
    kn_bl_job_t job = {.ops = ops, .shape = quest ? &quest->shape : NULL, .q = q, .kv = kv,
                       .out = out, .lse = lse, .select = kn_quest_select, .budget = budget_tokens,
                       .quest = quest};
    ri_status_t st;
    if (quest == NULL || kv == NULL || kv->n_tokens != quest->n_tokens)
        return RI_ERR_INVALID;  /* call kn_quest_update first */
    st = kn_bl_run(&job);
    if (st == RI_OK && bytes_p)
        *bytes_p = atomic_load(&job.bytes);
    return st;
}

ri_status_t kn_quest_exact_mask(const kn_ops_t *ops, kn_quest_t *quest, const float *q,
                                const kn_kv_view_t *kv, uint32_t kv_head, uint32_t budget_tokens,
                                uint8_t *mask)
{
    kn_bl_job_t job = {.ops = ops ? ops : kn_ops_default(), .shape = quest ? &quest->shape : NULL,
                       .q = q, .kv = kv, .budget = budget_tokens, .quest = quest};
    kn_page_t *pages = NULL;
    size_t np = 0;
    ri_status_t st;
    if (quest == NULL || kv == NULL || q == NULL || mask == NULL ||
        kv->n_tokens != quest->n_tokens || kv_head >= quest->shape.n_kv_heads)
        return RI_ERR_INVALID;
    atomic_init(&job.bytes, 0);
    st = kn_quest_select(&job, kv_head, &pages, &np);
    if (st != RI_OK)
        return st;
    memset(mask, 0, kv->n_tokens);
    for (size_t i = 0; i < np; i++) {
        size_t t0 = (size_t)(pages[i].k - (kv->k + (size_t)kv_head * kv->head_stride)) /
                    kv->token_stride;
        memset(mask + t0, 1, pages[i].n_tokens);
    }
    cm_free(pages);
    return RI_OK;
}

/* ---- oracle top-B ---- */

static ri_status_t kn_token_pages(kn_bl_job_t *job, uint32_t h, uint32_t *ids, size_t n,
                                  kn_page_t **pages_p, size_t *n_p)
{
    kn_page_t *pg = cm_malloc(&kn_tag, (n + 1) * sizeof(kn_page_t));
    if (pg == NULL)
        return RI_ERR_NOMEM;
    for (size_t i = 0; i < n; i++)
        pg[i] = kn_bl_page(job->kv, h, ids[i], 1);
    *pages_p = pg;
    *n_p = n;
    return RI_OK;
}

static ri_status_t kn_oracle_select(kn_bl_job_t *job, uint32_t h, kn_page_t **pages_p, size_t *n_p)
{
    const kn_kv_view_t *kv = job->kv;
    uint32_t d = job->shape->head_dim, g = job->shape->n_q_heads / job->shape->n_kv_heads;
    size_t n = kv->n_tokens, B = CM_MIN((size_t)job->budget, n);
    float *qs = cm_malloc(&kn_tag, (size_t)g * d * sizeof(float));
    float *lg = cm_malloc(&kn_tag, ((size_t)g * n + 1) * sizeof(float));
    float *score = cm_calloc(&kn_tag, n + 1, sizeof(float));
    uint32_t *ids = cm_malloc(&kn_tag, (n + 1) * sizeof(uint32_t));
    ri_status_t st = RI_ERR_NOMEM;

    if (!qs || !lg || !score || !ids)
        goto out;
    for (size_t i = 0; i < (size_t)g * d; i++)
        qs[i] = job->q[(size_t)h * g * d + i] * kn_shape_scale(job->shape);
    kn_group_scores(qs, g, d, kv->k + (size_t)h * kv->head_stride, kv->token_stride, n, lg);
    for (uint32_t t = 0; t < g; t++) {
        float *l = lg + (size_t)t * n, m = -INFINITY, sum = 0.0f;
        for (size_t i = 0; i < n; i++)
            m = CM_MAX(m, l[i]);
        for (size_t i = 0; i < n; i++)
            sum += (l[i] = expf(l[i] - m));
        for (size_t i = 0; i < n; i++)
            score[i] += l[i] / sum;
    }
    for (size_t i = 0; i < n; i++)
        ids[i] = (uint32_t)i;
    kn_select_top(ids, n, B, score);
    st = kn_token_pages(job, h, ids, B, pages_p, n_p);
out:
    cm_free(qs);
    cm_free(lg);
    cm_free(score);
    cm_free(ids);
    return st;
}

ri_status_t kn_oracle_decode(const kn_ops_t *ops, const kn_shape_t *shape, const float *q,
                             const kn_kv_view_t *kv, uint32_t budget_tokens, float *out, float *lse)
{
    kn_bl_job_t job = {.ops = ops, .shape = shape, .q = q, .kv = kv, .out = out, .lse = lse,
                       .select = kn_oracle_select, .budget = budget_tokens};
    return kn_bl_run(&job);
}

/* ---- random-B ---- */

static ri_status_t kn_random_select(kn_bl_job_t *job, uint32_t h, kn_page_t **pages_p, size_t *n_p)
{
    size_t n = job->kv->n_tokens, B = CM_MIN((size_t)job->budget, n);
    uint32_t *ids = cm_malloc(&kn_tag, (n + 1) * sizeof(uint32_t));
    uint64_t state = job->seed ^ (0x9E37ull * (h + 1));
    ri_status_t st;
    if (ids == NULL)
        return RI_ERR_NOMEM;
    for (size_t i = 0; i < n; i++)
        ids[i] = (uint32_t)i;
    for (size_t i = 0; i < B; i++) {  /* partial Fisher-Yates */
        size_t j = i + kn_splitmix64(&state) % (n - i);
        uint32_t t = ids[i];
        ids[i] = ids[j];
        ids[j] = t;
    }
    st = kn_token_pages(job, h, ids, B, pages_p, n_p);
    cm_free(ids);
    return st;
}

ri_status_t kn_random_decode(const kn_ops_t *ops, const kn_shape_t *shape, const float *q,
                             const kn_kv_view_t *kv, uint32_t budget_tokens, uint64_t seed,
                             float *out, float *lse)
{
    kn_bl_job_t job = {.ops = ops, .shape = shape, .q = q, .kv = kv, .out = out, .lse = lse,
                       .select = kn_random_select, .budget = budget_tokens, .seed = seed};
    return kn_bl_run(&job);
}
