/*
 * /metrics over HTTP with libmicrohttpd (see kvs_http.h).  Only GET /metrics
 * is served; everything else is 404/405.  Connections are few (a Prometheus
 * scraper and the odd curl), so limits are small.  libmicrohttpd's timeout is
 * an idle timeout, which a client sending one byte every few seconds never
 * trips: with 16 such clients scraping was shut out.  So a watchdog thread
 * also bounds each request/response cycle (KVS_HTTP_CYCLE_MS from the
 * connection's start or its last answer) and shuts the socket of a
 * connection that overruns it; libmicrohttpd then closes it.
 */
#define _GNU_SOURCE
#include "kvstore/ctl/kvs_http.h"

#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>

#include <microhttpd.h>

#include "common/cm_alloc.h"
#include "common/cm_log.h"
#include "common/cm_net.h"
#include "common/cm_status.h"
#include "common/cm_time.h"

static CM_ALLOC_TAG(kvs_http_tag, "kvs.http");

#define KVS_HTTP_MAX_CONN 16
#define KVS_HTTP_CYCLE_MS 3000

/* One open connection, as the watchdog sees it. */
typedef struct kvs_http_conn {
    bool used;
    int fd;                   /* owned by libmicrohttpd */
    uint64_t since_ns;        /* start of the current request/response cycle */
    bool shut;                /* already shut down by the watchdog */
} kvs_http_conn_t;

struct kvs_http {
    struct MHD_Daemon *mhd;       /* owned */
    kvs_http_render_fn_t render;  /* page writer */
    void *arg;                    /* its argument */
    int port;                     /* bound port */
    pthread_mutex_t mu;           /* guards conns and stop */
    pthread_cond_t cv;
    kvs_http_conn_t conns[KVS_HTTP_MAX_CONN + 4];
    bool stop;
    bool watchdog_started;
    pthread_t watchdog;
    _Atomic uint64_t overran;     /* connections shut for overrunning a cycle */
};

/* MHD_OPTION_NOTIFY_CONNECTION: track connections from start to close.  The
 * slot goes before libmicrohttpd closes the fd, so the watchdog never shuts
 * a reused descriptor. */
static void kvs_http_notify(void *cls, struct MHD_Connection *conn, void **socket_context,
                            enum MHD_ConnectionNotificationCode toe)
{
    kvs_http_t *http = cls;
    pthread_mutex_lock(&http->mu);
    if (toe == MHD_CONNECTION_NOTIFY_STARTED) {
        const union MHD_ConnectionInfo *ci = MHD_get_connection_info(conn, MHD_CONNECTION_INFO_CONNECTION_FD);
        *socket_context = NULL;
        for (size_t i = 0; ci != NULL && i < CM_ARRAY_LEN(http->conns); i++) {
            if (!http->conns[i].used) {
                http->conns[i] = (kvs_http_conn_t){.used = true, .fd = ci->connect_fd, .since_ns = cm_time_ns()};
                *socket_context = &http->conns[i];
                break;
            }
        }
    } else if (toe == MHD_CONNECTION_NOTIFY_CLOSED && *socket_context != NULL) {
        ((kvs_http_conn_t *)*socket_context)->used = false;
        *socket_context = NULL;
    }
    pthread_mutex_unlock(&http->mu);
}

/* A cycle ended (a response is queued): the next one starts now. */
static void kvs_http_cycle_done(kvs_http_t *http, struct MHD_Connection *conn)
{
    const union MHD_ConnectionInfo *ci = MHD_get_connection_info(conn, MHD_CONNECTION_INFO_SOCKET_CONTEXT);
    pthread_mutex_lock(&http->mu);
    if (ci != NULL && ci->socket_context != NULL)
        ((kvs_http_conn_t *)ci->socket_context)->since_ns = cm_time_ns();
    pthread_mutex_unlock(&http->mu);
}

static void *kvs_http_watchdog(void *arg)
{
    kvs_http_t *http = arg;
    pthread_mutex_lock(&http->mu);
    while (!http->stop) {
        uint64_t now = cm_time_ns();
        for (size_t i = 0; i < CM_ARRAY_LEN(http->conns); i++) {
            kvs_http_conn_t *c = &http->conns[i];
            if (c->used && !c->shut && now - c->since_ns > (uint64_t)KVS_HTTP_CYCLE_MS * 1000000u) {
                (void)shutdown(c->fd, SHUT_RDWR);
                c->shut = true;
                atomic_fetch_add(&http->overran, 1);
            }
        }
        struct timespec ts;
        clock_gettime(CLOCK_REALTIME, &ts);
        ts.tv_nsec += 200 * 1000000L;
        if (ts.tv_nsec >= 1000000000L) {
            ts.tv_sec++;
            ts.tv_nsec -= 1000000000L;
        }
        pthread_cond_timedwait(&http->cv, &http->mu, &ts);
    }
    pthread_mutex_unlock(&http->mu);
    return NULL;
}

uint64_t kvs_http_overran(const kvs_http_t *http)
{
    return http ? atomic_load(&((kvs_http_t *)http)->overran) : 0;
}

static enum MHD_Result kvs_http_answer(void *cls, struct MHD_Connection *conn, const char *url, const char *method,
                                       const char *version, const char *upload_data, size_t *upload_size,
                                       void **con_cls)
{
    kvs_http_t *http = cls;
    struct MHD_Response *resp;
    enum MHD_Result ret;
    unsigned code = MHD_HTTP_OK;
    char *page = NULL;
    size_t len = 0;
    (void)version, (void)upload_data, (void)upload_size, (void)con_cls;

    if (strcmp(method, "GET") != 0 && strcmp(method, "HEAD") != 0) {
        static const char msg[] = "only GET /metrics\n";
        resp = MHD_create_response_from_buffer(sizeof(msg) - 1, (void *)msg, MHD_RESPMEM_PERSISTENT);
        code = MHD_HTTP_METHOD_NOT_ALLOWED;
    } else if (strcmp(url, "/metrics") != 0) {
        static const char msg[] = "not found; try /metrics\n";
        resp = MHD_create_response_from_buffer(sizeof(msg) - 1, (void *)msg, MHD_RESPMEM_PERSISTENT);
        code = MHD_HTTP_NOT_FOUND;
    } else {
        FILE *out = open_memstream(&page, &len);
        if (out == NULL)
            return MHD_NO;
        http->render(http->arg, out);
        fclose(out);
        /* open_memstream's buffer comes from malloc: MHD frees it with free(). */
        resp = MHD_create_response_from_buffer(len, page, MHD_RESPMEM_MUST_FREE);
        if (resp == NULL)
            free(page);
    }
    if (resp == NULL)
        return MHD_NO;
    if (code == MHD_HTTP_OK)
        MHD_add_response_header(resp, "Content-Type", "text/plain; version=0.0.4; charset=utf-8");
    ret = MHD_queue_response(conn, code, resp);
    MHD_destroy_response(resp);
    kvs_http_cycle_done(http, conn);
    return ret;
}

ri_status_t kvs_http_start(const char *listen, kvs_http_render_fn_t render, void *arg, kvs_http_t **http_p,
                           char *err, size_t errlen)
{
    char host[256];
    unsigned port = 0;
    struct sockaddr_storage ss;
    unsigned flags = MHD_USE_INTERNAL_POLLING_THREAD | MHD_USE_POLL;

    bool v6 = false;
    ri_status_t pst = cm_net_parse_numeric(listen, &ss, host, sizeof(host), &port, &v6);
    if (pst == RI_ERR_INVALID) {
        snprintf(err, errlen, "metrics-listen '%s' is not host:port", listen);
        return RI_ERR_INVALID;
    }
    if (pst != RI_OK) {
        snprintf(err, errlen, "metrics-listen '%s': host must be a numeric IPv4 or IPv6 address", listen);
        return RI_ERR_INVALID;
    }
    if (v6)
        flags |= MHD_USE_IPv6;
    kvs_http_t *http = cm_calloc(&kvs_http_tag, 1, sizeof(*http));
    if (http == NULL) {
        snprintf(err, errlen, "metrics: out of memory");
        return RI_ERR_NOMEM;
    }
    http->render = render;
    http->arg = arg;
    pthread_mutex_init(&http->mu, NULL);
    pthread_cond_init(&http->cv, NULL);
    http->mhd = MHD_start_daemon(flags, (uint16_t)port, NULL, NULL, kvs_http_answer, http, MHD_OPTION_SOCK_ADDR,
                                 (struct sockaddr *)&ss, MHD_OPTION_CONNECTION_LIMIT, (unsigned)KVS_HTTP_MAX_CONN,
                                 MHD_OPTION_CONNECTION_TIMEOUT, (unsigned)10, MHD_OPTION_NOTIFY_CONNECTION,
                                 kvs_http_notify, http, MHD_OPTION_END);
    if (http->mhd == NULL) {
        snprintf(err, errlen, "metrics: cannot listen on %s (address in use?)", listen);
        kvs_http_destroy(http);
        return RI_ERR_TRANSPORT;
    }
    if (pthread_create(&http->watchdog, NULL, kvs_http_watchdog, http) != 0) {
        snprintf(err, errlen, "metrics: cannot start the watchdog thread");
        kvs_http_destroy(http);
        return RI_ERR_NOMEM;
    }
    http->watchdog_started = true;
    const union MHD_DaemonInfo *info = MHD_get_daemon_info(http->mhd, MHD_DAEMON_INFO_BIND_PORT);
    http->port = info ? (int)info->port : (int)port;
    *http_p = http;
    return RI_OK;
}

int kvs_http_port(const kvs_http_t *http)
{
    return http ? http->port : -1;
}

void kvs_http_destroy(kvs_http_t *http)
{
    if (http == NULL)
        return;
    if (http->watchdog_started) {
        pthread_mutex_lock(&http->mu);
        http->stop = true;
        pthread_cond_signal(&http->cv);
        pthread_mutex_unlock(&http->mu);
        pthread_join(http->watchdog, NULL);
    }
    if (http->mhd != NULL)
        MHD_stop_daemon(http->mhd);
    pthread_cond_destroy(&http->cv);
    pthread_mutex_destroy(&http->mu);
    cm_free(http);
}
