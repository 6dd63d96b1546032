/* fp16/bf16 conversions: exact scalar code plus an F16C bulk path. */
#include "common/cm_half.h"

#include <string.h>
#if defined(__x86_64__)
#include <immintrin.h>
#endif

static inline uint32_t cm_f32_bits(float f)
{
    uint32_t u;
    memcpy(&u, &f, 4);
    return u;
}

static inline float cm_bits_f32(uint32_t u)
{
    float f;
    memcpy(&f, &u, 4);
    return f;
}

float cm_fp16_to_f32(cm_fp16_t h)
{
    uint32_t sign = (uint32_t)(h & 0x8000u) << 16;
    uint32_t exp = (h >> 10) & 0x1fu;
    uint32_t man = h & 0x3ffu;
    if (exp == 0x1f) /* inf / nan: keep payload */
        return cm_bits_f32(sign | 0x7f800000u | (man << 13));
    if (exp == 0) {
        if (man == 0)
            return cm_bits_f32(sign);
        /* subnormal: value = man * 2^-24, exact in fp32 */
        float v = (float)man * (1.0f / 16777216.0f);
        return sign ? -v : v;
    }
    return cm_bits_f32(sign | ((exp + 112u) << 23) | (man << 13));
}

cm_fp16_t cm_f32_to_fp16(float f)
{
    uint32_t u = cm_f32_bits(f);
    uint32_t sign = (u >> 16) & 0x8000u;
    uint32_t absu = u & 0x7fffffffu;
    if (absu >= 0x7f800000u) { /* inf or nan */
        uint32_t man = absu > 0x7f800000u ? (0x200u | ((absu >> 13) & 0x3ffu)) : 0;
        return (cm_fp16_t)(sign | 0x7c00u | man);
    }
    if (absu >= 0x477ff000u) /* rounds to >= 65520: overflow to inf */
        return (cm_fp16_t)(sign | 0x7c00u);
    if (absu < 0x38800000u) { /* below the smallest normal fp16 (2^-14) */
        if (absu < 0x33000000u) /* below half the smallest subnormal: zero */
            return (cm_fp16_t)sign;
        /* subnormal: shift the implicit-one mantissa, round to nearest even */
        uint32_t exp = absu >> 23;
        uint32_t man = (absu & 0x7fffffu) | 0x800000u;
        uint32_t shift = 126u - exp; /* 14..24 */
        uint32_t half = man >> shift;
        uint32_t rem = man & ((1u << shift) - 1u);
        uint32_t mid = 1u << (shift - 1u);
        if (rem > mid || (rem == mid && (half & 1u)))
            half++;
        return (cm_fp16_t)(sign | half);
    }
    /* normal: rebias and round the dropped 13 bits to nearest even */
    uint32_t r = absu + 0xfffu + ((absu >> 13) & 1u);
    return (cm_fp16_t)(sign | ((r - 0x38000000u) >> 13));
}

float cm_bf16_to_f32(cm_bf16_t h)
{
    return cm_bits_f32((uint32_t)h << 16);
}

cm_bf16_t cm_f32_to_bf16(float f)
{
    uint32_t u = cm_f32_bits(f);
    if ((u & 0x7fffffffu) > 0x7f800000u) /* nan: keep it quiet and a nan */
        return (cm_bf16_t)((u >> 16) | 0x40u);
    u += 0x7fffu + ((u >> 16) & 1u);
    return (cm_bf16_t)(u >> 16);
}

#if defined(__x86_64__)
static int cm_half_f16c = -1;

bool cm_half_have_f16c(void)
{
    if (cm_half_f16c < 0) {
        __builtin_cpu_init();
        cm_half_f16c = __builtin_cpu_supports("f16c") && __builtin_cpu_supports("avx") ? 1 : 0;
    }
    return cm_half_f16c == 1;
}

__attribute__((target("avx,f16c"))) static void cm_fp16_to_f32_f16c(float *dst, const cm_fp16_t *src, size_t n)
{
    size_t i = 0;
    for (; i + 8 <= n; i += 8)
        _mm256_storeu_ps(dst + i, _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(src + i))));
    for (; i < n; i++)
        dst[i] = cm_fp16_to_f32(src[i]);
}

__attribute__((target("avx,f16c"))) static void cm_f32_to_fp16_f16c(cm_fp16_t *dst, const float *src, size_t n)
{
    size_t i = 0;
    for (; i + 8 <= n; i += 8)
        _mm_storeu_si128((__m128i *)(dst + i),
                         _mm256_cvtps_ph(_mm256_loadu_ps(src + i), _MM_FROUND_TO_NEAREST_INT));
    for (; i < n; i++)
        dst[i] = cm_f32_to_fp16(src[i]);
}
#else
bool cm_half_have_f16c(void)
{
    return false;
}
#endif

void cm_fp16_to_f32_n(float *dst, const cm_fp16_t *src, size_t n)
{
#if defined(__x86_64__)
    if (cm_half_have_f16c()) {
        cm_fp16_to_f32_f16c(dst, src, n);
        return;
    }
#endif
    for (size_t i = 0; i < n; i++)
        dst[i] = cm_fp16_to_f32(src[i]);
}

void cm_f32_to_fp16_n(cm_fp16_t *dst, const float *src, size_t n)
{
#if defined(__x86_64__)
    if (cm_half_have_f16c()) {
        cm_f32_to_fp16_f16c(dst, src, n);
        return;
    }
#endif
    for (size_t i = 0; i < n; i++)
        dst[i] = cm_f32_to_fp16(src[i]);
}

void cm_bf16_to_f32_n(float *dst, const cm_bf16_t *src, size_t n)
{
    for (size_t i = 0; i < n; i++)
        dst[i] = cm_bf16_to_f32(src[i]);
}

void cm_f32_to_bf16_n(cm_bf16_t *dst, const float *src, size_t n)
{
    for (size_t i = 0; i < n; i++)
        dst[i] = cm_f32_to_bf16(src[i]);
}
