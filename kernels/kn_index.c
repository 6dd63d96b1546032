/*
 * Wave-index build (docs/architecture.md), shared by every CPU backend; only
 * the assignment kernel (argmax of inner products, the O(n*C*d) part) differs.
 *
 *   1. centre: mu = mean(K), K' = K - mu
 *   2. per segment, centroids from evenly strided tokens (normalised)
 *   3. up to iters rounds of spherical k-means inside each segment; an empty
 *      cluster keeps its old centroid; a segment stops early once a round's
 *      assignment moved at most p->stop_moved of its tokens (converged: the
 *      rounds after it would move next to nothing, and each costs n*C*d)
 *   4. final reassignment of every key against all centroids (or its own
 *      segment +- final_neighbours segments); stored centroid = mean of the
 *      real keys (int8 + one scale), value sums in fp32, sizes,
 *      cluster-major permutation
 *
 * Deterministic: no randomness, fixed loop orders, single-threaded per call.
 */
#include <math.h>
#include <string.h>

#include "common/cm_status.h"
#include "kernels/kn_internal.h"

static void kn_normalise(float *c, uint32_t d)
{
    double s = 0.0;
    for (uint32_t i = 0; i < d; i++)
        s += (double)c[i] * c[i];
    if (s > 0.0) {
        float inv = (float)(1.0 / sqrt(s));
        for (uint32_t i = 0; i < d; i++)
            c[i] *= inv;
    }
}

/* One segment: tokens [t0, t1) of x, clusters [c0, c1) of cent. */
static void kn_kmeans_segment(const float *x, uint32_t t0, uint32_t t1, float *cent, uint32_t c0,
                              uint32_t c1, uint32_t d, const kn_build_params_t *p, uint32_t *assign,
                              uint32_t *prev, double *sum, uint32_t *count, kn_assign_fn_t fn)
{
    uint32_t nt = t1 - t0, nc = c1 - c0;
    uint64_t stop = (uint64_t)((double)p->stop_moved * nt);
    for (uint32_t j = 0; j < nc; j++) {
        uint32_t t = t0 + (uint32_t)((uint64_t)j * nt / nc);
        memcpy(cent + (size_t)(c0 + j) * d, x + (size_t)t * d, d * sizeof(float));
        kn_normalise(cent + (size_t)(c0 + j) * d, d);
    }
    for (uint32_t it = 0; it < p->iters; it++) {
        fn(x + (size_t)t0 * d, nt, cent + (size_t)c0 * d, nc, d, assign + t0);
        if (it > 0) {
            uint64_t moved = 0;
            for (uint32_t t = t0; t < t1; t++)
                moved += assign[t] != prev[t];
            if (moved <= stop)
                break; /* converged: the centroids would barely change */
        }
        memcpy(prev + t0, assign + t0, (size_t)nt * sizeof(uint32_t));
        memset(sum, 0, (size_t)nc * d * sizeof(double));
        memset(count, 0, nc * sizeof(uint32_t));
        for (uint32_t t = t0; t < t1; t++) {
            uint32_t j = assign[t];
            count[j]++;
            for (uint32_t i = 0; i < d; i++)
                sum[(size_t)j * d + i] += x[(size_t)t * d + i];
        }
        for (uint32_t j = 0; j < nc; j++) {
            float *c = cent + (size_t)(c0 + j) * d;
            double nn = 0.0;
            if (count[j] == 0)
                continue;  /* empty: keep the old centroid */
            for (uint32_t i = 0; i < d; i++)
                nn += sum[(size_t)j * d + i] * sum[(size_t)j * d + i];
            if (nn == 0.0)
                continue;
            for (uint32_t i = 0; i < d; i++)
                c[i] = (float)(sum[(size_t)j * d + i] / sqrt(nn));
        }
    }
}

ri_status_t kn_index_build_impl(const kn_build_params_t *p, const cm_fp16_t *k, const cm_fp16_t *v,
                                size_t stride, uint32_t n, uint32_t token_base,
                                uint32_t n_clusters, uint32_t n_segments, kn_index_t *idx,
                                kn_assign_fn_t fn)
{
    uint32_t d = idx->head_dim, C = n_clusters, S = n_segments;
    uint32_t cmax = 0;
    float *x = NULL, *cent = NULL, *vrow = NULL;
    double *mu = NULL, *sum = NULL, *csum = NULL;
    uint32_t *assign = NULL, *prev = NULL, *count = NULL, *pos = NULL;
    ri_status_t st = RI_ERR_NOMEM;

    if (n == 0)
        S = 1;
    for (uint32_t s = 0; s < S; s++)
        cmax = CM_MAX(cmax, (uint32_t)((uint64_t)(s + 1) * C / S - (uint64_t)s * C / S));
    st = kn_index_reserve(idx, C, n);
    if (st != RI_OK)
        return st;
    st = RI_ERR_NOMEM;
    x = cm_malloc(&kn_tag, ((size_t)n + 1) * d * sizeof(float));
    cent = cm_malloc(&kn_tag, (size_t)C * d * sizeof(float));
    vrow = cm_malloc(&kn_tag, (size_t)d * sizeof(float));
    mu = cm_calloc(&kn_tag, d, sizeof(double));
    sum = cm_malloc(&kn_tag, (size_t)cmax * d * sizeof(double));
    csum = cm_calloc(&kn_tag, (size_t)C * d, sizeof(double));
    assign = cm_malloc(&kn_tag, ((size_t)n + 1) * sizeof(uint32_t));
    prev = cm_malloc(&kn_tag, ((size_t)n + 1) * sizeof(uint32_t));
    count = cm_calloc(&kn_tag, C, sizeof(uint32_t));
    pos = cm_malloc(&kn_tag, ((size_t)C + 1) * sizeof(uint32_t));
    if (!x || !cent || !vrow || !mu || !sum || !csum || !assign || !prev || !count || !pos)
        goto out;

    /* 1. centre */
    for (uint32_t t = 0; t < n; t++) {
        cm_fp16_to_f32_n(x + (size_t)t * d, k + (size_t)t * stride, d);
        for (uint32_t i = 0; i < d; i++)
            mu[i] += x[(size_t)t * d + i];
    }
    for (uint32_t i = 0; i < d; i++)
        mu[i] /= (n ? n : 1);
    for (uint32_t t = 0; t < n; t++)
        for (uint32_t i = 0; i < d; i++)
            x[(size_t)t * d + i] = (float)(x[(size_t)t * d + i] - mu[i]);

    /* 2-3. segmented spherical k-means */
    for (uint32_t s = 0; s < S && n > 0; s++) {
        uint32_t t0 = (uint32_t)((uint64_t)s * n / S), t1 = (uint32_t)((uint64_t)(s + 1) * n / S);
        uint32_t c0 = (uint32_t)((uint64_t)s * C / S), c1 = (uint32_t)((uint64_t)(s + 1) * C / S);
        if (t1 == t0) {
            for (uint32_t j = c0; j < c1; j++)
                memset(cent + (size_t)j * d, 0, d * sizeof(float));
            continue;
        }
        kn_kmeans_segment(x, t0, t1, cent, c0, c1, d, p, assign, prev, sum, count, fn);
    }

    /* 4. final reassignment */
    for (uint32_t s = 0; s < S && n > 0; s++) {
        uint32_t t0 = (uint32_t)((uint64_t)s * n / S), t1 = (uint32_t)((uint64_t)(s + 1) * n / S);
        uint32_t slo = 0, shi = S, c0, c1;
        if (p->final_neighbours >= 0) {
            slo = s > (uint32_t)p->final_neighbours ? s - (uint32_t)p->final_neighbours : 0;
            shi = CM_MIN(S, s + (uint32_t)p->final_neighbours + 1);
        }
        c0 = (uint32_t)((uint64_t)slo * C / S);
        c1 = (uint32_t)((uint64_t)shi * C / S);
        if (t1 == t0)
            continue;
        fn(x + (size_t)t0 * d, t1 - t0, cent + (size_t)c0 * d, c1 - c0, d, assign + t0);
        for (uint32_t t = t0; t < t1; t++)
            assign[t] += c0;
    }

    /* sizes, offsets, perm, centroid = mean of real keys, value sums */
    memset(count, 0, (size_t)C * sizeof(uint32_t));  /* was k-means scratch */
    for (uint32_t t = 0; t < n; t++)
        count[assign[t]]++;
    pos[0] = idx->n_tokens;
    for (uint32_t j = 0; j < C; j++)
        pos[j + 1] = pos[j] + count[j];
    for (uint32_t j = 0; j < C; j++) {
        uint32_t g = idx->n_clusters + j;
        idx->sizes[g] = count[j];
        if (idx->offsets[g] != pos[j]) /* j == 0: already n_tokens, maybe a shared home's page */
            idx->offsets[g] = pos[j];
        idx->offsets[g + 1] = pos[j + 1];
        memset(idx->vsum + (size_t)g * d, 0, d * sizeof(float));
    }
    for (uint32_t t = 0; t < n; t++) {
        uint32_t j = assign[t], g = idx->n_clusters + j;
        idx->perm[pos[j]++] = token_base + t;
        cm_fp16_to_f32_n(vrow, v + (size_t)t * stride, d);
        for (uint32_t i = 0; i < d; i++) {
            csum[(size_t)j * d + i] += x[(size_t)t * d + i];
            idx->vsum[(size_t)g * d + i] += vrow[i];  /* fp32 accumulation, by design */
        }
    }
    /* the fp32 mean, then int8 with one scale (the value means' rule): the
     * k-means above never sees the quantized rows, only ranking does */
    for (uint32_t j = 0; j < C; j++) {
        uint32_t g = idx->n_clusters + j;
        for (uint32_t i = 0; i < d; i++)
            vrow[i] = count[j] ? (float)(csum[(size_t)j * d + i] / count[j] + mu[i]) : 0.0f;
        kn_vq_quantize(vrow, 1.0f, d, idx->centroids + (size_t)g * d, &idx->cscale[g]);
    }
    idx->n_clusters += C;
    idx->n_tokens += n;
    st = RI_OK;
out:
    cm_free(x);
    cm_free(cent);
    cm_free(vrow);
    cm_free(mu);
    cm_free(sum);
    cm_free(csum);
    cm_free(assign);
    cm_free(prev);
    cm_free(count);
    cm_free(pos);
    return st;
}
