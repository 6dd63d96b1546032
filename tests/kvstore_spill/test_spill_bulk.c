/*
 * Spill more than the memory budget and read it all back bit-exact, as the
 * pool does under pressure: the test holds at most one batch of payloads
 * (regenerated from the key for the comparison), far below the data size.
 * The budget is measured, not assumed: the high-water marks of every named
 * allocation (the store's index, bounce buffers, manifests; cm_alloc counts
 * them per tag) plus the test's own buffers must stay within BUDGET_MIB, and
 * DATA_MIB must exceed it.
 * Usage: test_kvs_spill_bulk uring|pread DATA_MIB BUDGET_MIB [mutant-retain]
 * (unit: 64 MiB through a 16 MiB budget; slow: 256 MiB through 64 MiB.)
 * mutant-retain (pread only) turns on an injected fault that keeps a copy of
 * every spilled record in memory: the test must then fail on the budget.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <cmocka.h>

#include "common/cm_alloc.h"
#include "common/cm_time.h"
#include "kvstore/spill/kvs_spill.h"
#include "spill_test_util.h"

static bool g_uring = true;
static uint64_t g_data_mib = 64, g_budget_mib = 16;
static bool g_mutant_retain = false;

/* Sum of every tag's high-water mark: an upper bound on the most our code had
 * allocated at once (tags peak at different times). */
static void add_peak(const cm_alloc_tag_t *tag, void *arg)
{
    *(uint64_t *)arg += atomic_load(&tag->peak_bytes);
}

static uint64_t alloc_peak_bytes(void)
{
    uint64_t sum = 0;
    cm_alloc_visit(add_peak, &sum);
    return sum;
}

#define PAYLOAD 8192u   /* 16 tokens x d=128 x (K+V) x fp16 */

static void test_bigger_than_budget(void **state)
{
    char *dir = st_tmpdir();
    kvs_spill_config_t cfg;
    st_config(&cfg, dir, g_uring);
    cfg.segment_bytes = 64u << 20;
    cfg.compact_interval_ms = 100;   /* the background thread runs meanwhile */
    if (g_mutant_retain) {
        cfg.ops = st_fault_ops();
        st_fault_arm(ST_F_PWRITE, ST_K_RETAIN, 0, 0, -1);
    }
    assert_true(g_data_mib > g_budget_mib);
    kvs_spill_t *sp = st_create_or_skip(&cfg);

    const uint32_t n = (uint32_t)(g_data_mib * 1048576ull / PAYLOAD);
    const uint32_t batch = 512;   /* 4 MiB of payload in memory at a time */
    uint8_t *buf = malloc((size_t)batch * PAYLOAD);
    kvs_spill_wreq_t *w = calloc(batch, sizeof(*w));
    kvs_spill_rreq_t *r = calloc(batch, sizeof(*r));
    /* What the test itself holds (malloc, so not in the tags). */
    const uint64_t own = (uint64_t)batch * (PAYLOAD + sizeof(*w) + sizeof(*r)) + (uint64_t)n * sizeof(uint32_t);

    /* Write: 32 layers x 8 heads x clusters, in order. */
    double t0 = cm_time_s();
    for (uint32_t b = 0; b < n; b += batch) {
        uint32_t m = n - b < batch ? n - b : batch;
        for (uint32_t i = 0; i < m; i++) {
            uint32_t id = b + i;
            kvs_spill_key_t k = {.session = 1, .layer = id % 32, .head = (id / 32) % 8, .cluster = id / 256};
            st_fill(buf + (size_t)i * PAYLOAD, PAYLOAD, &k, 5);
            w[i] = (kvs_spill_wreq_t){.key = k, .dtype = 1, .tokens = 16, .payload = buf + (size_t)i * PAYLOAD,
                                      .payload_bytes = PAYLOAD};
        }
        assert_int_equal(kvs_spill_write(sp, w, m), RI_OK);
    }
    double tw = cm_time_s() - t0;

    /* Read back in a random order. */
    uint32_t *perm = malloc((size_t)n * sizeof(*perm));
    for (uint32_t i = 0; i < n; i++)
        perm[i] = i;
    srand(7);
    for (uint32_t i = n - 1; i > 0; i--) {
        uint32_t j = (uint32_t)rand() % (i + 1), t = perm[i];
        perm[i] = perm[j];
        perm[j] = t;
    }
    t0 = cm_time_s();
    for (uint32_t b = 0; b < n; b += batch) {
        uint32_t m = n - b < batch ? n - b : batch;
        for (uint32_t i = 0; i < m; i++) {
            uint32_t id = perm[b + i];
            kvs_spill_key_t k = {.session = 1, .layer = id % 32, .head = (id / 32) % 8, .cluster = id / 256};
            r[i] = (kvs_spill_rreq_t){.key = k, .buf = buf + (size_t)i * PAYLOAD, .buf_bytes = PAYLOAD};
        }
        assert_int_equal(kvs_spill_read(sp, r, m), RI_OK);
        for (uint32_t i = 0; i < m; i++)
            assert_true(st_check(r[i].buf, PAYLOAD, &r[i].key, 5));
    }
    double tr = cm_time_s() - t0;
    kvs_spill_stats_t s;
    kvs_spill_stats(sp, &s);
    assert_int_equal(s.records, n);
    assert_int_equal(s.read_records, n);
    assert_int_equal(s.checksum_failures, 0);
    const uint64_t peak = alloc_peak_bytes() + own, budget = g_budget_mib * 1048576ull;
    printf("# memory: peak %.1f MiB (store %.1f + test %.1f) for %llu MiB spilled, budget %llu MiB\n",
           (double)peak / 1048576.0, (double)(peak - own) / 1048576.0, (double)own / 1048576.0,
           (unsigned long long)g_data_mib, (unsigned long long)g_budget_mib);
    if (peak > budget)
        fail_msg("memory peak %llu bytes exceeds the budget of %llu", (unsigned long long)peak,
                 (unsigned long long)budget);
    printf("# %s: %llu MiB (budget %llu MiB): write %.0f MB/s, random read %.0f MB/s\n",
           g_uring ? "io_uring" : "pread", (unsigned long long)g_data_mib, (unsigned long long)g_budget_mib,
           (double)n * PAYLOAD / tw / 1e6, (double)n * PAYLOAD / tr / 1e6);
    free(perm);
    free(r);
    free(w);
    free(buf);
    kvs_spill_destroy(sp);
    st_fault_off();
    st_rmtree(dir);
    free(dir);
}

int main(int argc, char **argv)
{
    g_uring = st_mode_uring(argc, argv);
    if (argc > 2)
        g_data_mib = strtoull(argv[2], NULL, 10);
    if (argc > 3)
        g_budget_mib = strtoull(argv[3], NULL, 10);
    g_mutant_retain = argc > 4 && strcmp(argv[4], "mutant-retain") == 0;
    if (g_mutant_retain)
        printf("mutation on: every spilled record is also kept in memory (this run must fail)\n");
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_bigger_than_budget),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
