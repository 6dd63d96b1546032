/*
 * Starting and stopping the UCX data plane of ri-kvstore: one ucp context
 * (AM + RMA) with the pool registered once, and N lanes (kvs_dp_lane.h),
 * each a ucp worker with its own serving thread and address.  No listener:
 * the addresses are handed out by CreateSession and Health only.  UCX is
 * kept on the interface of dp_listen_addr (and on its port when it names
 * one), so a loopback daemon opens nothing beyond loopback.
 */
#include "kvstore/data/kvs_dp_lane.h"

#include <arpa/inet.h>
#include <ifaddrs.h>
#include <stdio.h>
#include <string.h>

#include "common/cm_alloc.h"
#include "common/cm_log.h"
#include "common/cm_net.h"
#include "common/cm_status.h"
#include "common/cm_ucx.h"

static CM_ALLOC_TAG(kvs_dp_setup_tag, "kvs.dp");

ri_status_t kvs_dp_status(ucs_status_t s)
{
    return cm_ucx_status(s);
}

/* Same address?  (IPv4 or IPv6, port ignored.) */
static bool kvs_dp_same_ip(const struct sockaddr *a, const struct sockaddr_storage *b)
{
    if (a == NULL || a->sa_family != b->ss_family)
        return false;
    if (a->sa_family == AF_INET)
        return ((const struct sockaddr_in *)a)->sin_addr.s_addr == ((const struct sockaddr_in *)b)->sin_addr.s_addr;
    if (a->sa_family == AF_INET6)
        return memcmp(&((const struct sockaddr_in6 *)a)->sin6_addr, &((const struct sockaddr_in6 *)b)->sin6_addr,
                      sizeof(struct in6_addr)) == 0;
    return false;
}

/* Keep UCX's own network interfaces (its TCP transport listens on every
 * device it uses) on the interface of the configured data-plane address:
 * 127.0.0.1 must not open a port on the external interface.  A wildcard
 * address, or UCX_NET_DEVICES set by the user, leaves UCX's choice. */
static void kvs_dp_config_devices(kvs_dp_t *dp, ucp_config_t *config, const struct sockaddr_storage *ss,
                                  const char *host)
{
    struct ifaddrs *ifs = NULL;
    char dev[IF_NAMESIZE + 1] = "";
    if (dp->cfg.user_net_devices != NULL || cm_net_host_is_wildcard(host) || getifaddrs(&ifs) != 0)
        return;
    for (struct ifaddrs *i = ifs; i != NULL && dev[0] == '\0'; i = i->ifa_next)
        if (kvs_dp_same_ip(i->ifa_addr, ss))
            snprintf(dev, sizeof(dev), "%s", i->ifa_name);
    freeifaddrs(ifs);
    if (dev[0] == '\0') {
        cm_warn("dp: no interface has address %s; UCX picks its network devices", host);
        return;
    }
    if (ucp_config_modify(config, "NET_DEVICES", dev) != UCS_OK) {
        cm_warn("dp: could not restrict UCX to interface %s", dev);
    } else {
        cm_info("dp: UCX network devices restricted to %s (the interface of %s)", dev, host);
        snprintf(dp->net_dev, sizeof(dp->net_dev), "%s", dev);
    }
}

/* The port of dp_listen_addr, when it names one, is where UCX's TCP
 * transport listens (a firewall can then name it): the port and the next
 * lanes-1 ports, one per lane; 0 leaves it to UCX.  A transport setting:
 * only the environment reaches it in UCX 1.13, so the program sets it
 * (kvs_data_ucx_port_range), and a value the user set wins. */
bool kvs_dp_port_range(const char *listen_addr, uint32_t lanes, char *out, size_t cap)
{
    char host[128];
    unsigned port = 0;
    uint32_t n = lanes ? CM_MIN(lanes, KVS_DP_MAX_LANES) : 2; /* as kvs_dp_start counts them */
    int w;

    if (listen_addr == NULL || !cm_net_split(listen_addr, host, sizeof(host), &port) || port == 0)
        return false;
    w = snprintf(out, cap, "%u-%u", port, port + n - 1);
    return w > 0 && (size_t)w < cap;
}

/* A worker killed with -9 closes no connection: UCX notices it only by its
 * keepalive (every 20 s by default; over shared memory it looks the peer's
 * process up), and only then does the session's lease start to run.  Check
 * at least twice per lease period, so that a dead worker's session goes
 * within about 1.5 leases of its death.  A value the user set wins. */
static void kvs_dp_config_keepalive(ucp_config_t *config, uint32_t lease_ms, const char *user_keepalive)
{
    char v[32];
    uint32_t ms = lease_ms / 2u;
    if (lease_ms == 0 || ms >= 20000u || user_keepalive != NULL)
        return;
    snprintf(v, sizeof(v), "%ums", ms < 100u ? 100u : ms);
    if (ucp_config_modify(config, "KEEPALIVE_INTERVAL", v) != UCS_OK)
        cm_warn("dp: could not set UCX's keepalive interval to %s: dead workers are noticed after 20 s", v);
}

/* A lane's address in text form (w->address). */
static ri_status_t kvs_dp_publish_address(kvs_dpw_t *w)
{
    ucp_address_t *a = NULL;
    size_t len = 0;
    ri_status_t st;
    ucs_status_t s = ucp_worker_get_address(w->worker, &a, &len);
    if (s != UCS_OK)
        return kvs_dp_status(s);
    st = cm_dp_addr_format(a, len, w->address, sizeof(w->address));
    if (st != RI_OK)
        cm_error("dp: the UCX worker address takes %zu bytes, more than the %u a worker accepts", len,
                 CM_DP_MAX_WORKER_ADDR);
    ucp_worker_release_address(w->worker, a);
    return st;
}

/* Create lane i's worker, handler and address (not its thread). */
static ri_status_t kvs_dp_lane_open(kvs_dp_t *dp, uint32_t i)
{
    kvs_dpw_t *w = &dp->lanes[i];
    ucp_am_handler_param_t ah = {0};
    ucs_status_t s;
    ri_status_t st;

    w->dp = dp;
    w->index = i;
    w->efd = -1;
    st = cm_ucx_worker(dp->ctx, &w->worker, &w->efd);
    if (st != RI_OK) {
        w->worker = NULL;
        return st;
    }
    if (w->efd < 0)
        cm_warn("dp: no UCX event fd; idle lane %u sleeps in 100 us steps", i);
    ah.field_mask = UCP_AM_HANDLER_PARAM_FIELD_ID | UCP_AM_HANDLER_PARAM_FIELD_CB | UCP_AM_HANDLER_PARAM_FIELD_ARG |
                    UCP_AM_HANDLER_PARAM_FIELD_FLAGS;
    ah.id = CM_DP_AM_REQUEST;
    ah.cb = kvs_dp_am_cb;
    ah.arg = w;
    ah.flags = UCP_AM_FLAG_PERSISTENT_DATA;
    s = ucp_worker_set_am_recv_handler(w->worker, &ah);
    if (s != UCS_OK)
        return kvs_dp_status(s);
    st = kvs_dp_publish_address(w);
    return st;
}

static void kvs_dp_lane_close(kvs_dpw_t *w)
{
    if (w->worker == NULL)
        return;
    kvs_dp_lane_drain(w);
    ucp_worker_destroy(w->worker);
    w->worker = NULL;
    kvs_dp_lane_free_replies(w);
    cm_free(w->stage);
}

/* The ucp context (no RMA: cm_ucx.h); dp->ctx on success. */
static ri_status_t kvs_dp_context(kvs_dp_t *dp, const struct sockaddr_storage *ss, const char *host)
{
    ucp_config_t *config = NULL;
    ri_status_t st;

    /* Kept in dp->tls too: the address checker (kvs_dp_check.c) gets it in
     * its environment, so that it unpacks workers' addresses with the
     * transports we use. */
    cm_ucx_tls_no_shm(dp->cfg.user_tls, dp->tls, sizeof(dp->tls));
    st = cm_ucx_status(ucp_config_read(NULL, NULL, &config));
    if (st != RI_OK)
        goto err;
    st = cm_ucx_status(ucp_config_modify(config, "TLS", dp->tls));
    if (st != RI_OK) {
        ucp_config_release(config);
        goto err;
    }
    kvs_dp_config_devices(dp, config, ss, host);
    kvs_dp_config_keepalive(config, dp->cfg.lease_ms, dp->cfg.user_keepalive);
    st = cm_ucx_context("ri-kvstore", config, false, &dp->ctx);
    ucp_config_release(config);
    if (st != RI_OK)
        goto err;
    return RI_OK;
err:
    cm_error("dp: UCX start failed on %s: %s", dp->cfg.listen_addr, ri_status_str(st));
    return st == RI_ERR_BUSY ? RI_ERR_BUSY : RI_ERR_TRANSPORT;
}

ri_status_t kvs_dp_start(const kvs_dp_config_t *cfg, const kvs_handlers_t *h, kvs_dp_t **dp_p)
{
    kvs_dp_t *dp;
    struct sockaddr_storage ss;
    socklen_t sl;
    char host[128];
    uint32_t i;
    ri_status_t st;

    dp = cm_calloc(&kvs_dp_setup_tag, 1, sizeof(*dp));
    if (dp == NULL)
        return RI_ERR_NOMEM;
    dp->h = *h;
    dp->cfg = *cfg;
    snprintf(dp->listen_addr, sizeof(dp->listen_addr), "%s", cfg->listen_addr ? cfg->listen_addr : "127.0.0.1:0");
    dp->cfg.listen_addr = dp->listen_addr;
    dp->ho_fd = -1;
    snprintf(dp->check_program, sizeof(dp->check_program), "%s", cfg->check_program ? cfg->check_program : "");
    dp->max_body = cfg->max_msg_bytes;
    dp->n_lanes = cfg->lanes ? CM_MIN(cfg->lanes, KVS_DP_MAX_LANES) : 2;
    atomic_init(&dp->stop, false);
    atomic_init(&dp->n_conns, 0);
    dp->lanes = cm_calloc(&kvs_dp_setup_tag, dp->n_lanes, sizeof(*dp->lanes));
    if (dp->lanes == NULL) {
        st = RI_ERR_NOMEM;
        goto err_free;
    }
    if (cm_net_resolve(dp->cfg.listen_addr, true, &ss, &sl, host, sizeof(host)) != RI_OK) {
        st = RI_ERR_INVALID;
        cm_error("dp: bad interface address '%s'", dp->cfg.listen_addr);
        goto err_free;
    }
    st = kvs_dp_context(dp, &ss, host);
    if (st != RI_OK)
        goto err_free;
    for (i = 0; i < dp->n_lanes; i++) {
        st = kvs_dp_lane_open(dp, i);
        if (st != RI_OK) {
            cm_error("dp: lane %u: %s", i, ri_status_str(st));
            goto err_lanes;
        }
    }
    /* before the lanes run: a MAP reads its name (without it, no direct
     * regions: workers stay two-sided) */
    (void)kvs_dp_handover_start(dp);
    for (i = 0; i < dp->n_lanes; i++) {
        if (pthread_create(&dp->lanes[i].thread, NULL, kvs_dp_lane_main, &dp->lanes[i]) != 0) {
            st = RI_ERR_NOMEM;
            goto err_threads;
        }
        dp->lanes[i].thread_started = true;
    }
    cm_info("dp: %u lane(s) serving (no listener; workers connect to the address CreateSession gives)", dp->n_lanes);
    *dp_p = dp;
    return RI_OK;

err_threads:
    kvs_dp_stop(dp);
err_lanes:
    for (i = 0; i < dp->n_lanes; i++)
        kvs_dp_lane_close(&dp->lanes[i]);
    ucp_cleanup(dp->ctx);
err_free:
    cm_free(dp->lanes);
    cm_free(dp);
    return st;
}

void kvs_dp_stop(kvs_dp_t *dp)
{
    if (dp == NULL)
        return;
    atomic_store(&dp->stop, true);
    for (uint32_t i = 0; i < dp->n_lanes; i++)
        if (dp->lanes[i].thread_started)
            ucp_worker_signal(dp->lanes[i].worker); /* wake it from poll */
    for (uint32_t i = 0; i < dp->n_lanes; i++) {
        kvs_dpw_t *w = &dp->lanes[i];
        if (!w->thread_started)
            continue;
        pthread_join(w->thread, NULL);
        w->thread_started = false;
    }
    kvs_dp_handover_stop(dp); /* after the lanes: no MAP reads its name any more */
}

void kvs_dp_free(kvs_dp_t *dp)
{
    if (dp == NULL)
        return;
    kvs_dp_stop(dp);
    for (uint32_t i = 0; i < dp->n_lanes; i++)
        kvs_dp_lane_close(&dp->lanes[i]);
    ucp_cleanup(dp->ctx);
    cm_free(dp->lanes);
    cm_free(dp);
}

const char *kvs_dp_address(const kvs_dp_t *dp, uint64_t session_id)
{
    return dp->lanes[session_id % dp->n_lanes].address;
}

uint32_t kvs_dp_lanes(const kvs_dp_t *dp)
{
    return dp->n_lanes;
}

kvs_xport_t kvs_dp_xport(kvs_dp_t *dp)
{
    static const kvs_xport_ops_t ops = {.region_alloc = kvs_dp_region_alloc, .region_free = kvs_dp_region_free,
                                        .handover_name = kvs_dp_handover_name};
    return (kvs_xport_t){.ops = &ops, .handle = dp};
}
