/*
 * ri bench load: many clients against one real ri-kvstore for a fixed time,
 * some of them killed with SIGKILL mid-call, then proof that the daemon still
 * serves.  Each client is a process running, in a loop: CreateSession,
 * a data-plane connect + UPLOAD of a few clusters + PING, ListSessions,
 * DropSession (it keeps up to --sessions open, dropping the oldest).  Every
 * --kill-ms the parent SIGKILLs a random client and starts a new one.
 * Reported: requests served, errors by kind, clients killed, the daemon's
 * RSS before and after, and whether it answered Health, CreateSession and a
 * data-plane PING at the end (`served_after`).  Exit 1 when it did not.
 *
 *   ri bench load [--json PATH] [--clients N] [--sessions M] [--seconds S]
 *                 [--kill-ms MS]     (--help lists them)
 *
 * With --worker it loads a real ri-worker in front of the kvstore instead
 * (bn_load_worker.c).
 */
#define _GNU_SOURCE
#include <errno.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include "bench/common/bn_args.h"
#include "bench/common/bn_daemon.h"
#include "bench/common/bn_report.h"
#include "bench/load/bn_load_worker.h"
#include "common/cm_alloc.h"
#include "common/cm_log.h"
#include "common/cm_runtime.h"
#include "common/cm_time.h"
#include "gpuworker/client/gw_ctl.h"
#include "gpuworker/client/gw_dp.h"

#include <ucp/api/ucp.h>

#define BL_MAX_CLIENTS 64
#define BL_MAX_SESSIONS 16

/* Error kinds counted across all clients (shared memory). */
enum { BL_OK, BL_E_CREATE, BL_E_CONNECT, BL_E_UPLOAD, BL_E_PING, BL_E_LIST, BL_E_DROP, BL_KINDS };
static const char *const bl_kind[BL_KINDS] = {"ok", "create", "connect", "upload", "ping", "list", "drop"};

/* Per client slot: in_connect while it is inside gw_dp_connect, kill_req
 * once the parent has chosen it.  UCX 1.13 (Debian 12) aborts the daemon
 * when a peer dies in the middle of the wireup of a new connection (a
 * wireup message still queued on the TCP endpoint when it fails trips an
 * assertion in ucp_request_send_state_ff; UCX 1.14 dropped it).  Unless
 * --kill-in-connect, the parent kills a client only outside its connect:
 * client stores in_connect then loads kill_req, parent stores kill_req then
 * loads in_connect (both seq_cst), so one of them sees the other. */
typedef struct bl_slot {
    _Atomic int in_connect, kill_req;
} bl_slot_t;

typedef struct bl_shared {
    _Atomic uint64_t count[BL_KINDS];
    bl_slot_t slot[BL_MAX_CLIENTS];
} bl_shared_t;

static const gw_ctl_geometry_t bl_geo = {.layers = 2, .kv_heads = 2, .head_dim = 64, .dtype = 1, .page_tokens = 8};

/* Upload 4 clusters of 16 tokens to layer 0, heads 0 and 1. */
static ri_status_t bl_upload(gw_dp_t *dp)
{
    static uint8_t kv[2 * 4 * 16 * 64 * 2 * 2];
    uint32_t heads[2] = {0, 1}, counts[2] = {4, 4}, tokens[8];
    for (int i = 0; i < 8; i++)
        tokens[i] = 16;
    uint32_t first[2];
    return gw_dp_upload(dp, false, 0, 2, heads, counts, tokens, kv, sizeof(kv), first);
}

static void bl_count(bl_shared_t *sh, int kind)
{
    atomic_fetch_add(&sh->count[kind], 1);
}

/* One client process: runs until killed or the deadline passes. */
/* Enter a connect unless the parent wants this client dead: then wait for
 * the SIGKILL outside it. */
static void bl_enter_connect(bl_slot_t *slot)
{
    atomic_store(&slot->in_connect, 1);
    if (!atomic_load(&slot->kill_req))
        return;
    atomic_store(&slot->in_connect, 0);
    for (;;)
        pause();
}

static void bl_client(const bn_daemon_t *d, bl_shared_t *sh, bl_slot_t *slot, unsigned max_sessions,
                      double deadline, unsigned seed)
{
    gw_ctl_t *c = NULL;
    uint64_t ids[BL_MAX_SESSIONS];
    unsigned n = 0;
    srand(seed);
    if (gw_ctl_create(d->grpc, NULL, &c) != RI_OK)
        _exit(1);
    while (cm_time_s() < deadline) {
        gw_ctl_session_t s;
        gw_dp_t *dp = NULL;
        if (gw_ctl_create_session(c, 5000, &bl_geo, 256, "load", &s, NULL) != RI_OK) {
            bl_count(sh, BL_E_CREATE);
            usleep(10000);
            continue;
        }
        bl_count(sh, BL_OK);
        ids[n++] = s.session_id;
        bl_enter_connect(slot);
        ri_status_t cst = gw_dp_connect(s.dataplane_address, s.session_id, s.secret, NULL, &dp);
        atomic_store(&slot->in_connect, 0);
        if (cst != RI_OK) {
            bl_count(sh, BL_E_CONNECT);
        } else {
            bl_count(sh, bl_upload(dp) == RI_OK ? BL_OK : BL_E_UPLOAD);
            bl_count(sh, gw_dp_ping(dp) == RI_OK ? BL_OK : BL_E_PING);
            gw_dp_close(dp);
        }
        gw_ctl_session_info_t *infos = NULL;
        size_t ni = 0;
        bl_count(sh, gw_ctl_list_sessions(c, 5000, &infos, &ni, NULL) == RI_OK ? BL_OK : BL_E_LIST);
        cm_free(infos);
        if (n >= max_sessions) {
            bl_count(sh, gw_ctl_drop_session(c, 5000, ids[0], NULL, NULL) == RI_OK ? BL_OK : BL_E_DROP);
            memmove(ids, ids + 1, (--n) * sizeof(ids[0]));
        }
    }
    while (n > 0)
        (void)gw_ctl_drop_session(c, 5000, ids[--n], NULL, NULL);
    gw_ctl_destroy(c);
    _exit(0);
}

static pid_t bl_spawn(const bn_daemon_t *d, bl_shared_t *sh, unsigned i, unsigned sessions, double deadline,
                      unsigned seed)
{
    atomic_store(&sh->slot[i].in_connect, 0);
    atomic_store(&sh->slot[i].kill_req, 0);
    pid_t p = fork();
    if (p == 0)
        bl_client(d, sh, &sh->slot[i], sessions, deadline, seed);
    return p;
}

/* SIGKILL client i; outside a connect unless anywhere. */
static void bl_kill(bl_shared_t *sh, pid_t pid, unsigned i, bool anywhere)
{
    atomic_store(&sh->slot[i].kill_req, 1);
    while (!anywhere && atomic_load(&sh->slot[i].in_connect))
        usleep(200);
    kill(pid, SIGKILL);
    waitpid(pid, NULL, 0);
}

/* After the storm: Health, a session, a data-plane ping; *open_p = the
 * sessions still open before ours (those of killed clients stay). */
static bool bl_still_serves(const bn_daemon_t *d, size_t *open_p)
{
    gw_ctl_t *c = NULL;
    gw_ctl_health_t h;
    gw_ctl_session_t s;
    gw_dp_t *dp = NULL;
    gw_ctl_session_info_t *infos = NULL;
    *open_p = 0;
    bool ok = gw_ctl_create(d->grpc, NULL, &c) == RI_OK && gw_ctl_health(c, 5000, &h, NULL) == RI_OK &&
              gw_ctl_list_sessions(c, 5000, &infos, open_p, NULL) == RI_OK &&
              gw_ctl_create_session(c, 5000, &bl_geo, 256, "after", &s, NULL) == RI_OK &&
              gw_dp_connect(s.dataplane_address, s.session_id, s.secret, NULL, &dp) == RI_OK && gw_dp_ping(dp) == RI_OK;
    cm_free(infos);
    gw_dp_close(dp);
    gw_ctl_destroy(c);
    return ok;
}

typedef struct bl_opts {
    char *json;
    bool worker;      /* the other mode (bn_load_worker.c) */
    int64_t clients;
    int64_t sessions;
    double seconds;
    int64_t kill_ms;
    bool kill_in_connect;
} bl_opts_t;

static const cm_config_item_t bl_items[] = {
    BN_ARG_JSON(bl_opts_t, json),
    BN_ARG(bl_opts_t, "clients", CM_CFG_INT, "8", "client processes", clients, 1, BL_MAX_CLIENTS),
    BN_ARG(bl_opts_t, "sessions", CM_CFG_INT, "4", "sessions each client keeps open", sessions, 1, BL_MAX_SESSIONS),
    BN_ARG(bl_opts_t, "seconds", CM_CFG_DOUBLE, "20", "load time", seconds, 0.001, 1e9),
    BN_ARG(bl_opts_t, "kill-ms", CM_CFG_INT, "500", "SIGKILL a random client this often", kill_ms, 1, 1 << 30),
    BN_ARG(bl_opts_t, "kill-in-connect", CM_CFG_BOOL, "false",
           "kill clients inside a data-plane connect too (UCX 1.13 aborts the daemon there)", kill_in_connect, 0, 0),
    BN_ARG(bl_opts_t, "worker", CM_CFG_BOOL, "false",
           "load a real ri-worker in front of the kvstore instead (--worker --help "
           "lists that mode's options)",
           worker, 0, 0),
};
static const cm_config_table_t bl_table = {"ri bench load", "RI_BENCH_LOAD_", bl_items, CM_ARRAY_LEN(bl_items), 0,
                                           NULL};

static int bl_main(const void *arg, const char *argv0);

int main(int argc, char **argv)
{
    char rt_err[256];
    if (cm_runtime_setup_from_env(cm_runtime_apply, rt_err, sizeof(rt_err)) != RI_OK) {
        fprintf(stderr, "ri bench load: %s\n", rt_err);
        return 2;
    }
    setenv("UCX_TLS", "posix,sysv,cma,tcp,self", 0);
    for (int i = 1; i < argc && strcmp(argv[i], "--") != 0; i++)
        if (!strcmp(argv[i], "--worker"))
            return bl_worker_main(argc, argv);
    bl_opts_t o;
    return bn_args_main(&bl_table, &o, argc, argv, bl_main);
}

static int bl_main(const void *arg, const char *argv0)
{
    const bl_opts_t *o = arg;
    const char *json = o->json;
    unsigned clients = (unsigned)o->clients, sessions = (unsigned)o->sessions, kill_ms = (unsigned)o->kill_ms;
    double seconds = o->seconds;
    bn_daemon_t d = {0};
    pid_t pids[BL_MAX_CLIENTS] = {0};
    int rc = 1;

    bl_shared_t *sh = mmap(NULL, sizeof(*sh), PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    if (sh == MAP_FAILED)
        return 1;
    memset(sh, 0, sizeof(*sh));
    bn_report_t *rep = bn_report_create("load");
    if (rep == NULL || bn_daemon_start(&d, argv0, "256MiB") != 0)
        goto out;
    long rss0 = bn_daemon_rss_kib(&d);
    double t0 = cm_time_s(), deadline = t0 + seconds, next_kill = t0 + kill_ms / 1000.0;
    unsigned killed = 0, seed = 1;
    for (unsigned i = 0; i < clients; i++)
        pids[i] = bl_spawn(&d, sh, i, sessions, deadline, seed++);
    while (cm_time_s() < deadline) {
        usleep(20000);
        if (cm_time_s() >= next_kill) {
            unsigned v = (unsigned)rand() % clients;
            bl_kill(sh, pids[v], v, o->kill_in_connect);
            killed++;
            pids[v] = bl_spawn(&d, sh, v, sessions, deadline, seed++);
            next_kill += kill_ms / 1000.0;
        }
    }
    for (unsigned i = 0; i < clients; i++)
        waitpid(pids[i], NULL, 0);
    double dt = cm_time_s() - t0;
    usleep(500000); /* let the daemon notice the last dead connections */
    long rss1 = bn_daemon_rss_kib(&d);
    size_t left_open = 0;
    bool served = bl_still_serves(&d, &left_open);
    uint64_t errors = 0;
    for (int k = 1; k < BL_KINDS; k++)
        errors += atomic_load(&sh->count[k]);

    cJSON *row = bn_report_row(rep);
    cJSON_AddNumberToObject(row, "clients", clients);
    cJSON_AddNumberToObject(row, "sessions", sessions);
    cJSON_AddNumberToObject(row, "seconds", dt);
    cJSON_AddNumberToObject(row, "requests", (double)atomic_load(&sh->count[BL_OK]));
    cJSON_AddNumberToObject(row, "requests_per_s", (double)atomic_load(&sh->count[BL_OK]) / dt);
    cJSON *ek = cJSON_AddObjectToObject(row, "errors");
    for (int k = 1; k < BL_KINDS; k++)
        cJSON_AddNumberToObject(ek, bl_kind[k], (double)atomic_load(&sh->count[k]));
    cJSON_AddNumberToObject(row, "clients_killed", killed);
    cJSON_AddBoolToObject(row, "kill_in_connect", o->kill_in_connect);
    unsigned umaj = 0, umin = 0, urel = 0;
    ucp_get_version(&umaj, &umin, &urel);
    char uver[32];
    snprintf(uver, sizeof(uver), "%u.%u.%u", umaj, umin, urel);
    cJSON_AddStringToObject(row, "ucx_version", uver);
    cJSON_AddNumberToObject(row, "rss_before", (double)rss0 * 1024);
    cJSON_AddNumberToObject(row, "rss_after", (double)rss1 * 1024);
    cJSON_AddBoolToObject(row, "served_after", served);
    cJSON_AddNumberToObject(row, "sessions_left_open", (double)left_open);

    printf("%-8s %-8s %-8s %-10s %-9s %-8s %-8s %-12s %-12s %s\n", "clients", "sessions", "seconds", "requests",
           "req/s", "errors", "killed", "rss before", "rss after", "served after");
    printf("%-8u %-8u %-8.1f %-10llu %-9.0f %-8llu %-8u %-12ld %-12ld %s\n", clients, sessions, dt,
           (unsigned long long)atomic_load(&sh->count[BL_OK]), (double)atomic_load(&sh->count[BL_OK]) / dt,
           (unsigned long long)errors, killed, rss0, rss1, served ? "yes" : "NO");
    printf("errors by kind:");
    for (int k = 1; k < BL_KINDS; k++)
        printf(" %s %llu", bl_kind[k], (unsigned long long)atomic_load(&sh->count[k]));
    printf("\nsessions left open by killed clients: %zu (the daemon keeps a session until it is dropped)\n",
           left_open);
    /* A killed client counts nothing after its death, so errors come from
     * live clients only: beyond a few timeouts on a loaded machine they are
     * a fault of the daemon (or of this bench: it once dialled lane 0 for
     * every session, and half its connects timed out). */
    uint64_t ok_count = atomic_load(&sh->count[BL_OK]);
    bool few_errors = errors * 20 <= ok_count;
    rc = served && few_errors ? 0 : 1;
    if (!served)
        fprintf(stderr, "BENCH FAILED: the daemon did not serve after the load\n");
    if (!few_errors)
        fprintf(stderr, "BENCH FAILED: %llu errors for %llu requests (more than 1 in 20)\n",
                (unsigned long long)errors, (unsigned long long)ok_count);
out:
    bn_daemon_stop(&d);
    if (rep != NULL && bn_report_finish(rep, json) != 0)
        rc = 1;
    munmap(sh, sizeof(*sh));
    return rc;
}
