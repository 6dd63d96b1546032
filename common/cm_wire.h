/*
 * The data-plane wire header: the fixed, versioned 64-byte header that starts
 * every UCX active message between a worker and ri-kvstore (the only contract
 * besides proto/ between gpuworker/ and kvstore/).  All fields little-endian.
 *
 *   off size field
 *     0    4 magic        CM_WIRE_MAGIC ("RIDP")
 *     4    2 version      CM_WIRE_VERSION
 *     6    2 op           cm_wire_op_t
 *     8    4 flags        CM_WIRE_F_*
 *    12    4 status       ri_status_t of a reply (0 in requests)
 *    16    8 session_id
 *    24   16 secret       session secret (compared in constant time)
 *    40    8 request_id   echoed in the reply
 *    48    4 meta_len     op-specific fixed parameters after the header
 *    52    4 reserved     must be 0
 *    56    8 data_len     bulk payload after the meta block
 *
 * A message is header || meta (meta_len bytes) || data (data_len bytes).
 * cm_wire_decode() validates every field before anything uses it.
 */
#ifndef CM_WIRE_H
#define CM_WIRE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "retroinfer/status.h"

#define CM_WIRE_MAGIC 0x50444952u /* "RIDP" read as little-endian u32 */
#define CM_WIRE_VERSION 1u
#define CM_WIRE_HDR_SIZE 64u
#define CM_WIRE_SECRET_SIZE 16u

typedef enum cm_wire_op {
    CM_WIRE_OP_UPLOAD_CLUSTERS = 1, /* one layer's cluster-major K/V */
    CM_WIRE_OP_APPEND_CLUSTERS = 2, /* decode-time index update */
    CM_WIRE_OP_REGISTER_CACHE = 3,  /* worker announces its block cache */
    CM_WIRE_OP_FETCH_RANKED = 4,    /* ranked retrieval ids -> hit/miss plan */
    CM_WIRE_OP_RELEASE = 5,         /* worker lets go of a cache / session */
    CM_WIRE_OP_PING = 6,            /* liveness and latency */
    CM_WIRE_OP_CONNECT = 7,         /* first message of a connection: the worker's UCX address */
    CM_WIRE_OP_DISCONNECT = 8,      /* last message: release the connection's caches and close it */
    CM_WIRE_OP_MAP = 9,             /* the session's direct region: address, length, packed rkey */
    CM_WIRE_OP_LOCATE = 10,         /* where clusters lie in the direct region */
    CM_WIRE_OP_TOUCH = 11,          /* access records of direct reads, in a batch */
    CM_WIRE_OP_PREFIX_ATTACH = 12,  /* attach the leading cached prefix blocks of keys (cm_dp_prefix.h) */
    CM_WIRE_OP_PREFIX_PUT = 13,     /* publish a prefix block and attach it */
    CM_WIRE_OP_PREFIX_GET = 14,     /* read an attached block's bytes (two-sided) */
    CM_WIRE_OP_MAX = 14,
} cm_wire_op_t;

#define CM_WIRE_F_REPLY 0x1u     /* this message answers request_id */
#define CM_WIRE_F_KNOWN 0x1u     /* all flags we understand */

typedef struct cm_wire_hdr {
    uint32_t magic;                       /* CM_WIRE_MAGIC */
    uint16_t version;                     /* CM_WIRE_VERSION */
    uint16_t op;                          /* cm_wire_op_t */
    uint32_t flags;                       /* CM_WIRE_F_* */
    int32_t status;                       /* reply status; 0 in requests */
    uint64_t session_id;                  /* target session */
    uint8_t secret[CM_WIRE_SECRET_SIZE];  /* session secret */
    uint64_t request_id;                  /* caller's id, echoed */
    uint32_t meta_len;                    /* op parameters length */
    uint32_t reserved;                    /* 0 */
    uint64_t data_len;                    /* bulk payload length */
} cm_wire_hdr_t;

/* Limits a receiver enforces while decoding. */
typedef struct cm_wire_limits {
    uint32_t max_meta_len;  /* largest meta block accepted */
    uint64_t max_data_len;  /* largest payload accepted */
} cm_wire_limits_t;

/* Serialise hdr into exactly CM_WIRE_HDR_SIZE bytes at buf. */
void cm_wire_encode(const cm_wire_hdr_t *hdr, uint8_t buf[CM_WIRE_HDR_SIZE]);

/*
 * Parse and validate a header from buf (len bytes available, header first).
 * When msg_len is nonzero it is the whole message length and must equal
 * 64 + meta_len + data_len; when 0 the payload travels separately (a UCX
 * rendezvous) and only the limits apply.  Writes *hdr_p only on success.
 * Errors: RI_ERR_TRUNCATED (len < 64 or msg_len short), RI_ERR_BAD_MAGIC,
 * RI_ERR_BAD_VERSION, RI_ERR_PROTOCOL (unknown op or flags, reserved != 0,
 * length mismatch), RI_ERR_TOO_LARGE (over limits).
 */
ri_status_t cm_wire_decode(const void *buf, size_t len, size_t msg_len, const cm_wire_limits_t *limits,
                           cm_wire_hdr_t *hdr_p);

/* Constant-time comparison of two secrets. */
bool cm_wire_secret_equal(const uint8_t a[CM_WIRE_SECRET_SIZE], const uint8_t b[CM_WIRE_SECRET_SIZE]);

/* Name of an op ("FETCH_RANKED"), or "UNKNOWN". */
const char *cm_wire_op_name(uint32_t op);

/* Fill buf with n cryptographically random bytes (getrandom). */
ri_status_t cm_random_bytes(void *buf, size_t n);

#endif /* CM_WIRE_H */
