/* Status strings, names and areas. */
#include <errno.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <string.h>
#include <cmocka.h>

#include "common/cm_status.h"

static void test_every_code_has_text(void **state)
{
    const ri_status_t codes[] = {RI_OK, RI_ERR_INVALID, RI_ERR_NOMEM, RI_ERR_IO, RI_ERR_CORRUPT,
                                 RI_ERR_TRANSPORT, RI_ERR_DEVICE, RI_ERR_PROTOCOL, RI_ERR_TOO_LARGE,
                                 RI_ERR_QUOTA, RI_ERR_UNAUTHENTICATED, RI_ERR_PERMISSION};
    for (size_t i = 0; i < CM_ARRAY_LEN(codes); i++) {
        assert_string_not_equal(ri_status_str(codes[i]), "unknown status");
        assert_string_not_equal(ri_status_name(codes[i]), "RI_ERR_UNKNOWN");
    }
    assert_string_equal(ri_status_str((ri_status_t)-9999), "unknown status");
    assert_string_equal(ri_status_name(RI_ERR_QUOTA), "RI_ERR_QUOTA");
}

static void test_areas(void **state)
{
    assert_int_equal(ri_status_area(RI_OK), RI_AREA_OK);
    assert_int_equal(ri_status_area(RI_ERR_NOMEM), RI_AREA_GENERAL);
    assert_int_equal(ri_status_area(RI_ERR_NOSPACE), RI_AREA_IO);
    assert_int_equal(ri_status_area(RI_ERR_CONN_RESET), RI_AREA_TRANSPORT);
    assert_int_equal(ri_status_area(RI_ERR_NO_DEVICE), RI_AREA_DEVICE);
    assert_int_equal(ri_status_area(RI_ERR_BAD_MAGIC), RI_AREA_PROTOCOL);
    assert_int_equal(ri_status_area(RI_ERR_QUOTA), RI_AREA_QUOTA);
    assert_int_equal(ri_status_area(RI_ERR_PERMISSION), RI_AREA_AUTH);
}

static void test_errno(void **state)
{
    assert_int_equal(cm_status_from_errno(0), RI_OK);
    assert_int_equal(cm_status_from_errno(ENOSPC), RI_ERR_NOSPACE);
    assert_int_equal(cm_status_from_errno(ENOMEM), RI_ERR_NOMEM);
    assert_int_equal(cm_status_from_errno(ECONNREFUSED), RI_ERR_UNREACHABLE);
    assert_int_equal(cm_status_from_errno(EIO), RI_ERR_IO);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_every_code_has_text),
        cmocka_unit_test(test_areas),
        cmocka_unit_test(test_errno),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
