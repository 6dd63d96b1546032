/*
 * Forward pass on GGUF weights of two architectures:
 *  - llama (SmolLM2-135M-Instruct, the default): token embedding, RMSNorm,
 *    RoPE on adjacent pairs (GGUF llama tensors expect this: the converter
 *    permutes Q/K rows), GQA attention through an attention backend
 *    (mdl_attn.h), SwiGLU FFN, tied or separate output head;
 *  - gemma3 (Gemma 3 270M): embeddings scaled by sqrt(n_embd), RMS norm of
 *    each Q and K head, NEOX RoPE (pairs (i, i + n_rot/2)) with one base for
 *    the sliding-window layers and another for the global ones, norms before
 *    and after attention and FFN, GeGLU (tanh GELU), optional final logit
 *    soft-capping.  Sliding-window layers attend exactly over their window
 *    in the model itself; only the global layers go through the backend, so
 *    sparse attention (RetroInfer) applies where the context is long.
 *
 * A model (weights, tokenizer; read-only after load, shareable) serves many
 * sequences (mdl_seq_t: K/V cache + attention backend object).  Prefill runs
 * a sequence's prompt in chunks (matrix-matrix products); decode advances a
 * batch of sequences by one token each (one matrix-vector product per weight
 * for the whole batch).  The wave index (or Quest pages) is built at a
 * sequence's first decode step, over everything prefilled so far.
 *
 * Threads: the products and the exact attention use cm_pool_default()
 * (RI_THREADS); one model call at a time per process.
 */
#ifndef MDL_MODEL_H
#define MDL_MODEL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "common/cm_runtime.h"
#include "gpuworker/model/mdl_attn.h"
#include "gpuworker/model/mdl_gguf.h"
#include "gpuworker/model/mdl_quant.h"
#include "gpuworker/model/mdl_tok.h"
#include "retroinfer/status.h"

/* Architectures the runtime runs. */
typedef enum mdl_arch { MDL_ARCH_LLAMA = 0, MDL_ARCH_GEMMA3 = 1 } mdl_arch_t;

/* Hyper-parameters from the GGUF metadata. */
typedef struct mdl_hparams {
    mdl_arch_t arch;       /* general.architecture */
    uint32_t n_layers;     /* blocks */
    uint32_t n_embd;       /* hidden size */
    uint32_t n_ff;         /* FFN size */
    uint32_t n_heads;      /* query heads */
    uint32_t n_kv_heads;   /* KV heads */
    uint32_t head_dim;     /* attention.key_length, else n_embd / n_heads */
    uint32_t n_rot;        /* rotated dims per head (rope.dimension_count) */
    uint32_t n_vocab;      /* output rows */
    uint32_t n_ctx;        /* trained context length */
    float rope_theta;      /* rope.freq_base */
    float rope_scale;      /* linear position scale factor (1 = none) */
    float eps;             /* RMSNorm epsilon */
    float rope_theta_swa;  /* rope base of the sliding-window layers */
    uint32_t n_swa;        /* sliding window in tokens (0: every layer global) */
    uint32_t swa_period;   /* with n_swa: layer l is global when (l+1) % period == 0,
                              unless the metadata lists the layers */
    float embd_scale;      /* token embedding multiplier (1; sqrt(n_embd) for gemma3) */
    float logit_softcap;   /* final logits -> cap * tanh(logit / cap); 0 = none */
    bool rope_neox;        /* rotate pairs (i, i + n_rot/2) instead of (2i, 2i+1) */
    bool qk_norm;          /* RMS norm of each Q and K head before RoPE */
    bool post_norms;       /* RMS norm of the attention and FFN outputs */
    bool geglu;            /* FFN gate: tanh GELU (else SiLU) */
} mdl_hparams_t;

typedef struct mdl_model mdl_model_t;
typedef struct mdl_seq mdl_seq_t;

/* Load a GGUF model (mapped, weights not copied) and its tokenizer.  Errors:
 * I/O and format errors of the file, RI_ERR_UNSUPPORTED for another
 * architecture or weight type; err holds a message.  Caller frees with
 * mdl_model_destroy. */
ri_status_t mdl_model_load(const char *path, mdl_model_t **m_p, char *err, size_t errlen);
void mdl_model_destroy(mdl_model_t *m);

const mdl_hparams_t *mdl_model_hparams(const mdl_model_t *m);
/* Borrowed, valid while the model lives. */
const mdl_tok_t *mdl_model_tok(const mdl_model_t *m);
const mdl_gguf_t *mdl_model_gguf(const mdl_model_t *m);

/* The weight called name, checked to be [rows][cols] (a view into the
 * model's mapped file; nothing to free).  RI_ERR_FORMAT / RI_ERR_UNSUPPORTED
 * with the reason in err. */
ri_status_t mdl_model_weight(const mdl_model_t *m, const char *name, size_t rows, size_t cols, mdl_weight_t *w,
                             char *err, size_t errlen);

/* The RoPE angles of position pos (cos, sin pairs for i < n_rot/2 into
 * cs[2i], cs[2i+1]) as the forward pass uses them: the global layers'
 * frequencies, or with swa the sliding-window layers'. */
void mdl_model_rope_angles(const mdl_model_t *m, bool swa, size_t pos, float *cs);

/* Write the formatted reason into err (when err is given) and return st: the
 * model runtime's way of failing with a message. */
ri_status_t mdl_errf(char *err, size_t errlen, ri_status_t st, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
/* general.name or the file name. */
const char *mdl_model_name(const mdl_model_t *m);
/* Sliding window of layer l in tokens; 0 for a global layer (all of them
 * in a llama model).  Only global layers reach the attention backend. */
uint32_t mdl_model_layer_window(const mdl_model_t *m, uint32_t l);
/* Bytes of weights read per decode step (every tensor once). */
uint64_t mdl_model_weight_bytes(const mdl_model_t *m);

/* Per-op profile of the forward pass (the model bench's breakdown): wall
 * seconds spent in each op, summed over the steps since profiling was
 * turned on (prefill chunks too; steps counts decode calls). */
typedef enum mdl_op {
    MDL_OP_EMBD, MDL_OP_NORM, MDL_OP_QKV, MDL_OP_ATTN, MDL_OP_WO, MDL_OP_GATE_UP, MDL_OP_GLU, MDL_OP_DOWN,
    MDL_OP_HEAD, MDL_OP_N
} mdl_op_t;
typedef struct mdl_profile {
    double s[MDL_OP_N];   /* seconds per op */
    uint64_t steps;       /* decode calls counted */
} mdl_profile_t;
/* Reset the counters; on: count from now (one thread at a time), off: stop. */
void mdl_model_profile(mdl_model_t *m, bool on);
void mdl_model_profile_get(const mdl_model_t *m, mdl_profile_t *p);
/* "qkv", "head", ... */
const char *mdl_op_name(mdl_op_t op);

/* Prefill chunk size (tokens per matrix-matrix pass; default 64). */
void mdl_model_set_chunk(mdl_model_t *m, size_t chunk);

/* A new sequence with room for cap tokens and the given attention backend.
 * cfg NULL = defaults.  Caller frees with mdl_seq_destroy (before the model). */
ri_status_t mdl_seq_create(mdl_model_t *m, const mdl_attn_ops_t *attn, const mdl_attn_cfg_t *cfg, size_t cap,
                           mdl_seq_t **s_p);
void mdl_seq_destroy(mdl_seq_t *s);

/* A new sequence with another backend holding a copy of s's K/V and
 * position, ready to decode from where s stands (the index of the new
 * backend is built at its first decode).  Used to compare methods on one
 * prefill.  Caller frees with mdl_seq_destroy. */
ri_status_t mdl_seq_fork(const mdl_seq_t *s, const mdl_attn_ops_t *attn, const mdl_attn_cfg_t *cfg,
                         mdl_seq_t **fork_p);

/* Preload positions [0, n) of an empty sequence (nothing prefilled yet)
 * from elsewhere, e.g. a prefix prefilled by another sequence: fill writes
 * the K and V (fp16, post-RoPE, [n][d] at token_stride elements a token)
 * of positions [pos0, pos0 + n) of (layer, kv_head), and is called once
 * for every (layer, kv_head) with pos0 = 0.  Then the length is n and
 * mdl_prefill continues at position n.  Errors: RI_ERR_INVALID (the
 * sequence is not empty, n 0, fill NULL), RI_ERR_RANGE (n over the
 * capacity), fill's error (the sequence stays empty). */
ri_status_t mdl_seq_preload(mdl_seq_t *s, size_t n,
                            ri_status_t (*fill)(void *arg, uint32_t layer, uint32_t kv_head, size_t pos0, size_t n,
                                                cm_fp16_t *k, cm_fp16_t *v, size_t token_stride),
                            void *arg);

/* End the prompt: build the backend's index of the sequence's tokens
 * (each global layer's prefill_end) now rather than at the first decode
 * step, which then does not repeat it; e.g. to publish the index of a
 * request that ends before any decode step.  After it the sequence takes
 * no more mdl_prefill, only mdl_decode.  RI_OK at once when built already.
 * Errors: RI_ERR_INVALID (NULL, s not of m), the backend's (the build is
 * then tried again by the next call or decode step). */
/* Switch the giving back of sliding-window layers' old K/V (cfg.release_window)
 * on or off for s from now on; e.g. on once whatever had to read every token
 * (a prefix publish) is done.  The next decode step gives back what is due. */
void mdl_seq_set_release_window(mdl_seq_t *s, bool on);

ri_status_t mdl_seq_build(mdl_model_t *m, mdl_seq_t *s);

/* The backend's wave index of (layer, kv_head) once built (borrowed, valid
 * until the next decode step); NULL when it keeps none (full, quest, a
 * layer not indexed). */
const kn_index_t *mdl_seq_wave_index(const mdl_seq_t *s, uint32_t layer, uint32_t kv_head);

/* Tokens in the sequence so far. */
size_t mdl_seq_len(const mdl_seq_t *s);
/* Room for tokens. */
size_t mdl_seq_cap(const mdl_seq_t *s);
/* The K/V cache (borrowed). */
const mdl_kv_t *mdl_seq_kv(const mdl_seq_t *s);
/* Backend statistics. */
void mdl_seq_attn_stats(const mdl_seq_t *s, mdl_attn_stats_t *st_p);

/* Called at every decode step with each layer's post-RoPE queries
 * [n_heads][head_dim] at position pos (for --dump-kv).  NULL clears. */
typedef void (*mdl_qhook_fn_t)(void *arg, uint32_t layer, size_t pos, const float *q);
void mdl_seq_set_qhook(mdl_seq_t *s, mdl_qhook_fn_t fn, void *arg);

/* Progress of a prefill: done of total tokens. */
typedef void (*mdl_progress_fn_t)(void *arg, size_t done, size_t total);

/* Append n tokens to s (only before its first decode step).  logits_last
 * [n_vocab] (may be NULL) gets the logits of the last token; logits_all
 * [n][n_vocab] (may be NULL) those of every token.  progress may be NULL.
 * Errors: RI_ERR_RANGE when the sequence would exceed its capacity,
 * RI_ERR_INVALID for bad token ids or prefill after decode. */
ri_status_t mdl_prefill(mdl_model_t *m, mdl_seq_t *s, const int32_t *tokens, size_t n, float *logits_last,
                        float *logits_all, mdl_progress_fn_t progress, void *progress_arg);

/* One decode step for a batch: sequence seqs[b] takes token tokens[b];
 * logits [n_seqs][n_vocab].  The first step of a sequence builds its
 * backend's index (prefill_end for every layer). */
ri_status_t mdl_decode(mdl_model_t *m, mdl_seq_t *const *seqs, const int32_t *tokens, size_t n_seqs,
                       float *logits);

/* File name of the default model (installed by `ri model fetch` / `ri setup`). */
#define MDL_DEFAULT_MODEL_FILE "SmolLM2-135M-Instruct.Q4_1.gguf"
/* The second model (deps/setup.d/11-model-gemma3.sh). */
#define MDL_GEMMA3_MODEL_FILE "gemma-3-270m-q4_k_m.gguf"

/* The directory of the named models (copied); programs pass their
 * --model-dir / RI_MODEL_DIR setting (default ~/.cache/retroinfer/models)
 * at start-up, before resolving models.  RI_ERR_RANGE if longer than
 * PATH_MAX (nothing changes). */
ri_status_t mdl_model_set_dir(const char *dir);

/* Apply the process-wide settings of rt (cm_runtime.h) to every layer the
 * model runs on: log level and default pool (cm_runtime_apply), kernel
 * backend (kn_runtime_apply), model directory, AVX-512, activation mode and
 * parallel threshold.  Call once at start-up.  RI_ERR_INVALID / RI_ERR_BUSY
 * / RI_ERR_RANGE with err naming the setting; settings before the bad one
 * may already be applied. */
ri_status_t mdl_runtime_apply(const cm_runtime_t *rt, char *err, size_t errlen);

/* Path of the default model: <model dir>/<file> (mdl_model_set_dir).
 * Always fills buf; RI_ERR_NOT_FOUND when the file is not there (or no
 * directory was set), RI_ERR_RANGE when buf is too small. */
ri_status_t mdl_model_default_path(char *buf, size_t len);

/* The value of a --model flag: a model name ("smollm2-135m" = the default,
 * "gemma3-270m") becomes the path of its file in the model directory (as
 * above); anything else is taken as a path and copied.  name NULL or "" =
 * the default.  RI_ERR_NOT_FOUND when the file is not there (buf still
 * holds the path, for the message), RI_ERR_RANGE when buf is too small. */
ri_status_t mdl_model_resolve(const char *name, char *buf, size_t len);

/* Comma-separated model names mdl_model_resolve knows, for --help. */
const char *mdl_model_names(void);

#endif /* MDL_MODEL_H */
