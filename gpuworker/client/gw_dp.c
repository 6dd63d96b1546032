/*
 * UCX data-plane client (see gw_dp.h).  One ucp context/worker/ep per
 * connection; the caller's thread progresses the worker inside each call.
 * It connects to the kvstore's packed worker address (from CreateSession),
 * then sends CONNECT with the session secret and its own worker address: the
 * kvstore answers over an endpoint it opens to that address.
 * Replies are matched on request_id; a late reply to an abandoned request is
 * dropped.  Receive buffers are registered with ucp_mem_map and their packed
 * rkey is sent in REGISTER_CACHE, so the server writes misses with ucp_put.
 */
#define _GNU_SOURCE
#include "gpuworker/client/gw_dp.h"

#include <pthread.h>
#include <poll.h>
#include <stdlib.h>
#include <stdio.h>
#include <string.h>
#include <fcntl.h>
#include <stddef.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>
#include <ucp/api/ucp.h>

#include "common/cm_alloc.h"
#include "common/cm_dp_direct.h"
#include "common/cm_dp_prefix.h"
#include "common/cm_log.h"
#include "common/cm_net.h"
#include "common/cm_status.h"
#include "common/cm_time.h"
#include "common/cm_ucx.h"

#define GW_DP_MAX_REGS 64
#define GW_DP_MAX_REPLY (UINT64_C(1) << 30)
#define GW_DP_SPIN_NS 200000u  /* idle time before sleeping on the event fd */
#define GW_DP_CONNECT_MS 5000u /* CONNECT deadline: the kvstore vets our address first */
#define GW_DP_DISCONNECT_MS 500u /* DISCONNECT deadline at close */
#define GW_DP_RETIRE_MS 30000u   /* how long a connection given up before it was set up stays alive */
#define GW_DP_RETIRE_MAX 32u     /* at most this many wait at once: the oldest goes first */

static CM_ALLOC_TAG(gw_dp_tag, "gw.dp");
struct gw_dp {
    ucp_context_h ctx;
    ucp_worker_h worker;
    ucp_ep_h ep;
    uint64_t session_id;
    uint8_t secret[CM_WIRE_SECRET_SIZE];
    uint64_t next_req;             /* request ids, from 1 */
    uint32_t timeout_ms;           /* default deadline */
    bool failed;                   /* error handler fired or a call timed out */
    ucs_status_t ep_status;        /* what the error handler said */
    /* the reply being waited for */
    uint64_t want_req;             /* request id; 0 = accept any (raw) */
    bool waiting, have_reply, body_pending;
    cm_wire_hdr_t reply_hdr;
    uint8_t *reply_body;           /* meta || data of the reply (owned) */
    size_t reply_len;
    ucs_status_t body_status;      /* of a rendezvous body receive */
    uint8_t send_hdr[CM_WIRE_HDR_SIZE];
    ucp_mem_h regs[GW_DP_MAX_REGS]; /* registered receive buffers */
    uint32_t n_regs;
    struct {
        uint32_t id;               /* cache id (0 = free slot) */
        uint8_t *recv;             /* its receive buffer */
        size_t recv_len;
        bool inline_data;          /* misses come in the reply */
    } caches[GW_DP_MAX_REGS];
    struct {
        void *ptr;                 /* gw_dp_recv_alloc'd buffers */
        ucp_mem_h memh;
    } allocs[GW_DP_MAX_REGS];
    uint8_t *target;               /* where a reply's data block goes (inline fetch) */
    size_t target_len;
    ucp_dt_iov_t iov[2];           /* rendezvous receive of meta || data */
    uint8_t *scratch;              /* data block of a raw call's reply */
    void *sreq;                    /* the request send in flight */
    uint8_t *fetch_meta;           /* meta of a started fetch (owned until it ends) */
    uint64_t fetch_ids;            /* ids it asked for */
    int efd;                       /* worker event fd, -1 when none */
    uint8_t *direct;               /* the session's direct region, mapped read-only (gw_dp_map), or NULL */
    uint64_t direct_bytes;
    char ho_name[CM_DP_MAX_SOCK_NAME]; /* the handover socket's name (from MAP), not NUL-terminated */
    uint32_t ho_name_len;          /* 0 until a MAP told it */
    struct gw_dp_bmap {
        const uint8_t *base;       /* attached block `slot`, mapped read-only (gw_dp_map_block), or NULL */
        uint64_t bytes;
    } *bmaps;                      /* by slot */
    uint32_t n_bmaps;
    void **orphans;                /* send buffers of calls that failed (owned; freed after the worker) */
    size_t n_orphans;
    bool established;              /* CONNECT and the first PING were answered */
    bool retired;                  /* handed to the reaper: callbacks drop what arrives */
    uint64_t retire_until_ns;      /* when the reaper tears it down */
    struct gw_dp *retire_next;     /* the reaper's lists */
};

static ri_status_t gw_dp_status(ucs_status_t s)
{
    return cm_ucx_status(s);
}

static void gw_dp_ep_error(void *arg, ucp_ep_h ep, ucs_status_t status)
{
    gw_dp_t *dp = arg;
    (void)ep;
    dp->failed = true;
    dp->ep_status = status;
}

static void gw_dp_body_done(void *request, ucs_status_t status, size_t length, void *user_data)
{
    gw_dp_t *dp = user_data;
    (void)length;
    dp->body_status = status;
    dp->body_pending = false;
    dp->have_reply = true;
    ucp_request_free(request);
}

static ucs_status_t gw_dp_am_reply(void *arg, const void *header, size_t header_length, void *data, size_t length,
                                   const ucp_am_recv_param_t *param)
{
    gw_dp_t *dp = arg;
    cm_wire_limits_t lim = {.max_meta_len = UINT32_MAX, .max_data_len = GW_DP_MAX_REPLY};
    cm_wire_hdr_t h;

    if (dp->retired)
        return UCS_OK; /* the caller gave up on this connection (gw_dp_retire) */
    if (cm_wire_decode(header, header_length, 0, &lim, &h) != RI_OK || !(h.flags & CM_WIRE_F_REPLY) ||
        (uint64_t)h.meta_len + h.data_len != length || length > GW_DP_MAX_REPLY) {
        cm_warn("dp client: malformed reply dropped");
        return UCS_OK;
    }
    if (!dp->waiting || dp->have_reply || dp->body_pending || (dp->want_req != 0 && h.request_id != dp->want_req))
        return UCS_OK; /* late answer to an abandoned request */
    dp->reply_hdr = h;
    dp->reply_len = h.meta_len;
    dp->reply_body = NULL;
    if (h.data_len > 0 && dp->target == NULL && dp->want_req == 0) {
        /* A raw call (tests): take the data into scratch, then drop it. */
        cm_free(dp->scratch);
        dp->scratch = cm_malloc(&gw_dp_tag, h.data_len);
        dp->target = dp->scratch;
        dp->target_len = dp->scratch ? h.data_len : 0;
    }
    if (h.data_len > 0 && (dp->target == NULL || h.data_len > dp->target_len)) {
        /* Data we did not ask for, or more than the buffer holds. */
        dp->body_status = UCS_ERR_MESSAGE_TRUNCATED;
        dp->have_reply = true;
        return UCS_OK;
    }
    if (h.meta_len > 0) {
        dp->reply_body = cm_malloc(&gw_dp_tag, h.meta_len);
        if (dp->reply_body == NULL) {
            dp->body_status = UCS_ERR_NO_MEMORY;
            dp->have_reply = true;
            return UCS_OK;
        }
    }
    if (param->recv_attr & UCP_AM_RECV_ATTR_FLAG_RNDV) {
        ucp_request_param_t prm = {0};
        void *req;
        prm.op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA | UCP_OP_ATTR_FIELD_DATATYPE;
        prm.cb.recv_am = gw_dp_body_done;
        prm.user_data = dp;
        prm.datatype = ucp_dt_make_iov();
        dp->iov[0] = (ucp_dt_iov_t){.buffer = dp->reply_body, .length = h.meta_len};
        dp->iov[1] = (ucp_dt_iov_t){.buffer = dp->target, .length = h.data_len};
        dp->body_pending = true;
        req = ucp_am_recv_data_nbx(dp->worker, data, dp->iov, h.data_len > 0 ? 2 : 1, &prm);
        if (req == NULL || UCS_PTR_IS_ERR(req)) {
            dp->body_status = req == NULL ? UCS_OK : UCS_PTR_STATUS(req);
            dp->body_pending = false;
            dp->have_reply = true;
        }
        return UCS_INPROGRESS;
    }
    if (h.meta_len > 0)
        memcpy(dp->reply_body, data, h.meta_len);
    if (h.data_len > 0)
        memcpy(dp->target, (const uint8_t *)data + h.meta_len, h.data_len);
    dp->body_status = UCS_OK;
    dp->have_reply = true;
    return UCS_OK;
}

void gw_dp_header(gw_dp_t *dp, uint16_t op, uint32_t meta_len, uint64_t data_len, cm_wire_hdr_t *hdr_p)
{
    memset(hdr_p, 0, sizeof(*hdr_p));
    hdr_p->magic = CM_WIRE_MAGIC;
    hdr_p->version = CM_WIRE_VERSION;
    hdr_p->op = op;
    hdr_p->session_id = dp->session_id;
    memcpy(hdr_p->secret, dp->secret, CM_WIRE_SECRET_SIZE);
    hdr_p->request_id = ++dp->next_req;
    hdr_p->meta_len = meta_len;
    hdr_p->data_len = data_len;
}

/* Send (header, body) and progress until the matching reply or the deadline.
 * want_req 0 accepts any reply (raw).  The reply stays in dp->reply_*. */
/* Send (header, body) as a request expecting a reply; want_req 0 accepts any
 * reply (raw).  The send request is tracked in dp->sreq. */
static ri_status_t gw_dp_send(gw_dp_t *dp, const void *hdr, size_t hdr_len, uint64_t want_req, const void *body,
                              size_t body_len)
{
    ucp_request_param_t prm = {0};
    void *sreq;

    if (dp->failed)
        return RI_ERR_CONN_RESET;
    if (dp->waiting)
        return RI_ERR_BUSY;
    cm_free(dp->reply_body);
    dp->reply_body = NULL;
    dp->have_reply = dp->body_pending = false;
    dp->want_req = want_req;
    dp->waiting = true;
    memcpy(dp->send_hdr, hdr, CM_MIN(hdr_len, sizeof(dp->send_hdr)));
    prm.op_attr_mask = UCP_OP_ATTR_FIELD_FLAGS;
    prm.flags = UCP_AM_SEND_FLAG_REPLY;
    sreq = ucp_am_send_nbx(dp->ep, CM_DP_AM_REQUEST, hdr_len <= sizeof(dp->send_hdr) ? dp->send_hdr : hdr, hdr_len,
                           body, body_len, &prm);
    if (UCS_PTR_IS_ERR(sreq)) {
        dp->waiting = false;
        return gw_dp_status(UCS_PTR_STATUS(sreq));
    }
    dp->sreq = sreq;
    return RI_OK;
}

/* Progress until the reply of the request sent by gw_dp_send is in and the
 * send completed, or the deadline.  The reply stays in dp->reply_*. */
static ri_status_t gw_dp_wait(gw_dp_t *dp, uint32_t timeout_ms)
{
    uint64_t deadline = cm_time_ns() + (uint64_t)(timeout_ms ? timeout_ms : dp->timeout_ms) * 1000000u;
    uint64_t last_busy = cm_time_ns();
    ri_status_t st = RI_OK;

    if (!dp->waiting)
        return RI_ERR_INVALID;
    while (dp->sreq != NULL || !dp->have_reply) {
        if (ucp_worker_progress(dp->worker) != 0 || dp->body_pending || dp->sreq != NULL) {
            /* Keep spinning while our own transfers move: shared-memory
             * fragments do not always raise the event fd. */
            last_busy = cm_time_ns();
        } else if (dp->efd >= 0 && cm_time_ns() - last_busy > GW_DP_SPIN_NS) {
            /* Only waiting for the server: sleep on the event fd (1 ms steps,
             * so the deadline and the error flag are seen) instead of
             * burning a core the server may need. */
            if (ucp_worker_arm(dp->worker) == UCS_OK) {
                struct pollfd pfd = {.fd = dp->efd, .events = POLLIN};
                (void)poll(&pfd, 1, 1);
            }
            last_busy = cm_time_ns();
        }
        if (dp->sreq != NULL && ucp_request_check_status(dp->sreq) != UCS_INPROGRESS) {
            ucs_status_t s = ucp_request_check_status(dp->sreq);
            ucp_request_free(dp->sreq);
            dp->sreq = NULL;
            if (s != UCS_OK && st == RI_OK)
                st = gw_dp_status(s);
        }
        if (dp->failed || cm_time_ns() > deadline || (st != RI_OK && dp->sreq == NULL)) {
            if (st == RI_OK)
                st = dp->failed ? gw_dp_status(dp->ep_status) : RI_ERR_TIMEOUT;
            if (st == RI_ERR_TRANSPORT)
                st = RI_ERR_CONN_RESET;
            dp->failed = true; /* the connection is unusable from here on */
            if (dp->sreq != NULL) {
                ucp_request_cancel(dp->worker, dp->sreq);
                /* The send stays owned by UCX until the ep closes; we just
                 * stop tracking it (the ep is force-closed at gw_dp_close). */
                ucp_request_free(dp->sreq);
                dp->sreq = NULL;
            }
            dp->waiting = false;
            return st;
        }
    }
    dp->waiting = false;
    if (dp->body_status != UCS_OK)
        return gw_dp_status(dp->body_status);
    return st;
}

static ri_status_t gw_dp_call(gw_dp_t *dp, const void *hdr, size_t hdr_len, uint64_t want_req, const void *body,
                              size_t body_len, uint32_t timeout_ms)
{
    ri_status_t st = gw_dp_send(dp, hdr, hdr_len, want_req, body, body_len);
    return st != RI_OK ? st : gw_dp_wait(dp, timeout_ms);
}

/* Free body, a send's own buffer, after its call: at once, unless the call
 * failed, when UCX may still read it (a cancelled or still pending send, a
 * connection retired with its worker still progressed): then it is freed
 * only once the worker is gone (gw_dp_teardown). */
static void gw_dp_release_body(gw_dp_t *dp, void *body, ri_status_t st)
{
    if (body == NULL || !dp->failed || st == RI_OK) {
        cm_free(body);
        return;
    }
    void **o = cm_realloc(&gw_dp_tag, dp->orphans, (dp->n_orphans + 1) * sizeof(void *));
    if (o != NULL) {
        dp->orphans = o;
        dp->orphans[dp->n_orphans++] = body;
    } /* else leaked: never freed under UCX */
}

/* Call op with meta+data; returns the reply's status. */
static ri_status_t gw_dp_op(gw_dp_t *dp, uint16_t op, const void *meta, uint32_t meta_len, const void *data,
                            size_t data_len, uint32_t timeout_ms)
{
    cm_wire_hdr_t h;
    uint8_t hb[CM_WIRE_HDR_SIZE];
    uint8_t *body = NULL;
    const void *send_body;
    ri_status_t st;

    gw_dp_header(dp, op, meta_len, data_len, &h);
    cm_wire_encode(&h, hb);
    /* One payload: meta || data.  Copying meta in front of a large data block
     * would cost a copy; UCX AM takes one buffer, so big uploads pay it. */
    if (meta_len > 0 && data_len > 0) {
        body = cm_malloc(&gw_dp_tag, meta_len + data_len);
        if (body == NULL)
            return RI_ERR_NOMEM;
        memcpy(body, meta, meta_len);
        memcpy(body + meta_len, data, data_len);
        send_body = body;
    } else {
        send_body = meta_len > 0 ? meta : data;
    }
    st = gw_dp_call(dp, hb, sizeof(hb), h.request_id, send_body, meta_len + data_len, timeout_ms);
    gw_dp_release_body(dp, body, st);
    if (st != RI_OK)
        return st;
    return (ri_status_t)dp->reply_hdr.status;
}

/* CONNECT: our worker address, so that the kvstore can answer.  The
 * kvstore answers nothing to a wrong secret or a refused address, so a
 * refusal shows as a timeout, bounded apart from the caller's deadline. */
static ri_status_t gw_dp_hello(gw_dp_t *dp)
{
    ucp_address_t *self = NULL;
    size_t len = 0;
    ri_status_t st;
    ucs_status_t s = ucp_worker_get_address(dp->worker, &self, &len);

    if (s != UCS_OK)
        return gw_dp_status(s);
    if (len > CM_DP_MAX_WORKER_ADDR) {
        cm_error("dp client: our UCX address takes %zu bytes, more than the kvstore accepts (%u)", len,
                 CM_DP_MAX_WORKER_ADDR);
        ucp_worker_release_address(dp->worker, self);
        return RI_ERR_TOO_LARGE;
    }
    /* Sent from a copy of our own: a CONNECT that times out may still sit
     * in UCX's queue, and a retired connection's worker goes on sending
     * it (gw_dp_retire), after UCX's address buffer would be released. */
    uint8_t *copy = cm_malloc(&gw_dp_tag, len);
    if (copy == NULL) {
        ucp_worker_release_address(dp->worker, self);
        return RI_ERR_NOMEM;
    }
    memcpy(copy, self, len);
    ucp_worker_release_address(dp->worker, self);
    st = gw_dp_op(dp, CM_WIRE_OP_CONNECT, copy, (uint32_t)len, NULL, 0, CM_MIN(dp->timeout_ms, GW_DP_CONNECT_MS));
    gw_dp_release_body(dp, copy, st);
    if (st == RI_ERR_TIMEOUT)
        cm_warn("dp client: the kvstore did not accept the connection (session %llu unknown or dropped, wrong "
                "secret, too many connections, or our address refused: its log says which)",
                (unsigned long long)dp->session_id);
    return st;
}

ri_status_t gw_dp_connect(const char *addr, uint64_t session_id, const uint8_t secret[CM_WIRE_SECRET_SIZE],
                          const gw_dp_options_t *opts, gw_dp_t **dp_p)
{
    gw_dp_t *dp;
    ucp_am_handler_param_t ah = {0};
    ucp_ep_params_t ep = {0};
    ucp_config_t *config = NULL;
    uint8_t *raddr = NULL;
    size_t raddr_len = 0;
    ucs_status_t s;
    ri_status_t st;

    if (addr == NULL || secret == NULL || dp_p == NULL)
        return RI_ERR_INVALID;
    raddr = cm_malloc(&gw_dp_tag, CM_DP_MAX_WORKER_ADDR);
    if (raddr == NULL)
        return RI_ERR_NOMEM;
    st = cm_dp_addr_parse(addr, raddr, CM_DP_MAX_WORKER_ADDR, &raddr_len);
    if (st != RI_OK) {
        cm_error("dp client: '%.40s%s' is not a kvstore data-plane address (\"ucx:\" and hex digits, from "
                 "CreateSession)", addr, strlen(addr) > 40 ? "..." : "");
        cm_free(raddr);
        return RI_ERR_INVALID;
    }
    dp = cm_calloc(&gw_dp_tag, 1, sizeof(*dp));
    if (dp == NULL) {
        cm_free(raddr);
        return RI_ERR_NOMEM;
    }
    dp->session_id = session_id;
    memcpy(dp->secret, secret, CM_WIRE_SECRET_SIZE);
    dp->timeout_ms = opts && opts->timeout_ms ? opts->timeout_ms : 10000;
    /* As on the server: no shared-memory transports (cm_ucx.h). */
    st = cm_ucx_client_config(&config);
    if (st != RI_OK)
        goto err_free;
    st = cm_ucx_context("ri-gw-dp", config, true, &dp->ctx);
    ucp_config_release(config);
    if (st != RI_OK)
        goto err_free;
    st = RI_ERR_TRANSPORT;
    if (cm_ucx_worker(dp->ctx, &dp->worker, &dp->efd) != RI_OK)
        goto err_cleanup;
    ah.field_mask = UCP_AM_HANDLER_PARAM_FIELD_ID | UCP_AM_HANDLER_PARAM_FIELD_CB | UCP_AM_HANDLER_PARAM_FIELD_ARG;
    ah.id = CM_DP_AM_REPLY;
    ah.cb = gw_dp_am_reply;
    ah.arg = dp;
    if (ucp_worker_set_am_recv_handler(dp->worker, &ah) != UCS_OK)
        goto err_worker;
    ep.field_mask = UCP_EP_PARAM_FIELD_REMOTE_ADDRESS | UCP_EP_PARAM_FIELD_ERR_HANDLER |
                    UCP_EP_PARAM_FIELD_ERR_HANDLING_MODE;
    ep.address = (const ucp_address_t *)raddr;
    ep.err_mode = UCP_ERR_HANDLING_MODE_PEER;
    ep.err_handler.cb = gw_dp_ep_error;
    ep.err_handler.arg = dp;
    s = ucp_ep_create(dp->worker, &ep, &dp->ep);
    if (s != UCS_OK) {
        st = gw_dp_status(s);
        goto err_worker;
    }
    cm_free(raddr);
    st = gw_dp_hello(dp);
    if (st == RI_OK)
        st = gw_dp_ping(dp);
    if (st != RI_OK) {
        gw_dp_close(dp); /* not established: retired, not torn down */
        return st;
    }
    dp->established = true;
    *dp_p = dp;
    return RI_OK;

err_worker:
    ucp_worker_destroy(dp->worker);
err_cleanup:
    ucp_cleanup(dp->ctx);
err_free:
    cm_free(raddr);
    cm_free(dp);
    return st;
}

/* Close the endpoint, release the worker, the context and dp. */
static void gw_dp_teardown(gw_dp_t *dp)
{
    ucp_request_param_t prm = {0};
    void *req;
    uint64_t deadline;

    prm.op_attr_mask = UCP_OP_ATTR_FIELD_FLAGS;
    prm.flags = dp->failed || dp->retired ? UCP_EP_CLOSE_FLAG_FORCE : 0;
    if (dp->direct != NULL)
        munmap(dp->direct, dp->direct_bytes);
    for (uint32_t i = 0; i < dp->n_bmaps; i++)
        if (dp->bmaps[i].base != NULL)
            munmap((void *)(uintptr_t)dp->bmaps[i].base, dp->bmaps[i].bytes);
    cm_free(dp->bmaps);
    req = ucp_ep_close_nbx(dp->ep, &prm);
    if (req != NULL && !UCS_PTR_IS_ERR(req)) {
        deadline = cm_time_ns() + 2000000000ull;
        while (ucp_request_check_status(req) == UCS_INPROGRESS && cm_time_ns() < deadline)
            ucp_worker_progress(dp->worker);
        if (ucp_request_check_status(req) == UCS_INPROGRESS) {
            /* The peer does not answer a graceful close: force it. */
            ucp_request_cancel(dp->worker, req);
        }
        ucp_request_free(req);
    }
    for (uint32_t i = 0; i < dp->n_regs; i++)
        ucp_mem_unmap(dp->ctx, dp->regs[i]);
    for (uint32_t i = 0; i < GW_DP_MAX_REGS; i++)
        if (dp->allocs[i].ptr != NULL)
            ucp_mem_unmap(dp->ctx, dp->allocs[i].memh);
    ucp_worker_destroy(dp->worker);
    for (size_t i = 0; i < dp->n_orphans; i++)
        cm_free(dp->orphans[i]);
    cm_free(dp->orphans);
    ucp_cleanup(dp->ctx);
    cm_free(dp->reply_body);
    cm_free(dp->scratch);
    cm_free(dp->fetch_meta);
    cm_free(dp);
}

/*
 * Connections given up before they were set up.  The kvstore runs UCX's
 * wireup for a new connection when it gets to it: it opens a TCP endpoint to
 * our worker and queues its wireup reply there.  If our worker is gone by
 * then (a caller that timed out while the kvstore was busy), the connect is
 * refused, and UCX 1.13 aborts the kvstore purging the queued reply (an
 * assertion UCX 1.14 dropped).  So such a connection is not torn down: a
 * reaper thread keeps progressing its worker for GW_DP_RETIRE_MS, long enough
 * for a loaded kvstore to finish the wireup, and tears it down then.  A
 * process killed meanwhile still takes its worker with it: that window is
 * documented, not closed (docs/kvstore-data.md).
 */
static struct {
    pthread_mutex_t lock; /* held while the reaper progresses the list */
    gw_dp_t *head;        /* retired connections, newest first */
    bool started, stopped;
} gw_dp_rt = {PTHREAD_MUTEX_INITIALIZER, NULL, false, false};
static pthread_once_t gw_dp_rt_once = PTHREAD_ONCE_INIT;

/* A forked child does not inherit the reaper thread: its copies of retired
 * connections are left alone (never progressed, never freed). */
static void gw_dp_rt_child(void)
{
    pthread_mutex_init(&gw_dp_rt.lock, NULL);
    gw_dp_rt.head = NULL;
    gw_dp_rt.started = false;
}

/* At exit: tear down what is still retired (UCX's own allocations would
 * otherwise outlive the process's last check), and stop the reaper. */
static void gw_dp_rt_exit(void)
{
    pthread_mutex_lock(&gw_dp_rt.lock);
    gw_dp_rt.stopped = true;
    while (gw_dp_rt.head != NULL) {
        gw_dp_t *d = gw_dp_rt.head;
        gw_dp_rt.head = d->retire_next;
        gw_dp_teardown(d);
    }
    pthread_mutex_unlock(&gw_dp_rt.lock);
}

static void gw_dp_rt_init(void)
{
    pthread_atfork(NULL, NULL, gw_dp_rt_child);
    atexit(gw_dp_rt_exit);
}

/* One pass: progress every retired connection, tear down those due and
 * those beyond GW_DP_RETIRE_MAX (the oldest).  Under the lock. */
static void gw_dp_rt_pass(void)
{
    uint64_t now = cm_time_ns();
    unsigned kept = 0;
    for (gw_dp_t **pp = &gw_dp_rt.head; *pp != NULL;) {
        gw_dp_t *d = *pp;
        while (ucp_worker_progress(d->worker) != 0) {
        }
        if (now >= d->retire_until_ns || kept >= GW_DP_RETIRE_MAX) {
            *pp = d->retire_next;
            gw_dp_teardown(d);
            continue;
        }
        kept++;
        pp = &d->retire_next;
    }
}

static void *gw_dp_reaper(void *arg)
{
    (void)arg;
    for (;;) {
        pthread_mutex_lock(&gw_dp_rt.lock);
        bool stop = gw_dp_rt.stopped;
        if (!stop)
            gw_dp_rt_pass();
        pthread_mutex_unlock(&gw_dp_rt.lock);
        if (stop)
            return NULL;
        usleep(5000);
    }
}

/* Hand dp to the reaper; tear it down at once if no reaper can run. */
static void gw_dp_retire(gw_dp_t *dp)
{
    pthread_t t;
    pthread_once(&gw_dp_rt_once, gw_dp_rt_init);
    dp->retired = true;
    dp->retire_until_ns = cm_time_ns() + (uint64_t)GW_DP_RETIRE_MS * 1000000u;
    pthread_mutex_lock(&gw_dp_rt.lock);
    if (!gw_dp_rt.started && !gw_dp_rt.stopped) {
        pthread_attr_t a;
        bool ok = pthread_attr_init(&a) == 0;
        ok = ok && pthread_attr_setdetachstate(&a, PTHREAD_CREATE_DETACHED) == 0 &&
             pthread_create(&t, &a, gw_dp_reaper, NULL) == 0;
        pthread_attr_destroy(&a);
        gw_dp_rt.started = ok;
    }
    if (!gw_dp_rt.started) {
        pthread_mutex_unlock(&gw_dp_rt.lock);
        cm_warn("dp client: no thread to keep an unfinished connection alive; closing it now");
        gw_dp_teardown(dp);
        return;
    }
    dp->retire_next = gw_dp_rt.head;
    gw_dp_rt.head = dp;
    pthread_mutex_unlock(&gw_dp_rt.lock);
}

void gw_dp_close(gw_dp_t *dp)
{
    if (dp == NULL)
        return;
    if (!dp->established) {
        gw_dp_retire(dp);
        return;
    }
    /* Tell the kvstore, so that it releases our caches now rather than when
     * UCX notices we are gone.  Best effort: a kvstore that does not answer
     * in time finds out the slow way. */
    if (!dp->failed && !dp->waiting)
        (void)gw_dp_op(dp, CM_WIRE_OP_DISCONNECT, NULL, 0, NULL, 0, GW_DP_DISCONNECT_MS);
    gw_dp_teardown(dp);
}

/* Send the handover request for object (0 = the region, slot + 1 = an
 * attached block) on conn and receive the answer: the object's descriptor
 * in *fd_p (caller closes) and its length. */
static ri_status_t gw_dp_handover_recv(gw_dp_t *dp, int conn, uint32_t object, int *fd_p, uint64_t *bytes_p)
{
    uint8_t req[CM_DP_HANDOVER_REQ2], rep[CM_DP_HANDOVER_REP];
    size_t req_len = object != 0 ? CM_DP_HANDOVER_REQ2 : CM_DP_HANDOVER_REQ;
    union {
        char buf[CMSG_SPACE(sizeof(int))];
        struct cmsghdr align;
    } ctl;
    struct iovec iov = {.iov_base = rep, .iov_len = sizeof(rep)};
    struct msghdr msg = {.msg_iov = &iov, .msg_iovlen = 1, .msg_control = ctl.buf, .msg_controllen = sizeof(ctl.buf)};
    struct cmsghdr *c;
    int fd = -1;
    ri_status_t st;

    if (object != 0)
        cm_dp_handover_req2_encode(req, dp->session_id, dp->secret, object);
    else
        cm_dp_handover_req_encode(req, dp->session_id, dp->secret); /* a kvstore of either version answers it */
    if (send(conn, req, req_len, MSG_NOSIGNAL) != (ssize_t)req_len)
        return RI_ERR_IO;
    if (recvmsg(conn, &msg, MSG_CMSG_CLOEXEC | MSG_WAITALL) != (ssize_t)sizeof(rep))
        return RI_ERR_IO; /* closed, timed out or cut short: no answer */
    if (msg.msg_flags & MSG_CTRUNC)
        return RI_ERR_PROTOCOL;
    c = CMSG_FIRSTHDR(&msg);
    if (c != NULL && c->cmsg_level == SOL_SOCKET && c->cmsg_type == SCM_RIGHTS && c->cmsg_len == CMSG_LEN(sizeof(int)))
        memcpy(&fd, CMSG_DATA(c), sizeof(int));
    cm_dp_handover_rep_decode(rep, &st, bytes_p);
    if (st == RI_OK && fd < 0)
        st = RI_ERR_PROTOCOL;
    if (st != RI_OK) {
        if (fd >= 0)
            close(fd);
        return st;
    }
    *fd_p = fd;
    return RI_OK;
}

/* Connect to the abstract socket name; -1 when it is not reachable from
 * here (another host or network namespace). */
static int gw_dp_handover_connect(const char *name, uint32_t name_len, uint32_t timeout_ms)
{
    struct sockaddr_un sa = {.sun_family = AF_UNIX};
    struct timeval tv = {.tv_sec = timeout_ms / 1000u, .tv_usec = (timeout_ms % 1000u) * 1000u};
    socklen_t len = (socklen_t)(offsetof(struct sockaddr_un, sun_path) + 1 + name_len);
    int conn = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);

    if (conn < 0)
        return -1;
    memcpy(sa.sun_path + 1, name, name_len);
    (void)setsockopt(conn, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
    (void)setsockopt(conn, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof(tv));
    if (connect(conn, (struct sockaddr *)&sa, len) != 0) {
        close(conn);
        return -1;
    }
    return conn;
}

/* Map fd read-only after checking that it is what MAP announced: at least
 * bytes long and sealed against shrinking (so no read of ours can fault). */
static ri_status_t gw_dp_map_fd(int fd, uint64_t bytes, uint8_t **base_p)
{
    struct stat sb;
    int seals = fcntl(fd, F_GET_SEALS);
    void *p;

    if (fstat(fd, &sb) != 0 || sb.st_size < 0 || (uint64_t)sb.st_size < bytes || bytes > SIZE_MAX)
        return RI_ERR_PROTOCOL;
    if (seals < 0 || !(seals & F_SEAL_SHRINK))
        return RI_ERR_PROTOCOL;
    p = mmap(NULL, (size_t)bytes, PROT_READ, MAP_SHARED, fd, 0);
    if (p == MAP_FAILED)
        return RI_ERR_NOMEM;
    *base_p = p;
    return RI_OK;
}

ri_status_t gw_dp_map(gw_dp_t *dp, uint8_t **local_p, uint64_t *bytes_p)
{
    cm_dp_map_t m;
    uint64_t bytes = 0;
    int conn, fd = -1;
    ri_status_t st;

    if (dp == NULL || local_p == NULL || bytes_p == NULL || dp->direct != NULL)
        return RI_ERR_INVALID;
    st = gw_dp_op(dp, CM_WIRE_OP_MAP, NULL, 0, NULL, 0, 0);
    if (st != RI_OK)
        return st;
    st = cm_dp_map_decode(dp->reply_body, dp->reply_hdr.meta_len, &m);
    if (st != RI_OK)
        return st;
    memcpy(dp->ho_name, m.name, m.name_len); /* for the attached blocks' handovers */
    dp->ho_name_len = m.name_len;
    /* Not reachable: the kvstore is on another host (or in another network
     * namespace); reads stay two-sided. */
    conn = gw_dp_handover_connect(m.name, m.name_len, dp->timeout_ms);
    if (conn < 0)
        return RI_ERR_UNSUPPORTED;
    st = gw_dp_handover_recv(dp, conn, 0, &fd, &bytes);
    close(conn);
    if (st == RI_ERR_IO) {
        cm_warn("dp client: the kvstore's handover socket gave no answer: reads stay two-sided");
        return RI_ERR_UNSUPPORTED;
    }
    if (st != RI_OK)
        return st;
    if (bytes != m.bytes)
        st = RI_ERR_PROTOCOL;
    if (st == RI_OK)
        st = gw_dp_map_fd(fd, bytes, &dp->direct);
    close(fd); /* the mapping keeps the memory */
    if (st != RI_OK)
        return st;
    dp->direct_bytes = bytes;
    *local_p = dp->direct;
    *bytes_p = bytes;
    return RI_OK;
}

ri_status_t gw_dp_forged_get(gw_dp_t *dp, uint64_t raddr, void *buf, size_t len, uint32_t timeout_ms)
{
    ucp_mem_map_params_t mp = {0};
    ucp_request_param_t prm = {0};
    ucp_mem_h memh = NULL;
    ucp_rkey_h rkey = NULL;
    void *packed = NULL, *req;
    size_t packed_len = 0;
    ucs_status_t s;
    uint64_t deadline;

    if (dp == NULL || buf == NULL || len == 0)
        return RI_ERR_INVALID;
    mp.field_mask = UCP_MEM_MAP_PARAM_FIELD_ADDRESS | UCP_MEM_MAP_PARAM_FIELD_LENGTH;
    mp.address = buf;
    mp.length = len;
    s = ucp_mem_map(dp->ctx, &mp, &memh);
    if (s == UCS_OK)
        s = ucp_rkey_pack(dp->ctx, memh, &packed, &packed_len);
    if (s == UCS_OK)
        s = ucp_ep_rkey_unpack(dp->ep, packed, &rkey);
    if (s != UCS_OK)
        goto out;
    req = ucp_get_nbx(dp->ep, buf, len, raddr, rkey, &prm);
    if (UCS_PTR_IS_ERR(req) || req == NULL) {
        s = UCS_PTR_STATUS(req);
        goto out;
    }
    deadline = cm_time_ns() + (uint64_t)timeout_ms * 1000000u;
    while ((s = ucp_request_check_status(req)) == UCS_INPROGRESS && cm_time_ns() < deadline)
        ucp_worker_progress(dp->worker);
    if (s == UCS_INPROGRESS) {
        ucp_request_cancel(dp->worker, req);
        s = UCS_ERR_TIMED_OUT;
    }
    ucp_request_free(req);
out:
    if (rkey != NULL)
        ucp_rkey_destroy(rkey);
    if (packed != NULL)
        ucp_rkey_buffer_release(packed);
    if (memh != NULL)
        ucp_mem_unmap(dp->ctx, memh);
    return gw_dp_status(s);
}

ri_status_t gw_dp_locate(gw_dp_t *dp, uint32_t layer, uint32_t head, uint32_t first, uint32_t count,
                         uint64_t *offs)
{
    cm_dp_locate_t l = {layer, head, first, count};
    uint8_t meta[CM_DP_LOCATE_SIZE];
    ri_status_t st;

    if (dp == NULL || offs == NULL || count == 0)
        return RI_ERR_INVALID;
    cm_dp_locate_encode(meta, &l);
    st = gw_dp_op(dp, CM_WIRE_OP_LOCATE, meta, sizeof(meta), NULL, 0, 0);
    if (st != RI_OK)
        return st;
    if (dp->reply_hdr.meta_len != (uint64_t)count * 8u)
        return RI_ERR_PROTOCOL;
    for (uint32_t i = 0; i < count; i++)
        offs[i] = cm_dp_get64(dp->reply_body + 8u * i);
    return RI_OK;
}

ri_status_t gw_dp_touch(gw_dp_t *dp, const uint32_t *recs, uint32_t n)
{
    uint8_t *meta;
    ri_status_t st;

    if (dp == NULL || recs == NULL || n == 0 || n > CM_DP_MAX_TOUCH)
        return RI_ERR_INVALID;
    meta = cm_malloc(&gw_dp_tag, CM_DP_TOUCH_FIXED + (size_t)n * CM_DP_TOUCH_ENTRY);
    if (meta == NULL)
        return RI_ERR_NOMEM;
    cm_dp_put32(meta, n);
    cm_dp_put32(meta + 4, 0);
    for (size_t i = 0; i < 3u * (size_t)n; i++)
        cm_dp_put32(meta + CM_DP_TOUCH_FIXED + 4u * i, recs[i]);
    st = gw_dp_op(dp, CM_WIRE_OP_TOUCH, meta, (uint32_t)(CM_DP_TOUCH_FIXED + (size_t)n * CM_DP_TOUCH_ENTRY), NULL,
                  0, 0);
    cm_free(meta);
    return st;
}

ri_status_t gw_dp_ping(gw_dp_t *dp)
{
    return gw_dp_op(dp, CM_WIRE_OP_PING, NULL, 0, NULL, 0, 0);
}

ri_status_t gw_dp_upload(gw_dp_t *dp, bool append, uint32_t layer, uint32_t n_heads, const uint32_t *heads,
                         const uint32_t *counts, const uint32_t *tokens, const void *pages, size_t bytes,
                         uint32_t *first_ids_p)
{
    uint64_t total = 0;
    size_t mlen;
    uint8_t *meta;
    ri_status_t st;

    if (dp == NULL || n_heads == 0 || n_heads > CM_DP_MAX_HEADS || heads == NULL || counts == NULL)
        return RI_ERR_INVALID;
    for (uint32_t i = 0; i < n_heads; i++)
        total += counts[i];
    mlen = cm_dp_clusters_meta_size(n_heads, total);
    if (mlen > UINT32_MAX)
        return RI_ERR_TOO_LARGE;
    meta = cm_malloc(&gw_dp_tag, mlen);
    if (meta == NULL)
        return RI_ERR_NOMEM;
    cm_dp_clusters_encode(meta, layer, n_heads, heads, counts, tokens);
    st = gw_dp_op(dp, append ? CM_WIRE_OP_APPEND_CLUSTERS : CM_WIRE_OP_UPLOAD_CLUSTERS, meta, (uint32_t)mlen, pages,
                  bytes, 0);
    cm_free(meta);
    if (st != RI_OK)
        return st;
    if (dp->reply_hdr.meta_len != 8u + 8u * n_heads || cm_dp_get32(dp->reply_body) != n_heads)
        return RI_ERR_PROTOCOL;
    if (first_ids_p != NULL)
        for (uint32_t i = 0; i < n_heads; i++)
            first_ids_p[i] = cm_dp_get32(dp->reply_body + 12 + 8u * i);
    return RI_OK;
}

ri_status_t gw_dp_register_cache(gw_dp_t *dp, uint32_t capacity_pages, void *recv, size_t recv_len,
                                 uint32_t *cache_id_p, uint64_t *page_bytes_p)
{
    return gw_dp_register_cache_mode(dp, capacity_pages, recv, recv_len, GW_DP_RECV_AUTO, cache_id_p, page_bytes_p);
}

static void gw_dp_cache_note(gw_dp_t *dp, uint32_t id, void *recv, size_t len, bool inline_data)
{
    for (uint32_t i = 0; i < GW_DP_MAX_REGS; i++)
        if (dp->caches[i].id == 0) {
            dp->caches[i].id = id;
            dp->caches[i].recv = recv;
            dp->caches[i].recv_len = len;
            dp->caches[i].inline_data = inline_data;
            return;
        }
}

ri_status_t gw_dp_register_cache_mode(gw_dp_t *dp, uint32_t capacity_pages, void *recv, size_t recv_len,
                                      gw_dp_recv_mode_t mode, uint32_t *cache_id_p, uint64_t *page_bytes_p)
{
    ucp_mem_map_params_t mp = {0};
    ucp_mem_h memh = NULL;
    void *rkey_buf = NULL;
    size_t rkey_len = 0;
    cm_dp_register_t r;
    uint8_t *meta;
    ri_status_t st;

    if (dp == NULL || recv == NULL || recv_len == 0 || cache_id_p == NULL)
        return RI_ERR_INVALID;
    if (dp->n_regs == GW_DP_MAX_REGS)
        return RI_ERR_QUOTA;
    if (mode == GW_DP_RECV_AUTO)
        mode = GW_DP_RECV_INLINE; /* the kvstore puts nothing (RMA is off in its context) */
    if (mode == GW_DP_RECV_INLINE) {
        cm_dp_register_t ri = {.capacity_pages = capacity_pages, .rkey_len = 0,
                               .recv_addr = (uint64_t)(uintptr_t)recv, .recv_len = recv_len, .rkey = NULL};
        uint8_t m[CM_DP_REGISTER_FIXED];
        cm_dp_register_encode_fixed(m, &ri);
        st = gw_dp_op(dp, CM_WIRE_OP_REGISTER_CACHE, m, sizeof(m), NULL, 0, 0);
        if (st != RI_OK)
            return st;
        if (dp->reply_hdr.meta_len != 16)
            return RI_ERR_PROTOCOL;
        *cache_id_p = cm_dp_get32(dp->reply_body);
        if (page_bytes_p != NULL)
            *page_bytes_p = cm_dp_get64(dp->reply_body + 8);
        gw_dp_cache_note(dp, *cache_id_p, recv, recv_len, true);
        return RI_OK;
    }
    mp.field_mask = UCP_MEM_MAP_PARAM_FIELD_ADDRESS | UCP_MEM_MAP_PARAM_FIELD_LENGTH;
    mp.address = recv;
    mp.length = recv_len;
    if (ucp_mem_map(dp->ctx, &mp, &memh) != UCS_OK)
        return RI_ERR_TRANSPORT;
    if (ucp_rkey_pack(dp->ctx, memh, &rkey_buf, &rkey_len) != UCS_OK || rkey_len > CM_DP_MAX_RKEY) {
        st = RI_ERR_TRANSPORT;
        goto err_unmap;
    }
    r = (cm_dp_register_t){.capacity_pages = capacity_pages, .rkey_len = (uint32_t)rkey_len,
                           .recv_addr = (uint64_t)(uintptr_t)recv, .recv_len = recv_len, .rkey = rkey_buf};
    meta = cm_malloc(&gw_dp_tag, CM_DP_REGISTER_FIXED + rkey_len);
    if (meta == NULL) {
        st = RI_ERR_NOMEM;
        goto err_release;
    }
    cm_dp_register_encode(meta, &r);
    st = gw_dp_op(dp, CM_WIRE_OP_REGISTER_CACHE, meta, (uint32_t)(CM_DP_REGISTER_FIXED + rkey_len), NULL, 0, 0);
    cm_free(meta);
    ucp_rkey_buffer_release(rkey_buf);
    rkey_buf = NULL;
    if (st != RI_OK)
        goto err_unmap;
    if (dp->reply_hdr.meta_len != 16) {
        st = RI_ERR_PROTOCOL;
        goto err_unmap;
    }
    *cache_id_p = cm_dp_get32(dp->reply_body);
    if (page_bytes_p != NULL)
        *page_bytes_p = cm_dp_get64(dp->reply_body + 8);
    dp->regs[dp->n_regs++] = memh;
    gw_dp_cache_note(dp, *cache_id_p, recv, recv_len, false);
    return RI_OK;

err_release:
    ucp_rkey_buffer_release(rkey_buf);
err_unmap:
    ucp_mem_unmap(dp->ctx, memh);
    return st;
}

ri_status_t gw_dp_fetch_start(gw_dp_t *dp, uint32_t cache_id, uint32_t layer, uint32_t n_heads,
                              const uint32_t *heads, const uint32_t *counts, const uint32_t *ids,
                              uint64_t recv_offset)
{
    cm_wire_hdr_t h;
    uint8_t hb[CM_WIRE_HDR_SIZE];
    uint64_t total = 0;
    size_t mlen;
    ri_status_t st;

    if (dp == NULL || n_heads == 0 || n_heads > CM_DP_MAX_HEADS || heads == NULL || counts == NULL)
        return RI_ERR_INVALID;
    if (dp->waiting)
        return RI_ERR_BUSY;
    for (uint32_t i = 0; i < n_heads; i++)
        total += counts[i];
    mlen = cm_dp_fetch_meta_size(n_heads, total);
    if (mlen > UINT32_MAX)
        return RI_ERR_TOO_LARGE;
    cm_free(dp->fetch_meta);
    dp->fetch_meta = cm_malloc(&gw_dp_tag, mlen);
    if (dp->fetch_meta == NULL)
        return RI_ERR_NOMEM;
    cm_dp_fetch_encode(dp->fetch_meta, cache_id, layer, recv_offset, n_heads, heads, counts, ids);
    dp->fetch_ids = total;
    dp->target = NULL;
    dp->target_len = 0;
    for (uint32_t i = 0; i < GW_DP_MAX_REGS; i++)
        if (dp->caches[i].id == cache_id && dp->caches[i].inline_data && recv_offset <= dp->caches[i].recv_len) {
            dp->target = dp->caches[i].recv + recv_offset;
            dp->target_len = dp->caches[i].recv_len - recv_offset;
        }
    gw_dp_header(dp, CM_WIRE_OP_FETCH_RANKED, (uint32_t)mlen, 0, &h);
    cm_wire_encode(&h, hb);
    st = gw_dp_send(dp, hb, sizeof(hb), h.request_id, dp->fetch_meta, mlen);
    if (st != RI_OK)
        dp->target = NULL;
    return st;
}

ri_status_t gw_dp_fetch_finish(gw_dp_t *dp, uint32_t timeout_ms, gw_dp_fetch_result_t *res_p)
{
    ri_status_t st;

    if (dp == NULL || res_p == NULL)
        return RI_ERR_INVALID;
    st = gw_dp_wait(dp, timeout_ms);
    dp->target = NULL;
    if (!dp->failed) {
        /* After a failure UCX may still read it; it is freed at close. */
        cm_free(dp->fetch_meta);
        dp->fetch_meta = NULL;
    }
    if (st != RI_OK)
        return st;
    if (dp->reply_hdr.status != RI_OK)
        return (ri_status_t)dp->reply_hdr.status;
    st = cm_dp_fetch_reply_decode(dp->reply_body, dp->reply_hdr.meta_len, &res_p->view);
    if (st != RI_OK || res_p->view.n_entries != dp->fetch_ids)
        return st != RI_OK ? st : RI_ERR_PROTOCOL;
    res_p->buf = dp->reply_body; /* hand the reply over */
    dp->reply_body = NULL;
    return RI_OK;
}

ri_status_t gw_dp_fetch_ranked(gw_dp_t *dp, uint32_t cache_id, uint32_t layer, uint32_t n_heads,
                               const uint32_t *heads, const uint32_t *counts, const uint32_t *ids,
                               uint64_t recv_offset, uint32_t timeout_ms, gw_dp_fetch_result_t *res_p)
{
    ri_status_t st = gw_dp_fetch_start(dp, cache_id, layer, n_heads, heads, counts, ids, recv_offset);
    return st != RI_OK ? st : gw_dp_fetch_finish(dp, timeout_ms, res_p);
}

void gw_dp_fetch_result_free(gw_dp_fetch_result_t *res)
{
    if (res == NULL)
        return;
    cm_free(res->buf);
    res->buf = NULL;
}

ri_status_t gw_dp_release(gw_dp_t *dp, uint32_t cache_id)
{
    uint8_t meta[8];

    ri_status_t st;

    cm_dp_put32(meta, cache_id);
    cm_dp_put32(meta + 4, 0);
    st = gw_dp_op(dp, CM_WIRE_OP_RELEASE, meta, sizeof(meta), NULL, 0, 0);
    if (st == RI_OK)
        for (uint32_t i = 0; i < GW_DP_MAX_REGS; i++)
            if (dp->caches[i].id != 0 && (cache_id == 0 || dp->caches[i].id == cache_id))
                dp->caches[i].id = 0;
    return st;
}

ri_status_t gw_dp_raw(gw_dp_t *dp, const void *hdr, size_t hdr_len, const void *body, size_t body_len,
                      uint32_t timeout_ms, cm_wire_hdr_t *reply_p)
{
    ri_status_t st;

    dp->target = NULL;
    st = gw_dp_call(dp, hdr, hdr_len, 0, body, body_len, timeout_ms);
    if (st == RI_OK && reply_p != NULL)
        *reply_p = dp->reply_hdr;
    dp->target = NULL;
    if (!dp->body_pending) {
        cm_free(dp->scratch);
        dp->scratch = NULL;
    }
    return st;
}

ri_status_t gw_dp_raw_start(gw_dp_t *dp, const void *hdr, size_t hdr_len, const void *body, size_t body_len,
                            uint32_t progress_ms)
{
    uint64_t until = cm_time_ns() + (uint64_t)progress_ms * 1000000u;
    ri_status_t st = gw_dp_send(dp, hdr, hdr_len, 0, body, body_len);
    if (st != RI_OK)
        return st;
    while (cm_time_ns() < until)
        ucp_worker_progress(dp->worker);
    dp->failed = true; /* the request is abandoned half way */
    return RI_OK;
}

ri_status_t gw_dp_recv_alloc(gw_dp_t *dp, size_t len, void **ptr_p)
{
    ucp_mem_map_params_t mp = {0};
    ucp_mem_attr_t attr = {0};
    ucp_mem_h memh;
    uint32_t slot;

    if (dp == NULL || len == 0 || ptr_p == NULL)
        return RI_ERR_INVALID;
    for (slot = 0; slot < GW_DP_MAX_REGS && dp->allocs[slot].ptr != NULL; slot++)
        ;
    if (slot == GW_DP_MAX_REGS)
        return RI_ERR_QUOTA;
    /* UCX allocates: with shared-memory transports the memory comes from a
     * shared segment, so the server's puts are plain stores into it. */
    mp.field_mask = UCP_MEM_MAP_PARAM_FIELD_ADDRESS | UCP_MEM_MAP_PARAM_FIELD_LENGTH | UCP_MEM_MAP_PARAM_FIELD_FLAGS;
    mp.address = NULL;
    mp.length = len;
    mp.flags = UCP_MEM_MAP_ALLOCATE;
    if (ucp_mem_map(dp->ctx, &mp, &memh) != UCS_OK)
        return RI_ERR_NOMEM;
    attr.field_mask = UCP_MEM_ATTR_FIELD_ADDRESS;
    if (ucp_mem_query(memh, &attr) != UCS_OK) {
        ucp_mem_unmap(dp->ctx, memh);
        return RI_ERR_TRANSPORT;
    }
    dp->allocs[slot].ptr = attr.address;
    dp->allocs[slot].memh = memh;
    *ptr_p = attr.address;
    return RI_OK;
}

void gw_dp_recv_free(gw_dp_t *dp, void *ptr)
{
    if (dp == NULL || ptr == NULL)
        return;
    for (uint32_t i = 0; i < GW_DP_MAX_REGS; i++)
        if (dp->allocs[i].ptr == ptr) {
            ucp_mem_unmap(dp->ctx, dp->allocs[i].memh);
            dp->allocs[i].ptr = NULL;
        }
}

/* --- prefix blocks (common/cm_dp_prefix.h) --------------------------------- */

ri_status_t gw_dp_prefix_attach(gw_dp_t *dp, const uint8_t *keys, uint32_t n_keys, cm_pfx_attached_t *out,
                                uint32_t *n_attached_p)
{
    return gw_dp_prefix_attach_flags(dp, keys, n_keys, 0, out, n_attached_p);
}

ri_status_t gw_dp_prefix_attach_flags(gw_dp_t *dp, const uint8_t *keys, uint32_t n_keys, uint32_t flags,
                                      cm_pfx_attached_t *out, uint32_t *n_attached_p)
{
    uint8_t *meta;
    uint32_t n = 0;
    ri_status_t st;

    if (dp == NULL || keys == NULL || out == NULL || n_attached_p == NULL || n_keys == 0 ||
        n_keys > CM_PFX_MAX_KEYS)
        return RI_ERR_INVALID;
    meta = cm_malloc(&gw_dp_tag, cm_pfx_attach_req_size(n_keys));
    if (meta == NULL)
        return RI_ERR_NOMEM;
    cm_pfx_attach_req_encode(meta, n_keys, flags, keys);
    st = gw_dp_op(dp, CM_WIRE_OP_PREFIX_ATTACH, meta, (uint32_t)cm_pfx_attach_req_size(n_keys), NULL, 0, 0);
    cm_free(meta);
    if (st != RI_OK)
        return st;
    st = cm_pfx_attach_rep_decode(dp->reply_body, dp->reply_hdr.meta_len, n_keys, out, &n);
    if (st != RI_OK)
        return st;
    *n_attached_p = n;
    return RI_OK;
}

ri_status_t gw_dp_prefix_put(gw_dp_t *dp, const uint8_t key[CM_PFX_KEY_SIZE], const void *block, uint64_t len,
                             uint32_t *slot_p, uint32_t *flags_p)
{
    uint32_t slot, flags;
    uint64_t bytes;
    ri_status_t st;

    if (dp == NULL || key == NULL || block == NULL || len < CM_PFX_HDR_SIZE || len > SIZE_MAX - CM_PFX_PUT_META)
        return RI_ERR_INVALID;
    st = gw_dp_op(dp, CM_WIRE_OP_PREFIX_PUT, key, CM_PFX_PUT_META, block, (size_t)len, 0);
    if (st != RI_OK)
        return st;
    st = cm_pfx_put_rep_decode(dp->reply_body, dp->reply_hdr.meta_len, &slot, &flags, &bytes);
    if (st != RI_OK)
        return st;
    if (bytes != len)
        return RI_ERR_PROTOCOL;
    if (slot_p != NULL)
        *slot_p = slot;
    if (flags_p != NULL)
        *flags_p = flags;
    return RI_OK;
}

ri_status_t gw_dp_prefix_get(gw_dp_t *dp, uint32_t slot, uint64_t offset, void *buf, uint64_t len)
{
    cm_pfx_get_t g = {.slot = slot, .offset = offset, .length = len};
    uint8_t meta[CM_PFX_GET_META];
    uint64_t bytes, off;
    ri_status_t st;

    if (dp == NULL || buf == NULL || len == 0 || len > SIZE_MAX)
        return RI_ERR_INVALID;
    if (dp->waiting)
        return RI_ERR_BUSY;
    cm_pfx_get_encode(meta, &g);
    dp->target = buf; /* the data block is received in place */
    dp->target_len = (size_t)len;
    st = gw_dp_op(dp, CM_WIRE_OP_PREFIX_GET, meta, sizeof(meta), NULL, 0, 0);
    dp->target = NULL;
    dp->target_len = 0;
    if (st != RI_OK)
        return st;
    st = cm_pfx_get_rep_decode(dp->reply_body, dp->reply_hdr.meta_len, &bytes, &off);
    if (st != RI_OK)
        return st;
    return off == offset && dp->reply_hdr.data_len == len ? RI_OK : RI_ERR_PROTOCOL;
}

/* Learn the handover socket's name (a MAP) when no MAP told it yet. */
static ri_status_t gw_dp_ho_name(gw_dp_t *dp)
{
    cm_dp_map_t m;
    ri_status_t st;

    if (dp->ho_name_len != 0)
        return RI_OK;
    st = gw_dp_op(dp, CM_WIRE_OP_MAP, NULL, 0, NULL, 0, 0);
    if (st != RI_OK)
        return st;
    st = cm_dp_map_decode(dp->reply_body, dp->reply_hdr.meta_len, &m);
    if (st != RI_OK)
        return st;
    memcpy(dp->ho_name, m.name, m.name_len);
    dp->ho_name_len = m.name_len;
    return RI_OK;
}

/* Room for slot in dp->bmaps. */
static ri_status_t gw_dp_bmaps_reserve(gw_dp_t *dp, uint32_t slot)
{
    struct gw_dp_bmap *n;
    uint32_t cap = dp->n_bmaps ? dp->n_bmaps : 8u;

    if (slot < dp->n_bmaps)
        return RI_OK;
    while (cap <= slot)
        cap *= 2u;
    n = cm_realloc(&gw_dp_tag, dp->bmaps, (size_t)cap * sizeof(*n));
    if (n == NULL)
        return RI_ERR_NOMEM;
    memset(n + dp->n_bmaps, 0, (size_t)(cap - dp->n_bmaps) * sizeof(*n));
    dp->bmaps = n;
    dp->n_bmaps = cap;
    return RI_OK;
}

ri_status_t gw_dp_map_block(gw_dp_t *dp, uint32_t slot, const uint8_t **base_p, uint64_t *bytes_p)
{
    uint64_t bytes = 0;
    uint8_t *base = NULL;
    int conn, fd = -1;
    ri_status_t st;

    if (dp == NULL || base_p == NULL || bytes_p == NULL || slot > CM_PFX_LOC_MAX_SLOT)
        return RI_ERR_INVALID;
    st = gw_dp_bmaps_reserve(dp, slot);
    if (st != RI_OK)
        return st;
    if (dp->bmaps[slot].base == NULL) {
        st = gw_dp_ho_name(dp);
        if (st != RI_OK)
            return st; /* no MAP here (UNSUPPORTED): PREFIX_GET */
        conn = gw_dp_handover_connect(dp->ho_name, dp->ho_name_len, dp->timeout_ms);
        if (conn < 0)
            return RI_ERR_UNSUPPORTED; /* another host: PREFIX_GET */
        st = gw_dp_handover_recv(dp, conn, slot + 1u, &fd, &bytes);
        close(conn);
        if (st == RI_ERR_IO)
            return RI_ERR_UNSUPPORTED;
        if (st != RI_OK)
            return st;
        st = gw_dp_map_fd(fd, bytes, &base);
        close(fd); /* the mapping keeps the memory */
        if (st != RI_OK)
            return st;
        dp->bmaps[slot].base = base;
        dp->bmaps[slot].bytes = bytes;
    }
    *base_p = dp->bmaps[slot].base;
    *bytes_p = dp->bmaps[slot].bytes;
    return RI_OK;
}
