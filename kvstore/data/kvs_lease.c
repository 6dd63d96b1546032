/*
 * Session leases: a session whose worker has neither a data-plane connection
 * nor sent a KeepAlive for cfg.lease_ms is dropped, as DropSession would, and
 * counted (ri_kvs_sessions_expired_total).  Without this, every client that
 * dies without DropSession (kill -9, a crashed host) leaves its session and
 * its quota behind for ever, and a tenant's crashes add up to its session
 * limit.
 *
 * The rule (docs/kvstore.md "Session leases"): an open data-plane connection
 * holds the session; the lease runs from CreateSession until the first
 * CONNECT, from the last connection's close, and from start-up for sessions
 * --recover brought back (their workers re-attach within it).  KeepAlive
 * renews it for clients that hold a session without a connection.
 *
 * One reaper thread wakes a few times per lease period (at most once every
 * second) and walks the session table under data->lock: at most 4096
 * entries, a few microseconds.
 */
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <string.h>
#include <time.h>

#include "common/cm_log.h"
#include "common/cm_time.h"
#include "kvstore/data/kvs_internal.h"

/* How often the reaper looks: a quarter of the lease, between 50 ms and 1 s,
 * so a session goes at most a quarter lease (or a second) after it expired. */
static uint64_t kvs_lease_tick_ns(const kvs_data_t *data)
{
    uint64_t tick_ms = data->cfg.lease_ms / 4u;
    tick_ms = tick_ms < 50u ? 50u : tick_ms > 1000u ? 1000u : tick_ms;
    return tick_ms * 1000000u;
}

/* Drop every session whose lease ran out; lock held, released for each
 * drop's disk work (spill records, session manifest), so the scan starts
 * over after each drop. */
static void kvs_lease_reap_locked(kvs_data_t *data, uint64_t now_ns)
{
    uint64_t lease_ns = (uint64_t)data->cfg.lease_ms * 1000000u;
    for (uint32_t i = 0; i < data->n_sessions && !data->lease_stop;) {
        kvs_session_t *s = data->sessions[i];
        if (s->dp_conns > 0 || now_ns - s->lease_ns < lease_ns) {
            i++;
            continue;
        }
        uint64_t id = s->id, idle_ms = (now_ns - s->lease_ns) / 1000000u;
        char tenant[KVS_TENANT_MAX];
        snprintf(tenant, sizeof(tenant), "%s", s->tenant);
        kvs_tier_smf_t smf;
        uint64_t freed = kvs_session_remove_locked(data, i, &smf);
        data->sessions_expired++;
        pthread_mutex_unlock(&data->lock);
        (void)kvs_tier_smf_finish(data, &smf);
        pthread_mutex_lock(&data->lock);
        i = 0; /* the catalog may have changed meanwhile, with sessions newer than now_ns */
        now_ns = cm_time_ns();
        cm_warn("session %" PRIu64 " of tenant %s expired: no data-plane connection and no KeepAlive for %" PRIu64
                " ms (session-lease-ms=%u); dropped, %" PRIu64 " bytes freed",
                id, tenant, idle_ms, data->cfg.lease_ms, freed);
    }
}

static void *kvs_lease_main(void *arg)
{
    kvs_data_t *data = arg;
    uint64_t tick = kvs_lease_tick_ns(data);

    pthread_mutex_lock(&data->lock);
    while (!data->lease_stop) {
        struct timespec until;
        clock_gettime(CLOCK_MONOTONIC, &until);
        until.tv_sec += (time_t)(tick / 1000000000u);
        until.tv_nsec += (long)(tick % 1000000000u);
        if (until.tv_nsec >= 1000000000L) {
            until.tv_sec++;
            until.tv_nsec -= 1000000000L;
        }
        int e = pthread_cond_timedwait(&data->lease_cond, &data->lock, &until);
        if (e != 0 && e != ETIMEDOUT)
            cm_warn("lease: pthread_cond_timedwait: %d", e);
        if (!data->lease_stop)
            kvs_lease_reap_locked(data, cm_time_ns());
    }
    pthread_mutex_unlock(&data->lock);
    return NULL;
}

ri_status_t kvs_lease_start(kvs_data_t *data)
{
    pthread_condattr_t ca;
    uint64_t now = cm_time_ns();

    pthread_mutex_lock(&data->lock);
    for (uint32_t i = 0; i < data->n_sessions; i++)
        data->sessions[i]->lease_ns = now; /* recovered: their workers get a whole lease to re-attach */
    pthread_mutex_unlock(&data->lock);
    if (data->cfg.lease_ms == 0)
        return RI_OK;
    pthread_condattr_init(&ca);
    pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
    pthread_cond_init(&data->lease_cond, &ca);
    pthread_condattr_destroy(&ca);
    data->lease_stop = false;
    int e = pthread_create(&data->lease_thread, NULL, kvs_lease_main, data);
    if (e != 0) {
        cm_error("lease: cannot start the reaper thread: %s", strerror(e));
        pthread_cond_destroy(&data->lease_cond);
        return RI_ERR_NOMEM;
    }
    data->lease_running = true;
    cm_info("sessions without a data-plane connection or KeepAlive expire after %u ms", data->cfg.lease_ms);
    return RI_OK;
}

void kvs_lease_stop(kvs_data_t *data)
{
    if (!data->lease_running)
        return;
    pthread_mutex_lock(&data->lock);
    data->lease_stop = true;
    pthread_cond_signal(&data->lease_cond);
    pthread_mutex_unlock(&data->lock);
    pthread_join(data->lease_thread, NULL);
    pthread_cond_destroy(&data->lease_cond);
    data->lease_running = false;
}

void kvs_lease_conn_locked(kvs_data_t *data, uint64_t session_id, bool up)
{
    kvs_session_t *s = kvs_session_find_locked(data, session_id);
    if (s == NULL)
        return;
    if (up)
        s->dp_conns++;
    else if (s->dp_conns > 0)
        s->dp_conns--;
    s->lease_ns = cm_time_ns();
}

ri_status_t kvs_data_session_keepalive(kvs_data_t *data, const char *tenant, const uint64_t *ids, size_t n,
                                       uint32_t *renewed_p)
{
    uint32_t renewed = 0;
    uint64_t now = cm_time_ns();

    if (data == NULL || (ids == NULL && n > 0))
        return RI_ERR_INVALID;
    pthread_mutex_lock(&data->lock);
    for (size_t k = 0; k < n; k++) {
        kvs_session_t *s = kvs_session_find_locked(data, ids[k]);
        if (s == NULL || (tenant != NULL && strcmp(tenant, s->tenant) != 0))
            continue;
        s->lease_ns = now;
        renewed++;
    }
    pthread_mutex_unlock(&data->lock);
    if (renewed_p != NULL)
        *renewed_p = renewed;
    return RI_OK;
}
