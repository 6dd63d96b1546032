/*
 * Token sampling from logits: greedy (temperature 0), temperature, nucleus
 * (top-p), seeded so that a run can be repeated.  One sampler per sequence.
 */
#ifndef MDL_SAMPLE_H
#define MDL_SAMPLE_H

#include <stddef.h>
#include <stdint.h>

#include "retroinfer/status.h"

typedef struct mdl_sampler_cfg {
    float temperature;  /* 0 = greedy */
    float top_p;        /* keep the smallest set with this much mass (1 = all) */
    uint64_t seed;      /* random seed */
} mdl_sampler_cfg_t;

typedef struct mdl_sampler mdl_sampler_t;

/* Caller frees with mdl_sampler_destroy. */
ri_status_t mdl_sampler_create(const mdl_sampler_cfg_t *cfg, size_t n_vocab, mdl_sampler_t **s_p);
void mdl_sampler_destroy(mdl_sampler_t *s);

/* Pick a token from logits [n_vocab] (not modified). */
int32_t mdl_sample(mdl_sampler_t *s, const float *logits);

/* Index of the largest value (the first on ties). */
int32_t mdl_argmax(const float *v, size_t n);

#endif /* MDL_SAMPLE_H */
