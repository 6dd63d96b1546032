/*
 * Runs ri-kvstore-addrcheck on a worker's UCX address before the data plane
 * unpacks it (see kvs_addrcheck_main.c for why).  Called by the data thread
 * once per CONNECT; costs one process start (~20-50 ms), bounded by a
 * deadline after which the checker is killed and the address refused.
 */
#define _GNU_SOURCE
#include "kvstore/data/kvs_dp_check.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <signal.h>
#include <spawn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "common/cm_alloc.h"
#include "common/cm_dp_proto.h"
#include "common/cm_log.h"
#include "common/cm_time.h"

extern char **environ;

#define KVS_CHECK_NAME "ri-kvstore-addrcheck"
#define KVS_CHECK_TIMEOUT_NS 3000000000ull

static CM_ALLOC_TAG(kvs_check_tag, "kvs.dp.check");

/* The checker next to the running program, else where the build put it. */
static bool kvs_dp_check_path(char *out, size_t len)
{
    char self[PATH_MAX];
    ssize_t n = readlink("/proc/self/exe", self, sizeof(self) - 1);
    struct stat sb;
    const char *env = getenv("RI_ADDRCHECK_PROGRAM");

    if (env != NULL && env[0] != '\0') {
        snprintf(out, len, "%s", env);
        return access(out, X_OK) == 0;
    }
    if (n > 0) {
        char *slash;
        self[n] = '\0';
        slash = strrchr(self, '/');
        if (slash != NULL) {
            slash[1] = '\0';
            if (snprintf(out, len, "%s%s", self, KVS_CHECK_NAME) < (int)len && stat(out, &sb) == 0 &&
                access(out, X_OK) == 0)
                return true;
        }
    }
#ifdef KVS_ADDRCHECK_BUILD_PATH
    snprintf(out, len, "%s", KVS_ADDRCHECK_BUILD_PATH);
    return access(out, X_OK) == 0;
#else
    return false;
#endif
}

/* environ plus UCX_NET_DEVICES=net_devices (unless the user set it), less
 * UCX_TCP_PORT_RANGE: the daemon holds that port, and a checker that cannot
 * bind it would refuse every address. */
static char **kvs_dp_check_env(const char *net_devices, char *dev_var, size_t dev_len)
{
    static const char port_var[] = "UCX_TCP_PORT_RANGE=";
    size_t n = 0, m = 0;
    char **env;
    bool add = net_devices != NULL && net_devices[0] != '\0' && getenv("UCX_NET_DEVICES") == NULL;

    while (environ[n] != NULL)
        n++;
    env = cm_calloc(&kvs_check_tag, n + 2, sizeof(*env));
    if (env == NULL)
        return NULL;
    for (size_t i = 0; i < n; i++)
        if (strncmp(environ[i], port_var, sizeof(port_var) - 1) != 0)
            env[m++] = environ[i];
    n = m;
    if (add) {
        snprintf(dev_var, dev_len, "UCX_NET_DEVICES=%s", net_devices);
        env[n++] = dev_var;
    }
    env[n] = NULL;
    return env;
}

ri_status_t kvs_dp_check_address(const void *addr, size_t len, const char *net_devices)
{
    char path[PATH_MAX], dev_var[128];
    char *text = NULL, **env = NULL;
    char *argv[3];
    posix_spawn_file_actions_t fa;
    pid_t pid;
    int wst = 0, rc;
    uint64_t deadline;
    ri_status_t st;

    if (!kvs_dp_check_path(path, sizeof(path))) {
        cm_error("dp: %s not found next to the program or at its build location: CONNECT refused "
                 "(set RI_ADDRCHECK_PROGRAM to its path)", KVS_CHECK_NAME);
        return RI_ERR_NOT_FOUND;
    }
    text = cm_malloc(&kvs_check_tag, CM_DP_ADDR_MAX);
    env = kvs_dp_check_env(net_devices, dev_var, sizeof(dev_var));
    if (text == NULL || env == NULL) {
        st = RI_ERR_NOMEM;
        goto out;
    }
    st = cm_dp_addr_format(addr, len, text, CM_DP_ADDR_MAX);
    if (st != RI_OK)
        goto out;
    argv[0] = path;
    argv[1] = text;
    argv[2] = NULL;
    /* Its output is UCX's complaint about the address: useful at debug level
     * only, so stdout/stderr go to /dev/null. */
    posix_spawn_file_actions_init(&fa);
    posix_spawn_file_actions_addopen(&fa, 1, "/dev/null", O_WRONLY, 0);
    posix_spawn_file_actions_addopen(&fa, 2, "/dev/null", O_WRONLY, 0);
    rc = posix_spawn(&pid, path, &fa, NULL, argv, env);
    posix_spawn_file_actions_destroy(&fa);
    if (rc != 0) {
        cm_error("dp: cannot start %s: %s", path, strerror(rc));
        st = RI_ERR_IO;
        goto out;
    }
    deadline = cm_time_ns() + KVS_CHECK_TIMEOUT_NS;
    while ((rc = waitpid(pid, &wst, WNOHANG)) == 0 && cm_time_ns() < deadline)
        cm_time_sleep_ns(1000000);
    if (rc == 0) {
        kill(pid, SIGKILL);
        (void)waitpid(pid, &wst, 0);
        cm_warn("dp: a worker's UCX address hung the checker: refused");
        st = RI_ERR_TIMEOUT;
    } else if (rc < 0) {
        cm_error("dp: waiting for %s: %s", KVS_CHECK_NAME, strerror(errno));
        st = RI_ERR_IO;
    } else if (WIFSIGNALED(wst)) {
        cm_warn("dp: a worker's UCX address crashed the checker (signal %d): refused", WTERMSIG(wst));
        st = RI_ERR_PROTOCOL;
    } else if (WEXITSTATUS(wst) != 0) {
        cm_warn("dp: a worker's UCX address was refused by the checker (exit %d)", WEXITSTATUS(wst));
        st = RI_ERR_PROTOCOL;
    }
out:
    cm_free(env);
    cm_free(text);
    return st;
}
