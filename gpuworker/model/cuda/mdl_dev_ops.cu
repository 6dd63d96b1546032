/*
 * The device engine's small kernels (norms, residuals, GLU, soft-capping,
 * Q/K norm + RoPE + K/V store) and its device memory helpers.  Each kernel
 * mirrors a loop of mdl_model.c / mdl_vec.c, with the same formulas in the
 * same order (sums of squares in double as mdl_vec_rmsnorm's scalar path),
 * so that the device's logits differ from the CPU's only by the fp16
 * weights and the order of the sums.  Checked on an H200 with synthetic models (test_model_dev; docs/cuda.md).
 */
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <stdint.h>

#include "gpuworker/model/cuda/mdl_dev_kern.h"

extern "C" {
#include "common/cm_log.h"
}

#define MDL_DK_THREADS 256 /* per-row kernels: rows are 576..2048 elements */

/* ---- device memory ---- */

/* A CUDA error as a status, logged where it happened (the caller's message
 * then only says which step failed). */
static ri_status_t mdl_dk_status(cudaError_t e, const char *what)
{
    if (e == cudaSuccess)
        return RI_OK;
    cm_error("device decode: %s: %s", what, cudaGetErrorString(e));
    return e == cudaErrorMemoryAllocation ? RI_ERR_NOMEM : RI_ERR_DEVICE;
}

extern "C" ri_status_t mdl_dk_probe(void)
{
    int count = 0;
    cudaError_t e = cudaGetDeviceCount(&count);
    if (e != cudaSuccess || count == 0) {
        cudaGetLastError();   /* clear it: a machine without a driver is not an error here */
        return RI_ERR_NO_DEVICE;
    }
    return RI_OK;
}

extern "C" ri_status_t mdl_dk_malloc(void **p, size_t bytes)
{
    *p = NULL;
    if (bytes == 0)
        return RI_OK;
    return mdl_dk_status(cudaMalloc(p, bytes), "cudaMalloc");
}

extern "C" void mdl_dk_free(void *p)
{
    if (p != NULL)
        cudaFree(p);
}

extern "C" ri_status_t mdl_dk_h2d(void *dst, const void *src, size_t bytes)
{
    if (bytes == 0)
        return RI_OK;
    cudaError_t e = cudaMemcpyAsync(dst, src, bytes, cudaMemcpyHostToDevice, cudaStreamPerThread);
    if (e == cudaSuccess)
        e = cudaStreamSynchronize(cudaStreamPerThread);   /* src may be reused at once */
    return mdl_dk_status(e, "copy to the device");
}

extern "C" ri_status_t mdl_dk_d2h(void *dst, const void *src, size_t bytes)
{
    if (bytes == 0)
        return RI_OK;
    cudaError_t e = cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToHost, cudaStreamPerThread);
    if (e == cudaSuccess)
        e = cudaStreamSynchronize(cudaStreamPerThread);
    return mdl_dk_status(e, "copy from the device");
}

extern "C" ri_status_t mdl_dk_sync(const char *what)
{
    cudaError_t e = cudaGetLastError();   /* a launch that failed (bad configuration) */
    if (e == cudaSuccess)
        e = cudaStreamSynchronize(cudaStreamPerThread);
    return mdl_dk_status(e, what);
}

/* ---- reductions ---- */

/* Sum of v over the block (blockDim.x a multiple of 32, <= 1024); every
 * thread gets the total.  sh has 32 doubles. */
static __device__ double mdl_dk_block_sum(double v, double *sh)
{
    int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nw = blockDim.x >> 5;
    for (int off = 16; off > 0; off >>= 1)
        v += __shfl_xor_sync(0xffffffffu, v, off);
    __syncthreads();   /* sh may still be read by a previous call */
    if (lane == 0)
        sh[warp] = v;
    __syncthreads();
    double t = 0.0;
    for (int i = 0; i < nw; i++)   /* fixed order: the same total on every thread and run */
        t += sh[i];
    return t;
}

/* 1 / rms of x[0..n) as mdl_vec_rmsnorm computes it. */
static __device__ float mdl_dk_inv_rms(const float *x, int n, float eps, double *sh)
{
    double ss = 0.0;
    for (int i = threadIdx.x; i < n; i += blockDim.x)
        ss += (double)x[i] * x[i];
    ss = mdl_dk_block_sum(ss, sh);
    return (float)(1.0 / sqrt(ss / (double)n + eps));
}

/* ---- norms, residual, GLU, soft-cap ---- */

static __global__ void mdl_dk_rmsnorm_kernel(float *out, const float *x, const float *w, int n, float eps)
{
    __shared__ double sh[32];
    const float *xr = x + (size_t)blockIdx.x * n;
    float *o = out + (size_t)blockIdx.x * n;
    float r = mdl_dk_inv_rms(xr, n, eps, sh);
    __syncthreads();   /* out may be x: every thread has read its squares */
    for (int i = threadIdx.x; i < n; i += blockDim.x)
        o[i] = xr[i] * r * w[i];
}

extern "C" void mdl_dk_rmsnorm(float *out, const float *x, const float *w, size_t n, size_t rows, float eps)
{
    if (rows > 0)
        mdl_dk_rmsnorm_kernel<<<(unsigned)rows, MDL_DK_THREADS, 0, cudaStreamPerThread>>>(out, x, w, (int)n, eps);
}

static __global__ void mdl_dk_residual_kernel(float *x, float *xb, const float *post_norm, int n, float eps)
{
    __shared__ double sh[32];
    float *xr = x + (size_t)blockIdx.x * n, *br = xb + (size_t)blockIdx.x * n;
    float r = post_norm != NULL ? mdl_dk_inv_rms(br, n, eps, sh) : 1.0f;
    for (int i = threadIdx.x; i < n; i += blockDim.x) {
        float v = post_norm != NULL ? br[i] * r * post_norm[i] : br[i];
        br[i] = v;
        xr[i] += v;
    }
}

extern "C" void mdl_dk_residual(float *x, float *xb, const float *post_norm, size_t n, size_t rows, float eps)
{
    if (rows > 0)
        mdl_dk_residual_kernel<<<(unsigned)rows, MDL_DK_THREADS, 0, cudaStreamPerThread>>>(x, xb, post_norm,
                                                                                           (int)n, eps);
}

#define MDL_DK_GELU_C 0.7978845608028654f /* sqrt(2 / pi), as mdl_vec_geglu */

static __global__ void mdl_dk_glu_kernel(float *g, const float *u, size_t n, int geglu)
{
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n)
        return;
    float x = g[i];
    if (geglu)
        g[i] = 0.5f * x * (1.0f + tanhf(MDL_DK_GELU_C * (x + 0.044715f * x * x * x))) * u[i];
    else
        g[i] = x / (1.0f + expf(-x)) * u[i];
}

extern "C" void mdl_dk_glu(float *g, const float *u, size_t n, int geglu)
{
    if (n > 0)
        mdl_dk_glu_kernel<<<(unsigned)((n + MDL_DK_THREADS - 1) / MDL_DK_THREADS), MDL_DK_THREADS, 0,
                            cudaStreamPerThread>>>(g, u, n, geglu);
}

static __global__ void mdl_dk_softcap_kernel(float *l, size_t n, float cap)
{
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n)
        l[i] = cap * tanhf(l[i] / cap);
}

extern "C" void mdl_dk_softcap(float *logits, size_t n, float cap)
{
    if (n > 0)
        mdl_dk_softcap_kernel<<<(unsigned)((n + MDL_DK_THREADS - 1) / MDL_DK_THREADS), MDL_DK_THREADS, 0,
                                cudaStreamPerThread>>>(logits, n, cap);
}

/* ---- Q/K norm, RoPE, K/V store ---- */

/* One block per (batch row, head); heads [0, n_heads) are Q, the next
 * n_kv_heads are K (and store their V too).  mdl_qk_prepare's order: norm,
 * then RoPE, then the store. */
static __global__ void mdl_dk_qk_kernel(mdl_dk_qk_t g, float *q, float *k, const float *v, const float *q_norm,
                                        const float *k_norm, const float *cs, size_t cs_stride,
                                        const mdl_dk_row_t *rows)
{
    __shared__ double sh[32];
    int b = blockIdx.x, h = blockIdx.y, d = (int)g.head_dim, half = (int)g.n_rot / 2;
    bool is_q = h < (int)g.n_heads;
    int kh = h - (int)g.n_heads;
    float *e = is_q ? q + ((size_t)b * g.n_heads + h) * d : k + ((size_t)b * g.n_kv_heads + kh) * d;
    const float *w = is_q ? q_norm : k_norm;
    if (w != NULL) {
        float r = mdl_dk_inv_rms(e, d, g.eps, sh);
        __syncthreads();   /* every thread has read e before any rewrites it */
        for (int i = threadIdx.x; i < d; i += blockDim.x)
            e[i] = e[i] * r * w[i];
        __syncthreads();
    }
    const float *c = cs + (size_t)b * cs_stride;
    for (int i = threadIdx.x; i < half; i += blockDim.x) {
        int i0 = g.neox ? i : 2 * i, i1 = g.neox ? i + half : 2 * i + 1;
        float cc = c[2 * i], ss = c[2 * i + 1], x0 = e[i0], x1 = e[i1];
        e[i0] = x0 * cc - x1 * ss;
        e[i1] = x0 * ss + x1 * cc;
    }
    if (is_q)
        return;
    __syncthreads();
    mdl_dk_row_t row = rows[b];
    size_t at = ((size_t)kh * row.cap + row.pos) * d;
    __half *kc = reinterpret_cast<__half *>(row.k) + at, *vc = reinterpret_cast<__half *>(row.v) + at;
    const float *vr = v + ((size_t)b * g.n_kv_heads + kh) * d;
    for (int i = threadIdx.x; i < d; i += blockDim.x) {
        kc[i] = __float2half_rn(e[i]);
        vc[i] = __float2half_rn(vr[i]);
    }
}

extern "C" void mdl_dk_qk_store(const mdl_dk_qk_t *g, float *q, float *k, const float *v, const float *q_norm,
                                const float *k_norm, const float *cs, size_t cs_stride, const mdl_dk_row_t *rows,
                                size_t n)
{
    if (n == 0)
        return;
    dim3 grid((unsigned)n, g->n_heads + g->n_kv_heads);
    mdl_dk_qk_kernel<<<grid, 128, 0, cudaStreamPerThread>>>(*g, q, k, v, q_norm, k_norm, cs, cs_stride, rows);
}
