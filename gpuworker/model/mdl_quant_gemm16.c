/*
 * Prefill products with int16 activations and AVX-512 VNNI (see
 * mdl_quant_gemm16.h).  Per tile of up to 48 weight rows:
 *   1. unpack: each weight row to int16 values (the format's offsets -8,
 *      -16, -32 applied, so they are signed) and fp32 scales per group
 *      (per 32 elements, per 16 for Q6_K), plus the min per 32 for Q4_1
 *      (+m) and Q4_K (-dmin m), which multiplies the exact block sum of x;
 *   2. transpose 16 rows at a time into the panel [k/2][rows][2] int16, so
 *      that one 512-bit load holds 16 output rows times 2 k;
 *   3. micro-kernel: 4 activation rows x up to 3 vectors of 16 output rows;
 *      per 32-k block the int32 sums of 16 vpdpwssd (the activation pair
 *      of 2 int16 broadcast as one int32), converted and accumulated in
 *      fp32 with wscale[row] * xscale[activation row] (Q6_K: per 16 k).
 * No int32 overflow: per 32-block a lane sums 32 products of |w| <= 128
 * and |x| <= 32767, at most 1.35e8 < 2^31.  (Folding Q6_K's int8 group
 * scale into the weight would make |w| up to 4064 and could overflow.)
 * The error is the int16 quantisation of the activations (relative 1.5e-5
 * of sum |w x|), as the decode products'.
 */
#include "gpuworker/model/mdl_quant_gemm16.h"
#include "gpuworker/model/mdl_simd.h"

#include <string.h>

#if defined(__x86_64__)
#include <immintrin.h>

#define G16_QK 32
#define G16_QKK 256
/* Activation rows per micro-kernel call. */
#define G16_NX 4

/* How a type's scales apply: per 32 elements, per 32 with a min times the
 * block sum of x, per 16 elements. */
enum { G16_S32 = 0, G16_S32M = 1, G16_S16 = 2 };

#define MDL_G16 __attribute__((target("avx512f,avx512bw,avx512dq,avx512vl,avx512vnni,avx2,fma,f16c")))

bool mdl_gemm16_cpu(void)
{
    static int have = -1;
    if (have < 0) {
        __builtin_cpu_init();
        have = __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
               __builtin_cpu_supports("avx512dq") && __builtin_cpu_supports("avx512vl") &&
               __builtin_cpu_supports("avx512vnni");
    }
    return have > 0;
}

bool mdl_gemm16_type(mdl_ggml_type_t t)
{
    return t == MDL_GGML_Q4_0 || t == MDL_GGML_Q4_1 || t == MDL_GGML_Q8_0 || t == MDL_GGML_Q5_0 ||
           t == MDL_GGML_Q4_K || t == MDL_GGML_Q6_K;
}

/* The settings that select it live in mdl_quant.c (mdl_quant.h). */
bool mdl_quant_gemm16_active(mdl_ggml_type_t type)
{
    return mdl_gemm16_type(type) && mdl_gemm16_cpu() && mdl_quant_get_act() == MDL_ACT_I16 &&
           mdl_quant_avx512_active();
}

static int mdl_g16_mode(mdl_ggml_type_t t)
{
    return t == MDL_GGML_Q6_K ? G16_S16 : (t == MDL_GGML_Q4_1 || t == MDL_GGML_Q4_K) ? G16_S32M : G16_S32;
}

/* The scratch: panel int32 [cols/2][48], staging int16 [16][cols], scales
 * [cols/16][48], mins [cols/32][48]; each part a multiple of 64 bytes. */
typedef struct mdl_g16_buf {
    int32_t *panel;
    int16_t *stage;
    float *sc, *mn;
} mdl_g16_buf_t;

static size_t mdl_g16_round64(size_t b)
{
    return (b + 63) & ~(size_t)63;
}

size_t mdl_gemm16_scratch_bytes(size_t cols)
{
    return mdl_g16_round64(cols / 2 * MDL_G16_TILE * 4) + mdl_g16_round64(16 * cols * 2) +
           mdl_g16_round64(cols / 16 * MDL_G16_TILE * 4) + mdl_g16_round64(cols / 32 * MDL_G16_TILE * 4);
}

static mdl_g16_buf_t mdl_g16_buf(void *scratch, size_t cols)
{
    uint8_t *p = scratch;
    mdl_g16_buf_t b;
    b.panel = (int32_t *)p;
    p += mdl_g16_round64(cols / 2 * MDL_G16_TILE * 4);
    b.stage = (int16_t *)p;
    p += mdl_g16_round64(16 * cols * 2);
    b.sc = (float *)p;
    p += mdl_g16_round64(cols / 16 * MDL_G16_TILE * 4);
    b.mn = (float *)p;
    return b;
}


/* ---- 1. unpack one weight row ----
 * q[cols] int16; scale of group g at sc[g * 48 + t], min of block b at
 * mn[b * 48 + t] (t: the row's place in the tile). */

/* Q4_0 / Q4_1 / Q8_0 / Q5_0: one scale per 32-block. */
MDL_G16 static void mdl_g16_unpack_q32(mdl_ggml_type_t type, const uint8_t *p, size_t nb, int16_t *q, float *sc,
                                       float *mn, size_t t)
{
    const __m256i m4 = _mm256_set1_epi16(0x0F);
    for (size_t b = 0; b < nb; b++, q += G16_QK) {
        __m512i v;
        float d = mdl_simd_h16(p), m = 0.0f;
        if (type == MDL_GGML_Q8_0) {
            v = _mm512_cvtepi8_epi16(_mm256_loadu_si256((const __m256i *)(p + 2)));
            p += 34;
        } else {
            /* byte j holds element j (low nibble) and j + 16 (high) */
            size_t qo = type == MDL_GGML_Q4_0 ? 2 : type == MDL_GGML_Q4_1 ? 4 : 6;
            __m256i by = _mm256_cvtepu8_epi16(_mm_loadu_si128((const __m128i *)(p + qo)));
            v = _mm512_inserti64x4(_mm512_castsi256_si512(_mm256_and_si256(by, m4)), _mm256_srli_epi16(by, 4), 1);
            if (type == MDL_GGML_Q4_0) {
                v = _mm512_sub_epi16(v, _mm512_set1_epi16(8));
                p += 18;
            } else if (type == MDL_GGML_Q4_1) {
                m = mdl_simd_h16(p + 2);
                p += 20;
            } else {
                /* Q5_0: -16 where the fifth bit (bit j of qh) is clear */
                uint32_t qh;
                memcpy(&qh, p + 2, 4);
                v = _mm512_mask_sub_epi16(v, (__mmask32)~qh, v, _mm512_set1_epi16(16));
                p += 22;
            }
        }
        _mm512_storeu_si512(q, v);
        sc[b * MDL_G16_TILE + t] = d;
        mn[b * MDL_G16_TILE + t] = m;
    }
}

/* Q4_K: per super-block 8 groups of 32 (group 2c: low nibbles of bytes
 * 32c..32c+31, group 2c+1: their high nibbles), 6-bit scale and min each. */
MDL_G16 static void mdl_g16_unpack_q4_k(const uint8_t *p, size_t nsb, int16_t *q, float *sc, float *mn, size_t t)
{
    const __m256i m4 = _mm256_set1_epi8(0x0F);
    for (size_t sb = 0; sb < nsb; sb++, p += 144, q += G16_QKK) {
        float d = mdl_simd_h16(p), dmin = mdl_simd_h16(p + 2);
        const uint8_t *s = p + 4;
        for (int g = 0; g < 8; g++) {
            int s6 = g < 4 ? s[g] & 63 : (s[g + 4] & 0xF) | (s[g - 4] >> 6) << 4;
            int m6 = g < 4 ? s[g + 4] & 63 : (s[g + 4] >> 4) | (s[g] >> 6) << 4;
            sc[(sb * 8 + (size_t)g) * MDL_G16_TILE + t] = d * (float)s6;
            mn[(sb * 8 + (size_t)g) * MDL_G16_TILE + t] = -dmin * (float)m6;
        }
        for (int c = 0; c < 4; c++) {
            __m256i raw = _mm256_loadu_si256((const __m256i *)(p + 16 + 32 * c));
            _mm512_storeu_si512(q + 64 * c, _mm512_cvtepu8_epi16(_mm256_and_si256(raw, m4)));
            _mm512_storeu_si512(q + 64 * c + 32, _mm512_cvtepu8_epi16(_mm256_and_si256(_mm256_srli_epi16(raw, 4), m4)));
        }
    }
}

/* Q6_K: per half h of 128, element l + 32k takes nibble k/2 of
 * ql[l + 32 (k & 1)] and bits 2k of qh[l]; value - 32, an int8 scale per 16. */
MDL_G16 static void mdl_g16_unpack_q6_k(const uint8_t *p, size_t nsb, int16_t *q, float *sc, float *mn, size_t t)
{
    const __m512i off = _mm512_set1_epi16(32);
    for (size_t sb = 0; sb < nsb; sb++, p += 210) {
        const int8_t *s8 = (const int8_t *)(p + 192);
        float d = mdl_simd_h16(p + 208);
        for (int g = 0; g < 16; g++)
            sc[(sb * 16 + (size_t)g) * MDL_G16_TILE + t] = d * (float)s8[g];
        for (int g = 0; g < 8; g++)
            mn[(sb * 8 + (size_t)g) * MDL_G16_TILE + t] = 0.0f;
        for (int h = 0; h < 2; h++, q += 128) {
            __m256i v[4];
            mdl_simd_q6_k_half(p, h, v);
            for (int k = 0; k < 4; k++)
                _mm512_storeu_si512(q + 32 * k, _mm512_sub_epi16(_mm512_cvtepu8_epi16(v[k]), off));
        }
    }
}

/* Row r of w into the staging row q and the tile's scales at place t. */
MDL_G16 static void mdl_g16_unpack_row(const mdl_weight_t *w, size_t r, int16_t *q, float *sc, float *mn, size_t t)
{
    const uint8_t *p = (const uint8_t *)w->data + r * w->row_bytes;
    if (w->type == MDL_GGML_Q4_K)
        mdl_g16_unpack_q4_k(p, w->cols / G16_QKK, q, sc, mn, t);
    else if (w->type == MDL_GGML_Q6_K)
        mdl_g16_unpack_q6_k(p, w->cols / G16_QKK, q, sc, mn, t);
    else
        mdl_g16_unpack_q32(w->type, p, w->cols / G16_QK, q, sc, mn, t);
}

/* A tile place past the last row: zero weights, scales and mins. */
static void mdl_g16_zero_row(size_t cols, int16_t *q, float *sc, float *mn, size_t t)
{
    memset(q, 0, cols * sizeof(int16_t));
    for (size_t g = 0; g < cols / 16; g++)
        sc[g * MDL_G16_TILE + t] = 0.0f;
    for (size_t b = 0; b < cols / G16_QK; b++)
        mn[b * MDL_G16_TILE + t] = 0.0f;
}

/* ---- 2. transpose into the panel ---- */

/* 16x16 int32 transpose in registers: r[j] lane i becomes r[i] lane j. */
MDL_G16 static inline __attribute__((always_inline)) void mdl_g16_transpose16(__m512i r[16])
{
    __m512i a[16], b[16];
    for (int i = 0; i < 8; i++) {
        a[2 * i] = _mm512_unpacklo_epi32(r[2 * i], r[2 * i + 1]);
        a[2 * i + 1] = _mm512_unpackhi_epi32(r[2 * i], r[2 * i + 1]);
    }
    /* b[4i + c], 128-bit lane L: column 4L + c of rows 4i..4i+3 */
    for (int i = 0; i < 4; i++) {
        b[4 * i] = _mm512_unpacklo_epi64(a[4 * i], a[4 * i + 2]);
        b[4 * i + 1] = _mm512_unpackhi_epi64(a[4 * i], a[4 * i + 2]);
        b[4 * i + 2] = _mm512_unpacklo_epi64(a[4 * i + 1], a[4 * i + 3]);
        b[4 * i + 3] = _mm512_unpackhi_epi64(a[4 * i + 1], a[4 * i + 3]);
    }
    /* 4x4 transpose of 128-bit lanes across b[c], b[4+c], b[8+c], b[12+c] */
    for (int c = 0; c < 4; c++) {
        __m512i u0 = _mm512_shuffle_i32x4(b[c], b[4 + c], 0x44), u1 = _mm512_shuffle_i32x4(b[c], b[4 + c], 0xEE);
        __m512i u2 = _mm512_shuffle_i32x4(b[8 + c], b[12 + c], 0x44);
        __m512i u3 = _mm512_shuffle_i32x4(b[8 + c], b[12 + c], 0xEE);
        r[c] = _mm512_shuffle_i32x4(u0, u2, 0x88);
        r[4 + c] = _mm512_shuffle_i32x4(u0, u2, 0xDD);
        r[8 + c] = _mm512_shuffle_i32x4(u1, u3, 0x88);
        r[12 + c] = _mm512_shuffle_i32x4(u1, u3, 0xDD);
    }
}

/* 16 staged rows (stride cols) into vector v of a panel of nv vectors:
 * pair p of block b at panel[((b * 16 + p) * nv + v) * 16 + row]. */
MDL_G16 static void mdl_g16_pack(const int16_t *stage, size_t cols, int32_t *panel, size_t nv, size_t v)
{
    for (size_t b = 0; b < cols / G16_QK; b++) {
        __m512i r[16];
        for (int t = 0; t < 16; t++)
            r[t] = _mm512_loadu_si512(stage + (size_t)t * cols + b * G16_QK);
        mdl_g16_transpose16(r);
        for (int p = 0; p < 16; p++)
            _mm512_store_si512(panel + ((b * 16 + (size_t)p) * nv + v) * 16, r[p]);
    }
}

/* ---- 3. micro-kernel ---- */

/* The activation rows of one call (G16_NX; rows past n repeat the last). */
typedef struct mdl_g16_x {
    const int16_t *q[G16_NX]; /* int16 values, cols each */
    const float *d[G16_NX];   /* block scales */
    const float *s[G16_NX];   /* block sums */
    float *y[G16_NX];         /* output at the tile's first row */
    int n;                    /* rows to store (1..G16_NX) */
} mdl_g16_x_t;

/* Block b's int32 sums (pairs p0..p1) into the fp32 accumulators with the
 * scales of group g (stride 48) times the activation block scales. */
#define G16_FLUSH(g)                                                                                       \
    do {                                                                                                   \
        for (int v = 0; v < NV; v++) {                                                                     \
            __m512 ws = _mm512_load_ps(sc + (g) * MDL_G16_TILE + 16 * v);                                  \
            for (int i = 0; i < G16_NX; i++)                                                               \
                f[i][v] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(a[i][v]),                                     \
                                          _mm512_mul_ps(ws, _mm512_set1_ps(x->d[i][b])), f[i][v]);         \
        }                                                                                                  \
    } while (0)

MDL_G16 static inline __attribute__((always_inline)) void
mdl_g16_kernel(const int32_t *panel, const float *sc, const float *mn, size_t nb, const mdl_g16_x_t *x, size_t nr,
               const int NV, const int MODE)
{
    __m512 f[G16_NX][3];
    __m512i a[G16_NX][3];
    for (int i = 0; i < G16_NX; i++)
        for (int v = 0; v < NV; v++)
            f[i][v] = _mm512_setzero_ps();
    for (size_t b = 0; b < nb; b++) {
        const int32_t *pb = panel + b * 16 * (size_t)NV * 16;
        for (int i = 0; i < G16_NX; i++)
            for (int v = 0; v < NV; v++)
                a[i][v] = _mm512_setzero_si512();
        /* unrolled: the int32 sums then stay in fixed registers (a rolled
         * loop had GCC copy all of them every iteration) */
#pragma GCC unroll 16
        for (int p = 0; p < 16; p++) {
            if (MODE == G16_S16 && p == 8) {
                G16_FLUSH(2 * b);
                for (int i = 0; i < G16_NX; i++)
                    for (int v = 0; v < NV; v++)
                        a[i][v] = _mm512_setzero_si512();
            }
            __m512i wv[3];
            for (int v = 0; v < NV; v++)
                wv[v] = _mm512_load_si512(pb + ((size_t)p * NV + v) * 16);
            for (int i = 0; i < G16_NX; i++) {
                int32_t pair;
                memcpy(&pair, x->q[i] + b * G16_QK + 2 * p, 4);
                __m512i xb = _mm512_set1_epi32(pair);
                for (int v = 0; v < NV; v++)
                    a[i][v] = _mm512_dpwssd_epi32(a[i][v], wv[v], xb);
            }
        }
        if (MODE == G16_S16) {
            G16_FLUSH(2 * b + 1);
        } else {
            G16_FLUSH(b);
        }
        if (MODE == G16_S32M) {
            for (int v = 0; v < NV; v++) {
                __m512 m = _mm512_load_ps(mn + b * MDL_G16_TILE + 16 * v);
                for (int i = 0; i < G16_NX; i++)
                    f[i][v] = _mm512_fmadd_ps(m, _mm512_set1_ps(x->s[i][b]), f[i][v]);
            }
        }
    }
    for (int i = 0; i < x->n; i++)
        for (int v = 0; v < NV; v++) {
            size_t lanes = nr > (size_t)v * 16 ? nr - (size_t)v * 16 : 0;
            __mmask16 k = lanes >= 16 ? (__mmask16)0xFFFF : (__mmask16)((1u << lanes) - 1);
            _mm512_mask_storeu_ps(x->y[i] + 16 * v, k, f[i][v]);
        }
}

typedef void (*mdl_g16_kernel_fn_t)(const int32_t *panel, const float *sc, const float *mn, size_t nb,
                                    const mdl_g16_x_t *x, size_t nr);

/* One function per (scale mode, vectors) so that the accumulators stay in
 * registers. */
#define G16_KERNEL_FN(MODE, NV)                                                                                 \
    MDL_G16 static void mdl_g16_kernel_##MODE##_##NV(const int32_t *panel, const float *sc, const float *mn,     \
                                                     size_t nb, const mdl_g16_x_t *x, size_t nr)                 \
    {                                                                                                           \
        mdl_g16_kernel(panel, sc, mn, nb, x, nr, NV, MODE);                                                     \
    }
G16_KERNEL_FN(G16_S32, 1)
G16_KERNEL_FN(G16_S32, 2)
G16_KERNEL_FN(G16_S32, 3)
G16_KERNEL_FN(G16_S32M, 1)
G16_KERNEL_FN(G16_S32M, 2)
G16_KERNEL_FN(G16_S32M, 3)
G16_KERNEL_FN(G16_S16, 1)
G16_KERNEL_FN(G16_S16, 2)
G16_KERNEL_FN(G16_S16, 3)

static const mdl_g16_kernel_fn_t mdl_g16_kernels[3][3] = {
    {mdl_g16_kernel_G16_S32_1, mdl_g16_kernel_G16_S32_2, mdl_g16_kernel_G16_S32_3},
    {mdl_g16_kernel_G16_S32M_1, mdl_g16_kernel_G16_S32M_2, mdl_g16_kernel_G16_S32M_3},
    {mdl_g16_kernel_G16_S16_1, mdl_g16_kernel_G16_S16_2, mdl_g16_kernel_G16_S16_3},
};

/* Unpack and transpose rows [r, r + nr) of w (nr <= 48) into a panel of
 * nv = ceil(nr / 16) vectors; places past nr get zeros. */
MDL_G16 static void mdl_g16_tile_pack(const mdl_weight_t *w, size_t r, size_t nr, size_t nv, const mdl_g16_buf_t *buf)
{
    size_t cols = w->cols;
    for (size_t v = 0; v < nv; v++) {
        for (size_t t = 0; t < 16; t++) {
            size_t place = v * 16 + t;
            int16_t *q = buf->stage + t * cols;
            if (place < nr)
                mdl_g16_unpack_row(w, r + place, q, buf->sc, buf->mn, place);
            else
                mdl_g16_zero_row(cols, q, buf->sc, buf->mn, place);
        }
        mdl_g16_pack(buf->stage, cols, buf->panel, nv, v);
    }
}

void mdl_gemm16_rows(const mdl_weight_t *w, size_t r0, size_t r1, const int16_t *xq, const float *xd, const float *xs,
                     size_t n, float *y, void *scratch)
{
    size_t cols = w->cols, nb = cols / G16_QK, rows = w->rows;
    mdl_g16_buf_t buf = mdl_g16_buf(scratch, cols);
    int mode = mdl_g16_mode(w->type);
    for (size_t r = r0; r < r1; r += MDL_G16_TILE) {
        size_t nr = r1 - r < MDL_G16_TILE ? r1 - r : MDL_G16_TILE, nv = (nr + 15) / 16;
        mdl_g16_tile_pack(w, r, nr, nv, &buf);
        mdl_g16_kernel_fn_t fn = mdl_g16_kernels[mode][nv - 1];
        for (size_t i = 0; i < n; i += G16_NX) {
            mdl_g16_x_t x;
            x.n = n - i < G16_NX ? (int)(n - i) : G16_NX;
            for (int u = 0; u < G16_NX; u++) {
                size_t row = i + (size_t)(u < x.n ? u : x.n - 1);
                x.q[u] = xq + row * cols;
                x.d[u] = xd + row * nb;
                x.s[u] = xs + row * nb;
                x.y[u] = y + row * rows + r;
            }
            fn(buf.panel, buf.sc, buf.mn, nb, &x, nr);
        }
    }
}

#else /* not x86-64: never selected */

bool mdl_quant_gemm16_active(mdl_ggml_type_t type)
{
    (void)type;
    return false;
}

bool mdl_gemm16_cpu(void)
{
    return false;
}

bool mdl_gemm16_type(mdl_ggml_type_t t)
{
    (void)t;
    return false;
}

size_t mdl_gemm16_scratch_bytes(size_t cols)
{
    (void)cols;
    return 0;
}

void mdl_gemm16_rows(const mdl_weight_t *w, size_t r0, size_t r1, const int16_t *xq, const float *xd, const float *xs,
                     size_t n, float *y, void *scratch)
{
    (void)w, (void)r0, (void)r1, (void)xq, (void)xd, (void)xs, (void)n, (void)y, (void)scratch;
}

#endif
