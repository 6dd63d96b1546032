/*
 * The block cache's pages of the clusters one KV head has cached: the
 * worker's mirror of the kvstore's cache directory for that head
 * (gw_remote_mirror.c), keyed by local cluster id.
 *
 * Only the cached clusters cost anything: an open-addressing table (linear
 * probing, at most half full) of (id, pages) slots, 16 bytes each.  A
 * sequence attached to a long prefix names hundreds of thousands of
 * clusters and caches a few percent of them; a pointer per cluster, cached
 * or not, was 8 bytes a cluster for every sequence.
 *
 * Not thread-safe: the owner's thread writes it between steps; a step's
 * parallel parts only read it.
 */
#ifndef GW_CPG_H
#define GW_CPG_H

#include <stdint.h>

#include "retroinfer/status.h"

typedef struct gw_cpg_slot {
    uint32_t id;     /* local cluster id, or GW_CPG_EMPTY */
    uint32_t *pages; /* its cache pages (owned by the map) */
} gw_cpg_slot_t;

/* Zero-initialised: empty, nothing allocated. */
typedef struct gw_cpg {
    gw_cpg_slot_t *slot; /* [cap] or NULL */
    uint32_t cap;        /* a power of two, or 0 */
    uint32_t n;          /* clusters held */
} gw_cpg_t;

#define GW_CPG_EMPTY UINT32_MAX

/* The cache pages of cluster id, or NULL when it is not cached. */
uint32_t *gw_cpg_get(const gw_cpg_t *m, uint32_t id);

/* Room for n_pages pages of cluster id: its array when it has one (the
 * caller overwrites it; n_pages must be what it was made with), else a new
 * one the map owns.  NULL: out of memory, the map unchanged. */
uint32_t *gw_cpg_put(gw_cpg_t *m, uint32_t id, uint32_t n_pages);

/* Forget cluster id (evicted) and free its pages; absent: nothing. */
void gw_cpg_del(gw_cpg_t *m, uint32_t id);

/* Forget every cluster and free the table (zero again). */
void gw_cpg_clear(gw_cpg_t *m);

#endif /* GW_CPG_H */
