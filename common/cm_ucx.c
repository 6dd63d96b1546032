/* UCX glue shared by both sides of the data plane (see cm_ucx.h). */
#include "common/cm_ucx.h"

#include <pthread.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static pthread_once_t cm_ucx_tls_once = PTHREAD_ONCE_INIT;
static char cm_ucx_user_tls[256]; /* UCX_TLS as the process started with it */
static bool cm_ucx_user_tls_set;

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

/* The process's UCX_TLS, once: our code sets no UCX variable after its
 * threads start (kvs_main.c sets the port range before), so the read does
 * not race a setenv. */
static void cm_ucx_read_tls(void)
{
    const char *tls = getenv("UCX_TLS");
    if (tls != NULL && strlen(tls) < sizeof(cm_ucx_user_tls)) {
        memcpy(cm_ucx_user_tls, tls, strlen(tls) + 1);
        cm_ucx_user_tls_set = true;
    }
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

void cm_ucx_tls_no_shm(const char *env, char *out, size_t cap)
{
    static const char *const shm[] = {"sm", "shm", "mm", "posix", "sysv", "cma", "knem", "xpmem"};
    char buf[256], *save = NULL;
    size_t n = 0;
    bool net = false;

    if (env == NULL || env[0] == '\0' || strcmp(env, "all") == 0 || strlen(env) >= sizeof(buf)) {
        snprintf(out, cap, "^sm");
        return;
    }
    if (env[0] == '^') {
        int w = snprintf(out, cap, "%s,sm", env);
        if (w < 0 || (size_t)w >= cap)
            snprintf(out, cap, "^sm");
        return;
    }
    snprintf(buf, sizeof(buf), "%s", env);
    out[0] = '\0';
    for (char *t = strtok_r(buf, ",", &save); t != NULL; t = strtok_r(NULL, ",", &save)) {
        bool drop = false;
        for (size_t i = 0; i < sizeof(shm) / sizeof(shm[0]); i++)
            drop = drop || strcmp(t, shm[i]) == 0;
        if (drop || n + strlen(t) + 2 > cap)
            continue;
        net = net || strcmp(t, "self") != 0;
        n += (size_t)snprintf(out + n, cap - n, "%s%s", n ? "," : "", t);
    }
    if (!net)
        snprintf(out + n, cap - n, "%stcp", n ? "," : "");
}

ri_status_t cm_ucx_client_config(ucp_config_t **config_p)
{
    char tls[256];
    ucp_config_t *config = NULL;
    ri_status_t st;

    pthread_once(&cm_ucx_tls_once, cm_ucx_read_tls);
    cm_ucx_tls_no_shm(cm_ucx_user_tls_set ? cm_ucx_user_tls : NULL, tls, sizeof(tls));
    st = cm_ucx_status(ucp_config_read(NULL, NULL, &config));
    if (st != RI_OK)
        return st;
    st = cm_ucx_status(ucp_config_modify(config, "TLS", tls));
    if (st != RI_OK) {
        ucp_config_release(config);
        return st;
    }
    *config_p = config;
    return RI_OK;
}
