/*
 * The CUDA backend of kernels/ (library ri_kernels_cuda, built when nvcc is
 * found).  Call kn_cuda_init() once: with a device present it registers the
 * backend, so that kn_ops_cuda() and kn_ops_default() return it.
 */
#ifndef KN_CUDA_H
#define KN_CUDA_H

#include "retroinfer/status.h"

/* RI_OK when a device is present and the backend is registered;
 * RI_ERR_NO_DEVICE otherwise (the CPU backend stays the default). */
ri_status_t kn_cuda_init(void);

#endif /* KN_CUDA_H */
