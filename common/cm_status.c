/* Status strings and conversions from foreign error codes (errno). */
#include "common/cm_status.h"

#include <errno.h>
#include <stddef.h>

typedef struct cm_status_desc {
    ri_status_t code;   /* the status */
    const char *name;   /* its enum name */
    const char *text;   /* what it means */
} cm_status_desc_t;

static const cm_status_desc_t cm_status_table[] = {
    {RI_OK, "RI_OK", "success"},
    {RI_ERR_INVALID, "RI_ERR_INVALID", "invalid argument"},
    {RI_ERR_NOMEM, "RI_ERR_NOMEM", "out of memory"},
    {RI_ERR_NOT_FOUND, "RI_ERR_NOT_FOUND", "not found"},
    {RI_ERR_EXISTS, "RI_ERR_EXISTS", "already exists"},
    {RI_ERR_UNSUPPORTED, "RI_ERR_UNSUPPORTED", "not supported"},
    {RI_ERR_BUSY, "RI_ERR_BUSY", "resource busy"},
    {RI_ERR_TIMEOUT, "RI_ERR_TIMEOUT", "timed out"},
    {RI_ERR_CANCELLED, "RI_ERR_CANCELLED", "cancelled"},
    {RI_ERR_INTERNAL, "RI_ERR_INTERNAL", "internal error"},
    {RI_ERR_SHUTDOWN, "RI_ERR_SHUTDOWN", "shutting down"},
    {RI_ERR_RANGE, "RI_ERR_RANGE", "out of range"},
    {RI_ERR_IO, "RI_ERR_IO", "input/output error"},
    {RI_ERR_NOSPACE, "RI_ERR_NOSPACE", "no space left"},
    {RI_ERR_CORRUPT, "RI_ERR_CORRUPT", "data corrupted (checksum mismatch)"},
    {RI_ERR_EOF, "RI_ERR_EOF", "unexpected end of file"},
    {RI_ERR_FORMAT, "RI_ERR_FORMAT", "bad file format"},
    {RI_ERR_LOST, "RI_ERR_LOST", "data lost in a daemon crash (it was in memory only): rebuild it"},
    {RI_ERR_TRANSPORT, "RI_ERR_TRANSPORT", "transport error"},
    {RI_ERR_UNREACHABLE, "RI_ERR_UNREACHABLE", "peer unreachable"},
    {RI_ERR_CONN_RESET, "RI_ERR_CONN_RESET", "connection reset by peer"},
    {RI_ERR_DEVICE, "RI_ERR_DEVICE", "device error"},
    {RI_ERR_NO_DEVICE, "RI_ERR_NO_DEVICE", "no usable device"},
    {RI_ERR_PROTOCOL, "RI_ERR_PROTOCOL", "protocol error"},
    {RI_ERR_BAD_MAGIC, "RI_ERR_BAD_MAGIC", "bad magic number"},
    {RI_ERR_BAD_VERSION, "RI_ERR_BAD_VERSION", "unsupported version"},
    {RI_ERR_TRUNCATED, "RI_ERR_TRUNCATED", "message truncated"},
    {RI_ERR_TOO_LARGE, "RI_ERR_TOO_LARGE", "length over limit"},
    {RI_ERR_QUOTA, "RI_ERR_QUOTA", "quota exceeded"},
    {RI_ERR_UNAUTHENTICATED, "RI_ERR_UNAUTHENTICATED", "not authenticated"},
    {RI_ERR_PERMISSION, "RI_ERR_PERMISSION", "permission denied"},
};

static const cm_status_desc_t *cm_status_find(ri_status_t status)
{
    for (size_t i = 0; i < sizeof(cm_status_table) / sizeof(cm_status_table[0]); i++) {
        if (cm_status_table[i].code == status)
            return &cm_status_table[i];
    }
    return NULL;
}

const char *ri_status_str(ri_status_t status)
{
    const cm_status_desc_t *d = cm_status_find(status);
    return d ? d->text : "unknown status";
}

const char *ri_status_name(ri_status_t status)
{
    const cm_status_desc_t *d = cm_status_find(status);
    return d ? d->name : "RI_ERR_UNKNOWN";
}

ri_status_area_t ri_status_area(ri_status_t status)
{
    if (status == RI_OK)
        return RI_AREA_OK;
    if (status > -20)
        return RI_AREA_GENERAL;
    if (status > -40)
        return RI_AREA_IO;
    if (status > -60)
        return RI_AREA_TRANSPORT;
    if (status > -80)
        return RI_AREA_DEVICE;
    if (status > -100)
        return RI_AREA_PROTOCOL;
    if (status > -120)
        return RI_AREA_QUOTA;
    return RI_AREA_AUTH;
}

ri_status_t cm_status_from_errno(int err)
{
    switch (err) {
    case 0: return RI_OK;
    case EINVAL: return RI_ERR_INVALID;
    case ENOMEM: return RI_ERR_NOMEM;
    case ENOENT: return RI_ERR_NOT_FOUND;
    case EEXIST: return RI_ERR_EXISTS;
    case ENOSYS: case EOPNOTSUPP: return RI_ERR_UNSUPPORTED;
    case EBUSY: case EAGAIN: return RI_ERR_BUSY;
    case ETIMEDOUT: return RI_ERR_TIMEOUT;
    case ECANCELED: case EINTR: return RI_ERR_CANCELLED;
    case ENOSPC: case EDQUOT: return RI_ERR_NOSPACE;
    case EACCES: case EPERM: return RI_ERR_PERMISSION;
    case ECONNREFUSED: case EHOSTUNREACH: case ENETUNREACH: return RI_ERR_UNREACHABLE;
    case ECONNRESET: case EPIPE: return RI_ERR_CONN_RESET;
    case ERANGE: case EOVERFLOW: return RI_ERR_RANGE;
    case EMSGSIZE: case E2BIG: return RI_ERR_TOO_LARGE;
    default: return RI_ERR_IO;
    }
}
