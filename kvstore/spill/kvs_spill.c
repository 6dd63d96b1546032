/*
 * The spill store: the in-memory index of records, segment files, batched
 * writes and verified reads, metrics.  Manifest, recovery and compaction are
 * in kvs_spill_persist.c.  Workload and guarantees: see kvs_spill.h.
 */
#define _GNU_SOURCE
#include "kvstore/spill/kvs_spill_int.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "common/cm_alloc.h"
#include "common/cm_log.h"
#include "common/cm_status.h"
#include "common/cm_time.h"

static CM_ALLOC_TAG(kvs_spill_tag, "kvs.spill");

/* Upper bounds of the write / read batch latency buckets, seconds. */
static const double hist_bounds[] = {
    0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 1.0,
};

void kvs_spill_config_default(kvs_spill_config_t *cfg)
{
    memset(cfg, 0, sizeof(*cfg));
    cfg->segment_bytes = 256ull << 20;
    cfg->align = 4096;
    cfg->max_record_bytes = 64u << 10;
    cfg->queue_depth = 32;
    cfg->io_contexts = 2;
    cfg->use_uring = true;
    cfg->direct_io = true;
    cfg->io_timeout_ms = 5000;
    cfg->max_retries = 2;
    cfg->compact_dead_ratio = 0.5;
    cfg->compact_interval_ms = 1000;
}

/* ---- hashing and the index ---- */

static uint64_t key_hash(const kvs_spill_key_t *k)
{
    uint64_t h = k->session * 0x9E3779B97F4A7C15ull;
    h ^= ((uint64_t)k->layer << 40) ^ ((uint64_t)k->head << 20) ^ k->cluster;
    h ^= h >> 31;
    h *= 0xBF58476D1CE4E5B9ull;
    h ^= h >> 29;
    return h;
}

static bool key_eq(const kvs_spill_key_t *a, const kvs_spill_key_t *b)
{
    return a->session == b->session && a->layer == b->layer && a->head == b->head && a->cluster == b->cluster;
}

int32_t spill_find(kvs_spill_t *sp, const kvs_spill_key_t *key)
{
    uint32_t b = (uint32_t)(key_hash(key) & (sp->n_buckets - 1));
    for (int32_t i = sp->buckets[b]; i >= 0; i = sp->ents[i].next)
        if (key_eq(&sp->ents[i].key, key))
            return i;
    return -1;
}

static ri_status_t grow_buckets(kvs_spill_t *sp)
{
    uint32_t nb = sp->n_buckets * 2;
    int32_t *b = cm_malloc(&kvs_spill_tag, (size_t)nb * sizeof(*b));
    if (b == NULL)
        return RI_ERR_NOMEM;
    for (uint32_t i = 0; i < nb; i++)
        b[i] = -1;
    for (uint32_t i = 0; i < sp->n_ents_cap; i++) {
        spill_ent_t *e = &sp->ents[i];
        if (!e->used)
            continue;
        uint32_t h = (uint32_t)(key_hash(&e->key) & (nb - 1));
        e->next = b[h];
        b[h] = (int32_t)i;
    }
    cm_free(sp->buckets);
    sp->buckets = b;
    sp->n_buckets = nb;
    return RI_OK;
}

static ri_status_t grow_ents(kvs_spill_t *sp)
{
    uint32_t cap = sp->n_ents_cap ? sp->n_ents_cap * 2 : 1024;
    if (cap > (uint32_t)INT32_MAX / 2)
        return RI_ERR_NOMEM;
    spill_ent_t *e = cm_realloc(&kvs_spill_tag, sp->ents, (size_t)cap * sizeof(*e));
    if (e == NULL)
        return RI_ERR_NOMEM;
    memset(e + sp->n_ents_cap, 0, (size_t)(cap - sp->n_ents_cap) * sizeof(*e));
    for (uint32_t i = cap; i-- > sp->n_ents_cap;) {
        e[i].next = sp->free_ent;
        sp->free_ent = (int32_t)i;
    }
    sp->ents = e;
    sp->n_ents_cap = cap;
    return RI_OK;
}

ri_status_t spill_index_put(kvs_spill_t *sp, const spill_ent_t *e)
{
    int32_t old = spill_find(sp, &e->key);
    if (old >= 0) {
        spill_ent_t *o = &sp->ents[old];
        if (o->seg != NULL)
            o->seg->live_bytes -= o->rec_bytes;
        if (o->lost)
            sp->st.lost_records--;
        int32_t next = o->next;
        *o = *e;
        o->used = true;
        o->next = next;
        if (o->seg != NULL)
            o->seg->live_bytes += o->rec_bytes;
        return RI_OK;
    }
    if (sp->free_ent < 0 && grow_ents(sp) != RI_OK)
        return RI_ERR_NOMEM;
    if (sp->n_live + 1 > sp->n_buckets && grow_buckets(sp) != RI_OK)
        return RI_ERR_NOMEM;
    int32_t i = sp->free_ent;
    spill_ent_t *n = &sp->ents[i];
    sp->free_ent = n->next;
    *n = *e;
    n->used = true;
    uint32_t b = (uint32_t)(key_hash(&e->key) & (sp->n_buckets - 1));
    n->next = sp->buckets[b];
    sp->buckets[b] = i;
    sp->n_live++;
    if (n->seg != NULL)
        n->seg->live_bytes += n->rec_bytes;
    return RI_OK;
}

void spill_index_del(kvs_spill_t *sp, int32_t idx)
{
    spill_ent_t *e = &sp->ents[idx];
    uint32_t b = (uint32_t)(key_hash(&e->key) & (sp->n_buckets - 1));
    int32_t *pp = &sp->buckets[b];
    while (*pp != idx)
        pp = &sp->ents[*pp].next;
    *pp = e->next;
    if (e->seg != NULL)
        e->seg->live_bytes -= e->rec_bytes;
    if (e->lost)
        sp->st.lost_records--;
    memset(e, 0, sizeof(*e));
    e->next = sp->free_ent;
    sp->free_ent = idx;
    sp->n_live--;
}

void spill_mark_lost(kvs_spill_t *sp, const kvs_spill_key_t *key, spill_seg_t *seg, uint64_t off, const char *why)
{
    int32_t i = spill_find(sp, key);
    if (i < 0 || sp->ents[i].seg != seg || sp->ents[i].off != off)
        return;   /* replaced or dropped meanwhile */
    spill_ent_t *e = &sp->ents[i];
    cm_error("spill: record session %llu layer %u head %u cluster %u in segment %u at offset %llu %s; "
             "marked lost",
             (unsigned long long)key->session, key->layer, key->head, key->cluster, seg->id,
             (unsigned long long)off, why);
    seg->live_bytes -= e->rec_bytes;
    e->seg = NULL;
    e->lost = true;
    sp->st.lost_records++;
}

/* ---- segments ---- */

void spill_seg_path(const kvs_spill_t *sp, uint32_t id, char *buf, size_t len)
{
    snprintf(buf, len, "%s/seg-%08u.dat", sp->cfg.dir, id);
}

static ri_status_t seg_list_add(kvs_spill_t *sp, spill_seg_t *seg)
{
    if (sp->n_segs == sp->segs_cap) {
        size_t cap = sp->segs_cap ? sp->segs_cap * 2 : 16;
        spill_seg_t **s = cm_realloc(&kvs_spill_tag, sp->segs, cap * sizeof(*s));
        if (s == NULL)
            return RI_ERR_NOMEM;
        sp->segs = s;
        sp->segs_cap = cap;
    }
    sp->segs[sp->n_segs++] = seg;
    return RI_OK;
}

ri_status_t spill_seg_open(kvs_spill_t *sp, uint32_t id, bool create, spill_seg_t **seg_p)
{
    const kvs_io_ops_t *ops = sp->ops;
    char path[4200];
    ri_status_t st;
    spill_seg_path(sp, id, path, sizeof(path));
    spill_seg_t *seg = cm_calloc(&kvs_spill_tag, 1, sizeof(*seg));
    if (seg == NULL)
        return RI_ERR_NOMEM;
    seg->id = id;
    int flags = sp->open_flags | O_CLOEXEC | (create ? O_CREAT | O_EXCL : 0);
    seg->fd = ops->open(ops->arg, path, flags, 0600);
    if (seg->fd < 0) {
        int err = errno;
        st = (err == EINVAL && (flags & O_DIRECT)) ? RI_ERR_UNSUPPORTED : cm_status_from_errno(err);
        cm_error("spill: open %s: %s%s", path, strerror(err),
                 st == RI_ERR_UNSUPPORTED ? " (the filesystem refuses O_DIRECT; set direct_io off or use "
                                            "another directory)"
                                          : "");
        goto err_free;
    }
    if (create) {
        if (ops->fallocate(ops->arg, seg->fd, 0, (off_t)sp->cfg.segment_bytes) != 0) {
            int err = errno;
            st = cm_status_from_errno(err);
            cm_error("spill: preallocating %llu bytes for %s: %s", (unsigned long long)sp->cfg.segment_bytes,
                     path, strerror(err));
            goto err_unlink;
        }
        seg->file_bytes = sp->cfg.segment_bytes;
    } else {
        struct stat sb;
        if (fstat(seg->fd, &sb) != 0) {
            int err = errno;
            st = cm_status_from_errno(err);
            cm_error("spill: stat %s: %s", path, strerror(err));
            goto err_close;
        }
        seg->file_bytes = (uint64_t)sb.st_size;
    }
    st = seg_list_add(sp, seg);
    if (st != RI_OK)
        goto err_unlink_if_created;
    if (id >= sp->next_seg_id)
        sp->next_seg_id = id + 1;
    *seg_p = seg;
    return RI_OK;

err_unlink_if_created:
    if (!create)
        goto err_close;
err_unlink:
    ops->unlink(ops->arg, path);
err_close:
    ops->close(ops->arg, seg->fd);
err_free:
    cm_free(seg);
    return st;
}

static void seg_close(kvs_spill_t *sp, spill_seg_t *seg)
{
    if (seg->fd >= 0)
        sp->ops->close(sp->ops->arg, seg->fd);
    cm_free(seg);
}

void spill_seg_unref(kvs_spill_t *sp, spill_seg_t *seg)
{
    if (--seg->refs == 0 && seg->dead)
        seg_close(sp, seg);
}

/* ---- I/O contexts ---- */

kvs_io_ctx_t *spill_ctx_get(kvs_spill_t *sp)
{
    pthread_mutex_lock(&sp->ctx_mu);
    for (;;) {
        for (unsigned i = 0; i < sp->n_ctxs; i++) {
            if (!sp->ctx_busy[i]) {
                sp->ctx_busy[i] = true;
                pthread_mutex_unlock(&sp->ctx_mu);
                return sp->ctxs[i];
            }
        }
        pthread_cond_wait(&sp->ctx_cv, &sp->ctx_mu);
    }
}

void spill_ctx_put(kvs_spill_t *sp, kvs_io_ctx_t *ctx)
{
    kvs_io_counters_t c;
    kvs_io_ctx_take_counters(ctx, &c);
    pthread_mutex_lock(&sp->mu);
    sp->st.io_errors += c.errors;
    sp->st.io_retries += c.retries;
    sp->st.io_timeouts += c.timeouts;
    pthread_mutex_unlock(&sp->mu);
    pthread_mutex_lock(&sp->ctx_mu);
    for (unsigned i = 0; i < sp->n_ctxs; i++)
        if (sp->ctxs[i] == ctx)
            sp->ctx_busy[i] = false;
    pthread_cond_signal(&sp->ctx_cv);
    pthread_mutex_unlock(&sp->ctx_mu);
}

ri_status_t spill_res_status(int res, uint32_t len, bool is_read)
{
    if (res == (int)len)
        return RI_OK;
    if (res >= 0)
        return is_read ? RI_ERR_EOF : RI_ERR_IO;
    if (res == -ETIMEDOUT)
        return RI_ERR_TIMEOUT;
    return cm_status_from_errno(-res);
}

/* ---- create / destroy ---- */

static ri_status_t check_config(const kvs_spill_config_t *c)
{
    if (c->dir == NULL || c->dir[0] == '\0' || strlen(c->dir) >= 4000)
        return RI_ERR_INVALID;
    if (c->align < 512 || (c->align & (c->align - 1)) != 0 || c->align > (1u << 20))
        return RI_ERR_INVALID;
    if (c->max_record_bytes < c->align || c->queue_depth == 0 || c->queue_depth > 4096 || c->io_contexts == 0 ||
        c->io_contexts > 64 || c->io_timeout_ms == 0)
        return RI_ERR_INVALID;
    if (c->segment_bytes < CM_ALIGN_UP((uint64_t)c->max_record_bytes, c->align) ||
        c->segment_bytes % c->align != 0)
        return RI_ERR_INVALID;
    if (c->compact_dead_ratio <= 0.0 || c->compact_dead_ratio > 1.0)
        return RI_ERR_INVALID;
    return RI_OK;
}

ri_status_t spill_alloc(const kvs_spill_config_t *cfg, kvs_spill_t **sp_p)
{
    ri_status_t st = check_config(cfg);
    if (st != RI_OK) {
        cm_error("spill: invalid configuration (dir, align, record size, queue depth, contexts, segment size "
                 "or compaction ratio)");
        return st;
    }
    kvs_spill_t *sp = cm_calloc(&kvs_spill_tag, 1, sizeof(*sp));
    if (sp == NULL)
        return RI_ERR_NOMEM;
    sp->cfg = *cfg;
    snprintf(sp->dir_buf, sizeof(sp->dir_buf), "%s", cfg->dir);
    sp->cfg.dir = sp->dir_buf;
    sp->cfg.max_record_bytes = (uint32_t)CM_ALIGN_UP(cfg->max_record_bytes, cfg->align);
    sp->ops = cfg->ops ? cfg->ops : kvs_io_ops_default();
    sp->open_flags = O_RDWR | (cfg->direct_io ? O_DIRECT : 0);
    sp->free_ent = -1;
    sp->next_seq = 1;
    pthread_mutex_init(&sp->mu, NULL);
    pthread_rwlock_init(&sp->wbar, NULL);
    pthread_mutex_init(&sp->compact_mu, NULL);
    pthread_mutex_init(&sp->ctx_mu, NULL);
    pthread_cond_init(&sp->ctx_cv, NULL);
    pthread_cond_init(&sp->compact_cv, NULL);
    cm_hist_init(&sp->write_hist, hist_bounds, CM_ARRAY_LEN(hist_bounds));
    cm_hist_init(&sp->read_hist, hist_bounds, CM_ARRAY_LEN(hist_bounds));

    st = RI_ERR_NOMEM;
    sp->n_buckets = 1024;
    sp->buckets = cm_malloc(&kvs_spill_tag, sp->n_buckets * sizeof(*sp->buckets));
    sp->ctxs = cm_calloc(&kvs_spill_tag, cfg->io_contexts, sizeof(*sp->ctxs));
    sp->ctx_busy = cm_calloc(&kvs_spill_tag, cfg->io_contexts, sizeof(*sp->ctx_busy));
    if (sp->buckets == NULL || sp->ctxs == NULL || sp->ctx_busy == NULL)
        goto err_free;
    for (uint32_t i = 0; i < sp->n_buckets; i++)
        sp->buckets[i] = -1;

    if (mkdir(sp->cfg.dir, 0700) != 0 && errno != EEXIST) {
        int err = errno;
        st = cm_status_from_errno(err);
        cm_error("spill: mkdir %s: %s", sp->cfg.dir, strerror(err));
        goto err_free;
    }

    kvs_io_ctx_config_t icfg = {
        .queue_depth = cfg->queue_depth,
        .slot_bytes = sp->cfg.max_record_bytes,
        .use_uring = cfg->use_uring,
        .timeout_ms = cfg->io_timeout_ms,
        .max_retries = cfg->max_retries,
        .ops = sp->ops,
    };
    for (unsigned i = 0; i < cfg->io_contexts; i++) {
        st = kvs_io_ctx_create(&icfg, &sp->ctxs[i]);
        if (st != RI_OK)
            goto err_free;
        sp->n_ctxs++;
    }
    if (cfg->use_uring && !kvs_io_ctx_uses_uring(sp->ctxs[0]))
        cm_warn("spill: io_uring unavailable (%s); using the pread/pwrite path",
                kvs_io_ctx_uring_error(sp->ctxs[0]));
    *sp_p = sp;
    return RI_OK;

err_free:
    spill_free(sp);
    return st;
}

void spill_free(kvs_spill_t *sp)
{
    if (sp == NULL)
        return;
    for (size_t i = 0; i < sp->n_segs; i++)
        seg_close(sp, sp->segs[i]);
    cm_free(sp->segs);
    for (unsigned i = 0; i < sp->n_ctxs; i++)
        kvs_io_ctx_destroy(sp->ctxs[i]);
    cm_free(sp->ctxs);
    cm_free(sp->ctx_busy);
    cm_free(sp->buckets);
    cm_free(sp->ents);
    pthread_cond_destroy(&sp->compact_cv);
    pthread_cond_destroy(&sp->ctx_cv);
    pthread_mutex_destroy(&sp->ctx_mu);
    pthread_mutex_destroy(&sp->compact_mu);
    pthread_rwlock_destroy(&sp->wbar);
    pthread_mutex_destroy(&sp->mu);
    cm_free(sp);
}

ri_status_t kvs_spill_create(const kvs_spill_config_t *cfg, kvs_spill_t **sp_p)
{
    if (cfg == NULL || sp_p == NULL)
        return RI_ERR_INVALID;
    kvs_spill_t *sp;
    ri_status_t st = spill_alloc(cfg, &sp);
    if (st != RI_OK)
        return st;
    st = spill_wipe_dir(sp);
    if (st != RI_OK)
        goto err_free;
    /* Open the first segment now, so that a filesystem without O_DIRECT or a
     * full disk shows at start, not at the first spill. */
    st = spill_seg_open(sp, sp->next_seg_id, true, &sp->active);
    if (st != RI_OK)
        goto err_free;
    sp->active->active = true;
    st = spill_checkpoint(sp);
    if (st != RI_OK)
        goto err_free;
    st = spill_compactor_start(sp);
    if (st != RI_OK)
        goto err_free;
    *sp_p = sp;
    return RI_OK;

err_free:
    spill_free(sp);
    return st;
}

void kvs_spill_destroy(kvs_spill_t *sp)
{
    if (sp == NULL)
        return;
    spill_compactor_stop(sp);
    ri_status_t st = spill_checkpoint(sp);
    if (st != RI_OK)
        cm_error("spill: final manifest not written (%s); records written since the last sync will be "
                 "recovered by scanning",
                 ri_status_str(st));
    spill_free(sp);
}

/* ---- write ---- */

/* One record of a write batch, as the I/O callbacks see it. */
typedef struct wjob {
    kvs_spill_wreq_t *req;   /* caller's entry */
    spill_seg_t *seg;        /* where it goes */
    uint64_t off;            /* offset in seg */
    uint32_t rec_bytes;      /* aligned size */
    uint64_t seq;            /* sequence number */
    uint32_t crc;            /* CRC written */
} wjob_t;

typedef struct wbatch {
    kvs_spill_t *sp;
    wjob_t *jobs;
    size_t n;
} wbatch_t;

static ri_status_t write_prep(void *arg, size_t i, void *slot, int *fd_p, uint64_t *off_p, uint32_t *len_p)
{
    wbatch_t *b = arg;
    wjob_t *j = &b->jobs[i];
    const kvs_spill_wreq_t *r = j->req;
    kvs_spill_hdr_t h = {
        .dtype = r->dtype,
        .tokens = r->tokens,
        .session = r->key.session,
        .layer = r->key.layer,
        .head = r->key.head,
        .cluster = r->key.cluster,
        .payload_bytes = r->payload_bytes,
        .seq = j->seq,
    };
    uint8_t *p = slot;
    memcpy(p + KVS_SPILL_HDR_BYTES, r->payload, r->payload_bytes);
    j->crc = kvs_spill_hdr_encode(&h, p + KVS_SPILL_HDR_BYTES, p);
    memset(p + KVS_SPILL_HDR_BYTES + r->payload_bytes, 0, j->rec_bytes - KVS_SPILL_HDR_BYTES - r->payload_bytes);
#ifdef KVS_SPILL_MUTANT_LOST_WRITE /* the mutant (tests only): the disk keeps zeros, the batch says written */
    memset(p, 0, j->rec_bytes);
#endif
    *fd_p = j->seg->fd;
    *off_p = j->off;
    *len_p = j->rec_bytes;
    return RI_OK;
}

static void write_done(void *arg, size_t i, void *slot, int res)
{
    wbatch_t *b = arg;
    wjob_t *j = &b->jobs[i];
    j->req->status = spill_res_status(res, j->rec_bytes, false);
}

/* Reserve space for every job (mu held); sets statuses of those that fail. */
static void write_reserve(kvs_spill_t *sp, wjob_t *jobs, size_t n, const spill_move_t *moves)
{
    for (size_t i = 0; i < n; i++) {
        wjob_t *j = &jobs[i];
        if (sp->active == NULL || sp->active->append + j->rec_bytes > sp->active->file_bytes) {
            spill_seg_t *seg;
            ri_status_t st = spill_seg_open(sp, sp->next_seg_id, true, &seg);
            if (st != RI_OK) {
                for (size_t k = i; k < n; k++)
                    jobs[k].req->status = st;
                return;
            }
            if (sp->active != NULL)
                sp->active->active = false;
            sp->active = seg;
            seg->active = true;
        }
        j->seg = sp->active;
        j->off = sp->active->append;
        sp->active->append += j->rec_bytes;
        sp->active->refs++;
        sp->used_bytes += j->rec_bytes;
        j->seq = moves ? moves[j - jobs].seq : sp->next_seq++;
    }
}

/* Enter the written records into the index (mu held). */
static void write_commit(kvs_spill_t *sp, wjob_t *jobs, size_t n, const spill_move_t *moves)
{
    for (size_t i = 0; i < n; i++) {
        wjob_t *j = &jobs[i];
        if (j->seg == NULL)
            continue;
        kvs_spill_wreq_t *r = j->req;
        if (r->status == RI_OK) {
            j->seg->dirty = true;
            if (moves != NULL) {
                /* Compaction: the move counts only if nobody replaced,
                 * removed or dropped the record meanwhile. */
                int32_t e = spill_find(sp, &r->key);
                if (e < 0 || sp->ents[e].seg != moves[i].old_seg || sp->ents[e].off != moves[i].old_off) {
                    spill_seg_unref(sp, j->seg);
                    continue;
                }
            }
            spill_ent_t ent = {
                .key = r->key,
                .seg = j->seg,
                .off = j->off,
                .seq = j->seq,
                .rec_bytes = j->rec_bytes,
                .payload_bytes = r->payload_bytes,
                .tokens = r->tokens,
                .crc = j->crc,
                .dtype = r->dtype,
            };
            r->status = spill_index_put(sp, &ent);
            if (r->status == RI_OK && moves == NULL) {
                sp->st.written_records++;
                sp->st.written_bytes += r->payload_bytes;
            }
        }
        spill_seg_unref(sp, j->seg);
    }
}

ri_status_t spill_write_internal(kvs_spill_t *sp, kvs_spill_wreq_t *reqs, size_t n, const spill_move_t *moves)
{
    uint64_t t0 = cm_time_ns();
    ri_status_t ret = RI_OK;
    wjob_t *jobs = cm_calloc(&kvs_spill_tag, n ? n : 1, sizeof(*jobs));
    if (jobs == NULL) {
        for (size_t i = 0; i < n; i++)
            reqs[i].status = RI_ERR_NOMEM;
        return RI_ERR_NOMEM;
    }
    /* Validate; the valid entries become jobs, in order. */
    size_t nj = 0;
    uint64_t total = 0;
    for (size_t i = 0; i < n; i++) {
        kvs_spill_wreq_t *r = &reqs[i];
        r->status = RI_OK;
        if (r->key.session == 0 || r->payload == NULL || r->payload_bytes == 0) {
            r->status = RI_ERR_INVALID;
            continue;
        }
        uint64_t rec = kvs_spill_rec_bytes(r->payload_bytes, sp->cfg.align);
        if (rec > sp->cfg.max_record_bytes) {
            r->status = RI_ERR_TOO_LARGE;
            continue;
        }
        jobs[nj].req = r;
        jobs[nj].rec_bytes = (uint32_t)rec;
        total += rec;
        nj++;
    }
    /* Compaction passes moves 1:1 with reqs, all valid; keep the mapping. */
    if (moves != NULL && nj != n) {
        ret = RI_ERR_INTERNAL;
        goto out_free;
    }

    pthread_rwlock_rdlock(&sp->wbar);
    pthread_mutex_lock(&sp->mu);
    if (moves == NULL && sp->cfg.quota_bytes != 0 &&
        sp->used_bytes + total > sp->cfg.quota_bytes) {
        sp->st.quota_rejections++;
        /* Dead space counts until compaction reclaims it: wake the compactor. */
        pthread_cond_signal(&sp->compact_cv);
        pthread_mutex_unlock(&sp->mu);
        pthread_rwlock_unlock(&sp->wbar);
        cm_warn("spill: write of %zu records (%llu bytes) refused: disk quota %llu bytes, %llu used", n,
                (unsigned long long)total, (unsigned long long)sp->cfg.quota_bytes,
                (unsigned long long)sp->used_bytes);
        for (size_t i = 0; i < n; i++)
            reqs[i].status = RI_ERR_QUOTA;
        ret = RI_ERR_QUOTA;
        goto out_free;
    }
    write_reserve(sp, jobs, nj, moves);
    pthread_mutex_unlock(&sp->mu);

    /* Jobs that got no space are skipped by the runner (prep not called for
     * them is simpler: run only the reserved prefix). */
    size_t nres = 0;
    while (nres < nj && jobs[nres].seg != NULL)
        nres++;
    wbatch_t b = {.sp = sp, .jobs = jobs, .n = nres};
    kvs_io_ctx_t *ctx = spill_ctx_get(sp);
    (void)kvs_io_ctx_run(ctx, KVS_IO_WRITE, nres, write_prep, write_done, &b);
    spill_ctx_put(sp, ctx);

    pthread_mutex_lock(&sp->mu);
    write_commit(sp, jobs, nres, moves);
    cm_hist_add(&sp->write_hist, (double)(cm_time_ns() - t0) * 1e-9);
    pthread_mutex_unlock(&sp->mu);
    pthread_rwlock_unlock(&sp->wbar);

    size_t failed = 0;
    for (size_t i = 0; i < n; i++) {
        if (reqs[i].status != RI_OK) {
            if (ret == RI_OK)
                ret = reqs[i].status;
            failed++;
        }
    }
    if (failed > 0 && moves == NULL)
        cm_error("spill: %zu of %zu records not written (first error: %s)", failed, n, ri_status_str(ret));

out_free:
    cm_free(jobs);
    return ret;
}

ri_status_t kvs_spill_write(kvs_spill_t *sp, kvs_spill_wreq_t *reqs, size_t n)
{
    if (sp == NULL || (reqs == NULL && n > 0))
        return RI_ERR_INVALID;
    return spill_write_internal(sp, reqs, n, NULL);
}

/* ---- read ---- */

/* Raw reads: each entry names its location and expected header. */
typedef struct rbatch {
    spill_raw_t *raws;
} rbatch_t;

static ri_status_t raw_prep(void *arg, size_t i, void *slot, int *fd_p, uint64_t *off_p, uint32_t *len_p)
{
    spill_raw_t *r = &((rbatch_t *)arg)->raws[i];
    if (r->status != RI_OK)
        return r->status;
    *fd_p = r->seg->fd;
    *off_p = r->off;
    *len_p = r->rec_bytes;
    return RI_OK;
}

/* Is the record image read from disk the one the index expects?  The header
 * must match field by field (a record of another key or an older version at
 * that offset is as wrong as a flipped bit), and the CRC must hold. */
static bool image_matches(const uint8_t *img, const kvs_spill_hdr_t *want)
{
    kvs_spill_hdr_t h;
    return kvs_spill_hdr_decode(img, &h) == RI_OK && h.session == want->session && h.layer == want->layer &&
           h.head == want->head && h.cluster == want->cluster && h.seq == want->seq &&
           h.payload_bytes == want->payload_bytes && h.tokens == want->tokens && h.dtype == want->dtype &&
#ifdef KVS_SPILL_MUTANT_NO_READ_CRC /* the mutant (tests only): a read-back trusts the header alone */
           true;
#else
           kvs_spill_rec_verify(img, want) == RI_OK;
#endif
}

static void raw_done(void *arg, size_t i, void *slot, int res)
{
    spill_raw_t *r = &((rbatch_t *)arg)->raws[i];
    r->status = spill_res_status(res, r->rec_bytes, true);
    if (r->status != RI_OK)
        return;
    const uint8_t *img = slot;
    if (!image_matches(img, &r->hdr)) {
        r->status = RI_ERR_CORRUPT;
        return;
    }
    memcpy(r->image, img, KVS_SPILL_HDR_BYTES + r->hdr.payload_bytes);
}

/* Run raw reads (refs on the segments held by the caller); mark failures of
 * the checksum lost and drop the refs. */
void spill_read_raw(kvs_spill_t *sp, spill_raw_t *raws, size_t n)
{
    rbatch_t b = {.raws = raws};
    kvs_io_ctx_t *ctx = spill_ctx_get(sp);
    (void)kvs_io_ctx_run(ctx, KVS_IO_READ, n, raw_prep, raw_done, &b);
    spill_ctx_put(sp, ctx);
    pthread_mutex_lock(&sp->mu);
    for (size_t i = 0; i < n; i++) {
        spill_raw_t *r = &raws[i];
        if (r->seg == NULL)
            continue;
        if (r->status == RI_ERR_CORRUPT) {
            sp->st.checksum_failures++;
            kvs_spill_key_t key = {r->hdr.session, r->hdr.layer, r->hdr.head, r->hdr.cluster};
            spill_mark_lost(sp, &key, r->seg, r->off, "failed its header or CRC32C check");
        }
        spill_seg_unref(sp, r->seg);
    }
    pthread_mutex_unlock(&sp->mu);
}

/* Fill raws[i] from the index entry for key (mu held): status, location,
 * expected header, a segment ref. */
static void raw_lookup(kvs_spill_t *sp, const kvs_spill_key_t *key, spill_raw_t *r)
{
    memset(r, 0, sizeof(*r));
    int32_t i = spill_find(sp, key);
    if (i < 0) {
        r->status = RI_ERR_NOT_FOUND;
        return;
    }
    spill_ent_t *e = &sp->ents[i];
    if (e->lost || e->seg == NULL) {
        r->status = RI_ERR_CORRUPT;
        return;
    }
    r->ent = i;
    r->seg = e->seg;
    r->off = e->off;
    r->rec_bytes = e->rec_bytes;
    r->hdr = (kvs_spill_hdr_t){
        .dtype = e->dtype,
        .tokens = e->tokens,
        .session = key->session,
        .layer = key->layer,
        .head = key->head,
        .cluster = key->cluster,
        .payload_bytes = e->payload_bytes,
        .seq = e->seq,
        .crc = e->crc,
    };
    r->status = RI_OK;
    e->seg->refs++;
}

/* User reads: the payload goes from the bounce slot straight into the
 * caller's buffer, and only after the header and CRC checks pass. */
typedef struct ubatch {
    spill_raw_t *raws;
    kvs_spill_rreq_t *reqs;
} ubatch_t;

static ri_status_t user_prep(void *arg, size_t i, void *slot, int *fd_p, uint64_t *off_p, uint32_t *len_p)
{
    ubatch_t *b = arg;
    rbatch_t rb = {.raws = b->raws};
    return raw_prep(&rb, i, slot, fd_p, off_p, len_p);
}

static void user_done(void *arg, size_t i, void *slot, int res)
{
    ubatch_t *b = arg;
    spill_raw_t *r = &b->raws[i];
    kvs_spill_rreq_t *q = &b->reqs[i];
    r->status = spill_res_status(res, r->rec_bytes, true);
    if (r->status != RI_OK)
        return;
    const uint8_t *img = slot;
    if (!image_matches(img, &r->hdr)) {
        r->status = RI_ERR_CORRUPT;
        return;
    }
    memcpy(q->buf, img + KVS_SPILL_HDR_BYTES, r->hdr.payload_bytes);
    q->payload_bytes = r->hdr.payload_bytes;
    q->tokens = r->hdr.tokens;
    q->dtype = r->hdr.dtype;
}

ri_status_t kvs_spill_read(kvs_spill_t *sp, kvs_spill_rreq_t *reqs, size_t n)
{
    if (sp == NULL || (reqs == NULL && n > 0))
        return RI_ERR_INVALID;
    uint64_t t0 = cm_time_ns();
    spill_raw_t *raws = cm_calloc(&kvs_spill_tag, n ? n : 1, sizeof(*raws));
    if (raws == NULL) {
        for (size_t i = 0; i < n; i++)
            reqs[i].status = RI_ERR_NOMEM;
        return RI_ERR_NOMEM;
    }
    pthread_mutex_lock(&sp->mu);
    for (size_t i = 0; i < n; i++) {
        raw_lookup(sp, &reqs[i].key, &raws[i]);
        if (raws[i].status == RI_OK && (reqs[i].buf == NULL || reqs[i].buf_bytes < raws[i].hdr.payload_bytes)) {
            spill_seg_unref(sp, raws[i].seg);
            raws[i].seg = NULL;
            raws[i].status = RI_ERR_RANGE;
        }
    }
    pthread_mutex_unlock(&sp->mu);

    ubatch_t b = {.raws = raws, .reqs = reqs};
    kvs_io_ctx_t *ctx = spill_ctx_get(sp);
    (void)kvs_io_ctx_run(ctx, KVS_IO_READ, n, user_prep, user_done, &b);
    spill_ctx_put(sp, ctx);

    ri_status_t ret = RI_OK;
    size_t failed_io = 0, first = 0;
    pthread_mutex_lock(&sp->mu);
    for (size_t i = 0; i < n; i++) {
        spill_raw_t *r = &raws[i];
        reqs[i].status = r->status;
        if (r->status == RI_OK) {
            sp->st.read_records++;
            sp->st.read_bytes += r->hdr.payload_bytes;
        } else if (ret == RI_OK) {
            ret = r->status;
        }
        if (r->seg == NULL)
            continue;
        if (r->status == RI_ERR_CORRUPT) {
            sp->st.checksum_failures++;
            spill_mark_lost(sp, &reqs[i].key, r->seg, r->off, "failed its header or CRC32C check");
        } else if (r->status != RI_OK && failed_io++ == 0) {
            first = i;
        }
        spill_seg_unref(sp, r->seg);
    }
    cm_hist_add(&sp->read_hist, (double)(cm_time_ns() - t0) * 1e-9);
    pthread_mutex_unlock(&sp->mu);
    if (failed_io > 0)
        cm_error("spill: %zu of %zu records not read (first: session %llu layer %u head %u cluster %u: %s)",
                 failed_io, n, (unsigned long long)reqs[first].key.session, reqs[first].key.layer,
                 reqs[first].key.head, reqs[first].key.cluster, ri_status_str(reqs[first].status));
    cm_free(raws);
    return ret;
}

void spill_raw_lookup_locked(kvs_spill_t *sp, const kvs_spill_key_t *key, spill_raw_t *r)
{
    raw_lookup(sp, key, r);
}

/* ---- remove, drop, stat, foreach ---- */

void kvs_spill_remove(kvs_spill_t *sp, const kvs_spill_key_t *keys, size_t n)
{
    if (sp == NULL || keys == NULL)
        return;
    pthread_mutex_lock(&sp->mu);
    for (size_t i = 0; i < n; i++) {
        int32_t e = spill_find(sp, &keys[i]);
        if (e >= 0)
            spill_index_del(sp, e);
    }
    pthread_mutex_unlock(&sp->mu);
}

ri_status_t kvs_spill_drop_session(kvs_spill_t *sp, uint64_t session, uint64_t *bytes_freed_p)
{
    if (sp == NULL || session == 0)
        return RI_ERR_INVALID;
    uint64_t freed = 0, n = 0;
    pthread_mutex_lock(&sp->mu);
    for (uint32_t i = 0; i < sp->n_ents_cap; i++) {
        spill_ent_t *e = &sp->ents[i];
        if (!e->used || e->key.session != session)
            continue;
        freed += e->rec_bytes;
        n++;
        spill_index_del(sp, (int32_t)i);
    }
    pthread_cond_signal(&sp->compact_cv);
    pthread_mutex_unlock(&sp->mu);
    if (bytes_freed_p != NULL)
        *bytes_freed_p = freed;
    if (n == 0)
        return RI_ERR_NOT_FOUND;
    /* Persist the drop, so that a restart does not bring the session back. */
    return spill_checkpoint(sp);
}

static void fill_info(const spill_ent_t *e, kvs_spill_info_t *info)
{
    info->key = e->key;
    info->dtype = e->dtype;
    info->tokens = e->tokens;
    info->payload_bytes = e->payload_bytes;
    info->lost = e->lost;
}

ri_status_t kvs_spill_stat(kvs_spill_t *sp, const kvs_spill_key_t *key, kvs_spill_info_t *info_p)
{
    if (sp == NULL || key == NULL || info_p == NULL)
        return RI_ERR_INVALID;
    pthread_mutex_lock(&sp->mu);
    int32_t e = spill_find(sp, key);
    if (e >= 0)
        fill_info(&sp->ents[e], info_p);
    pthread_mutex_unlock(&sp->mu);
    return e >= 0 ? RI_OK : RI_ERR_NOT_FOUND;
}

void kvs_spill_foreach(kvs_spill_t *sp, uint64_t session, kvs_spill_visit_fn_t fn, void *arg)
{
    if (sp == NULL || fn == NULL)
        return;
    pthread_mutex_lock(&sp->mu);
    for (uint32_t i = 0; i < sp->n_ents_cap; i++) {
        const spill_ent_t *e = &sp->ents[i];
        if (!e->used || (session != 0 && e->key.session != session))
            continue;
        kvs_spill_info_t info;
        fill_info(e, &info);
        fn(arg, &info);
    }
    pthread_mutex_unlock(&sp->mu);
}

/* ---- stats and metrics ---- */

static void stats_locked(kvs_spill_t *sp, kvs_spill_stats_t *s)
{
    *s = sp->st;
    s->disk_bytes = 0;
    s->live_bytes = 0;
    for (size_t i = 0; i < sp->n_segs; i++) {
        s->disk_bytes += sp->segs[i]->file_bytes;
        s->live_bytes += sp->segs[i]->live_bytes;
    }
    s->used_bytes = sp->used_bytes;
    s->segments = sp->n_segs;
    s->records = sp->n_live - sp->st.lost_records;
    bool uring = true;
    for (unsigned i = 0; i < sp->n_ctxs; i++)
        uring = uring && kvs_io_ctx_uses_uring(sp->ctxs[i]);
    s->uring = uring;
}

void kvs_spill_stats(kvs_spill_t *sp, kvs_spill_stats_t *stats_p)
{
    pthread_mutex_lock(&sp->mu);
    stats_locked(sp, stats_p);
    pthread_mutex_unlock(&sp->mu);
}

static void metric(FILE *out, const char *name, const char *type, const char *help, uint64_t v)
{
    fprintf(out, "# HELP %s %s\n# TYPE %s %s\n%s %llu\n", name, help, name, type, name, (unsigned long long)v);
}

void kvs_spill_metrics_write(kvs_spill_t *sp, FILE *out)
{
    kvs_spill_stats_t s;
    cm_hist_t wh, rh;
    pthread_mutex_lock(&sp->mu);
    stats_locked(sp, &s);
    cm_hist_copy(&wh, &sp->write_hist); /* the adds hold mu too: one instant */
    cm_hist_copy(&rh, &sp->read_hist);
    pthread_mutex_unlock(&sp->mu);
    metric(out, "kvs_spill_disk_bytes", "gauge", "Bytes of spill segment files (preallocated).", s.disk_bytes);
    metric(out, "kvs_spill_used_bytes", "gauge", "Record bytes appended and not yet reclaimed (quota).",
           s.used_bytes);
    metric(out, "kvs_spill_live_bytes", "gauge", "Record bytes of live records.", s.live_bytes);
    metric(out, "kvs_spill_quota_bytes", "gauge", "Disk quota of the spill tier (0 = none).", sp->cfg.quota_bytes);
    metric(out, "kvs_spill_records", "gauge", "Live spilled records.", s.records);
    metric(out, "kvs_spill_lost_records", "gauge", "Records that failed verification and are never served.",
           s.lost_records);
    metric(out, "kvs_spill_segments", "gauge", "Segment files.", s.segments);
    metric(out, "kvs_spill_uring", "gauge", "1 when every I/O context uses io_uring, 0 on the pread path.",
           s.uring ? 1 : 0);
    metric(out, "kvs_spill_written_records_total", "counter", "Records spilled.", s.written_records);
    metric(out, "kvs_spill_written_bytes_total", "counter", "Payload bytes spilled.", s.written_bytes);
    metric(out, "kvs_spill_read_records_total", "counter", "Records read back and served.", s.read_records);
    metric(out, "kvs_spill_read_bytes_total", "counter", "Payload bytes read back and served.", s.read_bytes);
    metric(out, "kvs_spill_checksum_failures_total", "counter", "Reads that failed CRC32C or header checks.",
           s.checksum_failures);
    metric(out, "kvs_spill_io_errors_total", "counter", "Transfers that failed after retries.", s.io_errors);
    metric(out, "kvs_spill_io_retries_total", "counter", "Transfers re-issued after EIO/EAGAIN/short.",
           s.io_retries);
    metric(out, "kvs_spill_io_timeouts_total", "counter", "io_uring completions that never arrived.",
           s.io_timeouts);
    metric(out, "kvs_spill_quota_rejections_total", "counter", "Write batches refused by the disk quota.",
           s.quota_rejections);
    metric(out, "kvs_spill_compactions_total", "counter", "Segments reclaimed by compaction.", s.compactions);
    metric(out, "kvs_spill_compacted_bytes_total", "counter", "Bytes reclaimed by compaction.", s.compacted_bytes);
    cm_hist_write_prom(&wh, out, "kvs_spill_write_batch_seconds", "Latency of one spill write batch.", NULL);
    cm_hist_write_prom(&rh, out, "kvs_spill_read_batch_seconds", "Latency of one spill read batch.", NULL);
}
