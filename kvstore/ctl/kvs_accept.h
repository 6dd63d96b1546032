/*
 * The daemon's own TCP listener for the gRPC control API, with a cap on the
 * connections it holds.  Expected load: a handful of long-lived worker
 * connections and the odd `ri status`; the cap exists for floods (the security
 * review: 1050 idle connections under `ulimit -n 1024`).
 *
 * Why not gRPC's listener: gRPC 1.51 core accepts with no limit and, when
 * accept4() fails with EMFILE, logs "Failed accept4" once and never arms its
 * listener again (grpc/grpc#20418), so a flood that reaches the fd limit
 * leaves a daemon that looks healthy and serves nobody until restarted.
 * Here one thread accepts, keeps at most max_conns connections, answers any
 * connection beyond that (or one that arrives with no descriptor free) with
 * an immediate reset, and hands the others to a callback (gRPC's
 * grpc_server_add_channel_from_fd).  The callback's owner closes the socket
 * when the connection ends and tells nobody, so a connection counts as open
 * while its descriptor still refers to the same socket (device and inode);
 * that is re-checked once a second and whenever the cap is reached.
 */
#ifndef KVS_ACCEPT_H
#define KVS_ACCEPT_H

#include <stdint.h>
#include <stdio.h>

#include "retroinfer/status.h"

/* A connection was accepted: fd is a connected, non-blocking TCP socket;
 * the callee takes ownership of it. */
typedef void (*kvs_accept_fn_t)(void *arg, int fd);

typedef struct kvs_accept_config {
    const char *listen;    /* "host:port" (port 0 = ephemeral); every address the host resolves to */
    uint32_t max_conns;    /* connections held at once, >= 1 */
    kvs_accept_fn_t fn;    /* called on the accept thread for each admitted connection */
    void *arg;             /* its argument */
} kvs_accept_config_t;

typedef struct kvs_accept kvs_accept_t;

/* Bind and listen (no connection is accepted before kvs_accept_start).
 * Errors: RI_ERR_INVALID (malformed address), RI_ERR_TRANSPORT (cannot bind:
 * in use, not a local address), RI_ERR_NOMEM; err says which.  Caller frees
 * with kvs_accept_destroy. */
ri_status_t kvs_accept_create(const kvs_accept_config_t *cfg, kvs_accept_t **acc_p, char *err, size_t errlen);

/* Start the accept thread. */
ri_status_t kvs_accept_start(kvs_accept_t *acc);

/* The bound port (the one chosen when the configured port was 0). */
int kvs_accept_port(const kvs_accept_t *acc);

/* Stop accepting and close the listening sockets: new connections are then
 * refused by the kernel.  Connections already handed over are not touched.
 * Idempotent. */
void kvs_accept_stop(kvs_accept_t *acc);

/* Stop (if not yet) and free.  NULL is a no-op. */
void kvs_accept_destroy(kvs_accept_t *acc);

/* Open connections, accepted and refused counts, as Prometheus text. */
void kvs_accept_metrics_write(kvs_accept_t *acc, FILE *out);

#endif /* KVS_ACCEPT_H */
