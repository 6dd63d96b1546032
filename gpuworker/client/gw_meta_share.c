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

/* One prefix's rows: per table t, centroids at off[t], value means at
 * off[t] + span(n_c[t]), each region page-aligned (a mapping's offset). */
typedef struct gw_meta_copy {
    uint8_t key[CM_PFX_KEY_SIZE];
    uint32_t n_blocks, n_tables, d;
    uint32_t *n_c;  /* [n_tables] clusters of the prefix */
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

/* Bytes of n rows of d fp16, rounded up to whole pages. */
static size_t gw_meta_span(uint64_t n, uint32_t d)
{
    size_t pg = gw_meta_page(), b = (size_t)n * d * sizeof(cm_fp16_t);
    return (b + pg - 1) / pg * pg;
}

static void gw_meta_copy_free(gw_meta_copy_t *c)
{
    if (c == NULL)
        return;
    if (c->fd >= 0)
        close(c->fd);
    cm_free(c->n_c);
    cm_free(c->off);
    cm_free(c);
}

/* Table t's clusters in set (0 when its layer has no pieces). */
static ri_status_t gw_meta_count(gw_pfx_set_t *set, uint32_t n_kv, uint32_t t, uint32_t *n_p)
{
    const kn_wave_pieces_t *pcs = gw_pfx_set_pieces(set, t / n_kv);
    uint64_t n = 0;

    for (uint32_t b = 0; pcs != NULL && b < pcs->n_blocks; b++) {
        kn_wave_piece_t pc;
        ri_status_t st = pcs->get(pcs->ctx, b, t % n_kv, &pc);
        if (st != RI_OK)
            return st;
        n += pc.n_clusters;
    }
    if (n > UINT32_MAX / 4)
        return RI_ERR_RANGE;
    *n_p = (uint32_t)n;
    return RI_OK;
}

/* Write table t's rows from set's pieces into c's file. */
static ri_status_t gw_meta_write_table(gw_meta_copy_t *c, gw_pfx_set_t *set, uint32_t n_kv, uint32_t t)
{
    const kn_wave_pieces_t *pcs = gw_pfx_set_pieces(set, t / n_kv);
    size_t row = (size_t)c->d * sizeof(cm_fp16_t), vm = gw_meta_span(c->n_c[t], c->d);
    uint64_t at = 0;

    for (uint32_t b = 0; pcs != NULL && b < pcs->n_blocks; b++) {
        kn_wave_piece_t pc;
        size_t n;
        if (pcs->get(pcs->ctx, b, t % n_kv, &pc) != RI_OK)
            return RI_ERR_INVALID;
        n = (size_t)pc.n_clusters * row;
        if (n > 0 && (pwrite(c->fd, pc.centroids, n, (off_t)(c->off[t] + at)) != (ssize_t)n ||
                      pwrite(c->fd, pc.vmean, n, (off_t)(c->off[t] + vm + at)) != (ssize_t)n))
            return RI_ERR_IO;
        at += n;
    }
    return RI_OK;
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
    c->off = cm_calloc(&gw_meta_tag, n_tables, sizeof(*c->off));
    if (c->n_c == NULL || c->off == NULL)
        goto fail;
    for (uint32_t t = 0; t < n_tables; t++) {
        if ((st = gw_meta_count(set, n_kv, t, &c->n_c[t])) != RI_OK)
            goto fail;
        c->off[t] = c->bytes;
        c->bytes += 2 * (uint64_t)gw_meta_span(c->n_c[t], d);
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
            uint32_t n = 0;
            same = gw_meta_count(set, n_kv, t, &n) == RI_OK && n == c->n_c[t];
        }
        if (same)
            return c;
    }
    return NULL;
}

/* Reserve table t's arrays (centroids, then value means, each with room for
 * the prefix's clusters and GW_META_OWN_CLUSTERS more) with the file's rows
 * mapped copy-on-write at both heads. */
static ri_status_t gw_meta_map_table(gw_meta_homes_t *m, uint32_t t)
{
    const gw_meta_copy_t *c = m->copy;
    size_t head = gw_meta_span(c->n_c[t], c->d);
    size_t room = gw_meta_span((uint64_t)c->n_c[t] + GW_META_OWN_CLUSTERS, c->d);
    uint8_t *base = mmap(NULL, 2 * room, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);

    if (base == MAP_FAILED)
        return RI_ERR_IO;
    m->base[t] = base;
    m->len[t] = 2 * room;
    if (mmap(base, head, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_FIXED, c->fd, (off_t)c->off[t]) == MAP_FAILED ||
        mmap(base + room, head, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_FIXED, c->fd, (off_t)(c->off[t] + head)) ==
            MAP_FAILED)
        return RI_ERR_IO;
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
        uint32_t n = m->copy->n_c[t], room = n + GW_META_OWN_CLUSTERS;
        if (n == 0)
            continue; /* a layer without pieces: its index is its own */
        st = gw_meta_map_table(m, t);
        if (st == RI_OK)
            st = kn_wave_place(waves[t / n_kv], t % n_kv, (cm_fp16_t *)m->base[t],
                               (cm_fp16_t *)(m->base[t] + m->len[t] / 2), room);
    }
    if (st != RI_OK) {
        /* the waves are still empty; those placed must not keep our homes */
        for (uint32_t t = 0; m->copy != NULL && t < n_tables; t++)
            (void)kn_wave_place(waves[t / n_kv], t % n_kv, NULL, NULL, 0);
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
