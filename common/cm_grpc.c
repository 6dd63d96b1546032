/* One blocking unary gRPC call (see cm_grpc.h). */
#include "common/cm_grpc.h"

#include <string.h>

#include <grpc/byte_buffer.h>
#include <grpc/byte_buffer_reader.h>
#include <grpc/slice.h>
#include <grpc/support/time.h>

#include "common/cm_alloc.h"

static CM_ALLOC_TAG(cm_grpc_tag, "cm.grpc");

/* The answer's bytes into out (empty: resp stays NULL). */
static ri_status_t cm_grpc_read(grpc_byte_buffer *bb, cm_grpc_result_t *out)
{
    grpc_byte_buffer_reader reader;
    if (!grpc_byte_buffer_reader_init(&reader, bb))
        return RI_ERR_PROTOCOL;
    grpc_slice s = grpc_byte_buffer_reader_readall(&reader);
    grpc_byte_buffer_reader_destroy(&reader);
    size_t n = GRPC_SLICE_LENGTH(s);
    ri_status_t st = RI_OK;
    if (n > 0) {
        out->resp = cm_malloc(&cm_grpc_tag, n);
        if (out->resp == NULL)
            st = RI_ERR_NOMEM;
        else {
            memcpy(out->resp, GRPC_SLICE_START_PTR(s), n);
            out->resp_len = n;
        }
    }
    grpc_slice_unref(s);
    return st;
}

ri_status_t cm_grpc_unary(grpc_call *call, grpc_completion_queue *cq, gpr_timespec deadline, const char *bearer,
                          const void *req, size_t len, cm_grpc_result_t *out)
{
    grpc_metadata md;
    grpc_metadata_array init_md, trail_md;
    grpc_byte_buffer *resp_bb = NULL;
    grpc_status_code code = GRPC_STATUS_UNKNOWN;
    grpc_slice details = grpc_empty_slice();
    grpc_op ops[6];
    ri_status_t st = RI_OK;

    memset(out, 0, sizeof(*out));
    out->code = GRPC_STATUS_UNKNOWN;
    grpc_slice req_s = grpc_slice_from_copied_buffer(req ? (const char *)req : "", len);
    grpc_byte_buffer *req_bb = grpc_raw_byte_buffer_create(&req_s, 1);
    grpc_slice_unref(req_s);
    grpc_metadata_array_init(&init_md);
    grpc_metadata_array_init(&trail_md);

    memset(ops, 0, sizeof(ops));
    memset(&md, 0, sizeof(md));
    ops[0].op = GRPC_OP_SEND_INITIAL_METADATA;
    if (bearer != NULL) {
        md.key = grpc_slice_from_static_string("authorization");
        md.value = grpc_slice_from_copied_string(bearer);
        ops[0].data.send_initial_metadata.count = 1;
        ops[0].data.send_initial_metadata.metadata = &md;
    }
    ops[1].op = GRPC_OP_SEND_MESSAGE;
    ops[1].data.send_message.send_message = req_bb;
    ops[2].op = GRPC_OP_SEND_CLOSE_FROM_CLIENT;
    ops[3].op = GRPC_OP_RECV_INITIAL_METADATA;
    ops[3].data.recv_initial_metadata.recv_initial_metadata = &init_md;
    ops[4].op = GRPC_OP_RECV_MESSAGE;
    ops[4].data.recv_message.recv_message = &resp_bb;
    ops[5].op = GRPC_OP_RECV_STATUS_ON_CLIENT;
    ops[5].data.recv_status_on_client.trailing_metadata = &trail_md;
    ops[5].data.recv_status_on_client.status = &code;
    ops[5].data.recv_status_on_client.status_details = &details;

    if (grpc_call_start_batch(call, ops, sizeof(ops) / sizeof(ops[0]), call, NULL) != GRPC_CALL_OK) {
        st = RI_ERR_INTERNAL;
        goto out;
    }
    /* The call's deadline ends the batch; the margin only guards against a
     * core bug turning into a hang. */
    gpr_timespec guard = gpr_time_add(deadline, gpr_time_from_millis(5000, GPR_TIMESPAN));
    grpc_event ev = grpc_completion_queue_pluck(cq, call, guard, NULL);
    if (ev.type != GRPC_OP_COMPLETE) {
        grpc_call_cancel(call, NULL);
        grpc_completion_queue_pluck(cq, call, gpr_inf_future(GPR_CLOCK_MONOTONIC), NULL);
    }
    out->code = (int)code;
    size_t dl = GRPC_SLICE_LENGTH(details);
    if (dl >= sizeof(out->details))
        dl = sizeof(out->details) - 1;
    memcpy(out->details, GRPC_SLICE_START_PTR(details), dl);
    out->details[dl] = '\0';
    if (code == GRPC_STATUS_OK && resp_bb != NULL) {
        out->got_message = true;
        st = cm_grpc_read(resp_bb, out);
    }

out:
    if (bearer != NULL)
        grpc_slice_unref(md.value);
    grpc_slice_unref(details);
    grpc_metadata_array_destroy(&init_md);
    grpc_metadata_array_destroy(&trail_md);
    grpc_byte_buffer_destroy(req_bb);
    if (resp_bb != NULL)
        grpc_byte_buffer_destroy(resp_bb);
    grpc_call_unref(call);
    grpc_completion_queue_shutdown(cq);
    grpc_completion_queue_destroy(cq);
    return st;
}
