/*
 * Property test of the cache directory + LRU (kvstore/data/kvs_cache.c)
 * against a plain reference model written from the rule in kvs_cache.h:
 * random fetch sequences with random cluster sizes and capacities; after each
 * fetch every hit/miss/admission, page number and eviction must agree, and
 * the directory's invariants (free pages + held pages = capacity, no page
 * held twice) must hold.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <stdio.h>
#include <cmocka.h>

#include "kvstore/data/kvs_cache.h"

#define MAXCAP 64
#define KEYS 48
#define MAXREQ 12

typedef struct ref_ent {
    uint64_t key;
    uint32_t n, pages[MAXCAP];
} ref_ent_t;

typedef struct ref {
    uint32_t cap;
    ref_ent_t lru[MAXCAP];  /* [0] most recent */
    int n;
    int free_[MAXCAP];
} ref_t;

static int ref_find(const ref_t *r, uint64_t key)
{
    for (int i = 0; i < r->n; i++)
        if (r->lru[i].key == key)
            return i;
    return -1;
}

typedef struct ref_out {
    int hit, admitted;
    uint32_t pages[MAXCAP];
} ref_out_t;

static int ref_fetch(ref_t *r, const uint64_t *keys, const uint32_t *need, int n, ref_out_t *out, uint64_t *ev)
{
    int touched = 0, n_ev = 0, admitting = 1;
    uint32_t touched_pages = 0;

    for (int i = 0; i < n; i++) {
        int m = ref_find(r, keys[i]);
        out[i].hit = m >= 0;
        out[i].admitted = 0;
        if (m >= 0) {
            ref_ent_t e = r->lru[m];
            memcpy(out[i].pages, e.pages, sizeof(e.pages));
            memmove(&r->lru[1], &r->lru[0], (size_t)m * sizeof(ref_ent_t));
            r->lru[0] = e;
            touched++;
            touched_pages += e.n;
        }
    }
    for (int i = 0; i < n; i++) {
        uint32_t nfree = 0;
        if (out[i].hit || !admitting)
            continue;
        if (need[i] + touched_pages > r->cap) {
            admitting = 0;
            continue;
        }
        for (uint32_t p = 0; p < r->cap; p++)
            nfree += (uint32_t)r->free_[p];
        while (nfree < need[i] && r->n > touched) {
            ref_ent_t *v = &r->lru[r->n - 1];
            for (uint32_t p = 0; p < v->n; p++)
                r->free_[v->pages[p]] = 1;
            nfree += v->n;
            ev[n_ev++] = v->key;
            r->n--;
        }
        if (nfree < need[i]) {
            admitting = 0;
            continue;
        }
        ref_ent_t e = {.key = keys[i], .n = need[i]};
        for (uint32_t p = 0, got = 0; got < need[i]; p++)
            if (r->free_[p]) {
                r->free_[p] = 0;
                e.pages[got++] = p;
            }
        memmove(&r->lru[1], &r->lru[0], (size_t)r->n * sizeof(ref_ent_t));
        r->lru[0] = e;
        r->n++;
        touched++;
        touched_pages += need[i];
        out[i].admitted = 1;
        memcpy(out[i].pages, e.pages, sizeof(e.pages));
    }
    return n_ev;
}

static void run_sequence(uint32_t cap, int steps)
{
    kvs_cache_t *c;
    ref_t r = {.cap = cap};
    uint32_t size_of[KEYS];
    kvs_cache_counters_t ctr;
    uint64_t hits = 0, misses = 0;

    for (uint32_t p = 0; p < cap; p++)
        r.free_[p] = 1;
    for (int k = 0; k < KEYS; k++)
        size_of[k] = 1 + (uint32_t)(rand() % 5); /* a cluster keeps its size */
    assert_int_equal(kvs_cache_create(cap, &c), RI_OK);
    for (int s = 0; s < steps; s++) {
        int n = 1 + rand() % MAXREQ;
        uint64_t keys[MAXREQ], ev_ref[MAXCAP], ev[MAXCAP];
        uint32_t need[MAXREQ], pages[MAXREQ * 8];
        kvs_cache_req_t req[MAXREQ];
        ref_out_t out[MAXREQ];
        size_t n_ev;
        int n_ev_ref;

        for (int i = 0; i < n; i++) {
            int k, dup;
            do {
                k = rand() % KEYS;
                dup = 0;
                for (int j = 0; j < i; j++)
                    dup |= keys[j] == kvs_cache_key((uint32_t)k % 3, (uint32_t)k % 2, (uint32_t)k);
            } while (dup);
            keys[i] = kvs_cache_key((uint32_t)k % 3, (uint32_t)k % 2, (uint32_t)k);
            need[i] = size_of[k];
            req[i] = (kvs_cache_req_t){.key = keys[i], .pages = need[i]};
        }
        n_ev_ref = ref_fetch(&r, keys, need, n, out, ev_ref);
        assert_int_equal(kvs_cache_fetch(c, req, (size_t)n, pages, ev, MAXCAP, &n_ev), RI_OK);
        assert_int_equal((int)n_ev, n_ev_ref);
        for (size_t e = 0; e < n_ev; e++) {
            assert_int_equal(ev[e], ev_ref[e]);
            assert_false(kvs_cache_contains(c, ev[e]) && ref_find(&r, ev[e]) < 0);
        }
        for (int i = 0; i < n; i++) {
            assert_int_equal(req[i].hit, out[i].hit);
            assert_int_equal(req[i].admitted, out[i].admitted);
            hits += (uint64_t)out[i].hit;
            misses += (uint64_t)!out[i].hit;
            if (out[i].hit || out[i].admitted)
                for (uint32_t p = 0; p < need[i]; p++)
                    assert_int_equal(pages[req[i].first_page + p], out[i].pages[p]);
        }
        /* invariants: same set of clusters, pages add up */
        uint32_t held = 0;
        assert_int_equal(kvs_cache_clusters(c), (size_t)r.n);
        for (int i = 0; i < r.n; i++) {
            assert_true(kvs_cache_contains(c, r.lru[i].key));
            held += r.lru[i].n;
        }
        assert_int_equal(kvs_cache_free_pages(c) + held, cap);
    }
    kvs_cache_counters(c, &ctr);
    assert_int_equal(ctr.hits, hits);
    assert_int_equal(ctr.misses, misses);
    kvs_cache_destroy(c);
}

static void test_cache_property(void **state)
{
    unsigned seed = (unsigned)time(NULL);
    (void)state;
    fprintf(stderr, "seed %u\n", seed);
    srand(seed);
    for (int round = 0; round < 40; round++)
        run_sequence(1 + (uint32_t)(rand() % MAXCAP), 400);
}

static void test_cache_edges(void **state)
{
    kvs_cache_t *c;
    kvs_cache_req_t req[2];
    uint32_t pages[16];
    uint64_t ev[8];
    size_t n_ev;

    (void)state;
    assert_int_equal(kvs_cache_create(0, &c), RI_ERR_INVALID);
    assert_int_equal(kvs_cache_create(4, &c), RI_OK);
    /* duplicate keys: refused, nothing changes */
    req[0] = (kvs_cache_req_t){.key = 5, .pages = 1};
    req[1] = (kvs_cache_req_t){.key = 5, .pages = 1};
    assert_int_equal(kvs_cache_fetch(c, req, 2, pages, ev, 8, &n_ev), RI_ERR_INVALID);
    assert_int_equal(kvs_cache_clusters(c), 0);
    /* a cluster larger than the cache is a miss, never admitted */
    req[0] = (kvs_cache_req_t){.key = 1, .pages = 5};
    assert_int_equal(kvs_cache_fetch(c, req, 1, pages, ev, 8, &n_ev), RI_OK);
    assert_false(req[0].hit);
    assert_false(req[0].admitted);
    /* zero pages: invalid */
    req[0] = (kvs_cache_req_t){.key = 1, .pages = 0};
    assert_int_equal(kvs_cache_fetch(c, req, 1, pages, ev, 8, &n_ev), RI_ERR_INVALID);
    kvs_cache_destroy(c);

    /* Too little room for evictions: a full cache of clusters 1..4 (one
     * page each, 1 least recent), a fetch of hit 1 and miss 9 (two pages,
     * so two evictions) with room for one evicted key: RI_ERR_RANGE, and
     * nothing changed -- not the contents, not the counters, and not the
     * recency (had hit 1 been moved to most recent, the next fetch would
     * evict 2 and 3 instead of 1 and 2). */
    kvs_cache_counters_t before, after;
    assert_int_equal(kvs_cache_create(4, &c), RI_OK);
    for (uint64_t k = 1; k <= 4; k++) {
        req[0] = (kvs_cache_req_t){.key = k, .pages = 1};
        assert_int_equal(kvs_cache_fetch(c, req, 1, pages, ev, 8, &n_ev), RI_OK);
        assert_true(req[0].admitted);
    }
    assert_int_equal(kvs_cache_free_pages(c), 0);
    kvs_cache_counters(c, &before);
    req[0] = (kvs_cache_req_t){.key = 1, .pages = 1};
    req[1] = (kvs_cache_req_t){.key = 9, .pages = 2};
    n_ev = 77;
    assert_int_equal(kvs_cache_fetch(c, req, 2, pages, ev, 1, &n_ev), RI_ERR_RANGE);
    assert_int_equal(n_ev, 77);
    kvs_cache_counters(c, &after);
    assert_memory_equal(&before, &after, sizeof(before));
    assert_int_equal(kvs_cache_clusters(c), 4);
    assert_int_equal(kvs_cache_free_pages(c), 0);
    for (uint64_t k = 1; k <= 4; k++)
        assert_true(kvs_cache_contains(c, k));
    assert_false(kvs_cache_contains(c, 9));
    req[0] = (kvs_cache_req_t){.key = 9, .pages = 2};
    assert_int_equal(kvs_cache_fetch(c, req, 1, pages, ev, 8, &n_ev), RI_OK);
    assert_true(req[0].admitted);
    assert_int_equal(n_ev, 2);
    assert_true((ev[0] == 1 && ev[1] == 2) || (ev[0] == 2 && ev[1] == 1));
    assert_true(kvs_cache_contains(c, 3) && kvs_cache_contains(c, 4));
    kvs_cache_destroy(c);
    kvs_cache_destroy(NULL);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_cache_property),
        cmocka_unit_test(test_cache_edges),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
