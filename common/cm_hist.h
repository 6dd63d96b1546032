/*
 * Fixed-bucket histograms for /metrics: bounds chosen at init (a static
 * table of the caller's), lock-free adds from any thread, and the
 * Prometheus text form (_bucket{le=...} cumulative, _sum, _count).
 * Used for latencies and sizes that a daemon counts on its hot path.
 */
#ifndef CM_HIST_H
#define CM_HIST_H

#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#define CM_HIST_MAX_LE 16 /* bounds a histogram may have */

typedef struct cm_hist {
    const double *le;                          /* borrowed upper bounds, increasing (a static table) */
    size_t n_le;                               /* how many (at most CM_HIST_MAX_LE) */
    _Atomic uint64_t count[CM_HIST_MAX_LE + 1]; /* observations per bucket (not cumulative); [n_le] = above all */
    _Atomic double sum;                        /* sum of the observations */
} cm_hist_t;

/* An empty histogram over le [n_le] (borrowed for h's life; n_le at most
 * CM_HIST_MAX_LE, more are ignored). */
void cm_hist_init(cm_hist_t *h, const double *le, size_t n_le);

/* Count v in the first bucket whose bound is >= v (thread-safe). */
void cm_hist_add(cm_hist_t *h, double v);

/* Observations counted (every bucket). */
uint64_t cm_hist_count(const cm_hist_t *h);

/* A copy of src that later adds to src do not change (each field read
 * atomically; the copy as a whole is not one instant unless the caller
 * holds off the adds). */
void cm_hist_copy(cm_hist_t *dst, const cm_hist_t *src);

/* Write h as a Prometheus histogram called name: "# HELP"/"# TYPE" lines
 * first when help is not NULL (NULL: a further label set of a histogram
 * already introduced); labels (e.g. method="Open", NULL for none) go before
 * le in each bucket and on _sum and _count. */
void cm_hist_write_prom(const cm_hist_t *h, FILE *out, const char *name, const char *help, const char *labels);

#endif /* CM_HIST_H */
