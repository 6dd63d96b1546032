/*
 * UCX glue shared by the kvstore's data plane (kvstore/data) and the
 * worker's client (gpuworker/client), which may not include each other: one
 * status map, the environment both sides need, and the context and worker
 * settings both use.  A library of its own (ri_common_ucx), so that only the
 * programs that speak UCX link it.
 */
#ifndef CM_UCX_H
#define CM_UCX_H

#include <stdbool.h>
#include <ucp/api/ucp.h>

#include "retroinfer/status.h"

/* UCX status to ours (connection failures -> RI_ERR_CONN_RESET, etc.). */
ri_status_t cm_ucx_status(ucs_status_t s);

/*
 * UCX 1.13 leaves its shared-memory transports out of endpoints that ask for
 * peer-failure handling unless their ERROR_HANDLING is on; we want both
 * (shared-memory speed, and errors instead of hangs when the peer dies).
 * ucp_config_modify does not reach transport settings in 1.13, so this sets
 * the environment, once per process, before UCX reads it; a value the user
 * set wins.  Call before any ucp_config_read, before other threads run
 * (setenv is not safe against a concurrent getenv).
 */
void cm_ucx_env_once(void);

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
