/*
 * libretroinfer (include/retroinfer/retroinfer.h): a client is a gRPC
 * control channel to one ri-kvstore; a session is a kvstore session plus its
 * remote wave-index state (gw_remote_t: meta index, block cache, data-plane
 * connection and io thread).  This file only validates, converts the
 * versioned structs and reports errors; the work is in gw_remote.c.
 */
#include "retroinfer/retroinfer.h"

#include <stdarg.h>
#include <stdio.h>
#include <string.h>
#include <time.h>

#include "common/cm_alloc.h"
#include "common/cm_log.h"
#include "common/cm_net.h"
#include "common/cm_runtime.h"
#include "common/cm_status.h"
#include "common/cm_thread.h"
#include "common/cm_time.h"
#include "gpuworker/client/gw_ctl.h"
#include "gpuworker/client/gw_remote.h"
#include "kernels/kn_mem.h"
#include "gpuworker/client/ri_api_int.h"
#include "gpuworker/client/ri_steady.h"
#include "kernels/kn_ops.h"

static CM_ALLOC_TAG(ri_api_tag, "ri.api");

#define RI_DEFAULT_TIMEOUT_MS 5000u

struct ri_client {
    gw_ctl_t *ctl;           /* thread-safe control channel */
    char *address;           /* copy */
    uint32_t timeout_ms;
};

struct ri_session {
    ri_client_h client;      /* borrowed: outlives the session */
    ri_session_params_t p;   /* copy (label copied below); its wave fields mirror wave */
    kn_wave_params_t wave;   /* the wave index settings, whole (gw_remote_create takes them) */
    char *label;
    kn_shape_t shape;
    uint64_t session_id;     /* current kvstore session */
    uint8_t secret[CM_WIRE_SECRET_SIZE]; /* its secret (a re-attach presents it again) */
    double opened_s;         /* when it was created (cm_time_s) */
    uint64_t opened_unix_ms; /* the same, wall clock (to recognise it in ListSessions) */
    gw_remote_t *r;
    uint32_t recoveries;
    uint32_t reattached;     /* recoveries that re-attached to a recovered session */
    ri_steady_t *steady;     /* K/V kept for an engine that keeps none (ri_prefill_kept), or NULL */
};

static uint64_t ri_unix_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (uint64_t)ts.tv_sec * 1000u + (uint64_t)ts.tv_nsec / 1000000u;
}

/* Remember the kvstore session s now uses. */
static void ri_session_remember(ri_session_h s, const gw_ctl_session_t *sess)
{
    s->session_id = sess->session_id;
    memcpy(s->secret, sess->secret, CM_WIRE_SECRET_SIZE);
    s->opened_s = cm_time_s();
    s->opened_unix_ms = ri_unix_ms();
}

static _Thread_local char ri_err_buf[512];

static void ri_err_clear(void)
{
    ri_err_buf[0] = '\0';
}

__attribute__((format(printf, 1, 2))) static void ri_err_set(const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(ri_err_buf, sizeof(ri_err_buf), fmt, ap);
    va_end(ap);
}

int ri_api_version(void)
{
    return RI_API_VERSION;
}

ri_status_t ri_set_threads(uint32_t threads)
{
    ri_err_clear();
    if (cm_pool_default_set_threads(threads) != RI_OK) {
        ri_err_set("threads %u: the pool already runs with %u threads", threads,
                   cm_pool_size(cm_pool_default()));
        return RI_ERR_BUSY;
    }
    return RI_OK;
}

ri_status_t ri_set_log_level(const char *level)
{
    cm_log_level_t lv;
    ri_err_clear();
    if (level == NULL || cm_log_level_parse(level, &lv) != RI_OK) {
        ri_err_set("log level '%s' is not one of error, warn, info, debug, trace", level ? level : "(null)");
        return RI_ERR_INVALID;
    }
    cm_log_set_level(lv);
    return RI_OK;
}

/* cm_runtime_apply and kn_runtime_apply: what the library's layers use. */
static ri_status_t ri_runtime_apply(const cm_runtime_t *rt, char *err, size_t errlen)
{
    ri_status_t st = cm_runtime_apply(rt, err, errlen);
    return st != RI_OK ? st : kn_runtime_apply(rt, err, errlen);
}

ri_status_t ri_config_from_env(void)
{
    char err[256] = "";
    ri_err_clear();
    ri_status_t st = cm_runtime_setup_from_env(ri_runtime_apply, err, sizeof(err));
    if (st != RI_OK)
        ri_err_set("%s", err);
    return st;
}

const char *ri_last_error(void)
{
    return ri_err_buf;
}

/* Copy a caller's versioned struct over defaults: only the bytes its version has. */
static bool ri_versioned_copy(void *dst, size_t dst_size, const void *src, size_t min_size)
{
    size_t n = *(const size_t *)src;
    if (n < min_size)
        return false;
    memcpy(dst, src, CM_MIN(n, dst_size));
    *(size_t *)dst = dst_size;
    return true;
}

/* ---- client ---- */

void ri_client_params_init(ri_client_params_t *p)
{
    memset(p, 0, sizeof(*p));
    p->struct_size = sizeof(*p);
    p->timeout_ms = RI_DEFAULT_TIMEOUT_MS;
}

/* Optional strings of the parameter structs: NULL and "" both mean unset. */
static const char *ri_str_or_null(const char *s)
{
    return s != NULL && s[0] != '\0' ? s : NULL;
}

ri_status_t ri_client_connect(const ri_client_params_t *params, ri_client_h *client_p)
{
    ri_client_params_t p;
    gw_ctl_health_t health;
    gw_ctl_error_t err = {0};
    ri_client_h c;
    ri_status_t st;

    ri_err_clear();
    ri_client_params_init(&p);
    if (params == NULL || client_p == NULL ||
        !ri_versioned_copy(&p, sizeof(p), params, offsetof(ri_client_params_t, address) + sizeof(char *)) ||
        p.address == NULL || p.address[0] == '\0') {
        ri_err_set("ri_client_connect: no kvstore address");
        return RI_ERR_INVALID;
    }
    c = cm_calloc(&ri_api_tag, 1, sizeof(*c));
    if (c == NULL)
        return RI_ERR_NOMEM;
    c->timeout_ms = p.timeout_ms ? p.timeout_ms : RI_DEFAULT_TIMEOUT_MS;
    c->address = cm_strdup(&ri_api_tag, p.address);
    if (c->address == NULL) {
        st = RI_ERR_NOMEM;
        goto err_free;
    }
    gw_ctl_tls_t tls = {.ca_file = ri_str_or_null(p.tls_ca_file), .cert_file = ri_str_or_null(p.tls_cert_file),
                        .key_file = ri_str_or_null(p.tls_key_file)};
    if (tls.ca_file != NULL) {
        st = gw_ctl_create_tls(p.address, p.token, &tls, &c->ctl);
    } else if (tls.cert_file != NULL || tls.key_file != NULL) {
        ri_err_set("ri_client_connect: a client certificate needs tls_ca_file (the daemon's CA)");
        st = RI_ERR_INVALID;
        goto err_free;
    } else {
        st = gw_ctl_create(p.address, p.token, &c->ctl);
    }
    if (st != RI_OK) {
        ri_err_set("kvstore %s: %s", p.address, ri_status_str(st));
        goto err_free;
    }
    st = gw_ctl_health(c->ctl, c->timeout_ms, &health, &err);
    if (st != RI_OK) {
        ri_err_set("kvstore %s: %s (%s)", p.address,
                   st == RI_ERR_UNREACHABLE ? "unreachable: is ri-kvstore running there?" : ri_status_str(st),
                   err.message);
        goto err_free;
    }
    if (health.dataplane_address[0] == '\0') {
        ri_err_set("kvstore %s has no data plane (started without --dataplane-listen?)", p.address);
        st = RI_ERR_UNSUPPORTED;
        goto err_free;
    }
    *client_p = c;
    return RI_OK;

err_free:
    ri_client_close(c);
    return st;
}

uint64_t gw_api_session_id(ri_session_h session)
{
    return session != NULL ? session->session_id : 0;
}

gw_ctl_t *gw_api_client_ctl(ri_client_h client, uint32_t *timeout_ms_p)
{
    if (client == NULL)
        return NULL;
    if (timeout_ms_p != NULL)
        *timeout_ms_p = client->timeout_ms;
    return client->ctl;
}

void ri_client_close(ri_client_h c)
{
    if (c == NULL)
        return;
    gw_ctl_destroy(c->ctl);
    cm_free(c->address);
    cm_free(c);
}

/* ---- session ---- */

/* The public struct's wave fields are a mirror of a subset of
 * kn_wave_params_t (the public header cannot show kernels' struct): these
 * two are the one place the fields are mapped, both ways. */
static void ri_params_to_wave(const ri_session_params_t *p, kn_wave_params_t *w)
{
    w->sink_tokens = p->sink_tokens;
    w->window_tokens = p->window_tokens;
    w->tokens_per_cluster = p->tokens_per_cluster;
    w->update_tokens = p->update_tokens;
    w->update_clusters = p->update_clusters;
    w->retrieval_frac = p->retrieval_frac;
    w->estimation_frac = p->estimation_frac;
    w->retrieval_min_tokens = p->retrieval_min_tokens;
    w->estimation_min_tokens = p->estimation_min_tokens;
    w->adapt_tau = p->adapt_tau;
    w->segment_tokens = p->block_tokens;
}

static void ri_params_from_wave(const kn_wave_params_t *w, ri_session_params_t *p)
{
    p->sink_tokens = w->sink_tokens;
    p->window_tokens = w->window_tokens;
    p->tokens_per_cluster = w->tokens_per_cluster;
    p->update_tokens = w->update_tokens;
    p->update_clusters = w->update_clusters;
    p->retrieval_frac = w->retrieval_frac;
    p->estimation_frac = w->estimation_frac;
    p->retrieval_min_tokens = w->retrieval_min_tokens;
    p->estimation_min_tokens = w->estimation_min_tokens;
    p->adapt_tau = w->adapt_tau;
    p->block_tokens = w->segment_tokens ? w->segment_tokens : KN_WAVE_SEGMENT_TOKENS;
}

void ri_session_params_init(ri_session_params_t *p)
{
    kn_wave_params_t w;
    gw_remote_params_t g;
    kn_wave_params_default(&w);
    gw_remote_params_default(&g);
    memset(p, 0, sizeof(*p));
    p->struct_size = sizeof(*p);
    ri_params_from_wave(&w, p);
    p->cache_frac = g.cache_frac;
    p->cache_pages = 0;
    p->expected_tokens = 8192;
    p->deadline_us = g.deadline_us;
    p->flags = 0;
}

static void ri_session_remote_params(const ri_session_h s, gw_remote_params_t *g)
{
    gw_remote_params_default(g);
    g->wave = s->wave;
    g->cache_frac = s->p.cache_frac;
    g->cache_pages = s->p.cache_pages;
    g->timeout_ms = s->client->timeout_ms;
    g->deadline_us = s->p.deadline_us;
    g->direct = (s->p.flags & RI_SESSION_TWO_SIDED) == 0;
    g->fetch_async = (s->p.flags & RI_SESSION_FETCH_ASYNC) != 0;
    g->predict = (s->p.flags & RI_SESSION_NO_PREDICT) == 0;
    /* an engine whose kernels read another space (the device engine: the
     * cuda table) keeps the block cache there too; NULL ops: the host */
    g->cache_space = s->wave.ops != NULL ? kn_mem_of(s->wave.ops) : NULL;
}

/* CreateSession on the client's kvstore, with the page size the session's
 * remote will use. */
static ri_status_t ri_session_open(ri_session_h s, gw_ctl_session_t *out)
{
    gw_remote_params_t g;
    ri_session_remote_params(s, &g);
    gw_ctl_geometry_t geo = {.layers = s->p.n_layers, .kv_heads = s->p.n_kv_heads, .head_dim = s->p.head_dim,
                             .dtype = 1, .page_tokens = gw_remote_page_tokens(&g)};
    gw_ctl_error_t err = {0};
    uint64_t expected = s->p.expected_tokens ? s->p.expected_tokens : 8192;
    /* attached blocks are held once for all their sessions: reserve our own part only */
    expected -= CM_MIN(s->p.prefix_tokens, expected - 1);
    ri_status_t st = gw_ctl_create_session(s->client->ctl, s->client->timeout_ms, &geo, expected,
                                           s->label ? s->label : "", out, &err);
    if (st != RI_OK)
        ri_err_set("kvstore %s: CreateSession: %s (%s)", s->client->address, ri_status_str(st), err.message);
    return st;
}

/* ri_session_create, with the wave settings from wave when not NULL. */
static ri_status_t ri_session_create_with(ri_client_h client, const ri_session_params_t *params,
                                          const kn_wave_params_t *wave, ri_session_h *session_p)
{
    ri_session_h s;
    gw_ctl_session_t sess;
    gw_remote_params_t g;
    ri_status_t st;

    ri_err_clear();
    if (client == NULL || params == NULL || session_p == NULL)
        return RI_ERR_INVALID;
    s = cm_calloc(&ri_api_tag, 1, sizeof(*s));
    if (s == NULL)
        return RI_ERR_NOMEM;
    s->client = client;
    ri_session_params_init(&s->p);
    if (!ri_versioned_copy(&s->p, sizeof(s->p), params, offsetof(ri_session_params_t, scale))) {
        ri_err_set("ri_session_create: struct_size too small");
        st = RI_ERR_INVALID;
        goto err_free;
    }
    if (wave != NULL) {
        s->wave = *wave;
        ri_params_from_wave(wave, &s->p); /* the mirror tells the same (the steady zone reads it) */
    } else {
        kn_wave_params_default(&s->wave);
        ri_params_to_wave(&s->p, &s->wave);
    }
    s->shape = (kn_shape_t){.n_q_heads = s->p.n_q_heads, .n_kv_heads = s->p.n_kv_heads, .head_dim = s->p.head_dim,
                            .scale = s->p.scale};
    if (s->p.n_layers == 0 || !kn_shape_valid(&s->shape)) {
        ri_err_set("ri_session_create: bad geometry (%u layers, %u/%u heads, d %u)", s->p.n_layers, s->p.n_q_heads,
                   s->p.n_kv_heads, s->p.head_dim);
        st = RI_ERR_INVALID;
        goto err_free;
    }
    if (s->p.label != NULL && (s->label = cm_strdup(&ri_api_tag, s->p.label)) == NULL) {
        st = RI_ERR_NOMEM;
        goto err_free;
    }
    s->p.label = NULL;
    st = ri_session_open(s, &sess);
    if (st != RI_OK)
        goto err_free;
    ri_session_remember(s, &sess);
    ri_session_remote_params(s, &g);
    st = gw_remote_create(sess.dataplane_address, sess.session_id, sess.secret, &s->shape, s->p.n_layers, &g, &s->r);
    if (st != RI_OK) {
        ri_err_set("kvstore %s: data plane of session %llu: %s", s->client->address,
                   (unsigned long long)sess.session_id, ri_status_str(st));
        goto err_free;
    }
    *session_p = s;
    return RI_OK;

err_free:
    ri_session_close(s);
    return st;
}

ri_status_t ri_session_create(ri_client_h client, const ri_session_params_t *params, ri_session_h *session_p)
{
    return ri_session_create_with(client, params, NULL, session_p);
}

ri_status_t gw_api_session_create(ri_client_h client, const ri_session_params_t *params,
                                  const kn_wave_params_t *wave, ri_session_h *session_p)
{
    if (wave == NULL)
        return RI_ERR_INVALID;
    return ri_session_create_with(client, params, wave, session_p);
}

const kn_wave_params_t *gw_api_session_wave(ri_session_h s, uint32_t layer)
{
    return s == NULL || layer >= s->p.n_layers ? NULL : gw_remote_wave_params(s->r, layer);
}

ri_status_t ri_session_params_get(ri_session_h s, ri_session_params_t *params_p)
{
    ri_session_params_t o;
    if (s == NULL || params_p == NULL || params_p->struct_size < sizeof(size_t))
        return RI_ERR_INVALID;
    o = s->p;
    ri_params_from_wave(gw_remote_wave_params(s->r, 0), &o);
    o.struct_size = params_p->struct_size;
    o.label = NULL;
    memcpy(params_p, &o, CM_MIN(params_p->struct_size, sizeof(o)));
    return RI_OK;
}

/* A broken session whose daemon restarted since we opened it (or cannot be
 * reached) is gone already, and its id may now name another session, even
 * one of ours: it must not be dropped by id. */
static bool ri_session_gone(ri_session_h s)
{
    gw_ctl_health_t health;
    if (gw_remote_error(s->r) == RI_OK)
        return false;
    if (gw_ctl_health(s->client->ctl, 1000, &health, NULL) != RI_OK)
        return true;
    return (double)health.uptime_ms * 1e-3 < cm_time_s() - s->opened_s;
}

void ri_session_close(ri_session_h s)
{
    if (s == NULL)
        return;
    bool drop = s->session_id != 0 && !ri_session_gone(s);
    gw_remote_destroy(s->r);
    ri_steady_destroy(s->steady);
    if (drop)
        (void)gw_ctl_drop_session(s->client->ctl, 1000, s->session_id, NULL, NULL);
    cm_free(s->label);
    cm_free(s);
}

static bool ri_view_convert(const ri_session_h s, const ri_kv_view_t *in, kn_kv_view_t *out)
{
    if (in == NULL || in->struct_size < offsetof(ri_kv_view_t, head_stride) + sizeof(size_t))
        return false;
    *out = (kn_kv_view_t){.k = in->k, .v = in->v, .n_tokens = in->n_tokens, .token_stride = in->token_stride,
                          .head_stride = in->head_stride};
    (void)s;
    return in->n_tokens == 0 || (in->k != NULL && in->v != NULL);
}

ri_status_t ri_prefill(ri_session_h s, uint32_t layer, const ri_kv_view_t *kv)
{
    kn_kv_view_t v;
    ri_status_t st;

    ri_err_clear();
    if (s == NULL || layer >= s->p.n_layers || !ri_view_convert(s, kv, &v))
        return RI_ERR_INVALID;
    st = gw_remote_build(s->r, layer, &v);
    if (st != RI_OK)
        ri_err_set("prefill of layer %u: %s", layer, ri_status_str(st));
    return st;
}

ri_status_t ri_prefill_wait(ri_session_h s)
{
    ri_status_t st;
    ri_err_clear();
    if (s == NULL)
        return RI_ERR_INVALID;
    st = gw_remote_sync(s->r);
    if (st != RI_OK)
        ri_err_set("kvstore %s: upload failed: %s", s->client->address, ri_status_str(st));
    return st;
}

/* A batch of distinct sessions of one geometry, layer in range. */
static bool ri_batch_ok(ri_session_h const *sessions, size_t n, uint32_t layer)
{
    for (size_t b = 0; b < n; b++) {
        if (sessions[b] == NULL || layer >= sessions[b]->p.n_layers ||
            sessions[b]->p.n_q_heads != sessions[0]->p.n_q_heads || sessions[b]->p.head_dim != sessions[0]->p.head_dim)
            return false;
        for (size_t c = 0; c < b; c++)
            if (sessions[c] == sessions[b])
                return false;
    }
    return true;
}

/* Session b's view of every token so far: the library's own (kept) or the
 * engine's. */
static bool ri_batch_view(ri_session_h s, uint32_t layer, const ri_kv_view_t *kv, kn_kv_view_t *v)
{
    if (s->steady != NULL) {
        *v = ri_steady_view(s->steady, layer);
        return true;
    }
    return ri_view_convert(s, kv, v);
}

/* Give back what the kvstore holds of layer from a kept K/V. */
static void ri_steady_trim(ri_session_h s, uint32_t layer)
{
    if (s->steady != NULL)
        ri_steady_release(s->steady, layer, s->p.sink_tokens, gw_remote_indexed_end(s->r, layer));
}

/* ri_decode and ri_decode_token once the views are known. */
static ri_status_t ri_decode_batch(ri_session_h const *sessions, size_t n, uint32_t layer, const float *q,
                                   const ri_kv_view_t *kv, float *out)
{
    size_t begun = 0, qrow = (size_t)sessions[0]->p.n_q_heads * sessions[0]->p.head_dim;
    ri_status_t st = RI_OK;

    /* all fetches in flight first, then each session's estimation + exact part */
    for (; begun < n; begun++) {
        ri_session_h s = sessions[begun];
        kn_kv_view_t v;
        if (!ri_batch_view(s, layer, kv != NULL ? &kv[begun] : NULL, &v)) {
            st = RI_ERR_INVALID;
            break;
        }
        st = gw_remote_update(s->r, layer, &v, NULL);
        if (st == RI_OK)
            st = gw_remote_decode_begin(s->r, layer, q + begun * qrow, &v, UINT32_MAX, UINT32_MAX);
        if (st != RI_OK)
            break;
    }
    for (size_t b = 0; b < begun; b++) {
        ri_status_t e = gw_remote_decode_end(sessions[b]->r, out + b * qrow, NULL);
        if (e != RI_OK && st == RI_OK) {
            st = e;
            begun = b; /* for the message */
        }
    }
    if (st != RI_OK && begun < n)
        ri_err_set("decode of layer %u, batch entry %zu (kvstore %s): %s", layer, begun,
                   sessions[begun]->client->address, ri_status_str(st));
    for (size_t b = 0; st == RI_OK && b < n; b++)
        ri_steady_trim(sessions[b], layer); /* an update may have moved the indexed end */
    return st;
}

ri_status_t ri_decode(ri_session_h const *sessions, size_t n, uint32_t layer, const float *q,
                      const ri_kv_view_t *kv, float *out)
{
    ri_err_clear();
    if (sessions == NULL || n == 0 || q == NULL || kv == NULL || out == NULL || !ri_batch_ok(sessions, n, layer))
        return RI_ERR_INVALID;
    for (size_t b = 0; b < n; b++)
        if (sessions[b]->steady != NULL)
            return RI_ERR_INVALID; /* a kept session takes ri_decode_token */
    return ri_decode_batch(sessions, n, layer, q, kv, out);
}

ri_status_t ri_prefill_kept(ri_session_h s, uint32_t layer, const ri_kv_view_t *kv)
{
    kn_kv_view_t v;
    ri_status_t st;

    ri_err_clear();
    if (s == NULL || layer >= s->p.n_layers || !ri_view_convert(s, kv, &v))
        return RI_ERR_INVALID;
    if (s->steady == NULL) {
        size_t cap = s->p.expected_tokens ? s->p.expected_tokens : 8192;
        st = ri_steady_create(s->p.n_layers, s->p.n_kv_heads, s->p.head_dim, cap, &s->steady);
        if (st != RI_OK)
            return st;
    }
    if (ri_steady_view(s->steady, layer).n_tokens != 0)
        return RI_ERR_INVALID; /* once per layer */
    st = ri_steady_append(s->steady, layer, kv->k, kv->v, kv->n_tokens, kv->token_stride, kv->head_stride);
    if (st != RI_OK) {
        ri_err_set("prefill of layer %u: %zu tokens do not fit the session's %llu expected tokens", layer,
                   kv->n_tokens, (unsigned long long)s->p.expected_tokens);
        return st;
    }
    v = ri_steady_view(s->steady, layer);
    st = gw_remote_build(s->r, layer, &v);
    if (st != RI_OK) {
        ri_err_set("prefill of layer %u: %s", layer, ri_status_str(st));
        return st;
    }
    ri_steady_trim(s, layer); /* packed for the upload already */
    return RI_OK;
}

ri_status_t ri_decode_token(ri_session_h const *sessions, size_t n, uint32_t layer, const float *q,
                            const ri_kv_view_t *new_kv, float *out)
{
    ri_err_clear();
    if (sessions == NULL || n == 0 || q == NULL || new_kv == NULL || out == NULL || !ri_batch_ok(sessions, n, layer))
        return RI_ERR_INVALID;
    for (size_t b = 0; b < n; b++)
        if (sessions[b]->steady == NULL || new_kv[b].struct_size < sizeof(ri_kv_view_t) || new_kv[b].n_tokens != 1 ||
            new_kv[b].k == NULL || new_kv[b].v == NULL)
            return RI_ERR_INVALID;
    for (size_t b = 0; b < n; b++) {
        ri_status_t st = ri_steady_append(sessions[b]->steady, layer, new_kv[b].k, new_kv[b].v, 1,
                                          new_kv[b].token_stride, new_kv[b].head_stride);
        if (st != RI_OK) {
            ri_err_set("decode of layer %u, batch entry %zu: past the session's %llu expected tokens", layer, b,
                       (unsigned long long)sessions[b]->p.expected_tokens);
            return st;
        }
    }
    return ri_decode_batch(sessions, n, layer, q, NULL, out);
}

/* A restarted kvstore that recovered our session (--recover) with every
 * cluster we uploaded: re-attach to it, uploading nothing.  RI_OK when
 * re-attached; anything else means "re-create and re-fill instead".  The
 * listed session must be ours: same id, our label, created before we opened
 * it (ids restart at 1 on a daemon that did not recover), and hold as many
 * clusters as we uploaded (a crash loses what was only in memory). */
static ri_status_t ri_session_reattach(ri_session_h s)
{
    gw_ctl_session_info_t *infos = NULL, *mine = NULL;
    size_t n = 0;
    ri_status_t st = gw_ctl_list_sessions(s->client->ctl, s->client->timeout_ms, &infos, &n, NULL);
    if (st != RI_OK)
        return st;
    for (size_t i = 0; i < n; i++)
        if (infos[i].session_id == s->session_id)
            mine = &infos[i];
    if (mine == NULL || strcmp(mine->label, s->label ? s->label : "") != 0 ||
        mine->created_unix_ms > s->opened_unix_ms + 1000 || mine->clusters != gw_remote_clusters(s->r) ||
        mine->dataplane_address[0] == '\0') {
        if (mine != NULL)
            cm_info("kvstore %s: session %llu is back but not whole (%llu of %llu clusters): re-filling a new one",
                    s->client->address, (unsigned long long)s->session_id, (unsigned long long)mine->clusters,
                    (unsigned long long)gw_remote_clusters(s->r));
        cm_free(infos);
        return RI_ERR_NOT_FOUND;
    }
    st = gw_remote_reconnect(s->r, mine->dataplane_address, s->session_id, s->secret, NULL);
    if (st == RI_OK)
        cm_info("kvstore %s: re-attached to recovered session %llu (%llu clusters, nothing uploaded)",
                s->client->address, (unsigned long long)s->session_id, (unsigned long long)mine->clusters);
    cm_free(infos);
    return st;
}

ri_status_t ri_session_recover(ri_session_h s, const ri_kv_view_t *kv)
{
    gw_ctl_session_t sess;
    kn_kv_view_t *views;
    uint64_t old = 0;
    gw_ctl_health_t health;
    bool same_daemon = false;
    ri_status_t st;

    ri_err_clear();
    if (s == NULL)
        return RI_ERR_INVALID;
    if (s->steady != NULL)
        kv = NULL; /* a kept session gave its indexed tokens back: re-attach or rebuild */
    /* A daemon up for longer than our session is the one that holds it (a
     * network failure, not a restart): its old session is dropped below.  A
     * restarted daemon numbers sessions afresh, so the old id may now name
     * another session: never drop it then. */
    if (gw_ctl_health(s->client->ctl, s->client->timeout_ms, &health, NULL) != RI_OK)
        health.uptime_ms = 0;
    else if (!(same_daemon = (double)health.uptime_ms * 1e-3 > cm_time_s() - s->opened_s) &&
             ri_session_reattach(s) == RI_OK) {
        s->recoveries++;
        s->reattached++;
        return RI_OK;
    }
    if (kv == NULL) {
        /* The engine no longer has the K/V to re-fill from: it rebuilds. */
        ri_err_set("kvstore %s: session %llu is not recoverable (no re-attach possible); re-prefill it",
                   s->client->address, (unsigned long long)s->session_id);
        return RI_ERR_LOST;
    }
    views = cm_malloc(&ri_api_tag, s->p.n_layers * sizeof(*views));
    if (views == NULL)
        return RI_ERR_NOMEM;
    for (uint32_t l = 0; l < s->p.n_layers; l++)
        if (!ri_view_convert(s, &kv[l], &views[l])) {
            cm_free(views);
            return RI_ERR_INVALID;
        }
    st = ri_session_open(s, &sess);
    if (st == RI_OK) {
        st = gw_remote_reconnect(s->r, sess.dataplane_address, sess.session_id, sess.secret, views);
        if (st != RI_OK) {
            ri_err_set("kvstore %s: data plane of session %llu: re-fill failed: %s", s->client->address,
                       (unsigned long long)sess.session_id, ri_status_str(st));
            (void)gw_ctl_drop_session(s->client->ctl, 1000, sess.session_id, NULL, NULL);
        } else {
            old = s->session_id;
            ri_session_remember(s, &sess);
        }
    }
    cm_free(views);
    if (st != RI_OK)
        return st;
    if (old != 0 && same_daemon)
        (void)gw_ctl_drop_session(s->client->ctl, 1000, old, NULL, NULL);
    s->recoveries++;
    return RI_OK;
}

ri_status_t ri_session_attach_prefix(ri_session_h s, const uint8_t *keys, uint32_t n_keys, uint32_t *n_attached_p)
{
    uint32_t n = 0;
    ri_status_t st;

    ri_err_clear();
    if (s == NULL || keys == NULL || n_attached_p == NULL || n_keys == 0 || s->steady != NULL) {
        ri_err_set("ri_session_attach_prefix: no session, keys or output");
        return RI_ERR_INVALID;
    }
    st = gw_remote_attach_prefix(s->r, keys, n_keys, &n);
    if (st == RI_ERR_INVALID)
        ri_err_set("ri_session_attach_prefix: only once, before the first prefill, with 1..65536 keys");
    else if (st != RI_OK)
        ri_err_set("kvstore %s: prefix attach of session %llu: %s", s->client->address,
                   (unsigned long long)s->session_id, ri_status_str(st));
    else
        *n_attached_p = n;
    return st;
}

ri_status_t ri_session_prefix_tokens(ri_session_h s, size_t *n_p)
{
    if (s == NULL || n_p == NULL)
        return RI_ERR_INVALID;
    *n_p = gw_remote_prefix_tokens(s->r);
    return RI_OK;
}

ri_status_t ri_session_prefix_kv(ri_session_h s, uint32_t layer, uint32_t kv_head, size_t pos0, size_t n,
                                 uint16_t *k, uint16_t *v, size_t token_stride)
{
    ri_status_t st;
    ri_err_clear();
    if (s == NULL)
        return RI_ERR_INVALID;
    st = gw_remote_prefix_fill(s->r, layer, kv_head, pos0, n, (cm_fp16_t *)k, (cm_fp16_t *)v, token_stride);
    if (st != RI_OK)
        ri_err_set("ri_session_prefix_kv: layer %u head %u positions [%zu, %zu) of %zu attached: %s", layer, kv_head,
                   pos0, pos0 + n, gw_remote_prefix_tokens(s->r), ri_status_str(st));
    return st;
}

const kn_index_t *gw_api_session_index(ri_session_h s, uint32_t layer, uint32_t kv_head)
{
    if (s == NULL || layer >= s->p.n_layers || kv_head >= s->p.n_kv_heads)
        return NULL;
    const kn_index_t *idx = gw_remote_index(s->r, layer, kv_head);
    return idx != NULL && idx->n_clusters > 0 ? idx : NULL;
}

ri_status_t ri_session_indexed_end(ri_session_h s, uint32_t layer, size_t *end_p)
{
    if (s == NULL || end_p == NULL || layer >= s->p.n_layers)
        return RI_ERR_INVALID;
    *end_p = gw_remote_indexed_end(s->r, layer);
    return RI_OK;
}

ri_status_t ri_session_status(ri_session_h s)
{
    return s == NULL ? RI_ERR_INVALID : gw_remote_error(s->r);
}

ri_status_t ri_session_stats(ri_session_h s, ri_session_stats_t *stats)
{
    ri_session_stats_t o;
    gw_remote_stats_t g;

    if (s == NULL || stats == NULL || stats->struct_size < sizeof(size_t))
        return RI_ERR_INVALID;
    gw_remote_stats(s->r, &g);
    memset(&o, 0, sizeof(o));
    o.struct_size = stats->struct_size;
    o.steps = g.steps;
    o.hits = g.hits;
    o.misses = g.misses;
    o.fetched_bytes = g.fetched_bytes;
    o.uploaded_bytes = g.uploaded_bytes;
    o.exact_tokens = g.exact_tokens;
    o.cache_pages = g.cache_pages;
    o.recoveries = s->recoveries;
    o.build_s = g.build_s;
    o.fetch_wait_s = g.fetch_wait_s;
    o.session_id = s->session_id;
    o.reattached = s->reattached;
    o.resident_bytes = g.resident_bytes;
    o.late_steps = g.late_steps;
    o.late_clusters = g.late_clusters;
    o.max_wait_s = g.max_wait_s;
    o.resident_bytes += ri_steady_bytes(s->steady);
    o.direct_steps = g.direct_steps;
    o.direct_clusters = g.direct_clusters;
    memcpy(stats, &o, CM_MIN(stats->struct_size, sizeof(o)));
    return RI_OK;
}
