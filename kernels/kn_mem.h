/*
 * Memory spaces: where a backend's ops read their operands (docs/cuda.md
 * "Memory spaces").  The host space is plain heap memory, what the ref and
 * cpu backends read; the cuda space is device memory, what the cuda
 * backend's wave_step and attn_pages_device read.  Code that keeps data
 * where a backend reads it (the device wave index, the device block cache)
 * is written once over this table and runs on the CPU with the host space,
 * so its logic is tested on a machine without a GPU.
 *
 * Every function is thread-safe.  copy waits for the bytes to land.
 */
#ifndef KN_MEM_H
#define KN_MEM_H

#include <stdbool.h>
#include <stddef.h>

#include "kernels/kn_ops.h"
#include "retroinfer/status.h"

typedef struct kn_mem {
    const char *name;   /* "host", "cuda" */
    bool device;        /* true: a host pointer cannot read it */
    /* bytes of this space's memory (bytes 0 allowed: a valid unique
     * pointer); *p NULL on error.  RI_ERR_NOMEM, RI_ERR_DEVICE. */
    ri_status_t (*alloc)(void **p, size_t bytes);
    /* NULL is a no-op. */
    void (*free)(void *p);
    /* bytes from src to dst, each either host memory or this space's;
     * waits.  RI_ERR_DEVICE on a device error. */
    ri_status_t (*copy)(void *dst, const void *src, size_t bytes);
    /* bytes of this space's memory at p set to 0.  RI_ERR_DEVICE. */
    ri_status_t (*zero)(void *p, size_t bytes);
} kn_mem_t;

/* The host space (always present). */
const kn_mem_t *kn_mem_host(void);

/* The space whose memory ops reads in place: the cuda space for the cuda
 * backend (once kn_cuda_init registered it), the host space for every
 * other backend.  ops NULL = kn_ops_default(). */
const kn_mem_t *kn_mem_of(const kn_ops_t *ops);

/* Called by kn_cuda_init with the cuda space (borrowed forever). */
void kn_mem_register_cuda(const kn_mem_t *mem);

#endif /* KN_MEM_H */
