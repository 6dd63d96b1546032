/* The cache pages of one head's cached clusters (gw_cpg.h). */
#include "gpuworker/client/gw_cpg.h"

#include <string.h>

#include "common/cm_alloc.h"

static CM_ALLOC_TAG(gw_cpg_tag, "gw.remote.cpg");

#define GW_CPG_MIN_CAP 64u

/* Fibonacci hashing: consecutive ids (a step's neighbours) spread out. */
static uint32_t gw_cpg_home(const gw_cpg_t *m, uint32_t id)
{
    return (uint32_t)((id * 2654435769u) & (m->cap - 1));
}

uint32_t *gw_cpg_get(const gw_cpg_t *m, uint32_t id)
{
    if (m->n == 0 || id == GW_CPG_EMPTY)
        return NULL;
    for (uint32_t i = gw_cpg_home(m, id);; i = (i + 1) & (m->cap - 1)) {
        if (m->slot[i].id == id)
            return m->slot[i].pages;
        if (m->slot[i].id == GW_CPG_EMPTY)
            return NULL; /* at most half full: an empty slot ends every probe */
    }
}

/* Place (id, pages) in the first free slot of its probe (id not present). */
static void gw_cpg_insert(gw_cpg_t *m, uint32_t id, uint32_t *pages)
{
    uint32_t i = gw_cpg_home(m, id);
    while (m->slot[i].id != GW_CPG_EMPTY)
        i = (i + 1) & (m->cap - 1);
    m->slot[i].id = id;
    m->slot[i].pages = pages;
    m->n++;
}

/* Double the table (or make the first), keeping every entry. */
static ri_status_t gw_cpg_grow(gw_cpg_t *m)
{
    gw_cpg_t n = { .cap = m->cap ? m->cap * 2u : GW_CPG_MIN_CAP };

    if (m->cap > UINT32_MAX / 4)
        return RI_ERR_RANGE;
    n.slot = cm_malloc(&gw_cpg_tag, (size_t)n.cap * sizeof(*n.slot));
    if (n.slot == NULL)
        return RI_ERR_NOMEM;
    for (uint32_t i = 0; i < n.cap; i++)
        n.slot[i].id = GW_CPG_EMPTY;
    for (uint32_t i = 0; i < m->cap; i++)
        if (m->slot[i].id != GW_CPG_EMPTY)
            gw_cpg_insert(&n, m->slot[i].id, m->slot[i].pages);
    cm_free(m->slot);
    *m = n;
    return RI_OK;
}

uint32_t *gw_cpg_put(gw_cpg_t *m, uint32_t id, uint32_t n_pages)
{
    uint32_t *pg = gw_cpg_get(m, id);

    if (pg != NULL || id == GW_CPG_EMPTY)
        return pg;
    if (2u * ((uint64_t)m->n + 1) > m->cap && gw_cpg_grow(m) != RI_OK)
        return NULL;
    pg = cm_malloc(&gw_cpg_tag, (size_t)(n_pages ? n_pages : 1) * sizeof(uint32_t));
    if (pg != NULL)
        gw_cpg_insert(m, id, pg);
    return pg;
}

void gw_cpg_del(gw_cpg_t *m, uint32_t id)
{
    uint32_t i, j;

    if (m->n == 0 || id == GW_CPG_EMPTY)
        return;
    for (i = gw_cpg_home(m, id); m->slot[i].id != id; i = (i + 1) & (m->cap - 1))
        if (m->slot[i].id == GW_CPG_EMPTY)
            return;
    cm_free(m->slot[i].pages);
    m->n--;
    /* backward shift: move up every later entry of the run whose home is
     * not between the hole and it, so no probe meets a false end */
    for (j = (i + 1) & (m->cap - 1); m->slot[j].id != GW_CPG_EMPTY; j = (j + 1) & (m->cap - 1)) {
        uint32_t home = gw_cpg_home(m, m->slot[j].id);
        if (((j - home) & (m->cap - 1)) >= ((j - i) & (m->cap - 1))) {
            m->slot[i] = m->slot[j];
            i = j;
        }
    }
    m->slot[i].id = GW_CPG_EMPTY;
    m->slot[i].pages = NULL;
}

void gw_cpg_clear(gw_cpg_t *m)
{
    for (uint32_t i = 0; i < m->cap; i++)
        if (m->slot[i].id != GW_CPG_EMPTY)
            cm_free(m->slot[i].pages);
    cm_free(m->slot);
    memset(m, 0, sizeof(*m));
}
