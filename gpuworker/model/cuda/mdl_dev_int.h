/*
 * The device engine's state, shared by mdl_dev_load.c (weights, sequences)
 * and mdl_dev_decode.c (the CUDA backend's ops).  Internal to ri_model_dev.
 */
#ifndef MDL_DEV_INT_H
#define MDL_DEV_INT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "gpuworker/model/cuda/mdl_dev_kern.h"
#include "gpuworker/model/mdl_backend.h"
#include "gpuworker/model/mdl_dev.h"
#include "gpuworker/model/mdl_quant.h"
#include "kernels/kn_ops.h"

/* A weight matrix in device memory: rows of ld fp16 (ld = cols rounded up
 * to 8, the tail zero) so that every row starts 16-byte aligned. */
typedef struct mdl_dev_mat {
    uint16_t *w;     /* device, owned (unless a tied head points at another matrix) */
    size_t rows;     /* output features */
    size_t cols;     /* input features */
    size_t ld;       /* elements between rows */
} mdl_dev_mat_t;

/* One block's weights, as mdl_model.c holds them on the host. */
typedef struct mdl_dev_layer {
    mdl_dev_mat_t w[MDL_W_N];                 /* by the block tensor table (mdl_backend.h) */
    float *norm[MDL_N_N];                     /* fp32, NULL where the architecture has none */
    uint32_t window;                          /* sliding window; 0 = global */
} mdl_dev_layer_t;

struct mdl_dev {
    const mdl_model_t *m;       /* borrowed */
    mdl_hparams_t hp;           /* copy */
    mdl_weight_t embd;          /* host: the embedding rows in the model's mapping (borrowed) */
    mdl_dev_layer_t *layers;    /* [n_layers], owned */
    mdl_dev_mat_t output;       /* output head (its own upload, also when tied) */
    float *output_norm;         /* device [n_embd] */
    const kn_ops_t *ops;        /* the CUDA backend's table (attn_decode) */
    kn_shape_t shape;           /* attention geometry */
    uint64_t weight_bytes;      /* device bytes of the weights */
    /* device activations of up to MDL_DEV_MAX_BATCH rows, owned */
    float *x, *xb, *q, *k, *v, *att, *g, *u, *logits, *cs;
    mdl_dk_row_t *rows;         /* [n_layers][MDL_DEV_MAX_BATCH] */
    /* host staging of one step, owned */
    float *h_x;                 /* [MDL_DEV_MAX_BATCH][n_embd] */
    float *h_cs;                /* [MDL_DEV_MAX_BATCH][2][n_rot]: global, sliding-window */
    mdl_dk_row_t *h_rows;       /* [n_layers][MDL_DEV_MAX_BATCH] */
};

struct mdl_dev_seq {
    mdl_dev_t *d;      /* borrowed */
    uint16_t *kv;      /* device, owned: per layer K [n_kv_heads][cap][d] then V, fp16 */
    size_t cap;        /* tokens per head */
    size_t len;        /* tokens whose K/V are stored */
};

/* K (which 0) or V (which 1) of layer l in s's cache. */
static inline uint16_t *mdl_dev_seq_kv(const mdl_dev_seq_t *s, uint32_t l, int which)
{
    const mdl_hparams_t *hp = &s->d->hp;
    size_t per = (size_t)hp->n_kv_heads * s->cap * hp->head_dim;
    return s->kv + (2 * (size_t)l + (size_t)which) * per;
}

#endif /* MDL_DEV_INT_H */
