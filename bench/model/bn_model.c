/*
 * ri bench model: end-to-end speed of the model runtime on this machine.
 * For each context (512, 2K, 8K): prefill tokens/s (exact attention, shared
 * by every method), then decode tokens/s with full and retroinfer attention
 * side by side from the same prefilled state, next to the floor set by the
 * bytes one decode step must read (weights + the K/V the method touches)
 * over the memory bandwidth measured in the same rounds, and the wave-index
 * build time as a share of the prefill.  Batch 4 decode at the smallest
 * context.  Every configuration of a context and a bandwidth sample take one
 * step each per round, round robin in a rotating order; the first step (index
 * build) is timed apart and counted in an end-to-end tok/s.  A figure above
 * the measured bandwidth by more than its noise fails the bench (exit 1).
 *
 *   ri bench model [--json PATH] [--contexts 512,2048,8192] [--steps N]
 *                  [--methods full,retroinfer] [--model NAME|PATH] [--cluster-tokens N]
 *                  [--segment-tokens B]
 */
#define _GNU_SOURCE
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bench/common/bn_args.h"
#include "bench/common/bn_bw.h"
#include "bench/common/bn_report.h"
#include "bench/model/bn_filler.h"
#include "common/cm_log.h"
#include "common/cm_runtime.h"
#include "common/cm_thread.h"
#include "common/cm_time.h"
#include "gpuworker/model/mdl_gen.h"
#include "gpuworker/model/mdl_model.h"
#include "gpuworker/model/mdl_quant.h"
#include "gpuworker/model/mdl_sample.h"

#define BM_MAX_CASES 32
#define BM_MAX_STEPS 256

/* One decode configuration on one prefilled context: batch forks of the base
 * sequence under one backend and activation mode, and its timed steps. */
typedef struct bm_case {
    const char *attn;
    int act;                 /* index into bm_acts */
    size_t batch;
    mdl_seq_t *seqs[8];      /* owned */
    int32_t toks[8];
    mdl_gen_t gen[8];        /* each sequence's picks (its end is not acted on: a fixed step count) */
    float *logits;           /* [batch][n_vocab], owned */
    mdl_attn_stats_t s0;     /* sequence 0's counters after the first step */
    double first_s;          /* the first step (builds the index) */
    double t[BM_MAX_STEPS];  /* the timed steps after it */
    int n;
    bool failed;
} bm_case_t;

/* "i16-avx2": int16 activations with the AVX-512 decode products turned off
 * (only on CPUs that have them): the old kernels timed in the same rounds. */
#define BM_N_ACTS 4
static const mdl_act_mode_t bm_acts[BM_N_ACTS] = {MDL_ACT_I16, MDL_ACT_I8, MDL_ACT_F32, MDL_ACT_I16};
static const char *const bm_act_names[BM_N_ACTS] = {"i16", "i8", "f32", "i16-avx2"};

/* --cluster-tokens: the wave index's cluster size (0 = the auto size); set
 * once by main before any case. */
static uint32_t bm_cluster_tokens;
/* --segment-tokens: the index build's block (0 = kn_wave's); set once by main. */
static uint32_t bm_segment_tokens;

static ri_status_t bm_case_init(bm_case_t *c, mdl_model_t *m, const mdl_seq_t *base, const float *logits0)
{
    const mdl_hparams_t *hp = mdl_model_hparams(m);
    mdl_attn_cfg_t acfg;
    mdl_attn_cfg_default(&acfg);
    acfg.wave.tokens_per_cluster = bm_cluster_tokens;
    if (bm_segment_tokens > 0)
        acfg.wave.segment_tokens = bm_segment_tokens;
    c->logits = malloc(c->batch * hp->n_vocab * sizeof(float));
    if (c->logits == NULL)
        return RI_ERR_NOMEM;
    for (size_t b = 0; b < c->batch; b++) {
        ri_status_t st = mdl_seq_fork(base, mdl_attn_find(c->attn), &acfg, &c->seqs[b]);
        if (st != RI_OK)
            return st;
        mdl_gen_init(&c->gen[b], mdl_model_tok(m), NULL, hp->n_vocab, SIZE_MAX, mdl_seq_len(c->seqs[b]),
                     mdl_seq_cap(c->seqs[b]));
        (void)mdl_gen_pick(&c->gen[b], logits0, &c->toks[b]);
    }
    return RI_OK;
}

static void bm_case_free(bm_case_t *c)
{
    for (size_t b = 0; b < c->batch; b++)
        mdl_seq_destroy(c->seqs[b]);
    free(c->logits);
}

/* One decode step of the case under its activation mode; its seconds. */
static double bm_case_step(bm_case_t *c, mdl_model_t *m)
{
    const mdl_hparams_t *hp = mdl_model_hparams(m);
    mdl_quant_set_act(bm_acts[c->act]);
    mdl_quant_set_avx512(c->act != 3);
    double t0 = cm_time_s();
    ri_status_t st = mdl_decode(m, c->seqs, c->toks, c->batch, c->logits);
    double dt = cm_time_s() - t0;
    mdl_quant_set_act(MDL_ACT_I16);
    mdl_quant_set_avx512(true);
    if (st != RI_OK) {
        fprintf(stderr, "ri bench model: %s decode failed: %s\n", c->attn, ri_status_str(st));
        c->failed = true;
        return 0;
    }
    for (size_t b = 0; b < c->batch; b++)
        (void)mdl_gen_pick(&c->gen[b], c->logits + b * hp->n_vocab, &c->toks[b]);
    return dt;
}

/* Time every case and the bandwidth reference in the same rounds: each round
 * runs each once, the order rotated by one per round, so that a swing in the
 * machine's speed hits all alike and each gets the same number of samples. */
static void bm_rounds(bm_case_t *cs, size_t n_cs, mdl_model_t *m, int steps, double *bw)
{
    for (int r = 0; r < steps; r++)
        for (size_t slot = 0; slot <= n_cs; slot++) {
            size_t k = (slot + (size_t)r) % (n_cs + 1);
            if (k == n_cs) {
                bw[r] = bn_bw_sample(cm_pool_default());
                continue;
            }
            if (!cs[k].failed)
                cs[k].t[cs[k].n++] = bm_case_step(&cs[k], m);
        }
}

/* Where the first case's decode step goes, op by op (mdl_model_profile),
 * over `steps` more steps after the timed rounds: printed and kept in the
 * JSON as "profile" rows (ms per step). */
static void bm_profile(bm_case_t *c, mdl_model_t *m, int steps, bn_report_t *rep, size_t ctx)
{
    mdl_profile_t p;
    double total = 0;
    mdl_model_profile(m, true);
    for (int i = 0; i < steps && !c->failed; i++)
        total += bm_case_step(c, m);
    mdl_model_profile_get(m, &p);
    mdl_model_profile(m, false);
    if (c->failed || p.steps == 0)
        return;
    cJSON *row = bn_report_row(rep);
    cJSON_AddStringToObject(row, "profile", c->attn);
    cJSON_AddNumberToObject(row, "context", (double)ctx);
    cJSON_AddStringToObject(row, "activations", bm_act_names[c->act]);
    cJSON_AddNumberToObject(row, "step_ms", 1e3 * total / (double)p.steps);
    printf("   profile (%s %s, ms per step of %.2f):", c->attn, bm_act_names[c->act], 1e3 * total / (double)p.steps);
    for (int op = 0; op < MDL_OP_N; op++) {
        double ms = 1e3 * p.s[op] / (double)p.steps;
        printf(" %s %.2f", mdl_op_name((mdl_op_t)op), ms);
        char key[32];
        snprintf(key, sizeof(key), "%s_ms", mdl_op_name((mdl_op_t)op));
        cJSON_AddNumberToObject(row, key, ms);
    }
    printf("\n");
}

/* The command line (bn_args). */
typedef struct bm_args {
    char *json, *contexts, *methods, *model;
    int64_t steps, cluster_tokens, segment_tokens;
} bm_args_t;

static const cm_config_item_t bm_items[] = {
    BN_ARG_JSON(bm_args_t, json),
    BN_ARG(bm_args_t, "contexts", CM_CFG_STRING, "512,2048,8192", "context lengths in tokens (up to 8)", contexts, 0,
           0),
    BN_ARG(bm_args_t, "steps", CM_CFG_INT, "32", "timed decode steps per case", steps, 1, BM_MAX_STEPS),
    BN_ARG(bm_args_t, "methods", CM_CFG_STRING, "full,retroinfer", "attention backends (up to 8)", methods, 0, 0),
    BN_ARG(bm_args_t, "model", CM_CFG_STRING, NULL, "model NAME or PATH (empty: the default)", model, 0, 0),
    BN_ARG(bm_args_t, "cluster-tokens", CM_CFG_INT, "0", "tokens per cluster, 1..1024 (0 = the auto size)",
           cluster_tokens, 0, 1024),
    BN_ARG(bm_args_t, "segment-tokens", CM_CFG_INT, "0", "the index build's block in tokens (0 = kn_wave's)",
           segment_tokens, 0, 1 << 30),
};
static const cm_config_table_t bm_table = {"ri bench model", "RI_BENCH_MODEL_", bm_items, CM_ARRAY_LEN(bm_items), 0,
                                           NULL};

static int bm_main(const void *opts, const char *argv0)
{
    char rt_err[256];
    if (cm_runtime_setup_from_env(mdl_runtime_apply, rt_err, sizeof(rt_err)) != RI_OK) {
        fprintf(stderr, "ri bench model: %s\n", rt_err);
        return 2;
    }
    const bm_args_t *a = opts;
    const char *json = a->json;
    double ctxs[8];
    size_t n_ctx = bn_args_list(a->contexts, ctxs, 8);
    int steps = (int)a->steps;
    char methods_buf[256], model_path[4096];
    (void)argv0;
    if (n_ctx == 0) {
        fprintf(stderr, "ri bench model: --contexts is a comma list of up to 8 numbers\n");
        return 2;
    }
    snprintf(methods_buf, sizeof(methods_buf), "%s", a->methods != NULL ? a->methods : "");
    snprintf(model_path, sizeof(model_path), "%s", a->model != NULL ? a->model : "");
    bm_cluster_tokens = (uint32_t)a->cluster_tokens;
    bm_segment_tokens = (uint32_t)a->segment_tokens;
    const char *methods[8];
    size_t n_m = 0;
    for (char *save = NULL, *t = strtok_r(methods_buf, ",", &save); t && n_m < 8; t = strtok_r(NULL, ",", &save)) {
        if (mdl_attn_find(t) == NULL) {
            fprintf(stderr, "ri bench model: unknown method '%s' (have: %s)\n", t, mdl_attn_names());
            return 2;
        }
        methods[n_m++] = t;
    }
    char model_arg[4096];   /* a name (gemma3-270m) or a path */
    snprintf(model_arg, sizeof(model_arg), "%s", model_path);
    if (mdl_model_resolve(model_arg, model_path, sizeof(model_path)) != RI_OK) {
        fprintf(stderr, "ri bench model: no model at %s; run ./ri setup (names: %s)\n", model_path, mdl_model_names());
        return 1;
    }
    char err[512];
    mdl_model_t *m;
    if (mdl_model_load(model_path, &m, err, sizeof(err)) != RI_OK) {
        fprintf(stderr, "ri bench model: %s\n", err);
        return 1;
    }
    bn_report_t *rep = bn_report_create("model");
    if (rep == NULL)
        return 1;
    double bw = bn_report_mem_bw_gbs(rep);
    int over = 0;
    cJSON_AddStringToObject(bn_report_root(rep), "model", mdl_model_name(m));
    cJSON_AddNumberToObject(bn_report_root(rep), "threads", cm_pool_size(cm_pool_default()));
    cJSON_AddNumberToObject(bn_report_root(rep), "weight_bytes", (double)mdl_model_weight_bytes(m));
    const mdl_hparams_t *hp = mdl_model_hparams(m);
    float *logits = malloc(hp->n_vocab * sizeof(float));
    printf("memory read bandwidth %.1f GB/s, weights %.1f MB per step, %u threads\n", bw,
           mdl_model_weight_bytes(m) / 1e6, cm_pool_size(cm_pool_default()));
    printf("decode/s: median of %d steps, all cases and a bandwidth sample interleaved round robin; e2e/s counts\n"
           "the first step (index build) too; floor/s: the bandwidth measured in the same rounds / bytes per token\n",
           steps);
    printf("%-7s %-11s %-8s %-5s %10s %10s %10s %10s %7s %9s %8s %9s\n", "context", "attn", "act", "batch",
           "prefill/s", "decode/s", "e2e/s", "floor/s", "%floor", "MB/step", "exact", "build%");
    for (size_t c = 0; c < n_ctx; c++) {
        size_t ctx = (size_t)ctxs[c];
        int32_t *ids;
        size_t n;
        if (bn_passkey_prompt(mdl_model_tok(m), ctx, 0.5, -1, &ids, &n) != RI_OK)
            return 1;
        mdl_seq_t *base;
        if (mdl_seq_create(m, mdl_attn_find("full"), NULL, n + 2 * (size_t)steps + 8, &base) != RI_OK)
            return 1;
        double t0 = cm_time_s();
        if (mdl_prefill(m, base, ids, n, logits, NULL, NULL, NULL) != RI_OK)
            return 1;
        double tp = cm_time_s() - t0;
        static const size_t batches[2] = {1, 4};
        size_t n_b = c == 0 ? 2 : 1, n_cs = 0;
        bm_case_t *cs = calloc(BM_MAX_CASES, sizeof(*cs));
        double bw_s[BM_MAX_STEPS];
        if (cs == NULL)
            return 1;
        for (size_t k = 0; k < n_m; k++)
            for (int ai = 0; ai < BM_N_ACTS; ai++)
                for (size_t bi = 0; bi < n_b && n_cs < BM_MAX_CASES; bi++) {
                    if (ai > 0 && bi > 0)
                        continue;   /* batched products (n > 2) expand weights to fp32 in every mode */
                    if (ai == 3 && !mdl_quant_avx512_active())
                        continue;   /* no AVX-512 products to compare with */
                    bm_case_t *x = &cs[n_cs++];
                    x->attn = methods[k];
                    x->act = ai;
                    x->batch = batches[bi];
                    if (bm_case_init(x, m, base, logits) != RI_OK) {
                        fprintf(stderr, "ri bench model: cannot set up %s at %zu tokens\n", x->attn, n);
                        return 1;
                    }
                }
        /* The first step of each case builds its index: timed apart. */
        for (size_t k = 0; k < n_cs; k++) {
            cs[k].first_s = bm_case_step(&cs[k], m);
            mdl_seq_attn_stats(cs[k].seqs[0], &cs[k].s0);
        }
        bm_rounds(cs, n_cs, m, steps, bw_s);
        bn_bw_ref_t bref;
        bn_bw_summarise(bw_s, (size_t)steps, &bref);
        printf("-- context %zu: bandwidth reference median %.2f GB/s (min %.2f, max %.2f) over %d samples "
               "interleaved with the decodes\n", n, bref.median, bref.min, bref.max, steps);
        for (size_t k = 0; k < n_cs; k++) {
            bm_case_t *x = &cs[k];
            if (x->failed)
                return 1;
            mdl_attn_stats_t s1;
            mdl_seq_attn_stats(x->seqs[0], &s1);
            double layer_steps = (double)(s1.decode_steps - x->s0.decode_steps);
            double med = bn_median(x->t, (size_t)x->n), sum = 0;
            for (int i = 0; i < x->n; i++)
                sum += x->t[i];
            double tok_s = (double)x->batch / med;
            double bytes_per_step = (double)mdl_model_weight_bytes(m) / (double)x->batch +
                                    (double)(s1.bytes_read - x->s0.bytes_read) / (double)x->n;
            double exact = layer_steps > 0 ? (double)(s1.exact_tokens - x->s0.exact_tokens) / layer_steps : 0;
            double floor_tok_s = bref.median * 1e9 / bytes_per_step;
            double e2e_tok_s = (double)x->batch * (x->n + 1) / (x->first_s + sum);
            printf("%-7zu %-11s %-8s %-5zu %10.1f %10.1f %10.1f %10.1f %6.0f%% %9.1f %8.0f %8.1f%%\n", n, x->attn,
                   bm_act_names[x->act], x->batch, (double)n / tp, tok_s, e2e_tok_s, floor_tok_s,
                   100.0 * tok_s / floor_tok_s, bytes_per_step / 1e6, exact, 100.0 * x->s0.build_s / tp);
            fflush(stdout);
            cJSON *row = bn_report_row(rep);
            cJSON_AddStringToObject(row, "attn", x->attn);
            cJSON_AddNumberToObject(row, "context", (double)n);
            cJSON_AddNumberToObject(row, "batch", (double)x->batch);
            cJSON_AddNumberToObject(row, "prefill_tok_s", (double)n / tp);
            cJSON_AddNumberToObject(row, "decode_tok_s", tok_s);
            cJSON_AddNumberToObject(row, "decode_tok_s_p10", (double)x->batch / bn_percentile(x->t, (size_t)x->n, 90));
            cJSON_AddNumberToObject(row, "decode_tok_s_p90", (double)x->batch / bn_percentile(x->t, (size_t)x->n, 10));
            cJSON_AddNumberToObject(row, "samples", x->n);
            cJSON_AddNumberToObject(row, "first_step_ms", x->first_s * 1e3);
            cJSON_AddNumberToObject(row, "e2e_tok_s", e2e_tok_s);
            cJSON_AddNumberToObject(row, "floor_tok_s", floor_tok_s);
            cJSON_AddNumberToObject(row, "mem_bw_gbs_here", bref.median);
            cJSON_AddNumberToObject(row, "mem_bw_gbs_here_min", bref.min);
            cJSON_AddNumberToObject(row, "mem_bw_gbs_here_max", bref.max);
            cJSON_AddNumberToObject(row, "mem_bw_noise", bref.noise);
            cJSON_AddStringToObject(row, "activations", bm_act_names[x->act]);
            cJSON_AddNumberToObject(row, "bytes_per_step", bytes_per_step);
            cJSON_AddNumberToObject(row, "exact_tokens", exact);
            cJSON_AddNumberToObject(row, "prefill_s", tp);
            cJSON_AddNumberToObject(row, "index_build_s", x->s0.build_s);
            cJSON_AddNumberToObject(row, "index_build_share", x->s0.build_s / tp);
            if (s1.tokens_per_cluster > 0) /* the size the wave index used (the auto one resolved) */
                cJSON_AddNumberToObject(row, "tokens_per_cluster", s1.tokens_per_cluster);
            /* The floor is a ceiling on tok/s: above it by more than the
             * reference's own noise, the bytes are miscounted or cached. */
            if (tok_s * bytes_per_step / 1e9 > bn_bw_ceiling(&bref)) {
                cJSON_AddBoolToObject(row, "exceeds_bandwidth", 1);
                fprintf(stderr, "BENCH FAILED: %s %s batch %zu at %zu tokens reads %.2f GB/s, above the bandwidth "
                        "reference %.2f GB/s + %.0f%% noise measured in the same rounds\n", x->attn,
                        bm_act_names[x->act], x->batch, n, tok_s * bytes_per_step / 1e9, bref.median,
                        100 * bref.noise);
                over++;
            }
        }
        bm_profile(&cs[0], m, steps, rep, n);
        for (size_t k = 0; k < n_cs; k++)
            bm_case_free(&cs[k]);
        free(cs);
        mdl_seq_destroy(base);
        cm_free(ids);
    }
    free(logits);
    mdl_model_destroy(m);
    cJSON_AddNumberToObject(bn_report_root(rep), "over_bandwidth", over);
    if (bn_report_finish(rep, json) != 0)
        return 1;
    if (over > 0) {
        fprintf(stderr, "BENCH FAILED: %d figure(s) above the bandwidth measured beside them\n", over);
        return 1;
    }
    return 0;
}

int main(int argc, char **argv)
{
    bm_args_t a;
    return bn_args_main(&bm_table, &a, argc, argv, bm_main);
}
