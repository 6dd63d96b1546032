/* KV capture writer and reader (see mdl_kvdump.h, docs/kv-dump-format.md). */
#define _GNU_SOURCE
#include "gpuworker/model/mdl_kvdump.h"

#include <errno.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>

#include "common/cm_alloc.h"
#include "common/cm_crc32c.h"
#include "common/cm_log.h"
#include "common/cm_status.h"

static CM_ALLOC_TAG(mdl_dump_tag, "model.kvdump");

struct mdl_kvdump {
    mdl_hparams_t hp;    /* geometry */
    size_t n_steps;      /* queries per layer so far */
    size_t cap_steps;    /* allocated */
    uint64_t *pos;       /* [cap_steps] */
    float *q;            /* [n_layers][cap_steps][n_heads*d] grown together */
    bool oom;            /* a query could not be kept */
};

/* On-disk header, little-endian, 64 bytes. */
typedef struct mdl_kvdump_hdr {
    uint32_t magic, version, header_bytes, layer;
    uint32_t n_heads, n_kv_heads, head_dim, kv_dtype;
    uint64_t n_tokens, n_queries;
    uint32_t crc32c;     /* of everything after the header */
    uint8_t reserved[12];
} mdl_kvdump_hdr_t;

_Static_assert(sizeof(mdl_kvdump_hdr_t) == MDL_KVDUMP_HEADER_BYTES, "header is 64 bytes");

ri_status_t mdl_kvdump_create(const mdl_hparams_t *hp, mdl_kvdump_t **d_p)
{
    mdl_kvdump_t *d = cm_calloc(&mdl_dump_tag, 1, sizeof(*d));
    if (d == NULL)
        return RI_ERR_NOMEM;
    d->hp = *hp;
    *d_p = d;
    return RI_OK;
}

void mdl_kvdump_destroy(mdl_kvdump_t *d)
{
    if (d == NULL)
        return;
    cm_free(d->pos);
    cm_free(d->q);
    cm_free(d);
}

static void mdl_kvdump_hook(void *arg, uint32_t layer, size_t pos, const float *q)
{
    mdl_kvdump_t *d = arg;
    size_t qd = (size_t)d->hp.n_heads * d->hp.head_dim, L = d->hp.n_layers;
    if (layer == 0) {
        if (d->n_steps == d->cap_steps) {
            size_t cap = d->cap_steps ? 2 * d->cap_steps : 64;
            uint64_t *np = cm_realloc(&mdl_dump_tag, d->pos, cap * sizeof(*np));
            float *nq = cm_malloc(&mdl_dump_tag, cap * L * qd * sizeof(float));
            if (np == NULL || nq == NULL) {
                if (np != NULL)
                    d->pos = np;
                cm_free(nq);
                d->oom = true;
                return;
            }
            for (size_t l = 0; l < L && d->q != NULL; l++)
                memcpy(nq + l * cap * qd, d->q + l * d->cap_steps * qd, d->n_steps * qd * sizeof(float));
            cm_free(d->q);
            d->pos = np, d->q = nq, d->cap_steps = cap;
        }
        d->pos[d->n_steps++] = pos;
    }
    if (d->oom || d->n_steps == 0 || d->pos[d->n_steps - 1] != pos)
        return;
    memcpy(d->q + (layer * d->cap_steps + d->n_steps - 1) * qd, q, qd * sizeof(float));
}

void mdl_kvdump_attach(mdl_kvdump_t *d, mdl_seq_t *s)
{
    mdl_seq_set_qhook(s, mdl_kvdump_hook, d);
}

static ri_status_t mdl_write_all(FILE *f, const void *p, size_t n, uint32_t *crc)
{
    if (crc != NULL)
        *crc = cm_crc32c(*crc, p, n);
    return fwrite(p, 1, n, f) == n ? RI_OK : RI_ERR_IO;
}

ri_status_t mdl_kvdump_write(const mdl_kvdump_t *d, const mdl_seq_t *s, const char *dir, size_t n_prompt,
                             const char *model_name)
{
    if (d->oom) {
        cm_error("kv dump: out of memory while collecting queries");
        return RI_ERR_NOMEM;
    }
    if (mkdir(dir, 0755) != 0 && errno != EEXIST) {
        cm_error("kv dump: cannot create %s: %s", dir, strerror(errno));
        return cm_status_from_errno(errno);
    }
    const mdl_kv_t *kv = mdl_seq_kv(s);
    const mdl_hparams_t *hp = &d->hp;
    size_t qd = (size_t)hp->n_heads * hp->head_dim, n = kv->len, row = hp->head_dim;
    char path[4096];
    for (uint32_t l = 0; l < hp->n_layers; l++) {
        snprintf(path, sizeof(path), "%s/layer-%03u.rikv", dir, l);
        FILE *f = fopen(path, "wb");
        if (f == NULL) {
            cm_error("kv dump: cannot create %s: %s", path, strerror(errno));
            return cm_status_from_errno(errno);
        }
        mdl_kvdump_hdr_t h = {.magic = MDL_KVDUMP_MAGIC, .version = MDL_KVDUMP_VERSION,
                              .header_bytes = MDL_KVDUMP_HEADER_BYTES, .layer = l, .n_heads = hp->n_heads,
                              .n_kv_heads = hp->n_kv_heads, .head_dim = hp->head_dim, .kv_dtype = 1,
                              .n_tokens = n, .n_queries = d->n_steps};
        ri_status_t st = mdl_write_all(f, &h, sizeof(h), NULL);
        uint32_t crc = 0;
        for (int which = 0; which < 2 && st == RI_OK; which++)
            for (uint32_t kh = 0; kh < hp->n_kv_heads && st == RI_OK; kh++)
                for (size_t t = 0; t < n && st == RI_OK; t++) {   /* the file is head-major */
                    const cm_fp16_t *src = which ? mdl_kv_vrow(kv, l, kh, t) : mdl_kv_krow(kv, l, kh, t);
                    st = mdl_write_all(f, src, row * sizeof(cm_fp16_t), &crc);
                }
        for (size_t i = 0; i < d->n_steps && st == RI_OK; i++) {
            st = mdl_write_all(f, &d->pos[i], sizeof(uint64_t), &crc);
            if (st == RI_OK)
                st = mdl_write_all(f, d->q + (l * d->cap_steps + i) * qd, qd * sizeof(float), &crc);
        }
        h.crc32c = crc;
        if (st == RI_OK && (fseek(f, 0, SEEK_SET) != 0 || fwrite(&h, sizeof(h), 1, f) != 1))
            st = RI_ERR_IO;
        if (fclose(f) != 0 && st == RI_OK)
            st = RI_ERR_IO;
        if (st != RI_OK) {
            cm_error("kv dump: writing %s failed: %s", path, strerror(errno));
            return st;
        }
    }
    snprintf(path, sizeof(path), "%s/meta.json", dir);
    FILE *f = fopen(path, "w");
    if (f == NULL) {
        cm_error("kv dump: cannot create %s: %s", path, strerror(errno));
        return cm_status_from_errno(errno);
    }
    fprintf(f,
            "{\"format\": \"rikv\", \"version\": %u, \"model\": \"%s\", \"n_layers\": %u, \"n_heads\": %u, "
            "\"n_kv_heads\": %u, \"head_dim\": %u, \"n_tokens\": %zu, \"n_prompt\": %zu, \"n_queries\": %zu, "
            "\"kv_dtype\": \"f16\", \"rope\": \"applied\"}\n",
            MDL_KVDUMP_VERSION, model_name, hp->n_layers, hp->n_heads, hp->n_kv_heads, hp->head_dim, n, n_prompt,
            d->n_steps);
    if (fclose(f) != 0)
        return RI_ERR_IO;
    return RI_OK;
}

void mdl_kvdump_layer_free(mdl_kvdump_layer_t *l)
{
    if (l == NULL)
        return;
    cm_free(l->k);
    cm_free(l->v);
    cm_free(l->q_pos);
    cm_free(l->q);
    memset(l, 0, sizeof(*l));
}

ri_status_t mdl_kvdump_read_layer(const char *path, mdl_kvdump_layer_t *l_p, char *err, size_t errlen)
{
    mdl_kvdump_layer_t l = {0};
    ri_status_t st = RI_OK;
    FILE *f = fopen(path, "rb");
    if (f == NULL) {
        snprintf(err, errlen, "kv dump: cannot open %s: %s", path, strerror(errno));
        return cm_status_from_errno(errno);
    }
    mdl_kvdump_hdr_t h;
    if (fread(&h, sizeof(h), 1, f) != 1) {
        snprintf(err, errlen, "kv dump: %s: truncated header", path);
        st = RI_ERR_TRUNCATED;
        goto err_close;
    }
    if (h.magic != MDL_KVDUMP_MAGIC) {
        snprintf(err, errlen, "kv dump: %s: bad magic", path);
        st = RI_ERR_BAD_MAGIC;
        goto err_close;
    }
    if (h.version != MDL_KVDUMP_VERSION || h.header_bytes != MDL_KVDUMP_HEADER_BYTES) {
        snprintf(err, errlen, "kv dump: %s: unsupported version %u", path, h.version);
        st = RI_ERR_BAD_VERSION;
        goto err_close;
    }
    if (h.kv_dtype != 1 || h.n_kv_heads == 0 || h.n_heads == 0 || h.n_heads % h.n_kv_heads != 0 ||
        h.head_dim == 0 || h.head_dim > 1024 || h.n_heads > 1024 || h.n_tokens > (1ull << 26) ||
        h.n_queries > (1ull << 24)) {
        snprintf(err, errlen, "kv dump: %s: implausible header", path);
        st = RI_ERR_FORMAT;
        goto err_close;
    }
    l.layer = h.layer, l.n_heads = h.n_heads, l.n_kv_heads = h.n_kv_heads, l.head_dim = h.head_dim;
    l.n_tokens = h.n_tokens, l.n_queries = h.n_queries;
    size_t kvn = (size_t)h.n_kv_heads * h.n_tokens * h.head_dim, qd = (size_t)h.n_heads * h.head_dim;
    l.k = cm_malloc(&mdl_dump_tag, kvn * sizeof(cm_fp16_t) + 1);
    l.v = cm_malloc(&mdl_dump_tag, kvn * sizeof(cm_fp16_t) + 1);
    l.q_pos = cm_malloc(&mdl_dump_tag, h.n_queries * sizeof(uint64_t) + 1);
    l.q = cm_malloc(&mdl_dump_tag, h.n_queries * qd * sizeof(float) + 1);
    if (!l.k || !l.v || !l.q_pos || !l.q) {
        st = RI_ERR_NOMEM;
        goto err_free;
    }
    uint32_t crc = 0;
    if (fread(l.k, sizeof(cm_fp16_t), kvn, f) != kvn || fread(l.v, sizeof(cm_fp16_t), kvn, f) != kvn) {
        snprintf(err, errlen, "kv dump: %s: truncated K/V", path);
        st = RI_ERR_TRUNCATED;
        goto err_free;
    }
    crc = cm_crc32c(crc, l.k, kvn * sizeof(cm_fp16_t));
    crc = cm_crc32c(crc, l.v, kvn * sizeof(cm_fp16_t));
    for (uint64_t i = 0; i < h.n_queries; i++) {
        if (fread(&l.q_pos[i], 8, 1, f) != 1 || fread(l.q + i * qd, sizeof(float), qd, f) != qd) {
            snprintf(err, errlen, "kv dump: %s: truncated queries", path);
            st = RI_ERR_TRUNCATED;
            goto err_free;
        }
        crc = cm_crc32c(crc, &l.q_pos[i], 8);
        crc = cm_crc32c(crc, l.q + i * qd, qd * sizeof(float));
        if (l.q_pos[i] >= h.n_tokens) {
            snprintf(err, errlen, "kv dump: %s: query position %llu beyond %llu tokens", path,
                     (unsigned long long)l.q_pos[i], (unsigned long long)h.n_tokens);
            st = RI_ERR_FORMAT;
            goto err_free;
        }
    }
    if (crc != h.crc32c) {
        snprintf(err, errlen, "kv dump: %s: checksum mismatch", path);
        st = RI_ERR_CORRUPT;
        goto err_free;
    }
    fclose(f);
    *l_p = l;
    return RI_OK;

err_free:
    mdl_kvdump_layer_free(&l);
err_close:
    fclose(f);
    return st;
}
