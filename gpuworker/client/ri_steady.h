/*
 * The K/V a session keeps for an engine that hands over each token's K/V
 * once (ri_prefill_kept, ri_decode_token) and keeps none itself: per layer an
 * array [cap][n_kv][d] of fp16, whose pages are given back once the kvstore
 * holds their tokens, so what stays is the steady zone (sinks and the tokens
 * not yet clustered).  Token-major, so that the zone is two page runs a
 * layer, not two per KV head.  Private to ri_api.c.
 */
#ifndef RI_STEADY_H
#define RI_STEADY_H

#include <stddef.h>
#include <stdint.h>

#include "kernels/kn_ops.h"
#include "retroinfer/status.h"

typedef struct ri_steady ri_steady_t;

/* Arrays for cap tokens of n_layers layers (address space only until
 * written).  RI_ERR_NOMEM when it cannot be mapped. */
ri_status_t ri_steady_create(uint32_t n_layers, uint32_t n_kv, uint32_t d, size_t cap, ri_steady_t **st_p);
void ri_steady_destroy(ri_steady_t *st);

/* Copy n tokens (k, v: fp16 rows of token t, head h at t * token_stride +
 * h * head_stride) to the end of layer.  RI_ERR_RANGE past cap. */
ri_status_t ri_steady_append(ri_steady_t *st, uint32_t layer, const uint16_t *k, const uint16_t *v, size_t n,
                             size_t token_stride, size_t head_stride);

/* A view of layer's tokens so far (those given back read as zeros). */
kn_kv_view_t ri_steady_view(const ri_steady_t *st, uint32_t layer);

/* Give back tokens [from, to) of layer (whole pages inside the range);
 * later calls go on from where the last one ended (from is the first
 * call's: the sinks' end). */
void ri_steady_release(ri_steady_t *st, uint32_t layer, size_t from, size_t to);

/* Bytes held: tokens stored and not given back, K and V. */
uint64_t ri_steady_bytes(const ri_steady_t *st);

#endif /* RI_STEADY_H */
