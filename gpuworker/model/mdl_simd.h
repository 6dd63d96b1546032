/*
 * Small x86 SIMD pieces shared by the model runtime's product and vector
 * files (internal).  Each carries the narrowest target it needs, so that it
 * inlines into callers compiled for that ISA or a wider one (AVX2, AVX-512,
 * AVX-512 VNNI kernels alike).
 */
#ifndef MDL_SIMD_H
#define MDL_SIMD_H

#if defined(__x86_64__)
#include <immintrin.h>
#include <stdint.h>
#include <string.h>

/* The sum of the 8 floats of v. */
__attribute__((target("avx"))) static inline float mdl_simd_hsum8(__m256 v)
{
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}

/* The fp16 value stored (little-endian, unaligned) at p. */
__attribute__((target("f16c"))) static inline float mdl_simd_h16(const uint8_t *p)
{
    uint16_t h;
    memcpy(&h, p, 2);
    return _cvtsh_ss(h);
}

/* Q6_K: the four 32-element quarters of half h of the super-block at p, as
 * unsigned 6-bit values in bytes (element l + 32k takes nibble k/2 of
 * ql[l + 32 (k & 1)] and bits 2k of qh[l]); the caller subtracts 32. */
__attribute__((target("avx2"), always_inline)) static inline void mdl_simd_q6_k_half(const uint8_t *p, int h,
                                                                                      __m256i q[4])
{
    const __m256i m4 = _mm256_set1_epi8(0x0F), m2 = _mm256_set1_epi8(3);
    __m256i l0 = _mm256_loadu_si256((const __m256i *)(p + 64 * h));
    __m256i l1 = _mm256_loadu_si256((const __m256i *)(p + 64 * h + 32));
    __m256i hb = _mm256_loadu_si256((const __m256i *)(p + 128 + 32 * h));
    q[0] = _mm256_or_si256(_mm256_and_si256(l0, m4), _mm256_slli_epi16(_mm256_and_si256(hb, m2), 4));
    q[1] = _mm256_or_si256(_mm256_and_si256(l1, m4),
                           _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(hb, 2), m2), 4));
    q[2] = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(l0, 4), m4),
                           _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(hb, 4), m2), 4));
    q[3] = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(l1, 4), m4),
                           _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(hb, 6), m2), 4));
}
/* Q5_0: the int32 lane sums of the 22-byte block at q (d, qh, 16 nibble
 * bytes) times the block's 32 int16 activations x0 (elements 0-15) and x1
 * (16-31), before d and the -16 offset.  The fifth bit of element j is bit
 * j of qh, spread to the int16 lanes by comparing (qh & 1<<j) with 1<<j.
 * One copy for the one-row and the four-row kernels, so that a row's bits
 * are the same in both. */
__attribute__((target("avx2"), always_inline)) static inline __m256i mdl_simd_q5_0_dot(const uint8_t *q, __m256i x0,
                                                                                       __m256i x1)
{
    const __m256i bit = _mm256_setr_epi16(1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384,
                                          (short)0x8000);
    const __m256i b4 = _mm256_set1_epi16(0x10);
    const __m128i m4 = _mm_set1_epi8(0x0F);
    uint32_t qh;
    memcpy(&qh, q + 2, 4);
    __m128i raw = _mm_loadu_si128((const __m128i *)(q + 6));
    __m256i lo = _mm256_cvtepu8_epi16(_mm_and_si128(raw, m4));
    __m256i hi = _mm256_cvtepu8_epi16(_mm_and_si128(_mm_srli_epi16(raw, 4), m4));
    __m256i hl = _mm256_and_si256(_mm256_set1_epi16((short)(qh & 0xFFFF)), bit);
    __m256i hh = _mm256_and_si256(_mm256_set1_epi16((short)(qh >> 16)), bit);
    lo = _mm256_or_si256(lo, _mm256_and_si256(_mm256_cmpeq_epi16(hl, bit), b4));
    hi = _mm256_or_si256(hi, _mm256_and_si256(_mm256_cmpeq_epi16(hh, bit), b4));
    return _mm256_add_epi32(_mm256_madd_epi16(lo, x0), _mm256_madd_epi16(hi, x1));
}
/* Q6_K: quarter k (0-3) of half h of the super-block at q, its 32 weights
 * as int16 minus 32: elements 0-15 in w[0], 16-31 in w[1] (low or high
 * nibbles of 32 ql bytes, bits 2k and 2k+1 of 32 qh bytes).  One copy for
 * the one-row and the four-row kernels. */
__attribute__((target("avx2"), always_inline)) static inline void mdl_simd_q6_k_quarter(const uint8_t *q, int h, int k,
                                                                                         __m256i w[2])
{
    const __m128i m4 = _mm_set1_epi8(0x0F), m2 = _mm_set1_epi8(0x03);
    const __m256i off = _mm256_set1_epi16(32);
    const uint8_t *lb = q + 64 * h + 32 * (k & 1), *hb = q + 128 + 32 * h;
    __m128i l0 = _mm_loadu_si128((const __m128i *)lb), l1 = _mm_loadu_si128((const __m128i *)(lb + 16));
    if (k >= 2)
        l0 = _mm_srli_epi16(l0, 4), l1 = _mm_srli_epi16(l1, 4);
    __m128i h0 = _mm_and_si128(_mm_srli_epi16(_mm_loadu_si128((const __m128i *)hb), 2 * k), m2);
    __m128i h1 = _mm_and_si128(_mm_srli_epi16(_mm_loadu_si128((const __m128i *)(hb + 16)), 2 * k), m2);
    __m128i q0 = _mm_or_si128(_mm_and_si128(l0, m4), _mm_slli_epi16(h0, 4));
    __m128i q1 = _mm_or_si128(_mm_and_si128(l1, m4), _mm_slli_epi16(h1, 4));
    w[0] = _mm256_sub_epi16(_mm256_cvtepu8_epi16(q0), off);
    w[1] = _mm256_sub_epi16(_mm256_cvtepu8_epi16(q1), off);
}
#endif

#endif /* MDL_SIMD_H */
