/*
 * ri bench passkey: passkey retrieval with the real model.  For each context
 * length and depth, the prompt (filler text with a 5-digit key) is prefilled
 * once with exact attention; then each attention method decodes greedily
 * from a copy of that state, and passes when the key appears in the first
 * 12 generated tokens.
 *
 *   ri bench passkey [--json PATH] [--contexts 1024,2048,4096,8192]
 *                    [--depths 0.1,0.5,0.9] [--trials N] [--methods full,retroinfer,quest,streaming]
 *                    [--model NAME|PATH]
 */
#define _GNU_SOURCE
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bench/common/bn_report.h"
#include "bench/model/bn_filler.h"
#include "common/cm_alloc.h"
#include "common/cm_log.h"
#include "common/cm_time.h"
#include "gpuworker/model/mdl_model.h"
#include "gpuworker/model/mdl_sample.h"

#define PK_GEN_TOKENS 12

static const char *pk_arg(int *i, int argc, char **argv, const char *name)
{
    if (strcmp(argv[*i], name) == 0 && *i + 1 < argc)
        return argv[++*i];
    return NULL;
}

/* Greedy decode from a fork of base with method attn; true when key appears. */
static ri_status_t pk_try(mdl_model_t *m, const mdl_seq_t *base, const float *logits0, const char *attn, int key,
                          bool *pass_p, char *out, size_t outlen)
{
    const mdl_hparams_t *hp = mdl_model_hparams(m);
    const mdl_tok_t *tok = mdl_model_tok(m);
    mdl_seq_t *s;
    ri_status_t st = mdl_seq_fork(base, mdl_attn_find(attn), NULL, &s);
    if (st != RI_OK)
        return st;
    float *logits = malloc(hp->n_vocab * sizeof(float));
    memcpy(logits, logits0, hp->n_vocab * sizeof(float));
    size_t ol = 0;
    out[0] = '\0';
    for (int t = 0; t < PK_GEN_TOKENS && st == RI_OK; t++) {
        int32_t next = mdl_argmax(logits, hp->n_vocab);
        if (mdl_tok_is_stop(tok, next))
            break;
        int l = mdl_tok_piece(tok, next, out + ol, outlen - ol - 1);
        if (l > 0 && ol + (size_t)l < outlen - 1)
            ol += (size_t)l;
        out[ol] = '\0';
        if (t + 1 < PK_GEN_TOKENS && mdl_seq_len(s) < mdl_seq_cap(s)) {
            mdl_seq_t *one[1] = {s};
            st = mdl_decode(m, one, &next, 1, logits);
        }
    }
    char keytext[16];
    snprintf(keytext, sizeof(keytext), "%d", key);
    *pass_p = strstr(out, keytext) != NULL;
    for (char *c = out; *c; c++)
        if (*c == '\n')
            *c = ' ';
    free(logits);
    mdl_seq_destroy(s);
    return st;
}

int main(int argc, char **argv)
{
    const char *json = bn_parse_json_arg(&argc, argv);
    double ctxs[8] = {1024, 2048, 4096, 8192}, depths[8] = {0.1, 0.5, 0.9};
    size_t n_ctx = 4, n_depth = 3;
    int trials = 1;
    char methods_buf[256] = "full,retroinfer,quest,streaming";
    char model_path[4096] = "";
    cm_log_init_from_env();
    for (int i = 1; i < argc; i++) {
        const char *v;
        if ((v = pk_arg(&i, argc, argv, "--contexts")) != NULL)
            n_ctx = bn_parse_list(v, ctxs, 8);
        else if ((v = pk_arg(&i, argc, argv, "--depths")) != NULL)
            n_depth = bn_parse_list(v, depths, 8);
        else if ((v = pk_arg(&i, argc, argv, "--trials")) != NULL)
            trials = atoi(v) > 0 ? atoi(v) : 1;
        else if ((v = pk_arg(&i, argc, argv, "--methods")) != NULL)
            snprintf(methods_buf, sizeof(methods_buf), "%s", v);
        else if ((v = pk_arg(&i, argc, argv, "--model")) != NULL)
            snprintf(model_path, sizeof(model_path), "%s", v);
        else {
            fprintf(stderr, "usage: ri bench passkey [--json PATH] [--contexts L,..] [--depths D,..] [--trials N] "
                            "[--methods M,..] [--model NAME|PATH]\n");
            return 2;
        }
    }
    const char *methods[8];
    size_t n_m = 0;
    for (char *save = NULL, *t = strtok_r(methods_buf, ",", &save); t && n_m < 8; t = strtok_r(NULL, ",", &save)) {
        if (mdl_attn_find(t) == NULL) {
            fprintf(stderr, "ri bench passkey: unknown method '%s' (have: %s)\n", t, mdl_attn_names());
            return 2;
        }
        methods[n_m++] = t;
    }
    char model_arg[4096];   /* a name (gemma3-270m) or a path */
    snprintf(model_arg, sizeof(model_arg), "%s", model_path);
    if (mdl_model_resolve(model_arg, model_path, sizeof(model_path)) != RI_OK) {
        fprintf(stderr, "ri bench passkey: no model at %s; run ./ri setup (names: %s)\n", model_path, mdl_model_names());
        return 1;
    }
    char err[512];
    mdl_model_t *m;
    if (mdl_model_load(model_path, &m, err, sizeof(err)) != RI_OK) {
        fprintf(stderr, "ri bench passkey: %s\n", err);
        return 1;
    }
    bn_report_t *rep = bn_report_create("passkey");
    if (rep == NULL)
        return 1;
    cJSON_AddStringToObject(bn_report_root(rep), "model", mdl_model_name(m));
    const mdl_hparams_t *hp = mdl_model_hparams(m);
    float *logits = malloc(hp->n_vocab * sizeof(float));
    int passed[8][8][8] = {{{0}}};
    uint64_t rng = 0xC0FFEEull;
    printf("%-8s %-6s %-11s %-6s %s\n", "context", "depth", "method", "pass", "output");
    for (size_t c = 0; c < n_ctx; c++) {
        size_t ctx = (size_t)ctxs[c];
        if (ctx + PK_GEN_TOKENS > hp->n_ctx + 64) {
            char why[128];
            snprintf(why, sizeof(why), "beyond the model's trained context of %u", hp->n_ctx);
            char name[64];
            snprintf(name, sizeof(name), "context=%zu", ctx);
            bn_report_skip(rep, name, why);
            continue;
        }
        for (size_t d = 0; d < n_depth; d++)
            for (int t = 0; t < trials; t++) {
                rng = rng * 6364136223846793005ull + 1442695040888963407ull;
                int key = 10000 + (int)((rng >> 33) % 90000);
                int32_t *ids;
                size_t n;
                if (bn_passkey_prompt(mdl_model_tok(m), ctx, depths[d], key, &ids, &n) != RI_OK)
                    return 1;
                mdl_seq_t *base;
                if (mdl_seq_create(m, mdl_attn_find("full"), NULL, n + PK_GEN_TOKENS, &base) != RI_OK)
                    return 1;
                double t0 = cm_time_s();
                if (mdl_prefill(m, base, ids, n, logits, NULL, NULL, NULL) != RI_OK)
                    return 1;
                double tp = cm_time_s() - t0;
                for (size_t k = 0; k < n_m; k++) {
                    bool ok = false;
                    char out[512];
                    if (pk_try(m, base, logits, methods[k], key, &ok, out, sizeof(out)) != RI_OK)
                        return 1;
                    passed[c][d][k] += ok;
                    printf("%-8zu %-6.2f %-11s %-6s key %d:%s  (prompt %zu tok, prefill %.1fs)\n", ctx, depths[d],
                           methods[k], ok ? "PASS" : "fail", key, out, n, tp);
                    fflush(stdout);
                }
                mdl_seq_destroy(base);
                cm_free(ids);
            }
        for (size_t d = 0; d < n_depth; d++)
            for (size_t k = 0; k < n_m; k++) {
                cJSON *row = bn_report_row(rep);
                cJSON_AddStringToObject(row, "attn", methods[k]);
                cJSON_AddNumberToObject(row, "context", (double)ctx);
                cJSON_AddNumberToObject(row, "depth", depths[d]);
                cJSON_AddNumberToObject(row, "trials", trials);
                cJSON_AddNumberToObject(row, "passed", passed[c][d][k]);
            }
    }
    printf("\nsummary (passed / trials over depths):\n%-11s", "method");
    for (size_t c = 0; c < n_ctx; c++)
        printf(" %8zu", (size_t)ctxs[c]);
    printf("\n");
    for (size_t k = 0; k < n_m; k++) {
        printf("%-11s", methods[k]);
        for (size_t c = 0; c < n_ctx; c++) {
            int p = 0;
            for (size_t d = 0; d < n_depth; d++)
                p += passed[c][d][k];
            printf("   %2d/%-3d", p, (int)(n_depth * (size_t)trials));
        }
        printf("\n");
    }
    free(logits);
    mdl_model_destroy(m);
    return bn_report_finish(rep, json) == 0 ? 0 : 1;
}
