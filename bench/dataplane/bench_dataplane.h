/*
 * ri-bench-dataplane's shared workload constants and its concurrent-clients
 * part (bench_dataplane_clients.c).
 */
#ifndef BENCH_DATAPLANE_H
#define BENCH_DATAPLANE_H

#include <stddef.h>

#include "bench/common/bn_report.h"

#define BD_HEADS 8u
#define BD_DIM 128u
#define BD_PT 8u
#define BD_CTOK 16u
#define BD_PER_STEP 150u                     /* clusters per head per fetch */
#define BD_PAGE_BYTES (4u * BD_PT * BD_DIM)
#define BD_CLUSTER_BYTES (2u * BD_PAGE_BYTES)
#define BD_STEP_BYTES ((size_t)BD_HEADS * BD_PER_STEP * BD_CLUSTER_BYTES)

typedef struct bd_clients_result {
    double p50_us, p99_us;   /* over every fetch of every client */
    double gbs;              /* aggregate: all miss bytes / wall time of the concurrent phase */
    size_t bytes;            /* miss bytes per fetch */
} bd_clients_result_t;

/* Rows for each count in clients[0..n_clients): that many client processes
 * fetching from one ri-kvstore at once over transport (UCX_TLS=tls), iters
 * fetches each.  0, or a skip recorded in rep. */
int bd_run_clients(bn_report_t *rep, const char *transport, const char *tls, const int *clients, int n_clients,
                   int iters);

#endif /* BENCH_DATAPLANE_H */
