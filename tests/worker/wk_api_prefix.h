/*
 * Shared by the public-API prefix tests: publish a session's leading blocks
 * to its kvstore as ri-worker does (each block built from the session's K/V
 * and its index), so that other sessions can attach them by key.
 * Header-only: each test includes it once.
 */
#ifndef WK_API_PREFIX_H
#define WK_API_PREFIX_H

#include <string.h>

#include "common/cm_alloc.h"
#include "gpuworker/client/gw_prefix.h"
#include "gpuworker/client/gw_prefix_seq.h"
#include "gpuworker/client/ri_api_int.h"
#include "retroinfer/retroinfer.h"

static const kn_index_t *wk_api_index_of(void *ctx, uint32_t layer, uint32_t head)
{
    return gw_api_session_index(ctx, layer, head);
}

/* Publish blocks [0, nb) of block_tokens tokens of session s's prompt (kv,
 * borrowed; geometry n_layers x n_kv_heads x head_dim) under keys
 * (nb * CM_PFX_KEY_SIZE bytes).  The blocks outlive the publisher's
 * session.  Fails the test on any error. */
static void wk_api_publish(ri_client_h client, ri_session_h s, mdl_kv_t *kv, uint32_t n_layers,
                           uint32_t n_kv_heads, uint32_t head_dim, uint32_t block_tokens, const uint8_t *keys,
                           uint32_t nb)
{
    ri_session_params_t got = {.struct_size = sizeof(got)};
    gw_pfx_layout_t lay;
    gw_pfx_conn_t *c = NULL;
    uint32_t timeout = 0;

    assert_int_equal(ri_session_params_get(s, &got), RI_OK);
    memset(&lay, 0, sizeof(lay));
    lay.indexed = 1;
    lay.cluster_tokens = got.tokens_per_cluster;
    lay.sink_tokens = got.sink_tokens;
    lay.block_tokens = block_tokens;
    lay.page_tokens = 1; /* the session's: max(clusters / 8, 1) */
    lay.dtype = GW_PFX_DTYPE_F16;
    lay.n_layers = n_layers;
    lay.n_kv_heads = n_kv_heads;
    lay.head_dim = head_dim;
    gw_pfx_src_t src = {.kv = kv, .ctx = s, .index = wk_api_index_of};
    assert_int_equal(gw_pfx_conn_open(gw_api_client_ctl(client, &timeout), 5000, &lay, &c), RI_OK);
    for (uint32_t b = 0; b < nb; b++) {
        uint8_t *buf = NULL;
        uint64_t len = 0;
        uint32_t slot = 0, flags = 0;
        assert_int_equal(gw_pfx_block_build(&lay, &src, b, &buf, &len), RI_OK);
        assert_int_equal(gw_dp_prefix_put(c->dp, keys + (size_t)b * CM_PFX_KEY_SIZE, buf, len, &slot, &flags), RI_OK);
        cm_free(buf);
    }
    gw_pfx_conn_close(c);
}

#endif /* WK_API_PREFIX_H */
