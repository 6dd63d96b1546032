/*
 * Connection guard of the HTTP service (see gw_http_guard.h): a table of
 * the connections holding a slot, filled when libmicrohttpd accepts one and
 * emptied when it closes it, and a reaper thread that shuts down the
 * sockets of connections whose request is past its deadline.  The table is
 * small (hundreds of slots), so admission scans it under one lock.
 */
#define _GNU_SOURCE
#include "gpuworker/server/gw_http_guard.h"

#include <netinet/in.h>
#include <pthread.h>
#include <stdbool.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>

#include "common/cm_alloc.h"
#include "common/cm_log.h"
#include "common/cm_status.h"
#include "common/cm_time.h"

static CM_ALLOC_TAG(gw_guard_tag, "worker.http.guard");

#define GW_GUARD_TICK_MS 100u /* the reaper's period: deadlines are this precise */

const char *const gw_guard_reason_name[GW_GUARD_N_REASONS] = {"request_deadline", "reserve_deadline", "evicted",
                                                              "refused"};

/* One connection holding a slot. */
typedef struct gw_slot {
    bool used;
    bool reserve;       /* on a reserve slot: short deadline */
    bool waiting;       /* its request has not arrived whole: the deadline runs */
    bool shut;          /* shut down by the guard: no longer holds a slot */
    MHD_socket fd;
    uint8_t addr[16];   /* client address: IPv4 in the first 4 bytes, or IPv6 */
    uint64_t since_ns;  /* the deadline counts from here */
} gw_slot_t;

struct gw_guard {
    gw_guard_cfg_t cfg;
    gw_slot_t *slots;   /* owned, n_slots */
    size_t n_slots;     /* max_conn + reserve: room for connections being closed */
    pthread_mutex_t lock;
    pthread_cond_t wake;
    bool stop;
    pthread_t reaper;
    uint64_t closed[GW_GUARD_N_REASONS];
};

static void gw_guard_addr(struct MHD_Connection *conn, uint8_t out[16])
{
    const union MHD_ConnectionInfo *ci = MHD_get_connection_info(conn, MHD_CONNECTION_INFO_CLIENT_ADDRESS);
    memset(out, 0, 16);
    if (ci == NULL || ci->client_addr == NULL)
        return;
    if (ci->client_addr->sa_family == AF_INET)
        memcpy(out, &((const struct sockaddr_in *)ci->client_addr)->sin_addr, 4);
    else if (ci->client_addr->sa_family == AF_INET6)
        memcpy(out, &((const struct sockaddr_in6 *)ci->client_addr)->sin6_addr, 16);
}

/* Shut down s's socket (lock held): its connection's thread sees the end
 * and closes it; the slot stays taken until libmicrohttpd says so. */
static void gw_guard_shut(gw_guard_t *g, gw_slot_t *s, gw_guard_reason_t why)
{
    shutdown(s->fd, SHUT_RDWR);
    s->shut = true;
    g->closed[why]++;
}

/* Admit a new connection (lock held): its slot, or NULL when none. */
static gw_slot_t *gw_guard_admit(gw_guard_t *g, MHD_socket fd, const uint8_t addr[16])
{
    unsigned regular = 0, reserve = 0, of_addr = 0;
    gw_slot_t *free_slot = NULL, *oldest = NULL;
    for (size_t i = 0; i < g->n_slots; i++) {
        gw_slot_t *s = &g->slots[i];
        if (!s->used) {
            free_slot = free_slot ? free_slot : s;
            continue;
        }
        if (s->shut)
            continue;
        if (s->reserve) {
            reserve++;
            if (s->waiting && (oldest == NULL || s->since_ns < oldest->since_ns))
                oldest = s;
        } else {
            regular++;
            of_addr += memcmp(s->addr, addr, 16) == 0;
        }
    }
    bool as_reserve = regular >= g->cfg.max_conn - g->cfg.reserve || of_addr >= g->cfg.per_addr;
    if (free_slot == NULL || (as_reserve && reserve >= g->cfg.reserve && oldest == NULL))
        return NULL;
    if (as_reserve && reserve >= g->cfg.reserve)
        gw_guard_shut(g, oldest, GW_GUARD_EVICTED);
    *free_slot = (gw_slot_t){.used = true, .reserve = as_reserve, .waiting = true, .fd = fd,
                             .since_ns = cm_time_ns()};
    memcpy(free_slot->addr, addr, 16);
    return free_slot;
}

void gw_guard_notify(void *cls, struct MHD_Connection *conn, void **socket_context,
                     enum MHD_ConnectionNotificationCode toe)
{
    gw_guard_t *g = cls;
    if (toe == MHD_CONNECTION_NOTIFY_CLOSED) {
        gw_slot_t *s = *socket_context;
        pthread_mutex_lock(&g->lock);
        if (s != NULL)
            s->used = false;
        pthread_mutex_unlock(&g->lock);
        *socket_context = NULL;
        return;
    }
    const union MHD_ConnectionInfo *ci = MHD_get_connection_info(conn, MHD_CONNECTION_INFO_CONNECTION_FD);
    if (ci == NULL)
        return;
    uint8_t addr[16];
    gw_guard_addr(conn, addr);
    pthread_mutex_lock(&g->lock);
    gw_slot_t *s = gw_guard_admit(g, ci->connect_fd, addr);
    if (s == NULL) {
        shutdown(ci->connect_fd, SHUT_RDWR);
        g->closed[GW_GUARD_REFUSED]++;
    }
    pthread_mutex_unlock(&g->lock);
    *socket_context = s;
}

/* conn's slot (under g->lock), NULL when it has none. */
static gw_slot_t *gw_guard_slot(struct MHD_Connection *conn)
{
    const union MHD_ConnectionInfo *ci = MHD_get_connection_info(conn, MHD_CONNECTION_INFO_SOCKET_CONTEXT);
    return ci != NULL ? ci->socket_context : NULL;
}

void gw_guard_arrived(gw_guard_t *g, struct MHD_Connection *conn)
{
    pthread_mutex_lock(&g->lock);
    gw_slot_t *s = gw_guard_slot(conn);
    if (s != NULL)
        s->waiting = false;
    pthread_mutex_unlock(&g->lock);
}

void gw_guard_answered(gw_guard_t *g, struct MHD_Connection *conn)
{
    pthread_mutex_lock(&g->lock);
    gw_slot_t *s = gw_guard_slot(conn);
    if (s != NULL) {
        s->waiting = true;
        s->since_ns = cm_time_ns();
    }
    pthread_mutex_unlock(&g->lock);
}

static void *gw_guard_reaper(void *arg)
{
    gw_guard_t *g = arg;
    pthread_mutex_lock(&g->lock);
    while (!g->stop) {
        struct timespec ts;
        clock_gettime(CLOCK_MONOTONIC, &ts);
        ts.tv_nsec += (long)GW_GUARD_TICK_MS * 1000000L;
        if (ts.tv_nsec >= 1000000000L) {
            ts.tv_sec++;
            ts.tv_nsec -= 1000000000L;
        }
        pthread_cond_timedwait(&g->wake, &g->lock, &ts);
        uint64_t now = cm_time_ns();
        for (size_t i = 0; i < g->n_slots && !g->stop; i++) {
            gw_slot_t *s = &g->slots[i];
            uint64_t limit_ns = (uint64_t)(s->reserve ? g->cfg.reserve_ms : g->cfg.request_ms) * 1000000ull;
            if (s->used && s->waiting && !s->shut && now - s->since_ns > limit_ns)
                gw_guard_shut(g, s, s->reserve ? GW_GUARD_RESERVE_DEADLINE : GW_GUARD_DEADLINE);
        }
    }
    pthread_mutex_unlock(&g->lock);
    return NULL;
}

ri_status_t gw_guard_create(const gw_guard_cfg_t *cfg, gw_guard_t **g_p)
{
    pthread_condattr_t ca;
    if (cfg->reserve == 0 || cfg->reserve >= cfg->max_conn || cfg->per_addr == 0 || cfg->request_ms == 0 ||
        cfg->reserve_ms == 0)
        return RI_ERR_INVALID;
    gw_guard_t *g = cm_calloc(&gw_guard_tag, 1, sizeof(*g));
    if (g == NULL)
        return RI_ERR_NOMEM;
    g->cfg = *cfg;
    g->n_slots = (size_t)cfg->max_conn + cfg->reserve;
    g->slots = cm_calloc(&gw_guard_tag, g->n_slots, sizeof(*g->slots));
    if (g->slots == NULL)
        goto err_free;
    pthread_mutex_init(&g->lock, NULL);
    pthread_condattr_init(&ca);
    pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
    pthread_cond_init(&g->wake, &ca);
    pthread_condattr_destroy(&ca);
    if (pthread_create(&g->reaper, NULL, gw_guard_reaper, g) != 0) {
        cm_error("http guard: cannot start the reaper thread");
        pthread_cond_destroy(&g->wake);
        pthread_mutex_destroy(&g->lock);
        cm_free(g->slots);
        cm_free(g);
        return RI_ERR_INTERNAL;
    }
    *g_p = g;
    return RI_OK;
err_free:
    cm_free(g);
    return RI_ERR_NOMEM;
}

void gw_guard_destroy(gw_guard_t *g)
{
    if (g == NULL)
        return;
    pthread_mutex_lock(&g->lock);
    g->stop = true;
    pthread_cond_signal(&g->wake);
    pthread_mutex_unlock(&g->lock);
    pthread_join(g->reaper, NULL);
    pthread_cond_destroy(&g->wake);
    pthread_mutex_destroy(&g->lock);
    cm_free(g->slots);
    cm_free(g);
}

unsigned gw_guard_mhd_limit(const gw_guard_t *g)
{
    return (unsigned)g->n_slots;
}

unsigned gw_guard_mhd_per_addr(const gw_guard_t *g)
{
    return g->cfg.per_addr + 2 * g->cfg.reserve; /* the reserve, and connections being closed */
}

void gw_guard_stats(gw_guard_t *g, gw_guard_stats_t *st_p)
{
    gw_guard_stats_t st = {0};
    pthread_mutex_lock(&g->lock);
    memcpy(st.closed, g->closed, sizeof(st.closed));
    for (size_t i = 0; i < g->n_slots; i++)
        if (g->slots[i].used && !g->slots[i].shut) {
            st.open++;
            st.reserve_open += g->slots[i].reserve;
        }
    pthread_mutex_unlock(&g->lock);
    *st_p = st;
}
