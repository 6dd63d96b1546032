/*
 * The CUDA copy engine and pinned staging memory (gw_cuda.h).  Host ->
 * device copies of a step's misses go on a stream of their own, so that
 * they overlap the compute stream; each ticket records an event, and a
 * ticket is done when its event (and so every earlier copy on the stream)
 * completed.  Events are kept in a ring of GW_CU_EVENTS; a ticket that
 * would reuse the event of one still pending waits for it first.
 *
 * Compiled when nvcc is found; run only where a device is present.
 */
#include <cuda_runtime.h>
#include <stdlib.h>
#include <time.h>

#include "kernels/cuda/kn_cuda_common.cuh"

extern "C" {
#include "common/cm_log.h"
#include "common/cm_time.h"
#include "gpuworker/client/cuda/gw_cuda.h"
#include "gpuworker/client/gw_stage.h"
}

#define GW_CU_EVENTS 256u

typedef struct gw_cucopier {
    cudaStream_t s;                     /* the copy stream */
    cudaEvent_t ev[GW_CU_EVENTS];       /* ticket t records ev[t % GW_CU_EVENTS] */
    gw_ticket_t done;                   /* highest ticket known done */
    gw_ticket_t issued;                 /* highest ticket submitted */
    ri_status_t err;                    /* first failure, sticky */
    gw_ticket_t failed;                 /* its ticket */
} gw_cucopier_t;

static void gw_cu_fail(gw_cucopier_t *h, ri_status_t st, gw_ticket_t t)
{
    if (h->err == RI_OK) {
        h->err = st;
        h->failed = t;
    }
}

/* Advance done over the events that completed (in order). */
static void gw_cu_poll(gw_cucopier_t *h)
{
    while (h->err == RI_OK && h->done < h->issued) {
        gw_ticket_t t = h->done + 1;
        cudaError_t e = cudaEventQuery(h->ev[t % GW_CU_EVENTS]);
        if (e == cudaErrorNotReady) {
            cudaGetLastError();
            return;
        }
        if (e != cudaSuccess) {
            gw_cu_fail(h, kn_cu_status(e, "copier event"), t);
            return;
        }
        h->done = t;
    }
}

static ri_status_t gw_cu_submit(void *ctx, void *dst, const void *src, size_t bytes, gw_ticket_t t)
{
    gw_cucopier_t *h = (gw_cucopier_t *)ctx;
    ri_status_t st;
    /* the event this ticket records into belongs to ticket t - GW_CU_EVENTS */
    if (t > GW_CU_EVENTS && h->done < t - GW_CU_EVENTS) {
        st = kn_cu_status(cudaEventSynchronize(h->ev[t % GW_CU_EVENTS]), "copier event wait");
        if (st != RI_OK) {
            gw_cu_fail(h, st, t - GW_CU_EVENTS);
            return st;
        }
        gw_cu_poll(h);
    }
    st = kn_cu_status(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDefault, h->s), "copier memcpy");
    if (st == RI_OK)
        st = kn_cu_status(cudaEventRecord(h->ev[t % GW_CU_EVENTS], h->s), "copier event record");
    if (st != RI_OK) {
        gw_cu_fail(h, st, t);
        return st;
    }
    h->issued = t;
    return RI_OK;
}

static gw_ticket_t gw_cu_progress(void *ctx, ri_status_t *err_p, gw_ticket_t *failed_p)
{
    gw_cucopier_t *h = (gw_cucopier_t *)ctx;
    gw_cu_poll(h);
    *err_p = h->err;
    *failed_p = h->failed;
    return h->done;
}

static ri_status_t gw_cu_wait(void *ctx, gw_ticket_t t, uint64_t deadline_ns)
{
    gw_cucopier_t *h = (gw_cucopier_t *)ctx;
    for (;;) {
        gw_cu_poll(h);
        if (h->err != RI_OK && h->failed <= t)
            return h->err;
        if (h->done >= t)
            return RI_OK;
        if (deadline_ns == GW_NO_DEADLINE) {
            ri_status_t st = kn_cu_status(cudaEventSynchronize(h->ev[t % GW_CU_EVENTS]), "copier event wait");
            if (st != RI_OK) {
                gw_cu_fail(h, st, t);
                return st;
            }
            continue;
        }
        if (cm_time_ns() >= deadline_ns)
            return RI_ERR_TIMEOUT;
        cm_time_sleep_ns(20000); /* a page-sized copy takes microseconds */
    }
}

static void gw_cu_destroy(void *ctx)
{
    gw_cucopier_t *h = (gw_cucopier_t *)ctx;
    cudaStreamSynchronize(h->s);
    for (unsigned i = 0; i < GW_CU_EVENTS; i++)
        cudaEventDestroy(h->ev[i]);
    cudaStreamDestroy(h->s);
    cudaGetLastError();
    free(h);
}

static const gw_copier_ops_t gw_cu_ops = {
    "cuda", gw_cu_submit, gw_cu_progress, gw_cu_wait, gw_cu_destroy,
};

extern "C" ri_status_t gw_copier_cuda_create(gw_copier_t **c_p)
{
    /* plain calloc: common/cm_alloc.h is C11 (stdatomic), not C++; one small
     * object per copier */
    gw_cucopier_t *h = (gw_cucopier_t *)calloc(1, sizeof(*h));
    unsigned n_ev = 0;
    ri_status_t st;

    if (h == NULL)
        return RI_ERR_NOMEM;
    st = kn_cu_status(cudaStreamCreateWithFlags(&h->s, cudaStreamNonBlocking), "copier stream");
    if (st != RI_OK)
        goto err_free_h;
    for (; n_ev < GW_CU_EVENTS; n_ev++) {
        st = kn_cu_status(cudaEventCreateWithFlags(&h->ev[n_ev], cudaEventDisableTiming), "copier event");
        if (st != RI_OK)
            goto err_destroy_events;
    }
    st = gw_copier_wrap(&gw_cu_ops, h, c_p);
    if (st != RI_OK)
        goto err_destroy_events;
    return RI_OK;

err_destroy_events:
    while (n_ev > 0)
        cudaEventDestroy(h->ev[--n_ev]);
    cudaStreamDestroy(h->s);
err_free_h:
    free(h);
    return st;
}

/* ---- page-locked staging memory ---- */

static ri_status_t gw_cu_pinned_alloc(void **p, size_t bytes)
{
    void *q = NULL;
    ri_status_t st = kn_cu_status(cudaHostAlloc(&q, bytes ? bytes : 1, cudaHostAllocPortable), "pinned alloc");
    if (st != RI_OK)
        return st;
    *p = q;
    return RI_OK;
}

static void gw_cu_pinned_free(void *p)
{
    if (p != NULL && cudaFreeHost(p) != cudaSuccess)
        cudaGetLastError();
}

static const gw_pinned_t gw_cu_pinned = {gw_cu_pinned_alloc, gw_cu_pinned_free};

extern "C" ri_status_t gw_cuda_init(void)
{
    int count = 0;
    if (cudaGetDeviceCount(&count) != cudaSuccess || count == 0) {
        cudaGetLastError();
        return RI_ERR_NO_DEVICE;
    }
    gw_copier_register_device(gw_copier_cuda_create);
    gw_stage_register_pinned(&gw_cu_pinned);
    return RI_OK;
}
