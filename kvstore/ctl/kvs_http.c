/*
 * /metrics over HTTP with libmicrohttpd (see kvs_http.h).  Only GET /metrics
 * is served; everything else is 404/405.  Connections are few (a Prometheus
 * scraper and the odd curl), so limits are small.
 */
#define _GNU_SOURCE
#include "kvstore/ctl/kvs_http.h"

#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>

#include <microhttpd.h>

#include "common/cm_alloc.h"
#include "common/cm_log.h"
#include "common/cm_net.h"

static CM_ALLOC_TAG(kvs_http_tag, "kvs.http");

struct kvs_http {
    struct MHD_Daemon *mhd;       /* owned */
    kvs_http_render_fn_t render;  /* page writer */
    void *arg;                    /* its argument */
    int port;                     /* bound port */
};

bool kvs_http_split_addr(const char *addr, char *host, size_t hostlen, unsigned *port_p)
{
    return cm_net_split(addr, host, hostlen, port_p);
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
    return ret;
}

ri_status_t kvs_http_start(const char *listen, kvs_http_render_fn_t render, void *arg, kvs_http_t **http_p,
                           char *err, size_t errlen)
{
    char host[256];
    unsigned port;
    struct sockaddr_storage ss;
    unsigned flags = MHD_USE_INTERNAL_POLLING_THREAD | MHD_USE_POLL;

    memset(&ss, 0, sizeof(ss));
    if (!kvs_http_split_addr(listen, host, sizeof(host), &port)) {
        snprintf(err, errlen, "metrics-listen '%s' is not host:port", listen);
        return RI_ERR_INVALID;
    }
    struct sockaddr_in *sin = (struct sockaddr_in *)&ss;
    struct sockaddr_in6 *sin6 = (struct sockaddr_in6 *)&ss;
    if (inet_pton(AF_INET, host, &sin->sin_addr) == 1) {
        sin->sin_family = AF_INET;
        sin->sin_port = htons((uint16_t)port);
    } else if (inet_pton(AF_INET6, host, &sin6->sin6_addr) == 1) {
        sin6->sin6_family = AF_INET6;
        sin6->sin6_port = htons((uint16_t)port);
        flags |= MHD_USE_IPv6;
    } else {
        snprintf(err, errlen, "metrics-listen '%s': host must be a numeric IPv4 or IPv6 address", listen);
        return RI_ERR_INVALID;
    }
    kvs_http_t *http = cm_calloc(&kvs_http_tag, 1, sizeof(*http));
    if (http == NULL) {
        snprintf(err, errlen, "metrics: out of memory");
        return RI_ERR_NOMEM;
    }
    http->render = render;
    http->arg = arg;
    http->mhd = MHD_start_daemon(flags, (uint16_t)port, NULL, NULL, kvs_http_answer, http, MHD_OPTION_SOCK_ADDR,
                                 (struct sockaddr *)&ss, MHD_OPTION_CONNECTION_LIMIT, (unsigned)16,
                                 MHD_OPTION_CONNECTION_TIMEOUT, (unsigned)10, MHD_OPTION_END);
    if (http->mhd == NULL) {
        snprintf(err, errlen, "metrics: cannot listen on %s (address in use?)", listen);
        cm_free(http);
        return RI_ERR_TRANSPORT;
    }
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
    MHD_stop_daemon(http->mhd);
    cm_free(http);
}
