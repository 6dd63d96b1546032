/*
 * Authentication, tenant isolation and quotas against the real daemon with a
 * tokens file: no token / wrong token / wrong scheme -> UNAUTHENTICATED
 * (Health needs none); a tenant never sees or drops another's sessions
 * (NOT_FOUND); over-quota CreateSession -> RESOURCE_EXHAUSTED and nothing
 * created; Drain only for admin tokens; the auth-failure counter in /metrics;
 * an admin lists and drops every tenant's sessions; a tenant whose last token
 * is removed (SIGHUP) loses its sessions, and their secrets stop working on
 * the data plane.
 * Also the start-up rules: no tokens file off loopback, bad tokens files.
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
#include "gpuworker/client/gw_dp.h"
#include "kvs_test_daemon.h"

#define TOK_ALICE "alice-token-0123456789"
#define TOK_BOB "bob-token-0123456789"
#define TOK_OPS "ops-token-0123456789"

static kvs_test_daemon_t daemon_;
static gw_ctl_t *anon_, *alice_, *bob_, *ops_;

static const gw_ctl_geometry_t geo = {.layers = 2, .kv_heads = 2, .head_dim = 64, .dtype = 1, .page_tokens = 8};

static int group_setup(void **state)
{
    (void)state;
    char path[600], flag[700];
    if (kvs_test_daemon_prepare(&daemon_) != 0)
        return -1;
    /* alice: 1 MiB quota; bob: the daemon default (unlimited); ops: admin */
    if (kvs_test_daemon_write_file(&daemon_, "tokens",
                                   "# test tokens\n" TOK_ALICE " alice 1MiB\n\n  " TOK_BOB " bob\n" TOK_OPS
                                   " ops - admin\n",
                                   path, sizeof(path)) != 0)
        return -1;
    snprintf(flag, sizeof(flag), "--tokens-file=%s", path);
    const char *extra[] = {flag, NULL};
    if (kvs_test_daemon_start(&daemon_, extra, NULL) != 0)
        return -1;
    if (gw_ctl_create(daemon_.grpc, NULL, &anon_) != RI_OK || gw_ctl_create(daemon_.grpc, TOK_ALICE, &alice_) != RI_OK ||
        gw_ctl_create(daemon_.grpc, TOK_BOB, &bob_) != RI_OK || gw_ctl_create(daemon_.grpc, TOK_OPS, &ops_) != RI_OK)
        return -1;
    return 0;
}

static int group_teardown(void **state)
{
    (void)state;
    gw_ctl_destroy(anon_);
    gw_ctl_destroy(alice_);
    gw_ctl_destroy(bob_);
    gw_ctl_destroy(ops_);
    kvs_test_daemon_cleanup(&daemon_);
    return 0;
}

static size_t count_sessions(gw_ctl_t *c)
{
    gw_ctl_session_info_t *infos = NULL;
    size_t n = 99;
    assert_int_equal(gw_ctl_list_sessions(c, 2000, &infos, &n, NULL), RI_OK);
    cm_free(infos);
    return n;
}

static void test_health_needs_no_token(void **state)
{
    (void)state;
    gw_ctl_health_t h;
    assert_int_equal(gw_ctl_health(anon_, 2000, &h, NULL), RI_OK);
    assert_string_equal(h.auth_mode, "tokens");
}

static void test_missing_or_wrong_token(void **state)
{
    (void)state;
    gw_ctl_stats_t st;
    gw_ctl_error_t err;
    gw_ctl_session_t s;
    gw_ctl_t *wrong = NULL, *prefix = NULL;

    assert_int_equal(gw_ctl_stats(anon_, 2000, &st, &err), RI_ERR_UNAUTHENTICATED);
    assert_int_equal(err.grpc_code, 16);
    assert_non_null(strstr(err.message, "authorization"));
    assert_int_equal(gw_ctl_create_session(anon_, 2000, &geo, 100, "", &s, &err), RI_ERR_UNAUTHENTICATED);

    assert_int_equal(gw_ctl_create(daemon_.grpc, "not-a-known-token-at-all", &wrong), RI_OK);
    assert_int_equal(gw_ctl_stats(wrong, 2000, &st, &err), RI_ERR_UNAUTHENTICATED);
    assert_non_null(strstr(err.message, "unknown bearer token"));
    assert_int_equal(gw_ctl_drain(wrong, 2000, NULL, &err), RI_ERR_UNAUTHENTICATED);
    gw_ctl_destroy(wrong);

    /* a prefix of a real token is not that token */
    assert_int_equal(gw_ctl_create(daemon_.grpc, "alice-token-012345678", &prefix), RI_OK);
    assert_int_equal(gw_ctl_stats(prefix, 2000, &st, &err), RI_ERR_UNAUTHENTICATED);
    gw_ctl_destroy(prefix);
    assert_int_equal(count_sessions(alice_), 0);
}

static void test_tenants_are_isolated(void **state)
{
    (void)state;
    gw_ctl_session_t sa, sb;
    gw_ctl_error_t err;
    gw_ctl_session_info_t *infos = NULL;
    size_t n = 0;

    assert_int_equal(gw_ctl_create_session(alice_, 2000, &geo, 256, "alice-1", &sa, &err), RI_OK);
    assert_int_equal(gw_ctl_create_session(bob_, 2000, &geo, 256, "bob-1", &sb, &err), RI_OK);

    assert_int_equal(gw_ctl_list_sessions(bob_, 2000, &infos, &n, &err), RI_OK);
    assert_int_equal(n, 1);
    assert_int_equal(infos[0].session_id, sb.session_id);
    assert_string_equal(infos[0].tenant, "bob");
    cm_free(infos);

    /* bob cannot drop alice's session: NOT_FOUND, as for a missing id */
    assert_int_equal(gw_ctl_drop_session(bob_, 2000, sa.session_id, NULL, &err), RI_ERR_NOT_FOUND);
    assert_int_equal(count_sessions(alice_), 1);

    gw_ctl_stats_t st;
    assert_int_equal(gw_ctl_stats(alice_, 2000, &st, &err), RI_OK);
    assert_int_equal(st.sessions, 1);
    assert_int_equal(st.sessions_all, 2);

    assert_int_equal(gw_ctl_drop_session(alice_, 2000, sa.session_id, NULL, &err), RI_OK);
    assert_int_equal(gw_ctl_drop_session(bob_, 2000, sb.session_id, NULL, &err), RI_OK);
    assert_int_equal(count_sessions(alice_), 0);
    assert_int_equal(count_sessions(bob_), 0);
}

static void test_quota_is_resource_exhausted(void **state)
{
    (void)state;
    gw_ctl_session_t s;
    gw_ctl_error_t err;
    gw_ctl_stats_t before, after;

    assert_int_equal(gw_ctl_stats(alice_, 2000, &before, &err), RI_OK);
    /* alice has 1 MiB: 64K tokens of 2x2x64 f16 K+V is 64 MiB */
    assert_int_equal(gw_ctl_create_session(alice_, 2000, &geo, 65536, "too-big", &s, &err), RI_ERR_QUOTA);
    assert_int_equal(err.grpc_code, 8);
    assert_non_null(strstr(err.message, "quota"));
    assert_int_equal(count_sessions(alice_), 0);
    /* bob has no tenant quota but the pool is 64 MiB */
    assert_int_equal(gw_ctl_create_session(bob_, 2000, &geo, 1u << 20, "bigger-than-pool", &s, &err), RI_ERR_QUOTA);
    assert_int_equal(count_sessions(bob_), 0);
    assert_int_equal(gw_ctl_stats(alice_, 2000, &after, &err), RI_OK);
    assert_int_equal(after.pool_bytes_used, before.pool_bytes_used);
    assert_int_equal(after.sessions_all, before.sessions_all);

    /* fill alice's quota with small sessions until refused; each refused
     * request leaves the count unchanged */
    size_t made = 0;
    uint64_t ids[64];
    for (; made < 64; made++) {
        ri_status_t st = gw_ctl_create_session(alice_, 2000, &geo, 1024, "fill", &s, &err);
        if (st == RI_ERR_QUOTA)
            break;
        assert_int_equal(st, RI_OK);
        ids[made] = s.session_id;
    }
    assert_true(made > 0 && made < 64);
    assert_int_equal(count_sessions(alice_), made);
    for (size_t i = 0; i < made; i++)
        assert_int_equal(gw_ctl_drop_session(alice_, 2000, ids[i], NULL, &err), RI_OK);
    /* freed quota can be used again */
    assert_int_equal(gw_ctl_create_session(alice_, 2000, &geo, 1024, "again", &s, &err), RI_OK);
    assert_int_equal(gw_ctl_drop_session(alice_, 2000, s.session_id, NULL, &err), RI_OK);
}

/* Call Stats until it returns want or 5 s pass (SIGHUP is asynchronous). */
static ri_status_t stats_until(gw_ctl_t *c, ri_status_t want)
{
    gw_ctl_stats_t st;
    ri_status_t got = RI_ERR_INTERNAL;
    for (int i = 0; i < 500 && got != want; i++) {
        got = gw_ctl_stats(c, 2000, &st, NULL);
        if (got != want)
            usleep(10000);
    }
    return got;
}

/* Tokens after the rotation: alice, bob's new token, ops. */
#define TOKENS_ROTATED TOK_ALICE " alice 1MiB\nbob-rotated-token-99 bob\n" TOK_OPS " ops - admin\n"

/* Replace the tokens file and tell the daemon (SIGHUP, asynchronous). */
static void reload_tokens(const char *text)
{
    char path[600];
    assert_int_equal(kvs_test_daemon_write_file(&daemon_, "tokens", text, path, sizeof(path)), 0);
    assert_int_equal(kill(daemon_.pid, SIGHUP), 0);
}

static void test_sighup_reloads_tokens(void **state)
{
    (void)state;
    gw_ctl_t *bob2 = NULL;
    assert_int_equal(gw_ctl_create(daemon_.grpc, "bob-rotated-token-99", &bob2), RI_OK);
    assert_int_equal(stats_until(bob2, RI_ERR_UNAUTHENTICATED), RI_ERR_UNAUTHENTICATED);

    /* rotate bob's token */
    reload_tokens(TOKENS_ROTATED);
    assert_int_equal(stats_until(bob2, RI_OK), RI_OK);
    assert_int_equal(stats_until(bob_, RI_ERR_UNAUTHENTICATED), RI_ERR_UNAUTHENTICATED);
    assert_int_equal(stats_until(alice_, RI_OK), RI_OK);

    /* a broken file is refused: the current tokens stay */
    reload_tokens("broken\n");
    static char body[1 << 20];
    bool refused = false;
    for (int i = 0; i < 500 && !refused; i++) {
        assert_int_equal(kvs_test_http_get(daemon_.metrics, "/metrics", body, sizeof(body)), 200);
        refused = strstr(body, "ri_kvs_token_reloads_total{result=\"refused\"} 1") != NULL;
        if (!refused)
            usleep(10000);
    }
    assert_true(refused);
    assert_int_equal(stats_until(bob2, RI_OK), RI_OK);
    assert_int_equal(stats_until(ops_, RI_OK), RI_OK);
    gw_ctl_destroy(bob2);
}

static bool lists_session(gw_ctl_t *c, uint64_t id, const char *tenant)
{
    gw_ctl_session_info_t *infos = NULL;
    size_t n = 0;
    bool found = false;
    assert_int_equal(gw_ctl_list_sessions(c, 2000, &infos, &n, NULL), RI_OK);
    for (size_t i = 0; i < n; i++)
        found |= infos[i].session_id == id && strcmp(infos[i].tenant, tenant) == 0;
    cm_free(infos);
    return found;
}

static void test_admin_sees_all_and_removed_tenant_is_revoked(void **state)
{
    (void)state;
    gw_ctl_session_t sa, sb;
    gw_ctl_error_t err;
    gw_ctl_t *bob2 = NULL;
    gw_dp_t *dp = NULL, *dp2 = NULL;
    static char body[1 << 20];

    /* tokens as the reload test left them: alice, bob (rotated), ops */
    assert_int_equal(gw_ctl_create(daemon_.grpc, "bob-rotated-token-99", &bob2), RI_OK);
    assert_int_equal(gw_ctl_create_session(alice_, 2000, &geo, 256, "alice-revoked", &sa, &err), RI_OK);
    assert_int_equal(gw_ctl_create_session(bob2, 2000, &geo, 256, "bob-admin-drop", &sb, &err), RI_OK);
    assert_int_equal(gw_dp_connect(sa.dataplane_address, sa.session_id, sa.secret, NULL, &dp), RI_OK);
    assert_int_equal(gw_dp_ping(dp), RI_OK);

    /* the admin lists every tenant's sessions and drops another tenant's;
     * a tenant still sees only its own */
    assert_true(lists_session(ops_, sa.session_id, "alice"));
    assert_true(lists_session(ops_, sb.session_id, "bob"));
    assert_false(lists_session(bob2, sa.session_id, "alice"));
    assert_int_equal(gw_ctl_drop_session(ops_, 2000, sb.session_id, NULL, &err), RI_OK);
    assert_false(lists_session(bob2, sb.session_id, "bob"));
    assert_int_equal(gw_ctl_drop_session(ops_, 2000, sb.session_id, NULL, &err), RI_ERR_NOT_FOUND);

    /* alice's last token goes: her session is dropped on the reload and its
     * secret no longer works on the data plane, on the open connection or a
     * new one */
    reload_tokens("bob-rotated-token-99 bob\n" TOK_OPS " ops - admin\n");
    assert_int_equal(stats_until(alice_, RI_ERR_UNAUTHENTICATED), RI_ERR_UNAUTHENTICATED);
    /* the revocation follows the token swap in the same reload: wait for it */
    for (int i = 0; i < 500 && lists_session(ops_, sa.session_id, "alice"); i++)
        usleep(10000);
    ri_status_t ping = gw_dp_ping(dp);
    if (ping == RI_OK)
        fail_msg("session %llu of removed tenant alice still answers on the data plane",
                 (unsigned long long)sa.session_id);
    assert_int_not_equal(gw_dp_connect(sa.dataplane_address, sa.session_id, sa.secret, NULL, &dp2), RI_OK);
    assert_null(dp2);
    assert_false(lists_session(ops_, sa.session_id, "alice"));
    assert_int_equal(kvs_test_http_get(daemon_.metrics, "/metrics", body, sizeof(body)), 200);
    assert_non_null(strstr(body, "ri_kvs_revoked_sessions_total 1"));
    gw_dp_close(dp);

    /* alice back (the next test needs her): a fresh start, no old sessions */
    reload_tokens(TOKENS_ROTATED);
    assert_int_equal(stats_until(alice_, RI_OK), RI_OK);
    assert_int_equal(count_sessions(alice_), 0);
    gw_ctl_destroy(bob2);
}

static void test_drain_needs_admin_and_metrics_count_failures(void **state)
{
    (void)state;
    gw_ctl_error_t err;
    uint32_t open = 99;
    static char body[1 << 20];

    assert_int_equal(gw_ctl_drain(alice_, 2000, &open, &err), RI_ERR_PERMISSION);
    assert_int_equal(err.grpc_code, 7);
    assert_int_equal(gw_ctl_drain(ops_, 2000, &open, &err), RI_OK);
    assert_int_equal(open, 0);

    assert_int_equal(kvs_test_http_get(daemon_.metrics, "/metrics", body, sizeof(body)), 200);
    const char *p = strstr(body, "\nri_kvs_grpc_auth_failures_total ");
    assert_non_null(p);
    assert_true(strtoull(p + strlen("\nri_kvs_grpc_auth_failures_total "), NULL, 10) >= 5);
    assert_non_null(strstr(body, "ri_kvs_grpc_calls_total{method=\"Stats\",code=\"UNAUTHENTICATED\"}"));
    assert_non_null(strstr(body, "ri_kvs_grpc_calls_total{method=\"CreateSession\",code=\"RESOURCE_EXHAUSTED\"}"));
    assert_non_null(strstr(body, "auth_mode=\"tokens\""));
    assert_int_equal(kvs_test_daemon_stop(&daemon_, SIGTERM, 10000), 0);
}

/* Start a daemon that must refuse to start; returns its exit status. */
static int start_refused(const char *tokens_text, const char *const *more)
{
    kvs_test_daemon_t d;
    char path[600], flag[700];
    const char *extra[8] = {0};
    int n = 0, code = -99;
    assert_int_equal(kvs_test_daemon_prepare(&d), 0);
    if (tokens_text != NULL) {
        assert_int_equal(kvs_test_daemon_write_file(&d, "tokens", tokens_text, path, sizeof(path)), 0);
        snprintf(flag, sizeof(flag), "--tokens-file=%s", path);
        extra[n++] = flag;
    }
    for (int i = 0; more != NULL && more[i] != NULL; i++)
        extra[n++] = more[i];
    int rc = kvs_test_daemon_start(&d, extra, &code);
    if (rc == 0)
        kvs_test_daemon_stop(&d, SIGKILL, 2000);
    kvs_test_daemon_cleanup(&d);
    assert_int_equal(rc, -1);
    return code;
}

static void test_startup_rules(void **state)
{
    (void)state;
    /* no tokens file and a non-loopback address: refused (exit 2) */
    const char *wide[] = {"--listen=0.0.0.0:0", NULL};
    assert_int_equal(start_refused(NULL, wide), 2);
    /* the same for the data plane: before this rule it started silently
     * (start_refused failed: the daemon served, rc 0 instead of -1) */
    const char *wide_dp[] = {"--dataplane-listen=0.0.0.0:0", NULL};
    assert_int_equal(start_refused(NULL, wide_dp), 2);
    char bin[512], out[2048];
    const char *argv[] = {kvs_test_bin("ri-kvstore", bin, sizeof(bin)), "--listen=127.0.0.1:0",
                          "--dataplane-listen=0.0.0.0:0", "--metrics-listen=off", NULL};
    assert_int_equal(kvs_test_run(argv, out, sizeof(out), 10000), 2);
    assert_non_null(strstr(out, "dataplane-listen '0.0.0.0:0' is not a loopback address"));
    /* --insecure lets it serve there, as it does for listen */
    kvs_test_daemon_t d = {0};
    const char *wide_ok[] = {"--dataplane-listen=0.0.0.0:0", "--insecure", NULL};
    assert_int_equal(kvs_test_daemon_start(&d, wide_ok, NULL), 0);
    assert_int_equal(kvs_test_daemon_stop(&d, SIGTERM, 10000), 0);
    kvs_test_daemon_cleanup(&d);
    /* bad tokens files: refused (exit 1) */
    assert_int_equal(start_refused("short alice\n", NULL), 1);
    assert_int_equal(start_refused("a-long-enough-token bad/tenant\n", NULL), 1);
    assert_int_equal(start_refused("a-long-enough-token alice 12XB\n", NULL), 1);
    assert_int_equal(start_refused("a-long-enough-token alice\na-long-enough-token bob\n", NULL), 1);
    assert_int_equal(start_refused("# only comments\n\n", NULL), 1);
    const char *missing[] = {"--tokens-file=/nonexistent/tokens", NULL};
    assert_int_equal(start_refused(NULL, missing), 1);
    /* bad settings: exit 2 */
    const char *bad_threads[] = {"--threads=0", NULL};
    assert_int_equal(start_refused(NULL, bad_threads), 2);
    const char *bad_flag[] = {"--no-such-setting=1", NULL};
    assert_int_equal(start_refused(NULL, bad_flag), 2);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_health_needs_no_token),
        cmocka_unit_test(test_missing_or_wrong_token),
        cmocka_unit_test(test_tenants_are_isolated),
        cmocka_unit_test(test_quota_is_resource_exhausted),
        cmocka_unit_test(test_sighup_reloads_tokens),
        cmocka_unit_test(test_admin_sees_all_and_removed_tenant_is_revoked),
        cmocka_unit_test(test_drain_needs_admin_and_metrics_count_failures),
        cmocka_unit_test(test_startup_rules),
    };
    char bin[512];
    if (access(kvs_test_bin("ri-kvstore", bin, sizeof(bin)), X_OK) != 0)
        return 77;
    return cmocka_run_group_tests(tests, group_setup, group_teardown);
}
