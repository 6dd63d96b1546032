/*
 * Start a real, single-member etcd (Debian's /usr/bin/etcd) for tests, on
 * free loopback ports with its data in a temporary folder; stop it, kill it
 * -9, and start it again on the same ports and data (an outage and a
 * recovery, as the cluster directory must survive them).
 */
#ifndef ETCD_SPAWN_H
#define ETCD_SPAWN_H

#include <stdbool.h>
#include <stdint.h>
#include <sys/types.h>

#define ETCD_SPAWN_BIN "/usr/bin/etcd"

typedef struct etcd_spawn {
    pid_t pid;            /* the etcd process, 0 when not running */
    uint16_t client_port; /* client (gRPC) port on 127.0.0.1 */
    uint16_t peer_port;   /* peer port on 127.0.0.1 (unused but bound) */
    char dir[256];        /* temporary folder (data dir and log under it) */
    char url[64];         /* "127.0.0.1:<client_port>" */
} etcd_spawn_t;

/* Is etcd installed here?  A test exits 77 when not. */
bool etcd_spawn_available(void);

/* Start etcd on two free ports in a new temporary folder and wait until it
 * answers /health (at most 10 s).  0 on success, -1 on failure (the log is
 * printed).  *s is filled. */
int etcd_spawn_start(etcd_spawn_t *s);

/* SIGKILL and reap; the ports and the data folder stay for a restart. */
void etcd_spawn_kill(etcd_spawn_t *s);

/* Start again on the same ports and data (after etcd_spawn_kill); 0 / -1. */
int etcd_spawn_restart(etcd_spawn_t *s);

/* Stop (SIGTERM, SIGKILL after 5 s) and remove the folder.  Safe twice. */
void etcd_spawn_stop(etcd_spawn_t *s);

#endif /* ETCD_SPAWN_H */
