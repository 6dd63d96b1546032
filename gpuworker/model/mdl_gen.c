/*
 * Token generation (see mdl_gen.h): the pick step and the simple loop over
 * it.  Decode speed is the model's; this file only orders the steps.
 */
#include "gpuworker/model/mdl_gen.h"

#include <string.h>

#include "common/cm_time.h"

void mdl_gen_init(mdl_gen_t *g, const mdl_tok_t *tok, mdl_sampler_t *smp, size_t n_vocab, size_t max_tokens,
                  size_t len, size_t cap)
{
    memset(g, 0, sizeof(*g));
    g->tok = tok;
    g->smp = smp;
    g->n_vocab = n_vocab;
    g->max_tokens = max_tokens;
    g->len = len;
    g->cap = cap;
}

mdl_gen_end_t mdl_gen_pick(mdl_gen_t *g, const float *logits, int32_t *tok_p)
{
    int32_t id = g->smp != NULL ? mdl_sample(g->smp, logits) : mdl_argmax(logits, g->n_vocab);
    *tok_p = id;
    if (!g->ignore_stop && mdl_tok_is_stop(g->tok, id))
        return MDL_GEN_STOP;
    g->n_gen++;
    if (g->n_gen >= g->max_tokens || g->len >= g->cap)
        return MDL_GEN_LENGTH;
    g->len++; /* the caller decodes id */
    return MDL_GEN_MORE;
}

ri_status_t mdl_generate(mdl_model_t *m, mdl_seq_t *seq, const int32_t *ids, size_t n_ids, float *logits,
                         const mdl_gen_cfg_t *cfg, mdl_gen_result_t *res_p)
{
    mdl_gen_result_t res = {0};
    ri_status_t st = RI_OK;
    double t0 = cm_time_s();
    if (n_ids > 0) {
        st = mdl_prefill(m, seq, ids, n_ids, logits, NULL, cfg->progress, cfg->progress_arg);
        res.prefill_s = cm_time_s() - t0;
        if (st != RI_OK)
            goto done;
    }
    mdl_gen_t g;
    mdl_gen_init(&g, mdl_model_tok(m), cfg->smp, mdl_model_hparams(m)->n_vocab, cfg->max_tokens, mdl_seq_len(seq),
                 mdl_seq_cap(seq));
    double t1 = cm_time_s();
    res.decoding = true;
    for (;;) {
        int32_t id;
        res.end = mdl_gen_pick(&g, logits, &id);
        if (res.end == MDL_GEN_STOP)
            break;
        if (cfg->on_token != NULL)
            cfg->on_token(cfg->token_arg, id);
        if (res.end == MDL_GEN_LENGTH)
            break;
        if (cfg->decode != NULL) {
            st = cfg->decode(cfg->decode_arg, id, logits);
        } else {
            mdl_seq_t *one[1] = {seq};
            st = mdl_decode(m, one, &id, 1, logits);
        }
        if (st != RI_OK)
            break;
        if (++res.steps == 1)
            res.first_step_s = cm_time_s() - t1;
    }
    res.n_gen = g.n_gen;
    res.decode_s = cm_time_s() - t1;
done:
    *res_p = res;
    return st;
}
