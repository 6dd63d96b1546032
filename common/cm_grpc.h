/*
 * One blocking unary call over the gRPC C core, as both our gRPC clients
 * make them (the kvstore's control client, gw_ctl; the etcd client,
 * cm_etcd): send one message, half-close, read the answer and the status,
 * on the caller's own pluck completion queue, so a client needs no lock
 * of its own to be used from several threads.
 */
#ifndef CM_GRPC_H
#define CM_GRPC_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <grpc/grpc.h>

#include "retroinfer/status.h"

/* What the call came back with. */
typedef struct cm_grpc_result {
    int code;               /* grpc_status_code */
    char details[400];      /* its status message, cut to fit, NUL-terminated */
    bool got_message;       /* an answer message arrived (it may be empty) */
    uint8_t *resp;          /* its bytes (cm_malloc: the caller frees), NULL when empty or none */
    size_t resp_len;
} cm_grpc_result_t;

/* Run call (created by the caller on cq with deadline; both consumed: the
 * call is unreffed and cq shut down and destroyed here) with req (len
 * bytes) and, when bearer is not NULL, an "authorization" header of that
 * value.  Waits for the batch until the deadline plus a margin (a core bug
 * must not turn into a hang).  RI_OK: *out holds the status and answer
 * (check out->code); RI_ERR_INTERNAL when the batch did not start,
 * RI_ERR_PROTOCOL when the answer cannot be read, RI_ERR_NOMEM. */
ri_status_t cm_grpc_unary(grpc_call *call, grpc_completion_queue *cq, gpr_timespec deadline, const char *bearer,
                          const void *req, size_t len, cm_grpc_result_t *out);

#endif /* CM_GRPC_H */
