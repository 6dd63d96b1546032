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

/*
 * Read a bearer token from path: the first word of the first line that is
 * neither blank nor a '#' comment.  So a file holding one token and a
 * kvstore tokens file (TOKEN TENANT ...) both work; the latter gives its
 * first token.  The token is copied into buf (len bytes, NUL-terminated).
 * Errors: as cm_file_read (file at most 64 KiB), RI_ERR_FORMAT when no
 * line holds a token, RI_ERR_TOO_LARGE when it does not fit buf.  buf is
 * written only on success.
 */
ri_status_t cm_file_read_token(const char *path, char *buf, size_t len);

#endif /* CM_FILE_H */
