/*
 * I/O engine of the spill tier.  Two jobs:
 *
 *  1. Every system call the tier makes goes through an overridable table
 *     (kvs_io_ops_t), the way SQLite routes open/pwrite/... through aSyscall[],
 *     so tests can inject EIO, ENOSPC, short transfers and lost io_uring
 *     completions without touching the disk.
 *  2. An I/O context (kvs_io_ctx_t) runs a batch of fixed-size, aligned reads or
 *     writes through io_uring (queue depth >= 32, one registered bounce-buffer
 *     arena, batched submissions) or, when io_uring cannot be set up, through
 *     pread/pwrite one at a time.  The caller prepares each request into a
 *     bounce slot and consumes it on completion (two callbacks), so a batch of
 *     any length runs with at most queue-depth requests in flight.
 *
 * Workload: batches of 4-64 KiB O_DIRECT transfers to append-only segment files,
 * from a few threads (one context per thread at a time; contexts are not
 * thread-safe, the store hands them out from a small pool).
 *
 * Failures: EINTR/EAGAIN, EIO and short transfers are retried up to max_retries
 * times; ENOSPC and other errors are final.  A completion that does not arrive
 * within timeout_ms is cancelled; if it still does not arrive its bounce slot is
 * quarantined (the kernel may still own it), the request ends with -ETIMEDOUT
 * and the context stops using its ring (degraded: pread/pwrite from then on).
 */
#ifndef KVS_SPILL_IO_H
#define KVS_SPILL_IO_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#include "retroinfer/status.h"

struct io_uring;
struct io_uring_cqe;
struct __kernel_timespec;

/* System calls of the tier.  Each returns what the libc/liburing call returns
 * (-1 and errno for the libc ones, -errno for the uring ones).  arg is the
 * table's own pointer, for test state. */
typedef struct kvs_io_ops {
    int (*open)(void *arg, const char *path, int flags, mode_t mode);
    int (*close)(void *arg, int fd);
    int (*fsync)(void *arg, int fd);
    int (*fallocate)(void *arg, int fd, off_t off, off_t len);
    int (*rename)(void *arg, const char *from, const char *to);
    int (*unlink)(void *arg, const char *path);
    ssize_t (*pwrite)(void *arg, int fd, const void *buf, size_t len, off_t off);
    ssize_t (*pread)(void *arg, int fd, void *buf, size_t len, off_t off);
    /* io_uring_queue_init(entries, ring, 0) */
    int (*uring_init)(void *arg, unsigned entries, struct io_uring *ring);
    /* io_uring_submit(ring) */
    int (*uring_submit)(void *arg, struct io_uring *ring);
    /* io_uring_wait_cqe_timeout(ring, cqe_p, ts); -ETIME when ts passes */
    int (*uring_wait)(void *arg, struct io_uring *ring, struct io_uring_cqe **cqe_p,
                      struct __kernel_timespec *ts);
    void *arg;
} kvs_io_ops_t;

/* The real system calls; static, never NULL. */
const kvs_io_ops_t *kvs_io_ops_default(void);

/* Which direction a batch moves data. */
typedef enum kvs_io_dir {
    KVS_IO_READ = 0,
    KVS_IO_WRITE = 1,
} kvs_io_dir_t;

/* Settings of one context. */
typedef struct kvs_io_ctx_config {
    unsigned queue_depth;     /* requests in flight (io_uring entries and bounce slots) */
    size_t slot_bytes;        /* bounce slot size, a multiple of 4096 */
    bool use_uring;           /* try io_uring first */
    unsigned timeout_ms;      /* bound on waiting for one completion */
    unsigned max_retries;     /* retries of EIO / EAGAIN / short transfers */
    const kvs_io_ops_t *ops;  /* borrowed; must outlive the context */
} kvs_io_ctx_config_t;

/* Fill request i of a batch: set *fd_p, *off_p, *len_p (aligned, <= slot_bytes)
 * and, for writes, the slot contents.  Return RI_OK, or an error to skip the
 * request (done is then not called for it). */
typedef ri_status_t (*kvs_io_prep_fn_t)(void *arg, size_t i, void *slot, int *fd_p, uint64_t *off_p,
                                        uint32_t *len_p);

/* Request i ended: res == len on success; otherwise -errno (-ETIMEDOUT for a
 * lost completion) or a short count 0 <= res < len left after the retries.
 * For reads the slot holds the data when res == len.  slot is NULL when the
 * slot had to be quarantined. */
typedef void (*kvs_io_done_fn_t)(void *arg, size_t i, void *slot, int res);

/* Counters of one context, added into the store's metrics. */
typedef struct kvs_io_counters {
    uint64_t submitted;   /* requests issued (retries included) */
    uint64_t retries;     /* re-issued after EIO / EAGAIN / short transfer */
    uint64_t errors;      /* requests that ended in an error */
    uint64_t timeouts;    /* completions that never arrived */
} kvs_io_counters_t;

typedef struct kvs_io_ctx kvs_io_ctx_t;

/* Create a context.  Falls back to pread/pwrite (and reports it through
 * kvs_io_ctx_uses_uring) when io_uring cannot be set up; the caller logs the
 * one warning.  Caller destroys with kvs_io_ctx_destroy. */
ri_status_t kvs_io_ctx_create(const kvs_io_ctx_config_t *cfg, kvs_io_ctx_t **ctx_p);

/* Tear down the ring and free the slots; NULL is a no-op. */
void kvs_io_ctx_destroy(kvs_io_ctx_t *ctx);

/* True while the context submits through io_uring. */
bool kvs_io_ctx_uses_uring(const kvs_io_ctx_t *ctx);

/* Why io_uring is not used ("" when it is); borrowed. */
const char *kvs_io_ctx_uring_error(const kvs_io_ctx_t *ctx);

/* Run n requests (prep, transfer, done for each), at most queue_depth at a
 * time.  Returns RI_OK when the batch ran (each request's outcome goes to
 * done), RI_ERR_INTERNAL if the ring itself failed (requests not yet ended
 * are then ended with -EIO). */
ri_status_t kvs_io_ctx_run(kvs_io_ctx_t *ctx, kvs_io_dir_t dir, size_t n, kvs_io_prep_fn_t prep,
                           kvs_io_done_fn_t done, void *arg);

/* Read and clear the context's counters. */
void kvs_io_ctx_take_counters(kvs_io_ctx_t *ctx, kvs_io_counters_t *counters_p);

#endif /* KVS_SPILL_IO_H */
