/*
 * The address check of the data plane: a worker's packed UCX address is
 * unpacked first by a throw-away process (ri-kvstore-addrcheck), because UCX
 * aborts on malformed addresses instead of returning an error.
 */
#ifndef KVS_DP_CHECK_H
#define KVS_DP_CHECK_H

#include <stddef.h>

#include "common/cm_status.h"

/* Run the checker (program, "" or NULL = ri-kvstore-addrcheck next to the
 * running program, else where the build put it) on addr (len bytes,
 * borrowed) with the data plane's network devices (net_devices, "" or NULL
 * = UCX's choice) and transports (tls, UCX_TLS's syntax; "" or NULL = the
 * environment's) and wait for its verdict (at most 3 s).  RI_OK when it unpacked the address and survived;
 * RI_ERR_PROTOCOL when it crashed or refused it, RI_ERR_TIMEOUT when it hung
 * (killed), RI_ERR_NOT_FOUND when the checker program is missing, RI_ERR_IO
 * when it could not be run, RI_ERR_TOO_LARGE for an oversized address. */
ri_status_t kvs_dp_check_address(const void *addr, size_t len, const char *net_devices, const char *tls,
                                 const char *program);

#endif /* KVS_DP_CHECK_H */
