/*
 * A host stand-in for the device engine's kernels (mdl_dev_kern.h) and for
 * kn_cuda_init, so that the engine's host side (gpuworker/model/cuda/
 * mdl_dev_load.c, mdl_dev_decode.c: weight layout and padding, RoPE tables,
 * cache addressing, sliding-window views, batching) runs and is checked
 * against the CPU runtime on machines without a GPU (test_model_dev_host).
 * "Device memory" is host memory here; each function does what its CUDA
 * twin in the .cu files of gpuworker/model/cuda does, element for element, and
 * kn_cuda_init registers the cpu backend as the "cuda" table, so the
 * engine's attention runs the cpu attn_decode over the same views.  It
 * proves nothing about the CUDA kernels themselves.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "common/cm_half.h"
#include "gpuworker/model/cuda/mdl_dev_kern.h"
#include "gpuworker/model/cuda/mdl_dev_synth_kern.h"
#include "gpuworker/model/mdl_synth.h"
#include "kernels/cuda/kn_cuda.h"
#include "mdl_dev_ref.h"

ri_status_t kn_cuda_init(void)
{
    kn_ops_register_cuda(kn_ops_cpu());
    return RI_OK;
}

ri_status_t mdl_dk_probe(void)
{
    return RI_OK;
}

ri_status_t mdl_dk_malloc(void **p, size_t bytes)
{
    *p = NULL;
    if (bytes == 0)
        return RI_OK;
    *p = aligned_alloc(256, (bytes + 255) / 256 * 256);   /* cudaMalloc's alignment */
    return *p != NULL ? RI_OK : RI_ERR_NOMEM;
}

void mdl_dk_free(void *p)
{
    free(p);
}

ri_status_t mdl_dk_h2d(void *dst, const void *src, size_t bytes)
{
    memcpy(dst, src, bytes);
    return RI_OK;
}

ri_status_t mdl_dk_d2h(void *dst, const void *src, size_t bytes)
{
    memcpy(dst, src, bytes);
    return RI_OK;
}

ri_status_t mdl_dk_sync(const char *what)
{
    (void)what;
    return RI_OK;
}

/* Each weight row converted once for the n inputs, and summed in eight
 * lanes the compiler vectorizes: the plain double loop converted Gemma 3's
 * 168M-entry output matrix once per prompt token and summed serially,
 * which made this test's Gemma case take 5 minutes. */
void mdl_dk_gemv(const uint16_t *w, size_t ld, size_t rows, size_t k, const float *x, size_t xs, size_t n,
                 float *y, size_t ys)
{
    float *wf = malloc((k ? k : 1) * sizeof(float));
    if (wf == NULL)
        abort(); /* a test's stand-in: nothing to report the failure to */
    for (size_t j = 0; j < rows; j++) {
        cm_fp16_to_f32_n(wf, (const cm_fp16_t *)(w + j * ld), k);
        for (size_t b = 0; b < n; b++) {
            const float *xb = x + b * xs;
            float lane[8] = {0};
            size_t i = 0;
            for (; i + 8 <= k; i += 8)
                for (int u = 0; u < 8; u++)
                    lane[u] += wf[i + u] * xb[i + u];
            float acc = ((lane[0] + lane[1]) + (lane[2] + lane[3])) + ((lane[4] + lane[5]) + (lane[6] + lane[7]));
            for (; i < k; i++)
                acc += wf[i] * xb[i];
            y[b * ys + j] = acc;
        }
    }
    free(wf);
}

void mdl_dk_rmsnorm(float *out, const float *x, const float *w, size_t n, size_t rows, float eps)
{
    for (size_t r = 0; r < rows; r++) {
        float s = mdl_dev_ref_inv_rms(x + r * n, n, eps);
        for (size_t i = 0; i < n; i++)
            out[r * n + i] = x[r * n + i] * s * w[i];
    }
}

void mdl_dk_residual(float *x, float *xb, const float *post_norm, size_t n, size_t rows, float eps)
{
    for (size_t r = 0; r < rows; r++) {
        float s = post_norm != NULL ? mdl_dev_ref_inv_rms(xb + r * n, n, eps) : 1.0f;
        for (size_t i = 0; i < n; i++) {
            float v = post_norm != NULL ? xb[r * n + i] * s * post_norm[i] : xb[r * n + i];
            xb[r * n + i] = v;
            x[r * n + i] += v;
        }
    }
}

void mdl_dk_glu(float *g, const float *u, size_t n, int geglu)
{
    for (size_t i = 0; i < n; i++) {
        float x = g[i];
        if (geglu)
            g[i] = 0.5f * x * (1.0f + tanhf(0.7978845608028654f * (x + 0.044715f * x * x * x))) * u[i];
        else
            g[i] = x / (1.0f + expf(-x)) * u[i];
    }
}

void mdl_dk_softcap(float *logits, size_t n, float cap)
{
    for (size_t i = 0; i < n; i++)
        logits[i] = cap * tanhf(logits[i] / cap);
}

void mdl_dk_qk_store(const mdl_dk_qk_t *g, float *q, float *k, const float *v, const float *q_norm,
                     const float *k_norm, const float *cs, size_t cs_stride, const mdl_dk_row_t *rows, size_t n)
{
    size_t d = g->head_dim;
    for (size_t b = 0; b < n; b++) {
        const float *c = cs + b * cs_stride;
        for (uint32_t h = 0; h < g->n_heads; h++)
            mdl_dev_ref_head(g, q + (b * g->n_heads + h) * d, q_norm, c);
        for (uint32_t h = 0; h < g->n_kv_heads; h++) {
            float *e = k + (b * g->n_kv_heads + h) * d;
            mdl_dev_ref_head(g, e, k_norm, c);
            size_t at = ((size_t)h * rows[b].cap + rows[b].pos) * d;
            cm_f32_to_fp16_n((cm_fp16_t *)(uintptr_t)rows[b].k + at, e, d);
            cm_f32_to_fp16_n((cm_fp16_t *)(uintptr_t)rows[b].v + at, v + (b * g->n_kv_heads + h) * d, d);
        }
    }
}

/* ---- the synthetic model's kernels (mdl_dev_synth_kern.h) ---- */

void mdl_dk_synth_fill(uint16_t *w, size_t rows, size_t cols, size_t ld, uint64_t key, float scale)
{
    mdl_synth_fill_ref(w, rows, cols, ld, key, scale);
}

ri_status_t mdl_dk_d2d(void *dst, const void *src, size_t bytes)
{
    memcpy(dst, src, bytes);
    return RI_OK;
}
