/*
 * The load bench's HTTP/1.1 client for ri-worker on loopback: one request
 * per connection ("Connection: close"), read until EOF, a deadline or a
 * number of server-sent events; closed politely or abruptly (RST, the way a
 * crashed client leaves).  Plain sockets, because the bench must also do what
 * an HTTP library will not: stop mid-stream and reset the connection.
 * Replies are scanned as raw bytes (status line, "data: " event lines, the
 * "[DONE]" marker); the worker sends each event in one write.
 */
#ifndef BN_LOAD_HTTP_H
#define BN_LOAD_HTTP_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* How a request ended, worst first; BL_HTTP_OK means a complete reply. */
typedef enum bl_http_end {
    BL_HTTP_CONNECT,  /* no connection (refused, or not accepted in time) */
    BL_HTTP_TIMEOUT,  /* the deadline passed before the reply was complete */
    BL_HTTP_CLOSED,   /* the server closed or reset before a complete reply */
    BL_HTTP_TOO_BIG,  /* the reply outgrew the buffer */
    BL_HTTP_STOPPED,  /* the caller's event count was reached (stream still open) */
    BL_HTTP_OK,       /* EOF after a status line */
} bl_http_end_t;

#define BL_HTTP_BUF (256u << 10)

typedef struct bl_http_reply {
    bl_http_end_t end;   /* how it ended */
    int status;          /* HTTP status, 0 when no status line arrived */
    size_t events;       /* "data: " lines seen */
    bool done;           /* "data: [DONE]" seen */
    bool error_event;    /* an SSE event carrying "error" */
    size_t len;          /* bytes in buf */
    char buf[BL_HTTP_BUF]; /* the raw reply, NUL-terminated */
} bl_http_reply_t;

/* Connect to 127.0.0.1:port and send req (len bytes) before deadline
 * (cm_time_s clock).  Returns the socket (caller closes with
 * bl_http_close), or -1 with *end_p set to BL_HTTP_CONNECT or _CLOSED. */
int bl_http_send(int port, const char *req, size_t len, double deadline, bl_http_end_t *end_p);

/* bl_http_send from the source address src (network order; INADDR_ANY: the
 * kernel's choice), so that a test client can stand for another host: every
 * address of 127.0.0.0/8 is loopback. */
int bl_http_send_from(int port, uint32_t src, const char *req, size_t len, double deadline, bl_http_end_t *end_p);

/* Read the reply on fd into *r until EOF or deadline, or until stop_events
 * events arrived (0 = read to EOF).  Does not close fd. */
void bl_http_read(int fd, double deadline, size_t stop_events, bl_http_reply_t *r);

/* Close fd; abrupt = reset the connection (SO_LINGER 0) instead of a FIN. */
void bl_http_close(int fd, bool abrupt);

/* One whole exchange: send, read to EOF, close. */
void bl_http_exchange(int port, const char *req, size_t len, double deadline, bl_http_reply_t *r);

/* An HTTP request text into out (cap bytes): method, path, an optional
 * bearer key (NULL or "" = none), an optional JSON body.  Returns its
 * length, or 0 when it does not fit. */
size_t bl_http_format(char *out, size_t cap, const char *method, const char *path, const char *api_key,
                      const char *body);

/* Short name of an end, for tables and JSON. */
const char *bl_http_end_str(bl_http_end_t e);

#endif /* BN_LOAD_HTTP_H */
