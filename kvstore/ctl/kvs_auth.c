/*
 * Tokens file parsing and constant-time token lookup.  The file is small (one
 * line per client, tens at most), so lookups scan every entry.
 */
#define _GNU_SOURCE
#include "kvstore/ctl/kvs_auth.h"

#include <ctype.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/stat.h>

#include "common/cm_alloc.h"
#include "common/cm_config.h"
#include "common/cm_log.h"
#include "common/cm_status.h"

#define KVS_AUTH_FILE_MAX (1u << 20) /* a tokens file larger than 1 MiB is a mistake */

static CM_ALLOC_TAG(kvs_auth_tag, "kvs.auth");

struct kvs_auth {
    kvs_auth_entry_t *entries;  /* owned, n of them */
    size_t n;
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

static bool kvs_auth_token_valid(const char *tok, size_t len)
{
    if (len < KVS_AUTH_TOKEN_MIN || len > KVS_AUTH_TOKEN_MAX)
        return false;
    for (size_t i = 0; i < len; i++) {
        unsigned char c = (unsigned char)tok[i];
        if (c <= 0x20 || c >= 0x7f)
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
    if (!kvs_auth_token_valid(tok, strlen(tok)))
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

ri_status_t kvs_auth_parse(const char *text, const char *name, kvs_auth_t **auth_p, char *err, size_t errlen)
{
    ri_status_t st = RI_OK;
    kvs_auth_t *auth = NULL;
    char *copy = NULL;
    size_t cap = 0;
    unsigned lineno = 0;

    auth = cm_calloc(&kvs_auth_tag, 1, sizeof(*auth));
    copy = cm_strdup(&kvs_auth_tag, text);
    if (auth == NULL || copy == NULL) {
        st = RI_ERR_NOMEM;
        snprintf(err, errlen, "%s: out of memory", name);
        goto err_free;
    }
    char *save = NULL;
    for (char *line = copy; line != NULL; line = save) {
        char *nl = strchr(line, '\n');
        save = nl ? nl + 1 : NULL;
        if (nl)
            *nl = '\0';
        lineno++;
        size_t len = strlen(line);
        if (len > 0 && line[len - 1] == '\r')
            line[--len] = '\0';
        char *p = line;
        while (*p == ' ' || *p == '\t')
            p++;
        if (*p == '\0' || *p == '#')
            continue;
        if (auth->n == cap) {
            size_t ncap = cap ? cap * 2 : 8;
            kvs_auth_entry_t *ne = cm_realloc(&kvs_auth_tag, auth->entries, ncap * sizeof(*ne));
            if (ne == NULL) {
                st = RI_ERR_NOMEM;
                snprintf(err, errlen, "%s: out of memory", name);
                goto err_free;
            }
            auth->entries = ne;
            cap = ncap;
        }
        const char *why = kvs_auth_parse_line(p, &auth->entries[auth->n]);
        if (why != NULL) {
            st = RI_ERR_FORMAT;
            snprintf(err, errlen, "%s:%u: %s", name, lineno, why);
            goto err_free;
        }
        for (size_t i = 0; i < auth->n; i++) {
            if (strcmp(auth->entries[i].token, auth->entries[auth->n].token) == 0) {
                st = RI_ERR_FORMAT;
                snprintf(err, errlen, "%s:%u: duplicate token (also on an earlier line)", name, lineno);
                goto err_free;
            }
        }
        auth->n++;
    }
    if (auth->n == 0) {
        st = RI_ERR_FORMAT;
        snprintf(err, errlen, "%s: no tokens (lines are 'TOKEN TENANT [QUOTA|-] [admin]')", name);
        goto err_free;
    }
    explicit_bzero(copy, strlen(text));
    cm_free(copy);
    *auth_p = auth;
    return RI_OK;

err_free:
    if (copy != NULL)
        explicit_bzero(copy, strlen(text));
    cm_free(copy);
    kvs_auth_destroy(auth);
    return st;
}

ri_status_t kvs_auth_load(const char *path, kvs_auth_t **auth_p, char *err, size_t errlen)
{
    ri_status_t st;
    struct stat sb;
    char *text = NULL;
    FILE *f = fopen(path, "re");
    if (f == NULL) {
        snprintf(err, errlen, "tokens file %s: %s", path, strerror(errno));
        return cm_status_from_errno(errno);
    }
    if (fstat(fileno(f), &sb) != 0 || sb.st_size > KVS_AUTH_FILE_MAX) {
        snprintf(err, errlen, "tokens file %s: too large or unreadable", path);
        st = RI_ERR_TOO_LARGE;
        goto err_close;
    }
    /* Anyone who can write the file can make themselves an admin tenant. */
    if (sb.st_mode & (S_IWOTH | S_IWGRP)) {
        snprintf(err, errlen, "tokens file %s is writable by %s (mode %04o); refused: chmod 600 it", path,
                 (sb.st_mode & S_IWOTH) ? "every user" : "its group", (unsigned)(sb.st_mode & 07777));
        st = RI_ERR_PERMISSION;
        goto err_close;
    }
    if (sb.st_mode & S_IROTH)
        cm_warn("tokens file %s is readable by every user; chmod 600 it", path);
    text = cm_calloc(&kvs_auth_tag, 1, (size_t)sb.st_size + 1);
    if (text == NULL) {
        st = RI_ERR_NOMEM;
        snprintf(err, errlen, "tokens file %s: out of memory", path);
        goto err_close;
    }
    size_t got = fread(text, 1, (size_t)sb.st_size, f);
    if (ferror(f)) {
        st = RI_ERR_IO;
        snprintf(err, errlen, "tokens file %s: read failed", path);
        goto err_free_text;
    }
    if (memchr(text, '\0', got) != NULL) {
        st = RI_ERR_FORMAT;
        snprintf(err, errlen, "tokens file %s: contains NUL bytes", path);
        goto err_free_text;
    }
    st = kvs_auth_parse(text, path, auth_p, err, errlen);

err_free_text:
    explicit_bzero(text, got);
    cm_free(text);
err_close:
    fclose(f);
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
    for (size_t i = 0; i < auth->n; i++) {
        const kvs_auth_entry_t *e = &auth->entries[i];
        /* Compare the whole stored token every time; length checked last. */
        unsigned char diff = 0;
        for (size_t j = 0; j < e->token_len; j++)
            diff |= (unsigned char)(e->token[j] ^ (j < len ? token[j] : 0));
        diff |= (unsigned char)(e->token_len != len);
        if (diff == 0)
            found = e;
    }
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

bool kvs_auth_parse_bearer(const char *value, size_t len, const char **token_p, size_t *token_len_p)
{
    if (value == NULL || len < 7 || strncasecmp(value, "Bearer ", 7) != 0)
        return false;
    size_t off = 7;
    while (off < len && value[off] == ' ')
        off++;
    size_t end = len;
    while (end > off && value[end - 1] == ' ')
        end--;
    if (end == off)
        return false;
    *token_p = value + off;
    *token_len_p = end - off;
    return true;
}
