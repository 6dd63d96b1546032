/*
 * The synthetic model's weights generated in device memory (mdl_dev_synth.c):
 * one thread per element runs the generator of mdl_synth_gen.h, the same
 * code the CPU's GGUF writer runs, so an 8B model's 16 GB need no host copy
 * and are the bits the file would hold.  A device-to-device copy for the
 * K/V filler.
 */
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <stdint.h>

#include "gpuworker/model/cuda/mdl_dev_synth_kern.h"
#include "gpuworker/model/mdl_synth_gen.h"

extern "C" {
#include "common/cm_log.h"
}

#define MDL_DKS_THREADS 256
#define MDL_DKS_MAX_BLOCKS 65535u   /* grid-stride beyond: a 128256 x 4096 head is 525M elements */

static __global__ void mdl_dks_fill_kern(uint16_t *w, uint64_t rows, uint64_t cols, uint64_t ld, uint64_t key,
                                         float scale)
{
    uint64_t n = rows * ld;
    for (uint64_t i = (uint64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (uint64_t)gridDim.x * blockDim.x) {
        uint64_t r = i / ld, c = i - r * ld;
        w[i] = c < cols ? __half_as_ushort(__float2half_rn(mdl_synth_weight(key, r * cols + c, scale))) : 0;
    }
}

extern "C" void mdl_dk_synth_fill(uint16_t *w, size_t rows, size_t cols, size_t ld, uint64_t key, float scale)
{
    uint64_t n = (uint64_t)rows * ld, blocks = (n + MDL_DKS_THREADS - 1) / MDL_DKS_THREADS;
    if (n == 0)
        return;
    if (blocks > MDL_DKS_MAX_BLOCKS)
        blocks = MDL_DKS_MAX_BLOCKS;
    mdl_dks_fill_kern<<<(unsigned)blocks, MDL_DKS_THREADS, 0, cudaStreamPerThread>>>(w, rows, cols, ld, key,
                                                                                      scale);
}

extern "C" ri_status_t mdl_dk_d2d(void *dst, const void *src, size_t bytes)
{
    if (bytes == 0)
        return RI_OK;
    cudaError_t e = cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, cudaStreamPerThread);
    if (e == cudaSuccess)
        return RI_OK;
    cm_error("device synth: copy on the device: %s", cudaGetErrorString(e));
    return RI_ERR_DEVICE;
}
