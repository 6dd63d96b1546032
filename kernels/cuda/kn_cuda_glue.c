/*
 * kn_cuda_glue.h: kernels/' private plumbing for the CUDA files, compiled as
 * C so that kn_internal.h's prototypes check these calls.
 */
#include "kernels/cuda/kn_cuda_glue.h"
#include "kernels/kn_internal.h"

ri_status_t kn_cuda_glue_index_reserve(kn_index_t *idx, uint32_t add_clusters, uint32_t add_tokens)
{
    return kn_index_reserve(idx, add_clusters, add_tokens);
}

ri_status_t kn_cuda_glue_ref_index_build(const kn_build_params_t *p, const cm_fp16_t *k,
                                         const cm_fp16_t *v, size_t stride, uint32_t n,
                                         uint32_t token_base, uint32_t n_clusters,
                                         uint32_t n_segments, kn_index_t *idx)
{
    return kn_ref_index_build(p, k, v, stride, n, token_base, n_clusters, n_segments, idx);
}
