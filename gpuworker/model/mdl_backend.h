/*
 * The model runtime's backend interface (docs/model.md "Backends"): the
 * forward pass is written once, in mdl_model.c (mdl_forward_run), as a
 * sequence of ops on a backend; a backend owns the weights in its own memory
 * and the activations of one batch of rows, and implements the ops.  Two
 * backends exist: the CPU one (mdl_model.c, over mdl_quant.c, mdl_vec.c and
 * the attention backends of mdl_attn.h) and the CUDA one (library
 * ri_model_dev, gpuworker/model/cuda/, prefill and decode; mdl_dev.h).
 *
 * A backend names its tensors by the ids below, not by pointers, so that the
 * forward pass never touches backend memory: activation buffers
 * (mdl_buf_t, [rows][width] each) and, per block, weight matrices
 * (mdl_wid_t) and norm vectors (mdl_nid_t).  The GGUF names of the block
 * tensors are in one table (mdl_block_weights / mdl_block_norms) that every
 * loader reads.
 */
#ifndef MDL_BACKEND_H
#define MDL_BACKEND_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "gpuworker/model/mdl_model.h"
#include "retroinfer/status.h"

/* Activation buffers of a batch of rows. */
typedef enum mdl_buf {
    MDL_BUF_X,   /* [n_embd] the residual stream */
    MDL_BUF_XB,  /* [max(n_embd, q width)] scratch: normed input, projections' output */
    MDL_BUF_Q,   /* [n_heads * head_dim] */
    MDL_BUF_K,   /* [n_kv_heads * head_dim] */
    MDL_BUF_V,   /* [n_kv_heads * head_dim] */
    MDL_BUF_ATT, /* [n_heads * head_dim] attention output */
    MDL_BUF_G,   /* [n_ff] gate, then the activated product */
    MDL_BUF_U,   /* [n_ff] up */
    MDL_BUF_N
} mdl_buf_t;

/* A block's weight matrices. */
typedef enum mdl_wid { MDL_W_Q, MDL_W_K, MDL_W_V, MDL_W_O, MDL_W_GATE, MDL_W_UP, MDL_W_DOWN, MDL_W_N } mdl_wid_t;

/* A block's norm vectors; the last four only where the architecture has
 * them (mdl_block_norm_used), NULL elsewhere. */
typedef enum mdl_nid { MDL_N_ATTN, MDL_N_FFN, MDL_N_Q, MDL_N_K, MDL_N_POST_ATTN, MDL_N_POST_FFN, MDL_N_N } mdl_nid_t;

/* A dimension of the hyper-parameters, for the tensor table. */
typedef enum mdl_dim { MDL_DIM_EMBD, MDL_DIM_QW, MDL_DIM_KVW, MDL_DIM_FF, MDL_DIM_HEAD } mdl_dim_t;

/* A block tensor: "blk.<l>.<name>.weight", [rows][cols] (norms: 1 x cols). */
typedef struct mdl_tensor_desc {
    const char *name;
    mdl_dim_t rows, cols;
} mdl_tensor_desc_t;

extern const mdl_tensor_desc_t mdl_block_weights[MDL_W_N];
extern const mdl_tensor_desc_t mdl_block_norms[MDL_N_N];

/* The size of dim in hp. */
size_t mdl_dim_size(const mdl_hparams_t *hp, mdl_dim_t dim);
/* Whether hp's architecture has norm n (Q/K norms, post-norms: gemma3). */
bool mdl_block_norm_used(const mdl_hparams_t *hp, mdl_nid_t n);
/* "blk.<l>.<d->name>.weight" into buf. */
void mdl_block_tensor_name(uint32_t l, const mdl_tensor_desc_t *d, char *buf, size_t len);

/*
 * A backend's ops on one batch of rows (ctx: the backend's, set up by its
 * caller with the rows, their sequences and positions).  Ops that return a
 * status stop the pass on an error; the others cannot fail.
 */
typedef struct mdl_backend_ops {
    const char *name;
    /* Each row's token embedding (scaled by embd_scale) into X, and the
     * RoPE angles of each row's position for the layers' bases. */
    ri_status_t (*embed)(void *ctx);
    /* dst = rmsnorm(src) * norm `which` of block l, row by row. */
    void (*rmsnorm)(void *ctx, uint32_t l, mdl_nid_t which, mdl_buf_t dst, mdl_buf_t src);
    /* out[i] = in W_i^T for the nw weights w[i] of block l (quantised or
     * fp16 by the backend's choice; the rows of the batch at once). */
    ri_status_t (*matmul)(void *ctx, uint32_t l, const mdl_wid_t *w, size_t nw, mdl_buf_t in, const mdl_buf_t *out);
    /* Block l's attention: Q/K norm (where used), RoPE of Q and K, the new
     * K/V stored in each row's sequence, and Q's attention over its context
     * (a sliding-window layer over its window) into ATT. */
    ri_status_t (*attention)(void *ctx, uint32_t l);
    /* X += XB, after block l's post-norm `post` when the architecture has it
     * (XB then rewritten). */
    void (*residual)(void *ctx, uint32_t l, mdl_nid_t post);
    /* G = silu(G) * U, or GELU(G) * U (geglu). */
    void (*glu)(void *ctx);
    /* For the rows with want[r]: the final norm, the output head and the
     * logit soft-cap, packed into logits [n_want][n_vocab] in host memory
     * (nothing when logits is NULL); waits for the backend. */
    ri_status_t (*logits)(void *ctx, const bool *want, float *logits);
} mdl_backend_ops_t;

/* The forward pass, once for every backend: embed, then for each of the
 * n_layers blocks norm, QKV, attention, output projection, residual, norm,
 * gate/up, GLU, down, residual; then the logits of the wanted rows.  prof
 * (may be NULL) gets the wall seconds of each op added (meaningful for a
 * backend whose ops finish before they return, the CPU one). */
ri_status_t mdl_forward_run(const mdl_backend_ops_t *be, void *ctx, uint32_t n_layers, mdl_profile_t *prof,
                            const bool *want, float *logits);

#endif /* MDL_BACKEND_H */
