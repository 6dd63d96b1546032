/*
 * Named allocations.  Every heap allocation of ours names a tag; each tag
 * counts live bytes and blocks, so leaks and growth show per subsystem (the
 * daemon exports them as metrics).  Tags are static objects registered on first
 * use.  A test can make the N-th allocation fail (cm_alloc_fail_after) to
 * inject out-of-memory.
 *
 * Blocks carry a small header: free them with cm_free(), never free().
 */
#ifndef CM_ALLOC_H
#define CM_ALLOC_H

#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>

typedef struct cm_alloc_tag {
    const char *name;            /* shown in dumps and metrics */
    atomic_size_t bytes;         /* live bytes */
    atomic_size_t blocks;        /* live blocks */
    atomic_size_t peak_bytes;    /* high-water mark of bytes */
    atomic_int registered;       /* set once it is on the global list */
    struct cm_alloc_tag *next;   /* global list, guarded by a lock */
} cm_alloc_tag_t;

/* Define a tag at file scope: CM_ALLOC_TAG(kvs_pool_tag, "kvs.pool"); */
#define CM_ALLOC_TAG(var, tagname) cm_alloc_tag_t var = {.name = (tagname)}

/* Allocate size bytes (uninitialised); NULL on failure.  Caller frees with cm_free. */
void *cm_malloc(cm_alloc_tag_t *tag, size_t size);

/* Allocate n*size zeroed bytes, checking for overflow; NULL on failure. */
void *cm_calloc(cm_alloc_tag_t *tag, size_t n, size_t size);

/* Allocate size bytes aligned to align (a power of two, >= 16); cm_free frees it. */
void *cm_malloc_aligned(cm_alloc_tag_t *tag, size_t size, size_t align);

/* Resize a block from cm_malloc/cm_calloc (not aligned ones); NULL on failure
 * leaves the old block untouched. */
void *cm_realloc(cm_alloc_tag_t *tag, void *ptr, size_t size);

/* Duplicate a string; NULL on failure or when s is NULL. */
char *cm_strdup(cm_alloc_tag_t *tag, const char *s);

/* Free a block from any cm_ allocator; NULL is a no-op. */
void cm_free(void *ptr);

/* Fault injection: the n-th allocation from now fails (n >= 1); 0 disables. */
void cm_alloc_fail_after(uint64_t n);

/* Allocations left before the armed failure; 0 when none is armed or it has
 * fired (a test tells "the fault hit" from "the code allocated less"). */
uint64_t cm_alloc_fail_pending(void);

/* Visit every registered tag (for metrics and dumps); holds a lock meanwhile. */
typedef void (*cm_alloc_visit_fn_t)(const cm_alloc_tag_t *tag, void *arg);
void cm_alloc_visit(cm_alloc_visit_fn_t fn, void *arg);

/* Total live bytes over all tags. */
size_t cm_alloc_total_bytes(void);

/* Give the whole pages inside [addr, addr + len) back to the system
 * (madvise MADV_DONTNEED on anonymous memory): they read as zeros after,
 * and the mapping stays.  Returns the bytes given back (0 on failure). */
uint64_t cm_release_pages(void *addr, size_t len);

#endif /* CM_ALLOC_H */
