/*
 * The UCX data plane of ri-kvstore: one ucp context (AM + RMA) and worker,
 * and one thread that progresses the worker and serves requests in arrival
 * order.  There is no listener: workers learn the worker's packed address
 * from CreateSession over the authenticated control API and connect to it,
 * and the first request of a connection, CONNECT, carries the session secret
 * and the worker's own address.  Only then does the server open an endpoint
 * of its own to that address (after ri-kvstore-addrcheck survived unpacking
 * it, kvs_dp_check.c), which answers every request of the connection and
 * reports the peer's failure.  Requests are tied to their connection by the
 * UCX reply endpoint they arrive on, used as a key only: UCX 1.13 crashes
 * when a reply endpoint of a peer that went away is sent on.
 * AM callbacks only queue a request (the
 * 64-byte wire header copied, the body kept as a UCX descriptor); the thread
 * decodes it, fetches a rendezvous body, calls kvs_ops_serve and sends the
 * reply.  Misses of a fetch go to the worker with ucp_put into the receive
 * buffer it registered (its rkey), then an ep flush, then the reply, so the
 * worker may read the bytes as soon as it sees the reply.
 * Idle policy: spin while there is traffic, then sleep on the worker's event
 * fd (ucp_worker_arm + poll) so that an idle daemon costs no CPU.
 */
#include "kvstore/data/kvs_internal.h"

#include <arpa/inet.h>
#include <ifaddrs.h>
#include <net/if.h>
#include <stdbool.h>
#include <stdlib.h>
#include <poll.h>
#include <stdio.h>
#include <string.h>
#include <ucp/api/ucp.h>

#include "common/cm_alloc.h"
#include "common/cm_dp_proto.h"
#include "common/cm_log.h"
#include "common/cm_net.h"
#include "common/cm_status.h"
#include "common/cm_time.h"
#include "kvstore/data/kvs_dp_check.h"

static CM_ALLOC_TAG(kvs_dp_tag, "kvs.dp");
static pthread_once_t kvs_dp_env_done = PTHREAD_ONCE_INIT;

#define KVS_DP_RKEY_PAD 4096u
#define KVS_DP_SPIN 2000u       /* empty progress calls before sleeping */
#define KVS_DP_SPIN_NS 200000u  /* and this much idle time */
#define KVS_DP_MAX_CONNS 1024u          /* connections of the daemon */
#define KVS_DP_MAX_CONNS_PER_SESSION 16u /* connections of one session */

typedef struct kvs_conn {
    ucp_ep_h ep;              /* our endpoint to the worker's address */
    const void *peer_key;     /* the UCX reply ep its requests arrive on; compared, never used */
    uint64_t session_id;      /* the session its CONNECT named */
    kvs_dp_t *dp;             /* owner */
    bool failed;              /* error handler fired or DISCONNECT; close at the next turn */
    bool graceful;            /* DISCONNECT: flush the reply out before the close */
    uint64_t puts;            /* puts issued since the last flush */
    struct kvs_conn *next;
} kvs_conn_t;

typedef struct kvs_dreq {
    const void *peer_key;             /* the UCX connection it came on (see kvs_conn_t) */
    kvs_conn_t *conn;                 /* where to reply; resolved by the data thread */
    uint8_t hdr[CM_WIRE_HDR_SIZE];    /* the header bytes (first 64) */
    size_t hdr_len;                   /* header length as received */
    void *desc;                       /* UCX data (persistent or rndv) or our copy */
    size_t len;                       /* body length */
    bool rndv, ucx_owned;             /* kind of desc */
    struct kvs_dreq *next;
} kvs_dreq_t;

typedef struct kvs_reply {
    uint8_t hdr[CM_WIRE_HDR_SIZE];
    uint8_t *meta;                    /* cm_malloc'd */
} kvs_reply_t;

struct kvs_dp {
    kvs_data_t *data;
    ucp_context_h ctx;
    ucp_worker_h worker;
    ucp_mem_h pool_memh;
    char address[CM_DP_ADDR_MAX];     /* the worker's packed address, as text */
    char net_dev[IF_NAMESIZE + 1];    /* UCX network device we restrict to ("" = all) */
    uint32_t n_conns;
    pthread_t thread;
    bool thread_started;
    atomic_bool stop;
    kvs_conn_t *conns;
    kvs_dreq_t *q_head, *q_tail;
    pthread_mutex_t gc_lock;          /* guards gc_rkeys (other threads add) */
    ucp_rkey_h *gc_rkeys;
    size_t n_gc, cap_gc;
    uint64_t max_body;
    int efd;                          /* worker event fd, -1 when none */
    uint8_t *stage;                   /* inline replies are gathered here */
    size_t stage_len;
};

static ri_status_t kvs_dp_status(ucs_status_t s)
{
    switch (s) {
    case UCS_OK: return RI_OK;
    case UCS_ERR_NO_MEMORY: return RI_ERR_NOMEM;
    case UCS_ERR_TIMED_OUT: return RI_ERR_TIMEOUT;
    case UCS_ERR_UNREACHABLE: return RI_ERR_UNREACHABLE;
    case UCS_ERR_CONNECTION_RESET:
    case UCS_ERR_ENDPOINT_TIMEOUT: return RI_ERR_CONN_RESET;
    case UCS_ERR_CANCELED: return RI_ERR_CANCELLED;
    default: return RI_ERR_TRANSPORT;
    }
}

static void kvs_dp_ep_error(void *arg, ucp_ep_h ep, ucs_status_t status)
{
    kvs_conn_t *c = arg;
    (void)ep;
    cm_debug("dp: connection error: %s", ucs_status_string(status));
    c->failed = true;
}

/* The newest live connection whose CONNECT came on peer_key (a worker that
 * connects again on the same UCX connection replaces its older one). */
static kvs_conn_t *kvs_dp_conn_of(kvs_dp_t *dp, const void *peer_key)
{
    for (kvs_conn_t *c = dp->conns; c != NULL; c = c->next)
        if (c->peer_key == peer_key && !c->failed)
            return c;
    return NULL;
}

static ucs_status_t kvs_dp_am_cb(void *arg, const void *header, size_t header_length, void *data, size_t length,
                                 const ucp_am_recv_param_t *param)
{
    kvs_dp_t *dp = arg;
    kvs_dreq_t *r;

    if (!(param->recv_attr & UCP_AM_RECV_ATTR_FIELD_REPLY_EP)) {
        /* Sent without UCP_AM_SEND_FLAG_REPLY: we could never tie it to a
         * connection.  Count it and drop it (rndv data is declined). */
        pthread_mutex_lock(&dp->data->lock);
        kvs_count_error_locked(dp->data, RI_ERR_PROTOCOL);
        pthread_mutex_unlock(&dp->data->lock);
        return UCS_OK;
    }
    r = cm_calloc(&kvs_dp_tag, 1, sizeof(*r));
    if (r == NULL)
        return UCS_OK;
    r->peer_key = param->reply_ep;
    r->hdr_len = header_length;
    memcpy(r->hdr, header, CM_MIN(header_length, (size_t)CM_WIRE_HDR_SIZE));
    r->len = length;
    if (param->recv_attr & (UCP_AM_RECV_ATTR_FLAG_RNDV | UCP_AM_RECV_ATTR_FLAG_DATA)) {
        r->desc = data;
        r->rndv = (param->recv_attr & UCP_AM_RECV_ATTR_FLAG_RNDV) != 0;
        r->ucx_owned = true;
    } else if (length > 0 && length <= dp->max_body) {
        r->desc = cm_malloc(&kvs_dp_tag, length);
        if (r->desc != NULL)
            memcpy(r->desc, data, length);
        else
            r->len = SIZE_MAX; /* answered as too large */
    } else if (length > 0) {
        r->len = SIZE_MAX;
    }
    if (dp->q_tail)
        dp->q_tail->next = r;
    else
        dp->q_head = r;
    dp->q_tail = r;
    return r->ucx_owned ? UCS_INPROGRESS : UCS_OK;
}

/* Progress until req completes (or the connection fails / time runs out). */
static ri_status_t kvs_dp_wait(kvs_dp_t *dp, void *req, kvs_conn_t *c)
{
    uint64_t deadline = cm_time_ns() + (uint64_t)dp->data->cfg.drain_timeout_ms * 1000000u;
    ucs_status_t s;

    if (req == NULL)
        return RI_OK;
    if (UCS_PTR_IS_ERR(req))
        return kvs_dp_status(UCS_PTR_STATUS(req));
    while ((s = ucp_request_check_status(req)) == UCS_INPROGRESS) {
        ucp_worker_progress(dp->worker);
        if ((c != NULL && c->failed) || cm_time_ns() > deadline) {
            ucp_request_cancel(dp->worker, req);
            while (ucp_request_check_status(req) == UCS_INPROGRESS)
                ucp_worker_progress(dp->worker);
            ucp_request_free(req);
            return c != NULL && c->failed ? RI_ERR_CONN_RESET : RI_ERR_TIMEOUT;
        }
    }
    ucp_request_free(req);
    return kvs_dp_status(s);
}

static void kvs_dp_reply_done(void *request, ucs_status_t status, void *user_data)
{
    kvs_reply_t *r = user_data;
    (void)status;
    cm_free(r->meta);
    cm_free(r);
    ucp_request_free(request);
}

/* Send a reply (takes ownership of meta). */
static void kvs_dp_reply(kvs_dp_t *dp, kvs_conn_t *c, const cm_wire_hdr_t *req, ri_status_t st, uint8_t *meta,
                         size_t meta_len)
{
    cm_wire_hdr_t h = {0};
    kvs_reply_t *r;
    ucp_request_param_t prm = {0};
    void *sp;

    (void)dp;
    r = cm_malloc(&kvs_dp_tag, sizeof(*r));
    if (r == NULL || c->failed) {
        cm_free(r);
        cm_free(meta);
        return;
    }
    h.magic = CM_WIRE_MAGIC;
    h.version = CM_WIRE_VERSION;
    h.op = req->op >= 1 && req->op <= CM_WIRE_OP_MAX ? req->op : CM_WIRE_OP_PING;
    h.flags = CM_WIRE_F_REPLY;
    h.status = st;
    h.session_id = req->session_id;
    h.request_id = req->request_id;
    h.meta_len = st == RI_OK ? (uint32_t)meta_len : 0;
    cm_wire_encode(&h, r->hdr);
    r->meta = meta;
    prm.op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA;
    prm.cb.send = kvs_dp_reply_done;
    prm.user_data = r;
    sp = ucp_am_send_nbx(c->ep, CM_DP_AM_REPLY, r->hdr, CM_WIRE_HDR_SIZE, meta, h.meta_len, &prm);
    if (sp == NULL || UCS_PTR_IS_ERR(sp)) {
        if (UCS_PTR_IS_ERR(sp))
            cm_debug("dp: reply send failed: %s", ucs_status_string(UCS_PTR_STATUS(sp)));
        cm_free(r->meta);
        cm_free(r);
    }
}

ri_status_t kvs_dp_reply_data(kvs_dp_t *dp, void *conn, const cm_wire_hdr_t *req, const uint8_t *meta,
                              size_t meta_len, const kvs_iov_t *iov, size_t n, uint64_t data_len)
{
    kvs_conn_t *c = conn;
    cm_wire_hdr_t h = {0};
    uint8_t hdr[CM_WIRE_HDR_SIZE];
    ucp_request_param_t prm = {0};
    size_t total, off;
    ri_status_t st;

    if (c->failed)
        return RI_ERR_CONN_RESET;
    /* Gather meta || misses into one staging buffer and send it contiguous:
     * UCX 1.13 moves a many-piece iov over TCP several times slower than one
     * buffer (measured: ~0.15 vs ~1 GB/s), and the copy costs far less. */
    total = meta_len + data_len;
    if (total > dp->stage_len) {
        uint8_t *nb = cm_malloc(&kvs_dp_tag, total);
        if (nb == NULL)
            return RI_ERR_NOMEM;
        cm_free(dp->stage);
        dp->stage = nb;
        dp->stage_len = total;
    }
    memcpy(dp->stage, meta, meta_len);
    off = meta_len;
    for (size_t i = 0; i < n; i++) {
        memcpy(dp->stage + off, iov[i].buf, iov[i].len);
        off += iov[i].len;
    }
    if (off != total)
        return RI_ERR_INTERNAL;
    h.magic = CM_WIRE_MAGIC;
    h.version = CM_WIRE_VERSION;
    h.op = req->op;
    h.flags = CM_WIRE_F_REPLY;
    h.session_id = req->session_id;
    h.request_id = req->request_id;
    h.meta_len = (uint32_t)meta_len;
    h.data_len = data_len;
    cm_wire_encode(&h, hdr);
    st = kvs_dp_wait(dp, ucp_am_send_nbx(c->ep, CM_DP_AM_REPLY, hdr, sizeof(hdr), dp->stage, total, &prm), c);
    return st;
}

static void kvs_dreq_release(kvs_dp_t *dp, kvs_dreq_t *r)
{
    if (r->ucx_owned)
        ucp_am_data_release(dp->worker, r->desc);
    else
        cm_free(r->desc);
    cm_free(r);
}

static void kvs_dp_ep_close(kvs_dp_t *dp, ucp_ep_h ep, bool graceful)
{
    ucp_request_param_t prm = {.op_attr_mask = UCP_OP_ATTR_FIELD_FLAGS,
                               .flags = graceful ? 0 : UCP_EP_CLOSE_FLAG_FORCE};
    void *req;
    uint64_t deadline = cm_time_ns() + 1000000000ull;

    req = ucp_ep_close_nbx(ep, &prm);
    if (req != NULL && !UCS_PTR_IS_ERR(req)) {
        while (ucp_request_check_status(req) == UCS_INPROGRESS && cm_time_ns() < deadline)
            ucp_worker_progress(dp->worker);
        ucp_request_free(req);
    }
}

static uint32_t kvs_dp_session_conns(const kvs_dp_t *dp, uint64_t session_id)
{
    uint32_t n = 0;
    for (const kvs_conn_t *c = dp->conns; c != NULL; c = c->next)
        n += c->session_id == session_id && !c->failed;
    return n;
}

/* CONNECT (h decoded): check the secret, the caps and the worker's address,
 * then open our endpoint to it and answer over it.  Nothing is answered when
 * any check fails: answering means opening an endpoint to an address that has
 * not been vetted, for a caller that has not proved it holds the secret.  The
 * worker sees a timeout; the log and the error counters say why. */
static ri_status_t kvs_dp_connect(kvs_dp_t *dp, kvs_dreq_t *r, const cm_wire_hdr_t *h)
{
    ucp_ep_params_t ep = {0};
    kvs_conn_t *c;
    ucs_status_t s;
    ri_status_t st;

    if (r->rndv || r->desc == NULL || h->data_len != 0 || h->meta_len == 0 ||
        h->meta_len > CM_DP_MAX_WORKER_ADDR)
        return RI_ERR_PROTOCOL;
    st = kvs_ops_precheck(dp->data, h);
    if (st == RI_OK && h->session_id == 0)
        st = RI_ERR_UNAUTHENTICATED; /* a connection belongs to a session */
    if (st != RI_OK)
        return st;
    if (dp->n_conns >= KVS_DP_MAX_CONNS || kvs_dp_session_conns(dp, h->session_id) >= KVS_DP_MAX_CONNS_PER_SESSION) {
        cm_warn("dp: session %llu: connection refused, %s holds the most connections allowed (%u per session, "
                "%u in all)", (unsigned long long)h->session_id,
                dp->n_conns >= KVS_DP_MAX_CONNS ? "the daemon" : "the session", KVS_DP_MAX_CONNS_PER_SESSION,
                KVS_DP_MAX_CONNS);
        return RI_ERR_QUOTA;
    }
    st = kvs_dp_check_address(r->desc, h->meta_len, dp->net_dev);
    if (st != RI_OK)
        return st;
    c = cm_calloc(&kvs_dp_tag, 1, sizeof(*c));
    if (c == NULL)
        return RI_ERR_NOMEM;
    c->dp = dp;
    c->peer_key = r->peer_key;
    c->session_id = h->session_id;
    ep.field_mask = UCP_EP_PARAM_FIELD_REMOTE_ADDRESS | UCP_EP_PARAM_FIELD_ERR_HANDLER |
                    UCP_EP_PARAM_FIELD_ERR_HANDLING_MODE;
    ep.address = (const ucp_address_t *)r->desc;
    ep.err_mode = UCP_ERR_HANDLING_MODE_PEER;
    ep.err_handler.cb = kvs_dp_ep_error;
    ep.err_handler.arg = c;
    s = ucp_ep_create(dp->worker, &ep, &c->ep);
    if (s != UCS_OK) {
        cm_warn("dp: cannot open an endpoint to a worker: %s", ucs_status_string(s));
        cm_free(c);
        return kvs_dp_status(s);
    }
    c->next = dp->conns;
    dp->conns = c;
    dp->n_conns++;
    pthread_mutex_lock(&dp->data->lock);
    dp->data->ops[CM_WIRE_OP_CONNECT]++;
    pthread_mutex_unlock(&dp->data->lock);
    cm_debug("dp: session %llu connected (%u connections)", (unsigned long long)h->session_id, dp->n_conns);
    kvs_dp_reply(dp, c, h, RI_OK, NULL, 0);
    return RI_OK;
}

/* DISCONNECT on r->conn: answer, then the connection closes at the next gc
 * turn (its caches are released there, as for a failed one). */
static void kvs_dp_disconnect(kvs_dp_t *dp, kvs_dreq_t *r, const cm_wire_hdr_t *h)
{
    ri_status_t st = h->meta_len == 0 && h->data_len == 0 ? kvs_ops_precheck(dp->data, h) : RI_ERR_PROTOCOL;
    if (st == RI_OK && h->session_id != r->conn->session_id)
        st = RI_ERR_UNAUTHENTICATED;
    pthread_mutex_lock(&dp->data->lock);
    dp->data->ops[CM_WIRE_OP_DISCONNECT]++;
    if (st != RI_OK)
        kvs_count_error_locked(dp->data, st);
    pthread_mutex_unlock(&dp->data->lock);
    kvs_dp_reply(dp, r->conn, h, st, NULL, 0);
    if (st == RI_OK) {
        r->conn->failed = true;
        r->conn->graceful = true;
    }
    kvs_dreq_release(dp, r);
}

/* Decode r's header; RI_OK or the error to answer (h->request_id is set
 * whenever the bytes hold one). */
static ri_status_t kvs_dp_decode(kvs_dp_t *dp, kvs_dreq_t *r, cm_wire_hdr_t *h)
{
    cm_wire_limits_t lim = {.max_meta_len = (uint32_t)CM_MIN(dp->max_body, UINT32_MAX), .max_data_len = dp->max_body};
    ri_status_t st;

    st = r->hdr_len == CM_WIRE_HDR_SIZE ? cm_wire_decode(r->hdr, r->hdr_len, 0, &lim, h)
                                        : (r->hdr_len < CM_WIRE_HDR_SIZE ? RI_ERR_TRUNCATED : RI_ERR_PROTOCOL);
    if (st != RI_OK && r->hdr_len >= 48) /* answer to the caller's id when we can read it */
        h->request_id = cm_dp_get64(r->hdr + 40);
    if (st == RI_OK && (h->flags & CM_WIRE_F_REPLY))
        st = RI_ERR_PROTOCOL;
    if (st == RI_OK && (r->len == SIZE_MAX || (uint64_t)h->meta_len + h->data_len > dp->max_body))
        st = RI_ERR_TOO_LARGE;
    if (st == RI_OK && (uint64_t)h->meta_len + h->data_len != r->len)
        st = (uint64_t)h->meta_len + h->data_len > r->len ? RI_ERR_TRUNCATED : RI_ERR_PROTOCOL;
    return st;
}

static void kvs_dp_count_error(kvs_dp_t *dp, ri_status_t st)
{
    pthread_mutex_lock(&dp->data->lock);
    kvs_count_error_locked(dp->data, st);
    pthread_mutex_unlock(&dp->data->lock);
}

static void kvs_dp_serve_one(kvs_dp_t *dp, kvs_dreq_t *r)
{
    kvs_data_t *data = dp->data;
    cm_wire_hdr_t h = {0};
    uint8_t *body = NULL, *reply = NULL;
    size_t reply_len = 0;
    bool replied = false;
    ri_status_t st;

    st = kvs_dp_decode(dp, r, &h);
    if (st == RI_OK && h.op == CM_WIRE_OP_CONNECT) {
        st = kvs_dp_connect(dp, r, &h);
        if (st != RI_OK) {
            kvs_conn_t *c = kvs_dp_conn_of(dp, r->peer_key);
            kvs_dp_count_error(dp, st);
            cm_debug("dp: CONNECT refused: %s", ri_status_str(st));
            /* A connection that already has an accepted CONNECT hears why;
             * a stranger hears nothing (see kvs_dp_connect). */
            if (c != NULL)
                kvs_dp_reply(dp, c, &h, st, NULL, 0);
        }
        kvs_dreq_release(dp, r);
        return;
    }
    r->conn = kvs_dp_conn_of(dp, r->peer_key);
    if (r->conn == NULL) {
        /* Not connected (or its connection failed): nobody to answer. */
        kvs_dp_count_error(dp, RI_ERR_PROTOCOL);
        kvs_dreq_release(dp, r);
        return;
    }
    if (st == RI_OK && h.op == CM_WIRE_OP_DISCONNECT) {
        kvs_dp_disconnect(dp, r, &h);
        return;
    }
    /* Authenticate from the header alone before a rendezvous body is pulled
     * in: a wrong secret costs the daemon no allocation and no transfer (the
     * descriptor is released, which declines the data). */
    if (st == RI_OK && r->rndv)
        st = kvs_ops_precheck(data, &h);
    if (st == RI_OK && r->rndv) {
        ucp_request_param_t prm = {0};
        void *req;
        body = cm_malloc(&kvs_dp_tag, r->len);
        if (body == NULL) {
            st = RI_ERR_NOMEM;
        } else {
            req = ucp_am_recv_data_nbx(dp->worker, r->desc, body, r->len, &prm);
            r->ucx_owned = false; /* UCX owns the descriptor now */
            r->desc = NULL;
            st = kvs_dp_wait(dp, req, r->conn);
        }
    } else if (st == RI_OK) {
        body = r->desc;
    }
    if (st == RI_OK)
        st = kvs_ops_serve(data, r->conn, &h, body, &reply, &reply_len, &replied);
    if (st != RI_OK) {
        kvs_dp_count_error(dp, st);
        cm_debug("dp: %s request %llu: %s", cm_wire_op_name(h.op), (unsigned long long)h.request_id,
                 ri_status_str(st));
        cm_free(reply);
        reply = NULL;
        reply_len = 0;
    }
    if (!replied)
        kvs_dp_reply(dp, r->conn, &h, st, reply, reply_len);
    else
        cm_free(reply);
    if (r->rndv)
        cm_free(body);
    kvs_dreq_release(dp, r);
}

static void kvs_dp_close_conn(kvs_dp_t *dp, kvs_conn_t *c)
{
    /* Caches (and their rkeys) go before the ep they were unpacked on. */
    kvs_ops_conn_closed(dp->data, c);
    kvs_dp_ep_close(dp, c->ep, c->graceful);
    dp->n_conns--;
    cm_free(c);
}

static void kvs_dp_gc(kvs_dp_t *dp)
{
    pthread_mutex_lock(&dp->gc_lock);
    for (size_t i = 0; i < dp->n_gc; i++)
        ucp_rkey_destroy(dp->gc_rkeys[i]);
    dp->n_gc = 0;
    pthread_mutex_unlock(&dp->gc_lock);
    for (kvs_conn_t **pc = &dp->conns; *pc != NULL;) {
        kvs_conn_t *c = *pc;
        if (c->failed) {
            /* Requests still queued from it find no connection when served
             * (kvs_dp_conn_of skips failed ones) and are answered nowhere. */
            *pc = c->next;
            kvs_dp_close_conn(dp, c);
        } else {
            pc = &c->next;
        }
    }
}

static void *kvs_dp_main(void *arg)
{
    kvs_dp_t *dp = arg;
    uint64_t idle = 0, stop_deadline = 0, last_busy = cm_time_ns();

    for (;;) {
        unsigned n = ucp_worker_progress(dp->worker);
        kvs_dreq_t *r = dp->q_head;
        if (r != NULL) {
            dp->q_head = r->next;
            if (dp->q_head == NULL)
                dp->q_tail = NULL;
            kvs_dp_serve_one(dp, r);
            idle = 0;
            last_busy = cm_time_ns();
            continue;
        }
        kvs_dp_gc(dp);
        if (n != 0)
            last_busy = cm_time_ns();
        if (atomic_load(&dp->stop)) {
            /* Drain: keep serving what arrives for a short while, bounded. */
            if (stop_deadline == 0)
                stop_deadline = cm_time_ns() + CM_MIN((uint64_t)dp->data->cfg.drain_timeout_ms, 200u) * 1000000u;
            if (cm_time_ns() > stop_deadline)
                break;
        }
        if (n != 0) {
            idle = 0;
        } else if (++idle > KVS_DP_SPIN && cm_time_ns() - last_busy > KVS_DP_SPIN_NS && dp->efd >= 0 &&
                   !atomic_load(&dp->stop)) {
            /* Idle: sleep on the worker's event fd until traffic (or a
             * signal from kvs_dp_stop); 100 ms bound for the gc list. */
            if (ucp_worker_arm(dp->worker) == UCS_OK) {
                struct pollfd pfd = {.fd = dp->efd, .events = POLLIN};
                (void)poll(&pfd, 1, 100);
            }
            idle = 0;
        } else if (idle > KVS_DP_SPIN && dp->efd < 0) {
            cm_time_sleep_ns(100000);
        }
    }
    return NULL;
}

/* UCX 1.13 leaves its shared-memory transports out of endpoints that ask
 * for peer-failure handling unless their ERROR_HANDLING is on; we want both
 * (shared-memory speed, and errors instead of hangs when the peer dies).
 * ucp_config_modify does not reach transport settings in 1.13, so this sets
 * the environment, once per process, before UCX reads it; a value the user
 * set wins.  (setenv is not safe against concurrent getenv: the daemon calls
 * kvs_data_create before it starts serving threads.) */
static void kvs_dp_env_once(void)
{
    setenv("UCX_POSIX_ERROR_HANDLING", "y", 0);
    setenv("UCX_SYSV_ERROR_HANDLING", "y", 0);
}

/* Same address?  (IPv4 or IPv6, port ignored.) */
static bool kvs_dp_same_ip(const struct sockaddr *a, const struct sockaddr_storage *b)
{
    if (a == NULL || a->sa_family != b->ss_family)
        return false;
    if (a->sa_family == AF_INET)
        return ((const struct sockaddr_in *)a)->sin_addr.s_addr == ((const struct sockaddr_in *)b)->sin_addr.s_addr;
    if (a->sa_family == AF_INET6)
        return memcmp(&((const struct sockaddr_in6 *)a)->sin6_addr, &((const struct sockaddr_in6 *)b)->sin6_addr,
                      sizeof(struct in6_addr)) == 0;
    return false;
}

/* Keep UCX's own network interfaces (its TCP transport listens on every
 * device it uses) on the interface of the configured data-plane address:
 * listening on 127.0.0.1 must not open a port on the external interface.  A
 * wildcard address, or UCX_NET_DEVICES set by the user, leaves UCX's choice. */
static void kvs_dp_config_devices(kvs_dp_t *dp, ucp_config_t *config, const struct sockaddr_storage *ss,
                                  const char *host)
{
    struct ifaddrs *ifs = NULL;
    char dev[IF_NAMESIZE + 1] = "";
    if (getenv("UCX_NET_DEVICES") != NULL || cm_net_host_is_wildcard(host) || getifaddrs(&ifs) != 0)
        return;
    for (struct ifaddrs *i = ifs; i != NULL && dev[0] == '\0'; i = i->ifa_next)
        if (kvs_dp_same_ip(i->ifa_addr, ss))
            snprintf(dev, sizeof(dev), "%s", i->ifa_name);
    freeifaddrs(ifs);
    if (dev[0] == '\0') {
        cm_warn("dp: no interface has address %s; UCX picks its network devices", host);
        return;
    }
    if (ucp_config_modify(config, "NET_DEVICES", dev) != UCS_OK) {
        cm_warn("dp: could not restrict UCX to interface %s", dev);
    } else {
        cm_info("dp: UCX network devices restricted to %s (the interface of %s)", dev, host);
        snprintf(dp->net_dev, sizeof(dp->net_dev), "%s", dev);
    }
}

/* The port of dp_listen_addr, when it names one, is where UCX's TCP
 * transport listens (a firewall can then name it); 0 leaves it to UCX.  A
 * transport setting: only the environment reaches it in UCX 1.13, and a value
 * the user set wins. */
static void kvs_dp_config_port(unsigned port)
{
    char range[32];
    if (port == 0 || getenv("UCX_TCP_PORT_RANGE") != NULL)
        return;
    snprintf(range, sizeof(range), "%u-%u", port, port);
    setenv("UCX_TCP_PORT_RANGE", range, 0);
}

/* Our address in text form (dp->address). */
static ri_status_t kvs_dp_publish_address(kvs_dp_t *dp)
{
    ucp_address_t *a = NULL;
    size_t len = 0;
    ri_status_t st;
    ucs_status_t s = ucp_worker_get_address(dp->worker, &a, &len);
    if (s != UCS_OK)
        return kvs_dp_status(s);
    st = cm_dp_addr_format(a, len, dp->address, sizeof(dp->address));
    if (st != RI_OK)
        cm_error("dp: the UCX worker address takes %zu bytes, more than the %u a worker accepts", len,
                 CM_DP_MAX_WORKER_ADDR);
    ucp_worker_release_address(dp->worker, a);
    return st;
}

ri_status_t kvs_dp_start(kvs_data_t *data, kvs_dp_t **dp_p)
{
    kvs_dp_t *dp;
    ucp_config_t *config = NULL;
    ucp_params_t params = {0};
    ucp_worker_params_t wp = {0};
    ucp_am_handler_param_t ah = {0};
    ucp_mem_map_params_t mp = {0};
    struct sockaddr_storage ss;
    socklen_t sl;
    char host[128];
    unsigned port = 0;
    ucs_status_t s;
    ri_status_t st;

    dp = cm_calloc(&kvs_dp_tag, 1, sizeof(*dp));
    if (dp == NULL)
        return RI_ERR_NOMEM;
    dp->data = data;
    dp->max_body = data->cfg.max_msg_bytes;
    pthread_mutex_init(&dp->gc_lock, NULL);
    atomic_init(&dp->stop, false);
    st = cm_net_resolve(data->cfg.dp_listen_addr, true, &ss, &sl, host, sizeof(host));
    if (st != RI_OK) {
        st = RI_ERR_INVALID;
        cm_error("dp: bad listen address '%s'", data->cfg.dp_listen_addr);
        goto err_free;
    }
    if (!cm_net_split(data->cfg.dp_listen_addr, host, sizeof(host), &port))
        port = 0;
    pthread_once(&kvs_dp_env_done, kvs_dp_env_once);
    kvs_dp_config_port(port);
    s = ucp_config_read(NULL, NULL, &config);
    if (s != UCS_OK)
        goto err_ucx;
    kvs_dp_config_devices(dp, config, &ss, host);
    params.field_mask = UCP_PARAM_FIELD_FEATURES | UCP_PARAM_FIELD_NAME;
    params.features = UCP_FEATURE_AM | UCP_FEATURE_RMA | UCP_FEATURE_WAKEUP;
    params.name = "ri-kvstore";
    s = ucp_init(&params, config, &dp->ctx);
    ucp_config_release(config);
    if (s != UCS_OK)
        goto err_ucx;
    wp.field_mask = UCP_WORKER_PARAM_FIELD_THREAD_MODE;
    wp.thread_mode = UCS_THREAD_MODE_SINGLE;
    s = ucp_worker_create(dp->ctx, &wp, &dp->worker);
    if (s != UCS_OK)
        goto err_cleanup_ctx;
    if (ucp_worker_get_efd(dp->worker, &dp->efd) != UCS_OK) {
        cm_warn("dp: no UCX event fd; idle loop sleeps in 100 us steps");
        dp->efd = -1;
    }
    ah.field_mask = UCP_AM_HANDLER_PARAM_FIELD_ID | UCP_AM_HANDLER_PARAM_FIELD_CB | UCP_AM_HANDLER_PARAM_FIELD_ARG |
                    UCP_AM_HANDLER_PARAM_FIELD_FLAGS;
    ah.id = CM_DP_AM_REQUEST;
    ah.cb = kvs_dp_am_cb;
    ah.arg = dp;
    ah.flags = UCP_AM_FLAG_PERSISTENT_DATA;
    s = ucp_worker_set_am_recv_handler(dp->worker, &ah);
    if (s != UCS_OK)
        goto err_destroy_worker;
    /* Register the pool once; puts from it then need no per-op registration. */
    mp.field_mask = UCP_MEM_MAP_PARAM_FIELD_ADDRESS | UCP_MEM_MAP_PARAM_FIELD_LENGTH;
    mp.address = kvs_pool_base(data->pool);
    mp.length = kvs_pool_size(data->pool);
    s = ucp_mem_map(dp->ctx, &mp, &dp->pool_memh);
    if (s != UCS_OK)
        goto err_destroy_worker;
    st = kvs_dp_publish_address(dp);
    if (st != RI_OK)
        goto err_unmap_st;
    if (pthread_create(&dp->thread, NULL, kvs_dp_main, dp) != 0) {
        st = RI_ERR_NOMEM;
        goto err_unmap_st;
    }
    dp->thread_started = true;
    cm_info("dp: serving (no listener; workers connect to the address CreateSession gives, %zu characters)",
            strlen(dp->address));
    *dp_p = dp;
    return RI_OK;

err_unmap_st:
    ucp_mem_unmap(dp->ctx, dp->pool_memh);
    ucp_worker_destroy(dp->worker);
    ucp_cleanup(dp->ctx);
    goto err_free;
err_destroy_worker:
    ucp_worker_destroy(dp->worker);
err_cleanup_ctx:
    ucp_cleanup(dp->ctx);
err_ucx:
    cm_error("dp: UCX start failed on %s: %s", data->cfg.dp_listen_addr, ucs_status_string(s));
    st = s == UCS_ERR_BUSY ? RI_ERR_BUSY : RI_ERR_TRANSPORT;
err_free:
    pthread_mutex_destroy(&dp->gc_lock);
    cm_free(dp);
    return st;
}

void kvs_dp_stop(kvs_dp_t *dp)
{
    if (dp == NULL || !dp->thread_started)
        return;
    atomic_store(&dp->stop, true);
    ucp_worker_signal(dp->worker); /* wake it from poll */
    pthread_join(dp->thread, NULL);
    dp->thread_started = false;
    /* The thread is gone: requests still queued are dropped unanswered. */
    while (dp->q_head != NULL) {
        kvs_dreq_t *r = dp->q_head;
        dp->q_head = r->next;
        kvs_dreq_release(dp, r);
    }
    dp->q_tail = NULL;
}

void kvs_dp_free(kvs_dp_t *dp)
{
    if (dp == NULL)
        return;
    kvs_dp_stop(dp);
    kvs_dp_gc(dp);
    while (dp->conns != NULL) {
        kvs_conn_t *c = dp->conns;
        dp->conns = c->next;
        kvs_dp_close_conn(dp, c);
    }
    ucp_mem_unmap(dp->ctx, dp->pool_memh);
    ucp_worker_destroy(dp->worker);
    ucp_cleanup(dp->ctx);
    cm_free(dp->gc_rkeys);
    cm_free(dp->stage);
    pthread_mutex_destroy(&dp->gc_lock);
    cm_free(dp);
}

const char *kvs_dp_address(const kvs_dp_t *dp)
{
    return dp->address;
}

void kvs_dp_rkey_destroy(kvs_dp_t *dp, void *rkey)
{
    if (rkey == NULL)
        return;
    if (dp == NULL || !dp->thread_started || pthread_equal(dp->thread, pthread_self())) {
        ucp_rkey_destroy(rkey);
        return;
    }
    /* Another thread (a gRPC DropSession): the data-plane thread destroys it. */
    pthread_mutex_lock(&dp->gc_lock);
    if (dp->n_gc == dp->cap_gc) {
        size_t cap = dp->cap_gc ? dp->cap_gc * 2 : 16;
        ucp_rkey_h *n = cm_realloc(&kvs_dp_tag, dp->gc_rkeys, cap * sizeof(*n));
        if (n == NULL) {
            pthread_mutex_unlock(&dp->gc_lock);
            cm_error("dp: out of memory; leaking one rkey");
            return;
        }
        dp->gc_rkeys = n;
        dp->cap_gc = cap;
    }
    dp->gc_rkeys[dp->n_gc++] = rkey;
    pthread_mutex_unlock(&dp->gc_lock);
}

ri_status_t kvs_dp_rkey_unpack(kvs_dp_t *dp, void *conn, const void *buf, size_t len, void **rkey_p)
{
    kvs_conn_t *c = conn;
    ucp_rkey_h rkey;
    ucs_status_t s;
    uint8_t *padded;

    /* ucp_ep_rkey_unpack takes no length: it parses what the packed key says
     * it holds.  Unpack from a zero-padded copy so that a lying key reads our
     * zeros, not past the client's message. */
    (void)dp;
    padded = cm_calloc(&kvs_dp_tag, 1, len + KVS_DP_RKEY_PAD);
    if (padded == NULL)
        return RI_ERR_NOMEM;
    memcpy(padded, buf, len);
    s = ucp_ep_rkey_unpack(c->ep, padded, &rkey);
    cm_free(padded);
    if (s != UCS_OK)
        return RI_ERR_PROTOCOL; /* a bad packed key is the client's fault */
    *rkey_p = rkey;
    return RI_OK;
}

ri_status_t kvs_dp_put(kvs_dp_t *dp, void *conn, void *rkey, const void *src, size_t len, uint64_t raddr)
{
    kvs_conn_t *c = conn;
    ucp_request_param_t prm = {0};
    void *req;

    if (c->failed)
        return RI_ERR_CONN_RESET;
    prm.op_attr_mask = UCP_OP_ATTR_FIELD_MEMH;
    prm.memh = dp->pool_memh;
    req = ucp_put_nbx(c->ep, src, len, raddr, rkey, &prm);
    if (UCS_PTR_IS_ERR(req))
        return kvs_dp_status(UCS_PTR_STATUS(req));
    if (req != NULL)
        ucp_request_free(req); /* completion is awaited by the flush */
    c->puts++;
    return RI_OK;
}

ri_status_t kvs_dp_flush(kvs_dp_t *dp, void *conn)
{
    kvs_conn_t *c = conn;
    ucp_request_param_t prm = {0};

    if (c->puts == 0)
        return c->failed ? RI_ERR_CONN_RESET : RI_OK;
    c->puts = 0;
    return kvs_dp_wait(dp, ucp_ep_flush_nbx(c->ep, &prm), c);
}
