/*
 * libretroinfer: the public C API of the RetroInfer worker library.
 *
 * An inference engine keeps its own K/V cache (fp16, post-RoPE keys) and uses
 * this library for the attention of decode steps: per sequence and layer the
 * library builds the wave index (docs/architecture.md), uploads the clusters' K/V to
 * a ri-kvstore daemon, and answers each decode step with tripartite attention
 * (steady zone + retrieved clusters exactly, estimated clusters by their
 * centroids) through a small block cache that the kvstore manages.
 *
 *   ri_client_params_t cp;  ri_client_params_init(&cp);  cp.address = "127.0.0.1:7070";
 *   ri_client_h c;          ri_client_connect(&cp, &c);
 *   ri_session_params_t sp; ri_session_params_init(&sp);  sp.n_layers = ...;
 *   ri_session_h s;         ri_session_create(c, &sp, &s);
 *   for each layer: ri_prefill(s, layer, &kv[layer]);      // index + upload (async)
 *   ri_prefill_wait(s);
 *   per decode step, for each layer (new token's K/V already in kv):
 *       ri_decode(&s, 1, layer, q, &kv[layer], out);
 *   (or, keeping no K/V in the engine: ri_prefill_kept once per layer, then
 *    ri_decode_token with only the new token's K/V; see below)
 *   ri_session_close(s);  ri_client_close(c);
 *
 * Conventions.
 *  - Every call returns ri_status_t (include/retroinfer/status.h): RI_OK or a
 *    negative error; ri_status_str() names it and ri_last_error() gives the
 *    detail of the calling thread's last failure (addresses, server text).
 *  - Parameter structs start with struct_size: set it with the *_init
 *    function (or to sizeof); the library reads only the fields that the
 *    caller's version has, so old callers keep working when fields are added.
 *  - Output pointers (last parameters, suffix _p) are written only on success.
 *  - Handles are opaque; *_close(NULL) is a no-op.
 *
 * Thread safety.  A client may be shared by threads (session create/close
 * from several threads at once).  A session is used by one thread at a time;
 * different sessions may be used concurrently from different threads.
 * ri_decode over a batch uses each session of the batch from the calling
 * thread.  Compute threads: every CPU unless ri_set_threads (or
 * ri_config_from_env with RI_THREADS) says otherwise.
 *
 * K/V layout (ri_kv_view_t): fp16 bits; the row of token t, KV head h starts
 * at k + t * token_stride + h * head_stride (elements).  Views are borrowed
 * for the duration of a call; the library keeps no pointer into them.
 */
#ifndef RETROINFER_RETROINFER_H
#define RETROINFER_RETROINFER_H

#include <stddef.h>
#include <stdint.h>

#include "retroinfer/status.h"

#ifdef __cplusplus
extern "C" {
#endif

/* 2: ri_prefill_kept / ri_decode_token (the engine hands each token's K/V
 *    over once and keeps none), ri_session_indexed_end (an engine that keeps
 *    its K/V may free what the kvstore holds), ri_session_recover with kv
 *    NULL, direct-read counters in the stats.
 * 3: ri_session_params_t.flags (RI_SESSION_*: two-sided reads, fetch on the
 *    io thread, no prediction), ri_session_params_get (the settings a
 *    session runs with, the auto cluster size resolved).
 * 4: ri_set_threads, ri_set_log_level, ri_config_from_env (the library no
 *    longer reads RI_THREADS / RI_LOG_LEVEL by itself).
 * 5: prefix reuse: ri_session_params_t.block_tokens and .prefix_tokens, ri_session_attach_prefix,
 *    ri_session_prefix_tokens, ri_session_prefix_kv. */
#define RI_API_VERSION 5

/* The API version the library was built with (RI_API_VERSION). */
int ri_api_version(void);

/* ------------------------------------------------------ process settings
 *
 * The library reads nothing from the environment on its own: a host process
 * (a Python interpreter, a server with its own configuration) owns its
 * environment, and a setting picked up behind its back at some first use is
 * hard to see or test.  A program passes the settings it wants with the
 * setters, or calls ri_config_from_env once to keep the RI_* variable names
 * documented before (one explicit line instead of an implicit read).  Call
 * these at start-up, before the first client. */

/* Compute threads of the library's pool, the calling thread included
 * (0 = every CPU).  RI_ERR_BUSY once the pool runs with another size. */
ri_status_t ri_set_threads(uint32_t threads);

/* Log level: "error", "warn", "info" (default), "debug" or "trace".
 * RI_ERR_INVALID for another word (the level is left as it is). */
ri_status_t ri_set_log_level(const char *level);

/* Read RI_THREADS, RI_LOG_LEVEL, RI_KERNELS (ref|cpu|cuda) and
 * RI_KERNELS_NO_SIMD from the environment and apply them as the setters
 * above.  RI_ERR_INVALID / RI_ERR_RANGE for a bad value, RI_ERR_BUSY as
 * ri_set_threads; ri_last_error names the variable. */
ri_status_t ri_config_from_env(void);

/* Detail of the calling thread's last failed call ("" when none); valid
 * until the thread's next call into the library. */
const char *ri_last_error(void);

/* ---------------------------------------------------------------- client */

typedef struct ri_client *ri_client_h;

typedef struct ri_client_params {
    size_t struct_size;        /* sizeof(ri_client_params_t) */
    const char *address;       /* ri-kvstore gRPC address "host:port"; required */
    const char *token;         /* bearer token of the tenant, or NULL (single-tenant daemons) */
    uint32_t timeout_ms;       /* deadline of each control call and data-plane round trip (0 = 5000) */
    /* TLS of the control connection (fields added in API version 1; a caller
     * whose struct_size ends before them gets plaintext).  tls_ca_file NULL
     * or "": plaintext.  Set: the daemon's certificate must be signed by
     * this PEM CA bundle.  tls_cert_file + tls_key_file (PEM, both or
     * neither): a client certificate for a daemon that requires mutual TLS.
     * The files are read during ri_client_connect. */
    const char *tls_ca_file;
    const char *tls_cert_file;
    const char *tls_key_file;
} ri_client_params_t;

/* Fill defaults and struct_size. */
void ri_client_params_init(ri_client_params_t *params);

/* Connect to a kvstore and check it answers (Health).  The strings are
 * copied.  Errors: RI_ERR_INVALID (no address), RI_ERR_UNREACHABLE (nothing
 * listens there; ri_last_error names the address), RI_ERR_TIMEOUT,
 * RI_ERR_UNAUTHENTICATED, RI_ERR_NOMEM.  Caller closes with ri_client_close. */
ri_status_t ri_client_connect(const ri_client_params_t *params, ri_client_h *client_p);

/* Close the connection.  Every session of the client must be closed first. */
void ri_client_close(ri_client_h client);

/* --------------------------------------------------------------- session */

typedef struct ri_session *ri_session_h;

typedef struct ri_session_params {
    size_t struct_size;         /* sizeof(ri_session_params_t) */
    /* model geometry (required) */
    uint32_t n_layers;          /* layers */
    uint32_t n_q_heads;         /* query heads; a multiple of n_kv_heads */
    uint32_t n_kv_heads;        /* KV heads */
    uint32_t head_dim;          /* d */
    float scale;                /* logit scale; 0 = 1/sqrt(d) */
    /* wave index (defaults in docs/architecture.md) */
    uint32_t sink_tokens;       /* 4 */
    uint32_t window_tokens;     /* 64 */
    uint32_t tokens_per_cluster;/* 0 = auto: 4 while the prompt's indexed range is at
                                   most 16K tokens, 8 up to 32K, 16 beyond; the index keeps
                                   the size its first clustering chose
                                   (ri_session_params_get tells it; docs/architecture.md) */
    uint32_t update_tokens;     /* 1024: tokens clustered per decode-time update */
    uint32_t update_clusters;   /* 0 = update_tokens / tokens per cluster */
    float retrieval_frac;       /* 0.018 */
    float estimation_frac;      /* 0.232 */
    /* wave buffer */
    float cache_frac;           /* block cache, share of the sequence's pages (0.05) */
    uint32_t cache_pages;       /* fixed block cache size in 8-token pages (0 = cache_frac) */
    /* kvstore */
    uint64_t expected_tokens;   /* sizing hint for the kvstore (0 = 8192) */
    const char *label;          /* shown by ri-ctl sessions; may be NULL */
    /* appended (read only when struct_size covers it) */
    uint32_t deadline_us;       /* a layer-step waits at most this for the kvstore's misses;
                                   late ones are attended through their centroid estimate
                                   and counted (0 = always wait: exact) */
    uint32_t retrieval_min_tokens; /* floor of the retrieval zone in tokens (256):
                                   the share alone starves short contexts */
    uint32_t estimation_min_tokens;/* floor of the estimation zone in tokens (0) */
    float adapt_tau;            /* output-aware per-head retrieval (0 = off): each KV
                                   head keeps the fewest of 2R ranked clusters that
                                   leave at most this share of their estimated mass
                                   to the estimation zone */
    /* appended in API version 3 */
    uint32_t flags;             /* RI_SESSION_* bits; 0 = the defaults */
    /* appended in API version 5 */
    uint32_t block_tokens;      /* B, tokens per prefix block and the index build's segment
                                   (block b = positions [b*B, (b+1)*B)); 0 = 256 */
    uint64_t prefix_tokens;     /* tokens the session will attach as prefix blocks
                                   (ri_session_attach_prefix), a hint: the kvstore then
                                   reserves memory for expected_tokens - prefix_tokens of
                                   the session's own (the attached blocks are held once,
                                   for every session that attaches them); 0 = none */
} ri_session_params_t;

/* ri_session_params_t.flags.  The library reads no environment variable for
 * these: a program that wants them configurable maps its own onto them. */
#define RI_SESSION_TWO_SIDED 0x1u   /* request every retrieved cluster from the kvstore, even
                                       where its memory could be read in place (same host) */
#define RI_SESSION_FETCH_ASYNC 0x2u /* fetch on the session's io thread while the estimation
                                       zone is computed (default: on the caller's thread first) */
#define RI_SESSION_NO_PREDICT 0x4u  /* wait for every fetch, even when the worker's mirror of
                                       its cache says every retrieved cluster is there */

/* Fill defaults (geometry 0) and struct_size. */
void ri_session_params_init(ri_session_params_t *params);

/* Create a kvstore session (CreateSession) and connect its data plane.
 * Errors: RI_ERR_INVALID (geometry), RI_ERR_QUOTA, control-plane and
 * transport errors (ri_last_error has the detail).  Caller closes with
 * ri_session_close. */
ri_status_t ri_session_create(ri_client_h client, const ri_session_params_t *params, ri_session_h *session_p);

/* Drop the session at the kvstore (best effort) and free it. */
void ri_session_close(ri_session_h session);

/* The settings session runs with: those it was created with (defaults for
 * what the caller's struct_size did not cover), tokens_per_cluster and
 * update_clusters as its index resolved them once layer 0 is indexed (the
 * auto size: 0 before), label NULL.  params_p->struct_size must be set;
 * only that much of *params_p is written.  Errors: RI_ERR_INVALID. */
ri_status_t ri_session_params_get(ri_session_h session, ri_session_params_t *params_p);

typedef struct ri_kv_view {
    size_t struct_size;         /* sizeof(ri_kv_view_t) */
    const uint16_t *k;          /* fp16 keys (post-RoPE), row of token 0, KV head 0 */
    const uint16_t *v;          /* fp16 values, same layout */
    size_t n_tokens;            /* tokens in the sequence so far */
    size_t token_stride;        /* elements from token t to t+1 */
    size_t head_stride;         /* elements from KV head h to h+1 */
} ri_kv_view_t;

/* After the prompt's K/V of layer is complete: build the layer's wave index
 * over tokens [sink, n - window) and queue the upload of its clusters; the
 * upload of layer i overlaps the build of layer i+1.  Once per layer.
 * Prompts shorter than sink + window + update_tokens index nothing (decode
 * is exact until the first update).  Errors: RI_ERR_INVALID (layer, view,
 * called twice), RI_ERR_NOMEM, an earlier upload's transport error. */
ri_status_t ri_prefill(ri_session_h session, uint32_t layer, const ri_kv_view_t *kv);

/* Wait until every queued upload of the session has reached the kvstore.
 * Returns the first upload error, if any.  (ri_decode waits by itself.) */
ri_status_t ri_prefill_wait(ri_session_h session);

/* One decode step of one layer for a batch of n sessions: for session b,
 * q [b][n_q_heads][head_dim] (fp32) -> out [b][n_q_heads][head_dim]; kv[b]
 * covers every token so far, the new one included.  Every update_tokens
 * generated tokens the step first clusters the oldest steady tokens and
 * appends them to the kvstore.  All ranked fetches of the batch are in
 * flight together while the estimation zones are computed.  Errors:
 * RI_ERR_INVALID, RI_ERR_CONN_RESET / RI_ERR_TIMEOUT (kvstore gone or
 * silent: within the client's timeout_ms; the session is then broken until
 * ri_session_recover), RI_ERR_PROTOCOL.  On error, outputs of the batch are
 * unspecified. */
ri_status_t ri_decode(ri_session_h const *sessions, size_t n, uint32_t layer, const float *q,
                      const ri_kv_view_t *kv, float *out);

/*
 * An engine that keeps no K/V of its own: hand the library the prompt's K/V
 * once per layer (ri_prefill_kept, in place of ri_prefill; the library
 * copies it and the engine may free its copy on return), then at each decode
 * step only the new token's K/V (ri_decode_token, in place of ri_decode:
 * new_kv[b] covers one token, n_tokens = 1, laid out as any view).  The
 * session keeps the steady zone (sinks and the tokens not yet clustered) and
 * gives back the rest once the kvstore holds it; ri_session_stats'
 * resident_bytes counts what it keeps.  Capacity: the session's
 * expected_tokens (RI_ERR_RANGE past it).  A session is used either this
 * way or with ri_prefill / ri_decode (RI_ERR_INVALID when mixed), and it
 * recovers only by re-attaching (ri_session_recover ignores kv for it).
 */
ri_status_t ri_prefill_kept(ri_session_h session, uint32_t layer, const ri_kv_view_t *kv);
ri_status_t ri_decode_token(ri_session_h const *sessions, size_t n, uint32_t layer, const float *q,
                            const ri_kv_view_t *new_kv, float *out);

/* Re-create a broken session on the client's kvstore (a new CreateSession:
 * a daemon that restarted has lost the old one) and re-fill it from the
 * caller's K/V: kv[layer] for every layer, as passed to ri_decode.  The
 * index is kept, so decoding continues with the same results.  When the
 * kvstore was restarted with --recover and lists our session whole (every
 * cluster we uploaded: a clean stop), the session re-attaches to it instead
 * and uploads nothing (ri_session_stats_t.reattached counts it).  Errors as
 * ri_session_create; the session stays broken on failure and the call may
 * be repeated (e.g. until the daemon is back).  kv NULL (an engine that
 * freed the indexed tokens, see ri_session_indexed_end): re-attach only;
 * RI_ERR_LOST when that is not possible, and the engine rebuilds the
 * sequence by prefilling its tokens again into a new session. */
ri_status_t ri_session_recover(ri_session_h session, const ri_kv_view_t *kv);

/* First token after layer's indexed range: tokens [sink_tokens, *end_p)
 * are clustered, their K/V copied out (to the kvstore) when ri_prefill or
 * ri_decode returned, and the library never reads them from the engine's
 * views again (only ri_session_recover's re-fill would).  An engine may
 * free them: the steady zone (the sinks and the tokens from *end_p on) is
 * all the views must still hold.  Grows at prefill and every update_tokens
 * decode steps. */
ri_status_t ri_session_indexed_end(ri_session_h session, uint32_t layer, size_t *end_p);

/*
 * Prefix reuse (docs/prefix.md, docs/worker.md).  A document prefilled
 * once serves every later session that starts with it: its leading blocks
 * of block_tokens tokens are published to the kvstore as immutable
 * per-tenant objects under 32-byte keys (ri-worker computes and publishes
 * them; the key rule is in docs/prefix.md), and a new session attaches
 * them instead of uploading their clusters again:
 *
 *   ri_session_create(c, &sp, &s);
 *   ri_session_attach_prefix(s, keys, n_keys, &n_att);   // before any prefill
 *   cached = n_att * block_tokens;
 *   for each layer and KV head: ri_session_prefix_kv(s, layer, h, 0, cached, k, v, stride);
 *   the engine computes positions [cached, n) itself, then per layer:
 *   ri_prefill(s, layer, &kv[layer]);                    // kv covers [0, n)
 *
 * ri_prefill of a layer then imports the attached blocks' wave-index
 * pieces (no clustering of those tokens) and uploads only the new
 * clusters; decode reads the blocks' clusters where the kvstore keeps them
 * (in place on its host), exactly as the session's own, and the block
 * cache (cache_frac) counts them.  The session holds no copy of the
 * attached clusters: the kvstore keeps one per tenant, referenced until
 * the session closes.  Blocks lie wholly inside the indexed range: at
 * most floor((n - window_tokens) / block_tokens) of a prompt of n tokens.
 */

/* Attach the leading blocks of keys (n_keys x 32 bytes, block order) that
 * the client's tenant holds, on the session's data-plane connection, and
 * read them (mapped on the kvstore's host, else copied).  Only before the
 * session's first prefill, once.  *n_attached_p: how many (0 when the first
 * key is not cached; the session is then as before).  The blocks must have
 * been published for the session's geometry, block_tokens, sink_tokens and
 * page size (a worker with the same settings).  Errors: RI_ERR_INVALID
 * (after a prefill, called twice, n_keys 0 or > 65536), a block of another
 * geometry (RI_ERR_INVALID / RI_ERR_PROTOCOL / RI_ERR_CORRUPT) or a
 * transport error: the session is then broken (close it and start
 * another, without the prefix). */
ri_status_t ri_session_attach_prefix(ri_session_h session, const uint8_t *keys, uint32_t n_keys,
                                     uint32_t *n_attached_p);

/* Tokens [0, *n_p) the attached blocks hold (0 when none). */
ri_status_t ri_session_prefix_tokens(ri_session_h session, size_t *n_p);

/* The attached blocks' K and V (fp16 bits, post-RoPE as published) of
 * positions [pos0, pos0 + n) of (layer, kv_head) into k and v: the row of
 * position p at k + (p - pos0) * token_stride (elements).  For an engine
 * that keeps its own K/V cache: it preloads these instead of recomputing
 * them.  Only until every layer's ri_prefill: once all of them imported
 * the blocks, the session gives its parse of them back (a sequence would
 * otherwise hold it, 4 bytes a token and KV head, for its whole life).
 * Errors: RI_ERR_INVALID (no blocks, every layer prefilled, bad layer /
 * head / stride), RI_ERR_RANGE (past the blocks). */
ri_status_t ri_session_prefix_kv(ri_session_h session, uint32_t layer, uint32_t kv_head, size_t pos0, size_t n,
                                 uint16_t *k, uint16_t *v, size_t token_stride);

/* RI_OK while the session is healthy, else the error that broke it. */
ri_status_t ri_session_status(ri_session_h session);

typedef struct ri_session_stats {
    size_t struct_size;         /* sizeof(ri_session_stats_t), set by the caller */
    uint64_t steps;             /* layer-steps decoded */
    uint64_t hits;              /* retrieved clusters served by the block cache */
    uint64_t misses;            /* retrieved clusters sent by the kvstore */
    uint64_t fetched_bytes;     /* bytes the kvstore sent for misses */
    uint64_t uploaded_bytes;    /* cluster bytes uploaded (prefill, updates, recover) */
    uint64_t exact_tokens;      /* tokens attended exactly, summed over layers and KV heads */
    uint32_t cache_pages;       /* block cache capacity (0 before the first decode) */
    uint32_t recoveries;        /* successful ri_session_recover calls */
    double build_s;             /* seconds building indexes */
    double fetch_wait_s;        /* seconds decode waited for the kvstore */
    uint64_t session_id;        /* the kvstore's id of the current session */
    /* appended (written only when struct_size covers them) */
    uint64_t late_steps;        /* layer-steps that went on without (some of) their misses */
    uint64_t late_clusters;     /* retrieved clusters attended through their estimate instead */
    double max_wait_s;          /* longest wait of one layer-step for the kvstore */
    uint32_t reattached;        /* recoveries that re-attached to the session a restarted
                                   kvstore recovered (--recover), uploading nothing */
    uint64_t resident_bytes;    /* K/V-related bytes the library holds for the session now:
                                   block cache, receive buffer, meta index (the engine's own
                                   K/V not included) */
    uint64_t direct_steps;      /* layer-steps whose retrieved clusters were read in place from
                                   the kvstore's memory (same host), with no request */
    uint64_t direct_clusters;   /* clusters read that way */
} ri_session_stats_t;

/* Counters since creation.  stats->struct_size must be set. */
ri_status_t ri_session_stats(ri_session_h session, ri_session_stats_t *stats);

#ifdef __cplusplus
}
#endif
#endif /* RETROINFER_RETROINFER_H */
