/*
 * ri-bench-dataplane --clients N,..: N client processes fetch from one
 * ri-kvstore at the same time, each its own session (so they spread over the
 * daemon's data-plane threads), each an all-miss ranked fetch of 8 heads x
 * 150 clusters (9.8 MB) per step into a registered receive buffer.  Reports,
 * per N: p50 / p99 fetch latency over every fetch of every client, and the
 * aggregate GB/s (all miss bytes over the wall time of the concurrent phase,
 * from the first fetch started to the last one finished).
 */
#include "bench/dataplane/bench_dataplane.h"

#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "bench/common/bn_report.h"
#include "common/cm_time.h"
#include "gpuworker/client/gw_dp.h"
#include "tests/kvstore_data/kvs_spawn.h"

#ifdef KVS_SPAWN_HAVE_CTL
#include "gpuworker/client/gw_ctl.h"

#define CL_STORED 400u /* clusters per head per client: 26 MB a session */

/* What a client sends back: its fetch latencies, then bytes, t_first, t_last. */
typedef struct cl_summary {
    double t_first, t_last;   /* CLOCK_MONOTONIC seconds: first fetch started, last ended */
    uint64_t miss_bytes;
    int ok;
} cl_summary_t;

static int cl_upload(gw_dp_t *dp)
{
    size_t bytes = (size_t)CL_STORED * BD_CLUSTER_BYTES;
    uint8_t *buf = malloc(bytes);
    uint32_t tokens[CL_STORED];
    int rc = buf == NULL ? -1 : 0;
    for (uint32_t c = 0; c < CL_STORED; c++)
        tokens[c] = BD_CTOK;
    for (uint32_t h = 0; h < BD_HEADS && rc == 0; h++) {
        uint32_t n = CL_STORED;
        for (size_t i = 0; buf != NULL && i < bytes; i++)
            buf[i] = (uint8_t)(i * 7 + h);
        if (gw_dp_upload(dp, false, 0, 1, &h, &n, tokens, buf, bytes, NULL) != RI_OK)
            rc = -1;
    }
    free(buf);
    return rc;
}

/* One client (a child process): connect, upload, then iters all-miss fetches
 * once the parent says go (a byte on go_fd); latencies and summary to out_fd. */
static int cl_main(const gw_ctl_session_t *s, int iters, int go_fd, int out_fd)
{
    uint32_t heads[BD_HEADS], counts[BD_HEADS], ids[BD_HEADS * BD_PER_STEP], cache_id;
    size_t recv_len = BD_STEP_BYTES + (1u << 20);
    double *lat = calloc((size_t)iters, sizeof(double));
    cl_summary_t sum = {0};
    gw_dp_t *dp = NULL;
    uint8_t *recv = NULL;
    char go;

    if (lat == NULL || gw_dp_connect(s->dataplane_address, s->session_id, s->secret, NULL, &dp) != RI_OK ||
        cl_upload(dp) != 0 || gw_dp_recv_alloc(dp, recv_len, (void **)&recv) != RI_OK ||
        gw_dp_register_cache_mode(dp, 1, recv, recv_len, GW_DP_RECV_INLINE, &cache_id, NULL) != RI_OK)
        goto out;
    memset(recv, 0, recv_len);
    if (read(go_fd, &go, 1) != 1)
        goto out;
    sum.t_first = cm_time_s();
    for (int it = 0; it < iters; it++) {
        gw_dp_fetch_result_t res;
        uint32_t k = 0;
        for (uint32_t h = 0; h < BD_HEADS; h++) {
            heads[h] = h;
            counts[h] = BD_PER_STEP;
            for (uint32_t j = 0; j < BD_PER_STEP; j++)
                ids[k++] = (uint32_t)(it * 37 + j * 9) % CL_STORED; /* 9 and 400 coprime: distinct */
        }
        double t0 = cm_time_s();
        if (gw_dp_fetch_ranked(dp, cache_id, 0, BD_HEADS, heads, counts, ids, 0, 10000, &res) != RI_OK)
            goto out;
        lat[it] = cm_time_s() - t0;
        sum.miss_bytes += res.view.miss_bytes;
        gw_dp_fetch_result_free(&res);
    }
    sum.t_last = cm_time_s();
    sum.ok = 1;
out:
    if (write(out_fd, lat, (size_t)iters * sizeof(double)) < 0 || write(out_fd, &sum, sizeof(sum)) < 0)
        sum.ok = 0;
    gw_dp_close(dp);
    free(lat);
    return sum.ok ? 0 : 1;
}

static int cl_read_all(int fd, void *buf, size_t len)
{
    size_t got = 0;
    while (got < len) {
        ssize_t n = read(fd, (uint8_t *)buf + got, len - got);
        if (n <= 0)
            return -1;
        got += (size_t)n;
    }
    return 0;
}

/* One row: n clients, iters fetches each. */
static int cl_run(const kvs_spawn_t *sp, int n, int iters, bd_clients_result_t *out)
{
    gw_ctl_t *ctl = NULL;
    gw_ctl_geometry_t g = {.layers = 1, .kv_heads = BD_HEADS, .head_dim = BD_DIM, .dtype = 1, .page_tokens = BD_PT};
    gw_ctl_session_t *s = calloc((size_t)n, sizeof(*s));
    pid_t *pid = calloc((size_t)n, sizeof(*pid));
    int *outfd = calloc((size_t)n, sizeof(int)), go[2] = {-1, -1};
    double *lat = calloc((size_t)n * (size_t)iters, sizeof(double)), t_first = 0, t_last = 0;
    uint64_t bytes = 0;
    int rc = -1, started = 0;

    if (s == NULL || pid == NULL || outfd == NULL || lat == NULL || pipe(go) != 0 ||
        gw_ctl_create(sp->grpc, NULL, &ctl) != RI_OK)
        goto out;
    for (int i = 0; i < n; i++)
        if (gw_ctl_create_session(ctl, 5000, &g, CL_STORED * BD_CTOK, "bench-clients", &s[i], NULL) != RI_OK)
            goto out;
    for (int i = 0; i < n; i++) {
        int fds[2];
        if (pipe(fds) != 0)
            goto out;
        pid[i] = fork();
        if (pid[i] == 0) {
            close(fds[0]);
            close(go[1]);
            _exit(cl_main(&s[i], iters, go[0], fds[1]));
        }
        close(fds[1]);
        outfd[i] = fds[0];
        started++;
    }
    /* every client uploads and registers, then all start together */
    usleep(200 * 1000);
    for (int i = 0; i < n; i++)
        if (write(go[1], "g", 1) != 1)
            goto out;
    rc = 0;
    for (int i = 0; i < n; i++) {
        cl_summary_t sum;
        if (cl_read_all(outfd[i], lat + (size_t)i * (size_t)iters, (size_t)iters * sizeof(double)) != 0 ||
            cl_read_all(outfd[i], &sum, sizeof(sum)) != 0 || !sum.ok) {
            fprintf(stderr, "dataplane: client %d of %d failed\n", i, n);
            rc = -1;
            continue;
        }
        bytes += sum.miss_bytes;
        t_first = i == 0 || sum.t_first < t_first ? sum.t_first : t_first;
        t_last = sum.t_last > t_last ? sum.t_last : t_last;
    }
    if (rc == 0) {
        out->p50_us = bn_percentile(lat, (size_t)n * (size_t)iters, 50) * 1e6;
        out->p99_us = bn_percentile(lat, (size_t)n * (size_t)iters, 99) * 1e6;
        out->gbs = (double)bytes / (t_last - t_first) / 1e9;
        out->bytes = (size_t)(bytes / ((uint64_t)n * (uint64_t)iters));
    }
out:
    for (int i = 0; i < started; i++) {
        close(outfd[i]);
        waitpid(pid[i], NULL, 0);
    }
    if (go[0] >= 0) {
        close(go[0]);
        close(go[1]);
    }
    for (int i = 0; ctl != NULL && i < n; i++)
        if (s[i].session_id != 0)
            (void)gw_ctl_drop_session(ctl, 5000, s[i].session_id, NULL, NULL);
    gw_ctl_destroy(ctl);
    free(s);
    free(pid);
    free(outfd);
    free(lat);
    return rc;
}

int bd_run_clients(bn_report_t *rep, const char *transport, const char *tls, const int *clients, int n_clients,
                   int iters)
{
    kvs_spawn_t sp;
    int rc;
    unsigned mb = 256;

    for (int i = 0; i < n_clients; i++)
        if ((unsigned)clients[i] * 40u + 128u > mb)
            mb = (unsigned)clients[i] * 40u + 128u; /* 26 MB a session, with room */
    setenv("UCX_TLS", tls, 1);
    rc = kvs_spawn_start(&sp, 1, BD_HEADS, BD_DIM, BD_PT, mb);
    if (rc != 0 || !sp.real_daemon) {
        bn_report_skip(rep, "clients", rc == 77 ? "UCX or ri-kvstore cannot start here" : "needs ri-kvstore");
        if (rc == 0)
            kvs_spawn_stop(&sp, SIGTERM, 5000);
        return 0;
    }
    printf("\n%-5s %7s %10s %10s %10s %8s  (all-miss inline fetches, %d per client, one session each)\n", "tport",
           "clients", "bytes", "p50_us", "p99_us", "agg_gbs", iters);
    for (int i = 0; i < n_clients; i++) {
        bd_clients_result_t r = {0};
        if (cl_run(&sp, clients[i], iters, &r) != 0) {
            bn_report_skip(rep, "clients", "a client failed");
            continue;
        }
        cJSON *row = bn_report_row(rep);
        cJSON_AddStringToObject(row, "transport", transport);
        cJSON_AddNumberToObject(row, "clients", clients[i]);
        cJSON_AddNumberToObject(row, "hit_ratio", 0);
        cJSON_AddNumberToObject(row, "bytes", (double)r.bytes);
        cJSON_AddNumberToObject(row, "p50_us", r.p50_us);
        cJSON_AddNumberToObject(row, "p99_us", r.p99_us);
        cJSON_AddNumberToObject(row, "gbs", r.gbs);
        cJSON_AddNumberToObject(row, "iters", iters);
        cJSON_AddStringToObject(row, "delivery", "rma_put");
        cJSON_AddStringToObject(row, "gbs_is", "aggregate over all clients");
        printf("%-5s %7d %10zu %10.1f %10.1f %8.2f\n", transport, clients[i], r.bytes, r.p50_us, r.p99_us, r.gbs);
    }
    kvs_spawn_stop(&sp, SIGTERM, 5000);
    return 0;
}
#else
int bd_run_clients(bn_report_t *rep, const char *transport, const char *tls, const int *clients, int n_clients,
                   int iters)
{
    (void)transport;
    (void)tls;
    (void)clients;
    (void)n_clients;
    (void)iters;
    bn_report_skip(rep, "clients", "built without the control API client");
    return 0;
}
#endif
