/*
 * Copy engines (docs/worker.md, "Block cache in device memory"): the
 * asynchronous host -> memory-space copies that move a step's misses into
 * the block cache's pages, in submission order, each with a ticket.
 *
 * Two implementations behind one table: the host copier (a thread of its
 * own running the space's copy, so that a copy really is asynchronous and
 * the ordering and waiting are exercised on any machine) and the CUDA
 * copier (cudaMemcpyAsync on a stream of its own, an event per ticket;
 * gpuworker/client/cuda/gw_cuda.h registers it).
 *
 * Tickets start at 1 and grow by one per copy; ticket t done means every
 * copy up to t landed (copies complete in submission order).  The first
 * failing copy makes the copier broken: its status is sticky, copies after
 * it are not made, submit refuses new ones, and a wait on any ticket at or
 * after the failed one returns the error.
 *
 * One producer thread (the owner of the block cache) submits and waits;
 * gw_copier_done and gw_copier_error may be called from any thread.
 */
#ifndef GW_COPIER_H
#define GW_COPIER_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "kernels/kn_mem.h"
#include "retroinfer/status.h"

/* No copy: waiting on it returns at once. */
#define GW_TICKET_NONE 0u
/* A deadline that never passes. */
#define GW_NO_DEADLINE UINT64_MAX

typedef uint64_t gw_ticket_t;
typedef struct gw_copier gw_copier_t;

/* What an implementation provides; ctx is its own state. */
typedef struct gw_copier_ops {
    const char *name; /* "host", "cuda" */
    /* Queue bytes from src (host memory) to dst (the copier's space) as
     * ticket t; src and dst stay borrowed until t is done. */
    ri_status_t (*submit)(void *ctx, void *dst, const void *src, size_t bytes, gw_ticket_t t);
    /* The highest ticket known done (all before it done too); an error
     * sets *err_p (and the failed ticket in *failed_p). */
    gw_ticket_t (*progress)(void *ctx, ri_status_t *err_p, gw_ticket_t *failed_p);
    /* Block until ticket t is done, the copier failed, or deadline_ns
     * (CLOCK_MONOTONIC) passes: RI_OK, the error, RI_ERR_TIMEOUT. */
    ri_status_t (*wait)(void *ctx, gw_ticket_t t, uint64_t deadline_ns);
    /* Wait for everything queued, then release ctx. */
    void (*destroy)(void *ctx);
} gw_copier_ops_t;

/* The host copier over space mem (borrowed forever; NULL = kn_mem_host()):
 * a thread runs mem->copy for each ticket in order.  Caller frees with
 * gw_copier_destroy.  RI_ERR_NOMEM, RI_ERR_INTERNAL (no thread). */
ri_status_t gw_copier_host_create(const kn_mem_t *mem, gw_copier_t **c_p);

/* A copier over an implementation (ops borrowed forever, ctx owned: the
 * copier calls ops->destroy(ctx) when it goes).  For the CUDA file. */
ri_status_t gw_copier_wrap(const gw_copier_ops_t *ops, void *ctx, gw_copier_t **c_p);

/* The copier for space mem: the host copier for a host space, the
 * registered device copier (gw_copier_register_device) for a device
 * space.  RI_ERR_UNSUPPORTED: a device space and no device copier. */
ri_status_t gw_copier_create(const kn_mem_t *mem, gw_copier_t **c_p);

/* Called once by the CUDA file with the factory of its copier. */
typedef ri_status_t (*gw_copier_factory_fn_t)(gw_copier_t **c_p);
void gw_copier_register_device(gw_copier_factory_fn_t create);

/* Waits for every queued copy, then frees; NULL is a no-op. */
void gw_copier_destroy(gw_copier_t *c);

/* "host" or "cuda". */
const char *gw_copier_name(const gw_copier_t *c);

/* Queue a copy of bytes from src (host memory) to dst (the copier's
 * space); *t_p its ticket (GW_TICKET_NONE for bytes 0, which copies
 * nothing).  src and dst are borrowed until the ticket is done.  Returns
 * the sticky error once the copier failed (nothing queued). */
ri_status_t gw_copier_submit(gw_copier_t *c, void *dst, const void *src, size_t bytes, gw_ticket_t *t_p);

/* True when ticket t (and every ticket before it) is done, or failed. */
bool gw_copier_done(gw_copier_t *c, gw_ticket_t t);

/* Wait until ticket t is done or deadline_ns (cm_time_ns clock;
 * GW_NO_DEADLINE: none) passes.  RI_OK; RI_ERR_TIMEOUT (nothing changed:
 * wait again); the sticky error when t is at or after the failed copy.
 * RI_ERR_INVALID for a ticket not yet issued. */
ri_status_t gw_copier_wait(gw_copier_t *c, gw_ticket_t t, uint64_t deadline_ns);

/* Wait for every copy submitted so far (gw_copier_wait of the last one). */
ri_status_t gw_copier_drain(gw_copier_t *c);

/* The last ticket issued (GW_TICKET_NONE before any). */
gw_ticket_t gw_copier_last(const gw_copier_t *c);

/* The sticky error (RI_OK while healthy). */
ri_status_t gw_copier_error(gw_copier_t *c);

#endif /* GW_COPIER_H */
