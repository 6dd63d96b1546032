/*
 * Sessions through the control API of the real daemon (single-tenant mode):
 * create / list / drop, every invalid field refused with INVALID_ARGUMENT and
 * a message naming it (and nothing created), Drain, `ri sessions`.
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
#include <unistd.h>
#include <cmocka.h>

#include "common/cm_alloc.h"
#include "gpuworker/client/gw_ctl.h"
#include "kvs_test_daemon.h"

static kvs_test_daemon_t daemon_;
static gw_ctl_t *ctl_;

static const gw_ctl_geometry_t geo_ok = {.layers = 2, .kv_heads = 2, .head_dim = 64, .dtype = 1, .page_tokens = 8};

static int group_setup(void **state)
{
    (void)state;
    if (kvs_test_daemon_start(&daemon_, NULL, NULL) != 0)
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

static size_t count_sessions(void)
{
    gw_ctl_session_info_t *infos = NULL;
    size_t n = 99;
    assert_int_equal(gw_ctl_list_sessions(ctl_, 2000, &infos, &n, NULL), RI_OK);
    cm_free(infos);
    return n;
}

static void test_create_list_drop(void **state)
{
    (void)state;
    gw_ctl_session_t s1, s2;
    gw_ctl_error_t err;
    static const uint8_t zero[CM_WIRE_SECRET_SIZE] = {0};

    assert_int_equal(count_sessions(), 0);
    assert_int_equal(gw_ctl_create_session(ctl_, 2000, &geo_ok, 1024, "first", &s1, &err), RI_OK);
    gw_ctl_geometry_t g2 = {.layers = 30, .kv_heads = 3, .head_dim = 64, .dtype = 2, .page_tokens = 0};
    assert_int_equal(gw_ctl_create_session(ctl_, 2000, &g2, 256, "second label with spaces", &s2, &err), RI_OK);
    assert_true(s1.session_id != 0 && s2.session_id != 0 && s1.session_id != s2.session_id);
    assert_memory_not_equal(s1.secret, zero, sizeof(zero));
    assert_memory_not_equal(s1.secret, s2.secret, sizeof(zero));
    /* each session gets the UCX address of the data-plane thread that serves
     * it: two in a row land on the two threads (the default), one of them the
     * thread whose address Health and the port file give */
    assert_int_equal(strncmp(s1.dataplane_address, "ucx:", 4), 0);
    assert_string_not_equal(s1.dataplane_address, s2.dataplane_address);
    assert_true(strcmp(s1.dataplane_address, daemon_.dataplane) == 0 ||
                strcmp(s2.dataplane_address, daemon_.dataplane) == 0);

    gw_ctl_session_info_t *infos = NULL;
    size_t n = 0;
    assert_int_equal(gw_ctl_list_sessions(ctl_, 2000, &infos, &n, &err), RI_OK);
    assert_int_equal(n, 2);
    bool seen1 = false, seen2 = false;
    for (size_t i = 0; i < n; i++) {
        assert_string_equal(infos[i].tenant, "default");
        assert_true(infos[i].created_unix_ms > 1600000000000ull);
        if (infos[i].session_id == s1.session_id) {
            seen1 = true;
            assert_string_equal(infos[i].label, "first");
            assert_int_equal(infos[i].geometry.layers, 2);
            assert_int_equal(infos[i].geometry.head_dim, 64);
            assert_int_equal(infos[i].geometry.dtype, 1);
            assert_int_equal(infos[i].geometry.page_tokens, 8);
        } else if (infos[i].session_id == s2.session_id) {
            seen2 = true;
            assert_string_equal(infos[i].label, "second label with spaces");
            assert_int_equal(infos[i].geometry.layers, 30);
            assert_int_equal(infos[i].geometry.dtype, 2);
            assert_int_equal(infos[i].geometry.page_tokens, 8); /* 0 means the default */
        }
    }
    cm_free(infos);
    assert_true(seen1 && seen2);

    gw_ctl_stats_t st;
    assert_int_equal(gw_ctl_stats(ctl_, 2000, &st, &err), RI_OK);
    assert_int_equal(st.sessions, 2);
    assert_int_equal(st.sessions_all, 2);
    assert_int_equal(st.pool_bytes_total, 64ull << 20);

    uint64_t freed = 1;
    assert_int_equal(gw_ctl_drop_session(ctl_, 2000, s1.session_id, &freed, &err), RI_OK);
    assert_int_equal(gw_ctl_drop_session(ctl_, 2000, s1.session_id, &freed, &err), RI_ERR_NOT_FOUND);
    assert_int_equal(err.grpc_code, 5);
    assert_non_null(strstr(err.message, "no session"));
    assert_int_equal(gw_ctl_drop_session(ctl_, 2000, 0, &freed, &err), RI_ERR_INVALID);
    assert_int_equal(gw_ctl_drop_session(ctl_, 2000, UINT64_MAX, &freed, &err), RI_ERR_NOT_FOUND);
    assert_int_equal(count_sessions(), 1);
    assert_int_equal(gw_ctl_drop_session(ctl_, 2000, s2.session_id, &freed, &err), RI_OK);
    assert_int_equal(count_sessions(), 0);
}

typedef struct bad_case {
    gw_ctl_geometry_t g;
    uint64_t tokens;
    const char *label;
    const char *field; /* must appear in the message */
} bad_case_t;

static void test_invalid_fields(void **state)
{
    (void)state;
    static char long_label[200];
    memset(long_label, 'x', sizeof(long_label) - 1);
    const bad_case_t cases[] = {
        {{0, 2, 64, 1, 8}, 100, "", "layers"},
        {{1025, 2, 64, 1, 8}, 100, "", "layers"},
        {{2, 0, 64, 1, 8}, 100, "", "kv_heads"},
        {{2, 257, 64, 1, 8}, 100, "", "kv_heads"},
        {{2, 2, 8, 1, 8}, 100, "", "head_dim"},
        {{2, 2, 100, 1, 8}, 100, "", "head_dim"},
        {{2, 2, 1024, 1, 8}, 100, "", "head_dim"},
        {{2, 2, 64, 0, 8}, 100, "", "dtype"},
        {{2, 2, 64, 3, 8}, 100, "", "dtype"},
        {{2, 2, 64, 77777, 8}, 100, "", "dtype"},
        {{2, 2, 64, 1, 257}, 100, "", "page_tokens"},
        {{2, 2, 64, 1, 8}, 0, "", "expected_tokens"},
        {{2, 2, 64, 1, 8}, (1ull << 30) + 1, "", "expected_tokens"},
        {{2, 2, 64, 1, 8}, 100, long_label, "label"},
        {{2, 2, 64, 1, 8}, 100, "tab\there", "label"},
    };
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        gw_ctl_session_t s;
        gw_ctl_error_t err = {0};
        ri_status_t st = gw_ctl_create_session(ctl_, 2000, &cases[i].g, cases[i].tokens, cases[i].label, &s, &err);
        if (st != RI_ERR_INVALID || err.grpc_code != 3 || strstr(err.message, cases[i].field) == NULL)
            fail_msg("case %zu (%s): status %d code %d message '%s'", i, cases[i].field, st, err.grpc_code,
                     err.message);
    }
    /* no geometry at all: an empty CreateSessionRequest */
    uint8_t *resp = NULL;
    size_t n = 0;
    gw_ctl_error_t err = {0};
    assert_int_equal(gw_ctl_call_raw(ctl_, "/retroinfer.v1.KvStore/CreateSession", "", 0, 2000, &resp, &n, &err),
                     RI_ERR_INVALID);
    assert_non_null(strstr(err.message, "geometry"));
    assert_int_equal(count_sessions(), 0);
}

static void test_ri_sessions_cli(void **state)
{
    (void)state;
    gw_ctl_session_t s;
    char bin[512], out[8192], addrflag[400];
    assert_int_equal(gw_ctl_create_session(ctl_, 2000, &geo_ok, 100, "cli-visible", &s, NULL), RI_OK);
    kvs_test_bin("ri", bin, sizeof(bin));
    snprintf(addrflag, sizeof(addrflag), "--addr=%s", daemon_.grpc);
    const char *argv[] = {bin, "sessions", addrflag, NULL};
    assert_int_equal(kvs_test_run(argv, out, sizeof(out), 10000), 0);
    assert_non_null(strstr(out, "1 session(s)"));
    assert_non_null(strstr(out, "cli-visible"));
    assert_non_null(strstr(out, "2x2x64"));
    assert_int_equal(gw_ctl_drop_session(ctl_, 2000, s.session_id, NULL, NULL), RI_OK);
}

static void test_drain(void **state)
{
    (void)state;
    gw_ctl_session_t s;
    gw_ctl_error_t err;
    gw_ctl_health_t h;
    uint32_t open = 99;
    assert_int_equal(gw_ctl_create_session(ctl_, 2000, &geo_ok, 100, "survivor", &s, &err), RI_OK);
    assert_int_equal(gw_ctl_drain(ctl_, 2000, &open, &err), RI_OK);
    assert_int_equal(open, 1);
    assert_int_equal(gw_ctl_health(ctl_, 2000, &h, &err), RI_OK);
    assert_int_equal(h.status, 2);
    assert_int_equal(gw_ctl_create_session(ctl_, 2000, &geo_ok, 100, "late", &s, &err), RI_ERR_SHUTDOWN);
    assert_non_null(strstr(err.message, "draining"));
    assert_int_equal(count_sessions(), 1); /* existing ones keep working */
    assert_int_equal(kvs_test_daemon_stop(&daemon_, SIGTERM, 10000), 0);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_create_list_drop),
        cmocka_unit_test(test_invalid_fields),
        cmocka_unit_test(test_ri_sessions_cli),
        cmocka_unit_test(test_drain),
    };
    char bin[512];
    if (access(kvs_test_bin("ri-kvstore", bin, sizeof(bin)), X_OK) != 0)
        return 77;
    return cmocka_run_group_tests(tests, group_setup, group_teardown);
}
