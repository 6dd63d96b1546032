/*
 * The host block pool: one arena of memory_bytes (explicit hugepages when the
 * system has them, else transparent hugepages requested with madvise), carved
 * by an extent allocator in units of KVS_POOL_UNIT bytes.  Workload: a few
 * large extents per (session, layer, KV head) at upload time, many small ones
 * for decode-time appends, all of a session's extents freed together at drop.
 *
 * Allocation is address-ordered best fit over a sorted array of free extents
 * with immediate coalescing on free (see docs/kvstore-data.md, fragmentation).
 * Thread-safe (one mutex); the arena itself is read/written without the lock.
 */
#ifndef KVS_POOL_H
#define KVS_POOL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "retroinfer/status.h"

#define KVS_POOL_UNIT 4096u  /* allocation unit; also O_DIRECT-friendly for spill */

typedef enum kvs_pool_backing {
    KVS_POOL_PLAIN = 0,      /* ordinary anonymous pages */
    KVS_POOL_THP = 1,        /* anonymous pages, madvise(MADV_HUGEPAGE) */
    KVS_POOL_HUGETLB = 2,    /* explicit hugepages (MAP_HUGETLB) */
} kvs_pool_backing_t;

typedef struct kvs_pool kvs_pool_t;

typedef struct kvs_pool_stats {
    uint64_t total_bytes;        /* arena size (a multiple of the unit) */
    uint64_t used_bytes;         /* allocated */
    uint64_t largest_free_bytes; /* biggest single free extent */
    uint64_t free_extents;       /* number of free extents (fragmentation) */
    uint64_t allocs;             /* successful allocations */
    uint64_t alloc_failures;     /* requests that found no extent */
} kvs_pool_stats_t;

/* Map an arena of bytes (rounded up to the unit).  try_huge asks for
 * MAP_HUGETLB first, then THP.  Caller destroys with kvs_pool_destroy. */
ri_status_t kvs_pool_create(uint64_t bytes, bool try_huge, kvs_pool_t **pool_p);

/* Unmap the arena; NULL is a no-op.  Outstanding extents die with it. */
void kvs_pool_destroy(kvs_pool_t *pool);

/* Base address of the arena; borrowed, valid until destroy. */
uint8_t *kvs_pool_base(const kvs_pool_t *pool);

/* Arena size in bytes. */
uint64_t kvs_pool_size(const kvs_pool_t *pool);

/* How the arena is backed. */
kvs_pool_backing_t kvs_pool_backing(const kvs_pool_t *pool);

/* Allocate an extent of at least bytes (rounded up to the unit); writes the
 * offset from the base.  RI_ERR_NOSPACE when no free extent is large enough
 * (the pool is unchanged), RI_ERR_INVALID for 0 bytes. */
ri_status_t kvs_pool_alloc(kvs_pool_t *pool, uint64_t bytes, uint64_t *off_p);

/* Free an extent returned by kvs_pool_alloc (same bytes).  Freeing something
 * that is not allocated is our own bug: it is logged and ignored. */
void kvs_pool_free(kvs_pool_t *pool, uint64_t off, uint64_t bytes);

/* Bytes an allocation of `bytes` really takes (rounded to the unit). */
uint64_t kvs_pool_round(uint64_t bytes);

/* Counters and fragmentation figures. */
void kvs_pool_stats(kvs_pool_t *pool, kvs_pool_stats_t *stats_p);

/* bytes used / total, in [0, 1]: the pressure a spill tier would watch. */
double kvs_pool_pressure(kvs_pool_t *pool);

#endif /* KVS_POOL_H */
