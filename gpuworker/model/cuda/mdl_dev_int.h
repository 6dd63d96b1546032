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
#include "gpuworker/model/mdl_attn.h"
#include "gpuworker/model/mdl_backend.h"
#include "gpuworker/model/mdl_dev.h"
#include "gpuworker/model/mdl_dwave.h"
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

/* Where a step's host inputs come from: the model's mapping (mdl_dev_create)
 * or the synthetic generator (mdl_dev_create_synth). */
typedef struct mdl_dev_src {
    /* token's embedding row, before embd_scale: out [n_embd] */
    void (*embed_row)(const mdl_dev_t *d, int32_t token, float *out);
    /* RoPE angles of pos (swa: the sliding-window layers'): cs [n_rot] */
    void (*rope_angles)(const mdl_dev_t *d, bool swa, size_t pos, float *cs);
} mdl_dev_src_t;

struct mdl_dev {
    const mdl_model_t *m;       /* borrowed; NULL for a synthetic engine */
    mdl_hparams_t hp;           /* copy */
    const mdl_dev_src_t *src;   /* the step's host inputs (static storage) */
    mdl_weight_t embd;          /* host: the embedding rows in the model's mapping (borrowed) */
    uint64_t synth_embd_key;    /* synthetic engine: the embedding's stream key */
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
    /* "retroinfer": per layer the wave index of a global layer, in the
     * space of d->ops (kn_mem_of), built from this cache at upload or at
     * the first decode step after a device prefill (mdl_dev_seq_index);
     * NULL for a sliding-window layer (exact over its window).  NULL for
     * "full". */
    mdl_dwave_t **wave;         /* [n_layers], owned */
    /* Another registered backend that runs on the device (device_ok, e.g.
     * "retroinfer-remote"): its state over kv, a view of this device cache
     * (k[l] / v[l] = mdl_dev_seq_kv, cap = cap, len = tokens complete in
     * every layer); its prefill_end runs for each global layer where the
     * waves are built (mdl_dev_seq_index), its decode per global layer and
     * row, with host q and out (h_q, h_out).  NULL for full / retroinfer. */
    const mdl_attn_ops_t *be;
    void *be_state;             /* owned, be->destroy */
    mdl_kv_t be_kv;             /* k, v arrays owned; the rows are the cache's */
    float *h_q, *h_out;         /* host [n_heads][head_dim] each, owned */
    bool indexed;               /* the waves (or the backend's indexes) are built */
    uint64_t full_steps;        /* global layer-steps attended exactly ("full") */
    uint64_t full_tokens;       /* tokens those read */
};

/* Build s's wave indexes over its s->len tokens once ("retroinfer"; a
 * no-op for "full" or when built).  mdl_dev_load.c. */
ri_status_t mdl_dev_seq_index(mdl_dev_t *d, mdl_dev_seq_t *s);

/* The device, its attention op and a shape that op takes (mdl_dev_load.c). */
ri_status_t mdl_dev_attach(mdl_dev_t *d, char *err, size_t errlen);
/* Device activations and host staging for MDL_DEV_MAX_BATCH rows. */
ri_status_t mdl_dev_buffers(mdl_dev_t *d);

/* K (which 0) or V (which 1) of layer l in s's cache. */
static inline uint16_t *mdl_dev_seq_kv(const mdl_dev_seq_t *s, uint32_t l, int which)
{
    const mdl_hparams_t *hp = &s->d->hp;
    size_t per = (size_t)hp->n_kv_heads * s->cap * hp->head_dim;
    return s->kv + (2 * (size_t)l + (size_t)which) * per;
}

#endif /* MDL_DEV_INT_H */
