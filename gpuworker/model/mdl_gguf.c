/*
 * GGUF reader (see mdl_gguf.h).  A bounded cursor walks the image; every read
 * checks the remaining length first, every count is checked against what the
 * rest of the file could hold before anything is allocated, and tensor extents
 * are checked against the data section, so hostile input fails cleanly.
 */
#define _GNU_SOURCE
#include "gpuworker/model/mdl_gguf.h"

#include <errno.h>
#include <fcntl.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdint.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "common/cm_alloc.h"
#include "common/cm_log.h"
#include "common/cm_status.h"

static CM_ALLOC_TAG(mdl_gguf_tag, "model.gguf");

#define MDL_GGUF_MAGIC 0x46554747u   /* "GGUF" little-endian */
#define MDL_GGUF_MAX_DIMS 4
#define MDL_GGUF_MAX_STR (1ull << 30)   /* no key or value is a gigabyte */
#define MDL_GGUF_MAX_DEPTH 4            /* nested arrays */

typedef struct mdl_cur {
    const uint8_t *base; /* start of the image, for offsets in messages */
    const uint8_t *p;    /* next byte */
    const uint8_t *end;  /* one past the image */
    char *err;           /* message buffer */
    size_t errlen;
} mdl_cur_t;

static ri_status_t mdl_fail(mdl_cur_t *c, ri_status_t st, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

static ri_status_t mdl_fail(mdl_cur_t *c, ri_status_t st, const char *fmt, ...)
{
    if (c->err != NULL && c->errlen > 0) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(c->err, c->errlen, fmt, ap);
        va_end(ap);
    }
    return st;
}

static size_t mdl_left(const mdl_cur_t *c)
{
    return (size_t)(c->end - c->p);
}

static ri_status_t mdl_read(mdl_cur_t *c, void *out, size_t n, const char *what)
{
    if (mdl_left(c) < n)
        return mdl_fail(c, RI_ERR_TRUNCATED, "gguf: truncated reading %s at byte %zu", what,
                        (size_t)(c->p - c->base));
    memcpy(out, c->p, n);
    c->p += n;
    return RI_OK;
}

static ri_status_t mdl_read_u32(mdl_cur_t *c, uint32_t *v, const char *what)
{
    return mdl_read(c, v, 4, what);
}

static ri_status_t mdl_read_u64(mdl_cur_t *c, uint64_t *v, const char *what)
{
    return mdl_read(c, v, 8, what);
}

static ri_status_t mdl_read_str(mdl_cur_t *c, mdl_gguf_str_t *s, const char *what)
{
    uint64_t len = 0;
    ri_status_t st = mdl_read_u64(c, &len, what);
    if (st != RI_OK)
        return st;
    if (len > MDL_GGUF_MAX_STR || len > mdl_left(c))
        return mdl_fail(c, RI_ERR_FORMAT, "gguf: %s length %llu exceeds the file", what,
                        (unsigned long long)len);
    s->ptr = (const char *)c->p;
    s->len = len;
    c->p += len;
    return RI_OK;
}

size_t mdl_gguf_vtype_size(mdl_gguf_vtype_t t)
{
    switch (t) {
    case MDL_GGUF_U8: case MDL_GGUF_I8: case MDL_GGUF_BOOL: return 1;
    case MDL_GGUF_U16: case MDL_GGUF_I16: return 2;
    case MDL_GGUF_U32: case MDL_GGUF_I32: case MDL_GGUF_F32: return 4;
    case MDL_GGUF_U64: case MDL_GGUF_I64: case MDL_GGUF_F64: return 8;
    default: return 0;
    }
}

/* Skip one value of type t (used for nested arrays, which we parse but do not index). */
static ri_status_t mdl_skip_value(mdl_cur_t *c, uint32_t t, int depth)
{
    if (depth > MDL_GGUF_MAX_DEPTH)
        return mdl_fail(c, RI_ERR_FORMAT, "gguf: arrays nested deeper than %d", MDL_GGUF_MAX_DEPTH);
    if (t == MDL_GGUF_STRING) {
        mdl_gguf_str_t s;
        return mdl_read_str(c, &s, "string");
    }
    if (t == MDL_GGUF_ARRAY) {
        uint32_t et = 0;
        uint64_t n = 0;
        ri_status_t st = mdl_read_u32(c, &et, "array type");
        if (st == RI_OK)
            st = mdl_read_u64(c, &n, "array count");
        if (st != RI_OK)
            return st;
        if (et >= MDL_GGUF_VTYPE_COUNT)
            return mdl_fail(c, RI_ERR_FORMAT, "gguf: unknown array element type %u", et);
        size_t es = mdl_gguf_vtype_size(et);
        if (es > 0) {
            if (n > mdl_left(c) / es)
                return mdl_fail(c, RI_ERR_FORMAT, "gguf: array of %llu elements exceeds the file",
                                (unsigned long long)n);
            c->p += n * es;
            return RI_OK;
        }
        /* strings and arrays take at least 8 bytes each */
        if (n > mdl_left(c) / 8)
            return mdl_fail(c, RI_ERR_FORMAT, "gguf: array of %llu elements exceeds the file",
                            (unsigned long long)n);
        for (uint64_t i = 0; i < n; i++) {
            st = mdl_skip_value(c, et, depth + 1);
            if (st != RI_OK)
                return st;
        }
        return RI_OK;
    }
    size_t sz = mdl_gguf_vtype_size(t);
    if (sz == 0)
        return mdl_fail(c, RI_ERR_FORMAT, "gguf: unknown value type %u", t);
    if (mdl_left(c) < sz)
        return mdl_fail(c, RI_ERR_TRUNCATED, "gguf: truncated value");
    c->p += sz;
    return RI_OK;
}

static ri_status_t mdl_read_scalar(mdl_cur_t *c, mdl_gguf_kv_t *kv)
{
    uint8_t b[8] = {0};
    size_t sz = mdl_gguf_vtype_size(kv->type);
    ri_status_t st = mdl_read(c, b, sz, "value");
    if (st != RI_OK)
        return st;
    switch (kv->type) {
    case MDL_GGUF_U8: kv->v.u = b[0]; break;
    case MDL_GGUF_BOOL:
        if (b[0] > 1)
            return mdl_fail(c, RI_ERR_FORMAT, "gguf: bool value %u is not 0 or 1", b[0]);
        kv->v.u = b[0];
        break;
    case MDL_GGUF_I8: kv->v.i = (int8_t)b[0]; break;
    case MDL_GGUF_U16: { uint16_t x; memcpy(&x, b, 2); kv->v.u = x; break; }
    case MDL_GGUF_I16: { int16_t x; memcpy(&x, b, 2); kv->v.i = x; break; }
    case MDL_GGUF_U32: { uint32_t x; memcpy(&x, b, 4); kv->v.u = x; break; }
    case MDL_GGUF_I32: { int32_t x; memcpy(&x, b, 4); kv->v.i = x; break; }
    case MDL_GGUF_F32: { float x; memcpy(&x, b, 4); kv->v.f = x; break; }
    case MDL_GGUF_U64: memcpy(&kv->v.u, b, 8); break;
    case MDL_GGUF_I64: memcpy(&kv->v.i, b, 8); break;
    case MDL_GGUF_F64: memcpy(&kv->v.f, b, 8); break;
    default: return mdl_fail(c, RI_ERR_FORMAT, "gguf: unknown value type %u", kv->type);
    }
    return RI_OK;
}

static ri_status_t mdl_read_kv(mdl_cur_t *c, mdl_gguf_kv_t *kv)
{
    uint32_t t = 0;
    ri_status_t st = mdl_read_str(c, &kv->key, "metadata key");
    if (st == RI_OK)
        st = mdl_read_u32(c, &t, "metadata type");
    if (st != RI_OK)
        return st;
    if (t >= MDL_GGUF_VTYPE_COUNT)
        return mdl_fail(c, RI_ERR_FORMAT, "gguf: key '%.*s' has unknown type %u", (int)CM_MIN(kv->key.len, 200),
                        kv->key.ptr, t);
    kv->type = (mdl_gguf_vtype_t)t;
    if (t == MDL_GGUF_STRING)
        return mdl_read_str(c, &kv->v.s, "string value");
    if (t != MDL_GGUF_ARRAY)
        return mdl_read_scalar(c, kv);

    uint32_t et = 0;
    uint64_t n = 0;
    st = mdl_read_u32(c, &et, "array type");
    if (st == RI_OK)
        st = mdl_read_u64(c, &n, "array count");
    if (st != RI_OK)
        return st;
    if (et >= MDL_GGUF_VTYPE_COUNT)
        return mdl_fail(c, RI_ERR_FORMAT, "gguf: key '%.*s': unknown array element type %u",
                        (int)CM_MIN(kv->key.len, 200), kv->key.ptr, et);
    kv->arr_type = (mdl_gguf_vtype_t)et;
    kv->arr_n = n;
    size_t es = mdl_gguf_vtype_size(et);
    if (es > 0) {
        if (n > mdl_left(c) / es)
            return mdl_fail(c, RI_ERR_FORMAT, "gguf: key '%.*s': array of %llu elements exceeds the file",
                            (int)CM_MIN(kv->key.len, 200), kv->key.ptr, (unsigned long long)n);
        kv->arr_data = c->p;
        c->p += n * es;
        return RI_OK;
    }
    if (n > mdl_left(c) / 8)
        return mdl_fail(c, RI_ERR_FORMAT, "gguf: key '%.*s': array of %llu elements exceeds the file",
                        (int)CM_MIN(kv->key.len, 200), kv->key.ptr, (unsigned long long)n);
    if (et == MDL_GGUF_STRING) {
        kv->arr_str = cm_calloc(&mdl_gguf_tag, n ? n : 1, sizeof(*kv->arr_str));
        if (kv->arr_str == NULL)
            return mdl_fail(c, RI_ERR_NOMEM, "gguf: out of memory for %llu strings", (unsigned long long)n);
        for (uint64_t i = 0; i < n; i++) {
            st = mdl_read_str(c, &kv->arr_str[i], "array string");
            if (st != RI_OK)
                return st;
        }
        return RI_OK;
    }
    kv->arr_data = c->p;   /* nested arrays: validated, not indexed */
    for (uint64_t i = 0; i < n; i++) {
        st = mdl_skip_value(c, et, 1);
        if (st != RI_OK)
            return st;
    }
    return RI_OK;
}

bool mdl_ggml_type_block(mdl_ggml_type_t t, uint32_t *be, uint32_t *bb)
{
    uint32_t e, b;
    switch (t) {
    case MDL_GGML_F32: e = 1; b = 4; break;
    case MDL_GGML_F16: e = 1; b = 2; break;
    case MDL_GGML_BF16: e = 1; b = 2; break;
    case MDL_GGML_Q4_0: e = 32; b = 18; break;
    case MDL_GGML_Q4_1: e = 32; b = 20; break;
    case MDL_GGML_Q5_0: e = 32; b = 22; break;
    case MDL_GGML_Q5_1: e = 32; b = 24; break;
    case MDL_GGML_Q8_0: e = 32; b = 34; break;
    case MDL_GGML_Q8_1: e = 32; b = 36; break;
    case MDL_GGML_Q2_K: e = 256; b = 84; break;
    case MDL_GGML_Q3_K: e = 256; b = 110; break;
    case MDL_GGML_Q4_K: e = 256; b = 144; break;
    case MDL_GGML_Q5_K: e = 256; b = 176; break;
    case MDL_GGML_Q6_K: e = 256; b = 210; break;
    case MDL_GGML_Q8_K: e = 256; b = 292; break;
    case MDL_GGML_I8: e = 1; b = 1; break;
    case MDL_GGML_I16: e = 1; b = 2; break;
    case MDL_GGML_I32: e = 1; b = 4; break;
    case MDL_GGML_I64: case MDL_GGML_F64: e = 1; b = 8; break;
    default: return false;
    }
    if (be)
        *be = e;
    if (bb)
        *bb = b;
    return true;
}

const char *mdl_ggml_type_name(mdl_ggml_type_t t)
{
    switch (t) {
    case MDL_GGML_F32: return "f32";
    case MDL_GGML_F16: return "f16";
    case MDL_GGML_BF16: return "bf16";
    case MDL_GGML_Q4_0: return "q4_0";
    case MDL_GGML_Q4_1: return "q4_1";
    case MDL_GGML_Q5_0: return "q5_0";
    case MDL_GGML_Q5_1: return "q5_1";
    case MDL_GGML_Q8_0: return "q8_0";
    case MDL_GGML_Q8_1: return "q8_1";
    case MDL_GGML_Q2_K: return "q2_k";
    case MDL_GGML_Q3_K: return "q3_k";
    case MDL_GGML_Q4_K: return "q4_k";
    case MDL_GGML_Q5_K: return "q5_k";
    case MDL_GGML_Q6_K: return "q6_k";
    case MDL_GGML_Q8_K: return "q8_k";
    case MDL_GGML_I8: return "i8";
    case MDL_GGML_I16: return "i16";
    case MDL_GGML_I32: return "i32";
    case MDL_GGML_I64: return "i64";
    case MDL_GGML_F64: return "f64";
    default: return "?";
    }
}

static ri_status_t mdl_read_tensor(mdl_cur_t *c, mdl_gguf_tensor_t *t)
{
    uint32_t nd = 0, type = 0;
    ri_status_t st = mdl_read_str(c, &t->name, "tensor name");
    if (st == RI_OK)
        st = mdl_read_u32(c, &nd, "tensor dims");
    if (st != RI_OK)
        return st;
    int nl = (int)CM_MIN(t->name.len, 200);
    if (nd == 0 || nd > MDL_GGUF_MAX_DIMS)
        return mdl_fail(c, RI_ERR_FORMAT, "gguf: tensor '%.*s' has %u dimensions", nl, t->name.ptr, nd);
    t->n_dims = nd;
    uint64_t n_elems = 1;
    for (uint32_t d = 0; d < MDL_GGUF_MAX_DIMS; d++) {
        t->ne[d] = 1;
        if (d >= nd)
            continue;
        st = mdl_read_u64(c, &t->ne[d], "tensor shape");
        if (st != RI_OK)
            return st;
        if (t->ne[d] == 0 || t->ne[d] > (1ull << 40) || n_elems > (1ull << 62) / t->ne[d])
            return mdl_fail(c, RI_ERR_FORMAT, "gguf: tensor '%.*s' has a bad dimension %llu", nl, t->name.ptr,
                            (unsigned long long)t->ne[d]);
        n_elems *= t->ne[d];
    }
    st = mdl_read_u32(c, &type, "tensor type");
    if (st == RI_OK)
        st = mdl_read_u64(c, &t->offset, "tensor offset");
    if (st != RI_OK)
        return st;
    uint32_t be, bb;
    if (!mdl_ggml_type_block((mdl_ggml_type_t)type, &be, &bb))
        return mdl_fail(c, RI_ERR_FORMAT, "gguf: tensor '%.*s' has unknown type %u", nl, t->name.ptr, type);
    t->type = (mdl_ggml_type_t)type;
    if (t->ne[0] % be != 0)
        return mdl_fail(c, RI_ERR_FORMAT, "gguf: tensor '%.*s': row of %llu is not a multiple of the block %u",
                        nl, t->name.ptr, (unsigned long long)t->ne[0], be);
    t->n_bytes = n_elems / be * bb;   /* n_elems < 2^62 and bb < 512: no overflow */
    return RI_OK;
}

static ri_status_t mdl_gguf_parse(mdl_gguf_t *g, char *err, size_t errlen)
{
    mdl_cur_t c = {.base = g->base, .p = g->base, .end = g->base + g->size, .err = err, .errlen = errlen};
    uint32_t magic = 0;
    ri_status_t st = mdl_read_u32(&c, &magic, "magic");
    if (st != RI_OK)
        return st;
    if (magic != MDL_GGUF_MAGIC)
        return mdl_fail(&c, RI_ERR_BAD_MAGIC, "gguf: bad magic 0x%08x (not a GGUF file)", magic);
    if ((st = mdl_read_u32(&c, &g->version, "version")) != RI_OK)
        return st;
    if (g->version != 2 && g->version != 3)
        return mdl_fail(&c, RI_ERR_BAD_VERSION, "gguf: unsupported version %u (want 2 or 3)", g->version);
    if ((st = mdl_read_u64(&c, &g->n_tensors, "tensor count")) != RI_OK ||
        (st = mdl_read_u64(&c, &g->n_kv, "metadata count")) != RI_OK)
        return st;
    /* a key/value takes >= 12 bytes, a tensor info >= 24: bound before allocating */
    if (g->n_kv > mdl_left(&c) / 12 || g->n_tensors > mdl_left(&c) / 24)
        return mdl_fail(&c, RI_ERR_FORMAT, "gguf: %llu keys / %llu tensors cannot fit in a %zu-byte file",
                        (unsigned long long)g->n_kv, (unsigned long long)g->n_tensors, g->size);
    g->kv = cm_calloc(&mdl_gguf_tag, g->n_kv ? g->n_kv : 1, sizeof(*g->kv));
    g->tensors = cm_calloc(&mdl_gguf_tag, g->n_tensors ? g->n_tensors : 1, sizeof(*g->tensors));
    if (g->kv == NULL || g->tensors == NULL)
        return mdl_fail(&c, RI_ERR_NOMEM, "gguf: out of memory");
    for (uint64_t i = 0; i < g->n_kv; i++)
        if ((st = mdl_read_kv(&c, &g->kv[i])) != RI_OK)
            return st;

    g->alignment = 32;
    const mdl_gguf_kv_t *al = mdl_gguf_find(g, "general.alignment");
    if (al != NULL) {
        if (al->type != MDL_GGUF_U32 || al->v.u == 0 || (al->v.u & (al->v.u - 1)) != 0 || al->v.u > 65536)
            return mdl_fail(&c, RI_ERR_FORMAT, "gguf: general.alignment must be a power-of-two u32 <= 65536");
        g->alignment = al->v.u;
    }
    for (uint64_t i = 0; i < g->n_tensors; i++)
        if ((st = mdl_read_tensor(&c, &g->tensors[i])) != RI_OK)
            return st;

    size_t hdr = (size_t)(c.p - g->base);
    size_t data_off = CM_ALIGN_UP(hdr, (size_t)g->alignment);
    if (data_off > g->size && g->n_tensors > 0)
        return mdl_fail(&c, RI_ERR_TRUNCATED, "gguf: file ends before the tensor data");
    uint64_t data_size = data_off <= g->size ? g->size - data_off : 0;
    for (uint64_t i = 0; i < g->n_tensors; i++) {
        mdl_gguf_tensor_t *t = &g->tensors[i];
        int nl = (int)CM_MIN(t->name.len, 200);
        if (t->offset % g->alignment != 0)
            return mdl_fail(&c, RI_ERR_FORMAT, "gguf: tensor '%.*s' offset %llu is not aligned to %llu", nl,
                            t->name.ptr, (unsigned long long)t->offset, (unsigned long long)g->alignment);
        if (t->offset > data_size || t->n_bytes > data_size - t->offset)
            return mdl_fail(&c, RI_ERR_FORMAT, "gguf: tensor '%.*s' (%llu bytes at %llu) lies outside the file",
                            nl, t->name.ptr, (unsigned long long)t->n_bytes, (unsigned long long)t->offset);
        t->data = g->base + data_off + t->offset;
        for (uint64_t j = 0; j < i; j++)
            if (g->tensors[j].name.len == t->name.len && memcmp(g->tensors[j].name.ptr, t->name.ptr, t->name.len) == 0)
                return mdl_fail(&c, RI_ERR_FORMAT, "gguf: duplicate tensor '%.*s'", nl, t->name.ptr);
    }
    return RI_OK;
}

static void mdl_gguf_free_parts(mdl_gguf_t *g)
{
    if (g->kv != NULL)
        for (uint64_t i = 0; i < g->n_kv; i++)
            cm_free(g->kv[i].arr_str);
    cm_free(g->kv);
    cm_free(g->tensors);
}

ri_status_t mdl_gguf_open_mem(const void *buf, size_t len, mdl_gguf_t **g_p, char *err, size_t errlen)
{
    if (err != NULL && errlen > 0)
        err[0] = '\0';
    mdl_gguf_t *g = cm_calloc(&mdl_gguf_tag, 1, sizeof(*g));
    if (g == NULL)
        return RI_ERR_NOMEM;
    g->base = buf;
    g->size = len;
    ri_status_t st = mdl_gguf_parse(g, err, errlen);
    if (st != RI_OK) {
        mdl_gguf_free_parts(g);
        cm_free(g);
        return st;
    }
    *g_p = g;
    return RI_OK;
}

#define MDL_GGUF_HUGE ((size_t)2 << 20)   /* the transparent huge page size of x86-64 */

static bool mdl_gguf_load_map;   /* mdl_gguf_set_load_map */

void mdl_gguf_set_load_map(bool on)
{
    mdl_gguf_load_map = on;
}

/* The file's size bytes read into an anonymous mapping of *len_p bytes
 * (size rounded up to MDL_GGUF_HUGE, its start aligned to it so that the
 * kernel can back it with huge pages), read-only once filled; NULL when the
 * memory cannot be had or the read fails (the caller maps the file). */
static void *mdl_gguf_read_huge(int fd, size_t size, size_t *len_p)
{
    size_t len = (size + MDL_GGUF_HUGE - 1) / MDL_GGUF_HUGE * MDL_GGUF_HUGE;
    uint8_t *raw = mmap(NULL, len + MDL_GGUF_HUGE, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (raw == MAP_FAILED)
        return NULL;
    uint8_t *map = (uint8_t *)(((uintptr_t)raw + MDL_GGUF_HUGE - 1) & ~(uintptr_t)(MDL_GGUF_HUGE - 1));
    if (map > raw)
        munmap(raw, (size_t)(map - raw));
    if (raw + MDL_GGUF_HUGE > map)
        munmap(map + len, (size_t)(raw + MDL_GGUF_HUGE - map));
    (void)madvise(map, len, MADV_HUGEPAGE);   /* only a hint: 4 KiB pages where THP is off */
    for (size_t done = 0; done < size;) {
        ssize_t n = pread(fd, map + done, size - done, (off_t)done);
        if (n < 0 && errno == EINTR)
            continue;
        if (n <= 0)
            goto err_unmap;   /* an error, or the file shrank under us */
        done += (size_t)n;
    }
    if (mprotect(map, len, PROT_READ) != 0)
        goto err_unmap;
    *len_p = len;
    return map;

err_unmap:
    munmap(map, len);
    return NULL;
}

ri_status_t mdl_gguf_open(const char *path, mdl_gguf_t **g_p, char *err, size_t errlen)
{
    ri_status_t st;
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) {
        int e = errno;
        snprintf(err, errlen, "gguf: cannot open %s: %s", path, strerror(e));
        return cm_status_from_errno(e);
    }
    struct stat sb;
    if (fstat(fd, &sb) != 0 || !S_ISREG(sb.st_mode) || sb.st_size <= 0) {
        snprintf(err, errlen, "gguf: %s is not a non-empty regular file", path);
        st = RI_ERR_FORMAT;
        goto err_close_fd;
    }
    size_t map_len = (size_t)sb.st_size;
    void *map = mdl_gguf_load_map ? NULL : mdl_gguf_read_huge(fd, (size_t)sb.st_size, &map_len);
    if (map == NULL)
        map = mmap(NULL, map_len, PROT_READ, MAP_PRIVATE, fd, 0);
    if (map == MAP_FAILED) {
        int e = errno;
        snprintf(err, errlen, "gguf: cannot map %s: %s", path, strerror(e));
        st = cm_status_from_errno(e);
        goto err_close_fd;
    }
    close(fd);
    mdl_gguf_t *g;
    st = mdl_gguf_open_mem(map, (size_t)sb.st_size, &g, err, errlen);
    if (st != RI_OK) {
        munmap(map, map_len);
        return st;
    }
    g->mapped = true;
    g->map_len = map_len;
    *g_p = g;
    return RI_OK;

err_close_fd:
    close(fd);
    return st;
}

void mdl_gguf_close(mdl_gguf_t *g)
{
    if (g == NULL)
        return;
    if (g->mapped)
        munmap((void *)g->base, g->map_len);
    mdl_gguf_free_parts(g);
    cm_free(g);
}

static bool mdl_str_eq(const mdl_gguf_str_t *s, const char *z)
{
    size_t n = strlen(z);
    return s->len == n && memcmp(s->ptr, z, n) == 0;
}

const mdl_gguf_kv_t *mdl_gguf_find(const mdl_gguf_t *g, const char *key)
{
    for (uint64_t i = 0; i < g->n_kv; i++)
        if (mdl_str_eq(&g->kv[i].key, key))
            return &g->kv[i];
    return NULL;
}

const mdl_gguf_tensor_t *mdl_gguf_tensor(const mdl_gguf_t *g, const char *name)
{
    for (uint64_t i = 0; i < g->n_tensors; i++)
        if (mdl_str_eq(&g->tensors[i].name, name))
            return &g->tensors[i];
    return NULL;
}

ri_status_t mdl_gguf_get_u64(const mdl_gguf_t *g, const char *key, uint64_t *v_p)
{
    const mdl_gguf_kv_t *kv = mdl_gguf_find(g, key);
    if (kv == NULL)
        return RI_ERR_NOT_FOUND;
    switch (kv->type) {
    case MDL_GGUF_U8: case MDL_GGUF_U16: case MDL_GGUF_U32: case MDL_GGUF_U64:
        *v_p = kv->v.u;
        return RI_OK;
    case MDL_GGUF_I8: case MDL_GGUF_I16: case MDL_GGUF_I32: case MDL_GGUF_I64:
        if (kv->v.i < 0)
            return RI_ERR_FORMAT;
        *v_p = (uint64_t)kv->v.i;
        return RI_OK;
    default:
        return RI_ERR_FORMAT;
    }
}

ri_status_t mdl_gguf_get_f32(const mdl_gguf_t *g, const char *key, float *v_p)
{
    const mdl_gguf_kv_t *kv = mdl_gguf_find(g, key);
    if (kv == NULL)
        return RI_ERR_NOT_FOUND;
    if (kv->type == MDL_GGUF_F32 || kv->type == MDL_GGUF_F64) {
        *v_p = (float)kv->v.f;
        return RI_OK;
    }
    uint64_t u;
    if (mdl_gguf_get_u64(g, key, &u) != RI_OK)
        return RI_ERR_FORMAT;
    *v_p = (float)u;
    return RI_OK;
}

ri_status_t mdl_gguf_get_bool(const mdl_gguf_t *g, const char *key, bool *v_p)
{
    const mdl_gguf_kv_t *kv = mdl_gguf_find(g, key);
    if (kv == NULL)
        return RI_ERR_NOT_FOUND;
    if (kv->type != MDL_GGUF_BOOL)
        return RI_ERR_FORMAT;
    *v_p = kv->v.u != 0;
    return RI_OK;
}

ri_status_t mdl_gguf_get_str(const mdl_gguf_t *g, const char *key, char **s_p)
{
    const mdl_gguf_kv_t *kv = mdl_gguf_find(g, key);
    if (kv == NULL)
        return RI_ERR_NOT_FOUND;
    if (kv->type != MDL_GGUF_STRING)
        return RI_ERR_FORMAT;
    char *s = cm_malloc(&mdl_gguf_tag, kv->v.s.len + 1);
    if (s == NULL)
        return RI_ERR_NOMEM;
    memcpy(s, kv->v.s.ptr, kv->v.s.len);
    s[kv->v.s.len] = '\0';
    *s_p = s;
    return RI_OK;
}
