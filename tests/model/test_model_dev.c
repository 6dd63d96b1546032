/*
 * The device decode engine (mdl_dev.h) against the CPU runtime.
 *
 *  - the small kernels (norms, residuals, GLU, soft-cap, Q/K norm + RoPE +
 *    K/V store) one by one against plain loops, so that a failing model
 *    check has a step to point at;
 *  - GEMV: the engine's kernel against a double-precision sum over the same
 *    fp16 weights, at shapes that are awkward for it (rows not a multiple of
 *    the 4 rows of a block, row lengths not a multiple of 8: the scalar
 *    tail; batch 1..8);
 *  - SmolLM2 and Gemma 3: two prompts prefilled on the CPU, uploaded, then
 *    8 greedy steps decoded on the CPU and on the device from the same
 *    state (both fed the CPU's argmax, so that one early difference does
 *    not make every later step differ): per step and sequence, max |CPU -
 *    device logit| <= 1e-2 of the CPU's logit range and the same argmax.
 *    The first 4 steps run both sequences in one batch, the last 4 one at a
 *    time.  Gemma's second prompt is longer than its 512-token window, so
 *    the sliding-window layers attend a window that has moved.
 *
 * Exits 77 without a CUDA device.  test_model_dev_host is this file over
 * host stand-ins of the kernels (mdl_dev_host_kern.c): it runs everywhere
 * and checks the engine's host side only.  A model that is not installed is
 * reported on a "NOT RUN" line (the GEMV check still counts).
 */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>

#include "common/cm_alloc.h"
#include "common/cm_half.h"
#include "common/cm_time.h"
#include "gpuworker/model/cuda/mdl_dev_kern.h"
#include "gpuworker/model/mdl_dev.h"
#include "gpuworker/model/mdl_model.h"
#include "kernels/kn_ops.h"
#include "tm_util.h"
#include "gpuworker/model/mdl_sample.h"
#include "tm_synth.h"
#include "mdl_dev_ref.h"

#define TD_STEPS 8
#define TD_TOL 1e-2       /* real models: the CPU keeps the quantised weights, the device fp16 */
#define TD_TOL_SYNTH 1e-3 /* synthetic models: fp16 weights on both sides (4e-6 seen on the host) */

/* ---- GEMV ---- */

static uint64_t td_rng = 0x9e3779b97f4a7c15ull;

static float td_uniform(void)   /* [-1, 1) */
{
    td_rng ^= td_rng << 13;
    td_rng ^= td_rng >> 7;
    td_rng ^= td_rng << 17;
    return (float)((double)(td_rng >> 11) / (double)(1ull << 53) * 2.0 - 1.0);
}

/* One shape; returns the worst error as a share of sum |w x| of its row. */
static double td_gemv_case(size_t rows, size_t k, size_t n)
{
    cm_fp16_t *w = malloc(rows * k * sizeof(*w));
    float *x = malloc(n * k * sizeof(float)), *y = malloc(n * rows * sizeof(float));
    double worst = 0;
    assert_non_null(w);
    assert_non_null(x);
    assert_non_null(y);
    for (size_t i = 0; i < rows * k; i++)
        w[i] = cm_f32_to_fp16(td_uniform());
    for (size_t i = 0; i < n * k; i++)
        x[i] = td_uniform();
    assert_int_equal(mdl_dev_gemv_host(w, rows, k, x, n, y), RI_OK);
    for (size_t b = 0; b < n; b++)
        for (size_t r = 0; r < rows; r++) {
            double s = 0, a = 0;
            for (size_t i = 0; i < k; i++) {
                double p = (double)cm_fp16_to_f32(w[r * k + i]) * x[b * k + i];
                s += p;
                a += fabs(p);
            }
            double e = fabs(s - y[b * rows + r]) / (a + 1e-30);
            worst = e > worst ? e : worst;
        }
    free(w);
    free(x);
    free(y);
    return worst;
}

static void test_gemv_awkward_shapes(void **state)
{
    static const size_t shapes[][3] = {
        {1, 1, 1}, {3, 7, 1}, {33, 13, 2}, {31, 8, 5}, {577, 1000, 8}, {1000, 576, 8},
        {49, 2049, 3}, {130, 255, 7}, {64, 576, 4}, {5, 9, 6},
    };
    (void)state;
    for (size_t i = 0; i < sizeof(shapes) / sizeof(shapes[0]); i++) {
        double e = td_gemv_case(shapes[i][0], shapes[i][1], shapes[i][2]);
        printf("gemv rows %zu k %zu batch %zu: worst error %.2e of sum |w x|\n", shapes[i][0], shapes[i][1],
               shapes[i][2], e);
        /* fp32 sums of up to 2049 products: ~1e-6; a lost element is ~1/k >= 5e-4 */
        assert_true(e <= 2e-5);
    }
}

/* ---- the small kernels, one by one ---- */

/* Each kernel of mdl_dev_kern.h against a plain loop here, so that a
 * model check that fails on the device says which step to look at.  Device
 * buffers through the engine's own memory helpers. */

#define TD_KTOL 1e-5

static float *td_dev_copy(const float *h, size_t n)
{
    float *d = NULL;
    assert_int_equal(mdl_dk_malloc((void **)&d, n * sizeof(float)), RI_OK);
    assert_int_equal(mdl_dk_h2d(d, h, n * sizeof(float)), RI_OK);
    return d;
}

static void td_fill(float *x, size_t n, float base, float spread)
{
    for (size_t i = 0; i < n; i++)
        x[i] = base + spread * td_uniform();
}

/* max |a - b| / (max |b| + 1e-30) over n, after fetching a from the device */
static double td_dev_err(const float *dev, const float *ref, size_t n)
{
    float *h = malloc(n * sizeof(float));
    double e = 0, m = 0;
    assert_non_null(h);
    assert_int_equal(mdl_dk_sync("test"), RI_OK);
    assert_int_equal(mdl_dk_d2h(h, dev, n * sizeof(float)), RI_OK);
    for (size_t i = 0; i < n; i++) {
        double d = fabs((double)h[i] - ref[i]);
        e = d > e || isnan(d) ? d : e;
        m = fabs(ref[i]) > m ? fabs(ref[i]) : m;
    }
    free(h);
    return e / (m + 1e-30);
}

static void td_check(const char *what, double e)
{
    printf("kernel %s: max error %.2e of the largest value\n", what, e);
    assert_false(isnan(e));
    assert_true(e <= TD_KTOL);
}

static void td_kern_norms(void)
{
    enum { R = 3, N = 84 };
    float x[R * N], xb[R * N], w[N], ref[R * N], refb[R * N];
    td_fill(x, R * N, 0.0f, 3.0f);
    td_fill(xb, R * N, 0.0f, 2.0f);
    td_fill(w, N, 1.0f, 0.3f);
    float *dx = td_dev_copy(x, R * N), *dxb = td_dev_copy(xb, R * N), *dw = td_dev_copy(w, N), *dout = NULL;
    assert_int_equal(mdl_dk_malloc((void **)&dout, sizeof(x)), RI_OK);
    for (int r = 0; r < R; r++) {
        float s = mdl_dev_ref_inv_rms(x + r * N, N, 1e-6f);
        for (int i = 0; i < N; i++)
            ref[r * N + i] = x[r * N + i] * s * w[i];
    }
    mdl_dk_rmsnorm(dout, dx, dw, N, R, 1e-6f);
    td_check("rmsnorm", td_dev_err(dout, ref, R * N));
    /* residual without, then with, a post-norm */
    for (int i = 0; i < R * N; i++)
        ref[i] = x[i] + xb[i];
    mdl_dk_residual(dx, dxb, NULL, N, R, 1e-6f);
    td_check("residual", td_dev_err(dx, ref, R * N));
    for (int r = 0; r < R; r++) {
        float s = mdl_dev_ref_inv_rms(xb + r * N, N, 1e-6f);
        for (int i = 0; i < N; i++) {
            refb[r * N + i] = xb[r * N + i] * s * w[i];
            ref[r * N + i] += refb[r * N + i];
        }
    }
    mdl_dk_residual(dx, dxb, dw, N, R, 1e-6f);
    td_check("residual + post-norm", td_dev_err(dx, ref, R * N));
    td_check("residual's normed output", td_dev_err(dxb, refb, R * N));
    mdl_dk_free(dx);
    mdl_dk_free(dxb);
    mdl_dk_free(dw);
    mdl_dk_free(dout);
}

static void td_kern_pointwise(void)
{
    enum { N = 1000 };
    float g[N], u[N], ref[N];
    td_fill(g, N, 0.0f, 6.0f);
    td_fill(u, N, 0.0f, 2.0f);
    for (int geglu = 0; geglu < 2; geglu++) {
        float *dg = td_dev_copy(g, N), *du = td_dev_copy(u, N);
        for (int i = 0; i < N; i++) {
            float x = g[i];
            ref[i] = geglu ? 0.5f * x * (1.0f + tanhf(0.7978845608028654f * (x + 0.044715f * x * x * x))) * u[i]
                           : x / (1.0f + expf(-x)) * u[i];
        }
        mdl_dk_glu(dg, du, N, geglu);
        td_check(geglu ? "geglu" : "swiglu", td_dev_err(dg, ref, N));
        mdl_dk_free(dg);
        mdl_dk_free(du);
    }
    float *dl = td_dev_copy(g, N);
    for (int i = 0; i < N; i++)
        ref[i] = 4.0f * tanhf(g[i] / 4.0f);
    mdl_dk_softcap(dl, N, 4.0f);
    td_check("softcap", td_dev_err(dl, ref, N));
    mdl_dk_free(dl);
}

/* Q/K norm + RoPE + K/V store for 3 rows with different caches and
 * positions; both pair layouts, with and without the norms, n_rot < d. */
static void td_kern_qk_case(int neox, bool norms)
{
    enum { B = 3, H = 6, KV = 2, D = 14, ROT = 10, CAP = 5 };
    mdl_dk_qk_t g = {.n_heads = H, .n_kv_heads = KV, .head_dim = D, .n_rot = ROT, .neox = neox, .eps = 1e-6f};
    float q[B * H * D], k[B * KV * D], v[B * KV * D], qn[D], kn[D], cs[B * 2 * ROT];
    td_fill(q, B * H * D, 0.0f, 2.0f);
    td_fill(k, B * KV * D, 0.0f, 2.0f);
    td_fill(v, B * KV * D, 0.0f, 2.0f);
    td_fill(qn, D, 1.0f, 0.3f);
    td_fill(kn, D, 1.0f, 0.3f);
    for (int b = 0; b < B; b++)   /* row b's table at cs[b * 2 * ROT]; only the first ROT floats are read */
        for (int i = 0; i < ROT / 2; i++) {
            float a = (float)(b + 1) * 0.37f * (float)(i + 1);
            cs[b * 2 * ROT + 2 * i] = cosf(a);
            cs[b * 2 * ROT + 2 * i + 1] = sinf(a);
        }
    float *dq = td_dev_copy(q, sizeof(q) / 4), *dk = td_dev_copy(k, sizeof(k) / 4), *dv = td_dev_copy(v, sizeof(v) / 4);
    float *dqn = td_dev_copy(qn, D), *dkn = td_dev_copy(kn, D), *dcs = td_dev_copy(cs, sizeof(cs) / 4);
    uint16_t *cache[B];
    mdl_dk_row_t rows[B], *drows = NULL;
    size_t cache_n = 2 * (size_t)KV * CAP * D;
    for (int b = 0; b < B; b++) {
        assert_int_equal(mdl_dk_malloc((void **)&cache[b], cache_n * 2), RI_OK);
        rows[b] = (mdl_dk_row_t){.k = (uint64_t)(uintptr_t)cache[b], .v = (uint64_t)(uintptr_t)(cache[b] + KV * CAP * D),
                                 .cap = CAP, .pos = (uint64_t)(4 - b)};
    }
    assert_int_equal(mdl_dk_malloc((void **)&drows, sizeof(rows)), RI_OK);
    assert_int_equal(mdl_dk_h2d(drows, rows, sizeof(rows)), RI_OK);
    mdl_dk_qk_store(&g, dq, dk, dv, norms ? dqn : NULL, norms ? dkn : NULL, dcs, 2 * ROT, drows, B);
    for (int b = 0; b < B; b++) {
        for (int h = 0; h < H; h++)
            mdl_dev_ref_head(&g, q + (b * H + h) * D, norms ? qn : NULL, cs + b * 2 * ROT);
        for (int h = 0; h < KV; h++)
            mdl_dev_ref_head(&g, k + (b * KV + h) * D, norms ? kn : NULL, cs + b * 2 * ROT);
    }
    td_check("qk: q", td_dev_err(dq, q, sizeof(q) / 4));
    td_check("qk: k", td_dev_err(dk, k, sizeof(k) / 4));
    /* the stored rows: fp16 of the rotated K and of V, at each row's position */
    for (int b = 0; b < B; b++) {
        cm_fp16_t *hc = malloc(cache_n * 2);
        assert_non_null(hc);
        assert_int_equal(mdl_dk_d2h(hc, cache[b], cache_n * 2), RI_OK);
        for (int h = 0; h < KV; h++)
            for (int i = 0; i < D; i++) {
                size_t at = ((size_t)h * CAP + rows[b].pos) * D + i;
                /* K went through fp32 arithmetic that may round differently: within fp16's precision */
                float kr = k[(b * KV + h) * D + i];
                assert_true(fabsf(cm_fp16_to_f32(hc[at]) - kr) <= 1e-3f * fabsf(kr) + 1e-6f);
                /* V is only converted: the same bits (both round to nearest even) */
                assert_int_equal(hc[KV * CAP * D + at], cm_f32_to_fp16(v[(b * KV + h) * D + i]));
            }
        free(hc);
        mdl_dk_free(cache[b]);
    }
    float *bufs[] = {dq, dk, dv, dqn, dkn, dcs};
    for (size_t i = 0; i < sizeof(bufs) / sizeof(bufs[0]); i++)
        mdl_dk_free(bufs[i]);
    mdl_dk_free(drows);
}

static void test_small_kernels(void **state)
{
    (void)state;
    td_kern_norms();
    td_kern_pointwise();
    for (int neox = 0; neox < 2; neox++)
        for (int norms = 0; norms < 2; norms++)
            td_kern_qk_case(neox, norms != 0);
}

/* ---- the model against the CPU ---- */

typedef struct td_run {
    mdl_model_t *m;
    mdl_dev_t *d;
    mdl_seq_t *cpu[2];
    mdl_dev_seq_t *dev[2];
    float *lc, *lg;      /* [2][n_vocab]: CPU, device */
    int32_t tok[2];
    double worst;        /* of every step: max |diff| / range */
    double tol;          /* its bound */
} td_run_t;

/* Prefill prompt p (ids) on the CPU, upload it, take the first token. */
static void td_prefill(td_run_t *t, int p, const int32_t *ids, size_t n)
{
    const mdl_hparams_t *hp = mdl_model_hparams(t->m);
    assert_int_equal(mdl_seq_create(t->m, mdl_attn_find("full"), NULL, n + TD_STEPS + 1, &t->cpu[p]), RI_OK);
    assert_int_equal(mdl_prefill(t->m, t->cpu[p], ids, n, t->lc + p * hp->n_vocab, NULL, NULL, NULL), RI_OK);
    assert_int_equal(mdl_dev_seq_create(t->d, n + TD_STEPS + 1, &t->dev[p]), RI_OK);
    assert_int_equal(mdl_dev_seq_upload(t->d, t->dev[p], t->cpu[p]), RI_OK);
    assert_int_equal(mdl_dev_seq_len(t->dev[p]), n);
    t->tok[p] = mdl_argmax(t->lc + p * hp->n_vocab, hp->n_vocab);
}

/* Compare row p of the two logit arrays; feed the CPU's argmax next. */
static void td_compare(td_run_t *t, int step, int p)
{
    const mdl_hparams_t *hp = mdl_model_hparams(t->m);
    const float *c = t->lc + p * hp->n_vocab, *g = t->lg + p * hp->n_vocab;
    float lo = c[0], hi = c[0];
    double diff = 0;
    for (size_t i = 0; i < hp->n_vocab; i++) {
        lo = c[i] < lo ? c[i] : lo;
        hi = c[i] > hi ? c[i] : hi;
        double e = fabs((double)c[i] - g[i]);
        diff = e > diff || isnan(e) ? e : diff;
    }
    double ratio = diff / (double)(hi - lo);
    int32_t ac = mdl_argmax(c, hp->n_vocab), ag = mdl_argmax(g, hp->n_vocab);
    printf("  step %d seq %d: max |diff| %.3e, range %.2f, ratio %.2e, argmax cpu %d device %d\n", step, p, diff,
           (double)(hi - lo), ratio, ac, ag);
    t->worst = ratio > t->worst || isnan(ratio) ? ratio : t->worst;
    assert_false(isnan(ratio));
    assert_true(ratio <= t->tol);
    assert_int_equal(ac, ag);
    t->tok[p] = ac;
}

/* One decode step: both sequences in one batch, or one at a time. */
static void td_step(td_run_t *t, int step, bool batch)
{
    const mdl_hparams_t *hp = mdl_model_hparams(t->m);
    assert_int_equal(mdl_decode(t->m, t->cpu, t->tok, 2, t->lc), RI_OK);
    if (batch) {
        assert_int_equal(mdl_dev_decode(t->d, t->dev, t->tok, 2, t->lg), RI_OK);
    } else {
        for (int p = 0; p < 2; p++)
            assert_int_equal(mdl_dev_decode(t->d, &t->dev[p], &t->tok[p], 1, t->lg + p * hp->n_vocab), RI_OK);
    }
    for (int p = 0; p < 2; p++)
        td_compare(t, step, p);
}

/* mdl_decode's refusals, on the device: a bad token, a sequence twice in
 * a batch, a full sequence, an upload into a cache too small. */
static void td_errors(td_run_t *t)
{
    const mdl_hparams_t *hp = mdl_model_hparams(t->m);
    mdl_dev_seq_t *twice[2] = {t->dev[0], t->dev[0]}, *small;
    int32_t bad = (int32_t)hp->n_vocab, toks[2] = {1, 1};
    size_t len = mdl_dev_seq_len(t->dev[0]);
    assert_int_equal(mdl_dev_decode(t->d, t->dev, &bad, 1, t->lg), RI_ERR_INVALID);
    assert_int_equal(mdl_dev_decode(t->d, twice, toks, 2, t->lg), RI_ERR_INVALID);
    assert_int_equal(mdl_dev_seq_len(t->dev[0]), len);   /* refused steps do not advance */
    assert_int_equal(mdl_dev_decode(t->d, t->dev, toks, 1, t->lg), RI_OK);   /* the last free row */
    assert_int_equal(mdl_dev_seq_len(t->dev[0]), mdl_dev_seq_cap(t->dev[0]));
    assert_int_equal(mdl_dev_decode(t->d, t->dev, toks, 1, t->lg), RI_ERR_RANGE);
    assert_int_equal(mdl_dev_seq_create(t->d, mdl_seq_len(t->cpu[0]) - 1, &small), RI_OK);
    assert_int_equal(mdl_dev_seq_upload(t->d, small, t->cpu[0]), RI_ERR_RANGE);
    mdl_dev_seq_destroy(small);
}

#ifndef TD_HOST_KERNELS /* the stand-ins' times say nothing, and cost minutes */
#define TD_TIMED_STEPS 32

/* Time per decode step at batch 1 and 8 from the first prompt's state, for
 * the device session's record (no bound: nothing to compare with yet). */
static void td_speed(td_run_t *t)
{
    const mdl_hparams_t *hp = mdl_model_hparams(t->m);
    mdl_dev_seq_t *s[MDL_DEV_MAX_BATCH];
    int32_t toks[MDL_DEV_MAX_BATCH];
    float *lg = malloc((size_t)MDL_DEV_MAX_BATCH * hp->n_vocab * sizeof(float));
    assert_non_null(lg);
    for (int b = 0; b < MDL_DEV_MAX_BATCH; b++) {
        assert_int_equal(mdl_dev_seq_create(t->d, mdl_seq_len(t->cpu[0]) + TD_TIMED_STEPS + 1, &s[b]), RI_OK);
        assert_int_equal(mdl_dev_seq_upload(t->d, s[b], t->cpu[0]), RI_OK);
        toks[b] = t->tok[0];
    }
    size_t batches[2] = {1, MDL_DEV_MAX_BATCH};
    for (int i = 0; i < 2; i++) {
        double t0 = cm_time_s();
        for (int k = 0; k < TD_TIMED_STEPS / 2; k++)
            assert_int_equal(mdl_dev_decode(t->d, s, toks, batches[i], lg), RI_OK);
        double dt = (cm_time_s() - t0) / (TD_TIMED_STEPS / 2);
        printf("device decode %s batch %zu: %.2f ms a step, %.0f tokens/s (context %zu)\n", mdl_model_name(t->m),
               batches[i], dt * 1e3, (double)batches[i] / dt, mdl_seq_len(t->cpu[0]));
    }
    for (int b = 0; b < MDL_DEV_MAX_BATCH; b++)
        mdl_dev_seq_destroy(s[b]);
    free(lg);
}
#endif

/* The cross-check on the model at path; text: the first prompt is text
 * (else token ids, for the synthetic models' placeholder vocabulary). */
static void td_xcheck_path(const char *name, const char *path, bool text, size_t long_prompt)
{
    char err[512];
    td_run_t t;
    memset(&t, 0, sizeof(t));
    /* fp16 weights in the file leave the device only its sums' order to differ by */
    t.tol = text ? TD_TOL : TD_TOL_SYNTH;
    if (mdl_model_load(path, &t.m, err, sizeof(err)) != RI_OK)
        fprintf(stderr, "%s: %s\n", path, err);
    assert_non_null(t.m);
    const mdl_hparams_t *hp = mdl_model_hparams(t.m);
    ri_status_t st = mdl_dev_create(t.m, &t.d, err, sizeof(err));
    if (st != RI_OK)
        fprintf(stderr, "mdl_dev_create: %s\n", err);
    assert_int_equal(st, RI_OK);
    printf("model %s on the device: %.1f MB of fp16 weights\n", mdl_model_name(t.m),
           (double)mdl_dev_weight_bytes(t.d) / 1e6);
    t.lc = malloc(2 * hp->n_vocab * sizeof(float));
    t.lg = malloc(2 * hp->n_vocab * sizeof(float));
    assert_non_null(t.lc);
    assert_non_null(t.lg);
    int32_t *ids = NULL;
    size_t n = 0;
    if (text) {
        const char *s = "The capital of France is Paris, and the capital of Germany is";
        assert_int_equal(mdl_tok_encode_prompt(mdl_model_tok(t.m), s, strlen(s), &ids, &n), RI_OK);
        td_prefill(&t, 0, ids, n);
        cm_free(ids);
    } else {
        int32_t syn[23];
        for (size_t i = 0; i < 23; i++)
            syn[i] = (int32_t)((i * 37 + 5) % hp->n_vocab);
        td_prefill(&t, 0, syn, 23);
    }
    /* any tokens will do for the second prompt: the check is agreement */
    size_t n2 = long_prompt > 0 ? long_prompt : 37;
    ids = malloc(n2 * sizeof(int32_t));
    assert_non_null(ids);
    for (size_t i = 0; i < n2; i++)
        ids[i] = (int32_t)((1000 + (i * 7919) % 20000) % hp->n_vocab);
    td_prefill(&t, 1, ids, n2);
    free(ids);
    for (int s = 0; s < TD_STEPS; s++)
        td_step(&t, s, s < TD_STEPS / 2);
#ifndef TD_HOST_KERNELS
    td_speed(&t);
#endif
    td_errors(&t);
    printf("model cross-check %s: passed, worst max |diff| / range %.2e over %d steps x 2 sequences\n", name,
           t.worst, TD_STEPS);
    for (int p = 0; p < 2; p++) {
        mdl_dev_seq_destroy(t.dev[p]);
        mdl_seq_destroy(t.cpu[p]);
    }
    mdl_dev_destroy(t.d);
    mdl_model_destroy(t.m);
    free(t.lc);
    free(t.lg);
}

/* An installed model by name, or a NOT RUN line. */
static void td_xcheck(const char *name, size_t long_prompt)
{
    char path[4096];
    if (mdl_model_resolve(name, path, sizeof(path)) != RI_OK) {
        printf("model cross-check %s: NOT RUN (no model at %s)\n", name, path);
        return;
    }
    td_xcheck_path(name, path, true, long_prompt);
}

/* A synthetic model (tm_synth.h), written to a temporary file: runs on a
 * machine without the model files. */
static void td_xcheck_synth(bool gemma)
{
    char path[] = "/tmp/ri-test-model-dev-XXXXXX";
    int fd = mkstemp(path);
    assert_true(fd >= 0);
    close(fd);
    assert_true(tm_synth_write(path, gemma));
    td_xcheck_path(gemma ? "synthetic-gemma3" : "synthetic-llama", path, false, gemma ? 40 : 0);
    unlink(path);
}

static void test_synth_llama_matches_cpu(void **state)
{
    (void)state;
    td_xcheck_synth(false);
}

static void test_synth_gemma3_matches_cpu(void **state)
{
    (void)state;
    td_xcheck_synth(true);   /* 40 tokens: past its 16-token window */
}

static void test_smollm2_matches_cpu(void **state)
{
    (void)state;
    td_xcheck("smollm2-135m", 0);
}

static void test_gemma3_matches_cpu(void **state)
{
    (void)state;
    td_xcheck("gemma3-270m", 700);   /* past the 512-token window */
}

int main(void)
{
    /* mdl_dev_create registers the CUDA backend, which then becomes
     * kn_ops_default(): the CPU reference's "full" decode would run the
     * device's attention kernel and check nothing of it */
    tm_runtime_setup();
    (void)kn_ops_select("cpu");
    cm_fp16_t w = cm_f32_to_fp16(1.0f);
    float x = 1.0f, y = 0.0f;
    if (mdl_dev_gemv_host(&w, 1, 1, &x, 1, &y) == RI_ERR_NO_DEVICE) {
        fprintf(stderr, "skip: no CUDA device\n");
        return 77;
    }
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_gemv_awkward_shapes),
        cmocka_unit_test(test_small_kernels),
        cmocka_unit_test(test_synth_llama_matches_cpu),
        cmocka_unit_test(test_synth_gemma3_matches_cpu),
        cmocka_unit_test(test_smollm2_matches_cpu),
        cmocka_unit_test(test_gemma3_matches_cpu),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
