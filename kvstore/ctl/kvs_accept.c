/*
 * The gRPC listener with a connection cap (see kvs_accept.h).  One thread
 * polls the listening sockets and a stop eventfd; accepting is rare (workers
 * keep their connection), so a linear table of open connections is plenty.
 */
#define _GNU_SOURCE
#include "kvstore/ctl/kvs_accept.h"

#include <errno.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <string.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include "common/cm_alloc.h"
#include "common/cm_log.h"
#include "common/cm_net.h"
#include "common/cm_status.h"
#include "common/cm_time.h"

static CM_ALLOC_TAG(kvs_accept_tag, "kvs.accept");

#define KVS_ACCEPT_MAX_LISTEN 4          /* addresses one host name may bind (v4 + v6 loopback, ...) */
#define KVS_ACCEPT_BACKLOG 128           /* a flood waits here only until the thread refuses it */
#define KVS_ACCEPT_RECHECK_NS 1000000000ull /* re-check the open connections at least this often */
#define KVS_ACCEPT_LOG_NS 1000000000ull  /* at most one refusal line per second */
#define KVS_ACCEPT_BURST 256             /* accepts per wake-up before looking at the stop fd again */
#define KVS_ACCEPT_FULL_RECHECK_NS 50000000ull /* at the cap, re-check at most this often (a flood costs
                                                  one pass over the table per 50 ms, not per connection) */

/* A connection handed over, identified by its socket (not just its number,
 * which the kernel reuses once the owner closes it). */
typedef struct kvs_accept_conn {
    int fd;
    dev_t dev;
    ino_t ino;
} kvs_accept_conn_t;

typedef enum kvs_accept_why {
    KVS_ACCEPT_CAP = 0,   /* max_conns reached */
    KVS_ACCEPT_FDS = 1,   /* no descriptor free (EMFILE, ENFILE) */
    KVS_ACCEPT_N_WHY
} kvs_accept_why_t;

static const char *const kvs_accept_why_names[KVS_ACCEPT_N_WHY] = {"max-connections", "fd-limit"};

struct kvs_accept {
    kvs_accept_config_t cfg;          /* copy; listen not kept */
    int lfd[KVS_ACCEPT_MAX_LISTEN];   /* listening sockets */
    unsigned n_lfd;
    int port;                         /* bound port */
    int stop_fd;                      /* eventfd: written by kvs_accept_stop */
    int reserve_fd;                   /* /dev/null, closed to make room for one accept at EMFILE; -1 = lost */
    pthread_t thread;
    bool started;                     /* thread running (until joined) */
    kvs_accept_conn_t *conns;         /* [max_conns], accept thread only */
    uint32_t n_conns;                 /* used entries of conns, accept thread only */
    uint64_t checked_ns;              /* last re-check of conns */
    _Atomic uint32_t open;            /* n_conns as the metrics see it */
    _Atomic uint64_t accepted;        /* handed over */
    _Atomic uint64_t refused[KVS_ACCEPT_N_WHY];
    uint64_t logged_ns;               /* last refusal line */
    uint64_t refused_logged;          /* refusals counted in that line */
};

/* Is the descriptor still the socket we handed over? */
static bool kvs_accept_conn_alive(const kvs_accept_conn_t *c)
{
    struct stat st;
    return fstat(c->fd, &st) == 0 && st.st_dev == c->dev && st.st_ino == c->ino;
}

/* Forget the connections whose owner has closed them. */
static void kvs_accept_recheck(kvs_accept_t *acc)
{
    uint32_t j = 0;
    for (uint32_t i = 0; i < acc->n_conns; i++)
        if (kvs_accept_conn_alive(&acc->conns[i]))
            acc->conns[j++] = acc->conns[i];
    acc->n_conns = j;
    acc->checked_ns = cm_time_ns();
    atomic_store(&acc->open, j);
}

/* Close a connection at once with a reset, so that the client learns now
 * (ECONNRESET, gRPC UNAVAILABLE) instead of waiting in a queue. */
static void kvs_accept_refuse(kvs_accept_t *acc, int fd, kvs_accept_why_t why)
{
    struct linger lg = {.l_onoff = 1, .l_linger = 0};
    (void)setsockopt(fd, SOL_SOCKET, SO_LINGER, &lg, sizeof(lg));
    close(fd);
    uint64_t total = atomic_fetch_add(&acc->refused[why], 1) + 1;
    for (int w = 0; w < KVS_ACCEPT_N_WHY; w++)
        if (w != (int)why)
            total += atomic_load(&acc->refused[w]);
    uint64_t now = cm_time_ns();
    if (acc->logged_ns != 0 && now - acc->logged_ns < KVS_ACCEPT_LOG_NS)
        return;
    if (why == KVS_ACCEPT_CAP)
        cm_warn("grpc: connection refused: %u connections open, the most allowed (max-connections=%u); "
                "%llu refused since the last line",
                acc->n_conns, acc->cfg.max_conns, (unsigned long long)(total - acc->refused_logged));
    else
        cm_warn("grpc: connection refused: no file descriptor free (%u gRPC connections open; raise ulimit -n "
                "or lower max-connections); %llu refused since the last line",
                acc->n_conns, (unsigned long long)(total - acc->refused_logged));
    acc->logged_ns = now;
    acc->refused_logged = total;
}

/* accept4() failed for want of a descriptor: the connection stays queued and
 * the listener stays readable, so give up the spare descriptor, take the
 * connection with it and refuse it.  Returns false when no spare was left
 * (then the caller backs off instead of spinning). */
static bool kvs_accept_shed(kvs_accept_t *acc, int lfd)
{
    if (acc->reserve_fd < 0)
        acc->reserve_fd = open("/dev/null", O_RDONLY | O_CLOEXEC);
    if (acc->reserve_fd < 0)
        return false;
    close(acc->reserve_fd);
    acc->reserve_fd = -1;
    int fd = accept4(lfd, NULL, NULL, SOCK_CLOEXEC);
    if (fd >= 0)
        kvs_accept_refuse(acc, fd, KVS_ACCEPT_FDS);
    acc->reserve_fd = open("/dev/null", O_RDONLY | O_CLOEXEC);
    return fd >= 0;
}

/* Admit or refuse one accepted connection. */
static void kvs_accept_one(kvs_accept_t *acc, int fd)
{
    struct stat st;
    if (acc->n_conns >= acc->cfg.max_conns && cm_time_ns() - acc->checked_ns >= KVS_ACCEPT_FULL_RECHECK_NS)
        kvs_accept_recheck(acc);
    if (acc->n_conns >= acc->cfg.max_conns) {
        kvs_accept_refuse(acc, fd, KVS_ACCEPT_CAP);
        return;
    }
    if (fstat(fd, &st) != 0) {
        cm_warn("grpc: fstat of an accepted connection: %s", strerror(errno));
        close(fd);
        return;
    }
    int one = 1;
    (void)setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one)); /* as gRPC's own listener does */
    /* Recorded before the hand-over: the new owner may close it at once. */
    acc->conns[acc->n_conns++] = (kvs_accept_conn_t){.fd = fd, .dev = st.st_dev, .ino = st.st_ino};
    atomic_store(&acc->open, acc->n_conns);
    atomic_fetch_add(&acc->accepted, 1);
    acc->cfg.fn(acc->cfg.arg, fd);
}

/* Accept what is queued on one listener.  Returns false when out of
 * descriptors with no spare (back off). */
static bool kvs_accept_drain(kvs_accept_t *acc, int lfd)
{
    for (int k = 0; k < KVS_ACCEPT_BURST; k++) {
        int fd = accept4(lfd, NULL, NULL, SOCK_NONBLOCK | SOCK_CLOEXEC);
        if (fd >= 0) {
            kvs_accept_one(acc, fd);
            continue;
        }
        switch (errno) {
        case EAGAIN:
            return true;
        case EMFILE:
        case ENFILE:
        case ENOBUFS:
        case ENOMEM:
            if (!kvs_accept_shed(acc, lfd))
                return false;
            continue;
        default:
            /* ECONNABORTED, EINTR, EPROTO and the network errors accept(2)
             * passes on from the new connection: that one is gone, the
             * listener is fine. */
            continue;
        }
    }
    return true;
}

static void *kvs_accept_thread(void *arg)
{
    kvs_accept_t *acc = arg;
    struct pollfd pf[KVS_ACCEPT_MAX_LISTEN + 1];
    bool backoff = false;

    for (;;) {
        unsigned n = 0;
        pf[n++] = (struct pollfd){.fd = acc->stop_fd, .events = POLLIN};
        /* Out of descriptors with no spare: leave the listeners alone for a
         * moment (they would wake us at once) and let descriptors free up. */
        for (unsigned i = 0; i < acc->n_lfd && !backoff; i++)
            pf[n++] = (struct pollfd){.fd = acc->lfd[i], .events = POLLIN};
        int timeout = backoff ? 100 : acc->n_conns > 0 ? (int)(KVS_ACCEPT_RECHECK_NS / 1000000u) : -1;
        int rc = poll(pf, n, timeout);
        if (rc < 0 && errno != EINTR) {
            cm_error("grpc: poll on the listener: %s", strerror(errno));
            break;
        }
        if (pf[0].revents != 0)
            break;
        backoff = false;
        if (acc->n_conns > 0 && cm_time_ns() - acc->checked_ns >= KVS_ACCEPT_RECHECK_NS)
            kvs_accept_recheck(acc);
        for (unsigned i = 1; i < n && rc > 0; i++)
            if (pf[i].revents != 0 && !kvs_accept_drain(acc, pf[i].fd))
                backoff = true;
    }
    return NULL;
}

/* Bind one listening socket to ai (port: the one chosen by an earlier bind,
 * or 0).  Returns the socket or -1 with errno set. */
static int kvs_accept_bind(const struct addrinfo *ai, int port)
{
    struct sockaddr_storage ss;
    int one = 1, fd;
    memcpy(&ss, ai->ai_addr, ai->ai_addrlen);
    if (port != 0 && ai->ai_family == AF_INET)
        ((struct sockaddr_in *)&ss)->sin_port = htons((uint16_t)port);
    else if (port != 0 && ai->ai_family == AF_INET6)
        ((struct sockaddr_in6 *)&ss)->sin6_port = htons((uint16_t)port);
    fd = socket(ai->ai_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    if (fd < 0)
        return -1;
    (void)setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
    if (ai->ai_family == AF_INET6)
        (void)setsockopt(fd, IPPROTO_IPV6, IPV6_V6ONLY, &one, sizeof(one)); /* v4 gets its own socket */
    if (bind(fd, (struct sockaddr *)&ss, ai->ai_addrlen) != 0 || listen(fd, KVS_ACCEPT_BACKLOG) != 0) {
        int e = errno;
        close(fd);
        errno = e;
        return -1;
    }
    return fd;
}

static int kvs_accept_bound_port(int fd)
{
    struct sockaddr_storage ss;
    socklen_t len = sizeof(ss);
    if (getsockname(fd, (struct sockaddr *)&ss, &len) != 0)
        return -1;
    if (ss.ss_family == AF_INET)
        return ntohs(((struct sockaddr_in *)&ss)->sin_port);
    return ntohs(((struct sockaddr_in6 *)&ss)->sin6_port);
}

/* Bind every address the host resolves to (as gRPC does for "localhost"). */
static ri_status_t kvs_accept_listen(kvs_accept_t *acc, const char *listen, char *err, size_t errlen)
{
    char host[256], port_s[16];
    unsigned port;
    struct addrinfo hints = {.ai_family = AF_UNSPEC, .ai_socktype = SOCK_STREAM, .ai_flags = AI_PASSIVE};
    struct addrinfo *res = NULL;
    int first_errno = 0;

    if (!cm_net_split(listen, host, sizeof(host), &port)) {
        snprintf(err, errlen, "grpc: listen '%s' is not host:port", listen);
        return RI_ERR_INVALID;
    }
    snprintf(port_s, sizeof(port_s), "%u", port);
    int gai = getaddrinfo(host, port_s, &hints, &res);
    if (gai != 0) {
        snprintf(err, errlen, "grpc: cannot resolve %s: %s", listen, gai_strerror(gai));
        return RI_ERR_INVALID;
    }
    for (const struct addrinfo *ai = res; ai != NULL && acc->n_lfd < KVS_ACCEPT_MAX_LISTEN; ai = ai->ai_next) {
        if (ai->ai_family != AF_INET && ai->ai_family != AF_INET6)
            continue;
        int fd = kvs_accept_bind(ai, acc->port > 0 ? acc->port : 0);
        if (fd < 0) {
            if (first_errno == 0)
                first_errno = errno;
            cm_debug("grpc: cannot listen on one address of %s: %s", listen, strerror(errno));
            continue;
        }
        if (acc->port <= 0)
            acc->port = kvs_accept_bound_port(fd);
        acc->lfd[acc->n_lfd++] = fd;
    }
    freeaddrinfo(res);
    if (acc->n_lfd == 0) {
        snprintf(err, errlen, "grpc: cannot listen on %s: %s", listen,
                 strerror(first_errno ? first_errno : EADDRNOTAVAIL));
        return RI_ERR_TRANSPORT;
    }
    return RI_OK;
}

ri_status_t kvs_accept_create(const kvs_accept_config_t *cfg, kvs_accept_t **acc_p, char *err, size_t errlen)
{
    ri_status_t st;
    kvs_accept_t *acc;

    if (cfg == NULL || cfg->listen == NULL || cfg->max_conns == 0 || cfg->fn == NULL) {
        snprintf(err, errlen, "grpc: bad listener configuration");
        return RI_ERR_INVALID;
    }
    acc = cm_calloc(&kvs_accept_tag, 1, sizeof(*acc));
    if (acc == NULL)
        goto err_nomem;
    acc->cfg = *cfg;
    acc->cfg.listen = NULL;
    acc->stop_fd = acc->reserve_fd = -1;
    acc->conns = cm_calloc(&kvs_accept_tag, cfg->max_conns, sizeof(*acc->conns));
    if (acc->conns == NULL)
        goto err_free;
    acc->stop_fd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
    acc->reserve_fd = open("/dev/null", O_RDONLY | O_CLOEXEC);
    if (acc->stop_fd < 0 || acc->reserve_fd < 0) {
        snprintf(err, errlen, "grpc: listener set-up: %s", strerror(errno));
        st = cm_status_from_errno(errno);
        goto err_close;
    }
    st = kvs_accept_listen(acc, cfg->listen, err, errlen);
    if (st != RI_OK)
        goto err_close;
    *acc_p = acc;
    return RI_OK;

err_close:
    if (acc->reserve_fd >= 0)
        close(acc->reserve_fd);
    if (acc->stop_fd >= 0)
        close(acc->stop_fd);
    cm_free(acc->conns);
    cm_free(acc);
    return st;
err_free:
    cm_free(acc);
err_nomem:
    snprintf(err, errlen, "grpc: out of memory");
    return RI_ERR_NOMEM;
}

ri_status_t kvs_accept_start(kvs_accept_t *acc)
{
    int rc = pthread_create(&acc->thread, NULL, kvs_accept_thread, acc);
    if (rc != 0) {
        cm_error("grpc: cannot start the accept thread: %s", strerror(rc));
        return cm_status_from_errno(rc);
    }
    acc->started = true;
    return RI_OK;
}

int kvs_accept_port(const kvs_accept_t *acc)
{
    return acc ? acc->port : -1;
}

void kvs_accept_stop(kvs_accept_t *acc)
{
    if (acc == NULL)
        return;
    if (acc->started) {
        uint64_t one = 1;
        if (write(acc->stop_fd, &one, sizeof(one)) != (ssize_t)sizeof(one))
            cm_warn("grpc: cannot wake the accept thread: %s", strerror(errno));
        pthread_join(acc->thread, NULL);
        acc->started = false;
    }
    for (unsigned i = 0; i < acc->n_lfd; i++)
        close(acc->lfd[i]);
    acc->n_lfd = 0;
}

void kvs_accept_destroy(kvs_accept_t *acc)
{
    if (acc == NULL)
        return;
    kvs_accept_stop(acc);
    if (acc->reserve_fd >= 0)
        close(acc->reserve_fd);
    close(acc->stop_fd);
    cm_free(acc->conns);
    cm_free(acc);
}

void kvs_accept_metrics_write(kvs_accept_t *acc, FILE *out)
{
    fprintf(out, "# HELP ri_kvs_grpc_connections gRPC client connections open (re-checked every second).\n");
    fprintf(out, "# TYPE ri_kvs_grpc_connections gauge\n");
    fprintf(out, "ri_kvs_grpc_connections %u\n", atomic_load(&acc->open));
    fprintf(out, "# HELP ri_kvs_grpc_connections_accepted_total gRPC client connections accepted.\n");
    fprintf(out, "# TYPE ri_kvs_grpc_connections_accepted_total counter\n");
    fprintf(out, "ri_kvs_grpc_connections_accepted_total %llu\n", (unsigned long long)atomic_load(&acc->accepted));
    fprintf(out, "# HELP ri_kvs_grpc_connections_refused_total gRPC client connections reset at once, by reason "
                 "(max-connections reached, no file descriptor free).\n");
    fprintf(out, "# TYPE ri_kvs_grpc_connections_refused_total counter\n");
    for (int w = 0; w < KVS_ACCEPT_N_WHY; w++)
        fprintf(out, "ri_kvs_grpc_connections_refused_total{reason=\"%s\"} %llu\n", kvs_accept_why_names[w],
                (unsigned long long)atomic_load(&acc->refused[w]));
}
