/* Thread pool: every index visited exactly once, repeated loops (with and
 * without spinning workers), inline mode. */
#include <setjmp.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>
#include <cmocka.h>

#include "common/cm_alloc.h"
#include "common/cm_thread.h"

typedef struct visit {
    atomic_int *hits;
    atomic_uint max_worker;
} visit_t;

static void visit_fn(void *arg, size_t begin, size_t end, unsigned worker)
{
    visit_t *v = arg;
    for (size_t i = begin; i < end; i++)
        atomic_fetch_add(&v->hits[i], 1);
    unsigned m = atomic_load(&v->max_worker);
    while (worker > m && !atomic_compare_exchange_weak(&v->max_worker, &m, worker)) {
    }
}

static void run_loops(cm_pool_t *pool)
{
    enum { N = 10007 };
    static atomic_int hits[N];
    for (int round = 0; round < 50; round++) {
        visit_t v = {hits, 0};
        for (int i = 0; i < N; i++)
            atomic_store(&hits[i], 0);
        size_t n = (size_t)(round * 199 % N) + 1;
        cm_pool_parallel_for(pool, n, (size_t)(round % 7) + 1, visit_fn, &v);
        for (size_t i = 0; i < N; i++)
            assert_int_equal(atomic_load(&hits[i]), i < n ? 1 : 0);
        assert_true(atomic_load(&v.max_worker) < cm_pool_size(pool));
    }
}

static void test_pool(void **state)
{
    cm_pool_t *pool = NULL;
    assert_int_equal(cm_pool_create(4, &pool), RI_OK);
    assert_int_equal(cm_pool_size(pool), 4);
    run_loops(pool);
    assert_false(cm_pool_spinning(pool));   /* no spin time set */
    /* with a spin time the loops are the same; whether the workers spin
     * then depends on the machine's load, which a test cannot fix */
    cm_pool_set_spin_us(pool, 50);
    run_loops(pool);
    cm_pool_destroy(pool);
    cm_pool_destroy(NULL);
    assert_false(cm_pool_spinning(NULL));
    run_loops(NULL);
    assert_non_null(cm_pool_default());
    run_loops(cm_pool_default());
    assert_true(cm_cpu_count() >= 1);
    assert_int_equal(cm_pool_create(5000, &pool), RI_ERR_INVALID);
    /* one thread has nobody to hand a loop to: never spinning */
    assert_int_equal(cm_pool_create(1, &pool), RI_OK);
    cm_pool_set_spin_us(pool, 50);
    run_loops(pool);
    assert_false(cm_pool_spinning(pool));
    cm_pool_destroy(pool);
}

/* The default pool takes the size a program sets before its first use;
 * another size afterwards is refused and changes nothing.  Runs first. */
static void test_default_pool_size(void **state)
{
    assert_int_equal(cm_pool_default_set_threads(3), RI_OK);
    assert_int_equal(cm_pool_size(cm_pool_default()), 3);
    assert_int_equal(cm_pool_default_set_threads(3), RI_OK);
    assert_int_equal(cm_pool_default_set_threads(2), RI_ERR_BUSY);
    assert_int_equal(cm_pool_size(cm_pool_default()), 3);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_default_pool_size),
        cmocka_unit_test(test_pool),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
