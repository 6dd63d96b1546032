/*
 * Baseline sparse-attention methods, computed on the same K/V with the same
 * fp32 accumulation as RetroInfer so that accuracy and speed compare fairly:
 * StreamingLLM (sinks + window), Quest (16-token pages, per-page element-wise
 * min/max of keys, upper-bound page score, top pages up to a token budget),
 * oracle top-B (exact top-B tokens by true group score: the ceiling of any
 * selector) and random-B.  Layer-level: all KV heads, threads from kn_pool().
 * ops NULL = kn_ops_default().
 */
#ifndef KN_BASELINES_H
#define KN_BASELINES_H

#include "kernels/kn_ops.h"

/* StreamingLLM: exact attention over tokens [0, n_sink) and the last n_window. */
ri_status_t kn_streaming_decode(const kn_ops_t *ops, const kn_shape_t *shape, const float *q,
                                const kn_kv_view_t *kv, uint32_t n_sink, uint32_t n_window,
                                float *out, float *lse);

/* Quest page metadata of one layer.  Pages cover [0, n) in page_tokens steps;
 * the last page may be partial and is re-summarised on update. */
typedef struct kn_quest kn_quest_t;

/* Caller frees with kn_quest_destroy.  page_tokens 0 = 16. */
ri_status_t kn_quest_create(const kn_shape_t *shape, uint32_t page_tokens, kn_quest_t **quest_p);
void kn_quest_destroy(kn_quest_t *quest);

/* Bring the page min/max up to date with kv (all tokens so far). */
ri_status_t kn_quest_update(kn_quest_t *quest, const kn_kv_view_t *kv);

/* Decode: per KV head score every page (max over its query heads of the
 * upper bound), attend exactly the top pages up to budget_tokens (rounded up
 * to whole pages; the newest page is always included).  bytes_p (may be NULL)
 * gets the bytes read (page meta + selected K/V). */
ri_status_t kn_quest_decode(const kn_ops_t *ops, kn_quest_t *quest, const float *q,
                            const kn_kv_view_t *kv, uint32_t budget_tokens, float *out,
                            float *lse, uint64_t *bytes_p);

/* Mark in mask [kv->n_tokens] the tokens Quest attends for KV head kv_head. */
ri_status_t kn_quest_exact_mask(const kn_ops_t *ops, kn_quest_t *quest, const float *q,
                                const kn_kv_view_t *kv, uint32_t kv_head, uint32_t budget_tokens,
                                uint8_t *mask);

/* Oracle top-B: per KV head, the B tokens of largest group score
 * sum_t softmax(scale*q_t.k) attended exactly.  Reads everything (a ceiling,
 * not a method).  B >= n means full attention. */
ri_status_t kn_oracle_decode(const kn_ops_t *ops, const kn_shape_t *shape, const float *q,
                             const kn_kv_view_t *kv, uint32_t budget_tokens, float *out,
                             float *lse);

/* Random-B: B tokens drawn without replacement (seeded) per KV head. */
ri_status_t kn_random_decode(const kn_ops_t *ops, const kn_shape_t *shape, const float *q,
                             const kn_kv_view_t *kv, uint32_t budget_tokens, uint64_t seed,
                             float *out, float *lse);

#endif /* KN_BASELINES_H */
