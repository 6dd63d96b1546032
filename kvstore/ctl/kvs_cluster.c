/*
 * ri-kvstore as a cluster member (see kvs_cluster.h).  One thread of ours
 * refreshes the published figures each second (cm_cluster_update only hands
 * them to cm_cluster's member thread, which writes them at its next renewal,
 * so this costs etcd nothing between renewals); the prefix hook of
 * kvstore/data queues block records as blocks come and go.
 */
#define _GNU_SOURCE
#include "kvstore/ctl/kvs_cluster.h"

#include <errno.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdatomic.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "common/cm_alloc.h"
#include "common/cm_cluster.h"
#include "common/cm_etcd.h"
#include "common/cm_log.h"
#include "common/cm_net.h"
#include "common/cm_status.h"
#include "common/cm_time.h"
#include "kvstore/ctl/kvs_ctl.h"

static CM_ALLOC_TAG(kvs_cluster_tag, "kvs.cluster");

#define KVS_CLUSTER_REFRESH_MS      1000u /* figures handed to the member thread this often */
#define KVS_CLUSTER_RETRY_MS        250u  /* register retries while etcd does not answer at start */
#define KVS_CLUSTER_ETCD_TIMEOUT_MS 2000u

struct kvs_cluster {
    kvs_ctl_t *ctl;     /* borrowed */
    cm_cluster_t *dir;  /* owned */
    pthread_mutex_t mu; /* guards self, stop, poke */
    pthread_cond_t cv;
    cm_cluster_node_t self; /* what we publish */
    bool stop, poke;
    bool thread_started;
    pthread_t thread;
    _Atomic uint64_t prefix_records; /* blocks held, so records published */
};

/* A name of the directory made from text: characters outside
 * [A-Za-z0-9._:-] become '-', at most CM_CLUSTER_NAME_MAX - 1 of them. */
static void kvs_cluster_sanitize(const char *text, char out[CM_CLUSTER_NAME_MAX])
{
    size_t n = 0;
    for (; text[n] != '\0' && n < CM_CLUSTER_NAME_MAX - 1; n++) {
        char ch = text[n];
        bool ok = (ch >= 'A' && ch <= 'Z') || (ch >= 'a' && ch <= 'z') || (ch >= '0' && ch <= '9') || ch == '.' ||
                  ch == '_' || ch == ':' || ch == '-';
        out[n] = ok ? ch : '-';
    }
    out[n] = '\0';
}

/* The gRPC address others dial: cluster-advertise, else the bound listen
 * address, else (a wildcard listen) gethostname():port. */
static void kvs_cluster_advertise(const kvs_ctl_t *ctl, char *out, size_t len)
{
    char host[256], name[256];
    unsigned port;

    if (ctl->cfg.cluster_advertise[0] != '\0') {
        snprintf(out, len, "%s", ctl->cfg.cluster_advertise);
        return;
    }
    if (cm_net_split(ctl->cfg.listen, host, sizeof(host), &port) && cm_net_host_is_wildcard(host) &&
        cm_net_split(ctl->grpc_addr, host, sizeof(host), &port) && gethostname(name, sizeof(name)) == 0) {
        name[sizeof(name) - 1] = '\0';
        snprintf(out, len, "%.200s:%u", name, port);
        return;
    }
    snprintf(out, len, "%.*s", (int)(len - 1), ctl->grpc_addr);
}

/* The tenants of auth, comma-separated and each once ("" without tokens). */
static void kvs_cluster_tenants(const kvs_auth_t *auth, char out[CM_CLUSTER_ADDR_MAX])
{
    size_t used = 0;

    out[0] = '\0';
    for (size_t i = 0; i < kvs_auth_count(auth); i++) {
        const char *t = kvs_auth_entry(auth, i)->tenant;
        bool seen = false;
        for (size_t j = 0; j < i && !seen; j++)
            seen = strcmp(kvs_auth_entry(auth, j)->tenant, t) == 0;
        if (seen)
            continue;
        size_t tl = strlen(t), need = tl + (used > 0 ? 1 : 0);
        if (used + need >= CM_CLUSTER_ADDR_MAX) {
            cm_warn("cluster: the tenants list is longer than %u characters; the record names the first ones",
                    CM_CLUSTER_ADDR_MAX - 1);
            return;
        }
        if (used > 0)
            out[used++] = ',';
        memcpy(out + used, t, tl + 1);
        used += tl;
    }
}

/* Fill the figures of c->self from the data side.  mu held. */
static void kvs_cluster_figures_locked(kvs_cluster_t *c)
{
    kvs_data_stats_t s;

    memset(&s, 0, sizeof(s));
    kvs_data_stats(c->ctl->data, KVS_DEFAULT_TENANT, &s);
    c->self.pool_total = s.pool_bytes_total;
    c->self.pool_used = s.pool_bytes_used;
    c->self.sessions = s.sessions_all;
    c->self.draining = atomic_load(&c->ctl->draining);
}

static void *kvs_cluster_refresh(void *arg)
{
    kvs_cluster_t *c = arg;

    pthread_mutex_lock(&c->mu);
    while (!c->stop) {
        kvs_cluster_figures_locked(c);
        cm_cluster_update(c->dir, &c->self);
        struct timespec ts;
        clock_gettime(CLOCK_REALTIME, &ts);
        ts.tv_sec += KVS_CLUSTER_REFRESH_MS / 1000u;
        while (!c->stop && !c->poke)
            if (pthread_cond_timedwait(&c->cv, &c->mu, &ts) == ETIMEDOUT)
                break;
        c->poke = false;
    }
    pthread_mutex_unlock(&c->mu);
    return NULL;
}

/* kvstore/data's prefix hook: queue the record (never blocks on etcd). */
static void kvs_cluster_prefix_hook(void *arg, const uint8_t key[KVS_PFX_KEY], bool held)
{
    kvs_cluster_t *c = arg;

    if (held) {
        cm_cluster_prefix_add(c->dir, key);
        atomic_fetch_add(&c->prefix_records, 1);
    } else {
        cm_cluster_prefix_del(c->dir, key);
        atomic_fetch_sub(&c->prefix_records, 1);
    }
}

/* Register, retrying for up to one lease period while etcd does not answer. */
static ri_status_t kvs_cluster_register(kvs_cluster_t *c, char *err, size_t errlen)
{
    const kvs_ctl_config_t *cfg = &c->ctl->cfg;
    uint64_t t0 = cm_time_ns(), limit = (uint64_t)cfg->cluster_lease_ms * 1000000u;
    unsigned tries = 0;
    ri_status_t st;

    for (;;) {
        tries++;
        st = cm_cluster_register(c->dir, &c->self, (uint32_t)cfg->cluster_lease_ms);
        if ((st != RI_ERR_UNREACHABLE && st != RI_ERR_TIMEOUT) || cm_time_ns() - t0 >= limit)
            break;
        cm_time_sleep_ns((uint64_t)KVS_CLUSTER_RETRY_MS * 1000000u);
    }
    if (st == RI_OK)
        return RI_OK;
    if (st == RI_ERR_EXISTS)
        snprintf(err, errlen,
                 "cluster: another ri-kvstore is registered as %s in cluster %s (%s); stop it or give this one "
                 "another --node-name",
                 c->self.name, cfg->cluster_name, cfg->cluster);
    else if (st == RI_ERR_UNREACHABLE || st == RI_ERR_TIMEOUT)
        snprintf(err, errlen, "cluster: etcd at %s did not answer for %lld ms (%u tries): %s", cfg->cluster,
                 (long long)cfg->cluster_lease_ms, tries, cm_etcd_last_error());
    else
        snprintf(err, errlen, "cluster: cannot register as %s in cluster %s at %s: %s (%s)", c->self.name,
                 cfg->cluster_name, cfg->cluster, ri_status_str(st), cm_etcd_last_error());
    return st;
}

/* The record's fixed fields: name, address, host, epoch, recovered. */
static void kvs_cluster_identity(kvs_cluster_t *c)
{
    const kvs_ctl_config_t *cfg = &c->ctl->cfg;
    char host[256];

    kvs_cluster_advertise(c->ctl, c->self.addr, sizeof(c->self.addr));
    kvs_cluster_sanitize(cfg->node_name[0] != '\0' ? cfg->node_name : c->self.addr, c->self.name);
    if (cfg->cluster_host[0] != '\0') {
        snprintf(c->self.host, sizeof(c->self.host), "%s", cfg->cluster_host);
    } else if (gethostname(host, sizeof(host)) == 0) {
        host[sizeof(host) - 1] = '\0';
        kvs_cluster_sanitize(host, c->self.host);
    }
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    c->self.epoch = (uint64_t)ts.tv_sec * 1000u + (uint64_t)ts.tv_nsec / 1000000u;
    c->self.recovered = cfg->recover;
    kvs_cluster_tenants(c->ctl->auth, c->self.tenants);
}

ri_status_t kvs_cluster_start(kvs_ctl_t *ctl, kvs_cluster_t **c_p, char *err, size_t errlen)
{
    const kvs_ctl_config_t *cfg = &ctl->cfg;
    ri_status_t st;
    kvs_cluster_t *c = cm_calloc(&kvs_cluster_tag, 1, sizeof(*c));

    if (c == NULL) {
        snprintf(err, errlen, "cluster: out of memory");
        return RI_ERR_NOMEM;
    }
    c->ctl = ctl;
    pthread_mutex_init(&c->mu, NULL);
    pthread_cond_init(&c->cv, NULL);
    st = cm_cluster_open(cfg->cluster, cfg->cluster_name, KVS_CLUSTER_ETCD_TIMEOUT_MS, &c->dir);
    if (st != RI_OK) {
        snprintf(err, errlen, "cluster: %s: %s (%s)", cfg->cluster, ri_status_str(st), cm_etcd_last_error());
        goto err_free;
    }
    kvs_cluster_identity(c);
    kvs_cluster_figures_locked(c); /* nobody else sees c yet */
    st = kvs_cluster_register(c, err, errlen);
    if (st != RI_OK)
        goto err_close;
    /* Every block held now, then each change (one lock: none is missed). */
    kvs_data_set_prefix_hook(ctl->data, kvs_cluster_prefix_hook, c);
    if (pthread_create(&c->thread, NULL, kvs_cluster_refresh, c) != 0) {
        snprintf(err, errlen, "cluster: cannot start the figures thread");
        st = RI_ERR_NOMEM;
        goto err_unhook;
    }
    c->thread_started = true;
    cm_info("cluster: registered as %s (%s, host %s) in cluster %s at %s, lease %lld ms%s", c->self.name, c->self.addr,
            c->self.host, cfg->cluster_name, cfg->cluster, (long long)cfg->cluster_lease_ms,
            c->self.recovered ? ", recovered" : "");
    *c_p = c;
    return RI_OK;

err_unhook:
    kvs_data_set_prefix_hook(ctl->data, NULL, NULL);
err_close:
    cm_cluster_close(c->dir); /* revokes a lease it was granted */
err_free:
    pthread_cond_destroy(&c->cv);
    pthread_mutex_destroy(&c->mu);
    cm_free(c);
    return st;
}

void kvs_cluster_leave(kvs_cluster_t *c)
{
    cm_cluster_t *dir;

    if (c == NULL)
        return;
    if (c->thread_started) {
        pthread_mutex_lock(&c->mu);
        c->stop = true;
        pthread_cond_signal(&c->cv);
        pthread_mutex_unlock(&c->mu);
        pthread_join(c->thread, NULL);
        c->thread_started = false;
    }
    kvs_data_set_prefix_hook(c->ctl->data, NULL, NULL);
    pthread_mutex_lock(&c->mu);
    dir = c->dir;
    c->dir = NULL; /* the metrics page reads it under mu */
    pthread_mutex_unlock(&c->mu);
    if (dir == NULL)
        return;
    uint64_t t0 = cm_time_ns();
    cm_cluster_close(dir);
    cm_info("cluster: left cluster %s as %s (%.1f ms)", c->ctl->cfg.cluster_name, c->self.name,
            (double)(cm_time_ns() - t0) / 1e6);
}

void kvs_cluster_destroy(kvs_cluster_t *c)
{
    if (c == NULL)
        return;
    kvs_cluster_leave(c);
    pthread_cond_destroy(&c->cv);
    pthread_mutex_destroy(&c->mu);
    cm_free(c);
}

void kvs_cluster_set_tenants(kvs_cluster_t *c, const kvs_auth_t *auth)
{
    if (c == NULL)
        return;
    pthread_mutex_lock(&c->mu);
    kvs_cluster_tenants(auth, c->self.tenants);
    c->poke = true;
    pthread_cond_signal(&c->cv);
    pthread_mutex_unlock(&c->mu);
}

void kvs_cluster_poke(kvs_cluster_t *c)
{
    if (c == NULL)
        return;
    pthread_mutex_lock(&c->mu);
    c->poke = true;
    pthread_cond_signal(&c->cv);
    pthread_mutex_unlock(&c->mu);
}

const char *kvs_cluster_node_name(const kvs_cluster_t *c)
{
    return c->self.name;
}

void kvs_cluster_metrics_write(kvs_cluster_t *c, FILE *out)
{
    cm_cluster_member_stats_t ms;
    bool registered = false;

    if (c == NULL)
        return;
    memset(&ms, 0, sizeof(ms));
    pthread_mutex_lock(&c->mu);
    if (c->dir != NULL) {
        cm_cluster_member_stats(c->dir, &ms);
        registered = cm_cluster_registered(c->dir);
    }
    pthread_mutex_unlock(&c->mu);
    fprintf(out, "# HELP ri_kvs_cluster_registered 1 while the node is registered in the cluster with a live "
                 "lease (0 during an etcd outage).\n# TYPE ri_kvs_cluster_registered gauge\n");
    fprintf(out, "ri_kvs_cluster_registered %d\n", registered ? 1 : 0);
    fprintf(out, "# HELP ri_kvs_cluster_lease_renewals_total Lease renewals etcd acknowledged.\n"
                 "# TYPE ri_kvs_cluster_lease_renewals_total counter\n");
    fprintf(out, "ri_kvs_cluster_lease_renewals_total %" PRIu64 "\n", ms.renewals);
    fprintf(out, "# HELP ri_kvs_cluster_errors_total etcd calls of the member that failed (renewals, record "
                 "writes, re-registrations).\n# TYPE ri_kvs_cluster_errors_total counter\n");
    fprintf(out, "ri_kvs_cluster_errors_total %" PRIu64 "\n", ms.errors);
    fprintf(out, "# HELP ri_kvs_cluster_prefix_records Prefix blocks this node holds, so publishes in the "
                 "directory.\n# TYPE ri_kvs_cluster_prefix_records gauge\n");
    fprintf(out, "ri_kvs_cluster_prefix_records %" PRIu64 "\n", atomic_load(&c->prefix_records));
}
