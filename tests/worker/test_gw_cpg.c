/*
 * The block cache's page map (gw_cpg.h) and the process's shared prefix
 * locations (gw_direct_share.h), in process:
 *   - the map against a plain array under random puts and evictions, ids
 *     chosen to collide (the deletions' backward shift must keep every
 *     probe whole), growing past its first table and cleared;
 *   - the locations: one copy for equal answers, a sequence whose answers
 *     differ by one location is refused the copy, concurrent acquirers
 *     share one copy, and the last release frees it.
 */
#include <pthread.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "gpuworker/client/gw_cpg.h"
#include "gpuworker/client/gw_direct_share.h"

#define NID 4096u

static void test_map_matches_an_array(void **state)
{
    static uint32_t ref[NID]; /* pages of id i (its first page + 1), 0: not cached */
    gw_cpg_t m = { 0 };
    uint32_t x = 12345u;
    (void)state;

    memset(ref, 0, sizeof(ref));
    for (uint32_t op = 0; op < 200000u; op++) {
        x = x * 1664525u + 1013904223u;
        uint32_t id = (x >> 8) % NID, pg;
        if ((x & 3u) != 0) {
            uint32_t *p = gw_cpg_put(&m, id, 2);
            assert_non_null(p);
            p[0] = op;
            p[1] = ~op;
            ref[id] = op + 1;
        } else {
            gw_cpg_del(&m, id);
            ref[id] = 0;
        }
        if (op % 997u == 0)
            for (uint32_t i = 0; i < NID; i++) {
                const uint32_t *p = gw_cpg_get(&m, i);
                pg = p != NULL ? p[0] + 1 : 0;
                assert_int_equal(pg, ref[i]);
                if (p != NULL)
                    assert_int_equal(p[1], ~p[0]);
            }
    }
    assert_true(m.cap > 64u && m.n <= m.cap / 2);
    assert_null(gw_cpg_get(&m, GW_CPG_EMPTY));
    gw_cpg_clear(&m);
    assert_int_equal(m.n, 0);
    assert_null(gw_cpg_get(&m, 1));
}

#define NT 6u

static const uint8_t KEY[CM_PFX_KEY_SIZE] = { 7, 1, 2, 3 };
static const uint32_t COUNTS[NT] = { 5, 0, 3, 9, 1, 2 };

static void locs_fill(uint64_t *l)
{
    for (uint32_t i = 0; i < 20u; i++)
        l[i] = CM_PFX_LOC(i % 3u, 4096u * i);
}

static void *acquire_one(void *arg)
{
    uint64_t l[20];
    locs_fill(l);
    assert_int_equal(gw_locs_acquire(KEY, 3, NT, 4096, COUNTS, l, (gw_locs_t **)arg), RI_OK);
    return NULL;
}

static void test_locations_are_shared_when_equal(void **state)
{
    uint64_t l[20], other[20];
    gw_locs_t *a = NULL, *b = NULL, *c = NULL, *th[8];
    pthread_t t[8];
    uint32_t copies = 9, n = 0;
    uint64_t bytes = 0;
    (void)state;

    locs_fill(l);
    assert_int_equal(gw_locs_acquire(KEY, 3, NT, 4096, COUNTS, l, &a), RI_OK);
    assert_int_equal(gw_locs_acquire(KEY, 3, NT, 4096, COUNTS, l, &b), RI_OK);
    assert_ptr_equal(a, b);
    const uint64_t *t3 = gw_locs_table(a, 3, &n);
    assert_int_equal(n, 9);
    assert_memory_equal(t3, l + 8, 9 * sizeof(uint64_t));
    assert_null(gw_locs_table(a, 1, &n));
    assert_int_equal(n, 0);
    /* one location off: refused, the sequence keeps its own */
    memcpy(other, l, sizeof(l));
    other[19]++;
    assert_int_equal(gw_locs_acquire(KEY, 3, NT, 4096, COUNTS, other, &c), RI_ERR_EXISTS);
    assert_null(c);
    /* another page size is another copy */
    assert_int_equal(gw_locs_acquire(KEY, 3, NT, 8192, COUNTS, l, &c), RI_OK);
    assert_ptr_not_equal(c, a);
    gw_locs_stats(&copies, &bytes);
    assert_int_equal(copies, 2);
    assert_true(bytes >= 2 * 20 * sizeof(uint64_t));
    gw_locs_t *bad = a;
    assert_int_equal(gw_locs_acquire(NULL, 3, NT, 4096, COUNTS, l, &bad), RI_ERR_INVALID);
    assert_null(bad);
    for (int i = 0; i < 8; i++)
        assert_int_equal(pthread_create(&t[i], NULL, acquire_one, &th[i]), 0);
    for (int i = 0; i < 8; i++) {
        pthread_join(t[i], NULL);
        assert_ptr_equal(th[i], a);
    }
    for (int i = 0; i < 8; i++)
        gw_locs_release(th[i]);
    gw_locs_release(a);
    gw_locs_release(c);
    gw_locs_stats(&copies, NULL);
    assert_int_equal(copies, 1); /* b still reads it */
    gw_locs_release(b);
    gw_locs_release(NULL);
    gw_locs_stats(&copies, &bytes);
    assert_int_equal(copies, 0);
    assert_int_equal(bytes, 0);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_map_matches_an_array),
        cmocka_unit_test(test_locations_are_shared_when_equal),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
