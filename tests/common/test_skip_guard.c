/*
 * The guard against a test that skips its work and still passes: cmocka's
 * skip() prints "[  SKIPPED ]" and the program exits 0, which CTest would
 * show as Passed.  ri_add_test fails any test whose output has that marker,
 * so a test that cannot run must exit 77 instead.  This program skips and
 * exits 0 on purpose; it is registered with WILL_FAIL, so CI fails if the
 * guard ever stops catching it.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

static void test_skips(void **state)
{
    (void)state;
    skip();
}

int main(void)
{
    const struct CMUnitTest tests[] = {cmocka_unit_test(test_skips)};
    return cmocka_run_group_tests(tests, NULL, NULL);
}
