/*
 * Prefix reuse, the worker's half: block keys (SHA-256, OpenSSL libcrypto)
 * and the worker section of a block (gw_prefix.h has the formats).  A block
 * is a few MB at most (B = 256 tokens of every layer and head), built once
 * per published block and parsed once per attached one.
 */
#include "gpuworker/client/gw_prefix.h"

#include <openssl/evp.h>
#include <string.h>

#include "common/cm_alloc.h"
#include "common/cm_crc32c.h"
#include "common/cm_log.h"

#if !defined(__BYTE_ORDER__) || __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "gw_prefix reads u32 and fp16 arrays of a block in place: little-endian hosts only"
#endif

static CM_ALLOC_TAG(gw_prefix_tag, "gw.prefix");

/* ---- keys ---- */

static void gw_pfx_put32(uint8_t *p, uint32_t v)
{
    cm_dp_put32(p, v);
}

static uint32_t gw_pfx_fbits(float f)
{
    uint32_t u;
    memcpy(&u, &f, sizeof(u));
    return u;
}

void gw_pfx_layout_init(const mdl_hparams_t *hp, const kn_wave_params_t *wave, bool indexed, uint32_t cluster_tokens,
                        uint32_t page_tokens, gw_pfx_layout_t *lay)
{
    memset(lay, 0, sizeof(*lay));
    lay->indexed = indexed ? 1u : 0u;
    lay->cluster_tokens = indexed ? cluster_tokens : 0u;
    lay->sink_tokens = wave->sink_tokens;
    lay->block_tokens = wave->segment_tokens;
    lay->page_tokens = indexed ? page_tokens : 1u;
    lay->dtype = GW_PFX_DTYPE_F16;
    lay->n_layers = hp->n_layers;
    lay->n_kv_heads = hp->n_kv_heads;
    lay->head_dim = hp->head_dim;
    lay->n_rot = hp->n_rot;
    lay->rope_neox = hp->rope_neox ? 1u : 0u;
    lay->n_swa = hp->n_swa;
    lay->swa_period = hp->swa_period;
    lay->rope_theta = hp->rope_theta;
    lay->rope_scale = hp->rope_scale;
    lay->rope_theta_swa = hp->rope_theta_swa;
}

#define GW_PFX_LAYOUT_BYTES (16u * 4u)

static void gw_pfx_layout_encode(const gw_pfx_layout_t *l, uint8_t out[GW_PFX_LAYOUT_BYTES])
{
    const uint32_t f[16] = { l->indexed,
                             l->cluster_tokens,
                             l->sink_tokens,
                             l->block_tokens,
                             l->page_tokens,
                             l->dtype,
                             l->n_layers,
                             l->n_kv_heads,
                             l->head_dim,
                             l->n_rot,
                             l->rope_neox,
                             l->n_swa,
                             l->swa_period,
                             gw_pfx_fbits(l->rope_theta),
                             gw_pfx_fbits(l->rope_scale),
                             gw_pfx_fbits(l->rope_theta_swa) };
    for (uint32_t i = 0; i < 16; i++)
        gw_pfx_put32(out + 4u * i, f[i]);
}

/* SHA-256 over n (pointer, length) parts. */
static ri_status_t gw_pfx_sha256(const void *const *parts, const size_t *lens, size_t n, uint8_t out[32])
{
    EVP_MD_CTX *ctx = EVP_MD_CTX_new();
    unsigned int olen = 0;
    ri_status_t st = RI_ERR_INTERNAL;

    if (ctx == NULL)
        return RI_ERR_NOMEM;
    if (EVP_DigestInit_ex(ctx, EVP_sha256(), NULL) != 1)
        goto err_free_ctx;
    for (size_t i = 0; i < n; i++)
        if (lens[i] > 0 && EVP_DigestUpdate(ctx, parts[i], lens[i]) != 1)
            goto err_free_ctx;
    if (EVP_DigestFinal_ex(ctx, out, &olen) != 1 || olen != 32)
        goto err_free_ctx;
    st = RI_OK;
err_free_ctx:
    EVP_MD_CTX_free(ctx);
    return st;
}

ri_status_t gw_pfx_model_digest(const void *base, size_t size, uint8_t out[32])
{
    const void *parts[1] = { base };
    size_t lens[1] = { size };
    if (base == NULL && size > 0)
        return RI_ERR_INVALID;
    return gw_pfx_sha256(parts, lens, 1, out);
}

ri_status_t gw_pfx_tenant_salt(const char *token, const char *extra, uint8_t out[32])
{
    uint8_t tl[4], el[4];
    size_t tn = token != NULL ? strlen(token) : 0, en = extra != NULL ? strlen(extra) : 0;
    const void *parts[5] = { "RIPS", tl, token, el, extra };
    size_t lens[5] = { 4, 4, tn, 4, en };

    if (tn > UINT32_MAX || en > UINT32_MAX)
        return RI_ERR_INVALID;
    gw_pfx_put32(tl, (uint32_t)tn);
    gw_pfx_put32(el, (uint32_t)en);
    return gw_pfx_sha256(parts, lens, 5, out);
}

ri_status_t gw_pfx_keys(const gw_pfx_keyer_t *kr, const gw_pfx_layout_t *lay, const int32_t *tokens, uint32_t n_blocks,
                        uint8_t *keys)
{
    const uint32_t B = lay->block_tokens;
    uint8_t head[8], layout[GW_PFX_LAYOUT_BYTES], prev[32], *ids;
    ri_status_t st = RI_OK;

    if (B == 0 || (n_blocks > 0 && (tokens == NULL || keys == NULL)))
        return RI_ERR_INVALID;
    ids = cm_malloc(&gw_prefix_tag, 4u * (size_t)B);
    if (ids == NULL)
        return RI_ERR_NOMEM;
    memcpy(head, GW_PFX_KEY_MAGIC, 4);
    gw_pfx_put32(head + 4, GW_PFX_KEY_VERSION);
    gw_pfx_layout_encode(lay, layout);
    memset(prev, 0, sizeof(prev));
    for (uint32_t b = 0; b < n_blocks && st == RI_OK; b++) {
        for (uint32_t i = 0; i < B; i++)
            gw_pfx_put32(ids + 4u * i, (uint32_t)tokens[(size_t)b * B + i]);
        const void *parts[6] = { head, prev, kr->model, layout, kr->salt, ids };
        size_t lens[6] = { 8, 32, 32, GW_PFX_LAYOUT_BYTES, 32, 4u * (size_t)B };
        st = gw_pfx_sha256(parts, lens, 6, keys + (size_t)b * CM_PFX_KEY_SIZE);
        memcpy(prev, keys + (size_t)b * CM_PFX_KEY_SIZE, 32);
    }
    cm_free(ids);
    return st;
}

uint32_t gw_pfx_max_blocks(const gw_pfx_layout_t *lay, uint32_t window_tokens, size_t n_tokens)
{
    size_t limit =
        lay->indexed ? (n_tokens > window_tokens ? n_tokens - window_tokens : 0) : (n_tokens > 0 ? n_tokens - 1 : 0);
    size_t n = lay->block_tokens > 0 ? limit / lay->block_tokens : 0;
    return n > CM_PFX_MAX_KEYS ? CM_PFX_MAX_KEYS : (uint32_t)n;
}

/* ---- block build ---- */

/* The clusters of one table of the block being built. */
typedef struct gw_pfx_btab {
    const kn_index_t *idx; /* NULL: no index */
    uint32_t j0, j1;       /* its clusters [j0, j1) lie in the block */
    uint32_t tokens;       /* their tokens */
    uint64_t pages;        /* their pages */
} gw_pfx_btab_t;

/* Sizes of a block's sections and its loose tokens per layer. */
typedef struct gw_pfx_plan {
    gw_pfx_btab_t *tabs; /* [n_tables] */
    uint32_t *n_loose;   /* [layers] */
    uint64_t total_clusters, tables_bytes, worker_bytes, pages_bytes;
} gw_pfx_plan_t;

static uint32_t gw_pfx_sink_end(const gw_pfx_layout_t *lay, uint32_t first)
{
    /* the first position of the block [first, first + B) past the sinks */
    uint32_t end = first + lay->block_tokens;
    return lay->sink_tokens <= first ? first : lay->sink_tokens < end ? lay->sink_tokens : end;
}

/* The clusters of idx that lie in [f, f + B) (kn_wave_block_clusters: the
 * build's own cut), checked to cover [sink_end, f + B) exactly.
 * RI_ERR_UNSUPPORTED when the index does not split at the block's edges. */
static ri_status_t gw_pfx_find_clusters(const gw_pfx_layout_t *lay, const kn_index_t *idx, uint32_t f, gw_pfx_btab_t *t)
{
    const uint32_t B = lay->block_tokens, lo = gw_pfx_sink_end(lay, f);
    uint32_t j0, j1, tokens = 0;
    uint64_t pages = 0;

    if (kn_wave_block_clusters(idx, f, B, &j0, &j1) != RI_OK)
        return RI_ERR_UNSUPPORTED;
    for (uint32_t j = j0; j < j1; j++) {
        const uint32_t *perm = idx->perm + idx->offsets[j];
        if (idx->sizes[j] > CM_DP_MAX_CLUSTER_TOKENS)
            return RI_ERR_UNSUPPORTED;
        for (uint32_t i = 0; i < idx->sizes[j]; i++)
            if (perm[i] < lo || perm[i] >= f + B)
                return RI_ERR_UNSUPPORTED;
        tokens += idx->sizes[j];
        pages += (idx->sizes[j] + lay->page_tokens - 1u) / lay->page_tokens;
    }
    if (tokens != f + B - lo) /* positions are distinct in an index: the count says "every one" */
        return RI_ERR_UNSUPPORTED;
    *t = (gw_pfx_btab_t){ idx, j0, j1, tokens, pages };
    return RI_OK;
}

static ri_status_t gw_pfx_plan(const gw_pfx_layout_t *lay, const gw_pfx_src_t *src, uint32_t f, gw_pfx_plan_t *p)
{
    const uint32_t H = lay->n_kv_heads, d = lay->head_dim, B = lay->block_tokens;
    const uint64_t page_bytes = 4u * (uint64_t)lay->page_tokens * d;
    ri_status_t st;

    p->worker_bytes = 8;
    for (uint32_t l = 0; l < lay->n_layers; l++) {
        bool indexed = false;
        for (uint32_t h = 0; h < H; h++) {
            gw_pfx_btab_t *t = &p->tabs[(size_t)l * H + h];
            const kn_index_t *idx = src->index != NULL ? src->index(src->ctx, l, h) : NULL;
            if (h > 0 && (idx != NULL) != indexed)
                return RI_ERR_UNSUPPORTED; /* a layer's heads all index, or none */
            indexed = idx != NULL;
            if (idx == NULL || !lay->indexed)
                continue;
            if (idx->head_dim != d)
                return RI_ERR_INVALID;
            st = gw_pfx_find_clusters(lay, idx, f, t);
            if (st != RI_OK)
                return st;
            p->total_clusters += t->j1 - t->j0;
            p->pages_bytes += t->pages * page_bytes;
            /* perm, then int8 rows and fp32 scales twice: centroids, value means */
            p->worker_bytes +=
                cm_pfx_pad8(4u * (uint64_t)t->tokens) +
                2u * (cm_pfx_pad8((uint64_t)(t->j1 - t->j0) * d) + cm_pfx_pad8(4u * (uint64_t)(t->j1 - t->j0)));
        }
        p->n_loose[l] = indexed && lay->indexed ? gw_pfx_sink_end(lay, f) - f : B;
        p->worker_bytes += 8u + cm_pfx_pad8(4u * (uint64_t)p->n_loose[l]) +
                           (uint64_t)H * 2u * cm_pfx_pad8(2u * (uint64_t)p->n_loose[l] * d);
    }
    if (lay->indexed && p->total_clusters == 0)
        return RI_ERR_UNSUPPORTED; /* no index built yet: the block would lack its clusters */
    p->tables_bytes = cm_pfx_tables_bytes(lay->n_layers * H, p->total_clusters);
    return RI_OK;
}

/* Write the block's clusters of table t into the tables section (sizes at
 * *sizes_p, advanced), its perm / centroids / cscale / vq / vscale at *w_p (advanced) and
 * its pages at *pg_p (advanced). */
static void gw_pfx_write_table(const gw_pfx_layout_t *lay, const mdl_kv_t *kv, uint32_t l, uint32_t h,
                               const gw_pfx_btab_t *t, uint32_t f, uint8_t **sizes_p, uint8_t **w_p, uint8_t **pg_p)
{
    const uint32_t d = lay->head_dim, P = lay->page_tokens, C = t->j1 - t->j0;
    const size_t row = (size_t)d * sizeof(cm_fp16_t), page_bytes = 4u * (size_t)P * d;
    const kn_index_t *idx = t->idx;
    uint8_t *w = *w_p, *pg = *pg_p;

    for (uint32_t j = t->j0; j < t->j1; j++) {
        const uint32_t *perm = idx->perm + idx->offsets[j], n = idx->sizes[j], np = (n + P - 1u) / P;
        cm_dp_put32(*sizes_p, n);
        *sizes_p += 4;
        for (uint32_t i = 0; i < n; i++) {
            cm_dp_put32(w, perm[i] - f);
            w += 4;
        }
        memset(pg, 0, (size_t)np * page_bytes);
        for (uint32_t i = 0; i < n; i++) {
            uint8_t *page = pg + (size_t)(i / P) * page_bytes;
            memcpy(page + (size_t)(i % P) * row, mdl_kv_krow(kv, l, h, perm[i]), row);
            memcpy(page + (size_t)(P + i % P) * row, mdl_kv_vrow(kv, l, h, perm[i]), row);
        }
        pg += (size_t)np * page_bytes;
    }
    w = *w_p + cm_pfx_pad8(4u * (uint64_t)t->tokens);
    memcpy(w, idx->centroids + (size_t)t->j0 * d, (size_t)C * d); /* as the index holds them: */
    w += cm_pfx_pad8((uint64_t)C * d);                            /* an import copies, never requantizes */
    memcpy(w, idx->cscale + t->j0, (size_t)C * sizeof(float));
    w += cm_pfx_pad8((uint64_t)C * sizeof(float));
    memcpy(w, idx->vq + (size_t)t->j0 * d, (size_t)C * d);
    w += cm_pfx_pad8((uint64_t)C * d);
    memcpy(w, idx->vscale + t->j0, (size_t)C * sizeof(float));
    w += cm_pfx_pad8((uint64_t)C * sizeof(float));
    *w_p = w;
    *pg_p = pg;
}

/* Write layer l's loose tokens (the first n of the block: sinks, or all). */
static uint8_t *gw_pfx_write_loose(const gw_pfx_layout_t *lay, const mdl_kv_t *kv, uint32_t l, uint32_t f, uint32_t n,
                                   uint8_t *w)
{
    const uint32_t d = lay->head_dim;
    const size_t row = (size_t)d * sizeof(cm_fp16_t), part = cm_pfx_pad8((uint64_t)n * row);

    cm_dp_put32(w, n);
    cm_dp_put32(w + 4, 0);
    w += 8;
    for (uint32_t i = 0; i < n; i++)
        cm_dp_put32(w + 4u * i, i);
    w += cm_pfx_pad8(4u * (uint64_t)n);
    for (uint32_t h = 0; h < lay->n_kv_heads; h++) {
        for (uint32_t i = 0; i < n; i++) {   /* the block is head-major, the cache token-major */
            memcpy(w + (size_t)i * row, mdl_kv_krow(kv, l, h, f + i), row);
            memcpy(w + part + (size_t)i * row, mdl_kv_vrow(kv, l, h, f + i), row);
        }
        w += 2u * part;
    }
    return w;
}

ri_status_t gw_pfx_block_build(const gw_pfx_layout_t *lay, const gw_pfx_src_t *src, uint32_t block, uint8_t **buf_p,
                               uint64_t *len_p)
{
    const uint32_t H = lay->n_kv_heads, B = lay->block_tokens, n_tables = lay->n_layers * H;
    const uint64_t f64 = (uint64_t)block * B;
    gw_pfx_plan_t p = { 0 };
    cm_pfx_hdr_t hdr;
    uint8_t *buf = NULL, *sizes, *w, *pg;
    uint64_t len;
    ri_status_t st;

    if (B == 0 || lay->page_tokens == 0 || lay->dtype != GW_PFX_DTYPE_F16 || src == NULL || src->kv == NULL ||
        src->kv->geom.n_layers != lay->n_layers || src->kv->geom.n_kv_heads != H ||
        src->kv->geom.head_dim != lay->head_dim || f64 + B > src->kv->len || f64 + B > UINT32_MAX)
        return RI_ERR_INVALID;
    p.tabs = cm_calloc(&gw_prefix_tag, n_tables, sizeof(*p.tabs));
    p.n_loose = cm_calloc(&gw_prefix_tag, lay->n_layers, sizeof(*p.n_loose));
    st = p.tabs == NULL || p.n_loose == NULL ? RI_ERR_NOMEM : gw_pfx_plan(lay, src, (uint32_t)f64, &p);
    if (st != RI_OK)
        goto err_free_plan;
    len = CM_PFX_HDR_SIZE + p.tables_bytes + p.worker_bytes + p.pages_bytes;
    buf = len <= CM_PFX_MAX_BLOCK_BYTES ? cm_calloc(&gw_prefix_tag, 1, (size_t)len) : NULL;
    if (buf == NULL) {
        st = RI_ERR_NOMEM;
        goto err_free_plan;
    }
    sizes = buf + CM_PFX_HDR_SIZE + 4u * (uint64_t)n_tables;
    w = buf + CM_PFX_HDR_SIZE + p.tables_bytes;
    pg = w + p.worker_bytes;
    cm_dp_put32(w, GW_PFX_WMAGIC);
    cm_dp_put32(w + 4, GW_PFX_WVERSION);
    w += 8;
    for (uint32_t t = 0; t < n_tables; t++) {
        cm_dp_put32(buf + CM_PFX_HDR_SIZE + 4u * t, p.tabs[t].j1 - p.tabs[t].j0);
        if (p.tabs[t].idx != NULL)
            gw_pfx_write_table(lay, src->kv, t / H, t % H, &p.tabs[t], (uint32_t)f64, &sizes, &w, &pg);
    }
    for (uint32_t l = 0; l < lay->n_layers; l++)
        w = gw_pfx_write_loose(lay, src->kv, l, (uint32_t)f64, p.n_loose[l], w);
    hdr = (cm_pfx_hdr_t){ lay->n_layers,
                          H,
                          lay->head_dim,
                          lay->dtype,
                          lay->page_tokens,
                          (uint32_t)f64,
                          B,
                          0,
                          p.tables_bytes,
                          p.worker_bytes,
                          p.pages_bytes };
    hdr.crc = cm_crc32c(0, buf + CM_PFX_HDR_SIZE, (size_t)(len - CM_PFX_HDR_SIZE));
    cm_pfx_hdr_encode(buf, &hdr);
    *buf_p = buf;
    *len_p = len;
err_free_plan:
    cm_free(p.n_loose);
    cm_free(p.tabs);
    return st;
}

/* ---- block parse ---- */

/* A bounded cursor over the worker section. */
typedef struct gw_pfx_cur {
    const uint8_t *p, *end;
} gw_pfx_cur_t;

/* The next n bytes (padded to 8) of c, or NULL when they are not there. */
static const uint8_t *gw_pfx_take(gw_pfx_cur_t *c, uint64_t n)
{
    const uint8_t *at = c->p;
    uint64_t padded = cm_pfx_pad8(n);
    if (n > (uint64_t)(c->end - c->p) || padded > (uint64_t)(c->end - c->p))
        return NULL;
    c->p += padded;
    return at;
}

/* Mark positions rel[0..n) covered in seen (B entries); false when one is
 * out of the block or seen already. */
static bool gw_pfx_cover(uint8_t *seen, uint32_t B, const uint32_t *rel, uint32_t n)
{
    for (uint32_t i = 0; i < n; i++) {
        if (rel[i] >= B || seen[rel[i]])
            return false;
        seen[rel[i]] = 1;
    }
    return true;
}

static ri_status_t gw_pfx_check_hdr(const gw_pfx_layout_t *lay, uint32_t block, const uint8_t *buf, uint64_t len,
                                    cm_pfx_view_t *v)
{
    ri_status_t st;
    if (((uintptr_t)buf & 7u) != 0)
        return RI_ERR_INVALID;
    st = cm_pfx_decode(buf, len, v);
    if (st != RI_OK)
        return st;
    if (cm_crc32c(0, buf + CM_PFX_HDR_SIZE, (size_t)(len - CM_PFX_HDR_SIZE)) != v->hdr.crc)
        return RI_ERR_CORRUPT;
    if (v->hdr.layers != lay->n_layers || v->hdr.kv_heads != lay->n_kv_heads || v->hdr.head_dim != lay->head_dim ||
        v->hdr.dtype != lay->dtype || v->hdr.page_tokens != lay->page_tokens || v->hdr.n_tokens != lay->block_tokens ||
        (uint64_t)v->hdr.first_pos != (uint64_t)block * lay->block_tokens)
        return RI_ERR_INVALID;
    return RI_OK;
}

/* Parse table t's perm / centroids / cscale / vq / vscale from c, check its positions and
 * compute the absolute perm. */
static ri_status_t gw_pfx_parse_table(const gw_pfx_layout_t *lay, gw_pfx_block_t *b, uint32_t t,
                                      const uint8_t **sizes_p, const uint8_t **pages_p, gw_pfx_cur_t *c)
{
    gw_pfx_table_t *T = &b->tables[t];
    const uint32_t d = lay->head_dim, P = lay->page_tokens;
    const uint64_t page_bytes = 4u * (uint64_t)P * d;
    uint64_t tokens = 0, pages = 0;
    const uint32_t *rel;

    T->n_clusters = cm_dp_get32(b->view.counts + 4u * t);
    T->sizes = (const uint32_t *)(const void *)*sizes_p;
    T->pages = *pages_p;
    for (uint32_t j = 0; j < T->n_clusters; j++) {
        tokens += T->sizes[j];
        pages += (T->sizes[j] + P - 1u) / P;
    }
    *sizes_p += 4u * (uint64_t)T->n_clusters;
    *pages_p += pages * page_bytes;
    if (T->n_clusters == 0)
        return RI_OK;
    rel = (const uint32_t *)(const void *)gw_pfx_take(c, 4u * tokens);
    T->centroids = (const int8_t *)(const void *)gw_pfx_take(c, (uint64_t)T->n_clusters * d);
    T->cscale = (const float *)(const void *)gw_pfx_take(c, 4u * (uint64_t)T->n_clusters);
    T->vq = (const int8_t *)(const void *)gw_pfx_take(c, (uint64_t)T->n_clusters * d);
    T->vscale = (const float *)(const void *)gw_pfx_take(c, 4u * (uint64_t)T->n_clusters);
    if (rel == NULL || T->centroids == NULL || T->cscale == NULL || T->vq == NULL || T->vscale == NULL)
        return RI_ERR_TRUNCATED;
    T->perm = cm_malloc(&gw_prefix_tag, 4u * (size_t)tokens);
    if (T->perm == NULL)
        return RI_ERR_NOMEM;
    for (uint64_t i = 0; i < tokens; i++) {
        if (rel[i] >= b->n_tokens || b->first_pos + rel[i] < lay->sink_tokens)
            return RI_ERR_PROTOCOL; /* outside the block, or a sink in a cluster */
        T->perm[i] = b->first_pos + rel[i];
    }
    return RI_OK;
}

/* Parse layer l's loose tokens and check that, with each of its tables'
 * clusters, they cover every token of the block once. */
static ri_status_t gw_pfx_parse_loose(const gw_pfx_layout_t *lay, gw_pfx_block_t *b, uint32_t l, uint8_t *seen,
                                      gw_pfx_cur_t *c)
{
    gw_pfx_loose_t *L = &b->loose[l];
    const uint32_t H = lay->n_kv_heads, d = lay->head_dim, B = b->n_tokens;
    const uint8_t *hdr = gw_pfx_take(c, 8), *kv;

    if (hdr == NULL)
        return RI_ERR_TRUNCATED;
    L->n = cm_dp_get32(hdr);
    if (L->n > B || cm_dp_get32(hdr + 4) != 0)
        return RI_ERR_PROTOCOL;
    L->pos = (const uint32_t *)(const void *)gw_pfx_take(c, 4u * (uint64_t)L->n);
    if (L->pos == NULL)
        return RI_ERR_TRUNCATED;
    kv = gw_pfx_take(c, (uint64_t)H * 2u * cm_pfx_pad8(2u * (uint64_t)L->n * d));
    if (kv == NULL)
        return RI_ERR_TRUNCATED;
    L->kv = (const cm_fp16_t *)(const void *)kv;
    for (uint32_t h = 0; h < H; h++) {
        const gw_pfx_table_t *T = &b->tables[(size_t)l * H + h];
        uint64_t tokens = 0;
        memset(seen, 0, B);
        if ((T->n_clusters > 0) != (b->tables[(size_t)l * H].n_clusters > 0))
            return RI_ERR_PROTOCOL; /* a layer's heads all index, or none */
        for (uint32_t j = 0; j < T->n_clusters; j++)
            tokens += T->sizes[j];
        for (uint64_t i = 0; i < tokens; i++) {
            uint32_t r = T->perm[i] - b->first_pos;
            if (seen[r])
                return RI_ERR_PROTOCOL;
            seen[r] = 1;
        }
        if (!gw_pfx_cover(seen, B, L->pos, L->n) || tokens + L->n != B)
            return RI_ERR_PROTOCOL;
    }
    return RI_OK;
}

ri_status_t gw_pfx_block_parse(const gw_pfx_layout_t *lay, uint32_t block, const uint8_t *buf, uint64_t len,
                               gw_pfx_block_t *out)
{
    const uint32_t H = lay->n_kv_heads, n_tables = lay->n_layers * H;
    gw_pfx_block_t b;
    gw_pfx_cur_t c;
    const uint8_t *sizes, *pages, *magic;
    uint8_t *seen = NULL;
    ri_status_t st;
    bool version_ok;

    memset(&b, 0, sizeof(b));
    st = gw_pfx_check_hdr(lay, block, buf, len, &b.view);
    if (st != RI_OK)
        return st;
    b.first_pos = b.view.hdr.first_pos;
    b.n_tokens = b.view.hdr.n_tokens;
    b.page_tokens = b.view.hdr.page_tokens;
    b.tables = cm_calloc(&gw_prefix_tag, n_tables, sizeof(*b.tables));
    b.loose = cm_calloc(&gw_prefix_tag, lay->n_layers, sizeof(*b.loose));
    seen = cm_malloc(&gw_prefix_tag, b.n_tokens);
    if (b.tables == NULL || b.loose == NULL || seen == NULL) {
        st = RI_ERR_NOMEM;
        goto err_release;
    }
    c = (gw_pfx_cur_t){ b.view.worker, b.view.worker + b.view.hdr.worker_bytes };
    magic = gw_pfx_take(&c, 8);
    version_ok = magic != NULL && cm_dp_get32(magic + 4) == GW_PFX_WVERSION;
#ifdef GW_PFX_MUTANT_ANY_VERSION /* the tests' mutant: a section of any version is taken */
    version_ok = magic != NULL;
#endif
    if (magic == NULL || cm_dp_get32(magic) != GW_PFX_WMAGIC || !version_ok) {
        st = magic == NULL ? RI_ERR_TRUNCATED : RI_ERR_PROTOCOL;
        goto err_release;
    }
    sizes = b.view.sizes;
    pages = b.view.pages;
    for (uint32_t t = 0; t < n_tables && st == RI_OK; t++)
        st = gw_pfx_parse_table(lay, &b, t, &sizes, &pages, &c);
    for (uint32_t l = 0; l < lay->n_layers && st == RI_OK; l++)
        st = gw_pfx_parse_loose(lay, &b, l, seen, &c);
    if (st == RI_OK && c.p != c.end)
        st = RI_ERR_PROTOCOL;
    if (st != RI_OK)
        goto err_release;
    cm_free(seen);
    *out = b;
    return RI_OK;
err_release:
    cm_free(seen);
    gw_pfx_block_release(&b);
    return st;
}

void gw_pfx_block_release(gw_pfx_block_t *b)
{
    if (b == NULL)
        return;
    if (b->tables != NULL)
        for (uint32_t t = 0; t < b->view.hdr.layers * b->view.hdr.kv_heads; t++)
            cm_free(b->tables[t].perm);
    cm_free(b->tables);
    cm_free(b->loose);
    memset(b, 0, sizeof(*b));
}

void gw_pfx_block_fill(const gw_pfx_block_t *b, uint32_t layer, uint32_t head, size_t pos0, size_t n, cm_fp16_t *k,
                       cm_fp16_t *v, size_t token_stride)
{
    const uint32_t H = b->view.hdr.kv_heads, d = b->view.hdr.head_dim, P = b->page_tokens;
    const size_t row = (size_t)d * sizeof(cm_fp16_t), page_bytes = 4u * (size_t)P * d;
    const gw_pfx_table_t *T = &b->tables[(size_t)layer * H + head];
    const gw_pfx_loose_t *L = &b->loose[layer];
    const uint8_t *pg = T->pages, *lk, *lv;
    size_t i0 = 0;

    for (uint32_t j = 0; j < T->n_clusters; j++) {
        for (uint32_t i = 0; i < T->sizes[j]; i++) {
            size_t p = T->perm[i0 + i];
            const uint8_t *page = pg + (size_t)(i / P) * page_bytes;
            if (p < pos0 || p >= pos0 + n)
                continue;
            memcpy(k + (p - pos0) * token_stride, page + (size_t)(i % P) * row, row);
            memcpy(v + (p - pos0) * token_stride, page + (size_t)(P + i % P) * row, row);
        }
        i0 += T->sizes[j];
        pg += (size_t)((T->sizes[j] + P - 1u) / P) * page_bytes;
    }
    lk = (const uint8_t *)L->kv + (size_t)head * 2u * cm_pfx_pad8((uint64_t)L->n * row);
    lv = lk + cm_pfx_pad8((uint64_t)L->n * row);
    for (uint32_t i = 0; i < L->n; i++) {
        size_t p = (size_t)b->first_pos + L->pos[i];
        if (p < pos0 || p >= pos0 + n)
            continue;
        memcpy(k + (p - pos0) * token_stride, lk + (size_t)i * row, row);
        memcpy(v + (p - pos0) * token_stride, lv + (size_t)i * row, row);
    }
}

/* ---- the blocks of a sequence ---- */

/* kn_wave_pieces_t's ctx for one layer. */
typedef struct gw_pfx_lctx {
    gw_pfx_set_t *set;
    uint32_t layer;
} gw_pfx_lctx_t;

struct gw_pfx_set {
    gw_pfx_layout_t lay; /* the keys' layout */
    uint32_t max_blocks, n_blocks;
    gw_pfx_block_t *blocks;   /* [max_blocks], [0, n_blocks) parsed */
    gw_pfx_lctx_t *lctx;      /* [layers] */
    kn_wave_pieces_t *pieces; /* [layers] */
};

ri_status_t gw_pfx_set_create(const gw_pfx_layout_t *lay, uint32_t max_blocks, gw_pfx_set_t **set_p)
{
    gw_pfx_set_t *s = cm_calloc(&gw_prefix_tag, 1, sizeof(*s));

    if (s == NULL)
        return RI_ERR_NOMEM;
    s->lay = *lay;
    s->max_blocks = max_blocks;
    s->blocks = cm_calloc(&gw_prefix_tag, max_blocks > 0 ? max_blocks : 1, sizeof(*s->blocks));
    s->lctx = cm_calloc(&gw_prefix_tag, lay->n_layers, sizeof(*s->lctx));
    s->pieces = cm_calloc(&gw_prefix_tag, lay->n_layers, sizeof(*s->pieces));
    if (s->blocks == NULL || s->lctx == NULL || s->pieces == NULL) {
        gw_pfx_set_destroy(s);
        return RI_ERR_NOMEM;
    }
    *set_p = s;
    return RI_OK;
}

void gw_pfx_set_destroy(gw_pfx_set_t *set)
{
    if (set == NULL)
        return;
    for (uint32_t i = 0; i < set->n_blocks; i++)
        gw_pfx_block_release(&set->blocks[i]);
    cm_free(set->blocks);
    cm_free(set->lctx);
    cm_free(set->pieces);
    cm_free(set);
}

ri_status_t gw_pfx_set_add(gw_pfx_set_t *set, const uint8_t *buf, uint64_t len)
{
    if (set->n_blocks >= set->max_blocks)
        return RI_ERR_RANGE;
    ri_status_t st = gw_pfx_block_parse(&set->lay, set->n_blocks, buf, len, &set->blocks[set->n_blocks]);
    if (st == RI_OK)
        set->n_blocks++;
    return st;
}

uint32_t gw_pfx_set_blocks(const gw_pfx_set_t *set)
{
    return set != NULL ? set->n_blocks : 0;
}

ri_status_t gw_pfx_set_fill(void *arg, uint32_t layer, uint32_t kv_head, size_t pos0, size_t n, cm_fp16_t *k,
                            cm_fp16_t *v, size_t token_stride)
{
    gw_pfx_set_t *s = arg;
    const uint32_t B = s->lay.block_tokens;

    if (layer >= s->lay.n_layers || kv_head >= s->lay.n_kv_heads || pos0 + n > (size_t)s->n_blocks * B)
        return RI_ERR_RANGE;
    for (size_t b = pos0 / B; n > 0 && b < s->n_blocks && b * B < pos0 + n; b++)
        gw_pfx_block_fill(&s->blocks[b], layer, kv_head, pos0, n, k, v, token_stride);
    return RI_OK;
}

static ri_status_t gw_pfx_piece_get(void *ctx, uint32_t block, uint32_t kv_head, kn_wave_piece_t *piece_p)
{
    const gw_pfx_lctx_t *c = ctx;
    const gw_pfx_set_t *s = c->set;
    if (block >= s->n_blocks || kv_head >= s->lay.n_kv_heads)
        return RI_ERR_RANGE;
    const gw_pfx_block_t *b = &s->blocks[block];
    const gw_pfx_table_t *T = &b->tables[(size_t)c->layer * s->lay.n_kv_heads + kv_head];
    *piece_p =
        (kn_wave_piece_t){ b->first_pos, T->n_clusters, T->sizes, T->perm, T->centroids, T->cscale, T->vq, T->vscale };
    return RI_OK;
}

const kn_wave_pieces_t *gw_pfx_set_pieces(void *ctx, uint32_t layer)
{
    gw_pfx_set_t *s = ctx;
    if (s == NULL || layer >= s->lay.n_layers || s->n_blocks == 0 || !s->lay.indexed ||
        s->blocks[0].tables[(size_t)layer * s->lay.n_kv_heads].n_clusters == 0)
        return NULL;
    s->lctx[layer] = (gw_pfx_lctx_t){ s, layer };
    s->pieces[layer] = (kn_wave_pieces_t){ &s->lctx[layer], s->n_blocks, gw_pfx_piece_get };
    return &s->pieces[layer];
}
