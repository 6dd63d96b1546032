/*
 * ri-kvstore as a member of a cluster (--cluster; docs/kvstore.md
 * "Cluster membership"): once the daemon serves, it registers itself in the
 * etcd directory of common/cm_cluster.h under a lease, keeps its figures
 * (pool, sessions, tenants, draining) current, publishes the prefix blocks
 * it holds, and at a clean stop revokes the lease so that it leaves the
 * directory at once.  Nothing the daemon serves waits on etcd: the member
 * thread of cm_cluster renews the lease and writes the records, and an etcd
 * outage only stops the directory from changing until etcd is back.
 */
#ifndef KVS_CLUSTER_H
#define KVS_CLUSTER_H

#include <stdio.h>

#include "kvstore/ctl/kvs_auth.h"
#include "retroinfer/status.h"

struct kvs_ctl;
typedef struct kvs_cluster kvs_cluster_t;

/* Register ctl's node in the cluster of ctl->cfg.cluster: the listeners are
 * up and --recover has reloaded its blocks.  Tries for up to one lease
 * period while etcd does not answer.  Errors (err says which): RI_ERR_EXISTS
 * (a live node of the same name), RI_ERR_UNREACHABLE / RI_ERR_TIMEOUT (etcd
 * did not answer within the lease period), others from cm_cluster.  ctl is
 * borrowed and must outlive the member; *c_p owned by the caller
 * (kvs_cluster_destroy). */
ri_status_t kvs_cluster_start(struct kvs_ctl *ctl, kvs_cluster_t **c_p, char *err, size_t errlen);

/* Leave the cluster: stop the figures thread and the prefix hook, revoke
 * the lease (the node's records go at once; with etcd down they expire
 * within the lease).  The metrics stay readable (registered 0) until
 * destroy.  Idempotent; NULL is fine. */
void kvs_cluster_leave(kvs_cluster_t *c);

/* Leave if not yet, and free.  NULL is fine. */
void kvs_cluster_destroy(kvs_cluster_t *c);

/* Publish the tenants of auth (borrowed for the call; NULL = single-tenant,
 * ""), e.g. after the tokens file was reloaded.  NULL c is fine. */
void kvs_cluster_set_tenants(kvs_cluster_t *c, const kvs_auth_t *auth);

/* Publish the figures now rather than at the next second (Drain calls it:
 * workers should stop placing sessions here soon).  NULL is fine. */
void kvs_cluster_poke(kvs_cluster_t *c);

/* The node's name in the directory (borrowed, valid until stop). */
const char *kvs_cluster_node_name(const kvs_cluster_t *c);

/* The ri_kvs_cluster_* metrics, as Prometheus text. */
void kvs_cluster_metrics_write(kvs_cluster_t *c, FILE *out);

#endif /* KVS_CLUSTER_H */
