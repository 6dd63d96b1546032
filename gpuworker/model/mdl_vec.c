/* Vector helpers (see mdl_vec.h). */
#include "gpuworker/model/mdl_vec.h"

#include <math.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

#include "gpuworker/model/mdl_quant.h"
#include "gpuworker/model/mdl_simd.h"

#if defined(__x86_64__)
#include <immintrin.h>
#define MDL_AVX2 __attribute__((target("avx2,fma")))


MDL_AVX2 static float mdl_dot_avx2(const float *a, const float *b, size_t n)
{
    __m256 s0 = _mm256_setzero_ps(), s1 = _mm256_setzero_ps();
    size_t i = 0;
    for (; i + 16 <= n; i += 16) {
        s0 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i), _mm256_loadu_ps(b + i), s0);
        s1 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i + 8), _mm256_loadu_ps(b + i + 8), s1);
    }
    for (; i + 8 <= n; i += 8)
        s0 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i), _mm256_loadu_ps(b + i), s0);
    float s = mdl_simd_hsum8(_mm256_add_ps(s0, s1));
    for (; i < n; i++)
        s += a[i] * b[i];
    return s;
}

MDL_AVX2 static void mdl_axpy_avx2(float *y, float a, const float *x, size_t n)
{
    __m256 av = _mm256_set1_ps(a);
    size_t i = 0;
    for (; i + 8 <= n; i += 8)
        _mm256_storeu_ps(y + i, _mm256_fmadd_ps(av, _mm256_loadu_ps(x + i), _mm256_loadu_ps(y + i)));
    for (; i < n; i++)
        y[i] += a * x[i];
}

/* exp(x) for x in [-88, 88]: x = k ln2 + r, |r| <= ln2/2, exp(r) by Taylor to r^6. */
MDL_AVX2 static inline __m256 mdl_exp8(__m256 x)
{
    x = _mm256_max_ps(x, _mm256_set1_ps(-87.0f));
    x = _mm256_min_ps(x, _mm256_set1_ps(88.0f));
    __m256 k = _mm256_round_ps(_mm256_mul_ps(x, _mm256_set1_ps(1.44269504088896341f)),
                               _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m256 r = _mm256_fnmadd_ps(k, _mm256_set1_ps(0.693359375f), x);
    r = _mm256_fnmadd_ps(k, _mm256_set1_ps(-2.12194440e-4f), r);
    __m256 p = _mm256_set1_ps(1.0f / 720);
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f / 120));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f / 24));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f / 6));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(0.5f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f));
    __m256i e = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(k), _mm256_set1_epi32(127)), 23);
    return _mm256_mul_ps(p, _mm256_castsi256_ps(e));
}

MDL_AVX2 static float mdl_exp_sub_avx2(float *s, size_t n, float m)
{
    __m256 mv = _mm256_set1_ps(m), acc = _mm256_setzero_ps();
    size_t i = 0;
    for (; i + 8 <= n; i += 8) {
        __m256 e = mdl_exp8(_mm256_sub_ps(_mm256_loadu_ps(s + i), mv));
        _mm256_storeu_ps(s + i, e);
        acc = _mm256_add_ps(acc, e);
    }
    float sum = mdl_simd_hsum8(acc);
    for (; i < n; i++) {
        s[i] = expf(s[i] - m);
        sum += s[i];
    }
    return sum;
}

MDL_AVX2 static float mdl_max_avx2(const float *s, size_t n)
{
    __m256 m = _mm256_set1_ps(-INFINITY);
    size_t i = 0;
    for (; i + 8 <= n; i += 8)
        m = _mm256_max_ps(m, _mm256_loadu_ps(s + i));
    __m128 h = _mm_max_ps(_mm256_castps256_ps128(m), _mm256_extractf128_ps(m, 1));
    h = _mm_max_ps(h, _mm_movehl_ps(h, h));
    h = _mm_max_ss(h, _mm_movehdup_ps(h));
    float mx = _mm_cvtss_f32(h);
    for (; i < n; i++)
        mx = s[i] > mx ? s[i] : mx;
    return mx;
}

MDL_AVX2 static void mdl_scale_avx2(float *y, float a, size_t n)
{
    __m256 av = _mm256_set1_ps(a);
    size_t i = 0;
    for (; i + 8 <= n; i += 8)
        _mm256_storeu_ps(y + i, _mm256_mul_ps(_mm256_loadu_ps(y + i), av));
    for (; i < n; i++)
        y[i] *= a;
}

/* s[j] = scale * q.K[j] for d == 64: q in 8 registers, 8 keys at a time,
 * their 8 accumulators reduced together into one vector of 8 scores. */
MDL_AVX2 static void mdl_scores64_avx2(const float *q, const float *K, size_t nk, float scale, float *s)
{
    __m256 q0 = _mm256_loadu_ps(q), q1 = _mm256_loadu_ps(q + 8), q2 = _mm256_loadu_ps(q + 16);
    __m256 q3 = _mm256_loadu_ps(q + 24), q4 = _mm256_loadu_ps(q + 32), q5 = _mm256_loadu_ps(q + 40);
    __m256 q6 = _mm256_loadu_ps(q + 48), q7 = _mm256_loadu_ps(q + 56);
    __m256 sc = _mm256_set1_ps(scale);
    size_t j = 0;
    for (; j + 8 <= nk; j += 8) {
        __m256 a[8];
        for (int t = 0; t < 8; t++) {
            const float *k = K + (j + t) * 64;
            __m256 x = _mm256_mul_ps(q0, _mm256_loadu_ps(k));
            __m256 y = _mm256_mul_ps(q1, _mm256_loadu_ps(k + 8));
            x = _mm256_fmadd_ps(q2, _mm256_loadu_ps(k + 16), x);
            y = _mm256_fmadd_ps(q3, _mm256_loadu_ps(k + 24), y);
            x = _mm256_fmadd_ps(q4, _mm256_loadu_ps(k + 32), x);
            y = _mm256_fmadd_ps(q5, _mm256_loadu_ps(k + 40), y);
            x = _mm256_fmadd_ps(q6, _mm256_loadu_ps(k + 48), x);
            y = _mm256_fmadd_ps(q7, _mm256_loadu_ps(k + 56), y);
            a[t] = _mm256_add_ps(x, y);
        }
        __m256 t0 = _mm256_hadd_ps(a[0], a[1]), t1 = _mm256_hadd_ps(a[2], a[3]);
        __m256 t2 = _mm256_hadd_ps(a[4], a[5]), t3 = _mm256_hadd_ps(a[6], a[7]);
        t0 = _mm256_hadd_ps(t0, t1);
        t2 = _mm256_hadd_ps(t2, t3);
        __m256 r = _mm256_add_ps(_mm256_permute2f128_ps(t0, t2, 0x20), _mm256_permute2f128_ps(t0, t2, 0x31));
        _mm256_storeu_ps(s + j, _mm256_mul_ps(r, sc));
    }
    for (; j < nk; j++)
        s[j] = scale * mdl_dot_avx2(q, K + j * 64, 64);
}

/* acc[0..64) += sum_j p[j] * V[j] with the accumulator in registers. */
MDL_AVX2 static void mdl_pv64_avx2(float *acc, const float *p, const float *V, size_t nk)
{
    __m256 a0 = _mm256_loadu_ps(acc), a1 = _mm256_loadu_ps(acc + 8), a2 = _mm256_loadu_ps(acc + 16);
    __m256 a3 = _mm256_loadu_ps(acc + 24), a4 = _mm256_loadu_ps(acc + 32), a5 = _mm256_loadu_ps(acc + 40);
    __m256 a6 = _mm256_loadu_ps(acc + 48), a7 = _mm256_loadu_ps(acc + 56);
    for (size_t j = 0; j < nk; j++) {
        __m256 pj = _mm256_broadcast_ss(p + j);
        const float *v = V + j * 64;
        a0 = _mm256_fmadd_ps(pj, _mm256_loadu_ps(v), a0);
        a1 = _mm256_fmadd_ps(pj, _mm256_loadu_ps(v + 8), a1);
        a2 = _mm256_fmadd_ps(pj, _mm256_loadu_ps(v + 16), a2);
        a3 = _mm256_fmadd_ps(pj, _mm256_loadu_ps(v + 24), a3);
        a4 = _mm256_fmadd_ps(pj, _mm256_loadu_ps(v + 32), a4);
        a5 = _mm256_fmadd_ps(pj, _mm256_loadu_ps(v + 40), a5);
        a6 = _mm256_fmadd_ps(pj, _mm256_loadu_ps(v + 48), a6);
        a7 = _mm256_fmadd_ps(pj, _mm256_loadu_ps(v + 56), a7);
    }
    _mm256_storeu_ps(acc, a0), _mm256_storeu_ps(acc + 8, a1), _mm256_storeu_ps(acc + 16, a2);
    _mm256_storeu_ps(acc + 24, a3), _mm256_storeu_ps(acc + 32, a4), _mm256_storeu_ps(acc + 40, a5);
    _mm256_storeu_ps(acc + 48, a6), _mm256_storeu_ps(acc + 56, a7);
}
#endif

float mdl_vec_dot(const float *a, const float *b, size_t n)
{
#ifdef MDL_AVX2
    if (mdl_quant_have_simd())
        return mdl_dot_avx2(a, b, n);
#endif
    float s = 0;
    for (size_t i = 0; i < n; i++)
        s += a[i] * b[i];
    return s;
}

void mdl_vec_axpy(float *y, float a, const float *x, size_t n)
{
#ifdef MDL_AVX2
    if (mdl_quant_have_simd()) {
        mdl_axpy_avx2(y, a, x, n);
        return;
    }
#endif
    for (size_t i = 0; i < n; i++)
        y[i] += a * x[i];
}

void mdl_vec_scale(float *y, float a, size_t n)
{
#ifdef MDL_AVX2
    if (mdl_quant_have_simd()) {
        mdl_scale_avx2(y, a, n);
        return;
    }
#endif
    for (size_t i = 0; i < n; i++)
        y[i] *= a;
}

float mdl_vec_max(const float *s, size_t n)
{
#ifdef MDL_AVX2
    if (mdl_quant_have_simd())
        return mdl_max_avx2(s, n);
#endif
    float mx = -INFINITY;
    for (size_t i = 0; i < n; i++)
        mx = s[i] > mx ? s[i] : mx;
    return mx;
}

float mdl_vec_exp_sub(float *s, size_t n, float m)
{
#ifdef MDL_AVX2
    if (mdl_quant_have_simd())
        return mdl_exp_sub_avx2(s, n, m);
#endif
    float sum = 0;
    for (size_t i = 0; i < n; i++) {
        s[i] = expf(s[i] - m);
        sum += s[i];
    }
    return sum;
}

#ifdef MDL_AVX2
/* The sum of squares in double, 4 lanes x 2 accumulators (the scalar loop
 * was 2% of a prefill, on the calling thread alone); the scaling as the
 * scalar code rounds it: (x * r) * w. */
MDL_AVX2 static void mdl_rmsnorm_avx2(float *out, const float *x, const float *w, size_t n, float eps)
{
    __m256d s0 = _mm256_setzero_pd(), s1 = _mm256_setzero_pd();
    size_t i = 0;
    for (; i + 8 <= n; i += 8) {
        __m256 v = _mm256_loadu_ps(x + i);
        __m256d lo = _mm256_cvtps_pd(_mm256_castps256_ps128(v)), hi = _mm256_cvtps_pd(_mm256_extractf128_ps(v, 1));
        s0 = _mm256_fmadd_pd(lo, lo, s0);
        s1 = _mm256_fmadd_pd(hi, hi, s1);
    }
    __m256d s = _mm256_add_pd(s0, s1);
    __m128d h = _mm_add_pd(_mm256_castpd256_pd128(s), _mm256_extractf128_pd(s, 1));
    double ss = _mm_cvtsd_f64(_mm_add_sd(h, _mm_unpackhi_pd(h, h)));
    for (size_t k = i; k < n; k++)
        ss += (double)x[k] * x[k];
    float r = (float)(1.0 / sqrt(ss / (double)n + eps));
    __m256 rv = _mm256_set1_ps(r);
    for (i = 0; i + 8 <= n; i += 8)
        _mm256_storeu_ps(out + i, _mm256_mul_ps(_mm256_mul_ps(_mm256_loadu_ps(x + i), rv), _mm256_loadu_ps(w + i)));
    for (; i < n; i++)
        out[i] = x[i] * r * w[i];
}
#endif

void mdl_vec_rmsnorm(float *out, const float *x, const float *w, size_t n, float eps)
{
#ifdef MDL_AVX2
    if (mdl_quant_have_simd()) {
        mdl_rmsnorm_avx2(out, x, w, n, eps);
        return;
    }
#endif
    double ss = 0;
    for (size_t i = 0; i < n; i++)
        ss += (double)x[i] * x[i];
    float r = (float)(1.0 / sqrt(ss / (double)n + eps));
    for (size_t i = 0; i < n; i++)
        out[i] = x[i] * r * w[i];
}

void mdl_vec_swiglu(float *g, const float *u, size_t n)
{
    for (size_t i = 0; i < n; i++)
        g[i] = g[i] / (1.0f + expf(-g[i])) * u[i];
}

#define MDL_GELU_C 0.7978845608028654f   /* sqrt(2 / pi) */

#ifdef MDL_AVX2
/* 0.5 (1 + tanh y) = 1 / (1 + exp(-2y)): the tanh GELU on the vector exp
 * (whose clamp keeps large |x| finite: gelu -> x or -> 0). */
MDL_AVX2 static size_t mdl_geglu_avx2(float *g, const float *u, size_t n)
{
    const __m256 c2 = _mm256_set1_ps(-2.0f * MDL_GELU_C), k = _mm256_set1_ps(0.044715f), one = _mm256_set1_ps(1.0f);
    size_t i = 0;
    for (; i + 8 <= n; i += 8) {
        __m256 x = _mm256_loadu_ps(g + i);
        __m256 y = _mm256_mul_ps(x, _mm256_fmadd_ps(_mm256_mul_ps(k, x), x, one));   /* x + k x^3 */
        __m256 e = mdl_exp8(_mm256_mul_ps(c2, y));
        __m256 gl = _mm256_div_ps(x, _mm256_add_ps(one, e));
        _mm256_storeu_ps(g + i, _mm256_mul_ps(gl, _mm256_loadu_ps(u + i)));
    }
    return i;
}
#endif

void mdl_vec_geglu(float *g, const float *u, size_t n)
{
    size_t i = 0;
#ifdef MDL_AVX2
    if (mdl_quant_have_simd())
        i = mdl_geglu_avx2(g, u, n);
#endif
    for (; i < n; i++) {
        float x = g[i];
        g[i] = 0.5f * x * (1.0f + tanhf(MDL_GELU_C * (x + 0.044715f * x * x * x))) * u[i];
    }
}

void mdl_vec_scores(const float *q, const float *K, size_t nk, size_t d, float scale, float *s)
{
#ifdef MDL_AVX2
    if (d == 64 && mdl_quant_have_simd()) {
        mdl_scores64_avx2(q, K, nk, scale, s);
        return;
    }
#endif
    for (size_t j = 0; j < nk; j++)
        s[j] = scale * mdl_vec_dot(q, K + j * d, d);
}

void mdl_vec_pv(float *acc, const float *p, const float *V, size_t nk, size_t d)
{
#ifdef MDL_AVX2
    if (d == 64 && mdl_quant_have_simd()) {
        mdl_pv64_avx2(acc, p, V, nk);
        return;
    }
#endif
    for (size_t j = 0; j < nk; j++)
        mdl_vec_axpy(acc, p[j], V + j * d, d);
}

#ifdef MDL_AVX2
/* The 4 horizontal sums of a0..a3 in one vector. */
MDL_AVX2 static inline __m128 mdl_hsum4(__m256 a0, __m256 a1, __m256 a2, __m256 a3)
{
    __m256 t = _mm256_hadd_ps(_mm256_hadd_ps(a0, a1), _mm256_hadd_ps(a2, a3));
    return _mm_add_ps(_mm256_castps256_ps128(t), _mm256_extractf128_ps(t, 1));
}

MDL_AVX2 static inline void mdl_put4(float *s, size_t nk, size_t j, __m128 r)
{
    float o[4];
    _mm_storeu_ps(o, r);
    s[j] = o[0], s[nk + j] = o[1], s[2 * nk + j] = o[2], s[3 * nk + j] = o[3];
}

/* 4 rows at once: 3 keys x 4 rows in 12 accumulators, so each loaded vector
 * feeds 3 or 4 FMAs (a row at a time against one key was bound by its
 * loads); leftover keys one at a time.  The sums are those of the one-key
 * loop, in the same order. */
MDL_AVX2 static void mdl_scores4_avx2(const float *q, const float *K, size_t nk, size_t d, float scale, float *s)
{
    const __m128 sc = _mm_set1_ps(scale);
    const float *q0 = q, *q1 = q + d, *q2 = q + 2 * d, *q3 = q + 3 * d;
    size_t j = 0;
    for (; j + 3 <= nk; j += 3) {
        const float *k0 = K + j * d, *k1 = k0 + d, *k2 = k1 + d;
        __m256 a00 = _mm256_setzero_ps(), a01 = a00, a02 = a00, a03 = a00;
        __m256 a10 = a00, a11 = a00, a12 = a00, a13 = a00;
        __m256 a20 = a00, a21 = a00, a22 = a00, a23 = a00;
        for (size_t c = 0; c < d; c += 8) {
            __m256 v0 = _mm256_loadu_ps(k0 + c), v1 = _mm256_loadu_ps(k1 + c), v2 = _mm256_loadu_ps(k2 + c);
            __m256 x = _mm256_loadu_ps(q0 + c);
            a00 = _mm256_fmadd_ps(x, v0, a00), a10 = _mm256_fmadd_ps(x, v1, a10), a20 = _mm256_fmadd_ps(x, v2, a20);
            x = _mm256_loadu_ps(q1 + c);
            a01 = _mm256_fmadd_ps(x, v0, a01), a11 = _mm256_fmadd_ps(x, v1, a11), a21 = _mm256_fmadd_ps(x, v2, a21);
            x = _mm256_loadu_ps(q2 + c);
            a02 = _mm256_fmadd_ps(x, v0, a02), a12 = _mm256_fmadd_ps(x, v1, a12), a22 = _mm256_fmadd_ps(x, v2, a22);
            x = _mm256_loadu_ps(q3 + c);
            a03 = _mm256_fmadd_ps(x, v0, a03), a13 = _mm256_fmadd_ps(x, v1, a13), a23 = _mm256_fmadd_ps(x, v2, a23);
        }
        mdl_put4(s, nk, j, _mm_mul_ps(mdl_hsum4(a00, a01, a02, a03), sc));
        mdl_put4(s, nk, j + 1, _mm_mul_ps(mdl_hsum4(a10, a11, a12, a13), sc));
        mdl_put4(s, nk, j + 2, _mm_mul_ps(mdl_hsum4(a20, a21, a22, a23), sc));
    }
    for (; j < nk; j++) {
        const float *k = K + j * d;
        __m256 a0 = _mm256_setzero_ps(), a1 = _mm256_setzero_ps(), a2 = _mm256_setzero_ps(), a3 = _mm256_setzero_ps();
        for (size_t c = 0; c < d; c += 8) {
            __m256 kv = _mm256_loadu_ps(k + c);
            a0 = _mm256_fmadd_ps(_mm256_loadu_ps(q0 + c), kv, a0);
            a1 = _mm256_fmadd_ps(_mm256_loadu_ps(q1 + c), kv, a1);
            a2 = _mm256_fmadd_ps(_mm256_loadu_ps(q2 + c), kv, a2);
            a3 = _mm256_fmadd_ps(_mm256_loadu_ps(q3 + c), kv, a3);
        }
        mdl_put4(s, nk, j, _mm_mul_ps(mdl_hsum4(a0, a1, a2, a3), sc));
    }
}

/* 4 rows, 16 output lanes at a time: 8 accumulators in registers over all
 * keys; one load of V[j] feeds every row. */
MDL_AVX2 static void mdl_pv4_avx2(float *acc, const float *p, size_t ps, const float *V, size_t nk, size_t d)
{
    for (size_t c = 0; c < d; c += 16) {
        __m256 a0 = _mm256_loadu_ps(acc + c), a1 = _mm256_loadu_ps(acc + d + c);
        __m256 a2 = _mm256_loadu_ps(acc + 2 * d + c), a3 = _mm256_loadu_ps(acc + 3 * d + c);
        __m256 b0 = _mm256_loadu_ps(acc + c + 8), b1 = _mm256_loadu_ps(acc + d + c + 8);
        __m256 b2 = _mm256_loadu_ps(acc + 2 * d + c + 8), b3 = _mm256_loadu_ps(acc + 3 * d + c + 8);
        for (size_t j = 0; j < nk; j++) {
            __m256 v = _mm256_loadu_ps(V + j * d + c), w = _mm256_loadu_ps(V + j * d + c + 8);
            __m256 p0 = _mm256_broadcast_ss(p + j), p1 = _mm256_broadcast_ss(p + ps + j);
            __m256 p2 = _mm256_broadcast_ss(p + 2 * ps + j), p3 = _mm256_broadcast_ss(p + 3 * ps + j);
            a0 = _mm256_fmadd_ps(p0, v, a0), b0 = _mm256_fmadd_ps(p0, w, b0);
            a1 = _mm256_fmadd_ps(p1, v, a1), b1 = _mm256_fmadd_ps(p1, w, b1);
            a2 = _mm256_fmadd_ps(p2, v, a2), b2 = _mm256_fmadd_ps(p2, w, b2);
            a3 = _mm256_fmadd_ps(p3, v, a3), b3 = _mm256_fmadd_ps(p3, w, b3);
        }
        _mm256_storeu_ps(acc + c, a0), _mm256_storeu_ps(acc + d + c, a1);
        _mm256_storeu_ps(acc + 2 * d + c, a2), _mm256_storeu_ps(acc + 3 * d + c, a3);
        _mm256_storeu_ps(acc + c + 8, b0), _mm256_storeu_ps(acc + d + c + 8, b1);
        _mm256_storeu_ps(acc + 2 * d + c + 8, b2), _mm256_storeu_ps(acc + 3 * d + c + 8, b3);
    }
}
#endif

#ifdef MDL_AVX2
#define MDL_AVX512 __attribute__((target("avx512f,avx2,fma")))

/* P.V for 4 rows on AVX-512: 64 output lanes per pass in 16 accumulators
 * (AVX2's 16 lanes in 8 were bound by the FMA latency: one FMA per
 * accumulator per key), one pass over the keys per 64 lanes. */
MDL_AVX512 static void mdl_pv4_avx512(float *acc, const float *p, size_t ps, const float *V, size_t nk, size_t d)
{
    for (size_t c = 0; c < d; c += 64) {
        __m512 a[4][4];
        for (int r = 0; r < 4; r++)
            for (int u = 0; u < 4; u++)
                a[r][u] = _mm512_loadu_ps(acc + r * d + c + 16 * u);
        for (size_t j = 0; j < nk; j++) {
            const float *v = V + j * d + c;
            __m512 v0 = _mm512_loadu_ps(v), v1 = _mm512_loadu_ps(v + 16);
            __m512 v2 = _mm512_loadu_ps(v + 32), v3 = _mm512_loadu_ps(v + 48);
            for (int r = 0; r < 4; r++) {
                __m512 pr = _mm512_set1_ps(p[r * ps + j]);
                a[r][0] = _mm512_fmadd_ps(pr, v0, a[r][0]);
                a[r][1] = _mm512_fmadd_ps(pr, v1, a[r][1]);
                a[r][2] = _mm512_fmadd_ps(pr, v2, a[r][2]);
                a[r][3] = _mm512_fmadd_ps(pr, v3, a[r][3]);
            }
        }
        for (int r = 0; r < 4; r++)
            for (int u = 0; u < 4; u++)
                _mm512_storeu_ps(acc + r * d + c + 16 * u, a[r][u]);
    }
}

MDL_AVX512 static inline __m256 mdl_z2y(__m512 a)
{
    return _mm256_add_ps(_mm512_castps512_ps256(a), _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(a), 1)));
}

/* Scores of 4 rows on AVX-512: 6 keys x 4 rows in 24 accumulators, the 4
 * query vectors loaded once per 16 lanes for all 6 keys (10 loads per 24
 * FMAs); leftover keys one at a time, reduced the same way. */
MDL_AVX512 static void mdl_scores4_avx512(const float *q, const float *K, size_t nk, size_t d, float scale, float *s)
{
    const __m128 sc = _mm_set1_ps(scale);
    size_t j = 0;
#define MDL_ZA(t) __m512 a##t##0 = z, a##t##1 = z, a##t##2 = z, a##t##3 = z
#define MDL_ZK(t)                                                                                 \
    kv = _mm512_loadu_ps(k + t * d + c);                                                          \
    a##t##0 = _mm512_fmadd_ps(q0, kv, a##t##0), a##t##1 = _mm512_fmadd_ps(q1, kv, a##t##1); \
    a##t##2 = _mm512_fmadd_ps(q2, kv, a##t##2), a##t##3 = _mm512_fmadd_ps(q3, kv, a##t##3)
#define MDL_ZS(t) \
    mdl_put4(s, nk, j + t, _mm_mul_ps(mdl_hsum4(mdl_z2y(a##t##0), mdl_z2y(a##t##1), mdl_z2y(a##t##2), mdl_z2y(a##t##3)), sc))
    const __m512 z = _mm512_setzero_ps();
    for (; j + 6 <= nk; j += 6) {
        const float *k = K + j * d;
        MDL_ZA(0); MDL_ZA(1); MDL_ZA(2); MDL_ZA(3); MDL_ZA(4); MDL_ZA(5);
        for (size_t c = 0; c < d; c += 16) {
            __m512 q0 = _mm512_loadu_ps(q + c), q1 = _mm512_loadu_ps(q + d + c);
            __m512 q2 = _mm512_loadu_ps(q + 2 * d + c), q3 = _mm512_loadu_ps(q + 3 * d + c), kv;
            MDL_ZK(0); MDL_ZK(1); MDL_ZK(2); MDL_ZK(3); MDL_ZK(4); MDL_ZK(5);
        }
        MDL_ZS(0); MDL_ZS(1); MDL_ZS(2); MDL_ZS(3); MDL_ZS(4); MDL_ZS(5);
    }
#undef MDL_ZA
#undef MDL_ZK
#undef MDL_ZS
    for (; j < nk; j++) {
        const float *k = K + j * d;
        __m512 a0 = _mm512_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
        for (size_t c = 0; c < d; c += 16) {
            __m512 kv = _mm512_loadu_ps(k + c);
            a0 = _mm512_fmadd_ps(_mm512_loadu_ps(q + c), kv, a0);
            a1 = _mm512_fmadd_ps(_mm512_loadu_ps(q + d + c), kv, a1);
            a2 = _mm512_fmadd_ps(_mm512_loadu_ps(q + 2 * d + c), kv, a2);
            a3 = _mm512_fmadd_ps(_mm512_loadu_ps(q + 3 * d + c), kv, a3);
        }
        mdl_put4(s, nk, j, _mm_mul_ps(mdl_hsum4(mdl_z2y(a0), mdl_z2y(a1), mdl_z2y(a2), mdl_z2y(a3)), sc));
    }
}

static bool mdl_vec_avx512_on = true;   /* mdl_vec_set_avx512 */

static bool mdl_vec_have_avx512(void)
{
    static int have = -1;
    if (have < 0) {
        __builtin_cpu_init();
        have = __builtin_cpu_supports("avx512f");
    }
    return have && mdl_vec_avx512_on && mdl_quant_have_simd();
}
#endif

void mdl_vec_set_avx512(bool on)
{
#ifdef MDL_AVX2
    mdl_vec_avx512_on = on;
#else
    (void)on;
#endif
}

void mdl_vec_scores_rows(const float *q, size_t nr, const float *K, size_t nk, size_t d, float scale, float *s)
{
    size_t r = 0;
#ifdef MDL_AVX2
    if (d % 16 == 0 && d != 64 && mdl_vec_have_avx512())
        for (; r + 4 <= nr; r += 4)
            mdl_scores4_avx512(q + r * d, K, nk, d, scale, s + r * nk);
    if (d % 16 == 0 && d != 64 && mdl_quant_have_simd())
        for (; r + 4 <= nr; r += 4)
            mdl_scores4_avx2(q + r * d, K, nk, d, scale, s + r * nk);
#endif
    for (; r < nr; r++)
        mdl_vec_scores(q + r * d, K, nk, d, scale, s + r * nk);
}

void mdl_vec_pv_rows(float *acc, size_t nr, const float *p, size_t p_stride, const float *V, size_t nk, size_t d)
{
    size_t r = 0;
#ifdef MDL_AVX2
    if (d % 64 == 0 && d != 64 && mdl_vec_have_avx512())
        for (; r + 4 <= nr; r += 4)
            mdl_pv4_avx512(acc + r * d, p + r * p_stride, p_stride, V, nk, d);
    if (d % 16 == 0 && d != 64 && mdl_quant_have_simd())
        for (; r + 4 <= nr; r += 4)
            mdl_pv4_avx2(acc + r * d, p + r * p_stride, p_stride, V, nk, d);
#endif
    for (; r < nr; r++)
        mdl_vec_pv(acc + r * d, p + r * p_stride, V, nk, d);
}
