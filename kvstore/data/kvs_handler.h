/*
 * The seam between the UCX transport of kvstore/data and its operations,
 * in the shape UCX itself uses between uct and ucp: the transport delivers
 * and a handler decides.  Each side reaches the other only through a table
 * of callbacks registered at start:
 *
 *   - the operations give the transport a kvs_handlers_t (check a header,
 *     serve a request, a connection opened or closed, count what the
 *     transport refused on its own, hand a direct region over);
 *   - the transport gives each request a reply object (kvs_reply_obj_t: an
 *     opaque handle and a small ops table) through which the handler
 *     answers, with a status, a meta block and a data block in pieces;
 *   - the transport gives the operations a kvs_xport_t for the few services
 *     only it has (direct-region memory and the name of its handover
 *     socket).
 *
 * Dependency order of the files of kvstore/data (an arrow points at what a
 * file may include or call; nothing points back):
 *
 *   kvs_data.c (catalog; starts the transport with the ops' handler table)
 *     -> operations: kvs_internal.h, kvs_ops.c, kvs_tier.c, kvs_direct.c,
 *                    kvs_prefix.c, kvs_prefix_spill.c, kvs_cache.c, kvs_lease.c
 *     -> transport:  kvs_dp.h, kvs_dp_lane.h, kvs_dp.c, kvs_dp_setup.c,
 *                    kvs_dp_region.c, kvs_dp_check.c
 *   both -> kvs_handler.h (this file) -> common/
 *
 * The operations never include kvs_dp.h / kvs_dp_lane.h nor call kvs_dp_*;
 * the transport never includes kvs_internal.h nor calls kvs_ops_*,
 * kvs_tier_*, kvs_direct_*, kvs_session_*.  tools/check_layers.sh checks
 * both.
 */
#ifndef KVS_HANDLER_H
#define KVS_HANDLER_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "common/cm_wire.h"
#include "retroinfer/status.h"

/* One piece of a reply's data block. */
typedef struct kvs_iov {
    const void *buf;
    size_t len;
} kvs_iov_t;

/* How a reply object answers (the transport's). */
typedef struct kvs_reply_ops {
    /* Answer the request with st.  When st is RI_OK the reply carries meta
     * (meta_len bytes) and a data block made of the n pieces of iov
     * (data_len bytes in all); otherwise both are ignored.  Everything is
     * borrowed and copied before return: nothing waits for the peer.
     * Returns RI_OK when the reply was handed to the transport, else why
     * not (the connection went, no memory). */
    ri_status_t (*send)(void *handle, ri_status_t st, const uint8_t *meta, size_t meta_len, const kvs_iov_t *iov,
                        size_t n, uint64_t data_len);
} kvs_reply_ops_t;

/* The reply object a request is delivered with; answered once, by
 * kvs_reply_send (again only when a send failed: an error reply after a
 * data reply that could not be sent). */
typedef struct kvs_reply_obj {
    const kvs_reply_ops_t *ops;
    void *handle;          /* the transport's; opaque to the handler */
    const void *conn;      /* the connection it came on: an identity (caches are tied to it), never dereferenced */
    bool sent;             /* a kvs_reply_send succeeded */
} kvs_reply_obj_t;

/* Answer r (see kvs_reply_ops_t.send); r->sent tells whether it went. */
static inline ri_status_t kvs_reply_send(kvs_reply_obj_t *r, ri_status_t st, const uint8_t *meta, size_t meta_len,
                                         const kvs_iov_t *iov, size_t n, uint64_t data_len)
{
    ri_status_t rc = r->ops->send(r->handle, st, meta, meta_len, iov, n, data_len);
    r->sent = rc == RI_OK;
    return rc;
}

/* What the operations do for the transport; arg is the table's own.  Every
 * callback runs on a transport thread and may take the operations' locks:
 * the transport never calls one from inside a UCX callback. */
typedef struct kvs_handlers {
    void *arg;
    /* Is the header's session known and its secret right (RI_OK), else
     * RI_ERR_UNAUTHENTICATED.  Asked before a large body is received and
     * before a CONNECT is accepted. */
    ri_status_t (*precheck)(void *arg, const cm_wire_hdr_t *hdr);
    /* Serve one request whose header decoded and whose body (meta || data)
     * is complete, and answer it through reply (always exactly once).
     * body is borrowed for the call. */
    void (*serve)(void *arg, const cm_wire_hdr_t *hdr, const uint8_t *body, kvs_reply_obj_t *reply);
    /* A connection of session_id was accepted (up) or closed (down; what
     * was registered on conn goes with it). */
    void (*conn_event)(void *arg, const void *conn, uint64_t session_id, bool up);
    /* Count n requests of op (0: none) that the transport answered or
     * dropped itself with st (RI_OK: not an error). */
    void (*account)(void *arg, uint8_t op, ri_status_t st, uint64_t n);
    /* The handover: a new descriptor of session_id's object (0: its direct
     * region, slot + 1: the prefix block attached at slot) (*fd_p, caller
     * closes) and its length, when secret is the session's;
     * RI_ERR_UNAUTHENTICATED otherwise. */
    ri_status_t (*handover)(void *arg, uint64_t session_id, const uint8_t secret[CM_WIRE_SECRET_SIZE],
                            uint32_t object, int *fd_p, uint64_t *bytes_p);
} kvs_handlers_t;

/* What the transport does for the operations; handle is the transport's. */
typedef struct kvs_xport_ops {
    /* Make a direct region of bytes: an anonymous memory file, sealed at
     * that size, mapped here read-write (*base_p, *fd_p).
     * RI_ERR_UNSUPPORTED when the handover socket is not up. */
    ri_status_t (*region_alloc)(void *handle, uint64_t bytes, uint8_t **base_p, int *fd_p);
    /* Unmap and close a region region_alloc made. */
    void (*region_free)(void *handle, uint8_t *base, uint64_t bytes, int fd);
    /* The handover socket's abstract name (no leading NUL), "" when not up. */
    const char *(*handover_name)(void *handle);
} kvs_xport_ops_t;

typedef struct kvs_xport {
    const kvs_xport_ops_t *ops;   /* NULL when there is no transport */
    void *handle;
} kvs_xport_t;

#endif /* KVS_HANDLER_H */
