/*
 * The spill tier of ri-kvstore: a self-contained store of cluster payloads
 * (K and V of one cluster of one (session, layer, KV head)) in append-only
 * segment files, written and read with O_DIRECT through io_uring (or
 * pread/pwrite when io_uring cannot be set up).  The data side (pool and
 * catalog) decides WHAT to spill (see kvs_spill_cold.h for a coldness helper)
 * and calls this module to move bytes; the catalog keeps tier = disk for a
 * spilled cluster and finds it again by its key.
 *
 * Workload: batches of 4-64 KiB records (a 16-token cluster of d=128 fp16 K+V
 * is 8 KiB), written when the pool passes its high-water mark and read back,
 * in random order, for the misses of one ranked fetch.  Several threads may
 * call at once (data-plane thread, spill thread, background compaction).
 *
 * Durability: a record is readable once kvs_spill_write returns OK for it,
 * and survives a restart once a manifest that lists it is on disk
 * (kvs_spill_sync, kvs_spill_drop_session, compaction and kvs_spill_destroy
 * write one).  Records written after the last manifest are found again by
 * scanning the segment tails on recovery (each record is self-describing and
 * checksummed), best effort.
 *
 * Integrity: every record carries CRC32C over header and payload; a read that
 * fails the check answers RI_ERR_CORRUPT for that entry, logs it, counts it
 * and marks the record lost: it is never served again.
 *
 * Thread safety: every function may be called from any thread.
 */
#ifndef KVS_SPILL_H
#define KVS_SPILL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "kvstore/spill/kvs_spill_io.h"
#include "retroinfer/status.h"

/* Identity of one cluster payload; unique within a spill directory. */
typedef struct kvs_spill_key {
    uint64_t session;   /* session id (never 0) */
    uint32_t layer;     /* layer index */
    uint32_t head;      /* KV head index */
    uint32_t cluster;   /* cluster id within (session, layer, head) */
} kvs_spill_key_t;

/* Settings; start from kvs_spill_config_default(). */
typedef struct kvs_spill_config {
    const char *dir;              /* spill directory (created if missing); borrowed during create */
    uint64_t quota_bytes;         /* disk quota over record bytes written; 0 = unlimited */
    uint64_t segment_bytes;       /* size of one segment file (preallocated) */
    uint32_t align;               /* record alignment, power of two >= 512 (default 4096) */
    uint32_t max_record_bytes;    /* largest header + payload, rounded to align (bounce slot) */
    uint32_t queue_depth;         /* io_uring entries per I/O context (>= 1, default 32) */
    uint32_t io_contexts;         /* I/O contexts = concurrent batches (default 2) */
    bool use_uring;               /* try io_uring; false = pread/pwrite only */
    bool direct_io;               /* open segments with O_DIRECT (default true) */
    uint32_t io_timeout_ms;       /* bound on one completion wait (default 5000) */
    uint32_t max_retries;         /* retries of EIO / EAGAIN / short transfers (default 2) */
    double compact_dead_ratio;    /* compact a full segment when this share is dead (0.5) */
    uint32_t compact_interval_ms; /* background compaction period; 0 = no thread */
    const kvs_io_ops_t *ops;      /* system calls (NULL = the real ones); borrowed, must outlive the store */
} kvs_spill_config_t;

/* One record to write.  The payload is borrowed for the call. */
typedef struct kvs_spill_wreq {
    kvs_spill_key_t key;       /* replaces an existing record with this key */
    uint16_t dtype;            /* element type (kvs_dtype_t of the data side) */
    uint32_t tokens;           /* tokens in the cluster */
    const void *payload;       /* K then V, as the pool holds them */
    uint32_t payload_bytes;    /* > 0, header + payload <= max_record_bytes */
    ri_status_t status;        /* out: this entry's result */
} kvs_spill_wreq_t;

/* One record to read. */
typedef struct kvs_spill_rreq {
    kvs_spill_key_t key;       /* which record */
    void *buf;                 /* destination, borrowed for the call */
    uint32_t buf_bytes;        /* capacity of buf */
    uint32_t payload_bytes;    /* out: bytes written to buf */
    uint32_t tokens;           /* out: token count */
    uint16_t dtype;            /* out: element type */
    ri_status_t status;        /* out: RI_OK, RI_ERR_NOT_FOUND, RI_ERR_CORRUPT (now or earlier: lost),
                                  RI_ERR_RANGE (buf too small), RI_ERR_IO / RI_ERR_EOF / RI_ERR_TIMEOUT */
} kvs_spill_rreq_t;

/* What one record is, without reading it. */
typedef struct kvs_spill_info {
    kvs_spill_key_t key;       /* identity */
    uint16_t dtype;            /* element type */
    uint32_t tokens;           /* token count */
    uint32_t payload_bytes;    /* payload size */
    bool lost;                 /* failed its checksum; never served */
} kvs_spill_info_t;

/* Counters and gauges (also in kvs_spill_metrics_write). */
typedef struct kvs_spill_stats {
    uint64_t disk_bytes;          /* segment file sizes (preallocated) */
    uint64_t used_bytes;          /* record bytes appended and not yet reclaimed (what the quota counts) */
    uint64_t live_bytes;          /* record bytes of live records */
    uint64_t records;             /* live records */
    uint64_t lost_records;        /* records that failed their checksum */
    uint64_t segments;            /* segment files */
    uint64_t written_records;     /* records written (ever) */
    uint64_t written_bytes;       /* payload bytes written */
    uint64_t read_records;        /* records read and served */
    uint64_t read_bytes;          /* payload bytes served */
    uint64_t checksum_failures;   /* reads that failed CRC32C or header checks */
    uint64_t io_errors;           /* transfers that ended in an error (after retries) */
    uint64_t io_retries;          /* transfers re-issued */
    uint64_t io_timeouts;         /* completions that never arrived */
    uint64_t quota_rejections;    /* write batches refused by the quota */
    uint64_t compactions;         /* segments reclaimed */
    uint64_t compacted_bytes;     /* bytes reclaimed by compaction */
    bool uring;                   /* every I/O context uses io_uring */
} kvs_spill_stats_t;

/* Recovery summary. */
typedef struct kvs_spill_recover_report {
    bool manifest_found;          /* a valid manifest was read */
    uint64_t records;             /* records recovered (live) */
    uint64_t records_from_scan;   /* of which found by scanning segment tails */
    uint64_t corrupt;             /* records that failed verification (marked lost) */
    uint64_t stale_segments;      /* leftover segment files removed */
} kvs_spill_recover_report_t;

typedef struct kvs_spill kvs_spill_t;

/* Defaults: quota 0, 256 MiB segments, align 4096, 64 KiB records, QD 32,
 * 2 contexts, io_uring and O_DIRECT on, 5 s timeout, 2 retries, compaction at
 * 50% dead every 1000 ms. */
void kvs_spill_config_default(kvs_spill_config_t *cfg);

/* Open a fresh spill tier in cfg->dir: spill files left there by an earlier
 * run (seg-*.dat, MANIFEST*) are removed.  Logs one warning when io_uring
 * cannot be set up and the pread/pwrite path is used.  Errors: RI_ERR_INVALID
 * (bad config), RI_ERR_IO (directory), RI_ERR_UNSUPPORTED (O_DIRECT refused
 * by the filesystem).  Caller destroys with kvs_spill_destroy. */
ri_status_t kvs_spill_create(const kvs_spill_config_t *cfg, kvs_spill_t **sp_p);

/* Reopen cfg->dir after a restart: read the manifest, scan segment tails for
 * records written after it, and (verify = true) read every record and check
 * its CRC (failures are marked lost and counted in the report).  A missing or
 * damaged manifest falls back to scanning every segment.  report_p may be NULL.
 * Caller destroys with kvs_spill_destroy. */
ri_status_t kvs_spill_recover(const kvs_spill_config_t *cfg, bool verify, kvs_spill_recover_report_t *report_p,
                              kvs_spill_t **sp_p);

/* Stop compaction, write a final manifest (errors are logged), close files
 * and free.  NULL is a no-op. */
void kvs_spill_destroy(kvs_spill_t *sp);

/* Write n records.  The quota is checked for the whole batch first: over it,
 * every entry gets RI_ERR_QUOTA and nothing is written.  Otherwise each entry
 * gets its own status (RI_ERR_INVALID, RI_ERR_TOO_LARGE, RI_ERR_NOSPACE,
 * RI_ERR_IO, RI_ERR_TIMEOUT); a failed entry leaves any earlier record with
 * that key in place.  Returns RI_OK when every entry succeeded, else the
 * first entry's error. */
ri_status_t kvs_spill_write(kvs_spill_t *sp, kvs_spill_wreq_t *reqs, size_t n);

/* Read n records into the callers' buffers, verifying each; per-entry status
 * in reqs[i].status.  Returns RI_OK when every entry succeeded, else the first
 * entry's error.  A buffer is written only for an entry that ends RI_OK (its
 * contents are unspecified otherwise). */
ri_status_t kvs_spill_read(kvs_spill_t *sp, kvs_spill_rreq_t *reqs, size_t n);

/* Forget n records (e.g. promoted back into the pool); missing keys are
 * ignored.  Their space is reclaimed by compaction. */
void kvs_spill_remove(kvs_spill_t *sp, const kvs_spill_key_t *keys, size_t n);

/* Drop every record of a session and write a manifest without them.
 * *bytes_freed_p (may be NULL) gets the record bytes released.  RI_ERR_NOT_FOUND
 * when the session has no records. */
ri_status_t kvs_spill_drop_session(kvs_spill_t *sp, uint64_t session, uint64_t *bytes_freed_p);

/* Information on one record; RI_ERR_NOT_FOUND when absent. */
ri_status_t kvs_spill_stat(kvs_spill_t *sp, const kvs_spill_key_t *key, kvs_spill_info_t *info_p);

/* Call fn for every record (session 0 = all sessions), e.g. to rebuild the
 * catalog after kvs_spill_recover.  Runs under the store's lock: fn must not
 * call back into the store. */
typedef void (*kvs_spill_visit_fn_t)(void *arg, const kvs_spill_info_t *info);
void kvs_spill_foreach(kvs_spill_t *sp, uint64_t session, kvs_spill_visit_fn_t fn, void *arg);

/* Make every record written so far durable and write the manifest. */
ri_status_t kvs_spill_sync(kvs_spill_t *sp);

/* Compact now: delete segments with no live records, rewrite the live
 * records of segments at least compact_dead_ratio dead.  *reclaimed_p (may be
 * NULL) gets the bytes freed. */
ri_status_t kvs_spill_compact(kvs_spill_t *sp, uint64_t *reclaimed_p);

/* Counters and gauges. */
void kvs_spill_stats(kvs_spill_t *sp, kvs_spill_stats_t *stats_p);

/* Append the tier's metrics in Prometheus text format (kvs_spill_*). */
void kvs_spill_metrics_write(kvs_spill_t *sp, FILE *out);

#endif /* KVS_SPILL_H */
