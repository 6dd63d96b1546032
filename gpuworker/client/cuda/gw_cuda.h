/*
 * The CUDA pieces of the block cache in device memory (library ri_gw_cuda,
 * built when nvcc is found; docs/worker.md, "Block cache in device
 * memory"): the CUDA copy engine (cudaMemcpyAsync on a stream of its own,
 * an event per ticket) and page-locked staging memory (cudaHostAlloc).
 */
#ifndef GW_CUDA_H
#define GW_CUDA_H

#ifdef __cplusplus
extern "C" {
#endif

#include "gpuworker/client/gw_copier.h"
#include "retroinfer/status.h"

/* After kn_cuda_init succeeded: register the CUDA copier
 * (gw_copier_register_device) and the pinned allocator
 * (gw_stage_register_pinned).  RI_ERR_NO_DEVICE without a device
 * (nothing registered). */
ri_status_t gw_cuda_init(void);

/* A CUDA copier on a new non-blocking stream of the current device.
 * Caller frees with gw_copier_destroy.  RI_ERR_NOMEM, RI_ERR_DEVICE. */
ri_status_t gw_copier_cuda_create(gw_copier_t **c_p);

#ifdef __cplusplus
}
#endif

#endif /* GW_CUDA_H */
