/*
 * Prompts for the long-context benches, in the form each model expects:
 * an instruct model with a chat template (SmolLM2) gets the text as the
 * user's message and the answer opener as the start of the assistant's
 * turn; a base model (Gemma 3 270M) gets one completion text, the opener
 * last ("... The special magic number for X is").  And sizing: the
 * haystack size that brings a sample to a token count.
 */
#ifndef RL_PROMPT_H
#define RL_PROMPT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "bench/ruler/rl_task.h"
#include "gpuworker/model/mdl_tok.h"

/* True when the model is prompted through its chat template. */
bool rl_prompt_chat(const mdl_tok_t *tok);

/* The answer opener for this model: s->prefix_base for a base model when
 * the task has one (a completion phrase where RULER's opener is a bare
 * "Answer:"), else s->prefix.  Borrowed from s. */
const char *rl_prompt_prefix(const mdl_tok_t *tok, const rl_sample_t *s);

/* Encode user text + answer opener (bos where the model wants one).
 * *ids_p: caller frees with cm_free. */
ri_status_t rl_prompt_encode(const mdl_tok_t *tok, const char *user, const char *prefix, int32_t **ids_p,
                             size_t *n_p);

/* The largest sample of task t (seed, depth) whose prompt has at most
 * max_tokens tokens, found by searching the haystack size; *s holds it
 * (caller frees with rl_sample_free) and *ids_p its tokens (cm_free).
 * RI_ERR_RANGE when even an empty haystack does not fit. */
ri_status_t rl_prompt_fit(const mdl_tok_t *tok, rl_task_t t, uint64_t seed, double depth, size_t max_tokens,
                          rl_sample_t *s, int32_t **ids_p, size_t *n_p);

#endif /* RL_PROMPT_H */
