/*
 * Prefix blocks attached to a remote session (gw_remote.h, "Prefix
 * blocks"): the attach and its reads on the session's own connection, the
 * bookkeeping that makes the kvstore's leading attached clusters the
 * index's imported ones, and the blocks' K/V for the engine's preload.
 */
#include "gpuworker/client/gw_remote.h"

#include <string.h>

#include "common/cm_alloc.h"
#include "common/cm_dp_prefix.h"
#include "common/cm_log.h"
#include "common/cm_status.h"
#include "gpuworker/client/gw_direct_share.h"
#include "gpuworker/client/gw_dp.h"
#include "gpuworker/client/gw_remote_int.h"

static CM_ALLOC_TAG(gw_remote_pfx_tag, "gw.remote.prefix");

/* What the attach does on the connection (a GW_IO_CALL job). */
typedef struct gw_attach {
    gw_remote_t *r;
    const uint8_t *keys;
    uint32_t n_keys;
    cm_pfx_attached_t *att; /* [n_keys] */
    uint32_t n_att;         /* attached by the kvstore (the tables hold their clusters) */
} gw_attach_t;

/* The geometry a block of this session must have. */
static void gw_prefix_layout(const gw_remote_t *r, gw_pfx_layout_t *lay)
{
    memset(lay, 0, sizeof(*lay));
    lay->indexed = 1;
    lay->cluster_tokens = r->p.wave.tokens_per_cluster;
    lay->sink_tokens = r->p.wave.sink_tokens;
    lay->block_tokens = r->p.wave.segment_tokens ? r->p.wave.segment_tokens : KN_WAVE_SEGMENT_TOKENS;
    lay->page_tokens = r->P;
    lay->dtype = GW_PFX_DTYPE_F16;
    lay->n_layers = r->n_layers;
    lay->n_kv_heads = r->n_kv;
    lay->head_dim = r->d;
}

/* The bytes of attached block i: mapped in place (recorded for direct
 * reads), else a PREFIX_GET copy owned by r. */
static ri_status_t gw_prefix_read(gw_remote_t *r, gw_dp_t *dp, uint32_t i, const cm_pfx_attached_t *a,
                                  const uint8_t **buf_p)
{
    const uint8_t *base = NULL;
    uint64_t bytes = 0;
    ri_status_t st = gw_dp_map_block(dp, a->slot, &base, &bytes);

    if (st == RI_OK) {
        if (bytes < a->block_bytes)
            return RI_ERR_TRUNCATED;
        if (r->direct != NULL && (st = gw_direct_set_block(r->direct, a->slot, base, a->block_bytes)) != RI_OK)
            return st;
        *buf_p = base;
        return RI_OK;
    }
    if (st != RI_ERR_UNSUPPORTED)
        return st;
    if (a->block_bytes == 0 || a->block_bytes > CM_PFX_MAX_BLOCK_BYTES)
        return RI_ERR_PROTOCOL;
    r->pfx_copies[i] = cm_malloc_aligned(&gw_remote_pfx_tag, (size_t)a->block_bytes, 64);
    if (r->pfx_copies[i] == NULL)
        return RI_ERR_NOMEM;
    st = gw_dp_prefix_get(dp, a->slot, 0, r->pfx_copies[i], a->block_bytes);
    if (st == RI_OK)
        *buf_p = r->pfx_copies[i];
    return st;
}

/* Count block buf's clusters into the heads' attached ranges and the pages
 * the block cache is sized from. */
static void gw_prefix_count(gw_remote_t *r, const uint8_t *buf, uint64_t len)
{
    cm_pfx_view_t v;
    const uint8_t *sz;
    if (cm_pfx_decode(buf, len, &v) != RI_OK) /* parsed whole already */
        return;
    sz = v.sizes;
    for (uint32_t t = 0; t < v.n_tables; t++) {
        gw_layer_t *L = &r->layers[t / r->n_kv];
        gw_head_t *H = &L->hd[t % r->n_kv];
        uint32_t c = cm_dp_get32(v.counts + 4u * t);
        H->n_attached += c;
        H->n_remote += c;
        L->appendable = L->appendable || c > 0;
        for (; c > 0; c--, sz += 4) {
            uint32_t np = gw_pages(r, cm_dp_get32(sz));
            H->max_pages = CM_MAX(H->max_pages, np);
            r->pages_uploaded += np;
        }
    }
}

/* Hold the LOCATE answers locs (counts[t] a table, table after table) for
 * the direct reads: the process's copy when they equal it (key: the last
 * attached block), else the sequence's own. */
static ri_status_t gw_prefix_keep_locs(gw_remote_t *r, const uint8_t *key, const uint32_t *counts, const uint64_t *locs)
{
    uint32_t n_tables = r->n_layers * r->n_kv;
    gw_locs_t *shared = NULL;
    ri_status_t st = RI_ERR_UNSUPPORTED;
    uint64_t at = 0;

#ifndef GW_PREFIX_MUTANT_PRIVATE_LOCS /* the mutant: every sequence stores them, as before */
    st = gw_locs_acquire(key, r->pfx_blocks, n_tables, r->page_bytes, counts, locs, &shared);
#endif
    if (st == RI_OK)
        return gw_direct_share(r->direct, shared); /* takes the reference */
    if (st == RI_ERR_EXISTS)
        cm_info("prefix: the locations of %u attached blocks differ from the process's copy: this sequence keeps "
                "its own",
                r->pfx_blocks);
    st = RI_OK;
    for (uint32_t t = 0; t < n_tables && st == RI_OK; at += counts[t], t++)
        if (counts[t] > 0)
            st = gw_direct_record(r->direct, t / r->n_kv, t % r->n_kv, 0, counts[t], locs + at);
    return st;
}

/* LOCATE every attached cluster, so that steps read them in place. */
static ri_status_t gw_prefix_locate(gw_remote_t *r, gw_dp_t *dp, const uint8_t *key)
{
    uint32_t n_tables = r->n_layers * r->n_kv;
    uint32_t *counts = cm_calloc(&gw_remote_pfx_tag, n_tables, sizeof(*counts));
    uint64_t *locs = NULL, total = 0, at = 0;
    ri_status_t st = counts != NULL ? RI_OK : RI_ERR_NOMEM;

    for (uint32_t t = 0; st == RI_OK && t < n_tables; t++) {
        counts[t] = r->layers[t / r->n_kv].hd[t % r->n_kv].n_attached;
        total += counts[t];
    }
    if (st == RI_OK && total > 0) {
        /* all of them at once (transient): compared whole with the shared copy */
        locs = cm_malloc(&gw_remote_pfx_tag, (size_t)total * sizeof(*locs));
        st = locs != NULL ? RI_OK : RI_ERR_NOMEM;
    }
    for (uint32_t t = 0; st == RI_OK && t < n_tables; at += counts[t], t++)
        if (counts[t] > 0)
            st = gw_dp_locate(dp, t / r->n_kv, t % r->n_kv, 0, counts[t], locs + at);
    if (st == RI_OK && total > 0)
        st = gw_prefix_keep_locs(r, key, counts, locs);
    cm_free(locs);
    cm_free(counts);
    return st;
}

/* The attach, on the connection (the io thread held off). */
static ri_status_t gw_prefix_attach_call(gw_dp_t *dp, void *arg)
{
    gw_attach_t *a = arg;
    gw_remote_t *r = a->r;
    gw_pfx_layout_t lay;
    ri_status_t st;

    st = gw_dp_prefix_attach(dp, a->keys, a->n_keys, a->att, &a->n_att);
    if (st != RI_OK || a->n_att == 0)
        return st;
    gw_prefix_layout(r, &lay);
    r->pfx_copies = cm_calloc(&gw_remote_pfx_tag, a->n_att, sizeof(*r->pfx_copies));
    if (r->pfx_copies == NULL)
        return RI_ERR_NOMEM;
    r->pfx_cap = a->n_att;
    r->pfx_blocks = a->n_att;
    st = gw_pfx_set_create(&lay, a->n_att, &r->pfx);
    for (uint32_t i = 0; i < a->n_att && st == RI_OK; i++) {
        const uint8_t *buf = NULL;
        if (a->att[i].slot != i || a->att[i].n_tokens != lay.block_tokens) {
            st = RI_ERR_PROTOCOL; /* the session's first attach: its slots are the blocks */
            break;
        }
        st = gw_prefix_read(r, dp, i, &a->att[i], &buf);
        if (st == RI_OK)
            st = gw_pfx_set_add(r->pfx, buf, a->att[i].block_bytes);
        if (st == RI_OK)
            gw_prefix_count(r, buf, a->att[i].block_bytes);
    }
    if (st == RI_OK && r->direct != NULL)
        st = gw_prefix_locate(r, dp, a->keys + (size_t)(a->n_att - 1) * CM_PFX_KEY_SIZE);
    return st;
}

/* Map the attached prefix's rows shared by the process's sequences at the
 * head of each index (gw_meta_share.h); key names the last attached block.
 * Without them the index copies its own, as the build always did. */
static void gw_prefix_share(gw_remote_t *r, const uint8_t *key)
{
    kn_wave_t **waves = cm_calloc(&gw_remote_pfx_tag, r->n_layers, sizeof(*waves));

    if (waves == NULL)
        return;
    for (uint32_t l = 0; l < r->n_layers; l++)
        waves[l] = r->layers[l].wave;
    if (gw_meta_attach(key, r->pfx, r->n_layers, r->n_kv, r->d, waves, &r->meta) != RI_OK)
        r->meta = NULL;
    cm_free(waves);
}

ri_status_t gw_remote_attach_prefix(gw_remote_t *r, const uint8_t *keys, uint32_t n_keys, uint32_t *n_attached_p)
{
    gw_attach_t a = {.r = r, .keys = keys, .n_keys = n_keys};
    gw_io_job_t job = {.kind = GW_IO_CALL, .fn = gw_prefix_attach_call, .arg = &a};
    ri_status_t st;

    if (r == NULL || keys == NULL || n_attached_p == NULL || n_keys == 0 || n_keys > CM_PFX_MAX_KEYS ||
        r->pfx != NULL || r->pfx_copies != NULL || r->step.active)
        return RI_ERR_INVALID;
    for (uint32_t l = 0; l < r->n_layers; l++)
        if (r->layers[l].idx[0].n_clusters != 0 || r->layers[l].appendable)
            return RI_ERR_INVALID; /* before any build */
    if (r->err != RI_OK)
        return r->err;
    a.att = cm_calloc(&gw_remote_pfx_tag, n_keys, sizeof(*a.att));
    if (a.att == NULL)
        return RI_ERR_NOMEM;
    st = gw_io_call(r->io, &job); /* a failure is sticky on the connection */
    cm_free(a.att);
    if (st != RI_OK) {
        if (r->err == RI_OK)
            r->err = st;
        cm_error("data plane: prefix attach of %u blocks failed: %s", n_keys, ri_status_str(st));
        return st;
    }
    if (a.n_att > 0 && r->pfx != NULL)
        gw_prefix_share(r, keys + (size_t)(a.n_att - 1) * CM_PFX_KEY_SIZE);
    *n_attached_p = a.n_att;
    return RI_OK;
}

size_t gw_remote_prefix_tokens(const gw_remote_t *r)
{
    if (r == NULL)
        return 0;
    uint32_t B = r->p.wave.segment_tokens ? r->p.wave.segment_tokens : KN_WAVE_SEGMENT_TOKENS;
    return (size_t)r->pfx_blocks * B;
}

ri_status_t gw_remote_prefix_fill(gw_remote_t *r, uint32_t layer, uint32_t kv_head, size_t pos0, size_t n,
                                  cm_fp16_t *k, cm_fp16_t *v, size_t token_stride)
{
    if (r == NULL || r->pfx == NULL || layer >= r->n_layers || kv_head >= r->n_kv || k == NULL || v == NULL ||
        token_stride < r->d)
        return RI_ERR_INVALID; /* also once every layer is built: the parse is gone */
    return gw_pfx_set_fill(r->pfx, layer, kv_head, pos0, n, k, v, token_stride);
}

ri_status_t gw_prefix_adopt(gw_remote_t *r, gw_layer_t *L, const uint32_t *first)
{
    for (uint32_t h = 0; h < r->n_kv; h++) {
        gw_head_t *H = &L->hd[h];
        if (first[h] == 0)
            continue; /* nothing imported: the attached clusters stay unnamed by the index */
        if (first[h] != H->n_attached || first[h] > L->idx[h].n_clusters) {
            cm_error("prefix: layer %u head %u imported %u clusters, the session has %u attached", L->layer, h,
                     first[h], H->n_attached);
            return RI_ERR_INTERNAL;
        }
        /* imported in attach order (the tables' order): local id = kvstore
         * id, which gw_rid / gw_lid answer without storing them */
        if (H->rcap != 0)
            return RI_ERR_INTERNAL; /* the build's call comes before any id is given */
        H->base = first[h];
        if (gw_head_reserve(H, first[h]) != RI_OK)
            return RI_ERR_NOMEM;
#ifdef GW_PREFIX_MUTANT_STORE_IDS
        if (gw_head_unbase(H) != RI_OK) /* the mutant: every sequence stores the ids again */
            return RI_ERR_NOMEM;
#endif
    }
    return RI_OK;
}

const kn_wave_pieces_t *gw_prefix_pieces(gw_remote_t *r, uint32_t layer)
{
    return r->pfx != NULL ? gw_pfx_set_pieces(r->pfx, layer) : NULL;
}

void gw_prefix_built(gw_remote_t *r, uint32_t layer)
{
    (void)layer; /* each layer builds once (kn_wave_build_pieces refuses a built index) */
    if (r->pfx == NULL || ++r->pfx_built < r->n_layers)
        return;
#ifdef GW_PREFIX_MUTANT_KEEP_PARSE
    return; /* the mutant: every sequence keeps its parse for its life, as before */
#endif
    /* the shared meta index read the set at attach time and keeps no
     * pointer into it; direct reads use the blocks' mappings, which the
     * connection owns, not the copies */
    gw_prefix_free(r);
}

void gw_prefix_free(gw_remote_t *r)
{
    gw_pfx_set_destroy(r->pfx);
    r->pfx = NULL;
    for (uint32_t i = 0; r->pfx_copies != NULL && i < r->pfx_cap; i++)
        cm_free(r->pfx_copies[i]);
    cm_free(r->pfx_copies);
    r->pfx_copies = NULL;
    r->pfx_cap = 0;
}
