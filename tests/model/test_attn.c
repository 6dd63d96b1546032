/*
 * Attention: the model's exact causal attention (flash loop, SIMD score/PV
 * kernels, threads) against the double-precision reference on awkward
 * shapes; the backends' decode against it (full exactly; the sparse ones
 * exactly while the context is too short to index, finite and close after);
 * the two cache layouts (same bits; what a cache that gave back its middle
 * keeps); the backend registry.
 */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <cmocka.h>

#include "common/cm_half.h"
#include "common/cm_thread.h"
#include "gpuworker/model/mdl_attn.h"
#include "gpuworker/model/mdl_kv_mem.h"
#include "gpuworker/model/mdl_vec.h"

static uint64_t rng;
static mdl_kv_layout_t layout = MDL_KV_HEAD_MAJOR; /* of make_kv's caches */

static float frand(void)
{
    rng = rng * 6364136223846793005ull + 1442695040888963407ull;
    return (float)(rng >> 40) / 8388608.0f - 1.0f;
}

static mdl_kv_t *make_kv(uint32_t nh, uint32_t nkv, uint32_t d, size_t n, float kscale)
{
    mdl_attn_geom_t g = {.n_layers = 2, .n_heads = nh, .n_kv_heads = nkv, .head_dim = d};
    mdl_kv_t *kv;
    assert_int_equal(mdl_kv_create(&g, n + 8, layout, &kv), RI_OK);
    float *k = malloc(n * nkv * d * sizeof(float)), *v = malloc(n * nkv * d * sizeof(float));
    for (size_t i = 0; i < n * nkv * d; i++)
        k[i] = kscale * frand(), v[i] = frand();
    for (uint32_t l = 0; l < 2; l++)
        mdl_kv_store(kv, l, 0, n, k, v);
    kv->len = n;
    free(k), free(v);
    return kv;
}

static double rel_l2(const float *a, const float *b, size_t n)
{
    double e = 0, s = 0;
    for (size_t i = 0; i < n; i++) {
        if (!isfinite(a[i]))
            return INFINITY;
        e += ((double)a[i] - b[i]) * ((double)a[i] - b[i]);
        s += (double)b[i] * b[i];
    }
    return sqrt(e / (s > 0 ? s : 1));
}

static void check_exact_win(cm_pool_t *pool, uint32_t nh, uint32_t nkv, uint32_t d, size_t pos, size_t n,
                            size_t window)
{
    mdl_kv_t *kv = make_kv(nh, nkv, d, pos + n, 2.0f);
    size_t qn = n * nh * d;
    float *q = malloc(qn * sizeof(float)), *o = malloc((qn + 4) * sizeof(float)), *r = malloc(qn * sizeof(float));
    for (size_t i = 0; i < qn; i++)
        q[i] = frand();
    for (int g = 0; g < 4; g++)
        o[qn + g] = -777.0f;
    if (window == 0) {
        assert_int_equal(mdl_attn_exact(pool, kv, 1, pos, n, q, o), RI_OK);
        mdl_attn_exact_ref(kv, 1, pos, n, q, r);
    } else {
        assert_int_equal(mdl_attn_exact_win(pool, kv, 1, pos, n, window, q, o), RI_OK);
        mdl_attn_exact_win_ref(kv, 1, pos, n, window, q, r);
    }
    double e = rel_l2(o, r, qn);
    if (!(e < 1e-5))
        fail_msg("exact attention h%u/%u d%u pos %zu n %zu window %zu: rel err %.3g", nh, nkv, d, pos, n, window, e);
    for (int g = 0; g < 4; g++)
        assert_true(o[qn + g] == -777.0f);
    free(q), free(o), free(r);
    mdl_kv_destroy(kv);
}

static void check_exact(cm_pool_t *pool, uint32_t nh, uint32_t nkv, uint32_t d, size_t pos, size_t n)
{
    check_exact_win(pool, nh, nkv, d, pos, n, 0);
}

/* A windowed result must differ from the full one where the window cuts
 * keys off: the reference honours the window, not just the kernel. */
static void check_window_matters(void)
{
    mdl_kv_t *kv = make_kv(4, 1, 256, 40, 2.0f);
    float q[4 * 256], full[4 * 256], win[4 * 256];
    for (size_t i = 0; i < 4 * 256; i++)
        q[i] = frand();
    mdl_attn_exact_win_ref(kv, 1, 39, 1, 0, q, full);
    mdl_attn_exact_win_ref(kv, 1, 39, 1, 8, q, win);
    assert_true(rel_l2(win, full, 4 * 256) > 1e-3);
    mdl_kv_destroy(kv);
}

/* Gemma's GeGLU (vector exp path and scalar tail) against the tanh GELU in
 * double, over lengths that leave tails and arguments up to |x| = 12. */
static void test_vec_geglu(void **state)
{
    (void)state;
    for (size_t n = 1; n <= 37; n += 4) {
        float g[40], u[40];
        double want[40];
        for (size_t i = 0; i < n; i++) {
            g[i] = 12.0f * frand(), u[i] = frand();
            double x = g[i];
            want[i] = 0.5 * x * (1 + tanh(sqrt(2 / M_PI) * (x + 0.044715 * x * x * x))) * u[i];
        }
        mdl_vec_geglu(g, u, n);
        for (size_t i = 0; i < n; i++)
            if (!(fabs(g[i] - want[i]) <= 1e-5 * (1 + fabs(want[i]))))
                fail_msg("geglu n %zu [%zu]: %.8g, want %.8g", n, i, g[i], want[i]);
    }
}

static void test_exact_matches_reference(void **state)
{
    cm_pool_t *pool = *state;
    check_exact(pool, 9, 3, 64, 0, 1);
    check_exact(pool, 9, 3, 64, 0, 17);
    check_exact(pool, 9, 3, 64, 5, 3);
    check_exact(pool, 9, 3, 64, 100, 130);    /* crosses key tiles and query blocks */
    check_exact(NULL, 9, 3, 64, 300, 1);
    check_exact(pool, 4, 4, 32, 40, 33);      /* no GQA, generic head_dim */
    check_exact(pool, 8, 1, 24, 7, 9);        /* one KV head, odd width */
    check_exact(pool, 2, 2, 64, 1000, 3);
    /* Gemma 3's local layers: 4 query heads on 1 KV head of 256, sliding window */
    check_exact_win(pool, 4, 1, 256, 0, 40, 16);      /* window inside the first block */
    check_exact_win(pool, 4, 1, 256, 300, 70, 130);   /* window crosses key tiles */
    check_exact_win(NULL, 4, 1, 256, 700, 1, 512);    /* decode: one query */
    check_exact_win(pool, 4, 1, 256, 0, 100, 1);      /* each query sees itself only */
    check_exact_win(pool, 9, 3, 64, 5, 20, 1000);     /* window wider than the context */
    check_exact(pool, 8, 1, 32, 30, 150);             /* two groups of 4 rows per KV head */
    check_exact(pool, 12, 2, 48, 3, 40);              /* 4 + 2 rows: the one-row kernels finish */
    check_window_matters();
}

/* Both layouts hold the same rows: exact attention gives the same bits,
 * and a copy between them (a full sequence forked to a remote one) moves
 * every row. */
static void test_layouts_agree(void **state)
{
    cm_pool_t *pool = *state;
    const uint32_t nh = 9, nkv = 3, d = 64;
    const size_t n = 300, qn = 40 * nh * d;
    float *q = malloc(qn * sizeof(float)), *oh = malloc(qn * sizeof(float)), *ot = malloc(qn * sizeof(float));
    for (size_t i = 0; i < qn; i++)
        q[i] = frand();
    uint64_t seed = rng;
    layout = MDL_KV_HEAD_MAJOR;
    mdl_kv_t *hm = make_kv(nh, nkv, d, n, 2.0f);
    rng = seed;
    layout = MDL_KV_TOKEN_MAJOR;
    mdl_kv_t *tm = make_kv(nh, nkv, d, n, 2.0f);
    layout = MDL_KV_HEAD_MAJOR;
    assert_true(mdl_kv_is_token_major(tm));
    assert_false(mdl_kv_is_token_major(hm));
    assert_int_equal(mdl_attn_exact(pool, hm, 1, n - 40, 40, q, oh), RI_OK);
    assert_int_equal(mdl_attn_exact(pool, tm, 1, n - 40, 40, q, ot), RI_OK);
    assert_memory_equal(oh, ot, qn * sizeof(float));

    mdl_attn_geom_t g = hm->geom;
    mdl_kv_t *back = NULL;
    assert_int_equal(mdl_kv_create(&g, n + 8, MDL_KV_HEAD_MAJOR, &back), RI_OK);
    assert_int_equal(mdl_kv_copy(back, tm, n), RI_OK);
    for (uint32_t l = 0; l < 2; l++)
        for (uint32_t h = 0; h < nkv; h++)
            for (size_t t = 0; t < n; t++) {
                assert_memory_equal(mdl_kv_krow(back, l, h, t), mdl_kv_krow(hm, l, h, t), d * sizeof(cm_fp16_t));
                assert_memory_equal(mdl_kv_vrow(back, l, h, t), mdl_kv_vrow(hm, l, h, t), d * sizeof(cm_fp16_t));
            }
    mdl_kv_destroy(back);
    mdl_kv_destroy(hm);
    mdl_kv_destroy(tm);
    free(q), free(oh), free(ot);
}

/* What a cache keeps once its middle is given back (a remote sequence
 * keeps its sinks and its recent tokens): token-major, the pages of those
 * tokens and at most one more page at each end of the two runs a layer;
 * head-major, a partly used page at each end of every head's run, more. */
static void test_layout_release_keeps_tokens(void **state)
{
    (void)state;
    const uint32_t nkv = 3, d = 64;
    const size_t n = 4096, sinks = 4, tail = 77, tok = (size_t)nkv * d * sizeof(cm_fp16_t), page = 4096;
    uint64_t kept[2];
    for (int i = 0; i < 2; i++) {
        layout = i ? MDL_KV_TOKEN_MAJOR : MDL_KV_HEAD_MAJOR;
        mdl_kv_t *kv = make_kv(9, nkv, d, n, 1.0f);
        for (uint32_t l = 0; l < 2; l++)
            (void)mdl_kv_release(kv, l, sinks, n - tail);
        kept[i] = mdl_kv_resident_bytes(kv);
        mdl_kv_destroy(kv);
    }
    layout = MDL_KV_HEAD_MAJOR;
    /* 2 layers x K, V; each run: its tokens (the cap's 8 spare ones
     * included) plus a page at each end */
    uint64_t bound = 4u * ((sinks + tail + 8) * tok + 4 * page);
    if (kept[1] > bound || kept[1] >= kept[0])
        fail_msg("kept after release: token-major %llu B (bound %llu), head-major %llu B", (unsigned long long)kept[1],
                 (unsigned long long)bound, (unsigned long long)kept[0]);
}

/* A query's result depends on its position alone, not on the chunk it was
 * prefilled in: the same positions in one call, in chunks of 64, 128 and
 * an odd split, and one query at a time (decode), give the same bits, with
 * and without Gemma's window (this is what lets the prefill chunk change). */
static void test_exact_chunk_invariant(void **state)
{
    cm_pool_t *pool = *state;
    static const size_t windows[2] = {0, 512};
    static const size_t splits[4] = {64, 128, 37, 1};
    size_t pos = 200, n = 700, qd = 4 * 256;
    mdl_kv_t *kv = make_kv(4, 1, 256, pos + n, 2.0f);
    float *q = malloc(n * qd * sizeof(float)), *one = malloc(n * qd * sizeof(float));
    float *part = malloc(n * qd * sizeof(float));
    for (size_t i = 0; i < n * qd; i++)
        q[i] = frand();
    for (int w = 0; w < 2; w++) {
        assert_int_equal(mdl_attn_exact_win(pool, kv, 1, pos, n, windows[w], q, one), RI_OK);
        for (int k = 0; k < 4; k++) {
            for (size_t done = 0; done < n; done += splits[k]) {
                size_t c = n - done < splits[k] ? n - done : splits[k];
                assert_int_equal(
                    mdl_attn_exact_win(pool, kv, 1, pos + done, c, windows[w], q + done * qd, part + done * qd),
                    RI_OK);
            }
            if (memcmp(one, part, n * qd * sizeof(float)) != 0)
                fail_msg("window %zu: chunks of %zu differ from one call", windows[w], splits[k]);
        }
    }
    free(q), free(one), free(part);
    mdl_kv_destroy(kv);
}

/* Attention that is sparse, as in real models: weak random keys, and a few
 * "needle" tokens whose keys align with the queries of their KV head. */
static mdl_kv_t *make_sparse_kv(size_t n, float *q)
{
    mdl_kv_t *kv = make_kv(9, 3, 64, n, 0.3f);
    static const size_t needles[] = {500, 1200, 2100, 2500, 2900};
    for (uint32_t h = 0; h < 3; h++) {
        float u[64], k[3 * 64], v[3 * 64];
        for (int e = 0; e < 64; e++)
            u[e] = frand();
        for (uint32_t t = 0; t < 3; t++)
            for (int e = 0; e < 64; e++)
                q[(h * 3 + t) * 64 + e] = u[e] + 0.1f * frand();
        for (size_t i = 0; i < sizeof(needles) / sizeof(needles[0]); i++) {
            if (needles[i] >= n)
                continue;
            /* store only head h's row: read the token's K/V, replace, write back */
            for (uint32_t hh = 0; hh < 3; hh++)
                for (int e = 0; e < 64; e++) {
                    k[hh * 64 + e] = cm_fp16_to_f32(mdl_kv_krow(kv, 1, hh, needles[i])[e]);
                    v[hh * 64 + e] = cm_fp16_to_f32(mdl_kv_vrow(kv, 1, hh, needles[i])[e]);
                }
            for (int e = 0; e < 64; e++)
                k[h * 64 + e] = 5.0f * u[e];
            mdl_kv_store(kv, 1, needles[i], 1, k, v);
        }
    }
    return kv;
}

static void decode_vs_exact(const char *name, size_t n, double tol)
{
    const mdl_attn_ops_t *ops = mdl_attn_find(name);
    if (ops == NULL)   /* every backend this test names is part of the build: a missing one is a failure */
        fail_msg("backend %s is not registered", name);
    float q[9 * 64], o[9 * 64], r[9 * 64];
    mdl_kv_t *kv = make_sparse_kv(n, q);
    mdl_attn_cfg_t cfg;
    mdl_attn_cfg_default(&cfg);
    void *st;
    assert_int_equal(ops->create(&cfg, kv, &st), RI_OK);
    /* the prompt is [0, n-1); the last token is "decoded" */
    kv->len = n - 1;
    for (uint32_t l = 0; l < 2; l++)
        assert_int_equal(ops->prefill_end(st, l), RI_OK);
    kv->len = n;
    assert_int_equal(ops->decode(st, 1, n - 1, q, o), RI_OK);
    mdl_attn_exact_ref(kv, 1, n - 1, 1, q, r);
    double e = rel_l2(o, r, 9 * 64);
    printf("%-10s n=%5zu rel L2 error %.2e (limit %.0e)\n", name, n, e, tol);
    if (!(e <= tol))
        fail_msg("%s decode at n=%zu: rel err %.3g > %.3g", name, n, e, tol);
    mdl_attn_stats_t as;
    ops->stats(st, &as);
    assert_int_equal(as.decode_steps, 1);
    ops->destroy(st);
    mdl_kv_destroy(kv);
}

static void test_backends_decode(void **state)
{
    (void)state;
    decode_vs_exact("full", 700, 1e-5);
    /* too short to index (< 4 + 64 + 1024): every method that keeps the
     * whole steady zone is exact */
    decode_vs_exact("retroinfer", 900, 1e-5);
    /* indexed: an approximation that must find the needles */
    decode_vs_exact("retroinfer", 3000, 0.1);
    decode_vs_exact("quest", 3000, 0.1);
    decode_vs_exact("oracle", 3000, 0.1);
    decode_vs_exact("streaming", 60, 1e-5);   /* whole context fits the window */
}

static void test_registry(void **state)
{
    (void)state;
    assert_non_null(mdl_attn_find("full"));
    assert_null(mdl_attn_find("nope"));
    assert_non_null(strstr(mdl_attn_names(), "full"));
    static mdl_attn_ops_t dup;
    dup = *mdl_attn_find("full");
    assert_int_equal(mdl_attn_register(&dup), RI_ERR_EXISTS);
    dup.name = "full-copy";
    assert_int_equal(mdl_attn_register(&dup), RI_OK);
    assert_ptr_equal(mdl_attn_find("full-copy"), &dup);
    mdl_attn_ops_t bad = {.name = "bad"};
    assert_int_equal(mdl_attn_register(&bad), RI_ERR_INVALID);
    mdl_attn_cfg_t cfg;
    mdl_attn_cfg_default(&cfg);
    /* the share (18) is under the floor at 1,000 tokens, over it at 100,000 */
    assert_int_equal(mdl_attn_auto_budget(&cfg, 1000), 4 + 64 + 256);
    assert_int_equal(mdl_attn_auto_budget(&cfg, 100000), 4 + 64 + 1800);
    cfg.wave.retrieval_min_tokens = 0;
    assert_int_equal(mdl_attn_auto_budget(&cfg, 1000), 4 + 64 + 18);
    cfg.budget_tokens = 77;
    assert_int_equal(mdl_attn_auto_budget(&cfg, 1000), 77);
}

static int setup(void **state)
{
    rng = (uint64_t)time(NULL);
    cm_pool_t *pool;
    if (cm_pool_create(3, &pool) != RI_OK)
        return -1;
    *state = pool;
    return 0;
}

static int teardown(void **state)
{
    cm_pool_destroy(*state);
    return 0;
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_exact_matches_reference),
        cmocka_unit_test(test_exact_chunk_invariant),
        cmocka_unit_test(test_layouts_agree),
        cmocka_unit_test(test_layout_release_keeps_tokens),
        cmocka_unit_test(test_vec_geglu),
        cmocka_unit_test(test_backends_decode),
        cmocka_unit_test(test_registry),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
