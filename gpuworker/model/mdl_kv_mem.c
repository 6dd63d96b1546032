/* Residency of a K/V cache (mdl_kv_mem.h). */
#include "gpuworker/model/mdl_kv_mem.h"

#include <stdlib.h>
#include <sys/mman.h>
#include <unistd.h>

#include "common/cm_alloc.h"
#include "common/cm_half.h"

static CM_ALLOC_TAG(mdl_kv_mem_tag, "model.kv.mincore");

static size_t mdl_page(void)
{
    long p = sysconf(_SC_PAGESIZE);
    return p > 0 ? (size_t)p : 4096;
}

uint64_t mdl_kv_release(mdl_kv_t *kv, uint32_t layer, size_t t0, size_t t1)
{
    if (layer >= kv->geom.n_layers || t1 > kv->cap || t1 <= t0)
        return 0;
    const size_t row = (size_t)kv->geom.head_dim * sizeof(cm_fp16_t);
    if (mdl_kv_is_token_major(kv)) { /* the range is one run for K and one for V */
        size_t bytes = (t1 - t0) * kv->geom.n_kv_heads * row;
        return cm_release_pages(mdl_kv_krow(kv, layer, 0, t0), bytes) +
               cm_release_pages(mdl_kv_vrow(kv, layer, 0, t0), bytes);
    }
    uint64_t done = 0;
    for (uint32_t h = 0; h < kv->geom.n_kv_heads; h++) {
        done += cm_release_pages(mdl_kv_krow(kv, layer, h, t0), (t1 - t0) * row);
        done += cm_release_pages(mdl_kv_vrow(kv, layer, h, t0), (t1 - t0) * row);
    }
    return done;
}

/* Resident bytes of [a, a + n), whole pages counted. */
static uint64_t mdl_resident_range(const uint8_t *a, size_t n, unsigned char *vec, size_t vec_len)
{
    size_t pg = mdl_page();
    uintptr_t lo = (uintptr_t)a / pg * pg, hi = ((uintptr_t)a + n + pg - 1) / pg * pg;
    size_t pages = (hi - lo) / pg;
    uint64_t res = 0;

    if (pages > vec_len || mincore((void *)lo, hi - lo, vec) != 0)
        return n; /* cannot tell: count it all */
    for (size_t i = 0; i < pages; i++)
        res += (vec[i] & 1) ? pg : 0;
    return res;
}

uint64_t mdl_kv_resident_bytes(const mdl_kv_t *kv)
{
    size_t bytes = (size_t)kv->geom.n_kv_heads * kv->cap * kv->geom.head_dim * sizeof(cm_fp16_t);
    size_t vec_len = bytes / mdl_page() + 2;
    unsigned char *vec = cm_malloc(&mdl_kv_mem_tag, vec_len);
    uint64_t res = 0;

    if (vec == NULL)
        return 2ull * bytes * kv->geom.n_layers;
    for (uint32_t l = 0; l < kv->geom.n_layers; l++) {
        res += mdl_resident_range((const uint8_t *)kv->k[l], bytes, vec, vec_len);
        res += mdl_resident_range((const uint8_t *)kv->v[l], bytes, vec, vec_len);
    }
    cm_free(vec);
    return res;
}
