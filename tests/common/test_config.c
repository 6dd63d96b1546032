/* Config tables: defaults, file, environment, flags, bad values, precedence. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <fcntl.h>
#include <unistd.h>
#include <cmocka.h>

#include "common/cm_config.h"

typedef struct test_cfg {
    uint64_t memory;
    int64_t threads;
    double ratio;
    bool hugepages;
    char *listen;
} test_cfg_t;

static const cm_config_item_t items[] = {
    {"memory", CM_CFG_SIZE, "1GiB", "pool size", offsetof(test_cfg_t, memory), 0, 0, NULL},
    {"threads", CM_CFG_INT, "2", "serving threads", offsetof(test_cfg_t, threads), 1, 64, NULL},
    {"ratio", CM_CFG_DOUBLE, "0.9", "high-water mark", offsetof(test_cfg_t, ratio), 0, 1, NULL},
    {"hugepages", CM_CFG_BOOL, "true", "use hugepages", offsetof(test_cfg_t, hugepages), 0, 0, NULL},
    {"listen-addr", CM_CFG_STRING, "127.0.0.1:0", "address", offsetof(test_cfg_t, listen), 0, 0, NULL},
};
static const cm_config_table_t table = {"test", "RI_TEST_", items, 5, 2, "[A [B]]"};
static const cm_config_table_t no_args_table = {"test", "RI_TEST_", items, 5, 0, NULL};

static void test_defaults(void **state)
{
    test_cfg_t c;
    char err[256];
    assert_int_equal(cm_config_defaults(&table, &c, err, sizeof(err)), RI_OK);
    assert_int_equal(c.memory, 1ull << 30);
    assert_int_equal(c.threads, 2);
    assert_true(c.ratio == 0.9);
    assert_true(c.hugepages);
    assert_string_equal(c.listen, "127.0.0.1:0");
    cm_config_free(&table, &c);
}

static void test_sizes(void **state)
{
    uint64_t v;
    assert_int_equal(cm_config_parse_size("8GiB", &v), RI_OK);
    assert_int_equal(v, 8ull << 30);
    assert_int_equal(cm_config_parse_size("64k", &v), RI_OK);
    assert_int_equal(v, 65536);
    assert_int_equal(cm_config_parse_size("2GB", &v), RI_OK);
    assert_int_equal(v, 2000000000ull);
    assert_int_equal(cm_config_parse_size("1.5MiB", &v), RI_OK);
    assert_int_equal(v, 1572864);
    assert_int_equal(cm_config_parse_size("12XB", &v), RI_ERR_INVALID);
    assert_int_equal(cm_config_parse_size("-1", &v), RI_ERR_INVALID);
    assert_int_equal(cm_config_parse_size("", &v), RI_ERR_INVALID);
    assert_int_equal(cm_config_parse_size("99999999999TiB", &v), RI_ERR_INVALID);
}

static void test_bad_values_change_nothing(void **state)
{
    test_cfg_t c;
    char err[256];
    cm_config_defaults(&table, &c, err, sizeof(err));
    assert_int_equal(cm_config_set(&table, &c, "threads", "abc", "t", err, sizeof(err)), RI_ERR_INVALID);
    assert_non_null(strstr(err, "threads"));
    assert_int_equal(cm_config_set(&table, &c, "threads", "1000", "t", err, sizeof(err)), RI_ERR_RANGE);
    assert_int_equal(cm_config_set(&table, &c, "ratio", "1.5", "t", err, sizeof(err)), RI_ERR_RANGE);
    assert_int_equal(cm_config_set(&table, &c, "ratio", "nan", "t", err, sizeof(err)), RI_ERR_INVALID);
    assert_int_equal(cm_config_set(&table, &c, "hugepages", "maybe", "t", err, sizeof(err)), RI_ERR_INVALID);
    assert_int_equal(cm_config_set(&table, &c, "nope", "1", "t", err, sizeof(err)), RI_ERR_INVALID);
    assert_non_null(strstr(err, "unknown setting"));
    assert_int_equal(c.threads, 2);
    assert_true(c.ratio == 0.9);
    assert_true(c.hugepages);
    cm_config_free(&table, &c);
}

static void test_precedence(void **state)
{
    test_cfg_t c;
    char err[256], path[] = "/tmp/ri_cfg_XXXXXX";
    cm_config_result_t res;
    int fd = mkstemp(path);
    assert_true(fd >= 0);
    const char *ini = "[kvstore]\nmemory = 2GiB\nthreads = 4\nlisten_addr = 0.0.0.0:1\n";
    assert_int_equal(write(fd, ini, strlen(ini)), (ssize_t)strlen(ini));
    close(fd);
    setenv("RI_TEST_THREADS", "8", 1);
    setenv("RI_TEST_LISTEN_ADDR", "127.0.0.2:5", 1);
    char *argv[] = {"prog", "--config", path, "--listen-addr=127.0.0.3:6", "--no-hugepages", "--ratio", "0.5",
                    "--dump-config", "pos1", NULL};
    assert_int_equal(cm_config_load(&table, &c, 9, argv, &res, err, sizeof(err)), RI_OK);
    assert_int_equal(c.memory, 2ull << 30);        /* file */
    assert_int_equal(c.threads, 8);               /* env over file */
    assert_string_equal(c.listen, "127.0.0.3:6"); /* flag over env */
    assert_false(c.hugepages);
    assert_true(c.ratio == 0.5);
    assert_true(res.dump);
    assert_int_equal(res.first_arg, 8);
    FILE *devnull = fopen("/dev/null", "w");
    cm_config_dump(&table, &c, devnull);
    cm_config_usage(&table, devnull);
    fclose(devnull);
    cm_config_free(&table, &c);
    unsetenv("RI_TEST_THREADS");
    unsetenv("RI_TEST_LISTEN_ADDR");

    char *bad[] = {"prog", "--threads", NULL};
    assert_int_equal(cm_config_load(&table, &c, 2, bad, &res, err, sizeof(err)), RI_ERR_INVALID);
    assert_non_null(strstr(err, "needs a value"));
    cm_config_free(&table, &c);
    char *unk[] = {"prog", "--frobnicate=1", NULL};
    assert_int_equal(cm_config_load(&table, &c, 2, unk, &res, err, sizeof(err)), RI_ERR_INVALID);
    cm_config_free(&table, &c);
    char *nofile[] = {"prog", "--config=/nonexistent/ri.ini", NULL};
    assert_int_equal(cm_config_load(&table, &c, 2, nofile, &res, err, sizeof(err)), RI_ERR_NOT_FOUND);
    cm_config_free(&table, &c);

    /* a file with a bad value names the file */
    fd = open(path, O_WRONLY | O_TRUNC);
    const char *badini = "threads = lots\n";
    assert_int_equal(write(fd, badini, strlen(badini)), (ssize_t)strlen(badini));
    close(fd);
    assert_int_equal(cm_config_load_file(&table, &c, path, err, sizeof(err)), RI_ERR_INVALID);
    assert_non_null(strstr(err, path));
    cm_config_free(&table, &c);
    unlink(path);
}

/* A stray argument among the flags is an error that names it; positional
 * arguments after every flag, or after "--", are fine. */
static void test_stray_argument(void **state)
{
    test_cfg_t c;
    char err[256];
    cm_config_result_t res;
    (void)state;
    char *stray[] = {"prog", "--hugepages", "extra", "--threads", "8", NULL};
    assert_int_equal(cm_config_load(&table, &c, 5, stray, &res, err, sizeof(err)), RI_ERR_INVALID);
    assert_non_null(strstr(err, "'extra'"));
    assert_non_null(strstr(err, "--threads"));
    cm_config_free(&table, &c);
    /* a boolean flag followed by a boolean word: the writer meant its value */
    const char *words[] = {"false", "true", "no", "on", "0"};
    for (size_t w = 0; w < sizeof(words) / sizeof(words[0]); w++) {
        char *boolword[] = {"prog", "--hugepages", (char *)words[w], NULL};
        assert_int_equal(cm_config_load(&table, &c, 3, boolword, &res, err, sizeof(err)), RI_ERR_INVALID);
        assert_non_null(strstr(err, "--hugepages="));
        cm_config_free(&table, &c);
    }
    char *boolok[] = {"prog", "--no-hugepages", "--hugepages=false", "pos", NULL};
    assert_int_equal(cm_config_load(&table, &c, 4, boolok, &res, err, sizeof(err)), RI_OK);
    assert_false(c.hugepages);
    cm_config_free(&table, &c);
    /* more positional arguments than the program takes, each named */
    char *three[] = {"prog", "a", "b", "c", NULL};
    assert_int_equal(cm_config_load(&table, &c, 4, three, &res, err, sizeof(err)), RI_ERR_INVALID);
    assert_non_null(strstr(err, "'c'"));
    cm_config_free(&table, &c);
    char *one[] = {"prog", "--threads=2", "lonely", NULL};
    assert_int_equal(cm_config_load(&no_args_table, &c, 3, one, &res, err, sizeof(err)), RI_ERR_INVALID);
    assert_non_null(strstr(err, "'lonely'"));
    assert_non_null(strstr(err, "no arguments"));
    cm_config_free(&table, &c);
    char *tail[] = {"prog", "--threads", "3", "a", "b", NULL};
    assert_int_equal(cm_config_load(&table, &c, 5, tail, &res, err, sizeof(err)), RI_OK);
    assert_int_equal(res.first_arg, 3);
    assert_int_equal(c.threads, 3);
    cm_config_free(&table, &c);
    char *dashdash[] = {"prog", "--", "x", "--not-a-flag", NULL};
    assert_int_equal(cm_config_load(&table, &c, 4, dashdash, &res, err, sizeof(err)), RI_OK);
    assert_int_equal(res.first_arg, 2);
    cm_config_free(&table, &c);
}

/* An item's env_alias is read when PREFIX + NAME is unset, and loses to it
 * and to flags; "~/" in a text value gets $HOME. */
typedef struct alias_cfg {
    int64_t threads;
    char *dir;
} alias_cfg_t;

static const cm_config_item_t alias_items[] = {
    {"threads", CM_CFG_INT, "0", "threads", offsetof(alias_cfg_t, threads), 0, 64, "RI_TEST_ALIAS_THREADS"},
    {"dir", CM_CFG_STRING, "~/models", "a directory", offsetof(alias_cfg_t, dir), 0, 0, NULL},
};
static const cm_config_table_t alias_table = {"test", "RI_TEST_", alias_items, 2, 0, NULL};

static void test_env_alias_and_home(void **state)
{
    alias_cfg_t c;
    cm_config_result_t res;
    char err[256];
    char *argv[] = {"prog", NULL};
    char *flag[] = {"prog", "--threads=5", NULL};

    setenv("HOME", "/home/tester", 1);
    setenv("RI_TEST_ALIAS_THREADS", "3", 1);
    assert_int_equal(cm_config_load(&alias_table, &c, 1, argv, &res, err, sizeof(err)), RI_OK);
    assert_int_equal(c.threads, 3);                       /* the alias */
    assert_string_equal(c.dir, "/home/tester/models");    /* "~/" expanded */
    cm_config_free(&alias_table, &c);

    setenv("RI_TEST_THREADS", "4", 1);
    assert_int_equal(cm_config_load(&alias_table, &c, 1, argv, &res, err, sizeof(err)), RI_OK);
    assert_int_equal(c.threads, 4);                       /* the prefixed name wins */
    cm_config_free(&alias_table, &c);
    assert_int_equal(cm_config_load(&alias_table, &c, 2, flag, &res, err, sizeof(err)), RI_OK);
    assert_int_equal(c.threads, 5);                       /* flags win */
    cm_config_free(&alias_table, &c);
    unsetenv("RI_TEST_THREADS");

    setenv("RI_TEST_ALIAS_THREADS", "99", 1);             /* a bad alias value names the variable */
    assert_int_equal(cm_config_load(&alias_table, &c, 1, argv, &res, err, sizeof(err)), RI_ERR_RANGE);
    assert_non_null(strstr(err, "RI_TEST_ALIAS_THREADS"));
    unsetenv("RI_TEST_ALIAS_THREADS");
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_env_alias_and_home),
        cmocka_unit_test(test_defaults),
        cmocka_unit_test(test_sizes),
        cmocka_unit_test(test_bad_values_change_nothing),
        cmocka_unit_test(test_precedence),
        cmocka_unit_test(test_stray_argument),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
