/*
 * The device engine's kernels and device memory, as C functions (internal
 * to ri_model_dev; mdl_dev.c drives them, the .cu files implement them).
 * No CUDA types here, so that mdl_dev.c stays C11.  Every launcher queues
 * work on the calling thread's stream (cudaStreamPerThread, the stream the
 * kernels/ CUDA ops use, so their order with our kernels is the program's
 * order) and returns without waiting; mdl_dk_sync waits and reports the
 * first error.  All float and half pointers below are device memory.
 */
#ifndef MDL_DEV_KERN_H
#define MDL_DEV_KERN_H

#include <stddef.h>
#include <stdint.h>

#include "retroinfer/status.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ---- device memory (mdl_dev_ops.cu) ---- */

/* RI_ERR_NO_DEVICE when no usable device is present. */
ri_status_t mdl_dk_probe(void);
/* bytes of device memory; *p = NULL when bytes == 0.  Free with mdl_dk_free. */
ri_status_t mdl_dk_malloc(void **p, size_t bytes);
void mdl_dk_free(void *p);
/* host -> device and device -> host; both wait (host buffers may be reused
 * at once). */
ri_status_t mdl_dk_h2d(void *dst, const void *src, size_t bytes);
ri_status_t mdl_dk_d2h(void *dst, const void *src, size_t bytes);
/* Wait for the stream; the first error of the queued work, else RI_OK. */
ri_status_t mdl_dk_sync(const char *what);

/* ---- GEMV (mdl_dev_gemv.cu) ---- */

/* y[b * ys + j] = sum_{i < k} x[b * xs + i] * w[j * ld + i] for b < n
 * (1..8), j < rows.  w fp16, ld a multiple of 8, w 16-byte aligned. */
void mdl_dk_gemv(const uint16_t *w, size_t ld, size_t rows, size_t k, const float *x, size_t xs, size_t n,
                 float *y, size_t ys);

/* ---- element-wise and per-row kernels (mdl_dev_ops.cu) ---- */

/* out[r] = x[r] / rms(x[r]) * w over n elements, rows r < rows (eps inside
 * the root, as mdl_vec_rmsnorm); out may be x. */
void mdl_dk_rmsnorm(float *out, const float *x, const float *w, size_t n, size_t rows, float eps);

/* x[r] += post_norm ? rmsnorm(xb[r]) * post_norm : xb[r]  (xb rewritten
 * when normed), rows of n. */
void mdl_dk_residual(float *x, float *xb, const float *post_norm, size_t n, size_t rows, float eps);

/* g[i] = silu(g[i]) * u[i] (geglu 0) or tanh-GELU(g[i]) * u[i] (geglu 1). */
void mdl_dk_glu(float *g, const float *u, size_t n, int geglu);

/* logits[i] = cap * tanh(logits[i] / cap). */
void mdl_dk_softcap(float *logits, size_t n, float cap);

/* Where each batch row's K/V goes this step. */
typedef struct mdl_dk_row {
    uint64_t k;     /* device address of this layer's K, KV head 0, token 0 (cm_fp16_t) */
    uint64_t v;     /* the same for V */
    uint64_t cap;   /* tokens per head in that cache */
    uint64_t pos;   /* position of the new token */
} mdl_dk_row_t;

/* Geometry of the Q/K step. */
typedef struct mdl_dk_qk {
    uint32_t n_heads, n_kv_heads, head_dim, n_rot;
    int neox;        /* rotate (i, i + n_rot/2) instead of (2i, 2i+1) */
    float eps;       /* QK norm epsilon */
} mdl_dk_qk_t;

/* For every batch row b < n: RMS norm of each Q and K head (when q_norm /
 * k_norm are not NULL), RoPE of Q and K by cs[b * cs_stride ..] ([n_rot/2]
 * (cos, sin) pairs), then the row's K and V (fp32 -> fp16) stored at
 * rows[b].pos of its cache.  q [n][n_heads][d], k and v [n][n_kv_heads][d]
 * (q and k rewritten).  rows is device memory. */
void mdl_dk_qk_store(const mdl_dk_qk_t *g, float *q, float *k, const float *v, const float *q_norm,
                     const float *k_norm, const float *cs, size_t cs_stride, const mdl_dk_row_t *rows, size_t n);

#ifdef __cplusplus
}
#endif

#endif /* MDL_DEV_KERN_H */
