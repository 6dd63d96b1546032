/*
 * The wave index of one layer kept in a memory space and stepped with the
 * backend's wave_step op (mdl_dwave.h).  The kn_wave object does the
 * clustering and keeps the schedule; this file is its store: per KV head,
 * arrays in the space that grow by doubling, and the copy of each build's
 * or update's new clusters into them.
 */
#include "gpuworker/model/mdl_dwave.h"

#include <string.h>

#include "common/cm_alloc.h"
#include "common/cm_log.h"
#include "common/cm_status.h"
#include "common/cm_time.h"
#include "gpuworker/model/mdl_model.h"

static CM_ALLOC_TAG(mdl_dwave_tag, "model.dwave");

/* One KV head's index in the space (every pointer is the space's memory). */
typedef struct mdl_dw_head {
    int8_t *cent;        /* [cap_c][d] int8 centroids */
    float *cscale;       /* [cap_c] their scales */
    int8_t *vq;          /* [cap_c][d] int8 value means */
    float *vscale;       /* [cap_c] their scales */
    uint32_t *sizes;     /* [cap_c] tokens per cluster */
    uint32_t *offsets;   /* [cap_c] cluster j's first row in ck / cv */
    cm_fp16_t *ck, *cv;  /* [cap_t][d] the indexed rows, cluster-major */
    uint32_t cap_c, cap_t; /* room */
    uint32_t n_c, n_t;     /* clusters and rows held */
} mdl_dw_head_t;

struct mdl_dwave {
    kn_shape_t shape;
    const kn_ops_t *ops;     /* the backend (borrowed) */
    const kn_mem_t *mem;     /* where the index and the K/V lie (borrowed) */
    kn_wave_store_t store;   /* this object as the wave's store */
    kn_wave_t *wave;         /* schedule, budgets, host index (owned) */
    mdl_dw_head_t *heads;    /* [n_kv] */
    kn_wave_head_t *table;   /* [n_kv] the step's head table (host) */
    float *lse;              /* [n_q] in the space: wave_step wants one */
    /* host scratch */
    uint32_t *ids;           /* [cap_ids] */
    size_t cap_ids;
    uint32_t *counts;        /* [2 n_kv] */
    cm_fp16_t *stage;        /* [cap_stage] a span of one head's K or V rows */
    size_t cap_stage;
    cm_fp16_t *rows;         /* [cap_rows][d] gathered rows */
    size_t cap_rows;
    mdl_dwave_stats_t st;
};

/* ---- growth ---- */

/* *p (n_old elements of elem bytes in the space) moved to a new array of
 * cap elements; the old one freed.  Unchanged on error. */
static ri_status_t mdl_dw_regrow(const kn_mem_t *mem, void **p, size_t elem, size_t n_old, size_t cap)
{
    void *np = NULL;
    ri_status_t st = mem->alloc(&np, cap * elem);
    if (st != RI_OK)
        return st;
    if (n_old > 0 && (st = mem->copy(np, *p, n_old * elem)) != RI_OK) {
        mem->free(np);
        return st;
    }
    mem->free(*p);
    *p = np;
    return RI_OK;
}

static uint32_t mdl_dw_cap(uint32_t cap, uint32_t need)
{
    uint64_t c = cap ? cap : 64;
    while (c < need)
        c *= 2;
    return (uint32_t)CM_MIN(c, (uint64_t)UINT32_MAX);
}

/* Room for C clusters and T rows in head hd. */
static ri_status_t mdl_dw_reserve(const mdl_dwave_t *w, mdl_dw_head_t *hd, uint32_t C, uint32_t T)
{
    const kn_mem_t *mem = w->mem;
    size_t row = (size_t)w->shape.head_dim * sizeof(cm_fp16_t);
    ri_status_t st = RI_OK;
    if (C > hd->cap_c) {
        uint32_t cap = mdl_dw_cap(hd->cap_c, C);
        if ((st = mdl_dw_regrow(mem, (void **)&hd->cent, w->shape.head_dim, hd->n_c, cap)) != RI_OK ||
            (st = mdl_dw_regrow(mem, (void **)&hd->cscale, sizeof(float), hd->n_c, cap)) != RI_OK ||
            (st = mdl_dw_regrow(mem, (void **)&hd->vq, w->shape.head_dim, hd->n_c, cap)) != RI_OK ||
            (st = mdl_dw_regrow(mem, (void **)&hd->vscale, sizeof(float), hd->n_c, cap)) != RI_OK ||
            (st = mdl_dw_regrow(mem, (void **)&hd->sizes, sizeof(uint32_t), hd->n_c, cap)) != RI_OK ||
            (st = mdl_dw_regrow(mem, (void **)&hd->offsets, sizeof(uint32_t), hd->n_c, cap)) != RI_OK)
            return st; /* the arrays grown so far are bigger, still whole */
        hd->cap_c = cap;
    }
    if (T > hd->cap_t) {
        uint32_t cap = mdl_dw_cap(hd->cap_t, T);
        if ((st = mdl_dw_regrow(mem, (void **)&hd->ck, row, hd->n_t, cap)) != RI_OK ||
            (st = mdl_dw_regrow(mem, (void **)&hd->cv, row, hd->n_t, cap)) != RI_OK)
            return st;
        hd->cap_t = cap;
    }
    return st;
}

/* Host scratch of at least n elements of elem bytes at *p (room *cap). */
static ri_status_t mdl_dw_scratch(void **p, size_t *cap, size_t n, size_t elem)
{
    if (n <= *cap)
        return RI_OK;
    void *np = cm_realloc(&mdl_dwave_tag, *p, n * elem);
    if (np == NULL)
        return RI_ERR_NOMEM;
    *p = np;
    *cap = n;
    return RI_OK;
}

/* ---- the store: the new clusters into the space ---- */

/* Rows [t0, t1) of idx's permutation (token positions of kv, KV head h)
 * from base (kv->k or kv->v) to dst (the space) cluster-major: the span of
 * positions they cover comes to the host in one copy, is gathered there,
 * and goes back in one copy (a copy per row would be a device round trip
 * per row). */
static ri_status_t mdl_dw_gather(mdl_dwave_t *w, const kn_index_t *idx, uint32_t t0, uint32_t t1,
                                 const kn_kv_view_t *kv, const cm_fp16_t *base, uint32_t h, cm_fp16_t *dst)
{
    size_t d = w->shape.head_dim, ts = kv->token_stride;
    uint32_t pmin = UINT32_MAX, pmax = 0;
    ri_status_t st;
    for (uint32_t r = t0; r < t1; r++) {
        pmin = CM_MIN(pmin, idx->perm[r]);
        pmax = CM_MAX(pmax, idx->perm[r]);
    }
    size_t span = (size_t)(pmax - pmin) * ts + d;
    if ((st = mdl_dw_scratch((void **)&w->stage, &w->cap_stage, span, sizeof(cm_fp16_t))) != RI_OK ||
        (st = mdl_dw_scratch((void **)&w->rows, &w->cap_rows, (size_t)(t1 - t0) * d, sizeof(cm_fp16_t))) != RI_OK)
        return st;
    st = w->mem->copy(w->stage, base + (size_t)h * kv->head_stride + (size_t)pmin * ts, span * sizeof(cm_fp16_t));
    if (st != RI_OK)
        return st;
    for (uint32_t r = t0; r < t1; r++)
        memcpy(w->rows + (size_t)(r - t0) * d, w->stage + (size_t)(idx->perm[r] - pmin) * ts, d * sizeof(cm_fp16_t));
    return w->mem->copy(dst, w->rows, (size_t)(t1 - t0) * d * sizeof(cm_fp16_t));
}

/* Clusters [first, n_clusters) of idx (KV head h) into the space. */
static ri_status_t mdl_dw_append_head(mdl_dwave_t *w, uint32_t h, const kn_index_t *idx, uint32_t first,
                                      const kn_kv_view_t *kv)
{
    mdl_dw_head_t *hd = &w->heads[h];
    size_t d = w->shape.head_dim;
    uint32_t C = idx->n_clusters, T = idx->n_tokens, nc = C - first;
    uint32_t t0 = first < C ? idx->offsets[first] : T;
    ri_status_t st;

    if (first != hd->n_c || t0 != hd->n_t)
        return RI_ERR_INTERNAL; /* the index must extend what the space holds */
    if (nc == 0)
        return RI_OK;
    if ((st = mdl_dw_reserve(w, hd, C, T)) != RI_OK)
        return st;
    const kn_mem_t *mem = w->mem;
    if ((st = mem->copy(hd->cent + (size_t)first * d, idx->centroids + (size_t)first * d, nc * d)) != RI_OK ||
        (st = mem->copy(hd->cscale + first, idx->cscale + first, nc * sizeof(float))) != RI_OK ||
        (st = mem->copy(hd->vq + (size_t)first * d, idx->vq + (size_t)first * d, nc * d)) != RI_OK ||
        (st = mem->copy(hd->vscale + first, idx->vscale + first, nc * sizeof(float))) != RI_OK ||
        (st = mem->copy(hd->sizes + first, idx->sizes + first, nc * sizeof(uint32_t))) != RI_OK ||
        (st = mem->copy(hd->offsets + first, idx->offsets + first, nc * sizeof(uint32_t))) != RI_OK ||
        (st = mdl_dw_gather(w, idx, t0, T, kv, kv->k, h, hd->ck + (size_t)t0 * d)) != RI_OK ||
        (st = mdl_dw_gather(w, idx, t0, T, kv, kv->v, h, hd->cv + (size_t)t0 * d)) != RI_OK)
        return st;
    hd->n_c = C;
    hd->n_t = T;
    return RI_OK;
}

/* kn_wave_store_t.append: every head's new clusters. */
static ri_status_t mdl_dw_append(void *ctx, const kn_index_t *idx, const uint32_t *first, const kn_kv_view_t *kv)
{
    mdl_dwave_t *w = ctx;
    ri_status_t st = RI_OK;
    for (uint32_t h = 0; h < w->shape.n_kv_heads && st == RI_OK; h++) {
        if (idx[h].vq == NULL && idx[h].n_clusters > first[h])
            return RI_ERR_INTERNAL; /* a built index carries int8 means */
        st = mdl_dw_append_head(w, h, &idx[h], first[h], kv);
    }
    return st;
}

/* ---- the object ---- */

ri_status_t mdl_dwave_create(const kn_shape_t *shape, const kn_wave_params_t *params, const kn_ops_t *ops,
                             const kn_mem_t *mem, mdl_dwave_t **w_p, char *err, size_t errlen)
{
    mdl_dwave_t *w;
    kn_wave_params_t p;
    ri_status_t st;

    if (shape == NULL || params == NULL || ops == NULL || mem == NULL || w_p == NULL || !kn_shape_valid(shape))
        return mdl_errf(err, errlen, RI_ERR_INVALID, "dwave: bad arguments");
    if (params->adapt_tau > 0.0f)
        return mdl_errf(err, errlen, RI_ERR_UNSUPPORTED,
                        "retroinfer on the %s backend: adapt_tau %g is not supported (its wave_step retrieves the "
                        "same count for every head; set adapt_tau 0)", ops->name, (double)params->adapt_tau);
    if (!ops->supports(KN_OP_WAVE_STEP, shape, KN_DTYPE_F16) ||
        (mem->device && (!ops->supports(KN_OP_INDEX_BUILD, shape, KN_DTYPE_F16) ||
                         !ops->supports(KN_OP_ATTN_DECODE, shape, KN_DTYPE_F16))))
        return mdl_errf(err, errlen, RI_ERR_UNSUPPORTED,
                        "retroinfer on the %s backend: a %u/%u-head, head_dim %u layer is not supported by its "
                        "wave_step", ops->name, shape->n_q_heads, shape->n_kv_heads, shape->head_dim);
    w = cm_calloc(&mdl_dwave_tag, 1, sizeof(*w));
    if (w == NULL)
        return RI_ERR_NOMEM;
    w->shape = *shape;
    w->ops = ops;
    w->mem = mem;
    w->store = (kn_wave_store_t){.ctx = w, .append = mdl_dw_append};
    p = *params;
    p.ops = ops; /* the wave clusters with the same backend (its index_build reads the space) */
    w->heads = cm_calloc(&mdl_dwave_tag, shape->n_kv_heads, sizeof(*w->heads));
    w->table = cm_calloc(&mdl_dwave_tag, shape->n_kv_heads, sizeof(*w->table));
    w->counts = cm_calloc(&mdl_dwave_tag, 2 * (size_t)shape->n_kv_heads, sizeof(uint32_t));
    if (w->heads == NULL || w->table == NULL || w->counts == NULL) {
        st = RI_ERR_NOMEM;
        goto destroy;
    }
    if ((st = mem->alloc((void **)&w->lse, (size_t)shape->n_q_heads * sizeof(float))) != RI_OK)
        goto destroy;
    if ((st = kn_wave_create_store(shape, &p, &w->store, &w->wave)) != RI_OK) {
        mdl_errf(err, errlen, st, "dwave: bad wave settings");
        goto destroy;
    }
    *w_p = w;
    return RI_OK;
destroy:
    mdl_dwave_destroy(w);
    return st;
}

void mdl_dwave_destroy(mdl_dwave_t *w)
{
    if (w == NULL)
        return;
    kn_wave_destroy(w->wave);
    for (uint32_t h = 0; w->heads != NULL && h < w->shape.n_kv_heads; h++) {
        mdl_dw_head_t *hd = &w->heads[h];
        w->mem->free(hd->cent);
        w->mem->free(hd->cscale);
        w->mem->free(hd->vq);
        w->mem->free(hd->vscale);
        w->mem->free(hd->sizes);
        w->mem->free(hd->offsets);
        w->mem->free(hd->ck);
        w->mem->free(hd->cv);
    }
    if (w->lse != NULL)
        w->mem->free(w->lse);
    cm_free(w->heads);
    cm_free(w->table);
    cm_free(w->counts);
    cm_free(w->ids);
    cm_free(w->stage);
    cm_free(w->rows);
    cm_free(w);
}

ri_status_t mdl_dwave_build(mdl_dwave_t *w, const kn_kv_view_t *kv)
{
    if (w == NULL || kv == NULL)
        return RI_ERR_INVALID;
    double t0 = cm_time_s();
    ri_status_t st = kn_wave_build(w->wave, kv);
    w->st.build_s += cm_time_s() - t0;
    if (st != RI_OK && kn_wave_index(w->wave, 0)->n_clusters == 0)
        /* the wave dropped its index: so does the space (the arrays stay) */
        for (uint32_t h = 0; h < w->shape.n_kv_heads; h++)
            w->heads[h].n_c = w->heads[h].n_t = 0;
    return st;
}

ri_status_t mdl_dwave_update(mdl_dwave_t *w, const kn_kv_view_t *kv, bool *updated_p)
{
    bool updated = false;
    if (w == NULL || kv == NULL)
        return RI_ERR_INVALID;
    double t0 = cm_time_s();
    ri_status_t st = kn_wave_update(w->wave, kv, &updated);
    if (updated)
        w->st.build_s += cm_time_s() - t0;
    if (updated_p != NULL)
        *updated_p = updated;
    return st;
}

void mdl_dwave_budget(const mdl_dwave_t *w, uint32_t *n_r_p, uint32_t *n_e_p)
{
    kn_wave_budget(w->wave, n_r_p, n_e_p);
}

const kn_wave_t *mdl_dwave_wave(const mdl_dwave_t *w)
{
    return w->wave;
}

/* The head table of a step over kv: the space's index, and the steady
 * zone (sinks, then the tokens from the indexed end on) as kn_wave_decode
 * takes it. */
static void mdl_dw_table(mdl_dwave_t *w, const kn_kv_view_t *kv)
{
    size_t sink = CM_MIN((size_t)kn_wave_params(w->wave)->sink_tokens, kv->n_tokens);
    size_t tail0 = CM_MAX(kn_wave_indexed_end(w->wave), sink), ts = kv->token_stride;
    for (uint32_t h = 0; h < w->shape.n_kv_heads; h++) {
        const mdl_dw_head_t *hd = &w->heads[h];
        size_t hoff = (size_t)h * kv->head_stride;
        kn_wave_head_t *t = &w->table[h];
        *t = (kn_wave_head_t){ .centroids = hd->cent,
                               .cscale = hd->cscale,
                               .sizes = hd->sizes,
                               .offsets = hd->offsets,
                               .vq = hd->vq,
                               .vscale = hd->vscale,
                               .ck = hd->ck,
                               .cv = hd->cv,
                               .n_clusters = hd->n_c };
        t->steady[0] = (kn_page_t){kv->k + hoff, kv->v + hoff, (uint32_t)sink, (uint32_t)ts};
        if (kv->n_tokens > tail0)
            t->steady[1] = (kn_page_t){kv->k + hoff + tail0 * ts, kv->v + hoff + tail0 * ts,
                                       (uint32_t)(kv->n_tokens - tail0), (uint32_t)ts};
    }
}

/* The step's figures, from the sets wave_step chose and the host index. */
static void mdl_dw_count(mdl_dwave_t *w, const kn_kv_view_t *kv, const uint32_t *ids, size_t per)
{
    uint32_t d = w->shape.head_dim, nkv = w->shape.n_kv_heads;
    size_t sink = CM_MIN((size_t)kn_wave_params(w->wave)->sink_tokens, kv->n_tokens);
    size_t tail0 = CM_MAX(kn_wave_indexed_end(w->wave), sink);
    uint64_t steady = sink + (kv->n_tokens > tail0 ? kv->n_tokens - tail0 : 0), exact = 0, bytes = 0;
    for (uint32_t h = 0; h < nkv; h++) {
        const kn_index_t *idx = kn_wave_index(w->wave, h);
        uint64_t ret = 0, nr = w->counts[2 * h], ne = w->counts[2 * h + 1];
        for (uint64_t i = 0; i < nr; i++)
            ret += idx->sizes[ids[h * per + i]];
        exact += steady + ret;
        bytes += (steady + ret) * 4 * d + (uint64_t)idx->n_clusters * (d + 8) + ne * (d + 4); /* int8 + scale */
    }
    w->st.exact_tokens += exact / CM_MAX(nkv, 1u);
    w->st.bytes_read += bytes;
}

ri_status_t mdl_dwave_step(mdl_dwave_t *w, const float *q, const kn_kv_view_t *kv, float *out, uint32_t *ids,
                           uint32_t *counts)
{
    uint32_t n_r, n_e, nkv;
    ri_status_t st;

    if (w == NULL || q == NULL || kv == NULL || out == NULL || kv->n_tokens == 0 ||
        !kn_wave_covers(w->wave, kv->n_tokens))
        return RI_ERR_INVALID;
    nkv = w->shape.n_kv_heads;
    w->st.steps++;
    if (w->heads[0].n_c == 0) {
        /* nothing indexed (a short prompt, before the first update): every
         * token is steady, which is exact attention */
        if (counts != NULL)
            memset(counts, 0, 2 * (size_t)nkv * sizeof(uint32_t));
        w->st.exact_tokens += kv->n_tokens;
        w->st.bytes_read += (uint64_t)kv->n_tokens * nkv * 4 * w->shape.head_dim;
        return w->ops->attn_decode(&w->shape, 1, q, kv, out, NULL);
    }
    kn_wave_budget(w->wave, &n_r, &n_e);
    size_t per = (size_t)n_r + n_e;
    uint32_t *idp = ids;
    if (idp == NULL) { /* the figures need the retrieved sets */
        if ((st = mdl_dw_scratch((void **)&w->ids, &w->cap_ids, per * nkv + 1, sizeof(uint32_t))) != RI_OK)
            return st;
        idp = w->ids;
    }
    mdl_dw_table(w, kv);
    st = w->ops->wave_step(&w->shape, q, w->table, n_r, n_e, out, w->lse, idp, w->counts);
    if (st != RI_OK)
        return st;
    mdl_dw_count(w, kv, idp, per);
    if (counts != NULL)
        memcpy(counts, w->counts, 2 * (size_t)nkv * sizeof(uint32_t));
    return RI_OK;
}

void mdl_dwave_stats(const mdl_dwave_t *w, mdl_dwave_stats_t *st_p)
{
    *st_p = w->st;
    st_p->index_bytes = 0;
    for (uint32_t h = 0; h < w->shape.n_kv_heads; h++) {
        const mdl_dw_head_t *hd = &w->heads[h];
        /* a cluster: int8 centroid and mean, their fp32 scales, size, offset */
        st_p->index_bytes +=
            (uint64_t)hd->cap_c * (2 * w->shape.head_dim + 16) + (uint64_t)hd->cap_t * 4 * w->shape.head_dim;
    }
}
