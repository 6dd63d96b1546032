/* Unit tests of the catalog through kvs_data.h (no data plane): geometry and
 * name validation, secrets, quotas (tenant and global; nothing changes on
 * failure), tenant scoping of list/drop, stats, drain and metrics. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <cmocka.h>

#include "common/cm_alloc.h"
#include "kvstore/data/kvs_data.h"

static kvs_data_t *mk(uint64_t mem, uint64_t tenant_quota, uint64_t global_quota)
{
    kvs_data_config_t cfg = {.memory_bytes = mem, .tenant_quota_bytes = tenant_quota,
                             .global_quota_bytes = global_quota, .no_data_plane = true};
    kvs_data_t *d = NULL;
    assert_int_equal(kvs_data_create(&cfg, &d), RI_OK);
    return d;
}

static const kvs_geometry_t geo = {.layers = 2, .kv_heads = 2, .head_dim = 64, .dtype = KVS_DTYPE_F16, .page_tokens = 8};

static void test_validation(void **state)
{
    kvs_data_t *d = mk(1 << 24, 0, 0);
    uint64_t id;
    uint8_t secret[16];
    kvs_geometry_t g;

    (void)state;
    assert_int_equal(kvs_data_session_create(d, "", &geo, 0, NULL, &id, secret), RI_ERR_INVALID);
    assert_int_equal(kvs_data_session_create(d, "a b", &geo, 0, NULL, &id, secret), RI_ERR_INVALID);
    assert_int_equal(kvs_data_session_create(d, "t", &geo, 0, "bad\nlabel", &id, secret), RI_ERR_INVALID);
    g = geo; g.head_dim = 12;
    assert_int_equal(kvs_data_session_create(d, "t", &g, 0, NULL, &id, secret), RI_ERR_INVALID);
    g = geo; g.layers = 0;
    assert_int_equal(kvs_data_session_create(d, "t", &g, 0, NULL, &id, secret), RI_ERR_INVALID);
    g = geo; g.dtype = 7;
    assert_int_equal(kvs_data_session_create(d, "t", &g, 0, NULL, &id, secret), RI_ERR_INVALID);
    g = geo; g.page_tokens = 257;
    assert_int_equal(kvs_data_session_create(d, "t", &g, 0, NULL, &id, secret), RI_ERR_INVALID);
    g = geo; g.kv_heads = 300;
    assert_int_equal(kvs_data_session_create(d, "t", &g, 0, NULL, &id, secret), RI_ERR_INVALID);
    assert_int_equal(kvs_data_session_create(d, "t", &geo, UINT64_MAX, NULL, &id, secret), RI_ERR_INVALID);
    kvs_data_destroy(d);
}

static void test_sessions_and_scoping(void **state)
{
    kvs_data_t *d = mk(1 << 24, 0, 0);
    uint64_t a, b, c, freed;
    uint8_t sa[16], sb[16], zero[16] = {0};
    kvs_session_info_t *infos;
    size_t n;
    kvs_data_stats_t st;

    (void)state;
    assert_int_equal(kvs_data_session_create(d, "alice", &geo, 1000, "first", &a, sa), RI_OK);
    assert_int_equal(kvs_data_session_create(d, "alice", &geo, 0, NULL, &b, sb), RI_OK);
    assert_int_equal(kvs_data_session_create(d, "bob", &geo, 0, "b", &c, sb), RI_OK);
    assert_true(a != 0 && a != b && b != c);
    assert_memory_not_equal(sa, sb, 16);
    assert_memory_not_equal(sa, zero, 16);
    assert_int_equal(kvs_data_session_list(d, "alice", &infos, &n), RI_OK);
    assert_int_equal(n, 2);
    assert_string_equal(infos[0].tenant, "alice");
    assert_true(strcmp(infos[0].label, "first") == 0 || strcmp(infos[1].label, "first") == 0);
    assert_int_equal(infos[0].geometry.head_dim, 64);
    cm_free(infos);
    assert_int_equal(kvs_data_session_list(d, "carol", &infos, &n), RI_OK);
    assert_int_equal(n, 0);
    assert_null(infos);
    /* bob cannot drop alice's session; it looks missing. */
    assert_int_equal(kvs_data_session_drop(d, "bob", a, &freed), RI_ERR_NOT_FOUND);
    kvs_data_stats(d, "alice", &st);
    assert_int_equal(st.sessions_tenant, 2);
    assert_int_equal(st.sessions_all, 3);
    assert_int_equal(kvs_data_session_drop(d, "alice", a, &freed), RI_OK);
    assert_int_equal(freed, 0);
    assert_int_equal(kvs_data_session_drop(d, "alice", a, &freed), RI_ERR_NOT_FOUND);
    kvs_data_stats(d, "alice", &st);
    assert_int_equal(st.sessions_tenant, 1);
    assert_int_equal(st.pool_bytes_total, 1 << 24);
    /* Drain: no new sessions. */
    assert_int_equal(kvs_data_drain(d), 2);
    assert_int_equal(kvs_data_session_create(d, "alice", &geo, 0, NULL, &a, sa), RI_ERR_SHUTDOWN);
    kvs_data_destroy(d);
    kvs_data_destroy(NULL);
}

static void test_quota(void **state)
{
    /* page bytes = 2*8*64*2 = 2048; per token-page and table: 2 layers * 2 heads */
    kvs_data_t *d = mk(1 << 24, 64 * 1024, 0);
    uint64_t id, id2;
    uint8_t s[16];
    kvs_data_stats_t st;

    (void)state;
    /* 64 tokens = 8 pages * 2048 * 4 tables = 64 KiB: exactly the tenant quota */
    assert_int_equal(kvs_data_session_create(d, "t", &geo, 64, NULL, &id, s), RI_OK);
    assert_int_equal(kvs_data_session_create(d, "t", &geo, 8, NULL, &id2, s), RI_ERR_QUOTA);
    kvs_data_stats(d, "t", &st);
    assert_int_equal(st.sessions_tenant, 1); /* nothing changed */
    /* Raise the tenant's quota; then it fits. */
    assert_int_equal(kvs_data_set_tenant_quota(d, "t", 128 * 1024), RI_OK);
    assert_int_equal(kvs_data_session_create(d, "t", &geo, 8, NULL, &id2, s), RI_OK);
    /* Another tenant is held by the global quota (the pool, 16 MiB). */
    assert_int_equal(kvs_data_set_tenant_quota(d, "u", 0), RI_OK);
    assert_int_equal(kvs_data_session_create(d, "u", &geo, 1 << 20, NULL, &id2, s), RI_ERR_QUOTA);
    /* Dropping gives the reservation back. */
    assert_int_equal(kvs_data_session_drop(d, "t", id, NULL), RI_OK);
    assert_int_equal(kvs_data_session_create(d, "t", &geo, 64, NULL, &id, s), RI_OK);
    assert_int_equal(kvs_data_set_tenant_quota(d, "bad tenant", 1), RI_ERR_INVALID);
    kvs_data_destroy(d);
}

static void test_metrics(void **state)
{
    kvs_data_t *d = mk(1 << 22, 0, 0);
    uint64_t id;
    uint8_t s[16];
    char *buf = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&buf, &len);
    kvs_data_pool_info_t pi;

    (void)state;
    assert_int_equal(kvs_data_session_create(d, "t", &geo, 0, NULL, &id, s), RI_OK);
    kvs_data_metrics_write(d, f);
    fclose(f);
    assert_non_null(strstr(buf, "# TYPE ri_kvs_fetch_latency_seconds histogram"));
    assert_non_null(strstr(buf, "ri_kvs_sessions 1\n"));
    assert_non_null(strstr(buf, "ri_kvs_dp_errors_total{kind=\"auth\"} 0"));
    free(buf);
    kvs_data_pool_info(d, &pi);
    assert_int_equal(pi.total_bytes, 1 << 22);
    assert_int_equal(pi.free_extents, 1);
    assert_true(kvs_data_pool_pressure(d) == 0.0);
    kvs_data_destroy(d);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_validation),
        cmocka_unit_test(test_sessions_and_scoping),
        cmocka_unit_test(test_quota),
        cmocka_unit_test(test_metrics),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
