/*
 * The exact-attention inner loop shared by the CUDA decode kernel
 * (kn_cuda_decode.cu) and the device tripartite step's exact part
 * (kn_cuda_wave.cu), for d = 64, 128, 256 with 16-byte aligned rows.
 *
 * LPT = d / 8 lanes hold one token's row, 8 dims each (one 16-byte load),
 * so a warp takes TPW = 32 / LPT tokens at once; a round takes U tokens per
 * lane group, all loads issued before any arithmetic.  The g dot products
 * are reduced over the LPT lanes of a group only, and the online softmax of
 * each query head is rescaled once per round.  finish() merges the lane
 * groups of each warp by shuffles and the warps of the block in shared
 * memory, and writes one (o, lse) partial per query head.
 *
 * Every lane of a warp must run the same rounds (a caller's round start
 * depends on the warp alone), so that the shuffles see full warps; a lane
 * whose token is past the end passes ok = false and adds no weight.
 */
#ifndef KN_CUDA_VEC_CUH
#define KN_CUDA_VEC_CUH

#include "kernels/cuda/kn_cuda_common.cuh"

#define KN_CU_WARPS 4  /* warps a block of the exact kernels */

/* 8 halves (16 bytes, aligned) as floats. */
static __device__ __forceinline__ void kn_cu_ld8(const __half *p, float *f)
{
    const uint4 raw = __ldg(reinterpret_cast<const uint4 *>(p));
    const __half2 *h2 = reinterpret_cast<const __half2 *>(&raw);
    for (int i = 0; i < 4; i++) {
        const float2 x = __half22float2(h2[i]);
        f[2 * i] = x.x;
        f[2 * i + 1] = x.y;
    }
}

/* Shared memory of finish(): one slot per warp. */
template <int G, int D>
struct kn_cu_vshared {
    float m[KN_CU_WARPS][G], l[KN_CU_WARPS][G];
    float acc[KN_CU_WARPS][G][D];
};

template <int G, int LPT, int U>
struct kn_cu_vacc {
    static constexpr int TPW = 32 / LPT, D = LPT * 8;
    float qr[G][8], acc[G][8], m[G], l[G];

    /* q: the group's G query rows [G][D]; c0: this lane's first dim. */
    __device__ __forceinline__ void init(const float *q, float scale, int c0)
    {
        for (int h = 0; h < G; h++) {
            for (int i = 0; i < 8; i++) {
                qr[h][i] = q[(size_t)h * D + c0 + i] * scale;
                acc[h][i] = 0.0f;
            }
            m[h] = -INFINITY;
            l[h] = 0.0f;
        }
    }

    /* One round: kp[u] / vp[u] point at this lane's 8 dims of its u-th
     * token's K and V rows (ignored where ok[u] is false). */
    __device__ __forceinline__ void round(const __half *const *kp, const __half *const *vp, const bool *ok)
    {
        float kf[U][8], vf[U][8], s[U][G];
        for (int u = 0; u < U; u++) {
            if (ok[u]) {
                kn_cu_ld8(kp[u], kf[u]);
                kn_cu_ld8(vp[u], vf[u]);
            } else {
                for (int i = 0; i < 8; i++)
                    kf[u][i] = vf[u][i] = 0.0f;
            }
        }
        for (int u = 0; u < U; u++)
            for (int h = 0; h < G; h++) {
                float x = 0.0f;
                for (int i = 0; i < 8; i++)
                    x += qr[h][i] * kf[u][i];
                for (int off = LPT / 2; off > 0; off >>= 1)
                    x += __shfl_xor_sync(0xffffffffu, x, off);
                s[u][h] = ok[u] ? x : -INFINITY;
            }
        for (int h = 0; h < G; h++) {
            float mx = m[h];
            for (int u = 0; u < U; u++)
                mx = fmaxf(mx, s[u][h]);
            if (mx == -INFINITY)
                continue;  /* no token of this lane group yet */
            const float c = __expf(m[h] - mx);  /* 0 while m was -inf */
            l[h] *= c;
            for (int i = 0; i < 8; i++)
                acc[h][i] *= c;
            m[h] = mx;
            for (int u = 0; u < U; u++) {
                const float p = __expf(s[u][h] - mx);  /* 0 for a missing token */
                l[h] += p;
                for (int i = 0; i < 8; i++)
                    acc[h][i] += p * vf[u][i];
            }
        }
    }

    /* Merge the block into partial rows part_o[(part * G + h) * D ..] and
     * part_lse[part * G + h] (o = 0, lse = -inf when it saw no token).
     * Every thread of the block calls it. */
    __device__ __forceinline__ void finish(kn_cu_vshared<G, D> &sh, int lane, int warp, int c0,
                                           float *part_o, float *part_lse, size_t part)
    {
        for (int off = LPT; off < 32; off <<= 1)
            for (int h = 0; h < G; h++) {
                const float mo = __shfl_xor_sync(0xffffffffu, m[h], off);
                const float lo = __shfl_xor_sync(0xffffffffu, l[h], off);
                const float mm = fmaxf(m[h], mo);
                const float ca = mm == -INFINITY ? 0.0f : __expf(m[h] - mm);
                const float cb = mm == -INFINITY ? 0.0f : __expf(mo - mm);
                for (int i = 0; i < 8; i++) {
                    const float ao = __shfl_xor_sync(0xffffffffu, acc[h][i], off);
                    acc[h][i] = acc[h][i] * ca + ao * cb;
                }
                l[h] = l[h] * ca + lo * cb;
                m[h] = mm;
            }
        if (lane < LPT)
            for (int h = 0; h < G; h++) {
                if (lane == 0) {
                    sh.m[warp][h] = m[h];
                    sh.l[warp][h] = l[h];
                }
                for (int i = 0; i < 8; i++)
                    sh.acc[warp][h][c0 + i] = acc[h][i];
            }
        __syncthreads();
        for (int e = threadIdx.x; e < G * D; e += blockDim.x) {
            const int h = e / D, i = e % D;
            float mm = -INFINITY, den = 0.0f, o = 0.0f;
            for (int w = 0; w < KN_CU_WARPS; w++)
                mm = fmaxf(mm, sh.m[w][h]);
            if (mm != -INFINITY)
                for (int w = 0; w < KN_CU_WARPS; w++) {
                    const float c = sh.m[w][h] == -INFINITY ? 0.0f : __expf(sh.m[w][h] - mm);
                    den += c * sh.l[w][h];
                    o += c * sh.acc[w][h][i];
                }
            part_o[(part * G + h) * D + i] = den > 0.0f ? o / den : 0.0f;
            if (i == 0)
                part_lse[part * G + h] = den > 0.0f ? mm + logf(den) : -INFINITY;
        }
    }
};

/* ---- the log-sum-exp merge of partial rows, one block a row ----
 * Part s of a list has lse l[row0 + s * step] and output row
 * o[(row0 + s * step) * d ..].  The weights e^{lse - max} are computed once
 * a part, in chunks through shared memory, and each thread sums its dim
 * over the parts (reads of o coalesced across the threads): a thread
 * walking every part for its dim with an exp each was 123 us for the 256
 * partials a head of a 128K decode on an H200. */
typedef struct kn_cu_parts {
    const float *o, *l;
    size_t row0, step;
    int n;
} kn_cu_parts;

#define KN_CU_MERGE_THREADS 256  /* >= d: a thread holds one dim */
#define KN_CU_MERGE_CHUNK 1024

/* Block-wide max and sum (blockDim.x == KN_CU_MERGE_THREADS); every thread
 * gets the result. */
static __device__ __forceinline__ float kn_cu_block_max(float x, float *red)
{
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    x = kn_cu_warp_max(x);
    __syncthreads();
    if (lane == 0)
        red[warp] = x;
    __syncthreads();
    x = -INFINITY;
    for (int w = 0; w < KN_CU_MERGE_THREADS / 32; w++)
        x = fmaxf(x, red[w]);
    return x;
}

static __device__ __forceinline__ float kn_cu_block_sum(float x, float *red)
{
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    x = kn_cu_warp_sum(x);
    __syncthreads();
    if (lane == 0)
        red[warp] = x;
    __syncthreads();
    x = 0.0f;
    for (int w = 0; w < KN_CU_MERGE_THREADS / 32; w++)
        x += red[w];
    return x;
}

/* Merge the parts of np lists into out[0, d) and *lse (o = 0, lse = -inf
 * when no part has weight).  Every thread of the block calls it. */
static __device__ void kn_cu_merge_parts(const kn_cu_parts *p, int np, int d, float *out, float *lse)
{
    __shared__ float w[KN_CU_MERGE_CHUNK];
    __shared__ float red[KN_CU_MERGE_THREADS / 32];
    const int t = threadIdx.x;
    float x = -INFINITY, mm, den, o = 0.0f;
    for (int k = 0; k < np; k++)
        for (int s = t; s < p[k].n; s += blockDim.x)
            x = fmaxf(x, p[k].l[p[k].row0 + (size_t)s * p[k].step]);
    mm = kn_cu_block_max(x, red);
    x = 0.0f;
    if (mm != -INFINITY)
        for (int k = 0; k < np; k++)
            for (int s = t; s < p[k].n; s += blockDim.x) {
                const float e = p[k].l[p[k].row0 + (size_t)s * p[k].step];
                x += e == -INFINITY ? 0.0f : __expf(e - mm);
            }
    den = kn_cu_block_sum(x, red);
    for (int k = 0; k < np && mm != -INFINITY; k++)
        for (int c0 = 0; c0 < p[k].n; c0 += KN_CU_MERGE_CHUNK) {
            const int cn = min(KN_CU_MERGE_CHUNK, p[k].n - c0);
            __syncthreads();
            for (int s = t; s < cn; s += blockDim.x) {
                const float e = p[k].l[p[k].row0 + (size_t)(c0 + s) * p[k].step];
                w[s] = e == -INFINITY ? 0.0f : __expf(e - mm);
            }
            __syncthreads();
            if (t < d) {
#pragma unroll 8
                for (int s = 0; s < cn; s++)
                    o += w[s] * p[k].o[(p[k].row0 + (size_t)(c0 + s) * p[k].step) * d + t];
            }
        }
    if (t < d)
        out[t] = den > 0.0f ? o / den : 0.0f;
    if (t == 0)
        *lse = den > 0.0f ? mm + logf(den) : -INFINITY;
}

/* Tokens a round for G query heads: fewer where 8 heads' registers are scarce. */
#define KN_CU_VEC_U(G) ((G) <= 4 ? 4 : 2)

/* Whether the vec path takes head_dim d. */
static inline bool kn_cu_vec_dim(int d)
{
    return d == 64 || d == 128 || d == 256;
}

#endif /* KN_CUDA_VEC_CUH */
