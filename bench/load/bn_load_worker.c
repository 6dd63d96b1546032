/*
 * ri bench load --worker: one real ri-kvstore and one real
 * `ri-worker --listen 127.0.0.1:0 --kvstore ...` (the default model,
 * SmolLM2), loaded for a bounded time by:
 *   - N client processes sending /v1/completions in a loop: a third plain,
 *     a third streamed to the end, a third streamed and then abandoned
 *     mid-stream with a reset connection; and every --kill-ms the bench
 *     SIGKILLs a client that is in the middle of a stream (and starts a new
 *     one);
 *   - M slowloris connections (bn_load_probe.h);
 *   - a /health prober every 200 ms that records every failure.
 * Then, with the clients gone, it counts the kvstore's sessions (those the
 * worker left behind), measures both processes' RSS and checks that both
 * still answer.  Traffic goes to 127.0.0.1 only; every loop is bounded in
 * count and time.
 */
#define _GNU_SOURCE
#include "bench/load/bn_load_worker.h"

#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include "bench/common/bn_args.h"
#include "bench/common/bn_daemon.h"
#include "bench/common/bn_report.h"
#include "bench/load/bn_load_http.h"
#include "bench/load/bn_load_probe.h"
#include "common/cm_alloc.h"
#include "common/cm_time.h"
#include "gpuworker/client/gw_ctl.h"

#define BW_MAX_CLIENTS 64
#define BW_MAX_WORKER_ARGS 32
#define BW_REQ_TIMEOUT_S 30.0   /* one completion's limit */
#define BW_START_TIMEOUT_S 180.0 /* the worker loads its model on a shared machine */

typedef struct bw_opts {
    unsigned clients;      /* HTTP client processes */
    unsigned slowloris;    /* slowloris connections */
    unsigned kill_ms;      /* SIGKILL a streaming client this often */
    unsigned max_tokens;   /* per completion */
    double seconds;        /* traffic time */
    double trickle_s;      /* slowloris: one byte per connection this often */
    const char *slow_from; /* slowloris: source address (another loopback address: another client) */
    const char *api_key;   /* sent as a bearer key; NULL = none */
    const char *worker_args[BW_MAX_WORKER_ARGS]; /* extra ri-worker flags, borrowed from argv */
    unsigned n_worker_args;
} bw_opts_t;

/* What clients count, across processes (shared memory). */
enum {
    BW_OK,           /* completion answered in full */
    BW_ABORTED,      /* stream left on purpose after its first events */
    BW_E_CONNECT,
    BW_E_TIMEOUT,
    BW_E_CLOSED,     /* closed or reset before a complete reply */
    BW_E_TOO_BIG,
    BW_E_429,
    BW_E_4XX,
    BW_E_5XX,
    BW_E_ERROR_EVENT, /* a stream that carried an error event */
    BW_E_TRUNCATED,   /* a stream that ended without [DONE] */
    BW_E_BAD_REPLY,   /* 200 without a completion in it */
    BW_KINDS
};
static const char *const bw_kind[BW_KINDS] = {"ok",         "aborted",  "connect", "timeout",
                                              "closed",     "too_big",  "status_429", "status_4xx",
                                              "status_5xx", "error_event", "truncated", "bad_reply"};

typedef struct bw_shared {
    _Atomic uint64_t count[BW_KINDS];
    _Atomic int streaming[BW_MAX_CLIENTS]; /* 1 while client i reads a stream */
} bw_shared_t;

/* The ri-worker child. */
typedef struct bw_worker {
    pid_t pid;      /* 0 when not running */
    int port;       /* its HTTP port on 127.0.0.1 */
    char dir[256];  /* temporary folder: port file and log */
    char log[300];  /* its stdout and stderr */
} bw_worker_t;

/* What a client process needs (copied into it by fork). */
typedef struct bw_run {
    int port;
    const char *api_key;
    char model[256];  /* the worker's model id, from /v1/models */
    unsigned max_tokens;
    double deadline;  /* no new request after this */
    bw_shared_t *sh;
} bw_run_t;

/* ---- options ---- */

/* The command line (a cm_config table); bw_parse turns it into bw_opts_t. */
typedef struct bw_args {
    char *json;
    bool worker;         /* the mode switch itself */
    bool quick;
    double seconds;      /* 0 = 60, or 15 with --quick */
    int64_t clients;     /* 0 = 8, or 3 with --quick */
    int64_t slowloris;
    int64_t kill_ms;
    int64_t max_tokens;
    double trickle_ms;
    char *slow_from;
    char *api_key;
    char *worker_arg;    /* only for --help: bn_args_take_all collects them */
} bw_args_t;

static const cm_config_item_t bw_cfg_items[] = {
    BN_ARG_JSON(bw_args_t, json),
    BN_ARG(bw_args_t, "worker", CM_CFG_BOOL, "true", "load a real ri-worker (this mode)", worker, 0, 0),
    BN_ARG(bw_args_t, "quick", CM_CFG_BOOL, "false", "a short run: 15 s, 3 clients (unless given)", quick, 0, 0),
    BN_ARG(bw_args_t, "seconds", CM_CFG_DOUBLE, "0", "traffic time (0 = 60, or 15 with --quick)", seconds, 0, 86400),
    BN_ARG(bw_args_t, "clients", CM_CFG_INT, "0", "HTTP client processes (0 = 8, or 3 with --quick)", clients, 0,
           BW_MAX_CLIENTS),
    BN_ARG(bw_args_t, "slowloris", CM_CFG_INT, "300", "slowloris connections", slowloris, 0, BL_SLOW_MAX),
    BN_ARG(bw_args_t, "kill-ms", CM_CFG_INT, "2000", "SIGKILL a streaming client this often", kill_ms, 1, 1 << 30),
    BN_ARG(bw_args_t, "max-tokens", CM_CFG_INT, "16", "tokens per completion", max_tokens, 1, 4096),
    BN_ARG(bw_args_t, "trickle-ms", CM_CFG_DOUBLE, "3000", "slowloris: one byte per connection this often", trickle_ms,
           100, 1e9),
    BN_ARG(bw_args_t, "slowloris-from", CM_CFG_STRING, "127.0.0.2",
           "slowloris: source address (another loopback address: another client)", slow_from, 0, 0),
    BN_ARG(bw_args_t, "api-key", CM_CFG_STRING, NULL, "sent as a bearer key (empty: none)", api_key, 0, 0),
    BN_ARG(bw_args_t, "worker-arg", CM_CFG_STRING, NULL, "one extra ri-worker flag (repeat it for more; at most 32)",
           worker_arg, 0, 0),
};
static const cm_config_table_t bw_cfg_table = {"ri bench load --worker", "RI_BENCH_LOAD_WORKER_", bw_cfg_items,
                                           CM_ARRAY_LEN(bw_cfg_items), 0, NULL};

/* Fill o from args (borrowed: o's strings point into args). */
static void bw_parse(const bw_args_t *args, bw_opts_t *o)
{
    *o = (bw_opts_t){.clients = (unsigned)args->clients, .slowloris = (unsigned)args->slowloris,
                     .kill_ms = (unsigned)args->kill_ms, .max_tokens = (unsigned)args->max_tokens,
                     .seconds = args->seconds, .trickle_s = args->trickle_ms / 1000, .slow_from = args->slow_from,
                     .api_key = args->api_key != NULL && args->api_key[0] ? args->api_key : NULL};
    if (o->seconds == 0)
        o->seconds = args->quick ? 15 : 60;
    if (o->clients == 0)
        o->clients = args->quick ? 3 : 8;
}

/* ---- the ri-worker process ---- */

/* Wait until child pid exits, at most until end (cm_time_s); true when it
 * did (and was reaped), false when it is still running. */
static bool bw_wait_until(pid_t pid, double end)
{
    for (;;) {
        pid_t w = waitpid(pid, NULL, WNOHANG);
        if (w == pid || (w < 0 && errno != EINTR))
            return true;
        if (cm_time_s() >= end)
            return false;
        usleep(20000);
    }
}

/* The port of "http=HOST:PORT" in the port file, or 0. */
static int bw_worker_port(const char *path)
{
    FILE *f = fopen(path, "r");
    char line[512];
    int port = 0;
    if (f == NULL)
        return 0;
    while (fgets(line, sizeof(line), f)) {
        char *colon = strrchr(line, ':');
        if (strncmp(line, "http=", 5) == 0 && colon != NULL && strchr(colon, '\n') != NULL)
            port = atoi(colon + 1);
    }
    fclose(f);
    return port > 0 && port < 65536 ? port : 0;
}

static void bw_worker_exec(const char *bin, const char *ports, const char *log, const char *kvs_grpc,
                           const bw_opts_t *o)
{
    const char *args[BW_MAX_WORKER_ARGS + 12];
    int n = 0, fd = open(log, O_WRONLY | O_CREAT | O_TRUNC, 0600), in = open("/dev/null", O_RDONLY);
    if (fd >= 0) {
        dup2(fd, 1);
        dup2(fd, 2);
    }
    if (in >= 0)
        dup2(in, 0);
    prctl(PR_SET_PDEATHSIG, SIGTERM); /* never outlives the bench */
    args[n++] = bin;
    args[n++] = "--listen";
    args[n++] = "127.0.0.1:0";
    args[n++] = "--port-file";
    args[n++] = ports;
    args[n++] = "--kvstore";
    args[n++] = kvs_grpc;
    for (unsigned i = 0; i < o->n_worker_args; i++)
        args[n++] = o->worker_args[i];
    args[n] = NULL;
    execv(bin, (char *const *)args);
    _exit(127);
}

/* Print the end of the worker's log (why it did not start). */
static void bw_worker_log_tail(const bw_worker_t *w)
{
    char cmd[400];
    snprintf(cmd, sizeof(cmd), "tail -n 20 '%s' >&2", w->log);
    if (system(cmd) != 0)
        fprintf(stderr, "(no log at %s)\n", w->log);
}

/* Start ri-worker against the kvstore at kvs_grpc and wait for its port.
 * 0, or -1 (message printed; the log is kept in w->dir). */
static int bw_worker_start(bw_worker_t *w, const char *argv0, const char *kvs_grpc, const bw_opts_t *o)
{
    char bin[PATH_MAX], ports[320];
    memset(w, 0, sizeof(*w));
    bn_program_path(argv0, "ri-worker", bin, sizeof(bin));
    if (access(bin, X_OK) != 0) {
        fprintf(stderr, "ri bench load: %s not found (build it)\n", bin);
        return -1;
    }
    snprintf(w->dir, sizeof(w->dir), "%s/ri-bench-wk-XXXXXX", getenv("TMPDIR") ? getenv("TMPDIR") : "/tmp");
    if (mkdtemp(w->dir) == NULL) {
        perror("ri bench load: mkdtemp");
        w->dir[0] = '\0';
        return -1;
    }
    snprintf(ports, sizeof(ports), "%s/port", w->dir);
    snprintf(w->log, sizeof(w->log), "%s/worker.log", w->dir);
    w->pid = fork();
    if (w->pid < 0) {
        perror("ri bench load: fork");
        w->pid = 0;
        return -1;
    }
    if (w->pid == 0)
        bw_worker_exec(bin, ports, w->log, kvs_grpc, o);
    for (double end = cm_time_s() + BW_START_TIMEOUT_S; cm_time_s() < end;) {
        if ((w->port = bw_worker_port(ports)) > 0)
            return 0;
        if (waitpid(w->pid, NULL, WNOHANG) == w->pid) {
            w->pid = 0;
            break;
        }
        usleep(50000);
    }
    fprintf(stderr, "ri bench load: ri-worker did not start (log %s):\n", w->log);
    bw_worker_log_tail(w);
    return -1;
}

/* SIGTERM (SIGKILL after 20 s), then remove the folder unless keep_log. */
static void bw_worker_stop(bw_worker_t *w, bool keep_log)
{
    char p[320];
    if (w->pid > 0) {
        kill(w->pid, SIGTERM);
        if (!bw_wait_until(w->pid, cm_time_s() + 20)) {
            kill(w->pid, SIGKILL);
            waitpid(w->pid, NULL, 0);
        }
        w->pid = 0;
    }
    if (w->dir[0] && keep_log)
        fprintf(stderr, "ri bench load: the worker's log is kept in %s\n", w->log);
    if (w->dir[0] && !keep_log) {
        snprintf(p, sizeof(p), "%s/port", w->dir);
        unlink(p);
        unlink(w->log);
        rmdir(w->dir);
    }
}

/* The worker's model id (GET /v1/models, the first entry) into out.  0, or
 * -1 (message printed). */
static int bw_model_id(int port, const char *api_key, char *out, size_t len)
{
    char req[1024];
    size_t n = bl_http_format(req, sizeof(req), "GET", "/v1/models", api_key, NULL);
    bl_http_reply_t *r = malloc(sizeof(*r));
    int rc = -1;
    if (r == NULL)
        return -1;
    bl_http_exchange(port, req, n, cm_time_s() + 10, r);
    const char *body = r->end == BL_HTTP_OK && r->status == 200 ? strstr(r->buf, "\r\n\r\n") : NULL;
    cJSON *j = body ? cJSON_Parse(body + 4) : NULL;
    const cJSON *id = cJSON_GetObjectItem(cJSON_GetArrayItem(cJSON_GetObjectItem(j, "data"), 0), "id");
    /* It goes into request bodies verbatim: refuse what would need escaping. */
    if (cJSON_IsString(id) && strpbrk(id->valuestring, "\"\\") == NULL && strlen(id->valuestring) < len) {
        snprintf(out, len, "%s", id->valuestring);
        rc = 0;
    } else {
        fprintf(stderr, "ri bench load: GET /v1/models failed (%s, status %d)\n", bl_http_end_str(r->end), r->status);
    }
    cJSON_Delete(j);
    free(r);
    return rc;
}

/* ---- the kvstore's side ---- */

/* Sessions open in the kvstore: the ri_kvs_sessions gauge of its /metrics
 * (plain HTTP, so that the bench holds no gRPC state while it forks
 * clients), or -1. */
static long bw_kvs_sessions(const bn_daemon_t *d)
{
    char req[256];
    const char *colon = strrchr(d->metrics, ':');
    bl_http_reply_t *r = malloc(sizeof(*r));
    long n = -1;
    if (r == NULL || colon == NULL) {
        free(r);
        return -1;
    }
    size_t len = bl_http_format(req, sizeof(req), "GET", "/metrics", NULL, NULL);
    bl_http_exchange(atoi(colon + 1), req, len, cm_time_s() + 5, r);
    const char *g = r->end == BL_HTTP_OK && r->status == 200 ? strstr(r->buf, "\nri_kvs_sessions ") : NULL;
    if (g != NULL)
        n = strtol(g + strlen("\nri_kvs_sessions "), NULL, 10);
    free(r);
    return n;
}

/* ---- clients ---- */

static void bw_count(bw_shared_t *sh, int kind)
{
    atomic_fetch_add(&sh->count[kind], 1);
}

/* The error kind of a reply that is not a complete 200. */
static int bw_failure(const bl_http_reply_t *r)
{
    if (r->end == BL_HTTP_CONNECT)
        return BW_E_CONNECT;
    if (r->status == 429)
        return BW_E_429;
    if (r->status >= 400 && r->status < 500)
        return BW_E_4XX;
    if (r->status >= 500)
        return BW_E_5XX;
    if (r->end == BL_HTTP_TIMEOUT)
        return BW_E_TIMEOUT;
    if (r->end == BL_HTTP_TOO_BIG)
        return BW_E_TOO_BIG;
    return r->status == 0 ? BW_E_CLOSED : BW_E_BAD_REPLY;
}

static size_t bw_completion_req(const bw_run_t *run, bool stream, unsigned n, char *out, size_t cap)
{
    char body[2048];
    snprintf(body, sizeof(body),
             "{\"model\":\"%s\",\"prompt\":\"Request %u. The grass is green. The sky is blue. The sun is yellow. "
             "Here we go. There and back again. Tell me a short story about a cat who lives on a boat.\","
             "\"max_tokens\":%u,\"stream\":%s}",
             run->model, n, run->max_tokens, stream ? "true" : "false");
    return bl_http_format(out, cap, "POST", "/v1/completions", run->api_key, body);
}

/* The kind of a stream's reply that ended by itself (EOF or deadline). */
static int bw_stream_end(const bl_http_reply_t *r, bool done, bool err)
{
    if (r->status != 0 && r->status != 200)
        return bw_failure(r);
    if (err)
        return BW_E_ERROR_EVENT;
    if (done)
        return BW_OK;
    return r->end == BL_HTTP_TIMEOUT ? BW_E_TIMEOUT : r->status == 0 && r->events == 0 ? BW_E_CLOSED
                                                                                         : BW_E_TRUNCATED;
}

/* A stream: read its first events, then leave (abort) or read to the end.
 * Closes fd; returns the kind to count. */
static int bw_stream(const bw_run_t *run, unsigned idx, int fd, bool abort_it, double deadline, bl_http_reply_t *r)
{
    size_t first = abort_it ? 1 + (size_t)(rand() % 4) : 1;
    bl_http_read(fd, deadline, first, r);
    if (r->end != BL_HTTP_STOPPED || r->status != 200) {
        bl_http_close(fd, false);
        return r->end == BL_HTTP_CONNECT || r->end == BL_HTTP_TOO_BIG ? bw_failure(r)
                                                                       : bw_stream_end(r, r->done, r->error_event);
    }
    if (abort_it) {
        bl_http_close(fd, true); /* RST mid-stream, like a client that crashed */
        return BW_ABORTED;
    }
    bool done = r->done, err = r->error_event;
    atomic_store(&run->sh->streaming[idx], 1); /* from here the bench may SIGKILL this process */
    if (!done)
        bl_http_read(fd, deadline, 0, r);
    atomic_store(&run->sh->streaming[idx], 0);
    bl_http_close(fd, false);
    r->status = 200; /* the second read starts after the status line */
    return bw_stream_end(r, done || r->done, err || r->error_event);
}

/* One completion of a random kind: plain, streamed, or streamed and
 * abandoned.  Returns the kind to count. */
static int bw_one(const bw_run_t *run, unsigned idx, unsigned n, bl_http_reply_t *r)
{
    char req[4096];
    int kind = rand() % 3;
    size_t len = bw_completion_req(run, kind != 0, n, req, sizeof(req));
    double deadline = cm_time_s() + BW_REQ_TIMEOUT_S;
    if (kind == 0) {
        bl_http_exchange(run->port, req, len, deadline, r);
        bool ok = r->end == BL_HTTP_OK && r->status == 200;
        return ok && strstr(r->buf, "\"choices\"") ? BW_OK : ok ? BW_E_BAD_REPLY : bw_failure(r);
    }
    bl_http_end_t end;
    int fd = bl_http_send(run->port, req, len, deadline, &end);
    if (fd < 0)
        return end == BL_HTTP_CONNECT ? BW_E_CONNECT : BW_E_CLOSED;
    return bw_stream(run, idx, fd, kind == 2, deadline, r);
}

/* A client process: completions until the deadline (at most 100000). */
static void bw_client(const bw_run_t *run, unsigned idx, unsigned seed)
{
    bl_http_reply_t *r = malloc(sizeof(*r));
    prctl(PR_SET_PDEATHSIG, SIGKILL);
    srand(seed);
    if (r == NULL)
        _exit(1);
    for (unsigned n = 0; n < 100000 && cm_time_s() < run->deadline; n++) {
        int kind = bw_one(run, idx, seed * 100000u + n, r);
        bw_count(run->sh, kind);
        if (kind != BW_OK && kind != BW_ABORTED)
            usleep(100000); /* a server that refuses is not hammered in a tight loop */
    }
    free(r);
    _exit(0);
}

static pid_t bw_spawn(const bw_run_t *run, unsigned idx, unsigned seed)
{
    atomic_store(&run->sh->streaming[idx], 0);
    pid_t p = fork();
    if (p == 0)
        bw_client(run, idx, seed);
    return p;
}

/* SIGKILL one client that is mid-stream (if any), start a new one in its
 * place.  Returns 1 when one was killed. */
static unsigned bw_kill_streaming(const bw_run_t *run, pid_t *pids, unsigned clients, unsigned *seed)
{
    unsigned start = (unsigned)rand() % clients;
    for (unsigned k = 0; k < clients; k++) {
        unsigned v = (start + k) % clients;
        if (pids[v] <= 0 || !atomic_load(&run->sh->streaming[v]))
            continue;
        kill(pids[v], SIGKILL);
        waitpid(pids[v], NULL, 0);
        pids[v] = bw_spawn(run, v, (*seed)++);
        return 1;
    }
    return 0;
}

/* Wait for the clients to finish their last request (bounded: SIGKILL after
 * the request limit).  Returns how many had to be killed. */
static unsigned bw_reap(pid_t *pids, unsigned clients)
{
    unsigned killed = 0;
    double end = cm_time_s() + BW_REQ_TIMEOUT_S + 5;
    for (unsigned i = 0; i < clients; i++) {
        if (pids[i] > 0 && !bw_wait_until(pids[i], end)) {
            kill(pids[i], SIGKILL);
            waitpid(pids[i], NULL, 0);
            killed++;
        }
        pids[i] = 0;
    }
    return killed;
}

/* ---- the run ---- */

typedef struct bw_result {
    double seconds;
    unsigned killed;          /* clients SIGKILLed mid-stream */
    unsigned reaped;          /* clients killed at the end (stuck past the request limit) */
    long sessions_before, sessions_after;
    long sessions_peak;       /* most kvstore sessions seen open during the traffic (sampled each second) */
    long rss_wk[2], rss_kvs[2]; /* KiB, before / after */
    long rss_wk_half, rss_kvs_half; /* KiB, halfway through the traffic (warmed up: a leak
                                       shows as growth from here to the end) */
    pid_t worker_pid;         /* for the halfway sample */
    bool worker_served, kvstore_served;
    char worker_why[128];     /* why the worker failed the final check */
} bw_result_t;

/* Traffic for o->seconds: clients, kills, slowloris, prober. */
static int bw_traffic(const bw_opts_t *o, const bn_daemon_t *d, bw_run_t *run, bl_probe_t *pr, bl_slow_t *sl,
                      bw_result_t *res)
{
    pid_t pids[BW_MAX_CLIENTS] = {0};
    unsigned seed = 1;
    double t0 = cm_time_s(), next_kill = t0 + o->kill_ms / 1000.0, next_sample = t0 + 1;
    run->deadline = t0 + o->seconds;
    *pr = (bl_probe_t){.port = run->port, .api_key = o->api_key, .deadline = run->deadline, .timeout_s = 2};
    *sl = (bl_slow_t){.port = run->port, .m = o->slowloris, .trickle_s = o->trickle_s, .deadline = run->deadline};
    if (inet_pton(AF_INET, o->slow_from, &sl->src) != 1) {
        fprintf(stderr, "ri bench load --worker: --slowloris-from %s is not an IPv4 address\n", o->slow_from);
        return -1;
    }
    if (bl_probe_start(pr) != 0)
        return -1;
    if (bl_slow_start(sl) != 0) {
        bl_probe_join(pr);
        return -1;
    }
    for (unsigned i = 0; i < o->clients; i++)
        pids[i] = bw_spawn(run, i, seed++);
    while (cm_time_s() < run->deadline) {
        usleep(20000);
        if (cm_time_s() >= next_kill) {
            res->killed += bw_kill_streaming(run, pids, o->clients, &seed);
            next_kill += o->kill_ms / 1000.0;
        }
        if (cm_time_s() >= next_sample) {
            long n = bw_kvs_sessions(d);
            res->sessions_peak = n > res->sessions_peak ? n : res->sessions_peak;
            if (res->rss_wk_half == 0 && cm_time_s() >= t0 + o->seconds / 2) {
                res->rss_wk_half = bn_pid_rss_kib(res->worker_pid);
                res->rss_kvs_half = bn_daemon_rss_kib(d);
            }
            next_sample += 1;
        }
    }
    bl_slow_join(sl);
    bl_probe_join(pr);
    res->reaped = bw_reap(pids, o->clients);
    res->seconds = cm_time_s() - t0;
    return 0;
}

/* Wait (at most 15 s) for the kvstore's session count to fall back to
 * before; the worker may still be finishing requests of killed clients. */
static long bw_sessions_settled(const bn_daemon_t *d, long before)
{
    long now = bw_kvs_sessions(d);
    for (int i = 0; i < 75 && now > before; i++) {
        usleep(200000);
        now = bw_kvs_sessions(d);
    }
    return now;
}

/* The kvstore answers Health and ListSessions over gRPC (the first gRPC
 * client of the run: every client process is gone by now). */
static bool bw_kvs_serves(const bn_daemon_t *d)
{
    gw_ctl_t *c = NULL;
    gw_ctl_health_t h;
    gw_ctl_session_info_t *infos = NULL;
    size_t n = 0;
    bool ok = gw_ctl_create(d->grpc, NULL, &c) == RI_OK && gw_ctl_health(c, 5000, &h, NULL) == RI_OK &&
              gw_ctl_list_sessions(c, 5000, &infos, &n, NULL) == RI_OK;
    cm_free(infos);
    gw_ctl_destroy(c);
    return ok;
}

/* After the load: the worker answers /health and a completion; the kvstore
 * answers Health and ListSessions. */
static void bw_check_served(const bw_run_t *run, const bn_daemon_t *d, bw_result_t *res)
{
    char req[4096];
    bl_http_reply_t *r = malloc(sizeof(*r));
    res->kvstore_served = bw_kvs_serves(d);
    res->worker_served = false;
    snprintf(res->worker_why, sizeof(res->worker_why), "out of memory");
    if (r == NULL)
        return;
    size_t len = bl_http_format(req, sizeof(req), "GET", "/health", run->api_key, NULL);
    bl_http_exchange(run->port, req, len, cm_time_s() + 10, r);
    if (r->end != BL_HTTP_OK || r->status != 200) {
        snprintf(res->worker_why, sizeof(res->worker_why), "/health: %s, status %d", bl_http_end_str(r->end),
                 r->status);
        goto out;
    }
    len = bw_completion_req(run, false, 0, req, sizeof(req));
    bl_http_exchange(run->port, req, len, cm_time_s() + 60, r);
    if (r->end != BL_HTTP_OK || r->status != 200 || strstr(r->buf, "\"choices\"") == NULL) {
        snprintf(res->worker_why, sizeof(res->worker_why), "completion: %s, status %d", bl_http_end_str(r->end),
                 r->status);
        goto out;
    }
    res->worker_served = true;
    res->worker_why[0] = '\0';
out:
    free(r);
}

/* ---- report ---- */

static void bw_row_health(cJSON *row, const bl_probe_t *pr)
{
    cJSON_AddNumberToObject(row, "health_probes", (double)pr->n);
    cJSON_AddNumberToObject(row, "health_failed", (double)pr->n_fail);
    cJSON_AddNumberToObject(row, "health_p99_ms", bn_percentile(pr->lat_ms, pr->n, 99));
    cJSON_AddNumberToObject(row, "health_max_ms", bn_percentile(pr->lat_ms, pr->n, 100));
    cJSON *fl = cJSON_AddArrayToObject(row, "health_failures");
    for (size_t i = 0; i < pr->n_fail; i++) {
        const bl_probe_fail_t *f = &pr->fails[i];
        cJSON *o = cJSON_CreateObject();
        char kind[32];
        if (f->status != 0)
            snprintf(kind, sizeof(kind), "status_%d", f->status);
        else
            snprintf(kind, sizeof(kind), "%s", bl_http_end_str(f->end));
        cJSON_AddNumberToObject(o, "t_s", f->t_s);
        cJSON_AddNumberToObject(o, "ms", f->ms);
        cJSON_AddStringToObject(o, "kind", kind);
        cJSON_AddItemToArray(fl, o);
    }
}

static void bw_row(cJSON *row, const bw_opts_t *o, const bw_shared_t *sh, const bl_probe_t *pr,
                   const bl_slow_t *sl, const bw_result_t *res)
{
    uint64_t ok = atomic_load(&sh->count[BW_OK]), aborted = atomic_load(&sh->count[BW_ABORTED]), failed = 0;
    cJSON_AddStringToObject(row, "mode", "worker");
    cJSON_AddNumberToObject(row, "clients", o->clients);
    cJSON_AddNumberToObject(row, "sessions", (double)res->sessions_peak); /* the most open at once */
    cJSON_AddNumberToObject(row, "seconds", res->seconds);
    cJSON_AddNumberToObject(row, "requests", (double)(ok + aborted));
    cJSON_AddNumberToObject(row, "requests_per_s", (double)(ok + aborted) / res->seconds);
    cJSON *ek = cJSON_AddObjectToObject(row, "errors");
    for (int k = BW_E_CONNECT; k < BW_KINDS; k++) {
        cJSON_AddNumberToObject(ek, bw_kind[k], (double)atomic_load(&sh->count[k]));
        failed += atomic_load(&sh->count[k]);
    }
    cJSON_AddNumberToObject(ek, "health", (double)pr->n_fail);
    cJSON_AddNumberToObject(row, "completions_ok", (double)ok);
    cJSON_AddNumberToObject(row, "completions_failed", (double)failed);
    cJSON_AddNumberToObject(row, "streams_aborted", (double)aborted);
    cJSON_AddNumberToObject(row, "clients_killed", res->killed);
    cJSON_AddNumberToObject(row, "clients_stuck_at_end", res->reaped);
    cJSON_AddNumberToObject(row, "max_tokens", o->max_tokens);
    cJSON_AddNumberToObject(row, "kill_ms", o->kill_ms);
    bw_row_health(row, pr);
    cJSON_AddNumberToObject(row, "slowloris", o->slowloris);
    cJSON_AddStringToObject(row, "slowloris_from", o->slow_from);
    cJSON_AddNumberToObject(row, "slowloris_opened", sl->opened);
    cJSON_AddNumberToObject(row, "slowloris_connect_failed", sl->connect_failed);
    cJSON_AddNumberToObject(row, "slowloris_closed_by_server", sl->closed_by_server);
    cJSON_AddNumberToObject(row, "slowloris_held_end", sl->held_end);
    cJSON_AddNumberToObject(row, "slowloris_oldest_s", sl->oldest_s);
    cJSON_AddNumberToObject(row, "sessions_before", (double)res->sessions_before);
    cJSON_AddNumberToObject(row, "sessions_after", (double)res->sessions_after);
    cJSON_AddNumberToObject(row, "sessions_peak", (double)res->sessions_peak);
    long leaked = res->sessions_after - res->sessions_before;
    cJSON_AddNumberToObject(row, "sessions_leaked", (double)(leaked > 0 ? leaked : 0));
    cJSON_AddNumberToObject(row, "rss_before", (double)(res->rss_wk[0] + res->rss_kvs[0]) * 1024);
    cJSON_AddNumberToObject(row, "rss_after", (double)(res->rss_wk[1] + res->rss_kvs[1]) * 1024);
    cJSON_AddNumberToObject(row, "rss_worker_before", (double)res->rss_wk[0] * 1024);
    cJSON_AddNumberToObject(row, "rss_worker_after", (double)res->rss_wk[1] * 1024);
    cJSON_AddNumberToObject(row, "rss_kvstore_before", (double)res->rss_kvs[0] * 1024);
    cJSON_AddNumberToObject(row, "rss_kvstore_after", (double)res->rss_kvs[1] * 1024);
    cJSON_AddNumberToObject(row, "rss_worker_half", (double)res->rss_wk_half * 1024);
    cJSON_AddNumberToObject(row, "rss_kvstore_half", (double)res->rss_kvs_half * 1024);
    cJSON_AddBoolToObject(row, "served_after", res->worker_served && res->kvstore_served);
    cJSON_AddBoolToObject(row, "worker_served_after", res->worker_served);
    cJSON_AddBoolToObject(row, "kvstore_served_after", res->kvstore_served);
    cJSON_AddBoolToObject(row, "api_key", o->api_key != NULL);
    cJSON *wa = cJSON_AddArrayToObject(row, "worker_args");
    for (unsigned i = 0; i < o->n_worker_args; i++)
        cJSON_AddItemToArray(wa, cJSON_CreateString(o->worker_args[i]));
}

static void bw_table(const bw_opts_t *o, const bw_shared_t *sh, const bl_probe_t *pr, const bl_slow_t *sl,
                     const bw_result_t *res)
{
    uint64_t ok = atomic_load(&sh->count[BW_OK]), aborted = atomic_load(&sh->count[BW_ABORTED]);
    long leaked = res->sessions_after > res->sessions_before ? res->sessions_after - res->sessions_before : 0;
    printf("%-7s %-7s %-8s %-8s %-7s %-6s %-7s %-7s %-9s %-9s %-11s %-11s %-11s %s\n", "clients", "seconds",
           "compl ok", "aborted", "killed", "health", "h fail", "h p99", "h max ms", "sess lkd", "slow held",
           "rss wk MiB", "rss kv MiB", "served after");
    printf("%-7u %-7.1f %-8llu %-8llu %-7u %-6zu %-7zu %-7.0f %-9.0f %-9ld %-11u %-11.1f %-11.1f %s\n", o->clients,
           res->seconds, (unsigned long long)ok, (unsigned long long)aborted, res->killed, pr->n, pr->n_fail,
           bn_percentile(pr->lat_ms, pr->n, 99), bn_percentile(pr->lat_ms, pr->n, 100), leaked, sl->held_end,
           res->rss_wk[1] / 1024.0, res->rss_kvs[1] / 1024.0, res->worker_served && res->kvstore_served ? "yes" : "NO");
    printf("kvstore sessions: %ld before, at most %ld during, %ld after the clients left (%ld leaked)\n",
           res->sessions_before, res->sessions_peak, res->sessions_after, leaked);
    printf("rss (MiB) before / halfway / after: worker %.1f / %.1f / %.1f, kvstore %.1f / %.1f / %.1f\n",
           res->rss_wk[0] / 1024.0, res->rss_wk_half / 1024.0, res->rss_wk[1] / 1024.0, res->rss_kvs[0] / 1024.0,
           res->rss_kvs_half / 1024.0, res->rss_kvs[1] / 1024.0);
    printf("slowloris: %u wanted, %u opened, %u connects failed, %u closed by the server, %u held at the end "
           "(oldest %.1f s)\n",
           o->slowloris, sl->opened, sl->connect_failed, sl->closed_by_server, sl->held_end, sl->oldest_s);
    printf("completion errors by kind:");
    for (int k = BW_E_CONNECT; k < BW_KINDS; k++)
        printf(" %s %llu", bw_kind[k], (unsigned long long)atomic_load(&sh->count[k]));
    printf("\n");
    for (size_t i = 0; i < pr->n_fail && i < 10; i++)
        printf("health failure at %.1f s after %.0f ms: %s, status %d\n", pr->fails[i].t_s, pr->fails[i].ms,
               bl_http_end_str(pr->fails[i].end), pr->fails[i].status);
    if (pr->n_fail > 10)
        printf("... %zu more health failures (all in the JSON)\n", pr->n_fail - 10);
    if (!res->worker_served)
        printf("the worker did not serve at the end: %s\n", res->worker_why);
}

/* Slowloris needs a file descriptor per connection: raise the soft limit. */
static void bw_raise_nofile(void)
{
    struct rlimit rl;
    if (getrlimit(RLIMIT_NOFILE, &rl) == 0 && rl.rlim_cur < rl.rlim_max) {
        rl.rlim_cur = rl.rlim_max;
        (void)setrlimit(RLIMIT_NOFILE, &rl);
    }
}

int bl_worker_main(int argc, char **argv)
{
    bw_args_t args;
    bw_opts_t o;
    bn_daemon_t d = {0};
    bw_worker_t w = {0};
    bw_run_t run = {0};
    bw_result_t res = {.sessions_before = -1, .sessions_after = -1};
    bl_probe_t pr = {0};
    bl_slow_t sl = {0};
    int rc = 1;
    bool traffic = false;

    const char *wargs[BW_MAX_WORKER_ARGS];
    int n_wargs = bn_args_take_all(&argc, argv, "worker-arg", wargs, BW_MAX_WORKER_ARGS);
    if (n_wargs < 0) {
        fprintf(stderr, "ri bench load --worker: at most %d --worker-arg, each with its value\n", BW_MAX_WORKER_ARGS);
        return 2;
    }
    int arc = bn_args_load(&bw_cfg_table, &args, argc, argv, NULL);
    if (arc >= 0)
        return arc;
    const char *json = args.json;
    bw_parse(&args, &o);
    for (int i = 0; i < n_wargs; i++)
        o.worker_args[o.n_worker_args++] = wargs[i];
    bw_raise_nofile();
    bn_report_t *rep = bn_report_create("load");
    run.sh = mmap(NULL, sizeof(bw_shared_t), PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    if (rep == NULL || run.sh == MAP_FAILED) {
        run.sh = NULL;
        goto out;
    }
    memset(run.sh, 0, sizeof(*run.sh));
    run.port = 0;
    run.api_key = o.api_key;
    run.max_tokens = o.max_tokens;
    if (bn_daemon_start(&d, argv[0], "512MiB") != 0 || bw_worker_start(&w, argv[0], d.grpc, &o) != 0)
        goto out;
    run.port = w.port;
    if (bw_model_id(w.port, o.api_key, run.model, sizeof(run.model)) != 0)
        goto out;
    printf("worker mode: ri-worker on 127.0.0.1:%d (model %s), ri-kvstore on %s; %u clients, %u slowloris, %.0f s\n",
           w.port, run.model, d.grpc, o.clients, o.slowloris, o.seconds);
    fflush(stdout);
    res.sessions_before = bw_kvs_sessions(&d);
    res.worker_pid = w.pid;
    res.rss_wk[0] = bn_pid_rss_kib(w.pid);
    res.rss_kvs[0] = bn_daemon_rss_kib(&d);
    if (bw_traffic(&o, &d, &run, &pr, &sl, &res) != 0)
        goto out;
    traffic = true;
    res.sessions_after = bw_sessions_settled(&d, res.sessions_before);
    res.rss_wk[1] = bn_pid_rss_kib(w.pid);
    res.rss_kvs[1] = bn_daemon_rss_kib(&d);
    bw_check_served(&run, &d, &res);
    bw_row(bn_report_row(rep), &o, run.sh, &pr, &sl, &res);
    bw_table(&o, run.sh, &pr, &sl, &res);
    rc = res.worker_served && res.kvstore_served ? 0 : 1;
    if (rc != 0)
        fprintf(stderr, "BENCH FAILED: %s did not serve after the load\n",
                res.worker_served ? "ri-kvstore" : "ri-worker");
out:
    bw_worker_stop(&w, !traffic);
    bn_daemon_stop(&d);
    bl_probe_free(&pr);
    if (rep != NULL && bn_report_finish(rep, json) != 0)
        rc = 1;
    if (run.sh != NULL)
        munmap(run.sh, sizeof(bw_shared_t));
    cm_config_free(&bw_cfg_table, &args);
    return rc;
}
