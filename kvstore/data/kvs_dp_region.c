/*
 * Direct regions through UCX: allocation with ucp_mem_map(ALLOCATE), which
 * takes shared memory (UCX's sysv or posix component) when those transports
 * are on, so that a worker on the same host can map exactly this region with
 * its packed key (ucp_rkey_ptr) and read it with no thread of ours involved.
 * Each region is its own allocation with its own key: a key never covers the
 * pool or another session's region.
 */
#include <pthread.h>
#include <string.h>
#include <ucp/api/ucp.h>

#include "common/cm_alloc.h"
#include "common/cm_log.h"
#include "common/cm_ucx.h"
#include "kvstore/data/kvs_dp_lane.h"
#include "kvstore/data/kvs_internal.h"

static CM_ALLOC_TAG(kvs_region_tag, "kvs.region");

/* ucp_mem_map and unmap come from lane threads and from the control threads
 * (a session dropped over gRPC); one lock keeps them apart. */
static pthread_mutex_t kvs_region_lock = PTHREAD_MUTEX_INITIALIZER;

ri_status_t kvs_dp_region_alloc(kvs_dp_t *dp, uint64_t bytes, kvs_region_t *r)
{
    ucp_mem_map_params_t mp = {0};
    ucp_mem_attr_t attr = {0};
    ucp_mem_h memh = NULL;
    void *kbuf = NULL;
    size_t klen = 0;
    ri_status_t st;

    if (dp == NULL || bytes == 0)
        return RI_ERR_INVALID;
    mp.field_mask = UCP_MEM_MAP_PARAM_FIELD_ADDRESS | UCP_MEM_MAP_PARAM_FIELD_LENGTH | UCP_MEM_MAP_PARAM_FIELD_FLAGS;
    mp.address = NULL;
    mp.length = bytes;
    mp.flags = UCP_MEM_MAP_ALLOCATE;
    pthread_mutex_lock(&kvs_region_lock);
    st = cm_ucx_status(ucp_mem_map(dp->ctx, &mp, &memh));
    if (st != RI_OK)
        goto out;
    attr.field_mask = UCP_MEM_ATTR_FIELD_ADDRESS | UCP_MEM_ATTR_FIELD_LENGTH;
    st = cm_ucx_status(ucp_mem_query(memh, &attr));
    if (st == RI_OK)
        st = cm_ucx_status(ucp_rkey_pack(dp->ctx, memh, &kbuf, &klen));
    if (st == RI_OK && (klen == 0 || klen > 4096))
        st = RI_ERR_UNSUPPORTED;
    if (st == RI_OK) {
        r->rkey = cm_malloc(&kvs_region_tag, klen);
        st = r->rkey == NULL ? RI_ERR_NOMEM : RI_OK;
    }
    if (st != RI_OK) {
        ucp_mem_unmap(dp->ctx, memh);
        goto out;
    }
    memcpy(r->rkey, kbuf, klen);
    r->rkey_len = klen;
    r->base = attr.address;
    r->bytes = bytes; /* UCX may round the length up; we use what we asked */
    r->memh = memh;
out:
    if (kbuf != NULL)
        ucp_rkey_buffer_release(kbuf);
    pthread_mutex_unlock(&kvs_region_lock);
    if (st != RI_OK)
        cm_warn("dp: no direct region of %llu bytes: %s", (unsigned long long)bytes, ri_status_str(st));
    return st;
}

void kvs_dp_region_free(kvs_dp_t *dp, kvs_region_t *r)
{
    if (dp == NULL || r == NULL || r->memh == NULL)
        return;
    pthread_mutex_lock(&kvs_region_lock);
    ucp_mem_unmap(dp->ctx, r->memh);
    pthread_mutex_unlock(&kvs_region_lock);
    r->memh = NULL;
    cm_free(r->rkey);
    r->rkey = NULL;
}
