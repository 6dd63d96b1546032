/*
 * The model runtime's decode step on a CUDA device (library ri_model_dev,
 * built only with RI_CUDA; docs/cuda.md "GPU decode path").  Plain C: no
 * CUDA header is needed to use it.
 *
 * A device engine (mdl_dev_t) holds one model's weights in device memory,
 * dequantised once to fp16 by the CPU dequantisers (rows padded to a
 * multiple of 8 elements so that every row starts 16-byte aligned), and the
 * activations of a batch.  A device sequence (mdl_dev_seq_t) is a K/V cache
 * in device memory (fp16, the CPU cache's head-major layout, one
 * allocation for every layer).
 *
 * Prefill stays on the CPU: mdl_prefill fills a CPU sequence, then
 * mdl_dev_seq_upload copies its K/V to a device sequence, which decodes
 * from there on by itself (the CPU sequence is not advanced).  Decode is
 * the model's one forward pass (mdl_forward_run, mdl_backend.h) over this
 * engine's ops, the CUDA backend (llama and gemma3); attention is exact
 * ("full"): the kernels' CUDA attn_decode over the device cache,
 * sliding-window layers over their window.  Programs reach it through
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

/* Device memory held by the weights (bytes), for messages. */
uint64_t mdl_dev_weight_bytes(const mdl_dev_t *d);

/* A device sequence with room for cap tokens; caller frees with
 * mdl_dev_seq_destroy (before the engine). */
ri_status_t mdl_dev_seq_create(mdl_dev_t *d, size_t cap, mdl_dev_seq_t **s_p);
void mdl_dev_seq_destroy(mdl_dev_seq_t *s);

/* Copy cpu's K/V (every layer, its mdl_seq_len tokens) into s, which then
 * stands where cpu stands.  cpu is only read.  RI_ERR_RANGE when s is too
 * small, RI_ERR_INVALID for another model's sequence. */
ri_status_t mdl_dev_seq_upload(mdl_dev_t *d, mdl_dev_seq_t *s, const mdl_seq_t *cpu);

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

/* For tests: the engine's GEMV kernel on host data, y[b][j] = sum_k
 * x[b][k] * w[j][k] for b < n (n <= MDL_DEV_MAX_BATCH), w [rows][k] fp16
 * (unpadded), x [n][k], y [n][rows].  Copies in, pads, runs, copies back.
 * RI_ERR_NO_DEVICE without a device. */
ri_status_t mdl_dev_gemv_host(const cm_fp16_t *w, size_t rows, size_t k, const float *x, size_t n, float *y);

#endif /* MDL_DEV_H */
