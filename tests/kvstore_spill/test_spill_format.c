/*
 * On-disk formats of the spill tier: record header and manifest round trips,
 * and rejection of bad magic, bad version, flipped bits and crafted counts.
 */
#include <setjmp.h>
#include <stdbool.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <cmocka.h>

#include "common/cm_alloc.h"
#include "common/cm_crc32c.h"
#include "kvstore/spill/kvs_spill_format.h"

static void test_record_roundtrip(void **state)
{
    uint8_t img[64 + 300];
    for (int i = 0; i < 300; i++)
        img[64 + i] = (uint8_t)(i * 7 + 1);
    kvs_spill_hdr_t h = {.dtype = 2, .tokens = 16, .session = 0x1122334455667788ull, .layer = 31, .head = 7,
                         .cluster = 123456, .payload_bytes = 300, .seq = 99};
    uint32_t crc = kvs_spill_hdr_encode(&h, img + 64, img);
    assert_memory_equal(img, "RISR", 4);
    kvs_spill_hdr_t d;
    assert_int_equal(kvs_spill_hdr_decode(img, &d), RI_OK);
    assert_int_equal(d.session, h.session);
    assert_int_equal(d.layer, 31);
    assert_int_equal(d.head, 7);
    assert_int_equal(d.cluster, 123456);
    assert_int_equal(d.payload_bytes, 300);
    assert_int_equal(d.tokens, 16);
    assert_int_equal(d.dtype, 2);
    assert_int_equal(d.seq, 99);
    assert_int_equal(d.crc, crc);
    assert_int_equal(kvs_spill_rec_verify(img, &d), RI_OK);
    /* Every single-bit flip in header or payload is caught. */
    for (size_t byte = 0; byte < sizeof(img); byte++) {
        if (byte >= 60 && byte < 64)
            continue;   /* the CRC field itself: checked against d.crc below */
        img[byte] ^= 0x10;
        kvs_spill_hdr_t x;
        bool caught = kvs_spill_hdr_decode(img, &x) != RI_OK || kvs_spill_rec_verify(img, &d) != RI_OK;
        assert_true(caught);
        img[byte] ^= 0x10;
    }
    img[61] ^= 1;
    assert_int_equal(kvs_spill_rec_verify(img, &d), RI_ERR_CORRUPT);
    img[61] ^= 1;
    img[0] = 'X';
    assert_int_equal(kvs_spill_hdr_decode(img, &d), RI_ERR_BAD_MAGIC);
    img[0] = 'R';
    img[4] = 9;
    assert_int_equal(kvs_spill_hdr_decode(img, &d), RI_ERR_BAD_VERSION);
    assert_int_equal(kvs_spill_rec_bytes(8192, 4096), 12288);
    assert_int_equal(kvs_spill_rec_bytes(4096, 4096), 8192);
    assert_int_equal(kvs_spill_rec_bytes(4032, 4096), 4096);
    assert_int_equal(kvs_spill_rec_bytes(8192, 512), 8704);
}

static void test_manifest_roundtrip(void **state)
{
    kvs_spill_mseg_t segs[2] = {{.id = 3, .valid_bytes = 12288}, {.id = 4, .valid_bytes = 0}};
    kvs_spill_mrec_t recs[3];
    memset(recs, 0, sizeof(recs));
    for (int i = 0; i < 3; i++) {
        recs[i].hdr = (kvs_spill_hdr_t){.dtype = 1, .tokens = 16, .session = 5, .layer = (uint32_t)i, .head = 1,
                                        .cluster = 10u + (uint32_t)i, .payload_bytes = 8192, .seq = 100u + (uint64_t)i,
                                        .crc = 0xABCD0000u + (uint32_t)i};
        recs[i].segment = 3;
        recs[i].offset = (uint64_t)i * 12288;
    }
    recs[2].flags = KVS_SPILL_MREC_LOST;
    kvs_spill_manifest_t m = {.align = 4096, .next_seq = 103, .next_segment_id = 5, .n_segments = 2,
                              .segments = segs, .n_records = 3, .records = recs};
    uint8_t *buf;
    size_t len;
    assert_int_equal(kvs_spill_manifest_encode(&m, &buf, &len), RI_OK);
    kvs_spill_manifest_t d;
    assert_int_equal(kvs_spill_manifest_decode(buf, len, &d), RI_OK);
    assert_int_equal(d.align, 4096);
    assert_int_equal(d.next_seq, 103);
    assert_int_equal(d.next_segment_id, 5);
    assert_int_equal(d.n_segments, 2);
    assert_int_equal(d.segments[0].valid_bytes, 12288);
    assert_int_equal(d.n_records, 3);
    for (int i = 0; i < 3; i++) {
        assert_int_equal(d.records[i].hdr.cluster, 10 + i);
        assert_int_equal(d.records[i].hdr.crc, 0xABCD0000u + (uint32_t)i);
        assert_int_equal(d.records[i].offset, (uint64_t)i * 12288);
    }
    assert_int_equal(d.records[2].flags, KVS_SPILL_MREC_LOST);
    kvs_spill_manifest_free(&d);

    /* Any flipped byte, a truncation, or crafted counts are refused. */
    for (size_t i = 0; i < len; i += 7) {
        buf[i] ^= 0x01;
        assert_int_not_equal(kvs_spill_manifest_decode(buf, len, &d), RI_OK);
        buf[i] ^= 0x01;
    }
    assert_int_not_equal(kvs_spill_manifest_decode(buf, len - 1, &d), RI_OK);
    assert_int_not_equal(kvs_spill_manifest_decode(buf, 10, &d), RI_OK);
    cm_free(buf);

    kvs_spill_manifest_t big = {.align = 4096, .n_segments = 0, .n_records = 0};
    assert_int_equal(kvs_spill_manifest_encode(&big, &buf, &len), RI_OK);
    /* Claim 2^60 records and fix the CRC: the length check must refuse it. */
    buf[24 + 7] = 0x10;
    uint32_t crc = cm_crc32c(0, buf, len - 4);
    for (int i = 0; i < 4; i++)
        buf[len - 4 + (size_t)i] = (uint8_t)(crc >> (8 * i));
    assert_int_equal(kvs_spill_manifest_decode(buf, len, &d), RI_ERR_FORMAT);
    cm_free(buf);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_record_roundtrip),
        cmocka_unit_test(test_manifest_roundtrip),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
