/*
 * A synthetic model for the tests that need one where no real model is
 * installed (a GPU machine without the model files): a GGUF file of the
 * llama or gemma3 architecture with random fp16 weights, fp32 norms and a
 * tokenizer of placeholder tokens ("t0", "t1", ..., no merges).  Shapes are
 * chosen awkward on purpose: the hidden size is not a multiple of 8, the
 * vocabulary not a multiple of 4, 3 query heads per KV head (llama) and a
 * short sliding window (gemma3: window 16, every third layer global).  Its
 * logits mean nothing; it exercises every step of the forward pass.
 */
#ifndef TM_SYNTH_H
#define TM_SYNTH_H

#include <math.h>
#include <stdbool.h>
#include <stdio.h>

#include "common/cm_half.h"
#include "gguf_builder.h"
#include "gpuworker/model/mdl_attn.h"

typedef struct tm_synth_shape {
    uint32_t n_vocab, n_embd, n_ff, n_layers, n_heads, n_kv_heads, head_dim;
} tm_synth_shape_t;

static inline tm_synth_shape_t tm_synth_shape(bool gemma)
{
    if (gemma)
        return (tm_synth_shape_t){.n_vocab = 301, .n_embd = 84, .n_ff = 140, .n_layers = 6, .n_heads = 4,
                                  .n_kv_heads = 1, .head_dim = 32};
    /* llama: n_embd = n_heads * head_dim (84: not a multiple of 8 either) */
    return (tm_synth_shape_t){.n_vocab = 299, .n_embd = 84, .n_ff = 150, .n_layers = 3, .n_heads = 6,
                              .n_kv_heads = 2, .head_dim = 14};
}

/* The same model with head_dim 64, a size the device's tripartite step
 * (kn_cuda_wave_step: 64, 128, 256) takes: for the device "retroinfer"
 * check.  llama keeps n_embd = n_heads * head_dim. */
static inline tm_synth_shape_t tm_synth_shape_wave(bool gemma)
{
    tm_synth_shape_t s = tm_synth_shape(gemma);
    s.head_dim = 64;
    if (!gemma)
        s.n_embd = s.n_heads * s.head_dim;
    return s;
}

static inline void tm_kv_key(gb_t *b, const char *key, uint32_t type)
{
    gb_str(b, key);
    gb_u32(b, type);
}
static inline void tm_kv_u32(gb_t *b, const char *key, uint32_t v)
{
    tm_kv_key(b, key, 4);
    gb_u32(b, v);
}
static inline void tm_kv_f32(gb_t *b, const char *key, float v)
{
    tm_kv_key(b, key, 6);
    gb_put(b, &v, 4);
}
static inline void tm_kv_str(gb_t *b, const char *key, const char *v)
{
    tm_kv_key(b, key, 8);
    gb_str(b, v);
}

/* The tensors, in file order: name, rows, cols, fp16 (else fp32 norm). */
typedef struct tm_tensor {
    char name[64];
    uint32_t rows, cols;
    bool f16;
} tm_tensor_t;

static inline size_t tm_synth_tensors(const tm_synth_shape_t *s, bool gemma, tm_tensor_t *t)
{
    size_t n = 0, qd = (size_t)s->n_heads * s->head_dim, kvd = (size_t)s->n_kv_heads * s->head_dim;
#define TM_T(nm, r, c, h) (snprintf(t[n].name, sizeof(t[n].name), "%s", nm), t[n].rows = (uint32_t)(r), \
                           t[n].cols = (uint32_t)(c), t[n].f16 = (h), n++)
    TM_T("token_embd.weight", s->n_vocab, s->n_embd, true);
    TM_T("output_norm.weight", 1, s->n_embd, false);
    for (uint32_t l = 0; l < s->n_layers; l++) {
        char nm[64];
#define TM_L(suffix, r, c, h) (snprintf(nm, sizeof(nm), "blk.%u." suffix ".weight", l), TM_T(nm, r, c, h))
        TM_L("attn_q", qd, s->n_embd, true);
        TM_L("attn_k", kvd, s->n_embd, true);
        TM_L("attn_v", kvd, s->n_embd, true);
        TM_L("attn_output", s->n_embd, qd, true);
        TM_L("ffn_gate", s->n_ff, s->n_embd, true);
        TM_L("ffn_up", s->n_ff, s->n_embd, true);
        TM_L("ffn_down", s->n_embd, s->n_ff, true);
        TM_L("attn_norm", 1, s->n_embd, false);
        TM_L("ffn_norm", 1, s->n_embd, false);
        if (gemma) {
            TM_L("attn_q_norm", 1, s->head_dim, false);
            TM_L("attn_k_norm", 1, s->head_dim, false);
            TM_L("post_attention_norm", 1, s->n_embd, false);
            TM_L("post_ffw_norm", 1, s->n_embd, false);
        }
#undef TM_L
    }
#undef TM_T
    return n;
}

static inline float tm_synth_rand(uint64_t *st)   /* [-1, 1) */
{
    *st ^= *st << 13;
    *st ^= *st >> 7;
    *st ^= *st << 17;
    return (float)((double)(*st >> 11) / (double)(1ull << 53) * 2.0 - 1.0);
}

/* Write the model of shape s to path; false on an I/O error. */
static inline bool tm_synth_write_shape(const char *path, bool gemma, tm_synth_shape_t s)
{
    const char *arch = gemma ? "gemma3" : "llama";
    tm_tensor_t *t = calloc(16 + 16 * (size_t)s.n_layers, sizeof(*t));
    size_t nt = tm_synth_tensors(&s, gemma, t);
    gb_t b = {0};
    char key[128];
    uint32_t n_kv = gemma ? 17 : 14;   /* the keys written below */
    gb_u32(&b, 0x46554747u);
    gb_u32(&b, 3);
    gb_u64(&b, nt);
    gb_u64(&b, n_kv);
    tm_kv_str(&b, "general.architecture", arch);
    tm_kv_str(&b, "general.name", gemma ? "synthetic gemma3" : "synthetic llama");
#define TM_KU(k, v) (snprintf(key, sizeof(key), "%s." k, arch), tm_kv_u32(&b, key, (v)))
#define TM_KF(k, v) (snprintf(key, sizeof(key), "%s." k, arch), tm_kv_f32(&b, key, (v)))
    TM_KU("block_count", s.n_layers);
    TM_KU("embedding_length", s.n_embd);
    TM_KU("feed_forward_length", s.n_ff);
    TM_KU("attention.head_count", s.n_heads);
    TM_KU("attention.head_count_kv", s.n_kv_heads);
    TM_KU("attention.key_length", s.head_dim);
    TM_KU("context_length", 4096);
    TM_KF("rope.freq_base", gemma ? 1000000.0f : 10000.0f);
    TM_KF("attention.layer_norm_rms_epsilon", 1e-6f);
    if (gemma) {
        TM_KU("attention.sliding_window", 16);
        TM_KU("attention.sliding_window_pattern", 3);
        TM_KF("final_logit_softcapping", 30.0f);
    }
#undef TM_KU
#undef TM_KF
    tm_kv_str(&b, "tokenizer.ggml.model", "gpt2");
    tm_kv_key(&b, "tokenizer.ggml.tokens", 9);
    gb_u32(&b, 8);
    gb_u64(&b, s.n_vocab);
    for (uint32_t i = 0; i < s.n_vocab; i++) {
        char tok[16];
        snprintf(tok, sizeof(tok), "t%u", i);
        gb_str(&b, tok);
    }
    tm_kv_key(&b, "tokenizer.ggml.merges", 9);
    gb_u32(&b, 8);
    gb_u64(&b, 0);
    /* tensor infos, offsets aligned to 32 */
    uint64_t off = 0;
    for (size_t i = 0; i < nt; i++) {
        gb_str(&b, t[i].name);
        gb_u32(&b, t[i].rows == 1 ? 1 : 2);
        gb_u64(&b, t[i].cols);
        if (t[i].rows != 1)
            gb_u64(&b, t[i].rows);
        gb_u32(&b, t[i].f16 ? 1 : 0);
        gb_u64(&b, off);
        off += ((uint64_t)t[i].rows * t[i].cols * (t[i].f16 ? 2 : 4) + 31) / 32 * 32;
    }
    gb_pad(&b, 32);
    uint64_t rng = gemma ? 0x1234567u : 0x7654321u;
    for (size_t i = 0; i < nt; i++) {
        size_t n = (size_t)t[i].rows * t[i].cols;
        float scale = 1.0f / sqrtf((float)t[i].cols);
        for (size_t j = 0; j < n; j++) {
            float v = tm_synth_rand(&rng);
            if (t[i].f16) {
                cm_fp16_t h = cm_f32_to_fp16(v * 2.0f * scale);
                gb_put(&b, &h, 2);
            } else {
                v = 1.0f + 0.25f * v;   /* norm scales near 1 */
                gb_put(&b, &v, 4);
            }
        }
        gb_pad(&b, 32);
    }
    FILE *f = fopen(path, "wb");
    bool ok = f != NULL && fwrite(b.p, 1, b.n, f) == b.n;
    if (f != NULL && fclose(f) != 0)
        ok = false;
    free(b.p);
    free(t);
    return ok;
}

/* Write the model (tm_synth_shape) to path; false on an I/O error. */
static inline bool tm_synth_write(const char *path, bool gemma)
{
    return tm_synth_write_shape(path, gemma, tm_synth_shape(gemma));
}

/* Wave settings small enough that a 100-token prompt of a synthetic model
 * indexes (80 tokens into 20 clusters) and 64 greedy steps update once (at
 * 132 tokens): the device tests' retroinfer cases. */
static inline void tm_synth_wave_cfg(mdl_attn_cfg_t *cfg)
{
    mdl_attn_cfg_default(cfg);
    cfg->wave.sink_tokens = 4;
    cfg->wave.window_tokens = 16;
    cfg->wave.update_tokens = 32;
    cfg->wave.segment_tokens = 32;
    cfg->wave.tokens_per_cluster = 4;
    cfg->wave.retrieval_min_tokens = 8;
    cfg->wave.estimation_min_tokens = 8;
}

/* max |c - g| / range(c) over n logits (NaN when any difference is). */
static inline double tm_logit_ratio(const float *c, const float *g, size_t n)
{
    float lo = c[0], hi = c[0];
    double diff = 0;
    for (size_t i = 0; i < n; i++) {
        lo = c[i] < lo ? c[i] : lo;
        hi = c[i] > hi ? c[i] : hi;
        double e = fabs((double)c[i] - g[i]);
        diff = e > diff || isnan(e) ? e : diff;
    }
    return diff / (double)(hi - lo);
}

#endif /* TM_SYNTH_H */
