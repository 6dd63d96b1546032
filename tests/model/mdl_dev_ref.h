/*
 * Plain-loop references of the device engine's per-row steps, shared by the
 * test that checks the CUDA kernels against them (test_model_dev.c) and the
 * host stand-ins of those kernels (mdl_dev_host_kern.c), so the two cannot
 * drift apart.  They follow the CPU runtime (mdl_qk_prepare, mdl_rmsnorm).
 */
#ifndef MDL_DEV_REF_H
#define MDL_DEV_REF_H

#include <math.h>
#include <stddef.h>
#include <stdint.h>

#include "gpuworker/model/cuda/mdl_dev_kern.h"

/* 1 / RMS of x[0..n) with eps, summed in double. */
static inline float mdl_dev_ref_inv_rms(const float *x, size_t n, float eps)
{
    double ss = 0.0;
    for (size_t i = 0; i < n; i++)
        ss += (double)x[i] * x[i];
    return (float)(1.0 / sqrt(ss / (double)n + eps));
}

/* One head in place: RMS norm by w (when given), then RoPE by the angle
 * table c (cos, sin pairs) in g's pair layout. */
static inline void mdl_dev_ref_head(const mdl_dk_qk_t *g, float *e, const float *w, const float *c)
{
    uint32_t d = g->head_dim, half = g->n_rot / 2;
    if (w != NULL) {
        float r = mdl_dev_ref_inv_rms(e, d, g->eps);
        for (uint32_t i = 0; i < d; i++)
            e[i] = e[i] * r * w[i];
    }
    for (uint32_t i = 0; i < half; i++) {
        uint32_t i0 = g->neox ? i : 2 * i, i1 = g->neox ? i + half : 2 * i + 1;
        float x0 = e[i0], x1 = e[i1];
        e[i0] = x0 * c[2 * i] - x1 * c[2 * i + 1];
        e[i1] = x0 * c[2 * i + 1] + x1 * c[2 * i];
    }
}

#endif
