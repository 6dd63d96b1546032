/*
 * Prefix blocks, the kvstore's side (common/cm_dp_prefix.h,
 * docs/kvstore-data.md "Prefix blocks").  A published block is an object of
 * its own, apart from every session: its bytes live in an anonymous memory
 * file written once and then sealed against every write (F_SEAL_WRITE, after
 * the writable mapping is gone; we keep a read-only one), so neither we nor
 * a worker that maps it can change it.  The pool lends it an extent nobody
 * touches, as for direct regions, so that the pool's budget and pressure
 * count it.  The catalog is per tenant (a hash on tenant and key): a caller
 * only ever finds its own tenant's blocks.
 *
 * A session that attaches a block references it once per slot; its cluster
 * tables gain entries of tier KVS_TIER_BLOCK that point into the block, so
 * FETCH_RANKED, LOCATE and TOUCH treat them as the session's own, but they
 * are never spilled or freed one by one.  Unreferenced blocks in the
 * catalog are on an LRU: they go first when a PUT passes a cap and when the
 * pool runs short for a session's data.  A block taken out of the catalog
 * while referenced (DropPrefix) is freed at its last detach.
 *
 * With a spill tier, evicted blocks are written out without data->lock
 * (kvs_pfx_spill_unlocked: the spill writer's reclaim, which a direct
 * region's room uses too, and the room made under the caps and in the pool
 * before a block is held): the block is pinned and marked writing (off the
 * LRU) meanwhile, and abandoned if it was attached or dropped before the
 * commit.  The hold never writes: when another lane took the room, it
 * answers RI_ERR_BUSY and its caller makes room again.  Only the shutdown
 * write-out (nothing served) writes under the lock.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>

#include "common/cm_alloc.h"
#include "common/cm_crc32c.h"
#include "common/cm_dp_prefix.h"
#include "common/cm_log.h"
#include "common/cm_status.h"
#include "kvstore/data/kvs_internal.h"
#include "kvstore/spill/kvs_spill.h"

/* Makings of room before a hold gives up when other lanes keep taking it
 * (rare: each needs a race with a write in between). */
#define KVS_PFX_HOLD_TRIES 3u

static CM_ALLOC_TAG(kvs_prefix_tag, "kvs.prefix");

/* --- catalog ------------------------------------------------------------ */

static uint32_t kvs_pfx_bucket(const char *tenant, const uint8_t key[CM_PFX_KEY_SIZE])
{
    uint64_t h;

    memcpy(&h, key, sizeof(h)); /* keys are hashes already */
    for (const char *c = tenant; *c != '\0'; c++)
        h = (h ^ (uint8_t)*c) * UINT64_C(0x100000001b3);
    return (uint32_t)(h % KVS_PFX_BUCKETS);
}

kvs_pblock_t *kvs_prefix_find_locked(kvs_data_t *data, const char *tenant, const uint8_t *key)
{
    for (kvs_pblock_t *b = data->prefix.buckets[kvs_pfx_bucket(tenant, key)]; b != NULL; b = b->hnext)
        if (memcmp(b->key, key, CM_PFX_KEY_SIZE) == 0 && strcmp(b->tenant, tenant) == 0)
            return b;
    return NULL;
}

static void kvs_pfx_lru_remove(kvs_pcat_t *pc, kvs_pblock_t *b)
{
    if (b->lru_prev != NULL)
        b->lru_prev->lru_next = b->lru_next;
    else if (pc->lru_head == b)
        pc->lru_head = b->lru_next;
    if (b->lru_next != NULL)
        b->lru_next->lru_prev = b->lru_prev;
    else if (pc->lru_tail == b)
        pc->lru_tail = b->lru_prev;
    b->lru_prev = b->lru_next = NULL;
}

/* Most recently used at the tail. */
static void kvs_pfx_lru_push(kvs_pcat_t *pc, kvs_pblock_t *b)
{
    b->lru_prev = pc->lru_tail;
    b->lru_next = NULL;
    if (pc->lru_tail != NULL)
        pc->lru_tail->lru_next = b;
    else
        pc->lru_head = b;
    pc->lru_tail = b;
}

void kvs_prefix_insert_locked(kvs_data_t *data, kvs_pblock_t *b)
{
    uint32_t i = kvs_pfx_bucket(b->tenant, b->key);

    b->hnext = data->prefix.buckets[i];
    data->prefix.buckets[i] = b;
    if (!b->in_catalog && data->prefix.hook != NULL)
        data->prefix.hook(data->prefix.hook_arg, b->key, true);
    b->in_catalog = true;
    if (b->refs == 0 && !b->on_disk)
        kvs_pfx_lru_push(&data->prefix, b);
}

/* Take b out of the catalog (and the LRU); it lives on while referenced. */
void kvs_prefix_unlink_locked(kvs_data_t *data, kvs_pblock_t *b)
{
    kvs_pblock_t **pp = &data->prefix.buckets[kvs_pfx_bucket(b->tenant, b->key)];

    while (*pp != NULL && *pp != b)
        pp = &(*pp)->hnext;
    if (*pp == b)
        *pp = b->hnext;
    b->hnext = NULL;
    if (b->in_catalog && b->refs == 0 && !b->on_disk && !b->writing)
        kvs_pfx_lru_remove(&data->prefix, b);
    if (b->in_catalog && data->prefix.hook != NULL)
        data->prefix.hook(data->prefix.hook_arg, b->key, false);
    b->in_catalog = false;
}

/* Unmap and close a block's file (no accounting: it was never admitted, or
 * kvs_pfx_free_locked did that). */
static void kvs_pfx_release(kvs_pblock_t *b)
{
    if (b == NULL)
        return;
    if (b->base != NULL)
        munmap((void *)(uintptr_t)b->base, b->bytes);
    if (b->fd >= 0)
        close(b->fd);
    cm_free(b->desc);
    cm_free(b->tab_first);
    cm_free(b);
}

/* Free an admitted block nobody references: its pool hold and charges (or
 * its disk records) go back. */
static void kvs_pfx_free_locked(kvs_data_t *data, kvs_pblock_t *b)
{
    kvs_tenant_t *t;

    if (b->on_disk) {
        kvs_prefix_disk_forget_locked(data, b);
        kvs_pfx_release(b);
        return;
    }
    t = kvs_tenant_get_locked(data, b->tenant);
    kvs_pool_free(data->pool, b->hold_off, b->charge);
    data->prefix.blocks--;
    data->prefix.bytes -= b->charge;
    if (t != NULL)
        t->prefix_bytes -= b->charge;
    kvs_pfx_release(b);
}

/* Evict an unreferenced resident block of the catalog: to the spill tier
 * when there is one and it takes the block, else out of the catalog. */
static void kvs_pfx_evict_locked(kvs_data_t *data, kvs_pblock_t *b)
{
    data->prefix.evictions++;
    if (kvs_tier_on(data)) {
        kvs_pfx_lru_remove(&data->prefix, b);
        if (kvs_prefix_spill_locked(data, b) == RI_OK)
            return;
        kvs_pfx_lru_push(&data->prefix, b); /* so that unlink finds it where it expects */
    }
    cm_debug("prefix: evicting a block of tenant %s (%" PRIu64 " bytes)", b->tenant, b->bytes);
    kvs_prefix_unlink_locked(data, b);
    if (b->pins == 0)
        kvs_pfx_free_locked(data, b); /* else a lane still reading it back frees it at its unpin */
}

/* The least recently used unreferenced block (of tenant, or of anyone when NULL). */
static kvs_pblock_t *kvs_pfx_lru_victim(const kvs_pcat_t *pc, const char *tenant)
{
    for (kvs_pblock_t *b = pc->lru_head; b != NULL; b = b->lru_next)
        if (tenant == NULL || strcmp(b->tenant, tenant) == 0)
            return b;
    return NULL;
}

/* Bytes the LRU could give back (of tenant, or of anyone when NULL). */
static uint64_t kvs_pfx_evictable(const kvs_pcat_t *pc, const char *tenant)
{
    uint64_t n = 0;

    for (kvs_pblock_t *b = pc->lru_head; b != NULL; b = b->lru_next)
        if (tenant == NULL || strcmp(b->tenant, tenant) == 0)
            n += b->charge;
    return n;
}

uint64_t kvs_prefix_reclaim_locked(kvs_data_t *data, uint64_t bytes)
{
    uint64_t freed = 0;

    while (freed < bytes && data->prefix.lru_head != NULL) {
        freed += data->prefix.lru_head->charge;
        kvs_pfx_evict_locked(data, data->prefix.lru_head);
    }
    return freed;
}

/* Write b (resident, unreferenced, in the catalog, taken off the LRU) to
 * the spill store without data->lock: pinned and marked writing, so that
 * its memory stays and a DropPrefix leaves its freeing to us; an attach
 * meanwhile reads its memory.  Then, under the lock again: on disk (memory
 * freed), or, when it was attached or dropped during the write, the write
 * is abandoned (records forgotten) and it stays resident, back on the LRU
 * when unreferenced, or is freed when dropped and unused.  A failed write
 * evicts it from memory, as under the lock.  Returns the pool bytes freed;
 * *sync_p is set when the write was abandoned for a dropped block. */
static uint64_t kvs_pfx_spill_write_unlocked(kvs_data_t *data, kvs_pblock_t *b, bool *sync_p)
{
    uint64_t id = ++data->prefix.next_disk_id, charge = b->charge;
    ri_status_t st;

    b->writing = true;
    b->wtouched = false;
    b->pins++;
    pthread_mutex_unlock(&data->lock);
    st = kvs_prefix_disk_write(data, b, id);
    pthread_mutex_lock(&data->lock);
    b->pins--;
    b->writing = false;
    if (st == RI_OK && b->in_catalog && b->refs == 0 && !b->wtouched) {
        kvs_prefix_disk_commit_locked(data, b, id);
        return charge;
    }
    if (st == RI_OK)
        *sync_p = kvs_prefix_disk_abandon_locked(data, b, id);
    if (!b->in_catalog) { /* dropped meanwhile */
        if (b->refs > 0 || b->pins > 0)
            return 0; /* its last detach or unpin frees it */
        kvs_pfx_free_locked(data, b);
        return charge;
    }
    if (b->refs > 0)
        return 0; /* attached: off the LRU while referenced */
    if (st == RI_OK) {
        kvs_pfx_lru_push(&data->prefix, b); /* used meanwhile: the most recent now */
        return 0;
    }
    cm_debug("prefix: evicting a block of tenant %s (%" PRIu64 " bytes)", b->tenant, b->bytes);
    kvs_prefix_unlink_locked(data, b);
    if (b->pins == 0)
        kvs_pfx_free_locked(data, b);
    return charge;
}

/* kvs_pfx_spill_write_unlocked, then, when the write was abandoned for a
 * block dropped meanwhile, the store's manifest without its records, the
 * lock released again for that write (rare: a drop during the write). */
static uint64_t kvs_pfx_spill_unlocked(kvs_data_t *data, kvs_pblock_t *b)
{
    bool sync = false;
    uint64_t freed = kvs_pfx_spill_write_unlocked(data, b, &sync);

    if (sync) {
        pthread_mutex_unlock(&data->lock);
        (void)kvs_spill_sync(data->spill);
        pthread_mutex_lock(&data->lock);
    }
    return freed;
}

uint64_t kvs_prefix_reclaim_writer_locked(kvs_data_t *data, uint64_t bytes)
{
    uint64_t freed = 0, tries = 0;

    if (!kvs_tier_on(data))
        return kvs_prefix_reclaim_locked(data, bytes);
    for (const kvs_pblock_t *b = data->prefix.lru_head; b != NULL; b = b->lru_next)
        tries++; /* each block once at most: one used during its write goes to the LRU's end */
    while (freed < bytes && tries-- > 0 && data->prefix.lru_head != NULL) {
        kvs_pblock_t *b = data->prefix.lru_head;
        data->prefix.evictions++;
        kvs_pfx_lru_remove(&data->prefix, b);
        freed += kvs_pfx_spill_unlocked(data, b);
    }
    return freed;
}

/* Make room under the caps for a block of need bytes (tenant's) by
 * writing unreferenced blocks out, each without the lock
 * (kvs_pfx_spill_unlocked), but only while the LRU can make it fit: the
 * same rules as kvs_prefix_hold_locked.  Spill tier on; lock held,
 * released per block written. */
static void kvs_pfx_make_cap_room_locked(kvs_data_t *data, const char *tenant, uint64_t need)
{
    kvs_pcat_t *pc = &data->prefix;
    uint64_t tries = 1;

    for (const kvs_pblock_t *b = pc->lru_head; b != NULL; b = b->lru_next)
        tries++;
    while (tries-- > 0) {
        /* again each time: the tenant table may move while the lock is out */
        kvs_tenant_t *t = kvs_tenant_get_locked(data, tenant);
        uint64_t tmax = pc->tenant_max_bytes;
        bool t_over = t != NULL && tmax != 0 && t->prefix_bytes + need > tmax;
        kvs_pblock_t *victim;
        if (t == NULL || need > pc->max_bytes || (tmax != 0 && need > tmax) ||
            (t_over && t->prefix_bytes - kvs_pfx_evictable(pc, t->name) + need > tmax) ||
            (pc->bytes + need > pc->max_bytes && pc->bytes - kvs_pfx_evictable(pc, NULL) + need > pc->max_bytes))
            return; /* fits, or cannot be made to: kvs_prefix_hold_locked answers */
        if (t_over)
            victim = kvs_pfx_lru_victim(pc, t->name);
        else if (pc->bytes + need > pc->max_bytes)
            victim = pc->lru_head;
        else
            return; /* fits */
        if (victim == NULL)
            return;
        pc->evictions++;
        kvs_pfx_lru_remove(pc, victim);
        (void)kvs_pfx_spill_unlocked(data, victim);
    }
}

/* Before a block of need bytes (tenant's) is held: with a spill tier, make
 * room for it under the caps (kvs_pfx_make_cap_room_locked) and in the pool
 * (a trial allocation, given back at once; when it fails, unreferenced
 * blocks are written out the spill writer's way,
 * kvs_tier_reclaim_prefix_locked), every write without the lock.
 * kvs_prefix_hold_locked then finds room, or answers RI_ERR_QUOTA (the caps
 * cannot be met), or RI_ERR_BUSY when another lane took the room meanwhile
 * (the caller comes back here).  Lock held, released per block written:
 * the caller looks up again what it found before. */
static void kvs_pfx_make_room_locked(kvs_data_t *data, const char *tenant, uint64_t need)
{
    const kvs_pcat_t *pc = &data->prefix;
    const kvs_tenant_t *t;
    uint64_t off;
    ri_status_t st;

    if (!kvs_tier_on(data))
        return; /* evicting from memory is quick: kvs_prefix_hold_locked does it */
    kvs_pfx_make_cap_room_locked(data, tenant, need);
    t = kvs_tenant_get_locked(data, tenant); /* again: the table may have moved */
    if (pc->lru_head == NULL || t == NULL || pc->bytes + need > pc->max_bytes ||
        (pc->tenant_max_bytes != 0 && t->prefix_bytes + need > pc->tenant_max_bytes))
        return; /* nothing to write out, or over a cap anyway: the hold answers */
    st = kvs_pool_alloc(data->pool, need, &off);
    if (st == RI_OK)
        kvs_pool_free(data->pool, off, need);
    else if (st == RI_ERR_NOSPACE)
        (void)kvs_tier_reclaim_prefix_locked(data, need);
}

/* --- blocks -------------------------------------------------------------- */

static uint64_t kvs_pfx_unix_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (uint64_t)ts.tv_sec * 1000u + (uint64_t)ts.tv_nsec / 1000000u;
}

/* Put len bytes of buf into a new memory file, seal it against every
 * change (the writable mapping is gone first: F_SEAL_WRITE needs that) and
 * map it read-only.  Lock not held: this copies the whole block. */
ri_status_t kvs_prefix_make(const uint8_t *buf, uint64_t len, kvs_pblock_t **b_p)
{
    kvs_pblock_t *b = cm_calloc(&kvs_prefix_tag, 1, sizeof(*b));
    void *w, *r;
    int e;

    if (b == NULL)
        return RI_ERR_NOMEM;
    b->fd = memfd_create("ri-prefix", MFD_CLOEXEC | MFD_ALLOW_SEALING);
    if (b->fd < 0 || ftruncate(b->fd, (off_t)len) != 0)
        goto err_errno;
    w = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_SHARED, b->fd, 0);
    if (w == MAP_FAILED)
        goto err_errno;
    memcpy(w, buf, len);
    munmap(w, len);
    if (fcntl(b->fd, F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_WRITE | F_SEAL_SEAL) != 0)
        goto err_errno;
    r = mmap(NULL, len, PROT_READ, MAP_SHARED, b->fd, 0);
    if (r == MAP_FAILED)
        goto err_errno;
    b->base = r;
    b->bytes = len;
    *b_p = b;
    return RI_OK;

err_errno:
    e = errno;
    cm_warn("prefix: no memory file for a block of %" PRIu64 " bytes: %s", len, strerror(e));
    kvs_pfx_release(b);
    return e == ENOMEM || e == ENOSPC ? RI_ERR_NOMEM : RI_ERR_IO;
}

static bool kvs_pfx_geometry_ok(const kvs_session_t *s, const cm_pfx_hdr_t *h)
{
    return h->layers == s->geo.layers && h->kv_heads == s->geo.kv_heads && h->head_dim == s->geo.head_dim &&
           h->dtype == s->geo.dtype && h->page_tokens == s->geo.page_tokens;
}

/* b's cluster descriptors, once (v: its decoded view).  Lock held. */
static ri_status_t kvs_pfx_desc_locked(const kvs_session_t *s, kvs_pblock_t *b, const cm_pfx_view_t *v)
{
    uint64_t off = (uint64_t)(v->pages - b->base);
    const uint8_t *sz = v->sizes;
    uint32_t k = 0;

    if (b->desc != NULL)
        return RI_OK;
    b->desc = cm_malloc(&kvs_prefix_tag, (size_t)(v->total_clusters ? v->total_clusters : 1) * sizeof(*b->desc));
    b->tab_first = cm_malloc(&kvs_prefix_tag, ((size_t)v->n_tables + 1) * sizeof(uint32_t));
    if (b->desc == NULL || b->tab_first == NULL) {
        cm_free(b->desc);
        cm_free(b->tab_first);
        b->desc = NULL;
        b->tab_first = NULL;
        return RI_ERR_NOMEM;
    }
    for (uint32_t t = 0; t < v->n_tables; t++) {
        b->tab_first[t] = k;
        for (uint32_t j = cm_dp_get32(v->counts + 4u * t); j > 0; j--, sz += 4, k++) {
            uint32_t tok = cm_dp_get32(sz);
            b->desc[k] = (kvs_bdesc_t){.off = off, .tokens = tok};
            off += kvs_cluster_pages(s, tok) * s->page_bytes;
        }
    }
    b->tab_first[v->n_tables] = k;
    return RI_OK;
}

/* Append b's clusters of table t as a run (ids [t->n, t->n + count)); room
 * was made by the caller. */
static void kvs_pfx_add_run(kvs_table_t *tab, const kvs_pblock_t *b, uint32_t t, uint32_t slot)
{
    uint32_t count = b->tab_first[t + 1] - b->tab_first[t];
    if (count == 0)
        return;
    tab->runs[tab->n_runs++] = (kvs_arun_t){.first = tab->n, .count = count, .slot = slot,
                                            .d = b->desc + b->tab_first[t]};
    tab->n += count;
    tab->n_att += count;
}

/* b's clusters of every table as own entries of tier BLOCK after the
 * session's own clusters (ids stay positions).  All or nothing. */
static ri_status_t kvs_pfx_add_entries(kvs_session_t *s, const kvs_pblock_t *b, uint32_t n_tables, uint32_t slot)
{
    for (uint32_t t = 0; t < n_tables; t++) {
        ri_status_t st = kvs_table_reserve(&s->tables[t], b->tab_first[t + 1] - b->tab_first[t]);
        if (st != RI_OK)
            return st;
    }
    for (uint32_t t = 0; t < n_tables; t++) {
        kvs_table_t *tab = &s->tables[t];
        for (uint32_t k = b->tab_first[t]; k < b->tab_first[t + 1]; k++, tab->n++)
            tab->c[tab->n - tab->n_att] = (kvs_cluster_t){.off = b->desc[k].off, .tokens = b->desc[k].tokens,
                                                          .tier = KVS_TIER_BLOCK, .no_crc = true, .block = slot};
    }
    return RI_OK;
}

/* Room for one more run in every table. */
static ri_status_t kvs_pfx_runs_reserve(kvs_session_t *s, uint32_t n_tables)
{
    for (uint32_t t = 0; t < n_tables; t++) {
        kvs_table_t *tab = &s->tables[t];
        if (tab->n_runs < tab->cap_runs)
            continue;
        uint32_t cap = tab->cap_runs ? 2u * tab->cap_runs : 8u;
        kvs_arun_t *nr = cm_realloc(&kvs_prefix_tag, tab->runs, (size_t)cap * sizeof(*nr));
        if (nr == NULL)
            return RI_ERR_NOMEM;
        tab->runs = nr;
        tab->cap_runs = cap;
    }
    return RI_OK;
}

/* Attach b to s at the next slot: its clusters join s's tables, table by
 * table: as runs over b's own descriptors while s has no clusters of its
 * own (the usual case: a session attaches at its start), else as own
 * entries of tier BLOCK after them.  All or nothing (room is made before
 * anything changes). */
static ri_status_t kvs_pfx_attach_locked(kvs_data_t *data, kvs_session_t *s, kvs_pblock_t *b, uint32_t *slot_p)
{
    cm_pfx_view_t v;
    uint32_t slot = s->n_blocks;
    ri_status_t st = cm_pfx_decode(b->base, b->bytes, &v); /* checked at PUT; the view is not kept */

    if (st != RI_OK)
        return RI_ERR_CORRUPT;
    if (!kvs_pfx_geometry_ok(s, &v.hdr))
        return RI_ERR_INVALID;
    if (slot > CM_PFX_LOC_MAX_SLOT)
        return RI_ERR_QUOTA;
    if (slot == s->cap_blocks) {
        uint32_t cap = s->cap_blocks ? 2u * s->cap_blocks : 8u;
        kvs_pblock_t **nb = cm_realloc(&kvs_prefix_tag, s->blocks, (size_t)cap * sizeof(*nb));
        if (nb == NULL)
            return RI_ERR_NOMEM;
        s->blocks = nb;
        s->cap_blocks = cap;
    }
    if (!s->pfx_slots_only) {
        bool as_runs = true;
        for (uint32_t t = 0; t < v.n_tables; t++)
            as_runs = as_runs && s->tables[t].n == s->tables[t].n_att;
        if ((st = kvs_pfx_desc_locked(s, b, &v)) != RI_OK)
            return st;
        if (as_runs && (st = kvs_pfx_runs_reserve(s, v.n_tables)) != RI_OK)
            return st;
        if (!as_runs && (st = kvs_pfx_add_entries(s, b, v.n_tables, slot)) != RI_OK)
            return st;
        for (uint32_t t = 0; t < v.n_tables && as_runs; t++)
            kvs_pfx_add_run(&s->tables[t], b, t, slot);
        s->clusters += v.total_clusters;
    }
    s->blocks[slot] = b;
    s->n_blocks++;
    if (b->writing)
        b->wtouched = true; /* its write in flight is abandoned: it is in use again */
    else if (b->refs == 0 && b->in_catalog)
        kvs_pfx_lru_remove(&data->prefix, b);
    b->refs++;
    data->prefix.tokens_attached += b->n_tokens;
    *slot_p = slot;
    return RI_OK;
}

void kvs_prefix_detach_all_locked(kvs_data_t *data, kvs_session_t *s)
{
    for (uint32_t i = 0; i < s->n_blocks; i++) {
        kvs_pblock_t *b = s->blocks[i];
        if (--b->refs > 0)
            continue;
        if (b->in_catalog) {
            if (!b->writing) /* else its write's end puts it back */
                kvs_pfx_lru_push(&data->prefix, b); /* stays cached, now evictable */
        } else if (b->pins == 0)
            kvs_pfx_free_locked(data, b); /* dropped while attached: its last user left */
    }
    cm_free(s->blocks);
    s->blocks = NULL;
    s->n_blocks = s->cap_blocks = 0;
}

/* Make room under the caps for b (of tenant t) by evicting unreferenced
 * blocks (the tenant's own for its cap), hold its pool extent and account
 * it.  RI_ERR_QUOTA when the caps cannot be met even so (nothing evicted
 * then), RI_ERR_NOSPACE when the pool has no room.  With a spill tier an
 * eviction would write to disk, which never happens under the lock: when
 * room is still short (another lane took what kvs_pfx_make_room_locked
 * made), it evicts nothing and answers RI_ERR_BUSY; the caller makes room
 * again and retries (kvs_pfx_make_room_locked). */
ri_status_t kvs_prefix_hold_locked(kvs_data_t *data, kvs_tenant_t *t, kvs_pblock_t *b)
{
    kvs_pcat_t *pc = &data->prefix;
    uint64_t need = kvs_pool_round(b->bytes), tmax = pc->tenant_max_bytes;
    bool spill = kvs_tier_on(data);
    ri_status_t st;

    if (need > pc->max_bytes || (tmax != 0 && need > tmax))
        return RI_ERR_QUOTA;
    if (tmax != 0 && t->prefix_bytes + need > tmax && t->prefix_bytes - kvs_pfx_evictable(pc, t->name) + need > tmax)
        return RI_ERR_QUOTA;
    if (pc->bytes + need > pc->max_bytes && pc->bytes - kvs_pfx_evictable(pc, NULL) + need > pc->max_bytes)
        return RI_ERR_QUOTA;
    if (spill && ((tmax != 0 && t->prefix_bytes + need > tmax) || pc->bytes + need > pc->max_bytes))
        return RI_ERR_BUSY; /* room again, without the lock */
    while (tmax != 0 && t->prefix_bytes + need > tmax)
        kvs_pfx_evict_locked(data, kvs_pfx_lru_victim(pc, t->name));
    while (pc->bytes + need > pc->max_bytes)
        kvs_pfx_evict_locked(data, pc->lru_head);
    st = kvs_pool_alloc(data->pool, need, &b->hold_off);
    if (st == RI_ERR_NOSPACE && spill && pc->lru_head != NULL)
        return RI_ERR_BUSY; /* the LRU could give room back, written out without the lock */
    if (st == RI_ERR_NOSPACE && kvs_prefix_reclaim_locked(data, need) > 0)
        st = kvs_pool_alloc(data->pool, need, &b->hold_off);
    if (st != RI_OK)
        return st;
    b->charge = need;
    pc->blocks++;
    pc->bytes += need;
    t->prefix_bytes += need;
    return RI_OK;
}

/* Drop b from the catalog after its records failed verification: a miss
 * from now on, freed once nobody pins or references it.  Lock held. */
static void kvs_pfx_drop_corrupt_locked(kvs_data_t *data, kvs_pblock_t *b, ri_status_t st)
{
    cm_error("prefix: a spilled block of tenant %s failed verification (%s): dropped", b->tenant, ri_status_str(st));
    data->prefix.corrupt++;
    kvs_prefix_unlink_locked(data, b);
    if (b->pins == 0 && b->refs == 0)
        kvs_pfx_free_locked(data, b);
}

/* Install *tmp_p (b's bytes, read back) as b's memory: room made first,
 * written out without the lock (kvs_pfx_make_room_locked); a hold that
 * finds the room taken again (RI_ERR_BUSY) makes room once more, up to
 * KVS_PFX_HOLD_TRIES times in all, then answers RI_ERR_QUOTA (retryable).
 * b pinned, lock held, released for the writes.  *tmp_p becomes NULL once
 * consumed (installed, or discarded by a failed install); RI_OK with *tmp_p
 * left when b left the disk or the catalog meanwhile (the caller sees it). */
static ri_status_t kvs_pfx_readback_install_locked(kvs_data_t *data, kvs_pblock_t *b, const char *tenant,
                                                   kvs_pblock_t **tmp_p)
{
    ri_status_t st = RI_ERR_BUSY;

    for (unsigned i = 0; i < KVS_PFX_HOLD_TRIES && st == RI_ERR_BUSY; i++) {
        kvs_tenant_t *t;
        kvs_pfx_make_room_locked(data, tenant, kvs_pool_round(b->bytes));
        if (!b->in_catalog || !b->on_disk)
            return RI_OK;
        t = kvs_tenant_get_locked(data, tenant);
        if (t == NULL)
            return RI_ERR_NOMEM;
        st = kvs_prefix_install_locked(data, b, t, *tmp_p);
        if (st != RI_ERR_BUSY)
            *tmp_p = NULL;
    }
    return st == RI_ERR_BUSY ? RI_ERR_QUOTA : st;
}

/* Find tenant's block of key, reading it back when it is on disk.  The
 * read (disk I/O and a copy into a memory file) runs WITHOUT data->lock, so
 * it stalls no other session: the block is pinned meanwhile, so that a drop
 * frees it only after (the last unpin does), and another lane may read the
 * same block at the same time (the first back installs it; the other's copy
 * goes).  One whose records fail verification (or are missing) is dropped:
 * a miss, never served.  One that cannot be read back now (caps, memory,
 * I/O) stays on disk; NULL then too.  Lock held on entry and on return,
 * released in between. */
static kvs_pblock_t *kvs_pfx_find_resident_locked(kvs_data_t *data, const char *tenant, const uint8_t *key)
{
    kvs_pblock_t *b = kvs_prefix_find_locked(data, tenant, key), *tmp = NULL;
    bool mine = false;
    ri_status_t st;

    if (b == NULL || !b->on_disk)
        return b;
    if (!kvs_tier_on(data))
        return NULL;
    b->pins++;
    uint64_t disk_id = b->disk_id, bytes = b->bytes; /* fixed while on disk and pinned */
    pthread_mutex_unlock(&data->lock);
    st = kvs_prefix_read_back(data, disk_id, bytes, &tmp);
    pthread_mutex_lock(&data->lock);
    if (st == RI_OK && b->in_catalog && b->on_disk) { /* b stays pinned meanwhile */
        st = kvs_pfx_readback_install_locked(data, b, tenant, &tmp);
        mine = st == RI_OK && tmp == NULL;
    }
    b->pins--;
    if (mine) {
        if (b->refs == 0)
            kvs_pfx_lru_push(&data->prefix, b); /* resident again, the most recent */
        return b;
    }
    kvs_prefix_discard(tmp);
    if (!b->in_catalog) { /* dropped meanwhile: a miss */
        if (b->pins == 0 && b->refs == 0)
            kvs_pfx_free_locked(data, b);
        return NULL;
    }
    if (!b->on_disk) /* another lane read it back first (and forgot the records we read) */
        return b;
    if (st == RI_ERR_CORRUPT || st == RI_ERR_NOT_FOUND || st == RI_ERR_TRUNCATED || st == RI_ERR_PROTOCOL)
        kvs_pfx_drop_corrupt_locked(data, b, st);
    return NULL;
}

/* --- ops ----------------------------------------------------------------- */

ri_status_t kvs_prefix_attach(kvs_data_t *data, kvs_session_t *s, const cm_wire_hdr_t *hdr, const uint8_t *body,
                              uint8_t **reply_p, size_t *reply_len_p)
{
    const uint8_t *keys;
    cm_pfx_attached_t *ent;
    uint32_t n, flags = 0, n_att = 0;
    uint64_t mf;
    uint8_t *reply;
    ri_status_t st;

    if (hdr->data_len != 0)
        return RI_ERR_PROTOCOL;
    st = cm_pfx_attach_req_decode(body, hdr->meta_len, &n, &flags, &keys);
    if (st != RI_OK)
        return st;
    ent = cm_malloc(&kvs_prefix_tag, (size_t)n * sizeof(*ent));
    reply = cm_malloc(&kvs_prefix_tag, cm_pfx_attach_rep_size(n));
    if (ent == NULL || reply == NULL) {
        st = RI_ERR_NOMEM;
        goto out;
    }
    pthread_mutex_lock(&data->lock);
    if (flags & CM_PFX_ATTACH_F_SLOTS)
        s->pfx_slots_only = true;
    mf = kvs_prefix_mf_gen_locked(data);
    for (; n_att < n; n_att++) {
        kvs_pblock_t *b = kvs_pfx_find_resident_locked(data, s->tenant, keys + (size_t)n_att * CM_PFX_KEY_SIZE);
        if (b == NULL)
            break;
        st = kvs_pfx_attach_locked(data, s, b, &ent[n_att].slot);
        if (st != RI_OK)
            break;
        ent[n_att].n_tokens = b->n_tokens;
        ent[n_att].block_bytes = b->bytes;
    }
    /* A block that cannot be attached (another geometry, no memory) ends the
     * prefix like a miss; only a first key that fails so is an error. */
    if (n_att > 0)
        st = RI_OK;
    data->prefix.attach_hits += n_att;
    data->prefix.attach_misses += n - n_att;
    mf = kvs_prefix_mf_due_locked(data, mf);
    pthread_mutex_unlock(&data->lock);
    (void)kvs_prefix_mf_finish(data, mf); /* read back or dropped on disk: answered once that is durable */
    if (st != RI_OK)
        goto out;
    cm_pfx_attach_rep_encode(reply, n_att, ent);
    *reply_p = reply;
    *reply_len_p = cm_pfx_attach_rep_size(n_att);
    reply = NULL;
out:
    cm_free(ent);
    cm_free(reply);
    return st;
}

/* The key exists already: attach the stored block when its header and
 * tables equal the sent block's, else RI_ERR_EXISTS.  The header's CRC is
 * left out: it covers the pages too, which another worker's prefill of the
 * same tokens may round differently; equal tables are what makes the
 * stored block's clusters the ones the sender's index names.  Lock held. */
static ri_status_t kvs_pfx_put_existing_locked(kvs_data_t *data, kvs_session_t *s, kvs_pblock_t *b,
                                               const uint8_t *blk, const cm_pfx_view_t *v, uint32_t *slot_p)
{
    const uint32_t crc_at = 36; /* the header's u32 crc32c (cm_pfx_hdr_encode) */
    uint64_t cmp = CM_PFX_HDR_SIZE + v->hdr.tables_bytes;

    if (b->bytes < cmp || memcmp(b->base, blk, crc_at) != 0 ||
        memcmp(b->base + crc_at + 4, blk + crc_at + 4, cmp - crc_at - 4) != 0)
        return RI_ERR_EXISTS;
    return kvs_pfx_attach_locked(data, s, b, slot_p);
}

/* Check a PUT: meta, structure, CRC, geometry.  Lock not held. */
static ri_status_t kvs_pfx_put_check(const kvs_session_t *s, const cm_wire_hdr_t *hdr, const uint8_t *body,
                                     cm_pfx_view_t *v)
{
    const uint8_t *blk = body + CM_PFX_PUT_META;
    ri_status_t st;

    if (hdr->meta_len != CM_PFX_PUT_META)
        return hdr->meta_len < CM_PFX_PUT_META ? RI_ERR_TRUNCATED : RI_ERR_PROTOCOL;
    if (hdr->data_len > CM_PFX_MAX_BLOCK_BYTES)
        return RI_ERR_TOO_LARGE;
    st = cm_pfx_decode(blk, hdr->data_len, v);
    if (st != RI_OK)
        return st;
    if (cm_crc32c(0, blk + CM_PFX_HDR_SIZE, hdr->data_len - CM_PFX_HDR_SIZE) != v->hdr.crc)
        return RI_ERR_CORRUPT;
    return kvs_pfx_geometry_ok(s, &v->hdr) ? RI_OK : RI_ERR_INVALID;
}

/* Publish the new block nb under key for s's tenant and attach it; or, when
 * the key appeared meanwhile, treat it as existing (nb is released).  Lock
 * held; nb is consumed, except on RI_ERR_BUSY (the hold found no room: the
 * caller makes room and calls again). */
static ri_status_t kvs_pfx_publish_locked(kvs_data_t *data, kvs_session_t *s, const uint8_t *key, kvs_pblock_t *nb,
                                          const uint8_t *blk, const cm_pfx_view_t *v, uint32_t *slot_p,
                                          uint32_t *flags_p)
{
    kvs_pblock_t *b = kvs_pfx_find_resident_locked(data, s->tenant, key);
    kvs_tenant_t *t;
    ri_status_t st;

    if (b == NULL && kvs_prefix_find_locked(data, s->tenant, key) != NULL) {
        kvs_pfx_release(nb); /* on disk and not readable now: neither replaced nor attached */
        return RI_ERR_QUOTA;
    }
    if (b != NULL) {
        kvs_pfx_release(nb);
        *flags_p = CM_PFX_F_EXISTED;
        return kvs_pfx_put_existing_locked(data, s, b, blk, v, slot_p);
    }
    t = kvs_tenant_get_locked(data, s->tenant);
    if (t == NULL) {
        kvs_pfx_release(nb);
        return RI_ERR_NOMEM;
    }
    memcpy(nb->key, key, CM_PFX_KEY_SIZE);
    snprintf(nb->tenant, sizeof(nb->tenant), "%s", s->tenant);
    nb->n_tokens = v->hdr.n_tokens;
    nb->created_unix_ms = kvs_pfx_unix_ms();
    st = kvs_prefix_hold_locked(data, t, nb);
    if (st == RI_ERR_BUSY)
        return st; /* nb stays the caller's */
    if (st != RI_OK) {
        kvs_pfx_release(nb);
        return st;
    }
    kvs_prefix_insert_locked(data, nb);
    st = kvs_pfx_attach_locked(data, s, nb, slot_p);
    if (st != RI_OK) { /* unreferenced: nothing else saw it */
        kvs_prefix_unlink_locked(data, nb);
        kvs_pfx_free_locked(data, nb);
    }
    *flags_p = 0;
    return st;
}

/* Make room for nb (written out without the lock) and publish it; when
 * another lane took the room meanwhile, again, up to KVS_PFX_HOLD_TRIES
 * times in all, then RI_ERR_QUOTA (retryable).  Lock held, released for
 * the writes; nb is consumed. */
static ri_status_t kvs_pfx_publish_room_locked(kvs_data_t *data, kvs_session_t *s, const uint8_t *key,
                                               kvs_pblock_t *nb, const uint8_t *blk, const cm_pfx_view_t *v,
                                               uint32_t *slot_p, uint32_t *flags_p)
{
    for (unsigned i = 0; i < KVS_PFX_HOLD_TRIES; i++) {
        kvs_pfx_make_room_locked(data, s->tenant, kvs_pool_round(nb->bytes));
        ri_status_t st = kvs_pfx_publish_locked(data, s, key, nb, blk, v, slot_p, flags_p);
        if (st != RI_ERR_BUSY)
            return st;
    }
    kvs_pfx_release(nb);
    return RI_ERR_QUOTA;
}

ri_status_t kvs_prefix_put(kvs_data_t *data, kvs_session_t *s, const cm_wire_hdr_t *hdr, const uint8_t *body,
                           uint8_t **reply_p, size_t *reply_len_p)
{
    const uint8_t *key = body, *blk = body + CM_PFX_PUT_META;
    kvs_pblock_t *b, *nb = NULL;
    cm_pfx_view_t v;
    uint32_t slot = 0, flags = CM_PFX_F_EXISTED;
    uint64_t bytes = hdr->data_len, mf0, mf;
    uint8_t *reply;
    ri_status_t st = kvs_pfx_put_check(s, hdr, body, &v);

    if (st != RI_OK)
        goto count;
    reply = cm_malloc(&kvs_prefix_tag, CM_PFX_PUT_REPLY);
    if (reply == NULL)
        return RI_ERR_NOMEM;
    pthread_mutex_lock(&data->lock);
    mf0 = kvs_prefix_mf_gen_locked(data);
    b = kvs_pfx_find_resident_locked(data, s->tenant, key);
    if (b != NULL)
        st = kvs_pfx_put_existing_locked(data, s, b, blk, &v, &slot);
    mf = kvs_prefix_mf_due_locked(data, mf0);
    pthread_mutex_unlock(&data->lock);
    if (b == NULL) {
        st = kvs_prefix_make(blk, bytes, &nb); /* the copy runs without the lock */
        pthread_mutex_lock(&data->lock);
        if (st == RI_OK)
            st = kvs_pfx_publish_room_locked(data, s, key, nb, blk, &v, &slot, &flags);
        mf = kvs_prefix_mf_due_locked(data, mf0);
        pthread_mutex_unlock(&data->lock);
    }
    (void)kvs_prefix_mf_finish(data, mf); /* read back or dropped on disk: answered once that is durable */
    if (st != RI_OK) {
        cm_free(reply);
        goto count;
    }
    cm_pfx_put_rep_encode(reply, slot, flags, bytes);
    *reply_p = reply;
    *reply_len_p = CM_PFX_PUT_REPLY;
count:
    pthread_mutex_lock(&data->lock);
    if (st != RI_OK)
        data->prefix.put_refused++;
    else if (flags & CM_PFX_F_EXISTED)
        data->prefix.put_existed++;
    else
        data->prefix.put_new++;
    pthread_mutex_unlock(&data->lock);
    return st;
}

ri_status_t kvs_prefix_get(kvs_data_t *data, kvs_session_t *s, const cm_wire_hdr_t *hdr, const uint8_t *body,
                           kvs_reply_obj_t *reply)
{
    uint8_t meta[CM_PFX_GET_REPLY];
    const kvs_pblock_t *b = NULL;
    cm_pfx_get_t g;
    kvs_iov_t iov;
    ri_status_t st;

    if (hdr->data_len != 0)
        return RI_ERR_PROTOCOL;
    st = cm_pfx_get_decode(body, hdr->meta_len, &g);
    if (st != RI_OK)
        return st;
    /* The session's slots only grow, on this (its only) lane: b stays
     * referenced while the session, which the request holds, lives. */
    pthread_mutex_lock(&data->lock);
    if (g.slot < s->n_blocks)
        b = s->blocks[g.slot];
    pthread_mutex_unlock(&data->lock);
    if (b == NULL || g.offset > b->bytes)
        return RI_ERR_RANGE;
    if (g.length == 0)
        g.length = b->bytes - g.offset;
    if (g.length > b->bytes - g.offset)
        return RI_ERR_RANGE;
    cm_pfx_get_rep_encode(meta, b->bytes, g.offset);
    iov = (kvs_iov_t){b->base + g.offset, (size_t)g.length};
    st = kvs_reply_send(reply, RI_OK, meta, sizeof(meta), &iov, 1, g.length);
    if (st == RI_OK) {
        pthread_mutex_lock(&data->lock);
        data->bytes_sent += g.length;
        pthread_mutex_unlock(&data->lock);
    }
    return st;
}

ri_status_t kvs_prefix_handover_locked(kvs_session_t *s, uint32_t slot, int *fd_p, uint64_t *bytes_p)
{
    int fd;

    if (slot >= s->n_blocks)
        return RI_ERR_UNAUTHENTICATED; /* refused like every other miss */
    fd = fcntl(s->blocks[slot]->fd, F_DUPFD_CLOEXEC, 0);
    if (fd < 0)
        return RI_ERR_NOMEM;
    *fd_p = fd;
    *bytes_p = s->blocks[slot]->bytes;
    return RI_OK;
}

/* --- lifetime and metrics -------------------------------------------------- */

void kvs_prefix_init(kvs_data_t *data)
{
    uint64_t pool = kvs_pool_size(data->pool);

    data->prefix.max_bytes = data->cfg.prefix_max_bytes ? CM_MIN(data->cfg.prefix_max_bytes, pool) : pool / 4u;
    data->prefix.tenant_max_bytes = data->cfg.prefix_tenant_max_bytes;
}

void kvs_prefix_destroy(kvs_data_t *data)
{
    uint64_t kept = 0;

    for (uint32_t i = 0; i < KVS_PFX_BUCKETS; i++) {
        while (data->prefix.buckets[i] != NULL) {
            kvs_pblock_t *b = data->prefix.buckets[i];
            /* A clean stop writes resident blocks out too, so that
             * --recover finds them; what is on disk stays there. */
            if (kvs_tier_on(data) && !b->on_disk && b->refs == 0 && kvs_prefix_spill_locked(data, b) != RI_OK)
                cm_warn("shutdown: a prefix block of tenant %s did not reach the spill tier", b->tenant);
            kvs_prefix_unlink_locked(data, b);
            if (b->on_disk) {
                kept++;
                kvs_pfx_release(b); /* its records stay */
            } else if (b->refs == 0) {
                kvs_pfx_free_locked(data, b);
            }
        }
    }
    if (kept > 0)
        cm_info("shutdown: %" PRIu64 " prefix block(s) kept in the spill tier", kept);
}

void kvs_prefix_metrics_write_locked(kvs_data_t *data, FILE *out)
{
    const kvs_pcat_t *pc = &data->prefix;

    fprintf(out, "# HELP ri_kvs_prefix_blocks Prefix blocks held, by tier.\n# TYPE ri_kvs_prefix_blocks gauge\n"
                 "ri_kvs_prefix_blocks{tier=\"memory\"} %" PRIu64 "\nri_kvs_prefix_blocks{tier=\"disk\"} %" PRIu64 "\n"
                 "# HELP ri_kvs_prefix_bytes Bytes of the prefix blocks held, by tier (memory: pool units).\n"
                 "# TYPE ri_kvs_prefix_bytes gauge\nri_kvs_prefix_bytes{tier=\"memory\"} %" PRIu64 "\n"
                 "ri_kvs_prefix_bytes{tier=\"disk\"} %" PRIu64 "\n",
            pc->blocks, pc->disk_blocks, pc->bytes, pc->disk_bytes);
    fprintf(out, "# HELP ri_kvs_prefix_spills_total Prefix blocks written to the spill tier.\n"
                 "# TYPE ri_kvs_prefix_spills_total counter\nri_kvs_prefix_spills_total %" PRIu64 "\n"
                 "# HELP ri_kvs_prefix_readbacks_total Prefix blocks read back from the spill tier.\n"
                 "# TYPE ri_kvs_prefix_readbacks_total counter\nri_kvs_prefix_readbacks_total %" PRIu64 "\n"
                 "# HELP ri_kvs_prefix_corrupt_total Spilled prefix blocks that failed verification (dropped).\n"
                 "# TYPE ri_kvs_prefix_corrupt_total counter\nri_kvs_prefix_corrupt_total %" PRIu64 "\n"
                 "# HELP ri_kvs_prefix_spill_abandoned_total Prefix blocks written to the spill tier but kept: "
                 "attached or dropped during the write.\n"
                 "# TYPE ri_kvs_prefix_spill_abandoned_total counter\nri_kvs_prefix_spill_abandoned_total %" PRIu64 "\n",
            pc->spills, pc->readbacks, pc->corrupt, pc->spill_abandoned);
    fprintf(out, "# HELP ri_kvs_prefix_attach_keys_total Keys asked for in PREFIX_ATTACH, by outcome.\n"
                 "# TYPE ri_kvs_prefix_attach_keys_total counter\n"
                 "ri_kvs_prefix_attach_keys_total{outcome=\"hit\"} %" PRIu64 "\n"
                 "ri_kvs_prefix_attach_keys_total{outcome=\"miss\"} %" PRIu64 "\n"
                 "# HELP ri_kvs_prefix_tokens_attached_total Tokens of the blocks attached to sessions.\n"
                 "# TYPE ri_kvs_prefix_tokens_attached_total counter\n"
                 "ri_kvs_prefix_tokens_attached_total %" PRIu64 "\n",
            pc->attach_hits, pc->attach_misses, pc->tokens_attached);
    fprintf(out, "# HELP ri_kvs_prefix_publishes_total PREFIX_PUT requests, by outcome.\n"
                 "# TYPE ri_kvs_prefix_publishes_total counter\n"
                 "ri_kvs_prefix_publishes_total{outcome=\"new\"} %" PRIu64 "\n"
                 "ri_kvs_prefix_publishes_total{outcome=\"existing\"} %" PRIu64 "\n"
                 "ri_kvs_prefix_publishes_total{outcome=\"refused\"} %" PRIu64 "\n"
                 "# HELP ri_kvs_prefix_evictions_total Unreferenced prefix blocks evicted (caps, pool pressure).\n"
                 "# TYPE ri_kvs_prefix_evictions_total counter\nri_kvs_prefix_evictions_total %" PRIu64 "\n"
                 "# HELP ri_kvs_prefix_dropped_total Prefix blocks dropped by DropPrefix.\n"
                 "# TYPE ri_kvs_prefix_dropped_total counter\nri_kvs_prefix_dropped_total %" PRIu64 "\n",
            pc->put_new, pc->put_existed, pc->put_refused, pc->evictions, pc->dropped);
}

/* --- control side (kvs_data.h) --------------------------------------------- */

ri_status_t kvs_data_prefix_lookup(kvs_data_t *data, const char *tenant, const uint8_t *keys, size_t n,
                                   uint32_t *cached_p, uint64_t *tokens_p)
{
    uint32_t cached = 0;
    uint64_t tokens = 0;

    if (data == NULL || tenant == NULL || (keys == NULL && n > 0) || n > CM_PFX_MAX_KEYS || cached_p == NULL ||
        tokens_p == NULL)
        return RI_ERR_INVALID;
    pthread_mutex_lock(&data->lock);
    for (; cached < n; cached++) {
        const kvs_pblock_t *b = kvs_prefix_find_locked(data, tenant, keys + (size_t)cached * CM_PFX_KEY_SIZE);
        if (b == NULL)
            break;
        tokens += b->n_tokens;
    }
    pthread_mutex_unlock(&data->lock);
    *cached_p = cached;
    *tokens_p = tokens;
    return RI_OK;
}

static void kvs_pfx_info_fill(const kvs_pblock_t *b, kvs_prefix_info_t *info)
{
    memcpy(info->key, b->key, CM_PFX_KEY_SIZE);
    snprintf(info->tenant, sizeof(info->tenant), "%s", b->tenant);
    info->bytes = b->bytes;
    info->tokens = b->n_tokens;
    info->refs = b->refs;
    info->created_unix_ms = b->created_unix_ms;
    info->on_disk = b->on_disk;
}

ri_status_t kvs_data_prefix_list(kvs_data_t *data, const char *tenant, kvs_prefix_info_t **infos_p, size_t *n_p)
{
    kvs_prefix_info_t *infos = NULL;
    size_t n = 0, cap = 0;
    ri_status_t st = RI_OK;

    if (data == NULL || infos_p == NULL || n_p == NULL)
        return RI_ERR_INVALID;
    pthread_mutex_lock(&data->lock);
    for (uint32_t i = 0; i < KVS_PFX_BUCKETS && st == RI_OK; i++) {
        for (const kvs_pblock_t *b = data->prefix.buckets[i]; b != NULL; b = b->hnext) {
            if (tenant != NULL && strcmp(b->tenant, tenant) != 0)
                continue;
            if (n == cap) {
                size_t nc = cap ? 2u * cap : 16u;
                kvs_prefix_info_t *ni = cm_realloc(&kvs_prefix_tag, infos, nc * sizeof(*ni));
                if (ni == NULL) {
                    st = RI_ERR_NOMEM;
                    break;
                }
                infos = ni;
                cap = nc;
            }
            kvs_pfx_info_fill(b, &infos[n++]);
        }
    }
    pthread_mutex_unlock(&data->lock);
    if (st != RI_OK) {
        cm_free(infos);
        return st;
    }
    *infos_p = infos;
    *n_p = n;
    return RI_OK;
}

void kvs_data_set_prefix_hook(kvs_data_t *data, kvs_prefix_hook_fn_t fn, void *arg)
{
    if (data == NULL)
        return;
    pthread_mutex_lock(&data->lock);
    data->prefix.hook = fn;
    data->prefix.hook_arg = fn != NULL ? arg : NULL;
    for (uint32_t i = 0; fn != NULL && i < KVS_PFX_BUCKETS; i++)
        for (const kvs_pblock_t *b = data->prefix.buckets[i]; b != NULL; b = b->hnext)
            fn(arg, b->key, true);
    pthread_mutex_unlock(&data->lock);
}

ri_status_t kvs_data_prefix_drop(kvs_data_t *data, const char *tenant, const uint8_t key[KVS_PFX_KEY],
                                 uint32_t *n_p, uint64_t *bytes_p)
{
    uint32_t dropped = 0;
    uint64_t freed = 0, mf;

    if (data == NULL || key == NULL)
        return RI_ERR_INVALID;
    pthread_mutex_lock(&data->lock);
    mf = kvs_prefix_mf_gen_locked(data);
    for (uint32_t i = 0; i < KVS_PFX_BUCKETS; i++) {
        kvs_pblock_t *b = data->prefix.buckets[i], *next;
        for (; b != NULL; b = next) {
            next = b->hnext;
            if (memcmp(b->key, key, CM_PFX_KEY_SIZE) != 0 || (tenant != NULL && strcmp(b->tenant, tenant) != 0))
                continue;
            kvs_prefix_unlink_locked(data, b);
            dropped++;
            data->prefix.dropped++;
            if (b->refs == 0 && b->pins == 0) {
                freed += b->charge;
                kvs_pfx_free_locked(data, b);
            } /* else: freed at its last detach or unpin */
        }
        if (tenant != NULL && dropped > 0)
            break; /* one tenant holds a key once */
    }
    mf = kvs_prefix_mf_due_locked(data, mf);
    pthread_mutex_unlock(&data->lock);
    (void)kvs_prefix_mf_finish(data, mf); /* a block on disk: answered once it cannot come back */
    if (n_p != NULL)
        *n_p = dropped;
    if (bytes_p != NULL)
        *bytes_p = freed;
    return dropped > 0 ? RI_OK : RI_ERR_NOT_FOUND;
}
