/*
 * ri-kvstore: the sidecar KV-cache daemon.  Reads its settings (defaults,
 * --config FILE, RI_KVS_* environment, flags), starts the control side and the
 * data side, prints where it listens, then waits for signals: SIGHUP re-reads
 * the tokens file; SIGTERM or SIGINT shut down within drain-timeout-ms.  Exit
 * status: 0 after a clean stop, 2 for bad settings, 1 when it could not start.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <unistd.h>

#include "common/cm_log.h"
#include "kvstore/ctl/kvs_ctl.h"

/* Write the bound addresses to path atomically (tmp file + rename), so a
 * reader that sees the file sees all of it. */
static int kvs_main_write_port_file(const char *path, const kvs_ctl_t *ctl)
{
    char tmp[4096];
    if (snprintf(tmp, sizeof(tmp), "%s.tmp.%d", path, (int)getpid()) >= (int)sizeof(tmp))
        return -1;
    FILE *f = fopen(tmp, "we");
    if (f == NULL) {
        cm_error("port-file %s: %s", tmp, strerror(errno));
        return -1;
    }
    const char *dp = kvs_data_address(ctl->data, 0);
    fprintf(f, "grpc=%s\nmetrics=%s\ndataplane=%s\ndataplane_interface=%s\npid=%d\n", ctl->grpc_addr,
            ctl->metrics_addr, dp ? dp : "", ctl->cfg.dataplane_listen, (int)getpid());
    if (fclose(f) != 0 || rename(tmp, path) != 0) {
        cm_error("port-file %s: %s", path, strerror(errno));
        unlink(tmp);
        return -1;
    }
    return 0;
}

/* UCX's own variables (UCX reads them itself, so they are environment
 * variables, not ri-kvstore settings): the data side is told which ones the
 * user set, so as not to override them, and reads no environment itself.
 * UCX 1.13 takes the TCP transport's port range only from the environment:
 * when the data-plane address names a port and the user set no range, it
 * is set here, before any thread runs, for the data plane to find. */
static void kvs_main_ucx_env(kvs_ctl_config_t *cfg)
{
    char range[32];

    cfg->ucx_user.tls = getenv("UCX_TLS");
    cfg->ucx_user.net_devices = getenv("UCX_NET_DEVICES");
    cfg->ucx_user.port_range = getenv("UCX_TCP_PORT_RANGE");
    cfg->ucx_user.keepalive = getenv("UCX_KEEPALIVE_INTERVAL");
    if (cfg->ucx_user.port_range == NULL &&
        kvs_data_ucx_port_range(cfg->dataplane_listen, (uint32_t)cfg->dataplane_threads, range, sizeof(range)) &&
        setenv("UCX_TCP_PORT_RANGE", range, 0) != 0)
        cm_warn("UCX_TCP_PORT_RANGE=%s not set (%s): UCX picks the data plane's ports", range, strerror(errno));
}

int main(int argc, char **argv)
{
    kvs_ctl_config_t cfg;
    cm_config_result_t res;
    char err[512];
    kvs_ctl_t *ctl = NULL;
    sigset_t sigs;
    int sig = 0, rc = 0;

    memset(&cfg, 0, sizeof(cfg)); /* so that cm_config_free is safe after any failure */
    if (cm_config_load(&kvs_ctl_config_table, &cfg, argc, argv, &res, err, sizeof(err)) != RI_OK) {
        fprintf(stderr, "ri-kvstore: %s\n(try --help)\n", err);
        cm_config_free(&kvs_ctl_config_table, &cfg);
        return 2;
    }
    if (res.help) {
        cm_config_usage(&kvs_ctl_config_table, stdout);
        cm_config_free(&kvs_ctl_config_table, &cfg);
        return 0;
    }
    if (res.dump) {
        cm_config_dump(&kvs_ctl_config_table, &cfg, stdout);
        cm_config_free(&kvs_ctl_config_table, &cfg);
        return 0;
    }
    if (res.first_arg < argc) {
        fprintf(stderr, "ri-kvstore: unexpected argument '%s' (try --help)\n", argv[res.first_arg]);
        cm_config_free(&kvs_ctl_config_table, &cfg);
        return 2;
    }
    if (kvs_ctl_config_check(&cfg, err, sizeof(err)) != RI_OK) {
        fprintf(stderr, "ri-kvstore: %s\n", err);
        cm_config_free(&kvs_ctl_config_table, &cfg);
        return 2;
    }

    kvs_main_ucx_env(&cfg);

    /* Not dumpable: /proc/PID/{fd,map_files,mem,maps} become root's and
     * ptrace (process_vm_readv too) is refused to processes of our own uid,
     * so none of them can reach a tenant's direct region through us (they
     * have no name anywhere else: kvstore/data/kvs_dp_region.c).  The cost:
     * no core dump on a crash unless core-dumps is set. */
    if (prctl(PR_SET_DUMPABLE, cfg.core_dumps ? 1 : 0, 0, 0, 0) != 0)
        cm_warn("prctl(PR_SET_DUMPABLE): %s", strerror(errno));

    /* Every thread created from here on inherits the blocked set, so the
     * signals reach only sigwait below. */
    signal(SIGPIPE, SIG_IGN);
    sigemptyset(&sigs);
    sigaddset(&sigs, SIGTERM);
    sigaddset(&sigs, SIGINT);
    sigaddset(&sigs, SIGHUP);
    pthread_sigmask(SIG_BLOCK, &sigs, NULL);

    if (kvs_ctl_start(&cfg, &ctl, err, sizeof(err)) != RI_OK) {
        fprintf(stderr, "ri-kvstore: cannot start: %s\n", err);
        cm_config_free(&kvs_ctl_config_table, &cfg);
        return 1;
    }
    const char *dp = kvs_data_address(ctl->data, 0);
    printf("ri-kvstore: grpc listening on %s%s\n", ctl->grpc_addr,
           ctl->tls_ca_pem ? " (mutual TLS)" : ctl->tls_cert_pem ? " (TLS)" : "");
    if (ctl->metrics_addr[0] != '\0')
        printf("ri-kvstore: metrics on http://%s/metrics\n", ctl->metrics_addr);
    if (dp && dp[0])
        printf("ri-kvstore: dataplane over UCX on the interface of %s (no listener; workers get the address, "
               "%zu characters, from CreateSession)\n", cfg.dataplane_listen, strlen(dp));
    else
        printf("ri-kvstore: dataplane (none)\n");
    printf("ri-kvstore: auth %s\n", ctl->tokens_mode ? "tokens" : "single-tenant (loopback only)");
    fflush(stdout);
    if (cfg.port_file[0] != '\0' && kvs_main_write_port_file(cfg.port_file, ctl) != 0)
        rc = 1;
    cm_info("ri-kvstore %s serving: grpc %s, %lld thread(s)", KVS_VERSION, ctl->grpc_addr, (long long)cfg.threads);

    while (rc == 0) {
        int e = sigwait(&sigs, &sig);
        if (e == 0 && sig == SIGHUP) {
            if (kvs_ctl_reload_tokens(ctl, err, sizeof(err)) != RI_OK)
                cm_error("SIGHUP: tokens not reloaded, the old ones stay: %s", err);
            sig = 0;
            continue;
        }
        if (e == 0)
            break;
        if (e != EINTR) {
            cm_error("sigwait: %s", strerror(e));
            rc = 1;
        }
    }
    if (sig != 0)
        cm_info("%s received: shutting down (drain timeout %lld ms)", strsignal(sig), (long long)cfg.drain_timeout_ms);
    kvs_ctl_destroy(ctl);
    if (cfg.port_file[0] != '\0')
        unlink(cfg.port_file);
    cm_config_free(&kvs_ctl_config_table, &cfg);
    cm_info("ri-kvstore stopped");
    return rc;
}
