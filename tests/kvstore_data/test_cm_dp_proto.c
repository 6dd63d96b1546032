/*
 * Op meta encode/decode (common/cm_dp_proto.h): round trips, and malformed
 * inputs -- every truncation of a valid block, counts that overflow or
 * disagree with the bytes, reserved fields set, random bytes -- must be
 * refused without reading outside the block (run under ASan in CI).
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <cmocka.h>

#include "common/cm_dp_proto.h"

/* Decode from an exact-size heap copy so that ASan sees any overread. */
static ri_status_t dec_clusters(const uint8_t *b, size_t n, cm_dp_clusters_view_t *v)
{
    uint8_t *c = malloc(n ? n : 1);
    memcpy(c, b, n);
    ri_status_t st = cm_dp_clusters_decode(c, n, v);
    free(c);
    return st;
}

static void test_clusters(void **state)
{
    uint32_t heads[2] = {3, 1}, counts[2] = {2, 3}, tokens[5] = {16, 9, 1, 30, 16};
    size_t n = cm_dp_clusters_meta_size(2, 5);
    uint8_t buf[128];
    cm_dp_clusters_view_t v;

    (void)state;
    cm_dp_clusters_encode(buf, 7, 2, heads, counts, tokens);
    assert_int_equal(cm_dp_clusters_decode(buf, n, &v), RI_OK);
    assert_int_equal(v.layer, 7);
    assert_int_equal(v.n_heads, 2);
    assert_int_equal(v.total_clusters, 5);
    assert_int_equal(cm_dp_clusters_head(&v, 1), 1);
    assert_int_equal(cm_dp_clusters_count(&v, 1), 3);
    assert_int_equal(cm_dp_clusters_tokens(&v, 3), 30);
    for (size_t k = 0; k < n; k++)
        assert_int_not_equal(dec_clusters(buf, k, &v), RI_OK);
    assert_int_equal(dec_clusters(buf, n + 4, &v), RI_ERR_PROTOCOL);
    /* a count so large the sum would wrap a u32 */
    cm_dp_put32(buf + 12, 0xffffffffu);
    assert_int_equal(dec_clusters(buf, n, &v), RI_ERR_TOO_LARGE);
    cm_dp_put32(buf + 12, 2);
    cm_dp_put32(buf + 4, 100000); /* n_heads */
    assert_int_equal(dec_clusters(buf, n, &v), RI_ERR_TOO_LARGE);
    cm_dp_put32(buf + 4, 0);
    assert_int_equal(dec_clusters(buf, n, &v), RI_ERR_PROTOCOL);
    assert_int_equal(cm_dp_clusters_decode(NULL, 0, &v), RI_ERR_TRUNCATED);
}

static void test_fetch(void **state)
{
    uint32_t heads[2] = {0, 5}, counts[2] = {3, 1}, ids[4] = {9, 2, 7, 100};
    size_t n = cm_dp_fetch_meta_size(2, 4);
    uint8_t buf[128];
    cm_dp_fetch_view_t v;

    (void)state;
    cm_dp_fetch_encode(buf, 4, 1, 4096, 2, heads, counts, ids);
    assert_int_equal(cm_dp_fetch_decode(buf, n, &v), RI_OK);
    assert_int_equal(v.cache_id, 4);
    assert_int_equal(v.layer, 1);
    assert_int_equal(v.recv_offset, 4096);
    assert_int_equal(v.total_ids, 4);
    assert_int_equal(cm_dp_get32(v.ids + 12), 100);
    for (size_t k = 0; k < n; k++) {
        uint8_t *c = malloc(k ? k : 1);
        memcpy(c, buf, k);
        assert_int_not_equal(cm_dp_fetch_decode(c, k, &v), RI_OK);
        free(c);
    }
    cm_dp_put32(buf + 12, 1); /* reserved */
    assert_int_equal(cm_dp_fetch_decode(buf, n, &v), RI_ERR_PROTOCOL);
}

static void test_register(void **state)
{
    uint8_t rk[5] = {1, 2, 3, 4, 5}, buf[64];
    cm_dp_register_t r = {.capacity_pages = 10, .rkey_len = 5, .recv_addr = 0x1000, .recv_len = 1 << 20, .rkey = rk},
                     o;

    (void)state;
    cm_dp_register_encode(buf, &r);
    assert_int_equal(cm_dp_register_decode(buf, CM_DP_REGISTER_FIXED + 5, &o), RI_OK);
    assert_int_equal(o.capacity_pages, 10);
    assert_memory_equal(o.rkey, rk, 5);
    assert_int_equal(cm_dp_register_decode(buf, CM_DP_REGISTER_FIXED + 4, &o), RI_ERR_TRUNCATED);
    assert_int_equal(cm_dp_register_decode(buf, CM_DP_REGISTER_FIXED + 6, &o), RI_ERR_PROTOCOL);
    cm_dp_put64(buf + 8, UINT64_MAX - 5); /* address + length wraps */
    assert_int_equal(cm_dp_register_decode(buf, CM_DP_REGISTER_FIXED + 5, &o), RI_ERR_RANGE);
    cm_dp_put32(buf + 4, 1u << 20);
    assert_int_equal(cm_dp_register_decode(buf, CM_DP_REGISTER_FIXED + 5, &o), RI_ERR_TOO_LARGE);
}

static void test_fetch_reply(void **state)
{
    size_t n = cm_dp_fetch_reply_size(1, 2, 3, 1);
    uint8_t *buf = calloc(1, n);
    cm_dp_fetch_reply_view_t v = {0};
    cm_dp_entry_t e0 = {.cluster = 4, .flags = CM_DP_F_HIT, .tokens = 16, .n_pages = 2, .page_index = 0},
                  e1 = {.cluster = 9, .flags = CM_DP_F_MISS | CM_DP_F_ADMITTED, .tokens = 3, .n_pages = 1,
                        .page_index = 2, .recv_offset = 8192},
                  g;

    (void)state;
    cm_dp_fetch_reply_header(buf, 1, 2, 3, 1, 2048);
    cm_dp_put32(buf + 24, 0);
    cm_dp_put32(buf + 28, 2);
    cm_dp_entry_encode(buf + 32, &e0);
    cm_dp_entry_encode(buf + 64, &e1);
    assert_int_equal(cm_dp_fetch_reply_decode(buf, n, &v), RI_OK);
    cm_dp_reply_entry(&v, 1, &g);
    assert_int_equal(g.recv_offset, 8192);
    assert_int_equal(g.flags, e1.flags);
    for (size_t k = 0; k < n; k++) {
        uint8_t *c = malloc(k ? k : 1);
        memcpy(c, buf, k);
        assert_int_not_equal(cm_dp_fetch_reply_decode(c, k, &v), RI_OK);
        free(c);
    }
    /* page range outside the page list */
    e0.page_index = 2;
    cm_dp_entry_encode(buf + 32, &e0);
    assert_int_equal(cm_dp_fetch_reply_decode(buf, n, &v), RI_ERR_PROTOCOL);
    e0.page_index = 0;
    e0.flags = CM_DP_F_HIT | CM_DP_F_MISS;
    cm_dp_entry_encode(buf + 32, &e0);
    assert_int_equal(cm_dp_fetch_reply_decode(buf, n, &v), RI_ERR_PROTOCOL);
    free(buf);
}

static void test_random_bytes(void **state)
{
    uint8_t buf[256];
    cm_dp_clusters_view_t cv;
    cm_dp_fetch_view_t fv;
    cm_dp_register_t rv;
    cm_dp_fetch_reply_view_t pv = {0};

    (void)state;
    srand((unsigned)time(NULL));
    for (int i = 0; i < 20000; i++) {
        size_t n = (size_t)(rand() % 256);
        for (size_t k = 0; k < n; k++)
            buf[k] = (uint8_t)(rand() % 4 == 0 ? rand() : rand() % 3);
        uint8_t *c = malloc(n ? n : 1);
        memcpy(c, buf, n);
        /* Any verdict is fine; reading outside c is not (ASan). */
        (void)cm_dp_clusters_decode(c, n, &cv);
        (void)cm_dp_fetch_decode(c, n, &fv);
        (void)cm_dp_register_decode(c, n, &rv);
        if (cm_dp_fetch_reply_decode(c, n, &pv) == RI_OK)
            assert_true(cm_dp_fetch_reply_size(pv.n_heads, pv.n_entries, pv.n_pages, pv.n_evicted) == n);
        free(c);
    }
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_clusters),  cmocka_unit_test(test_fetch),        cmocka_unit_test(test_register),
        cmocka_unit_test(test_fetch_reply), cmocka_unit_test(test_random_bytes),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
