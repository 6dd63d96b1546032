/*
 * Where decode runs, chosen once (library ri_model_device; docs/model.md
 * "Backends").  A program opens a device by name and from then on calls
 * these functions only, whatever the build: "cpu" is the model runtime
 * itself (mdl_decode on the CPU sequences; the device handle is NULL),
 * "cuda" the device engine of mdl_dev.h (the CUDA backend of the one forward
 * pass), present only in a build with CUDA.  This file's implementation is
 * the only place that knows which devices a build has.
 *
 * A device sequence (opaque, void *) is made empty (mdl_device_seq_new)
 * and prefilled on the device (mdl_device_prefill, chunk by chunk), or made
 * from a CPU sequence's K/V: all of it, ready to decode
 * (mdl_device_seq_adopt), or a prefix that the device prefill then
 * continues (mdl_device_seq_load, e.g. blocks attached from the kvstore).
 * It decodes with the attention it names: "cuda" decodes "full" and
 * "retroinfer" (its wave index on the device, mdl_dev.h, built at adopt or
 * at the first decode step after a device prefill).  Its K/V come back to
 * the host with mdl_device_seq_download (to publish prefix blocks, or to
 * fork the prompt into another attention).  With the CPU (dev NULL) there
 * are no device sequences: mdl_prefill and mdl_decode on CPU sequences.
 */
#ifndef MDL_DEVICE_H
#define MDL_DEVICE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "gpuworker/model/mdl_model.h"
#include "retroinfer/status.h"

typedef struct mdl_device mdl_device_t;

/* Whether this build has the device called name ("cpu" always). */
bool mdl_device_built(const char *name);

/* Open the device called name for m (borrowed; it must outlive the device).
 * "cpu": *dev_p = NULL (decode stays with mdl_decode).  Errors:
 * RI_ERR_INVALID for an unknown name, RI_ERR_UNSUPPORTED for a device this
 * build lacks, or the device's own (mdl_dev_create's); err (may be NULL)
 * says why.  Caller closes with mdl_device_close, before m. */
ri_status_t mdl_device_open(const char *name, const mdl_model_t *m, mdl_device_t **dev_p, char *err, size_t errlen);
void mdl_device_close(mdl_device_t *dev);

/* "cpu" for NULL, else the device's name. */
const char *mdl_device_name(const mdl_device_t *dev);
/* Bytes of weights the device holds (0 for the CPU). */
uint64_t mdl_device_weight_bytes(const mdl_device_t *dev);

/* Whether the device called name decodes with the attention backend
 * called attn: "cpu" every one; "cuda" "full", "retroinfer" and every
 * registered backend that declares device_ok (mdl_attn.h), e.g. the
 * worker's "retroinfer-remote" once it is configured. */
bool mdl_device_takes(const char *name, const char *attn);
/* The attention backends the device called name decodes with, for
 * messages ("every backend" for the CPU). */
const char *mdl_device_attns(const char *name);

/* A device sequence holding cpu's K/V (cpu only read) that decodes with
 * attention attn, settings cfg (borrowed for the call; "retroinfer" builds
 * its index from the device copy here), into *dseq_p (caller frees with
 * mdl_device_seq_free); with dev NULL, *dseq_p = NULL and RI_OK.
 * RI_ERR_UNSUPPORTED for an attention or settings the device does not
 * take (logged with the reason). */
ri_status_t mdl_device_seq_adopt(mdl_device_t *dev, const mdl_seq_t *cpu, const char *attn,
                                 const mdl_attn_cfg_t *cfg, void **dseq_p);
/* An empty device sequence with room for cap tokens that decodes with
 * attention attn, settings cfg (borrowed for the call), into *dseq_p
 * (caller frees with mdl_device_seq_free); with dev NULL, *dseq_p = NULL
 * and RI_OK.  Errors as mdl_device_seq_adopt. */
ri_status_t mdl_device_seq_new(mdl_device_t *dev, const char *attn, const mdl_attn_cfg_t *cfg, size_t cap,
                               void **dseq_p);
/* Copy cpu's K/V (its mdl_seq_len tokens; cpu only read) into the empty
 * device sequence dseq, which then takes more mdl_device_prefill; a
 * "retroinfer" sequence is indexed at its first decode step.
 * RI_ERR_INVALID with dev NULL; else mdl_dev_seq_load's errors. */
ri_status_t mdl_device_seq_load(mdl_device_t *dev, void *dseq, const mdl_seq_t *cpu);
/* Prefill tokens[0, n) into dseq on the device (exact causal attention,
 * several tokens a step); logits (host [n_vocab], may be NULL) gets the
 * last token's.  RI_ERR_INVALID with dev NULL or bad tokens, RI_ERR_RANGE
 * when dseq has no room; RI_ERR_DEVICE on a device error. */
ri_status_t mdl_device_prefill(mdl_device_t *dev, void *dseq, const int32_t *tokens, size_t n, float *logits);
/* Copy dseq's K/V down into cpu, an empty CPU sequence of the same model
 * with room for them (its length is then dseq's).  RI_ERR_INVALID with dev
 * NULL, a non-empty cpu or an empty dseq; RI_ERR_RANGE when cpu is too
 * small; RI_ERR_DEVICE (cpu then stays empty). */
ri_status_t mdl_device_seq_download(mdl_device_t *dev, const void *dseq, mdl_seq_t *cpu);
void mdl_device_seq_free(mdl_device_t *dev, void *dseq);
/* Tokens in a device sequence. */
size_t mdl_device_seq_len(const mdl_device_t *dev, const void *dseq);

/* One decode step of n device sequences (mdl_decode's contract; logits
 * [n][n_vocab] in host memory).  RI_ERR_INVALID with dev NULL. */
ri_status_t mdl_device_decode(mdl_device_t *dev, void *const *dseqs, const int32_t *tokens, size_t n, float *logits);

#endif /* MDL_DEVICE_H */
