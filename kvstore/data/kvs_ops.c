/*
 * Data-plane op handlers: UPLOAD_CLUSTERS, APPEND_CLUSTERS, REGISTER_CACHE,
 * FETCH_RANKED, RELEASE, PING (layouts in common/cm_dp_proto.h).  Each
 * handler validates everything (session secret in constant time, ids and
 * counts against the session geometry, lengths against the bytes present)
 * before it changes anything, so a bad request changes nothing.
 * Workload: per decode step and layer one FETCH_RANKED of ~1-2% of the
 * clusters of every KV head; uploads at prefill and every 1024 tokens.
 */
#include "kvstore/data/kvs_internal.h"

#include <string.h>

#include "common/cm_alloc.h"
#include "common/cm_crc32c.h"
#include "common/cm_dp_proto.h"
#include "common/cm_log.h"
#include "common/cm_status.h"
#include "common/cm_time.h"

static CM_ALLOC_TAG(kvs_ops_tag, "kvs.ops");

/* Find the session and check its secret; takes a reference. */
static ri_status_t kvs_ops_auth_locked(kvs_data_t *data, const cm_wire_hdr_t *hdr, kvs_session_t **s_p)
{
    kvs_session_t *s = kvs_session_find_locked(data, hdr->session_id);

    /* An unknown id and a wrong secret answer alike: ids are not secrets,
     * but this way a caller learns nothing without the secret. */
    if (s == NULL || !cm_wire_secret_equal(s->secret, hdr->secret))
        return RI_ERR_UNAUTHENTICATED;
    s->refs++;
    *s_p = s;
    return RI_OK;
}

/* Is the header's session known and its secret right?  Checked before a
 * large body is received (RI_ERR_UNAUTHENTICATED otherwise). */
static ri_status_t kvs_ops_precheck(void *arg, const cm_wire_hdr_t *hdr)
{
    kvs_data_t *data = arg;
    kvs_session_t *s = NULL;
    if (hdr->op == CM_WIRE_OP_PING && hdr->session_id == 0)
        return RI_OK;
    pthread_mutex_lock(&data->lock);
    ri_status_t st = kvs_ops_auth_locked(data, hdr, &s);
    if (st == RI_OK)
        kvs_session_unref_locked(data, s);
    pthread_mutex_unlock(&data->lock);
    return st;
}

kvs_cluster_t kvs_table_get(const kvs_table_t *t, uint32_t id)
{
    if (id >= t->n_att)
        return t->c[id - t->n_att];
    uint32_t lo = 0, hi = t->n_runs; /* the run with first <= id, the last such */
    while (hi - lo > 1) {
        uint32_t mid = lo + (hi - lo) / 2;
        if (t->runs[mid].first <= id)
            lo = mid;
        else
            hi = mid;
    }
    const kvs_arun_t *r = &t->runs[lo];
    const kvs_bdesc_t *d = &r->d[id - r->first];
    return (kvs_cluster_t){.off = d->off, .tokens = d->tokens, .tier = KVS_TIER_BLOCK, .no_crc = true,
                           .block = r->slot};
}

kvs_cluster_t *kvs_table_own(kvs_table_t *t, uint32_t id)
{
    return id >= t->n_att && id < t->n ? &t->c[id - t->n_att] : NULL;
}

ri_status_t kvs_table_reserve(kvs_table_t *t, uint64_t more)
{
    uint64_t want = (uint64_t)(t->n - t->n_att) + more;
    uint32_t cap;
    kvs_cluster_t *nc;

    if (want <= t->cap)
        return RI_OK;
    if (want > CM_DP_MAX_IDS)
        return RI_ERR_RANGE;
    cap = t->cap ? t->cap : 16;
    while (cap < want)
        cap *= 2;
    nc = cm_realloc(&kvs_ops_tag, t->c, (size_t)cap * sizeof(*nc));
    if (nc == NULL)
        return RI_ERR_NOMEM;
    t->c = nc;
    t->cap = cap;
    return RI_OK;
}

/* What an upload's meta decided, validated against the session before the
 * lock is taken. */
typedef struct kvs_upload {
    cm_dp_clusters_view_t v;
    uint64_t head_bytes[CM_DP_MAX_HEADS];  /* bytes of each listed head's clusters */
    uint64_t head_off[CM_DP_MAX_HEADS];    /* where they go (pool or region offset) */
    bool in_region[CM_DP_MAX_HEADS];       /* the head goes to the session's direct region */
    uint64_t total;                        /* data_len */
    const uint8_t *src;                    /* the data block */
    uint8_t *reply;                        /* reply meta (owned) */
} kvs_upload_t;

/* Decode and check the meta: heads and tokens in range, no head twice, the
 * pages adding up to data_len exactly.  Lock not held. */
static ri_status_t kvs_upload_decode(const kvs_session_t *s, const cm_wire_hdr_t *hdr, const uint8_t *body,
                                     kvs_upload_t *u)
{
    bool seen[CM_DP_MAX_HEADS] = {false};
    uint64_t k = 0;
    ri_status_t st = cm_dp_clusters_decode(body, hdr->meta_len, &u->v);

    if (st != RI_OK)
        return st;
    if (u->v.layer >= s->geo.layers || u->v.n_heads > s->geo.kv_heads)
        return RI_ERR_RANGE;
    for (uint32_t i = 0; i < u->v.n_heads; i++) {
        uint32_t head = cm_dp_clusters_head(&u->v, i), n = cm_dp_clusters_count(&u->v, i);
        if (head >= s->geo.kv_heads)
            return RI_ERR_RANGE;
        if (seen[head])
            return RI_ERR_INVALID;
        seen[head] = true;
        u->head_bytes[i] = 0;
        for (uint32_t j = 0; j < n; j++, k++) {
            uint32_t tok = cm_dp_clusters_tokens(&u->v, k);
            if (tok == 0 || tok > CM_DP_MAX_CLUSTER_TOKENS)
                return RI_ERR_RANGE;
            u->head_bytes[i] += kvs_cluster_pages(s, tok) * s->page_bytes;
            if (u->head_bytes[i] > hdr->data_len)
                return RI_ERR_PROTOCOL; /* also keeps the sums from overflowing */
        }
        u->total += u->head_bytes[i];
        if (u->total > hdr->data_len)
            return RI_ERR_PROTOCOL;
    }
    if (u->total != hdr->data_len)
        return RI_ERR_PROTOCOL;
    u->src = body + hdr->meta_len;
    return RI_OK;
}

/* Room in the tables (and for the extents) before anything is placed, so
 * that publishing cannot fail.  An UPLOAD (not an append) needs empty tables. */
static ri_status_t kvs_upload_reserve_locked(kvs_session_t *s, const kvs_upload_t *u, bool append)
{
    for (uint32_t i = 0; i < u->v.n_heads; i++) {
        kvs_table_t *t = &s->tables[(uint64_t)u->v.layer * s->geo.kv_heads + cm_dp_clusters_head(&u->v, i)];
        ri_status_t st;
        if (!append && t->n != 0)
            return RI_ERR_EXISTS;
        st = kvs_table_reserve(t, cm_dp_clusters_count(&u->v, i));
        if (st != RI_OK)
            return st;
    }
    return kvs_session_reserve_extents_locked(s, u->v.n_heads);
}

/* Upload with the spill tier on: one pool extent per cluster, owned by its
 * table entry (so that spilling it frees its pages), then publish and track
 * coldness.  Validation is done; lock held; tables reserved. */
static ri_status_t kvs_upload_tiered_locked(kvs_data_t *data, kvs_session_t *s, const kvs_upload_t *u)
{
    const cm_dp_clusters_view_t *v = &u->v;
    const uint8_t *src = u->src;
    uint64_t n = 0, k = 0, *sizes, *offs;
    ri_status_t st;

    for (uint32_t i = 0; i < v->n_heads; i++)
        n += cm_dp_clusters_count(v, i);
    sizes = cm_malloc(&kvs_ops_tag, (n ? n : 1) * sizeof(uint64_t));
    offs = cm_malloc(&kvs_ops_tag, (n ? n : 1) * sizeof(uint64_t));
    if (sizes == NULL || offs == NULL) {
        st = RI_ERR_NOMEM;
        goto out;
    }
    for (uint64_t j = 0; j < n; j++)
        sizes[j] = kvs_cluster_pages(s, cm_dp_clusters_tokens(v, j)) * s->page_bytes;
    st = kvs_tier_alloc_clusters_locked(data, s, sizes, n, offs);
    if (st != RI_OK)
        goto out;
    for (uint32_t i = 0; i < v->n_heads; i++) {
        uint32_t head = cm_dp_clusters_head(v, i), cnt = cm_dp_clusters_count(v, i);
        kvs_table_t *t = &s->tables[(uint64_t)v->layer * s->geo.kv_heads + head];
        cm_dp_put32(u->reply + 8 + 8u * i, head);
        cm_dp_put32(u->reply + 12 + 8u * i, t->n);
        for (uint32_t j = 0; j < cnt; j++, k++) {
            memcpy(kvs_pool_base(data->pool) + offs[k], src, sizes[k]);
            t->c[t->n - t->n_att] = (kvs_cluster_t){.off = offs[k], .tokens = cm_dp_clusters_tokens(v, k),
                                                    .tier = KVS_TIER_POOL, .crc = cm_crc32c(0, src, sizes[k])};
            t->n++;
            kvs_tier_touch_locked(data, s, v->layer, head, t->n - 1);
            src += sizes[k];
        }
        s->clusters += cnt;
    }
out:
    cm_free(sizes);
    cm_free(offs);
    return st;
}

/* Without a spill tier (or when the upload fits the direct region whole):
 * heads that fit go to the session's direct region (charged when it was
 * made), the rest to one pool extent per head, charged now.  All or
 * nothing.  Lock held. */
static ri_status_t kvs_upload_place_locked(kvs_data_t *data, kvs_session_t *s, kvs_upload_t *u)
{
    uint64_t region_used0 = s->region != NULL ? s->region->used : 0, charge = 0;
    uint32_t n_alloc;
    ri_status_t st;

    for (uint32_t i = 0; i < u->v.n_heads; i++) {
        u->in_region[i] = u->head_bytes[i] != 0 && kvs_direct_take_locked(s, u->head_bytes[i], &u->head_off[i]);
        if (!u->in_region[i] && u->head_bytes[i] != 0)
            charge += kvs_pool_round(u->head_bytes[i]);
    }
    st = kvs_session_charge_locked(data, s, charge);
    if (st != RI_OK)
        goto err_region;
    for (n_alloc = 0; n_alloc < u->v.n_heads; n_alloc++) {
        if (u->head_bytes[n_alloc] == 0 || u->in_region[n_alloc])
            continue;
        st = kvs_pool_alloc(data->pool, u->head_bytes[n_alloc], &u->head_off[n_alloc]);
        /* Unreferenced prefix blocks go before a live session's data. */
        if (st == RI_ERR_NOSPACE && kvs_prefix_reclaim_locked(data, kvs_pool_round(u->head_bytes[n_alloc])) > 0)
            st = kvs_pool_alloc(data->pool, u->head_bytes[n_alloc], &u->head_off[n_alloc]);
        if (st != RI_OK)
            goto err_free_extents;
    }
    return RI_OK;

err_free_extents:
    for (uint32_t i = 0; i < n_alloc; i++)
        if (u->head_bytes[i] != 0 && !u->in_region[i])
            kvs_pool_free(data->pool, u->head_off[i], u->head_bytes[i]);
    kvs_session_uncharge_locked(data, s, charge);
err_region:
    if (s->region != NULL)
        s->region->used = region_used0;
    return st;
}

/* Copy the clusters placed by kvs_upload_place_locked and publish them in
 * the tables (nothing here fails).  Lock held. */
static void kvs_upload_publish_locked(kvs_data_t *data, kvs_session_t *s, kvs_upload_t *u)
{
    const uint8_t *src = u->src;
    uint64_t k = 0;

    for (uint32_t i = 0; i < u->v.n_heads; i++) {
        uint32_t head = cm_dp_clusters_head(&u->v, i), n = cm_dp_clusters_count(&u->v, i);
        kvs_table_t *t = &s->tables[(uint64_t)u->v.layer * s->geo.kv_heads + head];
        uint64_t off = u->head_off[i];
        cm_dp_put32(u->reply + 8 + 8u * i, head);
        cm_dp_put32(u->reply + 12 + 8u * i, t->n);
        if (u->head_bytes[i] == 0)
            continue;
        if (u->in_region[i]) {
            memcpy(s->region->base + off, src, u->head_bytes[i]);
        } else {
            kvs_session_add_extent_locked(s, off, u->head_bytes[i]);
            memcpy(kvs_pool_base(data->pool) + off, src, u->head_bytes[i]);
        }
        for (uint32_t j = 0; j < n; j++, k++) {
            uint32_t tok = cm_dp_clusters_tokens(&u->v, k);
            uint64_t bytes = kvs_cluster_pages(s, tok) * s->page_bytes;
            t->c[t->n - t->n_att] = (kvs_cluster_t){.off = off, .tokens = tok, .tier = KVS_TIER_POOL,
                                                    .direct = u->in_region[i], .crc = cm_crc32c(0, src, bytes)};
            t->n++;
            off += bytes;
            src += bytes;
        }
        s->clusters += n;
    }
}

/* UPLOAD_CLUSTERS / APPEND_CLUSTERS: decode, then under the lock reserve,
 * place (spill tier: one extent per cluster; else region or one extent per
 * head) and publish.  The reply lists each head's first new cluster id. */
static ri_status_t kvs_ops_upload(kvs_data_t *data, kvs_session_t *s, const cm_wire_hdr_t *hdr, const uint8_t *body,
                                  bool append, uint8_t **reply_p, size_t *reply_len_p)
{
    kvs_upload_t u = {0};
    ri_status_t st = kvs_upload_decode(s, hdr, body, &u);

    if (st != RI_OK)
        return st;
    u.reply = cm_malloc(&kvs_ops_tag, 8u + 8u * u.v.n_heads);
    if (u.reply == NULL)
        return RI_ERR_NOMEM;
    pthread_mutex_lock(&data->lock);
    st = kvs_upload_reserve_locked(s, &u, append);
    /* With a spill tier, an upload that fits the session's direct region
     * whole goes there (pinned); otherwise one extent per cluster, so that
     * each can spill. */
    if (st == RI_OK && kvs_tier_on(data) && !(s->region != NULL && u.total <= s->region->bytes - s->region->used)) {
        st = kvs_upload_tiered_locked(data, s, &u);
        if (st == RI_OK)
            kvs_tier_relieve_locked(data);
    } else if (st == RI_OK) {
        st = kvs_upload_place_locked(data, s, &u);
        if (st == RI_OK)
            kvs_upload_publish_locked(data, s, &u);
    }
    if (st == RI_OK)
        data->bytes_received += hdr->data_len;
    pthread_mutex_unlock(&data->lock);
    if (st != RI_OK) {
        cm_free(u.reply);
        return st;
    }
    cm_dp_put32(u.reply, u.v.n_heads);
    cm_dp_put32(u.reply + 4, 0);
    *reply_p = u.reply;
    *reply_len_p = 8u + 8u * u.v.n_heads;
    return RI_OK;
}

static kvs_wcache_t *kvs_ops_cache_find(kvs_session_t *s, uint32_t id, const void *conn)
{
    for (uint32_t i = 0; i < KVS_MAX_CACHES_PER_SESSION; i++)
        if (s->caches[i] != NULL && s->caches[i]->id == id && s->caches[i]->conn == conn)
            return s->caches[i];
    return NULL;
}

static ri_status_t kvs_ops_register(kvs_data_t *data, const void *conn, kvs_session_t *s, const cm_wire_hdr_t *hdr,
                                    const uint8_t *body, uint8_t **reply_p, size_t *reply_len_p)
{
    cm_dp_register_t r;
    kvs_wcache_t *wc;
    uint32_t slot;
    uint8_t *reply;
    ri_status_t st;

    if (hdr->data_len != 0)
        return RI_ERR_PROTOCOL;
    st = cm_dp_register_decode(body, hdr->meta_len, &r);
    if (st != RI_OK)
        return st;
    if (r.capacity_pages > (1u << 26) || r.recv_len == 0)
        return RI_ERR_RANGE;
    /* Misses are never put into a worker's buffer: that needs RMA in our UCX
     * context, and with it UCX would also serve any peer's one-sided reads
     * over TCP from any address (cm_ucx.h).  Inline delivery only; same-host
     * workers read their region directly instead. */
    if (r.rkey_len > 0)
        return RI_ERR_UNSUPPORTED;
    wc = cm_calloc(&kvs_ops_tag, 1, sizeof(*wc));
    reply = cm_malloc(&kvs_ops_tag, 16);
    if (wc == NULL || reply == NULL) {
        st = RI_ERR_NOMEM;
        goto err_free;
    }
    /* The directory is daemon memory the worker asks for: charged to its
     * tenant before it is allocated, so a huge capacity is refused (QUOTA)
     * instead of taking gigabytes and seconds of the data thread. */
    uint64_t dir_bytes = kvs_cache_bytes_for(r.capacity_pages);
    pthread_mutex_lock(&data->lock);
    wc->owner = s;
    st = kvs_session_charge_meta_locked(data, s, dir_bytes);
    if (st == RI_OK)
        wc->charged = dir_bytes;
    pthread_mutex_unlock(&data->lock);
    if (st != RI_OK)
        goto err_free; /* counted as errors{kind="quota"} by the dispatcher */
    st = kvs_cache_create(r.capacity_pages, &wc->dir);
    if (st != RI_OK)
        goto err_free;
    wc->conn = conn;
    wc->recv_addr = r.recv_addr;
    wc->recv_len = r.recv_len;
    pthread_mutex_lock(&data->lock);
    for (slot = 0; slot < KVS_MAX_CACHES_PER_SESSION && s->caches[slot] != NULL; slot++)
        ;
    if (slot == KVS_MAX_CACHES_PER_SESSION || s->dropped) {
        pthread_mutex_unlock(&data->lock);
        st = s->dropped ? RI_ERR_NOT_FOUND : RI_ERR_QUOTA;
        goto err_free;
    }
    wc->id = ++s->next_cache_id;
    s->caches[slot] = wc;
    pthread_mutex_unlock(&data->lock);
    cm_dp_put32(reply, wc->id);
    cm_dp_put32(reply + 4, 0);
    cm_dp_put64(reply + 8, s->page_bytes);
    *reply_p = reply;
    *reply_len_p = 16;
    return RI_OK;

err_free:
    pthread_mutex_lock(&data->lock);
    kvs_wcache_free(data, wc);
    pthread_mutex_unlock(&data->lock);
    cm_free(reply);
    return st;
}

/* One FETCH_RANKED from plan to reply.  Entry i is the i-th requested
 * cluster, in request order. */
typedef struct kvs_fetch {
    cm_dp_fetch_view_t v;
    uint32_t n_ent;             /* clusters requested */
    uint64_t t0;                /* arrival, for the latency histogram */
    kvs_wcache_t *wc;           /* the worker cache it runs against */
    /* plan (lock held) */
    kvs_cache_req_t *reqs;      /* key and pages of each entry; hit / admitted after the commit */
    const uint8_t **src;        /* where each miss's bytes are (pool, region, or disk_buf) */
    uint32_t *tokens;           /* tokens of each entry */
    uint8_t *flags;             /* KVS_FETCH_* of each entry */
    uint64_t total_pages, miss_bytes;
    kvs_tier_read_t *rd;        /* disk-resident misses, read without the lock */
    uint32_t *rd_idx;           /* their entries */
    uint32_t n_rd;
    uint8_t *disk_buf;          /* what they were read into (owned) */
    /* commit (lock held) */
    uint32_t *pages_out;        /* cache pages of hits and admissions */
    uint64_t *evicted;          /* evicted keys */
    size_t n_ev;
    uint8_t *reply;             /* reply meta (owned) */
    size_t rlen;
} kvs_fetch_t;

#define KVS_FETCH_PINNED 1u     /* the entry's cluster is pinned (unpin when done) */
#define KVS_FETCH_DISK 2u       /* its bytes come from the spill tier */

static void kvs_fetch_free(kvs_fetch_t *f)
{
    cm_free(f->reqs);
    cm_free(f->src);
    cm_free(f->tokens);
    cm_free(f->flags);
    cm_free(f->rd);
    cm_free(f->rd_idx);
    cm_free(f->disk_buf);
    cm_free(f->pages_out);
    cm_free(f->evicted);
    cm_free(f->reply);
}

static void kvs_ops_latency_locked(kvs_data_t *data, double secs)
{
    cm_hist_add(&data->fetch_lat, secs);
}

/* Decode the request and allocate the plan.  Lock not held. */
static ri_status_t kvs_fetch_decode(const kvs_data_t *data, const kvs_session_t *s, const cm_wire_hdr_t *hdr,
                                    const uint8_t *body, kvs_fetch_t *f)
{
    ri_status_t st;

    if (hdr->data_len != 0)
        return RI_ERR_PROTOCOL;
    st = cm_dp_fetch_decode(body, hdr->meta_len, &f->v);
    if (st != RI_OK)
        return st;
    if (f->v.layer >= s->geo.layers || f->v.total_ids == 0)
        return f->v.total_ids == 0 ? RI_ERR_PROTOCOL : RI_ERR_RANGE;
    f->n_ent = (uint32_t)f->v.total_ids;
    f->reqs = cm_malloc(&kvs_ops_tag, f->n_ent * sizeof(*f->reqs));
    f->src = cm_malloc(&kvs_ops_tag, f->n_ent * sizeof(*f->src));
    f->tokens = cm_malloc(&kvs_ops_tag, f->n_ent * sizeof(uint32_t));
    f->flags = cm_calloc(&kvs_ops_tag, f->n_ent, 1);
    if (f->reqs == NULL || f->src == NULL || f->tokens == NULL || f->flags == NULL)
        return RI_ERR_NOMEM;
    if (!kvs_tier_on(data))
        return RI_OK; /* nothing is ever on disk */
    f->rd = cm_malloc(&kvs_ops_tag, f->n_ent * sizeof(*f->rd));
    f->rd_idx = cm_malloc(&kvs_ops_tag, f->n_ent * sizeof(uint32_t));
    if (f->rd == NULL || f->rd_idx == NULL)
        return RI_ERR_NOMEM;
    return RI_OK;
}

/* Can cluster c be served: in range, not lost, its tier reachable. */
static ri_status_t kvs_fetch_check(const kvs_data_t *data, const kvs_session_t *s, const kvs_table_t *t,
                                   uint32_t id)
{
    /* After a crash, what was only in memory is gone: the worker is told so
     * (and rebuilds), not that it asked out of range. */
    if (id >= t->n)
        return s->recovered ? RI_ERR_LOST : RI_ERR_RANGE;
    kvs_cluster_t c = kvs_table_get(t, id);
    if (c.tier == KVS_TIER_GONE)
        return s->recovered ? RI_ERR_LOST : RI_ERR_RANGE;
    if (c.tier == KVS_TIER_LOST)
        return RI_ERR_CORRUPT; /* its spill record failed verification */
    if (c.tier != KVS_TIER_POOL && c.tier != KVS_TIER_BLOCK && !kvs_tier_on(data))
        return RI_ERR_UNSUPPORTED;
    return RI_OK;
}

/* Plan entry k, cluster id of (layer, head): what it is, and for a miss
 * where its bytes are; a miss is pinned (pool) or queued for read-back
 * (disk, pinned by the read plan).  Lock held. */
static void kvs_fetch_plan_one_locked(kvs_data_t *data, kvs_session_t *s, kvs_fetch_t *f, uint32_t k,
                                      uint32_t head, uint32_t id)
{
    kvs_table_t *t = &s->tables[(uint64_t)f->v.layer * s->geo.kv_heads + head];
    kvs_cluster_t cv = kvs_table_get(t, id), *own = kvs_table_own(t, id), *c = &cv;

    if (own != NULL)
        own->last_fetch_ns = f->t0; /* coldness, for a spill tier */
    f->reqs[k].key = kvs_cache_key(f->v.layer, head, id);
    f->reqs[k].pages = (uint32_t)kvs_cluster_pages(s, c->tokens);
    f->tokens[k] = c->tokens;
    f->src[k] = NULL;
    f->total_pages += f->reqs[k].pages;
    if (kvs_cache_contains(f->wc->dir, f->reqs[k].key))
        return;
    f->miss_bytes += f->reqs[k].pages * s->page_bytes;
    f->flags[k] = KVS_FETCH_PINNED;
    if (c->tier == KVS_TIER_POOL || c->tier == KVS_TIER_BLOCK) {
        f->src[k] = kvs_cluster_data(data, s, c);
        if (own != NULL)
            own->pins++; /* an attached run's cluster is never spilled: no pin */
    } else {
        f->flags[k] |= KVS_FETCH_DISK;
        kvs_tier_read_plan_locked(s, f->v.layer, head, id, &f->rd[f->n_rd]);
        f->rd_idx[f->n_rd++] = k;
    }
}

/* Unpin every cluster the plan pinned (lock held; also after a failure). */
static void kvs_fetch_unpin_locked(kvs_data_t *data, kvs_session_t *s, kvs_fetch_t *f)
{
    for (uint32_t k = 0; k < f->n_ent; k++) {
        uint64_t key = f->reqs[k].key;
        if (f->flags[k] & KVS_FETCH_PINNED)
            kvs_tier_unpin_locked(data, s, (uint32_t)(key >> 44), (uint32_t)(key >> 32) & 0xfffu, (uint32_t)key);
        f->flags[k] &= (uint8_t)~KVS_FETCH_PINNED;
    }
}

/* Plan: find the worker cache, check every cluster, pin the misses and list
 * the disk-resident ones.  Nothing visible changes but coldness and pins
 * (undone by kvs_fetch_unpin_locked).  Lock held. */
static ri_status_t kvs_fetch_plan_locked(kvs_data_t *data, kvs_session_t *s, const void *conn, kvs_fetch_t *f)
{
    uint32_t k = 0;

    f->wc = kvs_ops_cache_find(s, f->v.cache_id, conn);
    if (f->wc == NULL)
        return RI_ERR_NOT_FOUND;
    for (uint32_t i = 0; i < f->v.n_heads; i++) {
        uint32_t head = cm_dp_get32(f->v.heads + 8u * i), n = cm_dp_get32(f->v.heads + 8u * i + 4);
        if (head >= s->geo.kv_heads)
            return RI_ERR_RANGE;
        const kvs_table_t *t = &s->tables[(uint64_t)f->v.layer * s->geo.kv_heads + head];
        for (uint32_t j = 0; j < n; j++, k++) {
            uint32_t id = cm_dp_get32(f->v.ids + 4u * k);
            ri_status_t st = kvs_fetch_check(data, s, t, id);
            if (st != RI_OK)
                return st;
            kvs_fetch_plan_one_locked(data, s, f, k, head, id);
        }
    }
    /* The misses must fit the receive buffer before anything changes. */
    if (f->v.recv_offset > f->wc->recv_len || f->miss_bytes > f->wc->recv_len - f->v.recv_offset)
        return RI_ERR_RANGE;
    return RI_OK;
}

/* Read the disk-resident misses back: the lock is dropped for the disk I/O
 * (the clusters are pinned, the session referenced) and taken again to mark
 * what failed verification.  Called and returns with the lock held. */
static ri_status_t kvs_fetch_read_disk(kvs_data_t *data, kvs_session_t *s, kvs_fetch_t *f)
{
    ri_status_t st;

    if (f->n_rd == 0)
        return RI_OK;
    pthread_mutex_unlock(&data->lock);
    st = kvs_tier_read(data, s->id, f->rd, f->n_rd, &f->disk_buf);
    pthread_mutex_lock(&data->lock);
    kvs_tier_read_finish_locked(data, s, f->rd, f->n_rd);
    if (st == RI_OK && s->dropped)
        st = RI_ERR_NOT_FOUND; /* dropped while it read: the worker hears it is gone */
    if (st != RI_OK)
        return st;
    for (uint32_t i = 0; i < f->n_rd; i++)
        f->src[f->rd_idx[i]] = f->rd[i].src;
    return RI_OK;
}

/* Encode the reply meta: header, heads, one entry per cluster, the cache
 * pages of hits and admissions, the evictions.  Counts pool / disk serves. */
static void kvs_fetch_encode_locked(kvs_data_t *data, const kvs_session_t *s, kvs_fetch_t *f, uint32_t n_listed)
{
    uint8_t *e = f->reply + CM_DP_FETCH_REPLY_FIXED + 8u * f->v.n_heads;
    uint8_t *pages = e + CM_DP_ENTRY_SIZE * (size_t)f->n_ent, *ev = pages + 4u * (size_t)n_listed;
    uint64_t roff = f->v.recv_offset;
    uint32_t pcur = 0;

    cm_dp_fetch_reply_header(f->reply, f->v.n_heads, f->n_ent, n_listed, (uint32_t)f->n_ev, f->miss_bytes);
    memcpy(f->reply + CM_DP_FETCH_REPLY_FIXED, f->v.heads, 8u * f->v.n_heads);
    for (uint32_t i = 0; i < f->n_ent; i++) {
        const kvs_cache_req_t *q = &f->reqs[i];
        cm_dp_entry_t ent = {.cluster = (uint32_t)q->key, .tokens = f->tokens[i], .n_pages = q->pages};
        if (q->hit || q->admitted) {
            ent.page_index = pcur;
            for (uint32_t j = 0; j < q->pages; j++)
                cm_dp_put32(pages + 4u * (pcur + j), f->pages_out[q->first_page + j]);
            pcur += q->pages;
        }
        if (q->hit) {
            ent.flags = CM_DP_F_HIT;
        } else {
            bool from_disk = (f->flags[i] & KVS_FETCH_DISK) != 0;
            ent.flags = CM_DP_F_MISS | (q->admitted ? CM_DP_F_ADMITTED : 0) | (from_disk ? CM_DP_F_FROM_DISK : 0);
            data->served_disk += from_disk;
            data->served_pool += !from_disk;
            ent.recv_offset = roff;
            roff += (uint64_t)q->pages * s->page_bytes;
        }
        cm_dp_entry_encode(e + CM_DP_ENTRY_SIZE * (size_t)i, &ent);
    }
    for (size_t i = 0; i < f->n_ev; i++) {
        cm_dp_put32(ev + CM_DP_EVICT_SIZE * i, (uint32_t)(f->evicted[i] >> 44));
        cm_dp_put32(ev + CM_DP_EVICT_SIZE * i + 4, (uint32_t)(f->evicted[i] >> 32) & 0xfffu);
        cm_dp_put32(ev + CM_DP_EVICT_SIZE * i + 8, (uint32_t)f->evicted[i]);
    }
}

/* Commit: move the worker's cache directory (after every check and the
 * read-back, so a failure before leaves it as it was), encode the reply and
 * count.  Lock held. */
static ri_status_t kvs_fetch_commit_locked(kvs_data_t *data, const kvs_session_t *s, kvs_fetch_t *f)
{
    size_t max_ev = kvs_cache_clusters(f->wc->dir);
    uint32_t n_listed = 0;
    ri_status_t st;

    f->pages_out = cm_malloc(&kvs_ops_tag, (size_t)(f->total_pages ? f->total_pages : 1) * sizeof(uint32_t));
    f->evicted = cm_malloc(&kvs_ops_tag, (max_ev ? max_ev : 1) * sizeof(uint64_t));
    if (f->pages_out == NULL || f->evicted == NULL)
        return RI_ERR_NOMEM;
    st = kvs_cache_fetch(f->wc->dir, f->reqs, f->n_ent, f->pages_out, f->evicted, max_ev, &f->n_ev);
    if (st != RI_OK)
        return st;
    for (uint32_t i = 0; i < f->n_ent; i++)
        if (f->reqs[i].hit || f->reqs[i].admitted)
            n_listed += f->reqs[i].pages;
    f->rlen = cm_dp_fetch_reply_size(f->v.n_heads, f->n_ent, n_listed, (uint32_t)f->n_ev);
    f->reply = cm_malloc(&kvs_ops_tag, f->rlen);
    if (f->reply == NULL) {
        /* The directory already moved; the worker will see an error and
         * re-register.  Rare enough (OOM) not to pre-allocate. */
        return RI_ERR_NOMEM;
    }
    kvs_fetch_encode_locked(data, s, f, n_listed);
    data->fetches++;
    for (uint32_t i = 0; i < f->n_ent; i++) {
        data->cache_hits += f->reqs[i].hit;
        data->cache_misses += !f->reqs[i].hit;
    }
    return RI_OK;
}

/* Send the reply: meta, then the misses' bytes gathered from the pool, the
 * session's region or the read-back buffer.  Lock not held: the misses are
 * pinned and the session referenced. */
static ri_status_t kvs_fetch_send(const kvs_session_t *s, kvs_fetch_t *f, kvs_reply_obj_t *reply)
{
    kvs_iov_t *iov = cm_malloc(&kvs_ops_tag, (f->n_ent + 1) * sizeof(*iov));
    size_t n_iov = 0;
    ri_status_t st;

    if (iov == NULL)
        return RI_ERR_NOMEM;
    for (uint32_t i = 0; i < f->n_ent; i++)
        if (!f->reqs[i].hit)
            iov[n_iov++] = (kvs_iov_t){f->src[i], (size_t)f->reqs[i].pages * s->page_bytes};
    st = kvs_reply_send(reply, RI_OK, f->reply, f->rlen, iov, n_iov, f->miss_bytes);
    cm_free(iov);
    return st;
}

/* FETCH_RANKED: plan (lock) -> read disk-resident misses (no lock) ->
 * commit the cache directory and encode (lock) -> send (no lock) -> unpin
 * and count (lock).  Without disk misses the first three run in one hold. */
static ri_status_t kvs_ops_fetch(kvs_data_t *data, kvs_session_t *s, const cm_wire_hdr_t *hdr, const uint8_t *body,
                                 kvs_reply_obj_t *reply)
{
    kvs_fetch_t f = {.t0 = cm_time_ns()};
    ri_status_t st = kvs_fetch_decode(data, s, hdr, body, &f);

    if (st != RI_OK)
        goto out;
    pthread_mutex_lock(&data->lock);
    st = kvs_fetch_plan_locked(data, s, reply->conn, &f);
    if (st == RI_OK)
        st = kvs_fetch_read_disk(data, s, &f);
    if (st == RI_OK)
        st = kvs_fetch_commit_locked(data, s, &f);
    pthread_mutex_unlock(&data->lock);
    if (st == RI_OK)
        st = kvs_fetch_send(s, &f, reply);
    pthread_mutex_lock(&data->lock);
    kvs_fetch_unpin_locked(data, s, &f);
    if (st == RI_OK) {
        data->bytes_sent += f.miss_bytes;
        kvs_ops_latency_locked(data, (double)(cm_time_ns() - f.t0) * 1e-9);
    }
    pthread_mutex_unlock(&data->lock);
out:
    kvs_fetch_free(&f);
    return st;
}

static ri_status_t kvs_ops_release(kvs_data_t *data, const void *conn, kvs_session_t *s, const cm_wire_hdr_t *hdr,
                                   const uint8_t *body)
{
    uint32_t id;
    bool found = false;

    if (hdr->meta_len != 8 || hdr->data_len != 0)
        return hdr->meta_len < 8 ? RI_ERR_TRUNCATED : RI_ERR_PROTOCOL;
    if (cm_dp_get32(body + 4) != 0)
        return RI_ERR_PROTOCOL;
    id = cm_dp_get32(body);
    pthread_mutex_lock(&data->lock);
    for (uint32_t i = 0; i < KVS_MAX_CACHES_PER_SESSION; i++) {
        kvs_wcache_t *wc = s->caches[i];
        if (wc != NULL && wc->conn == conn && (id == 0 || wc->id == id)) {
            s->caches[i] = NULL;
            kvs_wcache_free(data, wc);
            found = true;
        }
    }
    pthread_mutex_unlock(&data->lock);
    return found || id == 0 ? RI_OK : RI_ERR_NOT_FOUND;
}

/* Run one authenticated request of session s; reply meta (if any) in
 * *meta_p (owned by the caller).  A FETCH_RANKED answers itself. */
static ri_status_t kvs_ops_dispatch(kvs_data_t *data, kvs_session_t *s, const cm_wire_hdr_t *hdr,
                                    const uint8_t *body, kvs_reply_obj_t *reply, uint8_t **meta_p, size_t *len_p)
{
    switch (hdr->op) {
    case CM_WIRE_OP_UPLOAD_CLUSTERS:
    case CM_WIRE_OP_APPEND_CLUSTERS:
        return kvs_ops_upload(data, s, hdr, body, hdr->op == CM_WIRE_OP_APPEND_CLUSTERS, meta_p, len_p);
    case CM_WIRE_OP_REGISTER_CACHE:
        return kvs_ops_register(data, reply->conn, s, hdr, body, meta_p, len_p);
    case CM_WIRE_OP_FETCH_RANKED:
        return kvs_ops_fetch(data, s, hdr, body, reply);
    case CM_WIRE_OP_RELEASE:
        return kvs_ops_release(data, reply->conn, s, hdr, body);
    case CM_WIRE_OP_PING:
        return hdr->meta_len == 0 && hdr->data_len == 0 ? RI_OK : RI_ERR_PROTOCOL;
    case CM_WIRE_OP_MAP:
        return kvs_direct_map(data, s, hdr, meta_p, len_p);
    case CM_WIRE_OP_LOCATE:
        return kvs_direct_locate(data, s, hdr, body, meta_p, len_p);
    case CM_WIRE_OP_TOUCH:
        return kvs_direct_touch(data, s, hdr, body);
    case CM_WIRE_OP_PREFIX_ATTACH:
        return kvs_prefix_attach(data, s, hdr, body, meta_p, len_p);
    case CM_WIRE_OP_PREFIX_PUT:
        return kvs_prefix_put(data, s, hdr, body, meta_p, len_p);
    case CM_WIRE_OP_PREFIX_GET:
        return kvs_prefix_get(data, s, hdr, body, reply);
    default:
        return RI_ERR_PROTOCOL;
    }
}

/* The serve handler (kvs_handler.h): count, authenticate, dispatch, answer. */
static void kvs_ops_serve(void *arg, const cm_wire_hdr_t *hdr, const uint8_t *body, kvs_reply_obj_t *reply)
{
    kvs_data_t *data = arg;
    kvs_session_t *s = NULL;
    uint8_t *meta = NULL;
    size_t meta_len = 0;
    ri_status_t st;

    pthread_mutex_lock(&data->lock);
    data->ops[hdr->op]++;
    st = hdr->op == CM_WIRE_OP_PING && hdr->session_id == 0 ? RI_OK : kvs_ops_auth_locked(data, hdr, &s);
    pthread_mutex_unlock(&data->lock);
    if (st == RI_OK && s != NULL)
        st = kvs_ops_dispatch(data, s, hdr, body, reply, &meta, &meta_len);
    pthread_mutex_lock(&data->lock);
    if (s != NULL)
        kvs_session_unref_locked(data, s);
    if (st != RI_OK)
        kvs_count_errors_locked(data, st, 1);
    pthread_mutex_unlock(&data->lock);
    if (st != RI_OK)
        cm_debug("dp: %s request %llu: %s", cm_wire_op_name(hdr->op), (unsigned long long)hdr->request_id,
                 ri_status_str(st));
    if (!reply->sent)
        (void)kvs_reply_send(reply, st, meta, meta_len, NULL, 0, 0);
    cm_free(meta);
}

/* A connection opened or closed: its lease hold, and (closed) the caches it
 * registered. */
static void kvs_ops_conn_event(void *arg, const void *conn, uint64_t session_id, bool up)
{
    kvs_data_t *data = arg;

    pthread_mutex_lock(&data->lock);
    for (uint32_t i = 0; !up && i < data->n_sessions; i++) {
        kvs_session_t *s = data->sessions[i];
        for (uint32_t c = 0; c < KVS_MAX_CACHES_PER_SESSION; c++) {
            if (s->caches[c] != NULL && s->caches[c]->conn == conn) {
                kvs_wcache_free(data, s->caches[c]);
                s->caches[c] = NULL;
            }
        }
    }
    kvs_lease_conn_locked(data, session_id, up);
    pthread_mutex_unlock(&data->lock);
}

static void kvs_ops_account(void *arg, uint8_t op, ri_status_t st, uint64_t n)
{
    kvs_data_t *data = arg;

    pthread_mutex_lock(&data->lock);
    if (op >= 1 && op <= CM_WIRE_OP_MAX)
        data->ops[op] += n;
    if (st != RI_OK)
        kvs_count_errors_locked(data, st, n);
    pthread_mutex_unlock(&data->lock);
}

static ri_status_t kvs_ops_handover(void *arg, uint64_t session_id, const uint8_t secret[CM_WIRE_SECRET_SIZE],
                                    uint32_t object, int *fd_p, uint64_t *bytes_p)
{
    return kvs_direct_handover(arg, session_id, secret, object, fd_p, bytes_p);
}

void kvs_ops_handlers(kvs_data_t *data, kvs_handlers_t *h)
{
    *h = (kvs_handlers_t){.arg = data, .precheck = kvs_ops_precheck, .serve = kvs_ops_serve,
                          .conn_event = kvs_ops_conn_event, .account = kvs_ops_account,
                          .handover = kvs_ops_handover};
}
