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

/* Write text to a fresh temporary file; its path goes into path (24 bytes). */
static void tmp_with(char *path, const char *text)
{
    strcpy(path, "/tmp/ri-cm-file-XXXXXX");
    int fd = mkstemp(path);
    assert_true(fd >= 0);
    assert_int_equal(write(fd, text, strlen(text)), (ssize_t)strlen(text));
    close(fd);
}

static void test_read_token(void **state)
{
    (void)state;
    char path[24], tok[16];
    /* a kvstore tokens file: comments and blanks skipped, first word taken */
    tmp_with(path, "# TOKEN TENANT\n\n  \t\r\n  abc123 team-a 1GiB admin\nzzz other\n");
    assert_int_equal(cm_file_read_token(path, tok, sizeof(tok)), RI_OK);
    assert_string_equal(tok, "abc123");
    unlink(path);
    /* one bare token, CRLF */
    tmp_with(path, "s3cret\r\n");
    assert_int_equal(cm_file_read_token(path, tok, sizeof(tok)), RI_OK);
    assert_string_equal(tok, "s3cret");
    unlink(path);
    /* too long for the buffer: error, buffer untouched */
    tmp_with(path, "0123456789abcdef\n");
    strcpy(tok, "keep");
    assert_int_equal(cm_file_read_token(path, tok, sizeof(tok)), RI_ERR_TOO_LARGE);
    assert_string_equal(tok, "keep");
    unlink(path);
    /* nothing but comments */
    tmp_with(path, "# only a comment\n\n");
    assert_int_equal(cm_file_read_token(path, tok, sizeof(tok)), RI_ERR_FORMAT);
    unlink(path);
    assert_int_equal(cm_file_read_token(path, tok, sizeof(tok)), RI_ERR_NOT_FOUND); /* gone */
}

int main(void)
{
    const struct CMUnitTest tests[] = {cmocka_unit_test(test_read), cmocka_unit_test(test_read_token)};
    return cmocka_run_group_tests(tests, NULL, NULL);
}
