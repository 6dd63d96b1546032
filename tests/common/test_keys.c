/* API keys files (cm_keys.h): parsing, refusals with file:line, matching,
 * the Bearer header form, and a group-writable file refused. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include <cmocka.h>

#include "common/cm_keys.h"

#define KEY_A "0123456789abcdef"
#define KEY_B "fedcba9876543210-second"

static void test_parse_and_match(void **state)
{
    cm_keys_t *k = NULL;
    char err[256] = "";
    (void)state;
    assert_int_equal(cm_keys_parse("# keys\n\n  " KEY_A " alice\r\n" KEY_B "\n", "t", &k, err, sizeof(err)), RI_OK);
    assert_int_equal(cm_keys_count(k), 2);
    assert_true(cm_keys_match(k, KEY_A, strlen(KEY_A)));
    assert_true(cm_keys_match(k, KEY_B, strlen(KEY_B)));
    assert_false(cm_keys_match(k, KEY_A, strlen(KEY_A) - 1));    /* a prefix */
    assert_false(cm_keys_match(k, KEY_A "x", strlen(KEY_A) + 1)); /* longer */
    assert_false(cm_keys_match(k, "0123456789abcdeF", 16));
    assert_false(cm_keys_match(k, "", 0));
    cm_keys_destroy(k);
    cm_keys_destroy(NULL);
}

static void test_refused(void **state)
{
    static const struct {
        const char *text, *why;
    } bad[] = {
        {"# only a comment\n", "t: no keys"},
        {KEY_A "\nshort\n", "t:2: a key must be"},
        {KEY_A "\n" KEY_A " again\n", "t:2: duplicate key"},
        {"0123456789abcde\x01\n", "t:1: a key must be"},
    };
    (void)state;
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        cm_keys_t *k = (cm_keys_t *)(uintptr_t)1; /* must stay untouched */
        char err[256] = "";
        assert_int_equal(cm_keys_parse(bad[i].text, "t", &k, err, sizeof(err)), RI_ERR_FORMAT);
        assert_ptr_equal(k, (cm_keys_t *)(uintptr_t)1);
        assert_non_null(strstr(err, bad[i].why));
    }
}

static void test_bearer(void **state)
{
    const char *key;
    size_t len;
    (void)state;
    assert_true(cm_keys_bearer("Bearer " KEY_A, &key, &len));
    assert_int_equal(len, strlen(KEY_A));
    assert_memory_equal(key, KEY_A, len);
    assert_true(cm_keys_bearer("bearer  " KEY_A " ", &key, &len));
    assert_int_equal(len, strlen(KEY_A));
    assert_false(cm_keys_bearer("Basic " KEY_A, &key, &len));
    assert_false(cm_keys_bearer("Bearer ", &key, &len));
    assert_false(cm_keys_bearer("Bearer a b", &key, &len));
    assert_false(cm_keys_bearer(NULL, &key, &len));
}

static void test_file_mode(void **state)
{
    char path[] = "/tmp/ri-keys-XXXXXX", err[256] = "";
    cm_keys_t *k = NULL;
    (void)state;
    int fd = mkstemp(path);
    assert_true(fd >= 0);
    assert_int_equal(write(fd, KEY_A "\n", strlen(KEY_A) + 1), (ssize_t)strlen(KEY_A) + 1);
    close(fd);
    assert_int_equal(chmod(path, 0600), 0);
    assert_int_equal(cm_keys_load(path, &k, err, sizeof(err)), RI_OK);
    assert_true(cm_keys_match(k, KEY_A, strlen(KEY_A)));
    cm_keys_destroy(k);
    k = NULL;
    assert_int_equal(chmod(path, 0620), 0);
    assert_int_equal(cm_keys_load(path, &k, err, sizeof(err)), RI_ERR_PERMISSION);
    assert_null(k);
    assert_non_null(strstr(err, "writable by its group"));
    unlink(path);
    assert_int_not_equal(cm_keys_load(path, &k, err, sizeof(err)), RI_OK);
    assert_null(k);
}

/* The length-delimited form (gRPC metadata values are not NUL-terminated). */
static void test_bearer_n(void **state)
{
    (void)state;
    const char *t;
    size_t n;
    assert_true(cm_keys_bearer_n("Bearer abc", 10, &t, &n));
    assert_int_equal(n, 3);
    assert_memory_equal(t, "abc", 3);
    assert_true(cm_keys_bearer_n("bearer   xyz  ", 14, &t, &n));
    assert_int_equal(n, 3);
    assert_false(cm_keys_bearer_n("Basic abc", 9, &t, &n));
    assert_false(cm_keys_bearer_n("Bearer ", 7, &t, &n));
    assert_false(cm_keys_bearer_n("Bearer    ", 10, &t, &n));
    assert_false(cm_keys_bearer_n("Bear", 4, &t, &n));
    assert_false(cm_keys_bearer_n(NULL, 0, &t, &n));
    assert_false(cm_keys_bearer_n("Bearer a b", 10, &t, &n)); /* one token, then only blanks */
    assert_true(cm_keys_bearer_n("Bearer abcGARBAGE", 10, &t, &n)); /* length-delimited */
    assert_int_equal(n, 3);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_bearer_n),
        cmocka_unit_test(test_parse_and_match),
        cmocka_unit_test(test_refused),
        cmocka_unit_test(test_bearer),
        cmocka_unit_test(test_file_mode),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
