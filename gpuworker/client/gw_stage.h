/*
 * The staging ring (docs/worker.md, "Block cache in device memory"): N slots
 * of slot_bytes of host memory through which bytes that sit in ordinary
 * host memory (the kvstore's region mapped here, a receive buffer) reach a
 * device space.  A copy engine reads pinned (page-locked) memory
 * asynchronously; the region is neither, so a slot is acquired, filled
 * from it, submitted to the copier, and handed out again only once its
 * copy completed.  Slots are used in ring order, so a slot's reuse waits
 * for the oldest copy in flight.
 *
 * The slots are page-locked when the destination is a device space and the
 * CUDA file registered its pinned allocator (gw_stage_register_pinned),
 * plain aligned host memory otherwise (the host space, and every CPU test).
 *
 * Not thread-safe: one owner thread (the one that owns the copier's
 * submissions).
 */
#ifndef GW_STAGE_H
#define GW_STAGE_H

#include <stddef.h>
#include <stdint.h>

#include "gpuworker/client/gw_copier.h"
#include "kernels/kn_mem.h"
#include "retroinfer/status.h"

/* Page-locked host memory (cudaHostAlloc / cudaFreeHost). */
typedef struct gw_pinned {
    ri_status_t (*alloc)(void **p, size_t bytes); /* RI_ERR_NOMEM, RI_ERR_DEVICE */
    void (*free)(void *p);                        /* NULL: no-op */
} gw_pinned_t;

/* Called once by the CUDA file (pinned borrowed forever). */
void gw_stage_register_pinned(const gw_pinned_t *pinned);

typedef struct gw_stage gw_stage_t;

/* n_slots (>= 1) slots of slot_bytes (>= 1) feeding copier c (borrowed;
 * must outlive the ring), whose destination is space dst (NULL = host).
 * Caller frees with gw_stage_destroy.  RI_ERR_INVALID, RI_ERR_NOMEM. */
ri_status_t gw_stage_create(gw_copier_t *c, const kn_mem_t *dst, uint32_t n_slots, size_t slot_bytes,
                            gw_stage_t **s_p);

/* Waits for the copies of its slots, then frees; NULL is a no-op. */
void gw_stage_destroy(gw_stage_t *s);

/* The next slot in ring order, once its last copy completed, waiting until
 * deadline_ns (cm_time_ns clock; GW_NO_DEADLINE: none).  *slot_p its
 * number, *buf_p its slot_bytes of host memory (the caller's until
 * submit or release).  RI_ERR_TIMEOUT (nothing changed), RI_ERR_BUSY (the
 * next slot is still held by the caller), the copier's sticky error. */
ri_status_t gw_stage_acquire(gw_stage_t *s, uint64_t deadline_ns, uint32_t *slot_p, uint8_t **buf_p);

/* Copy the first bytes (<= slot_bytes) of held slot to dst (the space's
 * memory, borrowed until the ticket is done); the slot is reused only after
 * that copy completed.  *t_p the ticket.  On error the slot is released
 * and nothing was queued.  RI_ERR_INVALID: slot not held, bytes too large. */
ri_status_t gw_stage_submit(gw_stage_t *s, uint32_t slot, void *dst, size_t bytes, gw_ticket_t *t_p);

/* Give back a held slot unused. */
void gw_stage_release(gw_stage_t *s, uint32_t slot);

/* bytes from src (any host memory, read before this returns) to dst
 * through the ring, split into slot-sized pieces; *t_p the last piece's
 * ticket (wait on it for the whole).  On error some leading pieces may be
 * queued: the destination holds part of the bytes and must not be used
 * (the copier is broken when a copy failed). */
ri_status_t gw_stage_put(gw_stage_t *s, void *dst, const void *src, size_t bytes, uint64_t deadline_ns,
                         gw_ticket_t *t_p);

/* Slot geometry and whether the slots are page-locked. */
size_t gw_stage_slot_bytes(const gw_stage_t *s);
uint32_t gw_stage_slots(const gw_stage_t *s);
bool gw_stage_pinned(const gw_stage_t *s);

/* Acquires that had to wait for a copy to complete (the ring was full). */
uint64_t gw_stage_waits(const gw_stage_t *s);

#endif /* GW_STAGE_H */
