/*
 * Dequantising matmul (see mdl_quant.h).  Block layouts follow ggml:
 *   Q4_0: fp16 d, 16 bytes; x = (q - 8) * d
 *   Q4_1: fp16 d, fp16 m, 16 bytes; x = q * d + m
 *   Q8_0: fp16 d, 32 int8;  x = q * d
 *   Q5_0: fp16 d, 4 bytes of high bits, 16 bytes; x = (q - 16) * d
 * with 4-bit element j in the low nibble of byte j and element j+16 in its
 * high nibble (Q5_0: bit j of the high bits is element j's fifth bit).
 * K-quants, super-blocks of 256 (layouts in mdl_kquant_unpack below):
 *   Q4_K: fp16 d, fp16 dmin, 12 bytes of 6-bit scales/mins, 128 bytes;
 *         8 groups of 32, x = d*sc*q - dmin*mn
 *   Q6_K: 128 bytes low nibbles, 64 bytes high 2 bits, 16 int8 scales, fp16 d;
 *         16 groups of 16, x = d*sc*(q - 32)  The AVX2 paths are compiled with target attributes and chosen
 * once at run time, so the file builds for any x86-64 (and falls back to the
 * scalar code elsewhere).
 */
#include "gpuworker/model/mdl_quant.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "common/cm_alloc.h"
#include "common/cm_half.h"
#include "common/cm_status.h"
#include "gpuworker/model/mdl_quant_gemm16.h"
#include "gpuworker/model/mdl_quant_q4.h"
#include "gpuworker/model/mdl_quant_rows.h"
#include "gpuworker/model/mdl_simd.h"

#if defined(__x86_64__)
#include <immintrin.h>
#define MDL_X86 1
#endif

static CM_ALLOC_TAG(mdl_quant_tag, "model.matmul");

#define QK 32
#define QKK 256   /* K-quant super-block */
/* Decode batches up to this many rows take the quantised-activation
 * products (one weight row times the batch's rows); larger ones are
 * products as prefill's: the int16 GEMM (mdl_quant_gemm16.c) where the CPU
 * has VNNI, else the weights expanded to fp32. */
#define MDL_QROWS_MAX 4

/* How far ahead of the row being read the AVX2 decode products (int16 or
 * int8 activations) of Q8_0, Q4_0 and Q4_1 rows prefetch (bytes; past a
 * row's end is the next row's start, as the rows are consecutive).  The
 * hardware prefetcher of the 2-core AMD VM does not keep the stream ahead:
 * Gemma's 178 MB Q8_0 output head on one core 14.7-15.5 -> 10.3-10.6 ms
 * (2 KiB or 4 KiB ahead; 1 KiB: 11.7-11.9). */
#define MDL_PREFETCH_AHEAD 2048

static bool mdl_is_kquant(mdl_ggml_type_t t)
{
    return t == MDL_GGML_Q4_K || t == MDL_GGML_Q6_K;
}

static bool mdl_force_scalar;
/* How decode products take their activations (mdl_quant_set_act). */
static int mdl_act = MDL_ACT_I16;

static mdl_act_mode_t mdl_act_mode(void)
{
    return (mdl_act_mode_t)mdl_act;
}

void mdl_quant_force_scalar(bool on)
{
    mdl_force_scalar = on;
}

bool mdl_quant_have_simd(void)
{
#ifdef MDL_X86
    static int have = -1;
    if (have < 0) {
        __builtin_cpu_init();
        have = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") && __builtin_cpu_supports("f16c");
    }
    return have && !mdl_force_scalar;
#else
    return false;
#endif
}

bool mdl_quant_supported(mdl_ggml_type_t t)
{
    return t == MDL_GGML_F32 || t == MDL_GGML_F16 || t == MDL_GGML_BF16 || t == MDL_GGML_Q4_0 ||
           t == MDL_GGML_Q4_1 || t == MDL_GGML_Q8_0 || t == MDL_GGML_Q5_0 || t == MDL_GGML_Q4_K ||
           t == MDL_GGML_Q6_K;
}

ri_status_t mdl_weight_from_tensor(const mdl_gguf_tensor_t *t, mdl_weight_t *w_p)
{
    uint32_t be, bb;
    if (!mdl_quant_supported(t->type) || !mdl_ggml_type_block(t->type, &be, &bb))
        return RI_ERR_UNSUPPORTED;
    if (t->n_dims > 2 || t->ne[2] != 1 || t->ne[3] != 1)
        return RI_ERR_FORMAT;
    mdl_weight_t w = {
        .type = t->type, .rows = t->ne[1], .cols = t->ne[0], .row_bytes = t->ne[0] / be * bb, .data = t->data};
    *w_p = w;
    return RI_OK;
}

static const uint8_t *mdl_row(const mdl_weight_t *w, size_t r)
{
    return (const uint8_t *)w->data + r * w->row_bytes;
}

static float mdl_h(const uint8_t *p)
{
    uint16_t h;
    memcpy(&h, p, 2);
    return cm_fp16_to_f32(h);
}

/* ---- scalar reference ---- */

void mdl_dequant_row_ref(const mdl_weight_t *w, size_t r, float *out)
{
    const uint8_t *p = mdl_row(w, r);
    size_t n = w->cols;
    switch (w->type) {
    case MDL_GGML_F32:
        memcpy(out, p, n * 4);
        break;
    case MDL_GGML_F16:
        for (size_t i = 0; i < n; i++)
            out[i] = mdl_h(p + 2 * i);
        break;
    case MDL_GGML_BF16:
        for (size_t i = 0; i < n; i++) {
            uint16_t b;
            memcpy(&b, p + 2 * i, 2);
            out[i] = cm_bf16_to_f32(b);
        }
        break;
    case MDL_GGML_Q4_0:
        for (size_t b = 0; b < n / QK; b++, p += 18) {
            float d = mdl_h(p);
            for (int j = 0; j < 16; j++) {
                out[b * QK + j] = ((int)(p[2 + j] & 0xF) - 8) * d;
                out[b * QK + j + 16] = ((int)(p[2 + j] >> 4) - 8) * d;
            }
        }
        break;
    case MDL_GGML_Q4_1:
        for (size_t b = 0; b < n / QK; b++, p += 20) {
            float d = mdl_h(p), m = mdl_h(p + 2);
            for (int j = 0; j < 16; j++) {
                out[b * QK + j] = (p[4 + j] & 0xF) * d + m;
                out[b * QK + j + 16] = (p[4 + j] >> 4) * d + m;
            }
        }
        break;
    case MDL_GGML_Q8_0:
        for (size_t b = 0; b < n / QK; b++, p += 34) {
            float d = mdl_h(p);
            for (int j = 0; j < QK; j++)
                out[b * QK + j] = (int8_t)p[2 + j] * d;
        }
        break;
    case MDL_GGML_Q5_0:
        for (size_t b = 0; b < n / QK; b++, p += 22) {
            float d = mdl_h(p);
            uint32_t qh = (uint32_t)p[2] | (uint32_t)p[3] << 8 | (uint32_t)p[4] << 16 | (uint32_t)p[5] << 24;
            for (int j = 0; j < 16; j++) {
                int lo = (p[6 + j] & 0xF) | (int)((qh >> j) & 1) << 4;
                int hi = (p[6 + j] >> 4) | (int)((qh >> (j + 16)) & 1) << 4;
                out[b * QK + j] = (lo - 16) * d;
                out[b * QK + j + 16] = (hi - 16) * d;
            }
        }
        break;
    case MDL_GGML_Q4_K:
        for (size_t b = 0; b < n / QKK; b++, p += 144) {
            float d = mdl_h(p), dmin = mdl_h(p + 2);
            const uint8_t *sc = p + 4, *q = p + 16;
            for (int g = 0; g < 8; g++) {
                /* 6-bit scale and min of group g: groups 0-3 in the low 6
                 * bits of bytes 0-3 / 4-7; groups 4-7 split over the low or
                 * high nibble of bytes 8-11 and the top 2 bits of 0-7 */
                int s6, m6;
                if (g < 4) {
                    s6 = sc[g] & 63;
                    m6 = sc[g + 4] & 63;
                } else {
                    s6 = (sc[g + 4] & 0xF) | (sc[g - 4] >> 6) << 4;
                    m6 = (sc[g + 4] >> 4) | (sc[g] >> 6) << 4;
                }
                /* groups 2k and 2k+1 share the 32 bytes q[32k..]: low, high nibble */
                const uint8_t *qq = q + 32 * (g / 2);
                for (int l = 0; l < 32; l++) {
                    int v = g % 2 == 0 ? qq[l] & 0xF : qq[l] >> 4;
                    out[b * QKK + 32 * g + l] = d * s6 * v - dmin * m6;
                }
            }
        }
        break;
    case MDL_GGML_Q6_K:
        for (size_t b = 0; b < n / QKK; b++, p += 210) {
            const uint8_t *ql = p, *qh = p + 128;
            const int8_t *sc = (const int8_t *)(p + 192);
            float d = mdl_h(p + 208);
            for (int e = 0; e < QKK; e++) {
                /* element e: half h = e/128, quarter k = (e%128)/32, l = e%32 */
                int h = e / 128, k = (e % 128) / 32, l = e % 32;
                uint8_t lb = ql[64 * h + l + 32 * (k & 1)];
                int lo = k < 2 ? lb & 0xF : lb >> 4;
                int hi = (qh[32 * h + l] >> (2 * k)) & 3;
                out[b * QKK + e] = d * sc[8 * h + 2 * k + l / 16] * ((lo | hi << 4) - 32);
            }
        }
        break;
    default:
        memset(out, 0, n * sizeof(float));   /* unreachable: rejected at load */
        break;
    }
}

double mdl_dot_ref(const mdl_weight_t *w, size_t r, const float *x)
{
    float tmp[QK];
    double acc = 0;
    if (w->type == MDL_GGML_F32 || w->type == MDL_GGML_F16 || w->type == MDL_GGML_BF16) {
        /* one element per block: expand in pieces to keep the stack small */
        mdl_weight_t one = *w;
        for (size_t c = 0; c < w->cols; c += QK) {
            size_t m = CM_MIN((size_t)QK, w->cols - c);
            size_t es = w->type == MDL_GGML_F32 ? 4 : 2;
            one.cols = m;
            one.data = mdl_row(w, r) + c * es;
            mdl_dequant_row_ref(&one, 0, tmp);
            for (size_t j = 0; j < m; j++)
                acc += (double)tmp[j] * x[c + j];
        }
        return acc;
    }
    mdl_weight_t blk = *w;
    size_t be = mdl_is_kquant(w->type) ? QKK : QK;
    size_t bb = w->row_bytes / (w->cols / be);
    float ktmp[QKK];
    float *t = be == QK ? tmp : ktmp;
    blk.cols = be;
    for (size_t b = 0; b < w->cols / be; b++) {
        blk.data = mdl_row(w, r) + b * bb;
        mdl_dequant_row_ref(&blk, 0, t);
        for (size_t j = 0; j < be; j++)
            acc += (double)t[j] * x[b * be + j];
    }
    return acc;
}

static float mdl_dot_scalar(const mdl_weight_t *w, size_t r, const float *x)
{
    return (float)mdl_dot_ref(w, r, x);
}

void mdl_matmul_ref(const mdl_weight_t *w, const float *x, size_t n, float *y)
{
    for (size_t i = 0; i < n; i++)
        for (size_t j = 0; j < w->rows; j++)
            y[i * w->rows + j] = (float)mdl_dot_ref(w, j, x + i * w->cols);
}

/* ---- AVX2 / FMA / F16C ---- */
#ifdef MDL_X86
#define MDL_AVX2 __attribute__((target("avx2,fma,f16c")))


/* One block of Q5_0 (32 elements) or Q4_K / Q6_K (256) as int8 values and a
 * scale and offset per group of 16: x[e] = sc[e/16] * q[e] - mn[e/16].  The
 * bit unpacking is the same for every row, the multiply-adds that follow are
 * vectorised; written independently of the reference loops above, which the
 * tests compare it with. */
static size_t mdl_kquant_unpack(mdl_ggml_type_t type, const uint8_t *p, int8_t *q, float *sc, float *mn)
{
    if (type == MDL_GGML_Q5_0) {
        float d = mdl_h(p);
        uint32_t qh;
        memcpy(&qh, p + 2, 4);   /* little-endian hosts (x86-64) */
        for (int j = 0; j < 16; j++) {
            q[j] = (int8_t)(((p[6 + j] & 0xF) | ((qh >> j) & 1) << 4) - 16);
            q[j + 16] = (int8_t)(((p[6 + j] >> 4) | ((qh >> (j + 16)) & 1) << 4) - 16);
        }
        sc[0] = sc[1] = d;
        mn[0] = mn[1] = 0.0f;
        return 32;
    }
    if (type == MDL_GGML_Q4_K) {
        float d = mdl_h(p), dmin = mdl_h(p + 2);
        const uint8_t *s = p + 4, *qs = p + 16;
        uint8_t s6[8], m6[8];
        for (int g = 0; g < 4; g++) {
            s6[g] = s[g] & 63;
            m6[g] = s[g + 4] & 63;
            s6[g + 4] = (uint8_t)((s[g + 8] & 0xF) | (s[g] >> 6) << 4);
            m6[g + 4] = (uint8_t)((s[g + 8] >> 4) | (s[g + 4] >> 6) << 4);
        }
        for (int c = 0; c < 4; c++) {
            for (int l = 0; l < 32; l++) {
                q[64 * c + l] = (int8_t)(qs[32 * c + l] & 0xF);
                q[64 * c + 32 + l] = (int8_t)(qs[32 * c + l] >> 4);
            }
        }
        for (int g = 0; g < 8; g++) {
            sc[2 * g] = sc[2 * g + 1] = d * s6[g];
            mn[2 * g] = mn[2 * g + 1] = dmin * m6[g];
        }
        return 256;
    }
    /* Q6_K */
    const uint8_t *ql = p, *qh = p + 128;
    const int8_t *s = (const int8_t *)(p + 192);
    float d = mdl_h(p + 208);
    for (int h = 0; h < 2; h++, ql += 64, qh += 32) {
        int8_t *o = q + 128 * h;
        for (int l = 0; l < 32; l++) {
            o[l] = (int8_t)(((ql[l] & 0xF) | (qh[l] & 3) << 4) - 32);
            o[l + 32] = (int8_t)(((ql[l + 32] & 0xF) | ((qh[l] >> 2) & 3) << 4) - 32);
            o[l + 64] = (int8_t)(((ql[l] >> 4) | ((qh[l] >> 4) & 3) << 4) - 32);
            o[l + 96] = (int8_t)(((ql[l + 32] >> 4) | ((qh[l] >> 6) & 3) << 4) - 32);
        }
    }
    for (int g = 0; g < 16; g++) {
        sc[g] = d * s[g];
        mn[g] = 0.0f;
    }
    return 256;
}

static size_t mdl_kquant_block_bytes(mdl_ggml_type_t type)
{
    return type == MDL_GGML_Q5_0 ? 22 : type == MDL_GGML_Q4_K ? 144 : 210;
}

MDL_AVX2 static inline __m256 mdl_i8x8_ps(const int8_t *q)
{
    return _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i *)q)));
}

/* Dot product of a Q5_0 / Q4_K / Q6_K row with fp32 x. */
MDL_AVX2 static float mdl_dot_kq_avx2(const mdl_weight_t *w, size_t r, const float *x)
{
    const uint8_t *p = mdl_row(w, r);
    size_t bb = mdl_kquant_block_bytes(w->type);
    int8_t q[QKK];
    float sc[16], mn[16];
    __m256 acc = _mm256_setzero_ps(), accm = _mm256_setzero_ps();
    for (size_t c = 0; c < w->cols; p += bb) {
        size_t ne = mdl_kquant_unpack(w->type, p, q, sc, mn);
        for (size_t g = 0; g < ne / 16; g++, c += 16) {
            __m256 x0 = _mm256_loadu_ps(x + c), x1 = _mm256_loadu_ps(x + c + 8);
            __m256 s = _mm256_fmadd_ps(mdl_i8x8_ps(q + 16 * g + 8), x1, _mm256_mul_ps(mdl_i8x8_ps(q + 16 * g), x0));
            acc = _mm256_fmadd_ps(_mm256_set1_ps(sc[g]), s, acc);
            if (mn[g] != 0.0f)
                accm = _mm256_fmadd_ps(_mm256_set1_ps(mn[g]), _mm256_add_ps(x0, x1), accm);
        }
    }
    return mdl_simd_hsum8(_mm256_sub_ps(acc, accm));
}

/* 32 int8 values -> out[0..32): x = q * s - m, (s0, m0) for elements 0-15
 * and (s1, m1) for 16-31. */
MDL_AVX2 static inline void mdl_store_i8x32(float *out, __m256i v, __m256 s0, __m256 m0, __m256 s1, __m256 m1)
{
    __m128i lo = _mm256_castsi256_si128(v), hi = _mm256_extracti128_si256(v, 1);
    _mm256_storeu_ps(out, _mm256_fmsub_ps(_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(lo)), s0, m0));
    _mm256_storeu_ps(out + 8, _mm256_fmsub_ps(_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_srli_si128(lo, 8))), s0, m0));
    _mm256_storeu_ps(out + 16, _mm256_fmsub_ps(_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(hi)), s1, m1));
    _mm256_storeu_ps(out + 24, _mm256_fmsub_ps(_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_srli_si128(hi, 8))), s1, m1));
}

/* Byte j of the result is 0xFF when bit j of x is set (as ggml's
 * bytes_from_bits_32). */
MDL_AVX2 static inline __m256i mdl_bits_to_bytes(uint32_t x)
{
    const __m256i shuf = _mm256_setr_epi64x(0, 0x0101010101010101, 0x0202020202020202, 0x0303030303030303);
    __m256i b = _mm256_shuffle_epi8(_mm256_set1_epi32((int)x), shuf);
    b = _mm256_or_si256(b, _mm256_set1_epi64x(0x7fbfdfeff7fbfdfe));
    return _mm256_cmpeq_epi8(b, _mm256_set1_epi64x(-1));
}

/* Q5_0 / Q4_K / Q6_K row to fp32, every block's bits unpacked in vector
 * registers (the prefill products expand each weight row once per chunk, so
 * this runs once per row and chunk; the scalar unpacking it replaces cost a
 * quarter of a Gemma prefill). */
MDL_AVX2 static void mdl_dequant_kq_avx2(const mdl_weight_t *w, size_t r, float *out)
{
    const uint8_t *p = mdl_row(w, r);
    const __m256i m4 = _mm256_set1_epi8(0x0F);
    const __m256 zero = _mm256_setzero_ps();
    if (w->type == MDL_GGML_Q5_0) {
        const __m256i b5 = _mm256_set1_epi8(0x10), off = _mm256_set1_epi8(16);
        for (size_t b = 0; b < w->cols / QK; b++, p += 22, out += QK) {
            uint32_t qh;
            memcpy(&qh, p + 2, 4);
            __m128i raw = _mm_loadu_si128((const __m128i *)(p + 6));
            __m256i q = _mm256_and_si256(_mm256_set_m128i(_mm_srli_epi16(raw, 4), raw), m4);
            q = _mm256_or_si256(q, _mm256_and_si256(mdl_bits_to_bytes(qh), b5));
            __m256 d = _mm256_set1_ps(mdl_simd_h16(p));
            mdl_store_i8x32(out, _mm256_sub_epi8(q, off), d, zero, d, zero);
        }
        return;
    }
    if (w->type == MDL_GGML_Q4_K) {
        for (size_t b = 0; b < w->cols / QKK; b++, p += 144, out += QKK) {
            float d = mdl_simd_h16(p), dmin = mdl_simd_h16(p + 2);
            const uint8_t *s = p + 4;
            for (int c = 0; c < 4; c++) {   /* groups 2c (low nibbles) and 2c+1 (high) */
                int g = 2 * c, h = g + 1;
                int s0 = g < 4 ? s[g] & 63 : (s[g + 4] & 0xF) | (s[g - 4] >> 6) << 4;
                int n0 = g < 4 ? s[g + 4] & 63 : (s[g + 4] >> 4) | (s[g] >> 6) << 4;
                int s1 = h < 4 ? s[h] & 63 : (s[h + 4] & 0xF) | (s[h - 4] >> 6) << 4;
                int n1 = h < 4 ? s[h + 4] & 63 : (s[h + 4] >> 4) | (s[h] >> 6) << 4;
                __m256i raw = _mm256_loadu_si256((const __m256i *)(p + 16 + 32 * c));
                __m256 sc0 = _mm256_set1_ps(d * (float)s0), mn0 = _mm256_set1_ps(dmin * (float)n0);
                __m256 sc1 = _mm256_set1_ps(d * (float)s1), mn1 = _mm256_set1_ps(dmin * (float)n1);
                mdl_store_i8x32(out + 64 * c, _mm256_and_si256(raw, m4), sc0, mn0, sc0, mn0);
                mdl_store_i8x32(out + 64 * c + 32, _mm256_and_si256(_mm256_srli_epi16(raw, 4), m4), sc1, mn1, sc1,
                                mn1);
            }
        }
        return;
    }
    /* Q6_K: per half of 128, element l + 32k (k = 0..3) takes nibble k/2 of
     * ql[l + 32 (k & 1)] and bits 2k of qh[l]; a scale per 16 */
    const __m256i off = _mm256_set1_epi8(32);
    for (size_t b = 0; b < w->cols / QKK; b++, p += 210) {
        const int8_t *sc = (const int8_t *)(p + 192);
        float d = mdl_simd_h16(p + 208);
        for (int h = 0; h < 2; h++, out += 128) {
            __m256i q[4];
            mdl_simd_q6_k_half(p, h, q);
            for (int k = 0; k < 4; k++) {
                __m256 s0 = _mm256_set1_ps(d * sc[8 * h + 2 * k]), s1 = _mm256_set1_ps(d * sc[8 * h + 2 * k + 1]);
                mdl_store_i8x32(out + 32 * k, _mm256_sub_epi8(q[k], off), s0, zero, s1, zero);
            }
        }
    }
}

/* 16 bytes of nibbles -> 4 vectors of 8 floats (elements 0-7, 8-15, 16-23, 24-31). */
MDL_AVX2 static inline void mdl_unpack_q4(const uint8_t *qs, int bias, __m256 q[4])
{
    __m128i raw = _mm_loadu_si128((const __m128i *)qs);
    __m128i m4 = _mm_set1_epi8(0x0F);
    __m128i lo = _mm_and_si128(raw, m4);
    __m128i hi = _mm_and_si128(_mm_srli_epi16(raw, 4), m4);
    __m128i b = _mm_set1_epi8((char)bias);
    lo = _mm_sub_epi8(lo, b);
    hi = _mm_sub_epi8(hi, b);
    q[0] = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(lo));
    q[1] = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_srli_si128(lo, 8)));
    q[2] = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(hi));
    q[3] = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_srli_si128(hi, 8)));
}

MDL_AVX2 static inline void mdl_unpack_q8(const uint8_t *qs, __m256 q[4])
{
    for (int k = 0; k < 4; k++)
        q[k] = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i *)(qs + 8 * k))));
}

MDL_AVX2 static float mdl_dot_avx2(const mdl_weight_t *w, size_t r, const float *x)
{
    const uint8_t *p = mdl_row(w, r);
    size_t n = w->cols, nb = n / QK;
    __m256 acc = _mm256_setzero_ps(), accm = _mm256_setzero_ps();
    __m256 q[4];
    switch (w->type) {
    case MDL_GGML_Q4_0:
    case MDL_GGML_Q4_1:
    case MDL_GGML_Q8_0: {
        size_t bb = w->type == MDL_GGML_Q4_0 ? 18 : w->type == MDL_GGML_Q4_1 ? 20 : 34;
        size_t qo = w->type == MDL_GGML_Q4_1 ? 4 : 2;
        for (size_t b = 0; b < nb; b++, p += bb, x += QK) {
            if (w->type == MDL_GGML_Q8_0)
                mdl_unpack_q8(p + qo, q);
            else
                mdl_unpack_q4(p + qo, w->type == MDL_GGML_Q4_0 ? 8 : 0, q);
            __m256 x0 = _mm256_loadu_ps(x), x1 = _mm256_loadu_ps(x + 8);
            __m256 x2 = _mm256_loadu_ps(x + 16), x3 = _mm256_loadu_ps(x + 24);
            __m256 s = _mm256_mul_ps(q[0], x0);
            s = _mm256_fmadd_ps(q[1], x1, s);
            s = _mm256_fmadd_ps(q[2], x2, s);
            s = _mm256_fmadd_ps(q[3], x3, s);
            acc = _mm256_fmadd_ps(_mm256_set1_ps(mdl_simd_h16(p)), s, acc);
            if (w->type == MDL_GGML_Q4_1) {
                __m256 sx = _mm256_add_ps(_mm256_add_ps(x0, x1), _mm256_add_ps(x2, x3));
                accm = _mm256_fmadd_ps(_mm256_set1_ps(mdl_simd_h16(p + 2)), sx, accm);
            }
        }
        return mdl_simd_hsum8(_mm256_add_ps(acc, accm));
    }
    case MDL_GGML_F32:
    case MDL_GGML_F16:
    case MDL_GGML_BF16: {
        size_t i = 0;
        for (; i + 8 <= n; i += 8) {
            __m256 wv;
            if (w->type == MDL_GGML_F32)
                wv = _mm256_loadu_ps((const float *)p + i);
            else if (w->type == MDL_GGML_F16)
                wv = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(p + 2 * i)));
            else
                wv = _mm256_castsi256_ps(_mm256_slli_epi32(
                    _mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)(p + 2 * i))), 16));
            acc = _mm256_fmadd_ps(wv, _mm256_loadu_ps(x + i), acc);
        }
        float s = mdl_simd_hsum8(acc);
        if (i < n) {
            float tmp[8];
            mdl_weight_t tail = *w;
            size_t es = w->type == MDL_GGML_F32 ? 4 : 2;
            tail.cols = n - i;
            tail.data = p + i * es;
            mdl_dequant_row_ref(&tail, 0, tmp);
            for (size_t j = 0; j < n - i; j++)
                s += tmp[j] * x[i + j];
        }
        return s;
    }
    case MDL_GGML_Q5_0:
    case MDL_GGML_Q4_K:
    case MDL_GGML_Q6_K:
        return mdl_dot_kq_avx2(w, r, x);
    default:
        return 0.0f;
    }
}

MDL_AVX2 static void mdl_dequant_row_avx2(const mdl_weight_t *w, size_t r, float *out)
{
    const uint8_t *p = mdl_row(w, r);
    size_t nb = w->cols / QK;
    __m256 q[4];
    switch (w->type) {
    case MDL_GGML_Q4_0:
    case MDL_GGML_Q4_1:
    case MDL_GGML_Q8_0: {
        size_t bb = w->type == MDL_GGML_Q4_0 ? 18 : w->type == MDL_GGML_Q4_1 ? 20 : 34;
        size_t qo = w->type == MDL_GGML_Q4_1 ? 4 : 2;
        for (size_t b = 0; b < nb; b++, p += bb, out += QK) {
            if (w->type == MDL_GGML_Q8_0)
                mdl_unpack_q8(p + qo, q);
            else
                mdl_unpack_q4(p + qo, w->type == MDL_GGML_Q4_0 ? 8 : 0, q);
            __m256 d = _mm256_set1_ps(mdl_simd_h16(p));
            __m256 m = _mm256_set1_ps(w->type == MDL_GGML_Q4_1 ? mdl_simd_h16(p + 2) : 0.0f);
            for (int k = 0; k < 4; k++)
                _mm256_storeu_ps(out + 8 * k, _mm256_fmadd_ps(q[k], d, m));
        }
        return;
    }
    case MDL_GGML_Q5_0:
    case MDL_GGML_Q4_K:
    case MDL_GGML_Q6_K:
        mdl_dequant_kq_avx2(w, r, out);
        return;
    default:
        mdl_dequant_row_ref(w, r, out);
        return;
    }
}

MDL_AVX2 static float mdl_dot1_f32_avx2(const float *wr, const float *x, size_t n)
{
    __m256 a = _mm256_setzero_ps();
    size_t k = 0;
    for (; k + 8 <= n; k += 8)
        a = _mm256_fmadd_ps(_mm256_loadu_ps(wr + k), _mm256_loadu_ps(x + k), a);
    float s = mdl_simd_hsum8(a);
    for (; k < n; k++)
        s += wr[k] * x[k];
    return s;
}

/* A 3x4 block of dot products: 3 expanded weight rows (stride ws) against 4
 * activation rows (stride xs); 12 accumulators stay in registers and each
 * loaded vector feeds 3 or 4 FMAs. */
MDL_AVX2 static void mdl_dot3x4_f32_avx2(const float *w, size_t ws, const float *x, size_t xs, size_t n,
                                         float out[3][4])
{
    __m256 a00 = _mm256_setzero_ps(), a01 = a00, a02 = a00, a03 = a00;
    __m256 a10 = a00, a11 = a00, a12 = a00, a13 = a00;
    __m256 a20 = a00, a21 = a00, a22 = a00, a23 = a00;
    const float *w0 = w, *w1 = w + ws, *w2 = w + 2 * ws;
    const float *x0 = x, *x1 = x + xs, *x2 = x + 2 * xs, *x3 = x + 3 * xs;
    size_t k = 0;
    for (; k + 8 <= n; k += 8) {
        __m256 v0 = _mm256_loadu_ps(w0 + k), v1 = _mm256_loadu_ps(w1 + k), v2 = _mm256_loadu_ps(w2 + k);
        __m256 xv = _mm256_loadu_ps(x0 + k);
        a00 = _mm256_fmadd_ps(v0, xv, a00);
        a10 = _mm256_fmadd_ps(v1, xv, a10);
        a20 = _mm256_fmadd_ps(v2, xv, a20);
        xv = _mm256_loadu_ps(x1 + k);
        a01 = _mm256_fmadd_ps(v0, xv, a01);
        a11 = _mm256_fmadd_ps(v1, xv, a11);
        a21 = _mm256_fmadd_ps(v2, xv, a21);
        xv = _mm256_loadu_ps(x2 + k);
        a02 = _mm256_fmadd_ps(v0, xv, a02);
        a12 = _mm256_fmadd_ps(v1, xv, a12);
        a22 = _mm256_fmadd_ps(v2, xv, a22);
        xv = _mm256_loadu_ps(x3 + k);
        a03 = _mm256_fmadd_ps(v0, xv, a03);
        a13 = _mm256_fmadd_ps(v1, xv, a13);
        a23 = _mm256_fmadd_ps(v2, xv, a23);
    }
    out[0][0] = mdl_simd_hsum8(a00), out[0][1] = mdl_simd_hsum8(a01), out[0][2] = mdl_simd_hsum8(a02), out[0][3] = mdl_simd_hsum8(a03);
    out[1][0] = mdl_simd_hsum8(a10), out[1][1] = mdl_simd_hsum8(a11), out[1][2] = mdl_simd_hsum8(a12), out[1][3] = mdl_simd_hsum8(a13);
    out[2][0] = mdl_simd_hsum8(a20), out[2][1] = mdl_simd_hsum8(a21), out[2][2] = mdl_simd_hsum8(a22), out[2][3] = mdl_simd_hsum8(a23);
    for (; k < n; k++)
        for (int r = 0; r < 3; r++)
            for (int i = 0; i < 4; i++)
                out[r][i] += w[r * ws + k] * x[i * xs + k];
}

/* Activations quantised to int8 per 32-block (d = amax/127), as ggml's Q8
 * dot products do: decode then multiplies 4-bit/8-bit weights with integer
 * instructions (maddubs), 2-3x fewer instructions than expanding to fp32. */
MDL_AVX2 static void mdl_quant_act_avx2(const float *x, size_t n, int8_t *q, float *d, float *sum)
{
    for (size_t b = 0; b < n / QK; b++) {
        const float *xb = x + b * QK;
        __m256 v[4], mx = _mm256_setzero_ps();
        __m256 sign = _mm256_set1_ps(-0.0f);
        for (int k = 0; k < 4; k++) {
            v[k] = _mm256_loadu_ps(xb + 8 * k);
            mx = _mm256_max_ps(mx, _mm256_andnot_ps(sign, v[k]));
        }
        __m128 m4 = _mm_max_ps(_mm256_castps256_ps128(mx), _mm256_extractf128_ps(mx, 1));
        m4 = _mm_max_ps(m4, _mm_movehl_ps(m4, m4));
        m4 = _mm_max_ss(m4, _mm_movehdup_ps(m4));
        float amax = _mm_cvtss_f32(m4);
        float db = amax / 127.0f;
        __m256 inv = _mm256_set1_ps(db > 0 ? 1.0f / db : 0.0f);
        __m256i i[4];
        for (int k = 0; k < 4; k++)
            i[k] = _mm256_cvtps_epi32(_mm256_round_ps(_mm256_mul_ps(v[k], inv), _MM_FROUND_TO_NEAREST_INT));
        __m256i s = _mm256_add_epi32(_mm256_add_epi32(i[0], i[1]), _mm256_add_epi32(i[2], i[3]));
        __m128i s4 = _mm_add_epi32(_mm256_castsi256_si128(s), _mm256_extracti128_si256(s, 1));
        s4 = _mm_hadd_epi32(s4, s4);
        s4 = _mm_hadd_epi32(s4, s4);
        /* pack 32 int32 -> 32 int8 in element order */
        __m256i p01 = _mm256_packs_epi32(i[0], i[1]);
        __m256i p23 = _mm256_packs_epi32(i[2], i[3]);
        __m256i p = _mm256_packs_epi16(p01, p23);
        p = _mm256_permutevar8x32_epi32(p, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
        _mm256_storeu_si256((__m256i *)(q + b * QK), p);
        d[b] = db;
        sum[b] = db * (float)_mm_cvtsi128_si32(s4);
    }
}

MDL_AVX2 static float mdl_dot_q8act_avx2(const mdl_weight_t *w, size_t r, const int8_t *xq, const float *xd,
                                         const float *xs)
{
    const uint8_t *p = mdl_row(w, r);
    size_t nb = w->cols / QK;
    __m256 acc = _mm256_setzero_ps();
    __m256i ones = _mm256_set1_epi16(1);
    float accm = 0;
    if (w->type == MDL_GGML_Q8_0) {
        for (size_t b = 0; b < nb; b++, p += 34) {
            __m256i wq = _mm256_loadu_si256((const __m256i *)(p + 2));
            __m256i y = _mm256_loadu_si256((const __m256i *)(xq + b * QK));
            __m256i prod = _mm256_maddubs_epi16(_mm256_sign_epi8(wq, wq), _mm256_sign_epi8(y, wq));
            __m256 f = _mm256_cvtepi32_ps(_mm256_madd_epi16(prod, ones));
            acc = _mm256_fmadd_ps(_mm256_set1_ps(mdl_simd_h16(p) * xd[b]), f, acc);
        }
        return mdl_simd_hsum8(acc);
    }
    size_t bb = w->type == MDL_GGML_Q4_0 ? 18 : 20, qo = w->type == MDL_GGML_Q4_1 ? 4 : 2;
    __m128i m4 = _mm_set1_epi8(0x0F);
    for (size_t b = 0; b < nb; b++, p += bb) {
        _mm_prefetch((const char *)(p + MDL_PREFETCH_AHEAD), _MM_HINT_T0);
        __m128i raw = _mm_loadu_si128((const __m128i *)(p + qo));
        __m256i wq = _mm256_set_m128i(_mm_and_si128(_mm_srli_epi16(raw, 4), m4), _mm_and_si128(raw, m4));
        __m256i y = _mm256_loadu_si256((const __m256i *)(xq + b * QK));
        __m256 f = _mm256_cvtepi32_ps(_mm256_madd_epi16(_mm256_maddubs_epi16(wq, y), ones));
        float dw = mdl_simd_h16(p);
        acc = _mm256_fmadd_ps(_mm256_set1_ps(dw * xd[b]), f, acc);
        /* Q4_0: (q - 8) d = q d - 8 d; Q4_1: q d + m */
        accm += (w->type == MDL_GGML_Q4_1 ? mdl_simd_h16(p + 2) : -8.0f * dw) * xs[b];
    }
    return mdl_simd_hsum8(acc) + accm;
}

/* Activations as int16 per 32-block (d = amax/32767; relative error 1.5e-5,
 * invisible in the logits) with the exact fp32 block sums: the default decode
 * path.  Weights widen to int16 and multiply with madd_epi16, half the
 * instructions of expanding them to fp32. */
MDL_AVX2 static void mdl_quant_act16_avx2(const float *x, size_t n, int16_t *q, float *d, float *sum)
{
    __m256 sign = _mm256_set1_ps(-0.0f);
    for (size_t b = 0; b < n / QK; b++) {
        const float *xb = x + b * QK;
        __m256 v[4], mx = _mm256_setzero_ps(), sx = _mm256_setzero_ps();
        for (int k = 0; k < 4; k++) {
            v[k] = _mm256_loadu_ps(xb + 8 * k);
            mx = _mm256_max_ps(mx, _mm256_andnot_ps(sign, v[k]));
            sx = _mm256_add_ps(sx, v[k]);
        }
        __m128 m4 = _mm_max_ps(_mm256_castps256_ps128(mx), _mm256_extractf128_ps(mx, 1));
        m4 = _mm_max_ps(m4, _mm_movehl_ps(m4, m4));
        m4 = _mm_max_ss(m4, _mm_movehdup_ps(m4));
        float db = _mm_cvtss_f32(m4) / 32767.0f;
        __m256 inv = _mm256_set1_ps(db > 0 ? 1.0f / db : 0.0f);
        __m256i i[4];
        for (int k = 0; k < 4; k++)
            i[k] = _mm256_cvtps_epi32(_mm256_round_ps(_mm256_mul_ps(v[k], inv), _MM_FROUND_TO_NEAREST_INT));
        /* pack to int16 in element order: packs works per 128-bit lane */
        __m256i p01 = _mm256_permute4x64_epi64(_mm256_packs_epi32(i[0], i[1]), 0xD8);
        __m256i p23 = _mm256_permute4x64_epi64(_mm256_packs_epi32(i[2], i[3]), 0xD8);
        _mm256_storeu_si256((__m256i *)(q + b * QK), p01);
        _mm256_storeu_si256((__m256i *)(q + b * QK + 16), p23);
        d[b] = db;
        sum[b] = mdl_simd_hsum8(sx);
    }
}

/* Q5_0 with int16 activations: the fifth bit of element j is bit j of qh;
 * it is spread to the int16 lanes by comparing (qh & 1<<j) with 1<<j.  The
 * -16 offset goes through the exact block sum of x, as Q4_0's -8 does. */
MDL_AVX2 static float mdl_dot_q5_0_q16act_avx2(const uint8_t *p, size_t nb, const int16_t *xq, const float *xd,
                                               const float *xs)
{
    __m256 acc = _mm256_setzero_ps();
    float accm = 0;
    for (size_t b = 0; b < nb; b++, p += 22) {
        __m256i s = mdl_simd_q5_0_dot(p, _mm256_loadu_si256((const __m256i *)(xq + b * QK)),
                                      _mm256_loadu_si256((const __m256i *)(xq + b * QK + 16)));
        float dw = mdl_simd_h16(p);
        acc = _mm256_fmadd_ps(_mm256_set1_ps(dw * xd[b]), _mm256_cvtepi32_ps(s), acc);
        accm -= 16.0f * dw * xs[b];
    }
    return mdl_simd_hsum8(acc) + accm;
}

/* Q4_K with int16 activations: each 32-element group of a super-block has
 * its own 6-bit scale and min and coincides with one activation block; the
 * min goes through the block sum of x. */
MDL_AVX2 static float mdl_dot_q4_k_q16act_avx2(const uint8_t *p, size_t nsb, const int16_t *xq, const float *xd,
                                               const float *xs)
{
    const __m128i m4 = _mm_set1_epi8(0x0F);
    __m256 acc = _mm256_setzero_ps();
    float accm = 0;
    for (size_t sb = 0; sb < nsb; sb++, p += 144, xq += QKK, xd += 8, xs += 8) {
        float d = mdl_simd_h16(p), dmin = mdl_simd_h16(p + 2);
        const uint8_t *s = p + 4;
        for (int g = 0; g < 8; g++) {
            int s6 = g < 4 ? s[g] & 63 : (s[g + 4] & 0xF) | (s[g - 4] >> 6) << 4;
            int m6 = g < 4 ? s[g + 4] & 63 : (s[g + 4] >> 4) | (s[g] >> 6) << 4;
            const uint8_t *qq = p + 16 + 32 * (g / 2);   /* groups 2k, 2k+1: low, high nibbles */
            __m128i r0 = _mm_loadu_si128((const __m128i *)qq), r1 = _mm_loadu_si128((const __m128i *)(qq + 16));
            if (g & 1)
                r0 = _mm_srli_epi16(r0, 4), r1 = _mm_srli_epi16(r1, 4);
            __m256i w0 = _mm256_cvtepu8_epi16(_mm_and_si128(r0, m4)), w1 = _mm256_cvtepu8_epi16(_mm_and_si128(r1, m4));
            __m256i sum = _mm256_add_epi32(_mm256_madd_epi16(w0, _mm256_loadu_si256((const __m256i *)(xq + 32 * g))),
                                           _mm256_madd_epi16(w1, _mm256_loadu_si256((const __m256i *)(xq + 32 * g + 16))));
            acc = _mm256_fmadd_ps(_mm256_set1_ps(d * (float)s6 * xd[g]), _mm256_cvtepi32_ps(sum), acc);
            accm -= dmin * (float)m6 * xs[g];
        }
    }
    return mdl_simd_hsum8(acc) + accm;
}

/* Q6_K with int16 activations: 32-element quarter k of half h takes low or
 * high nibbles of 32 ql bytes and bits 2k, 2k+1 of 32 qh bytes; its two
 * halves of 16 have their own int8 scales.  The -32 is applied in int16. */
MDL_AVX2 static float mdl_dot_q6_k_q16act_avx2(const uint8_t *p, size_t nsb, const int16_t *xq, const float *xd)
{
    __m256 acc = _mm256_setzero_ps();
    for (size_t sb = 0; sb < nsb; sb++, p += 210) {
        const int8_t *sc = (const int8_t *)(p + 192);
        float d = mdl_simd_h16(p + 208);
        for (int b = 0; b < 8; b++, xq += QK, xd++) {
            int h = b / 4, k = b % 4;
            __m256i w[2];
            mdl_simd_q6_k_quarter(p, h, k, w);
            __m256i s0 = _mm256_madd_epi16(w[0], _mm256_loadu_si256((const __m256i *)xq));
            __m256i s1 = _mm256_madd_epi16(w[1], _mm256_loadu_si256((const __m256i *)(xq + 16)));
            acc = _mm256_fmadd_ps(_mm256_set1_ps(d * sc[8 * h + 2 * k] * xd[0]), _mm256_cvtepi32_ps(s0), acc);
            acc = _mm256_fmadd_ps(_mm256_set1_ps(d * sc[8 * h + 2 * k + 1] * xd[0]), _mm256_cvtepi32_ps(s1), acc);
        }
    }
    return mdl_simd_hsum8(acc);
}

/* ---- AVX-512BW decode products (int16 activations) ----
 * The same products as the AVX2 ones above, a 32-element block per 512-bit
 * register: one widening load and one madd per block instead of two each,
 * and two accumulators so the per-block scale FMA does not wait on the
 * previous block's (the single-accumulator AVX2 loop is bound by that
 * latency, not by memory).  Q8_0 is Gemma's output head (178 MB a step),
 * Q5_0 its Q/K/gate/up, Q4_K / Q6_K its attention output and FFN down.
 * AVX-512F/BW/DQ, on where the CPU has them unless RI_MODEL_AVX512=0. */
#define MDL_AVX512BW __attribute__((target("avx512f,avx512bw,avx512dq,avx2,fma,f16c")))

static int mdl_avx512_on = -1;   /* -1: not decided (CPU; mdl_quant_set_avx512 turns it off) */

static bool mdl_quant_use_avx512(void)
{
    if (mdl_avx512_on < 0) {
        __builtin_cpu_init();
        mdl_avx512_on = __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
                        __builtin_cpu_supports("avx512dq");
    }
    return mdl_avx512_on > 0 && mdl_quant_have_simd();
}

/* One Q8_0 block times 32 int16 activations, as 16 fp32 partial sums. */
MDL_AVX512BW static inline __m512 mdl_q8_0_blk512(const uint8_t *p, const int16_t *xq)
{
    __m512i w = _mm512_cvtepi8_epi16(_mm256_loadu_si256((const __m256i *)(p + 2)));
    return _mm512_cvtepi32_ps(_mm512_madd_epi16(w, _mm512_loadu_si512(xq)));
}

/* One Q5_0 block: the 16 bytes widened to int16 first (byte j in lane j),
 * so that the low nibbles (elements 0-15) are a mask and the high ones
 * (16-31) a shift away, then -16 where the fifth bit (bit j of qh for
 * element j, a mask register) is clear. */
MDL_AVX512BW static inline __m512 mdl_q5_0_blk512(const uint8_t *p, const int16_t *xq)
{
    uint32_t qh;
    memcpy(&qh, p + 2, 4);
    __m256i b = _mm256_cvtepu8_epi16(_mm_loadu_si128((const __m128i *)(p + 6)));
    __m512i q = _mm512_inserti64x4(_mm512_castsi256_si512(_mm256_and_si256(b, _mm256_set1_epi16(0x0F))),
                                   _mm256_srli_epi16(b, 4), 1);
    q = _mm512_mask_sub_epi16(q, (__mmask32)~qh, q, _mm512_set1_epi16(16));
    return _mm512_cvtepi32_ps(_mm512_madd_epi16(q, _mm512_loadu_si512(xq)));
}

/* Q8_0 (bb 34) or Q5_0 (bb 22) row of nb blocks with int16 activations
 * (inlined into one function per type, which a profile tells apart). */
MDL_AVX512BW static inline __attribute__((always_inline)) float mdl_dot_q8q5_q16act_avx512(const uint8_t *p, size_t nb, size_t bb, const int16_t *xq,
                                                     const float *xd)
{
    __m512 acc0 = _mm512_setzero_ps(), acc1 = _mm512_setzero_ps();
    bool q8 = bb == 34;
    size_t b = 0;
    for (; b + 2 <= nb; b += 2, p += 2 * bb) {
        __m512 s0 = q8 ? mdl_q8_0_blk512(p, xq + b * QK) : mdl_q5_0_blk512(p, xq + b * QK);
        __m512 s1 = q8 ? mdl_q8_0_blk512(p + bb, xq + b * QK + QK) : mdl_q5_0_blk512(p + bb, xq + b * QK + QK);
        acc0 = _mm512_fmadd_ps(_mm512_set1_ps(mdl_simd_h16(p) * xd[b]), s0, acc0);
        acc1 = _mm512_fmadd_ps(_mm512_set1_ps(mdl_simd_h16(p + bb) * xd[b + 1]), s1, acc1);
    }
    if (b < nb) {
        __m512 s0 = q8 ? mdl_q8_0_blk512(p, xq + b * QK) : mdl_q5_0_blk512(p, xq + b * QK);
        acc0 = _mm512_fmadd_ps(_mm512_set1_ps(mdl_simd_h16(p) * xd[b]), s0, acc0);
    }
    return _mm512_reduce_add_ps(_mm512_add_ps(acc0, acc1));
}

/* Q4_K with int16 activations: the 6-bit scales and mins of a super-block
 * unpacked with 32-bit masks (as ggml's utmp), then as 8-float vectors times
 * the activation blocks' scales and sums; each 32-byte run of nibbles gives
 * two groups (low, high nibbles), a 512-bit madd each. */
MDL_AVX512BW static float mdl_dot_q4_k_q16act_avx512(const uint8_t *p, size_t nsb, const int16_t *xq, const float *xd,
                                                     const float *xs)
{
    const __m256i m4 = _mm256_set1_epi8(0x0F);
    __m512 acc0 = _mm512_setzero_ps(), acc1 = _mm512_setzero_ps();
    __m256 accm = _mm256_setzero_ps();
    for (size_t sb = 0; sb < nsb; sb++, p += 144, xq += QKK, xd += 8, xs += 8) {
        uint32_t u[4];
        memcpy(u, p + 4, 12);
        u[3] = ((u[2] >> 4) & 0x0f0f0f0f) | (((u[1] >> 6) & 0x03030303) << 4);
        uint32_t mins_lo = u[1] & 0x3f3f3f3f;
        u[1] = (u[2] & 0x0f0f0f0f) | (((u[0] >> 6) & 0x03030303) << 4);
        u[2] = mins_lo;
        u[0] &= 0x3f3f3f3f;   /* bytes of u[0..1]: scales of groups 0-7, of u[2..3]: mins */
        __m256 scf = _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)u)));
        __m256 mnf = _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)(u + 2))));
        float sc[8];
        _mm256_storeu_ps(sc, _mm256_mul_ps(_mm256_mul_ps(scf, _mm256_set1_ps(mdl_simd_h16(p))), _mm256_loadu_ps(xd)));
        accm = _mm256_fmadd_ps(_mm256_mul_ps(mnf, _mm256_set1_ps(mdl_simd_h16(p + 2))), _mm256_loadu_ps(xs), accm);
        for (int c = 0; c < 4; c++) {
            __m256i raw = _mm256_loadu_si256((const __m256i *)(p + 16 + 32 * c));
            __m512i w0 = _mm512_cvtepu8_epi16(_mm256_and_si256(raw, m4));
            __m512i w1 = _mm512_cvtepu8_epi16(_mm256_and_si256(_mm256_srli_epi16(raw, 4), m4));
            __m512 s0 = _mm512_cvtepi32_ps(_mm512_madd_epi16(w0, _mm512_loadu_si512(xq + 64 * c)));
            __m512 s1 = _mm512_cvtepi32_ps(_mm512_madd_epi16(w1, _mm512_loadu_si512(xq + 64 * c + 32)));
            acc0 = _mm512_fmadd_ps(_mm512_set1_ps(sc[2 * c]), s0, acc0);
            acc1 = _mm512_fmadd_ps(_mm512_set1_ps(sc[2 * c + 1]), s1, acc1);
        }
    }
    return _mm512_reduce_add_ps(_mm512_add_ps(acc0, acc1)) - mdl_simd_hsum8(accm);
}

/* The scales of the two 16-element groups of a Q6_K 32-element run, d sc[0]
 * in lanes 0-7 and d sc[1] in lanes 8-15 (the madd's lanes of each group). */
MDL_AVX512BW static inline __m512 mdl_q6_k_wscale(float d, const int8_t *sc)
{
    return _mm512_insertf32x8(_mm512_set1_ps(d * sc[0]), _mm256_set1_ps(d * sc[1]), 1);
}

/* Q6_K with int16 activations: quarter k of half h (32 elements) built in
 * 256-bit byte operations as mdl_dequant_kq_avx2 does, widened, -32 in
 * int16; the madd's lanes 0-7 cover its first 16 elements (scale 2k of the
 * half), lanes 8-15 the next 16, so the scale vector is two broadcasts. */
MDL_AVX512BW static float mdl_dot_q6_k_q16act_avx512(const uint8_t *p, size_t nsb, const int16_t *xq, const float *xd)
{
    const __m512i off = _mm512_set1_epi16(32);
    __m512 acc0 = _mm512_setzero_ps(), acc1 = _mm512_setzero_ps();
    for (size_t sb = 0; sb < nsb; sb++, p += 210) {
        const int8_t *sc = (const int8_t *)(p + 192);
        float d = mdl_simd_h16(p + 208);
        for (int h = 0; h < 2; h++, xq += 128, xd += 4) {
            __m256i q[4];
            mdl_simd_q6_k_half(p, h, q);
            for (int k = 0; k < 4; k++) {
                __m512i w = _mm512_sub_epi16(_mm512_cvtepu8_epi16(q[k]), off);
                __m512 s = _mm512_cvtepi32_ps(_mm512_madd_epi16(w, _mm512_loadu_si512(xq + 32 * k)));
                /* (d sc) xd, the order the batch kernel shares (mdl_dotn_q6_k_avx512) */
                __m512 scv = _mm512_mul_ps(mdl_q6_k_wscale(d, sc + 8 * h + 2 * k), _mm512_set1_ps(xd[k]));
                if (k & 1)
                    acc1 = _mm512_fmadd_ps(scv, s, acc1);
                else
                    acc0 = _mm512_fmadd_ps(scv, s, acc0);
            }
        }
    }
    return _mm512_reduce_add_ps(_mm512_add_ps(acc0, acc1));
}

MDL_AVX512BW static float mdl_dot_q8_0_q16act_avx512(const uint8_t *p, size_t nb, const int16_t *xq, const float *xd)
{
    return mdl_dot_q8q5_q16act_avx512(p, nb, 34, xq, xd);
}

MDL_AVX512BW static float mdl_dot_q5_0_q16act_avx512(const uint8_t *p, size_t nb, const int16_t *xq, const float *xd)
{
    return mdl_dot_q8q5_q16act_avx512(p, nb, 22, xq, xd);
}

/* ---- decode batches: one weight row times N activation rows ----
 * A batch of N <= MDL_QROWS_MAX sequences decodes through the same int16
 * products as one: each weight block is unpacked once and multiplied with
 * the N activation rows (xq + i * cols, scales xd + i * nb, block sums
 * xs + i * nb), so a step of N sequences reads and unpacks the weights
 * once, where N separate products unpack them N times and the fp32 path
 * of prefill expands them to fp32.  The per-row arithmetic is the one-row
 * kernels' exactly (same order of operations per row), so a row's result
 * does not depend on the batch it is in. */
/* Unpacked Q8_0 / Q5_0 block b of a row: 32 int16 weights. */
MDL_AVX512BW static inline __m512i mdl_q8_0_w512(const uint8_t *p)
{
    return _mm512_cvtepi8_epi16(_mm256_loadu_si256((const __m256i *)(p + 2)));
}

MDL_AVX512BW static inline __m512i mdl_q5_0_w512(const uint8_t *p)
{
    uint32_t qh;
    memcpy(&qh, p + 2, 4);
    __m256i b = _mm256_cvtepu8_epi16(_mm_loadu_si128((const __m128i *)(p + 6)));
    __m512i q = _mm512_inserti64x4(_mm512_castsi256_si512(_mm256_and_si256(b, _mm256_set1_epi16(0x0F))),
                                   _mm256_srli_epi16(b, 4), 1);
    return _mm512_mask_sub_epi16(q, (__mmask32)~qh, q, _mm512_set1_epi16(16));
}

/* Q8_0 (bb 34) or Q5_0 (bb 22), N rows of activations; the one-row
 * kernel's two-accumulator order (even blocks, odd blocks) kept per row. */
MDL_AVX512BW static inline __attribute__((always_inline)) void
mdl_dotn_q8q5_avx512(const uint8_t *p, size_t nb, size_t bb, const int16_t *xq, const float *xd, size_t cols,
                     int N, float *out)
{
    __m512 acc0[MDL_QROWS_MAX], acc1[MDL_QROWS_MAX];
    size_t nbx = cols / QK, b = 0;
    for (int i = 0; i < N; i++)
        acc0[i] = acc1[i] = _mm512_setzero_ps();
    for (; b + 2 <= nb; b += 2, p += 2 * bb) {
        __m512i w0 = bb == 34 ? mdl_q8_0_w512(p) : mdl_q5_0_w512(p);
        __m512i w1 = bb == 34 ? mdl_q8_0_w512(p + bb) : mdl_q5_0_w512(p + bb);
        float d0 = mdl_simd_h16(p), d1 = mdl_simd_h16(p + bb);
        for (int i = 0; i < N; i++) {
            const int16_t *x = xq + i * cols + b * QK;
            __m512 s0 = _mm512_cvtepi32_ps(_mm512_madd_epi16(w0, _mm512_loadu_si512(x)));
            __m512 s1 = _mm512_cvtepi32_ps(_mm512_madd_epi16(w1, _mm512_loadu_si512(x + QK)));
            acc0[i] = _mm512_fmadd_ps(_mm512_set1_ps(d0 * xd[i * nbx + b]), s0, acc0[i]);
            acc1[i] = _mm512_fmadd_ps(_mm512_set1_ps(d1 * xd[i * nbx + b + 1]), s1, acc1[i]);
        }
    }
    if (b < nb) {
        __m512i w0 = bb == 34 ? mdl_q8_0_w512(p) : mdl_q5_0_w512(p);
        float d0 = mdl_simd_h16(p);
        for (int i = 0; i < N; i++) {
            __m512 s0 = _mm512_cvtepi32_ps(_mm512_madd_epi16(w0, _mm512_loadu_si512(xq + i * cols + b * QK)));
            acc0[i] = _mm512_fmadd_ps(_mm512_set1_ps(d0 * xd[i * nbx + b]), s0, acc0[i]);
        }
    }
    for (int i = 0; i < N; i++)
        out[i] = _mm512_reduce_add_ps(_mm512_add_ps(acc0[i], acc1[i]));
}

/* Q4_K, N rows (the one-row kernel's scales, mins and accumulators per row). */
MDL_AVX512BW static inline __attribute__((always_inline)) void
mdl_dotn_q4_k_avx512(const uint8_t *p, size_t nsb, const int16_t *xq, const float *xd, const float *xs, size_t cols,
                     int N, float *out)
{
    const __m256i m4 = _mm256_set1_epi8(0x0F);
    size_t nbx = cols / QK;
    __m512 acc0[MDL_QROWS_MAX], acc1[MDL_QROWS_MAX];
    __m256 accm[MDL_QROWS_MAX];
    for (int i = 0; i < N; i++) {
        acc0[i] = acc1[i] = _mm512_setzero_ps();
        accm[i] = _mm256_setzero_ps();
    }
    for (size_t sb = 0; sb < nsb; sb++, p += 144) {
        uint32_t u[4];
        memcpy(u, p + 4, 12);
        u[3] = ((u[2] >> 4) & 0x0f0f0f0f) | (((u[1] >> 6) & 0x03030303) << 4);
        uint32_t mins_lo = u[1] & 0x3f3f3f3f;
        u[1] = (u[2] & 0x0f0f0f0f) | (((u[0] >> 6) & 0x03030303) << 4);
        u[2] = mins_lo;
        u[0] &= 0x3f3f3f3f;
        __m256 scf = _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)u)));
        __m256 mnf = _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)(u + 2))));
        __m256 scd = _mm256_mul_ps(scf, _mm256_set1_ps(mdl_simd_h16(p)));
        __m256 mnd = _mm256_mul_ps(mnf, _mm256_set1_ps(mdl_simd_h16(p + 2)));
        float sc[MDL_QROWS_MAX][8];
        for (int i = 0; i < N; i++) {
            const float *xdi = xd + i * nbx + sb * 8, *xsi = xs + i * nbx + sb * 8;
            _mm256_storeu_ps(sc[i], _mm256_mul_ps(scd, _mm256_loadu_ps(xdi)));
            accm[i] = _mm256_fmadd_ps(mnd, _mm256_loadu_ps(xsi), accm[i]);
        }
        for (int c = 0; c < 4; c++) {
            __m256i raw = _mm256_loadu_si256((const __m256i *)(p + 16 + 32 * c));
            __m512i w0 = _mm512_cvtepu8_epi16(_mm256_and_si256(raw, m4));
            __m512i w1 = _mm512_cvtepu8_epi16(_mm256_and_si256(_mm256_srli_epi16(raw, 4), m4));
            for (int i = 0; i < N; i++) {
                const int16_t *x = xq + i * cols + sb * QKK + 64 * c;
                __m512 s0 = _mm512_cvtepi32_ps(_mm512_madd_epi16(w0, _mm512_loadu_si512(x)));
                __m512 s1 = _mm512_cvtepi32_ps(_mm512_madd_epi16(w1, _mm512_loadu_si512(x + 32)));
                acc0[i] = _mm512_fmadd_ps(_mm512_set1_ps(sc[i][2 * c]), s0, acc0[i]);
                acc1[i] = _mm512_fmadd_ps(_mm512_set1_ps(sc[i][2 * c + 1]), s1, acc1[i]);
            }
        }
    }
    for (int i = 0; i < N; i++)
        out[i] = _mm512_reduce_add_ps(_mm512_add_ps(acc0[i], acc1[i])) - mdl_simd_hsum8(accm[i]);
}

/* Q6_K, N rows. */
MDL_AVX512BW static inline __attribute__((always_inline)) void
mdl_dotn_q6_k_avx512(const uint8_t *p, size_t nsb, const int16_t *xq, const float *xd, size_t cols, int N,
                     float *out)
{
    const __m512i off = _mm512_set1_epi16(32);
    size_t nbx = cols / QK;
    __m512 acc0[MDL_QROWS_MAX], acc1[MDL_QROWS_MAX];
    for (int i = 0; i < N; i++)
        acc0[i] = acc1[i] = _mm512_setzero_ps();
    for (size_t sb = 0; sb < nsb; sb++, p += 210) {
        const int8_t *sc = (const int8_t *)(p + 192);
        float d = mdl_simd_h16(p + 208);
        for (int h = 0; h < 2; h++) {
            __m256i q[4];
            mdl_simd_q6_k_half(p, h, q);
            for (int k = 0; k < 4; k++) {
                __m512i w = _mm512_sub_epi16(_mm512_cvtepu8_epi16(q[k]), off);
                __m512 wsc = mdl_q6_k_wscale(d, sc + 8 * h + 2 * k);
                size_t blk = sb * 8 + (size_t)h * 4 + (size_t)k;
                for (int i = 0; i < N; i++) {
                    __m512 s = _mm512_cvtepi32_ps(_mm512_madd_epi16(w, _mm512_loadu_si512(xq + i * cols + blk * QK)));
                    __m512 scv = _mm512_mul_ps(wsc, _mm512_set1_ps(xd[i * nbx + blk]));
                    if (k & 1)
                        acc1[i] = _mm512_fmadd_ps(scv, s, acc1[i]);
                    else
                        acc0[i] = _mm512_fmadd_ps(scv, s, acc0[i]);
                }
            }
        }
    }
    for (int i = 0; i < N; i++)
        out[i] = _mm512_reduce_add_ps(_mm512_add_ps(acc0[i], acc1[i]));
}

/* Row r of w times N activation rows, one function per (type, N) so that
 * each accumulator set stays in registers. */
#define MDL_DOTN_FNS(N)                                                                                          \
    MDL_AVX512BW static void mdl_dot##N##_q8_0_avx512(const uint8_t *p, size_t nb, const int16_t *xq,            \
                                                      const float *xd, const float *xs, size_t cols, float *out) \
    {                                                                                                            \
        (void)xs;                                                                                                \
        mdl_dotn_q8q5_avx512(p, nb, 34, xq, xd, cols, N, out);                                                   \
    }                                                                                                            \
    MDL_AVX512BW static void mdl_dot##N##_q5_0_avx512(const uint8_t *p, size_t nb, const int16_t *xq,            \
                                                      const float *xd, const float *xs, size_t cols, float *out) \
    {                                                                                                            \
        (void)xs;                                                                                                \
        mdl_dotn_q8q5_avx512(p, nb, 22, xq, xd, cols, N, out);                                                   \
    }                                                                                                            \
    MDL_AVX512BW static void mdl_dot##N##_q4_k_avx512(const uint8_t *p, size_t nb, const int16_t *xq,            \
                                                      const float *xd, const float *xs, size_t cols, float *out) \
    {                                                                                                            \
        mdl_dotn_q4_k_avx512(p, nb * QK / QKK, xq, xd, xs, cols, N, out);                                        \
    }                                                                                                            \
    MDL_AVX512BW static void mdl_dot##N##_q6_k_avx512(const uint8_t *p, size_t nb, const int16_t *xq,            \
                                                      const float *xd, const float *xs, size_t cols, float *out) \
    {                                                                                                            \
        (void)xs;                                                                                                \
        mdl_dotn_q6_k_avx512(p, nb * QK / QKK, xq, xd, cols, N, out);                                            \
    }
MDL_DOTN_FNS(2)
MDL_DOTN_FNS(3)
MDL_DOTN_FNS(4)

typedef void (*mdl_dotn_fn_t)(const uint8_t *p, size_t nb, const int16_t *xq, const float *xd, const float *xs,
                              size_t cols, float *out);

/* The N-row kernel for w (2 <= n <= MDL_QROWS_MAX), or NULL where there is
 * none (no AVX-512, another type): the caller goes row by row. */
static mdl_dotn_fn_t mdl_dotn_q16act(const mdl_weight_t *w, size_t n)
{
    static const mdl_dotn_fn_t fns[4][MDL_QROWS_MAX + 1] = {
        {NULL, NULL, mdl_dot2_q8_0_avx512, mdl_dot3_q8_0_avx512, mdl_dot4_q8_0_avx512},
        {NULL, NULL, mdl_dot2_q5_0_avx512, mdl_dot3_q5_0_avx512, mdl_dot4_q5_0_avx512},
        {NULL, NULL, mdl_dot2_q4_k_avx512, mdl_dot3_q4_k_avx512, mdl_dot4_q4_k_avx512},
        {NULL, NULL, mdl_dot2_q6_k_avx512, mdl_dot3_q6_k_avx512, mdl_dot4_q6_k_avx512},
    };
    if (n < 2 || n > MDL_QROWS_MAX || !mdl_quant_use_avx512())
        return NULL;
    switch (w->type) {
    case MDL_GGML_Q8_0: return fns[0][n];
    case MDL_GGML_Q5_0: return fns[1][n];
    case MDL_GGML_Q4_K: return fns[2][n];
    case MDL_GGML_Q6_K: return fns[3][n];
    default: return NULL;
    }
}

MDL_AVX2 static float mdl_dot_q16act_avx2(const mdl_weight_t *w, size_t r, const int16_t *xq, const float *xd,
                                          const float *xs)
{
    const uint8_t *p = mdl_row(w, r);
    size_t nb = w->cols / QK;
    __m256 acc = _mm256_setzero_ps();
    float accm = 0;
    if (w->type == MDL_GGML_Q8_0 && mdl_quant_use_avx512())
        return mdl_dot_q8_0_q16act_avx512(p, nb, xq, xd);
    if (w->type == MDL_GGML_Q5_0 && mdl_quant_use_avx512())
        return mdl_dot_q5_0_q16act_avx512(p, nb, xq, xd);
    if (w->type == MDL_GGML_Q4_K && mdl_quant_use_avx512())
        return mdl_dot_q4_k_q16act_avx512(p, w->cols / QKK, xq, xd, xs);
    if (w->type == MDL_GGML_Q6_K && mdl_quant_use_avx512())
        return mdl_dot_q6_k_q16act_avx512(p, w->cols / QKK, xq, xd);
    if (w->type == MDL_GGML_Q5_0)
        return mdl_dot_q5_0_q16act_avx2(p, nb, xq, xd, xs);
    if (w->type == MDL_GGML_Q4_K)
        return mdl_dot_q4_k_q16act_avx2(p, w->cols / QKK, xq, xd, xs);
    if (w->type == MDL_GGML_Q6_K)
        return mdl_dot_q6_k_q16act_avx2(p, w->cols / QKK, xq, xd);
    if (w->type == MDL_GGML_Q8_0) {
        for (size_t b = 0; b < nb; b++, p += 34) {
            _mm_prefetch((const char *)(p + MDL_PREFETCH_AHEAD), _MM_HINT_T0);
            __m256i w0 = _mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i *)(p + 2)));
            __m256i w1 = _mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i *)(p + 18)));
            __m256i s = _mm256_add_epi32(_mm256_madd_epi16(w0, _mm256_loadu_si256((const __m256i *)(xq + b * QK))),
                                         _mm256_madd_epi16(w1, _mm256_loadu_si256((const __m256i *)(xq + b * QK + 16))));
            acc = _mm256_fmadd_ps(_mm256_set1_ps(mdl_simd_h16(p) * xd[b]), _mm256_cvtepi32_ps(s), acc);
        }
        return mdl_simd_hsum8(acc);
    }
    size_t bb = w->type == MDL_GGML_Q4_0 ? 18 : 20, qo = w->type == MDL_GGML_Q4_1 ? 4 : 2;
    __m128i m4 = _mm_set1_epi8(0x0F);
    for (size_t b = 0; b < nb; b++, p += bb) {
        _mm_prefetch((const char *)(p + MDL_PREFETCH_AHEAD), _MM_HINT_T0);
        __m128i raw = _mm_loadu_si128((const __m128i *)(p + qo));
        __m256i lo = _mm256_cvtepu8_epi16(_mm_and_si128(raw, m4));                     /* elements 0..15 */
        __m256i hi = _mm256_cvtepu8_epi16(_mm_and_si128(_mm_srli_epi16(raw, 4), m4));  /* 16..31 */
        __m256i s = _mm256_add_epi32(_mm256_madd_epi16(lo, _mm256_loadu_si256((const __m256i *)(xq + b * QK))),
                                     _mm256_madd_epi16(hi, _mm256_loadu_si256((const __m256i *)(xq + b * QK + 16))));
        float dw = mdl_simd_h16(p);
        acc = _mm256_fmadd_ps(_mm256_set1_ps(dw * xd[b]), _mm256_cvtepi32_ps(s), acc);
        /* Q4_0: (q - 8) d = q d - 8 d; Q4_1: q d + m; times the exact block
         * sum of x, fused as in the four-row Q4_1 kernel (same bits) */
        accm = fmaf(w->type == MDL_GGML_Q4_1 ? mdl_simd_h16(p + 2) : -8.0f * dw, xs[b], accm);
    }
    return mdl_simd_hsum8(acc) + accm;
}
#endif /* MDL_X86 */

void mdl_dequant_row(const mdl_weight_t *w, size_t r, float *out)
{
#ifdef MDL_X86
    if (mdl_quant_have_simd()) {
        mdl_dequant_row_avx2(w, r, out);
        return;
    }
#endif
    mdl_dequant_row_ref(w, r, out);
}

float mdl_dot(const mdl_weight_t *w, size_t r, const float *x)
{
#ifdef MDL_X86
    if (mdl_quant_have_simd())
        return mdl_dot_avx2(w, r, x);
#endif
    return mdl_dot_scalar(w, r, x);
}

#define MDL_MM_MAX 4   /* weights in one fused product */

typedef struct mdl_mm_job {
    const mdl_weight_t *const *w; /* the weights (same cols) */
    float *const *y;        /* their outputs: n rows of w[k]->rows */
    size_t nw;              /* how many */
    size_t g_end[MDL_MM_MAX]; /* cumulative row-group counts (grows rows per group) */
    size_t grows;           /* rows per group: 3, or MDL_G16_TILE on the int16 GEMM */
    const float *x;         /* n rows of cols */
    size_t n;               /* activation rows */
    float *scratch;         /* per worker: 3 * cols floats */
    bool simd;              /* AVX2 available */
    const int8_t *xq;       /* decode: activations as int8 blocks, or NULL */
    const int16_t *xq16;    /* decode: activations as int16 blocks, or NULL */
    const int16_t *xq16p;   /* the same in mdl_q4_pairs_layout (AVX-512 Q4_1 products), or NULL */
    const float *xds;       /* with xq16p: each block's xd, xs side by side */
    const float *xd, *xs;   /* their block scales and block sums */
    uint8_t *g16;           /* prefill on the int16 GEMM: per-worker scratch, or NULL */
    size_t g16_bytes;       /* its size per worker */
} mdl_mm_job_t;

#ifdef MDL_X86
/* Decode with int16 activations, AVX2: output rows [r0, r1) of a Q5_0,
 * Q4_1, Q4_K or Q6_K weight four at a time for each activation row (mdl_quant_rows.h);
 * returns the first row left (fewer than four) for the one-row kernel. */
static size_t mdl_mm_rows4(const mdl_mm_job_t *j, const mdl_weight_t *w, float *yout, size_t r0, size_t r1)
{
    size_t cols = w->cols, rows = w->rows, nb = cols / QK, r = r0;
    for (; r + MDL_ROWS4 <= r1; r += MDL_ROWS4)
        for (size_t i = 0; i < j->n; i++) {
            float o[MDL_ROWS4];
            const int16_t *xq = j->xq16 + i * cols;
            const float *xd = j->xd + i * nb, *xs = j->xs + i * nb;
            if (w->type == MDL_GGML_Q5_0)
                mdl_dot4_q5_0_q16act_avx2(mdl_row(w, r), w->row_bytes, nb, xq, xd, xs, o);
            else if (w->type == MDL_GGML_Q4_1)
                mdl_dot4_q4_1_q16act_avx2(mdl_row(w, r), w->row_bytes, nb, xq, xd, xs, o);
            else if (w->type == MDL_GGML_Q4_K)
                mdl_dot4_q4_k_q16act_avx2(mdl_row(w, r), w->row_bytes, cols / QKK, xq, xd, xs, o);
            else
                mdl_dot4_q6_k_q16act_avx2(mdl_row(w, r), w->row_bytes, cols / QKK, xq, xd, o);
            memcpy(yout + i * rows + r, o, sizeof(o));
        }
    return r;
}
#endif

/* Output rows [grows*g0, grows*g1) of one weight. */
static void mdl_mm_rows_one(mdl_mm_job_t *j, const mdl_weight_t *w, float *yout, size_t g0, size_t g1,
                            unsigned worker)
{
    size_t cols = w->cols, rows = w->rows;
    size_t r0 = g0 * j->grows, r1 = CM_MIN(g1 * j->grows, rows);
    if (j->g16 != NULL && mdl_gemm16_type(w->type)) {
        mdl_gemm16_rows(w, r0, r1, j->xq16, j->xd, j->xs, j->n, yout, j->g16 + (size_t)worker * j->g16_bytes);
        return;
    }
    if (j->scratch == NULL) {
        /* decode: fused expand-and-dot, each weight byte read once */
#ifdef MDL_X86
        if (j->xq16 != NULL) {
            size_t nb = cols / QK;
            mdl_dotn_fn_t fn = mdl_dotn_q16act(w, j->n);
            float o[MDL_QROWS_MAX];
            size_t r = r0;
            if (fn == NULL && !mdl_quant_use_avx512() &&
                (w->type == MDL_GGML_Q5_0 || w->type == MDL_GGML_Q4_1 || w->type == MDL_GGML_Q4_K ||
                 w->type == MDL_GGML_Q6_K))
                r = mdl_mm_rows4(j, w, yout, r0, r1);
            for (; r < r1; r++) {
                if (fn != NULL) {
                    fn(mdl_row(w, r), nb, j->xq16, j->xd, j->xs, cols, o);
                    for (size_t i = 0; i < j->n; i++)
                        yout[i * rows + r] = o[i];
                    continue;
                }
                if (w->type == MDL_GGML_Q4_1 && j->xq16p != NULL) {
                    for (size_t i = 0; i < j->n; i++)
                        yout[i * rows + r] =
                            mdl_dot_q4_1_q16act_avx512(mdl_row(w, r), nb, j->xq16p + i * cols, j->xds + 2 * i * nb);
                    continue;
                }
                for (size_t i = 0; i < j->n; i++)
                    yout[i * rows + r] =
                        mdl_dot_q16act_avx2(w, r, j->xq16 + i * cols, j->xd + i * nb, j->xs + i * nb);
            }
            return;
        }
        if (j->xq != NULL) {
            size_t nb = cols / QK;
            for (size_t r = r0; r < r1; r++)
                for (size_t i = 0; i < j->n; i++)
                    yout[i * rows + r] = mdl_dot_q8act_avx2(w, r, j->xq + i * cols, j->xd + i * nb, j->xs + i * nb);
            return;
        }
#endif
        for (size_t r = r0; r < r1; r++)
            for (size_t i = 0; i < j->n; i++)
                yout[i * rows + r] = mdl_dot(w, r, j->x + i * cols);
        return;
    }
    float *wr = j->scratch + (size_t)worker * cols * 3;
    for (size_t r = r0; r < r1; r += 3) {
        size_t nr = CM_MIN((size_t)3, r1 - r);
        for (size_t t = 0; t < nr; t++)
            mdl_dequant_row(w, r + t, wr + t * cols);
        size_t i = 0;
#ifdef MDL_X86
        if (j->simd && nr == 3) {
            float o[3][4];
            for (; i + 4 <= j->n; i += 4) {
                mdl_dot3x4_f32_avx2(wr, cols, j->x + i * cols, cols, cols, o);
                for (int t = 0; t < 3; t++)
                    for (int u = 0; u < 4; u++)
                        yout[(i + u) * rows + r + t] = o[t][u];
            }
        }
        if (j->simd) {
            for (size_t t = 0; t < nr; t++)
                for (size_t ii = i; ii < j->n; ii++)
                    yout[ii * rows + r + t] = mdl_dot1_f32_avx2(wr + t * cols, j->x + ii * cols, cols);
            continue;
        }
#endif
        for (size_t t = 0; t < nr; t++)
            for (size_t ii = i; ii < j->n; ii++) {
                float s = 0;
                for (size_t k = 0; k < cols; k++)
                    s += wr[t * cols + k] * j->x[ii * cols + k];
                yout[ii * rows + r + t] = s;
            }
    }
}

/* Global row groups [begin, end) over the concatenated weights. */
static void mdl_mm_rows(void *arg, size_t begin, size_t end, unsigned worker)
{
    mdl_mm_job_t *j = arg;
    size_t base = 0;
    for (size_t k = 0; k < j->nw && begin < end; k++) {
        size_t e = j->g_end[k];
        if (begin < e) {
            size_t stop = CM_MIN(end, e);
            mdl_mm_rows_one(j, j->w[k], j->y[k], begin - base, stop - base, worker);
            begin = stop;
        }
        base = e;
    }
}

/* Products under this many multiply-adds run on the calling thread: waking
 * the pool costs more than it saves (decode of small layers, busy CPUs).
 * While the pool's workers spin between loops (a core to spare), handing a
 * loop out costs about a microsecond and a quarter of that splits well
 * (SmolLM2's 576x576 attention output: 18 -> 10 us on two threads). */
static size_t mdl_par_min = 512 * 1024;   /* mdl_quant_set_par_min */

static size_t mdl_par_min_macs(const cm_pool_t *pool)
{
    return cm_pool_spinning(pool) ? mdl_par_min / 4 : mdl_par_min;
}

void mdl_quant_set_par_min(size_t macs)
{
    mdl_par_min = macs > 0 ? macs : 512 * 1024;
}

/* The n activation rows quantised once per product for the integer paths
 * (int8 or int16 per 32-block, with block scales and sums) into *buf_p
 * (caller frees with cm_free); sets j->xq or j->xq16, j->xd, j->xs, and with
 * q4p also the regrouped int16 copy of the AVX-512 Q4_1 decode product
 * (j->xq16p, j->xds). */
static ri_status_t mdl_mm_quant_act(mdl_mm_job_t *j, const float *x, size_t n, size_t cols, bool i8, bool q4p,
                                    void **buf_p)
{
#ifdef MDL_X86
    size_t nb = cols / QK;
    void *qbuf = cm_malloc(&mdl_quant_tag, n * (q4p ? 2 : 1) * (2 * cols + 2 * nb * sizeof(float)) + 64);
    if (qbuf == NULL)
        return RI_ERR_NOMEM;
    float *xd = qbuf, *xs = xd + n * nb;
    j->xd = xd, j->xs = xs;
    if (i8) {
        int8_t *xq = (int8_t *)(xs + n * nb);
        for (size_t i = 0; i < n; i++)
            mdl_quant_act_avx2(x + i * cols, cols, xq + i * cols, xd + i * nb, xs + i * nb);
        j->xq = xq;
    } else {
        int16_t *xq = (int16_t *)(xs + n * nb);
        for (size_t i = 0; i < n; i++)
            mdl_quant_act16_avx2(x + i * cols, cols, xq + i * cols, xd + i * nb, xs + i * nb);
        j->xq16 = xq;
        if (q4p) {
            float *xds = (float *)(xq + n * cols);
            int16_t *xp = (int16_t *)(xds + 2 * n * nb);
            for (size_t i = 0; i < n; i++)
                mdl_q4_pairs_layout(xq + i * cols, xd + i * nb, xs + i * nb, cols, xp + i * cols, xds + 2 * i * nb);
            j->xq16p = xp, j->xds = xds;
        }
    }
    *buf_p = qbuf;
    return RI_OK;
#else
    (void)j, (void)x, (void)n, (void)cols, (void)i8, (void)q4p, (void)buf_p;
    return RI_ERR_UNSUPPORTED;   /* unreachable: the integer paths need x86-64 */
#endif
}

ri_status_t mdl_matmul_multi(cm_pool_t *pool, const mdl_weight_t *const *w, size_t nw, const float *x, size_t n,
                             float *const *y)
{
    if (nw == 0 || nw > MDL_MM_MAX)
        return RI_ERR_INVALID;
    mdl_mm_job_t j = {.w = w, .y = y, .nw = nw, .x = x, .n = n, .simd = mdl_quant_have_simd()};
    size_t cols = w[0]->cols, groups = 0, macs = 0;
    bool q8able = true, q16able = true;   /* weight types the integer decode paths take */
    bool g16any = false, g16all = true;   /* ... and the int16 prefill GEMM */
    bool has_q4_1 = false;
    for (size_t k = 0; k < nw; k++) {
        if (w[k]->cols != cols)
            return RI_ERR_INVALID;
        macs += w[k]->rows * cols * n;
        has_q4_1 = has_q4_1 || w[k]->type == MDL_GGML_Q4_1;
        q8able = q8able && (w[k]->type == MDL_GGML_Q4_0 || w[k]->type == MDL_GGML_Q4_1 || w[k]->type == MDL_GGML_Q8_0);
        q16able = q16able && (w[k]->type == MDL_GGML_Q4_0 || w[k]->type == MDL_GGML_Q4_1 ||
                              w[k]->type == MDL_GGML_Q8_0 || w[k]->type == MDL_GGML_Q5_0 ||
                              w[k]->type == MDL_GGML_Q4_K || w[k]->type == MDL_GGML_Q6_K);
        g16any = g16any || mdl_quant_gemm16_active(w[k]->type);
        g16all = g16all && mdl_quant_gemm16_active(w[k]->type);
    }
    /* int8 where the weights have an int8 path, else int16 where they have
     * one (Gemma's Q5_0/K-quants under --act i8), else fp32 */
    bool use_i8 = mdl_act_mode() == MDL_ACT_I8 && q8able;
    bool use_i16 = !use_i8 && mdl_act_mode() != MDL_ACT_F32 && q16able;
    /* prefill: the int16 GEMM for the weights it takes, fp32 for the rest */
    bool use_g16 = n > MDL_QROWS_MAX && j.simd && g16any;
    /* decode on the integer paths: groups of the four rows mdl_mm_rows4
     * takes at once; the fp32 expansion: the 3-row kernel's */
    bool int_decode = !use_g16 && j.simd && (use_i8 || use_i16) && n <= MDL_QROWS_MAX;
    j.grows = use_g16 ? MDL_G16_TILE : int_decode ? MDL_ROWS4 : 3;
    for (size_t k = 0; k < nw; k++) {
        groups += (w[k]->rows + j.grows - 1) / j.grows;
        j.g_end[k] = groups;
    }
    if (macs < mdl_par_min_macs(pool))
        pool = NULL;
    unsigned nt = pool != NULL ? cm_pool_size(pool) : 1;
    size_t grain = CM_MAX((size_t)(use_g16 ? 1 : 2), groups / ((size_t)nt * 8));
    ri_status_t st = RI_OK;
    void *qbuf = NULL, *g16buf = NULL;
    if (use_g16) {
        st = mdl_mm_quant_act(&j, x, n, cols, false, false, &qbuf);
        if (st != RI_OK)
            goto free_buffers;
        j.g16_bytes = mdl_gemm16_scratch_bytes(cols);
        g16buf = cm_malloc(&mdl_quant_tag, (size_t)nt * j.g16_bytes + 64);
        if (g16buf == NULL) {
            st = RI_ERR_NOMEM;
            goto free_buffers;
        }
        j.g16 = (uint8_t *)(((uintptr_t)g16buf + 63) & ~(uintptr_t)63);
    }
    if ((use_g16 && !g16all) || (!use_g16 && (n > MDL_QROWS_MAX || (n > 2 && !(j.simd && (use_i8 || use_i16)))))) {
        j.scratch = cm_malloc(&mdl_quant_tag, (size_t)nt * cols * 3 * sizeof(float));
        if (j.scratch == NULL) {
            st = RI_ERR_NOMEM;
            goto free_buffers;
        }
    } else if (!use_g16 && j.simd && (use_i8 || use_i16)) {
        /* the AVX-512 Q4_1 decode product reads a regrouped copy besides */
        bool q4p = use_i16 && has_q4_1 && mdl_quant_use_avx512();
        st = mdl_mm_quant_act(&j, x, n, cols, use_i8, q4p, &qbuf);
        if (st != RI_OK)
            goto free_buffers;
    }
    cm_pool_parallel_for(pool, groups, grain, mdl_mm_rows, &j);
free_buffers:
    cm_free(j.scratch);
    cm_free(g16buf);
    cm_free(qbuf);
    return st;
}

ri_status_t mdl_matmul(cm_pool_t *pool, const mdl_weight_t *w, const float *x, size_t n, float *y)
{
    const mdl_weight_t *ws[1] = {w};
    float *ys[1] = {y};
    return mdl_matmul_multi(pool, ws, 1, x, n, ys);
}

void mdl_quant_set_avx512(bool on)
{
#ifdef MDL_X86
    mdl_avx512_on = -1;
    if (on)
        (void)mdl_quant_use_avx512();   /* on only where the CPU has it */
    else
        mdl_avx512_on = 0;
#else
    (void)on;
#endif
}

bool mdl_quant_avx512_active(void)
{
#ifdef MDL_X86
    return mdl_quant_use_avx512();
#else
    return false;
#endif
}

void mdl_quant_set_act(mdl_act_mode_t mode)
{
    mdl_act = (int)mode;
}

mdl_act_mode_t mdl_quant_get_act(void)
{
    return mdl_act_mode();
}

void mdl_quant_q8_activations(bool on)
{
    mdl_act = on ? MDL_ACT_I8 : MDL_ACT_I16;
}
