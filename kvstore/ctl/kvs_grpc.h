/*
 * The gRPC server of ri-kvstore: C core, one completion queue served by N
 * threads, unary methods registered up front (their request message read by
 * the core before we are notified) and a generic request so that unknown
 * methods get UNIMPLEMENTED at once instead of hanging.  Handlers are short and
 * synchronous (they call kvs_data_*), so a serving thread runs one to the end
 * and then starts one batch that sends the reply and the status.
 *
 * Plaintext connections come from our own listener (kvs_accept.h), which caps
 * them at max_connections and survives running out of descriptors; gRPC 1.51
 * can take over a connected socket only without TLS, so with TLS gRPC's own
 * listener serves and the cap is not enforced (see kvs_grpc_start).
 *
 * Authentication happens here, before a handler runs: methods marked
 * needs_auth get the caller's tenant from the `authorization: Bearer` metadata
 * (or the default tenant when no tokens file is configured).
 */
#ifndef KVS_GRPC_H
#define KVS_GRPC_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "kvstore/ctl/kvs_auth.h"
#include "retroinfer/status.h"

/* Who is calling; tenant is "" for methods that need no token. */
typedef struct kvs_caller {
    const char *tenant;  /* valid for the duration of the handler */
    bool admin;          /* may call administrative methods (Drain) */
} kvs_caller_t;

/* A handler's answer: on RI_OK the serialized response (buf from cm_malloc,
 * taken over by the server; NULL with len 0 for an empty message); on an error
 * the message sent as the gRPC status details. */
typedef struct kvs_reply {
    uint8_t *buf;    /* response bytes, owned by the server once returned */
    size_t len;      /* their length */
    char msg[256];   /* error message for the client */
} kvs_reply_t;

/* A unary method: parse req (len bytes, borrowed), act, fill reply. */
typedef ri_status_t (*kvs_method_fn_t)(void *app, const kvs_caller_t *caller, const uint8_t *req, size_t len,
                                       kvs_reply_t *reply);

typedef struct kvs_method {
    const char *name;    /* short name for metrics ("Health") */
    const char *path;    /* full gRPC path ("/retroinfer.v1.KvStore/Health") */
    bool needs_auth;     /* false only for Health */
    kvs_method_fn_t fn;  /* the handler */
} kvs_method_t;

typedef struct kvs_grpc_config {
    const char *listen;             /* "host:port"; port 0 = ephemeral */
    unsigned threads;               /* serving threads, >= 1 */
    uint64_t max_message;           /* receive limit, bytes (replies may be up to KVS_GRPC_MAX_SEND) */
    kvs_auth_t *auth;               /* borrowed until swapped out; NULL = single-tenant mode */
    const char *default_tenant;     /* tenant when auth is NULL */
    const kvs_method_t *methods;    /* borrowed, static */
    size_t n_methods;
    void *app;                      /* passed to every handler */
    const char *tls_cert_pem;       /* server certificate chain (PEM text); NULL = plaintext */
    const char *tls_key_pem;        /* its private key (PEM text) */
    const char *tls_ca_pem;         /* client CA (PEM text): require and verify client certificates; NULL = no */
    bool admin_without_tokens;      /* auth NULL: callers are admins (else no caller is) */
    uint32_t idle_timeout_ms;       /* close client connections idle this long; 0 = never */
    uint32_t max_connections;       /* client connections held at once (plaintext; see kvs_accept.h) */
} kvs_grpc_config_t;

/* Largest reply: ListSessions of a full session table fits with room. */
#define KVS_GRPC_MAX_SEND (16u << 20)

typedef struct kvs_grpc kvs_grpc_t;

/* Bind, register the methods and start the serving threads.  Errors
 * (RI_ERR_INVALID, RI_ERR_TRANSPORT when the address cannot be bound) carry a
 * message in err.  Caller destroys with kvs_grpc_destroy. */
ri_status_t kvs_grpc_start(const kvs_grpc_config_t *cfg, kvs_grpc_t **grpc_p, char *err, size_t errlen);

/* Replace the tokens (e.g. after the tokens file changed): calls that start
 * after this see only the new ones.  Takes ownership of auth (non-NULL; the
 * server must have been started with tokens) and returns the previous object,
 * which no call uses any more: the caller destroys it. */
kvs_auth_t *kvs_grpc_swap_auth(kvs_grpc_t *grpc, kvs_auth_t *auth);

/* The bound port (useful when the configured port was 0). */
int kvs_grpc_port(const kvs_grpc_t *grpc);

/* Stop accepting calls, let in-flight calls finish for up to timeout_ms, then
 * cancel the rest.  Returns the number of calls that had to be cancelled.
 * Idempotent. */
unsigned kvs_grpc_shutdown(kvs_grpc_t *grpc, uint32_t timeout_ms);

/* Shut down (if not yet, with a 1 s bound), join threads and free.  NULL is a no-op. */
void kvs_grpc_destroy(kvs_grpc_t *grpc);

/* Calls by method and status code, auth failures, in-flight calls, as
 * Prometheus text. */
void kvs_grpc_metrics_write(kvs_grpc_t *grpc, FILE *out);

/* The gRPC status code (grpc_status_code value) for one of our statuses. */
int kvs_grpc_code_from_status(ri_status_t st);

#endif /* KVS_GRPC_H */
