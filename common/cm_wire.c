/* Wire header encode/decode with strict validation. */
#include "common/cm_wire.h"

#include <errno.h>
#include <string.h>
#include <sys/random.h>

#include "common/cm_status.h"

static void cm_put16(uint8_t *p, uint16_t v)
{
    p[0] = (uint8_t)v;
    p[1] = (uint8_t)(v >> 8);
}

static void cm_put32(uint8_t *p, uint32_t v)
{
    for (int i = 0; i < 4; i++)
        p[i] = (uint8_t)(v >> (8 * i));
}

static void cm_put64(uint8_t *p, uint64_t v)
{
    for (int i = 0; i < 8; i++)
        p[i] = (uint8_t)(v >> (8 * i));
}

static uint16_t cm_get16(const uint8_t *p)
{
    return (uint16_t)(p[0] | (p[1] << 8));
}

static uint32_t cm_get32(const uint8_t *p)
{
    uint32_t v = 0;
    for (int i = 3; i >= 0; i--)
        v = (v << 8) | p[i];
    return v;
}

static uint64_t cm_get64(const uint8_t *p)
{
    uint64_t v = 0;
    for (int i = 7; i >= 0; i--)
        v = (v << 8) | p[i];
    return v;
}

void cm_wire_encode(const cm_wire_hdr_t *hdr, uint8_t buf[CM_WIRE_HDR_SIZE])
{
    cm_put32(buf + 0, hdr->magic);
    cm_put16(buf + 4, hdr->version);
    cm_put16(buf + 6, hdr->op);
    cm_put32(buf + 8, hdr->flags);
    cm_put32(buf + 12, (uint32_t)hdr->status);
    cm_put64(buf + 16, hdr->session_id);
    memcpy(buf + 24, hdr->secret, CM_WIRE_SECRET_SIZE);
    cm_put64(buf + 40, hdr->request_id);
    cm_put32(buf + 48, hdr->meta_len);
    cm_put32(buf + 52, hdr->reserved);
    cm_put64(buf + 56, hdr->data_len);
}

ri_status_t cm_wire_decode(const void *buf, size_t len, size_t msg_len, const cm_wire_limits_t *limits,
                           cm_wire_hdr_t *hdr_p)
{
    const uint8_t *p = buf;
    cm_wire_hdr_t h;

    if (buf == NULL || len < CM_WIRE_HDR_SIZE)
        return RI_ERR_TRUNCATED;
    h.magic = cm_get32(p + 0);
    if (h.magic != CM_WIRE_MAGIC)
        return RI_ERR_BAD_MAGIC;
    h.version = cm_get16(p + 4);
    if (h.version != CM_WIRE_VERSION)
        return RI_ERR_BAD_VERSION;
    h.op = cm_get16(p + 6);
    h.flags = cm_get32(p + 8);
    h.status = (int32_t)cm_get32(p + 12);
    h.session_id = cm_get64(p + 16);
    memcpy(h.secret, p + 24, CM_WIRE_SECRET_SIZE);
    h.request_id = cm_get64(p + 40);
    h.meta_len = cm_get32(p + 48);
    h.reserved = cm_get32(p + 52);
    h.data_len = cm_get64(p + 56);

    if (h.op == 0 || h.op > CM_WIRE_OP_MAX || (h.flags & ~CM_WIRE_F_KNOWN) != 0 || h.reserved != 0)
        return RI_ERR_PROTOCOL;
    if (!(h.flags & CM_WIRE_F_REPLY) && h.status != 0)
        return RI_ERR_PROTOCOL;
    if (limits != NULL && (h.meta_len > limits->max_meta_len || h.data_len > limits->max_data_len))
        return RI_ERR_TOO_LARGE;
    if (msg_len != 0) {
        /* Lengths are checked without overflow: meta_len < 2^32, data_len is
         * compared against what remains. */
        if (msg_len < CM_WIRE_HDR_SIZE)
            return RI_ERR_TRUNCATED;
        uint64_t rest = (uint64_t)msg_len - CM_WIRE_HDR_SIZE;
        if (h.meta_len > rest || h.data_len > rest - h.meta_len)
            return RI_ERR_TRUNCATED;
        if (h.data_len != rest - h.meta_len)
            return RI_ERR_PROTOCOL;
    }
    *hdr_p = h;
    return RI_OK;
}

bool cm_wire_secret_equal(const uint8_t a[CM_WIRE_SECRET_SIZE], const uint8_t b[CM_WIRE_SECRET_SIZE])
{
    volatile uint8_t diff = 0;
    for (unsigned i = 0; i < CM_WIRE_SECRET_SIZE; i++)
        diff |= (uint8_t)(a[i] ^ b[i]);
    return diff == 0;
}

const char *cm_wire_op_name(uint32_t op)
{
    static const char *const names[] = {"UNKNOWN", "UPLOAD_CLUSTERS", "APPEND_CLUSTERS", "REGISTER_CACHE",
                                        "FETCH_RANKED", "RELEASE", "PING", "CONNECT", "DISCONNECT",
                                        "MAP", "LOCATE", "TOUCH", "PREFIX_ATTACH", "PREFIX_PUT", "PREFIX_GET"};
    return op <= CM_WIRE_OP_MAX ? names[op] : "UNKNOWN";
}

ri_status_t cm_random_bytes(void *buf, size_t n)
{
    uint8_t *p = buf;
    while (n > 0) {
        ssize_t r = getrandom(p, n, 0);
        if (r < 0) {
            if (errno == EINTR)
                continue;
            return cm_status_from_errno(errno);
        }
        p += r;
        n -= (size_t)r;
    }
    return RI_OK;
}
