/* The load bench's /health prober and slowloris connections (see bn_load_probe.h). */
#define _GNU_SOURCE
#include "bench/load/bn_load_probe.h"

#include <errno.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "common/cm_time.h"

/* ---- /health prober ---- */

static void bl_sleep_until(double t)
{
    double left = t - cm_time_s();
    if (left > 0)
        usleep((useconds_t)(left * 1e6));
}

static void *bl_probe_main(void *arg)
{
    bl_probe_t *p = arg;
    char req[1024];
    size_t len = bl_http_format(req, sizeof(req), "GET", "/health", p->api_key, NULL);
    double start = cm_time_s();
    while (p->n < p->cap) {
        double t0 = cm_time_s();
        if (t0 >= p->deadline)
            break;
        bl_http_exchange(p->port, req, len, t0 + p->timeout_s, p->reply);
        double ms = (cm_time_s() - t0) * 1000;
        p->lat_ms[p->n++] = ms;
        if ((p->reply->end != BL_HTTP_OK || p->reply->status != 200) && p->n_fail < p->cap)
            p->fails[p->n_fail++] = (bl_probe_fail_t){
                .t_s = t0 - start, .ms = ms, .end = p->reply->end, .status = p->reply->status};
        bl_sleep_until(t0 + BL_PROBE_PERIOD_S);
    }
    return NULL;
}

int bl_probe_start(bl_probe_t *p)
{
    double span = p->deadline - cm_time_s();
    p->cap = (size_t)(span > 0 ? span / BL_PROBE_PERIOD_S : 0) + 16;
    p->n = p->n_fail = 0;
    p->lat_ms = calloc(p->cap, sizeof(double));
    p->fails = calloc(p->cap, sizeof(bl_probe_fail_t));
    p->reply = malloc(sizeof(*p->reply));
    if (p->lat_ms == NULL || p->fails == NULL || p->reply == NULL ||
        pthread_create(&p->th, NULL, bl_probe_main, p) != 0) {
        fprintf(stderr, "ri bench load: cannot start the /health prober\n");
        bl_probe_free(p);
        return -1;
    }
    return 0;
}

void bl_probe_join(bl_probe_t *p)
{
    pthread_join(p->th, NULL);
}

void bl_probe_free(bl_probe_t *p)
{
    free(p->lat_ms);
    free(p->fails);
    free(p->reply);
    p->lat_ms = NULL;
    p->fails = NULL;
    p->reply = NULL;
}

/* ---- slowloris ---- */

#define BL_SLOW_TICK_S 0.1

static const char bl_slow_head[] = "GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Slow: ";

typedef struct bl_slow_conn {
    int fd;        /* -1 when closed */
    double opened; /* cm_time_s of the connect */
    double next;   /* next byte, or next reopen when closed */
} bl_slow_conn_t;

static void bl_slow_open(bl_slow_t *s, bl_slow_conn_t *c, double now)
{
    bl_http_end_t end;
    c->fd = bl_http_send_from(s->port, s->src, bl_slow_head, sizeof(bl_slow_head) - 1, now + 0.5, &end);
    if (c->fd < 0) {
        s->connect_failed++;
        c->next = now + s->trickle_s;
        return;
    }
    s->opened++;
    c->opened = now;
    c->next = now + s->trickle_s * (0.2 + 0.8 * (double)rand() / RAND_MAX); /* spread the trickles */
}

static void bl_slow_lost(bl_slow_t *s, bl_slow_conn_t *c, double now)
{
    close(c->fd);
    c->fd = -1;
    c->next = now + s->trickle_s;
    s->closed_by_server++;
}

/* Drain what the server sent; true when it closed the connection. */
static bool bl_slow_closed(int fd)
{
    char buf[512];
    for (int i = 0; i < 64; i++) {
        ssize_t n = recv(fd, buf, sizeof(buf), MSG_DONTWAIT);
        if (n == 0 || (n < 0 && errno != EAGAIN && errno != EINTR))
            return true;
        if (n < 0)
            return false;
    }
    return false;
}

/* One tick: open up to want connections, notice closed ones, trickle the due. */
static void bl_slow_tick(bl_slow_t *s, bl_slow_conn_t *cs, unsigned want, double now)
{
    for (unsigned i = 0; i < want; i++) {
        bl_slow_conn_t *c = &cs[i];
        if (c->fd < 0) {
            if (now >= c->next)
                bl_slow_open(s, c, now);
            continue;
        }
        struct pollfd pf = {.fd = c->fd, .events = POLLIN | POLLRDHUP};
        if (poll(&pf, 1, 0) > 0 && bl_slow_closed(c->fd)) {
            bl_slow_lost(s, c, now);
            continue;
        }
        if (now >= c->next) {
            if (send(c->fd, "a", 1, MSG_NOSIGNAL | MSG_DONTWAIT) != 1 && errno != EAGAIN) {
                bl_slow_lost(s, c, now);
                continue;
            }
            c->next = now + s->trickle_s;
        }
    }
}

static void *bl_slow_main(void *arg)
{
    bl_slow_t *s = arg;
    bl_slow_conn_t *cs = calloc(s->m, sizeof(*cs));
    double start = cm_time_s(), ramp = (s->deadline - start) / 2;
    if (cs == NULL)
        return NULL;
    for (unsigned i = 0; i < s->m; i++)
        cs[i].fd = -1;
    /* Bounded by the deadline and by a tick count. */
    for (unsigned tick = 0; tick < 10u * 3600u * 24u; tick++) {
        double now = cm_time_s();
        if (now >= s->deadline)
            break;
        double frac = ramp > 0 ? (now - start) / ramp : 1;
        unsigned want = frac >= 1 ? s->m : (unsigned)(s->m * frac);
        bl_slow_tick(s, cs, want, now);
        bl_sleep_until(now + BL_SLOW_TICK_S);
    }
    double now = cm_time_s();
    for (unsigned i = 0; i < s->m; i++) {
        if (cs[i].fd < 0)
            continue;
        s->held_end++;
        if (now - cs[i].opened > s->oldest_s)
            s->oldest_s = now - cs[i].opened;
        close(cs[i].fd);
    }
    free(cs);
    return NULL;
}

int bl_slow_start(bl_slow_t *s)
{
    s->opened = s->connect_failed = s->closed_by_server = s->held_end = 0;
    s->oldest_s = 0;
    if (s->m > BL_SLOW_MAX || pthread_create(&s->th, NULL, bl_slow_main, s) != 0) {
        fprintf(stderr, "ri bench load: cannot start the slowloris thread\n");
        return -1;
    }
    return 0;
}

void bl_slow_join(bl_slow_t *s)
{
    pthread_join(s->th, NULL);
}
