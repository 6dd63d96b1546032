/*
 * ri-worker's HTTP service: the part of OpenAI's API that every client
 * library speaks, on libmicrohttpd (docs/worker.md "HTTP service").
 *
 *   POST /v1/completions, POST /v1/chat/completions   (stream or not)
 *   GET  /v1/models, /v1/models/{id}, /health, /metrics (Prometheus text)
 *
 * Each connection has its own thread (libmicrohttpd's thread-per-connection
 * mode), which validates and tokenizes the request, submits it to the
 * scheduler (gw_sched.h) and waits for its text: a generation takes seconds,
 * so a blocked thread per request is simpler than suspending connections
 * and costs little at the few dozen connections this serves.  The model
 * itself runs only on the scheduler's thread.
 *
 * Slow clients cannot hold every connection: gw_http_guard.h bounds the
 * time a request may take to arrive and keeps a reserve of slots.
 *
 * With API keys (cfg.keys), every endpoint but /health wants
 * "Authorization: Bearer KEY" and answers 401 otherwise.
 *
 * Bad requests get a 4xx with OpenAI's error body {"error": {"message",
 * "type", "param", "code"}}; a full queue 429 and a draining worker 503,
 * both with Retry-After.
 */
#ifndef GW_HTTP_H
#define GW_HTTP_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "common/cm_keys.h"
#include "gpuworker/model/mdl_model.h"
#include "gpuworker/server/gw_sched.h"
#include "retroinfer/status.h"

typedef struct gw_http gw_http_t;

typedef struct gw_http_cfg {
    const char *listen;          /* "host:port", numeric IPv4/IPv6 host; port 0 = any free port (copied) */
    const char *model_id;        /* the id clients name in "model" and /v1/models lists (copied) */
    const char *default_attn;    /* backend of a request that names none (registered) */
    const char *allow_attn;      /* comma-separated backends a request's "attn" may name (copied) */
    size_t ctx;                  /* prompt + max_tokens must fit in this many tokens */
    size_t default_max_tokens;   /* for a request without max_tokens (cut to what the context leaves) */
    unsigned max_conn;           /* connections (and their threads) at once, reserve included */
    unsigned reserve_conn;       /* of them, kept for short requests such as /health (gw_http_guard.h) */
    unsigned max_conn_per_addr;  /* regular connections of one client address */
    uint32_t request_ms;         /* a request (headers + body) must arrive within this */
    bool kvstore;                /* export the retroinfer-remote backend's counters */
    struct gw_pfx_stats *prefix; /* export prefix reuse's counters (borrowed, outlives the
                                    service); NULL = off */
    cm_keys_t *keys;             /* API keys every endpoint but /health requires (ownership taken by
                                    gw_http_start, also when it fails); NULL = no authentication */
} gw_http_cfg_t;

/* Listen and serve.  m and s are borrowed and must outlive the server.
 * Errors: RI_ERR_INVALID (bad listen address, unknown default backend),
 * RI_ERR_TRANSPORT (cannot listen), RI_ERR_NOMEM; err says which.  Caller
 * frees with gw_http_destroy. */
ri_status_t gw_http_start(const gw_http_cfg_t *cfg, mdl_model_t *m, gw_sched_t *s, gw_http_t **h_p, char *err,
                          size_t errlen);

/* The bound address, "host:port" (borrowed, valid while h lives). */
const char *gw_http_address(const gw_http_t *h);

/* The backends a request may choose: allow_attn less those not
 * registered (borrowed, valid while h lives). */
const char *gw_http_allowed(const gw_http_t *h);

/* Replace the API keys (a reloaded keys file): takes ownership of keys;
 * requests that arrive from now on are checked against them.  Keys can be
 * replaced but not removed: NULL is refused (RI_ERR_INVALID) when the
 * server was started with keys, and a server started without keys stays
 * without (RI_ERR_INVALID too; keys is freed in both cases). */
ri_status_t gw_http_set_keys(gw_http_t *h, cm_keys_t *keys);

/* Stop listening, wait for every connection's thread and free.  Drain the
 * scheduler first, so that no connection still waits for text.  NULL is a
 * no-op. */
void gw_http_destroy(gw_http_t *h);

#endif /* GW_HTTP_H */
