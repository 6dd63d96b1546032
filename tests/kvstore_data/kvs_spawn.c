/*
 * Server process start/stop for data-plane tests and benchmarks.  Prefers the
 * real daemon ($RI_BUILD_DIR/bin/ri-kvstore, sessions created over gRPC with
 * gpuworker/client) when it was built; else the small kvs-test-server.
 * RI_DP_SERVER=test forces the small server.
 */
#include "tests/kvstore_data/kvs_spawn.h"

#ifdef KVS_SPAWN_HAVE_CTL
#include "gpuworker/client/gw_ctl.h"
#endif

#include <fcntl.h>
#include <signal.h>
#include <sys/prctl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

static int kvs_spawn_small(kvs_spawn_t *sp, unsigned layers, unsigned kv_heads, unsigned head_dim,
                           unsigned page_tokens, unsigned memory_mb);

#ifdef KVS_SPAWN_HAVE_CTL
/* The daemon died at start: if even the small server cannot bring UCX up,
 * this machine cannot run the test (77); otherwise the daemon is at fault. */
static int kvs_spawn_probe(kvs_spawn_t *sp)
{
    int rc = kvs_spawn_small(sp, 1, 1, 64, 8, 16);
    if (rc == 0)
        kvs_spawn_stop(sp, SIGKILL, 2000);
    fprintf(stderr, "ri-kvstore exited at start; UCX %s here\n", rc == 77 ? "cannot start" : "works");
    return rc == 77 ? 77 : -1;
}

/* Start ri-kvstore on ephemeral ports and create one session over gRPC. */
static int kvs_spawn_daemon(kvs_spawn_t *sp, const char *path, unsigned layers, unsigned kv_heads,
                            unsigned head_dim, unsigned page_tokens, unsigned memory_mb)
{
    char portfile[256], mem[32], line[CM_DP_ADDR_MAX + 128], grpc[200] = "";
    gw_ctl_t *ctl = NULL;
    gw_ctl_geometry_t g = {.layers = layers, .kv_heads = kv_heads, .head_dim = head_dim, .dtype = 1,
                           .page_tokens = page_tokens};
    gw_ctl_session_t s;
    gw_ctl_error_t err = {0};
    struct timespec ts = {0, 20 * 1000 * 1000};
    ri_status_t st;
    FILE *f = NULL;

    snprintf(portfile, sizeof(portfile), "/tmp/ri-kvs-spawn-%d-%ld.ports", (int)getpid(), (long)time(NULL));
    unlink(portfile);
    snprintf(mem, sizeof(mem), "%uMiB", memory_mb);
    sp->pid = fork();
    if (sp->pid < 0)
        return -1;
    if (sp->pid == 0) {
        int devnull = open("/dev/null", O_WRONLY);
        prctl(PR_SET_PDEATHSIG, SIGTERM); /* a crashed test leaves no daemon behind */
        if (devnull >= 0)
            dup2(devnull, 1);
        execl(path, path, "--listen=127.0.0.1:0", "--dataplane-listen=127.0.0.1:0", "--metrics-listen=off",
              "--insecure-admin", "--memory", mem, "--port-file", portfile, "--drain-timeout-ms=2000", (char *)NULL);
        _exit(127);
    }
    for (int i = 0; i < 500 && f == NULL; i++) {
        int status;
        if (waitpid(sp->pid, &status, WNOHANG) == sp->pid) {
            sp->pid = 0;
            return WIFEXITED(status) && WEXITSTATUS(status) == 77 ? 77 : kvs_spawn_probe(sp);
        }
        f = fopen(portfile, "r");
        if (f == NULL)
            nanosleep(&ts, NULL);
    }
    if (f == NULL)
        goto err_kill;
    while (fgets(line, sizeof(line), f) != NULL) {
        if (strncmp(line, "grpc=", 5) == 0)
            sscanf(line + 5, "%199s", grpc);
    }
    fclose(f);
    unlink(portfile);
    st = gw_ctl_create(grpc, NULL, &ctl);
    if (st == RI_OK)
        st = gw_ctl_create_session(ctl, 5000, &g, 1, "dp-test", &s, &err);
    gw_ctl_destroy(ctl);
    if (st != RI_OK) {
        fprintf(stderr, "CreateSession on %s: %s (%s)\n", grpc, ri_status_str(st), err.message);
        goto err_kill;
    }
    if (s.dataplane_address[0] == '\0') {
        fprintf(stderr, "ri-kvstore has no data plane here\n");
        kvs_spawn_stop(sp, SIGTERM, 5000);
        return 77;
    }
    snprintf(sp->addr, sizeof(sp->addr), "%s", s.dataplane_address);
    sp->session_id = s.session_id;
    memcpy(sp->secret, s.secret, 16);
    sp->real_daemon = 1;
    snprintf(sp->grpc, sizeof(sp->grpc), "%s", grpc);
    return 0;

err_kill:
    kvs_spawn_stop(sp, SIGKILL, 1000);
    return -1;
}
#endif

int kvs_spawn_start(kvs_spawn_t *sp, unsigned layers, unsigned kv_heads, unsigned head_dim, unsigned page_tokens,
                    unsigned memory_mb)
{
    const char *bdir = getenv("RI_BUILD_DIR");
    char path[512];

    memset(sp, 0, sizeof(*sp));
#ifdef KVS_SPAWN_HAVE_CTL
    {
        const char *force = getenv("RI_DP_SERVER");
        snprintf(path, sizeof(path), "%s/bin/ri-kvstore", bdir ? bdir : ".");
        if ((force == NULL || strcmp(force, "test") != 0) && access(path, X_OK) == 0)
            return kvs_spawn_daemon(sp, path, layers, kv_heads, head_dim, page_tokens, memory_mb);
    }
#else
    (void)bdir;
    (void)path;
#endif
    return kvs_spawn_small(sp, layers, kv_heads, head_dim, page_tokens, memory_mb);
}

static int kvs_spawn_small(kvs_spawn_t *sp, unsigned layers, unsigned kv_heads, unsigned head_dim, unsigned page_tokens,
                    unsigned memory_mb)
{
    const char *bdir = getenv("RI_BUILD_DIR");
    char path[512], a[5][16], line[CM_DP_ADDR_MAX + 128], hex[64];
    int fds[2];
    FILE *f;
    unsigned long long id;

    memset(sp, 0, sizeof(*sp));
    snprintf(path, sizeof(path), "%s/bin/kvs-test-server", bdir ? bdir : ".");
    if (access(path, X_OK) != 0) {
        fprintf(stderr, "no server binary at %s\n", path);
        return 77;
    }
    snprintf(a[0], 16, "%u", layers);
    snprintf(a[1], 16, "%u", kv_heads);
    snprintf(a[2], 16, "%u", head_dim);
    snprintf(a[3], 16, "%u", page_tokens);
    snprintf(a[4], 16, "%u", memory_mb);
    if (pipe(fds) != 0)
        return -1;
    sp->pid = fork();
    if (sp->pid < 0)
        return -1;
    if (sp->pid == 0) {
        prctl(PR_SET_PDEATHSIG, SIGTERM); /* a crashed test leaves no server behind */
        dup2(fds[1], 1);
        close(fds[0]);
        close(fds[1]);
        execl(path, path, a[0], a[1], a[2], a[3], a[4], (char *)NULL);
        _exit(127);
    }
    close(fds[1]);
    f = fdopen(fds[0], "r");
    /* Skip anything else on stdout (UCX may log there); give up after 100 lines. */
    int ok = 0;
    for (int i = 0; f != NULL && i < 100 && !ok; i++) {
        if (fgets(line, sizeof(line), f) == NULL)
            break;
        ok = sscanf(line, "%4100s %llu %63s", sp->addr, &id, hex) == 3 && strlen(hex) == 32 &&
             strncmp(sp->addr, CM_DP_ADDR_PREFIX, strlen(CM_DP_ADDR_PREFIX)) == 0;
    }
    if (!ok) {
        int status = 0;
        if (f)
            fclose(f);
        /* It may still be running (it printed something else): stop it. */
        status = kvs_spawn_stop(sp, SIGKILL, 2000);
        return status == 77 ? 77 : -1;
    }
    fclose(f);
    sp->session_id = id;
    for (int i = 0; i < 16; i++) {
        unsigned v;
        sscanf(hex + 2 * i, "%2x", &v);
        sp->secret[i] = (uint8_t)v;
    }
    return 0;
}

int kvs_spawn_stop(kvs_spawn_t *sp, int sig, unsigned timeout_ms)
{
    int status;
    struct timespec ts = {0, 10 * 1000 * 1000};

    if (sp->pid <= 0)
        return -1;
    kill(sp->pid, sig);
    for (unsigned waited = 0;; waited += 10) {
        pid_t r = waitpid(sp->pid, &status, WNOHANG);
        if (r == sp->pid)
            break;
        if (r < 0)
            return -1;
        if (waited >= timeout_ms) {
            kill(sp->pid, SIGKILL);
            waitpid(sp->pid, &status, 0);
            sp->pid = 0;
            return -1;
        }
        nanosleep(&ts, NULL);
    }
    sp->pid = 0;
    return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
}
