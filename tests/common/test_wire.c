/* Wire header: round trip and every rejection path. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>
#include <cmocka.h>

#include "common/cm_wire.h"

static const cm_wire_limits_t limits = {.max_meta_len = 4096, .max_data_len = 1u << 20};

static cm_wire_hdr_t sample(void)
{
    cm_wire_hdr_t h = {.magic = CM_WIRE_MAGIC, .version = CM_WIRE_VERSION, .op = CM_WIRE_OP_FETCH_RANKED,
                       .session_id = 0x1122334455667788ull, .request_id = 42, .meta_len = 16, .data_len = 100};
    for (int i = 0; i < 16; i++)
        h.secret[i] = (uint8_t)(i * 7 + 1);
    return h;
}

static void test_round_trip(void **state)
{
    uint8_t buf[CM_WIRE_HDR_SIZE];
    cm_wire_hdr_t h = sample(), out;
    cm_wire_encode(&h, buf);
    assert_memory_equal(buf, "RIDP", 4);
    assert_int_equal(cm_wire_decode(buf, sizeof(buf), 64 + 16 + 100, &limits, &out), RI_OK);
    assert_int_equal(out.session_id, h.session_id);
    assert_int_equal(out.request_id, 42);
    assert_int_equal(out.meta_len, 16);
    assert_int_equal(out.data_len, 100);
    assert_memory_equal(out.secret, h.secret, 16);
    assert_int_equal(cm_wire_decode(buf, sizeof(buf), 0, &limits, &out), RI_OK);
}

static void test_rejections(void **state)
{
    uint8_t buf[CM_WIRE_HDR_SIZE];
    cm_wire_hdr_t h = sample(), out;
    memset(&out, 0xab, sizeof(out));
    cm_wire_hdr_t untouched = out;

    cm_wire_encode(&h, buf);
    /* truncated header */
    for (size_t n = 0; n < CM_WIRE_HDR_SIZE; n++)
        assert_int_equal(cm_wire_decode(buf, n, 0, &limits, &out), RI_ERR_TRUNCATED);
    assert_int_equal(cm_wire_decode(NULL, 64, 0, &limits, &out), RI_ERR_TRUNCATED);
    /* message shorter than lengths claim, longer than they claim */
    assert_int_equal(cm_wire_decode(buf, 64, 64 + 16 + 99, &limits, &out), RI_ERR_TRUNCATED);
    assert_int_equal(cm_wire_decode(buf, 64, 64 + 16 + 101, &limits, &out), RI_ERR_PROTOCOL);
    /* wrong magic and version */
    buf[0] ^= 1;
    assert_int_equal(cm_wire_decode(buf, 64, 0, &limits, &out), RI_ERR_BAD_MAGIC);
    buf[0] ^= 1;
    h.version = 2;
    cm_wire_encode(&h, buf);
    assert_int_equal(cm_wire_decode(buf, 64, 0, &limits, &out), RI_ERR_BAD_VERSION);
    /* unknown op, unknown flags, reserved bits, status in a request */
    h = sample();
    h.op = 0;
    cm_wire_encode(&h, buf);
    assert_int_equal(cm_wire_decode(buf, 64, 0, &limits, &out), RI_ERR_PROTOCOL);
    h.op = CM_WIRE_OP_MAX + 1;
    cm_wire_encode(&h, buf);
    assert_int_equal(cm_wire_decode(buf, 64, 0, &limits, &out), RI_ERR_PROTOCOL);
    h = sample();
    h.flags = 0x80;
    cm_wire_encode(&h, buf);
    assert_int_equal(cm_wire_decode(buf, 64, 0, &limits, &out), RI_ERR_PROTOCOL);
    h = sample();
    h.reserved = 1;
    cm_wire_encode(&h, buf);
    assert_int_equal(cm_wire_decode(buf, 64, 0, &limits, &out), RI_ERR_PROTOCOL);
    h = sample();
    h.status = -1;
    cm_wire_encode(&h, buf);
    assert_int_equal(cm_wire_decode(buf, 64, 0, &limits, &out), RI_ERR_PROTOCOL);
    /* oversize lengths, including ones that would overflow a sum */
    h = sample();
    h.data_len = UINT64_MAX;
    cm_wire_encode(&h, buf);
    assert_int_equal(cm_wire_decode(buf, 64, 0, &limits, &out), RI_ERR_TOO_LARGE);
    assert_int_equal(cm_wire_decode(buf, 64, 64 + 16, NULL, &out), RI_ERR_TRUNCATED);
    h = sample();
    h.meta_len = 0xffffffffu;
    cm_wire_encode(&h, buf);
    assert_int_equal(cm_wire_decode(buf, 64, 0, &limits, &out), RI_ERR_TOO_LARGE);
    /* the output was never written on failure */
    assert_memory_equal(&out, &untouched, sizeof(out));
}

static void test_secret_compare(void **state)
{
    uint8_t a[16] = {1, 2, 3}, b[16] = {1, 2, 3};
    assert_true(cm_wire_secret_equal(a, b));
    b[15] = 1;
    assert_false(cm_wire_secret_equal(a, b));
}

static void test_random(void **state)
{
    uint8_t a[16] = {0}, b[16] = {0};
    assert_int_equal(cm_random_bytes(a, 16), RI_OK);
    assert_int_equal(cm_random_bytes(b, 16), RI_OK);
    assert_memory_not_equal(a, b, 16);
    assert_string_equal(cm_wire_op_name(CM_WIRE_OP_FETCH_RANKED), "FETCH_RANKED");
    assert_string_equal(cm_wire_op_name(99), "UNKNOWN");
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_round_trip),
        cmocka_unit_test(test_rejections),
        cmocka_unit_test(test_secret_compare),
        cmocka_unit_test(test_random),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
