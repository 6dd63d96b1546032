/*
 * ri bench passkey: passkey retrieval with the real model.  For each context
 * length, depth and trial (a random 5-digit key), the prompt (filler text
 * with the key) is prefilled once with exact attention; then each attention
 * method decodes greedily from a copy of that state, and passes when the key
 * appears in the first 12 generated tokens.  retroinfer-remote runs through
 * a real ri-kvstore (started here unless --kvstore names one).
 *
 * --retrieval-min T,.. and --adapt-tau X,.. sweep retroinfer's budget: each
 * value makes a variant of the sparse methods (quest and streaming follow
 * the floor, so budgets stay equal); the rows carry the exact tokens per head
 * and layer-step each variant attended, for accuracy-vs-budget charts.
 *
 *   ri bench passkey [--json PATH] [--contexts 1024,2048,4096,8192]
 *                    [--depths 0.1,0.5,0.9] [--trials N (10)] [--seed S]
 *                    [--methods full,retroinfer,quest,streaming[,retroinfer-remote]]
 *                    [--retrieval-min T,..] [--adapt-tau X,..] [--kvstore ADDR]
 *                    [--model NAME|PATH] [--segment-tokens B]
 */
#define _GNU_SOURCE
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bench/common/bn_args.h"
#include "bench/common/bn_daemon.h"
#include "bench/common/bn_report.h"
#include "bench/model/bn_filler.h"
#include "common/cm_alloc.h"
#include "common/cm_log.h"
#include "common/cm_runtime.h"
#include "common/cm_status.h"
#include "common/cm_time.h"
#include "gpuworker/model/mdl_model.h"
#include "gpuworker/model/mdl_gen.h"
#include "gpuworker/client/gw_attn_remote.h"
#include "gpuworker/client/gw_remote.h" /* GW_UCX_TLS_LOCAL */

#define PK_GEN_TOKENS 12
#define PK_MAX_VARIANTS 32
#define PK_MAX_CTX 8
#define PK_MAX_DEPTH 8

/* One attention method with one budget setting. */
typedef struct pk_variant {
    char label[64];          /* "retroinfer", "retroinfer min=128 tau=0.2" */
    const char *attn;        /* backend name */
    mdl_attn_cfg_t cfg;      /* its settings */
    bool sweep;              /* the budget lists apply */
    int passed[PK_MAX_CTX][PK_MAX_DEPTH];
    uint64_t exact[PK_MAX_CTX], steps[PK_MAX_CTX]; /* exact tokens per head, layer-steps */
    uint32_t tpc[PK_MAX_CTX];  /* cluster size the wave index used (0: no wave index) */
    double decode_s[PK_MAX_CTX];
} pk_variant_t;

/* The text a generation delivered (mdl_gen_token_fn_t), cut to fit. */
typedef struct pk_text {
    const mdl_tok_t *tok; /* borrowed */
    char *out;            /* [outlen], NUL-terminated */
    size_t len, outlen;
} pk_text_t;

static void pk_append(void *arg, int32_t id)
{
    pk_text_t *t = arg;
    int l = mdl_tok_piece(t->tok, id, t->out + t->len, t->outlen - t->len - 1);
    if (l > 0 && t->len + (size_t)l < t->outlen - 1)
        t->len += (size_t)l;
    t->out[t->len] = '\0';
}

/* Greedy decode from a fork of base with variant v; true when key appears. */
static ri_status_t pk_try(mdl_model_t *m, const mdl_seq_t *base, const float *logits0, pk_variant_t *v, size_t c,
                          int key, bool *pass_p, char *out, size_t outlen)
{
    const mdl_hparams_t *hp = mdl_model_hparams(m);
    mdl_seq_t *s;
    double t0 = cm_time_s();
    ri_status_t st = mdl_seq_fork(base, mdl_attn_find(v->attn), &v->cfg, &s);
    if (st != RI_OK)
        return st;
    float *logits = malloc(hp->n_vocab * sizeof(float));
    memcpy(logits, logits0, hp->n_vocab * sizeof(float));
    out[0] = '\0';
    pk_text_t text = {mdl_model_tok(m), out, 0, outlen};
    mdl_gen_cfg_t gcfg = {.max_tokens = PK_GEN_TOKENS, .on_token = pk_append, .token_arg = &text};
    mdl_gen_result_t res;
    st = mdl_generate(m, s, NULL, 0, logits, &gcfg, &res);
    mdl_attn_stats_t as;
    mdl_seq_attn_stats(s, &as);
    v->exact[c] += as.exact_tokens;
    v->steps[c] += as.decode_steps;
    v->tpc[c] = CM_MAX(v->tpc[c], as.tokens_per_cluster);
    v->decode_s[c] += cm_time_s() - t0;
    char keytext[16];
    snprintf(keytext, sizeof(keytext), "%d", key);
    *pass_p = strstr(out, keytext) != NULL;
    for (char *ch = out; *ch; ch++)
        if (*ch == '\n')
            *ch = ' ';
    free(logits);
    mdl_seq_destroy(s);
    return st;
}

static bool pk_sparse(const char *attn)
{
    return strcmp(attn, "full") != 0;
}

static bool pk_retro(const char *attn)
{
    return strncmp(attn, "retroinfer", 10) == 0;
}

/* Methods x budget lists -> variants.  Returns the count, or 0 (message). */
static size_t pk_variants(char *methods, const double *mins, size_t n_min, const double *taus, size_t n_tau,
                          pk_variant_t *v)
{
    size_t n = 0;
    for (char *save = NULL, *t = strtok_r(methods, ",", &save); t; t = strtok_r(NULL, ",", &save)) {
        if (mdl_attn_find(t) == NULL) {
            fprintf(stderr, "ri bench passkey: unknown method '%s' (have: %s)\n", t, mdl_attn_names());
            return 0;
        }
        size_t nm = pk_sparse(t) && n_min ? n_min : 1, nt = pk_retro(t) && n_tau ? n_tau : 1;
        for (size_t a = 0; a < nm; a++)
            for (size_t b = 0; b < nt; b++) {
                if (n == PK_MAX_VARIANTS) {
                    fprintf(stderr, "ri bench passkey: at most %d method variants\n", PK_MAX_VARIANTS);
                    return 0;
                }
                pk_variant_t *x = &v[n++];
                memset(x, 0, sizeof(*x));
                x->attn = t;
                mdl_attn_cfg_default(&x->cfg);
                int l = snprintf(x->label, sizeof(x->label), "%s", t);
                if (pk_sparse(t) && n_min) {
                    x->cfg.wave.retrieval_min_tokens = (uint32_t)mins[a];
                    l += snprintf(x->label + l, sizeof(x->label) - (size_t)l, " min=%u", (unsigned)mins[a]);
                }
                if (pk_retro(t) && n_tau) {
                    x->cfg.wave.adapt_tau = (float)taus[b];
                    snprintf(x->label + l, sizeof(x->label) - (size_t)l, " tau=%g", taus[b]);
                }
                x->sweep = n_min || n_tau;
            }
    }
    return n;
}

static void pk_rows(bn_report_t *rep, const pk_variant_t *v, size_t n_v, const double *ctxs, size_t n_ctx,
                    const double *depths, size_t n_depth, int trials, const bool *ran)
{
    for (size_t k = 0; k < n_v; k++)
        for (size_t c = 0; c < n_ctx; c++) {
            if (!ran[c])
                continue;
            double per_head = v[k].steps[c] ? (double)v[k].exact[c] / (double)v[k].steps[c] : 0;
            for (size_t d = 0; d < n_depth; d++) {
                cJSON *row = bn_report_row(rep);
                cJSON_AddStringToObject(row, "attn", v[k].attn);
                cJSON_AddStringToObject(row, "variant", v[k].label);
                cJSON_AddNumberToObject(row, "context", ctxs[c]);
                cJSON_AddNumberToObject(row, "depth", depths[d]);
                cJSON_AddNumberToObject(row, "trials", trials);
                cJSON_AddNumberToObject(row, "passed", v[k].passed[c][d]);
                cJSON_AddNumberToObject(row, "retrieval_min_tokens", v[k].cfg.wave.retrieval_min_tokens);
                cJSON_AddNumberToObject(row, "adapt_tau", v[k].cfg.wave.adapt_tau);
                if (v[k].tpc[c] > 0)
                    cJSON_AddNumberToObject(row, "tokens_per_cluster", v[k].tpc[c]);
                cJSON_AddNumberToObject(row, "exact_tokens_per_head", per_head);
                cJSON_AddNumberToObject(row, "decode_s", v[k].decode_s[c]);
            }
        }
}

static void pk_summary(const pk_variant_t *v, size_t n_v, const double *ctxs, size_t n_ctx, size_t n_depth,
                       int trials, const bool *ran)
{
    printf("\nsummary (passed / trials over depths; exact tokens per head and layer-step):\n%-32s", "method");
    for (size_t c = 0; c < n_ctx; c++)
        printf(" %16zu", (size_t)ctxs[c]);
    printf("\n");
    for (size_t k = 0; k < n_v; k++) {
        printf("%-32s", v[k].label);
        for (size_t c = 0; c < n_ctx; c++) {
            int p = 0;
            for (size_t d = 0; d < n_depth; d++)
                p += v[k].passed[c][d];
            if (!ran[c]) {
                printf(" %16s", "-");
                continue;
            }
            printf("   %3d/%-3d %6.0f", p, (int)(n_depth * (size_t)trials),
                   v[k].steps[c] ? (double)v[k].exact[c] / (double)v[k].steps[c] : 0.0);
        }
        printf("\n");
    }
}

/* Run every (context, depth, trial) for every variant. */
static int pk_run(mdl_model_t *m, bn_report_t *rep, pk_variant_t *v, size_t n_v, const double *ctxs, size_t n_ctx,
                  const double *depths, size_t n_depth, int trials, uint64_t rng, bool *ran)
{
    const mdl_hparams_t *hp = mdl_model_hparams(m);
    float *logits = malloc(hp->n_vocab * sizeof(float));
    int rc = 1;
    if (logits == NULL)
        return 1;
    printf("%-8s %-6s %-32s %-6s %s\n", "context", "depth", "method", "pass", "output");
    for (size_t c = 0; c < n_ctx; c++) {
        size_t ctx = (size_t)ctxs[c];
        if (ctx + PK_GEN_TOKENS > hp->n_ctx + 64) {
            char why[128], name[64];
            snprintf(why, sizeof(why), "beyond the model's trained context of %u", hp->n_ctx);
            snprintf(name, sizeof(name), "context=%zu", ctx);
            bn_report_skip(rep, name, why);
            continue;
        }
        ran[c] = true;
        for (size_t d = 0; d < n_depth; d++)
            for (int t = 0; t < trials; t++) {
                rng = rng * 6364136223846793005ull + 1442695040888963407ull;
                int key = 10000 + (int)((rng >> 33) % 90000);
                int32_t *ids;
                size_t n;
                mdl_seq_t *base;
                if (bn_passkey_prompt(mdl_model_tok(m), ctx, depths[d], key, &ids, &n) != RI_OK)
                    goto out;
                if (mdl_seq_create(m, mdl_attn_find("full"), NULL, n + PK_GEN_TOKENS, &base) != RI_OK) {
                    cm_free(ids);
                    goto out;
                }
                double t0 = cm_time_s();
                ri_status_t st = mdl_prefill(m, base, ids, n, logits, NULL, NULL, NULL);
                double tp = cm_time_s() - t0;
                for (size_t k = 0; k < n_v && st == RI_OK; k++) {
                    bool ok = false;
                    char out[512];
                    st = pk_try(m, base, logits, &v[k], c, key, &ok, out, sizeof(out));
                    v[k].passed[c][d] += ok;
                    printf("%-8zu %-6.2f %-32s %-6s key %d:%s  (prompt %zu tok, prefill %.1fs)\n", ctx, depths[d],
                           v[k].label, ok ? "PASS" : "fail", key, out, n, tp);
                    fflush(stdout);
                }
                mdl_seq_destroy(base);
                cm_free(ids);
                if (st != RI_OK) {
                    fprintf(stderr, "ri bench passkey: %s\n", ri_status_str(st));
                    goto out;
                }
            }
    }
    rc = 0;
out:
    free(logits);
    return rc;
}

/* The command line (bn_args). */
typedef struct pk_args {
    char *json, *contexts, *depths, *methods, *retrieval_min, *adapt_tau, *kvstore, *model;
    int64_t trials, seed, segment_tokens;
} pk_args_t;

static const cm_config_item_t pk_items[] = {
    BN_ARG_JSON(pk_args_t, json),
    BN_ARG(pk_args_t, "contexts", CM_CFG_STRING, "1024,2048,4096,8192", "context lengths in tokens", contexts, 0, 0),
    BN_ARG(pk_args_t, "depths", CM_CFG_STRING, "0.1,0.5,0.9", "depths of the key in the filler, 0..1", depths, 0, 0),
    BN_ARG(pk_args_t, "trials", CM_CFG_INT, "10", "trials (keys) per context and depth", trials, 1, 1 << 20),
    BN_ARG(pk_args_t, "seed", CM_CFG_INT, "0xC0FFEE", "seed of the keys", seed, 0, INT64_MAX),
    BN_ARG(pk_args_t, "methods", CM_CFG_STRING, "full,retroinfer,quest,streaming", "attention backends", methods, 0,
           0),
    BN_ARG(pk_args_t, "retrieval-min", CM_CFG_STRING, NULL, "retroinfer variants: retrieval floors in tokens",
           retrieval_min, 0, 0),
    BN_ARG(pk_args_t, "adapt-tau", CM_CFG_STRING, NULL, "retroinfer variants: per-head cuts, each in [0, 1)",
           adapt_tau, 0, 0),
    BN_ARG(pk_args_t, "kvstore", CM_CFG_STRING, NULL,
           "retroinfer-remote: this ri-kvstore (gRPC ADDR), else one started", kvstore, 0, 0),
    BN_ARG(pk_args_t, "model", CM_CFG_STRING, NULL, "model NAME or PATH (empty: the default)", model, 0, 0),
    BN_ARG(pk_args_t, "segment-tokens", CM_CFG_INT, "0", "retroinfer: the index build's block in tokens (0: kn_wave's)",
           segment_tokens, 0, 1 << 30),
};
static const cm_config_table_t pk_table = {"ri bench passkey", "RI_BENCH_PASSKEY_", pk_items, CM_ARRAY_LEN(pk_items),
                                           0, NULL};

/* A list option: its values into out [max]; false (with a message) when
 * it is set and not a comma list of up to max numbers. */
static bool pk_list(const char *name, const char *text, double *out, size_t max, size_t *n_p)
{
    *n_p = 0;
    if (text == NULL || text[0] == '\0')
        return true;
    *n_p = bn_args_list(text, out, max);
    if (*n_p == 0)
        fprintf(stderr, "ri bench passkey: --%s is a comma list of up to %zu numbers\n", name, max);
    return *n_p > 0;
}

static int pk_main(const void *opts, const char *argv0)
{
    const pk_args_t *a = opts;
    const char *json = a->json, *kvs = a->kvstore;
    double ctxs[PK_MAX_CTX], depths[PK_MAX_DEPTH];
    double mins[PK_MAX_VARIANTS], taus[PK_MAX_VARIANTS];
    size_t n_ctx = 0, n_depth = 0, n_min = 0, n_tau = 0;
    int trials = (int)a->trials, rc = 1;
    uint64_t seed = (uint64_t)a->seed;
    char methods_buf[256];
    char model_path[4096], err[512];
    static pk_variant_t v[PK_MAX_VARIANTS];
    bool ran[PK_MAX_CTX] = {false}, remote = false;
    bn_daemon_t dmn = {0};
    mdl_model_t *m = NULL;
    bn_report_t *rep = NULL;

    char rt_err[256];
    if (cm_runtime_setup_from_env(mdl_runtime_apply, rt_err, sizeof(rt_err)) != RI_OK) {
        fprintf(stderr, "ri bench passkey: %s\n", rt_err);
        return 2;
    }
    if (!pk_list("contexts", a->contexts, ctxs, PK_MAX_CTX, &n_ctx) ||
        !pk_list("depths", a->depths, depths, PK_MAX_DEPTH, &n_depth) ||
        !pk_list("retrieval-min", a->retrieval_min, mins, PK_MAX_VARIANTS, &n_min) ||
        !pk_list("adapt-tau", a->adapt_tau, taus, PK_MAX_VARIANTS, &n_tau))
        return 2;
    if (n_ctx == 0 || n_depth == 0) {
        fprintf(stderr, "ri bench passkey: --contexts and --depths need at least one value\n");
        return 2;
    }
    snprintf(methods_buf, sizeof(methods_buf), "%s", a->methods != NULL ? a->methods : "");
    snprintf(model_path, sizeof(model_path), "%s", a->model != NULL ? a->model : "");
    for (size_t t = 0; t < n_tau; t++)
        if (!(taus[t] >= 0 && taus[t] < 1)) {
            fprintf(stderr, "ri bench passkey: --adapt-tau values lie in [0, 1)\n");
            return 2;
        }
    remote = strstr(methods_buf, "retroinfer-remote") != NULL;
    if (remote) {
        if (kvs == NULL) {
            if (bn_daemon_start(&dmn, argv0, "3GiB") != 0)
                return 1;
            kvs = dmn.grpc;
        }
        gw_attn_remote_cfg_t rcfg = {.address = kvs, .timeout_ms = 10000};
        if (gw_attn_remote_configure(&rcfg, err, sizeof(err)) != RI_OK) {
            fprintf(stderr, "ri bench passkey: kvstore %s: %s\n", kvs, err);
            goto out;
        }
    }
    size_t n_v = pk_variants(methods_buf, mins, n_min, taus, n_tau, v);
    if (n_v == 0)
        goto out;
    for (size_t i = 0; i < n_v && a->segment_tokens > 0; i++)
        v[i].cfg.wave.segment_tokens = (uint32_t)a->segment_tokens;
    char model_arg[4096]; /* a name (gemma3-270m) or a path */
    snprintf(model_arg, sizeof(model_arg), "%s", model_path);
    if (mdl_model_resolve(model_arg, model_path, sizeof(model_path)) != RI_OK) {
        fprintf(stderr, "ri bench passkey: no model at %s; run ./ri setup (names: %s)\n", model_path,
                mdl_model_names());
        goto out;
    }
    if (mdl_model_load(model_path, &m, err, sizeof(err)) != RI_OK) {
        fprintf(stderr, "ri bench passkey: %s\n", err);
        goto out;
    }
    if ((rep = bn_report_create("passkey")) == NULL)
        goto out;
    cJSON_AddStringToObject(bn_report_root(rep), "model", mdl_model_name(m));
    cJSON_AddNumberToObject(bn_report_root(rep), "seed", (double)seed);
    cJSON_AddNumberToObject(bn_report_root(rep), "segment_tokens", v[0].cfg.wave.segment_tokens);
    if (remote)
        cJSON_AddStringToObject(bn_report_root(rep), "kvstore", kvs);
    if (pk_run(m, rep, v, n_v, ctxs, n_ctx, depths, n_depth, trials, seed, ran) != 0)
        goto out;
    pk_rows(rep, v, n_v, ctxs, n_ctx, depths, n_depth, trials, ran);
    pk_summary(v, n_v, ctxs, n_ctx, n_depth, trials, ran);
    rc = bn_report_finish(rep, json) == 0 ? 0 : 1;
    rep = NULL;
out:
    if (rep != NULL)
        (void)bn_report_finish(rep, NULL);
    mdl_model_destroy(m);
    if (remote)
        gw_attn_remote_shutdown();
    bn_daemon_stop(&dmn);
    return rc;
}

int main(int argc, char **argv)
{
    pk_args_t a;
    setenv("UCX_TLS", GW_UCX_TLS_LOCAL, 0); /* shared memory, also for the daemon we start */
    return bn_args_main(&pk_table, &a, argc, argv, pk_main);
}
