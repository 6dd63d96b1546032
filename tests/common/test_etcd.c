/*
 * cm_etcd against a real etcd (tests/common/etcd_spawn.h): KV, create
 * races, leases and their expiry, watches in order and across an etcd kill
 * -9 + restart, every call with etcd down failing UNREACHABLE within the
 * timeout, bad arguments.  Exits 77 when etcd is not installed.
 */
#define _GNU_SOURCE
#include <pthread.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include <cmocka.h>

#include "common/cm_etcd.h"
#include "tests/common/etcd_spawn.h"

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

static cm_etcd_t *open_client(uint32_t timeout_ms)
{
    cm_etcd_t *e = NULL;
    assert_int_equal(cm_etcd_open(g_etcd.url, timeout_ms, &e), RI_OK);
    return e;
}

/* ---- events collected by a watch ---------------------------------------- */

#define MAX_EV 256
typedef struct collected {
    pthread_mutex_t mu;
    size_t n;
    cm_etcd_event_type_t type[MAX_EV];
    char key[MAX_EV][96];
    char val[MAX_EV][32];
} collected_t;

static void collect(void *arg, const cm_etcd_event_t *ev)
{
    collected_t *c = arg;
    pthread_mutex_lock(&c->mu);
    if (c->n < MAX_EV) {
        c->type[c->n] = ev->type;
        snprintf(c->key[c->n], sizeof(c->key[0]), "%s", ev->kv ? ev->kv->key : "");
        snprintf(c->val[c->n], sizeof(c->val[0]), "%s", ev->kv ? ev->kv->val : "");
        c->n++;
    }
    pthread_mutex_unlock(&c->mu);
}

/* Wait until an event of type (and key, unless NULL) arrives at index >= from;
 * its index, or -1 after timeout_s. */
static long wait_event(collected_t *c, size_t from, cm_etcd_event_type_t type, const char *key, double timeout_s)
{
    double end = now_s() + timeout_s;
    do {
        pthread_mutex_lock(&c->mu);
        for (size_t i = from; i < c->n; i++) {
            if (c->type[i] == type && (key == NULL || strcmp(c->key[i], key) == 0)) {
                pthread_mutex_unlock(&c->mu);
                return (long)i;
            }
        }
        pthread_mutex_unlock(&c->mu);
        usleep(10000);
    } while (now_s() < end);
    return -1;
}

/* ---- tests -------------------------------------------------------------- */

static void test_put_get_list_delete(void **state)
{
    (void)state;
    cm_etcd_t *e = open_client(0);
    assert_int_equal(cm_etcd_put(e, "/t/kv/a", "one", 3, 0), RI_OK);
    assert_int_equal(cm_etcd_put(e, "/t/kv/b", "two", 3, 0), RI_OK);
    assert_int_equal(cm_etcd_put(e, "/t/kv/c", "", 0, 0), RI_OK);
    assert_int_equal(cm_etcd_put(e, "/t/kvx", "outside", 7, 0), RI_OK);

    cm_etcd_kv_t kv;
    assert_int_equal(cm_etcd_get(e, "/t/kv/a", &kv), RI_OK);
    assert_string_equal(kv.key, "/t/kv/a");
    assert_string_equal(kv.val, "one");
    assert_int_equal(kv.len, 3);
    assert_true(kv.create_rev > 0 && kv.mod_rev >= kv.create_rev);
    assert_int_equal(kv.lease, 0);
    cm_etcd_kv_free(&kv);
    assert_int_equal(cm_etcd_get(e, "/t/kv/nope", &kv), RI_ERR_NOT_FOUND);

    cm_etcd_list_t l;
    assert_int_equal(cm_etcd_list(e, "/t/kv/", 0, &l), RI_OK);
    assert_int_equal(l.n, 3);
    assert_string_equal(l.kvs[0].key, "/t/kv/a");
    assert_string_equal(l.kvs[1].key, "/t/kv/b");
    assert_string_equal(l.kvs[2].key, "/t/kv/c");
    assert_int_equal(l.kvs[2].len, 0);
    assert_true(l.revision >= l.kvs[2].mod_rev);
    cm_etcd_list_free(&l);
    assert_int_equal(cm_etcd_list(e, "/t/kv/", 2, &l), RI_OK);
    assert_int_equal(l.n, 2);
    cm_etcd_list_free(&l);

    int64_t deleted = -1;
    assert_int_equal(cm_etcd_delete(e, "/t/kv/a", false, &deleted), RI_OK);
    assert_int_equal(deleted, 1);
    assert_int_equal(cm_etcd_delete(e, "/t/kv/a", false, &deleted), RI_OK);
    assert_int_equal(deleted, 0);
    assert_int_equal(cm_etcd_delete(e, "/t/kv/", true, &deleted), RI_OK);
    assert_int_equal(deleted, 2);
    assert_int_equal(cm_etcd_list(e, "/t/kv/", 0, &l), RI_OK);
    assert_int_equal(l.n, 0);
    cm_etcd_list_free(&l);
    assert_int_equal(cm_etcd_get(e, "/t/kvx", &kv), RI_OK); /* outside the prefix: kept */
    cm_etcd_kv_free(&kv);
    cm_etcd_close(e);
}

static void test_create_race(void **state)
{
    (void)state;
    cm_etcd_t *e = open_client(0);
    assert_int_equal(cm_etcd_create(e, "/t/create/x", "first", 5, 0), RI_OK);
    assert_int_equal(cm_etcd_create(e, "/t/create/x", "second", 6, 0), RI_ERR_EXISTS);
    cm_etcd_kv_t kv;
    assert_int_equal(cm_etcd_get(e, "/t/create/x", &kv), RI_OK);
    assert_string_equal(kv.val, "first"); /* the loser changed nothing */
    cm_etcd_kv_free(&kv);
    assert_int_equal(cm_etcd_delete(e, "/t/create/x", false, NULL), RI_OK);
    assert_int_equal(cm_etcd_create(e, "/t/create/x", "third", 5, 0), RI_OK);
    cm_etcd_close(e);
}

static void test_lease_keepalive_expiry_revoke(void **state)
{
    (void)state;
    cm_etcd_t *e = open_client(0);
    int64_t a = 0, b = 0, ttl = 0;
    assert_int_equal(cm_etcd_lease_grant(e, 2, &a), RI_OK);
    assert_int_equal(cm_etcd_lease_grant(e, 2, &b), RI_OK);
    assert_int_not_equal(a, b);
    assert_int_equal(cm_etcd_put(e, "/t/lease/a", "x", 1, a), RI_OK);
    assert_int_equal(cm_etcd_put(e, "/t/lease/b", "y", 1, b), RI_OK);
    cm_etcd_kv_t kv;
    assert_int_equal(cm_etcd_get(e, "/t/lease/a", &kv), RI_OK);
    assert_int_equal(kv.lease, a);
    cm_etcd_kv_free(&kv);

    /* a is kept alive past its TTL; b expires and takes its key along */
    double start = now_s();
    while (now_s() - start < 3.5) {
        assert_int_equal(cm_etcd_lease_keepalive(e, a, &ttl), RI_OK);
        assert_true(ttl >= 1 && ttl <= 2);
        usleep(500000);
    }
    assert_int_equal(cm_etcd_get(e, "/t/lease/a", &kv), RI_OK);
    cm_etcd_kv_free(&kv);
    assert_int_equal(cm_etcd_get(e, "/t/lease/b", &kv), RI_ERR_NOT_FOUND);
    assert_int_equal(cm_etcd_lease_keepalive(e, b, &ttl), RI_ERR_NOT_FOUND);
    assert_int_equal(cm_etcd_put(e, "/t/lease/c", "z", 1, b), RI_ERR_NOT_FOUND);

    /* revoke ends a at once; revoking an expired lease is fine */
    assert_int_equal(cm_etcd_lease_revoke(e, a), RI_OK);
    assert_int_equal(cm_etcd_get(e, "/t/lease/a", &kv), RI_ERR_NOT_FOUND);
    assert_int_equal(cm_etcd_lease_revoke(e, b), RI_OK);
    cm_etcd_close(e);
}

static void test_watch_in_order(void **state)
{
    (void)state;
    cm_etcd_t *e = open_client(0);
    collected_t c = { .mu = PTHREAD_MUTEX_INITIALIZER };
    assert_int_equal(cm_etcd_put(e, "/t/w1/old", "0", 1, 0), RI_OK);
    assert_int_equal(cm_etcd_put(e, "/t/w1x", "outside", 7, 0), RI_OK);
    cm_etcd_watch_t *w = NULL;
    assert_int_equal(cm_etcd_watch_start(e, "/t/w1/", 0, collect, &c, &w), RI_OK);
    assert_int_equal(cm_etcd_put(e, "/t/w1/a", "1", 1, 0), RI_OK);
    assert_int_equal(cm_etcd_put(e, "/t/w1/b", "2", 1, 0), RI_OK);
    assert_int_equal(cm_etcd_put(e, "/t/w1/a", "3", 1, 0), RI_OK);
    assert_int_equal(cm_etcd_delete(e, "/t/w1/a", false, NULL), RI_OK);
    assert_true(wait_event(&c, 0, CM_ETCD_DELETE, "/t/w1/a", 5) >= 0);
    cm_etcd_watch_stop(w);

    static const struct {
        cm_etcd_event_type_t t;
        const char *k, *v;
    } want[] = {
        { CM_ETCD_PUT, "/t/w1/old", "0" }, { CM_ETCD_PUT, "/t/w1/a", "1" },   { CM_ETCD_PUT, "/t/w1/b", "2" },
        { CM_ETCD_PUT, "/t/w1/a", "3" },   { CM_ETCD_DELETE, "/t/w1/a", "" },
    };
    assert_int_equal(c.n, sizeof(want) / sizeof(want[0]));
    for (size_t i = 0; i < c.n; i++) {
        assert_int_equal(c.type[i], want[i].t);
        assert_string_equal(c.key[i], want[i].k);
        assert_string_equal(c.val[i], want[i].v);
    }
    /* nothing after stop */
    size_t n = c.n;
    assert_int_equal(cm_etcd_put(e, "/t/w1/late", "4", 1, 0), RI_OK);
    usleep(200000);
    assert_int_equal(c.n, n);
    cm_etcd_close(e);
}

/* Every call on a client whose etcd is down: UNREACHABLE within the timeout. */
static void check_all_unreachable(cm_etcd_t *e, uint32_t timeout_ms)
{
    double limit = timeout_ms / 1000.0 + 1.0;
    cm_etcd_kv_t kv;
    cm_etcd_list_t l;
    int64_t id = 0, n = 0;
    ri_status_t st[9];
    double t[10];
    collected_t c = { .mu = PTHREAD_MUTEX_INITIALIZER };
    cm_etcd_watch_t *w = NULL;
    t[0] = now_s();
    st[0] = cm_etcd_put(e, "/t/down/k", "v", 1, 0);
    t[1] = now_s();
    st[1] = cm_etcd_create(e, "/t/down/k", "v", 1, 0);
    t[2] = now_s();
    st[2] = cm_etcd_get(e, "/t/down/k", &kv);
    t[3] = now_s();
    st[3] = cm_etcd_list(e, "/t/down/", 0, &l);
    t[4] = now_s();
    st[4] = cm_etcd_delete(e, "/t/down/", true, &n);
    t[5] = now_s();
    st[5] = cm_etcd_lease_grant(e, 2, &id);
    t[6] = now_s();
    st[6] = cm_etcd_lease_keepalive(e, 12345, NULL);
    t[7] = now_s();
    st[7] = cm_etcd_lease_revoke(e, 12345);
    t[8] = now_s();
    st[8] = cm_etcd_watch_start(e, "/t/down/", 0, collect, &c, &w);
    t[9] = now_s();
    for (int i = 0; i < 9; i++) {
        if (st[i] != RI_ERR_UNREACHABLE || t[i + 1] - t[i] > limit)
            fail_msg("call %d with etcd down: %s after %.2f s (%s)", i, ri_status_name(st[i]), t[i + 1] - t[i],
                     cm_etcd_last_error());
    }
    assert_true(strlen(cm_etcd_last_error()) > 0);
}

static void test_unreachable_never_started(void **state)
{
    (void)state;
    /* two endpoints nothing listens on: each refuses, the call fails */
    cm_etcd_t *e = NULL;
    assert_int_equal(cm_etcd_open("etcd://127.0.0.1:1,127.0.0.1:2", 800, &e), RI_OK);
    check_all_unreachable(e, 800);
    cm_etcd_close(e);
}

static void test_bad_arguments(void **state)
{
    (void)state;
    cm_etcd_t *e = NULL;
    assert_int_equal(cm_etcd_open(NULL, 0, &e), RI_ERR_INVALID);
    assert_int_equal(cm_etcd_open("", 0, &e), RI_ERR_INVALID);
    assert_int_equal(cm_etcd_open("etcd://", 0, &e), RI_ERR_INVALID);
    assert_int_equal(cm_etcd_open("localhost", 0, &e), RI_ERR_INVALID);
    assert_int_equal(cm_etcd_open("h:0", 0, &e), RI_ERR_INVALID);
    assert_int_equal(cm_etcd_open("h:65536", 0, &e), RI_ERR_INVALID);
    assert_int_equal(cm_etcd_open("h:1,", 0, &e), RI_ERR_INVALID);
    assert_int_equal(cm_etcd_open("http://h:1", 0, &e), RI_ERR_INVALID);
    assert_null(e);
    assert_true(strlen(cm_etcd_last_error()) > 0);
    assert_true(cm_etcd_endpoints_valid("etcd://a:1,b.example:2379"));
    assert_true(cm_etcd_endpoints_valid("127.0.0.1:2379"));
    assert_false(cm_etcd_endpoints_valid("a:1,,b:2"));
    assert_false(cm_etcd_endpoints_valid("a:x"));

    e = open_client(0);
    cm_etcd_kv_t kv = { 0 };
    cm_etcd_list_t l = { 0 };
    int64_t id = 0;
    cm_etcd_watch_t *w = NULL;
    assert_int_equal(cm_etcd_put(e, "", "v", 1, 0), RI_ERR_INVALID);
    assert_int_equal(cm_etcd_put(e, NULL, "v", 1, 0), RI_ERR_INVALID);
    assert_int_equal(cm_etcd_put(e, "/t/bad", NULL, 1, 0), RI_ERR_INVALID);
    assert_int_equal(cm_etcd_put(NULL, "/t/bad", "v", 1, 0), RI_ERR_INVALID);
    assert_int_equal(cm_etcd_create(e, "", "v", 1, 0), RI_ERR_INVALID);
    assert_int_equal(cm_etcd_get(e, "", &kv), RI_ERR_INVALID);
    assert_int_equal(cm_etcd_get(e, "/t/bad", NULL), RI_ERR_INVALID);
    assert_int_equal(cm_etcd_list(e, NULL, 0, &l), RI_ERR_INVALID);
    assert_int_equal(cm_etcd_delete(e, "", true, NULL), RI_ERR_INVALID);
    assert_int_equal(cm_etcd_lease_grant(e, 0, &id), RI_ERR_INVALID);
    assert_int_equal(cm_etcd_lease_grant(e, 2, NULL), RI_ERR_INVALID);
    assert_int_equal(cm_etcd_lease_keepalive(e, 0, NULL), RI_ERR_INVALID);
    assert_int_equal(cm_etcd_lease_revoke(e, 0), RI_ERR_INVALID);
    assert_int_equal(cm_etcd_watch_start(e, "/t/", 0, NULL, NULL, &w), RI_ERR_INVALID);
    assert_null(w);
    assert_null(kv.key);
    assert_int_equal(id, 0);
    /* a lease that never existed */
    assert_int_equal(cm_etcd_put(e, "/t/bad", "v", 1, 0x1234), RI_ERR_NOT_FOUND);
    assert_int_equal(cm_etcd_get(e, "/t/bad", &kv), RI_ERR_NOT_FOUND);
    cm_etcd_watch_stop(NULL);
    cm_etcd_close(NULL);
    cm_etcd_close(e);
}

/* Last: kills and restarts the group's etcd. */
static void test_watch_survives_kill_restart(void **state)
{
    (void)state;
    cm_etcd_t *e = open_client(800);
    collected_t c = { .mu = PTHREAD_MUTEX_INITIALIZER };
    assert_int_equal(cm_etcd_put(e, "/t/w2/a", "1", 1, 0), RI_OK);
    cm_etcd_watch_t *w = NULL;
    assert_int_equal(cm_etcd_watch_start(e, "/t/w2/", 100, collect, &c, &w), RI_OK);
    assert_true(wait_event(&c, 0, CM_ETCD_PUT, "/t/w2/a", 5) == 0);

    etcd_spawn_kill(&g_etcd);
    long r = wait_event(&c, 0, CM_ETCD_RESYNC, NULL, 5);
    assert_true(r >= 1);
    check_all_unreachable(e, 800);

    assert_int_equal(etcd_spawn_restart(&g_etcd), 0);
    /* the same client reconnects; the watch re-lists (the data survived) */
    long again = wait_event(&c, (size_t)r + 1, CM_ETCD_PUT, "/t/w2/a", 10);
    if (again <= r) {
        cm_etcd_kv_t kv;
        ri_status_t st = cm_etcd_get(e, "/t/w2/a", &kv);
        fprintf(stderr, "get after restart: %s %s; %zu events\n", ri_status_name(st), cm_etcd_last_error(), c.n);
        for (size_t i = 0; i < c.n; i++)
            fprintf(stderr, "  %d %s\n", c.type[i], c.key[i]);
    }
    assert_true(again > r);
    assert_int_equal(cm_etcd_put(e, "/t/w2/b", "2", 1, 0), RI_OK);
    assert_true(wait_event(&c, (size_t)again + 1, CM_ETCD_PUT, "/t/w2/b", 5) > again);
    cm_etcd_watch_stop(w);
    cm_etcd_close(e);
}

int main(void)
{
    if (!etcd_spawn_available()) {
        fprintf(stderr, "skip: %s is not installed\n", ETCD_SPAWN_BIN);
        return 77;
    }
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_put_get_list_delete),           cmocka_unit_test(test_create_race),
        cmocka_unit_test(test_lease_keepalive_expiry_revoke), cmocka_unit_test(test_watch_in_order),
        cmocka_unit_test(test_unreachable_never_started),     cmocka_unit_test(test_bad_arguments),
        cmocka_unit_test(test_watch_survives_kill_restart),
    };
    return cmocka_run_group_tests(tests, group_setup, group_teardown);
}
