/*
 * The device engine over a synthetic model (mdl_dev.h, mdl_synth.h): the
 * weight matrices generated in device memory by a kernel running the same
 * generator as the GGUF writer (no host copy: an 8B preset is 16 GB), the
 * norms generated on the host (a few KB), and the per-step embedding row
 * and RoPE angles computed on the host from the preset.  And a K/V filler
 * for device sequences, so that a long context needs no prefill (a 128K
 * prefill of an 8B model is out of reach of the CPU): clustered synthetic
 * K/V (kn_synth.h) generated on the host for one tile of tokens, copied to
 * the device and repeated along the sequence and across layers there.
 */
#include <stdio.h>
#include <string.h>

#include "common/cm_alloc.h"
#include "common/cm_status.h"
#include "gpuworker/model/cuda/mdl_dev_int.h"
#include "gpuworker/model/cuda/mdl_dev_synth_kern.h"
#include "gpuworker/model/mdl_synth.h"
#include "kernels/kn_synth.h"

static CM_ALLOC_TAG(mdl_dev_synth_tag, "model.dev.synth");

/* Tokens of synthetic K/V generated on the host per sequence fill; longer
 * sequences repeat them (the clusters' structure is within a tile). */
#define MDL_DEV_SYNTH_TILE 16384u

static void mdl_dev_synth_embed_row(const mdl_dev_t *d, int32_t token, float *out)
{
    mdl_synth_row(d->synth_embd_key, mdl_synth_scale(d->hp.n_embd), (size_t)token, d->hp.n_embd, out);
}

static void mdl_dev_synth_rope(const mdl_dev_t *d, bool swa, size_t pos, float *cs)
{
    (void)swa;   /* the presets have no sliding-window layers */
    mdl_synth_rope_angles(&d->hp, pos, cs);
}

static const mdl_dev_src_t mdl_dev_synth_src = {.embed_row = mdl_dev_synth_embed_row,
                                                .rope_angles = mdl_dev_synth_rope};

/* The matrix called name, [rows][cols], generated into out (queued). */
static ri_status_t mdl_dev_synth_mat(mdl_dev_t *d, uint64_t seed, const char *name, size_t rows, size_t cols,
                                     mdl_dev_mat_t *out)
{
    size_t ld = (cols + 7) / 8 * 8;
    *out = (mdl_dev_mat_t){.rows = rows, .cols = cols, .ld = ld};
    ri_status_t st = mdl_dk_malloc((void **)&out->w, rows * ld * sizeof(uint16_t));
    if (st != RI_OK)
        return st;
    mdl_dk_synth_fill(out->w, rows, cols, ld, mdl_synth_tensor_key(seed, name), mdl_synth_scale(cols));
    d->weight_bytes += (uint64_t)rows * ld * sizeof(uint16_t);
    return RI_OK;
}

/* The norm called name, [n] fp32, generated on the host and uploaded. */
static ri_status_t mdl_dev_synth_vec(uint64_t seed, const char *name, size_t n, float **out)
{
    float *h = cm_malloc(&mdl_dev_synth_tag, n * sizeof(float));
    if (h == NULL)
        return RI_ERR_NOMEM;
    mdl_synth_norm_vec(mdl_synth_tensor_key(seed, name), n, h);
    ri_status_t st = mdl_dk_malloc((void **)out, n * sizeof(float));
    if (st == RI_OK)
        st = mdl_dk_h2d(*out, h, n * sizeof(float));
    cm_free(h);
    return st;
}

/* Block l's tensors, by the block tensor table (as mdl_dev_layer). */
static ri_status_t mdl_dev_synth_layer(mdl_dev_t *d, uint64_t seed, uint32_t l)
{
    const mdl_hparams_t *hp = &d->hp;
    mdl_dev_layer_t *L = &d->layers[l];
    char n[96];
    ri_status_t st;
    for (int w = 0; w < MDL_W_N; w++) {
        const mdl_tensor_desc_t *t = &mdl_block_weights[w];
        mdl_block_tensor_name(l, t, n, sizeof(n));
        if ((st = mdl_dev_synth_mat(d, seed, n, mdl_dim_size(hp, t->rows), mdl_dim_size(hp, t->cols),
                                    &L->w[w])) != RI_OK)
            return st;
    }
    for (int v = 0; v < MDL_N_N; v++) {
        if (!mdl_block_norm_used(hp, (mdl_nid_t)v))
            continue;
        mdl_block_tensor_name(l, &mdl_block_norms[v], n, sizeof(n));
        if ((st = mdl_dev_synth_vec(seed, n, mdl_dim_size(hp, mdl_block_norms[v].cols), &L->norm[v])) != RI_OK)
            return st;
    }
    return RI_OK;
}

ri_status_t mdl_dev_create_synth(const mdl_synth_preset_t *p, uint64_t seed, mdl_dev_t **d_p, char *err,
                                 size_t errlen)
{
    if (err != NULL && errlen > 0)
        err[0] = '\0';
    if (p == NULL)
        return mdl_errf(err, errlen, RI_ERR_INVALID, "device: no synthetic preset");
    mdl_dev_t *d = cm_calloc(&mdl_dev_synth_tag, 1, sizeof(*d));
    ri_status_t st;
    if (d == NULL)
        return RI_ERR_NOMEM;
    mdl_synth_hparams(p, &d->hp);
    d->src = &mdl_dev_synth_src;
    d->synth_embd_key = mdl_synth_tensor_key(seed, "token_embd.weight");
    if ((st = mdl_dev_attach(d, err, errlen)) != RI_OK)
        goto err_free_dev;
    d->layers = cm_calloc(&mdl_dev_synth_tag, d->hp.n_layers, sizeof(*d->layers));
    if (d->layers == NULL) {
        st = RI_ERR_NOMEM;
        goto err_free_dev;
    }
    for (uint32_t l = 0; l < d->hp.n_layers; l++)
        if ((st = mdl_dev_synth_layer(d, seed, l)) != RI_OK)
            goto err_free_dev;
    if ((st = mdl_dev_synth_mat(d, seed, "output.weight", d->hp.n_vocab, d->hp.n_embd, &d->output)) != RI_OK ||
        (st = mdl_dev_synth_vec(seed, "output_norm.weight", d->hp.n_embd, &d->output_norm)) != RI_OK ||
        (st = mdl_dev_buffers(d)) != RI_OK || (st = mdl_dk_sync("synthetic weights")) != RI_OK)
        goto err_free_dev;
    *d_p = d;
    return RI_OK;

err_free_dev:
    if (err != NULL && errlen > 0 && err[0] == '\0')
        snprintf(err, errlen, "device: synthetic %s (%.1f GB of weights so far): %s", p->name,
                 (double)d->weight_bytes / 1e9, ri_status_str(st));
    mdl_dev_destroy(d);
    return st;
}

const mdl_hparams_t *mdl_dev_hparams(const mdl_dev_t *d)
{
    return &d->hp;
}

/* One tile of T tokens of K and V for every KV head into layer 0 of s. */
static ri_status_t mdl_dev_synth_tile(mdl_dev_seq_t *s, size_t T, uint64_t seed)
{
    const mdl_hparams_t *hp = &s->d->hp;
    size_t dim = hp->head_dim, head = T * dim;
    kn_synth_params_t sp;
    kn_synth_params_default(&sp);
    sp.n_q_heads = hp->n_heads;
    sp.n_kv_heads = hp->n_kv_heads;
    sp.head_dim = hp->head_dim;
    sp.n_tokens = T;
    sp.seed = seed;
    cm_fp16_t *k = cm_malloc(&mdl_dev_synth_tag, hp->n_kv_heads * head * sizeof(cm_fp16_t));
    cm_fp16_t *v = cm_malloc(&mdl_dev_synth_tag, hp->n_kv_heads * head * sizeof(cm_fp16_t));
    ri_status_t st = k != NULL && v != NULL ? kn_synth_kv(&sp, k, v, dim, head) : RI_ERR_NOMEM;
    for (uint32_t h = 0; h < hp->n_kv_heads && st == RI_OK; h++) {
        st = mdl_dk_h2d(mdl_dev_seq_kv(s, 0, 0) + h * s->cap * dim, k + h * head, head * sizeof(cm_fp16_t));
        if (st == RI_OK)
            st = mdl_dk_h2d(mdl_dev_seq_kv(s, 0, 1) + h * s->cap * dim, v + h * head, head * sizeof(cm_fp16_t));
    }
    cm_free(k);
    cm_free(v);
    return st;
}

ri_status_t mdl_dev_seq_fill_synth(mdl_dev_t *d, mdl_dev_seq_t *s, size_t n, uint64_t seed)
{
    const mdl_hparams_t *hp = &d->hp;
    size_t dim = hp->head_dim, T = CM_MIN(n, (size_t)MDL_DEV_SYNTH_TILE), el = sizeof(uint16_t);
    if (s == NULL || s->d != d || n == 0)
        return RI_ERR_INVALID;
    if (n > s->cap)
        return RI_ERR_RANGE;
    ri_status_t st = mdl_dev_synth_tile(s, T, seed);
    /* layer 0: each head's tile repeated to n tokens, doubling the copied span */
    for (int which = 0; which < 2; which++)
        for (uint32_t h = 0; h < hp->n_kv_heads; h++) {
            uint16_t *base = mdl_dev_seq_kv(s, 0, which) + h * s->cap * dim;
            for (size_t m = T; m < n && st == RI_OK; m += CM_MIN(m, n - m))
                st = mdl_dk_d2d(base + m * dim, base, CM_MIN(m, n - m) * dim * el);
        }
    /* the other layers: layer 0's heads */
    for (uint32_t l = 1; l < hp->n_layers && st == RI_OK; l++)
        for (int which = 0; which < 2; which++)
            for (uint32_t h = 0; h < hp->n_kv_heads && st == RI_OK; h++)
                st = mdl_dk_d2d(mdl_dev_seq_kv(s, l, which) + h * s->cap * dim,
                                mdl_dev_seq_kv(s, 0, which) + h * s->cap * dim, n * dim * el);
    if (st == RI_OK)
        st = mdl_dk_sync("synthetic K/V");
    if (st == RI_OK)
        s->len = n;
    return st;
}
