/*
 * The built-in attention backends (see mdl_attn.h).  They adapt the model's
 * per-sequence K/V cache (fp16, one array per layer, mdl_kv_view) to kernels/
 * views and call its ops: flash decode for "full", the wave index and
 * tripartite decode for "retroinfer", page min/max for "quest", sinks +
 * window for "streaming", exact top-B for "oracle".  Every backend prefills
 * with the model's exact causal attention.  Without kernels/ in the build
 * only "full" exists, on the model's own exact attention.
 */
#include <math.h>
#include <string.h>

#include "common/cm_alloc.h"
#include "common/cm_log.h"
#include "common/cm_status.h"
#include "common/cm_time.h"
#include "gpuworker/model/mdl_attn.h"

#ifdef MDL_HAVE_KERNELS
#include "kernels/kn_baselines.h"
#include "kernels/kn_ops.h"
#include "kernels/kn_wave.h"
#endif

/* Quest's first layers decode densely, as in its paper (Tang et al., 2024). */
#define MDL_QUEST_DENSE_LAYERS 2u

static CM_ALLOC_TAG(mdl_be_tag, "model.attn.backend");

size_t mdl_attn_builtin(const mdl_attn_ops_t *const **ops_p);

typedef enum mdl_be_kind { MDL_BE_FULL, MDL_BE_RETRO, MDL_BE_QUEST, MDL_BE_STREAM, MDL_BE_ORACLE } mdl_be_kind_t;

/* One object per sequence; per-layer method state where the method has any. */
typedef struct mdl_be {
    mdl_be_kind_t kind;      /* method */
    mdl_attn_cfg_t cfg;      /* settings */
    mdl_kv_t *kv;            /* borrowed cache */
    mdl_attn_stats_t st;     /* statistics */
#ifdef MDL_HAVE_KERNELS
    kn_shape_t shape;        /* layer geometry */
    kn_wave_t **wave;        /* [n_layers] retroinfer */
    kn_quest_t **quest;      /* [n_layers] quest */
#endif
} mdl_be_t;

static void mdl_be_destroy(void *state);

static ri_status_t mdl_be_create(mdl_be_kind_t kind, const mdl_attn_cfg_t *cfg, mdl_kv_t *kv, void **state_p)
{
    mdl_be_t *b = cm_calloc(&mdl_be_tag, 1, sizeof(*b));
    if (b == NULL)
        return RI_ERR_NOMEM;
    b->kind = kind;
    b->cfg = *cfg;
    b->kv = kv;
    ri_status_t st = RI_OK;
#ifdef MDL_HAVE_KERNELS
    const mdl_attn_geom_t *g = &kv->geom;
    b->shape = (kn_shape_t){.n_q_heads = g->n_heads, .n_kv_heads = g->n_kv_heads, .head_dim = g->head_dim};
    if (kind == MDL_BE_RETRO) {
        b->wave = cm_calloc(&mdl_be_tag, g->n_layers, sizeof(*b->wave));
        if (b->wave == NULL)
            st = RI_ERR_NOMEM;
        for (uint32_t l = 0; st == RI_OK && l < g->n_layers; l++)
            st = kn_wave_create(&b->shape, &cfg->wave, &b->wave[l]);
    } else if (kind == MDL_BE_QUEST) {
        b->quest = cm_calloc(&mdl_be_tag, g->n_layers, sizeof(*b->quest));
        if (b->quest == NULL)
            st = RI_ERR_NOMEM;
        for (uint32_t l = 0; st == RI_OK && l < g->n_layers; l++)
            st = kn_quest_create(&b->shape, 16, &b->quest[l]);
    }
#endif
    if (st != RI_OK) {
        mdl_be_destroy(b);   /* frees the layers created so far */
        return st;
    }
    *state_p = b;
    return RI_OK;
}

static void mdl_be_destroy(void *state)
{
    mdl_be_t *b = state;
    if (b == NULL)
        return;
#ifdef MDL_HAVE_KERNELS
    for (uint32_t l = 0; l < b->kv->geom.n_layers; l++) {
        if (b->wave != NULL)
            kn_wave_destroy(b->wave[l]);
        if (b->quest != NULL)
            kn_quest_destroy(b->quest[l]);
    }
    cm_free(b->wave);
    cm_free(b->quest);
#endif
    cm_free(b);
}

static ri_status_t mdl_be_prefill(void *state, uint32_t layer, size_t pos, size_t n, const float *q, float *out)
{
    mdl_be_t *b = state;
    return mdl_attn_exact(cm_pool_default(), b->kv, layer, pos, n, q, out);
}

#ifdef MDL_HAVE_KERNELS
static kn_kv_view_t mdl_be_view(const mdl_be_t *b, uint32_t layer, size_t n)
{
    return mdl_kv_view(b->kv, layer, 0, n);
}
#endif

static ri_status_t mdl_be_prefill_end(void *state, uint32_t layer)
{
    mdl_be_t *b = state;
#ifdef MDL_HAVE_KERNELS
    double t0 = cm_time_s();
    kn_kv_view_t view = mdl_be_view(b, layer, b->kv->len);
    ri_status_t st = RI_OK;
    if (b->kind == MDL_BE_RETRO)
        st = kn_wave_build_pieces(b->wave[layer], &view,
                                  b->cfg.prefix != NULL && b->cfg.prefix->pieces != NULL
                                      ? b->cfg.prefix->pieces(b->cfg.prefix->ctx, layer)
                                      : NULL);
    else if (b->kind == MDL_BE_QUEST)
        st = kn_quest_update(b->quest[layer], &view);
    b->st.build_s += cm_time_s() - t0;
    return st;
#else
    (void)b;
    (void)layer;
    return RI_OK;
#endif
}

static ri_status_t mdl_be_decode(void *state, uint32_t layer, size_t pos, const float *q, float *out)
{
    mdl_be_t *b = state;
    size_t n = pos + 1;
    const mdl_attn_geom_t *g = &b->kv->geom;
    size_t kv_row_bytes = (size_t)g->n_kv_heads * g->head_dim * 2 * sizeof(cm_fp16_t);
    b->st.decode_steps++;
#ifdef MDL_HAVE_KERNELS
    kn_kv_view_t view = mdl_be_view(b, layer, n);
    uint32_t budget = mdl_attn_auto_budget(&b->cfg, n);
    ri_status_t st;
    switch (b->kind) {
    case MDL_BE_FULL:
        b->st.exact_tokens += n;
        b->st.bytes_read += n * kv_row_bytes;
        return kn_attn_decode(NULL, &b->shape, 1, q, &view, out, NULL);
    case MDL_BE_RETRO: {
        double t0 = cm_time_s();
        bool updated = false;
        st = kn_wave_update(b->wave[layer], &view, &updated);
        if (updated)
            b->st.build_s += cm_time_s() - t0;
        if (st != RI_OK)
            return st;
        kn_wave_stats_t ws = {0};
        st = kn_wave_decode(b->wave[layer], q, &view, out, NULL, &ws);
        b->st.exact_tokens += ws.exact_tokens / CM_MAX(g->n_kv_heads, 1u);
        b->st.bytes_read += ws.bytes_read;
        return st;
    }
    case MDL_BE_QUEST: {
        uint64_t bytes = 0;
        if (layer < MDL_QUEST_DENSE_LAYERS) {
            /* as Quest's paper runs it: its first two layers attend densely
             * (their attention is too flat for page bounds to pick from) */
            b->st.exact_tokens += n;
            b->st.bytes_read += n * kv_row_bytes;
            return kn_attn_decode(NULL, &b->shape, 1, q, &view, out, NULL);
        }
        st = kn_quest_update(b->quest[layer], &view);
        if (st == RI_OK)
            st = kn_quest_decode(NULL, b->quest[layer], q, &view, budget, out, NULL, &bytes);
        b->st.exact_tokens += CM_MIN((size_t)budget, n);
        b->st.bytes_read += bytes;
        return st;
    }
    case MDL_BE_STREAM: {
        uint32_t win = budget > b->cfg.wave.sink_tokens ? budget - b->cfg.wave.sink_tokens : 1;
        b->st.exact_tokens += CM_MIN((size_t)budget, n);
        b->st.bytes_read += CM_MIN((size_t)budget, n) * kv_row_bytes;
        return kn_streaming_decode(NULL, &b->shape, q, &view, b->cfg.wave.sink_tokens, win, out, NULL);
    }
    case MDL_BE_ORACLE:
        b->st.exact_tokens += CM_MIN((size_t)budget, n);
        b->st.bytes_read += n * kv_row_bytes;
        return kn_oracle_decode(NULL, &b->shape, q, &view, budget, out, NULL);
    }
    return RI_ERR_INTERNAL;
#else
    b->st.exact_tokens += n;
    b->st.bytes_read += n * kv_row_bytes;
    return mdl_attn_exact(cm_pool_default(), b->kv, layer, pos, 1, q, out);
#endif
}

static void mdl_be_stats(void *state, mdl_attn_stats_t *st_p)
{
    const mdl_be_t *b = state;
    *st_p = b->st;
#ifdef MDL_HAVE_KERNELS
    if (b->wave != NULL)
        st_p->tokens_per_cluster = kn_wave_params(b->wave[0])->tokens_per_cluster;
#endif
}

static bool mdl_be_wave_params(void *state, uint32_t layer, kn_wave_params_t *wave_p)
{
    const mdl_be_t *b = state;
#ifdef MDL_HAVE_KERNELS
    if (b->wave != NULL && layer < b->kv->geom.n_layers) {
        *wave_p = *kn_wave_params(b->wave[layer]);
        return true;
    }
#else
    (void)b;
    (void)layer;
    (void)wave_p;
#endif
    return false;
}

static const kn_index_t *mdl_be_index(void *state, uint32_t layer, uint32_t kv_head)
{
    const mdl_be_t *b = state;
#ifdef MDL_HAVE_KERNELS
    if (b->wave != NULL && layer < b->kv->geom.n_layers) {
        const kn_index_t *idx = kn_wave_index(b->wave[layer], kv_head);
        return idx != NULL && idx->n_clusters > 0 ? idx : NULL;
    }
#else
    (void)b;
    (void)layer;
    (void)kv_head;
#endif
    return NULL;
}

#define MDL_BE_CREATE(fn, kind)                                                          \
    static ri_status_t fn(const mdl_attn_cfg_t *cfg, mdl_kv_t *kv, void **state_p)       \
    {                                                                                    \
        return mdl_be_create(kind, cfg, kv, state_p);                                    \
    }

MDL_BE_CREATE(mdl_be_create_full, MDL_BE_FULL)

static const mdl_attn_ops_t mdl_be_full = {
    .name = "full", .help = "exact attention over every token", .create = mdl_be_create_full,
    .destroy = mdl_be_destroy, .prefill = mdl_be_prefill, .prefill_end = mdl_be_prefill_end,
    .decode = mdl_be_decode, .stats = mdl_be_stats, .wave_params = mdl_be_wave_params};

#ifdef MDL_HAVE_KERNELS
MDL_BE_CREATE(mdl_be_create_retro, MDL_BE_RETRO)
MDL_BE_CREATE(mdl_be_create_quest, MDL_BE_QUEST)
MDL_BE_CREATE(mdl_be_create_stream, MDL_BE_STREAM)
MDL_BE_CREATE(mdl_be_create_oracle, MDL_BE_ORACLE)

static const mdl_attn_ops_t mdl_be_retro = {
    .name = "retroinfer", .help = "wave index + tripartite attention (in-process)", .create = mdl_be_create_retro,
    .destroy = mdl_be_destroy, .prefill = mdl_be_prefill, .prefill_end = mdl_be_prefill_end,
    .decode = mdl_be_decode, .stats = mdl_be_stats, .wave_params = mdl_be_wave_params, .index = mdl_be_index};
static const mdl_attn_ops_t mdl_be_quest = {
    .name = "quest", .help = "Quest: 16-token pages, min/max key bounds, top pages to the budget (the first two "
            "layers dense, as in its paper)",
    .create = mdl_be_create_quest, .destroy = mdl_be_destroy, .prefill = mdl_be_prefill,
    .prefill_end = mdl_be_prefill_end, .decode = mdl_be_decode, .stats = mdl_be_stats,
    .wave_params = mdl_be_wave_params};
static const mdl_attn_ops_t mdl_be_stream = {
    .name = "streaming", .help = "StreamingLLM: 4 sinks + recent window (budget)", .create = mdl_be_create_stream,
    .destroy = mdl_be_destroy, .prefill = mdl_be_prefill, .prefill_end = mdl_be_prefill_end,
    .decode = mdl_be_decode, .stats = mdl_be_stats, .wave_params = mdl_be_wave_params};
static const mdl_attn_ops_t mdl_be_oracle = {
    .name = "oracle", .help = "exact top-B tokens (a ceiling, reads everything)", .create = mdl_be_create_oracle,
    .destroy = mdl_be_destroy, .prefill = mdl_be_prefill, .prefill_end = mdl_be_prefill_end,
    .decode = mdl_be_decode, .stats = mdl_be_stats, .wave_params = mdl_be_wave_params};

static const mdl_attn_ops_t *const mdl_be_all[] = {&mdl_be_full, &mdl_be_retro, &mdl_be_quest, &mdl_be_stream,
                                                   &mdl_be_oracle};
#else
static const mdl_attn_ops_t *const mdl_be_all[] = {&mdl_be_full};
#endif

size_t mdl_attn_builtin(const mdl_attn_ops_t *const **ops_p)
{
    *ops_p = mdl_be_all;
    return CM_ARRAY_LEN(mdl_be_all);
}
