/*
 * The CUDA backend of kernels/ (library ri_kernels_cuda, built when nvcc is
 * found; docs/cuda.md).  Call kn_cuda_init() once: with a device present it
 * registers the backend, so that kn_ops_cuda() and kn_ops_default() return
 * it.  Every op of the table runs on the device; inputs may be host or
 * device memory (host spans are staged), outputs host or device memory.
 */
#ifndef KN_CUDA_H
#define KN_CUDA_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {  /* kn_ops.h has no guard of its own */
#endif

#include "kernels/kn_ops.h"
#include "retroinfer/status.h"

/* RI_OK when a device is present and the backend is registered;
 * RI_ERR_NO_DEVICE otherwise (the CPU backend stays the default). */
ri_status_t kn_cuda_init(void);

/* Rank and the estimation zone of one group in one pass over the centroids
 * (the device twin of the cpu backend's kn_cpu_rank_estimate): same
 * contracts as rank + estimate over ids[n_r .. n_r+n_e); ids come back in
 * score order.  o_e [g][d], lse_e [g].  RI_ERR_INVALID for a shape the
 * device does not take (g > 8, d > 256) or NULL pointers; RI_ERR_DEVICE on
 * a CUDA error. */
ri_status_t kn_cuda_rank_estimate(const kn_shape_t *grp, const float *q, const kn_index_t *idx,
                                  uint32_t n_r, uint32_t n_e, uint32_t *ids, uint32_t *n_r_p,
                                  uint32_t *n_e_p, float *o_e, float *lse_e);

/* Device memory for callers built without the CUDA headers (the harness,
 * benches): kn_cuda_malloc gives bytes of device memory (caller frees with
 * kn_cuda_free; NULL is a no-op), kn_cuda_copy copies bytes between any two
 * of host and device memory and waits.  RI_ERR_NOMEM / RI_ERR_DEVICE. */
ri_status_t kn_cuda_malloc(void **p, size_t bytes);
void kn_cuda_free(void *p);
ri_status_t kn_cuda_copy(void *dst, const void *src, size_t bytes);
/* bytes of device memory at p set to 0.  RI_ERR_DEVICE. */
ri_status_t kn_cuda_zero(void *p, size_t bytes);

/* attn_pages for pages that are all in device memory (not checked: a host
 * page here is an illegal address on the device).  The table's attn_pages
 * asks the driver where each page lives, a lookup per page that a step
 * retrieving ~1000 clusters per head feels.  Same contract otherwise;
 * RI_ERR_INVALID for a shape the device does not take. */
ri_status_t kn_cuda_attn_pages_device(const kn_shape_t *grp, const float *q, const kn_page_t *pages,
                                      size_t n_pages, float *o, float *lse);

/* One KV head of a device tripartite step: kn_ops.h's kn_wave_head_t, all
 * its pointers device memory. */
typedef kn_wave_head_t kn_cuda_wave_head_t;

/* One decode step of tripartite attention for every KV head of a layer,
 * on the device from end to end (the cuda table's wave_step op): per head, rank the clusters (n_r to
 * retrieve, the next n_e to estimate: the rank's contract), estimate the
 * n_e from the centroids and value means, attend exactly over the steady
 * zone and the n_r retrieved clusters, and merge the two parts.  The same
 * result as, per head, kn_cuda_rank_estimate + attn_pages(steady + retrieved
 * clusters) + merge, in eight kernel launches, one copy in and one wait for
 * all heads together, where those calls take some 40 runtime calls and two
 * waits per head.
 * shape: n_q_heads, n_kv_heads (= heads), head_dim d in {64, 128, 256}, at
 * most 8 query heads per KV head.  q [n_q][d] and out [n_q][d], lse [n_q]
 * may be host or device memory.  ids (NULL: not wanted) gets per head
 * n_r + n_e slots: the retrieved ids, then the estimated ones, each set in
 * ascending id order (the sets are the rank's; the order within a set does
 * not change the result); counts (NULL: not wanted) per head {retrieved,
 * estimated}; both host or device memory.
 * Every pointer of heads must be device memory with 16-byte aligned rows
 * (strides of the steady pages a multiple of 8).  RI_ERR_INVALID for a
 * shape or layout it does not take, RI_ERR_DEVICE on a CUDA error. */
ri_status_t kn_cuda_wave_step(const kn_shape_t *shape, const float *q, const kn_cuda_wave_head_t *heads,
                              uint32_t n_r, uint32_t n_e, float *out, float *lse, uint32_t *ids,
                              uint32_t *counts);

#ifdef __cplusplus
}
#endif

#endif /* KN_CUDA_H */
