/*
 * The device engine's decode step (mdl_dev.h): mdl_model.c's mdl_forward
 * for decode rows, one kernel per loop of it, in the same order.  The host
 * computes what is cheap and must match the CPU to the bit (the embedding
 * row, the RoPE angles) and uploads it with the step; everything per layer
 * runs on the device.  The attention is the CUDA backend's attn_decode over
 * the device cache (read in place: the pointer rule of docs/cuda.md), on
 * the same per-thread stream as our kernels.  Checked on an H200 with synthetic models (test_model_dev).
 */
#include <math.h>
#include <string.h>

#include "common/cm_alloc.h"
#include "common/cm_status.h"
#include "gpuworker/model/cuda/mdl_dev_int.h"
#include "gpuworker/model/mdl_vec.h"

static CM_ALLOC_TAG(mdl_dev_step_tag, "model.dev.step");

/* The step's host inputs: embedding rows (scaled), RoPE tables, and where
 * each row's K/V goes in every layer; then one upload of each. */
static ri_status_t mdl_dev_inputs(mdl_dev_t *d, mdl_dev_seq_t *const *seqs, const int32_t *tokens, size_t n)
{
    const mdl_hparams_t *hp = &d->hp;
    size_t E = hp->n_embd, B = MDL_DEV_MAX_BATCH, cs_row = 2 * (size_t)hp->n_rot;
    for (size_t b = 0; b < n; b++) {
        size_t pos = seqs[b]->len;
        mdl_dequant_row(&d->embd, (size_t)tokens[b], d->h_x + b * E);
        if (hp->embd_scale != 1.0f)
            mdl_vec_scale(d->h_x + b * E, hp->embd_scale, E);
        mdl_model_rope_angles(d->m, false, pos, d->h_cs + b * cs_row);
        if (hp->n_swa > 0)
            mdl_model_rope_angles(d->m, true, pos, d->h_cs + b * cs_row + hp->n_rot);
        for (uint32_t l = 0; l < hp->n_layers; l++)
            d->h_rows[l * B + b] = (mdl_dk_row_t){.k = (uint64_t)(uintptr_t)mdl_dev_seq_kv(seqs[b], l, 0),
                                                  .v = (uint64_t)(uintptr_t)mdl_dev_seq_kv(seqs[b], l, 1),
                                                  .cap = seqs[b]->cap, .pos = pos};
    }
    ri_status_t st = mdl_dk_h2d(d->x, d->h_x, n * E * sizeof(float));
    if (st == RI_OK)
        st = mdl_dk_h2d(d->cs, d->h_cs, n * cs_row * sizeof(float));
    if (st == RI_OK)
        st = mdl_dk_h2d(d->rows, d->h_rows, (size_t)hp->n_layers * B * sizeof(mdl_dk_row_t));
    return st;
}

/* y = x W^T for the step's n rows (x row stride = W's cols, y's = its rows). */
static void mdl_dev_gemv(const mdl_dev_mat_t *w, const float *x, size_t n, float *y)
{
    mdl_dk_gemv(w->w, w->ld, w->rows, w->cols, x, w->cols, n, y, w->rows);
}

/* Attention of layer l for every row into d->att: over the whole cache for
 * a global layer, over (pos - window, pos] for a sliding-window one (as
 * mdl_attn_exact_win), each row's new K/V already stored. */
static ri_status_t mdl_dev_attention(mdl_dev_t *d, mdl_dev_seq_t *const *seqs, size_t n, uint32_t l)
{
    const mdl_hparams_t *hp = &d->hp;
    uint32_t win = d->layers[l].window, dim = hp->head_dim;
    kn_kv_view_t views[MDL_DEV_MAX_BATCH];
    for (size_t b = 0; b < n; b++) {
        size_t pos = seqs[b]->len, first = win > 0 && pos >= win ? pos + 1 - win : 0;
        views[b] = (kn_kv_view_t){.k = (const cm_fp16_t *)mdl_dev_seq_kv(seqs[b], l, 0) + first * dim,
                                  .v = (const cm_fp16_t *)mdl_dev_seq_kv(seqs[b], l, 1) + first * dim,
                                  .n_tokens = pos + 1 - first, .token_stride = dim,
                                  .head_stride = seqs[b]->cap * dim};
    }
    return d->ops->attn_decode(&d->shape, n, d->q, views, d->att, NULL);
}

/* One layer for the step's n rows (mdl_forward's loop body). */
static ri_status_t mdl_dev_layer_step(mdl_dev_t *d, mdl_dev_seq_t *const *seqs, size_t n, uint32_t l)
{
    const mdl_hparams_t *hp = &d->hp;
    const mdl_dev_layer_t *L = &d->layers[l];
    size_t E = hp->n_embd, cs_row = 2 * (size_t)hp->n_rot;
    mdl_dk_qk_t qk = {.n_heads = hp->n_heads, .n_kv_heads = hp->n_kv_heads, .head_dim = hp->head_dim,
                      .n_rot = hp->n_rot, .neox = hp->rope_neox, .eps = hp->eps};
    mdl_dk_rmsnorm(d->xb, d->x, L->attn_norm, E, n, hp->eps);
    mdl_dev_gemv(&L->wq, d->xb, n, d->q);
    mdl_dev_gemv(&L->wk, d->xb, n, d->k);
    mdl_dev_gemv(&L->wv, d->xb, n, d->v);
    /* the table of the layer's RoPE base: sliding-window layers have their own */
    const float *cs = d->cs + (L->window > 0 ? hp->n_rot : 0);
    mdl_dk_qk_store(&qk, d->q, d->k, d->v, L->q_norm, L->k_norm, cs, cs_row, d->rows + (size_t)l * MDL_DEV_MAX_BATCH,
                    n);
    ri_status_t st = mdl_dev_attention(d, seqs, n, l);
    if (st != RI_OK)
        return st;
    mdl_dev_gemv(&L->wo, d->att, n, d->xb);
    mdl_dk_residual(d->x, d->xb, L->post_attn_norm, E, n, hp->eps);
    mdl_dk_rmsnorm(d->xb, d->x, L->ffn_norm, E, n, hp->eps);
    mdl_dev_gemv(&L->gate, d->xb, n, d->g);
    mdl_dev_gemv(&L->up, d->xb, n, d->u);
    mdl_dk_glu(d->g, d->u, n * hp->n_ff, hp->geglu);
    mdl_dev_gemv(&L->down, d->g, n, d->xb);
    mdl_dk_residual(d->x, d->xb, L->post_ffn_norm, E, n, hp->eps);
    return RI_OK;
}

/* A step of at most MDL_DEV_MAX_BATCH rows, checked by the caller. */
static ri_status_t mdl_dev_step(mdl_dev_t *d, mdl_dev_seq_t *const *seqs, const int32_t *tokens, size_t n,
                                float *logits)
{
    const mdl_hparams_t *hp = &d->hp;
    ri_status_t st = mdl_dev_inputs(d, seqs, tokens, n);
    for (uint32_t l = 0; l < hp->n_layers && st == RI_OK; l++)
        st = mdl_dev_layer_step(d, seqs, n, l);
    if (st != RI_OK)
        return st;
    mdl_dk_rmsnorm(d->xb, d->x, d->output_norm, hp->n_embd, n, hp->eps);
    mdl_dev_gemv(&d->output, d->xb, n, d->logits);
    if (hp->logit_softcap > 0)
        mdl_dk_softcap(d->logits, n * hp->n_vocab, hp->logit_softcap);
    if ((st = mdl_dk_sync("decode step")) != RI_OK ||
        (st = mdl_dk_d2h(logits, d->logits, n * hp->n_vocab * sizeof(float))) != RI_OK)
        return st;
    for (size_t b = 0; b < n; b++)
        seqs[b]->len++;
    return RI_OK;
}

/* mdl_decode's checks: tokens in the vocabulary, room, no sequence twice. */
static ri_status_t mdl_dev_check(const mdl_dev_t *d, mdl_dev_seq_t *const *seqs, const int32_t *tokens, size_t n)
{
    if (n == 0 || seqs == NULL || tokens == NULL)
        return RI_ERR_INVALID;
    for (size_t b = 0; b < n; b++) {
        if (seqs[b] == NULL || seqs[b]->d != d || tokens[b] < 0 || (uint32_t)tokens[b] >= d->hp.n_vocab)
            return RI_ERR_INVALID;
        if (seqs[b]->len >= seqs[b]->cap)
            return RI_ERR_RANGE;
        for (size_t c = 0; c < b; c++)
            if (seqs[c] == seqs[b])
                return RI_ERR_INVALID;
    }
    return RI_OK;
}

ri_status_t mdl_dev_decode(mdl_dev_t *d, mdl_dev_seq_t *const *seqs, const int32_t *tokens, size_t n,
                           float *logits)
{
    ri_status_t st = mdl_dev_check(d, seqs, tokens, n);
    for (size_t b0 = 0; b0 < n && st == RI_OK; b0 += MDL_DEV_MAX_BATCH) {
        size_t c = CM_MIN((size_t)MDL_DEV_MAX_BATCH, n - b0);
        st = mdl_dev_step(d, seqs + b0, tokens + b0, c, logits + b0 * d->hp.n_vocab);
    }
    return st;
}

ri_status_t mdl_dev_gemv_host(const cm_fp16_t *w, size_t rows, size_t k, const float *x, size_t n, float *y)
{
    size_t ld = (k + 7) / 8 * 8;
    uint16_t *hw = NULL, *dw = NULL;
    float *dx = NULL, *dy = NULL;
    ri_status_t st = mdl_dk_probe();
    if (st != RI_OK)
        return st;
    if (n == 0 || n > MDL_DEV_MAX_BATCH || rows == 0 || k == 0)
        return RI_ERR_INVALID;
    hw = cm_calloc(&mdl_dev_step_tag, rows * ld, sizeof(uint16_t));   /* padded as the engine pads */
    if (hw == NULL)
        return RI_ERR_NOMEM;
    for (size_t r = 0; r < rows; r++)
        memcpy(hw + r * ld, w + r * k, k * sizeof(uint16_t));
    if ((st = mdl_dk_malloc((void **)&dw, rows * ld * sizeof(uint16_t))) != RI_OK ||
        (st = mdl_dk_malloc((void **)&dx, n * k * sizeof(float))) != RI_OK ||
        (st = mdl_dk_malloc((void **)&dy, n * rows * sizeof(float))) != RI_OK ||
        (st = mdl_dk_h2d(dw, hw, rows * ld * sizeof(uint16_t))) != RI_OK ||
        (st = mdl_dk_h2d(dx, x, n * k * sizeof(float))) != RI_OK)
        goto cleanup;
    mdl_dk_gemv(dw, ld, rows, k, dx, k, n, dy, rows);
    if ((st = mdl_dk_sync("gemv")) == RI_OK)
        st = mdl_dk_d2h(y, dy, n * rows * sizeof(float));
cleanup:
    mdl_dk_free(dw);
    mdl_dk_free(dx);
    mdl_dk_free(dy);
    cm_free(hw);
    return st;
}
