/*
 * Direct reads: the op layouts that let a worker read its session's clusters
 * without a round trip through the kvstore's threads (docs/kvstore-data.md,
 * "Direct reads").  Same conventions as common/cm_dp_proto.h (little-endian,
 * every decoder checks counts against the bytes present before reading and
 * writes its output only on success).
 *
 * The kvstore gives a session that asks for it a region of its own: memory
 * allocated through UCX (shared memory on one host), holding only that
 * session's clusters.  The worker unpacks the region's key and maps it; a
 * key covers its own region only, never the pool or another session.
 *
 * MAP request: meta and data empty.
 *   reply meta: u64 base (the region's address in the kvstore), u64 bytes,
 *   u32 rkey_len, u32 0, u8 rkey[rkey_len] (ucp_rkey_pack).
 *   RI_ERR_UNSUPPORTED when the daemon cannot give one (spill tier on, no
 *   expected size, UCX could not allocate): the worker stays two-sided.
 * LOCATE request meta: u32 layer, u32 head, u32 first, u32 count.
 *   reply meta: count x u64 offset of the cluster's first page from base,
 *   CM_DP_NOT_DIRECT for a cluster that is not in the region (uploaded
 *   before MAP, or after the region filled up: fetch it two-sided).
 * TOUCH request meta: u32 n, u32 0, n x {u32 layer, u32 head, u32 id}: the
 *   clusters a worker read directly since its last TOUCH (coldness and
 *   counters; the worker does not wait for it).  reply meta: empty.
 */
#ifndef CM_DP_DIRECT_H
#define CM_DP_DIRECT_H

#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include "common/cm_dp_proto.h"

#define CM_DP_NOT_DIRECT UINT64_MAX
#define CM_DP_MAP_FIXED 24u
#define CM_DP_LOCATE_SIZE 16u
#define CM_DP_TOUCH_FIXED 8u
#define CM_DP_TOUCH_ENTRY 12u
#define CM_DP_MAX_TOUCH 65536u   /* access records in one TOUCH */

typedef struct cm_dp_map {
    uint64_t base, bytes;
    uint32_t rkey_len;
    const uint8_t *rkey;       /* points into the meta block */
} cm_dp_map_t;

static inline ri_status_t cm_dp_map_decode(const void *meta, size_t len, cm_dp_map_t *m_p)
{
    const uint8_t *p = meta;
    cm_dp_map_t m = {0};

    if (meta == NULL || len < CM_DP_MAP_FIXED)
        return RI_ERR_TRUNCATED;
    m.base = cm_dp_get64(p);
    m.bytes = cm_dp_get64(p + 8);
    m.rkey_len = cm_dp_get32(p + 16);
    if (m.rkey_len == 0 || m.rkey_len > CM_DP_MAX_RKEY || m.bytes == 0 || m.base > UINT64_MAX - m.bytes)
        return RI_ERR_PROTOCOL;
    if (len != CM_DP_MAP_FIXED + (size_t)m.rkey_len)
        return RI_ERR_PROTOCOL;
    m.rkey = p + CM_DP_MAP_FIXED;
    *m_p = m;
    return RI_OK;
}

/* buf holds CM_DP_MAP_FIXED + m->rkey_len bytes. */
static inline void cm_dp_map_encode(uint8_t *buf, const cm_dp_map_t *m)
{
    cm_dp_put64(buf, m->base);
    cm_dp_put64(buf + 8, m->bytes);
    cm_dp_put32(buf + 16, m->rkey_len);
    cm_dp_put32(buf + 20, 0);
    memcpy(buf + CM_DP_MAP_FIXED, m->rkey, m->rkey_len);
}

typedef struct cm_dp_locate {
    uint32_t layer, head, first, count;
} cm_dp_locate_t;

static inline ri_status_t cm_dp_locate_decode(const void *meta, size_t len, cm_dp_locate_t *l_p)
{
    const uint8_t *p = meta;
    cm_dp_locate_t l;

    if (meta == NULL || len != CM_DP_LOCATE_SIZE)
        return len < CM_DP_LOCATE_SIZE ? RI_ERR_TRUNCATED : RI_ERR_PROTOCOL;
    l = (cm_dp_locate_t){cm_dp_get32(p), cm_dp_get32(p + 4), cm_dp_get32(p + 8), cm_dp_get32(p + 12)};
    if (l.count == 0 || l.count > CM_DP_MAX_IDS)
        return RI_ERR_PROTOCOL;
    *l_p = l;
    return RI_OK;
}

static inline void cm_dp_locate_encode(uint8_t buf[CM_DP_LOCATE_SIZE], const cm_dp_locate_t *l)
{
    cm_dp_put32(buf, l->layer);
    cm_dp_put32(buf + 4, l->head);
    cm_dp_put32(buf + 8, l->first);
    cm_dp_put32(buf + 12, l->count);
}

/* TOUCH: n records; decode checks the length only (entries read in place). */
static inline ri_status_t cm_dp_touch_decode(const void *meta, size_t len, uint32_t *n_p)
{
    uint32_t n;

    if (meta == NULL || len < CM_DP_TOUCH_FIXED)
        return RI_ERR_TRUNCATED;
    n = cm_dp_get32(meta);
    if (n == 0 || n > CM_DP_MAX_TOUCH || cm_dp_get32((const uint8_t *)meta + 4) != 0)
        return RI_ERR_PROTOCOL;
    if (len != CM_DP_TOUCH_FIXED + (size_t)n * CM_DP_TOUCH_ENTRY)
        return RI_ERR_PROTOCOL;
    *n_p = n;
    return RI_OK;
}

static inline void cm_dp_touch_entry(const void *meta, uint32_t i, uint32_t *layer, uint32_t *head, uint32_t *id)
{
    const uint8_t *e = (const uint8_t *)meta + CM_DP_TOUCH_FIXED + (size_t)i * CM_DP_TOUCH_ENTRY;
    *layer = cm_dp_get32(e);
    *head = cm_dp_get32(e + 4);
    *id = cm_dp_get32(e + 8);
}

#endif /* CM_DP_DIRECT_H */
