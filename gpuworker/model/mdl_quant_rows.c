/*
 * The AVX2 decode products of four weight rows at a time (see
 * mdl_quant_rows.h).  A decode step multiplies each weight row (Gemma 3:
 * 640 or 1024 elements) with one activation row; unpacking Q5_0's fifth
 * bits or the K-quants' scales makes the one-row kernels bound by their
 * instructions and by the FMA chain of a single accumulator, not by
 * memory.  Four rows side by side run four independent chains and load
 * each activation block once for the four.  The four row streams start
 * cold where one sequential stream would have been prefetched by the
 * hardware, so every line of the next group of rows is prefetched: without
 * it Gemma's 36 down and attention-output products (23 MB streamed) ran
 * 37% slower, with it 9% faster than one row at a time; the gate/up ones
 * (Q5_0, 32 MB) 12-14% faster, on one core of the 2-core AMD VM.  Q8_0
 * (the output head) stays on the one-row kernel: its 178 MB stream, four
 * rows at a time, ran 25-50% slower (memory bound: one sequential stream
 * reads faster than four interleaved); SmolLM2's 30 MB Q8_0 head, four
 * rows at a time with the Q4_1 kernel's prefetch two groups ahead and the
 * four scales in one vector, was no faster than one row at a time (2.5 ms
 * both, one core, the VM loaded).  Q4_1 (SmolLM2's layers) takes four rows:
 * its 30 layers' products on one core 7.8-8.6 -> 10.0-10.3 GB/s.
 */
#include "gpuworker/model/mdl_quant_rows.h"

#include <math.h>
#include <string.h>

#include "gpuworker/model/mdl_simd.h"

#define QK  32
#define QKK 256 /* K-quant super-block */

#if defined(__x86_64__)
#include <immintrin.h>

#define MDL_R4_AVX2 __attribute__((target("avx2,fma,f16c")))

MDL_R4_AVX2 void mdl_dot4_q5_0_q16act_avx2(const uint8_t *p, size_t row_bytes, size_t nb, const int16_t *xq,
                                           const float *xd, const float *xs, float *out)
{
    __m256 acc[MDL_ROWS4];
    float accm[MDL_ROWS4];
    for (int r = 0; r < MDL_ROWS4; r++)
        acc[r] = _mm256_setzero_ps(), accm[r] = 0;
    for (size_t b = 0; b < nb; b++) {
        __m256i x0 = _mm256_loadu_si256((const __m256i *)(xq + b * QK));
        __m256i x1 = _mm256_loadu_si256((const __m256i *)(xq + b * QK + 16));
        for (int r = 0; r < MDL_ROWS4; r++) {
            const uint8_t *q = p + r * row_bytes + b * 22;
            _mm_prefetch((const char *)(q + MDL_ROWS4 * row_bytes), _MM_HINT_T0);
            __m256i s = mdl_simd_q5_0_dot(q, x0, x1);
            float dw = mdl_simd_h16(q);
            acc[r] = _mm256_fmadd_ps(_mm256_set1_ps(dw * xd[b]), _mm256_cvtepi32_ps(s), acc[r]);
            accm[r] -= 16.0f * dw * xs[b];
        }
    }
    for (int r = 0; r < MDL_ROWS4; r++)
        out[r] = mdl_simd_hsum8(acc[r]) + accm[r];
}
MDL_R4_AVX2 void mdl_dot4_q4_1_q16act_avx2(const uint8_t *p, size_t row_bytes, size_t nb, const int16_t *xq,
                                           const float *xd, const float *xs, float *out)
{
    const __m256i m4 = _mm256_set1_epi16(0x0F);
    /* the four rows are consecutive (4 x 20 bytes a block), so a group
     * is 80 bytes a block: two lines a block keep the stream ahead.  Two
     * groups ahead, not one: SmolLM2's 576-element rows (1440 bytes a
     * group) on one core 9.0-9.3 -> 10.1-10.3 GB/s; its 1536-element ones
     * the same either way, or 4 KiB further */
    const uint8_t *next = p + 2 * MDL_ROWS4 * row_bytes;
    __m256 acc[MDL_ROWS4];
    /* the four rows' scale and min side by side (d0 m0 d1 m1 ...): one
     * conversion and one multiply for the four, lane by lane the one-row
     * kernel's scalar arithmetic; the odd lanes accumulate the min terms */
    __m256 accdm = _mm256_setzero_ps();
    for (int r = 0; r < MDL_ROWS4; r++)
        acc[r] = _mm256_setzero_ps();
    for (size_t b = 0; b < nb; b++) {
        _mm_prefetch((const char *)(next + 80 * b), _MM_HINT_T0);
        _mm_prefetch((const char *)(next + 80 * b + 64), _MM_HINT_T0);
        __m256i x0 = _mm256_loadu_si256((const __m256i *)(xq + b * QK));
        __m256i x1 = _mm256_loadu_si256((const __m256i *)(xq + b * QK + 16));
        const uint8_t *q = p + b * 20;
        int32_t dm[MDL_ROWS4];
        for (int r = 0; r < MDL_ROWS4; r++)
            memcpy(&dm[r], q + r * row_bytes, 4);
        __m256 dmf = _mm256_cvtph_ps(_mm_setr_epi32(dm[0], dm[1], dm[2], dm[3]));
        /* xd xs xd xs ...: even lanes d xd, odd lanes accumulate q d + m,
         * the min times the exact block sum */
        __m256 xds = _mm256_unpacklo_ps(_mm256_set1_ps(xd[b]), _mm256_set1_ps(xs[b]));
        __m256 dx = _mm256_mul_ps(dmf, xds);
        accdm = _mm256_fmadd_ps(dmf, xds, accdm);
        for (int r = 0; r < MDL_ROWS4; r++, q += row_bytes) {
            /* bytes widened once, then split: low nibbles are elements
             * 0..15, high ones 16..31 (one widening instead of two) */
            __m256i raw = _mm256_cvtepu8_epi16(_mm_loadu_si128((const __m128i *)(q + 4)));
            __m256i lo = _mm256_and_si256(raw, m4), hi = _mm256_srli_epi16(raw, 4);
            __m256i s = _mm256_add_epi32(_mm256_madd_epi16(lo, x0), _mm256_madd_epi16(hi, x1));
            __m256 d = _mm256_permutevar8x32_ps(dx, _mm256_set1_epi32(2 * r));
            acc[r] = _mm256_fmadd_ps(d, _mm256_cvtepi32_ps(s), acc[r]);
        }
    }
    float dmv[2 * MDL_ROWS4];
    _mm256_storeu_ps(dmv, accdm);
    for (int r = 0; r < MDL_ROWS4; r++)
        out[r] = mdl_simd_hsum8(acc[r]) + dmv[2 * r + 1];
}

/* The 6-bit scale and min of group g of a Q4_K super-block (scales at s),
 * as the one-row kernel takes them. */
static inline void mdl_q4_k_scale_min(const uint8_t *s, int g, int *s6, int *m6)
{
    *s6 = g < 4 ? s[g] & 63 : (s[g + 4] & 0xF) | (s[g - 4] >> 6) << 4;
    *m6 = g < 4 ? s[g + 4] & 63 : (s[g + 4] >> 4) | (s[g] >> 6) << 4;
}

MDL_R4_AVX2 void mdl_dot4_q4_k_q16act_avx2(const uint8_t *p, size_t row_bytes, size_t nsb, const int16_t *xq,
                                           const float *xd, const float *xs, float *out)
{
    const __m128i m4 = _mm_set1_epi8(0x0F);
    __m256 acc[MDL_ROWS4];
    float accm[MDL_ROWS4];
    for (int r = 0; r < MDL_ROWS4; r++)
        acc[r] = _mm256_setzero_ps(), accm[r] = 0;
    for (size_t sb = 0; sb < nsb; sb++, p += 144, xq += QKK, xd += 8, xs += 8) {
        for (int g = 0; g < 8; g++) {
            __m256i x0 = _mm256_loadu_si256((const __m256i *)(xq + 32 * g));
            __m256i x1 = _mm256_loadu_si256((const __m256i *)(xq + 32 * g + 16));
            for (int r = 0; r < MDL_ROWS4; r++) {
                const uint8_t *q = p + r * row_bytes;
                float d = mdl_simd_h16(q), dmin = mdl_simd_h16(q + 2);
                int s6, m6;
                mdl_q4_k_scale_min(q + 4, g, &s6, &m6);
                const uint8_t *qq = q + 16 + 32 * (g / 2); /* groups 2k, 2k+1: low, high nibbles */
                if (g < 3)                                 /* the next group's super-block, a line per group */
                    _mm_prefetch((const char *)(q + MDL_ROWS4 * row_bytes + 64 * g), _MM_HINT_T0);
                __m128i r0 = _mm_loadu_si128((const __m128i *)qq), r1 = _mm_loadu_si128((const __m128i *)(qq + 16));
                if (g & 1)
                    r0 = _mm_srli_epi16(r0, 4), r1 = _mm_srli_epi16(r1, 4);
                __m256i w0 = _mm256_cvtepu8_epi16(_mm_and_si128(r0, m4));
                __m256i w1 = _mm256_cvtepu8_epi16(_mm_and_si128(r1, m4));
                __m256i sum = _mm256_add_epi32(_mm256_madd_epi16(w0, x0), _mm256_madd_epi16(w1, x1));
                acc[r] = _mm256_fmadd_ps(_mm256_set1_ps(d * (float)s6 * xd[g]), _mm256_cvtepi32_ps(sum), acc[r]);
                accm[r] -= dmin * (float)m6 * xs[g];
            }
        }
    }
    for (int r = 0; r < MDL_ROWS4; r++)
        out[r] = mdl_simd_hsum8(acc[r]) + accm[r];
}

MDL_R4_AVX2 void mdl_dot4_q6_k_q16act_avx2(const uint8_t *p, size_t row_bytes, size_t nsb, const int16_t *xq,
                                           const float *xd, float *out)
{
    __m256 acc[MDL_ROWS4];
    for (int r = 0; r < MDL_ROWS4; r++)
        acc[r] = _mm256_setzero_ps();
    for (size_t sb = 0; sb < nsb; sb++, p += 210) {
        for (int b = 0; b < 8; b++, xq += QK, xd++) {
            int h = b / 4, k = b % 4;
            __m256i x0 = _mm256_loadu_si256((const __m256i *)xq);
            __m256i x1 = _mm256_loadu_si256((const __m256i *)(xq + 16));
            for (int r = 0; r < MDL_ROWS4; r++) {
                const uint8_t *q = p + r * row_bytes;
                const int8_t *sc = (const int8_t *)(q + 192);
                float d = mdl_simd_h16(q + 208);
                __m256i w[2];
                if (b < 4) /* the next group's super-block, a line per sub-block */
                    _mm_prefetch((const char *)(q + MDL_ROWS4 * row_bytes + 64 * b), _MM_HINT_T0);
                mdl_simd_q6_k_quarter(q, h, k, w);
                __m256i s0 = _mm256_madd_epi16(w[0], x0);
                __m256i s1 = _mm256_madd_epi16(w[1], x1);
                acc[r] = _mm256_fmadd_ps(_mm256_set1_ps(d * sc[8 * h + 2 * k] * xd[0]), _mm256_cvtepi32_ps(s0), acc[r]);
                acc[r] =
                    _mm256_fmadd_ps(_mm256_set1_ps(d * sc[8 * h + 2 * k + 1] * xd[0]), _mm256_cvtepi32_ps(s1), acc[r]);
            }
        }
    }
    for (int r = 0; r < MDL_ROWS4; r++)
        out[r] = mdl_simd_hsum8(acc[r]);
}
#endif /* __x86_64__ */
