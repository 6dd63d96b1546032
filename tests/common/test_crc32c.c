/* CRC32C against published check values (RFC 3720 appendix B.4). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>
#include <cmocka.h>

#include "common/cm_crc32c.h"

static void test_check_value(void **state)
{
    assert_int_equal(cm_crc32c(0, "123456789", 9), 0xE3069283u);
    assert_int_equal(cm_crc32c(0, "", 0), 0u);
}

static void test_rfc3720_vectors(void **state)
{
    uint8_t buf[32];
    memset(buf, 0, sizeof(buf));
    assert_int_equal(cm_crc32c(0, buf, 32), 0x8A9136AAu);
    memset(buf, 0xff, sizeof(buf));
    assert_int_equal(cm_crc32c(0, buf, 32), 0x62A8AB43u);
    for (int i = 0; i < 32; i++)
        buf[i] = (uint8_t)i;
    assert_int_equal(cm_crc32c(0, buf, 32), 0x46DD794Eu);
    for (int i = 0; i < 32; i++)
        buf[i] = (uint8_t)(31 - i);
    assert_int_equal(cm_crc32c(0, buf, 32), 0x113FDB5Cu);
}

static void test_incremental(void **state)
{
    const char *s = "The quick brown fox jumps over the lazy dog";
    size_t n = strlen(s);
    uint32_t whole = cm_crc32c(0, s, n);
    for (size_t cut = 0; cut <= n; cut++)
        assert_int_equal(cm_crc32c(cm_crc32c(0, s, cut), s + cut, n - cut), whole);
    assert_int_equal(whole, 0x22620404u);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_check_value),
        cmocka_unit_test(test_rfc3720_vectors),
        cmocka_unit_test(test_incremental),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
