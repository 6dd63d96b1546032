/*
 * Real etcd for tests (see etcd_spawn.h).  etcd is started directly (no
 * shell) with its output in <dir>/etcd.log; readiness is its /health
 * answer over plain HTTP on the client port.
 */
#define _GNU_SOURCE
#include "tests/common/etcd_spawn.h"

#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

bool etcd_spawn_available(void)
{
    return access(ETCD_SPAWN_BIN, X_OK) == 0;
}

/* A free loopback port: bind port 0 and read what the kernel chose. */
static uint16_t etcd_spawn_free_port(void)
{
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    if (fd < 0)
        return 0;
    struct sockaddr_in a = { .sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK) };
    socklen_t len = sizeof(a);
    uint16_t port = 0;
    if (bind(fd, (struct sockaddr *)&a, sizeof(a)) == 0 && getsockname(fd, (struct sockaddr *)&a, &len) == 0)
        port = ntohs(a.sin_port);
    close(fd);
    return port;
}

/* True when GET /health answers {"health":"true"}. */
static bool etcd_spawn_healthy(uint16_t port)
{
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    if (fd < 0)
        return false;
    struct timeval tv = { .tv_sec = 1 };
    setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
    struct sockaddr_in a = { .sin_family = AF_INET,
                             .sin_port = htons(port),
                             .sin_addr.s_addr = htonl(INADDR_LOOPBACK) };
    bool ok = false;
    if (connect(fd, (struct sockaddr *)&a, sizeof(a)) == 0) {
        static const char req[] = "GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n";
        char buf[2048];
        size_t got = 0;
        if (write(fd, req, sizeof(req) - 1) == (ssize_t)(sizeof(req) - 1)) {
            ssize_t r;
            while (got < sizeof(buf) - 1 && (r = read(fd, buf + got, sizeof(buf) - 1 - got)) > 0)
                got += (size_t)r;
        }
        buf[got] = '\0';
        ok = strstr(buf, "\"health\":\"true\"") != NULL;
    }
    close(fd);
    return ok;
}

static void etcd_spawn_print_log(const etcd_spawn_t *s)
{
    char path[300];
    snprintf(path, sizeof(path), "%s/etcd.log", s->dir);
    FILE *f = fopen(path, "r");
    if (f == NULL)
        return;
    char line[1024];
    fprintf(stderr, "--- %s ---\n", path);
    while (fgets(line, sizeof(line), f) != NULL)
        fputs(line, stderr);
    fclose(f);
}

/* Fork and exec etcd on s's ports and folder, then wait for /health. */
static int etcd_spawn_exec(etcd_spawn_t *s)
{
    char data[300], log[300], client[64], peer[64], cluster[96];
    snprintf(data, sizeof(data), "%s/data", s->dir);
    snprintf(log, sizeof(log), "%s/etcd.log", s->dir);
    snprintf(client, sizeof(client), "http://127.0.0.1:%u", s->client_port);
    snprintf(peer, sizeof(peer), "http://127.0.0.1:%u", s->peer_port);
    snprintf(cluster, sizeof(cluster), "t0=%s", peer);
    pid_t pid = fork();
    if (pid < 0)
        return -1;
    if (pid == 0) {
        int fd = open(log, O_WRONLY | O_CREAT | O_APPEND, 0644);
        int nul = open("/dev/null", O_RDONLY);
        if (fd >= 0) {
            dup2(fd, 1);
            dup2(fd, 2);
        }
        if (nul >= 0)
            dup2(nul, 0);
        execl(ETCD_SPAWN_BIN, "etcd", "--name", "t0", "--data-dir", data, "--listen-client-urls", client,
              "--advertise-client-urls", client, "--listen-peer-urls", peer, "--initial-advertise-peer-urls", peer,
              "--initial-cluster", cluster, "--initial-cluster-state", "new", "--logger", "zap", "--log-level", "warn",
              (char *)NULL);
        _exit(127);
    }
    s->pid = pid;
    for (int i = 0; i < 1000; i++) {
        if (etcd_spawn_healthy(s->client_port))
            return 0;
        int status;
        if (waitpid(pid, &status, WNOHANG) == pid) {
            s->pid = 0;
            fprintf(stderr, "etcd_spawn: etcd exited at start\n");
            etcd_spawn_print_log(s);
            return -1;
        }
        usleep(10000);
    }
    fprintf(stderr, "etcd_spawn: etcd did not answer /health within 10 s\n");
    etcd_spawn_print_log(s);
    etcd_spawn_kill(s);
    return -1;
}

int etcd_spawn_start(etcd_spawn_t *s)
{
    memset(s, 0, sizeof(*s));
    const char *tmp = getenv("TMPDIR");
    snprintf(s->dir, sizeof(s->dir), "%s/ri-etcd-XXXXXX", tmp && tmp[0] ? tmp : "/tmp");
    if (mkdtemp(s->dir) == NULL) {
        fprintf(stderr, "etcd_spawn: mkdtemp: %s\n", strerror(errno));
        s->dir[0] = '\0';
        return -1;
    }
    s->client_port = etcd_spawn_free_port();
    s->peer_port = etcd_spawn_free_port();
    if (s->client_port == 0 || s->peer_port == 0 || s->client_port == s->peer_port) {
        fprintf(stderr, "etcd_spawn: no free loopback port\n");
        etcd_spawn_stop(s);
        return -1;
    }
    snprintf(s->url, sizeof(s->url), "127.0.0.1:%u", s->client_port);
    if (etcd_spawn_exec(s) != 0) {
        etcd_spawn_stop(s);
        return -1;
    }
    return 0;
}

void etcd_spawn_kill(etcd_spawn_t *s)
{
    if (s->pid <= 0)
        return;
    kill(s->pid, SIGKILL);
    waitpid(s->pid, NULL, 0);
    s->pid = 0;
}

int etcd_spawn_restart(etcd_spawn_t *s)
{
    if (s->pid > 0 || s->dir[0] == '\0')
        return -1;
    /* the ports were closed with the process; a few tries cover a slow release */
    for (int i = 0; i < 3; i++) {
        if (etcd_spawn_exec(s) == 0)
            return 0;
        usleep(200000);
    }
    return -1;
}

/* rm -rf of the temporary folder (it holds only etcd's files). */
static void etcd_spawn_rmtree(const char *dir)
{
    pid_t pid = fork();
    if (pid == 0) {
        execl("/bin/rm", "rm", "-rf", "--", dir, (char *)NULL);
        _exit(127);
    }
    if (pid > 0)
        waitpid(pid, NULL, 0);
}

void etcd_spawn_stop(etcd_spawn_t *s)
{
    if (s->pid > 0) {
        kill(s->pid, SIGTERM);
        int i;
        for (i = 0; i < 500; i++) {
            if (waitpid(s->pid, NULL, WNOHANG) == s->pid)
                break;
            usleep(10000);
        }
        if (i == 500)
            etcd_spawn_kill(s);
        s->pid = 0;
    }
    if (s->dir[0] != '\0') {
        etcd_spawn_rmtree(s->dir);
        s->dir[0] = '\0';
    }
}
