/*
 * Spill tier basics, on the io_uring path ("uring") or the pread/pwrite path
 * ("pread", argv[1]): bit-exact round trips of cluster-sized and odd-sized
 * records, per-entry errors, replace/remove, session drop with compaction, the
 * disk quota, metrics, and the coldness helper.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <cmocka.h>

#include "kvstore/spill/kvs_spill.h"
#include "kvstore/spill/kvs_spill_cold.h"
#include "spill_test_util.h"

static bool g_uring = true;

typedef struct fixture {
    char *dir;
    kvs_spill_config_t cfg;
    kvs_spill_t *sp;
} fixture_t;

static int setup(void **state)
{
    fixture_t *f = calloc(1, sizeof(*f));
    f->dir = st_tmpdir();
    st_config(&f->cfg, f->dir, g_uring);
    f->sp = st_create_or_skip(&f->cfg);
    *state = f;
    return 0;
}

static int teardown(void **state)
{
    fixture_t *f = *state;
    kvs_spill_destroy(f->sp);
    st_rmtree(f->dir);
    free(f->dir);
    free(f);
    return 0;
}

static kvs_spill_key_t key(uint64_t s, uint32_t l, uint32_t h, uint32_t c)
{
    return (kvs_spill_key_t){.session = s, .layer = l, .head = h, .cluster = c};
}

/* Write n records keys[i] with sizes[i] (salt) in one batch; assert all OK. */
static void write_batch(kvs_spill_t *sp, const kvs_spill_key_t *keys, const uint32_t *sizes, size_t n, uint32_t salt)
{
    kvs_spill_wreq_t *w = calloc(n, sizeof(*w));
    for (size_t i = 0; i < n; i++) {
        void *p = malloc(sizes[i]);
        st_fill(p, sizes[i], &keys[i], salt);
        w[i] = (kvs_spill_wreq_t){.key = keys[i], .dtype = 1, .tokens = sizes[i] / 512, .payload = p,
                                  .payload_bytes = sizes[i]};
    }
    assert_int_equal(kvs_spill_write(sp, w, n), RI_OK);
    for (size_t i = 0; i < n; i++) {
        assert_int_equal(w[i].status, RI_OK);
        free((void *)w[i].payload);
    }
    free(w);
}

/* Read n records and check them against salt. */
static void read_check(kvs_spill_t *sp, const kvs_spill_key_t *keys, const uint32_t *sizes, size_t n, uint32_t salt)
{
    kvs_spill_rreq_t *r = calloc(n, sizeof(*r));
    for (size_t i = 0; i < n; i++)
        r[i] = (kvs_spill_rreq_t){.key = keys[i], .buf = malloc(65536), .buf_bytes = 65536};
    assert_int_equal(kvs_spill_read(sp, r, n), RI_OK);
    for (size_t i = 0; i < n; i++) {
        assert_int_equal(r[i].status, RI_OK);
        assert_int_equal(r[i].payload_bytes, sizes[i]);
        assert_int_equal(r[i].tokens, sizes[i] / 512);
        assert_int_equal(r[i].dtype, 1);
        assert_true(st_check(r[i].buf, sizes[i], &keys[i], salt));
        free(r[i].buf);
    }
    free(r);
}

static void test_roundtrip_mixed_sizes(void **state)
{
    fixture_t *f = *state;
    enum { N = 600 };
    static kvs_spill_key_t keys[N];
    static uint32_t sizes[N];
    /* d=128 and d=64 clusters of 16 tokens (K+V fp16), and awkward sizes. */
    const uint32_t menu[] = {8192, 4096, 1, 100, 4032, 4033, 12000, 16384, 65536 - 64};
    for (size_t i = 0; i < N; i++) {
        keys[i] = key(7, (uint32_t)(i % 30), (uint32_t)(i % 3), (uint32_t)i);
        sizes[i] = menu[i % (sizeof(menu) / sizeof(menu[0]))];
    }
    for (size_t b = 0; b < N; b += 97)
        write_batch(f->sp, keys + b, sizes + b, b + 97 <= N ? 97 : N - b, 1);
    /* Read back in a shuffled order, batches of 50. */
    static kvs_spill_key_t sk[N];
    static uint32_t ss[N];
    size_t perm[N];
    for (size_t i = 0; i < N; i++)
        perm[i] = i;
    srand(42);
    for (size_t i = N - 1; i > 0; i--) {
        size_t j = (size_t)rand() % (i + 1), t = perm[i];
        perm[i] = perm[j];
        perm[j] = t;
    }
    for (size_t i = 0; i < N; i++) {
        sk[i] = keys[perm[i]];
        ss[i] = sizes[perm[i]];
    }
    for (size_t b = 0; b < N; b += 50)
        read_check(f->sp, sk + b, ss + b, 50, 1);
    kvs_spill_stats_t s;
    kvs_spill_stats(f->sp, &s);
    assert_int_equal(s.records, N);
    assert_int_equal(s.written_records, N);
    assert_int_equal(s.read_records, N);
    assert_int_equal(s.checksum_failures, 0);
    assert_int_equal(s.uring, g_uring);
    assert_true(s.segments >= 2);   /* crossed 4 MiB segment boundaries */
}

static void test_entry_errors(void **state)
{
    fixture_t *f = *state;
    kvs_spill_key_t k = key(1, 0, 0, 0);
    uint32_t sz = 8192;
    write_batch(f->sp, &k, &sz, 1, 1);

    /* Replace: the newer payload wins. */
    write_batch(f->sp, &k, &sz, 1, 2);
    read_check(f->sp, &k, &sz, 1, 2);

    /* Per-entry statuses in one batch: ok, missing, too small a buffer. */
    uint8_t big[8192], small[100];
    kvs_spill_rreq_t r[3] = {
        {.key = k, .buf = big, .buf_bytes = sizeof(big)},
        {.key = key(1, 0, 0, 99), .buf = big, .buf_bytes = sizeof(big)},
        {.key = k, .buf = small, .buf_bytes = sizeof(small)},
    };
    assert_int_equal(kvs_spill_read(f->sp, r, 3), RI_ERR_NOT_FOUND);
    assert_int_equal(r[0].status, RI_OK);
    assert_int_equal(r[1].status, RI_ERR_NOT_FOUND);
    assert_int_equal(r[2].status, RI_ERR_RANGE);
    assert_true(st_check(big, 8192, &k, 2));

    /* Invalid writes: empty payload, session 0, too large. */
    static uint8_t huge[70000];
    kvs_spill_wreq_t w[3] = {
        {.key = key(1, 0, 0, 1), .payload = big, .payload_bytes = 0},
        {.key = key(0, 0, 0, 1), .payload = big, .payload_bytes = 10},
        {.key = key(1, 0, 0, 2), .payload = huge, .payload_bytes = sizeof(huge)},
    };
    assert_int_not_equal(kvs_spill_write(f->sp, w, 3), RI_OK);
    assert_int_equal(w[0].status, RI_ERR_INVALID);
    assert_int_equal(w[1].status, RI_ERR_INVALID);
    assert_int_equal(w[2].status, RI_ERR_TOO_LARGE);

    kvs_spill_info_t info;
    assert_int_equal(kvs_spill_stat(f->sp, &k, &info), RI_OK);
    assert_int_equal(info.payload_bytes, 8192);
    assert_false(info.lost);
    kvs_spill_remove(f->sp, &k, 1);
    assert_int_equal(kvs_spill_stat(f->sp, &k, &info), RI_ERR_NOT_FOUND);
    assert_int_equal(kvs_spill_read(f->sp, r, 1), RI_ERR_NOT_FOUND);
}

static void test_drop_and_compact(void **state)
{
    fixture_t *f = *state;
    enum { N = 1200 };   /* 2 x 1200 x 12 KiB = ~28 MiB over 4 MiB segments */
    static kvs_spill_key_t k1[N], k2[N];
    static uint32_t sz[N];
    for (size_t i = 0; i < N; i++) {
        k1[i] = key(11, 0, 0, (uint32_t)i);
        k2[i] = key(22, 0, 0, (uint32_t)i);
        sz[i] = 8192;
    }
    for (size_t b = 0; b < N; b += 100) {
        write_batch(f->sp, k1 + b, sz, 100, 3);   /* interleave the sessions */
        write_batch(f->sp, k2 + b, sz, 100, 4);
    }
    kvs_spill_stats_t before, after;
    kvs_spill_stats(f->sp, &before);
    uint64_t freed = 0;
    assert_int_equal(kvs_spill_drop_session(f->sp, 11, &freed), RI_OK);
    assert_int_equal(freed, (uint64_t)N * 12288);
    assert_int_equal(kvs_spill_drop_session(f->sp, 11, NULL), RI_ERR_NOT_FOUND);
    uint64_t reclaimed = 0;
    assert_int_equal(kvs_spill_compact(f->sp, &reclaimed), RI_OK);
    assert_true(reclaimed > 0);
    kvs_spill_stats(f->sp, &after);
    assert_true(after.disk_bytes < before.disk_bytes);
    assert_true(after.used_bytes < before.used_bytes);
    assert_int_equal(after.records, N);
    assert_true(after.compactions > 0);
    /* Session 22 is intact after its records were moved. */
    for (size_t b = 0; b < N; b += 200)
        read_check(f->sp, k2 + b, sz, 200, 4);
    kvs_spill_rreq_t r = {.key = k1[5], .buf = malloc(8192), .buf_bytes = 8192};
    assert_int_equal(kvs_spill_read(f->sp, &r, 1), RI_ERR_NOT_FOUND);
    free(r.buf);
}

static void test_quota(void **state)
{
    fixture_t *f = *state;
    kvs_spill_destroy(f->sp);
    f->cfg.quota_bytes = 1u << 20;   /* 85 records of 12 KiB */
    f->sp = st_create_or_skip(&f->cfg);
    enum { N = 60 };
    kvs_spill_key_t keys[N];
    uint32_t sz[N];
    for (size_t i = 0; i < N; i++) {
        keys[i] = key(5, 0, 0, (uint32_t)i);
        sz[i] = 8192;
    }
    write_batch(f->sp, keys, sz, 40, 1);   /* 480 KiB */
    kvs_spill_stats_t a, b;
    kvs_spill_stats(f->sp, &a);

    /* 60 more would pass 1 MiB: refused as a whole, nothing written. */
    kvs_spill_key_t more[N];
    kvs_spill_wreq_t w[N];
    static uint8_t payload[8192];
    for (size_t i = 0; i < N; i++) {
        more[i] = key(5, 1, 0, (uint32_t)i);
        w[i] = (kvs_spill_wreq_t){.key = more[i], .dtype = 1, .payload = payload, .payload_bytes = 8192};
    }
    assert_int_equal(kvs_spill_write(f->sp, w, N), RI_ERR_QUOTA);
    for (size_t i = 0; i < N; i++)
        assert_int_equal(w[i].status, RI_ERR_QUOTA);
    kvs_spill_stats(f->sp, &b);
    assert_int_equal(b.used_bytes, a.used_bytes);
    assert_int_equal(b.records, a.records);
    assert_int_equal(b.written_records, a.written_records);
    assert_int_equal(b.quota_rejections, 1);
    kvs_spill_info_t info;
    assert_int_equal(kvs_spill_stat(f->sp, &more[0], &info), RI_ERR_NOT_FOUND);
    /* A batch that fits still goes through. */
    write_batch(f->sp, keys + 40, sz, 20, 1);
    read_check(f->sp, keys, sz, N, 1);
}

static void test_metrics(void **state)
{
    fixture_t *f = *state;
    kvs_spill_key_t keys[10];
    uint32_t sz[10];
    for (size_t i = 0; i < 10; i++) {
        keys[i] = key(3, 0, 0, (uint32_t)i);
        sz[i] = 4096;
    }
    write_batch(f->sp, keys, sz, 10, 1);
    read_check(f->sp, keys, sz, 10, 1);
    char *text = NULL;
    size_t len = 0;
    FILE *out = open_memstream(&text, &len);
    kvs_spill_metrics_write(f->sp, out);
    fclose(out);
    assert_non_null(strstr(text, "\nkvs_spill_records 10\n"));
    assert_non_null(strstr(text, "\nkvs_spill_written_records_total 10\n"));
    assert_non_null(strstr(text, "\nkvs_spill_read_bytes_total 40960\n"));
    assert_non_null(strstr(text, "\nkvs_spill_checksum_failures_total 0\n"));
    assert_non_null(strstr(text, "\nkvs_spill_io_errors_total 0\n"));
    assert_non_null(strstr(text, "# TYPE kvs_spill_read_batch_seconds histogram"));
    assert_non_null(strstr(text, "kvs_spill_read_batch_seconds_count 1\n"));
    assert_non_null(strstr(text, "kvs_spill_disk_bytes "));
    free(text);
}

static void count_visit(void *arg, const kvs_spill_info_t *info)
{
    size_t *n = arg;
    assert_int_equal(info->key.session, 8);
    (*n)++;
}

static void test_foreach_counts(void **state)
{
    fixture_t *f = *state;
    kvs_spill_key_t keys[6];
    uint32_t sz[6];
    for (size_t i = 0; i < 6; i++) {
        keys[i] = key(i < 4 ? 8 : 9, 0, 0, (uint32_t)i);
        sz[i] = 100;
    }
    write_batch(f->sp, keys, sz, 6, 1);
    size_t n = 0;
    kvs_spill_foreach(f->sp, 8, count_visit, &n);
    assert_int_equal(n, 4);
}

static void test_cold_policy(void **state)
{
    kvs_spill_cold_t *c;
    assert_int_equal(kvs_spill_cold_create(&c), RI_OK);
    for (uint32_t i = 0; i < 3000; i++) {
        kvs_spill_key_t k = key(1 + i % 2, 0, 0, i);
        assert_int_equal(kvs_spill_cold_touch(c, &k, 8192), RI_OK);
    }
    assert_int_equal(kvs_spill_cold_count(c), 3000);
    kvs_spill_key_t k0 = key(1, 0, 0, 0), k1 = key(2, 0, 0, 1), k2 = key(1, 0, 0, 2);
    kvs_spill_cold_touch(c, &k0, 8192);           /* 0 becomes the hottest */
    assert_int_equal(kvs_spill_cold_pin(c, &k1), RI_OK);   /* 1 is in a fetch */
    kvs_spill_key_t out[4];
    assert_int_equal(kvs_spill_cold_pick(c, 4, 0, out), 4);
    assert_int_equal(out[0].cluster, 2);          /* coldest unpinned first */
    assert_int_equal(out[1].cluster, 3);
    assert_int_equal(kvs_spill_cold_pick(c, 4, 8192 * 2, out), 2);   /* byte limit */
    kvs_spill_cold_unpin(c, &k1);
    assert_int_equal(kvs_spill_cold_pick(c, 1, 0, out), 1);
    assert_int_equal(out[0].cluster, 1);
    kvs_spill_cold_remove(c, &k1);
    kvs_spill_cold_remove(c, &k2);
    assert_int_equal(kvs_spill_cold_pick(c, 1, 0, out), 1);
    assert_int_equal(out[0].cluster, 3);
    kvs_spill_key_t missing = key(77, 0, 0, 0);
    assert_int_equal(kvs_spill_cold_pin(c, &missing), RI_ERR_NOT_FOUND);
    assert_int_equal(kvs_spill_cold_drop_session(c, 2), 1499);
    assert_int_equal(kvs_spill_cold_count(c), 1499);
    kvs_spill_cold_destroy(c);
    kvs_spill_cold_destroy(NULL);
}

int main(int argc, char **argv)
{
    g_uring = st_mode_uring(argc, argv);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_roundtrip_mixed_sizes, setup, teardown),
        cmocka_unit_test_setup_teardown(test_entry_errors, setup, teardown),
        cmocka_unit_test_setup_teardown(test_drop_and_compact, setup, teardown),
        cmocka_unit_test_setup_teardown(test_quota, setup, teardown),
        cmocka_unit_test_setup_teardown(test_metrics, setup, teardown),
        cmocka_unit_test_setup_teardown(test_foreach_counts, setup, teardown),
        cmocka_unit_test(test_cold_policy),
    };
    kvs_spill_destroy(NULL);
    return cmocka_run_group_tests(tests, NULL, NULL);
}
