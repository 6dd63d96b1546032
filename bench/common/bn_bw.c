/* The bandwidth reference (see bn_bw.h). */
#define _GNU_SOURCE
#include "bench/common/bn_bw.h"

#include <math.h>
#include <stdint.h>
#include <sys/mman.h>

#include "bench/common/bn_report.h"
#include "common/cm_time.h"

#define BN_BW_BYTES ((size_t)256 << 20)
#define BN_BW_CHUNK ((size_t)1 << 20)
#define BN_BW_NOISE_FLOOR 0.05

static uint64_t *bn_bw_buf;           /* never freed: one per process */
static uint64_t bn_bw_sums[256];      /* keeps the reads from being optimised out */

static void bn_bw_task(void *arg, size_t begin, size_t end, unsigned worker)
{
    uint64_t a0 = 0, a1 = 0, a2 = 0, a3 = 0, a4 = 0, a5 = 0, a6 = 0, a7 = 0;
    (void)arg;
    for (size_t c = begin; c < end; c++) {
        const uint64_t *p = bn_bw_buf + c * (BN_BW_CHUNK / 8);
        for (size_t i = 0; i < BN_BW_CHUNK / 8; i += 8) {
            a0 += p[i];
            a1 += p[i + 1];
            a2 += p[i + 2];
            a3 += p[i + 3];
            a4 += p[i + 4];
            a5 += p[i + 5];
            a6 += p[i + 6];
            a7 += p[i + 7];
        }
    }
    bn_bw_sums[worker % 256] += a0 + a1 + a2 + a3 + a4 + a5 + a6 + a7;
}

double bn_bw_sample(cm_pool_t *pool)
{
    if (bn_bw_buf == NULL) {
        void *p = mmap(NULL, BN_BW_BYTES, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
        if (p == MAP_FAILED)
            return NAN;
        madvise(p, BN_BW_BYTES, MADV_HUGEPAGE);
        bn_bw_buf = p;
        for (size_t i = 0; i < BN_BW_BYTES / 8; i++)
            bn_bw_buf[i] = i * 2654435761u;
    }
    double t0 = cm_time_s();
    cm_pool_parallel_for(pool, BN_BW_BYTES / BN_BW_CHUNK, 8, bn_bw_task, NULL);
    return (double)BN_BW_BYTES / (cm_time_s() - t0) / 1e9;
}

void bn_bw_summarise(const double *gbs, size_t n, bn_bw_ref_t *ref)
{
    ref->samples = n;
    ref->median = bn_median(gbs, n);
    ref->min = bn_percentile(gbs, n, 0);
    ref->max = bn_percentile(gbs, n, 100);
    ref->noise = ref->median > 0 ? fmax((ref->max - ref->median) / ref->median,
                                        (ref->median - ref->min) / ref->median)
                                 : 0;
    if (ref->noise < BN_BW_NOISE_FLOOR)
        ref->noise = BN_BW_NOISE_FLOOR;
}

double bn_bw_ceiling(const bn_bw_ref_t *ref)
{
    return ref->median * (1 + ref->noise);
}
