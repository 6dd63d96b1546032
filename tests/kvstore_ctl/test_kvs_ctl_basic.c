/*
 * ri-kvstore basics against the real daemon on ephemeral loopback ports:
 * Health from the C client, unknown methods answered UNIMPLEMENTED within a
 * second, malformed protobuf bytes answered INVALID_ARGUMENT while the daemon
 * keeps serving, /metrics, `ri status`, and SIGTERM -> exit 0.
 */
#define _GNU_SOURCE
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <cmocka.h>

#include "common/cm_alloc.h"
#include "common/cm_time.h"
#include "gpuworker/client/gw_ctl.h"
#include "kvs_test_daemon.h"

static CM_ALLOC_TAG(test_tag, "test");
static kvs_test_daemon_t daemon_;
static gw_ctl_t *ctl_;

static int group_setup(void **state)
{
    (void)state;
    int rc = kvs_test_daemon_start(&daemon_, NULL, NULL);
    if (rc != 0)
        return -1;
    return gw_ctl_create(daemon_.grpc, NULL, &ctl_) == RI_OK ? 0 : -1;
}

static int group_teardown(void **state)
{
    (void)state;
    gw_ctl_destroy(ctl_);
    kvs_test_daemon_cleanup(&daemon_);
    return 0;
}

static void test_health(void **state)
{
    (void)state;
    gw_ctl_health_t h;
    gw_ctl_error_t err;
    assert_int_equal(gw_ctl_health(ctl_, 2000, &h, &err), RI_OK);
    assert_int_equal(h.status, 1);
    assert_string_equal(h.version, "0.1.0");
    assert_string_equal(h.auth_mode, "single-tenant");
    assert_true(h.uptime_ms < 60000);
}

static void test_unknown_method_is_unimplemented_fast(void **state)
{
    (void)state;
    static const char *const methods[] = {"/retroinfer.v1.KvStore/NoSuchMethod", "/other.Service/Call",
                                          "/retroinfer.v1.KvStore/health"};
    for (size_t i = 0; i < sizeof(methods) / sizeof(methods[0]); i++) {
        uint8_t *resp = NULL;
        size_t n = 0;
        gw_ctl_error_t err = {0};
        uint64_t t0 = cm_time_ns();
        ri_status_t st = gw_ctl_call_raw(ctl_, methods[i], "", 0, 3000, &resp, &n, &err);
        double ms = (double)(cm_time_ns() - t0) / 1e6;
        assert_int_equal(st, RI_ERR_UNSUPPORTED);
        assert_int_equal(err.grpc_code, 12); /* UNIMPLEMENTED */
        assert_non_null(strstr(err.message, "unknown method"));
        assert_true(ms < 1000.0);
        assert_null(resp);
    }
}

static void test_malformed_protobuf_is_invalid_argument(void **state)
{
    (void)state;
    /* A field header claiming a 2^60-byte length, a truncated varint, a
     * wrong wire type, random bytes: each must be refused, never crash. */
    static const uint8_t bad[][12] = {
        {0x0a, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x7f},
        {0x08, 0xff, 0xff},
        {0x0a, 0x05, 0x08},
        {0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x01},
    };
    static const size_t lens[] = {9, 3, 3, 12};
    static const char *const methods[] = {"/retroinfer.v1.KvStore/Health", "/retroinfer.v1.KvStore/Stats",
                                          "/retroinfer.v1.KvStore/CreateSession", "/retroinfer.v1.KvStore/DropSession",
                                          "/retroinfer.v1.KvStore/ListSessions", "/retroinfer.v1.KvStore/KeepAlive",
                                          "/retroinfer.v1.KvStore/LookupPrefix", "/retroinfer.v1.KvStore/ListPrefixes",
                                          "/retroinfer.v1.KvStore/DropPrefix", "/retroinfer.v1.KvStore/Drain"};
    for (size_t m = 0; m < sizeof(methods) / sizeof(methods[0]); m++) {
        for (size_t b = 0; b < sizeof(lens) / sizeof(lens[0]); b++) {
            uint8_t *resp = NULL;
            size_t n = 0;
            gw_ctl_error_t err = {0};
            ri_status_t st = gw_ctl_call_raw(ctl_, methods[m], bad[b], lens[b], 3000, &resp, &n, &err);
            assert_int_equal(st, RI_ERR_INVALID);
            assert_non_null(strstr(err.message, "not a valid protobuf"));
        }
    }
    /* random garbage of many sizes */
    srand((unsigned)time(NULL));
    for (int i = 0; i < 240; i++) {
        uint8_t buf[256];
        size_t len = (size_t)(rand() % (int)sizeof(buf));
        for (size_t k = 0; k < len; k++)
            buf[k] = (uint8_t)rand();
        if (i % 2 == 0 && len > 2) /* half of them start like a real field */
            buf[0] = (uint8_t)(0x08 | (rand() % 3 ? 0 : 2)), buf[1] &= 0x7f;
        uint8_t *resp = NULL;
        size_t n = 0;
        gw_ctl_error_t err = {0};
        /* not Drain (the last): random bytes often parse as a DrainRequest */
        const char *m = methods[(size_t)i % (sizeof(methods) / sizeof(methods[0]) - 1)];
        ri_status_t st = gw_ctl_call_raw(ctl_, m, buf, len, 3000, &resp, &n, &err);
        /* random bytes may happen to parse; then field validation answers
         * (and an unknown session id is NOT_FOUND) */
        if (st != RI_OK && st != RI_ERR_INVALID && st != RI_ERR_NOT_FOUND && st != RI_ERR_QUOTA)
            fail_msg("%s with %zu random bytes: %s (%s)", m, len, ri_status_str(st), err.message);
        cm_free(resp);
    }
    gw_ctl_health_t h;
    assert_int_equal(gw_ctl_health(ctl_, 2000, &h, NULL), RI_OK);
}

static void test_oversize_request_is_refused(void **state)
{
    (void)state;
    /* max-message is 16 MiB by default: 17 MiB is refused by gRPC itself */
    size_t len = 17u << 20;
    uint8_t *big = cm_calloc(&test_tag, 1, len);
    assert_non_null(big);
    uint8_t *resp = NULL;
    size_t n = 0;
    gw_ctl_error_t err = {0};
    ri_status_t st = gw_ctl_call_raw(ctl_, "/retroinfer.v1.KvStore/CreateSession", big, len, 5000, &resp, &n, &err);
    cm_free(big);
    assert_int_equal(st, RI_ERR_QUOTA);
    assert_int_equal(err.grpc_code, 8); /* RESOURCE_EXHAUSTED */
    gw_ctl_health_t h;
    assert_int_equal(gw_ctl_health(ctl_, 2000, &h, NULL), RI_OK);
}

static void test_metrics_page(void **state)
{
    (void)state;
    static char body[1 << 20];
    assert_true(daemon_.metrics[0] != '\0');
    assert_int_equal(kvs_test_http_get(daemon_.metrics, "/metrics", body, sizeof(body)), 200);
    static const char *const names[] = {"ri_kvs_up 1", "ri_kvs_uptime_seconds", "ri_kvs_grpc_calls_total{method=\"Health\",code=\"OK\"}",
                                        "code=\"UNIMPLEMENTED\"", "ri_kvs_grpc_auth_failures_total",
                                        "ri_kvs_alloc_bytes{tag=\"kvs.grpc\"}", "# TYPE ri_kvs_grpc_calls_total counter",
                                        "ri_kvs_grpc_handler_seconds_bucket{method=\"Health\",le=\"+Inf\"}",
                                        "ri_kvs_grpc_bad_messages_total", "ri_kvs_pool_bytes"};
    for (size_t i = 0; i < sizeof(names) / sizeof(names[0]); i++) {
        if (strstr(body, names[i]) == NULL)
            fail_msg("metric '%s' missing from /metrics", names[i]);
    }
    assert_int_equal(kvs_test_http_get(daemon_.metrics, "/nope", body, sizeof(body)), 404);
}

static void test_ri_status_cli(void **state)
{
    (void)state;
    char bin[512], out[4096], addrflag[400];
    kvs_test_bin("ri", bin, sizeof(bin));
    snprintf(addrflag, sizeof(addrflag), "--addr=%s", daemon_.grpc);
    const char *argv[] = {bin, "status", addrflag, NULL};
    assert_int_equal(kvs_test_run(argv, out, sizeof(out), 10000), 0);
    assert_non_null(strstr(out, "SERVING"));
    const char *argv2[] = {bin, "stats", addrflag, NULL};
    assert_int_equal(kvs_test_run(argv2, out, sizeof(out), 10000), 0);
    assert_non_null(strstr(out, "pool"));
    /* an address where nothing listens: non-zero and the address named */
    const char *argv3[] = {bin, "status", "--addr=127.0.0.1:1", NULL};
    assert_int_equal(kvs_test_run(argv3, out, sizeof(out), 10000), 1);
    assert_non_null(strstr(out, "127.0.0.1:1"));
}

static void test_sigterm_exits_zero(void **state)
{
    (void)state;
    assert_int_equal(kvs_test_daemon_stop(&daemon_, SIGTERM, 10000), 0);
    /* and it is gone: Health now fails as unreachable */
    gw_ctl_health_t h;
    assert_int_equal(gw_ctl_health(ctl_, 2000, &h, NULL), RI_ERR_UNREACHABLE);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_health),
        cmocka_unit_test(test_unknown_method_is_unimplemented_fast),
        cmocka_unit_test(test_malformed_protobuf_is_invalid_argument),
        cmocka_unit_test(test_oversize_request_is_refused),
        cmocka_unit_test(test_metrics_page),
        cmocka_unit_test(test_ri_status_cli),
        cmocka_unit_test(test_sigterm_exits_zero),
    };
    char bin[512];
    if (access(kvs_test_bin("ri-kvstore", bin, sizeof(bin)), X_OK) != 0)
        return 77;
    return cmocka_run_group_tests(tests, group_setup, group_teardown);
}
