/* Internal side of the status type: conversions at the boundaries. */
#ifndef CM_STATUS_H
#define CM_STATUS_H

#include "retroinfer/status.h"

/* Convert an errno value to our status (unknown values map to RI_ERR_IO). */
ri_status_t cm_status_from_errno(int err);

/* Propagate a failing status: `CM_CHECK(st = f(), err_label)`. */
#define CM_CHECK_GOTO(expr, label) \
    do {                           \
        if ((expr) != RI_OK)       \
            goto label;            \
    } while (0)

#define CM_ARRAY_LEN(a) (sizeof(a) / sizeof((a)[0]))
#define CM_MIN(a, b) ((a) < (b) ? (a) : (b))
#define CM_MAX(a, b) ((a) > (b) ? (a) : (b))
#define CM_ALIGN_UP(x, a) ((((x) + (a) - 1) / (a)) * (a))

#endif /* CM_STATUS_H */
