/*
 * On-disk formats of the spill tier: the record header and the manifest.
 * Both are little-endian, carry a magic number and a version, and are covered
 * by CRC32C.
 *
 * Record (in a segment file, starting on an `align` boundary, 4 KiB default):
 *
 *   off size field
 *     0    4 magic "RISR" (bytes R I S R; 0x52534952 as a LE u32)
 *     4    2 version (1)
 *     6    2 header_bytes (64)
 *     8    2 dtype (kvs_dtype_t value of the data side: 1 f16, 2 bf16)
 *    10    2 flags (0)
 *    12    4 token count
 *    16    8 session id
 *    24    4 layer
 *    28    4 KV head
 *    32    4 cluster id
 *    36    4 payload bytes
 *    40    8 sequence number (monotonic per spill directory)
 *    48   12 reserved, zero
 *    60    4 CRC32C over bytes 0..59 then the payload
 *    64    . payload, then zero padding up to the next `align` boundary
 *
 * Manifest (file MANIFEST, replaced atomically through MANIFEST.tmp):
 *   header (48 bytes): magic "RISM", version, align, n_segments, n_records,
 *   next_seq, next_segment_id; then n_segments x (id, valid_bytes) and
 *   n_records x kvs_spill_mrec_t (64 bytes each: header fields, segment,
 *   offset, flags); then CRC32C of everything
 *   before it.
 */
#ifndef KVS_SPILL_FORMAT_H
#define KVS_SPILL_FORMAT_H

#include <stddef.h>
#include <stdint.h>

#include "retroinfer/status.h"

#define KVS_SPILL_REC_MAGIC 0x52534952u   /* "RISR" */
#define KVS_SPILL_REC_VERSION 1u
#define KVS_SPILL_HDR_BYTES 64u
#define KVS_SPILL_MAN_MAGIC 0x4D534952u   /* "RISM" */
#define KVS_SPILL_MAN_VERSION 1u
#define KVS_SPILL_MAN_HDR_BYTES 48u
#define KVS_SPILL_MAN_SEG_BYTES 16u
#define KVS_SPILL_MAN_REC_BYTES 64u

/* A decoded record header. */
typedef struct kvs_spill_hdr {
    uint16_t dtype;          /* element type of the payload */
    uint32_t tokens;         /* tokens in the cluster */
    uint64_t session;        /* session id */
    uint32_t layer;          /* layer index */
    uint32_t head;           /* KV head index */
    uint32_t cluster;        /* cluster id within (session, layer, head) */
    uint32_t payload_bytes;  /* bytes of K/V data after the header */
    uint64_t seq;            /* write order within the directory */
    uint32_t crc;            /* CRC32C over header bytes 0..59 and the payload */
} kvs_spill_hdr_t;

/* Bytes a record with this payload takes on disk (header + payload, aligned). */
uint64_t kvs_spill_rec_bytes(uint32_t payload_bytes, uint32_t align);

/* Write the header for h into out[0..63] and return the CRC over it and
 * payload (also stored at out[60]).  h->crc is ignored. */
uint32_t kvs_spill_hdr_encode(const kvs_spill_hdr_t *h, const void *payload, uint8_t out[KVS_SPILL_HDR_BYTES]);

/* Decode a header.  RI_ERR_BAD_MAGIC / RI_ERR_BAD_VERSION / RI_ERR_FORMAT for
 * a block that is not a record header (does not check the CRC). */
ri_status_t kvs_spill_hdr_decode(const uint8_t in[KVS_SPILL_HDR_BYTES], kvs_spill_hdr_t *h_p);

/* CRC of a record image (header + payload) as stored: recompute and compare.
 * Returns RI_OK or RI_ERR_CORRUPT. */
ri_status_t kvs_spill_rec_verify(const uint8_t *image, const kvs_spill_hdr_t *h);

/* One record as the manifest lists it. */
typedef struct kvs_spill_mrec {
    kvs_spill_hdr_t hdr;      /* the record's header fields */
    uint32_t segment;         /* segment id (unused when lost) */
    uint64_t offset;          /* byte offset in the segment */
    uint32_t flags;           /* KVS_SPILL_MREC_* */
} kvs_spill_mrec_t;

#define KVS_SPILL_MREC_LOST 1u   /* failed verification: answer RI_ERR_CORRUPT, never data */

/* One segment as the manifest lists it. */
typedef struct kvs_spill_mseg {
    uint32_t id;              /* segment id (file seg-<id>.dat) */
    uint64_t valid_bytes;     /* bytes written at checkpoint time */
} kvs_spill_mseg_t;

/* The manifest's contents. */
typedef struct kvs_spill_manifest {
    uint32_t align;           /* record alignment of the directory */
    uint64_t next_seq;        /* every record with seq < next_seq is listed or dead */
    uint32_t next_segment_id; /* segments with smaller ids not listed are stale */
    size_t n_segments;        /* entries in segments */
    kvs_spill_mseg_t *segments;
    size_t n_records;         /* entries in records */
    kvs_spill_mrec_t *records;
} kvs_spill_manifest_t;

/* Serialise m into a new buffer (cm_malloc; caller frees with cm_free). */
ri_status_t kvs_spill_manifest_encode(const kvs_spill_manifest_t *m, uint8_t **buf_p, size_t *len_p);

/* Parse a manifest image; arrays are cm_malloc'ed (free with
 * kvs_spill_manifest_free).  RI_ERR_CORRUPT on a CRC mismatch, RI_ERR_FORMAT /
 * RI_ERR_BAD_MAGIC / RI_ERR_BAD_VERSION on structure errors. */
ri_status_t kvs_spill_manifest_decode(const uint8_t *buf, size_t len, kvs_spill_manifest_t *m_p);

/* Free the arrays of a decoded manifest; the struct itself is the caller's. */
void kvs_spill_manifest_free(kvs_spill_manifest_t *m);

#endif /* KVS_SPILL_FORMAT_H */
