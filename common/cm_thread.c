/* Thread pool for parallel loops; see cm_thread.h. */
#define _GNU_SOURCE
#include "common/cm_thread.h"

#include <fcntl.h>
#include <pthread.h>
#include <sched.h>
#include <stdio.h>
#include <stdint.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdlib.h>
#include <unistd.h>

#include "common/cm_alloc.h"
#include "common/cm_log.h"
#include "common/cm_time.h"

static CM_ALLOC_TAG(cm_pool_tag, "cm.pool");

/*
 * The task counter carries the loop's generation in its top bits, so that a
 * worker that wakes late (after the caller has finished the loop alone and
 * perhaps started the next one) can never take an index of a loop whose body
 * it did not read.  The caller waits for the work to be DONE (items counted
 * as finished), not for every worker to check in: on a loaded machine a
 * sleeping worker can take a whole scheduler slice to wake, and short loops
 * (a few ms of decode) must not pay that.
 */
#define CM_POOL_IDX_BITS 40
#define CM_POOL_IDX_MASK ((UINT64_C(1) << CM_POOL_IDX_BITS) - 1)

struct cm_pool {
    unsigned nthreads;           /* caller included */
    pthread_t *threads;          /* nthreads - 1 workers */
    pthread_mutex_t lock;        /* guards the loop descriptor and stop */
    pthread_cond_t wake;         /* workers wait for a new loop */
    pthread_cond_t done;         /* caller waits for the last item */
    pthread_mutex_t run_lock;    /* one loop at a time */
    uint64_t generation;         /* bumped per loop (24 bits used in next) */
    uint64_t spin_ns;            /* a worker's busy wait for the next loop before it sleeps */
    _Atomic bool spin_ok;        /* the machine has a core to spare: spinning costs nobody */
    uint64_t spin_checked_ns;    /* when the caller last looked (cm_pool_spin_check) */
    bool stop;                   /* set by destroy */
    bool caller_waiting;         /* caller sleeps on done */
    /* the current loop (written under lock before generation moves) */
    cm_pool_task_fn_t fn;
    void *arg;
    size_t n, chunk;
    _Atomic uint64_t next;       /* generation tag << 40 | next index */
    atomic_size_t finished;      /* items whose body has returned */
};

typedef struct cm_pool_worker_arg {
    cm_pool_t *pool;
    unsigned index;
} cm_pool_worker_arg_t;

typedef struct cm_pool_loop {
    cm_pool_task_fn_t fn;
    void *arg;
    size_t n, chunk;
    uint64_t tag;                /* generation tag of this loop */
} cm_pool_loop_t;

/* Take chunks of one loop until none is left or the loop has changed. */
static void cm_pool_drain(cm_pool_t *pool, const cm_pool_loop_t *loop, unsigned worker)
{
    for (;;) {
        uint64_t cur = atomic_load_explicit(&pool->next, memory_order_acquire);
        size_t begin;
        do {
            if ((cur >> CM_POOL_IDX_BITS) != loop->tag)
                return;
            begin = (size_t)(cur & CM_POOL_IDX_MASK);
            if (begin >= loop->n)
                return;
        } while (!atomic_compare_exchange_weak_explicit(&pool->next, &cur, cur + loop->chunk,
                                                        memory_order_acq_rel, memory_order_acquire));
        size_t end = begin + loop->chunk < loop->n ? begin + loop->chunk : loop->n;
        loop->fn(loop->arg, begin, end, worker);
        size_t fin = atomic_fetch_add_explicit(&pool->finished, end - begin, memory_order_acq_rel) + (end - begin);
        if (fin == loop->n && worker != 0) {
            pthread_mutex_lock(&pool->lock);
            if (pool->caller_waiting)
                pthread_cond_signal(&pool->done);
            pthread_mutex_unlock(&pool->lock);
        }
    }
}

static inline void cm_pool_relax(void)
{
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#elif defined(__aarch64__)
    __asm__ __volatile__("yield");
#endif
}

/* Busy-wait up to spin_ns for a loop after generation seen: the next
 * product of a decode step usually follows within microseconds, and a
 * worker asleep on the condition variable wakes only after the caller has
 * taken every chunk itself (on a loaded machine, a scheduler slice later).
 * Reads only the atomic counter, whose tag the caller moves with release
 * after writing the loop; the loop itself is read under the lock. */
static void cm_pool_spin(cm_pool_t *pool, uint64_t seen, uint64_t spin_ns)
{
    uint64_t tag = seen & 0xffffffu, until = 0;
    for (unsigned i = 0;; i++) {
        uint64_t cur = atomic_load_explicit(&pool->next, memory_order_acquire);
        if ((cur >> CM_POOL_IDX_BITS) != tag)
            return;
        if ((i & 63u) == 0) {
            uint64_t now = cm_time_ns();
            if (until == 0)
                until = now + spin_ns;
            else if (now >= until)
                return;
        }
        cm_pool_relax();
    }
}

/* Runnable threads on the machine now (the fourth field of /proc/loadavg,
 * "running/total"), or 0 when it cannot be read. */
static unsigned cm_pool_runnable(void)
{
    char buf[128];
    unsigned r = 0, t = 0;
    int fd = open("/proc/loadavg", O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return 0;
    ssize_t n = read(fd, buf, sizeof(buf) - 1);
    close(fd);
    if (n <= 0)
        return 0;
    buf[n] = '\0';
    double a, b, c;
    if (sscanf(buf, "%lf %lf %lf %u/%u", &a, &b, &c, &r, &t) != 5)
        return 0;
    return r;
}

/* Spinning pays only while it takes no core another thread wants: on a
 * shared machine (more runnable threads than CPUs) a spinning worker
 * slows the caller it waits for (measured: decode -11% with two busy
 * processes on 2 cores, +12% on an idle machine).  The caller looks every
 * 20 ms: one read of /proc/loadavg. */
static void cm_pool_spin_check(cm_pool_t *pool)
{
    uint64_t now = cm_time_ns();
    if (now - pool->spin_checked_ns < 20000000u)
        return;
    pool->spin_checked_ns = now;
    unsigned runnable = cm_pool_runnable(), cpus = cm_cpu_count();
    /* our own spinning worker counts as runnable: allow the pool's threads */
    atomic_store_explicit(&pool->spin_ok, runnable != 0 && runnable <= cpus, memory_order_relaxed);
}

static void *cm_pool_worker_main(void *p)
{
    cm_pool_t *pool = ((cm_pool_worker_arg_t *)p)->pool;
    unsigned index = ((cm_pool_worker_arg_t *)p)->index;
    uint64_t seen = 0;
    cm_free(p);
    pthread_mutex_lock(&pool->lock);
    for (;;) {
        uint64_t spin_ns = pool->spin_ns;
        if (spin_ns > 0 && seen != 0 && !pool->stop && pool->generation == seen &&
            atomic_load_explicit(&pool->spin_ok, memory_order_relaxed)) {
            pthread_mutex_unlock(&pool->lock);
            cm_pool_spin(pool, seen, spin_ns);
            pthread_mutex_lock(&pool->lock);
        }
        while (!pool->stop && pool->generation == seen)
            pthread_cond_wait(&pool->wake, &pool->lock);
        if (pool->stop)
            break;
        seen = pool->generation;
        cm_pool_loop_t loop = {pool->fn, pool->arg, pool->n, pool->chunk, seen & 0xffffffu};
        pthread_mutex_unlock(&pool->lock);
        cm_pool_drain(pool, &loop, index);
        pthread_mutex_lock(&pool->lock);
    }
    pthread_mutex_unlock(&pool->lock);
    return NULL;
}

unsigned cm_cpu_count(void)
{
    long n = sysconf(_SC_NPROCESSORS_ONLN);
    return n > 0 ? (unsigned)n : 1u;
}

ri_status_t cm_pool_create(unsigned nthreads, cm_pool_t **pool_p)
{
    ri_status_t st = RI_ERR_NOMEM;
    cm_pool_t *pool;
    unsigned started = 0;

    if (nthreads == 0)
        nthreads = cm_cpu_count();
    if (nthreads > 1024)
        return RI_ERR_INVALID;
    pool = cm_calloc(&cm_pool_tag, 1, sizeof(*pool));
    if (pool == NULL)
        return RI_ERR_NOMEM;
    pool->nthreads = nthreads;
    pthread_mutex_init(&pool->lock, NULL);
    pthread_mutex_init(&pool->run_lock, NULL);
    pthread_cond_init(&pool->wake, NULL);
    pthread_cond_init(&pool->done, NULL);
    pool->threads = cm_calloc(&cm_pool_tag, nthreads, sizeof(pthread_t));
    if (pool->threads == NULL)
        goto err_free_pool;
    for (; started + 1 < nthreads; started++) {
        cm_pool_worker_arg_t *wa = cm_malloc(&cm_pool_tag, sizeof(*wa));
        if (wa == NULL)
            goto err_stop;
        wa->pool = pool;
        wa->index = started + 1;
        if (pthread_create(&pool->threads[started], NULL, cm_pool_worker_main, wa) != 0) {
            cm_error("pthread_create failed for pool worker %u", started + 1);
            cm_free(wa);
            st = RI_ERR_INTERNAL;
            goto err_stop;
        }
    }
    *pool_p = pool;
    return RI_OK;

err_stop:
    pool->nthreads = started + 1;
    cm_pool_destroy(pool);
    return st;
err_free_pool:
    cm_free(pool);
    return st;
}

void cm_pool_destroy(cm_pool_t *pool)
{
    if (pool == NULL)
        return;
    pthread_mutex_lock(&pool->lock);
    pool->stop = true;
    pthread_cond_broadcast(&pool->wake);
    pthread_mutex_unlock(&pool->lock);
    for (unsigned i = 0; i + 1 < pool->nthreads; i++)
        pthread_join(pool->threads[i], NULL);
    pthread_cond_destroy(&pool->wake);
    pthread_cond_destroy(&pool->done);
    pthread_mutex_destroy(&pool->lock);
    pthread_mutex_destroy(&pool->run_lock);
    cm_free(pool->threads);
    cm_free(pool);
}

void cm_pool_set_spin_us(cm_pool_t *pool, unsigned spin_us)
{
    if (pool == NULL)
        return;
    pthread_mutex_lock(&pool->lock);
    pool->spin_ns = (uint64_t)spin_us * 1000u;
    pthread_mutex_unlock(&pool->lock);
}

bool cm_pool_spinning(const cm_pool_t *pool)
{
    return pool != NULL && pool->nthreads > 1 && pool->spin_ns > 0 &&
           atomic_load_explicit(&pool->spin_ok, memory_order_relaxed);
}

unsigned cm_pool_size(const cm_pool_t *pool)
{
    return pool ? pool->nthreads : 1u;
}

void cm_pool_parallel_for(cm_pool_t *pool, size_t n, size_t grain, cm_pool_task_fn_t fn, void *arg)
{
    if (n == 0)
        return;
    if (grain == 0)
        grain = 1;
    if (pool == NULL || pool->nthreads == 1 || n <= grain || n > CM_POOL_IDX_MASK / 2) {
        fn(arg, 0, n, 0);
        return;
    }
    /* Aim for ~4 chunks per thread for balance, never below the grain. */
    size_t chunk = n / ((size_t)pool->nthreads * 4);
    if (chunk < grain)
        chunk = grain;
    pthread_mutex_lock(&pool->run_lock);
    if (pool->spin_ns > 0)
        cm_pool_spin_check(pool); /* under run_lock: one caller at a time */
    pthread_mutex_lock(&pool->lock);
    pool->generation++;
    cm_pool_loop_t loop = {fn, arg, n, chunk, pool->generation & 0xffffffu};
    pool->fn = fn;
    pool->arg = arg;
    pool->n = n;
    pool->chunk = chunk;
    atomic_store(&pool->finished, 0);
    atomic_store_explicit(&pool->next, loop.tag << CM_POOL_IDX_BITS, memory_order_release);
    pthread_cond_broadcast(&pool->wake);
    pthread_mutex_unlock(&pool->lock);

    cm_pool_drain(pool, &loop, 0);

    /* Wait until every item's body has returned: spin briefly (workers are
     * usually just finishing a chunk), then sleep. */
    for (int spin = 0; spin < 2000 && atomic_load_explicit(&pool->finished, memory_order_acquire) != n; spin++)
        sched_yield();
    if (atomic_load_explicit(&pool->finished, memory_order_acquire) != n) {
        pthread_mutex_lock(&pool->lock);
        pool->caller_waiting = true;
        while (atomic_load_explicit(&pool->finished, memory_order_acquire) != n)
            pthread_cond_wait(&pool->done, &pool->lock);
        pool->caller_waiting = false;
        pthread_mutex_unlock(&pool->lock);
    }
    pthread_mutex_unlock(&pool->run_lock);
}

static pthread_once_t cm_pool_default_once = PTHREAD_ONCE_INIT;
static cm_pool_t *cm_pool_default_ptr;
static _Atomic unsigned cm_pool_default_threads;   /* 0 = every CPU */
static atomic_bool cm_pool_default_started;

static void cm_pool_default_init(void)
{
    atomic_store(&cm_pool_default_started, true);
    if (cm_pool_create(atomic_load(&cm_pool_default_threads), &cm_pool_default_ptr) != RI_OK)
        cm_pool_default_ptr = NULL; /* loops then run inline */
}

ri_status_t cm_pool_default_set_threads(unsigned threads)
{
    if (!atomic_load(&cm_pool_default_started)) {
        atomic_store(&cm_pool_default_threads, threads);
        return RI_OK;
    }
    unsigned have = cm_pool_size(cm_pool_default());
    return threads == have || (threads == 0 && have == cm_cpu_count()) ? RI_OK : RI_ERR_BUSY;
}

cm_pool_t *cm_pool_default(void)
{
    pthread_once(&cm_pool_default_once, cm_pool_default_init);
    return cm_pool_default_ptr;
}
