/*
 * The per-call helpers of the CUDA backend (kn_cuda_common.cuh): scratch from
 * the stream-ordered pool, host spans staged in, results copied out, one
 * sticky status per call.
 */
#include "kernels/cuda/kn_cuda_common.cuh"

extern "C" {
#include "common/cm_log.h"
#include "kernels/cuda/kn_cuda.h"
}

ri_status_t kn_cu_status(cudaError_t e, const char *what)
{
    if (e == cudaSuccess)
        return RI_OK;
    cm_error("CUDA %s: %s", what, cudaGetErrorString(e));
    return e == cudaErrorMemoryAllocation ? RI_ERR_NOMEM : RI_ERR_DEVICE;
}

bool kn_cu_on_device(const void *p)
{
    cudaPointerAttributes a;
    if (p == NULL)
        return false;
    if (cudaPointerGetAttributes(&a, p) != cudaSuccess) {
        cudaGetLastError();  /* clear: plain host memory on old runtimes */
        return false;
    }
    return a.type == cudaMemoryTypeDevice || a.type == cudaMemoryTypeManaged;
}

void kn_cu_begin(kn_cu_call_t *c)
{
    c->s = cudaStreamPerThread;
    c->n_bufs = 0;
    c->st = RI_OK;
}

/* Set once a device turns out to have no memory pools (cudaMallocAsync not
 * supported): plain cudaMalloc from then on. */
static volatile int kn_cu_no_pools;

void *kn_cu_alloc(kn_cu_call_t *c, size_t bytes)
{
    void *p = NULL;
    bool pooled = !kn_cu_no_pools;
    cudaError_t e = cudaErrorNotSupported;
    if (c->st != RI_OK)
        return NULL;
    if (c->n_bufs == KN_CU_CALL_BUFS) {
        c->st = RI_ERR_INTERNAL;
        return NULL;
    }
    if (pooled)
        e = cudaMallocAsync(&p, bytes ? bytes : 1, c->s);
    if (e == cudaErrorNotSupported) {
        cudaGetLastError();
        kn_cu_no_pools = 1;
        pooled = false;
        e = cudaMalloc(&p, bytes ? bytes : 1);
    }
    c->st = kn_cu_status(e, "malloc");
    if (c->st != RI_OK)
        return NULL;
    c->pooled[c->n_bufs] = pooled;
    c->bufs[c->n_bufs++] = p;
    return p;
}

const void *kn_cu_in(kn_cu_call_t *c, const void *p, size_t bytes)
{
    void *d;
    if (c->st != RI_OK)
        return NULL;
    if (bytes == 0 || kn_cu_on_device(p))
        return p;
    d = kn_cu_alloc(c, bytes);
    if (d != NULL)
        c->st = kn_cu_status(cudaMemcpyAsync(d, p, bytes, cudaMemcpyHostToDevice, c->s), "copy in");
    return c->st == RI_OK ? d : NULL;
}

void kn_cu_out(kn_cu_call_t *c, void *dst, const void *src, size_t bytes)
{
    if (c->st != RI_OK || bytes == 0)
        return;
    c->st = kn_cu_status(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDefault, c->s), "copy out");
}

void kn_cu_zero(kn_cu_call_t *c, void *p, size_t bytes)
{
    if (c->st != RI_OK || bytes == 0)
        return;
    c->st = kn_cu_status(cudaMemsetAsync(p, 0, bytes, c->s), "memset");
}

void kn_cu_check_launch(kn_cu_call_t *c, const char *what)
{
    cudaError_t e = cudaGetLastError();
    if (c->st == RI_OK)
        c->st = kn_cu_status(e, what);
}

ri_status_t kn_cu_end(kn_cu_call_t *c)
{
    ri_status_t st;
    kn_cu_check_launch(c, "launch");
    st = kn_cu_status(cudaStreamSynchronize(c->s), "sync");
    if (c->st == RI_OK)
        c->st = st;
    for (int i = c->n_bufs - 1; i >= 0; i--) {
        if (c->pooled[i])
            cudaFreeAsync(c->bufs[i], c->s);
        else
            cudaFree(c->bufs[i]);
    }
    c->n_bufs = 0;
    return c->st;
}

extern "C" ri_status_t kn_cuda_malloc(void **p, size_t bytes)
{
    *p = NULL;
    return kn_cu_status(cudaMalloc(p, bytes ? bytes : 1), "malloc");
}

extern "C" void kn_cuda_free(void *p)
{
    cudaFree(p);
}

extern "C" ri_status_t kn_cuda_copy(void *dst, const void *src, size_t bytes)
{
    if (bytes == 0)
        return RI_OK;
    return kn_cu_status(cudaMemcpy(dst, src, bytes, cudaMemcpyDefault), "copy");
}

extern "C" ri_status_t kn_cuda_zero(void *p, size_t bytes)
{
    if (bytes == 0)
        return RI_OK;
    return kn_cu_status(cudaMemset(p, 0, bytes), "memset");
}
