/*
 * Invariants of the kernels: with retrieval covering every cluster
 * tripartite attention equals full attention; each estimation term never
 * exceeds its cluster's true softmax mass (Jensen); merge is associative and
 * order-independent; the index build is deterministic for a fixed input and
 * thread count; the decode-time update appends 64 clusters per 1024 tokens;
 * baselines with a budget covering everything equal full attention; the
 * synthetic generator is reproducible and has the calibrated sparsity.
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
#include <unistd.h>
#include <cmocka.h>

#include "kernels/kn_baselines.h"
#include "kernels/kn_metrics.h"
#include "kernels/kn_ops.h"
#include "kernels/kn_synth.h"
#include "kernels/kn_wave.h"

static uint64_t inv_seed;

typedef struct inv_kv {
    kn_synth_params_t sp;
    kn_shape_t shape;
    cm_fp16_t *k, *v;
    kn_kv_view_t kv;
    float *q;
} inv_kv_t;

/* Token-major synthetic cache with room for cap tokens, n generated. */
static void inv_make(inv_kv_t *x, uint32_t nkv, uint32_t g, uint32_t d, size_t n, uint64_t seed)
{
    kn_synth_params_default(&x->sp);
    x->sp.n_kv_heads = nkv;
    x->sp.n_q_heads = nkv * g;
    x->sp.head_dim = d;
    x->sp.n_tokens = n;
    x->sp.seed = seed;
    x->shape = (kn_shape_t){nkv * g, nkv, d, 0};
    x->k = malloc(n * nkv * d * sizeof(cm_fp16_t));
    x->v = malloc(n * nkv * d * sizeof(cm_fp16_t));
    x->q = malloc((size_t)nkv * g * d * sizeof(float));
    assert_non_null(x->k);
    assert_non_null(x->v);
    assert_int_equal(kn_synth_kv(&x->sp, x->k, x->v, (size_t)nkv * d, d), RI_OK);
    assert_int_equal(kn_synth_query(&x->sp, inv_seed % 1000, x->q), RI_OK);
    x->kv = (kn_kv_view_t){x->k, x->v, n, (size_t)nkv * d, d};
}

static void inv_free(inv_kv_t *x)
{
    free(x->k);
    free(x->v);
    free(x->q);
}

static void inv_expect_close(const float *a, const float *b, size_t n, double tol)
{
    double e = kn_metric_rel_l2(a, b, n);
    if (!(e <= tol))
        fprintf(stderr, "rel L2 %.3g > %.1g\n", e, tol);
    assert_true(e <= tol);
}

static void test_full_coverage_equals_full(void **state)
{
    inv_kv_t x;
    kn_wave_params_t wp;
    kn_wave_t *w;
    float o[4 * 4 * 64], r[4 * 4 * 64], l[16], rl[16];
    const kn_index_t *ix;
    bool updated;

    inv_make(&x, 2, 4, 64, 4000, inv_seed);
    kn_wave_params_default(&wp);
    wp.segment_tokens = 1024;  /* several segments even at this size */
    assert_int_equal(kn_wave_create(&x.shape, &wp, &w), RI_OK);

    /* a 1000-token prompt is too short to index: decode is dense = full */
    x.kv.n_tokens = 1000;
    assert_int_equal(kn_wave_build(w, &x.kv), RI_OK);
    assert_int_equal(kn_wave_index(w, 0)->n_clusters, 0);
    assert_int_equal(kn_attn_decode(kn_ops_ref(), &x.shape, 1, x.q, &x.kv, r, rl), RI_OK);
    assert_int_equal(kn_wave_decode(w, x.q, &x.kv, o, l, NULL), RI_OK);
    inv_expect_close(o, r, 8 * 64, 1e-5);
    inv_expect_close(l, rl, 8, 1e-5);

    /* generation reaches 4 + 64 + 1024 steady tokens: one update of 256
     * clusters (auto size: 4 tokens each at a short context) */
    x.kv.n_tokens = 1091;
    assert_int_equal(kn_wave_update(w, &x.kv, &updated), RI_OK);
    assert_false(updated);
    x.kv.n_tokens = 1092;
    assert_int_equal(kn_wave_update(w, &x.kv, &updated), RI_OK);
    assert_true(updated);
    ix = kn_wave_index(w, 1);
    assert_int_equal(ix->n_clusters, 256);
    assert_int_equal(ix->n_tokens, 1024);
    assert_int_equal(kn_wave_indexed_end(w), 4 + 1024);
    {
        uint32_t nr, ne;
        kn_wave_budget(w, &nr, &ne);
        assert_int_equal(nr, 64);  /* round(256 * 0.018) = 5, raised to the
                                      floor: 256 tokens / 4 per cluster */
        assert_int_equal(ne, 59);  /* round(256 * 0.232) */
    }
    /* and at 4000 tokens: two more updates; full coverage equals full attention */
    x.kv.n_tokens = 4000;
    assert_int_equal(kn_wave_update(w, &x.kv, &updated), RI_OK);
    assert_int_equal(kn_wave_index(w, 0)->n_clusters, 256 * 3);
    assert_int_equal(kn_attn_decode(kn_ops_ref(), &x.shape, 1, x.q, &x.kv, r, rl), RI_OK);
    assert_int_equal(kn_wave_decode_budget(w, x.q, &x.kv, 1u << 30, 0, o, l, NULL), RI_OK);
    inv_expect_close(o, r, 8 * 64, 1e-5);
    inv_expect_close(l, rl, 8, 1e-5);
    kn_wave_destroy(w);

    /* a prompt indexed at build time (segmented, global final pass) */
    x.kv.n_tokens = 4000;
    assert_int_equal(kn_wave_create(&x.shape, &wp, &w), RI_OK);
    assert_int_equal(kn_wave_build(w, &x.kv), RI_OK);
    assert_true(kn_wave_index(w, 0)->n_clusters > 0);
    assert_int_equal(kn_wave_decode_budget(w, x.q, &x.kv, 1u << 30, 0, o, l, NULL), RI_OK);
    inv_expect_close(o, r, 8 * 64, 1e-5);
    kn_wave_destroy(w);
    inv_free(&x);
}

/* Jensen: n_j e^{q.c_j} <= sum_{i in j} e^{q.k_i} for each cluster and head
 * (the centroid is stored in fp16: allow its rounding). */
static void test_jensen_estimation_never_overstates(void **state)
{
    inv_kv_t x;
    kn_wave_params_t wp;
    kn_wave_t *w;
    uint32_t g = 4, d = 64;
    kn_shape_t grp = {g, 1, d, 0};
    size_t checked = 0;

    inv_make(&x, 1, g, d, 3000, inv_seed + 1);
    kn_wave_params_default(&wp);
    assert_int_equal(kn_wave_create(&x.shape, &wp, &w), RI_OK);
    assert_int_equal(kn_wave_build(w, &x.kv), RI_OK);
    const kn_index_t *ix = kn_wave_index(w, 0);
    for (uint32_t j = 0; j < ix->n_clusters; j++) {
        float o[4 * 64], lse[4];
        if (ix->sizes[j] == 0)
            continue;
        assert_int_equal(kn_estimate(NULL, &grp, x.q, ix, &j, 1, o, lse), RI_OK);
        for (uint32_t h = 0; h < g; h++) {
            double m = -INFINITY, s = 0, lg[4096];
            uint32_t n = ix->sizes[j];
            for (uint32_t r = 0; r < n; r++) {
                const cm_fp16_t *kr = x.k + (size_t)ix->perm[ix->offsets[j] + r] * d;
                double dot = 0;
                for (uint32_t i = 0; i < d; i++)
                    dot += (double)x.q[h * d + i] * cm_fp16_to_f32(kr[i]);
                lg[r] = dot / sqrt((double)d);
                m = fmax(m, lg[r]);
            }
            for (uint32_t r = 0; r < n; r++)
                s += exp(lg[r] - m);
            /* Jensen holds for the exact mean; the stored centroid is its int8
             * rounding (times the scale), which moves the logit by exactly
             * q.(c8 * cscale - mean)/sqrt(d) */
            double shift = 0;
            for (uint32_t i = 0; i < d; i++) {
                double mean = 0;
                for (uint32_t r = 0; r < n; r++)
                    mean += cm_fp16_to_f32(x.k[(size_t)ix->perm[ix->offsets[j] + r] * d + i]);
                mean /= n;
                shift += (double)x.q[h * d + i] * ((double)ix->centroids[(size_t)j * d + i] * ix->cscale[j] - mean);
            }
            shift = fmax(0.0, shift / sqrt((double)d));
            /* lse of the estimation term = s_j + ln n_j; true = lse of the members
             * (1e-4 * (1 + |m|): the op's fp32 accumulation) */
            assert_true((double)lse[h] <= m + log(s) + shift + 1e-4 * (1 + fabs(m)));
            checked++;
        }
    }
    assert_true(checked > 100);
    kn_wave_destroy(w);
    inv_free(&x);
}

static void test_merge_associative_and_order_free(void **state)
{
    enum { ROWS = 3, D = 64 };
    float p[4][ROWS * D], lp[4][ROWS], ab[ROWS * D], lab[ROWS], bc[ROWS * D], lbc[ROWS];
    float all1[ROWS * D], l1[ROWS], all2[ROWS * D], l2[ROWS], all3[ROWS * D], l3[ROWS];
    uint64_t st = inv_seed;
    for (int i = 0; i < 3; i++) {
        for (int j = 0; j < ROWS * D; j++) {
            st = st * 6364136223846793005ull + 1442695040888963407ull;
            p[i][j] = (float)((int64_t)(st >> 33) % 2000) / 1000.0f;
        }
        for (int r = 0; r < ROWS; r++) {
            st = st * 6364136223846793005ull + 1442695040888963407ull;
            lp[i][r] = (float)((int64_t)(st >> 33) % 4000) / 100.0f;
        }
    }
    lp[1][2] = -INFINITY;  /* an empty part in one row */
    const float *o3[3] = {p[0], p[1], p[2]}, *l3p[3] = {lp[0], lp[1], lp[2]};
    const float *o3r[3] = {p[2], p[0], p[1]}, *l3r[3] = {lp[2], lp[0], lp[1]};
    const float *oab[2] = {p[0], p[1]}, *lab2[2] = {lp[0], lp[1]};
    const float *obc[2] = {p[1], p[2]}, *lbc2[2] = {lp[1], lp[2]};
    const kn_ops_t *ops[4];
    size_t n_ops = kn_ops_list(ops, 4);
    for (size_t b = 0; b < n_ops; b++) {
        assert_int_equal(kn_merge(ops[b], ROWS, D, 3, o3, l3p, all1, l1), RI_OK);
        assert_int_equal(kn_merge(ops[b], ROWS, D, 3, o3r, l3r, all2, l2), RI_OK);
        assert_int_equal(kn_merge(ops[b], ROWS, D, 2, oab, lab2, ab, lab), RI_OK);
        assert_int_equal(kn_merge(ops[b], ROWS, D, 2, obc, lbc2, bc, lbc), RI_OK);
        const float *x1[2] = {ab, p[2]}, *y1[2] = {lab, lp[2]};
        const float *x2[2] = {p[0], bc}, *y2[2] = {lp[0], lbc};
        assert_int_equal(kn_merge(ops[b], ROWS, D, 2, x1, y1, all3, l3), RI_OK);
        inv_expect_close(all2, all1, ROWS * D, 1e-6);
        inv_expect_close(l2, l1, ROWS, 1e-6);
        inv_expect_close(all3, all1, ROWS * D, 1e-6);
        inv_expect_close(l3, l1, ROWS, 1e-6);
        assert_int_equal(kn_merge(ops[b], ROWS, D, 2, x2, y2, all3, l3), RI_OK);
        inv_expect_close(all3, all1, ROWS * D, 1e-6);
        inv_expect_close(l3, l1, ROWS, 1e-6);
    }
}

static void inv_index_equal(const kn_index_t *a, const kn_index_t *b)
{
    size_t d = a->head_dim;
    assert_int_equal(a->n_clusters, b->n_clusters);
    assert_int_equal(a->n_tokens, b->n_tokens);
    assert_memory_equal(a->centroids, b->centroids, a->n_clusters * d);
    assert_memory_equal(a->cscale, b->cscale, a->n_clusters * sizeof(float));
    assert_null(a->vsum); /* a built index is compact: the sums were the means' scratch */
    assert_memory_equal(a->vq, b->vq, (size_t)a->n_clusters * d);
    assert_memory_equal(a->vscale, b->vscale, a->n_clusters * sizeof(float));
    assert_memory_equal(a->sizes, b->sizes, a->n_clusters * sizeof(uint32_t));
    assert_memory_equal(a->offsets, b->offsets, (a->n_clusters + 1) * sizeof(uint32_t));
    assert_memory_equal(a->perm, b->perm, a->n_tokens * sizeof(uint32_t));
}

static void test_build_deterministic(void **state)
{
    inv_kv_t x;
    kn_wave_params_t wp;
    kn_wave_t *w1, *w2, *w3;
    cm_pool_t *one;

    inv_make(&x, 3, 2, 64, 3000, inv_seed + 2);
    kn_wave_params_default(&wp);
    wp.segment_tokens = 1000;
    assert_int_equal(kn_wave_create(&x.shape, &wp, &w1), RI_OK);
    assert_int_equal(kn_wave_create(&x.shape, &wp, &w2), RI_OK);
    assert_int_equal(kn_wave_create(&x.shape, &wp, &w3), RI_OK);
    assert_int_equal(kn_wave_build(w1, &x.kv), RI_OK);
    assert_int_equal(kn_wave_build(w2, &x.kv), RI_OK);
    assert_int_equal(cm_pool_create(1, &one), RI_OK);
    kn_set_pool(one);
    assert_int_equal(kn_wave_build(w3, &x.kv), RI_OK);
    kn_set_pool(NULL);
    cm_pool_destroy(one);
    for (uint32_t h = 0; h < 3; h++) {
        inv_index_equal(kn_wave_index(w1, h), kn_wave_index(w2, h));
        inv_index_equal(kn_wave_index(w1, h), kn_wave_index(w3, h));  /* other thread count */
    }
    kn_wave_destroy(w1);
    kn_wave_destroy(w2);
    kn_wave_destroy(w3);
    inv_free(&x);
}

/* The compact meta entry: a built index keeps int8 centroids and int8 value
 * means with a scale a cluster each (no fp32 sums), for the first build and
 * for an update appended to it (the sums are allocated again as the build's
 * scratch and dropped again), and each mean is within half its scale of the
 * mean of its cluster's values, each centroid of the mean of its keys. */
static void test_built_index_is_compact(void **state)
{
    inv_kv_t x;
    kn_index_t idx;
    const uint32_t d = 64, n1 = 2000, n2 = 1024;
    (void)state;

    inv_make(&x, 1, 1, d, n1 + n2, inv_seed + 5);
    kn_index_init(&idx, d);
    assert_int_equal(kn_index_build(NULL, NULL, x.k, x.v, d, n1, 0, 500, 1, &idx), RI_OK);
    assert_null(idx.vsum);
    assert_int_equal(kn_index_build(NULL, NULL, x.k + (size_t)n1 * d, x.v + (size_t)n1 * d, d, n2, n1, 256, 1,
                                    &idx), RI_OK);
    assert_null(idx.vsum);
    assert_non_null(idx.vq);
    assert_non_null(idx.vscale);
    assert_non_null(idx.cscale);
    /* the compact entry: int8 centroid + int8 mean + their fp32 scales + size + offset a cluster, perm a token */
    assert_int_equal(kn_index_resident_bytes(&idx),
                     (uint64_t)idx.cap_clusters * (d + 4 + d + 4 + 8) + (uint64_t)idx.cap_tokens * 4);
    assert_int_equal(idx.n_clusters, 756);
    assert_int_equal(idx.n_tokens, n1 + n2);
    for (uint32_t j = 0; j < idx.n_clusters; j++) {
        for (uint32_t i = 0; i < d; i++) {
            double sum = 0.0, s = idx.vscale[j], got = (double)idx.vq[(size_t)j * d + i] * s, want;
            for (uint32_t r = idx.offsets[j]; r < idx.offsets[j + 1]; r++)
                sum += cm_fp16_to_f32(x.v[(size_t)idx.perm[r] * d + i]);
            want = idx.sizes[j] ? sum / idx.sizes[j] : 0.0;
            /* half a step of the cluster's scale, plus the fp32 sum's rounding */
            if (fabs(got - want) > s / 2 + 1e-5 * (1.0 + fabs(want)))
                fail_msg("cluster %u dim %u: mean %g, want %g (scale %g)", j, i, got, want, s);
            sum = 0.0;
            s = idx.cscale[j];
            got = (double)idx.centroids[(size_t)j * d + i] * s;
            for (uint32_t r = idx.offsets[j]; r < idx.offsets[j + 1]; r++)
                sum += cm_fp16_to_f32(x.k[(size_t)idx.perm[r] * d + i]);
            want = idx.sizes[j] ? sum / idx.sizes[j] : 0.0;
            if (fabs(got - want) > s / 2 + 1e-5 * (1.0 + fabs(want)))
                fail_msg("cluster %u dim %u: centroid %g, want %g (scale %g)", j, i, got, want, s);
        }
    }
    kn_index_cleanup(&idx);
    inv_free(&x);
}

static void test_baselines_with_everything_equal_full(void **state)
{
    inv_kv_t x;
    kn_quest_t *qt;
    float o[16 * 64], r[16 * 64], l[16], rl[16];
    uint64_t bytes;

    inv_make(&x, 2, 3, 64, 999, inv_seed + 3);
    assert_int_equal(kn_attn_decode(kn_ops_ref(), &x.shape, 1, x.q, &x.kv, r, rl), RI_OK);
    assert_int_equal(kn_streaming_decode(NULL, &x.shape, x.q, &x.kv, 4, 2000, o, l), RI_OK);
    inv_expect_close(o, r, 6 * 64, 1e-5);
    assert_int_equal(kn_oracle_decode(NULL, &x.shape, x.q, &x.kv, 5000, o, l), RI_OK);
    inv_expect_close(o, r, 6 * 64, 1e-5);
    assert_int_equal(kn_random_decode(NULL, &x.shape, x.q, &x.kv, 5000, 3, o, l), RI_OK);
    inv_expect_close(o, r, 6 * 64, 1e-5);
    assert_int_equal(kn_quest_create(&x.shape, 16, &qt), RI_OK);
    x.kv.n_tokens = 500;  /* grow in two steps: the partial last page is redone */
    assert_int_equal(kn_quest_update(qt, &x.kv), RI_OK);
    x.kv.n_tokens = 999;
    assert_int_equal(kn_quest_update(qt, &x.kv), RI_OK);
    assert_int_equal(kn_quest_decode(NULL, qt, x.q, &x.kv, 999, o, l, &bytes), RI_OK);
    inv_expect_close(o, r, 6 * 64, 1e-5);
    assert_true(bytes >= 999ull * 2 * 64 * 4);
    /* a small budget reads less and still includes the newest page */
    {
        uint8_t mask[999];
        assert_int_equal(kn_quest_exact_mask(NULL, qt, x.q, &x.kv, 1, 64, mask), RI_OK);
        size_t n = 0;
        for (int i = 0; i < 999; i++)
            n += mask[i];
        assert_int_equal(n, 64 - 16 + 999 % 16);  /* 4 pages, one of them the partial newest */
        assert_int_equal(mask[998], 1);
    }
    kn_quest_destroy(qt);
    inv_free(&x);
}

static void test_synth_reproducible_and_calibrated(void **state)
{
    inv_kv_t a, b;
    size_t n = 16384, np = 0;
    double top1[8], top3[8];
    double *prob = malloc(n * sizeof(double));
    float needle_depth = 0.37f;

    inv_make(&a, 8, 4, 64, n, 77);
    inv_make(&b, 8, 4, 64, n, 77);
    assert_memory_equal(a.k, b.k, n * 8 * 64 * sizeof(cm_fp16_t));
    assert_memory_equal(a.v, b.v, n * 8 * 64 * sizeof(cm_fp16_t));
    for (uint32_t h = 0; h < 8; h++) {
        kn_shape_t grp = {4, 1, 64, 0};
        uint8_t *mask = malloc(n);
        assert_int_equal(kn_true_probs(&grp, a.q + h * 4 * 64, a.k + h * 64, 8 * 64, n, prob), RI_OK);
        assert_int_equal(kn_oracle_mask(prob, n, n / 100, mask), RI_OK);
        double m1 = kn_metric_mass(prob, n, mask);
        assert_int_equal(kn_oracle_mask(prob, n, 3 * n / 100, mask), RI_OK);
        double m3 = kn_metric_mass(prob, n, mask);
        free(mask);
        if (kn_synth_head_diffuse(&a.sp, h)) {
            assert_true(m1 < 0.5);
            continue;
        }
        top1[np] = m1;
        top3[np++] = m3;
    }
    kn_summary_t s1, s3;
    kn_summarise(top1, np, &s1);
    kn_summarise(top3, np, &s3);
    printf("synthetic: median sparse head top-1%% mass %.3f, top-3%% mass %.3f (%zu sparse heads)\n",
           s1.median, s3.median, np);
    assert_true(s1.median > 0.80 && s1.median < 0.97);
    assert_true(s3.median > 0.92 && s3.median < 0.995);
    inv_free(&b);

    /* a needle is the top token of every head */
    a.sp.n_needles = 1;
    a.sp.needle_depths = &needle_depth;
    assert_int_equal(kn_synth_kv(&a.sp, a.k, a.v, 8 * 64, 64), RI_OK);
    for (uint32_t h = 0; h < 8; h++) {
        kn_shape_t grp = {4, 1, 64, 0};
        size_t best = 0;
        assert_int_equal(kn_true_probs(&grp, a.q + h * 4 * 64, a.k + h * 64, 8 * 64, n, prob), RI_OK);
        for (size_t t = 1; t < n; t++)
            if (prob[t] > prob[best])
                best = t;
        assert_int_equal(best, kn_synth_needle_pos(&a.sp, 0));
    }
    free(prob);
    inv_free(&a);
}

static void test_metrics(void **state)
{
    float a[4] = {1, 2, 3, 4}, b[4] = {1, 2, 3, 5};
    double prob[5] = {0.5, 0.2, 0.15, 0.1, 0.05}, v[5] = {5, 1, 4, 2, 3};
    uint8_t mask[5] = {1, 0, 1, 0, 0};
    kn_summary_t s;
    assert_true(kn_metric_rel_l2(a, a, 4) == 0.0);
    assert_true(fabs(kn_metric_rel_l2(b, a, 4) - 1.0 / sqrt(30.0)) < 1e-12);
    assert_true(fabs(kn_metric_cosine(a, a, 4) - 1.0) < 1e-12);
    assert_true(fabs(kn_metric_mass(prob, 5, mask) - 0.65) < 1e-12);
    assert_true(fabs(kn_metric_recall(prob, 5, mask, 2) - 0.5) < 1e-12);
    assert_true(fabs(kn_metric_recall(prob, 5, mask, 1) - 1.0) < 1e-12);
    kn_summarise(v, 5, &s);
    assert_true(s.median == 3 && s.max == 5 && s.p90 == 5 && s.min == 1 && s.p10 == 1);
}

int main(void)
{
    const char *env = getenv("RI_TEST_SEED");
    inv_seed = env ? strtoull(env, NULL, 0) : ((uint64_t)time(NULL) ^ ((uint64_t)getpid() << 16));
    printf("kernels invariants: seed %llu (RI_TEST_SEED reproduces)\n", (unsigned long long)inv_seed);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_full_coverage_equals_full),
        cmocka_unit_test(test_jensen_estimation_never_overstates),
        cmocka_unit_test(test_merge_associative_and_order_free),
        cmocka_unit_test(test_build_deterministic),
        cmocka_unit_test(test_built_index_is_compact),
        cmocka_unit_test(test_baselines_with_everything_equal_full),
        cmocka_unit_test(test_synth_reproducible_and_calibrated),
        cmocka_unit_test(test_metrics),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
