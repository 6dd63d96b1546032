/* cm_file_read: whole small files, limits, missing files. */
#define _GNU_SOURCE
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <cmocka.h>

#include "common/cm_alloc.h"
#include "common/cm_file.h"

static void test_read(void **state)
{
    (void)state;
    char path[] = "/tmp/ri-cm-file-XXXXXX";
    int fd = mkstemp(path);
    assert_true(fd >= 0);
    assert_int_equal(write(fd, "hello\0world", 11), 11);
    close(fd);
    char *buf = NULL;
    size_t len = 0;
    assert_int_equal(cm_file_read(path, 100, &buf, &len), RI_OK);
    assert_int_equal(len, 11);
    assert_memory_equal(buf, "hello\0world", 12); /* NUL-terminated too */
    cm_free(buf);
    buf = (char *)0x1;
    assert_int_equal(cm_file_read(path, 10, &buf, &len), RI_ERR_TOO_LARGE);
    assert_ptr_equal(buf, (char *)0x1); /* untouched on error */
    unlink(path);
    assert_int_equal(cm_file_read(path, 100, &buf, NULL), RI_ERR_NOT_FOUND);
    /* empty file */
    strcpy(path, "/tmp/ri-cm-file-XXXXXX");
    fd = mkstemp(path);
    assert_true(fd >= 0);
    close(fd);
    assert_int_equal(cm_file_read(path, 100, &buf, &len), RI_OK);
    assert_int_equal(len, 0);
    assert_string_equal(buf, "");
    cm_free(buf);
    unlink(path);
}

int main(void)
{
    const struct CMUnitTest tests[] = {cmocka_unit_test(test_read)};
    return cmocka_run_group_tests(tests, NULL, NULL);
}
