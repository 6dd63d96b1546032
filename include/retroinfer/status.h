/*
 * The one status type of RetroInfer-C, shared by every layer and by the public
 * API.  0 is success; errors are negative and grouped by area in blocks of 20
 * (general, I/O, transport, device, protocol, quota, auth) so that a caller can
 * test the area with ri_status_area().  Foreign codes (errno, CUDA, UCX, gRPC,
 * protobuf-c) are converted once, where they enter our code.
 */
#ifndef RETROINFER_STATUS_H
#define RETROINFER_STATUS_H

#ifdef __cplusplus
extern "C" {
#endif

typedef enum ri_status {
    RI_OK = 0,

    /* general */
    RI_ERR_INVALID = -1,        /* bad argument or input */
    RI_ERR_NOMEM = -2,          /* allocation failed */
    RI_ERR_NOT_FOUND = -3,      /* no such object */
    RI_ERR_EXISTS = -4,         /* object already exists */
    RI_ERR_UNSUPPORTED = -5,    /* valid request we do not implement */
    RI_ERR_BUSY = -6,           /* resource in use; try again */
    RI_ERR_TIMEOUT = -7,        /* deadline passed */
    RI_ERR_CANCELLED = -8,      /* stopped by the caller or shutdown */
    RI_ERR_INTERNAL = -9,       /* our own invariant broke */
    RI_ERR_SHUTDOWN = -10,      /* the service is shutting down */
    RI_ERR_RANGE = -11,         /* index or size out of range */

    /* I/O */
    RI_ERR_IO = -20,            /* read/write failed */
    RI_ERR_NOSPACE = -21,       /* disk or pool full */
    RI_ERR_CORRUPT = -22,       /* checksum or structure mismatch */
    RI_ERR_EOF = -23,           /* unexpected end of file */
    RI_ERR_FORMAT = -24,        /* file is not in the expected format */
    RI_ERR_LOST = -25,          /* data gone: held only in memory by a daemon that crashed; rebuild it */

    /* transport */
    RI_ERR_TRANSPORT = -40,     /* transport-level failure */
    RI_ERR_UNREACHABLE = -41,   /* peer cannot be reached */
    RI_ERR_CONN_RESET = -42,    /* peer went away */

    /* device */
    RI_ERR_DEVICE = -60,        /* accelerator error */
    RI_ERR_NO_DEVICE = -61,     /* no usable accelerator */

    /* protocol */
    RI_ERR_PROTOCOL = -80,      /* malformed message */
    RI_ERR_BAD_MAGIC = -81,     /* wrong magic number */
    RI_ERR_BAD_VERSION = -82,   /* unsupported version */
    RI_ERR_TRUNCATED = -83,     /* message shorter than it claims */
    RI_ERR_TOO_LARGE = -84,     /* length over a limit */

    /* quota */
    RI_ERR_QUOTA = -100,        /* over a memory or disk quota */

    /* auth */
    RI_ERR_UNAUTHENTICATED = -120, /* missing or wrong credentials */
    RI_ERR_PERMISSION = -121,      /* authenticated but not allowed */
} ri_status_t;

/* Areas, for ri_status_area(). */
typedef enum ri_status_area {
    RI_AREA_OK = 0,
    RI_AREA_GENERAL,
    RI_AREA_IO,
    RI_AREA_TRANSPORT,
    RI_AREA_DEVICE,
    RI_AREA_PROTOCOL,
    RI_AREA_QUOTA,
    RI_AREA_AUTH,
} ri_status_area_t;

/* Short English text for a status; never NULL (unknown codes included). */
const char *ri_status_str(ri_status_t status);

/* The short name of a status ("RI_ERR_IO"); never NULL. */
const char *ri_status_name(ri_status_t status);

/* The area a status belongs to. */
ri_status_area_t ri_status_area(ri_status_t status);

#ifdef __cplusplus
}
#endif
#endif /* RETROINFER_STATUS_H */
