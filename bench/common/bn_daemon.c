/* A ri-kvstore child for benchmarks (see bn_daemon.h). */
#define _GNU_SOURCE
#include "bench/common/bn_daemon.h"

#include <fcntl.h>
#include <limits.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "retroinfer/retroinfer.h"

void bn_program_path(const char *argv0, const char *name, char *bin, size_t len)
{
    const char *bd = getenv("RI_BUILD_DIR");
    if (bd != NULL) {
        snprintf(bin, len, "%s/bin/%s", bd, name);
        return;
    }
    snprintf(bin, len, "%s", argv0);
    char *slash = strrchr(bin, '/');
    snprintf(slash ? slash + 1 : bin, len - (size_t)(slash ? slash + 1 - bin : 0), "%s", name);
}

/* Read grpc=, dataplane=, metrics= lines; true once grpc is known. */
static int bn_daemon_read_ports(bn_daemon_t *d, const char *ports)
{
    FILE *f = fopen(ports, "r");
    char line[CM_DP_ADDR_MAX + 16]; /* the dataplane= line is the longest */
    if (f == NULL)
        return 0;
    while (fgets(line, sizeof(line), f)) {
        line[strcspn(line, "\n")] = '\0';
        if (strncmp(line, "grpc=", 5) == 0)
            snprintf(d->grpc, sizeof(d->grpc), "%.*s", (int)sizeof(d->grpc) - 1, line + 5);
        else if (strncmp(line, "dataplane=", 10) == 0)
            snprintf(d->dataplane, sizeof(d->dataplane), "%.*s", (int)sizeof(d->dataplane) - 1, line + 10);
        else if (strncmp(line, "metrics=", 8) == 0)
            snprintf(d->metrics, sizeof(d->metrics), "%.*s", (int)sizeof(d->metrics) - 1, line + 8);
    }
    fclose(f);
    return d->grpc[0] != '\0';
}

/* An integer environment variable, def when unset. */
static int bn_env_int(const char *name, int def)
{
    const char *v = getenv(name);
    return v != NULL && v[0] != '\0' ? atoi(v) : def;
}

uint32_t bn_remote_env_flags(bool *keep_kv_p)
{
    uint32_t f = 0;
    if (bn_env_int("RI_DIRECT", 1) == 0)
        f |= RI_SESSION_TWO_SIDED;
    if (bn_env_int("RI_FETCH_ASYNC", 0) != 0)
        f |= RI_SESSION_FETCH_ASYNC;
    if (bn_env_int("RI_PREDICT", 1) == 0)
        f |= RI_SESSION_NO_PREDICT;
    *keep_kv_p = bn_env_int("RI_KEEP_KV", 0) != 0;
    return f;
}

int bn_daemon_start(bn_daemon_t *d, const char *argv0, const char *memory)
{
    char bin[PATH_MAX], ports[400], flag_ports[420], flag_mem[64];
    memset(d, 0, sizeof(*d));
    bn_program_path(argv0, "ri-kvstore", bin, sizeof(bin));
    if (access(bin, X_OK) != 0) {
        fprintf(stderr, "bench: %s not found (build it, or pass --kvstore ADDR)\n", bin);
        return -1;
    }
    snprintf(d->dir, sizeof(d->dir), "%s/ri-bench-XXXXXX", getenv("TMPDIR") ? getenv("TMPDIR") : "/tmp");
    if (mkdtemp(d->dir) == NULL)
        return -1;
    snprintf(ports, sizeof(ports), "%s/ports", d->dir);
    snprintf(flag_ports, sizeof(flag_ports), "--port-file=%s", ports);
    snprintf(flag_mem, sizeof(flag_mem), "--memory=%s", memory);
    d->pid = fork();
    if (d->pid == 0) {
        /* RI_BENCH_DAEMON_LOG=FILE keeps the daemon's log (appended). */
        const char *log = getenv("RI_BENCH_DAEMON_LOG");
        int fd = open(log != NULL ? log : "/dev/null", O_WRONLY | O_CREAT | O_APPEND, 0644);
        if (fd >= 0) {
            dup2(fd, 1);
            dup2(fd, 2);
        }
        execl(bin, bin, "--listen=127.0.0.1:0", "--dataplane-listen=127.0.0.1:0", "--metrics-listen=127.0.0.1:0",
              flag_mem, flag_ports, (char *)NULL);
        _exit(127);
    }
    for (int i = 0; i < 1500; i++) {
        if (bn_daemon_read_ports(d, ports))
            return 0;
        if (waitpid(d->pid, NULL, WNOHANG) == d->pid) {
            d->pid = 0;
            break;
        }
        usleep(10000);
    }
    fprintf(stderr, "bench: ri-kvstore did not start\n");
    return -1;
}

void bn_daemon_stop(bn_daemon_t *d)
{
    char p[400];
    if (d->pid > 0) {
        kill(d->pid, SIGTERM);
        waitpid(d->pid, NULL, 0);
        d->pid = 0;
    }
    if (d->dir[0]) {
        snprintf(p, sizeof(p), "%s/ports", d->dir);
        unlink(p);
        rmdir(d->dir);
    }
}

long bn_daemon_rss_kib(const bn_daemon_t *d)
{
    return bn_pid_rss_kib(d->pid);
}

long bn_pid_rss_kib(pid_t pid)
{
    char path[64], line[256];
    long kib = -1;
    snprintf(path, sizeof(path), "/proc/%d/status", (int)pid);
    FILE *f = fopen(path, "r");
    if (f == NULL)
        return -1;
    while (fgets(line, sizeof(line), f))
        if (sscanf(line, "VmRSS: %ld kB", &kib) == 1)
            break;
    fclose(f);
    return kib;
}
