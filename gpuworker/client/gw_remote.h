/*
 * The remote RetroInfer state of one sequence, all layers (docs/architecture.md):
 * the worker keeps the meta index (centroids, value sums, sizes, token
 * permutation) per (layer, KV head), and a small block cache of clusters in
 * host memory; the kvstore keeps every cluster's K/V and the cache directory.
 *
 * The caller owns the sequence's K/V (any kn_kv_view_t layout, covering every
 * token so far) and passes a view to each call, exactly as with kn_wave_*.
 * Indexing is kernels/kn_wave.c itself (one kn_wave per layer, created with
 * a store that uploads what it clusters: the indexed range [sink, n -
 * window), the budgets R and E and the update rule are the same code), and
 * the first phase of a step is kn_wave_rank_estimate, so a remote decode
 * equals the in-process one: the same clusters are retrieved, their tokens
 * attended in the same order, and the estimation zone is the same.
 *
 *   gw_remote_build(r, layer, kv)      after prefill: index + async upload
 *   per step and layer (new token's K/V in kv):
 *     gw_remote_update(r, layer, kv)   every update_tokens: append clusters
 *     gw_remote_decode(r, layer, q, kv, out, lse)
 *       = rank -> FETCH_RANKED on the io thread | estimation zone meanwhile
 *         -> steady zone + hits (cache) + misses (receive buffer) exact
 *         -> merge -> copy admitted misses into their cache pages
 *   decode_begin/decode_end split a step so that a batch of sequences can
 *   have all their fetches in flight at once.
 *
 * The block cache's pages live in a memory space (params.cache_space; host
 * memory by default) and admitted misses reach them through that space's
 * copy engine, asynchronously: a step's admissions are queued as it ends
 * and waited for before the next step reads the cache or reuses the
 * receive buffer (docs/worker.md, "Block cache in device memory").
 *
 * The block cache is registered at the first decode step with a capacity of
 * cache_frac of the pages uploaded so far (or cache_pages); it does not grow
 * with later updates.  The receive buffer is sized for a step's worst case
 * and re-registered (cache emptied) when an update makes a step need more.
 *
 * Failure: any data-plane error (daemon gone: RI_ERR_CONN_RESET, no answer
 * within timeout_ms: RI_ERR_TIMEOUT) makes the object broken: every later
 * call returns that status.  The sequence is then lost remotely; the caller
 * may re-create it (gw_remote_create + build from its own K/V).
 *
 * Not thread-safe per object; different objects may be used from different
 * threads (each has its own connection and io thread).
 */
#ifndef GW_REMOTE_H
#define GW_REMOTE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "common/cm_half.h"
#include "common/cm_wire.h"
#include "kernels/kn_mem.h"
#include "kernels/kn_ops.h"
#include "kernels/kn_wave.h"
#include "retroinfer/status.h"


/* UCX transports our programs set (UCX_TLS, when unset) for a worker on the
 * kvstore's host.  ri-kvstore leaves the shared-memory ones out of its own
 * context (docs/kvstore-data.md, "Transport"), so a worker and a kvstore
 * meet over tcp; the worker reads its clusters from its direct region. */
#define GW_UCX_TLS_LOCAL "posix,sysv,cma,tcp,self"

typedef struct gw_remote_params {
    kn_wave_params_t wave;    /* index and budget settings (as the in-process backend) */
    float cache_frac;         /* block cache: share of the uploaded pages (0.05) */
    uint32_t cache_pages;     /* fixed capacity in pages; 0 = from cache_frac */
    uint32_t min_cache_pages; /* floor of the capacity (64) */
    uint32_t timeout_ms;      /* deadline of one data-plane call (5000) */
    bool fetch_async;         /* fetch on the io thread while the estimation zone is
                                 computed (true), or on the caller's thread before it
                                 (false, default) */
    bool predict;             /* steps whose clusters are all cached (per the mirror of
                                 the directory) do not wait for the fetch (true) */
    uint32_t deadline_us;     /* a layer-step waits at most this long (from the fetch's
                                 submission) for its misses; those not in by then are
                                 attended through their centroid estimate and counted
                                 late, and the fetch is applied when it lands.  0 = wait
                                 for every fetch (exact).  A deadline makes fetches
                                 asynchronous. */
    bool direct;              /* read retrieved clusters straight from the session's
                                 region in the kvstore when it can be mapped here
                                 (same host): no request per step (true; false keeps
                                 every read two-sided) */
    uint32_t page_tokens;     /* P, tokens per kvstore page (cm_dp_proto.h); must be the
                                 session's; 0 = gw_remote_page_tokens' rule */
    const kn_mem_t *cache_space; /* memory space of the block cache's pages and, for a
                                 device space, the step's execution buffers (borrowed
                                 forever); NULL =
                                 kn_mem_host().  Admitted misses go there through the
                                 space's copy engine (gw_copier.h).  A device space must
                                 be the one wave.ops reads (kn_mem_of), else
                                 RI_ERR_UNSUPPORTED.  The caller's K/V views may be in
                                 the space wave.ops reads: they are read through its
                                 copy (the upload) or those ops (the steady zone) */
} gw_remote_params_t;

/* The defaults.  Nothing here reads the environment: programs map their
 * flags and variables onto these fields (docs/worker.md). */
void gw_remote_params_default(gw_remote_params_t *p);

/* The page size (tokens) a session for p's remote is created with: p's own,
 * else max(tokens_per_cluster / 8, 1), 1 when the cluster size is auto.  A
 * cluster of n tokens takes ceil(n / P) pages and k-means sizes vary around
 * their mean, so pages as large as the clusters waste about half a page per
 * cluster (1.5x the K/V at 4-token clusters in 4-token pages, 2x in the old
 * 8-token pages); pages of 1 token (2 at 16-token clusters) keep the upload,
 * the region and the block cache at the K/V's size (<= ~1.03x). */
uint32_t gw_remote_page_tokens(const gw_remote_params_t *p);

/* Counters since creation (summed over layers and KV heads). */
typedef struct gw_remote_stats {
    uint64_t steps;            /* layer-steps decoded */
    uint64_t fetches;          /* FETCH_RANKED calls */
    uint64_t hits;             /* retrieved clusters found in the block cache */
    uint64_t misses;           /* retrieved clusters sent by the kvstore */
    uint64_t admitted;         /* misses copied into the cache */
    uint64_t evicted;          /* clusters the kvstore evicted from our cache */
    uint64_t fetched_bytes;    /* miss bytes received */
    uint64_t uploaded_bytes;   /* page bytes uploaded (build + updates) */
    uint64_t exact_tokens;     /* steady + retrieved tokens attended */
    uint64_t retrieved_tokens; /* of which retrieved */
    uint64_t bytes_read;       /* K/V + meta bytes read by decode (kn_wave's measure) */
    uint32_t cache_pages;      /* capacity registered (0 before the first decode) */
    uint32_t registrations;    /* caches registered (> 1: receive buffer grew) */
    double build_s;            /* index build (prefill and updates) */
    double fetch_wait_s;       /* time decode waited for fetches */
    double max_wait_s;         /* longest wait of one layer-step for its fetch */
    uint64_t late_steps;       /* layer-steps that did not wait for (all) their misses */
    uint64_t late_clusters;    /* retrieved clusters attended through their estimate instead */
    uint64_t resident_bytes;   /* held now: block cache + receive buffer + meta index
                                  (centroids, value sums, sizes, offsets, permutation) */
    double upload_s;           /* io thread time in uploads */
    uint64_t direct_steps;     /* layer-steps read wholly from the mapped region */
    uint64_t direct_clusters;  /* retrieved clusters read there */
} gw_remote_stats_t;

typedef struct gw_remote gw_remote_t;

/* Connect to the data plane at addr for session (id, secret) and start the
 * io thread.  shape: one layer's geometry; n_layers layers.  params NULL =
 * defaults.  Caller frees with gw_remote_destroy.  Errors: RI_ERR_INVALID,
 * RI_ERR_NOMEM, connection errors of gw_dp_connect (RI_ERR_UNREACHABLE, ...). */
ri_status_t gw_remote_create(const char *addr, uint64_t session_id, const uint8_t secret[CM_WIRE_SECRET_SIZE],
                             const kn_shape_t *shape, uint32_t n_layers, const gw_remote_params_t *params,
                             gw_remote_t **r_p);

/* Release the cache, stop the io thread, close; NULL is a no-op.  Does not
 * drop the kvstore session (the control plane owns it). */
void gw_remote_destroy(gw_remote_t *r);

/* Index tokens [sink, n - window) of layer (once, on an empty layer) and
 * queue their upload; returns before the upload ends (layer i's upload
 * overlaps layer i+1's build).  Short prompts index nothing. */
ri_status_t gw_remote_build(gw_remote_t *r, uint32_t layer, const kn_kv_view_t *kv);

/* kn_wave_update's rule: while the steady zone holds window + update_tokens
 * tokens past the indexed range, cluster the oldest update_tokens into
 * update_clusters clusters, append to the index and queue APPEND_CLUSTERS. */
ri_status_t gw_remote_update(gw_remote_t *r, uint32_t layer, const kn_kv_view_t *kv, bool *updated_p);

/* Wait for queued uploads; returns the sticky data-plane error. */
ri_status_t gw_remote_sync(gw_remote_t *r);

/* One decode step of one layer: q [n_q][d] -> out [n_q][d], lse [n_q] or
 * NULL.  kv must cover every token indexed so far (plus the steady zone). */
ri_status_t gw_remote_decode(gw_remote_t *r, uint32_t layer, const float *q, const kn_kv_view_t *kv, float *out,
                             float *lse);

/* As gw_remote_decode with the retrieval / estimation counts per head forced
 * (capped at the clusters available); n_r = every cluster gives full attention. */
ri_status_t gw_remote_decode_budget(gw_remote_t *r, uint32_t layer, const float *q, const kn_kv_view_t *kv,
                                    uint32_t n_r, uint32_t n_e, float *out, float *lse);

/* The two halves of a step.  begin ranks and sends the fetch; end computes
 * the estimation zone while it is in flight, waits, attends, merges, admits.
 * q and kv are borrowed from begin until end returns.  One step at a time per
 * object; n_r/n_e UINT32_MAX = the layer's own budget. */
ri_status_t gw_remote_decode_begin(gw_remote_t *r, uint32_t layer, const float *q, const kn_kv_view_t *kv,
                                   uint32_t n_r, uint32_t n_e);
ri_status_t gw_remote_decode_end(gw_remote_t *r, float *out, float *lse);

/* After a data-plane failure (or to move to another daemon): drop the old
 * connection, connect to (addr, session_id, secret) -- a NEW, empty kvstore
 * session -- and re-fill it: every cluster of the existing index is
 * re-packed from kv[layer] (n_layers views, borrowed for the call) and
 * uploaded, so that decoding continues exactly where it stopped.  With kv
 * NULL, re-attach instead: the session is the one we had, recovered by a
 * restarted kvstore (--recover) with every cluster we uploaded; nothing is
 * uploaded.  The block cache starts empty.  Errors as gw_remote_create; on
 * failure the object stays broken and the call may be repeated. */
ri_status_t gw_remote_reconnect(gw_remote_t *r, const char *addr, uint64_t session_id,
                                const uint8_t secret[CM_WIRE_SECRET_SIZE], const kn_kv_view_t *kv);

void gw_remote_stats(gw_remote_t *r, gw_remote_stats_t *st_p);

/* Clusters the kvstore holds for this object (all layers and heads), as far
 * as the worker knows: what a recovered session must list to re-attach. */
uint64_t gw_remote_clusters(const gw_remote_t *r);

/* The index of (layer, kv_head) (borrowed, valid until the next build/update). */
const kn_index_t *gw_remote_index(const gw_remote_t *r, uint32_t layer, uint32_t kv_head);

/* First position after the indexed range of layer; budgets of layer. */
size_t gw_remote_indexed_end(const gw_remote_t *r, uint32_t layer);
void gw_remote_budget(const gw_remote_t *r, uint32_t layer, uint32_t *n_r_p, uint32_t *n_e_p);

/* The settings layer's wave runs with (borrowed, valid while r lives):
 * tokens_per_cluster and update_clusters are the resolved ones once the
 * layer is built, the configured ones before. */
const kn_wave_params_t *gw_remote_wave_params(const gw_remote_t *r, uint32_t layer);

/*
 * Prefix blocks (docs/prefix.md, common/cm_dp_prefix.h).  Before any layer
 * is built, attach the leading blocks of keys (n_keys x CM_PFX_KEY_SIZE,
 * in block order) the session's tenant holds: PREFIX_ATTACH on the
 * session's own connection, then each block is read (mapped in place on
 * the kvstore's host, else a PREFIX_GET copy) and parsed under the
 * session's geometry (B = wave.segment_tokens, the sinks, the page size),
 * and, with direct reads, its clusters are LOCATEd so that steps read them
 * in the block's mapping.  The kvstore's tables then start with the
 * blocks' clusters: each layer's build (gw_remote_build) imports their
 * wave-index pieces instead of clustering those tokens and APPENDs only
 * its new clusters; the block cache counts the attached clusters' pages.
 * The caller's views must still hold every token (the engine preloads the
 * blocks' K/V with gw_remote_prefix_fill).  *n_attached_p: the leading
 * blocks attached (0 when the first key is not cached).  RI_ERR_INVALID
 * after a build or a second attach; a failure once blocks were attached
 * breaks the object (the tables hold clusters it cannot name).
 */
ri_status_t gw_remote_attach_prefix(gw_remote_t *r, const uint8_t *keys, uint32_t n_keys, uint32_t *n_attached_p);

/* Tokens [0, n) the attached blocks hold (n = blocks * B). */
size_t gw_remote_prefix_tokens(const gw_remote_t *r);

/* The attached blocks' K and V of positions [pos0, pos0 + n) of (layer,
 * kv_head) into k / v (fp16 [n][d], token_stride elements per token).
 * RI_ERR_RANGE past the blocks, RI_ERR_INVALID without any. */
ri_status_t gw_remote_prefix_fill(gw_remote_t *r, uint32_t layer, uint32_t kv_head, size_t pos0, size_t n,
                                  cm_fp16_t *k, cm_fp16_t *v, size_t token_stride);

/* The sticky error (RI_OK while healthy). */
ri_status_t gw_remote_error(gw_remote_t *r);

#endif /* GW_REMOTE_H */
