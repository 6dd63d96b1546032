/*
 * A synthetic model generated from a seed (docs/cuda.md "Synthetic model"):
 * the geometry of a preset (a real model's, e.g. Llama 3 8B, or an awkward
 * small one for tests) with weights w = f(seed, tensor, index)
 * (mdl_synth_gen.h).  The same weights can be written as a GGUF file that
 * the CPU runtime loads (small presets) or generated in device memory by
 * the device engine (mdl_dev_create_synth), so that decode speed at real
 * geometry is measured on a machine that has no model files, and the two
 * paths are checked against each other on a small preset.  Its logits mean
 * nothing.
 *
 * Tensors: every matrix of the llama layout, fp16, uniform in
 * [-a, a) with a = sqrt(3 / cols) (unit variance per output for unit
 * inputs), and fp32 norms in [0.75, 1.25).  A tensor's stream key is
 * derived from the seed and its GGUF name, so each tensor is generated
 * alone.  Tokenizer (gpt2, no merges): the 256 byte-level symbols first,
 * so that any text tokenizes one token a byte, then placeholders "t256", ...
 */
#ifndef MDL_SYNTH_H
#define MDL_SYNTH_H

#include <stddef.h>
#include <stdint.h>

#include "common/cm_half.h"
#include "gpuworker/model/mdl_model.h"
#include "retroinfer/status.h"

/* Largest GGUF mdl_synth_write_gguf writes: the CPU path is only for small
 * presets. */
#define MDL_SYNTH_MAX_GGUF_BYTES (512ull << 20)

/* A geometry (llama architecture, every layer global). */
typedef struct mdl_synth_preset {
    const char *name;        /* "tiny", "llama3-8b" */
    uint32_t n_vocab, n_embd, n_ff, n_layers, n_heads, n_kv_heads, head_dim;
    uint32_t n_ctx;          /* context_length written to the GGUF */
    float rope_theta;        /* rope.freq_base */
    float eps;               /* RMS norm epsilon */
} mdl_synth_preset_t;

/* The preset called name, NULL when there is none (static storage). */
const mdl_synth_preset_t *mdl_synth_preset_find(const char *name);

/* The presets' names, comma separated, for messages. */
const char *mdl_synth_preset_names(void);

/* The hyper-parameters mdl_model_load reads from this preset's GGUF. */
void mdl_synth_hparams(const mdl_synth_preset_t *p, mdl_hparams_t *hp);

/* The stream key of the tensor called name (its GGUF name) under seed. */
uint64_t mdl_synth_tensor_key(uint64_t seed, const char *name);

/* The scale of a matrix of cols columns: sqrt(3 / cols) / 2^23. */
float mdl_synth_scale(size_t cols);

/* Row r of the matrix with key and scale as fp16 values widened to float
 * (what the CPU dequantiser gives for the GGUF's row): out [cols]. */
void mdl_synth_row(uint64_t key, float scale, size_t r, size_t cols, float *out);

/* The device fill kernel's arithmetic on the host, element for element:
 * rows of ld fp16 (ld >= cols, tail zero) into w [rows][ld]. */
void mdl_synth_fill_ref(uint16_t *w, size_t rows, size_t cols, size_t ld, uint64_t key, float scale);

/* A norm of n elements with key into out [n]. */
void mdl_synth_norm_vec(uint64_t key, size_t n, float *out);

/* RoPE angles of position pos as mdl_model_rope_angles computes them for a
 * model with hp (global layers): cs [n_rot]. */
void mdl_synth_rope_angles(const mdl_hparams_t *hp, size_t pos, float *cs);

/* Size in bytes of the GGUF file of preset p. */
uint64_t mdl_synth_gguf_bytes(const mdl_synth_preset_t *p);

/* Write preset p's model under seed to path (created or truncated).
 * RI_ERR_RANGE (nothing written) when the file would exceed
 * MDL_SYNTH_MAX_GGUF_BYTES, RI_ERR_IO on a write error (the partial file
 * is removed), RI_ERR_NOMEM.  err (may be NULL) gets a message. */
ri_status_t mdl_synth_write_gguf(const mdl_synth_preset_t *p, uint64_t seed, const char *path, char *err,
                                 size_t errlen);

#endif /* MDL_SYNTH_H */
