/*
 * The attention-backend interface of the model runtime, and the per-sequence
 * K/V cache the backends read.
 *
 * The model owns one mdl_kv_t per sequence: per layer, fp16 K and V
 * (post-RoPE keys) in one of two layouts, both a kn_kv_view_t of kernels/
 * (mdl_kv_view):
 *
 *   head-major  [n_kv_heads][cap][head_dim]  each head's rows one run: the
 *               layout a decode over the whole cache streams fastest (the
 *               CPU flash decode reads 8K tokens 1.8x faster than from the
 *               token-major one on the 2-core AVX2 host);
 *   token-major [cap][n_kv_heads][head_dim]  a token's rows of every head
 *               adjacent: for a backend that gives back all but the steady
 *               zone (mdl_attn_ops_t.token_major_kv), since the pages that
 *               stay are then those of the zone's tokens (two runs a layer),
 *               not a partly used page at each end of every head's run.
 *
 * The forward pass writes the new tokens' K/V into it, then asks the
 * backend for attention outputs:
 *
 *   prefill(layer, pos, n, q)  exact causal attention of queries at positions
 *                              [pos, pos+n) over tokens [0, pos+n) (every
 *                              method prefills exactly, as in the paper);
 *   prefill_end(layer)         the prompt of this layer is complete: build
 *                              indexes (wave index, Quest pages; with
 *                              cfg.prefix, the wave index imports the
 *                              prefix's pieces);
 *   decode(layer, pos, q)      one new token at pos (its K/V already in the
 *                              cache): the method's (sparse) attention.
 *
 * q and out are fp32 [n][n_heads][head_dim] (token-major); query head h uses
 * KV head h / (n_heads / n_kv_heads).  A backend object serves one sequence.
 *
 * Backends: "full" (exact; kernels' flash decode), "retroinfer" (wave index
 * + tripartite decode, index update every 1024 generated tokens), "quest",
 * "streaming" (sinks + window), and "oracle" (exact top-B, for accuracy
 * only).  The worker's remote RetroInfer backend registers itself with
 * mdl_attn_register() and plugs in the same way.
 */
#ifndef MDL_ATTN_H
#define MDL_ATTN_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "common/cm_half.h"
#include "common/cm_thread.h"
#include "kernels/kn_wave.h"
#include "retroinfer/status.h"

/* Attention geometry of the model. */
typedef struct mdl_attn_geom {
    uint32_t n_layers;    /* layers */
    uint32_t n_heads;     /* query heads */
    uint32_t n_kv_heads;  /* KV heads (divides n_heads) */
    uint32_t head_dim;    /* d */
} mdl_attn_geom_t;

/* K/V cache of one sequence (owned by the sequence). */
typedef struct mdl_kv {
    mdl_attn_geom_t geom; /* shape */
    size_t cap;           /* tokens allocated */
    size_t len;           /* tokens whose K/V are complete in every layer */
    size_t token_stride;  /* elements from a head's row to its next token's */
    size_t head_stride;   /* elements from a token's row of head h to head h + 1's */
    cm_fp16_t **k;        /* [n_layers] -> rows: head-major (token_stride d, head_stride
                           * cap * d; a device cache's view too) or token-major
                           * (n_kv_heads * d, d) */
    cm_fp16_t **v;        /* same layout */
    void *map;            /* mdl_kv_create's: one private mapping holds every array */
    size_t map_bytes;
} mdl_kv_t;

/* The K (V) row of KV head h at token t of a layer; the head's next token is
 * kv->token_stride elements further. */
static inline cm_fp16_t *mdl_kv_krow(const mdl_kv_t *kv, uint32_t layer, uint32_t h, size_t t)
{
    return kv->k[layer] + t * kv->token_stride + (size_t)h * kv->head_stride;
}

static inline cm_fp16_t *mdl_kv_vrow(const mdl_kv_t *kv, uint32_t layer, uint32_t h, size_t t)
{
    return kv->v[layer] + t * kv->token_stride + (size_t)h * kv->head_stride;
}

/* Tokens [first, first + n) of a layer as a kernels' view. */
static inline kn_kv_view_t mdl_kv_view(const mdl_kv_t *kv, uint32_t layer, size_t first, size_t n)
{
    return (kn_kv_view_t){.k = mdl_kv_krow(kv, layer, 0, first), .v = mdl_kv_vrow(kv, layer, 0, first),
                          .n_tokens = n, .token_stride = kv->token_stride, .head_stride = kv->head_stride};
}

typedef enum mdl_kv_layout {
    MDL_KV_HEAD_MAJOR = 0,
    MDL_KV_TOKEN_MAJOR = 1,
} mdl_kv_layout_t;

/* Allocate a cache for cap tokens in layout.  Caller frees with mdl_kv_destroy. */
ri_status_t mdl_kv_create(const mdl_attn_geom_t *geom, size_t cap, mdl_kv_layout_t layout, mdl_kv_t **kv_p);

/* true when a token's rows of every head are adjacent (one run a token). */
static inline bool mdl_kv_is_token_major(const mdl_kv_t *kv)
{
    return kv->head_stride == kv->geom.head_dim && kv->token_stride == (size_t)kv->geom.n_kv_heads * kv->geom.head_dim;
}
void mdl_kv_destroy(mdl_kv_t *kv);

/* Store n tokens' K and V (fp32 [n][n_kv_heads][d]) of one layer at [pos, pos+n). */
void mdl_kv_store(mdl_kv_t *kv, uint32_t layer, size_t pos, size_t n, const float *k, const float *v);

/* Copy the first n tokens of every layer of src into dst (same geometry,
 * dst->cap >= n; either layout, e.g. a full sequence forked to a remote one). */
ri_status_t mdl_kv_copy(mdl_kv_t *dst, const mdl_kv_t *src, size_t n);

/* What a sequence starts from when its leading blocks were prefilled
 * before (prefix reuse, docs/prefix.md): positions [0, n_tokens) were
 * preloaded (mdl_seq_preload) and pieces gives, per layer, the wave-index
 * pieces of the leading blocks (kn_wave_build_pieces), which a backend
 * with a wave index imports instead of clustering them again.  Borrowed:
 * it must outlive the sequence's index build (its first decode step). */
typedef struct mdl_prefix_src {
    void *ctx;
    size_t n_tokens;             /* positions [0, n_tokens) were preloaded */
    const kn_wave_pieces_t *(*pieces)(void *ctx, uint32_t layer);  /* NULL result: none for that layer */
    /* The kvstore names of the preloaded blocks (n_keys x 32 bytes, block
     * order): a backend whose index lives in the kvstore attaches them
     * there itself ("retroinfer-remote").  NULL / 0: none. */
    const uint8_t *keys;
    uint32_t n_keys;
    /* Optional: a backend whose K/V leaves the worker calls it once every
     * layer's index is built and BEFORE it gives any K/V back (the last
     * moment the sequence's K/V and index are whole), e.g. to publish the
     * prompt's blocks.  NULL: not needed. */
    void (*built)(void *ctx);
} mdl_prefix_src_t;

/* Settings of the backends (defaults in docs/architecture.md).  The wave
 * index and tripartite settings are kernels' own struct, embedded whole:
 * "retroinfer" hands it to kn_wave_create and "retroinfer-remote" to its
 * session as it is, so no layer keeps a copy of its fields. */
typedef struct mdl_attn_cfg {
    kn_wave_params_t wave;    /* retroinfer(-remote): the wave index (kn_wave.h); its
                                 sink_tokens / window_tokens are also the steady zone of
                                 quest / streaming / oracle's auto budget */
    uint32_t budget_tokens;   /* exact tokens for quest/streaming/oracle; 0 = auto:
                                 sink + window + max(round(0.018 * n), retrieval_min_tokens)
                                 (RetroInfer's exact part) */
    bool release_window;      /* give back each sliding-window layer's K/V older than its
                                 window as decoding goes (a server that keeps only what it
                                 reads); false: keep every token (forks, K/V dumps) */
    const mdl_prefix_src_t *prefix; /* the sequence's preloaded prefix (borrowed); NULL = none */
} mdl_attn_cfg_t;

/* The built-in defaults (kn_wave_params_default for the wave index). */
void mdl_attn_cfg_default(mdl_attn_cfg_t *cfg);

/* Per-backend statistics (summed over layers and steps). */
typedef struct mdl_attn_stats {
    uint64_t decode_steps;    /* layer-steps decoded */
    uint64_t exact_tokens;    /* tokens attended exactly */
    uint64_t bytes_read;      /* K/V + metadata bytes read by decode */
    double build_s;           /* seconds spent building indexes (prefill_end + updates) */
    uint32_t tokens_per_cluster; /* the cluster size the wave index uses (the auto size
                                    resolved once built); 0 = no wave index */
} mdl_attn_stats_t;

/* A backend.  Every function returns a status; objects are per sequence. */
typedef struct mdl_attn_ops {
    const char *name;         /* --attn value */
    const char *help;         /* one line */
    /* kv is borrowed and outlives the object. */
    ri_status_t (*create)(const mdl_attn_cfg_t *cfg, mdl_kv_t *kv, void **state_p);
    void (*destroy)(void *state);
    ri_status_t (*prefill)(void *state, uint32_t layer, size_t pos, size_t n, const float *q, float *out);
    ri_status_t (*prefill_end)(void *state, uint32_t layer);
    ri_status_t (*decode)(void *state, uint32_t layer, size_t pos, const float *q, float *out);
    void (*stats)(void *state, mdl_attn_stats_t *stats_p);   /* may be NULL */
    /* The settings layer's wave index runs with (tokens_per_cluster and
     * update_clusters resolved once it is built), into *wave_p; false when
     * the backend keeps no wave index.  May be NULL. */
    bool (*wave_params)(void *state, uint32_t layer, kn_wave_params_t *wave_p);
    /* The wave index of (layer, kv_head) once built (borrowed, valid until
     * the next build or update); NULL when there is none.  May be NULL. */
    const kn_index_t *(*index)(void *state, uint32_t layer, uint32_t kv_head);
    /* true: the backend also runs on the device engine (mdl_dev.h).  There
     * its kv's k[l] / v[l] are in the memory space of cfg->wave.ops
     * (kn_mem_of: device memory on a GPU) and every read of them goes
     * through that space's copy or those ops; q and out stay host memory;
     * prefill is never called (the engine prefills exactly itself); and
     * cfg->prefix is NULL.  false: host K/V only (the CPU runtime). */
    bool device_ok;
    /* true: the sequence's cache is token-major (mdl_kv_create), for a
     * backend that gives back every token but its steady zone once the
     * kvstore holds them ("retroinfer-remote"); false: head-major, for one
     * that decodes over the whole cache. */
    bool token_major_kv;
} mdl_attn_ops_t;

/* Find a backend by name; NULL when unknown (or not built). */
const mdl_attn_ops_t *mdl_attn_find(const char *name);

/* Add a backend (e.g. the worker's remote one).  ops is borrowed forever.
 * RI_ERR_EXISTS if the name is taken, RI_ERR_NOMEM when the table is full. */
ri_status_t mdl_attn_register(const mdl_attn_ops_t *ops);

/* Comma-separated names of the registered backends, for --help. */
const char *mdl_attn_names(void);

/* Exact causal attention over the cache (the shared prefill of every
 * backend, and the decode of "full" when kernels/ is not built).  Threads
 * from pool (NULL: caller only). */
ri_status_t mdl_attn_exact(cm_pool_t *pool, const mdl_kv_t *kv, uint32_t layer, size_t pos, size_t n,
                           const float *q, float *out);

/* The same with a sliding window: the query at position p attends to keys
 * (p - window, p] (Gemma 3's local layers); window 0 = all, as above. */
ri_status_t mdl_attn_exact_win(cm_pool_t *pool, const mdl_kv_t *kv, uint32_t layer, size_t pos, size_t n,
                               size_t window, const float *q, float *out);

/* The exact attention, scalar double-precision reference (tests). */
void mdl_attn_exact_ref(const mdl_kv_t *kv, uint32_t layer, size_t pos, size_t n, const float *q, float *out);
void mdl_attn_exact_win_ref(const mdl_kv_t *kv, uint32_t layer, size_t pos, size_t n, size_t window, const float *q,
                            float *out);

/* Default budget: sink + window + max(round(0.018 * n_tokens), retrieval_min_tokens). */
uint32_t mdl_attn_auto_budget(const mdl_attn_cfg_t *cfg, size_t n_tokens);

#endif /* MDL_ATTN_H */
