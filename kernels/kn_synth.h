/*
 * Synthetic K/V and queries for tests and benchmarks, calibrated to published
 * properties of real long-context attention (docs/synthetic-kv.md): a shared
 * attention-sink key direction, low-rank keys that drift slowly along the
 * sequence plus noise, queries offset from the key cone, heavy-hitter sparsity
 * (median head: ~1% of tokens hold ~90% of the mass, ~3% hold ~97%), some
 * diffuse heads, and planted needles.  Seeded and reproducible: the same
 * parameters give the same bits on every machine and thread count.
 */
#ifndef KN_SYNTH_H
#define KN_SYNTH_H

#include "kernels/kn_ops.h"

typedef struct kn_synth_params {
    uint32_t n_q_heads, n_kv_heads, head_dim;  /* geometry */
    size_t n_tokens;                           /* sequence length */
    uint64_t seed;                             /* everything derives from it */
    float tier1_frac;    /* share of strongest heavy hitters (0.01) */
    float tier1_mass;    /* softmax mass they hold in a median head (0.90) */
    float tier2_frac;    /* next tier (0.02) */
    float tier12_mass;   /* mass of both tiers together (0.97) */
    float diffuse_frac;  /* share of KV heads with no heavy hitters (0.25) */
    float hh_coherence;  /* 0..1: how much of the low-rank (topic/position)
                            part a heavy hitter's key loses, i.e. how closely
                            the keys relevant to a query share a direction
                            (0.7; 0 = relevant keys scattered in key space) */
    float drift;         /* AR(1) step of the key latent (1/2048) */
    uint32_t n_sinks;    /* sink tokens at the start (4) */
    uint32_t n_needles;  /* planted needles (0) */
    const float *needle_depths; /* [n_needles] in [0,1): position = depth*n */
} kn_synth_params_t;

void kn_synth_params_default(kn_synth_params_t *p);

/* Write K and V of every KV head into k/v with the given layout (element
 * strides, as kn_kv_view_t).  Parallel over heads on kn_pool().
 * Errors: RI_ERR_INVALID. */
ri_status_t kn_synth_kv(const kn_synth_params_t *p, cm_fp16_t *k, cm_fp16_t *v,
                        size_t token_stride, size_t head_stride);

/* Query of decode step `step` for all query heads: q [n_q][d]. */
ri_status_t kn_synth_query(const kn_synth_params_t *p, uint64_t step, float *q);

/* True when KV head h is generated as a diffuse (non-sparse) head. */
bool kn_synth_head_diffuse(const kn_synth_params_t *p, uint32_t kv_head);

/* Token position of needle i. */
size_t kn_synth_needle_pos(const kn_synth_params_t *p, uint32_t i);

#endif /* KN_SYNTH_H */
