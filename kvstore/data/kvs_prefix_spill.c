/*
 * Prefix blocks in the spill tier (docs/spill.md "Prefix blocks").  An
 * evicted unreferenced block is written to the spill store (kvstore/spill:
 * io_uring, one CRC32C per record) and stays in the catalog, on disk; an
 * ATTACH reads it back, verifying every record and the block's own CRC,
 * into a fresh sealed memory file.  A block whose records fail is dropped
 * and counted, never served.
 *
 * A block is several records, because a record is at most
 * KVS_PFX_CHUNK + its header: keys {session = KVS_PFX_DISK_TAG | id,
 * layer = record index, head 0, cluster 0}.  Record 0 describes the block
 * (so that --recover finds it again without reading the rest):
 *   u32 magic KVS_PFX_DESC_MAGIC, u32 version 1, u64 bytes, u32 chunks
 *   (records after this one), u32 n_tokens, u64 created_unix_ms,
 *   u8 key[32], char tenant[KVS_TENANT_MAX] (NUL-padded);
 * records 1.. hold the block's bytes in order, KVS_PFX_CHUNK each (the last
 * one the rest).  Session ids never have the tag bit, so these keys never
 * meet a session's.
 */
#define _GNU_SOURCE
#include <inttypes.h>
#include <stdatomic.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "common/cm_alloc.h"
#include "common/cm_crc32c.h"
#include "common/cm_dp_prefix.h"
#include "common/cm_log.h"
#include "common/cm_status.h"
#include "kvstore/data/kvs_internal.h"
#include "kvstore/spill/kvs_spill.h"

#define KVS_PFX_DISK_TAG (UINT64_C(1) << 63)
#define KVS_PFX_CHUNK (192u << 10)             /* block bytes per record (records are <= 256 KiB) */
#define KVS_PFX_DESC_MAGIC 0x44504952u          /* "RIPD" */
#define KVS_PFX_DESC_BYTES (32u + CM_PFX_KEY_SIZE + KVS_TENANT_MAX)
#define KVS_PFX_MAX_CHUNKS 65535u               /* record index fits the key's layer; 12 GiB blocks */

static CM_ALLOC_TAG(kvs_pfx_spill_tag, "kvs.prefix");

bool kvs_prefix_disk_key(uint64_t session)
{
    return (session & KVS_PFX_DISK_TAG) != 0;
}

static uint32_t kvs_pfx_chunks(uint64_t bytes)
{
    return (uint32_t)((bytes + KVS_PFX_CHUNK - 1) / KVS_PFX_CHUNK);
}

static kvs_spill_key_t kvs_pfx_disk_key(uint64_t id, uint32_t rec)
{
    return (kvs_spill_key_t){.session = KVS_PFX_DISK_TAG | id, .layer = rec};
}

static void kvs_pfx_desc_encode(uint8_t d[KVS_PFX_DESC_BYTES], const kvs_pblock_t *b)
{
    memset(d, 0, KVS_PFX_DESC_BYTES);
    cm_dp_put32(d, KVS_PFX_DESC_MAGIC);
    cm_dp_put32(d + 4, 1);
    cm_dp_put64(d + 8, b->bytes);
    cm_dp_put32(d + 16, kvs_pfx_chunks(b->bytes));
    cm_dp_put32(d + 20, b->n_tokens);
    cm_dp_put64(d + 24, b->created_unix_ms);
    memcpy(d + 32, b->key, CM_PFX_KEY_SIZE);
    memcpy(d + 32 + CM_PFX_KEY_SIZE, b->tenant, strnlen(b->tenant, KVS_TENANT_MAX - 1));
}

/* A block (on disk, unaccounted) from its descriptor; NULL when it is not one. */
static kvs_pblock_t *kvs_pfx_desc_decode(const uint8_t *d, uint32_t len, uint64_t id)
{
    kvs_pblock_t *b;
    const char *tenant = (const char *)(d + 32 + CM_PFX_KEY_SIZE);

    if (len != KVS_PFX_DESC_BYTES || cm_dp_get32(d) != KVS_PFX_DESC_MAGIC || cm_dp_get32(d + 4) != 1 ||
        cm_dp_get64(d + 8) < CM_PFX_HDR_SIZE || cm_dp_get64(d + 8) > CM_PFX_MAX_BLOCK_BYTES ||
        cm_dp_get32(d + 16) != kvs_pfx_chunks(cm_dp_get64(d + 8)) || tenant[0] == '\0' ||
        memchr(tenant, 0, KVS_TENANT_MAX) == NULL)
        return NULL;
    b = cm_calloc(&kvs_pfx_spill_tag, 1, sizeof(*b));
    if (b == NULL)
        return NULL;
    b->fd = -1;
    b->on_disk = true;
    b->disk_id = id;
    b->bytes = cm_dp_get64(d + 8);
    b->n_tokens = cm_dp_get32(d + 20);
    b->created_unix_ms = cm_dp_get64(d + 24);
    memcpy(b->key, d + 32, CM_PFX_KEY_SIZE);
    snprintf(b->tenant, sizeof(b->tenant), "%s", tenant);
    return b;
}

/* Forget records 0..chunks of block id (missing ones are ignored), in
 * the store's memory only: its manifest is the caller's to write. */
static void kvs_pfx_disk_remove(kvs_data_t *data, uint64_t id, uint64_t bytes)
{
    uint32_t chunks = kvs_pfx_chunks(bytes);
    kvs_spill_key_t *keys = cm_malloc(&kvs_pfx_spill_tag, ((size_t)chunks + 1u) * sizeof(*keys));

    if (keys == NULL)
        return; /* left for compaction to find dead (never read: nothing names it) */
    for (uint32_t i = 0; i <= chunks; i++)
        keys[i] = kvs_pfx_disk_key(id, i);
    kvs_spill_remove(data->spill, keys, (size_t)chunks + 1u);
    cm_free(keys);
}

ri_status_t kvs_prefix_disk_write(kvs_data_t *data, const kvs_pblock_t *b, uint64_t id)
{
    uint32_t chunks = kvs_pfx_chunks(b->bytes);
    uint8_t desc[KVS_PFX_DESC_BYTES];
    kvs_spill_wreq_t *w;
    ri_status_t st;

    if (chunks > KVS_PFX_MAX_CHUNKS)
        return RI_ERR_UNSUPPORTED;
    w = cm_calloc(&kvs_pfx_spill_tag, (size_t)chunks + 1u, sizeof(*w));
    if (w == NULL)
        return RI_ERR_NOMEM;
    kvs_pfx_desc_encode(desc, b);
    w[0] = (kvs_spill_wreq_t){.key = kvs_pfx_disk_key(id, 0), .tokens = 1, .payload = desc,
                              .payload_bytes = KVS_PFX_DESC_BYTES};
    for (uint32_t i = 0; i < chunks; i++) {
        uint64_t off = (uint64_t)i * KVS_PFX_CHUNK;
        w[i + 1] = (kvs_spill_wreq_t){.key = kvs_pfx_disk_key(id, i + 1), .tokens = 1, .payload = b->base + off,
                                      .payload_bytes = (uint32_t)CM_MIN((uint64_t)KVS_PFX_CHUNK, b->bytes - off)};
    }
    st = kvs_spill_write(data->spill, w, (size_t)chunks + 1u);
    cm_free(w);
    if (st != RI_OK) {
        kvs_pfx_disk_remove(data, id, b->bytes); /* the records that made it */
        cm_warn("prefix: a block of tenant %s not spilled (%s)", b->tenant, ri_status_str(st));
        return st;
    }
    /* Durable now (manifest), before its memory goes: kill -9 keeps it
     * without a tail scan's luck. */
    if (kvs_spill_sync(data->spill) != RI_OK)
        cm_warn("prefix: spill manifest not written: a crash may lose the block just spilled");
    return RI_OK;
}

void kvs_prefix_disk_commit_locked(kvs_data_t *data, kvs_pblock_t *b, uint64_t id)
{
    kvs_tenant_t *t = kvs_tenant_get_locked(data, b->tenant);

    kvs_pool_free(data->pool, b->hold_off, b->charge);
    data->prefix.blocks--;
    data->prefix.bytes -= b->charge;
    if (t != NULL)
        t->prefix_bytes -= b->charge;
    munmap((void *)(uintptr_t)b->base, b->bytes);
    close(b->fd);
    b->base = NULL;
    b->fd = -1;
    b->charge = 0;
    b->on_disk = true;
    b->disk_id = id;
    data->prefix.disk_blocks++;
    data->prefix.disk_bytes += b->bytes;
    data->prefix.spills++;
}

bool kvs_prefix_disk_abandon_locked(kvs_data_t *data, const kvs_pblock_t *b, uint64_t id)
{
    kvs_pfx_disk_remove(data, id, b->bytes);
    data->prefix.spill_abandoned++;
    /* A block dropped meanwhile must not come back from a crash's tail scan;
     * one still in the catalog may (the same bytes, on disk). */
    return !b->in_catalog;
}

ri_status_t kvs_prefix_spill_locked(kvs_data_t *data, kvs_pblock_t *b)
{
    uint64_t id;
    ri_status_t st;

    if (!kvs_tier_on(data) || b->on_disk || b->refs > 0 || b->writing ||
        kvs_pfx_chunks(b->bytes) > KVS_PFX_MAX_CHUNKS)
        return RI_ERR_UNSUPPORTED;
    id = ++data->prefix.next_disk_id; /* reserved now: a write without the lock may be using the next */
    st = kvs_prefix_disk_write(data, b, id);
    if (st == RI_OK)
        kvs_prefix_disk_commit_locked(data, b, id);
    return st;
}

void kvs_prefix_disk_forget_locked(kvs_data_t *data, kvs_pblock_t *b)
{
    if (!b->on_disk)
        return;
    /* Removed before the generation counts it, so that a manifest written
     * for this generation or a later one (kvs_prefix_mf_finish) lacks them. */
    kvs_pfx_disk_remove(data, b->disk_id, b->bytes);
    atomic_fetch_add(&data->prefix.mf_gen, 1);
    data->prefix.disk_blocks--;
    data->prefix.disk_bytes -= b->bytes;
    b->on_disk = false;
}

uint64_t kvs_prefix_mf_gen_locked(const kvs_data_t *data)
{
    return atomic_load(&data->prefix.mf_gen);
}

uint64_t kvs_prefix_mf_due_locked(const kvs_data_t *data, uint64_t gen0)
{
    uint64_t gen = atomic_load(&data->prefix.mf_gen);

    return gen > gen0 ? gen : 0;
}

ri_status_t kvs_prefix_mf_finish(kvs_data_t *data, uint64_t gen)
{
    ri_status_t st = RI_OK;

    if (gen == 0 || data->spill == NULL)
        return RI_OK;
    pthread_mutex_lock(&data->pmf_mu);
    if (gen > data->pmf_disk_gen) {
        /* Every forget counted up to now removed its records first, and the
         * store snapshots its index inside the write: this write covers
         * them all, so their callers need not write again. */
        uint64_t now = atomic_load(&data->prefix.mf_gen);
        st = kvs_spill_sync(data->spill);
        if (st == RI_OK)
            data->pmf_disk_gen = now;
        else
            cm_warn("prefix: spill manifest not written (%s): a crash may bring forgotten blocks back",
                    ri_status_str(st));
    }
    pthread_mutex_unlock(&data->pmf_mu);
    return st;
}

/* Read b's records into buf (b->bytes), each verified by the store; then
 * the block's structure and its own CRC. */
static ri_status_t kvs_pfx_read(kvs_data_t *data, const kvs_pblock_t *b, uint8_t *buf)
{
    uint32_t chunks = kvs_pfx_chunks(b->bytes);
    kvs_spill_rreq_t *r = cm_calloc(&kvs_pfx_spill_tag, chunks, sizeof(*r));
    cm_pfx_view_t v;
    ri_status_t st;

    if (r == NULL)
        return RI_ERR_NOMEM;
    for (uint32_t i = 0; i < chunks; i++) {
        uint64_t off = (uint64_t)i * KVS_PFX_CHUNK;
        r[i] = (kvs_spill_rreq_t){.key = kvs_pfx_disk_key(b->disk_id, i + 1), .buf = buf + off,
                                  .buf_bytes = (uint32_t)CM_MIN((uint64_t)KVS_PFX_CHUNK, b->bytes - off)};
    }
    st = kvs_spill_read(data->spill, r, chunks);
    for (uint32_t i = 0; st == RI_OK && i < chunks; i++)
        if (r[i].payload_bytes != r[i].buf_bytes)
            st = RI_ERR_TRUNCATED;
    cm_free(r);
    if (st == RI_OK)
        st = cm_pfx_decode(buf, b->bytes, &v);
    if (st == RI_OK && cm_crc32c(0, buf + CM_PFX_HDR_SIZE, b->bytes - CM_PFX_HDR_SIZE) != v.hdr.crc)
        st = RI_ERR_CORRUPT;
    return st;
}

ri_status_t kvs_prefix_read_back(kvs_data_t *data, uint64_t disk_id, uint64_t bytes, kvs_pblock_t **tmp_p)
{
    kvs_pblock_t d = {.disk_id = disk_id, .bytes = bytes};
    uint8_t *buf;
    ri_status_t st;

    if (!kvs_tier_on(data))
        return RI_ERR_INVALID;
    buf = cm_malloc(&kvs_pfx_spill_tag, bytes);
    if (buf == NULL)
        return RI_ERR_NOMEM;
    st = kvs_pfx_read(data, &d, buf);
    if (st == RI_OK)
        st = kvs_prefix_make(buf, bytes, tmp_p);
    cm_free(buf);
    return st;
}

void kvs_prefix_discard(kvs_pblock_t *tmp)
{
    if (tmp == NULL)
        return;
    munmap((void *)(uintptr_t)tmp->base, tmp->bytes);
    close(tmp->fd);
    cm_free(tmp);
}

ri_status_t kvs_prefix_install_locked(kvs_data_t *data, kvs_pblock_t *b, kvs_tenant_t *t, kvs_pblock_t *tmp)
{
    ri_status_t st;

    if (!b->on_disk || tmp->bytes != b->bytes) {
        kvs_prefix_discard(tmp);
        return RI_ERR_INVALID;
    }
    st = kvs_prefix_hold_locked(data, t, b); /* never writes; b is not on the LRU */
    if (st == RI_ERR_BUSY)
        return st; /* tmp stays the caller's: room again, then retry */
    if (st != RI_OK) {
        kvs_prefix_discard(tmp);
        return st;
    }
    kvs_prefix_disk_forget_locked(data, b); /* resident again: its records go */
    b->base = tmp->base;
    b->fd = tmp->fd;
    cm_free(tmp);
    data->prefix.readbacks++;
    return RI_OK;
}

/* --- --recover ------------------------------------------------------------- */

typedef struct kvs_pfx_found {
    uint64_t *ids;
    size_t n, cap;
    bool nomem;
} kvs_pfx_found_t;

/* kvs_spill_foreach visitor: the descriptor records of prefix blocks. */
static void kvs_pfx_found_one(void *arg, const kvs_spill_info_t *info)
{
    kvs_pfx_found_t *f = arg;

    if (!kvs_prefix_disk_key(info->key.session) || info->key.layer != 0 || info->lost)
        return;
    if (f->n == f->cap) {
        size_t cap = f->cap ? 2u * f->cap : 64u;
        uint64_t *n = cm_realloc(&kvs_pfx_spill_tag, f->ids, cap * sizeof(*n));
        if (n == NULL) {
            f->nomem = true;
            return;
        }
        f->ids = n;
        f->cap = cap;
    }
    f->ids[f->n++] = info->key.session & ~KVS_PFX_DISK_TAG;
}

/* Put recovered block b in the catalog; of two with one (tenant, key) the
 * later write stands. */
static void kvs_pfx_recover_one_locked(kvs_data_t *data, kvs_pblock_t *b)
{
    kvs_pblock_t *had = kvs_prefix_find_locked(data, b->tenant, b->key);

    data->prefix.disk_blocks++;
    data->prefix.disk_bytes += b->bytes;
    if (had != NULL && had->disk_id > b->disk_id) {
        kvs_prefix_disk_forget_locked(data, b);
        cm_free(b);
        return;
    }
    if (had != NULL) {
        kvs_prefix_unlink_locked(data, had);
        kvs_prefix_disk_forget_locked(data, had);
        cm_free(had);
    }
    kvs_prefix_insert_locked(data, b);
}

void kvs_prefix_recover_locked(kvs_data_t *data)
{
    kvs_pfx_found_t f = {0};
    uint64_t found = 0;

    if (!kvs_tier_on(data))
        return;
    kvs_spill_foreach(data->spill, 0, kvs_pfx_found_one, &f);
    for (size_t i = 0; i < f.n; i++) {
        uint8_t desc[KVS_PFX_DESC_BYTES];
        kvs_spill_rreq_t r = {.key = kvs_pfx_disk_key(f.ids[i], 0), .buf = desc, .buf_bytes = sizeof(desc)};
        kvs_pblock_t *b;
        if (f.ids[i] > data->prefix.next_disk_id)
            data->prefix.next_disk_id = f.ids[i];
        if (kvs_spill_read(data->spill, &r, 1) != RI_OK)
            continue; /* counted by the store; the block's other records are dead weight for compaction */
        b = kvs_pfx_desc_decode(desc, r.payload_bytes, f.ids[i]);
        if (b == NULL)
            continue;
        kvs_pfx_recover_one_locked(data, b);
        found++;
    }
    if (f.nomem)
        cm_warn("recover: out of memory listing prefix blocks: some were not recovered");
    cm_free(f.ids);
    if (found > 0)
        cm_info("recover: %" PRIu64 " prefix block(s) on disk", found);
}
