/*
 * The cluster directory (cm_cluster.h) against a real etcd: registration
 * and its records, a name taken twice, a killed member gone within one
 * lease, a clean close gone at once, figures published at renewal, prefix
 * records, the observer's node watch (joins, leaves, stale while etcd is
 * down), session records under the observer's lease, and a member that
 * survives an etcd restart.  Exits 77 when etcd is not installed.
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
#include "common/cm_cluster.h"
#include "common/cm_etcd.h"
#include "tests/common/etcd_spawn.h"

#define LEASE_MS 2000

static etcd_spawn_t g_etcd;

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

static int group_setup(void **state)
{
    (void)state;
    return etcd_spawn_start(&g_etcd);
}

static int group_teardown(void **state)
{
    (void)state;
    etcd_spawn_stop(&g_etcd);
    return 0;
}

static cm_cluster_t *open_cluster(const char *name)
{
    char url[96];
    snprintf(url, sizeof(url), "etcd://%s", g_etcd.url);
    cm_cluster_t *c = NULL;
    assert_int_equal(cm_cluster_open(url, name, 800, &c), RI_OK);
    return c;
}

static cm_cluster_node_t make_node(const char *name, const char *host, uint64_t used)
{
    cm_cluster_node_t n;
    memset(&n, 0, sizeof(n));
    snprintf(n.name, sizeof(n.name), "%s", name);
    snprintf(n.addr, sizeof(n.addr), "127.0.0.1:%u", 50000u + (unsigned)strlen(name));
    snprintf(n.dataplane, sizeof(n.dataplane), "ucx:00ff");
    snprintf(n.host, sizeof(n.host), "%s", host);
    snprintf(n.tenants, sizeof(n.tenants), "alice,bob");
    n.pool_total = 1u << 30;
    n.pool_used = used;
    n.sessions = 3;
    n.epoch = 1764900000000ull;
    return n;
}

/* The node named name from a one-shot list of a fresh client, or false. */
static bool find_node(const char *cluster, const char *name, cm_cluster_node_t *out)
{
    cm_cluster_t *c = open_cluster(cluster);
    cm_cluster_node_t *nodes = NULL;
    size_t n = 0;
    bool stale = true, found = false;
    assert_int_equal(cm_cluster_nodes(c, &nodes, &n, &stale), RI_OK);
    assert_false(stale);
    for (size_t i = 0; i < n; i++) {
        if (strcmp(nodes[i].name, name) == 0) {
            if (out != NULL)
                *out = nodes[i];
            found = true;
        }
    }
    cm_free(nodes);
    cm_cluster_close(c);
    return found;
}

/* Poll find_node until it is `present`, at most timeout_s; the time it took or -1. */
static double wait_node(const char *cluster, const char *name, bool present, double timeout_s)
{
    double start = now_s();
    do {
        if (find_node(cluster, name, NULL) == present)
            return now_s() - start;
        usleep(50000);
    } while (now_s() - start < timeout_s);
    return -1;
}

static void test_register_record_and_exists(void **state)
{
    (void)state;
    cm_cluster_t *c = open_cluster("reg");
    cm_cluster_node_t self = make_node("kv-a", "host1", 1000);
    self.recovered = true;
    assert_int_equal(cm_cluster_register(c, &self, LEASE_MS), RI_OK);
    assert_true(cm_cluster_registered(c));
    cm_cluster_node_t got;
    assert_true(find_node("reg", "kv-a", &got));
    assert_string_equal(got.addr, self.addr);
    assert_string_equal(got.dataplane, "ucx:00ff");
    assert_string_equal(got.host, "host1");
    assert_string_equal(got.tenants, "alice,bob");
    assert_int_equal(got.pool_total, self.pool_total);
    assert_int_equal(got.pool_used, 1000);
    assert_int_equal(got.sessions, 3);
    assert_int_equal(got.epoch, self.epoch);
    assert_true(got.recovered);
    assert_false(find_node("other", "kv-a", NULL)); /* clusters apart */

    /* the same live name again: refused, the first record unchanged */
    cm_cluster_t *c2 = open_cluster("reg");
    cm_cluster_node_t twin = make_node("kv-a", "host2", 5);
    assert_int_equal(cm_cluster_register(c2, &twin, LEASE_MS), RI_ERR_EXISTS);
    assert_false(cm_cluster_registered(c2));
    assert_true(strlen(cm_etcd_last_error()) > 0);
    cm_cluster_close(c2);
    assert_true(find_node("reg", "kv-a", &got));
    assert_string_equal(got.host, "host1");

    /* bad input */
    cm_cluster_t *c3 = open_cluster("reg");
    cm_cluster_node_t bad = make_node("no/slash", "h", 0);
    assert_int_equal(cm_cluster_register(c3, &bad, LEASE_MS), RI_ERR_INVALID);
    bad = make_node("fine", "h", 0);
    assert_int_equal(cm_cluster_register(c3, &bad, 1000), RI_ERR_INVALID);
    bad.addr[0] = '\0';
    assert_int_equal(cm_cluster_register(c3, &bad, LEASE_MS), RI_ERR_INVALID);
    cm_cluster_close(c3);
    cm_cluster_t *x = NULL;
    assert_int_equal(cm_cluster_open("etcd://127.0.0.1:1", "bad name", 0, &x), RI_ERR_INVALID);
    assert_int_equal(cm_cluster_open("nonsense", "ok", 0, &x), RI_ERR_INVALID);
    assert_null(x);

    /* a clean close removes the record at once */
    cm_cluster_close(c);
    assert_false(find_node("reg", "kv-a", NULL));
    cm_cluster_close(NULL);
}

static void test_killed_member_disappears(void **state)
{
    (void)state;
    int pipefd[2];
    assert_int_equal(pipe(pipefd), 0);
    pid_t pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) {
        close(pipefd[0]);
        char url[96];
        snprintf(url, sizeof(url), "etcd://%s", g_etcd.url);
        cm_cluster_t *c = NULL;
        cm_cluster_node_t self = make_node("kv-doomed", "h", 0);
        char ok = (cm_cluster_open(url, "kill", 800, &c) == RI_OK && cm_cluster_register(c, &self, LEASE_MS) == RI_OK)
                      ? 'y'
                      : 'n';
        if (write(pipefd[1], &ok, 1) != 1)
            _exit(1);
        for (;;)
            pause();
    }
    close(pipefd[1]);
    char ok = 0;
    assert_int_equal(read(pipefd[0], &ok, 1), 1);
    close(pipefd[0]);
    assert_int_equal(ok, 'y');
    /* kept alive past its lease while the process lives */
    usleep(LEASE_MS * 1500);
    assert_true(find_node("kill", "kv-doomed", NULL));
    kill(pid, SIGKILL);
    waitpid(pid, NULL, 0);
    /* gone within one lease period (etcd checks expiry every 500 ms) */
    double t = wait_node("kill", "kv-doomed", false, LEASE_MS / 1000.0 + 1.5);
    assert_true(t >= 0);
    /* the name is free again */
    cm_cluster_t *c = open_cluster("kill");
    cm_cluster_node_t self = make_node("kv-doomed", "h", 0);
    assert_int_equal(cm_cluster_register(c, &self, LEASE_MS), RI_OK);
    cm_cluster_close(c);
}

static void test_update_and_prefix(void **state)
{
    (void)state;
    cm_cluster_t *c = open_cluster("upd");
    cm_cluster_node_t self = make_node("kv-u", "h", 100);
    uint8_t k1[32], k2[32];
    memset(k1, 0xab, sizeof(k1));
    memset(k2, 0x01, sizeof(k2));
    cm_cluster_prefix_add(c, k1); /* before registering: published with it */
    assert_int_equal(cm_cluster_register(c, &self, LEASE_MS), RI_OK);
    cm_cluster_prefix_add(c, k2);

    self.pool_used = 777;
    self.sessions = 9;
    snprintf(self.tenants, sizeof(self.tenants), "carol");
    cm_cluster_update(c, &self);
    double start = now_s();
    cm_cluster_node_t got;
    do {
        assert_true(find_node("upd", "kv-u", &got));
        if (got.pool_used == 777)
            break;
        usleep(50000);
    } while (now_s() - start < LEASE_MS / 1000.0);
    assert_int_equal(got.pool_used, 777);
    assert_int_equal(got.sessions, 9);
    assert_string_equal(got.tenants, "carol");

    cm_cluster_t *o = open_cluster("upd");
    char names[4][CM_CLUSTER_NAME_MAX];
    size_t n = 0;
    start = now_s();
    do {
        assert_int_equal(cm_cluster_prefix_holders(o, k2, names, 4, &n), RI_OK);
        usleep(20000);
    } while (n == 0 && now_s() - start < 2);
    assert_int_equal(n, 1);
    assert_string_equal(names[0], "kv-u");
    assert_int_equal(cm_cluster_prefix_holders(o, k1, names, 4, &n), RI_OK);
    assert_int_equal(n, 1);

    cm_cluster_prefix_del(c, k2);
    start = now_s();
    do {
        assert_int_equal(cm_cluster_prefix_holders(o, k2, names, 4, &n), RI_OK);
        usleep(20000);
    } while (n != 0 && now_s() - start < 2);
    assert_int_equal(n, 0);
    assert_int_equal(cm_cluster_prefix_holders(o, k1, NULL, 0, &n), RI_OK);
    assert_int_equal(n, 1); /* counted even without room for names */

    /* close revokes: the prefix records go with the node */
    cm_cluster_close(c);
    assert_int_equal(cm_cluster_prefix_holders(o, k1, names, 4, &n), RI_OK);
    assert_int_equal(n, 0);
    cm_cluster_close(o);
}

/* The member's lease ends behind its back (revoked here, as an expiry
 * during an outage would): it grants a new one and writes the node and
 * prefix records again. */
static void test_member_reregisters_after_expiry(void **state)
{
    (void)state;
    cm_cluster_t *c = open_cluster("rg");
    cm_cluster_node_t self = make_node("kv-r", "h", 0);
    uint8_t k[32];
    memset(k, 0x77, sizeof(k));
    assert_int_equal(cm_cluster_register(c, &self, LEASE_MS), RI_OK);
    cm_cluster_prefix_add(c, k);

    cm_etcd_t *e = NULL;
    assert_int_equal(cm_etcd_open(g_etcd.url, 0, &e), RI_OK);
    cm_etcd_kv_t kv;
    assert_int_equal(cm_etcd_get(e, "/ri/rg/nodes/kv-r", &kv), RI_OK);
    int64_t old = kv.lease;
    cm_etcd_kv_free(&kv);
    assert_int_not_equal(old, 0);
    assert_int_equal(cm_etcd_lease_revoke(e, old), RI_OK);
    assert_false(find_node("rg", "kv-r", NULL));

    double t = wait_node("rg", "kv-r", true, LEASE_MS / 1000.0 + 1);
    assert_true(t >= 0);
    assert_int_equal(cm_etcd_get(e, "/ri/rg/nodes/kv-r", &kv), RI_OK);
    assert_int_not_equal(kv.lease, old);
    cm_etcd_kv_free(&kv);
    cm_cluster_t *o = open_cluster("rg");
    char names[2][CM_CLUSTER_NAME_MAX];
    size_t n = 0;
    double start = now_s();
    do {
        assert_int_equal(cm_cluster_prefix_holders(o, k, names, 2, &n), RI_OK);
        usleep(20000);
    } while (n == 0 && now_s() - start < 2);
    assert_int_equal(n, 1);
    assert_true(cm_cluster_registered(c));
    cm_cluster_close(o);
    cm_cluster_close(c);
    cm_etcd_close(e);
}

static void test_sessions_under_observer_lease(void **state)
{
    (void)state;
    cm_cluster_t *o = open_cluster("sess");
    cm_cluster_session_t s = { .session_id = 0x1234abcdull, .tokens = 4096, .created_ms = 17 };
    snprintf(s.node, sizeof(s.node), "kv-1");
    snprintf(s.label, sizeof(s.label), "chat");
    assert_int_equal(cm_cluster_session_put(o, &s), RI_ERR_INVALID); /* not joined */
    assert_int_equal(cm_cluster_join_observer(o, "bad name", LEASE_MS), RI_ERR_INVALID);
    assert_int_equal(cm_cluster_join_observer(o, "wk-1", LEASE_MS), RI_OK);
    assert_int_equal(cm_cluster_session_put(o, &s), RI_OK);
    s.session_id = 2;
    snprintf(s.node, sizeof(s.node), "kv-2");
    assert_int_equal(cm_cluster_session_put(o, &s), RI_OK);
    snprintf(s.node, sizeof(s.node), "bad/node");
    assert_int_equal(cm_cluster_session_put(o, &s), RI_ERR_INVALID);

    cm_cluster_t *r = open_cluster("sess");
    cm_cluster_session_t *all = NULL;
    size_t n = 0;
    assert_int_equal(cm_cluster_sessions(r, "", &all, &n), RI_OK);
    assert_int_equal(n, 2);
    assert_string_equal(all[0].node, "kv-1");
    assert_int_equal(all[0].session_id, 0x1234abcdull);
    assert_string_equal(all[0].worker, "wk-1");
    assert_string_equal(all[0].label, "chat");
    assert_int_equal(all[0].tokens, 4096);
    assert_int_equal(all[0].created_ms, 17);
    cm_free(all);
    assert_int_equal(cm_cluster_sessions(r, "kv-2", &all, &n), RI_OK);
    assert_int_equal(n, 1);
    assert_int_equal(all[0].session_id, 2);
    cm_free(all);

    /* records outlive their lease while the observer's thread renews it */
    usleep(LEASE_MS * 1500);
    assert_int_equal(cm_cluster_session_del(o, "kv-2", 2), RI_OK);
    assert_int_equal(cm_cluster_sessions(r, NULL, &all, &n), RI_OK);
    assert_int_equal(n, 1);
    cm_free(all);

    /* the asynchronous pair: written, then deleted, by the directory's thread */
    s.session_id = 3;
    snprintf(s.node, sizeof(s.node), "kv-3");
    cm_cluster_session_put_async(o, &s);
    size_t seen = 0;
    for (int i = 0; i < 200 && seen != 2; i++) {
        usleep(10000);
        assert_int_equal(cm_cluster_sessions(r, NULL, &all, &n), RI_OK);
        seen = n;
        cm_free(all);
    }
    assert_int_equal(seen, 2);
    cm_cluster_session_del_async(o, "kv-3", 3);
    for (int i = 0; i < 200 && seen != 1; i++) {
        usleep(10000);
        assert_int_equal(cm_cluster_sessions(r, NULL, &all, &n), RI_OK);
        seen = n;
        cm_free(all);
    }
    assert_int_equal(seen, 1);

    /* the observer leaves: its records go */
    cm_cluster_close(o);
    assert_int_equal(cm_cluster_sessions(r, NULL, &all, &n), RI_OK);
    assert_int_equal(n, 0);
    cm_free(all);
    cm_cluster_close(r);
}

/* Wait until the observer's copy has exactly `want` nodes and stale as given. */
static bool wait_copy(cm_cluster_t *o, size_t want, bool want_stale, double timeout_s)
{
    double start = now_s();
    do {
        cm_cluster_node_t *nodes = NULL;
        size_t n = 0;
        bool stale = !want_stale;
        assert_int_equal(cm_cluster_nodes(o, &nodes, &n, &stale), RI_OK);
        cm_free(nodes);
        if (n == want && stale == want_stale)
            return true;
        usleep(20000);
    } while (now_s() - start < timeout_s);
    return false;
}

/* Last: kills and restarts the group's etcd. */
static void test_watch_and_outage(void **state)
{
    (void)state;
    cm_cluster_t *o = open_cluster("obs");
    assert_int_equal(cm_cluster_watch_nodes(o), RI_OK);
    assert_true(wait_copy(o, 0, false, 1));

    cm_cluster_t *m1 = open_cluster("obs"), *m2 = open_cluster("obs");
    cm_cluster_node_t n1 = make_node("kv-b", "h", 0), n2 = make_node("kv-a", "h", 0);
    assert_int_equal(cm_cluster_register(m1, &n1, LEASE_MS), RI_OK);
    assert_int_equal(cm_cluster_register(m2, &n2, LEASE_MS), RI_OK);
    assert_true(wait_copy(o, 2, false, 2));
    cm_cluster_node_t *nodes = NULL;
    size_t n = 0;
    assert_int_equal(cm_cluster_nodes(o, &nodes, &n, NULL), RI_OK);
    assert_string_equal(nodes[0].name, "kv-a"); /* sorted by name */
    assert_string_equal(nodes[1].name, "kv-b");
    cm_free(nodes);
    cm_cluster_close(m2);
    assert_true(wait_copy(o, 1, false, 2));

    /* etcd down: the last list stays, marked stale; the member notices */
    etcd_spawn_kill(&g_etcd);
    assert_true(wait_copy(o, 1, true, 3));
    double start = now_s();
    while (cm_cluster_registered(m1) && now_s() - start < LEASE_MS / 1000.0 + 2)
        usleep(50000);
    assert_false(cm_cluster_registered(m1));
    cm_cluster_session_t s = { .session_id = 5 };
    snprintf(s.node, sizeof(s.node), "kv-b");
    assert_int_equal(cm_cluster_join_observer(o, "wk", LEASE_MS), RI_ERR_UNREACHABLE);
    cm_cluster_t *late = open_cluster("obs");
    cm_cluster_node_t n3 = make_node("kv-late", "h", 0);
    start = now_s();
    assert_int_equal(cm_cluster_register(late, &n3, LEASE_MS), RI_ERR_UNREACHABLE);
    assert_true(now_s() - start < 2.0); /* within the 800 ms timeout, with margin */
    assert_false(cm_cluster_registered(late));
    cm_cluster_node_t *seen = NULL;
    size_t n_seen = 0;
    assert_int_equal(cm_cluster_nodes(late, &seen, &n_seen, NULL), RI_ERR_UNREACHABLE); /* no watch: one list */
    cm_cluster_close(late);

    /* sit out more than a lease, so the member's lease could expire, then
     * bring etcd back: the member registers again, the copy is fresh */
    usleep(LEASE_MS * 1000 + 500000);
    assert_int_equal(etcd_spawn_restart(&g_etcd), 0);
    start = now_s();
    while (!cm_cluster_registered(m1) && now_s() - start < 10)
        usleep(50000);
    assert_true(cm_cluster_registered(m1));
    assert_true(wait_copy(o, 1, false, 10));
    assert_true(find_node("obs", "kv-b", NULL));
    /* and it stays registered past another lease */
    usleep(LEASE_MS * 1500);
    assert_true(find_node("obs", "kv-b", NULL));
    cm_cluster_close(m1);
    assert_true(wait_copy(o, 0, false, 2));
    cm_cluster_close(o);
}

int main(void)
{
    if (!etcd_spawn_available()) {
        fprintf(stderr, "skip: %s is not installed\n", ETCD_SPAWN_BIN);
        return 77;
    }
    const struct CMUnitTest tests[] = {
        /* first: it forks, and a child is safest before the parent has
         * started gRPC's threads */
        cmocka_unit_test(test_killed_member_disappears),
        cmocka_unit_test(test_register_record_and_exists),
        cmocka_unit_test(test_update_and_prefix),
        cmocka_unit_test(test_member_reregisters_after_expiry),
        cmocka_unit_test(test_sessions_under_observer_lease),
        cmocka_unit_test(test_watch_and_outage),
    };
    return cmocka_run_group_tests(tests, group_setup, group_teardown);
}
