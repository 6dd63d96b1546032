/*
 * Private structures of kvstore/data shared by its files: the catalog
 * (sessions, cluster tables, tenants), counters, and the hooks between the
 * catalog (kvs_data.c), the op handlers (kvs_ops.c), the spill tier
 * (kvs_tier.c) and direct regions (kvs_direct.c).  Not for use outside
 * kvstore/data.
 *
 * Locking: data->lock guards the session list, tenants, every session's
 * tables/extents/caches and the counters that are not atomics.  It is never
 * held across a read-back's disk I/O, a cluster spill write, nor while reply
 * bytes move: a fetch plans and pins its misses under it (kvs_cluster_t.pins:
 * a pinned cluster is never spilled), reads disk records and sends without
 * it, and re-takes it to commit and to unpin; a spill marks its victims
 * (kvs_cluster_t.wstate), writes them without it and re-takes it to commit
 * or abandon each (docs/kvstore-data.md "Locking").  A request
 * holds a session reference, so the session outlives a drop meanwhile.
 * Each session is served by one data-plane thread only (its lane), so its
 * caches and tables are changed by one thread.
 *
 * This is the operations' header: the transport (kvs_dp*) never includes
 * it; the two meet in kvs_handler.h (dependency order there).
 */
#ifndef KVS_INTERNAL_H
#define KVS_INTERNAL_H

#include <pthread.h>
#include <stdatomic.h>

#include "common/cm_hist.h"
#include "kvstore/data/kvs_cache.h"
#include "kvstore/data/kvs_data.h"
#include "kvstore/data/kvs_handler.h"
#include "kvstore/data/kvs_pool.h"

#define KVS_TIER_POOL 0u      /* bytes are in the host pool at `off` */
#define KVS_TIER_DISK 1u      /* spilled: the spill store holds it under its key */
#define KVS_TIER_LOST 2u      /* its spill record failed verification: never served (CORRUPT) */
#define KVS_TIER_GONE 3u      /* no record after a crash: it was in memory only (LOST) */
#define KVS_TIER_BLOCK 4u     /* in the prefix block attached at slot `block` (kvs_prefix.c): never spilled
                               * or freed per cluster, off is from the block's start */

/* kvs_cluster_t.wstate: its bytes are being written to the spill store
 * (the pool pages stay valid and are what readers get), and whether it was
 * touched meanwhile (then the write is abandoned: it stays in the pool). */
#define KVS_WS_WRITING 1u
#define KVS_WS_TOUCHED 2u

#define KVS_MAX_SESSIONS 4096u
#define KVS_MAX_CACHES_PER_SESSION 64u
#define KVS_MAX_EXPECTED_TOKENS (UINT64_C(1) << 30)

/* One cluster of one (layer, KV head): its pages, cluster-major. */
typedef struct kvs_cluster {
    uint64_t off;            /* pool offset of its first page (tier POOL) */
    uint32_t tokens;         /* tokens in the cluster */
    uint32_t crc;            /* CRC32C of its pages as uploaded */
    uint64_t last_fetch_ns;  /* last time it was sent: coldness for spill */
    uint8_t tier;            /* KVS_TIER_* */
    bool direct;             /* off is in the session's direct region, not the pool */
    bool no_crc;             /* recovered from disk: crc unknown, the spill record's CRC stands */
    uint8_t wstate;          /* KVS_WS_* bits: a spill write of it is in flight without data->lock */
    uint32_t pins;           /* fetches using it without data->lock: never spilled or freed while > 0 */
    uint32_t block;          /* tier KVS_TIER_BLOCK: the session's attach slot of the block holding it */
} kvs_cluster_t;

/* The cluster table of one (layer, KV head). */
/* A cluster of a prefix block as the block holds it, once for every
 * session it is attached to (kvs_prefix.c): its first page's offset from
 * the block's start and its tokens. */
typedef struct kvs_bdesc {
    uint64_t off;
    uint32_t tokens;
    uint32_t pad;
} kvs_bdesc_t;

/* The clusters of one attached block in one table: ids [first, first +
 * count), descriptors d (the block's, borrowed while it is attached). */
typedef struct kvs_arun {
    uint32_t first, count, slot;
    const kvs_bdesc_t *d;
} kvs_arun_t;

/* One (layer, head) table of a session.  Cluster ids are positions: first
 * the attached blocks' clusters (ids below n_att, runs in attach order,
 * resolved through the blocks' own descriptors so that a session holds no
 * per-cluster state of a shared prefix), then its own (id n_att + i at
 * c[i]).  A block attached after own clusters gets own entries of tier
 * BLOCK instead.  Read an entry with kvs_table_get, change one with
 * kvs_table_own. */
typedef struct kvs_table {
    kvs_cluster_t *c;        /* own entries */
    uint32_t n, cap;         /* ids in use (attached + own) / own entries allocated */
    uint32_t n_att;          /* ids of the attached runs */
    kvs_arun_t *runs;        /* n_runs of cap_runs */
    uint32_t n_runs, cap_runs;
} kvs_table_t;

/* A pool extent a session owns (freed at drop). */
typedef struct kvs_sextent {
    uint64_t off, bytes;
} kvs_sextent_t;

/* A worker's block cache registered on a session. */
typedef struct kvs_wcache {
    uint32_t id;             /* 1.. within the session */
    const void *conn;        /* transport connection that registered it: an identity, never dereferenced */
    uint64_t recv_addr;      /* receive buffer address in the worker */
    uint64_t recv_len;       /* its length */
    kvs_cache_t *dir;        /* directory + LRU */
    struct kvs_session *owner; /* the session it belongs to (outlives it) */
    uint64_t charged;        /* directory bytes charged to the owner's tenant */
} kvs_wcache_t;

/* A session's direct region (kvs_direct.c): memory of its own, an anonymous
 * memory file (kvs_dp_region.c) whose descriptor only a holder of the
 * session's secret receives, over the handover socket, and maps read-only.
 * Clusters are carved from it front to back and never freed before it (it
 * is not spillable: a worker may read any of it at any time), so it is
 * freed whole with the session; a worker still mapping it keeps its own
 * session's bytes. */
typedef struct kvs_region {
    uint8_t *base;               /* its memory, mapped here read-write */
    uint64_t bytes;              /* length */
    uint64_t used;               /* carved so far */
    uint64_t hold_off;           /* pool extent held so the pool's budget counts it */
    int fd;                      /* the memory file (sealed: its size never changes) */
    uint64_t touches;            /* access records received (TOUCH) */
} kvs_region_t;

typedef struct kvs_session {
    uint64_t id;
    char tenant[KVS_TENANT_MAX];
    char label[KVS_LABEL_MAX];
    kvs_geometry_t geo;
    uint8_t secret[CM_WIRE_SECRET_SIZE];
    uint64_t created_unix_ms;
    uint64_t page_bytes;         /* 2 * page_tokens * head_dim * 2 (K and V) */
    uint64_t reserved_bytes;     /* from expected_tokens, charged to quota */
    uint64_t used_bytes;         /* pool bytes of its extents */
    uint64_t meta_bytes;         /* heap bytes of its caches' directories (tenant quota + own cap) */
    uint64_t clusters;           /* clusters stored */
    uint64_t disk_bytes;         /* payload bytes of its clusters in the spill store */
    kvs_table_t *tables;         /* layers * kv_heads, index layer*kv_heads+head */
    kvs_sextent_t *extents;      /* owned pool extents */
    kvs_region_t *region;        /* direct region (owned), NULL until MAP */
    struct kvs_pblock **blocks;  /* attached prefix blocks by slot (each referenced once per slot) */
    uint32_t n_blocks, cap_blocks;
    bool pfx_slots_only;         /* CM_PFX_ATTACH_F_SLOTS seen: attached blocks get no table entries */
    size_t n_extents, cap_extents;
    kvs_wcache_t *caches[KVS_MAX_CACHES_PER_SESSION]; /* NULL = free slot */
    uint32_t next_cache_id;
    int refs;                    /* list reference + data-plane users (under lock) */
    bool dropped;                /* no longer in the list */
    bool recovered;              /* rebuilt by --recover: clusters past its tables were lost, not never made */
    uint32_t dp_conns;           /* live data-plane connections: while > 0 the lease does not run */
    uint64_t lease_ns;           /* monotonic time the lease was last renewed (create, connect, disconnect, KeepAlive) */
} kvs_session_t;

typedef struct kvs_tenant {
    char name[KVS_TENANT_MAX];
    uint64_t quota;              /* 0 = no limit */
    uint64_t charged;            /* sum over sessions of max(reserved, used) */
    bool quota_set;              /* explicit quota (else the default) */
    uint64_t prefix_bytes;       /* memory of its prefix blocks (resident, in the catalog or not yet freed) */
} kvs_tenant_t;

/* A published prefix block (kvs_prefix.c; format common/cm_dp_prefix.h):
 * immutable bytes in a sealed anonymous memory file, mapped here read-only,
 * held in the tenant's catalog under its key and referenced once per
 * session slot it is attached to.  Unreferenced resident blocks in the
 * catalog are on the LRU, first to go under a cap or pool pressure: to the
 * spill tier when there is one (on_disk: no memory, read back at attach),
 * else out of the catalog. */
typedef struct kvs_pblock {
    uint8_t key[32];                 /* CM_PFX_KEY_SIZE */
    char tenant[KVS_TENANT_MAX];
    const uint8_t *base;             /* the block, mapped read-only (NULL when on disk) */
    uint64_t bytes;                  /* its length */
    uint64_t charge;                 /* pool bytes held for it (hold_off); 0 when on disk */
    uint64_t hold_off;               /* pool extent held so the pool's budget counts it */
    int fd;                          /* the memory file (sealed against every write); -1 when on disk */
    bool on_disk;                    /* its bytes are only in the spill store, records disk_id */
    uint64_t disk_id;                /* its records' id in the spill store (kvs_prefix_spill.c) */
    uint32_t n_tokens;               /* tokens of the block (header) */
    uint32_t refs;                   /* attached session slots */
    uint32_t pins;                   /* read-backs and spill writes in flight without the lock:
                                        while > 0 the block is not freed and its records stay */
    bool writing;                    /* resident, being written to the spill store without the
                                        lock: off the LRU (so nobody picks it again) */
    bool wtouched;                   /* attached during that write: the write is abandoned */
    bool in_catalog;                 /* reachable by key (a dropped block lives until its last detach) */
    kvs_bdesc_t *desc;               /* its clusters, table after table, made at its first attach
                                        (kvs_prefix.c), shared by every session it is attached to */
    uint32_t *tab_first;             /* [n_tables + 1]: table t's clusters are desc[tab_first[t]..] */
    uint64_t created_unix_ms;
    struct kvs_pblock *hnext;        /* hash chain */
    struct kvs_pblock *lru_prev, *lru_next; /* on the LRU when in the catalog, unreferenced, resident
                                                and not being written */
} kvs_pblock_t;

#define KVS_PFX_BUCKETS 4096u

/* The prefix catalog and its counters (data->lock). */
typedef struct kvs_pcat {
    kvs_pblock_t *buckets[KVS_PFX_BUCKETS];
    kvs_pblock_t *lru_head, *lru_tail;    /* head = least recently used */
    uint64_t max_bytes, tenant_max_bytes; /* caps (tenant 0 = only the global one) */
    uint64_t blocks, bytes;               /* resident blocks (in the catalog or awaiting their last detach) */
    uint64_t disk_blocks, disk_bytes;     /* blocks only in the spill store */
    uint64_t next_disk_id;                /* of the next block written to the spill store */
    _Atomic uint64_t mf_gen;              /* on-disk blocks forgotten so far (bumped under data->lock):
                                             the store manifest without their records is due */
    uint64_t spills, readbacks, corrupt;  /* blocks written out, read back, refused on read-back */
    uint64_t spill_abandoned;             /* written without the lock, then attached or dropped: kept */
    uint64_t attach_hits, attach_misses;  /* keys */
    uint64_t tokens_attached;
    uint64_t put_new, put_existed, put_refused;
    uint64_t evictions, dropped;
    kvs_prefix_hook_fn_t hook;            /* told when a key becomes held / stops (kvs_data_set_prefix_hook) */
    void *hook_arg;
} kvs_pcat_t;

/* Error kinds for counters and metrics. */
typedef enum kvs_err_kind {
    KVS_ERRK_PROTOCOL = 0,  /* malformed header or meta */
    KVS_ERRK_AUTH,          /* wrong session secret */
    KVS_ERRK_NOT_FOUND,     /* unknown session or cache */
    KVS_ERRK_RANGE,         /* ids, counts, lengths out of geometry */
    KVS_ERRK_QUOTA,         /* over a quota */
    KVS_ERRK_NOSPACE,       /* pool full */
    KVS_ERRK_TRANSPORT,     /* UCX failures */
    KVS_ERRK_OTHER,
    KVS_ERRK_COUNT
} kvs_err_kind_t;

typedef struct kvs_dp kvs_dp_t;

struct kvs_data {
    kvs_data_config_t cfg;           /* copy; dp_listen_addr points to listen_addr */
    char listen_addr[128];
    kvs_pool_t *pool;
    pthread_mutex_t lock;
    kvs_session_t **sessions;        /* KVS_MAX_SESSIONS slots */
    uint32_t n_sessions;
    uint64_t next_id;
    kvs_tenant_t *tenants;
    size_t n_tenants, cap_tenants;
    uint64_t global_quota;
    uint64_t global_charged;
    uint64_t meta_charged;           /* cache directories of all sessions (heap, own cap) */
    kvs_pcat_t prefix;               /* published prefix blocks (kvs_prefix.c) */
    bool draining;
    kvs_dp_t *dp;                    /* UCX data plane (NULL when not started); only kvs_data.c uses it */
    kvs_xport_t xport;               /* its services to the operations (ops NULL when not started) */
    /* spill tier (kvs_tier.c); spill == NULL when off */
    char spill_dir[4096];            /* cfg.spill_dir points here */
    struct kvs_spill *spill;         /* owned */
    struct kvs_spill_cold *cold;     /* owned: coldness of pool-resident clusters */
    uint64_t served_pool, served_disk;    /* clusters sent, by the tier they came from */
    uint64_t spilled_clusters, spilled_bytes, spill_failures, lost_clusters;
    uint64_t spill_abandoned;        /* written clusters not committed: touched, pinned or dropped meanwhile */
    bool spill_busy;                 /* a spill round owns the writer role (one at a time) */
    pthread_cond_t spill_cond;       /* signalled (with lock) when spill_busy clears */
    uint64_t smf_gen;                /* last session manifest snapshot's generation (under lock) */
    pthread_mutex_t smf_mu;          /* one manifest write at a time; never taken with lock held */
    uint64_t smf_disk_gen;           /* generation of the manifest on disk (under smf_mu) */
    pthread_mutex_t pmf_mu;          /* one store manifest write for forgotten prefix blocks at a
                                        time (kvs_prefix_mf_finish); never taken with lock held */
    uint64_t pmf_disk_gen;           /* prefix.mf_gen that write last put on disk (under pmf_mu) */
    /* counters (under lock) */
    uint64_t fetches, cache_hits, cache_misses, bytes_sent, bytes_received;
    uint64_t direct_regions, direct_bytes, direct_reads; /* live regions, their bytes, records */
    uint64_t errors[KVS_ERRK_COUNT];
    uint64_t ops[CM_WIRE_OP_MAX + 1];
    cm_hist_t fetch_lat;             /* fetch service time, seconds (bounds kvs_lat_bounds) */
    /* session leases (kvs_lease.c) */
    uint64_t sessions_expired;       /* sessions dropped because their lease ran out */
    pthread_t lease_thread;          /* the reaper; runs when cfg.lease_ms > 0 */
    pthread_cond_t lease_cond;       /* wakes the reaper to stop (with lock) */
    bool lease_running, lease_stop;
};

/* --- catalog helpers (kvs_data.c); all take data->lock held --- */

/* Find a live session by id; NULL when none. */
kvs_session_t *kvs_session_find_locked(kvs_data_t *data, uint64_t id);

/* Drop a data-plane reference; frees the session when it was the last. */
void kvs_session_unref_locked(kvs_data_t *data, kvs_session_t *s);

/* Charge `more` pool bytes to s (quota check, nothing changed on failure). */
ri_status_t kvs_session_charge_locked(kvs_data_t *data, kvs_session_t *s, uint64_t more);

/* Make room to record `more` extents without failing later. */
ri_status_t kvs_session_reserve_extents_locked(kvs_session_t *s, size_t more);

/* Record an extent as owned by s (after a successful charge + alloc). */
ri_status_t kvs_session_add_extent_locked(kvs_session_t *s, uint64_t off, uint64_t bytes);

/* Free a worker cache's directory. */
void kvs_wcache_free(kvs_data_t *data, kvs_wcache_t *wc);   /* data->lock held; gives back its charge */

/* Charge / give back heap memory a session's requests make us hold (cache
 * directories) against its tenant's quota and the daemon-wide directory cap
 * (a quarter of the pool, at least 64 MiB), data->lock held.  RI_ERR_QUOTA
 * when it does not fit. */
ri_status_t kvs_session_charge_meta_locked(kvs_data_t *data, struct kvs_session *s, uint64_t bytes);
void kvs_session_uncharge_meta_locked(kvs_data_t *data, struct kvs_session *s, uint64_t bytes);

/* Geometry check; page_tokens 0 means the default 8 (written back). */
bool kvs_geometry_check(kvs_geometry_t *g);

/* Find or add a tenant record; NULL when out of memory. */
kvs_tenant_t *kvs_tenant_get_locked(kvs_data_t *data, const char *name);

/* Take session s (at index i of data->sessions) out of the catalog and
 * release its quota, as DropSession does; its pages go when the last
 * data-plane reference ends.  *smf gets the disk work of the drop (spill
 * records, manifest): the caller runs kvs_tier_smf_finish on it after
 * releasing the lock, before answering.  Returns the bytes it held. */
struct kvs_tier_smf;
uint64_t kvs_session_remove_locked(kvs_data_t *data, uint32_t i, struct kvs_tier_smf *smf);

/* --- session leases (kvs_lease.c) --- */

/* Give every session already in the catalog (recovered by --recover) a
 * fresh lease and start the reaper thread when cfg.lease_ms > 0. */
ri_status_t kvs_lease_start(kvs_data_t *data);

/* Stop the reaper (no-op when it does not run). */
void kvs_lease_stop(kvs_data_t *data);

/* A data-plane connection of session_id opened (up) or closed: while a
 * session has one its lease does not run; the lease restarts when the last
 * one closes.  Lock held; an id no longer in the catalog is ignored. */
void kvs_lease_conn_locked(kvs_data_t *data, uint64_t session_id, bool up);

/* Count n error replies of status st. */
void kvs_count_errors_locked(kvs_data_t *data, ri_status_t st, uint64_t n);

/* Pages a cluster of `tokens` takes. */
static inline uint64_t kvs_cluster_pages(const kvs_session_t *s, uint32_t tokens)
{
    return ((uint64_t)tokens + s->geo.page_tokens - 1) / s->geo.page_tokens;
}

/* Give back `less` pool bytes charged to s (after a failed allocation). */
void kvs_session_uncharge_locked(kvs_data_t *data, kvs_session_t *s, uint64_t less);

/* Where a pool- or region-resident cluster's bytes are. */
static inline const uint8_t *kvs_cluster_data(kvs_data_t *data, const kvs_session_t *s, const kvs_cluster_t *c)
{
    if (c->tier == KVS_TIER_BLOCK)
        return s->blocks[c->block]->base + c->off;
    return c->direct ? s->region->base + c->off : kvs_pool_base(data->pool) + c->off;
}

/* Make room in table t for `more` clusters (RI_ERR_RANGE past the id space). */
ri_status_t kvs_table_reserve(kvs_table_t *t, uint64_t more);
/* Cluster id (< t->n) by value; an attached run's is made from its block's
 * descriptor (tier BLOCK, its slot). */
kvs_cluster_t kvs_table_get(const kvs_table_t *t, uint32_t id);
/* The session's own entry of cluster id, NULL for an attached run's (which
 * has no per-session state: never spilled, pinned or aged). */
kvs_cluster_t *kvs_table_own(kvs_table_t *t, uint32_t id);

/* --- prefix blocks (kvs_prefix.c) --- */

/* Set the caps from the config (max_bytes 0 = a quarter of the pool). */
void kvs_prefix_init(kvs_data_t *data);

/* Free every block (after every session is freed). */
void kvs_prefix_destroy(kvs_data_t *data);

/* PREFIX_ATTACH / PREFIX_PUT / PREFIX_GET (common/cm_dp_prefix.h); lock not
 * held.  GET answers itself through reply. */
ri_status_t kvs_prefix_attach(kvs_data_t *data, kvs_session_t *s, const cm_wire_hdr_t *hdr, const uint8_t *body,
                              uint8_t **reply_p, size_t *reply_len_p);
ri_status_t kvs_prefix_put(kvs_data_t *data, kvs_session_t *s, const cm_wire_hdr_t *hdr, const uint8_t *body,
                           uint8_t **reply_p, size_t *reply_len_p);
ri_status_t kvs_prefix_get(kvs_data_t *data, kvs_session_t *s, const cm_wire_hdr_t *hdr, const uint8_t *body,
                           kvs_reply_obj_t *reply);

/* The session is being freed: detach its blocks (a block dropped from the
 * catalog goes with its last detach).  Lock held. */
void kvs_prefix_detach_all_locked(kvs_data_t *data, kvs_session_t *s);

/* Pool pressure: evict unreferenced blocks, least recently used first,
 * until `bytes` pool bytes were freed or none is left.  Returns the bytes
 * freed.  Lock held. */
uint64_t kvs_prefix_reclaim_locked(kvs_data_t *data, uint64_t bytes);

/* The same for the spill writer (kvs_tier.c, holding the writer role): each
 * block is written to the spill store WITHOUT data->lock (released and
 * taken again per block); a block attached or dropped during its write
 * stays (or goes with its drop) and its records are forgotten.  Returns the
 * pool bytes freed. */
uint64_t kvs_prefix_reclaim_writer_locked(kvs_data_t *data, uint64_t bytes);

/* A new descriptor of the block attached to s at slot (caller closes).  Lock held. */
ri_status_t kvs_prefix_handover_locked(kvs_session_t *s, uint32_t slot, int *fd_p, uint64_t *bytes_p);

/* --- prefix blocks in the spill tier (kvs_prefix_spill.c); lock held --- */

/* Write resident, unreferenced b to the spill store and give its memory back
 * (it stays in the catalog, on disk), all under the lock: for the shutdown
 * write-out only (nothing is served then; every other eviction writes
 * without the lock).  Nothing changes on failure. */
ri_status_t kvs_prefix_spill_locked(kvs_data_t *data, kvs_pblock_t *b);

/* The same in steps, for a write without the lock (kvs_prefix.c: the spill
 * writer's reclaim and the evictions that make room under the caps):
 *   kvs_prefix_disk_write          (lock NOT needed) writes b's records under
 *                                  id, then the manifest; on failure removes
 *                                  what it wrote.  b must stay resident and
 *                                  unchanged (pinned, marked writing);
 *   kvs_prefix_disk_commit_locked  gives b's memory back: on disk under id;
 *   kvs_prefix_disk_abandon_locked forgets id's records instead (b was
 *                                  attached or dropped meanwhile); true when
 *                                  b was dropped: the caller then writes the
 *                                  store's manifest (kvs_spill_sync) after
 *                                  releasing the lock, so that a crash's
 *                                  tail scan does not bring b back. */
ri_status_t kvs_prefix_disk_write(kvs_data_t *data, const kvs_pblock_t *b, uint64_t id);
void kvs_prefix_disk_commit_locked(kvs_data_t *data, kvs_pblock_t *b, uint64_t id);
bool kvs_prefix_disk_abandon_locked(kvs_data_t *data, const kvs_pblock_t *b, uint64_t id);

/* Read the records of an on-disk block (disk_id, bytes long) back into a
 * new sealed memory file, verifying every record and the block's own CRC:
 * *tmp_p (unaccounted, for kvs_prefix_install_locked or
 * kvs_prefix_discard) on success.  Lock NOT held: the caller pins the
 * block (kvs_pblock_t.pins) so that its records stay.  RI_ERR_CORRUPT,
 * RI_ERR_NOT_FOUND, RI_ERR_TRUNCATED, RI_ERR_PROTOCOL: the records fail. */
ri_status_t kvs_prefix_read_back(kvs_data_t *data, uint64_t disk_id, uint64_t bytes, kvs_pblock_t **tmp_p);

/* Make on-disk b resident with tmp's memory file (kvs_prefix_read_back;
 * consumed, except on RI_ERR_BUSY), under the caps; b's records are then
 * forgotten.  On failure (caps, pool) b stays on disk; RI_ERR_BUSY: room
 * must be written out first, without the lock (kvs_prefix_hold_locked). */
ri_status_t kvs_prefix_install_locked(kvs_data_t *data, kvs_pblock_t *b, kvs_tenant_t *t, kvs_pblock_t *tmp);

/* Unmap, close and free tmp (kvs_prefix_read_back's, never admitted). */
void kvs_prefix_discard(kvs_pblock_t *tmp);

/* Forget on-disk b's records, in memory only: the store's manifest
 * without them (so that a crash's tail scan does not bring a dropped block
 * back) is due, counted in data->prefix.mf_gen, and written after the
 * caller releases the lock: it notes kvs_prefix_mf_gen_locked when it
 * takes the lock, kvs_prefix_mf_due_locked before it releases it, and runs
 * kvs_prefix_mf_finish on that before it answers. */
void kvs_prefix_disk_forget_locked(kvs_data_t *data, kvs_pblock_t *b);

/* The forget generation now (lock held). */
uint64_t kvs_prefix_mf_gen_locked(const kvs_data_t *data);

/* The generation the caller's forgets since gen0 need on disk; 0 when it
 * forgot nothing (lock held). */
uint64_t kvs_prefix_mf_due_locked(const kvs_data_t *data, uint64_t gen0);

/* With data->lock NOT held: have the store's manifest of generation gen,
 * or a newer one, on disk (one write at a time under data->pmf_mu; skipped
 * when a write since covered gen).  A no-op for gen 0.  Returns RI_OK or
 * the write's error (logged). */
ri_status_t kvs_prefix_mf_finish(kvs_data_t *data, uint64_t gen);

/* --recover: put the blocks the spill store holds back in the catalog, on disk. */
void kvs_prefix_recover_locked(kvs_data_t *data);

/* True for spill-store keys of prefix blocks (never a session's). */
bool kvs_prefix_disk_key(uint64_t session);

/* Shared with kvs_prefix.c: a sealed read-only memory file of len bytes of
 * buf (*b_p: a new unaccounted block); make room under the caps for need
 * bytes of tenant t, hold its pool extent and account it (never writes:
 * RI_ERR_BUSY when, with a spill tier, that would need a block written out
 * first; the caller then makes room without the lock and retries). */
ri_status_t kvs_prefix_make(const uint8_t *buf, uint64_t len, kvs_pblock_t **b_p);
ri_status_t kvs_prefix_hold_locked(kvs_data_t *data, kvs_tenant_t *t, kvs_pblock_t *b);
void kvs_prefix_insert_locked(kvs_data_t *data, kvs_pblock_t *b);
kvs_pblock_t *kvs_prefix_find_locked(kvs_data_t *data, const char *tenant, const uint8_t *key);
void kvs_prefix_unlink_locked(kvs_data_t *data, kvs_pblock_t *b);

/* Append the prefix metrics.  Lock held. */
void kvs_prefix_metrics_write_locked(kvs_data_t *data, FILE *out);

/* --- direct reads (kvs_direct.c) --- */

/* MAP / LOCATE / TOUCH (common/cm_dp_direct.h); lock not held. */
ri_status_t kvs_direct_map(kvs_data_t *data, kvs_session_t *s, const cm_wire_hdr_t *hdr, uint8_t **reply_p,
                           size_t *reply_len_p);
ri_status_t kvs_direct_locate(kvs_data_t *data, kvs_session_t *s, const cm_wire_hdr_t *hdr, const uint8_t *body,
                              uint8_t **reply_p, size_t *reply_len_p);
ri_status_t kvs_direct_touch(kvs_data_t *data, kvs_session_t *s, const cm_wire_hdr_t *hdr, const uint8_t *body);

/* Carve bytes for an upload from s's region; false (nothing taken) when it
 * has none or no room: the caller uses the pool.  Lock held. */
bool kvs_direct_take_locked(kvs_session_t *s, uint64_t bytes, uint64_t *off_p);

/* Free s's region (session free); lock held. */
void kvs_direct_free_locked(kvs_data_t *data, kvs_session_t *s);

/* The handover: a new descriptor of session_id's object (*fd_p, caller
 * closes) and its length, when secret is the session's and it has that
 * object: 0 its region (MAP made it), slot + 1 the prefix block attached at
 * slot.  RI_ERR_UNAUTHENTICATED otherwise, alike for every reason. */
ri_status_t kvs_direct_handover(kvs_data_t *data, uint64_t session_id, const uint8_t secret[CM_WIRE_SECRET_SIZE],
                                uint32_t object, int *fd_p, uint64_t *bytes_p);

/* --- op handlers (kvs_ops.c) --- */

/* The handler table the transport is started with (kvs_handler.h): every
 * request, connection event and handover goes through it.  h->arg is data. */
void kvs_ops_handlers(kvs_data_t *data, kvs_handlers_t *h);

/* --- spill tier (kvs_tier.c); every _locked function takes data->lock held --- */

/* True when a spill directory is configured.  Then every cluster has its own
 * pool extent (owned by its table entry, not by s->extents), so that spilling
 * one really gives its pages back. */
static inline bool kvs_tier_on(const kvs_data_t *data)
{
    return data->spill != NULL;
}

/* Open (or recover) the spill store; called by kvs_data_create. */
ri_status_t kvs_tier_open(kvs_data_t *data);

/* Write every pool-resident cluster out (so a --recover restart finds it),
 * write the session manifest and close the store; called by kvs_data_destroy
 * once the data plane has stopped. */
void kvs_tier_close(kvs_data_t *data);

/* Allocate one pool extent per cluster (sizes[i] bytes) for s, charging the
 * quota; when the pool or the quota is short, spill the coldest clusters and
 * retry once.  All or nothing: on failure nothing is allocated or charged.
 * A spill releases data->lock during its disk write (the caller holds a
 * reference on s; other sessions change meanwhile): RI_ERR_NOT_FOUND when s
 * was dropped then. */
ri_status_t kvs_tier_alloc_clusters_locked(kvs_data_t *data, kvs_session_t *s, const uint64_t *sizes, size_t n,
                                           uint64_t *offs);

/* Spill the coldest clusters while the pool is above the high-water mark;
 * releases data->lock during the disk write, and does nothing while another
 * spill is writing (that one frees the room). */
void kvs_tier_relieve_locked(kvs_data_t *data);

/* A cluster became pool-resident or was fetched from the pool: make it the
 * most recently used. */
void kvs_tier_touch_locked(kvs_data_t *data, kvs_session_t *s, uint32_t layer, uint32_t head, uint32_t id);

/* Reading a fetch's disk-resident misses back, in three steps so that the
 * disk I/O runs without data->lock:
 *   kvs_tier_read_plan_locked  (lock held) records what to read and pins each
 *                              cluster (c->pins) so that nothing frees it;
 *   kvs_tier_read              (lock NOT held) reads the batch from the spill
 *                              store and verifies each record against the
 *                              CRC the plan captured;
 *   kvs_tier_read_finish_locked (lock held) marks a cluster whose record
 *                              failed verification lost.
 * The caller unpins with kvs_tier_unpin_locked when its bytes are out. */
typedef struct kvs_tier_read {
    uint32_t layer, head, id;  /* cluster */
    uint64_t bytes;            /* payload bytes expected */
    uint32_t crc;              /* its CRC32C as uploaded (plan) */
    bool no_crc;               /* crc unknown (recovered): the record's own CRC stands */
    ri_status_t status;        /* out: RI_OK, RI_ERR_CORRUPT, or the read's error */
    const uint8_t *src;        /* out: where its bytes are */
} kvs_tier_read_t;
void kvs_tier_read_plan_locked(kvs_session_t *s, uint32_t layer, uint32_t head, uint32_t id, kvs_tier_read_t *rd);
/* Read rd[0..n) of session_id into one buffer (*buf_p, cm_malloc'd, the
 * caller frees) and point each rd[i].src into it.  The first error (a
 * CORRUPT one first), nothing in *buf_p then. */
ri_status_t kvs_tier_read(kvs_data_t *data, uint64_t session_id, kvs_tier_read_t *rd, size_t n, uint8_t **buf_p);
void kvs_tier_read_finish_locked(kvs_data_t *data, kvs_session_t *s, const kvs_tier_read_t *rd, size_t n);

/* Pin / unpin a cluster a fetch uses without the lock: a pinned cluster is
 * never spilled (its pool pages stay where the fetch reads them).  Unpinning
 * the last pin of a pool-resident cluster makes it the most recently used
 * again (a spill that skipped it took it off the coldness list). */
void kvs_tier_pin_locked(kvs_session_t *s, uint32_t layer, uint32_t head, uint32_t id);
void kvs_tier_unpin_locked(kvs_data_t *data, kvs_session_t *s, uint32_t layer, uint32_t head, uint32_t id);

/* Free the pool extents of s's pool-resident clusters (session free). */
void kvs_tier_session_free_locked(kvs_data_t *data, kvs_session_t *s);

/* A session manifest change: snapshotted under data->lock (memory only),
 * finished after the lock is released and before the change is answered
 * (kvs_tier_smf_finish), so that no manifest write holds the catalog. */
typedef struct kvs_tier_smf {
    uint8_t *buf;      /* the encoded manifest (owned; NULL: nothing to write) */
    size_t len;        /* its bytes */
    uint64_t gen;      /* its generation (data->smf_gen): snapshots in catalog order */
    uint64_t drop_id;  /* a dropped session whose spill records go first (0: none) */
    ri_status_t st;    /* RI_ERR_NOMEM when the snapshot could not be taken */
} kvs_tier_smf_t;

/* A session was dropped (lock held): forget its coldness entries and
 * snapshot the manifest without it into *smf (memory only).  The caller
 * runs kvs_tier_smf_finish once it released the lock. */
void kvs_tier_session_dropped_locked(kvs_data_t *data, uint64_t id, kvs_tier_smf_t *smf);

/* A session was created (lock held): snapshot the manifest with it into
 * *smf.  The caller runs kvs_tier_smf_finish once it released the lock and
 * undoes the creation when that fails. */
void kvs_tier_session_created_locked(kvs_data_t *data, kvs_tier_smf_t *smf);

/* Finish a manifest change with data->lock NOT held: free a dropped
 * session's spill records (the store's manifest written), then write the
 * snapshot unless a newer one is on disk already (waits for a manifest
 * write in flight).  Frees the snapshot; a no-op for an empty *smf (tier
 * off).  Returns RI_OK, or the manifest's error (RI_ERR_NOSPACE on a full
 * disk, RI_ERR_NOMEM from the snapshot), logged. */
ri_status_t kvs_tier_smf_finish(kvs_data_t *data, kvs_tier_smf_t *smf);

/* Append the tier's counters and the spill store's metrics. */
void kvs_tier_metrics_write_locked(kvs_data_t *data, FILE *out);

/* Give back at least bytes of pool by evicting unreferenced prefix blocks
 * (fewer when the LRU runs out).  With a spill tier they are written out as
 * the spill writer does (writer role taken, waiting for a spill in flight;
 * data->lock released for each block's write: the caller checks again what
 * it looked at, e.g. whether its session was dropped); without one they are
 * dropped from memory under the lock.  Returns the pool bytes freed. */
uint64_t kvs_tier_reclaim_prefix_locked(kvs_data_t *data, uint64_t bytes);

/* Close the spill store and the coldness tracker (after every session is freed). */
void kvs_tier_destroy_store(kvs_data_t *data);

/* Disk bytes of the spill store (0 when off). */
uint64_t kvs_tier_disk_bytes(kvs_data_t *data);

#endif /* KVS_INTERNAL_H */
