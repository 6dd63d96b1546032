/* UCX glue shared by both sides of the data plane (see cm_ucx.h). */
#include "common/cm_ucx.h"

#include <pthread.h>
#include <stdlib.h>

static pthread_once_t cm_ucx_env_done = PTHREAD_ONCE_INIT;

ri_status_t cm_ucx_status(ucs_status_t s)
{
    switch (s) {
    case UCS_OK: return RI_OK;
    case UCS_ERR_NO_MEMORY: return RI_ERR_NOMEM;
    case UCS_ERR_TIMED_OUT: return RI_ERR_TIMEOUT;
    case UCS_ERR_UNREACHABLE: return RI_ERR_UNREACHABLE;
    case UCS_ERR_CONNECTION_RESET:
    case UCS_ERR_ENDPOINT_TIMEOUT:
    case UCS_ERR_REJECTED: return RI_ERR_CONN_RESET;
    case UCS_ERR_CANCELED: return RI_ERR_CANCELLED;
    case UCS_ERR_BUSY: return RI_ERR_BUSY;
    default: return RI_ERR_TRANSPORT;
    }
}

static void cm_ucx_env_set(void)
{
    setenv("UCX_POSIX_ERROR_HANDLING", "y", 0);
    setenv("UCX_SYSV_ERROR_HANDLING", "y", 0);
}

void cm_ucx_env_once(void)
{
    pthread_once(&cm_ucx_env_done, cm_ucx_env_set);
}

ri_status_t cm_ucx_context(const char *name, const ucp_config_t *config, bool rma, ucp_context_h *ctx_p)
{
    ucp_params_t params = {0};
    params.field_mask = UCP_PARAM_FIELD_FEATURES | UCP_PARAM_FIELD_NAME | UCP_PARAM_FIELD_MT_WORKERS_SHARED;
    params.features = UCP_FEATURE_AM | UCP_FEATURE_WAKEUP | (rma ? UCP_FEATURE_RMA : 0);
    /* Several workers (the kvstore's lanes) share one context, and memory is
     * mapped and unmapped from more than one thread (direct regions). */
    params.mt_workers_shared = 1;
    params.name = name;
    return cm_ucx_status(ucp_init(&params, config, ctx_p));
}

ri_status_t cm_ucx_worker(ucp_context_h ctx, ucp_worker_h *worker_p, int *efd_p)
{
    ucp_worker_params_t wp = {0};
    ucs_status_t s;
    wp.field_mask = UCP_WORKER_PARAM_FIELD_THREAD_MODE;
    wp.thread_mode = UCS_THREAD_MODE_SINGLE;
    s = ucp_worker_create(ctx, &wp, worker_p);
    if (s != UCS_OK)
        return cm_ucx_status(s);
    if (efd_p != NULL && ucp_worker_get_efd(*worker_p, efd_p) != UCS_OK)
        *efd_p = -1;
    return RI_OK;
}
