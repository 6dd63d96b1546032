/*
 * Device helpers of ri-bench-cuda: memory, copies, and the HBM bandwidth
 * reference the decode figures are compared with (bn_cuda_dev.h).
 */
#include <cuda_runtime.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bench/cuda/bn_cuda_dev.h"

static int bn_cu_check(cudaError_t e, const char *what)
{
    if (e == cudaSuccess)
        return 0;
    fprintf(stderr, "bench: CUDA %s: %s\n", what, cudaGetErrorString(e));
    return -1;
}

extern "C" int bn_cu_describe(char *name, size_t name_len, double *mem_gib, int *sms, int *clock_mhz)
{
    cudaDeviceProp p;
    int clk = 0;
    if (bn_cu_check(cudaGetDeviceProperties(&p, 0), "properties") != 0)
        return -1;
    snprintf(name, name_len, "%s", p.name);
    *mem_gib = (double)p.totalGlobalMem / (1 << 30);
    *sms = p.multiProcessorCount;
    cudaDeviceGetAttribute(&clk, cudaDevAttrClockRate, 0);
    *clock_mhz = clk / 1000;
    return 0;
}

extern "C" int bn_cu_alloc(void **p, size_t bytes)
{
    return bn_cu_check(cudaMalloc(p, bytes ? bytes : 1), "malloc");
}

extern "C" void bn_cu_free(void *p)
{
    cudaFree(p);
}

extern "C" int bn_cu_upload(void *dst, const void *src, size_t bytes)
{
    return bn_cu_check(cudaMemcpy(dst, src, bytes, cudaMemcpyHostToDevice), "upload");
}

static __global__ void bn_cu_read_kernel(const float4 *p, size_t n, float *sink)
{
    float s = 0.0f;
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x) {
        float4 v = __ldcs(p + i);  /* streaming: do not keep it in L2 */
        s += v.x + v.y + v.z + v.w;
    }
    if (s == 1234.5f)  /* practically never: keeps the loads alive */
        sink[0] = s;
}

static int bn_cu_cmp(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

extern "C" int bn_cu_hbm_bw(size_t bytes, int reps, double *read_gbs, double *copy_gbs)
{
    void *a = NULL, *b = NULL;
    float *sink = NULL;
    double t_read[64], t_copy[64];
    cudaEvent_t e0, e1;
    int sms = 0, rc = -1;
    if (reps > 64)
        reps = 64;
    bytes &= ~(size_t)15;
    if (bn_cu_check(cudaMalloc(&a, bytes), "malloc") || bn_cu_check(cudaMalloc(&b, bytes), "malloc") ||
        bn_cu_check(cudaMalloc(&sink, sizeof(float)), "malloc"))
        goto out;
    cudaMemset(a, 1, bytes);
    cudaEventCreate(&e0);
    cudaEventCreate(&e1);
    cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0);
    for (int r = 0; r < reps + 1; r++) {  /* the first of each is a warm-up */
        float ms = 0.0f;
        cudaEventRecord(e0);
        bn_cu_read_kernel<<<sms * 8, 512>>>((const float4 *)a, bytes / 16, sink);
        cudaEventRecord(e1);
        if (bn_cu_check(cudaEventSynchronize(e1), "read kernel"))
            goto out_ev;
        cudaEventElapsedTime(&ms, e0, e1);
        if (r > 0)
            t_read[r - 1] = ms * 1e-3;
        cudaEventRecord(e0);
        cudaMemcpyAsync(b, a, bytes, cudaMemcpyDeviceToDevice);
        cudaEventRecord(e1);
        if (bn_cu_check(cudaEventSynchronize(e1), "copy"))
            goto out_ev;
        cudaEventElapsedTime(&ms, e0, e1);
        if (r > 0)
            t_copy[r - 1] = ms * 1e-3;
    }
    qsort(t_read, (size_t)reps, sizeof(double), bn_cu_cmp);
    qsort(t_copy, (size_t)reps, sizeof(double), bn_cu_cmp);
    *read_gbs = bytes / t_read[reps / 2] / 1e9;
    *copy_gbs = 2.0 * bytes / t_copy[reps / 2] / 1e9;
    rc = 0;
out_ev:
    cudaEventDestroy(e0);
    cudaEventDestroy(e1);
out:
    cudaFree(a);
    cudaFree(b);
    cudaFree(sink);
    return rc;
}

extern "C" int bn_cu_flush(void)
{
    static void *buf;
    static float *sink;
    static const size_t bytes = (size_t)256 << 20;
    int sms = 0;
    if (buf == NULL) {
        if (bn_cu_check(cudaMalloc(&buf, bytes), "malloc") ||
            bn_cu_check(cudaMalloc(&sink, sizeof(float)), "malloc"))
            return -1;
        cudaMemset(buf, 0, bytes);
    }
    cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0);
    bn_cu_read_kernel<<<sms * 8, 512>>>((const float4 *)buf, bytes / 16, sink);
    return bn_cu_check(cudaDeviceSynchronize(), "flush");
}
