/*
 * Direct reads, the kvstore's side (common/cm_dp_direct.h): a session's
 * region, where its clusters go when it has one, and the three ops that let
 * its worker find and read them without a round trip per step.  We keep the
 * ownership: what goes in the region, its accounting, and the coldness of
 * every cluster, which the worker reports after the fact in TOUCH batches.
 * The region's memory and its handover to the worker are the transport's
 * (kvs_dp_region.c), reached through data->xport (kvs_handler.h).
 */
#include <fcntl.h>
#include <string.h>

#include "common/cm_alloc.h"
#include "common/cm_dp_direct.h"
#include "common/cm_dp_prefix.h"
#include "common/cm_log.h"
#include "common/cm_time.h"
#include "kvstore/data/kvs_internal.h"

static CM_ALLOC_TAG(kvs_direct_tag, "kvs.direct");

/* Half again the reservation: clusters round up to whole pages. */
static uint64_t kvs_direct_size(const kvs_session_t *s)
{
    uint64_t r = s->reserved_bytes;
    return r > UINT64_MAX / 2 ? 0 : kvs_pool_round(r + r / 2);
}

/* Make s's region; lock held.  The pool lends an extent of the same size
 * that nobody touches, so that the pool's budget and pressure count the
 * region, and the session is charged for it once, up front.  With a spill
 * tier, the region's clusters are pinned (written out only at a clean stop);
 * what does not fit in it goes to the pool and may spill. */
static ri_status_t kvs_direct_make_locked(kvs_data_t *data, kvs_session_t *s)
{
    kvs_region_t *r;
    uint64_t bytes = kvs_direct_size(s);
    ri_status_t st;

    if (data->xport.ops == NULL || bytes == 0)
        return RI_ERR_UNSUPPORTED;
    r = cm_calloc(&kvs_direct_tag, 1, sizeof(*r));
    if (r == NULL)
        return RI_ERR_NOMEM;
    r->fd = -1;
    st = kvs_pool_alloc(data->pool, bytes, &r->hold_off);
    /* Unreferenced prefix blocks go before a live session's region; with a
     * spill tier they are written out with the lock released (the request
     * holds s; one lane serves s, so nobody else makes its region). */
    if (st == RI_ERR_NOSPACE && kvs_tier_reclaim_prefix_locked(data, bytes) > 0)
        st = s->dropped ? RI_ERR_NOT_FOUND : kvs_pool_alloc(data->pool, bytes, &r->hold_off);
    if (st != RI_OK)
        goto err_free;
    st = kvs_session_charge_locked(data, s, bytes);
    if (st != RI_OK)
        goto err_hold;
    st = data->xport.ops->region_alloc(data->xport.handle, bytes, &r->base, &r->fd);
    if (st != RI_OK)
        goto err_charge;
    r->bytes = bytes;
    s->region = r;
    data->direct_regions++;
    data->direct_bytes += bytes;
    cm_info("session %llu: direct region of %llu bytes", (unsigned long long)s->id, (unsigned long long)bytes);
    return RI_OK;

err_charge:
    kvs_session_uncharge_locked(data, s, bytes);
err_hold:
    kvs_pool_free(data->pool, r->hold_off, bytes);
err_free:
    cm_free(r);
    return st;
}

ri_status_t kvs_direct_map(kvs_data_t *data, kvs_session_t *s, const cm_wire_hdr_t *hdr, uint8_t **reply_p,
                           size_t *reply_len_p)
{
    cm_dp_map_t m;
    const char *name = data->xport.ops != NULL ? data->xport.ops->handover_name(data->xport.handle) : "";
    uint8_t *reply;
    ri_status_t st = RI_OK;

    if (hdr->meta_len != 0 || hdr->data_len != 0)
        return RI_ERR_PROTOCOL;
    pthread_mutex_lock(&data->lock);
    if (s->region == NULL)
        st = kvs_direct_make_locked(data, s);
    if (st != RI_OK)
        goto out;
    m = (cm_dp_map_t){.bytes = s->region->bytes, .name_len = (uint32_t)strlen(name), .name = name};
    reply = cm_malloc(&kvs_direct_tag, CM_DP_MAP_FIXED + m.name_len);
    if (reply == NULL) {
        st = RI_ERR_NOMEM;
        goto out;
    }
    cm_dp_map_encode(reply, &m);
    *reply_p = reply;
    *reply_len_p = CM_DP_MAP_FIXED + m.name_len;
out:
    pthread_mutex_unlock(&data->lock);
    return st;
}

ri_status_t kvs_direct_locate(kvs_data_t *data, kvs_session_t *s, const cm_wire_hdr_t *hdr, const uint8_t *body,
                              uint8_t **reply_p, size_t *reply_len_p)
{
    cm_dp_locate_t l;
    const kvs_table_t *t;
    uint8_t *reply;
    ri_status_t st;

    if (hdr->data_len != 0)
        return RI_ERR_PROTOCOL;
    st = cm_dp_locate_decode(body, hdr->meta_len, &l);
    if (st != RI_OK)
        return st;
    if (l.layer >= s->geo.layers || l.head >= s->geo.kv_heads)
        return RI_ERR_RANGE;
    reply = cm_malloc(&kvs_direct_tag, (size_t)l.count * 8u);
    if (reply == NULL)
        return RI_ERR_NOMEM;
    pthread_mutex_lock(&data->lock);
    t = &s->tables[(uint64_t)l.layer * s->geo.kv_heads + l.head];
    if (l.first > t->n || l.count > t->n - l.first) {
        pthread_mutex_unlock(&data->lock);
        cm_free(reply);
        return RI_ERR_RANGE;
    }
    for (uint32_t i = 0; i < l.count; i++) {
        kvs_cluster_t cv = kvs_table_get(t, l.first + i);
        const kvs_cluster_t *c = &cv;
        bool direct = c->direct && c->tier == KVS_TIER_POOL && s->region != NULL;
        uint64_t loc = direct ? c->off : CM_DP_NOT_DIRECT;
        if (c->tier == KVS_TIER_BLOCK && c->block <= CM_PFX_LOC_MAX_SLOT)
            loc = CM_PFX_LOC(c->block, c->off); /* read from the block's own mapping */
        cm_dp_put64(reply + 8u * i, loc);
    }
    pthread_mutex_unlock(&data->lock);
    *reply_p = reply;
    *reply_len_p = (size_t)l.count * 8u;
    return RI_OK;
}

ri_status_t kvs_direct_touch(kvs_data_t *data, kvs_session_t *s, const cm_wire_hdr_t *hdr, const uint8_t *body)
{
    uint32_t n, layer, head, id;
    uint64_t now = cm_time_ns();
    ri_status_t st;

    if (hdr->data_len != 0)
        return RI_ERR_PROTOCOL;
    st = cm_dp_touch_decode(body, hdr->meta_len, &n);
    if (st != RI_OK)
        return st;
    pthread_mutex_lock(&data->lock);
    /* All or nothing: a bad record changes no coldness. */
    for (uint32_t i = 0; i < n; i++) {
        cm_dp_touch_entry(body, i, &layer, &head, &id);
        if (layer >= s->geo.layers || head >= s->geo.kv_heads ||
            id >= s->tables[(uint64_t)layer * s->geo.kv_heads + head].n) {
            pthread_mutex_unlock(&data->lock);
            return RI_ERR_RANGE;
        }
    }
    for (uint32_t i = 0; i < n; i++) {
        cm_dp_touch_entry(body, i, &layer, &head, &id);
        kvs_cluster_t *own = kvs_table_own(&s->tables[(uint64_t)layer * s->geo.kv_heads + head], id);
        if (own != NULL)
            own->last_fetch_ns = now;
    }
    if (s->region != NULL)
        s->region->touches += n;
    data->direct_reads += n;
    pthread_mutex_unlock(&data->lock);
    return RI_OK;
}

bool kvs_direct_take_locked(kvs_session_t *s, uint64_t bytes, uint64_t *off_p)
{
    kvs_region_t *r = s->region;

    if (r == NULL || bytes == 0 || bytes > r->bytes - r->used)
        return false;
    *off_p = r->used;
    r->used += bytes;
    return true;
}

void kvs_direct_free_locked(kvs_data_t *data, kvs_session_t *s)
{
    kvs_region_t *r = s->region;

    if (r == NULL)
        return;
    if (data->xport.ops != NULL && r->base != NULL)
        data->xport.ops->region_free(data->xport.handle, r->base, r->bytes, r->fd);
    kvs_pool_free(data->pool, r->hold_off, r->bytes);
    data->direct_regions--;
    data->direct_bytes -= r->bytes;
    cm_free(r);
    s->region = NULL;
}

ri_status_t kvs_direct_handover(kvs_data_t *data, uint64_t session_id, const uint8_t secret[CM_WIRE_SECRET_SIZE],
                                uint32_t object, int *fd_p, uint64_t *bytes_p)
{
    kvs_session_t *s;
    ri_status_t st = RI_ERR_UNAUTHENTICATED;
    int fd;

    pthread_mutex_lock(&data->lock);
    s = kvs_session_find_locked(data, session_id);
    /* The secret is checked even for a session without a region, and every
     * refusal is the same: a caller learns nothing without the secret. */
    if (s == NULL || !cm_wire_secret_equal(s->secret, secret))
        goto out;
    if (object != 0) {
        st = kvs_prefix_handover_locked(s, object - 1u, fd_p, bytes_p);
        goto out;
    }
    if (s->region == NULL)
        goto out;
    fd = fcntl(s->region->fd, F_DUPFD_CLOEXEC, 0);
    if (fd < 0) {
        st = RI_ERR_NOMEM;
        goto out;
    }
    *fd_p = fd;
    *bytes_p = s->region->bytes;
    st = RI_OK;
out:
    pthread_mutex_unlock(&data->lock);
    return st;
}
