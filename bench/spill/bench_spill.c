/*
 * ri-bench-spill: write and random-read throughput of the spill tier with
 * cluster-sized records, on the io_uring path (queue depth 32) and on the
 * pread/pwrite path (one request at a time), next to fio on the same
 * directory with the same block size and queue depth, in the same run
 * (docs/bench-format.md, bench "spill").
 *
 * Records: one cluster of 16 tokens, K and V in fp16:
 *   d = 128: 16 * 128 * 2 * 2 = 8192 payload bytes -> 12288 on disk
 *   d =  64: 16 *  64 * 2 * 2 = 4096 payload bytes ->  8192 on disk
 * (64-byte header, 4 KiB alignment).  mb_s counts bytes moved to or from the
 * disk (record_bytes per record), the same unit fio reports for its block
 * size; payload_mb_s counts K/V bytes only.
 *
 * Usage: ri-bench-spill [--json PATH] [--dir DIR] [--mib N] [--reps N] [--qd N]
 *                       [--segment-mib N] [--no-fio]   (--help lists them)
 * The directory must accept O_DIRECT; without --dir the first of
 * $RI_SPILL_BENCH_DIR, /var/tmp/ri-spill-bench, /tmp/ri-spill-bench that does
 * is used.  Files are deleted afterwards.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <ftw.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/vfs.h>
#include <unistd.h>

#include "bench/common/bn_args.h"
#include "bench/common/bn_report.h"
#include "common/cm_log.h"
#include "common/cm_runtime.h"
#include "common/cm_time.h"
#include "kvstore/spill/kvs_spill.h"
#include "kvstore/spill/kvs_spill_format.h"

#define BATCH 1024
#define MAX_REPS 15

typedef struct opts {
    char *json;          /* --json */
    char *dir_arg;       /* --dir */
    int64_t mib;         /* file size per case */
    int64_t reps;
    int64_t qd;          /* io_uring queue depth */
    int64_t segment_mib; /* 0 = one segment per case: mib + 1 */
    bool no_fio;
    const char *dir;     /* the directory used: dir_arg or the first candidate that does O_DIRECT */
} opts_t;

static int rm_one(const char *path, const struct stat *sb, int flag, struct FTW *ftw) { return remove(path); }

static void rmtree(const char *p) { nftw(p, rm_one, 16, FTW_DEPTH | FTW_PHYS); }

/* Can this directory do O_DIRECT?  Creates it if needed. */
static bool direct_io_ok(const char *dir, char *why, size_t len)
{
    if (mkdir(dir, 0700) != 0 && errno != EEXIST) {
        snprintf(why, len, "mkdir: %s", strerror(errno));
        return false;
    }
    char path[4200];
    snprintf(path, sizeof(path), "%s/.direct-probe", dir);
    int fd = open(path, O_RDWR | O_CREAT | O_TRUNC | O_DIRECT, 0600);
    if (fd < 0) {
        snprintf(why, len, "open O_DIRECT: %s", strerror(errno));
        return false;
    }
    void *buf = NULL;
    bool ok = posix_memalign(&buf, 4096, 4096) == 0;
    if (ok) {
        memset(buf, 0, 4096);
        ok = pwrite(fd, buf, 4096, 0) == 4096 && pread(fd, buf, 4096, 0) == 4096;
        if (!ok)
            snprintf(why, len, "O_DIRECT transfer: %s", strerror(errno));
    }
    free(buf);
    close(fd);
    unlink(path);
    return ok;
}

static const char *fs_name(const char *dir)
{
    struct statfs s;
    if (statfs(dir, &s) != 0)
        return "unknown";
    switch ((unsigned long)s.f_type) {
    case 0xEF53: return "ext4";
    case 0x58465342: return "xfs";
    case 0x9123683E: return "btrfs";
    case 0x01021994: return "tmpfs";
    case 0x794C7630: return "overlayfs";
    default: return "other";
    }
}

static void shuffle(uint32_t *v, uint32_t n, unsigned *seed)
{
    for (uint32_t i = n - 1; i > 0; i--) {
        uint32_t j = (uint32_t)rand_r(seed) % (i + 1), t = v[i];
        v[i] = v[j];
        v[j] = t;
    }
}

static kvs_spill_key_t key_of(uint32_t i)
{
    return (kvs_spill_key_t){.session = 1, .layer = i % 32, .head = (i / 32) % 8, .cluster = i / 256};
}

/* One run of our store: write n records in a shuffled key order, then read
 * them all in another shuffled order.  MB/s of disk bytes; 0 on failure. */
static int run_store(const opts_t *o, bool uring, uint32_t payload, uint32_t n, const uint8_t *data, uint8_t *rbuf,
                     double *w_mbs, double *r_mbs, bool *uring_used)
{
    char dir[4200];
    snprintf(dir, sizeof(dir), "%s/store", o->dir);
    kvs_spill_config_t cfg;
    kvs_spill_config_default(&cfg);
    cfg.dir = dir;
    cfg.use_uring = uring;
    cfg.queue_depth = o->qd;
    cfg.io_contexts = 1;
    cfg.compact_interval_ms = 0;
    cfg.segment_bytes = (uint64_t)o->segment_mib << 20;
    kvs_spill_t *sp = NULL;
    if (kvs_spill_create(&cfg, &sp) != RI_OK)
        return -1;
    kvs_spill_stats_t s;
    kvs_spill_stats(sp, &s);
    *uring_used = s.uring;
    uint32_t rec = (uint32_t)kvs_spill_rec_bytes(payload, cfg.align);
    uint32_t *order = malloc((size_t)n * sizeof(*order));
    kvs_spill_wreq_t *w = calloc(BATCH, sizeof(*w));
    kvs_spill_rreq_t *r = calloc(BATCH, sizeof(*r));
    unsigned seed = 12345;
    int rc = -1;
    for (uint32_t i = 0; i < n; i++)
        order[i] = i;
    shuffle(order, n, &seed);
    double t0 = cm_time_s();
    for (uint32_t b = 0; b < n; b += BATCH) {
        uint32_t m = n - b < BATCH ? n - b : BATCH;
        for (uint32_t i = 0; i < m; i++)
            w[i] = (kvs_spill_wreq_t){.key = key_of(order[b + i]), .dtype = 1, .tokens = 16,
                                      .payload = data + (size_t)i * payload, .payload_bytes = payload};
        if (kvs_spill_write(sp, w, m) != RI_OK)
            goto out;
    }
    double tw = cm_time_s() - t0;
    shuffle(order, n, &seed);
    t0 = cm_time_s();
    for (uint32_t b = 0; b < n; b += BATCH) {
        uint32_t m = n - b < BATCH ? n - b : BATCH;
        for (uint32_t i = 0; i < m; i++)
            r[i] = (kvs_spill_rreq_t){.key = key_of(order[b + i]), .buf = rbuf + (size_t)i * payload,
                                      .buf_bytes = payload};
        if (kvs_spill_read(sp, r, m) != RI_OK)
            goto out;
    }
    double tr = cm_time_s() - t0;
    *w_mbs = (double)n * rec / tw / 1e6;
    *r_mbs = (double)n * rec / tr / 1e6;
    rc = 0;
out:
    free(r);
    free(w);
    free(order);
    kvs_spill_destroy(sp);
    rmtree(dir);
    return rc;
}

/* fio on the same directory: bw in MB/s, 0 when it failed. */
static double run_fio(const opts_t *o, const char *rw, const char *engine, unsigned qd, uint32_t bs)
{
    char cmd[8192];
    snprintf(cmd, sizeof(cmd),
             "fio --name=spill --filename='%s/fio-bench.dat' --size=%lldM --bs=%u --iodepth=%u --ioengine=%s "
             "--direct=1 --rw=%s --output-format=json 2>/dev/null",
             o->dir, (long long)o->mib, bs, qd, engine, rw);
    FILE *p = popen(cmd, "r");
    if (p == NULL)
        return 0;
    size_t cap = 1 << 16, len = 0;
    char *out = malloc(cap);
    size_t got;
    while ((got = fread(out + len, 1, cap - len - 1, p)) > 0) {
        len += got;
        if (cap - len < 4096) {
            cap *= 2;
            out = realloc(out, cap);
        }
    }
    out[len] = '\0';
    int st = pclose(p);
    double mbs = 0;
    const char *start = strchr(out, '{');   /* fio may print notes before the JSON */
    cJSON *j = (st == 0 && start) ? cJSON_Parse(start) : NULL;
    cJSON *job = j ? cJSON_GetArrayItem(cJSON_GetObjectItem(j, "jobs"), 0) : NULL;
    cJSON *side = job ? cJSON_GetObjectItem(job, strcmp(rw, "write") == 0 ? "write" : "read") : NULL;
    cJSON *bw = side ? cJSON_GetObjectItem(side, "bw_bytes") : NULL;
    if (cJSON_IsNumber(bw))
        mbs = bw->valuedouble / 1e6;
    cJSON_Delete(j);
    free(out);
    return mbs;
}

/* Median of the reps of one case. */
typedef struct series {
    double v[MAX_REPS];
    unsigned n;
} series_t;

/* fio write then randread of the same file, then delete it. */
static void fio_pair(const opts_t *o, const char *engine, unsigned qd, uint32_t bs, series_t *w, series_t *r)
{
    char f[4200];
    double a;
    snprintf(f, sizeof(f), "%s/fio-bench.dat", o->dir);
    if ((a = run_fio(o, "write", engine, qd, bs)) > 0)
        w->v[w->n++] = a;
    if ((a = run_fio(o, "randread", engine, qd, bs)) > 0)
        r->v[r->n++] = a;
    unlink(f);
}

static void add_row(bn_report_t *rep, const char *path, const char *engine, const char *op, uint32_t rec,
                    uint32_t payload, unsigned qd, const series_t *s)
{
    if (s->n == 0)
        return;
    double med = bn_median(s->v, s->n);
    cJSON *row = bn_report_row(rep);
    cJSON_AddStringToObject(row, "path", path);
    cJSON_AddStringToObject(row, "op", op);
    cJSON_AddNumberToObject(row, "record_bytes", rec);
    cJSON_AddNumberToObject(row, "qd", qd);
    cJSON_AddNumberToObject(row, "mb_s", med);
    cJSON_AddNumberToObject(row, "payload_bytes", payload);
    cJSON_AddNumberToObject(row, "payload_mb_s", med * payload / rec);
    cJSON_AddStringToObject(row, "engine", engine);
    cJSON_AddNumberToObject(row, "reps", s->n);
    printf("%-9s %-9s %-9s %7u %4u %10.1f\n", path, engine, op, rec, qd, med);
}

static const cm_config_item_t sp_items[] = {
    BN_ARG_JSON(opts_t, json),
    BN_ARG(opts_t, "dir", CM_CFG_STRING, NULL,
           "directory that accepts O_DIRECT (empty: the first of $RI_SPILL_BENCH_DIR, "
           "/var/tmp/ri-spill-bench, /tmp/ri-spill-bench that does)",
           dir_arg, 0, 0),
    BN_ARG(opts_t, "mib", CM_CFG_INT, "256", "MiB written per case", mib, 16, 1 << 20),
    BN_ARG(opts_t, "reps", CM_CFG_INT, "3", "repetitions per case (the median is reported)", reps, 1, MAX_REPS),
    BN_ARG(opts_t, "qd", CM_CFG_INT, "32", "io_uring queue depth", qd, 1, 1024),
    BN_ARG(opts_t, "segment-mib", CM_CFG_INT, "0", "segment file size in MiB (0 = one segment per case: mib + 1)",
           segment_mib, 0, 1 << 20),
    BN_ARG(opts_t, "no-fio", CM_CFG_BOOL, "false", "skip the fio comparison", no_fio, 0, 0),
};
static const cm_config_table_t sp_table = {"ri-bench-spill", "RI_BENCH_SPILL_", sp_items, CM_ARRAY_LEN(sp_items),
                                           0, NULL};

static int sp_main(const void *arg, const char *argv0);

int main(int argc, char **argv)
{
    cm_log_set_level(CM_LOG_WARN);   /* quiet unless --log-level / RI_LOG_LEVEL says otherwise */
    char rt_err[256];
    if (cm_runtime_setup_from_env(cm_runtime_apply, rt_err, sizeof(rt_err)) != RI_OK) {
        fprintf(stderr, "ri-bench-spill: %s\n", rt_err);
        return 2;
    }
    opts_t o;
    return bn_args_main(&sp_table, &o, argc, argv, sp_main);
}

/* The bench; o is the command line's (the chosen directory is set here). */
static int sp_main(const void *arg, const char *argv0)
{
    opts_t o = *(const opts_t *)arg; /* a copy: dir and segment_mib are filled in */
    (void)argv0;
    int rc;
    if (o.segment_mib == 0)
        o.segment_mib = o.mib + 1;

    /* Pick a directory that does O_DIRECT. */
    char why[256] = "";
    const char *cands[4] = {o.dir_arg, NULL, NULL, NULL};
    if (o.dir_arg == NULL) {
        cands[0] = getenv("RI_SPILL_BENCH_DIR");
        cands[1] = "/var/tmp/ri-spill-bench";
        cands[2] = "/tmp/ri-spill-bench";
    }
    o.dir = NULL;
    for (int i = 0; i < 3 && o.dir == NULL; i++) {
        if (cands[i] == NULL)
            continue;
        if (direct_io_ok(cands[i], why, sizeof(why)))
            o.dir = cands[i];
        else
            fprintf(stderr, "ri-bench-spill: %s refuses O_DIRECT (%s); trying the next directory\n", cands[i], why);
    }
    if (o.dir == NULL) {
        fprintf(stderr, "ri-bench-spill: no directory with O_DIRECT found; give one with --dir\n");
        return 1;
    }

    bn_report_t *rep = bn_report_create("spill");
    if (rep == NULL)
        return 1;
    cJSON *root = bn_report_root(rep);
    cJSON_AddStringToObject(root, "dir", o.dir);
    cJSON_AddStringToObject(root, "fs", fs_name(o.dir));
    cJSON_AddBoolToObject(root, "direct_io", true);
    cJSON_AddNumberToObject(root, "file_mib", o.mib);
    cJSON_AddStringToObject(root, "mb_s_unit", "1e6 bytes/s of record_bytes (disk bytes), median of reps");
    bool have_fio = !o.no_fio && system("fio --version >/dev/null 2>&1") == 0;
    if (!have_fio)
        bn_report_skip(rep, "fio", o.no_fio ? "--no-fio given" : "fio not installed (Debian package fio)");
    printf("spill bench in %s (%s, O_DIRECT ok), %lld MiB per case, %lld reps\n", o.dir, fs_name(o.dir),
           (long long)o.mib, (long long)o.reps);
    printf("%-9s %-9s %-9s %7s %4s %10s\n", "path", "engine", "op", "rec_B", "qd", "MB/s");

    const uint32_t payloads[2] = {8192, 4096};   /* d = 128, d = 64 */
    uint8_t *data = malloc((size_t)BATCH * 8192), *rbuf = malloc((size_t)BATCH * 8192);
    unsigned seed = 99;
    for (size_t i = 0; i < (size_t)BATCH * 8192; i++)
        data[i] = (uint8_t)rand_r(&seed);
    cJSON *ratios = cJSON_AddObjectToObject(root, "vs_fio");
    bool uring_ok = true;
    for (int p = 0; p < 2; p++) {
        uint32_t payload = payloads[p];
        uint32_t rec = (uint32_t)kvs_spill_rec_bytes(payload, 4096);
        uint32_t n = (uint32_t)((uint64_t)o.mib * 1048576 / rec);
        series_t uw = {0}, ur = {0}, pw = {0}, pr = {0}, fw = {0}, fr = {0}, sw = {0}, sr = {0};
        if (p == 0) {
            /* Warm-up: on a thin-provisioned virtual disk the first writes to
             * never-used blocks are much slower than later ones; let one
             * unmeasured pass take that cost for everybody. */
            double a, b;
            bool used;
            (void)run_store(&o, true, payload, n, data, rbuf, &a, &b, &used);
        }
        for (int64_t r = 0; r < o.reps; r++) {
            /* Alternate who goes first, so drift and block placement hit
             * both sides alike. */
            for (int side = 0; side < 2; side++) {
                if ((side == 0) == (r % 2 == 0)) {
                    double a, b;
                    bool used;
                    if (run_store(&o, true, payload, n, data, rbuf, &a, &b, &used) == 0 && used) {
                        uw.v[uw.n++] = a;
                        ur.v[ur.n++] = b;
                    } else {
                        uring_ok = false;
                    }
                    if (run_store(&o, false, payload, n, data, rbuf, &a, &b, &used) == 0) {
                        pw.v[pw.n++] = a;
                        pr.v[pr.n++] = b;
                    }
                } else if (have_fio) {
                    fio_pair(&o, "io_uring", o.qd, rec, &fw, &fr);
                    fio_pair(&o, "psync", 1, rec, &sw, &sr);
                }
            }
        }
        add_row(rep, "io_uring", "io_uring", "write", rec, payload, o.qd, &uw);
        add_row(rep, "io_uring", "io_uring", "randread", rec, payload, o.qd, &ur);
        add_row(rep, "fio", "io_uring", "write", rec, payload, o.qd, &fw);
        add_row(rep, "fio", "io_uring", "randread", rec, payload, o.qd, &fr);
        add_row(rep, "pread", "pread", "write", rec, payload, 1, &pw);
        add_row(rep, "pread", "pread", "randread", rec, payload, 1, &pr);
        add_row(rep, "fio", "psync", "write", rec, payload, 1, &sw);
        add_row(rep, "fio", "psync", "randread", rec, payload, 1, &sr);
        char name[64];
        struct { const char *n; series_t *a, *b; } rs[4] = {
            {"io_uring_write", &uw, &fw}, {"io_uring_randread", &ur, &fr},
            {"pread_write", &pw, &sw}, {"pread_randread", &pr, &sr}};
        for (int k = 0; k < 4; k++) {
            if (rs[k].a->n == 0 || rs[k].b->n == 0)
                continue;
            double ratio = bn_median(rs[k].a->v, rs[k].a->n) / bn_median(rs[k].b->v, rs[k].b->n);
            snprintf(name, sizeof(name), "%s_%u", rs[k].n, rec);
            cJSON_AddNumberToObject(ratios, name, ratio);
            printf("  %-28s %.2f of fio%s\n", name, ratio,
                   k < 2 ? (ratio >= 0.8 ? "  (target >= 0.80: met)" : "  (target >= 0.80: MISSED)") : "");
        }
    }
    if (!uring_ok)
        bn_report_skip(rep, "io_uring", "io_uring could not be set up here; only the pread path ran");
    free(data);
    free(rbuf);
    rmdir(o.dir);   /* only if empty: never someone else's files */
    rc = bn_report_finish(rep, o.json) == 0 ? 0 : 1;
    return rc;
}
