/*
 * gRPC C core client of the ri-kvstore control API (see gw_ctl.h).  Calls are
 * rare (session set-up, stats polling), so each one is a plain blocking unary
 * call on its own pluck completion queue; that keeps one client usable from
 * several threads without a lock.
 */
#define _GNU_SOURCE
#include "gpuworker/client/gw_ctl.h"

#include <stdio.h>
#include <string.h>

#include <grpc/byte_buffer.h>
#include <grpc/byte_buffer_reader.h>
#include <grpc/grpc.h>
#include <grpc/grpc_security.h>
#include <grpc/slice.h>
#include <grpc/support/time.h>

#include "common/cm_alloc.h"
#include "common/cm_file.h"
#include "common/cm_grpc.h"
#include "common/cm_log.h"
#include "common/cm_status.h"
#include "retroinfer.pb-c.h"

#define GW_CTL_MAX_RECV (64 << 20) /* ListSessions of many sessions stays far below */
#define GW_CTL_PATH(m) "/retroinfer.v1.KvStore/" m

static CM_ALLOC_TAG(gw_ctl_tag, "gw.ctl");

struct gw_ctl {
    grpc_channel *channel;  /* owned */
    char *addr;             /* owned copy */
    char *bearer;           /* "Bearer <token>", or NULL */
};

static const char *const gw_ctl_code_names[] = {
    "OK", "CANCELLED", "UNKNOWN", "INVALID_ARGUMENT", "DEADLINE_EXCEEDED", "NOT_FOUND",
    "ALREADY_EXISTS", "PERMISSION_DENIED", "RESOURCE_EXHAUSTED", "FAILED_PRECONDITION", "ABORTED",
    "OUT_OF_RANGE", "UNIMPLEMENTED", "INTERNAL", "UNAVAILABLE", "DATA_LOSS", "UNAUTHENTICATED",
};

const char *gw_ctl_grpc_code_name(int code)
{
    return (code >= 0 && code < (int)CM_ARRAY_LEN(gw_ctl_code_names)) ? gw_ctl_code_names[code] : "UNKNOWN";
}

ri_status_t gw_ctl_status_from_grpc(int code)
{
    switch (code) {
    case GRPC_STATUS_OK: return RI_OK;
    case GRPC_STATUS_CANCELLED: return RI_ERR_CANCELLED;
    case GRPC_STATUS_INVALID_ARGUMENT: return RI_ERR_INVALID;
    case GRPC_STATUS_DEADLINE_EXCEEDED: return RI_ERR_TIMEOUT;
    case GRPC_STATUS_NOT_FOUND: return RI_ERR_NOT_FOUND;
    case GRPC_STATUS_ALREADY_EXISTS: return RI_ERR_EXISTS;
    case GRPC_STATUS_PERMISSION_DENIED: return RI_ERR_PERMISSION;
    case GRPC_STATUS_RESOURCE_EXHAUSTED: return RI_ERR_QUOTA;
    case GRPC_STATUS_FAILED_PRECONDITION: return RI_ERR_SHUTDOWN;
    case GRPC_STATUS_ABORTED: return RI_ERR_BUSY;
    case GRPC_STATUS_OUT_OF_RANGE: return RI_ERR_RANGE;
    case GRPC_STATUS_UNIMPLEMENTED: return RI_ERR_UNSUPPORTED;
    case GRPC_STATUS_UNAVAILABLE: return RI_ERR_UNREACHABLE;
    case GRPC_STATUS_DATA_LOSS: return RI_ERR_CORRUPT;
    case GRPC_STATUS_UNAUTHENTICATED: return RI_ERR_UNAUTHENTICATED;
    default: return RI_ERR_INTERNAL;
    }
}

ri_status_t gw_ctl_create(const char *addr, const char *token, gw_ctl_t **ctl_p)
{
    return gw_ctl_create_tls(addr, token, NULL, ctl_p);
}

/* Read one PEM file (NULL path: *pem_p = NULL). */
static ri_status_t gw_ctl_read_pem(const char *path, char **pem_p)
{
    *pem_p = NULL;
    if (path == NULL || path[0] == '\0')
        return RI_OK;
    ri_status_t st = cm_file_read(path, 1u << 20, pem_p, NULL);
    if (st == RI_OK && strstr(*pem_p, "-----BEGIN ") == NULL) {
        cm_free(*pem_p);
        *pem_p = NULL;
        st = RI_ERR_FORMAT;
    }
    if (st != RI_OK)
        cm_error("gw_ctl: %s: %s", path, st == RI_ERR_FORMAT ? "not a PEM file" : ri_status_str(st));
    return st;
}

static grpc_channel_credentials *gw_ctl_tls_creds(const gw_ctl_tls_t *tls, ri_status_t *st_p)
{
    char *ca = NULL, *cert = NULL, *key = NULL;
    grpc_channel_credentials *creds = NULL;
    if (tls->ca_file == NULL || (tls->cert_file == NULL) != (tls->key_file == NULL)) {
        *st_p = RI_ERR_INVALID;
        return NULL;
    }
    if ((*st_p = gw_ctl_read_pem(tls->ca_file, &ca)) != RI_OK || (*st_p = gw_ctl_read_pem(tls->cert_file, &cert)) != RI_OK ||
        (*st_p = gw_ctl_read_pem(tls->key_file, &key)) != RI_OK)
        goto out;
    grpc_ssl_pem_key_cert_pair pair = {.private_key = key, .cert_chain = cert};
    creds = grpc_ssl_credentials_create(ca, cert ? &pair : NULL, NULL, NULL);
    if (creds == NULL)
        *st_p = RI_ERR_INVALID;
out:
    if (key != NULL)
        explicit_bzero(key, strlen(key));
    cm_free(key);
    cm_free(cert);
    cm_free(ca);
    return creds;
}

ri_status_t gw_ctl_create_tls(const char *addr, const char *token, const gw_ctl_tls_t *tls, gw_ctl_t **ctl_p)
{
    ri_status_t st = RI_ERR_NOMEM;
    if (addr == NULL || addr[0] == '\0' || (token != NULL && strpbrk(token, "\r\n") != NULL))
        return RI_ERR_INVALID;
    gw_ctl_t *ctl = cm_calloc(&gw_ctl_tag, 1, sizeof(*ctl));
    if (ctl == NULL)
        return RI_ERR_NOMEM;
    ctl->addr = cm_strdup(&gw_ctl_tag, addr);
    if (ctl->addr == NULL)
        goto err_free;
    if (token != NULL && token[0] != '\0') {
        size_t n = strlen(token) + 8;
        ctl->bearer = cm_malloc(&gw_ctl_tag, n);
        if (ctl->bearer == NULL)
            goto err_free;
        snprintf(ctl->bearer, n, "Bearer %s", token);
    }
    grpc_init();
    /* Reconnect back-off capped at 1 s (gRPC's default grows to 120 s): a
     * kvstore restarted after a crash is found again within a second, not
     * after however long the failed attempts while it was down have grown
     * the back-off to.  One connection attempt a second to a dead loopback
     * or LAN peer costs nothing. */
    grpc_arg args[] = {
        {.type = GRPC_ARG_INTEGER, .key = GRPC_ARG_MAX_RECEIVE_MESSAGE_LENGTH, .value.integer = GW_CTL_MAX_RECV},
        {.type = GRPC_ARG_INTEGER, .key = GRPC_ARG_MAX_SEND_MESSAGE_LENGTH, .value.integer = GW_CTL_MAX_RECV},
        {.type = GRPC_ARG_INTEGER, .key = GRPC_ARG_INITIAL_RECONNECT_BACKOFF_MS, .value.integer = 100},
        {.type = GRPC_ARG_INTEGER, .key = GRPC_ARG_MIN_RECONNECT_BACKOFF_MS, .value.integer = 100},
        {.type = GRPC_ARG_INTEGER, .key = GRPC_ARG_MAX_RECONNECT_BACKOFF_MS, .value.integer = 1000},
    };
    grpc_channel_args chargs = {.num_args = CM_ARRAY_LEN(args), .args = args};
    grpc_channel_credentials *creds = tls ? gw_ctl_tls_creds(tls, &st) : grpc_insecure_credentials_create();
    if (creds == NULL) {
        grpc_shutdown();
        goto err_free;
    }
    ctl->channel = grpc_channel_create(addr, creds, &chargs);
    grpc_channel_credentials_release(creds);
    if (ctl->channel == NULL) {
        st = RI_ERR_NOMEM;
        grpc_shutdown();
        goto err_free;
    }
    *ctl_p = ctl;
    return RI_OK;

err_free:
    if (ctl->bearer != NULL)
        explicit_bzero(ctl->bearer, strlen(ctl->bearer));
    cm_free(ctl->bearer);
    cm_free(ctl->addr);
    cm_free(ctl);
    return st;
}

void gw_ctl_destroy(gw_ctl_t *ctl)
{
    if (ctl == NULL)
        return;
    grpc_channel_destroy(ctl->channel);
    grpc_shutdown();
    if (ctl->bearer != NULL)
        explicit_bzero(ctl->bearer, strlen(ctl->bearer));
    cm_free(ctl->bearer);
    cm_free(ctl->addr);
    cm_free(ctl);
}

const char *gw_ctl_address(const gw_ctl_t *ctl)
{
    return ctl ? ctl->addr : "";
}

static void gw_ctl_set_err(gw_ctl_error_t *err, int code, const char *fmt, const char *a, const char *b)
{
    if (err == NULL)
        return;
    err->grpc_code = code;
    snprintf(err->message, sizeof(err->message), fmt, a, b);
}

/* A channel whose last connection attempt failed (TRANSIENT_FAILURE) fails
 * a call at once with that old error, and its next attempt, made after the
 * back-off, moves only while some call polls the channel: a kvstore that
 * came back after a crash could stay unreached, its answer unread in our
 * socket.  So before a call on such a channel (or one connecting), watch
 * its state on cq until READY, until a fresh attempt failed, or for at most
 * GW_CTL_NUDGE_MS (and never past the call's deadline). */
#define GW_CTL_NUDGE_MS 1500
static void gw_ctl_nudge(gw_ctl_t *ctl, grpc_completion_queue *cq, gpr_timespec deadline)
{
    grpc_connectivity_state st = grpc_channel_check_connectivity_state(ctl->channel, 1);
    if (st != GRPC_CHANNEL_TRANSIENT_FAILURE && st != GRPC_CHANNEL_CONNECTING)
        return;
    gpr_timespec until = gpr_time_add(gpr_now(GPR_CLOCK_MONOTONIC), gpr_time_from_millis(GW_CTL_NUDGE_MS, GPR_TIMESPAN));
    if (gpr_time_cmp(deadline, until) < 0)
        until = deadline;
    bool left_failure = st != GRPC_CHANNEL_TRANSIENT_FAILURE;
    while (st != GRPC_CHANNEL_READY && st != GRPC_CHANNEL_SHUTDOWN) {
        grpc_channel_watch_connectivity_state(ctl->channel, st, until, cq, ctl);
        grpc_event ev = grpc_completion_queue_pluck(cq, ctl, gpr_inf_future(GPR_CLOCK_REALTIME), NULL);
        if (ev.type != GRPC_OP_COMPLETE || !ev.success)
            return;   /* until passed */
        st = grpc_channel_check_connectivity_state(ctl->channel, 1);
        if (st == GRPC_CHANNEL_TRANSIENT_FAILURE && left_failure)
            return;   /* a fresh attempt failed: the call reports it */
        left_failure = left_failure || st != GRPC_CHANNEL_TRANSIENT_FAILURE;
    }
}

ri_status_t gw_ctl_call_raw(gw_ctl_t *ctl, const char *method, const void *req, size_t len, uint32_t timeout_ms,
                            uint8_t **resp_p, size_t *resp_len_p, gw_ctl_error_t *err)
{
    cm_grpc_result_t res;

    if (ctl == NULL || method == NULL || (req == NULL && len > 0) || resp_p == NULL || resp_len_p == NULL)
        return RI_ERR_INVALID;
    if (timeout_ms == 0)
        timeout_ms = GW_CTL_DEFAULT_TIMEOUT_MS;
    gpr_timespec deadline =
        gpr_time_add(gpr_now(GPR_CLOCK_MONOTONIC), gpr_time_from_millis((int64_t)timeout_ms, GPR_TIMESPAN));
    grpc_completion_queue *cq = grpc_completion_queue_create_for_pluck(NULL);
    gw_ctl_nudge(ctl, cq, deadline);
    grpc_slice method_s = grpc_slice_from_copied_string(method);
    grpc_call *call = grpc_channel_create_call(ctl->channel, NULL, GRPC_PROPAGATE_DEFAULTS, cq, method_s, NULL,
                                               deadline, NULL);
    grpc_slice_unref(method_s);
    ri_status_t st = cm_grpc_unary(call, cq, deadline, ctl->bearer, req, len, &res);
    if (st == RI_ERR_INTERNAL) {
        gw_ctl_set_err(err, GRPC_STATUS_INTERNAL, "grpc start_batch failed calling %s on %s", method, ctl->addr);
        return st;
    }
    if (st == RI_ERR_PROTOCOL) {
        gw_ctl_set_err(err, GRPC_STATUS_INTERNAL, "cannot read the reply of %s from %s", method, ctl->addr);
        return st;
    }
    if (st != RI_OK)
        return st;
    st = gw_ctl_status_from_grpc(res.code);
    if (st != RI_OK) {
        cm_free(res.resp);
        if (err != NULL) {
            err->grpc_code = res.code;
            if (res.code == GRPC_STATUS_UNAVAILABLE)
                snprintf(err->message, sizeof(err->message), "cannot reach ri-kvstore at %s: %s", ctl->addr,
                         res.details);
            else if (res.code == GRPC_STATUS_DEADLINE_EXCEEDED)
                snprintf(err->message, sizeof(err->message), "no answer from %s within %u ms: %s", ctl->addr,
                         timeout_ms, res.details);
            else
                snprintf(err->message, sizeof(err->message), "%s", res.details);
        }
        return st;
    }
    *resp_p = res.resp; /* NULL for an empty answer */
    *resp_len_p = res.resp_len;
    if (err != NULL) {
        err->grpc_code = 0;
        err->message[0] = '\0';
    }
    return RI_OK;
}

/* Pack msg, call method, hand the reply bytes back (caller frees with cm_free). */
static ri_status_t gw_ctl_call_pb(gw_ctl_t *ctl, const char *method, const ProtobufCMessage *msg, uint32_t timeout_ms,
                                  uint8_t **resp_p, size_t *resp_len_p, gw_ctl_error_t *err)
{
    size_t len = protobuf_c_message_get_packed_size(msg);
    uint8_t *buf = cm_malloc(&gw_ctl_tag, len ? len : 1);
    if (buf == NULL)
        return RI_ERR_NOMEM;
    protobuf_c_message_pack(msg, buf);
    ri_status_t st = gw_ctl_call_raw(ctl, method, buf, len, timeout_ms, resp_p, resp_len_p, err);
    cm_free(buf);
    return st;
}

static ri_status_t gw_ctl_bad_reply(const gw_ctl_t *ctl, const char *method, gw_ctl_error_t *err)
{
    gw_ctl_set_err(err, GRPC_STATUS_INTERNAL, "the reply of %s from %s is not a valid protobuf", method, ctl->addr);
    return RI_ERR_PROTOCOL;
}

static void gw_ctl_copy_str(char *dst, size_t len, const char *src)
{
    snprintf(dst, len, "%s", src ? src : "");
}

ri_status_t gw_ctl_health(gw_ctl_t *ctl, uint32_t timeout_ms, gw_ctl_health_t *out, gw_ctl_error_t *err)
{
    uint8_t *resp = NULL;
    size_t n = 0;
    Retroinfer__V1__HealthRequest in = RETROINFER__V1__HEALTH_REQUEST__INIT;
    ri_status_t st = gw_ctl_call_pb(ctl, GW_CTL_PATH("Health"), &in.base, timeout_ms, &resp, &n, err);
    if (st != RI_OK)
        return st;
    Retroinfer__V1__HealthResponse *r = retroinfer__v1__health_response__unpack(NULL, n, resp);
    cm_free(resp);
    if (r == NULL)
        return gw_ctl_bad_reply(ctl, "Health", err);
    memset(out, 0, sizeof(*out));
    out->status = (int)r->status;
    gw_ctl_copy_str(out->version, sizeof(out->version), r->version);
    out->uptime_ms = r->uptime_ms;
    gw_ctl_copy_str(out->dataplane_address, sizeof(out->dataplane_address), r->dataplane_address);
    gw_ctl_copy_str(out->auth_mode, sizeof(out->auth_mode), r->auth_mode);
    retroinfer__v1__health_response__free_unpacked(r, NULL);
    return RI_OK;
}

ri_status_t gw_ctl_stats(gw_ctl_t *ctl, uint32_t timeout_ms, gw_ctl_stats_t *out, gw_ctl_error_t *err)
{
    uint8_t *resp = NULL;
    size_t n = 0;
    Retroinfer__V1__StatsRequest in = RETROINFER__V1__STATS_REQUEST__INIT;
    ri_status_t st = gw_ctl_call_pb(ctl, GW_CTL_PATH("Stats"), &in.base, timeout_ms, &resp, &n, err);
    if (st != RI_OK)
        return st;
    Retroinfer__V1__StatsResponse *r = retroinfer__v1__stats_response__unpack(NULL, n, resp);
    cm_free(resp);
    if (r == NULL)
        return gw_ctl_bad_reply(ctl, "Stats", err);
    memset(out, 0, sizeof(*out));
    out->pool_bytes_total = r->pool_bytes_total;
    out->pool_bytes_used = r->pool_bytes_used;
    out->disk_bytes_used = r->disk_bytes_used;
    out->sessions = r->sessions;
    out->sessions_all = r->sessions_all;
    out->clusters = r->clusters;
    out->fetches = r->fetches;
    out->cache_hits = r->cache_hits;
    out->cache_misses = r->cache_misses;
    out->bytes_sent = r->bytes_sent;
    out->errors = r->errors;
    out->uptime_ms = r->uptime_ms;
    out->prefix.blocks_memory = r->prefix_blocks_memory;
    out->prefix.bytes_memory = r->prefix_bytes_memory;
    out->prefix.blocks_disk = r->prefix_blocks_disk;
    out->prefix.bytes_disk = r->prefix_bytes_disk;
    out->prefix.attach_hits = r->prefix_attach_hits;
    out->prefix.attach_misses = r->prefix_attach_misses;
    out->prefix.tokens_attached = r->prefix_tokens_attached;
    out->prefix.publishes_new = r->prefix_publishes_new;
    out->prefix.publishes_existing = r->prefix_publishes_existing;
    out->prefix.publishes_refused = r->prefix_publishes_refused;
    out->prefix.evictions = r->prefix_evictions;
    out->prefix.spills = r->prefix_spills;
    out->prefix.corrupt = r->prefix_corrupt;
    retroinfer__v1__stats_response__free_unpacked(r, NULL);
    return RI_OK;
}

ri_status_t gw_ctl_create_session(gw_ctl_t *ctl, uint32_t timeout_ms, const gw_ctl_geometry_t *geometry,
                                  uint64_t expected_tokens, const char *label, gw_ctl_session_t *out,
                                  gw_ctl_error_t *err)
{
    uint8_t *resp = NULL;
    size_t n = 0;
    if (geometry == NULL || out == NULL)
        return RI_ERR_INVALID;
    Retroinfer__V1__Geometry g = RETROINFER__V1__GEOMETRY__INIT;
    g.layers = geometry->layers;
    g.kv_heads = geometry->kv_heads;
    g.head_dim = geometry->head_dim;
    g.dtype = (Retroinfer__V1__DType)geometry->dtype;
    g.page_tokens = geometry->page_tokens;
    Retroinfer__V1__CreateSessionRequest in = RETROINFER__V1__CREATE_SESSION_REQUEST__INIT;
    in.geometry = &g;
    in.expected_tokens = expected_tokens;
    in.label = (char *)(label ? label : "");
    ri_status_t st = gw_ctl_call_pb(ctl, GW_CTL_PATH("CreateSession"), &in.base, timeout_ms, &resp, &n, err);
    if (st != RI_OK)
        return st;
    Retroinfer__V1__CreateSessionResponse *r = retroinfer__v1__create_session_response__unpack(NULL, n, resp);
    cm_free(resp);
    if (r == NULL)
        return gw_ctl_bad_reply(ctl, "CreateSession", err);
    if (r->session_id == 0 || r->session_secret.len != CM_WIRE_SECRET_SIZE) {
        retroinfer__v1__create_session_response__free_unpacked(r, NULL);
        gw_ctl_set_err(err, GRPC_STATUS_INTERNAL, "CreateSession on %s%s: reply without a session id or 16-byte secret",
                       ctl->addr, "");
        return RI_ERR_PROTOCOL;
    }
    memset(out, 0, sizeof(*out));
    out->session_id = r->session_id;
    gw_ctl_copy_str(out->dataplane_address, sizeof(out->dataplane_address), r->dataplane_address);
    memcpy(out->secret, r->session_secret.data, CM_WIRE_SECRET_SIZE);
    explicit_bzero(r->session_secret.data, r->session_secret.len);
    retroinfer__v1__create_session_response__free_unpacked(r, NULL);
    return RI_OK;
}

ri_status_t gw_ctl_drop_session(gw_ctl_t *ctl, uint32_t timeout_ms, uint64_t session_id, uint64_t *bytes_freed_p,
                                gw_ctl_error_t *err)
{
    uint8_t *resp = NULL;
    size_t n = 0;
    Retroinfer__V1__DropSessionRequest in = RETROINFER__V1__DROP_SESSION_REQUEST__INIT;
    in.session_id = session_id;
    ri_status_t st = gw_ctl_call_pb(ctl, GW_CTL_PATH("DropSession"), &in.base, timeout_ms, &resp, &n, err);
    if (st != RI_OK)
        return st;
    Retroinfer__V1__DropSessionResponse *r = retroinfer__v1__drop_session_response__unpack(NULL, n, resp);
    cm_free(resp);
    if (r == NULL)
        return gw_ctl_bad_reply(ctl, "DropSession", err);
    if (bytes_freed_p != NULL)
        *bytes_freed_p = r->bytes_freed;
    retroinfer__v1__drop_session_response__free_unpacked(r, NULL);
    return RI_OK;
}

ri_status_t gw_ctl_keepalive(gw_ctl_t *ctl, uint32_t timeout_ms, const uint64_t *ids, size_t n, uint32_t *renewed_p,
                             uint64_t *lease_ms_p, gw_ctl_error_t *err)
{
    uint8_t *resp = NULL;
    size_t len = 0;
    if (ids == NULL && n > 0)
        return RI_ERR_INVALID;
    Retroinfer__V1__KeepAliveRequest in = RETROINFER__V1__KEEP_ALIVE_REQUEST__INIT;
    in.n_session_ids = n;
    in.session_ids = (uint64_t *)ids; /* only read by the packer */
    ri_status_t st = gw_ctl_call_pb(ctl, GW_CTL_PATH("KeepAlive"), &in.base, timeout_ms, &resp, &len, err);
    if (st != RI_OK)
        return st;
    Retroinfer__V1__KeepAliveResponse *r = retroinfer__v1__keep_alive_response__unpack(NULL, len, resp);
    cm_free(resp);
    if (r == NULL)
        return gw_ctl_bad_reply(ctl, "KeepAlive", err);
    if (renewed_p != NULL)
        *renewed_p = r->renewed;
    if (lease_ms_p != NULL)
        *lease_ms_p = r->lease_ms;
    retroinfer__v1__keep_alive_response__free_unpacked(r, NULL);
    return RI_OK;
}

ri_status_t gw_ctl_list_sessions(gw_ctl_t *ctl, uint32_t timeout_ms, gw_ctl_session_info_t **infos_p, size_t *n_p,
                                 gw_ctl_error_t *err)
{
    uint8_t *resp = NULL;
    size_t n = 0;
    gw_ctl_session_info_t *infos = NULL;
    if (infos_p == NULL || n_p == NULL)
        return RI_ERR_INVALID;
    Retroinfer__V1__ListSessionsRequest in = RETROINFER__V1__LIST_SESSIONS_REQUEST__INIT;
    ri_status_t st = gw_ctl_call_pb(ctl, GW_CTL_PATH("ListSessions"), &in.base, timeout_ms, &resp, &n, err);
    if (st != RI_OK)
        return st;
    Retroinfer__V1__ListSessionsResponse *r = retroinfer__v1__list_sessions_response__unpack(NULL, n, resp);
    cm_free(resp);
    if (r == NULL)
        return gw_ctl_bad_reply(ctl, "ListSessions", err);
    if (r->n_sessions > 0) {
        infos = cm_calloc(&gw_ctl_tag, r->n_sessions, sizeof(*infos));
        if (infos == NULL) {
            retroinfer__v1__list_sessions_response__free_unpacked(r, NULL);
            return RI_ERR_NOMEM;
        }
    }
    for (size_t i = 0; i < r->n_sessions; i++) {
        const Retroinfer__V1__SessionInfo *s = r->sessions[i];
        infos[i].session_id = s->session_id;
        gw_ctl_copy_str(infos[i].tenant, sizeof(infos[i].tenant), s->tenant);
        gw_ctl_copy_str(infos[i].label, sizeof(infos[i].label), s->label);
        if (s->geometry != NULL) {
            infos[i].geometry.layers = s->geometry->layers;
            infos[i].geometry.kv_heads = s->geometry->kv_heads;
            infos[i].geometry.head_dim = s->geometry->head_dim;
            infos[i].geometry.dtype = (uint32_t)s->geometry->dtype;
            infos[i].geometry.page_tokens = s->geometry->page_tokens;
        }
        infos[i].bytes_in_pool = s->bytes_in_pool;
        infos[i].bytes_on_disk = s->bytes_on_disk;
        infos[i].clusters = s->clusters;
        infos[i].created_unix_ms = s->created_unix_ms;
        gw_ctl_copy_str(infos[i].dataplane_address, sizeof(infos[i].dataplane_address), s->dataplane_address);
    }
    *n_p = r->n_sessions;
    *infos_p = infos;
    retroinfer__v1__list_sessions_response__free_unpacked(r, NULL);
    return RI_OK;
}

ri_status_t gw_ctl_drain(gw_ctl_t *ctl, uint32_t timeout_ms, uint32_t *sessions_open_p, gw_ctl_error_t *err)
{
    uint8_t *resp = NULL;
    size_t n = 0;
    Retroinfer__V1__DrainRequest in = RETROINFER__V1__DRAIN_REQUEST__INIT;
    ri_status_t st = gw_ctl_call_pb(ctl, GW_CTL_PATH("Drain"), &in.base, timeout_ms, &resp, &n, err);
    if (st != RI_OK)
        return st;
    Retroinfer__V1__DrainResponse *r = retroinfer__v1__drain_response__unpack(NULL, n, resp);
    cm_free(resp);
    if (r == NULL)
        return gw_ctl_bad_reply(ctl, "Drain", err);
    if (sessions_open_p != NULL)
        *sessions_open_p = r->sessions_open;
    retroinfer__v1__drain_response__free_unpacked(r, NULL);
    return RI_OK;
}

ri_status_t gw_ctl_lookup_prefix(gw_ctl_t *ctl, uint32_t timeout_ms, const uint8_t *keys, size_t n,
                                 uint32_t *cached_p, uint64_t *tokens_p, gw_ctl_error_t *err)
{
    uint8_t *resp = NULL;
    size_t len = 0;
    ProtobufCBinaryData *kb;
    if ((keys == NULL && n > 0) || cached_p == NULL)
        return RI_ERR_INVALID;
    kb = cm_calloc(&gw_ctl_tag, n ? n : 1, sizeof(*kb));
    if (kb == NULL)
        return RI_ERR_NOMEM;
    for (size_t i = 0; i < n; i++)
        kb[i] = (ProtobufCBinaryData){.len = 32, .data = (uint8_t *)(uintptr_t)(keys + 32 * i)};
    Retroinfer__V1__LookupPrefixRequest in = RETROINFER__V1__LOOKUP_PREFIX_REQUEST__INIT;
    in.n_keys = n;
    in.keys = kb; /* only read by the packer */
    ri_status_t st = gw_ctl_call_pb(ctl, GW_CTL_PATH("LookupPrefix"), &in.base, timeout_ms, &resp, &len, err);
    cm_free(kb);
    if (st != RI_OK)
        return st;
    Retroinfer__V1__LookupPrefixResponse *r = retroinfer__v1__lookup_prefix_response__unpack(NULL, len, resp);
    cm_free(resp);
    if (r == NULL)
        return gw_ctl_bad_reply(ctl, "LookupPrefix", err);
    *cached_p = r->cached;
    if (tokens_p != NULL)
        *tokens_p = r->tokens;
    retroinfer__v1__lookup_prefix_response__free_unpacked(r, NULL);
    return RI_OK;
}

ri_status_t gw_ctl_list_prefixes(gw_ctl_t *ctl, uint32_t timeout_ms, gw_ctl_prefix_info_t **infos_p, size_t *n_p,
                                 gw_ctl_error_t *err)
{
    uint8_t *resp = NULL;
    size_t n = 0;
    gw_ctl_prefix_info_t *infos = NULL;
    if (infos_p == NULL || n_p == NULL)
        return RI_ERR_INVALID;
    Retroinfer__V1__ListPrefixesRequest in = RETROINFER__V1__LIST_PREFIXES_REQUEST__INIT;
    ri_status_t st = gw_ctl_call_pb(ctl, GW_CTL_PATH("ListPrefixes"), &in.base, timeout_ms, &resp, &n, err);
    if (st != RI_OK)
        return st;
    Retroinfer__V1__ListPrefixesResponse *r = retroinfer__v1__list_prefixes_response__unpack(NULL, n, resp);
    cm_free(resp);
    if (r == NULL)
        return gw_ctl_bad_reply(ctl, "ListPrefixes", err);
    if (r->n_prefixes > 0) {
        infos = cm_calloc(&gw_ctl_tag, r->n_prefixes, sizeof(*infos));
        if (infos == NULL) {
            retroinfer__v1__list_prefixes_response__free_unpacked(r, NULL);
            return RI_ERR_NOMEM;
        }
    }
    for (size_t i = 0; i < r->n_prefixes; i++) {
        const Retroinfer__V1__PrefixInfo *p = r->prefixes[i];
        if (p->key.len == sizeof(infos[i].key))
            memcpy(infos[i].key, p->key.data, sizeof(infos[i].key));
        gw_ctl_copy_str(infos[i].tenant, sizeof(infos[i].tenant), p->tenant);
        infos[i].bytes = p->bytes;
        infos[i].tokens = p->tokens;
        infos[i].sessions = p->sessions;
        infos[i].created_unix_ms = p->created_unix_ms;
        infos[i].on_disk = p->on_disk;
    }
    *n_p = r->n_prefixes;
    *infos_p = infos;
    retroinfer__v1__list_prefixes_response__free_unpacked(r, NULL);
    return RI_OK;
}

ri_status_t gw_ctl_drop_prefix(gw_ctl_t *ctl, uint32_t timeout_ms, const uint8_t key[32], const char *tenant,
                               uint32_t *dropped_p, uint64_t *bytes_freed_p, gw_ctl_error_t *err)
{
    uint8_t *resp = NULL;
    size_t n = 0;
    if (key == NULL)
        return RI_ERR_INVALID;
    Retroinfer__V1__DropPrefixRequest in = RETROINFER__V1__DROP_PREFIX_REQUEST__INIT;
    in.key = (ProtobufCBinaryData){.len = 32, .data = (uint8_t *)(uintptr_t)key};
    in.tenant = (char *)(tenant != NULL ? tenant : "");
    ri_status_t st = gw_ctl_call_pb(ctl, GW_CTL_PATH("DropPrefix"), &in.base, timeout_ms, &resp, &n, err);
    if (st != RI_OK)
        return st;
    Retroinfer__V1__DropPrefixResponse *r = retroinfer__v1__drop_prefix_response__unpack(NULL, n, resp);
    cm_free(resp);
    if (r == NULL)
        return gw_ctl_bad_reply(ctl, "DropPrefix", err);
    if (dropped_p != NULL)
        *dropped_p = r->dropped;
    if (bytes_freed_p != NULL)
        *bytes_freed_p = r->bytes_freed;
    retroinfer__v1__drop_prefix_response__free_unpacked(r, NULL);
    return RI_OK;
}
