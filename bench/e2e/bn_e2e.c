/*
 * ri bench e2e: end-to-end decode throughput of the real model with three
 * attention paths, side by side in one run (docs/bench-format.md, "e2e" rows):
 *   full                 exact attention, in-process
 *   retroinfer-local     wave index + tripartite attention, in-process
 *   retroinfer-kvstore   the same through ri-kvstore (clusters in the daemon,
 *                        block cache managed by it, UCX data plane)
 * For each context length the prompt is prefilled once (exact attention);
 * every (mode, batch) decodes from copies of that state.  The first step of
 * each copy builds its index and is not timed.  A ri-kvstore is started on
 * free loopback ports unless --kvstore ADDR is given.
 *
 *   ri bench e2e [--json PATH] [--quick] [--contexts 2048,4096,8192]
 *                [--batches 1,4] [--steps N] [--kvstore ADDR] [--model PATH]
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

#include "bench/common/bn_report.h"
#include "bench/model/bn_filler.h"
#include "common/cm_alloc.h"
#include "common/cm_half.h"
#include "common/cm_log.h"
#include "common/cm_status.h"
#include "common/cm_time.h"
#include "gpuworker/model/mdl_model.h"
#include "gpuworker/model/mdl_sample.h"
#include "gpuworker/worker/gw_attn_remote.h"
#include "gpuworker/worker/gw_remote.h"
#include "kernels/kn_synth.h"
#include "kernels/kn_wave.h"
#include "retroinfer/retroinfer.h"

static CM_ALLOC_TAG(e2e_tag, "bench.e2e");

/* ---- a ri-kvstore child on free ports ---- */

typedef struct e2e_daemon {
    pid_t pid;
    char dir[256];
    char grpc[400];
} e2e_daemon_t;

static int e2e_daemon_start(e2e_daemon_t *d, const char *argv0, const char *memory)
{
    char bin[PATH_MAX], ports[400], flag_ports[420], flag_mem[64];
    const char *bd = getenv("RI_BUILD_DIR");
    memset(d, 0, sizeof(*d));
    if (bd != NULL)
        snprintf(bin, sizeof(bin), "%s/bin/ri-kvstore", bd);
    else {
        snprintf(bin, sizeof(bin), "%s", argv0);
        char *slash = strrchr(bin, '/');
        snprintf(slash ? slash + 1 : bin, sizeof(bin) - (size_t)(slash ? slash + 1 - bin : 0), "ri-kvstore");
    }
    if (access(bin, X_OK) != 0) {
        fprintf(stderr, "ri-bench-e2e: %s not found (build it, or pass --kvstore ADDR)\n", bin);
        return -1;
    }
    snprintf(d->dir, sizeof(d->dir), "%s/ri-e2e-XXXXXX", getenv("TMPDIR") ? getenv("TMPDIR") : "/tmp");
    if (mkdtemp(d->dir) == NULL)
        return -1;
    snprintf(ports, sizeof(ports), "%s/ports", d->dir);
    snprintf(flag_ports, sizeof(flag_ports), "--port-file=%s", ports);
    snprintf(flag_mem, sizeof(flag_mem), "--memory=%s", memory);
    d->pid = fork();
    if (d->pid == 0) {
        int fd = open("/dev/null", 1);
        if (fd >= 0) {
            dup2(fd, 1);
            dup2(fd, 2);
        }
        execl(bin, bin, "--listen=127.0.0.1:0", "--dataplane-listen=127.0.0.1:0", "--metrics-listen=127.0.0.1:0",
              flag_mem, flag_ports, (char *)NULL);
        _exit(127);
    }
    for (int i = 0; i < 1500; i++) {
        FILE *f = fopen(ports, "r");
        if (f != NULL) {
            char line[400];
            while (fgets(line, sizeof(line), f))
                if (strncmp(line, "grpc=", 5) == 0) {
                    line[strcspn(line, "\n")] = '\0';
                    snprintf(d->grpc, sizeof(d->grpc), "%s", line + 5);
                }
            fclose(f);
            if (d->grpc[0])
                return 0;
        }
        if (waitpid(d->pid, NULL, WNOHANG) == d->pid) {
            d->pid = 0;
            break;
        }
        usleep(10000);
    }
    fprintf(stderr, "ri-bench-e2e: ri-kvstore did not start\n");
    return -1;
}

static void e2e_daemon_stop(e2e_daemon_t *d)
{
    char p[400];
    if (d->pid > 0) {
        kill(d->pid, SIGTERM);
        waitpid(d->pid, NULL, 0);
    }
    snprintf(p, sizeof(p), "%s/ports", d->dir);
    unlink(p);
    if (d->dir[0])
        rmdir(d->dir);
}

/* ---- the real model ---- */

typedef struct e2e_opts {
    size_t contexts[8], n_contexts;
    size_t batches[8], n_batches;
    size_t steps;
} e2e_opts_t;

static size_t e2e_list(const char *s, size_t *out, size_t max)
{
    double v[8];
    size_t n = bn_parse_list(s, v, CM_MIN(max, (size_t)8));
    for (size_t i = 0; i < n; i++)
        out[i] = v[i] > 0 ? (size_t)v[i] : 0;
    return n;
}

/* Decode `steps` timed steps (after one untimed) on batch forks of base. */
static int e2e_run(bn_report_t *rep, mdl_model_t *m, const mdl_seq_t *base, const float *logits0, const char *mode,
                   const char *attn, size_t batch, size_t steps, size_t ctx, double *tok_s_p)
{
    const mdl_hparams_t *hp = mdl_model_hparams(m);
    const mdl_attn_ops_t *ops = mdl_attn_find(attn);
    mdl_seq_t *seqs[8] = {0};
    int32_t tok[8];
    float *logits = cm_malloc(&e2e_tag, batch * hp->n_vocab * sizeof(float));
    mdl_attn_cfg_t acfg;
    ri_status_t st = RI_OK;
    int rc = -1;
    bool remote = strcmp(attn, GW_ATTN_REMOTE_NAME) == 0;

    mdl_attn_cfg_default(&acfg);
    if (ops == NULL || logits == NULL)
        goto out;
    for (size_t b = 0; b < batch && st == RI_OK; b++) {
        st = mdl_seq_fork(base, ops, &acfg, &seqs[b]);
        tok[b] = mdl_argmax(logits0, hp->n_vocab);
    }
    if (st == RI_OK)
        st = mdl_decode(m, seqs, tok, batch, logits); /* builds indexes, uploads */
    if (remote)
        gw_attn_remote_reset_totals();
    double t0 = cm_time_s();
    for (size_t s = 0; s < steps && st == RI_OK; s++) {
        for (size_t b = 0; b < batch; b++)
            tok[b] = mdl_argmax(logits + b * hp->n_vocab, hp->n_vocab);
        st = mdl_decode(m, seqs, tok, batch, logits);
    }
    double dt = cm_time_s() - t0;
    if (st != RI_OK) {
        fprintf(stderr, "ri-bench-e2e: %s decode at %zu tokens, batch %zu: %s\n", mode, ctx, batch, ri_status_str(st));
        goto out;
    }
    double tok_s = (double)(batch * steps) / dt;
    cJSON *row = bn_report_row(rep);
    cJSON_AddStringToObject(row, "mode", mode);
    cJSON_AddNumberToObject(row, "context", (double)ctx);
    cJSON_AddNumberToObject(row, "batch", (double)batch);
    cJSON_AddNumberToObject(row, "decode_tok_s", tok_s);
    double hr = 0, fb = 0;
    if (remote) {
        gw_attn_remote_totals_t t;
        gw_attn_remote_totals(&t);
        hr = t.hits + t.misses ? (double)t.hits / (double)(t.hits + t.misses) : 0;
        fb = (double)t.fetched_bytes / (double)(batch * steps);
        cJSON_AddNumberToObject(row, "hit_ratio", hr);
        cJSON_AddNumberToObject(row, "fetched_bytes_per_token", fb);
        cJSON_AddNumberToObject(row, "fetch_wait_s_per_token", t.fetch_wait_s / (double)(batch * steps));
    } else {
        cJSON_AddNullToObject(row, "hit_ratio");
        cJSON_AddNumberToObject(row, "fetched_bytes_per_token", 0);
    }
    printf("%-20s %7zu %5zu %10.2f %9s %14.0f\n", mode, ctx, batch, tok_s, remote ? "" : "-", fb);
    if (remote)
        printf("%44s hit ratio %.3f\n", "", hr);
    fflush(stdout);
    *tok_s_p = tok_s;
    rc = 0;
out:
    for (size_t b = 0; b < batch; b++)
        mdl_seq_destroy(seqs[b]);
    cm_free(logits);
    return rc;
}

static int e2e_model(bn_report_t *rep, const char *model_path, const char *kvs, const e2e_opts_t *o)
{
    char path[4096], err[512];
    mdl_model_t *m = NULL;
    gw_attn_remote_cfg_t rc_cfg = {.address = kvs, .timeout_ms = 10000};
    int rc = 1;

    if (model_path)
        snprintf(path, sizeof(path), "%s", model_path);
    else if (mdl_model_default_path(path, sizeof(path)) != RI_OK) {
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
    printf("model %s; %zu timed decode steps per case (after one that builds the index)\n", mdl_model_name(m),
           o->steps);
    printf("%-20s %7s %5s %10s %9s %14s\n", "mode", "context", "batch", "tok/s", "", "fetched B/tok");
    for (size_t c = 0; c < o->n_contexts; c++) {
        size_t ctx = o->contexts[c], n_ids = 0;
        int32_t *ids = NULL;
        mdl_seq_t *base = NULL;
        float *logits = cm_malloc(&e2e_tag, hp->n_vocab * sizeof(float));
        const mdl_attn_ops_t *full = mdl_attn_find("full");
        double tps[3][8] = {{0}};
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
        static const char *const modes[3][2] = {{"full", "full"},
                                                {"retroinfer-local", "retroinfer"},
                                                {"retroinfer-kvstore", GW_ATTN_REMOTE_NAME}};
        for (size_t b = 0; b < o->n_batches; b++)
            for (int md = 0; md < 3; md++)
                if (e2e_run(rep, m, base, logits, modes[md][0], modes[md][1], o->batches[b], o->steps, ctx,
                             &tps[md][b]) != 0)
                    tps[md][b] = 0;
        for (size_t b = 0; b < o->n_batches; b++)
            if (tps[0][b] > 0 && tps[1][b] > 0 && tps[2][b] > 0)
                printf("   batch %zu: kvstore/full %.2fx (target >= 1.5x at 8K), kvstore/local %.2f "
                       "(target >= 0.85)\n",
                       o->batches[b], tps[2][b] / tps[0][b], tps[2][b] / tps[1][b]);
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

int main(int argc, char **argv)
{
    const char *json = bn_parse_json_arg(&argc, argv), *kvs = NULL, *model = NULL;
    e2e_opts_t o = {.contexts = {2048, 4096, 8000}, .n_contexts = 3, .batches = {1, 4}, .n_batches = 2, .steps = 12};
    bool quick = false, synthetic = false;
    e2e_daemon_t d = {0};
    int rc = 1;

    cm_log_init_from_env();
    setenv("UCX_TLS", GW_UCX_TLS_LOCAL, 0); /* shared memory, also for the daemon we start */
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--quick"))
            quick = true;
        else if (!strcmp(argv[i], "--synthetic"))
            synthetic = true;
        else if (!strcmp(argv[i], "--kvstore") && i + 1 < argc)
            kvs = argv[++i];
        else if (!strcmp(argv[i], "--model") && i + 1 < argc)
            model = argv[++i];
        else if (!strcmp(argv[i], "--contexts") && i + 1 < argc)
            o.n_contexts = e2e_list(argv[++i], o.contexts, 8);
        else if (!strcmp(argv[i], "--batches") && i + 1 < argc)
            o.n_batches = e2e_list(argv[++i], o.batches, 8);
        else if (!strcmp(argv[i], "--steps") && i + 1 < argc)
            o.steps = strtoul(argv[++i], NULL, 10);
        else {
            fprintf(stderr, "usage: ri-bench-e2e [--json PATH] [--quick] [--synthetic] [--contexts 2048,4096,8000] "
                            "[--batches 1,4] [--steps N] [--kvstore ADDR] [--model PATH]\n");
            return 2;
        }
    }
    if (quick) {
        o.contexts[0] = 2048;
        o.n_contexts = 1;
        o.steps = CM_MIN(o.steps, (size_t)6);
    }
    for (size_t b = 0; b < o.n_batches; b++)
        if (o.batches[b] == 0 || o.batches[b] > 8)
            return 2;
    if (kvs == NULL) {
        if (e2e_daemon_start(&d, argv[0], "3GiB") != 0)
            return 1;
        kvs = d.grpc;
    }
    bn_report_t *rep = bn_report_create("e2e");
    if (rep == NULL)
        goto out;
    cJSON_AddStringToObject(bn_report_root(rep), "kvstore", kvs);
    if (!synthetic) {
        rc = e2e_model(rep, model, kvs, &o);
        if (rc == 3) {
            bn_report_skip(rep, "model", "not installed; ran --synthetic instead");
            synthetic = true;
        }
    }
    if (synthetic)
        rc = e2e_synthetic(rep, kvs, quick ? 2048 : 4096, quick ? 24 : 64);
    if (bn_report_finish(rep, json) != 0)
        rc = 1;
out:
    if (d.pid > 0 || d.dir[0])
        e2e_daemon_stop(&d);
    return rc;
}
