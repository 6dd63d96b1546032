/*
 * A fixed pool of worker threads for data-parallel loops (kernels, matmuls):
 * cm_pool_parallel_for() splits [0, n) into tasks handed out by an atomic
 * counter; the calling thread works too and returns when all are done.  One
 * loop runs at a time per pool (calls from several threads are serialised).
 * Between loops a worker busy-waits for the next one for a while (the spin
 * time, cm_pool_set_spin_us; 0 at creation), then sleeps on a condition
 * variable.
 */
#ifndef CM_THREAD_H
#define CM_THREAD_H

#include <stdbool.h>
#include <stddef.h>
#include "retroinfer/status.h"

typedef struct cm_pool cm_pool_t;

/* Body of a loop: handle tasks [begin, end); worker is 0..nthreads-1 (the
 * caller is 0), for per-thread scratch space. */
typedef void (*cm_pool_task_fn_t)(void *arg, size_t begin, size_t end, unsigned worker);

/* Create a pool of nthreads in all (the caller counts as one; 0 = number of
 * online CPUs).  Caller destroys with cm_pool_destroy. */
ri_status_t cm_pool_create(unsigned nthreads, cm_pool_t **pool_p);

/* Stop and join the workers; NULL is a no-op. */
void cm_pool_destroy(cm_pool_t *pool);

/* How long a worker busy-waits for the next loop before it sleeps, in
 * microseconds (0 = sleep at once).  A decode step is hundreds of small
 * loops microseconds apart: a sleeping worker wakes only after the caller
 * has done the loop alone.  NULL is a no-op. */
void cm_pool_set_spin_us(cm_pool_t *pool, unsigned spin_us);

/* True while the workers busy-wait between loops (a spin time is set and
 * the machine had a core to spare at the last look): a loop then costs
 * about a microsecond to hand out, so smaller ones pay to split.  NULL:
 * false. */
bool cm_pool_spinning(const cm_pool_t *pool);

/* Number of threads, the caller included. */
unsigned cm_pool_size(const cm_pool_t *pool);

/* Run fn over [0, n) in chunks of at least `grain` items; blocks until done.
 * pool may be NULL (runs inline on the caller). */
void cm_pool_parallel_for(cm_pool_t *pool, size_t n, size_t grain, cm_pool_task_fn_t fn, void *arg);

/* A process-wide default pool, created on first use with the threads set by
 * cm_pool_default_set_threads (default: the CPU count).  Never destroyed
 * before exit. */
cm_pool_t *cm_pool_default(void);

/* Size of the default pool, the caller included (0 = the CPU count); call
 * once at start-up, before the pool's first use (programs pass their
 * --threads / RI_THREADS setting, see cm_runtime.h).  RI_ERR_BUSY when the
 * pool already runs with another size (it is left as it is). */
ri_status_t cm_pool_default_set_threads(unsigned threads);

/* Number of online CPUs (>= 1). */
unsigned cm_cpu_count(void);

#endif /* CM_THREAD_H */
