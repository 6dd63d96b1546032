/*
 * Copy engines (gw_copier.h): the table every implementation fills, the
 * ticket bookkeeping they share, and the host copier -- a thread that runs
 * the space's copy for each queued ticket in order.  The workload is a
 * handful of page-sized copies per decode step (a step's admitted misses).
 */
#include "gpuworker/client/gw_copier.h"

#include <errno.h>
#include <pthread.h>
#include <stdatomic.h>
#include <time.h>

#include "common/cm_alloc.h"
#include "common/cm_log.h"
#include "common/cm_time.h"

static CM_ALLOC_TAG(gw_copier_tag, "gw.copier");

struct gw_copier {
    const gw_copier_ops_t *ops; /* the implementation */
    void *ctx;                  /* its state (owned) */
    gw_ticket_t last;           /* last ticket issued */
};

/* Written once by the CUDA file's init, read by any thread. */
static _Atomic(gw_copier_factory_fn_t) gw_copier_device_factory;

ri_status_t gw_copier_wrap(const gw_copier_ops_t *ops, void *ctx, gw_copier_t **c_p)
{
    gw_copier_t *c;
    if (ops == NULL || c_p == NULL)
        return RI_ERR_INVALID;
    c = cm_calloc(&gw_copier_tag, 1, sizeof(*c));
    if (c == NULL)
        return RI_ERR_NOMEM;
    c->ops = ops;
    c->ctx = ctx;
    *c_p = c;
    return RI_OK;
}

void gw_copier_register_device(gw_copier_factory_fn_t create)
{
    atomic_store(&gw_copier_device_factory, create);
}

ri_status_t gw_copier_create(const kn_mem_t *mem, gw_copier_t **c_p)
{
    if (mem == NULL || !mem->device)
        return gw_copier_host_create(mem, c_p);
    gw_copier_factory_fn_t f = atomic_load(&gw_copier_device_factory);
    if (f == NULL) {
        cm_error("copier: no copy engine for the %s memory space (the CUDA file did not register one)", mem->name);
        return RI_ERR_UNSUPPORTED;
    }
    return f(c_p);
}

void gw_copier_destroy(gw_copier_t *c)
{
    if (c == NULL)
        return;
    c->ops->destroy(c->ctx);
    cm_free(c);
}

const char *gw_copier_name(const gw_copier_t *c)
{
    return c->ops->name;
}

ri_status_t gw_copier_error(gw_copier_t *c)
{
    ri_status_t err = RI_OK;
    gw_ticket_t failed = 0;
    (void)c->ops->progress(c->ctx, &err, &failed);
    return err;
}

ri_status_t gw_copier_submit(gw_copier_t *c, void *dst, const void *src, size_t bytes, gw_ticket_t *t_p)
{
    ri_status_t st = gw_copier_error(c);
    if (st != RI_OK)
        return st;
    if (bytes == 0) {
        *t_p = GW_TICKET_NONE;
        return RI_OK;
    }
    if (dst == NULL || src == NULL)
        return RI_ERR_INVALID;
    st = c->ops->submit(c->ctx, dst, src, bytes, c->last + 1);
    if (st != RI_OK)
        return st;
    *t_p = ++c->last;
    return RI_OK;
}

bool gw_copier_done(gw_copier_t *c, gw_ticket_t t)
{
    ri_status_t err = RI_OK;
    gw_ticket_t failed = 0, done = c->ops->progress(c->ctx, &err, &failed);
    return t <= done || (err != RI_OK && failed <= t);
}

ri_status_t gw_copier_wait(gw_copier_t *c, gw_ticket_t t, uint64_t deadline_ns)
{
    if (t == GW_TICKET_NONE)
        return RI_OK;
    if (t > c->last)
        return RI_ERR_INVALID;
    return c->ops->wait(c->ctx, t, deadline_ns);
}

ri_status_t gw_copier_drain(gw_copier_t *c)
{
    ri_status_t st = gw_copier_wait(c, c->last, GW_NO_DEADLINE);
    return st != RI_OK ? st : gw_copier_error(c);
}

gw_ticket_t gw_copier_last(const gw_copier_t *c)
{
    return c->last;
}

/* ---- the host copier ---- */

typedef struct gw_hcopy {
    void *dst;
    const void *src;
    size_t bytes;
    gw_ticket_t t;
} gw_hcopy_t;

typedef struct gw_hcopier {
    const kn_mem_t *mem;   /* whose copy runs (borrowed) */
    pthread_t thread;      /* runs the queue */
    pthread_mutex_t mu;    /* guards everything below */
    pthread_cond_t work;   /* the thread waits here for copies */
    pthread_cond_t landed; /* waiters wait here for tickets (CLOCK_MONOTONIC) */
    gw_hcopy_t *q;         /* ring of queued copies */
    size_t cap, head, n;   /* ring capacity, first queued, queued */
    gw_ticket_t done;      /* highest ticket finished (made or skipped) */
    ri_status_t err;       /* first failure, sticky */
    gw_ticket_t failed;    /* its ticket */
    bool stop;             /* destroy: finish the queue, then exit */
} gw_hcopier_t;

static void *gw_hcopier_main(void *arg)
{
    gw_hcopier_t *h = arg;
    pthread_mutex_lock(&h->mu);
    for (;;) {
        while (h->n == 0 && !h->stop)
            pthread_cond_wait(&h->work, &h->mu);
        if (h->n == 0)
            break;
        gw_hcopy_t cp = h->q[h->head];
        bool skip = h->err != RI_OK; /* after a failure nothing more lands */
        pthread_mutex_unlock(&h->mu);
        ri_status_t st = skip ? RI_OK : h->mem->copy(cp.dst, cp.src, cp.bytes);
        pthread_mutex_lock(&h->mu);
        h->head = (h->head + 1) % h->cap;
        h->n--;
        if (st != RI_OK && h->err == RI_OK) {
            cm_error("copier (host): copy of ticket %llu (%zu bytes) failed: %s", (unsigned long long)cp.t, cp.bytes,
                     ri_status_str(st));
            h->err = st;
            h->failed = cp.t;
        }
        h->done = cp.t;
        pthread_cond_broadcast(&h->landed);
    }
    pthread_mutex_unlock(&h->mu);
    return NULL;
}

static ri_status_t gw_hcopier_submit(void *ctx, void *dst, const void *src, size_t bytes, gw_ticket_t t)
{
    gw_hcopier_t *h = ctx;
    ri_status_t st = RI_OK;
    pthread_mutex_lock(&h->mu);
    if (h->n == h->cap) {
        size_t cap = h->cap * 2;
        gw_hcopy_t *q = cm_malloc(&gw_copier_tag, cap * sizeof(*q));
        if (q == NULL) {
            st = RI_ERR_NOMEM;
            goto out_unlock;
        }
        for (size_t i = 0; i < h->n; i++)
            q[i] = h->q[(h->head + i) % h->cap];
        cm_free(h->q);
        h->q = q;
        h->cap = cap;
        h->head = 0;
    }
    h->q[(h->head + h->n) % h->cap] = (gw_hcopy_t){dst, src, bytes, t};
    h->n++;
    pthread_cond_signal(&h->work);
out_unlock:
    pthread_mutex_unlock(&h->mu);
    return st;
}

static gw_ticket_t gw_hcopier_progress(void *ctx, ri_status_t *err_p, gw_ticket_t *failed_p)
{
    gw_hcopier_t *h = ctx;
    pthread_mutex_lock(&h->mu);
    gw_ticket_t done = h->done;
    *err_p = h->err;
    *failed_p = h->failed;
    pthread_mutex_unlock(&h->mu);
    return done;
}

static ri_status_t gw_hcopier_wait(void *ctx, gw_ticket_t t, uint64_t deadline_ns)
{
    gw_hcopier_t *h = ctx;
    ri_status_t st = RI_OK;
    struct timespec ts = {.tv_sec = (time_t)(deadline_ns / 1000000000u), .tv_nsec = (long)(deadline_ns % 1000000000u)};
    pthread_mutex_lock(&h->mu);
    while (h->done < t && !(h->err != RI_OK && h->failed <= t)) {
        if (deadline_ns == GW_NO_DEADLINE) {
            pthread_cond_wait(&h->landed, &h->mu);
        } else if (pthread_cond_timedwait(&h->landed, &h->mu, &ts) == ETIMEDOUT) {
            if (h->done < t && !(h->err != RI_OK && h->failed <= t))
                st = RI_ERR_TIMEOUT;
            break;
        }
    }
    if (st == RI_OK && h->err != RI_OK && h->failed <= t)
        st = h->err;
    pthread_mutex_unlock(&h->mu);
    return st;
}

static void gw_hcopier_destroy(void *ctx)
{
    gw_hcopier_t *h = ctx;
    pthread_mutex_lock(&h->mu);
    h->stop = true;
    pthread_cond_signal(&h->work);
    pthread_mutex_unlock(&h->mu);
    pthread_join(h->thread, NULL);
    pthread_cond_destroy(&h->landed);
    pthread_cond_destroy(&h->work);
    pthread_mutex_destroy(&h->mu);
    cm_free(h->q);
    cm_free(h);
}

static const gw_copier_ops_t gw_hcopier_ops = {
    .name = "host",
    .submit = gw_hcopier_submit,
    .progress = gw_hcopier_progress,
    .wait = gw_hcopier_wait,
    .destroy = gw_hcopier_destroy,
};

ri_status_t gw_copier_host_create(const kn_mem_t *mem, gw_copier_t **c_p)
{
    pthread_condattr_t ca;
    gw_hcopier_t *h;
    ri_status_t st;

    if (c_p == NULL)
        return RI_ERR_INVALID;
    h = cm_calloc(&gw_copier_tag, 1, sizeof(*h));
    if (h == NULL)
        return RI_ERR_NOMEM;
    h->mem = mem != NULL ? mem : kn_mem_host();
    h->cap = 64;
    h->q = cm_malloc(&gw_copier_tag, h->cap * sizeof(*h->q));
    if (h->q == NULL) {
        st = RI_ERR_NOMEM;
        goto err_free_h;
    }
    pthread_mutex_init(&h->mu, NULL);
    pthread_cond_init(&h->work, NULL);
    pthread_condattr_init(&ca);
    pthread_condattr_setclock(&ca, CLOCK_MONOTONIC); /* deadlines are cm_time_ns */
    pthread_cond_init(&h->landed, &ca);
    pthread_condattr_destroy(&ca);
    if (pthread_create(&h->thread, NULL, gw_hcopier_main, h) != 0) {
        cm_error("copier (host): cannot start its thread");
        st = RI_ERR_INTERNAL;
        goto err_destroy_sync;
    }
    st = gw_copier_wrap(&gw_hcopier_ops, h, c_p);
    if (st != RI_OK) {
        gw_hcopier_destroy(h);
        return st;
    }
    return RI_OK;

err_destroy_sync:
    pthread_cond_destroy(&h->landed);
    pthread_cond_destroy(&h->work);
    pthread_mutex_destroy(&h->mu);
    cm_free(h->q);
err_free_h:
    cm_free(h);
    return st;
}
