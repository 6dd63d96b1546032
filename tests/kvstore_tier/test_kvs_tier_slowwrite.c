/*
 * A slow spill WRITE holds no other session, and what happens to its
 * victims meanwhile is committed or abandoned correctly: kvs_data with its
 * real UCX data plane on loopback (two lanes), a spill tier whose pwrite is
 * overridden (kvs_io_ops_t, no io_uring) to take 500 ms once armed, and two
 * sessions A and B on different lanes.  A is uploaded first, so its
 * clusters are the coldest: every spill picks A's clusters first.  Each
 * test starts a fresh kvs_data.
 *
 * - other_session_not_held: A's own append pushes the pool over its mark
 *   and spills (A's lane sits in the held write); B's fetches and appends
 *   meanwhile each complete well under 100 ms.  Afterwards every A cluster
 *   fetches bit-exact, some from disk.
 * - touch_during_write: B's append spills A's clusters; A fetches some of
 *   them while they are being written (served from memory).  Those stay in
 *   the pool (the write is abandoned), the rest of the batch is on disk;
 *   the store's records equal the spilled clusters, the pool's bytes equal
 *   the resident clusters.
 * - drop_during_write: B's append spills A's clusters and A is dropped
 *   while they are being written: no record of A is left in the store, no
 *   pool byte of A is left, B's data stays bit-exact; dropping B too leaves
 *   the pool empty.
 * - drop_sync_not_held: the store manifest written after a spill abandoned
 *   for a dropped session is held 500 ms; a CreateSession meanwhile
 *   completes well under 100 ms (it needs the catalog lock).
 * - prefix_attach_during_write / prefix_drop_during_write: an unreferenced
 *   prefix block goes first under pool pressure; while its write is held,
 *   A attaches it (quickly, from memory: it stays resident, bit-exact, its
 *   records forgotten), or DropPrefix drops it (freed after the write: no
 *   pool byte, no record left).
 * - prefix_cap_not_held: A's PUT of a second block over --prefix-max-bytes
 *   writes the first out (held); B's fetches and appends meanwhile each
 *   complete well under 100 ms; the first block comes back bit-exact.
 * - prefix_pool_race_not_held: the pool is full (two unreferenced blocks
 *   fill what the sessions leave) and two sessions on two lanes PUT a block
 *   each at once: the first PUT's room is written out (held), the second
 *   waits for that writer and writes its own; neither write holds the
 *   catalog lock, so B's fetches on a third lane complete well under
 *   100 ms meanwhile, and both PUTs succeed (or would get the retryable
 *   RI_ERR_QUOTA); both evicted blocks come back bit-exact.
 * - prefix_readback_sync_not_held: an ATTACH reads an on-disk block back
 *   and forgets its records; the store manifest without them is held
 *   500 ms: B's fetches and appends meanwhile each complete well under
 *   100 ms, and the ATTACH answers only after that write.
 * - manifest_write_not_held: the session manifest's rename held 500 ms
 *   during a CreateSession, then during a DropSession: A's and B's fetches
 *   and appends meanwhile each complete well under 100 ms; each call
 *   answers only after its manifest is on disk (listing the new session,
 *   then no longer).
 * - manifest_storm: threads create and drop sessions at once with the
 *   manifest writes jittered; the manifest on disk lists exactly the
 *   sessions left (an older snapshot never overwrites a newer one).
 */
#define _GNU_SOURCE
#include <errno.h>
#include <pthread.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <cmocka.h>

#include "common/cm_crc32c.h"
#include "common/cm_dp_prefix.h"
#include "common/cm_dp_proto.h"
#include "common/cm_status.h"
#include "common/cm_time.h"
#include "gpuworker/client/gw_dp.h"
#include "kvstore/data/kvs_data.h"
#include "kvstore/spill/kvs_spill_io.h"

#define HEADS 2
#define DIM 64
#define PT 8
#define CL_BYTES (4u * PT * DIM)       /* one page of K and V, fp16: 2 KiB (one 4 KiB pool unit) */
#define POOL_UNIT 4096u
#define CLUSTERS 256                   /* per head at upload: 2 MiB of pool per session */
#define SPILL_APPEND 128               /* per head: pushes the pool over its mark */
#define FETCH_N 16                     /* clusters per head per fetch */
#define RECV_BYTES ((size_t)HEADS * FETCH_N * CL_BYTES)
#define SLOW_MS 500u
#define FAST_MS 100u
#define B_OPS 8

/* The overridden pwrite: once armed, the next write sleeps SLOW_MS. */
static kvs_io_ops_t g_ops;
static atomic_int g_armed, g_in_slow;

static ssize_t slow_pwrite(void *arg, int fd, const void *buf, size_t len, off_t off)
{
    (void)arg;
    if (atomic_exchange(&g_armed, 0)) {
        atomic_store(&g_in_slow, 1);
        cm_time_sleep_ns((uint64_t)SLOW_MS * 1000000u);
        atomic_store(&g_in_slow, 0);
    }
    return pwrite(fd, buf, len, off);
}

/* The overridden rename: the session manifest's, once armed, sleeps
 * SLOW_MS; with jitter, every one sleeps 0-3 ms (writes queue up), and a
 * manifest whose next session id is below the one written before (an
 * older snapshot after a newer) is noted. */
static atomic_int g_smf_armed, g_smf_in_slow, g_smf_jitter, g_smf_regressed;
static uint64_t g_smf_last_next;

static void smf_check_order(const char *tmp)
{
    uint8_t hdr[24];
    FILE *f = fopen(tmp, "rb");
    if (f == NULL || fread(hdr, 1, sizeof(hdr), f) != sizeof(hdr)) {
        atomic_store(&g_smf_regressed, 1);
    } else {
        uint64_t next = cm_dp_get64(hdr + 16);
        if (next < g_smf_last_next) /* renames of the manifest are serialised by the daemon */
            atomic_store(&g_smf_regressed, 1);
        g_smf_last_next = next;
    }
    if (f != NULL)
        fclose(f);
}

/* The spill store's own manifest (MANIFEST): once armed, its next
 * rename sleeps SLOW_MS. */
static atomic_int g_mf_armed, g_mf_in_slow;

static int slow_rename(void *arg, const char *from, const char *to)
{
    (void)arg;
    if (strstr(from, "/MANIFEST.tmp") != NULL && atomic_exchange(&g_mf_armed, 0)) {
        atomic_store(&g_mf_in_slow, 1);
        cm_time_sleep_ns((uint64_t)SLOW_MS * 1000000u);
        atomic_store(&g_mf_in_slow, 0);
    }
    if (strstr(from, "sessions.manifest") != NULL) {
        if (atomic_exchange(&g_smf_armed, 0)) {
            atomic_store(&g_smf_in_slow, 1);
            cm_time_sleep_ns((uint64_t)SLOW_MS * 1000000u);
            atomic_store(&g_smf_in_slow, 0);
        } else if (atomic_load(&g_smf_jitter)) {
            smf_check_order(from);
            cm_time_sleep_ns((uint64_t)(rand() % 4) * 1000000u);
        }
    }
    return rename(from, to);
}

/* No io_uring: every write goes through pwrite (the caller falls back). */
static int no_uring(void *arg, unsigned entries, struct io_uring *ring)
{
    (void)arg;
    (void)entries;
    (void)ring;
    return -ENOSYS;
}

typedef struct sess {
    uint64_t id;
    uint8_t secret[16];
    gw_dp_t *dp;
    uint32_t n;                        /* clusters per head so far */
    uint8_t *recv;
} sess_t;

static kvs_data_t *g_data;
static char g_dir[64];
static sess_t g_a, g_b;

static void gen_cluster(uint64_t sid, uint32_t h, uint32_t c, uint8_t *out)
{
    uint64_t x = 0x9e3779b97f4a7c15ull ^ (sid << 40) ^ ((uint64_t)h << 20) ^ c;
    for (size_t i = 0; i < CL_BYTES; i += 8) {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        memcpy(out + i, &x, 8);
    }
}

/* Upload (append false, s->n == 0) or append n clusters per head to s. */
static ri_status_t put(sess_t *s, bool append, uint32_t n)
{
    uint32_t heads[HEADS] = {0, 1}, counts[HEADS] = {n, n}, ids[HEADS];
    uint32_t *tokens = malloc(sizeof(uint32_t) * HEADS * n);
    uint8_t *buf = malloc((size_t)HEADS * n * CL_BYTES);
    ri_status_t st = RI_ERR_NOMEM;

    if (tokens != NULL && buf != NULL) {
        for (uint32_t h = 0; h < HEADS; h++)
            for (uint32_t c = 0; c < n; c++) {
                tokens[h * n + c] = PT;
                gen_cluster(s->id, h, s->n + c, buf + ((size_t)h * n + c) * CL_BYTES);
            }
        st = gw_dp_upload(s->dp, append, 0, HEADS, heads, counts, tokens, buf, (size_t)HEADS * n * CL_BYTES, ids);
        if (st == RI_OK && ids[0] != s->n)
            st = RI_ERR_INTERNAL;
        if (st == RI_OK)
            s->n += n;
    }
    free(tokens);
    free(buf);
    return st;
}

static void open_session(sess_t *s)
{
    static const kvs_geometry_t g = {.layers = 1, .kv_heads = HEADS, .head_dim = DIM, .dtype = KVS_DTYPE_F16,
                                     .page_tokens = PT};

    memset(s, 0, sizeof(*s));
    assert_int_equal(kvs_data_session_create(g_data, "t", &g, 0, "slowwrite", &s->id, s->secret), RI_OK);
    assert_int_equal(gw_dp_connect(kvs_data_address(g_data, s->id), s->id, s->secret, NULL, &s->dp), RI_OK);
    assert_int_equal(put(s, false, CLUSTERS), RI_OK);
    s->recv = malloc(RECV_BYTES);
    assert_non_null(s->recv);
}

/* Fetch clusters [first0, first0 + FETCH_N) of head 0 and [first1, ..) of
 * head 1 through a cache registered for this fetch alone (every entry a
 * miss); RI_OK only with every byte right.  *disk_p: entries served from
 * disk. */
static ri_status_t fetch2(sess_t *s, uint32_t first0, uint32_t first1, uint32_t *disk_p)
{
    uint32_t heads[HEADS] = {0, 1}, counts[HEADS] = {FETCH_N, FETCH_N}, ids[HEADS * FETCH_N], cache_id;
    uint8_t want[CL_BYTES];
    gw_dp_fetch_result_t res;
    ri_status_t st;

    st = gw_dp_register_cache_mode(s->dp, HEADS * FETCH_N, s->recv, RECV_BYTES, GW_DP_RECV_INLINE, &cache_id, NULL);
    if (st != RI_OK)
        return st;
    for (uint32_t k = 0; k < HEADS * FETCH_N; k++)
        ids[k] = (k < FETCH_N ? first0 : first1) + k % FETCH_N;
    st = gw_dp_fetch_ranked(s->dp, cache_id, 0, HEADS, heads, counts, ids, 0, 30000, &res);
    if (st != RI_OK)
        return st;
    *disk_p = 0;
    for (uint32_t k = 0; k < HEADS * FETCH_N; k++) {
        cm_dp_entry_t en;
        cm_dp_reply_entry(&res.view, k, &en);
        if (!(en.flags & CM_DP_F_MISS)) {
            st = RI_ERR_INTERNAL; /* a fresh cache: every entry must be a miss */
            continue;
        }
        *disk_p += !!(en.flags & CM_DP_F_FROM_DISK);
        gen_cluster(s->id, k / FETCH_N, ids[k], want);
        if (memcmp(s->recv + en.recv_offset, want, CL_BYTES) != 0)
            st = RI_ERR_CORRUPT;
    }
    gw_dp_fetch_result_free(&res);
    return st;
}

/* One counter or gauge of kvs_data's /metrics text. */
static uint64_t metric(const char *name)
{
    char *text = NULL, *p;
    size_t len = 0;
    FILE *f = open_memstream(&text, &len);
    uint64_t v = UINT64_MAX;
    size_t nl = strlen(name);

    assert_non_null(f);
    kvs_data_metrics_write(g_data, f);
    fclose(f);
    for (p = text; p != NULL && *p; p = strchr(p, '\n'), p = p ? p + 1 : NULL)
        if (strncmp(p, name, nl) == 0 && p[nl] == ' ') {
            v = strtoull(p + nl + 1, NULL, 10);
            break;
        }
    free(text);
    assert_true(v != UINT64_MAX);
    return v;
}

static uint64_t pool_used(void)
{
    kvs_data_pool_info_t pi;
    kvs_data_pool_info(g_data, &pi);
    return pi.used_bytes;
}

typedef struct bg_append {
    sess_t *s;
    ri_status_t st;
    uint64_t ns;
} bg_append_t;

static void *bg_append_main(void *arg)
{
    bg_append_t *a = arg;
    uint64_t t0 = cm_time_ns();
    a->st = put(a->s, true, SPILL_APPEND);
    a->ns = cm_time_ns() - t0;
    return NULL;
}

/* Arm the slow write, start s's spilling append on a thread and wait until
 * its spill sits in the held write. */
static void start_slow(pthread_t *t, bg_append_t *a, sess_t *s)
{
    uint64_t deadline = cm_time_ns() + 5000000000ull;

    a->s = s;
    atomic_store(&g_armed, 1);
    assert_int_equal(pthread_create(t, NULL, bg_append_main, a), 0);
    while (!atomic_load(&g_in_slow) && cm_time_ns() < deadline)
        cm_time_sleep_ns(1000000);
    assert_true(atomic_load(&g_in_slow));
}

static void test_other_session_not_held(void **state)
{
    (void)state;
    pthread_t t;
    bg_append_t a = {0};
    uint64_t worst = 0, disk = 0;

    start_slow(&t, &a, &g_a);
    for (uint32_t i = 0; i < B_OPS; i++) {
        uint32_t d = 0;
        uint64_t t0 = cm_time_ns();
        assert_int_equal(fetch2(&g_b, i * FETCH_N, i * FETCH_N, &d), RI_OK);
        worst = CM_MAX(worst, cm_time_ns() - t0);
        t0 = cm_time_ns();
        assert_int_equal(put(&g_b, true, 4), RI_OK);
        worst = CM_MAX(worst, cm_time_ns() - t0);
    }
    bool overlapped = atomic_load(&g_in_slow) != 0;
    assert_int_equal(pthread_join(t, NULL), 0);
    printf("A's spilling append: %.0f ms; B: %d fetches + %d appends meanwhile, slowest %.1f ms\n",
           (double)a.ns / 1e6, B_OPS, B_OPS, (double)worst / 1e6);
    assert_int_equal(a.st, RI_OK);
    assert_true(a.ns >= (uint64_t)SLOW_MS * 1000000u);
    assert_true(overlapped);              /* every op of B ran while A's write was held */
    assert_true(worst < (uint64_t)FAST_MS * 1000000u);
    /* The spill committed: every cluster of A is intact, the coldest from disk. */
    for (uint32_t i = 0; i < g_a.n / FETCH_N; i++) {
        uint32_t d = 0;
        assert_int_equal(fetch2(&g_a, i * FETCH_N, i * FETCH_N, &d), RI_OK);
        disk += d;
    }
    assert_true(disk > 0);
    assert_int_equal(disk, metric("ri_kvs_spilled_clusters_total"));
    assert_int_equal(metric("kvs_spill_records"), disk);
}

static void test_touch_during_write(void **state)
{
    (void)state;
    pthread_t t;
    bg_append_t a = {0};
    uint32_t d = 0;
    uint64_t spilled, resident;

    start_slow(&t, &a, &g_b);             /* B's append spills A's coldest: head 0 from cluster 0 on */
    assert_int_equal(fetch2(&g_a, 0, CLUSTERS - FETCH_N, &d), RI_OK);
    assert_int_equal(d, 0);               /* served from memory while being written */
    bool overlapped = atomic_load(&g_in_slow) != 0;
    assert_int_equal(pthread_join(t, NULL), 0);
    assert_true(overlapped);
    assert_int_equal(a.st, RI_OK);
    /* The touched clusters' writes were abandoned: still in memory. */
    assert_true(metric("ri_kvs_spill_abandoned_total") >= FETCH_N);
    assert_int_equal(fetch2(&g_a, 0, CLUSTERS - FETCH_N, &d), RI_OK);
    assert_int_equal(d, 0);
    /* Their batch-mates went to disk. */
    assert_int_equal(fetch2(&g_a, FETCH_N, CLUSTERS - FETCH_N, &d), RI_OK);
    assert_int_equal(d, FETCH_N);
    /* Nothing leaked: one live record per spilled cluster, pool bytes for
     * exactly the clusters still resident. */
    spilled = metric("ri_kvs_spilled_clusters_total");
    resident = (uint64_t)HEADS * (g_a.n + g_b.n) - spilled;
    assert_int_equal(metric("kvs_spill_records"), spilled);
    assert_int_equal(pool_used(), resident * POOL_UNIT);
}

/* --- prefix blocks ----------------------------------------------------- */

/* A block of the sessions' geometry: each (layer, head) table holds two
 * one-page clusters, pages filled from seed; CRC set. */
static uint8_t *make_block(uint32_t seed, uint64_t *len_p)
{
    const uint32_t nt = HEADS, per = 2, worker = 64;
    uint64_t tables = cm_pfx_tables_bytes(nt, per * nt), pages = (uint64_t)nt * per * CL_BYTES;
    cm_pfx_hdr_t h = {.layers = 1, .kv_heads = HEADS, .head_dim = DIM, .dtype = KVS_DTYPE_F16, .page_tokens = PT,
                      .first_pos = 0, .n_tokens = PT * per, .tables_bytes = tables, .worker_bytes = worker,
                      .pages_bytes = pages};
    uint64_t len = CM_PFX_HDR_SIZE + tables + worker + pages, x = 0x9e3779b97f4a7c15ull * (seed + 1u);
    uint8_t *buf = calloc(1, len), *p;

    assert_non_null(buf);
    p = buf + CM_PFX_HDR_SIZE;
    for (uint32_t t = 0; t < nt; t++)
        cm_dp_put32(p + 4u * t, per);
    for (uint32_t i = 0; i < nt * per; i++)
        cm_dp_put32(p + 4u * nt + 4u * i, PT);
    for (uint64_t i = 0; i < worker + pages; i++) {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        buf[CM_PFX_HDR_SIZE + tables + i] = (uint8_t)x;
    }
    h.crc = cm_crc32c(0, buf + CM_PFX_HDR_SIZE, len - CM_PFX_HDR_SIZE);
    cm_pfx_hdr_encode(buf, &h);
    *len_p = len;
    return buf;
}

/* Publish block `seed` under a key of bytes `fill` from a session of its
 * own, then drop that session: the block is in the catalog, unreferenced,
 * the most recently used (the cap of one block wrote an earlier one out). */
static uint8_t *publish_unreferenced_as(uint32_t seed, int fill, uint8_t key[CM_PFX_KEY_SIZE], uint64_t *len_p)
{
    static const kvs_geometry_t g = {.layers = 1, .kv_heads = HEADS, .head_dim = DIM, .dtype = KVS_DTYPE_F16,
                                     .page_tokens = PT};
    uint8_t *blk = make_block(seed, len_p);
    uint32_t slot, flags;
    uint64_t freed;
    sess_t p = {0};

    memset(key, fill, CM_PFX_KEY_SIZE);
    assert_int_equal(kvs_data_session_create(g_data, "t", &g, 0, "publisher", &p.id, p.secret), RI_OK);
    assert_int_equal(gw_dp_connect(kvs_data_address(g_data, p.id), p.id, p.secret, NULL, &p.dp), RI_OK);
    assert_int_equal(gw_dp_prefix_put(p.dp, key, blk, *len_p, &slot, &flags), RI_OK);
    gw_dp_close(p.dp);
    assert_int_equal(kvs_data_session_drop(g_data, "t", p.id, &freed), RI_OK);
    assert_int_equal(metric("ri_kvs_prefix_blocks{tier=\"memory\"}"), 1);
    return blk;
}

static uint8_t *publish_unreferenced(uint8_t key[CM_PFX_KEY_SIZE], uint64_t *len_p)
{
    return publish_unreferenced_as(7, 0x5a, key, len_p);
}

static uint64_t pool_round(uint64_t bytes)
{
    return (bytes + POOL_UNIT - 1) / POOL_UNIT * POOL_UNIT;
}

static void test_prefix_attach_during_write(void **state)
{
    (void)state;
    pthread_t t;
    bg_append_t a = {0};
    uint8_t key[CM_PFX_KEY_SIZE];
    uint64_t len, t0, ns, spilled;
    uint8_t *blk = publish_unreferenced(key, &len), *got = malloc(len);
    cm_pfx_attached_t att[1];
    uint32_t n_att = 0;

    assert_non_null(got);
    start_slow(&t, &a, &g_b);             /* the block goes first: its write is held */
    t0 = cm_time_ns();
    assert_int_equal(gw_dp_prefix_attach(g_a.dp, key, 1, att, &n_att), RI_OK);
    ns = cm_time_ns() - t0;
    assert_int_equal(n_att, 1);
    assert_int_equal(gw_dp_prefix_get(g_a.dp, att[0].slot, 0, got, len), RI_OK);
    assert_memory_equal(got, blk, len);
    bool overlapped = atomic_load(&g_in_slow) != 0;
    assert_int_equal(pthread_join(t, NULL), 0);
    printf("attach + get during the held block write: %.1f ms\n", (double)ns / 1e6);
    assert_true(overlapped);
    assert_true(ns < (uint64_t)FAST_MS * 1000000u);
    assert_int_equal(a.st, RI_OK);
    /* Attached during its write: kept in memory, its records forgotten. */
    assert_int_equal(metric("ri_kvs_prefix_spill_abandoned_total"), 1);
    assert_int_equal(metric("ri_kvs_prefix_spills_total"), 0);
    assert_int_equal(metric("ri_kvs_prefix_blocks{tier=\"memory\"}"), 1);
    assert_int_equal(metric("ri_kvs_prefix_blocks{tier=\"disk\"}"), 0);
    memset(got, 0, len);
    assert_int_equal(gw_dp_prefix_get(g_a.dp, att[0].slot, 0, got, len), RI_OK);
    assert_memory_equal(got, blk, len);
    spilled = metric("ri_kvs_spilled_clusters_total");
    assert_true(spilled > 0);             /* the clusters' spill went on after the block */
    assert_int_equal(metric("kvs_spill_records"), spilled);
    assert_int_equal(pool_used(), ((uint64_t)HEADS * (g_a.n + g_b.n) - spilled) * POOL_UNIT + pool_round(len));
    free(got);
    free(blk);
}

static void test_prefix_drop_during_write(void **state)
{
    (void)state;
    pthread_t t;
    bg_append_t a = {0};
    uint8_t key[CM_PFX_KEY_SIZE];
    uint64_t len, spilled, bytes = 0;
    uint8_t *blk = publish_unreferenced(key, &len);
    uint32_t n = 0;

    start_slow(&t, &a, &g_b);
    assert_int_equal(kvs_data_prefix_drop(g_data, "t", key, &n, &bytes), RI_OK);
    assert_int_equal(n, 1);
    assert_true(atomic_load(&g_in_slow) != 0);
    assert_int_equal(pthread_join(t, NULL), 0);
    assert_int_equal(a.st, RI_OK);
    /* Freed once its write ended: no block, no record, no pool byte left. */
    assert_int_equal(metric("ri_kvs_prefix_spill_abandoned_total"), 1);
    assert_int_equal(metric("ri_kvs_prefix_blocks{tier=\"memory\"}"), 0);
    assert_int_equal(metric("ri_kvs_prefix_blocks{tier=\"disk\"}"), 0);
    spilled = metric("ri_kvs_spilled_clusters_total");
    assert_int_equal(metric("kvs_spill_records"), spilled);
    assert_int_equal(pool_used(), ((uint64_t)HEADS * (g_a.n + g_b.n) - spilled) * POOL_UNIT);
    free(blk);
}

typedef struct bg_put {
    const uint8_t *key, *blk;
    uint64_t len;
    ri_status_t st;
} bg_put_t;

static void *bg_put_main(void *arg)
{
    bg_put_t *p = arg;
    uint32_t slot, flags;
    p->st = gw_dp_prefix_put(g_a.dp, p->key, p->blk, p->len, &slot, &flags);
    return NULL;
}

static void test_prefix_cap_not_held(void **state)
{
    (void)state;
    pthread_t t;
    uint8_t key1[CM_PFX_KEY_SIZE], key2[CM_PFX_KEY_SIZE];
    uint64_t len1, len2, worst = 0, freed;
    uint8_t *blk1 = publish_unreferenced(key1, &len1), *blk2 = make_block(8, &len2), *got = malloc(len1);
    bg_put_t p = {.key = key2, .blk = blk2, .len = len2};
    uint64_t deadline = cm_time_ns() + 5000000000ull;
    cm_pfx_attached_t att[1];
    uint32_t n_att = 0;

    assert_non_null(got);
    memset(key2, 0x6b, sizeof(key2));
    atomic_store(&g_armed, 1);
    assert_int_equal(pthread_create(&t, NULL, bg_put_main, &p), 0);
    while (!atomic_load(&g_in_slow) && cm_time_ns() < deadline)
        cm_time_sleep_ns(1000000);
    assert_true(atomic_load(&g_in_slow));  /* the cap made A's PUT write block 1 out */
    for (uint32_t i = 0; i < B_OPS; i++) {
        uint32_t d = 0;
        uint64_t t0 = cm_time_ns();
        assert_int_equal(fetch2(&g_b, i * FETCH_N, i * FETCH_N, &d), RI_OK);
        worst = CM_MAX(worst, cm_time_ns() - t0);
        t0 = cm_time_ns();
        assert_int_equal(put(&g_b, true, 4), RI_OK);
        worst = CM_MAX(worst, cm_time_ns() - t0);
    }
    bool overlapped = atomic_load(&g_in_slow) != 0;
    assert_int_equal(pthread_join(t, NULL), 0);
    printf("cap eviction write held: B's slowest op meanwhile %.1f ms\n", (double)worst / 1e6);
    assert_true(overlapped);
    assert_true(worst < (uint64_t)FAST_MS * 1000000u);
    assert_int_equal(p.st, RI_OK);
    assert_int_equal(metric("ri_kvs_prefix_spills_total"), 1);
    assert_int_equal(metric("ri_kvs_prefix_blocks{tier=\"memory\"}"), 1);
    assert_int_equal(metric("ri_kvs_prefix_blocks{tier=\"disk\"}"), 1);
    /* With A gone, block 2 is evictable: block 1 comes back from disk. */
    gw_dp_close(g_a.dp);
    g_a.dp = NULL;
    assert_int_equal(kvs_data_session_drop(g_data, "t", g_a.id, &freed), RI_OK);
    assert_int_equal(gw_dp_prefix_attach(g_b.dp, key1, 1, att, &n_att), RI_OK);
    assert_int_equal(n_att, 1);
    assert_int_equal(gw_dp_prefix_get(g_b.dp, att[0].slot, 0, got, len1), RI_OK);
    assert_memory_equal(got, blk1, len1);
    assert_int_equal(metric("ri_kvs_prefix_readbacks_total"), 1);
    free(got);
    free(blk1);
    free(blk2);
}

typedef struct bg_attach {
    sess_t *s;
    const uint8_t *key;
    uint32_t n_att;
    cm_pfx_attached_t att[1];
    ri_status_t st;
    uint64_t ns;
} bg_attach_t;

static void *bg_attach_main(void *arg)
{
    bg_attach_t *a = arg;
    uint64_t t0 = cm_time_ns();
    a->st = gw_dp_prefix_attach(a->s->dp, a->key, 1, a->att, &a->n_att);
    a->ns = cm_time_ns() - t0;
    return NULL;
}

/* A read-back forgets the block's records; the store's manifest without
 * them is held 500 ms: B's fetches and appends meanwhile each complete
 * well under 100 ms, and A's ATTACH answers only once that manifest is
 * on disk. */
static void test_prefix_readback_sync_not_held(void **state)
{
    (void)state;
    pthread_t t;
    uint8_t key1[CM_PFX_KEY_SIZE], key2[CM_PFX_KEY_SIZE];
    uint64_t len1, len2, worst = 0, deadline;
    uint8_t *blk1 = publish_unreferenced_as(7, 0x5a, key1, &len1);
    uint8_t *blk2 = publish_unreferenced_as(8, 0x6b, key2, &len2), *got = malloc(len1);
    bg_attach_t a = {.s = &g_a, .key = key1};
    uint32_t n = 0;

    assert_non_null(got);
    /* Block 1 went to disk under the cap; dropping block 2 (in memory)
     * leaves room, so the read-back writes nothing else out. */
    assert_int_equal(metric("ri_kvs_prefix_blocks{tier=\"disk\"}"), 1);
    assert_int_equal(kvs_data_prefix_drop(g_data, "t", key2, &n, NULL), RI_OK);
    assert_int_equal(metric("ri_kvs_prefix_blocks{tier=\"memory\"}"), 0);
    atomic_store(&g_mf_armed, 1);
    assert_int_equal(pthread_create(&t, NULL, bg_attach_main, &a), 0);
    deadline = cm_time_ns() + 5000000000ull;
    while (!atomic_load(&g_mf_in_slow) && cm_time_ns() < deadline)
        cm_time_sleep_ns(1000000);
    assert_true(atomic_load(&g_mf_in_slow)); /* the manifest after the read-back's forget */
    for (uint32_t i = 0; i < B_OPS / 2; i++) {
        uint32_t d = 0;
        uint64_t t0 = cm_time_ns();
        assert_int_equal(fetch2(&g_b, i * FETCH_N, i * FETCH_N, &d), RI_OK);
        worst = CM_MAX(worst, cm_time_ns() - t0);
        t0 = cm_time_ns();
        assert_int_equal(put(&g_b, true, 1), RI_OK);
        worst = CM_MAX(worst, cm_time_ns() - t0);
    }
    bool overlapped = atomic_load(&g_mf_in_slow) != 0;
    assert_int_equal(pthread_join(t, NULL), 0);
    printf("read-back's store manifest held: ATTACH %.0f ms; B's slowest fetch/append meanwhile %.1f ms\n",
           (double)a.ns / 1e6, (double)worst / 1e6);
    assert_true(overlapped);
    assert_true(worst < (uint64_t)FAST_MS * 1000000u);
    assert_int_equal(a.st, RI_OK);
    assert_int_equal(a.n_att, 1);
    assert_true(a.ns >= (uint64_t)SLOW_MS * 1000000u); /* answered only once the manifest was on disk */
    assert_int_equal(gw_dp_prefix_get(g_a.dp, a.att[0].slot, 0, got, len1), RI_OK);
    assert_memory_equal(got, blk1, len1);
    assert_int_equal(metric("ri_kvs_prefix_readbacks_total"), 1);
    assert_int_equal(metric("ri_kvs_prefix_blocks{tier=\"disk\"}"), 0);
    assert_int_equal(metric("kvs_spill_records"), metric("ri_kvs_spilled_clusters_total")); /* no block record */
    free(got);
    free(blk1);
    free(blk2);
}

/* A session of the test geometry (no clusters) served by lane `lane` of
 * `lanes` (the daemon serves session id on lane id mod lanes): sessions
 * made on other lanes meanwhile are dropped. */
static void open_on_lane(sess_t *s, uint32_t lane, uint32_t lanes)
{
    static const kvs_geometry_t g = {.layers = 1, .kv_heads = HEADS, .head_dim = DIM, .dtype = KVS_DTYPE_F16,
                                     .page_tokens = PT};

    memset(s, 0, sizeof(*s));
    for (uint32_t i = 0; i <= lanes; i++) {
        assert_int_equal(kvs_data_session_create(g_data, "t", &g, 0, "putter", &s->id, s->secret), RI_OK);
        if (s->id % lanes == lane)
            break;
        assert_int_equal(kvs_data_session_drop(g_data, "t", s->id, NULL), RI_OK);
    }
    assert_int_equal(s->id % lanes, lane);
    assert_int_equal(gw_dp_connect(kvs_data_address(g_data, s->id), s->id, s->secret, NULL, &s->dp), RI_OK);
}

typedef struct bg_sput {
    sess_t *s;
    uint8_t key[CM_PFX_KEY_SIZE];
    uint8_t *blk;
    uint64_t len;
    ri_status_t st;
} bg_sput_t;

static void *bg_sput_main(void *arg)
{
    bg_sput_t *p = arg;
    uint32_t slot, flags;
    p->st = gw_dp_prefix_put(p->s->dp, p->key, p->blk, p->len, &slot, &flags);
    return NULL;
}

#define RACE_LANES 4u

static void test_prefix_pool_race_not_held(void **state)
{
    (void)state;
    sess_t pub, p1, p2;
    bg_sput_t x = {.s = &pub}, y = {.s = &pub}, z1 = {.s = &p1}, z2 = {.s = &p2};
    uint64_t deadline = cm_time_ns() + 5000000000ull, worst = 0, total;
    pthread_t t1, t2;
    cm_pfx_attached_t att[1];
    uint32_t n_att = 0, lane_b = (uint32_t)(g_b.id % RACE_LANES), lanes[2], nl = 0;
    uint8_t *got;

    /* The two PUTs on two lanes, B (the fetcher) on a third. */
    for (uint32_t l = 0; l < RACE_LANES && nl < 2; l++)
        if (l != lane_b && l != g_a.id % RACE_LANES)
            lanes[nl++] = l;
    assert_int_equal(nl, 2);
    open_on_lane(&pub, lanes[0], RACE_LANES);
    open_on_lane(&p1, lanes[0], RACE_LANES);
    open_on_lane(&p2, lanes[1], RACE_LANES);
    bg_sput_t *all[4] = {&x, &y, &z1, &z2};
    for (uint32_t i = 0; i < 4; i++) {
        all[i]->blk = make_block(20 + i, &all[i]->len);
        memset(all[i]->key, 0x30 + (int)i, CM_PFX_KEY_SIZE);
    }
    /* x and y fill the pool, then go unreferenced (their session dropped). */
    bg_sput_main(&x);
    bg_sput_main(&y);
    assert_int_equal(x.st, RI_OK);
    assert_int_equal(y.st, RI_OK);
    gw_dp_close(pub.dp);
    assert_int_equal(kvs_data_session_drop(g_data, "t", pub.id, NULL), RI_OK);
    total = pool_used();
    assert_int_equal(total, (uint64_t)HEADS * CLUSTERS * 2u * POOL_UNIT + 2u * pool_round(x.len)); /* full */

    atomic_store(&g_armed, 1);
    assert_int_equal(pthread_create(&t1, NULL, bg_sput_main, &z1), 0);
    while (!atomic_load(&g_in_slow) && cm_time_ns() < deadline)
        cm_time_sleep_ns(1000000);
    assert_true(atomic_load(&g_in_slow)); /* z1's PUT writes x out (held) */
    assert_int_equal(pthread_create(&t2, NULL, bg_sput_main, &z2), 0);
    cm_time_sleep_ns(20000000);           /* z2's PUT finds the pool full too */
    for (uint32_t i = 0; i < B_OPS; i++) {
        uint32_t d = 0;
        uint64_t t0 = cm_time_ns();
        assert_int_equal(fetch2(&g_b, i * FETCH_N, i * FETCH_N, &d), RI_OK);
        worst = CM_MAX(worst, cm_time_ns() - t0);
    }
    bool overlapped = atomic_load(&g_in_slow) != 0;
    assert_int_equal(pthread_join(t1, NULL), 0);
    assert_int_equal(pthread_join(t2, NULL), 0);
    printf("pool-full PUT race, eviction write held: B's slowest fetch meanwhile %.1f ms; PUTs: %s, %s\n",
           (double)worst / 1e6, ri_status_str(z1.st), ri_status_str(z2.st));
    assert_true(overlapped);
    assert_true(worst < (uint64_t)FAST_MS * 1000000u);
    assert_true(z1.st == RI_OK || z1.st == RI_ERR_QUOTA); /* QUOTA: the retryable refusal */
    assert_true(z2.st == RI_OK || z2.st == RI_ERR_QUOTA);
    assert_int_equal(z1.st, RI_OK);                     /* here: the room was made for both */
    assert_int_equal(z2.st, RI_OK);
    assert_int_equal(metric("ri_kvs_prefix_spills_total"), 2);
    assert_int_equal(metric("ri_kvs_prefix_blocks{tier=\"memory\"}"), 2);
    assert_int_equal(metric("ri_kvs_prefix_blocks{tier=\"disk\"}"), 2);
    assert_int_equal(pool_used(), total);
    /* z1 and z2 unreferenced: x and y come back (each writing one out). */
    gw_dp_close(p1.dp);
    gw_dp_close(p2.dp);
    assert_int_equal(kvs_data_session_drop(g_data, "t", p1.id, NULL), RI_OK);
    assert_int_equal(kvs_data_session_drop(g_data, "t", p2.id, NULL), RI_OK);
    for (uint32_t i = 0; i < 2; i++) {
        got = malloc(all[i]->len);
        assert_non_null(got);
        assert_int_equal(gw_dp_prefix_attach(g_b.dp, all[i]->key, 1, att, &n_att), RI_OK);
        assert_int_equal(n_att, 1);
        assert_int_equal(gw_dp_prefix_get(g_b.dp, att[0].slot, 0, got, all[i]->len), RI_OK);
        assert_memory_equal(got, all[i]->blk, all[i]->len);
        free(got);
    }
    assert_int_equal(metric("ri_kvs_prefix_readbacks_total"), 2);
    for (uint32_t i = 0; i < 4; i++)
        free(all[i]->blk);
}

static void test_drop_during_write(void **state)
{
    (void)state;
    pthread_t t;
    bg_append_t a = {0};
    uint64_t freed = 0, spilled, disk = 0;

    start_slow(&t, &a, &g_b);             /* B's append spills A's coldest */
    assert_int_equal(kvs_data_session_drop(g_data, "t", g_a.id, &freed), RI_OK);
    assert_true(atomic_load(&g_in_slow) != 0);
    assert_int_equal(pthread_join(t, NULL), 0);
    assert_int_equal(a.st, RI_OK);
    assert_true(metric("ri_kvs_spill_abandoned_total") > 0);
    /* A left nothing: every record in the store and every pool byte is B's. */
    spilled = metric("ri_kvs_spilled_clusters_total");
    assert_int_equal(metric("kvs_spill_records"), spilled);
    for (uint32_t i = 0; i < g_b.n / FETCH_N; i++) {
        uint32_t d = 0;
        assert_int_equal(fetch2(&g_b, i * FETCH_N, i * FETCH_N, &d), RI_OK);
        disk += d;
    }
    assert_int_equal(disk, spilled);      /* every spill that committed was B's */
    assert_int_equal(pool_used(), ((uint64_t)HEADS * g_b.n - spilled) * POOL_UNIT);
    assert_int_equal(kvs_data_session_drop(g_data, "t", g_b.id, &freed), RI_OK);
    assert_int_equal(pool_used(), 0);
    assert_int_equal(metric("kvs_spill_records"), 0);
}

static const kvs_geometry_t g_small = {.layers = 1, .kv_heads = 1, .head_dim = DIM, .dtype = KVS_DTYPE_F16,
                                       .page_tokens = PT};

/* A spill abandoned for a dropped session writes the store's manifest
 * without its records: held 500 ms here, a CreateSession (which needs the
 * catalog lock) meanwhile answers well under 100 ms, and A leaves no
 * record. */
static void test_drop_sync_not_held(void **state)
{
    (void)state;
    pthread_t t;
    bg_append_t a = {0};
    uint64_t deadline, id, t0, ns;
    uint8_t secret[16];

    start_slow(&t, &a, &g_b);             /* B's append spills A's coldest */
    assert_int_equal(kvs_data_session_drop(g_data, "t", g_a.id, NULL), RI_OK);
    assert_true(atomic_load(&g_in_slow) != 0);
    atomic_store(&g_mf_armed, 1);         /* the manifest the commit writes without A's records */
    deadline = cm_time_ns() + 5000000000ull;
    while (!atomic_load(&g_mf_in_slow) && cm_time_ns() < deadline)
        cm_time_sleep_ns(1000000);
    assert_true(atomic_load(&g_mf_in_slow));
    t0 = cm_time_ns();
    assert_int_equal(kvs_data_session_create(g_data, "t", &g_small, 0, "meanwhile", &id, secret), RI_OK);
    ns = cm_time_ns() - t0;
    bool overlapped = atomic_load(&g_mf_in_slow) != 0;
    assert_int_equal(pthread_join(t, NULL), 0);
    printf("store manifest after an abandoned spill held: CreateSession meanwhile %.1f ms\n", (double)ns / 1e6);
    assert_true(overlapped);
    assert_true(ns < (uint64_t)FAST_MS * 1000000u);
    assert_int_equal(a.st, RI_OK);
    assert_true(metric("ri_kvs_spill_abandoned_total") > 0);
    assert_int_equal(metric("kvs_spill_records"), metric("ri_kvs_spilled_clusters_total")); /* B's alone */
    assert_int_equal(kvs_data_session_drop(g_data, "t", id, NULL), RI_OK);
}

/* The session ids the manifest on disk lists, in its order; returns how
 * many (at most max), or -1 when it is unreadable or damaged. */
static int manifest_ids(uint64_t *ids, int max)
{
    enum { HDR = 24, ENTRY = 244 };   /* docs/spill.md: the session manifest */
    char path[128];
    uint8_t buf[HDR + 64 * ENTRY + 4];
    FILE *f;
    size_t len;
    uint32_t n;

    snprintf(path, sizeof(path), "%s/sessions.manifest", g_dir);
    f = fopen(path, "rb");
    if (f == NULL)
        return -1;
    len = fread(buf, 1, sizeof(buf), f);
    fclose(f);
    if (len < HDR + 4 || memcmp(buf, "RIKVSSES", 8) != 0)
        return -1;
    n = cm_dp_get32(buf + 12);
    if ((int)n > max || len != HDR + (size_t)n * ENTRY + 4 || cm_crc32c(0, buf, len - 4) != cm_dp_get32(buf + len - 4))
        return -1;
    for (uint32_t i = 0; i < n; i++)
        ids[i] = cm_dp_get64(buf + HDR + (size_t)i * ENTRY);
    return (int)n;
}

static bool manifest_has(uint64_t id)
{
    uint64_t ids[64];
    int n = manifest_ids(ids, 64);
    assert_true(n >= 0);
    for (int i = 0; i < n; i++)
        if (ids[i] == id)
            return true;
    return false;
}


typedef struct bg_ctl {
    bool drop;                         /* DropSession of id, else CreateSession (id set) */
    uint64_t id;
    ri_status_t st;
    uint64_t ns;
} bg_ctl_t;

static void *bg_ctl_main(void *arg)
{
    bg_ctl_t *c = arg;
    uint8_t secret[16];
    uint64_t t0 = cm_time_ns();
    c->st = c->drop ? kvs_data_session_drop(g_data, "t", c->id, NULL)
                    : kvs_data_session_create(g_data, "t", &g_small, 0, "manifest", &c->id, secret);
    c->ns = cm_time_ns() - t0;
    return NULL;
}

/* Run c on a thread with the manifest's rename held; meanwhile time A's and
 * B's fetches and appends.  Returns the slowest of them, in ns. */
static uint64_t ctl_held(bg_ctl_t *c)
{
    uint64_t deadline = cm_time_ns() + 5000000000ull, worst = 0;
    pthread_t t;

    atomic_store(&g_smf_armed, 1);
    assert_int_equal(pthread_create(&t, NULL, bg_ctl_main, c), 0);
    while (!atomic_load(&g_smf_in_slow) && cm_time_ns() < deadline)
        cm_time_sleep_ns(1000000);
    assert_true(atomic_load(&g_smf_in_slow));
    for (uint32_t i = 0; i < B_OPS / 2; i++) {
        sess_t *s = i % 2 ? &g_b : &g_a;
        uint32_t d = 0;
        uint64_t t0 = cm_time_ns();
        assert_int_equal(fetch2(s, i * FETCH_N, i * FETCH_N, &d), RI_OK);
        assert_int_equal(put(s, true, 1), RI_OK);
        worst = CM_MAX(worst, cm_time_ns() - t0);
    }
    assert_true(atomic_load(&g_smf_in_slow) != 0); /* all of it while the write was held */
    assert_int_equal(pthread_join(t, NULL), 0);
    return worst;
}

static void test_manifest_write_not_held(void **state)
{
    (void)state;
    bg_ctl_t c = {.drop = false};
    uint64_t worst;

    worst = ctl_held(&c);
    printf("CreateSession with its manifest held: %.0f ms; A and B meanwhile: slowest fetch+append %.1f ms\n",
           (double)c.ns / 1e6, (double)worst / 1e6);
    assert_int_equal(c.st, RI_OK);
    assert_true(c.ns >= (uint64_t)SLOW_MS * 1000000u); /* answered only once its manifest was on disk */
    assert_true(worst < (uint64_t)FAST_MS * 1000000u);
    assert_true(manifest_has(c.id));
    c.drop = true;
    worst = ctl_held(&c);
    printf("DropSession with its manifest held: %.0f ms; A and B meanwhile: slowest fetch+append %.1f ms\n",
           (double)c.ns / 1e6, (double)worst / 1e6);
    assert_int_equal(c.st, RI_OK);
    assert_true(c.ns >= (uint64_t)SLOW_MS * 1000000u);
    assert_true(worst < (uint64_t)FAST_MS * 1000000u);
    assert_false(manifest_has(c.id));
    assert_true(manifest_has(g_a.id) && manifest_has(g_b.id));
}

#define STORM_THREADS 8
#define STORM_ROUNDS 12

typedef struct storm {
    uint64_t kept[STORM_ROUNDS];
    int n_kept;
    ri_status_t st;
} storm_t;

/* Create sessions, keeping every third, dropping the others at once. */
static void *storm_main(void *arg)
{
    storm_t *w = arg;
    for (int r = 0; r < STORM_ROUNDS && w->st == RI_OK; r++) {
        bg_ctl_t c = {.drop = false};
        bg_ctl_main(&c);
        w->st = c.st;
        if (c.st != RI_OK)
            break;
        if (r % 3 == 0) {
            w->kept[w->n_kept++] = c.id;
            continue;
        }
        c.drop = true;
        bg_ctl_main(&c);
        w->st = c.st;
    }
    return NULL;
}

static int cmp_u64(const void *a, const void *b)
{
    uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
    return x < y ? -1 : x > y;
}

static void test_manifest_storm(void **state)
{
    (void)state;
    pthread_t t[STORM_THREADS];
    storm_t w[STORM_THREADS];
    uint64_t want[2 + STORM_THREADS * STORM_ROUNDS], have[64];
    int n_want = 0, n_have;

    memset(w, 0, sizeof(w));
    g_smf_last_next = 0;
    atomic_store(&g_smf_regressed, 0);
    atomic_store(&g_smf_jitter, 1);
    for (int i = 0; i < STORM_THREADS; i++)
        assert_int_equal(pthread_create(&t[i], NULL, storm_main, &w[i]), 0);
    for (int i = 0; i < STORM_THREADS; i++)
        assert_int_equal(pthread_join(t[i], NULL), 0);
    atomic_store(&g_smf_jitter, 0);
    assert_false(atomic_load(&g_smf_regressed)); /* no older snapshot overwrote a newer */
    want[n_want++] = g_a.id;
    want[n_want++] = g_b.id;
    for (int i = 0; i < STORM_THREADS; i++) {
        assert_int_equal(w[i].st, RI_OK);
        for (int k = 0; k < w[i].n_kept; k++)
            want[n_want++] = w[i].kept[k];
    }
    n_have = manifest_ids(have, 64);
    assert_int_equal(n_have, n_want);
    qsort(want, (size_t)n_want, sizeof(want[0]), cmp_u64);
    qsort(have, (size_t)n_have, sizeof(have[0]), cmp_u64);
    for (int i = 0; i < n_want; i++)
        assert_int_equal(have[i], want[i]);
}

/* The data side over cfg with the slow spill I/O in a fresh directory,
 * and sessions A and B open; exits 77 where UCX has no transport. */
static int data_up_slow(kvs_data_config_t *cfg)
{
    ri_status_t st;

    g_ops = *kvs_io_ops_default();
    g_ops.pwrite = slow_pwrite;
    g_ops.rename = slow_rename;
    g_ops.uring_init = no_uring;
    snprintf(g_dir, sizeof(g_dir), "/tmp/ri_slowwrite_XXXXXX");
    if (mkdtemp(g_dir) == NULL)
        return -1;
    cfg->spill_dir = g_dir;
    st = kvs_data_create(cfg, &g_data);
    if (st == RI_ERR_TRANSPORT) {
        printf("no UCX transport here: skipped\n");
        exit(77);
    }
    if (st != RI_OK)
        return -1;
    open_session(&g_a);
    open_session(&g_b);
    return 0;
}

static int setup(void **state)
{
    /* 16 MiB pool, mark at 30%: the two uploads (4 MiB) fit under it, one
     * spilling append (1 MiB) does not. */
    kvs_data_config_t cfg = {.memory_bytes = 16u << 20, .dp_listen_addr = "127.0.0.1:0", .dp_lanes = 2,
                             .drain_timeout_ms = 2000, .spill_high_water = 0.30, .spill_io_ops = &g_ops,
                             .prefix_max_bytes = 16u << 10}; /* one test block fits, two do not */
    (void)state;
    if (data_up_slow(&cfg) != 0)
        return -1;
    if (metric("ri_kvs_spilled_clusters_total") != 0)
        return -1; /* the uploads must fit under the mark */
    /* lane = id mod 2: A and B must be served by different threads */
    return (g_a.id % 2) != (g_b.id % 2) ? 0 : -1;
}

/* For the pool race: a pool that A's and B's uploads and two test blocks
 * fill exactly, no spill before it is full (mark 1.0), caps far away, four
 * lanes (two PUTs and B's fetches each on its own). */
static int setup_pool_full(void **state)
{
    uint64_t len;
    uint8_t *blk = make_block(0, &len);
    kvs_data_config_t cfg = {.memory_bytes = (uint64_t)HEADS * CLUSTERS * 2u * POOL_UNIT + 2u * pool_round(len),
                             .dp_listen_addr = "127.0.0.1:0", .dp_lanes = RACE_LANES, .drain_timeout_ms = 2000,
                             .spill_high_water = 1.0, .spill_io_ops = &g_ops, .prefix_max_bytes = 1u << 20};
    (void)state;
    free(blk);
    if (data_up_slow(&cfg) != 0)
        return -1;
    return metric("ri_kvs_spilled_clusters_total") == 0 ? 0 : -1;
}

static int teardown(void **state)
{
    char cmd[128];
    (void)state;
    if (g_a.dp != NULL)
        gw_dp_close(g_a.dp);
    gw_dp_close(g_b.dp);
    kvs_data_destroy(g_data);
    free(g_a.recv);
    free(g_b.recv);
    snprintf(cmd, sizeof(cmd), "rm -rf %s", g_dir);
    return system(cmd) == 0 ? 0 : -1;
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_other_session_not_held, setup, teardown),
        cmocka_unit_test_setup_teardown(test_touch_during_write, setup, teardown),
        cmocka_unit_test_setup_teardown(test_drop_during_write, setup, teardown),
        cmocka_unit_test_setup_teardown(test_drop_sync_not_held, setup, teardown),
        cmocka_unit_test_setup_teardown(test_prefix_attach_during_write, setup, teardown),
        cmocka_unit_test_setup_teardown(test_prefix_drop_during_write, setup, teardown),
        cmocka_unit_test_setup_teardown(test_prefix_cap_not_held, setup, teardown),
        cmocka_unit_test_setup_teardown(test_prefix_pool_race_not_held, setup_pool_full, teardown),
        cmocka_unit_test_setup_teardown(test_prefix_readback_sync_not_held, setup, teardown),
        cmocka_unit_test_setup_teardown(test_manifest_write_not_held, setup, teardown),
        cmocka_unit_test_setup_teardown(test_manifest_storm, setup, teardown),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
