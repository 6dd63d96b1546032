/*
 * Secret keys files: the generic part of bearer-key authentication (an HTTP
 * service's API keys).  A keys file holds one key per line, optionally
 * followed by a name for the logs ("KEY [NAME]"); blank lines and lines
 * starting with # are skipped.  Keys are 16..256 printable ASCII characters
 * without spaces.  The file must not be writable by its group or others
 * (whoever can write it can let themselves in).  Files are small (tens of
 * keys), so a lookup compares every key, in time that does not depend on
 * where or whether a key matches.
 *
 * The generic part (reading a secrets file under those rules, walking its
 * lines, validating and comparing secrets, the bearer header) is exported
 * too, for files with more fields per line (the kvstore's tokens file).
 */
#ifndef CM_KEYS_H
#define CM_KEYS_H

#include <stdbool.h>
#include <stddef.h>

#include "common/cm_status.h"

#define CM_KEYS_KEY_MIN 16
#define CM_KEYS_KEY_MAX 256

typedef struct cm_keys cm_keys_t;

/* Read and parse the keys file at path.  Errors: errno's status when it
 * cannot be opened, RI_ERR_PERMISSION (group or world writable),
 * RI_ERR_TOO_LARGE (over 1 MiB), RI_ERR_FORMAT (a bad line, a duplicate, no
 * key), RI_ERR_NOMEM; err says which (file and line).  Caller frees with
 * cm_keys_destroy. */
ri_status_t cm_keys_load(const char *path, cm_keys_t **keys_p, char *err, size_t errlen);

/* Parse keys-file text; name is used in messages.  Errors as cm_keys_load. */
ri_status_t cm_keys_parse(const char *text, const char *name, cm_keys_t **keys_p, char *err, size_t errlen);

/* Wipe and free.  NULL is a no-op. */
void cm_keys_destroy(cm_keys_t *keys);

size_t cm_keys_count(const cm_keys_t *keys);

/* Is key[0, len) one of the keys?  Constant time in the key's content. */
bool cm_keys_match(const cm_keys_t *keys, const char *key, size_t len);

/* The credentials of an Authorization header value "Bearer KEY" (scheme
 * case-insensitive): *key_p points into value.  False for any other form. */
bool cm_keys_bearer(const char *value, const char **key_p, size_t *len_p);

/* Length-delimited form of cm_keys_bearer (value need not be
 * NUL-terminated, e.g. gRPC metadata); trailing blanks are allowed. */
bool cm_keys_bearer_n(const char *value, size_t len, const char **key_p, size_t *len_p);

/* ---- the generic part ---- */

/* Read a secrets file whole.  Refused: group or world writable
 * (RI_ERR_PERMISSION: whoever can write it can let themselves in), over
 * 1 MiB (RI_ERR_TOO_LARGE), NUL bytes (RI_ERR_FORMAT); errno's status when it
 * cannot be opened, RI_ERR_IO, RI_ERR_NOMEM.  A world-readable file is taken
 * with a warning.  what names the file in messages ("keys file").  On
 * success *text_p is NUL-terminated; caller frees it with
 * cm_keys_text_free. */
ri_status_t cm_keys_read_file(const char *path, const char *what, char **text_p, char *err, size_t errlen);

/* Wipe and free text from cm_keys_read_file.  NULL is a no-op. */
void cm_keys_text_free(char *text);

/* One line of a secrets file that is neither blank nor a comment: its text
 * after the leading blanks, without CR/LF, modifiable (the caller's copy,
 * wiped after).  Returns RI_OK, or an error with *why_p saying what is
 * wrong with the line (a static string). */
typedef ri_status_t (*cm_keys_line_fn_t)(void *arg, char *line, const char **why_p);

/* Call fn for each line of text that is neither blank nor starts with #
 * (after blanks); the first error stops the walk and err reads
 * "NAME:LINE: why".  Errors: fn's, RI_ERR_NOMEM. */
ri_status_t cm_keys_each_line(const char *text, const char *name, cm_keys_line_fn_t fn, void *arg, char *err,
                              size_t errlen);

/* Is s[0, len) min..max printable ASCII characters without spaces? */
bool cm_keys_secret_valid(const char *s, size_t len, size_t min, size_t max);

/* Does the presented secret given[0, glen) equal stored[0, slen)?  Every
 * byte of stored is compared, so the time depends only on slen. */
bool cm_keys_equal_ct(const char *stored, size_t slen, const char *given, size_t glen);

#endif /* CM_KEYS_H */
