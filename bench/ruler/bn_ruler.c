/*
 * ri bench ruler: a RULER-style long-context accuracy suite on the real
 * model (rl_task.h: niah_single, niah_multikey, niah_multivalue, vt, cwe,
 * qa).  Per trial the prompt (generated prose or word list, fixed by the
 * seed) is sized to the context, prefilled once with exact attention and
 * decoded greedily by every method from a fork of that state; a trial
 * passes when the output contains every expected item.  Per cell (model,
 * task, context, method): pass rate with its 95% Wilson interval, the share
 * of expected items found, agreement with full attention's tokens, the
 * exact tokens attended per head and layer-step, prefill and decode time.
 *
 *   ri bench ruler [--model NAME|PATH] [--contexts L,..] [--tasks T,..] [--trials N]
 *                  [--methods full,retroinfer,quest,streaming[,retroinfer-remote]]
 *                  [--seed S] [--retrieval-min T] [--window T] [--adapt-tau X] [--trial K]
 *                  [--cluster-tokens T] [--estimation X] [--segment-tokens B]
 *                  [--quick] [--quiet] [--show-prompt] [--json PATH]
 *   ri bench ruler --prompts-in IN --preds-out OUT [--model ..] [--methods ..]
 *
 * Defaults: 4K, 8K, 16K, 32K for a model trained to 32K (Gemma 3 270M), the
 * lengths up to the trained context otherwise (4K, 8K for SmolLM2); 10
 * trials per cell up to 8K, 5 beyond; seed 1.  --quick: one trial of every
 * task at 1,200 tokens (for tests).  The --json file is rewritten after each
 * task, marked "partial" until the run ends.  --trial K runs only trial K
 * of the cell's N (the same prompt as in the full run: the needle's depth
 * depends on K and N), for looking at one failure under other settings.
 * --prompts-in runs prompts made elsewhere (NVIDIA's RULER package) through
 * the same fork engine instead of this suite's own (rl_pkg.h).
 */
#define _GNU_SOURCE
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bench/common/bn_args.h"
#include "bench/common/bn_report.h"
#include "bench/ruler/rl_pkg.h"
#include "bench/ruler/rl_run.h"
#include "bench/ruler/rl_score.h"
#include "common/cm_alloc.h"
#include "common/cm_log.h"
#include "common/cm_runtime.h"

#define RL_MAX_CTX 8
#define RL_REMOTE "retroinfer-remote"

typedef struct rl_opts {
    const char *model;                 /* --model (NULL: the default) */
    size_t ctx[RL_MAX_CTX];            /* --contexts */
    size_t n_ctx;                      /* 0: the default for the model */
    rl_task_t tasks[RL_N_TASKS];       /* --tasks */
    size_t n_tasks;
    int trials;                        /* --trials (0: by context) */
    char methods[256];                 /* --methods */
    uint64_t seed;                     /* --seed */
    long retrieval_min;                /* --retrieval-min; -1: the default floor */
    long window;                       /* --window; -1: the default steady window */
    double adapt_tau;                  /* --adapt-tau; < 0: the default (off) */
    int only_trial;                    /* --trial; -1: every trial */
    long cluster_tokens;               /* --cluster-tokens; -1: kn_wave's choice */
    long segment_tokens;               /* --segment-tokens; -1: kn_wave's block */
    double estimation;                 /* --estimation; < 0: the default share */
    const char *prompts_in, *preds_out; /* --prompts-in, --preds-out (borrowed; NULL: the suite's prompts) */
    bool quick, quiet, show_prompt;
} rl_opts_t;

/* The command line (bn_args): the table's fields, turned into rl_opts_t by
 * rl_opts_from.  A -1 default keeps the attention config's own value. */
typedef struct rl_args {
    char *json, *model, *contexts, *tasks, *methods, *prompts_in, *preds_out;
    int64_t trials, seed, retrieval_min, window, only_trial, cluster_tokens, segment_tokens;
    double adapt_tau, estimation;
    bool quick, quiet, show_prompt;
} rl_args_t;

static const cm_config_item_t rl_items[] = {
    BN_ARG_JSON(rl_args_t, json),
    BN_ARG(rl_args_t, "model", CM_CFG_STRING, NULL, "model NAME or PATH (empty: the default)", model, 0, 0),
    BN_ARG(rl_args_t, "contexts", CM_CFG_STRING, NULL,
           "context lengths in tokens, K/M suffixes (empty: 4K,8K,16K,32K up to the model's)", contexts, 0, 0),
    BN_ARG(rl_args_t, "tasks", CM_CFG_STRING, "niah_single,niah_multikey,niah_multivalue,vt,cwe,qa", "tasks to run",
           tasks, 0, 0),
    BN_ARG(rl_args_t, "trials", CM_CFG_INT, "0", "trials per cell (0: 10 up to 8K, 5 beyond)", trials, 0, 1 << 20),
    BN_ARG(rl_args_t, "methods", CM_CFG_STRING, "full,retroinfer,quest,streaming",
           "attention backends (full,retroinfer,quest,streaming,oracle," RL_REMOTE ")", methods, 0, 0),
    BN_ARG(rl_args_t, "seed", CM_CFG_INT, "1", "seed of the prompts", seed, 0, INT64_MAX),
    BN_ARG(rl_args_t, "retrieval-min", CM_CFG_INT, "-1", "retroinfer: retrieval floor in tokens (-1: the default)",
           retrieval_min, -1, 1 << 30),
    BN_ARG(rl_args_t, "window", CM_CFG_INT, "-1", "retroinfer: steady window in tokens, >= 1 (-1: the default)",
           window, -1, 1 << 30),
    BN_ARG(rl_args_t, "adapt-tau", CM_CFG_DOUBLE, "-1", "retroinfer: per-head cut in [0, 1) (-1: off)", adapt_tau,
           -1, 1),
    BN_ARG(rl_args_t, "trial", CM_CFG_INT, "-1", "run only trial K of each cell (-1: every trial)", only_trial, -1,
           1 << 20),
    BN_ARG(rl_args_t, "cluster-tokens", CM_CFG_INT, "-1", "retroinfer: tokens per cluster, 1..4096 (-1: kn_wave's)",
           cluster_tokens, -1, 4096),
    BN_ARG(rl_args_t, "segment-tokens", CM_CFG_INT, "-1",
           "retroinfer: the index build's block in tokens, >= 1 (-1: kn_wave's)", segment_tokens, -1, 1 << 30),
    BN_ARG(rl_args_t, "estimation", CM_CFG_DOUBLE, "-1", "retroinfer: estimation share in [0, 1] (-1: the default)",
           estimation, -1, 1),
    BN_ARG(rl_args_t, "prompts-in", CM_CFG_STRING, NULL,
           "run these prompts instead of the suite's: JSON lines {index, ids, max_gen} (rl_pkg.h)", prompts_in, 0, 0),
    BN_ARG(rl_args_t, "preds-out", CM_CFG_STRING, NULL, "with --prompts-in: append each method's output here",
           preds_out, 0, 0),
    BN_ARG(rl_args_t, "quick", CM_CFG_BOOL, "false", "one trial of every task at 1,200 tokens (for tests)", quick, 0,
           0),
    BN_ARG(rl_args_t, "quiet", CM_CFG_BOOL, "false", "no per-trial lines", quiet, 0, 0),
    BN_ARG(rl_args_t, "show-prompt", CM_CFG_BOOL, "false", "print each prompt", show_prompt, 0, 0),
};
static const cm_config_table_t rl_table = {"ri bench ruler", "RI_BENCH_RULER_", rl_items, CM_ARRAY_LEN(rl_items), 0,
                                           NULL};

/* The values the table's bounds cannot say: 0 where -1 is the default, the
 * open end of --adapt-tau.  False (with a message) on the first bad one. */
static bool rl_args_check(const rl_args_t *a)
{
    const char *bad = a->window == 0 ? "--window is a token count >= 1"
                      : a->adapt_tau >= 1 ? "--adapt-tau is in [0, 1)"
                      : a->cluster_tokens == 0 ? "--cluster-tokens is 1..4096"
                      : a->segment_tokens == 0 ? "--segment-tokens is a token count >= 1"
                      : (a->prompts_in != NULL) != (a->preds_out != NULL)
                          ? "--prompts-in and --preds-out go together"
                      : (a->adapt_tau < 0 && a->adapt_tau != -1) || (a->estimation < 0 && a->estimation != -1)
                          ? "--adapt-tau and --estimation are -1 (the default) or >= 0"
                          : NULL;
    if (bad != NULL)
        fprintf(stderr, "ri bench ruler: %s\n", bad);
    return bad == NULL;
}

/* Fill o from the parsed table a (o->model borrows a's string).  Returns 0,
 * or -1 with a message when a list is bad. */
static int rl_opts_from(const rl_args_t *a, rl_opts_t *o)
{
    if (!rl_args_check(a))
        return -1;
    *o = (rl_opts_t){.model = a->model, .trials = (int)a->trials, .seed = (uint64_t)a->seed,
                     .retrieval_min = (long)a->retrieval_min, .window = (long)a->window, .adapt_tau = a->adapt_tau,
                     .only_trial = (int)a->only_trial, .cluster_tokens = (long)a->cluster_tokens,
                     .segment_tokens = (long)a->segment_tokens,
                     .estimation = a->estimation, .prompts_in = a->prompts_in, .preds_out = a->preds_out, .quick = a->quick, .quiet = a->quiet, .show_prompt = a->show_prompt};
    if (a->contexts != NULL && a->contexts[0] != '\0') {
        o->n_ctx = bn_args_counts(a->contexts, o->ctx, RL_MAX_CTX);
        if (o->n_ctx == 0) {
            fprintf(stderr, "ri bench ruler: --contexts '%s' is not a comma list of up to %d lengths (4096, 8K)\n",
                    a->contexts, RL_MAX_CTX);
            return -1;
        }
    }
    char buf[256];
    snprintf(buf, sizeof(buf), "%s", a->tasks ? a->tasks : "");
    for (char *save = NULL, *t = strtok_r(buf, ",", &save); t; t = strtok_r(NULL, ",", &save))
        if (o->n_tasks >= RL_N_TASKS || !rl_task_parse(t, &o->tasks[o->n_tasks++])) {
            fprintf(stderr, "ri bench ruler: --tasks: unknown task '%s' (have: niah_single, niah_multikey, "
                            "niah_multivalue, vt, cwe, qa)\n", t);
            return -1;
        }
    if (o->n_tasks == 0) {
        fprintf(stderr, "ri bench ruler: --tasks is empty\n");
        return -1;
    }
    snprintf(o->methods, sizeof(o->methods), "%s", a->methods ? a->methods : "");
    return 0;
}

/* Methods in run order: full first (the reference of agreement), then
 * retroinfer (whose budget the baselines take), then the others as given. */
static int rl_methods(char *list, const char **out, size_t *n_p, bool *remote_p)
{
    const char *given[RL_MAX_METHODS];
    size_t n = 0, k = 0;
    for (char *save = NULL, *t = strtok_r(list, ",", &save); t; t = strtok_r(NULL, ",", &save)) {
        if (n >= RL_MAX_METHODS - 1) {
            fprintf(stderr, "ri bench ruler: at most %d methods\n", RL_MAX_METHODS - 1);
            return -1;
        }
        given[n++] = t;
    }
    *remote_p = false;
    out[k++] = "full";
    const char *first[] = {"retroinfer", RL_REMOTE};
    for (size_t f = 0; f < 2; f++)
        for (size_t i = 0; i < n; i++)
            if (!strcmp(given[i], first[f])) {
                out[k++] = first[f];
                break;
            }
    for (size_t i = 0; i < n; i++) {
        bool dup = false;
        for (size_t j = 0; j < k && !dup; j++)
            dup = !strcmp(out[j], given[i]);
        if (!dup)
            out[k++] = given[i];
        *remote_p |= !strcmp(given[i], RL_REMOTE);
    }
    *n_p = k;
    return 0;
}

/* The cell's row in the report. */
static void rl_row_add(bn_report_t *rep, const char *model, rl_task_t t, size_t ctx, const char *method,
                       const rl_cell_t *c)
{
    double lo, hi;
    rl_score_wilson(c->passed, c->trials, &lo, &hi);
    cJSON *row = bn_report_row(rep);
    cJSON_AddStringToObject(row, "model", model);
    cJSON_AddStringToObject(row, "task", rl_task_name(t));
    cJSON_AddNumberToObject(row, "context", (double)ctx);
    cJSON_AddStringToObject(row, "attn", method);
    cJSON_AddNumberToObject(row, "trials", c->trials);
    cJSON_AddNumberToObject(row, "passed", c->passed);
    cJSON_AddNumberToObject(row, "budget_tokens", c->decode_steps ? (double)c->exact_tokens / c->decode_steps : 0);
    if (c->tokens_per_cluster > 0) /* the size the index used, not the setting (0 = auto) */
        cJSON_AddNumberToObject(row, "tokens_per_cluster", c->tokens_per_cluster);
    cJSON_AddNumberToObject(row, "pass_rate", (double)c->passed / c->trials);
    cJSON_AddNumberToObject(row, "ci_low", lo);
    cJSON_AddNumberToObject(row, "ci_high", hi);
    cJSON_AddNumberToObject(row, "recall", c->recall_sum / c->trials);
    cJSON_AddNumberToObject(row, "agreement", c->agree_n ? (double)c->agree_prefix / c->agree_n : 1);
    cJSON_AddNumberToObject(row, "agreement_all", c->agree_n ? (double)c->agree_same / c->agree_n : 1);
    cJSON_AddNumberToObject(row, "prefill_s", c->prefill_s / c->trials);
    cJSON_AddNumberToObject(row, "decode_s", c->decode_s / c->trials);
    cJSON_AddNumberToObject(row, "prompt_tokens", (double)c->prompt_tokens / c->trials);
    cJSON_AddNumberToObject(row, "gen_tokens", (double)c->gen_tokens / c->trials);
}

static void rl_row_print(rl_task_t t, size_t ctx, const char *method, const rl_cell_t *c)
{
    double lo, hi;
    rl_score_wilson(c->passed, c->trials, &lo, &hi);
    printf("%-16s %6zu %-18s %3d/%-3d %5.2f [%4.2f, %4.2f] %6.2f %6.2f %8.0f %8.1f %8.2f\n", rl_task_name(t), ctx,
           method, c->passed, c->trials, (double)c->passed / c->trials, lo, hi, c->recall_sum / c->trials,
           c->agree_n ? (double)c->agree_prefix / c->agree_n : 1,
           c->decode_steps ? (double)c->exact_tokens / c->decode_steps : 0, c->prefill_s / c->trials,
           c->decode_s / c->trials);
}

/* The report so far, marked partial, so that a run stopped midway keeps
 * the tasks it finished (bn_report_finish writes the complete file). */
static void rl_save_partial(bn_report_t *rep, const char *json)
{
    if (json == NULL)
        return;
    cJSON *root = bn_report_root(rep);
    cJSON_DeleteItemFromObject(root, "partial");
    cJSON_AddTrueToObject(root, "partial");
    char *text = cJSON_Print(root);
    FILE *f = text ? fopen(json, "w") : NULL;
    if (f != NULL) {
        fputs(text, f);
        fclose(f);
    }
    cJSON_DeleteItemFromObject(root, "partial");
    cJSON_free(text);
}

static void rl_table_head(void)
{
    printf("%-16s %6s %-18s %7s %5s %12s %6s %6s %8s %8s %8s\n", "task", "ctx", "method", "passed", "rate",
           "95% CI", "recall", "agree", "budget", "prefill", "decode");
}

/* The run of the parsed options o; json (may be NULL) is the report file. */
static int rl_main(rl_opts_t *o, const char *json, const char *argv0)
{
    char rt_err[256];
    if (cm_runtime_setup_from_env(mdl_runtime_apply, rt_err, sizeof(rt_err)) != RI_OK) {
        fprintf(stderr, "ri bench ruler: %s\n", rt_err);
        return 2;
    }
    rl_run_t run = {.seed = o->seed, .verbose = !o->quiet, .show_prompt = o->show_prompt};
    /* retroinfer's settings for every sequence of the run (the baselines
     * take retroinfer's measured budget either way) */
    mdl_attn_cfg_t *acfg = &run.attn;
    mdl_attn_cfg_default(acfg);
    if (o->retrieval_min >= 0)
        acfg->wave.retrieval_min_tokens = (uint32_t)o->retrieval_min;
    if (o->window >= 0)
        acfg->wave.window_tokens = (uint32_t)o->window;
    if (o->adapt_tau >= 0)
        acfg->wave.adapt_tau = (float)o->adapt_tau;
    if (o->cluster_tokens >= 0)
        acfg->wave.tokens_per_cluster = (uint32_t)o->cluster_tokens;
    if (o->estimation >= 0)
        acfg->wave.estimation_frac = (float)o->estimation;
    if (o->segment_tokens > 0)
        acfg->wave.segment_tokens = (uint32_t)o->segment_tokens;
    bool remote;
    if (rl_methods(o->methods, run.methods, &run.n_methods, &remote) != 0)
        return 2;
    char path[4096], err[512];
    if (mdl_model_resolve(o->model, path, sizeof(path)) != RI_OK) {
        fprintf(stderr, "ri bench ruler: no model at %s; run ./ri setup (names: %s)\n", path, mdl_model_names());
        return 1;
    }
    if (remote && rl_remote_start(argv0) != 0)
        return 1;
    for (size_t k = 0; k < run.n_methods; k++) {
        uint32_t seg, ct;
        if (rl_method_attn(run.methods[k], &seg, &ct) == NULL) {
            fprintf(stderr, "ri bench ruler: unknown method '%s' (have: %s, retroinfer@segN, retroinfer@ctN)\n",
                    run.methods[k],
                    mdl_attn_names());
            rl_remote_stop();
            return 2;
        }
    }
    if (mdl_model_load(path, &run.model, err, sizeof(err)) != RI_OK) {
        fprintf(stderr, "ri bench ruler: %s\n", err);
        rl_remote_stop();
        return 1;
    }
    if (o->prompts_in != NULL) {
        int rc = rl_pkg_run(&run, o->prompts_in, o->preds_out);
        mdl_model_destroy(run.model);
        rl_remote_stop();
        return rc;
    }
    const mdl_hparams_t *hp = mdl_model_hparams(run.model);
    const char *model = o->model && o->model[0] ? o->model : "smollm2-135m";
    if (o->quick) {   /* just over retroinfer's indexing threshold (sinks + window + 1,024) */
        if (o->n_ctx == 0)
            o->ctx[0] = 1200, o->n_ctx = 1;
        o->trials = o->trials ? o->trials : 1;
    } else if (o->n_ctx == 0) {
        const size_t def[] = {4096, 8192, 16384, 32768};
        for (size_t i = 0; i < 4; i++)
            if (def[i] <= hp->n_ctx)
                o->ctx[o->n_ctx++] = def[i];
    }
    bn_report_t *rep = bn_report_create("ruler");
    if (rep == NULL)
        return 1;
    cJSON *root = bn_report_root(rep);
    cJSON_AddStringToObject(root, "model", model);
    cJSON_AddStringToObject(root, "model_name", mdl_model_name(run.model));
    cJSON_AddBoolToObject(root, "chat_template", mdl_tok_has_chat(mdl_model_tok(run.model)));
    cJSON_AddNumberToObject(root, "seed", (double)o->seed);
    const kn_wave_params_t *used = &run.attn.wave; /* as set; each row has the cluster size used */
    cJSON_AddNumberToObject(root, "retrieval_min_tokens", used->retrieval_min_tokens);
    cJSON_AddNumberToObject(root, "window_tokens", used->window_tokens);
    cJSON_AddNumberToObject(root, "adapt_tau", used->adapt_tau);
    /* the setting (0 = auto); "tokens_per_cluster" names only a size an index used (the rows') */
    cJSON_AddNumberToObject(root, "tokens_per_cluster_setting", used->tokens_per_cluster);
    cJSON_AddNumberToObject(root, "estimation_frac", used->estimation_frac);
    cJSON_AddNumberToObject(root, "segment_tokens", used->segment_tokens);
    if (o->only_trial >= 0)
        cJSON_AddNumberToObject(root, "only_trial", o->only_trial);
    run.outputs = cJSON_AddArrayToObject(root, "outputs");
    cJSON_AddStringToObject(root, "scoring", "pass: every expected item in the output (case-insensitive, whole "
                                             "words); recall: the share of items found");
    printf("ri bench ruler: model %s (%s prompts), seed %llu, methods", model,
           mdl_tok_has_chat(mdl_model_tok(run.model)) ? "chat-template" : "completion", (unsigned long long)o->seed);
    for (size_t k = 0; k < run.n_methods; k++)
        printf(" %s", run.methods[k]);
    printf("\n");
    int rc = 0;
    for (size_t c = 0; c < o->n_ctx && rc == 0; c++) {
        size_t ctx = o->ctx[c];
        int trials = o->trials ? o->trials : ctx <= 8192 ? 10 : 5;
        if (o->only_trial >= trials) {
            fprintf(stderr, "ri bench ruler: --trial %d, but a cell at %zu has %d trials\n", o->only_trial, ctx, trials);
            rc = 2;
            break;
        }
        if (ctx > hp->n_ctx) {
            char name[64], why[128];
            snprintf(name, sizeof(name), "context=%zu", ctx);
            snprintf(why, sizeof(why), "beyond the model's trained context of %u", hp->n_ctx);
            bn_report_skip(rep, name, why);
            printf("context %zu skipped: %s\n", ctx, why);
            continue;
        }
        rl_cell_t cells[RL_N_TASKS][RL_MAX_METHODS];
        memset(cells, 0, sizeof(cells));
        for (size_t t = 0; t < o->n_tasks && rc == 0; t++) {
            for (int i = 0; i < trials && rc == 0; i++)
                if (o->only_trial >= 0 && i != o->only_trial)
                    continue;
                else if (rl_run_trial(&run, o->tasks[t], ctx, i, trials, cells[t]) != RI_OK)
                    rc = 1;
            if (rc != 0)
                break;
            for (size_t k = 0; k < run.n_methods; k++) {
                rl_row_add(rep, model, o->tasks[t], ctx, run.methods[k], &cells[t][k]);
                rl_row_print(o->tasks[t], ctx, run.methods[k], &cells[t][k]);
            }
            rl_save_partial(rep, json);
        }
        if (rc != 0)
            break;
        printf("\ncontext %zu: %d trials per cell; budget = exact tokens per head and layer-step; times in s per "
               "trial\n",
               ctx, trials);
        rl_table_head();
        for (size_t t = 0; t < o->n_tasks; t++)
            for (size_t k = 0; k < run.n_methods; k++)
                rl_row_print(o->tasks[t], ctx, run.methods[k], &cells[t][k]);
        printf("\n");
        fflush(stdout);
    }
    mdl_model_destroy(run.model);
    rl_remote_stop();
    if (bn_report_finish(rep, json) != 0)
        rc = 1;
    return rc;
}

int main(int argc, char **argv)
{
    rl_args_t a;
    int rc = bn_args_load(&rl_table, &a, argc, argv, NULL);
    if (rc >= 0)
        return rc;
    rl_opts_t o;
    rc = rl_opts_from(&a, &o) == 0 ? rl_main(&o, a.json, argv[0]) : 2;
    cm_config_free(&rl_table, &a);
    return rc;
}
