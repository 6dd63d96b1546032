/* CRC32C through ISA-L. */
#include "common/cm_crc32c.h"

#include <isa-l/crc.h>
#include <limits.h>

uint32_t cm_crc32c(uint32_t crc, const void *data, size_t len)
{
    const unsigned char *p = data;
    /* ISA-L works on the raw register: invert in and out for the standard CRC. */
    uint32_t reg = ~crc;
    while (len > 0) {
        int chunk = len > (size_t)(INT_MAX & ~4095) ? (INT_MAX & ~4095) : (int)len;
        reg = crc32_iscsi((unsigned char *)p, chunk, reg);
        p += chunk;
        len -= (size_t)chunk;
    }
    return ~reg;
}
