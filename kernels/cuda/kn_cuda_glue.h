/*
 * What the CUDA files need from kernels/' private plumbing (kn_internal.h),
 * through a C file: kn_internal.h pulls in C11 atomics that nvcc's C++ does
 * not take.  Private to kernels/cuda/.
 */
#ifndef KN_CUDA_GLUE_H
#define KN_CUDA_GLUE_H

#include <stdint.h>

#include "kernels/kn_ops.h"

#ifdef __cplusplus
extern "C" {
#endif

/* kn_index_reserve: room for add_clusters more clusters and add_tokens more perm entries. */
ri_status_t kn_cuda_glue_index_reserve(kn_index_t *idx, uint32_t add_clusters, uint32_t add_tokens);

/* The reference index build (the CUDA build hands it the empty case). */
ri_status_t kn_cuda_glue_ref_index_build(const kn_build_params_t *p, const cm_fp16_t *k,
                                         const cm_fp16_t *v, size_t stride, uint32_t n,
                                         uint32_t token_base, uint32_t n_clusters,
                                         uint32_t n_segments, kn_index_t *idx);

#ifdef __cplusplus
}
#endif

#endif /* KN_CUDA_GLUE_H */
