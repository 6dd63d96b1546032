/*
 * The staging ring (gw_stage.h): slots handed out in ring order, each
 * reused only once the copier finished the copy that last read it.
 */
#include "gpuworker/client/gw_stage.h"

#include <stdatomic.h>
#include <stdbool.h>
#include <string.h>

#include "common/cm_alloc.h"
#include "common/cm_status.h"

static CM_ALLOC_TAG(gw_stage_tag, "gw.stage");

/* Written once by the CUDA file's init, read by any thread. */
static _Atomic(const gw_pinned_t *) gw_stage_pinned_ops;

typedef struct gw_slot {
    gw_ticket_t t; /* last copy that read it (GW_TICKET_NONE: never used) */
    bool held;     /* acquired, not yet submitted or released */
} gw_slot_t;

struct gw_stage {
    gw_copier_t *c;            /* borrowed */
    const gw_pinned_t *pinned; /* the allocator of buf, or NULL (cm_malloc_aligned) */
    uint8_t *buf;              /* [n][slot_bytes] */
    size_t slot_bytes;
    uint32_t n;                /* slots */
    uint32_t next;             /* next slot to hand out */
    gw_slot_t *slot;           /* [n] */
    uint64_t waits;            /* acquires that waited for a copy */
};

void gw_stage_register_pinned(const gw_pinned_t *pinned)
{
    atomic_store(&gw_stage_pinned_ops, pinned);
}

ri_status_t gw_stage_create(gw_copier_t *c, const kn_mem_t *dst, uint32_t n_slots, size_t slot_bytes,
                            gw_stage_t **s_p)
{
    gw_stage_t *s;
    ri_status_t st;

    if (c == NULL || n_slots == 0 || slot_bytes == 0 || s_p == NULL || slot_bytes > SIZE_MAX / n_slots)
        return RI_ERR_INVALID;
    s = cm_calloc(&gw_stage_tag, 1, sizeof(*s));
    if (s == NULL)
        return RI_ERR_NOMEM;
    s->c = c;
    s->n = n_slots;
    s->slot_bytes = slot_bytes;
    s->slot = cm_calloc(&gw_stage_tag, n_slots, sizeof(*s->slot));
    if (s->slot == NULL) {
        st = RI_ERR_NOMEM;
        goto err_free_s;
    }
    /* Page-locked only where a copy engine benefits: a device destination. */
    s->pinned = dst != NULL && dst->device ? atomic_load(&gw_stage_pinned_ops) : NULL;
    if (s->pinned != NULL) {
        void *p = NULL;
        st = s->pinned->alloc(&p, (size_t)n_slots * slot_bytes);
        if (st != RI_OK)
            goto err_free_slots;
        s->buf = p;
    } else {
        s->buf = cm_malloc_aligned(&gw_stage_tag, (size_t)n_slots * slot_bytes, 4096);
        if (s->buf == NULL) {
            st = RI_ERR_NOMEM;
            goto err_free_slots;
        }
    }
    *s_p = s;
    return RI_OK;

err_free_slots:
    cm_free(s->slot);
err_free_s:
    cm_free(s);
    return st;
}

void gw_stage_destroy(gw_stage_t *s)
{
    if (s == NULL)
        return;
    /* the copier may still read the slots: wait for the newest of them */
    gw_ticket_t last = GW_TICKET_NONE;
    for (uint32_t i = 0; i < s->n; i++)
        last = CM_MAX(last, s->slot[i].t);
    (void)gw_copier_wait(s->c, last, GW_NO_DEADLINE);
    if (s->pinned != NULL)
        s->pinned->free(s->buf);
    else
        cm_free(s->buf);
    cm_free(s->slot);
    cm_free(s);
}

ri_status_t gw_stage_acquire(gw_stage_t *s, uint64_t deadline_ns, uint32_t *slot_p, uint8_t **buf_p)
{
    gw_slot_t *sl = &s->slot[s->next];
    ri_status_t st;

    if (sl->held)
        return RI_ERR_BUSY;
    if (!gw_copier_done(s->c, sl->t))
        s->waits++;
    st = gw_copier_wait(s->c, sl->t, deadline_ns);
    if (st == RI_OK)
        st = gw_copier_error(s->c);
    if (st != RI_OK)
        return st;
    sl->held = true;
    *slot_p = s->next;
    *buf_p = s->buf + (size_t)s->next * s->slot_bytes;
    s->next = (s->next + 1) % s->n;
    return RI_OK;
}

ri_status_t gw_stage_submit(gw_stage_t *s, uint32_t slot, void *dst, size_t bytes, gw_ticket_t *t_p)
{
    gw_ticket_t t;
    ri_status_t st;

    if (slot >= s->n || !s->slot[slot].held || bytes > s->slot_bytes)
        return RI_ERR_INVALID;
    s->slot[slot].held = false;
    st = gw_copier_submit(s->c, dst, s->buf + (size_t)slot * s->slot_bytes, bytes, &t);
    if (st != RI_OK)
        return st; /* nothing queued: the slot's last copy is still its older one */
    if (t != GW_TICKET_NONE)
        s->slot[slot].t = t;
    *t_p = t;
    return RI_OK;
}

void gw_stage_release(gw_stage_t *s, uint32_t slot)
{
    if (slot < s->n)
        s->slot[slot].held = false;
}

ri_status_t gw_stage_put(gw_stage_t *s, void *dst, const void *src, size_t bytes, uint64_t deadline_ns,
                         gw_ticket_t *t_p)
{
    gw_ticket_t t = GW_TICKET_NONE;
    for (size_t off = 0; off < bytes;) {
        size_t n = CM_MIN(bytes - off, s->slot_bytes);
        uint32_t slot;
        uint8_t *buf;
        ri_status_t st = gw_stage_acquire(s, deadline_ns, &slot, &buf);
        if (st != RI_OK)
            return st;
        memcpy(buf, (const uint8_t *)src + off, n);
        st = gw_stage_submit(s, slot, (uint8_t *)dst + off, n, &t);
        if (st != RI_OK)
            return st;
        off += n;
    }
    *t_p = t;
    return RI_OK;
}

size_t gw_stage_slot_bytes(const gw_stage_t *s)
{
    return s->slot_bytes;
}

uint32_t gw_stage_slots(const gw_stage_t *s)
{
    return s->n;
}

bool gw_stage_pinned(const gw_stage_t *s)
{
    return s->pinned != NULL;
}

uint64_t gw_stage_waits(const gw_stage_t *s)
{
    return s->waits;
}
