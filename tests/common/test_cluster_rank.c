/*
 * cm_cluster_rank (pure: no etcd): every policy, skipped nodes, ties broken
 * by name, the round-robin cursor, an empty list; policy names; the node
 * record's JSON both ways and its refusals.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include <cmocka.h>

#include "common/cm_alloc.h"
#include "common/cm_cluster.h"

static cm_cluster_node_t node(const char *name, const char *host, uint64_t total, uint64_t used)
{
    cm_cluster_node_t n;
    memset(&n, 0, sizeof(n));
    snprintf(n.name, sizeof(n.name), "%s", name);
    snprintf(n.addr, sizeof(n.addr), "%s:1", name);
    snprintf(n.host, sizeof(n.host), "%s", host);
    n.pool_total = total;
    n.pool_used = used;
    return n;
}

/* Rank and compare the names in order with want (space-separated). */
static void expect_order(const cm_cluster_node_t *nodes, size_t n, const bool *skip, const char *my_host,
                         cm_cluster_policy_t p, uint32_t *rr, const char *want)
{
    size_t order[16], m = 99;
    cm_cluster_rank(nodes, n, skip, my_host, p, rr, order, &m);
    char got[256] = "";
    for (size_t i = 0; i < m; i++) {
        assert_true(order[i] < n);
        strcat(got, i ? " " : "");
        strcat(got, nodes[order[i]].name);
    }
    assert_string_equal(got, want);
}

static void test_most_free(void **state)
{
    (void)state;
    cm_cluster_node_t n[] = { node("c", "h1", 100, 10), node("a", "h2", 100, 50), node("b", "h3", 200, 20),
                              node("d", "h1", 100, 120) /* over-used: 0 free */ };
    expect_order(n, 4, NULL, "h1", CM_CLUSTER_MOST_FREE, NULL, "b c a d");
}

static void test_local_first(void **state)
{
    (void)state;
    cm_cluster_node_t n[] = { node("c", "h1", 100, 10), node("a", "h2", 100, 50), node("b", "h3", 200, 20),
                              node("d", "h1", 100, 90) };
    /* my host's nodes first (most free first among them), then the rest */
    expect_order(n, 4, NULL, "h1", CM_CLUSTER_LOCAL_FIRST, NULL, "c d b a");
    /* no node on my host: most free */
    expect_order(n, 4, NULL, "elsewhere", CM_CLUSTER_LOCAL_FIRST, NULL, "b c a d");
    expect_order(n, 4, NULL, NULL, CM_CLUSTER_LOCAL_FIRST, NULL, "b c a d");
}

static void test_ties_by_name(void **state)
{
    (void)state;
    cm_cluster_node_t n[] = { node("n3", "h", 100, 0), node("n1", "h", 100, 0), node("n2", "h", 100, 0) };
    expect_order(n, 3, NULL, "h", CM_CLUSTER_MOST_FREE, NULL, "n1 n2 n3");
    expect_order(n, 3, NULL, "h", CM_CLUSTER_LOCAL_FIRST, NULL, "n1 n2 n3");
    expect_order(n, 3, NULL, "x", CM_CLUSTER_LOCAL_FIRST, NULL, "n1 n2 n3");
}

static void test_round_robin(void **state)
{
    (void)state;
    cm_cluster_node_t n[] = { node("b", "h", 1, 0), node("a", "h", 100, 0), node("c", "h", 50, 0) };
    uint32_t rr = 0;
    expect_order(n, 3, NULL, "h", CM_CLUSTER_ROUND_ROBIN, &rr, "a b c");
    expect_order(n, 3, NULL, "h", CM_CLUSTER_ROUND_ROBIN, &rr, "b c a");
    expect_order(n, 3, NULL, "h", CM_CLUSTER_ROUND_ROBIN, &rr, "c a b");
    expect_order(n, 3, NULL, "h", CM_CLUSTER_ROUND_ROBIN, &rr, "a b c");
    assert_int_equal(rr, 4);
    bool skip[] = { false, true, false };
    rr = 1;
    expect_order(n, 3, skip, "h", CM_CLUSTER_ROUND_ROBIN, &rr, "c b");
}

static void test_skip_and_empty(void **state)
{
    (void)state;
    cm_cluster_node_t n[] = { node("a", "h", 100, 0), node("b", "h", 200, 0), node("c", "x", 300, 0) };
    bool skip[] = { false, true, false };
    expect_order(n, 3, skip, "h", CM_CLUSTER_MOST_FREE, NULL, "c a");
    expect_order(n, 3, skip, "h", CM_CLUSTER_LOCAL_FIRST, NULL, "a c");
    bool all[] = { true, true, true };
    expect_order(n, 3, all, "h", CM_CLUSTER_MOST_FREE, NULL, "");
    uint32_t rr = 0;
    expect_order(NULL, 0, NULL, "h", CM_CLUSTER_ROUND_ROBIN, &rr, "");
    expect_order(NULL, 0, NULL, "h", CM_CLUSTER_LOCAL_FIRST, NULL, "");
}

static void test_policy_names(void **state)
{
    (void)state;
    cm_cluster_policy_t p = CM_CLUSTER_MOST_FREE;
    const char *names[] = { "local-first", "most-free", "round-robin" };
    for (int i = 0; i < 3; i++) {
        assert_true(cm_cluster_policy_parse(names[i], &p));
        assert_int_equal(p, i);
        assert_string_equal(cm_cluster_policy_name(p), names[i]);
    }
    p = CM_CLUSTER_ROUND_ROBIN;
    assert_false(cm_cluster_policy_parse("fastest", &p));
    assert_false(cm_cluster_policy_parse(NULL, &p));
    assert_int_equal(p, CM_CLUSTER_ROUND_ROBIN); /* unchanged */
}

static void test_names(void **state)
{
    (void)state;
    assert_true(cm_cluster_name_valid("kv-1.example:50051"));
    assert_true(cm_cluster_name_valid("A_b"));
    assert_false(cm_cluster_name_valid(""));
    assert_false(cm_cluster_name_valid(NULL));
    assert_false(cm_cluster_name_valid("a/b"));
    assert_false(cm_cluster_name_valid("a b"));
    char longname[80];
    memset(longname, 'x', sizeof(longname));
    longname[63] = '\0';
    assert_true(cm_cluster_name_valid(longname));
    longname[63] = 'x';
    longname[64] = '\0';
    assert_false(cm_cluster_name_valid(longname));
}

static void test_node_json(void **state)
{
    (void)state;
    cm_cluster_node_t a = node("kv1", "host-a", 1ull << 40, 12345);
    snprintf(a.dataplane, sizeof(a.dataplane), "ucx:abcdef");
    snprintf(a.tenants, sizeof(a.tenants), "t1,t2");
    a.sessions = 7;
    a.epoch = 1764900000123ull;
    a.recovered = true;
    char *json = NULL;
    assert_int_equal(cm_cluster_node_to_json(&a, &json), RI_OK);
    cm_cluster_node_t b;
    assert_int_equal(cm_cluster_node_from_json(json, strlen(json), &b), RI_OK);
    assert_memory_equal(&a, &b, sizeof(a));
    assert_non_null(strstr(json, "\"tenants\":[\"t1\",\"t2\"]"));
    cm_free(json);

    /* unknown fields are ignored; optional ones may be absent */
    const char *minimal = "{\"node\":\"n\",\"addr\":\"h:1\",\"future\":{\"x\":1}}";
    assert_int_equal(cm_cluster_node_from_json(minimal, strlen(minimal), &b), RI_OK);
    assert_string_equal(b.name, "n");
    assert_int_equal(b.pool_total, 0);

    /* refusals leave *n alone */
    static const char *bad[] = {
        "{\"addr\":\"h:1\"}",
        "{\"node\":\"n\"}",
        "{\"node\":1,\"addr\":\"h:1\"}",
        "{\"node\":\"n\",\"addr\":\"h:1\",\"pool_total\":\"big\"}",
        "{\"node\":\"n\",\"addr\":\"h:1\",\"pool_used\":-1}",
        "{\"node\":\"n\",\"addr\":\"h:1\",\"tenants\":\"t1\"}",
        "{\"node\":\"n\",\"addr\":\"h:1\",\"recovered\":1}",
        "[1,2]",
        "not json",
        "",
    };
    memset(&b, 0x5a, sizeof(b));
    cm_cluster_node_t before = b;
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        if (cm_cluster_node_from_json(bad[i], strlen(bad[i]), &b) != RI_ERR_FORMAT)
            fail_msg("accepted %s", bad[i]);
    }
    assert_memory_equal(&b, &before, sizeof(b));
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_most_free),   cmocka_unit_test(test_local_first),    cmocka_unit_test(test_ties_by_name),
        cmocka_unit_test(test_round_robin), cmocka_unit_test(test_skip_and_empty), cmocka_unit_test(test_policy_names),
        cmocka_unit_test(test_names),       cmocka_unit_test(test_node_json),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
