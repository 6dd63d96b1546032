/*
 * A tiny HTTP endpoint (libmicrohttpd, its own polling thread) that serves
 * one page: GET /metrics in Prometheus text format.  Scrapes come every few
 * seconds, so each one renders the page afresh.
 */
#ifndef KVS_HTTP_H
#define KVS_HTTP_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "retroinfer/status.h"

typedef struct kvs_http kvs_http_t;

/* Writes the page into out. */
typedef void (*kvs_http_render_fn_t)(void *arg, FILE *out);

/* Listen on "host:port" (numeric IPv4 or IPv6 host; port 0 = ephemeral).
 * render is called from the HTTP thread.  Caller destroys with kvs_http_destroy. */
ri_status_t kvs_http_start(const char *listen, kvs_http_render_fn_t render, void *arg, kvs_http_t **http_p,
                           char *err, size_t errlen);

/* The bound port. */
int kvs_http_port(const kvs_http_t *http);

/* Connections shut because one request/response cycle took longer than the
 * bound (a client trickling its request). */
uint64_t kvs_http_overran(const kvs_http_t *http);

/* Stop the thread and free.  NULL is a no-op. */
void kvs_http_destroy(kvs_http_t *http);

#endif /* KVS_HTTP_H */
