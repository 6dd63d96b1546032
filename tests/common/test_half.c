/* fp16/bf16: exhaustive fp16 round trip, special values, rounding, bulk == scalar. */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <cmocka.h>

#include "common/cm_half.h"

static void test_fp16_every_value_round_trips(void **state)
{
    for (uint32_t h = 0; h < 65536; h++) {
        float f = cm_fp16_to_f32((cm_fp16_t)h);
        cm_fp16_t back = cm_f32_to_fp16(f);
        if (isnan(f)) {
            assert_true((back & 0x7c00) == 0x7c00 && (back & 0x3ff) != 0);
            continue;
        }
        assert_int_equal(back, h);
    }
}

static void test_fp16_specials(void **state)
{
    assert_int_equal(cm_f32_to_fp16(INFINITY), 0x7c00);
    assert_int_equal(cm_f32_to_fp16(-INFINITY), 0xfc00);
    assert_int_equal(cm_f32_to_fp16(65504.0f), 0x7bff);
    assert_int_equal(cm_f32_to_fp16(65520.0f), 0x7c00);      /* overflow rounds to inf */
    assert_int_equal(cm_f32_to_fp16(65519.0f), 0x7bff);
    assert_int_equal(cm_f32_to_fp16(-0.0f), 0x8000);
    assert_int_equal(cm_f32_to_fp16(5.9604645e-08f), 0x0001); /* smallest subnormal */
    assert_int_equal(cm_f32_to_fp16(2.9802322e-08f), 0x0000); /* half of it ties to even (0) */
    assert_int_equal(cm_f32_to_fp16(8.940697e-08f), 0x0002);  /* 1.5 ulp ties to even (2) */
    assert_int_equal(cm_f32_to_fp16(6.097555e-05f), 0x03ff);  /* largest subnormal */
    assert_int_equal(cm_f32_to_fp16(6.1035156e-05f), 0x0400); /* smallest normal */
    assert_true(isnan(cm_fp16_to_f32(cm_f32_to_fp16(NAN))));
    assert_true(cm_fp16_to_f32(0x0001) == 5.9604645e-08f);
    assert_true(cm_fp16_to_f32(0x3c00) == 1.0f);
    /* 1 + 2^-11 is a tie between 1 and 1+2^-10: even is 1.0 */
    assert_int_equal(cm_f32_to_fp16(1.0f + 1.0f / 2048.0f), 0x3c00);
    assert_int_equal(cm_f32_to_fp16(1.0f + 3.0f / 2048.0f), 0x3c02);
}

static void test_bf16(void **state)
{
    assert_int_equal(cm_f32_to_bf16(1.0f), 0x3f80);
    assert_int_equal(cm_f32_to_bf16(INFINITY), 0x7f80);
    assert_int_equal(cm_f32_to_bf16(-INFINITY), 0xff80);
    assert_true(isnan(cm_bf16_to_f32(cm_f32_to_bf16(NAN))));
    /* subnormal fp32 stays representable */
    float sub = 1.0e-39f;
    assert_true(fabsf(cm_bf16_to_f32(cm_f32_to_bf16(sub)) - sub) <= 4.6e-41f);
    for (uint32_t h = 0; h < 65536; h++) {
        float f = cm_bf16_to_f32((cm_bf16_t)h);
        if (!isnan(f))
            assert_int_equal(cm_f32_to_bf16(f), h);
    }
}

static void test_bulk_matches_scalar(void **state)
{
    enum { N = 1003 };
    float src[N], back[N];
    cm_fp16_t h[N];
    srand(12345);
    for (int i = 0; i < N; i++)
        src[i] = ((float)rand() / (float)RAND_MAX - 0.5f) * (float)(1 << (i % 20));
    src[0] = INFINITY;
    src[1] = 1e-7f;
    src[2] = 70000.0f;
    cm_f32_to_fp16_n(h, src, N);
    for (int i = 0; i < N; i++)
        assert_int_equal(h[i], cm_f32_to_fp16(src[i]));
    cm_fp16_to_f32_n(back, h, N);
    for (int i = 0; i < N; i++)
        assert_true(back[i] == cm_fp16_to_f32(h[i]));
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_fp16_every_value_round_trips),
        cmocka_unit_test(test_fp16_specials),
        cmocka_unit_test(test_bf16),
        cmocka_unit_test(test_bulk_matches_scalar),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
