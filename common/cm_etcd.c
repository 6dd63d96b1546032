/*
 * etcd v3 client, unary side (see cm_etcd.h): KV and Lease calls over the
 * gRPC C core.  Calls are rare (registration, renewals every second or so,
 * a directory list now and then), so each one is a plain blocking call on a
 * pluck completion queue of its own, as gpuworker/client/gw_ctl.c does;
 * that keeps one client usable from several threads without a lock.  The
 * watch stream lives in cm_etcd_watch.c.
 */
#define _GNU_SOURCE
#include "common/cm_etcd.h"

#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include <grpc/byte_buffer.h>
#include <grpc/byte_buffer_reader.h>
#include <grpc/grpc.h>
#include <grpc/grpc_security.h>
#include <grpc/slice.h>
#include <grpc/support/time.h>

#include "common/cm_alloc.h"
#include "common/cm_etcd_internal.h"
#include "common/cm_grpc.h"
#include "common/cm_status.h"
#include "etcd/rpc.pb-c.h"

#define CM_ETCD_DEFAULT_TIMEOUT_MS 2000
#define CM_ETCD_MAX_MSG            (64 << 20)
#define CM_ETCD_MAX_ENDPOINTS      16
#define CM_ETCD_KV(m)              "/etcdserverpb.KV/" m
#define CM_ETCD_LEASE(m)           "/etcdserverpb.Lease/" m

CM_ALLOC_TAG(cm_etcd_tag, "cm.etcd");

static _Thread_local char cm_etcd_err[512];

const char *cm_etcd_last_error(void)
{
    return cm_etcd_err;
}

void cm_etcd_set_error(const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(cm_etcd_err, sizeof(cm_etcd_err), fmt, ap);
    va_end(ap);
}

/* ---- endpoints ---------------------------------------------------------- */

/* Skip a leading "etcd://". */
static const char *cm_etcd_strip_scheme(const char *s)
{
    return strncmp(s, "etcd://", 7) == 0 ? s + 7 : s;
}

/* Is s[0..n) "host:port" with a non-empty host and a port 1..65535? */
static bool cm_etcd_hostport_valid(const char *s, size_t n)
{
    const char *colon = NULL;
    for (size_t i = 0; i < n; i++) {
        if (s[i] == ':')
            colon = s + i;
        else if (s[i] <= ' ' || s[i] == '/' || s[i] == ',')
            return false;
    }
    if (colon == NULL || colon == s || colon == s + n - 1)
        return false;
    unsigned long port = 0;
    for (const char *p = colon + 1; p < s + n; p++) {
        if (*p < '0' || *p > '9')
            return false;
        port = port * 10 + (unsigned long)(*p - '0');
        if (port > 65535)
            return false;
    }
    return port > 0;
}

bool cm_etcd_endpoints_valid(const char *endpoints)
{
    if (endpoints == NULL)
        return false;
    const char *s = cm_etcd_strip_scheme(endpoints);
    if (*s == '\0')
        return false;
    size_t count = 0;
    for (;;) {
        const char *comma = strchr(s, ',');
        size_t n = comma ? (size_t)(comma - s) : strlen(s);
        if (!cm_etcd_hostport_valid(s, n) || ++count > CM_ETCD_MAX_ENDPOINTS)
            return false;
        if (comma == NULL)
            return true;
        s = comma + 1;
    }
}

static void cm_etcd_free_endpoints(cm_etcd_t *e)
{
    for (size_t i = 0; i < e->n_ep; i++) {
        if (e->chans != NULL && e->chans[i] != NULL)
            grpc_channel_destroy(e->chans[i]);
        if (e->eps != NULL)
            cm_free(e->eps[i]);
    }
    cm_free(e->chans);
    cm_free(e->reset_ms);
    cm_free(e->eps);
}

/* Channel settings: reconnect quickly after an etcd restart (gRPC's default
 * backoff grows to two minutes; the minimum backoff is left alone, gRPC
 * takes it as the connect timeout too), and find a silent peer by keepalive pings
 * (etcd accepts one every 5 s at most). */
static grpc_channel *cm_etcd_channel(const char *target)
{
    grpc_arg args[] = {
        { .type = GRPC_ARG_INTEGER, .key = GRPC_ARG_MAX_RECEIVE_MESSAGE_LENGTH, .value.integer = CM_ETCD_MAX_MSG },
        { .type = GRPC_ARG_INTEGER, .key = GRPC_ARG_MAX_SEND_MESSAGE_LENGTH, .value.integer = CM_ETCD_MAX_MSG },
        { .type = GRPC_ARG_INTEGER, .key = GRPC_ARG_INITIAL_RECONNECT_BACKOFF_MS, .value.integer = 100 },
        { .type = GRPC_ARG_INTEGER, .key = GRPC_ARG_MAX_RECONNECT_BACKOFF_MS, .value.integer = 1000 },
        { .type = GRPC_ARG_INTEGER, .key = GRPC_ARG_KEEPALIVE_TIME_MS, .value.integer = 10000 },
        { .type = GRPC_ARG_INTEGER, .key = GRPC_ARG_KEEPALIVE_TIMEOUT_MS, .value.integer = 5000 },
    };
    grpc_channel_args chargs = { .num_args = CM_ARRAY_LEN(args), .args = args };
    grpc_channel_credentials *creds = grpc_insecure_credentials_create();
    if (creds == NULL)
        return NULL;
    grpc_channel *ch = grpc_channel_create(target, creds, &chargs);
    grpc_channel_credentials_release(creds);
    return ch;
}

ri_status_t cm_etcd_open(const char *endpoints, uint32_t timeout_ms, cm_etcd_t **e_p)
{
    if (e_p == NULL || !cm_etcd_endpoints_valid(endpoints)) {
        cm_etcd_set_error("etcd endpoints \"%s\" are not host:port[,host:port...]", endpoints ? endpoints : "(null)");
        return RI_ERR_INVALID;
    }
    cm_etcd_t *e = cm_calloc(&cm_etcd_tag, 1, sizeof(*e));
    if (e == NULL)
        return RI_ERR_NOMEM;
    e->timeout_ms = timeout_ms ? timeout_ms : CM_ETCD_DEFAULT_TIMEOUT_MS;
    const char *s = cm_etcd_strip_scheme(endpoints);
    size_t n = 1;
    for (const char *p = s; *p; p++)
        n += *p == ',';
    e->eps = cm_calloc(&cm_etcd_tag, n, sizeof(*e->eps));
    e->chans = cm_calloc(&cm_etcd_tag, n, sizeof(*e->chans));
    e->reset_ms = cm_calloc(&cm_etcd_tag, n, sizeof(*e->reset_ms));
    if (e->eps == NULL || e->chans == NULL || e->reset_ms == NULL)
        goto err_free;
    grpc_init();
    for (size_t i = 0; i < n; i++) {
        const char *comma = strchr(s, ',');
        size_t len = comma ? (size_t)(comma - s) : strlen(s);
        e->eps[i] = cm_malloc(&cm_etcd_tag, len + 1);
        if (e->eps[i] == NULL)
            goto err_shutdown;
        memcpy(e->eps[i], s, len);
        e->eps[i][len] = '\0';
        e->n_ep = i + 1;
        e->chans[i] = cm_etcd_channel(e->eps[i]);
        if (e->chans[i] == NULL)
            goto err_shutdown;
        s = comma ? comma + 1 : s + len;
    }
    atomic_init(&e->cur, 0);
    pthread_mutex_init(&e->mu, NULL);
    *e_p = e;
    return RI_OK;

err_shutdown:
    cm_etcd_free_endpoints(e);
    grpc_shutdown();
    cm_free(e);
    return RI_ERR_NOMEM;
err_free:
    cm_etcd_free_endpoints(e);
    cm_free(e);
    return RI_ERR_NOMEM;
}

void cm_etcd_close(cm_etcd_t *e)
{
    if (e == NULL)
        return;
    cm_etcd_free_endpoints(e);
    pthread_mutex_destroy(&e->mu);
    grpc_shutdown();
    cm_free(e);
}

/* ---- one call ----------------------------------------------------------- */

static uint64_t cm_etcd_now_ms(void)
{
    gpr_timespec t = gpr_now(GPR_CLOCK_MONOTONIC);
    return (uint64_t)t.tv_sec * 1000u + (uint64_t)t.tv_nsec / 1000000u;
}

grpc_call *cm_etcd_new_call(cm_etcd_t *e, size_t ep, grpc_completion_queue *cq, const char *method,
                            gpr_timespec deadline)
{
    grpc_slice method_s = grpc_slice_from_copied_string(method);
    pthread_mutex_lock(&e->mu);
    grpc_call *call =
        grpc_channel_create_call(e->chans[ep], NULL, GRPC_PROPAGATE_DEFAULTS, cq, method_s, NULL, deadline, NULL);
    pthread_mutex_unlock(&e->mu);
    grpc_slice_unref(method_s);
    return call;
}

void cm_etcd_reset_channel(cm_etcd_t *e, size_t ep)
{
    uint64_t now = cm_etcd_now_ms();
    pthread_mutex_lock(&e->mu);
    if (now - e->reset_ms[ep] < 500) {
        pthread_mutex_unlock(&e->mu);
        return;
    }
    grpc_channel *fresh = cm_etcd_channel(e->eps[ep]), *old = NULL;
    if (fresh != NULL) {
        old = e->chans[ep];
        e->chans[ep] = fresh;
        e->reset_ms[ep] = now;
    }
    pthread_mutex_unlock(&e->mu);
    if (old != NULL)
        grpc_channel_destroy(old); /* calls made on it hold their own reference */
}

/* gRPC status -> ours. */
static ri_status_t cm_etcd_status(grpc_status_code code)
{
    switch (code) {
    case GRPC_STATUS_OK:
        return RI_OK;
    case GRPC_STATUS_UNAVAILABLE:
        return RI_ERR_UNREACHABLE;
    case GRPC_STATUS_DEADLINE_EXCEEDED:
        return RI_ERR_TIMEOUT;
    case GRPC_STATUS_NOT_FOUND:
        return RI_ERR_NOT_FOUND;
    case GRPC_STATUS_ALREADY_EXISTS:
        return RI_ERR_EXISTS;
    case GRPC_STATUS_INVALID_ARGUMENT:
    case GRPC_STATUS_OUT_OF_RANGE:
        return RI_ERR_INVALID;
    case GRPC_STATUS_RESOURCE_EXHAUSTED:
        return RI_ERR_QUOTA;
    case GRPC_STATUS_CANCELLED:
        return RI_ERR_CANCELLED;
    case GRPC_STATUS_UNAUTHENTICATED:
        return RI_ERR_UNAUTHENTICATED;
    case GRPC_STATUS_PERMISSION_DENIED:
        return RI_ERR_PERMISSION;
    case GRPC_STATUS_UNIMPLEMENTED:
        return RI_ERR_UNSUPPORTED;
    default:
        return RI_ERR_TRANSPORT;
    }
}

/* Read a whole byte buffer into *out_p (cm_free; NULL when empty). */
/* One attempt on one channel. */
static ri_status_t cm_etcd_call_one(cm_etcd_t *e, size_t ep, const char *method, const void *req, size_t len,
                                    uint8_t **resp_p, size_t *resp_len_p)
{
    cm_grpc_result_t res;

    gpr_timespec deadline =
        gpr_time_add(gpr_now(GPR_CLOCK_MONOTONIC), gpr_time_from_millis((int64_t)e->timeout_ms, GPR_TIMESPAN));
    grpc_completion_queue *cq = grpc_completion_queue_create_for_pluck(NULL);
    grpc_call *call = cm_etcd_new_call(e, ep, cq, method, deadline);
    ri_status_t st = cm_grpc_unary(call, cq, deadline, NULL, req, len, &res);
    if (st != RI_OK) {
        cm_etcd_set_error("etcd %s: %s", method,
                          st == RI_ERR_INTERNAL ? "grpc start_batch failed" : "cannot read the answer");
        return st;
    }
    st = cm_etcd_status(res.code);
    if (st == RI_ERR_TIMEOUT) {
        /* a deadline on a channel that never connected: etcd cannot be
         * reached, rather than slow */
        pthread_mutex_lock(&e->mu);
        if (grpc_channel_check_connectivity_state(e->chans[ep], 0) != GRPC_CHANNEL_READY)
            st = RI_ERR_UNREACHABLE;
        pthread_mutex_unlock(&e->mu);
    }
    if (st != RI_OK) {
        cm_free(res.resp);
        cm_etcd_set_error("etcd at %s: %s: %s (%.300s)", e->eps[ep], method, ri_status_str(st), res.details);
        return st;
    }
    if (!res.got_message) {
        cm_etcd_set_error("etcd at %s: %s: no answer message", e->eps[ep], method);
        return RI_ERR_PROTOCOL;
    }
    if (res.resp == NULL && (res.resp = cm_malloc(&cm_etcd_tag, 1)) == NULL) /* an empty answer: never NULL */
        return RI_ERR_NOMEM;
    *resp_p = res.resp;
    *resp_len_p = res.resp_len;
    return RI_OK;
}

ri_status_t cm_etcd_call(cm_etcd_t *e, const char *method, const void *req, size_t len, uint8_t **resp_p,
                         size_t *resp_len_p)
{
    size_t first = atomic_load(&e->cur) % e->n_ep;
    ri_status_t st = RI_ERR_UNREACHABLE;
    for (size_t k = 0; k < e->n_ep; k++) {
        size_t ep = (first + k) % e->n_ep;
        st = cm_etcd_call_one(e, ep, method, req, len, resp_p, resp_len_p);
        if (st == RI_ERR_UNREACHABLE)
            cm_etcd_reset_channel(e, ep);
        if (st != RI_ERR_UNREACHABLE && st != RI_ERR_TIMEOUT) {
            if (ep != first)
                atomic_store(&e->cur, ep);
            return st;
        }
    }
    return st;
}

/* Pack msg and call; the answer bytes in *resp_p (cm_free). */
static ri_status_t cm_etcd_call_pb(cm_etcd_t *e, const char *method, const ProtobufCMessage *msg, uint8_t **resp_p,
                                   size_t *resp_len_p)
{
    size_t len = protobuf_c_message_get_packed_size(msg);
    uint8_t *buf = cm_malloc(&cm_etcd_tag, len ? len : 1);
    if (buf == NULL)
        return RI_ERR_NOMEM;
    protobuf_c_message_pack(msg, buf);
    ri_status_t st = cm_etcd_call(e, method, buf, len, resp_p, resp_len_p);
    cm_free(buf);
    return st;
}

static ri_status_t cm_etcd_bad_answer(const char *method)
{
    cm_etcd_set_error("etcd %s: the answer is not a valid protobuf", method);
    return RI_ERR_PROTOCOL;
}

/* ---- helpers ------------------------------------------------------------ */

void cm_etcd_prefix_end(const char *prefix, size_t plen, uint8_t *end, size_t *end_len_p)
{
    memcpy(end, prefix, plen);
    while (plen > 0 && end[plen - 1] == 0xff)
        plen--;
    if (plen == 0) {
        end[0] = 0;
        *end_len_p = 1;
        return;
    }
    end[plen - 1]++;
    *end_len_p = plen;
}

ri_status_t cm_etcd_kv_copy(const Mvccpb__KeyValue *src, cm_etcd_kv_t *kv)
{
    char *key = cm_malloc(&cm_etcd_tag, src->key.len + 1);
    char *val = cm_malloc(&cm_etcd_tag, src->value.len + 1);
    if (key == NULL || val == NULL) {
        cm_free(key);
        cm_free(val);
        return RI_ERR_NOMEM;
    }
    if (src->key.len > 0)
        memcpy(key, src->key.data, src->key.len);
    key[src->key.len] = '\0';
    if (src->value.len > 0)
        memcpy(val, src->value.data, src->value.len);
    val[src->value.len] = '\0';
    kv->key = key;
    kv->val = val;
    kv->len = src->value.len;
    kv->create_rev = src->create_revision;
    kv->mod_rev = src->mod_revision;
    kv->lease = src->lease;
    return RI_OK;
}

void cm_etcd_kv_free(cm_etcd_kv_t *kv)
{
    if (kv == NULL)
        return;
    cm_free(kv->key);
    cm_free(kv->val);
    kv->key = kv->val = NULL;
    kv->len = 0;
}

void cm_etcd_list_free(cm_etcd_list_t *l)
{
    if (l == NULL)
        return;
    for (size_t i = 0; i < l->n; i++)
        cm_etcd_kv_free(&l->kvs[i]);
    cm_free(l->kvs);
    l->kvs = NULL;
    l->n = 0;
}

static bool cm_etcd_key_ok(const char *key)
{
    if (key == NULL || key[0] == '\0') {
        cm_etcd_set_error("etcd: empty key");
        return false;
    }
    return true;
}

/* ---- KV ----------------------------------------------------------------- */

ri_status_t cm_etcd_put(cm_etcd_t *e, const char *key, const void *val, size_t len, int64_t lease)
{
    if (e == NULL || !cm_etcd_key_ok(key) || (val == NULL && len > 0) || lease < 0)
        return RI_ERR_INVALID;
    Etcdserverpb__PutRequest in = ETCDSERVERPB__PUT_REQUEST__INIT;
    in.key = (ProtobufCBinaryData){ strlen(key), (uint8_t *)key };
    in.value = (ProtobufCBinaryData){ len, (uint8_t *)val };
    in.lease = lease;
    uint8_t *resp = NULL;
    size_t n = 0;
    ri_status_t st = cm_etcd_call_pb(e, CM_ETCD_KV("Put"), &in.base, &resp, &n);
    if (st == RI_ERR_NOT_FOUND)
        cm_etcd_set_error("etcd put %s: lease %llx not found", key, (unsigned long long)lease);
    if (st != RI_OK)
        return st;
    Etcdserverpb__PutResponse *r = etcdserverpb__put_response__unpack(NULL, n, resp);
    cm_free(resp);
    if (r == NULL)
        return cm_etcd_bad_answer("Put");
    etcdserverpb__put_response__free_unpacked(r, NULL);
    return RI_OK;
}

ri_status_t cm_etcd_create(cm_etcd_t *e, const char *key, const void *val, size_t len, int64_t lease)
{
    if (e == NULL || !cm_etcd_key_ok(key) || (val == NULL && len > 0) || lease < 0)
        return RI_ERR_INVALID;
    ProtobufCBinaryData k = { strlen(key), (uint8_t *)key };
    Etcdserverpb__Compare cmp = ETCDSERVERPB__COMPARE__INIT;
    cmp.result = ETCDSERVERPB__COMPARE__COMPARE_RESULT__EQUAL;
    cmp.target = ETCDSERVERPB__COMPARE__COMPARE_TARGET__CREATE;
    cmp.key = k;
    cmp.target_union_case = ETCDSERVERPB__COMPARE__TARGET_UNION_CREATE_REVISION;
    cmp.create_revision = 0;
    Etcdserverpb__PutRequest put = ETCDSERVERPB__PUT_REQUEST__INIT;
    put.key = k;
    put.value = (ProtobufCBinaryData){ len, (uint8_t *)val };
    put.lease = lease;
    Etcdserverpb__RequestOp op = ETCDSERVERPB__REQUEST_OP__INIT;
    op.request_case = ETCDSERVERPB__REQUEST_OP__REQUEST_REQUEST_PUT;
    op.request_put = &put;
    Etcdserverpb__Compare *cmps[] = { &cmp };
    Etcdserverpb__RequestOp *ops[] = { &op };
    Etcdserverpb__TxnRequest in = ETCDSERVERPB__TXN_REQUEST__INIT;
    in.n_compare = 1;
    in.compare = cmps;
    in.n_success = 1;
    in.success = ops;
    uint8_t *resp = NULL;
    size_t n = 0;
    ri_status_t st = cm_etcd_call_pb(e, CM_ETCD_KV("Txn"), &in.base, &resp, &n);
    if (st != RI_OK)
        return st;
    Etcdserverpb__TxnResponse *r = etcdserverpb__txn_response__unpack(NULL, n, resp);
    cm_free(resp);
    if (r == NULL)
        return cm_etcd_bad_answer("Txn");
    st = r->succeeded ? RI_OK : RI_ERR_EXISTS;
    etcdserverpb__txn_response__free_unpacked(r, NULL);
    if (st == RI_ERR_EXISTS)
        cm_etcd_set_error("etcd create %s: the key exists", key);
    return st;
}

/* One Range call over [key, end) (end NULL: the key alone). */
static ri_status_t cm_etcd_range(cm_etcd_t *e, const char *key, const uint8_t *end, size_t end_len, size_t limit,
                                 Etcdserverpb__RangeResponse **r_p)
{
    Etcdserverpb__RangeRequest in = ETCDSERVERPB__RANGE_REQUEST__INIT;
    size_t klen = strlen(key);
    /* etcd refuses an empty key: the whole space starts at "\0". */
    in.key = klen ? (ProtobufCBinaryData){ klen, (uint8_t *)key } : (ProtobufCBinaryData){ 1, (uint8_t *)"" };
    if (end != NULL)
        in.range_end = (ProtobufCBinaryData){ end_len, (uint8_t *)end };
    in.limit = (int64_t)limit;
    in.sort_order = ETCDSERVERPB__RANGE_REQUEST__SORT_ORDER__ASCEND;
    in.sort_target = ETCDSERVERPB__RANGE_REQUEST__SORT_TARGET__KEY;
    uint8_t *resp = NULL;
    size_t n = 0;
    ri_status_t st = cm_etcd_call_pb(e, CM_ETCD_KV("Range"), &in.base, &resp, &n);
    if (st != RI_OK)
        return st;
    Etcdserverpb__RangeResponse *r = etcdserverpb__range_response__unpack(NULL, n, resp);
    cm_free(resp);
    if (r == NULL)
        return cm_etcd_bad_answer("Range");
    *r_p = r;
    return RI_OK;
}

ri_status_t cm_etcd_get(cm_etcd_t *e, const char *key, cm_etcd_kv_t *kv_p)
{
    if (e == NULL || !cm_etcd_key_ok(key) || kv_p == NULL)
        return RI_ERR_INVALID;
    Etcdserverpb__RangeResponse *r = NULL;
    ri_status_t st = cm_etcd_range(e, key, NULL, 0, 1, &r);
    if (st != RI_OK)
        return st;
    if (r->n_kvs == 0 || r->kvs[0] == NULL) {
        st = RI_ERR_NOT_FOUND;
        cm_etcd_set_error("etcd get %s: no such key", key);
    } else {
        st = cm_etcd_kv_copy(r->kvs[0], kv_p);
    }
    etcdserverpb__range_response__free_unpacked(r, NULL);
    return st;
}

ri_status_t cm_etcd_list(cm_etcd_t *e, const char *prefix, size_t limit, cm_etcd_list_t *out)
{
    if (e == NULL || prefix == NULL || out == NULL)
        return RI_ERR_INVALID;
    size_t plen = strlen(prefix);
    uint8_t *end = cm_malloc(&cm_etcd_tag, plen + 1);
    if (end == NULL)
        return RI_ERR_NOMEM;
    size_t end_len = 0;
    cm_etcd_prefix_end(prefix, plen, end, &end_len);
    Etcdserverpb__RangeResponse *r = NULL;
    ri_status_t st = cm_etcd_range(e, prefix, end, end_len, limit, &r);
    cm_free(end);
    if (st != RI_OK)
        return st;
    cm_etcd_list_t l = { .revision = r->header ? r->header->revision : 0 };
    if (r->n_kvs > 0) {
        l.kvs = cm_calloc(&cm_etcd_tag, r->n_kvs, sizeof(*l.kvs));
        if (l.kvs == NULL) {
            st = RI_ERR_NOMEM;
            goto out;
        }
        for (size_t i = 0; i < r->n_kvs; i++) {
            if ((st = cm_etcd_kv_copy(r->kvs[i], &l.kvs[i])) != RI_OK) {
                cm_etcd_list_free(&l);
                goto out;
            }
            l.n = i + 1;
        }
    }
    *out = l;
out:
    etcdserverpb__range_response__free_unpacked(r, NULL);
    return st;
}

ri_status_t cm_etcd_delete(cm_etcd_t *e, const char *key, bool prefix, int64_t *deleted_p)
{
    if (e == NULL || !cm_etcd_key_ok(key))
        return RI_ERR_INVALID;
    size_t klen = strlen(key);
    uint8_t *end = cm_malloc(&cm_etcd_tag, klen + 1);
    if (end == NULL)
        return RI_ERR_NOMEM;
    size_t end_len = 0;
    cm_etcd_prefix_end(key, klen, end, &end_len);
    Etcdserverpb__DeleteRangeRequest in = ETCDSERVERPB__DELETE_RANGE_REQUEST__INIT;
    in.key = (ProtobufCBinaryData){ klen, (uint8_t *)key };
    if (prefix)
        in.range_end = (ProtobufCBinaryData){ end_len, end };
    uint8_t *resp = NULL;
    size_t n = 0;
    ri_status_t st = cm_etcd_call_pb(e, CM_ETCD_KV("DeleteRange"), &in.base, &resp, &n);
    cm_free(end);
    if (st != RI_OK)
        return st;
    Etcdserverpb__DeleteRangeResponse *r = etcdserverpb__delete_range_response__unpack(NULL, n, resp);
    cm_free(resp);
    if (r == NULL)
        return cm_etcd_bad_answer("DeleteRange");
    if (deleted_p != NULL)
        *deleted_p = r->deleted;
    etcdserverpb__delete_range_response__free_unpacked(r, NULL);
    return RI_OK;
}

/* ---- Lease -------------------------------------------------------------- */

ri_status_t cm_etcd_lease_grant(cm_etcd_t *e, int64_t ttl_s, int64_t *id_p)
{
    if (e == NULL || ttl_s < 1 || id_p == NULL) {
        cm_etcd_set_error("etcd lease grant: a TTL of at least 1 s is needed");
        return RI_ERR_INVALID;
    }
    Etcdserverpb__LeaseGrantRequest in = ETCDSERVERPB__LEASE_GRANT_REQUEST__INIT;
    in.ttl = ttl_s;
    uint8_t *resp = NULL;
    size_t n = 0;
    ri_status_t st = cm_etcd_call_pb(e, CM_ETCD_LEASE("LeaseGrant"), &in.base, &resp, &n);
    if (st != RI_OK)
        return st;
    Etcdserverpb__LeaseGrantResponse *r = etcdserverpb__lease_grant_response__unpack(NULL, n, resp);
    cm_free(resp);
    if (r == NULL)
        return cm_etcd_bad_answer("LeaseGrant");
    if (r->error != NULL && r->error[0] != '\0') {
        cm_etcd_set_error("etcd lease grant: %s", r->error);
        st = RI_ERR_TRANSPORT;
    } else if (r->id == 0) {
        cm_etcd_set_error("etcd lease grant: no lease id in the answer");
        st = RI_ERR_PROTOCOL;
    } else {
        *id_p = r->id;
    }
    etcdserverpb__lease_grant_response__free_unpacked(r, NULL);
    return st;
}

ri_status_t cm_etcd_lease_keepalive(cm_etcd_t *e, int64_t id, int64_t *ttl_p)
{
    if (e == NULL || id == 0)
        return RI_ERR_INVALID;
    Etcdserverpb__LeaseKeepAliveRequest in = ETCDSERVERPB__LEASE_KEEP_ALIVE_REQUEST__INIT;
    in.id = id;
    uint8_t *resp = NULL;
    size_t n = 0;
    /* One message on the stream, half-close, one answer: etcd's server
     * answers every request and ends the stream at the client's close. */
    ri_status_t st = cm_etcd_call_pb(e, CM_ETCD_LEASE("LeaseKeepAlive"), &in.base, &resp, &n);
    if (st != RI_OK)
        return st;
    Etcdserverpb__LeaseKeepAliveResponse *r = etcdserverpb__lease_keep_alive_response__unpack(NULL, n, resp);
    cm_free(resp);
    if (r == NULL)
        return cm_etcd_bad_answer("LeaseKeepAlive");
    if (r->ttl <= 0) {
        cm_etcd_set_error("etcd lease %llx has expired", (unsigned long long)id);
        st = RI_ERR_NOT_FOUND;
    } else if (ttl_p != NULL) {
        *ttl_p = r->ttl;
    }
    etcdserverpb__lease_keep_alive_response__free_unpacked(r, NULL);
    return st;
}

ri_status_t cm_etcd_lease_revoke(cm_etcd_t *e, int64_t id)
{
    if (e == NULL || id == 0)
        return RI_ERR_INVALID;
    Etcdserverpb__LeaseRevokeRequest in = ETCDSERVERPB__LEASE_REVOKE_REQUEST__INIT;
    in.id = id;
    uint8_t *resp = NULL;
    size_t n = 0;
    ri_status_t st = cm_etcd_call_pb(e, CM_ETCD_LEASE("LeaseRevoke"), &in.base, &resp, &n);
    if (st == RI_ERR_NOT_FOUND)
        return RI_OK; /* expired already: its keys are gone, which is what revoke is for */
    if (st != RI_OK)
        return st;
    Etcdserverpb__LeaseRevokeResponse *r = etcdserverpb__lease_revoke_response__unpack(NULL, n, resp);
    cm_free(resp);
    if (r == NULL)
        return cm_etcd_bad_answer("LeaseRevoke");
    etcdserverpb__lease_revoke_response__free_unpacked(r, NULL);
    return RI_OK;
}
