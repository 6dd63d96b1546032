/*
 * The int8 value means of the wave index (kn_vq_quantize): every element
 * within half the cluster's scale of the fp32 mean, the largest one at
 * +-127, an all-zero or empty cluster at scale 0; and the meta entry a
 * built index holds at 4, 8 and 16 tokens a cluster (printed: the bytes a
 * cluster and their share of the cluster's fp16 K/V).
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

#include "kernels/kn_ops.h"
#include "tests/kernels/kn_test_index.h"

#define VQ_D 64

static uint64_t vq_state = 0x9e3779b97f4a7c15ull;

static float vq_uniform(void)
{
    vq_state = vq_state * 6364136223846793005ull + 1442695040888963407ull;
    return (float)((vq_state >> 40) / (double)(1u << 24)) * 2.0f - 1.0f;
}

/* Quantize v * mul and check the contract; returns the scale. */
static float vq_check(const float *v, float mul, uint32_t d)
{
    int8_t q[256];
    float scale = -1.0f, m = 0.0f;
    int qmax = 0;
    kn_vq_quantize(v, mul, d, q, &scale);
    for (uint32_t i = 0; i < d; i++)
        m = fmaxf(m, fabsf(v[i] * mul));
    assert_true(scale >= 0.0f);
    for (uint32_t i = 0; i < d; i++) {
        double mean = (double)v[i] * mul, got = (double)q[i] * scale;
        /* half a step, and the fp32 rounding of scale and mean / scale */
        if (fabs(got - mean) > scale / 2.0 * (1.0 + 1e-6) + 1e-7 * fabs(mean))
            fail_msg("element %u: %g * %g = %g, mean %g (off by %g > half the scale)", i, (double)q[i], (double)scale,
                     got, mean, fabs(got - mean));
        assert_true(q[i] >= -127 && q[i] <= 127);
        qmax = abs(q[i]) > qmax ? abs(q[i]) : qmax;
    }
    if (m > 0.0f)
        assert_int_equal(qmax, 127); /* the scale uses the whole range */
    else
        assert_true(scale == 0.0f && qmax == 0);
    return scale;
}

static void test_within_half_a_step(void **state)
{
    float v[VQ_D];
    (void)state;
    /* magnitudes from subnormal-in-fp16 to large, sums (mul = 1/n) and means */
    const float mags[] = { 1e-7f, 3e-5f, 1e-3f, 0.5f, 1.0f, 37.0f, 6e4f };
    for (size_t k = 0; k < sizeof(mags) / sizeof(mags[0]); k++)
        for (int rep = 0; rep < 50; rep++) {
            for (uint32_t i = 0; i < VQ_D; i++)
                v[i] = vq_uniform() * mags[k];
            vq_check(v, 1.0f, VQ_D);
            vq_check(v, 1.0f / 7.0f, VQ_D);
        }
    /* one outlier: the others take few levels, still within half a step */
    for (uint32_t i = 0; i < VQ_D; i++)
        v[i] = vq_uniform() * 0.01f;
    v[13] = -5.0f;
    assert_true(vq_check(v, 1.0f, VQ_D) == 5.0f / 127.0f);
    /* exact levels come back exactly */
    for (uint32_t i = 0; i < VQ_D; i++)
        v[i] = (float)((int)i - 32) * 0.25f; /* max |.| = 8: levels of 8/127 */
    vq_check(v, 1.0f, VQ_D);
}

static void test_zero_and_empty_clusters(void **state)
{
    float z[VQ_D] = { 0 }, v[VQ_D];
    int8_t q[VQ_D];
    float scale = -1.0f;
    (void)state;
    memset(q, 0x55, sizeof(q));
    kn_vq_quantize(z, 1.0f, VQ_D, q, &scale); /* an all-zero mean */
    assert_true(scale == 0.0f);
    for (uint32_t i = 0; i < VQ_D; i++)
        assert_int_equal(q[i], 0);
    for (uint32_t i = 0; i < VQ_D; i++)
        v[i] = vq_uniform();
    memset(q, 0x55, sizeof(q));
    kn_vq_quantize(v, 0.0f, VQ_D, q, &scale); /* an empty cluster: 1 / n_j taken as 0 */
    assert_true(scale == 0.0f);
    for (uint32_t i = 0; i < VQ_D; i++)
        assert_int_equal(q[i], 0);
    /* a mean of a single nonzero element */
    memset(v, 0, sizeof(v));
    v[5] = 3.0f;
    assert_true(vq_check(v, 1.0f, VQ_D) == 3.0f / 127.0f);
}

/* The meta entry of a built index at 4, 8 and 16 tokens a cluster (d = 64):
 * int8 centroid d + fp32 scale 4 + int8 mean d + fp32 scale 4 + size 4 + offset 4 a
 * cluster, perm 4 a token; against the cluster's fp16 K/V, 4d a token. */
static void test_meta_entry_bytes(void **state)
{
    const uint32_t d = VQ_D, n = 4096, tpcs[] = { 4, 8, 16 };
    cm_fp16_t *k, *v;
    (void)state;
    kn_test_one_head_kv(d, n, &k, &v);
    for (size_t t = 0; t < 3; t++) {
        kn_index_t idx;
        uint32_t C = n / tpcs[t];
        kn_index_init(&idx, d);
        assert_int_equal(kn_index_build(NULL, NULL, k, v, d, n, 0, C, 1, &idx), RI_OK);
        assert_int_equal(idx.cap_clusters, C);
        assert_int_equal(idx.cap_tokens, n);
        uint64_t b = kn_index_resident_bytes(&idx);
        assert_int_equal(b, (uint64_t)C * (2 * d + 16) + (uint64_t)n * 4);
        double per = (double)b / C, kv = 4.0 * d * tpcs[t];
        printf("meta entry at %2u tokens a cluster, d = %u: %.0f bytes a cluster = %.1f%% of its fp16 K/V "
               "(%.0f bytes)\n",
               tpcs[t], d, per, 100.0 * per / kv, kv);
        kn_index_cleanup(&idx);
    }
    free(k);
    free(v);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_within_half_a_step),
        cmocka_unit_test(test_zero_and_empty_clusters),
        cmocka_unit_test(test_meta_entry_bytes),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
