/*
 * An attached prefix's meta index held once per worker process
 * (docs/prefix.md "Shared meta index").
 *
 * The int8 centroids and value means (with their scales) of a prefix's
 * clusters are the bulk of a sequence's meta index, its cluster tables
 * (sizes, offsets, the token permutation) the rest, and every sequence
 * that attaches the same blocks has the same ones: the prefix's clusters
 * come first, perm holds absolute positions and offsets start at 0.  The first sequence to attach a prefix
 * lays all seven arrays out, per (layer, KV head) table, in a sealed memory
 * file; every sequence that attaches it maps the file's arrays
 * copy-on-write at the heads of its own reserved, never-moving arrays
 * (kn_wave_place), whose tails take its own clusters (its question and
 * decode-time updates) in private anonymous pages.  The index build finds
 * the bytes already there and does not write them (kn_wave_build_pieces),
 * so the pages stay shared: one copy per process, whatever the number of
 * sequences, and a sequence's appends never show in another's view.
 *
 * The memory file is reference-counted by the sequences that map it and
 * closed when the last one detaches.  Thread-safe (one lock per process).
 */
#ifndef GW_META_SHARE_H
#define GW_META_SHARE_H

#include <stdbool.h>
#include <stdint.h>

#include "common/cm_status.h"
#include "gpuworker/client/gw_prefix.h"
#include "kernels/kn_wave.h"

/* Clusters of its own a sequence's reserved arrays take after the prefix's
 * (virtual room only: pages are taken as they are written).  Past it (or
 * past GW_META_OWN_TOKENS) the index copies its arrays to the heap
 * (kn_wave_place). */
#define GW_META_OWN_CLUSTERS 16384u
/* Perm entries of its own (tokens) the same arrays take.  A cluster's size
 * has no bound (a k-means cluster may take a whole block), but the own
 * tokens average the cluster size the index was built with (round(n / tpc)
 * clusters for n tokens), at most KN_WAVE_TOKENS_PER_CLUSTER with the auto
 * size: with this room the cluster room is what runs out first (or both
 * together at 16), and a larger fixed cluster size runs out of this one
 * first: the index goes to the heap, correct either way.  1 MiB of address
 * space a table, virtual only. */
#define GW_META_OWN_TOKENS   (GW_META_OWN_CLUSTERS * KN_WAVE_TOKENS_PER_CLUSTER)

/* One sequence's view of a shared prefix's rows. */
typedef struct gw_meta_homes gw_meta_homes_t;

/* Map the rows and tables of the prefix whose last attached block is named
 * key (keys are chained: it names every block before it) for a sequence
 * whose parsed blocks are set (n_layers x n_kv tables of head_dim d): the
 * process's copy when one exists with the same blocks and cluster and token
 * counts, else a new one laid out from set's pieces.  Then give every
 * (layer, head) index of the sequence its homes (kn_wave_place on waves[layer], before any build).
 * *homes_p is the caller's until gw_meta_detach, which must come after the
 * waves are destroyed.  Errors: RI_ERR_INVALID, RI_ERR_NOMEM, RI_ERR_IO (no
 * memory file or mapping); on error nothing is placed or held. */
ri_status_t gw_meta_attach(const uint8_t key[CM_PFX_KEY_SIZE], gw_pfx_set_t *set, uint32_t n_layers, uint32_t n_kv,
                           uint32_t d, kn_wave_t *const *waves, gw_meta_homes_t **homes_p);

/* Unmap a sequence's homes and drop its reference (the last one closes the
 * memory file).  NULL is a no-op. */
void gw_meta_detach(gw_meta_homes_t *homes);

/* Shared copies held by the process now and their bytes (for tests and
 * /metrics). */
void gw_meta_stats(uint32_t *copies_p, uint64_t *bytes_p);

/* Whether attaching shares (true, the default) or leaves each sequence its
 * own copy: the comparison the tests and benchmarks make. */
void gw_meta_set_sharing(bool on);

#endif /* GW_META_SHARE_H */
