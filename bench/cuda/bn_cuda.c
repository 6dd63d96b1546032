/*
 * ri-bench-cuda: the CUDA backend's decode step on the device, with the K/V
 * resident in device memory (HBM), next to the device's own HBM bandwidth.
 * Llama-3-8B geometry (32 query heads, 8 KV heads, d = 128, fp16,
 * head-major), batch 1, the synthetic K/V of docs/synthetic-kv.md (seed
 * 20260), for N in {131072, 1048576}:
 *
 *   full        kn_attn_decode of the cuda table over the device cache
 *   tripartite  kn_cuda_wave_step: every KV head in one device step (rank,
 *               selection, estimation, exact attention over the sinks, the
 *               steady window and the retrieved clusters of a device
 *               cluster-major copy, merge), one copy in, one wait
 *   tripartite_perhead  the same step driven from the host per KV head
 *               (heads on the pool, one CUDA stream per thread):
 *               kn_cuda_rank_estimate, kn_cuda_attn_pages_device, merge of
 *               the two tiny parts on the host: what the launches, copies
 *               and waits of a host-driven step cost
 *   quest       per KV head: cuda quest_score over device page bounds (16
 *               tokens), top-B pages chosen on the host (quickselect), then
 *               kn_cuda_attn_pages_device; the same exact-token budget as
 *               tripartite
 *
 * The index is built on the device (cuda index_build through kn_index_build,
 * which adds the int8 means; global final pass up to 128K, own segment +- 1
 * above, as ri-bench-kernels).  Each timed call
 * follows an L2 flush and uses another step's query; every method runs once
 * per round in an order rotated by one per round; `seconds` is the median
 * wall time of the call (host planning included), `seconds_min` the minimum.
 * Accuracy: rel L2 of each method's output against the device's full
 * attention, per query head over the steps.  Then --wave-n (32768; 0 skips)
 * runs the wave object (kn_wave) with the cuda table on host K/V (the ops
 * stage their spans, so its time is not a device figure) and compares its
 * output with full attention and with the cpu table's wave.
 *
 *   ri-bench-cuda [--only N] [--max-n N] [--steps S] [--rounds R]
 *                 [--wave-n N] [--json PATH]     (--help lists them)
 *
 * Exits 77 without a CUDA device.
 */
#define _GNU_SOURCE
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bench/common/bn_args.h"
#include "bench/common/bn_report.h"
#include "bench/cuda/bn_cuda_dev.h"
#include "common/cm_runtime.h"
#include "common/cm_thread.h"
#include "common/cm_time.h"
#include "kernels/cuda/kn_cuda.h"
#include "kernels/kn_metrics.h"
#include "kernels/kn_ops.h"
#include "kernels/kn_synth.h"
#include "kernels/kn_wave.h"

#define NQ 32
#define NKV 8
#define D 128
#define G (NQ / NKV)
#define QPAGE 16
#define MAX_ROUNDS 64

/* Device-resident state of one KV head. */
typedef struct bc_head {
    kn_index_t dev;        /* centroids, cscale, sizes, vq, vscale in device memory; n_clusters */
    kn_index_t host;       /* the built index (host) */
    cm_fp16_t *ck, *cv;    /* device cluster-major K/V of the indexed tokens */
    cm_fp16_t *kmin, *kmax;/* device Quest page bounds [n_qpages][D] */
    uint32_t *offsets;     /* device copy of the index's cluster offsets */
} bc_head_t;

typedef struct bc_ctx {
    size_t N;
    kn_shape_t shape;
    cm_fp16_t *dk, *dv;    /* device cache [NKV][N][D] */
    kn_kv_view_t kv;       /* its view */
    bc_head_t head[NKV];
    kn_wave_head_t step[NKV]; /* the heads as the cuda wave_step op takes them */
    bool want_bytes;       /* the step also reports its ids (untimed passes) */
    uint32_t sink, idx0, idx1, n_r, n_e, n_qpages, quest_pages;
    const float *q;        /* this call's query [NQ][D] (host) */
    float *out, *lse;      /* [NQ][D], [NQ] (host) */
    uint64_t bytes[NKV];   /* bytes the last call read, per head */
    ri_status_t st[NKV];   /* per head */
} bc_ctx_t;

enum { M_FULL, M_STEP, M_WAVE, M_QUEST, M_COUNT };
static const char *m_name[M_COUNT] = {"full", "tripartite", "tripartite_perhead", "quest"};

static ri_status_t bc_full(bc_ctx_t *x)
{
    return kn_ops_cuda()->attn_decode(&x->shape, 1, x->q, &x->kv, x->out, x->lse);
}

/* Bytes a tripartite step reads for one head: tok exact rows of K and V,
 * every int8 centroid, its scale and size, and the int8 means and scales of ne estimated
 * clusters. */
static uint64_t bc_step_bytes(const bc_head_t *hd, uint64_t tok, uint32_t ne)
{
    return tok * D * 4 + (uint64_t)hd->dev.n_clusters * (D + 8) + (uint64_t)ne * (D + 4);
}

/* The device step for every head; with want_bytes, the bytes it read from
 * its ids (sinks, window and retrieved rows, centroids and sizes, the
 * estimation's int8 means and scales). */
static ri_status_t bc_step(bc_ctx_t *x)
{
    uint32_t per = x->n_r + x->n_e, cnt[2 * NKV], *ids = NULL;
    ri_status_t st;
    if (!x->want_bytes)
        return kn_ops_cuda()->wave_step(&x->shape, x->q, x->step, x->n_r, x->n_e, x->out, x->lse, NULL, NULL);
    ids = malloc(((size_t)NKV * per + 1) * sizeof(uint32_t));
    if (ids == NULL)
        return RI_ERR_NOMEM;
    st = kn_ops_cuda()->wave_step(&x->shape, x->q, x->step, x->n_r, x->n_e, x->out, x->lse, ids, cnt);
    for (int h = 0; h < NKV && st == RI_OK; h++) {
        const bc_head_t *hd = &x->head[h];
        uint64_t tok = x->sink + (x->N - x->idx1);
        for (uint32_t i = 0; i < cnt[2 * h]; i++)
            tok += hd->host.sizes[ids[(size_t)h * per + i]];
        x->bytes[h] = bc_step_bytes(hd, tok, cnt[2 * h + 1]);
    }
    free(ids);
    return st;
}

/* One KV head of a tripartite step driven from the host. */
static void bc_wave_task(void *arg, size_t begin, size_t end, unsigned worker)
{
    bc_ctx_t *x = arg;
    kn_shape_t grp = {G, 1, D, 0};
    for (size_t h = begin; h < end; h++) {
        bc_head_t *hd = &x->head[h];
        uint32_t *ids = malloc(((size_t)x->n_r + x->n_e + 1) * sizeof(uint32_t)), nr = 0, ne = 0;
        kn_page_t *pages = malloc(((size_t)x->n_r + 2) * sizeof(kn_page_t));
        float o_e[G * D], l_e[G], o_x[G * D], l_x[G];
        const float *op[2] = {o_x, o_e}, *lp[2] = {l_x, l_e};
        const float *qh = x->q + h * G * D;
        const cm_fp16_t *kh = x->dk + h * x->N * D, *vh = x->dv + h * x->N * D;
        uint64_t tok = 0;
        ri_status_t st = ids && pages ? RI_OK : RI_ERR_NOMEM;
        if (st == RI_OK)
            st = kn_cuda_rank_estimate(&grp, qh, &hd->dev, x->n_r, x->n_e, ids, &nr, &ne, o_e, l_e);
        if (st == RI_OK) {
            size_t np = 0;
            pages[np++] = (kn_page_t){kh, vh, x->sink, D};
            pages[np++] = (kn_page_t){kh + (size_t)x->idx1 * D, vh + (size_t)x->idx1 * D,
                                      (uint32_t)(x->N - x->idx1), D};
            for (uint32_t i = 0; i < nr; i++) {
                uint32_t j = ids[i], off = hd->host.offsets[j];
                pages[np++] = (kn_page_t){hd->ck + (size_t)off * D, hd->cv + (size_t)off * D,
                                          hd->host.sizes[j], D};
            }
            for (size_t p = 0; p < np; p++)
                tok += pages[p].n_tokens;
            st = kn_cuda_attn_pages_device(&grp, qh, pages, np, o_x, l_x);
        }
        if (st == RI_OK)
            st = kn_ops_cpu()->merge(G, D, 2, op, lp, x->out + h * G * D, x->lse + h * G);
        x->bytes[h] = bc_step_bytes(hd, tok, ne);
        x->st[h] = st;
        free(ids);
        free(pages);
    }
}

/* The best k of n scores (ties: lower page first) into sel; returns the count. */
static size_t bc_top_pages(const float *score, size_t n, size_t k, float *tmp, uint32_t *sel)
{
    float thr;
    size_t w = 0;
    if (k >= n) {
        for (size_t i = 0; i < n; i++)
            sel[i] = (uint32_t)i;
        return n;
    }
    if (k == 0)
        return 0;
    memcpy(tmp, score, n * sizeof(float));
    thr = kn_kth_largest(tmp, n, k);
    for (size_t i = 0; i < n && w < k; i++)
        if (score[i] > thr)
            sel[w++] = (uint32_t)i;
    for (size_t i = 0; i < n && w < k; i++)
        if (score[i] == thr)
            sel[w++] = (uint32_t)i;
    return w;
}

static void bc_quest_task(void *arg, size_t begin, size_t end, unsigned worker)
{
    bc_ctx_t *x = arg;
    kn_shape_t grp = {G, 1, D, 0};
    for (size_t h = begin; h < end; h++) {
        bc_head_t *hd = &x->head[h];
        size_t np = x->n_qpages;
        float *score = malloc(2 * np * sizeof(float));
        uint32_t *sel = malloc(np * sizeof(uint32_t));
        kn_page_t *pages = malloc(((size_t)x->quest_pages + 1) * sizeof(kn_page_t));
        const cm_fp16_t *kh = x->dk + h * x->N * D, *vh = x->dv + h * x->N * D;
        const float *qh = x->q + h * G * D;
        size_t n_sel = 0;
        ri_status_t st = score && sel && pages ? RI_OK : RI_ERR_NOMEM;
        if (st == RI_OK)
            st = kn_ops_cuda()->quest_score(&grp, qh, hd->kmin, hd->kmax, np, score);
        if (st == RI_OK) {
            n_sel = bc_top_pages(score, np, x->quest_pages, score + np, sel);
            for (size_t i = 0; i < n_sel; i++)
                pages[i] = (kn_page_t){kh + (size_t)sel[i] * QPAGE * D, vh + (size_t)sel[i] * QPAGE * D,
                                       QPAGE, D};
            st = kn_cuda_attn_pages_device(&grp, qh, pages, n_sel, x->out + h * G * D, x->lse + h * G);
        }
        x->bytes[h] = (uint64_t)np * D * 4 + (uint64_t)n_sel * QPAGE * D * 4;
        x->st[h] = st;
        free(score);
        free(sel);
        free(pages);
    }
}

static ri_status_t bc_run(int m, bc_ctx_t *x)
{
    memset(x->bytes, 0, sizeof(x->bytes));
    if (m == M_FULL) {
        x->bytes[0] = (uint64_t)x->N * NKV * D * 4;
        return bc_full(x);
    }
    if (m == M_STEP)
        return bc_step(x);
    cm_pool_parallel_for(cm_pool_default(), NKV, 1, m == M_WAVE ? bc_wave_task : bc_quest_task, x);
    for (int h = 0; h < NKV; h++)
        if (x->st[h] != RI_OK)
            return x->st[h];
    return RI_OK;
}

/* Device copies of the built index of head h, its cluster-major K/V and
 * its Quest page bounds (from the host K/V hk/hv of that head). */
static int bc_head_upload(bc_head_t *hd, const cm_fp16_t *hk, const cm_fp16_t *hv, size_t N)
{
    const kn_index_t *ix = &hd->host;
    size_t C = ix->n_clusters, n = ix->n_tokens, nqp = N / QPAGE;
    cm_fp16_t *ck = malloc((n + 1) * D * sizeof(cm_fp16_t)), *cv = malloc((n + 1) * D * sizeof(cm_fp16_t));
    cm_fp16_t *mn = malloc((nqp + 1) * D * sizeof(cm_fp16_t)), *mx = malloc((nqp + 1) * D * sizeof(cm_fp16_t));
    int rc = -1;
    if (!ck || !cv || !mn || !mx)
        goto out;
    for (size_t p = 0; p < n; p++) {
        memcpy(ck + p * D, hk + (size_t)ix->perm[p] * D, D * sizeof(cm_fp16_t));
        memcpy(cv + p * D, hv + (size_t)ix->perm[p] * D, D * sizeof(cm_fp16_t));
    }
    for (size_t pg = 0; pg < nqp; pg++)
        for (uint32_t i = 0; i < D; i++) {
            float lo = INFINITY, hi = -INFINITY;
            for (uint32_t t = 0; t < QPAGE; t++) {
                float v = cm_fp16_to_f32(hk[(pg * QPAGE + t) * D + i]);
                lo = fminf(lo, v);
                hi = fmaxf(hi, v);
            }
            mn[pg * D + i] = cm_f32_to_fp16(lo);
            mx[pg * D + i] = cm_f32_to_fp16(hi);
        }
    kn_index_init(&hd->dev, D);
    hd->dev.n_clusters = (uint32_t)C;
    hd->dev.n_tokens = (uint32_t)n;
    /* a built index has no fp32 sums (the estimate reads the int8 means) */
    if (bn_cu_alloc((void **)&hd->dev.centroids, C * D) || bn_cu_alloc((void **)&hd->dev.cscale, C * 4) ||
        bn_cu_alloc((void **)&hd->dev.vq, C * D) ||
        bn_cu_alloc((void **)&hd->dev.vscale, C * 4) || bn_cu_alloc((void **)&hd->dev.sizes, C * 4) ||
        bn_cu_alloc((void **)&hd->ck, n * D * 2) || bn_cu_alloc((void **)&hd->cv, n * D * 2) ||
        bn_cu_alloc((void **)&hd->kmin, nqp * D * 2) || bn_cu_alloc((void **)&hd->kmax, nqp * D * 2) ||
        bn_cu_alloc((void **)&hd->offsets, C * 4 + 4))
        goto out;
    if (bn_cu_upload(hd->dev.centroids, ix->centroids, C * D) || bn_cu_upload(hd->dev.cscale, ix->cscale, C * 4) ||
        bn_cu_upload(hd->dev.vq, ix->vq, C * D) ||
        bn_cu_upload(hd->dev.vscale, ix->vscale, C * 4) || bn_cu_upload(hd->dev.sizes, ix->sizes, C * 4) ||
        bn_cu_upload(hd->ck, ck, n * D * 2) || bn_cu_upload(hd->cv, cv, n * D * 2) ||
        bn_cu_upload(hd->kmin, mn, nqp * D * 2) || bn_cu_upload(hd->kmax, mx, nqp * D * 2) ||
        bn_cu_upload(hd->offsets, ix->offsets, C * 4))
        goto out;
    rc = 0;
out:
    free(ck);
    free(cv);
    free(mn);
    free(mx);
    return rc;
}

static void bc_head_free(bc_head_t *hd)
{
    bn_cu_free(hd->dev.centroids);
    bn_cu_free(hd->dev.cscale);
    bn_cu_free(hd->dev.vq);
    bn_cu_free(hd->dev.vscale);
    bn_cu_free(hd->dev.sizes);
    bn_cu_free(hd->ck);
    bn_cu_free(hd->cv);
    bn_cu_free(hd->kmin);
    bn_cu_free(hd->kmax);
    bn_cu_free(hd->offsets);
    kn_index_cleanup(&hd->host);
}

/* One size: returns 0, or -1 when it could not run. */
static int bench_size(bn_report_t *rep, size_t N, int steps, int rounds, double hbm_read)
{
    kn_synth_params_t sp;
    kn_wave_params_t wp;
    kn_build_params_t bp;
    bc_ctx_t x = {.N = N, .shape = {NQ, NKV, D, 0}, .sink = 4};
    size_t elems = N * NKV * D;
    cm_fp16_t *hk = malloc(elems * sizeof(cm_fp16_t)), *hv = malloc(elems * sizeof(cm_fp16_t));
    float *q = malloc(sizeof(float) * NQ * D * (size_t)steps);
    float *ref = malloc(sizeof(float) * NQ * D * (size_t)steps), *out = malloc(sizeof(float) * NQ * D);
    float lse[NQ];
    double tm[M_COUNT][MAX_ROUNDS], t_build, *rel = malloc(sizeof(double) * NQ * (size_t)steps);
    uint32_t S, C, nr0 = 0, ne0 = 0;
    int rc = -1;
    char label[64];

    snprintf(label, sizeof(label), "N=%zu", N);
    if (!hk || !hv || !q || !ref || !out || !rel) {
        bn_report_skip(rep, label, "host allocation failed");
        goto out;
    }
    kn_synth_params_default(&sp);
    sp.n_tokens = N;
    sp.seed = 20260;
    if (kn_synth_kv(&sp, hk, hv, D, N * D) != RI_OK)
        goto out;
    for (int s = 0; s < steps; s++)
        kn_synth_query(&sp, (uint64_t)s, q + (size_t)s * NQ * D);
    if (bn_cu_alloc((void **)&x.dk, elems * 2) || bn_cu_alloc((void **)&x.dv, elems * 2) ||
        bn_cu_upload(x.dk, hk, elems * 2) || bn_cu_upload(x.dv, hv, elems * 2)) {
        bn_report_skip(rep, label, "device allocation failed");
        goto out;
    }
    x.kv = (kn_kv_view_t){x.dk, x.dv, N, D, N * D};
    x.out = out;
    x.lse = lse;

    /* the wave index's zones and budgets, as kn_wave_build sets them */
    kn_wave_params_default(&wp);
    x.sink = wp.sink_tokens;
    x.idx0 = wp.sink_tokens;
    x.idx1 = (uint32_t)(N - wp.window_tokens);
    wp.tokens_per_cluster = kn_wave_cluster_tokens(&wp, x.idx1 - x.idx0);
    C = kn_index_plan(x.idx1 - x.idx0, wp.tokens_per_cluster, wp.segment_tokens, &S);
    kn_build_params_default(&bp);
    bp.final_neighbours = N <= 131072 ? -1 : 1;
    t_build = cm_time_s();
    for (int h = 0; h < NKV; h++) {
        kn_index_init(&x.head[h].host, D);
        /* through the wrapper: it also fills the int8 means the estimation reads */
        if (kn_index_build(kn_ops_cuda(), &bp, x.dk + (size_t)h * N * D + (size_t)x.idx0 * D,
                           x.dv + (size_t)h * N * D + (size_t)x.idx0 * D, D, x.idx1 - x.idx0,
                           x.idx0, C, S, &x.head[h].host) != RI_OK) {
            bn_report_skip(rep, label, "device index build failed");
            goto out;
        }
    }
    t_build = cm_time_s() - t_build;
    for (int h = 0; h < NKV; h++)
        if (bc_head_upload(&x.head[h], hk + (size_t)h * N * D, hv + (size_t)h * N * D, N) != 0) {
            bn_report_skip(rep, label, "device index upload failed");
            goto out;
        }
    for (int h = 0; h < NKV; h++) {
        const bc_head_t *hd = &x.head[h];
        const cm_fp16_t *kh = x.dk + (size_t)h * N * D, *vh = x.dv + (size_t)h * N * D;
        x.step[h] = (kn_cuda_wave_head_t){ .centroids = hd->dev.centroids,
                                           .cscale = hd->dev.cscale,
                                           .sizes = hd->dev.sizes,
                                           .offsets = hd->offsets,
                                           .vq = hd->dev.vq,
                                           .vscale = hd->dev.vscale,
                                           .ck = hd->ck,
                                           .cv = hd->cv,
                                           .n_clusters = hd->dev.n_clusters,
                                           .steady = { { kh, vh, x.sink, D },
                                                       { kh + (size_t)x.idx1 * D, vh + (size_t)x.idx1 * D,
                                                         (uint32_t)(N - x.idx1), D } } };
    }
    kn_wave_budget_grow(&wp, C, C, &nr0, &ne0);
    kn_wave_budget_floor(&wp, C, nr0, ne0, &x.n_r, &x.n_e);
    x.n_qpages = (uint32_t)(N / QPAGE);
    x.quest_pages = (x.sink + wp.window_tokens + x.n_r * wp.tokens_per_cluster + QPAGE - 1) / QPAGE;
    {
        cJSON *row = bn_report_row(rep);
        cJSON_AddStringToObject(row, "op", "index_build");
        cJSON_AddStringToObject(row, "backend", "cuda");
        cJSON_AddNumberToObject(row, "n_tokens", (double)N);
        cJSON_AddNumberToObject(row, "seconds", t_build);
        cJSON_AddNumberToObject(row, "kv_heads", NKV);
        cJSON_AddNumberToObject(row, "clusters_per_head", C);
        cJSON_AddNumberToObject(row, "segments", S);
        cJSON_AddStringToObject(row, "final_pass", bp.final_neighbours < 0 ? "global" : "neighbours");
        printf("%-11s N=%-8zu %8.3f s  (%u KV heads, %u clusters in %u segments each, final=%s)\n",
               "index_build", N, t_build, NKV, C, S, bp.final_neighbours < 0 ? "global" : "neighbours");
    }

    /* references: the device's full attention for every step's query */
    for (int s = 0; s < steps; s++) {
        x.q = q + (size_t)s * NQ * D;
        x.out = ref + (size_t)s * NQ * D;
        if (bc_full(&x) != RI_OK)
            goto out;
    }
    x.out = out;
    for (int r = 0; r < rounds; r++)
        for (int slot = 0; slot < M_COUNT; slot++) {
            int m = (slot + r) % M_COUNT;
            double t0;
            x.q = q + (size_t)(r % steps) * NQ * D;
            bn_cu_flush();
            t0 = cm_time_s();
            if (bc_run(m, &x) != RI_OK) {
                fprintf(stderr, "bench: %s failed at N=%zu\n", m_name[m], N);
                goto out;
            }
            tm[m][r] = cm_time_s() - t0;
        }
    for (int m = 0; m < M_COUNT; m++) {
        double med = bn_median(tm[m], (size_t)rounds), best = bn_percentile(tm[m], (size_t)rounds, 0);
        double full_med = bn_median(tm[M_FULL], (size_t)rounds);
        uint64_t bytes = 0;
        size_t nq = 0;
        kn_summary_t sm;
        cJSON *row;
        x.want_bytes = true;
        for (int s = 0; s < steps; s++) {
            x.q = q + (size_t)s * NQ * D;
            if (bc_run(m, &x) != RI_OK)
                goto out;
            for (int h = 0; h < NQ; h++)
                rel[nq++] = kn_metric_rel_l2(out + (size_t)h * D, ref + (size_t)s * NQ * D + (size_t)h * D, D);
        }
        for (int h = 0; h < NKV; h++)
            bytes += x.bytes[h];
        x.want_bytes = false;
        kn_summarise(rel, nq, &sm);
        row = bn_report_row(rep);
        cJSON_AddStringToObject(row, "op", "decode");
        cJSON_AddStringToObject(row, "backend", "cuda");
        cJSON_AddStringToObject(row, "method", m_name[m]);
        cJSON_AddNumberToObject(row, "n_tokens", (double)N);
        cJSON_AddNumberToObject(row, "seconds", med);
        cJSON_AddNumberToObject(row, "seconds_min", best);
        cJSON_AddNumberToObject(row, "samples", rounds);
        cJSON_AddNumberToObject(row, "bytes_read", (double)bytes);
        cJSON_AddNumberToObject(row, "gbs", bytes / med / 1e9);
        cJSON_AddNumberToObject(row, "hbm_read_gbs", hbm_read);
        cJSON_AddNumberToObject(row, "bw_fraction", bytes / med / 1e9 / hbm_read);
        cJSON_AddNumberToObject(row, "speedup_vs_full", full_med / med);
        cJSON_AddNumberToObject(row, "rel_err_median", sm.median);
        cJSON_AddNumberToObject(row, "rel_err_p99", sm.p99);
        cJSON_AddNumberToObject(row, "accuracy_steps", steps);
        if (m == M_WAVE || m == M_STEP) {
            cJSON_AddNumberToObject(row, "retrieval_clusters", x.n_r);
            cJSON_AddNumberToObject(row, "estimation_clusters", x.n_e);
        }
        if (m == M_QUEST)
            cJSON_AddNumberToObject(row, "quest_pages", x.quest_pages);
        printf("%-18s N=%-8zu %9.3f ms (min %9.3f) %8.1f MB %8.1f GB/s (%3.0f%% of HBM %.0f) x%-6.2f rel_err %.4f / p99 %.4f\n",
               m_name[m], N, med * 1e3, best * 1e3, bytes / 1e6, bytes / med / 1e9,
               100.0 * bytes / med / 1e9 / hbm_read, hbm_read, full_med / med, sm.median, sm.p99);
    }
    rc = 0;
out:
    for (int h = 0; h < NKV; h++)
        bc_head_free(&x.head[h]);
    bn_cu_free(x.dk);
    bn_cu_free(x.dv);
    free(hk);
    free(hv);
    free(q);
    free(ref);
    free(out);
    free(rel);
    return rc;
}

/* The wave object with the cuda table, on host K/V (staged by the ops):
 * its output against full attention and against the cpu table's wave. */
static int bench_wave_object(bn_report_t *rep, size_t N, int steps)
{
    kn_synth_params_t sp;
    kn_wave_params_t wp;
    kn_shape_t shape = {NQ, NKV, D, 0};
    kn_wave_t *wc = NULL, *wh = NULL;
    size_t elems = N * NKV * D;
    cm_fp16_t *k = malloc(elems * 2), *v = malloc(elems * 2);
    float q[NQ * D], full[NQ * D], oc[NQ * D], oh[NQ * D], lse[NQ];
    double *e_full = malloc(sizeof(double) * NQ * (size_t)steps), *e_cpu = malloc(sizeof(double) * NQ * (size_t)steps);
    double t_dev = 0, t0;
    size_t n = 0;
    kn_kv_view_t kv;
    kn_summary_t a, b;
    int rc = -1;

    if (!k || !v || !e_full || !e_cpu)
        goto out;
    kn_synth_params_default(&sp);
    sp.n_tokens = N;
    sp.seed = 20260;
    if (kn_synth_kv(&sp, k, v, D, N * D) != RI_OK)
        goto out;
    kv = (kn_kv_view_t){k, v, N, D, N * D};
    kn_wave_params_default(&wp);
    wp.ops = kn_ops_cuda();
    if (kn_wave_create(&shape, &wp, &wc) != RI_OK || kn_wave_build(wc, &kv) != RI_OK)
        goto out;
    wp.ops = kn_ops_cpu();
    if (kn_wave_create(&shape, &wp, &wh) != RI_OK || kn_wave_build(wh, &kv) != RI_OK)
        goto out;
    for (int s = 0; s < steps; s++) {
        kn_synth_query(&sp, (uint64_t)s, q);
        if (kn_ops_cuda()->attn_decode(&shape, 1, q, &kv, full, lse) != RI_OK)
            goto out;
        t0 = cm_time_s();
        if (kn_wave_decode(wc, q, &kv, oc, lse, NULL) != RI_OK)
            goto out;
        t_dev += cm_time_s() - t0;
        if (kn_wave_decode(wh, q, &kv, oh, lse, NULL) != RI_OK)
            goto out;
        for (int h = 0; h < NQ; h++, n++) {
            e_full[n] = kn_metric_rel_l2(oc + h * D, full + h * D, D);
            e_cpu[n] = kn_metric_rel_l2(oc + h * D, oh + h * D, D);
        }
    }
    kn_summarise(e_full, n, &a);
    kn_summarise(e_cpu, n, &b);
    {
        cJSON *row = bn_report_row(rep);
        cJSON_AddStringToObject(row, "op", "wave_object");
        cJSON_AddStringToObject(row, "backend", "cuda");
        cJSON_AddNumberToObject(row, "n_tokens", (double)N);
        cJSON_AddNumberToObject(row, "steps", steps);
        cJSON_AddNumberToObject(row, "rel_err_vs_full_median", a.median);
        cJSON_AddNumberToObject(row, "rel_err_vs_full_p99", a.p99);
        cJSON_AddNumberToObject(row, "rel_diff_vs_cpu_wave_median", b.median);
        cJSON_AddNumberToObject(row, "rel_diff_vs_cpu_wave_max", b.max);
        cJSON_AddNumberToObject(row, "seconds_per_step_host_staged", t_dev / steps);
    }
    printf("wave object N=%zu, cuda table on host K/V (%d steps): rel err vs full median %.4f (p99 %.4f); "
           "vs the cpu table's wave median %.2e (max %.2e); %.1f ms/step (host-staged, not a device figure)\n",
           N, steps, a.median, a.p99, b.median, b.max, 1e3 * t_dev / steps);
    rc = 0;
out:
    kn_wave_destroy(wc);
    kn_wave_destroy(wh);
    free(k);
    free(v);
    free(e_full);
    free(e_cpu);
    return rc;
}

typedef struct bc_opts {
    char *json;
    int64_t only;   /* one size; 0 = every size */
    int64_t max_n;
    int64_t steps;
    int64_t rounds;
    int64_t wave_n; /* 0 skips the wave object */
    cm_runtime_t rt;   /* log level, threads, kernel backend (cm_runtime.h) */
} bc_opts_t;

static const cm_config_item_t bc_items[] = {
    BN_ARG_JSON(bc_opts_t, json),
    CM_RUNTIME_LOG_ITEM(bc_opts_t, rt),
    CM_RUNTIME_KERNEL_ITEMS(bc_opts_t, rt),
    BN_ARG(bc_opts_t, "only", CM_CFG_INT, "0", "run only this size N (0 = every size)", only, 0, 1 << 30),
    BN_ARG(bc_opts_t, "max-n", CM_CFG_INT, "1048576", "largest context size N", max_n, 1, 1 << 30),
    BN_ARG(bc_opts_t, "steps", CM_CFG_INT, "4", "decode steps (queries) per method", steps, 1, 1 << 20),
    BN_ARG(bc_opts_t, "rounds", CM_CFG_INT, "9", "timing rounds", rounds, 1, MAX_ROUNDS),
    BN_ARG(bc_opts_t, "wave-n", CM_CFG_INT, "32768", "context of the wave object run (0 skips it)", wave_n, 0, 1 << 30),
};
static const cm_config_table_t bc_table = {"ri-bench-cuda", "RI_BENCH_CUDA_", bc_items, CM_ARRAY_LEN(bc_items), 0,
                                           NULL};

static int bc_main(const void *arg, const char *argv0)
{
    const bc_opts_t *o = arg;
    (void)argv0;
    char rt_err[256];
    if (cm_runtime_apply(&o->rt, rt_err, sizeof(rt_err)) != RI_OK ||
        kn_runtime_apply(&o->rt, rt_err, sizeof(rt_err)) != RI_OK) {
        fprintf(stderr, "ri-bench-cuda: %s\n", rt_err);
        return 2;
    }
    const char *json = o->json;
    static const size_t sizes[] = {131072, 1048576};
    size_t only_n = (size_t)o->only, max_n = (size_t)o->max_n, wave_n = (size_t)o->wave_n;
    int steps = (int)o->steps, rounds = (int)o->rounds, fails = 0, sms = 0, mhz = 0;
    double mem_gib = 0, hbm_read = 0, hbm_copy = 0;
    char name[256];
    bn_report_t *rep;

    if (kn_cuda_init() != RI_OK) {
        printf("ri-bench-cuda: no CUDA device: skipped\n");
        return 77;
    }
    if (bn_cu_describe(name, sizeof(name), &mem_gib, &sms, &mhz) != 0 ||
        bn_cu_hbm_bw((size_t)2 << 30, 10, &hbm_read, &hbm_copy) != 0)
        return 1;
    rep = bn_report_create("cuda");
    if (rep == NULL)
        return 1;
    printf("cuda: %s, %.1f GiB, %d SMs, %d MHz; HBM read %.1f GB/s, device-to-device copy %.1f GB/s "
           "(2 GiB, median of 10)\n", name, mem_gib, sms, mhz, hbm_read, hbm_copy);
    cJSON_AddStringToObject(bn_report_root(rep), "device", name);
    cJSON_AddNumberToObject(bn_report_root(rep), "device_mem_gib", mem_gib);
    cJSON_AddNumberToObject(bn_report_root(rep), "device_sms", sms);
    cJSON_AddNumberToObject(bn_report_root(rep), "hbm_read_gbs", hbm_read);
    cJSON_AddNumberToObject(bn_report_root(rep), "hbm_copy_gbs", hbm_copy);
    cJSON_AddStringToObject(bn_report_root(rep), "geometry", "llama-3-8b: 32 q heads, 8 kv heads, d=128, fp16");
    for (size_t i = 0; i < sizeof(sizes) / sizeof(sizes[0]); i++) {
        char label[64];
        snprintf(label, sizeof(label), "N=%zu", sizes[i]);
        if (only_n && sizes[i] != only_n)
            continue;
        if (sizes[i] > max_n) {
            bn_report_skip(rep, label, "above --max-n");
            continue;
        }
        fails += bench_size(rep, sizes[i], steps, rounds, hbm_read) != 0;
        fflush(stdout);
    }
    if (wave_n > 0)
        fails += bench_wave_object(rep, wave_n, steps) != 0;
    if (bn_report_finish(rep, json) != 0)
        return 1;
    if (fails)
        fprintf(stderr, "BENCH FAILED: %d part(s) did not run\n", fails);
    return fails ? 1 : 0;
}

int main(int argc, char **argv)
{
    bc_opts_t o;
    return bn_args_main(&bc_table, &o, argc, argv, bc_main);
}
