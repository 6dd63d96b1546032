/*
 * Bearer-token authentication of the control API.  A tokens file maps tokens
 * to tenants (one line per token: `TOKEN TENANT [QUOTA|-] [admin]`, '#'
 * comments; see docs/kvstore.md).  Loaded once at start; lookups are
 * read-only afterwards, so any serving thread may call them without a lock.
 * The bearer header itself is parsed by cm_keys_bearer_n (common/cm_keys.h).
 */
#ifndef KVS_AUTH_H
#define KVS_AUTH_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "retroinfer/status.h"

#define KVS_AUTH_TOKEN_MIN 8     /* shortest token accepted in the file */
#define KVS_AUTH_TOKEN_MAX 256   /* longest token (bytes) */
#define KVS_AUTH_TENANT_MAX 64   /* tenant names: 1..63 bytes of [A-Za-z0-9._-] */

/* One tokens-file entry. */
typedef struct kvs_auth_entry {
    char token[KVS_AUTH_TOKEN_MAX + 1];  /* secret bearer token */
    size_t token_len;                    /* strlen(token) */
    char tenant[KVS_AUTH_TENANT_MAX];    /* tenant it stands for */
    uint64_t quota_bytes;                /* memory quota; 0 = the daemon default */
    bool has_quota;                      /* quota given in the file */
    bool admin;                          /* may call Drain */
} kvs_auth_entry_t;

typedef struct kvs_auth kvs_auth_t;

/* Parse a tokens file.  Errors (RI_ERR_INVALID, RI_ERR_FORMAT, I/O) carry a
 * message naming the file and line in err.  Caller destroys with
 * kvs_auth_destroy. */
ri_status_t kvs_auth_load(const char *path, kvs_auth_t **auth_p, char *err, size_t errlen);

/* Parse tokens-file text (for tests and kvs_auth_load); name is used in messages. */
ri_status_t kvs_auth_parse(const char *text, const char *name, kvs_auth_t **auth_p, char *err, size_t errlen);

/* NULL is a no-op; wipes the tokens from memory. */
void kvs_auth_destroy(kvs_auth_t *auth);

/* Find the entry for a presented token (len bytes, not NUL-terminated).
 * Compares against every entry in constant time per entry, so timing does not
 * reveal which prefix matched.  Returns a borrowed entry (valid until destroy)
 * or NULL. */
const kvs_auth_entry_t *kvs_auth_lookup(const kvs_auth_t *auth, const char *token, size_t len);

/* Number of entries, and the i-th one (for applying quotas at start). */
size_t kvs_auth_count(const kvs_auth_t *auth);
const kvs_auth_entry_t *kvs_auth_entry(const kvs_auth_t *auth, size_t i);

/* Is name a valid tenant name (1..63 bytes of [A-Za-z0-9._-])? */
bool kvs_auth_tenant_valid(const char *name);

#endif /* KVS_AUTH_H */
