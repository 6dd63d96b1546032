/*
 * What cm_etcd.c (the unary calls) shares with cm_etcd_watch.c (the watch
 * thread): the client's channels, the one-call helper and the error and kv
 * helpers.  Not a public header: only the two files include it.
 */
#ifndef CM_ETCD_INTERNAL_H
#define CM_ETCD_INTERNAL_H

#include <stdatomic.h>

#include <grpc/grpc.h>

#include "common/cm_alloc.h"
#include "common/cm_etcd.h"
#include "etcd/kv.pb-c.h"

extern cm_alloc_tag_t cm_etcd_tag;

struct cm_etcd {
    size_t n_ep;          /* endpoints */
    char **eps;           /* owned "host:port" strings, n_ep of them */
    grpc_channel **chans; /* owned, one per endpoint */
    atomic_size_t cur;    /* the endpoint that last answered */
    uint32_t timeout_ms;
};

/* Set the calling thread's last error (printf format). */
void cm_etcd_set_error(const char *fmt, ...) __attribute__((format(printf, 1, 2)));

/* One call of method with the request bytes req[0..len), on the endpoints in
 * turn (the one that last answered first), each with the client's timeout.
 * Works for unary calls and for a stream that answers one message after the
 * client half-closes (LeaseKeepAlive).  *resp_p (cm_free) and *resp_len_p
 * on success; errors as cm_etcd.h. */
ri_status_t cm_etcd_call(cm_etcd_t *e, const char *method, const void *req, size_t len, uint8_t **resp_p,
                         size_t *resp_len_p);

/* The exclusive end of the range of every key starting with prefix (plen
 * bytes) into end (plen bytes at most); *end_len_p its length.  An empty
 * prefix (or all 0xff) gives the single byte "\0": every key. */
void cm_etcd_prefix_end(const char *prefix, size_t plen, uint8_t *end, size_t *end_len_p);

/* Copy a key-value pair from its wire form (key, value with a NUL added).
 * RI_ERR_NOMEM; *kv untouched on failure. */
ri_status_t cm_etcd_kv_copy(const Mvccpb__KeyValue *src, cm_etcd_kv_t *kv);

/* cm_etcd_watch_start with one more callback, synced(arg), called on the
 * watch thread after the PUTs of each full list (the first one and the one
 * after every RESYNC): a cache can swap in the list it built and clear its
 * stale flag.  synced may be NULL. */
typedef void (*cm_etcd_synced_fn)(void *arg);
ri_status_t cm_etcd_watch_start_synced(cm_etcd_t *e, const char *prefix, uint32_t retry_ms, cm_etcd_watch_fn fn,
                                       cm_etcd_synced_fn synced, void *arg, cm_etcd_watch_t **w_p);

#endif /* CM_ETCD_INTERNAL_H */
