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
 *  - prefill on the device (mdl_dev_prefill) of the second prompt: its
 *    last logits against the CPU prefill's, and the next step from the
 *    cache it wrote against one from the uploaded CPU cache;
 *  - SmolLM2 and Gemma 3: two prompts prefilled on the CPU, uploaded, then
 *    8 greedy steps decoded on the CPU and on the device from the same
 *    state (both fed the CPU's argmax, so that one early difference does
 *    not make every later step differ): per step and sequence, max |CPU -
 *    device logit| <= 1e-2 of the CPU's logit range and the same argmax.
 *    The first 4 steps run both sequences in one batch, the last 4 one at a
 *    time.  Gemma's second prompt is longer than its 512-token window, so
 *    the sliding-window layers attend a window that has moved.
 *  - retroinfer: the synthetic models at head_dim 64 (a size the device's
 *    wave_step takes), one sequence decoding with the device's wave index
 *    (mdl_dwave) beside one with full attention, 64 greedy steps against
 *    the CPU's in-process "retroinfer" backend with small wave settings
 *    (the prompt indexes, the steps update): same tokens, logits within
 *    1e-3 of their range.
 *  - the synthetic model (mdl_synth.h): an engine whose weights the device
 *    generated (mdl_dev_create_synth) against the CPU model loaded from the
 *    GGUF of the same preset and seed, logits within 1e-3 of their range
 *    over a prefill (uploaded) and greedy steps; and a sequence filled with
 *    synthetic K/V (mdl_dev_seq_fill_synth) decodes to finite logits and
 *    holds the same K/V in every layer and every repeated tile.
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
#include "gpuworker/model/cuda/mdl_dev_int.h"
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

/* How td_prefill_on fills the device sequence. */
typedef enum td_fill {
    TD_UPLOAD = 0,  /* mdl_dev_seq_upload of the CPU's */
    TD_DEVICE,      /* mdl_dev_prefill of the whole prompt */
    TD_PREFIX,      /* a prefix loaded from a CPU sequence (mdl_dev_seq_load), the rest prefilled on the device */
} td_fill_t;

/* TD_PREFIX's prefix: the first 32 tokens of ids prefilled on the CPU in a
 * sequence of their own, loaded into s; then the rest on the device. */
static void td_prefix_then_device(td_run_t *t, mdl_dev_seq_t *s, const int32_t *ids, size_t n, const char *attn,
                                  const mdl_attn_cfg_t *cfg, float *logits)
{
    size_t k = 32;
    mdl_seq_t *pre = NULL;
    assert_true(n > k);
    assert_int_equal(mdl_seq_create(t->m, mdl_attn_find(attn), cfg, n, &pre), RI_OK);
    assert_int_equal(mdl_prefill(t->m, pre, ids, k, NULL, NULL, NULL, NULL), RI_OK);
    assert_int_equal(mdl_dev_seq_load(t->d, s, pre), RI_OK);
    assert_int_equal(mdl_dev_seq_len(s), k);
    assert_int_equal(mdl_dev_prefill(t->d, s, ids + k, n - k, logits), RI_OK);
    mdl_seq_destroy(pre);
}

/* The device sequence s's K/V copied down into a new CPU sequence
 * (mdl_dev_seq_download) against the CPU's own prefill cpu: every layer,
 * head and token within 2% of the row's largest magnitude (fp16 K/V from
 * the device's fp16 weights); a second download into a non-empty sequence
 * is refused. */
static void td_download_check(td_run_t *t, const mdl_dev_seq_t *s, const mdl_seq_t *cpu, const char *attn,
                              const mdl_attn_cfg_t *cfg)
{
    mdl_seq_t *down = NULL;
    assert_int_equal(mdl_seq_create(t->m, mdl_attn_find(attn), cfg, mdl_seq_cap(cpu), &down), RI_OK);
    assert_int_equal(mdl_dev_seq_download(t->d, s, down), RI_OK);
    assert_int_equal(mdl_seq_len(down), mdl_seq_len(cpu));
    assert_int_equal(mdl_dev_seq_download(t->d, s, down), RI_ERR_INVALID);
    const mdl_kv_t *a = mdl_seq_kv(down), *b = mdl_seq_kv(cpu);
    size_t dim = a->geom.head_dim, len = mdl_seq_len(cpu);
    double worst = 0;
    for (uint32_t l = 0; l < a->geom.n_layers; l++)
        for (uint32_t h = 0; h < a->geom.n_kv_heads; h++)
            for (size_t i = 0; i < len; i++)
                for (int w = 0; w < 2; w++) {
                    const cm_fp16_t *ra = w ? mdl_kv_vrow(a, l, h, i) : mdl_kv_krow(a, l, h, i);
                    const cm_fp16_t *rb = w ? mdl_kv_vrow(b, l, h, i) : mdl_kv_krow(b, l, h, i);
                    double big = 1e-3, e = 0;
                    for (size_t j = 0; j < dim; j++) {
                        double x = cm_fp16_to_f32(ra[j]), y = cm_fp16_to_f32(rb[j]);
                        big = fabs(y) > big ? fabs(y) : big;
                        e = fabs(x - y) > e ? fabs(x - y) : e;
                    }
                    worst = e / big > worst ? e / big : worst;
                }
    printf("  download of %zu tokens: worst |diff| / row max %.2e\n", len, worst);
    assert_true(worst <= 2e-2);
    mdl_seq_destroy(down);
}

/* Prefill prompt p (ids) on the CPU with attention attn (settings cfg),
 * and into a device sequence of the same attention with room for steps
 * more, as fill says; prefilled on the device, its last logits are within
 * the bound of the CPU's and its K/V, copied down, the CPU's; take the
 * CPU's first token. */
static void td_prefill_on(td_run_t *t, int p, const int32_t *ids, size_t n, const char *attn,
                          const mdl_attn_cfg_t *cfg, size_t steps, td_fill_t fill)
{
    const mdl_hparams_t *hp = mdl_model_hparams(t->m);
    char err[256] = "";
    assert_int_equal(mdl_seq_create(t->m, mdl_attn_find(attn), cfg, n + steps + 1, &t->cpu[p]), RI_OK);
    assert_int_equal(mdl_prefill(t->m, t->cpu[p], ids, n, t->lc + p * hp->n_vocab, NULL, NULL, NULL), RI_OK);
    ri_status_t st = mdl_dev_seq_create_attn(t->d, n + steps + 1, attn, cfg, &t->dev[p], err, sizeof(err));
    if (st != RI_OK)
        fprintf(stderr, "mdl_dev_seq_create_attn %s: %s\n", attn, err);
    assert_int_equal(st, RI_OK);
    if (fill != TD_UPLOAD) {
        if (fill == TD_PREFIX)
            td_prefix_then_device(t, t->dev[p], ids, n, attn, cfg, t->lg + p * hp->n_vocab);
        else
            assert_int_equal(mdl_dev_prefill(t->d, t->dev[p], ids, n, t->lg + p * hp->n_vocab), RI_OK);
        assert_true(tm_logit_ratio(t->lc + p * hp->n_vocab, t->lg + p * hp->n_vocab, hp->n_vocab) <= t->tol);
        td_download_check(t, t->dev[p], t->cpu[p], attn, cfg);
        if (strcmp(attn, "retroinfer") == 0) {
            /* The CPU decodes on from the device's K/V bits (the prefill was
             * compared just above).  The two prefills' K/V differ in a last
             * fp16 bit here and there, and the index's int8 value means
             * round such a difference to a whole step (max |mean| / 127)
             * now and then: the outputs would drift apart and a near tie in
             * the ranking put a cluster in the other tier, which compares
             * the prefills' rounding rather than the decode paths. */
            mdl_seq_t *down = NULL;
            assert_int_equal(mdl_seq_create(t->m, mdl_attn_find(attn), cfg, n + steps + 1, &down), RI_OK);
            assert_int_equal(mdl_dev_seq_download(t->d, t->dev[p], down), RI_OK);
            mdl_seq_destroy(t->cpu[p]);
            t->cpu[p] = down;
        }
    } else {
        assert_int_equal(mdl_dev_seq_upload(t->d, t->dev[p], t->cpu[p]), RI_OK);
    }
    assert_int_equal(mdl_dev_seq_len(t->dev[p]), n);
    t->tok[p] = mdl_argmax(t->lc + p * hp->n_vocab, hp->n_vocab);
}

static void td_prefill_attn(td_run_t *t, int p, const int32_t *ids, size_t n, const char *attn,
                            const mdl_attn_cfg_t *cfg, size_t steps)
{
    td_prefill_on(t, p, ids, n, attn, cfg, steps, TD_UPLOAD);
}

/* Prefill ids on the device itself (mdl_dev_prefill: 8 tokens a step, each
 * row causal up to its own position) into a new sequence: the last
 * token's logits against the CPU prefill's (cpu [n_vocab]) within the
 * model bound, then one decode step from it against one from an uploaded
 * copy of the CPU's K/V (up, the same token): the cache it wrote is the
 * CPU's.  Also its refusals: a bad token, no room. */
static void td_dev_prefill(td_run_t *t, const int32_t *ids, size_t n, const float *cpu, mdl_seq_t *cpu_seq)
{
    const mdl_hparams_t *hp = mdl_model_hparams(t->m);
    size_t V = hp->n_vocab;
    mdl_dev_seq_t *s = NULL, *up = NULL;
    float *lg = malloc(2 * V * sizeof(float));
    assert_non_null(lg);
    assert_int_equal(mdl_dev_seq_create(t->d, n + 2, &s), RI_OK);
    int32_t bad = (int32_t)V;
    assert_int_equal(mdl_dev_prefill(t->d, s, &bad, 1, lg), RI_ERR_INVALID);
    int32_t *big = calloc(n + 3, sizeof(int32_t));
    assert_non_null(big);
    assert_int_equal(mdl_dev_prefill(t->d, s, big, n + 3, lg), RI_ERR_RANGE);
    free(big);
    assert_int_equal(mdl_dev_seq_len(s), 0);
    assert_int_equal(mdl_dev_prefill(t->d, s, ids, n, lg), RI_OK);
    assert_int_equal(mdl_dev_seq_len(s), n);
    double ratio = tm_logit_ratio(cpu, lg, V);
    printf("  device prefill of %zu tokens: max |diff| / range %.2e, argmax cpu %d device %d\n", n, ratio,
           mdl_argmax(cpu, V), mdl_argmax(lg, V));
    assert_true(ratio <= t->tol);
    assert_int_equal(mdl_argmax(cpu, V), mdl_argmax(lg, V));
    /* the next step from the device-written cache and from the uploaded one */
    assert_int_equal(mdl_dev_seq_create(t->d, n + 2, &up), RI_OK);
    assert_int_equal(mdl_dev_seq_upload(t->d, up, cpu_seq), RI_OK);
    int32_t tok = mdl_argmax(cpu, V);
    assert_int_equal(mdl_dev_decode(t->d, &s, &tok, 1, lg), RI_OK);
    assert_int_equal(mdl_dev_decode(t->d, &up, &tok, 1, lg + V), RI_OK);
    double r2 = tm_logit_ratio(lg + V, lg, V);
    printf("  next step from the device prefill vs the upload: ratio %.2e\n", r2);
    assert_true(r2 <= t->tol);
    mdl_dev_seq_destroy(up);
    mdl_dev_seq_destroy(s);
    free(lg);
}

static void td_prefill(td_run_t *t, int p, const int32_t *ids, size_t n)
{
    td_prefill_attn(t, p, ids, n, "full", NULL, TD_STEPS);
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

/* Load the model at path into t->m and create its device copy t->d; fails
 * the test (saying why) on either error. */
static void td_open(td_run_t *t, const char *path)
{
    char err[512];
    if (mdl_model_load(path, &t->m, err, sizeof(err)) != RI_OK)
        fprintf(stderr, "%s: %s\n", path, err);
    assert_non_null(t->m);
    ri_status_t st = mdl_dev_create(t->m, &t->d, err, sizeof(err));
    if (st != RI_OK)
        fprintf(stderr, "mdl_dev_create: %s\n", err);
    assert_int_equal(st, RI_OK);
}

/* The cross-check on the model at path; text: the first prompt is text
 * (else token ids, for the synthetic models' placeholder vocabulary). */
static void td_xcheck_path(const char *name, const char *path, bool text, size_t long_prompt)
{
    td_run_t t;
    memset(&t, 0, sizeof(t));
    /* fp16 weights in the file leave the device only its sums' order to differ by */
    t.tol = text ? TD_TOL : TD_TOL_SYNTH;
    td_open(&t, path);
    const mdl_hparams_t *hp = mdl_model_hparams(t.m);
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
    td_dev_prefill(&t, ids, n2, t.lc + hp->n_vocab, t.cpu[1]);
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

/* ---- retroinfer on the device against the CPU's in-process backend ---- */

#define TD_RETRO_STEPS 64
#define TD_RETRO_PROMPT 100


/* The model at path (head_dim 64): sequence 0 decodes with "retroinfer",
 * sequence 1 with "full", in one batch (the first half of the steps) and
 * one at a time, on the CPU and on the device, for 64 greedy steps: same
 * tokens, logits within 1e-3 of their range; the device's retroinfer read
 * fewer tokens exactly than full attention would.  With fill TD_DEVICE
 * the retroinfer sequence is prefilled on the device (mdl_dev_prefill),
 * with TD_PREFIX a loaded prefix is continued there; either way it is
 * indexed at its first decode step instead of at an upload.  Then the
 * device's refusals of what it does not do. */
static void td_retro_path(const char *name, const char *path, td_fill_t fill)
{
    char err[512];
    td_run_t t;
    mdl_attn_cfg_t cfg;
    memset(&t, 0, sizeof(t));
    t.tol = TD_TOL_SYNTH;
    tm_synth_wave_cfg(&cfg);
    td_open(&t, path);
    const mdl_hparams_t *hp = mdl_model_hparams(t.m);
    t.lc = malloc(2 * hp->n_vocab * sizeof(float));
    t.lg = malloc(2 * hp->n_vocab * sizeof(float));
    int32_t ids[TD_RETRO_PROMPT];
    for (size_t i = 0; i < TD_RETRO_PROMPT; i++)
        ids[i] = (int32_t)((i * 37 + 5) % hp->n_vocab);
    td_prefill_on(&t, 0, ids, TD_RETRO_PROMPT, "retroinfer", &cfg, TD_RETRO_STEPS, fill);
    td_prefill_attn(&t, 1, ids + 20, TD_RETRO_PROMPT - 20, "full", &cfg, TD_RETRO_STEPS);
    for (int s = 0; s < TD_RETRO_STEPS; s++)
        td_step(&t, s, s < TD_RETRO_STEPS / 2);

    mdl_attn_stats_t cs, ds;
    mdl_seq_attn_stats(t.cpu[0], &cs);
    mdl_dev_seq_attn_stats(t.dev[0], &ds);
    uint64_t dense = 0; /* what full attention reads over the same layer-steps */
    for (int s = 0; s < TD_RETRO_STEPS; s++)
        dense += TD_RETRO_PROMPT + (uint64_t)s + 1;
    dense *= ds.decode_steps / TD_RETRO_STEPS;
    printf("%s retroinfer: %llu layer-steps, %llu tokens exact on the device (CPU %llu; full would read %llu), "
           "cluster size %u\n", name, (unsigned long long)ds.decode_steps, (unsigned long long)ds.exact_tokens,
           (unsigned long long)cs.exact_tokens, (unsigned long long)dense, ds.tokens_per_cluster);
    assert_int_equal(ds.decode_steps, cs.decode_steps);
    assert_true(ds.decode_steps > 0 && ds.exact_tokens < dense);
    assert_int_equal(ds.tokens_per_cluster, 4);
    /* the retroinfer sequence holds its index beside a cache of the same room */
    uint64_t kv_bytes = 2ull * hp->n_layers * hp->n_kv_heads * mdl_dev_seq_cap(t.dev[0]) * hp->head_dim * 2;
    assert_true(mdl_dev_seq_bytes(t.dev[0]) > kv_bytes);
#ifdef TD_HOST_KERNELS
    if (fill == TD_UPLOAD) /* the same K/V bits, index and sets on the host */
        assert_int_equal(ds.exact_tokens, cs.exact_tokens);
#endif

    /* refused: another attention, a per-head adaptive cut */
    mdl_dev_seq_t *none = NULL;
    assert_int_equal(mdl_dev_seq_create_attn(t.d, 64, "quest", &cfg, &none, err, sizeof(err)), RI_ERR_UNSUPPORTED);
    cfg.wave.adapt_tau = 0.1f;
    assert_int_equal(mdl_dev_seq_create_attn(t.d, 64, "retroinfer", &cfg, &none, err, sizeof(err)),
                     RI_ERR_UNSUPPORTED);
    assert_non_null(strstr(err, "adapt_tau"));
    assert_null(none);
    printf("retroinfer cross-check %s%s: passed, worst max |diff| / range %.2e over %d steps x 2 sequences\n", name,
           fill == TD_DEVICE ? " (prefilled on the device)" : fill == TD_PREFIX ? " (a prefix loaded, the rest prefilled on the device)" : "", t.worst, TD_RETRO_STEPS);
    for (int p = 0; p < 2; p++) {
        mdl_dev_seq_destroy(t.dev[p]);
        mdl_seq_destroy(t.cpu[p]);
    }
    mdl_dev_destroy(t.d);
    mdl_model_destroy(t.m);
    free(t.lc);
    free(t.lg);
}

static void td_retro_synth(bool gemma)
{
    char path[] = "/tmp/ri-test-model-dev-XXXXXX";
    int fd = mkstemp(path);
    assert_true(fd >= 0);
    close(fd);
    assert_true(tm_synth_write_shape(path, gemma, tm_synth_shape_wave(gemma)));
    td_retro_path(gemma ? "synthetic-gemma3" : "synthetic-llama", path, TD_UPLOAD);
    td_retro_path(gemma ? "synthetic-gemma3" : "synthetic-llama", path, TD_DEVICE);
    td_retro_path(gemma ? "synthetic-gemma3" : "synthetic-llama", path, TD_PREFIX);
    unlink(path);
}

static void test_synth_llama_retroinfer_matches_cpu(void **state)
{
    (void)state;
    td_retro_synth(false);
}

static void test_synth_gemma3_retroinfer_matches_cpu(void **state)
{
    (void)state;
    td_retro_synth(true); /* its sliding-window layers stay exact over their window */
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

/* K of head h of layer l of s, its first n tokens, into out [n][head_dim]. */
static void td_seq_k_head(const mdl_dev_seq_t *s, uint32_t l, uint32_t h, cm_fp16_t *out, size_t n)
{
    size_t dim = s->d->hp.head_dim;
    assert_int_equal(mdl_dk_d2h(out, mdl_dev_seq_kv(s, l, 0) + h * s->cap * dim, n * dim * 2), RI_OK);
}

/* The synthetic tiny preset, twice: the engine from the GGUF file
 * (mdl_dev_create, as the worker) and the engine whose weights the device
 * generated (mdl_dev_create_synth); both against the CPU model of the file. */
static void test_synth_preset_matches_cpu(void **state)
{
    (void)state;
    char path[] = "/tmp/ri-test-model-dev-synth-XXXXXX", err[256];
    const mdl_synth_preset_t *p = mdl_synth_preset_find("tiny");
    mdl_model_t *m = NULL;
    mdl_dev_t *d = NULL;
    int fd = mkstemp(path);
    assert_true(fd >= 0);
    close(fd);
    assert_int_equal(mdl_synth_write_gguf(p, 7, path, err, sizeof(err)), RI_OK);
    td_xcheck_path("synthetic-tiny (file)", path, false, 0);
    assert_int_equal(mdl_model_load(path, &m, err, sizeof(err)), RI_OK);
    if (mdl_dev_create_synth(p, 7, &d, err, sizeof(err)) != RI_OK)
        fail_msg("mdl_dev_create_synth: %s", err);
    const mdl_hparams_t *hp = mdl_model_hparams(m);
    assert_int_equal(mdl_dev_hparams(d)->n_vocab, hp->n_vocab);
    float *lc = malloc(hp->n_vocab * sizeof(float)), *lg = malloc(hp->n_vocab * sizeof(float));
    int32_t prompt[19];
    mdl_seq_t *cs = NULL;
    mdl_dev_seq_t *ds = NULL;
    assert_true(lc != NULL && lg != NULL);
    for (int i = 0; i < 19; i++)
        prompt[i] = (int32_t)((i * 53 + 11) % hp->n_vocab);
    assert_int_equal(mdl_seq_create(m, mdl_attn_find("full"), NULL, 19 + TD_STEPS + 1, &cs), RI_OK);
    assert_int_equal(mdl_prefill(m, cs, prompt, 19, lc, NULL, NULL, NULL), RI_OK);
    assert_int_equal(mdl_dev_seq_create(d, 19 + TD_STEPS + 1, &ds), RI_OK);
    assert_int_equal(mdl_dev_seq_upload(d, ds, cs), RI_OK);
    double worst = 0;
    for (int k = 0; k < TD_STEPS; k++) {
        int32_t tok = mdl_argmax(lc, hp->n_vocab);
        assert_int_equal(mdl_decode(m, &cs, &tok, 1, lc), RI_OK);
        assert_int_equal(mdl_dev_decode(d, &ds, &tok, 1, lg), RI_OK);
        float lo = INFINITY, hi = -INFINITY;
        double diff = 0;
        for (uint32_t v = 0; v < hp->n_vocab; v++) {
            lo = fminf(lo, lc[v]);
            hi = fmaxf(hi, lc[v]);
            double e = fabs((double)lc[v] - lg[v]);
            diff = e > diff || isnan(e) ? e : diff;
        }
        double ratio = diff / (double)(hi - lo);
        assert_false(isnan(ratio));
        assert_true(ratio <= TD_TOL_SYNTH);
        worst = ratio > worst ? ratio : worst;
    }
    printf("synthetic tiny, weights generated on the device: worst max |diff| / range %.2e over %d steps\n", worst,
           TD_STEPS);
    /* a filled sequence: every layer holds layer 0's K/V, tiles repeat */
    mdl_dev_seq_t *f = NULL;
    size_t n = 40000, dim = hp->head_dim;   /* past one 16K tile */
    assert_int_equal(mdl_dev_seq_create(d, n + 2, &f), RI_OK);
    assert_int_equal(mdl_dev_seq_fill_synth(d, f, n + 3, 1), RI_ERR_RANGE);
    assert_int_equal(mdl_dev_seq_fill_synth(d, f, n, 1), RI_OK);
    assert_int_equal(mdl_dev_seq_len(f), n);
    cm_fp16_t *k0 = malloc(n * dim * 2), *kl = malloc(n * dim * 2);
    assert_true(k0 != NULL && kl != NULL);
    td_seq_k_head(f, 0, 1, k0, n);
    td_seq_k_head(f, hp->n_layers - 1, 1, kl, n);
    assert_memory_equal(k0, kl, n * dim * 2);
    assert_memory_equal(k0, k0 + 16384 * dim, (n - 16384) * dim * 2);
    bool nonzero = false;
    for (size_t i = 0; i < 16384 * dim && !nonzero; i++)
        nonzero = k0[i] != 0;
    assert_true(nonzero);
    int32_t tok = 3;
    assert_int_equal(mdl_dev_decode(d, &f, &tok, 1, lg), RI_OK);
    for (uint32_t v = 0; v < hp->n_vocab; v++)
        assert_true(isfinite(lg[v]));
    free(k0);
    free(kl);
    mdl_dev_seq_destroy(f);
    mdl_dev_seq_destroy(ds);
    mdl_seq_destroy(cs);
    mdl_dev_destroy(d);
    mdl_model_destroy(m);
    free(lc);
    free(lg);
    unlink(path);
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

/* argv[1] "--synthetic-only": the kernels and the synthetic models only
 * (seconds; the sanitizer run's test_model_dev_host_synth), not SmolLM2 and
 * Gemma 3 (minutes over the host stand-ins). */
int main(int argc, char **argv)
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
        cmocka_unit_test(test_synth_llama_retroinfer_matches_cpu),
        cmocka_unit_test(test_synth_gemma3_retroinfer_matches_cpu),
        cmocka_unit_test(test_synth_preset_matches_cpu),
        cmocka_unit_test(test_smollm2_matches_cpu),   /* the installed models last: */
        cmocka_unit_test(test_gemma3_matches_cpu),    /* --synthetic-only stops before them */
    };
    bool synth_only = argc > 1 && strcmp(argv[1], "--synthetic-only") == 0;
    size_t n = sizeof(tests) / sizeof(tests[0]) - (synth_only ? 2 : 0);
    return _cmocka_run_group_tests("test_model_dev", tests, n, NULL, NULL);
}
