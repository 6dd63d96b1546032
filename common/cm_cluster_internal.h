/*
 * What the cluster directory's files share (cm_cluster.c: records, JSON,
 * ranking, one-shot lists; cm_cluster_member.c: a node's registration and
 * its keepalive thread; cm_cluster_observer.c: the node watch and the
 * observer's lease for session records).  Not a public header.
 */
#ifndef CM_CLUSTER_INTERNAL_H
#define CM_CLUSTER_INTERNAL_H

#include <pthread.h>
#include <stdatomic.h>

#include "common/cm_alloc.h"
#include "common/cm_cluster.h"
#include "common/cm_etcd.h"

#define CM_CLUSTER_ROOT_MAX (CM_CLUSTER_NAME_MAX + 8)
#define CM_CLUSTER_KEY_MAX  512

extern cm_alloc_tag_t cm_cluster_tag;

/* A prefix record waiting for the keepalive thread. */
typedef struct cm_cluster_prefix_op {
    uint8_t key[32];
    bool add; /* true: put, false: delete */
} cm_cluster_prefix_op_t;

struct cm_cluster {
    cm_etcd_t *etcd;                /* owned */
    char root[CM_CLUSTER_ROOT_MAX]; /* "/ri/<cluster>/" */
    uint32_t timeout_ms;

    pthread_mutex_t mu; /* guards everything below */
    pthread_cond_t cv;  /* wakes the keepalive thread; signals the first node list */
    pthread_t thread;   /* the keepalive thread (member and observer leases) */
    bool thread_running;
    bool stop;
    bool kick; /* work queued: run a round now */

    /* member */
    bool member;
    cm_cluster_node_t self; /* the published record */
    bool self_dirty;        /* figures changed since the last put */
    uint32_t lease_ms;
    int64_t lease;       /* 0 = none (outage, or not registered) */
    uint64_t renewed_ms; /* last successful renewal (monotonic ms) */
    atomic_bool registered;
    uint8_t (*held)[32]; /* prefix blocks held (re-put after a re-grant) */
    size_t n_held, cap_held;
    cm_cluster_prefix_op_t *ops; /* queued prefix puts and deletes */
    size_t n_ops, cap_ops;

    /* observer */
    bool observer;
    char worker[CM_CLUSTER_NAME_MAX];
    uint32_t obs_lease_ms;
    int64_t obs_lease; /* 0 = none */
    uint64_t obs_renewed_ms;
    cm_cluster_session_t *sess; /* records under the lease (re-put after a re-grant) */
    bool *sess_pending;         /* parallel: the put failed, retry */
    size_t n_sess, cap_sess;
    char (*del_keys)[CM_CLUSTER_KEY_MAX]; /* deletes that failed, retried */
    size_t n_del, cap_del;

    /* node watch */
    cm_etcd_watch_t *watch;
    cm_cluster_node_t *nodes; /* the local copy, sorted by name */
    size_t n_nodes;
    cm_cluster_node_t *building; /* the list being rebuilt after a RESYNC */
    size_t n_building;
    bool rebuilding;
    bool stale;
    bool synced_once;
};

uint64_t cm_cluster_now_ms(void);

/* Key helpers: "<root>nodes/<node>" and so on, into key[CM_CLUSTER_KEY_MAX]. */
void cm_cluster_node_key(const cm_cluster_t *c, const char *node, char *key);
void cm_cluster_prefix_key(const cm_cluster_t *c, const uint8_t block[32], const char *node, char *key);
void cm_cluster_session_key(const cm_cluster_t *c, const char *node, uint64_t id, char *key);

/* Session record JSON ({"worker","label","tokens","created_ms"}); *json_p cm_free. */
ri_status_t cm_cluster_session_to_json(const cm_cluster_session_t *s, char **json_p);

/* Start the keepalive thread if it is not running (c->mu held). */
ri_status_t cm_cluster_thread_start_locked(cm_cluster_t *c);

/* The member's / observer's part of one keepalive round (c->mu not held). */
void cm_cluster_member_tick(cm_cluster_t *c);
void cm_cluster_observer_tick(cm_cluster_t *c);

/* Free what the member and observer parts hold (after the thread stopped). */
void cm_cluster_member_free(cm_cluster_t *c);
void cm_cluster_observer_free(cm_cluster_t *c);

/* Leave: revoke the member's / observer's lease (thread stopped). */
void cm_cluster_member_leave(cm_cluster_t *c);
void cm_cluster_observer_leave(cm_cluster_t *c);

#endif /* CM_CLUSTER_INTERNAL_H */
