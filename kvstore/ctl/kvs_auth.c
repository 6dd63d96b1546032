/*
 * Tokens file parsing and constant-time token lookup.  The file is small (one
 * line per client, tens at most), so lookups scan every entry.  The generic
 * part (file permission rules, line walking, secret checks and comparison,
 * the bearer header) is common/cm_keys's; this file adds the tenants, quotas
 * and the admin flag.
 */
#define _GNU_SOURCE
#include "kvstore/ctl/kvs_auth.h"

#include <ctype.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/cm_alloc.h"
#include "common/cm_config.h"
#include "common/cm_keys.h"
#include "common/cm_log.h"
#include "common/cm_status.h"

static CM_ALLOC_TAG(kvs_auth_tag, "kvs.auth");

struct kvs_auth {
    kvs_auth_entry_t *entries;  /* owned, n of them */
    size_t n, cap;
};

bool kvs_auth_tenant_valid(const char *name)
{
    size_t len = name ? strlen(name) : 0;
    if (len == 0 || len >= KVS_AUTH_TENANT_MAX)
        return false;
    for (size_t i = 0; i < len; i++) {
        unsigned char c = (unsigned char)name[i];
        if (!isalnum(c) && c != '.' && c != '_' && c != '-')
            return false;
    }
    return true;
}

/* Parse one non-comment line into e; returns a message on error. */
static const char *kvs_auth_parse_line(char *line, kvs_auth_entry_t *e)
{
    char *save = NULL;
    char *tok = strtok_r(line, " \t", &save);
    char *tenant = strtok_r(NULL, " \t", &save);
    char *quota = strtok_r(NULL, " \t", &save);
    char *flag = strtok_r(NULL, " \t", &save);
    if (tenant == NULL)
        return "expected 'TOKEN TENANT [QUOTA|-] [admin]'";
    if (strtok_r(NULL, " \t", &save) != NULL)
        return "too many fields (expected 'TOKEN TENANT [QUOTA|-] [admin]')";
    if (!cm_keys_secret_valid(tok, strlen(tok), KVS_AUTH_TOKEN_MIN, KVS_AUTH_TOKEN_MAX))
        return "token must be 8..256 printable characters without spaces";
    if (!kvs_auth_tenant_valid(tenant))
        return "tenant must be 1..63 characters of [A-Za-z0-9._-]";
    memset(e, 0, sizeof(*e));
    memcpy(e->token, tok, strlen(tok) + 1);
    e->token_len = strlen(tok);
    memcpy(e->tenant, tenant, strlen(tenant) + 1);
    if (quota != NULL && strcmp(quota, "-") != 0) {
        if (cm_config_parse_size(quota, &e->quota_bytes) != RI_OK)
            return "quota is not a size (e.g. 4GiB, or '-' for the default)";
        e->has_quota = true;
    }
    if (flag != NULL) {
        if (strcmp(flag, "admin") != 0)
            return "the fourth field may only be 'admin'";
        e->admin = true;
    }
    return NULL;
}

/* Append the entry of one line to auth (cm_keys_line_fn_t). */
static ri_status_t kvs_auth_add(void *arg, char *line, const char **why_p)
{
    kvs_auth_t *auth = arg;
    if (auth->n == auth->cap) {
        size_t ncap = auth->cap ? auth->cap * 2 : 8;
        kvs_auth_entry_t *ne = cm_realloc(&kvs_auth_tag, auth->entries, ncap * sizeof(*ne));
        if (ne == NULL) {
            *why_p = "out of memory";
            return RI_ERR_NOMEM;
        }
        auth->entries = ne;
        auth->cap = ncap;
    }
    kvs_auth_entry_t *e = &auth->entries[auth->n];
    if ((*why_p = kvs_auth_parse_line(line, e)) != NULL)
        return RI_ERR_FORMAT;
    for (size_t i = 0; i < auth->n; i++)
        if (cm_keys_equal_ct(auth->entries[i].token, auth->entries[i].token_len, e->token, e->token_len)) {
            *why_p = "duplicate token (also on an earlier line)";
            return RI_ERR_FORMAT;
        }
    auth->n++;
    return RI_OK;
}

ri_status_t kvs_auth_parse(const char *text, const char *name, kvs_auth_t **auth_p, char *err, size_t errlen)
{
    ri_status_t st;
    kvs_auth_t *auth = cm_calloc(&kvs_auth_tag, 1, sizeof(*auth));
    if (auth == NULL) {
        snprintf(err, errlen, "%s: out of memory", name);
        return RI_ERR_NOMEM;
    }
    if ((st = cm_keys_each_line(text, name, kvs_auth_add, auth, err, errlen)) != RI_OK)
        goto err_free_auth;
    if (auth->n == 0) {
        st = RI_ERR_FORMAT;
        snprintf(err, errlen, "%s: no tokens (lines are 'TOKEN TENANT [QUOTA|-] [admin]')", name);
        goto err_free_auth;
    }
    *auth_p = auth;
    return RI_OK;
err_free_auth:
    kvs_auth_destroy(auth);
    return st;
}

/* Anyone who can write the file can make themselves an admin tenant:
 * cm_keys_read_file refuses a group- or world-writable one. */
ri_status_t kvs_auth_load(const char *path, kvs_auth_t **auth_p, char *err, size_t errlen)
{
    char *text = NULL;
    ri_status_t st = cm_keys_read_file(path, "tokens file", &text, err, errlen);
    if (st != RI_OK)
        return st;
    st = kvs_auth_parse(text, path, auth_p, err, errlen);
    cm_keys_text_free(text);
    return st;
}

void kvs_auth_destroy(kvs_auth_t *auth)
{
    if (auth == NULL)
        return;
    if (auth->entries != NULL) {
        explicit_bzero(auth->entries, auth->n * sizeof(*auth->entries));
        cm_free(auth->entries);
    }
    cm_free(auth);
}

const kvs_auth_entry_t *kvs_auth_lookup(const kvs_auth_t *auth, const char *token, size_t len)
{
    const kvs_auth_entry_t *found = NULL;
    if (auth == NULL || token == NULL || len == 0 || len > KVS_AUTH_TOKEN_MAX)
        return NULL;
    for (size_t i = 0; i < auth->n; i++) /* every entry, whether or not one matched */
        if (cm_keys_equal_ct(auth->entries[i].token, auth->entries[i].token_len, token, len))
            found = &auth->entries[i];
    return found;
}

size_t kvs_auth_count(const kvs_auth_t *auth)
{
    return auth ? auth->n : 0;
}

const kvs_auth_entry_t *kvs_auth_entry(const kvs_auth_t *auth, size_t i)
{
    return (auth != NULL && i < auth->n) ? &auth->entries[i] : NULL;
}
