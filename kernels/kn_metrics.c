#define _GNU_SOURCE
/* Accuracy metrics (kn_metrics.h).  Plain double arithmetic: these judge the
 * kernels, so they must not share their shortcuts. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "common/cm_status.h"
#include "kernels/kn_internal.h"
#include "kernels/kn_metrics.h"

double kn_metric_rel_l2(const float *o, const float *ref, size_t n)
{
    double e = 0.0, r = 0.0;
    for (size_t i = 0; i < n; i++) {
        double x = (double)o[i] - ref[i];
        e += x * x;
        r += (double)ref[i] * ref[i];
    }
    if (r == 0.0)
        return e == 0.0 ? 0.0 : INFINITY;
    return sqrt(e / r);
}

double kn_metric_cosine(const float *o, const float *ref, size_t n)
{
    double ab = 0.0, aa = 0.0, bb = 0.0;
    for (size_t i = 0; i < n; i++) {
        ab += (double)o[i] * ref[i];
        aa += (double)o[i] * o[i];
        bb += (double)ref[i] * ref[i];
    }
    if (aa == 0.0 && bb == 0.0)
        return 1.0;
    if (aa == 0.0 || bb == 0.0)
        return 0.0;
    return ab / sqrt(aa * bb);
}

ri_status_t kn_true_probs(const kn_shape_t *grp, const float *q, const cm_fp16_t *k,
                          size_t stride, size_t n, double *prob)
{
    uint32_t g = grp->n_q_heads, d = grp->head_dim;
    double scale = kn_shape_scale(grp);
    double *lg = cm_malloc(&kn_tag, (n ? n : 1) * sizeof(double));
    float *row = cm_malloc(&kn_tag, d * sizeof(float));
    if (lg == NULL || row == NULL) {
        cm_free(lg);
        cm_free(row);
        return RI_ERR_NOMEM;
    }
    memset(prob, 0, n * sizeof(double));
    for (uint32_t h = 0; h < g; h++) {
        double m = -INFINITY, sum = 0.0;
        for (size_t t = 0; t < n; t++) {
            double s = 0.0;
            cm_fp16_to_f32_n(row, k + t * stride, d);
            for (uint32_t i = 0; i < d; i++)
                s += (double)q[(size_t)h * d + i] * row[i];
            lg[t] = s * scale;
            m = lg[t] > m ? lg[t] : m;
        }
        for (size_t t = 0; t < n; t++)
            sum += (lg[t] = exp(lg[t] - m));
        for (size_t t = 0; t < n; t++)
            prob[t] += lg[t] / sum / g;
    }
    cm_free(lg);
    cm_free(row);
    return RI_OK;
}

static int kn_cmp_desc_idx(const void *a, const void *b, void *key)
{
    const double *p = key;
    uint32_t x = *(const uint32_t *)a, y = *(const uint32_t *)b;
    if (p[x] != p[y])
        return p[x] > p[y] ? -1 : 1;
    return x < y ? -1 : (x > y);
}

ri_status_t kn_oracle_mask(const double *prob, size_t n, size_t B, uint8_t *mask)
{
    uint32_t *ids = cm_malloc(&kn_tag, (n ? n : 1) * sizeof(uint32_t));
    if (ids == NULL)
        return RI_ERR_NOMEM;
    for (size_t i = 0; i < n; i++)
        ids[i] = (uint32_t)i;
    qsort_r(ids, n, sizeof(uint32_t), kn_cmp_desc_idx, (void *)prob);
    memset(mask, 0, n);
    for (size_t i = 0; i < CM_MIN(B, n); i++)
        mask[ids[i]] = 1;
    cm_free(ids);
    return RI_OK;
}

double kn_metric_recall(const double *prob, size_t n, const uint8_t *mask, size_t k)
{
    uint8_t *top;
    size_t hit = 0;
    k = CM_MIN(k, n);
    if (k == 0)
        return 1.0;
    top = cm_malloc(&kn_tag, n);
    if (top == NULL || kn_oracle_mask(prob, n, k, top) != RI_OK) {
        cm_free(top);
        return NAN;
    }
    for (size_t t = 0; t < n; t++)
        hit += top[t] && mask[t];
    cm_free(top);
    return (double)hit / (double)k;
}

double kn_metric_mass(const double *prob, size_t n, const uint8_t *mask)
{
    double m = 0.0;
    for (size_t t = 0; t < n; t++)
        if (mask[t])
            m += prob[t];
    return m;
}

static int kn_cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

void kn_summarise(const double *v, size_t n, kn_summary_t *s)
{
    double *c;
    memset(s, 0, sizeof(*s));
    s->n = n;
    if (n == 0)
        return;
    c = cm_malloc(&kn_tag, n * sizeof(double));
    if (c == NULL) {
        s->median = s->p90 = s->p99 = s->max = s->p10 = s->p1 = s->min = NAN;
        return;
    }
    for (size_t i = 0; i < n; i++)
        c[i] = isnan(v[i]) ? INFINITY : v[i];
    qsort(c, n, sizeof(double), kn_cmp_double);
    /* nearest rank */
    s->median = n % 2 ? c[n / 2] : 0.5 * (c[n / 2 - 1] + c[n / 2]);
    s->p90 = c[(size_t)ceil(0.90 * n) - 1];
    s->p99 = c[(size_t)ceil(0.99 * n) - 1];
    s->max = c[n - 1];
    s->p10 = c[(size_t)ceil(0.10 * n) - 1];
    s->p1 = c[(size_t)ceil(0.01 * n) - 1];
    s->min = c[0];
    cm_free(c);
}
