/*
 * CUDA rank, estimate and the fused rank + estimate (kn_cuda_rank_estimate)
 * of one GQA group.  Per decode step and KV head the rank reads every
 * centroid once (C x d int8 + a scale each: 64K clusters at 1M tokens) and the estimate
 * reads the value sums of the E estimation clusters; both are small next to
 * the K/V the exact part reads, so these kernels aim at few launches and no
 * host round trip beyond the one the ids need.
 *
 *   logits    one warp per centroid (or listed cluster): g dot products,
 *             lanes over d, the scaled query in shared memory, each
 *             finished dot times the cluster's cscale (as kn_cq_dot)
 *   heads     one block per query head: max (and for the rank the softmax
 *             denominator) over the clusters, fixed reduction order
 *   score     s_j = sum_h e^{l_hj - m_h} / sum_h over non-empty clusters,
 *             -inf for empty ones
 *   select    a stable descending radix sort of (s_j, j) (CUB): ties keep the
 *             smaller id first, as in the reference; R best, then the next E
 *   estimate  chunks of 64 clusters accumulate w_h VS_j and w_h n_j per head
 *             (w_h = e^{l_hj - m_h}; VS_j read as n_j times the index's fp16
 *             mean when it has means, as the cpu backend reads them, else
 *             the fp32 sum), a second kernel sums the chunks in order:
 *             o_h = acc / den, lse_h = m_h + ln den
 *
 * The fused op reuses the rank's logits and maxima for the estimation zone,
 * so the centroids are read once.  Groups of up to 8 heads, d <= 256.
 */
#include <cub/device/device_radix_sort.cuh>
#include <stdlib.h>

#include "kernels/cuda/kn_cuda.h"
#include "kernels/cuda/kn_cuda_common.cuh"

#define KN_CU_EST_CHUNK 64

/* L[h*ld + r] = cscale_j * (scale * q_h . c8_j) for the int8 centroid of
 * row r, which is cluster r, or cluster list[r] when list != NULL; -inf
 * for an empty cluster. */
static __global__ void kn_cu_logits_kernel(const float *q, int g, int d, float scale, const int8_t *cent,
                                           const float *cscale, const uint32_t *sizes, const uint32_t *list, int n,
                                           float *L, int ld)
{
    __shared__ float qs[KN_CU_MAXG * KN_CU_MAXD];
    const int lane = threadIdx.x & 31, r = blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5);
    for (int i = threadIdx.x; i < g * d; i += blockDim.x)
        qs[i] = q[i] * scale;
    __syncthreads();
    if (r >= n)
        return;
    const uint32_t j = list ? list[r] : (uint32_t)r;
    const int8_t *c = cent + (size_t)j * d;
    const bool empty = sizes[j] == 0;
    float s[KN_CU_MAXG];
    for (int h = 0; h < KN_CU_MAXG; h++)
        s[h] = 0.0f;
    for (int i = lane; i < d; i += 32) {
        float x = (float)c[i];
        for (int h = 0; h < KN_CU_MAXG; h++)
            if (h < g)
                s[h] += qs[h * d + i] * x;
    }
    for (int h = 0; h < KN_CU_MAXG; h++) {
        if (h >= g)
            break;
        float t = kn_cu_warp_sum(s[h]);
        if (lane == 0)
            L[(size_t)h * ld + r] = empty ? -INFINITY : t * cscale[j];
    }
}

/* Per head h (one block each): m[h] = max_r (L[h][r] + (with_ln ? ln n_r : 0))
 * and, when sum != NULL, sum[h] = sum_r e^{L[h][r] - m[h]}. */
static __global__ void kn_cu_head_stats_kernel(const float *L, int ld, int n, const uint32_t *sizes,
                                               const uint32_t *list, int with_ln, float *m,
                                               float *sum)
{
    __shared__ float sh[32];
    const int h = blockIdx.x, lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int nw = blockDim.x >> 5;
    const float *lh = L + (size_t)h * ld;
    float x = -INFINITY, mm;
    for (int r = threadIdx.x; r < n; r += blockDim.x) {
        float v = lh[r];
        if (with_ln && v != -INFINITY)
            v += logf((float)sizes[list ? list[r] : (uint32_t)r]);
        x = fmaxf(x, v);
    }
    x = kn_cu_warp_max(x);
    if (lane == 0)
        sh[warp] = x;
    __syncthreads();
    mm = -INFINITY;
    for (int w = 0; w < nw; w++)
        mm = fmaxf(mm, sh[w]);
    if (threadIdx.x == 0)
        m[h] = mm;
    if (sum == NULL)
        return;
    __syncthreads();
    x = 0.0f;
    if (mm != -INFINITY)
        for (int r = threadIdx.x; r < n; r += blockDim.x)
            x += lh[r] == -INFINITY ? 0.0f : expf(lh[r] - mm);
    x = kn_cu_warp_sum(x);
    if (lane == 0)
        sh[warp] = x;
    __syncthreads();
    if (threadIdx.x == 0) {
        float t = 0.0f;
        for (int w = 0; w < nw; w++)
            t += sh[w];
        sum[h] = t;
    }
}

/* score[j] = sum_h e^{L[h][j] - m_h} / sum_h (non-empty), -inf (empty); ids[j] = j. */
static __global__ void kn_cu_score_kernel(const float *L, int C, int g, const float *m,
                                          const float *sum, const uint32_t *sizes, float *score,
                                          uint32_t *ids)
{
    const int j = blockIdx.x * blockDim.x + threadIdx.x;
    if (j >= C)
        return;
    float s = 0.0f;
    bool any = false;
    for (int h = 0; h < g; h++) {
        float l = L[(size_t)h * C + j];
        if (l == -INFINITY || m[h] == -INFINITY)
            continue;
        s += expf(l - m[h]) / sum[h];
        any = true;
    }
    score[j] = sizes[j] != 0 && any ? s : -INFINITY;
    ids[j] = (uint32_t)j;
}

/* Partial estimation sums over entries [chunk*64, +64) of ids: column of
 * entry e in L is ids[e] (by_id) or e; acc [chunks][g][d], den [chunks][g]. */
static __global__ void kn_cu_est_accum_kernel(const float *L, int ld, int by_id, const float *m, int g, int d,
                                              const uint32_t *ids, int n, const uint32_t *sizes, const float *vsum,
                                              const int8_t *vq, const float *vscale, float *acc, float *den)
{
    const int chunk = blockIdx.x, e0 = chunk * KN_CU_EST_CHUNK;
    const int e1 = min(n, e0 + KN_CU_EST_CHUNK);
    float a[KN_CU_MAXG][KN_CU_MAXD / 64], dn[KN_CU_MAXG];
    for (int h = 0; h < KN_CU_MAXG; h++) {
        dn[h] = 0.0f;
        for (int k = 0; k < KN_CU_MAXD / 64; k++)
            a[h][k] = 0.0f;
    }
    for (int e = e0; e < e1; e++) {
        const uint32_t j = ids[e], nj = sizes[j];
        const int col = by_id ? (int)j : e;
        if (nj == 0)
            continue;
        for (int h = 0; h < KN_CU_MAXG; h++) {
            if (h >= g)
                break;
            float l = L[(size_t)h * ld + col];
            float w = (l == -INFINITY || m[h] == -INFINITY) ? 0.0f : expf(l - m[h]);
            dn[h] += w * (float)nj;
            for (int k = 0; k < KN_CU_MAXD / 64; k++) {
                int i = threadIdx.x + k * 64;
                if (i < d)
                    a[h][k] +=
                        w * (vq ? (float)vq[(size_t)j * d + i] * vscale[j] * (float)nj : vsum[(size_t)j * d + i]);
            }
        }
    }
    for (int h = 0; h < KN_CU_MAXG; h++) {  /* constant indices: a[][] stays in registers */
        if (h >= g)
            break;
        for (int k = 0; k < KN_CU_MAXD / 64; k++) {
            int i = threadIdx.x + k * 64;
            if (i < d)
                acc[((size_t)chunk * g + h) * d + i] = a[h][k];
        }
        if (threadIdx.x == 0)
            den[(size_t)chunk * g + h] = dn[h];
    }
}

/* o[h] = sum_chunks acc / sum_chunks den, lse[h] = m_h + ln den (one block per head). */
static __global__ void kn_cu_est_finish_kernel(const float *acc, const float *den, int chunks,
                                               int g, int d, const float *m, float *o, float *lse)
{
    const int h = blockIdx.x;
    float dn = 0.0f;
    for (int c = 0; c < chunks; c++)
        dn += den[(size_t)c * g + h];
    for (int i = threadIdx.x; i < d; i += blockDim.x) {
        float s = 0.0f;
        for (int c = 0; c < chunks; c++)
            s += acc[((size_t)c * g + h) * d + i];
        o[(size_t)h * d + i] = dn > 0.0f ? s / dn : 0.0f;
    }
    if (threadIdx.x == 0)
        lse[h] = dn > 0.0f ? m[h] + logf(dn) : -INFINITY;
}

/* The values the estimation reads: the index's int8 means and their scales
 * (*vscale_p) when it has them (what the cpu backend reads too: a quarter
 * of the bytes of the sums; NULL in a hand-made index), else its fp32 sums
 * (*vsum_p).  Returns the device means or NULL. */
static const int8_t *kn_cu_values(kn_cu_call_t *c, const kn_index_t *idx, const float **vsum_p, const float **vscale_p)
{
    size_t cd = (size_t)idx->n_clusters * idx->head_dim;
    *vsum_p = NULL;
    *vscale_p = NULL;
    if (idx->vq != NULL) {
        *vscale_p = (const float *)kn_cu_in(c, idx->vscale, (size_t)idx->n_clusters * sizeof(float));
        return (const int8_t *)kn_cu_in(c, idx->vq, cd);
    }
    *vsum_p = (const float *)kn_cu_in(c, idx->vsum, cd * sizeof(float));
    return NULL;
}

/* Estimation of g heads over n entries (device ids) into host/device o, lse;
 * the values from vq (int8 means times vscale, times n_j) or else vsum
 * (fp32 sums). */
static void kn_cu_estimate_run(kn_cu_call_t *c, const float *L, int ld, int by_id, const float *m, int g, int d,
                               const uint32_t *ids, int n, const uint32_t *sizes, const float *vsum, const int8_t *vq,
                               const float *vscale, float *o, float *lse)
{
    int chunks = (n + KN_CU_EST_CHUNK - 1) / KN_CU_EST_CHUNK;
    float *acc = (float *)kn_cu_alloc(c, ((size_t)chunks + 1) * g * d * sizeof(float));
    float *den = (float *)kn_cu_alloc(c, ((size_t)chunks + 1) * g * sizeof(float));
    float *dout = (float *)kn_cu_alloc(c, (size_t)g * d * sizeof(float));
    float *dlse = (float *)kn_cu_alloc(c, (size_t)g * sizeof(float));
    if (c->st != RI_OK)
        return;
    if (chunks > 0)
        kn_cu_est_accum_kernel<<<chunks, 64, 0, c->s>>>(L, ld, by_id, m, g, d, ids, n, sizes, vsum, vq, vscale, acc,
                                                        den);
    kn_cu_est_finish_kernel<<<g, 128, 0, c->s>>>(acc, den, chunks, g, d, m, dout, dlse);
    kn_cu_check_launch(c, "estimate launch");
    kn_cu_out(c, o, dout, (size_t)g * d * sizeof(float));
    kn_cu_out(c, lse, dlse, (size_t)g * sizeof(float));
}

/* Rank (and, with o_e != NULL, the estimation zone) of one group. */
static ri_status_t kn_cu_rank_impl(const kn_shape_t *grp, const float *q, const kn_index_t *idx,
                                   uint32_t n_r, uint32_t n_e, uint32_t *ids, uint32_t *n_r_p,
                                   uint32_t *n_e_p, float *o_e, float *lse_e)
{
    const int g = (int)grp->n_q_heads, d = (int)grp->head_dim, C = (int)idx->n_clusters;
    uint32_t want = n_r + n_e < (uint32_t)C ? n_r + n_e : (uint32_t)C, avail = 0, nr = 0, ne = 0;
    float *top = (float *)malloc(((size_t)want + 1) * sizeof(float));
    unsigned bits = 1;
    size_t tmp_bytes = 0;
    kn_cu_call_t c;

    kn_cu_begin(&c);
    if (top == NULL) {
        c.st = RI_ERR_NOMEM;
        goto out;
    }
    {
        const float *dq = (const float *)kn_cu_in(&c, q, (size_t)g * d * sizeof(float));
        const int8_t *cent = (const int8_t *)kn_cu_in(&c, idx->centroids, (size_t)C * d);
        const float *cscale = (const float *)kn_cu_in(&c, idx->cscale, (size_t)C * sizeof(float));
        const uint32_t *sizes = (const uint32_t *)kn_cu_in(&c, idx->sizes, (size_t)C * sizeof(uint32_t));
        float *L = (float *)kn_cu_alloc(&c, ((size_t)g * C + 1) * sizeof(float));
        float *m = (float *)kn_cu_alloc(&c, (size_t)g * sizeof(float));
        float *sum = (float *)kn_cu_alloc(&c, (size_t)g * sizeof(float));
        float *score = (float *)kn_cu_alloc(&c, ((size_t)C + 1) * sizeof(float));
        float *score_s = (float *)kn_cu_alloc(&c, ((size_t)C + 1) * sizeof(float));
        uint32_t *id = (uint32_t *)kn_cu_alloc(&c, ((size_t)C + 1) * sizeof(uint32_t));
        uint32_t *id_s = (uint32_t *)kn_cu_alloc(&c, ((size_t)C + 1) * sizeof(uint32_t));
        void *tmp;

        if (c.st != RI_OK)
            goto out;
        if (C == 0) {  /* nothing to rank: an empty estimation (o = 0, lse = -inf) */
            if (o_e != NULL)
                kn_cu_estimate_run(&c, L, 0, 1, m, g, d, id_s, 0, sizes, NULL, NULL, NULL, o_e,
                                   lse_e);
            goto out;
        }
        kn_cu_logits_kernel<<<(C + 7) / 8, 256, 0, c.s>>>(dq, g, d, kn_shape_scale(grp), cent, cscale, sizes, NULL,
                                                           C, L, C);
        kn_cu_head_stats_kernel<<<g, 256, 0, c.s>>>(L, C, C, sizes, NULL, 0, m, sum);
        kn_cu_score_kernel<<<(C + 255) / 256, 256, 0, c.s>>>(L, C, g, m, sum, sizes, score, id);
        kn_cu_check_launch(&c, "rank launch");
        /* keys are float bit patterns: sort all 32 bits */
        bits = 32;
        cub::DeviceRadixSort::SortPairsDescending(NULL, tmp_bytes, score, score_s, id, id_s, C, 0,
                                                  (int)bits, c.s);
        tmp = kn_cu_alloc(&c, tmp_bytes);
        if (c.st != RI_OK)
            goto out;
        c.st = kn_cu_status(cub::DeviceRadixSort::SortPairsDescending(
                                tmp, tmp_bytes, score, score_s, id, id_s, C, 0, (int)bits, c.s),
                            "radix sort");
        /* empty clusters (-inf) sort last: count the available ones among the best */
        kn_cu_out(&c, top, score_s, (size_t)want * sizeof(float));
        if (c.st == RI_OK)
            c.st = kn_cu_status(cudaStreamSynchronize(c.s), "sync");
        if (c.st != RI_OK)
            goto out;
        while (avail < want && top[avail] != -INFINITY)
            avail++;
        nr = n_r < avail ? n_r : avail;
        ne = n_e < avail - nr ? n_e : avail - nr;
        kn_cu_out(&c, ids, id_s, ((size_t)nr + ne) * sizeof(uint32_t));
        if (o_e != NULL) {
            const float *vsum_d = NULL, *vscale_d = NULL;
            const int8_t *vq = kn_cu_values(&c, idx, &vsum_d, &vscale_d);
            kn_cu_estimate_run(&c, L, C, 1, m, g, d, id_s + nr, (int)ne, sizes, vsum_d, vq, vscale_d, o_e, lse_e);
        }
    }
out:
    kn_cu_end(&c);
    free(top);
    if (c.st == RI_OK) {
        *n_r_p = nr;
        *n_e_p = ne;
    }
    return c.st;
}

ri_status_t kn_cuda_rank(const kn_shape_t *grp, const float *q, const kn_index_t *idx,
                         uint32_t n_r, uint32_t n_e, uint32_t *ids, uint32_t *n_r_p,
                         uint32_t *n_e_p)
{
    return kn_cu_rank_impl(grp, q, idx, n_r, n_e, ids, n_r_p, n_e_p, NULL, NULL);
}

extern "C" ri_status_t kn_cuda_rank_estimate(const kn_shape_t *grp, const float *q,
                                             const kn_index_t *idx, uint32_t n_r, uint32_t n_e,
                                             uint32_t *ids, uint32_t *n_r_p, uint32_t *n_e_p,
                                             float *o_e, float *lse_e)
{
    if (!kn_shape_valid(grp) || grp->n_kv_heads != 1 || grp->n_q_heads > KN_CU_MAXG ||
        grp->head_dim > KN_CU_MAXD || !q || !idx || !ids || !n_r_p || !n_e_p || !o_e || !lse_e ||
        idx->head_dim != grp->head_dim)
        return RI_ERR_INVALID;
    return kn_cu_rank_impl(grp, q, idx, n_r, n_e, ids, n_r_p, n_e_p, o_e, lse_e);
}

ri_status_t kn_cuda_estimate(const kn_shape_t *grp, const float *q, const kn_index_t *idx,
                             const uint32_t *ids, size_t n, float *o, float *lse)
{
    const int g = (int)grp->n_q_heads, d = (int)grp->head_dim, C = (int)idx->n_clusters;
    kn_cu_call_t c;

    kn_cu_begin(&c);
    const float *dq = (const float *)kn_cu_in(&c, q, (size_t)g * d * sizeof(float));
    const int8_t *cent = (const int8_t *)kn_cu_in(&c, idx->centroids, (size_t)C * d);
    const float *cscale = (const float *)kn_cu_in(&c, idx->cscale, (size_t)C * sizeof(float));
    const uint32_t *sizes = (const uint32_t *)kn_cu_in(&c, idx->sizes, (size_t)C * sizeof(uint32_t));
    const float *vsum = NULL, *vscale = NULL;
    const int8_t *vq = kn_cu_values(&c, idx, &vsum, &vscale);
    const uint32_t *dids = (const uint32_t *)kn_cu_in(&c, ids, n * sizeof(uint32_t));
    float *L = (float *)kn_cu_alloc(&c, ((size_t)g * n + 1) * sizeof(float));
    float *m = (float *)kn_cu_alloc(&c, (size_t)g * sizeof(float));
    if (c.st == RI_OK) {
        if (n > 0)
            kn_cu_logits_kernel<<<(unsigned)((n + 7) / 8), 256, 0, c.s>>>(
                dq, g, d, kn_shape_scale(grp), cent, cscale, sizes, dids, (int)n, L, (int)n);
        /* M_h = max_e (l_he + ln n_j): weights e^{l - M} then never overflow */
        kn_cu_head_stats_kernel<<<g, 256, 0, c.s>>>(L, (int)n, (int)n, sizes, dids, 1, m, NULL);
        kn_cu_estimate_run(&c, L, (int)n, 0, m, g, d, dids, (int)n, sizes, vsum, vq, vscale, o, lse);
    }
    return kn_cu_end(&c);
}
