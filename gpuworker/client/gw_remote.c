/*
 * Remote RetroInfer state of one sequence (gw_remote.h), its life: creation
 * and connection (with the session's direct region mapped when it can be),
 * the index (one kn_wave per layer whose store uploads what it clusters, in
 * page format), reconnect and re-fill, stats.  A step is gw_remote_decode.c,
 * the block cache and its mirror gw_remote_mirror.c.
 */
#include "gpuworker/client/gw_remote.h"

#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#include "common/cm_alloc.h"
#include "common/cm_log.h"
#include "common/cm_status.h"
#include "common/cm_time.h"
#include "gpuworker/client/gw_dp.h"
#include "gpuworker/client/gw_remote_int.h"

static CM_ALLOC_TAG(gw_remote_tag, "gw.remote");

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
    p->fetch_async = false;
    p->predict = true;
    p->deadline_us = 0;
    p->direct = true;
}

uint32_t gw_remote_page_tokens(const gw_remote_params_t *p)
{
    if (p->page_tokens != 0)
        return p->page_tokens;
    return CM_MAX(p->wave.tokens_per_cluster / 8u, 1u);
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
    cm_free(s->xbuf);
    cm_free(s->xcap);
    cm_free(s->xgather);
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
        params->wave.update_tokens == 0 ||
        params->wave.update_clusters > params->wave.update_tokens || params->cache_frac < 0)
        return RI_ERR_INVALID;
    r = cm_calloc(&gw_remote_tag, 1, sizeof(*r));
    if (r == NULL)
        return RI_ERR_NOMEM;
    r->mem = params->cache_space != NULL ? params->cache_space : kn_mem_host();
    r->ops = params->wave.ops ? params->wave.ops : kn_ops_default();
    r->kvm = kn_mem_of(r->ops);
    if (r->mem->device && r->kvm != r->mem) {
        /* the step's kernels read the cache's pages in place */
        cm_error("block cache: pages in the %s space need kernels that read it (these read %s memory)",
                 r->mem->name, r->kvm->name);
        cm_free(r);
        return RI_ERR_UNSUPPORTED;
    }
    r->shape = *shape;
    r->n_layers = n_layers;
    r->n_kv = shape->n_kv_heads;
    r->g = shape->n_q_heads / shape->n_kv_heads;
    r->d = shape->head_dim;
    r->p = *params;
    if (r->p.deadline_us > 0)
        r->p.fetch_async = true; /* only an asynchronous fetch can be left behind */
    r->P = gw_remote_page_tokens(params);
    r->page_bytes = (size_t)4 * r->P * r->d;
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
    r->step.xbuf = cm_calloc(&gw_remote_tag, r->n_kv, sizeof(cm_fp16_t *));
    r->step.xcap = cm_calloc(&gw_remote_tag, r->n_kv, sizeof(size_t));
    r->step.xgather = cm_calloc(&gw_remote_tag, r->n_kv, sizeof(size_t));
    if (!r->step.xbuf || !r->step.xcap || !r->step.xgather || !r->step.nr || !r->step.ne || !r->step.heads || !r->step.counts ||
        !r->step.ent0 || !r->step.part || !r->step.nl)
        goto err_nomem;
    st = gw_copier_create(r->mem, &r->copier);
    if (st != RI_OK) {
        gw_remote_destroy(r);
        return st;
    }

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
            gw_cpg_clear(&H->cpg);
            cm_free(H->lid);
            cm_free(H->rid);
        }
        cm_free(L->hd);
        kn_wave_destroy(L->wave);
    }
    gw_meta_detach(r->meta); /* after the waves: they read its rows */
    cm_free(r->layers);
    for (size_t i = 0; i < r->n_old; i++)
        cm_free(r->old_recv[i]);
    gw_copier_destroy(r->copier); /* waits: its copies read recv and write cache */
    cm_free(r->old_recv);
    cm_free(r->recv);
    if (r->cache != NULL)
        r->mem->free(r->cache);
    gw_prefix_free(r);
    for (uint32_t h = 0; r->step.xbuf != NULL && h < r->n_kv; h++)
        r->mem->free(r->step.xbuf[h]);
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

/* Write cluster j of head h in page format at dst (pages zero-padded).  k
 * and v are host rows of head h: token t at (t - pos0) * token_stride. */
static void gw_pack_cluster(const gw_remote_t *r, const kn_index_t *idx, const cm_fp16_t *k, const cm_fp16_t *v,
                            size_t token_stride, uint32_t pos0, uint32_t j, uint8_t *dst)
{
    const uint32_t P = r->P, d = r->d, n = idx->sizes[j];
    const uint32_t *perm = idx->perm + idx->offsets[j];
    size_t row = (size_t)d * sizeof(cm_fp16_t);
    uint32_t np = gw_pages(r, n);

    memset(dst, 0, (size_t)np * r->page_bytes);
    for (uint32_t i = 0; i < n; i++) {
        uint8_t *page = dst + (size_t)(i / P) * r->page_bytes;
        size_t src = (size_t)(perm[i] - pos0) * token_stride;
        memcpy(page + (size_t)(i % P) * row, k + src, row);
        memcpy(page + (size_t)(P + i % P) * row, v + src, row);
    }
}

/* The rows of head h of kv that clusters [first, n_clusters) of idx hold,
 * readable on the host: kv's own when it is host memory; else the span of
 * positions they cover copied down through the kernels' space (one copy
 * per K and V, into *k_p / *v_p, owned by the caller: cm_free; a copy per
 * row would be a round trip per row).  *pos0_p the span's first position. */
static ri_status_t gw_head_rows(const gw_remote_t *r, const kn_index_t *idx, uint32_t h, const kn_kv_view_t *kv,
                                uint32_t first, const cm_fp16_t **k_p, const cm_fp16_t **v_p, uint32_t *pos0_p,
                                cm_fp16_t **owned_p)
{
    size_t hs = (size_t)h * kv->head_stride;
    *owned_p = NULL;
    *pos0_p = 0;
    *k_p = kv->k + hs;
    *v_p = kv->v + hs;
    if (!r->kvm->device || first >= idx->n_clusters)
        return RI_OK;
    uint32_t lo = UINT32_MAX, hi = 0;
    for (uint32_t i = idx->offsets[first]; i < idx->offsets[idx->n_clusters]; i++) {
        lo = CM_MIN(lo, idx->perm[i]);
        hi = CM_MAX(hi, idx->perm[i]);
    }
    if (lo > hi)
        return RI_OK; /* empty clusters only */
    size_t elems = (size_t)(hi - lo) * kv->token_stride + r->d;
    cm_fp16_t *buf = cm_malloc(&gw_remote_tag, 2 * elems * sizeof(cm_fp16_t));
    if (buf == NULL)
        return RI_ERR_NOMEM;
    size_t at = hs + (size_t)lo * kv->token_stride;
    ri_status_t st = r->kvm->copy(buf, kv->k + at, elems * sizeof(cm_fp16_t));
    if (st == RI_OK)
        st = r->kvm->copy(buf + elems, kv->v + at, elems * sizeof(cm_fp16_t));
    if (st != RI_OK) {
        cm_free(buf);
        return st;
    }
    *owned_p = buf;
    *k_p = buf;
    *v_p = buf + elems;
    *pos0_p = lo;
    return RI_OK;
}

ri_status_t gw_head_reserve(gw_head_t *H, uint32_t want)
{
    if (want <= H->rcap)
        return RI_OK;
    if (want > H->base) {
        size_t n = (size_t)(want - H->base) * sizeof(uint32_t);
        uint32_t *nr = cm_realloc(&gw_remote_tag, H->rid, n);
        if (nr == NULL)
            return RI_ERR_NOMEM;
        H->rid = nr;
        nr = cm_realloc(&gw_remote_tag, H->lid, n);
        if (nr == NULL)
            return RI_ERR_NOMEM;
        H->lid = nr;
    }
    H->rcap = want; /* the cache pages are kept for cached clusters only (gw_cpg.h) */
    return RI_OK;
}

ri_status_t gw_head_unbase(gw_head_t *H)
{
    uint32_t n = H->rcap, b = H->base;
    uint32_t *rid, *lid;

    if (b == 0)
        return RI_OK;
    rid = cm_malloc(&gw_remote_tag, (size_t)(n > 0 ? n : 1) * sizeof(uint32_t));
    lid = cm_malloc(&gw_remote_tag, (size_t)(n > 0 ? n : 1) * sizeof(uint32_t));
    if (rid == NULL || lid == NULL) {
        cm_free(rid);
        cm_free(lid);
        return RI_ERR_NOMEM;
    }
    for (uint32_t j = 0; j < n; j++) {
        rid[j] = gw_rid(H, j);
        lid[j] = gw_lid(H, j);
    }
    cm_free(H->rid);
    cm_free(H->lid);
    H->rid = rid;
    H->lid = lid;
    H->base = 0;
    return RI_OK;
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
        /* local ids up to n_clusters, kvstore ids up to n_remote + the new ones */
        uint32_t want = CM_MAX(idx->n_clusters, L->hd[h].n_remote + (idx->n_clusters - first[h]));
        if (gw_head_reserve(&L->hd[h], want) != RI_OK)
            return RI_ERR_NOMEM;
        for (uint32_t j = first[h]; j < idx->n_clusters; j++) {
            if (idx->sizes[j] == 0)
                continue;
            total_clusters++;
            total_pages += gw_pages(r, idx->sizes[j]);
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
    up->page_tokens = r->P;
    up->page_bytes = r->page_bytes;
    up->pages = cm_malloc(&gw_remote_tag, up->bytes);
    up->locate = r->direct != NULL;
    if (up->locate)
        gw_direct_mapping(r->direct, &up->map_base, &up->map_bytes);
    if (up->locate)
        up->offs = cm_malloc(&gw_remote_tag, total_clusters * sizeof(uint64_t));
    if (!up->heads || !up->counts || !up->expect_first || !up->tokens || !up->pages || (up->locate && !up->offs)) {
        gw_io_job_free(up);
        return RI_ERR_NOMEM;
    }
    dst = up->pages;
    for (uint32_t h = 0; h < r->n_kv && st == RI_OK; h++) {
        const kn_index_t *idx = &L->idx[h];
        const cm_fp16_t *hk, *hv;
        cm_fp16_t *rows;
        uint32_t pos0;
        if ((st = gw_head_rows(r, idx, h, kv, first[h], &hk, &hv, &pos0, &rows)) != RI_OK)
            break;
        up->heads[h] = h;
        up->expect_first[h] = L->hd[h].n_remote;
        for (uint32_t j = first[h]; j < idx->n_clusters; j++) {
            if (idx->sizes[j] == 0) {
                gw_ids_set(&L->hd[h], j, GW_NO_ID);
                continue;
            }
            gw_ids_set(&L->hd[h], j, L->hd[h].n_remote++);
            up->counts[h]++;
            up->tokens[k++] = idx->sizes[j];
            gw_pack_cluster(r, idx, hk, hv, kv->token_stride, pos0, j, dst);
            dst += (size_t)gw_pages(r, idx->sizes[j]) * r->page_bytes;
            L->hd[h].max_pages = CM_MAX(L->hd[h].max_pages, gw_pages(r, idx->sizes[j]));
        }
        cm_free(rows);
    }
    if (st != RI_OK) {
        /* the ids given above name clusters never sent: the kvstore and the
         * index disagree from here on */
        gw_io_job_free(up);
        return st;
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
    if (!L->adopted) {
        L->adopted = true; /* the build's call: it may have imported attached blocks */
        st = gw_prefix_adopt(L->r, L, first);
        if (st != RI_OK)
            return st;
    }
    st = gw_remote_queue_upload(L->r, L->layer, kv, first, L->appendable);
    if (st == RI_OK)
        for (uint32_t h = 0; h < L->r->n_kv; h++)
            L->appendable = L->appendable || L->hd[h].n_remote != 0;
    return st;
}

/* kn_wave's build or update of layer (its store uploads); times it and
 * makes a failure sticky: the index and the kvstore may disagree after it. */
static ri_status_t gw_remote_index_step(gw_remote_t *r, uint32_t layer, const kn_kv_view_t *kv, bool build,
                                        bool *updated_p)
{
    double t0 = cm_time_s();
    ri_status_t st = build ? kn_wave_build_pieces(r->layers[layer].wave, kv, gw_prefix_pieces(r, layer))
                           : kn_wave_update(r->layers[layer].wave, kv, updated_p);
    r->st.build_s += cm_time_s() - t0;
    if (build && st == RI_OK && r->layers[layer].idx[0].n_clusters != 0)
        gw_prefix_built(r, layer);
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
    if (!kn_wave_covers(r->layers[layer].wave, kv->n_tokens))
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

ri_status_t gw_remote_reconnect(gw_remote_t *r, const char *addr, uint64_t session_id,
                                const uint8_t secret[CM_WIRE_SECRET_SIZE], const kn_kv_view_t *kv)
{
    uint32_t *zero;
    ri_status_t st;

    if (r == NULL || addr == NULL || secret == NULL)
        return RI_ERR_INVALID;
    for (uint32_t l = 0; kv != NULL && l < r->n_layers; l++)
        if (!gw_kv_valid(&kv[l]) || !kn_wave_covers(r->layers[l].wave, kv[l].n_tokens))
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
    (void)gw_admit_wait(r);    /* its copies read recv and write cache */
    gw_mirror_clear(r);
    if (gw_copier_error(r->copier) != RI_OK) {
        /* a broken copier stays broken: the new connection gets a new one */
        gw_copier_t *c = NULL;
        st = gw_copier_create(r->mem, &c);
        if (st != RI_OK)
            return st;
        gw_copier_destroy(r->copier);
        r->copier = c;
        r->admit_t = GW_TICKET_NONE;
    }
    gw_io_stop(r->io);
    r->io = NULL;
    for (size_t i = 0; i < r->n_old; i++)
        cm_free(r->old_recv[i]);
    r->n_old = 0;
    cm_free(r->recv);
    r->recv = NULL;
    r->recv_len = 0;
    if (r->cache != NULL)
        r->mem->free(r->cache);
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
        for (uint32_t h = 0; h < r->n_kv && st == RI_OK; h++) {
            r->layers[l].hd[h].n_remote = r->layers[l].hd[h].n_attached = 0; /* a new session: ours alone */
            st = gw_head_unbase(&r->layers[l].hd[h]); /* ids from 0, not the attached ones */
        }
        if (st == RI_OK)
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
        for (uint32_t h = 0; h < r->n_kv; h++)
            st_p->resident_bytes += kn_index_resident_bytes(&r->layers[l].idx[h]);
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

const kn_wave_params_t *gw_remote_wave_params(const gw_remote_t *r, uint32_t layer)
{
    return layer < r->n_layers ? kn_wave_params(r->layers[layer].wave) : NULL;
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
