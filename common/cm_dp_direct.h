/*
 * Direct reads: the op layouts that let a worker read its session's clusters
 * without a round trip through the kvstore's threads (docs/kvstore-data.md,
 * "Direct reads").  Same conventions as common/cm_dp_proto.h (little-endian,
 * every decoder checks counts against the bytes present before reading and
 * writes its output only on success).
 *
 * The kvstore gives a session that asks for it a region of its own: an
 * anonymous memory file (memfd) holding only that session's clusters, with
 * no name anywhere (not in /dev/shm, not in /proc/sysvipc).  The worker
 * gets the file itself, as a descriptor passed over a unix-domain socket
 * (SCM_RIGHTS), after proving there that it holds the session's secret, and
 * maps it read-only (the file is sealed: its size never changes, and no
 * mapping but the kvstore's own can write it).  Two steps, because UCX
 * cannot carry a descriptor:
 *
 * MAP request (data plane, authenticated like every op): meta and data empty.
 *   reply meta: u64 bytes (the region's length), u32 name_len, u32 0,
 *   u8 name[name_len]: the handover socket's name in the abstract namespace
 *   (without the leading NUL byte).  MAP makes the region if the session
 *   has none.  RI_ERR_UNSUPPORTED when the daemon cannot give one (no
 *   expected size, no memory): the worker stays two-sided.
 * Handover (the unix socket): the worker connects to the name, sends
 *   CM_DP_HANDOVER_REQ bytes: u32 CM_DP_HANDOVER_MAGIC, u32 version (1),
 *   u64 session_id, u8 secret[CM_WIRE_SECRET_SIZE]; or, version 2,
 *   CM_DP_HANDOVER_REQ2 bytes: the same then u32 object, u32 0, where
 *   object 0 is the session's region and slot + 1 the prefix block attached
 *   to the session at that slot (cm_dp_prefix.h); the kvstore answers
 *   CM_DP_HANDOVER_REP bytes: i32 status, u32 0, u64 bytes, with the
 *   region's descriptor attached when status is RI_OK.  A wrong secret, an
 *   unknown session and a session without a region (no MAP yet) answer
 *   alike: RI_ERR_UNAUTHENTICATED, no descriptor.  A worker that cannot
 *   reach the name (another host, another network namespace) stays
 *   two-sided.
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
#include "common/cm_wire.h"

#define CM_DP_NOT_DIRECT UINT64_MAX
#define CM_DP_MAP_FIXED 16u
#define CM_DP_MAX_SOCK_NAME 100u  /* fits sockaddr_un's sun_path after the NUL */
#define CM_DP_HANDOVER_MAGIC 0x52494844u /* "RIHD" */
#define CM_DP_HANDOVER_VERSION 1u
#define CM_DP_HANDOVER_VERSION2 2u
#define CM_DP_HANDOVER_REQ (16u + CM_WIRE_SECRET_SIZE)
#define CM_DP_HANDOVER_REQ2 (CM_DP_HANDOVER_REQ + 8u)
#define CM_DP_HANDOVER_REP 16u
#define CM_DP_LOCATE_SIZE 16u
#define CM_DP_TOUCH_FIXED 8u
#define CM_DP_TOUCH_ENTRY 12u
#define CM_DP_MAX_TOUCH 65536u   /* access records in one TOUCH */

typedef struct cm_dp_map {
    uint64_t bytes;
    uint32_t name_len;
    const char *name;          /* points into the meta block, not NUL-terminated */
} cm_dp_map_t;

static inline ri_status_t cm_dp_map_decode(const void *meta, size_t len, cm_dp_map_t *m_p)
{
    const uint8_t *p = meta;
    cm_dp_map_t m = {0};

    if (meta == NULL || len < CM_DP_MAP_FIXED)
        return RI_ERR_TRUNCATED;
    m.bytes = cm_dp_get64(p);
    m.name_len = cm_dp_get32(p + 8);
    if (m.name_len == 0 || m.name_len > CM_DP_MAX_SOCK_NAME || m.bytes == 0 || cm_dp_get32(p + 12) != 0)
        return RI_ERR_PROTOCOL;
    if (len != CM_DP_MAP_FIXED + (size_t)m.name_len || memchr(p + CM_DP_MAP_FIXED, 0, m.name_len) != NULL)
        return RI_ERR_PROTOCOL;
    m.name = (const char *)(p + CM_DP_MAP_FIXED);
    *m_p = m;
    return RI_OK;
}

/* buf holds CM_DP_MAP_FIXED + m->name_len bytes. */
static inline void cm_dp_map_encode(uint8_t *buf, const cm_dp_map_t *m)
{
    cm_dp_put64(buf, m->bytes);
    cm_dp_put32(buf + 8, m->name_len);
    cm_dp_put32(buf + 12, 0);
    memcpy(buf + CM_DP_MAP_FIXED, m->name, m->name_len);
}

static inline void cm_dp_handover_req_encode(uint8_t buf[CM_DP_HANDOVER_REQ], uint64_t session_id,
                                             const uint8_t secret[CM_WIRE_SECRET_SIZE])
{
    cm_dp_put32(buf, CM_DP_HANDOVER_MAGIC);
    cm_dp_put32(buf + 4, CM_DP_HANDOVER_VERSION);
    cm_dp_put64(buf + 8, session_id);
    memcpy(buf + 16, secret, CM_WIRE_SECRET_SIZE);
}

/* Version 2: names the object (0 = region, slot + 1 = attached block). */
static inline void cm_dp_handover_req2_encode(uint8_t buf[CM_DP_HANDOVER_REQ2], uint64_t session_id,
                                              const uint8_t secret[CM_WIRE_SECRET_SIZE], uint32_t object)
{
    cm_dp_handover_req_encode(buf, session_id, secret);
    cm_dp_put32(buf + 4, CM_DP_HANDOVER_VERSION2);
    cm_dp_put32(buf + CM_DP_HANDOVER_REQ, object);
    cm_dp_put32(buf + CM_DP_HANDOVER_REQ + 4, 0);
}

/* Bytes of a request whose first CM_DP_HANDOVER_REQ bytes are buf: the
 * version decides (0 when it is neither, or the magic is wrong). */
static inline size_t cm_dp_handover_req_size(const uint8_t buf[CM_DP_HANDOVER_REQ])
{
    if (cm_dp_get32(buf) != CM_DP_HANDOVER_MAGIC)
        return 0;
    if (cm_dp_get32(buf + 4) == CM_DP_HANDOVER_VERSION)
        return CM_DP_HANDOVER_REQ;
    return cm_dp_get32(buf + 4) == CM_DP_HANDOVER_VERSION2 ? CM_DP_HANDOVER_REQ2 : 0;
}

/* Either version; secret_p points into buf on success; *object_p is 0 for
 * version 1. */
static inline ri_status_t cm_dp_handover_req_decode(const uint8_t *buf, size_t len, uint64_t *session_id_p,
                                                    const uint8_t **secret_p, uint32_t *object_p)
{
    size_t want;

    if (len < CM_DP_HANDOVER_REQ)
        return RI_ERR_TRUNCATED;
    want = cm_dp_handover_req_size(buf);
    if (want == 0)
        return RI_ERR_PROTOCOL;
    if (len != want)
        return len < want ? RI_ERR_TRUNCATED : RI_ERR_PROTOCOL;
    if (want == CM_DP_HANDOVER_REQ2 && cm_dp_get32(buf + CM_DP_HANDOVER_REQ + 4) != 0)
        return RI_ERR_PROTOCOL;
    *session_id_p = cm_dp_get64(buf + 8);
    *secret_p = buf + 16;
    *object_p = want == CM_DP_HANDOVER_REQ2 ? cm_dp_get32(buf + CM_DP_HANDOVER_REQ) : 0;
    return RI_OK;
}

static inline void cm_dp_handover_rep_encode(uint8_t buf[CM_DP_HANDOVER_REP], ri_status_t st, uint64_t bytes)
{
    cm_dp_put32(buf, (uint32_t)(int32_t)st);
    cm_dp_put32(buf + 4, 0);
    cm_dp_put64(buf + 8, bytes);
}

static inline void cm_dp_handover_rep_decode(const uint8_t buf[CM_DP_HANDOVER_REP], ri_status_t *st_p,
                                             uint64_t *bytes_p)
{
    *st_p = (ri_status_t)(int32_t)cm_dp_get32(buf);
    *bytes_p = cm_dp_get64(buf + 8);
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
