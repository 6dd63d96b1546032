/*
 * The CUDA backend of the forward pass (mdl_backend.h): its ops, one or a
 * few kernels each, and mdl_dev_decode, which runs mdl_model.c's
 * mdl_forward_run over them for decode rows.  The host computes what is
 * cheap and must match the CPU to the bit (the embedding row, the RoPE
 * angles) and uploads it with the step; everything per layer runs on the
 * device.  The attention is the CUDA kernels' attn_decode over the device
 * cache (read in place: the pointer rule of docs/cuda.md), on the same
 * per-thread stream as our kernels; for a "retroinfer" sequence a global
 * layer runs its wave index instead (mdl_dwave: update when due, then one
 * wave_step for the layer).  The ops queue work and return; logits
 * waits.
 */
#include <math.h>
#include <string.h>

#include "common/cm_alloc.h"
#include "common/cm_status.h"
#include "gpuworker/model/cuda/mdl_dev_int.h"
#include "gpuworker/model/mdl_vec.h"

static CM_ALLOC_TAG(mdl_dev_step_tag, "model.dev.step");

/* The rows of one step (the backend's ctx): a decode step's rows are one
 * token of n sequences, a prefill step's n consecutive tokens of one
 * sequence (seqs[b] the same, pos[b] = its length + b). */
typedef struct mdl_dev_ctx {
    mdl_dev_t *d;
    mdl_dev_seq_t *const *seqs;   /* [n] */
    const int32_t *tokens;        /* [n] */
    const size_t *pos;            /* [n] each row's position */
    size_t n;                     /* <= MDL_DEV_MAX_BATCH */
    bool prefill;                 /* exact attention for every row (a prompt is
                                     prefilled exactly whatever the method) */
} mdl_dev_ctx_t;

static float *mdl_dev_buf(mdl_dev_t *d, mdl_buf_t b)
{
    float *const bufs[MDL_BUF_N] = {[MDL_BUF_X] = d->x, [MDL_BUF_XB] = d->xb, [MDL_BUF_Q] = d->q,
                                    [MDL_BUF_K] = d->k, [MDL_BUF_V] = d->v,   [MDL_BUF_ATT] = d->att,
                                    [MDL_BUF_G] = d->g, [MDL_BUF_U] = d->u};
    return bufs[b];
}

/* The step's host inputs: embedding rows (scaled) and RoPE tables from the
 * engine's source (d->src: the model, or the synthetic generator), and where
 * each row's K/V goes in every layer; then one upload of each. */
static ri_status_t mdl_dev_embed(void *ctx)
{
    mdl_dev_ctx_t *c = ctx;
    mdl_dev_t *d = c->d;
    const mdl_hparams_t *hp = &d->hp;
    size_t E = hp->n_embd, B = MDL_DEV_MAX_BATCH, cs_row = 2 * (size_t)hp->n_rot, n = c->n;
    for (size_t b = 0; b < n; b++) {
        size_t pos = c->pos[b];
        d->src->embed_row(d, c->tokens[b], d->h_x + b * E);
        if (hp->embd_scale != 1.0f)
            mdl_vec_scale(d->h_x + b * E, hp->embd_scale, E);
        d->src->rope_angles(d, false, pos, d->h_cs + b * cs_row);
        if (hp->n_swa > 0)
            d->src->rope_angles(d, true, pos, d->h_cs + b * cs_row + hp->n_rot);
        for (uint32_t l = 0; l < hp->n_layers; l++)
            d->h_rows[l * B + b] = (mdl_dk_row_t){.k = (uint64_t)(uintptr_t)mdl_dev_seq_kv(c->seqs[b], l, 0),
                                                  .v = (uint64_t)(uintptr_t)mdl_dev_seq_kv(c->seqs[b], l, 1),
                                                  .cap = c->seqs[b]->cap, .pos = pos};
    }
    ri_status_t st = mdl_dk_h2d(d->x, d->h_x, n * E * sizeof(float));
    if (st == RI_OK)
        st = mdl_dk_h2d(d->cs, d->h_cs, n * cs_row * sizeof(float));
    if (st == RI_OK)
        st = mdl_dk_h2d(d->rows, d->h_rows, (size_t)hp->n_layers * B * sizeof(mdl_dk_row_t));
    return st;
}

static void mdl_dev_rmsnorm(void *ctx, uint32_t l, mdl_nid_t which, mdl_buf_t dst, mdl_buf_t src)
{
    mdl_dev_ctx_t *c = ctx;
    mdl_dev_t *d = c->d;
    mdl_dk_rmsnorm(mdl_dev_buf(d, dst), mdl_dev_buf(d, src), d->layers[l].norm[which], d->hp.n_embd, c->n,
                   d->hp.eps);
}

/* y = x W^T for the step's n rows (x row stride = W's cols, y's = its rows). */
static void mdl_dev_gemv(const mdl_dev_mat_t *w, const float *x, size_t n, float *y)
{
    mdl_dk_gemv(w->w, w->ld, w->rows, w->cols, x, w->cols, n, y, w->rows);
}

static ri_status_t mdl_dev_matmul(void *ctx, uint32_t l, const mdl_wid_t *w, size_t nw, mdl_buf_t in,
                                  const mdl_buf_t *out)
{
    mdl_dev_ctx_t *c = ctx;
    mdl_dev_t *d = c->d;
    for (size_t i = 0; i < nw; i++)
        mdl_dev_gemv(&d->layers[l].w[w[i]], mdl_dev_buf(d, in), c->n, mdl_dev_buf(d, out[i]));
    return RI_OK;
}

/* One row of a global layer through s's backend (device_ok): the stream
 * has stored the row's K/V, and the backend reads the cache from its own
 * threads (other streams), so wait for it first; then q down, decode with
 * kv.len = pos (the CPU runtime's count: pos's K/V is stored, not yet
 * complete in every layer), out back up on this stream. */
static ri_status_t mdl_dev_backend_step(mdl_dev_t *d, mdl_dev_seq_t *s, uint32_t l, size_t pos, const float *q,
                                        float *att)
{
    size_t bytes = (size_t)d->hp.n_heads * d->hp.head_dim * sizeof(float);
    ri_status_t st = mdl_dk_sync("attention backend");
    if (st == RI_OK)
        st = mdl_dk_d2h(s->h_q, q, bytes);
    if (st != RI_OK)
        return st;
    s->be_kv.len = pos;
    if ((st = s->be->decode(s->be_state, l, pos, s->h_q, s->h_out)) != RI_OK)
        return st;
    return mdl_dk_h2d(att, s->h_out, bytes);
}

/* Attention of layer l for every row into d->att: Q/K norm, RoPE and the
 * K/V store in one kernel, then attn_decode over the whole cache for a
 * global layer, over (pos - window, pos] for a sliding-window one (as
 * mdl_attn_exact_win). */
static ri_status_t mdl_dev_attention(void *ctx, uint32_t l)
{
    mdl_dev_ctx_t *c = ctx;
    mdl_dev_t *d = c->d;
    const mdl_hparams_t *hp = &d->hp;
    const mdl_dev_layer_t *L = &d->layers[l];
    uint32_t win = L->window, dim = hp->head_dim;
    size_t cs_row = 2 * (size_t)hp->n_rot;
    mdl_dk_qk_t qk = {.n_heads = hp->n_heads, .n_kv_heads = hp->n_kv_heads, .head_dim = hp->head_dim,
                      .n_rot = hp->n_rot, .neox = hp->rope_neox, .eps = hp->eps};
    /* the table of the layer's RoPE base: sliding-window layers have their own */
    const float *cs = d->cs + (win > 0 ? hp->n_rot : 0);
    mdl_dk_qk_store(&qk, d->q, d->k, d->v, L->norm[MDL_N_Q], L->norm[MDL_N_K], cs, cs_row,
                    d->rows + (size_t)l * MDL_DEV_MAX_BATCH, c->n);
    kn_kv_view_t views[MDL_DEV_MAX_BATCH];
    size_t n_full = 0, qd = (size_t)hp->n_heads * dim, rows[MDL_DEV_MAX_BATCH];
    ri_status_t st = RI_OK;
    for (size_t b = 0; b < c->n; b++) {
        mdl_dev_seq_t *s = c->seqs[b];
        size_t pos = c->pos[b], first = win > 0 && pos >= win ? pos + 1 - win : 0;
        kn_kv_view_t v = {.k = (const cm_fp16_t *)mdl_dev_seq_kv(s, l, 0) + first * dim,
                          .v = (const cm_fp16_t *)mdl_dev_seq_kv(s, l, 1) + first * dim,
                          .n_tokens = pos + 1 - first, .token_stride = dim, .head_stride = s->cap * dim};
        if (!c->prefill && s->be != NULL && win == 0) {
            /* another backend (retroinfer-remote): it reads the device
             * cache itself, q and out go through the host */
            if (st == RI_OK)
                st = mdl_dev_backend_step(d, s, l, pos, d->q + b * qd, d->att + b * qd);
            continue;
        }
        if (!c->prefill && s->wave != NULL && s->wave[l] != NULL) {
            /* retroinfer, a global layer: the update when due, then one
             * wave_step for every KV head, on this thread's stream after
             * the K/V store above (the steady zone holds pos) */
            if (st == RI_OK)
                st = mdl_dwave_update(s->wave[l], &v, NULL);
            if (st == RI_OK)
                st = mdl_dwave_step(s->wave[l], d->q + b * qd, &v, d->att + b * qd, NULL, NULL);
            continue;
        }
        if (win == 0 && !c->prefill) {   /* decode figures, as the CPU backends' */
            s->full_steps++;
            s->full_tokens += v.n_tokens;
        }
        rows[n_full] = b;
        views[n_full++] = v;
    }
    if (st != RI_OK || n_full == 0)
        return st;
    if (n_full == c->n) /* every row exact: the batch in one call */
        return d->ops->attn_decode(&d->shape, c->n, d->q, views, d->att, NULL);
    for (size_t i = 0; i < n_full && st == RI_OK; i++)
        st = d->ops->attn_decode(&d->shape, 1, d->q + rows[i] * qd, &views[i], d->att + rows[i] * qd, NULL);
    return st;
}

static void mdl_dev_residual(void *ctx, uint32_t l, mdl_nid_t post)
{
    mdl_dev_ctx_t *c = ctx;
    mdl_dev_t *d = c->d;
    mdl_dk_residual(d->x, d->xb, d->layers[l].norm[post], d->hp.n_embd, c->n, d->hp.eps);
}

static void mdl_dev_glu(void *ctx)
{
    mdl_dev_ctx_t *c = ctx;
    mdl_dk_glu(c->d->g, c->d->u, c->n * c->d->hp.n_ff, c->d->hp.geglu);
}

/* The wanted rows' logits, packed in row order into logits (host), then
 * wait for the stream.  The head runs over every row of the step when any
 * is wanted (one GEMV reads the head once for all of them); a prefill step
 * that wants none skips it. */
static ri_status_t mdl_dev_logits(void *ctx, const bool *want, float *logits)
{
    mdl_dev_ctx_t *c = ctx;
    mdl_dev_t *d = c->d;
    const mdl_hparams_t *hp = &d->hp;
    size_t n_want = 0;
    for (size_t b = 0; b < c->n; b++)
        n_want += want[b] ? 1 : 0;
    if (n_want > 0 && logits != NULL) {
        mdl_dk_rmsnorm(d->xb, d->x, d->output_norm, hp->n_embd, c->n, hp->eps);
        mdl_dev_gemv(&d->output, d->xb, c->n, d->logits);
        if (hp->logit_softcap > 0)
            mdl_dk_softcap(d->logits, c->n * hp->n_vocab, hp->logit_softcap);
    }
    ri_status_t st = mdl_dk_sync("forward step");
    for (size_t b = 0, k = 0; b < c->n && st == RI_OK && n_want > 0 && logits != NULL; b++)
        if (want[b])
            st = mdl_dk_d2h(logits + (k++) * hp->n_vocab, d->logits + b * hp->n_vocab,
                            hp->n_vocab * sizeof(float));
    return st;
}

static const mdl_backend_ops_t mdl_backend_cuda = {
    .name = "cuda",
    .embed = mdl_dev_embed,
    .rmsnorm = mdl_dev_rmsnorm,
    .matmul = mdl_dev_matmul,
    .attention = mdl_dev_attention,
    .residual = mdl_dev_residual,
    .glu = mdl_dev_glu,
    .logits = mdl_dev_logits,
};

/* A step of at most MDL_DEV_MAX_BATCH rows, checked by the caller: the one
 * forward pass over this backend. */
static ri_status_t mdl_dev_step(mdl_dev_t *d, mdl_dev_seq_t *const *seqs, const int32_t *tokens, size_t n,
                                float *logits)
{
    _Static_assert(MDL_DEV_MAX_BATCH == 8, "one want flag per row below");
    static const bool all[MDL_DEV_MAX_BATCH] = {true, true, true, true, true, true, true, true};
    size_t pos[MDL_DEV_MAX_BATCH];
    for (size_t b = 0; b < n; b++) {
        pos[b] = seqs[b]->len;
        /* a retroinfer sequence prefilled on the device is indexed at its
         * first decode step, over everything prefilled (as the CPU model) */
        ri_status_t st = mdl_dev_seq_index(d, seqs[b]);
        if (st != RI_OK)
            return st;
    }
    mdl_dev_ctx_t c = {.d = d, .seqs = seqs, .tokens = tokens, .pos = pos, .n = n};
    ri_status_t st = mdl_forward_run(&mdl_backend_cuda, &c, d->hp.n_layers, NULL, all, logits);
    if (st != RI_OK)
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

/* Prefill: tokens [0, n) of s at positions s->len + i, MDL_DEV_MAX_BATCH
 * rows a step (each row a view of the cache up to its own position: the
 * causal mask), the last row's logits wanted. */
ri_status_t mdl_dev_prefill(mdl_dev_t *d, mdl_dev_seq_t *s, const int32_t *tokens, size_t n, float *logits)
{
    if (d == NULL || s == NULL || s->d != d || tokens == NULL || n == 0)
        return RI_ERR_INVALID;
    for (size_t i = 0; i < n; i++)
        if (tokens[i] < 0 || (uint32_t)tokens[i] >= d->hp.n_vocab)
            return RI_ERR_INVALID;
    if (n > s->cap - s->len)
        return RI_ERR_RANGE;
    mdl_dev_seq_t *rows[MDL_DEV_MAX_BATCH];
    size_t pos[MDL_DEV_MAX_BATCH];
    bool want[MDL_DEV_MAX_BATCH];
    for (size_t b = 0; b < MDL_DEV_MAX_BATCH; b++)
        rows[b] = s;
    for (size_t i0 = 0; i0 < n;) {
        size_t c = CM_MIN((size_t)MDL_DEV_MAX_BATCH, n - i0);
        for (size_t b = 0; b < c; b++) {
            pos[b] = s->len + b;
            want[b] = i0 + b == n - 1;
        }
        mdl_dev_ctx_t x = {.d = d, .seqs = rows, .tokens = tokens + i0, .pos = pos, .n = c, .prefill = true};
        ri_status_t st = mdl_forward_run(&mdl_backend_cuda, &x, d->hp.n_layers, NULL, want,
                                         i0 + c == n ? logits : NULL);
        if (st != RI_OK)
            return st;   /* the steps before stay: s->len counts them */
        s->len += c;
        i0 += c;
    }
    return RI_OK;
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
