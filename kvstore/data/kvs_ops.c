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

ri_status_t kvs_ops_precheck(kvs_data_t *data, const cm_wire_hdr_t *hdr)
{
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

static ri_status_t kvs_table_reserve(kvs_table_t *t, uint64_t more)
{
    uint64_t want = (uint64_t)t->n + more;
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

/* Upload with the spill tier on: one pool extent per cluster, owned by its
 * table entry (so that spilling it frees its pages), then publish and track
 * coldness.  Validation is done; lock held; tables reserved. */
static ri_status_t kvs_ops_upload_tiered_locked(kvs_data_t *data, kvs_session_t *s, const cm_dp_clusters_view_t *v,
                                                const uint8_t *src, uint8_t *reply)
{
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
        cm_dp_put32(reply + 8 + 8u * i, head);
        cm_dp_put32(reply + 12 + 8u * i, t->n);
        for (uint32_t j = 0; j < cnt; j++, k++) {
            memcpy(kvs_pool_base(data->pool) + offs[k], src, sizes[k]);
            t->c[t->n] = (kvs_cluster_t){.off = offs[k], .tokens = cm_dp_clusters_tokens(v, k),
                                         .tier = KVS_TIER_POOL, .crc = cm_crc32c(0, src, sizes[k])};
            kvs_tier_touch_locked(data, s, v->layer, head, t->n);
            t->n++;
            src += sizes[k];
        }
        s->clusters += cnt;
    }
out:
    cm_free(sizes);
    cm_free(offs);
    return st;
}

static ri_status_t kvs_ops_upload(kvs_data_t *data, kvs_session_t *s, const cm_wire_hdr_t *hdr, const uint8_t *body,
                                  bool append, uint8_t **reply_p, size_t *reply_len_p)
{
    cm_dp_clusters_view_t v;
    uint64_t head_bytes[CM_DP_MAX_HEADS], head_off[CM_DP_MAX_HEADS], total = 0, charge = 0, k = 0;
    bool seen[CM_DP_MAX_HEADS] = {false}, in_region[CM_DP_MAX_HEADS] = {false};
    uint64_t region_used0 = 0;
    const uint8_t *src = body + hdr->meta_len;
    uint32_t n_alloc = 0;
    uint8_t *reply;
    ri_status_t st;

    st = cm_dp_clusters_decode(body, hdr->meta_len, &v);
    if (st != RI_OK)
        return st;
    if (v.layer >= s->geo.layers || v.n_heads > s->geo.kv_heads)
        return RI_ERR_RANGE;
    /* Sizes: every cluster's tokens in range, the pages add up to data_len. */
    for (uint32_t i = 0; i < v.n_heads; i++) {
        uint32_t head = cm_dp_clusters_head(&v, i), n = cm_dp_clusters_count(&v, i);
        if (head >= s->geo.kv_heads)
            return RI_ERR_RANGE;
        if (seen[head])
            return RI_ERR_INVALID;
        seen[head] = true;
        head_bytes[i] = 0;
        for (uint32_t j = 0; j < n; j++, k++) {
            uint32_t tok = cm_dp_clusters_tokens(&v, k);
            if (tok == 0 || tok > CM_DP_MAX_CLUSTER_TOKENS)
                return RI_ERR_RANGE;
            head_bytes[i] += kvs_cluster_pages(s, tok) * s->page_bytes;
            if (head_bytes[i] > hdr->data_len)
                return RI_ERR_PROTOCOL; /* also keeps the sums from overflowing */
        }
        total += head_bytes[i];
        if (total > hdr->data_len)
            return RI_ERR_PROTOCOL;
        charge += head_bytes[i] ? kvs_pool_round(head_bytes[i]) : 0;
    }
    if (total != hdr->data_len)
        return RI_ERR_PROTOCOL;
    reply = cm_malloc(&kvs_ops_tag, 8u + 8u * v.n_heads);
    if (reply == NULL)
        return RI_ERR_NOMEM;

    pthread_mutex_lock(&data->lock);
    for (uint32_t i = 0; i < v.n_heads; i++) {
        kvs_table_t *t = &s->tables[(uint64_t)v.layer * s->geo.kv_heads + cm_dp_clusters_head(&v, i)];
        if (!append && t->n != 0) {
            st = RI_ERR_EXISTS;
            goto err_unlock;
        }
        st = kvs_table_reserve(t, cm_dp_clusters_count(&v, i));
        if (st != RI_OK)
            goto err_unlock;
    }
    /* Room for the extents first, so that recording them cannot fail. */
    st = kvs_session_reserve_extents_locked(s, v.n_heads);
    if (st != RI_OK)
        goto err_unlock;
    /* With a spill tier, an upload that fits the session's direct region
     * whole goes there (pinned); otherwise one extent per cluster, so that
     * each can spill. */
    if (kvs_tier_on(data) && !(s->region != NULL && total <= s->region->bytes - s->region->used)) {
        st = kvs_ops_upload_tiered_locked(data, s, &v, src, reply);
        if (st != RI_OK)
            goto err_unlock;
        data->bytes_received += hdr->data_len;
        kvs_tier_relieve_locked(data);
        pthread_mutex_unlock(&data->lock);
        goto done;
    }
    /* Heads that fit go to the session's direct region (charged when it was
     * made); the rest to the pool, charged now. */
    region_used0 = s->region != NULL ? s->region->used : 0;
    charge = 0;
    for (uint32_t i = 0; i < v.n_heads; i++) {
        in_region[i] = head_bytes[i] != 0 && kvs_direct_take_locked(s, head_bytes[i], &head_off[i]);
        if (!in_region[i] && head_bytes[i] != 0)
            charge += kvs_pool_round(head_bytes[i]);
    }
    st = kvs_session_charge_locked(data, s, charge);
    if (st != RI_OK) {
        if (s->region != NULL)
            s->region->used = region_used0;
        goto err_unlock;
    }
    for (n_alloc = 0; n_alloc < v.n_heads; n_alloc++) {
        if (head_bytes[n_alloc] == 0 || in_region[n_alloc])
            continue;
        st = kvs_pool_alloc(data->pool, head_bytes[n_alloc], &head_off[n_alloc]);
        if (st != RI_OK)
            goto err_free_extents;
    }
    /* Everything that can fail has succeeded: copy and publish. */
    k = 0;
    for (uint32_t i = 0; i < v.n_heads; i++) {
        uint32_t head = cm_dp_clusters_head(&v, i), n = cm_dp_clusters_count(&v, i);
        kvs_table_t *t = &s->tables[(uint64_t)v.layer * s->geo.kv_heads + head];
        uint64_t off = head_off[i];
        cm_dp_put32(reply + 8 + 8u * i, head);
        cm_dp_put32(reply + 12 + 8u * i, t->n);
        if (head_bytes[i] == 0)
            continue;
        if (in_region[i]) {
            memcpy(s->region->base + off, src, head_bytes[i]);
        } else {
            kvs_session_add_extent_locked(s, off, head_bytes[i]);
            memcpy(kvs_pool_base(data->pool) + off, src, head_bytes[i]);
        }
        for (uint32_t j = 0; j < n; j++, k++) {
            uint32_t tok = cm_dp_clusters_tokens(&v, k);
            uint64_t bytes = kvs_cluster_pages(s, tok) * s->page_bytes;
            t->c[t->n++] = (kvs_cluster_t){.off = off, .tokens = tok, .tier = KVS_TIER_POOL,
                                           .direct = in_region[i], .crc = cm_crc32c(0, src, bytes)};
            off += bytes;
            src += bytes;
        }
        s->clusters += n;
    }
    data->bytes_received += hdr->data_len;
    pthread_mutex_unlock(&data->lock);
done:
    cm_dp_put32(reply, v.n_heads);
    cm_dp_put32(reply + 4, 0);
    *reply_p = reply;
    *reply_len_p = 8u + 8u * v.n_heads;
    return RI_OK;

err_free_extents:
    for (uint32_t i = 0; i < n_alloc; i++)
        if (head_bytes[i] != 0 && !in_region[i])
            kvs_pool_free(data->pool, head_off[i], head_bytes[i]);
    kvs_session_uncharge_locked(data, s, charge);
    if (s->region != NULL)
        s->region->used = region_used0;
err_unlock:
    pthread_mutex_unlock(&data->lock);
    cm_free(reply);
    return st;
}

static kvs_wcache_t *kvs_ops_cache_find(kvs_session_t *s, uint32_t id, void *conn)
{
    for (uint32_t i = 0; i < KVS_MAX_CACHES_PER_SESSION; i++)
        if (s->caches[i] != NULL && s->caches[i]->id == id && s->caches[i]->conn == conn)
            return s->caches[i];
    return NULL;
}

static ri_status_t kvs_ops_register(kvs_data_t *data, void *conn, kvs_session_t *s, const cm_wire_hdr_t *hdr,
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

/* Whether src points into the pool arena (else into a spill read buffer). */
static bool kvs_ops_in_pool(kvs_data_t *data, const uint8_t *src)
{
    const uint8_t *base = kvs_pool_base(data->pool);
    return src >= base && src < base + kvs_pool_size(data->pool);
}

/* Everything a fetch decided, kept while its bytes move. */
typedef struct kvs_fetch_plan {
    kvs_cache_req_t *reqs;      /* one per requested cluster */
    const uint8_t **src;        /* where each cluster's bytes are (pool, or disk_buf) */
    uint8_t *disk_buf;          /* clusters read back from the spill tier (owned) */
    kvs_tier_read_t *rd;        /* disk-resident misses */
    uint32_t *rd_idx;           /* their plan entries */
    uint32_t *tokens;           /* tokens of each cluster */
    uint32_t *pages_out;        /* cache pages of hits and admissions */
    uint64_t *evicted;          /* evicted keys */
} kvs_fetch_plan_t;

static void kvs_fetch_plan_free(kvs_fetch_plan_t *p)
{
    cm_free(p->reqs);
    cm_free(p->src);
    cm_free(p->disk_buf);
    cm_free(p->rd);
    cm_free(p->rd_idx);
    cm_free(p->tokens);
    cm_free(p->pages_out);
    cm_free(p->evicted);
}

static void kvs_ops_latency_locked(kvs_data_t *data, double secs)
{
    int b = 0;
    while (b < KVS_LAT_BUCKETS && secs > kvs_lat_bounds[b])
        b++;
    data->lat_bucket[b]++;
    data->lat_sum_s += secs;
}

static ri_status_t kvs_ops_fetch(kvs_data_t *data, void *conn, kvs_session_t *s, const cm_wire_hdr_t *hdr,
                                 const uint8_t *body, uint8_t **reply_p, size_t *reply_len_p, bool *replied_p)
{
    cm_dp_fetch_view_t v;
    kvs_fetch_plan_t p = {0};
    kvs_wcache_t *wc;
    uint64_t total_pages = 0, miss_bytes = 0, k = 0, roff;
    size_t n_ev = 0, max_ev, rlen;
    uint32_t n_listed = 0, n_ent, n_rd = 0;
    uint8_t *reply = NULL, *e;
    ri_status_t st;
    uint64_t t0 = cm_time_ns();

    if (hdr->data_len != 0)
        return RI_ERR_PROTOCOL;
    st = cm_dp_fetch_decode(body, hdr->meta_len, &v);
    if (st != RI_OK)
        return st;
    if (v.layer >= s->geo.layers || v.total_ids == 0)
        return v.total_ids == 0 ? RI_ERR_PROTOCOL : RI_ERR_RANGE;
    n_ent = (uint32_t)v.total_ids;
    p.reqs = cm_malloc(&kvs_ops_tag, n_ent * sizeof(*p.reqs));
    p.src = cm_malloc(&kvs_ops_tag, n_ent * sizeof(*p.src));
    p.tokens = cm_malloc(&kvs_ops_tag, n_ent * sizeof(uint32_t));
    if (kvs_tier_on(data)) {
        p.rd = cm_malloc(&kvs_ops_tag, n_ent * sizeof(*p.rd));
        p.rd_idx = cm_malloc(&kvs_ops_tag, n_ent * sizeof(uint32_t));
    }
    if (p.reqs == NULL || p.src == NULL || p.tokens == NULL || (kvs_tier_on(data) && (p.rd == NULL || p.rd_idx == NULL))) {
        kvs_fetch_plan_free(&p);
        return RI_ERR_NOMEM;
    }

    pthread_mutex_lock(&data->lock);
    wc = kvs_ops_cache_find(s, v.cache_id, conn);
    if (wc == NULL) {
        st = RI_ERR_NOT_FOUND;
        goto err_unlock;
    }
    for (uint32_t i = 0; i < v.n_heads; i++) {
        uint32_t head = cm_dp_get32(v.heads + 8u * i), n = cm_dp_get32(v.heads + 8u * i + 4);
        kvs_table_t *t;
        if (head >= s->geo.kv_heads) {
            st = RI_ERR_RANGE;
            goto err_unlock;
        }
        t = &s->tables[(uint64_t)v.layer * s->geo.kv_heads + head];
        for (uint32_t j = 0; j < n; j++, k++) {
            uint32_t id = cm_dp_get32(v.ids + 4u * k);
            if (id >= t->n || t->c[id].tier == KVS_TIER_GONE) {
                /* After a crash, what was only in memory is gone: the worker
                 * is told so (and rebuilds), not that it asked out of range. */
                st = s->recovered ? RI_ERR_LOST : RI_ERR_RANGE;
                goto err_unlock;
            }
            if (t->c[id].tier == KVS_TIER_LOST) {
                st = RI_ERR_CORRUPT; /* its spill record failed verification */
                goto err_unlock;
            }
            if (t->c[id].tier != KVS_TIER_POOL && !kvs_tier_on(data)) {
                st = RI_ERR_UNSUPPORTED;
                goto err_unlock;
            }
            t->c[id].last_fetch_ns = t0; /* coldness, for a spill tier */
            p.reqs[k].key = kvs_cache_key(v.layer, head, id);
            p.reqs[k].pages = (uint32_t)kvs_cluster_pages(s, t->c[id].tokens);
            p.src[k] = t->c[id].tier == KVS_TIER_POOL ? kvs_cluster_data(data, s, &t->c[id]) : NULL;
            p.tokens[k] = t->c[id].tokens;
            total_pages += p.reqs[k].pages;
            if (!kvs_cache_contains(wc->dir, p.reqs[k].key)) {
                miss_bytes += p.reqs[k].pages * s->page_bytes;
                if (p.src[k] == NULL) {
                    p.rd[n_rd] = (kvs_tier_read_t){.layer = v.layer, .head = head, .id = id,
                                                   .bytes = (uint64_t)p.reqs[k].pages * s->page_bytes};
                    p.rd_idx[n_rd++] = (uint32_t)k;
                } else if (kvs_tier_on(data)) {
                    kvs_tier_touch_locked(data, s, v.layer, head, id);
                }
            }
        }
    }
    /* The disk-resident misses, in one batch, before the cache directory
     * moves: a failure leaves the worker's cache as it was. */
    if (n_rd > 0) {
        st = kvs_tier_read_locked(data, s, p.rd, n_rd, &p.disk_buf);
        if (st != RI_OK)
            goto err_unlock;
        for (uint32_t i = 0; i < n_rd; i++)
            p.src[p.rd_idx[i]] = p.rd[i].src;
    }
    /* The misses must fit the receive buffer before anything changes. */
    if (v.recv_offset > wc->recv_len || miss_bytes > wc->recv_len - v.recv_offset) {
        st = RI_ERR_RANGE;
        goto err_unlock;
    }
    max_ev = kvs_cache_clusters(wc->dir);
    p.pages_out = cm_malloc(&kvs_ops_tag, (size_t)total_pages * sizeof(uint32_t));
    p.evicted = cm_malloc(&kvs_ops_tag, (max_ev ? max_ev : 1) * sizeof(uint64_t));
    if (p.pages_out == NULL || p.evicted == NULL) {
        st = RI_ERR_NOMEM;
        goto err_unlock;
    }
    st = kvs_cache_fetch(wc->dir, p.reqs, n_ent, p.pages_out, p.evicted, max_ev, &n_ev);
    if (st != RI_OK)
        goto err_unlock;
    for (uint32_t i = 0; i < n_ent; i++)
        if (p.reqs[i].hit || p.reqs[i].admitted)
            n_listed += p.reqs[i].pages;
    rlen = cm_dp_fetch_reply_size(v.n_heads, n_ent, n_listed, (uint32_t)n_ev);
    reply = cm_malloc(&kvs_ops_tag, rlen);
    if (reply == NULL) {
        /* The directory already moved; the worker will see an error and
         * re-register.  Rare enough (OOM) not to pre-allocate. */
        st = RI_ERR_NOMEM;
        goto err_unlock;
    }
    cm_dp_fetch_reply_header(reply, v.n_heads, n_ent, n_listed, (uint32_t)n_ev, miss_bytes);
    memcpy(reply + CM_DP_FETCH_REPLY_FIXED, v.heads, 8u * v.n_heads);
    e = reply + CM_DP_FETCH_REPLY_FIXED + 8u * v.n_heads;
    {
        uint8_t *pages = e + CM_DP_ENTRY_SIZE * (size_t)n_ent;
        uint32_t pcur = 0;
        roff = v.recv_offset;
        for (uint32_t i = 0; i < n_ent; i++) {
            cm_dp_entry_t ent = {.cluster = (uint32_t)p.reqs[i].key, .tokens = p.tokens[i],
                                 .n_pages = p.reqs[i].pages};
            if (p.reqs[i].hit || p.reqs[i].admitted) {
                ent.page_index = pcur;
                for (uint32_t j = 0; j < p.reqs[i].pages; j++)
                    cm_dp_put32(pages + 4u * (pcur + j), p.pages_out[p.reqs[i].first_page + j]);
                pcur += p.reqs[i].pages;
            }
            if (p.reqs[i].hit) {
                ent.flags = CM_DP_F_HIT;
            } else {
                bool from_disk = p.disk_buf != NULL && !kvs_ops_in_pool(data, p.src[i]);
                ent.flags = CM_DP_F_MISS | (p.reqs[i].admitted ? CM_DP_F_ADMITTED : 0) |
                            (from_disk ? CM_DP_F_FROM_DISK : 0);
                data->served_disk += from_disk;
                data->served_pool += !from_disk;
                ent.recv_offset = roff;
                roff += (uint64_t)p.reqs[i].pages * s->page_bytes;
            }
            cm_dp_entry_encode(e + CM_DP_ENTRY_SIZE * (size_t)i, &ent);
        }
        uint8_t *ev = pages + 4u * (size_t)n_listed;
        for (size_t i = 0; i < n_ev; i++) {
            cm_dp_put32(ev + CM_DP_EVICT_SIZE * i, (uint32_t)(p.evicted[i] >> 44));
            cm_dp_put32(ev + CM_DP_EVICT_SIZE * i + 4, (uint32_t)(p.evicted[i] >> 32) & 0xfffu);
            cm_dp_put32(ev + CM_DP_EVICT_SIZE * i + 8, (uint32_t)p.evicted[i]);
        }
    }
    data->fetches++;
    for (uint32_t i = 0; i < n_ent; i++) {
        data->cache_hits += p.reqs[i].hit;
        data->cache_misses += !p.reqs[i].hit;
    }
    /* Taken before the lock goes, so no spill slips in between. */
    pthread_rwlock_rdlock(&data->move_lock);
    pthread_mutex_unlock(&data->lock);

    /* Move the misses' bytes without the lock (our reference keeps the
     * session's pages alive even if it is dropped meanwhile): the reply
     * carries them, gathered from the pool, the session's region or a spill
     * read buffer. */
    kvs_iov_t *iov = cm_malloc(&kvs_ops_tag, (n_ent + 1) * sizeof(*iov));
    size_t n_iov = 0;
    if (iov == NULL) {
        st = RI_ERR_NOMEM;
    } else {
        for (uint32_t i = 0; i < n_ent; i++)
            if (!p.reqs[i].hit)
                iov[n_iov++] = (kvs_iov_t){p.src[i], (size_t)p.reqs[i].pages * s->page_bytes};
        st = kvs_dp_reply_data(data->dp, conn, hdr, reply, rlen, iov, n_iov, miss_bytes);
        cm_free(iov);
        *replied_p = st == RI_OK;
    }
    pthread_rwlock_unlock(&data->move_lock);
    kvs_fetch_plan_free(&p);
    pthread_mutex_lock(&data->lock);
    if (st == RI_OK) {
        data->bytes_sent += miss_bytes;
        kvs_ops_latency_locked(data, (double)(cm_time_ns() - t0) * 1e-9);
    }
    pthread_mutex_unlock(&data->lock);
    cm_free(reply);
    return st;

err_unlock:
    pthread_mutex_unlock(&data->lock);
    kvs_fetch_plan_free(&p);
    return st;
}

static ri_status_t kvs_ops_release(kvs_data_t *data, void *conn, kvs_session_t *s, const cm_wire_hdr_t *hdr,
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

ri_status_t kvs_ops_serve(kvs_data_t *data, void *conn, const cm_wire_hdr_t *hdr, const uint8_t *body,
                          uint8_t **reply_p, size_t *reply_len_p, bool *replied_p)
{
    kvs_session_t *s = NULL;
    ri_status_t st;

    *reply_p = NULL;
    *reply_len_p = 0;
    *replied_p = false;
    pthread_mutex_lock(&data->lock);
    data->ops[hdr->op]++;
    if (hdr->op == CM_WIRE_OP_PING && hdr->session_id == 0) {
        pthread_mutex_unlock(&data->lock);
        return RI_OK;
    }
    st = kvs_ops_auth_locked(data, hdr, &s);
    pthread_mutex_unlock(&data->lock);
    if (st != RI_OK)
        return st;
    switch (hdr->op) {
    case CM_WIRE_OP_UPLOAD_CLUSTERS:
    case CM_WIRE_OP_APPEND_CLUSTERS:
        st = kvs_ops_upload(data, s, hdr, body, hdr->op == CM_WIRE_OP_APPEND_CLUSTERS, reply_p, reply_len_p);
        break;
    case CM_WIRE_OP_REGISTER_CACHE:
        st = kvs_ops_register(data, conn, s, hdr, body, reply_p, reply_len_p);
        break;
    case CM_WIRE_OP_FETCH_RANKED:
        st = kvs_ops_fetch(data, conn, s, hdr, body, reply_p, reply_len_p, replied_p);
        break;
    case CM_WIRE_OP_RELEASE:
        st = kvs_ops_release(data, conn, s, hdr, body);
        break;
    case CM_WIRE_OP_PING:
        st = hdr->meta_len == 0 && hdr->data_len == 0 ? RI_OK : RI_ERR_PROTOCOL;
        break;
    case CM_WIRE_OP_MAP:
        st = kvs_direct_map(data, s, hdr, reply_p, reply_len_p);
        break;
    case CM_WIRE_OP_LOCATE:
        st = kvs_direct_locate(data, s, hdr, body, reply_p, reply_len_p);
        break;
    case CM_WIRE_OP_TOUCH:
        st = kvs_direct_touch(data, s, hdr, body);
        break;
    default:
        st = RI_ERR_PROTOCOL;
    }
    pthread_mutex_lock(&data->lock);
    kvs_session_unref_locked(data, s);
    pthread_mutex_unlock(&data->lock);
    return st;
}

void kvs_ops_conn_closed(kvs_data_t *data, void *conn)
{
    pthread_mutex_lock(&data->lock);
    for (uint32_t i = 0; i < data->n_sessions; i++) {
        kvs_session_t *s = data->sessions[i];
        for (uint32_t c = 0; c < KVS_MAX_CACHES_PER_SESSION; c++) {
            if (s->caches[c] != NULL && s->caches[c]->conn == conn) {
                kvs_wcache_free(data, s->caches[c]);
                s->caches[c] = NULL;
            }
        }
    }
    pthread_mutex_unlock(&data->lock);
}
