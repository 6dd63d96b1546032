/*
 * Encoding and checking of spill records and the manifest (layouts in
 * kvs_spill_format.h).  Explicit little-endian byte access, so files move
 * between hosts and no struct padding leaks onto disk.
 */
#include "kvstore/spill/kvs_spill_format.h"

#include <string.h>

#include "common/cm_alloc.h"
#include "common/cm_crc32c.h"
#include "common/cm_status.h"

static CM_ALLOC_TAG(kvs_fmt_tag, "kvs.spill.manifest");

static void put16(uint8_t *p, uint16_t v)
{
    p[0] = (uint8_t)v;
    p[1] = (uint8_t)(v >> 8);
}

static void put32(uint8_t *p, uint32_t v)
{
    for (int i = 0; i < 4; i++)
        p[i] = (uint8_t)(v >> (8 * i));
}

static void put64(uint8_t *p, uint64_t v)
{
    for (int i = 0; i < 8; i++)
        p[i] = (uint8_t)(v >> (8 * i));
}

static uint16_t get16(const uint8_t *p) { return (uint16_t)(p[0] | (p[1] << 8)); }

static uint32_t get32(const uint8_t *p)
{
    return (uint32_t)p[0] | ((uint32_t)p[1] << 8) | ((uint32_t)p[2] << 16) | ((uint32_t)p[3] << 24);
}

static uint64_t get64(const uint8_t *p) { return (uint64_t)get32(p) | ((uint64_t)get32(p + 4) << 32); }

uint64_t kvs_spill_rec_bytes(uint32_t payload_bytes, uint32_t align)
{
    return CM_ALIGN_UP((uint64_t)KVS_SPILL_HDR_BYTES + payload_bytes, (uint64_t)align);
}

uint32_t kvs_spill_hdr_encode(const kvs_spill_hdr_t *h, const void *payload, uint8_t out[KVS_SPILL_HDR_BYTES])
{
    memset(out, 0, KVS_SPILL_HDR_BYTES);
    put32(out + 0, KVS_SPILL_REC_MAGIC);
    put16(out + 4, KVS_SPILL_REC_VERSION);
    put16(out + 6, KVS_SPILL_HDR_BYTES);
    put16(out + 8, h->dtype);
    put16(out + 10, 0);
    put32(out + 12, h->tokens);
    put64(out + 16, h->session);
    put32(out + 24, h->layer);
    put32(out + 28, h->head);
    put32(out + 32, h->cluster);
    put32(out + 36, h->payload_bytes);
    put64(out + 40, h->seq);
    uint32_t crc = cm_crc32c(0, out, 60);
    crc = cm_crc32c(crc, payload, h->payload_bytes);
    put32(out + 60, crc);
    return crc;
}

ri_status_t kvs_spill_hdr_decode(const uint8_t in[KVS_SPILL_HDR_BYTES], kvs_spill_hdr_t *h_p)
{
    if (get32(in) != KVS_SPILL_REC_MAGIC)
        return RI_ERR_BAD_MAGIC;
    if (get16(in + 4) != KVS_SPILL_REC_VERSION)
        return RI_ERR_BAD_VERSION;
    if (get16(in + 6) != KVS_SPILL_HDR_BYTES || get16(in + 10) != 0)
        return RI_ERR_FORMAT;
    kvs_spill_hdr_t h = {
        .dtype = get16(in + 8),
        .tokens = get32(in + 12),
        .session = get64(in + 16),
        .layer = get32(in + 24),
        .head = get32(in + 28),
        .cluster = get32(in + 32),
        .payload_bytes = get32(in + 36),
        .seq = get64(in + 40),
        .crc = get32(in + 60),
    };
    *h_p = h;
    return RI_OK;
}

ri_status_t kvs_spill_rec_verify(const uint8_t *image, const kvs_spill_hdr_t *h)
{
    uint32_t crc = cm_crc32c(0, image, 60);
    crc = cm_crc32c(crc, image + KVS_SPILL_HDR_BYTES, h->payload_bytes);
    return crc == get32(image + 60) && crc == h->crc ? RI_OK : RI_ERR_CORRUPT;
}

/* ---- manifest ---- */

ri_status_t kvs_spill_manifest_encode(const kvs_spill_manifest_t *m, uint8_t **buf_p, size_t *len_p)
{
    size_t len = KVS_SPILL_MAN_HDR_BYTES + m->n_segments * KVS_SPILL_MAN_SEG_BYTES +
                 m->n_records * KVS_SPILL_MAN_REC_BYTES + 4;
    uint8_t *buf = cm_calloc(&kvs_fmt_tag, 1, len);
    if (buf == NULL)
        return RI_ERR_NOMEM;
    uint8_t *p = buf;
    put32(p + 0, KVS_SPILL_MAN_MAGIC);
    put32(p + 4, KVS_SPILL_MAN_VERSION);
    put32(p + 8, m->align);
    put32(p + 12, m->next_segment_id);
    put64(p + 16, m->n_segments);
    put64(p + 24, m->n_records);
    put64(p + 32, m->next_seq);
    p += KVS_SPILL_MAN_HDR_BYTES;
    for (size_t i = 0; i < m->n_segments; i++, p += KVS_SPILL_MAN_SEG_BYTES) {
        put32(p + 0, m->segments[i].id);
        put64(p + 8, m->segments[i].valid_bytes);
    }
    for (size_t i = 0; i < m->n_records; i++, p += KVS_SPILL_MAN_REC_BYTES) {
        const kvs_spill_mrec_t *r = &m->records[i];
        put16(p + 0, r->hdr.dtype);
        put32(p + 4, r->hdr.tokens);
        put64(p + 8, r->hdr.session);
        put32(p + 16, r->hdr.layer);
        put32(p + 20, r->hdr.head);
        put32(p + 24, r->hdr.cluster);
        put32(p + 28, r->hdr.payload_bytes);
        put64(p + 32, r->hdr.seq);
        put32(p + 40, r->hdr.crc);
        put32(p + 44, r->segment);
        put64(p + 48, r->offset);
        put32(p + 56, r->flags);
    }
    put32(p, cm_crc32c(0, buf, (size_t)(p - buf)));
    *buf_p = buf;
    *len_p = len;
    return RI_OK;
}

ri_status_t kvs_spill_manifest_decode(const uint8_t *buf, size_t len, kvs_spill_manifest_t *m_p)
{
    if (len < KVS_SPILL_MAN_HDR_BYTES + 4)
        return RI_ERR_FORMAT;
    if (get32(buf) != KVS_SPILL_MAN_MAGIC)
        return RI_ERR_BAD_MAGIC;
    if (get32(buf + 4) != KVS_SPILL_MAN_VERSION)
        return RI_ERR_BAD_VERSION;
    if (cm_crc32c(0, buf, len - 4) != get32(buf + len - 4))
        return RI_ERR_CORRUPT;
    kvs_spill_manifest_t m = {
        .align = get32(buf + 8),
        .next_segment_id = get32(buf + 12),
        .n_segments = get64(buf + 16),
        .n_records = get64(buf + 24),
        .next_seq = get64(buf + 32),
    };
    /* Bound the counts by the length before multiplying, so a crafted file
     * cannot overflow the size check. */
    if (m.n_segments > len / KVS_SPILL_MAN_SEG_BYTES || m.n_records > len / KVS_SPILL_MAN_REC_BYTES ||
        KVS_SPILL_MAN_HDR_BYTES + m.n_segments * KVS_SPILL_MAN_SEG_BYTES + m.n_records * KVS_SPILL_MAN_REC_BYTES +
                4 != len)
        return RI_ERR_FORMAT;
    m.segments = cm_calloc(&kvs_fmt_tag, m.n_segments ? m.n_segments : 1, sizeof(*m.segments));
    m.records = cm_calloc(&kvs_fmt_tag, m.n_records ? m.n_records : 1, sizeof(*m.records));
    if (m.segments == NULL || m.records == NULL) {
        kvs_spill_manifest_free(&m);
        return RI_ERR_NOMEM;
    }
    const uint8_t *p = buf + KVS_SPILL_MAN_HDR_BYTES;
    for (size_t i = 0; i < m.n_segments; i++, p += KVS_SPILL_MAN_SEG_BYTES) {
        m.segments[i].id = get32(p);
        m.segments[i].valid_bytes = get64(p + 8);
    }
    for (size_t i = 0; i < m.n_records; i++, p += KVS_SPILL_MAN_REC_BYTES) {
        kvs_spill_mrec_t *r = &m.records[i];
        r->hdr.dtype = get16(p + 0);
        r->hdr.tokens = get32(p + 4);
        r->hdr.session = get64(p + 8);
        r->hdr.layer = get32(p + 16);
        r->hdr.head = get32(p + 20);
        r->hdr.cluster = get32(p + 24);
        r->hdr.payload_bytes = get32(p + 28);
        r->hdr.seq = get64(p + 32);
        r->hdr.crc = get32(p + 40);
        r->segment = get32(p + 44);
        r->offset = get64(p + 48);
        r->flags = get32(p + 56);
    }
    *m_p = m;
    return RI_OK;
}

void kvs_spill_manifest_free(kvs_spill_manifest_t *m)
{
    if (m == NULL)
        return;
    cm_free(m->segments);
    cm_free(m->records);
    m->segments = NULL;
    m->records = NULL;
}
