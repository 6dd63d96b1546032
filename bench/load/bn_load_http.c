/* The load bench's loopback HTTP client (see bn_load_http.h). */
#define _GNU_SOURCE
#include "bench/load/bn_load_http.h"

#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <stdio.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "common/cm_time.h"

/* Milliseconds left before deadline, at least 0. */
static int bl_http_ms_left(double deadline)
{
    double left = deadline - cm_time_s();
    return left <= 0 ? 0 : (int)(left * 1000) + 1;
}

/* Wait for events on fd until deadline; true when they came. */
static bool bl_http_wait(int fd, short events, double deadline)
{
    for (;;) {
        struct pollfd p = {.fd = fd, .events = events};
        int ms = bl_http_ms_left(deadline);
        int n = poll(&p, 1, ms);
        if (n > 0)
            return true;
        if (n == 0 || errno != EINTR)
            return false;
    }
}

/* src: the source address (network order), INADDR_ANY for the kernel's choice. */
static int bl_http_connect(int port, uint32_t src, double deadline)
{
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port)};
    struct sockaddr_in from = {.sin_family = AF_INET, .sin_addr.s_addr = src};
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    if (fd < 0)
        return -1;
    if (src != htonl(INADDR_ANY) && bind(fd, (struct sockaddr *)&from, sizeof(from)) != 0) {
        close(fd);
        return -1;
    }
    if (connect(fd, (struct sockaddr *)&a, sizeof(a)) == 0)
        return fd;
    int err = 0;
    socklen_t el = sizeof(err);
    if (errno != EINPROGRESS || !bl_http_wait(fd, POLLOUT, deadline) ||
        getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &el) != 0 || err != 0) {
        close(fd);
        return -1;
    }
    return fd;
}

int bl_http_send(int port, const char *req, size_t len, double deadline, bl_http_end_t *end_p)
{
    return bl_http_send_from(port, htonl(INADDR_ANY), req, len, deadline, end_p);
}

int bl_http_send_from(int port, uint32_t src, const char *req, size_t len, double deadline, bl_http_end_t *end_p)
{
    int fd = bl_http_connect(port, src, deadline);
    size_t off = 0;
    if (fd < 0) {
        *end_p = BL_HTTP_CONNECT;
        return -1;
    }
    while (off < len) {
        ssize_t n = send(fd, req + off, len - off, MSG_NOSIGNAL);
        if (n > 0) {
            off += (size_t)n;
            continue;
        }
        if (n < 0 && errno == EINTR)
            continue;
        if (n < 0 && errno == EAGAIN && bl_http_wait(fd, POLLOUT, deadline))
            continue;
        *end_p = n < 0 && errno == EAGAIN ? BL_HTTP_TIMEOUT : BL_HTTP_CLOSED;
        close(fd);
        return -1;
    }
    return fd;
}

/* Re-scan the reply for its status, events and markers. */
static void bl_http_scan(bl_http_reply_t *r)
{
    int st = 0;
    if (sscanf(r->buf, "HTTP/1.%*d %d", &st) == 1)
        r->status = st;
    r->events = 0;
    for (const char *p = strstr(r->buf, "data: "); p != NULL; p = strstr(p + 6, "data: ")) {
        r->events++;
        if (strncmp(p + 6, "[DONE]", 6) == 0)
            r->done = true;
        else if (strncmp(p + 6, "{\"error\"", 8) == 0)
            r->error_event = true;
    }
}

void bl_http_read(int fd, double deadline, size_t stop_events, bl_http_reply_t *r)
{
    r->end = BL_HTTP_TIMEOUT;
    r->status = 0;
    r->events = 0;
    r->done = r->error_event = false;
    r->len = 0;
    r->buf[0] = '\0';
    while (bl_http_wait(fd, POLLIN, deadline)) {
        if (r->len + 1 >= sizeof(r->buf)) {
            r->end = BL_HTTP_TOO_BIG;
            return;
        }
        ssize_t n = recv(fd, r->buf + r->len, sizeof(r->buf) - 1 - r->len, 0);
        if (n < 0 && (errno == EINTR || errno == EAGAIN))
            continue;
        if (n <= 0) {
            bl_http_scan(r);
            r->end = n == 0 && r->status != 0 ? BL_HTTP_OK : BL_HTTP_CLOSED;
            return;
        }
        r->len += (size_t)n;
        r->buf[r->len] = '\0';
        bl_http_scan(r);
        if (stop_events > 0 && r->events >= stop_events) {
            r->end = BL_HTTP_STOPPED;
            return;
        }
    }
}

void bl_http_close(int fd, bool abrupt)
{
    if (fd < 0)
        return;
    if (abrupt) {
        struct linger l = {.l_onoff = 1, .l_linger = 0};
        (void)setsockopt(fd, SOL_SOCKET, SO_LINGER, &l, sizeof(l));
    }
    close(fd);
}

void bl_http_exchange(int port, const char *req, size_t len, double deadline, bl_http_reply_t *r)
{
    bl_http_end_t end;
    int fd = bl_http_send(port, req, len, deadline, &end);
    if (fd < 0) {
        r->end = end;
        r->status = 0;
        r->events = 0;
        r->done = r->error_event = false;
        r->len = 0;
        r->buf[0] = '\0';
        return;
    }
    bl_http_read(fd, deadline, 0, r);
    bl_http_close(fd, false);
}

size_t bl_http_format(char *out, size_t cap, const char *method, const char *path, const char *api_key,
                      const char *body)
{
    char auth[600] = "";
    if (api_key != NULL && api_key[0] != '\0' &&
        snprintf(auth, sizeof(auth), "Authorization: Bearer %s\r\n", api_key) >= (int)sizeof(auth))
        return 0;
    int n = body != NULL
                ? snprintf(out, cap,
                           "%s %s HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n%sContent-Type: "
                           "application/json\r\nContent-Length: %zu\r\n\r\n%s",
                           method, path, auth, strlen(body), body)
                : snprintf(out, cap, "%s %s HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n%s\r\n", method,
                           path, auth);
    return n > 0 && (size_t)n < cap ? (size_t)n : 0;
}

const char *bl_http_end_str(bl_http_end_t e)
{
    static const char *const names[] = {"connect", "timeout", "closed", "too_big", "stopped", "ok"};
    return (unsigned)e < sizeof(names) / sizeof(names[0]) ? names[e] : "?";
}
