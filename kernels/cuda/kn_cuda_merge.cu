/*
 * CUDA merge: any number of (o, lse) parts of n_rows rows, merged by
 * log-sum-exp; empty parts (lse = -inf) allowed.  Small (a few rows of d
 * values per part): one block per row, threads over d, the parts read
 * through a device array of part pointers; every part, host or device, is
 * first copied into one device pack.
 */
#include <stdlib.h>

#include "kernels/cuda/kn_cuda_common.cuh"

static __global__ void kn_cu_merge_kernel(const float *const *o_parts,
                                          const float *const *lse_parts, int n_parts, int d,
                                          float *o, float *lse)
{
    const int r = blockIdx.x;
    float m = -INFINITY, den = 0.0f;
    for (int p = 0; p < n_parts; p++)
        m = fmaxf(m, lse_parts[p][r]);
    if (m != -INFINITY)
        for (int p = 0; p < n_parts; p++) {
            float x = lse_parts[p][r];
            den += x == -INFINITY ? 0.0f : expf(x - m);
        }
    for (int i = threadIdx.x; i < d; i += blockDim.x) {
        float acc = 0.0f;
        if (m != -INFINITY)
            for (int p = 0; p < n_parts; p++) {
                float x = lse_parts[p][r];
                if (x != -INFINITY)
                    acc += expf(x - m) * o_parts[p][(size_t)r * d + i];
            }
        o[(size_t)r * d + i] = den > 0.0f ? acc / den : 0.0f;
    }
    if (threadIdx.x == 0)
        lse[r] = den > 0.0f ? m + logf(den) : -INFINITY;
}

ri_status_t kn_cuda_merge(size_t n_rows, uint32_t d, size_t n_parts, const float *const *o_parts,
                          const float *const *lse_parts, float *o, float *lse)
{
    const size_t per = n_rows * d + n_rows;  /* floats of one part in the pack */
    const float **ptr = (const float **)malloc((2 * n_parts + 1) * sizeof(float *));
    kn_cu_call_t c;

    kn_cu_begin(&c);
    if (ptr == NULL)
        c.st = RI_ERR_NOMEM;
    /* every part (host or device) copied into one device pack: one
     * allocation whatever the number of parts */
    float *pack = (float *)kn_cu_alloc(&c, (n_parts * per + 1) * sizeof(float));
    for (size_t p = 0; p < n_parts && c.st == RI_OK; p++) {
        float *po = pack + p * per, *pl = po + n_rows * d;
        kn_cu_out(&c, po, o_parts[p], n_rows * d * sizeof(float));
        kn_cu_out(&c, pl, lse_parts[p], n_rows * sizeof(float));
        ptr[p] = po;
        ptr[n_parts + p] = pl;
    }
    const float *const *dptr =
        (const float *const *)kn_cu_in(&c, ptr, 2 * n_parts * sizeof(float *));
    float *dout = (float *)kn_cu_alloc(&c, n_rows * d * sizeof(float));
    float *dlse = (float *)kn_cu_alloc(&c, n_rows * sizeof(float));
    if (c.st == RI_OK && n_rows > 0) {
        kn_cu_merge_kernel<<<(unsigned)n_rows, 128, 0, c.s>>>(dptr, dptr + n_parts, (int)n_parts,
                                                              (int)d, dout, dlse);
        kn_cu_check_launch(&c, "merge launch");
        kn_cu_out(&c, o, dout, n_rows * d * sizeof(float));
        kn_cu_out(&c, lse, dlse, n_rows * sizeof(float));
    }
    kn_cu_end(&c);
    free(ptr);
    return c.st;
}
