/* Sampling (see mdl_sample.h). */
#include "gpuworker/model/mdl_sample.h"

#include <math.h>
#include <stdlib.h>

#include "common/cm_alloc.h"

static CM_ALLOC_TAG(mdl_sample_tag, "model.sample");

typedef struct mdl_cand {
    float p;     /* probability */
    int32_t id;  /* token */
} mdl_cand_t;

struct mdl_sampler {
    mdl_sampler_cfg_t cfg;  /* settings */
    uint64_t rng;           /* splitmix64 state */
    size_t n;               /* vocabulary */
    mdl_cand_t *cand;       /* [n] scratch; NULL when greedy */
};

ri_status_t mdl_sampler_create(const mdl_sampler_cfg_t *cfg, size_t n_vocab, mdl_sampler_t **s_p)
{
    if (n_vocab == 0 || !(cfg->temperature >= 0) || !(cfg->top_p > 0 && cfg->top_p <= 1))
        return RI_ERR_INVALID;
    mdl_sampler_t *s = cm_calloc(&mdl_sample_tag, 1, sizeof(*s));
    if (s == NULL)
        return RI_ERR_NOMEM;
    /* A greedy sequence needs no candidates: not holding a vocabulary's
     * worth (384 KiB on SmolLM2) keeps it down to its K/V. */
    if (cfg->temperature > 0)
        s->cand = cm_malloc(&mdl_sample_tag, n_vocab * sizeof(*s->cand));
    if (cfg->temperature > 0 && s->cand == NULL) {
        cm_free(s);
        return RI_ERR_NOMEM;
    }
    s->cfg = *cfg;
    s->n = n_vocab;
    s->rng = cfg->seed ^ 0x9E3779B97F4A7C15ull;
    *s_p = s;
    return RI_OK;
}

void mdl_sampler_destroy(mdl_sampler_t *s)
{
    if (s == NULL)
        return;
    cm_free(s->cand);
    cm_free(s);
}

int32_t mdl_argmax(const float *v, size_t n)
{
    size_t best = 0;
    for (size_t i = 1; i < n; i++)
        if (v[i] > v[best])
            best = i;
    return (int32_t)best;
}

static double mdl_uniform(mdl_sampler_t *s)
{
    uint64_t z = (s->rng += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    z ^= z >> 31;
    return (double)(z >> 11) / 9007199254740992.0;
}

static int mdl_cand_cmp(const void *a, const void *b)
{
    const mdl_cand_t *x = a, *y = b;
    if (x->p != y->p)
        return x->p < y->p ? 1 : -1;
    return x->id - y->id;
}

int32_t mdl_sample(mdl_sampler_t *s, const float *logits)
{
    if (s->cfg.temperature <= 0)
        return mdl_argmax(logits, s->n);
    float mx = logits[mdl_argmax(logits, s->n)];
    double sum = 0;
    size_t nc = 0;
    for (size_t i = 0; i < s->n; i++) {
        float p = expf((logits[i] - mx) / s->cfg.temperature);
        sum += p;
        /* tokens under 1e-9 of the best cannot matter for any top-p we accept */
        if (p > 1e-9f)
            s->cand[nc++] = (mdl_cand_t){.p = p, .id = (int32_t)i};
    }
    qsort(s->cand, nc, sizeof(*s->cand), mdl_cand_cmp);
    double keep = 0;
    size_t k = 0;
    while (k < nc) {
        keep += s->cand[k++].p;
        if (keep >= s->cfg.top_p * sum)
            break;
    }
    double r = mdl_uniform(s) * keep;
    for (size_t i = 0; i < k; i++) {
        r -= s->cand[i].p;
        if (r <= 0)
            return s->cand[i].id;
    }
    return s->cand[k - 1].id;
}
