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

/* The configured checker, else the one next to the running program, else
 * where the build put it. */
static bool kvs_dp_check_path(const char *program, char *out, size_t len)
{
    char self[PATH_MAX];
    ssize_t n = readlink("/proc/self/exe", self, sizeof(self) - 1);
    struct stat sb;

    if (program != NULL && program[0] != '\0') {
        snprintf(out, len, "%s", program);
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

/* Does environment entry e set variable var_eq ("NAME=")? */
static bool kvs_dp_env_is(const char *e, const char *var_eq)
{
    return strncmp(e, var_eq, strlen(var_eq)) == 0;
}

/* The checker's environment: the process's (inherited, as any child's:
 * error handling of UCX's shared-memory transports, the user's UCX
 * variables) with the data plane's own choices put in: UCX_TLS=tls (in
 * place of the inherited one) and UCX_NET_DEVICES=net_devices (only ever
 * given when the user set none, kvs_dp_setup.c); less UCX_TCP_PORT_RANGE:
 * the daemon holds that port, and a checker that cannot bind it would
 * refuse every address.  The strings are borrowed from environ and the
 * two buffers. */
static char **kvs_dp_check_env(const char *net_devices, const char *tls, char *dev_var, size_t dev_len,
                               char *tls_var, size_t tls_len)
{
    size_t n = 0, m = 0;
    char **env;
    bool add_dev = net_devices != NULL && net_devices[0] != '\0', add_tls = tls != NULL && tls[0] != '\0';

    while (environ[n] != NULL)
        n++;
    env = cm_calloc(&kvs_check_tag, n + 3, sizeof(*env));
    if (env == NULL)
        return NULL;
    for (size_t i = 0; i < n; i++)
        if (!kvs_dp_env_is(environ[i], "UCX_TCP_PORT_RANGE=") && !(add_tls && kvs_dp_env_is(environ[i], "UCX_TLS=")))
            env[m++] = environ[i];
    if (add_dev) {
        snprintf(dev_var, dev_len, "UCX_NET_DEVICES=%s", net_devices);
        env[m++] = dev_var;
    }
    if (add_tls) {
        snprintf(tls_var, tls_len, "UCX_TLS=%s", tls);
        env[m++] = tls_var;
    }
    env[m] = NULL;
    return env;
}

ri_status_t kvs_dp_check_address(const void *addr, size_t len, const char *net_devices, const char *tls,
                                 const char *program)
{
    char path[PATH_MAX], dev_var[128], tls_var[300];
    char *text = NULL, **env = NULL;
    char *argv[3];
    posix_spawn_file_actions_t fa;
    pid_t pid;
    int wst = 0, rc;
    uint64_t deadline;
    ri_status_t st;

    if (!kvs_dp_check_path(program, path, sizeof(path))) {
        cm_error("dp: %s not found (%s): CONNECT refused (--addrcheck-program or RI_ADDRCHECK_PROGRAM names it)",
                 KVS_CHECK_NAME,
                 program != NULL && program[0] != '\0' ? program : "next to the program or at its build location");
        return RI_ERR_NOT_FOUND;
    }
    text = cm_malloc(&kvs_check_tag, CM_DP_ADDR_MAX);
    env = kvs_dp_check_env(net_devices, tls, dev_var, sizeof(dev_var), tls_var, sizeof(tls_var));
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
