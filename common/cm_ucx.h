/*
 * UCX glue shared by the kvstore's data plane (kvstore/data) and the
 * worker's client (gpuworker/client), which may not include each other: one
 * status map, the transports both sides use, and the context and worker
 * settings both use.  A library of its own (ri_common_ucx), so that only the
 * programs that speak UCX link it.
 */
#ifndef CM_UCX_H
#define CM_UCX_H

#include <stdbool.h>
#include <stddef.h>
#include <ucp/api/ucp.h>

#include "retroinfer/status.h"

/* UCX status to ours (connection failures -> RI_ERR_CONN_RESET, etc.). */
ri_status_t cm_ucx_status(ucs_status_t s);

/*
 * UCX_TLS with the shared-memory transports taken out: env is a UCX_TLS
 * value (NULL: unset), out gets the list to use ("^sm" when unset or
 * "all", tcp added when nothing but "self" would be left).  The kvstore's
 * segments would hold every tenant's uploads and replies where any process
 * of its uid or group could attach them (SysV 0660, /dev/shm files, /proc
 * links), a worker of another uid could not attach them anyway, and a
 * non-dumpable process breaks cma and posix's /proc links.  A same-host
 * worker reads its clusters from its direct region instead, which needs no
 * UCX transport.
 */
void cm_ucx_tls_no_shm(const char *env, char *out, size_t cap);

/*
 * The configuration of a worker's client context: the environment's, with
 * TLS from cm_ucx_tls_no_shm(the UCX_TLS that UCX read, once a process).
 * The kvstore never offers shared memory, so the client's would go unused;
 * it would still cost each connection's UCX worker its segments (about 3
 * MiB of a machine's shared memory: one SysV segment, one /dev/shm file).
 * Caller ucp_config_release()s *config_p.
 */
ri_status_t cm_ucx_client_config(ucp_config_t **config_p);

/* A ucp context with active messages and wake-ups, named name; config (may
 * be NULL: the environment's) is borrowed.  rma adds one-sided operations:
 * a worker's, to read and map.  Never for a server: over TCP, UCX serves
 * one-sided reads in software, from whatever address the peer names (no
 * bounds: a key of one region read another tenant's memory that way, and a
 * bad address would crash the server).  Caller ucp_cleanup()s it. */
ri_status_t cm_ucx_context(const char *name, const ucp_config_t *config, bool rma, ucp_context_h *ctx_p);

/* A single-threaded worker of ctx and its event fd (-1 when UCX has none).
 * Caller ucp_worker_destroy()s it. */
ri_status_t cm_ucx_worker(ucp_context_h ctx, ucp_worker_h *worker_p, int *efd_p);

#endif /* CM_UCX_H */
