/*
 * The host memory space, and the choice of space for a backend (kn_mem.h).
 */
#include "kernels/kn_mem.h"

#include <stdatomic.h>
#include <string.h>

#include "common/cm_alloc.h"

static CM_ALLOC_TAG(kn_mem_host_tag, "kernels.mem.host");

static ri_status_t kn_mem_host_alloc(void **p, size_t bytes)
{
    /* 64-byte rows, as the SIMD kernels like; bytes 0 still gets a pointer */
    *p = cm_malloc_aligned(&kn_mem_host_tag, bytes ? bytes : 1, 64);
    return *p != NULL ? RI_OK : RI_ERR_NOMEM;
}

static void kn_mem_host_free(void *p)
{
    cm_free(p);
}

static ri_status_t kn_mem_host_copy(void *dst, const void *src, size_t bytes)
{
    if (bytes > 0)
        memmove(dst, src, bytes);
    return RI_OK;
}

static ri_status_t kn_mem_host_zero(void *p, size_t bytes)
{
    if (bytes > 0)
        memset(p, 0, bytes);
    return RI_OK;
}

static const kn_mem_t kn_mem_host_space = {
    .name = "host",
    .device = false,
    .alloc = kn_mem_host_alloc,
    .free = kn_mem_host_free,
    .copy = kn_mem_host_copy,
    .zero = kn_mem_host_zero,
};

/* Written once by kn_cuda_init, read by any thread. */
static _Atomic(const kn_mem_t *) kn_mem_cuda_space;

const kn_mem_t *kn_mem_host(void)
{
    return &kn_mem_host_space;
}

void kn_mem_register_cuda(const kn_mem_t *mem)
{
    atomic_store(&kn_mem_cuda_space, mem);
}

const kn_mem_t *kn_mem_of(const kn_ops_t *ops)
{
    if (ops == NULL)
        ops = kn_ops_default();
    const kn_mem_t *cuda = atomic_load(&kn_mem_cuda_space);
    if (cuda != NULL && ops != NULL && strcmp(ops->name, "cuda") == 0)
        return cuda;
    return &kn_mem_host_space;
}
