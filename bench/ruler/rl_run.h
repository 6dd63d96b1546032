/*
 * One trial of the RULER-style suite on the real model: the prompt sized
 * to the context, prefilled once with exact attention, then every method
 * decodes greedily from a fork of that prefill (mdl_seq_fork), is scored
 * and compared token by token with full attention.  Results accumulate in
 * one rl_cell_t per method.  Also the optional "retroinfer-remote" method:
 * RetroInfer through a ri-kvstore this process starts.
 */
#ifndef RL_RUN_H
#define RL_RUN_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <cjson/cJSON.h>

#include "bench/ruler/rl_task.h"
#include "gpuworker/model/mdl_model.h"

#define RL_MAX_METHODS 8

/* Generated tokens of one method (the stop token included, when reached). */
typedef struct rl_gen {
    int32_t toks[128];         /* token ids */
    size_t n;                  /* count */
    bool stopped;              /* the last of toks is the stop token */
    char text[1024];           /* their text, stop token left out */
    mdl_attn_stats_t st;       /* backend statistics */
    double secs;               /* decode time, the first step's index build included */
} rl_gen_t;

/* Totals of one (task, context, method) cell over its trials. */
typedef struct rl_cell {
    int trials;             /* run */
    int passed;             /* every expected item found */
    double recall_sum;      /* sum over trials of the share of items found */
    uint64_t agree_prefix;  /* tokens equal to full's before the first difference */
    uint64_t agree_same;    /* tokens equal to full's at the same position */
    uint64_t agree_n;       /* full's tokens (the denominator of both) */
    uint64_t exact_tokens;  /* backend statistics: tokens attended exactly ... */
    uint64_t decode_steps;  /* ... over layer-steps */
    double prefill_s;       /* summed over trials (the shared exact prefill) */
    double decode_s;        /* summed: this method's greedy decode, index build included */
    uint64_t prompt_tokens; /* summed */
    uint64_t gen_tokens;    /* summed */
    uint32_t tokens_per_cluster; /* the cluster size the wave index used (the auto size
                                    resolved); 0: the method keeps no wave index */
} rl_cell_t;

/* What a trial runs on. */
typedef struct rl_run {
    mdl_model_t *model;                      /* borrowed */
    const char *methods[RL_MAX_METHODS];     /* full first; borrowed names */
    size_t n_methods;
    uint64_t seed;                           /* --seed */
    bool verbose;                            /* print each method's output */
    bool show_prompt;                        /* print each prompt's text */
    cJSON *outputs;                          /* array: one object per trial and method (borrowed; may be NULL) */
    mdl_attn_cfg_t attn;                     /* settings of every sequence (the baselines' budget_tokens
                                                is set per trial from retroinfer's) */
} rl_run_t;

/* Run trial `trial` of `trials` of task t at ctx tokens (prompt plus
 * generation) and add it to cells[0 .. n_methods).  Errors: from the
 * model (message printed); RI_ERR_RANGE when the prompt cannot fit. */
ri_status_t rl_run_trial(const rl_run_t *run, rl_task_t t, size_t ctx, int trial, int trials, rl_cell_t *cells);

/* Start a ri-kvstore child and register "retroinfer-remote" with the
 * model runtime.  0, or -1 with a message printed (also when this build
 * has no worker library). */
int rl_remote_start(const char *argv0);
/* Disconnect and stop the kvstore; safe when not started. */
void rl_remote_stop(void);

/* The backend of a method name: a backend's own, "retroinfer@segN"
 * (retroinfer with its index built in blocks of N tokens) or
 * "retroinfer@ctN" (N tokens per cluster); *seg_p and *ct_p get N for
 * their suffix, else 0.  NULL when unknown. */
const mdl_attn_ops_t *rl_method_attn(const char *name, uint32_t *seg_p, uint32_t *ct_p);

/* quest, streaming or oracle: the methods held to retroinfer's measured
 * exact-token budget. */
bool rl_is_baseline(const char *name);

/* The exact prefill every method forks from: a full-attention sequence
 * with room for max_gen more tokens (*base_p, the caller's to destroy, set
 * even on a failed prefill), the last position's logits [n_vocab], and its
 * time in seconds. */
ri_status_t rl_prefill(mdl_model_t *m, const int32_t *ids, size_t n, size_t max_gen, float *logits,
                       mdl_seq_t **base_p, double *secs_p);

/* Greedy decode of up to max_gen (<= 128) tokens from a fork of base under
 * attn and cfg, by mdl_gen's steps, from the prefill's logits0 (the stop
 * token is kept in g->toks: the agreement between methods counts it). */
ri_status_t rl_decode(mdl_model_t *m, const mdl_seq_t *base, const float *logits0, const mdl_attn_ops_t *attn,
                      const mdl_attn_cfg_t *cfg, int max_gen, rl_gen_t *g);

#endif /* RL_RUN_H */
