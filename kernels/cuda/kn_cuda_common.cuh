/*
 * Shared plumbing of the CUDA backend (the .cu files of kernels/cuda): the per-call
 * scratch and staging helper, the host/device pointer rule, status
 * conversion, warp reductions, and the entry points each .cu file exports to
 * the table in kn_cuda.cu.
 *
 * Pointer rule (every op): an input span may live in host or device (or
 * managed) memory; device spans are read where they are, host spans are
 * staged through device scratch, so the cross-check harness runs the same
 * host-memory cases on every backend while a device-resident caller (the
 * device bench) pays no copies.  Outputs are written with cudaMemcpyDefault,
 * so they too may be host or device memory.
 *
 * Every op runs on cudaStreamPerThread and allocates its scratch with the
 * stream-ordered allocator (pooled, so a small op costs no cudaMalloc), which
 * keeps the group-level ops safe to call from many pool threads at once, as
 * kn_wave does (checked on an H200: docs/cuda.md).
 */
#ifndef KN_CUDA_COMMON_CUH
#define KN_CUDA_COMMON_CUH

#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <math.h>
#include <stddef.h>
#include <stdint.h>

extern "C" {
#include "common/cm_status.h"
#include "kernels/kn_ops.h"
}
#include "kernels/cuda/kn_cuda_glue.h"

#define KN_CU_MAXG 8      /* largest GQA group on the device (registers per thread) */
#define KN_CU_MAXD 256    /* largest head_dim of the group ops (shared memory) */
#define KN_CU_CALL_BUFS 40

/* One op call: its stream, the scratch it allocated, and a sticky status:
 * after the first failure every helper does nothing and kn_cu_end reports it. */
typedef struct kn_cu_call {
    cudaStream_t s;
    void *bufs[KN_CU_CALL_BUFS];
    bool pooled[KN_CU_CALL_BUFS];  /* from cudaMallocAsync (else cudaMalloc) */
    int n_bufs;
    ri_status_t st;
} kn_cu_call_t;

/* Converts a CUDA error once, where it enters our code (logged once). */
ri_status_t kn_cu_status(cudaError_t e, const char *what);

/* True when p is device or managed memory (usable by kernels as it is). */
bool kn_cu_on_device(const void *p);

void kn_cu_begin(kn_cu_call_t *c);
/* Device scratch of bytes (at least 1), freed by kn_cu_end; NULL after a failure. */
void *kn_cu_alloc(kn_cu_call_t *c, size_t bytes);
/* A device view of bytes at p: p itself when on the device, else a staged copy. */
const void *kn_cu_in(kn_cu_call_t *c, const void *p, size_t bytes);
/* Copy bytes of device scratch src to dst (host or device). */
void kn_cu_out(kn_cu_call_t *c, void *dst, const void *src, size_t bytes);
/* Zero bytes of device scratch. */
void kn_cu_zero(kn_cu_call_t *c, void *p, size_t bytes);
/* Check the launches, wait for the stream, free the scratch; the call's status. */
ri_status_t kn_cu_end(kn_cu_call_t *c);
/* Record a launch error (cudaGetLastError) in the call. */
void kn_cu_check_launch(kn_cu_call_t *c, const char *what);

static __device__ __forceinline__ float kn_cu_warp_sum(float x)
{
    for (int off = 16; off > 0; off >>= 1)
        x += __shfl_xor_sync(0xffffffffu, x, off);
    return x;
}

static __device__ __forceinline__ float kn_cu_warp_max(float x)
{
    for (int off = 16; off > 0; off >>= 1)
        x = fmaxf(x, __shfl_xor_sync(0xffffffffu, x, off));
    return x;
}

static __device__ __forceinline__ double kn_cu_warp_sum_d(double x)
{
    for (int off = 16; off > 0; off >>= 1)
        x += __shfl_xor_sync(0xffffffffu, x, off);
    return x;
}

/* Block-wide sum in double (blockDim.x a multiple of 32, <= 1024); every
 * thread gets the result.  Fixed order: deterministic. */
static __device__ double kn_cu_block_sum_d(double x)
{
    __shared__ double sh[32];
    int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nw = blockDim.x >> 5;
    x = kn_cu_warp_sum_d(x);
    __syncthreads();
    if (lane == 0)
        sh[warp] = x;
    __syncthreads();
    x = 0.0;
    for (int w = 0; w < nw; w++)
        x += sh[w];
    return x;
}

/* ---- the ops, one .cu file each (kn_cuda.cu builds the table) ---- */
/* attn_decode / attn_pages shapes the decode kernel takes (g <= 8, d <= 256). */
bool kn_cuda_attn_shape_ok(const kn_shape_t *shape);
ri_status_t kn_cuda_attn_decode(const kn_shape_t *shape, size_t n_seq, const float *q,
                                const kn_kv_view_t *kv, float *out, float *lse);
ri_status_t kn_cuda_attn_pages(const kn_shape_t *grp, const float *q, const kn_page_t *pages,
                               size_t n_pages, float *o, float *lse);
ri_status_t kn_cuda_rank(const kn_shape_t *grp, const float *q, const kn_index_t *idx,
                         uint32_t n_r, uint32_t n_e, uint32_t *ids, uint32_t *n_r_p,
                         uint32_t *n_e_p);
ri_status_t kn_cuda_estimate(const kn_shape_t *grp, const float *q, const kn_index_t *idx,
                             const uint32_t *ids, size_t n, float *o, float *lse);
ri_status_t kn_cuda_merge(size_t n_rows, uint32_t d, size_t n_parts, const float *const *o_parts,
                          const float *const *lse_parts, float *o, float *lse);
ri_status_t kn_cuda_index_build(const kn_build_params_t *p, const cm_fp16_t *k,
                                const cm_fp16_t *v, size_t stride, uint32_t n,
                                uint32_t token_base, uint32_t n_clusters, uint32_t n_segments,
                                kn_index_t *idx);
ri_status_t kn_cuda_quest_score(const kn_shape_t *grp, const float *q, const cm_fp16_t *kmin,
                                const cm_fp16_t *kmax, size_t n_pages, float *scores);

#endif /* KN_CUDA_COMMON_CUH */
