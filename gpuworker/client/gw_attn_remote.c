/*
 * The "retroinfer-remote" attention backend (gw_attn_remote.h) on the public
 * API: prefill is the runtime's exact attention, prefill_end builds and
 * uploads a layer's index (ri_prefill), decode is ri_decode on the layer's
 * view of the sequence's cache.  Workload: one sequence per request, one
 * decode call per layer and generated token.
 */
#include "gpuworker/client/gw_attn_remote.h"

#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/cm_alloc.h"
#include "common/cm_log.h"
#include "common/cm_status.h"
#include "common/cm_thread.h"
#include "common/cm_time.h"
#include "kernels/kn_mem.h"
#include "kernels/kn_ops.h"
#include "gpuworker/model/mdl_kv_mem.h"
#include "gpuworker/client/gw_attn_cluster.h"
#include "gpuworker/client/ri_api_int.h"
#include "retroinfer/retroinfer.h"

static CM_ALLOC_TAG(gw_attn_tag, "gw.attn.remote");

/* Process-wide settings and counters. */
static struct {
    pthread_mutex_t lock;
    ri_client_h client;       /* NULL until configured, and in cluster mode */
    gw_cl_t *cl;              /* cluster mode's node pool, or NULL */
    gw_attn_remote_cfg_t cfg; /* strings owned below */
    char *address, *token;
    bool registered;
    unsigned live;            /* sequences on the backend */
    gw_attn_remote_totals_t tot;
    float *errs;              /* compare_full samples */
    size_t n_errs, cap_errs;
} gw_g = {.lock = PTHREAD_MUTEX_INITIALIZER};

typedef struct gw_attn {
    mdl_kv_t *kv;             /* borrowed from the sequence */
    mdl_attn_cfg_t cfg;
    ri_session_h sess;
    mdl_attn_stats_t st;      /* for mdl_seq_attn_stats */
    ri_session_stats_t last;  /* counters already added to the totals */
    bool compare;
    float *full;              /* [n_heads][d] exact output (compare) */
    bool release;             /* give back each layer's K/V once in the kvstore */
    const mdl_prefix_src_t *prefix; /* cfg->prefix (borrowed), or NULL */
    bool built_pending;       /* prefix->built not called yet: hold every release back */
    size_t *released;         /* [n_layers] tokens [sink, released[l]) given back */
    gw_cl_t *cl;              /* cluster mode: the pool the session came from, or NULL */
    char node[CM_CLUSTER_NAME_MAX]; /* cluster mode: the session's node */
    uint64_t recorded_id;     /* cluster mode: the session id of its owner record */
} gw_attn_t;

/* Cluster mode: the node chosen for the next sequence of this thread
 * (gw_attn_remote_place), "" = rank as usual. */
static _Thread_local char gw_place_hint[CM_CLUSTER_NAME_MAX];

/* Give back the tokens of layer the library no longer reads: they are in
 * the kvstore (ri_session_indexed_end).  Not with compare_full, whose exact
 * pass reads every token. */
static void gw_attn_release(gw_attn_t *a, uint32_t layer)
{
    size_t end = 0, from;
    if (!a->release || a->built_pending || ri_session_indexed_end(a->sess, layer, &end) != RI_OK)
        return;
    from = CM_MAX(a->released[layer], (size_t)a->cfg.wave.sink_tokens);
    if (end <= from)
        return;
    uint64_t b = mdl_kv_release(a->kv, layer, from, end);
    a->released[layer] = end;
    pthread_mutex_lock(&gw_g.lock);
    gw_g.tot.released_bytes += b;
    pthread_mutex_unlock(&gw_g.lock);
}

static ri_kv_view_t gw_attn_view(const mdl_kv_t *kv, uint32_t layer, size_t n)
{
    return (ri_kv_view_t){.struct_size = sizeof(ri_kv_view_t), .k = kv->k[layer], .v = kv->v[layer], .n_tokens = n,
                          .token_stride = kv->token_stride, .head_stride = kv->head_stride};
}

/* Add the session's counters since the last call to the totals. */
static void gw_attn_account(gw_attn_t *a)
{
    ri_session_stats_t now = {.struct_size = sizeof(now)};
    if (ri_session_stats(a->sess, &now) != RI_OK)
        return;
    pthread_mutex_lock(&gw_g.lock);
    gw_g.tot.steps += now.steps - a->last.steps;
    gw_g.tot.hits += now.hits - a->last.hits;
    gw_g.tot.misses += now.misses - a->last.misses;
    gw_g.tot.fetched_bytes += now.fetched_bytes - a->last.fetched_bytes;
    gw_g.tot.uploaded_bytes += now.uploaded_bytes - a->last.uploaded_bytes;
    gw_g.tot.recoveries += now.recoveries - a->last.recoveries;
    gw_g.tot.build_s += now.build_s - a->last.build_s;
    gw_g.tot.fetch_wait_s += now.fetch_wait_s - a->last.fetch_wait_s;
    gw_g.tot.late_steps += now.late_steps - a->last.late_steps;
    gw_g.tot.late_clusters += now.late_clusters - a->last.late_clusters;
    gw_g.tot.direct_steps += now.direct_steps - a->last.direct_steps;
    gw_g.tot.direct_clusters += now.direct_clusters - a->last.direct_clusters;
    gw_g.tot.resident_bytes += now.resident_bytes - a->last.resident_bytes; /* a gauge: the sum of the latest */
    gw_g.tot.max_wait_s = CM_MAX(gw_g.tot.max_wait_s, now.max_wait_s);
    pthread_mutex_unlock(&gw_g.lock);
    a->st.build_s += now.build_s - a->last.build_s;
    a->last = now;
}

static void gw_attn_destroy(void *state)
{
    gw_attn_t *a = state;
    if (a == NULL)
        return;
    if (a->sess != NULL) {
        gw_attn_account(a);
        ri_session_close(a->sess);
        if (a->cl != NULL)
            gw_cl_session_gone(a->cl, a->node, a->recorded_id);
    }
    cm_free(a->full);
    cm_free(a->released);
    pthread_mutex_lock(&gw_g.lock);
    gw_g.live--;
    gw_g.tot.resident_bytes -= CM_MIN(gw_g.tot.resident_bytes, a->last.resident_bytes); /* no longer held */
    pthread_mutex_unlock(&gw_g.lock);
    cm_free(a);
}

/* Attach the preloaded blocks to the new session (before any prefill), so
 * that each layer's build imports them.  Fewer than preloaded (an admin
 * dropped one meanwhile): RI_ERR_NOT_FOUND, and the caller prefills whole. */
static ri_status_t gw_attn_attach(gw_attn_t *a, const mdl_prefix_src_t *prefix)
{
    uint32_t n_att = 0;
    ri_status_t st;

    a->prefix = prefix;
    a->built_pending = prefix != NULL && prefix->built != NULL;
    if (prefix == NULL || prefix->keys == NULL || prefix->n_keys == 0)
        return RI_OK;
    st = ri_session_attach_prefix(a->sess, prefix->keys, prefix->n_keys, &n_att);
    if (st != RI_OK) {
        cm_warn("attention backend %s: %s", GW_ATTN_REMOTE_NAME, ri_last_error());
        return st;
    }
    if (n_att < prefix->n_keys) {
        cm_warn("attention backend %s: %u of %u prefix blocks still cached: the prompt is prefilled whole",
                GW_ATTN_REMOTE_NAME, n_att, prefix->n_keys);
        return RI_ERR_NOT_FOUND;
    }
    return RI_OK;
}

static ri_status_t gw_attn_create(const mdl_attn_cfg_t *cfg, mdl_kv_t *kv, void **state_p)
{
    ri_session_params_t sp;
    gw_attn_t *a;
    ri_status_t st;

    pthread_mutex_lock(&gw_g.lock);
    ri_client_h client = gw_g.client;
    gw_cl_t *cl = gw_g.cl;
    float cache_frac = gw_g.cfg.cache_frac;
    uint32_t deadline_us = gw_g.cfg.deadline_us, flags = gw_g.cfg.session_flags;
    bool compare = gw_g.cfg.compare_full, keep_kv = gw_g.cfg.keep_kv;
    if (client != NULL || cl != NULL)
        gw_g.live++;
    pthread_mutex_unlock(&gw_g.lock);
    if (client == NULL && cl == NULL) {
        cm_error("attention backend %s: not configured (no kvstore address)", GW_ATTN_REMOTE_NAME);
        return RI_ERR_INVALID;
    }
    a = cm_calloc(&gw_attn_tag, 1, sizeof(*a));
    if (a == NULL) {
        st = RI_ERR_NOMEM;
        goto err;
    }
    a->kv = kv;
    a->cfg = *cfg;
    a->compare = compare;
    /* a cache in device memory (the device engine names its kernels in
     * wave.ops) is the engine's one allocation: nothing is given back there
     * (mdl_kv_release frees host pages) */
    bool on_device = cfg->wave.ops != NULL && kn_mem_of(cfg->wave.ops)->device;
    a->release = !compare && !keep_kv && !on_device;
    a->released = cm_calloc(&gw_attn_tag, kv->geom.n_layers, sizeof(size_t));
    if (a->released == NULL) {
        st = RI_ERR_NOMEM;
        goto err;
    }
    a->last.struct_size = sizeof(a->last);
    if (compare) {
        a->full = cm_malloc(&gw_attn_tag, (size_t)kv->geom.n_heads * kv->geom.head_dim * sizeof(float));
        if (a->full == NULL) {
            st = RI_ERR_NOMEM;
            goto err;
        }
    }
    ri_session_params_init(&sp);
    sp.n_layers = kv->geom.n_layers;
    sp.n_q_heads = kv->geom.n_heads;
    sp.n_kv_heads = kv->geom.n_kv_heads;
    sp.head_dim = kv->geom.head_dim;
    if (cache_frac > 0)
        sp.cache_frac = cache_frac;
    sp.deadline_us = deadline_us;
    sp.flags = flags;
    sp.expected_tokens = kv->cap;
    sp.prefix_tokens = cfg->prefix != NULL && cfg->prefix->n_keys > 0 ? cfg->prefix->n_tokens : 0;
    sp.label = "ri-worker";
    if (cl != NULL) {
        char why[1024];
        st = gw_cl_session_create(cl, &sp, &cfg->wave, gw_place_hint, &a->sess, a->node, &a->recorded_id, why,
                                  sizeof(why));
        if (st != RI_OK) {
            cm_error("attention backend %s: no kvstore node took the session: %s", GW_ATTN_REMOTE_NAME, why);
            goto err;
        }
        a->cl = cl;
    } else {
        st = gw_api_session_create(client, &sp, &cfg->wave, &a->sess); /* the wave settings whole */
        if (st != RI_OK) {
            cm_error("attention backend %s: %s", GW_ATTN_REMOTE_NAME, ri_last_error());
            goto err;
        }
    }
    st = gw_attn_attach(a, cfg->prefix);
    if (st != RI_OK)
        goto err;
    *state_p = a;
    return RI_OK;

err:
    if (a != NULL) {
        gw_attn_destroy(a); /* drops live */
    } else {
        pthread_mutex_lock(&gw_g.lock);
        gw_g.live--;
        pthread_mutex_unlock(&gw_g.lock);
    }
    return st;
}

static ri_status_t gw_attn_prefill(void *state, uint32_t layer, size_t pos, size_t n, const float *q, float *out)
{
    gw_attn_t *a = state;
    return mdl_attn_exact(cm_pool_default(), a->kv, layer, pos, n, q, out);
}

static ri_status_t gw_attn_prefill_end(void *state, uint32_t layer)
{
    gw_attn_t *a = state;
    ri_kv_view_t v = gw_attn_view(a->kv, layer, a->kv->len);
    ri_status_t st = ri_prefill(a->sess, layer, &v);
    if (st != RI_OK)
        cm_error("attention backend %s: %s", GW_ATTN_REMOTE_NAME, ri_last_error());
    else
        gw_attn_release(a, layer); /* packed for upload already: the layer's retrieval zone goes */
    return st;
}

/* Re-create and re-fill the session from the sequence's cache. */
static ri_status_t gw_attn_recover(gw_attn_t *a)
{
    uint32_t nl = a->kv->geom.n_layers;
    ri_kv_view_t *views;
    ri_status_t st;
    bool gone = false;
    for (uint32_t l = 0; l < nl; l++)
        gone = gone || a->released[l] > 0;
    if (gone) {
        /* Our copy of the indexed tokens is gone: re-attach, or tell the
         * caller to rebuild the sequence from its token ids (RI_ERR_LOST). */
        st = ri_session_recover(a->sess, NULL);
        if (st == RI_OK)
            cm_warn("attention backend %s: re-attached to the recovered kvstore session", GW_ATTN_REMOTE_NAME);
        else
            cm_error("attention backend %s: %s", GW_ATTN_REMOTE_NAME, ri_last_error());
        return st;
    }
    views = cm_malloc(&gw_attn_tag, nl * sizeof(*views));
    if (views == NULL)
        return RI_ERR_NOMEM;
    /* kv->len tokens are complete in every layer: they cover every index. */
    for (uint32_t l = 0; l < nl; l++)
        views[l] = gw_attn_view(a->kv, l, a->kv->len);
    st = ri_session_recover(a->sess, views);
    cm_free(views);
    if (st == RI_OK)
        cm_warn("attention backend %s: kvstore session re-created and re-filled", GW_ATTN_REMOTE_NAME);
    else
        cm_error("attention backend %s: recovery failed: %s", GW_ATTN_REMOTE_NAME, ri_last_error());
    return st;
}

static void gw_attn_record_err(const gw_attn_t *a, const float *out, uint32_t n_heads, uint32_t d)
{
    pthread_mutex_lock(&gw_g.lock);
    if (gw_g.n_errs + n_heads > gw_g.cap_errs) {
        size_t cap = CM_MAX(gw_g.cap_errs * 2, (size_t)4096);
        float *ne = cm_realloc(&gw_attn_tag, gw_g.errs, cap * sizeof(float));
        if (ne == NULL) {
            pthread_mutex_unlock(&gw_g.lock);
            return;
        }
        gw_g.errs = ne;
        gw_g.cap_errs = cap;
    }
    for (uint32_t h = 0; h < n_heads; h++) {
        double num = 0, den = 0;
        for (uint32_t i = 0; i < d; i++) {
            double x = (double)out[h * d + i] - a->full[h * d + i];
            num += x * x;
            den += (double)a->full[h * d + i] * a->full[h * d + i];
        }
        gw_g.errs[gw_g.n_errs++] = (float)(sqrt(num) / (sqrt(den) + 1e-30));
    }
    pthread_mutex_unlock(&gw_g.lock);
}

static ri_status_t gw_attn_decode(void *state, uint32_t layer, size_t pos, const float *q, float *out)
{
    gw_attn_t *a = state;
    const mdl_attn_geom_t *g = &a->kv->geom;
    ri_kv_view_t v = gw_attn_view(a->kv, layer, pos + 1);

    if (a->built_pending) {
        /* Every prefill_end ran before this first step: the indexes are
         * built and the K/V still whole, the last moment to read both. */
        a->prefix->built(a->prefix->ctx);
        a->built_pending = false;
    }
    ri_status_t st = ri_decode(&a->sess, 1, layer, q, &v, out);

    if (st == RI_ERR_CONN_RESET || st == RI_ERR_TIMEOUT || st == RI_ERR_TRANSPORT) {
        cm_warn("attention backend %s: %s; re-creating the session", GW_ATTN_REMOTE_NAME, ri_last_error());
        st = gw_attn_recover(a);
        if (st == RI_OK)
            st = ri_decode(&a->sess, 1, layer, q, &v, out);
        if (st != RI_OK && a->cl != NULL) {
            /* The node is gone with the session: another live node takes
             * the rebuilt sequence at once (the caller rebuilds on LOST). */
            gw_cl_node_lost(a->cl, a->node);
            st = RI_ERR_LOST;
        }
    }
    a->st.decode_steps++;
    if (st == RI_OK)
        gw_attn_release(a, layer); /* an update may have moved the indexed end */
    gw_attn_account(a);
    if (st != RI_OK) {
        pthread_mutex_lock(&gw_g.lock);
        gw_g.tot.failures++;
        pthread_mutex_unlock(&gw_g.lock);
        return st;
    }
    a->st.exact_tokens = a->last.exact_tokens / CM_MAX(g->n_kv_heads, 1u);
    if (a->compare) {
        kn_shape_t shape = {.n_q_heads = g->n_heads, .n_kv_heads = g->n_kv_heads, .head_dim = g->head_dim};
        kn_kv_view_t kv = {.k = v.k, .v = v.v, .n_tokens = v.n_tokens, .token_stride = v.token_stride,
                           .head_stride = v.head_stride};
        double t0 = cm_time_s();
        if (kn_attn_decode(NULL, &shape, 1, q, &kv, a->full, NULL) == RI_OK)
            gw_attn_record_err(a, out, g->n_heads, g->head_dim);
        pthread_mutex_lock(&gw_g.lock);
        gw_g.tot.compare_s += cm_time_s() - t0;
        pthread_mutex_unlock(&gw_g.lock);
    }
    return RI_OK;
}

static void gw_attn_stats(void *state, mdl_attn_stats_t *st_p)
{
    const gw_attn_t *a = state;
    const kn_wave_params_t *w = gw_api_session_wave(a->sess, 0);
    *st_p = a->st;
    st_p->tokens_per_cluster = w != NULL ? w->tokens_per_cluster : 0;
}

static bool gw_attn_wave_params(void *state, uint32_t layer, kn_wave_params_t *wave_p)
{
    const kn_wave_params_t *w = gw_api_session_wave(((gw_attn_t *)state)->sess, layer);
    if (w == NULL)
        return false;
    *wave_p = *w;
    return true;
}

static const kn_index_t *gw_attn_index(void *state, uint32_t layer, uint32_t kv_head)
{
    return gw_api_session_index(((gw_attn_t *)state)->sess, layer, kv_head);
}

static const mdl_attn_ops_t gw_attn_ops = {
    .name = GW_ATTN_REMOTE_NAME,
    .help = "wave index + tripartite attention, clusters in ri-kvstore (needs --kvstore or --cluster)",
    .create = gw_attn_create,
    .destroy = gw_attn_destroy,
    .prefill = gw_attn_prefill,
    .prefill_end = gw_attn_prefill_end,
    .decode = gw_attn_decode,
    .stats = gw_attn_stats,
    .wave_params = gw_attn_wave_params,
    .index = gw_attn_index,
    /* on the device engine the view is the device cache: the session reads
     * it through the space of cfg->wave.ops (gw_remote.h) */
    .device_ok = true,
    .token_major_kv = true, /* it keeps only the steady zone (gw_attn_release) */
};

ri_status_t gw_attn_remote_configure(const gw_attn_remote_cfg_t *cfg, char *err, size_t errlen)
{
    ri_client_params_t cp;
    ri_client_h client = NULL;
    ri_status_t st;

    bool clustered = cfg != NULL && cfg->cluster.url != NULL && cfg->cluster.url[0] != '\0';
    gw_cl_t *cl = NULL;

    if (cfg == NULL || (cfg->address == NULL && !clustered)) {
        snprintf(err, errlen, "no kvstore address");
        return RI_ERR_INVALID;
    }
    if (clustered) {
        gw_cl_cfg_t cc = {.url = cfg->cluster.url, .cluster = cfg->cluster.name, .policy = cfg->cluster.policy,
                          .worker = cfg->cluster.worker, .host = cfg->cluster.host, .lease_ms = cfg->cluster.lease_ms,
                          .token = cfg->token, .timeout_ms = cfg->timeout_ms, .tls_ca = cfg->tls_ca,
                          .tls_cert = cfg->tls_cert, .tls_key = cfg->tls_key,
                          .prefix_replicas = cfg->cluster.prefix_replicas};
        st = gw_cl_open(&cc, &cl, err, errlen);
        if (st != RI_OK)
            return st;
        goto install;
    }
    ri_client_params_init(&cp);
    cp.address = cfg->address;
    cp.token = cfg->token;
    cp.timeout_ms = cfg->timeout_ms;
    cp.tls_ca_file = cfg->tls_ca;
    cp.tls_cert_file = cfg->tls_cert;
    cp.tls_key_file = cfg->tls_key;
    st = ri_client_connect(&cp, &client);
    if (st != RI_OK) {
        snprintf(err, errlen, "%s", ri_last_error());
        return st;
    }
install:
    pthread_mutex_lock(&gw_g.lock);
    if (gw_g.live > 0) {
        pthread_mutex_unlock(&gw_g.lock);
        ri_client_close(client);
        gw_cl_close(cl);
        snprintf(err, errlen, "sequences still use the %s backend", GW_ATTN_REMOTE_NAME);
        return RI_ERR_BUSY;
    }
    ri_client_close(gw_g.client);
    gw_cl_close(gw_g.cl);
    cm_free(gw_g.address);
    cm_free(gw_g.token);
    gw_g.client = client;
    gw_g.cl = cl;
    gw_g.cfg = *cfg;
    gw_g.address = cfg->address ? cm_strdup(&gw_attn_tag, cfg->address) : NULL;
    gw_g.token = cfg->token ? cm_strdup(&gw_attn_tag, cfg->token) : NULL;
    gw_g.cfg.address = gw_g.address;
    gw_g.cfg.token = gw_g.token;
    /* the certificate files were read by ri_client_connect: not kept */
    gw_g.cfg.tls_ca = gw_g.cfg.tls_cert = gw_g.cfg.tls_key = NULL;
    memset(&gw_g.cfg.cluster, 0, sizeof(gw_g.cfg.cluster)); /* the pool keeps its own copies */
    bool reg = !gw_g.registered;
    gw_g.registered = true;
    pthread_mutex_unlock(&gw_g.lock);
    if (reg && (st = mdl_attn_register(&gw_attn_ops)) != RI_OK && st != RI_ERR_EXISTS) {
        snprintf(err, errlen, "cannot register the %s backend: %s", GW_ATTN_REMOTE_NAME, ri_status_str(st));
        return st;
    }
    return RI_OK;
}

struct gw_ctl *gw_attn_remote_ctl(uint32_t *timeout_ms_p)
{
    pthread_mutex_lock(&gw_g.lock);
    struct gw_ctl *ctl = gw_api_client_ctl(gw_g.client, timeout_ms_p);
    pthread_mutex_unlock(&gw_g.lock);
    return ctl;
}

bool gw_attn_remote_clustered(void)
{
    pthread_mutex_lock(&gw_g.lock);
    bool on = gw_g.cl != NULL;
    pthread_mutex_unlock(&gw_g.lock);
    return on;
}

struct gw_ctl *gw_attn_remote_place(const struct gw_pfx_layout *lay, const uint8_t *keys, uint32_t n_keys,
                                    uint32_t *timeout_ms_p)
{
    pthread_mutex_lock(&gw_g.lock);
    gw_cl_t *cl = gw_g.cl; /* lives until shutdown, after every sequence */
    pthread_mutex_unlock(&gw_g.lock);
    gw_place_hint[0] = '\0';
    if (cl == NULL)
        return NULL;
    return gw_cl_pick_prefix(cl, lay, keys, n_keys, gw_place_hint, timeout_ms_p);
}

void gw_attn_remote_place_clear(void)
{
    gw_place_hint[0] = '\0';
}

const char *gw_attn_remote_placed_node(void)
{
    return gw_place_hint;
}

void gw_attn_remote_replicate(const struct gw_pfx_layout *lay, const uint8_t *keys, uint32_t n_keys,
                              const char *from)
{
    pthread_mutex_lock(&gw_g.lock);
    gw_cl_t *cl = gw_g.cl; /* lives until shutdown */
    pthread_mutex_unlock(&gw_g.lock);
    gw_cl_replicate(cl, lay, keys, n_keys, from);
}

bool gw_attn_remote_cluster_stats(struct gw_cl_stats *st_p)
{
    pthread_mutex_lock(&gw_g.lock);
    gw_cl_t *cl = gw_g.cl;
    pthread_mutex_unlock(&gw_g.lock);
    if (cl == NULL)
        return false;
    gw_cl_stats(cl, st_p);
    return true;
}

void gw_attn_remote_shutdown(void)
{
    pthread_mutex_lock(&gw_g.lock);
    ri_client_close(gw_g.client);
    gw_g.client = NULL;
    gw_cl_close(gw_g.cl);
    gw_g.cl = NULL;
    cm_free(gw_g.address);
    cm_free(gw_g.token);
    gw_g.address = gw_g.token = NULL;
    cm_free(gw_g.errs);
    gw_g.errs = NULL;
    gw_g.n_errs = gw_g.cap_errs = 0;
    pthread_mutex_unlock(&gw_g.lock);
}

static int gw_cmp_float(const void *x, const void *y)
{
    float a = *(const float *)x, b = *(const float *)y;
    return (a > b) - (a < b);
}

void gw_attn_remote_totals(gw_attn_remote_totals_t *t_p)
{
    pthread_mutex_lock(&gw_g.lock);
    *t_p = gw_g.tot;
    t_p->n_err = gw_g.n_errs;
    if (gw_g.n_errs > 0) {
        float *s = cm_malloc(&gw_attn_tag, gw_g.n_errs * sizeof(float));
        if (s != NULL) {
            size_t n = gw_g.n_errs;
            memcpy(s, gw_g.errs, n * sizeof(float));
            qsort(s, n, sizeof(float), gw_cmp_float);
            t_p->err_median = s[n / 2];
            t_p->err_p90 = s[(size_t)(0.90 * (double)(n - 1))];
            t_p->err_p99 = s[(size_t)(0.99 * (double)(n - 1))];
            t_p->err_max = s[n - 1];
            cm_free(s);
        }
    }
    pthread_mutex_unlock(&gw_g.lock);
}

void gw_attn_remote_reset_totals(void)
{
    pthread_mutex_lock(&gw_g.lock);
    uint64_t resident = gw_g.tot.resident_bytes; /* a gauge of live sequences, not a count */
    memset(&gw_g.tot, 0, sizeof(gw_g.tot));
    gw_g.tot.resident_bytes = resident;
    gw_g.n_errs = 0;
    pthread_mutex_unlock(&gw_g.lock);
}
