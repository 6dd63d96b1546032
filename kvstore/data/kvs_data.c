/*
 * The catalog side of kvstore/data: create/destroy of the whole object,
 * sessions (validation, secrets, quotas per tenant and global), listing,
 * stats, drain and metrics.  Expected load: a handful of control calls per
 * second from gRPC threads, concurrent with the data-plane thread.
 */
#define _GNU_SOURCE /* explicit_bzero */
#include "kvstore/data/kvs_internal.h"
#include "kvstore/data/kvs_dp.h"

#include <inttypes.h>
#include <string.h>
#include <time.h>

#include "common/cm_alloc.h"
#include "common/cm_log.h"
#include "common/cm_status.h"
#include "common/cm_time.h"

static CM_ALLOC_TAG(kvs_catalog_tag, "kvs.catalog");

/* Fetch latency bucket bounds, seconds. */
static const double kvs_lat_bounds[] = {50e-6, 100e-6, 250e-6, 500e-6, 1e-3,   2.5e-3,
                                        5e-3,  10e-3,  25e-3,  50e-3,  100e-3, 1.0};

static const char *const kvs_errk_names[KVS_ERRK_COUNT] = {
    "protocol", "auth", "not_found", "range", "quota", "nospace", "transport", "other"};

static uint64_t kvs_unix_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (uint64_t)ts.tv_sec * 1000u + (uint64_t)ts.tv_nsec / 1000000u;
}

static bool kvs_tenant_valid(const char *t)
{
    size_t n;

    if (t == NULL)
        return false;
    n = strnlen(t, KVS_TENANT_MAX);
    if (n == 0 || n >= KVS_TENANT_MAX)
        return false;
    for (size_t i = 0; i < n; i++) {
        char c = t[i];
        if (!((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '.' || c == '_' ||
              c == '-'))
            return false;
    }
    return true;
}

static bool kvs_label_valid(const char *l)
{
    size_t n = strnlen(l, KVS_LABEL_MAX);

    if (n >= KVS_LABEL_MAX)
        return false;
    for (size_t i = 0; i < n; i++)
        if ((unsigned char)l[i] < 0x20 || (unsigned char)l[i] > 0x7e)
            return false;
    return true;
}

/* Geometry check; page_tokens 0 means the default 8 (written back). */
bool kvs_geometry_check(kvs_geometry_t *g)
{
    if (g->page_tokens == 0)
        g->page_tokens = 8;
    return g->layers >= 1 && g->layers <= 1024 && g->kv_heads >= 1 && g->kv_heads <= 256 && g->head_dim >= 16 &&
           g->head_dim <= 512 && g->head_dim % 8 == 0 && (g->dtype == KVS_DTYPE_F16 || g->dtype == KVS_DTYPE_BF16) &&
           g->page_tokens >= 1 && g->page_tokens <= 256;
}

static kvs_tenant_t *kvs_tenant_find(kvs_data_t *data, const char *name)
{
    for (size_t i = 0; i < data->n_tenants; i++)
        if (strcmp(data->tenants[i].name, name) == 0)
            return &data->tenants[i];
    return NULL;
}

kvs_tenant_t *kvs_tenant_get_locked(kvs_data_t *data, const char *name)
{
    kvs_tenant_t *t = kvs_tenant_find(data, name);

    if (t != NULL)
        return t;
    if (data->n_tenants == data->cap_tenants) {
        size_t cap = data->cap_tenants ? data->cap_tenants * 2 : 8;
        kvs_tenant_t *nt = cm_realloc(&kvs_catalog_tag, data->tenants, cap * sizeof(*nt));
        if (nt == NULL)
            return NULL;
        data->tenants = nt;
        data->cap_tenants = cap;
    }
    t = &data->tenants[data->n_tenants++];
    memset(t, 0, sizeof(*t));
    snprintf(t->name, sizeof(t->name), "%s", name);
    t->quota = data->cfg.tenant_quota_bytes;
    return t;
}

static uint64_t kvs_session_charge(const kvs_session_t *s)
{
    return CM_MAX(s->reserved_bytes, s->used_bytes);
}

/* Cache directories live on the heap, not in the pool: they count against
 * the tenant's quota and against their own daemon-wide cap (a quarter of the
 * pool, at least 64 MiB), not against the pool's global quota. */
static uint64_t kvs_meta_cap(const kvs_data_t *data)
{
    return CM_MAX((uint64_t)64 << 20, (uint64_t)kvs_pool_size(data->pool) / 4);
}

static ri_status_t kvs_quota_check_locked(kvs_data_t *data, kvs_tenant_t *t, uint64_t delta)
{
    if (delta == 0)
        return RI_OK;
    if (t->quota != 0 && (delta > t->quota || t->charged > t->quota - delta))
        return RI_ERR_QUOTA;
    if (delta > data->global_quota || data->global_charged > data->global_quota - delta)
        return RI_ERR_QUOTA;
    return RI_OK;
}

ri_status_t kvs_session_charge_locked(kvs_data_t *data, kvs_session_t *s, uint64_t more)
{
    kvs_tenant_t *t = kvs_tenant_find(data, s->tenant);
    uint64_t before = kvs_session_charge(s), after, delta;
    ri_status_t st;

    if (t == NULL || s->dropped)
        return RI_ERR_NOT_FOUND;
    if (more > UINT64_MAX - s->used_bytes)
        return RI_ERR_QUOTA;
    after = CM_MAX(s->reserved_bytes, s->used_bytes + more);
    delta = after - before;
    st = kvs_quota_check_locked(data, t, delta);
    if (st != RI_OK)
        return st;
    s->used_bytes += more;
    t->charged += delta;
    data->global_charged += delta;
    return RI_OK;
}

/* Give back pool and directory bytes a live session held (a dropped
 * session's charge was given back whole at drop). */
static void kvs_give_back_locked(kvs_data_t *data, const kvs_session_t *s, uint64_t pool, uint64_t meta)
{
    if (s->dropped)
        return;
    kvs_tenant_t *t = kvs_tenant_find(data, s->tenant);
    if (t != NULL)
        t->charged -= pool + meta;
    data->global_charged -= pool;
    data->meta_charged -= meta;
}

void kvs_session_uncharge_locked(kvs_data_t *data, kvs_session_t *s, uint64_t less)
{
    uint64_t before = kvs_session_charge(s);

    s->used_bytes -= CM_MIN(less, s->used_bytes);
    kvs_give_back_locked(data, s, before - kvs_session_charge(s), 0);
}

ri_status_t kvs_session_charge_meta_locked(kvs_data_t *data, kvs_session_t *s, uint64_t bytes)
{
    kvs_tenant_t *t = kvs_tenant_find(data, s->tenant);
    if (t == NULL || s->dropped)
        return RI_ERR_NOT_FOUND;
    if (t->quota != 0 && (bytes > t->quota || t->charged > t->quota - bytes))
        return RI_ERR_QUOTA;
    if (bytes > kvs_meta_cap(data) || data->meta_charged > kvs_meta_cap(data) - bytes)
        return RI_ERR_QUOTA;
    s->meta_bytes += bytes;
    t->charged += bytes;
    data->meta_charged += bytes;
    return RI_OK;
}

void kvs_session_uncharge_meta_locked(kvs_data_t *data, kvs_session_t *s, uint64_t bytes)
{
    bytes = CM_MIN(bytes, s->meta_bytes);
    s->meta_bytes -= bytes;
    kvs_give_back_locked(data, s, 0, bytes);
}

ri_status_t kvs_session_reserve_extents_locked(kvs_session_t *s, size_t more)
{
    size_t want = s->n_extents + more, cap = s->cap_extents ? s->cap_extents : 16;
    kvs_sextent_t *ne;

    if (want <= s->cap_extents)
        return RI_OK;
    while (cap < want)
        cap *= 2;
    ne = cm_realloc(&kvs_catalog_tag, s->extents, cap * sizeof(*ne));
    if (ne == NULL)
        return RI_ERR_NOMEM;
    s->extents = ne;
    s->cap_extents = cap;
    return RI_OK;
}

ri_status_t kvs_session_add_extent_locked(kvs_session_t *s, uint64_t off, uint64_t bytes)
{
    ri_status_t st = kvs_session_reserve_extents_locked(s, 1);

    if (st != RI_OK)
        return st;
    s->extents[s->n_extents++] = (kvs_sextent_t){.off = off, .bytes = bytes};
    return RI_OK;
}

void kvs_wcache_free(kvs_data_t *data, kvs_wcache_t *wc)
{
    if (wc == NULL)
        return;
    if (wc->owner != NULL && wc->charged != 0)
        kvs_session_uncharge_meta_locked(data, wc->owner, wc->charged);
    kvs_cache_destroy(wc->dir);
    cm_free(wc);
}

/* Free a session nobody references any more. */
static void kvs_session_free_locked(kvs_data_t *data, kvs_session_t *s)
{
    if (kvs_tier_on(data))
        kvs_tier_session_free_locked(data, s); /* per-cluster extents */
    for (size_t i = 0; i < s->n_extents; i++)
        kvs_pool_free(data->pool, s->extents[i].off, s->extents[i].bytes);
    for (uint32_t i = 0; i < KVS_MAX_CACHES_PER_SESSION; i++)
        kvs_wcache_free(data, s->caches[i]);
    kvs_direct_free_locked(data, s);
    kvs_prefix_detach_all_locked(data, s);
    if (s->tables != NULL)
        for (uint64_t i = 0; i < (uint64_t)s->geo.layers * s->geo.kv_heads; i++) {
            cm_free(s->tables[i].c);
            cm_free(s->tables[i].runs);
        }
    cm_free(s->tables);
    cm_free(s->extents);
    cm_free(s);
}

void kvs_session_unref_locked(kvs_data_t *data, kvs_session_t *s)
{
    if (--s->refs == 0)
        kvs_session_free_locked(data, s);
}

kvs_session_t *kvs_session_find_locked(kvs_data_t *data, uint64_t id)
{
    for (uint32_t i = 0; i < data->n_sessions; i++)
        if (data->sessions[i]->id == id)
            return data->sessions[i];
    return NULL;
}

void kvs_count_errors_locked(kvs_data_t *data, ri_status_t st, uint64_t n)
{
    kvs_err_kind_t k;

    switch (ri_status_area(st)) {
    case RI_AREA_PROTOCOL: k = KVS_ERRK_PROTOCOL; break;
    case RI_AREA_AUTH: k = KVS_ERRK_AUTH; break;
    case RI_AREA_QUOTA: k = KVS_ERRK_QUOTA; break;
    case RI_AREA_TRANSPORT: k = KVS_ERRK_TRANSPORT; break;
    default:
        k = st == RI_ERR_NOT_FOUND ? KVS_ERRK_NOT_FOUND
            : (st == RI_ERR_RANGE || st == RI_ERR_INVALID || st == RI_ERR_EXISTS) ? KVS_ERRK_RANGE
            : st == RI_ERR_NOSPACE ? KVS_ERRK_NOSPACE
                                   : KVS_ERRK_OTHER;
    }
    data->errors[k] += n;
}

/* Start the transport with the operations' handler table; its services to
 * the operations (direct regions) in data->xport. */
static ri_status_t kvs_data_start_dp(kvs_data_t *data)
{
    kvs_dp_config_t dc = {.listen_addr = data->cfg.dp_listen_addr, .lanes = data->cfg.dp_lanes,
                          .nice = data->cfg.dp_nice, .spin_us = data->cfg.dp_spin_us, .max_msg_bytes = data->cfg.max_msg_bytes,
                          .drain_timeout_ms = data->cfg.drain_timeout_ms, .lease_ms = data->cfg.lease_ms,
                          .check_program = data->cfg.dp_check_program,
                          .user_tls = data->cfg.ucx_user.tls,
                          .user_net_devices = data->cfg.ucx_user.net_devices,
                          .user_keepalive = data->cfg.ucx_user.keepalive};
    kvs_handlers_t h;
    ri_status_t st;

    kvs_ops_handlers(data, &h);
    st = kvs_dp_start(&dc, &h, &data->dp);
    if (st == RI_OK)
        data->xport = kvs_dp_xport(data->dp);
    return st;
}

ri_status_t kvs_data_create(const kvs_data_config_t *cfg, kvs_data_t **data_p)
{
    kvs_data_t *data;
    ri_status_t st;

    if (cfg == NULL || data_p == NULL || cfg->memory_bytes == 0)
        return RI_ERR_INVALID;
    data = cm_calloc(&kvs_catalog_tag, 1, sizeof(*data));
    if (data == NULL)
        return RI_ERR_NOMEM;
    data->cfg = *cfg;
    cm_hist_init(&data->fetch_lat, kvs_lat_bounds, CM_ARRAY_LEN(kvs_lat_bounds));
    snprintf(data->listen_addr, sizeof(data->listen_addr), "%s",
             cfg->dp_listen_addr && cfg->dp_listen_addr[0] ? cfg->dp_listen_addr : "127.0.0.1:0");
    data->cfg.dp_listen_addr = data->listen_addr;
    if (data->cfg.max_msg_bytes == 0)
        data->cfg.max_msg_bytes = UINT64_C(1) << 30;
    if (data->cfg.drain_timeout_ms == 0)
        data->cfg.drain_timeout_ms = 5000;
    data->next_id = 1;
    pthread_mutex_init(&data->lock, NULL);
    pthread_mutex_init(&data->smf_mu, NULL);
    pthread_mutex_init(&data->pmf_mu, NULL);
    pthread_cond_init(&data->spill_cond, NULL);
    data->sessions = cm_calloc(&kvs_catalog_tag, KVS_MAX_SESSIONS, sizeof(*data->sessions));
    if (data->sessions == NULL) {
        st = RI_ERR_NOMEM;
        goto err_free_data;
    }
    st = kvs_pool_create(cfg->memory_bytes, cfg->hugepages, &data->pool);
    if (st != RI_OK)
        goto err_free_sessions;
    data->global_quota = cfg->global_quota_bytes ? CM_MIN(cfg->global_quota_bytes, kvs_pool_size(data->pool))
                                                 : kvs_pool_size(data->pool);
    kvs_prefix_init(data);
    if (cfg->spill_dir != NULL && cfg->spill_dir[0] != '\0') {
        st = kvs_tier_open(data);
        if (st != RI_OK)
            goto err_free_catalog;
    }
    if (!cfg->no_data_plane) {
        st = kvs_data_start_dp(data);
        if (st != RI_OK)
            goto err_free_catalog;
    }
    st = kvs_lease_start(data);
    if (st != RI_OK)
        goto err_stop_dp;
    *data_p = data;
    return RI_OK;

err_stop_dp:
    kvs_dp_free(data->dp);
    data->dp = NULL;
    data->xport = (kvs_xport_t){0};
err_free_catalog:
    /* Sessions a recovery rebuilt; the spill store keeps its files. */
    pthread_mutex_lock(&data->lock);
    for (uint32_t i = 0; i < data->n_sessions; i++) {
        data->sessions[i]->dropped = true;
        kvs_session_unref_locked(data, data->sessions[i]);
    }
    data->n_sessions = 0;
    pthread_mutex_unlock(&data->lock);
    kvs_tier_destroy_store(data);
    cm_free(data->tenants);
    kvs_pool_destroy(data->pool);
err_free_sessions:
    cm_free(data->sessions);
err_free_data:
    pthread_cond_destroy(&data->spill_cond);
    pthread_mutex_destroy(&data->pmf_mu);
    pthread_mutex_destroy(&data->smf_mu);
    pthread_mutex_destroy(&data->lock);
    cm_free(data);
    return st;
}

void kvs_data_destroy(kvs_data_t *data)
{
    if (data == NULL)
        return;
    /* Stop the reaper and the data plane first: the data plane finishes
     * in-flight ops, then no thread but ours touches the catalog. */
    kvs_lease_stop(data);
    pthread_mutex_lock(&data->lock);
    data->draining = true;
    data->prefix.hook = NULL; /* a clean stop keeps its blocks on disk: nothing to tell */
    pthread_mutex_unlock(&data->lock);
    kvs_dp_stop(data->dp);
    kvs_tier_close(data);
    pthread_mutex_lock(&data->lock);
    for (uint32_t i = 0; i < data->n_sessions; i++) {
        data->sessions[i]->dropped = true;
        kvs_session_unref_locked(data, data->sessions[i]);
    }
    data->n_sessions = 0;
    kvs_prefix_destroy(data);
    pthread_mutex_unlock(&data->lock);
    kvs_dp_free(data->dp);
    kvs_tier_destroy_store(data);
    kvs_pool_destroy(data->pool);
    cm_free(data->tenants);
    cm_free(data->sessions);
    pthread_cond_destroy(&data->spill_cond);
    pthread_mutex_destroy(&data->pmf_mu);
    pthread_mutex_destroy(&data->smf_mu);
    pthread_mutex_destroy(&data->lock);
    cm_free(data);
}

bool kvs_data_ucx_port_range(const char *listen_addr, uint32_t lanes, char *out, size_t cap)
{
    return kvs_dp_port_range(listen_addr, lanes, out, cap);
}

const char *kvs_data_address(const kvs_data_t *data, uint64_t session_id)
{
    return data->dp ? kvs_dp_address(data->dp, session_id) : "";
}

ri_status_t kvs_data_set_tenant_quota(kvs_data_t *data, const char *tenant, uint64_t bytes)
{
    kvs_tenant_t *t;
    ri_status_t st = RI_OK;

    if (data == NULL || !kvs_tenant_valid(tenant))
        return RI_ERR_INVALID;
    pthread_mutex_lock(&data->lock);
    t = kvs_tenant_get_locked(data, tenant);
    if (t == NULL) {
        st = RI_ERR_NOMEM;
    } else {
        t->quota = bytes;
        t->quota_set = true;
    }
    pthread_mutex_unlock(&data->lock);
    return st;
}

/* Take back a session whose manifest write failed, unless someone dropped
 * it meanwhile: as a drop, so that a manifest written since (by another
 * change, with it) is rewritten without it. */
static void kvs_session_create_undo(kvs_data_t *data, uint64_t id)
{
    kvs_tier_smf_t smf = {.st = RI_OK};
    bool found = false;

    pthread_mutex_lock(&data->lock);
    for (uint32_t i = 0; i < data->n_sessions; i++) {
        if (data->sessions[i]->id == id) {
            (void)kvs_session_remove_locked(data, i, &smf);
            found = true;
            break;
        }
    }
    pthread_mutex_unlock(&data->lock);
    if (found)
        (void)kvs_tier_smf_finish(data, &smf);
}

ri_status_t kvs_data_session_create(kvs_data_t *data, const char *tenant, const kvs_geometry_t *geometry,
                                    uint64_t expected_tokens, const char *label, uint64_t *id_p,
                                    uint8_t secret_p[CM_WIRE_SECRET_SIZE])
{
    kvs_session_t *s;
    kvs_tenant_t *t;
    kvs_geometry_t g;
    kvs_tier_smf_t smf;
    uint8_t secret[CM_WIRE_SECRET_SIZE];
    uint64_t n_tables, reserve, id;
    ri_status_t st;

    if (data == NULL || geometry == NULL || id_p == NULL || secret_p == NULL || !kvs_tenant_valid(tenant))
        return RI_ERR_INVALID;
    if (label == NULL)
        label = "";
    g = *geometry;
    if (!kvs_geometry_check(&g) || !kvs_label_valid(label) || expected_tokens > KVS_MAX_EXPECTED_TOKENS)
        return RI_ERR_INVALID;
    s = cm_calloc(&kvs_catalog_tag, 1, sizeof(*s));
    if (s == NULL)
        return RI_ERR_NOMEM;
    n_tables = (uint64_t)g.layers * g.kv_heads;
    s->tables = cm_calloc(&kvs_catalog_tag, n_tables, sizeof(kvs_table_t));
    if (s->tables == NULL) {
        st = RI_ERR_NOMEM;
        goto err_free_session;
    }
    st = cm_random_bytes(s->secret, sizeof(s->secret));
    if (st != RI_OK)
        goto err_free_session;
    s->geo = g;
    snprintf(s->tenant, sizeof(s->tenant), "%s", tenant);
    snprintf(s->label, sizeof(s->label), "%s", label);
    s->created_unix_ms = kvs_unix_ms();
    s->lease_ns = cm_time_ns(); /* the worker has one lease period to connect */
    s->page_bytes = 2ull * g.page_tokens * g.head_dim * 2u;
    /* Bounded: 2^30 tokens * 2^18 tables * 2 KiB per token < 2^64. */
    reserve = (expected_tokens + g.page_tokens - 1) / g.page_tokens * s->page_bytes * n_tables;
    s->reserved_bytes = kvs_pool_round(reserve);
    s->refs = 1;

    pthread_mutex_lock(&data->lock);
    if (data->draining) {
        st = RI_ERR_SHUTDOWN;
        goto err_unlock;
    }
    if (data->n_sessions == KVS_MAX_SESSIONS) {
        st = RI_ERR_QUOTA;
        goto err_unlock;
    }
    t = kvs_tenant_get_locked(data, tenant);
    if (t == NULL) {
        st = RI_ERR_NOMEM;
        goto err_unlock;
    }
    st = kvs_quota_check_locked(data, t, s->reserved_bytes);
    if (st != RI_OK)
        goto err_unlock;
    t->charged += s->reserved_bytes;
    data->global_charged += s->reserved_bytes;
    s->id = data->next_id++;
    data->sessions[data->n_sessions++] = s;
    id = s->id;
    reserve = s->reserved_bytes;
    memcpy(secret, s->secret, CM_WIRE_SECRET_SIZE);
    kvs_tier_session_created_locked(data, &smf);
    pthread_mutex_unlock(&data->lock);
    /* Acknowledge only what --recover would find: the manifest is written
     * without the lock (the session is already listed, but nobody knows its
     * secret yet), and a session it could not record (disk full) is undone
     * and the call fails.  s may be gone by now (an admin's drop by id). */
    st = kvs_tier_smf_finish(data, &smf);
    if (st != RI_OK) {
        kvs_session_create_undo(data, id);
        explicit_bzero(secret, sizeof(secret));
        return st;
    }
    *id_p = id;
    memcpy(secret_p, secret, CM_WIRE_SECRET_SIZE);
    explicit_bzero(secret, sizeof(secret));
    cm_info("session %" PRIu64 " created for tenant %s (%u layers, %u kv heads, d=%u, reserve %" PRIu64 " bytes)",
            id, tenant, g.layers, g.kv_heads, g.head_dim, reserve);
    return RI_OK;

err_unlock:
    pthread_mutex_unlock(&data->lock);
err_free_session:
    cm_free(s->tables);
    cm_free(s);
    return st;
}

/* Does a session owned by `have` belong to the scope `want` (NULL = every tenant)? */
static bool kvs_tenant_in_scope(const char *want, const char *have)
{
    return want == NULL || strcmp(want, have) == 0;
}

uint64_t kvs_session_remove_locked(kvs_data_t *data, uint32_t i, kvs_tier_smf_t *smf)
{
    kvs_session_t *s = data->sessions[i];
    uint64_t id = s->id, freed = s->used_bytes + s->disk_bytes, charge = kvs_session_charge(s);
    kvs_tenant_t *t = kvs_tenant_find(data, s->tenant);

    data->sessions[i] = data->sessions[--data->n_sessions];
    if (t != NULL)
        t->charged -= charge + s->meta_bytes;
    data->global_charged -= charge;
    data->meta_charged -= s->meta_bytes;
    s->dropped = true;
    kvs_tier_session_dropped_locked(data, id, smf); /* memory only: the caller writes */
    /* Pages go back now when the data plane is not using the session, else
     * when its last data-plane reference ends. */
    kvs_session_unref_locked(data, s);
    return freed;
}

ri_status_t kvs_data_session_drop(kvs_data_t *data, const char *tenant, uint64_t id, uint64_t *bytes_freed_p)
{
    kvs_tier_smf_t smf = {.st = RI_OK};
    uint64_t freed = 0;
    bool found = false;

    if (data == NULL)
        return RI_ERR_INVALID;
    pthread_mutex_lock(&data->lock);
    for (uint32_t i = 0; i < data->n_sessions; i++) {
        if (data->sessions[i]->id == id && kvs_tenant_in_scope(tenant, data->sessions[i]->tenant)) {
            freed = kvs_session_remove_locked(data, i, &smf);
            found = true;
            break;
        }
    }
    pthread_mutex_unlock(&data->lock);
    if (!found)
        return RI_ERR_NOT_FOUND;
    /* Before the answer, so that --recover never brings the session back.
     * A failure (logged) leaves it in the old manifest: it would come back
     * empty (its spilled records are gone). */
    (void)kvs_tier_smf_finish(data, &smf);
    if (bytes_freed_p != NULL)
        *bytes_freed_p = freed;
    cm_info("session %" PRIu64 " dropped (%" PRIu64 " bytes)", id, freed);
    return RI_OK;
}

static void kvs_session_info_fill(const kvs_session_t *s, kvs_session_info_t *info)
{
    memset(info, 0, sizeof(*info));
    info->id = s->id;
    snprintf(info->tenant, sizeof(info->tenant), "%s", s->tenant);
    snprintf(info->label, sizeof(info->label), "%s", s->label);
    info->geometry = s->geo;
    info->bytes_in_pool = s->used_bytes;
    info->bytes_on_disk = s->disk_bytes;
    info->clusters = s->clusters;
    info->created_unix_ms = s->created_unix_ms;
}

ri_status_t kvs_data_session_list(kvs_data_t *data, const char *tenant, kvs_session_info_t **infos_p, size_t *n_p)
{
    kvs_session_info_t *infos = NULL;
    size_t n = 0;

    if (data == NULL || infos_p == NULL || n_p == NULL)
        return RI_ERR_INVALID;
    pthread_mutex_lock(&data->lock);
    for (uint32_t i = 0; i < data->n_sessions; i++)
        n += kvs_tenant_in_scope(tenant, data->sessions[i]->tenant);
    if (n > 0) {
        infos = cm_malloc(&kvs_catalog_tag, n * sizeof(*infos));
        if (infos == NULL) {
            pthread_mutex_unlock(&data->lock);
            return RI_ERR_NOMEM;
        }
        n = 0;
        for (uint32_t i = 0; i < data->n_sessions; i++)
            if (kvs_tenant_in_scope(tenant, data->sessions[i]->tenant))
                kvs_session_info_fill(data->sessions[i], &infos[n++]);
    }
    pthread_mutex_unlock(&data->lock);
    *infos_p = infos;
    *n_p = n;
    return RI_OK;
}

ri_status_t kvs_data_drop_tenant(kvs_data_t *data, const char *tenant, uint32_t *n_dropped_p,
                                 uint64_t *bytes_freed_p)
{
    kvs_session_info_t *infos = NULL;
    size_t n = 0;
    uint32_t dropped = 0;
    uint64_t bytes = 0;

    if (tenant == NULL)
        return RI_ERR_INVALID;
    ri_status_t st = kvs_data_session_list(data, tenant, &infos, &n);
    if (st != RI_OK)
        return st;
    /* One at a time through the ordinary drop: a session the data plane is
     * using goes away when its last reference ends, as for DropSession. */
    for (size_t i = 0; i < n; i++) {
        uint64_t freed = 0;
        if (kvs_data_session_drop(data, tenant, infos[i].id, &freed) == RI_OK) {
            dropped++;
            bytes += freed;
        }
    }
    cm_free(infos);
    if (n_dropped_p != NULL)
        *n_dropped_p = dropped;
    if (bytes_freed_p != NULL)
        *bytes_freed_p = bytes;
    return RI_OK;
}

void kvs_data_stats(kvs_data_t *data, const char *tenant, kvs_data_stats_t *stats_p)
{
    kvs_data_stats_t s = {0};
    kvs_pool_stats_t ps;

    kvs_pool_stats(data->pool, &ps);
    s.pool_bytes_total = ps.total_bytes;
    s.pool_bytes_used = ps.used_bytes;
    s.disk_bytes_used = kvs_tier_disk_bytes(data);
    pthread_mutex_lock(&data->lock);
    s.sessions_all = data->n_sessions;
    for (uint32_t i = 0; i < data->n_sessions; i++) {
        if (tenant != NULL && strcmp(data->sessions[i]->tenant, tenant) == 0) {
            s.sessions_tenant++;
            s.clusters_tenant += data->sessions[i]->clusters;
        }
    }
    s.fetches = data->fetches;
    s.cache_hits = data->cache_hits;
    s.cache_misses = data->cache_misses;
    s.bytes_sent = data->bytes_sent;
    for (int k = 0; k < KVS_ERRK_COUNT; k++)
        s.errors += data->errors[k];
    s.prefix.blocks_memory = data->prefix.blocks;
    s.prefix.bytes_memory = data->prefix.bytes;
    s.prefix.blocks_disk = data->prefix.disk_blocks;
    s.prefix.bytes_disk = data->prefix.disk_bytes;
    s.prefix.attach_hits = data->prefix.attach_hits;
    s.prefix.attach_misses = data->prefix.attach_misses;
    s.prefix.tokens_attached = data->prefix.tokens_attached;
    s.prefix.publishes_new = data->prefix.put_new;
    s.prefix.publishes_existing = data->prefix.put_existed;
    s.prefix.publishes_refused = data->prefix.put_refused;
    s.prefix.evictions = data->prefix.evictions;
    s.prefix.spills = data->prefix.spills;
    s.prefix.corrupt = data->prefix.corrupt;
    pthread_mutex_unlock(&data->lock);
    *stats_p = s;
}

uint32_t kvs_data_drain(kvs_data_t *data)
{
    uint32_t n;

    pthread_mutex_lock(&data->lock);
    data->draining = true;
    n = data->n_sessions;
    pthread_mutex_unlock(&data->lock);
    return n;
}

double kvs_data_pool_pressure(kvs_data_t *data)
{
    return kvs_pool_pressure(data->pool);
}

void kvs_data_pool_info(kvs_data_t *data, kvs_data_pool_info_t *info_p)
{
    kvs_pool_stats_t ps;

    kvs_pool_stats(data->pool, &ps);
    info_p->total_bytes = ps.total_bytes;
    info_p->used_bytes = ps.used_bytes;
    info_p->largest_free_bytes = ps.largest_free_bytes;
    info_p->free_extents = ps.free_extents;
    info_p->hugepages = (int)kvs_pool_backing(data->pool);
}

void kvs_data_metrics_write(kvs_data_t *data, FILE *out)
{
    kvs_pool_stats_t ps;
    uint64_t clusters = 0;

    kvs_pool_stats(data->pool, &ps);
    fprintf(out, "# HELP ri_kvs_pool_bytes Host block pool bytes by state.\n# TYPE ri_kvs_pool_bytes gauge\n");
    fprintf(out, "ri_kvs_pool_bytes{state=\"used\"} %" PRIu64 "\n", ps.used_bytes);
    fprintf(out, "ri_kvs_pool_bytes{state=\"free\"} %" PRIu64 "\n", ps.total_bytes - ps.used_bytes);
    fprintf(out, "# HELP ri_kvs_pool_free_extents Free extents in the pool (fragmentation).\n"
                 "# TYPE ri_kvs_pool_free_extents gauge\nri_kvs_pool_free_extents %" PRIu64 "\n",
            ps.free_extents);
    fprintf(out, "# HELP ri_kvs_pool_largest_free_bytes Largest free extent.\n"
                 "# TYPE ri_kvs_pool_largest_free_bytes gauge\nri_kvs_pool_largest_free_bytes %" PRIu64 "\n",
            ps.largest_free_bytes);
    pthread_mutex_lock(&data->lock);
    for (uint32_t i = 0; i < data->n_sessions; i++)
        clusters += data->sessions[i]->clusters;
    fprintf(out, "# HELP ri_kvs_sessions Open sessions.\n# TYPE ri_kvs_sessions gauge\nri_kvs_sessions %u\n",
            data->n_sessions);
    fprintf(out, "# HELP ri_kvs_sessions_expired_total Sessions dropped because their lease ran out (no data-plane "
                 "connection and no KeepAlive for session-lease-ms).\n# TYPE ri_kvs_sessions_expired_total counter\n"
                 "ri_kvs_sessions_expired_total %" PRIu64 "\n",
            data->sessions_expired);
    fprintf(out, "# HELP ri_kvs_clusters Clusters stored.\n# TYPE ri_kvs_clusters gauge\nri_kvs_clusters %" PRIu64 "\n",
            clusters);
    fprintf(out, "# HELP ri_kvs_fetches_total Ranked fetches served.\n# TYPE ri_kvs_fetches_total counter\n"
                 "ri_kvs_fetches_total %" PRIu64 "\n",
            data->fetches);
    fprintf(out, "# HELP ri_kvs_cache_clusters_total Clusters answered, by outcome.\n"
                 "# TYPE ri_kvs_cache_clusters_total counter\n"
                 "ri_kvs_cache_clusters_total{outcome=\"hit\"} %" PRIu64 "\n"
                 "ri_kvs_cache_clusters_total{outcome=\"miss\"} %" PRIu64 "\n",
            data->cache_hits, data->cache_misses);
    fprintf(out, "# HELP ri_kvs_dp_bytes_total Data-plane bytes, by direction.\n# TYPE ri_kvs_dp_bytes_total counter\n"
                 "ri_kvs_dp_bytes_total{dir=\"sent\"} %" PRIu64 "\nri_kvs_dp_bytes_total{dir=\"received\"} %" PRIu64
                 "\n",
            data->bytes_sent, data->bytes_received);
    fprintf(out, "# HELP ri_kvs_dp_ops_total Data-plane requests, by op.\n# TYPE ri_kvs_dp_ops_total counter\n");
    for (uint32_t op = 1; op <= CM_WIRE_OP_MAX; op++)
        fprintf(out, "ri_kvs_dp_ops_total{op=\"%s\"} %" PRIu64 "\n", cm_wire_op_name(op), data->ops[op]);
    fprintf(out, "# HELP ri_kvs_direct_regions Sessions with a direct region (workers read it themselves).\n"
                 "# TYPE ri_kvs_direct_regions gauge\nri_kvs_direct_regions %" PRIu64 "\n"
                 "# HELP ri_kvs_direct_bytes Bytes of the direct regions.\n"
                 "# TYPE ri_kvs_direct_bytes gauge\nri_kvs_direct_bytes %" PRIu64 "\n"
                 "# HELP ri_kvs_direct_reads_total Clusters workers read directly (their TOUCH records).\n"
                 "# TYPE ri_kvs_direct_reads_total counter\nri_kvs_direct_reads_total %" PRIu64 "\n",
            data->direct_regions, data->direct_bytes, data->direct_reads);
    fprintf(out, "# HELP ri_kvs_dp_errors_total Data-plane error replies, by kind.\n"
                 "# TYPE ri_kvs_dp_errors_total counter\n");
    for (int k = 0; k < KVS_ERRK_COUNT; k++)
        fprintf(out, "ri_kvs_dp_errors_total{kind=\"%s\"} %" PRIu64 "\n", kvs_errk_names[k], data->errors[k]);
    cm_hist_write_prom(&data->fetch_lat, out, "ri_kvs_fetch_latency_seconds", "Ranked fetch service time.", NULL);
    fprintf(out, "# HELP ri_kvs_cache_hit_ratio Hit ratio of each worker cache.\n# TYPE ri_kvs_cache_hit_ratio gauge\n");
    for (uint32_t i = 0; i < data->n_sessions; i++) {
        kvs_session_t *s = data->sessions[i];
        for (uint32_t c = 0; c < KVS_MAX_CACHES_PER_SESSION; c++) {
            kvs_cache_counters_t cc;
            if (s->caches[c] == NULL)
                continue;
            kvs_cache_counters(s->caches[c]->dir, &cc);
            fprintf(out, "ri_kvs_cache_hit_ratio{session=\"%" PRIu64 "\",cache=\"%u\"} %.6f\n", s->id,
                    s->caches[c]->id, cc.hits + cc.misses ? (double)cc.hits / (double)(cc.hits + cc.misses) : 0.0);
        }
    }
    kvs_prefix_metrics_write_locked(data, out);
    kvs_tier_metrics_write_locked(data, out);
    pthread_mutex_unlock(&data->lock);
}
