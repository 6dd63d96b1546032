/*
 * Host block pool: arena mapping and the extent allocator.  Free extents live
 * in an array sorted by offset; allocation is best fit (the smallest extent
 * that is large enough, lowest address on ties), which keeps big extents whole
 * for later uploads; free coalesces with both neighbours at once, so the array
 * never holds two adjacent free extents.
 */
#include "kvstore/data/kvs_pool.h"

#include <errno.h>
#include <pthread.h>
#include <string.h>
#include <sys/mman.h>

#include "common/cm_alloc.h"
#include "common/cm_log.h"
#include "common/cm_status.h"

#define KVS_HUGE_2M (2u << 20)

static CM_ALLOC_TAG(kvs_pool_tag, "kvs.pool");

typedef struct kvs_extent {
    uint64_t off;  /* start, in bytes from the arena base */
    uint64_t len;  /* length in bytes (multiple of the unit) */
} kvs_extent_t;

struct kvs_pool {
    uint8_t *base;              /* arena */
    uint64_t size;              /* arena bytes */
    uint64_t map_size;          /* bytes passed to mmap (hugepage-rounded) */
    kvs_pool_backing_t backing; /* how it is backed */
    pthread_mutex_t lock;       /* guards everything below */
    kvs_extent_t *free;         /* free extents sorted by offset */
    size_t n_free;              /* entries used */
    size_t cap_free;            /* entries allocated */
    uint64_t used;              /* allocated bytes */
    uint64_t allocs;            /* successful allocations */
    uint64_t failures;          /* failed allocations */
};

uint64_t kvs_pool_round(uint64_t bytes)
{
    if (bytes > UINT64_MAX - KVS_POOL_UNIT)
        return UINT64_MAX;
    return CM_ALIGN_UP(bytes, (uint64_t)KVS_POOL_UNIT);
}

static ri_status_t kvs_pool_map(kvs_pool_t *pool, bool try_huge)
{
    void *p;

    if (try_huge) {
        pool->map_size = CM_ALIGN_UP(pool->size, (uint64_t)KVS_HUGE_2M);
        p = mmap(NULL, pool->map_size, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_HUGETLB, -1, 0);
        if (p != MAP_FAILED) {
            pool->base = p;
            pool->backing = KVS_POOL_HUGETLB;
            return RI_OK;
        }
        cm_debug("pool: no explicit hugepages for %llu bytes (%m); trying THP", (unsigned long long)pool->map_size);
    }
    pool->map_size = try_huge ? CM_ALIGN_UP(pool->size, (uint64_t)KVS_HUGE_2M) : pool->size;
    p = mmap(NULL, pool->map_size, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (p == MAP_FAILED) {
        int err = errno;
        cm_error("pool: mmap of %llu bytes failed: %s", (unsigned long long)pool->map_size, strerror(err));
        return err == ENOMEM ? RI_ERR_NOMEM : cm_status_from_errno(err);
    }
    pool->base = p;
    pool->backing = KVS_POOL_PLAIN;
    if (try_huge) {
        if (madvise(p, pool->map_size, MADV_HUGEPAGE) == 0)
            pool->backing = KVS_POOL_THP;
        else
            cm_debug("pool: madvise(MADV_HUGEPAGE) failed: %m; plain pages");
    }
    return RI_OK;
}

ri_status_t kvs_pool_create(uint64_t bytes, bool try_huge, kvs_pool_t **pool_p)
{
    kvs_pool_t *pool;
    ri_status_t st;

    if (pool_p == NULL || bytes == 0 || bytes > (UINT64_C(1) << 46))
        return RI_ERR_INVALID;
    pool = cm_calloc(&kvs_pool_tag, 1, sizeof(*pool));
    if (pool == NULL)
        return RI_ERR_NOMEM;
    pool->size = kvs_pool_round(bytes);
    pool->cap_free = 16;
    pool->free = cm_malloc(&kvs_pool_tag, pool->cap_free * sizeof(*pool->free));
    if (pool->free == NULL) {
        st = RI_ERR_NOMEM;
        goto err_free_pool;
    }
    pool->free[0] = (kvs_extent_t){.off = 0, .len = pool->size};
    pool->n_free = 1;
    st = kvs_pool_map(pool, try_huge);
    if (st != RI_OK)
        goto err_free_array;
    pthread_mutex_init(&pool->lock, NULL);
    cm_info("pool: %llu bytes, backing %s", (unsigned long long)pool->size,
            pool->backing == KVS_POOL_HUGETLB ? "hugetlb" : pool->backing == KVS_POOL_THP ? "thp" : "plain");
    *pool_p = pool;
    return RI_OK;

err_free_array:
    cm_free(pool->free);
err_free_pool:
    cm_free(pool);
    return st;
}

void kvs_pool_destroy(kvs_pool_t *pool)
{
    if (pool == NULL)
        return;
    munmap(pool->base, pool->map_size);
    pthread_mutex_destroy(&pool->lock);
    cm_free(pool->free);
    cm_free(pool);
}

uint8_t *kvs_pool_base(const kvs_pool_t *pool)
{
    return pool->base;
}

uint64_t kvs_pool_size(const kvs_pool_t *pool)
{
    return pool->size;
}

kvs_pool_backing_t kvs_pool_backing(const kvs_pool_t *pool)
{
    return pool->backing;
}

ri_status_t kvs_pool_alloc(kvs_pool_t *pool, uint64_t bytes, uint64_t *off_p)
{
    size_t best = SIZE_MAX;
    uint64_t need;
    ri_status_t st = RI_OK;

    if (bytes == 0 || off_p == NULL)
        return RI_ERR_INVALID;
    need = kvs_pool_round(bytes);
    pthread_mutex_lock(&pool->lock);
    for (size_t i = 0; i < pool->n_free; i++) {
        if (pool->free[i].len >= need && (best == SIZE_MAX || pool->free[i].len < pool->free[best].len)) {
            best = i;
            if (pool->free[i].len == need)
                break;
        }
    }
    if (best == SIZE_MAX) {
        pool->failures++;
        st = RI_ERR_NOSPACE;
        goto out;
    }
    *off_p = pool->free[best].off;
    pool->free[best].off += need;
    pool->free[best].len -= need;
    if (pool->free[best].len == 0) {
        memmove(&pool->free[best], &pool->free[best + 1], (pool->n_free - best - 1) * sizeof(kvs_extent_t));
        pool->n_free--;
    }
    pool->used += need;
    pool->allocs++;
out:
    pthread_mutex_unlock(&pool->lock);
    return st;
}

/* First free extent whose offset is > off (binary search). */
static size_t kvs_pool_upper(const kvs_pool_t *pool, uint64_t off)
{
    size_t lo = 0, hi = pool->n_free;
    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        if (pool->free[mid].off <= off)
            lo = mid + 1;
        else
            hi = mid;
    }
    return lo;
}

void kvs_pool_free(kvs_pool_t *pool, uint64_t off, uint64_t bytes)
{
    uint64_t len = kvs_pool_round(bytes);
    size_t i;
    bool merge_prev, merge_next;

    if (pool == NULL || bytes == 0)
        return;
    pthread_mutex_lock(&pool->lock);
    if (off % KVS_POOL_UNIT != 0 || off > pool->size || len > pool->size - off)
        goto bad;
    i = kvs_pool_upper(pool, off);
    /* Overlap with a free neighbour means a double free. */
    if (i > 0 && pool->free[i - 1].off + pool->free[i - 1].len > off)
        goto bad;
    if (i < pool->n_free && off + len > pool->free[i].off)
        goto bad;
    merge_prev = i > 0 && pool->free[i - 1].off + pool->free[i - 1].len == off;
    merge_next = i < pool->n_free && off + len == pool->free[i].off;
    if (merge_prev && merge_next) {
        pool->free[i - 1].len += len + pool->free[i].len;
        memmove(&pool->free[i], &pool->free[i + 1], (pool->n_free - i - 1) * sizeof(kvs_extent_t));
        pool->n_free--;
    } else if (merge_prev) {
        pool->free[i - 1].len += len;
    } else if (merge_next) {
        pool->free[i].off = off;
        pool->free[i].len += len;
    } else {
        if (pool->n_free == pool->cap_free) {
            /* Growing can fail; then the extent is leaked (counted as used)
             * rather than corrupting the array.  Logged once here. */
            kvs_extent_t *nf = cm_realloc(&kvs_pool_tag, pool->free, pool->cap_free * 2 * sizeof(kvs_extent_t));
            if (nf == NULL) {
                cm_error("pool: out of memory growing the free list; %llu bytes stay allocated",
                         (unsigned long long)len);
                goto out;
            }
            pool->free = nf;
            pool->cap_free *= 2;
        }
        memmove(&pool->free[i + 1], &pool->free[i], (pool->n_free - i) * sizeof(kvs_extent_t));
        pool->free[i] = (kvs_extent_t){.off = off, .len = len};
        pool->n_free++;
    }
    pool->used -= len;
    goto out;
bad:
    cm_error("pool: bad free of offset %llu, %llu bytes (bug)", (unsigned long long)off, (unsigned long long)bytes);
out:
    pthread_mutex_unlock(&pool->lock);
}

void kvs_pool_stats(kvs_pool_t *pool, kvs_pool_stats_t *stats_p)
{
    kvs_pool_stats_t s = {0};

    pthread_mutex_lock(&pool->lock);
    s.total_bytes = pool->size;
    s.used_bytes = pool->used;
    s.free_extents = pool->n_free;
    for (size_t i = 0; i < pool->n_free; i++)
        s.largest_free_bytes = CM_MAX(s.largest_free_bytes, pool->free[i].len);
    s.allocs = pool->allocs;
    s.alloc_failures = pool->failures;
    pthread_mutex_unlock(&pool->lock);
    *stats_p = s;
}

double kvs_pool_pressure(kvs_pool_t *pool)
{
    double p;

    pthread_mutex_lock(&pool->lock);
    p = pool->size ? (double)pool->used / (double)pool->size : 0.0;
    pthread_mutex_unlock(&pool->lock);
    return p;
}
