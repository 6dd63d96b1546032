/*
 * ri bench model: end-to-end speed of the model runtime on this machine.
 * For each context (512, 2K, 8K): prefill tokens/s (exact attention, shared
 * by every method), then decode tokens/s with full and retroinfer attention
 * side by side from the same prefilled state, next to the floor set by the
 * bytes one decode step must read (weights + the K/V the method touches)
 * over the memory bandwidth measured in this run, and the wave-index build
 * time as a share of the prefill.  Batch 4 decode at the smallest context.
 *
 *   ri bench model [--json PATH] [--contexts 512,2048,8192] [--steps N]
 *                  [--methods full,retroinfer] [--model PATH]
 */
#define _GNU_SOURCE
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bench/common/bn_report.h"
#include "bench/model/bn_filler.h"
#include "common/cm_log.h"
#include "common/cm_thread.h"
#include "common/cm_time.h"
#include "gpuworker/model/mdl_model.h"
#include "gpuworker/model/mdl_quant.h"
#include "gpuworker/model/mdl_sample.h"

typedef struct bm_result {
    double decode_tok_s;   /* tokens per second over the timed steps (all sequences) */
    double bytes_per_step; /* bytes one step reads per sequence (weights + K/V + index) */
    double build_s;        /* index build at the first step */
    double exact_tokens;   /* tokens attended exactly per layer-step */
} bm_result_t;

/* Decode `steps` tokens on `batch` forks of base with attn; the first step
 * (which builds the index) is timed apart. */
static ri_status_t bm_decode(mdl_model_t *m, const mdl_seq_t *base, const float *logits0, const char *attn,
                             size_t batch, int steps, bm_result_t *r)
{
    const mdl_hparams_t *hp = mdl_model_hparams(m);
    mdl_seq_t *seqs[8] = {0};
    int32_t toks[8];
    float *logits = malloc(batch * hp->n_vocab * sizeof(float));
    ri_status_t st = RI_OK;
    for (size_t b = 0; b < batch && st == RI_OK; b++)
        st = mdl_seq_fork(base, mdl_attn_find(attn), NULL, &seqs[b]);
    for (size_t b = 0; b < batch; b++)
        toks[b] = mdl_argmax(logits0, hp->n_vocab);
    double t0 = cm_time_s();
    if (st == RI_OK)
        st = mdl_decode(m, seqs, toks, batch, logits);
    double t1 = cm_time_s();
    mdl_attn_stats_t s0 = {0}, s1 = {0};
    if (st == RI_OK)
        mdl_seq_attn_stats(seqs[0], &s0);
    r->build_s = s0.build_s;
    (void)t1;
    double ts = cm_time_s();
    for (int i = 0; i < steps && st == RI_OK; i++) {
        for (size_t b = 0; b < batch; b++)
            toks[b] = mdl_argmax(logits + b * hp->n_vocab, hp->n_vocab);
        st = mdl_decode(m, seqs, toks, batch, logits);
    }
    double dt = cm_time_s() - ts;
    (void)t0;
    if (st == RI_OK) {
        mdl_seq_attn_stats(seqs[0], &s1);
        double layer_steps = (double)(s1.decode_steps - s0.decode_steps);
        r->decode_tok_s = (double)steps * (double)batch / dt;
        r->bytes_per_step = (double)mdl_model_weight_bytes(m) / (double)batch +
                            (double)(s1.bytes_read - s0.bytes_read) / (double)steps;
        r->exact_tokens = layer_steps > 0 ? (double)(s1.exact_tokens - s0.exact_tokens) / layer_steps : 0;
    }
    for (size_t b = 0; b < batch; b++)
        mdl_seq_destroy(seqs[b]);
    free(logits);
    return st;
}

static const char *bm_arg(int *i, int argc, char **argv, const char *name)
{
    if (strcmp(argv[*i], name) == 0 && *i + 1 < argc)
        return argv[++*i];
    return NULL;
}

int main(int argc, char **argv)
{
    const char *json = bn_parse_json_arg(&argc, argv);
    double ctxs[8] = {512, 2048, 8192};
    size_t n_ctx = 3;
    int steps = 32;
    char methods_buf[256] = "full,retroinfer";
    char model_path[4096] = "";
    cm_log_init_from_env();
    for (int i = 1; i < argc; i++) {
        const char *v;
        if ((v = bm_arg(&i, argc, argv, "--contexts")) != NULL)
            n_ctx = bn_parse_list(v, ctxs, 8);
        else if ((v = bm_arg(&i, argc, argv, "--steps")) != NULL)
            steps = atoi(v) > 0 ? atoi(v) : 32;
        else if ((v = bm_arg(&i, argc, argv, "--methods")) != NULL)
            snprintf(methods_buf, sizeof(methods_buf), "%s", v);
        else if ((v = bm_arg(&i, argc, argv, "--model")) != NULL)
            snprintf(model_path, sizeof(model_path), "%s", v);
        else {
            fprintf(stderr, "usage: ri bench model [--json PATH] [--contexts L,..] [--steps N] [--methods M,..] "
                            "[--model PATH]\n");
            return 2;
        }
    }
    const char *methods[8];
    size_t n_m = 0;
    for (char *save = NULL, *t = strtok_r(methods_buf, ",", &save); t && n_m < 8; t = strtok_r(NULL, ",", &save)) {
        if (mdl_attn_find(t) == NULL) {
            fprintf(stderr, "ri bench model: unknown method '%s' (have: %s)\n", t, mdl_attn_names());
            return 2;
        }
        methods[n_m++] = t;
    }
    if (model_path[0] == '\0' && mdl_model_default_path(model_path, sizeof(model_path)) != RI_OK) {
        fprintf(stderr, "ri bench model: no model at %s; run ./ri model fetch\n", model_path);
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
    cJSON_AddStringToObject(bn_report_root(rep), "model", mdl_model_name(m));
    cJSON_AddNumberToObject(bn_report_root(rep), "threads", cm_pool_size(cm_pool_default()));
    cJSON_AddNumberToObject(bn_report_root(rep), "weight_bytes", (double)mdl_model_weight_bytes(m));
    const mdl_hparams_t *hp = mdl_model_hparams(m);
    float *logits = malloc(hp->n_vocab * sizeof(float));
    printf("memory read bandwidth %.1f GB/s, weights %.1f MB per step, %u threads\n", bw,
           mdl_model_weight_bytes(m) / 1e6, cm_pool_size(cm_pool_default()));
    printf("%-7s %-11s %-5s %-5s %10s %10s %10s %7s %9s %8s %9s\n", "context", "attn", "act", "batch", "prefill/s",
           "decode/s", "floor/s", "%floor", "MB/step", "exact", "build%");
    for (size_t c = 0; c < n_ctx; c++) {
        size_t ctx = (size_t)ctxs[c];
        int32_t *ids;
        size_t n;
        if (bn_passkey_prompt(mdl_model_tok(m), ctx, 0.5, -1, &ids, &n) != RI_OK)
            return 1;
        mdl_seq_t *base;
        if (mdl_seq_create(m, mdl_attn_find("full"), NULL, n + (size_t)steps + 8, &base) != RI_OK)
            return 1;
        double t0 = cm_time_s();
        if (mdl_prefill(m, base, ids, n, logits, NULL, NULL, NULL) != RI_OK)
            return 1;
        double tp = cm_time_s() - t0;
        size_t batches[2] = {1, 4};
        size_t n_b = c == 0 ? 2 : 1;
        static const mdl_act_mode_t acts[3] = {MDL_ACT_I16, MDL_ACT_I8, MDL_ACT_F32};
        static const char *const act_names[3] = {"i16", "i8", "f32"};
        for (size_t k = 0; k < n_m; k++)
            for (int ai = 0; ai < 3; ai++)
                for (size_t bi = 0; bi < n_b; bi++) {
                    if (ai > 0 && bi > 0)
                        continue;   /* batched products (n > 2) expand weights to fp32 in every mode */
                    bm_result_t r = {0};
                    mdl_quant_set_act(acts[ai]);
                    ri_status_t st = bm_decode(m, base, logits, methods[k], batches[bi], steps, &r);
                    mdl_quant_set_act(MDL_ACT_I16);
                    if (st != RI_OK) {
                        fprintf(stderr, "decode failed: %s\n", ri_status_str(st));
                        return 1;
                    }
                    double floor_tok_s = bw * 1e9 / r.bytes_per_step;
                    printf("%-7zu %-11s %-5s %-5zu %10.1f %10.1f %10.1f %6.0f%% %9.1f %8.0f %8.1f%%\n", n, methods[k],
                           act_names[ai], batches[bi], (double)n / tp, r.decode_tok_s, floor_tok_s,
                           100.0 * r.decode_tok_s / floor_tok_s, r.bytes_per_step / 1e6, r.exact_tokens,
                           100.0 * r.build_s / tp);
                    fflush(stdout);
                    cJSON *row = bn_report_row(rep);
                    cJSON_AddStringToObject(row, "attn", methods[k]);
                    cJSON_AddNumberToObject(row, "context", (double)n);
                    cJSON_AddNumberToObject(row, "batch", (double)batches[bi]);
                    cJSON_AddNumberToObject(row, "prefill_tok_s", (double)n / tp);
                    cJSON_AddNumberToObject(row, "decode_tok_s", r.decode_tok_s);
                    cJSON_AddNumberToObject(row, "floor_tok_s", floor_tok_s);
                    cJSON_AddStringToObject(row, "activations", act_names[ai]);
                    cJSON_AddNumberToObject(row, "bytes_per_step", r.bytes_per_step);
                    cJSON_AddNumberToObject(row, "exact_tokens", r.exact_tokens);
                    cJSON_AddNumberToObject(row, "prefill_s", tp);
                    cJSON_AddNumberToObject(row, "index_build_s", r.build_s);
                    cJSON_AddNumberToObject(row, "index_build_share", r.build_s / tp);
                }
        mdl_seq_destroy(base);
        cm_free(ids);
    }
    free(logits);
    mdl_model_destroy(m);
    return bn_report_finish(rep, json) == 0 ? 0 : 1;
}
