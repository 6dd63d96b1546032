/*
 * The scalar reference backend: plain loops, double accumulation for logits,
 * softmax sums and outputs.  It is the oracle of the cross-check harness and
 * the fallback for any case another backend does not support, so clarity
 * beats speed here.
 */
#define _GNU_SOURCE
#include <float.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "common/cm_alloc.h"
#include "common/cm_status.h"
#include "kernels/kn_internal.h"

bool kn_ref_supports(kn_op_t op, const kn_shape_t *shape, kn_dtype_t dtype)
{
    (void)op;
    return dtype == KN_DTYPE_F16 && (shape == NULL || kn_shape_valid(shape));
}

static double kn_ref_dot_h(const float *q, const cm_fp16_t *k, uint32_t d)
{
    double s = 0.0;
    for (uint32_t i = 0; i < d; i++)
        s += (double)q[i] * (double)cm_fp16_to_f32(k[i]);
    return s;
}

/* cscale[j] * q . c8[j]: an int8 centroid as ranking reads it (the dot in
 * double here, as kn_ref_dot_h). */
static double kn_ref_dot_c(const float *q, const kn_index_t *idx, uint32_t j, uint32_t d)
{
    const int8_t *c = idx->centroids + (size_t)j * d;
    double s = 0.0;
    for (uint32_t i = 0; i < d; i++)
        s += (double)q[i] * (double)c[i];
#ifdef KN_CQ_MUTANT_NOSCALE /* the tests' mutant: the scale left out, ranking by the raw int8 dot */
    return s;
#endif
    return s * (double)idx->cscale[j];
}

/* Exact attention of one query row over a list of rows given by pointers. */
typedef struct kn_ref_rows {
    const cm_fp16_t **k;
    const cm_fp16_t **v;
    size_t n;
} kn_ref_rows_t;

static ri_status_t kn_ref_attend(const float *q, uint32_t d, float scale, const kn_ref_rows_t *rows,
                                 float *o, float *lse)
{
    double *logit, m = -INFINITY, sum = 0.0;
    double *acc;

    if (rows->n == 0) {
        memset(o, 0, d * sizeof(float));
        *lse = -INFINITY;
        return RI_OK;
    }
    logit = cm_malloc(&kn_tag, rows->n * sizeof(double));
    acc = cm_calloc(&kn_tag, d, sizeof(double));
    if (logit == NULL || acc == NULL) {
        cm_free(logit);
        cm_free(acc);
        return RI_ERR_NOMEM;
    }
    for (size_t t = 0; t < rows->n; t++) {
        logit[t] = (double)scale * kn_ref_dot_h(q, rows->k[t], d);
        if (logit[t] > m)
            m = logit[t];
    }
    for (size_t t = 0; t < rows->n; t++) {
        double p = exp(logit[t] - m);
        sum += p;
        for (uint32_t i = 0; i < d; i++)
            acc[i] += p * (double)cm_fp16_to_f32(rows->v[t][i]);
    }
    for (uint32_t i = 0; i < d; i++)
        o[i] = (float)(acc[i] / sum);
    *lse = (float)(m + log(sum));
    cm_free(logit);
    cm_free(acc);
    return RI_OK;
}

static ri_status_t kn_ref_rows_alloc(kn_ref_rows_t *rows, size_t n)
{
    rows->n = n;
    rows->k = cm_malloc(&kn_tag, (n ? n : 1) * sizeof(*rows->k));
    rows->v = cm_malloc(&kn_tag, (n ? n : 1) * sizeof(*rows->v));
    if (rows->k == NULL || rows->v == NULL) {
        cm_free(rows->k);
        cm_free(rows->v);
        return RI_ERR_NOMEM;
    }
    return RI_OK;
}

static void kn_ref_rows_free(kn_ref_rows_t *rows)
{
    cm_free(rows->k);
    cm_free(rows->v);
}

ri_status_t kn_ref_attn_decode(const kn_shape_t *shape, size_t n_seq, const float *q,
                               const kn_kv_view_t *kv, float *out, float *lse)
{
    uint32_t d = shape->head_dim, g = shape->n_q_heads / shape->n_kv_heads;
    float scale = kn_shape_scale(shape);
    ri_status_t st = RI_OK;

    for (size_t s = 0; s < n_seq && st == RI_OK; s++) {
        kn_ref_rows_t rows;
        st = kn_ref_rows_alloc(&rows, kv[s].n_tokens);
        if (st != RI_OK)
            break;
        for (uint32_t h = 0; h < shape->n_q_heads && st == RI_OK; h++) {
            size_t off = (size_t)(h / g) * kv[s].head_stride;
            size_t row = (s * shape->n_q_heads + h);
            float dummy;
            for (size_t t = 0; t < rows.n; t++) {
                rows.k[t] = kv[s].k + off + t * kv[s].token_stride;
                rows.v[t] = kv[s].v + off + t * kv[s].token_stride;
            }
            st = kn_ref_attend(q + row * d, d, scale, &rows, out + row * d,
                               lse ? lse + row : &dummy);
        }
        kn_ref_rows_free(&rows);
    }
    return st;
}

ri_status_t kn_ref_attn_pages(const kn_shape_t *grp, const float *q, const kn_page_t *pages,
                              size_t n_pages, float *o, float *lse)
{
    uint32_t d = grp->head_dim;
    size_t n = 0, t = 0;
    kn_ref_rows_t rows;
    ri_status_t st;

    for (size_t p = 0; p < n_pages; p++)
        n += pages[p].n_tokens;
    st = kn_ref_rows_alloc(&rows, n);
    if (st != RI_OK)
        return st;
    for (size_t p = 0; p < n_pages; p++) {
        for (uint32_t i = 0; i < pages[p].n_tokens; i++, t++) {
            rows.k[t] = pages[p].k + (size_t)i * pages[p].stride;
            rows.v[t] = pages[p].v + (size_t)i * pages[p].stride;
        }
    }
    for (uint32_t h = 0; h < grp->n_q_heads && st == RI_OK; h++)
        st = kn_ref_attend(q + (size_t)h * d, d, kn_shape_scale(grp), &rows, o + (size_t)h * d,
                           &lse[h]);
    kn_ref_rows_free(&rows);
    return st;
}

/* Group score of every cluster (softmax per head, summed); empty = -inf. */
static ri_status_t kn_ref_cluster_scores(const kn_shape_t *grp, const float *q,
                                         const kn_index_t *idx, float *score)
{
    uint32_t C = idx->n_clusters, d = grp->head_dim;
    double *logit = cm_malloc(&kn_tag, (C ? C : 1) * sizeof(double));
    double *acc = cm_calloc(&kn_tag, C ? C : 1, sizeof(double));
    bool any = false;

    if (logit == NULL || acc == NULL) {
        cm_free(logit);
        cm_free(acc);
        return RI_ERR_NOMEM;
    }
    for (uint32_t h = 0; h < grp->n_q_heads; h++) {
        double m = -INFINITY, sum = 0.0;
        for (uint32_t j = 0; j < C; j++) {
            if (idx->sizes[j] == 0)
                continue;
            logit[j] = kn_shape_scale(grp) * kn_ref_dot_c(q + (size_t)h * d, idx, j, d);
            if (logit[j] > m)
                m = logit[j];
            any = true;
        }
        for (uint32_t j = 0; j < C; j++)
            if (idx->sizes[j] != 0)
                sum += exp(logit[j] - m);
        for (uint32_t j = 0; j < C; j++)
            if (idx->sizes[j] != 0)
                acc[j] += exp(logit[j] - m) / sum;
    }
    for (uint32_t j = 0; j < C; j++)
        score[j] = (any && idx->sizes[j] != 0) ? (float)acc[j] : -INFINITY;
    cm_free(logit);
    cm_free(acc);
    return RI_OK;
}

static int kn_ref_cmp_desc(const void *a, const void *b, void *key)
{
    uint32_t x = *(const uint32_t *)a, y = *(const uint32_t *)b;
    float sx = ((const float *)key)[x], sy = ((const float *)key)[y];
    if (sx != sy)
        return sx > sy ? -1 : 1;
    return x < y ? -1 : (x > y);
}

ri_status_t kn_ref_rank(const kn_shape_t *grp, const float *q, const kn_index_t *idx, uint32_t n_r,
                        uint32_t n_e, uint32_t *ids, uint32_t *n_r_p, uint32_t *n_e_p)
{
    uint32_t C = idx->n_clusters, avail = 0, k = 0;
    float *score = cm_malloc(&kn_tag, (C ? C : 1) * sizeof(float));
    uint32_t *all = cm_malloc(&kn_tag, (C ? C : 1) * sizeof(uint32_t));
    ri_status_t st = RI_ERR_NOMEM;

    if (score == NULL || all == NULL)
        goto out;
    st = kn_ref_cluster_scores(grp, q, idx, score);
    if (st != RI_OK)
        goto out;
    for (uint32_t j = 0; j < C; j++)
        if (idx->sizes[j] != 0)
            all[avail++] = j;
    /* The reference sorts fully; the optimised backends select partially. */
    qsort_r(all, avail, sizeof(uint32_t), kn_ref_cmp_desc, score);
    n_r = CM_MIN(n_r, avail);
    n_e = CM_MIN(n_e, avail - n_r);
    for (k = 0; k < n_r + n_e; k++)
        ids[k] = all[k];
    *n_r_p = n_r;
    *n_e_p = n_e;
out:
    cm_free(score);
    cm_free(all);
    return st;
}

ri_status_t kn_ref_estimate(const kn_shape_t *grp, const float *q, const kn_index_t *idx,
                            const uint32_t *ids, size_t n, float *o, float *lse)
{
    uint32_t d = grp->head_dim;
    double *logit = cm_malloc(&kn_tag, (n ? n : 1) * sizeof(double));
    double *acc = cm_malloc(&kn_tag, d * sizeof(double));

    if (logit == NULL || acc == NULL) {
        cm_free(logit);
        cm_free(acc);
        return RI_ERR_NOMEM;
    }
    for (uint32_t h = 0; h < grp->n_q_heads; h++) {
        double m = -INFINITY, den = 0.0;
        memset(acc, 0, d * sizeof(double));
        for (size_t e = 0; e < n; e++) {
            uint32_t j = ids[e];
            logit[e] = -INFINITY;
            if (idx->sizes[j] == 0)
                continue;
            logit[e] = kn_shape_scale(grp) * kn_ref_dot_c(q + (size_t)h * d, idx, j, d);
            if (logit[e] + log((double)idx->sizes[j]) > m)
                m = logit[e] + log((double)idx->sizes[j]);
        }
        for (size_t e = 0; e < n && m > -INFINITY; e++) {
            uint32_t j = ids[e];
            if (idx->sizes[j] == 0)
                continue;
            double w = exp(logit[e] + log((double)idx->sizes[j]) - m); /* n_j e^{s_j} */
            den += w;
            for (uint32_t i = 0; i < d; i++)
                acc[i] += idx->vsum ? w / idx->sizes[j] * idx->vsum[(size_t)j * d + i]
                                    : w * kn_vq_at(idx->vq, idx->vscale, j, d, i);
        }
        for (uint32_t i = 0; i < d; i++)
            o[(size_t)h * d + i] = den > 0 ? (float)(acc[i] / den) : 0.0f;
        lse[h] = den > 0 ? (float)(m + log(den)) : -INFINITY;
    }
    cm_free(logit);
    cm_free(acc);
    return RI_OK;
}

ri_status_t kn_ref_merge(size_t n_rows, uint32_t d, size_t n_parts, const float *const *o_parts,
                         const float *const *lse_parts, float *o, float *lse)
{
    for (size_t r = 0; r < n_rows; r++) {
        double m = -INFINITY, den = 0.0;
        for (size_t p = 0; p < n_parts; p++)
            if (lse_parts[p][r] > m)
                m = lse_parts[p][r];
        for (uint32_t i = 0; i < d; i++) {
            double acc = 0.0;
            for (size_t p = 0; p < n_parts && m > -INFINITY; p++)
                if (lse_parts[p][r] > -INFINITY)
                    acc += exp((double)lse_parts[p][r] - m) * o_parts[p][r * d + i];
            o[r * d + i] = (float)acc;
        }
        for (size_t p = 0; p < n_parts && m > -INFINITY; p++)
            if (lse_parts[p][r] > -INFINITY)
                den += exp((double)lse_parts[p][r] - m);
        for (uint32_t i = 0; i < d; i++)
            o[r * d + i] = den > 0 ? (float)(o[r * d + i] / den) : 0.0f;
        lse[r] = den > 0 ? (float)(m + log(den)) : -INFINITY;
    }
    return RI_OK;
}

static void kn_ref_assign(const float *x, size_t n, const float *c, size_t nc, uint32_t d,
                          uint32_t *best)
{
    for (size_t i = 0; i < n; i++) {
        double bs = -INFINITY;
        uint32_t bj = 0;
        for (size_t j = 0; j < nc; j++) {
            double s = 0.0;
            for (uint32_t t = 0; t < d; t++)
                s += (double)x[i * d + t] * c[j * d + t];
            if (s > bs) {
                bs = s;
                bj = (uint32_t)j;
            }
        }
        best[i] = bj;
    }
}

ri_status_t kn_ref_index_build(const kn_build_params_t *p, const cm_fp16_t *k, const cm_fp16_t *v,
                               size_t stride, uint32_t n, uint32_t token_base,
                               uint32_t n_clusters, uint32_t n_segments, kn_index_t *idx)
{
    return kn_index_build_impl(p, k, v, stride, n, token_base, n_clusters, n_segments, idx,
                               kn_ref_assign);
}

ri_status_t kn_ref_quest_score(const kn_shape_t *grp, const float *q, const cm_fp16_t *kmin,
                               const cm_fp16_t *kmax, size_t n_pages, float *scores)
{
    uint32_t d = grp->head_dim;
    for (size_t pg = 0; pg < n_pages; pg++) {
        double best = -INFINITY;
        for (uint32_t h = 0; h < grp->n_q_heads; h++) {
            double s = 0.0;
            for (uint32_t i = 0; i < d; i++) {
                double qi = q[(size_t)h * d + i];
                double a = qi * cm_fp16_to_f32(kmin[pg * d + i]);
                double b = qi * cm_fp16_to_f32(kmax[pg * d + i]);
                s += a > b ? a : b;
            }
            if (s > best)
                best = s;
        }
        scores[pg] = (float)(best * kn_shape_scale(grp));
    }
    return RI_OK;
}

static ri_status_t kn_ref_wave_step(const kn_shape_t *shape, const float *q, const kn_wave_head_t *heads,
                                    uint32_t n_r, uint32_t n_e, float *out, float *lse, uint32_t *ids,
                                    uint32_t *counts)
{
    return kn_wave_step_host(&kn_ref_ops, shape, q, heads, n_r, n_e, out, lse, ids, counts);
}

const kn_ops_t kn_ref_ops = {
    .name = "ref",
    .supports = kn_ref_supports,
    .attn_decode = kn_ref_attn_decode,
    .attn_pages = kn_ref_attn_pages,
    .rank = kn_ref_rank,
    .estimate = kn_ref_estimate,
    .merge = kn_ref_merge,
    .index_build = kn_ref_index_build,
    .quest_score = kn_ref_quest_score,
    .wave_step = kn_ref_wave_step,
};
