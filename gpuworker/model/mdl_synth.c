/*
 * The synthetic model (mdl_synth.h): presets, the generator's host side and
 * the GGUF writer.  The writer streams the file (a small preset is a few
 * hundred KB; the cap keeps the 16 GB presets to the device path).
 */
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "common/cm_alloc.h"
#include "common/cm_status.h"
#include "gpuworker/model/mdl_backend.h"
#include "gpuworker/model/mdl_synth.h"
#include "gpuworker/model/mdl_synth_gen.h"

static CM_ALLOC_TAG(mdl_synth_tag, "model.synth");

/* tiny: the awkward shapes of the tests (hidden size not a multiple of 8,
 * vocabulary not of 4, 3 query heads per KV head, head_dim 14). */
static const mdl_synth_preset_t mdl_synth_presets[] = {
    {.name = "tiny", .n_vocab = 299, .n_embd = 84, .n_ff = 150, .n_layers = 3, .n_heads = 6, .n_kv_heads = 2,
     .head_dim = 14, .n_ctx = 1u << 20, .rope_theta = 10000.0f, .eps = 1e-5f},
    {.name = "llama3-8b", .n_vocab = 128256, .n_embd = 4096, .n_ff = 14336, .n_layers = 32, .n_heads = 32,
     .n_kv_heads = 8, .head_dim = 128, .n_ctx = 1u << 20, .rope_theta = 500000.0f, .eps = 1e-5f},
};

const mdl_synth_preset_t *mdl_synth_preset_find(const char *name)
{
    for (size_t i = 0; name != NULL && i < CM_ARRAY_LEN(mdl_synth_presets); i++)
        if (strcmp(mdl_synth_presets[i].name, name) == 0)
            return &mdl_synth_presets[i];
    return NULL;
}

const char *mdl_synth_preset_names(void)
{
    return "tiny, llama3-8b";
}

void mdl_synth_hparams(const mdl_synth_preset_t *p, mdl_hparams_t *hp)
{
    *hp = (mdl_hparams_t){.arch = MDL_ARCH_LLAMA, .n_layers = p->n_layers, .n_embd = p->n_embd, .n_ff = p->n_ff,
                          .n_heads = p->n_heads, .n_kv_heads = p->n_kv_heads, .head_dim = p->head_dim,
                          .n_rot = p->head_dim, .n_vocab = p->n_vocab, .n_ctx = p->n_ctx,
                          .rope_theta = p->rope_theta, .rope_scale = 1.0f, .eps = p->eps,
                          .rope_theta_swa = p->rope_theta, .embd_scale = 1.0f};
}

uint64_t mdl_synth_tensor_key(uint64_t seed, const char *name)
{
    uint64_t h = 0xcbf29ce484222325ull;   /* FNV-1a of the name */
    for (const unsigned char *c = (const unsigned char *)name; *c != '\0'; c++)
        h = (h ^ *c) * 0x100000001b3ull;
    return mdl_synth_mix(seed ^ mdl_synth_mix(h));
}

float mdl_synth_scale(size_t cols)
{
    return (float)(sqrt(3.0 / (double)cols) / (double)MDL_SYNTH_DRAW_HALF);
}

void mdl_synth_row(uint64_t key, float scale, size_t r, size_t cols, float *out)
{
    for (size_t c = 0; c < cols; c++)
        out[c] = cm_fp16_to_f32(cm_f32_to_fp16(mdl_synth_weight(key, (uint64_t)r * cols + c, scale)));
}

/* Row r as fp16 into out [cols] (round to nearest even, as the kernel's
 * __float2half_rn). */
static void mdl_synth_row16(uint64_t key, float scale, size_t r, size_t cols, uint16_t *out)
{
    for (size_t c = 0; c < cols; c++)
        out[c] = cm_f32_to_fp16(mdl_synth_weight(key, (uint64_t)r * cols + c, scale));
}

void mdl_synth_fill_ref(uint16_t *w, size_t rows, size_t cols, size_t ld, uint64_t key, float scale)
{
    for (size_t r = 0; r < rows; r++) {
        mdl_synth_row16(key, scale, r, cols, w + r * ld);
        memset(w + r * ld + cols, 0, (ld - cols) * sizeof(uint16_t));
    }
}

void mdl_synth_norm_vec(uint64_t key, size_t n, float *out)
{
    for (size_t i = 0; i < n; i++)
        out[i] = mdl_synth_norm(key, i);
}

/* The same expressions as mdl_model.c's frequency table and mdl_rope_table
 * (test_model_synth checks the bits against mdl_model_rope_angles). */
void mdl_synth_rope_angles(const mdl_hparams_t *hp, size_t pos, float *cs)
{
    double p = (double)pos / hp->rope_scale;
    for (uint32_t i = 0; i < hp->n_rot / 2; i++) {
        double a = p * pow((double)hp->rope_theta, -2.0 * i / hp->n_rot);
        cs[2 * i] = (float)cos(a);
        cs[2 * i + 1] = (float)sin(a);
    }
}

/* ---- the GGUF file ---- */

/* One tensor of the file, in file order. */
typedef struct mdl_synth_tensor {
    char name[64];
    uint64_t rows, cols;
    bool f16;                /* matrix (else an fp32 norm) */
} mdl_synth_tensor_t;

/* The file's tensors into t (NULL: count only); returns how many. */
static size_t mdl_synth_tensors(const mdl_synth_preset_t *p, mdl_synth_tensor_t *t)
{
    mdl_hparams_t hp;
    mdl_synth_hparams(p, &hp);
    size_t n = 0;
#define MDL_ST(nm, r, c, h)                                                                                        \
    do {                                                                                                           \
        if (t != NULL)                                                                                             \
            t[n] = (mdl_synth_tensor_t){.rows = (r), .cols = (c), .f16 = (h)}, snprintf(t[n].name, 64, "%s", nm); \
        n++;                                                                                                       \
    } while (0)
    MDL_ST("token_embd.weight", hp.n_vocab, hp.n_embd, true);
    MDL_ST("output_norm.weight", 1, hp.n_embd, false);
    MDL_ST("output.weight", hp.n_vocab, hp.n_embd, true);
    for (uint32_t l = 0; l < hp.n_layers; l++) {
        char nm[64];
        for (int w = 0; w < MDL_W_N; w++) {
            mdl_block_tensor_name(l, &mdl_block_weights[w], nm, sizeof(nm));
            MDL_ST(nm, mdl_dim_size(&hp, mdl_block_weights[w].rows), mdl_dim_size(&hp, mdl_block_weights[w].cols),
                   true);
        }
        for (int v = 0; v < MDL_N_N; v++)
            if (mdl_block_norm_used(&hp, (mdl_nid_t)v)) {
                mdl_block_tensor_name(l, &mdl_block_norms[v], nm, sizeof(nm));
                MDL_ST(nm, 1, mdl_dim_size(&hp, mdl_block_norms[v].cols), false);
            }
    }
#undef MDL_ST
    return n;
}

#define MDL_SYNTH_ALIGN 32u

static uint64_t mdl_synth_tensor_bytes(const mdl_synth_tensor_t *t)
{
    uint64_t b = t->rows * t->cols * (t->f16 ? 2 : 4);
    return (b + MDL_SYNTH_ALIGN - 1) / MDL_SYNTH_ALIGN * MDL_SYNTH_ALIGN;
}

/* A streaming writer: the first error sticks. */
typedef struct mdl_synth_out {
    FILE *f;
    uint64_t n;     /* bytes written */
    bool failed;
} mdl_synth_out_t;

static void mdl_so_put(mdl_synth_out_t *o, const void *p, size_t n)
{
    if (!o->failed && n > 0 && fwrite(p, 1, n, o->f) != n)
        o->failed = true;
    o->n += n;
}
static void mdl_so_u32(mdl_synth_out_t *o, uint32_t v)
{
    mdl_so_put(o, &v, 4);
}
static void mdl_so_u64(mdl_synth_out_t *o, uint64_t v)
{
    mdl_so_put(o, &v, 8);
}
static void mdl_so_str(mdl_synth_out_t *o, const char *s)
{
    mdl_so_u64(o, strlen(s));
    mdl_so_put(o, s, strlen(s));
}
static void mdl_so_pad(mdl_synth_out_t *o)
{
    static const uint8_t zeros[MDL_SYNTH_ALIGN];
    mdl_so_put(o, zeros, (MDL_SYNTH_ALIGN - o->n % MDL_SYNTH_ALIGN) % MDL_SYNTH_ALIGN);
}
/* key/value pairs (GGUF value types 4 = u32, 6 = f32, 8 = string) */
static void mdl_so_kv_u32(mdl_synth_out_t *o, const char *k, uint32_t v)
{
    mdl_so_str(o, k);
    mdl_so_u32(o, 4);
    mdl_so_u32(o, v);
}
static void mdl_so_kv_f32(mdl_synth_out_t *o, const char *k, float v)
{
    mdl_so_str(o, k);
    mdl_so_u32(o, 6);
    mdl_so_put(o, &v, 4);
}
static void mdl_so_kv_str(mdl_synth_out_t *o, const char *k, const char *v)
{
    mdl_so_str(o, k);
    mdl_so_u32(o, 8);
    mdl_so_str(o, v);
}

#define MDL_SYNTH_N_KV 14   /* the keys mdl_synth_header writes */

static bool mdl_synth_byte_printable(uint32_t b)
{
    return (b >= 33 && b <= 126) || (b >= 161 && b <= 172) || (b >= 174 && b <= 255);
}

/* Token i's text: for i < 256 the byte-level BPE symbol of byte i (GPT-2's
 * byte-to-unicode map, UTF-8), so that any text tokenizes (one token a
 * byte); above, a placeholder "t<i>". */
static void mdl_synth_token_text(uint32_t i, char *out, size_t len)
{
    if (i >= 256) {
        snprintf(out, len, "t%u", i);
        return;
    }
    uint32_t cp = i;
    if (!mdl_synth_byte_printable(i)) {
        cp = 256;
        for (uint32_t x = 0; x < i; x++)
            cp += !mdl_synth_byte_printable(x);
    }
    if (cp < 0x80)
        snprintf(out, len, "%c", (char)cp);
    else   /* < 0x800: two bytes */
        snprintf(out, len, "%c%c", (char)(0xc0 | (cp >> 6)), (char)(0x80 | (cp & 0x3f)));
}

/* Magic, version, counts, metadata and the tensor infos. */
static void mdl_synth_header(mdl_synth_out_t *o, const mdl_synth_preset_t *p, const mdl_synth_tensor_t *t,
                             size_t nt)
{
    char name[64];
    mdl_so_u32(o, 0x46554747u);   /* "GGUF" */
    mdl_so_u32(o, 3);
    mdl_so_u64(o, nt);
    mdl_so_u64(o, MDL_SYNTH_N_KV);
    mdl_so_kv_str(o, "general.architecture", "llama");
    snprintf(name, sizeof(name), "synthetic %s", p->name);
    mdl_so_kv_str(o, "general.name", name);
    mdl_so_kv_u32(o, "llama.block_count", p->n_layers);
    mdl_so_kv_u32(o, "llama.embedding_length", p->n_embd);
    mdl_so_kv_u32(o, "llama.feed_forward_length", p->n_ff);
    mdl_so_kv_u32(o, "llama.attention.head_count", p->n_heads);
    mdl_so_kv_u32(o, "llama.attention.head_count_kv", p->n_kv_heads);
    mdl_so_kv_u32(o, "llama.attention.key_length", p->head_dim);
    mdl_so_kv_u32(o, "llama.context_length", p->n_ctx);
    mdl_so_kv_f32(o, "llama.rope.freq_base", p->rope_theta);
    mdl_so_kv_f32(o, "llama.attention.layer_norm_rms_epsilon", p->eps);
    mdl_so_kv_str(o, "tokenizer.ggml.model", "gpt2");
    mdl_so_str(o, "tokenizer.ggml.tokens");
    mdl_so_u32(o, 9);   /* array of strings */
    mdl_so_u32(o, 8);
    mdl_so_u64(o, p->n_vocab);
    for (uint32_t i = 0; i < p->n_vocab; i++) {
        char tok[16];
        mdl_synth_token_text(i, tok, sizeof(tok));
        mdl_so_str(o, tok);
    }
    mdl_so_str(o, "tokenizer.ggml.merges");
    mdl_so_u32(o, 9);
    mdl_so_u32(o, 8);
    mdl_so_u64(o, 0);
    uint64_t off = 0;
    for (size_t i = 0; i < nt; i++) {
        mdl_so_str(o, t[i].name);
        mdl_so_u32(o, t[i].f16 ? 2 : 1);   /* dims, innermost first */
        mdl_so_u64(o, t[i].cols);
        if (t[i].f16)
            mdl_so_u64(o, t[i].rows);
        mdl_so_u32(o, t[i].f16 ? 1 : 0);   /* GGML type F16 / F32 */
        mdl_so_u64(o, off);
        off += mdl_synth_tensor_bytes(&t[i]);
    }
    mdl_so_pad(o);
}

/* Tensor t's data, row by row, then the alignment pad. */
static void mdl_synth_data(mdl_synth_out_t *o, uint64_t seed, const mdl_synth_tensor_t *t, uint16_t *row16,
                           float *row32)
{
    uint64_t key = mdl_synth_tensor_key(seed, t->name);
    if (!t->f16) {
        mdl_synth_norm_vec(key, t->cols, row32);
        mdl_so_put(o, row32, t->cols * sizeof(float));
    } else {
        float scale = mdl_synth_scale(t->cols);
        for (uint64_t r = 0; r < t->rows; r++) {
            mdl_synth_row16(key, scale, r, t->cols, row16);
            mdl_so_put(o, row16, t->cols * sizeof(uint16_t));
        }
    }
    mdl_so_pad(o);
}

uint64_t mdl_synth_gguf_bytes(const mdl_synth_preset_t *p)
{
    mdl_synth_tensor_t *t = cm_calloc(&mdl_synth_tag, mdl_synth_tensors(p, NULL), sizeof(*t));
    if (t == NULL)
        return UINT64_MAX;
    size_t nt = mdl_synth_tensors(p, t);
    mdl_synth_out_t o = {.failed = true};   /* counts only */
    mdl_synth_header(&o, p, t, nt);
    for (size_t i = 0; i < nt; i++)
        o.n += mdl_synth_tensor_bytes(&t[i]);
    cm_free(t);
    return o.n;
}

ri_status_t mdl_synth_write_gguf(const mdl_synth_preset_t *p, uint64_t seed, const char *path, char *err,
                                 size_t errlen)
{
    uint64_t bytes = mdl_synth_gguf_bytes(p);
    if (bytes > MDL_SYNTH_MAX_GGUF_BYTES)
        return mdl_errf(err, errlen, RI_ERR_RANGE,
                        "synth: preset %s would be a %.1f GB file; GGUF files are for presets under %llu MB",
                        p->name, (double)bytes / 1e9, (unsigned long long)(MDL_SYNTH_MAX_GGUF_BYTES >> 20));
    size_t nt = mdl_synth_tensors(p, NULL), widest = CM_MAX(p->n_embd, p->n_ff);
    mdl_synth_tensor_t *t = cm_calloc(&mdl_synth_tag, nt, sizeof(*t));
    uint16_t *row16 = cm_malloc(&mdl_synth_tag, widest * sizeof(uint16_t));
    float *row32 = cm_malloc(&mdl_synth_tag, widest * sizeof(float));
    ri_status_t st = RI_OK;
    mdl_synth_out_t o = {0};
    if (t == NULL || row16 == NULL || row32 == NULL) {
        st = RI_ERR_NOMEM;
        goto cleanup;
    }
    mdl_synth_tensors(p, t);
    if ((o.f = fopen(path, "wb")) == NULL) {
        st = mdl_errf(err, errlen, RI_ERR_IO, "synth: cannot create %s: %s", path, strerror(errno));
        goto cleanup;
    }
    mdl_synth_header(&o, p, t, nt);
    for (size_t i = 0; i < nt && !o.failed; i++)
        mdl_synth_data(&o, seed, &t[i], row16, row32);
    if (fclose(o.f) != 0 || o.failed) {
        st = mdl_errf(err, errlen, RI_ERR_IO, "synth: cannot write %s: %s", path, strerror(errno));
        unlink(path);
    }
cleanup:
    cm_free(t);
    cm_free(row16);
    cm_free(row32);
    return st;
}
