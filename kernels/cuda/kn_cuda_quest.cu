/*
 * CUDA quest_score (the Quest baseline): per page p the upper bound
 * max over the group's heads of scale * sum_i max(q_i kmin_i, q_i kmax_i).
 * One pass over the page bounds (2 x d fp16 per page): one warp per page,
 * lanes over d, the query heads in shared memory.  Groups of up to 8 heads,
 * d <= 256.
 */
#include "kernels/cuda/kn_cuda_common.cuh"

static __global__ void kn_cu_quest_kernel(const float *q, int g, int d, float scale,
                                          const __half *kmin, const __half *kmax, int n_pages,
                                          float *scores)
{
    __shared__ float qs[KN_CU_MAXG * KN_CU_MAXD];
    const int lane = threadIdx.x & 31, p = blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5);
    for (int i = threadIdx.x; i < g * d; i += blockDim.x)
        qs[i] = q[i];
    __syncthreads();
    if (p >= n_pages)
        return;
    float s[KN_CU_MAXG];
    for (int h = 0; h < KN_CU_MAXG; h++)
        s[h] = 0.0f;
    for (int i = lane; i < d; i += 32) {
        float a = __half2float(kmin[(size_t)p * d + i]), b = __half2float(kmax[(size_t)p * d + i]);
        for (int h = 0; h < KN_CU_MAXG; h++)
            if (h < g)
                s[h] += fmaxf(qs[h * d + i] * a, qs[h * d + i] * b);
    }
    float best = -INFINITY;
    for (int h = 0; h < KN_CU_MAXG; h++) {
        if (h >= g)
            break;
        best = fmaxf(best, kn_cu_warp_sum(s[h]));
    }
    if (lane == 0)
        scores[p] = best * scale;
}

ri_status_t kn_cuda_quest_score(const kn_shape_t *grp, const float *q, const cm_fp16_t *kmin,
                                const cm_fp16_t *kmax, size_t n_pages, float *scores)
{
    const int g = (int)grp->n_q_heads, d = (int)grp->head_dim;
    kn_cu_call_t c;

    kn_cu_begin(&c);
    const float *dq = (const float *)kn_cu_in(&c, q, (size_t)g * d * sizeof(float));
    const __half *mn = (const __half *)kn_cu_in(&c, kmin, n_pages * d * sizeof(cm_fp16_t));
    const __half *mx = (const __half *)kn_cu_in(&c, kmax, n_pages * d * sizeof(cm_fp16_t));
    float *ds = (float *)kn_cu_alloc(&c, n_pages * sizeof(float));
    if (c.st == RI_OK && n_pages > 0) {
        kn_cu_quest_kernel<<<(unsigned)((n_pages + 7) / 8), 256, 0, c.s>>>(
            dq, g, d, kn_shape_scale(grp), mn, mx, (int)n_pages, ds);
        kn_cu_check_launch(&c, "quest launch");
        kn_cu_out(&c, scores, ds, n_pages * sizeof(float));
    }
    return kn_cu_end(&c);
}
