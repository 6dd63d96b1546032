/*
 * Connection guard of ri-worker's HTTP service (docs/worker.md "Security
 * and limits"): keeps slow or greedy clients from holding every connection
 * slot, so that /health and /metrics answer under a slowloris attack.
 *
 *  - a request (headers and body) must arrive within a deadline counted
 *    from the connection's accept, or from the end of its previous answer;
 *    a reaper thread shuts down the socket of a connection past it;
 *  - one client address holds at most per_addr regular connections;
 *  - the last `reserve` slots take any connection (the same address too)
 *    with a short deadline, enough for a /health probe; when they are all
 *    taken by connections still sending their request, a new connection
 *    evicts the oldest of them.  A connection that finds no slot at all is
 *    closed at once.
 *
 * Hooked into libmicrohttpd: gw_guard_notify is its connection callback,
 * gw_guard_arrived / gw_guard_answered are called by the request handler.
 * All functions are thread-safe.
 */
#ifndef GW_HTTP_GUARD_H
#define GW_HTTP_GUARD_H

#include <stdint.h>

#include <microhttpd.h>

#include "retroinfer/status.h"

typedef struct gw_guard gw_guard_t;

typedef struct gw_guard_cfg {
    unsigned max_conn;    /* connections at once, reserve included */
    unsigned reserve;     /* of max_conn, slots for short requests (< max_conn) */
    unsigned per_addr;    /* regular connections of one client address */
    uint32_t request_ms;  /* a request must arrive within this */
    uint32_t reserve_ms;  /* ... on a reserve slot */
} gw_guard_cfg_t;

/* Why the guard closed a connection (for /metrics). */
typedef enum gw_guard_reason {
    GW_GUARD_DEADLINE,         /* its request took longer than request_ms */
    GW_GUARD_RESERVE_DEADLINE, /* on a reserve slot, longer than reserve_ms */
    GW_GUARD_EVICTED,          /* a reserve slot taken back for a newer connection */
    GW_GUARD_REFUSED,          /* no slot at all */
    GW_GUARD_N_REASONS
} gw_guard_reason_t;

extern const char *const gw_guard_reason_name[GW_GUARD_N_REASONS];

typedef struct gw_guard_stats {
    uint64_t closed[GW_GUARD_N_REASONS];
    unsigned open;         /* connections holding a slot */
    unsigned reserve_open; /* of them, on reserve slots */
} gw_guard_stats_t;

/* Start the reaper.  Errors: RI_ERR_INVALID (reserve >= max_conn, a zero
 * limit), RI_ERR_NOMEM, RI_ERR_INTERNAL (no thread).  Caller frees with
 * gw_guard_destroy after the HTTP daemon stopped. */
ri_status_t gw_guard_create(const gw_guard_cfg_t *cfg, gw_guard_t **g_p);

/* Stop the reaper and free.  NULL is a no-op. */
void gw_guard_destroy(gw_guard_t *g);

/* The connection limits libmicrohttpd enforces before the guard sees a
 * connection (its own slots include connections being closed). */
unsigned gw_guard_mhd_limit(const gw_guard_t *g);
unsigned gw_guard_mhd_per_addr(const gw_guard_t *g);

/* MHD_OPTION_NOTIFY_CONNECTION callback; cls is the guard. */
void gw_guard_notify(void *cls, struct MHD_Connection *conn, void **socket_context,
                     enum MHD_ConnectionNotificationCode toe);

/* conn's request arrived whole: its deadline no longer runs. */
void gw_guard_arrived(gw_guard_t *g, struct MHD_Connection *conn);

/* conn's answer is done: the deadline of its next request starts now. */
void gw_guard_answered(gw_guard_t *g, struct MHD_Connection *conn);

void gw_guard_stats(gw_guard_t *g, gw_guard_stats_t *st_p);

#endif /* GW_HTTP_GUARD_H */
