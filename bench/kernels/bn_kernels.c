/*
 * ri-bench-kernels: one decode step of one layer, Llama-3-8B geometry
 * (32 query heads, 8 KV heads, d = 128, fp16 K/V, head-major cache), batch 1,
 * on the synthetic K/V of docs/synthetic-kv.md, for N in {8K .. 1M}:
 * full attention, tripartite (RetroInfer), Quest and StreamingLLM at the same
 * exact-token budget, oracle top-B and random-B; time (median), bytes read,
 * GB/s next to the memory bandwidth measured in the same run, accuracy; and
 * the wave-index build throughput.  Prints a table; --json PATH writes
 * docs/bench-format.md's shape.
 *
 *   ri bench kernels [--quick] [--max-n N] [--only N[,N...]] [--steps S] [--rounds R]
 *                    [--fast-build-from N] [--cluster-tokens N] [--json PATH]     (--help lists them)
 *
 * Timing: R rounds (15 up to 128K, 5 above); each round runs every method
 * once and takes one bandwidth sample, in an order rotated by one per round;
 * every method gets R samples.  A GB/s figure above the bandwidth reference
 * by more than the reference's own spread (at least 5%) fails the bench.
 */
#define _GNU_SOURCE
#include <math.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "bench/common/bn_args.h"
#include "bench/common/bn_bw.h"
#include "bench/common/bn_report.h"
#include "common/cm_status.h"
#include "common/cm_runtime.h"
#include "common/cm_thread.h"
#include "common/cm_time.h"
#include "kernels/kn_baselines.h"
#include "kernels/kn_metrics.h"
#include "kernels/kn_ops.h"
#include "kernels/kn_synth.h"
#include "kernels/kn_wave.h"

#define NQ 32
#define NKV 8
#define D 128
#define G (NQ / NKV)

typedef struct bk_acc {
    double *rel, *cos, *dlse, *rec100, *recb, *mass;
    size_t n_q, n_kv;
} bk_acc_t;

static double mem_available_bytes(void)
{
    FILE *f = fopen("/proc/meminfo", "r");
    char line[256];
    double kb = 0;
    if (f == NULL)
        return 0;
    while (fgets(line, sizeof(line), f))
        if (sscanf(line, "MemAvailable: %lf kB", &kb) == 1)
            break;
    fclose(f);
    return kb * 1024.0;
}

static void *big_alloc(size_t bytes)
{
    void *p = mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED)
        return NULL;
    madvise(p, bytes, MADV_HUGEPAGE);  /* a 1M-token cache spans 1M pages otherwise */
    return p;
}

typedef ri_status_t (*bk_run_fn_t)(void *ctx, const float *q, float *out, float *lse);

/* Evict the caches before each timed call: in a real decode step the sparse
 * methods' few MB are not left in L3 by the previous call (other layers run
 * in between), and a new query picks other clusters.  The read runs on the
 * kernels' pool, as those other layers would: every thread of the timed call
 * then starts as it would in a decode step, just back from other work,
 * instead of asleep on a halted vCPU after idling through a read done by the
 * caller alone (that wake cost a 2.5 ms call up to 1 ms). */
#define BK_EVICT_WORDS ((size_t)(96u << 20) / 8)  /* 3x the 32 MB L3 */
#define BK_EVICT_PARTS 64
static _Atomic uint64_t bk_sink; /* keeps the reads */
static uint64_t *bk_evict_buf;

static void bk_evict_task(void *arg, size_t begin, size_t end, unsigned worker)
{
    size_t per = BK_EVICT_WORDS / BK_EVICT_PARTS;
    uint64_t s = 0;
    (void)arg;
    (void)worker;
    for (size_t i = begin * per; i < end * per; i += 8)
        s += bk_evict_buf[i];
    atomic_fetch_add_explicit(&bk_sink, s, memory_order_relaxed);
}

static void bk_evict(void)
{
    if (bk_evict_buf == NULL) {
        bk_evict_buf = malloc(BK_EVICT_WORDS * 8);
        if (bk_evict_buf == NULL)
            return;
        for (size_t i = 0; i < BK_EVICT_WORDS; i++)
            bk_evict_buf[i] = i;
    }
    cm_pool_parallel_for(kn_pool(), BK_EVICT_PARTS, 1, bk_evict_task, NULL);
}

/* Median seconds of reps calls. */
static double bk_time(bk_run_fn_t fn, void *ctx, const float *q, float *out, float *lse, int reps)
{
    double t[32];
    reps = reps > 32 ? 32 : reps;
    for (int r = 0; r < reps; r++) {
        double t0;
        bk_evict();
        t0 = cm_time_s();
        if (fn(ctx, q, out, lse) != RI_OK) {
            fprintf(stderr, "bench: run failed\n");
            return NAN;
        }
        t[r] = cm_time_s() - t0;
    }
    return bn_median(t, (size_t)reps);
}

#define BK_MAX_ROUNDS 64

typedef struct bk_ctx {
    kn_shape_t shape;
    kn_kv_view_t kv;
    kn_wave_t *wave;
    kn_quest_t *quest;
    uint32_t budget;
    kn_wave_stats_t wstats;
    uint64_t qbytes;
} bk_ctx_t;

static ri_status_t run_full(void *c, const float *q, float *o, float *l)
{
    bk_ctx_t *x = c;
    return kn_attn_decode(NULL, &x->shape, 1, q, &x->kv, o, l);
}
static ri_status_t run_wave(void *c, const float *q, float *o, float *l)
{
    bk_ctx_t *x = c;
    return kn_wave_decode(x->wave, q, &x->kv, o, l, &x->wstats);
}
static ri_status_t run_quest(void *c, const float *q, float *o, float *l)
{
    bk_ctx_t *x = c;
    return kn_quest_decode(NULL, x->quest, q, &x->kv, x->budget, o, l, &x->qbytes);
}
static ri_status_t run_oracle(void *c, const float *q, float *o, float *l)
{
    bk_ctx_t *x = c;
    return kn_oracle_decode(NULL, &x->shape, q, &x->kv, x->budget, o, l);
}
static ri_status_t run_stream(void *c, const float *q, float *o, float *l)
{
    bk_ctx_t *x = c;
    return kn_streaming_decode(NULL, &x->shape, q, &x->kv, 4, x->budget > 4 ? x->budget - 4 : 0, o, l);
}
static ri_status_t run_random(void *c, const float *q, float *o, float *l)
{
    bk_ctx_t *x = c;
    return kn_random_decode(NULL, &x->shape, q, &x->kv, x->budget, 7, o, l);
}

enum { M_FULL, M_WAVE, M_QUEST, M_ORACLE, M_STREAM, M_RANDOM, M_COUNT };
static const char *m_name[M_COUNT] = {"full", "retroinfer", "quest", "oracle", "streaming", "random"};
static bk_run_fn_t m_fn[M_COUNT] = {run_full, run_wave, run_quest, run_oracle, run_stream, run_random};

/* Exact-attended mask of method m for KV head h (NULL = not applicable). */
static ri_status_t bk_mask(int m, bk_ctx_t *x, const float *q, uint32_t h, const double *prob,
                           uint8_t *mask)
{
    size_t n = x->kv.n_tokens;
    uint32_t nr, ne;
    switch (m) {
    case M_FULL:
        memset(mask, 1, n);
        return RI_OK;
    case M_WAVE:
        kn_wave_budget(x->wave, &nr, &ne);
        return kn_wave_exact_mask(x->wave, q, &x->kv, h, nr, mask);
    case M_QUEST:
        return kn_quest_exact_mask(NULL, x->quest, q, &x->kv, h, x->budget, mask);
    case M_ORACLE:
        return kn_oracle_mask(prob, n, x->budget, mask);
    case M_STREAM:
        memset(mask, 0, n);
        memset(mask, 1, n < 4 ? n : 4);
        if (x->budget > 4 && n > 4) {
            size_t w = x->budget - 4 < n - 4 ? x->budget - 4 : n - 4;
            memset(mask + n - w, 1, w);
        }
        return RI_OK;
    default:
        return RI_ERR_UNSUPPORTED;  /* random: the set is internal; recall not reported */
    }
}

/* all: also the tail on the bad side (high for errors, low for recall/mass) */
static void put_summary(cJSON *row, const char *name, const double *v, size_t n, bool all)
{
    bool low_is_bad = strncmp(name, "recall", 6) == 0 || strcmp(name, "mass") == 0;
    kn_summary_t s;
    char key[64];
    kn_summarise(v, n, &s);
    snprintf(key, sizeof(key), "%s_median", name);
    cJSON_AddNumberToObject(row, key, s.median);
    if (!all)
        return;
    snprintf(key, sizeof(key), "%s_%s", name, low_is_bad ? "p10" : "p90");
    cJSON_AddNumberToObject(row, key, low_is_bad ? s.p10 : s.p90);
    snprintf(key, sizeof(key), "%s_%s", name, low_is_bad ? "p1" : "p99");
    cJSON_AddNumberToObject(row, key, low_is_bad ? s.p1 : s.p99);
    snprintf(key, sizeof(key), "%s_%s", name, low_is_bad ? "min" : "max");
    cJSON_AddNumberToObject(row, key, low_is_bad ? s.min : s.max);
}

/* Returns -1 on failure, else the number of figures above the bandwidth
 * reference by more than its noise. */
/* --cluster-tokens: the wave index's cluster size (0 = the auto size); set
 * once by main before any size runs. */
static uint32_t bk_cluster_tokens;

static int bench_size(bn_report_t *rep, size_t N, int steps, int rounds, int32_t neighbours,
                      bool compare_final, uint32_t iters)
{
    kn_synth_params_t sp;
    bk_ctx_t x = {.shape = {NQ, NKV, D, 0}};
    size_t kv_bytes = N * NKV * D * 2 * 2;
    cm_fp16_t *k, *v;
    float *q = malloc(sizeof(float) * NQ * D * (size_t)steps);
    float *ref = malloc(sizeof(float) * NQ * D * (size_t)steps), *out = malloc(sizeof(float) * NQ * D);
    float *ref_lse = malloc(sizeof(float) * NQ * (size_t)steps), lse[NQ];
    double *prob = malloc(sizeof(double) * N * NKV * (size_t)steps);
    uint8_t *mask = malloc(N);
    kn_wave_params_t wp;
    double bw_row, bw_max, bw_min, bw_noise, t_full = 0, t_build, med[M_COUNT], best[M_COUNT];
    int over = 0;
    const kn_index_t *ix;
    char label[64];

    snprintf(label, sizeof(label), "N=%zu", N);
    k = big_alloc(kv_bytes / 2);
    v = big_alloc(kv_bytes / 2);
    if (!k || !v || !q || !ref || !out || !ref_lse || !prob || !mask) {
        bn_report_skip(rep, label, "allocation failed");
        return -1;
    }
    kn_synth_params_default(&sp);
    sp.n_tokens = N;
    sp.seed = 20260;
    if (kn_synth_kv(&sp, k, v, D, N * D) != RI_OK)
        return -1;
    x.kv = (kn_kv_view_t){k, v, N, D, N * D};
    for (int s = 0; s < steps; s++)
        kn_synth_query(&sp, (uint64_t)s, q + (size_t)s * NQ * D);

    /* exact reference outputs (cpu full attention, checked by the tests against ref) and true probs */
    for (int s = 0; s < steps; s++) {
        kn_attn_decode(NULL, &x.shape, 1, q + (size_t)s * NQ * D, &x.kv, ref + (size_t)s * NQ * D,
                       ref_lse + (size_t)s * NQ);
        for (uint32_t h = 0; h < NKV; h++) {
            kn_shape_t grp = {G, 1, D, 0};
            kn_true_probs(&grp, q + (size_t)s * NQ * D + (size_t)h * G * D, k + h * N * D, D, N,
                          prob + ((size_t)s * NKV + h) * N);
        }
    }

    /* index build */
    kn_wave_params_default(&wp);
    wp.build.final_neighbours = neighbours;
    wp.build.iters = iters;
    wp.tokens_per_cluster = bk_cluster_tokens;
    if (kn_wave_create(&x.shape, &wp, &x.wave) != RI_OK)
        return -1;
    t_build = cm_time_s();
    if (kn_wave_build(x.wave, &x.kv) != RI_OK) {
        bn_report_skip(rep, label, "index build failed");
        return -1;
    }
    t_build = cm_time_s() - t_build;
    ix = kn_wave_index(x.wave, 0);
    {
        cJSON *row = bn_report_row(rep);
        double tps = (double)ix->n_tokens * NKV / t_build;
        cJSON_AddStringToObject(row, "op", "index_build");
        cJSON_AddNumberToObject(row, "n_tokens", (double)N);
        cJSON_AddNumberToObject(row, "head_dim", D);
        cJSON_AddNumberToObject(row, "tokens_per_s", tps);
        cJSON_AddNumberToObject(row, "seconds", t_build);
        cJSON_AddNumberToObject(row, "kv_heads", NKV);
        cJSON_AddNumberToObject(row, "clusters_per_head", ix->n_clusters);
        cJSON_AddNumberToObject(row, "tokens_per_cluster", kn_wave_cluster_tokens(&wp, ix->n_tokens));
        cJSON_AddNumberToObject(row, "threads", cm_pool_size(kn_pool()));
        cJSON_AddStringToObject(row, "final_pass", neighbours < 0 ? "global" : "neighbours");
        if (neighbours >= 0)
            cJSON_AddNumberToObject(row, "final_neighbours", neighbours);
        cJSON_AddNumberToObject(row, "kmeans_iters", iters);
        printf("%-12s N=%-8zu %8.2f s  %10.0f tokens/s per KV head (x%d heads, %u clusters/head, final=%s)\n",
               "index_build", N, t_build, tps / NKV * NKV, NKV, ix->n_clusters,
               neighbours < 0 ? "global" : "neighbours");
    }
    kn_quest_create(&x.shape, 16, &x.quest);
    kn_quest_update(x.quest, &x.kv);

    /* every method and the bandwidth reference timed in the same rounds:
     * each round runs each of them once, in an order rotated by one per
     * round, so that load from other processes and the position in the
     * round hit all alike; every method gets the same number of samples */
    kn_wave_decode(x.wave, q, &x.kv, out, lse, &x.wstats);
    x.budget = (uint32_t)(x.wstats.exact_tokens / NKV);
    {
        double tm[M_COUNT][BK_MAX_ROUNDS], bw[BK_MAX_ROUNDS];
        for (int r = 0; r < rounds; r++)
            for (int slot = 0; slot <= M_COUNT; slot++) {
                int m = (slot + r) % (M_COUNT + 1);
                if (m == M_COUNT) {
                    bw[r] = bn_bw_sample(kn_pool());
                    continue;
                }
                /* vary the query: each step ranks other clusters */
                const float *qj = q + (size_t)(r % steps) * NQ * D;
                tm[m][r] = bk_time(m_fn[m], &x, qj, out, lse, 1);
            }
        for (int m = 0; m < M_COUNT; m++) {
            med[m] = bn_median(tm[m], (size_t)rounds);
            best[m] = bn_percentile(tm[m], (size_t)rounds, 0);
        }
        bn_bw_ref_t bref;
        bn_bw_summarise(bw, (size_t)rounds, &bref);
        bw_row = bref.median;
        bw_max = bref.max;
        bw_min = bref.min;
        bw_noise = bref.noise;
        printf("bandwidth reference N=%zu: median %.2f GB/s (min %.2f, max %.2f) over %d samples, "
               "interleaved with the decodes; a figure above %.2f GB/s fails the bench\n",
               N, bw_row, bw_min, bw_max, rounds, bw_row * (1 + bw_noise));
    }
    t_full = med[M_FULL];
    for (int m = 0; m < M_COUNT; m++) {
        double secs, *rel, *cs, *dl, *r100, *rb, *ms;
        size_t nq = 0, nk = 0;
        uint64_t bytes;
        cJSON *row;
        secs = med[m];
        m_fn[m](&x, q, out, lse);  /* refresh the byte counters for step 0 */
        switch (m) {
        case M_FULL: bytes = kv_bytes; break;
        case M_WAVE: bytes = x.wstats.bytes_read; break;
        case M_QUEST: bytes = x.qbytes; break;
        case M_ORACLE: bytes = kv_bytes / 2 + (uint64_t)x.budget * NKV * D * 4; break;
        default: bytes = (uint64_t)x.budget * NKV * D * 4; break;
        }
        rel = malloc(sizeof(double) * NQ * steps);
        cs = malloc(sizeof(double) * NQ * steps);
        dl = malloc(sizeof(double) * NQ * steps);
        r100 = malloc(sizeof(double) * NKV * steps);
        rb = malloc(sizeof(double) * NKV * steps);
        ms = malloc(sizeof(double) * NKV * steps);
        for (int s = 0; s < steps; s++) {
            const float *qs = q + (size_t)s * NQ * D;
            m_fn[m](&x, qs, out, lse);
            for (uint32_t h = 0; h < NQ; h++) {
                const float *r = ref + (size_t)s * NQ * D + (size_t)h * D;
                rel[nq] = kn_metric_rel_l2(out + (size_t)h * D, r, D);
                cs[nq] = kn_metric_cosine(out + (size_t)h * D, r, D);
                dl[nq++] = fabs((double)lse[h] - ref_lse[(size_t)s * NQ + h]);
            }
            for (uint32_t h = 0; h < NKV; h++) {
                const double *pr = prob + ((size_t)s * NKV + h) * N;
                if (bk_mask(m, &x, qs, h, pr, mask) != RI_OK)
                    continue;
                r100[nk] = kn_metric_recall(pr, N, mask, 100);
                rb[nk] = kn_metric_recall(pr, N, mask, m == M_FULL ? N : x.budget);
                ms[nk++] = kn_metric_mass(pr, N, mask);
            }
        }
        row = bn_report_row(rep);
        cJSON_AddStringToObject(row, "op", "decode");
        cJSON_AddStringToObject(row, "method", m_name[m]);
        if (m == M_WAVE)
            cJSON_AddNumberToObject(row, "tokens_per_cluster", kn_wave_cluster_tokens(&wp, ix->n_tokens));
        cJSON_AddNumberToObject(row, "n_tokens", (double)N);
        cJSON_AddNumberToObject(row, "budget_tokens", m == M_FULL ? (double)N : (double)x.budget);
        cJSON_AddNumberToObject(row, "seconds", secs);
        cJSON_AddNumberToObject(row, "bytes_read", (double)bytes);
        cJSON_AddNumberToObject(row, "gbs", bytes / secs / 1e9);
        cJSON_AddNumberToObject(row, "mem_bw_gbs_here", bw_row);
        cJSON_AddNumberToObject(row, "mem_bw_gbs_here_min", bw_min);
        cJSON_AddNumberToObject(row, "mem_bw_gbs_here_max", bw_max);
        cJSON_AddNumberToObject(row, "mem_bw_noise", bw_noise);
        cJSON_AddNumberToObject(row, "bw_fraction", bytes / secs / 1e9 / bw_row);
        cJSON_AddNumberToObject(row, "samples", rounds);
        if (bytes / secs / 1e9 > bw_row * (1 + bw_noise)) {
            /* a figure above the ceiling measured beside it: the bytes are
             * miscounted, or the data came from a cache, not from memory */
            cJSON_AddBoolToObject(row, "exceeds_bandwidth", 1);
            fprintf(stderr, "BENCH FAILED: %s at N=%zu reads %.2f GB/s, above the bandwidth "
                    "reference %.2f GB/s + %.0f%% noise measured in the same rounds\n",
                    m_name[m], N, bytes / secs / 1e9, bw_row, 100 * bw_noise);
            over++;
        }
        cJSON_AddNumberToObject(row, "speedup_vs_full", t_full / secs);
        /* under load from other processes the minimum is the steadier figure */
        cJSON_AddNumberToObject(row, "seconds_min", best[m]);
        cJSON_AddNumberToObject(row, "gbs_min_time", bytes / best[m] / 1e9);
        cJSON_AddNumberToObject(row, "speedup_vs_full_min", best[M_FULL] / best[m]);
        cJSON_AddNumberToObject(row, "accuracy_steps", steps);
        cJSON_AddStringToObject(row, "kv_layout", "head-major");
        if (m == M_WAVE) {
            cJSON_AddStringToObject(row, "final_pass", neighbours < 0 ? "global" : "neighbours");
            cJSON_AddNumberToObject(row, "final_neighbours", neighbours);
            cJSON_AddNumberToObject(row, "kmeans_iters", iters);
        }
        put_summary(row, "rel_err", rel, nq, true);
        put_summary(row, "cosine", cs, nq, false);
        put_summary(row, "dlse", dl, nq, true);
        if (nk) {
            put_summary(row, "recall100", r100, nk, true);
            put_summary(row, "recall_budget", rb, nk, false);
            put_summary(row, "mass", ms, nk, true);
        }
        {
            kn_summary_t a, b;
            kn_summarise(rel, nq, &a);
            kn_summarise(r100, nk, &b);
            printf("%-10s N=%-7zu B=%-6u %8.3f ms (min %8.3f) %6.2f GB/s (%3.0f%% of %5.2f) x%-5.2f (min x%-5.2f) rel_err %.4f recall100 %s (%d samples)\n",
                   m_name[m], N, m == M_FULL ? (unsigned)N : x.budget, secs * 1e3, best[m] * 1e3,
                   bytes / secs / 1e9, 100.0 * bytes / secs / 1e9 / bw_row, bw_row, t_full / secs,
                   best[M_FULL] / best[m], a.median,
                   nk ? (snprintf(label, sizeof(label), "%.3f", b.median), label) : "-", rounds);
        }
        free(rel);
        free(cs);
        free(dl);
        free(r100);
        free(rb);
        free(ms);
    }

    /* the question: what the neighbour-restricted final pass costs in recall */
    if (compare_final) {
        kn_wave_t *w2;
        double rg[NKV * 8], rn[NKV * 8];
        size_t n = 0;
        uint32_t nr, ne;
        double tb;
        wp.build.final_neighbours = 1;
        kn_wave_create(&x.shape, &wp, &w2);
        tb = cm_time_s();
        kn_wave_build(w2, &x.kv);
        tb = cm_time_s() - tb;
        kn_wave_budget(x.wave, &nr, &ne);
        for (int s = 0; s < steps && s < 8; s++)
            for (uint32_t h = 0; h < NKV; h++) {
                const double *pr = prob + ((size_t)s * NKV + h) * N;
                const float *qs = q + (size_t)s * NQ * D;
                kn_wave_exact_mask(x.wave, qs, &x.kv, h, nr, mask);
                rg[n] = kn_metric_recall(pr, N, mask, 100);
                kn_wave_exact_mask(w2, qs, &x.kv, h, nr, mask);
                rn[n++] = kn_metric_recall(pr, N, mask, 100);
            }
        cJSON *row = bn_report_row(rep);
        cJSON_AddStringToObject(row, "op", "index_build");
        cJSON_AddNumberToObject(row, "n_tokens", (double)N);
        cJSON_AddNumberToObject(row, "head_dim", D);
        cJSON_AddNumberToObject(row, "tokens_per_s", (double)kn_wave_index(w2, 0)->n_tokens * NKV / tb);
        cJSON_AddNumberToObject(row, "seconds", tb);
        cJSON_AddStringToObject(row, "final_pass", "neighbours");
        cJSON_AddNumberToObject(row, "final_neighbours", 1);
        cJSON_AddNumberToObject(row, "tokens_per_cluster", kn_wave_cluster_tokens(&wp, kn_wave_index(w2, 0)->n_tokens));
        cJSON_AddNumberToObject(row, "recall100_median", bn_median(rn, n));
        cJSON_AddNumberToObject(row, "recall100_median_global", bn_median(rg, n));
        printf("%-12s N=%-8zu %8.2f s  final=neighbours(+-1): recall100 median %.3f vs global %.3f\n",
               "index_build", N, tb, bn_median(rn, n), bn_median(rg, n));
        kn_wave_destroy(w2);
    }
    kn_wave_destroy(x.wave);
    kn_quest_destroy(x.quest);
    munmap(k, kv_bytes / 2);
    munmap(v, kv_bytes / 2);
    free(q);
    free(ref);
    free(out);
    free(ref_lse);
    free(prob);
    free(mask);
    return over;
}

typedef struct bk_opts {
    char *json;
    bool quick;        /* N <= 32768 only */
    int64_t max_n;
    char *only;        /* comma list of sizes */
    int64_t steps;     /* 0 = by size */
    int64_t rounds;    /* 0 = by size */
    int64_t fast_from; /* 0 = never */
    int64_t cluster_tokens; /* 0 = the auto size */
    cm_runtime_t rt;   /* log level, threads, kernel backend (cm_runtime.h) */
} bk_opts_t;

static const cm_config_item_t bk_items[] = {
    BN_ARG_JSON(bk_opts_t, json),
    CM_RUNTIME_LOG_ITEM(bk_opts_t, rt),
    CM_RUNTIME_KERNEL_ITEMS(bk_opts_t, rt),
    BN_ARG(bk_opts_t, "quick", CM_CFG_BOOL, "false", "sizes up to 32768 only", quick, 0, 0),
    BN_ARG(bk_opts_t, "max-n", CM_CFG_INT, "1048576", "largest context size N", max_n, 1, 1 << 30),
    BN_ARG(bk_opts_t, "only", CM_CFG_STRING, NULL, "run only these sizes (comma list: N[,N...]; one JSON for all)",
           only, 0, 0),
    BN_ARG(bk_opts_t, "steps", CM_CFG_INT, "0",
           "decode steps per method and round (0 = 8 up to 32K, 4 up to 128K, 1 above)", steps, 0, 1 << 20),
    BN_ARG(bk_opts_t, "rounds", CM_CFG_INT, "0", "timing rounds (0 = 15 up to 128K, 5 above)", rounds, 0,
           BK_MAX_ROUNDS),
    BN_ARG(bk_opts_t, "fast-build-from", CM_CFG_INT, "0",
           "from this N on, build the wave index fast (2 k-means iterations, own-segment pass; 0 = never)", fast_from,
           0, 1 << 30),
    BN_ARG(bk_opts_t, "cluster-tokens", CM_CFG_INT, "0", "tokens per cluster of the wave index (0 = the auto size)",
           cluster_tokens, 0, 1024),
};
static const cm_config_table_t bk_table = {"ri bench kernels", "RI_BENCH_KERNELS_", bk_items,
                                           CM_ARRAY_LEN(bk_items), 0, NULL};

static int bk_main(const void *arg, const char *argv0)
{
    const bk_opts_t *o = arg;
    int over = 0, st_size, rc;
    static const size_t sizes[] = {8192, 32768, 131072, 524288, 1048576};
    double only[8];
    size_t n_only = 0;
    bn_report_t *rep;

    (void)argv0;
    char rt_err[256];
    if (cm_runtime_apply(&o->rt, rt_err, sizeof(rt_err)) != RI_OK ||
        kn_runtime_apply(&o->rt, rt_err, sizeof(rt_err)) != RI_OK) {
        fprintf(stderr, "ri bench kernels: %s\n", rt_err);
        return 2;
    }
    if (o->only != NULL && o->only[0] != '\0' && (n_only = bn_args_list(o->only, only, CM_ARRAY_LEN(only))) == 0) {
        fprintf(stderr, "ri bench kernels: --only wants up to %zu sizes, N[,N...]\n", CM_ARRAY_LEN(only));
        return 2;
    }
    bool quick = o->quick;
    size_t max_n = (size_t)o->max_n, fast_from = (size_t)o->fast_from;
    int steps = (int)o->steps, rounds = (int)o->rounds;
    bk_cluster_tokens = (uint32_t)o->cluster_tokens;
    if (quick && max_n > 32768)
        max_n = 32768;
    rep = bn_report_create("kernels");
    if (rep == NULL)
        return 1;
    printf("kernels: backend %s (%s), %u threads, memory read bandwidth %.2f GB/s\n",
           kn_ops_default()->name, kn_cpu_isa(), cm_pool_size(kn_pool()), bn_report_mem_bw_gbs(rep));
    cJSON_AddStringToObject(bn_report_root(rep), "backend", kn_ops_default()->name);
    cJSON_AddStringToObject(bn_report_root(rep), "isa", kn_cpu_isa());
    cJSON_AddStringToObject(bn_report_root(rep), "geometry", "llama-3-8b: 32 q heads, 8 kv heads, d=128, fp16");
    for (size_t i = 0; i < sizeof(sizes) / sizeof(sizes[0]); i++) {
        size_t N = sizes[i], need = N * NKV * D * 2 * 2;
        char label[64], why[160];
        int st = steps ? steps : (N <= 32768 ? 8 : (N <= 131072 ? 4 : 1));
        snprintf(label, sizeof(label), "N=%zu", N);
        bool listed = n_only == 0;
        for (size_t j = 0; j < n_only; j++)
            listed |= (size_t)only[j] == N;
        if (!listed)
            continue;
        if (N > max_n) {
            bn_report_skip(rep, label, quick ? "--quick runs N <= 32768" : "above --max-n");
            continue;
        }
        /* K/V, the wave index's cluster-major copy, per-step probabilities, slack */
        if (mem_available_bytes() < 2.3 * need + (double)N * NKV * 8 * st + (1u << 30)) {
            snprintf(why, sizeof(why), "needs ~%.1f GiB free memory, %.1f GiB available",
                     (2.3 * need + (double)N * NKV * 8 * st + (1u << 30)) / (1u << 30),
                     mem_available_bytes() / (1u << 30));
            bn_report_skip(rep, label, why);
            printf("skip %s: %s\n", label, why);
            continue;
        }
        /* global final pass up to 128K; beyond, own segment +-1 (the global
         * pass is O(N^2 d): ~2 h per layer at 1M on 2 cores) */
        /* --fast-build-from N: from that size on, 2 k-means iterations and the
         * own-segment final pass (decode timing does not depend on the index
         * quality; the rows say which build their accuracy comes from) */
        int rd = rounds ? rounds : (N <= 131072 ? 15 : 5);
        if (fast_from && N >= fast_from)
            st_size = bench_size(rep, N, st, rd, 0, false, 2);
        else
            st_size = bench_size(rep, N, st, rd, N <= 131072 ? -1 : 1, N == 131072 && !quick, 9);
        if (st_size < 0)
            over = -1;
        else if (over >= 0)
            over += st_size;
        fflush(stdout);
    }
    rc = bn_report_finish(rep, o->json);
    if (rc != 0)
        return 1;
    if (over != 0)
        fprintf(stderr, "BENCH FAILED: %s\n", over < 0 ? "a size failed to run"
                                                        : "figures above the measured bandwidth (see above)");
    return over != 0 ? 1 : 0;
}

int main(int argc, char **argv)
{
    bk_opts_t o;
    return bn_args_main(&bk_table, &o, argc, argv, bk_main);
}
