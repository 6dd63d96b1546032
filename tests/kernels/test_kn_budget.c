/*
 * Decode budgets of the wave index: the floor in tokens under the shares,
 * and the output-aware per-head cut (kn_wave_adapt).  The cut must keep few
 * clusters for a head whose mass is concentrated and nearly all candidates
 * for one whose mass is spread; what it moves is estimated (counted in the
 * estimation zone), and with a negligible tau it is exactly the fixed budget
 * of its 2R candidates.
 */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <cmocka.h>

#include "kernels/kn_metrics.h"
#include "kernels/kn_ops.h"
#include "kernels/kn_synth.h"
#include "kernels/kn_wave.h"

#define BT_N 6000
#define BT_G 4
#define BT_D 64

typedef struct bt_kv {
    kn_synth_params_t sp;
    kn_shape_t shape;
    cm_fp16_t *k, *v;
    kn_kv_view_t kv;
    float q[BT_G * BT_D];
} bt_kv_t;

static void bt_make(bt_kv_t *x, uint64_t seed)
{
    kn_synth_params_default(&x->sp);
    x->sp.n_kv_heads = 1;
    x->sp.n_q_heads = BT_G;
    x->sp.head_dim = BT_D;
    x->sp.n_tokens = BT_N;
    x->sp.seed = seed;
    x->shape = (kn_shape_t){BT_G, 1, BT_D, 0};
    x->k = malloc((size_t)BT_N * BT_D * sizeof(cm_fp16_t));
    x->v = malloc((size_t)BT_N * BT_D * sizeof(cm_fp16_t));
    assert_non_null(x->k);
    assert_non_null(x->v);
    assert_int_equal(kn_synth_kv(&x->sp, x->k, x->v, BT_D, BT_D), RI_OK);
    assert_int_equal(kn_synth_query(&x->sp, 7, x->q), RI_OK);
    x->kv = (kn_kv_view_t){x->k, x->v, BT_N, BT_D, BT_D};
}

static void bt_free(bt_kv_t *x)
{
    free(x->k);
    free(x->v);
}

static kn_wave_t *bt_wave(const bt_kv_t *x, float tau, uint32_t min_tokens)
{
    kn_wave_params_t wp;
    kn_wave_t *w;
    kn_wave_params_default(&wp);
    wp.adapt_tau = tau;
    wp.retrieval_min_tokens = min_tokens;
    assert_int_equal(kn_wave_create(&x->shape, &wp, &w), RI_OK);
    assert_int_equal(kn_wave_build(w, &x->kv), RI_OK);
    return w;
}

static void test_floor(void **state)
{
    kn_wave_params_t p;
    uint32_t r, e;
    (void)state;
    kn_wave_params_default(&p);
    assert_int_equal(p.retrieval_min_tokens, 256);
    p.tokens_per_cluster = 16;                     /* the paper's size */
    kn_wave_budget_floor(&p, 64, 1, 15, &r, &e);   /* 2K-ish: the floor rules */
    assert_int_equal(r, 16);
    assert_int_equal(e, 15);
    kn_wave_budget_floor(&p, 8192, 147, 1900, &r, &e); /* 128K: the share rules */
    assert_int_equal(r, 147);
    assert_int_equal(e, 1900);
    kn_wave_budget_floor(&p, 10, 1, 2, &r, &e);    /* capped at what there is */
    assert_int_equal(r, 10);
    assert_int_equal(e, 0);
    p.retrieval_min_tokens = 0;
    p.estimation_min_tokens = 40 * 16;
    kn_wave_budget_floor(&p, 64, 1, 15, &r, &e);
    assert_int_equal(r, 1);
    assert_int_equal(e, 40);
    p.retrieval_min_tokens = 17;                   /* partial clusters round up */
    kn_wave_budget_floor(&p, 64, 1, 15, &r, &e);
    assert_int_equal(r, 2);
    /* the wave reports the floored budget */
    bt_kv_t x;
    bt_make(&x, 11);
    kn_wave_t *w = bt_wave(&x, 0, 256);
    kn_wave_budget(w, &r, &e);
    assert_int_equal(r, 64);                       /* 6K tokens: auto size 4 */
    kn_wave_destroy(w);
    w = bt_wave(&x, 0, 0);
    kn_wave_budget(w, &r, &e);
    assert_int_equal(r, (uint32_t)lround(0.018 * kn_wave_index(w, 0)->n_clusters));
    kn_wave_destroy(w);
    bt_free(&x);
}

/* The auto cluster size: 4 tokens up to 16K indexed tokens, 8 up to 32K,
 * 16 beyond, an
 * explicit size always; the build fixes it for the index's life, updates
 * included, and the floor in clusters follows it. */
static void test_auto_cluster_size(void **state)
{
    kn_wave_params_t p;
    bt_kv_t x;
    kn_wave_t *w;
    uint32_t r, e;
    (void)state;
    kn_wave_params_default(&p);
    assert_int_equal(p.tokens_per_cluster, 0);
    assert_int_equal(kn_wave_cluster_tokens(&p, 4096), 4);
    assert_int_equal(kn_wave_cluster_tokens(&p, KN_WAVE_TINY_CONTEXT), 4);
    assert_int_equal(kn_wave_cluster_tokens(&p, 8192), 4);
    assert_int_equal(kn_wave_cluster_tokens(&p, 16384), 4);
    assert_int_equal(kn_wave_cluster_tokens(&p, KN_WAVE_TINY_CONTEXT + 1), 8);
    assert_int_equal(kn_wave_cluster_tokens(&p, 32700), 8);  /* Gemma 3's whole context */
    assert_int_equal(kn_wave_cluster_tokens(&p, KN_WAVE_SMALL_CONTEXT), 8);
    assert_int_equal(kn_wave_cluster_tokens(&p, KN_WAVE_SMALL_CONTEXT + 1), 16);
    assert_int_equal(kn_wave_cluster_tokens(&p, 1u << 20), 16);
    p.tokens_per_cluster = 12;
    assert_int_equal(kn_wave_cluster_tokens(&p, 4096), 12);
    assert_int_equal(kn_wave_cluster_tokens(&p, 1u << 20), 12);

    bt_make(&x, 5);
    w = bt_wave(&x, 0, 256);  /* 6K tokens: short */
    size_t n_idx = BT_N - 4 - 64;
    assert_int_equal(kn_wave_params(w)->tokens_per_cluster, 4);
    assert_int_equal(kn_wave_params(w)->update_clusters, 1024 / 4);
    /* C = round(N / 4), rounded to the build's multiple of 8 */
    assert_true(labs((long)kn_wave_index(w, 0)->n_clusters - (long)(n_idx / 4)) <= 8);
    kn_wave_budget(w, &r, &e);
    assert_int_equal(r, 256 / 4);
    uint32_t c0 = kn_wave_index(w, 0)->n_clusters;  /* (updates: test_kn_invariants) */
    kn_wave_destroy(w);

    /* an explicit size is kept */
    kn_wave_params_default(&p);
    p.tokens_per_cluster = 16;
    assert_int_equal(kn_wave_create(&x.shape, &p, &w), RI_OK);
    assert_int_equal(kn_wave_build(w, &x.kv), RI_OK);
    assert_int_equal(kn_wave_params(w)->update_clusters, 64);
    assert_true(kn_wave_index(w, 0)->n_clusters < c0 / 3);
    kn_wave_budget(w, &r, &e);
    assert_int_equal(r, 16);
    kn_wave_destroy(w);
    bt_free(&x);
}

/* Kept clusters for q scaled by s (s = 0: every logit equal, the mass
 * follows the cluster sizes; large s: the mass sits in a few clusters). */
static uint32_t bt_kept(kn_wave_t *w, const bt_kv_t *x, float s, float tau, uint32_t n_r, uint32_t *moved)
{
    kn_wave_params_t p = *kn_wave_params(w);
    kn_shape_t grp = {BT_G, 1, BT_D, 0};
    const kn_index_t *idx = kn_wave_index(w, 0);
    uint32_t rr, re, nr, ne, ids[2048];
    float q[BT_G * BT_D], o[BT_G * BT_D], l[BT_G];
    for (size_t i = 0; i < BT_G * BT_D; i++)
        q[i] = x->q[i] * s;
    p.adapt_tau = tau;
    kn_wave_rank_counts(&p, idx->n_clusters, n_r, 50, &rr, &re);
    assert_int_equal(rr, tau > 0 ? 2 * n_r : n_r);
    assert_int_equal(kn_wave_rank_estimate(NULL, &grp, q, idx, rr, re, ids, &nr, &ne, o, l), RI_OK);
    uint32_t ne0 = ne;
    assert_int_equal(kn_wave_adapt(&p, NULL, &grp, q, idx, n_r, ids, &nr, &ne, o, l), RI_OK);
    assert_int_equal(nr + ne, rr + ne0);     /* nothing dropped: moved to estimation */
    for (uint32_t i = 1; i < nr; i++)
        assert_true(ids[i - 1] < ids[i]);    /* kept ones ascending */
    *moved = ne - ne0;
    return nr;
}

static void test_cut_follows_the_mass(void **state)
{
    bt_kv_t x;
    uint32_t moved;
    (void)state;
    bt_make(&x, 12);
    kn_wave_t *w = bt_wave(&x, 0, 0);
    uint32_t flat = bt_kept(w, &x, 0.0f, 0.1f, 40, &moved);
    uint32_t sharp = bt_kept(w, &x, 40.0f, 0.1f, 40, &moved);
    printf("kept of 80 candidates: %u for a flat query, %u for a sharp one (%u moved)\n", flat, sharp, moved);
    /* equal logits: the mass follows the sizes, so most candidates stay */
    assert_true(flat >= 40 && flat >= 4 * sharp);
    assert_int_equal(sharp, 10);             /* concentrated: the floor, R / 4 */
    assert_int_equal(moved, 70);
    assert_int_equal(bt_kept(w, &x, 40.0f, 0.0f, 40, &moved), 40); /* tau 0: R, no cut */
    assert_int_equal(moved, 0);
    kn_wave_destroy(w);
    bt_free(&x);
}

/* With a negligible tau the cut keeps every candidate: the decode equals a
 * fixed budget of 2R, to the bit; with tau 0.3 it reads less. */
static void test_negligible_tau_is_fixed_2r(void **state)
{
    bt_kv_t x;
    float o1[BT_G * BT_D], o2[BT_G * BT_D], o3[BT_G * BT_D], l1[BT_G], l2[BT_G], l3[BT_G];
    kn_wave_stats_t s1, s2, s3;
    (void)state;
    bt_make(&x, 13);
    kn_wave_t *fixed = bt_wave(&x, 0, 0), *tiny = bt_wave(&x, 1e-9f, 0), *cut = bt_wave(&x, 0.3f, 0);
    assert_int_equal(kn_wave_decode_budget(fixed, x.q, &x.kv, 20, 60, o1, l1, &s1), RI_OK);
    assert_int_equal(kn_wave_decode_budget(tiny, x.q, &x.kv, 10, 60, o2, l2, &s2), RI_OK);
    assert_int_equal(kn_wave_decode_budget(cut, x.q, &x.kv, 10, 60, o3, l3, &s3), RI_OK);
    assert_true(kn_metric_rel_l2(o2, o1, BT_G * BT_D) <= 1e-6);
    assert_int_equal(s1.retrieved_tokens, s2.retrieved_tokens);
    assert_int_equal(s1.est_clusters, s2.est_clusters);
    printf("tau 0.3: %llu retrieved tokens, %llu estimated clusters (2R fixed: %llu, %llu); rel err vs 2R %.3g\n",
           (unsigned long long)s3.retrieved_tokens, (unsigned long long)s3.est_clusters,
           (unsigned long long)s1.retrieved_tokens, (unsigned long long)s1.est_clusters,
           kn_metric_rel_l2(o3, o1, BT_G * BT_D));
    assert_true(s3.retrieved_tokens < s1.retrieved_tokens);
    assert_true(s3.est_clusters > s1.est_clusters);
    assert_true(s3.retrieved_tokens + 16 * s3.est_clusters >= s1.retrieved_tokens); /* moved, not dropped */
    kn_wave_destroy(fixed);
    kn_wave_destroy(tiny);
    kn_wave_destroy(cut);
    bt_free(&x);
}

static void test_bad_tau_refused(void **state)
{
    bt_kv_t x;
    kn_wave_params_t wp;
    kn_wave_t *w = NULL;
    (void)state;
    bt_make(&x, 14);
    kn_wave_params_default(&wp);
    wp.adapt_tau = 1.0f;
    assert_int_equal(kn_wave_create(&x.shape, &wp, &w), RI_ERR_INVALID);
    wp.adapt_tau = NAN;
    assert_int_equal(kn_wave_create(&x.shape, &wp, &w), RI_ERR_INVALID);
    wp.adapt_tau = -0.1f;
    assert_int_equal(kn_wave_create(&x.shape, &wp, &w), RI_ERR_INVALID);
    assert_null(w);
    bt_free(&x);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_floor),
        cmocka_unit_test(test_auto_cluster_size),
        cmocka_unit_test(test_cut_follows_the_mass),
        cmocka_unit_test(test_negligible_tau_is_fixed_2r),
        cmocka_unit_test(test_bad_tau_refused),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
