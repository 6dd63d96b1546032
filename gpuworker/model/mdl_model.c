/*
 * Llama and Gemma 3 forward pass (see mdl_model.h).  One routine runs a set
 * of rows (token, sequence, position) through every layer; prefill passes one
 * sequence's consecutive positions, decode one row per sequence.  Only the
 * attention call differs.  The Gemma 3 extras (QK norm, post-norms, GeGLU,
 * sliding windows, NEOX RoPE) are switched by flags in the hyper-parameters,
 * so one loop serves both.
 */
#define _GNU_SOURCE
#include "gpuworker/model/mdl_model.h"

#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include "common/cm_alloc.h"
#include "common/cm_log.h"
#include "common/cm_status.h"
#include "common/cm_thread.h"
#include "common/cm_time.h"
#include "gpuworker/model/mdl_backend.h"
#include "gpuworker/model/mdl_kv_mem.h"
#include "gpuworker/model/mdl_quant.h"
#include "gpuworker/model/mdl_vec.h"
#ifdef MDL_HAVE_KERNELS
#include "kernels/kn_ops.h"
#endif

static CM_ALLOC_TAG(mdl_model_tag, "model.model");
static CM_ALLOC_TAG(mdl_act_tag, "model.activations");

typedef struct mdl_layer {
    float *norm[MDL_N_N];          /* owned, fp32; NULL where the architecture has none */
    uint32_t window;               /* sliding window (tokens); 0 = global */
    const double *inv_freq;        /* RoPE frequencies of this layer (borrowed) */
    mdl_weight_t w[MDL_W_N];       /* projections, in the model's mapping */
} mdl_layer_t;

struct mdl_model {
    mdl_gguf_t *gguf;        /* owned: the mapping the weights point into */
    mdl_tok_t *tok;          /* owned */
    mdl_hparams_t hp;        /* hyper-parameters */
    mdl_layer_t *layers;     /* [n_layers] */
    mdl_weight_t embd;       /* token embedding [n_vocab][n_embd] */
    mdl_weight_t output;     /* output head (the embedding when tied) */
    float *output_norm;      /* [n_embd], owned */
    double *inv_freq;        /* [n_rot/2] RoPE frequencies (global layers) */
    double *inv_freq_swa;    /* [n_rot/2] those of the sliding-window layers */
    char name[128];          /* for messages */
    size_t chunk;            /* prefill chunk */
    uint64_t weight_bytes;   /* bytes read per decode step */
    bool prof_on;            /* mdl_model_profile: time each op of mdl_forward */
    mdl_profile_t prof;      /* its seconds per op */
};

struct mdl_seq {
    mdl_model_t *model;           /* borrowed */
    mdl_kv_t *kv;                 /* owned */
    const mdl_attn_ops_t *attn;   /* backend */
    mdl_attn_cfg_t cfg;           /* its settings */
    void *attn_state;             /* owned by the backend */
    bool decoding;                /* first decode step done (index built) */
    size_t win_released;          /* cfg.release_window: sliding-window layers' tokens
                                     [0, win_released) given back */
    mdl_qhook_fn_t qhook;         /* optional query hook */
    void *qhook_arg;
};

ri_status_t mdl_errf(char *err, size_t errlen, ri_status_t st, const char *fmt, ...)
{
    if (err != NULL && errlen > 0) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(err, errlen, fmt, ap);
        va_end(ap);
    }
    return st;
}

ri_status_t mdl_model_weight(const mdl_model_t *m, const char *name, size_t rows, size_t cols, mdl_weight_t *w,
                             char *err, size_t errlen)
{
    const mdl_gguf_tensor_t *t = mdl_gguf_tensor(m->gguf, name);
    if (t == NULL)
        return mdl_errf(err, errlen, RI_ERR_FORMAT, "model: tensor %s is missing", name);
    ri_status_t st = mdl_weight_from_tensor(t, w);
    if (st == RI_ERR_UNSUPPORTED)
        return mdl_errf(err, errlen, st, "model: tensor %s has type %s, which we do not support", name,
                        mdl_ggml_type_name(t->type));
    if (st != RI_OK || w->rows != rows || w->cols != cols)
        return mdl_errf(err, errlen, RI_ERR_FORMAT, "model: tensor %s is %llux%llu, expected %zux%zu", name,
                        (unsigned long long)t->ne[1], (unsigned long long)t->ne[0], rows, cols);
    return RI_OK;
}

/* A weight of the expected shape [rows][cols], counted in the model's bytes. */
static ri_status_t mdl_get_weight(mdl_model_t *m, const char *name, size_t rows, size_t cols, mdl_weight_t *w,
                                  char *err, size_t errlen)
{
    ri_status_t st = mdl_model_weight(m, name, rows, cols, w, err, errlen);
    if (st == RI_OK)
        m->weight_bytes += (uint64_t)w->rows * w->row_bytes;
    return st;
}

/* A 1-D weight expanded to fp32 (norm scales). */
static ri_status_t mdl_get_vector(mdl_model_t *m, const char *name, size_t n, float **out, char *err, size_t errlen)
{
    mdl_weight_t w;
    ri_status_t st = mdl_get_weight(m, name, 1, n, &w, err, errlen);
    if (st != RI_OK)
        return st;
    *out = cm_malloc(&mdl_model_tag, n * sizeof(float));
    if (*out == NULL)
        return RI_ERR_NOMEM;
    mdl_dequant_row_ref(&w, 0, *out);
    return RI_OK;
}

static ri_status_t mdl_get_u32(const mdl_gguf_t *g, const char *arch, const char *key, uint32_t *v, bool required,
                               char *err, size_t errlen)
{
    char full[160];
    uint64_t u;
    snprintf(full, sizeof(full), "%s.%s", arch, key);
    ri_status_t st = mdl_gguf_get_u64(g, full, &u);
    if (st == RI_ERR_NOT_FOUND && !required)
        return RI_OK;
    if (st != RI_OK || u == 0 || u > (1u << 24))
        return mdl_errf(err, errlen, RI_ERR_FORMAT, "model: metadata %s is %s", full,
                        st == RI_ERR_NOT_FOUND ? "missing" : "not a sane integer");
    *v = (uint32_t)u;
    return RI_OK;
}

/* Gemma 3's extras.  Defaults are those of the released models, for files
 * whose converter did not write the key (ours has no freq_base_swa and no
 * layer pattern): local RoPE base 10000, every sixth layer global. */
static ri_status_t mdl_hparams_gemma3(const mdl_gguf_t *g, const char *arch, mdl_hparams_t *hp, char *err,
                                      size_t errlen)
{
    char key[160];
    ri_status_t st;
    hp->rope_neox = hp->qk_norm = hp->post_norms = hp->geglu = true;
    hp->embd_scale = sqrtf((float)hp->n_embd);
    hp->rope_theta_swa = 10000.0f;
    hp->swa_period = 6;
    snprintf(key, sizeof(key), "%s.rope.freq_base_swa", arch);
    mdl_gguf_get_f32(g, key, &hp->rope_theta_swa);
    snprintf(key, sizeof(key), "%s.final_logit_softcapping", arch);
    mdl_gguf_get_f32(g, key, &hp->logit_softcap);
    if ((st = mdl_get_u32(g, arch, "attention.sliding_window", &hp->n_swa, false, err, errlen)) != RI_OK)
        return st;
    snprintf(key, sizeof(key), "%s.attention.sliding_window_pattern", arch);
    const mdl_gguf_kv_t *pat = mdl_gguf_find(g, key);
    if (pat != NULL && pat->type != MDL_GGUF_ARRAY) {   /* a period */
        uint64_t v;
        if (mdl_gguf_get_u64(g, key, &v) != RI_OK || v == 0 || v > hp->n_layers)
            return mdl_errf(err, errlen, RI_ERR_FORMAT, "model: bad %s", key);
        hp->swa_period = (uint32_t)v;
    }
    if (!(hp->rope_theta_swa > 0) || !(hp->logit_softcap >= 0))
        return mdl_errf(err, errlen, RI_ERR_FORMAT, "model: bad rope.freq_base_swa or final_logit_softcapping");
    return RI_OK;
}

/* Sliding window of each layer: from a per-layer array in the metadata
 * (true / non-zero = sliding) when there is one, else the period. */
static ri_status_t mdl_layer_windows(mdl_model_t *m, char *err, size_t errlen)
{
    const mdl_hparams_t *hp = &m->hp;
    const mdl_gguf_kv_t *pat = mdl_gguf_find(m->gguf, "gemma3.attention.sliding_window_pattern");
    bool from_array = hp->arch == MDL_ARCH_GEMMA3 && pat != NULL && pat->type == MDL_GGUF_ARRAY;
    if (from_array && (pat->arr_n != hp->n_layers || (pat->arr_type != MDL_GGUF_BOOL && pat->arr_type != MDL_GGUF_U8 &&
                                                      pat->arr_type != MDL_GGUF_I8)))
        return mdl_errf(err, errlen, RI_ERR_FORMAT, "model: sliding_window_pattern is not one flag per layer");
    for (uint32_t l = 0; l < hp->n_layers; l++) {
        bool swa = false;
        if (hp->n_swa > 0 && from_array)
            swa = ((const uint8_t *)pat->arr_data)[l] != 0;
        else if (hp->n_swa > 0)
            swa = (l + 1) % hp->swa_period != 0;
        m->layers[l].window = swa ? hp->n_swa : 0;
        m->layers[l].inv_freq = swa ? m->inv_freq_swa : m->inv_freq;
    }
    return RI_OK;
}

static ri_status_t mdl_model_hparams_load(mdl_model_t *m, char *err, size_t errlen)
{
    const mdl_gguf_t *g = m->gguf;
    mdl_hparams_t *hp = &m->hp;
    char *arch = NULL;
    ri_status_t st = mdl_gguf_get_str(g, "general.architecture", &arch);
    if (st != RI_OK)
        return mdl_errf(err, errlen, RI_ERR_FORMAT, "model: general.architecture is missing");
    if (strcmp(arch, "llama") == 0) {
        hp->arch = MDL_ARCH_LLAMA;
    } else if (strcmp(arch, "gemma3") == 0) {
        hp->arch = MDL_ARCH_GEMMA3;
    } else {
        st = mdl_errf(err, errlen, RI_ERR_UNSUPPORTED,
                      "model: architecture '%.64s' is not supported (llama and gemma3 only)", arch);
        cm_free(arch);
        return st;
    }
    hp->n_ctx = 2048;
    if ((st = mdl_get_u32(g, arch, "block_count", &hp->n_layers, true, err, errlen)) != RI_OK ||
        (st = mdl_get_u32(g, arch, "embedding_length", &hp->n_embd, true, err, errlen)) != RI_OK ||
        (st = mdl_get_u32(g, arch, "feed_forward_length", &hp->n_ff, true, err, errlen)) != RI_OK ||
        (st = mdl_get_u32(g, arch, "attention.head_count", &hp->n_heads, true, err, errlen)) != RI_OK ||
        (st = mdl_get_u32(g, arch, "context_length", &hp->n_ctx, false, err, errlen)) != RI_OK)
        goto out;
    hp->n_kv_heads = hp->n_heads;
    if ((st = mdl_get_u32(g, arch, "attention.head_count_kv", &hp->n_kv_heads, false, err, errlen)) != RI_OK)
        goto out;
    /* Gemma's heads are wider than n_embd / n_heads (256 vs 160): key_length says so */
    hp->head_dim = hp->n_embd / hp->n_heads;
    if ((st = mdl_get_u32(g, arch, "attention.key_length", &hp->head_dim, false, err, errlen)) != RI_OK)
        goto out;
    if ((hp->head_dim * hp->n_heads != hp->n_embd && hp->arch == MDL_ARCH_LLAMA) ||
        hp->n_heads % hp->n_kv_heads != 0 || hp->n_heads / hp->n_kv_heads > 16 || hp->n_layers > 1024) {
        st = mdl_errf(err, errlen, RI_ERR_FORMAT, "model: inconsistent head counts (%u heads, %u KV heads, %u dims)",
                      hp->n_heads, hp->n_kv_heads, hp->n_embd);
        goto out;
    }
    hp->n_rot = hp->head_dim;
    if ((st = mdl_get_u32(g, arch, "rope.dimension_count", &hp->n_rot, false, err, errlen)) != RI_OK)
        goto out;
    if (hp->n_rot > hp->head_dim || hp->n_rot % 2 != 0 || hp->head_dim > 512) {
        st = mdl_errf(err, errlen, RI_ERR_FORMAT, "model: rope.dimension_count %u does not fit head_dim %u",
                      hp->n_rot, hp->head_dim);
        goto out;
    }
    char key[160];
    hp->rope_theta = 10000.0f;
    hp->eps = 1e-5f;
    hp->rope_scale = 1.0f;
    snprintf(key, sizeof(key), "%s.rope.freq_base", arch);
    mdl_gguf_get_f32(g, key, &hp->rope_theta);
    snprintf(key, sizeof(key), "%s.attention.layer_norm_rms_epsilon", arch);
    mdl_gguf_get_f32(g, key, &hp->eps);
    snprintf(key, sizeof(key), "%s.rope.scaling.type", arch);
    const mdl_gguf_kv_t *sc = mdl_gguf_find(g, key);
    if (sc != NULL && sc->type == MDL_GGUF_STRING && !(sc->v.s.len == 4 && memcmp(sc->v.s.ptr, "none", 4) == 0)) {
        if (!(sc->v.s.len == 6 && memcmp(sc->v.s.ptr, "linear", 6) == 0)) {
            st = mdl_errf(err, errlen, RI_ERR_UNSUPPORTED, "model: rope scaling '%.*s' is not supported (linear only)",
                          (int)CM_MIN(sc->v.s.len, 32), sc->v.s.ptr);
            goto out;
        }
        snprintf(key, sizeof(key), "%s.rope.scaling.factor", arch);
        if (mdl_gguf_get_f32(g, key, &hp->rope_scale) != RI_OK || !(hp->rope_scale > 0))
            hp->rope_scale = 1.0f;
    }
    if (!(hp->rope_theta > 0) || !(hp->eps > 0)) {
        st = mdl_errf(err, errlen, RI_ERR_FORMAT, "model: bad rope.freq_base or norm epsilon");
        goto out;
    }
    hp->rope_theta_swa = hp->rope_theta;
    hp->embd_scale = 1.0f;
    st = hp->arch == MDL_ARCH_GEMMA3 ? mdl_hparams_gemma3(g, arch, hp, err, errlen) : RI_OK;
out:
    cm_free(arch);
    return st;
}

/* Block l's weights and norms, by the block tensor table (mdl_backend.h). */
static ri_status_t mdl_layer_load(mdl_model_t *m, uint32_t l, char *err, size_t errlen)
{
    const mdl_hparams_t *hp = &m->hp;
    mdl_layer_t *L = &m->layers[l];
    char n[96];
    ri_status_t st;
    for (int w = 0; w < MDL_W_N; w++) {
        const mdl_tensor_desc_t *d = &mdl_block_weights[w];
        mdl_block_tensor_name(l, d, n, sizeof(n));
        if ((st = mdl_get_weight(m, n, mdl_dim_size(hp, d->rows), mdl_dim_size(hp, d->cols), &L->w[w], err,
                                 errlen)) != RI_OK)
            return st;
    }
    for (int v = 0; v < MDL_N_N; v++) {
        if (!mdl_block_norm_used(hp, (mdl_nid_t)v))
            continue;
        mdl_block_tensor_name(l, &mdl_block_norms[v], n, sizeof(n));
        if ((st = mdl_get_vector(m, n, mdl_dim_size(hp, mdl_block_norms[v].cols), &L->norm[v], err, errlen)) !=
            RI_OK)
            return st;
    }
    return RI_OK;
}

ri_status_t mdl_model_load(const char *path, mdl_model_t **m_p, char *err, size_t errlen)
{
    ri_status_t st;
    mdl_model_t *m = cm_calloc(&mdl_model_tag, 1, sizeof(*m));
    if (m == NULL)
        return RI_ERR_NOMEM;
    m->chunk = 64;
    if ((st = mdl_gguf_open(path, &m->gguf, err, errlen)) != RI_OK)
        goto err_free_model;
    if ((st = mdl_model_hparams_load(m, err, errlen)) != RI_OK)
        goto err_free_model;
    if ((st = mdl_tok_create(m->gguf, &m->tok, err, errlen)) != RI_OK)
        goto err_free_model;
    mdl_hparams_t *hp = &m->hp;
    const mdl_gguf_tensor_t *te = mdl_gguf_tensor(m->gguf, "token_embd.weight");
    if (te == NULL) {
        st = mdl_errf(err, errlen, RI_ERR_FORMAT, "model: token_embd.weight is missing");
        goto err_free_model;
    }
    hp->n_vocab = (uint32_t)CM_MIN(te->ne[1], (uint64_t)UINT32_MAX);
    if (hp->n_vocab != mdl_tok_vocab(m->tok)) {
        st = mdl_errf(err, errlen, RI_ERR_FORMAT, "model: embedding has %u rows but the vocabulary %zu tokens",
                      hp->n_vocab, mdl_tok_vocab(m->tok));
        goto err_free_model;
    }
    if ((st = mdl_get_weight(m, "token_embd.weight", hp->n_vocab, hp->n_embd, &m->embd, err, errlen)) != RI_OK)
        goto err_free_model;
    m->weight_bytes = 0;   /* decode reads one embedding row, not the table */
    if (mdl_gguf_tensor(m->gguf, "output.weight") != NULL)
        st = mdl_get_weight(m, "output.weight", hp->n_vocab, hp->n_embd, &m->output, err, errlen);
    else
        st = mdl_get_weight(m, "token_embd.weight", hp->n_vocab, hp->n_embd, &m->output, err, errlen);
    if (st != RI_OK)
        goto err_free_model;
    if ((st = mdl_get_vector(m, "output_norm.weight", hp->n_embd, &m->output_norm, err, errlen)) != RI_OK)
        goto err_free_model;
    m->layers = cm_calloc(&mdl_model_tag, hp->n_layers, sizeof(*m->layers));
    m->inv_freq = cm_calloc(&mdl_model_tag, hp->n_rot / 2 + 1, sizeof(double));
    m->inv_freq_swa = cm_calloc(&mdl_model_tag, hp->n_rot / 2 + 1, sizeof(double));
    if (m->layers == NULL || m->inv_freq == NULL || m->inv_freq_swa == NULL) {
        st = RI_ERR_NOMEM;
        goto err_free_model;
    }
    for (uint32_t l = 0; l < hp->n_layers; l++)
        if ((st = mdl_layer_load(m, l, err, errlen)) != RI_OK)
            goto err_free_model;
    for (uint32_t i = 0; i < hp->n_rot / 2; i++) {
        m->inv_freq[i] = pow((double)hp->rope_theta, -2.0 * i / hp->n_rot);
        m->inv_freq_swa[i] = pow((double)hp->rope_theta_swa, -2.0 * i / hp->n_rot);
    }
    if ((st = mdl_layer_windows(m, err, errlen)) != RI_OK)
        goto err_free_model;
    const mdl_gguf_kv_t *nm = mdl_gguf_find(m->gguf, "general.name");
    if (nm != NULL && nm->type == MDL_GGUF_STRING)
        snprintf(m->name, sizeof(m->name), "%.*s", (int)CM_MIN(nm->v.s.len, 127), nm->v.s.ptr);
    else
        snprintf(m->name, sizeof(m->name), "%s", strrchr(path, '/') ? strrchr(path, '/') + 1 : path);
    *m_p = m;
    return RI_OK;

err_free_model:
    if (err != NULL && errlen > 0 && err[0] == '\0')
        snprintf(err, errlen, "model: %s", ri_status_str(st));
    mdl_model_destroy(m);
    return st;
}

void mdl_model_destroy(mdl_model_t *m)
{
    if (m == NULL)
        return;
    if (m->layers != NULL)
        for (uint32_t l = 0; l < m->hp.n_layers; l++)
            for (int v = 0; v < MDL_N_N; v++)
                cm_free(m->layers[l].norm[v]);
    cm_free(m->layers);
    cm_free(m->output_norm);
    cm_free(m->inv_freq);
    cm_free(m->inv_freq_swa);
    mdl_tok_destroy(m->tok);
    mdl_gguf_close(m->gguf);
    cm_free(m);
}

const mdl_hparams_t *mdl_model_hparams(const mdl_model_t *m)
{
    return &m->hp;
}

const mdl_tok_t *mdl_model_tok(const mdl_model_t *m)
{
    return m->tok;
}

const mdl_gguf_t *mdl_model_gguf(const mdl_model_t *m)
{
    return m->gguf;
}

const char *mdl_model_name(const mdl_model_t *m)
{
    return m->name;
}

uint32_t mdl_model_layer_window(const mdl_model_t *m, uint32_t l)
{
    return l < m->hp.n_layers ? m->layers[l].window : 0;
}

uint64_t mdl_model_weight_bytes(const mdl_model_t *m)
{
    return m->weight_bytes;
}

void mdl_model_set_chunk(mdl_model_t *m, size_t chunk)
{
    m->chunk = chunk > 0 ? chunk : 64;
}

/* ---- sequences ---- */

ri_status_t mdl_seq_create(mdl_model_t *m, const mdl_attn_ops_t *attn, const mdl_attn_cfg_t *cfg, size_t cap,
                           mdl_seq_t **s_p)
{
    if (attn == NULL || cap == 0)
        return RI_ERR_INVALID;
    mdl_seq_t *s = cm_calloc(&mdl_model_tag, 1, sizeof(*s));
    if (s == NULL)
        return RI_ERR_NOMEM;
    s->model = m;
    s->attn = attn;
    if (cfg != NULL)
        s->cfg = *cfg;
    else
        mdl_attn_cfg_default(&s->cfg);
    mdl_attn_geom_t g = {.n_layers = m->hp.n_layers, .n_heads = m->hp.n_heads, .n_kv_heads = m->hp.n_kv_heads,
                         .head_dim = m->hp.head_dim};
    ri_status_t st = mdl_kv_create(&g, cap, attn->token_major_kv ? MDL_KV_TOKEN_MAJOR : MDL_KV_HEAD_MAJOR, &s->kv);
    if (st != RI_OK)
        goto err_free_seq;
    st = attn->create(&s->cfg, s->kv, &s->attn_state);
    if (st != RI_OK)
        goto err_free_seq;
    *s_p = s;
    return RI_OK;

err_free_seq:
    mdl_kv_destroy(s->kv);
    cm_free(s);
    return st;
}

void mdl_seq_destroy(mdl_seq_t *s)
{
    if (s == NULL)
        return;
    if (s->attn_state != NULL)
        s->attn->destroy(s->attn_state);
    mdl_kv_destroy(s->kv);
    cm_free(s);
}

ri_status_t mdl_seq_fork(const mdl_seq_t *s, const mdl_attn_ops_t *attn, const mdl_attn_cfg_t *cfg,
                         mdl_seq_t **fork_p)
{
    mdl_seq_t *f;
    ri_status_t st = mdl_seq_create(s->model, attn, cfg, s->kv->cap, &f);
    if (st != RI_OK)
        return st;
    if ((st = mdl_kv_copy(f->kv, s->kv, s->kv->len)) != RI_OK) {
        mdl_seq_destroy(f);
        return st;
    }
    *fork_p = f;
    return RI_OK;
}

ri_status_t mdl_seq_preload(mdl_seq_t *s, size_t n,
                            ri_status_t (*fill)(void *arg, uint32_t layer, uint32_t kv_head, size_t pos0, size_t n,
                                                cm_fp16_t *k, cm_fp16_t *v, size_t token_stride),
                            void *arg)
{
    if (s == NULL || fill == NULL || n == 0 || s->decoding || s->kv->len != 0)
        return RI_ERR_INVALID;
    if (n > s->kv->cap)
        return RI_ERR_RANGE;
    const mdl_attn_geom_t *g = &s->kv->geom;
    for (uint32_t l = 0; l < g->n_layers; l++)
        for (uint32_t h = 0; h < g->n_kv_heads; h++) {
            ri_status_t st = fill(arg, l, h, 0, n, mdl_kv_krow(s->kv, l, h, 0), mdl_kv_vrow(s->kv, l, h, 0),
                                  s->kv->token_stride);
            if (st != RI_OK)
                return st;  /* len stays 0: what was written is never read */
        }
    s->kv->len = n;
    return RI_OK;
}

const kn_index_t *mdl_seq_wave_index(const mdl_seq_t *s, uint32_t layer, uint32_t kv_head)
{
    if (s == NULL || s->attn->index == NULL || layer >= s->kv->geom.n_layers || kv_head >= s->kv->geom.n_kv_heads)
        return NULL;
    return s->attn->index(s->attn_state, layer, kv_head);
}

size_t mdl_seq_len(const mdl_seq_t *s)
{
    return s->kv->len;
}

size_t mdl_seq_cap(const mdl_seq_t *s)
{
    return s->kv->cap;
}

const mdl_kv_t *mdl_seq_kv(const mdl_seq_t *s)
{
    return s->kv;
}

void mdl_seq_attn_stats(const mdl_seq_t *s, mdl_attn_stats_t *st_p)
{
    memset(st_p, 0, sizeof(*st_p));
    if (s->attn->stats != NULL)
        s->attn->stats(s->attn_state, st_p);
}

void mdl_seq_set_qhook(mdl_seq_t *s, mdl_qhook_fn_t fn, void *arg)
{
    s->qhook = fn;
    s->qhook_arg = arg;
}

/* ---- forward ---- */

/* Activations of R rows. */
typedef struct mdl_act {
    float *x, *xb, *q, *k, *v, *att, *g, *u;
    float *rope[2];   /* [rows][n_rot/2][cos, sin] of each row's position: global, sliding-window bases */
} mdl_act_t;

static void mdl_act_free(mdl_act_t *a)
{
    cm_free(a->x);
    cm_free(a->xb);
    cm_free(a->q);
    cm_free(a->k);
    cm_free(a->v);
    cm_free(a->att);
    cm_free(a->g);
    cm_free(a->u);
    cm_free(a->rope[0]);
    cm_free(a->rope[1]);
}

static ri_status_t mdl_act_alloc(const mdl_hparams_t *hp, size_t r, mdl_act_t *a)
{
    size_t qd = (size_t)hp->n_heads * hp->head_dim, kvd = (size_t)hp->n_kv_heads * hp->head_dim;
    memset(a, 0, sizeof(*a));
    a->x = cm_malloc_aligned(&mdl_act_tag, r * hp->n_embd * sizeof(float), 64);
    a->xb = cm_malloc_aligned(&mdl_act_tag, r * CM_MAX(hp->n_embd, qd) * sizeof(float), 64);
    a->q = cm_malloc_aligned(&mdl_act_tag, r * qd * sizeof(float), 64);
    a->k = cm_malloc_aligned(&mdl_act_tag, r * kvd * sizeof(float), 64);
    a->v = cm_malloc_aligned(&mdl_act_tag, r * kvd * sizeof(float), 64);
    a->att = cm_malloc_aligned(&mdl_act_tag, r * qd * sizeof(float), 64);
    a->g = cm_malloc_aligned(&mdl_act_tag, r * hp->n_ff * sizeof(float), 64);
    a->u = cm_malloc_aligned(&mdl_act_tag, r * hp->n_ff * sizeof(float), 64);
    a->rope[0] = cm_malloc(&mdl_act_tag, r * hp->n_rot * sizeof(float));
    a->rope[1] = cm_malloc(&mdl_act_tag, r * hp->n_rot * sizeof(float));
    if (!a->x || !a->xb || !a->q || !a->k || !a->v || !a->att || !a->g || !a->u || !a->rope[0] || !a->rope[1]) {
        mdl_act_free(a);
        return RI_ERR_NOMEM;
    }
    return RI_OK;
}

/* cos and sin of pos * inv_freq[i] for i < n_rot/2 into cs[2i], cs[2i+1]:
 * once per row and forward pass, shared by Q and K of every layer with
 * these frequencies (sincos per layer was 2% of a prefill). */
static void mdl_rope_table(const mdl_model_t *m, const double *inv_freq, size_t pos, float *cs)
{
    double p = (double)pos / m->hp.rope_scale;
    for (uint32_t i = 0; i < m->hp.n_rot / 2; i++) {
        double a = p * inv_freq[i];
        cs[2 * i] = (float)cos(a);
        cs[2 * i + 1] = (float)sin(a);
    }
}

void mdl_model_rope_angles(const mdl_model_t *m, bool swa, size_t pos, float *cs)
{
    mdl_rope_table(m, swa ? m->inv_freq_swa : m->inv_freq, pos, cs);
}

/* Rotate each head's pairs by the angles of cs (mdl_rope_table): adjacent
 * pairs (2i, 2i+1) for llama (the layout its GGUF tensors have),
 * (i, i + n_rot/2) for NEOX models (Gemma), whose GGUF rows are not
 * permuted. */
static void mdl_rope(const mdl_model_t *m, const float *cs, float *x, uint32_t n_heads)
{
    const mdl_hparams_t *hp = &m->hp;
    uint32_t half = hp->n_rot / 2;
    for (uint32_t i = 0; i < half; i++) {
        float c = cs[2 * i], s = cs[2 * i + 1];
        uint32_t i0 = hp->rope_neox ? i : 2 * i, i1 = hp->rope_neox ? i + half : 2 * i + 1;
        for (uint32_t h = 0; h < n_heads; h++) {
            float *e = x + (size_t)h * hp->head_dim;
            float x0 = e[i0], x1 = e[i1];
            e[i0] = x0 * c - x1 * s;
            e[i1] = x0 * s + x1 * c;
        }
    }
}

/* RMS norm of each of n_heads heads of x in place (Gemma's QK norm). */
static void mdl_head_norm(const mdl_hparams_t *hp, float *x, uint32_t n_heads, const float *w)
{
    for (uint32_t h = 0; h < n_heads; h++)
        mdl_vec_rmsnorm(x + (size_t)h * hp->head_dim, x + (size_t)h * hp->head_dim, w, hp->head_dim, hp->eps);
}

/* Rows: prefill = one sequence, positions pos0.. ; decode = seqs[r] at its length. */
typedef struct mdl_rows {
    size_t n;                    /* rows */
    const int32_t *tokens;       /* [n] */
    mdl_seq_t *const *seqs;      /* decode: [n]; prefill: seqs[0] */
    size_t pos0;                 /* prefill: first position */
    bool prefill;                /* which */
} mdl_rows_t;

static size_t mdl_row_pos(const mdl_rows_t *rw, size_t r)
{
    return rw->prefill ? rw->pos0 + r : rw->seqs[r]->kv->len;
}


/* Q/K norm and RoPE of every row; decode rows store their K/V here, a
 * prefill chunk stores its rows at once. */
static void mdl_qk_prepare(mdl_model_t *m, const mdl_rows_t *rw, uint32_t l, mdl_act_t *a)
{
    const mdl_hparams_t *hp = &m->hp;
    const mdl_layer_t *L = &m->layers[l];
    size_t qd = (size_t)hp->n_heads * hp->head_dim, kvd = (size_t)hp->n_kv_heads * hp->head_dim;
    for (size_t r = 0; r < rw->n; r++) {
        size_t pos = mdl_row_pos(rw, r);
        if (L->norm[MDL_N_Q] != NULL) {
            mdl_head_norm(hp, a->q + r * qd, hp->n_heads, L->norm[MDL_N_Q]);
            mdl_head_norm(hp, a->k + r * kvd, hp->n_kv_heads, L->norm[MDL_N_K]);
        }
        const float *cs = a->rope[L->inv_freq == m->inv_freq ? 0 : 1] + r * hp->n_rot;
        mdl_rope(m, cs, a->q + r * qd, hp->n_heads);
        mdl_rope(m, cs, a->k + r * kvd, hp->n_kv_heads);
        if (!rw->prefill)
            mdl_kv_store(rw->seqs[r]->kv, l, pos, 1, a->k + r * kvd, a->v + r * kvd);
    }
    if (rw->prefill)
        mdl_kv_store(rw->seqs[0]->kv, l, rw->pos0, rw->n, a->k, a->v);
}

/* Decode rows of a sliding-window layer: each row exactly over its window
 * (positions (pos - win, pos]).  With the kernels, every row of the batch
 * in one split-K call (kn_attn_decode over views of the windows), so that
 * a window of a few hundred tokens and one KV head still spreads over the
 * pool's threads; the model's own exact attention takes one thread per
 * (KV head, row) there. */
static ri_status_t mdl_attention_window(const mdl_rows_t *rw, uint32_t l, uint32_t win, mdl_act_t *a)
{
    const mdl_attn_geom_t *g = &rw->seqs[0]->kv->geom;
    size_t qd = (size_t)g->n_heads * g->head_dim;
    for (size_t r = 0; r < rw->n; r++)
        if (rw->seqs[r]->qhook != NULL)
            rw->seqs[r]->qhook(rw->seqs[r]->qhook_arg, l, mdl_row_pos(rw, r), a->q + r * qd);
#ifdef MDL_HAVE_KERNELS
    enum { CHUNK = 16 };   /* rows per call (views on the stack) */
    kn_kv_view_t views[CHUNK];
    kn_shape_t shape = {.n_q_heads = g->n_heads, .n_kv_heads = g->n_kv_heads, .head_dim = g->head_dim};
    ri_status_t st = RI_OK;
    for (size_t r0 = 0; r0 < rw->n && st == RI_OK; r0 += CHUNK) {
        size_t nr = CM_MIN((size_t)CHUNK, rw->n - r0);
        for (size_t i = 0; i < nr; i++) {
            const mdl_kv_t *kv = rw->seqs[r0 + i]->kv;
            size_t pos = mdl_row_pos(rw, r0 + i), first = pos >= win ? pos + 1 - win : 0;
            views[i] = mdl_kv_view(kv, l, first, pos + 1 - first);
        }
        st = kn_attn_decode(NULL, &shape, nr, a->q + r0 * qd, views, a->att + r0 * qd, NULL);
    }
    return st;
#else
    ri_status_t st = RI_OK;
    for (size_t r = 0; r < rw->n && st == RI_OK; r++)
        st = mdl_attn_exact_win(cm_pool_default(), rw->seqs[r]->kv, l, mdl_row_pos(rw, r), 1, win, a->q + r * qd,
                                a->att + r * qd);
    return st;
#endif
}

/* Attention of layer l for every row into a->att.  A sliding-window layer
 * attends exactly over its window here (whatever the backend: its context
 * never grows past the window, so there is nothing to make sparse); a global
 * layer goes through the sequence's backend. */
static ri_status_t mdl_attention(mdl_model_t *m, const mdl_rows_t *rw, uint32_t l, mdl_act_t *a)
{
    const mdl_hparams_t *hp = &m->hp;
    uint32_t win = m->layers[l].window;
    size_t qd = (size_t)hp->n_heads * hp->head_dim;
    ri_status_t st = RI_OK;
    mdl_qk_prepare(m, rw, l, a);
    if (rw->prefill) {
        mdl_seq_t *s = rw->seqs[0];
        if (win > 0)
            return mdl_attn_exact_win(cm_pool_default(), s->kv, l, rw->pos0, rw->n, win, a->q, a->att);
        return s->attn->prefill(s->attn_state, l, rw->pos0, rw->n, a->q, a->att);
    }
    if (win > 0)
        return mdl_attention_window(rw, l, win, a);
    for (size_t r = 0; r < rw->n && st == RI_OK; r++) {
        mdl_seq_t *s = rw->seqs[r];
        size_t pos = mdl_row_pos(rw, r);
        if (s->qhook != NULL)
            s->qhook(s->qhook_arg, l, pos, a->q + r * qd);
        st = s->attn->decode(s->attn_state, l, pos, a->q + r * qd, a->att + r * qd);
    }
    return st;
}

/* x += out (a->xb), after Gemma's post-norm when there is one. */
static void mdl_residual(const mdl_hparams_t *hp, mdl_act_t *a, size_t R, const float *post_norm)
{
    size_t E = hp->n_embd;
    if (post_norm != NULL)
        for (size_t r = 0; r < R; r++)
            mdl_vec_rmsnorm(a->xb + r * E, a->xb + r * E, post_norm, E, hp->eps);
    for (size_t i = 0; i < R * E; i++)
        a->x[i] += a->xb[i];
}

void mdl_model_profile(mdl_model_t *m, bool on)
{
    memset(&m->prof, 0, sizeof(m->prof));
    m->prof_on = on;
}

void mdl_model_profile_get(const mdl_model_t *m, mdl_profile_t *p)
{
    *p = m->prof;
}

const char *mdl_op_name(mdl_op_t op)
{
    static const char *const names[MDL_OP_N] = {"embed", "norms", "qkv", "attention", "attn_out",
                                                "gate_up", "glu", "down", "head"};
    return (unsigned)op < MDL_OP_N ? names[op] : "?";
}

/* ---- the CPU backend (mdl_backend.h): the model's quantised weights in
 * its mapping, fp32 activations, the pool's threads ---- */

typedef struct mdl_cpu_ctx {
    mdl_model_t *m;
    const mdl_rows_t *rw;
    mdl_act_t *a;
    cm_pool_t *pool;
} mdl_cpu_ctx_t;

static float *mdl_cpu_buf(mdl_act_t *a, mdl_buf_t b)
{
    float *const bufs[MDL_BUF_N] = {[MDL_BUF_X] = a->x,     [MDL_BUF_XB] = a->xb, [MDL_BUF_Q] = a->q,
                                    [MDL_BUF_K] = a->k,     [MDL_BUF_V] = a->v,   [MDL_BUF_ATT] = a->att,
                                    [MDL_BUF_G] = a->g,     [MDL_BUF_U] = a->u};
    return bufs[b];
}

static ri_status_t mdl_cpu_embed(void *ctx)
{
    mdl_cpu_ctx_t *c = ctx;
    const mdl_model_t *m = c->m;
    const mdl_hparams_t *hp = &m->hp;
    mdl_act_t *a = c->a;
    size_t E = hp->n_embd;
    for (size_t r = 0; r < c->rw->n; r++) {
        mdl_rope_table(m, m->inv_freq, mdl_row_pos(c->rw, r), a->rope[0] + r * hp->n_rot);
        if (hp->n_swa > 0)
            mdl_rope_table(m, m->inv_freq_swa, mdl_row_pos(c->rw, r), a->rope[1] + r * hp->n_rot);
        mdl_dequant_row(&m->embd, (size_t)c->rw->tokens[r], a->x + r * E);
        if (hp->embd_scale != 1.0f)
            mdl_vec_scale(a->x + r * E, hp->embd_scale, E);
    }
    return RI_OK;
}

static void mdl_cpu_rmsnorm(void *ctx, uint32_t l, mdl_nid_t which, mdl_buf_t dst, mdl_buf_t src)
{
    mdl_cpu_ctx_t *c = ctx;
    const mdl_hparams_t *hp = &c->m->hp;
    size_t E = hp->n_embd;
    float *out = mdl_cpu_buf(c->a, dst), *in = mdl_cpu_buf(c->a, src);
    const float *w = c->m->layers[l].norm[which];
    for (size_t r = 0; r < c->rw->n; r++)
        mdl_vec_rmsnorm(out + r * E, in + r * E, w, E, hp->eps);
}

static ri_status_t mdl_cpu_matmul(void *ctx, uint32_t l, const mdl_wid_t *w, size_t nw, mdl_buf_t in,
                                  const mdl_buf_t *out)
{
    mdl_cpu_ctx_t *c = ctx;
    const mdl_layer_t *L = &c->m->layers[l];
    const mdl_weight_t *ws[MDL_W_N];
    float *outs[MDL_W_N];
    if (nw == 1)
        return mdl_matmul(c->pool, &L->w[w[0]], mdl_cpu_buf(c->a, in), c->rw->n, mdl_cpu_buf(c->a, out[0]));
    if (nw == 0 || nw > MDL_W_N)
        return RI_ERR_INVALID;
    for (size_t i = 0; i < nw; i++) {
        ws[i] = &L->w[w[i]];
        outs[i] = mdl_cpu_buf(c->a, out[i]);
    }
    return mdl_matmul_multi(c->pool, ws, nw, mdl_cpu_buf(c->a, in), c->rw->n, outs);
}

static ri_status_t mdl_cpu_attention(void *ctx, uint32_t l)
{
    mdl_cpu_ctx_t *c = ctx;
    return mdl_attention(c->m, c->rw, l, c->a);
}

static void mdl_cpu_residual(void *ctx, uint32_t l, mdl_nid_t post)
{
    mdl_cpu_ctx_t *c = ctx;
    mdl_residual(&c->m->hp, c->a, c->rw->n, c->m->layers[l].norm[post]);
}

static void mdl_cpu_glu(void *ctx)
{
    mdl_cpu_ctx_t *c = ctx;
    const mdl_hparams_t *hp = &c->m->hp;
    if (hp->geglu)
        mdl_vec_geglu(c->a->g, c->a->u, c->rw->n * hp->n_ff);
    else
        mdl_vec_swiglu(c->a->g, c->a->u, c->rw->n * hp->n_ff);
}

/* The output head only for the rows that want logits, packed. */
static ri_status_t mdl_cpu_logits(void *ctx, const bool *want, float *logits)
{
    mdl_cpu_ctx_t *c = ctx;
    const mdl_model_t *m = c->m;
    const mdl_hparams_t *hp = &m->hp;
    mdl_act_t *a = c->a;
    size_t E = hp->n_embd, nw = 0;
    ri_status_t st = RI_OK;
    for (size_t r = 0; r < c->rw->n; r++)
        if (want[r])
            mdl_vec_rmsnorm(a->xb + (nw++) * E, a->x + r * E, m->output_norm, E, hp->eps);
    if (nw > 0 && logits != NULL)
        st = mdl_matmul(c->pool, &m->output, a->xb, nw, logits);
    if (st == RI_OK && logits != NULL && hp->logit_softcap > 0)
        for (size_t i = 0; i < nw * hp->n_vocab; i++)
            logits[i] = hp->logit_softcap * tanhf(logits[i] / hp->logit_softcap);
    return st;
}

static const mdl_backend_ops_t mdl_backend_cpu = {
    .name = "cpu",
    .embed = mdl_cpu_embed,
    .rmsnorm = mdl_cpu_rmsnorm,
    .matmul = mdl_cpu_matmul,
    .attention = mdl_cpu_attention,
    .residual = mdl_cpu_residual,
    .glu = mdl_cpu_glu,
    .logits = mdl_cpu_logits,
};

/* Run rows through all layers on the CPU backend; logits for rows with
 * want[r] into logits (packed). */
static ri_status_t mdl_forward(mdl_model_t *m, const mdl_rows_t *rw, mdl_act_t *a, const bool *want, float *logits)
{
    mdl_cpu_ctx_t c = {.m = m, .rw = rw, .a = a, .pool = cm_pool_default()};
    return mdl_forward_run(&mdl_backend_cpu, &c, m->hp.n_layers, m->prof_on ? &m->prof : NULL, want, logits);
}

static bool mdl_tokens_ok(const mdl_model_t *m, const int32_t *t, size_t n)
{
    for (size_t i = 0; i < n; i++)
        if (t[i] < 0 || (uint32_t)t[i] >= m->hp.n_vocab)
            return false;
    return true;
}

ri_status_t mdl_prefill(mdl_model_t *m, mdl_seq_t *s, const int32_t *tokens, size_t n, float *logits_last,
                        float *logits_all, mdl_progress_fn_t progress, void *progress_arg)
{
    if (s->decoding || !mdl_tokens_ok(m, tokens, n))
        return RI_ERR_INVALID;
    if (n > s->kv->cap - s->kv->len)
        return RI_ERR_RANGE;
    if (n == 0)
        return RI_OK;
    size_t chunk = CM_MIN(m->chunk, n);
    mdl_act_t a;
    ri_status_t st = mdl_act_alloc(&m->hp, chunk, &a);
    if (st != RI_OK)
        return st;
    bool *want = cm_calloc(&mdl_act_tag, chunk, sizeof(bool));
    float *lg = NULL;
    if (want == NULL) {
        st = RI_ERR_NOMEM;
        goto out;
    }
    if (logits_all == NULL && logits_last != NULL) {
        lg = cm_malloc(&mdl_act_tag, (size_t)m->hp.n_vocab * sizeof(float));
        if (lg == NULL) {
            st = RI_ERR_NOMEM;
            goto out;
        }
    }
    mdl_seq_t *seqs[1] = {s};
    for (size_t done = 0; done < n && st == RI_OK; done += chunk) {
        size_t c = CM_MIN(chunk, n - done);
        mdl_rows_t rw = {.n = c, .tokens = tokens + done, .seqs = seqs, .pos0 = s->kv->len, .prefill = true};
        bool last = done + c == n;
        float *out = NULL;
        for (size_t r = 0; r < c; r++)
            want[r] = logits_all != NULL || (last && r == c - 1 && logits_last != NULL);
        if (logits_all != NULL)
            out = logits_all + done * m->hp.n_vocab;
        else if (last)
            out = lg;
        st = mdl_forward(m, &rw, &a, want, out);
        if (st == RI_OK) {
            s->kv->len += c;
            if (progress != NULL)
                progress(progress_arg, done + c, n);
        }
    }
    if (st == RI_OK && logits_last != NULL)
        memcpy(logits_last, logits_all != NULL ? logits_all + (n - 1) * m->hp.n_vocab : lg,
               (size_t)m->hp.n_vocab * sizeof(float));
out:
    cm_free(lg);
    cm_free(want);
    mdl_act_free(&a);
    return st;
}

#define MDL_RELEASE_STEP 256 /* tokens given back at a time: few madvise calls */

/* With cfg.release_window, give back each sliding-window layer's K/V that
 * no later query reads: a query at position p reads (p - window, p], and the
 * next one is at len, so tokens before len - window are done with.  The
 * global layers are the backend's (the remote one gives back what the
 * kvstore holds). */
static void mdl_release_windows(mdl_model_t *m, mdl_seq_t *s)
{
    uint32_t win = 0;
    if (!s->cfg.release_window)
        return;
    for (uint32_t l = 0; l < m->hp.n_layers; l++)
        win = CM_MAX(win, m->layers[l].window);
    if (win == 0 || s->kv->len < (size_t)win + s->win_released + MDL_RELEASE_STEP)
        return;
    size_t to = s->kv->len - win, from = s->win_released / MDL_RELEASE_STEP * MDL_RELEASE_STEP;
    for (uint32_t l = 0; l < m->hp.n_layers; l++)
        if (m->layers[l].window > 0)
            (void)mdl_kv_release(s->kv, l, from, to); /* from a step boundary: the page the last call left */
    s->win_released = to;
}

void mdl_seq_set_release_window(mdl_seq_t *s, bool on)
{
    if (s != NULL)
        s->cfg.release_window = on;
}

ri_status_t mdl_seq_build(mdl_model_t *m, mdl_seq_t *s)
{
    ri_status_t st;
    if (m == NULL || s == NULL || s->model != m)
        return RI_ERR_INVALID;
    if (s->decoding)
        return RI_OK; /* built already */
    /* the sliding-window layers keep no index: the backend reads their window */
    for (uint32_t l = 0; l < m->hp.n_layers; l++)
        if (m->layers[l].window == 0 && s->attn->prefill_end != NULL &&
            (st = s->attn->prefill_end(s->attn_state, l)) != RI_OK)
            return st;
    s->decoding = true;
    return RI_OK;
}

ri_status_t mdl_decode(mdl_model_t *m, mdl_seq_t *const *seqs, const int32_t *tokens, size_t n_seqs, float *logits)
{
    if (n_seqs == 0 || !mdl_tokens_ok(m, tokens, n_seqs))
        return RI_ERR_INVALID;
    for (size_t b = 0; b < n_seqs; b++) {
        if (seqs[b]->kv->len >= seqs[b]->kv->cap)
            return RI_ERR_RANGE;
        for (size_t c = 0; c < b; c++)
            if (seqs[c] == seqs[b])
                return RI_ERR_INVALID;
    }
    ri_status_t st;
    for (size_t b = 0; b < n_seqs; b++)
        if ((st = mdl_seq_build(m, seqs[b])) != RI_OK)
            return st;
    mdl_act_t a;
    if ((st = mdl_act_alloc(&m->hp, n_seqs, &a)) != RI_OK)
        return st;
    bool want[64];
    bool *wp = n_seqs <= 64 ? want : cm_malloc(&mdl_act_tag, n_seqs * sizeof(bool));
    if (wp == NULL) {
        mdl_act_free(&a);
        return RI_ERR_NOMEM;
    }
    for (size_t b = 0; b < n_seqs; b++)
        wp[b] = true;
    mdl_rows_t rw = {.n = n_seqs, .tokens = tokens, .seqs = seqs, .prefill = false};
    st = mdl_forward(m, &rw, &a, wp, logits);
    if (m->prof_on)
        m->prof.steps++;
    if (st == RI_OK)
        for (size_t b = 0; b < n_seqs; b++) {
            seqs[b]->kv->len++;
            mdl_release_windows(m, seqs[b]);
        }
    if (wp != want)
        cm_free(wp);
    mdl_act_free(&a);
    return st;
}
