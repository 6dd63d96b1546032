/* Process-wide settings shared by the programs (see cm_runtime.h). */
#include "common/cm_runtime.h"

#include <stdio.h>

#include "common/cm_log.h"
#include "common/cm_thread.h"

typedef struct cm_runtime_env {
    cm_runtime_t rt;
} cm_runtime_env_t;

static const cm_config_item_t cm_runtime_items[] = {
    CM_RUNTIME_LOG_ITEM(cm_runtime_env_t, rt),
    CM_RUNTIME_COMPUTE_ITEMS(cm_runtime_env_t, rt),
};

/* Read as RI_RUNTIME_<NAME> or, as documented, the items' RI_* aliases. */
static const cm_config_table_t cm_runtime_table = {
    "runtime", "RI_RUNTIME_", cm_runtime_items, sizeof(cm_runtime_items) / sizeof(cm_runtime_items[0]), 0, NULL,
};

ri_status_t cm_runtime_from_env(cm_runtime_t *rt, char *err, size_t errlen)
{
    cm_runtime_env_t env;
    ri_status_t st = cm_config_defaults(&cm_runtime_table, &env, err, errlen);
    if (st == RI_OK)
        st = cm_config_load_env(&cm_runtime_table, &env, err, errlen);
    if (st != RI_OK) {
        cm_config_free(&cm_runtime_table, &env);
        return st;
    }
    *rt = env.rt;
    return RI_OK;
}

void cm_runtime_free(cm_runtime_t *rt)
{
    cm_runtime_env_t env = {*rt};
    cm_config_free(&cm_runtime_table, &env);
    *rt = env.rt;
}

ri_status_t cm_runtime_apply(const cm_runtime_t *rt, char *err, size_t errlen)
{
    cm_log_level_t level = CM_LOG_INFO;
    bool set_level = rt->log_level != NULL && rt->log_level[0] != '\0';

    if (set_level && cm_log_level_parse(rt->log_level, &level) != RI_OK) {
        snprintf(err, errlen, "log-level (RI_LOG_LEVEL) '%s' is not one of error, warn, info, debug, trace",
                 rt->log_level);
        return RI_ERR_INVALID;
    }
    if (cm_pool_default_set_threads((unsigned)rt->threads) != RI_OK) {
        snprintf(err, errlen, "threads (RI_THREADS) %lld: the default pool already runs with %u threads",
                 (long long)rt->threads, cm_pool_size(cm_pool_default()));
        return RI_ERR_BUSY;
    }
    if (rt->pool_spin_us > 0)
        cm_pool_set_spin_us(cm_pool_default(), (unsigned)rt->pool_spin_us);
    if (set_level)
        cm_log_set_level(level);
    return RI_OK;
}

ri_status_t cm_runtime_setup_from_env(cm_runtime_apply_fn_t apply, char *err, size_t errlen)
{
    cm_runtime_t rt;
    ri_status_t st = cm_runtime_from_env(&rt, err, errlen);
    if (st != RI_OK)
        return st;
    st = apply(&rt, err, errlen);
    cm_runtime_free(&rt);
    return st;
}
