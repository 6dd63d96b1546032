/*
 * The two-sided path's worker half (gw_remote_int.h): the block cache and
 * receive buffer, the mirror of the kvstore's cache directory, predicted
 * steps' fetches and late answers, each answer checked against its request.
 */
#include <math.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#include "common/cm_alloc.h"
#include "common/cm_log.h"
#include "common/cm_status.h"
#include "common/cm_time.h"
#include "gpuworker/client/gw_remote_int.h"

static CM_ALLOC_TAG(gw_remote_tag, "gw.remote.cache");

/* ---- the wave buffer: block cache and receive buffer ---- */

/* ---- the mirror of the kvstore's cache directory ----
 * Only this connection's fetches change the directory of its cache, in the
 * order we send them, so the worker can know exactly which clusters are
 * cached where: admissions add, evictions remove, hits never change it.
 * When every cluster a step retrieves is in the mirror, the step computes at
 * once from the cache and the fetch (still sent, for the LRU's recency) is
 * checked later: the round trip leaves the critical path. */

void gw_mirror_clear(gw_remote_t *r)
{
    for (uint32_t l = 0; l < r->n_layers; l++) {
        gw_layer_t *L = &r->layers[l];
        for (uint32_t h = 0; h < r->n_kv; h++)
            gw_cpg_clear(&L->hd[h].cpg);
    }
}

/* Record what a (checked) reply did to the directory. */
ri_status_t gw_mirror_apply(gw_remote_t *r, uint32_t layer, const cm_dp_fetch_reply_view_t *v,
                                   const uint32_t *lids)
{
    for (uint32_t i = 0; i < v->n_evicted; i++) {
        cm_dp_evict_t ev;
        cm_dp_reply_evicted(v, i, &ev);
        if (ev.layer >= r->n_layers || ev.head >= r->n_kv || ev.cluster >= r->layers[ev.layer].hd[ev.head].n_remote)
            return RI_ERR_PROTOCOL;
        gw_layer_t *E = &r->layers[ev.layer];
        uint32_t j = gw_lid(&E->hd[ev.head], ev.cluster);
        gw_cpg_del(&E->hd[ev.head].cpg, j);
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
            if ((en.flags & CM_DP_F_HIT) && gw_cpg_get(&L->hd[h].cpg, j) == NULL)
                cm_warn("data plane: a hit the worker did not know of (layer %u head %u cluster %u)", layer, h,
                        en.cluster);
            uint32_t *pg = gw_cpg_put(&L->hd[h].cpg, j, en.n_pages);
            if (pg == NULL)
                return RI_ERR_NOMEM;
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
            if (!(en.flags & CM_DP_F_HIT) || en.cluster != pd->ids[e] || en.n_pages != gw_pages(r, en.tokens) ||
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
ri_status_t gw_pend_reap(gw_remote_t *r, bool block)
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

ri_status_t gw_pend_complete(gw_remote_t *r)
{
    ri_status_t st = gw_pend_reap(r, true);
    ri_status_t st2 = gw_late_reap(r, true);
    return st != RI_OK ? st : st2;
}

/* Queue the LRU-refreshing fetch of a predicted step (req/lids: k clusters). */
ri_status_t gw_pend_submit(gw_remote_t *r, uint32_t layer, uint32_t n_heads, uint64_t k)
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
        np += gw_pages(r, L->idx[s->heads[h]].sizes[s->lids[e]]);
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
        uint32_t hh = s->heads[h], j = s->lids[e], n = gw_pages(r, L->idx[hh].sizes[j]);
        memcpy(pd->pages + np, gw_cpg_get(&L->hd[hh].cpg, j), n * sizeof(uint32_t));
        np += n;
        i++;
    }
    pd->layer = layer;
    gw_fetch_job_init(&pd->job, r, layer, n_heads, pd->heads, pd->counts, pd->ids);
    gw_io_submit(r->io, &pd->job);
    r->pend_n++;
    r->st.hits += k; /* checked when the answer is in (a mismatch breaks the object) */
    return RI_OK;
}

/* Register (or re-register, emptying the cache) so that the receive buffer
 * holds at least need bytes. */
ri_status_t gw_remote_register(gw_remote_t *r, size_t need)
{
    gw_io_job_t job = {.kind = GW_IO_REGISTER};
    size_t bound = 0, len;
    uint8_t *recv;
    ri_status_t st;

    st = gw_pend_complete(r); /* they name the old cache */
    if (st == RI_OK)
        st = gw_admit_wait(r); /* copies still read the receive buffer */
    if (st != RI_OK)
        return st;
    gw_mirror_clear(r);
    if (!r->registered) {
        uint64_t cap = r->p.cache_pages;
        if (cap == 0)
            cap = (uint64_t)ceil((double)r->p.cache_frac * (double)r->pages_uploaded);
        cap = CM_MAX(cap, (uint64_t)CM_MAX(r->p.min_cache_pages, 1u));
        cap = CM_MIN(cap, (uint64_t)1 << 26);
        void *cache = NULL;
        st = r->mem->alloc(&cache, (size_t)cap * r->page_bytes);
        if (st != RI_OK)
            return st;
        r->cache = cache;
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
        uint32_t nr, ne, rr, re;
        kn_wave_budget(r->layers[l].wave, &nr, &ne);
        for (uint32_t h = 0; h < r->n_kv; h++) {
            /* ranked candidates: the per-head cut may keep all of them */
            kn_wave_rank_counts(kn_wave_params(r->layers[l].wave), r->layers[l].idx[h].n_clusters, nr, ne, &rr, &re);
            b += (size_t)rr * r->layers[l].hd[h].max_pages * r->page_bytes;
        }
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
                 (unsigned long long)job.out_page_bytes, r->page_bytes, r->P, r->d);
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

/* Check the answer to step.job against what it asked (the fetch's own
 * copies of heads, counts and ids): entry order, sizes, page bounds; count
 * hits and misses. */
ri_status_t gw_fetch_check(gw_remote_t *r, uint32_t layer)
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
            if (en.cluster != s->jreq[e] || en.tokens != L->idx[h].sizes[j] || en.n_pages != gw_pages(r, en.tokens))
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


/* Apply the late fetch once it is in (with block: wait for it): its
 * evictions and admissions go into the mirror and its admitted misses into
 * the cache.  Between two steps only, so no step reads a page meanwhile. */
ri_status_t gw_late_reap(gw_remote_t *r, bool block)
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
        st = gw_step_admit(r);
    else
        cm_error("data plane: the late fetch of layer %u failed: %s", r->late_layer, ri_status_str(st));
    gw_dp_fetch_result_free(&s->job.res);
    r->late = false;
    if (st != RI_OK && r->err == RI_OK)
        r->err = st;
    return st;
}

/* A copy into the cache failed (or could not be queued): the mirror names
 * pages whose bytes may not have landed, so it is forgotten, and the object
 * is broken (the kvstore's directory names them too). */
static ri_status_t gw_admit_fail(gw_remote_t *r, ri_status_t st)
{
    cm_error("block cache: copy of admitted misses into the %s space failed: %s", r->mem->name, ri_status_str(st));
    gw_mirror_clear(r);
    if (r->err == RI_OK)
        r->err = st;
    return st;
}

/* Queue a copy of every admitted miss from the receive buffer into its
 * cache pages; runs of consecutive pages go as one copy. */
ri_status_t gw_step_admit(gw_remote_t *r)
{
    const cm_dp_fetch_reply_view_t *v = &r->step.job.res.view;
    ri_status_t st;
    for (uint32_t e = 0; e < v->n_entries; e++) {
        cm_dp_entry_t en;
        cm_dp_reply_entry(v, e, &en);
        if (!(en.flags & CM_DP_F_ADMITTED))
            continue;
        for (uint32_t p = 0, run; p < en.n_pages; p += run) {
            uint32_t first = cm_dp_reply_page(v, en.page_index + p);
            for (run = 1; p + run < en.n_pages && cm_dp_reply_page(v, en.page_index + p + run) == first + run; run++)
                ;
            gw_ticket_t t;
            st = gw_copier_submit(r->copier, r->cache + (size_t)first * r->page_bytes,
                                  r->recv + en.recv_offset + (size_t)p * r->page_bytes, (size_t)run * r->page_bytes,
                                  &t);
            if (st != RI_OK)
                return gw_admit_fail(r, st);
            r->admit_t = t;
        }
        r->st.admitted++;
    }
    r->st.evicted += v->n_evicted;
    r->st.fetched_bytes += v->miss_bytes;
    return RI_OK;
}

ri_status_t gw_admit_wait(gw_remote_t *r)
{
    if (r->copier == NULL || r->admit_t == GW_TICKET_NONE)
        return RI_OK;
    ri_status_t st = gw_copier_wait(r->copier, r->admit_t, GW_NO_DEADLINE);
    if (st != RI_OK)
        return gw_admit_fail(r, st);
    r->admit_t = GW_TICKET_NONE;
    return RI_OK;
}

