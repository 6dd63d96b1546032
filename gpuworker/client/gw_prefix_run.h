/*
 * Prefix reuse around a model sequence (gpuworker/model) whose attention
 * runs in this process ("full", "retroinfer"): the flow of
 * gw_prefix_seq.h on a prefix-only kvstore session held for the
 * sequence's life.  ri-worker's scheduler uses it per request:
 *
 *   gw_pfx_run_create(ctx, m, attn, cfg, cap, ids, n, &run, &seq);
 *   prefill ids[gw_pfx_run_cached(run) .. n) into seq;
 *   gw_pfx_run_prefilled(run, m, seq);  (builds the index, publishes)
 *   decode ...
 *   mdl_seq_destroy(seq); gw_pfx_run_destroy(run);
 *
 * Any prefix failure falls back to a whole prefill (counted in ctx's
 * stats); only a failure to create the sequence itself is an error.
 */
#ifndef GW_PREFIX_RUN_H
#define GW_PREFIX_RUN_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "gpuworker/client/gw_prefix_seq.h"
#include "gpuworker/model/mdl_model.h"
#include "retroinfer/status.h"

typedef struct gw_pfx_run gw_pfx_run_t;

/* Whether prefix reuse applies to backend attn (full and retroinfer). */
bool gw_pfx_run_supports(const mdl_attn_ops_t *attn);

/* Create the sequence (cap tokens, backend attn with settings cfg) for the
 * prompt ids[0..n), preloaded with the prompt's cached leading blocks.
 * *run_p (destroy it after the sequence, with gw_pfx_run_destroy) and
 * *seq_p (the caller's, mdl_seq_destroy) on success.  ctx is borrowed and
 * outlives the run.  Errors: mdl_seq_create's (without a prefix) and
 * RI_ERR_NOMEM. */
ri_status_t gw_pfx_run_create(gw_pfx_ctx_t *ctx, mdl_model_t *m, const mdl_attn_ops_t *attn, const mdl_attn_cfg_t *cfg,
                              size_t cap, const int32_t *ids, size_t n, gw_pfx_run_t **run_p, mdl_seq_t **seq_p);

/* Prompt tokens the sequence was preloaded with (prefill the rest). */
size_t gw_pfx_run_cached(const gw_pfx_run_t *run);

/* The prompt is prefilled into seq (model m, the run's sequence): count
 * its hit and miss tokens, build the backend's index now (mdl_seq_build)
 * and publish the prompt's new blocks, so that a request ending before
 * its first decode step publishes too.  Once; never fails the request (a
 * failed build is left to the first decode step, which reports it). */
void gw_pfx_run_prefilled(gw_pfx_run_t *run, mdl_model_t *m, mdl_seq_t *seq);

/* NULL is a no-op.  After the sequence is destroyed. */
void gw_pfx_run_destroy(gw_pfx_run_t *run);

#endif /* GW_PREFIX_RUN_H */
