/*
 * The device engine's weights and sequences (mdl_dev.h).  The weights are
 * read through the model's public view of its file (mdl_model_gguf) by the
 * block tensor table mdl_model.c reads (mdl_backend.h), expanded row by row with the CPU
 * dequantiser, rounded to fp16 and copied to the device in chunks: no
 * quantised format is decoded on the device (yet).  Checked on an H200 with synthetic models (test_model_dev).
 */
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "common/cm_alloc.h"
#include "common/cm_half.h"
#include "common/cm_status.h"
#include "gpuworker/model/cuda/mdl_dev_int.h"
#include "kernels/cuda/kn_cuda.h"
#include "kernels/kn_mem.h"

static CM_ALLOC_TAG(mdl_dev_tag, "model.dev");

#define MDL_DEV_STAGE_BYTES (16u << 20) /* host staging per copy: big enough to stream, small beside 335 MB */

/* Rows [r0, r0 + n) of w into stage as fp16 rows of ld (tail zeroed). */
static void mdl_dev_stage_rows(const mdl_weight_t *w, size_t r0, size_t n, size_t ld, float *row, uint16_t *stage)
{
    for (size_t r = 0; r < n; r++) {
        uint16_t *dst = stage + r * ld;
        mdl_dequant_row(w, r0 + r, row);
        cm_f32_to_fp16_n((cm_fp16_t *)dst, row, w->cols);
        memset(dst + w->cols, 0, (ld - w->cols) * sizeof(uint16_t));
    }
}

/* Upload the matrix called name ([rows][cols]) as fp16 into out (owned by
 * the caller: mdl_dk_free(out->w)). */
static ri_status_t mdl_dev_mat(mdl_dev_t *d, const char *name, size_t rows, size_t cols, mdl_dev_mat_t *out,
                               char *err, size_t errlen)
{
    mdl_weight_t w;
    ri_status_t st = mdl_model_weight(d->m, name, rows, cols, &w, err, errlen);
    if (st != RI_OK)
        return st;
    size_t ld = (cols + 7) / 8 * 8, row_bytes = ld * sizeof(uint16_t);
    size_t chunk = CM_MAX((size_t)1, MDL_DEV_STAGE_BYTES / row_bytes);
    float *row = cm_malloc(&mdl_dev_tag, cols * sizeof(float));
    uint16_t *stage = cm_malloc(&mdl_dev_tag, CM_MIN(chunk, rows) * row_bytes);
    *out = (mdl_dev_mat_t){.rows = rows, .cols = cols, .ld = ld};
    if (row == NULL || stage == NULL) {
        st = RI_ERR_NOMEM;
        goto cleanup;
    }
    if ((st = mdl_dk_malloc((void **)&out->w, rows * row_bytes)) != RI_OK)
        goto cleanup;
    for (size_t r0 = 0; r0 < rows && st == RI_OK; r0 += chunk) {
        size_t n = CM_MIN(chunk, rows - r0);
        mdl_dev_stage_rows(&w, r0, n, ld, row, stage);
        st = mdl_dk_h2d(out->w + r0 * ld, stage, n * row_bytes);
    }
    if (st == RI_OK)
        d->weight_bytes += (uint64_t)rows * row_bytes;
cleanup:
    if (st != RI_OK)
        mdl_errf(err, errlen, st, "device: cannot upload %s: %s", name, ri_status_str(st));
    cm_free(row);
    cm_free(stage);
    return st;
}

/* Upload the 1-D weight called name ([n], a norm) as fp32, as mdl_get_vector
 * expands it. */
static ri_status_t mdl_dev_vec(mdl_dev_t *d, const char *name, size_t n, float **out, char *err, size_t errlen)
{
    mdl_weight_t w;
    ri_status_t st = mdl_model_weight(d->m, name, 1, n, &w, err, errlen);
    if (st != RI_OK)
        return st;
    float *h = cm_malloc(&mdl_dev_tag, n * sizeof(float));
    if (h == NULL)
        return RI_ERR_NOMEM;
    mdl_dequant_row_ref(&w, 0, h);
    if ((st = mdl_dk_malloc((void **)out, n * sizeof(float))) == RI_OK)
        st = mdl_dk_h2d(*out, h, n * sizeof(float));
    cm_free(h);
    return st;
}

/* One block's weights, by the block tensor table that mdl_model.c reads. */
static ri_status_t mdl_dev_layer(mdl_dev_t *d, uint32_t l, char *err, size_t errlen)
{
    const mdl_hparams_t *hp = &d->hp;
    mdl_dev_layer_t *L = &d->layers[l];
    char n[96];
    ri_status_t st;
    for (int w = 0; w < MDL_W_N; w++) {
        const mdl_tensor_desc_t *t = &mdl_block_weights[w];
        mdl_block_tensor_name(l, t, n, sizeof(n));
        if ((st = mdl_dev_mat(d, n, mdl_dim_size(hp, t->rows), mdl_dim_size(hp, t->cols), &L->w[w], err,
                              errlen)) != RI_OK)
            return st;
    }
    for (int v = 0; v < MDL_N_N; v++) {
        if (!mdl_block_norm_used(hp, (mdl_nid_t)v))
            continue;
        mdl_block_tensor_name(l, &mdl_block_norms[v], n, sizeof(n));
        if ((st = mdl_dev_vec(d, n, mdl_dim_size(hp, mdl_block_norms[v].cols), &L->norm[v], err, errlen)) !=
            RI_OK)
            return st;
    }
    L->window = mdl_model_layer_window(d->m, l);
    return RI_OK;
}

ri_status_t mdl_dev_buffers(mdl_dev_t *d)
{
    const mdl_hparams_t *hp = &d->hp;
    size_t B = MDL_DEV_MAX_BATCH, qd = (size_t)hp->n_heads * hp->head_dim;
    size_t kvd = (size_t)hp->n_kv_heads * hp->head_dim, f = sizeof(float);
    ri_status_t st;
    if ((st = mdl_dk_malloc((void **)&d->x, B * hp->n_embd * f)) != RI_OK ||
        (st = mdl_dk_malloc((void **)&d->xb, B * hp->n_embd * f)) != RI_OK ||
        (st = mdl_dk_malloc((void **)&d->q, B * qd * f)) != RI_OK ||
        (st = mdl_dk_malloc((void **)&d->k, B * kvd * f)) != RI_OK ||
        (st = mdl_dk_malloc((void **)&d->v, B * kvd * f)) != RI_OK ||
        (st = mdl_dk_malloc((void **)&d->att, B * qd * f)) != RI_OK ||
        (st = mdl_dk_malloc((void **)&d->g, B * hp->n_ff * f)) != RI_OK ||
        (st = mdl_dk_malloc((void **)&d->u, B * hp->n_ff * f)) != RI_OK ||
        (st = mdl_dk_malloc((void **)&d->logits, B * hp->n_vocab * f)) != RI_OK ||
        (st = mdl_dk_malloc((void **)&d->cs, B * 2 * hp->n_rot * f)) != RI_OK ||
        (st = mdl_dk_malloc((void **)&d->rows, (size_t)hp->n_layers * B * sizeof(mdl_dk_row_t))) != RI_OK)
        return st;
    d->h_x = cm_malloc(&mdl_dev_tag, B * hp->n_embd * f);
    d->h_cs = cm_calloc(&mdl_dev_tag, B * 2 * hp->n_rot, f);
    d->h_rows = cm_calloc(&mdl_dev_tag, (size_t)hp->n_layers * B, sizeof(mdl_dk_row_t));
    if (!d->h_x || !d->h_cs || !d->h_rows)
        return RI_ERR_NOMEM;
    return RI_OK;
}

ri_status_t mdl_dev_attach(mdl_dev_t *d, char *err, size_t errlen)
{
    ri_status_t st = mdl_dk_probe();
    if (st == RI_OK)
        st = kn_cuda_init();
    if (st != RI_OK || (d->ops = kn_ops_cuda()) == NULL)
        return mdl_errf(err, errlen, RI_ERR_NO_DEVICE, "device: no usable CUDA device");
    d->shape = (kn_shape_t){.n_q_heads = d->hp.n_heads, .n_kv_heads = d->hp.n_kv_heads,
                            .head_dim = d->hp.head_dim};
    if (!d->ops->supports(KN_OP_ATTN_DECODE, &d->shape, KN_DTYPE_F16))
        return mdl_errf(err, errlen, RI_ERR_UNSUPPORTED,
                            "device: the CUDA attention does not take %u query heads per KV head at head_dim %u "
                            "(at most 8 and 256)", d->hp.n_heads / d->hp.n_kv_heads, d->hp.head_dim);
    return RI_OK;
}

static void mdl_dev_model_embed_row(const mdl_dev_t *d, int32_t token, float *out)
{
    mdl_dequant_row(&d->embd, (size_t)token, out);
}

static void mdl_dev_model_rope(const mdl_dev_t *d, bool swa, size_t pos, float *cs)
{
    mdl_model_rope_angles(d->m, swa, pos, cs);
}

/* A model's step inputs: read from its mapping, as the CPU path reads them. */
static const mdl_dev_src_t mdl_dev_model_src = {.embed_row = mdl_dev_model_embed_row,
                                                .rope_angles = mdl_dev_model_rope};

ri_status_t mdl_dev_create(const mdl_model_t *m, mdl_dev_t **d_p, char *err, size_t errlen)
{
    const mdl_hparams_t *hp = mdl_model_hparams(m);
    mdl_dev_t *d = cm_calloc(&mdl_dev_tag, 1, sizeof(*d));
    ri_status_t st;
    if (err != NULL && errlen > 0)
        err[0] = '\0';
    if (d == NULL)
        return RI_ERR_NOMEM;
    d->m = m;
    d->hp = *hp;
    d->src = &mdl_dev_model_src;
    if ((st = mdl_dev_attach(d, err, errlen)) != RI_OK)
        goto err_free_dev;
    if ((st = mdl_model_weight(m, "token_embd.weight", hp->n_vocab, hp->n_embd, &d->embd, err, errlen)) != RI_OK)
        goto err_free_dev;
    d->layers = cm_calloc(&mdl_dev_tag, hp->n_layers, sizeof(*d->layers));
    if (d->layers == NULL) {
        st = RI_ERR_NOMEM;
        goto err_free_dev;
    }
    for (uint32_t l = 0; l < hp->n_layers; l++)
        if ((st = mdl_dev_layer(d, l, err, errlen)) != RI_OK)
            goto err_free_dev;
    /* the head: output.weight, or the embedding when tied (as mdl_model_load) */
    const char *head = mdl_gguf_tensor(mdl_model_gguf(m), "output.weight") != NULL ? "output.weight"
                                                                                     : "token_embd.weight";
    if ((st = mdl_dev_mat(d, head, hp->n_vocab, hp->n_embd, &d->output, err, errlen)) != RI_OK ||
        (st = mdl_dev_vec(d, "output_norm.weight", hp->n_embd, &d->output_norm, err, errlen)) != RI_OK ||
        (st = mdl_dev_buffers(d)) != RI_OK)
        goto err_free_dev;
    *d_p = d;
    return RI_OK;

err_free_dev:
    if (err != NULL && errlen > 0 && err[0] == '\0')
        snprintf(err, errlen, "device: %s", ri_status_str(st));
    mdl_dev_destroy(d);
    return st;
}

static void mdl_dev_layer_free(mdl_dev_layer_t *L)
{
    for (int w = 0; w < MDL_W_N; w++)
        mdl_dk_free(L->w[w].w);
    for (int v = 0; v < MDL_N_N; v++)
        mdl_dk_free(L->norm[v]);
}

void mdl_dev_destroy(mdl_dev_t *d)
{
    if (d == NULL)
        return;
    if (d->layers != NULL)
        for (uint32_t l = 0; l < d->hp.n_layers; l++)
            mdl_dev_layer_free(&d->layers[l]);
    cm_free(d->layers);
    mdl_dk_free(d->output.w);
    mdl_dk_free(d->output_norm);
    float *acts[] = {d->x, d->xb, d->q, d->k, d->v, d->att, d->g, d->u, d->logits, d->cs};
    for (size_t i = 0; i < CM_ARRAY_LEN(acts); i++)
        mdl_dk_free(acts[i]);
    mdl_dk_free(d->rows);
    cm_free(d->h_x);
    cm_free(d->h_cs);
    cm_free(d->h_rows);
    cm_free(d);
}

uint64_t mdl_dev_weight_bytes(const mdl_dev_t *d)
{
    return d->weight_bytes;
}

/* ---- sequences ---- */

/* s's wave indexes for "retroinfer": one per global layer, over the
 * engine's kernels table and the memory space it reads (the device; the
 * host under the host stand-ins). */
static ri_status_t mdl_dev_seq_waves(mdl_dev_seq_t *s, const mdl_attn_cfg_t *cfg, char *err, size_t errlen)
{
    mdl_dev_t *d = s->d;
    const kn_mem_t *mem = kn_mem_of(d->ops);
    s->wave = cm_calloc(&mdl_dev_tag, d->hp.n_layers, sizeof(*s->wave));
    if (s->wave == NULL)
        return RI_ERR_NOMEM;
    for (uint32_t l = 0; l < d->hp.n_layers; l++) {
        if (d->layers[l].window > 0)
            continue; /* exact over its window, as the CPU runtime does */
        ri_status_t st = mdl_dwave_create(&d->shape, &cfg->wave, d->ops, mem, &s->wave[l], err, errlen);
        if (st != RI_OK)
            return st;
    }
    return RI_OK;
}

/* s's backend be (device_ok): a view of the device cache as its mdl_kv_t,
 * host q/out rows, and its state, created with cfg's settings over the
 * engine's kernels table (so that it reads the cache through the space
 * that table reads). */
static ri_status_t mdl_dev_seq_backend(mdl_dev_seq_t *s, const mdl_attn_ops_t *be, const mdl_attn_cfg_t *cfg)
{
    mdl_dev_t *d = s->d;
    const mdl_hparams_t *hp = &d->hp;
    size_t qd = (size_t)hp->n_heads * hp->head_dim;
    mdl_attn_cfg_t c = *cfg;
    c.wave.ops = d->ops;
    c.prefix = NULL; /* prefix reuse fills a host cache */
    s->be_kv = (mdl_kv_t){.geom = {.n_layers = hp->n_layers, .n_heads = hp->n_heads,
                                   .n_kv_heads = hp->n_kv_heads, .head_dim = hp->head_dim},
                          .cap = s->cap, .token_stride = hp->head_dim, .head_stride = s->cap * hp->head_dim};
    s->be_kv.k = cm_calloc(&mdl_dev_tag, hp->n_layers, sizeof(cm_fp16_t *));
    s->be_kv.v = cm_calloc(&mdl_dev_tag, hp->n_layers, sizeof(cm_fp16_t *));
    s->h_q = cm_malloc(&mdl_dev_tag, qd * sizeof(float));
    s->h_out = cm_malloc(&mdl_dev_tag, qd * sizeof(float));
    if (!s->be_kv.k || !s->be_kv.v || !s->h_q || !s->h_out)
        return RI_ERR_NOMEM;
    for (uint32_t l = 0; l < hp->n_layers; l++) {
        s->be_kv.k[l] = (cm_fp16_t *)mdl_dev_seq_kv(s, l, 0);
        s->be_kv.v[l] = (cm_fp16_t *)mdl_dev_seq_kv(s, l, 1);
    }
    ri_status_t st = be->create(&c, &s->be_kv, &s->be_state);
    if (st == RI_OK)
        s->be = be;
    return st;
}

ri_status_t mdl_dev_seq_create_attn(mdl_dev_t *d, size_t cap, const char *attn, const mdl_attn_cfg_t *cfg,
                                    mdl_dev_seq_t **s_p, char *err, size_t errlen)
{
    const mdl_hparams_t *hp = &d->hp;
    bool retro = attn != NULL && strcmp(attn, "retroinfer") == 0;
    const mdl_attn_ops_t *be = NULL;
    if (cap == 0 || attn == NULL || (retro && cfg == NULL))
        return mdl_errf(err, errlen, RI_ERR_INVALID, "device sequence: bad arguments");
    if (!retro && strcmp(attn, "full") != 0) {
        be = mdl_attn_find(attn);
        if (be == NULL || !be->device_ok)
            return mdl_errf(err, errlen, RI_ERR_UNSUPPORTED,
                            "attn %.64s does not run on the device (it decodes full, retroinfer and the "
                            "backends that read device memory)", attn);
        if (cfg == NULL)
            return mdl_errf(err, errlen, RI_ERR_INVALID, "device sequence: attn %.64s needs settings", attn);
    }
    mdl_dev_seq_t *s = cm_calloc(&mdl_dev_tag, 1, sizeof(*s));
    if (s == NULL)
        return RI_ERR_NOMEM;
    s->d = d;
    s->cap = cap;
    size_t bytes = 2 * (size_t)hp->n_layers * hp->n_kv_heads * cap * hp->head_dim * sizeof(uint16_t);
    ri_status_t st = mdl_dk_malloc((void **)&s->kv, bytes);
    if (st == RI_OK && retro)
        st = mdl_dev_seq_waves(s, cfg, err, errlen);
    if (st == RI_OK && be != NULL && (st = mdl_dev_seq_backend(s, be, cfg)) != RI_OK)
        mdl_errf(err, errlen, st, "attn %.64s: cannot start a device sequence: %s", attn, ri_status_str(st));
    if (st != RI_OK) {
        mdl_dev_seq_destroy(s);
        return st;
    }
    *s_p = s;
    return RI_OK;
}

ri_status_t mdl_dev_seq_create(mdl_dev_t *d, size_t cap, mdl_dev_seq_t **s_p)
{
    return mdl_dev_seq_create_attn(d, cap, "full", NULL, s_p, NULL, 0);
}

void mdl_dev_seq_destroy(mdl_dev_seq_t *s)
{
    if (s == NULL)
        return;
    for (uint32_t l = 0; s->wave != NULL && l < s->d->hp.n_layers; l++)
        mdl_dwave_destroy(s->wave[l]);
    cm_free(s->wave);
    if (s->be != NULL)
        s->be->destroy(s->be_state); /* before the cache it reads */
    cm_free(s->be_kv.k);
    cm_free(s->be_kv.v);
    cm_free(s->h_q);
    cm_free(s->h_out);
    mdl_dk_free(s->kv);
    cm_free(s);
}

void mdl_dev_seq_attn_stats(const mdl_dev_seq_t *s, mdl_attn_stats_t *st_p)
{
    const mdl_hparams_t *hp = &s->d->hp;
    memset(st_p, 0, sizeof(*st_p));
    if (s->be != NULL) { /* the backend's own figures (global layers) */
        if (s->be->stats != NULL)
            s->be->stats(s->be_state, st_p);
        return;
    }
    st_p->decode_steps = s->full_steps;
    st_p->exact_tokens = s->full_tokens;
    st_p->bytes_read = s->full_tokens * hp->n_kv_heads * hp->head_dim * 2 * sizeof(uint16_t);
    for (uint32_t l = 0; s->wave != NULL && l < hp->n_layers; l++) {
        mdl_dwave_stats_t ws;
        if (s->wave[l] == NULL)
            continue;
        mdl_dwave_stats(s->wave[l], &ws);
        st_p->decode_steps += ws.steps;
        st_p->exact_tokens += ws.exact_tokens;
        st_p->bytes_read += ws.bytes_read;
        st_p->build_s += ws.build_s;
        st_p->tokens_per_cluster = kn_wave_params(mdl_dwave_wave(s->wave[l]))->tokens_per_cluster;
    }
}

uint64_t mdl_dev_seq_bytes(const mdl_dev_seq_t *s)
{
    const mdl_hparams_t *hp = &s->d->hp;
    uint64_t bytes = 2ull * hp->n_layers * hp->n_kv_heads * s->cap * hp->head_dim * sizeof(uint16_t);
    for (uint32_t l = 0; s->wave != NULL && l < hp->n_layers; l++) {
        mdl_dwave_stats_t ws;
        if (s->wave[l] == NULL)
            continue;
        mdl_dwave_stats(s->wave[l], &ws);
        bytes += ws.index_bytes;
    }
    return bytes;
}

size_t mdl_dev_seq_len(const mdl_dev_seq_t *s)
{
    return s->len;
}

size_t mdl_dev_seq_cap(const mdl_dev_seq_t *s)
{
    return s->cap;
}

/* Whether cpu's cache has d's geometry. */
static bool mdl_dev_same_geom(const mdl_dev_t *d, const mdl_kv_t *kv)
{
    const mdl_hparams_t *hp = &d->hp;
    return kv->geom.n_layers == hp->n_layers && kv->geom.n_kv_heads == hp->n_kv_heads &&
           kv->geom.head_dim == hp->head_dim;
}

ri_status_t mdl_dev_seq_load(mdl_dev_t *d, mdl_dev_seq_t *s, const mdl_seq_t *cpu)
{
    const mdl_kv_t *kv = mdl_seq_kv(cpu);
    const mdl_hparams_t *hp = &d->hp;
    size_t len = mdl_seq_len(cpu), dim = hp->head_dim;
    if (s->d != d || !mdl_dev_same_geom(d, kv))
        return RI_ERR_INVALID;
    if (len > s->cap)
        return RI_ERR_RANGE;
    if (s->indexed)
        return RI_ERR_INVALID;   /* an index covers what the cache held */
    if (len == 0) {
        s->len = 0;
        return RI_OK;
    }
    /* the host cache is token-major, the device's head-major: each
     * (layer, head, K|V) is gathered into one run, then one copy */
    cm_fp16_t *run = cm_malloc(&mdl_dev_tag, len * dim * sizeof(cm_fp16_t));
    if (run == NULL)
        return RI_ERR_NOMEM;
    ri_status_t st = RI_OK;
    for (uint32_t l = 0; l < hp->n_layers && st == RI_OK; l++)
        for (uint32_t h = 0; h < hp->n_kv_heads && st == RI_OK; h++)
            for (int which = 0; which < 2 && st == RI_OK; which++) {
                for (size_t t = 0; t < len; t++)
                    memcpy(run + t * dim, which ? mdl_kv_vrow(kv, l, h, t) : mdl_kv_krow(kv, l, h, t),
                           dim * sizeof(cm_fp16_t));
                st = mdl_dk_h2d(mdl_dev_seq_kv(s, l, which) + (size_t)h * s->cap * dim, run,
                                len * dim * sizeof(cm_fp16_t));
            }
    cm_free(run);
    if (st != RI_OK)
        return st;
    s->len = len;
    return RI_OK;
}

ri_status_t mdl_dev_seq_upload(mdl_dev_t *d, mdl_dev_seq_t *s, const mdl_seq_t *cpu)
{
    ri_status_t st = mdl_dev_seq_load(d, s, cpu);
    return st == RI_OK ? mdl_dev_seq_index(d, s) : st;
}

/* mdl_seq_preload's fill: positions [pos0, pos0 + n) of (layer, kv_head)
 * copied down from the device sequence arg. */
static ri_status_t mdl_dev_seq_fill_down(void *arg, uint32_t layer, uint32_t kv_head, size_t pos0, size_t n,
                                         cm_fp16_t *k, cm_fp16_t *v, size_t token_stride)
{
    const mdl_dev_seq_t *s = arg;
    size_t dim = s->d->hp.head_dim, off = ((size_t)kv_head * s->cap + pos0) * dim;
    const uint16_t *dk = mdl_dev_seq_kv(s, layer, 0) + off, *dv = mdl_dev_seq_kv(s, layer, 1) + off;
    if (token_stride == dim) { /* one copy each */
        ri_status_t st = mdl_dk_d2h(k, dk, n * dim * sizeof(uint16_t));
        return st == RI_OK ? mdl_dk_d2h(v, dv, n * dim * sizeof(uint16_t)) : st;
    }
    /* one copy each into a run, then spread over the rows: a copy per
     * row would be a round trip per row */
    uint16_t *run = cm_malloc(&mdl_dev_tag, n * dim * sizeof(uint16_t));
    if (run == NULL)
        return RI_ERR_NOMEM;
    ri_status_t st = RI_OK;
    for (int which = 0; which < 2 && st == RI_OK; which++) {
        st = mdl_dk_d2h(run, which ? dv : dk, n * dim * sizeof(uint16_t));
        for (size_t t = 0; t < n && st == RI_OK; t++)
            memcpy((which ? v : k) + t * token_stride, run + t * dim, dim * sizeof(uint16_t));
    }
    cm_free(run);
    return st;
}

ri_status_t mdl_dev_seq_download(mdl_dev_t *d, const mdl_dev_seq_t *s, mdl_seq_t *cpu)
{
    if (s->d != d || !mdl_dev_same_geom(d, mdl_seq_kv(cpu)) || mdl_seq_len(cpu) != 0 || s->len == 0)
        return RI_ERR_INVALID;
    return mdl_seq_preload(cpu, s->len, mdl_dev_seq_fill_down, (void *)s);
}

/* s's backend indexes each global layer over the s->len tokens of the
 * device cache (its prefill_end, as mdl_prefill_end on the CPU), once the
 * stream wrote them: the backend reads the cache from other threads. */
static ri_status_t mdl_dev_seq_index_backend(mdl_dev_t *d, mdl_dev_seq_t *s)
{
    ri_status_t st = mdl_dk_sync("device sequence index");
    s->be_kv.len = s->len;
    for (uint32_t l = 0; l < d->hp.n_layers && st == RI_OK; l++)
        if (d->layers[l].window == 0 && s->be->prefill_end != NULL)
            st = s->be->prefill_end(s->be_state, l);
    if (st == RI_OK)
        s->indexed = true;
    return st;
}

ri_status_t mdl_dev_seq_index(mdl_dev_t *d, mdl_dev_seq_t *s)
{
    const mdl_hparams_t *hp = &d->hp;
    size_t dim = hp->head_dim;
    ri_status_t st = RI_OK;
    if (s->be != NULL && !s->indexed)
        return mdl_dev_seq_index_backend(d, s);
    if (s->wave == NULL || s->indexed)
        return RI_OK;
    /* each global layer's index from the device cache (the cuda
     * index_build reads device K/V in place) */
    for (uint32_t l = 0; l < hp->n_layers && st == RI_OK; l++) {
        if (s->wave[l] == NULL)
            continue;
        kn_kv_view_t view = {.k = (const cm_fp16_t *)mdl_dev_seq_kv(s, l, 0),
                             .v = (const cm_fp16_t *)mdl_dev_seq_kv(s, l, 1), .n_tokens = s->len,
                             .token_stride = dim, .head_stride = s->cap * dim};
        st = mdl_dwave_build(s->wave[l], &view);
    }
    if (st == RI_OK)
        s->indexed = true;
    return st;
}
