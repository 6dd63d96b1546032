/*
 * K/V cache, the exact causal attention every backend prefills with, and the
 * backend registry (see mdl_attn.h).  The exact attention is a flash-style
 * loop: per task one KV head and a block of query positions; keys are
 * converted to fp32 a tile at a time and folded into a running max / sum /
 * output per query row, so nothing of size n^2 is ever stored.
 */
#include "gpuworker/model/mdl_attn.h"

#include <math.h>
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "common/cm_alloc.h"
#include "common/cm_log.h"
#include "common/cm_status.h"
#include "gpuworker/model/mdl_vec.h"

static CM_ALLOC_TAG(mdl_kv_tag, "model.kv");
static CM_ALLOC_TAG(mdl_attn_tag, "model.attn");

ri_status_t mdl_kv_create(const mdl_attn_geom_t *geom, size_t cap, mdl_kv_layout_t layout, mdl_kv_t **kv_p)
{
    if (geom->n_layers == 0 || geom->n_kv_heads == 0 || geom->head_dim == 0 || cap == 0)
        return RI_ERR_INVALID;
    mdl_kv_t *kv = cm_calloc(&mdl_kv_tag, 1, sizeof(*kv));
    if (kv == NULL)
        return RI_ERR_NOMEM;
    kv->geom = *geom;
    kv->cap = cap;
    bool tm = layout == MDL_KV_TOKEN_MAJOR;
    kv->token_stride = tm ? (size_t)geom->n_kv_heads * geom->head_dim : geom->head_dim;
    kv->head_stride = tm ? geom->head_dim : cap * geom->head_dim;
    kv->k = cm_calloc(&mdl_kv_tag, geom->n_layers, sizeof(*kv->k));
    kv->v = cm_calloc(&mdl_kv_tag, geom->n_layers, sizeof(*kv->v));
    if (kv->k == NULL || kv->v == NULL)
        goto err_free_kv;
    /* One private anonymous mapping, each array on its own pages, rather
     * than the allocator: the pages a sequence keeps are exactly those it
     * wrote and did not give back (mdl_kv_release), and its end returns
     * them all.  From malloc, a sequence's arrays sat in the arenas once
     * glibc's mmap threshold had risen past them, and the pages a finished
     * sequence had touched stayed resident under the next one's. */
    long pg = sysconf(_SC_PAGESIZE);
    size_t page = pg > 0 ? (size_t)pg : 4096;
    size_t bytes = (size_t)geom->n_kv_heads * cap * geom->head_dim * sizeof(cm_fp16_t);
    size_t span = (bytes + page - 1) / page * page;
    if (span > SIZE_MAX / 2 / geom->n_layers)
        goto err_free_kv;
    void *map = mmap(NULL, 2 * span * geom->n_layers, PROT_READ | PROT_WRITE,
                     MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (map == MAP_FAILED)
        goto err_free_kv;
    kv->map = map;
    kv->map_bytes = 2 * span * geom->n_layers;
    for (uint32_t l = 0; l < geom->n_layers; l++) {
        kv->k[l] = (cm_fp16_t *)((uint8_t *)map + (2 * (size_t)l) * span);
        kv->v[l] = (cm_fp16_t *)((uint8_t *)map + (2 * (size_t)l + 1) * span);
    }
    *kv_p = kv;
    return RI_OK;

err_free_kv:
    mdl_kv_destroy(kv);
    return RI_ERR_NOMEM;
}

void mdl_kv_destroy(mdl_kv_t *kv)
{
    if (kv == NULL)
        return;
    if (kv->map != NULL)
        munmap(kv->map, kv->map_bytes);
    cm_free(kv->k);
    cm_free(kv->v);
    cm_free(kv);
}

void mdl_kv_store(mdl_kv_t *kv, uint32_t layer, size_t pos, size_t n, const float *k, const float *v)
{
    uint32_t nkv = kv->geom.n_kv_heads, d = kv->geom.head_dim;
    bool tm = mdl_kv_is_token_major(kv);   /* the caller's rows are: one run per token */
    for (size_t t = 0; t < n; t++)
        for (uint32_t h = 0; h < (tm ? 1u : nkv); h++) {
            size_t len = tm ? (size_t)nkv * d : d;
            cm_f32_to_fp16_n(mdl_kv_krow(kv, layer, h, pos + t), k + (t * nkv + h) * d, len);
            cm_f32_to_fp16_n(mdl_kv_vrow(kv, layer, h, pos + t), v + (t * nkv + h) * d, len);
        }
}

ri_status_t mdl_kv_copy(mdl_kv_t *dst, const mdl_kv_t *src, size_t n)
{
    if (memcmp(&dst->geom, &src->geom, sizeof(dst->geom)) != 0 || n > dst->cap || n > src->cap)
        return RI_ERR_INVALID;
    const uint32_t nkv = src->geom.n_kv_heads;
    const size_t row = (size_t)src->geom.head_dim * sizeof(cm_fp16_t);
    bool tm_s = mdl_kv_is_token_major(src), tm_d = mdl_kv_is_token_major(dst);
    for (uint32_t l = 0; l < src->geom.n_layers; l++) {
        if (tm_s && tm_d) { /* one run each */
            memcpy(dst->k[l], src->k[l], n * nkv * row);
            memcpy(dst->v[l], src->v[l], n * nkv * row);
            continue;
        }
        for (uint32_t h = 0; h < nkv; h++) {
            if (!tm_s && !tm_d) { /* one run a head */
                memcpy(mdl_kv_krow(dst, l, h, 0), mdl_kv_krow(src, l, h, 0), n * row);
                memcpy(mdl_kv_vrow(dst, l, h, 0), mdl_kv_vrow(src, l, h, 0), n * row);
                continue;
            }
            for (size_t t = 0; t < n; t++) { /* the layouts differ: row by row */
                memcpy(mdl_kv_krow(dst, l, h, t), mdl_kv_krow(src, l, h, t), row);
                memcpy(mdl_kv_vrow(dst, l, h, t), mdl_kv_vrow(src, l, h, t), row);
            }
        }
    }
    dst->len = n;
    return RI_OK;
}

void mdl_attn_cfg_default(mdl_attn_cfg_t *cfg)
{
    memset(cfg, 0, sizeof(*cfg));
#ifdef MDL_HAVE_KERNELS
    kn_wave_params_default(&cfg->wave);
#else
    /* only "full" is built: the steady zone still sizes the baselines' budget */
    cfg->wave.sink_tokens = 4;
    cfg->wave.window_tokens = 64;
    cfg->wave.retrieval_min_tokens = KN_WAVE_RETRIEVAL_MIN_TOKENS;
#endif
    cfg->budget_tokens = 0;
    cfg->release_window = false;
}

uint32_t mdl_attn_auto_budget(const mdl_attn_cfg_t *cfg, size_t n_tokens)
{
    if (cfg->budget_tokens > 0)
        return cfg->budget_tokens;
    uint32_t share = (uint32_t)lround(KN_WAVE_RETRIEVAL_FRAC * (double)n_tokens);
    return cfg->wave.sink_tokens + cfg->wave.window_tokens + CM_MAX(share, cfg->wave.retrieval_min_tokens);
}

/* ---- exact causal attention ---- */

#define MDL_QBLOCK 32     /* query positions per task: each K/V tile is converted once for them */
#define MDL_KTILE 128     /* keys converted per tile */
#define MDL_MAX_GROUP 16  /* query heads per KV head we support */

typedef struct mdl_exact_job {
    const mdl_kv_t *kv;
    uint32_t layer;
    size_t pos, n, n_qblocks;
    size_t window;      /* keys each query sees (itself included); 0 = all */
    const float *q;
    float *out;
    float *scratch;     /* per worker: K tile, V tile, scores, acc, m, l */
    size_t scratch_per; /* floats per worker */
} mdl_exact_job_t;

/* Fold nt new scores of one query row into its running max m and sum l:
 * s becomes exp(s - m_new); the accumulator is rescaled by exp(m - m_new). */
static void mdl_exact_softmax_step(float *s, size_t nt, float *acc, uint32_t d, float *m, float *l)
{
    float mx = mdl_vec_max(s, nt);
    float mnew = mx > *m ? mx : *m;
    float corr = expf(*m - mnew);   /* exp(-inf) = 0 on the first tile */
    float sum = mdl_vec_exp_sub(s, nt, mnew);
    if (corr != 1.0f)
        mdl_vec_scale(acc, corr, d);
    *l = *l * corr + sum;
    *m = mnew;
}

/* First key that query i of the job (position pos + i) attends to. */
static size_t mdl_exact_first(const mdl_exact_job_t *j, size_t i)
{
    size_t p = j->pos + i;
    return j->window > 0 && p >= j->window ? p + 1 - j->window : 0;
}

static void mdl_exact_task(void *arg, size_t begin, size_t end, unsigned worker)
{
    mdl_exact_job_t *j = arg;
    const mdl_attn_geom_t *g = &j->kv->geom;
    uint32_t d = g->head_dim, gs = g->n_heads / g->n_kv_heads;
    float scale = 1.0f / sqrtf((float)d);
    float *kt = j->scratch + (size_t)worker * j->scratch_per;
    float *vt = kt + (size_t)MDL_KTILE * d;
    float *s = vt + (size_t)MDL_KTILE * d;   /* [gs][MDL_KTILE] scores */
    float *acc = s + (size_t)MDL_KTILE * gs;
    float *mrow = acc + (size_t)MDL_QBLOCK * gs * d;
    float *lrow = mrow + (size_t)MDL_QBLOCK * gs;

    for (size_t task = begin; task < end; task++) {
        uint32_t h = (uint32_t)(task / j->n_qblocks);
        size_t qb = task % j->n_qblocks;
        size_t i0 = qb * MDL_QBLOCK, i1 = CM_MIN(i0 + MDL_QBLOCK, j->n);
        size_t rows = (i1 - i0) * gs;
        size_t nk = j->pos + i1;   /* keys the last query of the block sees */
        /* tiles start at multiples of MDL_KTILE, not at the block's first
         * key, so that a query's keys fold in the same groups whatever the
         * chunk and block it came in: its result depends on its position
         * alone (a prefill in chunks of 64 or 128, or in the worker's
         * slices, gives the same bits) */
        size_t kfirst = mdl_exact_first(j, i0) / MDL_KTILE * MDL_KTILE;
        memset(acc, 0, rows * d * sizeof(float));
        for (size_t r = 0; r < rows; r++)
            mrow[r] = -INFINITY, lrow[r] = 0.0f;
        for (size_t k0 = kfirst; k0 < nk; k0 += MDL_KTILE) {
            size_t k1 = CM_MIN(k0 + MDL_KTILE, nk);
            if (j->kv->token_stride == d) { /* head-major: the tile is one run */
                cm_fp16_to_f32_n(kt, mdl_kv_krow(j->kv, j->layer, h, k0), (k1 - k0) * d);
                cm_fp16_to_f32_n(vt, mdl_kv_vrow(j->kv, j->layer, h, k0), (k1 - k0) * d);
            } else {
                for (size_t t = k0; t < k1; t++) {
                    cm_fp16_to_f32_n(kt + (t - k0) * d, mdl_kv_krow(j->kv, j->layer, h, t), d);
                    cm_fp16_to_f32_n(vt + (t - k0) * d, mdl_kv_vrow(j->kv, j->layer, h, t), d);
                }
            }
            for (size_t i = i0; i < i1; i++) {
                size_t lim = CM_MIN(k1, j->pos + i + 1);   /* causal */
                size_t first = CM_MAX(k0, mdl_exact_first(j, i));   /* sliding window */
                if (lim <= first)
                    continue;
                /* the gs query heads of this KV head see the same keys: their
                 * scores and P.V in one pass over the tile */
                size_t nt = lim - first, r0 = (i - i0) * gs;
                const float *q0 = j->q + (i * g->n_heads + h * gs) * d;
                mdl_vec_scores_rows(q0, gs, kt + (first - k0) * d, nt, d, scale, s);
                for (uint32_t t = 0; t < gs; t++)
                    mdl_exact_softmax_step(s + t * nt, nt, acc + (r0 + t) * d, d, &mrow[r0 + t], &lrow[r0 + t]);
                mdl_vec_pv_rows(acc + r0 * d, gs, s, nt, vt + (first - k0) * d, nt, d);
            }
        }
        for (size_t i = i0; i < i1; i++)
            for (uint32_t t = 0; t < gs; t++) {
                size_t r = (i - i0) * gs + t;
                float *o = j->out + (i * g->n_heads + h * gs + t) * d;
                float inv = lrow[r] > 0 ? 1.0f / lrow[r] : 0.0f;
                for (uint32_t e = 0; e < d; e++)
                    o[e] = acc[r * d + e] * inv;
            }
    }
}

ri_status_t mdl_attn_exact(cm_pool_t *pool, const mdl_kv_t *kv, uint32_t layer, size_t pos, size_t n,
                           const float *q, float *out)
{
    return mdl_attn_exact_win(pool, kv, layer, pos, n, 0, q, out);
}

ri_status_t mdl_attn_exact_win(cm_pool_t *pool, const mdl_kv_t *kv, uint32_t layer, size_t pos, size_t n,
                               size_t window, const float *q, float *out)
{
    const mdl_attn_geom_t *g = &kv->geom;
    uint32_t gs = g->n_heads / g->n_kv_heads;
    if (gs == 0 || gs > MDL_MAX_GROUP || g->n_heads % g->n_kv_heads != 0 || pos + n > kv->cap)
        return RI_ERR_INVALID;
    if (n == 0)
        return RI_OK;
    unsigned nt = pool != NULL ? cm_pool_size(pool) : 1;
    mdl_exact_job_t j = {.kv = kv, .layer = layer, .pos = pos, .n = n, .window = window, .q = q, .out = out};
    j.n_qblocks = (n + MDL_QBLOCK - 1) / MDL_QBLOCK;
    j.scratch_per = (size_t)MDL_KTILE * g->head_dim * 2 + (size_t)MDL_KTILE * gs +
                    (size_t)MDL_QBLOCK * gs * (g->head_dim + 2);
    j.scratch = cm_malloc_aligned(&mdl_attn_tag, nt * j.scratch_per * sizeof(float), 64);
    if (j.scratch == NULL)
        return RI_ERR_NOMEM;
    cm_pool_parallel_for(pool, (size_t)g->n_kv_heads * j.n_qblocks, 1, mdl_exact_task, &j);
    cm_free(j.scratch);
    return RI_OK;
}

void mdl_attn_exact_ref(const mdl_kv_t *kv, uint32_t layer, size_t pos, size_t n, const float *q, float *out)
{
    mdl_attn_exact_win_ref(kv, layer, pos, n, 0, q, out);
}

void mdl_attn_exact_win_ref(const mdl_kv_t *kv, uint32_t layer, size_t pos, size_t n, size_t window, const float *q,
                            float *out)
{
    const mdl_attn_geom_t *g = &kv->geom;
    uint32_t d = g->head_dim, gs = g->n_heads / g->n_kv_heads;
    double scale = 1.0 / sqrt((double)d);
    for (size_t i = 0; i < n; i++)
        for (uint32_t hq = 0; hq < g->n_heads; hq++) {
            uint32_t h = hq / gs;
            const float *qr = q + (i * g->n_heads + hq) * d;
            const cm_fp16_t *kh = mdl_kv_krow(kv, layer, h, 0), *vh = mdl_kv_vrow(kv, layer, h, 0);
            size_t ts = kv->token_stride, nk = pos + i + 1;
            size_t t0 = window > 0 && nk > window ? nk - window : 0;
            double mx = -INFINITY, l = 0;
            for (size_t t = t0; t < nk; t++) {
                double sdot = 0;
                for (uint32_t e = 0; e < d; e++)
                    sdot += (double)qr[e] * cm_fp16_to_f32(kh[t * ts + e]);
                mx = fmax(mx, sdot * scale);
            }
            double o[512] = {0};
            for (size_t t = t0; t < nk; t++) {
                double sdot = 0;
                for (uint32_t e = 0; e < d; e++)
                    sdot += (double)qr[e] * cm_fp16_to_f32(kh[t * ts + e]);
                double p = exp(sdot * scale - mx);
                l += p;
                for (uint32_t e = 0; e < d && e < 512; e++)
                    o[e] += p * cm_fp16_to_f32(vh[t * ts + e]);
            }
            for (uint32_t e = 0; e < d && e < 512; e++)
                out[(i * g->n_heads + hq) * d + e] = (float)(o[e] / l);
        }
}

/* ---- registry ---- */

#define MDL_MAX_BACKENDS 16
static const mdl_attn_ops_t *mdl_backends[MDL_MAX_BACKENDS];
static size_t mdl_n_backends;
static bool mdl_builtin_done;
static char mdl_names_buf[256];

/* The built-in backends, from mdl_attn_backends.c. */
size_t mdl_attn_builtin(const mdl_attn_ops_t *const **ops_p);

static void mdl_attn_init_builtin(void)
{
    if (mdl_builtin_done)
        return;
    mdl_builtin_done = true;
    const mdl_attn_ops_t *const *ops;
    size_t n = mdl_attn_builtin(&ops);
    for (size_t i = 0; i < n && mdl_n_backends < MDL_MAX_BACKENDS; i++)
        mdl_backends[mdl_n_backends++] = ops[i];
}

const mdl_attn_ops_t *mdl_attn_find(const char *name)
{
    mdl_attn_init_builtin();
    for (size_t i = 0; i < mdl_n_backends; i++)
        if (strcmp(mdl_backends[i]->name, name) == 0)
            return mdl_backends[i];
    return NULL;
}

ri_status_t mdl_attn_register(const mdl_attn_ops_t *ops)
{
    if (ops == NULL || ops->name == NULL || ops->create == NULL || ops->prefill == NULL || ops->decode == NULL)
        return RI_ERR_INVALID;
    if (mdl_attn_find(ops->name) != NULL)
        return RI_ERR_EXISTS;
    if (mdl_n_backends == MDL_MAX_BACKENDS)
        return RI_ERR_NOMEM;
    mdl_backends[mdl_n_backends++] = ops;
    return RI_OK;
}

const char *mdl_attn_names(void)
{
    mdl_attn_init_builtin();
    mdl_names_buf[0] = '\0';
    for (size_t i = 0; i < mdl_n_backends; i++) {
        if (i > 0)
            strncat(mdl_names_buf, ", ", sizeof(mdl_names_buf) - strlen(mdl_names_buf) - 1);
        strncat(mdl_names_buf, mdl_backends[i]->name, sizeof(mdl_names_buf) - strlen(mdl_names_buf) - 1);
    }
    return mdl_names_buf;
}
