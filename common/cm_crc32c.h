/*
 * CRC32C (Castagnoli, iSCSI polynomial) for spill records and wire checks.
 * Backed by Intel ISA-L (Debian libisal), which picks SSE4.2/PCLMUL code at
 * run time; we only add the standard pre/post inversion and >2 GiB chunking.
 */
#ifndef CM_CRC32C_H
#define CM_CRC32C_H

#include <stddef.h>
#include <stdint.h>

/* CRC32C of a buffer.  To continue a running CRC pass the previous result as
 * crc; start with 0.  cm_crc32c(0, "123456789", 9) == 0xE3069283. */
uint32_t cm_crc32c(uint32_t crc, const void *data, size_t len);

#endif /* CM_CRC32C_H */
