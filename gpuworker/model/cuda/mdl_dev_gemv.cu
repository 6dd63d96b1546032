/*
 * The device engine's matrix-vector product (decode: 1..8 activation rows
 * against fp16 weights).  Decode is bound by the weight bytes, so the kernel
 * is built around reading each weight row once, in 16-byte loads, for the
 * whole batch: one warp per output row, each lane takes 8 consecutive
 * halves per load (rows are padded to a multiple of 8 halves, so every load
 * is aligned), multiplies them into up to 8 fp32 accumulators (one per batch
 * row), and a shuffle reduction sums the lanes.  The activations are small
 * (at most 8 x 2048 floats here) and read through the read-only cache.  A
 * row length that is not a multiple of 8 leaves a tail that the lanes take
 * one element at a time.  Checked on an H200 with synthetic models (test_model_dev; docs/cuda.md).
 */
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <stdint.h>

#include "gpuworker/model/cuda/mdl_dev_kern.h"

#define MDL_GEMV_WARPS 4 /* rows per block: small blocks keep every SM busy at 576 rows */

template <int NB>
static __global__ void mdl_gemv_kernel(const __half *__restrict__ w, size_t ld, int rows, int k,
                                       const float *__restrict__ x, size_t xs, float *__restrict__ y, size_t ys)
{
    int row = blockIdx.x * MDL_GEMV_WARPS + (threadIdx.x >> 5), lane = threadIdx.x & 31;
    if (row >= rows)
        return;
    const __half *wr = w + (size_t)row * ld;
    float acc[NB];
#pragma unroll
    for (int b = 0; b < NB; b++)
        acc[b] = 0.0f;
    int k8 = k & ~7;
    for (int i = lane * 8; i < k8; i += 32 * 8) {
        uint4 raw = __ldg(reinterpret_cast<const uint4 *>(wr + i));
        const __half2 *h2 = reinterpret_cast<const __half2 *>(&raw);
        float wf[8];
#pragma unroll
        for (int j = 0; j < 4; j++) {
            float2 f = __half22float2(h2[j]);
            wf[2 * j] = f.x;
            wf[2 * j + 1] = f.y;
        }
#pragma unroll
        for (int b = 0; b < NB; b++) {
            const float *xb = x + (size_t)b * xs + i;
#pragma unroll
            for (int j = 0; j < 8; j++)
                acc[b] = fmaf(wf[j], __ldg(xb + j), acc[b]);
        }
    }
    for (int i = k8 + lane; i < k; i += 32) {
        float wf = __half2float(wr[i]);
#pragma unroll
        for (int b = 0; b < NB; b++)
            acc[b] = fmaf(wf, __ldg(x + (size_t)b * xs + i), acc[b]);
    }
#pragma unroll
    for (int b = 0; b < NB; b++) {
        float v = acc[b];
#pragma unroll
        for (int off = 16; off > 0; off >>= 1)
            v += __shfl_xor_sync(0xffffffffu, v, off);
        if (lane == 0)
            y[(size_t)b * ys + row] = v;
    }
}

template <int NB>
static void mdl_gemv_launch(const __half *w, size_t ld, int rows, int k, const float *x, size_t xs, float *y,
                            size_t ys)
{
    unsigned blocks = (unsigned)((rows + MDL_GEMV_WARPS - 1) / MDL_GEMV_WARPS);
    mdl_gemv_kernel<NB><<<blocks, MDL_GEMV_WARPS * 32, 0, cudaStreamPerThread>>>(w, ld, rows, k, x, xs, y, ys);
}

extern "C" void mdl_dk_gemv(const uint16_t *w, size_t ld, size_t rows, size_t k, const float *x, size_t xs,
                            size_t n, float *y, size_t ys)
{
    const __half *hw = reinterpret_cast<const __half *>(w);
    int r = (int)rows, kk = (int)k;
    if (rows == 0)
        return;
    switch (n) {   /* one instantiation per batch size: the accumulators stay in registers */
    case 1: mdl_gemv_launch<1>(hw, ld, r, kk, x, xs, y, ys); break;
    case 2: mdl_gemv_launch<2>(hw, ld, r, kk, x, xs, y, ys); break;
    case 3: mdl_gemv_launch<3>(hw, ld, r, kk, x, xs, y, ys); break;
    case 4: mdl_gemv_launch<4>(hw, ld, r, kk, x, xs, y, ys); break;
    case 5: mdl_gemv_launch<5>(hw, ld, r, kk, x, xs, y, ys); break;
    case 6: mdl_gemv_launch<6>(hw, ld, r, kk, x, xs, y, ys); break;
    case 7: mdl_gemv_launch<7>(hw, ld, r, kk, x, xs, y, ys); break;
    case 8: mdl_gemv_launch<8>(hw, ld, r, kk, x, xs, y, ys); break;
    default: break;   /* mdl_dev.c never asks for more than MDL_DEV_MAX_BATCH */
    }
}
