/*
 * Start a data-plane server in a separate process for tests and benchmarks
 * (the small kvs-test-server from $RI_BUILD_DIR/bin), and read the line it
 * prints: data-plane address, session id and secret.
 */
#ifndef KVS_SPAWN_H
#define KVS_SPAWN_H

#include <stdint.h>
#include <sys/types.h>

#include "common/cm_dp_proto.h"

typedef struct kvs_spawn {
    pid_t pid;              /* server process */
    char addr[CM_DP_ADDR_MAX]; /* the data-plane address CreateSession gave ("ucx:HEX") */
    uint64_t session_id;    /* session created for us */
    uint8_t secret[16];     /* its secret */
    int real_daemon;        /* 1 when this is ri-kvstore (else kvs-test-server) */
    char grpc[200];         /* its gRPC address (ri-kvstore only; "" otherwise) */
} kvs_spawn_t;

/* Start the server with this geometry; 0 on success, 77 when it cannot run
 * here (no binary, UCX cannot start), -1 on other failures. */
int kvs_spawn_start(kvs_spawn_t *sp, unsigned layers, unsigned kv_heads, unsigned head_dim, unsigned page_tokens,
                    unsigned memory_mb);

/* Send sig and wait; returns the exit status (or 128+signal), -1 on error.
 * Gives up with SIGKILL after timeout_ms. */
int kvs_spawn_stop(kvs_spawn_t *sp, int sig, unsigned timeout_ms);

#endif
