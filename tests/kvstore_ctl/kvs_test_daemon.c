/* Test helper: run the real ri-kvstore on ephemeral ports (see header). */
#define _GNU_SOURCE
#include "kvs_test_daemon.h"

#include <arpa/inet.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <grp.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

static long long kvs_test_now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (long long)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

const char *kvs_test_bin(const char *name, char *buf, size_t len)
{
    const char *bd = getenv("RI_BUILD_DIR");
    snprintf(buf, len, "%s/bin/%s", bd ? bd : "build", name);
    return buf;
}

int kvs_test_daemon_prepare(kvs_test_daemon_t *d)
{
    memset(d, 0, sizeof(*d));
    const char *tmp = getenv("TMPDIR");
    snprintf(d->dir, sizeof(d->dir), "%s/ri-kvs-test-XXXXXX", tmp && tmp[0] ? tmp : "/tmp");
    return mkdtemp(d->dir) ? 0 : -1;
}

int kvs_test_daemon_write_file(const kvs_test_daemon_t *d, const char *name, const char *text, char *path_out,
                               size_t len)
{
    snprintf(path_out, len, "%s/%s", d->dir, name);
    int fd = open(path_out, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
    if (fd < 0)
        return -1;
    size_t n = strlen(text);
    ssize_t w = write(fd, text, n);
    close(fd);
    return w == (ssize_t)n ? 0 : -1;
}

static int kvs_test_read_ports(kvs_test_daemon_t *d, const char *path)
{
    char line[CM_DP_ADDR_MAX + 16]; /* the dataplane= line is the longest */
    FILE *f = fopen(path, "r");
    if (f == NULL)
        return -1;
    while (fgets(line, sizeof(line), f) != NULL) {
        line[strcspn(line, "\n")] = '\0';
        if (strncmp(line, "grpc=", 5) == 0)
            snprintf(d->grpc, sizeof(d->grpc), "%.*s", (int)sizeof(d->grpc) - 1, line + 5);
        else if (strncmp(line, "metrics=", 8) == 0)
            snprintf(d->metrics, sizeof(d->metrics), "%.*s", (int)sizeof(d->metrics) - 1, line + 8);
        else if (strncmp(line, "dataplane=", 10) == 0)
            snprintf(d->dataplane, sizeof(d->dataplane), "%.*s", (int)sizeof(d->dataplane) - 1, line + 10);
    }
    fclose(f);
    return d->grpc[0] ? 0 : -1;
}

int kvs_test_daemon_start(kvs_test_daemon_t *d, const char *const *extra, int *exit_p)
{
    return kvs_test_daemon_start_as(d, extra, (uid_t)-1, (gid_t)-1, exit_p);
}

/* Give the daemon's folder and its files to uid:gid. */
static int kvs_test_give_dir(const char *dir, uid_t uid, gid_t gid)
{
    DIR *dh = opendir(dir);
    struct dirent *e;
    char p[600];
    int rc = chown(dir, uid, gid);

    if (dh == NULL)
        return -1;
    while (rc == 0 && (e = readdir(dh)) != NULL) {
        if (e->d_name[0] == '.')
            continue;
        snprintf(p, sizeof(p), "%s/%s", dir, e->d_name);
        rc = chown(p, uid, gid);
    }
    closedir(dh);
    return rc;
}

int kvs_test_daemon_start_as(kvs_test_daemon_t *d, const char *const *extra, uid_t uid, gid_t gid, int *exit_p)
{
    char bin[512], portfile[512], portflag[600];
    const char *argv[64];
    int n = 0;

    kvs_test_bin("ri-kvstore", bin, sizeof(bin));
    if (access(bin, X_OK) != 0) {
        fprintf(stderr, "skip: %s not built\n", bin);
        return 77;
    }
    if (d->dir[0] == '\0' && kvs_test_daemon_prepare(d) != 0)
        return -1;
    snprintf(portfile, sizeof(portfile), "%s/ports", d->dir);
    unlink(portfile);
    snprintf(portflag, sizeof(portflag), "--port-file=%s", portfile);
    argv[n++] = bin;
    argv[n++] = "--listen=127.0.0.1:0";
    argv[n++] = "--dataplane-listen=127.0.0.1:0";
    argv[n++] = "--insecure-admin"; /* tests Drain without a tokens file */
    argv[n++] = "--metrics-listen=127.0.0.1:0";
    argv[n++] = "--memory=64MiB";
    argv[n++] = "--no-hugepages";
    argv[n++] = "--drain-timeout-ms=3000";
    argv[n++] = portflag;
    for (int i = 0; extra != NULL && extra[i] != NULL && n < 62; i++)
        argv[n++] = extra[i];
    argv[n] = NULL;

    if (d->pid > 0) /* a daemon left over by a failed test */
        kvs_test_daemon_stop(d, SIGKILL, 2000);
    if (uid != (uid_t)-1 && kvs_test_give_dir(d->dir, uid, gid) != 0)
        return -1;
    pid_t pid = fork();
    if (pid < 0)
        return -1;
    if (pid == 0) {
        if (uid != (uid_t)-1 && (setgroups(0, NULL) != 0 || setgid(gid) != 0 || setuid(uid) != 0))
            _exit(126);
        prctl(PR_SET_PDEATHSIG, SIGKILL); /* never outlive the test (after setuid, which clears it) */
        execv(bin, (char *const *)argv);
        _exit(127);
    }
    d->pid = pid;
    long long deadline = kvs_test_now_ms() + 15000;
    while (kvs_test_now_ms() < deadline) {
        int status;
        if (waitpid(pid, &status, WNOHANG) == pid) {
            d->pid = 0;
            if (exit_p != NULL)
                *exit_p = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
            return -1;
        }
        if (kvs_test_read_ports(d, portfile) == 0)
            return 0;
        usleep(10000);
    }
    kvs_test_daemon_stop(d, SIGKILL, 2000);
    return -1;
}

int kvs_test_daemon_stop(kvs_test_daemon_t *d, int sig, int timeout_ms)
{
    int status;
    if (d->pid <= 0)
        return -1;
    kill(d->pid, sig);
    long long deadline = kvs_test_now_ms() + timeout_ms;
    for (;;) {
        pid_t r = waitpid(d->pid, &status, WNOHANG);
        if (r == d->pid)
            break;
        if (kvs_test_now_ms() >= deadline) {
            kill(d->pid, SIGKILL);
            waitpid(d->pid, &status, 0);
            d->pid = 0;
            return -1;
        }
        usleep(5000);
    }
    d->pid = 0;
    return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
}

void kvs_test_daemon_cleanup(kvs_test_daemon_t *d)
{
    if (d->pid > 0)
        kvs_test_daemon_stop(d, SIGKILL, 2000);
    if (d->dir[0] == '\0')
        return;
    DIR *dir = opendir(d->dir);
    if (dir != NULL) {
        struct dirent *e;
        char p[600];
        while ((e = readdir(dir)) != NULL) {
            if (e->d_name[0] == '.')
                continue;
            snprintf(p, sizeof(p), "%s/%s", d->dir, e->d_name);
            unlink(p);
        }
        closedir(dir);
    }
    rmdir(d->dir);
    d->dir[0] = '\0';
}

int kvs_test_run(const char *const *argv, char *out, size_t len, int timeout_ms)
{
    int pfd[2], status;
    size_t got = 0;
    if (pipe2(pfd, O_CLOEXEC) != 0)
        return -1;
    pid_t pid = fork();
    if (pid < 0)
        return -1;
    if (pid == 0) {
        dup2(pfd[1], 1);
        dup2(pfd[1], 2);
        execv(argv[0], (char *const *)argv);
        _exit(127);
    }
    close(pfd[1]);
    long long deadline = kvs_test_now_ms() + timeout_ms;
    for (;;) {
        struct pollfd p = {.fd = pfd[0], .events = POLLIN};
        long long left = deadline - kvs_test_now_ms();
        if (left <= 0) {
            kill(pid, SIGKILL);
            break;
        }
        if (poll(&p, 1, (int)left) <= 0)
            continue;
        char tmp[1024];
        ssize_t r = read(pfd[0], tmp, sizeof(tmp));
        if (r <= 0)
            break;
        size_t c = (size_t)r;
        if (len > 0 && got + c > len - 1)
            c = len - 1 - got;
        memcpy(out + got, tmp, c);
        got += c;
    }
    if (len > 0)
        out[got] = '\0';
    close(pfd[0]);
    waitpid(pid, &status, 0);
    return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
}

int kvs_test_http_get(const char *addr, const char *path, char *out, size_t len)
{
    char host[256], req[512];
    const char *colon = strrchr(addr, ':');
    if (colon == NULL || (size_t)(colon - addr) >= sizeof(host))
        return -1;
    memcpy(host, addr, (size_t)(colon - addr));
    host[colon - addr] = '\0';
    struct sockaddr_in sa = {.sin_family = AF_INET, .sin_port = htons((uint16_t)atoi(colon + 1))};
    if (inet_pton(AF_INET, host, &sa.sin_addr) != 1)
        return -1;
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0)
        return -1;
    struct timeval tv = {.tv_sec = 5};
    setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
    if (connect(fd, (struct sockaddr *)&sa, sizeof(sa)) != 0) {
        close(fd);
        return -1;
    }
    int n = snprintf(req, sizeof(req), "GET %s HTTP/1.0\r\nHost: %s\r\n\r\n", path, addr);
    if (write(fd, req, (size_t)n) != n) {
        close(fd);
        return -1;
    }
    static char buf[1 << 20];
    size_t got = 0;
    for (;;) {
        ssize_t r = read(fd, buf + got, sizeof(buf) - 1 - got);
        if (r <= 0)
            break;
        got += (size_t)r;
        if (got == sizeof(buf) - 1)
            break;
    }
    close(fd);
    buf[got] = '\0';
    int code = -1;
    if (sscanf(buf, "HTTP/1.%*d %d", &code) != 1)
        return -1;
    char *body = strstr(buf, "\r\n\r\n");
    snprintf(out, len, "%s", body ? body + 4 : "");
    return code;
}
