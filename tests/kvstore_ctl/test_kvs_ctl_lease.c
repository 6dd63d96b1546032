/*
 * Session leases against the real ri-kvstore (loopback, --session-lease-ms=2000):
 *  - ten client processes (five with a data-plane connection, five that only
 *    called CreateSession) killed with -9: their sessions are gone within
 *    about two lease periods and ri_kvs_sessions_expired_total says 10;
 *    meanwhile an idle client with a connection and one that only sends
 *    KeepAlive keep theirs for three lease periods, and the tenant, at its
 *    session cap before, can create sessions again;
 *  - a worker whose connection closes and comes back within the lease
 *    re-attaches to its session; once it stays away the session goes;
 *  - KeepAlive's bounds: unknown ids renew nothing, over 4096 ids is
 *    INVALID_ARGUMENT;
 *  - --recover: a session older than the lease is brought back with a fresh
 *    lease (a worker re-attaches), and one nobody re-attaches expires.
 * Against the daemon before leases (run without --session-lease-ms, which
 * it did not know, and without the KeepAlive calls, which it answered
 * UNIMPLEMENTED): the first case failed at "gone_after >= 0", all ten killed
 * clients' sessions still listed 7 s after the kill; the recover case failed
 * at the daemon start (unknown setting).
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
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>
#include <cmocka.h>

#include "common/cm_alloc.h"
#include "gpuworker/client/gw_ctl.h"
#include "gpuworker/client/gw_dp.h"
#include "kvs_test_daemon.h"

#define LEASE_MS 2000
#define N_KILLED 10

static const gw_ctl_geometry_t geo = {.layers = 1, .kv_heads = 1, .head_dim = 64, .dtype = 1, .page_tokens = 8};

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

/* The value of one metric line "name value" in a /metrics page, or -1. */
static long long metric(const char *page, const char *name)
{
    const char *p = page;
    size_t n = strlen(name);
    while ((p = strstr(p, name)) != NULL) {
        if ((p == page || p[-1] == '\n') && p[n] == ' ')
            return atoll(p + n + 1);
        p += n;
    }
    return -1;
}

static long long expired_total(const kvs_test_daemon_t *d)
{
    static char page[1 << 17];
    if (kvs_test_http_get(d->metrics, "/metrics", page, sizeof(page)) != 200)
        return -1;
    return metric(page, "ri_kvs_sessions_expired_total");
}

static size_t count_sessions(gw_ctl_t *c)
{
    gw_ctl_session_info_t *infos = NULL;
    size_t n = 0;
    assert_int_equal(gw_ctl_list_sessions(c, 5000, &infos, &n, NULL), RI_OK);
    cm_free(infos);
    return n;
}

static bool has_session(gw_ctl_t *c, uint64_t id)
{
    gw_ctl_session_info_t *infos = NULL;
    size_t n = 0;
    bool found = false;
    assert_int_equal(gw_ctl_list_sessions(c, 5000, &infos, &n, NULL), RI_OK);
    for (size_t i = 0; i < n; i++)
        found |= infos[i].session_id == id;
    cm_free(infos);
    return found;
}

/* A client process: CreateSession (and CONNECT when with_dp), report the
 * session id on fd, then wait to be killed. */
static void client_main(const char *grpc, bool with_dp, int fd)
{
    gw_ctl_t *c = NULL;
    gw_ctl_session_t s;
    gw_dp_t *dp = NULL;
    uint64_t id = 0;
    if (gw_ctl_create(grpc, NULL, &c) == RI_OK && gw_ctl_create_session(c, 5000, &geo, 64, "victim", &s, NULL) == RI_OK &&
        (!with_dp || gw_dp_connect(s.dataplane_address, s.session_id, s.secret, NULL, &dp) == RI_OK))
        id = s.session_id;
    if (write(fd, &id, sizeof(id)) != (ssize_t)sizeof(id))
        _exit(1);
    for (;;)
        pause();
}

static void test_killed_clients_expire_live_ones_stay(void **state)
{
    (void)state;
    kvs_test_daemon_t d = {0};
    /* the tenant's cap is exactly what it holds before the kill */
    const char *extra[] = {"--session-lease-ms=2000", "--max-sessions-per-tenant=12", NULL};
    pid_t kids[N_KILLED];
    int fds[2];

    assert_int_equal(kvs_test_daemon_start(&d, extra, NULL), 0);
    /* The clients fork before this process touches gRPC or UCX. */
    assert_int_equal(pipe(fds), 0);
    for (int i = 0; i < N_KILLED; i++) {
        kids[i] = fork();
        assert_true(kids[i] >= 0);
        if (kids[i] == 0) {
            close(fds[0]);
            client_main(d.grpc, i % 2 == 0, fds[1]);
        }
    }
    close(fds[1]);
    for (int i = 0; i < N_KILLED; i++) {
        uint64_t id = 0;
        assert_int_equal(read(fds[0], &id, sizeof(id)), (ssize_t)sizeof(id));
        assert_true(id != 0);
    }
    close(fds[0]);

    gw_ctl_t *c = NULL;
    gw_ctl_session_t live, kept;
    gw_dp_t *dp = NULL;
    uint32_t renewed = 0;
    uint64_t lease_ms = 0;
    assert_int_equal(gw_ctl_create(d.grpc, NULL, &c), RI_OK);
    assert_int_equal(gw_ctl_create_session(c, 5000, &geo, 64, "live", &live, NULL), RI_OK);
    assert_int_equal(gw_dp_connect(live.dataplane_address, live.session_id, live.secret, NULL, &dp), RI_OK);
    assert_int_equal(gw_ctl_create_session(c, 5000, &geo, 64, "kept", &kept, NULL), RI_OK);
    assert_int_equal(count_sessions(c), N_KILLED + 2);
    gw_ctl_session_t extra_s;
    assert_int_equal(gw_ctl_create_session(c, 5000, &geo, 64, "over", &extra_s, NULL), RI_ERR_QUOTA);

    for (int i = 0; i < N_KILLED; i++) {
        kill(kids[i], SIGKILL);
        waitpid(kids[i], NULL, 0);
    }
    double t0 = now_s(), gone_after = -1;
    while (now_s() - t0 < 3.5 * LEASE_MS / 1000.0) {
        assert_int_equal(gw_ctl_keepalive(c, 5000, &kept.session_id, 1, &renewed, &lease_ms, NULL), RI_OK);
        assert_int_equal(renewed, 1);
        assert_int_equal(lease_ms, LEASE_MS);
        if (gone_after < 0 && count_sessions(c) == 2)
            gone_after = now_s() - t0;
        usleep(250 * 1000);
    }
    printf("# %d killed clients' sessions gone %.2f s after the kill (lease %d ms)\n", N_KILLED, gone_after, LEASE_MS);
    assert_true(gone_after >= 0);
    assert_true(gone_after <= 3.0 * LEASE_MS / 1000.0);
    /* three and a half lease periods on: the idle connected client and the KeepAlive one stay */
    assert_true(has_session(c, live.session_id));
    assert_true(has_session(c, kept.session_id));
    assert_int_equal(gw_dp_ping(dp), RI_OK);
    assert_int_equal(expired_total(&d), N_KILLED);
    /* the dead clients' places under the tenant's session cap are free again */
    assert_int_equal(gw_ctl_create_session(c, 5000, &geo, 64, "again", &extra_s, NULL), RI_OK);
    assert_int_equal(gw_ctl_drop_session(c, 5000, extra_s.session_id, NULL, NULL), RI_OK);
    /* a dropped session is not counted as expired */
    assert_int_equal(gw_ctl_drop_session(c, 5000, kept.session_id, NULL, NULL), RI_OK);

    /* gone ids renew nothing; too many ids are refused */
    uint64_t gone_id = 1;
    assert_int_equal(gw_ctl_keepalive(c, 5000, &gone_id, 1, &renewed, NULL, NULL), RI_OK);
    assert_int_equal(renewed, 0);
    uint64_t *many = calloc(4097, sizeof(*many));
    gw_ctl_error_t err;
    assert_non_null(many);
    assert_int_equal(gw_ctl_keepalive(c, 5000, many, 4097, NULL, NULL, &err), RI_ERR_INVALID);
    assert_non_null(strstr(err.message, "at most 4096"));
    free(many);

    /* a worker whose connection drops and comes back within the lease re-attaches */
    gw_dp_close(dp);
    dp = NULL;
    usleep(LEASE_MS * 1000 / 2);
    assert_int_equal(gw_dp_connect(live.dataplane_address, live.session_id, live.secret, NULL, &dp), RI_OK);
    assert_int_equal(gw_dp_ping(dp), RI_OK);
    usleep(LEASE_MS * 1000);
    assert_true(has_session(c, live.session_id));
    /* ... and once it stays away, the session goes */
    gw_dp_close(dp);
    t0 = now_s();
    while (has_session(c, live.session_id) && now_s() - t0 < 3.0 * LEASE_MS / 1000.0)
        usleep(100 * 1000);
    assert_false(has_session(c, live.session_id));
    assert_int_equal(expired_total(&d), N_KILLED + 1);

    gw_ctl_destroy(c);
    assert_int_equal(kvs_test_daemon_stop(&d, SIGTERM, 10000), 0);
    kvs_test_daemon_cleanup(&d);
}

/* --recover: sessions come back with a whole lease, not their old one. */
static void test_recovered_sessions_get_a_fresh_lease(void **state)
{
    (void)state;
    kvs_test_daemon_t d = {0};
    char spill[600], spill_flag[700];
    gw_ctl_t *c = NULL;
    gw_ctl_session_t a, b;
    gw_dp_t *dp = NULL;
    uint32_t renewed = 0;

    assert_int_equal(kvs_test_daemon_prepare(&d), 0);
    snprintf(spill, sizeof(spill), "%s/spill", d.dir);
    snprintf(spill_flag, sizeof(spill_flag), "--spill-dir=%s", spill);
    const char *first[] = {"--session-lease-ms=2000", spill_flag, NULL};
    assert_int_equal(kvs_test_daemon_start(&d, first, NULL), 0);
    assert_int_equal(gw_ctl_create(d.grpc, NULL, &c), RI_OK);
    assert_int_equal(gw_ctl_create_session(c, 5000, &geo, 64, "a", &a, NULL), RI_OK);
    assert_int_equal(gw_ctl_create_session(c, 5000, &geo, 64, "b", &b, NULL), RI_OK);
    /* keep both alive for longer than a lease, so their own leases began long before the restart */
    uint64_t ids[2] = {a.session_id, b.session_id};
    for (int i = 0; i < 6; i++) {
        assert_int_equal(gw_ctl_keepalive(c, 5000, ids, 2, &renewed, NULL, NULL), RI_OK);
        assert_int_equal(renewed, 2);
        usleep(500 * 1000);
    }
    gw_ctl_destroy(c);
    assert_int_equal(kvs_test_daemon_stop(&d, SIGTERM, 10000), 0);

    const char *again[] = {"--session-lease-ms=2000", spill_flag, "--recover", NULL};
    assert_int_equal(kvs_test_daemon_start(&d, again, NULL), 0);
    assert_int_equal(gw_ctl_create(d.grpc, NULL, &c), RI_OK);
    gw_ctl_session_info_t *infos = NULL;
    size_t n = 0;
    assert_int_equal(gw_ctl_list_sessions(c, 5000, &infos, &n, NULL), RI_OK);
    assert_int_equal(n, 2);
    const char *addr_a = infos[0].session_id == a.session_id ? infos[0].dataplane_address : infos[1].dataplane_address;
    /* a's worker re-attaches within the lease; nobody comes for b */
    assert_int_equal(gw_dp_connect(addr_a, a.session_id, a.secret, NULL, &dp), RI_OK);
    cm_free(infos);
    double t0 = now_s();
    while (has_session(c, b.session_id) && now_s() - t0 < 3.0 * LEASE_MS / 1000.0)
        usleep(100 * 1000);
    assert_false(has_session(c, b.session_id));
    assert_true(has_session(c, a.session_id));
    assert_int_equal(gw_dp_ping(dp), RI_OK);
    assert_int_equal(expired_total(&d), 1);
    gw_dp_close(dp);
    gw_ctl_destroy(c);
    assert_int_equal(kvs_test_daemon_stop(&d, SIGTERM, 10000), 0);
    char out[256];
    const char *rm[] = {"/bin/rm", "-rf", spill, NULL};
    kvs_test_run(rm, out, sizeof(out), 10000);
    kvs_test_daemon_cleanup(&d);
}

int main(void)
{
    /* The first test forks client processes before this process starts
     * gRPC or UCX, so it must stay first. */
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_killed_clients_expire_live_ones_stay),
        cmocka_unit_test(test_recovered_sessions_get_a_fresh_lease),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
