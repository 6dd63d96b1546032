/*
 * Where decode runs, chosen once (library ri_model_device; docs/model.md
 * "Backends").  A program opens a device by name and from then on calls
 * these functions only, whatever the build: "cpu" is the model runtime
 * itself (mdl_decode on the CPU sequences; the device handle is NULL),
 * "cuda" the device engine of mdl_dev.h (the CUDA backend of the one forward
 * pass), present only in a build with CUDA.  This file's implementation is
 * the only place that knows which devices a build has.
 *
 * Prefill stays on the CPU: a CPU sequence is prefilled, then
 * mdl_device_seq_adopt copies it to a device sequence that decodes from
 * there on.  Device sequences are opaque (void *).
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

/* A device sequence holding cpu's K/V (cpu only read), into *dseq_p (caller
 * frees with mdl_device_seq_free); with dev NULL, *dseq_p = NULL and RI_OK. */
ri_status_t mdl_device_seq_adopt(mdl_device_t *dev, const mdl_seq_t *cpu, void **dseq_p);
void mdl_device_seq_free(mdl_device_t *dev, void *dseq);
/* Tokens in a device sequence. */
size_t mdl_device_seq_len(const mdl_device_t *dev, const void *dseq);

/* One decode step of n device sequences (mdl_decode's contract; logits
 * [n][n_vocab] in host memory).  RI_ERR_INVALID with dev NULL. */
ri_status_t mdl_device_decode(mdl_device_t *dev, void *const *dseqs, const int32_t *tokens, size_t n, float *logits);

#endif /* MDL_DEVICE_H */
