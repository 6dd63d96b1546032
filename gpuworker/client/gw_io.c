/*
 * The io thread of one data-plane connection (gw_io.h): a mutex-protected
 * FIFO, one thread that pops jobs and makes the synchronous gw_dp calls.
 * Workload: a few uploads per layer at prefill and every 1024 tokens, one
 * ranked fetch per layer and decode step.
 */
#include "gpuworker/client/gw_io.h"

#include <pthread.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>

#include "common/cm_alloc.h"
#include "common/cm_log.h"
#include "common/cm_time.h"

static CM_ALLOC_TAG(gw_io_tag, "gw.io");

struct gw_io {
    gw_dp_t *dp;               /* owned; used only by the thread after start */
    pthread_t thread;
    pthread_mutex_t lock;
    pthread_cond_t cond;       /* queue changed, a job finished */
    gw_io_job_t *head, *tail;  /* FIFO */
    bool busy;                 /* the thread runs a job */
    bool inline_active;        /* a caller runs a job on its own thread */
    bool stop;                 /* gw_io_stop called */
    ri_status_t err;           /* sticky: first failure */
    gw_io_job_t *located, *located_tail; /* done UPLOADs with locate, for the owner */
    uint64_t up_bytes;         /* uploaded so far */
    double up_s;               /* time in uploads */
};

gw_io_job_t *gw_io_take_located(gw_io_t *io)
{
    gw_io_job_t *list;
    pthread_mutex_lock(&io->lock);
    list = io->located;
    io->located = io->located_tail = NULL;
    pthread_mutex_unlock(&io->lock);
    return list;
}

void gw_io_job_free(gw_io_job_t *job)
{
    if (job == NULL)
        return;
    cm_free(job->heads);
    cm_free(job->counts);
    cm_free(job->tokens);
    cm_free(job->expect_first);
    cm_free(job->pages);
    cm_free(job->offs);
    cm_free(job->recs);
    cm_free(job);
}

/* Fault the located clusters' pages of the region into our page table here,
 * off the decode path: the first step to read a cluster would otherwise
 * take a page fault per 4 KiB (MADV_POPULATE_READ; older kernels: nothing
 * happens and the faults stay where they were). */
static void gw_io_prefault(const gw_io_job_t *job, const uint64_t *offs, uint32_t n, const uint32_t *tok)
{
#ifdef MADV_POPULATE_READ
    uint64_t lo = UINT64_MAX, hi = 0;
    size_t pg = (size_t)sysconf(_SC_PAGESIZE);
    for (uint32_t c = 0; c < n; c++) {
        uint64_t len = (uint64_t)(tok[c] + job->page_tokens - 1) / job->page_tokens * job->page_bytes;
        if (offs[c] == UINT64_MAX || offs[c] > job->map_bytes || len > job->map_bytes - offs[c])
            continue;
        lo = offs[c] < lo ? offs[c] : lo;
        hi = offs[c] + len > hi ? offs[c] + len : hi;
    }
    if (lo >= hi)
        return;
    uintptr_t a = ((uintptr_t)job->map_base + lo) / pg * pg, b = ((uintptr_t)job->map_base + hi + pg - 1) / pg * pg;
    (void)madvise((void *)a, b - a, MADV_POPULATE_READ);
#else
    (void)job;
    (void)offs;
    (void)n;
    (void)tok;
#endif
}

/* Run one job on the io thread (lock not held). */
static ri_status_t gw_io_run(gw_io_t *io, gw_io_job_t *job)
{
    ri_status_t st = RI_ERR_INTERNAL;
    switch (job->kind) {
    case GW_IO_UPLOAD: {
        /* One message per head.  The kvstore at 7dd18cb spun forever
         * reserving extents for some multi-head uploads (fixed in bf3a56e);
         * single-head uploads work with either daemon.  Costs n_kv messages
         * per layer at prefill and per update, nothing per decode step. */
        const uint32_t *tok = job->tokens;
        const uint8_t *pages = job->pages;
        st = RI_OK;
        for (uint32_t i = 0; st == RI_OK && i < job->n_heads; i++) {
            uint32_t first = 0;
            size_t bytes = 0;
            for (uint32_t c = 0; c < job->counts[i]; c++)
                bytes += (size_t)(tok[c] + job->page_tokens - 1) / job->page_tokens * job->page_bytes;
            if (job->counts[i] == 0)
                continue;
            st = gw_dp_upload(io->dp, job->append, job->layer, 1, &job->heads[i], &job->counts[i], tok, pages, bytes,
                              &first);
            if (st == RI_OK && job->locate)
                st = gw_dp_locate(io->dp, job->layer, job->heads[i], first, job->counts[i],
                                  job->offs + (tok - job->tokens));
            /* The worker numbers clusters itself; the kvstore must agree. */
            if (st == RI_OK && job->expect_first != NULL && first != job->expect_first[i]) {
                cm_error("data plane: layer %u head %u got first cluster id %u, expected %u", job->layer,
                         job->heads[i], first, job->expect_first[i]);
                st = RI_ERR_PROTOCOL;
            }
            if (st == RI_OK && job->locate && job->map_base != NULL)
                gw_io_prefault(job, job->offs + (tok - job->tokens), job->counts[i], tok);
            tok += job->counts[i];
            pages += bytes;
        }
        if (st != RI_OK)
            cm_error("data plane: %s of layer %u failed: %s", job->append ? "append" : "upload", job->layer,
                     ri_status_str(st));
        return st;
    }
    case GW_IO_FETCH:
        return gw_dp_fetch_ranked(io->dp, job->cache_id, job->layer, job->n_heads, job->heads, job->counts,
                                  job->ids, job->recv_offset, job->timeout_ms, &job->res);
    case GW_IO_REGISTER:
        return gw_dp_register_cache(io->dp, job->capacity_pages, job->recv, job->recv_len, &job->out_cache_id,
                                    &job->out_page_bytes);
    case GW_IO_RELEASE:
        return gw_dp_release(io->dp, job->cache_id);
    case GW_IO_TOUCH:
        st = gw_dp_touch(io->dp, job->recs, job->n_recs);
        if (st != RI_OK && st != RI_ERR_CONN_RESET && st != RI_ERR_TIMEOUT) {
            /* The records only inform the kvstore's coldness: not fatal. */
            cm_warn("data plane: access records refused: %s", ri_status_str(st));
            st = RI_OK;
        }
        return st;
    case GW_IO_CALL:
        return job->fn != NULL ? job->fn(io->dp, job->arg) : RI_ERR_INVALID;
    }
    return st;
}

static void *gw_io_main(void *arg)
{
    gw_io_t *io = arg;
    pthread_mutex_lock(&io->lock);
    for (;;) {
        while ((io->head == NULL && !io->stop) || io->inline_active)
            pthread_cond_wait(&io->cond, &io->lock);
        if (io->head == NULL)
            break; /* stop with an empty queue */
        gw_io_job_t *job = io->head;
        io->head = job->next;
        if (io->head == NULL)
            io->tail = NULL;
        ri_status_t err = io->err;
        io->busy = true;
        pthread_mutex_unlock(&io->lock);

        double t0 = cm_time_s();
        ri_status_t st = err != RI_OK ? err : gw_io_run(io, job);
        job->seconds = cm_time_s() - t0;

        pthread_mutex_lock(&io->lock);
        io->busy = false;
        if (st != RI_OK && io->err == RI_OK)
            io->err = st;
        if (job->kind == GW_IO_UPLOAD) {
            if (st == RI_OK) {
                io->up_bytes += job->bytes;
                io->up_s += job->seconds;
            }
            if (st == RI_OK && job->locate) {
                job->next = NULL;
                if (io->located_tail != NULL)
                    io->located_tail->next = job;
                else
                    io->located = job;
                io->located_tail = job;
            } else {
                gw_io_job_free(job);
            }
        } else if (job->kind == GW_IO_TOUCH) {
            gw_io_job_free(job);
        } else {
            job->status = st;
            job->done = true;
        }
        pthread_cond_broadcast(&io->cond);
    }
    pthread_mutex_unlock(&io->lock);
    return NULL;
}

ri_status_t gw_io_start(gw_dp_t *dp, gw_io_t **io_p)
{
    gw_io_t *io = cm_calloc(&gw_io_tag, 1, sizeof(*io));
    if (io == NULL) {
        gw_dp_close(dp);
        return RI_ERR_NOMEM;
    }
    io->dp = dp;
    pthread_mutex_init(&io->lock, NULL);
    {
        /* timed waits (gw_io_wait_until) count on the monotonic clock */
        pthread_condattr_t ca;
        pthread_condattr_init(&ca);
        pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
        pthread_cond_init(&io->cond, &ca);
        pthread_condattr_destroy(&ca);
    }
    if (pthread_create(&io->thread, NULL, gw_io_main, io) != 0) {
        pthread_cond_destroy(&io->cond);
        pthread_mutex_destroy(&io->lock);
        gw_dp_close(dp);
        cm_free(io);
        return RI_ERR_NOMEM;
    }
    *io_p = io;
    return RI_OK;
}

void gw_io_stop(gw_io_t *io)
{
    if (io == NULL)
        return;
    pthread_mutex_lock(&io->lock);
    io->stop = true;
    pthread_cond_broadcast(&io->cond);
    pthread_mutex_unlock(&io->lock);
    pthread_join(io->thread, NULL);
    while (io->located != NULL) {
        gw_io_job_t *next = io->located->next;
        gw_io_job_free(io->located);
        io->located = next;
    }
    gw_dp_close(io->dp);
    pthread_cond_destroy(&io->cond);
    pthread_mutex_destroy(&io->lock);
    cm_free(io);
}

void gw_io_submit(gw_io_t *io, gw_io_job_t *job)
{
    job->next = NULL;
    job->done = false;
    job->status = RI_OK;
    pthread_mutex_lock(&io->lock);
    if (io->tail != NULL)
        io->tail->next = job;
    else
        io->head = job;
    io->tail = job;
    pthread_cond_broadcast(&io->cond);
    pthread_mutex_unlock(&io->lock);
}

ri_status_t gw_io_wait(gw_io_t *io, gw_io_job_t *job)
{
    pthread_mutex_lock(&io->lock);
    while (!job->done)
        pthread_cond_wait(&io->cond, &io->lock);
    pthread_mutex_unlock(&io->lock);
    return job->status;
}

ri_status_t gw_io_call(gw_io_t *io, gw_io_job_t *job)
{
    ri_status_t st;
    pthread_mutex_lock(&io->lock);
    /* everything queued before (uploads of this layer) goes first */
    while (io->head != NULL || io->busy || io->inline_active)
        pthread_cond_wait(&io->cond, &io->lock);
    st = io->err;
    io->inline_active = true;
    pthread_mutex_unlock(&io->lock);

    double t0 = cm_time_s();
    if (st == RI_OK)
        st = gw_io_run(io, job);
    job->seconds = cm_time_s() - t0;

    pthread_mutex_lock(&io->lock);
    io->inline_active = false;
    if (st != RI_OK && io->err == RI_OK)
        io->err = st;
    job->status = st;
    job->done = true;
    pthread_cond_broadcast(&io->cond);
    pthread_mutex_unlock(&io->lock);
    return st;
}

ri_status_t gw_io_drain(gw_io_t *io)
{
    ri_status_t st;
    pthread_mutex_lock(&io->lock);
    while (io->head != NULL || io->busy)
        pthread_cond_wait(&io->cond, &io->lock);
    st = io->err;
    pthread_mutex_unlock(&io->lock);
    return st;
}

bool gw_io_wait_until(gw_io_t *io, gw_io_job_t *job, uint64_t deadline_ns)
{
    struct timespec ts = {.tv_sec = (time_t)(deadline_ns / 1000000000u), .tv_nsec = (long)(deadline_ns % 1000000000u)};
    bool done;
    pthread_mutex_lock(&io->lock);
    while (!job->done && pthread_cond_timedwait(&io->cond, &io->lock, &ts) == 0)
        ;
    done = job->done;
    pthread_mutex_unlock(&io->lock);
    return done;
}

bool gw_io_done(gw_io_t *io, const gw_io_job_t *job)
{
    bool done;
    pthread_mutex_lock(&io->lock);
    done = job->done;
    pthread_mutex_unlock(&io->lock);
    return done;
}

ri_status_t gw_io_error(gw_io_t *io)
{
    ri_status_t st;
    pthread_mutex_lock(&io->lock);
    st = io->err;
    pthread_mutex_unlock(&io->lock);
    return st;
}

void gw_io_upload_totals(gw_io_t *io, uint64_t *bytes_p, double *seconds_p)
{
    pthread_mutex_lock(&io->lock);
    *bytes_p = io->up_bytes;
    *seconds_p = io->up_s;
    pthread_mutex_unlock(&io->lock);
}
