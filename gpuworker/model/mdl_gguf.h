/*
 * GGUF v2/v3 reader: header, metadata (every value type, arrays included),
 * tensor infos, alignment, and the tensor data read-only in memory.  The whole
 * file is validated at open: every count, length, offset and size is checked
 * against the file size and for overflow, unknown value and tensor types are
 * refused.  A malformed file is RI_ERR_FORMAT (or RI_ERR_TRUNCATED) with a
 * message in err, never a crash.  Workload: opened once per process, read by
 * the model loader and the tokenizer; the parser is also fed random bytes by
 * the fuzz target (tests/model/fuzz_gguf.c).
 */
#ifndef MDL_GGUF_H
#define MDL_GGUF_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "retroinfer/status.h"

/* GGUF metadata value types (the file's numbering). */
typedef enum mdl_gguf_vtype {
    MDL_GGUF_U8 = 0, MDL_GGUF_I8 = 1, MDL_GGUF_U16 = 2, MDL_GGUF_I16 = 3,
    MDL_GGUF_U32 = 4, MDL_GGUF_I32 = 5, MDL_GGUF_F32 = 6, MDL_GGUF_BOOL = 7,
    MDL_GGUF_STRING = 8, MDL_GGUF_ARRAY = 9, MDL_GGUF_U64 = 10, MDL_GGUF_I64 = 11,
    MDL_GGUF_F64 = 12,
    MDL_GGUF_VTYPE_COUNT
} mdl_gguf_vtype_t;

/* ggml tensor types we know the size of (the file's numbering). */
typedef enum mdl_ggml_type {
    MDL_GGML_F32 = 0, MDL_GGML_F16 = 1, MDL_GGML_Q4_0 = 2, MDL_GGML_Q4_1 = 3,
    MDL_GGML_Q5_0 = 6, MDL_GGML_Q5_1 = 7, MDL_GGML_Q8_0 = 8, MDL_GGML_Q8_1 = 9,
    MDL_GGML_Q2_K = 10, MDL_GGML_Q3_K = 11, MDL_GGML_Q4_K = 12, MDL_GGML_Q5_K = 13,
    MDL_GGML_Q6_K = 14, MDL_GGML_Q8_K = 15, MDL_GGML_I8 = 24, MDL_GGML_I16 = 25,
    MDL_GGML_I32 = 26, MDL_GGML_I64 = 27, MDL_GGML_F64 = 28, MDL_GGML_BF16 = 30,
} mdl_ggml_type_t;

/* A string inside the mapped file: not NUL-terminated. */
typedef struct mdl_gguf_str {
    const char *ptr;  /* borrowed from the mapping */
    uint64_t len;     /* bytes */
} mdl_gguf_str_t;

/* One metadata key/value. */
typedef struct mdl_gguf_kv {
    mdl_gguf_str_t key;           /* the key */
    mdl_gguf_vtype_t type;        /* value type */
    union {
        uint64_t u;               /* unsigned integers and bool */
        int64_t i;                /* signed integers */
        double f;                 /* f32 and f64 */
        mdl_gguf_str_t s;         /* string */
    } v;
    mdl_gguf_vtype_t arr_type;    /* element type of an array */
    uint64_t arr_n;               /* element count of an array */
    const void *arr_data;         /* fixed-size elements (little-endian, unaligned) */
    mdl_gguf_str_t *arr_str;      /* string elements (owned), NULL otherwise */
} mdl_gguf_kv_t;

/* One tensor: shape in ggml order (ne[0] is the contiguous row length). */
typedef struct mdl_gguf_tensor {
    mdl_gguf_str_t name;   /* tensor name */
    uint32_t n_dims;       /* 1..4 */
    uint64_t ne[4];        /* elements per dimension; unused ones are 1 */
    mdl_ggml_type_t type;  /* storage type */
    uint64_t offset;       /* from the start of the data section */
    uint64_t n_bytes;      /* storage size */
    const void *data;      /* in the mapping */
} mdl_gguf_tensor_t;

typedef struct mdl_gguf {
    uint32_t version;          /* 2 or 3 */
    uint64_t n_kv;             /* metadata entries */
    mdl_gguf_kv_t *kv;         /* owned */
    uint64_t n_tensors;        /* tensors */
    mdl_gguf_tensor_t *tensors; /* owned */
    uint64_t alignment;        /* general.alignment or 32 */
    const uint8_t *base;       /* the file's bytes */
    size_t size;               /* file size */
    bool mapped;               /* base is an mmap we unmap */
    size_t map_len;            /* its length (the file size rounded up) */
} mdl_gguf_t;

/* Open and validate a GGUF file, read into anonymous memory that asks for
 * transparent huge pages (MADV_HUGEPAGE) and is then made read-only: decode
 * streams every weight each step, and on 4 KiB pages of a file mapping it
 * pays a TLB miss and a restart of the hardware prefetcher every 4 KiB (a
 * streamed Q8_0 product on one core: 16.4 GB/s, 21 on huge pages).  The
 * copy is private to the process (was: the page cache, shared); where the
 * memory cannot be had the file is mapped as before.  On error *g_p is
 * untouched and err (if not NULL) holds a message.  Caller frees with
 * mdl_gguf_close. */
ri_status_t mdl_gguf_open(const char *path, mdl_gguf_t **g_p, char *err, size_t errlen);

/* On: mdl_gguf_open maps the file instead (the page cache, shared by every
 * process that opens it: several workers of one model on a host).  Programs
 * pass their --model-load map / RI_MODEL_LOAD=map setting at start-up. */
void mdl_gguf_set_load_map(bool on);

/* Parse a GGUF image in memory (borrowed: must outlive the result); the same
 * validation as mdl_gguf_open.  Used by the fuzz target and the tests. */
ri_status_t mdl_gguf_open_mem(const void *buf, size_t len, mdl_gguf_t **g_p, char *err, size_t errlen);

/* Unmap and free; NULL is a no-op. */
void mdl_gguf_close(mdl_gguf_t *g);

/* Metadata lookup by key; NULL when absent. */
const mdl_gguf_kv_t *mdl_gguf_find(const mdl_gguf_t *g, const char *key);

/* Typed getters: RI_ERR_NOT_FOUND when absent, RI_ERR_FORMAT when the type
 * does not fit (any integer type converts when the value is in range). */
ri_status_t mdl_gguf_get_u64(const mdl_gguf_t *g, const char *key, uint64_t *v_p);
ri_status_t mdl_gguf_get_f32(const mdl_gguf_t *g, const char *key, float *v_p);
ri_status_t mdl_gguf_get_bool(const mdl_gguf_t *g, const char *key, bool *v_p);
/* A string value as a new NUL-terminated copy; caller frees with cm_free. */
ri_status_t mdl_gguf_get_str(const mdl_gguf_t *g, const char *key, char **s_p);

/* Tensor lookup by name; NULL when absent. */
const mdl_gguf_tensor_t *mdl_gguf_tensor(const mdl_gguf_t *g, const char *name);

/* Name of a tensor type ("q4_1"), or "?" */
const char *mdl_ggml_type_name(mdl_ggml_type_t t);

/* Block geometry of a tensor type: elements per block and bytes per block;
 * false for unknown types. */
bool mdl_ggml_type_block(mdl_ggml_type_t t, uint32_t *block_elems_p, uint32_t *block_bytes_p);

/* Size in bytes of a value of a fixed-size metadata type; 0 for string/array. */
size_t mdl_gguf_vtype_size(mdl_gguf_vtype_t t);

#endif /* MDL_GGUF_H */
