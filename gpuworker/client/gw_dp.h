/*
 * The worker side of the UCX data plane: a client of ri-kvstore's data
 * plane for one session.  One connection per gw_dp_t; calls are synchronous
 * (send, then progress until the reply or the deadline) and not thread-safe:
 * use one gw_dp_t per thread.  Every call returns an error instead of
 * hanging when the daemon is gone (RI_ERR_CONN_RESET) or slow
 * (RI_ERR_TIMEOUT); after either the connection is unusable (close it).
 * Layouts: common/cm_dp_proto.h.
 */
#ifndef GW_DP_H
#define GW_DP_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "common/cm_dp_prefix.h"
#include "common/cm_dp_proto.h"
#include "common/cm_wire.h"
#include "retroinfer/status.h"

typedef struct gw_dp gw_dp_t;

typedef struct gw_dp_options {
    uint32_t timeout_ms;       /* default deadline of a call (0 = 10000) */
} gw_dp_options_t;

/* Connect to addr (the kvstore's "ucx:HEX" worker address, as CreateSession
 * gives it) for session_id with its secret: CONNECT (our own UCX address, so
 * the kvstore can answer), then a PING.  RI_ERR_INVALID for an address not
 * in that form; RI_ERR_TIMEOUT when the kvstore does not accept the
 * connection (it answers nothing to a wrong secret).  opts may be NULL.
 * Caller closes with gw_dp_close. */
ri_status_t gw_dp_connect(const char *addr, uint64_t session_id, const uint8_t secret[CM_WIRE_SECRET_SIZE],
                          const gw_dp_options_t *opts, gw_dp_t **dp_p);

/* Close the connection and free everything (registered buffers included).
 * NULL is a no-op.  A connection that gw_dp_connect gave up on is closed by
 * a background thread up to 30 s later (its UCX worker kept alive so that a
 * slow kvstore's wireup to it still finds it: docs/kvstore-data.md). */
void gw_dp_close(gw_dp_t *dp);

/* Direct reads (common/cm_dp_direct.h).  MAP: ask the kvstore for the
 * session's direct region, receive its memory file over the handover socket
 * (proving the session's secret there) and map it read-only here; *local_p
 * then points at its first byte, valid until gw_dp_close (which unmaps it;
 * a kvstore that dies leaves the mapping readable).  RI_ERR_UNSUPPORTED when
 * the kvstore has no region to give or its handover socket cannot be
 * reached from here (another host): the connection stays usable, two-sided. */
ri_status_t gw_dp_map(gw_dp_t *dp, uint8_t **local_p, uint64_t *bytes_p);

/* Testing: a one-sided read of len bytes at the kvstore's address raddr
 * into buf, through a key this side packs for buf itself, waiting up to
 * timeout_ms.  Any peer can send one (over TCP UCX emulates it with
 * messages, and a target whose context has RMA answers it from whatever
 * address it names); the tests use it to show the kvstore does not. */
ri_status_t gw_dp_forged_get(gw_dp_t *dp, uint64_t raddr, void *buf, size_t len, uint32_t timeout_ms);

/* LOCATE: offsets in the region of clusters [first, first + count) of
 * (layer, head) into offs (CM_DP_NOT_DIRECT for those not in it). */
ri_status_t gw_dp_locate(gw_dp_t *dp, uint32_t layer, uint32_t head, uint32_t first, uint32_t count,
                         uint64_t *offs);

/* TOUCH: n access records, recs = n x {layer, head, cluster id}. */
ri_status_t gw_dp_touch(gw_dp_t *dp, const uint32_t *recs, uint32_t n);

/* PING: a round trip (authenticated for the session). */
ri_status_t gw_dp_ping(gw_dp_t *dp);

/*
 * Upload (append = false) or append clusters of one layer for n_heads heads.
 * heads[i]: KV head, counts[i]: its clusters, tokens: sizes of all clusters
 * head by head; pages: their K/V in page format (cm_dp_proto.h), bytes long.
 * first_ids_p (n_heads entries, may be NULL) gets each head's first id.
 */
ri_status_t gw_dp_upload(gw_dp_t *dp, bool append, uint32_t layer, uint32_t n_heads, const uint32_t *heads,
                         const uint32_t *counts, const uint32_t *tokens, const void *pages, size_t bytes,
                         uint32_t *first_ids_p);

/*
 * Announce a block cache of capacity_pages pages and the receive buffer
 * (recv, recv_len bytes; borrowed: it must stay valid until the cache is
 * released or the connection closed) where misses will be written.  Mode
 * AUTO (see gw_dp_register_cache_mode).  Writes the cache id and page bytes.
 */
ri_status_t gw_dp_register_cache(gw_dp_t *dp, uint32_t capacity_pages, void *recv, size_t recv_len,
                                 uint32_t *cache_id_p, uint64_t *page_bytes_p);

/* How misses reach the receive buffer. */
typedef enum gw_dp_recv_mode {
    GW_DP_RECV_AUTO = 0,    /* INLINE: today's kvstore refuses RMA delivery */
    GW_DP_RECV_RMA = 1,     /* the server would ucp_put them (buffer registered + rkey);
                               ri-kvstore answers RI_ERR_UNSUPPORTED: RMA in a server's
                               UCX context also serves any peer's reads (cm_ucx.h) */
    GW_DP_RECV_INLINE = 2,  /* they come in the reply; UCX receives them in place */
} gw_dp_recv_mode_t;

/* As gw_dp_register_cache, choosing the delivery mode. */
ri_status_t gw_dp_register_cache_mode(gw_dp_t *dp, uint32_t capacity_pages, void *recv, size_t recv_len,
                                      gw_dp_recv_mode_t mode, uint32_t *cache_id_p, uint64_t *page_bytes_p);

/* Allocate len bytes of receive buffer from UCX (shared memory when the
 * shared-memory transports are on), for RMA delivery; freed by
 * gw_dp_recv_free or gw_dp_close. */
ri_status_t gw_dp_recv_alloc(gw_dp_t *dp, size_t len, void **ptr_p);
void gw_dp_recv_free(gw_dp_t *dp, void *ptr);

/* The answer to a ranked fetch; the view points into `buf`. */
typedef struct gw_dp_fetch_result {
    cm_dp_fetch_reply_view_t view;  /* decoded and checked */
    uint8_t *buf;                   /* reply meta (owned) */
} gw_dp_fetch_result_t;

/*
 * Ranked fetch for one layer: per head heads[i] the counts[i] cluster ids in
 * ids (head by head, best first).  Misses land in the cache's receive buffer
 * from recv_offset on before this returns.  Free the result with
 * gw_dp_fetch_result_free.  timeout_ms 0 = the connection's default.
 */
ri_status_t gw_dp_fetch_ranked(gw_dp_t *dp, uint32_t cache_id, uint32_t layer, uint32_t n_heads,
                               const uint32_t *heads, const uint32_t *counts, const uint32_t *ids,
                               uint64_t recv_offset, uint32_t timeout_ms, gw_dp_fetch_result_t *res_p);

/*
 * The same in two halves, so that the caller can compute while the request
 * is served (the estimation-zone kernel overlaps the round trip): start
 * sends it, finish progresses until the reply (misses in the buffer) or the
 * deadline.  Nothing else may be called on dp in between (RI_ERR_BUSY).
 */
ri_status_t gw_dp_fetch_start(gw_dp_t *dp, uint32_t cache_id, uint32_t layer, uint32_t n_heads,
                              const uint32_t *heads, const uint32_t *counts, const uint32_t *ids,
                              uint64_t recv_offset);
ri_status_t gw_dp_fetch_finish(gw_dp_t *dp, uint32_t timeout_ms, gw_dp_fetch_result_t *res_p);

/* NULL-safe; frees what gw_dp_fetch_ranked put in *res. */
void gw_dp_fetch_result_free(gw_dp_fetch_result_t *res);

/* Release a cache (0 = all of this connection's caches on the session). */
ri_status_t gw_dp_release(gw_dp_t *dp, uint32_t cache_id);

/*
 * Testing and fuzzing: send raw bytes as a request (hdr: the AM header, any
 * length; body: the AM payload) and wait for the next reply.  The reply's
 * decoded header goes to *reply_p (status = the server's verdict).
 */
ri_status_t gw_dp_raw(gw_dp_t *dp, const void *hdr, size_t hdr_len, const void *body, size_t body_len,
                      uint32_t timeout_ms, cm_wire_hdr_t *reply_p);

/* Testing: send raw bytes as a request and progress the connection for
 * progress_ms without waiting for the reply: a sender that stops half way
 * (the caller then stops itself).  The connection is unusable afterwards
 * except for gw_dp_close. */
ri_status_t gw_dp_raw_start(gw_dp_t *dp, const void *hdr, size_t hdr_len, const void *body, size_t body_len,
                            uint32_t progress_ms);

/*
 * Prefix blocks (common/cm_dp_prefix.h).
 *
 * PREFIX_ATTACH: attach to the session the leading blocks of keys
 * (n_keys x CM_PFX_KEY_SIZE bytes) the session's tenant holds; out (room for
 * n_keys) gets one entry per attached block, *n_attached_p how many (0: the
 * first key is not cached).
 */
ri_status_t gw_dp_prefix_attach(gw_dp_t *dp, const uint8_t *keys, uint32_t n_keys, cm_pfx_attached_t *out,
                                uint32_t *n_attached_p);

/* The same with the request's flags: CM_PFX_ATTACH_F_SLOTS for a session
 * that reads the blocks by slot only (the kvstore then keeps no per-cluster
 * entry of them for it). */
ri_status_t gw_dp_prefix_attach_flags(gw_dp_t *dp, const uint8_t *keys, uint32_t n_keys, uint32_t flags,
                                      cm_pfx_attached_t *out, uint32_t *n_attached_p);

/* PREFIX_PUT: publish block (len bytes, "RIPB" format) under key and attach
 * it; *slot_p its slot, *flags_p CM_PFX_F_EXISTED when the key was there
 * with equal tables (either may be NULL).  RI_ERR_EXISTS (the key holds
 * other tables), RI_ERR_QUOTA (over a prefix cap), RI_ERR_CORRUPT (CRC). */
ri_status_t gw_dp_prefix_put(gw_dp_t *dp, const uint8_t key[CM_PFX_KEY_SIZE], const void *block, uint64_t len,
                             uint32_t *slot_p, uint32_t *flags_p);

/* PREFIX_GET: bytes [offset, offset + len) of the block attached at slot
 * into buf (two-sided: for a worker that cannot map it). */
ri_status_t gw_dp_prefix_get(gw_dp_t *dp, uint32_t slot, uint64_t offset, void *buf, uint64_t len);

/* Same host: the block attached at slot mapped read-only through the
 * handover (object = slot + 1).  The mapping is owned by dp: the same one
 * on repeated calls, unmapped at gw_dp_close.  RI_ERR_UNSUPPORTED when it
 * cannot be mapped here (another host, no handover): use gw_dp_prefix_get. */
ri_status_t gw_dp_map_block(gw_dp_t *dp, uint32_t slot, const uint8_t **base_p, uint64_t *bytes_p);

/* Fill a request header for this connection's session (request id set). */
void gw_dp_header(gw_dp_t *dp, uint16_t op, uint32_t meta_len, uint64_t data_len, cm_wire_hdr_t *hdr_p);

#endif /* GW_DP_H */
