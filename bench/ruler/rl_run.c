/*
 * One trial (rl_run.h).  Budgets: quest, streaming and oracle attend as
 * many tokens exactly as retroinfer did in the same trial (its mean over
 * layer-steps, sinks, window and retrieved clusters together), so the
 * comparison holds whatever retroinfer's own budget rule is; without
 * retroinfer in the run they take the runtime's automatic budget.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bench/ruler/rl_prompt.h"
#include "bench/ruler/rl_run.h"
#include "bench/ruler/rl_score.h"
#include "common/cm_alloc.h"
#include "common/cm_status.h"
#include "common/cm_time.h"
#include "gpuworker/model/mdl_gen.h"
#include "gpuworker/model/mdl_sample.h"

static CM_ALLOC_TAG(rl_run_tag, "bench.ruler.run");

ri_status_t rl_prefill(mdl_model_t *m, const int32_t *ids, size_t n, size_t max_gen, float *logits,
                       mdl_seq_t **base_p, double *secs_p)
{
    double t0 = cm_time_s();
    ri_status_t st = mdl_seq_create(m, mdl_attn_find("full"), NULL, n + max_gen, base_p);
    if (st == RI_OK)
        st = mdl_prefill(m, *base_p, ids, n, logits, NULL, NULL, NULL);
    *secs_p = cm_time_s() - t0;
    return st;
}

ri_status_t rl_decode(mdl_model_t *m, const mdl_seq_t *base, const float *logits0, const mdl_attn_ops_t *attn,
                             const mdl_attn_cfg_t *cfg, int max_gen, rl_gen_t *g)
{
    const mdl_hparams_t *hp = mdl_model_hparams(m);
    const mdl_tok_t *tok = mdl_model_tok(m);
    mdl_seq_t *s;
    ri_status_t st = mdl_seq_fork(base, attn, cfg, &s);
    if (st != RI_OK)
        return st;
    float *logits = cm_malloc(&rl_run_tag, hp->n_vocab * sizeof(float));
    if (logits == NULL) {
        mdl_seq_destroy(s);
        return RI_ERR_NOMEM;
    }
    memcpy(logits, logits0, hp->n_vocab * sizeof(float));
    size_t ol = 0;
    g->n = 0;
    g->stopped = false;
    g->text[0] = '\0';
    mdl_gen_t gen;
    mdl_gen_init(&gen, tok, NULL, hp->n_vocab, CM_MIN((size_t)max_gen, CM_ARRAY_LEN(g->toks)), mdl_seq_len(s),
                 mdl_seq_cap(s));
    double t0 = cm_time_s();
    mdl_gen_end_t end = MDL_GEN_MORE;
    while (end == MDL_GEN_MORE && st == RI_OK) {
        int32_t next;
        end = mdl_gen_pick(&gen, logits, &next);
        g->toks[g->n++] = next;
        g->stopped = end == MDL_GEN_STOP;
        if (end == MDL_GEN_STOP)
            break;
        int l = mdl_tok_piece(tok, next, g->text + ol, sizeof(g->text) - ol - 1);
        if (l > 0 && ol + (size_t)l < sizeof(g->text) - 1)
            ol += (size_t)l;
        g->text[ol] = '\0';
        if (end == MDL_GEN_MORE) {
            mdl_seq_t *one[1] = {s};
            st = mdl_decode(m, one, &next, 1, logits);
        }
    }
    g->secs = cm_time_s() - t0;
    mdl_seq_attn_stats(s, &g->st);
    cm_free(logits);
    mdl_seq_destroy(s);
    return st;
}

/* The output on one line, at most 100 characters. */
static void rl_print_out(const char *method, bool pass, int found, int n, const char *text)
{
    char line[101];
    size_t k = 0;
    for (const char *p = text; *p && k < sizeof(line) - 1; p++)
        line[k++] = *p == '\n' || *p == '\r' ? ' ' : *p;
    line[k] = '\0';
    printf("    %-18s %-4s %d/%d |%s|\n", method, pass ? "PASS" : "fail", found, n, line);
}

static void rl_cell_add(rl_cell_t *c, const rl_sample_t *s, const rl_gen_t *g, const rl_gen_t *full, size_t n_prompt,
                        double prefill_s)
{
    int found = rl_score_found(g->text, (const char(*)[48])s->answers, s->n_answers);
    size_t prefix, same;
    rl_score_agree(full->toks, full->n, g->toks, g->n, &prefix, &same);
    c->trials++;
    c->passed += found == s->n_answers;
    c->recall_sum += (double)found / s->n_answers;
    c->agree_prefix += prefix;
    c->agree_same += same;
    c->agree_n += full->n;
    c->exact_tokens += g->st.exact_tokens;
    c->decode_steps += g->st.decode_steps;
    c->tokens_per_cluster = CM_MAX(c->tokens_per_cluster, g->st.tokens_per_cluster);
    c->prefill_s += prefill_s;
    c->decode_s += g->secs;
    c->prompt_tokens += n_prompt;
    c->gen_tokens += g->n;
}

/* The trial's output for the JSON file (for auditing the scores). */
static void rl_record(cJSON *outputs, rl_task_t t, size_t ctx, int trial, const char *method, const rl_sample_t *s,
                      const rl_gen_t *g, int found)
{
    cJSON *o = outputs ? cJSON_CreateObject() : NULL;
    if (o == NULL)
        return;
    cJSON_AddStringToObject(o, "task", rl_task_name(t));
    cJSON_AddNumberToObject(o, "context", (double)ctx);
    cJSON_AddNumberToObject(o, "trial", trial);
    cJSON_AddStringToObject(o, "attn", method);
    cJSON *exp = cJSON_AddArrayToObject(o, "expected");
    for (int i = 0; exp != NULL && i < s->n_answers; i++)
        cJSON_AddItemToArray(exp, cJSON_CreateString(s->answers[i]));
    cJSON_AddStringToObject(o, "output", g->text);
    cJSON_AddNumberToObject(o, "found", found);
    cJSON_AddBoolToObject(o, "pass", found == s->n_answers);
    cJSON_AddItemToArray(outputs, o);
}

/* A method name: a backend's, or retroinfer with one setting changed, so
 * that settings are compared on the same prefill of the same prompt:
 * "retroinfer@segN" (the index built in blocks of N tokens) or
 * "retroinfer@ctN" (N tokens per cluster).  The backend; *seg_p and *ct_p
 * get N for their suffix, else 0; NULL for an unknown name or a bad N. */
const mdl_attn_ops_t *rl_method_attn(const char *name, uint32_t *seg_p, uint32_t *ct_p)
{
    const char *at = strchr(name, '@');
    *seg_p = *ct_p = 0;
    if (at == NULL)
        return mdl_attn_find(name);
    size_t skip = strncmp(at, "@seg", 4) == 0 ? 4 : strncmp(at, "@ct", 3) == 0 ? 3 : 0;
    char *end;
    unsigned long n = skip ? strtoul(at + skip, &end, 10) : 0;
    if (skip == 0 || (size_t)(at - name) != strlen("retroinfer") || strncmp(name, "retroinfer", (size_t)(at - name))
        || *end != '\0' || end == at + skip || n == 0)
        return NULL;
    if (skip == 4 && n <= (1ul << 30))
        *seg_p = (uint32_t)n;
    else if (skip == 3 && n <= 4096)
        *ct_p = (uint32_t)n;
    else
        return NULL;
    return mdl_attn_find("retroinfer");
}

bool rl_is_baseline(const char *name)
{
    return strcmp(name, "quest") == 0 || strcmp(name, "streaming") == 0 || strcmp(name, "oracle") == 0;
}

ri_status_t rl_run_trial(const rl_run_t *run, rl_task_t t, size_t ctx, int trial, int trials, rl_cell_t *cells)
{
    mdl_model_t *m = run->model;
    const mdl_hparams_t *hp = mdl_model_hparams(m);
    uint64_t seed = rl_seed_mix(run->seed, (uint64_t)t + 1, ctx, (uint64_t)trial);
    double depth = ((double)trial + 0.5) / trials;   /* the asked-for needle: evenly over the trials */
    int max_gen = rl_task_max_gen(t);
    rl_sample_t s = {0};
    int32_t *ids = NULL;
    size_t n = 0;
    mdl_seq_t *base = NULL;
    rl_gen_t *gen = cm_calloc(&rl_run_tag, run->n_methods, sizeof(*gen));
    float *logits = cm_malloc(&rl_run_tag, hp->n_vocab * sizeof(float));
    ri_status_t st = gen == NULL || logits == NULL ? RI_ERR_NOMEM : RI_OK;
    if (st == RI_OK && ctx <= (size_t)max_gen + 16)
        st = RI_ERR_RANGE;
    if (st == RI_OK)
        st = rl_prompt_fit(mdl_model_tok(m), t, seed, depth, ctx - (size_t)max_gen, &s, &ids, &n);
    double prefill_s = 0;
    if (st == RI_OK)
        st = rl_prefill(m, ids, n, (size_t)max_gen, logits, &base, &prefill_s);
    if (st != RI_OK) {
        fprintf(stderr, "ri bench ruler: %s at %zu, trial %d: %s\n", rl_task_name(t), ctx, trial,
                st == RI_ERR_RANGE ? "the prompt does not fit" : "prefill failed");
        goto out;
    }
    if (run->show_prompt)
        printf("---- prompt (%s) ----\n%s\n---- answer opener ----\n%s\n----\n", rl_prompt_chat(mdl_model_tok(m))
               ? "user message of the chat template" : "completion text", s.user.s,
               rl_prompt_prefix(mdl_model_tok(m), &s));
    printf("  %-15s ctx %-6zu trial %-2d prompt %zu tok, prefill %.1f s, expect:", rl_task_name(t), ctx, trial, n,
           prefill_s);
    for (int i = 0; i < s.n_answers; i++)
        printf(" %s", s.answers[i]);
    printf("\n");
    double retro_budget = 0;   /* retroinfer's mean exact tokens per head and layer-step in this trial */
    for (size_t k = 0; k < run->n_methods && st == RI_OK; k++) {
        mdl_attn_cfg_t cfg = run->attn;
        uint32_t seg, ct;
        const mdl_attn_ops_t *attn = rl_method_attn(run->methods[k], &seg, &ct);
        if (rl_is_baseline(run->methods[k]) && retro_budget > 0)
            cfg.budget_tokens = (uint32_t)lround(retro_budget);
        if (seg > 0)
            cfg.wave.segment_tokens = seg;
        if (ct > 0)
            cfg.wave.tokens_per_cluster = ct;
        st = rl_decode(m, base, logits, attn, &cfg, max_gen, &gen[k]);
        if (st != RI_OK) {
            fprintf(stderr, "ri bench ruler: %s decode failed: %s\n", run->methods[k], ri_status_str(st));
            break;
        }
        if (strcmp(run->methods[k], "retroinfer") == 0 && gen[k].st.decode_steps > 0)
            retro_budget = (double)gen[k].st.exact_tokens / (double)gen[k].st.decode_steps;
        rl_cell_add(&cells[k], &s, &gen[k], &gen[0], n, prefill_s);
        int found = rl_score_found(gen[k].text, (const char(*)[48])s.answers, s.n_answers);
        rl_record(run->outputs, t, ctx, trial, run->methods[k], &s, &gen[k], found);
        if (run->verbose)
            rl_print_out(run->methods[k], found == s.n_answers, found, s.n_answers, gen[k].text);
    }
    fflush(stdout);
out:
    mdl_seq_destroy(base);
    cm_free(ids);
    cm_free(logits);
    cm_free(gen);
    rl_sample_free(&s);
    return st;
}
