/*
 * Private structures of the UCX data plane (kvs_dp.c serves, kvs_dp_setup.c
 * starts and stops).  The data plane is a few "lanes": each one a UCX worker
 * with its own thread, address, connections and request queue, all on one
 * UCX context (one registration of the pool).  A session is served by one
 * lane only (lane = session id mod lanes): CreateSession hands out that
 * lane's address and CONNECT refuses any other, so one session's requests
 * never run on two threads, and a client that stalls delays only the
 * sessions of its own lane (and those only while it holds the thread: bodies
 * are received and replies sent without waiting on the peer).
 */
#ifndef KVS_DP_LANE_H
#define KVS_DP_LANE_H

#include <limits.h>
#include <net/if.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <ucp/api/ucp.h>

#include "common/cm_dp_direct.h"
#include "common/cm_dp_proto.h"
#include "kvstore/data/kvs_dp.h"
#include "kvstore/data/kvs_handler.h"

#define KVS_DP_MAX_LANES 64u

typedef struct kvs_dpw kvs_dpw_t;
typedef struct kvs_reply kvs_reply_t; /* a reply being sent (kvs_dp.c) */

/* One accepted connection (a CONNECT that passed). */
typedef struct kvs_conn {
    ucp_ep_h ep;              /* our endpoint to the worker's address */
    const void *peer_key;     /* the UCX reply ep its requests arrive on; compared, never used */
    uint64_t session_id;      /* the session its CONNECT named */
    kvs_dpw_t *lane;          /* owner */
    bool failed;              /* error handler fired or DISCONNECT; close at the next turn */
    bool graceful;            /* DISCONNECT: flush the reply out before the close */
    uint32_t inflight;        /* its requests queued or being served */
    struct kvs_conn *next;
} kvs_conn_t;

/* One request, from the AM callback until it is answered. */
typedef struct kvs_dreq {
    const void *peer_key;             /* the UCX connection it came on (see kvs_conn_t) */
    uint8_t hdr[CM_WIRE_HDR_SIZE];    /* the header bytes (first 64) */
    size_t hdr_len;                   /* header length as received */
    void *desc;                       /* UCX data (persistent or rndv) or our copy */
    size_t len;                       /* body length */
    bool rndv, ucx_owned;             /* kind of desc */
    bool unconnected;                 /* arrived on no accepted connection (counted in the lane) */
    /* a rendezvous body being received (kvs_dp.c) */
    cm_wire_hdr_t h;                  /* decoded header */
    uint8_t *body;                    /* receive buffer (cm_malloc'd) */
    void *recv_req;                   /* UCX request, NULL once done */
    ucs_status_t recv_status;
    uint64_t deadline_ns;             /* cancelled past this; its connection closed past this + a grace */
    bool expired;                     /* past its deadline: answered TIMEOUT, or its connection closed */
    struct kvs_dreq *next;
} kvs_dreq_t;

/* A queue of requests (FIFO). */
typedef struct kvs_dq {
    kvs_dreq_t *head, *tail;
} kvs_dq_t;

struct kvs_dpw {
    kvs_dp_t *dp;                     /* owner */
    uint32_t index;                   /* lane number */
    ucp_worker_h worker;
    char address[CM_DP_ADDR_MAX];     /* its packed address, as text */
    pthread_t thread;
    bool thread_started;
    int efd;                          /* worker event fd, -1 when none */
    kvs_conn_t *conns;
    uint32_t n_conns;
    kvs_dq_t queue;                   /* arrived, not yet looked at */
    kvs_dq_t receiving;               /* rendezvous bodies on their way in */
    kvs_dq_t ready;                   /* bodies in (or failed): serve next */
    uint8_t *stage;                   /* inline replies are gathered here when it is free */
    size_t stage_len;
    bool stage_busy;                  /* a reply from stage is still being sent */
    kvs_reply_t *replies;             /* replies UCX has not called back for yet */
    uint32_t unconnected;             /* queued requests from no accepted connection */
    uint64_t dropped_proto, dropped_quota; /* refused in the AM callback, not yet counted in data */
};

struct kvs_dp {
    kvs_handlers_t h;                 /* the operations (kvs_handler.h) */
    kvs_dp_config_t cfg;              /* copy; listen_addr points to listen_addr */
    char listen_addr[128];
    ucp_context_h ctx;
    char net_dev[IF_NAMESIZE + 1];    /* UCX network device we restrict to ("" = all) */
    char tls[256];                    /* UCX_TLS of our context (no shared memory; kvs_dp_setup.c) */
    char check_program[PATH_MAX];     /* cfg.check_program ("" = found next to the program) */
    uint64_t max_body;
    atomic_bool stop;
    atomic_uint n_conns;              /* connections of every lane */
    uint32_t n_lanes;
    kvs_dpw_t *lanes;                 /* n_lanes */
    /* the handover socket of direct regions (kvs_dp_region.c) */
    int ho_fd;                        /* listening, -1 when not up */
    int ho_wake[2];                   /* pipe that stops its thread */
    bool ho_started;
    pthread_t ho_thread;
    char ho_name[CM_DP_MAX_SOCK_NAME + 1]; /* abstract name, no leading NUL */
};

/* Serving thread of a lane (kvs_dp.c). */
void *kvs_dp_lane_main(void *arg);

/* The lane's AM handler (kvs_dp.c); arg is the lane. */
ucs_status_t kvs_dp_am_cb(void *arg, const void *header, size_t header_length, void *data, size_t length,
                          const ucp_am_recv_param_t *param);

/* Drop everything still queued and close every connection of a lane whose
 * thread has stopped (kvs_dp.c). */
void kvs_dp_lane_drain(kvs_dpw_t *w);

/* Free the replies whose sends never called back; only once the lane's UCX
 * worker is destroyed (kvs_dp.c). */
void kvs_dp_lane_free_replies(kvs_dpw_t *w);

/* UCX status to ours. */
ri_status_t kvs_dp_status(ucs_status_t s);

/* Direct regions and the handover socket (kvs_dp_region.c); the first three
 * are the kvs_xport_ops_t the operations get (handle: the kvs_dp_t). */
ri_status_t kvs_dp_region_alloc(void *handle, uint64_t bytes, uint8_t **base_p, int *fd_p);
void kvs_dp_region_free(void *handle, uint8_t *base, uint64_t bytes, int fd);
const char *kvs_dp_handover_name(void *handle);
/* Start / stop the handover socket and its thread; the data plane does it
 * with its lanes.  Stop is idempotent. */
ri_status_t kvs_dp_handover_start(kvs_dp_t *dp);
void kvs_dp_handover_stop(kvs_dp_t *dp);

#endif /* KVS_DP_LANE_H */
