/* Direct reads, the worker's side (gw_direct.h). */
#include "gpuworker/client/gw_direct.h"

#include <string.h>

#include "common/cm_alloc.h"
#include "common/cm_dp_direct.h"
#include "common/cm_dp_prefix.h"
#include "common/cm_log.h"
#include "gpuworker/client/gw_direct_share.h"

static CM_ALLOC_TAG(gw_direct_tag, "gw.direct");

/* Records per TOUCH: a few steps' worth, so the kvstore gets a message every
 * few tokens rather than one per layer-step. */
#define GW_TOUCH_BATCH 4096u

struct gw_direct {
    uint8_t *base;           /* the region, mapped (owned by the connection) */
    uint64_t bytes;
    size_t page_bytes;
    uint32_t n_layers, n_kv;
    gw_locs_t *shared;       /* the attached prefix's locations, the process's copy (one
                                reference, ours), or NULL */
    const uint64_t **sh;     /* [layer * n_kv + head] table t's in shared: kvstore ids
                                [0, first[t]) (NULL, first 0: none) */
    uint32_t *first;         /* [tables] ids below it are read from sh, not stored in off */
    uint64_t **off;          /* [tables] kvstore id i >= first[t] -> at [i - first[t]]: offset or
                                CM_DP_NOT_DIRECT */
    uint32_t *cap;           /* entries allocated per table in off (from first) */
    uint32_t *recs;          /* pending access records, 3 u32 each */
    uint32_t n_recs;
    uint64_t reads;
    struct {
        const uint8_t *base;   /* attached block `slot`, mapped (owned by the connection), or NULL */
        uint64_t bytes;
    } *blocks;                 /* by slot */
    uint32_t n_blocks;
};

ri_status_t gw_direct_open(gw_dp_t *dp, uint32_t n_layers, uint32_t n_kv, size_t page_bytes, gw_direct_t **d_p)
{
    gw_direct_t *d;
    ri_status_t st;

    *d_p = NULL;
    d = cm_calloc(&gw_direct_tag, 1, sizeof(*d));
    if (d == NULL)
        return RI_ERR_NOMEM;
    d->n_layers = n_layers;
    d->n_kv = n_kv;
    d->page_bytes = page_bytes;
    d->off = cm_calloc(&gw_direct_tag, (size_t)n_layers * n_kv, sizeof(*d->off));
    d->cap = cm_calloc(&gw_direct_tag, (size_t)n_layers * n_kv, sizeof(*d->cap));
    d->sh = cm_calloc(&gw_direct_tag, (size_t)n_layers * n_kv, sizeof(*d->sh));
    d->first = cm_calloc(&gw_direct_tag, (size_t)n_layers * n_kv, sizeof(*d->first));
    d->recs = cm_malloc(&gw_direct_tag, 3u * GW_TOUCH_BATCH * sizeof(uint32_t));
    if (d->off == NULL || d->cap == NULL || d->sh == NULL || d->first == NULL || d->recs == NULL) {
        gw_direct_close(d);
        return RI_ERR_NOMEM;
    }
    st = gw_dp_map(dp, &d->base, &d->bytes);
    if (st != RI_OK) {
        gw_direct_close(d);
        return st;
    }
    *d_p = d;
    return RI_OK;
}

void gw_direct_close(gw_direct_t *d)
{
    if (d == NULL)
        return;
    for (size_t i = 0; d->off != NULL && i < (size_t)d->n_layers * d->n_kv; i++)
        cm_free(d->off[i]);
    cm_free(d->off);
    cm_free(d->cap);
    cm_free(d->sh);
    cm_free(d->first);
    gw_locs_release(d->shared);
    cm_free(d->blocks);
    cm_free(d->recs);
    cm_free(d);
}

/* Make room for ids [first, want) of table t; new entries not located.
 * RI_ERR_INTERNAL for an id below the shared ones' end: the shared copy is
 * never written. */
static ri_status_t gw_direct_reserve(gw_direct_t *d, size_t t, uint64_t first, uint64_t want)
{
    uint64_t *n;
    uint32_t cap = d->cap[t] ? d->cap[t] : 256;

    if (first < d->first[t])
        return RI_ERR_INTERNAL;
    want -= d->first[t];
    if (want <= d->cap[t])
        return RI_OK;
    if (want > UINT32_MAX / 2)
        return RI_ERR_RANGE;
    while (cap < want)
        cap *= 2;
    n = cm_realloc(&gw_direct_tag, d->off[t], (size_t)cap * sizeof(uint64_t));
    if (n == NULL)
        return RI_ERR_NOMEM;
    for (uint32_t i = d->cap[t]; i < cap; i++)
        n[i] = CM_DP_NOT_DIRECT;
    d->off[t] = n;
    d->cap[t] = cap;
    return RI_OK;
}

ri_status_t gw_direct_apply(gw_direct_t *d, gw_io_t *io)
{
    gw_io_job_t *job = gw_io_take_located(io);
    ri_status_t st = RI_OK;

    while (job != NULL) {
        gw_io_job_t *next = job->next;
        uint64_t k = 0;
        for (uint32_t i = 0; st == RI_OK && i < job->n_heads; i++) {
            size_t t = (size_t)job->layer * d->n_kv + job->heads[i];
            uint64_t first = job->expect_first[i];
            if (job->layer >= d->n_layers || job->heads[i] >= d->n_kv) {
                st = RI_ERR_INTERNAL;
                break;
            }
            st = gw_direct_reserve(d, t, first, first + job->counts[i]);
            for (uint32_t c = 0; st == RI_OK && c < job->counts[i]; c++, k++)
                d->off[t][first - d->first[t] + c] = job->offs[k];
        }
        gw_io_job_free(job);
        job = next;
    }
    return st;
}

ri_status_t gw_direct_record(gw_direct_t *d, uint32_t layer, uint32_t head, uint32_t first, uint32_t count,
                             const uint64_t *offs)
{
    size_t t;
    ri_status_t st;

    if (d == NULL || offs == NULL || layer >= d->n_layers || head >= d->n_kv)
        return RI_ERR_INVALID;
    t = (size_t)layer * d->n_kv + head;
    st = gw_direct_reserve(d, t, first, (uint64_t)first + count);
    if (st != RI_OK)
        return st;
    memcpy(d->off[t] + (first - d->first[t]), offs, (size_t)count * sizeof(uint64_t));
    return RI_OK;
}

ri_status_t gw_direct_share(gw_direct_t *d, gw_locs_t *locs)
{
    size_t n_tables;

    if (d == NULL || locs == NULL || d->shared != NULL) {
        gw_locs_release(locs);
        return RI_ERR_INVALID;
    }
    n_tables = (size_t)d->n_layers * d->n_kv;
    for (size_t t = 0; t < n_tables; t++)
        if (d->cap[t] != 0) {
            gw_locs_release(locs);
            return RI_ERR_INVALID; /* before any other location: ids [0, first) are the prefix's */
        }
    d->shared = locs;
    for (size_t t = 0; t < n_tables; t++)
        d->sh[t] = gw_locs_table(locs, (uint32_t)t, &d->first[t]);
    return RI_OK;
}

ri_status_t gw_direct_set_block(gw_direct_t *d, uint32_t slot, const uint8_t *base, uint64_t bytes)
{
    if (d == NULL || base == NULL || slot > CM_PFX_LOC_MAX_SLOT)
        return RI_ERR_INVALID;
    if (slot >= d->n_blocks) {
        uint32_t cap = d->n_blocks ? d->n_blocks : 8u;
        while (cap <= slot)
            cap *= 2u;
        void *n = cm_realloc(&gw_direct_tag, d->blocks, (size_t)cap * sizeof(*d->blocks));
        if (n == NULL)
            return RI_ERR_NOMEM;
        d->blocks = n;
        memset(d->blocks + d->n_blocks, 0, (size_t)(cap - d->n_blocks) * sizeof(*d->blocks));
        d->n_blocks = cap;
    }
    d->blocks[slot].base = base;
    d->blocks[slot].bytes = bytes;
    return RI_OK;
}

/* An attached block's pages: off is tagged with its slot. */
static const uint8_t *gw_direct_block_pages(const gw_direct_t *d, uint64_t loc, uint64_t len)
{
    uint32_t slot = cm_pfx_loc_slot(loc);
    uint64_t off = cm_pfx_loc_off(loc);

    if (slot >= d->n_blocks || d->blocks[slot].base == NULL || off > d->blocks[slot].bytes ||
        len > d->blocks[slot].bytes - off)
        return NULL;
    return d->blocks[slot].base + off;
}

const uint8_t *gw_direct_pages(const gw_direct_t *d, uint32_t layer, uint32_t head, uint32_t id, uint32_t n_pages)
{
    size_t t;
    uint64_t off, len;

    if (d == NULL)
        return NULL;
    t = (size_t)layer * d->n_kv + head;
    if (id < d->first[t])
        off = d->sh[t][id];
    else if (id - d->first[t] < d->cap[t])
        off = d->off[t][id - d->first[t]];
    else
        return NULL;
    len = (uint64_t)n_pages * d->page_bytes;
    if (cm_pfx_loc_is_block(off))
        return gw_direct_block_pages(d, off, len);
    /* The kvstore says where; we still keep every read inside the mapping. */
    if (off == CM_DP_NOT_DIRECT || off > d->bytes || len > d->bytes - off)
        return NULL;
    return d->base + off;
}

void gw_direct_flush(gw_direct_t *d, gw_io_t *io)
{
    gw_io_job_t *job;

    if (d == NULL || d->n_recs == 0)
        return;
    job = cm_calloc(&gw_direct_tag, 1, sizeof(*job));
    if (job == NULL)
        return; /* the records are advisory: dropped under memory pressure */
    job->kind = GW_IO_TOUCH;
    job->recs = d->recs;
    job->n_recs = d->n_recs;
    d->recs = cm_malloc(&gw_direct_tag, 3u * GW_TOUCH_BATCH * sizeof(uint32_t));
    d->n_recs = 0;
    if (d->recs == NULL) {
        d->recs = job->recs; /* keep ours, drop this batch */
        job->recs = NULL;
        gw_io_job_free(job);
        return;
    }
    gw_io_submit(io, job); /* detached: the io thread frees it */
}

void gw_direct_touch(gw_direct_t *d, gw_io_t *io, uint32_t layer, uint32_t head, uint32_t id)
{
    uint32_t *r = d->recs + 3u * d->n_recs;
    r[0] = layer;
    r[1] = head;
    r[2] = id;
    d->reads++;
    if (++d->n_recs == GW_TOUCH_BATCH)
        gw_direct_flush(d, io);
}

void gw_direct_mapping(const gw_direct_t *d, const uint8_t **base_p, uint64_t *bytes_p)
{
    *base_p = d->base;
    *bytes_p = d->bytes;
}

uint64_t gw_direct_reads(const gw_direct_t *d)
{
    return d != NULL ? d->reads : 0;
}
