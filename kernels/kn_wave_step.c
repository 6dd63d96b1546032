/*
 * The wave_step op on the host (kn_ops.h): the ref and cpu backends'
 * layer-level tripartite step, head by head over the backend's own group
 * ops, in the order the CPU decode path (kn_wave.c) takes them: rank +
 * estimate over the index, exact attention over the steady zone and the
 * retrieved clusters, log-sum-exp merge.  The CUDA backend's wave_step
 * (kn_cuda_wave_step) is checked against this with the ref table.
 */
#include <stdlib.h>
#include <string.h>

#include "common/cm_alloc.h"
#include "common/cm_half.h"
#include "kernels/kn_internal.h"

static CM_ALLOC_TAG(kn_wave_step_tag, "kernels.wave_step");

/* Scratch of one head, sized for the largest. */
typedef struct kn_ws_scratch {
    float *oe, *le, *ox, *lx; /* the two parts: estimated, exact */
    float *vsum;              /* [C][d]: the means times the sizes (the ref estimate reads sums) */
    uint32_t *ids;            /* [n_r + n_e] */
    kn_page_t *pages;         /* [n_r + 2] */
} kn_ws_scratch_t;

static void kn_ws_free(kn_ws_scratch_t *s)
{
    cm_free(s->oe);
    cm_free(s->le);
    cm_free(s->ox);
    cm_free(s->lx);
    cm_free(s->vsum);
    cm_free(s->ids);
    cm_free(s->pages);
}

static ri_status_t kn_ws_alloc(const kn_shape_t *shape, const kn_wave_head_t *heads, uint32_t n_r, uint32_t n_e,
                               kn_ws_scratch_t *s)
{
    size_t g = shape->n_q_heads / shape->n_kv_heads, d = shape->head_dim, cmax = 1;
    for (uint32_t h = 0; h < shape->n_kv_heads; h++)
        cmax = heads[h].n_clusters > cmax ? heads[h].n_clusters : cmax;
    memset(s, 0, sizeof(*s));
    s->oe = cm_malloc(&kn_wave_step_tag, g * d * sizeof(float));
    s->ox = cm_malloc(&kn_wave_step_tag, g * d * sizeof(float));
    s->le = cm_malloc(&kn_wave_step_tag, g * sizeof(float));
    s->lx = cm_malloc(&kn_wave_step_tag, g * sizeof(float));
    s->vsum = cm_malloc(&kn_wave_step_tag, cmax * d * sizeof(float));
    s->ids = cm_malloc(&kn_wave_step_tag, ((size_t)n_r + n_e + 1) * sizeof(uint32_t));
    s->pages = cm_malloc(&kn_wave_step_tag, ((size_t)n_r + 2) * sizeof(kn_page_t));
    if (!s->oe || !s->ox || !s->le || !s->lx || !s->vsum || !s->ids || !s->pages) {
        kn_ws_free(s);
        memset(s, 0, sizeof(*s)); /* the caller frees it again */
        return RI_ERR_NOMEM;
    }
    return RI_OK;
}

static int kn_ws_cmp_u32(const void *a, const void *b)
{
    uint32_t x = *(const uint32_t *)a, y = *(const uint32_t *)b;
    return x < y ? -1 : x > y;
}

/* Head h: its (o, lse) into out / lse, its sets and counts. */
static ri_status_t kn_ws_head(const kn_ops_t *ops, const kn_shape_t *grp, const float *q, const kn_wave_head_t *hd,
                              uint32_t n_r, uint32_t n_e, kn_ws_scratch_t *s, float *out, float *lse, uint32_t *nr_p,
                              uint32_t *ne_p)
{
    uint32_t d = grp->head_dim, C = hd->n_clusters, nr = 0, ne = 0, n_tok = 0;
    for (uint32_t j = 0; j < C; j++) {
        float sz = (float)hd->sizes[j];
        for (uint32_t i = 0; i < d; i++)
            s->vsum[(size_t)j * d + i] = kn_vq_at(hd->vq, hd->vscale, j, d, i) * sz;
        n_tok += hd->sizes[j];
    }
    /* a view of the head as an index: what rank and estimate read */
    kn_index_t idx = { .head_dim = d,
                       .n_clusters = C,
                       .n_tokens = n_tok,
                       .cap_clusters = C,
                       .centroids = (int8_t *)hd->centroids,
                       .cscale = (float *)hd->cscale,
                       .vsum = s->vsum,
                       .sizes = (uint32_t *)hd->sizes,
                       .offsets = (uint32_t *)hd->offsets,
                       .vq = (int8_t *)hd->vq,
                       .vscale = (float *)hd->vscale };
    ri_status_t st = ops->rank(grp, q, &idx, n_r, n_e, s->ids, &nr, &ne);
    if (st != RI_OK)
        return st;
    if ((st = ops->estimate(grp, q, &idx, s->ids + nr, ne, s->oe, s->le)) != RI_OK)
        return st;
    size_t np = 0;
    for (int z = 0; z < 2; z++)
        if (hd->steady[z].n_tokens > 0)
            s->pages[np++] = hd->steady[z];
    for (uint32_t i = 0; i < nr; i++) {
        uint32_t j = s->ids[i];
        s->pages[np++] =
            (kn_page_t){ hd->ck + (size_t)hd->offsets[j] * d, hd->cv + (size_t)hd->offsets[j] * d, hd->sizes[j], d };
    }
    if ((st = ops->attn_pages(grp, q, s->pages, np, s->ox, s->lx)) != RI_OK)
        return st;
    const float *op[2] = { s->ox, s->oe }, *lp[2] = { s->lx, s->le };
    if ((st = ops->merge(grp->n_q_heads, d, 2, op, lp, out, lse)) != RI_OK)
        return st;
    qsort(s->ids, nr, sizeof(uint32_t), kn_ws_cmp_u32);
    qsort(s->ids + nr, ne, sizeof(uint32_t), kn_ws_cmp_u32);
    *nr_p = nr;
    *ne_p = ne;
    return RI_OK;
}

ri_status_t kn_wave_step_host(const kn_ops_t *ops, const kn_shape_t *shape, const float *q, const kn_wave_head_t *heads,
                              uint32_t n_r, uint32_t n_e, float *out, float *lse, uint32_t *ids, uint32_t *counts)
{
    if (ops == NULL || shape == NULL || !kn_shape_valid(shape) || q == NULL || heads == NULL || out == NULL ||
        lse == NULL)
        return RI_ERR_INVALID;
    uint32_t g = shape->n_q_heads / shape->n_kv_heads, d = shape->head_dim;
    kn_shape_t grp = { g, 1, d, shape->scale };
    size_t per = (size_t)n_r + n_e;
    kn_ws_scratch_t s;
    ri_status_t st = kn_ws_alloc(shape, heads, n_r, n_e, &s);
    for (uint32_t h = 0; h < shape->n_kv_heads && st == RI_OK; h++) {
        uint32_t nr = 0, ne = 0;
        st = kn_ws_head(ops, &grp, q + (size_t)h * g * d, &heads[h], n_r, n_e, &s, out + (size_t)h * g * d,
                        lse + (size_t)h * g, &nr, &ne);
        if (st == RI_OK && ids != NULL)
            memcpy(ids + h * per, s.ids, ((size_t)nr + ne) * sizeof(uint32_t));
        if (st == RI_OK && counts != NULL) {
            counts[2 * h] = nr;
            counts[2 * h + 1] = ne;
        }
    }
    kn_ws_free(&s);
    return st;
}
