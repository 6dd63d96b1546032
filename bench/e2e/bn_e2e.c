/*
 * ri bench e2e: end-to-end decode throughput of the real model with three
 * attention paths, side by side in one run (docs/bench-format.md, "e2e" rows):
 *   full                 exact attention, in-process
 *   retroinfer-local     wave index + tripartite attention, in-process
 *   retroinfer-kvstore   the same through ri-kvstore (clusters in the daemon,
 *                        block cache managed by it, UCX data plane)
 * For each context length the prompt is prefilled once (exact attention);
 * every (mode, batch) decodes from copies of that state.  The first step of
 * each copy builds its index (and uploads it): it is timed in its own column
 * and counted in the end-to-end tok/s; the decode tok/s is the median of the
 * steps after it, which the three modes take in turn (round robin, rotating
 * order).  --hog N runs N spinning processes meanwhile: the CPU shared, as on
 * a busy server.  A ri-kvstore is started on free loopback ports unless
 * --kvstore ADDR is given.
 *
 *   ri bench e2e [--json PATH] [--quick] [--contexts 2048,4096,8192]
 *                [--batches 1,4] [--steps N] [--hog N] [--kvstore ADDR] [--model NAME|PATH]
 *                [--cluster-tokens N]   (the wave index's cluster size, both
 *                                        retroinfer paths; default: the auto size)
 *                [--kvstore-memory SIZE] (the pool of the ri-kvstore it starts;
 *                                        Gemma 3 at 32K, batch 4 needs ~2.4 GB)
 *   ri bench e2e --synthetic [--kvstore ADDR]   (no model: synthetic K/V)
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <limits.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "bench/common/bn_args.h"
#include "bench/common/bn_daemon.h"
#include "bench/common/bn_report.h"
#include "bench/model/bn_filler.h"
#include "common/cm_alloc.h"
#include "common/cm_half.h"
#include "common/cm_log.h"
#include "common/cm_runtime.h"
#include "common/cm_status.h"
#include "common/cm_time.h"
#include "gpuworker/model/mdl_gen.h"
#include "gpuworker/model/mdl_kv_mem.h"
#include "gpuworker/model/mdl_model.h"
#include "gpuworker/model/mdl_sample.h"
#include "gpuworker/client/gw_attn_remote.h"
#include "gpuworker/client/gw_remote.h"
#include "gpuworker/client/gw_transport.h"
#include "kernels/kn_synth.h"
#include "kernels/kn_wave.h"
#include "retroinfer/retroinfer.h"

static CM_ALLOC_TAG(e2e_tag, "bench.e2e");

/* ---- the real model ---- */

typedef struct e2e_opts {
    size_t contexts[8], n_contexts;
    size_t batches[8], n_batches;
    size_t steps;
    unsigned hog;   /* spinning processes sharing the CPU during the run */
    uint32_t deadline_us; /* retroinfer-kvstore: per layer-step wait bound (0 = wait) */
} e2e_opts_t;

/* --cluster-tokens: the wave index's cluster size for both retroinfer paths
 * (0 = the auto size); set once by main before any case. */
static uint32_t e2e_cluster_tokens;

static size_t e2e_list(const char *s, size_t *out, size_t max)
{
    double v[8];
    size_t n = bn_args_list(s, v, CM_MIN(max, (size_t)8));
    for (size_t i = 0; i < n; i++)
        out[i] = v[i] > 0 ? (size_t)v[i] : 0;
    return n;
}

/* One mode's decode state for one (context, batch) case: batch forks of the
 * prefilled base, their next tokens and logits, and the time of every step. */
typedef struct e2e_case {
    const char *mode;     /* row name */
    const char *attn;     /* backend */
    bool remote;          /* through ri-kvstore */
    size_t batch;
    mdl_seq_t *seqs[8];   /* owned */
    int32_t tok[8];
    mdl_gen_t gen[8];     /* each sequence's picks (its end is not acted on: a fixed step count) */
    float *logits;        /* [batch][n_vocab], owned */
    double first_s;       /* the first step: index build + upload + decode */
    double *step_s;       /* [steps] timed steps after it, owned */
    size_t n_steps;       /* filled */
    bool failed;
} e2e_case_t;

static const char *const e2e_modes[3][2] = {{"full", "full"},
                                           {"retroinfer-local", "retroinfer"},
                                           {"retroinfer-kvstore", GW_ATTN_REMOTE_NAME}};

static void e2e_case_free(e2e_case_t *c)
{
    for (size_t b = 0; b < c->batch; b++)
        mdl_seq_destroy(c->seqs[b]);
    cm_free(c->logits);
    cm_free(c->step_s);
    memset(c, 0, sizeof(*c));
}

static ri_status_t e2e_case_init(e2e_case_t *c, int md, mdl_model_t *m, const mdl_seq_t *base,
                                 const float *logits0, size_t batch, size_t steps)
{
    const mdl_hparams_t *hp = mdl_model_hparams(m);
    mdl_attn_cfg_t acfg;
    memset(c, 0, sizeof(*c));
    c->mode = e2e_modes[md][0];
    c->attn = e2e_modes[md][1];
    c->remote = md == 2;
    c->batch = batch;
    c->logits = cm_malloc(&e2e_tag, batch * hp->n_vocab * sizeof(float));
    c->step_s = cm_calloc(&e2e_tag, steps ? steps : 1, sizeof(double));
    const mdl_attn_ops_t *ops = mdl_attn_find(c->attn);
    if (c->logits == NULL || c->step_s == NULL || ops == NULL)
        return RI_ERR_NOMEM;
    mdl_attn_cfg_default(&acfg);
    acfg.release_window = c->remote; /* the disaggregated worker keeps what it reads */
    acfg.wave.tokens_per_cluster = e2e_cluster_tokens;
    for (size_t b = 0; b < batch; b++) {
        ri_status_t st = mdl_seq_fork(base, ops, &acfg, &c->seqs[b]);
        if (st != RI_OK)
            return st;
        mdl_gen_init(&c->gen[b], mdl_model_tok(m), NULL, hp->n_vocab, SIZE_MAX, mdl_seq_len(c->seqs[b]),
                     mdl_seq_cap(c->seqs[b]));
        (void)mdl_gen_pick(&c->gen[b], logits0, &c->tok[b]);
    }
    return RI_OK;
}

/* One decode step of every sequence of the case; returns its seconds. */
static double e2e_case_step(e2e_case_t *c, mdl_model_t *m, size_t ctx)
{
    const mdl_hparams_t *hp = mdl_model_hparams(m);
    double t0 = cm_time_s();
    ri_status_t st = mdl_decode(m, c->seqs, c->tok, c->batch, c->logits);
    double dt = cm_time_s() - t0;
    if (st != RI_OK) {
        fprintf(stderr, "ri-bench-e2e: %s decode at %zu tokens, batch %zu: %s\n", c->mode, ctx, c->batch,
                ri_status_str(st));
        c->failed = true;
        return 0;
    }
    for (size_t b = 0; b < c->batch; b++)
        (void)mdl_gen_pick(&c->gen[b], c->logits + b * hp->n_vocab, &c->tok[b]);
    return dt;
}

/* Row and table line of one finished case; *tok_s_p = median decode tok/s. */
static void e2e_case_report(bn_report_t *rep, const e2e_case_t *c, size_t ctx, unsigned hog, double *tok_s_p)
{
    double med = bn_median(c->step_s, c->n_steps), p10 = bn_percentile(c->step_s, c->n_steps, 10),
           p90 = bn_percentile(c->step_s, c->n_steps, 90), sum = 0;
    for (size_t i = 0; i < c->n_steps; i++)
        sum += c->step_s[i];
    double tok_s = (double)c->batch / med;
    /* End to end: every token this case produced, first step included. */
    double e2e_tok_s = (double)(c->batch * (c->n_steps + 1)) / (c->first_s + sum);
    cJSON *row = bn_report_row(rep);
    cJSON_AddStringToObject(row, "mode", c->mode);
    cJSON_AddNumberToObject(row, "context", (double)ctx);
    cJSON_AddNumberToObject(row, "batch", (double)c->batch);
    cJSON_AddNumberToObject(row, "hog", hog);
    mdl_attn_stats_t as;
    mdl_seq_attn_stats(c->seqs[0], &as);
    if (as.tokens_per_cluster > 0) /* the size the wave index used (the auto one resolved) */
        cJSON_AddNumberToObject(row, "tokens_per_cluster", as.tokens_per_cluster);
    cJSON_AddNumberToObject(row, "steps", (double)c->n_steps);
    cJSON_AddNumberToObject(row, "decode_tok_s", tok_s);
    cJSON_AddNumberToObject(row, "decode_tok_s_p10", (double)c->batch / p90);
    cJSON_AddNumberToObject(row, "decode_tok_s_p90", (double)c->batch / p10);
    cJSON_AddNumberToObject(row, "first_step_ms", c->first_s * 1e3);
    cJSON_AddNumberToObject(row, "e2e_tok_s", e2e_tok_s);
    /* Worker memory per sequence: the engine's K/V arrays as far as they are
     * resident (the kernel's page table: the remote backend gives back what
     * the kvstore holds), plus what the remote backend holds (block cache,
     * receive buffer, meta index: its allocator's count); against the
     * sequence's whole K/V. */
    const mdl_kv_t *kvc = mdl_seq_kv(c->seqs[0]);
    double full_kv = (double)mdl_seq_len(c->seqs[0]) * kvc->geom.n_layers * kvc->geom.n_kv_heads *
                     kvc->geom.head_dim * 2.0 * sizeof(cm_fp16_t);
    double engine_kv = (double)mdl_kv_resident_bytes(kvc);
    double worker_kv = engine_kv;
    cJSON_AddNumberToObject(row, "engine_kv_resident_bytes", engine_kv);
    double hr = 0, fb = 0;
    if (c->remote) {
        gw_attn_remote_totals_t t;
        gw_attn_remote_totals(&t);
        hr = t.hits + t.misses ? (double)t.hits / (double)(t.hits + t.misses) : 0;
        fb = (double)t.fetched_bytes / (double)(c->batch * c->n_steps);
        cJSON_AddNumberToObject(row, "hit_ratio", hr);
        cJSON_AddNumberToObject(row, "fetched_bytes_per_token", fb);
        cJSON_AddNumberToObject(row, "fetch_wait_s_per_token", t.fetch_wait_s / (double)(c->batch * c->n_steps));
        /* what one layer-step waited for its fetch: the link's latency as the decode sees it */
        cJSON_AddNumberToObject(row, "fetch_wait_ms_per_layer_step", t.steps ? t.fetch_wait_s * 1e3 / (double)t.steps : 0);
        cJSON_AddNumberToObject(row, "late_clusters_per_token", (double)t.late_clusters / (double)(c->batch * c->n_steps));
        /* retrieved clusters read in place from the kvstore's region (no request) */
        cJSON_AddNumberToObject(row, "direct_clusters_per_token",
                                (double)t.direct_clusters / (double)(c->batch * c->n_steps));
        worker_kv += (double)t.resident_bytes / (double)c->batch;
        cJSON_AddNumberToObject(row, "remote_resident_bytes", (double)t.resident_bytes / (double)c->batch);
        cJSON_AddNumberToObject(row, "late_steps", (double)t.late_steps);
        cJSON_AddNumberToObject(row, "max_wait_ms", t.max_wait_s * 1e3);
        /* how misses would reach a block cache in device memory (gw_transport.h) */
        cJSON_AddStringToObject(row, "device_transport", gw_transport_current());
    } else {
        cJSON_AddNullToObject(row, "hit_ratio");
        cJSON_AddNumberToObject(row, "fetched_bytes_per_token", 0);
    }
    cJSON_AddNumberToObject(row, "full_kv_bytes", full_kv);
    cJSON_AddNumberToObject(row, "worker_kv_bytes", worker_kv);
    char hrs[16] = "-";
    if (c->remote)
        snprintf(hrs, sizeof(hrs), "%.3f", hr);
    printf("%-20s %7zu %5zu %9.2f %8.1f-%-8.1f %10.1f %9.2f %9s %13.0f %11.2f\n", c->mode, ctx, c->batch, tok_s,
           (double)c->batch / p90, (double)c->batch / p10, c->first_s * 1e3, e2e_tok_s, hrs, fb, worker_kv / full_kv);
    fflush(stdout);
    *tok_s_p = tok_s;
}

/* The three modes on one (context, batch): each takes its first step (index
 * build and upload, timed on its own), then they decode one step each, round
 * robin, the order rotating every round, so that a swing in the machine's
 * speed lands on all three alike and each gets the same number of samples. */
static int e2e_batch(bn_report_t *rep, mdl_model_t *m, const mdl_seq_t *base, const float *logits0, size_t ctx,
                     size_t batch, size_t steps, unsigned hog, double tps[3])
{
    e2e_case_t cs[3];
    int rc = -1;
    memset(cs, 0, sizeof(cs));
    for (int md = 0; md < 3; md++) {
        ri_status_t st = e2e_case_init(&cs[md], md, m, base, logits0, batch, steps);
        if (st != RI_OK) {
            fprintf(stderr, "ri-bench-e2e: %s at %zu tokens, batch %zu: %s\n", e2e_modes[md][0], ctx, batch,
                    ri_status_str(st));
            goto out;
        }
    }
    for (int md = 0; md < 3; md++)
        cs[md].first_s = e2e_case_step(&cs[md], m, ctx);
    gw_attn_remote_reset_totals();   /* fetch figures of the timed steps only */
    for (size_t s = 0; s < steps; s++)
        for (int j = 0; j < 3; j++) {
            e2e_case_t *c = &cs[(s + (size_t)j) % 3];
            if (!c->failed)
                c->step_s[c->n_steps++] = e2e_case_step(c, m, ctx);
        }
    for (int md = 0; md < 3; md++) {
        tps[md] = 0;
        if (cs[md].failed || cs[md].n_steps == 0)
            continue;
        e2e_case_report(rep, &cs[md], ctx, hog, &tps[md]);
    }
    rc = 0;
out:
    for (int md = 0; md < 3; md++)
        e2e_case_free(&cs[md]);
    return rc;
}

static int e2e_model(bn_report_t *rep, const char *model_path, const char *kvs, const e2e_opts_t *o)
{
    char path[4096], err[512];
    mdl_model_t *m = NULL;
    gw_attn_remote_cfg_t rc_cfg = {.address = kvs, .timeout_ms = 10000, .deadline_us = o->deadline_us};
    int rc = 1;

    rc_cfg.session_flags = bn_remote_env_flags(&rc_cfg.keep_kv);

    if (mdl_model_resolve(model_path, path, sizeof(path)) != RI_OK) {   /* a name (gemma3-270m) or a path */
        fprintf(stderr, "ri-bench-e2e: no model at %s (./ri model fetch); try --synthetic\n", path);
        return 3;
    }
    if (mdl_model_load(path, &m, err, sizeof(err)) != RI_OK) {
        fprintf(stderr, "ri-bench-e2e: cannot load %s: %s\n", path, err);
        return 1;
    }
    if (gw_attn_remote_configure(&rc_cfg, err, sizeof(err)) != RI_OK) {
        fprintf(stderr, "ri-bench-e2e: kvstore %s: %s\n", kvs, err);
        goto out;
    }
    const mdl_hparams_t *hp = mdl_model_hparams(m);
    printf("model %s; %zu timed decode steps per case, the modes interleaved round robin, after a first step\n"
           "(index build + upload) timed on its own%s\n",
           mdl_model_name(m), o->steps, o->hog ? "; the CPU is shared with spinning processes" : "");
    if (o->hog)
        printf("CPU shared: %u spinning processes\n", o->hog);
    printf("%-20s %7s %5s %9s %17s %10s %9s %9s %13s %11s\n", "mode", "context", "batch", "tok/s", "p10-p90 tok/s",
           "first ms", "e2e tok/s", "hit ratio", "fetched B/tok", "worker/full");
    for (size_t c = 0; c < o->n_contexts; c++) {
        size_t ctx = o->contexts[c], n_ids = 0;
        int32_t *ids = NULL;
        mdl_seq_t *base = NULL;
        float *logits = cm_malloc(&e2e_tag, hp->n_vocab * sizeof(float));
        const mdl_attn_ops_t *full = mdl_attn_find("full");
        double tps[8][3] = {{0}};
        if (ctx + o->steps + 8 > hp->n_ctx) {
            bn_report_skip(rep, "context over the model's trained length", "n_ctx");
            cm_free(logits);
            continue;
        }
        if (logits == NULL || bn_passkey_prompt(mdl_model_tok(m), ctx, 0.5, 31415, &ids, &n_ids) != RI_OK ||
            mdl_seq_create(m, full, NULL, n_ids + o->steps + 8, &base) != RI_OK) {
            cm_free(logits);
            cm_free(ids);
            goto out;
        }
        double t0 = cm_time_s();
        if (mdl_prefill(m, base, ids, n_ids, logits, NULL, NULL, NULL) != RI_OK) {
            fprintf(stderr, "ri-bench-e2e: prefill of %zu tokens failed\n", n_ids);
            mdl_seq_destroy(base);
            cm_free(logits);
            cm_free(ids);
            goto out;
        }
        printf("-- context %zu: prefill %.1f s (%.0f tok/s)\n", n_ids, cm_time_s() - t0,
               (double)n_ids / (cm_time_s() - t0));
        for (size_t b = 0; b < o->n_batches; b++)
            if (e2e_batch(rep, m, base, logits, ctx, o->batches[b], o->steps, o->hog, tps[b]) != 0)
                tps[b][0] = tps[b][1] = tps[b][2] = 0;
        for (size_t b = 0; b < o->n_batches; b++)
            if (tps[b][0] > 0 && tps[b][1] > 0 && tps[b][2] > 0)
                printf("   batch %zu (medians): local/full %.2fx, kvstore/full %.2fx (target >= 1.5x at 8K), "
                       "kvstore/local %.2f (target >= 0.85)\n",
                       o->batches[b], tps[b][1] / tps[b][0], tps[b][2] / tps[b][0], tps[b][2] / tps[b][1]);
        mdl_seq_destroy(base);
        cm_free(logits);
        cm_free(ids);
    }
    rc = 0;
out:
    gw_attn_remote_shutdown();
    mdl_model_destroy(m);
    return rc;
}

/* ---- synthetic K/V: the same three paths on attention alone ---- */

static int e2e_synthetic(bn_report_t *rep, const char *kvs, size_t n_tokens, size_t steps)
{
    enum { NL = 4 };
    kn_synth_params_t sp;
    kn_shape_t shape = {.n_q_heads = 9, .n_kv_heads = 3, .head_dim = 64};
    size_t cap = n_tokens + steps + 1, d = 64, nq = 9;
    cm_fp16_t *k[NL] = {0}, *v[NL] = {0};
    kn_wave_t *w[NL] = {0};
    ri_client_params_t cp;
    ri_session_params_t ssp;
    ri_client_h client = NULL;
    ri_session_h sess = NULL;
    kn_wave_params_t wp;
    float *q = cm_malloc(&e2e_tag, nq * d * sizeof(float)), o_f[9 * 64], o_l[9 * 64], o_r[9 * 64];
    double t_full = 0, t_local = 0, t_remote = 0, err_lr = 0, *err_f = cm_malloc(&e2e_tag, steps * NL * sizeof(double));
    int rc = 1;

    printf("synthetic K/V (kernels/kn_synth: heavy hitters, sinks, drift): %d layers, 9/3 heads, d 64, %zu tokens, "
           "%zu decode steps\n", NL, n_tokens, steps);
    ri_client_params_init(&cp);
    cp.address = kvs;
    if (ri_client_connect(&cp, &client) != RI_OK) {
        fprintf(stderr, "ri-bench-e2e: %s\n", ri_last_error());
        goto out;
    }
    ri_session_params_init(&ssp);
    ssp.n_layers = NL;
    ssp.n_q_heads = 9;
    ssp.n_kv_heads = 3;
    ssp.head_dim = 64;
    ssp.label = "bench-e2e-synthetic";
    if (ri_session_create(client, &ssp, &sess) != RI_OK) {
        fprintf(stderr, "ri-bench-e2e: %s\n", ri_last_error());
        goto out;
    }
    kn_wave_params_default(&wp);
    kn_synth_params_default(&sp);
    sp.n_q_heads = 9;
    sp.n_kv_heads = 3;
    sp.head_dim = 64;
    sp.n_tokens = cap;
    for (int l = 0; l < NL; l++) {
        k[l] = cm_malloc(&e2e_tag, 3 * cap * d * sizeof(cm_fp16_t));
        v[l] = cm_malloc(&e2e_tag, 3 * cap * d * sizeof(cm_fp16_t));
        sp.seed = 100 + (uint64_t)l;
        if (!k[l] || !v[l] || kn_synth_kv(&sp, k[l], v[l], d, cap * d) != RI_OK ||
            kn_wave_create(&shape, &wp, &w[l]) != RI_OK)
            goto out;
        kn_kv_view_t kv = {.k = k[l], .v = v[l], .n_tokens = n_tokens, .token_stride = d, .head_stride = cap * d};
        ri_kv_view_t rv = {.struct_size = sizeof(rv), .k = k[l], .v = v[l], .n_tokens = n_tokens, .token_stride = d,
                           .head_stride = cap * d};
        if (kn_wave_build(w[l], &kv) != RI_OK || ri_prefill(sess, (uint32_t)l, &rv) != RI_OK)
            goto out;
    }
    if (ri_prefill_wait(sess) != RI_OK)
        goto out;
    size_t ne = 0;
    for (size_t s = 0; s < steps; s++) {
        size_t n = n_tokens + s + 1;
        for (int l = 0; l < NL; l++) {
            sp.seed = 100 + (uint64_t)l; /* the layer's K/V model */
            kn_synth_query(&sp, s, q);
            kn_kv_view_t kv = {.k = k[l], .v = v[l], .n_tokens = n, .token_stride = d, .head_stride = cap * d};
            ri_kv_view_t rv = {.struct_size = sizeof(rv), .k = k[l], .v = v[l], .n_tokens = n, .token_stride = d,
                               .head_stride = cap * d};
            double t0 = cm_time_s();
            kn_attn_decode(NULL, &shape, 1, q, &kv, o_f, NULL);
            double t1 = cm_time_s();
            kn_wave_update(w[l], &kv, NULL);
            kn_wave_decode(w[l], q, &kv, o_l, NULL, NULL);
            double t2 = cm_time_s();
            if (ri_decode(&sess, 1, (uint32_t)l, q, &rv, o_r) != RI_OK) {
                fprintf(stderr, "ri-bench-e2e: %s\n", ri_last_error());
                goto out;
            }
            double t3 = cm_time_s();
            t_full += t1 - t0;
            t_local += t2 - t1;
            t_remote += t3 - t2;
            for (size_t h = 0; h < nq; h++) {
                double a = 0, b = 0, c = 0;
                for (size_t i = 0; i < d; i++) {
                    double x = o_r[h * d + i] - o_l[h * d + i], y = o_r[h * d + i] - o_f[h * d + i];
                    a += x * x;
                    b += y * y;
                    c += (double)o_f[h * d + i] * o_f[h * d + i];
                }
                err_lr = CM_MAX(err_lr, sqrt(a / (c + 1e-30)));
                if (h == 0)
                    err_f[ne++] = sqrt(b / (c + 1e-30));
            }
        }
    }
    ri_session_stats_t st = {.struct_size = sizeof(st)};
    ri_session_stats(sess, &st);
    double hr = st.hits + st.misses ? (double)st.hits / (double)(st.hits + st.misses) : 0;
    const char *modes[3] = {"full", "retroinfer-local", "retroinfer-kvstore"};
    double times[3] = {t_full, t_local, t_remote};
    printf("%-20s %12s %9s %16s\n", "mode", "steps/s", "hit ratio", "fetched B/step");
    for (int i = 0; i < 3; i++) {
        cJSON *row = bn_report_row(rep);
        cJSON_AddStringToObject(row, "mode", modes[i]);
        cJSON_AddStringToObject(row, "source", "synthetic");
        cJSON_AddNumberToObject(row, "context", (double)n_tokens);
        cJSON_AddNumberToObject(row, "batch", 1);
        cJSON_AddNumberToObject(row, "decode_tok_s", (double)steps / times[i]); /* attention of all layers only */
        if (i == 2) {
            cJSON_AddNumberToObject(row, "hit_ratio", hr);
            cJSON_AddNumberToObject(row, "fetched_bytes_per_token", (double)st.fetched_bytes / (double)steps);
            cJSON_AddStringToObject(row, "device_transport", gw_transport_current());
        } else {
            cJSON_AddNullToObject(row, "hit_ratio");
            cJSON_AddNumberToObject(row, "fetched_bytes_per_token", 0);
        }
        printf("%-20s %12.1f %9s %16.0f\n", modes[i], (double)steps / times[i], i == 2 ? "" : "-",
               i == 2 ? (double)st.fetched_bytes / (double)steps : 0.0);
    }
    printf("block cache: hit ratio %.3f (%llu hits, %llu misses), %u pages\n", hr, (unsigned long long)st.hits,
           (unsigned long long)st.misses, st.cache_pages);
    printf("kvstore vs in-process output: max relative error %.2g (same index, same clusters)\n", err_lr);
    printf("retroinfer vs exact attention (head 0 of every layer-step): median relative error %.3f, p90 %.3f\n",
           bn_median(err_f, ne), bn_percentile(err_f, ne, 90));
    rc = 0;
out:
    ri_session_close(sess);
    ri_client_close(client);
    for (int l = 0; l < NL; l++) {
        kn_wave_destroy(w[l]);
        cm_free(k[l]);
        cm_free(v[l]);
    }
    cm_free(q);
    cm_free(err_f);
    return rc;
}

/* The command line (bn_args). */
typedef struct e2e_args {
    char *json, *kvstore, *model, *contexts, *batches;
    bool quick, synthetic;
    int64_t steps, hog, deadline_us, cluster_tokens;
    uint64_t kvstore_memory;
} e2e_args_t;

static const cm_config_item_t e2e_items[] = {
    BN_ARG_JSON(e2e_args_t, json),
    BN_ARG(e2e_args_t, "quick", CM_CFG_BOOL, "false", "one context (2048 tokens), at most 6 steps", quick, 0, 0),
    BN_ARG(e2e_args_t, "synthetic", CM_CFG_BOOL, "false", "synthetic attention only (no model)", synthetic, 0, 0),
    BN_ARG(e2e_args_t, "contexts", CM_CFG_STRING, "2048,4096,8000", "context lengths in tokens (up to 8)", contexts, 0,
           0),
    BN_ARG(e2e_args_t, "batches", CM_CFG_STRING, "1,4", "batch sizes, 1 to 8 each (up to 8)", batches, 0, 0),
    BN_ARG(e2e_args_t, "steps", CM_CFG_INT, "12", "timed decode steps per case", steps, 1, 1 << 20),
    BN_ARG(e2e_args_t, "hog", CM_CFG_INT, "0", "spinning processes sharing the CPU meanwhile", hog, 0, 64),
    BN_ARG(e2e_args_t, "deadline-us", CM_CFG_INT, "0", "retroinfer-kvstore: per layer-step wait bound (0 = wait)",
           deadline_us, 0, UINT32_MAX),
    BN_ARG(e2e_args_t, "kvstore", CM_CFG_STRING, NULL, "use this ri-kvstore (gRPC ADDR) instead of starting one",
           kvstore, 0, 0),
    BN_ARG(e2e_args_t, "kvstore-memory", CM_CFG_SIZE, "3GiB", "--memory of the ri-kvstore it starts",
           kvstore_memory, 1048576.0, 17592186044416.0), /* ri-kvstore's own bounds */
    BN_ARG(e2e_args_t, "model", CM_CFG_STRING, NULL, "model NAME or PATH (empty: the default)", model, 0, 0),
    BN_ARG(e2e_args_t, "cluster-tokens", CM_CFG_INT, "0", "tokens per cluster, 1..1024 (0 = the auto size)",
           cluster_tokens, 0, 1024),
};
static const cm_config_table_t e2e_table = {"ri-bench-e2e", "RI_BENCH_E2E_", e2e_items, CM_ARRAY_LEN(e2e_items), 0,
                                            NULL};

static int e2e_main(const void *opts, const char *argv0)
{
    const e2e_args_t *a = opts;
    const char *json = a->json, *kvs = a->kvstore, *model = a->model;
    e2e_opts_t o = {.steps = (size_t)a->steps, .hog = (unsigned)a->hog, .deadline_us = (uint32_t)a->deadline_us};
    bool quick = a->quick, synthetic = a->synthetic;
    bn_daemon_t d = {0};
    int rc = 1;

    char rt_err[256];
    if (cm_runtime_setup_from_env(mdl_runtime_apply, rt_err, sizeof(rt_err)) != RI_OK) {
        fprintf(stderr, "ri bench e2e: %s\n", rt_err);
        return 2;
    }
    e2e_cluster_tokens = (uint32_t)a->cluster_tokens;
    o.n_contexts = e2e_list(a->contexts, o.contexts, 8);
    o.n_batches = e2e_list(a->batches, o.batches, 8);
    if (o.n_contexts == 0 || o.n_batches == 0) {
        fprintf(stderr, "ri-bench-e2e: --contexts and --batches are comma lists of up to 8 numbers\n");
        return 2;
    }
    if (quick) {
        o.contexts[0] = 2048;
        o.n_contexts = 1;
        o.steps = CM_MIN(o.steps, (size_t)6);
    }
    for (size_t b = 0; b < o.n_batches; b++)
        if (o.batches[b] == 0 || o.batches[b] > 8) {
            fprintf(stderr, "ri-bench-e2e: a batch is 1 to 8\n");
            return 2;
        }
    if (kvs == NULL) {
        char mem[32];
        snprintf(mem, sizeof(mem), "%llu", (unsigned long long)a->kvstore_memory);
        if (bn_daemon_start(&d, argv0, mem) != 0)
            return 1;
        kvs = d.grpc;
    }
    bn_report_t *rep = bn_report_create("e2e");
    if (rep == NULL)
        goto out;
    cJSON_AddStringToObject(bn_report_root(rep), "kvstore", kvs);
    cJSON_AddNumberToObject(bn_report_root(rep), "hog", o.hog);
    cJSON_AddNumberToObject(bn_report_root(rep), "deadline_us", o.deadline_us);
    cJSON_AddNumberToObject(bn_report_root(rep), "cluster_tokens_requested", e2e_cluster_tokens); /* 0 = auto */
    if (o.hog && bn_hog_start(o.hog) != 0)
        goto out;
    if (!synthetic) {
        rc = e2e_model(rep, model, kvs, &o);
        if (rc == 3) {
            bn_report_skip(rep, "model", "not installed; ran --synthetic instead");
            synthetic = true;
        }
    }
    if (synthetic)
        rc = e2e_synthetic(rep, kvs, quick ? 2048 : 4096, quick ? 24 : 64);
    bn_hog_stop();
    if (bn_report_finish(rep, json) != 0)
        rc = 1;
out:
    bn_hog_stop();
    if (d.pid > 0 || d.dir[0])
        bn_daemon_stop(&d);
    return rc;
}

int main(int argc, char **argv)
{
    e2e_args_t a;
    setenv("UCX_TLS", GW_UCX_TLS_LOCAL, 0); /* shared memory, also for the daemon we start */
    return bn_args_main(&e2e_table, &a, argc, argv, e2e_main);
}
