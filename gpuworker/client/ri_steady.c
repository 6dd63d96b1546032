/* A session's own steady zone (ri_steady.h). */
#include "gpuworker/client/ri_steady.h"

#include <string.h>
#include <sys/mman.h>

#include "common/cm_alloc.h"
#include "common/cm_half.h"

static CM_ALLOC_TAG(ri_steady_tag, "api.steady");

struct ri_steady {
    uint32_t n_layers, n_kv, d;
    size_t cap;
    size_t bytes;          /* of one layer's K (or V) array */
    uint16_t **k, **v;     /* [n_layers] mmap'd arrays */
    size_t *len;           /* [n_layers] tokens stored */
    size_t *rel_from;      /* [n_layers] tokens [rel_from, rel_end) given back */
    size_t *rel_end;
};

static uint16_t *ri_steady_map(size_t bytes)
{
    void *p = mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    return p == MAP_FAILED ? NULL : p;
}

ri_status_t ri_steady_create(uint32_t n_layers, uint32_t n_kv, uint32_t d, size_t cap, ri_steady_t **st_p)
{
    ri_steady_t *st = cm_calloc(&ri_steady_tag, 1, sizeof(*st));

    if (st == NULL)
        return RI_ERR_NOMEM;
    st->n_layers = n_layers;
    st->n_kv = n_kv;
    st->d = d;
    st->cap = cap;
    st->bytes = (size_t)n_kv * cap * d * sizeof(uint16_t);
    st->k = cm_calloc(&ri_steady_tag, n_layers, sizeof(*st->k));
    st->v = cm_calloc(&ri_steady_tag, n_layers, sizeof(*st->v));
    st->len = cm_calloc(&ri_steady_tag, n_layers, sizeof(size_t));
    st->rel_from = cm_calloc(&ri_steady_tag, n_layers, sizeof(size_t));
    st->rel_end = cm_calloc(&ri_steady_tag, n_layers, sizeof(size_t));
    if (st->k == NULL || st->v == NULL || st->len == NULL || st->rel_from == NULL || st->rel_end == NULL)
        goto err;
    for (uint32_t l = 0; l < n_layers; l++)
        if ((st->k[l] = ri_steady_map(st->bytes)) == NULL || (st->v[l] = ri_steady_map(st->bytes)) == NULL)
            goto err;
    *st_p = st;
    return RI_OK;
err:
    ri_steady_destroy(st);
    return RI_ERR_NOMEM;
}

void ri_steady_destroy(ri_steady_t *st)
{
    if (st == NULL)
        return;
    for (uint32_t l = 0; l < st->n_layers; l++) {
        if (st->k != NULL && st->k[l] != NULL)
            munmap(st->k[l], st->bytes);
        if (st->v != NULL && st->v[l] != NULL)
            munmap(st->v[l], st->bytes);
    }
    cm_free(st->k);
    cm_free(st->v);
    cm_free(st->len);
    cm_free(st->rel_from);
    cm_free(st->rel_end);
    cm_free(st);
}

ri_status_t ri_steady_append(ri_steady_t *st, uint32_t layer, const uint16_t *k, const uint16_t *v, size_t n,
                             size_t token_stride, size_t head_stride)
{
    size_t row = (size_t)st->d * sizeof(uint16_t), pos = st->len[layer];

    if (n > st->cap - pos)
        return RI_ERR_RANGE;
    for (size_t t = 0; t < n; t++)
        for (uint32_t h = 0; h < st->n_kv; h++) {
            size_t dst = ((pos + t) * st->n_kv + h) * st->d, src = t * token_stride + h * head_stride;
            memcpy(st->k[layer] + dst, k + src, row);
            memcpy(st->v[layer] + dst, v + src, row);
        }
    st->len[layer] += n;
    return RI_OK;
}

kn_kv_view_t ri_steady_view(const ri_steady_t *st, uint32_t layer)
{
    return (kn_kv_view_t){.k = (const cm_fp16_t *)st->k[layer], .v = (const cm_fp16_t *)st->v[layer],
                          .n_tokens = st->len[layer], .token_stride = (size_t)st->n_kv * st->d, .head_stride = st->d};
}

void ri_steady_release(ri_steady_t *st, uint32_t layer, size_t from, size_t to)
{
    size_t tok = (size_t)st->n_kv * st->d * sizeof(uint16_t);

    if (st->rel_end[layer] == 0)
        st->rel_from[layer] = st->rel_end[layer] = from;
    from = st->rel_end[layer]; /* what is given back stays so: go on from there */
    if (to > st->len[layer] || to <= from)
        return;
    (void)cm_release_pages((uint8_t *)st->k[layer] + from * tok, (to - from) * tok);
    (void)cm_release_pages((uint8_t *)st->v[layer] + from * tok, (to - from) * tok);
    st->rel_end[layer] = to;
}

uint64_t ri_steady_bytes(const ri_steady_t *st)
{
    uint64_t b = 0;
    for (uint32_t l = 0; st != NULL && l < st->n_layers; l++)
        b += (uint64_t)(st->len[l] - (st->rel_end[l] - st->rel_from[l])) * st->n_kv * st->d * sizeof(uint16_t) * 2u;
    return b;
}
