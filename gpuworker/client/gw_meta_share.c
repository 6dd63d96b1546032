/*
 * The process's shared prefix rows (gw_meta_share.h): a registry of sealed
 * memory files, one per attached prefix, and each sequence's reserved
 * arrays whose heads map them copy-on-write.
 */
#define _GNU_SOURCE
#include "gpuworker/client/gw_meta_share.h"

#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "common/cm_alloc.h"
#include "common/cm_log.h"

static CM_ALLOC_TAG(gw_meta_tag, "gw.meta");

/* A table's seven arrays, in the order the file and a reservation hold them. */
enum {
    GW_META_CENT,
    GW_META_CSCALE,
    GW_META_VQ,
    GW_META_VSCALE,
    GW_META_SIZES,
    GW_META_OFFS,
    GW_META_PERM,
    GW_META_ARRAYS
};

/* One prefix's rows and tables: per table t, from off[t], the seven arrays
 * of its n_c[t] clusters and n_t[t] tokens, each region page-aligned (a
 * mapping's offset). */
typedef struct gw_meta_copy {
    uint8_t key[CM_PFX_KEY_SIZE];
    uint32_t n_blocks, n_tables, d;
    uint32_t *n_c;  /* [n_tables] clusters of the prefix */
    uint32_t *n_t;  /* [n_tables] tokens of the prefix (its perm entries) */
    uint64_t *off;  /* [n_tables] */
    uint64_t bytes; /* the file's size */
    int fd;
    uint32_t refs; /* sequences mapping it */
    struct gw_meta_copy *next;
} gw_meta_copy_t;

struct gw_meta_homes {
    gw_meta_copy_t *copy; /* referenced */
    uint8_t **base;       /* [n_tables] one reservation per table (NULL: none) */
    size_t *len;          /* [n_tables] */
};

static pthread_mutex_t gw_meta_lock = PTHREAD_MUTEX_INITIALIZER;
static gw_meta_copy_t *gw_meta_list; /* under the lock */
static bool gw_meta_off;             /* sharing turned off (tests, benches) */

static size_t gw_meta_page(void)
{
    long p = sysconf(_SC_PAGESIZE);
    return p > 0 ? (size_t)p : 4096u;
}

/* Bytes of array r for n_c clusters and n_t tokens of head dim d, rounded
 * up to whole pages. */
static size_t gw_meta_span(int r, uint64_t n_c, uint64_t n_t, uint32_t d)
{
    size_t pg = gw_meta_page(), b;
    switch (r) {
    case GW_META_CENT:
    case GW_META_VQ:
        b = (size_t)n_c * d; /* int8 */
        break;
    case GW_META_CSCALE:
    case GW_META_VSCALE:
        b = (size_t)n_c * sizeof(float);
        break;
    case GW_META_SIZES:
        b = (size_t)n_c * sizeof(uint32_t);
        break;
    case GW_META_OFFS:
        b = ((size_t)n_c + 1) * sizeof(uint32_t);
        break;
    default:
        b = (size_t)n_t * sizeof(uint32_t);
        break;
    }
    return (b + pg - 1) / pg * pg;
}

/* Array r of table t in the file (at = its offset) and in a sequence's
 * reservation (room_at, room: its offset and bytes there, the prefix's plus
 * the sequence's own room). */
static void gw_meta_region(const gw_meta_copy_t *c, uint32_t t, int r, uint64_t *at, size_t *room_at, size_t *room)
{
    uint64_t f = c->off[t];
    size_t g = 0, own_c = c->n_c[t] + (uint64_t)GW_META_OWN_CLUSTERS, own_t = c->n_t[t] + (uint64_t)GW_META_OWN_TOKENS;
    for (int i = 0; i < r; i++) {
        f += gw_meta_span(i, c->n_c[t], c->n_t[t], c->d);
        g += gw_meta_span(i, own_c, own_t, c->d);
    }
    *at = f;
    *room_at = g;
    *room = gw_meta_span(r, own_c, own_t, c->d);
}

static void gw_meta_copy_free(gw_meta_copy_t *c)
{
    if (c == NULL)
        return;
    if (c->fd >= 0)
        close(c->fd);
    cm_free(c->n_c);
    cm_free(c->n_t);
    cm_free(c->off);
    cm_free(c);
}

/* Table t's clusters and tokens in set (0 when its layer has no pieces). */
static ri_status_t gw_meta_count(gw_pfx_set_t *set, uint32_t n_kv, uint32_t t, uint32_t *n_p, uint32_t *tok_p)
{
    const kn_wave_pieces_t *pcs = gw_pfx_set_pieces(set, t / n_kv);
    uint64_t n = 0, tok = 0;

    for (uint32_t b = 0; pcs != NULL && b < pcs->n_blocks; b++) {
        kn_wave_piece_t pc;
        ri_status_t st = pcs->get(pcs->ctx, b, t % n_kv, &pc);
        if (st != RI_OK)
            return st;
        n += pc.n_clusters;
        for (uint32_t j = 0; j < pc.n_clusters; j++)
            tok += pc.sizes[j];
    }
    if (n > UINT32_MAX / 4 || tok > UINT32_MAX / 4)
        return RI_ERR_RANGE;
    *n_p = (uint32_t)n;
    *tok_p = (uint32_t)tok;
    return RI_OK;
}

/* Write n bytes at the file's offset at. */
static ri_status_t gw_meta_put(int fd, const void *p, size_t n, uint64_t at)
{
    return n == 0 || pwrite(fd, p, n, (off_t)at) == (ssize_t)n ? RI_OK : RI_ERR_IO;
}

/* Write table t's rows and tables from set's pieces into c's file: what an
 * index importing the same pieces holds (kn_wave_build_pieces): the pieces'
 * rows, sizes and absolute positions one after the other, offsets from 0. */
static ri_status_t gw_meta_write_table(gw_meta_copy_t *c, gw_pfx_set_t *set, uint32_t n_kv, uint32_t t)
{
    const kn_wave_pieces_t *pcs = gw_pfx_set_pieces(set, t / n_kv);
    size_t u = sizeof(uint32_t), room_at, room;
    uint64_t at[GW_META_ARRAYS], j0 = 0;
    uint32_t *offs = cm_malloc(&gw_meta_tag, ((size_t)c->n_c[t] + 1) * u), tok = 0;
    ri_status_t st = offs ? RI_OK : RI_ERR_NOMEM;

    for (int r = 0; r < GW_META_ARRAYS; r++)
        gw_meta_region(c, t, r, &at[r], &room_at, &room);
    for (uint32_t b = 0; st == RI_OK && pcs != NULL && b < pcs->n_blocks; b++) {
        kn_wave_piece_t pc;
        uint32_t n_tok = 0;
        if (pcs->get(pcs->ctx, b, t % n_kv, &pc) != RI_OK || j0 + pc.n_clusters > c->n_c[t]) {
            st = RI_ERR_INVALID;
            break;
        }
        for (uint32_t j = 0; j < pc.n_clusters; j++) {
            offs[j0 + j] = tok + n_tok;
            n_tok += pc.sizes[j];
        }
        if ((st = gw_meta_put(c->fd, pc.centroids, (size_t)pc.n_clusters * c->d, at[GW_META_CENT] + j0 * c->d)) !=
                RI_OK ||
            (st = gw_meta_put(c->fd, pc.cscale, pc.n_clusters * sizeof(float),
                              at[GW_META_CSCALE] + j0 * sizeof(float))) != RI_OK ||
            (st = gw_meta_put(c->fd, pc.vq, (size_t)pc.n_clusters * c->d, at[GW_META_VQ] + j0 * c->d)) != RI_OK ||
            (st = gw_meta_put(c->fd, pc.vscale, pc.n_clusters * sizeof(float),
                              at[GW_META_VSCALE] + j0 * sizeof(float))) != RI_OK ||
            (st = gw_meta_put(c->fd, pc.sizes, pc.n_clusters * u, at[GW_META_SIZES] + j0 * u)) != RI_OK ||
            (st = gw_meta_put(c->fd, pc.perm, (size_t)n_tok * u, at[GW_META_PERM] + (uint64_t)tok * u)) != RI_OK)
            break;
        j0 += pc.n_clusters;
        tok += n_tok;
    }
    if (st == RI_OK) {
        offs[j0] = tok;
        st = gw_meta_put(c->fd, offs, (size_t)(j0 + 1) * u, at[GW_META_OFFS]);
    }
    cm_free(offs);
    return st;
}

/* A new copy of set's rows (refs 0), or an error. */
static ri_status_t gw_meta_copy_make(const uint8_t *key, gw_pfx_set_t *set, uint32_t n_tables, uint32_t n_kv,
                                     uint32_t d, gw_meta_copy_t **copy_p)
{
    gw_meta_copy_t *c = cm_calloc(&gw_meta_tag, 1, sizeof(*c));
    ri_status_t st = RI_ERR_NOMEM;

    if (c == NULL)
        return RI_ERR_NOMEM;
    c->fd = -1;
    memcpy(c->key, key, CM_PFX_KEY_SIZE);
    c->n_blocks = gw_pfx_set_blocks(set);
    c->n_tables = n_tables;
    c->d = d;
    c->n_c = cm_calloc(&gw_meta_tag, n_tables, sizeof(*c->n_c));
    c->n_t = cm_calloc(&gw_meta_tag, n_tables, sizeof(*c->n_t));
    c->off = cm_calloc(&gw_meta_tag, n_tables, sizeof(*c->off));
    if (c->n_c == NULL || c->n_t == NULL || c->off == NULL)
        goto fail;
    for (uint32_t t = 0; t < n_tables; t++) {
        if ((st = gw_meta_count(set, n_kv, t, &c->n_c[t], &c->n_t[t])) != RI_OK)
            goto fail;
        c->off[t] = c->bytes;
        for (int r = 0; r < GW_META_ARRAYS; r++)
            c->bytes += gw_meta_span(r, c->n_c[t], c->n_t[t], d);
    }
    st = RI_ERR_IO;
    c->fd = memfd_create("ri-prefix-meta", MFD_CLOEXEC | MFD_ALLOW_SEALING);
    if (c->fd < 0 || ftruncate(c->fd, (off_t)c->bytes) != 0)
        goto fail;
    for (uint32_t t = 0; t < n_tables; t++)
        if ((st = gw_meta_write_table(c, set, n_kv, t)) != RI_OK)
            goto fail;
    /* immutable from here: every sequence maps these bytes as its own */
    if (fcntl(c->fd, F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_WRITE | F_SEAL_SEAL) != 0) {
        st = RI_ERR_IO;
        goto fail;
    }
    *copy_p = c;
    return RI_OK;
fail:
    cm_error("prefix: shared meta index of %u blocks: %s (%s)", c->n_blocks, ri_status_str(st),
             st == RI_ERR_IO ? strerror(errno) : "-");
    gw_meta_copy_free(c);
    return st;
}

/* The registered copy for key and set, with the same cluster counts (the
 * caller holds the lock). */
static gw_meta_copy_t *gw_meta_find(const uint8_t *key, gw_pfx_set_t *set, uint32_t n_tables, uint32_t n_kv, uint32_t d)
{
    for (gw_meta_copy_t *c = gw_meta_list; c != NULL; c = c->next) {
        bool same = memcmp(c->key, key, CM_PFX_KEY_SIZE) == 0 && c->n_blocks == gw_pfx_set_blocks(set) &&
                    c->n_tables == n_tables && c->d == d;
        for (uint32_t t = 0; same && t < n_tables; t++) {
            uint32_t n = 0, tok = 0;
            same = gw_meta_count(set, n_kv, t, &n, &tok) == RI_OK && n == c->n_c[t] && tok == c->n_t[t];
        }
        if (same)
            return c;
    }
    return NULL;
}

/* Reserve table t's seven arrays, one range each in one reservation, with
 * room for the prefix's clusters and GW_META_OWN_CLUSTERS more (its tokens
 * and GW_META_OWN_TOKENS more for perm), and map the file's arrays
 * copy-on-write at their heads; *homes gets them. */
static ri_status_t gw_meta_map_table(gw_meta_homes_t *m, uint32_t t, kn_index_homes_t *homes)
{
    const gw_meta_copy_t *c = m->copy;
    uint8_t *head[GW_META_ARRAYS], *base;
    size_t total = 0, room_at, room;
    uint64_t at;

    gw_meta_region(c, t, GW_META_ARRAYS - 1, &at, &room_at, &room);
    total = room_at + room;
    base = mmap(NULL, total, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (base == MAP_FAILED)
        return RI_ERR_IO;
    m->base[t] = base;
    m->len[t] = total;
    for (int r = 0; r < GW_META_ARRAYS; r++) {
        size_t n = gw_meta_span(r, c->n_c[t], c->n_t[t], c->d);
        gw_meta_region(c, t, r, &at, &room_at, &room);
        head[r] = base + room_at;
        if (n > 0 && mmap(head[r], n, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_FIXED, c->fd, (off_t)at) == MAP_FAILED)
            return RI_ERR_IO;
    }
    *homes = (kn_index_homes_t){ .centroids = (int8_t *)head[GW_META_CENT],
                                 .cscale = (float *)head[GW_META_CSCALE],
                                 .vq = (int8_t *)head[GW_META_VQ],
                                 .vscale = (float *)head[GW_META_VSCALE],
                                 .sizes = (uint32_t *)head[GW_META_SIZES],
                                 .offsets = (uint32_t *)head[GW_META_OFFS],
                                 .perm = (uint32_t *)head[GW_META_PERM],
                                 .cap_clusters = c->n_c[t] + GW_META_OWN_CLUSTERS,
                                 .cap_tokens = c->n_t[t] + GW_META_OWN_TOKENS };
    return RI_OK;
}

static void gw_meta_unref(gw_meta_copy_t *c)
{
    gw_meta_copy_t **pp;

    pthread_mutex_lock(&gw_meta_lock);
    if (--c->refs > 0) {
        pthread_mutex_unlock(&gw_meta_lock);
        return;
    }
    for (pp = &gw_meta_list; *pp != NULL && *pp != c; pp = &(*pp)->next)
        ;
    if (*pp == c)
        *pp = c->next;
    pthread_mutex_unlock(&gw_meta_lock);
    gw_meta_copy_free(c);
}

/* The registered copy for key and set, made if none, referenced once more. */
static ri_status_t gw_meta_ref(const uint8_t *key, gw_pfx_set_t *set, uint32_t n_tables, uint32_t n_kv, uint32_t d,
                               gw_meta_copy_t **copy_p)
{
    ri_status_t st = RI_OK;
    gw_meta_copy_t *c;

    pthread_mutex_lock(&gw_meta_lock); /* held while a copy is made: a second attach waits for it */
    c = gw_meta_find(key, set, n_tables, n_kv, d);
    if (c == NULL && (st = gw_meta_copy_make(key, set, n_tables, n_kv, d, &c)) == RI_OK) {
        c->next = gw_meta_list;
        gw_meta_list = c;
    }
    if (st == RI_OK)
        c->refs++;
    pthread_mutex_unlock(&gw_meta_lock);
    *copy_p = c;
    return st;
}

ri_status_t gw_meta_attach(const uint8_t key[CM_PFX_KEY_SIZE], gw_pfx_set_t *set, uint32_t n_layers, uint32_t n_kv,
                           uint32_t d, kn_wave_t *const *waves, gw_meta_homes_t **homes_p)
{
    uint32_t n_tables = n_layers * n_kv;
    gw_meta_homes_t *m;
    ri_status_t st;

    if (key == NULL || set == NULL || waves == NULL || homes_p == NULL || n_layers == 0 || n_kv == 0 || d == 0 ||
        gw_pfx_set_blocks(set) == 0)
        return RI_ERR_INVALID;
    if (__atomic_load_n(&gw_meta_off, __ATOMIC_RELAXED))
        return RI_ERR_UNSUPPORTED;
    m = cm_calloc(&gw_meta_tag, 1, sizeof(*m));
    if (m == NULL)
        return RI_ERR_NOMEM;
    m->base = cm_calloc(&gw_meta_tag, n_tables, sizeof(*m->base));
    m->len = cm_calloc(&gw_meta_tag, n_tables, sizeof(*m->len));
    st = m->base && m->len ? gw_meta_ref(key, set, n_tables, n_kv, d, &m->copy) : RI_ERR_NOMEM;
    for (uint32_t t = 0; st == RI_OK && t < n_tables; t++) {
        kn_index_homes_t homes;
        if (m->copy->n_c[t] == 0)
            continue; /* a layer without pieces: its index is its own */
        st = gw_meta_map_table(m, t, &homes);
        if (st == RI_OK)
            st = kn_wave_place(waves[t / n_kv], t % n_kv, &homes);
    }
    if (st != RI_OK) {
        /* the waves are still empty; those placed must not keep our homes */
        for (uint32_t t = 0; m->copy != NULL && t < n_tables; t++)
            (void)kn_wave_place(waves[t / n_kv], t % n_kv, NULL);
        cm_error("prefix: cannot share the meta index (%s): this sequence keeps its own copy", ri_status_str(st));
        gw_meta_detach(m);
        return st;
    }
    *homes_p = m;
    return RI_OK;
}

void gw_meta_detach(gw_meta_homes_t *m)
{
    if (m == NULL)
        return;
    for (uint32_t t = 0; m->copy != NULL && m->base != NULL && t < m->copy->n_tables; t++)
        if (m->base[t] != NULL)
            munmap(m->base[t], m->len[t]);
    if (m->copy != NULL)
        gw_meta_unref(m->copy);
    cm_free(m->base);
    cm_free(m->len);
    cm_free(m);
}

void gw_meta_stats(uint32_t *copies_p, uint64_t *bytes_p)
{
    uint32_t n = 0;
    uint64_t b = 0;

    pthread_mutex_lock(&gw_meta_lock);
    for (const gw_meta_copy_t *c = gw_meta_list; c != NULL; c = c->next, n++)
        b += c->bytes;
    pthread_mutex_unlock(&gw_meta_lock);
    if (copies_p != NULL)
        *copies_p = n;
    if (bytes_p != NULL)
        *bytes_p = b;
}

void gw_meta_set_sharing(bool on)
{
    __atomic_store_n(&gw_meta_off, !on, __ATOMIC_RELAXED);
}
