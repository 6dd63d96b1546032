/*
 * The wave-index object of one layer (kn_wave.h): per KV head an index and a
 * cluster-major copy of the indexed K/V; tripartite decode per GQA group
 * (rank -> estimation part, exact part over steady zone + retrieved clusters
 * -> log-sum-exp merge), heads spread over the pool.
 */
#include <math.h>
#include <stdatomic.h>
#include <string.h>
#include <sys/mman.h>

#include "common/cm_log.h"
#include "common/cm_status.h"
#include "kernels/kn_internal.h"
#include "kernels/kn_wave.h"

#define KN_WAVE_MAX_KV_LOCAL 64 /* KV heads whose first-cluster ids fit on the stack */

struct kn_wave {
    kn_shape_t shape;      /* layer geometry */
    kn_wave_params_t p;    /* settings */
    const kn_ops_t *ops;   /* backend */
    uint32_t g, d;         /* group size, head dim */
    size_t indexed_end;    /* first position after the indexed range */
    kn_index_t *idx;       /* [n_kv] */
    const kn_wave_store_t *store; /* NULL: the clusters are copied into ckv */
    cm_fp16_t **ckv;       /* [n_kv] indexed K/V cluster by cluster, [2 cap][d]: cluster j's
                              K rows from row 2 offsets[j], then its V rows, so that a
                              retrieved cluster is one contiguous read */
    size_t *cap;           /* [n_kv] tokens of room in ckv */
    uint32_t n_r, n_e;     /* share-based retrieval / estimation clusters per head
                              (kn_wave_budget adds the minimums) */
};

void kn_wave_params_default(kn_wave_params_t *p)
{
    memset(p, 0, sizeof(*p));
    p->sink_tokens = 4;
    p->window_tokens = 64;
    p->tokens_per_cluster = 0;  /* auto: 4 up to 16K, 8 up to 32K, 16 beyond */
    p->segment_tokens = KN_WAVE_SEGMENT_TOKENS;  /* blocks of prefix reuse */
    p->retrieval_frac = KN_WAVE_RETRIEVAL_FRAC;
    p->estimation_frac = KN_WAVE_ESTIMATION_FRAC;
    p->retrieval_min_tokens = KN_WAVE_RETRIEVAL_MIN_TOKENS;
    p->estimation_min_tokens = 0;
    p->adapt_tau = 0.0f;
    p->update_tokens = 1024;
    p->update_clusters = 0;     /* update_tokens / tokens per cluster */
    kn_build_params_default(&p->build);
    p->ops = NULL;
}

uint32_t kn_wave_cluster_tokens(const kn_wave_params_t *p, size_t n_idx)
{
    if (p->tokens_per_cluster != 0)
        return p->tokens_per_cluster;
    if (n_idx <= KN_WAVE_TINY_CONTEXT)
        return KN_WAVE_TINY_TOKENS_PER_CLUSTER;
    return n_idx <= KN_WAVE_SMALL_CONTEXT ? KN_WAVE_SMALL_TOKENS_PER_CLUSTER : KN_WAVE_TOKENS_PER_CLUSTER;
}

/* Fix the cluster size (and the update's cluster count) at the first
 * clustering of n_idx tokens: an index keeps one size for its life, so its
 * budgets in tokens and its updates stay what its build chose. */
static void kn_wave_fix_geometry(kn_wave_t *w, size_t n_idx)
{
    w->p.tokens_per_cluster = kn_wave_cluster_tokens(&w->p, n_idx);
    if (w->p.update_clusters == 0)
        w->p.update_clusters = CM_MAX(w->p.update_tokens / w->p.tokens_per_cluster, 1u);
}

ri_status_t kn_wave_create(const kn_shape_t *shape, const kn_wave_params_t *params,
                           kn_wave_t **wave_p)
{
    return kn_wave_create_store(shape, params, NULL, wave_p);
}

ri_status_t kn_wave_create_store(const kn_shape_t *shape, const kn_wave_params_t *params,
                                 const kn_wave_store_t *store, kn_wave_t **wave_p)
{
    kn_wave_t *w;
    uint32_t nkv;

    if (!kn_shape_valid(shape) || params == NULL || wave_p == NULL || params->update_tokens == 0 ||
        params->update_clusters > params->update_tokens ||
        params->retrieval_frac < 0 || params->estimation_frac < 0 || !(params->adapt_tau >= 0.0f) ||
        params->adapt_tau >= 1.0f)
        return RI_ERR_INVALID;
    nkv = shape->n_kv_heads;
    w = cm_calloc(&kn_tag, 1, sizeof(*w));
    if (w == NULL)
        return RI_ERR_NOMEM;
    w->shape = *shape;
    w->p = *params;
    w->store = store;
    w->ops = params->ops ? params->ops : kn_ops_default();
    w->g = shape->n_q_heads / nkv;
    w->d = shape->head_dim;
    w->indexed_end = params->sink_tokens;
    w->idx = cm_calloc(&kn_tag, nkv, sizeof(*w->idx));
    w->ckv = cm_calloc(&kn_tag, nkv, sizeof(*w->ckv));
    w->cap = cm_calloc(&kn_tag, nkv, sizeof(*w->cap));
    if (!w->idx || !w->ckv || !w->cap) {
        kn_wave_destroy(w);
        return RI_ERR_NOMEM;
    }
    for (uint32_t h = 0; h < nkv; h++)
        kn_index_init(&w->idx[h], w->d);
    *wave_p = w;
    return RI_OK;
}

void kn_wave_destroy(kn_wave_t *w)
{
    if (w == NULL)
        return;
    for (uint32_t h = 0; h < w->shape.n_kv_heads; h++) {
        if (w->idx)
            kn_index_cleanup(&w->idx[h]);
        if (w->ckv)
            cm_free(w->ckv[h]);
    }
    cm_free(w->idx);
    cm_free(w->ckv);
    cm_free(w->cap);
    cm_free(w);
}

/* n bytes of src at dst; at fixed homes only where they differ: the homes'
 * head may be a shared prefix's rows and tables mapped copy-on-write,
 * holding these bytes already, and writing them again would copy its pages
 * (even the same bytes: the fault is on the write, not on a change). */
static void kn_wave_put_rows(const kn_index_t *idx, void *dst, const void *src, size_t n)
{
    if (!idx->fixed_clusters || memcmp(dst, src, n) != 0)
        memcpy(dst, src, n);
}

/* n entries of a table (sizes, offsets, perm) at dst, as kn_wave_put_rows. */
static void kn_wave_put_table(const kn_index_t *idx, uint32_t *dst, const uint32_t *src, size_t n)
{
#ifdef KN_WAVE_MUTANT_PUT_TABLES /* the tests' mutant: each sequence writes its own tables again */
    memcpy(dst, src, n * sizeof(uint32_t));
    return;
#endif
    kn_wave_put_rows(idx, dst, src, n * sizeof(uint32_t));
}

/* Nothing indexed, nothing reserved: a heap index never built, or one at
 * its homes with no cluster (before its build, or after a cleanup). */
static bool kn_index_untouched(const kn_index_t *idx)
{
    return idx->n_clusters == 0 && idx->n_tokens == 0 && (idx->fixed_clusters ? true : idx->offsets == NULL);
}

ri_status_t kn_wave_place(kn_wave_t *w, uint32_t kv_head, const kn_index_homes_t *homes)
{
    kn_index_t *idx;
    const uint32_t zero = 0;

    if (w == NULL || kv_head >= w->shape.n_kv_heads)
        return RI_ERR_INVALID;
    if (homes != NULL && (!homes->centroids || !homes->cscale || !homes->vq || !homes->vscale || !homes->sizes ||
                          !homes->offsets || !homes->perm || homes->cap_clusters == 0 || homes->cap_tokens == 0 ||
                          homes->cap_clusters > UINT32_MAX / 2 || homes->cap_tokens > UINT32_MAX / 2))
        return RI_ERR_INVALID;
    idx = &w->idx[kv_head];
    if (!kn_index_untouched(idx) || (homes != NULL && idx->fixed_clusters != 0))
        return RI_ERR_INVALID; /* before anything is indexed, once */
    kn_index_cleanup(idx);
    kn_index_init(idx, idx->head_dim); /* NULL: given back, the index's own heap arrays again */
    if (homes == NULL)
        return RI_OK;
    idx->centroids = homes->centroids;
    idx->cscale = homes->cscale;
    idx->vq = homes->vq;
    idx->vscale = homes->vscale;
    idx->sizes = homes->sizes;
    idx->offsets = homes->offsets;
    idx->perm = homes->perm;
    idx->fixed_clusters = homes->cap_clusters;
    idx->fixed_tokens = homes->cap_tokens;
    kn_wave_put_rows(idx, idx->offsets, &zero, sizeof(zero)); /* an empty index's one offset */
    return RI_OK;
}

const kn_index_t *kn_wave_index(const kn_wave_t *w, uint32_t kv_head)
{
    return kv_head < w->shape.n_kv_heads ? &w->idx[kv_head] : NULL;
}

size_t kn_wave_indexed_end(const kn_wave_t *w)
{
    return w->indexed_end;
}

bool kn_wave_covers(const kn_wave_t *w, size_t n_tokens)
{
    return n_tokens >= w->indexed_end || w->indexed_end <= w->p.sink_tokens;
}

void kn_wave_budget(const kn_wave_t *w, uint32_t *n_r_p, uint32_t *n_e_p)
{
    kn_wave_budget_floor(&w->p, w->idx[0].n_clusters, w->n_r, w->n_e, n_r_p, n_e_p);
}

const kn_wave_params_t *kn_wave_params(const kn_wave_t *w)
{
    return &w->p;
}

/* ---- clustering a token range of every head (build and update) ---- */

typedef struct kn_wave_job {
    kn_wave_t *w;
    const kn_kv_view_t *kv;
    const float *q;
    float *out, *lse;
    size_t t0;                /* first token clustered */
    uint32_t n, C, S;         /* tokens, clusters, segments */
    uint32_t n_r, n_e;        /* decode budgets */
    uint32_t *first;          /* [n_kv] first new cluster of each head (build, update) */
    _Atomic int status;       /* first failure */
    _Atomic uint64_t exact, retrieved, est, bytes;
} kn_wave_job_t;

static void kn_wave_fail(kn_wave_job_t *job, ri_status_t st)
{
    int expect = RI_OK;
    atomic_compare_exchange_strong(&job->status, &expect, (int)st);
}

/* Huge pages for the whole 2 MiB pages inside a cluster copy not yet
 * touched: the retrieved clusters are 8 KiB reads scattered over it, each a
 * TLB miss or two with 4 KiB pages.  Advice only; failure changes nothing. */
static void kn_wave_advise_huge(void *p, size_t bytes)
{
#ifdef MADV_HUGEPAGE
    const uintptr_t huge = (uintptr_t)2 << 20;
    uintptr_t a = ((uintptr_t)p + huge - 1) & ~(huge - 1), e = ((uintptr_t)p + bytes) & ~(huge - 1);
    if (e > a)
        (void)madvise((void *)a, e - a, MADV_HUGEPAGE);
#else
    (void)p;
    (void)bytes;
#endif
}

/* Copy clusters [first, n_clusters) of head h from kv into ckv. */
static ri_status_t kn_wave_copy_clusters(kn_wave_t *w, uint32_t h, const kn_kv_view_t *kv,
                                         uint32_t first)
{
    kn_index_t *idx = &w->idx[h];
    size_t need = idx->n_tokens, d = w->d, row = d * sizeof(cm_fp16_t);
    if (need > w->cap[h]) {
        size_t cap = CM_MAX(need, w->cap[h] * 3 / 2);
        cm_fp16_t *nk = cm_realloc(&kn_tag, w->ckv[h], 2 * cap * row);
        if (nk == NULL)
            return RI_ERR_NOMEM;
        kn_wave_advise_huge(nk, 2 * cap * row);
        w->ckv[h] = nk;
        w->cap[h] = cap;
    }
    for (uint32_t j = first; j < idx->n_clusters; j++) {
        cm_fp16_t *ck = w->ckv[h] + (size_t)2 * idx->offsets[j] * d, *cv = ck + (size_t)idx->sizes[j] * d;
        for (uint32_t i = 0; i < idx->sizes[j]; i++) {
            size_t src = (size_t)h * kv->head_stride + (size_t)idx->perm[idx->offsets[j] + i] * kv->token_stride;
            memcpy(ck + (size_t)i * d, kv->k + src, row);
            memcpy(cv + (size_t)i * d, kv->v + src, row);
        }
    }
    return RI_OK;
}

static void kn_wave_cluster_task(void *arg, size_t begin, size_t end, unsigned worker)
{
    kn_wave_job_t *job = arg;
    kn_wave_t *w = job->w;
    (void)worker;
    for (size_t h = begin; h < end; h++) {
        kn_index_t *idx = &w->idx[h];
        size_t off = h * job->kv->head_stride + job->t0 * job->kv->token_stride;
        job->first[h] = idx->n_clusters;
        ri_status_t st = kn_index_build(w->ops, &w->p.build, job->kv->k + off, job->kv->v + off,
                                        job->kv->token_stride, job->n, (uint32_t)job->t0, job->C,
                                        job->S, idx);
        if (st == RI_OK && w->store == NULL)
            st = kn_wave_copy_clusters(w, (uint32_t)h, job->kv, job->first[h]);
        if (st != RI_OK)
            kn_wave_fail(job, st);
    }
}

static ri_status_t kn_wave_cluster(kn_wave_t *w, const kn_kv_view_t *kv, size_t t0, uint32_t n,
                                   uint32_t C, uint32_t S)
{
    uint32_t first[KN_WAVE_MAX_KV_LOCAL], *fp = first;
    kn_wave_job_t job = {.w = w, .kv = kv, .t0 = t0, .n = n, .C = C, .S = S};
    ri_status_t st;
    if (w->shape.n_kv_heads > KN_WAVE_MAX_KV_LOCAL &&
        (fp = cm_malloc(&kn_tag, w->shape.n_kv_heads * sizeof(uint32_t))) == NULL)
        return RI_ERR_NOMEM;
    job.first = fp;
    atomic_init(&job.status, RI_OK);
    cm_pool_parallel_for(kn_pool(), w->shape.n_kv_heads, 1, kn_wave_cluster_task, &job);
    st = (ri_status_t)atomic_load(&job.status);
    if (st == RI_OK && w->store != NULL)
        st = w->store->append(w->store->ctx, w->idx, fp, kv);
    if (fp != first)
        cm_free(fp);
    if (st != RI_OK)
        return st;
    w->indexed_end = t0 + n;
    kn_wave_budget_grow(&w->p, C, w->idx[0].n_clusters, &w->n_r, &w->n_e);
    return RI_OK;
}

void kn_wave_budget_grow(const kn_wave_params_t *p, uint32_t C, uint32_t total, uint32_t *n_r, uint32_t *n_e)
{
    uint32_t add_r = (uint32_t)lround(p->retrieval_frac * C), add_e = (uint32_t)lround(p->estimation_frac * C);
    *n_r = CM_MIN(*n_r + (add_r ? add_r : 1), total);
    *n_e = CM_MIN(*n_e + add_e, total - *n_r);
}

static bool kn_kv_valid(const kn_wave_t *w, const kn_kv_view_t *kv)
{
    return kv != NULL && (kv->n_tokens == 0 || (kv->k != NULL && kv->v != NULL)) &&
           kv->n_tokens < UINT32_MAX / 2;
}

/* ---- the build: one k-means per block, or an imported piece ---- */

typedef struct kn_wave_build_job {
    kn_wave_t *w;
    const kn_kv_view_t *kv;
    uint32_t lo, hi;               /* the indexed range */
    uint32_t B;                    /* block length */
    uint32_t tpc;                  /* cluster size */
    uint32_t n_blocks;             /* blocks [0, n_blocks) meet [0, hi) */
    uint32_t n_import;             /* blocks [0, n_import) are imported */
    const kn_wave_piece_t *pieces; /* [n_import][n_kv] */
    uint32_t *first;               /* [n_kv] clusters imported per head */
    _Atomic int status;            /* first failure */
} kn_wave_build_job_t;

static uint32_t kn_wave_block_len(const kn_wave_params_t *p)
{
    return p->segment_tokens ? p->segment_tokens : KN_WAVE_SEGMENT_TOKENS;
}

/* The indexed tokens [*blo, *bhi) of block b (empty when b lies in the sinks). */
static void kn_wave_block_range(const kn_wave_build_job_t *job, uint32_t b, uint32_t *blo, uint32_t *bhi)
{
    uint64_t a = (uint64_t)b * job->B, e = a + job->B;
    *blo = (uint32_t)CM_MAX(a, (uint64_t)job->lo);
    *bhi = (uint32_t)CM_MIN(e, (uint64_t)job->hi);
    if (*bhi < *blo)
        *bhi = *blo;
}

/* Clusters the build gives a block of nt tokens. */
static uint32_t kn_wave_block_plan(const kn_wave_build_job_t *job, uint32_t nt)
{
    uint32_t S;
    if (nt == 0)
        return 0;
    return CM_MIN(kn_index_plan(nt, job->tpc, job->B, &S), nt);
}

/* Drop the empty clusters among [first, n_clusters) of idx (a k-means may
 * leave some): every cluster then holds a token, so a block's clusters are
 * found by their tokens alone.  perm is untouched (empty clusters own none). */
static void kn_wave_drop_empty(kn_index_t *idx, uint32_t first)
{
    size_t d = idx->head_dim;
    uint32_t o = first;
    for (uint32_t j = first; j < idx->n_clusters; j++) {
        if (idx->sizes[j] == 0)
            continue;
        if (o != j) {
            idx->sizes[o] = idx->sizes[j];
            idx->offsets[o] = idx->offsets[j];
            memcpy(idx->centroids + o * d, idx->centroids + j * d, d);
            idx->cscale[o] = idx->cscale[j];
            memcpy(idx->vq + o * d, idx->vq + j * d, d);
            idx->vscale[o] = idx->vscale[j];
        }
        o++;
    }
    if (idx->offsets[o] != idx->n_tokens) /* none dropped: already so */
        idx->offsets[o] = idx->n_tokens;
    idx->n_clusters = o;
}

/* Append a checked piece to idx (room reserved). */
static void kn_wave_import_piece(kn_index_t *idx, const kn_wave_piece_t *pc)
{
    size_t d = idx->head_dim, c0 = idx->n_clusters;
    uint32_t off = idx->n_tokens;
    /* the tables too: a shared prefix's sizes, offsets and perm are the
     * same bytes in every sequence (its clusters first, absolute positions) */
    kn_wave_put_table(idx, idx->sizes + c0, pc->sizes, pc->n_clusters);
    for (uint32_t j = 0; j <= pc->n_clusters; j++) {
        kn_wave_put_table(idx, idx->offsets + c0 + j, &off, 1);
        if (j < pc->n_clusters)
            off += pc->sizes[j];
    }
    kn_wave_put_table(idx, idx->perm + idx->n_tokens, pc->perm, off - idx->n_tokens);
    /* the int8 centroids, means and scales as the exporting index had them:
     * a copy, never a new quantization, so an import ranks and decodes bit
     * for bit as a build */
    kn_wave_put_rows(idx, idx->centroids + c0 * d, pc->centroids, (size_t)pc->n_clusters * d);
    kn_wave_put_rows(idx, idx->cscale + c0, pc->cscale, (size_t)pc->n_clusters * sizeof(float));
    kn_wave_put_rows(idx, idx->vq + c0 * d, pc->vq, (size_t)pc->n_clusters * d);
    kn_wave_put_rows(idx, idx->vscale + c0, pc->vscale, (size_t)pc->n_clusters * sizeof(float));
    idx->n_clusters += pc->n_clusters;
    idx->n_tokens = off;
}

static ri_status_t kn_wave_build_head(kn_wave_build_job_t *job, uint32_t h)
{
    kn_wave_t *w = job->w;
    const kn_kv_view_t *kv = job->kv;
    kn_index_t *idx = &w->idx[h];
    uint64_t add_c = 0;
    uint32_t blo, bhi;
    ri_status_t st;

    for (uint32_t b = 0; b < job->n_blocks; b++) {
        kn_wave_block_range(job, b, &blo, &bhi);
        add_c += b < job->n_import ? job->pieces[(size_t)b * w->shape.n_kv_heads + h].n_clusters
                                   : kn_wave_block_plan(job, bhi - blo);
    }
    if (add_c > UINT32_MAX / 2)
        return RI_ERR_RANGE;
    st = kn_index_reserve(idx, (uint32_t)add_c, job->hi - job->lo);  /* once: the blocks append in place */
    for (uint32_t b = 0; b < job->n_blocks && st == RI_OK; b++) {
        kn_wave_block_range(job, b, &blo, &bhi);
        if (b < job->n_import) {
            kn_wave_import_piece(idx, &job->pieces[(size_t)b * w->shape.n_kv_heads + h]);
            continue;
        }
        if (b == job->n_import)
            job->first[h] = idx->n_clusters;
        if (bhi == blo)
            continue;
        size_t off = (size_t)h * kv->head_stride + (size_t)blo * kv->token_stride;
        uint32_t f = idx->n_clusters;
        st = kn_index_build(w->ops, &w->p.build, kv->k + off, kv->v + off, kv->token_stride, bhi - blo, blo,
                            kn_wave_block_plan(job, bhi - blo), 1, idx);
        if (st == RI_OK)
            kn_wave_drop_empty(idx, f);
    }
    if (job->n_import >= job->n_blocks)
        job->first[h] = idx->n_clusters;
    cm_free(idx->vsum);  /* the reserve's scratch when nothing was clustered */
    idx->vsum = NULL;
    if (st == RI_OK && w->store == NULL)
        st = kn_wave_copy_clusters(w, h, kv, 0);
    return st;
}

static void kn_wave_build_task(void *arg, size_t begin, size_t end, unsigned worker)
{
    kn_wave_build_job_t *job = arg;
    (void)worker;
    for (size_t h = begin; h < end; h++) {
        ri_status_t st = kn_wave_build_head(job, (uint32_t)h);
        if (st != RI_OK) {
            int expect = RI_OK;
            atomic_compare_exchange_strong(&job->status, &expect, (int)st);
        }
    }
}

/* Is pc a consistent piece of block b, whose indexed tokens are [blo, bhi)?
 * seen: bhi - blo bytes of scratch. */
static bool kn_wave_piece_ok(const kn_wave_piece_t *pc, uint64_t first_pos, uint32_t blo, uint32_t bhi,
                             uint8_t *seen)
{
    uint64_t sum = 0;
    const uint32_t *perm = pc->perm;

    if (pc->first_pos != first_pos || pc->n_clusters > bhi - blo)
        return false;
    if (pc->n_clusters > 0 && (!pc->sizes || !pc->perm || !pc->centroids || !pc->cscale || !pc->vq || !pc->vscale))
        return false;
    for (uint32_t j = 0; j < pc->n_clusters; j++)
        sum += pc->sizes[j];
    if (sum != bhi - blo)
        return false;
    memset(seen, 0, bhi - blo);
    for (uint32_t j = 0; j < pc->n_clusters; j++) {
        if (pc->sizes[j] == 0)
            return false;
        for (uint32_t i = 0; i < pc->sizes[j]; i++) {
            uint32_t t = perm[i];
            if (t < blo || t >= bhi || seen[t - blo] || (i > 0 && t <= perm[i - 1]))
                return false;
            seen[t - blo] = 1;
        }
        perm += pc->sizes[j];
    }
    return true;
}

/* Ask for every (block, head) piece and check it, before anything changes. */
static ri_status_t kn_wave_fetch_pieces(kn_wave_build_job_t *job, const kn_wave_pieces_t *pieces,
                                        kn_wave_piece_t *out)
{
    uint32_t nkv = job->w->shape.n_kv_heads, blo, bhi;
    uint8_t *seen = cm_malloc(&kn_tag, job->B);
    ri_status_t st = RI_OK;

    if (seen == NULL)
        return RI_ERR_NOMEM;
    for (uint32_t b = 0; b < job->n_import && st == RI_OK; b++) {
        kn_wave_block_range(job, b, &blo, &bhi);
        for (uint32_t h = 0; h < nkv && st == RI_OK; h++) {
            kn_wave_piece_t *pc = &out[(size_t)b * nkv + h];
            memset(pc, 0, sizeof(*pc));
            st = pieces->get(pieces->ctx, b, h, pc);
            if (st == RI_OK && !kn_wave_piece_ok(pc, (uint64_t)b * job->B, blo, bhi, seen))
                st = RI_ERR_INVALID;
        }
    }
    cm_free(seen);
    return st;
}

ri_status_t kn_wave_build_pieces(kn_wave_t *w, const kn_kv_view_t *kv, const kn_wave_pieces_t *pieces)
{
    uint32_t nkv, first_local[KN_WAVE_MAX_KV_LOCAL];
    kn_wave_build_job_t job = {.w = w, .kv = kv};
    kn_wave_piece_t *got = NULL;
    ri_status_t st = RI_OK;

    if (w == NULL || !kn_kv_valid(w, kv) || w->idx[0].n_clusters != 0 ||
        (pieces != NULL && pieces->n_blocks > 0 && pieces->get == NULL))
        return RI_ERR_INVALID;
    job.n_import = pieces ? pieces->n_blocks : 0;
    if (kv->n_tokens < (size_t)w->p.sink_tokens + w->p.window_tokens + w->p.update_tokens)
        return job.n_import ? RI_ERR_INVALID : RI_OK;  /* too short: dense until the first update */
    nkv = w->shape.n_kv_heads;
    job.lo = w->p.sink_tokens;
    job.hi = (uint32_t)(kv->n_tokens - w->p.window_tokens);
    job.B = kn_wave_block_len(&w->p);
    job.tpc = kn_wave_cluster_tokens(&w->p, job.hi - job.lo);
    job.n_blocks = (uint32_t)(((uint64_t)job.hi + job.B - 1) / job.B);
    if ((uint64_t)job.n_import * job.B > job.hi)
        return RI_ERR_INVALID;  /* an imported block reaches past the indexed range */
    job.first = first_local;
    if (nkv > KN_WAVE_MAX_KV_LOCAL && (job.first = cm_malloc(&kn_tag, nkv * sizeof(uint32_t))) == NULL)
        return RI_ERR_NOMEM;
    if (job.n_import > 0) {
        got = cm_malloc(&kn_tag, (size_t)job.n_import * nkv * sizeof(*got));
        st = got ? kn_wave_fetch_pieces(&job, pieces, got) : RI_ERR_NOMEM;
        if (st != RI_OK)
            goto free_job;
        job.pieces = got;
    }
    atomic_init(&job.status, RI_OK);
    cm_pool_parallel_for(kn_pool(), nkv, 1, kn_wave_build_task, &job);
    st = (ri_status_t)atomic_load(&job.status);
    if (st == RI_OK && w->store != NULL)
        st = w->store->append(w->store->ctx, w->idx, job.first, kv);
    if (st != RI_OK) {
        for (uint32_t h = 0; h < nkv; h++)  /* unchanged: the indexes were empty */
            kn_index_cleanup(&w->idx[h]);
        goto free_job;
    }
    kn_wave_fix_geometry(w, job.hi - job.lo);
    w->indexed_end = job.hi;
    kn_wave_budget_grow(&w->p, w->idx[0].n_clusters, w->idx[0].n_clusters, &w->n_r, &w->n_e);
free_job:
    cm_free(got);
    if (job.first != first_local)
        cm_free(job.first);
    return st;
}

ri_status_t kn_wave_build(kn_wave_t *w, const kn_kv_view_t *kv)
{
    return kn_wave_build_pieces(w, kv, NULL);
}

ri_status_t kn_wave_block_clusters(const kn_index_t *idx, uint32_t first_pos, uint32_t n_tokens, uint32_t *j0_p,
                                   uint32_t *j1_p)
{
    uint64_t end = (uint64_t)first_pos + n_tokens;
    uint32_t lo, hi, j0, j1;

    if (idx == NULL || j0_p == NULL || j1_p == NULL || (idx->n_clusters > 0 && (!idx->offsets || !idx->perm)))
        return RI_ERR_INVALID;
    /* a cluster's first token is its smallest and clusters come block after
     * block: "first token < x" holds for a prefix of the clusters */
#define KN_FIRST_TOK(j) (idx->offsets[j] < idx->n_tokens ? (uint64_t)idx->perm[idx->offsets[j]] : UINT64_MAX)
    for (lo = 0, hi = idx->n_clusters; lo < hi;) {
        uint32_t m = lo + (hi - lo) / 2;
        if (KN_FIRST_TOK(m) < first_pos)
            lo = m + 1;
        else
            hi = m;
    }
    j0 = lo;
    for (hi = idx->n_clusters; lo < hi;) {
        uint32_t m = lo + (hi - lo) / 2;
        if (KN_FIRST_TOK(m) < end)
            lo = m + 1;
        else
            hi = m;
    }
#undef KN_FIRST_TOK
    j1 = lo;
    for (uint32_t j = j0; j < j1; j++)  /* every token inside: the last is the largest */
        if (idx->sizes[j] > 0 && idx->perm[idx->offsets[j + 1] - 1] >= end)
            return RI_ERR_INVALID;
    if (j0 > 0 && idx->offsets[j0] > 0 && idx->perm[idx->offsets[j0] - 1] >= first_pos)
        return RI_ERR_INVALID;  /* a cluster before reaches into the range */
    *j0_p = j0;
    *j1_p = j1;
    return RI_OK;
}

ri_status_t kn_wave_update(kn_wave_t *w, const kn_kv_view_t *kv, bool *updated_p)
{
    bool any = false;
    ri_status_t st = RI_OK;
    if (w == NULL || !kn_kv_valid(w, kv) || !kn_wave_covers(w, kv->n_tokens))
        return RI_ERR_INVALID;
    while (kv->n_tokens >= w->indexed_end + w->p.window_tokens + w->p.update_tokens) {
        if (w->idx[0].n_clusters == 0)
            kn_wave_fix_geometry(w, w->p.update_tokens);  /* no build: the first update is the index */
        st = kn_wave_cluster(w, kv, w->indexed_end, w->p.update_tokens, w->p.update_clusters, 1);
        if (st != RI_OK)
            break;
        any = true;
    }
    if (updated_p)
        *updated_p = any;
    return st;
}

/* ---- tripartite decode ---- */

ri_status_t kn_wave_rank_estimate(const kn_ops_t *ops, const kn_shape_t *grp, const float *q, const kn_index_t *idx,
                                  uint32_t n_r, uint32_t n_e, uint32_t *ids, uint32_t *nr, uint32_t *ne, float *o_e,
                                  float *l_e)
{
    /* the backend's fused pass where it has one: one read of the centroids */
    kn_rank_estimate_fn_t fn = NULL;
    if (ops == kn_ops_cpu())
        fn = kn_cpu_rank_estimate;
    else if (ops != NULL && ops == kn_ops_cuda())
        fn = kn_ops_cuda_fused();
    bool fused = fn != NULL && ops->supports(KN_OP_RANK, grp, KN_DTYPE_F16);
    ri_status_t st;

    *nr = *ne = 0;
    if (idx->n_clusters > 0) {
        st = fused ? fn(grp, q, idx, n_r, n_e, ids, nr, ne, o_e, l_e) : kn_rank(ops, grp, q, idx, n_r, n_e, ids, nr, ne);
        if (st != RI_OK || fused)
            return st;
    }
    return kn_estimate(ops, grp, q, idx, ids + *nr, *ne, o_e, l_e);
}

#define KN_WAVE_MAX_PARTS 4 /* exact + estimated + late, and room */

ri_status_t kn_wave_exact_merge(const kn_wave_t *w, uint32_t h, const float *q, const kn_kv_view_t *kv,
                                const kn_page_t *ret, size_t n_ret, float *o_x, float *l_x,
                                const float *const *part_o, const float *const *part_l, uint32_t n_parts,
                                float *out, float *lse, uint64_t *exact_p)
{
    kn_shape_t grp = {.n_q_heads = w->g, .n_kv_heads = 1, .head_dim = w->d, .scale = w->shape.scale};
    size_t sink = CM_MIN((size_t)w->p.sink_tokens, kv->n_tokens), tail0 = CM_MAX(w->indexed_end, sink);
    size_t np = 0, hoff = (size_t)h * kv->head_stride;
    const float *op[KN_WAVE_MAX_PARTS], *lp[KN_WAVE_MAX_PARTS];
    float lse_tmp[KN_GMAX_LOCAL];
    uint64_t exact = 0;
    kn_page_t *pages;
    ri_status_t st;

    if (n_parts + 1 > KN_WAVE_MAX_PARTS || w->g > KN_GMAX_LOCAL)
        return RI_ERR_INVALID;
    pages = cm_malloc(&kn_tag, (n_ret + 2) * sizeof(kn_page_t));
    if (pages == NULL)
        return RI_ERR_NOMEM;
    pages[np++] = (kn_page_t){kv->k + hoff, kv->v + hoff, (uint32_t)sink, (uint32_t)kv->token_stride};
    if (kv->n_tokens > tail0)
        pages[np++] = (kn_page_t){kv->k + hoff + tail0 * kv->token_stride, kv->v + hoff + tail0 * kv->token_stride,
                                  (uint32_t)(kv->n_tokens - tail0), (uint32_t)kv->token_stride};
    memcpy(pages + np, ret, n_ret * sizeof(kn_page_t));
    np += n_ret;
    for (size_t i = 0; i < np; i++)
        exact += pages[i].n_tokens;
    st = kn_attn_pages(w->ops, &grp, q, pages, np, o_x, l_x);
    cm_free(pages);
    if (st != RI_OK)
        return st;
    op[0] = o_x;
    lp[0] = l_x;
    for (uint32_t i = 0; i < n_parts; i++) {
        op[i + 1] = part_o[i];
        lp[i + 1] = part_l[i];
    }
    st = kn_merge(w->ops, w->g, w->d, n_parts + 1, op, lp, out, lse ? lse : lse_tmp);
    if (st == RI_OK && exact_p != NULL)
        *exact_p = exact;
    return st;
}

static void kn_wave_decode_task(void *arg, size_t begin, size_t end, unsigned worker)
{
    kn_wave_job_t *job = arg;
    kn_wave_t *w = job->w;
    const kn_kv_view_t *kv = job->kv;
    uint32_t g = w->g, d = w->d;
    kn_shape_t grp = {.n_q_heads = g, .n_kv_heads = 1, .head_dim = d, .scale = w->shape.scale};
    (void)worker;

    for (size_t h = begin; h < end; h++) {
        const kn_index_t *idx = &w->idx[h];
        const float *q = job->q + h * g * d;
        float *out = job->out + h * g * d;
        uint32_t nr = 0, ne = 0, rr, re;
        kn_wave_rank_counts(&w->p, idx->n_clusters, job->n_r, job->n_e, &rr, &re);
        uint32_t want = (uint32_t)CM_MIN((uint64_t)rr + re, idx->n_clusters);
        size_t np = 0;
        uint64_t exact = 0, retrieved = 0;
        ri_status_t st = RI_ERR_NOMEM;
        uint32_t *ids = cm_malloc(&kn_tag, ((size_t)want + 1) * sizeof(uint32_t));
        kn_page_t *pages = cm_malloc(&kn_tag, ((size_t)want + 1) * sizeof(kn_page_t));
        float *part = cm_malloc(&kn_tag, (size_t)2 * g * (d + 1) * sizeof(float));

        if (!ids || !pages || !part || g > KN_GMAX_LOCAL)
            goto fail;
        float *o_x = part, *o_e = part + (size_t)g * d;
        float *l_x = part + (size_t)2 * g * d, *l_e = l_x + g;
        st = kn_wave_rank_estimate(w->ops, &grp, q, idx, rr, re, ids, &nr, &ne, o_e, l_e);
        if (st == RI_OK)
            st = kn_wave_adapt(&w->p, w->ops, &grp, q, idx, job->n_r, ids, &nr, &ne, o_e, l_e);
        if (st != RI_OK)
            goto fail;
        /* exact part: the retrieved clusters from our cluster-major copy */
        for (uint32_t i = 0; i < nr; i++) {
            uint32_t j = ids[i];
            const cm_fp16_t *ck = w->ckv[h] + (size_t)2 * idx->offsets[j] * d;
            pages[np++] = (kn_page_t){ck, ck + (size_t)idx->sizes[j] * d, idx->sizes[j], d};
            retrieved += idx->sizes[j];
        }
        const float *op[1] = {o_e}, *lp[1] = {l_e};
        st = kn_wave_exact_merge(w, (uint32_t)h, q, kv, pages, np, o_x, l_x, op, lp, 1, out,
                                 job->lse ? job->lse + h * g : NULL, &exact);
        if (st != RI_OK)
            goto fail;
        atomic_fetch_add(&job->exact, exact);
        atomic_fetch_add(&job->retrieved, retrieved);
        atomic_fetch_add(&job->est, ne);
        atomic_fetch_add(&job->bytes, exact * 4 * d +                                /* K+V fp16 */
                                          (uint64_t)idx->n_clusters * (d + 8) +      /* centroids + scale, sizes */
                                          (uint64_t)ne * (idx->vq ? d + 4 : 4 * d)); /* int8 means + scale, or sums */
        cm_free(ids);
        cm_free(pages);
        cm_free(part);
        continue;
fail:
        kn_wave_fail(job, st);
        cm_free(ids);
        cm_free(pages);
        cm_free(part);
    }
}

ri_status_t kn_wave_decode_budget(kn_wave_t *w, const float *q, const kn_kv_view_t *kv,
                                  uint32_t n_r, uint32_t n_e, float *out, float *lse,
                                  kn_wave_stats_t *stats_p)
{
    kn_wave_job_t job = {.w = w, .kv = kv, .q = q, .out = out, .lse = lse, .n_r = n_r, .n_e = n_e};
    if (w == NULL || w->store != NULL || q == NULL || out == NULL || !kn_kv_valid(w, kv) ||
        !kn_wave_covers(w, kv->n_tokens))
        return RI_ERR_INVALID;
    atomic_init(&job.status, RI_OK);
    cm_pool_parallel_for(kn_pool(), w->shape.n_kv_heads, 1, kn_wave_decode_task, &job);
    if (atomic_load(&job.status) != RI_OK)
        return (ri_status_t)atomic_load(&job.status);
    if (stats_p) {
        stats_p->exact_tokens = atomic_load(&job.exact);
        stats_p->retrieved_tokens = atomic_load(&job.retrieved);
        stats_p->est_clusters = atomic_load(&job.est);
        stats_p->bytes_read = atomic_load(&job.bytes);
    }
    return RI_OK;
}

ri_status_t kn_wave_decode(kn_wave_t *w, const float *q, const kn_kv_view_t *kv, float *out,
                           float *lse, kn_wave_stats_t *stats_p)
{
    if (w == NULL)
        return RI_ERR_INVALID;
    uint32_t n_r, n_e;
    kn_wave_budget(w, &n_r, &n_e);
    return kn_wave_decode_budget(w, q, kv, n_r, n_e, out, lse, stats_p);
}

ri_status_t kn_wave_exact_mask(kn_wave_t *w, const float *q, const kn_kv_view_t *kv,
                               uint32_t kv_head, uint32_t n_r, uint8_t *mask)
{
    kn_shape_t grp = {.n_q_heads = w->g, .n_kv_heads = 1, .head_dim = w->d, .scale = w->shape.scale};
    const kn_index_t *idx;
    uint32_t nr = 0, ne = 0, *ids;
    size_t sink;
    ri_status_t st = RI_OK;

    if (w == NULL || q == NULL || mask == NULL || !kn_kv_valid(w, kv) ||
        kv_head >= w->shape.n_kv_heads || !kn_wave_covers(w, kv->n_tokens))
        return RI_ERR_INVALID;
    idx = &w->idx[kv_head];
    sink = CM_MIN((size_t)w->p.sink_tokens, kv->n_tokens);
    memset(mask, 0, kv->n_tokens);
    memset(mask, 1, sink);
    if (kv->n_tokens > CM_MAX(w->indexed_end, sink))
        memset(mask + CM_MAX(w->indexed_end, sink), 1, kv->n_tokens - CM_MAX(w->indexed_end, sink));
    if (idx->n_clusters == 0)
        return RI_OK;
    ids = cm_malloc(&kn_tag, ((size_t)n_r + 1) * sizeof(uint32_t));
    if (ids == NULL)
        return RI_ERR_NOMEM;
    st = kn_rank(w->ops, &grp, q + (size_t)kv_head * w->g * w->d, idx, n_r, 0, ids, &nr, &ne);
    for (uint32_t i = 0; i < nr && st == RI_OK; i++)
        for (uint32_t r = idx->offsets[ids[i]]; r < idx->offsets[ids[i] + 1]; r++)
            mask[idx->perm[r]] = 1;
    cm_free(ids);
    return st;
}
