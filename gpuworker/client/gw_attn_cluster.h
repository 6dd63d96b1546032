/*
 * The node pool of the "retroinfer-remote" backend in cluster mode
 * (gw_attn_remote.h): the live ri-kvstore nodes come from the cluster
 * directory in etcd (cm_cluster.h, a local copy kept by a watch), and the
 * pool keeps one ri_client_h per node, connected on first use and connected
 * again when the node's epoch or address changes (a restart).  A new
 * session goes to the best ranked node that takes it: a refusal (quota, no
 * space, shutting down) or an unreachable node moves on to the next.  Nodes
 * this process found unreachable are left out of the ranking until the
 * directory shows them with a new epoch, or GW_CL_RETRY_MS later (when one
 * answers again it is back).  The owner of each session is recorded in the
 * directory under the worker's own lease.
 *
 * Nothing on the decode path calls etcd: a session's client is fixed at
 * creation, and during an etcd outage new sessions are placed from the last
 * known node list.  Thread-safe.
 */
#ifndef GW_ATTN_CLUSTER_H
#define GW_ATTN_CLUSTER_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "common/cm_cluster.h"
#include "gpuworker/client/gw_prefix_seq.h"
#include "kernels/kn_wave.h"
#include "retroinfer/retroinfer.h"

/* How long a node found unreachable is left out while its epoch stays. */
#define GW_CL_RETRY_MS 10000u

typedef struct gw_cl gw_cl_t;

typedef struct gw_cl_cfg {
    const char *url;     /* etcd endpoints "etcd://host:port[,...]" */
    const char *cluster; /* cluster name */
    cm_cluster_policy_t policy;
    const char *worker;                      /* this worker's name in the session records */
    const char *host;                        /* host identity for local-first */
    uint32_t lease_ms;                       /* the worker's lease (0 = the directory's default) */
    const char *token;                       /* bearer token of every node */
    uint32_t timeout_ms;                     /* each node's call deadline */
    const char *tls_ca, *tls_cert, *tls_key; /* every node's TLS (NULL = plaintext) */
    uint32_t prefix_replicas;                /* nodes that should hold a published block (<= 1: one) */
} gw_cl_cfg_t;

/* Open the directory, read the node list (a watch) and join as an observer.
 * RI_ERR_UNREACHABLE (err says so) when no directory can be read.  Strings
 * are copied.  *cl_p owned by the caller (gw_cl_close). */
ri_status_t gw_cl_open(const gw_cl_cfg_t *cfg, gw_cl_t **cl_p, char *err, size_t errlen);

/* Leave the directory (the worker's records go with its lease) and close
 * every client.  Every session must be closed first.  NULL is fine. */
void gw_cl_close(gw_cl_t *cl);

/* Create a session on the best node that takes it, trying prefer first
 * when it is live and not left out (NULL or "": none).  *sess_p, the node's
 * name in node (CM_CLUSTER_NAME_MAX) and the recorded session id in *id_p
 * on success.  Errors: RI_ERR_UNREACHABLE when no node answered (or none is
 * live), the last refusal (RI_ERR_QUOTA, RI_ERR_NOSPACE, RI_ERR_SHUTDOWN)
 * when every node that answered refused, with err naming what each node
 * said; any other error of a node is returned at once. */
ri_status_t gw_cl_session_create(gw_cl_t *cl, const ri_session_params_t *sp, const kn_wave_params_t *wave,
                                 const char *prefer, ri_session_h *sess_p, char *node, uint64_t *id_p, char *err,
                                 size_t errlen);

/* The session id recorded for node is gone (closed): forget its record. */
void gw_cl_session_gone(gw_cl_t *cl, const char *node, uint64_t id);

/* A session on node was lost with the node (it died): leave the node out of
 * the ranking until it comes back, and count a failover. */
void gw_cl_node_lost(gw_cl_t *cl, const char *node);

/* Rank the live nodes as a new session would and return the first one that
 * answers: its name in node, its control channel (borrowed, valid until
 * gw_cl_close) and deadline; NULL when none answers.  keys[0..n_keys)
 * (layout lay; NULL / 0: none) are the prompt's attachable blocks, and the
 * choice is prefix-aware.  Under local-first a node on this host stays
 * first; otherwise the node that holds the longest leading run of the
 * blocks (the directory's prefix records) goes first, rank order deciding
 * among equals.  When another node holds more of the run than the chosen
 * one, the blocks the chosen one lacks are copied to it node to node
 * through this worker (PREFIX_GET there, PREFIX_PUT here) and counted;
 * a failed copy only leaves the rest to prefill. */
struct gw_ctl *gw_cl_pick_prefix(gw_cl_t *cl, const gw_pfx_layout_t *lay, const uint8_t *keys, uint32_t n_keys,
                                 char *node, uint32_t *timeout_ms_p);

/* Queue the copy of blocks keys[0..n_keys) (published on node from) to
 * other live nodes until prefix_replicas nodes hold them; a thread of the
 * pool copies them node to node through this worker (as a prefix-aware
 * placement does), the nodes ranked as for a new session.  Never waits;
 * a full queue (64 jobs) drops the job.  lay and keys are copied. */
void gw_cl_replicate(gw_cl_t *cl, const gw_pfx_layout_t *lay, const uint8_t *keys, uint32_t n_keys,
                     const char *from);

/* Figures for /metrics.  nodes_p: per-node counters, *n_p of them
 * (allocated, cm_free; every node seen since the start). */
typedef struct gw_cl_node_stats {
    char name[CM_CLUSTER_NAME_MAX];
    uint64_t placements; /* sessions created there */
    uint64_t refusals;   /* sessions it refused */
} gw_cl_node_stats_t;

typedef struct gw_cl_stats {
    size_t live_nodes;      /* in the directory now (the last known list while stale) */
    bool stale;             /* the directory's watch is cut off from etcd */
    uint64_t failovers;     /* sessions lost with their node */
    uint64_t prefix_copies; /* prefix blocks copied node to node */
    uint64_t prefix_copy_bytes;
    uint64_t replica_blocks;  /* prefix blocks copied to a replica node */
    uint64_t replica_bytes;
    uint64_t replica_dropped; /* jobs dropped: the queue was full */
    gw_cl_node_stats_t *nodes;
    size_t n_nodes;
} gw_cl_stats_t;

/* *st_p filled; st_p->nodes allocated (cm_free) or NULL. */
void gw_cl_stats(gw_cl_t *cl, gw_cl_stats_t *st_p);

#endif /* GW_ATTN_CLUSTER_H */
