/*
 * A slow spill read-back holds no other session: kvs_data with its real UCX
 * data plane on loopback (two lanes), a spill tier whose pread is
 * overridden (kvs_io_ops_t) to take 500 ms once armed, and two sessions on
 * different lanes with most of their clusters on disk.  While session A's
 * fetch sits in its slow disk read, session B's fetches (also read back from
 * disk) must complete, each well within that time: the catalog lock is not
 * held across the read.  Pool clusters A's fetch is about to send are
 * pinned: B's appends meanwhile spill around them, never them.  Then A is
 * dropped while another of its reads is in
 * flight: its fetch answers NOT_FOUND, B goes on, nothing crashes (the ASan
 * build checks nothing is used after it is freed).
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

#include "common/cm_dp_proto.h"
#include "common/cm_status.h"
#include "common/cm_time.h"
#include "gpuworker/client/gw_dp.h"
#include "kvstore/data/kvs_data.h"
#include "kvstore/spill/kvs_spill_io.h"

#define HEADS 2
#define DIM 64
#define PT 8
#define CL_BYTES (4u * PT * DIM)       /* one page of K and V, fp16: 2 KiB */
#define CLUSTERS 512                   /* per head: 2 MiB per session */
#define FETCH_N 16                     /* clusters per head per fetch */
#define RECV_BYTES ((size_t)HEADS * FETCH_N * CL_BYTES)
#define SLOW_MS 500u
#define B_FETCHES 8

/* The overridden pread: once armed, the next read sleeps SLOW_MS. */
static kvs_io_ops_t g_ops;
static atomic_int g_armed, g_in_slow;

static ssize_t slow_pread(void *arg, int fd, void *buf, size_t len, off_t off)
{
    (void)arg;
    if (atomic_exchange(&g_armed, 0)) {
        atomic_store(&g_in_slow, 1);
        cm_time_sleep_ns((uint64_t)SLOW_MS * 1000000u);
        atomic_store(&g_in_slow, 0);
    }
    return pread(fd, buf, len, off);
}

/* No io_uring: every read goes through pread (the caller falls back). */
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
    uint32_t cache_id;
    uint8_t *recv;
} sess_t;

static kvs_data_t *g_data;
static char g_dir[] = "/tmp/ri_slowread_XXXXXX";
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

static void open_session(sess_t *s)
{
    static const kvs_geometry_t g = {.layers = 1, .kv_heads = HEADS, .head_dim = DIM, .dtype = KVS_DTYPE_F16,
                                     .page_tokens = PT};
    uint32_t heads[HEADS] = {0, 1}, counts[HEADS] = {CLUSTERS, CLUSTERS}, first[HEADS];
    uint32_t *tokens = malloc(sizeof(uint32_t) * HEADS * CLUSTERS);
    uint8_t *buf = malloc((size_t)HEADS * CLUSTERS * CL_BYTES);

    assert_non_null(tokens);
    assert_non_null(buf);
    assert_int_equal(kvs_data_session_create(g_data, "t", &g, 0, "slowread", &s->id, s->secret), RI_OK);
    assert_int_equal(gw_dp_connect(kvs_data_address(g_data, s->id), s->id, s->secret, NULL, &s->dp), RI_OK);
    for (uint32_t h = 0; h < HEADS; h++)
        for (uint32_t c = 0; c < CLUSTERS; c++) {
            tokens[h * CLUSTERS + c] = PT;
            gen_cluster(s->id, h, c, buf + ((size_t)h * CLUSTERS + c) * CL_BYTES);
        }
    assert_int_equal(gw_dp_upload(s->dp, false, 0, HEADS, heads, counts, tokens, buf,
                                  (size_t)HEADS * CLUSTERS * CL_BYTES, first), RI_OK);
    free(tokens);
    free(buf);
    s->recv = malloc(RECV_BYTES);
    assert_non_null(s->recv);
    assert_int_equal(gw_dp_register_cache_mode(s->dp, 16, s->recv, RECV_BYTES, GW_DP_RECV_INLINE, &s->cache_id,
                                               NULL), RI_OK);
}

/* Append n clusters per head (ids from first on) to s. */
static void append(sess_t *s, uint32_t first, uint32_t n)
{
    uint32_t heads[HEADS] = {0, 1}, counts[HEADS] = {n, n}, ids[HEADS];
    uint32_t *tokens = malloc(sizeof(uint32_t) * HEADS * n);
    uint8_t *buf = malloc((size_t)HEADS * n * CL_BYTES);

    assert_non_null(tokens);
    assert_non_null(buf);
    for (uint32_t h = 0; h < HEADS; h++)
        for (uint32_t c = 0; c < n; c++) {
            tokens[h * n + c] = PT;
            gen_cluster(s->id, h, first + c, buf + ((size_t)h * n + c) * CL_BYTES);
        }
    assert_int_equal(gw_dp_upload(s->dp, true, 0, HEADS, heads, counts, tokens, buf, (size_t)HEADS * n * CL_BYTES,
                                  ids), RI_OK);
    assert_int_equal(ids[0], first);
    free(tokens);
    free(buf);
}

/* Fetch clusters [first0, first0 + FETCH_N) of head 0 and [first1, ..) of
 * head 1; RI_OK only with every byte right.  *disk_p: entries served from
 * disk. */
static ri_status_t fetch2(sess_t *s, uint32_t first0, uint32_t first1, uint32_t *disk_p)
{
    uint32_t heads[HEADS] = {0, 1}, counts[HEADS] = {FETCH_N, FETCH_N}, ids[HEADS * FETCH_N];
    uint8_t want[CL_BYTES];
    gw_dp_fetch_result_t res;
    ri_status_t st;

    for (uint32_t k = 0; k < HEADS * FETCH_N; k++)
        ids[k] = (k < FETCH_N ? first0 : first1) + k % FETCH_N;
    st = gw_dp_fetch_ranked(s->dp, s->cache_id, 0, HEADS, heads, counts, ids, 0, 30000, &res);
    if (st != RI_OK)
        return st;
    *disk_p = 0;
    for (uint32_t k = 0; k < HEADS * FETCH_N; k++) {
        cm_dp_entry_t en;
        cm_dp_reply_entry(&res.view, k, &en);
        if (!(en.flags & CM_DP_F_MISS))
            continue;
        *disk_p += !!(en.flags & CM_DP_F_FROM_DISK);
        gen_cluster(s->id, k / FETCH_N, ids[k], want);
        if (memcmp(s->recv + en.recv_offset, want, CL_BYTES) != 0)
            st = RI_ERR_CORRUPT;
    }
    gw_dp_fetch_result_free(&res);
    return st;
}

static ri_status_t fetch(sess_t *s, uint32_t first, uint32_t *disk_p)
{
    return fetch2(s, first, first, disk_p);
}

typedef struct slow_fetch {
    uint32_t first, first1;
    ri_status_t st;
    uint32_t disk;
    uint64_t ns;
} slow_fetch_t;

static void *slow_fetch_main(void *arg)
{
    slow_fetch_t *f = arg;
    uint64_t t0 = cm_time_ns();
    f->st = fetch2(&g_a, f->first, f->first1, &f->disk);
    f->ns = cm_time_ns() - t0;
    return NULL;
}

/* Arm the slow read, start A's fetch of clusters first.. on a thread, and
 * wait until it sits in the read. */
static void start_slow(pthread_t *t, slow_fetch_t *f, uint32_t first, uint32_t first1)
{
    uint64_t deadline = cm_time_ns() + 5000000000ull;

    f->first = first;
    f->first1 = first1;
    atomic_store(&g_armed, 1);
    assert_int_equal(pthread_create(t, NULL, slow_fetch_main, f), 0);
    while (!atomic_load(&g_in_slow) && cm_time_ns() < deadline)
        cm_time_sleep_ns(1000000);
    assert_true(atomic_load(&g_in_slow));
}

static void test_other_session_not_held(void **state)
{
    (void)state;
    pthread_t t;
    slow_fetch_t f = {0};
    uint64_t worst = 0, t_all = cm_time_ns();
    uint32_t disk_b = 0;

    start_slow(&t, &f, 0, 0);
    for (uint32_t i = 0; i < B_FETCHES; i++) {
        uint32_t disk = 0;
        uint64_t t0 = cm_time_ns();
        assert_int_equal(fetch(&g_b, i * FETCH_N, &disk), RI_OK);
        worst = CM_MAX(worst, cm_time_ns() - t0);
        disk_b += disk;
    }
    t_all = cm_time_ns() - t_all;
    bool overlapped = atomic_load(&g_in_slow) != 0;
    assert_int_equal(pthread_join(t, NULL), 0);
    printf("A's fetch: %.0f ms (%u from disk); B: %d fetches (%u clusters from disk) in %.1f ms, slowest %.1f ms\n",
           (double)f.ns / 1e6, f.disk, B_FETCHES, disk_b, (double)t_all / 1e6, (double)worst / 1e6);
    assert_int_equal(f.st, RI_OK);
    assert_true(f.disk > 0);
    assert_true(f.ns >= (uint64_t)SLOW_MS * 1000000u);
    assert_true(disk_b > 0);               /* B read back from disk too, beside A's read */
    assert_true(overlapped);               /* all of B's fetches ran while A's read was held */
    assert_true(worst < (uint64_t)SLOW_MS * 1000000u / 4);
}

/* A's fetch takes head 0 from fresh, pool-resident clusters and head 1
 * from disk (the slow read).  Meanwhile B appends enough to push the pool
 * over its mark several times: the spills that follow would pick A's pool
 * clusters (colder than B's new ones) and B's next appends would reuse
 * their pages, but they are pinned: A's bytes arrive intact. */
static void test_spill_skips_pinned(void **state)
{
    (void)state;
    pthread_t t;
    slow_fetch_t f = {0};

    append(&g_a, CLUSTERS, FETCH_N);
    start_slow(&t, &f, CLUSTERS, 2 * FETCH_N);
    for (uint32_t i = 0; i < 4; i++)
        append(&g_b, CLUSTERS + i * 64, 64);
    bool overlapped = atomic_load(&g_in_slow) != 0;
    assert_int_equal(pthread_join(t, NULL), 0);
    assert_true(overlapped);
    assert_int_equal(f.st, RI_OK);         /* every byte of A's pool clusters as uploaded */
    assert_int_equal(f.disk, FETCH_N);     /* head 1 from disk, head 0 from the pool */
}

static void test_drop_during_read(void **state)
{
    (void)state;
    pthread_t t;
    slow_fetch_t f = {0};
    uint32_t disk = 0;
    uint64_t freed = 0;

    start_slow(&t, &f, 10 * FETCH_N, 10 * FETCH_N);
    assert_int_equal(kvs_data_session_drop(g_data, "t", g_a.id, &freed), RI_OK);
    assert_int_equal(pthread_join(t, NULL), 0);
    assert_int_equal(f.st, RI_ERR_NOT_FOUND);
    assert_int_equal(fetch(&g_b, B_FETCHES * FETCH_N, &disk), RI_OK);
}

static int setup(void **state)
{
    kvs_data_config_t cfg = {.memory_bytes = 8u << 20, .dp_listen_addr = "127.0.0.1:0", .dp_lanes = 2,
                             .drain_timeout_ms = 2000, .spill_high_water = 0.05, .spill_io_ops = &g_ops};
    ri_status_t st;

    (void)state;
    g_ops = *kvs_io_ops_default();
    g_ops.pread = slow_pread;
    g_ops.uring_init = no_uring;
    if (mkdtemp(g_dir) == NULL)
        return -1;
    cfg.spill_dir = g_dir;
    st = kvs_data_create(&cfg, &g_data);
    if (st == RI_ERR_TRANSPORT) {
        printf("no UCX transport here: skipped\n");
        exit(77);
    }
    if (st != RI_OK)
        return -1;
    open_session(&g_a);
    open_session(&g_b);
    /* lane = id mod 2: A and B must be served by different threads */
    return (g_a.id % 2) != (g_b.id % 2) ? 0 : -1;
}

static int teardown(void **state)
{
    char cmd[128];
    (void)state;
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
        cmocka_unit_test(test_other_session_not_held),
        cmocka_unit_test(test_spill_skips_pinned),
        cmocka_unit_test(test_drop_during_read),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
