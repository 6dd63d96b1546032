/*
 * Coldness policy helper for the spill tier: which pool-resident clusters to
 * spill first.  Tracks clusters in least-recently-fetched order; a cluster
 * pinned by an in-flight fetch is never offered.  The data side calls
 * touch() when it serves a cluster from the pool, pin()/unpin() around a fetch
 * that reads pool pages, pick() when the pool passes its high-water mark, and
 * remove() once a cluster has been spilled or its session dropped.
 *
 * Thread safety: every function may be called from any thread (one mutex).
 */
#ifndef KVS_SPILL_COLD_H
#define KVS_SPILL_COLD_H

#include <stddef.h>
#include <stdint.h>

#include "kvstore/spill/kvs_spill.h"

typedef struct kvs_spill_cold kvs_spill_cold_t;

/* Create an empty tracker.  Caller destroys with kvs_spill_cold_destroy. */
ri_status_t kvs_spill_cold_create(kvs_spill_cold_t **cold_p);

/* Free the tracker; NULL is a no-op. */
void kvs_spill_cold_destroy(kvs_spill_cold_t *cold);

/* A cluster of `bytes` pool bytes was fetched (or admitted): it becomes the
 * most recently used.  Inserts it when new. */
ri_status_t kvs_spill_cold_touch(kvs_spill_cold_t *cold, const kvs_spill_key_t *key, uint64_t bytes);

/* Stop tracking a cluster (spilled, freed); unknown keys are ignored. */
void kvs_spill_cold_remove(kvs_spill_cold_t *cold, const kvs_spill_key_t *key);

/* Forget every cluster of a session; returns how many. */
size_t kvs_spill_cold_drop_session(kvs_spill_cold_t *cold, uint64_t session);

/* Pin a cluster for an in-flight fetch (pins nest).  RI_ERR_NOT_FOUND when not tracked. */
ri_status_t kvs_spill_cold_pin(kvs_spill_cold_t *cold, const kvs_spill_key_t *key);

/* Undo one pin; unknown or unpinned keys are ignored. */
void kvs_spill_cold_unpin(kvs_spill_cold_t *cold, const kvs_spill_key_t *key);

/* Write up to max_n of the coldest unpinned clusters into keys_p (coldest
 * first), stopping once their bytes reach max_bytes (0 = no byte limit).
 * The clusters stay tracked until removed.  Returns the count written. */
size_t kvs_spill_cold_pick(kvs_spill_cold_t *cold, size_t max_n, uint64_t max_bytes, kvs_spill_key_t *keys_p);

/* Clusters tracked. */
size_t kvs_spill_cold_count(kvs_spill_cold_t *cold);

#endif /* KVS_SPILL_COLD_H */
