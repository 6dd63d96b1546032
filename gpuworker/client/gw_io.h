/*
 * One data-plane connection (gw_dp_t) driven by its own thread through a FIFO
 * job queue.  gw_dp_t is not thread-safe, yet the worker wants two things at
 * once: uploads of layer i's clusters while layer i+1's index is built, and a
 * ranked fetch in flight while the caller computes the estimation zone.  The
 * io thread is the only user of the connection after gw_io_start, so both
 * come for free and in order (an upload queued before a fetch of the same
 * layer completes before it).
 *
 * Errors are sticky: after the first failed call (daemon gone, timeout) the
 * connection is unusable (gw_dp.h), every later job completes at once with
 * that status, and gw_io_error() reports it.
 *
 * Thread safety: submit/wait/drain from any one thread at a time (the owner
 * of the gw_remote_t); the io thread is internal.
 */
#ifndef GW_IO_H
#define GW_IO_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "gpuworker/client/gw_dp.h"
#include "retroinfer/status.h"

typedef enum gw_io_kind {
    GW_IO_UPLOAD = 0,   /* gw_dp_upload; detached: the io thread frees it */
    GW_IO_FETCH,        /* gw_dp_fetch_ranked; the caller waits */
    GW_IO_REGISTER,     /* gw_dp_register_cache; the caller waits */
    GW_IO_RELEASE,      /* gw_dp_release; the caller waits */
    GW_IO_TOUCH,        /* gw_dp_touch; detached, a failure is logged only */
    GW_IO_CALL,         /* fn(dp, arg): a few calls in a row on the connection (prefix
                           attach, block reads, LOCATE); the caller waits */
} gw_io_kind_t;

typedef struct gw_io_job {
    gw_io_kind_t kind;
    /* UPLOAD (every array owned by the job, freed with it) */
    bool append;              /* APPEND_CLUSTERS instead of UPLOAD_CLUSTERS */
    uint32_t layer;           /* UPLOAD, FETCH */
    uint32_t n_heads;         /* UPLOAD, FETCH */
    uint32_t *heads;          /* [n_heads] UPLOAD (owned), FETCH (borrowed) */
    uint32_t *counts;         /* [n_heads] clusters (UPLOAD) or ids (FETCH) per head */
    uint32_t *tokens;         /* UPLOAD: tokens of every cluster, head by head (owned) */
    uint32_t *expect_first;   /* UPLOAD: the first id each head must get (owned) */
    void *pages;              /* UPLOAD: page-format data (owned) */
    size_t bytes;             /* UPLOAD: its length */
    uint32_t page_tokens;     /* UPLOAD: P, to split the data per head */
    bool locate;              /* UPLOAD: then LOCATE the clusters; the job is kept
                                 for gw_io_take_located instead of freed */
    uint64_t *offs;           /* UPLOAD with locate: region offset of every cluster (owned) */
    const uint8_t *map_base;  /* UPLOAD with locate: the region mapped here (its pages are
                                 faulted in on the io thread, not at the first step that
                                 reads them); NULL: not mapped */
    uint64_t map_bytes;
    uint32_t *recs;           /* TOUCH: n_recs x {layer, head, id} (owned) */
    uint32_t n_recs;
    size_t page_bytes;        /* UPLOAD: bytes of one page */
    /* CALL: run on the connection (borrowed until done) */
    ri_status_t (*fn)(gw_dp_t *dp, void *arg);
    void *arg;
    /* FETCH (borrowed until done) */
    uint32_t cache_id;        /* FETCH, RELEASE */
    const uint32_t *ids;      /* remote ids, head by head */
    uint64_t recv_offset;     /* where misses start in the receive buffer */
    uint32_t timeout_ms;      /* 0 = the connection's default */
    gw_dp_fetch_result_t res; /* FETCH output; caller frees with gw_dp_fetch_result_free */
    /* REGISTER */
    uint32_t capacity_pages;  /* cache size */
    void *recv;               /* receive buffer (borrowed for the connection's life) */
    size_t recv_len;
    uint32_t out_cache_id;    /* REGISTER output */
    uint64_t out_page_bytes;  /* REGISTER output */
    /* bookkeeping */
    double seconds;           /* time the call took on the io thread */
    ri_status_t status;       /* result, valid once done */
    bool done;
    struct gw_io_job *next;
} gw_io_job_t;

typedef struct gw_io gw_io_t;

/* Take ownership of dp (connected) and start the io thread.  On failure dp
 * is closed.  Caller stops with gw_io_stop. */
ri_status_t gw_io_start(gw_dp_t *dp, gw_io_t **io_p);

/* Finish the queued jobs (they fail at once if the connection broke), join
 * the thread and close the connection.  NULL is a no-op. */
void gw_io_stop(gw_io_t *io);

/* Queue a job.  UPLOAD jobs are detached: the io thread frees the job and its
 * owned arrays (allocate all of them with cm_malloc); their failure becomes
 * the sticky error.  Other jobs stay the caller's: wait with gw_io_wait. */
void gw_io_submit(gw_io_t *io, gw_io_job_t *job);

/* Run a (non-UPLOAD) job on the calling thread, after every queued job,
 * with the io thread held off: one thread wake-up less per round trip than
 * submit + wait, which matters on a small, busy machine.  Returns its status;
 * the caller still owns the job. */
ri_status_t gw_io_call(gw_io_t *io, gw_io_job_t *job);

/* Block until job is done; returns its status. */
ri_status_t gw_io_wait(gw_io_t *io, gw_io_job_t *job);

/* Block until the queue is empty and the thread idle; returns the sticky
 * error (RI_OK when every call so far succeeded). */
ri_status_t gw_io_drain(gw_io_t *io);

/* True when a submitted job has finished (no waiting). */
bool gw_io_done(gw_io_t *io, const gw_io_job_t *job);

/* Wait for job until the CLOCK_MONOTONIC time deadline_ns; true when it is
 * done (then gw_io_wait returns at once with its status). */
bool gw_io_wait_until(gw_io_t *io, gw_io_job_t *job, uint64_t deadline_ns);

/* The sticky error, without waiting. */
ri_status_t gw_io_error(gw_io_t *io);

/* Bytes uploaded so far and seconds the io thread spent in uploads. */
void gw_io_upload_totals(gw_io_t *io, uint64_t *bytes_p, double *seconds_p);

/* The UPLOAD jobs with locate that completed since the last call, oldest
 * first (linked by next); the caller frees each with gw_io_job_free. */
gw_io_job_t *gw_io_take_located(gw_io_t *io);

/* Free an UPLOAD job and its owned arrays (for callers that never submitted it). */
void gw_io_job_free(gw_io_job_t *job);

#endif /* GW_IO_H */
