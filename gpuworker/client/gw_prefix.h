/*
 * Prefix reuse, the worker's half (docs/prefix.md): the keys that name a
 * prompt's blocks, and the worker section of a block ("RIPB",
 * common/cm_dp_prefix.h): how a block is built from a sequence's K/V and
 * wave index, and parsed back into K/V (a preload fill) and the wave-index
 * pieces of every layer.  Pure functions over memory: the data-plane calls
 * (attach, put, get, map) are the caller's.
 *
 * Keys.  A prompt's tokens are cut into blocks of B tokens at absolute
 * positions (block b = [b*B, (b+1)*B)).  Block b is named by
 *   key_b = SHA-256("RIPK" || u32 3 || key_{b-1} (32 zero bytes for b = 0)
 *                   || model digest || layout || tenant salt
 *                   || block b's token ids as u32 LE)
 * model digest = SHA-256 of the GGUF file's bytes (gw_pfx_model_digest;
 * callers compute it once per loaded model), layout = gw_pfx_layout_t
 * encoded as u32 LE fields (floats by their bits), tenant salt =
 * SHA-256("RIPS" || u32 len || kvstore bearer token || u32 len || extra
 * salt), so two tenants' keys never meet even for the same prompt.
 *
 * Worker section (every part starts at a multiple of 8 bytes from the
 * section's start; every integer little-endian; fp16 K/V as the model
 * stores them):
 *   u32 magic GW_PFX_WMAGIC ("RIPW"), u32 version 3
 *   for each table t (layer * kv_heads + head) with n_clusters[t] > 0, in
 *   order (C = n_clusters[t], N = the table's tokens = sum of its sizes):
 *     perm       N x u32   token positions relative to first_pos, cluster-major
 *     centroids  C x d int8  the centroids quantized (kn_vq_quantize)
 *     cscale     C x fp32    their scales: centroid ~= centroids * cscale
 *     vq         C x d int8  the value means quantized (kn_vq_quantize)
 *     vscale     C x fp32    their scales: mean ~= vq * vscale (each padded to 8)
 *   (version 2 held the centroids as C x d fp16, version 1 the means too;
 *   the parser refuses both, so a block written before is a miss, never
 *   served)
 *   for each layer l:
 *     u32 n_loose, u32 0; n_loose x u32 relative positions (padded to 8):
 *       the block's tokens in none of the layer's clusters (all B for a
 *       layer without an index, the sinks of block 0 for an indexed layer)
 *     for each head: K [n_loose][d] fp16, then V [n_loose][d] fp16 (padded)
 * The clustered tokens' K/V are the pages section (the kvstore serves
 * those as clusters).  Within one layer either every head has clusters or
 * none; an indexed table's clusters cover exactly the block's tokens past
 * the sinks, so the clusters of a table and the layer's loose tokens cover
 * every token of the block exactly once (the parser checks it).
 *
 * Thread safety: none needed; every function works on its arguments only.
 */
#ifndef GW_PREFIX_H
#define GW_PREFIX_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "common/cm_dp_prefix.h"
#include "common/cm_half.h"
#include "gpuworker/model/mdl_attn.h"
#include "gpuworker/model/mdl_model.h"
#include "kernels/kn_ops.h"
#include "retroinfer/status.h"

#define GW_PFX_KEY_MAGIC   "RIPK"
/* 3 since the worker section's version 3: a key names one section format,
 * so blocks written in the old one are not even asked for (and a block of
 * another version that is found anyway is refused by the parser: a miss) */
#define GW_PFX_KEY_VERSION 3u
#define GW_PFX_WMAGIC      0x57504952u /* "RIPW" */
#define GW_PFX_WVERSION    3u          /* 3: int8 centroids too (2: int8 value means + fp32 scales) */
#define GW_PFX_DTYPE_F16   1u /* cm_wire dtype of the blocks we write */

/* Everything besides the tokens that changes a block's K/V or its index;
 * part of every key.  Fill it with gw_pfx_layout_init. */
typedef struct gw_pfx_layout {
    uint32_t indexed;        /* 1: the backend keeps a wave index; 0: none (full) */
    uint32_t cluster_tokens; /* tokens per cluster (kn_wave_cluster_tokens); 0 unindexed */
    uint32_t sink_tokens;    /* attention sinks */
    uint32_t block_tokens;   /* B (the wave index's segment_tokens) */
    uint32_t page_tokens;    /* kvstore page P; 1 unindexed */
    uint32_t dtype;          /* K/V dtype (GW_PFX_DTYPE_F16) */
    uint32_t n_layers, n_kv_heads, head_dim;
    uint32_t n_rot, rope_neox, n_swa, swa_period;
    float rope_theta, rope_scale, rope_theta_swa;
} gw_pfx_layout_t;

/* The layout of a model under wave settings (segment_tokens is B;
 * sink_tokens the sinks); indexed: the backend keeps a wave index, then
 * cluster_tokens and page_tokens are the index's and the session's (else
 * both are written as 0 and 1). */
void gw_pfx_layout_init(const mdl_hparams_t *hp, const kn_wave_params_t *wave, bool indexed, uint32_t cluster_tokens,
                        uint32_t page_tokens, gw_pfx_layout_t *lay);

/* Model identity and layout of one model's keys, computed once per model. */
typedef struct gw_pfx_keyer {
    uint8_t model[32]; /* gw_pfx_model_digest */
    uint8_t salt[32];  /* gw_pfx_tenant_salt */
} gw_pfx_keyer_t;

/* SHA-256 of the model file's bytes (base, size: the mapped GGUF, e.g.
 * mdl_model_gguf(m)->base / ->size).  About 0.1 s per 100 MB; callers cache
 * it per loaded model.  RI_ERR_NOMEM / RI_ERR_INTERNAL from libcrypto. */
ri_status_t gw_pfx_model_digest(const void *base, size_t size, uint8_t out[32]);

/* The tenant salt from the kvstore bearer token (NULL or "" = none) and an
 * optional extra salt (NULL or "" = none). */
ri_status_t gw_pfx_tenant_salt(const char *token, const char *extra, uint8_t out[32]);

/* The keys of blocks [0, n_blocks) of tokens (at least n_blocks * B of
 * them) into keys (n_blocks x CM_PFX_KEY_SIZE).  RI_ERR_INVALID on a
 * zero B; keys untouched on error. */
ri_status_t gw_pfx_keys(const gw_pfx_keyer_t *kr, const gw_pfx_layout_t *lay, const int32_t *tokens, uint32_t n_blocks,
                        uint8_t *keys);

/* How many leading blocks of a prompt of n_tokens may be attached or
 * published: (b+1)*B <= n_tokens - window for an indexed layout (wholly
 * inside the indexed range), <= n_tokens - 1 otherwise (at least one token
 * is prefilled). */
uint32_t gw_pfx_max_blocks(const gw_pfx_layout_t *lay, uint32_t window_tokens, size_t n_tokens);

/* Where a block's pieces come from when it is built: the sequence's K/V
 * (positions [0, (b+1)*B) complete) and, per (layer, head), its wave index
 * (NULL: that layer has none). */
typedef struct gw_pfx_src {
    const mdl_kv_t *kv; /* borrowed */
    void *ctx;
    const kn_index_t *(*index)(void *ctx, uint32_t layer, uint32_t kv_head);
} gw_pfx_src_t;

/* Build block b (header, tables, worker section, pages, CRC) from src
 * under lay.  *buf_p: caller frees with cm_free; *len_p its bytes.
 * RI_ERR_UNSUPPORTED when the index does not split at the block's edges
 * (a cluster straddles them, or the clusters miss some of the block's
 * indexed tokens: the block cannot be published), RI_ERR_INVALID on a
 * K/V cache too short or a geometry that differs from lay. */
ri_status_t gw_pfx_block_build(const gw_pfx_layout_t *lay, const gw_pfx_src_t *src, uint32_t block, uint8_t **buf_p,
                               uint64_t *len_p);

/* One table's clusters in a parsed block. */
typedef struct gw_pfx_table {
    uint32_t n_clusters;        /* 0: the layer has no index in this block */
    const uint32_t *sizes;      /* [n_clusters], in the block */
    uint32_t *perm;             /* [tokens] ABSOLUTE positions, cluster-major (owned) */
    const int8_t *centroids;    /* [n_clusters][d], in the block */
    const float *cscale;        /* [n_clusters], in the block */
    const int8_t *vq;           /* [n_clusters][d], in the block */
    const float *vscale;        /* [n_clusters], in the block */
    const uint8_t *pages;       /* the table's first page in the pages section */
} gw_pfx_table_t;

/* One layer's tokens in no cluster. */
typedef struct gw_pfx_loose {
    uint32_t n;          /* tokens */
    const uint32_t *pos; /* [n] relative positions, in the block */
    const cm_fp16_t *kv; /* per head: K [n][d] then V [n][d], in the block */
} gw_pfx_loose_t;

/* A parsed block: views into the caller's buffer (borrowed; must outlive
 * the parse) plus the absolute permutations. */
typedef struct gw_pfx_block {
    cm_pfx_view_t view;     /* the decoded header and sections */
    uint32_t first_pos;     /* b * B */
    uint32_t n_tokens;      /* B */
    uint32_t page_tokens;   /* P */
    gw_pfx_table_t *tables; /* [layers * kv_heads] (owned) */
    gw_pfx_loose_t *loose;  /* [layers] (owned) */
} gw_pfx_block_t;

/* Parse and check the block of len bytes at buf as block b under lay:
 * structure (cm_pfx_decode), CRC, geometry, first_pos, the worker section
 * and that every token is covered exactly once per table.  Writes *out
 * only on success; release it with gw_pfx_block_release.  RI_ERR_CORRUPT
 * on a CRC mismatch, RI_ERR_PROTOCOL / RI_ERR_TRUNCATED on a malformed
 * block, RI_ERR_INVALID on one for another geometry or position. */
ri_status_t gw_pfx_block_parse(const gw_pfx_layout_t *lay, uint32_t block, const uint8_t *buf, uint64_t len,
                               gw_pfx_block_t *out);
void gw_pfx_block_release(gw_pfx_block_t *b);

/* Write K and V of positions [pos0, pos0 + n) of (layer, head) that lie in
 * the block into k / v (fp16 [n][d] at token_stride elements per token,
 * k[(p - pos0) * token_stride] for position p); positions outside the block
 * are left alone. */
void gw_pfx_block_fill(const gw_pfx_block_t *b, uint32_t layer, uint32_t head, size_t pos0, size_t n, cm_fp16_t *k,
                       cm_fp16_t *v, size_t token_stride);

/* The attached blocks of one sequence, parsed, in block order: what the
 * model's preload and the wave build read (mdl_seq_preload's fill,
 * mdl_prefix_src_t's pieces). */
typedef struct gw_pfx_set gw_pfx_set_t;

/* An empty set for up to max_blocks blocks under lay (copied).  Caller
 * frees with gw_pfx_set_destroy. */
ri_status_t gw_pfx_set_create(const gw_pfx_layout_t *lay, uint32_t max_blocks, gw_pfx_set_t **set_p);
void gw_pfx_set_destroy(gw_pfx_set_t *set);

/* Parse buf (len bytes, borrowed: must outlive the set) as the next block
 * (gw_pfx_block_parse's errors; RI_ERR_RANGE past max_blocks). */
ri_status_t gw_pfx_set_add(gw_pfx_set_t *set, const uint8_t *buf, uint64_t len);

/* Blocks added so far; their tokens are [0, n * B). */
uint32_t gw_pfx_set_blocks(const gw_pfx_set_t *set);

/* A preload fill (mdl_seq_preload): arg is the set; writes positions
 * [pos0, pos0 + n) of (layer, kv_head) from the blocks.  RI_ERR_RANGE when
 * the range reaches past the blocks. */
ri_status_t gw_pfx_set_fill(void *arg, uint32_t layer, uint32_t kv_head, size_t pos0, size_t n, cm_fp16_t *k,
                            cm_fp16_t *v, size_t token_stride);

/* The wave-index pieces of layer's blocks (kn_wave_build_pieces); NULL
 * when the layer has none (no index there, or no block).  ctx is the set;
 * the result is owned by it. */
const kn_wave_pieces_t *gw_pfx_set_pieces(void *ctx, uint32_t layer);

#endif /* GW_PREFIX_H */
