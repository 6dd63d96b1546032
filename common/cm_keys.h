/*
 * Secret keys files: the generic part of bearer-key authentication (an HTTP
 * service's API keys).  A keys file holds one key per line, optionally
 * followed by a name for the logs ("KEY [NAME]"); blank lines and lines
 * starting with # are skipped.  Keys are 16..256 printable ASCII characters
 * without spaces.  The file must not be writable by its group or others
 * (whoever can write it can let themselves in).  Files are small (tens of
 * keys), so a lookup compares every key, in time that does not depend on
 * where or whether a key matches.
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

#endif /* CM_KEYS_H */
