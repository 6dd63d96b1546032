/*
 * etcd v3 client, watch side (see cm_etcd.h): one thread per watch, with a
 * gRPC call and a pluck completion queue of its own.  The thread lists the
 * prefix (every key as a PUT), opens a Watch stream from the list's revision
 * + 1 and hands each event to the callback in order.  When the stream
 * breaks (etcd killed, a compaction passed the revision) it sends RESYNC,
 * waits retry_ms, lists again and watches on.  Expected load: a few watches
 * per process over a directory of tens to thousands of keys.
 */
#define _GNU_SOURCE
#include <pthread.h>
#include <stdatomic.h>
#include <string.h>
#include <time.h>

#include <grpc/byte_buffer.h>
#include <grpc/byte_buffer_reader.h>
#include <grpc/grpc.h>
#include <grpc/support/time.h>

#include "common/cm_alloc.h"
#include "common/cm_etcd.h"
#include "common/cm_etcd_internal.h"
#include "common/cm_status.h"
#include "etcd/rpc.pb-c.h"

#define CM_ETCD_WATCH_PATH    "/etcdserverpb.Watch/Watch"
#define CM_ETCD_WATCH_POLL_MS 100 /* how often a blocked read looks at the stop flag */

struct cm_etcd_watch {
    cm_etcd_t *e; /* borrowed: outlives the watch */
    char *prefix; /* owned */
    uint8_t *end; /* owned: the prefix's range end */
    size_t end_len;
    uint32_t retry_ms;
    cm_etcd_watch_fn fn;
    cm_etcd_synced_fn synced; /* may be NULL */
    void *arg;
    cm_etcd_list_t first; /* the list made by watch_start, handed to the thread */
    pthread_t thread;
    pthread_mutex_t mu; /* guards stop for the condition variable */
    pthread_cond_t cv;  /* wakes the retry sleep at stop */
    atomic_bool stop;
};

/* Sleep ms unless stop comes first. */
static void cm_etcd_watch_sleep(cm_etcd_watch_t *w, uint32_t ms)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    ts.tv_sec += ms / 1000;
    ts.tv_nsec += (long)(ms % 1000) * 1000000L;
    if (ts.tv_nsec >= 1000000000L) {
        ts.tv_sec++;
        ts.tv_nsec -= 1000000000L;
    }
    pthread_mutex_lock(&w->mu);
    while (!atomic_load(&w->stop)) {
        if (pthread_cond_timedwait(&w->cv, &w->mu, &ts) != 0)
            break;
    }
    pthread_mutex_unlock(&w->mu);
}

static void cm_etcd_watch_emit(cm_etcd_watch_t *w, cm_etcd_event_type_t type, const cm_etcd_kv_t *kv)
{
    cm_etcd_event_t ev = { .type = type, .kv = kv };
    w->fn(w->arg, &ev);
}

/* Wait for the batch tagged tag; on stop, cancel the call and wait for the
 * batch to end.  True when the batch succeeded and no stop came. */
static bool cm_etcd_watch_wait(cm_etcd_watch_t *w, grpc_completion_queue *cq, grpc_call *call, void *tag)
{
    for (;;) {
        gpr_timespec dl =
            gpr_time_add(gpr_now(GPR_CLOCK_MONOTONIC), gpr_time_from_millis(CM_ETCD_WATCH_POLL_MS, GPR_TIMESPAN));
        grpc_event ev = grpc_completion_queue_pluck(cq, tag, dl, NULL);
        if (ev.type == GRPC_OP_COMPLETE)
            return ev.success != 0 && !atomic_load(&w->stop);
        if (atomic_load(&w->stop)) {
            grpc_call_cancel(call, NULL);
            grpc_completion_queue_pluck(cq, tag, gpr_inf_future(GPR_CLOCK_MONOTONIC), NULL);
            return false;
        }
    }
}

/* Hand the events of one answer to the callback.  False when the stream
 * must be dropped (etcd cancelled the watch, or compacted past it). */
static bool cm_etcd_watch_answer(cm_etcd_watch_t *w, const uint8_t *buf, size_t len)
{
    Etcdserverpb__WatchResponse *r = etcdserverpb__watch_response__unpack(NULL, len, buf);
    if (r == NULL) {
        cm_etcd_set_error("etcd watch %s: an answer that does not parse", w->prefix);
        return false;
    }
    bool keep = !r->canceled && r->compact_revision == 0;
    for (size_t i = 0; keep && i < r->n_events; i++) {
        const Mvccpb__Event *ev = r->events[i];
        cm_etcd_kv_t kv;
        if (ev->kv == NULL || cm_etcd_kv_copy(ev->kv, &kv) != RI_OK) {
            keep = false; /* a lost event: resynchronise rather than skip it */
            break;
        }
        if (ev->type == MVCCPB__EVENT__EVENT_TYPE__DELETE)
            kv.len = 0, kv.val[0] = '\0';
        cm_etcd_watch_emit(w, ev->type == MVCCPB__EVENT__EVENT_TYPE__DELETE ? CM_ETCD_DELETE : CM_ETCD_PUT, &kv);
        cm_etcd_kv_free(&kv);
    }
    etcdserverpb__watch_response__free_unpacked(r, NULL);
    return keep;
}

/* Pack the create request of the watch from revision rev. */
static grpc_byte_buffer *cm_etcd_watch_create_msg(const cm_etcd_watch_t *w, int64_t rev)
{
    Etcdserverpb__WatchCreateRequest cr = ETCDSERVERPB__WATCH_CREATE_REQUEST__INIT;
    size_t plen = strlen(w->prefix);
    cr.key = plen ? (ProtobufCBinaryData){ plen, (uint8_t *)w->prefix } : (ProtobufCBinaryData){ 1, (uint8_t *)"" };
    cr.range_end = (ProtobufCBinaryData){ w->end_len, w->end };
    cr.start_revision = rev;
    Etcdserverpb__WatchRequest in = ETCDSERVERPB__WATCH_REQUEST__INIT;
    in.request_union_case = ETCDSERVERPB__WATCH_REQUEST__REQUEST_UNION_CREATE_REQUEST;
    in.create_request = &cr;
    size_t len = protobuf_c_message_get_packed_size(&in.base);
    uint8_t buf[1024];
    uint8_t *p = len <= sizeof(buf) ? buf : cm_malloc(&cm_etcd_tag, len);
    if (p == NULL)
        return NULL;
    protobuf_c_message_pack(&in.base, p);
    grpc_slice s = grpc_slice_from_copied_buffer((const char *)p, len);
    grpc_byte_buffer *bb = grpc_raw_byte_buffer_create(&s, 1);
    grpc_slice_unref(s);
    if (p != buf)
        cm_free(p);
    return bb;
}

/* Read answers until the stream breaks or stop.  Returns when the stream
 * is over (its call finished and freed). */
static void cm_etcd_watch_stream(cm_etcd_watch_t *w, int64_t rev)
{
    cm_etcd_t *e = w->e;
    grpc_channel *ch = e->chans[atomic_load(&e->cur) % e->n_ep];
    grpc_byte_buffer *req_bb = cm_etcd_watch_create_msg(w, rev);
    if (req_bb == NULL)
        return;
    grpc_completion_queue *cq = grpc_completion_queue_create_for_pluck(NULL);
    grpc_slice method = grpc_slice_from_static_string(CM_ETCD_WATCH_PATH);
    grpc_call *call = grpc_channel_create_call(ch, NULL, GRPC_PROPAGATE_DEFAULTS, cq, method, NULL,
                                               gpr_inf_future(GPR_CLOCK_REALTIME), NULL);
    grpc_metadata_array init_md, trail_md;
    grpc_metadata_array_init(&init_md);
    grpc_metadata_array_init(&trail_md);
    grpc_op ops[3];
    memset(ops, 0, sizeof(ops));
    ops[0].op = GRPC_OP_SEND_INITIAL_METADATA;
    ops[1].op = GRPC_OP_SEND_MESSAGE;
    ops[1].data.send_message.send_message = req_bb;
    ops[2].op = GRPC_OP_RECV_INITIAL_METADATA;
    ops[2].data.recv_initial_metadata.recv_initial_metadata = &init_md;
    void *tag_start = (void *)1, *tag_recv = (void *)2, *tag_status = (void *)3;
    if (grpc_call_start_batch(call, ops, 3, tag_start, NULL) != GRPC_CALL_OK)
        goto finish;
    if (!cm_etcd_watch_wait(w, cq, call, tag_start))
        goto finish;
    for (;;) {
        grpc_byte_buffer *bb = NULL;
        grpc_op rop;
        memset(&rop, 0, sizeof(rop));
        rop.op = GRPC_OP_RECV_MESSAGE;
        rop.data.recv_message.recv_message = &bb;
        if (grpc_call_start_batch(call, &rop, 1, tag_recv, NULL) != GRPC_CALL_OK)
            break;
        bool ok = cm_etcd_watch_wait(w, cq, call, tag_recv);
        if (!ok || bb == NULL) {
            if (bb != NULL)
                grpc_byte_buffer_destroy(bb);
            break;
        }
        grpc_byte_buffer_reader reader;
        bool keep = false;
        if (grpc_byte_buffer_reader_init(&reader, bb)) {
            grpc_slice s = grpc_byte_buffer_reader_readall(&reader);
            grpc_byte_buffer_reader_destroy(&reader);
            keep = cm_etcd_watch_answer(w, GRPC_SLICE_START_PTR(s), GRPC_SLICE_LENGTH(s));
            grpc_slice_unref(s);
        }
        grpc_byte_buffer_destroy(bb);
        if (!keep)
            break;
    }

finish:;
    /* End the call whatever state it is in, and collect its status so that
     * every tag has come back before the queue goes. */
    grpc_status_code code = GRPC_STATUS_UNKNOWN;
    grpc_slice details = grpc_empty_slice();
    grpc_call_cancel(call, NULL);
    grpc_op sop;
    memset(&sop, 0, sizeof(sop));
    sop.op = GRPC_OP_RECV_STATUS_ON_CLIENT;
    sop.data.recv_status_on_client.trailing_metadata = &trail_md;
    sop.data.recv_status_on_client.status = &code;
    sop.data.recv_status_on_client.status_details = &details;
    if (grpc_call_start_batch(call, &sop, 1, tag_status, NULL) == GRPC_CALL_OK)
        grpc_completion_queue_pluck(cq, tag_status, gpr_inf_future(GPR_CLOCK_MONOTONIC), NULL);
    grpc_slice_unref(details);
    grpc_metadata_array_destroy(&init_md);
    grpc_metadata_array_destroy(&trail_md);
    grpc_byte_buffer_destroy(req_bb);
    grpc_call_unref(call);
    grpc_completion_queue_shutdown(cq);
    grpc_completion_queue_destroy(cq);
}

static void *cm_etcd_watch_main(void *arg)
{
    cm_etcd_watch_t *w = arg;
    cm_etcd_list_t l = w->first;
    bool have_list = true;
    memset(&w->first, 0, sizeof(w->first));
    while (!atomic_load(&w->stop)) {
        if (!have_list && cm_etcd_list(w->e, w->prefix, 0, &l) != RI_OK) {
            cm_etcd_watch_sleep(w, w->retry_ms);
            continue;
        }
        have_list = false;
        for (size_t i = 0; i < l.n && !atomic_load(&w->stop); i++)
            cm_etcd_watch_emit(w, CM_ETCD_PUT, &l.kvs[i]);
        int64_t rev = l.revision;
        cm_etcd_list_free(&l);
        if (atomic_load(&w->stop))
            break;
        if (w->synced != NULL)
            w->synced(w->arg);
        cm_etcd_watch_stream(w, rev + 1);
        if (atomic_load(&w->stop))
            break;
        cm_etcd_watch_emit(w, CM_ETCD_RESYNC, NULL);
        cm_etcd_watch_sleep(w, w->retry_ms);
    }
    cm_etcd_list_free(&l);
    return NULL;
}

static void cm_etcd_watch_free(cm_etcd_watch_t *w)
{
    cm_etcd_list_free(&w->first);
    cm_free(w->prefix);
    cm_free(w->end);
    cm_free(w);
}

ri_status_t cm_etcd_watch_start(cm_etcd_t *e, const char *prefix, uint32_t retry_ms, cm_etcd_watch_fn fn, void *arg,
                                cm_etcd_watch_t **w_p)
{
    return cm_etcd_watch_start_synced(e, prefix, retry_ms, fn, NULL, arg, w_p);
}

ri_status_t cm_etcd_watch_start_synced(cm_etcd_t *e, const char *prefix, uint32_t retry_ms, cm_etcd_watch_fn fn,
                                       cm_etcd_synced_fn synced, void *arg, cm_etcd_watch_t **w_p)
{
    if (e == NULL || prefix == NULL || fn == NULL || w_p == NULL) {
        cm_etcd_set_error("etcd watch: missing argument");
        return RI_ERR_INVALID;
    }
    ri_status_t st = RI_ERR_NOMEM;
    cm_etcd_watch_t *w = cm_calloc(&cm_etcd_tag, 1, sizeof(*w));
    if (w == NULL)
        return RI_ERR_NOMEM;
    size_t plen = strlen(prefix);
    w->e = e;
    w->prefix = cm_strdup(&cm_etcd_tag, prefix);
    w->end = cm_malloc(&cm_etcd_tag, plen + 1);
    if (w->prefix == NULL || w->end == NULL)
        goto err_free;
    cm_etcd_prefix_end(prefix, plen, w->end, &w->end_len);
    w->retry_ms = retry_ms ? retry_ms : 500;
    w->fn = fn;
    w->synced = synced;
    w->arg = arg;
    atomic_init(&w->stop, false);
    /* The first list here, so that a caller learns at once that etcd is down. */
    if ((st = cm_etcd_list(e, prefix, 0, &w->first)) != RI_OK)
        goto err_free;
    pthread_condattr_t ca;
    pthread_condattr_init(&ca);
    pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
    pthread_cond_init(&w->cv, &ca);
    pthread_condattr_destroy(&ca);
    pthread_mutex_init(&w->mu, NULL);
    if (pthread_create(&w->thread, NULL, cm_etcd_watch_main, w) != 0) {
        st = RI_ERR_NOMEM;
        cm_etcd_set_error("etcd watch %s: cannot start a thread", prefix);
        goto err_destroy_sync;
    }
    *w_p = w;
    return RI_OK;

err_destroy_sync:
    pthread_cond_destroy(&w->cv);
    pthread_mutex_destroy(&w->mu);
err_free:
    cm_etcd_watch_free(w);
    return st;
}

void cm_etcd_watch_stop(cm_etcd_watch_t *w)
{
    if (w == NULL)
        return;
    pthread_mutex_lock(&w->mu);
    atomic_store(&w->stop, true);
    pthread_cond_broadcast(&w->cv);
    pthread_mutex_unlock(&w->mu);
    pthread_join(w->thread, NULL);
    pthread_cond_destroy(&w->cv);
    pthread_mutex_destroy(&w->mu);
    cm_etcd_watch_free(w);
}
