/*
 * ri bench dev: decode speed where a real deployment runs, on a machine
 * with no model files.  The model is synthetic (mdl_synth.h): a preset's
 * geometry (llama3-8b: 32 layers, 32/8 heads, 14336 FFN, 128256 vocab) with
 * weights generated from a seed.  For each context and batch, the device
 * engine (--device cuda) decodes from sequences filled with clustered
 * synthetic K/V (no prefill: 128K tokens of an 8B model cannot be prefilled
 * on the CPU); the CPU (--device cpu, small presets only) decodes from a
 * prefilled sequence of the preset's GGUF.  Attention methods side by side
 * at the same context and batch: "full" and "retroinfer" on both (on the
 * device, bd_dev_attn_ok: a retroinfer sequence filled with synthetic K/V
 * is indexed at its first decode step).  Per case: one untimed step (the
 * index build), then --steps timed steps; tokens/s = batch / median step,
 * and the bytes a full-attention step must read (weights + the batch's K/V)
 * over the step time as an effective bandwidth; the tokens attended exactly
 * per layer-step, the seconds of index builds and updates, and the bytes
 * the batch's sequences hold (device: K/V cache and index; CPU: the K/V).
 * A case whose K/V does not fit the device is reported as skipped.
 *
 *   ri-bench-dev [--device cuda|cpu] [--preset llama3-8b|tiny] [--seed S]
 *                [--contexts 32768,131072,524288] [--batch 1,4] [--steps N]
 *                [--attn full,retroinfer] [--json PATH] [--write-gguf PATH]
 *
 * Exit 77 when cuda is asked and this build or machine has no CUDA device;
 * 2 on bad options; 1 when a case fails.
 */
#define _GNU_SOURCE
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "bench/common/bn_args.h"
#include "bench/common/bn_report.h"
#include "common/cm_runtime.h"
#include "common/cm_time.h"
#include "gpuworker/model/mdl_attn.h"
#include "gpuworker/model/mdl_model.h"
#include "gpuworker/model/mdl_sample.h"
#include "gpuworker/model/mdl_synth.h"
#ifdef BD_HAVE_DEV
#include "gpuworker/model/mdl_dev.h"
#endif

#define BD_MAX_LIST 8
#define BD_MAX_STEPS 1024
#define BD_MAX_BATCH 8
#define BD_EXIT_SKIP 77

/* The command line (bn_args). */
typedef struct bd_args {
    char *json, *device, *preset, *contexts, *batch, *attn, *write_gguf;
    int64_t steps, seed;
} bd_args_t;

static const cm_config_item_t bd_items[] = {
    BN_ARG_JSON(bd_args_t, json),
    BN_ARG(bd_args_t, "device", CM_CFG_STRING, "cuda", "where decode runs: cuda or cpu", device, 0, 0),
    BN_ARG(bd_args_t, "preset", CM_CFG_STRING, "llama3-8b", "synthetic model geometry: llama3-8b or tiny", preset,
           0, 0),
    BN_ARG(bd_args_t, "seed", CM_CFG_INT, "1", "seed of the weights and the K/V", seed, 0, INT64_MAX),
    BN_ARG(bd_args_t, "contexts", CM_CFG_STRING, "32768,131072,524288", "context lengths (K, M suffixes; up to 8)",
           contexts, 0, 0),
    BN_ARG(bd_args_t, "batch", CM_CFG_STRING, "1,4", "batch sizes, 1..8 (up to 8)", batch, 0, 0),
    BN_ARG(bd_args_t, "steps", CM_CFG_INT, "16", "timed decode steps per case", steps, 1, BD_MAX_STEPS),
    BN_ARG(bd_args_t, "attn", CM_CFG_STRING, "full,retroinfer", "attention methods side by side (up to 8)", attn, 0,
           0),
    BN_ARG(bd_args_t, "write-gguf", CM_CFG_STRING, NULL, "write the preset's GGUF to PATH and exit (small presets)",
           write_gguf, 0, 0),
};
static const cm_config_table_t bd_table = {"ri-bench-dev", "RI_BENCH_DEV_", bd_items, CM_ARRAY_LEN(bd_items), 0,
                                           NULL};

/* The model under test on one device. */
typedef struct bd_engine {
    bool cuda;
    const mdl_synth_preset_t *preset;
    mdl_hparams_t hp;
    uint64_t weight_bytes;
    mdl_model_t *m;          /* cpu: loaded from the preset's GGUF, owned */
#ifdef BD_HAVE_DEV
    mdl_dev_t *d;            /* cuda, owned */
#endif
} bd_engine_t;

/* One case's sequences: batch of them, each ctx tokens long. */
typedef struct bd_seqs {
    size_t n;
    mdl_seq_t *cpu[BD_MAX_BATCH];
#ifdef BD_HAVE_DEV
    mdl_dev_seq_t *dev[BD_MAX_BATCH];
#endif
} bd_seqs_t;

/* The attention methods of device sequences (mdl_dev_seq_create_attn). */
static bool bd_dev_attn_ok(const char *attn)
{
    return strcmp(attn, "full") == 0 || strcmp(attn, "retroinfer") == 0;
}

/* K/V bytes of one sequence of n tokens (fp16 K and V of every layer). */
static double bd_kv_bytes(const mdl_hparams_t *hp, size_t n)
{
    return 2.0 * hp->n_layers * hp->n_kv_heads * (double)n * hp->head_dim * 2;
}

static int bd_engine_open(bd_engine_t *e, const bd_args_t *a, const char *gguf)
{
    char err[512];
    mdl_synth_hparams(e->preset, &e->hp);
    if (e->cuda) {
#ifdef BD_HAVE_DEV
        double t0 = cm_time_s();
        ri_status_t st = mdl_dev_create_synth(e->preset, (uint64_t)a->seed, &e->d, err, sizeof(err));
        if (st == RI_ERR_NO_DEVICE) {
            printf("skip: no CUDA device (%s)\n", err);
            return BD_EXIT_SKIP;
        }
        if (st != RI_OK) {
            fprintf(stderr, "ri-bench-dev: %s\n", err);
            return 1;
        }
        e->weight_bytes = mdl_dev_weight_bytes(e->d);
        printf("synthetic %s generated on the device: %.2f GB of fp16 weights in %.1f s\n", e->preset->name,
               (double)e->weight_bytes / 1e9, cm_time_s() - t0);
        return 0;
#else
        (void)a;
        printf("skip: this build has no CUDA device engine\n");
        return BD_EXIT_SKIP;
#endif
    }
    ri_status_t st = mdl_synth_write_gguf(e->preset, (uint64_t)a->seed, gguf, err, sizeof(err));
    if (st == RI_OK)
        st = mdl_model_load(gguf, &e->m, err, sizeof(err));
    if (st != RI_OK) {
        fprintf(stderr, "ri-bench-dev: %s\n", err);
        return st == RI_ERR_RANGE ? 2 : 1;
    }
    e->weight_bytes = mdl_model_weight_bytes(e->m);
    return 0;
}

static void bd_engine_close(bd_engine_t *e)
{
#ifdef BD_HAVE_DEV
    mdl_dev_destroy(e->d);
#endif
    mdl_model_destroy(e->m);
}

static void bd_seqs_free(bd_engine_t *e, bd_seqs_t *s)
{
    (void)e;
    for (size_t b = 0; b < s->n; b++) {
        mdl_seq_destroy(s->cpu[b]);
#ifdef BD_HAVE_DEV
        mdl_dev_seq_destroy(s->dev[b]);
#endif
    }
    memset(s, 0, sizeof(*s));
}

/* CPU: batch forks of base (a prefilled full-attention sequence) under attn. */
static ri_status_t bd_seqs_cpu(const mdl_seq_t *base, const char *attn, size_t batch, bd_seqs_t *s)
{
    for (size_t b = 0; b < batch; b++) {
        ri_status_t st = mdl_seq_fork(base, mdl_attn_find(attn), NULL, &s->cpu[b]);
        if (st != RI_OK)
            return st;
        s->n = b + 1;
    }
    return RI_OK;
}

#ifdef BD_HAVE_DEV
/* Device: batch sequences of room cap decoding with attn (the default
 * settings), each filled with ctx tokens of synthetic K/V (its own seed). */
static ri_status_t bd_seqs_dev(bd_engine_t *e, const char *attn, uint64_t seed, size_t ctx, size_t cap, size_t batch,
                               bd_seqs_t *s)
{
    char err[256] = "";
    mdl_attn_cfg_t cfg;
    mdl_attn_cfg_default(&cfg);
    for (size_t b = 0; b < batch; b++) {
        ri_status_t st = mdl_dev_seq_create_attn(e->d, cap, attn, &cfg, &s->dev[b], err, sizeof(err));
        if (st != RI_OK && err[0] != '\0')
            fprintf(stderr, "ri-bench-dev: %s sequence: %s\n", attn, err);
        if (st != RI_OK)
            return st;
        s->n = b + 1;
        if ((st = mdl_dev_seq_fill_synth(e->d, s->dev[b], ctx, seed + b)) != RI_OK)
            return st;
    }
    return RI_OK;
}
#endif

/* What a case's sequences did and hold, summed over the batch. */
typedef struct bd_held {
    mdl_attn_stats_t st;  /* decode_steps, exact_tokens, build_s summed */
    double bytes;         /* device: mdl_dev_seq_bytes; CPU: the K/V of ctx tokens */
} bd_held_t;

static void bd_seqs_held(const bd_engine_t *e, const bd_seqs_t *s, size_t ctx, bd_held_t *h)
{
    memset(h, 0, sizeof(*h));
    for (size_t b = 0; b < s->n; b++) {
        mdl_attn_stats_t st;
#ifdef BD_HAVE_DEV
        if (e->cuda) {
            mdl_dev_seq_attn_stats(s->dev[b], &st);
            h->bytes += (double)mdl_dev_seq_bytes(s->dev[b]);
        } else
#endif
        {
            mdl_seq_attn_stats(s->cpu[b], &st);
            h->bytes += bd_kv_bytes(&e->hp, ctx);
        }
        h->st.decode_steps += st.decode_steps;
        h->st.exact_tokens += st.exact_tokens;
        h->st.build_s += st.build_s;
    }
}

/* One decode step of every sequence; seconds, or -1 on an error. */
static double bd_step(bd_engine_t *e, bd_seqs_t *s, int32_t *toks, float *logits)
{
    double t0 = cm_time_s();
    ri_status_t st;
#ifdef BD_HAVE_DEV
    if (e->cuda)
        st = mdl_dev_decode(e->d, s->dev, toks, s->n, logits);
    else
#endif
        st = mdl_decode(e->m, s->cpu, toks, s->n, logits);
    double dt = cm_time_s() - t0;
    if (st != RI_OK) {
        fprintf(stderr, "ri-bench-dev: decode: %s\n", ri_status_str(st));
        return -1;
    }
    for (size_t b = 0; b < s->n; b++)   /* greedy, as a server would feed back */
        toks[b] = mdl_argmax(logits + b * e->hp.n_vocab, e->hp.n_vocab);
    return dt;
}

/* The parsed lists. */
typedef struct bd_plan {
    size_t ctx[BD_MAX_LIST], n_ctx;
    size_t batch[BD_MAX_LIST], n_batch;
    const char *attn[BD_MAX_LIST];
    size_t n_attn;
    int steps;
    uint64_t seed;
} bd_plan_t;

/* One case: time steps, print a line and a row; full_tok_s (the same
 * context and batch under full, 0 if none) for the side-by-side ratio.
 * Returns tokens/s, 0 when skipped, -1 on an error. */
static double bd_case(bd_engine_t *e, const bd_plan_t *p, const mdl_seq_t *base, size_t ctx, size_t batch,
                      const char *attn, double full_tok_s, float *logits, bn_report_t *rep)
{
    char name[96];
    bd_seqs_t s = {0};
    ri_status_t st = RI_ERR_UNSUPPORTED;
    snprintf(name, sizeof(name), "%s ctx=%zu batch=%zu", attn, ctx, batch);
    if (e->cuda && !bd_dev_attn_ok(attn)) {
        printf("%-11s %9zu %5zu   skipped: the device engine has no %s attention yet\n", attn, ctx, batch, attn);
        bn_report_skip(rep, name, "the device engine has no such attention method yet");
        return 0;
    }
#ifdef BD_HAVE_DEV
    if (e->cuda)
        st = bd_seqs_dev(e, attn, p->seed, ctx, ctx + (size_t)p->steps + 2, batch, &s);
    else
#endif
        st = bd_seqs_cpu(base, attn, batch, &s);
    if (st == RI_ERR_NOMEM && e->cuda) {
        char why[160];
        snprintf(why, sizeof(why), "does not fit: %.1f GB of K/V beside %.1f GB of weights",
                 batch * bd_kv_bytes(&e->hp, ctx) / 1e9, (double)e->weight_bytes / 1e9);
        printf("%-11s %9zu %5zu   skipped: %s\n", attn, ctx, batch, why);
        bn_report_skip(rep, name, why);
        bd_seqs_free(e, &s);
        return 0;
    }
    if (st != RI_OK) {
        fprintf(stderr, "ri-bench-dev: %s: cannot set up: %s\n", name, ri_status_str(st));
        bd_seqs_free(e, &s);
        return -1;
    }
    int32_t toks[BD_MAX_BATCH];
    double t[BD_MAX_STEPS];
    for (size_t b = 0; b < batch; b++)
        toks[b] = (int32_t)((b * 7919 + 13) % e->hp.n_vocab);
    double first = bd_step(e, &s, toks, logits);   /* builds an index; warms the device */
    for (int k = 0; k < p->steps && first >= 0; k++)
        if ((t[k] = bd_step(e, &s, toks, logits)) < 0)
            first = -1;
    bd_held_t held;
    bd_seqs_held(e, &s, ctx, &held);
    bd_seqs_free(e, &s);
    if (first < 0)
        return -1;
    double med = bn_median(t, (size_t)p->steps), tok_s = (double)batch / med;
    double bytes = (double)e->weight_bytes + batch * bd_kv_bytes(&e->hp, ctx);   /* what full attention reads */
    double exact = held.st.decode_steps > 0 ? (double)held.st.exact_tokens / (double)held.st.decode_steps : 0;
    printf("%-11s %9zu %5zu %10.1f %10.2f %10.1f %9.2f %10.1f %10.0f %9.1f %9.1f\n", attn, ctx, batch, tok_s, med * 1e3,
           bytes / med / 1e9, full_tok_s > 0 ? tok_s / full_tok_s : 1.0, first * 1e3, exact, held.st.build_s * 1e3,
           held.bytes / 1e6);
    fflush(stdout);
    cJSON *row = bn_report_row(rep);
    cJSON_AddStringToObject(row, "attn", attn);
    cJSON_AddNumberToObject(row, "context", (double)ctx);
    cJSON_AddNumberToObject(row, "batch", (double)batch);
    cJSON_AddNumberToObject(row, "decode_tok_s", tok_s);
    cJSON_AddNumberToObject(row, "decode_tok_s_p10", (double)batch / bn_percentile(t, (size_t)p->steps, 90));
    cJSON_AddNumberToObject(row, "decode_tok_s_p90", (double)batch / bn_percentile(t, (size_t)p->steps, 10));
    cJSON_AddNumberToObject(row, "step_ms", med * 1e3);
    cJSON_AddNumberToObject(row, "first_step_ms", first * 1e3);
    cJSON_AddNumberToObject(row, "samples", p->steps);
    cJSON_AddNumberToObject(row, "full_bytes_per_step", bytes);
    cJSON_AddNumberToObject(row, "full_gbs", bytes / med / 1e9);
    cJSON_AddNumberToObject(row, "exact_tokens_per_step", exact);
    cJSON_AddNumberToObject(row, "build_ms", held.st.build_s * 1e3);
    cJSON_AddNumberToObject(row, "held_bytes", held.bytes);
    if (full_tok_s > 0)
        cJSON_AddNumberToObject(row, "vs_full", tok_s / full_tok_s);
    return tok_s;
}

/* Every case of one context: the methods side by side per batch. */
static int bd_context(bd_engine_t *e, const bd_plan_t *p, size_t ctx, float *logits, bn_report_t *rep)
{
    mdl_seq_t *base = NULL;
    if (!e->cuda) {   /* a prompt of placeholder tokens, prefilled once */
        int32_t *ids = malloc(ctx * sizeof(int32_t));
        ri_status_t st = ids != NULL ? RI_OK : RI_ERR_NOMEM;
        for (size_t i = 0; i < ctx && ids != NULL; i++)
            ids[i] = (int32_t)((i * 7919 + 1) % e->hp.n_vocab);
        if (st == RI_OK)
            st = mdl_seq_create(e->m, mdl_attn_find("full"), NULL, ctx + (size_t)p->steps + 2, &base);
        if (st == RI_OK)
            st = mdl_prefill(e->m, base, ids, ctx, NULL, NULL, NULL, NULL);
        free(ids);
        if (st != RI_OK) {
            fprintf(stderr, "ri-bench-dev: prefill of %zu tokens: %s\n", ctx, ri_status_str(st));
            mdl_seq_destroy(base);
            return 1;
        }
    }
    int rc = 0;
    for (size_t bi = 0; bi < p->n_batch && rc == 0; bi++) {
        double full = 0;
        for (size_t k = 0; k < p->n_attn && rc == 0; k++) {
            double r = bd_case(e, p, base, ctx, p->batch[bi], p->attn[k], full, logits, rep);
            if (r < 0)
                rc = 1;
            if (strcmp(p->attn[k], "full") == 0)
                full = r;
        }
    }
    mdl_seq_destroy(base);
    return rc;
}

/* The lists of the command line into p; 2 on a bad one (message printed). */
static int bd_plan(const bd_args_t *a, char *attn_buf, size_t attn_len, bd_plan_t *p)
{
    double b[BD_MAX_LIST];
    memset(p, 0, sizeof(*p));
    p->steps = (int)a->steps;
    p->seed = (uint64_t)a->seed;
    p->n_ctx = bn_args_counts(a->contexts != NULL ? a->contexts : "", p->ctx, BD_MAX_LIST);
    p->n_batch = bn_args_list(a->batch != NULL ? a->batch : "", b, BD_MAX_LIST);
    if (p->n_ctx == 0 || p->n_batch == 0) {
        fprintf(stderr, "ri-bench-dev: --contexts and --batch are comma lists of up to %d counts\n", BD_MAX_LIST);
        return 2;
    }
    for (size_t i = 0; i < p->n_batch; i++) {
        if (!(b[i] >= 1 && b[i] <= BD_MAX_BATCH && b[i] == (double)(size_t)b[i])) {
            fprintf(stderr, "ri-bench-dev: batch %g is not in 1..%d\n", b[i], BD_MAX_BATCH);
            return 2;
        }
        p->batch[i] = (size_t)b[i];
    }
    snprintf(attn_buf, attn_len, "%s", a->attn != NULL ? a->attn : "");
    for (char *save = NULL, *t = strtok_r(attn_buf, ",", &save); t != NULL; t = strtok_r(NULL, ",", &save)) {
        if (mdl_attn_find(t) == NULL || p->n_attn == BD_MAX_LIST) {
            fprintf(stderr, "ri-bench-dev: unknown or too many attention methods at '%s' (have: %s)\n", t,
                    mdl_attn_names());
            return 2;
        }
        p->attn[p->n_attn++] = t;
    }
    if (p->n_attn == 0) {
        fprintf(stderr, "ri-bench-dev: --attn names no method\n");
        return 2;
    }
    return 0;
}

static int bd_write_gguf(const bd_args_t *a, const mdl_synth_preset_t *preset)
{
    char err[512];
    if (mdl_synth_write_gguf(preset, (uint64_t)a->seed, a->write_gguf, err, sizeof(err)) != RI_OK) {
        fprintf(stderr, "ri-bench-dev: %s\n", err);
        return 1;
    }
    printf("wrote synthetic %s (seed %lld) to %s\n", preset->name, (long long)a->seed, a->write_gguf);
    return 0;
}

static int bd_main(const void *opts, const char *argv0)
{
    const bd_args_t *a = opts;
    char err[256], attn_buf[256], gguf[] = "/tmp/ri-bench-dev-XXXXXX";
    bd_plan_t p;
    bd_engine_t e = {0};
    (void)argv0;
    if (cm_runtime_setup_from_env(mdl_runtime_apply, err, sizeof(err)) != RI_OK) {
        fprintf(stderr, "ri-bench-dev: %s\n", err);
        return 2;
    }
    if ((e.preset = mdl_synth_preset_find(a->preset)) == NULL) {
        fprintf(stderr, "ri-bench-dev: no preset '%s' (have: %s)\n", a->preset, mdl_synth_preset_names());
        return 2;
    }
    if (a->write_gguf != NULL)
        return bd_write_gguf(a, e.preset);
    if (strcmp(a->device, "cuda") != 0 && strcmp(a->device, "cpu") != 0) {
        fprintf(stderr, "ri-bench-dev: --device is cuda or cpu, not '%s'\n", a->device);
        return 2;
    }
    e.cuda = strcmp(a->device, "cuda") == 0;
    int rc = bd_plan(a, attn_buf, sizeof(attn_buf), &p);
    if (rc != 0)
        return rc;
    if (!e.cuda) {
        int fd = mkstemp(gguf);
        if (fd < 0) {
            perror("ri-bench-dev: mkstemp");
            return 1;
        }
        close(fd);
    }
    rc = bd_engine_open(&e, a, gguf);
    if (!e.cuda)
        unlink(gguf);   /* mapped by the model from here on */
    if (rc != 0)
        return rc;
    bn_report_t *rep = bn_report_create("dev");
    float *logits = malloc((size_t)BD_MAX_BATCH * e.hp.n_vocab * sizeof(float));
    if (rep == NULL || logits == NULL) {
        bd_engine_close(&e);
        return 1;
    }
    double la[3];
    bn_loadavg(la);
    cJSON *root = bn_report_root(rep);
    cJSON_AddStringToObject(root, "device", a->device);
    cJSON_AddStringToObject(root, "preset", e.preset->name);
    cJSON_AddNumberToObject(root, "seed", (double)a->seed);
    cJSON_AddNumberToObject(root, "weight_bytes", (double)e.weight_bytes);
    printf("ri-bench-dev: synthetic %s on %s, %.2f GB of weights, %d timed steps per case, load average %.2f\n"
           "tok/s = batch / median step; GB/s = (weights + the batch's K/V) / step, what full attention reads;\n"
           "x full = tok/s over full attention's at the same context and batch; first ms = the untimed first step\n"
           "(a retroinfer index is built there); exact = tokens attended exactly per layer-step; build ms = index\n"
           "builds and updates; MB = what the batch's sequences hold (device: K/V cache + index; cpu: the K/V)\n",
           e.preset->name, a->device, (double)e.weight_bytes / 1e9, p.steps, la[0]);
    printf("%-11s %9s %5s %10s %10s %10s %9s %10s %10s %9s %9s\n", "attn", "context", "batch", "tok/s", "ms/step",
           "GB/s", "x full", "first ms", "exact", "build ms", "MB");
    for (size_t c = 0; c < p.n_ctx && rc == 0; c++)
        rc = bd_context(&e, &p, p.ctx[c], logits, rep);
    free(logits);
    bd_engine_close(&e);
    if (bn_report_finish(rep, a->json) != 0)
        rc = 1;
    return rc;
}

int main(int argc, char **argv)
{
    bd_args_t a;
    return bn_args_main(&bd_table, &a, argc, argv, bd_main);
}
