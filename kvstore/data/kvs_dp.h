/*
 * The UCX transport of kvstore/data as the catalog (kvs_data.c) sees it:
 * start it with the operations' handler table, stop it, ask for addresses.
 * The operations never include this file (kvs_handler.h).
 */
#ifndef KVS_DP_H
#define KVS_DP_H

#include <stdint.h>

#include "kvstore/data/kvs_handler.h"

typedef struct kvs_dp kvs_dp_t;

/* Settings of the transport (a copy is kept). */
typedef struct kvs_dp_config {
    const char *listen_addr;      /* "host:port" of UCX's TCP transport (copied) */
    uint32_t lanes;               /* data-plane threads (0 = 2) */
    int32_t nice;                 /* nice value of the lane threads */
    uint32_t spin_us;             /* an idle lane keeps polling this long after its last message
                                     before it sleeps on its worker's event (0 = at once) */
    uint64_t max_msg_bytes;       /* largest message accepted */
    uint32_t drain_timeout_ms;    /* bound on receives and in-flight work at stop */
    uint32_t lease_ms;            /* session lease: UCX keepalive is set to notice a dead peer within it */
    const char *check_program;    /* the address checker to run (copied); NULL or "" = the one next
                                     to the program, else at its build location (kvs_dp_check.h) */
    /* UCX variables the user set (NULL: unset; kvs_ucx_user_env_t in
     * kvs_data.h), borrowed: the transport reads no environment. */
    const char *user_tls, *user_net_devices, *user_keepalive;
} kvs_dp_config_t;

/* The port range of UCX's TCP transport for listen_addr and lanes
 * (kvs_data_ucx_port_range). */
bool kvs_dp_port_range(const char *listen_addr, uint32_t lanes, char *out, size_t cap);

/* Start the lanes; every request goes to h (copied; h->arg must outlive the
 * transport).  *dp_p on success. */
ri_status_t kvs_dp_start(const kvs_dp_config_t *cfg, const kvs_handlers_t *h, kvs_dp_t **dp_p);
/* Stop the threads, finishing in-flight ops within the drain bound. */
void kvs_dp_stop(kvs_dp_t *dp);
/* The data-plane address of the lane that serves session_id ("ucx:HEX"). */
const char *kvs_dp_address(const kvs_dp_t *dp, uint64_t session_id);
uint32_t kvs_dp_lanes(const kvs_dp_t *dp);
void kvs_dp_free(kvs_dp_t *dp);
/* The services the transport offers the operations (direct regions). */
kvs_xport_t kvs_dp_xport(kvs_dp_t *dp);

#endif /* KVS_DP_H */
