/* Server process start/stop for data-plane tests and benchmarks. */
#include "tests/kvstore_data/kvs_spawn.h"

#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

int kvs_spawn_start(kvs_spawn_t *sp, unsigned layers, unsigned kv_heads, unsigned head_dim, unsigned page_tokens,
                    unsigned memory_mb)
{
    const char *bdir = getenv("RI_BUILD_DIR");
    char path[512], a[5][16], line[512], hex[64];
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
        dup2(fds[1], 1);
        close(fds[0]);
        close(fds[1]);
        execl(path, path, a[0], a[1], a[2], a[3], a[4], (char *)NULL);
        _exit(127);
    }
    close(fds[1]);
    f = fdopen(fds[0], "r");
    if (f == NULL || fgets(line, sizeof(line), f) == NULL ||
        sscanf(line, "%159s %llu %63s", sp->addr, &id, hex) != 3 || strlen(hex) != 32) {
        int status = 0;
        if (f)
            fclose(f);
        waitpid(sp->pid, &status, 0);
        sp->pid = 0;
        return WIFEXITED(status) && WEXITSTATUS(status) == 77 ? 77 : -1;
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
