/*
 * Remote RetroInfer state of one sequence (gw_remote.h): meta index per
 * (layer, KV head), cluster upload in page format, the block cache and the
 * receive buffer, and the tripartite decode through the kvstore's ranked
 * fetch.  Workload: one decode step = one FETCH_RANKED per layer for ~2% of
 * the clusters of every KV head, most of them cache hits once warm.
 */
#include "gpuworker/worker/gw_remote.h"

#include <math.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#include "common/cm_alloc.h"
#include "common/cm_log.h"
#include "common/cm_status.h"
#include "common/cm_time.h"
#include "gpuworker/dp/gw_dp.h"
#include "gpuworker/worker/gw_direct.h"
#include "gpuworker/worker/gw_io.h"

static CM_ALLOC_TAG(gw_remote_tag, "gw.remote");

#define GW_NO_ID UINT32_MAX
#define GW_GMAX 64u   /* query heads per group handled on the stack */

/* What is remote of one KV head of a layer. */
typedef struct gw_head {
    uint32_t *rid;         /* local cluster id -> kvstore id (GW_NO_ID: empty, never uploaded) */
    uint32_t rcap;         /* entries allocated in rid, lid, cpg */
    uint32_t n_remote;     /* clusters the kvstore holds for the head */
    uint32_t max_pages;    /* pages of the largest cluster */
    uint32_t *lid;         /* kvstore id -> local cluster id */
    uint32_t **cpg;        /* per local cluster: its cache pages (owned), NULL when not
                              cached: our mirror of the kvstore's directory */
} gw_head_t;

/* Index state of one layer, all KV heads.  The index, its budgets and its
 * build/update schedule are kn_wave's (one engine for in-process and remote);
 * the layer's store (gw_store_append) uploads what it clusters. */
typedef struct gw_layer {
    kn_wave_t *wave;       /* index, budgets, schedule; clusters kept by our store */
    kn_wave_store_t store; /* ctx = this layer */
    struct gw_remote *r;   /* owner, for the store */
    uint32_t layer;
    bool appendable;       /* the store's next upload is an APPEND (the layer was indexed) */
    const kn_index_t *idx; /* [n_kv] the wave's meta index (borrowed) */
    gw_head_t *hd;         /* [n_kv] what is remote of each KV head */
} gw_layer_t;

/* One decode step in flight (between decode_begin and decode_end). */
typedef struct gw_step {
    bool active;           /* begin done, end not yet */
    bool fetching;         /* job submitted */
    uint32_t layer;
    const float *q;        /* borrowed [n_q][d] */
    kn_kv_view_t kv;       /* copy of the caller's view */
    uint32_t n_r, n_e;     /* requested budgets */
    uint32_t want;         /* room per head in ids */
    size_t cap_ids;        /* allocated: n_kv * want */
    uint32_t *ids;         /* [n_kv][want] local cluster ids from kn_rank */
    uint32_t *req;         /* [n_kv * want] kvstore ids, head by head */
    uint32_t *lids;        /* [n_kv * want] the same clusters' local ids */
    uint32_t *nr, *ne;     /* [n_kv] counts from kn_rank */
    uint32_t *heads;       /* [n_kv] heads sent */
    uint32_t *counts;      /* [n_kv] ids per head sent */
    uint32_t *ent0;        /* [n_kv] first reply entry of each head */
    float *part;           /* [n_kv][2 g (d + 1)] exact and estimated parts */
    gw_io_job_t job;       /* the fetch */
    bool predicted;        /* every retrieved cluster was in the mirror: no wait */
    bool direct;           /* every retrieved cluster read from the kvstore's region: no fetch */
    bool estimated;        /* the estimation zone was computed at begin, with the ranking */
    bool degraded;         /* an earlier fetch is late: no fetch, mirror hits only */
    uint64_t submit_ns;    /* when the fetch was submitted (its deadline counts from here) */
    uint32_t *nl;          /* [n_kv] late clusters per head (after the retrieved ones in ids) */
    /* the fetch's own copies of what it asked (the io thread reads them, and
     * a late answer is checked against them after later steps reused ids) */
    uint32_t *jheads, *jcounts, *jreq, *jlids;
    size_t cap_j;
    uint32_t jn_heads;
    const uint8_t **paddr; /* page addresses of every entry, in entry order */
    uint32_t *eoff;        /* [entries] first page of each entry in paddr */
    uint32_t *etok;        /* [entries] tokens of each entry */
    size_t cap_paddr, cap_ent;
    _Atomic int status;    /* first failure of a parallel part */
    _Atomic uint64_t exact, retrieved, bytes;
    float *out, *lse;      /* decode_end's outputs */
} gw_step_t;

#define GW_PEND_MAX 64u

/* A predicted step's fetch and what we expect of its answer. */
typedef struct gw_pend {
    gw_io_job_t job;
    uint32_t layer;
    uint32_t *heads, *counts;  /* [n_kv] */
    uint32_t *ids;             /* kvstore ids sent */
    uint32_t *pages;           /* expected cache pages, entry after entry */
    size_t cap_ids, cap_pages;
} gw_pend_t;

struct gw_remote {
    kn_shape_t shape;        /* one layer */
    uint32_t n_layers, n_kv, g, d;
    gw_remote_params_t p;
    const kn_ops_t *ops;
    gw_io_t *io;             /* the connection and its thread */
    gw_direct_t *direct;     /* the session's region mapped here, or NULL (two-sided) */
    gw_layer_t *layers;      /* [n_layers] */
    uint64_t pages_uploaded; /* over all layers */
    size_t page_bytes;       /* 4 * P * d */
    /* wave buffer */
    bool registered;
    uint32_t cache_id;
    uint32_t cache_pages;
    uint8_t *cache;          /* [cache_pages][page_bytes] */
    uint8_t *recv;           /* receive buffer (UCX-registered) */
    size_t recv_len;
    void **old_recv;         /* earlier receive buffers, registered until close */
    size_t n_old;
    gw_step_t step;
    /* fetches sent for their LRU effect only (predicted all-hit steps), not
     * waited for; checked in order once done */
    gw_pend_t pend[GW_PEND_MAX];
    uint32_t pend_first, pend_n;
    /* a fetch that missed its step's deadline, still in flight in step.job;
     * no new fetch is sent until it is applied (its misses sit in recv) */
    bool late;
    uint32_t late_layer;
    ri_status_t err;         /* sticky */
    gw_remote_stats_t st;
};

void gw_remote_params_default(gw_remote_params_t *p)
{
    memset(p, 0, sizeof(*p));
    kn_wave_params_default(&p->wave);
    p->cache_frac = 0.05f;
    p->cache_pages = 0;
    p->min_cache_pages = 64;
    p->timeout_ms = 5000;
    /* Measured on a busy 2-core box: the caller making the fetch itself
     * beats handing it to the io thread (one wake-up less); the estimation
     * zone it could overlap is tiny on the CPU backend. */
    p->fetch_async = getenv("RI_FETCH_ASYNC") != NULL && atoi(getenv("RI_FETCH_ASYNC")) != 0;
    p->predict = getenv("RI_PREDICT") == NULL || atoi(getenv("RI_PREDICT")) != 0;
    p->deadline_us = getenv("RI_DEADLINE_US") != NULL ? (uint32_t)strtoul(getenv("RI_DEADLINE_US"), NULL, 10) : 0;
    p->direct = getenv("RI_DIRECT") == NULL || atoi(getenv("RI_DIRECT")) != 0;
}

/* Connect, map the session's region when asked and possible, start the io
 * thread (which owns the connection from then on). */
static ri_status_t gw_remote_open(gw_remote_t *r, const char *addr, uint64_t session_id,
                                  const uint8_t secret[CM_WIRE_SECRET_SIZE])
{
    gw_dp_options_t dopt = {.timeout_ms = r->p.timeout_ms};
    gw_dp_t *dp = NULL;
    ri_status_t st;

    gw_direct_close(r->direct);
    r->direct = NULL;
    st = gw_dp_connect(addr, session_id, secret, &dopt, &dp);
    if (st != RI_OK)
        return st;
    if (r->p.direct) {
        st = gw_direct_open(dp, r->n_layers, r->n_kv, r->page_bytes, &r->direct);
        if (st == RI_ERR_UNSUPPORTED)
            cm_info("data plane of session %llu: no direct region; reads stay two-sided",
                    (unsigned long long)session_id);
        else if (st != RI_OK) {
            gw_dp_close(dp);
            return st;
        }
    }
    return gw_io_start(dp, &r->io); /* owns dp from here, even on failure */
}

static uint32_t gw_pages(uint32_t tokens)
{
    return (tokens + GW_REMOTE_PAGE_TOKENS - 1) / GW_REMOTE_PAGE_TOKENS;
}

static ri_status_t gw_pend_complete(gw_remote_t *r);
static ri_status_t gw_store_append(void *ctx, const kn_index_t *idx, const uint32_t *first,
                                   const kn_kv_view_t *kv);

static void gw_remote_step_free(gw_step_t *s)
{
    cm_free(s->ids);
    cm_free(s->req);
    cm_free(s->lids);
    cm_free(s->nr);
    cm_free(s->ne);
    cm_free(s->heads);
    cm_free(s->counts);
    cm_free(s->ent0);
    cm_free(s->part);
    cm_free(s->nl);
    cm_free(s->jheads);
    cm_free(s->jcounts);
    cm_free(s->jreq);
    cm_free(s->jlids);
    cm_free(s->paddr);
    cm_free(s->eoff);
    cm_free(s->etok);
}

ri_status_t gw_remote_create(const char *addr, uint64_t session_id, const uint8_t secret[CM_WIRE_SECRET_SIZE],
                             const kn_shape_t *shape, uint32_t n_layers, const gw_remote_params_t *params,
                             gw_remote_t **r_p)
{
    gw_remote_params_t defaults;
    gw_remote_t *r;
    ri_status_t st;

    if (addr == NULL || secret == NULL || r_p == NULL || !kn_shape_valid(shape) || n_layers == 0)
        return RI_ERR_INVALID;
    if (params == NULL) {
        gw_remote_params_default(&defaults);
        params = &defaults;
    }
    if (shape->n_q_heads / shape->n_kv_heads > GW_GMAX || shape->n_kv_heads > CM_DP_MAX_HEADS ||
        params->wave.update_tokens == 0 || params->wave.update_clusters == 0 ||
        params->wave.update_clusters > params->wave.update_tokens || params->cache_frac < 0)
        return RI_ERR_INVALID;
    r = cm_calloc(&gw_remote_tag, 1, sizeof(*r));
    if (r == NULL)
        return RI_ERR_NOMEM;
    r->shape = *shape;
    r->n_layers = n_layers;
    r->n_kv = shape->n_kv_heads;
    r->g = shape->n_q_heads / shape->n_kv_heads;
    r->d = shape->head_dim;
    r->p = *params;
    if (r->p.deadline_us > 0)
        r->p.fetch_async = true; /* only an asynchronous fetch can be left behind */
    r->ops = params->wave.ops ? params->wave.ops : kn_ops_default();
    r->page_bytes = (size_t)4 * GW_REMOTE_PAGE_TOKENS * r->d;
    r->layers = cm_calloc(&gw_remote_tag, n_layers, sizeof(*r->layers));
    if (r->layers == NULL)
        goto err_nomem;
    for (uint32_t l = 0; l < n_layers; l++) {
        gw_layer_t *L = &r->layers[l];
        L->hd = cm_calloc(&gw_remote_tag, r->n_kv, sizeof(*L->hd));
        if (L->hd == NULL)
            goto err_nomem;
        L->r = r;
        L->layer = l;
        L->store = (kn_wave_store_t){.ctx = L, .append = gw_store_append};
        if (kn_wave_create_store(shape, &r->p.wave, &L->store, &L->wave) != RI_OK)
            goto err_nomem;
        L->idx = kn_wave_index(L->wave, 0);
    }
    r->step.nr = cm_calloc(&gw_remote_tag, r->n_kv, sizeof(uint32_t));
    r->step.ne = cm_calloc(&gw_remote_tag, r->n_kv, sizeof(uint32_t));
    r->step.heads = cm_calloc(&gw_remote_tag, r->n_kv, sizeof(uint32_t));
    r->step.counts = cm_calloc(&gw_remote_tag, r->n_kv, sizeof(uint32_t));
    r->step.ent0 = cm_calloc(&gw_remote_tag, r->n_kv, sizeof(uint32_t));
    /* per head: exact, estimated and late parts, each [g][d] + [g] */
    r->step.part = cm_malloc(&gw_remote_tag, (size_t)r->n_kv * 3 * r->g * (r->d + 1) * sizeof(float));
    r->step.nl = cm_calloc(&gw_remote_tag, r->n_kv, sizeof(uint32_t));
    if (!r->step.nr || !r->step.ne || !r->step.heads || !r->step.counts || !r->step.ent0 || !r->step.part ||
        !r->step.nl)
        goto err_nomem;

    st = gw_remote_open(r, addr, session_id, secret);
    if (st != RI_OK) {
        cm_error("data plane of session %llu: cannot connect: %s", (unsigned long long)session_id, ri_status_str(st));
        gw_remote_destroy(r);
        return st;
    }
    *r_p = r;
    return RI_OK;

err_nomem:
    gw_remote_destroy(r);
    return RI_ERR_NOMEM;
}

void gw_remote_destroy(gw_remote_t *r)
{
    if (r == NULL)
        return;
    if (r->io != NULL) {
        if (r->step.active && r->step.fetching) {
            gw_io_wait(r->io, &r->step.job);
            gw_dp_fetch_result_free(&r->step.job.res);
        }
        (void)gw_pend_complete(r);
        if (r->registered && gw_io_error(r->io) == RI_OK) {
            gw_io_job_t job = {.kind = GW_IO_RELEASE, .cache_id = 0};
            gw_io_submit(r->io, &job);
            (void)gw_io_wait(r->io, &job);
        }
        if (gw_io_error(r->io) == RI_OK)
            gw_direct_flush(r->direct, r->io);
        gw_io_stop(r->io); /* closes the connection: unregisters the buffers */
    }
    gw_direct_close(r->direct);
    for (uint32_t l = 0; r->layers != NULL && l < r->n_layers; l++) {
        gw_layer_t *L = &r->layers[l];
        for (uint32_t h = 0; L->hd != NULL && h < r->n_kv; h++) {
            gw_head_t *H = &L->hd[h];
            for (uint32_t j = 0; H->cpg != NULL && j < H->rcap; j++)
                cm_free(H->cpg[j]);
            cm_free(H->cpg);
            cm_free(H->lid);
            cm_free(H->rid);
        }
        cm_free(L->hd);
        kn_wave_destroy(L->wave);
    }
    cm_free(r->layers);
    for (size_t i = 0; i < r->n_old; i++)
        cm_free(r->old_recv[i]);
    cm_free(r->old_recv);
    cm_free(r->recv);
    cm_free(r->cache);
    gw_remote_step_free(&r->step);
    for (uint32_t i = 0; i < GW_PEND_MAX; i++) {
        cm_free(r->pend[i].heads);
        cm_free(r->pend[i].counts);
        cm_free(r->pend[i].ids);
        cm_free(r->pend[i].pages);
    }
    cm_free(r);
}

/* ---- index build and upload ---- */

/* Write cluster j of head h of L in page format at dst (pages zero-padded). */
static void gw_pack_cluster(const gw_remote_t *r, const kn_index_t *idx, uint32_t h, const kn_kv_view_t *kv,
                            uint32_t j, uint8_t *dst)
{
    const uint32_t P = GW_REMOTE_PAGE_TOKENS, d = r->d, n = idx->sizes[j];
    const uint32_t *perm = idx->perm + idx->offsets[j];
    size_t row = (size_t)d * sizeof(cm_fp16_t);
    uint32_t np = gw_pages(n);

    memset(dst, 0, (size_t)np * r->page_bytes);
    for (uint32_t i = 0; i < n; i++) {
        uint8_t *page = dst + (size_t)(i / P) * r->page_bytes;
        size_t src = (size_t)h * kv->head_stride + (size_t)perm[i] * kv->token_stride;
        memcpy(page + (size_t)(i % P) * row, kv->k + src, row);
        memcpy(page + (size_t)(P + i % P) * row, kv->v + src, row);
    }
}

/* Pack the non-empty clusters of layer from first[h] on (per head), give
 * them kvstore ids (after the n_remote[h] the kvstore holds) and queue one
 * UPLOAD (append = false) or APPEND for all heads. */
static ri_status_t gw_remote_queue_upload(gw_remote_t *r, uint32_t layer, const kn_kv_view_t *kv,
                                          const uint32_t *first, bool append)
{
    gw_layer_t *L = &r->layers[layer];
    gw_io_job_t *up = NULL;
    uint64_t total_clusters = 0, total_pages = 0, k = 0;
    uint8_t *dst;
    ri_status_t st = RI_OK;

    for (uint32_t h = 0; h < r->n_kv; h++) {
        const kn_index_t *idx = &L->idx[h];
        if (idx->n_clusters > L->hd[h].rcap) {
            uint32_t *nr = cm_realloc(&gw_remote_tag, L->hd[h].rid, idx->n_clusters * sizeof(uint32_t));
            if (nr == NULL)
                return RI_ERR_NOMEM;
            L->hd[h].rid = nr;
            nr = cm_realloc(&gw_remote_tag, L->hd[h].lid, idx->n_clusters * sizeof(uint32_t));
            if (nr == NULL)
                return RI_ERR_NOMEM;
            L->hd[h].lid = nr;
            uint32_t **nc = cm_realloc(&gw_remote_tag, L->hd[h].cpg, idx->n_clusters * sizeof(uint32_t *));
            if (nc == NULL)
                return RI_ERR_NOMEM;
            memset(nc + L->hd[h].rcap, 0, (idx->n_clusters - L->hd[h].rcap) * sizeof(uint32_t *));
            L->hd[h].cpg = nc;
            L->hd[h].rcap = idx->n_clusters;
        }
        for (uint32_t j = first[h]; j < idx->n_clusters; j++) {
            if (idx->sizes[j] == 0)
                continue;
            total_clusters++;
            total_pages += gw_pages(idx->sizes[j]);
        }
    }
    if (total_clusters == 0)
        return RI_OK;
    up = cm_calloc(&gw_remote_tag, 1, sizeof(*up));
    if (up == NULL)
        return RI_ERR_NOMEM;
    up->kind = GW_IO_UPLOAD;
    up->append = append;
    up->layer = layer;
    up->n_heads = r->n_kv;
    up->heads = cm_malloc(&gw_remote_tag, r->n_kv * sizeof(uint32_t));
    up->counts = cm_calloc(&gw_remote_tag, r->n_kv, sizeof(uint32_t));
    up->expect_first = cm_malloc(&gw_remote_tag, r->n_kv * sizeof(uint32_t));
    up->tokens = cm_malloc(&gw_remote_tag, total_clusters * sizeof(uint32_t));
    up->bytes = (size_t)total_pages * r->page_bytes;
    up->page_tokens = GW_REMOTE_PAGE_TOKENS;
    up->page_bytes = r->page_bytes;
    up->pages = cm_malloc(&gw_remote_tag, up->bytes);
    up->locate = r->direct != NULL;
    if (up->locate)
        up->offs = cm_malloc(&gw_remote_tag, total_clusters * sizeof(uint64_t));
    if (!up->heads || !up->counts || !up->expect_first || !up->tokens || !up->pages || (up->locate && !up->offs)) {
        gw_io_job_free(up);
        return RI_ERR_NOMEM;
    }
    dst = up->pages;
    for (uint32_t h = 0; h < r->n_kv; h++) {
        const kn_index_t *idx = &L->idx[h];
        up->heads[h] = h;
        up->expect_first[h] = L->hd[h].n_remote;
        for (uint32_t j = first[h]; j < idx->n_clusters; j++) {
            if (idx->sizes[j] == 0) {
                L->hd[h].rid[j] = GW_NO_ID;
                continue;
            }
            L->hd[h].lid[L->hd[h].n_remote] = j;
            L->hd[h].rid[j] = L->hd[h].n_remote++;
            up->counts[h]++;
            up->tokens[k++] = idx->sizes[j];
            gw_pack_cluster(r, idx, h, kv, j, dst);
            dst += (size_t)gw_pages(idx->sizes[j]) * r->page_bytes;
            L->hd[h].max_pages = CM_MAX(L->hd[h].max_pages, gw_pages(idx->sizes[j]));
        }
    }
    r->pages_uploaded += total_pages;
    r->st.uploaded_bytes += up->bytes;
    gw_io_submit(r->io, up); /* detached: the io thread frees it */
    return st;
}

/* The layer's store (kn_wave_store_t): kn_wave clustered new clusters of
 * every head; pack and queue their upload (the first one of a layer an
 * UPLOAD, later ones APPEND). */
static ri_status_t gw_store_append(void *ctx, const kn_index_t *idx, const uint32_t *first, const kn_kv_view_t *kv)
{
    gw_layer_t *L = ctx;
    ri_status_t st;
    (void)idx; /* the same array as L->idx */
    st = gw_remote_queue_upload(L->r, L->layer, kv, first, L->appendable);
    if (st == RI_OK)
        for (uint32_t h = 0; h < L->r->n_kv; h++)
            L->appendable = L->appendable || L->hd[h].n_remote != 0;
    return st;
}

static bool gw_kv_valid(const kn_kv_view_t *kv)
{
    return kv != NULL && (kv->n_tokens == 0 || (kv->k != NULL && kv->v != NULL)) && kv->n_tokens < UINT32_MAX / 2;
}

/* kn_wave's build or update of layer (its store uploads); times it and
 * makes a failure sticky: the index and the kvstore may disagree after it. */
static ri_status_t gw_remote_index_step(gw_remote_t *r, uint32_t layer, const kn_kv_view_t *kv, bool build,
                                        bool *updated_p)
{
    double t0 = cm_time_s();
    ri_status_t st = build ? kn_wave_build(r->layers[layer].wave, kv)
                           : kn_wave_update(r->layers[layer].wave, kv, updated_p);
    r->st.build_s += cm_time_s() - t0;
    if (st != RI_OK && st != RI_ERR_INVALID && r->err == RI_OK)
        r->err = st;
    return st;
}

ri_status_t gw_remote_build(gw_remote_t *r, uint32_t layer, const kn_kv_view_t *kv)
{
    if (r == NULL || layer >= r->n_layers || !gw_kv_valid(kv) || r->layers[layer].idx[0].n_clusters != 0 ||
        r->step.active)
        return RI_ERR_INVALID;
    if (r->err != RI_OK)
        return r->err;
    return gw_remote_index_step(r, layer, kv, true, NULL);
}

ri_status_t gw_remote_update(gw_remote_t *r, uint32_t layer, const kn_kv_view_t *kv, bool *updated_p)
{
    if (r == NULL || layer >= r->n_layers || !gw_kv_valid(kv) || r->step.active)
        return RI_ERR_INVALID;
    if (kv->n_tokens < kn_wave_indexed_end(r->layers[layer].wave))
        return RI_ERR_INVALID;
    if (r->err != RI_OK)
        return r->err;
    return gw_remote_index_step(r, layer, kv, false, updated_p);
}

ri_status_t gw_remote_sync(gw_remote_t *r)
{
    ri_status_t st;
    if (r == NULL)
        return RI_ERR_INVALID;
    if (r->io == NULL)
        return r->err;
    (void)gw_pend_complete(r);
    st = gw_io_drain(r->io);
    if (st != RI_OK && r->err == RI_OK)
        r->err = st;
    return r->err;
}

/* ---- the wave buffer: block cache and receive buffer ---- */

/* ---- the mirror of the kvstore's cache directory ----
 * Only this connection's fetches change the directory of its cache, in the
 * order we send them, so the worker can know exactly which clusters are
 * cached where: admissions add, evictions remove, hits never change it.
 * When every cluster a step retrieves is in the mirror, the step computes at
 * once from the cache and the fetch (still sent, for the LRU's recency) is
 * checked later: the round trip leaves the critical path. */

static void gw_mirror_clear(gw_remote_t *r)
{
    for (uint32_t l = 0; l < r->n_layers; l++) {
        gw_layer_t *L = &r->layers[l];
        for (uint32_t h = 0; h < r->n_kv; h++)
            for (uint32_t j = 0; L->hd[h].cpg != NULL && j < L->hd[h].rcap; j++) {
                cm_free(L->hd[h].cpg[j]);
                L->hd[h].cpg[j] = NULL;
            }
    }
}

/* Record what a (checked) reply did to the directory. */
static ri_status_t gw_mirror_apply(gw_remote_t *r, uint32_t layer, const cm_dp_fetch_reply_view_t *v,
                                   const uint32_t *lids)
{
    for (uint32_t i = 0; i < v->n_evicted; i++) {
        cm_dp_evict_t ev;
        cm_dp_reply_evicted(v, i, &ev);
        if (ev.layer >= r->n_layers || ev.head >= r->n_kv || ev.cluster >= r->layers[ev.layer].hd[ev.head].n_remote)
            return RI_ERR_PROTOCOL;
        gw_layer_t *E = &r->layers[ev.layer];
        uint32_t j = E->hd[ev.head].lid[ev.cluster];
        cm_free(E->hd[ev.head].cpg[j]);
        E->hd[ev.head].cpg[j] = NULL;
    }
    gw_layer_t *L = &r->layers[layer];
    uint32_t e = 0;
    for (uint32_t hi = 0; hi < v->n_heads; hi++) {
        uint32_t h = cm_dp_reply_head(v, hi), n = cm_dp_reply_head_ids(v, hi);
        for (uint32_t i = 0; i < n; i++, e++) {
            cm_dp_entry_t en;
            uint32_t j = lids[e];
            cm_dp_reply_entry(v, e, &en);
            if (!(en.flags & (CM_DP_F_HIT | CM_DP_F_ADMITTED)))
                continue;
            uint32_t *pg = L->hd[h].cpg[j];
            if (pg == NULL) {
                if (en.flags & CM_DP_F_HIT)
                    cm_warn("data plane: a hit the worker did not know of (layer %u head %u cluster %u)", layer,
                            h, en.cluster);
                pg = cm_malloc(&gw_remote_tag, en.n_pages * sizeof(uint32_t));
                if (pg == NULL)
                    return RI_ERR_NOMEM;
                L->hd[h].cpg[j] = pg;
            }
            for (uint32_t p = 0; p < en.n_pages; p++)
                pg[p] = cm_dp_reply_page(v, en.page_index + p);
        }
    }
    return RI_OK;
}

/* Check the answer to a predicted step's fetch: every cluster a hit, on
 * the pages we used, nothing evicted. */
static ri_status_t gw_pend_check(gw_remote_t *r, gw_pend_t *pd)
{
    const cm_dp_fetch_reply_view_t *v = &pd->job.res.view;
    uint32_t e = 0, pc = 0;
    if (v->n_evicted != 0 || v->n_heads != pd->job.n_heads)
        return RI_ERR_PROTOCOL;
    for (uint32_t hi = 0; hi < v->n_heads; hi++) {
        if (cm_dp_reply_head(v, hi) != pd->heads[hi] || cm_dp_reply_head_ids(v, hi) != pd->counts[hi])
            return RI_ERR_PROTOCOL;
        for (uint32_t i = 0; i < pd->counts[hi]; i++, e++) {
            cm_dp_entry_t en;
            cm_dp_reply_entry(v, e, &en);
            if (!(en.flags & CM_DP_F_HIT) || en.cluster != pd->ids[e] || en.n_pages != gw_pages(en.tokens) ||
                pc + en.n_pages > pd->cap_pages)
                return RI_ERR_PROTOCOL;
            for (uint32_t p = 0; p < en.n_pages; p++)
                if (cm_dp_reply_page(v, en.page_index + p) != pd->pages[pc++])
                    return RI_ERR_PROTOCOL;
        }
    }
    return RI_OK;
}

/* Retire finished predicted fetches in order; with block, all of them. */
static ri_status_t gw_pend_reap(gw_remote_t *r, bool block)
{
    ri_status_t st = RI_OK;
    while (r->pend_n > 0) {
        gw_pend_t *pd = &r->pend[r->pend_first];
        if (!block && !gw_io_done(r->io, &pd->job))
            break;
        double t0 = cm_time_s();
        ri_status_t s1 = gw_io_wait(r->io, &pd->job);
        r->st.fetch_wait_s += cm_time_s() - t0;
        r->st.fetches++;
        if (s1 == RI_OK && (s1 = gw_pend_check(r, pd)) != RI_OK)
            cm_error("data plane: the kvstore's answer to a predicted all-hit fetch of layer %u differs from the "
                     "worker's mirror of its cache", pd->layer);
        gw_dp_fetch_result_free(&pd->job.res);
        r->pend_first = (r->pend_first + 1) % GW_PEND_MAX;
        r->pend_n--;
        if (s1 != RI_OK && st == RI_OK)
            st = s1;
    }
    if (st != RI_OK && r->err == RI_OK)
        r->err = st;
    return st;
}

static ri_status_t gw_late_reap(gw_remote_t *r, bool block);

static ri_status_t gw_pend_complete(gw_remote_t *r)
{
    ri_status_t st = gw_pend_reap(r, true);
    ri_status_t st2 = gw_late_reap(r, true);
    return st != RI_OK ? st : st2;
}

/* Queue the LRU-refreshing fetch of a predicted step (req/lids: k clusters). */
static ri_status_t gw_pend_submit(gw_remote_t *r, uint32_t layer, uint32_t n_heads, uint64_t k)
{
    gw_step_t *s = &r->step;
    const gw_layer_t *L = &r->layers[layer];
    ri_status_t st;
    size_t np = 0;

    if (r->pend_n == GW_PEND_MAX) {
        /* the oldest is long done in practice; bounded memory either way */
        gw_pend_t *pd = &r->pend[r->pend_first];
        double t0 = cm_time_s();
        (void)gw_io_wait(r->io, &pd->job);
        r->st.fetch_wait_s += cm_time_s() - t0;
        if ((st = gw_pend_reap(r, false)) != RI_OK)
            return st;
    }
    gw_pend_t *pd = &r->pend[(r->pend_first + r->pend_n) % GW_PEND_MAX];
    for (uint64_t e = 0, h = 0, i = 0; e < k; e++) {
        while (i >= s->counts[h]) {
            h++;
            i = 0;
        }
        np += gw_pages(L->idx[s->heads[h]].sizes[s->lids[e]]);
        i++;
    }
    if (pd->heads == NULL) {
        pd->heads = cm_malloc(&gw_remote_tag, r->n_kv * sizeof(uint32_t));
        pd->counts = cm_malloc(&gw_remote_tag, r->n_kv * sizeof(uint32_t));
        if (pd->heads == NULL || pd->counts == NULL)
            return RI_ERR_NOMEM;
    }
    if (k > pd->cap_ids) {
        uint32_t *a = cm_realloc(&gw_remote_tag, pd->ids, k * sizeof(uint32_t));
        if (a == NULL)
            return RI_ERR_NOMEM;
        pd->ids = a;
        pd->cap_ids = k;
    }
    if (np > pd->cap_pages) {
        uint32_t *a = cm_realloc(&gw_remote_tag, pd->pages, np * sizeof(uint32_t));
        if (a == NULL)
            return RI_ERR_NOMEM;
        pd->pages = a;
        pd->cap_pages = np;
    }
    memcpy(pd->heads, s->heads, n_heads * sizeof(uint32_t));
    memcpy(pd->counts, s->counts, n_heads * sizeof(uint32_t));
    memcpy(pd->ids, s->req, k * sizeof(uint32_t));
    np = 0;
    for (uint64_t e = 0, h = 0, i = 0; e < k; e++) {
        while (i >= s->counts[h]) {
            h++;
            i = 0;
        }
        uint32_t hh = s->heads[h], j = s->lids[e], n = gw_pages(L->idx[hh].sizes[j]);
        memcpy(pd->pages + np, L->hd[hh].cpg[j], n * sizeof(uint32_t));
        np += n;
        i++;
    }
    pd->layer = layer;
    memset(&pd->job, 0, sizeof(pd->job));
    pd->job.kind = GW_IO_FETCH;
    pd->job.cache_id = r->cache_id;
    pd->job.layer = layer;
    pd->job.n_heads = n_heads;
    pd->job.heads = pd->heads;
    pd->job.counts = pd->counts;
    pd->job.ids = pd->ids;
    pd->job.timeout_ms = r->p.timeout_ms;
    gw_io_submit(r->io, &pd->job);
    r->pend_n++;
    r->st.hits += k; /* checked when the answer is in (a mismatch breaks the object) */
    return RI_OK;
}

/* Register (or re-register, emptying the cache) so that the receive buffer
 * holds at least need bytes. */
static ri_status_t gw_remote_register(gw_remote_t *r, size_t need)
{
    gw_io_job_t job = {.kind = GW_IO_REGISTER};
    size_t bound = 0, len;
    uint8_t *recv;
    ri_status_t st;

    st = gw_pend_complete(r); /* they name the old cache */
    if (st != RI_OK)
        return st;
    gw_mirror_clear(r);
    if (!r->registered) {
        uint64_t cap = r->p.cache_pages;
        if (cap == 0)
            cap = (uint64_t)ceil((double)r->p.cache_frac * (double)r->pages_uploaded);
        cap = CM_MAX(cap, (uint64_t)CM_MAX(r->p.min_cache_pages, 1u));
        cap = CM_MIN(cap, (uint64_t)1 << 26);
        r->cache = cm_malloc_aligned(&gw_remote_tag, (size_t)cap * r->page_bytes, 4096);
        if (r->cache == NULL)
            return RI_ERR_NOMEM;
        r->cache_pages = (uint32_t)cap;
    } else {
        /* A new cache: the old directory and its pages are forgotten. */
        gw_io_job_t rel = {.kind = GW_IO_RELEASE, .cache_id = r->cache_id};
        gw_io_submit(r->io, &rel);
        st = gw_io_wait(r->io, &rel);
        if (st != RI_OK)
            return st;
        void **no = cm_realloc(&gw_remote_tag, r->old_recv, (r->n_old + 1) * sizeof(void *));
        if (no == NULL)
            return RI_ERR_NOMEM;
        r->old_recv = no;
        r->old_recv[r->n_old++] = r->recv; /* UCX keeps it registered until close */
        r->recv = NULL;
        r->registered = false;
    }
    /* A step's worst case: every head's n_r largest clusters all missing. */
    for (uint32_t l = 0; l < r->n_layers; l++) {
        size_t b = 0;
        uint32_t nr, ne;
        kn_wave_budget(r->layers[l].wave, &nr, &ne);
        for (uint32_t h = 0; h < r->n_kv; h++)
            b += (size_t)nr * r->layers[l].hd[h].max_pages * r->page_bytes;
        bound = CM_MAX(bound, b);
    }
    len = CM_MAX(need + need / 4, bound);
    len = CM_ALIGN_UP(CM_MAX(len, (size_t)64 * r->page_bytes), 4096);
    recv = cm_malloc_aligned(&gw_remote_tag, len, 4096);
    if (recv == NULL)
        return RI_ERR_NOMEM;
    job.capacity_pages = r->cache_pages;
    job.recv = recv;
    job.recv_len = len;
    gw_io_submit(r->io, &job);
    st = gw_io_wait(r->io, &job);
    if (st == RI_OK && job.out_page_bytes != r->page_bytes) {
        cm_error("data plane: kvstore page is %llu bytes, worker expects %zu (page_tokens %u, head_dim %u)",
                 (unsigned long long)job.out_page_bytes, r->page_bytes, GW_REMOTE_PAGE_TOKENS, r->d);
        st = RI_ERR_PROTOCOL;
    }
    r->recv = recv; /* registered with UCX (or not): freed at destroy either way */
    r->recv_len = len;
    if (st != RI_OK)
        return st;
    r->cache_id = job.out_cache_id;
    r->registered = true;
    r->st.registrations++;
    r->st.cache_pages = r->cache_pages;
    return RI_OK;
}

static ri_status_t gw_step_reserve(gw_remote_t *r, uint32_t want)
{
    gw_step_t *s = &r->step;
    size_t need = (size_t)r->n_kv * CM_MAX(want, 1u);
    if (need > s->cap_ids) {
        uint32_t *a = cm_realloc(&gw_remote_tag, s->ids, need * sizeof(uint32_t));
        if (a == NULL)
            return RI_ERR_NOMEM;
        s->ids = a;
        a = cm_realloc(&gw_remote_tag, s->req, need * sizeof(uint32_t));
        if (a == NULL)
            return RI_ERR_NOMEM;
        s->req = a;
        a = cm_realloc(&gw_remote_tag, s->lids, need * sizeof(uint32_t));
        if (a == NULL)
            return RI_ERR_NOMEM;
        s->lids = a;
        s->cap_ids = need;
    }
    s->want = CM_MAX(want, 1u);
    return RI_OK;
}

/* ---- late fetches (deadline_us) ---- */

/* The fetch's own copies of heads, counts, kvstore ids and local ids. */
static ri_status_t gw_job_arrays(gw_remote_t *r, uint32_t n_heads, uint64_t k)
{
    gw_step_t *s = &r->step;
    size_t need = CM_MAX((size_t)k, (size_t)r->n_kv);
    if (need > s->cap_j) {
        uint32_t **arr[4] = {&s->jheads, &s->jcounts, &s->jreq, &s->jlids};
        for (int i = 0; i < 4; i++) {
            uint32_t *a = cm_realloc(&gw_remote_tag, *arr[i], need * sizeof(uint32_t));
            if (a == NULL)
                return RI_ERR_NOMEM;
            *arr[i] = a;
        }
        s->cap_j = need;
    }
    memcpy(s->jheads, s->heads, n_heads * sizeof(uint32_t));
    memcpy(s->jcounts, s->counts, n_heads * sizeof(uint32_t));
    memcpy(s->jreq, s->req, k * sizeof(uint32_t));
    memcpy(s->jlids, s->lids, k * sizeof(uint32_t));
    s->jn_heads = n_heads;
    return RI_OK;
}

/* Check the answer to step.job against what it asked (the fetch's own
 * copies of heads, counts and ids): entry order, sizes, page bounds; count
 * hits and misses. */
static ri_status_t gw_fetch_check(gw_remote_t *r, uint32_t layer)
{
    const gw_step_t *s = &r->step;
    const cm_dp_fetch_reply_view_t *v = &s->job.res.view;
    const gw_layer_t *L = &r->layers[layer];
    uint32_t e = 0;
    if (v->n_heads != s->jn_heads)
        return RI_ERR_PROTOCOL;
    for (uint32_t hi = 0; hi < v->n_heads; hi++) {
        uint32_t h = s->jheads[hi];
        if (cm_dp_reply_head(v, hi) != h || cm_dp_reply_head_ids(v, hi) != s->jcounts[hi])
            return RI_ERR_PROTOCOL;
        for (uint32_t i = 0; i < s->jcounts[hi]; i++, e++) {
            uint32_t j = s->jlids[e];
            cm_dp_entry_t en;
            cm_dp_reply_entry(v, e, &en);
            if (en.cluster != s->jreq[e] || en.tokens != L->idx[h].sizes[j] || en.n_pages != gw_pages(en.tokens))
                return RI_ERR_PROTOCOL;
            if (en.flags & (CM_DP_F_HIT | CM_DP_F_ADMITTED))
                for (uint32_t p = 0; p < en.n_pages; p++)
                    if (cm_dp_reply_page(v, en.page_index + p) >= r->cache_pages)
                        return RI_ERR_PROTOCOL;
            if ((en.flags & CM_DP_F_MISS) &&
                (en.recv_offset > r->recv_len || (uint64_t)en.n_pages * r->page_bytes > r->recv_len - en.recv_offset))
                return RI_ERR_PROTOCOL;
            if (en.flags & CM_DP_F_HIT)
                r->st.hits++;
            else
                r->st.misses++;
        }
    }
    return RI_OK;
}

static void gw_step_admit(gw_remote_t *r);

/* Apply the late fetch once it is in (with block: wait for it): its
 * evictions and admissions go into the mirror and its admitted misses into
 * the cache.  Between two steps only, so no step reads a page meanwhile. */
static ri_status_t gw_late_reap(gw_remote_t *r, bool block)
{
    gw_step_t *s = &r->step;
    ri_status_t st;
    if (!r->late)
        return RI_OK;
    if (!block && !gw_io_done(r->io, &s->job))
        return RI_OK;
    (void)gw_pend_reap(r, true); /* sent before it, so done before it */
    st = gw_io_wait(r->io, &s->job);
    r->st.fetches++;
    if (st == RI_OK)
        st = gw_fetch_check(r, r->late_layer);
    if (st == RI_OK)
        st = gw_mirror_apply(r, r->late_layer, &s->job.res.view, s->jlids);
    if (st == RI_OK)
        gw_step_admit(r);
    else
        cm_error("data plane: the late fetch of layer %u failed: %s", r->late_layer, ri_status_str(st));
    gw_dp_fetch_result_free(&s->job.res);
    r->late = false;
    if (st != RI_OK && r->err == RI_OK)
        r->err = st;
    return st;
}

/* The step could not wait for (all) its misses: in each head, the retrieved
 * clusters our cache holds (per the mirror) stay exact, moved to the front;
 * the others are estimated from their centroid like the estimation zone
 * (part 3), and counted late.  The cache pages are read as they are: the
 * late answer changes them only when it is applied, between steps. */
static ri_status_t gw_step_degrade(gw_remote_t *r, const kn_shape_t *grp)
{
    gw_step_t *s = &r->step;
    const gw_layer_t *L = &r->layers[s->layer];
    uint32_t k = 0, late = 0;
    ri_status_t st = RI_OK;
    for (uint32_t h = 0; h < r->n_kv && st == RI_OK; h++) {
        uint32_t *ids = s->ids + (size_t)h * s->want, keep = 0;
        for (uint32_t i = 0; i < s->nr[h]; i++)
            if (L->hd[h].cpg[ids[i]] != NULL) {
                uint32_t t = ids[keep];
                ids[keep++] = ids[i];
                ids[i] = t;
            }
        s->nl[h] = s->nr[h] - keep;
        s->nr[h] = keep;
        s->ent0[h] = k;
        k += keep;
        late += s->nl[h];
        if (s->nl[h] > 0) {
            float *o_l = s->part + (size_t)h * 3 * r->g * (r->d + 1) + (size_t)2 * r->g * r->d;
            float *l_l = o_l + (size_t)r->g * r->d + 2u * r->g;
            st = kn_estimate(r->ops, grp, s->q + (size_t)h * r->g * r->d, &L->idx[h], ids + keep, s->nl[h], o_l, l_l);
        }
    }
    s->predicted = true; /* every page from the mirror */
    r->st.late_steps++;
    r->st.late_clusters += late;
    return st;
}

/* ---- decode ---- */

/* Rank (and, when no fetch could overlap it, estimate) every KV head of a
 * step, one task per head as kn_wave does in-process. */
typedef struct gw_rank_job {
    gw_remote_t *r;
    const gw_layer_t *L;
    const kn_shape_t *grp;
    bool estimate;
    _Atomic int status;
} gw_rank_job_t;

static void gw_rank_task(void *arg, size_t begin, size_t end, unsigned worker)
{
    gw_rank_job_t *job = arg;
    gw_remote_t *r = job->r;
    gw_step_t *s = &r->step;
    (void)worker;
    for (size_t h = begin; h < end; h++) {
        const kn_index_t *idx = &job->L->idx[h];
        const float *q = s->q + h * r->g * r->d;
        uint32_t *ids = s->ids + h * s->want;
        ri_status_t st = RI_OK;
        s->nr[h] = s->ne[h] = s->nl[h] = 0;
        if (job->estimate) {
            float *o_e = s->part + h * 3 * r->g * (r->d + 1) + (size_t)r->g * r->d;
            float *l_e = o_e + (size_t)2 * r->g * r->d + r->g;
            st = kn_wave_rank_estimate(r->ops, job->grp, q, idx, s->n_r, s->n_e, ids, &s->nr[h], &s->ne[h], o_e,
                                       l_e);
        } else if (idx->n_clusters > 0) {
            st = kn_rank(r->ops, job->grp, q, idx, s->n_r, s->n_e, ids, &s->nr[h], &s->ne[h]);
        }
        if (st != RI_OK) {
            int expect = RI_OK;
            atomic_compare_exchange_strong(&job->status, &expect, (int)st);
        }
    }
}

ri_status_t gw_remote_decode_begin(gw_remote_t *r, uint32_t layer, const float *q, const kn_kv_view_t *kv,
                                   uint32_t n_r, uint32_t n_e)
{
    gw_step_t *s;
    gw_layer_t *L;
    kn_shape_t grp;
    uint32_t maxc = 0, n_heads = 0;
    uint64_t k = 0, worst = 0;
    bool all_cached = true, all_direct = r != NULL && r->direct != NULL;
    ri_status_t st;

    if (r == NULL || q == NULL || layer >= r->n_layers || !gw_kv_valid(kv) || r->step.active)
        return RI_ERR_INVALID;
    s = &r->step;
    L = &r->layers[layer];
    if (kv->n_tokens < kn_wave_indexed_end(L->wave))
        return RI_ERR_INVALID;
    if (r->err == RI_OK)
        r->err = gw_io_error(r->io); /* a failed upload: the kvstore and our index disagree */
    if (r->err != RI_OK)
        return r->err;
    st = gw_pend_reap(r, false);
    if (st == RI_OK)
        st = gw_late_reap(r, false);
    if (st == RI_OK && r->direct != NULL)
        st = gw_direct_apply(r->direct, r->io);
    if (st != RI_OK)
        return st;
    s->layer = layer;
    s->q = q;
    s->predicted = false;
    s->direct = false;
    s->degraded = r->late; /* an earlier fetch is still out: none sent now */
    s->kv = *kv;
    uint32_t l_r, l_e;
    kn_wave_budget(L->wave, &l_r, &l_e);
    s->n_r = n_r == UINT32_MAX ? l_r : n_r;
    s->n_e = n_e == UINT32_MAX ? l_e : n_e;
    s->fetching = false;
    for (uint32_t h = 0; h < r->n_kv; h++)
        maxc = CM_MAX(maxc, L->idx[h].n_clusters);
    st = gw_step_reserve(r, (uint32_t)CM_MIN((uint64_t)s->n_r + s->n_e, (uint64_t)maxc));
    if (st != RI_OK)
        return st;
    grp = (kn_shape_t){.n_q_heads = r->g, .n_kv_heads = 1, .head_dim = r->d, .scale = r->shape.scale};
    /* The estimation zone overlaps only an asynchronous fetch: otherwise it
     * is computed here, with the ranking, in parallel over the heads. */
    gw_rank_job_t rj = {.r = r, .L = L, .grp = &grp, .estimate = !r->p.fetch_async};
    atomic_init(&rj.status, RI_OK);
    cm_pool_parallel_for(kn_pool(), r->n_kv, 1, gw_rank_task, &rj);
    if ((st = (ri_status_t)atomic_load(&rj.status)) != RI_OK)
        return st;
    s->estimated = rj.estimate;
    for (uint32_t h = 0; h < r->n_kv; h++) {
        const kn_index_t *idx = &L->idx[h];
        uint32_t *ids = s->ids + (size_t)h * s->want;
        s->ent0[h] = (uint32_t)k;
        if (s->nr[h] == 0)
            continue;
        s->heads[n_heads] = h;
        s->counts[n_heads] = s->nr[h];
        n_heads++;
        for (uint32_t i = 0; i < s->nr[h]; i++) {
            uint32_t j = ids[i];
            if (L->hd[h].rid[j] == GW_NO_ID)
                return RI_ERR_INTERNAL; /* kn_rank returns non-empty clusters only */
            s->lids[k] = j;
            s->req[k++] = L->hd[h].rid[j];
            worst += (uint64_t)gw_pages(idx->sizes[j]) * r->page_bytes;
            if (L->hd[h].cpg[j] == NULL)
                all_cached = false;
            if (all_direct && gw_direct_pages(r->direct, layer, h, L->hd[h].rid[j], gw_pages(idx->sizes[j])) == NULL)
                all_direct = false;
        }
    }
    if (n_heads > 0 && all_direct) {
        /* Every retrieved cluster is in the kvstore's region, mapped here:
         * read in place, nothing sent now; the kvstore hears of it later. */
        s->direct = true;
        s->degraded = false;
        for (uint64_t e = 0, hi = 0; hi < n_heads; hi++)
            for (uint32_t i = 0; i < s->counts[hi]; i++, e++)
                gw_direct_touch(r->direct, r->io, layer, s->heads[hi], s->req[e]);
    } else if (s->degraded) {
        /* mirror hits exact, the rest estimated (decode_end) */
    } else if (n_heads > 0 && all_cached && r->registered && r->p.predict) {
        /* Predicted all-hit: compute from the cache now; the fetch only
         * refreshes the LRU and is checked when its answer is in. */
        st = gw_pend_submit(r, layer, n_heads, k);
        if (st != RI_OK)
            return st;
        s->predicted = true;
    } else if (n_heads > 0) {
        if (!r->registered || worst > r->recv_len) {
            st = gw_remote_register(r, (size_t)worst);
            if (st != RI_OK) {
                if (r->err == RI_OK)
                    r->err = st;
                return st;
            }
        }
        st = gw_job_arrays(r, n_heads, k);
        if (st != RI_OK)
            return st;
        memset(&s->job, 0, sizeof(s->job));
        s->job.kind = GW_IO_FETCH;
        s->job.cache_id = r->cache_id;
        s->job.layer = layer;
        s->job.n_heads = n_heads;
        s->job.heads = s->jheads;
        s->job.counts = s->jcounts;
        s->job.ids = s->jreq;
        s->job.recv_offset = 0;
        s->job.timeout_ms = r->p.timeout_ms;
        s->fetching = true;
        s->submit_ns = cm_time_ns();
        if (r->p.fetch_async) {
            gw_io_submit(r->io, &s->job);
        } else {
            double t0 = cm_time_s();
            (void)gw_io_call(r->io, &s->job); /* status checked in decode_end */
            double w = cm_time_s() - t0;
            r->st.fetch_wait_s += w;
            r->st.max_wait_s = CM_MAX(r->st.max_wait_s, w);
        }
    }
    s->active = true;
    return RI_OK;
}

static void gw_step_fail(gw_step_t *s, ri_status_t st)
{
    int expect = RI_OK;
    atomic_compare_exchange_strong(&s->status, &expect, (int)st);
}

/* Exact part (steady zone + retrieved clusters, in kn_wave's order), merge
 * with the estimated part computed before, per KV head. */
static void gw_exact_task(void *arg, size_t begin, size_t end, unsigned worker)
{
    gw_remote_t *r = arg;
    gw_step_t *s = &r->step;
    const gw_layer_t *L = &r->layers[s->layer];
    const kn_kv_view_t *kv = &s->kv;
    const uint32_t g = r->g, d = r->d, P = GW_REMOTE_PAGE_TOKENS;
    (void)worker;

    for (size_t h = begin; h < end; h++) {
        const kn_index_t *idx = &L->idx[h];
        const uint32_t *ids = s->ids + h * s->want;
        size_t np = 0, maxp = 0;
        uint64_t exact = 0, retrieved = 0;
        float *o_x = s->part + h * 3 * g * (d + 1), *o_e = o_x + (size_t)g * d, *o_l = o_e + (size_t)g * d;
        float *l_x = o_x + (size_t)3 * g * d, *l_e = l_x + g, *l_l = l_e + g;
        const float *op[2] = {o_e, o_l}, *lp[2] = {l_e, l_l};
        size_t row = (size_t)d * sizeof(cm_fp16_t);
        kn_page_t *pages;
        cm_fp16_t *exec;
        ri_status_t st;

        size_t n_ret = 0;
        for (uint32_t i = 0; i < s->nr[h]; i++)
            n_ret += idx->sizes[ids[i]];
        maxp += s->nr[h];
        /* The execution buffer: each retrieved cluster gathered into
         * contiguous K and V rows, so that the kernel sees the same rows in
         * the same runs as the in-process decode (bit-identical results). */
        pages = cm_malloc(&gw_remote_tag, (maxp ? maxp : 1) * sizeof(kn_page_t));
        exec = cm_malloc(&gw_remote_tag, (n_ret ? n_ret : 1) * 2 * row);
        if (pages == NULL || exec == NULL) {
            cm_free(pages);
            cm_free(exec);
            gw_step_fail(s, RI_ERR_NOMEM);
            continue;
        }
        cm_fp16_t *xk = exec, *xv = exec + n_ret * d;
        for (uint32_t i = 0; i < s->nr[h]; i++) {
            uint32_t e = s->ent0[h] + i, tokens = s->etok[e];
            pages[np++] = (kn_page_t){xk, xv, tokens, d};
            for (uint32_t p = 0; p < gw_pages(tokens); p++) {
                const uint8_t *base = s->paddr[s->eoff[e] + p];
                uint32_t nt = CM_MIN(P, tokens - p * P);
                memcpy(xk, base, nt * row);
                memcpy(xv, base + (size_t)P * row, nt * row);
                xk += (size_t)nt * d;
                xv += (size_t)nt * d;
            }
            retrieved += tokens;
        }
        /* steady zone + these, merged with the estimated (and late) parts:
         * kn_wave's second phase, as in process */
        st = kn_wave_exact_merge(L->wave, (uint32_t)h, s->q + h * g * d, kv, pages, np, o_x, l_x, op, lp,
                                 s->nl[h] > 0 ? 2 : 1, s->out + h * g * d, s->lse ? s->lse + h * g : NULL, &exact);
        cm_free(pages);
        cm_free(exec);
        if (st != RI_OK) {
            gw_step_fail(s, st);
            continue;
        }
        atomic_fetch_add(&s->exact, exact);
        atomic_fetch_add(&s->retrieved, retrieved);
        atomic_fetch_add(&s->bytes, exact * 4 * d + (uint64_t)idx->n_clusters * (2 * d + 4) +
                                        (uint64_t)s->ne[h] * 4 * d);
    }
}

/* Copy every admitted miss from the receive buffer into its cache pages. */
static void gw_step_admit(gw_remote_t *r)
{
    const cm_dp_fetch_reply_view_t *v = &r->step.job.res.view;
    for (uint32_t e = 0; e < v->n_entries; e++) {
        cm_dp_entry_t en;
        cm_dp_reply_entry(v, e, &en);
        if (!(en.flags & CM_DP_F_ADMITTED))
            continue;
        for (uint32_t p = 0; p < en.n_pages; p++)
            memcpy(r->cache + (size_t)cm_dp_reply_page(v, en.page_index + p) * r->page_bytes,
                   r->recv + en.recv_offset + (size_t)p * r->page_bytes, r->page_bytes);
        r->st.admitted++;
    }
    r->st.evicted += v->n_evicted;
    r->st.fetched_bytes += v->miss_bytes;
}

/* Where each retrieved cluster's pages are: the cache (hits, predicted
 * steps) or the receive buffer (misses). */
static ri_status_t gw_step_resolve(gw_remote_t *r)
{
    gw_step_t *s = &r->step;
    const gw_layer_t *L = &r->layers[s->layer];
    const cm_dp_fetch_reply_view_t *v = &s->job.res.view;
    size_t n_ent = 0, n_pg = 0;

    for (uint32_t h = 0; h < r->n_kv; h++)
        for (uint32_t i = 0; i < s->nr[h]; i++) {
            n_ent++;
            n_pg += gw_pages(L->idx[h].sizes[s->ids[(size_t)h * s->want + i]]);
        }
    if (n_ent > s->cap_ent) {
        uint32_t *a = cm_realloc(&gw_remote_tag, s->eoff, n_ent * sizeof(uint32_t));
        if (a == NULL)
            return RI_ERR_NOMEM;
        s->eoff = a;
        a = cm_realloc(&gw_remote_tag, s->etok, n_ent * sizeof(uint32_t));
        if (a == NULL)
            return RI_ERR_NOMEM;
        s->etok = a;
        s->cap_ent = n_ent;
    }
    if (n_pg > s->cap_paddr) {
        const uint8_t **a = cm_realloc(&gw_remote_tag, s->paddr, n_pg * sizeof(*a));
        if (a == NULL)
            return RI_ERR_NOMEM;
        s->paddr = a;
        s->cap_paddr = n_pg;
    }
    uint32_t e = 0, pc = 0;
    for (uint32_t h = 0; h < r->n_kv; h++)
        for (uint32_t i = 0; i < s->nr[h]; i++, e++) {
            uint32_t j = s->ids[(size_t)h * s->want + i], tokens = L->idx[h].sizes[j], np = gw_pages(tokens);
            s->eoff[e] = pc;
            s->etok[e] = tokens;
            if (s->direct) {
                const uint8_t *base = gw_direct_pages(r->direct, s->layer, h, L->hd[h].rid[j], np);
                if (base == NULL)
                    return RI_ERR_INTERNAL; /* checked at begin */
                for (uint32_t p = 0; p < np; p++)
                    s->paddr[pc++] = base + (size_t)p * r->page_bytes;
                continue;
            }
            if (s->predicted) {
                for (uint32_t p = 0; p < np; p++)
                    s->paddr[pc++] = r->cache + (size_t)L->hd[h].cpg[j][p] * r->page_bytes;
                continue;
            }
            cm_dp_entry_t en;
            cm_dp_reply_entry(v, e, &en);
            for (uint32_t p = 0; p < np; p++)
                s->paddr[pc++] = (en.flags & CM_DP_F_HIT)
                                     ? r->cache + (size_t)cm_dp_reply_page(v, en.page_index + p) * r->page_bytes
                                     : r->recv + en.recv_offset + (size_t)p * r->page_bytes;
        }
    return RI_OK;
}

ri_status_t gw_remote_decode_end(gw_remote_t *r, float *out, float *lse)
{
    gw_step_t *s;
    const gw_layer_t *L;
    kn_shape_t grp;
    ri_status_t st = RI_OK;

    if (r == NULL || !r->step.active)
        return RI_ERR_INVALID;
    s = &r->step;
    L = &r->layers[s->layer];
    grp = (kn_shape_t){.n_q_heads = r->g, .n_kv_heads = 1, .head_dim = r->d, .scale = r->shape.scale};
    /* estimation zone while the fetch is on its way (unless done at begin) */
    for (uint32_t h = 0; h < r->n_kv && st == RI_OK && !s->estimated; h++) {
        float *o_e = s->part + (size_t)h * 3 * r->g * (r->d + 1) + (size_t)r->g * r->d;
        float *l_e = o_e + (size_t)2 * r->g * r->d + r->g;
        st = kn_estimate(r->ops, &grp, s->q + (size_t)h * r->g * r->d, &L->idx[h], s->ids + (size_t)h * s->want + s->nr[h],
                         s->ne[h], o_e, l_e);
    }
    if (s->fetching && r->p.deadline_us > 0) {
        double t0 = cm_time_s();
        bool in = gw_io_wait_until(r->io, &s->job, s->submit_ns + (uint64_t)r->p.deadline_us * 1000u);
        double w = cm_time_s() - t0;
        r->st.fetch_wait_s += w;
        r->st.max_wait_s = CM_MAX(r->st.max_wait_s, w);
        if (!in) {
            /* The answer is late: this step goes on without its misses, and
             * the fetch stays in flight until a later step applies it. */
            r->late = true;
            r->late_layer = s->layer;
            s->fetching = false;
            s->degraded = true;
        }
    }
    if (s->degraded && st == RI_OK)
        st = gw_step_degrade(r, &grp);
    if (s->fetching) {
        double t0 = cm_time_s();
        ri_status_t fst = gw_io_wait(r->io, &s->job);
        double w = cm_time_s() - t0;
        r->st.fetch_wait_s += w;
        r->st.max_wait_s = CM_MAX(r->st.max_wait_s, w);
        r->st.fetches++;
        if (fst == RI_OK)
            fst = gw_fetch_check(r, s->layer);
        if (fst == RI_OK)
            fst = gw_mirror_apply(r, s->layer, &s->job.res.view, s->lids);
        if (fst == RI_OK)
            fst = gw_pend_reap(r, false); /* answered before this one */
        if (fst != RI_OK) {
            cm_error("data plane: ranked fetch of layer %u failed: %s", s->layer, ri_status_str(fst));
            if (r->err == RI_OK)
                r->err = fst;
            st = fst;
        }
    }
    if (st == RI_OK) {
        s->out = out;
        s->lse = lse;
        atomic_init(&s->status, RI_OK);
        atomic_init(&s->exact, 0);
        atomic_init(&s->retrieved, 0);
        atomic_init(&s->bytes, 0);
        if (!s->fetching && !r->late)
            memset(&s->job.res, 0, sizeof(s->job.res)); /* no entries to read (a late job owns it) */
        st = gw_step_resolve(r);
        if (st == RI_OK) {
            cm_pool_parallel_for(kn_pool(), r->n_kv, 1, gw_exact_task, r);
            st = (ri_status_t)atomic_load(&s->status);
        }
    }
    if (st == RI_OK) {
        if (s->fetching)
            gw_step_admit(r);
        if (s->direct) {
            r->st.direct_steps++;
            for (uint32_t h = 0; h < r->n_kv; h++)
                r->st.direct_clusters += s->nr[h];
        }
        r->st.steps++;
        r->st.exact_tokens += atomic_load(&s->exact);
        r->st.retrieved_tokens += atomic_load(&s->retrieved);
        r->st.bytes_read += atomic_load(&s->bytes);
    }
    if (s->fetching)
        gw_dp_fetch_result_free(&s->job.res);
    s->fetching = false;
    s->active = false;
    return st;
}

ri_status_t gw_remote_decode_budget(gw_remote_t *r, uint32_t layer, const float *q, const kn_kv_view_t *kv,
                                    uint32_t n_r, uint32_t n_e, float *out, float *lse)
{
    ri_status_t st;
    if (out == NULL)
        return RI_ERR_INVALID;
    st = gw_remote_decode_begin(r, layer, q, kv, n_r, n_e);
    if (st != RI_OK)
        return st;
    return gw_remote_decode_end(r, out, lse);
}

ri_status_t gw_remote_decode(gw_remote_t *r, uint32_t layer, const float *q, const kn_kv_view_t *kv, float *out,
                             float *lse)
{
    return gw_remote_decode_budget(r, layer, q, kv, UINT32_MAX, UINT32_MAX, out, lse);
}

ri_status_t gw_remote_reconnect(gw_remote_t *r, const char *addr, uint64_t session_id,
                                const uint8_t secret[CM_WIRE_SECRET_SIZE], const kn_kv_view_t *kv)
{
    uint32_t *zero;
    ri_status_t st;

    if (r == NULL || addr == NULL || secret == NULL)
        return RI_ERR_INVALID;
    for (uint32_t l = 0; kv != NULL && l < r->n_layers; l++)
        if (!gw_kv_valid(&kv[l]) || kv[l].n_tokens < kn_wave_indexed_end(r->layers[l].wave))
            return RI_ERR_INVALID;
    /* Forget the old connection: pending jobs fail at once once it broke;
     * a still-healthy one is closed in order. */
    if (r->step.active) {
        if (r->step.fetching) {
            gw_io_wait(r->io, &r->step.job);
            gw_dp_fetch_result_free(&r->step.job.res);
        }
        r->step.active = r->step.fetching = false;
    }
    (void)gw_pend_complete(r); /* fails at once on a broken connection */
    gw_mirror_clear(r);
    gw_io_stop(r->io);
    r->io = NULL;
    for (size_t i = 0; i < r->n_old; i++)
        cm_free(r->old_recv[i]);
    r->n_old = 0;
    cm_free(r->recv);
    r->recv = NULL;
    r->recv_len = 0;
    cm_free(r->cache);
    r->cache = NULL;
    r->registered = false;
    if (kv != NULL)
        r->pages_uploaded = 0; /* a re-attach keeps what the kvstore still holds */
    r->err = RI_OK;

    st = gw_remote_open(r, addr, session_id, secret);
    if (st != RI_OK) {
        cm_error("data plane of session %llu: cannot reconnect: %s", (unsigned long long)session_id, ri_status_str(st));
        r->err = st;
        return st;
    }
    if (kv == NULL)
        return RI_OK; /* re-attached: the kvstore holds every cluster already */
    zero = cm_calloc(&gw_remote_tag, r->n_kv, sizeof(uint32_t));
    if (zero == NULL) {
        r->err = RI_ERR_NOMEM;
        return r->err;
    }
    /* Re-fill: the same index, every cluster re-packed from the caller's K/V. */
    for (uint32_t l = 0; l < r->n_layers && st == RI_OK; l++) {
        for (uint32_t h = 0; h < r->n_kv; h++)
            r->layers[l].hd[h].n_remote = 0;
        st = gw_remote_queue_upload(r, l, &kv[l], zero, false);
    }
    cm_free(zero);
    if (st == RI_OK)
        st = gw_io_drain(r->io);
    if (st != RI_OK)
        r->err = st;
    return st;
}

uint64_t gw_remote_clusters(const gw_remote_t *r)
{
    uint64_t n = 0;
    for (uint32_t l = 0; r != NULL && l < r->n_layers; l++)
        for (uint32_t h = 0; h < r->n_kv; h++)
            n += r->layers[l].hd[h].n_remote;
    return n;
}

void gw_remote_stats(gw_remote_t *r, gw_remote_stats_t *st_p)
{
    uint64_t bytes;
    double secs;
    *st_p = r->st;
    st_p->resident_bytes = (uint64_t)r->cache_pages * r->page_bytes * (r->cache != NULL) + r->recv_len;
    for (uint32_t l = 0; l < r->n_layers; l++)
        for (uint32_t h = 0; h < r->n_kv; h++) {
            const kn_index_t *idx = &r->layers[l].idx[h];
            st_p->resident_bytes += (uint64_t)idx->cap_clusters * (idx->head_dim * (sizeof(cm_fp16_t) + sizeof(float)) +
                                                                   2 * sizeof(uint32_t)) +
                                    (uint64_t)idx->cap_tokens * sizeof(uint32_t);
        }
    if (r->io != NULL) {
        gw_io_upload_totals(r->io, &bytes, &secs);
        st_p->upload_s = secs;
    }
}

const kn_index_t *gw_remote_index(const gw_remote_t *r, uint32_t layer, uint32_t kv_head)
{
    if (r == NULL || layer >= r->n_layers || kv_head >= r->n_kv)
        return NULL;
    return kn_wave_index(r->layers[layer].wave, kv_head);
}

size_t gw_remote_indexed_end(const gw_remote_t *r, uint32_t layer)
{
    return layer < r->n_layers ? kn_wave_indexed_end(r->layers[layer].wave) : 0;
}

void gw_remote_budget(const gw_remote_t *r, uint32_t layer, uint32_t *n_r_p, uint32_t *n_e_p)
{
    *n_r_p = *n_e_p = 0;
    if (layer < r->n_layers)
        kn_wave_budget(r->layers[layer].wave, n_r_p, n_e_p);
}

ri_status_t gw_remote_error(gw_remote_t *r)
{
    if (r == NULL)
        return RI_ERR_INVALID;
    if (r->err == RI_OK && r->io != NULL)
        r->err = gw_io_error(r->io);
    return r->err;
}
