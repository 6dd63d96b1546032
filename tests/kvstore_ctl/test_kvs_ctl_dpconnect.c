/*
 * How a worker reaches the data plane, against the real daemon on loopback:
 *  - raw bytes (17 x 0xff, 17 and 64 zero bytes, 64 KiB of random bytes) to
 *    every TCP port the daemon listens on leave it up and serving gRPC and
 *    the data plane (17 bytes to UCX 1.13's sockaddr listener aborted it:
 *    the daemon has no such listener any more);
 *  - a CONNECT with a wrong secret is answered nothing, and no connection
 *    is made;
 *  - CONNECTs carrying malformed UCX addresses are refused (the address
 *    checker unpacks them in a process of its own) and the daemon survives;
 *    with the checker replaced by /bin/true (argv[1] = "no-check", the
 *    mutation run) the daemon itself unpacks them and dies, which this test
 *    must report;
 *  - a session holds at most 16 connections;
 *  - a sender stopped (SIGSTOP) half way through a 128 MiB upload does not
 *    hold up another client of the same data-plane thread: its connect and
 *    pings are answered at once (the daemon served one request at a time and
 *    waited up to 5 s for the stalled body: a security review finding);
 *  - with --drain-timeout-ms=1000 that stopped upload is cut off (its
 *    connection force-closed) and its 128 MiB buffer freed ~1.2 s after the
 *    stop, counted as kind="other" (it was held ~20 s, until UCX's
 *    keepalive failed the peer);
 *  - the data-plane threads run at --dataplane-nice (-10 by default) when the
 *    daemon may raise priority (root here), else at the process's.
 */
#define _GNU_SOURCE
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
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
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>
#include <cmocka.h>

#include "common/cm_dp_proto.h"
#include "common/cm_ucx.h"
#include "gpuworker/client/gw_ctl.h"
#include "gpuworker/client/gw_dp.h"
#include "kvs_test_daemon.h"

#define MAX_PORTS 32

static const gw_ctl_geometry_t geo = {.layers = 1, .kv_heads = 1, .head_dim = 64, .dtype = 1, .page_tokens = 8};
static bool g_no_check; /* the mutation run: the address checker is /bin/true */

static void start_daemon_with(kvs_test_daemon_t *d, const char *const *extra)
{
    assert_int_equal(kvs_test_daemon_prepare(d), 0);
    assert_int_equal(kvs_test_daemon_start(d, extra, NULL), 0);
}

static void start_daemon(kvs_test_daemon_t *d)
{
    start_daemon_with(d, NULL);
}

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

static bool daemon_alive(kvs_test_daemon_t *d)
{
    int wst;
    pid_t r = waitpid(d->pid, &wst, WNOHANG);
    if (r == d->pid) {
        printf("# daemon exited: %s %d\n", WIFSIGNALED(wst) ? "signal" : "status",
               WIFSIGNALED(wst) ? WTERMSIG(wst) : WEXITSTATUS(wst));
        d->pid = 0;
        return false;
    }
    return true;
}

/* The TCP ports the process listens on (from /proc/PID/fd and /proc/net/tcp). */
static int listening_ports(pid_t pid, unsigned *ports, int max)
{
    char path[128], link[128], line[512], local[64], st[8];
    unsigned long inodes[512], inode;
    int n_in = 0, n = 0;
    for (int fd = 0; fd < 4096 && n_in < 512; fd++) {
        snprintf(path, sizeof(path), "/proc/%d/fd/%d", (int)pid, fd);
        ssize_t l = readlink(path, link, sizeof(link) - 1);
        if (l <= 0)
            continue;
        link[l] = '\0';
        if (strncmp(link, "socket:[", 8) == 0)
            inodes[n_in++] = strtoul(link + 8, NULL, 10);
    }
    FILE *f = fopen("/proc/net/tcp", "r");
    if (f == NULL)
        return 0;
    while (fgets(line, sizeof(line), f) && n < max)
        if (sscanf(line, " %*d: %63s %*s %7s %*s %*s %*s %*s %*s %lu", local, st, &inode) == 3 &&
            strcmp(st, "0A") == 0)
            for (int i = 0; i < n_in; i++)
                if (inodes[i] == inode) {
                    const char *colon = strchr(local, ':');
                    ports[n++] = colon ? (unsigned)strtoul(colon + 1, NULL, 16) : 0;
                }
    fclose(f);
    return n;
}

static void send_raw(unsigned port, const void *buf, size_t len)
{
    struct sockaddr_in sin = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port)};
    inet_pton(AF_INET, "127.0.0.1", &sin.sin_addr);
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    assert_true(fd >= 0);
    if (connect(fd, (struct sockaddr *)&sin, sizeof(sin)) == 0)
        (void)send(fd, buf, len, MSG_NOSIGNAL);
    usleep(50 * 1000); /* let the daemon read it before the close */
    close(fd);
}

/* The daemon answers gRPC and a new data-plane connection pings. */
static void assert_serving_as(kvs_test_daemon_t *d, const char *token)
{
    gw_ctl_t *c = NULL;
    gw_ctl_error_t err;
    gw_ctl_session_t s;
    gw_dp_t *dp = NULL;
    assert_true(daemon_alive(d));
    assert_int_equal(gw_ctl_create(d->grpc, token, &c), RI_OK);
    assert_int_equal(gw_ctl_create_session(c, 5000, &geo, 64, "probe", &s, &err), RI_OK);
    assert_int_equal(gw_dp_connect(s.dataplane_address, s.session_id, s.secret, NULL, &dp), RI_OK);
    assert_int_equal(gw_dp_ping(dp), RI_OK);
    gw_dp_close(dp);
    assert_int_equal(gw_ctl_drop_session(c, 5000, s.session_id, NULL, &err), RI_OK);
    gw_ctl_destroy(c);
}

static void assert_serving(kvs_test_daemon_t *d)
{
    assert_serving_as(d, NULL);
}

static void test_raw_bytes_on_every_port(void **state)
{
    (void)state;
    kvs_test_daemon_t d;
    unsigned ports[MAX_PORTS];
    static uint8_t junk[65536];
    uint8_t ff[17], zero[64] = {0};
    start_daemon(&d);
    int n = listening_ports(d.pid, ports, MAX_PORTS);
    printf("# the daemon listens on %d TCP port(s)\n", n);
    assert_true(n >= 2); /* gRPC, metrics (and UCX's own TCP interface) */
    memset(ff, 0xff, sizeof(ff));
    srand((unsigned)time(NULL));
    for (size_t i = 0; i < sizeof(junk); i++)
        junk[i] = (uint8_t)rand();
    for (int i = 0; i < n; i++) {
        send_raw(ports[i], ff, sizeof(ff));
        send_raw(ports[i], zero, 17);
        send_raw(ports[i], zero, sizeof(zero));
        send_raw(ports[i], junk, sizeof(junk));
        if (!daemon_alive(&d))
            fail_msg("raw bytes to port %u took the daemon down", ports[i]);
    }
    usleep(300 * 1000);
    if (!daemon_alive(&d))
        fail_msg("raw bytes to the daemon's ports took it down");
    assert_serving(&d);
    assert_int_equal(kvs_test_daemon_stop(&d, SIGTERM, 10000), 0);
    kvs_test_daemon_cleanup(&d);
}

/* A daemon, a control client and one session on it. */
static void start_with_session(kvs_test_daemon_t *d, gw_ctl_t **c_p, gw_ctl_session_t *s)
{
    gw_ctl_error_t err;
    start_daemon(d);
    assert_int_equal(gw_ctl_create(d->grpc, NULL, c_p), RI_OK);
    assert_int_equal(gw_ctl_create_session(*c_p, 5000, &geo, 64, "s", s, &err), RI_OK);
}

/* Undo start_with_session: the daemon must stop cleanly. */
static void stop_with_session(kvs_test_daemon_t *d, gw_ctl_t *c)
{
    gw_ctl_destroy(c);
    assert_int_equal(kvs_test_daemon_stop(d, SIGTERM, 10000), 0);
    kvs_test_daemon_cleanup(d);
}

static void test_wrong_secret_gets_no_connection(void **state)
{
    (void)state;
    kvs_test_daemon_t d;
    gw_ctl_t *c = NULL;
    gw_ctl_session_t s;
    gw_dp_t *dp = NULL;
    gw_dp_options_t o = {.timeout_ms = 1500};
    start_with_session(&d, &c, &s);
    s.secret[3] ^= 0x40;
    assert_int_equal(gw_dp_connect(s.dataplane_address, s.session_id, s.secret, &o, &dp), RI_ERR_TIMEOUT);
    assert_null(dp);
    s.secret[3] ^= 0x40;
    assert_int_equal(gw_dp_connect(s.dataplane_address, s.session_id, s.secret, &o, &dp), RI_OK);
    gw_dp_close(dp);
    /* an address that is not the kvstore's form is refused by the client */
    assert_int_equal(gw_dp_connect("127.0.0.1:7071", s.session_id, s.secret, &o, &dp), RI_ERR_INVALID);
    stop_with_session(&d, c);
}

/* Mappings of UCX shared-memory segments in this process (SysV, /dev/shm). */
static int ucx_shm_mappings(void)
{
    char line[1024];
    int n = 0;
    FILE *f = fopen("/proc/self/maps", "r");
    assert_non_null(f);
    while (fgets(line, sizeof(line), f) != NULL)
        n += strstr(line, "/dev/shm/ucx") != NULL || strstr(line, "/SYSV") != NULL;
    fclose(f);
    return n;
}

/* The client leaves UCX's shared-memory transports out as the kvstore does:
 * they could never carry the connection, and each connection's UCX worker
 * would otherwise map a SysV segment and a /dev/shm file for them (3 MiB of
 * the machine's shared memory a connection). */
static void test_client_maps_no_shared_memory(void **state)
{
    (void)state;
    kvs_test_daemon_t d;
    gw_ctl_t *c = NULL;
    gw_ctl_session_t s;
    gw_dp_t *dp[2] = {NULL, NULL};
    gw_dp_options_t o = {.timeout_ms = 5000};
    char tls[256];
    start_with_session(&d, &c, &s);
    int before = ucx_shm_mappings();
    for (int i = 0; i < 2; i++)
        assert_int_equal(gw_dp_connect(s.dataplane_address, s.session_id, s.secret, &o, &dp[i]), RI_OK);
    assert_int_equal(gw_dp_ping(dp[1]), RI_OK);
    assert_int_equal(ucx_shm_mappings(), before);
    for (int i = 0; i < 2; i++)
        gw_dp_close(dp[i]);
    stop_with_session(&d, c);
    /* what the filter makes of the UCX_TLS values users set */
    cm_ucx_tls_no_shm(NULL, tls, sizeof(tls));
    assert_string_equal(tls, "^sm");
    cm_ucx_tls_no_shm("all", tls, sizeof(tls));
    assert_string_equal(tls, "^sm");
    cm_ucx_tls_no_shm("^ib", tls, sizeof(tls));
    assert_string_equal(tls, "^ib,sm");
    cm_ucx_tls_no_shm("sm,self,tcp", tls, sizeof(tls));
    assert_string_equal(tls, "self,tcp");
    cm_ucx_tls_no_shm("posix,sysv,self", tls, sizeof(tls));
    assert_string_equal(tls, "self,tcp");
    cm_ucx_tls_no_shm("rc,cma", tls, sizeof(tls));
    assert_string_equal(tls, "rc");
}

/* A worker that gives up on a kvstore too slow to answer its CONNECT (here:
 * deadlines of 1-6 ms) closes its side while the kvstore has not yet run
 * UCX's wireup for it.  UCX 1.13 aborts a process whose wireup reply is
 * still queued on a TCP endpoint that then fails, so the client keeps its
 * UCX worker alive a while after giving up (gw_dp_close retires it), and the
 * kvstore finishes the wireup against a live peer and keeps serving. */
static void test_client_gives_up_on_stalled_daemon(void **state)
{
    (void)state;
    kvs_test_daemon_t d;
    gw_ctl_t *c = NULL;
    gw_ctl_error_t err;
    gw_ctl_session_t s;
    gw_dp_t *dp = NULL;
    gw_dp_options_t quick = {.timeout_ms = 1000}, patient = {.timeout_ms = 10000};
    start_with_session(&d, &c, &s);
    for (int round = 0; round < 60; round++) {
        quick.timeout_ms = 1 + round % 6;
        ri_status_t st = gw_dp_connect(s.dataplane_address, s.session_id, s.secret, &quick, &dp);
        if (st == RI_OK)
            gw_dp_close(dp);
        dp = NULL;
        if (!daemon_alive(&d))
            fail_msg("the kvstore died after a connect given up after %u ms (round %d)", quick.timeout_ms, round);
    }
    usleep(500 * 1000);
    assert_true(daemon_alive(&d));
    /* a new session: connections the kvstore accepted late count against
     * the old one's cap until the reaper closes them */
    assert_int_equal(gw_ctl_create_session(c, 5000, &geo, 64, "s2", &s, &err), RI_OK);
    assert_int_equal(gw_dp_connect(s.dataplane_address, s.session_id, s.secret, &patient, &dp), RI_OK);
    assert_int_equal(gw_dp_ping(dp), RI_OK);
    gw_dp_close(dp);
    assert_true(daemon_alive(&d));
    stop_with_session(&d, c);
}

static void test_malformed_addresses_refused(void **state)
{
    (void)state;
    enum { PROBES = 12, ALEN = 215 };
    kvs_test_daemon_t d;
    gw_ctl_t *c = NULL;
    gw_ctl_error_t err;
    gw_ctl_session_t s;
    gw_dp_t *dp = NULL;
    cm_wire_hdr_t h, rep;
    uint8_t hb[CM_WIRE_HDR_SIZE], addr[ALEN];
    int refused = 0;
    if (g_no_check)
        setenv("RI_ADDRCHECK_PROGRAM", "/bin/true", 1);
    start_daemon(&d);
    unsetenv("RI_ADDRCHECK_PROGRAM");
    assert_int_equal(gw_ctl_create(d.grpc, NULL, &c), RI_OK);
    assert_int_equal(gw_ctl_create_session(c, 5000, &geo, 64, "s", &s, &err), RI_OK);
    assert_int_equal(gw_dp_connect(s.dataplane_address, s.session_id, s.secret, NULL, &dp), RI_OK);
    srand(12345);
    for (int i = 0; i < PROBES; i++) {
        for (int j = 0; j < ALEN; j++)
            addr[j] = (uint8_t)rand();
        gw_dp_header(dp, CM_WIRE_OP_CONNECT, ALEN, 0, &h);
        cm_wire_encode(&h, hb);
        ri_status_t st = gw_dp_raw(dp, hb, sizeof(hb), addr, ALEN, 4000, &rep);
        /* over TCP a dying daemon resets the connection before it is reaped:
         * give it a moment to show as dead before judging */
        bool alive = daemon_alive(&d);
        for (int w = 0; st != RI_OK && alive && w < 100; w++) {
            usleep(10000);
            alive = daemon_alive(&d);
        }
        if (!alive)
            fail_msg("a CONNECT with a malformed UCX address (probe %d) took the daemon down", i);
        assert_int_equal(st, RI_OK); /* answered over the connection we already have */
        if (rep.status != RI_OK)
            refused++;
    }
    printf("# %d of %d CONNECTs with random addresses refused\n", refused, PROBES);
    assert_int_equal(refused, PROBES);
    assert_int_equal(gw_dp_ping(dp), RI_OK);
    gw_dp_close(dp);
    assert_serving(&d);
    gw_ctl_destroy(c);
    assert_int_equal(kvs_test_daemon_stop(&d, SIGTERM, 10000), 0);
    kvs_test_daemon_cleanup(&d);
}

static void test_connections_per_session_capped(void **state)
{
    (void)state;
    enum { CAP = 16 };
    kvs_test_daemon_t d;
    gw_ctl_t *c = NULL;
    gw_ctl_error_t err;
    gw_ctl_session_t s;
    gw_dp_t *dp[CAP + 1] = {0};
    gw_dp_options_t o = {.timeout_ms = 1500};
    start_daemon(&d);
    assert_int_equal(gw_ctl_create(d.grpc, NULL, &c), RI_OK);
    assert_int_equal(gw_ctl_create_session(c, 5000, &geo, 64, "s", &s, &err), RI_OK);
    for (int i = 0; i < CAP; i++)
        assert_int_equal(gw_dp_connect(s.dataplane_address, s.session_id, s.secret, NULL, &dp[i]), RI_OK);
    assert_int_equal(gw_dp_connect(s.dataplane_address, s.session_id, s.secret, &o, &dp[CAP]), RI_ERR_TIMEOUT);
    /* one closes (the daemon sees its endpoint fail), then another fits */
    gw_dp_close(dp[0]);
    dp[0] = NULL;
    ri_status_t st = RI_ERR_TIMEOUT;
    for (int t = 0; t < 20 && st != RI_OK; t++) {
        st = gw_dp_connect(s.dataplane_address, s.session_id, s.secret, &o, &dp[0]);
        if (st != RI_OK)
            usleep(500 * 1000);
    }
    assert_int_equal(st, RI_OK);
    for (int i = 0; i <= CAP; i++)
        gw_dp_close(dp[i]);
    gw_ctl_destroy(c);
    assert_int_equal(kvs_test_daemon_stop(&d, SIGTERM, 10000), 0);
    kvs_test_daemon_cleanup(&d);
}

/* Threads of pid whose nice value is nice (field 19 of /proc/PID/task/TID/stat). */
static int threads_at_nice(pid_t pid, long nice)
{
    char path[320], buf[1024];
    int n = 0;
    snprintf(path, sizeof(path), "/proc/%d/task", (int)pid);
    DIR *dir = opendir(path);
    struct dirent *e;
    if (dir == NULL)
        return -1;
    while ((e = readdir(dir)) != NULL) {
        if (e->d_name[0] == '.')
            continue;
        snprintf(path, sizeof(path), "/proc/%d/task/%s/stat", (int)pid, e->d_name);
        FILE *f = fopen(path, "r");
        if (f == NULL)
            continue;
        size_t len = fread(buf, 1, sizeof(buf) - 1, f);
        fclose(f);
        buf[len] = '\0';
        char *p = strrchr(buf, ')'); /* the name may hold spaces */
        long v = 0;
        /* after ")": state(3) ppid pgrp session tty tpgid flags minflt cminflt majflt cmajflt utime stime
         * cutime cstime priority(18) nice(19) */
        if (p != NULL && sscanf(p + 2, "%*c %*d %*d %*d %*d %*d %*u %*u %*u %*u %*u %*u %*u %*d %*d %*d %ld", &v) == 1 &&
            v == nice)
            n++;
    }
    closedir(dir);
    return n;
}

static void test_lanes_nice(void **state)
{
    (void)state;
    kvs_test_daemon_t d;
    start_daemon(&d);
    int n = threads_at_nice(d.pid, -10);
    printf("# %d thread(s) of the daemon at nice -10 (euid %d)\n", n, (int)geteuid());
    if (geteuid() == 0)
        assert_int_equal(n, 2); /* the two data-plane lanes, nothing else */
    else
        assert_int_equal(n, 0); /* not allowed: the daemon warns and goes on */
    assert_serving(&d);
    assert_int_equal(kvs_test_daemon_stop(&d, SIGTERM, 10000), 0);
    kvs_test_daemon_cleanup(&d);
}

#define STALL_BYTES (128u << 20)

/* The stalled sender, run as "THIS stall ADDR SESSION SECRETHEX": connect,
 * start a 128 MiB upload, move ~10 ms of it, say "sent", stop itself. */
static int stall_main(const char *addr, const char *sid, const char *hex)
{
    uint8_t secret[CM_WIRE_SECRET_SIZE], hb[CM_WIRE_HDR_SIZE];
    cm_wire_hdr_t h;
    gw_dp_t *dp = NULL;
    uint8_t *body = malloc(STALL_BYTES);
    for (unsigned i = 0; i < CM_WIRE_SECRET_SIZE; i++) {
        unsigned v = 0;
        if (sscanf(hex + 2 * i, "%2x", &v) != 1)
            return 2;
        secret[i] = (uint8_t)v;
    }
    if (body == NULL || gw_dp_connect(addr, strtoull(sid, NULL, 10), secret, NULL, &dp) != RI_OK)
        return 2;
    memset(body, 0x5a, STALL_BYTES);
    gw_dp_header(dp, CM_WIRE_OP_UPLOAD_CLUSTERS, 0, STALL_BYTES, &h);
    cm_wire_encode(&h, hb);
    if (gw_dp_raw_start(dp, hb, sizeof(hb), body, STALL_BYTES, 10) != RI_OK)
        return 2;
    printf("sent\n");
    fflush(stdout);
    raise(SIGSTOP);
    return 0;
}

static pid_t g_staller; /* killed by the teardown when a check failed */

static int kill_staller(void **state)
{
    (void)state;
    if (g_staller > 0) {
        kill(g_staller, SIGKILL);
        waitpid(g_staller, NULL, 0);
        g_staller = 0;
    }
    unsetenv("UCX_TLS");
    return 0;
}

static pid_t spawn_staller(const gw_ctl_session_t *s, FILE **out_p)
{
    char sid[32], hex[2 * CM_WIRE_SECRET_SIZE + 1];
    int fds[2];
    pid_t pid;
    snprintf(sid, sizeof(sid), "%llu", (unsigned long long)s->session_id);
    for (unsigned i = 0; i < CM_WIRE_SECRET_SIZE; i++)
        snprintf(hex + 2 * i, 3, "%02x", s->secret[i]);
    assert_int_equal(pipe(fds), 0);
    pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) {
        int null = open("/dev/null", O_WRONLY);
        dup2(fds[1], 1);
        dup2(null, 2); /* a stopped child must not hold the test's stderr open */
        close(fds[0]);
        close(fds[1]);
        execl("/proc/self/exe", "test_kvs_ctl_dpconnect", "stall", s->dataplane_address, sid, hex, (char *)NULL);
        _exit(127);
    }
    close(fds[1]);
    *out_p = fdopen(fds[0], "r");
    return pid;
}

/* The value of the metric line "name value" (name with its labels) in the
 * daemon's /metrics page, or -1. */
static long long daemon_metric(const kvs_test_daemon_t *d, const char *name)
{
    static char page[1 << 17];
    size_t n = strlen(name);
    if (kvs_test_http_get(d->metrics, "/metrics", page, sizeof(page)) != 200)
        return -1;
    for (const char *p = page; (p = strstr(p, name)) != NULL; p += n)
        if ((p == page || p[-1] == '\n') && p[n] == ' ')
            return atoll(p + n + 1);
    return -1;
}

/* VmRSS of a process, KiB (-1 when unknown). */
static long rss_kib(pid_t pid)
{
    char path[64], line[256];
    long kib = -1;
    snprintf(path, sizeof(path), "/proc/%d/status", (int)pid);
    FILE *f = fopen(path, "r");
    if (f == NULL)
        return -1;
    while (fgets(line, sizeof(line), f) != NULL)
        if (sscanf(line, "VmRSS: %ld", &kib) == 1)
            break;
    fclose(f);
    return kib;
}

#define TOK_STALLER "staller-token-0123456789"
#define TOK_BYSTANDER "bystander-token-0123456789"

/* A sender that stops in the middle of a 128 MiB upload on the only
 * data-plane thread must not hold up another client there.  tokens: the
 * daemon authenticates with a tokens file, the staller and the bystander are
 * two tenants, each with its own token; the staller's header carries its
 * session's secret, so it passes every check the daemon makes before it
 * takes a body in (no auth error is counted).  This case passes on the code
 * it was added to (a coverage gap, not a bug): the lane serves the
 * bystander while the authenticated body hangs.  When the stalled body is
 * cut off is test_stalled_upload_cut_off_at_deadline's business. */
static void stalled_sender_case(bool tokens)
{
    char path[600], flag[700];
    const char *one_thread[] = {"--dataplane-threads=1", NULL, NULL};
    kvs_test_daemon_t d;
    gw_ctl_t *c = NULL, *cb = NULL;
    gw_ctl_error_t err;
    gw_ctl_session_t a, b;
    gw_dp_t *dp = NULL;
    char line[64] = "";
    FILE *out = NULL;
    int wst = 0;
    double worst = 0;
    /* TCP: the stalled sender's body then needs its own progress to move */
    setenv("UCX_TLS", "tcp,self", 1);
    assert_int_equal(kvs_test_daemon_prepare(&d), 0);
    if (tokens) {
        assert_int_equal(kvs_test_daemon_write_file(&d, "tokens", TOK_STALLER " mallory\n" TOK_BYSTANDER " bob\n", path,
                                                    sizeof(path)),
                         0);
        snprintf(flag, sizeof(flag), "--tokens-file=%s", path);
        one_thread[1] = flag;
    }
    assert_int_equal(kvs_test_daemon_start(&d, one_thread, NULL), 0);
    assert_int_equal(gw_ctl_create(d.grpc, tokens ? TOK_STALLER : NULL, &c), RI_OK);
    assert_int_equal(gw_ctl_create(d.grpc, tokens ? TOK_BYSTANDER : NULL, &cb), RI_OK);
    assert_int_equal(gw_ctl_create_session(c, 5000, &geo, 64, "staller", &a, &err), RI_OK);
    assert_int_equal(gw_ctl_create_session(cb, 5000, &geo, 64, "bystander", &b, &err), RI_OK);
    pid_t pid = spawn_staller(&a, &out);
    g_staller = pid;
    /* UCX may print to stdout too: wait for our line */
    while (fgets(line, sizeof(line), out) != NULL && strcmp(line, "sent\n") != 0)
        ;
    assert_string_equal(line, "sent\n");
    assert_int_equal(waitpid(pid, &wst, WUNTRACED), pid);
    assert_true(WIFSTOPPED(wst));
    double t0 = now_s();
    assert_int_equal(gw_dp_connect(b.dataplane_address, b.session_id, b.secret, NULL, &dp), RI_OK);
    double t_conn = now_s() - t0;
    for (int i = 0; i < 20; i++) {
        double t = now_s();
        assert_int_equal(gw_dp_ping(dp), RI_OK);
        if (now_s() - t > worst)
            worst = now_s() - t;
    }
    printf("# a%s sender stopped mid-upload on the same thread: connect %.0f ms, worst of 20 pings %.1f ms\n",
           tokens ? "n authenticated (token + secret)" : "", t_conn * 1e3, worst * 1e3);
    if (t_conn > 2.0 || worst > 0.5)
        fail_msg("a stalled sender held up another client (connect %.2f s, worst ping %.2f s)", t_conn, worst);
    if (tokens) {
        /* it got past every check before a body is taken in: no auth error */
        assert_int_equal(daemon_metric(&d, "ri_kvs_dp_errors_total{kind=\"auth\"}"), 0);
        printf("# daemon RSS while the authenticated sender is stopped: %ld KiB\n", rss_kib(d.pid));
        assert_int_equal(gw_dp_ping(dp), RI_OK);
    }
    gw_dp_close(dp);
    kill_staller(NULL);
    fclose(out);
    assert_serving_as(&d, tokens ? TOK_BYSTANDER : NULL);
    gw_ctl_destroy(cb);
    gw_ctl_destroy(c);
    assert_int_equal(kvs_test_daemon_stop(&d, SIGTERM, 10000), 0);
    kvs_test_daemon_cleanup(&d);
    unsetenv("UCX_TLS");
}

#define STALL_DEADLINE_MS 1000
#define ERR_OTHER "ri_kvs_dp_errors_total{kind=\"other\"}"

#define DP_BYTES "ri_kvs_alloc_bytes{tag=\"kvs.dp\"}"

/* The daemon (one lane, two tenants, --drain-timeout-ms=deadline_ms) with
 * the staller's authenticated upload under way and the staller stopped;
 * the clients of both tenants in *c_p and *cb_p, the staller's stdout in
 * *out_p (the teardown kills the staller), the data plane's allocated bytes
 * before the staller came in *dp_bytes_p. */
static void start_stalled(kvs_test_daemon_t *d, int deadline_ms, gw_ctl_t **c_p, gw_ctl_t **cb_p, FILE **out_p,
                          long long *dp_bytes_p)
{
    char path[600], flag[700], deadline[64];
    const char *extra[] = {"--dataplane-threads=1", flag, deadline, NULL};
    gw_ctl_error_t err;
    gw_ctl_session_t a, b;
    char line[64] = "";
    int wst = 0;
    setenv("UCX_TLS", "tcp,self", 1);
    assert_int_equal(kvs_test_daemon_prepare(d), 0);
    assert_int_equal(kvs_test_daemon_write_file(d, "tokens", TOK_STALLER " mallory\n" TOK_BYSTANDER " bob\n", path,
                                                sizeof(path)),
                     0);
    snprintf(flag, sizeof(flag), "--tokens-file=%s", path);
    snprintf(deadline, sizeof(deadline), "--drain-timeout-ms=%d", deadline_ms);
    assert_int_equal(kvs_test_daemon_start(d, extra, NULL), 0);
    assert_int_equal(gw_ctl_create(d->grpc, TOK_STALLER, c_p), RI_OK);
    assert_int_equal(gw_ctl_create(d->grpc, TOK_BYSTANDER, cb_p), RI_OK);
    assert_int_equal(gw_ctl_create_session(*c_p, 5000, &geo, 64, "staller", &a, &err), RI_OK);
    assert_int_equal(gw_ctl_create_session(*cb_p, 5000, &geo, 64, "bystander", &b, &err), RI_OK);
    *dp_bytes_p = daemon_metric(d, DP_BYTES);
    pid_t pid = spawn_staller(&a, out_p);
    g_staller = pid;
    while (fgets(line, sizeof(line), *out_p) != NULL && strcmp(line, "sent\n") != 0)
        ;
    assert_string_equal(line, "sent\n");
    assert_int_equal(waitpid(pid, &wst, WUNTRACED), pid);
    assert_true(WIFSTOPPED(wst));
}

#define STALL_DEADLINE_MS 1000
#define ERR_OTHER "ri_kvs_dp_errors_total{kind=\"other\"}"

/* An authenticated sender stopped half way through a 128 MiB upload, with
 * --drain-timeout-ms=1000: its receive must end, and its 128 MiB receive
 * buffer be freed, within about twice that of the stop (the receive began
 * before it).  Watched from /metrics: the data plane's allocations
 * (ri_kvs_alloc_bytes{tag="kvs.dp"}, the buffer is most of them) and the
 * TIMEOUT counted as kind="other".  On the code it was added to this failed:
 * ucp_request_cancel does not cancel an AM rendezvous receive (UCX 1.13),
 * and the buffer stayed held until UCX's keepalive failed the stopped peer
 * (not within 3 s here, ~20 s in all).  The bystander is then served as
 * before, and so is the staller's tenant once the staller is gone. */
static void test_stalled_upload_cut_off_at_deadline(void **state)
{
    kvs_test_daemon_t d;
    gw_ctl_t *c = NULL, *cb = NULL;
    FILE *out = NULL;
    long long held = -1, base, other0, bytes = -1, other = -1;
    double t_freed = -1, t_counted = -1;
    (void)state;
    setenv("UCX_TLS", "tcp,self", 1);
    start_stalled(&d, STALL_DEADLINE_MS, &c, &cb, &out, &base);
    double t0 = now_s();
    other0 = daemon_metric(&d, ERR_OTHER);
    assert_true(base >= 0 && other0 >= 0);
    /* wait up to 3x the deadline for both; 20 ms steps */
    while (now_s() - t0 < 3.0 * STALL_DEADLINE_MS / 1e3 && (t_freed < 0 || t_counted < 0)) {
        bytes = daemon_metric(&d, DP_BYTES);
        other = daemon_metric(&d, ERR_OTHER);
        if (bytes > held)
            held = bytes;
        if (t_freed < 0 && held - base >= (long long)STALL_BYTES / 2 && bytes - base < (long long)STALL_BYTES / 2)
            t_freed = now_s() - t0;
        if (t_counted < 0 && other > other0)
            t_counted = now_s() - t0;
        usleep(20 * 1000);
    }
    printf("# stalled authenticated upload, drain-timeout-ms=%d: kvs.dp held %lld MiB at most, freed after %.2f s, "
           "kind=\"other\" counted after %.2f s (-1: not within %.1f s)\n", STALL_DEADLINE_MS,
           (held - base) >> 20, t_freed, t_counted, 3.0 * STALL_DEADLINE_MS / 1e3);
    assert_true(held - base >= (long long)STALL_BYTES / 2); /* the receive did start */
    if (t_freed < 0 || t_freed > 2.0 * STALL_DEADLINE_MS / 1e3)
        fail_msg("the stalled upload's buffer was not freed within 2x drain-timeout-ms (%.2f s)", t_freed);
    if (t_counted < 0 || t_counted > 2.0 * STALL_DEADLINE_MS / 1e3)
        fail_msg("the stalled upload was not counted as kind=\"other\" within 2x drain-timeout-ms (%.2f s)",
                 t_counted);
    assert_serving_as(&d, TOK_BYSTANDER);
    kill_staller(NULL);
    fclose(out);
    setenv("UCX_TLS", "tcp,self", 1);
    assert_serving_as(&d, TOK_STALLER);
    gw_ctl_destroy(cb);
    gw_ctl_destroy(c);
    assert_int_equal(kvs_test_daemon_stop(&d, SIGTERM, 10000), 0);
    kvs_test_daemon_cleanup(&d);
    unsetenv("UCX_TLS");
}

/* SIGTERM while that upload is stalled, long before its deadline (30 s):
 * the daemon ends the receive at once (its connection force-closed) and
 * exits 0, clean under ASan: the receive's request and buffer are released
 * in order.  Measured 0.3 s; the code before waited 1 s for a cancel that
 * never came and took 1.2 s, which the 2 s bound here does not tell apart
 * (kept loose for a shared machine): what this case guards is the exit. */
static void test_stalled_upload_at_shutdown(void **state)
{
    kvs_test_daemon_t d;
    gw_ctl_t *c = NULL, *cb = NULL;
    FILE *out = NULL;
    long long base;
    (void)state;
    start_stalled(&d, 30000, &c, &cb, &out, &base);
    for (int i = 0; i < 100 && daemon_metric(&d, DP_BYTES) - base < (long long)STALL_BYTES / 2; i++)
        usleep(20 * 1000);
    assert_true(daemon_metric(&d, DP_BYTES) - base >= (long long)STALL_BYTES / 2); /* the receive is under way */
    gw_ctl_destroy(cb);
    gw_ctl_destroy(c);
    double t0 = now_s();
    assert_int_equal(kvs_test_daemon_stop(&d, SIGTERM, 10000), 0);
    printf("# SIGTERM with a stalled upload: the daemon exited 0 after %.2f s\n", now_s() - t0);
    assert_true(now_s() - t0 < 2.0);
    kill_staller(NULL);
    fclose(out);
    kvs_test_daemon_cleanup(&d);
}

static void test_stalled_sender_blocks_nobody(void **state)
{
    (void)state;
    stalled_sender_case(false);
}

static void test_stalled_authenticated_sender_blocks_nobody(void **state)
{
    (void)state;
    stalled_sender_case(true);
}

int main(int argc, char **argv)
{
    const struct CMUnitTest all[] = {
        cmocka_unit_test(test_raw_bytes_on_every_port),
        cmocka_unit_test(test_wrong_secret_gets_no_connection),
        cmocka_unit_test(test_client_maps_no_shared_memory),
        cmocka_unit_test(test_client_gives_up_on_stalled_daemon),
        cmocka_unit_test(test_malformed_addresses_refused),
        cmocka_unit_test(test_connections_per_session_capped),
        cmocka_unit_test_teardown(test_stalled_sender_blocks_nobody, kill_staller),
        cmocka_unit_test_teardown(test_stalled_authenticated_sender_blocks_nobody, kill_staller),
        cmocka_unit_test_teardown(test_stalled_upload_cut_off_at_deadline, kill_staller),
        cmocka_unit_test_teardown(test_stalled_upload_at_shutdown, kill_staller),
        cmocka_unit_test(test_lanes_nice),
    };
    const struct CMUnitTest mutant[] = {
        cmocka_unit_test(test_malformed_addresses_refused),
    };
    char bin[512];
    if (argc == 5 && strcmp(argv[1], "stall") == 0)
        return stall_main(argv[2], argv[3], argv[4]);
    if (access(kvs_test_bin("ri-kvstore", bin, sizeof(bin)), X_OK) != 0)
        return 77;
    signal(SIGPIPE, SIG_IGN);
    if (getenv("RI_TEST_FILTER") != NULL) /* one case by name (cmocka's glob) */
        cmocka_set_test_filter(getenv("RI_TEST_FILTER"));
    if (argc > 1 && strcmp(argv[1], "no-check") == 0) {
        g_no_check = true;
        return cmocka_run_group_tests(mutant, NULL, NULL);
    }
    return cmocka_run_group_tests(all, NULL, NULL);
}
