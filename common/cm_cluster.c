/*
 * The cluster directory (see cm_cluster.h), the parts both sides share:
 * open/close, names, the JSON of node and session records, placement
 * ranking, the keepalive thread's loop, and the one-shot reads (nodes
 * without a watch, sessions, prefix holders).  Members live in
 * cm_cluster_member.c, observers in cm_cluster_observer.c.  Expected load:
 * tens of nodes, thousands of sessions and prefix blocks; a keepalive round
 * every lease / 3 (1.7 s by default).
 */
#define _GNU_SOURCE
#include "common/cm_cluster.h"

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <cjson/cJSON.h>

#include "common/cm_alloc.h"
#include "common/cm_cluster_internal.h"
#include "common/cm_etcd_internal.h"
#include "common/cm_status.h"

CM_ALLOC_TAG(cm_cluster_tag, "cm.cluster");

uint64_t cm_cluster_now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000u + (uint64_t)ts.tv_nsec / 1000000u;
}

bool cm_cluster_name_valid(const char *name)
{
    if (name == NULL)
        return false;
    size_t n = strlen(name);
    if (n < 1 || n >= CM_CLUSTER_NAME_MAX)
        return false;
    for (size_t i = 0; i < n; i++) {
        char ch = name[i];
        bool ok = (ch >= 'a' && ch <= 'z') || (ch >= 'A' && ch <= 'Z') || (ch >= '0' && ch <= '9') || ch == '.' ||
                  ch == '_' || ch == ':' || ch == '-';
        if (!ok)
            return false;
    }
    return true;
}

/* ---- keys ----------------------------------------------------------------- */

void cm_cluster_node_key(const cm_cluster_t *c, const char *node, char *key)
{
    snprintf(key, CM_CLUSTER_KEY_MAX, "%snodes/%s", c->root, node);
}

void cm_cluster_prefix_key(const cm_cluster_t *c, const uint8_t block[32], const char *node, char *key)
{
    int n = snprintf(key, CM_CLUSTER_KEY_MAX, "%sprefix/", c->root);
    for (int i = 0; i < 32; i++)
        n += snprintf(key + n, CM_CLUSTER_KEY_MAX - (size_t)n, "%02x", block[i]);
    if (node != NULL)
        snprintf(key + n, CM_CLUSTER_KEY_MAX - (size_t)n, "/%s", node);
}

void cm_cluster_session_key(const cm_cluster_t *c, const char *node, uint64_t id, char *key)
{
    snprintf(key, CM_CLUSTER_KEY_MAX, "%ssessions/%s/%016" PRIx64, c->root, node, id);
}

/* ---- open / close ----------------------------------------------------------- */

ri_status_t cm_cluster_open(const char *url, const char *cluster, uint32_t timeout_ms, cm_cluster_t **c_p)
{
    if (c_p == NULL || !cm_cluster_name_valid(cluster)) {
        cm_etcd_set_error("cluster name \"%s\" is not 1..63 characters of [A-Za-z0-9._:-]",
                          cluster ? cluster : "(null)");
        return RI_ERR_INVALID;
    }
    cm_cluster_t *c = cm_calloc(&cm_cluster_tag, 1, sizeof(*c));
    if (c == NULL)
        return RI_ERR_NOMEM;
    ri_status_t st = cm_etcd_open(url, timeout_ms, &c->etcd);
    if (st != RI_OK) {
        cm_free(c);
        return st;
    }
    snprintf(c->root, sizeof(c->root), "/ri/%s/", cluster);
    c->timeout_ms = timeout_ms ? timeout_ms : 2000;
    pthread_mutex_init(&c->mu, NULL);
    pthread_condattr_t ca;
    pthread_condattr_init(&ca);
    pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
    pthread_cond_init(&c->cv, &ca);
    pthread_condattr_destroy(&ca);
    atomic_init(&c->registered, false);
    *c_p = c;
    return RI_OK;
}

void cm_cluster_close(cm_cluster_t *c)
{
    if (c == NULL)
        return;
    cm_etcd_watch_stop(c->watch); /* before the lock: its callback takes it */
    c->watch = NULL;
    pthread_mutex_lock(&c->mu);
    c->stop = true;
    pthread_cond_broadcast(&c->cv);
    bool running = c->thread_running;
    pthread_mutex_unlock(&c->mu);
    if (running)
        pthread_join(c->thread, NULL);
    cm_cluster_member_leave(c);
    cm_cluster_observer_leave(c);
    cm_cluster_member_free(c);
    cm_cluster_observer_free(c);
    cm_free(c->nodes);
    cm_free(c->building);
    cm_etcd_close(c->etcd);
    pthread_cond_destroy(&c->cv);
    pthread_mutex_destroy(&c->mu);
    cm_free(c);
}

/* ---- the keepalive thread ----------------------------------------------------- */

/* The shortest period of the roles this cluster plays: lease / 3. */
static uint32_t cm_cluster_period_ms(const cm_cluster_t *c)
{
    uint32_t p = 0;
    if (c->member)
        p = c->lease_ms / 3;
    if (c->observer && (p == 0 || c->obs_lease_ms / 3 < p))
        p = c->obs_lease_ms / 3;
    return p ? p : 1000;
}

static void *cm_cluster_thread_main(void *arg)
{
    cm_cluster_t *c = arg;
    pthread_mutex_lock(&c->mu);
    while (!c->stop) {
        uint32_t period = cm_cluster_period_ms(c);
        struct timespec ts;
        clock_gettime(CLOCK_MONOTONIC, &ts);
        ts.tv_sec += period / 1000;
        ts.tv_nsec += (long)(period % 1000) * 1000000L;
        if (ts.tv_nsec >= 1000000000L) {
            ts.tv_sec++;
            ts.tv_nsec -= 1000000000L;
        }
        /* A queued prefix change wakes the thread early; a renewal is due
         * at the end of the period either way. */
        while (!c->stop && !c->kick) {
            if (pthread_cond_timedwait(&c->cv, &c->mu, &ts) != 0)
                break;
        }
        c->kick = false;
        if (c->stop)
            break;
        pthread_mutex_unlock(&c->mu);
        cm_cluster_member_tick(c);
        cm_cluster_observer_tick(c);
        pthread_mutex_lock(&c->mu);
    }
    pthread_mutex_unlock(&c->mu);
    return NULL;
}

ri_status_t cm_cluster_thread_start_locked(cm_cluster_t *c)
{
    if (c->thread_running)
        return RI_OK;
    if (pthread_create(&c->thread, NULL, cm_cluster_thread_main, c) != 0) {
        cm_etcd_set_error("cluster: cannot start the keepalive thread");
        return RI_ERR_NOMEM;
    }
    c->thread_running = true;
    return RI_OK;
}

/* ---- JSON ------------------------------------------------------------------ */

/* cJSON's text into our allocator (*out_p cm_free). */
static ri_status_t cm_cluster_print(cJSON *o, char **out_p)
{
    char *txt = cJSON_PrintUnformatted(o);
    if (txt == NULL)
        return RI_ERR_NOMEM;
    char *out = cm_strdup(&cm_cluster_tag, txt);
    cJSON_free(txt);
    if (out == NULL)
        return RI_ERR_NOMEM;
    *out_p = out;
    return RI_OK;
}

/* A JSON array of the comma-separated tenants. */
static bool cm_cluster_add_tenants(cJSON *o, const char *tenants)
{
    cJSON *arr = cJSON_AddArrayToObject(o, "tenants");
    if (arr == NULL)
        return false;
    const char *s = tenants;
    while (*s != '\0') {
        const char *comma = strchr(s, ',');
        size_t n = comma ? (size_t)(comma - s) : strlen(s);
        char name[CM_CLUSTER_ADDR_MAX];
        snprintf(name, sizeof(name), "%.*s", (int)n, s);
        if (n > 0 && !cJSON_AddItemToArray(arr, cJSON_CreateString(name)))
            return false;
        s += n;
        if (*s == ',')
            s++;
    }
    return true;
}

ri_status_t cm_cluster_node_to_json(const cm_cluster_node_t *n, char **json_p)
{
    if (n == NULL || json_p == NULL)
        return RI_ERR_INVALID;
    cJSON *o = cJSON_CreateObject();
    if (o == NULL)
        return RI_ERR_NOMEM;
    ri_status_t st = RI_ERR_NOMEM;
    if (!cJSON_AddStringToObject(o, "node", n->name) || !cJSON_AddStringToObject(o, "addr", n->addr) ||
        !cJSON_AddStringToObject(o, "dataplane", n->dataplane) || !cJSON_AddStringToObject(o, "host", n->host) ||
        !cJSON_AddNumberToObject(o, "pool_total", (double)n->pool_total) ||
        !cJSON_AddNumberToObject(o, "pool_used", (double)n->pool_used) ||
        !cJSON_AddNumberToObject(o, "sessions", (double)n->sessions) || !cm_cluster_add_tenants(o, n->tenants) ||
        !cJSON_AddNumberToObject(o, "epoch", (double)n->epoch) || !cJSON_AddBoolToObject(o, "recovered", n->recovered))
        goto out;
    st = cm_cluster_print(o, json_p);
out:
    cJSON_Delete(o);
    return st;
}

/* A string field into dst[cap]: absent is fine unless required; a wrong
 * type or a value too long is not. */
static bool cm_cluster_json_str(const cJSON *o, const char *name, bool required, char *dst, size_t cap)
{
    const cJSON *it = cJSON_GetObjectItemCaseSensitive(o, name);
    if (it == NULL)
        return !required;
    if (!cJSON_IsString(it) || it->valuestring == NULL || strlen(it->valuestring) >= cap)
        return false;
    snprintf(dst, cap, "%s", it->valuestring);
    return true;
}

/* A non-negative integer field (absent: 0). */
static bool cm_cluster_json_u64(const cJSON *o, const char *name, uint64_t *dst)
{
    const cJSON *it = cJSON_GetObjectItemCaseSensitive(o, name);
    if (it == NULL)
        return true;
    if (!cJSON_IsNumber(it) || it->valuedouble < 0 || it->valuedouble > 1.8e19)
        return false;
    *dst = (uint64_t)it->valuedouble;
    return true;
}

static bool cm_cluster_json_tenants(const cJSON *o, char *dst, size_t cap)
{
    const cJSON *arr = cJSON_GetObjectItemCaseSensitive(o, "tenants");
    if (arr == NULL)
        return true;
    if (!cJSON_IsArray(arr))
        return false;
    size_t len = 0;
    const cJSON *it;
    cJSON_ArrayForEach(it, arr)
    {
        if (!cJSON_IsString(it) || it->valuestring == NULL)
            return false;
        int k = snprintf(dst + len, cap - len, "%s%s", len ? "," : "", it->valuestring);
        if (k < 0 || (size_t)k >= cap - len)
            return false;
        len += (size_t)k;
    }
    return true;
}

ri_status_t cm_cluster_node_from_json(const char *json, size_t len, cm_cluster_node_t *n)
{
    if (json == NULL || n == NULL)
        return RI_ERR_INVALID;
    cJSON *o = cJSON_ParseWithLength(json, len);
    if (o == NULL || !cJSON_IsObject(o)) {
        cJSON_Delete(o);
        cm_etcd_set_error("cluster: a node record that is not a JSON object");
        return RI_ERR_FORMAT;
    }
    cm_cluster_node_t r;
    memset(&r, 0, sizeof(r));
    uint64_t sessions = 0;
    const cJSON *rec = cJSON_GetObjectItemCaseSensitive(o, "recovered");
    bool ok = cm_cluster_json_str(o, "node", true, r.name, sizeof(r.name)) &&
              cm_cluster_json_str(o, "addr", true, r.addr, sizeof(r.addr)) &&
              cm_cluster_json_str(o, "dataplane", false, r.dataplane, sizeof(r.dataplane)) &&
              cm_cluster_json_str(o, "host", false, r.host, sizeof(r.host)) &&
              cm_cluster_json_u64(o, "pool_total", &r.pool_total) &&
              cm_cluster_json_u64(o, "pool_used", &r.pool_used) && cm_cluster_json_u64(o, "sessions", &sessions) &&
              sessions <= UINT32_MAX && cm_cluster_json_tenants(o, r.tenants, sizeof(r.tenants)) &&
              cm_cluster_json_u64(o, "epoch", &r.epoch) && (rec == NULL || cJSON_IsBool(rec));
    r.sessions = (uint32_t)sessions;
    r.recovered = rec != NULL && cJSON_IsTrue(rec);
    cJSON_Delete(o);
    if (!ok) {
        cm_etcd_set_error("cluster: a node record with a missing or mistyped field");
        return RI_ERR_FORMAT;
    }
    *n = r;
    return RI_OK;
}

ri_status_t cm_cluster_session_to_json(const cm_cluster_session_t *s, char **json_p)
{
    cJSON *o = cJSON_CreateObject();
    if (o == NULL)
        return RI_ERR_NOMEM;
    ri_status_t st = RI_ERR_NOMEM;
    if (cJSON_AddStringToObject(o, "worker", s->worker) && cJSON_AddStringToObject(o, "label", s->label) &&
        cJSON_AddNumberToObject(o, "tokens", (double)s->tokens) &&
        cJSON_AddNumberToObject(o, "created_ms", (double)s->created_ms))
        st = cm_cluster_print(o, json_p);
    cJSON_Delete(o);
    return st;
}

/* A session record from its key ("<root>sessions/<node>/<16 hex>") and value. */
static bool cm_cluster_session_parse(const cm_cluster_t *c, const cm_etcd_kv_t *kv, cm_cluster_session_t *s)
{
    size_t rl = strlen(c->root) + strlen("sessions/");
    const char *rest = kv->key + rl;
    const char *slash = strchr(rest, '/');
    if (strlen(kv->key) <= rl || slash == NULL || slash - rest >= CM_CLUSTER_NAME_MAX || strlen(slash + 1) != 16)
        return false;
    memset(s, 0, sizeof(*s));
    snprintf(s->node, sizeof(s->node), "%.*s", (int)(slash - rest), rest);
    char *end = NULL;
    s->session_id = strtoull(slash + 1, &end, 16);
    if (end == NULL || *end != '\0')
        return false;
    cJSON *o = cJSON_ParseWithLength(kv->val, kv->len);
    bool ok = o != NULL && cJSON_IsObject(o) && cm_cluster_json_str(o, "worker", false, s->worker, sizeof(s->worker)) &&
              cm_cluster_json_str(o, "label", false, s->label, sizeof(s->label)) &&
              cm_cluster_json_u64(o, "tokens", &s->tokens) && cm_cluster_json_u64(o, "created_ms", &s->created_ms);
    cJSON_Delete(o);
    return ok;
}

/* ---- one-shot reads -------------------------------------------------------- */

static int cm_cluster_node_cmp(const void *a, const void *b)
{
    return strcmp(((const cm_cluster_node_t *)a)->name, ((const cm_cluster_node_t *)b)->name);
}

/* The node records of one list call (records that do not parse are left out). */
static ri_status_t cm_cluster_nodes_list(cm_cluster_t *c, cm_cluster_node_t **nodes_p, size_t *n_p)
{
    char prefix[CM_CLUSTER_KEY_MAX];
    snprintf(prefix, sizeof(prefix), "%snodes/", c->root);
    cm_etcd_list_t l;
    ri_status_t st = cm_etcd_list(c->etcd, prefix, 0, &l);
    if (st != RI_OK)
        return st;
    cm_cluster_node_t *nodes = cm_calloc(&cm_cluster_tag, l.n ? l.n : 1, sizeof(*nodes));
    if (nodes == NULL) {
        cm_etcd_list_free(&l);
        return RI_ERR_NOMEM;
    }
    size_t n = 0;
    for (size_t i = 0; i < l.n; i++) {
        if (cm_cluster_node_from_json(l.kvs[i].val, l.kvs[i].len, &nodes[n]) == RI_OK)
            n++;
    }
    cm_etcd_list_free(&l);
    qsort(nodes, n, sizeof(*nodes), cm_cluster_node_cmp);
    *nodes_p = nodes;
    *n_p = n;
    return RI_OK;
}

ri_status_t cm_cluster_nodes(cm_cluster_t *c, cm_cluster_node_t **nodes_p, size_t *n_p, bool *stale_p)
{
    if (c == NULL || nodes_p == NULL || n_p == NULL)
        return RI_ERR_INVALID;
    pthread_mutex_lock(&c->mu);
    if (c->watch == NULL) {
        pthread_mutex_unlock(&c->mu);
        ri_status_t st = cm_cluster_nodes_list(c, nodes_p, n_p);
        if (st == RI_OK && stale_p != NULL)
            *stale_p = false;
        return st;
    }
    cm_cluster_node_t *copy = cm_calloc(&cm_cluster_tag, c->n_nodes ? c->n_nodes : 1, sizeof(*copy));
    if (copy == NULL) {
        pthread_mutex_unlock(&c->mu);
        return RI_ERR_NOMEM;
    }
    if (c->n_nodes > 0)
        memcpy(copy, c->nodes, c->n_nodes * sizeof(*copy));
    *nodes_p = copy;
    *n_p = c->n_nodes;
    if (stale_p != NULL)
        *stale_p = c->stale;
    pthread_mutex_unlock(&c->mu);
    return RI_OK;
}

ri_status_t cm_cluster_sessions(cm_cluster_t *c, const char *node, cm_cluster_session_t **out_p, size_t *n_p)
{
    if (c == NULL || out_p == NULL || n_p == NULL || (node != NULL && node[0] != '\0' && !cm_cluster_name_valid(node)))
        return RI_ERR_INVALID;
    char prefix[CM_CLUSTER_KEY_MAX];
    if (node != NULL && node[0] != '\0')
        snprintf(prefix, sizeof(prefix), "%ssessions/%s/", c->root, node);
    else
        snprintf(prefix, sizeof(prefix), "%ssessions/", c->root);
    cm_etcd_list_t l;
    ri_status_t st = cm_etcd_list(c->etcd, prefix, 0, &l);
    if (st != RI_OK)
        return st;
    cm_cluster_session_t *out = cm_calloc(&cm_cluster_tag, l.n ? l.n : 1, sizeof(*out));
    if (out == NULL) {
        cm_etcd_list_free(&l);
        return RI_ERR_NOMEM;
    }
    size_t n = 0;
    for (size_t i = 0; i < l.n; i++) {
        if (cm_cluster_session_parse(c, &l.kvs[i], &out[n]))
            n++;
    }
    cm_etcd_list_free(&l);
    *out_p = out;
    *n_p = n;
    return RI_OK;
}

ri_status_t cm_cluster_prefix_holders(cm_cluster_t *c, const uint8_t key[32], char (*names)[CM_CLUSTER_NAME_MAX],
                                      size_t cap, size_t *n_p)
{
    if (c == NULL || key == NULL || n_p == NULL || (names == NULL && cap > 0))
        return RI_ERR_INVALID;
    char prefix[CM_CLUSTER_KEY_MAX];
    cm_cluster_prefix_key(c, key, NULL, prefix);
    strcat(prefix, "/");
    cm_etcd_list_t l;
    ri_status_t st = cm_etcd_list(c->etcd, prefix, 0, &l);
    if (st != RI_OK)
        return st;
    size_t pl = strlen(prefix), n = 0;
    for (size_t i = 0; i < l.n; i++) {
        const char *name = l.kvs[i].key + pl;
        if (!cm_cluster_name_valid(name))
            continue;
        if (n < cap)
            snprintf(names[n], CM_CLUSTER_NAME_MAX, "%s", name);
        n++;
    }
    cm_etcd_list_free(&l);
    *n_p = n;
    return RI_OK;
}

/* ---- placement ---------------------------------------------------------------- */

bool cm_cluster_policy_parse(const char *text, cm_cluster_policy_t *p)
{
    static const struct {
        const char *name;
        cm_cluster_policy_t p;
    } map[] = {
        { "local-first", CM_CLUSTER_LOCAL_FIRST },
        { "most-free", CM_CLUSTER_MOST_FREE },
        { "round-robin", CM_CLUSTER_ROUND_ROBIN },
    };
    for (size_t i = 0; text != NULL && i < CM_ARRAY_LEN(map); i++) {
        if (strcmp(text, map[i].name) == 0) {
            if (p != NULL)
                *p = map[i].p;
            return true;
        }
    }
    return false;
}

const char *cm_cluster_policy_name(cm_cluster_policy_t p)
{
    switch (p) {
    case CM_CLUSTER_LOCAL_FIRST:
        return "local-first";
    case CM_CLUSTER_MOST_FREE:
        return "most-free";
    case CM_CLUSTER_ROUND_ROBIN:
        return "round-robin";
    }
    return "unknown";
}

static uint64_t cm_cluster_free_bytes(const cm_cluster_node_t *n)
{
    return n->pool_total > n->pool_used ? n->pool_total - n->pool_used : 0;
}

/* Is a better than b for policy (a strict order: ties go by name)? */
static bool cm_cluster_better(const cm_cluster_node_t *a, const cm_cluster_node_t *b, const char *my_host,
                              cm_cluster_policy_t policy)
{
    if (policy == CM_CLUSTER_LOCAL_FIRST && my_host != NULL && my_host[0] != '\0') {
        bool la = strcmp(a->host, my_host) == 0, lb = strcmp(b->host, my_host) == 0;
        if (la != lb)
            return la;
    }
    if (policy != CM_CLUSTER_ROUND_ROBIN) {
        uint64_t fa = cm_cluster_free_bytes(a), fb = cm_cluster_free_bytes(b);
        if (fa != fb)
            return fa > fb;
    }
    return strcmp(a->name, b->name) < 0;
}

void cm_cluster_rank(const cm_cluster_node_t *nodes, size_t n, const bool *skip, const char *my_host,
                     cm_cluster_policy_t policy, uint32_t *rr, size_t *order, size_t *n_order_p)
{
    size_t m = 0;
    for (size_t i = 0; i < n; i++) {
        if (skip != NULL && skip[i])
            continue;
        /* insertion sort: tens of nodes */
        size_t j = m++;
        while (j > 0 && cm_cluster_better(&nodes[i], &nodes[order[j - 1]], my_host, policy)) {
            order[j] = order[j - 1];
            j--;
        }
        order[j] = i;
    }
    if (policy == CM_CLUSTER_ROUND_ROBIN && m > 1 && rr != NULL) {
        /* rotate the name order by the cursor, then advance it */
        size_t start = *rr % m;
        for (size_t k = 0; k < start; k++) {
            size_t first = order[0];
            memmove(order, order + 1, (m - 1) * sizeof(*order));
            order[m - 1] = first;
        }
        (*rr)++;
    } else if (policy == CM_CLUSTER_ROUND_ROBIN && rr != NULL && m == 1) {
        (*rr)++;
    }
    if (n_order_p != NULL)
        *n_order_p = m;
}
