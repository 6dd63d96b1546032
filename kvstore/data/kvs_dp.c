/* UCX data plane: placeholder until the transport lands (catalog-only builds). */
#include "kvstore/data/kvs_internal.h"

ri_status_t kvs_dp_start(kvs_data_t *data, kvs_dp_t **dp_p)
{
    (void)data;
    *dp_p = NULL;
    return RI_OK;
}

void kvs_dp_stop(kvs_dp_t *dp)
{
    (void)dp;
}

void kvs_dp_free(kvs_dp_t *dp)
{
    (void)dp;
}

const char *kvs_dp_address(const kvs_dp_t *dp)
{
    (void)dp;
    return "";
}

void kvs_dp_rkey_destroy(kvs_dp_t *dp, void *rkey)
{
    (void)dp;
    (void)rkey;
}
