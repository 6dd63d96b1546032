/*
 * Decode budgets of the wave index (kn_wave.h): the floors in tokens under
 * the paper's shares, and the output-aware per-head cut of the retrieval
 * zone.  Both engines (in process, and the remote one of gpuworker/client)
 * call these, so that they choose the same clusters.
 *
 * Why a floor: the shares were chosen at 128K, where 1.8% of the clusters is
 * ~2,400 tokens.  At 2K the same share is 2 clusters, and a needle the
 * question asks for is often not among them; a floor in tokens costs little
 * at short contexts and nothing at long ones.
 *
 * Why a per-head cut: heads differ.  A head whose attention sits in a few
 * clusters loses nothing when it retrieves fewer; a head whose mass is
 * spread needs more than the fixed R.  Each head ranks 2R candidates and
 * keeps the fewest whose leftover mass (by the centroid estimate, the same
 * logit the estimation zone uses) is at most adapt_tau; what it does not
 * keep is estimated, not dropped.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "common/cm_alloc.h"
#include "common/cm_status.h"
#include "kernels/kn_internal.h"
#include "kernels/kn_wave.h"

static uint32_t kn_ceil_div(uint32_t a, uint32_t b)
{
    return b == 0 ? a : (a + b - 1) / b;
}

void kn_wave_budget_floor(const kn_wave_params_t *p, uint32_t total, uint32_t n_r, uint32_t n_e, uint32_t *r_p,
                          uint32_t *e_p)
{
    /* before the first build the size is not fixed yet; total is 0 then */
    uint32_t tpc = kn_wave_cluster_tokens(p, 0);
    uint32_t r = CM_MAX(n_r, kn_ceil_div(p->retrieval_min_tokens, tpc));
    uint32_t e = CM_MAX(n_e, kn_ceil_div(p->estimation_min_tokens, tpc));
    r = CM_MIN(r, total);
    *r_p = r;
    *e_p = CM_MIN(e, total - r);
}

void kn_wave_rank_counts(const kn_wave_params_t *p, uint32_t total, uint32_t n_r, uint32_t n_e, uint32_t *rank_r_p,
                         uint32_t *rank_e_p)
{
    uint32_t r = n_r;
    if (p->adapt_tau > 0.0f)
        r = (uint32_t)CM_MIN((uint64_t)n_r * 2, total);
    *rank_r_p = CM_MIN(r, total);
    *rank_e_p = CM_MIN(n_e, total - *rank_r_p);
}

typedef struct kn_cand {
    float mass;   /* share of the candidates' mass, averaged over the group */
    uint32_t id;  /* cluster */
} kn_cand_t;

static int kn_cand_by_mass(const void *a, const void *b)
{
    const kn_cand_t *x = a, *y = b;
    if (x->mass != y->mass)
        return x->mass > y->mass ? -1 : 1;
    return x->id < y->id ? -1 : x->id > y->id; /* ties: a fixed order */
}

static int kn_u32_cmp(const void *a, const void *b)
{
    uint32_t x = *(const uint32_t *)a, y = *(const uint32_t *)b;
    return x < y ? -1 : x > y;
}

/* Mass of each candidate: softmax over the candidates of scale q_t.c_j +
 * ln n_j per query head t, averaged over the g heads. */
static void kn_cand_mass(const kn_shape_t *grp, const float *q, const kn_index_t *idx, kn_cand_t *c, uint32_t n,
                         float *logit)
{
    uint32_t g = grp->n_q_heads, d = grp->head_dim;
    float scale = kn_shape_scale(grp);
    for (uint32_t i = 0; i < n; i++)
        c[i].mass = 0.0f;
    for (uint32_t t = 0; t < g; t++) {
        const float *qt = q + (size_t)t * d;
        float mx = -INFINITY, sum = 0.0f;
        for (uint32_t i = 0; i < n; i++) {
            float dot = kn_cq_dot(qt, idx->centroids, idx->cscale, c[i].id, d);
            logit[i] = scale * dot + logf((float)idx->sizes[c[i].id]);
            mx = CM_MAX(mx, logit[i]);
        }
        for (uint32_t i = 0; i < n; i++)
            sum += (logit[i] = expf(logit[i] - mx));
        for (uint32_t i = 0; i < n; i++)
            c[i].mass += logit[i] / (sum * (float)g);
    }
}

/* Fold the estimate of the moved clusters into (o_e, l_e). */
static ri_status_t kn_adapt_merge(const kn_ops_t *ops, const kn_shape_t *grp, const float *q, const kn_index_t *idx,
                                  const uint32_t *moved, uint32_t n, float *o_e, float *l_e)
{
    uint32_t g = grp->n_q_heads, d = grp->head_dim;
    float *buf = cm_malloc(&kn_tag, ((size_t)g * d * 2 + (size_t)g * 2) * sizeof(float));
    ri_status_t st;
    if (buf == NULL)
        return RI_ERR_NOMEM;
    float *o_m = buf, *l_m = buf + (size_t)g * d, *o_old = l_m + g, *l_old = o_old + (size_t)g * d;
    memcpy(o_old, o_e, (size_t)g * d * sizeof(float));
    memcpy(l_old, l_e, g * sizeof(float));
    st = kn_estimate(ops, grp, q, idx, moved, n, o_m, l_m);
    if (st == RI_OK) {
        const float *op[2] = {o_old, o_m}, *lp[2] = {l_old, l_m};
        st = kn_merge(ops, g, d, 2, op, lp, o_e, l_e);
    }
    cm_free(buf);
    return st;
}

ri_status_t kn_wave_adapt(const kn_wave_params_t *p, const kn_ops_t *ops, const kn_shape_t *grp, const float *q,
                          const kn_index_t *idx, uint32_t n_r, uint32_t *ids, uint32_t *nr, uint32_t *ne, float *o_e,
                          float *l_e)
{
    uint32_t n = *nr, keep, floor_r = CM_MAX(n_r / 4, 1u);
    kn_cand_t *c;
    float *logit, left = 1.0f;
    ri_status_t st = RI_OK;

    if (p->adapt_tau <= 0.0f || n <= floor_r)
        return RI_OK;
    c = cm_malloc(&kn_tag, n * (sizeof(*c) + sizeof(float)));
    if (c == NULL)
        return RI_ERR_NOMEM;
    logit = (float *)(c + n);
    for (uint32_t i = 0; i < n; i++)
        c[i].id = ids[i];
    kn_cand_mass(grp, q, idx, c, n, logit);
    qsort(c, n, sizeof(*c), kn_cand_by_mass);
    /* the fewest (>= floor_r) whose leftover is <= tau; never more than n */
    for (keep = 0; keep < n; keep++) {
        if (keep >= floor_r && left <= p->adapt_tau)
            break;
        left -= c[keep].mass;
    }
    for (uint32_t i = 0; i < n; i++)
        ids[i] = c[i].id;
    qsort(ids, keep, sizeof(*ids), kn_u32_cmp); /* reads walk memory forwards */
    if (keep < n && o_e != NULL && l_e != NULL)
        st = kn_adapt_merge(ops, grp, q, idx, ids + keep, n - keep, o_e, l_e);
    if (st == RI_OK) {
        *ne += n - keep;
        *nr = keep;
    }
    cm_free(c);
    return st;
}
