/*
 * kn_cuda_wave_step (kn_cuda.h): one tripartite decode step for every KV
 * head of a layer, on the device from end to end.  On an H200 the same
 * step driven from the host per head (rank_estimate, attn_pages, a host
 * merge) took 3 ms at 128K for 32 MB of reads: launches, copies and waits
 * were the whole cost.  Here every kernel covers all heads (blockIdx.y =
 * KV head), nothing comes back to the host before the end, and the host
 * makes one copy in, ~10 launches, the copies out and one wait.
 *
 *   logits    L[h][q][j] = cscale_j * (scale * q . c8_j) over the int8
 *             centroids, a thread per centroid;
 *             -inf for an empty cluster and for the padding up to the
 *             longest index; each block's max and softmax sum per query head
 *   stats     per query head: max and softmax denominator over the blocks
 *   score     s_j = sum_q e^{L - m_q} / den_q (the rank's score), -inf when
 *             empty
 *   select    per head, the R best and the next E by (score, smaller id
 *             first), without sorting (kn_cu_w_select below); each set in
 *             ascending id order
 *   estimate  chunks of 128 estimation clusters accumulate e^{L - m} n_j
 *             mean_j and e^{L - m} n_j (weights once into shared memory,
 *             then a thread a dim), a second kernel sums the chunks in order
 *   exact     block 0 of a head: the steady zone's (up to 2) spans; block
 *             b >= 1: retrieved clusters [(b-1) 8, b 8) as runs of rows of
 *             the cluster-major copy; each with the vec loop of
 *             kn_cuda_vec.cuh into one (o, lse) partial
 *   merge     per query head, the exact partials and the estimate by
 *             log-sum-exp
 */
#include <stdlib.h>
#include <string.h>

#include "kernels/cuda/kn_cuda.h"
#include "kernels/cuda/kn_cuda_vec.cuh"

#define KN_CU_W_CPB 8        /* retrieved clusters a block of the exact kernel */
#define KN_CU_W_RUNS 8       /* runs a block of the exact kernel: max(CPB, 2) */
#define KN_CU_W_EST_CHUNK 128 /* estimation clusters a block */

typedef kn_cuda_wave_head_t kn_cu_whead;

/* Online (max, sum e^{x - max}) pairs: merge b into a. */
static __device__ __forceinline__ void kn_cu_ms_merge(float &m, float &s, float mo, float so)
{
    const float mm = fmaxf(m, mo);
    s = (m == -INFINITY ? 0.0f : s * __expf(m - mm)) + (mo == -INFINITY ? 0.0f : so * __expf(mo - mm));
    m = mm;
}

/* 16 int8 (16 bytes, aligned) as floats. */
static __device__ __forceinline__ void kn_cu_ld16q(const int8_t *p, float *f)
{
    const uint4 raw = __ldg(reinterpret_cast<const uint4 *>(p));
    const char4 *b4 = reinterpret_cast<const char4 *>(&raw);
#pragma unroll
    for (int i = 0; i < 4; i++) {
        f[4 * i] = (float)b4[i].x;
        f[4 * i + 1] = (float)b4[i].y;
        f[4 * i + 2] = (float)b4[i].z;
        f[4 * i + 3] = (float)b4[i].w;
    }
}

/* One thread a centroid (no reductions across lanes): the query of head
 * blockIdx.y in shared memory (read as broadcasts), the centroid's int8
 * row in 16-byte loads, the finished dots times its scale.  Also each block's (max, sum e^{L - max}) per query head
 * into pm / ps [nkv][g][gridDim.x], which kn_cu_w_stats reduces.  A warp
 * per centroid with g reductions each read the centroids at ~500 GB/s on
 * an H200. */
template <int D>
static __global__ void __launch_bounds__(256)
kn_cu_w_logits(const kn_cu_whead *heads, const float *q, int g, float scale, int Cmax, float *L, float *pm,
               float *ps)
{
    __shared__ __align__(16) float qs[KN_CU_MAXG * D];
    __shared__ float rm[8][KN_CU_MAXG], rs[8][KN_CU_MAXG];
    const int h = blockIdx.y, t = threadIdx.x, lane = t & 31, warp = t >> 5;
    const kn_cu_whead *hd = &heads[h];
    const int C = (int)hd->n_clusters, r = blockIdx.x * blockDim.x + t;
    float s[KN_CU_MAXG];

    for (int i = t; i < g * D; i += blockDim.x)
        qs[i] = q[(size_t)h * g * D + i] * scale;
    __syncthreads();
    for (int a = 0; a < KN_CU_MAXG; a++)
        s[a] = 0.0f;
    const bool live = r < C && hd->sizes[r] != 0;
    if (live) {
        const int8_t *c = hd->centroids + (size_t)r * D;
        for (int k = 0; k < D / 16; k++) {
            float f[16];
            kn_cu_ld16q(c + 16 * k, f);
#pragma unroll
            for (int a = 0; a < KN_CU_MAXG; a++)
                if (a < g)
                    for (int i = 0; i < 16; i++)
                        s[a] += qs[a * D + 16 * k + i] * f[i];
        }
        const float cs = hd->cscale[r];
#pragma unroll
        for (int a = 0; a < KN_CU_MAXG; a++)
            s[a] *= cs;
    }
#pragma unroll
    for (int a = 0; a < KN_CU_MAXG; a++) {
        if (a >= g)
            break;
        const float x = live ? s[a] : -INFINITY;
        if (r < Cmax)
            L[((size_t)h * g + a) * Cmax + r] = x;
        float m = x, e = x == -INFINITY ? 0.0f : 1.0f;
        for (int off = 16; off > 0; off >>= 1)
            kn_cu_ms_merge(m, e, __shfl_xor_sync(0xffffffffu, m, off), __shfl_xor_sync(0xffffffffu, e, off));
        if (lane == 0) {
            rm[warp][a] = m;
            rs[warp][a] = e;
        }
    }
    __syncthreads();
    if (t < g) {
        float m = -INFINITY, e = 0.0f;
        for (int w = 0; w < (int)(blockDim.x >> 5); w++)
            kn_cu_ms_merge(m, e, rm[w][t], rs[w][t]);
        pm[((size_t)h * g + t) * gridDim.x + blockIdx.x] = m;
        ps[((size_t)h * g + t) * gridDim.x + blockIdx.x] = e;
    }
}

/* Per (query head a, KV head h): m = max over the row, den = sum e^{L - m},
 * from the logits blocks' nblk pairs. */
static __global__ void __launch_bounds__(256)
kn_cu_w_stats(const float *pm, const float *ps, int g, int nblk, float *m, float *den)
{
    __shared__ float sm[8], ss[8];
    const int a = blockIdx.x, h = blockIdx.y, lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const size_t row = (size_t)h * g + a;
    float mx = -INFINITY, e = 0.0f;
    for (int b = threadIdx.x; b < nblk; b += blockDim.x)
        kn_cu_ms_merge(mx, e, pm[row * nblk + b], ps[row * nblk + b]);
    for (int off = 16; off > 0; off >>= 1)
        kn_cu_ms_merge(mx, e, __shfl_xor_sync(0xffffffffu, mx, off), __shfl_xor_sync(0xffffffffu, e, off));
    if (lane == 0) {
        sm[warp] = mx;
        ss[warp] = e;
    }
    __syncthreads();
    if (threadIdx.x == 0) {
        mx = -INFINITY;
        e = 0.0f;
        for (int w = 0; w < (int)(blockDim.x >> 5); w++)
            kn_cu_ms_merge(mx, e, sm[w], ss[w]);
        m[row] = mx;
        den[row] = e;
    }
}

static __global__ void kn_cu_w_score(const kn_cu_whead *heads, const float *L, int g, int Cmax,
                                     const float *m, const float *den, float *score)
{
    const int j = blockIdx.x * blockDim.x + threadIdx.x, h = blockIdx.y;
    if (j >= Cmax)
        return;
    const kn_cu_whead *hd = &heads[h];
    float s = 0.0f;
    bool any = false;
    if (j < (int)hd->n_clusters && hd->sizes[j] != 0)
        for (int a = 0; a < g; a++) {
            const float l = L[((size_t)h * g + a) * Cmax + j], mm = m[(size_t)h * g + a];
            if (l == -INFINITY || mm == -INFINITY)
                continue;
            s += expf(l - mm) / den[(size_t)h * g + a];
            any = true;
        }
    score[(size_t)h * Cmax + j] = any ? s : -INFINITY;
}

/* ---- selection: the rank's R and E sets without sorting ----
 * Position of cluster j in the rank order: the clusters with a higher
 * score, plus those with the same score and a smaller id (the reference's
 * tie rule).  Retrieval is positions [0, k1), estimation [k1, k2), with
 * k1 = min(n_r, F), k2 = k1 + min(n_e, F - k1), F the non-empty clusters.
 * One block a head: a radix select (four passes of 8-bit digits over the
 * keys, both thresholds at once, warp-aggregated shared atomics because the
 * scores share their top bits) finds the keys T1, T2 at positions k1 - 1,
 * k2 - 1 and how many of the clusters equal to each are in; then each warp
 * takes a contiguous run of ids and scans of the warps' counts place the
 * retrieved and estimated ids, each set in ascending id order.  The CUB
 * segmented sort this replaces was 117 us at 128K and 480 us at 1M on an
 * H200, the most of the step. */
#define KN_CU_SEL_THREADS 1024

/* Scores are >= 0 or -inf (empty): key 0 for -inf, else the bits + 1,
 * which order as the scores do. */
static __device__ __forceinline__ uint32_t kn_cu_key(float s)
{
    return s == -INFINITY ? 0u : (s <= 0.0f ? 1u : __float_as_uint(s) + 1u);
}

/* Exclusive scan of two per-warp counters over the block's warps (in warp
 * order) into base_a / base_b [32]; also the totals.  Every thread calls it
 * with its warp's counters. */
static __device__ void kn_cu_warp_scan2(uint32_t a, uint32_t b, uint32_t *base_a, uint32_t *base_b, uint32_t *ta,
                                        uint32_t *tb)
{
    __shared__ uint32_t wa[32], wb[32], sa, sb;
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nw = blockDim.x >> 5;
    __syncthreads();
    if (lane == 0) {
        wa[warp] = a;
        wb[warp] = b;
    }
    __syncthreads();
    if (warp == 0) {
        uint32_t xa = lane < nw ? wa[lane] : 0, xb = lane < nw ? wb[lane] : 0;
        const uint32_t oa = xa, ob = xb;
        for (int off = 1; off < 32; off <<= 1) {
            const uint32_t ya = __shfl_up_sync(0xffffffffu, xa, off), yb = __shfl_up_sync(0xffffffffu, xb, off);
            if (lane >= off) {
                xa += ya;
                xb += yb;
            }
        }
        base_a[lane] = xa - oa;
        base_b[lane] = xb - ob;
        if (lane == 31) {
            sa = xa;
            sb = xb;
        }
    }
    __syncthreads();
    *ta = sa;
    *tb = sb;
}

#define KN_CU_SEL_UNROLL 8  /* keys a thread loads before using any */

/* One block a head.  Passes over the keys load KN_CU_SEL_UNROLL keys a
 * thread at once (the scores sit in L2; a load at a time left every pass
 * waiting on latency).  The placement walks the ids in warp-contiguous runs
 * (coalesced loads, ranks from ballots), so only 32 warp totals are
 * scanned across the block. */
static __global__ void __launch_bounds__(KN_CU_SEL_THREADS)
kn_cu_w_select(const kn_cu_whead *heads, const float *score, int Cmax, uint32_t n_r, uint32_t n_e, uint32_t *ids,
               uint32_t *cnt)
{
    __shared__ uint32_t hist[2][256];
    __shared__ uint32_t s_pre[2], s_left[2], s_live;
    __shared__ uint32_t bq1[32], bq2[32], br[32], be[32];
    const int h = blockIdx.x, t = threadIdx.x, lane = t & 31, warp = t >> 5;
    const int C = (int)heads[h].n_clusters, step = blockDim.x * KN_CU_SEL_UNROLL;
    const float *sc = score + (size_t)h * Cmax;
    const uint32_t lt = (1u << lane) - 1u;  /* lanes below this one */
    uint32_t *out = ids + (size_t)h * Cmax;
    uint32_t k[2], hmask = 0;

    if (t == 0)
        s_live = 0;
    __syncthreads();
    {
        uint32_t live = 0;
        for (int base = 0; base < C; base += step) {
            uint32_t kk[KN_CU_SEL_UNROLL];
#pragma unroll
            for (int u = 0; u < KN_CU_SEL_UNROLL; u++) {
                const int j = base + u * blockDim.x + t;
                kk[u] = j < C ? kn_cu_key(sc[j]) : 0u;
            }
#pragma unroll
            for (int u = 0; u < KN_CU_SEL_UNROLL; u++)
                live += kk[u] != 0;
        }
        live = __reduce_add_sync(0xffffffffu, live);
        if (lane == 0)
            atomicAdd(&s_live, live);
    }
    __syncthreads();
    {
        const uint32_t F = s_live, nr = n_r < F ? n_r : F, ne = n_e < F - nr ? n_e : F - nr;
        k[0] = nr;
        k[1] = nr + ne;
    }
    if (t < 2) {
        s_pre[t] = 0;
        s_left[t] = k[t];
    }
    for (int shift = 24; shift >= 0; shift -= 8) {
        for (int i = t; i < 512; i += blockDim.x)
            hist[i >> 8][i & 255] = 0;
        __syncthreads();
        const uint32_t pre[2] = {s_pre[0], s_pre[1]};
        for (int base = 0; base < C; base += step) {
            uint32_t kk[KN_CU_SEL_UNROLL];
#pragma unroll
            for (int u = 0; u < KN_CU_SEL_UNROLL; u++) {
                const int j = base + u * blockDim.x + t;
                kk[u] = j < C ? kn_cu_key(sc[j]) : 0u;
            }
#pragma unroll
            for (int u = 0; u < KN_CU_SEL_UNROLL; u++) {
                const bool valid = base + u * (int)blockDim.x + t < C;
                for (int sel = 0; sel < 2; sel++) {
                    /* bin 256: not counted (past the end, or outside the prefix) */
                    const bool in = valid && k[sel] > 0 && (kk[u] & hmask) == pre[sel];
                    const uint32_t bin = in ? (kk[u] >> shift) & 255u : 256u;
                    const uint32_t peers = __match_any_sync(0xffffffffu, bin);
                    if (in && lane == __ffs(peers) - 1)
                        atomicAdd(&hist[sel][bin], (uint32_t)__popc(peers));
                }
            }
        }
        __syncthreads();
        if (t < 2 && k[t] > 0) {
            uint32_t left = s_left[t], above = 0;
            for (int dg = 255; dg >= 0; dg--) {
                if (above + hist[t][dg] >= left) {
                    s_pre[t] |= (uint32_t)dg << shift;
                    s_left[t] = left - above;
                    break;
                }
                above += hist[t][dg];
            }
        }
        hmask |= 255u << shift;
        __syncthreads();
    }
    /* T: the key at the cut; e: how many clusters equal to it are in (the
     * ones with the smallest ids); with k = 0 nothing is in */
    const uint32_t T1 = s_pre[0], T2 = s_pre[1], e1 = s_left[0], e2 = s_left[1];
    const int nw = blockDim.x >> 5, tile = 32 * KN_CU_SEL_UNROLL;
    const int per = (C + nw * tile - 1) / (nw * tile) * tile;  /* ids a warp, a multiple of the tile */
    const int w0 = min(C, warp * per), w1 = min(C, w0 + per);
    uint32_t q1 = 0, q2 = 0, tot1, tot2;
    for (int base = w0; base < w1; base += tile) {
        uint32_t kk[KN_CU_SEL_UNROLL];
#pragma unroll
        for (int u = 0; u < KN_CU_SEL_UNROLL; u++) {
            const int j = base + u * 32 + lane;
            kk[u] = j < w1 ? kn_cu_key(sc[j]) : 0u;
        }
#pragma unroll
        for (int u = 0; u < KN_CU_SEL_UNROLL; u++) {
            q1 += __popc(__ballot_sync(0xffffffffu, kk[u] == T1 && base + u * 32 + lane < w1));
            q2 += __popc(__ballot_sync(0xffffffffu, kk[u] == T2 && base + u * 32 + lane < w1));
        }
    }
    kn_cu_warp_scan2(q1, q2, bq1, bq2, &tot1, &tot2);  /* ties before each warp's run */
    for (int pass = 0; pass < 2; pass++) {
        /* pass 0 counts each warp's retrieved and estimated ids, pass 1
         * writes them where the scan of those counts puts them */
        uint32_t r1 = bq1[warp], r2 = bq2[warp], nr = 0, ne = 0;
        const uint32_t orr = pass ? br[warp] : 0, oe = pass ? be[warp] : 0;
        for (int base = w0; base < w1; base += tile) {
            uint32_t kk[KN_CU_SEL_UNROLL];
#pragma unroll
            for (int u = 0; u < KN_CU_SEL_UNROLL; u++) {
                const int j = base + u * 32 + lane;
                kk[u] = j < w1 ? kn_cu_key(sc[j]) : 0u;
            }
#pragma unroll
            for (int u = 0; u < KN_CU_SEL_UNROLL; u++) {
                const int j = base + u * 32 + lane;
                const bool valid = j < w1;
                const uint32_t b1 = __ballot_sync(0xffffffffu, valid && kk[u] == T1);
                const uint32_t b2 = __ballot_sync(0xffffffffu, valid && kk[u] == T2);
                const bool inR = valid && k[0] > 0 && (kk[u] > T1 || (kk[u] == T1 && r1 + __popc(b1 & lt) < e1));
                const bool inK2 = valid && k[1] > 0 && (kk[u] > T2 || (kk[u] == T2 && r2 + __popc(b2 & lt) < e2));
                const bool inE = inK2 && !inR;
                const uint32_t bR = __ballot_sync(0xffffffffu, inR), bE = __ballot_sync(0xffffffffu, inE);
                if (pass && inR)
                    out[orr + nr + __popc(bR & lt)] = (uint32_t)j;
                if (pass && inE)
                    out[tot1 + oe + ne + __popc(bE & lt)] = (uint32_t)j;
                r1 += __popc(b1);
                r2 += __popc(b2);
                nr += __popc(bR);
                ne += __popc(bE);
            }
        }
        if (pass == 0)
            kn_cu_warp_scan2(nr, ne, br, be, &tot1, &tot2);
    }
    if (t == 0) {
        cnt[2 * h] = tot1;
        cnt[2 * h + 1] = tot2;
    }
}

/* Chunk blockIdx.x of head blockIdx.y's estimation clusters: first the
 * weights w = e^{L - m} n_j of its 128 clusters and g query heads into
 * shared memory (a thread each), then 256 / D groups of D threads (a dim
 * each) sum w x mean over a share of the clusters, and the groups are
 * added in order.  A block of 64 threads walking 64 clusters one by one,
 * an exp per thread and head each, took 144 us at 128K on an H200. */
template <int D>
static __global__ void __launch_bounds__(256)
kn_cu_w_est_accum(const kn_cu_whead *heads, const float *L, int g, int Cmax, const float *m, const uint32_t *ids_s,
                  const uint32_t *cnt, int chunks, float *acc, float *den)
{
    constexpr int NG = 256 / D;
    __shared__ float w[KN_CU_W_EST_CHUNK][KN_CU_MAXG];
    __shared__ uint32_t jid[KN_CU_W_EST_CHUNK];
    __shared__ float part[NG][KN_CU_MAXG][D];
    const int chunk = blockIdx.x, h = blockIdx.y, t = threadIdx.x;
    const kn_cu_whead *hd = &heads[h];
    const int nr = (int)cnt[2 * h], ne = (int)cnt[2 * h + 1];
    const int e0 = chunk * KN_CU_W_EST_CHUNK, n = max(0, min(ne - e0, KN_CU_W_EST_CHUNK));

    if (t < KN_CU_W_EST_CHUNK) {
        const uint32_t j = t < n ? ids_s[(size_t)h * Cmax + nr + e0 + t] : 0;
        const uint32_t nj = t < n ? hd->sizes[j] : 0;
        jid[t] = j;
        for (int a = 0; a < KN_CU_MAXG; a++) {
            float x = 0.0f;
            if (a < g && nj != 0) {
                const float l = L[((size_t)h * g + a) * Cmax + j], mm = m[(size_t)h * g + a];
                x = (l == -INFINITY || mm == -INFINITY) ? 0.0f : expf(l - mm) * (float)nj;
            }
            w[t][a] = x;
        }
    }
    __syncthreads();
    {
        const int grp = t / D, i = t % D;
        float s[KN_CU_MAXG];
        for (int a = 0; a < KN_CU_MAXG; a++)
            s[a] = 0.0f;
#pragma unroll 8
        for (int e = grp; e < n; e += NG) {
            /* the int8 mean times its scale, as kn_vq_at */
            const float v = (float)hd->vq[(size_t)jid[e] * D + i] * hd->vscale[jid[e]];
#pragma unroll
            for (int a = 0; a < KN_CU_MAXG; a++)
                s[a] += w[e][a] * v;
        }
        for (int a = 0; a < KN_CU_MAXG; a++)
            if (a < g)
                part[grp][a][i] = s[a];
    }
    __syncthreads();
    if (t < D)
        for (int a = 0; a < g; a++) {
            float x = 0.0f;
            for (int q = 0; q < NG; q++)
                x += part[q][a][t];
            acc[(((size_t)h * chunks + chunk) * g + a) * D + t] = x;
        }
    if (t < g) {
        float x = 0.0f;
        for (int e = 0; e < n; e++)
            x += w[e][t];
        den[((size_t)h * chunks + chunk) * g + t] = x;
    }
}

/* Per (query head a, KV head h): the estimate's (o, lse) from the chunks:
 * 256 / D groups of D threads (a dim each) add a share of the chunks, 8
 * reads in flight, and the groups are added in order. */
template <int D>
static __global__ void __launch_bounds__(256)
kn_cu_w_est_finish(const float *acc, const float *den, int chunks, int g, const float *m, float *oe, float *le)
{
    constexpr int NG = 256 / D;
    __shared__ float part[NG][D];
    __shared__ float dsum;
    const int a = blockIdx.x, h = blockIdx.y, t = threadIdx.x, grp = t / D, i = t % D;
    float x = 0.0f;
#pragma unroll 8
    for (int c = grp; c < chunks; c += NG)
        x += acc[(((size_t)h * chunks + c) * g + a) * D + i];
    part[grp][i] = x;
    if (t == 0) {
        float dn = 0.0f;
        for (int c = 0; c < chunks; c++)
            dn += den[((size_t)h * chunks + c) * g + a];
        dsum = dn;
    }
    __syncthreads();
    if (t < D) {
        float o = 0.0f;
        for (int q = 0; q < NG; q++)
            o += part[q][t];
        oe[((size_t)h * g + a) * D + t] = dsum > 0.0f ? o / dsum : 0.0f;
    }
    if (t == 0)
        le[(size_t)h * g + a] = dsum > 0.0f ? m[(size_t)h * g + a] + logf(dsum) : -INFINITY;
}

/* Block (b, h): the steady zone (b = 0) or retrieved clusters
 * [(b-1) CPB, b CPB) of head h, into partial h * nb + b. */
template <int G, int LPT, int U>
static __global__ void __launch_bounds__(32 * KN_CU_WARPS)
kn_cu_w_exact(const kn_cu_whead *heads, const float *q, float scale, int Cmax, const uint32_t *ids_s,
              const uint32_t *cnt, int nb, float *part_o, float *part_l)
{
    typedef kn_cu_vacc<G, LPT, U> acc_t;
    constexpr int D = acc_t::D, TPW = acc_t::TPW;
    const int h = blockIdx.y, b = blockIdx.x;
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int slot = lane / LPT, c0 = (lane % LPT) * 8;
    const kn_cu_whead *hd = &heads[h];
    __shared__ const __half *rk[KN_CU_W_RUNS], *rv[KN_CU_W_RUNS];
    __shared__ int rpre[KN_CU_W_RUNS + 1], rstr[KN_CU_W_RUNS], s_runs;
    __shared__ kn_cu_vshared<G, D> sh;
    acc_t a;

    if (b == 0) {
        if (threadIdx.x == 0) {
            int n = 0, tot = 0;
            for (int p = 0; p < 2; p++)
                if (hd->steady[p].n_tokens > 0) {
                    rk[n] = (const __half *)hd->steady[p].k;
                    rv[n] = (const __half *)hd->steady[p].v;
                    rstr[n] = (int)hd->steady[p].stride;
                    rpre[n++] = tot;
                    tot += (int)hd->steady[p].n_tokens;
                }
            rpre[n] = tot;
            s_runs = n;
        }
    } else {
        /* a thread a cluster loads its id, offset and size (the three
         * dependent loads once, not once a cluster), then one prefix sum */
        const int nr = (int)cnt[2 * h], i0 = (b - 1) * KN_CU_W_CPB, n = max(0, min(nr - i0, KN_CU_W_CPB));
        if (threadIdx.x < n) {
            const uint32_t j = ids_s[(size_t)h * Cmax + i0 + threadIdx.x];
            rk[threadIdx.x] = (const __half *)hd->ck + (size_t)hd->offsets[j] * D;
            rv[threadIdx.x] = (const __half *)hd->cv + (size_t)hd->offsets[j] * D;
            rstr[threadIdx.x] = D;
            rpre[threadIdx.x + 1] = (int)hd->sizes[j];
        }
        __syncthreads();
        if (threadIdx.x == 0) {
            rpre[0] = 0;
            for (int i = 0; i < n; i++)
                rpre[i + 1] += rpre[i];
            s_runs = n;
        }
    }
    __syncthreads();
    const int total = rpre[s_runs];
    a.init(q + (size_t)h * G * D, scale, c0);
    for (int base = warp * TPW * U; base < total; base += KN_CU_WARPS * TPW * U) {
        const __half *kp[U], *vp[U];
        bool ok[U];
        for (int u = 0; u < U; u++) {
            const int t = base + u * TPW + slot;
            int r = 0;
            ok[u] = t < total;
            if (ok[u])
                while (rpre[r + 1] <= t)
                    r++;
            const size_t row = ok[u] ? (size_t)(t - rpre[r]) * rstr[r] : 0;
            kp[u] = (ok[u] ? rk[r] + row : (const __half *)hd->ck) + c0;
            vp[u] = (ok[u] ? rv[r] + row : (const __half *)hd->cv) + c0;
        }
        a.round(kp, vp, ok);
    }
    a.finish(sh, lane, warp, c0, part_o, part_l, (size_t)h * nb + b);
}

/* Per (query head a, KV head h): the nb exact partials and the estimate. */
static __global__ void __launch_bounds__(KN_CU_MERGE_THREADS)
kn_cu_w_merge(const float *part_o, const float *part_l, int nb, const float *oe, const float *le, int g, int d,
              float *out, float *lse)
{
    const int a = blockIdx.x, h = blockIdx.y;
    const size_t row = (size_t)h * g + a;
    const kn_cu_parts p[2] = {{part_o, part_l, (size_t)h * nb * g + a, (size_t)g, nb}, {oe, le, row, 1, 1}};
    kn_cu_merge_parts(p, 2, d, out + row * d, lse + row);
}

template <int G>
static void kn_cu_w_exact_g(int d, dim3 grid, const kn_cu_whead *heads, const float *q, float scale,
                            int Cmax, const uint32_t *ids_s, const uint32_t *cnt, int nb, float *po,
                            float *pl, cudaStream_t st)
{
    constexpr int U = KN_CU_VEC_U(G);
    const dim3 block(32 * KN_CU_WARPS);
    switch (d) {
    case 64:
        kn_cu_w_exact<G, 8, U><<<grid, block, 0, st>>>(heads, q, scale, Cmax, ids_s, cnt, nb, po, pl);
        break;
    case 128:
        kn_cu_w_exact<G, 16, U><<<grid, block, 0, st>>>(heads, q, scale, Cmax, ids_s, cnt, nb, po, pl);
        break;
    default:
        kn_cu_w_exact<G, 32, U><<<grid, block, 0, st>>>(heads, q, scale, Cmax, ids_s, cnt, nb, po, pl);
        break;
    }
}

static void kn_cu_w_exact_launch(int g, int d, dim3 grid, const kn_cu_whead *heads, const float *q,
                                 float scale, int Cmax, const uint32_t *ids_s, const uint32_t *cnt, int nb,
                                 float *po, float *pl, cudaStream_t st)
{
    switch (g) {
    case 1: kn_cu_w_exact_g<1>(d, grid, heads, q, scale, Cmax, ids_s, cnt, nb, po, pl, st); break;
    case 2: kn_cu_w_exact_g<2>(d, grid, heads, q, scale, Cmax, ids_s, cnt, nb, po, pl, st); break;
    case 3: kn_cu_w_exact_g<3>(d, grid, heads, q, scale, Cmax, ids_s, cnt, nb, po, pl, st); break;
    case 4: kn_cu_w_exact_g<4>(d, grid, heads, q, scale, Cmax, ids_s, cnt, nb, po, pl, st); break;
    case 5: kn_cu_w_exact_g<5>(d, grid, heads, q, scale, Cmax, ids_s, cnt, nb, po, pl, st); break;
    case 6: kn_cu_w_exact_g<6>(d, grid, heads, q, scale, Cmax, ids_s, cnt, nb, po, pl, st); break;
    case 7: kn_cu_w_exact_g<7>(d, grid, heads, q, scale, Cmax, ids_s, cnt, nb, po, pl, st); break;
    default: kn_cu_w_exact_g<8>(d, grid, heads, q, scale, Cmax, ids_s, cnt, nb, po, pl, st); break;
    }
}

static bool kn_cu_aligned(const void *p)
{
    return (uintptr_t)p % 16 == 0;
}

/* The layout the kernels take: device pointers are the caller's promise
 * (checking each would cost a driver call), alignment and sizes are checked. */
static bool kn_cu_w_valid(const kn_shape_t *shape, const float *q, const kn_cu_whead *heads, float *out,
                          float *lse)
{
    if (!kn_shape_valid(shape) || !q || !heads || !out || !lse || !kn_cu_vec_dim((int)shape->head_dim) ||
        shape->n_q_heads / shape->n_kv_heads > KN_CU_MAXG)
        return false;
    for (uint32_t h = 0; h < shape->n_kv_heads; h++) {
        const kn_cu_whead *hd = &heads[h];
        if (hd->n_clusters > 0 &&
            (!hd->centroids || !hd->cscale || !kn_cu_aligned(hd->centroids) || !hd->sizes || !hd->offsets ||
             !hd->vq || !hd->vscale || !kn_cu_aligned(hd->ck) ||
             !kn_cu_aligned(hd->cv) || !hd->ck || !hd->cv || hd->n_clusters > (1u << 24)))
            return false;
        for (int p = 0; p < 2; p++)
            if (hd->steady[p].n_tokens > 0 &&
                (!hd->steady[p].k || !hd->steady[p].v || !kn_cu_aligned(hd->steady[p].k) ||
                 !kn_cu_aligned(hd->steady[p].v) || hd->steady[p].stride % 8 != 0 ||
                 hd->steady[p].stride < shape->head_dim))
                return false;
    }
    return true;
}

extern "C" ri_status_t kn_cuda_wave_step(const kn_shape_t *shape, const float *q, const kn_cuda_wave_head_t *heads,
                                         uint32_t n_r, uint32_t n_e, float *out, float *lse, uint32_t *ids,
                                         uint32_t *counts)
{
    if (shape == NULL || !kn_cu_w_valid(shape, q, heads, out, lse))
        return RI_ERR_INVALID;
    const int nkv = (int)shape->n_kv_heads, g = (int)(shape->n_q_heads / shape->n_kv_heads);
    const int d = (int)shape->head_dim, nq = (int)shape->n_q_heads;
    const float scale = kn_shape_scale(shape);
    int Cmax = 0;
    for (int h = 0; h < nkv; h++)
        Cmax = (int)heads[h].n_clusters > Cmax ? (int)heads[h].n_clusters : Cmax;
    if ((size_t)nkv * Cmax > (size_t)1 << 30)
        return RI_ERR_INVALID;
    const uint32_t want = n_r + n_e < (uint32_t)Cmax ? n_r + n_e : (uint32_t)Cmax;
    const uint32_t nr_max = n_r < want ? n_r : want, ne_max = want - nr_max;
    const int nb = 1 + (int)((nr_max + KN_CU_W_CPB - 1) / KN_CU_W_CPB);
    const int chunks = (int)((ne_max + KN_CU_W_EST_CHUNK - 1) / KN_CU_W_EST_CHUNK);
    const size_t CN = (size_t)nkv * Cmax;
    const int nblk = (Cmax + 255) / 256;  /* logits blocks a head */
    /* one copy in: the head table and a host query */
    const bool q_dev = kn_cu_on_device(q);
    const size_t b_heads = ((size_t)nkv * sizeof(kn_cu_whead) + 15) / 16 * 16;
    const size_t b_q = q_dev ? 0 : (size_t)nq * d * sizeof(float);
    /* one scratch of floats and one of ids */
    const size_t f_L = (size_t)g * CN, f_m = (size_t)nkv * g, f_sc = CN;
    const size_t f_acc = (size_t)nkv * chunks * g * d, f_den = (size_t)nkv * chunks * g;
    const size_t f_oe = (size_t)nkv * g * d, f_po = (size_t)nkv * nb * g * d, f_pl = (size_t)nkv * nb * g;
    const size_t f_pm = (size_t)nkv * g * nblk;
    const size_t n_f = f_L + 2 * f_m + f_sc + f_acc + f_den + f_oe + f_m + f_po + f_pl + (size_t)nq * d + nq +
                       2 * f_pm;
    char *blob = (char *)malloc(b_heads + b_q + 1);
    kn_cu_call_t c;

    kn_cu_begin(&c);
    if (blob == NULL) {
        c.st = RI_ERR_NOMEM;
        goto out;
    }
    memcpy(blob, heads, (size_t)nkv * sizeof(kn_cu_whead));
    if (!q_dev)
        memcpy(blob + b_heads, q, b_q);
    {
        const char *din = (const char *)kn_cu_in(&c, blob, b_heads + b_q);
        float *f = (float *)kn_cu_alloc(&c, (n_f + 1) * sizeof(float));
        uint32_t *u = (uint32_t *)kn_cu_alloc(&c, (CN + 2 * (size_t)nkv + 1) * sizeof(uint32_t));
        if (c.st != RI_OK)
            goto out;
        const kn_cu_whead *dh = (const kn_cu_whead *)din;
        const float *dq = q_dev ? q : (const float *)(din + b_heads);
        float *L = f, *m = L + f_L, *den = m + f_m, *score = den + f_m;
        float *acc = score + f_sc, *eden = acc + f_acc, *oe = eden + f_den, *le = oe + f_oe;
        float *po = le + f_m, *pl = po + f_po, *dout = pl + f_pl, *dlse = dout + (size_t)nq * d;
        float *pm = dlse + nq, *ps = pm + f_pm;
        uint32_t *id_s = u, *cnt = u + CN;

        if (Cmax > 0) {
            const dim3 lg(nblk, nkv);
            if (d == 64)
                kn_cu_w_logits<64><<<lg, 256, 0, c.s>>>(dh, dq, g, scale, Cmax, L, pm, ps);
            else if (d == 128)
                kn_cu_w_logits<128><<<lg, 256, 0, c.s>>>(dh, dq, g, scale, Cmax, L, pm, ps);
            else
                kn_cu_w_logits<256><<<lg, 256, 0, c.s>>>(dh, dq, g, scale, Cmax, L, pm, ps);
            kn_cu_w_stats<<<dim3(g, nkv), 256, 0, c.s>>>(pm, ps, g, nblk, m, den);
            kn_cu_w_score<<<dim3((Cmax + 255) / 256, nkv), 256, 0, c.s>>>(dh, L, g, Cmax, m, den, score);
            kn_cu_w_select<<<nkv, KN_CU_SEL_THREADS, 0, c.s>>>(dh, score, Cmax, n_r, n_e, id_s, cnt);
            kn_cu_check_launch(&c, "wave rank launch");
        } else {
            kn_cu_zero(&c, cnt, 2 * (size_t)nkv * sizeof(uint32_t));
        }
        if (chunks > 0) {
            const dim3 eg(chunks, nkv);
            if (d == 64)
                kn_cu_w_est_accum<64><<<eg, 256, 0, c.s>>>(dh, L, g, Cmax, m, id_s, cnt, chunks, acc, eden);
            else if (d == 128)
                kn_cu_w_est_accum<128><<<eg, 256, 0, c.s>>>(dh, L, g, Cmax, m, id_s, cnt, chunks, acc, eden);
            else
                kn_cu_w_est_accum<256><<<eg, 256, 0, c.s>>>(dh, L, g, Cmax, m, id_s, cnt, chunks, acc, eden);
        }
        if (d == 64)
            kn_cu_w_est_finish<64><<<dim3(g, nkv), 256, 0, c.s>>>(acc, eden, chunks, g, m, oe, le);
        else if (d == 128)
            kn_cu_w_est_finish<128><<<dim3(g, nkv), 256, 0, c.s>>>(acc, eden, chunks, g, m, oe, le);
        else
            kn_cu_w_est_finish<256><<<dim3(g, nkv), 256, 0, c.s>>>(acc, eden, chunks, g, m, oe, le);
        kn_cu_w_exact_launch(g, d, dim3(nb, nkv), dh, dq, scale, Cmax, id_s, cnt, nb, po, pl, c.s);
        kn_cu_w_merge<<<dim3(g, nkv), KN_CU_MERGE_THREADS, 0, c.s>>>(po, pl, nb, oe, le, g, d, dout, dlse);
        kn_cu_check_launch(&c, "wave step launch");
        kn_cu_out(&c, out, dout, (size_t)nq * d * sizeof(float));
        kn_cu_out(&c, lse, dlse, (size_t)nq * sizeof(float));
        if (counts != NULL)
            kn_cu_out(&c, counts, cnt, 2 * (size_t)nkv * sizeof(uint32_t));
        if (ids != NULL && want > 0 && c.st == RI_OK)
            c.st = kn_cu_status(cudaMemcpy2DAsync(ids, (size_t)(n_r + n_e) * sizeof(uint32_t), id_s,
                                                  (size_t)Cmax * sizeof(uint32_t), want * sizeof(uint32_t), nkv,
                                                  cudaMemcpyDefault, c.s),
                                "copy ids");
    }
out:
    kn_cu_end(&c);
    free(blob);
    return c.st;
}
