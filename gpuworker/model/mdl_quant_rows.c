/*
 * The AVX2 decode product of four Q5_0 weight rows at a time (see
 * mdl_quant_rows.h).  A decode step multiplies each weight row of 640
 * elements (Gemma 3's Q, gate and up: 20 blocks) with one activation row;
 * unpacking the fifth bits makes the one-row kernel bound by its
 * instructions and by the FMA chain of its single accumulator, not by
 * memory.  Four rows side by side run four independent chains and load
 * each activation block once for the four: Gemma's 36 gate/up products
 * (32 MB, streamed from memory) 10-12% faster on one core.  The next group
 * of rows is prefetched, as the four streams otherwise start cold.  Q8_0
 * (the output head) stays on the one-row kernel: its 178 MB stream, four
 * rows at a time, ran 25-50% slower on this 2-core AMD VM (memory bound:
 * one sequential stream reads faster than four interleaved).
 */
#include "gpuworker/model/mdl_quant_rows.h"

#include <string.h>

#include "gpuworker/model/mdl_simd.h"

#define QK 32

#if defined(__x86_64__)
#include <immintrin.h>

#define MDL_R4_AVX2 __attribute__((target("avx2,fma,f16c")))

MDL_R4_AVX2 void mdl_dot4_q5_0_q16act_avx2(const uint8_t *p, size_t row_bytes, size_t nb, const int16_t *xq,
                                           const float *xd, const float *xs, float *out)
{
    /* bit j of the high bits is element j's fifth bit: spread to int16
     * lanes by comparing (qh & 1<<j) with 1<<j, as the one-row kernel */
    const __m256i bit =
        _mm256_setr_epi16(1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384, (short)0x8000);
    const __m256i b4 = _mm256_set1_epi16(0x10);
    const __m128i m4 = _mm_set1_epi8(0x0F);
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
            uint32_t qh;
            memcpy(&qh, q + 2, 4);
            __m128i raw = _mm_loadu_si128((const __m128i *)(q + 6));
            __m256i lo = _mm256_cvtepu8_epi16(_mm_and_si128(raw, m4));
            __m256i hi = _mm256_cvtepu8_epi16(_mm_and_si128(_mm_srli_epi16(raw, 4), m4));
            __m256i hl = _mm256_and_si256(_mm256_set1_epi16((short)(qh & 0xFFFF)), bit);
            __m256i hh = _mm256_and_si256(_mm256_set1_epi16((short)(qh >> 16)), bit);
            lo = _mm256_or_si256(lo, _mm256_and_si256(_mm256_cmpeq_epi16(hl, bit), b4));
            hi = _mm256_or_si256(hi, _mm256_and_si256(_mm256_cmpeq_epi16(hh, bit), b4));
            __m256i s = _mm256_add_epi32(_mm256_madd_epi16(lo, x0), _mm256_madd_epi16(hi, x1));
            float dw = mdl_simd_h16(q);
            acc[r] = _mm256_fmadd_ps(_mm256_set1_ps(dw * xd[b]), _mm256_cvtepi32_ps(s), acc[r]);
            accm[r] -= 16.0f * dw * xs[b];
        }
    }
    for (int r = 0; r < MDL_ROWS4; r++)
        out[r] = mdl_simd_hsum8(acc[r]) + accm[r];
}
#endif /* __x86_64__ */
