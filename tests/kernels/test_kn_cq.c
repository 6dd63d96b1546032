/*
 * The int8 centroids of the wave index: a built index's centroid (int8 row
 * times its fp32 scale) within half the cluster's scale of the fp32 mean of
 * its keys, the largest element at +-127; an all-zero centroid at scale 0,
 * ranked by its logit 0 between the positive and the negative ones; and the
 * rank of a hand-made index whose clusters differ in norm (so the scale
 * decides the order) in the order its fp32 and fp16 centroids give, on
 * every host backend.
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

#include "common/cm_half.h"
#include "kernels/kn_ops.h"
#include "tests/kernels/kn_test_index.h"

#define CQ_D 64
#define CQ_C 4

static void test_built_centroids_within_half_a_step(void **state)
{
    const uint32_t d = CQ_D, n = 4096, C = 1024;
    kn_index_t idx;
    cm_fp16_t *k, *v;
    (void)state;
    kn_test_one_head_kv(d, n, &k, &v);
    kn_index_init(&idx, d);
    assert_int_equal(kn_index_build(NULL, NULL, k, v, d, n, 0, C, 1, &idx), RI_OK);
    assert_non_null(idx.cscale);
    for (uint32_t j = 0; j < idx.n_clusters; j++) {
        double s = idx.cscale[j], m = 0.0;
        int qmax = 0;
        for (uint32_t i = 0; i < d; i++) {
            double sum = 0.0, want, got = (double)idx.centroids[(size_t)j * d + i] * s;
            for (uint32_t r = idx.offsets[j]; r < idx.offsets[j + 1]; r++)
                sum += cm_fp16_to_f32(k[(size_t)idx.perm[r] * d + i]);
            want = idx.sizes[j] ? sum / idx.sizes[j] : 0.0;
            m = fmax(m, fabs(want));
            /* half a step, and the fp32 rounding of the build's mean */
            if (fabs(got - want) > s / 2.0 * (1.0 + 1e-6) + 1e-6 * (1.0 + fabs(want)))
                fail_msg("cluster %u dim %u: centroid %g * %g = %g, mean %g (off by %g > half the scale)", j, i,
                         (double)idx.centroids[(size_t)j * d + i], s, got, want, fabs(got - want));
            qmax = abs(idx.centroids[(size_t)j * d + i]) > qmax ? abs(idx.centroids[(size_t)j * d + i]) : qmax;
        }
        if (m > 0.0)
            assert_int_equal(qmax, 127); /* the scale uses the whole range */
    }
    kn_index_cleanup(&idx);
    free(k);
    free(v);
}

/* A hand-made index of CQ_C clusters of one token each from fp32 rows c,
 * quantized as a build quantizes them.  Arrays owned by the index's fields
 * (freed by kn_test_index_free). */
static void cq_index(kn_index_t *idx, float c[CQ_C][CQ_D])
{
    kn_index_init(idx, CQ_D);
    idx->centroids = calloc(CQ_C, CQ_D);
    idx->cscale = calloc(CQ_C, sizeof(float));
    idx->vsum = calloc((size_t)CQ_C * CQ_D, sizeof(float));
    idx->sizes = calloc(CQ_C, sizeof(uint32_t));
    idx->offsets = calloc(CQ_C + 1, sizeof(uint32_t));
    idx->perm = calloc(CQ_C, sizeof(uint32_t));
    assert_true(idx->centroids && idx->cscale && idx->vsum && idx->sizes && idx->offsets && idx->perm);
    for (uint32_t j = 0; j < CQ_C; j++) {
        kn_vq_quantize(c[j], 1.0f, CQ_D, idx->centroids + (size_t)j * CQ_D, &idx->cscale[j]);
        idx->sizes[j] = 1;
        idx->offsets[j + 1] = j + 1;
        idx->perm[j] = j;
    }
    idx->n_clusters = idx->cap_clusters = CQ_C;
    idx->n_tokens = idx->cap_tokens = CQ_C;
}

/* The order of q . c_j, best first (no ties in the cases below): in fp32
 * with half16 = false, else over the rows rounded to fp16. */
static void cq_order(const float *q, float c[CQ_C][CQ_D], bool half16, uint32_t *order)
{
    double s[CQ_C];
    for (uint32_t j = 0; j < CQ_C; j++) {
        s[j] = 0.0;
        for (uint32_t i = 0; i < CQ_D; i++)
            s[j] += (double)q[i] * (half16 ? cm_fp16_to_f32(cm_f32_to_fp16(c[j][i])) : c[j][i]);
        order[j] = j;
    }
    for (uint32_t a = 0; a < CQ_C; a++)
        for (uint32_t b = a + 1; b < CQ_C; b++)
            if (s[order[b]] > s[order[a]]) {
                uint32_t t = order[a];
                order[a] = order[b];
                order[b] = t;
            }
}

/* The rank's top-k set for k = 1 .. CQ_C - 1 must be the first k of want
 * (the rank emits a set in id order, so the order shows set by set). */
static void cq_expect_rank(const kn_ops_t *ops, const float *q, const kn_index_t *idx, const uint32_t *want)
{
    kn_shape_t grp = { 1, 1, CQ_D, 0 };
    for (uint32_t k = 1; k < CQ_C; k++) {
        uint32_t ids[CQ_C], nr = 0, ne = 0;
        assert_int_equal(kn_rank(ops, &grp, q, idx, k, 0, ids, &nr, &ne), RI_OK);
        assert_int_equal(nr, k);
        for (uint32_t a = 0; a < k; a++) {
            bool in = false;
            for (uint32_t b = 0; b < k; b++)
                in = in || ids[b] == want[a];
            if (!in)
                fail_msg("%s rank: cluster %u not in the top %u (rank order broken: the scale left out?)", ops->name,
                         want[a], k);
        }
    }
}

/* Clusters of different norms along the same directions: the int8 rows
 * alone (without their scales) would put the small cluster 0 first. */
static void test_rank_order_hand_made(void **state)
{
    float c[CQ_C][CQ_D] = { { 0 } }, q[CQ_D] = { 0 };
    uint32_t want[CQ_C], half[CQ_C];
    const kn_ops_t *ops[2] = { kn_ops_ref(), kn_ops_cpu() };
    kn_index_t idx;
    (void)state;
    c[0][0] = 0.125f;               /* logit 0.125 (its int8 row alone: 8 * 127) */
    c[1][0] = 1.0f, c[1][1] = 1.0f; /* logit 0.9 (its int8 row alone: 7.2 * 127, less) */
    c[2][0] = -0.5f;                /* logit -0.5 */
    /* c[3] all zero: logit 0, scale 0 */
    q[0] = 8.0f, q[1] = -0.8f; /* logits q.c / sqrt(64) */
    cq_order(q, c, false, want);
    cq_order(q, c, true, half);
    assert_memory_equal(want, half, sizeof(want)); /* a case where fp16 and int8 agree */
    assert_int_equal(want[0], 1);
    assert_int_equal(want[1], 0);
    assert_int_equal(want[2], 3);
    cq_index(&idx, c);
    assert_true(idx.cscale[3] == 0.0f);
    for (uint32_t i = 0; i < CQ_D; i++)
        assert_int_equal(idx.centroids[3 * CQ_D + i], 0);
    for (int b = 0; b < 2; b++)
        cq_expect_rank(ops[b], q, &idx, want);
    kn_test_index_free(&idx);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_built_centroids_within_half_a_step),
        cmocka_unit_test(test_rank_order_hand_made),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
