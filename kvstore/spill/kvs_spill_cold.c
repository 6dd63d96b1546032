/*
 * Least-recently-fetched tracker with pins (see kvs_spill_cold.h): a hash of
 * keys to nodes and a doubly linked list, head = coldest.  Nodes live in one
 * growable array and link by index.
 */
#include "kvstore/spill/kvs_spill_cold.h"

#include <pthread.h>
#include <string.h>

#include "common/cm_alloc.h"

static CM_ALLOC_TAG(kvs_cold_tag, "kvs.spill.cold");

typedef struct cold_node {
    kvs_spill_key_t key;   /* identity */
    uint64_t bytes;        /* pool bytes */
    uint32_t pins;         /* in-flight fetches */
    int32_t prev, next;    /* LRU list (head = coldest) */
    int32_t hnext;         /* hash chain or free list */
    int used;              /* slot in use */
} cold_node_t;

struct kvs_spill_cold {
    pthread_mutex_t mu;    /* guards everything below */
    cold_node_t *nodes;    /* slots */
    uint32_t cap;          /* slots allocated */
    int32_t free_head;     /* free list */
    int32_t *buckets;      /* hash heads */
    uint32_t n_buckets;    /* power of two */
    size_t count;          /* tracked */
    int32_t head, tail;    /* coldest, hottest */
};

static uint32_t hash(const kvs_spill_cold_t *c, const kvs_spill_key_t *k)
{
    uint64_t h = k->session * 0x9E3779B97F4A7C15ull ^ ((uint64_t)k->layer << 42) ^ ((uint64_t)k->head << 21) ^
                 k->cluster;
    h ^= h >> 33;
    h *= 0xFF51AFD7ED558CCDull;
    h ^= h >> 33;
    return (uint32_t)(h & (c->n_buckets - 1));
}

static int key_eq(const kvs_spill_key_t *a, const kvs_spill_key_t *b)
{
    return a->session == b->session && a->layer == b->layer && a->head == b->head && a->cluster == b->cluster;
}

ri_status_t kvs_spill_cold_create(kvs_spill_cold_t **cold_p)
{
    kvs_spill_cold_t *c = cm_calloc(&kvs_cold_tag, 1, sizeof(*c));
    if (c == NULL)
        return RI_ERR_NOMEM;
    c->n_buckets = 1024;
    c->buckets = cm_malloc(&kvs_cold_tag, c->n_buckets * sizeof(*c->buckets));
    if (c->buckets == NULL) {
        cm_free(c);
        return RI_ERR_NOMEM;
    }
    for (uint32_t i = 0; i < c->n_buckets; i++)
        c->buckets[i] = -1;
    c->free_head = c->head = c->tail = -1;
    pthread_mutex_init(&c->mu, NULL);
    *cold_p = c;
    return RI_OK;
}

void kvs_spill_cold_destroy(kvs_spill_cold_t *cold)
{
    if (cold == NULL)
        return;
    pthread_mutex_destroy(&cold->mu);
    cm_free(cold->buckets);
    cm_free(cold->nodes);
    cm_free(cold);
}

static int32_t find(kvs_spill_cold_t *c, const kvs_spill_key_t *k)
{
    for (int32_t i = c->buckets[hash(c, k)]; i >= 0; i = c->nodes[i].hnext)
        if (key_eq(&c->nodes[i].key, k))
            return i;
    return -1;
}

static void list_unlink(kvs_spill_cold_t *c, int32_t i)
{
    cold_node_t *n = &c->nodes[i];
    if (n->prev >= 0)
        c->nodes[n->prev].next = n->next;
    else
        c->head = n->next;
    if (n->next >= 0)
        c->nodes[n->next].prev = n->prev;
    else
        c->tail = n->prev;
}

static void list_push_tail(kvs_spill_cold_t *c, int32_t i)
{
    cold_node_t *n = &c->nodes[i];
    n->prev = c->tail;
    n->next = -1;
    if (c->tail >= 0)
        c->nodes[c->tail].next = i;
    else
        c->head = i;
    c->tail = i;
}

static ri_status_t grow(kvs_spill_cold_t *c)
{
    uint32_t cap = c->cap ? c->cap * 2 : 1024;
    cold_node_t *n = cm_realloc(&kvs_cold_tag, c->nodes, (size_t)cap * sizeof(*n));
    if (n == NULL)
        return RI_ERR_NOMEM;
    memset(n + c->cap, 0, (size_t)(cap - c->cap) * sizeof(*n));
    for (uint32_t i = cap; i-- > c->cap;) {
        n[i].hnext = c->free_head;
        c->free_head = (int32_t)i;
    }
    c->nodes = n;
    c->cap = cap;
    /* Rehash into twice the buckets when the table gets full. */
    if (c->count + 1 > c->n_buckets) {
        uint32_t nb = c->n_buckets * 2;
        int32_t *b = cm_malloc(&kvs_cold_tag, nb * sizeof(*b));
        if (b == NULL)
            return RI_OK;   /* longer chains, still correct */
        for (uint32_t i = 0; i < nb; i++)
            b[i] = -1;
        cm_free(c->buckets);
        c->buckets = b;
        c->n_buckets = nb;
        for (uint32_t i = 0; i < c->cap; i++) {
            if (!c->nodes[i].used)
                continue;
            uint32_t h = hash(c, &c->nodes[i].key);
            c->nodes[i].hnext = b[h];
            b[h] = (int32_t)i;
        }
    }
    return RI_OK;
}

ri_status_t kvs_spill_cold_touch(kvs_spill_cold_t *cold, const kvs_spill_key_t *key, uint64_t bytes)
{
    ri_status_t st = RI_OK;
    pthread_mutex_lock(&cold->mu);
    int32_t i = find(cold, key);
    if (i >= 0) {
        list_unlink(cold, i);
        cold->nodes[i].bytes = bytes;
        list_push_tail(cold, i);
        goto out;
    }
    if (cold->free_head < 0 && (st = grow(cold)) != RI_OK)
        goto out;
    i = cold->free_head;
    cold_node_t *n = &cold->nodes[i];
    cold->free_head = n->hnext;
    memset(n, 0, sizeof(*n));
    n->key = *key;
    n->bytes = bytes;
    n->used = 1;
    uint32_t h = hash(cold, key);
    n->hnext = cold->buckets[h];
    cold->buckets[h] = i;
    list_push_tail(cold, i);
    cold->count++;
out:
    pthread_mutex_unlock(&cold->mu);
    return st;
}

static void remove_at(kvs_spill_cold_t *c, int32_t i)
{
    cold_node_t *n = &c->nodes[i];
    int32_t *pp = &c->buckets[hash(c, &n->key)];
    while (*pp != i)
        pp = &c->nodes[*pp].hnext;
    *pp = n->hnext;
    list_unlink(c, i);
    memset(n, 0, sizeof(*n));
    n->hnext = c->free_head;
    c->free_head = i;
    c->count--;
}

void kvs_spill_cold_remove(kvs_spill_cold_t *cold, const kvs_spill_key_t *key)
{
    pthread_mutex_lock(&cold->mu);
    int32_t i = find(cold, key);
    if (i >= 0)
        remove_at(cold, i);
    pthread_mutex_unlock(&cold->mu);
}

size_t kvs_spill_cold_drop_session(kvs_spill_cold_t *cold, uint64_t session)
{
    size_t n = 0;
    pthread_mutex_lock(&cold->mu);
    for (uint32_t i = 0; i < cold->cap; i++) {
        if (cold->nodes[i].used && cold->nodes[i].key.session == session) {
            remove_at(cold, (int32_t)i);
            n++;
        }
    }
    pthread_mutex_unlock(&cold->mu);
    return n;
}

ri_status_t kvs_spill_cold_pin(kvs_spill_cold_t *cold, const kvs_spill_key_t *key)
{
    pthread_mutex_lock(&cold->mu);
    int32_t i = find(cold, key);
    if (i >= 0)
        cold->nodes[i].pins++;
    pthread_mutex_unlock(&cold->mu);
    return i >= 0 ? RI_OK : RI_ERR_NOT_FOUND;
}

void kvs_spill_cold_unpin(kvs_spill_cold_t *cold, const kvs_spill_key_t *key)
{
    pthread_mutex_lock(&cold->mu);
    int32_t i = find(cold, key);
    if (i >= 0 && cold->nodes[i].pins > 0)
        cold->nodes[i].pins--;
    pthread_mutex_unlock(&cold->mu);
}

size_t kvs_spill_cold_pick(kvs_spill_cold_t *cold, size_t max_n, uint64_t max_bytes, kvs_spill_key_t *keys_p)
{
    size_t n = 0;
    uint64_t bytes = 0;
    pthread_mutex_lock(&cold->mu);
    for (int32_t i = cold->head; i >= 0 && n < max_n; i = cold->nodes[i].next) {
        if (max_bytes != 0 && bytes >= max_bytes)
            break;
        if (cold->nodes[i].pins > 0)
            continue;
        keys_p[n++] = cold->nodes[i].key;
        bytes += cold->nodes[i].bytes;
    }
    pthread_mutex_unlock(&cold->mu);
    return n;
}

size_t kvs_spill_cold_count(kvs_spill_cold_t *cold)
{
    pthread_mutex_lock(&cold->mu);
    size_t n = cold->count;
    pthread_mutex_unlock(&cold->mu);
    return n;
}
