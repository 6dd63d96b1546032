/*
 * The fork engine of `ri bench ruler-pkg` (rl_pkg.h): every prompt that
 * NVIDIA's RULER package made is prefilled once with exact attention and
 * decoded by every method from a fork of that prefill, as rl_run_trial does
 * with this suite's own prompts.  Through ri-worker's HTTP API each method
 * pays the whole prefill again; here five methods and three cluster sizes
 * cost one prefill, which is what makes a grid of 13 tasks x 20 samples
 * affordable on two cores.  The outputs are the same tokens: the worker
 * runs the same prefill and the same greedy loop (mdl_gen), which the
 * harness checks on its first cell when asked (--check-http).
 */
#define _GNU_SOURCE
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bench/ruler/rl_pkg.h"
#include "common/cm_alloc.h"
#include "common/cm_status.h"

static CM_ALLOC_TAG(rl_pkg_tag, "bench.ruler.pkg");

/* One input line: {"index": I, "ids": [..], "max_gen": N}.  *ids_p is
 * owned by the caller (cm_free).  RI_ERR_INVALID with a message. */
static ri_status_t rl_pkg_parse(const char *line, long lineno, int64_t *index_p, int32_t **ids_p, size_t *n_p,
                                int *max_gen_p)
{
    ri_status_t st = RI_ERR_INVALID;
    int32_t *ids = NULL;
    cJSON *o = cJSON_Parse(line);
    const cJSON *idx = cJSON_GetObjectItemCaseSensitive(o, "index");
    const cJSON *arr = cJSON_GetObjectItemCaseSensitive(o, "ids");
    const cJSON *mg = cJSON_GetObjectItemCaseSensitive(o, "max_gen");
    int n = cJSON_GetArraySize(arr);
    if (!cJSON_IsNumber(idx) || !cJSON_IsArray(arr) || n < 1 || !cJSON_IsNumber(mg) || mg->valueint < 1 ||
        mg->valueint > (int)CM_ARRAY_LEN(((rl_gen_t *)0)->toks)) {
        fprintf(stderr, "ri bench ruler: --prompts-in line %ld: want {\"index\", \"ids\": [..], \"max_gen\": 1..128}\n",
                lineno);
        goto out;
    }
    ids = cm_malloc(&rl_pkg_tag, (size_t)n * sizeof(*ids));
    if (ids == NULL) {
        st = RI_ERR_NOMEM;
        goto out;
    }
    int k = 0;
    for (const cJSON *e = arr->child; e != NULL; e = e->next) {
        if (!cJSON_IsNumber(e) || e->valuedouble < 0 || e->valuedouble > INT32_MAX) {
            fprintf(stderr, "ri bench ruler: --prompts-in line %ld: ids are token numbers\n", lineno);
            goto out;
        }
        ids[k++] = (int32_t)e->valuedouble;
    }
    *index_p = (int64_t)idx->valuedouble;
    *ids_p = ids, ids = NULL;
    *n_p = (size_t)n;
    *max_gen_p = mg->valueint;
    st = RI_OK;
out:
    cm_free(ids);
    cJSON_Delete(o);
    return st;
}

/* The output line of one method on one prompt. */
static void rl_pkg_write(FILE *out, int64_t index, const char *method, const rl_gen_t *g, size_t n_prompt,
                         double prefill_s)
{
    cJSON *o = cJSON_CreateObject();
    if (o == NULL)
        return;
    cJSON_AddNumberToObject(o, "index", (double)index);
    cJSON_AddStringToObject(o, "attn", method);
    cJSON_AddStringToObject(o, "pred", g->text);
    cJSON_AddNumberToObject(o, "prompt_tokens", (double)n_prompt);
    cJSON_AddNumberToObject(o, "completion_tokens", (double)(g->n - (g->stopped ? 1 : 0)));
    cJSON_AddNumberToObject(o, "prefill_s", prefill_s);
    cJSON_AddNumberToObject(o, "seconds", g->secs);
    if (g->st.decode_steps > 0)
        cJSON_AddNumberToObject(o, "budget_tokens", (double)g->st.exact_tokens / (double)g->st.decode_steps);
    if (g->st.tokens_per_cluster > 0)
        cJSON_AddNumberToObject(o, "tokens_per_cluster", g->st.tokens_per_cluster);
    char *text = cJSON_PrintUnformatted(o);
    if (text != NULL) {
        fprintf(out, "%s\n", text);
        cJSON_free(text);
    }
    cJSON_Delete(o);
}

/* One prompt: prefill, then every method from a fork.  Baselines take the
 * exact-token budget of "retroinfer" (or of the first retroinfer variant)
 * measured on the same prompt. */
static ri_status_t rl_pkg_prompt(const rl_run_t *run, FILE *out, int64_t index, const int32_t *ids, size_t n,
                                 int max_gen)
{
    mdl_model_t *m = run->model;
    mdl_seq_t *base = NULL;
    rl_gen_t *g = cm_calloc(&rl_pkg_tag, 1, sizeof(*g));
    float *logits = cm_malloc(&rl_pkg_tag, mdl_model_hparams(m)->n_vocab * sizeof(float));
    ri_status_t st = g == NULL || logits == NULL ? RI_ERR_NOMEM : RI_OK;
    double prefill_s = 0;
    if (st == RI_OK)
        st = rl_prefill(m, ids, n, (size_t)max_gen, logits, &base, &prefill_s);
    double budget = 0;
    bool budget_exact = false;   /* taken from "retroinfer" itself */
    for (size_t k = 0; k < run->n_methods && st == RI_OK; k++) {
        const char *name = run->methods[k];
        mdl_attn_cfg_t cfg = run->attn;
        uint32_t seg, ct;
        const mdl_attn_ops_t *attn = rl_method_attn(name, &seg, &ct);
        if (seg > 0)
            cfg.wave.segment_tokens = seg;
        if (ct > 0)
            cfg.wave.tokens_per_cluster = ct;
        if (rl_is_baseline(name) && budget > 0)
            cfg.budget_tokens = (uint32_t)lround(budget);
        st = rl_decode(m, base, logits, attn, &cfg, max_gen, g);
        if (st != RI_OK) {
            fprintf(stderr, "ri bench ruler: prompt %lld, %s: %s\n", (long long)index, name, ri_status_str(st));
            break;
        }
        bool retro = !strncmp(name, "retroinfer", 10) && strcmp(name, "retroinfer-remote") != 0;
        if (retro && g->st.decode_steps > 0 && !budget_exact) {
            budget = (double)g->st.exact_tokens / (double)g->st.decode_steps;
            budget_exact = !strcmp(name, "retroinfer");
        }
        rl_pkg_write(out, index, name, g, n, prefill_s);
    }
    fflush(out);
    if (st == RI_OK && run->verbose)
        printf("  prompt %lld: %zu tokens, prefill %.1f s, %zu methods\n", (long long)index, n, prefill_s,
               run->n_methods);
    mdl_seq_destroy(base);
    cm_free(logits);
    cm_free(g);
    return st;
}

int rl_pkg_run(const rl_run_t *run, const char *in_path, const char *out_path)
{
    int rc = 1;
    char *line = NULL;
    size_t cap = 0;
    long lineno = 0;
    FILE *in = fopen(in_path, "r");
    FILE *out = in != NULL ? fopen(out_path, "a") : NULL;
    if (in == NULL || out == NULL) {
        fprintf(stderr, "ri bench ruler: cannot open %s\n", in == NULL ? in_path : out_path);
        goto out;
    }
    while (getline(&line, &cap, in) > 0) {
        int64_t index;
        int32_t *ids;
        size_t n;
        int max_gen;
        lineno++;
        if (rl_pkg_parse(line, lineno, &index, &ids, &n, &max_gen) != RI_OK)
            goto out;
        ri_status_t st = rl_pkg_prompt(run, out, index, ids, n, max_gen);
        cm_free(ids);
        if (st != RI_OK)
            goto out;
    }
    rc = 0;
out:
    free(line);
    if (in != NULL)
        fclose(in);
    if (out != NULL && fclose(out) != 0 && rc == 0) {
        fprintf(stderr, "ri bench ruler: writing %s failed\n", out_path);
        rc = 1;
    }
    return rc;
}
