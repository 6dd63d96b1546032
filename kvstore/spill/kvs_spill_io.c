/*
 * I/O engine of the spill tier: the overridable system-call table and the
 * io_uring / pread batch runner (see kvs_spill_io.h for the contract).
 */
#define _GNU_SOURCE
#include "kvstore/spill/kvs_spill_io.h"

#include <errno.h>
#include <fcntl.h>
#include <liburing.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "common/cm_alloc.h"
#include "common/cm_log.h"
#include "common/cm_status.h"

static CM_ALLOC_TAG(kvs_io_tag, "kvs.spill.io");

/* user_data of cancel requests; slot requests use slot index + 1. */
#define KVS_IO_CANCEL_TAG UINT64_MAX

/* ---- the real system calls ---- */

static int io_open(void *arg, const char *path, int flags, mode_t mode) { return open(path, flags, mode); }
static int io_close(void *arg, int fd) { return close(fd); }
static int io_fsync(void *arg, int fd) { return fsync(fd); }
static int io_fallocate(void *arg, int fd, off_t off, off_t len) { return fallocate(fd, 0, off, len); }
static int io_rename(void *arg, const char *from, const char *to) { return rename(from, to); }
static int io_unlink(void *arg, const char *path) { return unlink(path); }

static ssize_t io_pwrite(void *arg, int fd, const void *buf, size_t len, off_t off)
{
    return pwrite(fd, buf, len, off);
}

static ssize_t io_pread(void *arg, int fd, void *buf, size_t len, off_t off)
{
    return pread(fd, buf, len, off);
}

static int io_uring_init(void *arg, unsigned entries, struct io_uring *ring)
{
    return io_uring_queue_init(entries, ring, 0);
}

static int io_uring_submit_op(void *arg, struct io_uring *ring) { return io_uring_submit(ring); }

/* ts == NULL: do not block (peek). */
static int io_uring_wait_op(void *arg, struct io_uring *ring, struct io_uring_cqe **cqe_p,
                            struct __kernel_timespec *ts)
{
    if (ts == NULL)
        return io_uring_peek_cqe(ring, cqe_p);
    return io_uring_wait_cqe_timeout(ring, cqe_p, ts);
}

static const kvs_io_ops_t kvs_io_real_ops = {
    .open = io_open,
    .close = io_close,
    .fsync = io_fsync,
    .fallocate = io_fallocate,
    .rename = io_rename,
    .unlink = io_unlink,
    .pwrite = io_pwrite,
    .pread = io_pread,
    .uring_init = io_uring_init,
    .uring_submit = io_uring_submit_op,
    .uring_wait = io_uring_wait_op,
    .arg = NULL,
};

const kvs_io_ops_t *kvs_io_ops_default(void) { return &kvs_io_real_ops; }

/* ---- contexts ---- */

/* One bounce slot and the request it carries. */
typedef struct kvs_io_slot {
    size_t req;          /* request index in the batch */
    int fd;              /* target file */
    uint64_t off;        /* file offset */
    uint32_t len;        /* transfer length */
    unsigned tries;      /* retries so far */
    bool inflight;       /* submitted, completion not yet seen */
    bool quarantined;    /* completion lost: the kernel may still own the buffer */
} kvs_io_slot_t;

struct kvs_io_ctx {
    kvs_io_ctx_config_t cfg;      /* copy of the settings */
    struct io_uring ring;         /* valid while has_ring */
    bool has_ring;                /* ring was set up (must be torn down) */
    bool use_ring;                /* submit through the ring (false once degraded) */
    bool registered;              /* arena registered as fixed buffer 0 */
    char uring_err[160];          /* why the ring is not used */
    uint8_t *arena;               /* queue_depth * slot_bytes, 4 KiB aligned */
    kvs_io_slot_t *slots;         /* queue_depth entries */
    unsigned *free_slots;         /* stack of free slot indices */
    unsigned n_free;              /* entries on the stack */
    unsigned inflight;            /* slots in flight */
    unsigned pending_sqes;        /* prepared, not yet submitted */
    kvs_io_counters_t counters;   /* since the last take */
};

static void *slot_buf(kvs_io_ctx_t *ctx, unsigned s) { return ctx->arena + (size_t)s * ctx->cfg.slot_bytes; }

ri_status_t kvs_io_ctx_create(const kvs_io_ctx_config_t *cfg, kvs_io_ctx_t **ctx_p)
{
    ri_status_t st = RI_ERR_NOMEM;
    if (cfg == NULL || ctx_p == NULL || cfg->queue_depth == 0 || cfg->slot_bytes == 0 ||
        cfg->slot_bytes % 4096 != 0)
        return RI_ERR_INVALID;
    kvs_io_ctx_t *ctx = cm_calloc(&kvs_io_tag, 1, sizeof(*ctx));
    if (ctx == NULL)
        return RI_ERR_NOMEM;
    ctx->cfg = *cfg;
    if (ctx->cfg.ops == NULL)
        ctx->cfg.ops = kvs_io_ops_default();
    unsigned qd = cfg->queue_depth;
    ctx->arena = cm_malloc_aligned(&kvs_io_tag, (size_t)qd * cfg->slot_bytes, 4096);
    ctx->slots = cm_calloc(&kvs_io_tag, qd, sizeof(*ctx->slots));
    ctx->free_slots = cm_calloc(&kvs_io_tag, qd, sizeof(*ctx->free_slots));
    if (ctx->arena == NULL || ctx->slots == NULL || ctx->free_slots == NULL)
        goto err_free;
    memset(ctx->arena, 0, (size_t)qd * cfg->slot_bytes);
    for (unsigned s = 0; s < qd; s++)
        ctx->free_slots[ctx->n_free++] = qd - 1 - s;

    snprintf(ctx->uring_err, sizeof(ctx->uring_err), "disabled by configuration");
    if (cfg->use_uring) {
        const kvs_io_ops_t *ops = ctx->cfg.ops;
        int rc = ops->uring_init(ops->arg, qd, &ctx->ring);
        if (rc < 0) {
            snprintf(ctx->uring_err, sizeof(ctx->uring_err), "io_uring_queue_init: %s", strerror(-rc));
        } else {
            ctx->has_ring = true;
            ctx->use_ring = true;
            ctx->uring_err[0] = '\0';
            struct iovec iov = {.iov_base = ctx->arena, .iov_len = (size_t)qd * cfg->slot_bytes};
            rc = io_uring_register_buffers(&ctx->ring, &iov, 1);
            if (rc == 0)
                ctx->registered = true;
            else
                cm_info("spill io: registering %zu bytes of buffers failed (%s); using unregistered buffers",
                        iov.iov_len, strerror(-rc));
        }
    }
    *ctx_p = ctx;
    return RI_OK;

err_free:
    cm_free(ctx->free_slots);
    cm_free(ctx->slots);
    cm_free(ctx->arena);
    cm_free(ctx);
    return st;
}

void kvs_io_ctx_destroy(kvs_io_ctx_t *ctx)
{
    if (ctx == NULL)
        return;
    if (ctx->has_ring)
        io_uring_queue_exit(&ctx->ring);
    cm_free(ctx->free_slots);
    cm_free(ctx->slots);
    cm_free(ctx->arena);
    cm_free(ctx);
}

bool kvs_io_ctx_uses_uring(const kvs_io_ctx_t *ctx) { return ctx != NULL && ctx->use_ring; }

const char *kvs_io_ctx_uring_error(const kvs_io_ctx_t *ctx) { return ctx->use_ring ? "" : ctx->uring_err; }

void kvs_io_ctx_take_counters(kvs_io_ctx_t *ctx, kvs_io_counters_t *counters_p)
{
    *counters_p = ctx->counters;
    memset(&ctx->counters, 0, sizeof(ctx->counters));
}

/* Is a failed transfer worth another try? */
static bool retryable(int res, uint32_t len)
{
    if (res >= 0)
        return (uint32_t)res < len;   /* short transfer */
    return res == -EIO || res == -EAGAIN || res == -EINTR;
}

/* ---- pread/pwrite path ---- */

static void run_one_sync(kvs_io_ctx_t *ctx, kvs_io_dir_t dir, unsigned s, kvs_io_done_fn_t done, void *arg)
{
    const kvs_io_ops_t *ops = ctx->cfg.ops;
    kvs_io_slot_t *sl = &ctx->slots[s];
    void *buf = slot_buf(ctx, s);
    int res;
    for (;;) {
        ssize_t r;
        ctx->counters.submitted++;
        if (dir == KVS_IO_WRITE)
            r = ops->pwrite(ops->arg, sl->fd, buf, sl->len, (off_t)sl->off);
        else
            r = ops->pread(ops->arg, sl->fd, buf, sl->len, (off_t)sl->off);
        res = r < 0 ? -errno : (int)r;
        if (res == (int)sl->len || !retryable(res, sl->len) || sl->tries >= ctx->cfg.max_retries)
            break;
        sl->tries++;
        ctx->counters.retries++;
    }
    if (res != (int)sl->len)
        ctx->counters.errors++;
    done(arg, sl->req, buf, res);
}

static unsigned take_slot(kvs_io_ctx_t *ctx)
{
    return ctx->free_slots[--ctx->n_free];
}

static void put_slot(kvs_io_ctx_t *ctx, unsigned s)
{
    ctx->free_slots[ctx->n_free++] = s;
}

static ri_status_t run_sync(kvs_io_ctx_t *ctx, kvs_io_dir_t dir, size_t from, size_t n, kvs_io_prep_fn_t prep,
                            kvs_io_done_fn_t done, void *arg)
{
    if (ctx->n_free == 0) {
        /* Every slot lost to quarantine: nothing safe to transfer through. */
        for (size_t i = from; i < n; i++)
            done(arg, i, NULL, -EIO);
        return RI_ERR_INTERNAL;
    }
    for (size_t i = from; i < n; i++) {
        unsigned s = take_slot(ctx);
        kvs_io_slot_t *sl = &ctx->slots[s];
        sl->req = i;
        sl->tries = 0;
        if (prep(arg, i, slot_buf(ctx, s), &sl->fd, &sl->off, &sl->len) == RI_OK)
            run_one_sync(ctx, dir, s, done, arg);
        put_slot(ctx, s);
    }
    return RI_OK;
}

/* ---- io_uring path ---- */

static bool queue_sqe(kvs_io_ctx_t *ctx, kvs_io_dir_t dir, unsigned s)
{
    struct io_uring_sqe *sqe = io_uring_get_sqe(&ctx->ring);
    if (sqe == NULL) {
        /* SQ full: push what is queued, then try once more. */
        int rc = ctx->cfg.ops->uring_submit(ctx->cfg.ops->arg, &ctx->ring);
        if (rc >= 0)
            ctx->pending_sqes = 0;
        sqe = io_uring_get_sqe(&ctx->ring);
        if (sqe == NULL)
            return false;
    }
    kvs_io_slot_t *sl = &ctx->slots[s];
    void *buf = slot_buf(ctx, s);
    if (dir == KVS_IO_WRITE) {
        if (ctx->registered)
            io_uring_prep_write_fixed(sqe, sl->fd, buf, sl->len, sl->off, 0);
        else
            io_uring_prep_write(sqe, sl->fd, buf, sl->len, sl->off);
    } else {
        if (ctx->registered)
            io_uring_prep_read_fixed(sqe, sl->fd, buf, sl->len, sl->off, 0);
        else
            io_uring_prep_read(sqe, sl->fd, buf, sl->len, sl->off);
    }
    io_uring_sqe_set_data64(sqe, (uint64_t)s + 1);
    sl->inflight = true;
    ctx->inflight++;
    ctx->pending_sqes++;
    ctx->counters.submitted++;
    return true;
}

/* Handle one completion of slot s with result res. */
static void complete_slot(kvs_io_ctx_t *ctx, kvs_io_dir_t dir, unsigned s, int res, kvs_io_done_fn_t done,
                          void *arg)
{
    kvs_io_slot_t *sl = &ctx->slots[s];
    sl->inflight = false;
    ctx->inflight--;
    if (res == -ECANCELED)
        res = -ETIMEDOUT;   /* only our timeout handling cancels */
    if (res != (int)sl->len && retryable(res, sl->len) && sl->tries < ctx->cfg.max_retries) {
        sl->tries++;
        ctx->counters.retries++;
        if (queue_sqe(ctx, dir, s))
            return;
        res = -EIO;
    }
    if (res != (int)sl->len)
        ctx->counters.errors++;
    if (res == -ETIMEDOUT)
        ctx->counters.timeouts++;
    done(arg, sl->req, slot_buf(ctx, s), res);
    put_slot(ctx, s);
}

static struct __kernel_timespec timeout_ts(const kvs_io_ctx_t *ctx)
{
    struct __kernel_timespec ts = {
        .tv_sec = ctx->cfg.timeout_ms / 1000,
        .tv_nsec = (long long)(ctx->cfg.timeout_ms % 1000) * 1000000LL,
    };
    return ts;
}

static int submit_pending(kvs_io_ctx_t *ctx)
{
    while (ctx->pending_sqes > 0) {
        int rc = ctx->cfg.ops->uring_submit(ctx->cfg.ops->arg, &ctx->ring);
        if (rc == -EINTR || rc == -EAGAIN || rc == -EBUSY)
            continue;
        if (rc < 0)
            return rc;
        ctx->pending_sqes = 0;
    }
    return 0;
}

/* Wait for one completion (blocking up to the timeout when block) and handle
 * every completion that is ready.  Returns 0, -ETIME, or another -errno. */
static int reap(kvs_io_ctx_t *ctx, kvs_io_dir_t dir, bool block, kvs_io_done_fn_t done, void *arg)
{
    const kvs_io_ops_t *ops = ctx->cfg.ops;
    struct __kernel_timespec ts = timeout_ts(ctx);
    bool first = true;
    for (;;) {
        struct io_uring_cqe *cqe = NULL;
        int rc = ops->uring_wait(ops->arg, &ctx->ring, &cqe, (first && block) ? &ts : NULL);
        if (rc == -EAGAIN && !(first && block))
            return 0;   /* nothing more ready */
        if (rc == -EINTR)
            continue;
        if (rc < 0)
            return rc;
        first = false;
        uint64_t ud = io_uring_cqe_get_data64(cqe);
        int res = cqe->res;
        io_uring_cqe_seen(&ctx->ring, cqe);
        if (ud == KVS_IO_CANCEL_TAG || ud == 0 || ud > ctx->cfg.queue_depth)
            continue;
        unsigned s = (unsigned)(ud - 1);
        if (!ctx->slots[s].inflight)
            continue;   /* a stale completion of a quarantined slot */
        complete_slot(ctx, dir, s, res, done, arg);
    }
}

/* No completion within the timeout: cancel what is in flight, give it one
 * more timeout to come back, then declare the rest lost and stop using the
 * ring (its state can no longer be trusted). */
static void handle_timeout(kvs_io_ctx_t *ctx, kvs_io_dir_t dir, kvs_io_done_fn_t done, void *arg)
{
    unsigned qd = ctx->cfg.queue_depth;
    for (unsigned s = 0; s < qd; s++) {
        if (!ctx->slots[s].inflight)
            continue;
        struct io_uring_sqe *sqe = io_uring_get_sqe(&ctx->ring);
        if (sqe == NULL)
            break;
        io_uring_prep_cancel64(sqe, (uint64_t)s + 1, 0);
        io_uring_sqe_set_data64(sqe, KVS_IO_CANCEL_TAG);
        ctx->pending_sqes++;
    }
    (void)submit_pending(ctx);
    while (ctx->inflight > 0) {
        int rc = reap(ctx, dir, true, done, arg);
        if (rc < 0)
            break;
    }
    if (ctx->inflight == 0)
        return;
    cm_error("spill io: %u io_uring completion(s) lost after %u ms and a cancel; this context falls back "
             "to pread/pwrite",
             ctx->inflight, 2 * ctx->cfg.timeout_ms);
    for (unsigned s = 0; s < qd; s++) {
        kvs_io_slot_t *sl = &ctx->slots[s];
        if (!sl->inflight)
            continue;
        sl->inflight = false;
        sl->quarantined = true;   /* never put back on the free stack */
        ctx->inflight--;
        ctx->counters.errors++;
        ctx->counters.timeouts++;
        done(arg, sl->req, NULL, -ETIMEDOUT);
    }
    ctx->use_ring = false;
    snprintf(ctx->uring_err, sizeof(ctx->uring_err), "completions lost; degraded to pread/pwrite");
}

/* The ring failed outright: end everything in flight with -EIO. */
static void fail_inflight(kvs_io_ctx_t *ctx, int rc, kvs_io_done_fn_t done, void *arg)
{
    cm_error("spill io: io_uring failed (%s); this context falls back to pread/pwrite", strerror(-rc));
    for (unsigned s = 0; s < ctx->cfg.queue_depth; s++) {
        kvs_io_slot_t *sl = &ctx->slots[s];
        if (!sl->inflight)
            continue;
        sl->inflight = false;
        sl->quarantined = true;
        ctx->inflight--;
        ctx->counters.errors++;
        done(arg, sl->req, NULL, -EIO);
    }
    ctx->pending_sqes = 0;
    ctx->use_ring = false;
    snprintf(ctx->uring_err, sizeof(ctx->uring_err), "io_uring failed: %s", strerror(-rc));
}

static ri_status_t run_uring(kvs_io_ctx_t *ctx, kvs_io_dir_t dir, size_t n, kvs_io_prep_fn_t prep,
                             kvs_io_done_fn_t done, void *arg)
{
    size_t next = 0;
    while (next < n || ctx->inflight > 0) {
        while (next < n && ctx->n_free > 0) {
            unsigned s = take_slot(ctx);
            kvs_io_slot_t *sl = &ctx->slots[s];
            sl->req = next;
            sl->tries = 0;
            if (prep(arg, next, slot_buf(ctx, s), &sl->fd, &sl->off, &sl->len) != RI_OK) {
                put_slot(ctx, s);
                next++;
                continue;
            }
            next++;
            if (!queue_sqe(ctx, dir, s)) {
                sl->inflight = false;
                ctx->counters.errors++;
                done(arg, sl->req, slot_buf(ctx, s), -EIO);
                put_slot(ctx, s);
            }
        }
        int rc = submit_pending(ctx);
        if (rc < 0) {
            fail_inflight(ctx, rc, done, arg);
            (void)run_sync(ctx, dir, next, n, prep, done, arg);
            return RI_ERR_INTERNAL;
        }
        if (ctx->inflight == 0)
            continue;
        rc = reap(ctx, dir, true, done, arg);
        if (rc == -ETIME) {
            handle_timeout(ctx, dir, done, arg);
            if (!ctx->use_ring)
                return run_sync(ctx, dir, next, n, prep, done, arg);
        } else if (rc < 0) {
            fail_inflight(ctx, rc, done, arg);
            (void)run_sync(ctx, dir, next, n, prep, done, arg);
            return RI_ERR_INTERNAL;
        }
    }
    return RI_OK;
}

ri_status_t kvs_io_ctx_run(kvs_io_ctx_t *ctx, kvs_io_dir_t dir, size_t n, kvs_io_prep_fn_t prep,
                           kvs_io_done_fn_t done, void *arg)
{
    if (n == 0)
        return RI_OK;
    if (ctx->use_ring)
        return run_uring(ctx, dir, n, prep, done, arg);
    return run_sync(ctx, dir, 0, n, prep, done, arg);
}
