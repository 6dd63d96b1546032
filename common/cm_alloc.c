/* Tagged allocator: a 32-byte header before each block records tag, size and
 * the offset back to the real start (for aligned blocks). */
#include "common/cm_alloc.h"

#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#define CM_ALLOC_MAGIC 0x52494d41u /* "RIMA" */
#define CM_ALLOC_ALIGN_UP_INTERNAL(x, a) ((((x) + (a) - 1) / (a)) * (a))

typedef struct cm_alloc_hdr {
    cm_alloc_tag_t *tag;  /* owner tag */
    size_t size;          /* user bytes */
    uint32_t offset;      /* bytes from the raw block start to the user pointer */
    uint32_t magic;       /* CM_ALLOC_MAGIC while live */
    uint64_t pad;         /* keeps the user pointer 16-byte aligned */
} cm_alloc_hdr_t;

_Static_assert(sizeof(cm_alloc_hdr_t) == 32, "header keeps 16-byte alignment");

static pthread_mutex_t cm_alloc_lock = PTHREAD_MUTEX_INITIALIZER;
static cm_alloc_tag_t *cm_alloc_tags;
static atomic_uint_fast64_t cm_alloc_fail_countdown;

static void cm_alloc_register(cm_alloc_tag_t *tag)
{
    if (atomic_load_explicit(&tag->registered, memory_order_acquire))
        return;
    pthread_mutex_lock(&cm_alloc_lock);
    if (!atomic_load_explicit(&tag->registered, memory_order_relaxed)) {
        tag->next = cm_alloc_tags;
        cm_alloc_tags = tag;
        atomic_store_explicit(&tag->registered, 1, memory_order_release);
    }
    pthread_mutex_unlock(&cm_alloc_lock);
}

static int cm_alloc_should_fail(void)
{
    uint_fast64_t n = atomic_load_explicit(&cm_alloc_fail_countdown, memory_order_relaxed);
    while (n != 0) {
        if (atomic_compare_exchange_weak(&cm_alloc_fail_countdown, &n, n - 1))
            return n == 1;
    }
    return 0;
}

static void cm_alloc_account(cm_alloc_tag_t *tag, size_t size, int sign)
{
    if (sign > 0) {
        size_t now = atomic_fetch_add(&tag->bytes, size) + size;
        atomic_fetch_add(&tag->blocks, 1);
        size_t peak = atomic_load(&tag->peak_bytes);
        while (now > peak && !atomic_compare_exchange_weak(&tag->peak_bytes, &peak, now)) {
        }
    } else {
        atomic_fetch_sub(&tag->bytes, size);
        atomic_fetch_sub(&tag->blocks, 1);
    }
}

static void *cm_alloc_finish(cm_alloc_tag_t *tag, void *raw, size_t size, size_t offset)
{
    cm_alloc_hdr_t *hdr = (cm_alloc_hdr_t *)((char *)raw + offset - sizeof(*hdr));
    hdr->tag = tag;
    hdr->size = size;
    hdr->offset = (uint32_t)offset;
    hdr->magic = CM_ALLOC_MAGIC;
    cm_alloc_register(tag);
    cm_alloc_account(tag, size, +1);
    return (char *)raw + offset;
}

void *cm_malloc(cm_alloc_tag_t *tag, size_t size)
{
    void *raw;
    if (size > SIZE_MAX - sizeof(cm_alloc_hdr_t) || cm_alloc_should_fail())
        return NULL;
    raw = malloc(sizeof(cm_alloc_hdr_t) + size);
    if (raw == NULL)
        return NULL;
    return cm_alloc_finish(tag, raw, size, sizeof(cm_alloc_hdr_t));
}

void *cm_calloc(cm_alloc_tag_t *tag, size_t n, size_t size)
{
    void *p;
    if (size != 0 && n > SIZE_MAX / size)
        return NULL;
    p = cm_malloc(tag, n * size);
    if (p != NULL)
        memset(p, 0, n * size);
    return p;
}

void *cm_malloc_aligned(cm_alloc_tag_t *tag, size_t size, size_t align)
{
    void *raw = NULL;
    if (align < 16 || (align & (align - 1)) != 0 || align > (1u << 30))
        return NULL;
    if (size > SIZE_MAX - 2 * align || cm_alloc_should_fail())
        return NULL;
    /* Leave one full alignment unit in front so the header fits before the
     * user pointer and the offset is a multiple of align. */
    size_t offset = CM_ALLOC_ALIGN_UP_INTERNAL(sizeof(cm_alloc_hdr_t), align);
    if (posix_memalign(&raw, align, offset + size) != 0)
        return NULL;
    return cm_alloc_finish(tag, raw, size, offset);
}

void *cm_realloc(cm_alloc_tag_t *tag, void *ptr, size_t size)
{
    if (ptr == NULL)
        return cm_malloc(tag, size);
    cm_alloc_hdr_t *hdr = (cm_alloc_hdr_t *)ptr - 1;
    if (hdr->offset != sizeof(cm_alloc_hdr_t))
        return NULL; /* aligned blocks cannot be resized */
    void *np = cm_malloc(tag, size);
    if (np == NULL)
        return NULL;
    memcpy(np, ptr, hdr->size < size ? hdr->size : size);
    cm_free(ptr);
    return np;
}

char *cm_strdup(cm_alloc_tag_t *tag, const char *s)
{
    if (s == NULL)
        return NULL;
    size_t n = strlen(s) + 1;
    char *d = cm_malloc(tag, n);
    if (d != NULL)
        memcpy(d, s, n);
    return d;
}

void cm_free(void *ptr)
{
    if (ptr == NULL)
        return;
    cm_alloc_hdr_t *hdr = (cm_alloc_hdr_t *)ptr - 1;
    if (hdr->magic != CM_ALLOC_MAGIC)
        abort(); /* our own invariant: a foreign or double-freed pointer */
    hdr->magic = 0;
    cm_alloc_account(hdr->tag, hdr->size, -1);
    free((char *)ptr - hdr->offset);
}

void cm_alloc_fail_after(uint64_t n)
{
    atomic_store(&cm_alloc_fail_countdown, n);
}

uint64_t cm_alloc_fail_pending(void)
{
    return (uint64_t)atomic_load(&cm_alloc_fail_countdown);
}

void cm_alloc_visit(cm_alloc_visit_fn_t fn, void *arg)
{
    pthread_mutex_lock(&cm_alloc_lock);
    for (cm_alloc_tag_t *t = cm_alloc_tags; t != NULL; t = t->next)
        fn(t, arg);
    pthread_mutex_unlock(&cm_alloc_lock);
}

size_t cm_alloc_total_bytes(void)
{
    size_t total = 0;
    pthread_mutex_lock(&cm_alloc_lock);
    for (cm_alloc_tag_t *t = cm_alloc_tags; t != NULL; t = t->next)
        total += atomic_load(&t->bytes);
    pthread_mutex_unlock(&cm_alloc_lock);
    return total;
}

uint64_t cm_release_pages(void *addr, size_t len)
{
    long p = sysconf(_SC_PAGESIZE);
    size_t pg = p > 0 ? (size_t)p : 4096;
    uintptr_t lo = ((uintptr_t)addr + pg - 1) / pg * pg, hi = ((uintptr_t)addr + len) / pg * pg;

    if (hi <= lo || madvise((void *)lo, hi - lo, MADV_DONTNEED) != 0)
        return 0;
    return hi - lo;
}
