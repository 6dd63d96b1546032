/*
 * The data-plane op layouts: what follows the 64-byte wire header
 * (common/cm_wire.h) in each op's meta block, shared by the kvstore server
 * (kvstore/data) and the worker client (gpuworker/client), which may not include
 * each other.  Header-only (static inline) so that neither side needs the
 * other's library.  All integers little-endian; every decoder checks every
 * count against the bytes present (with overflow checks) before anything is
 * read, and writes its output only on success.  docs/kvstore-data.md has the
 * same tables in prose.
 *
 * Transport framing (UCX active messages): AM id CM_DP_AM_REQUEST carries
 * requests, CM_DP_AM_REPLY replies; the AM user header is the 64-byte wire
 * header; the AM payload is meta (meta_len bytes) || data (data_len bytes).
 *
 * Cluster data ("page format"): a cluster of n tokens is ceil(n / P) pages of
 * P = page_tokens tokens; a page is K[P][head_dim] then V[P][head_dim] in the
 * session dtype (2 bytes), tokens past n zero.  page_bytes = 4 * P * head_dim.
 * This one format is used on the wire, in the pool and in the worker cache.
 *
 * UPLOAD_CLUSTERS / APPEND_CLUSTERS request meta  ("clusters meta"):
 *   u32 layer, u32 n_heads, n_heads x {u32 head, u32 n_clusters},
 *   then per head in order n_clusters x u32 tokens.
 *   data: per head, per cluster, its pages.  UPLOAD needs the (layer, head)
 *   tables empty; APPEND adds after the clusters already there.
 *   reply meta: u32 n_heads, u32 0, n_heads x {u32 head, u32 first_id}.
 * REGISTER_CACHE request meta:
 *   u32 capacity_pages, u32 rkey_len, u64 recv_addr, u64 recv_len,
 *   u8 rkey[rkey_len] (the worker's receive buffer, packed by ucp_rkey_pack).
 *   rkey_len 0 selects "inline" delivery: misses travel in the FETCH_RANKED
 *   reply itself (see below) instead of RMA puts; recv_len still bounds them.
 *   reply meta: u32 cache_id, u32 0, u64 page_bytes.
 * FETCH_RANKED request meta:
 *   u32 cache_id, u32 layer, u32 n_heads, u32 0, u64 recv_offset,
 *   n_heads x {u32 head, u32 n_ids}, then per head n_ids x u32 cluster id in
 *   rank order (best first).
 *   reply meta: u32 n_heads, u32 n_entries, u32 n_pages, u32 n_evicted,
 *   u64 miss_bytes, n_heads x {u32 head, u32 n_ids},
 *   n_entries x entry {u32 cluster, u32 flags, u32 tokens, u32 n_pages,
 *   u32 page_index, u32 0, u64 recv_offset}, n_pages x u32 cache page,
 *   n_evicted x {u32 layer, u32 head, u32 cluster}.
 *   Misses are packed in entry order from recv_offset.  RMA caches: they are
 *   written (ucp_put) into the receive buffer before the reply is sent, and
 *   the reply's data_len is 0.  Inline caches: the reply's data block
 *   (data_len = miss_bytes) carries them, and the client receives it straight
 *   into its buffer at recv_offset (a UCX iov receive).
 * RELEASE request meta: u32 cache_id (0 = every cache this connection
 *   registered on the session), u32 0.  reply meta: empty.
 * PING: meta empty, data empty (session_id 0 needs no secret).
 * CONNECT: the first request of every connection, for a session that exists
 *   and with its secret: meta = the worker's UCX worker address (packed by
 *   ucp_worker_get_address, at most CM_DP_MAX_WORKER_ADDR bytes), data
 *   empty, sent inline (never rendezvous).  The server checks the secret,
 *   has the address parsed by a throw-away process first (UCX does not
 *   validate packed addresses: a malformed one crashes whoever unpacks it),
 *   then opens an endpoint of its own to it, with peer-failure handling, and
 *   answers this and every later request of the connection over that
 *   endpoint.  Requests arriving on a UCX connection that has not sent an
 *   accepted CONNECT are dropped unanswered (and counted); a refused CONNECT
 *   on a connection that already has an accepted one is answered over it.
 *   reply meta: empty.
 * DISCONNECT: the worker is going away: every cache the connection
 *   registered is released and the server closes its endpoint once the
 *   reply is out.  (A worker that dies without it is noticed by UCX's
 *   peer-failure handling, more slowly.)  meta and data empty; reply meta:
 *   empty.
 *
 * Addresses.  The kvstore has no data-plane listener, so no socket of ours
 * takes bytes from someone who has not authenticated: its data-plane address,
 * handed to workers only by CreateSession and Health over the authenticated
 * control API, is the packed UCX worker address of the data thread serving
 * the session, as text: "ucx:" then the bytes in lower-case hex
 * (cm_dp_addr_format / cm_dp_addr_parse).  The address names UCX's own
 * transports (shared memory, and the TCP interface of --dataplane-listen).
 */
#ifndef CM_DP_PROTO_H
#define CM_DP_PROTO_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include "retroinfer/status.h"

#define CM_DP_AM_REQUEST 17u
#define CM_DP_AM_REPLY 18u

#define CM_DP_MAX_HEADS 256u             /* heads in one message */
#define CM_DP_MAX_IDS (1u << 24)         /* clusters per head in one message */
#define CM_DP_MAX_RKEY 4096u             /* packed rkey bytes */
#define CM_DP_MAX_CLUSTER_TOKENS 65535u  /* tokens in one cluster */
#define CM_DP_MAX_WORKER_ADDR 2048u      /* packed UCX worker address bytes */
#define CM_DP_ADDR_PREFIX "ucx:"
#define CM_DP_ADDR_MAX (4u + 2u * CM_DP_MAX_WORKER_ADDR + 1u) /* text form with its NUL */

#define CM_DP_F_HIT 0x1u       /* entry: in the worker cache (pages listed) */
#define CM_DP_F_MISS 0x2u      /* entry: data written at recv_offset */
#define CM_DP_F_ADMITTED 0x4u  /* entry: a miss now given cache pages (listed) */
#define CM_DP_F_FROM_DISK 0x8u /* entry: a miss read back from the spill tier (informational) */

#define CM_DP_ENTRY_SIZE 32u
#define CM_DP_EVICT_SIZE 12u

static inline void cm_dp_put32(uint8_t *p, uint32_t v)
{
    for (int i = 0; i < 4; i++)
        p[i] = (uint8_t)(v >> (8 * i));
}

static inline void cm_dp_put64(uint8_t *p, uint64_t v)
{
    for (int i = 0; i < 8; i++)
        p[i] = (uint8_t)(v >> (8 * i));
}

static inline uint32_t cm_dp_get32(const uint8_t *p)
{
    return (uint32_t)p[0] | ((uint32_t)p[1] << 8) | ((uint32_t)p[2] << 16) | ((uint32_t)p[3] << 24);
}

static inline uint64_t cm_dp_get64(const uint8_t *p)
{
    return (uint64_t)cm_dp_get32(p) | ((uint64_t)cm_dp_get32(p + 4) << 32);
}

/* ---- clusters meta (UPLOAD / APPEND) ---- */

typedef struct cm_dp_clusters_view {
    uint32_t layer;            /* target layer */
    uint32_t n_heads;          /* heads described */
    uint64_t total_clusters;   /* sum of n_clusters */
    const uint8_t *heads;      /* n_heads x {head, n_clusters} */
    const uint8_t *tokens;     /* total_clusters x u32, head by head */
} cm_dp_clusters_view_t;

static inline uint32_t cm_dp_clusters_head(const cm_dp_clusters_view_t *v, uint32_t i)
{
    return cm_dp_get32(v->heads + 8u * i);
}

static inline uint32_t cm_dp_clusters_count(const cm_dp_clusters_view_t *v, uint32_t i)
{
    return cm_dp_get32(v->heads + 8u * i + 4);
}

/* Tokens of the k-th cluster over all heads (0 <= k < total_clusters). */
static inline uint32_t cm_dp_clusters_tokens(const cm_dp_clusters_view_t *v, uint64_t k)
{
    return cm_dp_get32(v->tokens + 4u * k);
}

static inline size_t cm_dp_clusters_meta_size(uint32_t n_heads, uint64_t total_clusters)
{
    return 8u + 8u * (size_t)n_heads + 4u * (size_t)total_clusters;
}

/* Parse a clusters meta block; RI_ERR_PROTOCOL / RI_ERR_TRUNCATED /
 * RI_ERR_TOO_LARGE when the counts and the bytes disagree. */
static inline ri_status_t cm_dp_clusters_decode(const void *meta, size_t len, cm_dp_clusters_view_t *v_p)
{
    const uint8_t *p = meta;
    cm_dp_clusters_view_t v = {0};

    if (meta == NULL || len < 8)
        return RI_ERR_TRUNCATED;
    v.layer = cm_dp_get32(p);
    v.n_heads = cm_dp_get32(p + 4);
    if (v.n_heads == 0)
        return RI_ERR_PROTOCOL;
    if (v.n_heads > CM_DP_MAX_HEADS)
        return RI_ERR_TOO_LARGE;
    if (len < 8u + 8u * (size_t)v.n_heads)
        return RI_ERR_TRUNCATED;
    v.heads = p + 8;
    v.total_clusters = 0;
    for (uint32_t i = 0; i < v.n_heads; i++) {
        uint32_t n = cm_dp_clusters_count(&v, i);
        if (n > CM_DP_MAX_IDS)
            return RI_ERR_TOO_LARGE;
        v.total_clusters += n; /* <= 2^8 * 2^24: no overflow */
    }
    if (v.total_clusters == 0)
        return RI_ERR_PROTOCOL;
    if (len != cm_dp_clusters_meta_size(v.n_heads, v.total_clusters))
        return len < cm_dp_clusters_meta_size(v.n_heads, v.total_clusters) ? RI_ERR_TRUNCATED : RI_ERR_PROTOCOL;
    v.tokens = v.heads + 8u * v.n_heads;
    *v_p = v;
    return RI_OK;
}

/* Write a clusters meta block; buf holds cm_dp_clusters_meta_size() bytes.
 * heads[i], counts[i] per head; tokens: all clusters head by head. */
static inline void cm_dp_clusters_encode(uint8_t *buf, uint32_t layer, uint32_t n_heads, const uint32_t *heads,
                                         const uint32_t *counts, const uint32_t *tokens)
{
    uint64_t total = 0;

    cm_dp_put32(buf, layer);
    cm_dp_put32(buf + 4, n_heads);
    for (uint32_t i = 0; i < n_heads; i++) {
        cm_dp_put32(buf + 8 + 8u * i, heads[i]);
        cm_dp_put32(buf + 12 + 8u * i, counts[i]);
        total += counts[i];
    }
    for (uint64_t k = 0; k < total; k++)
        cm_dp_put32(buf + 8 + 8u * n_heads + 4u * k, tokens[k]);
}

/* ---- REGISTER_CACHE ---- */

typedef struct cm_dp_register {
    uint32_t capacity_pages;   /* worker cache size in pages */
    uint32_t rkey_len;         /* packed rkey bytes */
    uint64_t recv_addr;        /* worker receive buffer address */
    uint64_t recv_len;         /* and length */
    const uint8_t *rkey;       /* points into the meta block */
} cm_dp_register_t;

#define CM_DP_REGISTER_FIXED 24u

static inline ri_status_t cm_dp_register_decode(const void *meta, size_t len, cm_dp_register_t *r_p)
{
    const uint8_t *p = meta;
    cm_dp_register_t r = {0};

    if (meta == NULL || len < CM_DP_REGISTER_FIXED)
        return RI_ERR_TRUNCATED;
    r.capacity_pages = cm_dp_get32(p);
    r.rkey_len = cm_dp_get32(p + 4);
    r.recv_addr = cm_dp_get64(p + 8);
    r.recv_len = cm_dp_get64(p + 16);
    if (r.capacity_pages == 0)
        return RI_ERR_PROTOCOL;
    if (r.rkey_len > CM_DP_MAX_RKEY)
        return RI_ERR_TOO_LARGE;
    if (len != CM_DP_REGISTER_FIXED + (size_t)r.rkey_len)
        return len < CM_DP_REGISTER_FIXED + (size_t)r.rkey_len ? RI_ERR_TRUNCATED : RI_ERR_PROTOCOL;
    if (r.recv_addr > UINT64_MAX - r.recv_len)
        return RI_ERR_RANGE;
    r.rkey = p + CM_DP_REGISTER_FIXED;
    *r_p = r;
    return RI_OK;
}

/* The fixed 24 bytes only (an inline-delivery cache has no rkey). */
static inline void cm_dp_register_encode_fixed(uint8_t buf[CM_DP_REGISTER_FIXED], const cm_dp_register_t *r)
{
    cm_dp_put32(buf, r->capacity_pages);
    cm_dp_put32(buf + 4, r->rkey_len);
    cm_dp_put64(buf + 8, r->recv_addr);
    cm_dp_put64(buf + 16, r->recv_len);
}

/* Fixed part and rkey; buf holds CM_DP_REGISTER_FIXED + r->rkey_len bytes. */
static inline void cm_dp_register_encode(uint8_t *buf, const cm_dp_register_t *r)
{
    cm_dp_register_encode_fixed(buf, r);
    if (r->rkey_len > 0)
        memcpy(buf + CM_DP_REGISTER_FIXED, r->rkey, r->rkey_len);
}

/* ---- FETCH_RANKED request ---- */

typedef struct cm_dp_fetch_view {
    uint32_t cache_id, layer, n_heads;
    uint64_t recv_offset;
    uint64_t total_ids;
    const uint8_t *heads;      /* n_heads x {head, n_ids} */
    const uint8_t *ids;        /* total_ids x u32 */
} cm_dp_fetch_view_t;

#define CM_DP_FETCH_FIXED 24u

static inline size_t cm_dp_fetch_meta_size(uint32_t n_heads, uint64_t total_ids)
{
    return CM_DP_FETCH_FIXED + 8u * (size_t)n_heads + 4u * (size_t)total_ids;
}

static inline ri_status_t cm_dp_fetch_decode(const void *meta, size_t len, cm_dp_fetch_view_t *v_p)
{
    const uint8_t *p = meta;
    cm_dp_fetch_view_t v = {0};

    if (meta == NULL || len < CM_DP_FETCH_FIXED)
        return RI_ERR_TRUNCATED;
    v.cache_id = cm_dp_get32(p);
    v.layer = cm_dp_get32(p + 4);
    v.n_heads = cm_dp_get32(p + 8);
    if (cm_dp_get32(p + 12) != 0 || v.n_heads == 0)
        return RI_ERR_PROTOCOL;
    if (v.n_heads > CM_DP_MAX_HEADS)
        return RI_ERR_TOO_LARGE;
    v.recv_offset = cm_dp_get64(p + 16);
    if (len < CM_DP_FETCH_FIXED + 8u * (size_t)v.n_heads)
        return RI_ERR_TRUNCATED;
    v.heads = p + CM_DP_FETCH_FIXED;
    v.total_ids = 0;
    for (uint32_t i = 0; i < v.n_heads; i++) {
        uint32_t n = cm_dp_get32(v.heads + 8u * i + 4);
        if (n > CM_DP_MAX_IDS)
            return RI_ERR_TOO_LARGE;
        v.total_ids += n;
    }
    if (len != cm_dp_fetch_meta_size(v.n_heads, v.total_ids))
        return len < cm_dp_fetch_meta_size(v.n_heads, v.total_ids) ? RI_ERR_TRUNCATED : RI_ERR_PROTOCOL;
    v.ids = v.heads + 8u * v.n_heads;
    *v_p = v;
    return RI_OK;
}

static inline void cm_dp_fetch_encode(uint8_t *buf, uint32_t cache_id, uint32_t layer, uint64_t recv_offset,
                                      uint32_t n_heads, const uint32_t *heads, const uint32_t *counts,
                                      const uint32_t *ids)
{
    uint64_t total = 0;

    cm_dp_put32(buf, cache_id);
    cm_dp_put32(buf + 4, layer);
    cm_dp_put32(buf + 8, n_heads);
    cm_dp_put32(buf + 12, 0);
    cm_dp_put64(buf + 16, recv_offset);
    for (uint32_t i = 0; i < n_heads; i++) {
        cm_dp_put32(buf + CM_DP_FETCH_FIXED + 8u * i, heads[i]);
        cm_dp_put32(buf + CM_DP_FETCH_FIXED + 8u * i + 4, counts[i]);
        total += counts[i];
    }
    for (uint64_t k = 0; k < total; k++)
        cm_dp_put32(buf + CM_DP_FETCH_FIXED + 8u * n_heads + 4u * k, ids[k]);
}

/* ---- FETCH_RANKED reply ---- */

typedef struct cm_dp_entry {
    uint32_t cluster;      /* cluster id */
    uint32_t flags;        /* CM_DP_F_* */
    uint32_t tokens;       /* tokens in the cluster */
    uint32_t n_pages;      /* its pages */
    uint32_t page_index;   /* HIT or ADMITTED: first of n_pages in the page list */
    uint64_t recv_offset;  /* MISS: where its pages were written */
} cm_dp_entry_t;

typedef struct cm_dp_evict {
    uint32_t layer, head, cluster;
} cm_dp_evict_t;

typedef struct cm_dp_fetch_reply_view {
    uint32_t n_heads, n_entries, n_pages, n_evicted;
    uint64_t miss_bytes;
    const uint8_t *heads, *entries, *pages, *evicted;
} cm_dp_fetch_reply_view_t;

#define CM_DP_FETCH_REPLY_FIXED 24u

static inline size_t cm_dp_fetch_reply_size(uint32_t n_heads, uint32_t n_entries, uint32_t n_pages,
                                            uint32_t n_evicted)
{
    return CM_DP_FETCH_REPLY_FIXED + 8u * (size_t)n_heads + CM_DP_ENTRY_SIZE * (size_t)n_entries +
           4u * (size_t)n_pages + CM_DP_EVICT_SIZE * (size_t)n_evicted;
}

static inline void cm_dp_fetch_reply_header(uint8_t *buf, uint32_t n_heads, uint32_t n_entries, uint32_t n_pages,
                                            uint32_t n_evicted, uint64_t miss_bytes)
{
    cm_dp_put32(buf, n_heads);
    cm_dp_put32(buf + 4, n_entries);
    cm_dp_put32(buf + 8, n_pages);
    cm_dp_put32(buf + 12, n_evicted);
    cm_dp_put64(buf + 16, miss_bytes);
}

static inline void cm_dp_entry_encode(uint8_t *p, const cm_dp_entry_t *e)
{
    cm_dp_put32(p, e->cluster);
    cm_dp_put32(p + 4, e->flags);
    cm_dp_put32(p + 8, e->tokens);
    cm_dp_put32(p + 12, e->n_pages);
    cm_dp_put32(p + 16, e->page_index);
    cm_dp_put32(p + 20, 0);
    cm_dp_put64(p + 24, e->recv_offset);
}

/* Decode and check a reply: counts vs bytes; per entry page ranges inside the
 * page list and flags sane; the heads' n_ids sum to n_entries. */
static inline ri_status_t cm_dp_fetch_reply_decode(const void *meta, size_t len, cm_dp_fetch_reply_view_t *v_p)
{
    const uint8_t *p = meta;
    cm_dp_fetch_reply_view_t v = {0};
    uint64_t sum = 0;

    if (meta == NULL || len < CM_DP_FETCH_REPLY_FIXED)
        return RI_ERR_TRUNCATED;
    v.n_heads = cm_dp_get32(p);
    v.n_entries = cm_dp_get32(p + 4);
    v.n_pages = cm_dp_get32(p + 8);
    v.n_evicted = cm_dp_get32(p + 12);
    v.miss_bytes = cm_dp_get64(p + 16);
    if (v.n_heads > CM_DP_MAX_HEADS || v.n_entries > CM_DP_MAX_IDS * 16u || v.n_pages > (1u << 30) ||
        v.n_evicted > (1u << 30))
        return RI_ERR_TOO_LARGE;
    if (len != cm_dp_fetch_reply_size(v.n_heads, v.n_entries, v.n_pages, v.n_evicted))
        return RI_ERR_PROTOCOL;
    v.heads = p + CM_DP_FETCH_REPLY_FIXED;
    v.entries = v.heads + 8u * v.n_heads;
    v.pages = v.entries + CM_DP_ENTRY_SIZE * (size_t)v.n_entries;
    v.evicted = v.pages + 4u * (size_t)v.n_pages;
    for (uint32_t i = 0; i < v.n_heads; i++)
        sum += cm_dp_get32(v.heads + 8u * i + 4);
    if (sum != v.n_entries)
        return RI_ERR_PROTOCOL;
    for (uint32_t i = 0; i < v.n_entries; i++) {
        const uint8_t *e = v.entries + CM_DP_ENTRY_SIZE * (size_t)i;
        uint32_t flags = cm_dp_get32(e + 4), np = cm_dp_get32(e + 12), pi = cm_dp_get32(e + 16);
        bool hit = flags & CM_DP_F_HIT, miss = flags & CM_DP_F_MISS;
        if ((flags & ~(CM_DP_F_HIT | CM_DP_F_MISS | CM_DP_F_ADMITTED | CM_DP_F_FROM_DISK)) || hit == miss ||
            (hit && (flags & (CM_DP_F_ADMITTED | CM_DP_F_FROM_DISK))) || np == 0)
            return RI_ERR_PROTOCOL;
        if ((hit || (flags & CM_DP_F_ADMITTED)) && ((uint64_t)pi + np > v.n_pages))
            return RI_ERR_PROTOCOL;
        if (miss && cm_dp_get64(e + 24) > UINT64_MAX / 2)
            return RI_ERR_PROTOCOL;
    }
    *v_p = v;
    return RI_OK;
}

static inline uint32_t cm_dp_reply_head(const cm_dp_fetch_reply_view_t *v, uint32_t i)
{
    return cm_dp_get32(v->heads + 8u * i);
}

static inline uint32_t cm_dp_reply_head_ids(const cm_dp_fetch_reply_view_t *v, uint32_t i)
{
    return cm_dp_get32(v->heads + 8u * i + 4);
}

static inline void cm_dp_reply_entry(const cm_dp_fetch_reply_view_t *v, uint32_t i, cm_dp_entry_t *e)
{
    const uint8_t *p = v->entries + CM_DP_ENTRY_SIZE * (size_t)i;
    e->cluster = cm_dp_get32(p);
    e->flags = cm_dp_get32(p + 4);
    e->tokens = cm_dp_get32(p + 8);
    e->n_pages = cm_dp_get32(p + 12);
    e->page_index = cm_dp_get32(p + 16);
    e->recv_offset = cm_dp_get64(p + 24);
}

static inline uint32_t cm_dp_reply_page(const cm_dp_fetch_reply_view_t *v, uint32_t i)
{
    return cm_dp_get32(v->pages + 4u * (size_t)i);
}

static inline void cm_dp_reply_evicted(const cm_dp_fetch_reply_view_t *v, uint32_t i, cm_dp_evict_t *e)
{
    const uint8_t *p = v->evicted + CM_DP_EVICT_SIZE * (size_t)i;
    e->layer = cm_dp_get32(p);
    e->head = cm_dp_get32(p + 4);
    e->cluster = cm_dp_get32(p + 8);
}

/* Text form of a packed worker address into out (cap bytes, NUL-terminated).
 * RI_ERR_TOO_LARGE when it does not fit or len exceeds CM_DP_MAX_WORKER_ADDR. */
static inline ri_status_t cm_dp_addr_format(const void *addr, size_t len, char *out, size_t cap)
{
    static const char hex[] = "0123456789abcdef";
    const uint8_t *a = (const uint8_t *)addr;
    size_t pre = sizeof(CM_DP_ADDR_PREFIX) - 1;
    if (len == 0 || len > CM_DP_MAX_WORKER_ADDR || cap < pre + 2 * len + 1)
        return RI_ERR_TOO_LARGE;
    memcpy(out, CM_DP_ADDR_PREFIX, pre);
    for (size_t i = 0; i < len; i++) {
        out[pre + 2 * i] = hex[a[i] >> 4];
        out[pre + 2 * i + 1] = hex[a[i] & 15];
    }
    out[pre + 2 * len] = '\0';
    return RI_OK;
}

static inline int cm_dp_hex_digit(char c)
{
    if (c >= '0' && c <= '9')
        return c - '0';
    if (c >= 'a' && c <= 'f')
        return c - 'a' + 10;
    if (c >= 'A' && c <= 'F')
        return c - 'A' + 10;
    return -1;
}

/* Parse the text form into out (cap bytes); *len_p = bytes.  RI_ERR_INVALID
 * for anything that is not "ucx:" and an even, non-empty run of hex digits
 * (e.g. an old "host:port" address), RI_ERR_TOO_LARGE past cap. */
static inline ri_status_t cm_dp_addr_parse(const char *text, uint8_t *out, size_t cap, size_t *len_p)
{
    size_t pre = sizeof(CM_DP_ADDR_PREFIX) - 1, n;
    if (text == NULL || strncmp(text, CM_DP_ADDR_PREFIX, pre) != 0)
        return RI_ERR_INVALID;
    text += pre;
    n = strlen(text);
    if (n == 0 || n % 2 != 0)
        return RI_ERR_INVALID;
    if (n / 2 > cap)
        return RI_ERR_TOO_LARGE;
    for (size_t i = 0; i < n / 2; i++) {
        int hi = cm_dp_hex_digit(text[2 * i]), lo = cm_dp_hex_digit(text[2 * i + 1]);
        if (hi < 0 || lo < 0)
            return RI_ERR_INVALID;
        out[i] = (uint8_t)(hi << 4 | lo);
    }
    *len_p = n / 2;
    return RI_OK;
}

#endif /* CM_DP_PROTO_H */
