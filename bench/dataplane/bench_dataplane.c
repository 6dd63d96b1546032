/*
 * ri-bench-dataplane: ranked-fetch latency and bandwidth of the UCX data
 * plane, from a separate client process to a server process (the real
 * ri-kvstore when built, else kvs-test-server), over shared memory
 * (UCX_TLS=sm,self,tcp) and TCP loopback (UCX_TLS=tcp,self).
 *
 * Workload: one layer-step of 8 KV heads x 150 clusters x 16 tokens
 * x d=128, fp16 K+V (9.8 MB): all misses (a cache too small to admit
 * anything), and a 90% hit ratio (135 hot clusters per head stay cached, 15
 * fresh ones per head miss and are admitted).  Each fetch is timed end to end
 * on the client (request sent -> reply received, misses in the receive
 * buffer).  Next to it, in the same run: single-thread memcpy of the same
 * bytes.  Usage: ri-bench-dataplane [--json PATH] [--iters N] [--transport shm|tcp]
 * [--clients N,..] (--help lists them): with --clients, N client processes at once instead
 * (bench_dataplane_clients.c), on shm unless --transport says tcp.
 */
#include <limits.h>
#include <stdbool.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "bench/common/bn_args.h"
#include "bench/common/bn_report.h"
#include "bench/dataplane/bench_dataplane.h"
#include "common/cm_time.h"
#include "gpuworker/client/gw_dp.h"
#include "tests/kvstore_data/kvs_spawn.h"

#define HEADS BD_HEADS
#define DIM BD_DIM
#define PT BD_PT
#define CTOK BD_CTOK
#define PER_STEP BD_PER_STEP     /* clusters per head per fetch */
#define STORED 1500u             /* clusters stored per head */
#define HOT 135u                 /* 90% of PER_STEP */
#define CLUSTER_BYTES BD_CLUSTER_BYTES
#define STEP_BYTES BD_STEP_BYTES

static double memcpy_gbs(size_t bytes, int reps)
{
    uint8_t *a = malloc(bytes), *b = malloc(bytes);
    double best = 0;

    memset(a, 1, bytes);
    memset(b, 2, bytes);
    for (int r = 0; r < reps; r++) {
        double t0 = cm_time_s();
        memcpy(b, a, bytes);
        double dt = cm_time_s() - t0;
        __asm__ volatile("" ::"r"(b) : "memory");
        if (dt > 0 && bytes / dt / 1e9 > best)
            best = bytes / dt / 1e9;
    }
    free(a);
    free(b);
    return best;
}

/* Upload STORED clusters of 16 tokens for every head of layer 0. */
static int upload_all(gw_dp_t *dp)
{
    size_t bytes = (size_t)STORED * CLUSTER_BYTES;
    uint8_t *buf = malloc(bytes);
    uint32_t *tokens = malloc(STORED * sizeof(uint32_t));
    int rc = 0;

    for (uint32_t c = 0; c < STORED; c++)
        tokens[c] = CTOK;
    for (uint32_t h = 0; h < HEADS && rc == 0; h++) {
        uint32_t n = STORED;
        for (size_t i = 0; i < bytes; i++)
            buf[i] = (uint8_t)(i * 7 + h);
        ri_status_t st = gw_dp_upload(dp, false, 0, 1, &h, &n, tokens, buf, bytes, NULL);
        if (st != RI_OK) {
            fprintf(stderr, "upload head %u: %s\n", h, ri_status_str(st));
            rc = -1;
        }
    }
    free(buf);
    free(tokens);
    return rc;
}

typedef struct result {
    double p50_us, p99_us, gbs, hit_ratio, memcpy_gbs;
    double pct_us[101]; /* percentile i of the fetch latency: the CDF ./ri plot draws */
    size_t bytes;
} result_t;

static uint8_t *g_src, *g_dst; /* memcpy of the same bytes, after every fetch */

static int run_case(gw_dp_t *dp, uint8_t *recv, size_t recv_len, gw_dp_recv_mode_t mode, double hit_target,
                    int iters, result_t *out)
{
    uint32_t heads[HEADS], counts[HEADS], ids[HEADS * PER_STEP], cache_id;
    uint32_t capacity = hit_target > 0 ? HEADS * PER_STEP * 2 : 1; /* 1 page: nothing is ever admitted */
    double *lat = malloc(sizeof(double) * (size_t)iters);
    double *mct = malloc(sizeof(double) * (size_t)iters);
    uint64_t hits = 0, total = 0, miss_bytes = 0;
    uint32_t fresh = HOT;
    int warm = 20, rc = 0;

    if (gw_dp_register_cache_mode(dp, capacity, recv, recv_len, mode, &cache_id, NULL) != RI_OK) {
        free(lat);
        return -1;
    }
    for (int it = -warm; it < iters && rc == 0; it++) {
        gw_dp_fetch_result_t res;
        uint32_t k = 0;
        for (uint32_t h = 0; h < HEADS; h++) {
            heads[h] = h;
            counts[h] = PER_STEP;
            if (hit_target > 0) {
                for (uint32_t j = 0; j < HOT; j++)
                    ids[k++] = j;
                for (uint32_t j = 0; j < PER_STEP - HOT; j++)
                    ids[k++] = fresh + j;
            } else {
                for (uint32_t j = 0; j < PER_STEP; j++)
                    ids[k++] = (uint32_t)((it + warm) * 37 + j * 9) % STORED; /* distinct: 9j mod 1500 repeats after 500 */
            }
        }
        fresh += PER_STEP - HOT;
        if (fresh + PER_STEP - HOT > STORED)
            fresh = HOT;
        double t0 = cm_time_s();
        ri_status_t st = gw_dp_fetch_ranked(dp, cache_id, 0, HEADS, heads, counts, ids, 0, 5000, &res);
        double dt = cm_time_s() - t0;
        if (st != RI_OK) {
            fprintf(stderr, "fetch: %s\n", ri_status_str(st));
            rc = -1;
            break;
        }
        if (it >= 0) {
            lat[it] = dt;
            miss_bytes += res.view.miss_bytes;
            /* Side by side: one memcpy of the same bytes under the same load. */
            t0 = cm_time_s();
            memcpy(g_dst, g_src, res.view.miss_bytes);
            mct[it] = cm_time_s() - t0;
            __asm__ volatile("" ::"r"(g_dst) : "memory");
            for (uint32_t e = 0; e < res.view.n_entries; e++) {
                cm_dp_entry_t en;
                cm_dp_reply_entry(&res.view, e, &en);
                hits += (en.flags & CM_DP_F_HIT) != 0;
                total++;
            }
        }
        gw_dp_fetch_result_free(&res);
    }
    if (rc == 0) {
        out->p50_us = bn_percentile(lat, (size_t)iters, 50) * 1e6;
        out->p99_us = bn_percentile(lat, (size_t)iters, 99) * 1e6;
        for (int q = 0; q <= 100; q++)
            out->pct_us[q] = bn_percentile(lat, (size_t)iters, q) * 1e6;
        out->bytes = (size_t)(miss_bytes / (uint64_t)iters);
        out->gbs = (double)out->bytes / (out->p50_us * 1e-6) / 1e9;
        out->hit_ratio = total ? (double)hits / (double)total : 0;
        out->memcpy_gbs = (double)out->bytes / bn_median(mct, (size_t)iters) / 1e9;
    }
    gw_dp_release(dp, cache_id);
    free(lat);
    free(mct);
    return rc;
}

typedef struct bd_opts {
    char *json;
    int64_t iters;   /* fetches per case (at least 10 are run) */
    char *transport; /* shm or tcp; empty = both */
    char *clients;   /* comma list of client process counts */
} bd_opts_t;

static const cm_config_item_t bd_items[] = {
    BN_ARG_JSON(bd_opts_t, json),
    BN_ARG(bd_opts_t, "iters", CM_CFG_INT, "200", "fetches per case (at least 10 are run)", iters, 0, 1 << 30),
    BN_ARG(bd_opts_t, "transport", CM_CFG_STRING, NULL, "shm or tcp; empty: both (with --clients: shm)", transport, 0,
           0),
    BN_ARG(bd_opts_t, "clients", CM_CFG_STRING, NULL,
           "N client processes at once instead, for each N of this comma list "
           "(1..64)",
           clients, 0, 0),
};
static const cm_config_table_t bd_table = {"ri-bench-dataplane", "RI_BENCH_DATAPLANE_", bd_items,
                                           CM_ARRAY_LEN(bd_items), 0, NULL};

static int bd_main(const void *arg, const char *argv0)
{
    const bd_opts_t *o = arg;
    (void)argv0;
    const char *json = o->json;
    const char *modes[2] = {"shm", "tcp"}, *tls[2] = {"sm,self,tcp", "tcp,self"};
    int iters = (int)o->iters;
    bn_report_t *rep;
    size_t recv_len = STEP_BYTES + (1u << 20);
    uint8_t *recv;
    double mc;
    char exe[PATH_MAX];

    const char *only = o->transport != NULL && o->transport[0] != '\0' ? o->transport : NULL;
    int clients[16], n_clients = 0;
    double cl[16];
    size_t n_cl = o->clients != NULL ? bn_args_list(o->clients, cl, CM_ARRAY_LEN(cl)) : 0;
    for (size_t i = 0; i < n_cl; i++)
        if (cl[i] >= 1 && cl[i] <= 64)
            clients[n_clients++] = (int)cl[i];
    if (iters < 10)
        iters = 10;
    /* Find the server binaries next to ours unless told. */
    if (getenv("RI_BUILD_DIR") == NULL) {
        ssize_t n = readlink("/proc/self/exe", exe, sizeof(exe) - 1);
        if (n > 0) {
            exe[n] = '\0';
            char *s = strrchr(exe, '/');
            if (s) {
                *s = '\0';
                s = strrchr(exe, '/');
                if (s)
                    *s = '\0';
                setenv("RI_BUILD_DIR", exe, 1);
            }
        }
    }
    signal(SIGPIPE, SIG_IGN);
    rep = bn_report_create("dataplane");
    if (rep == NULL)
        return 1;
    recv = aligned_alloc(4096, recv_len);
    memset(recv, 0, recv_len);
    mc = memcpy_gbs(STEP_BYTES, 30);
    g_src = malloc(STEP_BYTES);
    g_dst = malloc(STEP_BYTES);
    memset(g_src, 3, STEP_BYTES);
    memset(g_dst, 4, STEP_BYTES);
    cJSON_AddNumberToObject(bn_report_root(rep), "memcpy_best_gbs", mc);
    {
        double la[3] = {0};
        FILE *lf = fopen("/proc/loadavg", "r");
        if (lf != NULL) {
            if (fscanf(lf, "%lf %lf %lf", &la[0], &la[1], &la[2]) != 3)
                la[0] = -1;
            fclose(lf);
        }
        cJSON_AddNumberToObject(bn_report_root(rep), "loadavg_1m", la[0]);
    }
    if (n_clients > 0) {
        int m = only != NULL && strcmp(only, "tcp") == 0;
        bd_run_clients(rep, modes[m], tls[m], clients, n_clients, iters);
        free(recv);
        free(g_src);
        free(g_dst);
        return bn_report_finish(rep, json) == 0 ? 0 : 1;
    }
    printf("%-5s %-7s %9s %10s %10s %10s %8s %11s %s\n", "tport", "deliver", "hit_ratio", "bytes", "p50_us", "p99_us", "gbs",
           "memcpy_gbs", "ratio");
    for (int m = 0; m < 2; m++) {
        kvs_spawn_t sp;
        gw_dp_t *dp = NULL;
        int rc;

        if (only != NULL && strcmp(only, modes[m]) != 0)
            continue;
        setenv("UCX_TLS", tls[m], 1);
        fprintf(stderr, "dataplane: %s: starting the server\n", modes[m]);
        rc = kvs_spawn_start(&sp, 1, HEADS, DIM, PT, 256);
        if (rc != 0) {
            bn_report_skip(rep, modes[m], rc == 77 ? "UCX or the server cannot start here" : "server failed to start");
            continue;
        }
        fprintf(stderr, "dataplane: %s: connect and upload\n", modes[m]);
        if (gw_dp_connect(sp.addr, sp.session_id, sp.secret, NULL, &dp) != RI_OK || upload_all(dp) != 0) {
            bn_report_skip(rep, modes[m], "connect or upload failed");
            gw_dp_close(dp);
            kvs_spawn_stop(&sp, SIGTERM, 5000);
            continue;
        }
        /* Inline delivery only: the kvstore does no RMA (docs/kvstore-data.md);
         * same-host workers read their region directly, which this two-sided
         * bench does not measure. */
        for (int c = 0; c < 2; c++) {
            result_t r;
            double target = c % 2 == 0 ? 0.0 : 0.9;
            double mcb;
            if (run_case(dp, recv, recv_len, GW_DP_RECV_INLINE, target, iters, &r) != 0) {
                bn_report_skip(rep, modes[m], "fetch failed");
                continue;
            }
            mcb = r.memcpy_gbs;
            cJSON *row = bn_report_row(rep);
            cJSON_AddStringToObject(row, "transport", modes[m]);
            cJSON_AddNumberToObject(row, "hit_ratio", r.hit_ratio);
            cJSON_AddNumberToObject(row, "bytes", (double)r.bytes);
            cJSON_AddNumberToObject(row, "p50_us", r.p50_us);
            cJSON_AddNumberToObject(row, "p99_us", r.p99_us);
            cJSON_AddNumberToObject(row, "gbs", r.gbs);
            cJSON_AddItemToObject(row, "latency_us_pct", cJSON_CreateDoubleArray(r.pct_us, 101));
            cJSON_AddNumberToObject(row, "memcpy_gbs", mcb);
            cJSON_AddNumberToObject(row, "step_bytes", (double)STEP_BYTES);
            cJSON_AddNumberToObject(row, "iters", iters);
            cJSON_AddStringToObject(row, "ucx_tls", tls[m]);
            cJSON_AddStringToObject(row, "delivery", "inline_reply");
            cJSON_AddStringToObject(row, "server", sp.real_daemon ? "ri-kvstore" : "kvs-test-server");
            printf("%-5s %-7s %9.3f %10zu %10.1f %10.1f %8.2f %11.2f %5.2f  p99/p50 %.2f\n", modes[m],
                   "inline", r.hit_ratio, r.bytes, r.p50_us, r.p99_us, r.gbs, mcb, r.gbs / mcb,
                   r.p99_us / r.p50_us);
        }
        gw_dp_close(dp);
        kvs_spawn_stop(&sp, SIGTERM, 5000);
    }
    free(recv);
    free(g_src);
    free(g_dst);
    return bn_report_finish(rep, json) == 0 ? 0 : 1;
}

int main(int argc, char **argv)
{
    bd_opts_t o;
    return bn_args_main(&bd_table, &o, argc, argv, bd_main);
}
