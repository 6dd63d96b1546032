/*
 * The model runtime's "retroinfer-remote" attention backend: RetroInfer with
 * the clusters' K/V in a ri-kvstore, through libretroinfer's public API (one
 * kvstore session per model sequence).  The in-process "retroinfer" backend
 * of gpuworker/model stays for tests and comparisons; both index and decode
 * alike (same kernels, same budgets), so their outputs are identical.
 *
 * Why a separate name rather than `--attn retroinfer --kvstore ADDR`: the
 * backend table is keyed by name, and the runtime's sequences are created
 * from an ops table with no room for per-call connection settings; a
 * process-wide configure call (the kvstore address, token, timeouts) before
 * creating sequences, plus its own name, keeps the model runtime unaware of
 * the kvstore.  ri-worker maps --kvstore ADDR to this backend.
 *
 * Memory: once a layer's tokens are clustered and uploaded (prefill, then
 * every update), the sequence's K/V pages holding them are given back to
 * the system (mdl_kv_release): the worker keeps the steady zone, the block
 * cache and the meta index.  compare_full keeps everything (its exact pass
 * reads every token), and so does keep_kv.
 *
 * Failure: when a decode step finds the kvstore gone (connection reset or no
 * answer within timeout_ms), the backend tries once to recover and repeats
 * the step: with the K/V given back, only by re-attaching to the session a
 * restarted kvstore recovered (--recover), else decode returns RI_ERR_LOST
 * and the caller rebuilds the sequence by prefilling its tokens again (the
 * HTTP service does); with the K/V kept, by re-creating and re-filling the
 * session from it.
 *
 * Cluster mode (cfg.cluster.url set, in place of cfg.address): the sessions
 * go to the ri-kvstore nodes of a cluster directory in etcd
 * (gw_attn_cluster.h ranks them by cfg.cluster.policy and moves on past a
 * node that refuses or does not answer).  When a node dies under a sequence
 * the backend leaves the node out of placement and decode returns
 * RI_ERR_LOST, so that the caller's rebuild lands on another live node at
 * once.
 */
#ifndef GW_ATTN_REMOTE_H
#define GW_ATTN_REMOTE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "common/cm_cluster.h"
#include "gpuworker/model/mdl_attn.h"
#include "retroinfer/status.h"

#define GW_ATTN_REMOTE_NAME "retroinfer-remote"

/* Cluster mode's settings (strings copied). */
typedef struct gw_attn_remote_cluster {
    const char *url;        /* etcd endpoints "etcd://host:port[,...]"; NULL or "" = single address */
    const char *name;       /* cluster name (NULL = "default") */
    cm_cluster_policy_t policy;
    const char *worker;     /* this worker's name in the session records */
    const char *host;       /* host identity for local-first (NULL = none matches) */
    uint32_t lease_ms;      /* the worker's lease in the directory (0 = default) */
    uint32_t prefix_replicas; /* nodes that should hold each published prefix block
                                 (0 or 1 = only the one it was published on) */
} gw_attn_remote_cluster_t;

typedef struct gw_attn_remote_cfg {
    const char *address;    /* ri-kvstore gRPC "host:port" (copied); unused in cluster mode */
    const char *token;      /* bearer token or NULL (copied) */
    uint32_t timeout_ms;    /* control and data-plane deadline (0 = 5000) */
    const char *tls_ca;     /* TLS of the control connection: CA, client cert, key (NULL or "" = plaintext) */
    const char *tls_cert;
    const char *tls_key;
    float cache_frac;       /* block cache share of the sequence's pages (0 = 0.05) */
    bool compare_full;      /* also compute exact attention per decode step and
                               record the relative error (costs a full pass) */
    uint32_t deadline_us;   /* per layer-step wait bound for misses (0 = wait: exact) */
    uint32_t session_flags; /* RI_SESSION_* of every session (retroinfer.h): two-sided
                               reads, fetch on the io thread, no prediction */
    bool keep_kv;           /* keep the sequence's K/V once in the kvstore (a re-fill
                               can then recover a session a daemon lost) */
    gw_attn_remote_cluster_t cluster; /* cluster mode when cluster.url is set */
} gw_attn_remote_cfg_t;

/* The wave index settings come with each sequence (mdl_attn_cfg_t.wave) and
 * reach its session whole.  Nothing here reads the environment. */

/* Connect to the kvstore (Health), or in cluster mode read the directory
 * (no directory: RI_ERR_UNREACHABLE), and register the backend with the model
 * runtime (once per process; a second call reconnects with new settings
 * when no sequence uses the backend).  err gets a message naming the address
 * on failure.  Errors: those of ri_client_connect. */
ri_status_t gw_attn_remote_configure(const gw_attn_remote_cfg_t *cfg, char *err, size_t errlen);

/* The configured kvstore's control channel (borrowed: valid until
 * gw_attn_remote_shutdown or a reconfigure) and its deadline; NULL when
 * not configured or in cluster mode.  Prefix reuse opens its prefix-only
 * sessions on it. */
struct gw_ctl *gw_attn_remote_ctl(uint32_t *timeout_ms_p);

/* Cluster mode configured? */
bool gw_attn_remote_clustered(void);

/* Cluster mode: choose the node of the next sequence the calling thread
 * creates on this backend, and return its control channel (borrowed, as
 * gw_attn_remote_ctl's) and deadline, or NULL when no node answers.  A
 * prefix-only session opened there sits on the same node as the sequence's
 * session (an attach is node-local).  keys[0..n_keys) (layout lay) are the
 * prompt's attachable blocks: the choice is prefix-aware, and blocks
 * another node holds are copied to the chosen one (gw_cl_pick_prefix).
 * The choice holds until gw_attn_remote_place_clear. */
struct gw_pfx_layout;
struct gw_ctl *gw_attn_remote_place(const struct gw_pfx_layout *lay, const uint8_t *keys, uint32_t n_keys,
                                    uint32_t *timeout_ms_p);
void gw_attn_remote_place_clear(void);

/* The node the last gw_attn_remote_place of this thread chose ("" = none). */
const char *gw_attn_remote_placed_node(void);

/* Blocks keys[0..n_keys) were published on node from: in cluster mode with
 * prefix_replicas > 1, have them copied to other nodes in the background
 * (a sequence rebuilt elsewhere after its node died attaches them there
 * instead of prefilling them).  Never blocks on the copy; a no-op
 * otherwise.  keys and lay are copied. */
void gw_attn_remote_replicate(const struct gw_pfx_layout *lay, const uint8_t *keys, uint32_t n_keys,
                              const char *from);

/* Disconnect (every sequence on the backend must be destroyed first). */
void gw_attn_remote_shutdown(void);

/* Totals over every sequence since the last reset (process-wide). */
typedef struct gw_attn_remote_totals {
    uint64_t steps;            /* layer-steps decoded */
    uint64_t hits, misses;     /* retrieved clusters: block cache / kvstore */
    uint64_t fetched_bytes;    /* bytes received for misses */
    uint64_t uploaded_bytes;   /* cluster bytes uploaded */
    uint64_t recoveries;       /* sessions re-created after a kvstore failure */
    uint64_t failures;         /* decode steps that returned an error */
    double build_s;            /* index build (prefill_end and updates) */
    double fetch_wait_s;       /* decode time spent waiting for the kvstore */
    double max_wait_s;         /* longest wait of one layer-step */
    uint64_t late_steps;       /* layer-steps that went on without (some of) their misses */
    uint64_t late_clusters;    /* retrieved clusters estimated because they were late */
    uint64_t resident_bytes;   /* now, over live sequences: block caches, receive buffers, meta indexes */
    double compare_s;          /* time spent on the compare_full exact pass */
    uint64_t released_bytes;   /* engine K/V given back once in the kvstore (mdl_kv_release) */
    uint64_t direct_steps;     /* layer-steps read in place from the kvstore's region */
    uint64_t direct_clusters;  /* clusters read that way */
    /* compare_full: relative L2 error of each query head's output vs exact */
    uint64_t n_err;            /* (layer, head, step) samples */
    double err_median, err_p90, err_p99, err_max;
} gw_attn_remote_totals_t;

void gw_attn_remote_totals(gw_attn_remote_totals_t *t_p);

/* Cluster mode's figures (gw_attn_cluster.h); false outside cluster mode.
 * st_p->nodes allocated (cm_free). */
struct gw_cl_stats;
bool gw_attn_remote_cluster_stats(struct gw_cl_stats *st_p);
void gw_attn_remote_reset_totals(void);

#endif /* GW_ATTN_REMOTE_H */
