/*
 * The "retroinfer-remote" method of the RULER-style suite: a ri-kvstore
 * child on free loopback ports (bench/common/bn_daemon.h, as ri bench e2e
 * does) and the worker's remote attention backend registered against it.
 * Built only with the worker library (RL_HAVE_REMOTE); otherwise asking
 * for the method says so.
 */
#include <stdio.h>
#include <stdlib.h>

#include "bench/ruler/rl_run.h"

#ifdef RL_HAVE_REMOTE
#include "bench/common/bn_daemon.h"
#include "gpuworker/client/gw_attn_remote.h"
#include "gpuworker/client/gw_remote.h"

static bn_daemon_t rl_daemon;
static bool rl_connected;

int rl_remote_start(const char *argv0)
{
    char err[512];
    setenv("UCX_TLS", GW_UCX_TLS_LOCAL, 0);   /* shared memory, also for the daemon */
    if (bn_daemon_start(&rl_daemon, argv0, "3GiB") != 0)
        return -1;
    gw_attn_remote_cfg_t cfg = {.address = rl_daemon.grpc, .timeout_ms = 10000};
    cfg.session_flags = bn_remote_env_flags(&cfg.keep_kv);
    if (gw_attn_remote_configure(&cfg, err, sizeof(err)) != RI_OK) {
        fprintf(stderr, "ri bench ruler: kvstore %s: %s\n", rl_daemon.grpc, err);
        bn_daemon_stop(&rl_daemon);
        return -1;
    }
    rl_connected = true;
    printf("retroinfer-remote: ri-kvstore pid %d at %s\n", (int)rl_daemon.pid, rl_daemon.grpc);
    return 0;
}

void rl_remote_stop(void)
{
    if (rl_connected)
        gw_attn_remote_shutdown();
    rl_connected = false;
    if (rl_daemon.pid > 0 || rl_daemon.dir[0])
        bn_daemon_stop(&rl_daemon);
}

#else

int rl_remote_start(const char *argv0)
{
    (void)argv0;
    fprintf(stderr, "ri bench ruler: retroinfer-remote is not in this build (no worker library)\n");
    return -1;
}

void rl_remote_stop(void)
{
}

#endif
