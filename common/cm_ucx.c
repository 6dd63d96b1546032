/* UCX glue shared by both sides of the data plane (see cm_ucx.h). */
#include "common/cm_ucx.h"

#include <pthread.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

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

/* The TLS value UCX read into config (its own variable: our libraries
 * read no environment), copied into out; false when it cannot be told. */
static bool cm_ucx_config_tls(const ucp_config_t *config, char *out, size_t cap)
{
    char *text = NULL, *save = NULL;
    size_t len = 0;
    bool found = false;
    FILE *f = open_memstream(&text, &len);

    if (f == NULL)
        return false;
    ucp_config_print(config, f, NULL, UCS_CONFIG_PRINT_CONFIG);
    if (fclose(f) != 0 || text == NULL) {
        free(text);
        return false;
    }
    for (char *l = strtok_r(text, "\n", &save); l != NULL && !found; l = strtok_r(NULL, "\n", &save))
        if (strncmp(l, "UCX_TLS=", 8) == 0 && strlen(l + 8) < cap) {
            memcpy(out, l + 8, strlen(l + 8) + 1);
            found = true;
        }
    free(text);
    return found;
}

static pthread_once_t cm_ucx_client_once = PTHREAD_ONCE_INIT;
static char cm_ucx_client_tls[256]; /* cm_ucx_client_config's TLS, made once */

/* The process's UCX settings do not change once read: filter its TLS list
 * once, not at every connection (two a request). */
static void cm_ucx_client_tls_init(void)
{
    char user[256];
    ucp_config_t *config = NULL;
    bool have = ucp_config_read(NULL, NULL, &config) == UCS_OK && cm_ucx_config_tls(config, user, sizeof(user));

    if (config != NULL)
        ucp_config_release(config);
    cm_ucx_tls_no_shm(have ? user : NULL, cm_ucx_client_tls, sizeof(cm_ucx_client_tls));
}

ri_status_t cm_ucx_client_config(ucp_config_t **config_p)
{
    ucp_config_t *config = NULL;
    ri_status_t st;

    pthread_once(&cm_ucx_client_once, cm_ucx_client_tls_init);
    st = cm_ucx_status(ucp_config_read(NULL, NULL, &config));
    if (st != RI_OK)
        return st;
    st = cm_ucx_status(ucp_config_modify(config, "TLS", cm_ucx_client_tls));
    if (st != RI_OK) {
        ucp_config_release(config);
        return st;
    }
    *config_p = config;
    return RI_OK;
}
