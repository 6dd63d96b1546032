/*
 * The model runtime's decode step on a CUDA device (library ri_model_dev,
 * built only with RI_CUDA; docs/cuda.md "GPU decode path").  Plain C: no
 * CUDA header is needed to use it.
 *
 * A device engine (mdl_dev_t) holds one model's weights in device memory,
 * dequantised once to fp16 by the CPU dequantisers (rows padded to a
 * multiple of 8 elements so that every row starts 16-byte aligned), and the
 * activations of a batch.  A device sequence (mdl_dev_seq_t) is a K/V cache
 * in device memory (fp16, head-major [n_kv_heads][cap][d] per layer, one
 * allocation for every layer; the CPU cache is token-major, and a load or
 * download gathers each head's run).
 *
 * A device sequence is filled either on the device (mdl_dev_prefill: the
 * forward pass over up to MDL_DEV_MAX_BATCH consecutive tokens a step, each
 * row attending exactly and causally up to its own position) or from a CPU
 * sequence (mdl_prefill, then mdl_dev_seq_upload copies its K/V; the CPU
 * sequence is not advanced), and decodes from there on by itself.  Prefill
 * and decode are the model's one forward pass (mdl_forward_run,
 * mdl_backend.h) over this engine's ops, the CUDA backend (llama and
 * gemma3).  Attention is "full"
 * (exact: the kernels' CUDA attn_decode over the device cache) or
 * "retroinfer" (a global layer's wave index lives on the device and each
 * step is one wave_step of the kernels, mdl_dwave.h; the index is built at
 * upload, or at the first decode step after a device prefill, from the
 * device cache, and updated as decoding goes), or a registered backend
 * that declares device_ok (mdl_attn.h: "retroinfer-remote", its block
 * cache in device memory; it reads this cache through the cuda space,
 * with host q and out); either way sliding-window layers attend exactly
 * over their window.  The retroinfer paths are checked on the CPU through
 * the host space (test_model_dwave, test_model_dev_host,
 * test_model_dev_remote_host), not yet on a GPU.  Programs reach it through
 * mdl_device.h, which chooses the device once.  The token
 * embedding row and the RoPE angles are computed on the host exactly as the
 * CPU path computes them and uploaded with each step (a few KB).
 *
 * Checked on an H200 with synthetic models (test_model_dev; docs/cuda.md).  One engine per process and thread:
 * every call runs on the calling thread's CUDA stream and waits for it.
 */
#ifndef MDL_DEV_H
#define MDL_DEV_H

#include <stddef.h>
#include <stdint.h>

#include "common/cm_half.h"
#include "gpuworker/model/mdl_model.h"
#include "gpuworker/model/mdl_synth.h"
#include "retroinfer/status.h"

/* Most sequences one device step carries; mdl_dev_decode splits larger
 * batches into steps of this size. */
#define MDL_DEV_MAX_BATCH 8

typedef struct mdl_dev mdl_dev_t;
typedef struct mdl_dev_seq mdl_dev_seq_t;

/* Upload m's weights (m is borrowed and must outlive the engine: the
 * embedding rows are read from its mapping at every step).  It calls
 * kn_cuda_init(), which also makes the CUDA backend the process's
 * kn_ops_default() unless RI_KERNELS names another.  Errors:
 * RI_ERR_NO_DEVICE without a usable CUDA device, RI_ERR_UNSUPPORTED for a
 * geometry the device attention does not take (more than 8 query heads per
 * KV head, head_dim > 256), RI_ERR_NOMEM, RI_ERR_DEVICE.  err (may be NULL)
 * gets a message.  Caller frees with mdl_dev_destroy. */
ri_status_t mdl_dev_create(const mdl_model_t *m, mdl_dev_t **d_p, char *err, size_t errlen);
void mdl_dev_destroy(mdl_dev_t *d);

/* An engine over the synthetic model of preset p under seed (mdl_synth.h;
 * p is static storage): its weight matrices generated in device memory by
 * a kernel (the bits mdl_synth_write_gguf writes), the embedding rows and
 * RoPE angles computed on the host at every step; no model file, no host
 * copy of the weights.  Errors as mdl_dev_create; RI_ERR_NOMEM when the
 * weights do not fit.  Caller frees with mdl_dev_destroy. */
ri_status_t mdl_dev_create_synth(const mdl_synth_preset_t *p, uint64_t seed, mdl_dev_t **d_p, char *err,
                                 size_t errlen);

/* The engine's hyper-parameters (borrowed, valid while it lives). */
const mdl_hparams_t *mdl_dev_hparams(const mdl_dev_t *d);

/* Device memory held by the weights (bytes), for messages. */
uint64_t mdl_dev_weight_bytes(const mdl_dev_t *d);

/* A device sequence with room for cap tokens decoding with attention attn:
 * "full", "retroinfer" with the wave settings of cfg, or a registered
 * backend that declares device_ok (mdl_attn.h; "retroinfer-remote"),
 * created with cfg (wave.ops = the engine's kernels, prefix = NULL) over a
 * view of the device cache and indexed where "retroinfer" is (cfg borrowed
 * for the call; may be NULL for "full").  Errors: RI_ERR_UNSUPPORTED for
 * another attn, or settings the device's wave_step does not do (adapt_tau
 * > 0; err says which), RI_ERR_INVALID, RI_ERR_NOMEM, RI_ERR_DEVICE, the
 * backend's create errors; err (may be NULL) gets a message.  Caller frees
 * with mdl_dev_seq_destroy (before the engine). */
ri_status_t mdl_dev_seq_create_attn(mdl_dev_t *d, size_t cap, const char *attn, const mdl_attn_cfg_t *cfg,
                                    mdl_dev_seq_t **s_p, char *err, size_t errlen);
/* The same for "full". */
ri_status_t mdl_dev_seq_create(mdl_dev_t *d, size_t cap, mdl_dev_seq_t **s_p);
void mdl_dev_seq_destroy(mdl_dev_seq_t *s);

/* Copy cpu's K/V (every layer, its mdl_seq_len tokens) into s, which then
 * stands where cpu stands; a "retroinfer" sequence then builds each global
 * layer's wave index from the device copy (once: a second upload is
 * RI_ERR_INVALID, and after an error the sequence is to be destroyed).
 * cpu is only read.  RI_ERR_RANGE when s is too small, RI_ERR_INVALID for
 * another model's sequence. */
ri_status_t mdl_dev_seq_upload(mdl_dev_t *d, mdl_dev_seq_t *s, const mdl_seq_t *cpu);

/* mdl_dev_seq_upload without the index: cpu's K/V copied into s, which
 * then stands where cpu stands and may take more mdl_dev_prefill (a prefix
 * held on the host, e.g. attached from the kvstore, then the rest of the
 * prompt on the device); a "retroinfer" sequence is indexed at its next
 * decode step, as after a device prefill.  Errors as mdl_dev_seq_upload. */
ri_status_t mdl_dev_seq_load(mdl_dev_t *d, mdl_dev_seq_t *s, const mdl_seq_t *cpu);

/* Copy s's K/V (every layer, its mdl_dev_seq_len tokens) down into cpu, an
 * empty CPU sequence of the same model with room for them (mdl_seq_preload:
 * its length is then s's, and mdl_prefill or mdl_seq_build go on from
 * there); e.g. to publish a device-prefilled prompt's blocks, or to fork
 * it into another attention.  s is only read.  RI_ERR_INVALID when cpu is
 * not empty, s is, or the geometries differ; RI_ERR_RANGE when cpu is too
 * small; RI_ERR_DEVICE on a CUDA error (cpu then stays empty). */
ri_status_t mdl_dev_seq_download(mdl_dev_t *d, const mdl_dev_seq_t *s, mdl_seq_t *cpu);

/* s's attention figures since it was created (mdl_attn_stats_t's meaning:
 * global layers only, as the CPU backends count them). */
void mdl_dev_seq_attn_stats(const mdl_dev_seq_t *s, mdl_attn_stats_t *st_p);

/* Device bytes s holds: its K/V cache (every layer, its room) and, for
 * "retroinfer", its wave indexes as they stand (metadata and
 * cluster-major K/V), for reports. */
uint64_t mdl_dev_seq_bytes(const mdl_dev_seq_t *s);

/* Fill s with n tokens (n <= its room) of clustered synthetic K/V
 * (kn_synth.h: sinks, heavy hitters, drifting low-rank keys) under seed, as
 * if n tokens had been prefilled: a long context without a prefill.  One
 * tile of up to 16K tokens is generated on the host and repeated along the
 * sequence and into every layer on the device.  RI_ERR_RANGE when n
 * exceeds the room, RI_ERR_INVALID for n 0 or another engine's sequence. */
ri_status_t mdl_dev_seq_fill_synth(mdl_dev_t *d, mdl_dev_seq_t *s, size_t n, uint64_t seed);

/* Tokens in s / its room. */
size_t mdl_dev_seq_len(const mdl_dev_seq_t *s);
size_t mdl_dev_seq_cap(const mdl_dev_seq_t *s);

/* One decode step: seqs[b] takes tokens[b]; logits [n][n_vocab] in host
 * memory.  Same checks as mdl_decode (RI_ERR_RANGE when a sequence is full,
 * RI_ERR_INVALID for bad tokens or a sequence twice in the batch);
 * RI_ERR_DEVICE on a CUDA error (the step's sequences are then not
 * advanced, but their cache row at the step's position may be written). */
ri_status_t mdl_dev_decode(mdl_dev_t *d, mdl_dev_seq_t *const *seqs, const int32_t *tokens, size_t n,
                           float *logits);

/* Prefill on the device: tokens[0, n) appended to s (positions from its
 * length on), exact causal attention whatever s's method, MDL_DEV_MAX_BATCH
 * tokens a step (each weight read once per step); logits (host, [n_vocab],
 * may be NULL) gets the last token's.  A "retroinfer" sequence is indexed
 * at its next decode step.  RI_ERR_INVALID for bad tokens, RI_ERR_RANGE
 * when s has no room for n more; RI_ERR_DEVICE on a CUDA error, after which
 * s holds the steps that completed (mdl_dev_seq_len says how many). */
ri_status_t mdl_dev_prefill(mdl_dev_t *d, mdl_dev_seq_t *s, const int32_t *tokens, size_t n, float *logits);

/* For tests: the engine's GEMV kernel on host data, y[b][j] = sum_k
 * x[b][k] * w[j][k] for b < n (n <= MDL_DEV_MAX_BATCH), w [rows][k] fp16
 * (unpadded), x [n][k], y [n][rows].  Copies in, pads, runs, copies back.
 * RI_ERR_NO_DEVICE without a device. */
ri_status_t mdl_dev_gemv_host(const cm_fp16_t *w, size_t rows, size_t k, const float *x, size_t n, float *y);

#endif /* MDL_DEV_H */
