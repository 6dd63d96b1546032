/* The process's attached-prefix locations (gw_direct_share.h). */
#include "gpuworker/client/gw_direct_share.h"

#include <pthread.h>
#include <stdbool.h>
#include <string.h>

#include "common/cm_alloc.h"

static CM_ALLOC_TAG(gw_locs_tag, "gw.direct.share");

struct gw_locs {
    uint8_t key[CM_PFX_KEY_SIZE];
    uint32_t n_blocks, n_tables;
    uint64_t page_bytes;
    uint64_t *first; /* [n_tables + 1] table t's locations are loc[first[t], first[t + 1]) */
    uint64_t *loc;   /* [first[n_tables]] */
    uint32_t refs;   /* sequences reading it (under the lock) */
    struct gw_locs *next;
};

static pthread_mutex_t gw_locs_lock = PTHREAD_MUTEX_INITIALIZER;
static gw_locs_t *gw_locs_list; /* under the lock */

static void gw_locs_free(gw_locs_t *c)
{
    if (c == NULL)
        return;
    cm_free(c->first);
    cm_free(c->loc);
    cm_free(c);
}

/* A new copy of locs (refs 0), or NULL. */
static gw_locs_t *gw_locs_make(const uint8_t *key, uint32_t n_blocks, uint32_t n_tables, uint64_t page_bytes,
                               const uint32_t *counts, const uint64_t *locs)
{
    gw_locs_t *c = cm_calloc(&gw_locs_tag, 1, sizeof(*c));

    if (c == NULL)
        return NULL;
    memcpy(c->key, key, CM_PFX_KEY_SIZE);
    c->n_blocks = n_blocks;
    c->n_tables = n_tables;
    c->page_bytes = page_bytes;
    c->first = cm_malloc(&gw_locs_tag, ((size_t)n_tables + 1) * sizeof(*c->first));
    if (c->first == NULL)
        goto fail;
    c->first[0] = 0;
    for (uint32_t t = 0; t < n_tables; t++)
        c->first[t + 1] = c->first[t] + counts[t];
    c->loc = cm_malloc(&gw_locs_tag, (size_t)(c->first[n_tables] ? c->first[n_tables] : 1) * sizeof(*c->loc));
    if (c->loc == NULL)
        goto fail;
    memcpy(c->loc, locs, (size_t)c->first[n_tables] * sizeof(*c->loc));
    return c;
fail:
    gw_locs_free(c);
    return NULL;
}

/* Does c hold the prefix named so, with these counts? (lock held) */
static bool gw_locs_names(const gw_locs_t *c, const uint8_t *key, uint32_t n_blocks, uint32_t n_tables,
                          uint64_t page_bytes, const uint32_t *counts)
{
    if (memcmp(c->key, key, CM_PFX_KEY_SIZE) != 0 || c->n_blocks != n_blocks || c->n_tables != n_tables ||
        c->page_bytes != page_bytes)
        return false;
    for (uint32_t t = 0; t < n_tables; t++)
        if (c->first[t + 1] - c->first[t] != counts[t])
            return false;
    return true;
}

ri_status_t gw_locs_acquire(const uint8_t key[CM_PFX_KEY_SIZE], uint32_t n_blocks, uint32_t n_tables,
                            uint64_t page_bytes, const uint32_t *counts, const uint64_t *locs, gw_locs_t **out)
{
    ri_status_t st = RI_OK;
    gw_locs_t *c;

    if (out != NULL)
        *out = NULL;
    if (key == NULL || counts == NULL || locs == NULL || out == NULL || n_tables == 0 || n_blocks == 0)
        return RI_ERR_INVALID;
    pthread_mutex_lock(&gw_locs_lock);
    for (c = gw_locs_list; c != NULL; c = c->next)
        if (gw_locs_names(c, key, n_blocks, n_tables, page_bytes, counts))
            break;
    if (c != NULL && memcmp(c->loc, locs, (size_t)c->first[n_tables] * sizeof(*locs)) != 0) {
        st = RI_ERR_EXISTS; /* the validation: a sequence reads only what it was told */
    } else if (c == NULL) {
        c = gw_locs_make(key, n_blocks, n_tables, page_bytes, counts, locs);
        if (c == NULL) {
            st = RI_ERR_NOMEM;
        } else {
            c->next = gw_locs_list;
            gw_locs_list = c;
        }
    }
    if (st == RI_OK) {
        c->refs++;
        *out = c;
    }
    pthread_mutex_unlock(&gw_locs_lock);
    return st;
}

void gw_locs_release(gw_locs_t *c)
{
    gw_locs_t **pp;

    if (c == NULL)
        return;
    pthread_mutex_lock(&gw_locs_lock);
    if (--c->refs > 0) {
        pthread_mutex_unlock(&gw_locs_lock);
        return;
    }
    for (pp = &gw_locs_list; *pp != NULL && *pp != c; pp = &(*pp)->next)
        ;
    if (*pp == c)
        *pp = c->next;
    pthread_mutex_unlock(&gw_locs_lock);
    gw_locs_free(c);
}

const uint64_t *gw_locs_table(const gw_locs_t *c, uint32_t t, uint32_t *n_p)
{
    *n_p = 0;
    if (c == NULL || t >= c->n_tables)
        return NULL;
    *n_p = (uint32_t)(c->first[t + 1] - c->first[t]);
    return *n_p > 0 ? c->loc + c->first[t] : NULL;
}

void gw_locs_stats(uint32_t *copies_p, uint64_t *bytes_p)
{
    uint32_t n = 0;
    uint64_t b = 0;

    pthread_mutex_lock(&gw_locs_lock);
    for (const gw_locs_t *c = gw_locs_list; c != NULL; c = c->next, n++)
        b += (c->first[c->n_tables] + c->n_tables + 1) * sizeof(uint64_t);
    pthread_mutex_unlock(&gw_locs_lock);
    if (copies_p != NULL)
        *copies_p = n;
    if (bytes_p != NULL)
        *bytes_p = b;
}
