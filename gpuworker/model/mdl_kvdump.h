/*
 * KV capture (ri generate --dump-kv DIR) and its reader, in the format of
 * docs/kv-dump-format.md: per layer one file layer-NNN.rikv holding the
 * post-RoPE K and V of every token (fp16, head-major) and the decode-step
 * queries (fp32) with their positions, plus DIR/meta.json.
 */
#ifndef MDL_KVDUMP_H
#define MDL_KVDUMP_H

#include <stddef.h>
#include <stdint.h>

#include "common/cm_half.h"
#include "gpuworker/model/mdl_model.h"
#include "retroinfer/status.h"

#define MDL_KVDUMP_MAGIC 0x564b4952u   /* "RIKV" little-endian */
#define MDL_KVDUMP_VERSION 1u
#define MDL_KVDUMP_HEADER_BYTES 64u

/* Collects decode queries of one sequence (install with mdl_kvdump_attach). */
typedef struct mdl_kvdump mdl_kvdump_t;

/* Caller frees with mdl_kvdump_destroy. */
ri_status_t mdl_kvdump_create(const mdl_hparams_t *hp, mdl_kvdump_t **d_p);
void mdl_kvdump_destroy(mdl_kvdump_t *d);

/* Install the query hook on s (d must outlive the decode steps). */
void mdl_kvdump_attach(mdl_kvdump_t *d, mdl_seq_t *s);

/* Write DIR/meta.json and DIR/layer-NNN.rikv for every layer (DIR is
 * created).  n_prompt is the prompt length, model_name goes to meta.json. */
ri_status_t mdl_kvdump_write(const mdl_kvdump_t *d, const mdl_seq_t *s, const char *dir, size_t n_prompt,
                             const char *model_name);

/* One layer read back. */
typedef struct mdl_kvdump_layer {
    uint32_t layer, n_heads, n_kv_heads, head_dim;
    uint64_t n_tokens;   /* K/V rows per head */
    uint64_t n_queries;  /* decode steps */
    cm_fp16_t *k, *v;    /* [n_kv_heads][n_tokens][head_dim], owned */
    uint64_t *q_pos;     /* [n_queries] position of each query */
    float *q;            /* [n_queries][n_heads][head_dim], owned */
} mdl_kvdump_layer_t;

/* Read one layer file; RI_ERR_FORMAT/TRUNCATED/BAD_MAGIC with a message in err
 * for a malformed file.  Free with mdl_kvdump_layer_free. */
ri_status_t mdl_kvdump_read_layer(const char *path, mdl_kvdump_layer_t *l_p, char *err, size_t errlen);
void mdl_kvdump_layer_free(mdl_kvdump_layer_t *l);

#endif /* MDL_KVDUMP_H */
