/*
 * gRPC control client for ri-kvstore (the worker side of proto/): connect to
 * an address with an optional bearer token and call Health, Stats,
 * CreateSession, DropSession, ListSessions and Drain, each with a deadline.
 * gRPC status codes become ri_status_t here, once; the server's message comes
 * back in a gw_ctl_error_t when the caller passes one.
 *
 * Thread safety: one gw_ctl_t may be used from several threads at once (each
 * call has its own completion queue); destroy it only when no call runs.
 */
#ifndef GW_CTL_H
#define GW_CTL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "common/cm_dp_proto.h"
#include "common/cm_wire.h"
#include "retroinfer/status.h"

#define GW_CTL_DEFAULT_TIMEOUT_MS 5000u

/* What went wrong in a call, beyond the status. */
typedef struct gw_ctl_error {
    int grpc_code;     /* grpc_status_code (0 = OK; 14 = UNAVAILABLE, ...) */
    char message[512]; /* the server's status message, or ours when the call never reached it */
} gw_ctl_error_t;

typedef struct gw_ctl_health {
    int status;                    /* 1 = SERVING, 2 = DRAINING */
    char version[32];              /* daemon version */
    uint64_t uptime_ms;            /* since the daemon started */
    char dataplane_address[CM_DP_ADDR_MAX]; /* the data plane's UCX address ("ucx:HEX"), "" when none */
    char auth_mode[32];            /* "tokens" or "single-tenant" */
} gw_ctl_health_t;

typedef struct gw_ctl_stats {
    uint64_t pool_bytes_total, pool_bytes_used, disk_bytes_used;
    uint32_t sessions;      /* the caller's tenant */
    uint32_t sessions_all;  /* every tenant */
    uint64_t clusters;      /* the caller's tenant */
    uint64_t fetches, cache_hits, cache_misses, bytes_sent, errors, uptime_ms;
    struct {                /* prefix blocks, daemon-wide */
        uint64_t blocks_memory, bytes_memory, blocks_disk, bytes_disk;
        uint64_t attach_hits, attach_misses, tokens_attached;
        uint64_t publishes_new, publishes_existing, publishes_refused;
        uint64_t evictions, spills, corrupt;
    } prefix;
} gw_ctl_stats_t;

typedef struct gw_ctl_geometry {
    uint32_t layers;       /* model layers */
    uint32_t kv_heads;     /* KV heads per layer */
    uint32_t head_dim;     /* d */
    uint32_t dtype;        /* 1 = F16, 2 = BF16 */
    uint32_t page_tokens;  /* tokens per page; 0 = server default (8) */
} gw_ctl_geometry_t;

typedef struct gw_ctl_session {
    uint64_t session_id;                  /* never 0 */
    char dataplane_address[CM_DP_ADDR_MAX]; /* where to send data-plane messages ("ucx:HEX") */
    uint8_t secret[CM_WIRE_SECRET_SIZE];  /* put in every data-plane header */
} gw_ctl_session_t;

typedef struct gw_ctl_session_info {
    uint64_t session_id;
    char tenant[64];
    char label[128];
    gw_ctl_geometry_t geometry;
    uint64_t bytes_in_pool, bytes_on_disk, clusters, created_unix_ms;
    char dataplane_address[CM_DP_ADDR_MAX]; /* where its worker connects now ("ucx:HEX") */
} gw_ctl_session_info_t;

typedef struct gw_ctl gw_ctl_t;

/* Open a channel to addr ("host:port"); token may be NULL (Health needs none).
 * Connecting is lazy: an unreachable address shows up as RI_ERR_UNREACHABLE on
 * the first call.  Caller destroys with gw_ctl_destroy. */
ri_status_t gw_ctl_create(const char *addr, const char *token, gw_ctl_t **ctl_p);

/* TLS settings of a client: PEM file paths. */
typedef struct gw_ctl_tls {
    const char *ca_file;    /* CA that signed the server's certificate (required) */
    const char *cert_file;  /* client certificate for mutual TLS, or NULL */
    const char *key_file;   /* its private key, or NULL */
} gw_ctl_tls_t;

/* As gw_ctl_create, over TLS (tls may be NULL: plaintext).  Errors:
 * RI_ERR_INVALID (cert without key), the status of reading a file,
 * RI_ERR_FORMAT (not PEM). */
ri_status_t gw_ctl_create_tls(const char *addr, const char *token, const gw_ctl_tls_t *tls, gw_ctl_t **ctl_p);

/* Close the channel; NULL is a no-op. */
void gw_ctl_destroy(gw_ctl_t *ctl);

/* The address given to gw_ctl_create (borrowed). */
const char *gw_ctl_address(const gw_ctl_t *ctl);

/* Each call below: timeout_ms 0 = GW_CTL_DEFAULT_TIMEOUT_MS; err may be NULL.
 * Errors: RI_ERR_UNREACHABLE (no server), RI_ERR_TIMEOUT, RI_ERR_UNAUTHENTICATED,
 * RI_ERR_PERMISSION, RI_ERR_INVALID, RI_ERR_NOT_FOUND, RI_ERR_QUOTA,
 * RI_ERR_UNSUPPORTED (UNIMPLEMENTED), RI_ERR_SHUTDOWN, RI_ERR_PROTOCOL (a
 * reply we cannot parse).  Output structs are written only on success. */
ri_status_t gw_ctl_health(gw_ctl_t *ctl, uint32_t timeout_ms, gw_ctl_health_t *out, gw_ctl_error_t *err);
ri_status_t gw_ctl_stats(gw_ctl_t *ctl, uint32_t timeout_ms, gw_ctl_stats_t *out, gw_ctl_error_t *err);
ri_status_t gw_ctl_create_session(gw_ctl_t *ctl, uint32_t timeout_ms, const gw_ctl_geometry_t *geometry,
                                  uint64_t expected_tokens, const char *label, gw_ctl_session_t *out,
                                  gw_ctl_error_t *err);
ri_status_t gw_ctl_drop_session(gw_ctl_t *ctl, uint32_t timeout_ms, uint64_t session_id, uint64_t *bytes_freed_p,
                                gw_ctl_error_t *err);
/* *infos_p: allocated with cm_malloc, caller frees with cm_free (NULL when *n_p is 0). */
ri_status_t gw_ctl_list_sessions(gw_ctl_t *ctl, uint32_t timeout_ms, gw_ctl_session_info_t **infos_p, size_t *n_p,
                                 gw_ctl_error_t *err);
ri_status_t gw_ctl_drain(gw_ctl_t *ctl, uint32_t timeout_ms, uint32_t *sessions_open_p, gw_ctl_error_t *err);
/* Renew the leases of ids[0..n) (n <= 4096; docs/kvstore.md "Session
 * leases"): needed only while a session has no data-plane connection.
 * *renewed_p: how many of them the daemon still held (the others are gone);
 * *lease_ms_p: the daemon's lease period (0 = none).  Either may be NULL. */
ri_status_t gw_ctl_keepalive(gw_ctl_t *ctl, uint32_t timeout_ms, const uint64_t *ids, size_t n, uint32_t *renewed_p,
                             uint64_t *lease_ms_p, gw_ctl_error_t *err);

/* Prefix blocks (docs/kvstore-data.md "Prefix blocks"); keys are 32 bytes. */
typedef struct gw_ctl_prefix_info {
    uint8_t key[32];
    char tenant[64];
    uint64_t bytes;            /* block length */
    uint32_t tokens;           /* tokens it covers */
    uint32_t sessions;         /* sessions it is attached to */
    uint64_t created_unix_ms;
    bool on_disk;              /* only in the spill tier */
} gw_ctl_prefix_info_t;

/* How many of keys[0..n) (n x 32 bytes), from the first, the caller's
 * tenant holds (*cached_p) and their tokens (*tokens_p; may be NULL). */
ri_status_t gw_ctl_lookup_prefix(gw_ctl_t *ctl, uint32_t timeout_ms, const uint8_t *keys, size_t n,
                                 uint32_t *cached_p, uint64_t *tokens_p, gw_ctl_error_t *err);
/* The caller's tenant's blocks (an admin: every tenant's).  *infos_p:
 * cm_malloc'd, caller frees with cm_free (NULL when *n_p is 0). */
ri_status_t gw_ctl_list_prefixes(gw_ctl_t *ctl, uint32_t timeout_ms, gw_ctl_prefix_info_t **infos_p, size_t *n_p,
                                 gw_ctl_error_t *err);
/* Drop key (32 bytes) of tenant (NULL or "": the caller's own; an admin:
 * every tenant's).  *dropped_p, *bytes_freed_p may be NULL. */
ri_status_t gw_ctl_drop_prefix(gw_ctl_t *ctl, uint32_t timeout_ms, const uint8_t key[32], const char *tenant,
                               uint32_t *dropped_p, uint64_t *bytes_freed_p, gw_ctl_error_t *err);

/* A raw unary call: send req (len bytes, any content) to method (a full path
 * such as "/retroinfer.v1.KvStore/Health").  On success *resp_p holds the
 * reply bytes (cm_malloc; caller frees with cm_free; NULL when empty).  For
 * tests (malformed messages, unknown methods) and tools. */
ri_status_t gw_ctl_call_raw(gw_ctl_t *ctl, const char *method, const void *req, size_t len, uint32_t timeout_ms,
                            uint8_t **resp_p, size_t *resp_len_p, gw_ctl_error_t *err);

/* Our status for a grpc_status_code. */
ri_status_t gw_ctl_status_from_grpc(int grpc_code);

/* "UNAVAILABLE" etc. for a grpc_status_code. */
const char *gw_ctl_grpc_code_name(int grpc_code);

#endif /* GW_CTL_H */
