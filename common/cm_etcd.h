/*
 * A small etcd v3 client: the KV, Lease and Watch calls the cluster
 * directory (cm_cluster.h) needs, spoken over etcd's own gRPC API with the
 * gRPC C core and protobuf-c messages compiled from a subset of etcd's
 * protos (proto/etcd/).  Why gRPC rather than etcd's JSON gateway: the
 * project already links both libraries, the gateway base64-encodes every key
 * and value and would need an HTTP client of its own, and Watch and
 * LeaseKeepAlive are streams in either case.
 *
 * Endpoints: "host:port[,host:port...]" (a leading "etcd://" is accepted and
 * dropped).  A call goes to the endpoint that last answered; when it cannot
 * be reached (UNAVAILABLE, DEADLINE_EXCEEDED) the call is tried once on each
 * other endpoint before it fails.
 *
 * Every call is blocking with the client's deadline, thread-safe (one
 * completion queue per call, as gw_ctl does), and returns:
 *   RI_OK, RI_ERR_NOT_FOUND (no such key / lease), RI_ERR_EXISTS (a create
 *   lost its race), RI_ERR_UNREACHABLE (no endpoint answered: etcd is down),
 *   RI_ERR_TIMEOUT, RI_ERR_INVALID (bad argument), RI_ERR_NOMEM,
 *   RI_ERR_PROTOCOL (an answer that does not parse).
 * cm_etcd_last_error gives the message of the calling thread's last failure.
 * Outputs are written only on success.
 */
#ifndef CM_ETCD_H
#define CM_ETCD_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "retroinfer/status.h"

typedef struct cm_etcd cm_etcd_t;

/* Open a client (no call is made: a down etcd is found by the first call).
 * endpoints is copied.  timeout_ms 0 = 2000.  *e_p owned by the caller. */
ri_status_t cm_etcd_open(const char *endpoints, uint32_t timeout_ms, cm_etcd_t **e_p);
void cm_etcd_close(cm_etcd_t *e); /* NULL is fine; stop every watch first */

/* The calling thread's last error message ("" when none). */
const char *cm_etcd_last_error(void);

/* One key-value pair as etcd stores it.  key is NUL-terminated; val is
 * len bytes plus a NUL (so text values read as strings). */
typedef struct cm_etcd_kv {
    char *key;
    char *val;
    size_t len;
    int64_t create_rev, mod_rev;
    int64_t lease;            /* 0 = none */
} cm_etcd_kv_t;

/* The pairs under a prefix, sorted by key, and the store's revision when
 * read (a watch started at revision + 1 misses nothing). */
typedef struct cm_etcd_list {
    cm_etcd_kv_t *kvs;        /* owned by the list */
    size_t n;
    int64_t revision;
} cm_etcd_list_t;
void cm_etcd_list_free(cm_etcd_list_t *l); /* frees the contents; l itself is the caller's */

/* Put key = val (len bytes), attached to lease (0 = none). */
ri_status_t cm_etcd_put(cm_etcd_t *e, const char *key, const void *val, size_t len, int64_t lease);

/* Put only if the key does not exist (a transaction on create_revision == 0):
 * the way to take ownership of a name.  RI_ERR_EXISTS when it does. */
ri_status_t cm_etcd_create(cm_etcd_t *e, const char *key, const void *val, size_t len, int64_t lease);

/* One key (RI_ERR_NOT_FOUND when absent).  *kv_p filled; free with
 * cm_etcd_kv_free. */
ri_status_t cm_etcd_get(cm_etcd_t *e, const char *key, cm_etcd_kv_t *kv_p);
void cm_etcd_kv_free(cm_etcd_kv_t *kv);

/* Every key that starts with prefix ("" = all), at most limit (0 = no
 * limit).  *out filled (caller frees with cm_etcd_list_free). */
ri_status_t cm_etcd_list(cm_etcd_t *e, const char *prefix, size_t limit, cm_etcd_list_t *out);

/* Delete key, or every key under it when prefix.  *deleted_p (may be NULL)
 * gets the count; deleting nothing is RI_OK with 0. */
ri_status_t cm_etcd_delete(cm_etcd_t *e, const char *key, bool prefix, int64_t *deleted_p);

/* Leases.  grant: a new lease of ttl_s seconds (>= 1), *id_p.  keepalive:
 * renew it once (one message on a LeaseKeepAlive stream), *ttl_p (may be
 * NULL) gets the renewed TTL; RI_ERR_NOT_FOUND when it has expired (etcd
 * answers TTL 0).  revoke: end it now, deleting its keys (RI_OK when it had
 * expired already). */
ri_status_t cm_etcd_lease_grant(cm_etcd_t *e, int64_t ttl_s, int64_t *id_p);
ri_status_t cm_etcd_lease_keepalive(cm_etcd_t *e, int64_t id, int64_t *ttl_p);
ri_status_t cm_etcd_lease_revoke(cm_etcd_t *e, int64_t id);

/* Watch: the changes under a prefix, delivered on the watch's own thread. */
typedef enum cm_etcd_event_type {
    CM_ETCD_PUT = 0,
    CM_ETCD_DELETE = 1,       /* deleted, or its lease expired */
    CM_ETCD_RESYNC = 2,       /* the stream broke (etcd down, compacted): the
                                 watcher re-lists and resumes by itself; kv is
                                 NULL; a consumer that caches drops its cache
                                 and waits for the puts that follow */
} cm_etcd_event_type_t;

typedef struct cm_etcd_event {
    cm_etcd_event_type_t type;
    const cm_etcd_kv_t *kv;   /* borrowed for the callback; val empty on DELETE */
} cm_etcd_event_t;

/* Called on the watch thread, one event at a time, in revision order.  It
 * must not call cm_etcd_watch_stop on its own watch. */
typedef void (*cm_etcd_watch_fn)(void *arg, const cm_etcd_event_t *ev);

typedef struct cm_etcd_watch cm_etcd_watch_t;

/* Start watching prefix: first every existing key under it arrives as a
 * PUT (from one list), then the changes after that list's revision.  When
 * the stream breaks the thread sends RESYNC, retries every retry_ms (0 =
 * 500) until etcd answers, re-lists (PUTs again) and watches on.  e must
 * outlive the watch.  *w_p owned by the caller. */
ri_status_t cm_etcd_watch_start(cm_etcd_t *e, const char *prefix, uint32_t retry_ms, cm_etcd_watch_fn fn,
                                void *arg, cm_etcd_watch_t **w_p);

/* Stop and join the thread (no callback runs after it returns).  NULL is fine. */
void cm_etcd_watch_stop(cm_etcd_watch_t *w);

/* Parse "etcd://host:port[,host:port...]" or "host:port[,...]": true when
 * every endpoint is host:port.  For settings checks. */
bool cm_etcd_endpoints_valid(const char *endpoints);

#endif /* CM_ETCD_H */
