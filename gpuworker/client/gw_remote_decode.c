/*
 * A decode step of the remote state (gw_remote_int.h): rank and estimate
 * (kn_wave's first phase), then the retrieved clusters read in place from the
 * kvstore's region, taken from the block cache, or fetched; the exact part
 * and the merge (kn_wave's second phase); late answers estimated.
 */
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#include "common/cm_alloc.h"
#include "common/cm_log.h"
#include "common/cm_status.h"
#include "common/cm_time.h"
#include "gpuworker/client/gw_remote_int.h"
#include "kernels/kn_wave.h"

static CM_ALLOC_TAG(gw_remote_tag, "gw.remote.step");

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
            if (gw_cpg_get(&L->hd[h].cpg, ids[i]) != NULL) {
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
        const kn_wave_params_t *wp = kn_wave_params(job->L->wave);
        float *o_e = NULL, *l_e = NULL;
        uint32_t rr, re;
        s->nr[h] = s->ne[h] = s->nl[h] = 0;
        kn_wave_rank_counts(wp, idx->n_clusters, s->n_r, s->n_e, &rr, &re);
        if (job->estimate) {
            o_e = s->part + h * 3 * r->g * (r->d + 1) + (size_t)r->g * r->d;
            l_e = o_e + (size_t)2 * r->g * r->d + r->g;
            st = kn_wave_rank_estimate(r->ops, job->grp, q, idx, rr, re, ids, &s->nr[h], &s->ne[h], o_e, l_e);
        } else if (idx->n_clusters > 0) {
            st = kn_rank(r->ops, job->grp, q, idx, rr, re, ids, &s->nr[h], &s->ne[h]);
        }
        /* the same per-head cut as in process; an estimate still to come
         * covers the moved clusters, as they join the estimation zone */
        if (st == RI_OK)
            st = kn_wave_adapt(wp, r->ops, job->grp, q, idx, s->n_r, ids, &s->nr[h], &s->ne[h], o_e, l_e);
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
    if (!kn_wave_covers(L->wave, kv->n_tokens))
        return RI_ERR_INVALID;
    if (r->err == RI_OK)
        r->err = gw_io_error(r->io); /* a failed upload: the kvstore and our index disagree */
    if (r->err != RI_OK)
        return r->err;
    st = gw_pend_reap(r, false);
    if (st == RI_OK)
        st = gw_late_reap(r, false);
    if (st == RI_OK)
        st = gw_admit_wait(r); /* this step reads the cache and may reuse the receive buffer */
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
    uint32_t rank_r, rank_e;
    kn_wave_rank_counts(kn_wave_params(L->wave), maxc, s->n_r, s->n_e, &rank_r, &rank_e);
    st = gw_step_reserve(r, (uint32_t)CM_MIN((uint64_t)rank_r + rank_e, (uint64_t)maxc));
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
            uint32_t rid = gw_rid(&L->hd[h], j);
            if (rid == GW_NO_ID)
                return RI_ERR_INTERNAL; /* kn_rank returns non-empty clusters only */
            s->lids[k] = j;
            s->req[k++] = rid;
            worst += (uint64_t)gw_pages(r, idx->sizes[j]) * r->page_bytes;
            if (gw_cpg_get(&L->hd[h].cpg, j) == NULL)
                all_cached = false;
            if (all_direct && gw_direct_pages(r->direct, layer, h, rid, gw_pages(r, idx->sizes[j])) == NULL)
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
        gw_fetch_job_init(&s->job, r, layer, n_heads, s->jheads, s->jcounts, s->jreq);
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

/* Whether the kernel reads a retrieved cluster where it lies, as one run:
 * kernels that read host memory (a host cache, the receive buffer, the
 * mapped region), and pages that make one run of rows: a single page, or
 * one-token pages (`K[1][d]` then `V[1][d]`) that follow one another, one
 * run of stride 2d.  Any other cluster is gathered into the head's
 * execution buffer, so that each cluster is one run either way and the
 * kernel groups its rows as the in-process decode does (bit-identical
 * results: the AVX2 scores sum a group of rows in another order than a
 * row alone). */
static bool gw_cluster_in_place(const gw_remote_t *r, const uint8_t *const *pa, uint32_t tokens)
{
    uint32_t np = gw_pages(r, tokens);
    if (r->mem->device)
        return false;
    if (np <= 1)
        return true;
    if (r->P != 1)
        return false;
    for (uint32_t p = 1; p < np; p++)
        if (pa[p] != pa[0] + (size_t)p * r->page_bytes)
            return false;
    return true;
}

/* A head's retrieved clusters as the kernel's page list, one run each: in
 * place (gw_cluster_in_place) or gathered into the head's execution buffer
 * (in the cache's space, xgather[h] tokens, sized by gw_step_xbuf) through
 * the space's copy, memcpy for memory a host pointer reads. */
static ri_status_t gw_cluster_pages(const gw_remote_t *r, size_t h, kn_page_t *pages, uint64_t *retrieved)
{
    const gw_step_t *s = &r->step;
    const uint32_t d = r->d, P = r->P;
    const size_t row = (size_t)d * sizeof(cm_fp16_t);
    cm_fp16_t *xk = s->xbuf[h], *xv = xk != NULL ? xk + s->xgather[h] * d : NULL;
    ri_status_t st = RI_OK;
    for (uint32_t i = 0; i < s->nr[h] && st == RI_OK; i++) {
        uint32_t e = s->ent0[h] + i, tokens = s->etok[e];
        const uint8_t *const *pa = s->paddr + s->eoff[e];
        *retrieved += tokens;
        if (gw_cluster_in_place(r, pa, tokens)) {
            const cm_fp16_t *k = (const cm_fp16_t *)(const void *)pa[0];
            pages[i] = (kn_page_t){k, k + (size_t)P * d, tokens, P == 1 ? 2 * d : d};
            continue;
        }
        pages[i] = (kn_page_t){xk, xv, tokens, d};
        for (uint32_t p = 0; p < gw_pages(r, tokens) && st == RI_OK; p++) {
            uint32_t nt = CM_MIN(P, tokens - p * P);
            if (r->mem->device) {
                st = r->mem->copy(xk, pa[p], nt * row);
                if (st == RI_OK)
                    st = r->mem->copy(xv, pa[p] + (size_t)P * row, nt * row);
            } else {
                memcpy(xk, pa[p], nt * row);
                memcpy(xv, pa[p] + (size_t)P * row, nt * row);
            }
            xk += (size_t)nt * d;
            xv += (size_t)nt * d;
        }
    }
    return st;
}

/* Exact part (steady zone + retrieved clusters, in kn_wave's order), merge
 * with the estimated part computed before, per KV head. */
static void gw_exact_task(void *arg, size_t begin, size_t end, unsigned worker)
{
    gw_remote_t *r = arg;
    gw_step_t *s = &r->step;
    const gw_layer_t *L = &r->layers[s->layer];
    const kn_kv_view_t *kv = &s->kv;
    const uint32_t g = r->g, d = r->d;
    (void)worker;

    for (size_t h = begin; h < end; h++) {
        const kn_index_t *idx = &L->idx[h];
        uint64_t exact = 0, retrieved = 0;
        float *o_x = s->part + h * 3 * g * (d + 1), *o_e = o_x + (size_t)g * d, *o_l = o_e + (size_t)g * d;
        float *l_x = o_x + (size_t)3 * g * d, *l_e = l_x + g, *l_l = l_e + g;
        const float *op[2] = {o_e, o_l}, *lp[2] = {l_e, l_l};
        kn_page_t *pages;
        ri_status_t st = RI_OK;

        pages = cm_malloc(&gw_remote_tag, (s->nr[h] ? s->nr[h] : 1) * sizeof(kn_page_t));
        if (pages == NULL) {
            gw_step_fail(s, RI_ERR_NOMEM);
            continue;
        }
        st = gw_cluster_pages(r, h, pages, &retrieved);
        if (st != RI_OK) {
            cm_free(pages);
            gw_step_fail(s, st);
            continue;
        }
        /* steady zone + these, merged with the estimated (and late) parts:
         * kn_wave's second phase, as in process */
        st = kn_wave_exact_merge(L->wave, (uint32_t)h, s->q + h * g * d, kv, pages, s->nr[h], o_x, l_x, op, lp,
                                 s->nl[h] > 0 ? 2 : 1, s->out + h * g * d, s->lse ? s->lse + h * g : NULL, &exact);
        cm_free(pages);
        if (st != RI_OK) {
            gw_step_fail(s, st);
            continue;
        }
        atomic_fetch_add(&s->exact, exact);
        atomic_fetch_add(&s->retrieved, retrieved);
        atomic_fetch_add(&s->bytes,
                         exact * 4 * d + (uint64_t)idx->n_clusters * (d + 8) + /* centroids + scale, sizes */
                             (uint64_t)s->ne[h] * (idx->vq ? d + 4 : 4 * d));  /* int8 means + scale, or sums */
    }
}

/* Each head's execution buffer, sized for the K and V rows of the clusters
 * its kernel cannot read in place (gw_cluster_in_place), once the pages
 * are known: none at all when every cluster is one run in host memory. */
static ri_status_t gw_step_xbuf(gw_remote_t *r)
{
    gw_step_t *s = &r->step;
    for (uint32_t h = 0; h < r->n_kv; h++) {
        size_t n = 0;
        for (uint32_t i = 0; i < s->nr[h]; i++) {
            uint32_t e = s->ent0[h] + i;
            if (!gw_cluster_in_place(r, s->paddr + s->eoff[e], s->etok[e]))
                n += s->etok[e];
        }
        s->xgather[h] = n;
        size_t bytes = n * 2 * r->d * sizeof(cm_fp16_t);
        if (bytes > s->xcap[h]) {
            void *x = NULL;
            ri_status_t st = r->mem->alloc(&x, bytes);
            if (st != RI_OK)
                return st;
            r->mem->free(s->xbuf[h]);
            s->xbuf[h] = x;
            s->xcap[h] = bytes;
        }
    }
    return RI_OK;
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
            n_pg += gw_pages(r, L->idx[h].sizes[s->ids[(size_t)h * s->want + i]]);
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
            uint32_t j = s->ids[(size_t)h * s->want + i], tokens = L->idx[h].sizes[j], np = gw_pages(r, tokens);
            s->eoff[e] = pc;
            s->etok[e] = tokens;
            if (s->direct) {
                const uint8_t *base = gw_direct_pages(r->direct, s->layer, h, gw_rid(&L->hd[h], j), np);
                if (base == NULL)
                    return RI_ERR_INTERNAL; /* checked at begin */
                for (uint32_t p = 0; p < np; p++)
                    s->paddr[pc++] = base + (size_t)p * r->page_bytes;
                continue;
            }
            if (s->predicted) {
                const uint32_t *pg = gw_cpg_get(&L->hd[h].cpg, j); /* cached: checked at begin */
                for (uint32_t p = 0; p < np; p++)
                    s->paddr[pc++] = r->cache + (size_t)pg[p] * r->page_bytes;
                continue;
            }
            cm_dp_entry_t en;
            cm_dp_reply_entry(v, e, &en);
            for (uint32_t p = 0; p < np; p++)
                s->paddr[pc++] = (en.flags & CM_DP_F_HIT)
                                     ? r->cache + (size_t)cm_dp_reply_page(v, en.page_index + p) * r->page_bytes
                                     : r->recv + en.recv_offset + (size_t)p * r->page_bytes;
        }
    return gw_step_xbuf(r);
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
            (void)gw_step_admit(r); /* this step's output stands; a failure breaks the object */
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

