/*
 * The memory bandwidth reference a memory-bound figure is compared with,
 * measured beside the work it judges: one sample is a timed streaming read of
 * a 256 MiB buffer (hugepages, far larger than any L3) by the same thread pool
 * that runs the work.  A bench takes one sample per round, interleaved with
 * its timed runs, and summarises them: a figure above the median by more than
 * the samples' own spread means the bytes are miscounted or came from a cache.
 */
#ifndef BN_BW_H
#define BN_BW_H

#include <stddef.h>

#include "common/cm_thread.h"

/* One timed pass, GB/s (1e9 bytes/s); NaN if the buffer cannot be had.  The
 * buffer is allocated and written on the first call (not timed). */
double bn_bw_sample(cm_pool_t *pool);

/* Summary of n samples: median, extremes, and the noise = the larger relative
 * distance of an extreme from the median, at least 5%. */
typedef struct bn_bw_ref {
    double median, min, max, noise;
    size_t samples;
} bn_bw_ref_t;

void bn_bw_summarise(const double *gbs, size_t n, bn_bw_ref_t *ref);

/* The largest figure the reference allows: median * (1 + noise). */
double bn_bw_ceiling(const bn_bw_ref_t *ref);

#endif /* BN_BW_H */
