/*
 * Token generation: the one loop every user of the model runs (ri-worker's
 * scheduler, which serves its HTTP and JSON-lines modes, ri generate, the
 * benches).
 *
 * Rules, the same for all: after the prefill, a token is picked from the
 * logits (sampled, or greedy argmax); the model's stop token ends the
 * generation unseen; any other token counts (it is delivered), and then
 * max_tokens or a full sequence ends the generation, else the token is
 * decoded and the next one picked from its logits.
 *
 * Two levels:
 *  - mdl_gen_t / mdl_gen_pick: the per-token step, for a caller that runs the
 *    decode itself (the batching scheduler decodes many sequences at once);
 *  - mdl_generate: prefill, then pick / decode until the end, calling back
 *    with each token.
 */
#ifndef MDL_GEN_H
#define MDL_GEN_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "gpuworker/model/mdl_model.h"
#include "gpuworker/model/mdl_sample.h"
#include "retroinfer/status.h"

/* What a picked token does to the generation. */
typedef enum mdl_gen_end {
    MDL_GEN_MORE = 0, /* the token counts; decode it and pick again */
    MDL_GEN_STOP,     /* the model's stop token: the generation ends, the token does not count */
    MDL_GEN_LENGTH,   /* the token counts and the generation ends (max_tokens, or the sequence is full) */
} mdl_gen_end_t;

/* The step state of one generation (a value; nothing to free). */
typedef struct mdl_gen {
    const mdl_tok_t *tok; /* borrowed: knows the stop tokens */
    mdl_sampler_t *smp;   /* borrowed; NULL = greedy (argmax) */
    size_t n_vocab;       /* logits per pick */
    size_t max_tokens;    /* tokens that may count */
    size_t cap;           /* capacity of the decoding sequence */
    size_t len;           /* tokens in it, counting the one a MORE pick asks to decode */
    size_t n_gen;         /* tokens that counted so far */
    bool ignore_stop;     /* the stop token counts like any other (fixed-length runs:
                             benchmarks, the HTTP API's ignore_eos); false after init */
} mdl_gen_t;

/* Start a generation on a sequence of len tokens (after its prefill) and
 * capacity cap.  tok and smp are borrowed for the generation's life. */
void mdl_gen_init(mdl_gen_t *g, const mdl_tok_t *tok, mdl_sampler_t *smp, size_t n_vocab, size_t max_tokens,
                  size_t len, size_t cap);

/* Pick the next token from logits [n_vocab] (not modified) into *tok_p and
 * say what it does (see mdl_gen_end_t).  For MORE the caller decodes *tok_p
 * before the next pick. */
mdl_gen_end_t mdl_gen_pick(mdl_gen_t *g, const float *logits, int32_t *tok_p);

/* One decode step of token tok into logits [n_vocab], in place of
 * mdl_decode on the generating sequence (e.g. on a device copy of it). */
typedef ri_status_t (*mdl_gen_decode_fn_t)(void *arg, int32_t tok, float *logits);
/* Each token that counts, in order. */
typedef void (*mdl_gen_token_fn_t)(void *arg, int32_t tok);

typedef struct mdl_gen_cfg {
    size_t max_tokens;             /* tokens that may count */
    mdl_sampler_t *smp;            /* borrowed; NULL = greedy (argmax) */
    mdl_gen_token_fn_t on_token;   /* may be NULL */
    void *token_arg;
    mdl_gen_decode_fn_t decode;    /* NULL = mdl_decode on the sequence */
    void *decode_arg;
    mdl_progress_fn_t progress;    /* prefill progress; may be NULL */
    void *progress_arg;
} mdl_gen_cfg_t;

/* What a generation did. */
typedef struct mdl_gen_result {
    mdl_gen_end_t end;   /* STOP or LENGTH (MORE when a step failed) */
    size_t n_gen;        /* tokens that counted */
    size_t steps;        /* decode steps run */
    double prefill_s;    /* wall time of the prefill (0 without one) */
    double decode_s;     /* wall time from the first pick to the end */
    double first_step_s; /* wall time to the end of the first decode step (it builds a sparse index) */
    bool decoding;       /* the prefill is done: a failure came from a decode step */
} mdl_gen_result_t;

/* Prefill ids [n_ids] into seq, then generate by cfg's rules.  With
 * n_ids == 0 there is no prefill: logits already hold the last prompt
 * token's logits (a forked sequence).  logits [n_vocab] is the caller's
 * scratch (overwritten).  *res_p is filled also when a step fails, with what
 * ran before it (its tokens were delivered already).  Errors: those of
 * mdl_prefill and of the decode step. */
ri_status_t mdl_generate(mdl_model_t *m, mdl_seq_t *seq, const int32_t *ids, size_t n_ids, float *logits,
                         const mdl_gen_cfg_t *cfg, mdl_gen_result_t *res_p);

#endif /* MDL_GEN_H */
