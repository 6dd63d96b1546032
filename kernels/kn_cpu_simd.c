/*
 * AVX2+FMA+F16C kernels of the CPU backend (see kn_cpu_simd.h).  Every
 * function carries a target attribute, so the file builds without -mavx2 and
 * the rest of the binary stays portable; callers check the CPU first.
 *
 * The group size G and the rows per step R are compile-time constants inside
 * (always_inline helpers called from a switch), so that the per-head
 * accumulators live in registers.  The FMA latency (4 cycles, 2 per cycle)
 * needs ~8 independent chains: R rows of G heads, or CW chunks of V per pass.
 */
#include <immintrin.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "common/cm_alloc.h"
#include "common/cm_status.h"
#include "kernels/kn_cpu_simd.h"
#include "kernels/kn_internal.h"

#define KN_T __attribute__((target("avx2,fma,f16c")))
#define KN_TI static inline __attribute__((always_inline, target("avx2,fma,f16c")))

KN_TI __m256 kn_load_h(const cm_fp16_t *p)
{
    return _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)p));
}

/* 8 int8 widened to fp32 (exact: every int8 is an fp32) */
KN_TI __m256 kn_load_q(const int8_t *p)
{
    return _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i *)p)));
}

KN_TI float kn_hsum(__m256 v)
{
    __m128 a = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    a = _mm_add_ps(a, _mm_movehl_ps(a, a));
    a = _mm_add_ss(a, _mm_movehdup_ps(a));
    return _mm_cvtss_f32(a);
}

/* exp(x), relative error ~2e-7 (Cephes polynomial); exactly 0 below -87. */
KN_TI __m256 kn_exp256(__m256 x)
{
    const __m256 lo = _mm256_set1_ps(-87.0f), hi = _mm256_set1_ps(88.3f);
    __m256 keep = _mm256_cmp_ps(x, lo, _CMP_GT_OQ);
    __m256 xc = _mm256_min_ps(_mm256_max_ps(x, lo), hi);
    __m256 fx = _mm256_round_ps(_mm256_mul_ps(xc, _mm256_set1_ps(1.44269504088896341f)),
                                _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m256 r = _mm256_fnmadd_ps(fx, _mm256_set1_ps(0.693359375f), xc);
    r = _mm256_fnmadd_ps(fx, _mm256_set1_ps(-2.12194440e-4f), r);
    __m256 y = _mm256_set1_ps(1.9875691500E-4f);
    y = _mm256_fmadd_ps(y, r, _mm256_set1_ps(1.3981999507E-3f));
    y = _mm256_fmadd_ps(y, r, _mm256_set1_ps(8.3334519073E-3f));
    y = _mm256_fmadd_ps(y, r, _mm256_set1_ps(4.1665795894E-2f));
    y = _mm256_fmadd_ps(y, r, _mm256_set1_ps(1.6666665459E-1f));
    y = _mm256_fmadd_ps(y, r, _mm256_set1_ps(5.0000001201E-1f));
    y = _mm256_fmadd_ps(y, _mm256_mul_ps(r, r), _mm256_add_ps(r, _mm256_set1_ps(1.0f)));
    __m256i e = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(fx), _mm256_set1_epi32(127)), 23);
    return _mm256_and_ps(_mm256_mul_ps(y, _mm256_castsi256_ps(e)), keep);
}

/* out[h*os + r] = the total of acc[h*R + r], times sc[r*ss] when sc is
 * not NULL (an int8 row's scale: once on the finished dot, as kn_cq_dot). */
KN_TI void kn_rows_store(const __m256 *acc, float *out, size_t os, const float *sc, size_t ss, const int G, const int R)
{
    if (G * R == 8) {
        /* reduce the 8 accumulators at once: 6 hadds and a lane swap instead
         * of 8 separate horizontal sums */
        __m256 h01 = _mm256_hadd_ps(acc[0], acc[1]), h23 = _mm256_hadd_ps(acc[2], acc[3]);
        __m256 h45 = _mm256_hadd_ps(acc[4], acc[5]), h67 = _mm256_hadd_ps(acc[6], acc[7]);
        __m256 a = _mm256_hadd_ps(h01, h23), b = _mm256_hadd_ps(h45, h67);
        __m256 sum = _mm256_add_ps(_mm256_permute2f128_ps(a, b, 0x20), _mm256_permute2f128_ps(a, b, 0x31));
        float tmp[8] __attribute__((aligned(32)));
        _mm256_store_ps(tmp, sum); /* tmp[i] = total of acc[i] */
#pragma GCC unroll 8
        for (int h = 0; h < G; h++)
#pragma GCC unroll 4
            for (int r = 0; r < R; r++)
                out[(size_t)h * os + r] = sc ? tmp[h * R + r] * sc[(size_t)r * ss] : tmp[h * R + r];
        return;
    }
#pragma GCC unroll 8
    for (int h = 0; h < G; h++)
#pragma GCC unroll 4
        for (int r = 0; r < R; r++)
            out[(size_t)h * os + r] = sc ? kn_hsum(acc[h * R + r]) * sc[(size_t)r * ss] : kn_hsum(acc[h * R + r]);
}

/* Scores of R consecutive rows for G heads: out[h*os + r] = q_h . row_r. */
KN_TI void kn_rows_scores(const float *q, uint32_t d, const cm_fp16_t *k, size_t stride,
                          float *out, size_t os, const int G, const int R)
{
    __m256 acc[KN_GMAX * 4];
#pragma GCC unroll 32
    for (int a = 0; a < G * R; a++)
        acc[a] = _mm256_setzero_ps();
    for (uint32_t i = 0; i < d; i += 8) {
        __m256 kv[4];
#pragma GCC unroll 4
        for (int r = 0; r < R; r++)
            kv[r] = kn_load_h(k + (size_t)r * stride + i);
#pragma GCC unroll 8
        for (int h = 0; h < G; h++) {
            __m256 qv = _mm256_loadu_ps(q + (size_t)h * d + i);
#pragma GCC unroll 4
            for (int r = 0; r < R; r++)
                acc[h * R + r] = _mm256_fmadd_ps(qv, kv[r], acc[h * R + r]);
        }
    }
    kn_rows_store(acc, out, os, NULL, 0, G, R);
}

/* The same over R int8 rows (row r at k + r*stride, its scale at
 * sc[r*ss]): out[h*os + r] = sc_r * (q_h . row_r), the int8 widened to
 * fp32 as it is loaded (the centroids' rank). */
KN_TI void kn_rows_scores_q(const float *q, uint32_t d, const int8_t *k, size_t stride, const float *sc, size_t ss,
                            float *out, size_t os, const int G, const int R)
{
    __m256 acc[KN_GMAX * 4];
#pragma GCC unroll 32
    for (int a = 0; a < G * R; a++)
        acc[a] = _mm256_setzero_ps();
    for (uint32_t i = 0; i < d; i += 8) {
        __m256 kv[4];
#pragma GCC unroll 4
        for (int r = 0; r < R; r++)
            kv[r] = kn_load_q(k + (size_t)r * stride + i);
#pragma GCC unroll 8
        for (int h = 0; h < G; h++) {
            __m256 qv = _mm256_loadu_ps(q + (size_t)h * d + i);
#pragma GCC unroll 4
            for (int r = 0; r < R; r++)
                acc[h * R + r] = _mm256_fmadd_ps(qv, kv[r], acc[h * R + r]);
        }
    }
    kn_rows_store(acc, out, os, sc, ss, G, R);
}

/* Prefetch the cache lines of row t of a and b if t < n_pf.  b == NULL: a
 * is a stream read far ahead (the centroid scan), prefetched into L2 only
 * (see KN_SCAN_PD). */
KN_TI void kn_prefetch_rows(const cm_fp16_t *a, const cm_fp16_t *b, size_t stride, size_t t,
                            size_t n_pf, uint32_t d)
{
    if (t >= n_pf)
        return;
    for (uint32_t i = 0; i < d; i += 32) {
        if (b == NULL) {
            _mm_prefetch((const char *)(a + t * stride + i), _MM_HINT_T1);
            continue;
        }
        _mm_prefetch((const char *)(a + t * stride + i), _MM_HINT_T0);
        _mm_prefetch((const char *)(b + t * stride + i), _MM_HINT_T0);
    }
}

/* Scores of n rows; meanwhile prefetches rows of pf_a/pf_b (n_pf of them) so
 * that the next memory-bound phase finds them in cache. */
KN_TI void kn_scores_g(const float *q, uint32_t d, const cm_fp16_t *k, size_t stride, size_t n,
                       float *out, size_t os, const cm_fp16_t *pf_a, const cm_fp16_t *pf_b,
                       size_t n_pf, const int G)
{
    const int R = G >= 5 ? 1 : (G >= 3 ? 2 : 4);
    size_t t = 0;
    for (; t + R <= n; t += R) {
#pragma GCC unroll 4
        for (int r = 0; r < R; r++)
            kn_prefetch_rows(pf_a, pf_b, stride, t + r, n_pf, d);
        kn_rows_scores(q, d, k + t * stride, stride, out + t, os, G, R);
    }
    for (; t < n; t++) {
        kn_prefetch_rows(pf_a, pf_b, stride, t, n_pf, d);
        kn_rows_scores(q, d, k + t * stride, stride, out + t, os, G, 1);
    }
}

/* V accumulation of T rows into acc [G][d] with weights p [G][KN_BLK]. */
KN_TI void kn_accum_v(float *acc, uint32_t d, const cm_fp16_t *v, size_t stride, size_t T,
                      const float *p, const int G)
{
    const int CW = G <= 2 ? 4 : (G <= 4 ? 2 : 1);
    for (uint32_t c = 0; c < d; c += 8 * CW) {
        __m256 a[KN_GMAX * 2];
#pragma GCC unroll 8
        for (int h = 0; h < G; h++)
#pragma GCC unroll 4
            for (int w = 0; w < CW; w++)
                a[h * CW + w] = _mm256_load_ps(acc + (size_t)h * d + c + 8 * w);
        for (size_t t = 0; t < T; t++) {
            __m256 vv[4];
#pragma GCC unroll 4
            for (int w = 0; w < CW; w++)
                vv[w] = kn_load_h(v + t * stride + c + 8 * w);
#pragma GCC unroll 8
            for (int h = 0; h < G; h++) {
                __m256 pb = _mm256_broadcast_ss(p + (size_t)h * KN_BLK + t);
#pragma GCC unroll 4
                for (int w = 0; w < CW; w++)
                    a[h * CW + w] = _mm256_fmadd_ps(pb, vv[w], a[h * CW + w]);
            }
        }
#pragma GCC unroll 8
        for (int h = 0; h < G; h++)
#pragma GCC unroll 4
            for (int w = 0; w < CW; w++)
                _mm256_store_ps(acc + (size_t)h * d + c + 8 * w, a[h * CW + w]);
    }
}

/* The online-softmax update of one block of T scored rows, sb [G][KN_BLK]
 * (rewritten with the weights exp(s - m)). */
KN_TI void kn_fa_block_softmax(kn_fa_state_t *fs, float *sb, size_t T, const int G)
{
    uint32_t d = fs->d;
    size_t T8 = (T + 7) & ~(size_t)7;
#pragma GCC unroll 8
    for (int h = 0; h < G; h++) {
        float *s = sb + (size_t)h * KN_BLK, bm, mn;
        __m256 mx = _mm256_set1_ps(-INFINITY), sum = _mm256_setzero_ps();
        for (size_t t = T; t < T8; t++)
            s[t] = -INFINITY;
        for (size_t t = 0; t < T8; t += 8)
            mx = _mm256_max_ps(mx, _mm256_load_ps(s + t));
        {
            __m128 m4 = _mm_max_ps(_mm256_castps256_ps128(mx), _mm256_extractf128_ps(mx, 1));
            m4 = _mm_max_ps(m4, _mm_movehl_ps(m4, m4));
            m4 = _mm_max_ss(m4, _mm_movehdup_ps(m4));
            bm = _mm_cvtss_f32(m4);
        }
        mn = fs->m[h] > bm ? fs->m[h] : bm;
        if (mn > fs->m[h]) {
            float corr = fs->m[h] == -INFINITY ? 0.0f : expf(fs->m[h] - mn);
            __m256 cv = _mm256_set1_ps(corr);
            float *ah = fs->acc + (size_t)h * d;
            for (uint32_t i = 0; i < d; i += 8)
                _mm256_store_ps(ah + i, _mm256_mul_ps(_mm256_load_ps(ah + i), cv));
            fs->l[h] *= corr;
            fs->m[h] = mn;
        }
        {
            __m256 mv = _mm256_set1_ps(mn);
            for (size_t t = 0; t < T8; t += 8) {
                __m256 e = kn_exp256(_mm256_sub_ps(_mm256_load_ps(s + t), mv));
                _mm256_store_ps(s + t, e);
                sum = _mm256_add_ps(sum, e);
            }
        }
        fs->l[h] += kn_hsum(sum);
    }
}

KN_TI void kn_fa_rows_g(kn_fa_state_t *fs, const cm_fp16_t *k, const cm_fp16_t *v, size_t stride,
                        size_t n, const int G)
{
    uint32_t d = fs->d;
    float sb[KN_GMAX * KN_BLK] __attribute__((aligned(32)));
    for (size_t t0 = 0; t0 < n; t0 += KN_BLK) {
        size_t T = CM_MIN((size_t)KN_BLK, n - t0);
        /* while scoring this block, fetch its V rows and the next block's K rows */
        size_t Tn = t0 + KN_BLK < n ? CM_MIN((size_t)KN_BLK, n - t0 - KN_BLK) : 0;
        /* (prefetching past the next block's end cannot fault, only waste a slot) */
        kn_scores_g(fs->q, d, k + t0 * stride, stride, T, sb, KN_BLK, v + t0 * stride,
                    Tn ? k + (t0 + KN_BLK) * stride : v + t0 * stride, T, G);
        kn_fa_block_softmax(fs, sb, T, G);
        kn_accum_v(fs->acc, d, v + t0 * stride, stride, T, sb, G);
    }
}

/* A run of rows of one page inside a block. */
typedef struct kn_seg {
    const cm_fp16_t *k, *v;
    size_t stride, n;
} kn_seg_t;

/* The segments of the next KN_BLK rows from page *p, row *r on (advancing
 * the cursor); returns their count, *T_p their rows. */
KN_TI size_t kn_block_segs(const kn_page_t *pages, size_t np, size_t *p, size_t *r, kn_seg_t *seg,
                           size_t *T_p)
{
    size_t ns = 0, T = 0;
    while (*p < np && T < KN_BLK) {
        const kn_page_t *pg = &pages[*p];
        size_t take = CM_MIN((size_t)pg->n_tokens - *r, (size_t)KN_BLK - T);
        if (take > 0)
            seg[ns++] = (kn_seg_t){pg->k + *r * pg->stride, pg->v + *r * pg->stride, pg->stride, take};
        T += take;
        *r += take;
        if (*r >= pg->n_tokens) {
            (*p)++;
            *r = 0;
        }
    }
    *T_p = T;
    return ns;
}

/* Exact attention over a page list in blocks of KN_BLK rows that span page
 * boundaries: a retrieved cluster is 8-16 rows, and one softmax update per
 * page cost as much as its arithmetic.  While a block's segments are
 * scored, each prefetches its own V rows and the K rows of the segment in
 * the same place of the next block, so the misses of the scattered pages
 * are issued a block ahead and spread over the scoring. */
KN_TI void kn_fa_pages_g(kn_fa_state_t *fs, const kn_page_t *pages, size_t np, const int G)
{
    uint32_t d = fs->d;
    float sb[KN_GMAX * KN_BLK] __attribute__((aligned(32)));
    kn_seg_t cur[KN_BLK], nxt[KN_BLK];
    size_t p = 0, r = 0, T, Tn, ns, nn;

    ns = kn_block_segs(pages, np, &p, &r, cur, &T);
    while (ns > 0) {
        nn = kn_block_segs(pages, np, &p, &r, nxt, &Tn);
        size_t off = 0;
        for (size_t i = 0; i < ns; i++) {
            const cm_fp16_t *pf = i < nn && nxt[i].stride == cur[i].stride ? nxt[i].k : cur[i].v;
            kn_scores_g(fs->q, d, cur[i].k, cur[i].stride, cur[i].n, sb + off, KN_BLK, cur[i].v, pf,
                        cur[i].n, G);
            off += cur[i].n;
        }
        kn_fa_block_softmax(fs, sb, T, G);
        off = 0;
        for (size_t i = 0; i < ns; i++) {
            kn_accum_v(fs->acc, d, cur[i].v, cur[i].stride, cur[i].n, sb + off, G);
            off += cur[i].n;
        }
        memcpy(cur, nxt, nn * sizeof(kn_seg_t));
        ns = nn;
        T = Tn;
    }
}

KN_T void kn_fa_pages_avx2(kn_fa_state_t *fs, const kn_page_t *pages, size_t np)
{
    switch (fs->g) {
    case 1: kn_fa_pages_g(fs, pages, np, 1); break;
    case 2: kn_fa_pages_g(fs, pages, np, 2); break;
    case 3: kn_fa_pages_g(fs, pages, np, 3); break;
    case 4: kn_fa_pages_g(fs, pages, np, 4); break;
    case 5: kn_fa_pages_g(fs, pages, np, 5); break;
    case 6: kn_fa_pages_g(fs, pages, np, 6); break;
    case 7: kn_fa_pages_g(fs, pages, np, 7); break;
    default: kn_fa_pages_g(fs, pages, np, 8); break;
    }
}

KN_T void kn_fa_rows_avx2(kn_fa_state_t *fs, const cm_fp16_t *k, const cm_fp16_t *v, size_t stride,
                          size_t n)
{
    switch (fs->g) {
    case 1: kn_fa_rows_g(fs, k, v, stride, n, 1); break;
    case 2: kn_fa_rows_g(fs, k, v, stride, n, 2); break;
    case 3: kn_fa_rows_g(fs, k, v, stride, n, 3); break;
    case 4: kn_fa_rows_g(fs, k, v, stride, n, 4); break;
    case 5: kn_fa_rows_g(fs, k, v, stride, n, 5); break;
    case 6: kn_fa_rows_g(fs, k, v, stride, n, 6); break;
    case 7: kn_fa_rows_g(fs, k, v, stride, n, 7); break;
    default: kn_fa_rows_g(fs, k, v, stride, n, 8); break;
    }
}

/* Rows read ahead by the centroid scan: the hardware prefetcher stops at
 * every 4 KiB page, the rows do not (32 rows of d = 128 are 8 KiB).  Far
 * prefetches (this scan, the estimation's means) go to L2 (T1), so that
 * they do not hold the L1 miss buffers the loads need: 4% faster per
 * 128K step than T0 (one thread, 201 interleaved pairs). */
#define KN_SCAN_PD 32

KN_T void kn_scores_avx2(const float *qs, uint32_t g, uint32_t d, const cm_fp16_t *rows,
                         size_t stride, size_t n, float *out, size_t out_stride)
{
    /* prefetching past the end cannot fault, only waste a slot */
    const cm_fp16_t *pf = rows + KN_SCAN_PD * stride;
    switch (g) {
    case 1: kn_scores_g(qs, d, rows, stride, n, out, out_stride, pf, NULL, n, 1); break;
    case 2: kn_scores_g(qs, d, rows, stride, n, out, out_stride, pf, NULL, n, 2); break;
    case 3: kn_scores_g(qs, d, rows, stride, n, out, out_stride, pf, NULL, n, 3); break;
    case 4: kn_scores_g(qs, d, rows, stride, n, out, out_stride, pf, NULL, n, 4); break;
    case 5: kn_scores_g(qs, d, rows, stride, n, out, out_stride, pf, NULL, n, 5); break;
    case 6: kn_scores_g(qs, d, rows, stride, n, out, out_stride, pf, NULL, n, 6); break;
    case 7: kn_scores_g(qs, d, rows, stride, n, out, out_stride, pf, NULL, n, 7); break;
    default: kn_scores_g(qs, d, rows, stride, n, out, out_stride, pf, NULL, n, 8); break;
    }
}

/* The centroid scan over int8 rows (d bytes each, contiguous): row t + KN_SCAN_PD
 * prefetched into L2 as the fp16 scan does. */
KN_TI void kn_scores_q_g(const float *qs, uint32_t d, const int8_t *c8, const float *sc, size_t n, float *out,
                         size_t os, const int G)
{
    const int R = G >= 5 ? 1 : (G >= 3 ? 2 : 4);
    size_t t = 0;
    for (; t + R <= n; t += R) {
#pragma GCC unroll 4
        for (int r = 0; r < R; r++)
            for (uint32_t i = 0; i < d; i += 64) /* past the end: a wasted slot, never a fault */
                _mm_prefetch((const char *)(c8 + (t + r + KN_SCAN_PD) * d + i), _MM_HINT_T1);
        kn_rows_scores_q(qs, d, c8 + t * d, d, sc + t, 1, out + t, os, G, R);
    }
    for (; t < n; t++)
        kn_rows_scores_q(qs, d, c8 + t * d, d, sc + t, 1, out + t, os, G, 1);
}

KN_T void kn_scores_q_avx2(const float *qs, uint32_t g, uint32_t d, const int8_t *c8, const float *sc, size_t n,
                           float *out, size_t os)
{
    switch (g) {
    case 1:
        kn_scores_q_g(qs, d, c8, sc, n, out, os, 1);
        break;
    case 2:
        kn_scores_q_g(qs, d, c8, sc, n, out, os, 2);
        break;
    case 3:
        kn_scores_q_g(qs, d, c8, sc, n, out, os, 3);
        break;
    case 4:
        kn_scores_q_g(qs, d, c8, sc, n, out, os, 4);
        break;
    case 5:
        kn_scores_q_g(qs, d, c8, sc, n, out, os, 5);
        break;
    case 6:
        kn_scores_q_g(qs, d, c8, sc, n, out, os, 6);
        break;
    case 7:
        kn_scores_q_g(qs, d, c8, sc, n, out, os, 7);
        break;
    default:
        kn_scores_q_g(qs, d, c8, sc, n, out, os, 8);
        break;
    }
}

/* Scores of rows c8 + ids[e]*d (ascending ids) two at a time: the pair is
 * passed as rows 0 and 1 with the stride (and scale stride) between them. */
KN_TI void kn_scores_gather_q_g(const float *qs, uint32_t d, const int8_t *c8, const float *sc, const uint32_t *ids,
                                size_t n, float *out, size_t os, const int G)
{
    size_t e = 0;
    if (G <= 4) {
        for (; e + 2 <= n; e += 2) {
            size_t step = (size_t)(ids[e + 1] - ids[e]);
            if (ids[e + 1] < ids[e])
                break; /* not ascending: finish one by one */
            kn_rows_scores_q(qs, d, c8 + (size_t)ids[e] * d, step * d, sc + ids[e], step, out + e, os, G, 2);
        }
    }
    for (; e < n; e++)
        kn_rows_scores_q(qs, d, c8 + (size_t)ids[e] * d, d, sc + ids[e], 1, out + e, os, G, 1);
}

KN_T void kn_scores_gather_q_avx2(const float *qs, uint32_t g, uint32_t d, const int8_t *c8, const float *sc,
                                  const uint32_t *ids, size_t n, float *out, size_t os)
{
    switch (g) {
    case 1:
        kn_scores_gather_q_g(qs, d, c8, sc, ids, n, out, os, 1);
        break;
    case 2:
        kn_scores_gather_q_g(qs, d, c8, sc, ids, n, out, os, 2);
        break;
    case 3:
        kn_scores_gather_q_g(qs, d, c8, sc, ids, n, out, os, 3);
        break;
    case 4:
        kn_scores_gather_q_g(qs, d, c8, sc, ids, n, out, os, 4);
        break;
    case 5:
        kn_scores_gather_q_g(qs, d, c8, sc, ids, n, out, os, 5);
        break;
    case 6:
        kn_scores_gather_q_g(qs, d, c8, sc, ids, n, out, os, 6);
        break;
    case 7:
        kn_scores_gather_q_g(qs, d, c8, sc, ids, n, out, os, 7);
        break;
    default:
        kn_scores_gather_q_g(qs, d, c8, sc, ids, n, out, os, 8);
        break;
    }
}

KN_T float kn_exp_sub_sum_avx2(float *x, size_t n, float m)
{
    __m256 mv = _mm256_set1_ps(m), sum = _mm256_setzero_ps();
    size_t i = 0;
    float tail = 0.0f;
    for (; i + 8 <= n; i += 8) {
        __m256 e = kn_exp256(_mm256_sub_ps(_mm256_loadu_ps(x + i), mv));
        _mm256_storeu_ps(x + i, e);
        sum = _mm256_add_ps(sum, e);
    }
    for (; i < n; i++)
        tail += (x[i] = expf(x[i] - m));
    return kn_hsum(sum) + tail;
}

KN_T float kn_max_avx2(const float *x, size_t n)
{
    __m256 m8 = _mm256_set1_ps(-INFINITY);
    float m = -INFINITY;
    size_t i = 0;
    for (; i + 8 <= n; i += 8)
        m8 = _mm256_max_ps(m8, _mm256_loadu_ps(x + i));
    for (; i < n; i++)
        m = x[i] > m ? x[i] : m;
    {
        __m128 m4 = _mm_max_ps(_mm256_castps256_ps128(m8), _mm256_extractf128_ps(m8, 1));
        m4 = _mm_max_ps(m4, _mm_movehl_ps(m4, m4));
        m4 = _mm_max_ss(m4, _mm_movehdup_ps(m4));
        return _mm_cvtss_f32(m4) > m ? _mm_cvtss_f32(m4) : m;
    }
}

KN_T void kn_axpy_avx2(float *y, const float *x, float a, uint32_t d)
{
    __m256 av = _mm256_set1_ps(a);
    for (uint32_t i = 0; i < d; i += 8)
        _mm256_storeu_ps(y + i, _mm256_fmadd_ps(av, _mm256_loadu_ps(x + i), _mm256_loadu_ps(y + i)));
}

/* GEMM-style argmax: centroids transposed into blocks of 16 ([d][16]) so that
 * tokens x 16 centroids accumulate in registers without reductions. */
KN_T void kn_assign_avx2(const float *x, size_t n, const float *c, size_t nc, uint32_t d,
                         uint32_t *best)
{
    static CM_ALLOC_TAG(kn_assign_tag, "kernels.assign");
    size_t nb = (nc + 15) / 16;
    float *ct = cm_malloc_aligned(&kn_assign_tag, nb * d * 16 * sizeof(float), 64);
    float *bs = cm_malloc(&kn_assign_tag, (n ? n : 1) * sizeof(float));
    if (ct == NULL || bs == NULL) {
        /* no memory for the fast layout: plain loops give the same answer */
        cm_free(ct);
        cm_free(bs);
        for (size_t i = 0; i < n; i++) {
            float b = -INFINITY;
            best[i] = 0;
            for (size_t j = 0; j < nc; j++) {
                __m256 a = _mm256_setzero_ps();
                for (uint32_t t = 0; t < d; t += 8)
                    a = _mm256_fmadd_ps(_mm256_loadu_ps(x + i * d + t), _mm256_loadu_ps(c + j * d + t), a);
                float s = kn_hsum(a);
                if (s > b) {
                    b = s;
                    best[i] = (uint32_t)j;
                }
            }
        }
        return;
    }
    for (size_t b = 0; b < nb; b++)
        for (uint32_t i = 0; i < d; i++)
            for (size_t l = 0; l < 16; l++) {
                size_t j = b * 16 + l;
                ct[(b * d + i) * 16 + l] = j < nc ? c[j * d + i] : 0.0f;
            }
    for (size_t i = 0; i < n; i++) {
        bs[i] = -INFINITY;
        best[i] = 0;
    }
    /* 6 tokens x 16 centroids: 12 accumulators, 2 centroid loads and 6
     * broadcasts per 12 FMAs (the classic AVX2 GEMM micro-kernel shape) */
    for (size_t t0 = 0; t0 < n; t0 += 6) {
        const float *xr[6];
        for (int r = 0; r < 6; r++)
            xr[r] = x + CM_MIN(t0 + r, n - 1) * d;
        for (size_t b = 0; b < nb; b++) {
            __m256 a[12];
            float sc[6][16] __attribute__((aligned(32)));
            const float *cb = ct + b * d * 16;
            for (int z = 0; z < 12; z++)
                a[z] = _mm256_setzero_ps();
            for (uint32_t i = 0; i < d; i++) {
                __m256 c0 = _mm256_load_ps(cb + i * 16), c1 = _mm256_load_ps(cb + i * 16 + 8);
#pragma GCC unroll 6
                for (int r = 0; r < 6; r++) {
                    __m256 xb = _mm256_broadcast_ss(xr[r] + i);
                    a[2 * r] = _mm256_fmadd_ps(xb, c0, a[2 * r]);
                    a[2 * r + 1] = _mm256_fmadd_ps(xb, c1, a[2 * r + 1]);
                }
            }
            for (int r = 0; r < 6; r++) {
                _mm256_store_ps(sc[r], a[2 * r]);
                _mm256_store_ps(sc[r] + 8, a[2 * r + 1]);
            }
            for (int r = 0; r < 6 && t0 + r < n; r++) {
                size_t lim = CM_MIN((size_t)16, nc - b * 16);
                for (size_t l = 0; l < lim; l++) {
                    if (sc[r][l] > bs[t0 + r]) {
                        bs[t0 + r] = sc[r][l];
                        best[t0 + r] = (uint32_t)(b * 16 + l);
                    }
                }
            }
        }
    }
    cm_free(ct);
    cm_free(bs);
}

KN_T void kn_quest_score_avx2(const float *q, uint32_t g, uint32_t d, const cm_fp16_t *kmin,
                              const cm_fp16_t *kmax, size_t n_pages, float scale, float *scores)
{
    for (size_t pg = 0; pg < n_pages; pg++) {
        float best = -INFINITY;
        for (uint32_t h = 0; h < g; h++) {
            __m256 acc = _mm256_setzero_ps();
            for (uint32_t i = 0; i < d; i += 8) {
                __m256 qv = _mm256_loadu_ps(q + (size_t)h * d + i);
                __m256 a = _mm256_mul_ps(qv, kn_load_h(kmin + pg * d + i));
                __m256 b = _mm256_mul_ps(qv, kn_load_h(kmax + pg * d + i));
                acc = _mm256_add_ps(acc, _mm256_max_ps(a, b));
            }
            float s = kn_hsum(acc);
            best = s > best ? s : best;
        }
        scores[pg] = best * scale;
    }
}

/* acc[h] += sum_e w[h*n + e] * vsum[ids[e]] for G heads.  Rows come in
 * cluster order (scattered in memory): blocks of 32 rows, the next block
 * prefetched while the current one is folded chunk by chunk into register
 * accumulators (each row read from L1 once per chunk). */
KN_TI void kn_est_accum_g(float *acc, const float *vsum, const uint32_t *ids, const float *w,
                          size_t n, uint32_t d, const int G)
{
    const int CW = G <= 4 ? 2 : 1;
    for (size_t e = 0; e < n && e < 32; e++)
        for (uint32_t i = 0; i < d; i += 16)
            _mm_prefetch((const char *)(vsum + (size_t)ids[e] * d + i), _MM_HINT_T0);
    for (size_t e0 = 0; e0 < n; e0 += 32) {
        size_t e1 = e0 + 32 < n ? e0 + 32 : n;
        for (size_t e = e1; e < n && e < e1 + 32; e++)
            for (uint32_t i = 0; i < d; i += 16)
                _mm_prefetch((const char *)(vsum + (size_t)ids[e] * d + i), _MM_HINT_T0);
        for (uint32_t c = 0; c < d; c += 8 * CW) {
            __m256 a[KN_GMAX * 2];
#pragma GCC unroll 8
            for (int h = 0; h < G; h++)
#pragma GCC unroll 2
                for (int x = 0; x < CW; x++)
                    a[h * CW + x] = _mm256_loadu_ps(acc + (size_t)h * d + c + 8 * x);
            for (size_t e = e0; e < e1; e++) {
                const float *row = vsum + (size_t)ids[e] * d + c;
                __m256 vv[2];
#pragma GCC unroll 2
                for (int x = 0; x < CW; x++)
                    vv[x] = _mm256_loadu_ps(row + 8 * x);
#pragma GCC unroll 8
                for (int h = 0; h < G; h++) {
                    __m256 wb = _mm256_broadcast_ss(w + (size_t)h * n + e);
#pragma GCC unroll 2
                    for (int x = 0; x < CW; x++)
                        a[h * CW + x] = _mm256_fmadd_ps(wb, vv[x], a[h * CW + x]);
                }
            }
#pragma GCC unroll 8
            for (int h = 0; h < G; h++)
#pragma GCC unroll 2
                for (int x = 0; x < CW; x++)
                    _mm256_storeu_ps(acc + (size_t)h * d + c + 8 * x, a[h * CW + x]);
        }
    }
}

/* The same over the int8 means (rows of d bytes: 2 lines at d = 128), each
 * row's scale folded into its weight (w * s_j, one product per head and
 * row, then q widened to fp32: the reference's w * (q * s_j) up to one
 * rounding).  Blocks of KN_EST_B rows are folded chunk by chunk; the pass
 * that reads line L of a row prefetches line L of the row KN_EST_PD rows
 * ahead, so the misses are issued evenly (one per row and line) and the
 * queue of outstanding reads never drains between blocks. */
#define KN_EST_B 16
#define KN_EST_PD 24
KN_TI void kn_est_accum_qg(float *acc, const int8_t *vq, const float *vs, const uint32_t *ids, const float *w, size_t n,
                           uint32_t d, const int G)
{
    const int CW = G <= 4 ? 2 : 1;
    for (size_t e = 0; e < n && e < KN_EST_PD; e++)
        for (uint32_t i = 0; i < d; i += 64)
            _mm_prefetch((const char *)(vq + (size_t)ids[e] * d + i), _MM_HINT_T0);
    for (size_t e0 = 0; e0 < n; e0 += KN_EST_B) {
        size_t e1 = e0 + KN_EST_B < n ? e0 + KN_EST_B : n;
        for (uint32_t c = 0; c < d; c += 8 * CW) {
            bool pf = c % 64 == 0; /* this pass starts a 64-byte line of each row */
            __m256 a[KN_GMAX * 2];
#pragma GCC unroll 8
            for (int h = 0; h < G; h++)
#pragma GCC unroll 2
                for (int x = 0; x < CW; x++)
                    a[h * CW + x] = _mm256_loadu_ps(acc + (size_t)h * d + c + 8 * x);
            for (size_t e = e0; e < e1; e++) {
                const int8_t *row = vq + (size_t)ids[e] * d + c;
                const float sj = vs[ids[e]];
                __m256 vv[2];
                if (pf && e + KN_EST_PD < n)  /* into L2: see KN_SCAN_PD */
                    _mm_prefetch((const char *)(vq + (size_t)ids[e + KN_EST_PD] * d + c), _MM_HINT_T1);
#pragma GCC unroll 2
                for (int x = 0; x < CW; x++)
                    vv[x] = kn_load_q(row + 8 * x);
#pragma GCC unroll 8
                for (int h = 0; h < G; h++) {
                    __m256 wb = _mm256_set1_ps(w[(size_t)h * n + e] * sj);
#pragma GCC unroll 2
                    for (int x = 0; x < CW; x++)
                        a[h * CW + x] = _mm256_fmadd_ps(wb, vv[x], a[h * CW + x]);
                }
            }
#pragma GCC unroll 8
            for (int h = 0; h < G; h++)
#pragma GCC unroll 2
                for (int x = 0; x < CW; x++)
                    _mm256_storeu_ps(acc + (size_t)h * d + c + 8 * x, a[h * CW + x]);
        }
    }
}

KN_T void kn_est_accum_q_avx2(float *acc, const int8_t *vq, const float *vs, const uint32_t *ids, const float *w,
                              size_t n, uint32_t g, uint32_t d)
{
    switch (g) {
    case 1:
        kn_est_accum_qg(acc, vq, vs, ids, w, n, d, 1);
        break;
    case 2:
        kn_est_accum_qg(acc, vq, vs, ids, w, n, d, 2);
        break;
    case 3:
        kn_est_accum_qg(acc, vq, vs, ids, w, n, d, 3);
        break;
    case 4:
        kn_est_accum_qg(acc, vq, vs, ids, w, n, d, 4);
        break;
    case 5:
        kn_est_accum_qg(acc, vq, vs, ids, w, n, d, 5);
        break;
    case 6:
        kn_est_accum_qg(acc, vq, vs, ids, w, n, d, 6);
        break;
    case 7:
        kn_est_accum_qg(acc, vq, vs, ids, w, n, d, 7);
        break;
    default:
        kn_est_accum_qg(acc, vq, vs, ids, w, n, d, 8);
        break;
    }
}

KN_T void kn_est_accum_avx2(float *acc, const float *vsum, const uint32_t *ids, const float *w,
                            size_t n, uint32_t g, uint32_t d)
{
    switch (g) {
    case 1: kn_est_accum_g(acc, vsum, ids, w, n, d, 1); break;
    case 2: kn_est_accum_g(acc, vsum, ids, w, n, d, 2); break;
    case 3: kn_est_accum_g(acc, vsum, ids, w, n, d, 3); break;
    case 4: kn_est_accum_g(acc, vsum, ids, w, n, d, 4); break;
    case 5: kn_est_accum_g(acc, vsum, ids, w, n, d, 5); break;
    case 6: kn_est_accum_g(acc, vsum, ids, w, n, d, 6); break;
    case 7: kn_est_accum_g(acc, vsum, ids, w, n, d, 7); break;
    default: kn_est_accum_g(acc, vsum, ids, w, n, d, 8); break;
    }
}
