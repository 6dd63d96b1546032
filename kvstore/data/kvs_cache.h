/*
 * Cache directory + LRU of one worker's block cache, as a plain data structure
 * (no I/O, no locks: the data-plane thread owns it).  The worker's cache is
 * `capacity` pages; a cached cluster occupies ceil(tokens / page_tokens) pages,
 * not necessarily adjacent.  Clusters are cached whole.
 *
 * One ranked fetch (kvs_cache_fetch) is decided in two passes so that a
 * rejected request changes nothing:
 *   1. classify: each requested cluster (in the order given: head by head,
 *      rank by rank) is a hit when the directory holds it, else a miss;
 *   2. apply: hits move to most-recent in request order; then misses are
 *      admitted in request order while they fit: a miss needing p pages fits
 *      when p <= capacity - (pages of clusters touched by this fetch, hits and
 *      admissions so far); it then evicts least-recent clusters until p pages
 *      are free (never one touched by this fetch: they are the most recent),
 *      takes the p lowest-numbered free pages and becomes most recent.  The
 *      first miss that does not fit ends admission for this fetch, and evicts
 *      nothing.
 * This exact rule is what tests/kvstore_data's reference model checks.
 */
#ifndef KVS_CACHE_H
#define KVS_CACHE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "retroinfer/status.h"

/* Key of a cached cluster: (layer, head, cluster id). */
static inline uint64_t kvs_cache_key(uint32_t layer, uint32_t head, uint32_t cluster)
{
    return ((uint64_t)layer << 44) | ((uint64_t)head << 32) | cluster;
}

typedef struct kvs_cache kvs_cache_t;

/* One requested cluster and what the fetch decided for it. */
typedef struct kvs_cache_req {
    uint64_t key;          /* in: kvs_cache_key() */
    uint32_t pages;        /* in: pages the cluster needs (>= 1) */
    bool hit;              /* out: it was cached */
    bool admitted;         /* out: a miss that now has cache pages */
    uint32_t first_page;   /* out: index into the page list of kvs_cache_fetch */
} kvs_cache_req_t;

typedef struct kvs_cache_counters {
    uint64_t fetches;      /* kvs_cache_fetch calls that succeeded */
    uint64_t hits;         /* clusters answered as hits */
    uint64_t misses;       /* clusters answered as misses */
    uint64_t admitted;     /* misses admitted */
    uint64_t evicted;      /* clusters evicted */
} kvs_cache_counters_t;

/* A directory for a cache of capacity pages (1..2^26).  Caller destroys. */
ri_status_t kvs_cache_create(uint32_t capacity, kvs_cache_t **cache_p);

/* The memory kvs_cache_create(capacity) takes (charged to the tenant before
 * it is allocated). */
size_t kvs_cache_bytes_for(uint32_t capacity);

/* NULL is a no-op. */
void kvs_cache_destroy(kvs_cache_t *cache);

/*
 * Decide one ranked fetch over reqs[0..n).  Keys must be distinct
 * (RI_ERR_INVALID otherwise, nothing changed).  For every hit and every
 * admitted miss, reqs[i].first_page indexes pages_out where its reqs[i].pages
 * cache page numbers are written (in cluster page order); pages_out must hold
 * the sum of reqs[].pages.  Evicted keys are written to evicted_out (room for
 * max_evicted; the count to *n_evicted_p; RI_ERR_RANGE before any change when
 * the room could be too small: pass max_evicted >= capacity to be safe).
 */
ri_status_t kvs_cache_fetch(kvs_cache_t *cache, kvs_cache_req_t *reqs, size_t n, uint32_t *pages_out,
                            uint64_t *evicted_out, size_t max_evicted, size_t *n_evicted_p);

/* Does the directory hold key?  (tests, metrics) */
bool kvs_cache_contains(const kvs_cache_t *cache, uint64_t key);

/* Number of clusters cached / pages free / capacity. */
size_t kvs_cache_clusters(const kvs_cache_t *cache);
uint32_t kvs_cache_free_pages(const kvs_cache_t *cache);
uint32_t kvs_cache_capacity(const kvs_cache_t *cache);

/* Counters since creation. */
void kvs_cache_counters(const kvs_cache_t *cache, kvs_cache_counters_t *c_p);

#endif /* KVS_CACHE_H */
