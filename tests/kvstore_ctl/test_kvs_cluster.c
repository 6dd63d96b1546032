/*
 * ri-kvstore as a cluster member (docs/kvstore.md "Cluster membership"):
 * the real daemon against a real etcd (tests/common/etcd_spawn.h) on
 * loopback, the directory read back with cm_etcd / cm_cluster as a worker
 * would read it.  Exits 77 when etcd is not installed; the prefix records
 * case is skipped within when the data plane (UCX) cannot run here.
 */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <inttypes.h>
#include <netinet/in.h>
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include <cmocka.h>

#include "common/cm_cluster.h"
#include "common/cm_crc32c.h"
#include "common/cm_dp_prefix.h"
#include "common/cm_etcd.h"
#include "common/cm_status.h"
#include "gpuworker/client/gw_ctl.h"
#include "gpuworker/client/gw_dp.h"
#include "tests/common/etcd_spawn.h"
#include "tests/kvstore_ctl/kvs_test_daemon.h"

#define CLUSTER  "kvs-test"
#define LEASE_MS 2000
#define PT       8u
#define DIM      16u

static etcd_spawn_t g_etcd;
static char g_url[96]; /* "etcd://127.0.0.1:PORT" */
static char g_cluster_flag[128];
static cm_etcd_t *g_e; /* the test's own client, to read the directory */

static long long now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (long long)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

static uint64_t unix_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (uint64_t)ts.tv_sec * 1000u + (uint64_t)ts.tv_nsec / 1000000u;
}

/* --- the directory, as a worker reads it ------------------------------------ */

/* The node record of name: RI_OK (*n filled) or RI_ERR_NOT_FOUND. */
static ri_status_t node_get(const char *name, cm_cluster_node_t *n)
{
    char key[256];
    cm_etcd_kv_t kv;
    snprintf(key, sizeof(key), "/ri/%s/nodes/%s", CLUSTER, name);
    ri_status_t st = cm_etcd_get(g_e, key, &kv);
    if (st != RI_OK)
        return st;
    cm_cluster_node_t tmp;
    memset(&tmp, 0, sizeof(tmp));
    st = cm_cluster_node_from_json(kv.val, kv.len, &tmp);
    cm_etcd_kv_free(&kv);
    if (st == RI_OK && n != NULL)
        *n = tmp;
    return st;
}

/* Wait up to timeout_ms for the record of name to be there (present) or gone;
 * the ms it took, or -1. */
static long long node_wait(const char *name, bool present, int timeout_ms, cm_cluster_node_t *n)
{
    long long t0 = now_ms();
    do {
        ri_status_t st = node_get(name, n);
        if (present ? st == RI_OK : st == RI_ERR_NOT_FOUND)
            return now_ms() - t0;
        usleep(50 * 1000);
    } while (now_ms() - t0 < timeout_ms);
    return -1;
}

/* How many prefix records name key (of any node). */
static size_t prefix_holders(const uint8_t key[32])
{
    char prefix[256];
    int n = snprintf(prefix, sizeof(prefix), "/ri/%s/prefix/", CLUSTER);
    for (int i = 0; i < 32; i++)
        n += snprintf(prefix + n, sizeof(prefix) - (size_t)n, "%02x", key[i]);
    snprintf(prefix + n, sizeof(prefix) - (size_t)n, "/");
    cm_etcd_list_t l;
    memset(&l, 0, sizeof(l));
    assert_int_equal(cm_etcd_list(g_e, prefix, 0, &l), RI_OK);
    size_t count = l.n;
    cm_etcd_list_free(&l);
    return count;
}

static bool prefix_wait(const uint8_t key[32], size_t want, int timeout_ms)
{
    long long t0 = now_ms();
    do {
        if (prefix_holders(key) == want)
            return true;
        usleep(50 * 1000);
    } while (now_ms() - t0 < timeout_ms);
    return false;
}

/* --- the daemon --------------------------------------------------------------- */

/* Start a member named name with up to three more flags (NULL ends). */
static void node_start(kvs_test_daemon_t *d, const char *name, const char *f1, const char *f2, const char *f3)
{
    char nflag[128];
    snprintf(nflag, sizeof(nflag), "--node-name=%s", name);
    const char *extra[] = {
        g_cluster_flag, "--cluster-name=" CLUSTER, nflag, "--cluster-lease-ms=2000", f1, f2, f3, NULL
    };
    int ex = -1;
    int rc = kvs_test_daemon_start(d, extra, &ex);
    if (rc != 0)
        fail_msg("ri-kvstore %s did not start (rc %d, exit %d)", name, rc, ex);
}

/* Run ri-kvstore to its end with the test flags plus f1..f3; its exit status,
 * output in out. */
static int run_kvstore(char *out, size_t len, int timeout_ms, const char *f1, const char *f2, const char *f3)
{
    char bin[512];
    kvs_test_bin("ri-kvstore", bin, sizeof(bin));
    const char *argv[] = { bin,
                           "--listen=127.0.0.1:0",
                           "--dataplane-listen=127.0.0.1:0",
                           "--metrics-listen=off",
                           "--memory=64MiB",
                           "--no-hugepages",
                           "--cluster-name=" CLUSTER,
                           "--cluster-lease-ms=2000",
                           f1,
                           f2,
                           f3,
                           NULL };
    return kvs_test_run(argv, out, len, timeout_ms);
}

/* The value of a metric line "name value" on the daemon's /metrics page. */
static double metric(const kvs_test_daemon_t *d, const char *name)
{
    static char page[1 << 17];
    char pat[128];
    assert_int_equal(kvs_test_http_get(d->metrics, "/metrics", page, sizeof(page)), 200);
    snprintf(pat, sizeof(pat), "\n%s ", name);
    const char *p = strstr(page, pat);
    if (p == NULL)
        fail_msg("no metric %s", name);
    return strtod(p + strlen(pat), NULL);
}

static ri_status_t create_session(const kvs_test_daemon_t *d, uint64_t tokens, gw_ctl_session_t *s, gw_ctl_error_t *err)
{
    gw_ctl_t *ctl = NULL;
    gw_ctl_geometry_t g = { .layers = 1, .kv_heads = 1, .head_dim = DIM, .dtype = 1, .page_tokens = PT };
    ri_status_t st = gw_ctl_create(d->grpc, NULL, &ctl);
    if (st == RI_OK)
        st = gw_ctl_create_session(ctl, 5000, &g, tokens, "cluster-test", s, err);
    gw_ctl_destroy(ctl);
    return st;
}

/* --- cases ---------------------------------------------------------------------- */

/* Bad cluster settings: exit 2 naming the setting; nothing starts. */
static void test_bad_flags(void **state)
{
    static const struct {
        const char *flag, *names;
    } cases[] = {
        { "--cluster=etcd://no-port", "cluster" },
        { "--cluster=etcd://127.0.0.1:2379,,", "cluster" },
        { "--node-name=bad/name", "node-name" },
        { "--cluster-host=bad host", "cluster-host" },
        { "--cluster-advertise=0.0.0.0:7070", "cluster-advertise" },
        { "--cluster-advertise=nohostport", "cluster-advertise" },
        { "--cluster-lease-ms=100", "cluster-lease-ms" },
    };
    char out[4096];
    (void)state;
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        const char *url = strncmp(cases[i].flag, "--cluster=", 10) == 0 ? cases[i].flag : g_cluster_flag;
        const char *flag = url == cases[i].flag ? NULL : cases[i].flag;
        int rc = run_kvstore(out, sizeof(out), 10000, url, flag, NULL);
        if (rc != 2 || strstr(out, cases[i].names) == NULL)
            fail_msg("%s: exit %d, output: %s", cases[i].flag, rc, out);
    }
    /* --cluster-name "" (checked only with --cluster) */
    int rc = run_kvstore(out, sizeof(out), 10000, g_cluster_flag, "--cluster-name=", NULL);
    if (rc != 2 || strstr(out, "cluster-name") == NULL)
        fail_msg("empty cluster-name: exit %d, output: %s", rc, out);
    /* from the environment, like every setting */
    setenv("RI_KVS_NODE_NAME", "bad/name", 1);
    rc = run_kvstore(out, sizeof(out), 10000, g_cluster_flag, NULL, NULL);
    unsetenv("RI_KVS_NODE_NAME");
    if (rc != 2 || strstr(out, "node-name 'bad/name'") == NULL)
        fail_msg("RI_KVS_NODE_NAME=bad/name: exit %d, output: %s", rc, out);
}

/* etcd not there at start: retried for one lease, then exit 1 saying so. */
static void test_unreachable_at_start(void **state)
{
    char out[4096], flag[96];
    (void)state;
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in sa = { .sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK) };
    socklen_t sl = sizeof(sa);
    assert_int_equal(bind(fd, (struct sockaddr *)&sa, sizeof(sa)), 0);
    assert_int_equal(getsockname(fd, (struct sockaddr *)&sa, &sl), 0);
    snprintf(flag, sizeof(flag), "--cluster=etcd://127.0.0.1:%u", (unsigned)ntohs(sa.sin_port));
    close(fd); /* nobody listens there now */
    long long t0 = now_ms();
    int rc = run_kvstore(out, sizeof(out), 20000, flag, "--node-name=lonely", NULL);
    long long took = now_ms() - t0;
    if (rc != 1 || strstr(out, "did not answer") == NULL)
        fail_msg("exit %d after %lld ms, output: %s", rc, took, out);
    printf("etcd unreachable at start: exit 1 after %lld ms (lease %d ms)\n", took, LEASE_MS);
    assert_true(took >= LEASE_MS - 100);
    assert_true(took < LEASE_MS + 8000);
}

/* The record and its fields; figures follow CreateSession; a refusal over
 * the pool names the node; a second daemon of the name is refused; Drain is
 * published; SIGTERM removes the record at once. */
static void test_register_fields_sigterm(void **state)
{
    kvs_test_daemon_t d = { 0 };
    cm_cluster_node_t n;
    gw_ctl_session_t s;
    gw_ctl_error_t err = { 0 };
    char out[4096];
    (void)state;

    uint64_t t0 = unix_ms();
    node_start(&d, "n1", "--cluster-host=host-a", NULL, NULL);
    uint64_t t1 = unix_ms();
    assert_true(node_wait("n1", true, 2000, &n) >= 0);
    assert_string_equal(n.name, "n1");
    assert_string_equal(n.addr, d.grpc);
    assert_string_equal(n.host, "host-a");
    assert_int_equal(n.pool_total, 64u << 20);
    assert_int_equal(n.sessions, 0);
    assert_string_equal(n.tenants, "");
    assert_false(n.recovered);
    assert_false(n.draining);
    assert_true(n.epoch >= t0 && n.epoch <= t1);

    assert_int_equal(create_session(&d, 64, &s, &err), RI_OK);
    long long t = now_ms();
    while (node_get("n1", &n) == RI_OK && n.sessions != 1 && now_ms() - t < 4000)
        usleep(50 * 1000);
    assert_int_equal(n.sessions, 1);
    printf("figures published %lld ms after CreateSession\n", now_ms() - t);

    /* Over the pool: refused, nothing created, the message names the node. */
    ri_status_t st = create_session(&d, 1u << 24, &s, &err);
    assert_int_equal(st, RI_ERR_QUOTA);
    if (strstr(err.message, "node n1") == NULL)
        fail_msg("the refusal does not name the node: %s", err.message);

    assert_int_equal((int)metric(&d, "ri_kvs_cluster_registered"), 1);
    assert_true(metric(&d, "ri_kvs_cluster_lease_renewals_total") >= 1);

    /* The same name again: refused while n1 lives. */
    char nflag[] = "--node-name=n1";
    int rc = run_kvstore(out, sizeof(out), 15000, g_cluster_flag, nflag, NULL);
    if (rc != 1 || strstr(out, "another ri-kvstore is registered as n1") == NULL)
        fail_msg("a second n1: exit %d, output: %s", rc, out);
    assert_int_equal(node_get("n1", &n), RI_OK); /* the first one is untouched */
    assert_string_equal(n.addr, d.grpc);

    /* Drain: published, so workers stop placing sessions here. */
    gw_ctl_t *ctl = NULL;
    assert_int_equal(gw_ctl_create(d.grpc, NULL, &ctl), RI_OK);
    assert_int_equal(gw_ctl_drain(ctl, 5000, NULL, &err), RI_OK);
    gw_ctl_destroy(ctl);
    t = now_ms();
    while (node_get("n1", &n) == RI_OK && !n.draining && now_ms() - t < 4000)
        usleep(50 * 1000);
    assert_true(n.draining);

    /* SIGTERM: the lease is revoked before anything else stops. */
    assert_int_equal(kvs_test_daemon_stop(&d, SIGTERM, 10000), 0);
    assert_int_equal(node_get("n1", NULL), RI_ERR_NOT_FOUND);
    kvs_test_daemon_cleanup(&d);
}

/* Default names: the bound address, or gethostname():port on a wildcard
 * listen; tenants from the tokens file, updated by SIGHUP. */
static void test_defaults_and_tenants(void **state)
{
    kvs_test_daemon_t d = { 0 }, w = { 0 };
    cm_cluster_node_t n;
    char tokens[600], tflag[700], host[256], want[320];
    unsigned port;
    (void)state;

    assert_int_equal(kvs_test_daemon_prepare(&d), 0);
    assert_int_equal(kvs_test_daemon_write_file(&d, "tokens", "token-aaa alice\ntoken-bbb bob\ntoken-aa2 alice\n",
                                                tokens, sizeof(tokens)),
                     0);
    snprintf(tflag, sizeof(tflag), "--tokens-file=%s", tokens);
    const char *extra[] = { g_cluster_flag, "--cluster-name=" CLUSTER, tflag, NULL };
    assert_int_equal(kvs_test_daemon_start(&d, extra, NULL), 0);
    assert_true(node_wait(d.grpc, true, 2000, &n) >= 0); /* named after its address */
    assert_string_equal(n.addr, d.grpc);
    assert_string_equal(n.tenants, "alice,bob");
    assert_int_equal(
        kvs_test_daemon_write_file(&d, "tokens", "token-aaa alice\ntoken-ccc carol\n", tokens, sizeof(tokens)), 0);
    kill(d.pid, SIGHUP);
    long long t = now_ms();
    while (node_get(d.grpc, &n) == RI_OK && strcmp(n.tenants, "alice,carol") != 0 && now_ms() - t < 4000)
        usleep(50 * 1000);
    assert_string_equal(n.tenants, "alice,carol");
    assert_int_equal(kvs_test_daemon_stop(&d, SIGTERM, 10000), 0);
    kvs_test_daemon_cleanup(&d);

    /* A wildcard listen: others dial gethostname():port. */
    const char *wild[] = { g_cluster_flag, "--cluster-name=" CLUSTER, "--listen=0.0.0.0:0", "--insecure", NULL };
    assert_int_equal(kvs_test_daemon_start(&w, wild, NULL), 0);
    assert_int_equal(gethostname(host, sizeof(host)), 0);
    assert_true(sscanf(strrchr(w.grpc, ':') + 1, "%u", &port) == 1);
    snprintf(want, sizeof(want), "%s:%u", host, port);
    assert_true(node_wait(want, true, 2000, &n) >= 0);
    assert_string_equal(n.addr, want);
    assert_int_equal(kvs_test_daemon_stop(&w, SIGTERM, 10000), 0);
    kvs_test_daemon_cleanup(&w);
}

/* --- prefix blocks ---------------------------------------------------------- */

/* A one-table block (1 layer, 1 KV head) with one cluster of PT tokens. */
static uint8_t *make_block(uint32_t seed, uint64_t *len_p)
{
    uint64_t tables = cm_pfx_tables_bytes(1, 1), worker = 64, pages = 4u * PT * DIM;
    cm_pfx_hdr_t h = { .layers = 1,
                       .kv_heads = 1,
                       .head_dim = DIM,
                       .dtype = 1,
                       .page_tokens = PT,
                       .first_pos = 0,
                       .n_tokens = PT,
                       .tables_bytes = tables,
                       .worker_bytes = worker,
                       .pages_bytes = pages };
    uint64_t len = CM_PFX_HDR_SIZE + tables + worker + pages;
    uint8_t *buf = calloc(1, len);
    assert_non_null(buf);
    cm_dp_put32(buf + CM_PFX_HDR_SIZE, 1);      /* clusters of the table */
    cm_dp_put32(buf + CM_PFX_HDR_SIZE + 4, PT); /* its size */
    for (uint64_t i = 0; i < worker + pages; i++)
        buf[CM_PFX_HDR_SIZE + tables + i] = (uint8_t)(seed * 31u + i * 7u);
    h.crc = cm_crc32c(0, buf + CM_PFX_HDR_SIZE, len - CM_PFX_HDR_SIZE);
    cm_pfx_hdr_encode(buf, &h);
    *len_p = len;
    return buf;
}

static void key_of(uint8_t key[32], uint32_t n)
{
    memset(key, 0xa5, 32);
    cm_dp_put32(key, n);
}

/* Publish two blocks through the data plane; false when UCX cannot run here. */
static bool publish_two(const kvs_test_daemon_t *d, const uint8_t k1[32], const uint8_t k2[32])
{
    gw_ctl_session_t s;
    gw_ctl_error_t err = { 0 };
    gw_dp_t *dp = NULL;
    uint64_t len;
    uint32_t slot, flags;

    assert_int_equal(create_session(d, 64, &s, &err), RI_OK);
    if (gw_dp_connect(s.dataplane_address, s.session_id, s.secret, NULL, &dp) != RI_OK)
        return false;
    uint8_t *b1 = make_block(1, &len);
    assert_int_equal(gw_dp_prefix_put(dp, k1, b1, len, &slot, &flags), RI_OK);
    free(b1);
    uint8_t *b2 = make_block(2, &len);
    assert_int_equal(gw_dp_prefix_put(dp, k2, b2, len, &slot, &flags), RI_OK);
    free(b2);
    gw_dp_close(dp);
    gw_ctl_t *ctl = NULL;
    assert_int_equal(gw_ctl_create(d->grpc, NULL, &ctl), RI_OK);
    assert_int_equal(gw_ctl_drop_session(ctl, 5000, s.session_id, NULL, &err), RI_OK);
    gw_ctl_destroy(ctl);
    return true;
}

/* Prefix records follow publish and DropPrefix; a clean stop keeps the
 * blocks on disk and --recover publishes them again; kill -9 takes every
 * record within one lease; a restart with --recover registers again with
 * recovered and a new epoch. */
static void test_prefix_kill9_recover(void **state)
{
    kvs_test_daemon_t d = { 0 };
    cm_cluster_node_t n, before;
    gw_ctl_error_t err = { 0 };
    uint8_t k1[32], k2[32];
    char spill[600];
    (void)state;

    assert_int_equal(kvs_test_daemon_prepare(&d), 0);
    snprintf(spill, sizeof(spill), "--spill-dir=%s/spill", d.dir);
    node_start(&d, "n2", spill, NULL, NULL);
    assert_true(node_wait("n2", true, 2000, &before) >= 0);
    assert_false(before.recovered);
    key_of(k1, 1);
    key_of(k2, 2);
    if (!publish_two(&d, k1, k2)) {
        printf("prefix records: skipped (the data plane cannot connect here)\n");
    } else {
        assert_true(prefix_wait(k1, 1, 4000));
        assert_true(prefix_wait(k2, 1, 4000));
        assert_int_equal((int)metric(&d, "ri_kvs_cluster_prefix_records"), 2);
        gw_ctl_t *ctl = NULL;
        assert_int_equal(gw_ctl_create(d.grpc, NULL, &ctl), RI_OK);
        assert_int_equal(gw_ctl_drop_prefix(ctl, 5000, k2, NULL, NULL, NULL, &err), RI_OK);
        gw_ctl_destroy(ctl);
        assert_true(prefix_wait(k2, 0, 4000));
        assert_int_equal(prefix_holders(k1), 1);
        assert_int_equal((int)metric(&d, "ri_kvs_cluster_prefix_records"), 1);

        /* A clean stop writes k1 out; --recover finds it and publishes it. */
        assert_int_equal(kvs_test_daemon_stop(&d, SIGTERM, 10000), 0);
        assert_int_equal(prefix_holders(k1), 0);
        node_start(&d, "n2", spill, "--recover", NULL);
        assert_true(node_wait("n2", true, 2000, &n) >= 0);
        assert_true(n.recovered);
        assert_true(prefix_wait(k1, 1, 4000));
        assert_int_equal(prefix_holders(k2), 0);
    }

    /* kill -9: the lease runs out and every record of the node goes with it. */
    assert_true(node_get("n2", &before) == RI_OK);
    assert_int_equal(kvs_test_daemon_stop(&d, SIGKILL, 5000), 128 + SIGKILL);
    long long gone = node_wait("n2", false, LEASE_MS + 3000, NULL);
    printf("kill -9: the record went after %lld ms (lease %d ms)\n", gone, LEASE_MS);
    assert_true(gone >= 0);
    assert_true(gone <= LEASE_MS + 1000);
    assert_int_equal(prefix_holders(k1), 0);

    node_start(&d, "n2", spill, "--recover", NULL);
    assert_true(node_wait("n2", true, 2000, &n) >= 0);
    assert_true(n.recovered);
    assert_true(n.epoch > before.epoch);
    assert_int_equal(kvs_test_daemon_stop(&d, SIGTERM, 10000), 0);
    char cmd[700];
    snprintf(cmd, sizeof(cmd), "rm -rf '%s/spill'", d.dir); /* segment files are preallocated */
    if (system(cmd) != 0)
        fprintf(stderr, "could not remove %s/spill\n", d.dir);
    kvs_test_daemon_cleanup(&d);
}

/* etcd killed under a registered node: it serves on; once etcd is back the
 * node is registered again. */
static void test_etcd_outage(void **state)
{
    kvs_test_daemon_t d = { 0 };
    cm_cluster_node_t n, before;
    gw_ctl_session_t s;
    gw_ctl_error_t err = { 0 };
    gw_ctl_health_t h;
    (void)state;

    node_start(&d, "n3", NULL, NULL, NULL);
    assert_true(node_wait("n3", true, 2000, &before) >= 0);
    etcd_spawn_kill(&g_etcd);

    gw_ctl_t *ctl = NULL;
    assert_int_equal(gw_ctl_create(d.grpc, NULL, &ctl), RI_OK);
    long long t = now_ms();
    assert_int_equal(gw_ctl_health(ctl, 5000, &h, &err), RI_OK);
    assert_int_equal(create_session(&d, 64, &s, &err), RI_OK);
    assert_true(now_ms() - t < 2000); /* nothing waited on etcd */
    /* The member sees the outage (a renewal fails) and says so. */
    while (metric(&d, "ri_kvs_cluster_registered") != 0 && now_ms() - t < 3 * LEASE_MS)
        usleep(100 * 1000);
    assert_int_equal((int)metric(&d, "ri_kvs_cluster_registered"), 0);
    assert_true(metric(&d, "ri_kvs_cluster_errors_total") >= 1);
    assert_int_equal(gw_ctl_health(ctl, 5000, &h, &err), RI_OK);

    assert_int_equal(etcd_spawn_restart(&g_etcd), 0);
    t = now_ms();
    while (metric(&d, "ri_kvs_cluster_registered") != 1 && now_ms() - t < 15000)
        usleep(100 * 1000);
    printf("etcd back: registered again after %lld ms\n", now_ms() - t);
    assert_int_equal((int)metric(&d, "ri_kvs_cluster_registered"), 1);
    assert_true(node_wait("n3", true, 5000, &n) >= 0);
    assert_int_equal(n.epoch, before.epoch); /* the same process */
    t = now_ms();
    while (node_get("n3", &n) == RI_OK && n.sessions != 1 && now_ms() - t < 4000)
        usleep(50 * 1000);
    assert_int_equal(n.sessions, 1);
    assert_int_equal(gw_ctl_drop_session(ctl, 5000, s.session_id, NULL, &err), RI_OK);
    gw_ctl_destroy(ctl);
    assert_int_equal(kvs_test_daemon_stop(&d, SIGTERM, 10000), 0);
    assert_int_equal(node_get("n3", NULL), RI_ERR_NOT_FOUND);
    kvs_test_daemon_cleanup(&d);
}

int main(void)
{
    if (!etcd_spawn_available()) {
        printf("skip: %s is not installed\n", ETCD_SPAWN_BIN);
        return 77;
    }
    char bin[512];
    if (access(kvs_test_bin("ri-kvstore", bin, sizeof(bin)), X_OK) != 0) {
        printf("skip: %s not built\n", bin);
        return 77;
    }
    if (etcd_spawn_start(&g_etcd) != 0) {
        fprintf(stderr, "etcd did not start\n");
        return 1;
    }
    snprintf(g_url, sizeof(g_url), "etcd://%s", g_etcd.url);
    snprintf(g_cluster_flag, sizeof(g_cluster_flag), "--cluster=%s", g_url);
    if (cm_etcd_open(g_url, 2000, &g_e) != RI_OK) {
        etcd_spawn_stop(&g_etcd);
        return 1;
    }
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_bad_flags),
        cmocka_unit_test(test_unreachable_at_start),
        cmocka_unit_test(test_register_fields_sigterm),
        cmocka_unit_test(test_defaults_and_tenants),
        cmocka_unit_test(test_prefix_kill9_recover),
        cmocka_unit_test(test_etcd_outage),
    };
    int rc = cmocka_run_group_tests(tests, NULL, NULL);
    cm_etcd_close(g_e);
    etcd_spawn_stop(&g_etcd);
    return rc;
}
