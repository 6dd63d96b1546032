/*
 * How a step's misses reach the block cache's pages (docs/worker.md,
 * "Block cache in device memory"), chosen once per process from what the
 * build and the machine offer, best first:
 *
 *   ucx-cuda        the UCX context reports CUDA memory support (a UCX
 *                   built with cuda_copy / cuda_ipc): misses are received
 *                   straight into device memory
 *   pinned-staging  a device memory space is present (the CUDA backend is
 *                   registered) but UCX handles host memory only: misses
 *                   land in host memory and go through the staging ring
 *                   (gw_stage.h) and the copy engine
 *   host            no device space: the cache pages are host memory
 *
 * gw_transport_choose is a pure function of the capabilities, so the
 * fallback order is tested with any inputs; gw_transport_probe gathers the
 * real ones.
 */
#ifndef GW_TRANSPORT_H
#define GW_TRANSPORT_H

#include <stdbool.h>

typedef enum gw_transport {
    GW_TRANSPORT_HOST = 0,
    GW_TRANSPORT_PINNED_STAGING = 1,
    GW_TRANSPORT_UCX_CUDA = 2,
} gw_transport_t;

/* What the choice depends on. */
typedef struct gw_transport_caps {
    bool device_space; /* a device memory space is registered (kn_mem_of(NULL)->device) */
    bool ucx_cuda;     /* the UCX context's memory_types include UCS_MEMORY_TYPE_CUDA */
} gw_transport_caps_t;

/* The best transport caps allow: ucx-cuda needs both, pinned-staging the
 * device space, host nothing.  caps NULL = host. */
gw_transport_t gw_transport_choose(const gw_transport_caps_t *caps);

/* "ucx-cuda", "pinned-staging", "host". */
const char *gw_transport_name(gw_transport_t t);

/* The capabilities of this process: the registered memory space, and a
 * UCX context (created once, with the environment's UCX settings, and
 * closed again) asked for its memory types.  Cached after the first call;
 * call it after the CUDA backend was initialised.  Thread-safe. */
void gw_transport_probe(gw_transport_caps_t *caps_p);

/* The name of the transport this process's capabilities choose
 * (gw_transport_probe + gw_transport_choose): what the worker's /metrics
 * and the benchmarks' JSON report. */
const char *gw_transport_current(void);

#endif /* GW_TRANSPORT_H */
