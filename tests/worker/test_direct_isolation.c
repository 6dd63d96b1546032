/*
 * A session's direct region reaches its own worker and nobody else.  Against
 * the real ri-kvstore running as its own uid (KVS_UID), with two tenants:
 *   - alice's worker, a process under another uid (ALICE_UID) in the
 *     kvstore's group, maps her region (handed over after she proved her
 *     secret) and reads her cluster in place: a worker of another uid gets
 *     direct reads on one host;
 *   - an attacker under bob's uid (BOB_UID, same group), holding bob's own
 *     session, looks for alice's cluster by every name a region could have
 *     and must fail for the reason the probe names (each its own exit
 *     status, so that a crash or a typo does not count as a pass):
 *       /proc/sysvipc/shm  no segment of the kvstore's uid is listed;
 *       /dev/shm           no file of the kvstore's uid;
 *       /proc/PID/maps     refused (the daemon is not dumpable), so its
 *                          mappings cannot be found or read via /proc/PID/mem;
 *       /proc/PID/fd       refused;
 *       /proc/PID/map_files refused;
 *       the handover socket (found in /proc/net/unix) with alice's session
 *                          id and bob's secret: RI_ERR_UNAUTHENTICATED, no
 *                          descriptor.
 *       a one-sided get over TCP at alice's cluster's address, through a
 *                          key bob packs himself: not answered (the
 *                          kvstore's UCX has no RMA);
 *   - positive controls, each path's: the same /proc probes run as root
 *     find alice's bytes (the region is there, and the probe would see
 *     it); the sysv and /dev/shm probes find alice's bytes in a segment and
 *     a file the test plants readable for them; the handover probe gets
 *     bob's own region with bob's secret (read-only: no writable mapping,
 *     no write through the descriptor); and over TCP (UCX_TLS=tcp,self)
 *     bob's worker fetches its own cluster two-sided; and the mutant run
 *     (test_direct_isolation_rma_mutant: RMA turned back on in the daemon
 *     by a preloaded ucp_init) must fail, alice's bytes coming back.
 *   - alice's secret does not connect to bob's session; the direct-read
 *     ops and the handover socket refuse bad input with a clear status (or
 *     a closed socket), changing nothing; a silent caller on the socket
 *     holds the next one a second at most.
 * Needs root (to run the daemon and the workers as other uids): exit 77
 * otherwise.
 *
 * Against the code before memfd regions (UCX-allocated regions, a dumpable
 * daemon offering UCX shared memory) this test failed in setup: alice's
 * worker, under another uid than the kvstore, could not connect its data
 * plane ("open(/proc/PID/fd/22) failed: Permission denied", UCX's posix
 * transport; a root worker got "shmat ... Permission denied").  With alice
 * given the kvstore's uid to get that far, the sysv probe run as bob (only
 * the kvstore's group in common) attached the kvstore's SysV segment and
 * found alice's cluster in it (exit 1, twice); there was no handover
 * socket to probe.
 */
#define _GNU_SOURCE
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <grp.h>
#include <inttypes.h>
#include <poll.h>
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ipc.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/shm.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <cmocka.h>

#include "common/cm_dp_direct.h"
#include "gpuworker/client/gw_ctl.h"
#include "gpuworker/client/gw_dp.h"
#include "kvs_test_daemon.h"

#define TOK_ALICE "tok-alice-0123456789abcdef"
#define TOK_BOB "tok-bob-0123456789abcdef00"
#define D 64
#define TOKENS 8                       /* one page */
#define PAGE_BYTES (4u * TOKENS * D)   /* K and V, fp16 */
#define SEED_ALICE 1
#define SEED_BOB 97
#define GROUP_GID 64200                /* the kvstore's group, its workers in it */
#define KVS_UID 64201
#define ALICE_UID 64202
#define BOB_UID 64203

/* What a probe found (its exit status). */
enum {
    P_LEAK = 1,           /* alice's bytes came back */
    P_USAGE = 2,
    P_CONTROL = 3,        /* a probe's own positive control failed */
    P_SYSV_NONE = 20,     /* no segment of the kvstore's uid listed */
    P_SYSV_DENIED = 21,   /* listed, every attach refused */
    P_SYSV_CLEAN = 22,    /* attached, none held alice's bytes */
    P_SHM_NONE = 30,      /* no /dev/shm file of the kvstore's uid */
    P_SHM_DENIED = 31,
    P_SHM_CLEAN = 32,
    P_MAPS_DENIED = 40,   /* /proc/PID/maps refused */
    P_MEM_DENIED = 41,    /* maps read, /proc/PID/mem refused */
    P_MAPS_CLEAN = 42,
    P_FD_DENIED = 50,     /* /proc/PID/fd refused */
    P_FD_OPEN_DENIED = 51,
    P_FD_CLEAN = 52,
    P_MF_DENIED = 60,     /* /proc/PID/map_files refused */
    P_MF_OPEN_DENIED = 61,
    P_MF_CLEAN = 62,
    P_HO_UNAUTH = 70,     /* the handover said RI_ERR_UNAUTHENTICATED, no descriptor */
    P_HO_OTHER = 71,      /* refused some other way */
    P_HO_CLEAN = 72,      /* a descriptor, but not alice's bytes */
    P_HO_WRITABLE = 73,   /* a worker could write its region */
    P_RMA_REFUSED = 80,   /* a one-sided get over TCP got no answer */
    P_RMA_CLEAN = 81,     /* it was answered, not with alice's bytes */
};

static kvs_test_daemon_t daemon_;
static const char *self_;
static const char *rma_mutant_;        /* preload that turns RMA on in the daemon (the mutant run) */
static pid_t alice_pid_;
static int alice_in_ = -1;             /* alice's stdin: she lives until it closes */
static uint64_t alice_sid_;

static void make_page(uint8_t *page, uint8_t seed)
{
    for (size_t i = 0; i < PAGE_BYTES; i++)
        page[i] = (uint8_t)(seed + i * 131u + (i >> 7));
}

static bool has_page(const void *mem, size_t len, const uint8_t *page)
{
    return len >= PAGE_BYTES && memmem(mem, len, page, PAGE_BYTES) != NULL;
}

/* Does the file (or memory file) behind fd hold page? */
static bool fd_has_page(int fd, const uint8_t *page)
{
    struct stat sb;
    bool found = false;
    void *p;

    if (fstat(fd, &sb) != 0 || !S_ISREG(sb.st_mode) || sb.st_size < (off_t)PAGE_BYTES)
        return false;
    p = mmap(NULL, (size_t)sb.st_size, PROT_READ, MAP_SHARED, fd, 0);
    if (p == MAP_FAILED)
        return false;
    found = has_page(p, (size_t)sb.st_size, page);
    munmap(p, (size_t)sb.st_size);
    return found;
}

/* --- the worker parts (each its own process, under its own uid) --- */

typedef struct party {
    gw_ctl_t *ctl;
    gw_ctl_session_t sess;
    gw_dp_t *dp;
    uint8_t page[PAGE_BYTES];
    uint8_t *local;
    uint64_t bytes, off;
} party_t;

/* Session, connection, MAP when map, one cluster uploaded (located when
 * mapped).  0, or the step that failed. */
static int party_setup(party_t *p, const char *grpc, const char *token, const char *label, uint8_t seed, bool map)
{
    gw_ctl_geometry_t g = {.layers = 1, .kv_heads = 1, .head_dim = D, .dtype = 1, .page_tokens = TOKENS};
    gw_ctl_error_t err;
    uint32_t head = 0, count = 1, tokens = TOKENS, first = 0;
    ri_status_t st;

    make_page(p->page, seed);
    if (gw_ctl_create(grpc, token, &p->ctl) != RI_OK ||
        gw_ctl_create_session(p->ctl, 5000, &g, 1024, label, &p->sess, &err) != RI_OK)
        return 10;
    st = gw_dp_connect(p->sess.dataplane_address, p->sess.session_id, p->sess.secret, NULL, &p->dp);
    if (st != RI_OK) {
        fprintf(stderr, "%s: data plane: %s\n", label, ri_status_str(st));
        return 11;
    }
    /* MAP first: the region must exist before the upload for it to land there. */
    if (map && (st = gw_dp_map(p->dp, &p->local, &p->bytes)) != RI_OK) {
        fprintf(stderr, "%s: MAP: %s\n", label, ri_status_str(st));
        return 12;
    }
    if (gw_dp_upload(p->dp, false, 0, 1, &head, &count, &tokens, p->page, PAGE_BYTES, &first) != RI_OK ||
        gw_dp_locate(p->dp, 0, 0, first, 1, &p->off) != RI_OK)
        return 13;
    if (map && (p->off == CM_DP_NOT_DIRECT || p->off > p->bytes - PAGE_BYTES ||
                memcmp(p->local + p->off, p->page, PAGE_BYTES) != 0))
        return 14;
    return 0;
}

/* alice: map her region, read her cluster in place, say READY, live until
 * stdin closes. */
static int alice_main(const char *grpc)
{
    party_t p = {0};
    char c;
    int rc = party_setup(&p, grpc, TOK_ALICE, "alice", SEED_ALICE, true);

    if (rc != 0)
        return rc;
    printf("READY %" PRIu64 " uid=%d region=%" PRIu64 "\n", p.sess.session_id, (int)getuid(), p.bytes);
    fflush(stdout);
    while (read(0, &c, 1) > 0)
        ;
    /* still hers after everything the attacker tried */
    rc = memcmp(p.local + p.off, p.page, PAGE_BYTES) == 0 ? 0 : 15;
    gw_dp_close(p.dp);
    gw_ctl_destroy(p.ctl);
    return rc;
}

/* Over TCP only: bob's own cluster, fetched two-sided. */
static int twosided_main(const char *grpc)
{
    static uint8_t recv[1u << 16];
    party_t p = {0};
    uint32_t cache, head = 0, n = 1, id = 0;
    gw_dp_fetch_result_t res = {0};
    cm_dp_entry_t en;
    int rc = party_setup(&p, grpc, TOK_BOB, "bob-tcp", SEED_BOB, false);

    if (rc != 0)
        return rc;
    if (gw_dp_register_cache(p.dp, 8, recv, sizeof(recv), &cache, NULL) != RI_OK ||
        gw_dp_fetch_ranked(p.dp, cache, 0, 1, &head, &n, &id, 0, 0, &res) != RI_OK || res.view.n_entries != 1)
        return 20;
    cm_dp_reply_entry(&res.view, 0, &en);
    rc = (en.flags & CM_DP_F_HIT) || en.recv_offset > sizeof(recv) - PAGE_BYTES ? 21
         : memcmp(recv + en.recv_offset, p.page, PAGE_BYTES) != 0                ? 22
                                                                                 : 0;
    printf("two-sided over TCP: bob's cluster %s\n", rc == 0 ? "came back" : "wrong");
    gw_dp_fetch_result_free(&res);
    gw_dp_close(p.dp);
    gw_ctl_destroy(p.ctl);
    return rc;
}

/* --- the probes (run as bob, or as root for the positive controls) --- */

static int probe_sysv(uid_t kvs_uid, const uint8_t *page)
{
    FILE *f = fopen("/proc/sysvipc/shm", "r");
    char line[512];
    int listed = 0, attached = 0;

    if (f == NULL)
        return P_USAGE;
    if (fgets(line, sizeof(line), f) == NULL) { /* the header */
        fclose(f);
        return P_USAGE;
    }
    while (fgets(line, sizeof(line), f) != NULL) {
        long key, id, perms, size, cpid, lpid, nattch, uid;
        if (sscanf(line, "%ld %ld %lo %ld %ld %ld %ld %ld", &key, &id, &perms, &size, &cpid, &lpid, &nattch, &uid) != 8)
            continue;
        listed += (uid_t)uid == kvs_uid;
        void *p = shmat((int)id, NULL, SHM_RDONLY);
        if (p == (void *)-1)
            continue;
        attached += (uid_t)uid == kvs_uid;
        bool found = has_page(p, (size_t)size, page);
        shmdt(p);
        if (found) {
            printf("sysv: segment %ld (uid %ld) holds alice's cluster\n", id, uid);
            fclose(f);
            return P_LEAK;
        }
    }
    fclose(f);
    return listed == 0 ? P_SYSV_NONE : attached == 0 ? P_SYSV_DENIED : P_SYSV_CLEAN;
}

static int probe_devshm(uid_t kvs_uid, const uint8_t *page)
{
    DIR *d = opendir("/dev/shm");
    struct dirent *e;
    int owned = 0, opened = 0, rc;

    if (d == NULL)
        return P_USAGE;
    while ((e = readdir(d)) != NULL) {
        struct stat sb;
        if (fstatat(dirfd(d), e->d_name, &sb, AT_SYMLINK_NOFOLLOW) != 0 || !S_ISREG(sb.st_mode))
            continue;
        owned += sb.st_uid == kvs_uid;
        int fd = openat(dirfd(d), e->d_name, O_RDONLY | O_CLOEXEC);
        if (fd < 0)
            continue;
        opened += sb.st_uid == kvs_uid;
        bool found = fd_has_page(fd, page);
        close(fd);
        if (found) {
            printf("/dev/shm/%s holds alice's cluster\n", e->d_name);
            closedir(d);
            return P_LEAK;
        }
    }
    closedir(d);
    rc = owned == 0 ? P_SHM_NONE : opened == 0 ? P_SHM_DENIED : P_SHM_CLEAN;
    return rc;
}

/* /proc/PID/maps, then /proc/PID/mem over every shared mapping. */
static int probe_maps(pid_t pid, const uint8_t *page)
{
    char path[64], line[512];
    FILE *f;
    int mem, rc = P_MAPS_CLEAN;

    snprintf(path, sizeof(path), "/proc/%d/maps", (int)pid);
    f = fopen(path, "r");
    if (f == NULL)
        return errno == EACCES || errno == EPERM ? P_MAPS_DENIED : P_USAGE;
    snprintf(path, sizeof(path), "/proc/%d/mem", (int)pid);
    mem = open(path, O_RDONLY | O_CLOEXEC);
    if (mem < 0) {
        fclose(f);
        return P_MEM_DENIED;
    }
    while (rc != P_LEAK && fgets(line, sizeof(line), f) != NULL) {
        unsigned long lo, hi;
        char perms[8];
        if (sscanf(line, "%lx-%lx %7s", &lo, &hi, perms) != 3 || perms[0] != 'r' || perms[3] != 's' ||
            hi - lo > (1ul << 30))
            continue;
        uint8_t *buf = malloc(hi - lo);
        if (buf != NULL && pread(mem, buf, hi - lo, (off_t)lo) == (ssize_t)(hi - lo) && has_page(buf, hi - lo, page)) {
            uint8_t *at = memmem(buf, hi - lo, page, PAGE_BYTES);
            printf("/proc/%d/mem at %sADDR:%lx\n", (int)pid, line, lo + (unsigned long)(at - buf));
            rc = P_LEAK;
        }
        free(buf);
    }
    close(mem);
    fclose(f);
    return rc;
}

/* /proc/PID/fd or /proc/PID/map_files: open every entry, look inside. */
static int probe_dir(pid_t pid, const char *which, const uint8_t *page, int denied, int open_denied, int clean)
{
    char path[128];
    DIR *d;
    struct dirent *e;
    int opened = 0, rc;

    snprintf(path, sizeof(path), "/proc/%d/%s", (int)pid, which);
    d = opendir(path);
    if (d == NULL)
        return errno == EACCES || errno == EPERM ? denied : P_USAGE;
    while ((e = readdir(d)) != NULL) {
        if (e->d_name[0] == '.')
            continue;
        int fd = openat(dirfd(d), e->d_name, O_RDONLY | O_CLOEXEC);
        if (fd < 0)
            continue;
        opened++;
        bool found = fd_has_page(fd, page);
        close(fd);
        if (found) {
            printf("/proc/%d/%s/%s holds alice's cluster\n", (int)pid, which, e->d_name);
            closedir(d);
            return P_LEAK;
        }
    }
    closedir(d);
    rc = opened == 0 ? open_denied : clean;
    return rc;
}

/* The kvstore's handover socket, as anyone finds it: /proc/net/unix. */
static int find_handover(pid_t kvs_pid, char *name, size_t cap)
{
    FILE *f = fopen("/proc/net/unix", "r");
    char line[512], want[64];
    int rc = -1;

    if (f == NULL)
        return -1;
    snprintf(want, sizeof(want), "@ri-kvstore-%d-", (int)kvs_pid);
    while (rc != 0 && fgets(line, sizeof(line), f) != NULL) {
        char *at = strstr(line, want);
        if (at != NULL) {
            snprintf(name, cap, "%s", at + 1);
            name[strcspn(name, "\n ")] = '\0';
            rc = 0;
        }
    }
    fclose(f);
    return rc;
}

/* One handover request; *fd_p = the descriptor received or -1. */
static ri_status_t handover(const char *name, uint64_t sid, const uint8_t *secret, int *fd_p)
{
    struct sockaddr_un sa = {.sun_family = AF_UNIX};
    uint8_t req[CM_DP_HANDOVER_REQ], rep[CM_DP_HANDOVER_REP];
    union {
        char buf[CMSG_SPACE(sizeof(int))];
        struct cmsghdr align;
    } ctl;
    struct iovec iov = {.iov_base = rep, .iov_len = sizeof(rep)};
    struct msghdr msg = {.msg_iov = &iov, .msg_iovlen = 1, .msg_control = ctl.buf, .msg_controllen = sizeof(ctl.buf)};
    uint64_t bytes;
    ri_status_t st = RI_ERR_IO;
    int s = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);

    *fd_p = -1;
    memcpy(sa.sun_path + 1, name, strlen(name));
    if (connect(s, (struct sockaddr *)&sa, (socklen_t)(offsetof(struct sockaddr_un, sun_path) + 1 + strlen(name))) != 0)
        goto out;
    cm_dp_handover_req_encode(req, sid, secret);
    if (send(s, req, sizeof(req), MSG_NOSIGNAL) != (ssize_t)sizeof(req) ||
        recvmsg(s, &msg, MSG_WAITALL | MSG_CMSG_CLOEXEC) != (ssize_t)sizeof(rep))
        goto out;
    struct cmsghdr *c = CMSG_FIRSTHDR(&msg);
    if (c != NULL && c->cmsg_type == SCM_RIGHTS)
        memcpy(fd_p, CMSG_DATA(c), sizeof(int));
    cm_dp_handover_rep_decode(rep, &st, &bytes);
out:
    close(s);
    return st;
}

/* As bob: his own region over the raw handover (the control), then alice's
 * session id with his secret. */
static int probe_handover(const char *grpc, pid_t kvs_pid, uint64_t alice_sid, const uint8_t *alice_page)
{
    party_t p = {0};
    char name[128];
    int fd = -1, rc = party_setup(&p, grpc, TOK_BOB, "bob", SEED_BOB, true);
    ri_status_t st;

    if (rc != 0) {
        fprintf(stderr, "bob's own session: step %d failed\n", rc);
        return P_CONTROL;
    }
    if (find_handover(kvs_pid, name, sizeof(name)) != 0)
        return P_CONTROL;
    st = handover(name, p.sess.session_id, p.sess.secret, &fd);
    if (st != RI_OK || fd < 0 || !fd_has_page(fd, p.page)) {
        fprintf(stderr, "bob's own handover: %s, fd %d\n", ri_status_str(st), fd);
        return P_CONTROL;
    }
    /* his own region, and read-only: no writable mapping, no write */
    void *w = mmap(NULL, PAGE_BYTES, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (w != MAP_FAILED || pwrite(fd, p.page, 1, 0) >= 0) {
        fprintf(stderr, "bob's region is writable through the descriptor he was given\n");
        return P_HO_WRITABLE;
    }
    close(fd);
    printf("bob gets his own region over @%s\n", name);
    st = handover(name, alice_sid, p.sess.secret, &fd);
    if (fd >= 0) {
        rc = fd_has_page(fd, alice_page) ? P_LEAK : P_HO_CLEAN;
        close(fd);
    } else {
        rc = st == RI_ERR_UNAUTHENTICATED ? P_HO_UNAUTH : P_HO_OTHER;
    }
    printf("alice's session with bob's secret: %s\n", ri_status_str(st));
    gw_dp_close(p.dp);
    gw_ctl_destroy(p.ctl);
    return rc;
}

/* As bob over TCP only: a one-sided get at alice's cluster's address in the
 * kvstore (RI_TEST_RADDR, found by root in /proc/PID/maps), through a key
 * bob packs for his own buffer. */
static int probe_rma(const char *grpc, const uint8_t *alice_page)
{
    static uint8_t buf[PAGE_BYTES];
    const char *raddr = getenv("RI_TEST_RADDR");
    party_t p = {0};
    ri_status_t st;
    int rc;

    if (raddr == NULL || party_setup(&p, grpc, TOK_BOB, "bob-rma", SEED_BOB, false) != 0)
        return P_CONTROL;
    st = gw_dp_forged_get(p.dp, strtoull(raddr, NULL, 16), buf, sizeof(buf), 2000);
    if (st == RI_OK) {
        rc = has_page(buf, sizeof(buf), alice_page) ? P_LEAK : P_RMA_CLEAN;
        printf("rma: %s\n", rc == P_LEAK ? "alice's cluster came back over TCP" : "answered with other bytes");
    } else {
        rc = P_RMA_REFUSED;
        printf("rma: a get at %s over TCP: %s\n", raddr, ri_status_str(st));
    }
    /* No close: UCX 1.13 asserts closing an endpoint with a cancelled get
     * on it; this process is done anyway. */
    fflush(stdout);
    _exit(rc);
}

/* --probe KIND KVS_PID KVS_UID GRPC ALICE_SID */
static int probe_main(char **argv)
{
    uint8_t page[PAGE_BYTES];
    const char *kind = argv[0];
    pid_t pid = (pid_t)atoi(argv[1]);
    uid_t kvs_uid = (uid_t)atoi(argv[2]);

    make_page(page, SEED_ALICE);
    if (strcmp(kind, "sysv") == 0)
        return probe_sysv(kvs_uid, page);
    if (strcmp(kind, "devshm") == 0)
        return probe_devshm(kvs_uid, page);
    if (strcmp(kind, "maps") == 0)
        return probe_maps(pid, page);
    if (strcmp(kind, "fd") == 0)
        return probe_dir(pid, "fd", page, P_FD_DENIED, P_FD_OPEN_DENIED, P_FD_CLEAN);
    if (strcmp(kind, "map_files") == 0)
        return probe_dir(pid, "map_files", page, P_MF_DENIED, P_MF_OPEN_DENIED, P_MF_CLEAN);
    if (strcmp(kind, "handover") == 0)
        return probe_handover(argv[3], pid, strtoull(argv[4], NULL, 10), page);
    if (strcmp(kind, "twosided") == 0)
        return twosided_main(argv[3]);
    if (strcmp(kind, "rma") == 0)
        return probe_rma(argv[3], page);
    return P_USAGE;
}

/* --- the test driver (root) --- */

static long long now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec * 1000ll + ts.tv_nsec / 1000000;
}

/* Start this binary with args as uid (-1: as we are); stdin_p (may be NULL)
 * gets a pipe to its stdin, its stdout+stderr come on *out_p. */
static pid_t spawn_as(uid_t uid, const char *const *args, int *stdin_p, int *out_p)
{
    int in[2], out[2];
    pid_t pid;

    if (pipe2(in, O_CLOEXEC) != 0 || pipe2(out, O_CLOEXEC) != 0)
        return -1;
    pid = fork();
    if (pid == 0) {
        if (uid != (uid_t)-1 && (setgroups(0, NULL) != 0 || setgid(GROUP_GID) != 0 || setuid(uid) != 0))
            _exit(126);
        prctl(PR_SET_PDEATHSIG, SIGKILL);
        dup2(in[0], 0);
        dup2(out[1], 1);
        dup2(out[1], 2);
        execv(self_, (char *const *)args);
        _exit(127);
    }
    close(in[0]);
    close(out[1]);
    if (stdin_p != NULL)
        *stdin_p = in[1];
    else
        close(in[1]);
    *out_p = out[0];
    return pid;
}

/* Read from fd into out until EOF, a line starting with stop (when not
 * NULL), or timeout_ms. */
static void read_out(int fd, char *out, size_t len, const char *stop, int timeout_ms)
{
    size_t got = 0;
    long long deadline = now_ms() + timeout_ms;

    out[0] = '\0';
    while (got + 1 < len && now_ms() < deadline) {
        struct pollfd p = {.fd = fd, .events = POLLIN};
        if (poll(&p, 1, (int)(deadline - now_ms())) <= 0)
            break;
        ssize_t n = read(fd, out + got, len - 1 - got);
        if (n <= 0)
            break;
        got += (size_t)n;
        out[got] = '\0';
        if (stop != NULL && strstr(out, stop) != NULL && strchr(strstr(out, stop), '\n') != NULL)
            break;
    }
}

/* Run a probe as uid (-1: root) with env ("NAME=VALUE" or NULL) added; its
 * exit status, its output in out when not NULL. */
static int probe_out(uid_t uid, const char *kind, const char *env, char *out, size_t len)
{
    char pid[16], kuid[16], sid[32];
    int fd, st;
    snprintf(pid, sizeof(pid), "%d", (int)daemon_.pid);
    snprintf(kuid, sizeof(kuid), "%d", KVS_UID);
    snprintf(sid, sizeof(sid), "%" PRIu64, alice_sid_);
    const char *args[] = {self_, "--probe", kind, pid, kuid, daemon_.grpc, sid, NULL};
    char name[64];
    snprintf(name, sizeof(name), "%.*s", env ? (int)strcspn(env, "=") : 0, env ? env : "");
    if (env != NULL)
        putenv((char *)env);
    pid_t child = spawn_as(uid, args, NULL, &fd);
    if (env != NULL)
        unsetenv(name);
    assert_true(child > 0);
    read_out(fd, out, len, NULL, 30000);
    close(fd);
    kill(child, SIGKILL);
    assert_int_equal(waitpid(child, &st, 0), child);
    printf("  probe %-9s as %-5s -> %d  %.300s%s", kind, uid == (uid_t)-1 ? "root" : "bob",
           WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st), out, out[0] == '\0' || out[strlen(out) - 1] != '\n' ? "\n" : "");
    return WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
}

static int probe(uid_t uid, const char *kind, const char *env)
{
    char out[8192];
    return probe_out(uid, kind, env, out, sizeof(out));
}

static int group_setup(void **state)
{
    char path[600], flag[700], out[1024];
    int rc, fd;
    (void)state;
    if (geteuid() != 0) {
        fprintf(stderr, "skipped: needs root to run the kvstore and its workers as other uids\n");
        exit(77);
    }
    unsetenv("UCX_TLS"); /* the defaults: what a deployment gets */
    if (kvs_test_daemon_prepare(&daemon_) != 0 ||
        kvs_test_daemon_write_file(&daemon_, "tokens", TOK_ALICE " alice\n" TOK_BOB " bob\n", path, sizeof(path)) != 0)
        return -1;
    snprintf(flag, sizeof(flag), "--tokens-file=%s", path);
    const char *extra[] = {flag, NULL};
    if (rma_mutant_ != NULL)
        setenv("LD_PRELOAD", rma_mutant_, 1); /* the daemon only: it is started before anyone else */
    rc = kvs_test_daemon_start_as(&daemon_, extra, KVS_UID, GROUP_GID, NULL);
    unsetenv("LD_PRELOAD");
    if (rc == 77) {
        fprintf(stderr, "skipped: no ri-kvstore\n");
        exit(77);
    }
    if (rc != 0)
        return -1;
    const char *args[] = {self_, "--alice", daemon_.grpc, NULL};
    alice_pid_ = spawn_as(ALICE_UID, args, &alice_in_, &fd);
    if (alice_pid_ <= 0)
        return -1;
    read_out(fd, out, sizeof(out), "READY", 30000);
    close(fd);
    if (sscanf(strstr(out, "READY") ? strstr(out, "READY") : "", "READY %" SCNu64, &alice_sid_) != 1) {
        fprintf(stderr, "alice (uid %d, the kvstore uid %d) did not get her region: %s\n", ALICE_UID, KVS_UID, out);
        return -1;
    }
    printf("alice, uid %d, reads her region in place (kvstore uid %d): %s", ALICE_UID, KVS_UID, out);
    return 0;
}

static int group_teardown(void **state)
{
    int st = -1;
    (void)state;
    if (alice_pid_ > 0) {
        close(alice_in_);
        waitpid(alice_pid_, &st, 0);
        if (!WIFEXITED(st) || WEXITSTATUS(st) != 0)
            fprintf(stderr, "alice ended with status %#x\n", st);
    }
    kvs_test_daemon_stop(&daemon_, 15, 5000);
    kvs_test_daemon_cleanup(&daemon_);
    return WIFEXITED(st) && WEXITSTATUS(st) == 0 ? 0 : -1;
}

static void test_proc_paths(void **state)
{
    (void)state;
    /* positive controls: root reaches the region through each, and the probe sees it */
    assert_int_equal(probe((uid_t)-1, "fd", NULL), P_LEAK);
    assert_int_equal(probe((uid_t)-1, "map_files", NULL), P_LEAK);
    assert_int_equal(probe((uid_t)-1, "maps", NULL), P_LEAK);
    /* bob: refused, the daemon is not dumpable */
    assert_int_equal(probe(BOB_UID, "fd", NULL), P_FD_DENIED);
    assert_int_equal(probe(BOB_UID, "map_files", NULL), P_MF_DENIED);
    assert_int_equal(probe(BOB_UID, "maps", NULL), P_MAPS_DENIED);
}

static void test_sysv_none(void **state)
{
    uint8_t page[PAGE_BYTES];
    int id;
    void *p;
    (void)state;
    /* positive control: a segment anyone may read, holding alice's bytes */
    make_page(page, SEED_ALICE);
    id = shmget(IPC_PRIVATE, PAGE_BYTES, IPC_CREAT | 0644);
    assert_true(id >= 0);
    p = shmat(id, NULL, 0);
    assert_true(p != (void *)-1);
    memcpy(p, page, PAGE_BYTES);
    shmdt(p);
    int planted = probe(BOB_UID, "sysv", NULL);
    shmctl(id, IPC_RMID, NULL);
    assert_int_equal(planted, P_LEAK);
    assert_int_equal(probe(BOB_UID, "sysv", NULL), P_SYSV_NONE);
    assert_int_equal(probe((uid_t)-1, "sysv", NULL), P_SYSV_NONE); /* nobody: it has no such name */
}

static void test_devshm_none(void **state)
{
    uint8_t page[PAGE_BYTES];
    char path[64];
    int fd;
    (void)state;
    make_page(page, SEED_ALICE);
    snprintf(path, sizeof(path), "/dev/shm/ri-test-plant-%d", (int)getpid());
    fd = open(path, O_CREAT | O_EXCL | O_WRONLY | O_CLOEXEC, 0644);
    if (fd < 0)
        skip(); /* no /dev/shm here */
    assert_int_equal(write(fd, page, PAGE_BYTES), PAGE_BYTES);
    close(fd);
    int planted = probe(BOB_UID, "devshm", NULL);
    unlink(path);
    assert_int_equal(planted, P_LEAK);
    assert_int_equal(probe(BOB_UID, "devshm", NULL), P_SHM_NONE);
}

static void test_handover_refuses_other_session(void **state)
{
    (void)state;
    assert_int_equal(probe(BOB_UID, "handover", NULL), P_HO_UNAUTH);
}

static void test_twosided_over_tcp(void **state)
{
    (void)state;
    assert_int_equal(probe(BOB_UID, "twosided", "UCX_TLS=tcp,self"), 0);
}

/* The kvstore's UCX context has no RMA, so a one-sided get a TCP peer
 * aims at alice's cluster (with a key of its own: over TCP UCX needs no
 * real one) is not answered.  Its positive control is the mutant run, RMA
 * turned back on in the daemon: alice's bytes come back. */
static void test_rma_over_tcp(void **state)
{
    char out[8192], env[64];
    const char *at;
    (void)state;
    assert_int_equal(probe_out((uid_t)-1, "maps", NULL, out, sizeof(out)), P_LEAK);
    at = strstr(out, "ADDR:");
    assert_non_null(at);
    snprintf(env, sizeof(env), "RI_TEST_RADDR=%.20s", at + 5);
    env[strcspn(env, "\n")] = '\0';
    putenv(env);
    int rc = probe(BOB_UID, "rma", "UCX_TLS=tcp,self");
    unsetenv("RI_TEST_RADDR");
    assert_int_equal(rc, P_RMA_REFUSED);
}

/* Connect to the handover socket, send len bytes of buf, read the answer
 * (status, or RI_ERR_IO when the kvstore closed without one); *fd_p gets a
 * descriptor or -1. */
static ri_status_t handover_raw(const char *name, const void *buf, size_t len, int *fd_p)
{
    struct sockaddr_un sa = {.sun_family = AF_UNIX};
    uint8_t rep[CM_DP_HANDOVER_REP];
    uint64_t bytes;
    ri_status_t st = RI_ERR_IO;
    int s = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);

    *fd_p = -1;
    memcpy(sa.sun_path + 1, name, strlen(name));
    if (connect(s, (struct sockaddr *)&sa, (socklen_t)(offsetof(struct sockaddr_un, sun_path) + 1 + strlen(name))) == 0 &&
        send(s, buf, len, MSG_NOSIGNAL) == (ssize_t)len && shutdown(s, SHUT_WR) == 0 &&
        recv(s, rep, sizeof(rep), MSG_WAITALL) == (ssize_t)sizeof(rep))
        cm_dp_handover_rep_decode(rep, &st, &bytes);
    close(s);
    return st;
}

/* Bad input on the handover socket: a clear refusal or a closed socket, no
 * descriptor, and the daemon goes on (a silent caller holds it 1 s at most). */
static void test_handover_bad_input(void **state)
{
    uint8_t junk[CM_DP_HANDOVER_REQ], req[CM_DP_HANDOVER_REQ], secret[CM_WIRE_SECRET_SIZE] = {0};
    struct sockaddr_un sa = {.sun_family = AF_UNIX};
    char name[128];
    int fd, silent;
    (void)state;
    assert_int_equal(find_handover(daemon_.pid, name, sizeof(name)), 0);
    memset(junk, 0xa5, sizeof(junk));
    assert_int_equal(handover_raw(name, junk, sizeof(junk), &fd), RI_ERR_PROTOCOL); /* no magic */
    assert_int_equal(fd, -1);
    assert_int_equal(handover_raw(name, junk, 5, &fd), RI_ERR_IO);                 /* cut short: closed */
    assert_int_equal(fd, -1);
    cm_dp_handover_req_encode(req, alice_sid_, secret);
    assert_int_equal(handover_raw(name, req, sizeof(req), &fd), RI_ERR_UNAUTHENTICATED); /* wrong secret */
    assert_int_equal(fd, -1);
    cm_dp_handover_req_encode(req, 999999, secret);
    assert_int_equal(handover_raw(name, req, sizeof(req), &fd), RI_ERR_UNAUTHENTICATED); /* no such session */
    assert_int_equal(fd, -1);
    /* a caller that says nothing, then one that asks: answered after the first's second */
    silent = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    memcpy(sa.sun_path + 1, name, strlen(name));
    assert_int_equal(connect(silent, (struct sockaddr *)&sa,
                             (socklen_t)(offsetof(struct sockaddr_un, sun_path) + 1 + strlen(name))), 0);
    long long t0 = now_ms();
    assert_int_equal(handover_raw(name, junk, sizeof(junk), &fd), RI_ERR_PROTOCOL);
    long long waited = now_ms() - t0;
    close(silent);
    printf("a silent caller held the next one %lld ms\n", waited);
    assert_true(waited < 3000);
    /* alice's worker is still served, and still reads her region (checked at teardown) */
    assert_int_equal(probe(BOB_UID, "handover", NULL), P_HO_UNAUTH);
}

/* In this (root) process: a session of bob's for the op-level checks. */
static void test_bad_requests_refused(void **state)
{
    party_t p = {0};
    uint64_t off = 0, bytes;
    uint8_t *local;
    uint32_t good_bad[6] = {0, 0, 0, /* a real cluster */ 0, 0, 99 /* no such cluster */};
    gw_dp_t *dp2 = NULL;
    gw_dp_options_t o = {.timeout_ms = 1000};
    (void)state;
    assert_int_equal(party_setup(&p, daemon_.grpc, TOK_BOB, "bob-ops", SEED_BOB, true), 0);
    /* alice's session with bob's secret: no connection */
    assert_int_not_equal(gw_dp_connect(p.sess.dataplane_address, alice_sid_, p.sess.secret, &o, &dp2), RI_OK);
    assert_null(dp2);
    assert_int_equal(gw_dp_locate(p.dp, 0, 0, 1, 1, &off), RI_ERR_RANGE);  /* one cluster only */
    assert_int_equal(gw_dp_locate(p.dp, 5, 0, 0, 1, &off), RI_ERR_RANGE);  /* one layer only */
    assert_int_equal(gw_dp_locate(p.dp, 0, 3, 0, 1, &off), RI_ERR_RANGE);  /* one head only */
    assert_int_equal(gw_dp_touch(p.dp, good_bad, 2), RI_ERR_RANGE);
    assert_int_equal(gw_dp_touch(p.dp, good_bad, 1), RI_OK);
    /* the connection is still good, and the cluster where it was */
    assert_int_equal(gw_dp_locate(p.dp, 0, 0, 0, 1, &off), RI_OK);
    assert_int_equal(off, p.off);
    /* a second connection of the same session maps the same region */
    assert_int_equal(gw_dp_connect(p.sess.dataplane_address, p.sess.session_id, p.sess.secret, NULL, &dp2), RI_OK);
    assert_int_equal(gw_dp_map(dp2, &local, &bytes), RI_OK);
    assert_int_equal(bytes, p.bytes);
    assert_memory_equal(local + p.off, p.page, PAGE_BYTES);
    gw_dp_close(dp2);
    gw_dp_close(p.dp);
    gw_ctl_destroy(p.ctl);
}

int main(int argc, char **argv)
{
    self_ = "/proc/self/exe"; /* re-run as other uids, from any folder */
    if (argc == 3 && strcmp(argv[1], "--alice") == 0)
        return alice_main(argv[2]);
    if (argc == 7 && strcmp(argv[1], "--probe") == 0)
        return probe_main(argv + 2);
    signal(SIGPIPE, SIG_IGN);
    if (argc == 3 && strcmp(argv[1], "rma-mutant") == 0) {
        const struct CMUnitTest mutant[] = {cmocka_unit_test(test_rma_over_tcp)};
        rma_mutant_ = argv[2];
        return cmocka_run_group_tests(mutant, group_setup, group_teardown);
    }
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_proc_paths),
        cmocka_unit_test(test_sysv_none),
        cmocka_unit_test(test_devshm_none),
        cmocka_unit_test(test_handover_refuses_other_session),
        cmocka_unit_test(test_twosided_over_tcp),
        cmocka_unit_test(test_rma_over_tcp),
        cmocka_unit_test(test_handover_bad_input),
        cmocka_unit_test(test_bad_requests_refused),
    };
    return cmocka_run_group_tests(tests, group_setup, group_teardown);
}
