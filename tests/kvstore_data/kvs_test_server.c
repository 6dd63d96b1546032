/*
 * A small server process for the data-plane integration tests and the
 * benchmark while the real ri-kvstore is not available: hosts kvs_data on
 * 127.0.0.1:0, creates one session, prints
 *   "<address> <session id> <secret hex>\n"
 * on stdout, then serves until SIGTERM/SIGINT and exits 0 after a clean
 * kvs_data_destroy.  Usage: kvs-test-server LAYERS KV_HEADS HEAD_DIM PAGE_TOKENS MEMORY_MB
 */
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

#include "common/cm_log.h"
#include "common/cm_runtime.h"
#include "kvstore/data/kvs_data.h"

static volatile sig_atomic_t stop_flag;

static void on_signal(int sig)
{
    (void)sig;
    stop_flag = 1;
}

int main(int argc, char **argv)
{
    kvs_geometry_t g = {.layers = 2, .kv_heads = 2, .head_dim = 64, .dtype = KVS_DTYPE_F16, .page_tokens = 8};
    kvs_data_config_t cfg = {.memory_bytes = 64u << 20, .dp_listen_addr = "127.0.0.1:0", .drain_timeout_ms = 2000};
    kvs_data_t *data;
    uint64_t id;
    uint8_t secret[16];
    struct sigaction sa = {.sa_handler = on_signal};
    ri_status_t st;

    char rt_err[256];
    if (cm_runtime_setup_from_env(cm_runtime_apply, rt_err, sizeof(rt_err)) != RI_OK) {
        fprintf(stderr, "kvs_test_server: %s\n", rt_err);
        return 2;
    }
    if (argc >= 6) {
        g.layers = (uint32_t)atoi(argv[1]);
        g.kv_heads = (uint32_t)atoi(argv[2]);
        g.head_dim = (uint32_t)atoi(argv[3]);
        g.page_tokens = (uint32_t)atoi(argv[4]);
        cfg.memory_bytes = (uint64_t)atoll(argv[5]) << 20;
    }
    /* UCX's own variables the user set, as ri-kvstore's main passes them */
    cfg.ucx_user = (kvs_ucx_user_env_t){.tls = getenv("UCX_TLS"), .net_devices = getenv("UCX_NET_DEVICES"),
                                        .port_range = getenv("UCX_TCP_PORT_RANGE"),
                                        .keepalive = getenv("UCX_KEEPALIVE_INTERVAL")};
    sigaction(SIGTERM, &sa, NULL);
    sigaction(SIGINT, &sa, NULL);
    st = kvs_data_create(&cfg, &data);
    if (st != RI_OK) {
        fprintf(stderr, "kvs-test-server: %s\n", ri_status_str(st));
        return st == RI_ERR_TRANSPORT ? 77 : 1;
    }
    st = kvs_data_session_create(data, "test", &g, 0, "integration", &id, secret);
    if (st != RI_OK) {
        fprintf(stderr, "kvs-test-server: session: %s\n", ri_status_str(st));
        kvs_data_destroy(data);
        return 1;
    }
    printf("%s %llu ", kvs_data_address(data, id), (unsigned long long)id);
    for (int i = 0; i < 16; i++)
        printf("%02x", secret[i]);
    printf("\n");
    fflush(stdout);
    while (!stop_flag)
        usleep(10000);
    kvs_data_destroy(data);
    return 0;
}
