/*
 * Shutdown and process behaviour of the real daemon: SIGTERM while clients
 * hammer every method (Drain once, the other five in a loop) -> exit 0
 * within drain-timeout; SIGINT -> exit 0; two
 * daemons side by side on ephemeral ports; --dump-config / --help / the
 * environment.
 */
#define _GNU_SOURCE
#include <pthread.h>
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <cmocka.h>

#include "common/cm_alloc.h"
#include "common/cm_time.h"
#include "gpuworker/client/gw_ctl.h"
#include "kvs_test_daemon.h"

#define LOAD_THREADS 4

typedef struct load {
    const char *addr;
    atomic_bool stop;
    atomic_ulong ok;
    atomic_ulong failed;
    atomic_ulong unexpected;  /* statuses no shutdown should produce */
} load_t;

static void *load_thread(void *arg)
{
    load_t *l = arg;
    gw_ctl_t *c = NULL;
    const gw_ctl_geometry_t g = {.layers = 2, .kv_heads = 2, .head_dim = 64, .dtype = 1, .page_tokens = 8};
    if (gw_ctl_create(l->addr, NULL, &c) != RI_OK)
        return NULL;
    while (!atomic_load(&l->stop)) {
        gw_ctl_session_t s;
        gw_ctl_health_t h;
        gw_ctl_session_info_t *infos = NULL;
        size_t n;
        gw_ctl_stats_t stats;
        ri_status_t st[5];
        st[0] = gw_ctl_create_session(c, 1000, &g, 64, "load", &s, NULL);
        st[1] = gw_ctl_list_sessions(c, 1000, &infos, &n, NULL);
        cm_free(infos);
        st[2] = st[0] == RI_OK ? gw_ctl_drop_session(c, 1000, s.session_id, NULL, NULL) : RI_OK;
        st[3] = gw_ctl_health(c, 1000, &h, NULL);
        st[4] = gw_ctl_stats(c, 1000, &stats, NULL);
        for (int i = 0; i < 5; i++) {
            if (st[i] == RI_OK)
                atomic_fetch_add(&l->ok, 1);
            else if (st[i] == RI_ERR_UNREACHABLE || st[i] == RI_ERR_CANCELLED || st[i] == RI_ERR_TIMEOUT ||
                     st[i] == RI_ERR_SHUTDOWN || st[i] == RI_ERR_NOT_FOUND)
                atomic_fetch_add(&l->failed, 1);
            else
                atomic_fetch_add(&l->unexpected, 1);
        }
    }
    gw_ctl_destroy(c);
    return NULL;
}

static void test_sigterm_under_load(void **state)
{
    (void)state;
    kvs_test_daemon_t d = {0};
    /* --insecure-admin: the sixth method, Drain, needs admin rights */
    const char *extra[] = {"--drain-timeout-ms=2000", "--threads=2", "--insecure-admin", NULL};
    assert_int_equal(kvs_test_daemon_start(&d, extra, NULL), 0);
    load_t l = {.addr = d.grpc};
    pthread_t th[LOAD_THREADS];
    for (int i = 0; i < LOAD_THREADS; i++)
        assert_int_equal(pthread_create(&th[i], NULL, load_thread, &l), 0);
    while (atomic_load(&l.ok) < 200)
        usleep(5000);
    /* Drain while the load runs: from now on CreateSession is refused
     * (SHUTDOWN, counted as refused), everything else still answers. */
    gw_ctl_t *admin = NULL;
    uint32_t open_sessions = 0;
    assert_int_equal(gw_ctl_create(d.grpc, NULL, &admin), RI_OK);
    assert_int_equal(gw_ctl_drain(admin, 2000, &open_sessions, NULL), RI_OK);
    gw_ctl_destroy(admin);
    unsigned long ok_at_drain = atomic_load(&l.ok);
    while (atomic_load(&l.ok) < ok_at_drain + 50)
        usleep(5000);
    uint64_t t0 = cm_time_ns();
    int code = kvs_test_daemon_stop(&d, SIGTERM, 10000);
    double ms = (double)(cm_time_ns() - t0) / 1e6;
    usleep(100000); /* let the clients see the daemon gone */
    atomic_store(&l.stop, true);
    for (int i = 0; i < LOAD_THREADS; i++)
        pthread_join(th[i], NULL);
    printf("# under load: %lu ok, %lu refused by shutdown, exit %d after %.0f ms\n", atomic_load(&l.ok),
           atomic_load(&l.failed), code, ms);
    assert_int_equal(code, 0);
    assert_true(ms < 2000 + 3000);
    assert_int_equal(atomic_load(&l.unexpected), 0);
    kvs_test_daemon_cleanup(&d);
}

static void test_sigint_and_two_daemons(void **state)
{
    (void)state;
    kvs_test_daemon_t a = {0}, b = {0};
    gw_ctl_t *ca = NULL, *cb = NULL;
    gw_ctl_health_t h;
    assert_int_equal(kvs_test_daemon_start(&a, NULL, NULL), 0);
    assert_int_equal(kvs_test_daemon_start(&b, NULL, NULL), 0);
    assert_string_not_equal(a.grpc, b.grpc);
    assert_int_equal(gw_ctl_create(a.grpc, NULL, &ca), RI_OK);
    assert_int_equal(gw_ctl_create(b.grpc, NULL, &cb), RI_OK);
    assert_int_equal(gw_ctl_health(ca, 2000, &h, NULL), RI_OK);
    assert_int_equal(gw_ctl_health(cb, 2000, &h, NULL), RI_OK);
    gw_ctl_destroy(ca);
    gw_ctl_destroy(cb);
    assert_int_equal(kvs_test_daemon_stop(&a, SIGINT, 10000), 0);
    assert_int_equal(kvs_test_daemon_stop(&b, SIGTERM, 10000), 0);
    kvs_test_daemon_cleanup(&a);
    kvs_test_daemon_cleanup(&b);
}

static void test_dump_config_and_help(void **state)
{
    (void)state;
    char bin[512];
    static char out[16384];
    kvs_test_bin("ri-kvstore", bin, sizeof(bin));
    const char *dump[] = {bin, "--dump-config", "--threads=3", "--memory=2GiB", NULL};
    assert_int_equal(kvs_test_run(dump, out, sizeof(out), 10000), 0);
    static const char *const names[] = {"listen", "port-file", "memory", "hugepages", "dataplane-listen",
                                        "tokens-file", "tenant-quota", "global-quota", "metrics-listen",
                                        "threads = 3", "drain-timeout-ms", "max-message", "log-level"};
    for (size_t i = 0; i < sizeof(names) / sizeof(names[0]); i++)
        if (strstr(out, names[i]) == NULL)
            fail_msg("--dump-config lacks '%s':\n%s", names[i], out);
    setenv("RI_KVS_THREADS", "5", 1);
    const char *dump2[] = {bin, "--dump-config", NULL};
    assert_int_equal(kvs_test_run(dump2, out, sizeof(out), 10000), 0);
    unsetenv("RI_KVS_THREADS");
    assert_non_null(strstr(out, "threads = 5"));
    const char *help[] = {bin, "--help", NULL};
    assert_int_equal(kvs_test_run(help, out, sizeof(out), 10000), 0);
    assert_non_null(strstr(out, "tokens-file"));
    assert_non_null(strstr(out, "RI_KVS_"));
    const char *bad[] = {bin, "--memory=lots", NULL};
    assert_int_equal(kvs_test_run(bad, out, sizeof(out), 10000), 2);
    assert_non_null(strstr(out, "memory"));
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_sigterm_under_load),
        cmocka_unit_test(test_sigint_and_two_daemons),
        cmocka_unit_test(test_dump_config_and_help),
    };
    char bin[512];
    if (access(kvs_test_bin("ri-kvstore", bin, sizeof(bin)), X_OK) != 0)
        return 77;
    return cmocka_run_group_tests(tests, NULL, NULL);
}
