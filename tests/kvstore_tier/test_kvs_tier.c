/*
 * The spill tier through the real daemon: a 16 MiB pool holding a
 * 64 MiB session, so most clusters go to disk; every cluster fetched back
 * bit-exact, the metrics counting disk serves; SIGTERM and a restart with
 * --recover keep the session (same id and secret) and its bytes; a byte
 * flipped in a segment file of the stopped daemon is detected (an error
 * reply, never wrong data); dropping the session gives its disk bytes back.
 * The tests run in order and share the daemon and the spill directory.
 */
#define _GNU_SOURCE
#include <dirent.h>
#include <fcntl.h>
#include <setjmp.h>
#include <signal.h>
#include <stdbool.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include <cmocka.h>

#include "common/cm_alloc.h"
#include "common/cm_dp_proto.h"
#include "gpuworker/client/gw_ctl.h"
#include "gpuworker/client/gw_dp.h"
#include "kvs_test_daemon.h"

#define LAYERS 4
#define HEADS 4
#define DIM 128
#define PT 8
#define PAGE_BYTES (4u * PT * DIM)        /* K and V, fp16: 4 KiB */
#define TOK 16                            /* tokens per cluster: 2 pages */
#define CL_BYTES (2u * PAGE_BYTES)        /* 8 KiB */
#define CLUSTERS 512                      /* per (layer, head): 4*4*512*8 KiB = 64 MiB */
#define UP_CHUNK 128                      /* clusters per head per upload (4 MiB messages) */
#define FETCH_N 64                        /* clusters per head per fetch */
#define RECV_BYTES ((size_t)HEADS * FETCH_N * CL_BYTES)

static kvs_test_daemon_t g_d;
static char g_spill[400];
static gw_ctl_session_t g_sess;
static int g_skip;

/* The bytes of a cluster: a function of its identity. */
static void gen_cluster(uint32_t l, uint32_t h, uint32_t c, uint8_t *out)
{
    uint64_t x = 0x9e3779b97f4a7c15ull ^ ((uint64_t)l << 40) ^ ((uint64_t)h << 20) ^ c;
    for (size_t i = 0; i < CL_BYTES; i += 8) {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        memcpy(out + i, &x, 8);
    }
}

static int start_daemon_with(bool recover, const char *more)
{
    const char *extra[] = {"--memory=16MiB", "--spill-high-water=0.75", NULL, NULL, NULL, NULL};
    char flag[500];
    int rc;
    snprintf(flag, sizeof(flag), "--spill-dir=%s", g_spill);
    extra[2] = flag;
    extra[3] = recover ? "--recover" : more;
    extra[4] = recover ? more : NULL;
    rc = kvs_test_daemon_start(&g_d, extra, NULL);
    if (rc == 77)
        g_skip = 1;
    return rc;
}

static int start_daemon(bool recover)
{
    return start_daemon_with(recover, NULL);
}

/* The address the (restarted) daemon lists for g_sess. */
static void refresh_address(void)
{
    gw_ctl_t *ctl = NULL;
    gw_ctl_session_info_t *infos = NULL;
    size_t n = 0;
    assert_int_equal(gw_ctl_create(g_d.grpc, NULL, &ctl), RI_OK);
    assert_int_equal(gw_ctl_list_sessions(ctl, 5000, &infos, &n, NULL), RI_OK);
    for (size_t i = 0; i < n; i++)
        if (infos[i].session_id == g_sess.session_id)
            snprintf(g_sess.dataplane_address, sizeof(g_sess.dataplane_address), "%s", infos[i].dataplane_address);
    cm_free(infos);
    gw_ctl_destroy(ctl);
}

static uint64_t metric(const char *name)
{
    static char body[1 << 18];
    char key[128];
    const char *p;
    assert_int_equal(kvs_test_http_get(g_d.metrics, "/metrics", body, sizeof(body)), 200);
    snprintf(key, sizeof(key), "\n%s ", name);
    p = strstr(body, key);
    assert_non_null(p);
    return strtoull(p + strlen(key), NULL, 10);
}

static void get_stats(gw_ctl_stats_t *st)
{
    gw_ctl_t *ctl;
    assert_int_equal(gw_ctl_create(g_d.grpc, NULL, &ctl), RI_OK);
    assert_int_equal(gw_ctl_stats(ctl, 5000, st, NULL), RI_OK);
    gw_ctl_destroy(ctl);
}

/* Fetch every cluster once through a fresh cache; compare the bytes.
 * Returns how many fetches failed with RI_ERR_CORRUPT (the others must
 * succeed); *disk_p counts entries flagged as served from disk. */
static int fetch_all(gw_dp_t *dp, uint64_t *disk_p)
{
    uint8_t *recv = malloc(RECV_BYTES), *want = malloc(CL_BYTES);
    uint32_t heads[HEADS], counts[HEADS], ids[HEADS * FETCH_N], cache_id;
    int corrupt = 0;

    assert_non_null(recv);
    assert_non_null(want);
    *disk_p = 0;
    assert_int_equal(gw_dp_register_cache_mode(dp, 64, recv, RECV_BYTES, GW_DP_RECV_INLINE, &cache_id, NULL), RI_OK);
    for (uint32_t l = 0; l < LAYERS; l++)
        for (uint32_t b = 0; b < CLUSTERS / FETCH_N; b++) {
            gw_dp_fetch_result_t res;
            ri_status_t st;
            for (uint32_t h = 0; h < HEADS; h++) {
                heads[h] = h;
                counts[h] = FETCH_N;
                for (uint32_t j = 0; j < FETCH_N; j++)
                    ids[h * FETCH_N + j] = b * FETCH_N + j;
            }
            memset(recv, 0xee, RECV_BYTES);
            st = gw_dp_fetch_ranked(dp, cache_id, l, HEADS, heads, counts, ids, 0, 30000, &res);
            if (st == RI_ERR_CORRUPT) {
                corrupt++;
                continue;
            }
            assert_int_equal(st, RI_OK);
            assert_int_equal(res.view.n_entries, HEADS * FETCH_N);
            for (uint32_t k = 0; k < HEADS * FETCH_N; k++) {
                cm_dp_entry_t en;
                cm_dp_reply_entry(&res.view, k, &en);
                assert_true(en.flags & CM_DP_F_MISS);
                assert_int_equal(en.tokens, TOK);
                assert_int_equal(en.cluster, ids[k]);
                *disk_p += !!(en.flags & CM_DP_F_FROM_DISK);
                gen_cluster(l, k / FETCH_N, ids[k], want);
                assert_true(en.recv_offset + CL_BYTES <= RECV_BYTES);
                assert_memory_equal(recv + en.recv_offset, want, CL_BYTES);
            }
            gw_dp_fetch_result_free(&res);
        }
    assert_int_equal(gw_dp_release(dp, cache_id), RI_OK);
    free(recv);
    free(want);
    return corrupt;
}

static void test_spill_and_read_back(void **state)
{
    (void)state;
    static const gw_ctl_geometry_t geo = {.layers = LAYERS, .kv_heads = HEADS, .head_dim = DIM, .dtype = 1,
                                          .page_tokens = PT};
    uint32_t heads[HEADS], counts[HEADS], tokens[HEADS * UP_CHUNK];
    uint8_t *buf = malloc((size_t)HEADS * UP_CHUNK * CL_BYTES);
    gw_ctl_stats_t st;
    gw_ctl_t *ctl;
    gw_dp_t *dp;
    uint64_t disk;

    assert_int_equal(kvs_test_daemon_prepare(&g_d), 0);
    snprintf(g_spill, sizeof(g_spill), "%s/spill", g_d.dir);
    if (start_daemon(false) == 77)
        skip();
    assert_int_equal(gw_ctl_create(g_d.grpc, NULL, &ctl), RI_OK);
    assert_int_equal(gw_ctl_create_session(ctl, 5000, &geo, 1, "tier", &g_sess, NULL), RI_OK);
    gw_ctl_destroy(ctl);
    assert_int_equal(gw_dp_connect(g_sess.dataplane_address, g_sess.session_id, g_sess.secret, NULL, &dp), RI_OK);
    for (uint32_t i = 0; i < HEADS * UP_CHUNK; i++)
        tokens[i] = TOK;
    for (uint32_t l = 0; l < LAYERS; l++)
        for (uint32_t c = 0; c < CLUSTERS / UP_CHUNK; c++) {
            uint32_t first[HEADS];
            for (uint32_t h = 0; h < HEADS; h++) {
                heads[h] = h;
                counts[h] = UP_CHUNK;
                for (uint32_t j = 0; j < UP_CHUNK; j++)
                    gen_cluster(l, h, c * UP_CHUNK + j, buf + ((size_t)h * UP_CHUNK + j) * CL_BYTES);
            }
            assert_int_equal(gw_dp_upload(dp, c > 0, l, HEADS, heads, counts, tokens, buf,
                                          (size_t)HEADS * UP_CHUNK * CL_BYTES, first),
                             RI_OK);
            assert_int_equal(first[0], c * UP_CHUNK);
        }
    free(buf);
    get_stats(&st);
    assert_true(st.pool_bytes_used <= st.pool_bytes_total * 3 / 4 + st.pool_bytes_total / 32);
    assert_true(st.disk_bytes_used >= (uint64_t)48 << 20); /* at least 3/4 of 64 MiB went to disk */
    assert_true(metric("ri_kvs_spilled_clusters_total") > 0);

    assert_int_equal(fetch_all(dp, &disk), 0);
    assert_true(disk > (uint64_t)LAYERS * HEADS * CLUSTERS / 2);
    assert_int_equal(metric("ri_kvs_served_from_disk_total"), disk);
    assert_int_equal(metric("ri_kvs_served_from_pool_total"), (uint64_t)LAYERS * HEADS * CLUSTERS - disk);
    gw_dp_close(dp);
    assert_int_equal(kvs_test_daemon_stop(&g_d, SIGTERM, 20000), 0);
}

static void test_recover(void **state)
{
    (void)state;
    gw_ctl_session_info_t *infos = NULL;
    size_t n = 0;
    gw_ctl_t *ctl;
    gw_dp_t *dp;
    uint64_t disk;

    if (g_skip)
        skip();
    assert_int_equal(start_daemon(true), 0);
    assert_int_equal(gw_ctl_create(g_d.grpc, NULL, &ctl), RI_OK);
    assert_int_equal(gw_ctl_list_sessions(ctl, 5000, &infos, &n, NULL), RI_OK);
    assert_int_equal(n, 1);
    assert_int_equal(infos[0].session_id, g_sess.session_id);
    assert_string_equal(infos[0].label, "tier");
    assert_int_equal(infos[0].geometry.layers, LAYERS);
    assert_int_equal(infos[0].clusters, (uint64_t)LAYERS * HEADS * CLUSTERS);
    assert_true(infos[0].bytes_on_disk >= (uint64_t)64 << 20);
    /* The worker reconnects with the id and secret it already had, at the
     * address the restarted daemon lists for the session. */
    assert_int_equal(strncmp(infos[0].dataplane_address, "ucx:", 4), 0);
    snprintf(g_sess.dataplane_address, sizeof(g_sess.dataplane_address), "%s", infos[0].dataplane_address);
    cm_free(infos);
    gw_ctl_destroy(ctl);
    assert_int_equal(gw_dp_connect(g_sess.dataplane_address, g_sess.session_id, g_sess.secret, NULL, &dp), RI_OK);
    assert_int_equal(fetch_all(dp, &disk), 0);
    assert_int_equal(disk, (uint64_t)LAYERS * HEADS * CLUSTERS);
    gw_dp_close(dp);
    assert_int_equal(kvs_test_daemon_stop(&g_d, SIGTERM, 20000), 0);
}

/* Records are 64-byte header + 8 KiB payload, aligned to 4 KiB: 12 KiB apart. */
#define REC_STRIDE 12288

/* Flip one byte of the first segment file. */
static void flip_a_byte(off_t off)
{
    DIR *dir = opendir(g_spill);
    struct dirent *e;
    char path[800] = "";
    assert_non_null(dir);
    while ((e = readdir(dir)) != NULL)
        if (strncmp(e->d_name, "seg-", 4) == 0 && (path[0] == '\0' || strcmp(e->d_name, strrchr(path, '/') + 1) < 0))
            snprintf(path, sizeof(path), "%s/%s", g_spill, e->d_name);
    closedir(dir);
    assert_true(path[0] != '\0');
    int fd = open(path, O_RDWR);
    uint8_t b;
    assert_true(fd >= 0);
    assert_int_equal(pread(fd, &b, 1, off), 1);
    b ^= 0x5a;
    assert_int_equal(pwrite(fd, &b, 1, off), 1);
    close(fd);
}

static void test_corruption_detected(void **state)
{
    (void)state;
    gw_dp_t *dp;
    uint64_t disk;

    if (g_skip)
        skip();
    flip_a_byte(1000); /* inside the first record's payload */
    assert_int_equal(start_daemon(true), 0);
    refresh_address();
    assert_int_equal(gw_dp_connect(g_sess.dataplane_address, g_sess.session_id, g_sess.secret, NULL, &dp), RI_OK);
    /* Exactly the fetch that needs the damaged cluster fails; every byte
     * that is served is right (fetch_all compares them). */
    assert_int_equal(fetch_all(dp, &disk), 1);
    assert_int_equal(disk, (uint64_t)LAYERS * HEADS * CLUSTERS - HEADS * FETCH_N);
    assert_int_equal(metric("ri_kvs_clusters_lost_total"), 1);
    /* Now damage a record under the running daemon (a later layer's): the
     * read-back finds it, answers an error and marks the cluster lost. */
    flip_a_byte((off_t)REC_STRIDE * 4000 + 2000);
    assert_int_equal(fetch_all(dp, &disk), 2);
    assert_int_equal(disk, (uint64_t)LAYERS * HEADS * CLUSTERS - 2 * HEADS * FETCH_N);
    assert_int_equal(metric("ri_kvs_clusters_lost_total"), 2);
    assert_true(metric("kvs_spill_checksum_failures_total") >= 1);
    /* Lost stays lost: asking again answers the error without a read. */
    assert_int_equal(fetch_all(dp, &disk), 2);
    gw_dp_close(dp);
}

/* Fetch FETCH_N clusters per head of layer l from first; the status. */
static ri_status_t fetch_some(gw_dp_t *dp, uint32_t l, uint32_t first)
{
    uint8_t *recv = malloc(RECV_BYTES);
    uint32_t heads[HEADS], counts[HEADS], ids[HEADS * FETCH_N], cache_id;
    gw_dp_fetch_result_t res;
    ri_status_t st;
    assert_non_null(recv);
    assert_int_equal(gw_dp_register_cache_mode(dp, 64, recv, RECV_BYTES, GW_DP_RECV_INLINE, &cache_id, NULL), RI_OK);
    for (uint32_t h = 0; h < HEADS; h++) {
        heads[h] = h;
        counts[h] = FETCH_N;
        for (uint32_t j = 0; j < FETCH_N; j++)
            ids[h * FETCH_N + j] = first + j;
    }
    st = gw_dp_fetch_ranked(dp, cache_id, l, HEADS, heads, counts, ids, 0, 30000, &res);
    if (st == RI_OK)
        gw_dp_fetch_result_free(&res);
    assert_int_equal(gw_dp_release(dp, cache_id), RI_OK);
    free(recv);
    return st;
}

/* Is id among the daemon's sessions?  *addr_p (when not NULL) gets its
 * data-plane address. */
static bool listed(uint64_t id, char *addr_p, size_t addr_len)
{
    gw_ctl_t *ctl = NULL;
    gw_ctl_session_info_t *infos = NULL;
    size_t n = 0;
    bool found = false;

    assert_int_equal(gw_ctl_create(g_d.grpc, NULL, &ctl), RI_OK);
    assert_int_equal(gw_ctl_list_sessions(ctl, 5000, &infos, &n, NULL), RI_OK);
    for (size_t i = 0; i < n; i++)
        if (infos[i].session_id == id) {
            found = true;
            if (addr_p != NULL)
                snprintf(addr_p, addr_len, "%s", infos[i].dataplane_address);
        }
    cm_free(infos);
    gw_ctl_destroy(ctl);
    return found;
}

/* kill -9: what was only in the pool is gone after --recover, and a worker
 * asking for it is told RI_ERR_LOST (rebuild), not RI_ERR_RANGE.  A session
 * whose CreateSession answered just before (no upload) comes back with its
 * secret; one whose DropSession answered does not. */
static void test_kill9_memory_only_lost(void **state)
{
    (void)state;
    static const gw_ctl_geometry_t geo = {.layers = 1, .kv_heads = 1, .head_dim = DIM, .dtype = 1, .page_tokens = PT};
    uint32_t heads[HEADS], counts[HEADS], tokens[HEADS * FETCH_N], first[HEADS];
    uint8_t *buf = malloc((size_t)HEADS * FETCH_N * CL_BYTES);
    gw_ctl_session_t fresh, gone;
    gw_ctl_t *ctl;
    gw_dp_t *dp;

    if (g_skip)
        skip();
    assert_non_null(buf);
    /* the daemon of the last test is running: append clusters that stay in
     * the pool (everything else is on disk, so there is room) */
    assert_int_equal(gw_dp_connect(g_sess.dataplane_address, g_sess.session_id, g_sess.secret, NULL, &dp), RI_OK);
    for (uint32_t h = 0; h < HEADS; h++) {
        heads[h] = h;
        counts[h] = FETCH_N;
        for (uint32_t j = 0; j < FETCH_N; j++) {
            tokens[h * FETCH_N + j] = TOK;
            gen_cluster(0, h, CLUSTERS + j, buf + ((size_t)h * FETCH_N + j) * CL_BYTES);
        }
    }
    assert_int_equal(gw_dp_upload(dp, true, 0, HEADS, heads, counts, tokens, buf, (size_t)HEADS * FETCH_N * CL_BYTES,
                                  first),
                     RI_OK);
    assert_int_equal(first[0], CLUSTERS);
    assert_int_equal(fetch_some(dp, 0, CLUSTERS), RI_OK);
    gw_dp_close(dp);
    assert_int_equal(gw_ctl_create(g_d.grpc, NULL, &ctl), RI_OK);
    assert_int_equal(gw_ctl_create_session(ctl, 5000, &geo, 1, "gone", &gone, NULL), RI_OK);
    assert_int_equal(gw_ctl_drop_session(ctl, 5000, gone.session_id, NULL, NULL), RI_OK);
    assert_int_equal(gw_ctl_create_session(ctl, 5000, &geo, 1, "fresh", &fresh, NULL), RI_OK);
    gw_ctl_destroy(ctl);
    assert_int_equal(kvs_test_daemon_stop(&g_d, SIGKILL, 10000), 128 + SIGKILL);
    assert_int_equal(start_daemon(true), 0);
    refresh_address();
    /* The answered create is on disk: the worker reconnects with its secret. */
    assert_true(listed(fresh.session_id, fresh.dataplane_address, sizeof(fresh.dataplane_address)));
    assert_false(listed(gone.session_id, NULL, 0));
    assert_int_equal(gw_dp_connect(fresh.dataplane_address, fresh.session_id, fresh.secret, NULL, &dp), RI_OK);
    gw_dp_close(dp);
    assert_int_equal(gw_ctl_create(g_d.grpc, NULL, &ctl), RI_OK);
    assert_int_equal(gw_ctl_drop_session(ctl, 5000, fresh.session_id, NULL, NULL), RI_OK);
    gw_ctl_destroy(ctl);
    assert_int_equal(gw_dp_connect(g_sess.dataplane_address, g_sess.session_id, g_sess.secret, NULL, &dp), RI_OK);
    ri_status_t st = fetch_some(dp, 0, CLUSTERS);
    printf("# after kill -9 and --recover, memory-only clusters answer %s\n", ri_status_str(st));
    assert_int_equal(st, RI_ERR_LOST);
    assert_int_equal(fetch_some(dp, 1, 0), RI_OK); /* what was on disk is served */
    gw_dp_close(dp);
    free(buf);
}

static void test_drop_frees_disk(void **state)
{
    (void)state;
    gw_ctl_stats_t before, after;
    gw_ctl_t *ctl;
    uint64_t freed = 0;

    if (g_skip)
        skip();
    get_stats(&before);
    assert_true(before.disk_bytes_used > 0);
    assert_int_equal(gw_ctl_create(g_d.grpc, NULL, &ctl), RI_OK);
    assert_int_equal(gw_ctl_drop_session(ctl, 5000, g_sess.session_id, &freed, NULL), RI_OK);
    gw_ctl_destroy(ctl);
    assert_true(freed >= (uint64_t)60 << 20);
    get_stats(&after);
    assert_true(after.disk_bytes_used < before.disk_bytes_used);
    assert_int_equal(kvs_test_daemon_stop(&g_d, SIGTERM, 20000), 0);
}

/* A disk quota too small for the data: uploads end with a quota error once
 * neither pool nor disk has room; the daemon keeps serving what it holds. */
static void test_disk_quota(void **state)
{
    (void)state;
    static const gw_ctl_geometry_t geo = {.layers = LAYERS, .kv_heads = HEADS, .head_dim = DIM, .dtype = 1,
                                          .page_tokens = PT};
    uint32_t heads[HEADS], counts[HEADS], tokens[HEADS * UP_CHUNK];
    uint8_t *buf = malloc((size_t)HEADS * UP_CHUNK * CL_BYTES), *recv = malloc(RECV_BYTES), *want = malloc(CL_BYTES);
    gw_ctl_session_t sess;
    gw_ctl_t *ctl;
    gw_dp_t *dp;
    ri_status_t st = RI_OK;
    uint32_t msgs_ok = 0, cache_id;

    if (g_skip)
        skip();
    assert_int_equal(start_daemon_with(false, "--spill-quota=8MiB"), 0);
    assert_int_equal(gw_ctl_create(g_d.grpc, NULL, &ctl), RI_OK);
    assert_int_equal(gw_ctl_create_session(ctl, 5000, &geo, 1, "quota", &sess, NULL), RI_OK);
    gw_ctl_destroy(ctl);
    assert_int_equal(gw_dp_connect(sess.dataplane_address, sess.session_id, sess.secret, NULL, &dp), RI_OK);
    for (uint32_t i = 0; i < HEADS * UP_CHUNK; i++)
        tokens[i] = TOK;
    /* 4 MiB messages (layer by layer, appends) until one is refused: the
     * pool (16 MiB) and the disk quota (8 MiB) hold about 5 of the 16. */
    for (uint32_t m = 0; m < LAYERS * (CLUSTERS / UP_CHUNK) && st == RI_OK; m++) {
        uint32_t l = m / (CLUSTERS / UP_CHUNK), c = m % (CLUSTERS / UP_CHUNK);
        for (uint32_t h = 0; h < HEADS; h++) {
            heads[h] = h;
            counts[h] = UP_CHUNK;
            for (uint32_t j = 0; j < UP_CHUNK; j++)
                gen_cluster(l, h, c * UP_CHUNK + j, buf + ((size_t)h * UP_CHUNK + j) * CL_BYTES);
        }
        st = gw_dp_upload(dp, c > 0, l, HEADS, heads, counts, tokens, buf, (size_t)HEADS * UP_CHUNK * CL_BYTES,
                          NULL);
        msgs_ok += st == RI_OK;
    }
    assert_true(st == RI_ERR_QUOTA || st == RI_ERR_NOSPACE);
    assert_true(msgs_ok >= 4 && msgs_ok < 8);
    assert_true(metric("ri_kvs_spill_failures_total") >= 1);
    /* What was accepted is all there, bit-exact. */
    assert_int_equal(gw_dp_register_cache_mode(dp, 64, recv, RECV_BYTES, GW_DP_RECV_INLINE, &cache_id, NULL), RI_OK);
    for (uint32_t m = 0; m < msgs_ok; m++)
        for (uint32_t b = 0; b < UP_CHUNK / FETCH_N; b++) {
            uint32_t l = m / (CLUSTERS / UP_CHUNK), c = m % (CLUSTERS / UP_CHUNK), ids[HEADS * FETCH_N];
            gw_dp_fetch_result_t res;
            for (uint32_t h = 0; h < HEADS; h++) {
                counts[h] = FETCH_N;
                for (uint32_t j = 0; j < FETCH_N; j++)
                    ids[h * FETCH_N + j] = c * UP_CHUNK + b * FETCH_N + j;
            }
            assert_int_equal(gw_dp_fetch_ranked(dp, cache_id, l, HEADS, heads, counts, ids, 0, 30000, &res), RI_OK);
            for (uint32_t k = 0; k < HEADS * FETCH_N; k++) {
                cm_dp_entry_t en;
                cm_dp_reply_entry(&res.view, k, &en);
                gen_cluster(l, k / FETCH_N, ids[k], want);
                assert_memory_equal(recv + en.recv_offset, want, CL_BYTES);
            }
            gw_dp_fetch_result_free(&res);
        }
    gw_dp_close(dp);
    free(buf);
    free(recv);
    free(want);
    assert_int_equal(kvs_test_daemon_stop(&g_d, SIGTERM, 20000), 0);
}

static int group_teardown(void **state)
{
    (void)state;
    if (g_d.pid > 0)
        kvs_test_daemon_stop(&g_d, SIGKILL, 2000);
    kvs_test_daemon_cleanup(&g_d);
    return 0;
}

int main(void)
{
    /* The connection is TCP sockaddr; the data path may use shared memory. */
    setenv("UCX_TLS", "tcp,self", 0);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_spill_and_read_back),
        cmocka_unit_test(test_recover),
        cmocka_unit_test(test_corruption_detected),
        cmocka_unit_test(test_kill9_memory_only_lost),
        cmocka_unit_test(test_drop_frees_disk),
        cmocka_unit_test(test_disk_quota),
    };
    int rc = cmocka_run_group_tests(tests, NULL, group_teardown);
    return g_skip ? 77 : rc;
}
