/*
 * The data side of ri-kvstore, as one object: the host block pool (arena
 * registered with UCX), the catalog of sessions and their cluster tables, the
 * per-worker cache directories with LRU, and the UCX data-plane listener with
 * its progress thread.  The control side (kvstore/ctl: gRPC, auth, metrics
 * HTTP, main) drives it only through this header.
 *
 * Thread safety: every function may be called from any thread (gRPC serving
 * threads call the session functions while the data-plane thread serves).
 * Tenant scoping: functions that take a tenant never reveal or touch another
 * tenant's sessions (they answer RI_ERR_NOT_FOUND, as for a missing id).
 *
 * CONTRACT between the kvstore helpers: the declarations below are fixed;
 * kvstore/data implements them; kvstore/ctl calls them.  Add functions, do not
 * change these without updating both sides.
 */
#ifndef KVS_DATA_H
#define KVS_DATA_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "common/cm_wire.h"
#include "retroinfer/status.h"

#define KVS_TENANT_MAX 64   /* tenant names are 1..63 bytes of [A-Za-z0-9._-] */
#define KVS_LABEL_MAX 128   /* labels are up to 127 bytes, printable */

typedef enum kvs_dtype {
    KVS_DTYPE_F16 = 1,
    KVS_DTYPE_BF16 = 2,
} kvs_dtype_t;

/* Model geometry of a session; validated by kvs_data_session_create. */
typedef struct kvs_geometry {
    uint32_t layers;       /* 1..1024 */
    uint32_t kv_heads;     /* 1..256 */
    uint32_t head_dim;     /* 16..512, multiple of 8 */
    uint32_t dtype;        /* kvs_dtype_t */
    uint32_t page_tokens;  /* tokens per page, 1..256 (default 8) */
} kvs_geometry_t;

/* Settings of the data side; filled by the daemon from its config table. */
/* UCX's own environment variables as the user set them (NULL: unset), read
 * by the program (ri-kvstore's main) and passed in: UCX itself reads them,
 * so they are environment variables, not ri-kvstore settings.  The data
 * plane reads no environment; it looks at these only so as not to override
 * what the user chose.  Borrowed: must outlive the data side. */
typedef struct kvs_ucx_user_env {
    const char *tls;              /* UCX_TLS: shared-memory transports are still left out */
    const char *net_devices;      /* UCX_NET_DEVICES: set, UCX is not kept on dp_listen_addr's interface */
    const char *port_range;       /* UCX_TCP_PORT_RANGE: set, the program does not set it (kvs_data_ucx_port_range) */
    const char *keepalive;        /* UCX_KEEPALIVE_INTERVAL: set, the lease does not shorten it */
} kvs_ucx_user_env_t;

typedef struct kvs_data_config {
    uint64_t memory_bytes;        /* size of the host block pool arena */
    bool hugepages;               /* try explicit hugepages, then THP via madvise */
    uint64_t global_quota_bytes;  /* 0 = the pool size */
    uint64_t tenant_quota_bytes;  /* default per-tenant limit; 0 = no limit */
    const char *dp_listen_addr;   /* "host:port": the interface (and port) of UCX's TCP transport; port 0 = any */
    const char *dp_check_program; /* the data plane's address checker; NULL or "" = found next to the program */
    uint32_t dp_lanes;            /* data-plane threads, each with its own UCX worker (0 = 2) */
    int32_t dp_nice;              /* nice value of the data-plane threads (0 = as the process) */
    uint32_t dp_spin_us;          /* an idle lane polls this long before it sleeps (0 = sleeps at once) */
    uint64_t max_msg_bytes;       /* largest data-plane message accepted */
    uint32_t drain_timeout_ms;    /* bound on in-flight work at shutdown */
    bool no_data_plane;           /* added: catalog and pool only, no UCX (tests) */
    /* Spill tier; spill_dir NULL or "" = off, behaviour as before. */
    const char *spill_dir;        /* segment files + manifests; copied at create */
    uint64_t spill_quota_bytes;   /* disk quota of the spill store; 0 = unlimited */
    double spill_high_water;      /* spill coldest clusters above this pool share (0 = 0.90) */
    bool recover;                 /* reload spilled sessions from spill_dir at create */
    uint32_t lease_ms;            /* drop a session with no data-plane connection and no KeepAlive for this long
                                   * (0 = never; docs/kvstore.md "Session leases") */
    uint64_t prefix_max_bytes;    /* memory of all prefix blocks together (0 = a quarter of the pool) */
    uint64_t prefix_tenant_max_bytes; /* memory of one tenant's prefix blocks (0 = only the global cap) */
    const struct kvs_io_ops *spill_io_ops; /* added: the spill tier's system calls (NULL = the real ones;
                                            * tests inject faults and delays); borrowed, must outlive data */
    kvs_ucx_user_env_t ucx_user;  /* UCX variables the user set (all NULL: none) */
} kvs_data_config_t;

/* One session as ListSessions shows it. */
typedef struct kvs_session_info {
    uint64_t id;                     /* session id (never 0) */
    char tenant[KVS_TENANT_MAX];     /* owner */
    char label[KVS_LABEL_MAX];       /* free text */
    kvs_geometry_t geometry;         /* model geometry */
    uint64_t bytes_in_pool;          /* pool bytes held */
    uint64_t bytes_on_disk;          /* spill bytes held */
    uint64_t clusters;               /* clusters stored */
    uint64_t created_unix_ms;        /* creation time */
} kvs_session_info_t;

/* Counters for Stats (tenant-scoped where the name says so). */
typedef struct kvs_data_stats {
    uint64_t pool_bytes_total;   /* arena size */
    uint64_t pool_bytes_used;    /* allocated pages */
    uint64_t disk_bytes_used;    /* spill tier */
    uint32_t sessions_tenant;    /* the caller's tenant */
    uint32_t sessions_all;       /* everyone */
    uint64_t clusters_tenant;    /* the caller's tenant */
    uint64_t fetches;            /* FETCH_RANKED served */
    uint64_t cache_hits;         /* clusters answered as hits */
    uint64_t cache_misses;       /* clusters answered as misses */
    uint64_t bytes_sent;         /* data-plane bytes sent */
    uint64_t errors;             /* requests answered with an error */
    struct {                     /* prefix blocks, daemon-wide */
        uint64_t blocks_memory, bytes_memory, blocks_disk, bytes_disk;
        uint64_t attach_hits, attach_misses, tokens_attached;
        uint64_t publishes_new, publishes_existing, publishes_refused;
        uint64_t evictions, spills, corrupt;
    } prefix;
} kvs_data_stats_t;

typedef struct kvs_data kvs_data_t;

/* Create pool, catalog and data plane, and start the data-plane thread.
 * cfg is copied.  Caller destroys with kvs_data_destroy. */
ri_status_t kvs_data_create(const kvs_data_config_t *cfg, kvs_data_t **data_p);

/* Stop the data plane (finishing in-flight requests within drain_timeout_ms),
 * free every session and the pool.  NULL is a no-op. */
void kvs_data_destroy(kvs_data_t *data);

/* The port range UCX's TCP transport should listen on for a data plane on
 * listen_addr ("host:port") with lanes lanes (0 = 2): the port and the next
 * lanes-1 ports, one per lane, so that a firewall can name them.  Written
 * to out (cap bytes) as "FIRST-LAST"; false (out untouched) when
 * listen_addr names no port (0 or none: UCX picks).  UCX 1.13 takes this
 * only from the environment (UCX_TCP_PORT_RANGE), so the program sets it,
 * unless the user did, before kvs_data_create starts the data plane. */
bool kvs_data_ucx_port_range(const char *listen_addr, uint32_t lanes, char *out, size_t cap);

/* The data-plane address a worker of session_id connects to: the packed UCX
 * address of the lane that serves it ("ucx:HEX"; session 0: lane 0), "" when
 * the data plane is off.  Borrowed, valid until destroy. */
const char *kvs_data_address(const kvs_data_t *data, uint64_t session_id);

/* Set a tenant's memory quota (bytes; 0 = unlimited), e.g. from the tokens file. */
ri_status_t kvs_data_set_tenant_quota(kvs_data_t *data, const char *tenant, uint64_t bytes);

/* Create a session.  Errors: RI_ERR_INVALID (bad geometry, tenant or label),
 * RI_ERR_QUOTA (expected_tokens would not fit the tenant's or global quota),
 * RI_ERR_SHUTDOWN (draining), RI_ERR_NOSPACE / RI_ERR_IO (the spill tier's
 * session manifest could not record it; nothing is created).  Writes id and secret only on success. */
ri_status_t kvs_data_session_create(kvs_data_t *data, const char *tenant, const kvs_geometry_t *geometry,
                                    uint64_t expected_tokens, const char *label, uint64_t *id_p,
                                    uint8_t secret_p[CM_WIRE_SECRET_SIZE]);

/* Drop a session of this tenant (NULL: of any tenant, for an admin) and free
 * its pages.  RI_ERR_NOT_FOUND when it does not exist or belongs to another
 * tenant. */
ri_status_t kvs_data_session_drop(kvs_data_t *data, const char *tenant, uint64_t id, uint64_t *bytes_freed_p);

/* List this tenant's sessions (NULL: every tenant's, for an admin).  *infos_p
 * is allocated with cm_malloc (caller frees with cm_free; NULL when *n_p is 0). */
ri_status_t kvs_data_session_list(kvs_data_t *data, const char *tenant, kvs_session_info_t **infos_p,
                                  size_t *n_p);

/* Drop every session of a tenant (its access was revoked): their secrets stop
 * working on the data plane at once.  Counts what went. */
ri_status_t kvs_data_drop_tenant(kvs_data_t *data, const char *tenant, uint32_t *n_dropped_p,
                                 uint64_t *bytes_freed_p);

/* Renew the leases of the sessions ids[0..n) that belong to this tenant
 * (NULL: any tenant's, for an admin); ids that name no such session are
 * skipped.  *renewed_p (may be NULL) = how many were renewed.  Never fails
 * on unknown ids: RI_ERR_INVALID only for bad arguments. */
ri_status_t kvs_data_session_keepalive(kvs_data_t *data, const char *tenant, const uint64_t *ids, size_t n,
                                       uint32_t *renewed_p);

/* Counters, scoped to tenant where the field says so. */
void kvs_data_stats(kvs_data_t *data, const char *tenant, kvs_data_stats_t *stats_p);

/* Stop accepting new sessions (Drain); returns the number still open. */
uint32_t kvs_data_drain(kvs_data_t *data);

/* Append this side's metrics in Prometheus text format (HELP/TYPE lines,
 * counters, gauges, the fetch latency histogram, hit ratio per worker cache). */
void kvs_data_metrics_write(kvs_data_t *data, FILE *out);

/* --- added by kvstore/data (not part of the original contract) --- */

/* Pool pressure, bytes used / total in [0, 1]: the hook for a spill tier's
 * high-water mark. */
double kvs_data_pool_pressure(kvs_data_t *data);

/* Fragmentation figures of the pool (for Stats/metrics/tests). */
typedef struct kvs_data_pool_info {
    uint64_t total_bytes;        /* arena */
    uint64_t used_bytes;         /* allocated extents */
    uint64_t largest_free_bytes; /* largest free extent */
    uint64_t free_extents;       /* free extents */
    int hugepages;               /* 0 plain, 1 THP (madvise), 2 explicit hugetlb */
} kvs_data_pool_info_t;
void kvs_data_pool_info(kvs_data_t *data, kvs_data_pool_info_t *info_p);

/* --- prefix blocks (kvs_prefix.c; docs/kvstore-data.md "Prefix blocks") --- */

#define KVS_PFX_KEY 32u  /* CM_PFX_KEY_SIZE */

/* One published block as ListPrefixes shows it. */
typedef struct kvs_prefix_info {
    uint8_t key[KVS_PFX_KEY];
    char tenant[KVS_TENANT_MAX];     /* owner */
    uint64_t bytes;                  /* block length */
    uint32_t tokens;                 /* tokens it covers */
    uint32_t refs;                   /* sessions it is attached to */
    uint64_t created_unix_ms;
    bool on_disk;                    /* only in the spill tier */
} kvs_prefix_info_t;

/* How many of keys[0..n) (n x KVS_PFX_KEY bytes), from the first, this
 * tenant holds (*cached_p), and their tokens (*tokens_p).  Changes nothing
 * (not even recency).  RI_ERR_INVALID for bad arguments. */
ri_status_t kvs_data_prefix_lookup(kvs_data_t *data, const char *tenant, const uint8_t *keys, size_t n,
                                   uint32_t *cached_p, uint64_t *tokens_p);

/* This tenant's blocks (NULL: every tenant's, for an admin).  *infos_p is
 * cm_malloc'd (caller frees with cm_free; NULL when *n_p is 0). */
ri_status_t kvs_data_prefix_list(kvs_data_t *data, const char *tenant, kvs_prefix_info_t **infos_p, size_t *n_p);

/* Take key out of this tenant's catalog (NULL: out of every tenant's, for an
 * admin).  A block still attached leaves the catalog at once and is freed
 * at its last detach.  *n_p (may be NULL): blocks dropped; *bytes_p (may be
 * NULL): bytes freed now.  RI_ERR_NOT_FOUND when there is none. */
ri_status_t kvs_data_prefix_drop(kvs_data_t *data, const char *tenant, const uint8_t key[KVS_PFX_KEY],
                                 uint32_t *n_p, uint64_t *bytes_p);

/* Told when block key becomes held by this daemon (held: published, or
 * found in the spill tier by --recover) and when it stops being held
 * (dropped, evicted without a spill tier to take it, found corrupt).  A
 * block spilled to disk is still held.  Called with the catalog lock held,
 * from any thread: it must be quick and must not call kvs_data_*.  Keys
 * are salted per tenant, so a key names one tenant's block. */
typedef void (*kvs_prefix_hook_fn_t)(void *arg, const uint8_t key[KVS_PFX_KEY], bool held);

/* Install fn (NULL: remove the hook; no call runs after this returns).
 * When fn is set, it is first called (held = true) for every block held
 * now, under the same lock, so that it misses nothing and sees every later
 * change after.  arg is borrowed until the hook is removed.  The hook is
 * removed by kvs_data_destroy before it stops anything, so a clean stop,
 * which keeps the blocks on disk, tells nothing. */
void kvs_data_set_prefix_hook(kvs_data_t *data, kvs_prefix_hook_fn_t fn, void *arg);

#endif /* KVS_DATA_H */
