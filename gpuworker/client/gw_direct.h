/*
 * Direct reads, the worker's side (docs/worker.md, "The data path"): the
 * kvstore's region for our session mapped into this process, where each
 * uploaded cluster lies in it, and the access records owed to the kvstore.
 * A step whose retrieved clusters are all located reads their pages straight
 * from the mapping: no request, no thread of the kvstore's, no wait.  The
 * kvstore learns what was read afterwards, in TOUCH batches sent by the io
 * thread (it keeps the coldness; nothing waits for the answer).
 *
 * Owned by one gw_remote_t and used from its owner's thread only; the io
 * thread fills offsets into UPLOAD jobs that gw_direct_apply then records.
 */
#ifndef GW_DIRECT_H
#define GW_DIRECT_H

#include <stdbool.h>
#include <stdint.h>

#include "gpuworker/client/gw_direct_share.h"
#include "gpuworker/client/gw_io.h"
#include "retroinfer/status.h"

typedef struct gw_direct gw_direct_t;

/* MAP on dp (before the io thread owns it).  RI_ERR_UNSUPPORTED: no region
 * to be had (another host, a kvstore with a spill tier): *d_p = NULL and the
 * connection stays two-sided.  page_bytes: bytes of one page. */
ri_status_t gw_direct_open(gw_dp_t *dp, uint32_t n_layers, uint32_t n_kv, size_t page_bytes, gw_direct_t **d_p);

/* NULL-safe.  The mapping itself goes with the connection (gw_dp_close). */
void gw_direct_close(gw_direct_t *d);

/* Record the offsets of every located upload the io thread finished. */
ri_status_t gw_direct_apply(gw_direct_t *d, gw_io_t *io);

/* Record the LOCATE answers offs[0..count) of clusters [first, first + count)
 * of (layer, head), e.g. those of attached prefix blocks (common/cm_dp_prefix.h):
 * an answer tagged CM_PFX_LOC(slot, off) is read from the block's mapping
 * (gw_direct_set_block), CM_DP_NOT_DIRECT is fetched. */
ri_status_t gw_direct_record(gw_direct_t *d, uint32_t layer, uint32_t head, uint32_t first, uint32_t count,
                             const uint64_t *offs);

/* Read the locations of kvstore ids [0, n) of each table, n its count in
 * locs, from locs (the attached prefix's, held once per process:
 * gw_direct_share.h) rather than storing them.  Before any location is
 * recorded or applied; those come after the shared ones.  Takes the
 * caller's reference to locs (released at gw_direct_close), also on
 * error. */
ri_status_t gw_direct_share(gw_direct_t *d, gw_locs_t *locs);

/* The attached block at slot is mapped at base (bytes long; gw_dp_map_block:
 * borrowed, owned by the connection, which outlives d). */
ri_status_t gw_direct_set_block(gw_direct_t *d, uint32_t slot, const uint8_t *base, uint64_t bytes);

/* The first page of cluster `id` (kvstore id) of (layer, head), n_pages long,
 * when it is located and inside the region, or inside the mapping of the
 * attached block its location names; else NULL (fetch it). */
const uint8_t *gw_direct_pages(const gw_direct_t *d, uint32_t layer, uint32_t head, uint32_t id, uint32_t n_pages);

/* Note that the cluster was read; a full batch goes to the io thread. */
void gw_direct_touch(gw_direct_t *d, gw_io_t *io, uint32_t layer, uint32_t head, uint32_t id);

/* Send the records still held (at the end of a sequence). */
void gw_direct_flush(gw_direct_t *d, gw_io_t *io);

/* The mapped region (for prefaulting its pages off the decode path). */
void gw_direct_mapping(const gw_direct_t *d, const uint8_t **base_p, uint64_t *bytes_p);

/* Clusters read directly so far. */
uint64_t gw_direct_reads(const gw_direct_t *d);

#endif /* GW_DIRECT_H */
