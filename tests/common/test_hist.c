/* cm_hist: bucket choice at the bounds, concurrent adds, and the exact
 * Prometheus text (names, cumulative buckets, labels) that /metrics serves. */
#define _GNU_SOURCE
#include <pthread.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <cmocka.h>

#include "common/cm_hist.h"

static const double le[] = {0.001, 0.01, 1};

static char *render(const cm_hist_t *h, const char *help, const char *labels)
{
    char *buf = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&buf, &len);
    assert_non_null(f);
    cm_hist_write_prom(h, f, "x_seconds", help, labels);
    fclose(f);
    return buf;
}

static void test_buckets_and_text(void **state)
{
    (void)state;
    cm_hist_t h;
    cm_hist_init(&h, le, 3);
    cm_hist_add(&h, 0.001); /* on a bound: that bucket */
    cm_hist_add(&h, 0.005);
    cm_hist_add(&h, 0.5);
    cm_hist_add(&h, 7);     /* above all: +Inf only */
    assert_int_equal(cm_hist_count(&h), 4);
    char *t = render(&h, "Test.", NULL);
    assert_string_equal(t, "# HELP x_seconds Test.\n# TYPE x_seconds histogram\n"
                           "x_seconds_bucket{le=\"0.001\"} 1\nx_seconds_bucket{le=\"0.01\"} 2\n"
                           "x_seconds_bucket{le=\"1\"} 3\nx_seconds_bucket{le=\"+Inf\"} 4\n"
                           "x_seconds_sum 7.506000000\nx_seconds_count 4\n");
    free(t);
    t = render(&h, NULL, "method=\"Open\"");
    assert_non_null(strstr(t, "x_seconds_bucket{method=\"Open\",le=\"0.01\"} 2\n"));
    assert_non_null(strstr(t, "x_seconds_count{method=\"Open\"} 4\n"));
    assert_null(strstr(t, "# TYPE"));
    free(t);
    cm_hist_t c;
    cm_hist_copy(&c, &h);
    cm_hist_add(&h, 0);
    assert_int_equal(cm_hist_count(&c), 4);
    assert_int_equal(cm_hist_count(&h), 5);
}

static void *adder(void *arg)
{
    for (int i = 0; i < 10000; i++)
        cm_hist_add(arg, 0.5);
    return NULL;
}

static void test_concurrent_adds(void **state)
{
    (void)state;
    cm_hist_t h;
    cm_hist_init(&h, le, 3);
    pthread_t th[4];
    for (int i = 0; i < 4; i++)
        assert_int_equal(pthread_create(&th[i], NULL, adder, &h), 0);
    for (int i = 0; i < 4; i++)
        pthread_join(th[i], NULL);
    assert_int_equal(cm_hist_count(&h), 40000);
    char *t = render(&h, NULL, NULL);
    assert_non_null(strstr(t, "x_seconds_sum 20000.000000000\n"));
    free(t);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_buckets_and_text),
        cmocka_unit_test(test_concurrent_adds),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
