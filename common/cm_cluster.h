/*
 * The cluster directory: which ri-kvstore nodes are alive, which sessions
 * each holds and for which worker, and which prefix blocks each node holds,
 * kept in etcd (cm_etcd.h) under /ri/<cluster>/.  Both sides use it:
 * ri-kvstore registers itself (a member), ri-worker reads the directory and
 * records the sessions it places (an observer).  Nothing on the decode path
 * touches etcd: a worker reads its directory from a local copy kept up to
 * date by a watch, so an etcd outage stops only new placements that the
 * last known directory cannot serve.
 *
 * Keys and values (values are JSON objects, parsed with cJSON; unknown
 * fields are ignored so that newer nodes can add some):
 *
 *   /ri/<cluster>/nodes/<node>                  lease: the node's
 *       {"node","addr","dataplane","host","pool_total","pool_used",
 *        "sessions","tenants":[...],"epoch","recovered","draining"}
 *   /ri/<cluster>/sessions/<node>/<session id, 16 hex>   lease: the worker's
 *       {"worker","label","tokens","created_ms"}
 *   /ri/<cluster>/prefix/<block key, 64 hex>/<node>       lease: the node's
 *       "" (the key says it all)
 *
 * A node's lease is its liveness: the lease lasts lease_ms and is renewed
 * every lease_ms / 3, so a killed node's keys are gone within one lease
 * period.  A node's name is stable across restarts (default host:port of
 * its gRPC listener), so the session records of a node that comes back with
 * --recover point at it again.  A worker's records carry its own lease, so
 * a dead worker's session records go too.  Block keys are already salted
 * per tenant (docs/prefix.md): the directory names blocks, never tenants'
 * tokens, and a kvstore still checks the tenant of every attach.
 *
 * Names (cluster, node, worker) are 1..63 characters of [A-Za-z0-9._:-];
 * anything else is RI_ERR_INVALID.  Errors as cm_etcd.h; the message of the
 * calling thread's last failure is cm_etcd_last_error().
 */
#ifndef CM_CLUSTER_H
#define CM_CLUSTER_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "retroinfer/status.h"

#define CM_CLUSTER_NAME_MAX 64
#define CM_CLUSTER_ADDR_MAX 256
#define CM_CLUSTER_DEFAULT_LEASE_MS 5000

typedef struct cm_cluster cm_cluster_t;

/* What a node publishes about itself. */
typedef struct cm_cluster_node {
    char name[CM_CLUSTER_NAME_MAX];
    char addr[CM_CLUSTER_ADDR_MAX];      /* gRPC control address others dial ("host:port") */
    char dataplane[CM_CLUSTER_ADDR_MAX]; /* data-plane address others dial, or "" */
    char host[CM_CLUSTER_NAME_MAX];      /* host identity for same-host placement
                                            (gethostname, or --cluster-host) */
    uint64_t pool_total, pool_used;      /* memory pool bytes */
    uint32_t sessions;                   /* sessions held, all tenants */
    char tenants[CM_CLUSTER_ADDR_MAX];   /* tenants served, comma-separated ("" = any) */
    uint64_t epoch;                      /* start time, ms since the epoch: a new value
                                            means the node restarted */
    bool recovered;                      /* it started with --recover */
    bool draining;                       /* it takes no new sessions (Drain): placement skips it */
} cm_cluster_node_t;

/* A session's owner record. */
typedef struct cm_cluster_session {
    char node[CM_CLUSTER_NAME_MAX];
    uint64_t session_id;
    char worker[CM_CLUSTER_NAME_MAX];
    char label[CM_CLUSTER_NAME_MAX];
    uint64_t tokens;                     /* expected tokens at creation */
    uint64_t created_ms;
} cm_cluster_session_t;

/* Connect to etcd at url ("etcd://host:port[,...]") for cluster name.
 * timeout_ms 0 = 2000.  Makes no call.  *c_p owned by the caller. */
ri_status_t cm_cluster_open(const char *url, const char *cluster, uint32_t timeout_ms, cm_cluster_t **c_p);

/* Leave: stop the keepalive and the watch, revoke the leases (a clean stop
 * disappears at once; a crash within one lease period), close.  NULL is fine. */
void cm_cluster_close(cm_cluster_t *c);

bool cm_cluster_name_valid(const char *name);

/* ---- member side (ri-kvstore) ---------------------------------------- */

/* Register self under a lease of lease_ms (0 = CM_CLUSTER_DEFAULT_LEASE_MS,
 * at least 2000) and start the keepalive thread.  The record is written with
 * create semantics: a live node of the same name is RI_ERR_EXISTS (two
 * daemons must not share a name).  When etcd is down at the call it fails
 * RI_ERR_UNREACHABLE; once registered, an outage is survived: the thread
 * keeps retrying, and when the lease has expired meanwhile it grants a new
 * one and writes the record (and every prefix record) again. */
ri_status_t cm_cluster_register(cm_cluster_t *c, const cm_cluster_node_t *self, uint32_t lease_ms);

/* Replace the published figures (pool, sessions, tenants); the keepalive
 * thread writes them with its next renewal, at most once a renewal. */
void cm_cluster_update(cm_cluster_t *c, const cm_cluster_node_t *self);

/* This node holds / no longer holds prefix block key (32 bytes).  Queued to
 * the keepalive thread (never blocks the caller on etcd); remembered, so
 * that a re-registration writes them again. */
void cm_cluster_prefix_add(cm_cluster_t *c, const uint8_t key[32]);
void cm_cluster_prefix_del(cm_cluster_t *c, const uint8_t key[32]);

/* Is the member registered with a live lease now (false during an outage)? */
bool cm_cluster_registered(cm_cluster_t *c);

/* A member's counters since register (for metrics). */
typedef struct cm_cluster_member_stats {
    uint64_t renewals;                   /* lease renewals etcd acknowledged */
    uint64_t errors;                     /* etcd calls of the member that failed */
    uint64_t registrations;              /* registrations written (1 + re-registrations after outages) */
} cm_cluster_member_stats_t;
void cm_cluster_member_stats(cm_cluster_t *c, cm_cluster_member_stats_t *out);

/* ---- observer side (ri-worker, ri, tools) ------------------------------ */

/* Start the local copy of the node list (a watch on nodes/).  Waits up to
 * the timeout for the first list; RI_ERR_UNREACHABLE when etcd does not
 * answer (the caller decides whether to start without a directory). */
ri_status_t cm_cluster_watch_nodes(cm_cluster_t *c);

/* The live nodes from the local copy (or, without a watch, from one list
 * call), sorted by name.  *nodes_p allocated (cm_free), *n_p its count.
 * *stale_p (may be NULL): true while the watch is cut off from etcd and the
 * list is the last one known. */
ri_status_t cm_cluster_nodes(cm_cluster_t *c, cm_cluster_node_t **nodes_p, size_t *n_p, bool *stale_p);

/* Placement policy of a new session. */
typedef enum cm_cluster_policy {
    CM_CLUSTER_LOCAL_FIRST = 0, /* a node on my host, else the most free memory */
    CM_CLUSTER_MOST_FREE = 1,   /* the most free memory (pool_total - pool_used) */
    CM_CLUSTER_ROUND_ROBIN = 2, /* in name order, one after another */
} cm_cluster_policy_t;

/* "local-first", "most-free", "round-robin" -> policy; false when unknown. */
bool cm_cluster_policy_parse(const char *text, cm_cluster_policy_t *p);
const char *cm_cluster_policy_name(cm_cluster_policy_t p);

/* Rank nodes for a new session: order[0..n) gets indexes into nodes, best
 * first (the caller tries them in turn: a node refuses a session it cannot
 * hold).  skip (may be NULL) marks nodes to leave out (the caller found
 * them unreachable; draining nodes are left out too); *n_order_p the
 * count ranked.  my_host as
 * cm_cluster_node_t.host; *rr is the round-robin cursor the caller keeps.
 * Pure: no etcd call (unit-testable). */
void cm_cluster_rank(const cm_cluster_node_t *nodes, size_t n, const bool *skip, const char *my_host,
                     cm_cluster_policy_t policy, uint32_t *rr, size_t *order, size_t *n_order_p);

/* Give this observer a lease of its own (for its session records): granted
 * on the first call, kept alive by a thread, re-granted after an outage
 * (the records are written again).  worker names it in the records. */
ri_status_t cm_cluster_join_observer(cm_cluster_t *c, const char *worker, uint32_t lease_ms);

/* Record / forget the owner of a session (under the observer's lease).
 * Never blocks a caller on an etcd outage longer than the timeout; a failed
 * put is retried by the keepalive thread. */
ri_status_t cm_cluster_session_put(cm_cluster_t *c, const cm_cluster_session_t *s);
ri_status_t cm_cluster_session_del(cm_cluster_t *c, const char *node, uint64_t session_id);

/* The same without waiting on etcd at all: the record is noted (or
 * forgotten) and the keepalive thread writes (or deletes) it at once, and
 * again until etcd takes it.  For callers on a serving path (a worker's
 * scheduler), which an etcd host that drops packets must not slow down.
 * Invalid arguments are ignored (nothing is noted). */
void cm_cluster_session_put_async(cm_cluster_t *c, const cm_cluster_session_t *s);
void cm_cluster_session_del_async(cm_cluster_t *c, const char *node, uint64_t session_id);

/* Every session record (node "" = all nodes).  *out_p allocated (cm_free). */
ri_status_t cm_cluster_sessions(cm_cluster_t *c, const char *node, cm_cluster_session_t **out_p, size_t *n_p);

/* The nodes holding prefix block key: names copied into names[0..cap),
 * *n_p the count (0 = nobody).  One list call. */
ri_status_t cm_cluster_prefix_holders(cm_cluster_t *c, const uint8_t key[32], char (*names)[CM_CLUSTER_NAME_MAX],
                                      size_t cap, size_t *n_p);

/* JSON of a node record and back (exposed for tests and `ri cluster`).
 * to_json: *json_p allocated (cm_free).  from_json: RI_ERR_FORMAT when a
 * required field (node, addr) is missing or a value has the wrong type. */
ri_status_t cm_cluster_node_to_json(const cm_cluster_node_t *n, char **json_p);
ri_status_t cm_cluster_node_from_json(const char *json, size_t len, cm_cluster_node_t *n);

#endif /* CM_CLUSTER_H */
