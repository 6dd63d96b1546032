/*
 * Cache directory + LRU (see kvs_cache.h for the decision rule).  Entries live
 * in a fixed array (a cluster takes at least one page, so capacity entries are
 * enough), found through an open-addressing hash of keys, chained in a doubly
 * linked LRU list; each cache page records the next page of its cluster; free
 * pages are a bitmap searched from the lowest word that may hold a free bit.
 */
#include "kvstore/data/kvs_cache.h"

#include <stdlib.h>
#include <string.h>

#include "common/cm_alloc.h"
#include "common/cm_status.h"

#define KVS_NIL UINT32_MAX
#define KVS_CACHE_MAX_PAGES (1u << 26)

static CM_ALLOC_TAG(kvs_cache_tag, "kvs.cache");

typedef struct kvs_centry {
    uint64_t key;         /* (layer, head, cluster) */
    uint64_t touched;     /* epoch of the last fetch that used it */
    uint32_t first_page;  /* first cache page; the rest via page_next */
    uint32_t n_pages;     /* pages held */
    uint32_t prev, next;  /* LRU list (prev = more recent); free list uses next */
} kvs_centry_t;

struct kvs_cache {
    uint32_t capacity;          /* pages */
    uint32_t free_pages;        /* pages not held by any cluster */
    uint64_t *free_bits;        /* bit set = page free */
    uint32_t n_words;           /* words in free_bits */
    uint32_t word_hint;         /* no free bit below this word */
    uint32_t *page_next;        /* next page of the same cluster, KVS_NIL at end */
    kvs_centry_t *entries;      /* capacity entries */
    uint32_t free_entry;        /* free list head */
    uint32_t mru, lru;          /* LRU list ends */
    size_t n_clusters;          /* entries in use */
    uint32_t *slots;            /* hash: entry index + 1, 0 = empty */
    uint32_t slot_mask;         /* hash size - 1 */
    uint64_t epoch;             /* fetch counter for `touched` */
    kvs_cache_counters_t ctr;   /* counters */
};

static uint32_t kvs_cache_hash(uint64_t key)
{
    key ^= key >> 33;
    key *= UINT64_C(0xff51afd7ed558ccd);
    key ^= key >> 33;
    return (uint32_t)key;
}

size_t kvs_cache_bytes_for(uint32_t capacity)
{
    size_t slots = 2;
    while (slots < 2 * (size_t)capacity)
        slots <<= 1;
    return sizeof(kvs_cache_t) + ((size_t)capacity + 63) / 64 * sizeof(uint64_t) +
           (size_t)capacity * (sizeof(uint32_t) + sizeof(kvs_centry_t)) + slots * sizeof(uint32_t);
}

ri_status_t kvs_cache_create(uint32_t capacity, kvs_cache_t **cache_p)
{
    kvs_cache_t *c;
    uint32_t slots = 2;

    if (capacity == 0 || capacity > KVS_CACHE_MAX_PAGES || cache_p == NULL)
        return RI_ERR_INVALID;
    while (slots < 2 * capacity)
        slots <<= 1;
    c = cm_calloc(&kvs_cache_tag, 1, sizeof(*c));
    if (c == NULL)
        return RI_ERR_NOMEM;
    c->capacity = capacity;
    c->n_words = (capacity + 63) / 64;
    c->free_bits = cm_calloc(&kvs_cache_tag, c->n_words, sizeof(uint64_t));
    c->page_next = cm_calloc(&kvs_cache_tag, capacity, sizeof(uint32_t));
    c->entries = cm_calloc(&kvs_cache_tag, capacity, sizeof(kvs_centry_t));
    c->slots = cm_calloc(&kvs_cache_tag, slots, sizeof(uint32_t));
    if (c->free_bits == NULL || c->page_next == NULL || c->entries == NULL || c->slots == NULL) {
        kvs_cache_destroy(c);
        return RI_ERR_NOMEM;
    }
    c->slot_mask = slots - 1;
    for (uint32_t p = 0; p < capacity; p++)
        c->free_bits[p / 64] |= UINT64_C(1) << (p % 64);
    c->free_pages = capacity;
    for (uint32_t e = 0; e < capacity; e++)
        c->entries[e].next = e + 1 < capacity ? e + 1 : KVS_NIL;
    c->free_entry = 0;
    c->mru = c->lru = KVS_NIL;
    *cache_p = c;
    return RI_OK;
}

void kvs_cache_destroy(kvs_cache_t *cache)
{
    if (cache == NULL)
        return;
    cm_free(cache->free_bits);
    cm_free(cache->page_next);
    cm_free(cache->entries);
    cm_free(cache->slots);
    cm_free(cache);
}

/* Slot holding key, or the empty slot where it would go. */
static uint32_t kvs_cache_slot(const kvs_cache_t *c, uint64_t key)
{
    uint32_t s = kvs_cache_hash(key) & c->slot_mask;
    while (c->slots[s] != 0 && c->entries[c->slots[s] - 1].key != key)
        s = (s + 1) & c->slot_mask;
    return s;
}

static uint32_t kvs_cache_find(const kvs_cache_t *c, uint64_t key)
{
    uint32_t s = kvs_cache_slot(c, key);
    return c->slots[s] ? c->slots[s] - 1 : KVS_NIL;
}

/* Remove key's slot with backward-shift deletion (keeps probe chains whole). */
static void kvs_cache_unhash(kvs_cache_t *c, uint64_t key)
{
    uint32_t i = kvs_cache_slot(c, key), j = i;

    c->slots[i] = 0;
    for (;;) {
        j = (j + 1) & c->slot_mask;
        if (c->slots[j] == 0)
            return;
        uint32_t home = kvs_cache_hash(c->entries[c->slots[j] - 1].key) & c->slot_mask;
        /* Move j into the hole at i unless its home lies cyclically in (i, j]. */
        bool in_range = (i <= j) ? (home > i && home <= j) : (home > i || home <= j);
        if (!in_range) {
            c->slots[i] = c->slots[j];
            c->slots[j] = 0;
            i = j;
        }
    }
}

static void kvs_cache_lru_unlink(kvs_cache_t *c, uint32_t e)
{
    kvs_centry_t *x = &c->entries[e];
    if (x->prev != KVS_NIL)
        c->entries[x->prev].next = x->next;
    else
        c->mru = x->next;
    if (x->next != KVS_NIL)
        c->entries[x->next].prev = x->prev;
    else
        c->lru = x->prev;
}

static void kvs_cache_lru_push(kvs_cache_t *c, uint32_t e)
{
    kvs_centry_t *x = &c->entries[e];
    x->prev = KVS_NIL;
    x->next = c->mru;
    if (c->mru != KVS_NIL)
        c->entries[c->mru].prev = e;
    c->mru = e;
    if (c->lru == KVS_NIL)
        c->lru = e;
}

static uint32_t kvs_cache_page_take(kvs_cache_t *c)
{
    for (uint32_t w = c->word_hint; w < c->n_words; w++) {
        if (c->free_bits[w] != 0) {
            uint32_t b = (uint32_t)__builtin_ctzll(c->free_bits[w]);
            c->free_bits[w] &= ~(UINT64_C(1) << b);
            c->word_hint = w;
            c->free_pages--;
            return w * 64 + b;
        }
    }
    return KVS_NIL; /* unreachable: callers check free_pages first */
}

static void kvs_cache_page_give(kvs_cache_t *c, uint32_t p)
{
    c->free_bits[p / 64] |= UINT64_C(1) << (p % 64);
    if (p / 64 < c->word_hint)
        c->word_hint = p / 64;
    c->free_pages++;
}

static void kvs_cache_evict(kvs_cache_t *c, uint32_t e)
{
    kvs_centry_t *x = &c->entries[e];
    uint32_t p = x->first_page;

    kvs_cache_lru_unlink(c, e);
    kvs_cache_unhash(c, x->key);
    while (p != KVS_NIL) {
        uint32_t nx = c->page_next[p];
        kvs_cache_page_give(c, p);
        p = nx;
    }
    x->next = c->free_entry;
    c->free_entry = e;
    c->n_clusters--;
    c->ctr.evicted++;
}

static void kvs_cache_write_pages(const kvs_cache_t *c, uint32_t e, uint32_t *out)
{
    uint32_t p = c->entries[e].first_page;
    for (uint32_t i = 0; p != KVS_NIL; i++, p = c->page_next[p])
        out[i] = p;
}

static int kvs_cache_cmp_u64(const void *a, const void *b)
{
    uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
    return x < y ? -1 : x > y;
}

static ri_status_t kvs_cache_check_distinct(const kvs_cache_req_t *reqs, size_t n)
{
    uint64_t *keys;
    ri_status_t st = RI_OK;

    if (n < 2)
        return RI_OK;
    keys = cm_malloc(&kvs_cache_tag, n * sizeof(uint64_t));
    if (keys == NULL)
        return RI_ERR_NOMEM;
    for (size_t i = 0; i < n; i++)
        keys[i] = reqs[i].key;
    qsort(keys, n, sizeof(uint64_t), kvs_cache_cmp_u64);
    for (size_t i = 1; i < n && st == RI_OK; i++)
        if (keys[i] == keys[i - 1])
            st = RI_ERR_INVALID;
    cm_free(keys);
    return st;
}

ri_status_t kvs_cache_fetch(kvs_cache_t *c, kvs_cache_req_t *reqs, size_t n, uint32_t *pages_out,
                            uint64_t *evicted_out, size_t max_evicted, size_t *n_evicted_p)
{
    size_t n_ev = 0;
    uint32_t cursor = 0, touched_pages = 0;
    bool admitting = true;
    ri_status_t st;

    if (max_evicted < c->n_clusters)
        return RI_ERR_RANGE;
    for (size_t i = 0; i < n; i++)
        if (reqs[i].pages == 0)
            return RI_ERR_INVALID;
    st = kvs_cache_check_distinct(reqs, n);
    if (st != RI_OK)
        return st;

    /* Pass 1 is implicit: a lookup does not change anything.  Pass 2: hits. */
    c->epoch++;
    for (size_t i = 0; i < n; i++) {
        uint32_t e = kvs_cache_find(c, reqs[i].key);
        reqs[i].hit = e != KVS_NIL;
        reqs[i].admitted = false;
        reqs[i].first_page = 0;
        if (!reqs[i].hit)
            continue;
        kvs_cache_lru_unlink(c, e);
        kvs_cache_lru_push(c, e);
        c->entries[e].touched = c->epoch;
        reqs[i].first_page = cursor;
        kvs_cache_write_pages(c, e, pages_out + cursor);
        cursor += c->entries[e].n_pages;
        touched_pages += c->entries[e].n_pages;
        c->ctr.hits++;
    }
    /* Misses, in request order, while they fit. */
    for (size_t i = 0; i < n; i++) {
        uint32_t need = reqs[i].pages, e, prev = KVS_NIL;
        if (reqs[i].hit)
            continue;
        c->ctr.misses++;
        if (!admitting)
            continue;
        /* Pages not used by this fetch can all be freed; if that is not
         * enough, evicting would only destroy useful entries. */
        if (need > c->capacity - touched_pages) {
            admitting = false;
            continue;
        }
        while (c->free_pages < need) {
            evicted_out[n_ev++] = c->entries[c->lru].key;
            kvs_cache_evict(c, c->lru);
        }
        e = c->free_entry;
        c->free_entry = c->entries[e].next;
        c->entries[e].key = reqs[i].key;
        c->entries[e].n_pages = need;
        c->entries[e].touched = c->epoch;
        for (uint32_t k = 0; k < need; k++) {
            uint32_t p = kvs_cache_page_take(c);
            c->page_next[p] = KVS_NIL;
            if (prev == KVS_NIL)
                c->entries[e].first_page = p;
            else
                c->page_next[prev] = p;
            prev = p;
        }
        c->slots[kvs_cache_slot(c, reqs[i].key)] = e + 1;
        kvs_cache_lru_push(c, e);
        c->n_clusters++;
        reqs[i].admitted = true;
        reqs[i].first_page = cursor;
        kvs_cache_write_pages(c, e, pages_out + cursor);
        cursor += need;
        touched_pages += need;
        c->ctr.admitted++;
    }
    c->ctr.fetches++;
    *n_evicted_p = n_ev;
    return RI_OK;
}

bool kvs_cache_contains(const kvs_cache_t *cache, uint64_t key)
{
    return kvs_cache_find(cache, key) != KVS_NIL;
}

size_t kvs_cache_clusters(const kvs_cache_t *cache)
{
    return cache->n_clusters;
}

uint32_t kvs_cache_free_pages(const kvs_cache_t *cache)
{
    return cache->free_pages;
}

uint32_t kvs_cache_capacity(const kvs_cache_t *cache)
{
    return cache->capacity;
}

void kvs_cache_counters(const kvs_cache_t *cache, kvs_cache_counters_t *c_p)
{
    *c_p = cache->ctr;
}
