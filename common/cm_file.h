/* Whole-file reads for small configuration inputs (PEM certificates, token files). */
#ifndef CM_FILE_H
#define CM_FILE_H

#include <stddef.h>

#include "retroinfer/status.h"

/*
 * Read all of path (at most max bytes) into a NUL-terminated buffer allocated
 * with cm_malloc (caller frees with cm_free).  Errors: the errno-derived
 * status of open/read, RI_ERR_TOO_LARGE over max.  Writes outputs only on
 * success; len_p may be NULL.
 */
ri_status_t cm_file_read(const char *path, size_t max, char **buf_p, size_t *len_p);

#endif /* CM_FILE_H */
