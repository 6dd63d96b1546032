/*
 * The choice of transport into the block cache (gw_transport.h).
 */
#include "gpuworker/client/gw_transport.h"

#include <pthread.h>
#include <ucp/api/ucp.h>

#include "common/cm_log.h"
#include "common/cm_ucx.h"
#include "kernels/kn_mem.h"

gw_transport_t gw_transport_choose(const gw_transport_caps_t *caps)
{
    if (caps == NULL || !caps->device_space)
        return GW_TRANSPORT_HOST; /* UCX's CUDA support is of no use without device pages */
    return caps->ucx_cuda ? GW_TRANSPORT_UCX_CUDA : GW_TRANSPORT_PINNED_STAGING;
}

const char *gw_transport_name(gw_transport_t t)
{
    switch (t) {
    case GW_TRANSPORT_UCX_CUDA:
        return "ucx-cuda";
    case GW_TRANSPORT_PINNED_STAGING:
        return "pinned-staging";
    case GW_TRANSPORT_HOST:
        break;
    }
    return "host";
}

static pthread_once_t gw_transport_once = PTHREAD_ONCE_INIT;
static bool gw_transport_ucx_cuda;

/* One short-lived context: its memory types say which transports the
 * loaded UCX has (Debian's UCX 1.13 none for CUDA; the libucx-cu13 wheel's
 * cuda_copy and cuda_ipc). */
static void gw_transport_probe_ucx(void)
{
    ucp_context_h ctx;
    ucp_context_attr_t attr = {.field_mask = UCP_ATTR_FIELD_MEMORY_TYPES};
    if (cm_ucx_context("ri-transport-probe", NULL, false, &ctx) != RI_OK) {
        cm_warn("transport: no UCX context to probe for CUDA memory support");
        return;
    }
    if (ucp_context_query(ctx, &attr) == UCS_OK)
        gw_transport_ucx_cuda = (attr.memory_types & UCS_BIT(UCS_MEMORY_TYPE_CUDA)) != 0;
    ucp_cleanup(ctx);
}

void gw_transport_probe(gw_transport_caps_t *caps_p)
{
    pthread_once(&gw_transport_once, gw_transport_probe_ucx);
    caps_p->device_space = kn_mem_of(NULL)->device;
    caps_p->ucx_cuda = gw_transport_ucx_cuda;
}

const char *gw_transport_current(void)
{
    gw_transport_caps_t caps;
    gw_transport_probe(&caps);
    return gw_transport_name(gw_transport_choose(&caps));
}
