/*
 * mdl_dwave (the wave index in a memory space, stepped by the backend's
 * wave_step) against the in-process wave (kn_wave_decode) on the same
 * synthetic K/V, with the host space and the cpu and ref tables: through
 * the build and several updates, the same output within a tight tolerance
 * and the same retrieved and estimated cluster sets.  A mutant check shows
 * the tolerance catches a step that drops the steady zone; bad settings
 * are refused and change nothing.
 *
 * With the ref table the outputs are bit-equal.  With the cpu table they
 * are not: kn_wave_decode ranks and estimates in one fused pass there
 * (kn_cpu_rank_estimate) where wave_step runs the rank and estimate ops
 * apart, the same terms summed in another order (a few fp32 ulps).
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

#include "gpuworker/model/mdl_dwave.h"
#include "kernels/kn_mem.h"
#include "kernels/kn_synth.h"

#define NQ 8
#define NKV 2
#define D 64
#define PROMPT 300
#define STEPS 200
#define CAP (PROMPT + STEPS + 8)
#define TOL 1e-6 /* of the output's range (the cpu table gives ~5e-8, ref 0) */

typedef struct fix {
    kn_synth_params_t sp;
    cm_fp16_t *k, *v; /* head-major [NKV][CAP][D] */
    kn_wave_params_t wp;
} fix_t;

static kn_kv_view_t view(const fix_t *f, size_t n)
{
    return (kn_kv_view_t){.k = f->k, .v = f->v, .n_tokens = n, .token_stride = D, .head_stride = (size_t)CAP * D};
}

static int setup(void **state)
{
    fix_t *f = calloc(1, sizeof(*f));
    kn_synth_params_default(&f->sp);
    f->sp.n_q_heads = NQ;
    f->sp.n_kv_heads = NKV;
    f->sp.head_dim = D;
    f->sp.n_tokens = CAP;
    f->sp.seed = 7;
    f->k = calloc((size_t)NKV * CAP * D, sizeof(cm_fp16_t));
    f->v = calloc((size_t)NKV * CAP * D, sizeof(cm_fp16_t));
    assert_int_equal(kn_synth_kv(&f->sp, f->k, f->v, D, (size_t)CAP * D), RI_OK);
    /* small enough that the prompt indexes and the steps update 3 times */
    kn_wave_params_default(&f->wp);
    f->wp.sink_tokens = 4;
    f->wp.window_tokens = 16;
    f->wp.update_tokens = 64;
    f->wp.segment_tokens = 64;
    f->wp.tokens_per_cluster = 4;
    f->wp.retrieval_min_tokens = 16;
    f->wp.estimation_min_tokens = 16;
    *state = f;
    return 0;
}

static int teardown(void **state)
{
    fix_t *f = *state;
    free(f->k);
    free(f->v);
    free(f);
    return 0;
}

static float range_of(const float *x, size_t n)
{
    float lo = x[0], hi = x[0];
    for (size_t i = 1; i < n; i++)
        lo = fminf(lo, x[i]), hi = fmaxf(hi, x[i]);
    return hi - lo;
}

static float max_diff(const float *a, const float *b, size_t n)
{
    float m = 0;
    for (size_t i = 0; i < n; i++)
        m = fmaxf(m, fabsf(a[i] - b[i]));
    return m;
}

static int cmp_u32(const void *a, const void *b)
{
    uint32_t x = *(const uint32_t *)a, y = *(const uint32_t *)b;
    return x < y ? -1 : x > y;
}

/* The sets the in-process wave's rank picks for head h (sorted as wave_step
 * returns them) equal dw's. */
static void check_sets(const kn_ops_t *ops, const kn_wave_t *ref, const float *q, uint32_t n_r, uint32_t n_e,
                       const uint32_t *ids, const uint32_t *counts)
{
    kn_shape_t grp = {.n_q_heads = NQ / NKV, .n_kv_heads = 1, .head_dim = D};
    uint32_t *want = calloc((size_t)n_r + n_e + 1, sizeof(uint32_t)), nr = 0, ne = 0;
    for (uint32_t h = 0; h < NKV; h++) {
        assert_int_equal(kn_rank(ops, &grp, q + (size_t)h * (NQ / NKV) * D, kn_wave_index(ref, h), n_r, n_e, want,
                                 &nr, &ne),
                         RI_OK);
        qsort(want, nr, sizeof(uint32_t), cmp_u32);
        qsort(want + nr, ne, sizeof(uint32_t), cmp_u32);
        assert_int_equal(counts[2 * h], nr);
        assert_int_equal(counts[2 * h + 1], ne);
        assert_memory_equal(ids + (size_t)h * (n_r + n_e), want, ((size_t)nr + ne) * sizeof(uint32_t));
    }
    free(want);
}

/* The two indexes hold the same clusters. */
static void check_same_index(const kn_wave_t *a, const kn_wave_t *b)
{
    for (uint32_t h = 0; h < NKV; h++) {
        const kn_index_t *x = kn_wave_index(a, h), *y = kn_wave_index(b, h);
        assert_int_equal(x->n_clusters, y->n_clusters);
        assert_int_equal(x->n_tokens, y->n_tokens);
        assert_memory_equal(x->sizes, y->sizes, x->n_clusters * sizeof(uint32_t));
        assert_memory_equal(x->perm, y->perm, x->n_tokens * sizeof(uint32_t));
    }
    assert_int_equal(kn_wave_indexed_end(a), kn_wave_indexed_end(b));
}

static void run_against_wave(const fix_t *f, const kn_ops_t *ops)
{
    kn_shape_t shape = {.n_q_heads = NQ, .n_kv_heads = NKV, .head_dim = D};
    kn_wave_params_t wp = f->wp;
    mdl_dwave_t *dw = NULL;
    kn_wave_t *ref = NULL;
    char err[256] = "";
    float q[NQ * D], o1[NQ * D], o2[NQ * D], worst = 0;
    uint32_t counts[2 * NKV], n_r, n_e, updates = 0, selective = 0;
    uint32_t *ids = calloc((size_t)NKV * 4096, sizeof(uint32_t));

    wp.ops = ops;
    assert_int_equal(mdl_dwave_create(&shape, &wp, ops, kn_mem_host(), &dw, err, sizeof(err)), RI_OK);
    assert_int_equal(kn_wave_create(&shape, &wp, &ref), RI_OK);
    kn_kv_view_t kv = view(f, PROMPT);
    assert_int_equal(mdl_dwave_build(dw, &kv), RI_OK);
    assert_int_equal(kn_wave_build(ref, &kv), RI_OK);
    check_same_index(mdl_dwave_wave(dw), ref);
    assert_true(kn_wave_index(ref, 0)->n_clusters > 0); /* the prompt indexed something */
    size_t first_end = kn_wave_indexed_end(ref);

    for (uint32_t s = 0; s < STEPS; s++) {
        bool u1 = false, u2 = false;
        kv = view(f, PROMPT + s + 1);
        assert_int_equal(mdl_dwave_update(dw, &kv, &u1), RI_OK);
        assert_int_equal(kn_wave_update(ref, &kv, &u2), RI_OK);
        assert_int_equal(u1, u2);
        updates += u1;
        check_same_index(mdl_dwave_wave(dw), ref);
        assert_int_equal(kn_synth_query(&f->sp, s, q), RI_OK);
        mdl_dwave_budget(dw, &n_r, &n_e);
        assert_true(((size_t)n_r + n_e) * NKV <= 4096);
        assert_int_equal(mdl_dwave_step(dw, q, &kv, o1, ids, counts), RI_OK);
        assert_int_equal(kn_wave_decode(ref, q, &kv, o2, NULL, NULL), RI_OK);
        float r = range_of(o2, NQ * D), e = max_diff(o1, o2, NQ * D) / r;
        worst = fmaxf(worst, e);
        assert_true(e <= TOL);
        check_sets(ops, ref, q, n_r, n_e, ids, counts);
        selective += counts[0] < kn_wave_index(ref, 0)->n_clusters && counts[1] > 0;
    }
    assert_true(updates >= 2);                           /* the index grew through updates */
    assert_true(kn_wave_indexed_end(ref) > first_end);
    assert_int_equal(selective, STEPS);                  /* every step retrieved a part, estimated a part */

    mdl_dwave_stats_t st;
    mdl_dwave_stats(dw, &st);
    assert_int_equal(st.steps, STEPS);
    assert_true(st.exact_tokens > 0 && st.exact_tokens < (uint64_t)STEPS * (PROMPT + STEPS));
    assert_true(st.bytes_read > 0 && st.index_bytes > 0);
    printf("  %s: worst |diff| / range %.2e over %u steps, %u updates, %u clusters a head\n", ops->name,
           (double)worst, STEPS, updates, kn_wave_index(ref, 0)->n_clusters);
    mdl_dwave_destroy(dw);
    kn_wave_destroy(ref);
    free(ids);
}

static void test_cpu_matches_wave(void **state)
{
    run_against_wave(*state, kn_ops_cpu());
}

static void test_ref_matches_wave(void **state)
{
    run_against_wave(*state, kn_ops_ref());
}

/* A head table made here from the in-process wave's index: with the
 * steady zone it gives kn_wave_decode's output; with either steady page
 * dropped the output moves by far more than the tolerance above, so a
 * mdl_dwave that lost its steady zone would fail the checks above. */
static void test_mutant_steady_zone(void **state)
{
    const fix_t *f = *state;
    const kn_ops_t *ops = kn_ops_cpu();
    kn_shape_t shape = {.n_q_heads = NQ, .n_kv_heads = NKV, .head_dim = D};
    kn_wave_params_t wp = f->wp;
    kn_wave_t *ref = NULL;
    kn_wave_head_t heads[NKV];
    cm_fp16_t *ck[NKV], *cv[NKV];
    float q[NQ * D], o[NQ * D], want[NQ * D], lse[NQ];
    uint32_t n_r, n_e;

    wp.ops = ops;
    assert_int_equal(kn_wave_create(&shape, &wp, &ref), RI_OK);
    kn_kv_view_t kv = view(f, PROMPT + 40);
    assert_int_equal(kn_wave_build(ref, &kv), RI_OK);
    assert_int_equal(kn_synth_query(&f->sp, 3, q), RI_OK);
    assert_int_equal(kn_wave_decode(ref, q, &kv, want, NULL, NULL), RI_OK);
    kn_wave_budget(ref, &n_r, &n_e);
    size_t sink = wp.sink_tokens, tail0 = kn_wave_indexed_end(ref);
    for (uint32_t h = 0; h < NKV; h++) {
        const kn_index_t *idx = kn_wave_index(ref, h);
        ck[h] = malloc((size_t)idx->n_tokens * D * sizeof(cm_fp16_t));
        cv[h] = malloc((size_t)idx->n_tokens * D * sizeof(cm_fp16_t));
        for (uint32_t r = 0; r < idx->n_tokens; r++) {
            size_t src = (size_t)h * kv.head_stride + (size_t)idx->perm[r] * D;
            memcpy(ck[h] + (size_t)r * D, kv.k + src, D * sizeof(cm_fp16_t));
            memcpy(cv[h] + (size_t)r * D, kv.v + src, D * sizeof(cm_fp16_t));
        }
        size_t hoff = (size_t)h * kv.head_stride;
        heads[h] = (kn_wave_head_t){ .centroids = idx->centroids,
                                     .cscale = idx->cscale,
                                     .sizes = idx->sizes,
                                     .offsets = idx->offsets,
                                     .vq = idx->vq,
                                     .vscale = idx->vscale,
                                     .ck = ck[h],
                                     .cv = cv[h],
                                     .n_clusters = idx->n_clusters };
        heads[h].steady[0] = (kn_page_t){kv.k + hoff, kv.v + hoff, (uint32_t)sink, D};
        heads[h].steady[1] = (kn_page_t){kv.k + hoff + tail0 * D, kv.v + hoff + tail0 * D,
                                         (uint32_t)(kv.n_tokens - tail0), D};
    }
    float r = range_of(want, NQ * D);
    assert_int_equal(ops->wave_step(&shape, q, heads, n_r, n_e, o, lse, NULL, NULL), RI_OK);
    assert_true(max_diff(o, want, NQ * D) / r <= TOL);
    for (int z = 0; z < 2; z++) {
        kn_page_t keep[NKV];
        for (uint32_t h = 0; h < NKV; h++) {
            keep[h] = heads[h].steady[z];
            heads[h].steady[z].n_tokens = 0;
        }
        assert_int_equal(ops->wave_step(&shape, q, heads, n_r, n_e, o, lse, NULL, NULL), RI_OK);
        float e = max_diff(o, want, NQ * D) / r;
        printf("  steady page %d dropped: |diff| / range %.2e\n", z, (double)e);
        assert_true(e > 100 * TOL);
        for (uint32_t h = 0; h < NKV; h++)
            heads[h].steady[z] = keep[h];
    }
    for (uint32_t h = 0; h < NKV; h++)
        free(ck[h]), free(cv[h]);
    kn_wave_destroy(ref);
}

/* Short prompt: nothing indexed, the step is exact attention (the wave's
 * decode then too), and the first update makes the index. */
static void test_short_prompt_then_update(void **state)
{
    const fix_t *f = *state;
    kn_shape_t shape = {.n_q_heads = NQ, .n_kv_heads = NKV, .head_dim = D};
    kn_wave_params_t wp = f->wp;
    mdl_dwave_t *dw = NULL;
    kn_wave_t *ref = NULL;
    float q[NQ * D], o1[NQ * D], o2[NQ * D];
    uint32_t counts[2 * NKV];

    wp.ops = kn_ops_cpu();
    assert_int_equal(mdl_dwave_create(&shape, &wp, wp.ops, kn_mem_host(), &dw, NULL, 0), RI_OK);
    assert_int_equal(kn_wave_create(&shape, &wp, &ref), RI_OK);
    kn_kv_view_t kv = view(f, 40);
    assert_int_equal(mdl_dwave_build(dw, &kv), RI_OK);
    assert_int_equal(kn_wave_build(ref, &kv), RI_OK);
    for (size_t n = 41; n <= 120; n++) {
        kv = view(f, n);
        assert_int_equal(mdl_dwave_update(dw, &kv, NULL), RI_OK);
        assert_int_equal(kn_wave_update(ref, &kv, NULL), RI_OK);
        assert_int_equal(kn_synth_query(&f->sp, n, q), RI_OK);
        assert_int_equal(mdl_dwave_step(dw, q, &kv, o1, NULL, counts), RI_OK);
        assert_int_equal(kn_wave_decode(ref, q, &kv, o2, NULL, NULL), RI_OK);
        assert_true(max_diff(o1, o2, NQ * D) / range_of(o2, NQ * D) <= TOL);
        if (n < (size_t)wp.sink_tokens + wp.window_tokens + wp.update_tokens)
            assert_int_equal(counts[0] + counts[1], 0);
    }
    check_same_index(mdl_dwave_wave(dw), ref);
    assert_true(kn_wave_index(ref, 0)->n_clusters > 0);
    mdl_dwave_destroy(dw);
    kn_wave_destroy(ref);
}

static void test_refuses(void **state)
{
    const fix_t *f = *state;
    kn_shape_t shape = {.n_q_heads = NQ, .n_kv_heads = NKV, .head_dim = D}, bad = shape;
    kn_wave_params_t wp = f->wp;
    mdl_dwave_t *dw = (mdl_dwave_t *)&shape; /* must stay untouched */
    char err[256] = "";

    wp.adapt_tau = 0.05f;
    assert_int_equal(mdl_dwave_create(&shape, &wp, kn_ops_cpu(), kn_mem_host(), &dw, err, sizeof(err)),
                     RI_ERR_UNSUPPORTED);
    assert_non_null(strstr(err, "adapt_tau"));
    assert_ptr_equal(dw, (mdl_dwave_t *)&shape);
    bad.n_kv_heads = 3;
    assert_int_equal(mdl_dwave_create(&bad, &f->wp, kn_ops_cpu(), kn_mem_host(), &dw, err, sizeof(err)),
                     RI_ERR_INVALID);
    assert_int_equal(mdl_dwave_create(&shape, &f->wp, NULL, kn_mem_host(), &dw, NULL, 0), RI_ERR_INVALID);
    assert_ptr_equal(dw, (mdl_dwave_t *)&shape);

    /* a step over a view that no longer covers the index is refused */
    assert_int_equal(mdl_dwave_create(&shape, &f->wp, kn_ops_cpu(), kn_mem_host(), &dw, NULL, 0), RI_OK);
    kn_kv_view_t kv = view(f, PROMPT);
    assert_int_equal(mdl_dwave_build(dw, &kv), RI_OK);
    float q[NQ * D] = {0}, o[NQ * D];
    kv.n_tokens = 10;
    assert_int_equal(mdl_dwave_step(dw, q, &kv, o, NULL, NULL), RI_ERR_INVALID);
    assert_int_equal(mdl_dwave_build(dw, &kv), RI_ERR_INVALID); /* once only */
    mdl_dwave_destroy(dw);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_cpu_matches_wave, setup, teardown),
        cmocka_unit_test_setup_teardown(test_ref_matches_wave, setup, teardown),
        cmocka_unit_test_setup_teardown(test_mutant_steady_zone, setup, teardown),
        cmocka_unit_test_setup_teardown(test_short_prompt_then_update, setup, teardown),
        cmocka_unit_test_setup_teardown(test_refuses, setup, teardown),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
