/* Tokens file parsing and token lookup (kvstore/ctl/kvs_auth). */
#define _GNU_SOURCE
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <cmocka.h>

#include "kvstore/ctl/kvs_auth.h"

static void test_parse_good_file(void **state)
{
    (void)state;
    kvs_auth_t *a = NULL;
    char err[256] = "";
    const char *text = "# comment\n"
                       "\n"
                       "tok-alice-01234567 alice 4GiB\r\n"
                       "   tok-bob-0123456789\tbob   -  admin\n"
                       "tok-carol-01234567 carol.team_1-x\n";
    assert_int_equal(kvs_auth_parse(text, "t", &a, err, sizeof(err)), RI_OK);
    assert_int_equal(kvs_auth_count(a), 3);
    const kvs_auth_entry_t *e = kvs_auth_lookup(a, "tok-alice-01234567", 18);
    assert_non_null(e);
    assert_string_equal(e->tenant, "alice");
    assert_true(e->has_quota);
    assert_int_equal(e->quota_bytes, 4ull << 30);
    assert_false(e->admin);
    e = kvs_auth_lookup(a, "tok-bob-0123456789", 18);
    assert_non_null(e);
    assert_string_equal(e->tenant, "bob");
    assert_false(e->has_quota);
    assert_true(e->admin);
    assert_string_equal(kvs_auth_entry(a, 2)->tenant, "carol.team_1-x");
    assert_null(kvs_auth_entry(a, 3));
    /* prefixes, extensions, empty and oversize tokens do not match */
    assert_null(kvs_auth_lookup(a, "tok-alice-0123456", 17));
    assert_null(kvs_auth_lookup(a, "tok-alice-012345678", 19));
    assert_null(kvs_auth_lookup(a, "", 0));
    assert_null(kvs_auth_lookup(a, NULL, 5));
    char big[400];
    memset(big, 'a', sizeof(big));
    assert_null(kvs_auth_lookup(a, big, sizeof(big)));
    /* length-delimited: bytes after len are ignored */
    assert_non_null(kvs_auth_lookup(a, "tok-alice-01234567GARBAGE", 18));
    kvs_auth_destroy(a);
    kvs_auth_destroy(NULL);
}

static void test_parse_bad_files(void **state)
{
    (void)state;
    static const struct {
        const char *text;
        const char *why;
    } cases[] = {
        {"", "no tokens"},
        {"# nothing\n\n", "no tokens"},
        {"onlytoken-123456\n", "expected"},
        {"short alice\n", "token must be"},
        {"tok-0123456789 al/ice\n", "tenant"},
        {"tok-0123456789 alice 12XB\n", "quota"},
        {"tok-0123456789 alice - root\n", "admin"},
        {"tok-0123456789 alice - admin extra\n", "too many"},
        {"tok-0123456789 alice\ntok-0123456789 bob\n", "duplicate"},
        {"tok-0123456789 aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa\n", "tenant"},
    };
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        kvs_auth_t *a = NULL;
        char err[256] = "";
        assert_int_not_equal(kvs_auth_parse(cases[i].text, "tokens.txt", &a, err, sizeof(err)), RI_OK);
        assert_null(a);
        if (strstr(err, cases[i].why) == NULL || strstr(err, "tokens.txt") == NULL)
            fail_msg("case %zu: message '%s' lacks '%s'", i, err, cases[i].why);
    }
    kvs_auth_t *a = NULL;
    char err[256];
    assert_int_not_equal(kvs_auth_load("/nonexistent/tokens", &a, err, sizeof(err)), RI_OK);
    assert_non_null(strstr(err, "/nonexistent/tokens"));
}

static void test_tenant_names(void **state)
{
    (void)state;
    assert_true(kvs_auth_tenant_valid("a"));
    assert_true(kvs_auth_tenant_valid("Team-1.prod_x"));
    assert_false(kvs_auth_tenant_valid(""));
    assert_false(kvs_auth_tenant_valid(NULL));
    assert_false(kvs_auth_tenant_valid("a b"));
    assert_false(kvs_auth_tenant_valid("é"));
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_parse_good_file),
        cmocka_unit_test(test_parse_bad_files),
        cmocka_unit_test(test_tenant_names),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
