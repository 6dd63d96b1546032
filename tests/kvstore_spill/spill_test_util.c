/* Helpers for the spill tier tests (see spill_test_util.h). */
#define _GNU_SOURCE
#include "spill_test_util.h"

#include "common/cm_alloc.h"

#include <errno.h>
#include <fcntl.h>
#include <ftw.h>
#include <liburing.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

char *st_tmpdir(void)
{
    const char *base = getenv("TMPDIR");
    if (base == NULL || base[0] == '\0')
        base = "/tmp";
    char *p = NULL;
    if (asprintf(&p, "%s/ri-spill-test-XXXXXX", base) < 0)
        abort();
    if (mkdtemp(p) == NULL) {
        perror("mkdtemp");
        abort();
    }
    return p;
}

static int rm_one(const char *path, const struct stat *sb, int flag, struct FTW *ftw)
{
    return remove(path);
}

void st_rmtree(const char *path)
{
    if (path != NULL)
        nftw(path, rm_one, 16, FTW_DEPTH | FTW_PHYS);
}

static uint64_t mix(uint64_t x)
{
    x ^= x >> 33;
    x *= 0xFF51AFD7ED558CCDull;
    x ^= x >> 33;
    x *= 0xC4CEB9FE1A85EC53ull;
    x ^= x >> 33;
    return x;
}

static uint64_t seed_of(const kvs_spill_key_t *k, uint32_t salt)
{
    return mix(k->session ^ mix(((uint64_t)k->layer << 32) | k->head) ^ mix(((uint64_t)k->cluster << 32) | salt));
}

void st_fill(void *buf, size_t len, const kvs_spill_key_t *key, uint32_t salt)
{
    uint64_t s = seed_of(key, salt);
    uint8_t *p = buf;
    size_t i = 0;
    for (; i + 8 <= len; i += 8) {
        s += 0x9E3779B97F4A7C15ull;
        uint64_t v = mix(s);
        memcpy(p + i, &v, 8);
    }
    for (; i < len; i++)
        p[i] = (uint8_t)(mix(s + i) & 0xff);
}

bool st_check(const void *buf, size_t len, const kvs_spill_key_t *key, uint32_t salt)
{
    uint8_t *tmp = malloc(len ? len : 1);
    st_fill(tmp, len, key, salt);
    bool ok = memcmp(tmp, buf, len) == 0;
    free(tmp);
    return ok;
}

bool st_mode_uring(int argc, char **argv)
{
    return !(argc > 1 && strcmp(argv[1], "pread") == 0);
}

void st_config(kvs_spill_config_t *cfg, const char *dir, bool uring)
{
    kvs_spill_config_default(cfg);
    cfg->dir = dir;
    cfg->use_uring = uring;
    cfg->segment_bytes = 4u << 20;
    cfg->compact_interval_ms = 0;
    cfg->io_timeout_ms = 2000;
}

kvs_spill_t *st_create_or_skip(const kvs_spill_config_t *cfg)
{
    kvs_spill_t *sp = NULL;
    ri_status_t st = kvs_spill_create(cfg, &sp);
    if (st == RI_ERR_UNSUPPORTED) {
        fprintf(stderr, "skip: O_DIRECT not supported in %s\n", cfg->dir);
        exit(77);
    }
    if (st != RI_OK) {
        fprintf(stderr, "kvs_spill_create: %s\n", ri_status_str(st));
        abort();
    }
    kvs_spill_stats_t s;
    kvs_spill_stats(sp, &s);
    if (cfg->use_uring && !s.uring && cfg->ops != st_fault_ops()) {
        fprintf(stderr, "skip: io_uring unavailable here\n");
        kvs_spill_destroy(sp);
        exit(77);
    }
    return sp;
}

/* ---- fault injection ---- */

static st_fault_t g_fault;

st_fault_t *st_fault(void) { return &g_fault; }

void st_fault_arm(st_fault_op_t op, st_fault_kind_t kind, int err, int skip, int times)
{
    atomic_store(&g_fault.op, ST_F_NONE);
    g_fault.kind = kind;
    g_fault.err = err;
    atomic_store(&g_fault.skip, skip);
    atomic_store(&g_fault.times, times);
    atomic_store(&g_fault.hits, 0);
    atomic_store(&g_fault.op, op);
}

/* Copies kept by ST_K_RETAIN: a list of blocks, each starting with the link. */
static CM_ALLOC_TAG(st_retained_tag, "test.spill.retained");
static pthread_mutex_t g_retained_mu = PTHREAD_MUTEX_INITIALIZER;
static void *g_retained;

static void retain_copy(const void *buf, size_t len)
{
    void **blk = cm_malloc(&st_retained_tag, sizeof(void *) + len);
    if (blk == NULL)
        return;
    memcpy(blk + 1, buf, len);
    pthread_mutex_lock(&g_retained_mu);
    *blk = g_retained;
    g_retained = blk;
    pthread_mutex_unlock(&g_retained_mu);
}

void st_fault_off(void)
{
    atomic_store(&g_fault.op, ST_F_NONE);
    pthread_mutex_lock(&g_retained_mu);
    while (g_retained != NULL) {
        void **blk = g_retained;
        g_retained = *blk;
        cm_free(blk);
    }
    pthread_mutex_unlock(&g_retained_mu);
}

/* Should this call of op fail? */
static bool fire(st_fault_op_t op)
{
    if (atomic_load(&g_fault.op) != (int)op)
        return false;
    if (atomic_fetch_sub(&g_fault.skip, 1) > 0)
        return false;
    int t = atomic_load(&g_fault.times);
    if (t == 0)
        return false;
    if (t > 0 && atomic_fetch_sub(&g_fault.times, 1) <= 0)
        return false;
    atomic_fetch_add(&g_fault.hits, 1);
    return true;
}

static int f_open(void *arg, const char *path, int flags, mode_t mode)
{
    if (fire(ST_F_OPEN)) {
        errno = g_fault.err;
        return -1;
    }
    return open(path, flags, mode);
}

static int f_close(void *arg, int fd) { return close(fd); }

static int f_fsync(void *arg, int fd)
{
    if (fire(ST_F_FSYNC)) {
        errno = g_fault.err;
        return -1;
    }
    return fsync(fd);
}

static int f_fallocate(void *arg, int fd, off_t off, off_t len)
{
    if (fire(ST_F_FALLOCATE)) {
        errno = g_fault.err;
        return -1;
    }
    return fallocate(fd, 0, off, len);
}

static int f_rename(void *arg, const char *from, const char *to)
{
    if (fire(ST_F_RENAME)) {
        errno = g_fault.err;
        return -1;
    }
    return rename(from, to);
}

static int f_unlink(void *arg, const char *path) { return unlink(path); }

static ssize_t f_pwrite(void *arg, int fd, const void *buf, size_t len, off_t off)
{
    if (fire(ST_F_PWRITE)) {
        if (g_fault.kind == ST_K_RETAIN) {
            retain_copy(buf, len);
            return pwrite(fd, buf, len, off);
        }
        if (g_fault.kind == ST_K_SHORT) {
            /* Write half for real, as a device that stopped early would. */
            return pwrite(fd, buf, len / 2 / 4096 * 4096, off);
        }
        errno = g_fault.err;
        return -1;
    }
    return pwrite(fd, buf, len, off);
}

static ssize_t f_pread(void *arg, int fd, void *buf, size_t len, off_t off)
{
    if (fire(ST_F_PREAD)) {
        if (g_fault.kind == ST_K_SHORT)
            return pread(fd, buf, len / 2 / 4096 * 4096, off);
        errno = g_fault.err;
        return -1;
    }
    return pread(fd, buf, len, off);
}

static int f_uring_init(void *arg, unsigned entries, struct io_uring *ring)
{
    if (fire(ST_F_URING_INIT))
        return -g_fault.err;
    return io_uring_queue_init(entries, ring, 0);
}

static int f_uring_submit(void *arg, struct io_uring *ring) { return io_uring_submit(ring); }

static int f_uring_wait(void *arg, struct io_uring *ring, struct io_uring_cqe **cqe_p, struct __kernel_timespec *ts)
{
    for (;;) {
        int rc = ts ? io_uring_wait_cqe_timeout(ring, cqe_p, ts) : io_uring_peek_cqe(ring, cqe_p);
        if (rc < 0)
            return rc;
        /* Only slot completions (user_data 1..QD) are faulted, never cancels. */
        uint64_t ud = io_uring_cqe_get_data64(*cqe_p);
        if (ud == UINT64_MAX || ud == 0 || (*cqe_p)->res < 0 || !fire(ST_F_CQE))
            return rc;
        if (g_fault.kind == ST_K_LOST) {
            io_uring_cqe_seen(ring, *cqe_p);   /* swallowed: it never arrives */
            if (ts == NULL)
                return -EAGAIN;
            continue;
        }
        (*cqe_p)->res = g_fault.kind == ST_K_SHORT ? (*cqe_p)->res / 2 : -g_fault.err;
        return rc;
    }
}

static const kvs_io_ops_t g_fault_ops = {
    .open = f_open,
    .close = f_close,
    .fsync = f_fsync,
    .fallocate = f_fallocate,
    .rename = f_rename,
    .unlink = f_unlink,
    .pwrite = f_pwrite,
    .pread = f_pread,
    .uring_init = f_uring_init,
    .uring_submit = f_uring_submit,
    .uring_wait = f_uring_wait,
    .arg = &g_fault,
};

const kvs_io_ops_t *st_fault_ops(void) { return &g_fault_ops; }
