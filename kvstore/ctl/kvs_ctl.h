/*
 * The control side of ri-kvstore: its settings (one cm_config table), the
 * daemon object that ties the gRPC server, authentication, the metrics
 * endpoint and the data side (kvstore/data) together, and the control API
 * handlers.  main() in kvs_main.c only parses the command line, starts this
 * object and waits for a signal.
 */
#ifndef KVS_CTL_H
#define KVS_CTL_H

#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "common/cm_config.h"
#include "kvstore/ctl/kvs_auth.h"
#include "kvstore/ctl/kvs_grpc.h"
#include "kvstore/data/kvs_data.h"
#include "retroinfer/status.h"

#define KVS_VERSION "0.1.0"
#define KVS_DEFAULT_TENANT "default"

/* Every setting of ri-kvstore; filled by cm_config_load from kvs_ctl_config_table. */
typedef struct kvs_ctl_config {
    char *listen;                    /* gRPC "host:port" */
    char *port_file;                 /* where to write the bound addresses, or "" */
    uint64_t memory;                 /* host block pool bytes */
    bool hugepages;                  /* try hugepages for the pool */
    bool core_dumps;                 /* stay dumpable (else PR_SET_DUMPABLE 0: /proc/PID is root's) */
    char *dataplane_listen;          /* data plane: UCX TCP interface address and port "host:port" */
    char *addrcheck_program;         /* the data plane's address checker, or "" = next to the program */
    uint64_t dataplane_max_message;  /* largest data-plane message */
    int64_t dataplane_threads;       /* data-plane lanes (threads, each its own UCX worker) */
    int64_t dataplane_nice;          /* nice value of the data-plane threads */
    int64_t dataplane_spin_us;       /* how long an idle lane polls before it sleeps */
    char *tokens_file;               /* bearer tokens -> tenants, or "" */
    uint64_t tenant_quota;           /* default per-tenant memory quota; 0 = none */
    uint64_t global_quota;           /* all tenants together; 0 = pool size */
    char *metrics_listen;            /* HTTP "host:port" for /metrics, or "off" */
    int64_t threads;                 /* gRPC serving threads */
    int64_t drain_timeout_ms;        /* bound on in-flight work at shutdown */
    uint64_t max_message;            /* gRPC send/receive limit */
    char *log_level;                 /* error|warn|info|debug|trace */
    char *spill_dir;                 /* spill tier directory, or "" = off */
    uint64_t spill_quota;            /* spill disk quota; 0 = none */
    uint64_t prefix_max_bytes;       /* all prefix blocks in memory; 0 = a quarter of the pool */
    uint64_t prefix_tenant_max_bytes; /* one tenant's prefix blocks; 0 = only the global cap */
    double spill_high_water;         /* pool share that starts spilling */
    bool recover;                    /* reload spilled sessions at start */
    char *tls_cert;                  /* PEM server certificate chain, or "" for plaintext */
    char *tls_key;                   /* PEM private key of tls_cert */
    char *tls_ca;                    /* PEM CA for client certificates (mutual TLS), or "" */
    bool insecure;                   /* allow listening beyond loopback without tokens */
    bool insecure_admin;             /* without tokens, give local callers admin rights (Drain) */
    int64_t max_sessions_per_tenant; /* open sessions of one tenant; 0 = no limit */
    int64_t max_connections;         /* gRPC client connections held at once (and their fd budget) */
    int64_t idle_timeout_ms;         /* close gRPC connections idle this long */
    int64_t session_lease_ms;        /* drop sessions with no data-plane connection or KeepAlive this long; 0 = never */
    char *cluster;                   /* etcd endpoints "etcd://host:port[,host:port]", or "" = no cluster */
    char *cluster_name;              /* the cluster's name in the directory */
    char *node_name;                 /* this node's name, or "" = the advertised address */
    char *cluster_advertise;         /* gRPC "host:port" others dial, or "" = derived from listen */
    char *cluster_host;              /* host identity for same-host placement, or "" = gethostname() */
    int64_t cluster_lease_ms;        /* the node's lease in etcd */
    kvs_ucx_user_env_t ucx_user;     /* not a setting: UCX's own variables the user set, read from the
                                        environment by the program (kvs_main.c) */
} kvs_ctl_config_t;

extern const cm_config_table_t kvs_ctl_config_table;

/* The running daemon. */
typedef struct kvs_ctl {
    kvs_ctl_config_t cfg;           /* borrowed from the caller of kvs_ctl_start */
    kvs_auth_t *auth;               /* owned; NULL = single-tenant loopback mode; swapped by reload */
    bool tokens_mode;               /* started with a tokens file (fixed) */
    _Atomic uint64_t reloads;       /* successful token reloads */
    _Atomic uint64_t reload_failures; /* refused token reloads */
    _Atomic uint64_t revoked_sessions; /* sessions dropped when their tenant lost its last token */
    _Atomic uint64_t session_limit_refusals; /* CreateSession over max-sessions-per-tenant */
    _Atomic uint64_t table_full_refusals;    /* CreateSession with the session table full */
    kvs_data_t *data;               /* owned */
    kvs_grpc_t *grpc;               /* owned */
    struct kvs_http *http;          /* owned; NULL when metrics are off */
    struct kvs_cluster *cluster;    /* owned; NULL without --cluster */
    uint64_t start_ns;              /* monotonic start time */
    atomic_bool draining;           /* Drain was called or shutdown began */
    char grpc_addr[300];            /* bound gRPC address "host:port" */
    char metrics_addr[300];         /* bound metrics address, or "" */
    char *tls_cert_pem;             /* owned PEM texts, NULL without TLS */
    char *tls_key_pem;
    char *tls_ca_pem;
} kvs_ctl_t;

/* Check settings that the table alone cannot (addresses, loopback rule). */
ri_status_t kvs_ctl_config_check(const kvs_ctl_config_t *cfg, char *err, size_t errlen);

/* Start everything: tokens, data side, gRPC, metrics.  cfg is borrowed and
 * must outlive the daemon.  Caller stops with kvs_ctl_destroy. */
ri_status_t kvs_ctl_start(const kvs_ctl_config_t *cfg, kvs_ctl_t **ctl_p, char *err, size_t errlen);

/* Stop accepting, finish in-flight calls within drain-timeout-ms, stop the
 * data side, free everything.  NULL is a no-op. */
void kvs_ctl_destroy(kvs_ctl_t *ctl);

/* The control API methods (Health, Stats, CreateSession, ...). */
extern const kvs_method_t kvs_ctl_methods[];
extern const size_t kvs_ctl_n_methods;

/* Re-read the tokens file (SIGHUP): new tokens and quotas apply to calls
 * from now on; on any error the old tokens stay and err says why.  Tenants
 * whose quota line went away fall back to the tenant-quota setting.  Only
 * when the daemon started with a tokens file (RI_ERR_UNSUPPORTED otherwise).
 * Call from one thread at a time (the main thread). */
ri_status_t kvs_ctl_reload_tokens(kvs_ctl_t *ctl, char *err, size_t errlen);

/* Write the whole /metrics page. */
void kvs_ctl_metrics_write(kvs_ctl_t *ctl, FILE *out);

/* Is host (of "host:port") a loopback address? */
bool kvs_ctl_addr_is_loopback(const char *addr);

#endif /* KVS_CTL_H */
