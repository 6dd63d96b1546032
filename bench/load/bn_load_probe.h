/*
 * Two background threads of the load bench's worker mode: the /health
 * prober (one GET every 200 ms, every failure recorded with its latency) and
 * the slowloris connections (opened over the first half of the run, each
 * trickling one header byte every few seconds and never finishing; one the
 * server closes is reopened a trickle interval later, the way an attacker
 * keeps the pressure).  Both stop at their deadline; everything bounded.
 */
#ifndef BN_LOAD_PROBE_H
#define BN_LOAD_PROBE_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>

#include "bench/load/bn_load_http.h"

#define BL_PROBE_PERIOD_S 0.2

/* One failed probe. */
typedef struct bl_probe_fail {
    double t_s;          /* seconds since the prober started */
    double ms;           /* how long it took to fail */
    bl_http_end_t end;   /* how the exchange ended */
    int status;          /* its HTTP status (0 = none) */
} bl_probe_fail_t;

typedef struct bl_probe {
    /* set by the caller */
    int port;                 /* worker HTTP port on 127.0.0.1 */
    const char *api_key;      /* borrowed; NULL = none */
    double deadline;          /* stop probing at this cm_time_s */
    double timeout_s;         /* one probe's limit */
    /* results, read after bl_probe_join */
    double *lat_ms;           /* every probe's latency, n of cap */
    size_t n, cap;
    bl_probe_fail_t *fails;   /* every failure, n_fail of cap */
    size_t n_fail;
    /* private */
    pthread_t th;
    bl_http_reply_t *reply;
} bl_probe_t;

/* Start probing (allocates for the probes until p->deadline).  0, or -1
 * (message printed; nothing to join). */
int bl_probe_start(bl_probe_t *p);

/* Wait for the prober to reach its deadline.  Results stay until bl_probe_free. */
void bl_probe_join(bl_probe_t *p);
void bl_probe_free(bl_probe_t *p);

typedef struct bl_slow {
    /* set by the caller */
    int port;                 /* worker HTTP port on 127.0.0.1 */
    uint32_t src;             /* source address (network order), 0 = the kernel's choice */
    unsigned m;               /* connections to hold, at most BL_SLOW_MAX */
    double trickle_s;         /* one byte per connection this often */
    double deadline;          /* close everything at this cm_time_s */
    /* results, read after bl_slow_join */
    unsigned opened;          /* connections opened (reopens included) */
    unsigned connect_failed;  /* connects refused or not accepted in time */
    unsigned closed_by_server;/* connections the server closed or reset */
    unsigned held_end;        /* open at the deadline */
    double oldest_s;          /* age of the oldest connection open at the deadline */
    /* private */
    pthread_t th;
} bl_slow_t;

#define BL_SLOW_MAX 4096

/* Start the slowloris thread.  0, or -1 (message printed). */
int bl_slow_start(bl_slow_t *s);
void bl_slow_join(bl_slow_t *s);

#endif /* BN_LOAD_PROBE_H */
