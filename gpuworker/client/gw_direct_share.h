/*
 * Where an attached prefix's clusters lie for direct reads, held once per
 * worker process (docs/prefix.md "What a sequence holds of an attached
 * prefix").
 *
 * The kvstore answers a session's LOCATE of an attached cluster with
 * CM_PFX_LOC(slot, offset): the block's slot in the session's attach list
 * and the cluster's offset inside the block's bytes (common/cm_dp_prefix.h).
 * A session's first attach gives the blocks slots 0, 1, ... in order, and a
 * block's bytes are the same for everyone who attaches it, so every
 * sequence attached to one prefix gets the same answers: 8 bytes a cluster,
 * hundreds of thousands of clusters for a long document, per sequence.  The
 * first sequence registers its answers; the next ones compare theirs with
 * the registered copy and, when equal to the byte, read it instead of
 * keeping their own.  A sequence whose answers differ (the blocks published
 * again with other bytes under the same keys) keeps its own: no sequence
 * ever reads a location the kvstore did not give it.  Each sequence still
 * resolves a slot through its own block mappings (gw_direct.c).
 *
 * A copy is immutable once registered, reference-counted by the sequences
 * reading it and freed with the last one.  Thread-safe (one lock per
 * process, held to find, compare and register).
 */
#ifndef GW_DIRECT_SHARE_H
#define GW_DIRECT_SHARE_H

#include <stdint.h>

#include "common/cm_dp_prefix.h"
#include "retroinfer/status.h"

typedef struct gw_locs gw_locs_t;

/* The process's copy of these locations, referenced once more (made from
 * them when none is registered under key, n_blocks, n_tables, page_bytes
 * and counts).  key names the last attached block (keys are chained: it
 * names every block before it); counts[t] the attached clusters of table t
 * (layer * n_kv + head); locs their LOCATE answers, table after table
 * (borrowed: copied when registered).  RI_ERR_EXISTS: a copy under the same
 * key differs from locs (the caller keeps its own); RI_ERR_INVALID,
 * RI_ERR_NOMEM.  *out is the caller's until
 * gw_locs_release. */
ri_status_t gw_locs_acquire(const uint8_t key[CM_PFX_KEY_SIZE], uint32_t n_blocks, uint32_t n_tables,
                            uint64_t page_bytes, const uint32_t *counts, const uint64_t *locs, gw_locs_t **out);

/* Drop a reference (the last frees the copy).  NULL is a no-op. */
void gw_locs_release(gw_locs_t *c);

/* Table t's locations (*n_p of them; NULL when none). */
const uint64_t *gw_locs_table(const gw_locs_t *c, uint32_t t, uint32_t *n_p);

/* Copies held by the process now and their heap bytes (tests, /metrics). */
void gw_locs_stats(uint32_t *copies_p, uint64_t *bytes_p);

#endif /* GW_DIRECT_SHARE_H */
