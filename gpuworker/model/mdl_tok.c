/*
 * Byte-level BPE (see mdl_tok.h).  Text -> special-token split -> digit split
 * and GPT-2 regex pre-tokens -> bytes mapped to the GPT-2 "printable" alphabet
 * -> BPE merges by rank -> ids.  Vocabulary and merges live in two open-address
 * hash tables over one string arena.
 */
#include "gpuworker/model/mdl_tok.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/cm_alloc.h"
#include "common/cm_log.h"
#include "common/cm_status.h"

static CM_ALLOC_TAG(mdl_tok_tag, "model.tokenizer");

enum { MDL_TT_NORMAL = 1, MDL_TT_UNKNOWN = 2, MDL_TT_CONTROL = 3, MDL_TT_USER = 4, MDL_TT_UNUSED = 5, MDL_TT_BYTE = 6 };

typedef struct mdl_hent {
    const char *s;   /* key bytes (in the arena) */
    uint32_t len;    /* key length */
    int32_t val;     /* id or merge rank; -1 = empty slot */
} mdl_hent_t;

typedef struct mdl_htab {
    mdl_hent_t *e;   /* slots */
    size_t mask;     /* capacity - 1 */
} mdl_htab_t;

typedef struct mdl_special {
    int32_t id;      /* token id */
    const char *s;   /* text */
    uint32_t len;    /* bytes */
} mdl_special_t;

struct mdl_tok {
    bool spm;                /* SentencePiece (tokenizer.ggml.model "llama") rather than byte-level BPE */
    bool add_bos;            /* tokenizer.ggml.add_bos_token: prompts start with bos */
    float *score;            /* SPM: merge priority of each token; NULL for BPE */
    int32_t byte_id[256];    /* SPM: the <0xXX> byte-fallback tokens (-1: none) */
    uint32_t sp_first[257];  /* special[sp_first[c] .. sp_first[c+1]) start with byte c */
    size_t n_vocab;          /* tokens */
    const char **text;       /* token texts (in the byte-level alphabet), in arena */
    uint32_t *text_len;      /* their lengths */
    int32_t *type;           /* token types */
    char *arena;             /* all strings */
    mdl_htab_t vocab;        /* text -> id */
    mdl_htab_t merges;       /* "left right" -> rank */
    mdl_special_t *special;  /* control + user-defined tokens, longest first */
    size_t n_special;
    int32_t bos, eos, eot;   /* ids (-1 when absent) */
    int32_t unk;             /* for bytes without a token (-1: drop them) */
    bool digits_split;       /* pre-tokenizer splits digits one by one */
    uint16_t byte_cp[256];   /* byte -> code point of the GPT-2 alphabet */
    int16_t cp_byte[324];    /* code point (< 324) -> byte, -1 if none */
};

static uint64_t mdl_hash(const char *s, size_t n)
{
    uint64_t h = 1469598103934665603ull;
    for (size_t i = 0; i < n; i++)
        h = (h ^ (uint8_t)s[i]) * 1099511628211ull;
    return h;
}

static ri_status_t mdl_htab_init(mdl_htab_t *t, size_t n)
{
    size_t cap = 16;
    while (cap < 2 * n)
        cap *= 2;
    t->e = cm_malloc(&mdl_tok_tag, cap * sizeof(*t->e));
    if (t->e == NULL)
        return RI_ERR_NOMEM;
    for (size_t i = 0; i < cap; i++)
        t->e[i].val = -1;
    t->mask = cap - 1;
    return RI_OK;
}

/* Insert unless present (first one wins, as in the reference tokenizers). */
static void mdl_htab_put(mdl_htab_t *t, const char *s, uint32_t len, int32_t val)
{
    for (size_t i = mdl_hash(s, len) & t->mask;; i = (i + 1) & t->mask) {
        mdl_hent_t *e = &t->e[i];
        if (e->val < 0) {
            e->s = s, e->len = len, e->val = val;
            return;
        }
        if (e->len == len && memcmp(e->s, s, len) == 0)
            return;
    }
}

static int32_t mdl_htab_get(const mdl_htab_t *t, const char *s, size_t len)
{
    for (size_t i = mdl_hash(s, len) & t->mask;; i = (i + 1) & t->mask) {
        const mdl_hent_t *e = &t->e[i];
        if (e->val < 0)
            return -1;
        if (e->len == len && memcmp(e->s, s, len) == 0)
            return e->val;
    }
}

/* GPT-2's reversible byte <-> printable code point map. */
static void mdl_tok_init_bytes(mdl_tok_t *t)
{
    int n = 0;
    for (int i = 0; i < 324; i++)
        t->cp_byte[i] = -1;
    for (int b = 0; b < 256; b++) {
        bool printable = (b >= 33 && b <= 126) || (b >= 161 && b <= 172) || (b >= 174 && b <= 255);
        t->byte_cp[b] = printable ? (uint16_t)b : (uint16_t)(256 + n++);
        t->cp_byte[t->byte_cp[b]] = (int16_t)b;
    }
}

static size_t mdl_utf8_put(uint32_t cp, char *out)
{
    if (cp < 0x80) {
        out[0] = (char)cp;
        return 1;
    }
    if (cp < 0x800) {
        out[0] = (char)(0xC0 | (cp >> 6));
        out[1] = (char)(0x80 | (cp & 0x3F));
        return 2;
    }
    if (cp < 0x10000) {
        out[0] = (char)(0xE0 | (cp >> 12));
        out[1] = (char)(0x80 | ((cp >> 6) & 0x3F));
        out[2] = (char)(0x80 | (cp & 0x3F));
        return 3;
    }
    out[0] = (char)(0xF0 | (cp >> 18));
    out[1] = (char)(0x80 | ((cp >> 12) & 0x3F));
    out[2] = (char)(0x80 | ((cp >> 6) & 0x3F));
    out[3] = (char)(0x80 | (cp & 0x3F));
    return 4;
}

/* Decode one UTF-8 sequence; invalid input yields the byte itself (len 1, cp = 0xFFFD class "other"). */
static size_t mdl_utf8_get(const uint8_t *s, size_t n, uint32_t *cp)
{
    uint8_t c = s[0];
    size_t len;
    uint32_t v;
    if (c < 0x80) {
        *cp = c;
        return 1;
    } else if ((c & 0xE0) == 0xC0) {
        len = 2, v = c & 0x1F;
    } else if ((c & 0xF0) == 0xE0) {
        len = 3, v = c & 0x0F;
    } else if ((c & 0xF8) == 0xF0) {
        len = 4, v = c & 0x07;
    } else {
        *cp = 0xFFFD;
        return 1;
    }
    if (len > n)
        goto bad;
    for (size_t i = 1; i < len; i++) {
        if ((s[i] & 0xC0) != 0x80)
            goto bad;
        v = (v << 6) | (s[i] & 0x3F);
    }
    *cp = v;
    return len;
bad:
    *cp = 0xFFFD;
    return 1;
}

typedef enum { MDL_CL_LETTER, MDL_CL_NUMBER, MDL_CL_SPACE, MDL_CL_OTHER } mdl_class_t;

static mdl_class_t mdl_classify(uint32_t c)
{
    if (c < 0x80) {
        if ((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z'))
            return MDL_CL_LETTER;
        if (c >= '0' && c <= '9')
            return MDL_CL_NUMBER;
        if (c == ' ' || (c >= 9 && c <= 13))
            return MDL_CL_SPACE;
        return MDL_CL_OTHER;
    }
    if (c == 0x85 || c == 0xA0 || c == 0x1680 || (c >= 0x2000 && c <= 0x200A) || c == 0x2028 || c == 0x2029 ||
        c == 0x202F || c == 0x205F || c == 0x3000)
        return MDL_CL_SPACE;
    if (c == 0xB2 || c == 0xB3 || c == 0xB9 || (c >= 0xBC && c <= 0xBE) || (c >= 0x660 && c <= 0x669) ||
        (c >= 0x6F0 && c <= 0x6F9) || (c >= 0x966 && c <= 0x96F) || (c >= 0x2070 && c <= 0x2089) ||
        (c >= 0x2150 && c <= 0x218F) || (c >= 0x2460 && c <= 0x249B) || (c >= 0xFF10 && c <= 0xFF19))
        return MDL_CL_NUMBER;
    if (c == 0xAA || c == 0xB5 || c == 0xBA)
        return MDL_CL_LETTER;
    if (c < 0xC0 || c == 0xD7 || c == 0xF7 || c == 0xFFFD || (c >= 0x300 && c <= 0x36F) ||
        (c >= 0x2010 && c <= 0x2027) || (c >= 0x2030 && c <= 0x205E) || (c >= 0x20A0 && c <= 0x20FF) ||
        (c >= 0x2100 && c <= 0x214F) || (c >= 0x2190 && c <= 0x2BFF) || (c >= 0x3001 && c <= 0x3003) ||
        (c >= 0x3008 && c <= 0x3020) || (c >= 0xE000 && c <= 0xF8FF) || (c >= 0xFE30 && c <= 0xFE4F) ||
        (c >= 0xFF01 && c <= 0xFF0F) || (c >= 0xFF1A && c <= 0xFF20) || (c >= 0xFF3B && c <= 0xFF40) ||
        (c >= 0xFF5B && c <= 0xFF65) || (c >= 0x1F000 && c <= 0x1FAFF))
        return MDL_CL_OTHER;
    return MDL_CL_LETTER;
}

static ri_status_t mdl_tok_spm_init(mdl_tok_t *t, const mdl_gguf_t *g, char *err, size_t errlen);

static ri_status_t mdl_tok_fail(char *err, size_t errlen, ri_status_t st, const char *msg, const char *key)
{
    if (err != NULL && errlen > 0)
        snprintf(err, errlen, "tokenizer: %s%s%s", msg, key ? ": " : "", key ? key : "");
    return st;
}

/* By first byte, then longest first (the longest special token wins). */
static int mdl_special_cmp(const void *a, const void *b)
{
    const mdl_special_t *x = a, *y = b;
    if ((uint8_t)x->s[0] != (uint8_t)y->s[0])
        return (int)(uint8_t)x->s[0] - (int)(uint8_t)y->s[0];
    return (int)y->len - (int)x->len;
}

static void mdl_special_index(mdl_tok_t *t)
{
    size_t k = 0;
    for (unsigned c = 0; c <= 256; c++) {
        while (c < 256 && k < t->n_special && (uint8_t)t->special[k].s[0] < c)
            k++;
        t->sp_first[c] = (uint32_t)(c == 256 ? t->n_special : k);
    }
}

static int32_t mdl_tok_id_opt(const mdl_gguf_t *g, const char *key, size_t n)
{
    uint64_t v;
    if (mdl_gguf_get_u64(g, key, &v) != RI_OK || v >= n)
        return -1;
    return (int32_t)v;
}


/* SentencePiece extras: the score of every token (merge priority) and the
 * byte-fallback tokens "<0xXX>". */
static ri_status_t mdl_tok_spm_init(mdl_tok_t *t, const mdl_gguf_t *g, char *err, size_t errlen)
{
    const mdl_gguf_kv_t *sc = mdl_gguf_find(g, "tokenizer.ggml.scores");
    if (sc == NULL || sc->type != MDL_GGUF_ARRAY || sc->arr_type != MDL_GGUF_F32 || sc->arr_n != t->n_vocab)
        return mdl_tok_fail(err, errlen, RI_ERR_FORMAT, "missing or bad f32 array", "tokenizer.ggml.scores");
    t->spm = true;
    t->score = cm_malloc(&mdl_tok_tag, t->n_vocab * sizeof(float));
    if (t->score == NULL)
        return RI_ERR_NOMEM;
    memcpy(t->score, sc->arr_data, t->n_vocab * sizeof(float));
    for (int b = 0; b < 256; b++) {
        char name[8];
        snprintf(name, sizeof(name), "<0x%02X>", b);
        t->byte_id[b] = mdl_htab_get(&t->vocab, name, 6);
    }
    return RI_OK;
}

ri_status_t mdl_tok_create(const mdl_gguf_t *g, mdl_tok_t **tok_p, char *err, size_t errlen)
{
    ri_status_t st;
    const mdl_gguf_kv_t *model = mdl_gguf_find(g, "tokenizer.ggml.model");
    const mdl_gguf_kv_t *toks = mdl_gguf_find(g, "tokenizer.ggml.tokens");
    const mdl_gguf_kv_t *types = mdl_gguf_find(g, "tokenizer.ggml.token_type");
    const mdl_gguf_kv_t *merges = mdl_gguf_find(g, "tokenizer.ggml.merges");
    const mdl_gguf_kv_t *pre = mdl_gguf_find(g, "tokenizer.ggml.pre");

    if (model == NULL || model->type != MDL_GGUF_STRING)
        return mdl_tok_fail(err, errlen, RI_ERR_FORMAT, "missing string", "tokenizer.ggml.model");
    bool spm = model->v.s.len == 5 && memcmp(model->v.s.ptr, "llama", 5) == 0;
    if (!spm && (model->v.s.len != 4 || memcmp(model->v.s.ptr, "gpt2", 4) != 0))
        return mdl_tok_fail(err, errlen, RI_ERR_UNSUPPORTED,
                            "only byte-level BPE (gpt2) and SentencePiece (llama) are supported", NULL);
    if (toks == NULL || toks->type != MDL_GGUF_ARRAY || toks->arr_type != MDL_GGUF_STRING || toks->arr_n == 0 ||
        toks->arr_n > (1u << 24))
        return mdl_tok_fail(err, errlen, RI_ERR_FORMAT, "missing or bad string array", "tokenizer.ggml.tokens");
    /* SentencePiece merges by token score: its merges list is optional and unused */
    if (spm)
        merges = NULL;
    else if (merges == NULL || merges->type != MDL_GGUF_ARRAY || merges->arr_type != MDL_GGUF_STRING ||
             merges->arr_n > (1u << 24))
        return mdl_tok_fail(err, errlen, RI_ERR_FORMAT, "missing or bad string array", "tokenizer.ggml.merges");
    if (types != NULL && (types->type != MDL_GGUF_ARRAY || types->arr_type != MDL_GGUF_I32 ||
                          types->arr_n != toks->arr_n))
        return mdl_tok_fail(err, errlen, RI_ERR_FORMAT, "bad i32 array", "tokenizer.ggml.token_type");

    mdl_tok_t *t = cm_calloc(&mdl_tok_tag, 1, sizeof(*t));
    if (t == NULL)
        return RI_ERR_NOMEM;
    size_t n = toks->arr_n, total = 0;
    t->n_vocab = n;
    for (size_t i = 0; i < n; i++)
        total += toks->arr_str[i].len + 1;
    size_t n_merges = merges != NULL ? merges->arr_n : 0;
    for (size_t i = 0; i < n_merges; i++)
        total += merges->arr_str[i].len + 1;
    t->arena = cm_malloc(&mdl_tok_tag, total ? total : 1);
    t->text = cm_calloc(&mdl_tok_tag, n, sizeof(*t->text));
    t->text_len = cm_calloc(&mdl_tok_tag, n, sizeof(*t->text_len));
    t->type = cm_calloc(&mdl_tok_tag, n, sizeof(*t->type));
    t->special = cm_calloc(&mdl_tok_tag, n, sizeof(*t->special));
    if (t->arena == NULL || t->text == NULL || t->text_len == NULL || t->type == NULL || t->special == NULL) {
        st = RI_ERR_NOMEM;
        goto err_free_tok;
    }
    if ((st = mdl_htab_init(&t->vocab, n)) != RI_OK || (st = mdl_htab_init(&t->merges, n_merges)) != RI_OK)
        goto err_free_tok;
    char *a = t->arena;
    for (size_t i = 0; i < n; i++) {
        const mdl_gguf_str_t *s = &toks->arr_str[i];
        if (s->len > 4096) {
            st = mdl_tok_fail(err, errlen, RI_ERR_FORMAT, "token longer than 4096 bytes", NULL);
            goto err_free_tok;
        }
        memcpy(a, s->ptr, s->len);
        a[s->len] = '\0';
        t->text[i] = a;
        t->text_len[i] = (uint32_t)s->len;
        a += s->len + 1;
        int32_t ty = MDL_TT_NORMAL;
        if (types != NULL)
            memcpy(&ty, (const uint8_t *)types->arr_data + 4 * i, 4);
        t->type[i] = ty;
        mdl_htab_put(&t->vocab, t->text[i], t->text_len[i], (int32_t)i);
        if ((ty == MDL_TT_CONTROL || ty == MDL_TT_USER) && s->len > 0)
            t->special[t->n_special++] = (mdl_special_t){.id = (int32_t)i, .s = t->text[i], .len = t->text_len[i]};
    }
    for (size_t i = 0; i < n_merges; i++) {
        const mdl_gguf_str_t *s = &merges->arr_str[i];
        if (memchr(s->ptr, ' ', s->len) == NULL) {
            st = mdl_tok_fail(err, errlen, RI_ERR_FORMAT, "merge without a space separator", NULL);
            goto err_free_tok;
        }
        memcpy(a, s->ptr, s->len);
        a[s->len] = '\0';
        mdl_htab_put(&t->merges, a, (uint32_t)s->len, (int32_t)i);
        a += s->len + 1;
    }
    qsort(t->special, t->n_special, sizeof(*t->special), mdl_special_cmp);
    mdl_special_index(t);
    mdl_tok_init_bytes(t);
    if (spm && (st = mdl_tok_spm_init(t, g, err, errlen)) != RI_OK)
        goto err_free_tok;
    t->bos = mdl_tok_id_opt(g, "tokenizer.ggml.bos_token_id", n);
    t->eos = mdl_tok_id_opt(g, "tokenizer.ggml.eos_token_id", n);
    t->eot = mdl_htab_get(&t->vocab, "<|im_end|>", 10);
    if (t->eot < 0)   /* Gemma's end of turn */
        t->eot = mdl_htab_get(&t->vocab, "<end_of_turn>", 13);
    bool add_bos = spm;   /* SentencePiece models default to a leading bos */
    mdl_gguf_get_bool(g, "tokenizer.ggml.add_bos_token", &add_bos);
    t->add_bos = add_bos && t->bos >= 0;
    /* The pre-tokenizers we know: "smollm" (and the StarCoder family) split
     * digits one by one before the GPT-2 regex; "gpt2"/default do not. */
    t->digits_split = false;
    if (pre != NULL && pre->type == MDL_GGUF_STRING) {
        static const char *const digit_pres[] = {"smollm", "starcoder", "refact", "command-r", "codeshell"};
        for (size_t i = 0; i < CM_ARRAY_LEN(digit_pres); i++)
            if (pre->v.s.len == strlen(digit_pres[i]) && memcmp(pre->v.s.ptr, digit_pres[i], pre->v.s.len) == 0)
                t->digits_split = true;
    }
    /* Byte tokens a vocabulary lacks (SmolLM2 has no token for bytes that
     * never occur in UTF-8 text) encode as the unknown token, or are dropped. */
    t->unk = mdl_tok_id_opt(g, "tokenizer.ggml.unknown_token_id", n);
    *tok_p = t;
    return RI_OK;

err_free_tok:
    mdl_tok_destroy(t);
    return st;
}

void mdl_tok_destroy(mdl_tok_t *t)
{
    if (t == NULL)
        return;
    cm_free(t->vocab.e);
    cm_free(t->merges.e);
    cm_free(t->special);
    cm_free(t->score);
    cm_free(t->type);
    cm_free(t->text_len);
    cm_free(t->text);
    cm_free(t->arena);
    cm_free(t);
}

size_t mdl_tok_vocab(const mdl_tok_t *t)
{
    return t->n_vocab;
}

int32_t mdl_tok_bos(const mdl_tok_t *t)
{
    return t->bos;
}

int32_t mdl_tok_eos(const mdl_tok_t *t)
{
    return t->eos;
}

int32_t mdl_tok_eot(const mdl_tok_t *t)
{
    return t->eot;
}

bool mdl_tok_add_bos(const mdl_tok_t *t)
{
    return t->add_bos;
}

bool mdl_tok_has_chat(const mdl_tok_t *t)
{
    return mdl_htab_get(&t->vocab, "<|im_start|>", 12) >= 0;
}

bool mdl_tok_is_stop(const mdl_tok_t *t, int32_t id)
{
    return id >= 0 && (id == t->eos || id == t->eot);
}

/* A growable id array. */
typedef struct mdl_ids {
    int32_t *v;
    size_t n, cap;
} mdl_ids_t;

static ri_status_t mdl_ids_push(mdl_ids_t *ids, int32_t id)
{
    if (ids->n == ids->cap) {
        size_t cap = ids->cap ? 2 * ids->cap : 64;
        int32_t *v = cm_realloc(&mdl_tok_tag, ids->v, cap * sizeof(*v));
        if (v == NULL)
            return RI_ERR_NOMEM;
        ids->v = v, ids->cap = cap;
    }
    ids->v[ids->n++] = id;
    return RI_OK;
}

/* BPE over one pre-token of raw bytes. */
static ri_status_t mdl_tok_bpe(const mdl_tok_t *t, const uint8_t *s, size_t n, mdl_ids_t *ids)
{
    /* symbols as [start, len) ranges in the mapped string */
    char stackbuf[1024];
    size_t sym_stack[256 * 2];
    char *m = n * 2 <= sizeof(stackbuf) ? stackbuf : cm_malloc(&mdl_tok_tag, n * 2);
    size_t *sym = n <= 256 ? sym_stack : cm_malloc(&mdl_tok_tag, n * 2 * sizeof(size_t));
    char *key = NULL;
    ri_status_t st = RI_OK;
    if (m == NULL || sym == NULL) {
        st = RI_ERR_NOMEM;
        goto out;
    }
    size_t ml = 0, ns = n;
    for (size_t i = 0; i < n; i++) {
        size_t l = mdl_utf8_put(t->byte_cp[s[i]], m + ml);
        sym[2 * i] = ml, sym[2 * i + 1] = l;
        ml += l;
    }
    key = cm_malloc(&mdl_tok_tag, ml + 2);
    if (key == NULL) {
        st = RI_ERR_NOMEM;
        goto out;
    }
    while (ns > 1) {
        int32_t best = -1;
        size_t bi = 0;
        for (size_t i = 0; i + 1 < ns; i++) {
            size_t la = sym[2 * i + 1], lb = sym[2 * i + 3];
            memcpy(key, m + sym[2 * i], la);
            key[la] = ' ';
            memcpy(key + la + 1, m + sym[2 * i + 2], lb);
            int32_t r = mdl_htab_get(&t->merges, key, la + 1 + lb);
            if (r >= 0 && (best < 0 || r < best))
                best = r, bi = i;
        }
        if (best < 0)
            break;
        sym[2 * bi + 1] += sym[2 * bi + 3];
        memmove(&sym[2 * bi + 2], &sym[2 * bi + 4], (ns - bi - 2) * 2 * sizeof(size_t));
        ns--;
    }
    for (size_t i = 0; i < ns && st == RI_OK; i++) {
        int32_t id = mdl_htab_get(&t->vocab, m + sym[2 * i], sym[2 * i + 1]);
        if (id >= 0) {
            st = mdl_ids_push(ids, id);
            continue;
        }
        /* a merged symbol missing from the vocabulary: fall back to its bytes */
        const char *p = m + sym[2 * i];
        size_t q = 0;
        while (q < sym[2 * i + 1] && st == RI_OK) {
            uint32_t cp;
            size_t l = mdl_utf8_get((const uint8_t *)p + q, sym[2 * i + 1] - q, &cp);
            int32_t b = mdl_htab_get(&t->vocab, p + q, l);
            if (b < 0)
                b = t->unk;
            if (b >= 0)
                st = mdl_ids_push(ids, b);
            q += l;
        }
    }
out:
    cm_free(key);
    if (sym != sym_stack)
        cm_free(sym);
    if (m != stackbuf)
        cm_free(m);
    return st;
}

/* Length in bytes of the pre-token starting at s[0] (GPT-2 regex
 * 's|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+),
 * inside a segment of n bytes. */
static size_t mdl_pretok_len(const uint8_t *s, size_t n)
{
    uint32_t c, c2;
    size_t l = mdl_utf8_get(s, n, &c);
    if (c == '\'' && n >= 2) {
        if (s[1] == 's' || s[1] == 't' || s[1] == 'm' || s[1] == 'd')
            return 2;
        if (n >= 3 && ((s[1] == 'r' && s[2] == 'e') || (s[1] == 'v' && s[2] == 'e') || (s[1] == 'l' && s[2] == 'l')))
            return 3;
    }
    size_t start = 0;
    mdl_class_t cl = mdl_classify(c);
    if (c == ' ' && l < n) {
        mdl_utf8_get(s + 1, n - 1, &c2);
        mdl_class_t cl2 = mdl_classify(c2);
        if (cl2 != MDL_CL_SPACE) {
            start = 1;
            cl = cl2;
        }
    }
    size_t i = start;
    if (cl != MDL_CL_SPACE) {
        while (i < n) {
            size_t k = mdl_utf8_get(s + i, n - i, &c2);
            if (mdl_classify(c2) != cl)
                break;
            i += k;
        }
        return i;
    }
    /* whitespace run: all of it at the end, else all but its last character */
    size_t last = 0;
    while (i < n) {
        size_t k = mdl_utf8_get(s + i, n - i, &c2);
        if (mdl_classify(c2) != MDL_CL_SPACE)
            break;
        last = i;
        i += k;
    }
    if (i == n || last == 0)
        return i == n ? i : (last == 0 ? i : last);
    return last;
}

/* Encode plain text (no specials) into ids. */
static ri_status_t mdl_tok_encode_plain(const mdl_tok_t *t, const uint8_t *s, size_t n, mdl_ids_t *ids)
{
    size_t i = 0;
    while (i < n) {
        /* a segment: up to the next digit, or one digit when digits split */
        size_t end = i;
        uint32_t c;
        size_t l = mdl_utf8_get(s + i, n - i, &c);
        if (t->digits_split && mdl_classify(c) == MDL_CL_NUMBER) {
            end = i + l;
        } else {
            while (end < n) {
                size_t k = mdl_utf8_get(s + end, n - end, &c);
                if (t->digits_split && mdl_classify(c) == MDL_CL_NUMBER)
                    break;
                end += k;
            }
        }
        while (i < end) {
            size_t pl = mdl_pretok_len(s + i, end - i);
            ri_status_t st = mdl_tok_bpe(t, s + i, pl, ids);
            if (st != RI_OK)
                return st;
            i += pl;
        }
    }
    return RI_OK;
}


/* ---- SentencePiece (BPE by score, as llama.cpp's SPM tokenizer) ---- */

/* A candidate merge of symbols left and right into a token of that score. */
typedef struct mdl_spm_pair {
    float score;
    uint32_t left, right;
    uint32_t size;      /* bytes of the merged text when the pair was made */
} mdl_spm_pair_t;

/* Symbols of one fragment: byte ranges linked in a list; len 0 = merged away. */
typedef struct mdl_spm {
    const mdl_tok_t *t;
    const char *s;               /* escaped text */
    uint32_t *start, *len;       /* [n] */
    int32_t *prev, *next;        /* [n] */
    mdl_spm_pair_t *heap;        /* max-heap: score, then leftmost */
    size_t n_heap, cap_heap;
} mdl_spm_t;

static bool mdl_spm_before(const mdl_spm_pair_t *a, const mdl_spm_pair_t *b)
{
    return a->score > b->score || (a->score == b->score && a->left < b->left);
}

static ri_status_t mdl_spm_push(mdl_spm_t *w, int32_t l, int32_t r)
{
    if (l < 0 || r < 0)
        return RI_OK;
    uint32_t size = w->len[l] + w->len[r];
    int32_t id = mdl_htab_get(&w->t->vocab, w->s + w->start[l], size);
    if (id < 0)
        return RI_OK;
    if (w->n_heap == w->cap_heap) {
        size_t cap = w->cap_heap ? 2 * w->cap_heap : 64;
        mdl_spm_pair_t *h = cm_realloc(&mdl_tok_tag, w->heap, cap * sizeof(*h));
        if (h == NULL)
            return RI_ERR_NOMEM;
        w->heap = h, w->cap_heap = cap;
    }
    size_t i = w->n_heap++;
    mdl_spm_pair_t p = {.score = w->t->score[id], .left = (uint32_t)l, .right = (uint32_t)r, .size = size};
    for (; i > 0 && mdl_spm_before(&p, &w->heap[(i - 1) / 2]); i = (i - 1) / 2)
        w->heap[i] = w->heap[(i - 1) / 2];
    w->heap[i] = p;
    return RI_OK;
}

static mdl_spm_pair_t mdl_spm_pop(mdl_spm_t *w)
{
    mdl_spm_pair_t top = w->heap[0], last = w->heap[--w->n_heap];
    size_t i = 0;
    for (;;) {
        size_t c = 2 * i + 1;
        if (c >= w->n_heap)
            break;
        if (c + 1 < w->n_heap && mdl_spm_before(&w->heap[c + 1], &w->heap[c]))
            c++;
        if (!mdl_spm_before(&w->heap[c], &last))
            break;
        w->heap[i] = w->heap[c];
        i = c;
    }
    if (w->n_heap > 0)
        w->heap[i] = last;
    return top;
}

/* Merge the best pair until none is in the vocabulary. */
static ri_status_t mdl_spm_merge(mdl_spm_t *w)
{
    ri_status_t st = RI_OK;
    while (w->n_heap > 0 && st == RI_OK) {
        mdl_spm_pair_t p = mdl_spm_pop(w);
        uint32_t l = p.left, r = p.right;
        if (w->len[l] == 0 || w->len[r] == 0 || w->len[l] + w->len[r] != p.size)
            continue;   /* one side changed since the pair was made */
        w->len[l] += w->len[r];
        w->len[r] = 0;
        w->next[l] = w->next[r];
        if (w->next[r] >= 0)
            w->prev[w->next[r]] = (int32_t)l;
        st = mdl_spm_push(w, w->prev[l], (int32_t)l);
        if (st == RI_OK)
            st = mdl_spm_push(w, (int32_t)l, w->next[l]);
    }
    return st;
}

/* The ids of the merged symbols; a symbol outside the vocabulary becomes its
 * bytes' <0xXX> tokens (byte fallback), or unk without them. */
static ri_status_t mdl_spm_emit(const mdl_spm_t *w, mdl_ids_t *ids)
{
    ri_status_t st = RI_OK;
    for (int32_t i = w->len[0] > 0 ? 0 : -1; i >= 0 && st == RI_OK; i = w->next[i]) {
        int32_t id = mdl_htab_get(&w->t->vocab, w->s + w->start[i], w->len[i]);
        if (id >= 0) {
            st = mdl_ids_push(ids, id);
            continue;
        }
        for (uint32_t k = 0; k < w->len[i] && st == RI_OK; k++) {
            int32_t b = w->t->byte_id[(uint8_t)w->s[w->start[i] + k]];
            b = b >= 0 ? b : w->t->unk;
            if (b >= 0)
                st = mdl_ids_push(ids, b);
        }
    }
    return st;
}

/* Spaces become U+2581 ("▁"), as SentencePiece escapes them; no dummy
 * prefix (Gemma's add_space_prefix is false). */
static char *mdl_spm_escape(const uint8_t *s, size_t n, size_t *out_n)
{
    size_t spaces = 0;
    for (size_t i = 0; i < n; i++)
        spaces += s[i] == ' ';
    char *e = cm_malloc(&mdl_tok_tag, n + 2 * spaces + 1);
    if (e == NULL)
        return NULL;
    size_t k = 0;
    for (size_t i = 0; i < n; i++) {
        if (s[i] == ' ') {
            memcpy(e + k, "\xe2\x96\x81", 3);
            k += 3;
        } else {
            e[k++] = (char)s[i];
        }
    }
    *out_n = k;
    return e;
}

/* One fragment of plain text (no special tokens in it): escape, one symbol
 * per UTF-8 character, merge by score, emit. */
static ri_status_t mdl_tok_encode_spm(const mdl_tok_t *t, const uint8_t *s, size_t n, mdl_ids_t *ids)
{
    if (n == 0)
        return RI_OK;
    size_t en = 0, ns = 0;
    mdl_spm_t w = {.t = t};
    char *e = mdl_spm_escape(s, n, &en);
    ri_status_t st = RI_ERR_NOMEM;
    w.s = e;
    w.start = cm_malloc(&mdl_tok_tag, en * sizeof(uint32_t));
    w.len = cm_malloc(&mdl_tok_tag, en * sizeof(uint32_t));
    w.prev = cm_malloc(&mdl_tok_tag, en * sizeof(int32_t));
    w.next = cm_malloc(&mdl_tok_tag, en * sizeof(int32_t));
    if (e == NULL || w.start == NULL || w.len == NULL || w.prev == NULL || w.next == NULL)
        goto out;
    for (size_t i = 0; i < en; ns++) {
        uint32_t cp;
        size_t l = mdl_utf8_get((const uint8_t *)e + i, en - i, &cp);
        w.start[ns] = (uint32_t)i, w.len[ns] = (uint32_t)l;
        w.prev[ns] = (int32_t)ns - 1, w.next[ns] = (int32_t)ns + 1;
        i += l;
    }
    w.next[ns - 1] = -1;
    st = RI_OK;
    for (size_t i = 0; i + 1 < ns && st == RI_OK; i++)
        st = mdl_spm_push(&w, (int32_t)i, (int32_t)i + 1);
    if (st == RI_OK)
        st = mdl_spm_merge(&w);
    if (st == RI_OK)
        st = mdl_spm_emit(&w, ids);
out:
    cm_free(w.heap);
    cm_free(w.next);
    cm_free(w.prev);
    cm_free(w.len);
    cm_free(w.start);
    cm_free(e);
    return st;
}

/* The special token at s[0..n) to split out, or NULL.  BPE (SmolLM2) splits
 * out control and user-defined tokens only with parse_special; SentencePiece
 * always splits out its user-defined tokens (Gemma's "\n", "\n\n", tabs, ...),
 * as llama.cpp does, and control tokens only with parse_special. */
static const mdl_special_t *mdl_tok_special_at(const mdl_tok_t *t, const uint8_t *s, size_t n, bool parse_special)
{
    if (!parse_special && !t->spm)
        return NULL;
    for (uint32_t k = t->sp_first[s[0]]; k < t->sp_first[s[0] + 1]; k++) {
        const mdl_special_t *sp = &t->special[k];
        if (!parse_special && t->type[sp->id] != MDL_TT_USER)
            continue;
        if (sp->len <= n && memcmp(s, sp->s, sp->len) == 0)
            return sp;
    }
    return NULL;
}

ri_status_t mdl_tok_encode(const mdl_tok_t *t, const char *text, size_t len, bool parse_special, int32_t **ids_p,
                           size_t *n_p)
{
    mdl_ids_t ids = {0};
    const uint8_t *s = (const uint8_t *)text;
    size_t i = 0, seg = 0;
    ri_status_t st = RI_OK;
    while (i <= len && st == RI_OK) {
        const mdl_special_t *hit = i < len ? mdl_tok_special_at(t, s + i, len - i, parse_special) : NULL;
        if (hit == NULL && i < len) {
            i++;
            continue;
        }
        if (t->spm)
            st = mdl_tok_encode_spm(t, s + seg, i - seg, &ids);
        else
            st = mdl_tok_encode_plain(t, s + seg, i - seg, &ids);
        if (hit == NULL)
            break;
        if (st == RI_OK)
            st = mdl_ids_push(&ids, hit->id);
        i += hit->len;
        seg = i;
    }
    if (st != RI_OK) {
        cm_free(ids.v);
        return st;
    }
    if (ids.v == NULL && (ids.v = cm_malloc(&mdl_tok_tag, sizeof(int32_t))) == NULL)
        return RI_ERR_NOMEM;
    *ids_p = ids.v;
    *n_p = ids.n;
    return RI_OK;
}

/* SentencePiece piece: byte tokens give their byte, "▁" gives a space. */
static int mdl_spm_piece(const mdl_tok_t *t, int32_t id, char *buf, size_t cap)
{
    const char *s = t->text[id];
    size_t n = t->text_len[id], out = 0;
    if (t->type[id] == MDL_TT_BYTE && n == 6) {
        if (cap > 0)
            buf[0] = (char)strtol(s + 3, NULL, 16);
        return 1;
    }
    for (size_t i = 0; i < n; out++) {
        bool sp = t->type[id] == MDL_TT_NORMAL && i + 3 <= n && memcmp(s + i, "\xe2\x96\x81", 3) == 0;
        if (out < cap)
            buf[out] = sp ? ' ' : s[i];
        i += sp ? 3 : 1;
    }
    return (int)out;
}

ri_status_t mdl_tok_encode_prompt(const mdl_tok_t *t, const char *text, size_t len, int32_t **ids_p, size_t *n_p)
{
    int32_t *ids;
    size_t n;
    ri_status_t st = mdl_tok_encode(t, text, len, false, &ids, &n);
    if (st != RI_OK || !t->add_bos) {
        if (st == RI_OK)
            *ids_p = ids, *n_p = n;
        return st;
    }
    int32_t *all = cm_realloc(&mdl_tok_tag, ids, (n + 1) * sizeof(int32_t));
    if (all == NULL) {
        cm_free(ids);
        return RI_ERR_NOMEM;
    }
    memmove(all + 1, all, n * sizeof(int32_t));
    all[0] = t->bos;
    *ids_p = all;
    *n_p = n + 1;
    return RI_OK;
}

int mdl_tok_piece(const mdl_tok_t *t, int32_t id, char *buf, size_t cap)
{
    if (id < 0 || (size_t)id >= t->n_vocab)
        return -1;
    if (t->spm)
        return mdl_spm_piece(t, id, buf, cap);
    const uint8_t *s = (const uint8_t *)t->text[id];
    size_t n = t->text_len[id], out = 0;
    bool raw = t->type[id] == MDL_TT_CONTROL || t->type[id] == MDL_TT_USER;
    for (size_t i = 0; i < n;) {
        uint32_t cp;
        size_t l = mdl_utf8_get(s + i, n - i, &cp);
        if (!raw && cp < 324 && t->cp_byte[cp] >= 0) {
            if (out < cap)
                buf[out] = (char)t->cp_byte[cp];
            out++;
        } else {
            for (size_t k = 0; k < l; k++, out++)
                if (out < cap)
                    buf[out] = (char)s[i + k];
        }
        i += l;
    }
    return (int)out;
}

ri_status_t mdl_tok_decode(const mdl_tok_t *t, const int32_t *ids, size_t n, bool skip_special, char **text_p)
{
    size_t cap = 64, len = 0;
    char *out = cm_malloc(&mdl_tok_tag, cap);
    if (out == NULL)
        return RI_ERR_NOMEM;
    for (size_t i = 0; i < n; i++) {
        if (ids[i] < 0 || (size_t)ids[i] >= t->n_vocab)
            continue;
        if (skip_special && t->type[ids[i]] == MDL_TT_CONTROL)
            continue;
        int l = mdl_tok_piece(t, ids[i], NULL, 0);
        if (len + (size_t)l + 1 > cap) {
            while (len + (size_t)l + 1 > cap)
                cap *= 2;
            char *o = cm_realloc(&mdl_tok_tag, out, cap);
            if (o == NULL) {
                cm_free(out);
                return RI_ERR_NOMEM;
            }
            out = o;
        }
        len += (size_t)mdl_tok_piece(t, ids[i], out + len, cap - len);
    }
    out[len] = '\0';
    *text_p = out;
    return RI_OK;
}

/* Append the ids of len bytes of text to all (parse_special as mdl_tok_encode). */
static ri_status_t mdl_tok_append(const mdl_tok_t *t, const char *text, size_t len, bool parse_special,
                                  mdl_ids_t *all)
{
    int32_t *ids = NULL;
    size_t k = 0;
    ri_status_t st = mdl_tok_encode(t, text, len, parse_special, &ids, &k);
    for (size_t i = 0; st == RI_OK && i < k; i++)
        st = mdl_ids_push(all, ids[i]);
    cm_free(ids);
    return st;
}

ri_status_t mdl_tok_chat_msgs(const mdl_tok_t *t, const mdl_chat_msg_t *msgs, size_t n_msgs, int32_t **ids_p,
                              size_t *n_p)
{
    if (!mdl_tok_has_chat(t))
        return RI_ERR_UNSUPPORTED;   /* a base model (Gemma 3 270M) has no template */
    static const char *const def_system = "You are a helpful AI assistant named SmolLM, trained by Hugging Face";
    static const char *const start = "<|im_start|>", *const end = "<|im_end|>\n";
    mdl_ids_t all = {0};
    ri_status_t st = RI_OK;

    /* The template of SmolLM2-Instruct (ChatML), with its default system
     * turn when the conversation has none.  "role\ncontent" is one plain
     * segment, as a tokenizer of the whole rendered template sees it; neither
     * is parsed for special tokens, so a message cannot forge a turn. */
    bool def = n_msgs == 0 || strcmp(msgs[0].role, "system") != 0;
    for (size_t i = 0; st == RI_OK && i < n_msgs + def; i++) {
        const mdl_chat_msg_t *m = def ? (i == 0 ? &(mdl_chat_msg_t){"system", def_system} : &msgs[i - 1]) : &msgs[i];
        size_t lr = strlen(m->role), lc = strlen(m->content);
        char *seg = cm_malloc(&mdl_tok_tag, lr + lc + 2);
        if (seg == NULL) {
            st = RI_ERR_NOMEM;
            break;
        }
        memcpy(seg, m->role, lr);
        seg[lr] = '\n';
        memcpy(seg + lr + 1, m->content, lc);
        st = mdl_tok_append(t, start, strlen(start), true, &all);
        if (st == RI_OK)
            st = mdl_tok_append(t, seg, lr + 1 + lc, false, &all);
        if (st == RI_OK)
            st = mdl_tok_append(t, end, strlen(end), true, &all);
        cm_free(seg);
    }
    if (st == RI_OK)
        st = mdl_tok_append(t, start, strlen(start), true, &all);
    if (st == RI_OK)
        st = mdl_tok_append(t, "assistant\n", 10, false, &all);
    if (st != RI_OK) {
        cm_free(all.v);
        return st;
    }
    *ids_p = all.v;
    *n_p = all.n;
    return RI_OK;
}

ri_status_t mdl_tok_chat(const mdl_tok_t *t, const char *system, const char *user, int32_t **ids_p, size_t *n_p)
{
    mdl_chat_msg_t m[2] = {{"system", system}, {"user", user}};
    return system != NULL ? mdl_tok_chat_msgs(t, m, 2, ids_p, n_p) : mdl_tok_chat_msgs(t, m + 1, 1, ids_p, n_p);
}
