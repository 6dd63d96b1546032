/*
 * Security limits of ri-kvstore against the real daemon (findings of the
 * security review and the fd start-up check of docs/kvstore.md "Security and
 * limits"):
 *  - a Health request far over max-message (10.5 MB of unknown fields, no
 *    token needed) is refused by gRPC at once with RESOURCE_EXHAUSTED, and
 *    the daemon still answers;
 *  - one tenant cannot hold more than max-sessions-per-tenant sessions, the
 *    error names that limit (not a memory quota), another tenant still
 *    creates, and /metrics counts the refusal;
 *  - a group- or world-writable tokens file is refused at start;
 *  - without a tokens file Drain is refused unless --insecure-admin;
 *  - a fd hard limit below what max-connections needs stops the start with
 *    an error naming the setting;
 *  - a data-plane REGISTER_CACHE is daemon memory charged to the tenant's
 *    quota before it is allocated: 2^26 pages is refused at once with
 *    QUOTA and the daemon's memory does not grow; a directory that fits
 *    holds quota that a session then cannot have, until it is released;
 *  - a data-plane UPLOAD of 128 MiB with a wrong session secret is refused
 *    from its header: UNAUTHENTICATED, and the daemon's peak memory
 *    does not grow by the body;
 *  - with every address on loopback (the test default), no socket of the
 *    daemon listens beyond it, UCX's own TCP interface included;
 *  - 16 clients trickling a /metrics request (a byte a second, under the
 *    idle timeout) do not shut scraping out: their connections are cut
 *    after the 3 s bound and a scrape gets through.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>
#include <cmocka.h>

#include "common/cm_alloc.h"
#include "gpuworker/client/gw_ctl.h"
#include "gpuworker/client/gw_dp.h"
#include "kvs_test_daemon.h"

#define TOK_ALICE "alice-token-0123456789"
#define TOK_BOB "bob-token-0123456789"
#define SESSION_CAP 8

static const gw_ctl_geometry_t geo = {.layers = 1, .kv_heads = 1, .head_dim = 64, .dtype = 1, .page_tokens = 8};

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

/* Start a daemon with a tokens file of the given text (NULL = none). */
static void start_daemon(kvs_test_daemon_t *d, const char *tokens, const char *const *more)
{
    char path[600];
    static char flag[700];
    const char *extra[8] = {0};
    int n = 0;
    assert_int_equal(kvs_test_daemon_prepare(d), 0);
    if (tokens != NULL) {
        assert_int_equal(kvs_test_daemon_write_file(d, "tokens", tokens, path, sizeof(path)), 0);
        snprintf(flag, sizeof(flag), "--tokens-file=%s", path);
        extra[n++] = flag;
    }
    for (int i = 0; more != NULL && more[i] != NULL && n < 7; i++)
        extra[n++] = more[i];
    assert_int_equal(kvs_test_daemon_start(d, extra, NULL), 0);
}

static void test_huge_health_body_refused(void **state)
{
    (void)state;
    kvs_test_daemon_t d;
    gw_ctl_t *anon = NULL;
    gw_ctl_error_t err;
    gw_ctl_health_t h;
    uint8_t *resp = NULL;
    size_t resp_len = 0;
    start_daemon(&d, NULL, NULL);
    assert_int_equal(gw_ctl_create(d.grpc, NULL, &anon), RI_OK);

    /* Unknown field 15, wire type 2, 1000-byte payloads: what the review
     * sent.  Small unknown fields (4 KiB) are still fine. */
    size_t big = 10500000, off = 0;
    uint8_t *body = malloc(big);
    assert_non_null(body);
    while (off + 1003 <= big) {
        body[off] = (15 << 3) | 2;
        body[off + 1] = 0xe8; /* varint 1000 */
        body[off + 2] = 0x07;
        memset(body + off + 3, 'x', 1000);
        off += 1003;
    }
    assert_int_equal(gw_ctl_call_raw(anon, "/retroinfer.v1.KvStore/Health", body, 4012, 5000, &resp, &resp_len, &err),
                     RI_OK);
    cm_free(resp);
    resp = NULL;
    double t0 = now_s();
    ri_status_t st = gw_ctl_call_raw(anon, "/retroinfer.v1.KvStore/Health", body, off, 10000, &resp, &resp_len, &err);
    double dt = now_s() - t0;
    cm_free(resp);
    free(body);
    assert_int_not_equal(st, RI_OK);
    assert_int_equal(err.grpc_code, 8); /* RESOURCE_EXHAUSTED, from the receive limit */
    assert_true(dt < 5.0);
    assert_int_equal(gw_ctl_health(anon, 5000, &h, &err), RI_OK);
    gw_ctl_destroy(anon);
    assert_int_equal(kvs_test_daemon_stop(&d, SIGTERM, 10000), 0);
    kvs_test_daemon_cleanup(&d);
}

static void test_sessions_per_tenant(void **state)
{
    (void)state;
    kvs_test_daemon_t d;
    gw_ctl_t *alice = NULL, *bob = NULL;
    gw_ctl_error_t err;
    gw_ctl_session_t s;
    static char body[1 << 20];
    const char *more[] = {"--max-sessions-per-tenant=8", NULL};
    start_daemon(&d, TOK_ALICE " alice\n" TOK_BOB " bob\n", more);
    assert_int_equal(gw_ctl_create(d.grpc, TOK_ALICE, &alice), RI_OK);
    assert_int_equal(gw_ctl_create(d.grpc, TOK_BOB, &bob), RI_OK);

    for (int i = 0; i < SESSION_CAP; i++)
        assert_int_equal(gw_ctl_create_session(alice, 5000, &geo, 64, "cap", &s, &err), RI_OK);
    assert_int_equal(gw_ctl_create_session(alice, 5000, &geo, 64, "over", &s, &err), RI_ERR_QUOTA);
    assert_int_equal(err.grpc_code, 8);
    assert_non_null(strstr(err.message, "max-sessions-per-tenant"));
    assert_null(strstr(err.message, "memory quota"));
    /* the other tenant is not affected */
    assert_int_equal(gw_ctl_create_session(bob, 5000, &geo, 64, "bob", &s, &err), RI_OK);
    assert_int_equal(kvs_test_http_get(d.metrics, "/metrics", body, sizeof(body)), 200);
    assert_non_null(strstr(body, "ri_kvs_limit_refusals_total{limit=\"max-sessions-per-tenant\"} 1\n"));
    gw_ctl_destroy(alice);
    gw_ctl_destroy(bob);
    assert_int_equal(kvs_test_daemon_stop(&d, SIGTERM, 10000), 0);
    kvs_test_daemon_cleanup(&d);
}

/* Resident memory of a process, KiB: "VmRSS" now, "VmHWM" the peak. */
static long status_kib(pid_t pid, const char *field)
{
    char path[64], line[256], want[32];
    long kib = -1;
    snprintf(path, sizeof(path), "/proc/%d/status", (int)pid);
    snprintf(want, sizeof(want), "%s: %%ld kB", field);
    FILE *f = fopen(path, "r");
    if (f == NULL)
        return -1;
    while (fgets(line, sizeof(line), f))
        if (sscanf(line, want, &kib) == 1)
            break;
    fclose(f);
    return kib;
}

static void test_wrong_secret_body_not_taken(void **state)
{
    (void)state;
    enum { BODY = 128 << 20 };
    kvs_test_daemon_t d;
    gw_ctl_t *c = NULL;
    gw_ctl_error_t err;
    gw_ctl_session_t s;
    gw_dp_t *dp = NULL;
    cm_wire_hdr_t h, rep;
    uint8_t hb[CM_WIRE_HDR_SIZE];
    start_daemon(&d, NULL, NULL);
    assert_int_equal(gw_ctl_create(d.grpc, NULL, &c), RI_OK);
    assert_int_equal(gw_ctl_create_session(c, 5000, &geo, 64, "victim", &s, &err), RI_OK);
    assert_int_equal(gw_dp_connect(s.dataplane_address, s.session_id, s.secret, NULL, &dp), RI_OK);
    uint8_t *body = malloc(BODY);
    assert_non_null(body);
    memset(body, 0x11, BODY);
    long peak0 = status_kib(d.pid, "VmHWM");
    gw_dp_header(dp, CM_WIRE_OP_UPLOAD_CLUSTERS, 0, BODY, &h);
    h.secret[0] ^= 0x5a; /* not the session's secret */
    cm_wire_encode(&h, hb);
    assert_int_equal(gw_dp_raw(dp, hb, sizeof(hb), body, BODY, 30000, &rep), RI_OK);
    long peak1 = status_kib(d.pid, "VmHWM");
    printf("# UPLOAD of 128 MiB with a wrong secret: %s, daemon peak RSS %ld -> %ld KiB\n",
           ri_status_str((ri_status_t)rep.status), peak0, peak1);
    assert_int_equal(rep.status, RI_ERR_UNAUTHENTICATED);
    if (peak1 - peak0 > 32 * 1024)
        fail_msg("the daemon took in the %d-byte body of a request with a wrong secret (peak +%ld KiB)", BODY,
                 peak1 - peak0);
    /* the connection and the session still work */
    assert_int_equal(gw_dp_ping(dp), RI_OK);
    free(body);
    gw_dp_close(dp);
    gw_ctl_destroy(c);
    assert_int_equal(kvs_test_daemon_stop(&d, SIGTERM, 10000), 0);
    kvs_test_daemon_cleanup(&d);
}

static void test_register_cache_is_charged(void **state)
{
    (void)state;
    kvs_test_daemon_t d;
    gw_ctl_t *alice = NULL;
    gw_ctl_error_t err;
    gw_ctl_session_t s, big;
    gw_dp_t *dp = NULL;
    static uint8_t recv[1 << 16];
    uint32_t cache_id = 0;

    start_daemon(&d, TOK_ALICE " alice 4MiB\n", NULL);
    assert_int_equal(gw_ctl_create(d.grpc, TOK_ALICE, &alice), RI_OK);
    assert_int_equal(gw_ctl_create_session(alice, 5000, &geo, 64, "small", &s, &err), RI_OK);
    assert_int_equal(gw_dp_connect(s.dataplane_address, s.session_id, s.secret, NULL, &dp), RI_OK);

    /* 2^26 pages: gigabytes of directory for a 4 MiB tenant */
    long before = status_kib(d.pid, "VmRSS");
    double t0 = now_s();
    ri_status_t st = gw_dp_register_cache_mode(dp, 1u << 26, recv, sizeof(recv), GW_DP_RECV_INLINE, &cache_id, NULL);
    double dt = now_s() - t0;
    long after = status_kib(d.pid, "VmRSS");
    printf("# REGISTER_CACHE of 2^26 pages: %s in %.3f s, daemon RSS %ld -> %ld KiB\n", ri_status_str(st), dt,
           before, after);
    if (st == RI_OK)
        fail_msg("a 2^26-page cache directory was accepted for a tenant with a 4 MiB quota");
    assert_int_equal(st, RI_ERR_QUOTA);
    assert_true(dt < 2.0);
    assert_true(after - before < 64 * 1024);

    /* 64K pages (~2.8 MiB of directory) fit, and hold that quota */
    assert_int_equal(gw_dp_register_cache_mode(dp, 65536, recv, sizeof(recv), GW_DP_RECV_INLINE, &cache_id, NULL),
                     RI_OK);
    assert_int_equal(gw_ctl_create_session(alice, 5000, &geo, 8192, "needs-2MiB", &big, &err), RI_ERR_QUOTA);
    assert_non_null(strstr(err.message, "quota"));
    assert_int_equal(gw_dp_release(dp, cache_id), RI_OK);
    assert_int_equal(gw_ctl_create_session(alice, 5000, &geo, 8192, "needs-2MiB", &big, &err), RI_OK);
    gw_dp_close(dp);
    gw_ctl_destroy(alice);
    assert_int_equal(kvs_test_daemon_stop(&d, SIGTERM, 10000), 0);
    kvs_test_daemon_cleanup(&d);
}

/* Is this /proc/net/tcp{,6} local address (hex, kernel byte order) loopback? */
static bool proc_addr_is_loopback(const char *hex, bool v6)
{
    char w[9] = {0};
    if (!v6) {
        memcpy(w, hex, 8);
        return (strtoul(w, NULL, 16) & 0xffu) == 127u;
    }
    if (strncmp(hex, "00000000000000000000000001000000", 32) == 0)
        return true; /* ::1 */
    memcpy(w, hex + 24, 8);
    return strncmp(hex, "0000000000000000FFFF0000", 24) == 0 && (strtoul(w, NULL, 16) & 0xffu) == 127u;
}

/* Count the process's listening TCP sockets, and those not on loopback. */
static void listeners_of(pid_t pid, int *all_p, int *outside_p)
{
    char path[128], link[128];
    unsigned long inodes[512];
    int n_in = 0;
    *all_p = *outside_p = 0;
    for (int fd = 0; fd < 4096 && n_in < 512; fd++) {
        snprintf(path, sizeof(path), "/proc/%d/fd/%d", (int)pid, fd);
        ssize_t l = readlink(path, link, sizeof(link) - 1);
        if (l <= 0)
            continue;
        link[l] = '\0';
        if (strncmp(link, "socket:[", 8) == 0)
            inodes[n_in++] = strtoul(link + 8, NULL, 10);
    }
    for (int v6 = 0; v6 < 2; v6++) {
        FILE *f = fopen(v6 ? "/proc/net/tcp6" : "/proc/net/tcp", "r");
        char line[512], local[64], st[8];
        unsigned long inode;
        if (f == NULL)
            continue;
        while (fgets(line, sizeof(line), f))
            if (sscanf(line, " %*d: %63s %*s %7s %*s %*s %*s %*s %*s %lu", local, st, &inode) == 3 &&
                strcmp(st, "0A") == 0)
                for (int i = 0; i < n_in; i++)
                    if (inodes[i] == inode) {
                        (*all_p)++;
                        if (!proc_addr_is_loopback(local, v6)) {
                            printf("# listening outside loopback: %s (%s)\n", local, v6 ? "tcp6" : "tcp");
                            (*outside_p)++;
                        }
                    }
        fclose(f);
    }
}

static void test_loopback_only_listeners(void **state)
{
    (void)state;
    kvs_test_daemon_t d;
    int all = 0, outside = 0;
    start_daemon(&d, NULL, NULL);
    listeners_of(d.pid, &all, &outside);
    printf("# daemon on loopback: %d listening sockets, %d beyond loopback\n", all, outside);
    assert_true(all >= 3); /* gRPC, metrics, data plane */
    if (outside != 0)
        fail_msg("%d listening socket(s) of a loopback-only daemon are reachable from other interfaces", outside);
    assert_int_equal(kvs_test_daemon_stop(&d, SIGTERM, 10000), 0);
    kvs_test_daemon_cleanup(&d);
}

/* A TCP connection to "127.0.0.1:PORT" that has sent the start of a request. */
static int trickle_open(const char *addr)
{
    const char *colon = strrchr(addr, ':');
    struct sockaddr_in sin = {.sin_family = AF_INET, .sin_port = htons((uint16_t)atoi(colon + 1))};
    inet_pton(AF_INET, "127.0.0.1", &sin.sin_addr);
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    assert_true(fd >= 0);
    assert_int_equal(connect(fd, (struct sockaddr *)&sin, sizeof(sin)), 0);
    static const char start[] = "GET /metrics HTTP/1.1\r\nX-Slow: ";
    assert_int_equal(send(fd, start, sizeof(start) - 1, MSG_NOSIGNAL), (ssize_t)(sizeof(start) - 1));
    return fd;
}

static void test_slow_metrics_clients(void **state)
{
    (void)state;
    enum { SLOW = 16 };
    kvs_test_daemon_t d;
    int fds[SLOW];
    static char body[1 << 18];
    start_daemon(&d, NULL, NULL);
    for (int i = 0; i < SLOW; i++)
        fds[i] = trickle_open(d.metrics);
    /* Keep trickling (a byte every 0.5 s each) while trying to scrape. */
    double t0 = now_s(), got = -1, last_byte = 0;
    while (now_s() - t0 < 10.0 && got < 0) {
        if (now_s() - last_byte >= 0.5) {
            for (int i = 0; i < SLOW; i++)
                (void)send(fds[i], "x", 1, MSG_NOSIGNAL | MSG_DONTWAIT);
            last_byte = now_s();
        }
        if (kvs_test_http_get(d.metrics, "/metrics", body, sizeof(body)) == 200)
            got = now_s() - t0;
        else
            usleep(100 * 1000);
    }
    printf("# 16 trickling clients: a scrape got through after %.1f s\n", got);
    if (got < 0)
        fail_msg("16 trickling clients kept /metrics shut out for 10 s");
    assert_true(got < 6.0);
    assert_non_null(strstr(body, "ri_kvs_metrics_overran_total "));
    /* the trickling connections are closed by the daemon (each within its
     * own 3 s bound plus the watchdog's period: wait up to 5 s more) */
    int closed = 0;
    double until = now_s() + 5.0;
    for (int i = 0; i < SLOW; i++) {
        char c;
        struct pollfd pf = {.fd = fds[i], .events = POLLIN};
        int left_ms = (int)((until - now_s()) * 1000);
        if (poll(&pf, 1, left_ms > 0 ? left_ms : 0) == 1) {
            ssize_t r = recv(fds[i], &c, 1, MSG_DONTWAIT);
            closed += r == 0 || (r < 0 && errno == ECONNRESET);
        }
        close(fds[i]);
    }
    assert_int_equal(closed, SLOW);
    assert_int_equal(kvs_test_daemon_stop(&d, SIGTERM, 10000), 0);
    kvs_test_daemon_cleanup(&d);
}

/* Start with a tokens file of this mode; returns the exit status, or 0 if it served. */
static int start_with_mode(mode_t mode, char *log, size_t loglen)
{
    kvs_test_daemon_t d;
    char path[600], flag[700], bin[512];
    assert_int_equal(kvs_test_daemon_prepare(&d), 0);
    assert_int_equal(kvs_test_daemon_write_file(&d, "tokens", TOK_ALICE " alice\n", path, sizeof(path)), 0);
    assert_int_equal(chmod(path, mode), 0);
    snprintf(flag, sizeof(flag), "--tokens-file=%s", path);
    const char *argv[] = {kvs_test_bin("ri-kvstore", bin, sizeof(bin)), "--listen=127.0.0.1:0",
                          "--dataplane-listen=127.0.0.1:0", "--metrics-listen=off", "--memory=16MiB",
                          "--no-hugepages", flag, NULL};
    int rc = kvs_test_run(argv, log, loglen, 3000); /* a daemon that serves is killed at 3 s */
    kvs_test_daemon_cleanup(&d);
    return rc;
}

static void test_writable_tokens_file_refused(void **state)
{
    (void)state;
    static char log[8192];
    assert_int_equal(start_with_mode(0666, log, sizeof(log)), 1);
    assert_non_null(strstr(log, "writable by every user"));
    assert_int_equal(start_with_mode(0620, log, sizeof(log)), 1);
    assert_non_null(strstr(log, "writable by its group"));
    /* 0600 serves (killed by the timeout, so not exit 1) */
    assert_int_not_equal(start_with_mode(0600, log, sizeof(log)), 1);
}

static void test_tokenless_admin_needs_flag(void **state)
{
    (void)state;
    kvs_test_daemon_t d;
    gw_ctl_t *anon = NULL;
    gw_ctl_error_t err;
    uint32_t open = 99;
    /* the test helper passes --insecure-admin; this one turns it off again */
    const char *more[] = {"--no-insecure-admin", NULL};
    start_daemon(&d, NULL, more);
    assert_int_equal(gw_ctl_create(d.grpc, NULL, &anon), RI_OK);
    assert_int_equal(gw_ctl_drain(anon, 5000, &open, &err), RI_ERR_PERMISSION);
    assert_int_equal(err.grpc_code, 7);
    assert_non_null(strstr(err.message, "--insecure-admin"));
    gw_ctl_destroy(anon);
    assert_int_equal(kvs_test_daemon_stop(&d, SIGTERM, 10000), 0);
    kvs_test_daemon_cleanup(&d);

    start_daemon(&d, NULL, NULL); /* with the helper's --insecure-admin */
    assert_int_equal(gw_ctl_create(d.grpc, NULL, &anon), RI_OK);
    assert_int_equal(gw_ctl_drain(anon, 5000, &open, &err), RI_OK);
    gw_ctl_destroy(anon);
    assert_int_equal(kvs_test_daemon_stop(&d, SIGTERM, 10000), 0);
    kvs_test_daemon_cleanup(&d);
}

static void test_fd_limit_checked_at_start(void **state)
{
    (void)state;
    static char log[8192];
    char bin[512];
    const char *argv[] = {"/usr/bin/prlimit", "--nofile=512:512", kvs_test_bin("ri-kvstore", bin, sizeof(bin)),
                          "--listen=127.0.0.1:0", "--dataplane-listen=127.0.0.1:0", "--metrics-listen=off",
                          "--memory=16MiB", "--no-hugepages", NULL};
    assert_int_equal(kvs_test_run(argv, log, sizeof(log), 10000), 1);
    assert_non_null(strstr(log, "max-connections"));
    assert_non_null(strstr(log, "file descriptor limit 512"));
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_huge_health_body_refused),
        cmocka_unit_test(test_sessions_per_tenant),
        cmocka_unit_test(test_writable_tokens_file_refused),
        cmocka_unit_test(test_tokenless_admin_needs_flag),
        cmocka_unit_test(test_fd_limit_checked_at_start),
        cmocka_unit_test(test_register_cache_is_charged),
        cmocka_unit_test(test_wrong_secret_body_not_taken),
        cmocka_unit_test(test_slow_metrics_clients),
        cmocka_unit_test(test_loopback_only_listeners),
    };
    char bin[512];
    if (access(kvs_test_bin("ri-kvstore", bin, sizeof(bin)), X_OK) != 0)
        return 77;
    if (access("/usr/bin/prlimit", X_OK) != 0)
        return 77; /* the fd check needs it; the rest would pass without */
    return cmocka_run_group_tests(tests, NULL, NULL);
}
