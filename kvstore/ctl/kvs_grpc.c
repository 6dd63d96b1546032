/*
 * gRPC C core server for the control API (see kvs_grpc.h).  Expected load: a
 * few calls per second per worker (session set-up and tear-down, Stats
 * polling), so a single completion queue shared by a handful of threads is
 * plenty; what matters is that no input can crash or hang the daemon and that
 * shutdown is bounded.
 *
 * Every tag on the queue is a kvs_rpc (a call being requested or answered) or
 * the one shutdown tag.  An rpc goes WAIT_CALL -> (handler runs) -> WAIT_SEND
 * -> freed; a fresh request is posted for its method as soon as one arrives, so
 * the number of outstanding requests per method stays constant.
 */
#define _GNU_SOURCE
#include "kvstore/ctl/kvs_grpc.h"

#include <malloc.h>
#include <pthread.h>
#include <stdatomic.h>
#include <string.h>
#include <time.h>

#include <grpc/byte_buffer.h>
#include <grpc/byte_buffer_reader.h>
#include <grpc/grpc.h>
#include <grpc/grpc_posix.h>
#include <grpc/grpc_security.h>
#include <grpc/slice.h>
#include <grpc/support/time.h>

#include "common/cm_alloc.h"
#include "common/cm_hist.h"
#include "common/cm_keys.h"
#include "common/cm_log.h"
#include "common/cm_status.h"
#include "common/cm_time.h"
#include "kvstore/ctl/kvs_accept.h"

#define KVS_GRPC_CODES 17           /* grpc_status_code 0..16 */
#define KVS_GRPC_POST_PER_THREAD 2  /* outstanding requests per method and thread */
#define KVS_GRPC_MAX_STREAMS 64     /* concurrent calls per client connection */
#define KVS_GRPC_MEM_MESSAGES 4u    /* gRPC memory quota, in maximal messages ... */
#define KVS_GRPC_MEM_MIN (64ull << 20) /* ... but at least this */
#define KVS_GRPC_MAX_CONN 1024u     /* client connections when the config gives 0 */
#define KVS_GRPC_TRIM_CALLS 64u     /* calls between heap trims (each when the server goes idle) */

static CM_ALLOC_TAG(kvs_grpc_tag, "kvs.grpc");

typedef enum kvs_tag_kind {
    KVS_TAG_RPC = 1,
    KVS_TAG_SHUTDOWN = 2,
} kvs_tag_kind_t;

typedef enum kvs_rpc_state {
    KVS_RPC_WAIT_CALL,  /* requested, waiting for a client */
    KVS_RPC_WAIT_SEND,  /* answered, waiting for the send batch */
} kvs_rpc_state_t;

typedef struct kvs_tag {
    kvs_tag_kind_t kind;  /* first field of every tag */
} kvs_tag_t;

typedef struct kvs_rpc {
    kvs_tag_t tag;                   /* KVS_TAG_RPC */
    kvs_rpc_state_t state;           /* where it is */
    struct kvs_grpc *srv;            /* owner */
    int method;                      /* index into methods; -1 = generic (unknown) */
    grpc_call *call;                 /* the call, once it arrived */
    gpr_timespec deadline;           /* client's deadline (registered calls) */
    grpc_call_details details;       /* method path etc. (generic calls) */
    grpc_metadata_array md;          /* request metadata */
    grpc_byte_buffer *payload;       /* request message (registered calls) */
    grpc_byte_buffer *resp;          /* response message, kept until sent */
    grpc_slice status_details;       /* error message, kept until sent */
    bool has_details;                /* status_details must be unreffed */
    int recv_cancelled;              /* RECV_CLOSE_ON_SERVER result */
    int code;                        /* grpc_status_code sent */
} kvs_rpc_t;

struct kvs_grpc {
    kvs_grpc_config_t cfg;                 /* copy; methods/auth borrowed */
    char *default_tenant;                  /* owned copy */
    grpc_server *server;                   /* owned */
    kvs_accept_t *accept;                  /* owned; our listener (plaintext), NULL with TLS */
    grpc_server_credentials *fd_creds;     /* owned; insecure, for the connections accept hands over */
    grpc_completion_queue *cq;             /* owned, shared by the threads */
    void **handles;                        /* registered method handles */
    pthread_t *threads;                    /* serving threads */
    unsigned n_threads;                    /* started */
    int port;                              /* bound port */
    kvs_tag_t shutdown_tag;                /* KVS_TAG_SHUTDOWN */
    pthread_rwlock_t auth_lock;            /* guards cfg.auth against kvs_grpc_swap_auth */
    pthread_mutex_t lock;                  /* guards the shutdown flags */
    pthread_cond_t cond;                   /* signalled when shutdown_done */
    bool shutdown_started;                 /* shutdown_and_notify called */
    bool shutdown_done;                    /* its tag arrived */
    bool server_destroyed;                 /* grpc_server_destroy called */
    bool threads_joined;                   /* cq shut down and threads gone */
    atomic_bool stopping;                  /* do not post new requests */
    atomic_uint inflight;                  /* calls between arrival and send completion */
    _Atomic uint64_t *calls;               /* [(n_methods + 1) * KVS_GRPC_CODES] */
    _Atomic uint64_t auth_failures;        /* missing or unknown tokens */
    _Atomic uint64_t last_refusal_log_ns;  /* rate limit of the refusal log line */
    _Atomic uint64_t bad_messages;         /* requests the handler could not parse */
    _Atomic uint64_t handler_ns;           /* total time in handlers */
    cm_hist_t *lat;                        /* [n_methods] handler latency histograms, seconds */
    atomic_uint calls_since_trim;          /* calls finished since the heap was last trimmed */
    _Atomic uint64_t trims;                /* heap trims after bursts */
};

/* Upper bounds of the handler latency buckets (seconds); the last is +Inf. */
static const double kvs_grpc_buckets[] = {1e-5, 5e-5, 1e-4, 5e-4, 1e-3, 5e-3, 1e-2, 1e-1, 1.0};

static const char *const kvs_grpc_code_names[KVS_GRPC_CODES] = {
    "OK", "CANCELLED", "UNKNOWN", "INVALID_ARGUMENT", "DEADLINE_EXCEEDED", "NOT_FOUND",
    "ALREADY_EXISTS", "PERMISSION_DENIED", "RESOURCE_EXHAUSTED", "FAILED_PRECONDITION", "ABORTED",
    "OUT_OF_RANGE", "UNIMPLEMENTED", "INTERNAL", "UNAVAILABLE", "DATA_LOSS", "UNAUTHENTICATED",
};

int kvs_grpc_code_from_status(ri_status_t st)
{
    switch (st) {
    case RI_OK: return GRPC_STATUS_OK;
    case RI_ERR_INVALID:
    case RI_ERR_PROTOCOL:
    case RI_ERR_TRUNCATED:
    case RI_ERR_BAD_MAGIC:
    case RI_ERR_BAD_VERSION:
    case RI_ERR_FORMAT: return GRPC_STATUS_INVALID_ARGUMENT;
    case RI_ERR_RANGE: return GRPC_STATUS_OUT_OF_RANGE;
    case RI_ERR_NOT_FOUND: return GRPC_STATUS_NOT_FOUND;
    case RI_ERR_EXISTS: return GRPC_STATUS_ALREADY_EXISTS;
    case RI_ERR_UNSUPPORTED: return GRPC_STATUS_UNIMPLEMENTED;
    case RI_ERR_BUSY: return GRPC_STATUS_UNAVAILABLE;
    /* Draining: the client should not retry here (UNAVAILABLE would invite it
     * and would read as "unreachable"). */
    case RI_ERR_SHUTDOWN: return GRPC_STATUS_FAILED_PRECONDITION;
    case RI_ERR_TIMEOUT: return GRPC_STATUS_DEADLINE_EXCEEDED;
    case RI_ERR_CANCELLED: return GRPC_STATUS_CANCELLED;
    case RI_ERR_QUOTA:
    case RI_ERR_NOSPACE:
    case RI_ERR_NOMEM:
    case RI_ERR_TOO_LARGE: return GRPC_STATUS_RESOURCE_EXHAUSTED;
    case RI_ERR_UNAUTHENTICATED: return GRPC_STATUS_UNAUTHENTICATED;
    case RI_ERR_PERMISSION: return GRPC_STATUS_PERMISSION_DENIED;
    case RI_ERR_CORRUPT: return GRPC_STATUS_DATA_LOSS;
    default: return GRPC_STATUS_INTERNAL;
    }
}

static void kvs_rpc_free(kvs_rpc_t *rpc)
{
    if (rpc == NULL)
        return;
    if (rpc->call != NULL)
        grpc_call_unref(rpc->call);
    grpc_metadata_array_destroy(&rpc->md);
    grpc_call_details_destroy(&rpc->details);
    if (rpc->payload != NULL)
        grpc_byte_buffer_destroy(rpc->payload);
    if (rpc->resp != NULL)
        grpc_byte_buffer_destroy(rpc->resp);
    if (rpc->has_details)
        grpc_slice_unref(rpc->status_details);
    cm_free(rpc);
}

/* Ask the core for the next call of one method (-1 = any unregistered). */
static void kvs_grpc_post(kvs_grpc_t *srv, int method)
{
    grpc_call_error ce;
    kvs_rpc_t *rpc = cm_calloc(&kvs_grpc_tag, 1, sizeof(*rpc));
    if (rpc == NULL) {
        cm_error("grpc: out of memory posting a request for %s",
                 method < 0 ? "unknown methods" : srv->cfg.methods[method].name);
        return;
    }
    rpc->tag.kind = KVS_TAG_RPC;
    rpc->state = KVS_RPC_WAIT_CALL;
    rpc->srv = srv;
    rpc->method = method;
    grpc_metadata_array_init(&rpc->md);
    grpc_call_details_init(&rpc->details);
    if (method >= 0)
        ce = grpc_server_request_registered_call(srv->server, srv->handles[method], &rpc->call, &rpc->deadline,
                                                 &rpc->md, &rpc->payload, srv->cq, srv->cq, rpc);
    else
        ce = grpc_server_request_call(srv->server, &rpc->call, &rpc->details, &rpc->md, srv->cq, srv->cq, rpc);
    if (ce != GRPC_CALL_OK) {
        if (!atomic_load(&srv->stopping))
            cm_error("grpc: request_call failed (%d)", (int)ce);
        kvs_rpc_free(rpc);
    }
}

/* Find the caller's tenant (copied into tenant_buf, so that the tokens may
 * be swapped while the handler runs); on failure fill reply->msg and return an
 * error. */
static ri_status_t kvs_grpc_authenticate(kvs_grpc_t *srv, kvs_rpc_t *rpc, kvs_caller_t *caller,
                                         char tenant_buf[KVS_AUTH_TENANT_MAX], kvs_reply_t *reply)
{
    const grpc_metadata *auth_md = NULL;
    const char *tok;
    size_t tok_len;

    if (srv->cfg.auth == NULL) {
        caller->tenant = srv->default_tenant;
        caller->admin = srv->cfg.admin_without_tokens;
        return RI_OK;
    }
    for (size_t i = 0; i < rpc->md.count; i++) {
        const grpc_slice *k = &rpc->md.metadata[i].key;
        if (GRPC_SLICE_LENGTH(*k) == 13 && memcmp(GRPC_SLICE_START_PTR(*k), "authorization", 13) == 0) {
            auth_md = &rpc->md.metadata[i];
            break;
        }
    }
    if (auth_md == NULL) {
        snprintf(reply->msg, sizeof(reply->msg), "missing 'authorization: Bearer <token>' metadata");
        return RI_ERR_UNAUTHENTICATED;
    }
    if (!cm_keys_bearer_n((const char *)GRPC_SLICE_START_PTR(auth_md->value), GRPC_SLICE_LENGTH(auth_md->value),
                               &tok, &tok_len)) {
        snprintf(reply->msg, sizeof(reply->msg), "authorization metadata is not 'Bearer <token>'");
        return RI_ERR_UNAUTHENTICATED;
    }
    pthread_rwlock_rdlock(&srv->auth_lock);
    const kvs_auth_entry_t *e = kvs_auth_lookup(srv->cfg.auth, tok, tok_len);
    if (e != NULL) {
        snprintf(tenant_buf, KVS_AUTH_TENANT_MAX, "%s", e->tenant);
        caller->admin = e->admin;
    }
    pthread_rwlock_unlock(&srv->auth_lock);
    if (e == NULL) {
        snprintf(reply->msg, sizeof(reply->msg), "unknown bearer token");
        return RI_ERR_UNAUTHENTICATED;
    }
    caller->tenant = tenant_buf;
    return RI_OK;
}

/* Copy a method path into buf as printable text, for messages. */
static void kvs_grpc_safe_path(const grpc_slice *s, char *buf, size_t len)
{
    size_t n = GRPC_SLICE_LENGTH(*s), j = 0;
    const uint8_t *p = GRPC_SLICE_START_PTR(*s);
    for (size_t i = 0; i < n && j + 1 < len; i++)
        buf[j++] = (p[i] >= 0x20 && p[i] < 0x7f) ? (char)p[i] : '?';
    buf[j] = '\0';
}

/* Log an authentication refusal, at most one line per second (a client
 * retrying with a bad token must not flood the log; the counter has them all). */
static void kvs_grpc_log_refusal(kvs_grpc_t *srv, const char *method, const char *why)
{
    uint64_t now = cm_time_ns(), last = atomic_load(&srv->last_refusal_log_ns);
    if (now - last < 1000000000u || !atomic_compare_exchange_strong(&srv->last_refusal_log_ns, &last, now))
        return;
    cm_warn("grpc: %s refused: %s (%llu refusals so far)", method, why,
            (unsigned long long)atomic_load(&srv->auth_failures));
}

/* Run the handler of an arrived call and start the batch that answers it. */
static void kvs_grpc_handle(kvs_grpc_t *srv, kvs_rpc_t *rpc)
{
    kvs_reply_t reply = {0};
    kvs_caller_t caller = {.tenant = "", .admin = false};
    char tenant_buf[KVS_AUTH_TENANT_MAX];
    ri_status_t st = RI_OK;

    if (rpc->method < 0) {
        char path[128];
        kvs_grpc_safe_path(&rpc->details.method, path, sizeof(path));
        snprintf(reply.msg, sizeof(reply.msg), "unknown method %s", path);
        st = RI_ERR_UNSUPPORTED;
        cm_debug("grpc: unknown method %s", path);
    } else {
        const kvs_method_t *m = &srv->cfg.methods[rpc->method];
        if (m->needs_auth) {
            st = kvs_grpc_authenticate(srv, rpc, &caller, tenant_buf, &reply);
            if (st != RI_OK) {
                atomic_fetch_add(&srv->auth_failures, 1);
                kvs_grpc_log_refusal(srv, m->name, reply.msg);
            }
        }
        if (st == RI_OK && rpc->payload == NULL) {
            st = RI_ERR_INVALID;
            snprintf(reply.msg, sizeof(reply.msg), "%s: request message missing", m->name);
        }
        if (st == RI_OK) {
            grpc_byte_buffer_reader reader;
            if (!grpc_byte_buffer_reader_init(&reader, rpc->payload)) {
                st = RI_ERR_INVALID;
                snprintf(reply.msg, sizeof(reply.msg), "%s: cannot read the request message", m->name);
            } else {
                grpc_slice in = grpc_byte_buffer_reader_readall(&reader);
                grpc_byte_buffer_reader_destroy(&reader);
                uint64_t t0 = cm_time_ns();
                st = m->fn(srv->cfg.app, &caller, GRPC_SLICE_START_PTR(in), GRPC_SLICE_LENGTH(in), &reply);
                uint64_t dt = cm_time_ns() - t0;
                cm_hist_add(&srv->lat[rpc->method], (double)dt / 1e9);
                atomic_fetch_add(&srv->handler_ns, dt);
                grpc_slice_unref(in);
                if (st == RI_ERR_PROTOCOL)
                    atomic_fetch_add(&srv->bad_messages, 1);
            }
        }
    }

    if (st == RI_OK) {
        grpc_slice out = reply.len > 0 ? grpc_slice_new(reply.buf, reply.len, cm_free) : grpc_empty_slice();
        if (reply.len == 0)
            cm_free(reply.buf);
        rpc->resp = grpc_raw_byte_buffer_create(&out, 1);
        grpc_slice_unref(out);
    } else {
        cm_free(reply.buf);
        if (reply.msg[0] == '\0')
            snprintf(reply.msg, sizeof(reply.msg), "%s", ri_status_str(st));
    }
    rpc->code = kvs_grpc_code_from_status(st);
    rpc->status_details = grpc_slice_from_copied_string(reply.msg);
    rpc->has_details = true;

    grpc_op ops[4];
    size_t n = 0;
    memset(ops, 0, sizeof(ops));
    ops[n].op = GRPC_OP_SEND_INITIAL_METADATA;
    n++;
    if (rpc->resp != NULL) {
        ops[n].op = GRPC_OP_SEND_MESSAGE;
        ops[n].data.send_message.send_message = rpc->resp;
        n++;
    }
    ops[n].op = GRPC_OP_SEND_STATUS_FROM_SERVER;
    ops[n].data.send_status_from_server.status = (grpc_status_code)rpc->code;
    ops[n].data.send_status_from_server.status_details = &rpc->status_details;
    n++;
    ops[n].op = GRPC_OP_RECV_CLOSE_ON_SERVER;
    ops[n].data.recv_close_on_server.cancelled = &rpc->recv_cancelled;
    n++;
    rpc->state = KVS_RPC_WAIT_SEND;
    grpc_call_error ce = grpc_call_start_batch(rpc->call, ops, n, rpc, NULL);
    if (ce != GRPC_CALL_OK) {
        cm_error("grpc: start_batch failed (%d)", (int)ce);
        atomic_fetch_sub(&srv->inflight, 1);
        kvs_rpc_free(rpc);
    }
}

static void kvs_grpc_count(kvs_grpc_t *srv, const kvs_rpc_t *rpc)
{
    size_t row = rpc->method < 0 ? srv->cfg.n_methods : (size_t)rpc->method;
    int code = (rpc->code >= 0 && rpc->code < KVS_GRPC_CODES) ? rpc->code : GRPC_STATUS_UNKNOWN;
    atomic_fetch_add(&srv->calls[row * KVS_GRPC_CODES + (size_t)code], 1);
}

/* A burst of calls (64 connections x 64 streams of max-message requests:
 * up to the 64 MiB gRPC memory quota) leaves that much freed memory in the
 * serving threads' malloc arenas, which glibc keeps: the daemon stayed tens
 * of MiB larger after a Health flood than before.  When the last call in
 * flight ends and at least KVS_GRPC_TRIM_CALLS ended since the last trim,
 * give the free pages back (malloc_trim walks the arenas: well under a
 * millisecond at these sizes; at most once per 64 calls). */
static void kvs_grpc_trim(kvs_grpc_t *srv)
{
    if (atomic_fetch_add(&srv->calls_since_trim, 1) + 1 < KVS_GRPC_TRIM_CALLS)
        return;
    atomic_store(&srv->calls_since_trim, 0);
    malloc_trim(0);
    atomic_fetch_add(&srv->trims, 1);
}

static void *kvs_grpc_thread(void *arg)
{
    kvs_grpc_t *srv = arg;
    for (;;) {
        grpc_event ev = grpc_completion_queue_next(srv->cq, gpr_inf_future(GPR_CLOCK_MONOTONIC), NULL);
        if (ev.type == GRPC_QUEUE_SHUTDOWN)
            break;
        if (ev.type != GRPC_OP_COMPLETE)
            continue;
        kvs_tag_t *tag = ev.tag;
        if (tag->kind == KVS_TAG_SHUTDOWN) {
            pthread_mutex_lock(&srv->lock);
            srv->shutdown_done = true;
            pthread_cond_broadcast(&srv->cond);
            pthread_mutex_unlock(&srv->lock);
            continue;
        }
        kvs_rpc_t *rpc = (kvs_rpc_t *)tag;
        if (rpc->state == KVS_RPC_WAIT_CALL) {
            if (!ev.success) { /* the server is shutting down */
                kvs_rpc_free(rpc);
                continue;
            }
            if (!atomic_load(&srv->stopping))
                kvs_grpc_post(srv, rpc->method);
            atomic_fetch_add(&srv->inflight, 1);
            kvs_grpc_handle(srv, rpc);
        } else {
            kvs_grpc_count(srv, rpc);
            kvs_rpc_free(rpc);
            if (atomic_fetch_sub(&srv->inflight, 1) == 1)
                kvs_grpc_trim(srv);
            else
                atomic_fetch_add(&srv->calls_since_trim, 1);
        }
    }
    return NULL;
}

/* The listener admitted a connection: gRPC takes the socket over (and closes
 * it when the connection ends), with the server's channel arguments (message
 * sizes, idle timeout, memory quota). */
static void kvs_grpc_adopt(void *arg, int fd)
{
    kvs_grpc_t *srv = arg;
    grpc_server_add_channel_from_fd(srv->server, fd, srv->fd_creds);
}

/* Set up where connections come from, before the server starts.  Plaintext:
 * our listener (kvs_accept.h), bound now so that an address in use fails the
 * start, hands connections over.  TLS: gRPC 1.51 takes over a connected
 * socket only without TLS (grpc_server_add_channel_from_fd refuses other
 * credentials), so gRPC's own listener serves, with no connection cap (see
 * docs/kvstore.md "Security and limits"). */
static ri_status_t kvs_grpc_listen(kvs_grpc_t *srv, const kvs_grpc_config_t *cfg, char *err, size_t errlen)
{
    if (cfg->tls_cert_pem == NULL) {
        kvs_accept_config_t acfg = {.listen = cfg->listen,
                                    .max_conns = cfg->max_connections ? cfg->max_connections : KVS_GRPC_MAX_CONN,
                                    .fn = kvs_grpc_adopt,
                                    .arg = srv};
        srv->fd_creds = grpc_insecure_server_credentials_create();
        ri_status_t st = kvs_accept_create(&acfg, &srv->accept, err, errlen);
        srv->port = kvs_accept_port(srv->accept);
        return st;
    }
    grpc_ssl_pem_key_cert_pair pair = {.private_key = cfg->tls_key_pem, .cert_chain = cfg->tls_cert_pem};
    grpc_server_credentials *creds = grpc_ssl_server_credentials_create_ex(
        cfg->tls_ca_pem, &pair, 1,
        cfg->tls_ca_pem ? GRPC_SSL_REQUEST_AND_REQUIRE_CLIENT_CERTIFICATE_AND_VERIFY
                        : GRPC_SSL_DONT_REQUEST_CLIENT_CERTIFICATE,
        NULL);
    if (creds == NULL) {
        snprintf(err, errlen, "grpc: cannot create TLS server credentials (check tls-cert / tls-key)");
        return RI_ERR_INVALID;
    }
    srv->port = grpc_server_add_http2_port(srv->server, cfg->listen, creds);
    grpc_server_credentials_release(creds);
    if (srv->port <= 0) {
        snprintf(err, errlen, "grpc: cannot listen on %s (address in use or invalid)", cfg->listen);
        return RI_ERR_TRANSPORT;
    }
    cm_warn("grpc: with TLS, gRPC's own listener accepts: max-connections is not enforced");
    return RI_OK;
}

ri_status_t kvs_grpc_start(const kvs_grpc_config_t *cfg, kvs_grpc_t **grpc_p, char *err, size_t errlen)
{
    ri_status_t st = RI_OK;
    kvs_grpc_t *srv = NULL;
    pthread_condattr_t ca;

    if (cfg == NULL || cfg->listen == NULL || cfg->threads == 0 || cfg->methods == NULL || cfg->max_message == 0 ||
        cfg->max_message > INT32_MAX) {
        snprintf(err, errlen, "grpc: bad server configuration (threads >= 1, max-message 1..2GiB)");
        return RI_ERR_INVALID;
    }
    srv = cm_calloc(&kvs_grpc_tag, 1, sizeof(*srv));
    if (srv == NULL)
        goto err_nomem;
    srv->cfg = *cfg;
    srv->shutdown_tag.kind = KVS_TAG_SHUTDOWN;
    srv->default_tenant = cm_strdup(&kvs_grpc_tag, cfg->default_tenant ? cfg->default_tenant : "default");
    srv->handles = cm_calloc(&kvs_grpc_tag, cfg->n_methods, sizeof(void *));
    srv->calls = cm_calloc(&kvs_grpc_tag, (cfg->n_methods + 1) * KVS_GRPC_CODES, sizeof(*srv->calls));
    srv->threads = cm_calloc(&kvs_grpc_tag, cfg->threads, sizeof(pthread_t));
    srv->lat = cm_calloc(&kvs_grpc_tag, cfg->n_methods, sizeof(*srv->lat));
    if (srv->default_tenant == NULL || srv->handles == NULL || srv->calls == NULL || srv->threads == NULL ||
        srv->lat == NULL) {
        snprintf(err, errlen, "grpc: out of memory");
        st = RI_ERR_NOMEM;
        goto err_free_mem;
    }
    for (size_t m = 0; m < cfg->n_methods; m++)
        cm_hist_init(&srv->lat[m], kvs_grpc_buckets, CM_ARRAY_LEN(kvs_grpc_buckets));
    pthread_mutex_init(&srv->lock, NULL);
    pthread_rwlock_init(&srv->auth_lock, NULL);
    pthread_condattr_init(&ca);
    pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
    pthread_cond_init(&srv->cond, &ca);
    pthread_condattr_destroy(&ca);

    grpc_init();
    /* Bound what clients can make gRPC hold in memory (half-sent messages on
     * many streams): a few maximal messages, at least 64 MiB. */
    grpc_resource_quota *quota = grpc_resource_quota_create("ri-kvstore");
    grpc_resource_quota_resize(quota, (size_t)CM_MAX(KVS_GRPC_MEM_MIN, KVS_GRPC_MEM_MESSAGES * cfg->max_message));
    grpc_arg args[] = {
        {.type = GRPC_ARG_INTEGER, .key = GRPC_ARG_MAX_RECEIVE_MESSAGE_LENGTH, .value.integer = (int)cfg->max_message},
        {.type = GRPC_ARG_INTEGER,
         .key = GRPC_ARG_MAX_SEND_MESSAGE_LENGTH,
         .value.integer = (int)CM_MAX(cfg->max_message, (uint64_t)KVS_GRPC_MAX_SEND)},
        {.type = GRPC_ARG_INTEGER,
         .key = GRPC_ARG_MAX_CONNECTION_IDLE_MS,
         .value.integer = cfg->idle_timeout_ms ? (int)cfg->idle_timeout_ms : INT32_MAX},
        {.type = GRPC_ARG_INTEGER, .key = GRPC_ARG_MAX_CONCURRENT_STREAMS, .value.integer = KVS_GRPC_MAX_STREAMS},
        {.type = GRPC_ARG_POINTER,
         .key = GRPC_ARG_RESOURCE_QUOTA,
         .value.pointer = {.p = quota, .vtable = grpc_resource_quota_arg_vtable()}},
    };
    grpc_channel_args chargs = {.num_args = CM_ARRAY_LEN(args), .args = args};
    srv->server = grpc_server_create(&chargs, NULL);
    grpc_resource_quota_unref(quota); /* the server holds its own reference */
    srv->cq = grpc_completion_queue_create_for_next(NULL);
    grpc_server_register_completion_queue(srv->server, srv->cq, NULL);
    for (size_t i = 0; i < cfg->n_methods; i++) {
        srv->handles[i] = grpc_server_register_method(srv->server, cfg->methods[i].path, NULL,
                                                      GRPC_SRM_PAYLOAD_READ_INITIAL_BYTE_BUFFER, 0);
        if (srv->handles[i] == NULL) {
            snprintf(err, errlen, "grpc: cannot register %s", cfg->methods[i].path);
            st = RI_ERR_INTERNAL;
            goto err_destroy_server;
        }
    }
    st = kvs_grpc_listen(srv, cfg, err, errlen);
    if (st != RI_OK)
        goto err_destroy_server;
    grpc_server_start(srv->server);
    for (size_t i = 0; i < cfg->n_methods; i++)
        for (unsigned k = 0; k < cfg->threads * KVS_GRPC_POST_PER_THREAD; k++)
            kvs_grpc_post(srv, (int)i);
    for (unsigned k = 0; k < cfg->threads; k++)
        kvs_grpc_post(srv, -1);
    for (unsigned k = 0; k < cfg->threads; k++) {
        int rc = pthread_create(&srv->threads[k], NULL, kvs_grpc_thread, srv);
        if (rc != 0) {
            snprintf(err, errlen, "grpc: cannot start serving thread: %s", strerror(rc));
            st = cm_status_from_errno(rc);
            *grpc_p = srv;  /* destroy joins the threads already started */
            kvs_grpc_destroy(srv);
            *grpc_p = NULL;
            return st;
        }
        srv->n_threads++;
    }
    if (srv->accept != NULL) {
        st = kvs_accept_start(srv->accept);
        if (st != RI_OK) {
            snprintf(err, errlen, "grpc: cannot start the accept thread");
            kvs_grpc_destroy(srv);
            return st;
        }
    }
    *grpc_p = srv;
    return RI_OK;

err_destroy_server:
    /* Never started and no listener bound: the core allows a plain destroy. */
    kvs_accept_destroy(srv->accept);
    if (srv->fd_creds != NULL)
        grpc_server_credentials_release(srv->fd_creds);
    grpc_server_destroy(srv->server);
    grpc_completion_queue_shutdown(srv->cq);
    while (grpc_completion_queue_next(srv->cq, gpr_inf_future(GPR_CLOCK_MONOTONIC), NULL).type != GRPC_QUEUE_SHUTDOWN)
        ;
    grpc_completion_queue_destroy(srv->cq);
    grpc_shutdown();
    pthread_cond_destroy(&srv->cond);
    pthread_rwlock_destroy(&srv->auth_lock);
    pthread_mutex_destroy(&srv->lock);
err_free_mem:
    cm_free(srv->lat);
    cm_free(srv->threads);
    cm_free(srv->calls);
    cm_free(srv->handles);
    cm_free(srv->default_tenant);
    cm_free(srv);
    return st;
err_nomem:
    snprintf(err, errlen, "grpc: out of memory");
    return RI_ERR_NOMEM;
}

kvs_auth_t *kvs_grpc_swap_auth(kvs_grpc_t *srv, kvs_auth_t *auth)
{
    pthread_rwlock_wrlock(&srv->auth_lock);
    kvs_auth_t *old = srv->cfg.auth;
    srv->cfg.auth = auth;
    pthread_rwlock_unlock(&srv->auth_lock);
    return old;
}

int kvs_grpc_port(const kvs_grpc_t *grpc)
{
    return grpc ? grpc->port : -1;
}

/* Wait until the shutdown tag arrived or deadline_ns (monotonic) passed. */
static bool kvs_grpc_wait_done(kvs_grpc_t *srv, uint64_t deadline_ns)
{
    struct timespec ts = {.tv_sec = (time_t)(deadline_ns / 1000000000u), .tv_nsec = (long)(deadline_ns % 1000000000u)};
    pthread_mutex_lock(&srv->lock);
    while (!srv->shutdown_done) {
        if (pthread_cond_timedwait(&srv->cond, &srv->lock, &ts) != 0 && cm_time_ns() >= deadline_ns)
            break;
    }
    bool done = srv->shutdown_done;
    pthread_mutex_unlock(&srv->lock);
    return done;
}

unsigned kvs_grpc_shutdown(kvs_grpc_t *srv, uint32_t timeout_ms)
{
    unsigned cancelled = 0;
    if (srv == NULL)
        return 0;
    pthread_mutex_lock(&srv->lock);
    bool started = srv->shutdown_started;
    srv->shutdown_started = true;
    pthread_mutex_unlock(&srv->lock);
    if (started)
        return 0;

    atomic_store(&srv->stopping, true);
    /* No connection is handed to a server that is shutting down. */
    kvs_accept_stop(srv->accept);
    grpc_server_shutdown_and_notify(srv->server, srv->cq, &srv->shutdown_tag);
    /* The core's shutdown tag also waits for idle client connections to go
     * away, which clients may keep open for long.  So wait only for our own
     * calls to finish (bounded), then cut what is left. */
    uint64_t deadline = cm_time_ns() + (uint64_t)timeout_ms * 1000000u;
    unsigned idle_polls = 0;
    while (!kvs_grpc_wait_done(srv, CM_MIN(deadline, cm_time_ns() + 5000000u))) {
        /* idle for 20 ms in a row: nothing was in the queue either */
        idle_polls = atomic_load(&srv->inflight) == 0 ? idle_polls + 1 : 0;
        if (idle_polls >= 4 || cm_time_ns() >= deadline)
            break;
    }
    if (!kvs_grpc_wait_done(srv, cm_time_ns())) {
        cancelled = atomic_load(&srv->inflight);
        if (cancelled > 0)
            cm_warn("grpc: %u call(s) still running after %u ms; cancelling them", cancelled, timeout_ms);
        grpc_server_cancel_all_calls(srv->server);
        if (!kvs_grpc_wait_done(srv, cm_time_ns() + 5000000000ull)) {
            /* The core did not finish; leave the server allocated rather than
             * destroy it under running calls. */
            cm_error("grpc: shutdown did not complete; leaving the server to process exit");
            return cancelled;
        }
    }
    grpc_server_destroy(srv->server);
    srv->server_destroyed = true;
    grpc_completion_queue_shutdown(srv->cq);
    for (unsigned k = 0; k < srv->n_threads; k++)
        pthread_join(srv->threads[k], NULL);
    srv->threads_joined = true;
    return cancelled;
}

void kvs_grpc_destroy(kvs_grpc_t *srv)
{
    if (srv == NULL)
        return;
    kvs_grpc_shutdown(srv, 1000);
    if (!srv->threads_joined)
        return; /* see kvs_grpc_shutdown: unsafe to free */
    grpc_completion_queue_destroy(srv->cq);
    kvs_accept_destroy(srv->accept);
    if (srv->fd_creds != NULL)
        grpc_server_credentials_release(srv->fd_creds);
    grpc_shutdown();
    pthread_cond_destroy(&srv->cond);
    pthread_rwlock_destroy(&srv->auth_lock);
    pthread_mutex_destroy(&srv->lock);
    cm_free(srv->lat);
    cm_free(srv->threads);
    cm_free(srv->calls);
    cm_free(srv->handles);
    cm_free(srv->default_tenant);
    cm_free(srv);
}

void kvs_grpc_metrics_write(kvs_grpc_t *srv, FILE *out)
{
    fprintf(out, "# HELP ri_kvs_grpc_calls_total Control API calls answered, by method and gRPC status code.\n");
    fprintf(out, "# TYPE ri_kvs_grpc_calls_total counter\n");
    for (size_t m = 0; m <= srv->cfg.n_methods; m++) {
        const char *name = m < srv->cfg.n_methods ? srv->cfg.methods[m].name : "unknown";
        for (int c = 0; c < KVS_GRPC_CODES; c++) {
            uint64_t v = atomic_load(&srv->calls[m * KVS_GRPC_CODES + (size_t)c]);
            if (v != 0 || c == 0)
                fprintf(out, "ri_kvs_grpc_calls_total{method=\"%s\",code=\"%s\"} %llu\n", name,
                        kvs_grpc_code_names[c], (unsigned long long)v);
        }
    }
    fprintf(out, "# HELP ri_kvs_grpc_auth_failures_total Calls refused for a missing or unknown token.\n");
    fprintf(out, "# TYPE ri_kvs_grpc_auth_failures_total counter\n");
    fprintf(out, "ri_kvs_grpc_auth_failures_total %llu\n", (unsigned long long)atomic_load(&srv->auth_failures));
    fprintf(out, "# HELP ri_kvs_grpc_bad_messages_total Requests whose protobuf could not be parsed.\n");
    fprintf(out, "# TYPE ri_kvs_grpc_bad_messages_total counter\n");
    fprintf(out, "ri_kvs_grpc_bad_messages_total %llu\n", (unsigned long long)atomic_load(&srv->bad_messages));
    if (srv->accept != NULL)
        kvs_accept_metrics_write(srv->accept, out);
    fprintf(out, "# HELP ri_kvs_grpc_heap_trims_total Times freed heap memory was given back after a burst of calls.\n"
                 "# TYPE ri_kvs_grpc_heap_trims_total counter\nri_kvs_grpc_heap_trims_total %llu\n",
            (unsigned long long)atomic_load(&srv->trims));
    fprintf(out, "# HELP ri_kvs_grpc_inflight Calls being handled or answered now.\n");
    fprintf(out, "# TYPE ri_kvs_grpc_inflight gauge\n");
    fprintf(out, "ri_kvs_grpc_inflight %u\n", atomic_load(&srv->inflight));
    fprintf(out, "# HELP ri_kvs_grpc_handler_seconds_total Time spent in control API handlers.\n");
    fprintf(out, "# TYPE ri_kvs_grpc_handler_seconds_total counter\n");
    fprintf(out, "ri_kvs_grpc_handler_seconds_total %.6f\n", (double)atomic_load(&srv->handler_ns) / 1e9);
    fprintf(out, "# HELP ri_kvs_grpc_handler_seconds Handler latency by method (parse, act, pack).\n");
    fprintf(out, "# TYPE ri_kvs_grpc_handler_seconds histogram\n");
    for (size_t m = 0; m < srv->cfg.n_methods; m++) {
        char labels[128];
        snprintf(labels, sizeof(labels), "method=\"%s\"", srv->cfg.methods[m].name);
        cm_hist_write_prom(&srv->lat[m], out, "ri_kvs_grpc_handler_seconds", NULL, labels);
    }
}
