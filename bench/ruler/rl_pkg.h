/*
 * Prompts of NVIDIA's RULER package through the fork engine: `ri bench
 * ruler --prompts-in IN --preds-out OUT`, which bench/ruler/ruler_pkg.py
 * (`ri bench ruler-pkg --engine fork`) calls once per task and length.
 *
 * IN holds one JSON object a line, {"index": I, "ids": [token ids],
 * "max_gen": N} (N <= 128, the package's tokens_to_generate).  Each prompt
 * is prefilled once with exact attention; every method of run->methods
 * decodes greedily from a fork of that prefill.  OUT gets one line per
 * prompt and method, appended and flushed per prompt:
 *   {"index", "attn", "pred" (the text), "prompt_tokens",
 *    "completion_tokens" (the stop token left out), "prefill_s",
 *    "seconds" (this method's decode, index build included),
 *    "budget_tokens" (exact tokens per head and layer-step; sparse methods),
 *    "tokens_per_cluster" (the size the wave index used; wave methods)}
 * quest, streaming and oracle take the budget retroinfer measured on the
 * same prompt.
 */
#ifndef RL_PKG_H
#define RL_PKG_H

#include "bench/ruler/rl_run.h"

/* Run every prompt of in_path; 0, or 1 with a message printed. */
int rl_pkg_run(const rl_run_t *run, const char *in_path, const char *out_path);

#endif /* RL_PKG_H */
