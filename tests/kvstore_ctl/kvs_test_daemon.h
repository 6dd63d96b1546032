/*
 * Test helper: start the real ri-kvstore as a child process on ephemeral
 * loopback ports (gRPC, data plane, metrics all port 0), learn its addresses
 * from --port-file, stop it with a signal and collect its exit status.  Each
 * daemon gets its own temporary folder, so tests may run in parallel.
 */
#ifndef KVS_TEST_DAEMON_H
#define KVS_TEST_DAEMON_H

#include <stdbool.h>
#include <sys/types.h>

#include "common/cm_dp_proto.h"

typedef struct kvs_test_daemon {
    pid_t pid;               /* child, 0 once reaped */
    char dir[256];           /* temporary folder (port file, tokens file) */
    char grpc[300];          /* "127.0.0.1:PORT" */
    char metrics[300];       /* "127.0.0.1:PORT" or "" */
    char dataplane[CM_DP_ADDR_MAX]; /* as the daemon reports it ("ucx:HEX") */
} kvs_test_daemon_t;

/* Make a temporary folder for a daemon (before writing a tokens file into it). */
int kvs_test_daemon_prepare(kvs_test_daemon_t *d);

/* Write text to DIR/name; returns 0 on success, and the path in path_out. */
int kvs_test_daemon_write_file(const kvs_test_daemon_t *d, const char *name, const char *text, char *path_out,
                               size_t len);

/* Start ri-kvstore with the default test flags plus extra (NULL-terminated)
 * and wait up to 15 s for it to serve.  Returns 0, or 77 when the binary is
 * missing (test should skip), or -1 when it failed to start (*exit_p = its
 * exit status when it exited). */
int kvs_test_daemon_start(kvs_test_daemon_t *d, const char *const *extra, int *exit_p);

/* The same, the daemon running as uid:gid (the caller is root; the folder
 * and the files in it are given to that uid).  uid (uid_t)-1: as the caller. */
int kvs_test_daemon_start_as(kvs_test_daemon_t *d, const char *const *extra, uid_t uid, gid_t gid, int *exit_p);

/* Send sig and wait up to timeout_ms for exit.  Returns the exit status
 * (0..255), 128+signal when killed, or -1 on timeout (then SIGKILLs it). */
int kvs_test_daemon_stop(kvs_test_daemon_t *d, int sig, int timeout_ms);

/* Remove the folder and its files. */
void kvs_test_daemon_cleanup(kvs_test_daemon_t *d);

/* Run a program to completion with a timeout; returns its exit status, and
 * its stdout+stderr (up to len-1 bytes) in out. */
int kvs_test_run(const char *const *argv, char *out, size_t len, int timeout_ms);

/* HTTP GET of path from "host:port"; returns the status code and the body in
 * out (NUL-terminated, truncated to len-1), or -1. */
int kvs_test_http_get(const char *addr, const char *path, char *out, size_t len);

/* Path of a built program: $RI_BUILD_DIR/bin/name. */
const char *kvs_test_bin(const char *name, char *buf, size_t len);

#endif /* KVS_TEST_DAEMON_H */
