/*
 * ri-kvstore control side: settings table, start/stop of the daemon object and
 * the /metrics page.  The API handlers live in kvs_api.c.
 */
#define _GNU_SOURCE
#include "kvstore/ctl/kvs_ctl.h"

#include <arpa/inet.h>
#include <errno.h>
#include <sys/resource.h>
#include <stddef.h>
#include <string.h>
#include <strings.h>

#include "common/cm_alloc.h"
#include "common/cm_cluster.h"
#include "common/cm_etcd.h"
#include "common/cm_file.h"
#include "common/cm_log.h"
#include "common/cm_net.h"
#include "common/cm_status.h"
#include "common/cm_time.h"
#include "kvstore/ctl/kvs_cluster.h"
#include "kvstore/ctl/kvs_http.h"

static CM_ALLOC_TAG(kvs_ctl_tag, "kvs.ctl");

#define KVS_PEM_MAX (1u << 20) /* certificate bundles are far smaller */

#define KVS_CFG(name, type, def, help, field, lo, hi) \
    {name, type, def, help, offsetof(kvs_ctl_config_t, field), lo, hi, NULL}

static const cm_config_item_t kvs_ctl_config_items[] = {
    KVS_CFG("listen", CM_CFG_STRING, "127.0.0.1:7070", "gRPC control API address host:port (port 0 = any free port)",
            listen, 0, 0),
    KVS_CFG("port-file", CM_CFG_STRING, "", "write the bound addresses here once serving (key=value lines)",
            port_file, 0, 0),
    KVS_CFG("memory", CM_CFG_SIZE, "1GiB", "host block pool size", memory, 1048576.0, 17592186044416.0),
    KVS_CFG("hugepages", CM_CFG_BOOL, "true", "back the pool with hugepages when available", hugepages, 0, 0),
    KVS_CFG("core-dumps", CM_CFG_BOOL, "false",
            "leave the process dumpable: core dumps on a crash, but then any process of our uid can open "
            "/proc/PID/fd, map_files and mem, and so every tenant's direct region (off: not dumpable)",
            core_dumps, 0, 0),
    KVS_CFG("dataplane-listen", CM_CFG_STRING, "127.0.0.1:7071",
            "data plane: the interface (by its address) UCX's TCP transport uses, and its port (0 = any; a "
            "wildcard host = every interface).  No listener takes connections: workers get the UCX address from "
            "CreateSession", dataplane_listen, 0, 0),
    /* Also read as RI_ADDRCHECK_PROGRAM (tests point it at another checker). */
    {"addrcheck-program", CM_CFG_STRING, "",
     "the data plane's address checker (ri-kvstore-addrcheck) to run on each worker's UCX address (empty = the "
     "one next to this program, else the build's)", offsetof(kvs_ctl_config_t, addrcheck_program), 0, 0,
     "RI_ADDRCHECK_PROGRAM"},
    KVS_CFG("dataplane-threads", CM_CFG_INT, "2",
            "data-plane threads, each with its own UCX worker; a session is served by one of them, so a slow "
            "client delays only the sessions of its thread", dataplane_threads, 1, 64),
    KVS_CFG("dataplane-nice", CM_CFG_INT, "-10",
            "nice value of the data-plane threads: a worker's step waits on them, so they go before batch work "
            "on a shared CPU (below 0 needs CAP_SYS_NICE; without it they keep the process's and a warning says so)",
            dataplane_nice, -20, 19),
    KVS_CFG("dataplane-spin-us", CM_CFG_INT, "0",
            "microseconds an idle data-plane thread keeps polling after its last message before it sleeps on "
            "its UCX worker's event: saves the wake-up (tens of microseconds) on a host with spare cores, and "
            "takes a core from the worker's step on one without them (measured on 2 cores: 0 is faster)",
            dataplane_spin_us, 0, 100000),
    KVS_CFG("dataplane-max-message", CM_CFG_SIZE, "256MiB", "largest data-plane message accepted",
            dataplane_max_message, 4096.0, 17179869184.0),
    KVS_CFG("tokens-file", CM_CFG_STRING, "",
            "bearer tokens file (TOKEN TENANT [QUOTA|-] [admin]); empty = single-tenant, loopback only", tokens_file,
            0, 0),
    KVS_CFG("tenant-quota", CM_CFG_SIZE, "0", "default memory quota per tenant (0 = no limit)", tenant_quota, 0, 0),
    KVS_CFG("global-quota", CM_CFG_SIZE, "0", "memory quota of all tenants together (0 = the pool size)",
            global_quota, 0, 0),
    KVS_CFG("metrics-listen", CM_CFG_STRING, "127.0.0.1:9464", "Prometheus /metrics HTTP address, or 'off'",
            metrics_listen, 0, 0),
    KVS_CFG("threads", CM_CFG_INT, "2", "gRPC serving threads", threads, 1, 64),
    KVS_CFG("drain-timeout-ms", CM_CFG_INT, "5000", "how long in-flight calls may run at shutdown, and a data-plane body may take to arrive",
            drain_timeout_ms, 0, 600000),
    KVS_CFG("max-message", CM_CFG_SIZE, "64KiB",
            "largest gRPC request accepted (the API needs a few KiB; replies may reach 16 MiB)", max_message, 1024.0,
            1073741824.0),
    /* Also read as RI_LOG_LEVEL, the name every program honours. */
    {"log-level", CM_CFG_STRING, "", "error, warn, info, debug or trace (empty = info)",
     offsetof(kvs_ctl_config_t, log_level), 0, 0, "RI_LOG_LEVEL"},
    KVS_CFG("spill-dir", CM_CFG_STRING, "",
            "spill tier directory: cold clusters go to disk when the pool is full (empty = spill off)", spill_dir, 0,
            0),
    KVS_CFG("spill-quota", CM_CFG_SIZE, "0", "disk quota of the spill tier (0 = no limit)", spill_quota, 0, 0),
    KVS_CFG("spill-high-water", CM_CFG_DOUBLE, "0.90", "spill the coldest clusters when pool use passes this share",
            spill_high_water, 0.05, 1.0),
    KVS_CFG("recover", CM_CFG_BOOL, "false",
            "at start, reload the sessions spilled in spill-dir (else the spill directory starts empty)", recover, 0,
            0),
    KVS_CFG("prefix-max-bytes", CM_CFG_SIZE, "0",
            "memory of all published prefix blocks together; past it a publish evicts unreferenced blocks, "
            "least recently used first, else is refused (0 = a quarter of the pool)", prefix_max_bytes, 0, 0),
    KVS_CFG("prefix-tenant-max-bytes", CM_CFG_SIZE, "0",
            "memory of one tenant's prefix blocks; past it a publish evicts that tenant's unreferenced blocks, "
            "else is refused (0 = only prefix-max-bytes)", prefix_tenant_max_bytes, 0, 0),
    KVS_CFG("tls-cert", CM_CFG_STRING, "", "PEM certificate chain: serve gRPC over TLS (empty = plaintext)", tls_cert,
            0, 0),
    KVS_CFG("tls-key", CM_CFG_STRING, "", "PEM private key of tls-cert", tls_key, 0, 0),
    KVS_CFG("tls-ca", CM_CFG_STRING, "", "PEM CA bundle: require client certificates signed by it (mutual TLS)",
            tls_ca, 0, 0),
    KVS_CFG("insecure", CM_CFG_BOOL, "false",
            "allow listen and dataplane-listen beyond loopback without a tokens-file (anyone who can connect is the "
            "default tenant)",
            insecure, 0, 0),
    KVS_CFG("insecure-admin", CM_CFG_BOOL, "false",
            "without a tokens-file, give every caller admin rights (Drain); else Drain needs an admin token",
            insecure_admin, 0, 0),
    KVS_CFG("max-sessions-per-tenant", CM_CFG_INT, "256", "open sessions one tenant may hold (0 = no limit)",
            max_sessions_per_tenant, 0, 1000000),
    KVS_CFG("max-connections", CM_CFG_INT, "1024",
            "gRPC client connections held at once; one more is reset at once (without TLS), and the fd limit must "
            "leave room for them (checked at start)", max_connections, 16,
            1000000),
    KVS_CFG("idle-timeout-ms", CM_CFG_INT, "300000", "close gRPC client connections idle this long",
            idle_timeout_ms, 1000, 86400000),
    KVS_CFG("session-lease-ms", CM_CFG_INT, "30000",
            "drop a session whose worker has had no data-plane connection and sent no KeepAlive for this long "
            "(0 = never; sessions --recover brings back get a whole lease to re-attach)", session_lease_ms, 0,
            86400000),
    KVS_CFG("cluster", CM_CFG_STRING, "",
            "join a cluster: etcd endpoints etcd://host:port[,host:port] where this node registers itself, its "
            "figures and its prefix blocks (empty = no cluster)", cluster, 0, 0),
    KVS_CFG("cluster-name", CM_CFG_STRING, "default", "the cluster's name in etcd (keys under /ri/NAME/)",
            cluster_name, 0, 0),
    KVS_CFG("node-name", CM_CFG_STRING, "",
            "this node's name in the cluster, stable across restarts (empty = the advertised address)", node_name, 0,
            0),
    KVS_CFG("cluster-advertise", CM_CFG_STRING, "",
            "gRPC host:port that workers dial (empty = listen with its bound port, or gethostname():port when listen "
            "is a wildcard)", cluster_advertise, 0, 0),
    KVS_CFG("cluster-host", CM_CFG_STRING, "",
            "host identity for same-host placement, as workers give it (empty = gethostname())", cluster_host, 0, 0),
    KVS_CFG("cluster-lease-ms", CM_CFG_INT, "5000",
            "lease of the node's records in etcd: a killed node is gone from the directory within it, and etcd "
            "unreachable at start is retried this long", cluster_lease_ms, 2000, 600000),
};

const cm_config_table_t kvs_ctl_config_table = {
    "ri-kvstore", "RI_KVS_", kvs_ctl_config_items, CM_ARRAY_LEN(kvs_ctl_config_items), 0, NULL};

bool kvs_ctl_addr_is_loopback(const char *addr)
{
    char host[256];
    unsigned port;
    struct in_addr a4;
    struct in6_addr a6;
    if (!cm_net_split(addr, host, sizeof(host), &port))
        return false;
    if (strcasecmp(host, "localhost") == 0)
        return true;
    if (inet_pton(AF_INET, host, &a4) == 1)
        return (ntohl(a4.s_addr) >> 24) == 127;
    if (inet_pton(AF_INET6, host, &a6) == 1)
        return IN6_IS_ADDR_LOOPBACK(&a6);
    return false;
}

/* The cluster settings: checked only with --cluster (without it they do nothing). */
static ri_status_t kvs_ctl_cluster_check(const kvs_ctl_config_t *cfg, char *err, size_t errlen)
{
    char host[256];
    unsigned port;

    if (cfg->cluster[0] == '\0')
        return RI_OK;
    if (!cm_etcd_endpoints_valid(cfg->cluster)) {
        snprintf(err, errlen, "cluster '%s' is not etcd://host:port[,host:port...]", cfg->cluster);
        return RI_ERR_INVALID;
    }
    if (!cm_cluster_name_valid(cfg->cluster_name)) {
        snprintf(err, errlen, "cluster-name '%s' is not 1..63 characters of A-Z a-z 0-9 . _ : -", cfg->cluster_name);
        return RI_ERR_INVALID;
    }
    if (cfg->node_name[0] != '\0' && !cm_cluster_name_valid(cfg->node_name)) {
        snprintf(err, errlen, "node-name '%s' is not 1..63 characters of A-Z a-z 0-9 . _ : -", cfg->node_name);
        return RI_ERR_INVALID;
    }
    if (cfg->cluster_host[0] != '\0' && !cm_cluster_name_valid(cfg->cluster_host)) {
        snprintf(err, errlen, "cluster-host '%s' is not 1..63 characters of A-Z a-z 0-9 . _ : -", cfg->cluster_host);
        return RI_ERR_INVALID;
    }
    if (cfg->cluster_advertise[0] != '\0' &&
        (!cm_net_split(cfg->cluster_advertise, host, sizeof(host), &port) || port == 0 ||
         cm_net_host_is_wildcard(host))) {
        snprintf(err, errlen, "cluster-advertise '%s' is not host:port with a port and a host others can dial",
                 cfg->cluster_advertise);
        return RI_ERR_INVALID;
    }
    return RI_OK;
}

ri_status_t kvs_ctl_config_check(const kvs_ctl_config_t *cfg, char *err, size_t errlen)
{
    char host[256];
    unsigned port;
    cm_log_level_t level;
    ri_status_t st;

    if (!cm_net_split(cfg->listen, host, sizeof(host), &port)) {
        snprintf(err, errlen, "listen '%s' is not host:port", cfg->listen);
        return RI_ERR_INVALID;
    }
    if (!cm_net_split(cfg->dataplane_listen, host, sizeof(host), &port)) {
        snprintf(err, errlen, "dataplane-listen '%s' is not host:port", cfg->dataplane_listen);
        return RI_ERR_INVALID;
    }
    if (strcmp(cfg->metrics_listen, "off") != 0 && !cm_net_split(cfg->metrics_listen, host, sizeof(host), &port)) {
        snprintf(err, errlen, "metrics-listen '%s' is not host:port or 'off'", cfg->metrics_listen);
        return RI_ERR_INVALID;
    }
    if (cfg->log_level[0] != '\0' && cm_log_level_parse(cfg->log_level, &level) != RI_OK) {
        snprintf(err, errlen, "log-level '%s' is not one of error, warn, info, debug, trace", cfg->log_level);
        return RI_ERR_INVALID;
    }
    if ((cfg->tls_cert[0] != '\0') != (cfg->tls_key[0] != '\0')) {
        snprintf(err, errlen, "tls-cert and tls-key go together (one of them is empty)");
        return RI_ERR_INVALID;
    }
    st = kvs_ctl_cluster_check(cfg, err, errlen);
    if (st != RI_OK)
        return st;
    if (cfg->recover && cfg->spill_dir[0] == '\0') {
        snprintf(err, errlen, "recover needs spill-dir (the directory to recover from)");
        return RI_ERR_INVALID;
    }
    if (cfg->tls_ca[0] != '\0' && cfg->tls_cert[0] == '\0') {
        snprintf(err, errlen, "tls-ca (client certificates) needs tls-cert and tls-key");
        return RI_ERR_INVALID;
    }
    if (cfg->tokens_file[0] == '\0' && !cfg->insecure && !kvs_ctl_addr_is_loopback(cfg->listen)) {
        snprintf(err, errlen,
                 "listen '%s' is not a loopback address: without a tokens-file the daemon has no authentication "
                 "and serves loopback only; set tokens-file (or --insecure to serve it unauthenticated)",
                 cfg->listen);
        return RI_ERR_INVALID;
    }
    /* The data plane checks each message's session secret, but a secret
     * comes from CreateSession, which without tokens anyone who reaches the
     * gRPC port may call: the same rule as listen, for the same reason. */
    if (cfg->tokens_file[0] == '\0' && !cfg->insecure && !kvs_ctl_addr_is_loopback(cfg->dataplane_listen)) {
        snprintf(err, errlen,
                 "dataplane-listen '%s' is not a loopback address: without a tokens-file the daemon has no "
                 "authentication and serves loopback only; set tokens-file (or --insecure to serve it "
                 "unauthenticated)",
                 cfg->dataplane_listen);
        return RI_ERR_INVALID;
    }
    return RI_OK;
}

/* Format "host:port" from a configured address and the bound port. */
static void kvs_ctl_bound_addr(const char *cfg_addr, int port, char *out, size_t len)
{
    char host[256];
    unsigned p;
    if (!cm_net_split(cfg_addr, host, sizeof(host), &p))
        snprintf(host, sizeof(host), "?");
    if (strchr(host, ':') != NULL)
        snprintf(out, len, "[%s]:%d", host, port);
    else
        snprintf(out, len, "%s:%d", host, port);
}

static void kvs_ctl_free_tls(kvs_ctl_t *ctl)
{
    if (ctl->tls_key_pem != NULL)
        explicit_bzero(ctl->tls_key_pem, strlen(ctl->tls_key_pem));
    cm_free(ctl->tls_key_pem);
    cm_free(ctl->tls_cert_pem);
    cm_free(ctl->tls_ca_pem);
    ctl->tls_key_pem = ctl->tls_cert_pem = ctl->tls_ca_pem = NULL;
}

/* Read the PEM files named by the tls-* settings. */
static ri_status_t kvs_ctl_load_tls(kvs_ctl_t *ctl, char *err, size_t errlen)
{
    const struct {
        const char *name, *path;
        char **dst;
    } files[] = {
        {"tls-cert", ctl->cfg.tls_cert, &ctl->tls_cert_pem},
        {"tls-key", ctl->cfg.tls_key, &ctl->tls_key_pem},
        {"tls-ca", ctl->cfg.tls_ca, &ctl->tls_ca_pem},
    };
    for (size_t i = 0; i < CM_ARRAY_LEN(files); i++) {
        if (files[i].path[0] == '\0')
            continue;
        ri_status_t st = cm_file_read(files[i].path, KVS_PEM_MAX, files[i].dst, NULL);
        if (st == RI_OK && strstr(*files[i].dst, "-----BEGIN ") == NULL)
            st = RI_ERR_FORMAT;
        if (st != RI_OK) {
            snprintf(err, errlen, "%s %s: %s", files[i].name, files[i].path,
                     st == RI_ERR_FORMAT ? "not a PEM file" : ri_status_str(st));
            kvs_ctl_free_tls(ctl);
            return st;
        }
    }
    cm_info("grpc: TLS on%s", ctl->tls_ca_pem ? ", client certificates required (mutual TLS)" : "");
    return RI_OK;
}

/* File descriptors the daemon needs besides client connections: metrics
 * connections, data-plane endpoints, spill files, logs, gRPC internals. */
#define KVS_CTL_FD_RESERVE 256u

/* Raise the soft fd limit to the hard one and refuse to start when even that
 * cannot hold max-connections plus the reserve: the listener (kvs_accept.c)
 * resets connections beyond max-connections, and with this much room the
 * rest of the daemon does not run out of descriptors because of them. */
static ri_status_t kvs_ctl_check_fds(const kvs_ctl_config_t *cfg, char *err, size_t errlen)
{
    struct rlimit rl;
    uint64_t need = (uint64_t)cfg->max_connections + KVS_CTL_FD_RESERVE;
    if (getrlimit(RLIMIT_NOFILE, &rl) != 0) {
        snprintf(err, errlen, "getrlimit(RLIMIT_NOFILE): %s", strerror(errno));
        return RI_ERR_INTERNAL;
    }
    if (rl.rlim_cur != rl.rlim_max) {
        rlim_t old = rl.rlim_cur;
        rl.rlim_cur = rl.rlim_max;
        if (setrlimit(RLIMIT_NOFILE, &rl) != 0)
            rl.rlim_cur = old;
    }
    if (rl.rlim_cur != RLIM_INFINITY && (uint64_t)rl.rlim_cur < need) {
        snprintf(err, errlen,
                 "file descriptor limit %llu (hard limit of ulimit -n) is below the %llu that max-connections=%lld "
                 "needs (+%u for the rest of the daemon); raise the limit or lower max-connections",
                 (unsigned long long)rl.rlim_cur, (unsigned long long)need, (long long)cfg->max_connections,
                 KVS_CTL_FD_RESERVE);
        return RI_ERR_INVALID;
    }
    cm_info("fd limit %llu (max-connections %lld)", (unsigned long long)rl.rlim_cur, (long long)cfg->max_connections);
    return RI_OK;
}

static void kvs_ctl_render(void *arg, FILE *out)
{
    kvs_ctl_metrics_write(arg, out);
}

ri_status_t kvs_ctl_start(const kvs_ctl_config_t *cfg, kvs_ctl_t **ctl_p, char *err, size_t errlen)
{
    ri_status_t st;
    cm_log_level_t level;
    kvs_ctl_t *ctl;

    st = kvs_ctl_config_check(cfg, err, errlen);
    if (st != RI_OK)
        return st;
    st = kvs_ctl_check_fds(cfg, err, errlen);
    if (st != RI_OK)
        return st;
    if (cfg->log_level[0] != '\0' && cm_log_level_parse(cfg->log_level, &level) == RI_OK)
        cm_log_set_level(level);
    ctl = cm_calloc(&kvs_ctl_tag, 1, sizeof(*ctl));
    if (ctl == NULL) {
        snprintf(err, errlen, "out of memory");
        return RI_ERR_NOMEM;
    }
    ctl->cfg = *cfg;
    ctl->start_ns = cm_time_ns();
    atomic_init(&ctl->draining, false);

    if (cfg->tokens_file[0] != '\0') {
        st = kvs_auth_load(cfg->tokens_file, &ctl->auth, err, errlen);
        if (st != RI_OK)
            goto err_free;
        cm_info("auth: %zu token(s) from %s", kvs_auth_count(ctl->auth), cfg->tokens_file);
        ctl->tokens_mode = true;
    } else {
        cm_warn("auth: no tokens-file; single-tenant mode (tenant '%s', no tokens checked), %s, admin calls %s",
                KVS_DEFAULT_TENANT, cfg->insecure ? "ANY ADDRESS (--insecure)" : "loopback only",
                cfg->insecure_admin ? "open to every caller (--insecure-admin)" : "refused (no admin token)");
    }

    kvs_data_config_t dcfg = {
        .memory_bytes = cfg->memory,
        .hugepages = cfg->hugepages,
        .global_quota_bytes = cfg->global_quota,
        .tenant_quota_bytes = cfg->tenant_quota,
        .dp_listen_addr = cfg->dataplane_listen,
        .dp_check_program = cfg->addrcheck_program,
        .max_msg_bytes = cfg->dataplane_max_message,
        .dp_lanes = (uint32_t)cfg->dataplane_threads,
        .dp_nice = (int32_t)cfg->dataplane_nice,
        .dp_spin_us = (uint32_t)cfg->dataplane_spin_us,
        .drain_timeout_ms = (uint32_t)cfg->drain_timeout_ms,
        .spill_dir = cfg->spill_dir,
        .spill_quota_bytes = cfg->spill_quota,
        .spill_high_water = cfg->spill_high_water,
        .recover = cfg->recover,
        .lease_ms = (uint32_t)cfg->session_lease_ms,
        .prefix_max_bytes = cfg->prefix_max_bytes,
        .prefix_tenant_max_bytes = cfg->prefix_tenant_max_bytes,
        .ucx_user = cfg->ucx_user,
    };
    st = kvs_data_create(&dcfg, &ctl->data);
    if (st != RI_OK) {
        snprintf(err, errlen, "data side (pool %llu bytes, data plane %s): %s", (unsigned long long)cfg->memory,
                 cfg->dataplane_listen, ri_status_str(st));
        goto err_free_auth;
    }
    for (size_t i = 0; i < kvs_auth_count(ctl->auth); i++) {
        const kvs_auth_entry_t *e = kvs_auth_entry(ctl->auth, i);
        if (!e->has_quota)
            continue;
        st = kvs_data_set_tenant_quota(ctl->data, e->tenant, e->quota_bytes);
        if (st != RI_OK) {
            snprintf(err, errlen, "quota of tenant %s: %s", e->tenant, ri_status_str(st));
            goto err_destroy_data;
        }
    }

    if (cfg->tls_cert[0] != '\0') {
        st = kvs_ctl_load_tls(ctl, err, errlen);
        if (st != RI_OK)
            goto err_destroy_data;
    }
    kvs_grpc_config_t gcfg = {
        .listen = cfg->listen,
        .threads = (unsigned)cfg->threads,
        .max_message = cfg->max_message,
        .auth = ctl->auth,
        .default_tenant = KVS_DEFAULT_TENANT,
        .methods = kvs_ctl_methods,
        .n_methods = kvs_ctl_n_methods,
        .app = ctl,
        .tls_cert_pem = ctl->tls_cert_pem,
        .tls_key_pem = ctl->tls_key_pem,
        .tls_ca_pem = ctl->tls_ca_pem,
        .admin_without_tokens = cfg->insecure_admin,
        .idle_timeout_ms = (uint32_t)cfg->idle_timeout_ms,
        .max_connections = (uint32_t)cfg->max_connections,
    };
    st = kvs_grpc_start(&gcfg, &ctl->grpc, err, errlen);
    if (st != RI_OK)
        goto err_destroy_data;
    kvs_ctl_bound_addr(cfg->listen, kvs_grpc_port(ctl->grpc), ctl->grpc_addr, sizeof(ctl->grpc_addr));

    if (strcmp(cfg->metrics_listen, "off") != 0) {
        st = kvs_http_start(cfg->metrics_listen, kvs_ctl_render, ctl, &ctl->http, err, errlen);
        if (st != RI_OK)
            goto err_stop_grpc;
        kvs_ctl_bound_addr(cfg->metrics_listen, kvs_http_port(ctl->http), ctl->metrics_addr,
                           sizeof(ctl->metrics_addr));
        if (!kvs_ctl_addr_is_loopback(cfg->metrics_listen))
            cm_warn("metrics: %s is not loopback; /metrics has no authentication", ctl->metrics_addr);
    }
    /* Last: a node in the directory serves, with what --recover reloaded. */
    if (cfg->cluster[0] != '\0') {
        st = kvs_cluster_start(ctl, &ctl->cluster, err, errlen);
        if (st != RI_OK)
            goto err_stop_http;
    }
    *ctl_p = ctl;
    return RI_OK;

err_stop_http:
    kvs_http_destroy(ctl->http);
err_stop_grpc:
    kvs_grpc_destroy(ctl->grpc);
err_destroy_data:
    kvs_ctl_free_tls(ctl);
    kvs_data_destroy(ctl->data);
err_free_auth:
    kvs_auth_destroy(ctl->auth);
err_free:
    cm_free(ctl);
    return st;
}

void kvs_ctl_destroy(kvs_ctl_t *ctl)
{
    if (ctl == NULL)
        return;
    atomic_store(&ctl->draining, true);
    /* First: workers stop placing sessions here at once. */
    kvs_cluster_leave(ctl->cluster);
    uint64_t t0 = cm_time_ns();
    unsigned cancelled = kvs_grpc_shutdown(ctl->grpc, (uint32_t)ctl->cfg.drain_timeout_ms);
    cm_info("grpc: stopped in %.1f ms (%u call(s) cancelled)", (double)(cm_time_ns() - t0) / 1e6, cancelled);
    kvs_http_destroy(ctl->http); /* before grpc and cluster: the page reads their counters */
    kvs_cluster_destroy(ctl->cluster);
    kvs_grpc_destroy(ctl->grpc);
    kvs_data_destroy(ctl->data);
    kvs_auth_destroy(ctl->auth);
    kvs_ctl_free_tls(ctl);
    cm_free(ctl);
}

static bool kvs_auth_has_tenant(const kvs_auth_t *auth, const char *tenant)
{
    for (size_t i = 0; i < kvs_auth_count(auth); i++)
        if (strcmp(kvs_auth_entry(auth, i)->tenant, tenant) == 0)
            return true;
    return false;
}

/* A tenant with no token left has lost its access: drop its sessions, so that
 * the session secrets it holds stop working on the data plane too (the new
 * tokens are already in force, so it cannot create new ones meanwhile). */
static void kvs_ctl_revoke_removed(kvs_ctl_t *ctl, const kvs_auth_t *old, const kvs_auth_t *fresh)
{
    for (size_t i = 0; i < kvs_auth_count(old); i++) {
        const char *tenant = kvs_auth_entry(old, i)->tenant;
        if (kvs_auth_has_tenant(fresh, tenant))
            continue;
        uint32_t n = 0;
        uint64_t bytes = 0;
        /* A tenant with several old tokens comes by again and finds none. */
        if (kvs_data_drop_tenant(ctl->data, tenant, &n, &bytes) == RI_OK && n > 0) {
            atomic_fetch_add(&ctl->revoked_sessions, n);
            cm_warn("auth: tenant '%s' has no token any more: %u session(s) dropped (%llu bytes), their secrets "
                    "revoked", tenant, n, (unsigned long long)bytes);
        }
    }
}

ri_status_t kvs_ctl_reload_tokens(kvs_ctl_t *ctl, char *err, size_t errlen)
{
    kvs_auth_t *fresh = NULL;
    ri_status_t st;

    if (!ctl->tokens_mode) {
        snprintf(err, errlen, "no tokens-file configured; nothing to reload");
        return RI_ERR_UNSUPPORTED;
    }
    st = kvs_auth_load(ctl->cfg.tokens_file, &fresh, err, errlen);
    if (st != RI_OK) {
        atomic_fetch_add(&ctl->reload_failures, 1);
        return st;
    }
    /* Quotas first: a tenant whose quota was lowered is held to it from the
     * first call that the new tokens admit. */
    for (size_t i = 0; i < kvs_auth_count(fresh); i++) {
        const kvs_auth_entry_t *e = kvs_auth_entry(fresh, i);
        if (e->has_quota)
            kvs_data_set_tenant_quota(ctl->data, e->tenant, e->quota_bytes);
    }
    for (size_t i = 0; i < kvs_auth_count(ctl->auth); i++) {
        const kvs_auth_entry_t *old = kvs_auth_entry(ctl->auth, i);
        bool kept = false;
        for (size_t j = 0; j < kvs_auth_count(fresh) && !kept; j++) {
            const kvs_auth_entry_t *e = kvs_auth_entry(fresh, j);
            kept = e->has_quota && strcmp(e->tenant, old->tenant) == 0;
        }
        if (old->has_quota && !kept)
            kvs_data_set_tenant_quota(ctl->data, old->tenant, ctl->cfg.tenant_quota);
    }
    kvs_auth_t *old = kvs_grpc_swap_auth(ctl->grpc, fresh);
    ctl->auth = fresh;
    kvs_cluster_set_tenants(ctl->cluster, fresh);
    kvs_ctl_revoke_removed(ctl, old, fresh);
    kvs_auth_destroy(old);
    atomic_fetch_add(&ctl->reloads, 1);
    cm_info("auth: reloaded %zu token(s) from %s", kvs_auth_count(fresh), ctl->cfg.tokens_file);
    return RI_OK;
}

typedef struct kvs_ctl_alloc_visit {
    FILE *out;
} kvs_ctl_alloc_visit_t;

static void kvs_ctl_alloc_line(const cm_alloc_tag_t *tag, void *arg)
{
    kvs_ctl_alloc_visit_t *v = arg;
    fprintf(v->out, "ri_kvs_alloc_bytes{tag=\"%s\"} %zu\n", tag->name, atomic_load(&tag->bytes));
}

static void kvs_ctl_alloc_peak_line(const cm_alloc_tag_t *tag, void *arg)
{
    kvs_ctl_alloc_visit_t *v = arg;
    fprintf(v->out, "ri_kvs_alloc_peak_bytes{tag=\"%s\"} %zu\n", tag->name, atomic_load(&tag->peak_bytes));
}

void kvs_ctl_metrics_write(kvs_ctl_t *ctl, FILE *out)
{
    kvs_ctl_alloc_visit_t v = {out};
    fprintf(out, "# HELP ri_kvs_up 1 while the daemon serves.\n# TYPE ri_kvs_up gauge\nri_kvs_up 1\n");
    fprintf(out, "# HELP ri_kvs_uptime_seconds Time since the daemon started.\n");
    fprintf(out, "# TYPE ri_kvs_uptime_seconds gauge\n");
    fprintf(out, "ri_kvs_uptime_seconds %.3f\n", (double)(cm_time_ns() - ctl->start_ns) / 1e9);
    fprintf(out, "# HELP ri_kvs_draining 1 once Drain was called or shutdown began.\n");
    fprintf(out, "# TYPE ri_kvs_draining gauge\nri_kvs_draining %d\n", atomic_load(&ctl->draining) ? 1 : 0);
    fprintf(out, "# HELP ri_kvs_build_info Version and auth mode.\n# TYPE ri_kvs_build_info gauge\n");
    fprintf(out, "# HELP ri_kvs_token_reloads_total Tokens-file reloads (SIGHUP), by result.\n");
    fprintf(out, "# TYPE ri_kvs_token_reloads_total counter\n");
    fprintf(out, "ri_kvs_token_reloads_total{result=\"ok\"} %llu\n", (unsigned long long)atomic_load(&ctl->reloads));
    fprintf(out, "ri_kvs_token_reloads_total{result=\"refused\"} %llu\n",
            (unsigned long long)atomic_load(&ctl->reload_failures));
    fprintf(out, "# HELP ri_kvs_metrics_overran_total /metrics connections shut for taking over 3 s for one "
                 "request and its answer (a trickling client).\n");
    fprintf(out, "# TYPE ri_kvs_metrics_overran_total counter\n");
    fprintf(out, "ri_kvs_metrics_overran_total %llu\n", (unsigned long long)kvs_http_overran(ctl->http));
    fprintf(out, "# HELP ri_kvs_revoked_sessions_total Sessions dropped because their tenant's last token was "
                 "removed (SIGHUP).\n");
    fprintf(out, "# TYPE ri_kvs_revoked_sessions_total counter\n");
    fprintf(out, "ri_kvs_revoked_sessions_total %llu\n", (unsigned long long)atomic_load(&ctl->revoked_sessions));
    fprintf(out, "ri_kvs_build_info{version=\"%s\",auth_mode=\"%s\",tls=\"%s\"} 1\n", KVS_VERSION,
            ctl->tokens_mode ? "tokens" : "single-tenant",
            ctl->tls_ca_pem ? "mutual" : ctl->tls_cert_pem ? "on" : "off");
    fprintf(out, "# HELP ri_kvs_limit_refusals_total Calls refused by a configured limit, by limit.\n");
    fprintf(out, "# TYPE ri_kvs_limit_refusals_total counter\n");
    fprintf(out, "ri_kvs_limit_refusals_total{limit=\"max-sessions-per-tenant\"} %llu\n",
            (unsigned long long)atomic_load(&ctl->session_limit_refusals));
    fprintf(out, "ri_kvs_limit_refusals_total{limit=\"session-table\"} %llu\n",
            (unsigned long long)atomic_load(&ctl->table_full_refusals));
    kvs_grpc_metrics_write(ctl->grpc, out);
    kvs_cluster_metrics_write(ctl->cluster, out);
    fprintf(out, "# HELP ri_kvs_alloc_bytes Live heap bytes by allocation tag.\n");
    fprintf(out, "# TYPE ri_kvs_alloc_bytes gauge\n");
    cm_alloc_visit(kvs_ctl_alloc_line, &v);
    fprintf(out, "# HELP ri_kvs_alloc_peak_bytes Peak heap bytes by allocation tag.\n");
    fprintf(out, "# TYPE ri_kvs_alloc_peak_bytes gauge\n");
    cm_alloc_visit(kvs_ctl_alloc_peak_line, &v);
    kvs_data_metrics_write(ctl->data, out);
}
