/*
 * Serving the UCX data plane of ri-kvstore: one thread per lane
 * (kvs_dp_lane.h) progresses its ucp worker and serves its requests in
 * arrival order.  There is no listener: workers learn a lane's packed address
 * from CreateSession over the authenticated control API and connect to it,
 * and the first request of a connection, CONNECT, carries the session secret
 * and the worker's own address.  Only then does the server open an endpoint
 * of its own to that address (after ri-kvstore-addrcheck survived unpacking
 * it, kvs_dp_check.c), which answers every request of the connection and
 * reports the peer's failure.  Requests are tied to their connection by the
 * UCX reply endpoint they arrive on, used as a key only: UCX 1.13 crashes
 * when a reply endpoint of a peer that went away is sent on.
 *
 * AM callbacks only queue a request (the 64-byte wire header copied, the body
 * kept as a UCX descriptor).  The thread decodes it; a rendezvous body is
 * received in the background (the secret is checked from the header first),
 * and the request is served when it is in, so a sender that stalls mid-body
 * holds no thread.  The transport delivers and a handler decides: the
 * request goes to the operations' serve callback (kvs_handler.h) with a
 * reply object, and the handler answers through it; the reply goes out
 * without waiting for the peer (meta and data are copied to a buffer owned
 * by the send).  This file never calls the operations but through that
 * table (dp->h).
 * Idle policy: spin while there is traffic, then sleep on the worker's event
 * fd (ucp_worker_arm + poll) so that an idle daemon costs no CPU.
 */
#define _GNU_SOURCE
#include "kvstore/data/kvs_dp_lane.h"

#include <errno.h>
#include <poll.h>
#include <stdio.h>
#include <sys/resource.h>
#include <sys/syscall.h>
#include <unistd.h>
#include <stdlib.h>
#include <string.h>

#include "common/cm_alloc.h"
#include "common/cm_log.h"
#include "common/cm_status.h"
#include "common/cm_time.h"
#include "kvstore/data/kvs_dp_check.h"

static CM_ALLOC_TAG(kvs_dp_tag, "kvs.dp");

#define KVS_DP_RKEY_PAD 4096u
#define KVS_DP_SPIN 2000u       /* with spin_us > 0: empty progress calls before sleeping */
#define KVS_DP_MAX_CONNS 1024u          /* connections of the daemon */
#define KVS_DP_MAX_CONNS_PER_SESSION 16u /* connections of one session */
#define KVS_DP_MAX_INFLIGHT 32u         /* requests of one connection queued at once */
#define KVS_DP_MAX_UNCONNECTED 64u      /* requests of no connection queued in a lane */
#define KVS_DP_CANCEL_GRACE_NS 100000000ull /* a cancelled body receive may take this long to end */

/* A reply in flight: what the send owns until its callback. */
struct kvs_reply {
    uint8_t hdr[CM_WIRE_HDR_SIZE];
    uint8_t *meta;                    /* cm_malloc'd, or the lane's stage */
    bool staged;                      /* meta is the lane's stage: mark it free */
    kvs_dpw_t *lane;                  /* whose in-flight list holds it */
    struct kvs_reply *prev, *next;    /* that list */
};

/* ---- queues ---- */

static void kvs_dq_push(kvs_dq_t *q, kvs_dreq_t *r)
{
    r->next = NULL;
    if (q->tail)
        q->tail->next = r;
    else
        q->head = r;
    q->tail = r;
}

static kvs_dreq_t *kvs_dq_pop(kvs_dq_t *q)
{
    kvs_dreq_t *r = q->head;
    if (r != NULL) {
        q->head = r->next;
        if (q->head == NULL)
            q->tail = NULL;
    }
    return r;
}

static void kvs_dq_remove(kvs_dq_t *q, kvs_dreq_t *r)
{
    kvs_dreq_t *prev = NULL;
    for (kvs_dreq_t *p = q->head; p != NULL; prev = p, p = p->next) {
        if (p != r)
            continue;
        if (prev)
            prev->next = p->next;
        else
            q->head = p->next;
        if (q->tail == p)
            q->tail = prev;
        return;
    }
}

/* ---- connections ---- */

static void kvs_dp_ep_error(void *arg, ucp_ep_h ep, ucs_status_t status)
{
    kvs_conn_t *c = arg;
    (void)ep;
    cm_debug("dp: connection error: %s", ucs_status_string(status));
    c->failed = true;
}

/* The newest live connection whose CONNECT came on peer_key (a worker that
 * connects again on the same UCX connection replaces its older one). */
static kvs_conn_t *kvs_dp_conn_of(kvs_dpw_t *w, const void *peer_key)
{
    if (peer_key == NULL)
        return NULL;
    for (kvs_conn_t *c = w->conns; c != NULL; c = c->next)
        if (c->peer_key == peer_key && !c->failed)
            return c;
    return NULL;
}

/* Count a request the transport refused itself (no handler saw it). */
static void kvs_dp_count_error(kvs_dpw_t *w, ri_status_t st)
{
    w->dp->h.account(w->dp->h.arg, 0, st, 1);
}

ucs_status_t kvs_dp_am_cb(void *arg, const void *header, size_t header_length, void *data, size_t length,
                          const ucp_am_recv_param_t *param)
{
    kvs_dpw_t *w = arg;
    kvs_dreq_t *r;

    /* Callbacks run inside ucp_worker_progress: nothing here may call the
     * handlers (they take the operations' lock).  A
     * request sent without UCP_AM_SEND_FLAG_REPLY (peer_key NULL) can never
     * be tied to a connection: it is counted and dropped when served. */
    const void *key = (param->recv_attr & UCP_AM_RECV_ATTR_FIELD_REPLY_EP) ? param->reply_ep : NULL;
    kvs_conn_t *c = kvs_dp_conn_of(w, key);

    /* Bounds on what a peer can make us hold: a connection has at most
     * KVS_DP_MAX_INFLIGHT requests queued (our client has one); a peer with
     * no accepted connection may only send small messages (a CONNECT), at
     * most KVS_DP_MAX_UNCONNECTED of them queued per lane.  Refused ones are
     * released at once (rendezvous data declined) and counted. */
    if (c != NULL && c->inflight >= KVS_DP_MAX_INFLIGHT) {
        w->dropped_quota++;
        return UCS_OK;
    }
    if (c == NULL && (length > CM_DP_MAX_WORKER_ADDR || w->unconnected >= KVS_DP_MAX_UNCONNECTED)) {
        w->dropped_proto++;
        return UCS_OK;
    }
    r = cm_calloc(&kvs_dp_tag, 1, sizeof(*r));
    if (r == NULL)
        return UCS_OK;
    r->peer_key = key;
    if (c != NULL) {
        c->inflight++;
    } else {
        r->unconnected = true;
        w->unconnected++;
    }
    r->hdr_len = header_length;
    memcpy(r->hdr, header, CM_MIN(header_length, (size_t)CM_WIRE_HDR_SIZE));
    r->len = length;
    if (param->recv_attr & (UCP_AM_RECV_ATTR_FLAG_RNDV | UCP_AM_RECV_ATTR_FLAG_DATA)) {
        r->desc = data;
        r->rndv = (param->recv_attr & UCP_AM_RECV_ATTR_FLAG_RNDV) != 0;
        r->ucx_owned = true;
    } else if (length > 0 && length <= w->dp->max_body) {
        r->desc = cm_malloc(&kvs_dp_tag, length);
        if (r->desc != NULL)
            memcpy(r->desc, data, length);
        else
            r->len = SIZE_MAX; /* answered as too large */
    } else if (length > 0) {
        r->len = SIZE_MAX;
    }
    kvs_dq_push(&w->queue, r);
    return r->ucx_owned ? UCS_INPROGRESS : UCS_OK;
}

/* ---- replies ---- */

/* Every reply is on its lane's list from allocation until freed: a send
 * still in flight when the lane stops never gets its callback (the UCX
 * worker is destroyed under it), and the list is how it is still freed. */
static kvs_reply_t *kvs_dp_reply_new(kvs_dpw_t *w)
{
    kvs_reply_t *r = cm_calloc(&kvs_dp_tag, 1, sizeof(*r));
    if (r == NULL)
        return NULL;
    r->lane = w;
    r->next = w->replies;
    if (w->replies != NULL)
        w->replies->prev = r;
    w->replies = r;
    return r;
}

static void kvs_dp_reply_free(kvs_reply_t *r)
{
    if (r->prev != NULL)
        r->prev->next = r->next;
    else
        r->lane->replies = r->next;
    if (r->next != NULL)
        r->next->prev = r->prev;
    if (r->staged)
        r->lane->stage_busy = false;
    else
        cm_free(r->meta);
    cm_free(r);
}

static void kvs_dp_reply_done(void *request, ucs_status_t status, void *user_data)
{
    (void)status;
    kvs_dp_reply_free(user_data);
    ucp_request_free(request);
}

/* Send r (header in r->hdr, body r->meta of len bytes) on c; r is freed when
 * UCX is done with it.  Never waits for the peer. */
static void kvs_dp_send(kvs_conn_t *c, kvs_reply_t *r, size_t len)
{
    ucp_request_param_t prm = {0};
    void *sp;

    prm.op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA;
    prm.cb.send = kvs_dp_reply_done;
    prm.user_data = r;
    sp = ucp_am_send_nbx(c->ep, CM_DP_AM_REPLY, r->hdr, CM_WIRE_HDR_SIZE, r->meta, len, &prm);
    if (sp == NULL || UCS_PTR_IS_ERR(sp)) {
        if (UCS_PTR_IS_ERR(sp))
            cm_debug("dp: reply send failed: %s", ucs_status_string(UCS_PTR_STATUS(sp)));
        kvs_dp_reply_free(r);
    }
}

static void kvs_dp_reply_hdr(const cm_wire_hdr_t *req, ri_status_t st, uint32_t meta_len, uint64_t data_len,
                             uint8_t out[CM_WIRE_HDR_SIZE])
{
    cm_wire_hdr_t h = {0};
    h.magic = CM_WIRE_MAGIC;
    h.version = CM_WIRE_VERSION;
    h.op = req->op >= 1 && req->op <= CM_WIRE_OP_MAX ? req->op : CM_WIRE_OP_PING;
    h.flags = CM_WIRE_F_REPLY;
    h.status = st;
    h.session_id = req->session_id;
    h.request_id = req->request_id;
    h.meta_len = meta_len;
    h.data_len = data_len;
    cm_wire_encode(&h, out);
}

/* Send a reply (takes ownership of meta). */
static void kvs_dp_reply(kvs_conn_t *c, const cm_wire_hdr_t *req, ri_status_t st, uint8_t *meta, size_t meta_len)
{
    kvs_reply_t *r;
    if (c->failed || (r = kvs_dp_reply_new(c->lane)) == NULL) {
        cm_free(meta);
        return;
    }
    if (st != RI_OK)
        meta_len = 0;
    kvs_dp_reply_hdr(req, st, (uint32_t)meta_len, 0, r->hdr);
    r->meta = meta;
    kvs_dp_send(c, r, meta_len);
}

/* Send an OK reply to req whose meta is meta (meta_len) and whose data block
 * is the n pieces of iov (data_len bytes).  The bytes are copied first, so
 * the borrowed buffers are the caller's again on return and nothing waits
 * for the peer. */
static ri_status_t kvs_dp_reply_data(kvs_conn_t *c, const cm_wire_hdr_t *req, const uint8_t *meta, size_t meta_len,
                                     const kvs_iov_t *iov, size_t n, uint64_t data_len)
{
    kvs_dpw_t *w = c->lane;
    kvs_reply_t *r;
    size_t total = meta_len + data_len, off;
    uint8_t *buf;

    if (c->failed)
        return RI_ERR_CONN_RESET;
    r = kvs_dp_reply_new(w);
    if (r == NULL)
        return RI_ERR_NOMEM;
    /* Gather meta || misses into one buffer and send it contiguous: UCX 1.13
     * moves a many-piece iov over TCP several times slower than one buffer
     * (measured: ~0.15 vs ~1 GB/s), and the copy costs far less.  The lane's
     * stage is reused while no earlier reply holds it; otherwise the reply
     * gets a buffer of its own, so a slow reader never makes us wait. */
    if (!w->stage_busy && total > w->stage_len) {
        uint8_t *nb = cm_malloc(&kvs_dp_tag, total);
        if (nb != NULL) {
            cm_free(w->stage);
            w->stage = nb;
            w->stage_len = total;
        }
    }
    if (!w->stage_busy && total <= w->stage_len) {
        buf = w->stage;
        w->stage_busy = true;
        r->staged = true;
    } else {
        buf = cm_malloc(&kvs_dp_tag, total);
        if (buf == NULL) {
            kvs_dp_reply_free(r);
            return RI_ERR_NOMEM;
        }
    }
    r->meta = buf;
    memcpy(buf, meta, meta_len);
    off = meta_len;
    for (size_t i = 0; i < n; i++) {
        memcpy(buf + off, iov[i].buf, iov[i].len);
        off += iov[i].len;
    }
    if (off != total) {
        kvs_dp_reply_free(r);
        return RI_ERR_INTERNAL;
    }
    kvs_dp_reply_hdr(req, RI_OK, (uint32_t)meta_len, data_len, r->hdr);
    kvs_dp_send(c, r, total);
    return RI_OK;
}

/* The reply object's handle: the connection and the request it answers. */
typedef struct kvs_dp_answer {
    kvs_conn_t *c;
    const cm_wire_hdr_t *req;
} kvs_dp_answer_t;

static ri_status_t kvs_dp_answer_send(void *handle, ri_status_t st, const uint8_t *meta, size_t meta_len,
                                      const kvs_iov_t *iov, size_t n, uint64_t data_len)
{
    kvs_dp_answer_t *a = handle;

    uint8_t *copy = NULL;

    if (st == RI_OK && data_len != 0)
        return kvs_dp_reply_data(a->c, a->req, meta, meta_len, iov, n, data_len);
    /* Meta only (or an error): a copy the send owns. */
    if (st == RI_OK && meta_len != 0) {
        copy = cm_malloc(&kvs_dp_tag, meta_len);
        if (copy == NULL)
            return RI_ERR_NOMEM;
        memcpy(copy, meta, meta_len);
    }
    kvs_dp_reply(a->c, a->req, st, copy, st == RI_OK ? meta_len : 0);
    return a->c->failed ? RI_ERR_CONN_RESET : RI_OK;
}

static const kvs_reply_ops_t kvs_dp_reply_ops = {.send = kvs_dp_answer_send};

static void kvs_dreq_release(kvs_dpw_t *w, kvs_dreq_t *r)
{
    kvs_conn_t *c;
    if (r->unconnected) {
        w->unconnected--;
    } else if ((c = kvs_dp_conn_of(w, r->peer_key)) != NULL && c->inflight > 0) {
        c->inflight--; /* a soft count: a replaced connection's requests may land on its successor */
    }
    if (r->ucx_owned)
        ucp_am_data_release(w->worker, r->desc);
    else
        cm_free(r->desc);
    cm_free(r->body);
    cm_free(r);
}

/* ---- CONNECT / DISCONNECT ---- */

static void kvs_dp_ep_close(kvs_dpw_t *w, ucp_ep_h ep, bool graceful)
{
    ucp_request_param_t prm = {.op_attr_mask = UCP_OP_ATTR_FIELD_FLAGS,
                               .flags = graceful ? 0 : UCP_EP_CLOSE_FLAG_FORCE};
    void *req;
    uint64_t deadline = cm_time_ns() + 1000000000ull;

    req = ucp_ep_close_nbx(ep, &prm);
    if (req != NULL && !UCS_PTR_IS_ERR(req)) {
        while (ucp_request_check_status(req) == UCS_INPROGRESS && cm_time_ns() < deadline)
            ucp_worker_progress(w->worker);
        if (ucp_request_check_status(req) == UCS_INPROGRESS)
            ucp_request_cancel(w->worker, req);
        ucp_request_free(req);
    }
}

static uint32_t kvs_dp_session_conns(const kvs_dpw_t *w, uint64_t session_id)
{
    uint32_t n = 0;
    for (const kvs_conn_t *c = w->conns; c != NULL; c = c->next)
        n += c->session_id == session_id && !c->failed;
    return n;
}

/* CONNECT (h decoded): check the secret, the lane, the caps and the worker's
 * address, then open our endpoint to it and answer over it.  Nothing is
 * answered when a check fails: answering means opening an endpoint to an
 * address that has not been vetted, for a caller that may not hold the
 * secret.  The worker sees a timeout; the log and the error counters say
 * why. */
static ri_status_t kvs_dp_connect(kvs_dpw_t *w, kvs_dreq_t *r, const cm_wire_hdr_t *h)
{
    kvs_dp_t *dp = w->dp;
    ucp_ep_params_t ep = {0};
    kvs_conn_t *c;
    ucs_status_t s;
    ri_status_t st;

    if (r->peer_key == NULL || r->rndv || r->desc == NULL || h->data_len != 0 || h->meta_len == 0 ||
        h->meta_len > CM_DP_MAX_WORKER_ADDR)
        return RI_ERR_PROTOCOL;
    st = dp->h.precheck(dp->h.arg, h);
    if (st == RI_OK && h->session_id == 0)
        st = RI_ERR_UNAUTHENTICATED; /* a connection belongs to a session */
    if (st != RI_OK)
        return st;
    if (h->session_id % dp->n_lanes != w->index) {
        cm_warn("dp: session %llu connected to lane %u; it is served by lane %u (the address CreateSession gave)",
                (unsigned long long)h->session_id, w->index, (unsigned)(h->session_id % dp->n_lanes));
        return RI_ERR_PROTOCOL;
    }
    if (atomic_load(&dp->n_conns) >= KVS_DP_MAX_CONNS ||
        kvs_dp_session_conns(w, h->session_id) >= KVS_DP_MAX_CONNS_PER_SESSION) {
        cm_warn("dp: session %llu: connection refused, %s holds the most connections allowed (%u per session, "
                "%u in all)", (unsigned long long)h->session_id,
                atomic_load(&dp->n_conns) >= KVS_DP_MAX_CONNS ? "the daemon" : "the session",
                KVS_DP_MAX_CONNS_PER_SESSION, KVS_DP_MAX_CONNS);
        return RI_ERR_QUOTA;
    }
    st = kvs_dp_check_address(r->desc, h->meta_len, dp->net_dev, dp->tls, dp->check_program);
    if (st != RI_OK)
        return st;
    c = cm_calloc(&kvs_dp_tag, 1, sizeof(*c));
    if (c == NULL)
        return RI_ERR_NOMEM;
    c->lane = w;
    c->peer_key = r->peer_key;
    c->session_id = h->session_id;
    ep.field_mask = UCP_EP_PARAM_FIELD_REMOTE_ADDRESS | UCP_EP_PARAM_FIELD_ERR_HANDLER |
                    UCP_EP_PARAM_FIELD_ERR_HANDLING_MODE;
    ep.address = (const ucp_address_t *)r->desc;
    ep.err_mode = UCP_ERR_HANDLING_MODE_PEER;
    ep.err_handler.cb = kvs_dp_ep_error;
    ep.err_handler.arg = c;
    s = ucp_ep_create(w->worker, &ep, &c->ep);
    if (s != UCS_OK) {
        cm_warn("dp: cannot open an endpoint to a worker: %s", ucs_status_string(s));
        cm_free(c);
        return kvs_dp_status(s);
    }
    c->next = w->conns;
    w->conns = c;
    w->n_conns++;
    atomic_fetch_add(&dp->n_conns, 1);
    dp->h.account(dp->h.arg, CM_WIRE_OP_CONNECT, RI_OK, 1);
    dp->h.conn_event(dp->h.arg, c, c->session_id, true); /* the connection holds the session */
    cm_debug("dp: session %llu connected on lane %u (%u connections there)", (unsigned long long)h->session_id,
             w->index, w->n_conns);
    kvs_dp_reply(c, h, RI_OK, NULL, 0);
    return RI_OK;
}

/* DISCONNECT on c: answer, then the connection closes at the next gc turn
 * (its caches are released there, as for a failed one). */
static void kvs_dp_disconnect(kvs_dpw_t *w, kvs_conn_t *c, const cm_wire_hdr_t *h)
{
    kvs_dp_t *dp = w->dp;
    ri_status_t st = h->meta_len == 0 && h->data_len == 0 ? dp->h.precheck(dp->h.arg, h) : RI_ERR_PROTOCOL;
    if (st == RI_OK && h->session_id != c->session_id)
        st = RI_ERR_UNAUTHENTICATED;
    dp->h.account(dp->h.arg, CM_WIRE_OP_DISCONNECT, st, 1);
    kvs_dp_reply(c, h, st, NULL, 0);
    if (st == RI_OK) {
        c->failed = true;
        c->graceful = true;
    }
}

/* ---- serving ---- */

/* Decode r's header; RI_OK or the error to answer (h->request_id is set
 * whenever the bytes hold one). */
static ri_status_t kvs_dp_decode(kvs_dpw_t *w, kvs_dreq_t *r, cm_wire_hdr_t *h)
{
    uint64_t max = w->dp->max_body;
    cm_wire_limits_t lim = {.max_meta_len = (uint32_t)CM_MIN(max, UINT32_MAX), .max_data_len = max};
    ri_status_t st;

    st = r->hdr_len == CM_WIRE_HDR_SIZE ? cm_wire_decode(r->hdr, r->hdr_len, 0, &lim, h)
                                        : (r->hdr_len < CM_WIRE_HDR_SIZE ? RI_ERR_TRUNCATED : RI_ERR_PROTOCOL);
    if (st != RI_OK && r->hdr_len >= 48) /* answer to the caller's id when we can read it */
        h->request_id = cm_dp_get64(r->hdr + 40);
    if (st == RI_OK && (h->flags & CM_WIRE_F_REPLY))
        st = RI_ERR_PROTOCOL;
    if (st == RI_OK && (r->len == SIZE_MAX || (uint64_t)h->meta_len + h->data_len > max))
        st = RI_ERR_TOO_LARGE;
    if (st == RI_OK && (uint64_t)h->meta_len + h->data_len != r->len)
        st = (uint64_t)h->meta_len + h->data_len > r->len ? RI_ERR_TRUNCATED : RI_ERR_PROTOCOL;
    return st;
}

/* Deliver r (header decoded into r->h with status st, body complete) to
 * the serve handler with a reply object for its connection, and free r.  A
 * request that failed before (decode, receive) is answered here. */
static void kvs_dp_finish(kvs_dpw_t *w, kvs_dreq_t *r, ri_status_t st, const uint8_t *body)
{
    kvs_conn_t *c = kvs_dp_conn_of(w, r->peer_key);
    kvs_dp_answer_t a = {.c = c, .req = &r->h};
    kvs_reply_obj_t reply = {.ops = &kvs_dp_reply_ops, .handle = &a, .conn = c};

    if (c == NULL) {
        /* Not connected, or its connection went while the body came in. */
        kvs_dp_count_error(w, RI_ERR_PROTOCOL);
        kvs_dreq_release(w, r);
        return;
    }
    if (st == RI_OK) {
        w->dp->h.serve(w->dp->h.arg, &r->h, body, &reply);
    } else {
        kvs_dp_count_error(w, st);
        cm_debug("dp: %s request %llu: %s", cm_wire_op_name(r->h.op), (unsigned long long)r->h.request_id,
                 ri_status_str(st));
    }
    if (!reply.sent) /* refused above, or a handler that did not answer: the peer still hears */
        (void)kvs_reply_send(&reply, st != RI_OK ? st : RI_ERR_INTERNAL, NULL, 0, NULL, 0, 0);
    kvs_dreq_release(w, r);
}

static void kvs_dp_body_done(void *request, ucs_status_t status, size_t length, void *user_data)
{
    kvs_dreq_t *r = user_data;
    (void)length;
    r->recv_status = status;
    r->recv_req = NULL;
    ucp_request_free(request);
    /* The lane moves it to the ready queue (kvs_dp_collect): callbacks run
     * inside ucp_worker_progress, where we keep to bookkeeping. */
}

/* Start receiving r's rendezvous body in the background. */
static ri_status_t kvs_dp_receive(kvs_dpw_t *w, kvs_dreq_t *r)
{
    ucp_request_param_t prm = {0};
    void *req;

    r->body = cm_malloc(&kvs_dp_tag, r->len);
    if (r->body == NULL)
        return RI_ERR_NOMEM;
    prm.op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA;
    prm.cb.recv_am = kvs_dp_body_done;
    prm.user_data = r;
    r->recv_status = UCS_OK;
    req = ucp_am_recv_data_nbx(w->worker, r->desc, r->body, r->len, &prm);
    r->ucx_owned = false; /* UCX owns the descriptor now */
    r->desc = NULL;
    if (UCS_PTR_IS_ERR(req))
        return kvs_dp_status(UCS_PTR_STATUS(req));
    if (req == NULL) {
        kvs_dq_push(&w->ready, r); /* completed in place */
        return RI_OK;
    }
    r->recv_req = req;
    r->deadline_ns = cm_time_ns() + (uint64_t)w->dp->cfg.drain_timeout_ms * 1000000u;
    kvs_dq_push(&w->receiving, r);
    return RI_OK;
}

static void kvs_dp_close_conn(kvs_dpw_t *w, kvs_conn_t *c);

/* Force-close every connection r's body can arrive on: those whose CONNECT
 * came on r's reply endpoint, and the one whose own endpoint is it (UCX
 * pairs the endpoint we open to a worker with the one the worker's requests
 * arrive on, so that is the usual case).  Failing that endpoint is what ends
 * the receive: UCX completes it with an error, and the lane frees the buffer
 * when it collects it.  Closed at once, not at the next gc turn, which a busy
 * lane may not reach for a while. */
static void kvs_dp_close_conns_of(kvs_dpw_t *w, const kvs_dreq_t *r)
{
    for (kvs_conn_t **pc = &w->conns; *pc != NULL;) {
        kvs_conn_t *c = *pc;
        if (c->peer_key == r->peer_key || (const void *)c->ep == r->peer_key) {
            *pc = c->next; /* off the list first: the close progresses the worker (AM callbacks) */
            c->failed = true;
            c->graceful = false;
            kvs_dp_close_conn(w, c);
        } else {
            pc = &c->next;
        }
    }
}

/* r's body is past its deadline.  First ucp_request_cancel; where that ends
 * the receive (UCX cancels tag receives only, not AM rendezvous ones, up to
 * 1.13 at least) r is answered TIMEOUT.  A receive still going a grace later
 * is ended by force-closing its connection (kvs_dp_close_conns_of): a sender
 * stopped mid-body would otherwise hold the buffer until UCX's keepalive
 * fails it (~20 s over TCP). */
static void kvs_dp_expire(kvs_dpw_t *w, kvs_dreq_t *r, uint64_t now)
{
    if (!r->expired) {
        r->expired = true;
        r->deadline_ns = now + KVS_DP_CANCEL_GRACE_NS;
        ucp_request_cancel(w->worker, r->recv_req);
        return;
    }
    if (!atomic_load(&w->dp->stop))
        cm_warn("dp: session %llu: a %zu-byte body did not arrive within drain-timeout-ms (%u ms); its connection "
                "is closed", (unsigned long long)r->h.session_id, r->len,
                (unsigned)w->dp->cfg.drain_timeout_ms);
    r->deadline_ns = UINT64_MAX; /* once */
    kvs_dp_close_conns_of(w, r);
}

/* Move finished receives to the ready queue; end those past their deadline
 * (kvs_dp_expire; their callback then reports the end). */
static void kvs_dp_collect(kvs_dpw_t *w)
{
    uint64_t now = 0;
    for (kvs_dreq_t *r = w->receiving.head, *next; r != NULL; r = next) {
        next = r->next; /* callbacks only set fields: the list holds still while connections close */
        if (r->recv_req == NULL) {
            kvs_dq_remove(&w->receiving, r);
            kvs_dq_push(&w->ready, r);
        } else if ((now ? now : (now = cm_time_ns())) > r->deadline_ns) {
            kvs_dp_expire(w, r, now);
        }
    }
}

static void kvs_dp_serve_ready(kvs_dpw_t *w, kvs_dreq_t *r)
{
    ri_status_t st = r->recv_status == UCS_OK ? RI_OK : kvs_dp_status(r->recv_status);
    if (r->expired && kvs_dp_conn_of(w, r->peer_key) == NULL) {
        /* its connection was closed (kvs_dp_expire): counted, answered nowhere */
        kvs_dp_count_error(w, RI_ERR_TIMEOUT);
        kvs_dreq_release(w, r);
        return;
    }
    kvs_dp_finish(w, r, r->expired ? RI_ERR_TIMEOUT : st, r->body);
}

static void kvs_dp_serve_new(kvs_dpw_t *w, kvs_dreq_t *r)
{
    kvs_conn_t *c;
    ri_status_t st = kvs_dp_decode(w, r, &r->h);

    if (st == RI_OK && r->h.op == CM_WIRE_OP_CONNECT) {
        st = kvs_dp_connect(w, r, &r->h);
        if (st != RI_OK) {
            kvs_dp_count_error(w, st);
            cm_debug("dp: CONNECT refused: %s", ri_status_str(st));
            /* A connection that already has an accepted CONNECT hears why;
             * a stranger hears nothing (see kvs_dp_connect). */
            c = kvs_dp_conn_of(w, r->peer_key);
            if (c != NULL)
                kvs_dp_reply(c, &r->h, st, NULL, 0);
        }
        kvs_dreq_release(w, r);
        return;
    }
    c = kvs_dp_conn_of(w, r->peer_key);
    if (c != NULL && st == RI_OK && r->h.op == CM_WIRE_OP_DISCONNECT) {
        kvs_dp_disconnect(w, c, &r->h);
        kvs_dreq_release(w, r);
        return;
    }
    /* Authenticate from the header alone before a rendezvous body is pulled
     * in: a wrong secret costs the daemon no allocation and no transfer (the
     * descriptor is released, which declines the data). */
    if (c != NULL && st == RI_OK && r->rndv)
        st = w->dp->h.precheck(w->dp->h.arg, &r->h);
    if (c != NULL && st == RI_OK && r->rndv) {
        st = kvs_dp_receive(w, r);
        if (st == RI_OK)
            return; /* served when the body is in */
    }
    kvs_dp_finish(w, r, st, r->rndv ? NULL : r->desc);
}

static void kvs_dp_close_conn(kvs_dpw_t *w, kvs_conn_t *c)
{
    /* The connection's caches go with it; its session's lease starts
     * running again when this was its last connection. */
    w->dp->h.conn_event(w->dp->h.arg, c, c->session_id, false);
    kvs_dp_ep_close(w, c->ep, c->graceful);
    w->n_conns--;
    atomic_fetch_sub(&w->dp->n_conns, 1);
    cm_free(c);
}

static void kvs_dp_gc(kvs_dpw_t *w)
{
    if (w->dropped_proto != 0 || w->dropped_quota != 0) {
        kvs_dp_t *dp = w->dp;
        cm_warn("dp: lane %u refused %llu message(s) beyond %u queued per connection and %llu from peers with no "
                "connection", w->index, (unsigned long long)w->dropped_quota, KVS_DP_MAX_INFLIGHT,
                (unsigned long long)w->dropped_proto);
        if (w->dropped_quota != 0)
            dp->h.account(dp->h.arg, 0, RI_ERR_QUOTA, w->dropped_quota);
        if (w->dropped_proto != 0)
            dp->h.account(dp->h.arg, 0, RI_ERR_PROTOCOL, w->dropped_proto);
        w->dropped_proto = w->dropped_quota = 0;
    }
    for (kvs_conn_t **pc = &w->conns; *pc != NULL;) {
        kvs_conn_t *c = *pc;
        if (c->failed) {
            /* Requests still queued from it find no connection when served
             * (kvs_dp_conn_of skips failed ones) and are answered nowhere. */
            *pc = c->next;
            kvs_dp_close_conn(w, c);
        } else {
            pc = &c->next;
        }
    }
}

/* Sleep on the event fd until traffic (or a signal from kvs_dp_stop); 100 ms
 * bound for the gc list and the receive deadlines.  When UCX will not arm
 * the fd (work of its own pending), sleep 0.5 ms instead of going back to
 * spinning: over shared memory that pending work is a keepalive it retries
 * into a peer's full FIFO for as long as that peer computes without
 * progressing (each retry reads /proc/PID/stat), and a lane that spun on it
 * took a core at nice -10 from the very worker it waits for
 * (test_kvs_idle_cpu: 85% of a core before, 7% after). */
static void kvs_dp_idle(kvs_dpw_t *w)
{
    struct pollfd pfd = {.fd = w->efd, .events = POLLIN};
    struct timespec wait = {.tv_sec = 0, .tv_nsec = 500000};
    if (w->efd < 0) {
        cm_time_sleep_ns(100000);
        return;
    }
    if (ucp_worker_arm(w->worker) == UCS_OK)
        wait = (struct timespec){.tv_sec = 0, .tv_nsec = 100000000};
    (void)ppoll(&pfd, 1, &wait, NULL);
}

/* Raise (or lower) this thread's priority: on a shared CPU a worker's step
 * waits for this thread to be scheduled (measured at 8K with two spinning
 * processes on two cores: through-kvstore / in-process 0.25 -> 0.58 at
 * batch 1, 0.19 -> 0.37 at batch 4 with nice -10). */
static void kvs_dp_lane_nice(const kvs_dpw_t *w, int nice)
{
    if (nice == 0)
        return;
    if (setpriority(PRIO_PROCESS, (id_t)syscall(SYS_gettid), nice) != 0)
        cm_warn("dp: lane %u: cannot set nice %d (%s): it runs at the process's priority; give the daemon "
                "CAP_SYS_NICE, or --dataplane-nice=0 to silence this", w->index, nice, strerror(errno));
}

/* Whether an idle lane sleeps now.  Polling on after the last message
 * saves the wake-up from the armed worker's event (tens of microseconds),
 * but only where a core is spare: on a host whose cores the worker's step
 * uses (2 cores, docs/results/worker.md "Data-plane lanes"), a lane
 * polling 200 us after each message, at nice -10 ahead of the worker, took
 * up to half a core; steps through the kvstore ran at 0.75 of in-process
 * against 0.85 sleeping at once, and the first step (index build and
 * upload) took 3x as long.  Hence spin_us defaults to 0. */
static bool kvs_dp_should_sleep(const kvs_dp_t *dp, uint64_t idle, uint64_t last_busy)
{
    if (atomic_load(&dp->stop))
        return false;
    if (dp->cfg.spin_us == 0)
        return true;
    return idle > KVS_DP_SPIN && cm_time_ns() - last_busy > (uint64_t)dp->cfg.spin_us * 1000u;
}

void *kvs_dp_lane_main(void *arg)
{
    kvs_dpw_t *w = arg;
    kvs_dp_t *dp = w->dp;
    uint64_t idle = 0, stop_deadline = 0, last_busy = cm_time_ns();

    kvs_dp_lane_nice(w, dp->cfg.nice);

    for (;;) {
        unsigned n = ucp_worker_progress(w->worker);
        kvs_dreq_t *r;
        kvs_dp_collect(w);
        if ((r = kvs_dq_pop(&w->ready)) != NULL)
            kvs_dp_serve_ready(w, r);
        else if ((r = kvs_dq_pop(&w->queue)) != NULL)
            kvs_dp_serve_new(w, r);
        if (r != NULL) {
            idle = 0;
            last_busy = cm_time_ns();
            continue;
        }
        kvs_dp_gc(w);
        if (n != 0 || w->receiving.head != NULL)
            last_busy = cm_time_ns();
        if (atomic_load(&dp->stop)) {
            /* Drain: keep serving what arrives for a short while, bounded. */
            if (stop_deadline == 0)
                stop_deadline = cm_time_ns() + CM_MIN((uint64_t)dp->cfg.drain_timeout_ms, 200u) * 1000000u;
            if (cm_time_ns() > stop_deadline)
                break;
        }
        if (n != 0) {
            idle = 0;
        } else if (kvs_dp_should_sleep(dp, ++idle, last_busy)) {
            /* idle stays over the mark: after a sleep that brought nothing
             * the next empty turn sleeps again instead of spinning anew */
            kvs_dp_idle(w);
        }
    }
    return NULL;
}

void kvs_dp_lane_drain(kvs_dpw_t *w)
{
    kvs_dreq_t *r;
    uint64_t deadline = cm_time_ns() + 1000000000ull;

    /* Receives in flight own a request: end them now (kvs_dp_expire: a
     * cancel, then their connection closed) and let their callbacks run
     * (bounded) before anything is freed. */
    for (r = w->receiving.head; r != NULL; r = r->next)
        r->deadline_ns = 0;
    while (w->receiving.head != NULL && cm_time_ns() < deadline) {
        ucp_worker_progress(w->worker);
        kvs_dp_collect(w);
    }
    while ((r = kvs_dq_pop(&w->ready)) != NULL || (r = kvs_dq_pop(&w->queue)) != NULL)
        kvs_dreq_release(w, r);
    kvs_dp_gc(w);
    while (w->conns != NULL) {
        kvs_conn_t *c = w->conns;
        w->conns = c->next;
        kvs_dp_close_conn(w, c);
    }
}

void kvs_dp_lane_free_replies(kvs_dpw_t *w)
{
    while (w->replies != NULL)
        kvs_dp_reply_free(w->replies);
    w->stage_busy = false;
}


