/*
 * The remote backend's node pool in cluster mode (gw_attn_cluster.h).
 */
#include "gpuworker/client/gw_attn_cluster.h"

#include <pthread.h>
#include <stdio.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/syscall.h>
#include <unistd.h>
#include <time.h>

#include "common/cm_alloc.h"
#include "common/cm_dp_prefix.h"
#include "common/cm_etcd.h"
#include "common/cm_log.h"
#include "common/cm_status.h"
#include "common/cm_time.h"
#include "gpuworker/client/gw_dp.h"
#include "gpuworker/client/ri_api_int.h"

static CM_ALLOC_TAG(gw_cl_tag, "gw.attn.cluster");

/* What the pool knows of one node (kept for every node seen: a session's
 * client must outlive it, and the counters are per node). */
typedef struct gw_cl_node {
    char name[CM_CLUSTER_NAME_MAX];
    char addr[CM_CLUSTER_ADDR_MAX]; /* the client's address */
    uint64_t epoch;                 /* the node's epoch when the client connected */
    ri_client_h client;             /* NULL until first used */
    bool down;                      /* found unreachable (or lost a session) ... */
    uint64_t down_epoch;            /* ... at this epoch ... */
    uint64_t down_ns;               /* ... at this time (cm_time_ns) */
    uint64_t placements, refusals;
} gw_cl_node_t;

struct gw_cl {
    pthread_mutex_t mu;
    cm_cluster_t *dir;
    cm_cluster_policy_t policy;
    char host[CM_CLUSTER_NAME_MAX];
    char worker[CM_CLUSTER_NAME_MAX];
    char *token, *tls_ca, *tls_cert, *tls_key; /* owned copies, or NULL */
    uint32_t timeout_ms;
    gw_cl_node_t *nodes; /* every node seen (under mu) */
    size_t n_nodes, cap_nodes;
    ri_client_h *retired; /* clients of a previous epoch: sessions may still use them */
    size_t n_retired, cap_retired;
    uint32_t rr; /* round-robin cursor */
    uint64_t failovers;
    uint64_t prefix_copies, prefix_copy_bytes; /* blocks copied node to node */
    /* prefix replicas: a queue of copies and the thread that runs them */
    uint32_t replicas;
    pthread_t rep_thread;
    pthread_cond_t rep_cv;
    bool rep_running, rep_stop;
    struct gw_cl_job *jobs, **jobs_tail;
    size_t n_jobs;
    uint64_t replica_blocks, replica_bytes, replica_dropped;
};

/* One replication: blocks keys[0..n_keys) published on node from. */
typedef struct gw_cl_job {
    struct gw_cl_job *next;
    gw_pfx_layout_t lay;
    char from[CM_CLUSTER_NAME_MAX];
    uint32_t n_keys;
    uint8_t keys[]; /* n_keys x CM_PFX_KEY_SIZE */
} gw_cl_job_t;

#define GW_CL_MAX_JOBS 64

static char *gw_cl_dup(const char *s)
{
    return s != NULL && s[0] != '\0' ? cm_strdup(&gw_cl_tag, s) : NULL;
}

/* The entry of node name, added when new; NULL without memory.  Under mu. */
static gw_cl_node_t *gw_cl_entry(gw_cl_t *cl, const char *name)
{
    for (size_t i = 0; i < cl->n_nodes; i++)
        if (strcmp(cl->nodes[i].name, name) == 0)
            return &cl->nodes[i];
    if (cl->n_nodes == cl->cap_nodes) {
        size_t cap = cl->cap_nodes ? cl->cap_nodes * 2 : 8;
        gw_cl_node_t *nn = cm_realloc(&gw_cl_tag, cl->nodes, cap * sizeof(*nn));
        if (nn == NULL)
            return NULL;
        cl->nodes = nn;
        cl->cap_nodes = cap;
    }
    gw_cl_node_t *e = &cl->nodes[cl->n_nodes++];
    memset(e, 0, sizeof(*e));
    snprintf(e->name, sizeof(e->name), "%s", name);
    return e;
}

/* Keep a client of a previous epoch until the pool closes.  Under mu. */
static void gw_cl_retire(gw_cl_t *cl, ri_client_h c)
{
    if (cl->n_retired == cl->cap_retired) {
        size_t cap = cl->cap_retired ? cl->cap_retired * 2 : 8;
        ri_client_h *nr = cm_realloc(&gw_cl_tag, cl->retired, cap * sizeof(*nr));
        if (nr == NULL)
            return; /* leaked rather than closed under a live session */
        cl->retired = nr;
        cl->cap_retired = cap;
    }
    cl->retired[cl->n_retired++] = c;
}

ri_status_t gw_cl_open(const gw_cl_cfg_t *cfg, gw_cl_t **cl_p, char *err, size_t errlen)
{
    gw_cl_t *cl;
    ri_status_t st;

    if (cfg == NULL || cfg->url == NULL || cfg->worker == NULL || cl_p == NULL) {
        snprintf(err, errlen, "no cluster URL");
        return RI_ERR_INVALID;
    }
    cl = cm_calloc(&gw_cl_tag, 1, sizeof(*cl));
    if (cl == NULL)
        return RI_ERR_NOMEM;
    pthread_mutex_init(&cl->mu, NULL);
    pthread_cond_init(&cl->rep_cv, NULL);
    cl->jobs_tail = &cl->jobs;
    cl->replicas = cfg->prefix_replicas;
    cl->policy = cfg->policy;
    snprintf(cl->host, sizeof(cl->host), "%s", cfg->host != NULL ? cfg->host : "");
    snprintf(cl->worker, sizeof(cl->worker), "%s", cfg->worker);
    cl->token = gw_cl_dup(cfg->token);
    cl->tls_ca = gw_cl_dup(cfg->tls_ca);
    cl->tls_cert = gw_cl_dup(cfg->tls_cert);
    cl->tls_key = gw_cl_dup(cfg->tls_key);
    cl->timeout_ms = cfg->timeout_ms;
    const char *name = cfg->cluster != NULL && cfg->cluster[0] != '\0' ? cfg->cluster : "default";
    st = cm_cluster_open(cfg->url, name, 0, &cl->dir);
    if (st != RI_OK) {
        snprintf(err, errlen, "cluster %s at %s: %s", name, cfg->url, cm_etcd_last_error());
        goto err_close;
    }
    st = cm_cluster_watch_nodes(cl->dir);
    if (st != RI_OK) {
        snprintf(err, errlen, "cluster %s: cannot read the directory at %s (%s): %s", name, cfg->url, ri_status_str(st),
                 cm_etcd_last_error());
        goto err_close;
    }
    st = cm_cluster_join_observer(cl->dir, cl->worker, cfg->lease_ms);
    if (st != RI_OK) {
        snprintf(err, errlen, "cluster %s: cannot join as worker %s (%s): %s", name, cl->worker, ri_status_str(st),
                 cm_etcd_last_error());
        goto err_close;
    }
    *cl_p = cl;
    return RI_OK;
err_close:
    gw_cl_close(cl);
    return st;
}

void gw_cl_close(gw_cl_t *cl)
{
    if (cl == NULL)
        return;
    pthread_mutex_lock(&cl->mu);
    bool joining = cl->rep_running;
    cl->rep_stop = true;
    pthread_cond_broadcast(&cl->rep_cv);
    pthread_mutex_unlock(&cl->mu);
    if (joining)
        pthread_join(cl->rep_thread, NULL); /* it finishes the copy under way */
    while (cl->jobs != NULL) {
        gw_cl_job_t *j = cl->jobs;
        cl->jobs = j->next;
        cm_free(j);
    }
    cm_cluster_close(cl->dir); /* revokes the worker's lease: its records go */
    for (size_t i = 0; i < cl->n_nodes; i++)
        ri_client_close(cl->nodes[i].client);
    for (size_t i = 0; i < cl->n_retired; i++)
        ri_client_close(cl->retired[i]);
    cm_free(cl->nodes);
    cm_free(cl->retired);
    cm_free(cl->token);
    cm_free(cl->tls_ca);
    cm_free(cl->tls_cert);
    cm_free(cl->tls_key);
    pthread_cond_destroy(&cl->rep_cv);
    pthread_mutex_destroy(&cl->mu);
    cm_free(cl);
}

/* The client of node nd, connected now when there is none for its epoch
 * and address.  Errors: ri_client_connect's (RI_ERR_UNREACHABLE ...). */
static ri_status_t gw_cl_client(gw_cl_t *cl, const cm_cluster_node_t *nd, ri_client_h *c_p)
{
    ri_client_params_t cp;
    ri_client_h c = NULL, spare = NULL;
    ri_status_t st;

    pthread_mutex_lock(&cl->mu);
    gw_cl_node_t *e = gw_cl_entry(cl, nd->name);
    if (e == NULL) {
        pthread_mutex_unlock(&cl->mu);
        return RI_ERR_NOMEM;
    }
    if (e->client != NULL && (e->epoch != nd->epoch || strcmp(e->addr, nd->addr) != 0)) {
        gw_cl_retire(cl, e->client); /* restarted or moved: a new channel for new sessions */
        e->client = NULL;
    }
    c = e->client;
    pthread_mutex_unlock(&cl->mu);
    if (c != NULL) {
        *c_p = c;
        return RI_OK;
    }
    ri_client_params_init(&cp);
    cp.address = nd->addr;
    cp.token = cl->token;
    cp.timeout_ms = cl->timeout_ms;
    cp.tls_ca_file = cl->tls_ca;
    cp.tls_cert_file = cl->tls_cert;
    cp.tls_key_file = cl->tls_key;
    st = ri_client_connect(&cp, &c); /* outside mu: a dead node may take the deadline */
    if (st != RI_OK)
        return st;
    pthread_mutex_lock(&cl->mu);
    e = gw_cl_entry(cl, nd->name);
    if (e != NULL && e->client == NULL) {
        e->client = c;
        e->epoch = nd->epoch;
        snprintf(e->addr, sizeof(e->addr), "%s", nd->addr);
    } else if (e != NULL) {
        spare = c; /* another thread connected meanwhile */
        c = e->client;
    }
    pthread_mutex_unlock(&cl->mu);
    ri_client_close(spare);
    if (e == NULL) {
        ri_client_close(c);
        return RI_ERR_NOMEM;
    }
    *c_p = c;
    return RI_OK;
}

static void gw_cl_mark_down(gw_cl_t *cl, const char *name, uint64_t epoch)
{
    pthread_mutex_lock(&cl->mu);
    gw_cl_node_t *e = gw_cl_entry(cl, name);
    if (e != NULL) {
        e->down = true;
        e->down_epoch = epoch;
        e->down_ns = cm_time_ns();
    }
    pthread_mutex_unlock(&cl->mu);
}

/* The node answered: it is back. */
static void gw_cl_mark_up(gw_cl_t *cl, const char *name, bool placed, bool refused)
{
    pthread_mutex_lock(&cl->mu);
    gw_cl_node_t *e = gw_cl_entry(cl, name);
    if (e != NULL) {
        e->down = false;
        e->placements += placed;
        e->refusals += refused;
    }
    pthread_mutex_unlock(&cl->mu);
}

/* The live nodes ranked best first (order[0..*n_order_p), indexes into
 * *nodes_p, allocated: cm_free both), prefer moved to the front.  Nodes
 * left out are ranked only when every live node is left out (they may be
 * back).  RI_ERR_UNREACHABLE when the directory lists no node. */
static ri_status_t gw_cl_ranked(gw_cl_t *cl, const char *prefer, cm_cluster_node_t **nodes_p, size_t **order_p,
                                size_t *n_order_p)
{
    cm_cluster_node_t *nodes = NULL;
    size_t n = 0, n_order = 0, *order = NULL;
    bool *skip = NULL, any_left = false;
    ri_status_t st = cm_cluster_nodes(cl->dir, &nodes, &n, NULL);

    if (st != RI_OK)
        return st;
    if (n == 0) {
        cm_free(nodes);
        return RI_ERR_UNREACHABLE;
    }
    order = cm_calloc(&gw_cl_tag, n, sizeof(*order));
    skip = cm_calloc(&gw_cl_tag, n, sizeof(*skip));
    if (order == NULL || skip == NULL) {
        st = RI_ERR_NOMEM;
        goto out;
    }
    uint64_t now = cm_time_ns();
    pthread_mutex_lock(&cl->mu);
    for (size_t i = 0; i < n; i++) {
        gw_cl_node_t *e = gw_cl_entry(cl, nodes[i].name);
        if (e == NULL || !e->down)
            continue;
        if (e->down_epoch != nodes[i].epoch || now - e->down_ns >= GW_CL_RETRY_MS * 1000000ull)
            e->down = false; /* restarted, or time to try it again */
        else
            skip[i] = any_left = true;
    }
    /* One placement moves the round-robin cursor once: a session whose node
     * a prefix run chose already (prefer) ranks on a copy of it. */
    uint32_t rr_copy = cl->rr;
    uint32_t *rr = prefer != NULL && prefer[0] != '\0' ? &rr_copy : &cl->rr;
    cm_cluster_rank(nodes, n, skip, cl->host, cl->policy, rr, order, &n_order);
    if (n_order == 0 && any_left)
        cm_cluster_rank(nodes, n, NULL, cl->host, cl->policy, rr, order, &n_order);
    pthread_mutex_unlock(&cl->mu);
    for (size_t k = 0; prefer != NULL && prefer[0] != '\0' && k < n_order; k++)
        if (strcmp(nodes[order[k]].name, prefer) == 0) {
            size_t first = order[k];
            memmove(order + 1, order, k * sizeof(*order));
            order[0] = first;
            break;
        }
    *nodes_p = nodes;
    *order_p = order;
    *n_order_p = n_order;
    nodes = NULL;
    order = NULL;
out:
    cm_free(skip);
    cm_free(order);
    cm_free(nodes);
    return st;
}

static bool gw_cl_refusal(ri_status_t st)
{
    return st == RI_ERR_QUOTA || st == RI_ERR_NOSPACE || st == RI_ERR_SHUTDOWN;
}

static bool gw_cl_unreachable(ri_status_t st)
{
    return st == RI_ERR_UNREACHABLE || st == RI_ERR_CONN_RESET || st == RI_ERR_TIMEOUT || st == RI_ERR_TRANSPORT;
}

static uint64_t gw_cl_unix_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (uint64_t)ts.tv_sec * 1000u + (uint64_t)ts.tv_nsec / 1000000u;
}

/* Record the owner of a new session (a failure is logged: the record is
 * for operators, the session works without it). */
static void gw_cl_record(gw_cl_t *cl, const char *node, uint64_t id, const ri_session_params_t *sp)
{
    cm_cluster_session_t rec;
    memset(&rec, 0, sizeof(rec));
    snprintf(rec.node, sizeof(rec.node), "%s", node);
    rec.session_id = id;
    snprintf(rec.worker, sizeof(rec.worker), "%s", cl->worker);
    snprintf(rec.label, sizeof(rec.label), "%s", sp->label != NULL ? sp->label : "");
    rec.tokens = sp->expected_tokens;
    rec.created_ms = gw_cl_unix_ms();
    /* Written by the directory's own thread: a sequence never waits on
     * etcd (an etcd host that drops packets would cost each start its
     * timeout); the thread retries until etcd takes it. */
    cm_cluster_session_put_async(cl->dir, &rec);
}

ri_status_t gw_cl_session_create(gw_cl_t *cl, const ri_session_params_t *sp, const kn_wave_params_t *wave,
                                 const char *prefer, ri_session_h *sess_p, char *node, uint64_t *id_p, char *err,
                                 size_t errlen)
{
    cm_cluster_node_t *nodes = NULL;
    size_t *order = NULL, n_order = 0, used = 0;
    ri_status_t st, last = RI_ERR_UNREACHABLE;

    err[0] = '\0';
    st = gw_cl_ranked(cl, prefer, &nodes, &order, &n_order);
    if (st != RI_OK) {
        snprintf(err, errlen, "no live kvstore node in the cluster directory");
        return st == RI_ERR_NOMEM ? st : RI_ERR_UNREACHABLE;
    }
    st = RI_ERR_UNREACHABLE;
    for (size_t k = 0; k < n_order; k++) {
        const cm_cluster_node_t *nd = &nodes[order[k]];
        ri_session_h s = NULL;
        ri_client_h c = NULL;
        st = gw_cl_client(cl, nd, &c);
        if (st == RI_OK)
            st = gw_api_session_create(c, sp, wave, &s);
        if (st == RI_OK) {
            gw_cl_mark_up(cl, nd->name, true, false);
            uint64_t id = gw_api_session_id(s);
            gw_cl_record(cl, nd->name, id, sp);
            snprintf(node, CM_CLUSTER_NAME_MAX, "%s", nd->name);
            *sess_p = s;
            *id_p = id;
            goto out;
        }
        const char *what = gw_cl_refusal(st) ? "refused" : gw_cl_unreachable(st) ? "unreachable" : "failed";
        if (used < errlen)
            used += (size_t)snprintf(err + used, errlen - used, "%s%s %s (%s)", used ? "; " : "", nd->name, what,
                                     ri_last_error());
        if (gw_cl_refusal(st)) {
            gw_cl_mark_up(cl, nd->name, false, true);
            last = st;
        } else if (gw_cl_unreachable(st)) {
            gw_cl_mark_down(cl, nd->name, nd->epoch);
        } else {
            break; /* a bad request is bad on every node */
        }
        cm_info("cluster: node %s %s the session; trying the next", nd->name, what);
        st = RI_ERR_UNREACHABLE;
    }
    if (st == RI_ERR_UNREACHABLE)
        st = last; /* a refusal says more than an unreachable node */
out:
    cm_free(order);
    cm_free(nodes);
    return st;
}

void gw_cl_session_gone(gw_cl_t *cl, const char *node, uint64_t id)
{
    if (cl != NULL)
        cm_cluster_session_del_async(cl->dir, node, id); /* as the put: never waits on etcd */
}

void gw_cl_node_lost(gw_cl_t *cl, const char *node)
{
    pthread_mutex_lock(&cl->mu);
    gw_cl_node_t *e = gw_cl_entry(cl, node);
    if (e != NULL) {
        e->down = true;
        e->down_epoch = e->epoch; /* the epoch that died: a restart has another */
        e->down_ns = cm_time_ns();
    }
    cl->failovers++;
    pthread_mutex_unlock(&cl->mu);
    cm_warn("cluster: node %s lost a session: left out of placement until it comes back", node);
}

void gw_cl_stats(gw_cl_t *cl, gw_cl_stats_t *st_p)
{
    gw_cl_stats_t st;
    cm_cluster_node_t *nodes = NULL;
    size_t n = 0;
    bool stale = false;

    memset(&st, 0, sizeof(st));
    if (cm_cluster_nodes(cl->dir, &nodes, &n, &stale) == RI_OK) {
        st.live_nodes = n;
        st.stale = stale;
    } else {
        st.stale = true;
    }
    cm_free(nodes);
    pthread_mutex_lock(&cl->mu);
    st.failovers = cl->failovers;
    st.prefix_copies = cl->prefix_copies;
    st.prefix_copy_bytes = cl->prefix_copy_bytes;
    st.replica_blocks = cl->replica_blocks;
    st.replica_bytes = cl->replica_bytes;
    st.replica_dropped = cl->replica_dropped;
    if (cl->n_nodes > 0)
        st.nodes = cm_calloc(&gw_cl_tag, cl->n_nodes, sizeof(*st.nodes));
    for (size_t i = 0; st.nodes != NULL && i < cl->n_nodes; i++) {
        snprintf(st.nodes[i].name, sizeof(st.nodes[i].name), "%s", cl->nodes[i].name);
        st.nodes[i].placements = cl->nodes[i].placements;
        st.nodes[i].refusals = cl->nodes[i].refusals;
        st.n_nodes++;
    }
    pthread_mutex_unlock(&cl->mu);
    *st_p = st;
}

/* ---- prefix-aware placement ------------------------------------------ */

/* run[i] = how many of the prompt's leading blocks nodes[order[i]] holds
 * (from the directory's prefix records: one list per block, until no node
 * holds the next one).  Zeros when etcd does not answer. */
static void gw_cl_prefix_runs(gw_cl_t *cl, const cm_cluster_node_t *nodes, const size_t *order, size_t n_order,
                              const uint8_t *keys, uint32_t n_keys, uint32_t *run)
{
    char(*names)[CM_CLUSTER_NAME_MAX] = cm_calloc(&gw_cl_tag, n_order, sizeof(*names));
    memset(run, 0, n_order * sizeof(*run));
    if (names == NULL)
        return;
    for (uint32_t b = 0; b < n_keys; b++) {
        size_t n_h = 0;
        bool advanced = false;
        if (cm_cluster_prefix_holders(cl->dir, keys + (size_t)b * CM_PFX_KEY_SIZE, names, n_order, &n_h) != RI_OK)
            break;
        for (size_t i = 0; i < n_order; i++)
            for (size_t h = 0; h < CM_MIN(n_h, n_order) && run[i] == b; h++)
                if (strcmp(names[h], nodes[order[i]].name) == 0) {
                    run[i] = b + 1;
                    advanced = true;
                }
        if (!advanced)
            break;
    }
    cm_free(names);
}

/* Copy blocks [b0, b1) of keys from node `from` to node `to` through this
 * worker: attach them on a prefix-only session of the holder, read each
 * (PREFIX_GET) and PUT it on a prefix-only session of the target (the
 * target keeps it as an unreferenced block once that session ends, for
 * the request's own lookup to attach).  Returns the blocks copied; *bytes_p
 * their bytes.  Stops at the first failure (the rest is prefilled). */
static uint32_t gw_cl_copy_blocks(ri_client_h from, ri_client_h to, const gw_pfx_layout_t *lay, const uint8_t *keys,
                                  uint32_t b0, uint32_t b1, uint64_t *bytes_p)
{
    uint32_t t_from = 0, t_to = 0, n_att = 0, copied = 0;
    gw_ctl_t *c_from = gw_api_client_ctl(from, &t_from), *c_to = gw_api_client_ctl(to, &t_to);
    gw_pfx_conn_t *src = NULL, *dst = NULL;
    cm_pfx_attached_t *att = cm_calloc(&gw_cl_tag, b1, sizeof(*att));
    ri_status_t st = att != NULL ? RI_OK : RI_ERR_NOMEM;

    *bytes_p = 0;
    if (st == RI_OK)
        st = gw_pfx_conn_open(c_from, t_from, lay, &src);
    if (st == RI_OK)
        st = gw_pfx_conn_open(c_to, t_to, lay, &dst);
    if (st == RI_OK)
        st = gw_dp_prefix_attach_flags(src->dp, keys, b1, CM_PFX_ATTACH_F_SLOTS, att, &n_att); /* copied by slot */
    for (uint32_t i = b0; st == RI_OK && i < n_att; i++) {
        uint64_t len = att[i].block_bytes;
        if (len == 0 || len > CM_PFX_MAX_BLOCK_BYTES) {
            st = RI_ERR_PROTOCOL;
            break;
        }
        uint8_t *buf = cm_malloc_aligned(&gw_cl_tag, (size_t)len, 64);
        st = buf != NULL ? gw_dp_prefix_get(src->dp, att[i].slot, 0, buf, len) : RI_ERR_NOMEM;
        if (st == RI_OK)
            st = gw_dp_prefix_put(dst->dp, keys + (size_t)i * CM_PFX_KEY_SIZE, buf, len, NULL, NULL);
        cm_free(buf);
        if (st == RI_OK) {
            copied++;
            *bytes_p += len;
        }
    }
    if (st != RI_OK)
        cm_warn("cluster: prefix block copy stopped after %u of %u blocks: %s", copied, b1 - b0, ri_status_str(st));
    gw_pfx_conn_close(dst);
    gw_pfx_conn_close(src);
    cm_free(att);
    return copied;
}

struct gw_ctl *gw_cl_pick_prefix(gw_cl_t *cl, const gw_pfx_layout_t *lay, const uint8_t *keys, uint32_t n_keys,
                                 char *node, uint32_t *timeout_ms_p)
{
    cm_cluster_node_t *nodes = NULL;
    size_t *order = NULL, n_order = 0;
    uint32_t *run = NULL;
    struct gw_ctl *ctl = NULL;
    ri_client_h chosen = NULL;
    size_t ci = 0;

    if (gw_cl_ranked(cl, NULL, &nodes, &order, &n_order) != RI_OK)
        return NULL;
    run = cm_calloc(&gw_cl_tag, n_order ? n_order : 1, sizeof(*run));
    if (run == NULL)
        goto out;
    if (keys != NULL && n_keys > 0)
        gw_cl_prefix_runs(cl, nodes, order, n_order, keys, n_keys, run);
    /* The tie-break: a local node stays first under local-first (direct
     * reads beat a copy); otherwise the node holding the longest leading
     * run of the prompt's blocks goes first (rank order among equals). */
    bool local = cl->policy == CM_CLUSTER_LOCAL_FIRST && n_order > 0 && strcmp(nodes[order[0]].host, cl->host) == 0;
    size_t best = 0;
    for (size_t i = 1; i < n_order && !local; i++)
        if (run[i] > run[best])
            best = i;
    if (best != 0) {
        size_t o = order[best];
        uint32_t r = run[best];
        memmove(order + 1, order, best * sizeof(*order));
        memmove(run + 1, run, best * sizeof(*run));
        order[0] = o;
        run[0] = r;
    }
    for (ci = 0; ci < n_order && chosen == NULL; ci++) {
        const cm_cluster_node_t *nd = &nodes[order[ci]];
        ri_status_t st = gw_cl_client(cl, nd, &chosen);
        if (st != RI_OK && gw_cl_unreachable(st))
            gw_cl_mark_down(cl, nd->name, nd->epoch);
        if (st != RI_OK)
            chosen = NULL;
    }
    if (chosen == NULL)
        goto out;
    ci--;
    snprintf(node, CM_CLUSTER_NAME_MAX, "%s", nodes[order[ci]].name);
    ctl = gw_api_client_ctl(chosen, timeout_ms_p);
    /* Blocks another node holds beyond what the chosen one has: copied
     * node to node (cheaper than prefilling them). */
    size_t holder = ci;
    for (size_t i = 0; i < n_order; i++)
        if (run[i] > run[holder])
            holder = i;
    if (holder != ci) {
        ri_client_h from = NULL;
        uint64_t bytes = 0;
        if (gw_cl_client(cl, &nodes[order[holder]], &from) == RI_OK) {
            uint32_t n = gw_cl_copy_blocks(from, chosen, lay, keys, run[ci], run[holder], &bytes);
            pthread_mutex_lock(&cl->mu);
            cl->prefix_copies += n;
            cl->prefix_copy_bytes += bytes;
            pthread_mutex_unlock(&cl->mu);
            cm_info("cluster: %u prefix blocks (%llu bytes) copied from %s to %s", n, (unsigned long long)bytes,
                    nodes[order[holder]].name, node);
        }
    }
out:
    cm_free(run);
    cm_free(order);
    cm_free(nodes);
    return ctl;
}

/* ---- prefix replicas --------------------------------------------------- */

/* Copy one job's blocks to other nodes until cl->replicas nodes hold them
 * (the source included): the nodes ranked as for a new session, each
 * lacking one given what it lacks of the source's leading run. */
static void gw_cl_replicate_one(gw_cl_t *cl, const gw_cl_job_t *job)
{
    cm_cluster_node_t *nodes = NULL;
    size_t *order = NULL, n_order = 0, src = SIZE_MAX;
    uint32_t *run = NULL;

    /* ranked with the source as "prefer": the round-robin cursor stays */
    if (gw_cl_ranked(cl, job->from, &nodes, &order, &n_order) != RI_OK || n_order < 2)
        goto out;
    if ((run = cm_calloc(&gw_cl_tag, n_order, sizeof(*run))) == NULL)
        goto out;
    gw_cl_prefix_runs(cl, nodes, order, n_order, job->keys, job->n_keys, run);
    for (size_t i = 0; i < n_order; i++)
        if (strcmp(nodes[order[i]].name, job->from) == 0)
            src = i;
    if (src == SIZE_MAX || run[src] == 0)
        goto out; /* the source is gone, or its records are not visible yet */
    uint32_t have = 1;
    for (size_t i = 0; i < n_order; i++)
        if (i != src && run[i] >= run[src])
            have++;
    ri_client_h from = NULL;
    if (have < cl->replicas && gw_cl_client(cl, &nodes[order[src]], &from) != RI_OK)
        goto out;
    for (size_t i = 0; i < n_order && have < cl->replicas; i++) {
        ri_client_h to = NULL;
        uint64_t bytes = 0;
        if (i == src || run[i] >= run[src] || gw_cl_client(cl, &nodes[order[i]], &to) != RI_OK)
            continue;
        uint32_t n = gw_cl_copy_blocks(from, to, &job->lay, job->keys, run[i], run[src], &bytes);
        pthread_mutex_lock(&cl->mu);
        cl->replica_blocks += n;
        cl->replica_bytes += bytes;
        pthread_mutex_unlock(&cl->mu);
        if (run[i] + n == run[src]) {
            have++;
            cm_debug("cluster: %u prefix blocks (%llu bytes) replicated from %s to %s", n, (unsigned long long)bytes,
                     job->from, nodes[order[i]].name);
        }
    }
out:
    cm_free(run);
    cm_free(order);
    cm_free(nodes);
}

static void *gw_cl_rep_main(void *arg)
{
    gw_cl_t *cl = arg;
    /* Copies are insurance: they yield the CPU to decoding (this thread
     * only; Linux applies nice per thread) */
    (void)setpriority(PRIO_PROCESS, (id_t)syscall(SYS_gettid), 10);
    pthread_mutex_lock(&cl->mu);
    for (;;) {
        while (!cl->rep_stop && cl->jobs == NULL)
            pthread_cond_wait(&cl->rep_cv, &cl->mu);
        if (cl->rep_stop)
            break;
        gw_cl_job_t *j = cl->jobs;
        cl->jobs = j->next;
        if (cl->jobs == NULL)
            cl->jobs_tail = &cl->jobs;
        cl->n_jobs--;
        pthread_mutex_unlock(&cl->mu);
        gw_cl_replicate_one(cl, j);
        cm_free(j);
        pthread_mutex_lock(&cl->mu);
    }
    pthread_mutex_unlock(&cl->mu);
    return NULL;
}

void gw_cl_replicate(gw_cl_t *cl, const gw_pfx_layout_t *lay, const uint8_t *keys, uint32_t n_keys,
                     const char *from)
{
    if (cl == NULL || cl->replicas <= 1 || lay == NULL || keys == NULL || n_keys == 0 || from == NULL ||
        from[0] == '\0')
        return;
    gw_cl_job_t *j = cm_malloc(&gw_cl_tag, sizeof(*j) + (size_t)n_keys * CM_PFX_KEY_SIZE);
    if (j == NULL)
        return;
    j->next = NULL;
    j->lay = *lay;
    snprintf(j->from, sizeof(j->from), "%s", from);
    j->n_keys = n_keys;
    memcpy(j->keys, keys, (size_t)n_keys * CM_PFX_KEY_SIZE);
    pthread_mutex_lock(&cl->mu);
    if (cl->rep_stop || cl->n_jobs >= GW_CL_MAX_JOBS) {
        cl->replica_dropped++;
        pthread_mutex_unlock(&cl->mu);
        cm_free(j);
        return;
    }
    if (!cl->rep_running) {
        if (pthread_create(&cl->rep_thread, NULL, gw_cl_rep_main, cl) != 0) {
            cl->replica_dropped++;
            pthread_mutex_unlock(&cl->mu);
            cm_free(j);
            return;
        }
        cl->rep_running = true;
    }
    *cl->jobs_tail = j;
    cl->jobs_tail = &j->next;
    cl->n_jobs++;
    pthread_cond_signal(&cl->rep_cv);
    pthread_mutex_unlock(&cl->mu);
}
