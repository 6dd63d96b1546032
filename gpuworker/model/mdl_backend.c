/*
 * The forward pass over a backend (mdl_backend.h) and the block tensors'
 * table that every loader reads.
 */
#include "gpuworker/model/mdl_backend.h"

#include <stdio.h>

#include "common/cm_time.h"

/* clang-format off: one tensor a line */
const mdl_tensor_desc_t mdl_block_weights[MDL_W_N] = {
    [MDL_W_Q] = { "attn_q", MDL_DIM_QW, MDL_DIM_EMBD },      [MDL_W_K] = { "attn_k", MDL_DIM_KVW, MDL_DIM_EMBD },
    [MDL_W_V] = { "attn_v", MDL_DIM_KVW, MDL_DIM_EMBD },     [MDL_W_O] = { "attn_output", MDL_DIM_EMBD, MDL_DIM_QW },
    [MDL_W_GATE] = { "ffn_gate", MDL_DIM_FF, MDL_DIM_EMBD }, [MDL_W_UP] = { "ffn_up", MDL_DIM_FF, MDL_DIM_EMBD },
    [MDL_W_DOWN] = { "ffn_down", MDL_DIM_EMBD, MDL_DIM_FF },
};

/* rows is unused for the norms (1 x cols) */
const mdl_tensor_desc_t mdl_block_norms[MDL_N_N] = {
    [MDL_N_ATTN] = { "attn_norm", MDL_DIM_EMBD, MDL_DIM_EMBD },
    [MDL_N_FFN] = { "ffn_norm", MDL_DIM_EMBD, MDL_DIM_EMBD },
    [MDL_N_Q] = { "attn_q_norm", MDL_DIM_HEAD, MDL_DIM_HEAD },
    [MDL_N_K] = { "attn_k_norm", MDL_DIM_HEAD, MDL_DIM_HEAD },
    [MDL_N_POST_ATTN] = { "post_attention_norm", MDL_DIM_EMBD, MDL_DIM_EMBD },
    [MDL_N_POST_FFN] = { "post_ffw_norm", MDL_DIM_EMBD, MDL_DIM_EMBD },
};
/* clang-format on */

size_t mdl_dim_size(const mdl_hparams_t *hp, mdl_dim_t dim)
{
    switch (dim) {
    case MDL_DIM_EMBD:
        return hp->n_embd;
    case MDL_DIM_QW:
        return (size_t)hp->n_heads * hp->head_dim;
    case MDL_DIM_KVW:
        return (size_t)hp->n_kv_heads * hp->head_dim;
    case MDL_DIM_FF:
        return hp->n_ff;
    case MDL_DIM_HEAD:
        return hp->head_dim;
    }
    return 0;
}

bool mdl_block_norm_used(const mdl_hparams_t *hp, mdl_nid_t n)
{
    switch (n) {
    case MDL_N_ATTN:
    case MDL_N_FFN:
        return true;
    case MDL_N_Q:
    case MDL_N_K:
        return hp->qk_norm;
    case MDL_N_POST_ATTN:
    case MDL_N_POST_FFN:
        return hp->post_norms;
    case MDL_N_N:
        break;
    }
    return false;
}

void mdl_block_tensor_name(uint32_t l, const mdl_tensor_desc_t *d, char *buf, size_t len)
{
    snprintf(buf, len, "blk.%u.%s.weight", l, d->name);
}

/* Add the time since *t to op (when profiling) and restart *t. */
static void mdl_prof_lap(mdl_profile_t *prof, mdl_op_t op, double *t)
{
    if (prof == NULL)
        return;
    double now = cm_time_s();
    prof->s[op] += now - *t;
    *t = now;
}

/* One block: attention half, then FFN half. */
static ri_status_t mdl_forward_block(const mdl_backend_ops_t *be, void *ctx, uint32_t l, mdl_profile_t *prof, double *t)
{
    static const mdl_wid_t qkv[3] = { MDL_W_Q, MDL_W_K, MDL_W_V }, gu[2] = { MDL_W_GATE, MDL_W_UP };
    static const mdl_buf_t qkv_out[3] = { MDL_BUF_Q, MDL_BUF_K, MDL_BUF_V }, gu_out[2] = { MDL_BUF_G, MDL_BUF_U };
    static const mdl_wid_t wo = MDL_W_O, down = MDL_W_DOWN;
    static const mdl_buf_t xb = MDL_BUF_XB;
    ri_status_t st;
    be->rmsnorm(ctx, l, MDL_N_ATTN, MDL_BUF_XB, MDL_BUF_X);
    mdl_prof_lap(prof, MDL_OP_NORM, t);
    if ((st = be->matmul(ctx, l, qkv, 3, MDL_BUF_XB, qkv_out)) != RI_OK)
        return st;
    mdl_prof_lap(prof, MDL_OP_QKV, t);
    if ((st = be->attention(ctx, l)) != RI_OK)
        return st;
    mdl_prof_lap(prof, MDL_OP_ATTN, t);
    if ((st = be->matmul(ctx, l, &wo, 1, MDL_BUF_ATT, &xb)) != RI_OK)
        return st;
    mdl_prof_lap(prof, MDL_OP_WO, t);
    be->residual(ctx, l, MDL_N_POST_ATTN);
    be->rmsnorm(ctx, l, MDL_N_FFN, MDL_BUF_XB, MDL_BUF_X);
    mdl_prof_lap(prof, MDL_OP_NORM, t);
    if ((st = be->matmul(ctx, l, gu, 2, MDL_BUF_XB, gu_out)) != RI_OK)
        return st;
    mdl_prof_lap(prof, MDL_OP_GATE_UP, t);
    be->glu(ctx);
    mdl_prof_lap(prof, MDL_OP_GLU, t);
    if ((st = be->matmul(ctx, l, &down, 1, MDL_BUF_G, &xb)) != RI_OK)
        return st;
    mdl_prof_lap(prof, MDL_OP_DOWN, t);
    be->residual(ctx, l, MDL_N_POST_FFN);
    mdl_prof_lap(prof, MDL_OP_NORM, t);
    return RI_OK;
}

ri_status_t mdl_forward_run(const mdl_backend_ops_t *be, void *ctx, uint32_t n_layers, mdl_profile_t *prof,
                            const bool *want, float *logits)
{
    double t = prof != NULL ? cm_time_s() : 0;
    ri_status_t st = be->embed(ctx);
    mdl_prof_lap(prof, MDL_OP_EMBD, &t);
    for (uint32_t l = 0; l < n_layers && st == RI_OK; l++)
        st = mdl_forward_block(be, ctx, l, prof, &t);
    if (st != RI_OK)
        return st;
    st = be->logits(ctx, want, logits);
    mdl_prof_lap(prof, MDL_OP_HEAD, &t);
    return st;
}
