/*
 * The observer side of the cluster directory (see cm_cluster.h): the local
 * copy of the node list kept by a watch (stale while etcd is cut off, the
 * last list kept), and the observer's own lease for the session records it
 * writes, renewed by the keepalive thread and re-granted after an outage
 * (the records are then written again).
 */
#define _GNU_SOURCE
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "common/cm_alloc.h"
#include "common/cm_cluster.h"
#include "common/cm_cluster_internal.h"
#include "common/cm_etcd_internal.h"
#include "common/cm_log.h"
#include "common/cm_status.h"

/* ---- node watch ----------------------------------------------------------- */

/* Insert or replace n in the sorted array *arr_p of *n_p (c->mu held). */
static void cm_cluster_nodes_upsert(cm_cluster_node_t **arr_p, size_t *n_p, const cm_cluster_node_t *n)
{
    cm_cluster_node_t *arr = *arr_p;
    size_t i = 0;
    while (i < *n_p && strcmp(arr[i].name, n->name) < 0)
        i++;
    if (i < *n_p && strcmp(arr[i].name, n->name) == 0) {
        arr[i] = *n;
        return;
    }
    arr = cm_realloc(&cm_cluster_tag, arr, (*n_p + 1) * sizeof(*arr));
    if (arr == NULL) {
        cm_warn("cluster: out of memory adding node %s to the local directory", n->name);
        return;
    }
    memmove(arr + i + 1, arr + i, (*n_p - i) * sizeof(*arr));
    arr[i] = *n;
    *arr_p = arr;
    (*n_p)++;
}

static void cm_cluster_nodes_remove(cm_cluster_node_t *arr, size_t *n_p, const char *name)
{
    for (size_t i = 0; i < *n_p; i++) {
        if (strcmp(arr[i].name, name) == 0) {
            memmove(arr + i, arr + i + 1, (*n_p - i - 1) * sizeof(*arr));
            (*n_p)--;
            return;
        }
    }
}

static void cm_cluster_watch_event(void *arg, const cm_etcd_event_t *ev)
{
    cm_cluster_t *c = arg;
    pthread_mutex_lock(&c->mu);
    if (ev->type == CM_ETCD_RESYNC) {
        /* keep the last list for the callers, build the next one apart */
        c->stale = true;
        c->rebuilding = true;
        c->n_building = 0;
    } else {
        char prefix[CM_CLUSTER_KEY_MAX];
        snprintf(prefix, sizeof(prefix), "%snodes/", c->root);
        const char *name = ev->kv->key + strlen(prefix);
        cm_cluster_node_t n;
        if (ev->type == CM_ETCD_DELETE) {
            cm_cluster_nodes_remove(c->rebuilding ? c->building : c->nodes,
                                    c->rebuilding ? &c->n_building : &c->n_nodes, name);
        } else if (cm_cluster_node_from_json(ev->kv->val, ev->kv->len, &n) == RI_OK && strcmp(n.name, name) == 0) {
            if (c->rebuilding)
                cm_cluster_nodes_upsert(&c->building, &c->n_building, &n);
            else
                cm_cluster_nodes_upsert(&c->nodes, &c->n_nodes, &n);
        } else {
            cm_warn("cluster: node record %s does not parse; left out", ev->kv->key);
        }
    }
    pthread_mutex_unlock(&c->mu);
}

static void cm_cluster_watch_synced(void *arg)
{
    cm_cluster_t *c = arg;
    pthread_mutex_lock(&c->mu);
    if (c->rebuilding) {
        cm_cluster_node_t *old = c->nodes;
        c->nodes = c->building;
        c->n_nodes = c->n_building;
        c->building = old;
        c->n_building = 0;
        c->rebuilding = false;
    }
    c->stale = false;
    c->synced_once = true;
    pthread_cond_broadcast(&c->cv);
    pthread_mutex_unlock(&c->mu);
}

ri_status_t cm_cluster_watch_nodes(cm_cluster_t *c)
{
    if (c == NULL)
        return RI_ERR_INVALID;
    pthread_mutex_lock(&c->mu);
    bool have = c->watch != NULL;
    if (!have) {
        c->rebuilding = true;
        c->n_building = 0;
    }
    pthread_mutex_unlock(&c->mu);
    if (have)
        return RI_OK;
    char prefix[CM_CLUSTER_KEY_MAX];
    snprintf(prefix, sizeof(prefix), "%snodes/", c->root);
    cm_etcd_watch_t *w = NULL;
    ri_status_t st =
        cm_etcd_watch_start_synced(c->etcd, prefix, 0, cm_cluster_watch_event, cm_cluster_watch_synced, c, &w);
    if (st != RI_OK)
        return st;
    /* the first list was read by watch_start; wait for the thread to hand
     * it over (it does not touch etcd before that) */
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    ts.tv_sec += c->timeout_ms / 1000 + 1;
    pthread_mutex_lock(&c->mu);
    c->watch = w;
    while (!c->synced_once) {
        if (pthread_cond_timedwait(&c->cv, &c->mu, &ts) != 0)
            break;
    }
    bool ok = c->synced_once;
    pthread_mutex_unlock(&c->mu);
    if (!ok) {
        cm_etcd_set_error("cluster: the node watch did not deliver its first list");
        return RI_ERR_TIMEOUT;
    }
    return RI_OK;
}

/* ---- observer lease and session records --------------------------------------- */

ri_status_t cm_cluster_join_observer(cm_cluster_t *c, const char *worker, uint32_t lease_ms)
{
    if (c == NULL || !cm_cluster_name_valid(worker) || (lease_ms != 0 && lease_ms < 2000)) {
        cm_etcd_set_error("cluster observer: a valid worker name and a lease of at least 2000 ms are needed");
        return RI_ERR_INVALID;
    }
    if (lease_ms == 0)
        lease_ms = CM_CLUSTER_DEFAULT_LEASE_MS;
    pthread_mutex_lock(&c->mu);
    bool already = c->observer;
    pthread_mutex_unlock(&c->mu);
    if (already)
        return RI_OK;
    int64_t lease = 0;
    ri_status_t st = cm_etcd_lease_grant(c->etcd, (int64_t)((lease_ms + 999) / 1000), &lease);
    if (st != RI_OK)
        return st;
    pthread_mutex_lock(&c->mu);
    c->observer = true;
    snprintf(c->worker, sizeof(c->worker), "%s", worker);
    c->obs_lease_ms = lease_ms;
    c->obs_lease = lease;
    c->obs_renewed_ms = cm_cluster_now_ms();
    st = cm_cluster_thread_start_locked(c);
    pthread_cond_broadcast(&c->cv);
    pthread_mutex_unlock(&c->mu);
    return st;
}

static int cm_cluster_sess_find(const cm_cluster_t *c, const char *node, uint64_t id)
{
    for (size_t i = 0; i < c->n_sess; i++) {
        if (c->sess[i].session_id == id && strcmp(c->sess[i].node, node) == 0)
            return (int)i;
    }
    return -1;
}

/* Write one session record under lease. */
static ri_status_t cm_cluster_session_write(cm_cluster_t *c, const cm_cluster_session_t *s, int64_t lease)
{
    char key[CM_CLUSTER_KEY_MAX], *json = NULL;
    cm_cluster_session_key(c, s->node, s->session_id, key);
    ri_status_t st = cm_cluster_session_to_json(s, &json);
    if (st == RI_OK)
        st = cm_etcd_put(c->etcd, key, json, strlen(json), lease);
    cm_free(json);
    return st;
}

/* Note s as pending in the observer's records (*rec_p the record as kept,
 * *lease_p the observer's lease now). */
static ri_status_t cm_cluster_session_note(cm_cluster_t *c, const cm_cluster_session_t *s,
                                           cm_cluster_session_t *rec_p, int64_t *lease_p, bool kick)
{
    if (c == NULL || s == NULL || !cm_cluster_name_valid(s->node) || memchr(s->label, '\0', sizeof(s->label)) == NULL ||
        memchr(s->worker, '\0', sizeof(s->worker)) == NULL) {
        cm_etcd_set_error("cluster session put: a valid node name is needed");
        return RI_ERR_INVALID;
    }
    pthread_mutex_lock(&c->mu);
    if (!c->observer) {
        pthread_mutex_unlock(&c->mu);
        cm_etcd_set_error("cluster session put: cm_cluster_join_observer first");
        return RI_ERR_INVALID;
    }
    cm_cluster_session_t rec = *s;
    if (rec.worker[0] == '\0')
        snprintf(rec.worker, sizeof(rec.worker), "%s", c->worker);
    int i = cm_cluster_sess_find(c, rec.node, rec.session_id);
    if (i < 0) {
        if (c->n_sess == c->cap_sess) {
            size_t cap = c->cap_sess ? c->cap_sess * 2 : 16;
            cm_cluster_session_t *ss = cm_realloc(&cm_cluster_tag, c->sess, cap * sizeof(*ss));
            bool *pp = ss ? cm_realloc(&cm_cluster_tag, c->sess_pending, cap * sizeof(*pp)) : NULL;
            if (ss != NULL)
                c->sess = ss;
            if (pp == NULL) {
                pthread_mutex_unlock(&c->mu);
                return RI_ERR_NOMEM;
            }
            c->sess_pending = pp;
            c->cap_sess = cap;
        }
        i = (int)c->n_sess++;
    }
    c->sess[i] = rec;
    c->sess_pending[i] = true;
    *lease_p = c->obs_lease;
    *rec_p = rec;
    if (kick) {
        c->kick = true; /* the keepalive thread writes it */
        pthread_cond_broadcast(&c->cv);
    }
    pthread_mutex_unlock(&c->mu);
    return RI_OK;
}

ri_status_t cm_cluster_session_put(cm_cluster_t *c, const cm_cluster_session_t *s)
{
    cm_cluster_session_t rec;
    int64_t lease = 0;
    ri_status_t st = cm_cluster_session_note(c, s, &rec, &lease, false);
    if (st != RI_OK)
        return st;
    st = RI_ERR_UNREACHABLE;
    if (lease != 0)
        st = cm_cluster_session_write(c, &rec, lease);
    else
        cm_etcd_set_error("cluster session put: no observer lease (etcd unreachable); retried");
    if (st == RI_OK) {
        pthread_mutex_lock(&c->mu);
        int j = cm_cluster_sess_find(c, rec.node, rec.session_id);
        if (j >= 0)
            c->sess_pending[j] = false;
        pthread_mutex_unlock(&c->mu);
    }
    return st;
}

void cm_cluster_session_put_async(cm_cluster_t *c, const cm_cluster_session_t *s)
{
    cm_cluster_session_t rec;
    int64_t lease = 0;
    (void)cm_cluster_session_note(c, s, &rec, &lease, true);
}

/* Remember a delete to retry (c->mu held). */
static void cm_cluster_del_push(cm_cluster_t *c, const char *key)
{
    if (c->n_del == c->cap_del) {
        size_t cap = c->cap_del ? c->cap_del * 2 : 16;
        char(*dk)[CM_CLUSTER_KEY_MAX] = cm_realloc(&cm_cluster_tag, c->del_keys, cap * CM_CLUSTER_KEY_MAX);
        if (dk == NULL)
            return; /* the record then goes with the observer's lease */
        c->del_keys = dk;
        c->cap_del = cap;
    }
    snprintf(c->del_keys[c->n_del++], CM_CLUSTER_KEY_MAX, "%s", key);
}

/* Drop the record of (node, session_id) from the observer's list (c->mu held). */
static void cm_cluster_sess_forget_locked(cm_cluster_t *c, const char *node, uint64_t session_id)
{
    int i = cm_cluster_sess_find(c, node, session_id);
    if (i >= 0) {
        memmove(c->sess + i, c->sess + i + 1, (c->n_sess - (size_t)i - 1) * sizeof(*c->sess));
        memmove(c->sess_pending + i, c->sess_pending + i + 1, (c->n_sess - (size_t)i - 1) * sizeof(bool));
        c->n_sess--;
    }
}

ri_status_t cm_cluster_session_del(cm_cluster_t *c, const char *node, uint64_t session_id)
{
    if (c == NULL || !cm_cluster_name_valid(node)) {
        cm_etcd_set_error("cluster session del: a valid node name is needed");
        return RI_ERR_INVALID;
    }
    char key[CM_CLUSTER_KEY_MAX];
    cm_cluster_session_key(c, node, session_id, key);
    pthread_mutex_lock(&c->mu);
    cm_cluster_sess_forget_locked(c, node, session_id);
    pthread_mutex_unlock(&c->mu);
    ri_status_t st = cm_etcd_delete(c->etcd, key, false, NULL);
    if (st != RI_OK) {
        pthread_mutex_lock(&c->mu);
        cm_cluster_del_push(c, key);
        pthread_mutex_unlock(&c->mu);
    }
    return st;
}

void cm_cluster_session_del_async(cm_cluster_t *c, const char *node, uint64_t session_id)
{
    if (c == NULL || !cm_cluster_name_valid(node))
        return;
    char key[CM_CLUSTER_KEY_MAX];
    cm_cluster_session_key(c, node, session_id, key);
    pthread_mutex_lock(&c->mu);
    cm_cluster_sess_forget_locked(c, node, session_id);
    cm_cluster_del_push(c, key); /* the keepalive thread deletes it */
    c->kick = true;
    pthread_cond_broadcast(&c->cv);
    pthread_mutex_unlock(&c->mu);
}

/* Write the records still pending (or all of them, after a re-grant) and
 * the deletes that failed. */
static void cm_cluster_observer_flush(cm_cluster_t *c, int64_t lease, bool all)
{
    pthread_mutex_lock(&c->mu);
    for (size_t i = 0; i < c->n_sess; i++) {
        if (!all && !c->sess_pending[i])
            continue;
        cm_cluster_session_t rec = c->sess[i];
        pthread_mutex_unlock(&c->mu);
        ri_status_t st = cm_cluster_session_write(c, &rec, lease);
        pthread_mutex_lock(&c->mu);
        if (st != RI_OK)
            break;
        int j = cm_cluster_sess_find(c, rec.node, rec.session_id);
        if (j >= 0)
            c->sess_pending[j] = false;
    }
    while (c->n_del > 0) {
        char key[CM_CLUSTER_KEY_MAX];
        snprintf(key, sizeof(key), "%s", c->del_keys[c->n_del - 1]);
        pthread_mutex_unlock(&c->mu);
        ri_status_t st = cm_etcd_delete(c->etcd, key, false, NULL);
        pthread_mutex_lock(&c->mu);
        if (st != RI_OK)
            break;
        c->n_del--;
    }
    pthread_mutex_unlock(&c->mu);
}

void cm_cluster_observer_tick(cm_cluster_t *c)
{
    pthread_mutex_lock(&c->mu);
    bool observer = c->observer;
    int64_t lease = c->obs_lease;
    uint32_t lease_ms = c->obs_lease_ms;
    pthread_mutex_unlock(&c->mu);
    if (!observer)
        return;
    ri_status_t st = lease ? cm_etcd_lease_keepalive(c->etcd, lease, NULL) : RI_ERR_NOT_FOUND;
    if (st == RI_OK) {
        cm_cluster_observer_flush(c, lease, false);
        return;
    }
    if (st != RI_ERR_NOT_FOUND)
        return; /* etcd unreachable: try again next round */
    int64_t fresh = 0;
    if (cm_etcd_lease_grant(c->etcd, (int64_t)((lease_ms + 999) / 1000), &fresh) != RI_OK) {
        pthread_mutex_lock(&c->mu);
        c->obs_lease = 0;
        pthread_mutex_unlock(&c->mu);
        return;
    }
    pthread_mutex_lock(&c->mu);
    c->obs_lease = fresh;
    c->obs_renewed_ms = cm_cluster_now_ms();
    pthread_mutex_unlock(&c->mu);
    cm_info("cluster: observer %s has a new lease; writing its session records again", c->worker);
    cm_cluster_observer_flush(c, fresh, true);
}

void cm_cluster_observer_leave(cm_cluster_t *c)
{
    if (c->observer && c->obs_lease != 0)
        cm_etcd_lease_revoke(c->etcd, c->obs_lease); /* deletes its session records */
    c->obs_lease = 0;
}

void cm_cluster_observer_free(cm_cluster_t *c)
{
    cm_free(c->sess);
    cm_free(c->sess_pending);
    cm_free(c->del_keys);
    c->sess = NULL;
    c->sess_pending = NULL;
    c->del_keys = NULL;
    c->n_sess = c->n_del = 0;
}
