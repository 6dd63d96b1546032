/* Unit tests of the host block pool's extent allocator: exact accounting,
 * coalescing back to one extent, best fit, and a random alloc/free sequence
 * checked against a per-unit ownership map. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <cmocka.h>

#include "kvstore/data/kvs_pool.h"

#define U KVS_POOL_UNIT

static void test_pool_basic(void **state)
{
    kvs_pool_t *pool;
    kvs_pool_stats_t s;
    uint64_t a, b, c;

    (void)state;
    assert_int_equal(kvs_pool_create(0, false, &pool), RI_ERR_INVALID);
    assert_int_equal(kvs_pool_create(16 * U, false, &pool), RI_OK);
    assert_int_equal(kvs_pool_size(pool), 16 * U);
    assert_int_equal(kvs_pool_alloc(pool, 0, &a), RI_ERR_INVALID);
    assert_int_equal(kvs_pool_alloc(pool, 1, &a), RI_OK);       /* rounds to one unit */
    assert_int_equal(kvs_pool_alloc(pool, 3 * U, &b), RI_OK);
    assert_int_equal(kvs_pool_alloc(pool, 12 * U, &c), RI_OK);  /* exactly the rest */
    assert_int_equal(a, 0);
    assert_int_equal(b, U);
    assert_int_equal(c, 4 * U);
    kvs_pool_stats(pool, &s);
    assert_int_equal(s.used_bytes, 16 * U);
    assert_int_equal(s.free_extents, 0);
    /* Full: a failure changes nothing. */
    assert_int_equal(kvs_pool_alloc(pool, 1, &a), RI_ERR_NOSPACE);
    kvs_pool_stats(pool, &s);
    assert_int_equal(s.alloc_failures, 1);
    assert_true(kvs_pool_pressure(pool) == 1.0);
    /* Free the middle, then the ends: coalesces to one extent. */
    kvs_pool_free(pool, b, 3 * U);
    kvs_pool_stats(pool, &s);
    assert_int_equal(s.free_extents, 1);
    assert_int_equal(s.largest_free_bytes, 3 * U);
    kvs_pool_free(pool, 0, 1);
    kvs_pool_free(pool, c, 12 * U);
    kvs_pool_stats(pool, &s);
    assert_int_equal(s.free_extents, 1);
    assert_int_equal(s.largest_free_bytes, 16 * U);
    assert_int_equal(s.used_bytes, 0);
    /* A double free is refused (logged), accounting unchanged. */
    kvs_pool_free(pool, 0, U);
    kvs_pool_stats(pool, &s);
    assert_int_equal(s.used_bytes, 0);
    kvs_pool_destroy(pool);
    kvs_pool_destroy(NULL);
}

static void test_pool_best_fit(void **state)
{
    kvs_pool_t *pool;
    uint64_t o[6], x;

    (void)state;
    assert_int_equal(kvs_pool_create(20 * U, true, &pool), RI_OK);
    /* holes of 4 units at 0 and 2 units at 6 */
    assert_int_equal(kvs_pool_alloc(pool, 4 * U, &o[0]), RI_OK);
    assert_int_equal(kvs_pool_alloc(pool, 2 * U, &o[1]), RI_OK);
    assert_int_equal(kvs_pool_alloc(pool, 2 * U, &o[2]), RI_OK);
    assert_int_equal(kvs_pool_alloc(pool, 1 * U, &o[3]), RI_OK);
    kvs_pool_free(pool, o[0], 4 * U);
    kvs_pool_free(pool, o[2], 2 * U);
    /* 2 units go to the 2-unit hole, not the 4-unit one or the tail. */
    assert_int_equal(kvs_pool_alloc(pool, 2 * U, &x), RI_OK);
    assert_int_equal(x, o[2]);
    assert_int_equal(kvs_pool_alloc(pool, 3 * U, &x), RI_OK);
    assert_int_equal(x, o[0]);
    /* The whole arena is readable and writable. */
    memset(kvs_pool_base(pool), 0xab, 20 * U);
    kvs_pool_destroy(pool);
}

static void test_pool_random(void **state)
{
    enum { UNITS = 512, SLOTS = 64 };
    kvs_pool_t *pool;
    uint64_t off[SLOTS], len[SLOTS];
    int owner[UNITS];
    uint64_t used = 0;
    unsigned seed = (unsigned)time(NULL);

    (void)state;
    srand(seed);
    memset(owner, -1, sizeof(owner));
    memset(len, 0, sizeof(len));
    assert_int_equal(kvs_pool_create(UNITS * U, false, &pool), RI_OK);
    for (int step = 0; step < 20000; step++) {
        int k = rand() % SLOTS;
        if (len[k] == 0) {
            uint64_t n = 1 + (uint64_t)(rand() % 40);
            ri_status_t st = kvs_pool_alloc(pool, n * U - (uint64_t)(rand() % U), &off[k]);
            if (st == RI_ERR_NOSPACE)
                continue;
            assert_int_equal(st, RI_OK);
            assert_int_equal(off[k] % U, 0);
            assert_true(off[k] / U + n <= UNITS);
            for (uint64_t u = off[k] / U; u < off[k] / U + n; u++) {
                assert_int_equal(owner[u], -1); /* no overlap with a live extent */
                owner[u] = k;
            }
            len[k] = n;
            used += n * U;
        } else {
            kvs_pool_free(pool, off[k], len[k] * U);
            for (uint64_t u = off[k] / U; u < off[k] / U + len[k]; u++)
                owner[u] = -1;
            used -= len[k] * U;
            len[k] = 0;
        }
        kvs_pool_stats_t s;
        kvs_pool_stats(pool, &s);
        assert_int_equal(s.used_bytes, used);
    }
    for (int k = 0; k < SLOTS; k++)
        if (len[k])
            kvs_pool_free(pool, off[k], len[k] * U);
    kvs_pool_stats_t s;
    kvs_pool_stats(pool, &s);
    assert_int_equal(s.free_extents, 1); /* everything coalesced back */
    assert_int_equal(s.used_bytes, 0);
    kvs_pool_destroy(pool);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_pool_basic),
        cmocka_unit_test(test_pool_best_fit),
        cmocka_unit_test(test_pool_random),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
