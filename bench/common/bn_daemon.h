/*
 * A ri-kvstore child for a benchmark: started on free loopback ports (gRPC,
 * data plane, metrics), its addresses read from --port-file, stopped with
 * SIGTERM.  The binary is $RI_BUILD_DIR/bin/ri-kvstore, else next to argv0.
 */
#ifndef BN_DAEMON_H
#define BN_DAEMON_H

#include <stdbool.h>
#include <stdint.h>
#include <sys/types.h>

#include "common/cm_dp_proto.h"

typedef struct bn_daemon {
    pid_t pid;            /* 0 when not running */
    char dir[256];        /* temporary folder (port file) */
    char grpc[400];       /* "127.0.0.1:PORT" */
    char dataplane[CM_DP_ADDR_MAX]; /* lane 0 as the daemon reports it ("ucx:HEX"); a session connects
                                     * to the address its CreateSession gave */
    char metrics[400];    /* "127.0.0.1:PORT" */
} bn_daemon_t;

/* The path of our program name (e.g. "ri-worker"): $RI_BUILD_DIR/bin/NAME,
 * else beside argv0 (the benches and the programs share bin/). */
void bn_program_path(const char *argv0, const char *name, char *bin, size_t len);

/* Start with --memory=memory; returns 0, or -1 (message printed). */
int bn_daemon_start(bn_daemon_t *d, const char *argv0, const char *memory);

/* SIGTERM, wait, remove the folder.  Safe on a daemon that did not start. */
void bn_daemon_stop(bn_daemon_t *d);

/* The daemon's resident memory, KiB ("VmRSS"), or -1. */
long bn_daemon_rss_kib(const bn_daemon_t *d);

/* A process's resident memory, KiB ("VmRSS"), or -1. */
long bn_pid_rss_kib(pid_t pid);

/* The benchmarks' switches of the remote path, from the environment (the
 * library reads none): RI_DIRECT=0 (two-sided reads), RI_FETCH_ASYNC=1,
 * RI_PREDICT=0 as RI_SESSION_* flags (retroinfer.h); *keep_kv_p from
 * RI_KEEP_KV=1. */
uint32_t bn_remote_env_flags(bool *keep_kv_p);

#endif /* BN_DAEMON_H */
