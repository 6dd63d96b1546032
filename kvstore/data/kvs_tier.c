/*
 * The spill tier hooked into the data side: when the host pool
 * passes its high-water mark, the coldest clusters (least recently fetched,
 * across sessions) are written to the spill store (kvstore/spill) and their
 * pool pages are freed; a fetch reads its disk-resident misses back in one
 * batch, verifies them and serves them like pool misses.  A session manifest
 * next to the spill store's own keeps tenant, label, geometry and secret of
 * every session, so that --recover can rebuild the catalog.
 *
 * Allocation unit: with a spill directory, every cluster has its own pool
 * extent (its table entry owns it), so spilling one cluster frees exactly its
 * pages.  Without one, nothing here runs and uploads keep their per-(layer,
 * head) extents (see docs/spill.md, "Daemon integration").
 *
 * Concurrency: the data plane has several threads (one per lane), and a
 * fetch reads disk records and moves pool bytes without data->lock.  "Never
 * spill or free what an in-flight fetch uses" holds through pins: the fetch
 * pins each cluster it will read while it plans (lock held), a spill skips
 * pinned clusters, and the fetch unpins once its bytes are out (lock held
 * again).  A session is freed only when its last reference goes, and a fetch
 * holds one.  Read-back (kvs_tier_read) runs without data->lock, and so
 * does a spill's disk write: victims are chosen and marked under the lock
 * (kvs_cluster_t.wstate; their sessions referenced, their pool pages stay
 * and keep serving fetches), written without it, and committed under it
 * again, or abandoned when a cluster was touched, pinned or its session
 * dropped meanwhile.  One spill writes at a time (data->spill_busy).  The
 * session manifest is snapshotted under data->lock and written without it
 * (kvs_tier_smf_finish), generations keeping an older snapshot from
 * overwriting a newer one.
 */
#define _GNU_SOURCE
#include "kvstore/data/kvs_internal.h"

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "common/cm_alloc.h"
#include "common/cm_crc32c.h"
#include "common/cm_dp_proto.h"
#include "common/cm_log.h"
#include "common/cm_status.h"
#include "kvstore/spill/kvs_spill.h"
#include "kvstore/spill/kvs_spill_cold.h"
#include "kvstore/spill/kvs_spill_io.h"

static CM_ALLOC_TAG(kvs_tier_tag, "kvs.tier");

#define KVS_TIER_BATCH 64u               /* clusters per spill write batch */
#define KVS_TIER_MAX_RECORD (256u << 10) /* largest cluster record; bigger clusters stay in the pool */
#define KVS_SMF_NAME "sessions.manifest"
#define KVS_SMF_MAGIC "RIKVSSES"
#define KVS_SMF_VERSION 1u
/* id, created, tenant, label, 5 x geometry, secret */
#define KVS_SMF_ENTRY (8u + 8u + KVS_TENANT_MAX + KVS_LABEL_MAX + 20u + CM_WIRE_SECRET_SIZE)
#define KVS_SMF_HEADER 24u               /* magic, version, count, next_id */

static double kvs_tier_high_water(const kvs_data_t *data)
{
    double hw = data->cfg.spill_high_water;
    return hw > 0.0 && hw <= 1.0 ? hw : 0.90;
}

static kvs_table_t *kvs_tier_table(kvs_session_t *s, uint32_t layer, uint32_t head)
{
    if (layer >= s->geo.layers || head >= s->geo.kv_heads)
        return NULL;
    return &s->tables[(uint64_t)layer * s->geo.kv_heads + head];
}

static uint64_t kvs_tier_cluster_bytes(const kvs_session_t *s, const kvs_cluster_t *c)
{
    return kvs_cluster_pages(s, c->tokens) * s->page_bytes;
}

void kvs_tier_touch_locked(kvs_data_t *data, kvs_session_t *s, uint32_t layer, uint32_t head, uint32_t id)
{
    kvs_spill_key_t key = {.session = s->id, .layer = layer, .head = head, .cluster = id};
    kvs_cluster_t *c = kvs_table_own(&s->tables[(uint64_t)layer * s->geo.kv_heads + head], id);

    if (c == NULL || c->direct)
        return;
    if (c->wstate & KVS_WS_WRITING)
        c->wstate |= KVS_WS_TOUCHED; /* hot again: its write in flight is abandoned at commit */ /* in a direct region: read in place by a worker, never spilled */
    /* A failed touch (out of memory) only means the cluster is never picked. */
    (void)kvs_spill_cold_touch(data->cold, &key, kvs_pool_round(kvs_tier_cluster_bytes(s, c)));
}

/* Take the writer role (one spill writes at a time).  False when another
 * spill holds it and wait is false; with wait, sleeps on spill_cond until
 * it is free (data->lock released meanwhile). */
static bool kvs_tier_writer_begin_locked(kvs_data_t *data, bool wait)
{
    while (data->spill_busy) {
        if (!wait)
            return false;
        pthread_cond_wait(&data->spill_cond, &data->lock);
    }
    data->spill_busy = true;
    return true;
}

static void kvs_tier_writer_end_locked(kvs_data_t *data)
{
    data->spill_busy = false;
    pthread_cond_broadcast(&data->spill_cond);
}

/* A spill batch between its plan and its commit: the write requests and,
 * for each, its session (referenced, so that its tables and pool pages
 * outlive a drop until the commit). */
typedef struct kvs_tier_wbatch {
    kvs_spill_wreq_t w[KVS_TIER_BATCH];
    kvs_session_t *s[KVS_TIER_BATCH];
    size_t n;
} kvs_tier_wbatch_t;

/* Plan (lock held): choose the clusters of keys that can go, mark each
 * KVS_WS_WRITING and reference its session.  The requests' payloads point
 * at the pool pages (or, when closing, the direct region), which stay valid
 * and unchanged until the commit: clusters are immutable once published,
 * and nothing frees a cluster's pages but its spill's commit or its
 * session's free, which the reference holds off. */
static void kvs_tier_spill_plan_locked(kvs_data_t *data, const kvs_spill_key_t *keys, size_t n, bool closing,
                                       kvs_tier_wbatch_t *wb)
{
    wb->n = 0;
    for (size_t i = 0; i < n && wb->n < KVS_TIER_BATCH; i++) {
        kvs_session_t *s = kvs_session_find_locked(data, keys[i].session);
        kvs_table_t *t = s ? kvs_tier_table(s, keys[i].layer, keys[i].head) : NULL;
        kvs_cluster_t *c = t != NULL ? kvs_table_own(t, keys[i].cluster) : NULL;
        uint64_t bytes;
        if (c == NULL || c->tier != KVS_TIER_POOL || (c->direct && !closing)) {
            kvs_spill_cold_remove(data->cold, &keys[i]); /* stale: dropped or already spilled */
            continue;
        }
        if (c->pins > 0) {
            /* A fetch is reading it without the lock; it is put back on the
             * list when the last pin goes (kvs_tier_unpin_locked). */
            kvs_spill_cold_remove(data->cold, &keys[i]);
            continue;
        }
        if (c->wstate != 0)
            continue; /* already in this batch (a key picked twice) */
        bytes = kvs_tier_cluster_bytes(s, c);
        if (bytes + 64u > KVS_TIER_MAX_RECORD) {
            kvs_spill_cold_remove(data->cold, &keys[i]); /* too large for a record: stays in the pool */
            continue;
        }
        c->wstate = KVS_WS_WRITING;
        s->refs++;
        wb->s[wb->n] = s;
        wb->w[wb->n++] = (kvs_spill_wreq_t){.key = keys[i], .dtype = (uint16_t)s->geo.dtype, .tokens = c->tokens,
                                            .payload = kvs_cluster_data(data, s, c),
                                            .payload_bytes = (uint32_t)bytes};
    }
}

/* Commit (lock held, after the write): each written cluster becomes DISK
 * and its pool pages are freed, unless meanwhile its session was dropped, a
 * fetch touched or still pins it, or it left the pool: then the write is
 * abandoned (its record removed from the store, dead space for compaction;
 * the cluster stays where it is, freed with its session if that was
 * dropped).  Then the sessions' references go.  *freed_p gets the pool bytes
 * freed; *sync_p is set when a write was abandoned for a dropped session
 * (the caller then writes the store's manifest, without the lock); returns
 * RI_OK or the write's first error (quota, I/O). */
static ri_status_t kvs_tier_spill_commit_locked(kvs_data_t *data, kvs_tier_wbatch_t *wb, uint64_t *freed_p,
                                                bool *sync_p)
{
    ri_status_t st = RI_OK;
    bool of_dropped = false;

    *freed_p = 0;
    for (size_t i = 0; i < wb->n; i++) {
        const kvs_spill_wreq_t *w = &wb->w[i];
        kvs_session_t *s = wb->s[i];
        kvs_cluster_t *c = kvs_table_own(kvs_tier_table(s, w->key.layer, w->key.head), w->key.cluster);
        uint8_t ws = c->wstate; /* an own POOL entry when the batch was made (kvs_tier_wbatch_locked) */

        c->wstate = 0;
        if (w->status != RI_OK) {
            if (st == RI_OK)
                st = w->status;
            continue;
        }
        if (s->dropped || (ws & KVS_WS_TOUCHED) || c->pins > 0 || c->tier != KVS_TIER_POOL) {
            kvs_spill_remove(data->spill, &w->key, 1);
            data->spill_abandoned++;
            of_dropped |= s->dropped;
            continue;
        }
        if (!c->direct) { /* a region's bytes go with the region */
            kvs_pool_free(data->pool, c->off, w->payload_bytes);
            kvs_session_uncharge_locked(data, s, kvs_pool_round(w->payload_bytes));
            *freed_p += kvs_pool_round(w->payload_bytes);
        }
        c->tier = KVS_TIER_DISK;
        c->direct = false;
        c->off = 0;
        s->disk_bytes += w->payload_bytes;
        kvs_spill_cold_remove(data->cold, &w->key);
        data->spilled_clusters++;
        data->spilled_bytes += w->payload_bytes;
    }
    *sync_p = of_dropped;
    for (size_t i = 0; i < wb->n; i++)
        kvs_session_unref_locked(data, wb->s[i]); /* may free a dropped session, its pool pages with it */
    if (st != RI_OK) {
        data->spill_failures++;
        if (st == RI_ERR_QUOTA)
            cm_warn("spill: disk quota reached; clusters stay in the pool");
        else
            cm_error("spill: write failed: %s", ri_status_str(st));
    }
    return st;
}

/* Write the clusters of keys to disk, then mark them DISK and free their pool
 * pages.  The caller holds the writer role and data->lock; the lock is
 * released for the disk write itself (plan, write, commit), except when
 * closing (the data plane has stopped: nobody waits).  *freed_p gets the
 * pool bytes freed.  Clusters of a direct region are written only when
 * closing (so that --recover finds them; a worker may read them at any time
 * until then, so they never leave before).  Returns RI_OK, or the error that
 * should stop spilling (quota, I/O). */
static ri_status_t kvs_tier_spill_keys_locked(kvs_data_t *data, const kvs_spill_key_t *keys, size_t n,
                                              bool closing, uint64_t *freed_p)
{
    kvs_tier_wbatch_t wb;
    bool sync = false;
    ri_status_t st;

    *freed_p = 0;
    kvs_tier_spill_plan_locked(data, keys, n, closing, &wb);
    if (wb.n == 0)
        return RI_OK;
    if (!closing)
        pthread_mutex_unlock(&data->lock);
    /* The store is thread-safe and copies each payload into its bounce
     * slots; a fetch may read the same pool pages meanwhile (both only read). */
    (void)kvs_spill_write(data->spill, wb.w, wb.n);
    if (!closing)
        pthread_mutex_lock(&data->lock);
    st = kvs_tier_spill_commit_locked(data, &wb, freed_p, &sync);
    /* The drop's own manifest may list records this write indexed after the
     * drop: write one without them, so that --recover after a crash finds
     * no record of a dropped session (rare: a drop during a write).  The
     * records are already out of the store's index; the manifest write
     * (and its wait for a store write in flight) runs without the catalog
     * lock, still holding the writer role, like the write itself. */
    if (sync) {
        if (!closing)
            pthread_mutex_unlock(&data->lock);
        (void)kvs_spill_sync(data->spill);
        if (!closing)
            pthread_mutex_lock(&data->lock);
    }
    return st;
}

/* Spill the coldest clusters until bytes pool bytes are free or nothing is
 * left to spill.  Returns the bytes freed.  Takes the writer role first:
 * when another spill holds it, returns 0 at once unless wait (then it waits
 * for it).  data->lock is released during each batch's disk write. */
static uint64_t kvs_tier_spill_locked(kvs_data_t *data, uint64_t bytes, bool wait)
{
    kvs_spill_key_t keys[KVS_TIER_BATCH];
    uint64_t freed;

    if (!kvs_tier_writer_begin_locked(data, wait))
        return 0;
    /* Unreferenced prefix blocks go first (to disk too): before any live
     * session's clusters. */
    freed = kvs_prefix_reclaim_writer_locked(data, bytes);
    /* Fetches of other data-plane threads may be moving pool bytes without
     * data->lock: those clusters are pinned and skipped (kvs_tier_spill_plan_locked). */
    while (freed < bytes) {
        uint64_t f = 0;
        size_t n = kvs_spill_cold_pick(data->cold, KVS_TIER_BATCH, bytes - freed, keys);
        if (n == 0)
            break;
        ri_status_t st = kvs_tier_spill_keys_locked(data, keys, n, false, &f);
        freed += f;
        if (st != RI_OK)
            break; /* quota or I/O: retrying now would fail the same way */
    }
    kvs_tier_writer_end_locked(data);
    return freed;
}

uint64_t kvs_tier_reclaim_prefix_locked(kvs_data_t *data, uint64_t bytes)
{
    uint64_t freed;

    if (!kvs_tier_on(data))
        return kvs_prefix_reclaim_locked(data, bytes); /* from memory only: quick */
    (void)kvs_tier_writer_begin_locked(data, true);
    freed = kvs_prefix_reclaim_writer_locked(data, bytes);
    kvs_tier_writer_end_locked(data);
    return freed;
}

/* Bytes to spill so that `more` bytes fit under the high-water mark. */
static uint64_t kvs_tier_excess(kvs_data_t *data, uint64_t more)
{
    kvs_pool_stats_t ps;
    double limit;

    kvs_pool_stats(data->pool, &ps);
    limit = kvs_tier_high_water(data) * (double)ps.total_bytes;
    if ((double)(ps.used_bytes + more) <= limit)
        return 0;
    /* Some slack (1/64 of the pool) so that each small append does not spill alone. */
    return (uint64_t)((double)(ps.used_bytes + more) - limit) + ps.total_bytes / 64u;
}

void kvs_tier_relieve_locked(kvs_data_t *data)
{
    uint64_t excess;

    if (!kvs_tier_on(data))
        return;
    excess = kvs_tier_excess(data, 0);
    if (excess > 0)
        (void)kvs_tier_spill_locked(data, excess, false); /* a spill in flight frees room already */
}

ri_status_t kvs_tier_alloc_clusters_locked(kvs_data_t *data, kvs_session_t *s, const uint64_t *sizes, size_t n,
                                           uint64_t *offs)
{
    uint64_t charge = 0;
    ri_status_t st = RI_OK;

    for (size_t i = 0; i < n; i++)
        charge += kvs_pool_round(sizes[i]);
    for (int attempt = 0; attempt < 2; attempt++) {
        size_t done = 0;
        /* First keep under the high-water mark (unless a spill is writing
         * already: then go on if the pool has room); after a failure (quota
         * or a pool too fragmented), wait for that spill and free the whole
         * request's size once more. */
        uint64_t want = attempt == 0 ? kvs_tier_excess(data, charge) : charge;
        if (want > 0) {
            (void)kvs_tier_spill_locked(data, want, attempt > 0);
            if (s->dropped)
                return RI_ERR_NOT_FOUND; /* dropped while the lock was released for the write */
        }
        st = kvs_session_charge_locked(data, s, charge);
        if (st == RI_OK) {
            for (done = 0; done < n; done++) {
                st = kvs_pool_alloc(data->pool, sizes[done], &offs[done]);
                if (st != RI_OK)
                    break;
            }
            if (st == RI_OK)
                return RI_OK;
            for (size_t i = 0; i < done; i++)
                kvs_pool_free(data->pool, offs[i], sizes[i]);
            kvs_session_uncharge_locked(data, s, charge);
        }
        if (st != RI_ERR_QUOTA && st != RI_ERR_NOSPACE)
            return st;
    }
    return st;
}

void kvs_tier_read_plan_locked(kvs_session_t *s, uint32_t layer, uint32_t head, uint32_t id, kvs_tier_read_t *rd)
{
    kvs_cluster_t *c = kvs_table_own(kvs_tier_table(s, layer, head), id); /* DISK: own */

    *rd = (kvs_tier_read_t){.layer = layer, .head = head, .id = id, .bytes = kvs_tier_cluster_bytes(s, c),
                            .crc = c->crc, .no_crc = c->no_crc};
    c->pins++;
}

ri_status_t kvs_tier_read(kvs_data_t *data, uint64_t session_id, kvs_tier_read_t *rd, size_t n, uint8_t **buf_p)
{
    kvs_spill_rreq_t *r;
    uint8_t *buf;
    uint64_t total = 0, off = 0;
    ri_status_t st = RI_OK;

    *buf_p = NULL;
    for (size_t i = 0; i < n; i++)
        total += rd[i].bytes;
    r = cm_calloc(&kvs_tier_tag, n ? n : 1, sizeof(*r));
    buf = cm_malloc(&kvs_tier_tag, total ? total : 1);
    if (r == NULL || buf == NULL) {
        cm_free(r);
        cm_free(buf);
        return RI_ERR_NOMEM;
    }
    for (size_t i = 0; i < n; i++) {
        r[i] = (kvs_spill_rreq_t){.key = {.session = session_id, .layer = rd[i].layer, .head = rd[i].head,
                                          .cluster = rd[i].id},
                                  .buf = buf + off, .buf_bytes = (uint32_t)rd[i].bytes};
        rd[i].src = buf + off;
        off += rd[i].bytes;
    }
    /* The spill store is thread-safe and does its I/O without its own lock
     * held; the session's records stay until it is dropped (then a read
     * answers NOT_FOUND, and the fetch an error). */
    (void)kvs_spill_read(data->spill, r, n);
    for (size_t i = 0; i < n; i++) {
        ri_status_t e = r[i].status;
        /* Our own CRC of the upload guards against a record that is intact
         * but not the one we wrote (e.g. a manifest pointing elsewhere). */
        if (e == RI_OK && (r[i].payload_bytes != rd[i].bytes ||
                           (!rd[i].no_crc && cm_crc32c(0, rd[i].src, rd[i].bytes) != rd[i].crc)))
            e = RI_ERR_CORRUPT;
        rd[i].status = e;
        if (e != RI_OK && (st == RI_OK || e == RI_ERR_CORRUPT))
            st = e;
    }
    cm_free(r);
    if (st != RI_OK) {
        cm_free(buf);
        return st;
    }
    *buf_p = buf;
    return RI_OK;
}

void kvs_tier_read_finish_locked(kvs_data_t *data, kvs_session_t *s, const kvs_tier_read_t *rd, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        kvs_cluster_t *c = kvs_table_own(kvs_tier_table(s, rd[i].layer, rd[i].head), rd[i].id);
        if (c == NULL || rd[i].status != RI_ERR_CORRUPT || c->tier != KVS_TIER_DISK)
            continue;
        cm_error("spill: session %" PRIu64 " layer %u head %u cluster %u failed verification: lost", s->id,
                 rd[i].layer, rd[i].head, rd[i].id);
        c->tier = KVS_TIER_LOST;
        data->lost_clusters++;
    }
}

void kvs_tier_pin_locked(kvs_session_t *s, uint32_t layer, uint32_t head, uint32_t id)
{
    kvs_cluster_t *c = kvs_table_own(kvs_tier_table(s, layer, head), id);
    if (c != NULL)
        c->pins++;
}

void kvs_tier_unpin_locked(kvs_data_t *data, kvs_session_t *s, uint32_t layer, uint32_t head, uint32_t id)
{
    kvs_cluster_t *c = kvs_table_own(kvs_tier_table(s, layer, head), id);

    if (c != NULL && c->pins > 0 && --c->pins == 0 && c->tier == KVS_TIER_POOL && kvs_tier_on(data) && !s->dropped)
        kvs_tier_touch_locked(data, s, layer, head, id);
}

void kvs_tier_session_free_locked(kvs_data_t *data, kvs_session_t *s)
{
    if (s->tables == NULL)
        return;
    for (uint64_t i = 0; i < (uint64_t)s->geo.layers * s->geo.kv_heads; i++)
        for (uint32_t j = 0; j < s->tables[i].n - s->tables[i].n_att; j++) /* own entries */
            if (s->tables[i].c[j].tier == KVS_TIER_POOL && !s->tables[i].c[j].direct)
                kvs_pool_free(data->pool, s->tables[i].c[j].off, kvs_tier_cluster_bytes(s, &s->tables[i].c[j]));
}

/* --- session manifest ---------------------------------------------------- */

/* Catalog changes take a snapshot of the manifest under data->lock (memory
 * only, numbered in catalog order: data->smf_gen) and write it after the
 * lock is released, before the change is answered.  One write at a time
 * (data->smf_mu, never taken with data->lock held); a snapshot older than
 * the manifest on disk (data->smf_disk_gen) is skipped, since the newer one
 * already holds its change, so an older snapshot never overwrites a newer. */

static void kvs_smf_path(const kvs_data_t *data, char *path, size_t len, const char *suffix)
{
    snprintf(path, len, "%s/%s%s", data->spill_dir, KVS_SMF_NAME, suffix);
}

static const kvs_io_ops_t *kvs_smf_ops(const kvs_data_t *data)
{
    return data->cfg.spill_io_ops != NULL ? data->cfg.spill_io_ops : kvs_io_ops_default();
}

/* Encode the catalog's sessions into smf->buf (lock held; memory only) and
 * give it the next generation.  smf->st gets RI_ERR_NOMEM (logged) when the
 * buffer cannot be had; nothing is written for it then. */
static void kvs_smf_snapshot_locked(kvs_data_t *data, kvs_tier_smf_t *smf)
{
    size_t len = KVS_SMF_HEADER + (size_t)data->n_sessions * KVS_SMF_ENTRY + 4u, off;
    uint8_t *b = cm_calloc(&kvs_tier_tag, 1, len);

    if (b == NULL) {
        cm_error("session manifest: out of memory");
        smf->st = RI_ERR_NOMEM;
        return;
    }
    memcpy(b, KVS_SMF_MAGIC, 8);
    cm_dp_put32(b + 8, KVS_SMF_VERSION);
    cm_dp_put32(b + 12, data->n_sessions);
    cm_dp_put64(b + 16, data->next_id);
    off = KVS_SMF_HEADER;
    for (uint32_t i = 0; i < data->n_sessions; i++, off += KVS_SMF_ENTRY) {
        const kvs_session_t *s = data->sessions[i];
        uint8_t *e = b + off;
        cm_dp_put64(e, s->id);
        cm_dp_put64(e + 8, s->created_unix_ms);
        memcpy(e + 16, s->tenant, KVS_TENANT_MAX);
        memcpy(e + 16 + KVS_TENANT_MAX, s->label, KVS_LABEL_MAX);
        e += 16 + KVS_TENANT_MAX + KVS_LABEL_MAX;
        cm_dp_put32(e, s->geo.layers);
        cm_dp_put32(e + 4, s->geo.kv_heads);
        cm_dp_put32(e + 8, s->geo.head_dim);
        cm_dp_put32(e + 12, s->geo.dtype);
        cm_dp_put32(e + 16, s->geo.page_tokens);
        memcpy(e + 20, s->secret, CM_WIRE_SECRET_SIZE);
    }
    cm_dp_put32(b + off, cm_crc32c(0, b, off));
    smf->buf = b;
    smf->len = len;
    smf->gen = ++data->smf_gen;
    smf->st = RI_OK;
}

/* Write b atomically as the manifest (temp file, write, fsync, rename, fsync
 * of the directory), through the tier's system calls.  Caller holds
 * data->smf_mu, not data->lock.  Returns RI_OK, or the error (logged):
 * RI_ERR_NOSPACE for a full disk; the old manifest stays in place then. */
static ri_status_t kvs_smf_write_file(kvs_data_t *data, const uint8_t *b, size_t len)
{
    const kvs_io_ops_t *ops = kvs_smf_ops(data);
    char path[4200], tmp[4200];
    int fd, err = 0;

    kvs_smf_path(data, path, sizeof(path), "");
    kvs_smf_path(data, tmp, sizeof(tmp), ".tmp");
    fd = ops->open(ops->arg, tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600); /* holds secrets */
    if (fd < 0) {
        err = errno;
    } else {
        ssize_t wr = ops->pwrite(ops->arg, fd, b, len, 0);
        err = wr < 0 ? errno : wr != (ssize_t)len ? ENOSPC : 0;
        if (err == 0 && ops->fsync(ops->arg, fd) != 0)
            err = errno;
        if (ops->close(ops->arg, fd) != 0 && err == 0)
            err = errno;
        if (err == 0 && ops->rename(ops->arg, tmp, path) != 0)
            err = errno;
    }
    if (err != 0) {
        cm_error("session manifest %s: %s", path, strerror(err));
        if (fd >= 0)
            (void)ops->unlink(ops->arg, tmp);
        return cm_status_from_errno(err);
    }
    int dfd = ops->open(ops->arg, data->spill_dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC, 0);
    if (dfd >= 0) {
        (void)ops->fsync(ops->arg, dfd);
        (void)ops->close(ops->arg, dfd);
    }
    return RI_OK;
}

/* Have smf's snapshot, or a newer one, on disk (data->lock NOT held).
 * Waits for a write in flight; skips the write when a newer snapshot is on
 * disk already.  Frees the snapshot.  Returns RI_OK or the write's error. */
static ri_status_t kvs_smf_write(kvs_data_t *data, kvs_tier_smf_t *smf)
{
    ri_status_t st = smf->st;

    if (smf->buf == NULL)
        return st;
    pthread_mutex_lock(&data->smf_mu);
    if (smf->gen > data->smf_disk_gen) {
        st = kvs_smf_write_file(data, smf->buf, smf->len);
        if (st == RI_OK)
            data->smf_disk_gen = smf->gen;
    }
    pthread_mutex_unlock(&data->smf_mu);
    cm_free(smf->buf);
    smf->buf = NULL;
    return st;
}

void kvs_tier_session_created_locked(kvs_data_t *data, kvs_tier_smf_t *smf)
{
    *smf = (kvs_tier_smf_t){.st = RI_OK};
    if (kvs_tier_on(data))
        kvs_smf_snapshot_locked(data, smf);
}

void kvs_tier_session_dropped_locked(kvs_data_t *data, uint64_t id, kvs_tier_smf_t *smf)
{
    *smf = (kvs_tier_smf_t){.st = RI_OK};
    if (!kvs_tier_on(data))
        return;
    (void)kvs_spill_cold_drop_session(data->cold, id); /* memory only */
    smf->drop_id = id;
    kvs_smf_snapshot_locked(data, smf);
}

ri_status_t kvs_tier_smf_finish(kvs_data_t *data, kvs_tier_smf_t *smf)
{
    /* Forgetting the records and the store's own manifest write: ids are
     * never reused, and a spill of this session still in flight abandons
     * its records at commit (its session is marked dropped), so this needs
     * no catalog lock.  NOT_FOUND: nothing was spilled. */
    if (smf->drop_id != 0)
        (void)kvs_spill_drop_session(data->spill, smf->drop_id, NULL);
    smf->drop_id = 0;
    return kvs_smf_write(data, smf);
}

/* Read the session manifest and recreate its sessions (empty tables). */
static ri_status_t kvs_smf_load_locked(kvs_data_t *data)
{
    char path[4200];
    FILE *f;
    uint8_t *b = NULL;
    long len;
    uint32_t count;
    ri_status_t st = RI_ERR_CORRUPT;

    kvs_smf_path(data, path, sizeof(path), "");
    f = fopen(path, "rbe");
    if (f == NULL) {
        cm_warn("recover: no session manifest %s (%s): nothing to recover", path, strerror(errno));
        return errno == ENOENT ? RI_OK : RI_ERR_IO;
    }
    if (fseek(f, 0, SEEK_END) != 0 || (len = ftell(f)) < (long)(KVS_SMF_HEADER + 4u) || len > (64L << 20) ||
        fseek(f, 0, SEEK_SET) != 0)
        goto out;
    b = cm_malloc(&kvs_tier_tag, (size_t)len);
    if (b == NULL) {
        st = RI_ERR_NOMEM;
        goto out;
    }
    if (fread(b, 1, (size_t)len, f) != (size_t)len || memcmp(b, KVS_SMF_MAGIC, 8) != 0 ||
        cm_dp_get32(b + 8) != KVS_SMF_VERSION)
        goto out;
    count = cm_dp_get32(b + 12);
    if (count > KVS_MAX_SESSIONS || (size_t)len != KVS_SMF_HEADER + (size_t)count * KVS_SMF_ENTRY + 4u ||
        cm_crc32c(0, b, (size_t)len - 4u) != cm_dp_get32(b + len - 4))
        goto out;
    data->next_id = cm_dp_get64(b + 16);
    for (uint32_t i = 0; i < count; i++) {
        const uint8_t *e = b + KVS_SMF_HEADER + (size_t)i * KVS_SMF_ENTRY;
        kvs_session_t *s = cm_calloc(&kvs_tier_tag, 1, sizeof(*s));
        kvs_tenant_t *t;
        if (s == NULL) {
            st = RI_ERR_NOMEM;
            goto out;
        }
        s->id = cm_dp_get64(e);
        s->created_unix_ms = cm_dp_get64(e + 8);
        memcpy(s->tenant, e + 16, KVS_TENANT_MAX);
        memcpy(s->label, e + 16 + KVS_TENANT_MAX, KVS_LABEL_MAX);
        s->tenant[KVS_TENANT_MAX - 1] = '\0';
        s->label[KVS_LABEL_MAX - 1] = '\0';
        e += 16 + KVS_TENANT_MAX + KVS_LABEL_MAX;
        s->geo = (kvs_geometry_t){cm_dp_get32(e), cm_dp_get32(e + 4), cm_dp_get32(e + 8), cm_dp_get32(e + 12),
                                  cm_dp_get32(e + 16)};
        memcpy(s->secret, e + 20, CM_WIRE_SECRET_SIZE);
        s->recovered = true;
        if (s->id == 0 || s->id >= data->next_id || !kvs_geometry_check(&s->geo) || s->tenant[0] == '\0' ||
            kvs_session_find_locked(data, s->id) != NULL) {
            cm_free(s);
            goto out;
        }
        s->page_bytes = 2ull * s->geo.page_tokens * s->geo.head_dim * 2u;
        s->tables = cm_calloc(&kvs_tier_tag, (size_t)s->geo.layers * s->geo.kv_heads, sizeof(kvs_table_t));
        t = kvs_tenant_get_locked(data, s->tenant);
        if (s->tables == NULL || t == NULL) {
            cm_free(s->tables);
            cm_free(s);
            st = RI_ERR_NOMEM;
            goto out;
        }
        s->refs = 1;
        data->sessions[data->n_sessions++] = s;
    }
    st = RI_OK;
out:
    if (st == RI_ERR_CORRUPT)
        cm_error("recover: session manifest %s is damaged: not recovering", path);
    cm_free(b);
    fclose(f);
    return st;
}

typedef struct kvs_tier_rebuild {
    kvs_data_t *data;
    ri_status_t st;       /* first out-of-memory */
    uint64_t records, orphans;
} kvs_tier_rebuild_t;

/* kvs_spill_foreach visitor: put one record into its session's table. */
static void kvs_tier_rebuild_one(void *arg, const kvs_spill_info_t *info)
{
    kvs_tier_rebuild_t *rb = arg;
    kvs_session_t *s;

    if (kvs_prefix_disk_key(info->key.session))
        return; /* a prefix block's record (kvs_prefix_recover_locked) */
    s = kvs_session_find_locked(rb->data, info->key.session);
    kvs_table_t *t = s ? kvs_tier_table(s, info->key.layer, info->key.head) : NULL;

    if (t == NULL || info->key.cluster >= CM_DP_MAX_IDS || info->tokens == 0 ||
        kvs_cluster_pages(s, info->tokens) * s->page_bytes != info->payload_bytes) {
        rb->orphans++;
        return;
    }
    if (info->key.cluster >= t->cap) {
        uint32_t cap = t->cap ? t->cap : 16;
        while (cap <= info->key.cluster)
            cap *= 2;
        kvs_cluster_t *nc = cm_realloc(&kvs_tier_tag, t->c, (size_t)cap * sizeof(*nc));
        if (nc == NULL) {
            rb->st = RI_ERR_NOMEM;
            return;
        }
        t->c = nc;
        t->cap = cap;
    }
    /* Ids below this one that have no record were in memory only when the
     * daemon stopped (a crash): GONE, answered RI_ERR_LOST.  A recovered
     * session has no attached runs (n_att 0): ids are own indexes. */
    while (t->n <= info->key.cluster)
        t->c[t->n++] = (kvs_cluster_t){.tier = KVS_TIER_GONE};
    t->c[info->key.cluster] = (kvs_cluster_t){.tokens = info->tokens, .no_crc = true,
                                              .tier = info->lost ? KVS_TIER_LOST : KVS_TIER_DISK};
    s->clusters++;
    if (!info->lost)
        s->disk_bytes += info->payload_bytes;
    else
        rb->data->lost_clusters++; /* failed verification at recovery */
    rb->records++;
}

ri_status_t kvs_tier_open(kvs_data_t *data)
{
    kvs_spill_config_t sc;
    kvs_spill_recover_report_t rep = {0};
    ri_status_t st;

    snprintf(data->spill_dir, sizeof(data->spill_dir), "%s", data->cfg.spill_dir);
    data->cfg.spill_dir = data->spill_dir;
    kvs_spill_config_default(&sc);
    sc.dir = data->spill_dir;
    sc.quota_bytes = data->cfg.spill_quota_bytes;
    sc.max_record_bytes = KVS_TIER_MAX_RECORD;
    sc.ops = data->cfg.spill_io_ops;
    st = kvs_spill_cold_create(&data->cold);
    if (st != RI_OK)
        return st;
    st = data->cfg.recover ? kvs_spill_recover(&sc, true, &rep, &data->spill) : kvs_spill_create(&sc, &data->spill);
    if (st == RI_ERR_UNSUPPORTED) {
        /* tmpfs and some overlays refuse O_DIRECT: buffered I/O still works. */
        cm_warn("spill directory %s refuses O_DIRECT: using buffered I/O", data->spill_dir);
        sc.direct_io = false;
        st = data->cfg.recover ? kvs_spill_recover(&sc, true, &rep, &data->spill)
                               : kvs_spill_create(&sc, &data->spill);
    }
    if (st != RI_OK) {
        cm_error("spill directory %s: %s", data->spill_dir, ri_status_str(st));
        goto err_cold;
    }
    if (!data->cfg.recover) {
        char path[4200];
        kvs_smf_path(data, path, sizeof(path), "");
        (void)unlink(path); /* a fresh store: old sessions are gone */
        kvs_tier_smf_t smf = {.st = RI_OK};
        pthread_mutex_lock(&data->lock);
        kvs_smf_snapshot_locked(data, &smf);
        pthread_mutex_unlock(&data->lock);
        (void)kvs_smf_write(data, &smf);
        cm_info("spill tier in %s (quota %" PRIu64 " bytes, high-water %.2f)", data->spill_dir,
                data->cfg.spill_quota_bytes, kvs_tier_high_water(data));
        return RI_OK;
    }
    pthread_mutex_lock(&data->lock);
    uint64_t mf0 = kvs_prefix_mf_gen_locked(data), mf;
    st = kvs_smf_load_locked(data);
    if (st == RI_OK) {
        kvs_tier_rebuild_t rb = {.data = data, .st = RI_OK};
        kvs_spill_foreach(data->spill, 0, kvs_tier_rebuild_one, &rb);
        st = rb.st;
        if (st == RI_OK)
            kvs_prefix_recover_locked(data);
        cm_info("recover: %u session(s), %" PRIu64 " cluster record(s) (%" PRIu64 " corrupt, %" PRIu64
                " without a session) from %s",
                data->n_sessions, rb.records, rep.corrupt, rb.orphans, data->spill_dir);
    }
    mf = kvs_prefix_mf_due_locked(data, mf0); /* duplicate blocks the recovery forgot */
    pthread_mutex_unlock(&data->lock);
    (void)kvs_prefix_mf_finish(data, mf);
    if (st != RI_OK)
        goto err_spill;
    return RI_OK;

err_spill:
    /* Sessions already rebuilt are freed by the caller with the catalog. */
    kvs_spill_destroy(data->spill);
    data->spill = NULL;
err_cold:
    kvs_spill_cold_destroy(data->cold);
    data->cold = NULL;
    return st;
}

void kvs_tier_close(kvs_data_t *data)
{
    kvs_spill_key_t keys[KVS_TIER_BATCH];
    kvs_tier_smf_t smf = {.st = RI_OK};
    ri_status_t st = RI_OK;
    uint64_t freed;
    size_t n = 0;

    if (!kvs_tier_on(data))
        return;
    pthread_mutex_lock(&data->lock);
    /* Nothing is served any more: gRPC and HTTP were shut down before the
     * catalog (kvs_ctl_destroy), the lease reaper and the data plane just
     * now (kvs_data_destroy).  So no spill is writing; the role is taken
     * anyway, and these writes keep the lock (nobody is left to wait). */
    (void)kvs_tier_writer_begin_locked(data, true);
    /* Write out what is still only in the pool, so that a restart with
     * --recover finds every cluster (bounded by the disk quota). */
    for (uint32_t i = 0; i < data->n_sessions && st == RI_OK; i++) {
        kvs_session_t *s = data->sessions[i];
        for (uint32_t l = 0; l < s->geo.layers && st == RI_OK; l++)
            for (uint32_t h = 0; h < s->geo.kv_heads && st == RI_OK; h++) {
                kvs_table_t *t = kvs_tier_table(s, l, h);
                for (uint32_t c = t->n_att; c < t->n && st == RI_OK; c++) {
                    if (t->c[c - t->n_att].tier != KVS_TIER_POOL)
                        continue;
                    keys[n++] = (kvs_spill_key_t){.session = s->id, .layer = l, .head = h, .cluster = c};
                    if (n == KVS_TIER_BATCH) {
                        st = kvs_tier_spill_keys_locked(data, keys, n, true, &freed);
                        n = 0;
                    }
                }
            }
    }
    if (n > 0 && st == RI_OK)
        st = kvs_tier_spill_keys_locked(data, keys, n, true, &freed);
    if (st != RI_OK)
        cm_warn("shutdown: not every pool cluster reached the spill tier (%s)", ri_status_str(st));
    kvs_tier_writer_end_locked(data);
    kvs_smf_snapshot_locked(data, &smf);
    pthread_mutex_unlock(&data->lock);
    (void)kvs_smf_write(data, &smf);
}

void kvs_tier_destroy_store(kvs_data_t *data)
{
    kvs_spill_destroy(data->spill); /* writes the final manifest */
    kvs_spill_cold_destroy(data->cold);
    data->spill = NULL;
    data->cold = NULL;
}

uint64_t kvs_tier_disk_bytes(kvs_data_t *data)
{
    kvs_spill_stats_t ss;

    if (!kvs_tier_on(data))
        return 0;
    kvs_spill_stats(data->spill, &ss);
    return ss.used_bytes;
}

void kvs_tier_metrics_write_locked(kvs_data_t *data, FILE *out)
{
    if (!kvs_tier_on(data))
        return;
    fprintf(out, "# HELP ri_kvs_served_from_pool_total Clusters sent to workers from the pool.\n"
                 "# TYPE ri_kvs_served_from_pool_total counter\nri_kvs_served_from_pool_total %" PRIu64 "\n",
            data->served_pool);
    fprintf(out, "# HELP ri_kvs_served_from_disk_total Clusters sent to workers from the spill tier.\n"
                 "# TYPE ri_kvs_served_from_disk_total counter\nri_kvs_served_from_disk_total %" PRIu64 "\n",
            data->served_disk);
    fprintf(out, "# HELP ri_kvs_spilled_clusters_total Clusters moved from the pool to disk.\n"
                 "# TYPE ri_kvs_spilled_clusters_total counter\nri_kvs_spilled_clusters_total %" PRIu64 "\n",
            data->spilled_clusters);
    fprintf(out, "# HELP ri_kvs_spilled_bytes_total Payload bytes moved from the pool to disk.\n"
                 "# TYPE ri_kvs_spilled_bytes_total counter\nri_kvs_spilled_bytes_total %" PRIu64 "\n",
            data->spilled_bytes);
    fprintf(out, "# HELP ri_kvs_spill_failures_total Spill batches that stopped on a quota or I/O error.\n"
                 "# TYPE ri_kvs_spill_failures_total counter\nri_kvs_spill_failures_total %" PRIu64 "\n",
            data->spill_failures);
    fprintf(out, "# HELP ri_kvs_spill_abandoned_total Clusters written to disk but kept in the pool: touched, "
                 "pinned or dropped during their write.\n"
                 "# TYPE ri_kvs_spill_abandoned_total counter\nri_kvs_spill_abandoned_total %" PRIu64 "\n",
            data->spill_abandoned);
    fprintf(out, "# HELP ri_kvs_clusters_lost_total Clusters whose spill record failed verification.\n"
                 "# TYPE ri_kvs_clusters_lost_total counter\nri_kvs_clusters_lost_total %" PRIu64 "\n",
            data->lost_clusters);
    kvs_spill_metrics_write(data->spill, out);
}
