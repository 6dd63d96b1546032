/*
 * ri-kvstore-addrcheck: parses one UCX worker address in a process of its
 * own, so that a malformed one cannot take the daemon down.
 *
 * Why: a worker's CONNECT carries its packed UCX worker address, and the
 * kvstore must open an endpoint to it to answer.  UCX (1.13 as 1.22) does not
 * validate packed addresses: of 200 randomly flipped addresses a dozen abort
 * or segfault the process that unpacks them, in ucp_ep_create or in the
 * progress that follows.  The data thread therefore runs this program first
 * (kvs_dp.c) with the same UCX build, features, error mode and network
 * devices, and opens its own endpoint only when this one survived.
 *
 * usage: ri-kvstore-addrcheck ucx:HEX
 * exit: 0 the address unpacked, an endpoint was created and progressed;
 *       2 not an address in text form; 3 UCX refused it (ucp_ep_create
 *       failed); 4 UCX could not start.  Killed by a signal: it crashed UCX.
 * Workload: one run per data-plane connection, ~20-50 ms.
 */
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>
#include <ucp/api/ucp.h>

#include "common/cm_dp_proto.h"
#include "common/cm_time.h"
#include "common/cm_ucx.h"

#define ADDRCHECK_PROGRESS_NS 20000000u /* progress the endpoint for 20 ms */

static void addrcheck_ep_error(void *arg, ucp_ep_h ep, ucs_status_t status)
{
    (void)arg;
    (void)ep;
    (void)status; /* a peer that goes away is fine: only a crash is a verdict */
}

int main(int argc, char **argv)
{
    static uint8_t addr[CM_DP_MAX_WORKER_ADDR];
    ucp_ep_params_t ep = {0};
    ucp_context_h ctx;
    ucp_worker_h worker;
    ucp_ep_h e;
    size_t len;
    uint64_t until;

    if (argc != 2 || cm_dp_addr_parse(argv[1], addr, sizeof(addr), &len) != RI_OK) {
        fprintf(stderr, "usage: ri-kvstore-addrcheck ucx:HEX (a packed UCX worker address)\n");
        return 2;
    }
    /* The daemon's environment reaches us (error handling of the shared
     * memory transports) with its UCX_TLS and UCX_NET_DEVICES put in
     * (kvs_dp_check.c): the same lanes get chosen. */
    if (cm_ucx_context("ri-kvstore-addrcheck", NULL, false, &ctx) != RI_OK || cm_ucx_worker(ctx, &worker, NULL) != RI_OK)
        return 4;
    ep.field_mask = UCP_EP_PARAM_FIELD_REMOTE_ADDRESS | UCP_EP_PARAM_FIELD_ERR_HANDLER |
                    UCP_EP_PARAM_FIELD_ERR_HANDLING_MODE;
    ep.address = (const ucp_address_t *)addr;
    ep.err_mode = UCP_ERR_HANDLING_MODE_PEER;
    ep.err_handler.cb = addrcheck_ep_error;
    if (ucp_ep_create(worker, &ep, &e) != UCS_OK)
        return 3;
    until = cm_time_ns() + ADDRCHECK_PROGRESS_NS;
    while (cm_time_ns() < until)
        ucp_worker_progress(worker);
    /* No orderly close: the verdict is in, and a close would wait on a peer
     * that never heard of us. */
    _exit(0);
}
