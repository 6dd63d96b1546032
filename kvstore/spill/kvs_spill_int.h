/*
 * Internals of the spill store shared by kvs_spill.c (index, write, read) and
 * kvs_spill_persist.c (manifest, recovery, compaction).  Not for other modules.
 *
 * Locking: `mu` guards the index, the segment list and the counters; I/O runs
 * outside it.  `wbar` is a write barrier: writers hold it shared for a whole
 * batch, sync holds it exclusive so that a manifest never misses a record
 * whose write was in flight.  `compact_mu` lets one compaction run at a time.
 * I/O contexts are handed out one per batch from `ctxs` (ctx_mu, ctx_cv).
 */
#ifndef KVS_SPILL_INT_H
#define KVS_SPILL_INT_H

#include <pthread.h>
#include <stdatomic.h>

#include "common/cm_hist.h"
#include "kvstore/spill/kvs_spill.h"
#include "kvstore/spill/kvs_spill_format.h"

/* One segment file. */
typedef struct spill_seg {
    uint32_t id;             /* file seg-<id>.dat */
    int fd;                  /* open O_RDWR (| O_DIRECT) */
    uint64_t append;         /* next free byte; everything below is used */
    uint64_t file_bytes;     /* file size (preallocated) */
    uint64_t live_bytes;     /* record bytes of live index entries */
    uint32_t refs;           /* I/O in flight on it */
    bool active;             /* new records go here */
    bool dead;               /* off the list; close when refs drop to 0 */
    bool dirty;              /* written since its last fsync */
} spill_seg_t;

/* One record in the index. */
typedef struct spill_ent {
    kvs_spill_key_t key;     /* identity */
    spill_seg_t *seg;        /* where it is; NULL once lost */
    uint64_t off;            /* byte offset in seg */
    uint64_t seq;            /* sequence number in its header */
    uint32_t rec_bytes;      /* bytes on disk (aligned) */
    uint32_t payload_bytes;  /* payload size */
    uint32_t tokens;         /* token count */
    uint32_t crc;            /* CRC32C from its header */
    uint16_t dtype;          /* element type */
    bool used;               /* slot holds a record (else on the free list) */
    bool lost;               /* failed verification */
    int32_t next;            /* hash chain or free list, -1 = end */
} spill_ent_t;

struct kvs_spill {
    kvs_spill_config_t cfg;         /* settings (dir points at dir_buf) */
    char dir_buf[4096];             /* owned copy of the directory path */
    const kvs_io_ops_t *ops;        /* system calls */
    int open_flags;                 /* O_RDWR | O_DIRECT (when direct_io) */

    pthread_mutex_t mu;             /* index, segments, counters */
    pthread_rwlock_t wbar;          /* write barrier (see above) */
    pthread_mutex_t compact_mu;     /* one compaction at a time */

    spill_ent_t *ents;              /* entry slots */
    uint32_t n_ents_cap;            /* slots allocated */
    int32_t free_ent;               /* free list head */
    int32_t *buckets;               /* hash heads */
    uint32_t n_buckets;             /* power of two */
    uint64_t n_live;                /* used entries (lost included) */

    spill_seg_t **segs;             /* live segments */
    size_t n_segs, segs_cap;        /* list size */
    spill_seg_t *active;            /* current append target (may be NULL) */
    uint32_t next_seg_id;           /* id for the next segment */
    uint64_t next_seq;              /* sequence for the next record */
    uint64_t used_bytes;            /* appended bytes over live segments (quota) */

    kvs_io_ctx_t **ctxs;            /* I/O contexts */
    bool *ctx_busy;                 /* handed out */
    unsigned n_ctxs;                /* count */
    pthread_mutex_t ctx_mu;         /* guards ctx_busy */
    pthread_cond_t ctx_cv;          /* signalled on release */

    kvs_spill_stats_t st;           /* counters (gauges filled on read) */
    cm_hist_t write_hist;           /* write batch latency */
    cm_hist_t read_hist;            /* read batch latency */

    pthread_t compact_thread;       /* background compaction */
    bool compact_running;           /* thread started */
    bool stopping;                  /* tell the thread to stop */
    pthread_cond_t compact_cv;      /* wakes the thread (under mu) */
};

/* ---- kvs_spill.c ---- */

/* Allocate the store object, locks, contexts; no files touched. */
ri_status_t spill_alloc(const kvs_spill_config_t *cfg, kvs_spill_t **sp_p);
/* Free what spill_alloc made and close segment fds (no manifest). */
void spill_free(kvs_spill_t *sp);
/* Index lookup (mu held); -1 when absent. */
int32_t spill_find(kvs_spill_t *sp, const kvs_spill_key_t *key);
/* Insert or replace (mu held); the replaced entry's bytes become dead. */
ri_status_t spill_index_put(kvs_spill_t *sp, const spill_ent_t *e);
/* Remove entry idx (mu held). */
void spill_index_del(kvs_spill_t *sp, int32_t idx);
/* Open or create segment id (mu held); adds it to the list. */
ri_status_t spill_seg_open(kvs_spill_t *sp, uint32_t id, bool create, spill_seg_t **seg_p);
/* Drop an I/O reference (mu held); closes a dead segment at 0. */
void spill_seg_unref(kvs_spill_t *sp, spill_seg_t *seg);
/* Path of segment id into buf. */
void spill_seg_path(const kvs_spill_t *sp, uint32_t id, char *buf, size_t len);
/* Hand out / return an I/O context. */
kvs_io_ctx_t *spill_ctx_get(kvs_spill_t *sp);
void spill_ctx_put(kvs_spill_t *sp, kvs_io_ctx_t *ctx);
/* Convert an I/O result to a status. */
ri_status_t spill_res_status(int res, uint32_t len, bool is_read);

/* A write with optional preserved sequence numbers and expected old
 * locations (compaction); quota not checked when internal. */
typedef struct spill_move {
    uint64_t seq;            /* keep this sequence number */
    spill_seg_t *old_seg;    /* commit only if the key still lives here */
    uint64_t old_off;        /* ... at this offset */
} spill_move_t;
ri_status_t spill_write_internal(kvs_spill_t *sp, kvs_spill_wreq_t *reqs, size_t n, const spill_move_t *moves);

/* Read raw record images of entries (for compaction and verification):
 * images[i] must hold rec_bytes; status per entry; corrupt ones marked lost. */
typedef struct spill_raw {
    int32_t ent;             /* entry index at lookup time */
    spill_seg_t *seg;        /* location (ref held by the caller's lookup) */
    uint64_t off;            /* offset */
    uint32_t rec_bytes;      /* length */
    kvs_spill_hdr_t hdr;     /* expected header */
    uint8_t *image;          /* destination (rec_bytes) */
    ri_status_t status;      /* out */
} spill_raw_t;
void spill_read_raw(kvs_spill_t *sp, spill_raw_t *raws, size_t n);
/* Fill r from the index entry for key (mu held): status, location, expected
 * header, and a reference on the segment when RI_OK. */
void spill_raw_lookup_locked(kvs_spill_t *sp, const kvs_spill_key_t *key, spill_raw_t *r);
/* Mark the entry at (seg, off) lost if it still is there (mu held). */
void spill_mark_lost(kvs_spill_t *sp, const kvs_spill_key_t *key, spill_seg_t *seg, uint64_t off, const char *why);

/* ---- kvs_spill_persist.c ---- */

/* Write the manifest (takes wbar exclusive, fsyncs dirty segments). */
ri_status_t spill_checkpoint(kvs_spill_t *sp);
/* Remove stale spill files from the directory (fresh create). */
ri_status_t spill_wipe_dir(kvs_spill_t *sp);
/* Start / stop the background compaction thread. */
ri_status_t spill_compactor_start(kvs_spill_t *sp);
void spill_compactor_stop(kvs_spill_t *sp);

#endif /* KVS_SPILL_INT_H */
