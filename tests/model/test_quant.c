/*
 * Dequantising matmul cross-check: for every storage type, random weights
 * (fresh each run, never zeros) and awkward shapes, the optimised expand,
 * dot and threaded matmul against the scalar reference; guard values after
 * the outputs catch overruns; the int8-activation decode path within its
 * looser bound; and one deliberately corrupted result that the checker must
 * catch (testing the tester).
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
#include "gpuworker/model/mdl_quant.h"

static uint64_t rng;

static uint32_t rnd(void)
{
    rng = rng * 6364136223846793005ull + 1442695040888963407ull;
    return (uint32_t)(rng >> 33);
}

static float frand(void)
{
    return (float)rnd() / 2147483648.0f - 1.0f;   /* [-1, 1) */
}

typedef struct wbuf {
    mdl_weight_t w;
    uint8_t *data;
} wbuf_t;

/* Random weights of a type: random payload bytes, sane fp16 scales. */
static wbuf_t make_weight(mdl_ggml_type_t type, size_t rows, size_t cols)
{
    uint32_t be, bb;
    assert_true(mdl_ggml_type_block(type, &be, &bb));
    wbuf_t b;
    b.w = (mdl_weight_t){.type = type, .rows = rows, .cols = cols, .row_bytes = cols / be * bb};
    b.data = malloc(rows * b.w.row_bytes);
    for (size_t i = 0; i < rows * b.w.row_bytes; i++)
        b.data[i] = (uint8_t)rnd();
    for (size_t r = 0; r < rows; r++) {
        uint8_t *row = b.data + r * b.w.row_bytes;
        if (type == MDL_GGML_F32) {
            for (size_t i = 0; i < cols; i++) {
                float v = frand();
                memcpy(row + 4 * i, &v, 4);
            }
        } else if (type == MDL_GGML_F16 || type == MDL_GGML_BF16) {
            for (size_t i = 0; i < cols; i++) {
                uint16_t h = type == MDL_GGML_F16 ? cm_f32_to_fp16(frand()) : cm_f32_to_bf16(frand());
                memcpy(row + 2 * i, &h, 2);
            }
        } else if (type == MDL_GGML_Q4_K || type == MDL_GGML_Q6_K) {
            for (size_t blk = 0; blk < cols / 256; blk++) {
                uint8_t *p = row + blk * bb;
                uint16_t d = cm_f32_to_fp16(0.001f + 0.01f * fabsf(frand())), m = cm_f32_to_fp16(0.01f * frand());
                memcpy(p + (type == MDL_GGML_Q6_K ? 208 : 0), &d, 2);
                if (type == MDL_GGML_Q4_K)
                    memcpy(p + 2, &m, 2);
            }
        } else {
            for (size_t blk = 0; blk < cols / 32; blk++) {
                uint8_t *p = row + blk * bb;
                uint16_t d = cm_f32_to_fp16(0.01f + 0.1f * fabsf(frand())), m = cm_f32_to_fp16(0.1f * frand());
                memcpy(p, &d, 2);
                if (type == MDL_GGML_Q4_1)
                    memcpy(p + 2, &m, 2);
            }
        }
    }
    b.w.data = b.data;
    return b;
}

/* Largest |a-b| / scale over n; scale[i] = sum |w x| of that dot product. */
static double worst_rel(const float *a, const float *b, const double *scale, size_t n)
{
    double w = 0;
    for (size_t i = 0; i < n; i++) {
        if (!isfinite(a[i]))
            return INFINITY;
        double e = fabs((double)a[i] - b[i]) / (scale[i] > 1e-30 ? scale[i] : 1.0);
        w = e > w ? e : w;
    }
    return w;
}

static const mdl_ggml_type_t types[] = {MDL_GGML_F32,  MDL_GGML_F16,  MDL_GGML_BF16, MDL_GGML_Q4_0,
                                        MDL_GGML_Q4_1, MDL_GGML_Q8_0, MDL_GGML_Q5_0};
/* super-block types: rows a multiple of 256 */
static const mdl_ggml_type_t ktypes[] = {MDL_GGML_Q4_K, MDL_GGML_Q6_K};

static void check_shape(cm_pool_t *pool, mdl_ggml_type_t type, size_t rows, size_t cols, size_t n)
{
    wbuf_t wb = make_weight(type, rows, cols);
    float *x = malloc(n * cols * sizeof(float));
    float *y = malloc((n * rows + 8) * sizeof(float));
    float *yr = malloc(n * rows * sizeof(float));
    double *sc = malloc(n * rows * sizeof(double));
    float *row = malloc(cols * sizeof(float)), *rowr = malloc(cols * sizeof(float));
    for (size_t i = 0; i < n * cols; i++)
        x[i] = frand();
    for (int g = 0; g < 8; g++)
        y[n * rows + g] = 12345.0f;   /* guards */
    /* scale of each dot: sum |w x| from the reference expansion */
    for (size_t r = 0; r < rows; r++) {
        mdl_dequant_row_ref(&wb.w, r, rowr);
        mdl_dequant_row(&wb.w, r, row);
        for (size_t k = 0; k < cols; k++)
            assert_true(row[k] == rowr[k]);   /* expansion is exact */
        for (size_t i = 0; i < n; i++) {
            double s = 0;
            for (size_t k = 0; k < cols; k++)
                s += fabs((double)rowr[k] * x[i * cols + k]);
            sc[i * rows + r] = s;
        }
    }
    mdl_matmul_ref(&wb.w, x, n, yr);
    mdl_quant_set_act(MDL_ACT_F32);
    assert_int_equal(mdl_matmul(pool, &wb.w, x, n, y), RI_OK);
    double e = worst_rel(y, yr, sc, n * rows);
    if (!(e < 1e-5))
        fail_msg("%s rows %zu cols %zu n %zu: relative error %.3g", mdl_ggml_type_name(type), rows, cols, n, e);
    for (int g = 0; g < 8; g++)
        assert_true(y[n * rows + g] == 12345.0f);
    if (n <= 4 && type != MDL_GGML_F32 && type != MDL_GGML_F16 && type != MDL_GGML_BF16) {
        /* decode paths with quantised activations (batches up to 4 rows),
         * each within its bound, and each row's result the same bits as
         * that row decoded alone: a sequence's tokens do not depend on the
         * batch it shares a step with */
        /* int16 twice: the AVX-512BW products where the CPU has them, then
         * the AVX2 ones (on other CPUs both runs take the same path) */
        static const struct { mdl_act_mode_t mode; double tol; const char *name; bool avx512; } modes[] = {
            {MDL_ACT_I16, 1e-4, "int16 (AVX-512)", true}, {MDL_ACT_I16, 1e-4, "int16 (AVX2)", false},
            {MDL_ACT_I8, 2e-2, "int8", true}};
        for (size_t k = 0; k < 3; k++) {
            mdl_quant_set_act(modes[k].mode);
            mdl_quant_set_avx512(modes[k].avx512);
            assert_int_equal(mdl_matmul(pool, &wb.w, x, n, y), RI_OK);
            mdl_quant_set_avx512(true);
            e = worst_rel(y, yr, sc, n * rows);
            if (!(e < modes[k].tol))
                fail_msg("%s %s activations rows %zu cols %zu: relative error %.3g", mdl_ggml_type_name(type),
                         modes[k].name, rows, cols, e);
            for (size_t i = 0; i < n && n > 1; i++) {
                mdl_quant_set_avx512(modes[k].avx512);
                assert_int_equal(mdl_matmul(pool, &wb.w, x + i * cols, 1, yr), RI_OK);
                mdl_quant_set_avx512(true);
                for (size_t r = 0; r < rows; r++)
                    if (memcmp(&yr[r], &y[i * rows + r], sizeof(float)) != 0)
                        fail_msg("%s %s activations, batch %zu row %zu output %zu: %.9g alone, %.9g in the batch",
                                 mdl_ggml_type_name(type), modes[k].name, n, i, r, yr[r], y[i * rows + r]);
            }
            mdl_matmul_ref(&wb.w, x, n, yr);
        }
    }
    mdl_quant_set_act(MDL_ACT_I16);
    free(x), free(y), free(yr), free(sc), free(row), free(rowr), free(wb.data);
}

static void test_matmul_all_types(void **state)
{
    cm_pool_t *pool = *state;
    static const size_t rows_list[] = {1, 2, 3, 4, 37, 100};
    static const size_t n_list[] = {1, 2, 3, 4, 5, 7, 17};
    for (size_t t = 0; t < sizeof(types) / sizeof(types[0]); t++)
        for (size_t r = 0; r < sizeof(rows_list) / sizeof(rows_list[0]); r++)
            for (size_t n = 0; n < sizeof(n_list) / sizeof(n_list[0]); n++) {
                check_shape(pool, types[t], rows_list[r], 96, n_list[n]);
                check_shape(NULL, types[t], rows_list[r], 32, n_list[n]);
            }
    for (size_t t = 0; t < sizeof(ktypes) / sizeof(ktypes[0]); t++)
        for (size_t n = 0; n < sizeof(n_list) / sizeof(n_list[0]); n++) {
            check_shape(pool, ktypes[t], 37, 512, n_list[n]);
            check_shape(NULL, ktypes[t], 3, 256, n_list[n]);
        }
    check_shape(pool, MDL_GGML_Q6_K, 64, 2048, 17);   /* Gemma's ffn_down shape */
    check_shape(pool, MDL_GGML_Q8_0, 300, 640, 1);    /* Gemma's output head rows (decode) */
    check_shape(pool, MDL_GGML_Q5_0, 64, 640, 2);     /* its Q/K/gate/up rows, two sequences */
    /* float rows that are not a multiple of the vector width */
    check_shape(pool, MDL_GGML_F32, 5, 113, 1);
    check_shape(pool, MDL_GGML_F16, 5, 113, 6);
    check_shape(pool, MDL_GGML_BF16, 3, 1001, 2);
    /* Q4_1 decode pairs blocks: rows of 5 blocks (two pairs and one), 18
     * (SmolLM2's 576) and 48 (its 1536), alone and in batches */
    for (size_t n = 1; n <= 4; n++) {
        check_shape(pool, MDL_GGML_Q4_1, 7, 160, n);
        check_shape(pool, MDL_GGML_Q4_1, 37, 576, n);
        check_shape(NULL, MDL_GGML_Q4_1, 5, 1536, n);
    }
    /* a model-sized product */
    check_shape(pool, MDL_GGML_Q4_1, 192, 576, 64);
}

/* Decode products that take several weight rows at once (the AVX2 Q5_0,
 * Q4_1, Q4_K and Q6_K kernels of mdl_quant_rows.c, four rows) must give each
 * row the same bits as the one-row kernel: every output of a product of
 * `rows` rows (37: nine groups of four and a tail of one, so both kernels
 * run) against the same row multiplied alone, as a one-row weight (which
 * only the one-row kernel takes), for one and two activation rows, on the
 * caller and the pool. */
static void check_groups_match_rows(cm_pool_t *pool, mdl_ggml_type_t type, size_t rows, size_t cols, size_t n)
{
    wbuf_t wb = make_weight(type, rows, cols);
    float *x = malloc(n * cols * sizeof(float)), *y = malloc(n * rows * sizeof(float)), y1[2];
    for (size_t i = 0; i < n * cols; i++)
        x[i] = frand();
    mdl_quant_set_act(MDL_ACT_I16);
    mdl_quant_set_avx512(false);
    assert_int_equal(mdl_matmul(pool, &wb.w, x, n, y), RI_OK);
    for (size_t r = 0; r < rows; r++) {
        mdl_weight_t one = wb.w;
        one.rows = 1;
        one.data = wb.data + r * wb.w.row_bytes;
        assert_int_equal(mdl_matmul(pool, &one, x, n, y1), RI_OK);
        for (size_t i = 0; i < n; i++)
            if (memcmp(&y1[i], &y[i * rows + r], sizeof(float)) != 0)
                fail_msg("%s, %zu x %zu, %zu activation rows: output %zu of row %zu is %.9g in the product, %.9g "
                         "alone",
                         mdl_ggml_type_name(type), rows, cols, n, i, r, y[i * rows + r], y1[i]);
    }
    mdl_quant_set_avx512(true);
    free(x), free(y), free(wb.data);
}

/* Every int-activation type at Gemma's row lengths (so another multi-row
 * kernel is held to it when added), and Q4_1 at SmolLM2's (18 and 48
 * blocks a row: the four-row kernel's prefetch runs past short rows). */
static void test_row_groups_match_rows_alone(void **state)
{
    static const mdl_ggml_type_t qtypes[] = { MDL_GGML_Q4_0, MDL_GGML_Q4_1, MDL_GGML_Q8_0,
                                              MDL_GGML_Q5_0, MDL_GGML_Q4_K, MDL_GGML_Q6_K };
    for (size_t n = 1; n <= 2; n++)
        for (int on_pool = 0; on_pool < 2; on_pool++) {
            cm_pool_t *pool = on_pool ? *state : NULL;
            for (size_t t = 0; t < sizeof(qtypes) / sizeof(qtypes[0]); t++)
                check_groups_match_rows(pool, qtypes[t], 37, t < 4 ? 640 : 1024, n); /* K-quants: 4 super-blocks */
            check_groups_match_rows(pool, MDL_GGML_Q4_1, 37, 576, n);
            check_groups_match_rows(pool, MDL_GGML_Q4_1, 37, 1536, n);
        }
}

/* A prefill product (n > 4 rows) under the default int16 activations
 * against the reference: where the CPU has AVX-512 VNNI it is the int16
 * GEMM (tiles of 48 rows, 4 activation rows per micro-kernel call, so
 * rows and n that are not multiples of either exercise the tails).  Its
 * error is the rounding of each activation to its block's int16 step
 * d = amax / 32767, at most d/2 per element: each output is checked
 * against that bound, sum_k |w_k| 0.51 d(k), plus 1e-6 of sum |w x| for the
 * fp32 arithmetic.  Odd n: every 7th activation 40 times the others
 * (uneven block ranges, the bound's worst case); even n: uniform ones,
 * then also within 1e-4 of sum |w x| as the decode products.  Guards
 * after the output catch overruns. */
static void check_gemm16(cm_pool_t *pool, mdl_ggml_type_t type, size_t rows, size_t cols, size_t n)
{
    wbuf_t wb = make_weight(type, rows, cols);
    size_t nb = cols / 32;
    float *x = malloc(n * cols * sizeof(float)), *yr = malloc(n * rows * sizeof(float));
    float *y = malloc((n * rows + 8) * sizeof(float)), *row = malloc(cols * sizeof(float));
    double *sc = calloc(n * rows, sizeof(double)), *qb = calloc(n * rows, sizeof(double));
    double *step = malloc(n * nb * sizeof(double));
    for (size_t i = 0; i < n * cols; i++)
        x[i] = frand() * (n % 2 == 1 && i % 7 == 0 ? 40.0f : 1.0f);
    for (size_t i = 0; i < n * nb; i++) {
        double amax = 0;
        for (size_t k = 0; k < 32; k++)
            amax = fmax(amax, fabs((double)x[i * 32 + k]));
        step[i] = amax / 32767.0;
    }
    for (int g = 0; g < 8; g++)
        y[n * rows + g] = 12345.0f;
    for (size_t r = 0; r < rows; r++) {
        mdl_dequant_row_ref(&wb.w, r, row);
        for (size_t i = 0; i < n; i++) {
            double s = 0, q = 0;
            for (size_t k = 0; k < cols; k++) {
                s += fabs((double)row[k] * x[i * cols + k]);
                q += fabs((double)row[k]) * 0.51 * step[i * nb + k / 32];
            }
            sc[i * rows + r] = s;
            qb[i * rows + r] = q + 1e-6 * s;
        }
    }
    mdl_matmul_ref(&wb.w, x, n, yr);
    mdl_quant_set_act(MDL_ACT_I16);
    assert_int_equal(mdl_matmul(pool, &wb.w, x, n, y), RI_OK);
    double e = worst_rel(y, yr, sc, n * rows);
    if (n % 2 == 0 && !(e < 1e-4))
        fail_msg("%s int16 prefill rows %zu cols %zu n %zu: relative error %.3g", mdl_ggml_type_name(type), rows, cols,
                 n, e);
    for (size_t o = 0; o < n * rows; o++)
        if (!(fabs((double)y[o] - yr[o]) <= qb[o]))
            fail_msg("%s int16 prefill rows %zu cols %zu n %zu, output %zu of row %zu: %.9g, reference %.9g, bound %.3g",
                     mdl_ggml_type_name(type), rows, cols, n, o % rows, o / rows, y[o], yr[o], qb[o]);
    for (int g = 0; g < 8; g++)
        assert_true(y[n * rows + g] == 12345.0f);
    free(x), free(y), free(yr), free(sc), free(qb), free(step), free(row), free(wb.data);
}

static void test_gemm16_prefill(void **state)
{
    cm_pool_t *pool = *state;
    static const mdl_ggml_type_t g16types[] = {MDL_GGML_Q4_0, MDL_GGML_Q4_1, MDL_GGML_Q8_0,
                                               MDL_GGML_Q5_0, MDL_GGML_Q4_K, MDL_GGML_Q6_K};
    static const size_t n_list[] = {5, 16, 33, 128};
    static const size_t rows_list[] = {1, 17, 48, 100};
    /* the int16 GEMM is what the default settings select where the CPU
     * has AVX-512 VNNI (elsewhere the checks below run the fp32 path), and
     * the fp32 settings turn it off */
    __builtin_cpu_init();
    bool vnni = mdl_quant_have_simd() && __builtin_cpu_supports("avx512vnni") && __builtin_cpu_supports("avx512bw");
    printf("int16 prefill GEMM: %s\n", vnni ? "AVX-512 VNNI" : "not on this CPU (fp32 path)");
    for (size_t t = 0; t < sizeof(g16types) / sizeof(g16types[0]); t++)
        assert_true(mdl_quant_gemm16_active(g16types[t]) == vnni);
    assert_false(mdl_quant_gemm16_active(MDL_GGML_F16));
    mdl_quant_set_act(MDL_ACT_F32);
    assert_false(mdl_quant_gemm16_active(MDL_GGML_Q8_0));
    mdl_quant_set_act(MDL_ACT_I16);
    mdl_quant_set_avx512(false);
    assert_false(mdl_quant_gemm16_active(MDL_GGML_Q8_0));
    mdl_quant_set_avx512(true);
    mdl_quant_force_scalar(true);
    assert_false(mdl_quant_gemm16_active(MDL_GGML_Q8_0));
    mdl_quant_force_scalar(false);
    for (size_t t = 0; t < sizeof(g16types) / sizeof(g16types[0]); t++) {
        bool k = g16types[t] == MDL_GGML_Q4_K || g16types[t] == MDL_GGML_Q6_K;
        for (size_t r = 0; r < sizeof(rows_list) / sizeof(rows_list[0]); r++)
            for (size_t n = 0; n < sizeof(n_list) / sizeof(n_list[0]); n++)
                check_gemm16(r % 2 ? pool : NULL, g16types[t], rows_list[r], k ? 512 : 96, n_list[n]);
    }
    check_gemm16(pool, MDL_GGML_Q5_0, 257, 640, 64);    /* Gemma's Q/K/gate/up rows */
    check_gemm16(pool, MDL_GGML_Q6_K, 131, 2048, 37);   /* its ffn_down shape */
    check_gemm16(pool, MDL_GGML_Q4_K, 97, 1024, 19);    /* its attention output */
    check_gemm16(pool, MDL_GGML_Q8_0, 200, 640, 5);     /* its head, a short prompt */
}

/* sc[i][r] = sum_k |W[r][k] x[i][k]| (the scale of each dot's error). */
static void abs_dots(const mdl_weight_t *w, const float *x, size_t n, double *sc)
{
    float *row = malloc(w->cols * sizeof(float));
    for (size_t r = 0; r < w->rows; r++) {
        mdl_dequant_row_ref(w, r, row);
        for (size_t i = 0; i < n; i++) {
            double s = 0;
            for (size_t k = 0; k < w->cols; k++)
                s += fabs((double)row[k] * x[i * w->cols + k]);
            sc[i * w->rows + r] = s;
        }
    }
    free(row);
}

/* Q/K/V-style fused products of mixed types: fp32 activations within 1e-4
 * of each value; the default int16 ones (prefill: the int16 GEMM for the
 * quantised weights, fp32 for the F16 one) within 1e-4 of sum |w x|. */
static void test_fused_products(void **state)
{
    cm_pool_t *pool = *state;
    static const size_t n_list[] = {1, 3, 5, 9};
    for (size_t ni = 0; ni < sizeof(n_list) / sizeof(n_list[0]); ni++) {
        size_t n = n_list[ni];
        wbuf_t a = make_weight(MDL_GGML_Q4_1, 64, 96), b = make_weight(MDL_GGML_Q8_0, 31, 96),
               c = make_weight(MDL_GGML_F16, 5, 96);
        const mdl_weight_t *ws[3] = {&a.w, &b.w, &c.w};
        float *x = malloc(n * 96 * sizeof(float));
        for (size_t i = 0; i < n * 96; i++)
            x[i] = frand();
        float *y[3], *r[3];
        double *sc[3];
        for (int k = 0; k < 3; k++) {
            y[k] = malloc(n * ws[k]->rows * sizeof(float));
            r[k] = malloc(n * ws[k]->rows * sizeof(float));
            sc[k] = malloc(n * ws[k]->rows * sizeof(double));
            mdl_matmul_ref(ws[k], x, n, r[k]);
            abs_dots(ws[k], x, n, sc[k]);
        }
        for (int mode = 0; mode < 2; mode++) {
            mdl_quant_set_act(mode == 0 ? MDL_ACT_F32 : MDL_ACT_I16);
            assert_int_equal(mdl_matmul_multi(pool, ws, 3, x, n, y), RI_OK);
            for (int k = 0; k < 3; k++)
                for (size_t i = 0; i < n * ws[k]->rows; i++)
                    assert_float_equal(y[k][i], r[k][i], mode == 0 ? 1e-4 * (1 + fabsf(r[k][i])) : 1e-4 * sc[k][i]);
        }
        mdl_quant_set_act(MDL_ACT_I16);
        for (int k = 0; k < 3; k++)
            free(y[k]), free(r[k]), free(sc[k]);
        wbuf_t d = make_weight(MDL_GGML_F32, 4, 64);
        const mdl_weight_t *bad[2] = {&a.w, &d.w};
        assert_int_equal(mdl_matmul_multi(pool, bad, 2, x, n, y), RI_ERR_INVALID);   /* cols differ */
        free(x), free(a.data), free(b.data), free(c.data), free(d.data);
    }
}

static void test_scalar_path_matches(void **state)
{
    (void)state;
    if (!mdl_quant_have_simd())
        skip();
    static const mdl_ggml_type_t all[] = {MDL_GGML_F32,  MDL_GGML_F16,  MDL_GGML_BF16, MDL_GGML_Q4_0, MDL_GGML_Q4_1,
                                          MDL_GGML_Q8_0, MDL_GGML_Q5_0, MDL_GGML_Q4_K, MDL_GGML_Q6_K};
    for (size_t t = 0; t < sizeof(all) / sizeof(all[0]); t++) {
        wbuf_t wb = make_weight(all[t], 7, 256);
        float x[256];
        for (int i = 0; i < 256; i++)
            x[i] = frand();
        for (size_t r = 0; r < 7; r++) {
            float simd = mdl_dot(&wb.w, r, x);
            mdl_quant_force_scalar(true);
            float sc = mdl_dot(&wb.w, r, x);
            mdl_quant_force_scalar(false);
            assert_float_equal(simd, sc, 1e-3 * (1 + fabsf(sc)));
        }
        free(wb.data);
    }
}

/* Where each element of Q5_0 / Q4_K / Q6_K lives, from the format, on
 * hand-built blocks (all quants at one value, one bit moved): a reference
 * that reads the wrong nibble, bit or scale fails here even when the SIMD
 * path shares its mistake. */
static void expand_one(mdl_ggml_type_t type, const uint8_t *blk, size_t n, float *out)
{
    mdl_weight_t w = {.type = type, .rows = 1, .cols = n, .row_bytes = 0, .data = blk};
    mdl_dequant_row_ref(&w, 0, out);
    float simd[256];
    mdl_dequant_row(&w, 0, simd);
    for (size_t i = 0; i < n; i++)
        assert_true(simd[i] == out[i]);
}

static void test_block_layouts(void **state)
{
    (void)state;
    uint16_t one = cm_f32_to_fp16(1.0f);
    float out[256];
    for (int e = 0; e < 32; e++) {   /* Q5_0: x = (q - 16) d; fifth bit of element e is bit e of qh */
        uint8_t b[22] = {0};
        memcpy(b, &one, 2);
        b[2 + e / 8] = (uint8_t)(1u << (e % 8));
        b[6 + e % 16] |= (uint8_t)(e < 16 ? 0x01 : 0x10);   /* low nibble: e, high: e + 16 */
        expand_one(MDL_GGML_Q5_0, b, 32, out);
        for (int i = 0; i < 32; i++)
            assert_true(out[i] == (i == e ? 1.0f : -16.0f));
    }
    for (int g = 0; g < 8; g++) {    /* Q4_K: group g of 32 gets scale 2 and min 3, others scale 1 */
        uint8_t b[144] = {0};
        memcpy(b, &one, 2);
        memcpy(b + 2, &one, 2);
        for (int k = 0; k < 4; k++)
            b[4 + k] = 1, b[12 + k] = 0x01;   /* scales of groups 0-3, 4-7 (low nibble) */
        if (g < 4)
            b[4 + g] = 2, b[8 + g] = 3;
        else
            b[12 + g - 4] = 0x32;             /* scale 2 (low nibble), min 3 (high nibble) */
        for (int i = 0; i < 128; i++)
            b[16 + i] = 0x75;                 /* low nibble 5 (even groups), high 7 (odd groups) */
        expand_one(MDL_GGML_Q4_K, b, 256, out);
        for (int i = 0; i < 256; i++) {
            int gi = i / 32;
            float q = gi % 2 == 0 ? 5.0f : 7.0f;
            assert_true(out[i] == (gi == g ? 2.0f * q - 3.0f : q));
        }
    }
    for (int e = 0; e < 256; e += 7) { /* Q6_K: all quants 32 (x = 0) but element e, scales 1..16 */
        uint8_t b[210] = {0};
        int h = e / 128, k = (e % 128) / 32, l = e % 32;
        for (int i = 0; i < 64; i++)
            b[128 + i] = 0xAA;                /* high 2 bits = 2 everywhere: q = 32 */
        for (int i = 0; i < 16; i++)
            b[192 + i] = (uint8_t)(i + 1);
        memcpy(b + 208, &one, 2);
        b[64 * h + l + 32 * (k & 1)] = (uint8_t)(k < 2 ? 0x05 : 0x50);   /* q = 37 at e */
        expand_one(MDL_GGML_Q6_K, b, 256, out);
        for (int i = 0; i < 256; i++)
            assert_true(out[i] == (i == e ? 5.0f * (float)(i / 16 + 1) : 0.0f));
    }
}

static void test_checker_catches_corruption(void **state)
{
    (void)state;
    float a[4] = {1, 2, 3, 4}, b[4] = {1, 2, 3, 4};
    double sc[4] = {1, 1, 1, 1};
    assert_true(worst_rel(a, b, sc, 4) == 0);
    a[2] += 1e-3f;   /* a wrong result must be reported */
    assert_true(worst_rel(a, b, sc, 4) > 1e-5);
    a[2] = NAN;
    assert_true(isinf(worst_rel(a, b, sc, 4)));
}

static int setup(void **state)
{
    rng = (uint64_t)time(NULL) ^ 0x5DEECE66Dull;   /* fresh inputs each run */
    printf("seed %llu\n", (unsigned long long)rng);
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
        cmocka_unit_test(test_matmul_all_types),
        cmocka_unit_test(test_gemm16_prefill),
        cmocka_unit_test(test_row_groups_match_rows_alone),
        cmocka_unit_test(test_fused_products),
        cmocka_unit_test(test_scalar_path_matches),
        cmocka_unit_test(test_block_layouts),
        cmocka_unit_test(test_checker_catches_corruption),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
