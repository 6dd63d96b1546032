/*
 * The cross-check harness of kernels/: every op of every available backend
 * against the scalar reference, on awkward shapes, with fresh random inputs
 * each run (the seed is printed; RI_TEST_SEED=... reproduces a run), NaN/Inf
 * checked before any error measure, guard words around every output, and one
 * deliberately corrupted backend that the harness must catch.
 *
 *   test_kn_xcheck           small shapes (label unit; also runs under ASan)
 *   test_kn_xcheck --slow    adds N = 131072 (label slow)
 */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>
#include <cmocka.h>

#ifdef KN_XC_CUDA
#include "kernels/cuda/kn_cuda.h"
#endif
#include "kernels/kn_internal.h"
#include "kernels/kn_ops.h"
#include "tests/kernels/kn_test_index.h"

#define GUARD 16
static const uint32_t xc_guard_word = 0x7fc0dead;  /* a NaN payload nobody writes */
static uint64_t xc_rng;
static bool xc_slow;
static bool xc_quiet;  /* the corrupted-backend test expects failures: keep them short */

static uint64_t xc_next(void)
{
    uint64_t z = (xc_rng += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

/* uniform in (-1, 1), never exactly 0 */
static float xc_unif(void)
{
    return ((float)(xc_next() >> 40) + 0.5f) / (float)(1u << 23) - 1.0f;
}

static float xc_gauss(void)
{
    return (xc_unif() + xc_unif() + xc_unif() + xc_unif()) * 0.8660254f;
}

/* ---- guarded buffers ---- */

typedef struct xc_buf {
    float *base;
    float *p;   /* n usable floats */
    size_t n;
} xc_buf_t;

static xc_buf_t xc_buf(size_t n)
{
    xc_buf_t b = {.n = n};
    b.base = malloc((n + 2 * GUARD) * sizeof(float));
    assert_non_null(b.base);
    for (size_t i = 0; i < n + 2 * GUARD; i++)
        memcpy(&b.base[i], &xc_guard_word, 4);
    b.p = b.base + GUARD;
    return b;
}

static bool xc_guards_ok(const xc_buf_t *b, const char *what)
{
    for (size_t i = 0; i < GUARD; i++) {
        if (memcmp(&b->base[i], &xc_guard_word, 4) != 0 ||
            memcmp(&b->base[GUARD + b->n + i], &xc_guard_word, 4) != 0) {
            if (!xc_quiet)
                fprintf(stderr, "FAIL %s: guard word overwritten\n", what);
            return false;
        }
    }
    return true;
}

static void xc_free(xc_buf_t *b)
{
    free(b->base);
    b->base = b->p = NULL;
}

/* NaN/Inf first (got must be finite wherever want is; -inf must match), then
 * relative L2 over the whole vector. */
static bool xc_close(const char *what, const float *got, const float *want, size_t n, double tol)
{
    double e = 0, r = 0;
    for (size_t i = 0; i < n; i++) {
        if (isinf(want[i]) && want[i] < 0) {
            if (!(isinf(got[i]) && got[i] < 0)) {
                if (!xc_quiet)
                    fprintf(stderr, "FAIL %s: [%zu] = %g, want -inf\n", what, i, got[i]);
                return false;
            }
            continue;
        }
        if (!isfinite(got[i])) {
            if (!xc_quiet)
                fprintf(stderr, "FAIL %s: [%zu] is %g (not finite)\n", what, i, got[i]);
            return false;
        }
    }
    for (size_t i = 0; i < n; i++) {
        if (!isfinite(want[i]))
            continue;
        e += ((double)got[i] - want[i]) * ((double)got[i] - want[i]);
        r += (double)want[i] * want[i];
    }
    if (sqrt(e) > tol * (sqrt(r) + 1e-3 * sqrt((double)n))) {
        if (!xc_quiet)
            fprintf(stderr, "FAIL %s: rel L2 error %.3g > %.1g\n", what, sqrt(e / (r + 1e-30)), tol);
        return false;
    }
    return true;
}

static cm_fp16_t *xc_half(size_t n, float sd)
{
    cm_fp16_t *h = malloc((n ? n : 1) * sizeof(cm_fp16_t));
    assert_non_null(h);
    for (size_t i = 0; i < n; i++)
        h[i] = cm_f32_to_fp16(xc_gauss() * sd);
    return h;
}

static float *xc_floats(size_t n, float sd)
{
    float *f = malloc((n ? n : 1) * sizeof(float));
    assert_non_null(f);
    for (size_t i = 0; i < n; i++)
        f[i] = xc_gauss() * sd;
    return f;
}

/* ---- what was checked ----
 * Every case asks the backend's supports() first.  A declined case is
 * counted as "not supported", never as a pass; test_every_op_checked fails
 * when a backend declined every case of an op (it would check nothing). */

#define XC_MAX_BACKENDS 8
typedef struct xc_count {
    const char *backend;
    unsigned checked[KN_OP_COUNT];
    unsigned unsupported[KN_OP_COUNT];
} xc_count_t;
static xc_count_t xc_counts[XC_MAX_BACKENDS];

static xc_count_t *xc_count_of(const kn_ops_t *ops)
{
    for (size_t i = 0; i < XC_MAX_BACKENDS; i++) {
        if (xc_counts[i].backend == NULL)
            xc_counts[i].backend = ops->name;
        if (strcmp(xc_counts[i].backend, ops->name) == 0)
            return &xc_counts[i];
    }
    fail_msg("more than %d backends", XC_MAX_BACKENDS);
    return NULL;
}

/* True when ops takes the case (counted as checked); false: counted as not
 * supported, and the caller checks nothing. */
static bool xc_supported(const kn_ops_t *ops, kn_op_t op, const kn_shape_t *shape, const char *what)
{
    xc_count_t *c = xc_count_of(ops);
    if (ops->supports(op, shape, KN_DTYPE_F16)) {
        c->checked[op]++;
        return true;
    }
    c->unsupported[op]++;
    if (!xc_quiet)
        printf("not supported (not checked): %s\n", what);
    return false;
}

/* ---- ops ---- */

/* Full decode for a batch of sequences with the given lengths; layout 0 =
 * token-major, 1 = head-major.  Returns the number of failures. */
static int xc_attn_decode(const kn_ops_t *ops, uint32_t nkv, uint32_t g, uint32_t d,
                          const size_t *len, size_t n_seq, int layout)
{
    kn_shape_t sh = {g * nkv, nkv, d, 0};
    size_t nq = (size_t)g * nkv, fails = 0;
    kn_kv_view_t kv[8];
    cm_fp16_t *k[8], *v[8];
    float *q = xc_floats(n_seq * nq * d, 1.5f);
    xc_buf_t o = xc_buf(n_seq * nq * d), l = xc_buf(n_seq * nq);
    float *ro = malloc(n_seq * nq * d * sizeof(float)), *rl = malloc(n_seq * nq * sizeof(float));
    char what[160];

    assert_true(n_seq <= 8);
    for (size_t s = 0; s < n_seq; s++) {
        k[s] = xc_half(len[s] * nkv * d, 1.0f);
        v[s] = xc_half(len[s] * nkv * d, 1.0f);
        kv[s] = layout ? (kn_kv_view_t){k[s], v[s], len[s], d, len[s] * d}
                       : (kn_kv_view_t){k[s], v[s], len[s], (size_t)nkv * d, d};
    }
    assert_int_equal(kn_ops_ref()->attn_decode(&sh, n_seq, q, kv, ro, rl), RI_OK);
    snprintf(what, sizeof(what), "%s attn_decode nkv=%u g=%u d=%u n0=%zu seqs=%zu %s", ops->name,
             nkv, g, d, len[0], n_seq, layout ? "head-major" : "token-major");
    if (!xc_supported(ops, KN_OP_ATTN_DECODE, &sh, what)) {
        fails = 0;  /* counted as not supported, not as a pass */
    } else if (ops->attn_decode(&sh, n_seq, q, kv, o.p, l.p) != RI_OK) {
        fails = 1;
    } else {
        fails += !xc_guards_ok(&o, what) || !xc_guards_ok(&l, what);
        fails += !xc_close(what, o.p, ro, n_seq * nq * d, 2e-5);
        fails += !xc_close(what, l.p, rl, n_seq * nq, 2e-5);
    }
    for (size_t s = 0; s < n_seq; s++) {
        free(k[s]);
        free(v[s]);
    }
    free(q);
    free(ro);
    free(rl);
    xc_free(&o);
    xc_free(&l);
    return (int)fails;
}

static void test_attn_decode(void **state)
{
    const kn_ops_t *ops[4];
    size_t n_ops = kn_ops_list(ops, 4);
    static const size_t lens[] = {1, 3, 113, 1000, 8193};
    static const uint32_t gs[] = {1, 3, 4, 8};
    int fails = 0;
    for (size_t b = 1; b < n_ops; b++) {
        for (size_t li = 0; li < (sizeof(lens) / sizeof(lens[0])); li++)
            for (size_t gi = 0; gi < 4; gi++)
                for (uint32_t d = 64; d <= 128; d += 64) {
                    size_t one = lens[li];
                    if (one > 1000 && (gs[gi] != 4 || d != 128))
                        continue;  /* the long case once, in the Llama shape */
                    fails += xc_attn_decode(ops[b], 2, gs[gi], d, &one, 1, (int)(li % 2));
                }
        {
            size_t batch[3] = {113, 1, 1000};  /* different lengths in one batch */
            size_t empty[2] = {0, 17};
            fails += xc_attn_decode(ops[b], 8, 4, 128, batch, 3, 0);
            fails += xc_attn_decode(ops[b], 8, 4, 128, batch, 3, 1);
            fails += xc_attn_decode(ops[b], 1, 1, 64, empty, 2, 1);
            fails += xc_attn_decode(ops[b], 1, 5, 48, batch, 3, 0);  /* off the SIMD path */
        }
    }
    assert_int_equal(fails, 0);
}

static void test_attn_decode_long(void **state)
{
    const kn_ops_t *ops[4];
    size_t n_ops = kn_ops_list(ops, 4), n = 131072;
    int fails = 0;
    for (size_t b = 1; b < n_ops; b++) {
        fails += xc_attn_decode(ops[b], 2, 4, 128, &n, 1, 1);
        fails += xc_attn_decode(ops[b], 1, 3, 64, &n, 1, 0);
    }
    assert_int_equal(fails, 0);
}

/* Pages of assorted sizes (0, 1, 3, 8, 16, 113 rows) with row strides > d. */
static int xc_attn_pages(const kn_ops_t *ops, uint32_t g, uint32_t d, size_t n_pages,
                         size_t max_rows)
{
    static const uint32_t sizes[] = {0, 1, 3, 8, 16, 113};
    kn_shape_t grp = {g, 1, d, 0.07f};
    kn_page_t pages[64];
    cm_fp16_t *store[64][2];
    float *q = xc_floats((size_t)g * d, 1.0f), ro[8 * 128], rl[8];
    xc_buf_t o = xc_buf((size_t)g * d), l = xc_buf(g);
    int fails = 0;
    char what[128];

    for (size_t p = 0; p < n_pages; p++) {
        uint32_t rows = max_rows ? (uint32_t)max_rows : sizes[xc_next() % 6];
        uint32_t stride = d + (uint32_t)(xc_next() % 3) * 8;
        store[p][0] = xc_half((size_t)rows * stride + 1, 1.0f);
        store[p][1] = xc_half((size_t)rows * stride + 1, 1.0f);
        pages[p] = (kn_page_t){store[p][0], store[p][1], rows, stride};
    }
    assert_int_equal(kn_ops_ref()->attn_pages(&grp, q, pages, n_pages, ro, rl), RI_OK);
    snprintf(what, sizeof(what), "%s attn_pages g=%u d=%u pages=%zu", ops->name, g, d, n_pages);
    if (!xc_supported(ops, KN_OP_ATTN_PAGES, &grp, what)) {
        /* counted as not supported */
    } else if (ops->attn_pages(&grp, q, pages, n_pages, o.p, l.p) != RI_OK) {
        fails++;
    } else {
        fails += !xc_guards_ok(&o, what) || !xc_guards_ok(&l, what);
        fails += !xc_close(what, o.p, ro, (size_t)g * d, 2e-5);
        fails += !xc_close(what, l.p, rl, g, 2e-5);
    }
    for (size_t p = 0; p < n_pages; p++) {
        free(store[p][0]);
        free(store[p][1]);
    }
    free(q);
    xc_free(&o);
    xc_free(&l);
    return fails;
}

static void test_attn_pages(void **state)
{
    const kn_ops_t *ops[4];
    size_t n_ops = kn_ops_list(ops, 4);
    static const uint32_t gs[] = {1, 3, 4, 8};
    int fails = 0;
    for (size_t b = 1; b < n_ops; b++)
        for (int gi = 0; gi < 4; gi++)
            for (uint32_t d = 64; d <= 128; d += 64) {
                fails += xc_attn_pages(ops[b], gs[gi], d, 1 + xc_next() % 40, 0);
                fails += xc_attn_pages(ops[b], gs[gi], d, 0, 0);  /* nothing: lse -inf */
                fails += xc_attn_pages(ops[b], gs[gi], d, 2, 1);  /* single-row pages */
            }
    assert_int_equal(fails, 0);
}

/* When set, xc_index also fills the int8 means (vq, vscale) that a built
 * index carries and the cpu decode reads, and sets its fp32 sums to the
 * dequantized means times the sizes: the reference reads the sums, so it
 * sees the very values the backends read, and the outputs agree as tightly
 * as over the sums (the quantization's own error is test_kn_invariants'
 * and the accuracy bench's). */
static bool xc_means;
#define XC_EST_TOL 2e-5
#define XC_MAXD    256 /* the largest head dim a check draws */

/* A random index of C clusters: some empty, some of size 1; the
 * centroids drawn in fp32 and quantized as a build does (kn_vq_quantize). */
static void xc_index(kn_index_t *idx, uint32_t d, uint32_t C)
{
    uint32_t tok = 0;
    float crow[XC_MAXD];
    assert_true(d <= XC_MAXD);
    kn_index_init(idx, d);
    idx->centroids = malloc((size_t)C * d + 1);
    idx->cscale = malloc(((size_t)C + 1) * sizeof(float));
    idx->vsum = malloc((size_t)C * d * sizeof(float));
    idx->sizes = malloc(C * sizeof(uint32_t));
    idx->offsets = malloc((C + 1) * sizeof(uint32_t));
    for (uint32_t j = 0; j < C; j++) {
        uint64_t r = xc_next() % 10;
        idx->sizes[j] = r == 0 ? 0 : (r == 1 ? 1 : 1 + (uint32_t)(xc_next() % 31));
        idx->offsets[j] = tok;
        tok += idx->sizes[j];
        for (uint32_t i = 0; i < d; i++) {
            crow[i] = xc_gauss() * 0.8f;
            idx->vsum[(size_t)j * d + i] = xc_gauss() * (float)idx->sizes[j];
        }
        kn_vq_quantize(crow, 1.0f, d, idx->centroids + (size_t)j * d, &idx->cscale[j]);
    }
    idx->offsets[C] = tok;
    idx->n_clusters = idx->cap_clusters = C;
    idx->n_tokens = idx->cap_tokens = tok;
    idx->perm = malloc((tok ? tok : 1) * sizeof(uint32_t));
    for (uint32_t t = 0; t < tok; t++)
        idx->perm[t] = t;
    if (!xc_means)
        return;
    idx->vq = malloc((size_t)C * d + 1);
    idx->vscale = malloc(((size_t)C + 1) * sizeof(float));
    for (size_t j = 0; j < C; j++) {
        kn_vq_quantize(idx->vsum + j * d, idx->sizes[j] ? 1.0f / (float)idx->sizes[j] : 0.0f, d, idx->vq + j * d,
                       &idx->vscale[j]);
        for (uint32_t i = 0; i < d; i++)
            idx->vsum[j * d + i] = kn_vq_at(idx->vq, idx->vscale, j, d, i) * (float)idx->sizes[j];
    }
}

static int xc_cmp_desc(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x < y) - (x > y);
}

/* The rank's score of every cluster in double (sum over the g query heads
 * of each head's softmax over the non-empty clusters), and the non-empty
 * clusters' scores sorted descending into sorted; returns their count. */
static uint32_t xc_rank_scores(const float *q, const kn_index_t *idx, uint32_t g, double *score, double *sorted)
{
    uint32_t C = idx->n_clusters, d = idx->head_dim, avail = 0;
    double *lg = malloc((C + 1) * sizeof(double));
    assert_non_null(lg);
    for (uint32_t j = 0; j < C; j++)
        score[j] = 0;
    for (uint32_t h = 0; h < g; h++) {
        double m = -INFINITY, sum = 0;
        for (uint32_t j = 0; j < C; j++) {
            double s = 0;
            for (uint32_t i = 0; i < d; i++)
                s += (double)q[(size_t)h * d + i] * idx->centroids[(size_t)j * d + i];
            lg[j] = s * idx->cscale[j] / sqrt((double)d);
            if (idx->sizes[j])
                m = fmax(m, lg[j]);
        }
        for (uint32_t j = 0; j < C; j++)
            if (idx->sizes[j])
                sum += exp(lg[j] - m);
        for (uint32_t j = 0; j < C; j++)
            if (idx->sizes[j])
                score[j] += exp(lg[j] - m) / sum;
    }
    free(lg);
    for (uint32_t j = 0; j < C; j++)
        if (idx->sizes[j])
            sorted[avail++] = score[j];
    qsort(sorted, avail, sizeof(double), xc_cmp_desc);
    return avail;
}

/* ids[0, nr) retrieved and ids[nr, nr + ne) estimated: the counts the rank's
 * contract gives, no id twice, none empty, each at or above its zone's cut
 * (near-ties allowed).  False with a message otherwise. */
static bool xc_selection_ok(const char *what, const kn_index_t *idx, const double *score, const double *sorted,
                            uint32_t avail, uint32_t n_r, uint32_t n_e, const uint32_t *ids, uint32_t nr, uint32_t ne)
{
    uint32_t C = idx->n_clusters, wr = n_r < avail ? n_r : avail, we = n_e < avail - wr ? n_e : avail - wr;
    uint8_t *seen = calloc(C + 1, 1);
    bool ok = nr == wr && ne == we;
    if (!ok)
        fprintf(stderr, "FAIL %s: counts %u+%u, want %u+%u\n", what, nr, ne, wr, we);
    for (uint32_t i = 0; ok && i < nr + ne; i++) {
        uint32_t j = ids[i];
        double cut = i < nr ? sorted[nr - 1] : sorted[nr + ne - 1];
        if (j >= C || idx->sizes[j] == 0 || seen[j] || score[j] < cut - 1e-6) {
            fprintf(stderr, "FAIL %s: id %u (pos %u) wrong\n", what, j, i);
            ok = false;
        } else {
            seen[j] = 1;
        }
    }
    free(seen);
    return ok;
}

/* Rank: the selection must be right up to near-ties (scores recomputed here
 * in double). */
static int xc_rank(const kn_ops_t *ops, uint32_t g, uint32_t d, uint32_t C, uint32_t n_r,
                   uint32_t n_e)
{
    kn_shape_t grp = {g, 1, d, 0};
    kn_index_t idx;
    float *q = xc_floats((size_t)g * d, 2.0f);
    double *score = calloc(C + 1, sizeof(double)), *sorted = malloc((C + 1) * sizeof(double));
    uint32_t *ids = malloc(((size_t)n_r + n_e + 1) * sizeof(uint32_t)), nr, ne, avail;
    int fails = 0;
    char what[128];

    xc_index(&idx, d, C);
    avail = xc_rank_scores(q, &idx, g, score, sorted);
    snprintf(what, sizeof(what), "%s rank g=%u d=%u C=%u R=%u E=%u", ops->name, g, d, C, n_r, n_e);
    if (!xc_supported(ops, KN_OP_RANK, &grp, what))
        goto out;
    if (ops->rank(&grp, q, &idx, n_r, n_e, ids, &nr, &ne) != RI_OK)
        fails++;
    else
        fails += !xc_selection_ok(what, &idx, score, sorted, avail, n_r, n_e, ids, nr, ne);
out:
    kn_test_index_free(&idx);
    free(q);
    free(score);
    free(sorted);
    free(ids);
    return fails;
}

static void test_rank(void **state)
{
    const kn_ops_t *ops[4];
    size_t n_ops = kn_ops_list(ops, 4);
    int fails = 0;
    for (size_t b = 0; b < n_ops; b++) {  /* ref too: the recomputed scores judge it */
        fails += xc_rank(ops[b], 4, 128, 1, 1, 0);
        fails += xc_rank(ops[b], 3, 64, 113, 2, 26);
        fails += xc_rank(ops[b], 8, 128, 1000, 18, 232);
        fails += xc_rank(ops[b], 1, 64, 50, 60, 60);  /* asks for more than there is */
        fails += xc_rank(ops[b], 4, 128, 4096, 74, 950);
    }
    assert_int_equal(fails, 0);
}

static int xc_estimate(const kn_ops_t *ops, uint32_t g, uint32_t d, uint32_t C, size_t n)
{
    kn_shape_t grp = {g, 1, d, 0};
    kn_index_t idx;
    float *q = xc_floats((size_t)g * d, 1.0f);
    float *ro = malloc((size_t)g * d * sizeof(float)), *rl = malloc(g * sizeof(float));
    uint32_t *ids = malloc((n + 1) * sizeof(uint32_t));
    xc_buf_t o = xc_buf((size_t)g * d), l = xc_buf(g);
    int fails = 0;
    char what[128];

    xc_index(&idx, d, C);
    for (size_t i = 0; i < n; i++)
        ids[i] = (uint32_t)(xc_next() % C);
    assert_int_equal(kn_ops_ref()->estimate(&grp, q, &idx, ids, n, ro, rl), RI_OK);
    snprintf(what, sizeof(what), "%s estimate g=%u d=%u n=%zu", ops->name, g, d, n);
    if (!xc_supported(ops, KN_OP_ESTIMATE, &grp, what)) {
        /* counted as not supported */
    } else if (ops->estimate(&grp, q, &idx, ids, n, o.p, l.p) != RI_OK) {
        fails++;
    } else {
        fails += !xc_guards_ok(&o, what) || !xc_guards_ok(&l, what);
        fails += !xc_close(what, o.p, ro, (size_t)g * d, XC_EST_TOL);
        fails += !xc_close(what, l.p, rl, g, 2e-5);
    }
    kn_test_index_free(&idx);
    free(q);
    free(ro);
    free(rl);
    free(ids);
    xc_free(&o);
    xc_free(&l);
    return fails;
}

static void test_estimate(void **state)
{
    const kn_ops_t *ops[4];
    size_t n_ops = kn_ops_list(ops, 4);
    int fails = 0;
    for (size_t b = 1; b < n_ops; b++) {
        fails += xc_estimate(ops[b], 4, 128, 1, 1);
        fails += xc_estimate(ops[b], 3, 64, 113, 0);
        fails += xc_estimate(ops[b], 8, 128, 1000, 232);
        fails += xc_estimate(ops[b], 1, 64, 37, 3);
        fails += xc_estimate(ops[b], 5, 40, 37, 30);
    }
    assert_int_equal(fails, 0);
}

static int xc_merge(const kn_ops_t *ops, size_t rows, uint32_t d, size_t parts)
{
    float **op = malloc((parts + 1) * sizeof(float *)), **lp = malloc((parts + 1) * sizeof(float *));
    float *ro = malloc(rows * d * sizeof(float)), *rl = malloc(rows * sizeof(float));
    xc_buf_t o = xc_buf(rows * d), l = xc_buf(rows);
    int fails = 0;
    char what[96];
    for (size_t p = 0; p < parts; p++) {
        op[p] = xc_floats(rows * d, 1.0f);
        lp[p] = xc_floats(rows, 20.0f);
        if (xc_next() % 4 == 0)
            lp[p][xc_next() % rows] = -INFINITY;  /* an empty part */
    }
    assert_int_equal(kn_ops_ref()->merge(rows, d, parts, (const float *const *)op,
                                         (const float *const *)lp, ro, rl), RI_OK);
    snprintf(what, sizeof(what), "%s merge rows=%zu d=%u parts=%zu", ops->name, rows, d, parts);
    if (!xc_supported(ops, KN_OP_MERGE, &(kn_shape_t){1, 1, d, 0}, what)) {
        /* counted as not supported */
    } else if (ops->merge(rows, d, parts, (const float *const *)op, (const float *const *)lp, o.p, l.p) != RI_OK) {
        fails++;
    } else {
        fails += !xc_guards_ok(&o, what) || !xc_guards_ok(&l, what);
        fails += !xc_close(what, o.p, ro, rows * d, 2e-5);
        fails += !xc_close(what, l.p, rl, rows, 2e-5);
    }
    for (size_t p = 0; p < parts; p++) {
        free(op[p]);
        free(lp[p]);
    }
    free(op);
    free(lp);
    free(ro);
    free(rl);
    xc_free(&o);
    xc_free(&l);
    return fails;
}

static void test_merge(void **state)
{
    const kn_ops_t *ops[4];
    size_t n_ops = kn_ops_list(ops, 4);
    int fails = 0;
    for (size_t b = 1; b < n_ops; b++) {
        fails += xc_merge(ops[b], 1, 64, 1);
        fails += xc_merge(ops[b], 4, 128, 2);
        fails += xc_merge(ops[b], 3, 64, 5);
        fails += xc_merge(ops[b], 8, 128, 67);
    }
    assert_int_equal(fails, 0);
}

static int xc_quest(const kn_ops_t *ops, uint32_t g, uint32_t d, size_t np)
{
    kn_shape_t grp = {g, 1, d, 0};
    float *q = xc_floats((size_t)g * d, 1.0f), *rs = malloc((np + 1) * sizeof(float));
    cm_fp16_t *mn = xc_half(np * d, 1.0f), *mx = malloc((np * d + 1) * sizeof(cm_fp16_t));
    xc_buf_t s = xc_buf(np);
    int fails = 0;
    char what[96];
    for (size_t i = 0; i < np * d; i++)
        mx[i] = cm_f32_to_fp16(cm_fp16_to_f32(mn[i]) + fabsf(xc_gauss()));
    assert_int_equal(kn_ops_ref()->quest_score(&grp, q, mn, mx, np, rs), RI_OK);
    snprintf(what, sizeof(what), "%s quest_score g=%u d=%u pages=%zu", ops->name, g, d, np);
    if (!xc_supported(ops, KN_OP_QUEST_SCORE, &grp, what)) {
        /* counted as not supported */
    } else if (ops->quest_score(&grp, q, mn, mx, np, s.p) != RI_OK) {
        fails++;
    } else {
        fails += !xc_guards_ok(&s, what);
        fails += !xc_close(what, s.p, rs, np, 2e-5);
    }
    free(q);
    free(rs);
    free(mn);
    free(mx);
    xc_free(&s);
    return fails;
}

static void test_quest_score(void **state)
{
    const kn_ops_t *ops[4];
    size_t n_ops = kn_ops_list(ops, 4);
    int fails = 0;
    for (size_t b = 1; b < n_ops; b++) {
        fails += xc_quest(ops[b], 4, 128, 1);
        fails += xc_quest(ops[b], 3, 64, 113);
        fails += xc_quest(ops[b], 8, 128, 1000);
        fails += xc_quest(ops[b], 1, 24, 9);
    }
    assert_int_equal(fails, 0);
}

/* Index build: structure valid, centroids = mean of member keys (the int8
 * row times its scale within half a step of it), value sums =
 * sum of member values, and the assignment equal to the reference's except
 * for near-ties (at most 1% of tokens). */
static int xc_index_check(const kn_index_t *ix, const cm_fp16_t *k, const cm_fp16_t *v, size_t stride,
                          uint32_t n, uint32_t base, const char *what)
{
    uint32_t d = ix->head_dim;
    uint8_t *seen = calloc(n + 1, 1);
    int fails = 0;
    if (ix->n_tokens != n || ix->offsets[0] != 0 || ix->offsets[ix->n_clusters] != n) {
        fprintf(stderr, "FAIL %s: token counts\n", what);
        free(seen);
        return 1;
    }
    for (uint32_t j = 0; j < ix->n_clusters && !fails; j++) {
        double mean[256] = {0}, vs[256] = {0};
        if (ix->offsets[j + 1] - ix->offsets[j] != ix->sizes[j])
            fails++;
        for (uint32_t r = ix->offsets[j]; r < ix->offsets[j + 1]; r++) {
            uint32_t t = ix->perm[r] - base;
            if (t >= n || seen[t]++) {
                fails++;
                break;
            }
            for (uint32_t i = 0; i < d; i++) {
                mean[i] += cm_fp16_to_f32(k[(size_t)t * stride + i]);
                vs[i] += cm_fp16_to_f32(v[(size_t)t * stride + i]);
            }
        }
        for (uint32_t i = 0; i < d && ix->sizes[j]; i++) {
            double c = (double)ix->centroids[(size_t)j * d + i] * ix->cscale[j], want = mean[i] / ix->sizes[j];
            if (fabs(c - want) > ix->cscale[j] / 2.0 + 1e-5 * (1 + fabs(want)) ||
                fabs(ix->vsum[(size_t)j * d + i] - vs[i]) > 1e-4 * (1 + fabs(vs[i]))) {
                fails++;
                break;
            }
        }
    }
    if (fails)
        fprintf(stderr, "FAIL %s: index structure\n", what);
    free(seen);
    return fails;
}

static int xc_index_build(const kn_ops_t *ops, uint32_t d, uint32_t n, uint32_t C, uint32_t S,
                          uint32_t iters, int32_t neighbours)
{
    kn_build_params_t p;
    kn_index_t a, b;
    size_t stride = d + 8;
    cm_fp16_t *k = xc_half((size_t)n * stride, 1.0f), *v = xc_half((size_t)n * stride, 1.0f);
    uint32_t *ca = malloc((n + 1) * sizeof(uint32_t)), *cb = malloc((n + 1) * sizeof(uint32_t));
    uint32_t differ = 0;
    int fails = 0;
    char what[128];

    kn_build_params_default(&p);
    p.iters = iters;
    p.final_neighbours = neighbours;
    kn_index_init(&a, d);
    kn_index_init(&b, d);
    snprintf(what, sizeof(what), "%s index_build d=%u n=%u C=%u S=%u", ops->name, d, n, C, S);
    assert_int_equal(kn_ops_ref()->index_build(&p, k, v, stride, n, 5, C, S, &a), RI_OK);
    if (!xc_supported(ops, KN_OP_INDEX_BUILD, &(kn_shape_t){1, 1, d, 0}, what))
        goto out;
    if (ops->index_build(&p, k, v, stride, n, 5, C, S, &b) != RI_OK) {
        fails++;
        goto out;
    }
    fails += xc_index_check(&a, k, v, stride, n, 5, what);
    fails += xc_index_check(&b, k, v, stride, n, 5, what);
    for (uint32_t j = 0; j < C && !fails; j++) {
        for (uint32_t r = a.offsets[j]; r < a.offsets[j + 1]; r++)
            ca[a.perm[r] - 5] = j;
        for (uint32_t r = b.offsets[j]; r < b.offsets[j + 1]; r++)
            cb[b.perm[r] - 5] = j;
    }
    for (uint32_t t = 0; t < n && !fails; t++)
        differ += ca[t] != cb[t];
    if (differ > n / 100) {
        fprintf(stderr, "FAIL %s: %u of %u tokens in other clusters than ref\n", what, differ, n);
        fails++;
    }
out:
    kn_index_cleanup(&a);
    kn_index_cleanup(&b);
    free(k);
    free(v);
    free(ca);
    free(cb);
    return fails;
}

static void test_index_build(void **state)
{
    const kn_ops_t *ops[4];
    size_t n_ops = kn_ops_list(ops, 4);
    int fails = 0;
    for (size_t b = 1; b < n_ops; b++) {
        fails += xc_index_build(ops[b], 64, 1, 1, 1, 9, -1);
        fails += xc_index_build(ops[b], 128, 3, 8, 1, 9, -1);      /* more clusters than tokens: empties */
        fails += xc_index_build(ops[b], 64, 113, 113, 1, 2, -1);   /* clusters of size 1 */
        fails += xc_index_build(ops[b], 128, 1000, 64, 2, 1, -1);
        fails += xc_index_build(ops[b], 64, 1000, 64, 4, 1, 1);    /* neighbour-restricted final */
        fails += xc_index_build(ops[b], 48, 200, 16, 2, 1, 0);     /* off the SIMD path */
        fails += xc_index_build(ops[b], 128, 1024, 64, 1, 9, -1);  /* the decode-time update */
    }
    assert_int_equal(fails, 0);
}

/* The cpu backend's fused rank + estimation (used by kn_wave) against the
 * reference estimation over the same clusters. */
static int xc_fused(uint32_t g, uint32_t d, uint32_t C, uint32_t n_r, uint32_t n_e)
{
    kn_shape_t grp = {g, 1, d, 0};
    kn_index_t idx;
    float *q = xc_floats((size_t)g * d, 2.0f);
    float *ro = malloc((size_t)g * d * sizeof(float)), rl[8];
    uint32_t *ids = malloc(((size_t)n_r + n_e + 1) * sizeof(uint32_t)), *ids2 = malloc(((size_t)n_r + n_e + 1) * sizeof(uint32_t));
    uint32_t nr, ne, nr2, ne2;
    xc_buf_t o = xc_buf((size_t)g * d), l = xc_buf(g);
    int fails = 0;
    char what[96];
    xc_index(&idx, d, C);
    snprintf(what, sizeof(what), "cpu fused rank+estimate g=%u d=%u C=%u", g, d, C);
    assert_int_equal(kn_cpu_rank_estimate(&grp, q, &idx, n_r, n_e, ids, &nr, &ne, o.p, l.p), RI_OK);
    assert_int_equal(kn_ops_cpu()->rank(&grp, q, &idx, n_r, n_e, ids2, &nr2, &ne2), RI_OK);
    assert_int_equal(nr, nr2);
    assert_int_equal(ne, ne2);
    assert_memory_equal(ids, ids2, ((size_t)nr + ne) * sizeof(uint32_t));
    assert_int_equal(kn_ops_ref()->estimate(&grp, q, &idx, ids + nr, ne, ro, rl), RI_OK);
    fails += !xc_guards_ok(&o, what) || !xc_guards_ok(&l, what);
    fails += !xc_close(what, o.p, ro, (size_t)g * d, XC_EST_TOL);
    fails += !xc_close(what, l.p, rl, g, 2e-5);
    kn_test_index_free(&idx);
    free(q);
    free(ro);
    free(ids);
    free(ids2);
    xc_free(&o);
    xc_free(&l);
    return fails;
}

static void test_rank_estimate_fused(void **state)
{
    int fails = 0;
    fails += xc_fused(4, 128, 1000, 18, 232);
    fails += xc_fused(3, 64, 113, 2, 26);
    fails += xc_fused(8, 128, 37, 1, 0);
    fails += xc_fused(1, 48, 300, 5, 70);  /* scalar path */
    assert_int_equal(fails, 0);
}

/* The same two with the int8 means a built index carries (what kn_wave's
 * decode reads), against the reference over the same means. */
static void test_estimate_means(void **state)
{
    const kn_ops_t *ops[4];
    size_t n_ops = kn_ops_list(ops, 4);
    int fails = 0;
    xc_means = true;
    for (size_t b = 1; b < n_ops; b++) {
        fails += xc_estimate(ops[b], 4, 128, 1000, 232);
        fails += xc_estimate(ops[b], 8, 128, 300, 70);
        fails += xc_estimate(ops[b], 3, 64, 113, 26);
        fails += xc_estimate(ops[b], 5, 40, 37, 30);  /* scalar path */
    }
    fails += xc_fused(4, 128, 1000, 18, 232);
    fails += xc_fused(8, 128, 8192, 147, 1900);
    fails += xc_fused(3, 64, 113, 2, 26);
    fails += xc_fused(1, 48, 300, 5, 70);  /* scalar path */
    xc_means = false;
    assert_int_equal(fails, 0);
}

#ifdef KN_XC_CUDA
/* A device copy of bytes at src (any count, 0 included). */
static void *xc_dev_n(const void *src, size_t bytes)
{
    void *p = NULL;
    assert_int_equal(kn_cuda_malloc(&p, bytes), RI_OK);
    if (bytes > 0)
        assert_int_equal(kn_cuda_copy(p, src, bytes), RI_OK);
    return p;
}

#endif

/* Where the wave step's inputs live: device memory for the cuda table, the
 * host buffers themselves for the others. */
static void *xc_place(const kn_ops_t *ops, const void *src, size_t bytes)
{
#ifdef KN_XC_CUDA
    if (ops == kn_ops_cuda())
        return xc_dev_n(src, bytes);
#endif
    (void)ops;
    (void)bytes;
    return (void *)src;
}

static void xc_unplace(const kn_ops_t *ops, void *p)
{
#ifdef KN_XC_CUDA
    if (ops == kn_ops_cuda())
        kn_cuda_free(p);
#endif
    (void)ops;
    (void)p;
}

/* The wave_step op of ops over nkv heads of random indexes with int8 means (C - 3h
 * clusters for head h, so the heads' lengths differ and one may be empty),
 * the steady zone as two spans with rows of stride d + 8: per head a correct
 * selection, and the output the reference gives over the ids the step chose
 * (estimate + attn_pages over the steady spans and the retrieved clusters +
 * merge). */
static bool xc_wave_ties;  /* xc_wave_step: 5 distinct centroids, so that scores tie at the cuts */

static int xc_wave_step(const kn_ops_t *ops, uint32_t nkv, uint32_t g, uint32_t d, uint32_t C, uint32_t n_r, uint32_t n_e,
                        uint32_t n_sink, uint32_t n_win)
{
    kn_shape_t sh = {g * nkv, nkv, d, 0}, grp = {g, 1, d, 0};
    size_t nq = (size_t)g * nkv, per = (size_t)n_r + n_e, st_rows = (size_t)n_sink + n_win, sd = d + 8;
    kn_index_t idx[8];
    kn_wave_head_t hd[8];
    cm_fp16_t *ck[8], *cv[8], *sk[8], *sv[8];
    void *dev[8][10];
    float *q = xc_floats(nq * d, 2.0f);
    uint32_t *ids = malloc((nkv * per + 1) * sizeof(uint32_t)), cnt[16];
    xc_buf_t o = xc_buf(nq * d), l = xc_buf(nq);
    int fails = 0;
    char what[128];

    assert_true(nkv <= 8 && g <= 8 && d <= 256);
    xc_means = true; /* the step reads the int8 means; the reference the same as sums */
    for (uint32_t h = 0; h < nkv; h++) {
        uint32_t Ch = C > 3 * h ? C - 3 * h : 0;
        size_t rows;
        xc_index(&idx[h], d, Ch);
        for (uint32_t j = 5; xc_wave_ties && j < Ch; j++) {
            memcpy(idx[h].centroids + (size_t)j * d, idx[h].centroids + (size_t)(j % 5) * d, d);
            idx[h].cscale[j] = idx[h].cscale[j % 5];
        }
        rows = idx[h].n_tokens;
        ck[h] = xc_half(rows * d, 1.0f);
        cv[h] = xc_half(rows * d, 1.0f);
        sk[h] = xc_half(st_rows * sd, 1.0f);
        sv[h] = xc_half(st_rows * sd, 1.0f);
        dev[h][0] = xc_place(ops, idx[h].centroids, (size_t)Ch * d);
        dev[h][9] = xc_place(ops, idx[h].cscale, (size_t)Ch * sizeof(float));
        dev[h][1] = xc_place(ops, idx[h].sizes, (size_t)Ch * sizeof(uint32_t));
        dev[h][2] = xc_place(ops, idx[h].offsets, (size_t)Ch * sizeof(uint32_t));
        dev[h][3] = xc_place(ops, idx[h].vq, (size_t)Ch * d);
        dev[h][8] = xc_place(ops, idx[h].vscale, (size_t)Ch * sizeof(float));
        dev[h][4] = xc_place(ops, ck[h], rows * d * sizeof(cm_fp16_t));
        dev[h][5] = xc_place(ops, cv[h], rows * d * sizeof(cm_fp16_t));
        dev[h][6] = xc_place(ops, sk[h], st_rows * sd * sizeof(cm_fp16_t));
        dev[h][7] = xc_place(ops, sv[h], st_rows * sd * sizeof(cm_fp16_t));
        hd[h] = (kn_wave_head_t){ .centroids = dev[h][0],
                                  .cscale = dev[h][9],
                                  .sizes = dev[h][1],
                                  .offsets = dev[h][2],
                                  .vq = dev[h][3],
                                  .vscale = dev[h][8],
                                  .ck = dev[h][4],
                                  .cv = dev[h][5],
                                  .n_clusters = Ch,
                                  .steady = { { dev[h][6], dev[h][7], n_sink, (uint32_t)sd },
                                              { (cm_fp16_t *)dev[h][6] + n_sink * sd,
                                                (cm_fp16_t *)dev[h][7] + n_sink * sd, n_win, (uint32_t)sd } } };
    }
    snprintf(what, sizeof(what), "%s wave_step nkv=%u g=%u d=%u C=%u R=%u E=%u", ops->name, nkv, g, d, C, n_r,
             n_e);
    if (!xc_supported(ops, KN_OP_WAVE_STEP, &sh, what))
        goto out;
    if (ops->wave_step(&sh, q, hd, n_r, n_e, o.p, l.p, ids, cnt) != RI_OK) {
        fprintf(stderr, "FAIL %s: the step failed\n", what);
        fails++;
        goto out;
    }
    fails += !xc_guards_ok(&o, what) || !xc_guards_ok(&l, what);
    for (uint32_t h = 0; h < nkv && fails == 0; h++) {
        uint32_t Ch = idx[h].n_clusters, nr = cnt[2 * h], ne = cnt[2 * h + 1], avail, *hid = ids + h * per;
        double *score = calloc(Ch + 1, sizeof(double)), *sorted = malloc((Ch + 1) * sizeof(double));
        kn_page_t *pages = malloc(((size_t)nr + 2) * sizeof(kn_page_t));
        float oe[8 * 256], le[8], ox[8 * 256], lx[8], ro[8 * 256], rl[8];
        const float *op[2] = {ox, oe}, *lp[2] = {lx, le}, *qh = q + (size_t)h * g * d;
        size_t np = 0;
        avail = xc_rank_scores(qh, &idx[h], g, score, sorted);
        if (!xc_selection_ok(what, &idx[h], score, sorted, avail, n_r, n_e, hid, nr, ne)) {
            fails++;
        } else {
            pages[np++] = (kn_page_t){sk[h], sv[h], n_sink, (uint32_t)sd};
            pages[np++] = (kn_page_t){sk[h] + n_sink * sd, sv[h] + n_sink * sd, n_win, (uint32_t)sd};
            for (uint32_t i = 0; i < nr; i++)
                pages[np++] = (kn_page_t){ck[h] + (size_t)idx[h].offsets[hid[i]] * d,
                                          cv[h] + (size_t)idx[h].offsets[hid[i]] * d, idx[h].sizes[hid[i]], d};
            assert_int_equal(kn_ops_ref()->estimate(&grp, qh, &idx[h], hid + nr, ne, oe, le), RI_OK);
            assert_int_equal(kn_ops_ref()->attn_pages(&grp, qh, pages, np, ox, lx), RI_OK);
            assert_int_equal(kn_ops_ref()->merge(g, d, 2, op, lp, ro, rl), RI_OK);
            fails += !xc_close(what, o.p + (size_t)h * g * d, ro, (size_t)g * d, XC_EST_TOL);
            fails += !xc_close(what, l.p + (size_t)h * g, rl, g, 2e-5);
        }
        free(score);
        free(sorted);
        free(pages);
    }
out:
    for (uint32_t h = 0; h < nkv; h++) {
        for (int i = 0; i < 10; i++)
            xc_unplace(ops, dev[h][i]);
        kn_test_index_free(&idx[h]);
        free(ck[h]);
        free(cv[h]);
        free(sk[h]);
        free(sv[h]);
    }
    xc_means = false;
    free(q);
    free(ids);
    xc_free(&o);
    xc_free(&l);
    return fails;
}

/* The host backends' wave_step (the group ops head by head). */
static void test_wave_step(void **state)
{
    const kn_ops_t *ops = kn_ops_cpu();
    int fails = 0;
    (void)state;
    fails += xc_wave_step(ops, 3, 3, 64, 113, 2, 26, 4, 64);   /* SmolLM2's heads */
    fails += xc_wave_step(ops, 1, 4, 256, 300, 9, 40, 4, 16);  /* Gemma 3's d */
    fails += xc_wave_step(ops, 3, 8, 128, 5, 4, 4, 1, 3);      /* more than there is; the last head empty */
    fails += xc_wave_step(ops, 2, 5, 64, 50, 0, 10, 0, 7);     /* nothing retrieved, no sinks */
    fails += xc_wave_step(ops, 2, 2, 128, 40, 12, 0, 4, 0);    /* nothing estimated, no window */
    xc_wave_ties = true;
    fails += xc_wave_step(ops, 1, 3, 64, 97, 7, 30, 4, 64);
    xc_wave_ties = false;
    assert_int_equal(fails, 0);
}

#ifdef KN_XC_CUDA
/* The CUDA fused rank + estimation (kn_cuda_rank_estimate) against ref rank +
 * ref estimate: the ids must be a right selection up to near-ties (scores
 * recomputed here in double, as in xc_rank; the device returns them in score
 * order), and (o, lse) must equal the reference estimation over the E ids it
 * returned. */
static int xc_fused_cuda(uint32_t g, uint32_t d, uint32_t C, uint32_t n_r, uint32_t n_e)
{
    kn_shape_t grp = {g, 1, d, 0};
    kn_index_t idx;
    float *q = xc_floats((size_t)g * d, 2.0f), rl[8];
    float *ro = malloc((size_t)g * d * sizeof(float));
    double *score = calloc(C + 1, sizeof(double)), *sorted = malloc((C + 1) * sizeof(double));
    uint32_t *ids = malloc(((size_t)n_r + n_e + 1) * sizeof(uint32_t));
    uint32_t nr, ne, avail;
    xc_buf_t o = xc_buf((size_t)g * d), l = xc_buf(g);
    int fails = 0;
    char what[96];

    xc_index(&idx, d, C);
    snprintf(what, sizeof(what), "cuda fused rank+estimate g=%u d=%u C=%u", g, d, C);
    avail = xc_rank_scores(q, &idx, g, score, sorted);
    assert_int_equal(kn_cuda_rank_estimate(&grp, q, &idx, n_r, n_e, ids, &nr, &ne, o.p, l.p), RI_OK);
    if (!xc_selection_ok(what, &idx, score, sorted, avail, n_r, n_e, ids, nr, ne)) {
        fails++;
        goto out;
    }
    assert_int_equal(kn_ops_ref()->estimate(&grp, q, &idx, ids + nr, ne, ro, rl), RI_OK);
    fails += !xc_guards_ok(&o, what) || !xc_guards_ok(&l, what);
    fails += !xc_close(what, o.p, ro, (size_t)g * d, XC_EST_TOL);
    fails += !xc_close(what, l.p, rl, g, 2e-5);
out:
    kn_test_index_free(&idx);
    free(q);
    free(ro);
    free(score);
    free(sorted);
    free(ids);
    xc_free(&o);
    xc_free(&l);
    return fails;
}

/* ---- the pointer rule on the device: inputs in device memory ----
 * The cases above pass host memory (staged by the ops).  A device-resident
 * caller passes device pointers, which take other paths: the cache and
 * pages read in place (pages as their own work items), an index whose
 * arrays are device memory.  Each must give what the reference gives over
 * the host copies. */
static void *xc_dev(const void *src, size_t bytes)
{
    void *p = NULL;
    assert_int_equal(kn_cuda_malloc(&p, bytes), RI_OK);
    assert_int_equal(kn_cuda_copy(p, src, bytes), RI_OK);
    return p;
}

static int xc_device_decode(uint32_t nkv, uint32_t g, uint32_t d, size_t n, int layout)
{
    kn_shape_t sh = {g * nkv, nkv, d, 0};
    size_t nq = (size_t)g * nkv, elems = n * nkv * d;
    cm_fp16_t *k = xc_half(elems, 1.0f), *v = xc_half(elems, 1.0f);
    float *q = xc_floats(nq * d, 1.5f), *ro = malloc(nq * d * sizeof(float)), *rl = malloc(nq * sizeof(float));
    xc_buf_t o = xc_buf(nq * d), l = xc_buf(nq);
    kn_kv_view_t kv = layout ? (kn_kv_view_t){k, v, n, d, n * d} : (kn_kv_view_t){k, v, n, (size_t)nkv * d, d};
    kn_kv_view_t dkv = kv;
    int fails = 0;
    char what[96];

    dkv.k = xc_dev(k, elems * sizeof(cm_fp16_t));
    dkv.v = xc_dev(v, elems * sizeof(cm_fp16_t));
    snprintf(what, sizeof(what), "cuda attn_decode device cache nkv=%u g=%u d=%u n=%zu", nkv, g, d, n);
    assert_int_equal(kn_ops_ref()->attn_decode(&sh, 1, q, &kv, ro, rl), RI_OK);
    if (kn_ops_cuda()->attn_decode(&sh, 1, q, &dkv, o.p, l.p) != RI_OK) {
        fails++;
    } else {
        fails += !xc_guards_ok(&o, what) || !xc_guards_ok(&l, what);
        fails += !xc_close(what, o.p, ro, nq * d, 2e-5);
        fails += !xc_close(what, l.p, rl, nq, 2e-5);
    }
    kn_cuda_free((void *)dkv.k);
    kn_cuda_free((void *)dkv.v);
    free(k);
    free(v);
    free(q);
    free(ro);
    free(rl);
    xc_free(&o);
    xc_free(&l);
    return fails;
}

static int xc_device_pages(uint32_t g, uint32_t d, size_t n_pages)
{
    static const uint32_t sizes[] = {0, 1, 3, 8, 16, 113, 1500};
    kn_shape_t grp = {g, 1, d, 0.07f};
    kn_page_t pages[48], dpages[48];
    cm_fp16_t *store[48][2];
    float *q = xc_floats((size_t)g * d, 1.0f), ro[8 * 256], rl[8];
    int fails = 0;
    char what[96];

    assert_true(n_pages <= 48 && g <= 8 && d <= 256);
    for (size_t p = 0; p < n_pages; p++) {
        uint32_t rows = sizes[xc_next() % 7], stride = d + (uint32_t)(xc_next() % 3) * 8;
        size_t bytes = ((size_t)rows * stride + 1) * sizeof(cm_fp16_t);
        store[p][0] = xc_half((size_t)rows * stride + 1, 1.0f);
        store[p][1] = xc_half((size_t)rows * stride + 1, 1.0f);
        pages[p] = (kn_page_t){store[p][0], store[p][1], rows, stride};
        dpages[p] = (kn_page_t){xc_dev(store[p][0], bytes), xc_dev(store[p][1], bytes), rows, stride};
    }
    assert_int_equal(kn_ops_ref()->attn_pages(&grp, q, pages, n_pages, ro, rl), RI_OK);
    for (int way = 0; way < 2; way++) {
        xc_buf_t o = xc_buf((size_t)g * d), l = xc_buf(g);
        ri_status_t st = way ? kn_cuda_attn_pages_device(&grp, q, dpages, n_pages, o.p, l.p)
                             : kn_ops_cuda()->attn_pages(&grp, q, dpages, n_pages, o.p, l.p);
        snprintf(what, sizeof(what), "cuda %s device pages g=%u d=%u pages=%zu",
                 way ? "kn_cuda_attn_pages_device" : "attn_pages", g, d, n_pages);
        if (st != RI_OK) {
            fails++;
        } else {
            fails += !xc_guards_ok(&o, what) || !xc_guards_ok(&l, what);
            fails += !xc_close(what, o.p, ro, (size_t)g * d, 2e-5);
            fails += !xc_close(what, l.p, rl, g, 2e-5);
        }
        xc_free(&o);
        xc_free(&l);
    }
    for (size_t p = 0; p < n_pages; p++) {
        kn_cuda_free((void *)dpages[p].k);
        kn_cuda_free((void *)dpages[p].v);
        free(store[p][0]);
        free(store[p][1]);
    }
    free(q);
    return fails;
}

/* rank, estimate and the fused op over an index whose arrays are device
 * memory: the same ids and outputs as over the host index, and the
 * reference's estimation. */
static int xc_device_index(uint32_t g, uint32_t d, uint32_t C, uint32_t n_r, uint32_t n_e)
{
    kn_shape_t grp = {g, 1, d, 0};
    kn_index_t idx, di;
    float *q = xc_floats((size_t)g * d, 2.0f);
    uint32_t *ih = malloc(((size_t)n_r + n_e + 1) * sizeof(uint32_t)), *id = malloc(((size_t)n_r + n_e + 1) * sizeof(uint32_t));
    uint32_t *rnd = malloc(64 * sizeof(uint32_t)), nrh, neh, nrd, ned;
    float oh[8 * 256], lh[8], od[8 * 256], ld[8], ro[8 * 256], rl[8];
    int fails = 0;
    char what[96];

    xc_index(&idx, d, C);
    di = idx;
    di.centroids = xc_dev(idx.centroids, (size_t)C * d);
    di.cscale = xc_dev(idx.cscale, (size_t)C * sizeof(float));
    di.vsum = xc_dev(idx.vsum, (size_t)C * d * sizeof(float));
    di.sizes = xc_dev(idx.sizes, (size_t)C * sizeof(uint32_t));
    di.vq = idx.vq ? xc_dev(idx.vq, (size_t)C * d) : NULL;
    di.vscale = idx.vscale ? xc_dev(idx.vscale, (size_t)C * sizeof(float)) : NULL;
    di.offsets = NULL;
    di.perm = NULL;
    snprintf(what, sizeof(what), "cuda device index g=%u d=%u C=%u", g, d, C);
    assert_int_equal(kn_cuda_rank_estimate(&grp, q, &idx, n_r, n_e, ih, &nrh, &neh, oh, lh), RI_OK);
    assert_int_equal(kn_cuda_rank_estimate(&grp, q, &di, n_r, n_e, id, &nrd, &ned, od, ld), RI_OK);
    if (nrh != nrd || neh != ned || memcmp(ih, id, ((size_t)nrh + neh) * sizeof(uint32_t)) != 0) {
        fprintf(stderr, "FAIL %s: fused ids differ from the host index's\n", what);
        fails++;
    }
    assert_int_equal(kn_ops_ref()->estimate(&grp, q, &idx, id + nrd, ned, ro, rl), RI_OK);
    fails += !xc_close(what, od, ro, (size_t)g * d, XC_EST_TOL) || !xc_close(what, ld, rl, g, 2e-5);
    assert_int_equal(kn_ops_cuda()->rank(&grp, q, &di, n_r, n_e, id, &nrd, &ned), RI_OK);
    if (nrh != nrd || neh != ned || memcmp(ih, id, ((size_t)nrh + neh) * sizeof(uint32_t)) != 0) {
        fprintf(stderr, "FAIL %s: rank ids differ from the host index's\n", what);
        fails++;
    }
    for (size_t i = 0; i < 64; i++)
        rnd[i] = (uint32_t)(xc_next() % C);
    assert_int_equal(kn_ops_ref()->estimate(&grp, q, &idx, rnd, 64, ro, rl), RI_OK);
    assert_int_equal(kn_ops_cuda()->estimate(&grp, q, &di, rnd, 64, od, ld), RI_OK);
    fails += !xc_close(what, od, ro, (size_t)g * d, XC_EST_TOL) || !xc_close(what, ld, rl, g, 2e-5);
    kn_cuda_free(di.centroids);
    kn_cuda_free(di.cscale);
    kn_cuda_free(di.vsum);
    kn_cuda_free(di.sizes);
    kn_cuda_free(di.vq);
    kn_cuda_free(di.vscale);
    kn_test_index_free(&idx);
    free(q);
    free(ih);
    free(id);
    free(rnd);
    return fails;
}

/* index_build from K/V in device memory, twice: both builds equal, bit for
 * bit, the build from host memory (the device build is deterministic; the
 * reference comparison is test_index_build's). */
static int xc_device_build(uint32_t d, uint32_t n, uint32_t C, uint32_t S, int32_t neighbours)
{
    kn_build_params_t p;
    kn_index_t a, b;
    size_t stride = d + 8, elems = (size_t)n * stride;
    cm_fp16_t *k = xc_half(elems, 1.0f), *v = xc_half(elems, 1.0f);
    void *dk = xc_dev(k, elems * sizeof(cm_fp16_t)), *dv = xc_dev(v, elems * sizeof(cm_fp16_t));
    int fails = 0;

    kn_build_params_default(&p);
    p.final_neighbours = neighbours;
    kn_index_init(&a, d);
    assert_int_equal(kn_ops_cuda()->index_build(&p, k, v, stride, n, 7, C, S, &a), RI_OK);
    for (int run = 0; run < 2; run++) {
        kn_index_init(&b, d);
        assert_int_equal(kn_ops_cuda()->index_build(&p, dk, dv, stride, n, 7, C, S, &b), RI_OK);
        if (b.n_clusters != a.n_clusters || b.n_tokens != a.n_tokens ||
            memcmp(a.sizes, b.sizes, C * sizeof(uint32_t)) != 0 ||
            memcmp(a.offsets, b.offsets, (C + 1) * sizeof(uint32_t)) != 0 ||
            memcmp(a.perm, b.perm, n * sizeof(uint32_t)) != 0 || memcmp(a.centroids, b.centroids, (size_t)C * d) != 0 ||
            memcmp(a.cscale, b.cscale, (size_t)C * sizeof(float)) != 0 ||
            memcmp(a.vsum, b.vsum, (size_t)C * d * sizeof(float)) != 0) {
            fprintf(stderr, "FAIL cuda index_build d=%u n=%u C=%u S=%u: the build from device "
                    "memory (run %d) differs from the build from host memory\n", d, n, C, S, run);
            fails++;
        }
        kn_index_cleanup(&b);
    }
    kn_index_cleanup(&a);
    kn_cuda_free(dk);
    kn_cuda_free(dv);
    free(k);
    free(v);
    return fails;
}

/* quest_score over page bounds in device memory. */
static int xc_device_quest(uint32_t g, uint32_t d, size_t np)
{
    kn_shape_t grp = {g, 1, d, 0};
    float *q = xc_floats((size_t)g * d, 1.0f), *rs = malloc((np + 1) * sizeof(float));
    cm_fp16_t *mn = xc_half(np * d, 1.0f), *mx = malloc((np * d + 1) * sizeof(cm_fp16_t));
    xc_buf_t sc = xc_buf(np);
    void *dmn, *dmx;
    int fails = 0;
    for (size_t i = 0; i < np * d; i++)
        mx[i] = cm_f32_to_fp16(cm_fp16_to_f32(mn[i]) + fabsf(xc_gauss()));
    dmn = xc_dev(mn, np * d * sizeof(cm_fp16_t));
    dmx = xc_dev(mx, np * d * sizeof(cm_fp16_t));
    assert_int_equal(kn_ops_ref()->quest_score(&grp, q, mn, mx, np, rs), RI_OK);
    if (kn_ops_cuda()->quest_score(&grp, q, dmn, dmx, np, sc.p) != RI_OK)
        fails++;
    else
        fails += !xc_guards_ok(&sc, "cuda quest_score device bounds") ||
                 !xc_close("cuda quest_score device bounds", sc.p, rs, np, 2e-5);
    kn_cuda_free(dmn);
    kn_cuda_free(dmx);
    free(q);
    free(rs);
    free(mn);
    free(mx);
    xc_free(&sc);
    return fails;
}

static void test_device_resident_cuda(void **state)
{
    int fails = 0;
    fails += xc_device_decode(2, 4, 128, 8193, 1);
    fails += xc_device_decode(3, 3, 64, 1000, 0);
    fails += xc_device_decode(1, 5, 48, 113, 1);
    for (int i = 0; i < 3; i++) {
        fails += xc_device_pages(4, 128, 1 + xc_next() % 40);
        fails += xc_device_pages(3, 64, 1 + xc_next() % 40);
    }
    fails += xc_device_pages(8, 128, 0);
    fails += xc_device_index(4, 128, 1000, 18, 232);
    fails += xc_device_index(3, 64, 113, 2, 26);
    fails += xc_device_index(1, 48, 4096, 74, 950);
    xc_means = true;
    fails += xc_device_index(4, 128, 1000, 18, 232); /* with int8 means in device memory */
    xc_means = false;
    fails += xc_device_build(128, 1024, 64, 1, -1);   /* the decode-time update */
    fails += xc_device_build(64, 5000, 312, 3, 1);
    fails += xc_device_quest(4, 128, 1000);
    fails += xc_device_quest(3, 40, 37);
    assert_int_equal(fails, 0);
}

static void test_wave_step_cuda(void **state)
{
    kn_shape_t odd = {4, 1, 48, 0};
    kn_wave_head_t none = {0};
    const kn_ops_t *cu = kn_ops_cuda();
    float q[4 * 48] = {0}, o[4 * 48], l[4];
    int fails = 0;
    fails += xc_wave_step(cu, 8, 4, 128, 1000, 18, 232, 4, 64);  /* Llama-3-8B's heads */
    fails += xc_wave_step(cu, 3, 3, 64, 113, 2, 26, 4, 64);      /* SmolLM2's */
    fails += xc_wave_step(cu, 1, 4, 256, 300, 9, 40, 4, 16);     /* Gemma 3's d */
    fails += xc_wave_step(cu, 3, 8, 128, 5, 4, 4, 1, 3);         /* more than there is; the last head empty */
    fails += xc_wave_step(cu, 1, 1, 64, 8192, 147, 1900, 4, 64); /* 128K tokens' worth of clusters */
    fails += xc_wave_step(cu, 2, 5, 64, 50, 0, 10, 0, 7);        /* nothing retrieved, no sinks */
    fails += xc_wave_step(cu, 2, 2, 128, 40, 12, 0, 4, 0);       /* nothing estimated, no window */
    xc_wave_ties = true;  /* equal scores across both cuts: the counts must still be exact */
    fails += xc_wave_step(cu, 2, 4, 128, 3000, 147, 1000, 4, 64);
    fails += xc_wave_step(cu, 1, 3, 64, 97, 7, 30, 4, 64);
    xc_wave_ties = false;
    /* a head_dim the step does not take: refused, nothing written */
    memset(o, 0, sizeof(o));
    assert_false(cu->supports(KN_OP_WAVE_STEP, &odd, KN_DTYPE_F16));
    assert_int_equal(cu->wave_step(&odd, q, &none, 1, 1, o, l, NULL, NULL), RI_ERR_INVALID);
    assert_int_equal(o[0], 0.0f);
    assert_int_equal(fails, 0);
}

static void test_rank_estimate_fused_cuda(void **state)
{
    int fails = 0;
    fails += xc_fused_cuda(4, 128, 1000, 18, 232);
    fails += xc_fused_cuda(3, 64, 113, 2, 26);
    fails += xc_fused_cuda(8, 128, 37, 1, 0);
    fails += xc_fused_cuda(1, 48, 300, 5, 70);
    fails += xc_fused_cuda(4, 128, 8192, 147, 1900);  /* 128K tokens' worth of clusters */
    fails += xc_fused_cuda(1, 64, 50, 60, 60);        /* asks for more than there is */
    xc_means = true;                                  /* an index with int8 means: the estimation reads them */
    fails += xc_fused_cuda(4, 128, 1000, 18, 232);
    fails += xc_fused_cuda(3, 40, 300, 5, 70);
    xc_means = false;
    assert_int_equal(fails, 0);
}
#endif

/* Partial selection: the first k ids are the k best by (score desc, id asc),
 * with heavy ties, -inf and +inf among the scores. */
static void test_select_top(void **state)
{
    for (int trial = 0; trial < 300; trial++) {
        size_t n = 1 + xc_next() % 3000, k = xc_next() % (n + 2);
        float *sc = malloc(n * sizeof(float));
        uint32_t *ids = malloc(n * sizeof(uint32_t));
        uint8_t *in = calloc(n, 1);
        int mode = (int)(xc_next() % 3);
        for (size_t i = 0; i < n; i++) {
            sc[i] = mode == 0 ? xc_unif() : (float)(xc_next() % 5);
            if (xc_next() % 50 == 0)
                sc[i] = (xc_next() & 1) ? INFINITY : -INFINITY;
            ids[i] = (uint32_t)(n - 1 - i);  /* not in id order */
        }
        kn_select_top(ids, n, k, sc);
        for (size_t i = 0; i < n; i++) {
            assert_true(ids[i] < n);
            assert_false(in[ids[i]]);
            in[ids[i]] = 1;
        }
        if (k > 0 && k < n) {
            /* the worst of the front must beat the best of the rest */
            uint32_t a = ids[0], b = ids[k];
            for (size_t i = 1; i < k; i++)
                if (sc[ids[i]] < sc[a] || (sc[ids[i]] == sc[a] && ids[i] > a))
                    a = ids[i];
            for (size_t j = k + 1; j < n; j++)
                if (sc[ids[j]] > sc[b] || (sc[ids[j]] == sc[b] && ids[j] < b))
                    b = ids[j];
            assert_true(sc[a] > sc[b] || (sc[a] == sc[b] && a < b));
        }
        free(sc);
        free(ids);
        free(in);
    }
}

/* ---- the tester is tested: a corrupted backend must be caught ---- */

static ri_status_t xc_bad_decode(const kn_shape_t *shape, size_t n_seq, const float *q,
                                 const kn_kv_view_t *kv, float *out, float *lse)
{
    ri_status_t st = kn_ops_cpu()->attn_decode(shape, n_seq, q, kv, out, lse);
    out[shape->head_dim + 3] += 0.05f;  /* one value slightly off */
    return st;
}

static ri_status_t xc_overrun_decode(const kn_shape_t *shape, size_t n_seq, const float *q,
                                     const kn_kv_view_t *kv, float *out, float *lse)
{
    ri_status_t st = kn_ops_cpu()->attn_decode(shape, n_seq, q, kv, out, lse);
    out[n_seq * shape->n_q_heads * shape->head_dim] = 0.0f;  /* one past the end */
    return st;
}

static ri_status_t xc_nan_pages(const kn_shape_t *grp, const float *q, const kn_page_t *pages,
                                size_t n_pages, float *o, float *lse)
{
    ri_status_t st = kn_ops_cpu()->attn_pages(grp, q, pages, n_pages, o, lse);
    o[0] = NAN;
    return st;
}

static void test_corrupted_backend_is_caught(void **state)
{
    kn_ops_t bad = *kn_ops_cpu();
    size_t n = 113;
    bad.name = "corrupted";
    bad.attn_decode = xc_bad_decode;
    bad.attn_pages = xc_nan_pages;
    xc_quiet = true;
    assert_true(xc_attn_decode(&bad, 2, 4, 64, &n, 1, 0) > 0);
    assert_true(xc_attn_pages(&bad, 4, 64, 3, 5) > 0);
    bad.attn_decode = xc_overrun_decode;
    assert_true(xc_attn_decode(&bad, 2, 4, 64, &n, 1, 1) > 0);
    xc_quiet = false;
    /* and the genuine backend passes the same cases */
    assert_int_equal(xc_attn_decode(kn_ops_cpu(), 2, 4, 64, &n, 1, 0), 0);
}

/* ---- coverage: "supported and checked" apart from "not supported" ---- */

static const kn_op_t xc_ops_checked[] = {KN_OP_ATTN_DECODE, KN_OP_ATTN_PAGES, KN_OP_RANK,
                                         KN_OP_ESTIMATE,    KN_OP_MERGE,      KN_OP_QUEST_SCORE,
                                         KN_OP_INDEX_BUILD, KN_OP_WAVE_STEP};

/* Print the backend's counts; false when it checked no case of some op. */
static bool xc_coverage_ok(const kn_ops_t *ops, bool print)
{
    xc_count_t *c = xc_count_of(ops);
    bool ok = true;
    for (size_t i = 0; i < sizeof(xc_ops_checked) / sizeof(xc_ops_checked[0]); i++) {
        kn_op_t op = xc_ops_checked[i];
        if (print)
            printf("  %-8s %-12s checked %4u  not supported %3u%s\n", ops->name, kn_op_name(op),
                   c->checked[op], c->unsupported[op], c->checked[op] ? "" : "  <- NOTHING CHECKED");
        ok = ok && c->checked[op] > 0;
    }
    return ok;
}

static bool xc_decline(kn_op_t op, const kn_shape_t *shape, kn_dtype_t dtype)
{
    (void)op;
    (void)shape;
    (void)dtype;
    return false;
}

/* The tester is tested: a backend that declines every shape gets every case
 * counted as not supported, none as checked, and fails the coverage check
 * (the mutation "an unsupported case counts as a pass" fails here). */
static void test_declining_backend_is_caught(void **state)
{
    kn_ops_t bad = *kn_ops_cpu();
    size_t n = 113;
    xc_count_t *c;
    bad.name = "declining";
    bad.supports = xc_decline;
    xc_quiet = true;
    assert_int_equal(xc_attn_decode(&bad, 2, 4, 64, &n, 1, 0), 0);
    assert_int_equal(xc_attn_pages(&bad, 4, 64, 3, 5), 0);
    assert_int_equal(xc_rank(&bad, 4, 128, 100, 2, 10), 0);
    assert_int_equal(xc_estimate(&bad, 4, 128, 100, 10), 0);
    assert_int_equal(xc_merge(&bad, 4, 128, 2), 0);
    assert_int_equal(xc_quest(&bad, 4, 128, 10), 0);
    assert_int_equal(xc_index_build(&bad, 64, 100, 8, 1, 1, -1), 0);
    assert_int_equal(xc_wave_step(&bad, 2, 4, 64, 50, 2, 10, 4, 16), 0);
    xc_quiet = false;
    c = xc_count_of(&bad);
    for (size_t i = 0; i < sizeof(xc_ops_checked) / sizeof(xc_ops_checked[0]); i++) {
        assert_int_equal(c->checked[xc_ops_checked[i]], 0);
        assert_int_equal(c->unsupported[xc_ops_checked[i]], 1);
    }
    assert_false(xc_coverage_ok(&bad, false));
}

/* Runs last: every backend under test checked at least one case of every
 * op (a backend that declines all its shapes checked nothing). */
static void test_every_op_checked(void **state)
{
    const kn_ops_t *ops[4];
    size_t n_ops = kn_ops_list(ops, 4);
    bool ok = true;
    printf("cases per backend and op (not supported = declined by supports(), not a pass):\n");
    for (size_t b = 1; b < n_ops; b++)
        ok = xc_coverage_ok(ops[b], true) && ok;
    assert_true(ok);
}

/* Unsupported shapes fall back to the reference through the wrappers. */
static void test_wrapper_fallback(void **state)
{
    kn_shape_t sh = {65, 1, 32, 0};  /* group of 65: beyond the cpu backend */
    size_t n = 40;
    float *q = xc_floats(65 * 32, 1.0f), *o = malloc(65 * 32 * sizeof(float));
    float *r = malloc(65 * 32 * sizeof(float)), l[65], rl[65];
    cm_fp16_t *k = xc_half(n * 32, 1.0f), *v = xc_half(n * 32, 1.0f);
    kn_kv_view_t kv = {k, v, n, 32, 32};
    assert_false(kn_ops_cpu()->supports(KN_OP_ATTN_DECODE, &sh, KN_DTYPE_F16));
    assert_int_equal(kn_attn_decode(kn_ops_cpu(), &sh, 1, q, &kv, o, l), RI_OK);
    assert_int_equal(kn_ops_ref()->attn_decode(&sh, 1, q, &kv, r, rl), RI_OK);
    assert_true(xc_close("fallback", o, r, 65 * 32, 1e-6));
    sh.n_q_heads = 7;
    sh.n_kv_heads = 2;  /* not a multiple: rejected */
    assert_int_equal(kn_attn_decode(NULL, &sh, 1, q, &kv, o, l), RI_ERR_INVALID);
    free(q);
    free(o);
    free(r);
    free(k);
    free(v);
}

int main(int argc, char **argv)
{
    const char *env = getenv("RI_TEST_SEED");
    const kn_ops_t *ops[4];
    size_t n_ops = kn_ops_list(ops, 4);
    uint64_t seed = env ? strtoull(env, NULL, 0)
                        : ((uint64_t)time(NULL) << 20) ^ (uint64_t)getpid() ^ (uint64_t)clock();
    xc_rng = seed;
    xc_slow = argc > 1 && strcmp(argv[1], "--slow") == 0;
#ifdef KN_XC_CUDA
    if (kn_cuda_init() != RI_OK) {
        printf("no CUDA device: skipped\n");
        return 77;
    }
    n_ops = kn_ops_list(ops, 4);
#endif
    printf("kernels cross-check: seed %llu (RI_TEST_SEED=%llu reproduces), cpu isa %s, backends:",
           (unsigned long long)seed, (unsigned long long)seed, kn_cpu_isa());
    for (size_t i = 0; i < n_ops; i++)
        printf(" %s", ops[i]->name);
    printf("\n");
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_attn_decode),
        cmocka_unit_test(test_attn_pages),
        cmocka_unit_test(test_rank),
        cmocka_unit_test(test_estimate),
        cmocka_unit_test(test_rank_estimate_fused),
#ifdef KN_XC_CUDA
        cmocka_unit_test(test_rank_estimate_fused_cuda),
        cmocka_unit_test(test_device_resident_cuda),
        cmocka_unit_test(test_wave_step_cuda),
#endif
        cmocka_unit_test(test_estimate_means),
        cmocka_unit_test(test_wave_step),
        cmocka_unit_test(test_select_top),
        cmocka_unit_test(test_merge),
        cmocka_unit_test(test_quest_score),
        cmocka_unit_test(test_index_build),
        cmocka_unit_test(test_corrupted_backend_is_caught),
        cmocka_unit_test(test_wrapper_fallback),
        cmocka_unit_test(test_declining_backend_is_caught),
        cmocka_unit_test(test_every_op_checked),
        /* last, and only in the slow run: registered or not, never skip()ped */
        cmocka_unit_test(test_attn_decode_long),
    };
    size_t n_tests = sizeof(tests) / sizeof(tests[0]) - (xc_slow ? 0 : 1);
    if (!xc_slow)
        printf("test_attn_decode_long (n = 131072) runs only with --slow\n");
    return _cmocka_run_group_tests("test_kn_xcheck", tests, n_tests, NULL, NULL);
}
