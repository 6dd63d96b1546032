/*
 * Prefix blocks: the data-plane ops and the block format through which a
 * prompt prefix prefilled once is served to every later session that starts
 * with it (docs/prefix.md).  Same conventions as common/cm_dp_proto.h:
 * little-endian, every decoder checks counts against the bytes present
 * (with overflow checks) before anything is read and writes its output only
 * on success.  Shared by the kvstore (kvstore/data) and the worker client
 * (gpuworker/client), which may not include each other.
 *
 * A prompt's tokens are cut into blocks of B tokens at absolute positions
 * (block b = positions [b*B, (b+1)*B)).  The worker names each block by a
 * 32-byte key chained over the previous block's key, the block's token ids
 * and everything that changes its K/V or its index (gpuworker/client); the
 * kvstore treats keys as opaque and keeps them per tenant: a lookup only
 * ever sees the caller's own tenant's blocks.
 *
 * A block ("RIPB" v1) is immutable once published.  Layout, every section
 * starting at a multiple of 8 bytes from the block's start:
 *
 *   header (CM_PFX_HDR_SIZE = 64 bytes):
 *     u32 magic CM_PFX_MAGIC, u32 version CM_PFX_VERSION,
 *     u32 layers, u32 kv_heads, u32 head_dim, u32 dtype (cm_wire dtype),
 *     u32 page_tokens, u32 first_pos (b*B), u32 n_tokens (B),
 *     u32 crc32c (CRC32C of every byte after the header),
 *     u64 tables_bytes, u64 worker_bytes, u64 pages_bytes
 *     (the three sections' lengths; each a multiple of 8)
 *   tables: for each table t = layer * kv_heads + head, in order:
 *     u32 n_clusters[t]; then, table by table, n_clusters[t] x u32 tokens.
 *     Zero-padded to a multiple of 8.  A table with no clusters is a
 *     (layer, head) the block does not index (a layer without a wave index,
 *     a block of a "full" worker); every cluster has 1..CM_DP_MAX_CLUSTER_TOKENS
 *     tokens and a table's clusters hold at most n_tokens tokens.
 *   worker: bytes the kvstore stores and serves but never reads: the
 *     worker's index pieces (token permutation, centroids, value means)
 *     and the K/V of the block's tokens that are in no cluster (sinks,
 *     layers without an index), in the layout gpuworker/client defines
 *     (gw_prefix.h).
 *   pages: for each table in order, for each of its clusters, its
 *     ceil(tokens / page_tokens) pages in page format (cm_dp_proto.h),
 *     page_bytes = 4 * page_tokens * head_dim.  The kvstore serves these
 *     as the clusters of every session the block is attached to.
 *
 * A session's cluster tables hold, first, the clusters of the blocks
 * attached to it, block after block in attach order, then its own uploads
 * (APPEND_CLUSTERS after an attach: UPLOAD_CLUSTERS needs empty tables).
 * Cluster ids are positions in those tables, as for its own clusters, so
 * FETCH_RANKED, LOCATE and TOUCH name an attached block's clusters exactly
 * as they name the session's own.
 *
 * PREFIX_ATTACH request meta: u32 n_keys (1..CM_PFX_MAX_KEYS), u32 flags,
 *   n_keys x u8 key[CM_PFX_KEY_SIZE].  flags: CM_PFX_ATTACH_F_SLOTS or 0
 *   (any other bit: RI_ERR_PROTOCOL).  With CM_PFX_ATTACH_F_SLOTS the
 *   session reads its blocks by slot only (PREFIX_GET, the handover), never
 *   a cluster by id: its tables gain no entries for them, now or for the
 *   blocks it attaches later (PREFIX_PUT included; the mode stays with the
 *   session).  A worker's prefix session, which preloads and publishes
 *   blocks for a sequence whose own session attaches them too, so holds no
 *   second descriptor of every cluster of the prefix.  Attaches to the session, in order,
 *   the leading keys the caller's tenant holds (reading back one that was
 *   spilled; one whose record fails its CRC is a miss and is dropped),
 *   stopping at the first it does not.  Each attached block is referenced
 *   (never evicted) until the session ends.
 *   reply meta: u32 n_attached, u32 0, n_attached x {u32 slot, u32 n_tokens,
 *   u64 block_bytes}.  slot: the block's attach index in the session (0..),
 *   what PREFIX_GET, the handover (object = slot + 1) and LOCATE name it by.
 * PREFIX_PUT request meta: u8 key[CM_PFX_KEY_SIZE]; data: the block.
 *   Publishes the block under key in the caller's tenant and attaches it.
 *   When the key exists already the stored block stands (immutable): it is
 *   attached if its header (all but the crc field, which covers pages that
 *   another prefill may round differently) and tables equal the sent
 *   block's (the worker's index then names the same clusters), else
 *   RI_ERR_EXISTS and nothing changes (the worker uploads those clusters as
 *   its own).
 *   RI_ERR_QUOTA over the tenant's prefix quota (after evicting its
 *   unreferenced blocks), RI_ERR_CORRUPT when the CRC does not match.
 *   reply meta: u32 slot, u32 flags (CM_PFX_F_EXISTED), u64 block_bytes.
 * PREFIX_GET request meta: u32 slot, u32 0, u64 offset, u64 length
 *   (length 0 = to the end).  reply meta: u64 block_bytes, u64 offset;
 *   data: the block's bytes [offset, offset + length) (for a worker that
 *   cannot map the block: another host).
 *
 * Direct reads: the handover (cm_dp_direct.h) names an object: 0 = the
 * session's region, slot + 1 = attached block `slot`, mapped read-only
 * (the block's memory file is sealed against every write).  LOCATE answers
 * for a cluster of an attached block CM_PFX_LOC(slot, offset): the offset
 * of its first page from the block's start, tagged with the slot.
 */
#ifndef CM_DP_PREFIX_H
#define CM_DP_PREFIX_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include "common/cm_dp_proto.h"
#include "retroinfer/status.h"

#define CM_PFX_MAGIC 0x42504952u /* "RIPB" */
#define CM_PFX_VERSION 1u
#define CM_PFX_HDR_SIZE 64u
#define CM_PFX_KEY_SIZE 32u
#define CM_PFX_MAX_KEYS 65536u           /* keys in one PREFIX_ATTACH (16M tokens at B = 256) */
#define CM_PFX_MAX_BLOCK_BYTES (UINT64_C(1) << 36) /* 64 GiB: a sanity bound, quotas decide */
#define CM_PFX_F_EXISTED 0x1u            /* PREFIX_PUT: the key was there; the stored block is attached */
#define CM_PFX_ATTACH_FIXED 8u
#define CM_PFX_ATTACH_F_SLOTS 0x1u       /* PREFIX_ATTACH: blocks read by slot only, no table entries */
#define CM_PFX_ATTACH_ENTRY 16u
#define CM_PFX_PUT_META CM_PFX_KEY_SIZE
#define CM_PFX_PUT_REPLY 16u
#define CM_PFX_GET_META 24u
#define CM_PFX_GET_REPLY 16u

/* LOCATE offsets of attached blocks' clusters: bit 62 set, the slot in bits
 * 40..61, the byte offset in bits 0..39 (a block is < 1 TiB).  Test
 * CM_DP_NOT_DIRECT (all ones) first: it has bit 62 set too. */
#define CM_PFX_LOC_TAG (UINT64_C(1) << 62)
#define CM_PFX_LOC_OFF_BITS 40u
#define CM_PFX_LOC_MAX_SLOT ((UINT32_C(1) << 22) - 1u)
#define CM_PFX_LOC(slot, off) (CM_PFX_LOC_TAG | ((uint64_t)(slot) << CM_PFX_LOC_OFF_BITS) | (uint64_t)(off))

static inline bool cm_pfx_loc_is_block(uint64_t loc)
{
    return loc != UINT64_MAX && (loc & CM_PFX_LOC_TAG) != 0;
}

static inline uint32_t cm_pfx_loc_slot(uint64_t loc)
{
    return (uint32_t)((loc & ~CM_PFX_LOC_TAG) >> CM_PFX_LOC_OFF_BITS);
}

static inline uint64_t cm_pfx_loc_off(uint64_t loc)
{
    return loc & ((UINT64_C(1) << CM_PFX_LOC_OFF_BITS) - 1u);
}

/* The header of a block. */
typedef struct cm_pfx_hdr {
    uint32_t layers, kv_heads, head_dim, dtype, page_tokens;
    uint32_t first_pos, n_tokens;
    uint32_t crc;
    uint64_t tables_bytes, worker_bytes, pages_bytes;
} cm_pfx_hdr_t;

/* A decoded block: pointers into the caller's buffer. */
typedef struct cm_pfx_view {
    cm_pfx_hdr_t hdr;
    uint32_t n_tables;             /* layers * kv_heads */
    uint64_t total_clusters;       /* over every table */
    const uint8_t *counts;         /* n_tables x u32 n_clusters */
    const uint8_t *sizes;          /* total_clusters x u32 tokens, table by table */
    const uint8_t *worker;         /* hdr.worker_bytes */
    const uint8_t *pages;          /* hdr.pages_bytes */
} cm_pfx_view_t;

static inline uint64_t cm_pfx_pad8(uint64_t n)
{
    return (n + 7u) & ~(uint64_t)7u;
}

/* Bytes of the tables section for n_tables tables and total clusters. */
static inline uint64_t cm_pfx_tables_bytes(uint32_t n_tables, uint64_t total_clusters)
{
    return cm_pfx_pad8(4u * ((uint64_t)n_tables + total_clusters));
}

static inline void cm_pfx_hdr_encode(uint8_t buf[CM_PFX_HDR_SIZE], const cm_pfx_hdr_t *h)
{
    memset(buf, 0, CM_PFX_HDR_SIZE);
    cm_dp_put32(buf, CM_PFX_MAGIC);
    cm_dp_put32(buf + 4, CM_PFX_VERSION);
    cm_dp_put32(buf + 8, h->layers);
    cm_dp_put32(buf + 12, h->kv_heads);
    cm_dp_put32(buf + 16, h->head_dim);
    cm_dp_put32(buf + 20, h->dtype);
    cm_dp_put32(buf + 24, h->page_tokens);
    cm_dp_put32(buf + 28, h->first_pos);
    cm_dp_put32(buf + 32, h->n_tokens);
    cm_dp_put32(buf + 36, h->crc);
    cm_dp_put64(buf + 40, h->tables_bytes);
    cm_dp_put64(buf + 48, h->worker_bytes);
    cm_dp_put64(buf + 56, h->pages_bytes);
}

/* Decode and check a whole block of len bytes (structure only: the CRC is
 * the caller's, over buf + CM_PFX_HDR_SIZE).  Checks: magic, version,
 * non-zero geometry, section lengths multiples of 8 that add up to len,
 * every cluster size in 1..CM_DP_MAX_CLUSTER_TOKENS, each table's tokens
 * <= n_tokens, the pages section exactly the clusters' pages. */
static inline ri_status_t cm_pfx_decode(const uint8_t *buf, uint64_t len, cm_pfx_view_t *v_p)
{
    cm_pfx_view_t v;
    uint64_t pages = 0, page_bytes;
    const uint8_t *p;

    memset(&v, 0, sizeof(v));
    if (buf == NULL || len < CM_PFX_HDR_SIZE)
        return RI_ERR_TRUNCATED;
    if (cm_dp_get32(buf) != CM_PFX_MAGIC)
        return RI_ERR_BAD_MAGIC;
    if (cm_dp_get32(buf + 4) != CM_PFX_VERSION)
        return RI_ERR_BAD_VERSION;
    v.hdr = (cm_pfx_hdr_t){cm_dp_get32(buf + 8),  cm_dp_get32(buf + 12), cm_dp_get32(buf + 16),
                           cm_dp_get32(buf + 20), cm_dp_get32(buf + 24), cm_dp_get32(buf + 28),
                           cm_dp_get32(buf + 32), cm_dp_get32(buf + 36), cm_dp_get64(buf + 40),
                           cm_dp_get64(buf + 48), cm_dp_get64(buf + 56)};
    const cm_pfx_hdr_t *h = &v.hdr;
    if (h->layers == 0 || h->kv_heads == 0 || h->head_dim == 0 || h->page_tokens == 0 || h->n_tokens == 0 ||
        h->layers > 4096u || h->kv_heads > CM_DP_MAX_HEADS || h->head_dim > 65536u ||
        h->page_tokens > CM_DP_MAX_CLUSTER_TOKENS)
        return RI_ERR_PROTOCOL;
    if ((h->tables_bytes | h->worker_bytes | h->pages_bytes) & 7u)
        return RI_ERR_PROTOCOL;
    if (h->tables_bytes > len || h->worker_bytes > len || h->pages_bytes > len ||
        CM_PFX_HDR_SIZE + h->tables_bytes + h->worker_bytes + h->pages_bytes != len)
        return len < CM_PFX_HDR_SIZE + h->tables_bytes ? RI_ERR_TRUNCATED : RI_ERR_PROTOCOL;
    v.n_tables = h->layers * h->kv_heads;
    if (4u * (uint64_t)v.n_tables > h->tables_bytes)
        return RI_ERR_TRUNCATED;
    v.counts = buf + CM_PFX_HDR_SIZE;
    for (uint32_t t = 0; t < v.n_tables; t++)
        v.total_clusters += cm_dp_get32(v.counts + 4u * t);
    if (cm_pfx_tables_bytes(v.n_tables, v.total_clusters) != h->tables_bytes)
        return RI_ERR_PROTOCOL;
    v.sizes = v.counts + 4u * (uint64_t)v.n_tables;
    page_bytes = 4u * (uint64_t)h->page_tokens * h->head_dim;
    p = v.sizes;
    for (uint32_t t = 0; t < v.n_tables; t++) {
        uint64_t tokens = 0;
        for (uint32_t j = cm_dp_get32(v.counts + 4u * t); j > 0; j--, p += 4) {
            uint32_t n = cm_dp_get32(p);
            if (n == 0 || n > CM_DP_MAX_CLUSTER_TOKENS)
                return RI_ERR_PROTOCOL;
            tokens += n;
            pages += (n + h->page_tokens - 1u) / h->page_tokens;
        }
        if (tokens > h->n_tokens)
            return RI_ERR_PROTOCOL;
    }
    if (pages * page_bytes != h->pages_bytes)
        return RI_ERR_PROTOCOL;
    v.worker = buf + CM_PFX_HDR_SIZE + h->tables_bytes;
    v.pages = v.worker + h->worker_bytes;
    *v_p = v;
    return RI_OK;
}

/* PREFIX_ATTACH request: keys is n x CM_PFX_KEY_SIZE bytes. */
static inline size_t cm_pfx_attach_req_size(uint32_t n)
{
    return CM_PFX_ATTACH_FIXED + (size_t)n * CM_PFX_KEY_SIZE;
}

static inline void cm_pfx_attach_req_encode(uint8_t *buf, uint32_t n, uint32_t flags, const uint8_t *keys)
{
    cm_dp_put32(buf, n);
    cm_dp_put32(buf + 4, flags);
    memcpy(buf + CM_PFX_ATTACH_FIXED, keys, (size_t)n * CM_PFX_KEY_SIZE);
}

/* keys_p points into meta on success. */
static inline ri_status_t cm_pfx_attach_req_decode(const uint8_t *meta, size_t len, uint32_t *n_p,
                                                   uint32_t *flags_p, const uint8_t **keys_p)
{
    uint32_t n;
    if (meta == NULL || len < CM_PFX_ATTACH_FIXED)
        return RI_ERR_TRUNCATED;
    n = cm_dp_get32(meta);
    if (n == 0 || n > CM_PFX_MAX_KEYS || (cm_dp_get32(meta + 4) & ~CM_PFX_ATTACH_F_SLOTS) != 0)
        return RI_ERR_PROTOCOL;
    *flags_p = cm_dp_get32(meta + 4);
    if (len != cm_pfx_attach_req_size(n))
        return len < cm_pfx_attach_req_size(n) ? RI_ERR_TRUNCATED : RI_ERR_PROTOCOL;
    *n_p = n;
    *keys_p = meta + CM_PFX_ATTACH_FIXED;
    return RI_OK;
}

/* One attached block in a PREFIX_ATTACH reply. */
typedef struct cm_pfx_attached {
    uint32_t slot, n_tokens;
    uint64_t block_bytes;
} cm_pfx_attached_t;

static inline size_t cm_pfx_attach_rep_size(uint32_t n)
{
    return CM_PFX_ATTACH_FIXED + (size_t)n * CM_PFX_ATTACH_ENTRY;
}

static inline void cm_pfx_attach_rep_encode(uint8_t *buf, uint32_t n, const cm_pfx_attached_t *a)
{
    cm_dp_put32(buf, n);
    cm_dp_put32(buf + 4, 0);
    for (uint32_t i = 0; i < n; i++) {
        uint8_t *e = buf + CM_PFX_ATTACH_FIXED + (size_t)i * CM_PFX_ATTACH_ENTRY;
        cm_dp_put32(e, a[i].slot);
        cm_dp_put32(e + 4, a[i].n_tokens);
        cm_dp_put64(e + 8, a[i].block_bytes);
    }
}

/* Decode into out (room for max entries); *n_p gets the count. */
static inline ri_status_t cm_pfx_attach_rep_decode(const uint8_t *meta, size_t len, uint32_t max,
                                                   cm_pfx_attached_t *out, uint32_t *n_p)
{
    uint32_t n;
    if (meta == NULL || len < CM_PFX_ATTACH_FIXED)
        return RI_ERR_TRUNCATED;
    n = cm_dp_get32(meta);
    if (n > max || n > CM_PFX_MAX_KEYS || cm_dp_get32(meta + 4) != 0 || len != cm_pfx_attach_rep_size(n))
        return RI_ERR_PROTOCOL;
    for (uint32_t i = 0; i < n; i++) {
        const uint8_t *e = meta + CM_PFX_ATTACH_FIXED + (size_t)i * CM_PFX_ATTACH_ENTRY;
        out[i] = (cm_pfx_attached_t){cm_dp_get32(e), cm_dp_get32(e + 4), cm_dp_get64(e + 8)};
    }
    *n_p = n;
    return RI_OK;
}

static inline void cm_pfx_put_rep_encode(uint8_t buf[CM_PFX_PUT_REPLY], uint32_t slot, uint32_t flags,
                                         uint64_t block_bytes)
{
    cm_dp_put32(buf, slot);
    cm_dp_put32(buf + 4, flags);
    cm_dp_put64(buf + 8, block_bytes);
}

static inline ri_status_t cm_pfx_put_rep_decode(const uint8_t *meta, size_t len, uint32_t *slot_p,
                                                uint32_t *flags_p, uint64_t *bytes_p)
{
    if (meta == NULL || len != CM_PFX_PUT_REPLY)
        return len < CM_PFX_PUT_REPLY ? RI_ERR_TRUNCATED : RI_ERR_PROTOCOL;
    if ((cm_dp_get32(meta + 4) & ~CM_PFX_F_EXISTED) != 0)
        return RI_ERR_PROTOCOL;
    *slot_p = cm_dp_get32(meta);
    *flags_p = cm_dp_get32(meta + 4);
    *bytes_p = cm_dp_get64(meta + 8);
    return RI_OK;
}

typedef struct cm_pfx_get {
    uint32_t slot;
    uint64_t offset, length;
} cm_pfx_get_t;

static inline void cm_pfx_get_encode(uint8_t buf[CM_PFX_GET_META], const cm_pfx_get_t *g)
{
    cm_dp_put32(buf, g->slot);
    cm_dp_put32(buf + 4, 0);
    cm_dp_put64(buf + 8, g->offset);
    cm_dp_put64(buf + 16, g->length);
}

static inline ri_status_t cm_pfx_get_decode(const uint8_t *meta, size_t len, cm_pfx_get_t *g_p)
{
    if (meta == NULL || len != CM_PFX_GET_META)
        return len < CM_PFX_GET_META ? RI_ERR_TRUNCATED : RI_ERR_PROTOCOL;
    if (cm_dp_get32(meta + 4) != 0)
        return RI_ERR_PROTOCOL;
    *g_p = (cm_pfx_get_t){cm_dp_get32(meta), cm_dp_get64(meta + 8), cm_dp_get64(meta + 16)};
    return RI_OK;
}

static inline void cm_pfx_get_rep_encode(uint8_t buf[CM_PFX_GET_REPLY], uint64_t block_bytes, uint64_t offset)
{
    cm_dp_put64(buf, block_bytes);
    cm_dp_put64(buf + 8, offset);
}

static inline ri_status_t cm_pfx_get_rep_decode(const uint8_t *meta, size_t len, uint64_t *bytes_p,
                                                uint64_t *offset_p)
{
    if (meta == NULL || len != CM_PFX_GET_REPLY)
        return len < CM_PFX_GET_REPLY ? RI_ERR_TRUNCATED : RI_ERR_PROTOCOL;
    *bytes_p = cm_dp_get64(meta);
    *offset_p = cm_dp_get64(meta + 8);
    return RI_OK;
}

#endif /* CM_DP_PREFIX_H */
