/*
 * ri bench attn-accuracy --kv DIR: attention accuracy of every method on K/V
 * captured from the real model (ri generate --dump-kv DIR, format in
 * docs/kv-dump-format.md).  For each layer and decode step the captured
 * query attends the K/V of every token up to its position, exactly and with
 * each method; retroinfer's index is built over the prompt and updated as
 * decoding advances, as in the model.  quest, streaming and oracle get the
 * same exact-token budget as retroinfer's exact part at that step.
 *
 * Metrics per (layer, query head, step): relative L2 error of the output vs
 * exact; per (layer, KV head, step): Recall@100 of the true top-100 tokens
 * (by group score: the sum over the group's heads of the softmax) among the
 * tokens attended exactly, and the attention mass those tokens carry.
 * Recall and mass need the method's token set; Quest's is internal to
 * kernels/, so its rows report null there.
 *
 * --retrieval-frac F changes retroinfer's retrieval zone (R = F x clusters),
 * and so everyone's budget: runs at several F give accuracy against budget
 * (./ri plot charts the files together).  --retrieval-min T sets the floor
 * of the retrieval zone in tokens, --adapt-tau X the output-aware per-head
 * cut (kn_wave.h); the others' budget follows retroinfer's exact tokens of
 * each step, so adaptive and fixed are compared at equal bytes.
 * --cluster-tokens N fixes the index's cluster size (default: the auto size,
 * kn_wave_cluster_tokens), so sizes compare on the same K/V.
 *
 *   ri bench attn-accuracy --kv DIR [--json PATH] [--layers N] [--retrieval-frac F]
 *                          [--retrieval-min T] [--adapt-tau X] [--cluster-tokens N]
 *   (--help lists them)
 */
#define _GNU_SOURCE
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cjson/cJSON.h>

#include "bench/common/bn_args.h"
#include "bench/common/bn_report.h"
#include "common/cm_log.h"
#include "common/cm_runtime.h"
#include "gpuworker/model/mdl_kvdump.h"
#include "kernels/kn_baselines.h"
#include "kernels/kn_ops.h"
#include "kernels/kn_wave.h"

enum { M_FULL, M_RETRO, M_QUEST, M_STREAM, M_ORACLE, M_COUNT };
static const char *const m_names[M_COUNT] = {"full", "retroinfer", "quest", "streaming", "oracle"};

/* Growable samples of one metric. */
typedef struct samples {
    double *v;
    size_t n, cap;
} samples_t;

static void push(samples_t *s, double x)
{
    if (s->n == s->cap) {
        s->cap = s->cap ? 2 * s->cap : 256;
        s->v = realloc(s->v, s->cap * sizeof(double));
    }
    s->v[s->n++] = x;
}

typedef struct acc {
    samples_t err, recall, mass;   /* per method */
    double budget_sum;             /* exact tokens per (head, step), summed */
    size_t budget_n;
} acc_t;

static double rel_l2(const float *a, const float *b, size_t n)
{
    double e = 0, s = 0;
    for (size_t i = 0; i < n; i++) {
        e += ((double)a[i] - b[i]) * ((double)a[i] - b[i]);
        s += (double)b[i] * b[i];
    }
    return sqrt(e / (s > 0 ? s : 1e-30));
}

static int cmp_desc(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? 1 : x > y ? -1 : 0;
}

/* Recall@100 and mass of the token set `in` (flags [n]) for one KV head;
 * score = group score per token, sorted copy gives the top-100 threshold. */
static void set_metrics(const double *score, size_t n, const unsigned char *in, size_t g, double *recall,
                        double *mass)
{
    double *sorted = malloc(n * sizeof(double));
    memcpy(sorted, score, n * sizeof(double));
    qsort(sorted, n, sizeof(double), cmp_desc);
    size_t k = n < 100 ? n : 100;
    double thr = sorted[k - 1];
    size_t hit = 0, top = 0;
    double ms = 0;
    for (size_t j = 0; j < n; j++) {
        if (in[j])
            ms += score[j];
        if (score[j] >= thr && top < k) {
            top++;
            hit += in[j] != 0;
        }
    }
    *recall = (double)hit / (double)k;
    *mass = ms / (double)g;
    free(sorted);
}

static void report(bn_report_t *rep, const char *source, const char *layer, int m, acc_t *a, bool sets)
{
    cJSON *row = bn_report_row(rep);
    cJSON_AddStringToObject(row, "method", m_names[m]);
    if (strcmp(layer, "all") == 0)
        cJSON_AddStringToObject(row, "layer", "all");
    else
        cJSON_AddNumberToObject(row, "layer", atof(layer));
    cJSON_AddNumberToObject(row, "budget_tokens", a->budget_n ? a->budget_sum / (double)a->budget_n : 0);
    cJSON_AddNumberToObject(row, "rel_err_median", bn_median(a->err.v, a->err.n));
    cJSON_AddNumberToObject(row, "rel_err_p90", bn_percentile(a->err.v, a->err.n, 90));
    cJSON_AddNumberToObject(row, "rel_err_p99", bn_percentile(a->err.v, a->err.n, 99));
    if (sets && a->recall.n > 0) {
        cJSON_AddNumberToObject(row, "recall100_median", bn_median(a->recall.v, a->recall.n));
        cJSON_AddNumberToObject(row, "mass_median", bn_median(a->mass.v, a->mass.n));
    } else {
        cJSON_AddNullToObject(row, "recall100_median");
        cJSON_AddNullToObject(row, "mass_median");
    }
    cJSON_AddStringToObject(row, "source", source);
    if (strcmp(layer, "all") != 0 && atoi(layer) % 5 != 0)
        return;   /* the table shows every fifth layer and the total; the JSON has all */
    char rc[16] = "-", ms[16] = "-";
    if (sets && a->recall.n > 0) {
        snprintf(rc, sizeof(rc), "%.3f", bn_median(a->recall.v, a->recall.n));
        snprintf(ms, sizeof(ms), "%.3f", bn_median(a->mass.v, a->mass.n));
    }
    printf("%-6s %-11s %8.0f %10.2e %10.2e %10.2e %9s %9s\n", layer, m_names[m],
           a->budget_n ? a->budget_sum / (double)a->budget_n : 0, bn_median(a->err.v, a->err.n),
           bn_percentile(a->err.v, a->err.n, 90), bn_percentile(a->err.v, a->err.n, 99), rc, ms);
}

typedef struct aa_opts {
    char *json;
    char *kv;            /* the capture directory */
    int64_t layers;      /* at most this many layers */
    double rfrac;        /* 0 = the default of kn_wave_params_default */
    double rmin;         /* -1: the default floor */
    double tau;          /* 0: no per-head cut */
    int64_t tpc;         /* 0: the auto cluster size (kn_wave_cluster_tokens) */
} aa_opts_t;

static const cm_config_item_t aa_items[] = {
    BN_ARG_JSON(aa_opts_t, json),
    BN_ARG(aa_opts_t, "kv", CM_CFG_STRING, NULL,
           "the K/V capture directory (required; made by ri generate --dump-kv DIR)", kv, 0, 0),
    BN_ARG(aa_opts_t, "layers", CM_CFG_INT, "1073741824", "at most this many layers", layers, 1, 1 << 30),
    BN_ARG(aa_opts_t, "retrieval-frac", CM_CFG_DOUBLE, "0",
           "retroinfer's retrieval share of clusters, (0, 1] (0 = its default)", rfrac, 0, 1),
    BN_ARG(aa_opts_t, "retrieval-min", CM_CFG_DOUBLE, "-1", "retroinfer's retrieval floor in tokens (-1 = its default)",
           rmin, -1, 1 << 30),
    BN_ARG(aa_opts_t, "adapt-tau", CM_CFG_DOUBLE, "0", "retroinfer's output-aware per-head cut, [0, 1) (0 = off)", tau,
           0, 0.999999),
    BN_ARG(aa_opts_t, "cluster-tokens", CM_CFG_INT, "0", "tokens per cluster, 1..1024 (0 = the auto size)", tpc, 0,
           1024),
};
static const cm_config_table_t aa_table = {"ri bench attn-accuracy", "RI_BENCH_ATTN_ACCURACY_", aa_items,
                                           CM_ARRAY_LEN(aa_items), 0, NULL};

static int aa_main(const void *arg, const char *argv0)
{
    const aa_opts_t *o = arg;
    (void)argv0;
    const char *json = o->json;
    const char *dir = o->kv != NULL && o->kv[0] != '\0' ? o->kv : NULL;
    int max_layers = (int)o->layers;
    double rfrac = o->rfrac, rmin = o->rmin, tau = o->tau;
    long tpc = (long)o->tpc;
    if (dir == NULL) {
        fprintf(stderr, "ri bench attn-accuracy: --kv DIR is required (make one with ri generate --dump-kv DIR)\n");
        return 2;
    }
    char path[4096], source[300] = "model:unknown";
    snprintf(path, sizeof(path), "%s/meta.json", dir);
    FILE *f = fopen(path, "r");
    if (f == NULL) {
        fprintf(stderr, "ri bench attn-accuracy: cannot open %s: %m\n", path);
        return 1;
    }
    char meta[4096];
    size_t ml = fread(meta, 1, sizeof(meta) - 1, f);
    fclose(f);
    meta[ml] = '\0';
    cJSON *mj = cJSON_Parse(meta);
    const cJSON *jl = cJSON_GetObjectItem(mj, "n_layers"), *jp = cJSON_GetObjectItem(mj, "n_prompt");
    const cJSON *jm = cJSON_GetObjectItem(mj, "model");
    if (!cJSON_IsNumber(jl) || !cJSON_IsNumber(jp)) {
        fprintf(stderr, "ri bench attn-accuracy: %s lacks n_layers / n_prompt\n", path);
        return 1;
    }
    if (cJSON_IsString(jm))
        snprintf(source, sizeof(source), "model:%s", jm->valuestring);
    int n_layers = jl->valueint < max_layers ? jl->valueint : max_layers;
    size_t n_prompt = (size_t)jp->valuedouble;
    cJSON_Delete(mj);

    bn_report_t *rep = bn_report_create("attn-accuracy");
    if (rep == NULL)
        return 1;
    kn_wave_params_t wp0;
    kn_wave_params_default(&wp0);
    cJSON_AddNumberToObject(bn_report_root(rep), "retrieval_frac", rfrac > 0 ? rfrac : wp0.retrieval_frac);
    cJSON_AddNumberToObject(bn_report_root(rep), "retrieval_min_tokens", rmin >= 0 ? rmin : wp0.retrieval_min_tokens);
    cJSON_AddNumberToObject(bn_report_root(rep), "adapt_tau", tau);
    wp0.tokens_per_cluster = (uint32_t)tpc;
    cJSON_AddNumberToObject(bn_report_root(rep), "tokens_per_cluster", kn_wave_cluster_tokens(&wp0, n_prompt));
    acc_t all[M_COUNT] = {0};
    printf("%-6s %-11s %8s %10s %10s %10s %9s %9s\n", "layer", "method", "budget", "err_med", "err_p90", "err_p99",
           "recall100", "mass");
    for (int l = 0; l < n_layers; l++) {
        mdl_kvdump_layer_t L;
        char err[512];
        snprintf(path, sizeof(path), "%s/layer-%03d.rikv", dir, l);
        if (mdl_kvdump_read_layer(path, &L, err, sizeof(err)) != RI_OK) {
            fprintf(stderr, "ri bench attn-accuracy: %s\n", err);
            return 1;
        }
        uint32_t d = L.head_dim, nh = L.n_heads, nkv = L.n_kv_heads, g = nh / nkv;
        kn_shape_t shape = {.n_q_heads = nh, .n_kv_heads = nkv, .head_dim = d};
        float scale = kn_shape_scale(&shape);
        kn_kv_view_t view = {.k = L.k, .v = L.v, .token_stride = d, .head_stride = L.n_tokens * d};
        kn_wave_params_t wp;
        kn_wave_params_default(&wp);
        if (rfrac > 0)
            wp.retrieval_frac = (float)rfrac;
        if (rmin >= 0)
            wp.retrieval_min_tokens = (uint32_t)rmin;
        wp.adapt_tau = (float)tau;
        wp.tokens_per_cluster = (uint32_t)tpc;
        kn_wave_t *wave = NULL;
        kn_quest_t *quest = NULL;
        if (kn_wave_create(&shape, &wp, &wave) != RI_OK || kn_quest_create(&shape, 16, &quest) != RI_OK)
            return 1;
        view.n_tokens = n_prompt < L.n_tokens ? n_prompt : L.n_tokens;
        if (kn_wave_build(wave, &view) != RI_OK)
            return 1;
        acc_t la[M_COUNT] = {0};
        float *exact = malloc(nh * d * sizeof(float)), *out = malloc(nh * d * sizeof(float));
        double *score = malloc(L.n_tokens * sizeof(double));
        unsigned char *in = malloc(L.n_tokens);
        uint32_t *ids = malloc((L.n_tokens + 16) * sizeof(uint32_t));
        for (uint64_t s = 0; s < L.n_queries; s++) {
            size_t pos = L.q_pos[s], n = pos + 1;
            const float *q = L.q + s * nh * d;
            view.n_tokens = n;
            if (kn_attn_decode(kn_ops_ref(), &shape, 1, q, &view, exact, NULL) != RI_OK)
                return 1;
            /* retroinfer first: its exact part sets everyone's budget */
            kn_wave_stats_t ws = {0};
            if (kn_wave_update(wave, &view, NULL) != RI_OK || kn_wave_decode(wave, q, &view, out, NULL, &ws) != RI_OK)
                return 1;
            uint32_t budget = (uint32_t)(ws.exact_tokens / nkv);
            for (int m = 0; m < M_COUNT; m++) {
                ri_status_t st = RI_OK;
                if (m == M_FULL)
                    st = kn_attn_decode(NULL, &shape, 1, q, &view, out, NULL);
                else if (m == M_RETRO)
                    st = kn_wave_decode(wave, q, &view, out, NULL, NULL);
                else if (m == M_QUEST) {
                    st = kn_quest_update(quest, &view);
                    if (st == RI_OK)
                        st = kn_quest_decode(NULL, quest, q, &view, budget, out, NULL, NULL);
                } else if (m == M_STREAM)
                    st = kn_streaming_decode(NULL, &shape, q, &view, wp.sink_tokens,
                                             budget > wp.sink_tokens ? budget - wp.sink_tokens : 1, out, NULL);
                else
                    st = kn_oracle_decode(NULL, &shape, q, &view, budget, out, NULL);
                if (st != RI_OK) {
                    fprintf(stderr, "%s failed: %s\n", m_names[m], ri_status_str(st));
                    return 1;
                }
                for (uint32_t h = 0; h < nh; h++) {
                    double e = rel_l2(out + h * d, exact + h * d, d);
                    push(&la[m].err, e);
                    push(&all[m].err, e);
                }
                double b = m == M_FULL ? (double)n : (double)(budget < n ? budget : n);
                la[m].budget_sum += b, la[m].budget_n++;
                all[m].budget_sum += b, all[m].budget_n++;
            }
            /* token sets per KV head for recall and mass */
            for (uint32_t kh = 0; kh < nkv; kh++) {
                const cm_fp16_t *kk = L.k + (size_t)kh * L.n_tokens * d;
                memset(score, 0, n * sizeof(double));
                for (uint32_t t = 0; t < g; t++) {
                    const float *qh = q + (size_t)(kh * g + t) * d;
                    double mx = -INFINITY, sum = 0;
                    double *lg = malloc(n * sizeof(double));
                    for (size_t j = 0; j < n; j++) {
                        double dot = 0;
                        for (uint32_t e = 0; e < d; e++)
                            dot += (double)qh[e] * cm_fp16_to_f32(kk[j * d + e]);
                        lg[j] = dot * scale;
                        mx = lg[j] > mx ? lg[j] : mx;
                    }
                    for (size_t j = 0; j < n; j++)
                        sum += (lg[j] = exp(lg[j] - mx));
                    for (size_t j = 0; j < n; j++)
                        score[j] += lg[j] / sum;
                    free(lg);
                }
                double rc, ms;
                /* full */
                memset(in, 1, n);
                set_metrics(score, n, in, g, &rc, &ms);
                push(&la[M_FULL].recall, rc), push(&la[M_FULL].mass, ms);
                push(&all[M_FULL].recall, rc), push(&all[M_FULL].mass, ms);
                /* retroinfer: steady zone + retrieval clusters (ranked as the kernel ranks) */
                memset(in, 0, n);
                size_t ie = kn_wave_indexed_end(wave);
                for (size_t j = 0; j < n; j++)
                    in[j] = j < wp.sink_tokens || j >= ie;
                const kn_index_t *idx = kn_wave_index(wave, kh);
                uint32_t nr, ne, nr_got = 0, ne_got = 0;
                kn_wave_budget(wave, &nr, &ne);
                if (idx != NULL && idx->n_clusters > 0) {
                    kn_shape_t grp = {.n_q_heads = g, .n_kv_heads = 1, .head_dim = d};
                    if (kn_rank(NULL, &grp, q + (size_t)kh * g * d, idx, nr, ne, ids, &nr_got, &ne_got) == RI_OK)
                        for (uint32_t c = 0; c < nr_got; c++)
                            for (uint32_t t = idx->offsets[ids[c]]; t < idx->offsets[ids[c] + 1]; t++)
                                if (idx->perm[t] < n)
                                    in[idx->perm[t]] = 1;
                }
                set_metrics(score, n, in, g, &rc, &ms);
                push(&la[M_RETRO].recall, rc), push(&la[M_RETRO].mass, ms);
                push(&all[M_RETRO].recall, rc), push(&all[M_RETRO].mass, ms);
                /* streaming: sinks + window */
                uint32_t win = budget > wp.sink_tokens ? budget - wp.sink_tokens : 1;
                for (size_t j = 0; j < n; j++)
                    in[j] = j < wp.sink_tokens || j + win >= n;
                set_metrics(score, n, in, g, &rc, &ms);
                push(&la[M_STREAM].recall, rc), push(&la[M_STREAM].mass, ms);
                push(&all[M_STREAM].recall, rc), push(&all[M_STREAM].mass, ms);
                /* oracle: the budget best by group score */
                double *sorted = malloc(n * sizeof(double));
                memcpy(sorted, score, n * sizeof(double));
                qsort(sorted, n, sizeof(double), cmp_desc);
                double thr = sorted[(budget < n ? budget : n) - 1];
                free(sorted);
                for (size_t j = 0; j < n; j++)
                    in[j] = score[j] >= thr;
                set_metrics(score, n, in, g, &rc, &ms);
                push(&la[M_ORACLE].recall, rc), push(&la[M_ORACLE].mass, ms);
                push(&all[M_ORACLE].recall, rc), push(&all[M_ORACLE].mass, ms);
            }
        }
        char ln[16];
        snprintf(ln, sizeof(ln), "%d", l);
        for (int m = 0; m < M_COUNT; m++) {
            report(rep, source, ln, m, &la[m], m != M_QUEST);
            free(la[m].err.v), free(la[m].recall.v), free(la[m].mass.v);
        }
        free(exact), free(out), free(score), free(in), free(ids);
        kn_wave_destroy(wave);
        kn_quest_destroy(quest);
        mdl_kvdump_layer_free(&L);
    }
    for (int m = 0; m < M_COUNT; m++) {
        report(rep, source, "all", m, &all[m], m != M_QUEST);
        free(all[m].err.v), free(all[m].recall.v), free(all[m].mass.v);
    }
    return bn_report_finish(rep, json) == 0 ? 0 : 1;
}

int main(int argc, char **argv)
{
    aa_opts_t o;
    char rt_err[256];
    if (cm_runtime_setup_from_env(cm_runtime_apply, rt_err, sizeof(rt_err)) != RI_OK ||
        cm_runtime_setup_from_env(kn_runtime_apply, rt_err, sizeof(rt_err)) != RI_OK) {
        fprintf(stderr, "ri bench attn-accuracy: %s\n", rt_err);
        return 2;
    }
    return bn_args_main(&aa_table, &o, argc, argv, aa_main);
}
