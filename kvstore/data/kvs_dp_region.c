/*
 * Direct regions and their handover (common/cm_dp_direct.h).  A region is an
 * anonymous memory file (memfd_create): it has no name in any namespace
 * (nothing in /dev/shm or /proc/sysvipc/shm for another process to find and
 * attach), and the only ways to it are our own descriptor and mapping, which
 * the daemon's non-dumpable state keeps /proc/PID/fd and /proc/PID/map_files
 * from exposing (kvs_main.c), and the descriptors we pass to the session's
 * worker.  Its size is sealed (no shrink, no grow): a worker that maps it
 * can never be made to fault by the file shrinking under it.  And it is
 * sealed against new writers (F_SEAL_FUTURE_WRITE): only our own mapping,
 * made before the seal, writes; a worker can map it read-only and no other
 * way, whatever the descriptor's mode.
 *
 * The handover socket is a unix stream socket in the abstract namespace
 * under a random name that MAP tells the authenticated worker.  Abstract,
 * because such a name has no file: nothing to clobber or to leave behind
 * after a kill -9, no directory whose mode decides who may connect, and a
 * worker under any uid can reach it; the secret, not the socket's
 * permissions, is what admits a caller.  Random, because another process
 * cannot then bind our name first to collect secrets (and if one did, our
 * bind would fail and we would pick another).  One thread serves it, one
 * connection at a time, each with a short deadline: a request is one small
 * message and one answer.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <poll.h>
#include <stddef.h>
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include "common/cm_dp_direct.h"
#include "common/cm_log.h"
#include "common/cm_time.h"
#include "common/cm_wire.h"
#include "kvstore/data/kvs_dp_lane.h"

#define KVS_HO_DEADLINE_MS 1000 /* a connection's whole request, from accept */

ri_status_t kvs_dp_region_alloc(void *handle, uint64_t bytes, uint8_t **base_p, int *fd_p)
{
    kvs_dp_t *dp = handle;
    void *base;
    int fd, e;

    if (dp == NULL || bytes == 0 || bytes > (uint64_t)INT64_MAX)
        return RI_ERR_INVALID;
    if (dp->ho_fd < 0)
        return RI_ERR_UNSUPPORTED;
    fd = memfd_create("ri-region", MFD_CLOEXEC | MFD_ALLOW_SEALING);
    if (fd < 0) {
        e = errno;
        goto err_log;
    }
    if (ftruncate(fd, (off_t)bytes) != 0) {
        e = errno;
        goto err_close_fd;
    }
    base = mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (base == MAP_FAILED) {
        e = errno;
        goto err_close_fd;
    }
    /* Our mapping stays writable; no new one can be (FUTURE_WRITE: the
     * descriptor we pass on is read-write, the seal makes it read-only). */
    if (fcntl(fd, F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_FUTURE_WRITE | F_SEAL_SEAL) != 0) {
        e = errno;
        goto err_unmap;
    }
    *base_p = base;
    *fd_p = fd;
    return RI_OK;

err_unmap:
    munmap(base, bytes);
err_close_fd:
    close(fd);
err_log:
    cm_warn("dp: no direct region of %llu bytes: %s", (unsigned long long)bytes, strerror(e));
    return e == ENOMEM || e == ENOSPC ? RI_ERR_NOMEM : RI_ERR_UNSUPPORTED;
}

void kvs_dp_region_free(void *handle, uint8_t *base, uint64_t bytes, int fd)
{
    (void)handle;
    if (base == NULL)
        return;
    munmap(base, bytes);
    close(fd);
}

const char *kvs_dp_handover_name(void *handle)
{
    const kvs_dp_t *dp = handle;
    return dp != NULL && dp->ho_fd >= 0 ? dp->ho_name : "";
}

/* Read exactly len bytes before deadline_ns; false on EOF, error or time. */
static bool kvs_ho_read(int fd, uint8_t *buf, size_t len, uint64_t deadline_ns)
{
    size_t got = 0;

    while (got < len) {
        uint64_t now = cm_time_ns();
        struct pollfd p = {.fd = fd, .events = POLLIN};
        if (now >= deadline_ns || poll(&p, 1, (int)((deadline_ns - now) / 1000000u) + 1) <= 0)
            return false;
        ssize_t n = recv(fd, buf + got, len - got, MSG_DONTWAIT);
        if (n < 0 && (errno == EAGAIN || errno == EINTR))
            continue;
        if (n <= 0)
            return false;
        got += (size_t)n;
    }
    return true;
}

/* Answer st and bytes, with fd attached when fd >= 0. */
static void kvs_ho_reply(int conn, ri_status_t st, uint64_t bytes, int fd)
{
    uint8_t rep[CM_DP_HANDOVER_REP];
    union {
        char buf[CMSG_SPACE(sizeof(int))];
        struct cmsghdr align;
    } ctl;
    struct iovec iov = {.iov_base = rep, .iov_len = sizeof(rep)};
    struct msghdr msg = {.msg_iov = &iov, .msg_iovlen = 1};

    cm_dp_handover_rep_encode(rep, st, bytes);
    if (fd >= 0) {
        memset(&ctl, 0, sizeof(ctl));
        msg.msg_control = ctl.buf;
        msg.msg_controllen = sizeof(ctl.buf);
        struct cmsghdr *c = CMSG_FIRSTHDR(&msg);
        c->cmsg_level = SOL_SOCKET;
        c->cmsg_type = SCM_RIGHTS;
        c->cmsg_len = CMSG_LEN(sizeof(int));
        memcpy(CMSG_DATA(c), &fd, sizeof(int));
    }
    /* a caller that went away costs us nothing (no SIGPIPE, no wait) */
    if (sendmsg(conn, &msg, MSG_NOSIGNAL | MSG_DONTWAIT) != (ssize_t)sizeof(rep))
        cm_debug("dp: handover reply not sent: %s", strerror(errno));
}

/* One connection: the request, the check, the answer. */
static void kvs_ho_serve(kvs_dp_t *dp, int conn)
{
    uint8_t req[CM_DP_HANDOVER_REQ2];
    const uint8_t *secret;
    uint64_t sid = 0, bytes = 0, deadline = cm_time_ns() + KVS_HO_DEADLINE_MS * 1000000ull;
    uint32_t object = 0;
    size_t len;
    int fd = -1;
    ri_status_t st;

    /* The version (in the first part) says whether an object follows. */
    if (!kvs_ho_read(conn, req, CM_DP_HANDOVER_REQ, deadline))
        return; /* nothing complete in time: close without a word */
    len = cm_dp_handover_req_size(req);
    if (len > CM_DP_HANDOVER_REQ && !kvs_ho_read(conn, req + CM_DP_HANDOVER_REQ, len - CM_DP_HANDOVER_REQ, deadline))
        return;
    st = cm_dp_handover_req_decode(req, len != 0 ? len : CM_DP_HANDOVER_REQ, &sid, &secret, &object);
    if (st == RI_OK)
        st = dp->h.handover(dp->h.arg, sid, secret, object, &fd, &bytes);
    if (st != RI_OK) {
        cm_warn("dp: handover refused (session %" PRIu64 "): %s", sid, ri_status_str(st));
        kvs_ho_reply(conn, st, 0, -1);
        return;
    }
    kvs_ho_reply(conn, RI_OK, bytes, fd);
    close(fd);
}

static void *kvs_ho_main(void *arg)
{
    kvs_dp_t *dp = arg;

    for (;;) {
        struct pollfd p[2] = {{.fd = dp->ho_fd, .events = POLLIN}, {.fd = dp->ho_wake[0], .events = POLLIN}};
        if (poll(p, 2, -1) < 0) {
            if (errno == EINTR)
                continue;
            cm_error("dp: handover socket: poll: %s", strerror(errno));
            return NULL;
        }
        if (p[1].revents != 0)
            return NULL;
        int conn = accept4(dp->ho_fd, NULL, NULL, SOCK_CLOEXEC);
        if (conn < 0)
            continue; /* the caller left, or too many descriptors: next */
        kvs_ho_serve(dp, conn);
        close(conn);
    }
}

/* Bind a fresh random abstract name; fd on success. */
static int kvs_ho_bind(char *name, size_t cap)
{
    struct sockaddr_un sa = {.sun_family = AF_UNIX};
    uint8_t rnd[12];
    socklen_t len;
    /* non-blocking: a caller gone between poll and accept must not leave
     * the thread in accept, deaf to stop */
    int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);

    if (fd < 0)
        return -1;
    for (int tries = 0; tries < 4; tries++) {
        if (cm_random_bytes(rnd, sizeof(rnd)) != RI_OK)
            break;
        int n = snprintf(name, cap, "ri-kvstore-%ld-", (long)getpid());
        for (size_t i = 0; i < sizeof(rnd) && n > 0 && (size_t)n + 3 < cap; i++)
            n += snprintf(name + n, cap - (size_t)n, "%02x", rnd[i]);
        memcpy(sa.sun_path + 1, name, strlen(name)); /* sun_path[0] = 0: abstract */
        len = (socklen_t)(offsetof(struct sockaddr_un, sun_path) + 1 + strlen(name));
        if (bind(fd, (struct sockaddr *)&sa, len) == 0 && listen(fd, 64) == 0)
            return fd;
        if (errno != EADDRINUSE)
            break;
    }
    close(fd);
    return -1;
}

ri_status_t kvs_dp_handover_start(kvs_dp_t *dp)
{
    dp->ho_fd = kvs_ho_bind(dp->ho_name, sizeof(dp->ho_name));
    if (dp->ho_fd < 0) {
        cm_warn("dp: no handover socket (%s): workers on this host read two-sided", strerror(errno));
        return RI_ERR_UNSUPPORTED;
    }
    if (pipe2(dp->ho_wake, O_CLOEXEC) != 0)
        goto err_close_sock;
    if (pthread_create(&dp->ho_thread, NULL, kvs_ho_main, dp) != 0)
        goto err_close_pipe;
    dp->ho_started = true;
    cm_info("dp: direct regions handed over on the abstract unix socket @%s", dp->ho_name);
    return RI_OK;

err_close_pipe:
    close(dp->ho_wake[0]);
    close(dp->ho_wake[1]);
err_close_sock:
    close(dp->ho_fd);
    dp->ho_fd = -1;
    return RI_ERR_NOMEM;
}

void kvs_dp_handover_stop(kvs_dp_t *dp)
{
    if (!dp->ho_started)
        return;
    if (write(dp->ho_wake[1], "x", 1) != 1)
        cm_warn("dp: handover thread not woken: %s", strerror(errno));
    pthread_join(dp->ho_thread, NULL);
    dp->ho_started = false;
    close(dp->ho_wake[0]);
    close(dp->ho_wake[1]);
    close(dp->ho_fd);
    dp->ho_fd = -1;
}
