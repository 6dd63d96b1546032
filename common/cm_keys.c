/*
 * Secret keys files and constant-time key lookup (see cm_keys.h).
 */
#define _GNU_SOURCE
#include "common/cm_keys.h"

#include <errno.h>
#include <stdio.h>
#include <string.h>
#include <strings.h>
#include <sys/stat.h>

#include "common/cm_alloc.h"
#include "common/cm_log.h"

#define CM_KEYS_FILE_MAX (1u << 20) /* a keys file larger than 1 MiB is a mistake */

static CM_ALLOC_TAG(cm_keys_tag, "common.keys");

typedef struct cm_key {
    char key[CM_KEYS_KEY_MAX + 1];
    size_t len;
} cm_key_t;

struct cm_keys {
    cm_key_t *keys; /* owned, n of them */
    size_t n;
};

/* Parse one non-comment line into k; returns a message on error. */
static const char *cm_keys_parse_line(char *line, cm_key_t *k)
{
    size_t len = strcspn(line, " \t");
    if (len < CM_KEYS_KEY_MIN || len > CM_KEYS_KEY_MAX)
        return "a key must be 16..256 printable characters without spaces";
    for (size_t i = 0; i < len; i++)
        if ((unsigned char)line[i] <= 0x20 || (unsigned char)line[i] >= 0x7f)
            return "a key must be 16..256 printable characters without spaces";
    memcpy(k->key, line, len);
    k->key[len] = '\0';
    k->len = len;
    return NULL;
}

/* Append the key of one line (after its blanks) to keys; err says why not. */
static ri_status_t cm_keys_add(cm_keys_t *keys, size_t *cap, char *p, const char *name, unsigned lineno, char *err,
                               size_t errlen)
{
    if (keys->n == *cap) {
        size_t ncap = *cap ? *cap * 2 : 8;
        cm_key_t *nk = cm_realloc(&cm_keys_tag, keys->keys, ncap * sizeof(*nk));
        if (nk == NULL) {
            snprintf(err, errlen, "%s: out of memory", name);
            return RI_ERR_NOMEM;
        }
        keys->keys = nk;
        *cap = ncap;
    }
    const char *why = cm_keys_parse_line(p, &keys->keys[keys->n]);
    if (why != NULL) {
        snprintf(err, errlen, "%s:%u: %s", name, lineno, why);
        return RI_ERR_FORMAT;
    }
    for (size_t i = 0; i < keys->n; i++)
        if (strcmp(keys->keys[i].key, keys->keys[keys->n].key) == 0) {
            snprintf(err, errlen, "%s:%u: duplicate key (also on an earlier line)", name, lineno);
            return RI_ERR_FORMAT;
        }
    keys->n++;
    return RI_OK;
}

ri_status_t cm_keys_parse(const char *text, const char *name, cm_keys_t **keys_p, char *err, size_t errlen)
{
    ri_status_t st = RI_ERR_NOMEM;
    size_t cap = 0;
    unsigned lineno = 0;
    cm_keys_t *keys = cm_calloc(&cm_keys_tag, 1, sizeof(*keys));
    char *copy = cm_strdup(&cm_keys_tag, text);

    if (keys == NULL || copy == NULL) {
        snprintf(err, errlen, "%s: out of memory", name);
        goto err_free;
    }
    for (char *line = copy, *next; line != NULL; line = next) {
        char *nl = strchr(line, '\n');
        next = nl ? nl + 1 : NULL;
        if (nl)
            *nl = '\0';
        lineno++;
        line[strcspn(line, "\r")] = '\0';
        char *p = line + strspn(line, " \t");
        if (*p == '\0' || *p == '#')
            continue;
        if ((st = cm_keys_add(keys, &cap, p, name, lineno, err, errlen)) != RI_OK)
            goto err_free;
    }
    if (keys->n == 0) {
        st = RI_ERR_FORMAT;
        snprintf(err, errlen, "%s: no keys (one per line: KEY [NAME])", name);
        goto err_free;
    }
    explicit_bzero(copy, strlen(text));
    cm_free(copy);
    *keys_p = keys;
    return RI_OK;
err_free:
    if (copy != NULL)
        explicit_bzero(copy, strlen(text));
    cm_free(copy);
    cm_keys_destroy(keys);
    return st;
}

ri_status_t cm_keys_load(const char *path, cm_keys_t **keys_p, char *err, size_t errlen)
{
    ri_status_t st;
    struct stat sb;
    char *text = NULL;
    size_t got = 0;
    FILE *f = fopen(path, "re");

    if (f == NULL) {
        snprintf(err, errlen, "keys file %s: %s", path, strerror(errno));
        return cm_status_from_errno(errno);
    }
    if (fstat(fileno(f), &sb) != 0 || sb.st_size > CM_KEYS_FILE_MAX) {
        snprintf(err, errlen, "keys file %s: too large or unreadable", path);
        st = RI_ERR_TOO_LARGE;
        goto err_close;
    }
    if (sb.st_mode & (S_IWOTH | S_IWGRP)) {
        snprintf(err, errlen, "keys file %s is writable by %s (mode %04o); refused: chmod 600 it", path,
                 (sb.st_mode & S_IWOTH) ? "every user" : "its group", (unsigned)(sb.st_mode & 07777));
        st = RI_ERR_PERMISSION;
        goto err_close;
    }
    if (sb.st_mode & S_IROTH)
        cm_warn("keys file %s is readable by every user; chmod 600 it", path);
    if ((text = cm_calloc(&cm_keys_tag, 1, (size_t)sb.st_size + 1)) == NULL) {
        snprintf(err, errlen, "keys file %s: out of memory", path);
        st = RI_ERR_NOMEM;
        goto err_close;
    }
    got = fread(text, 1, (size_t)sb.st_size, f);
    if (ferror(f)) {
        snprintf(err, errlen, "keys file %s: read failed", path);
        st = RI_ERR_IO;
    } else if (memchr(text, '\0', got) != NULL) {
        snprintf(err, errlen, "keys file %s: contains NUL bytes", path);
        st = RI_ERR_FORMAT;
    } else {
        st = cm_keys_parse(text, path, keys_p, err, errlen);
    }
    explicit_bzero(text, got);
    cm_free(text);
err_close:
    fclose(f);
    return st;
}

void cm_keys_destroy(cm_keys_t *keys)
{
    if (keys == NULL)
        return;
    if (keys->keys != NULL) {
        explicit_bzero(keys->keys, keys->n * sizeof(*keys->keys));
        cm_free(keys->keys);
    }
    cm_free(keys);
}

size_t cm_keys_count(const cm_keys_t *keys)
{
    return keys ? keys->n : 0;
}

bool cm_keys_match(const cm_keys_t *keys, const char *key, size_t len)
{
    unsigned found = 0;
    if (keys == NULL || key == NULL || len == 0 || len > CM_KEYS_KEY_MAX)
        return false;
    for (size_t i = 0; i < keys->n; i++) {
        const cm_key_t *k = &keys->keys[i];
        /* every byte of every stored key is compared; the length last */
        unsigned char diff = 0;
        for (size_t j = 0; j < k->len; j++)
            diff |= (unsigned char)(k->key[j] ^ (j < len ? key[j] : 0));
        diff |= (unsigned char)(k->len != len);
        found |= diff == 0;
    }
    return found != 0;
}

bool cm_keys_bearer(const char *value, const char **key_p, size_t *len_p)
{
    if (value == NULL || strncasecmp(value, "Bearer ", 7) != 0)
        return false;
    const char *k = value + 7;
    k += strspn(k, " ");
    size_t len = strcspn(k, " \t");
    if (len == 0 || k[len + strspn(k + len, " \t")] != '\0')
        return false;
    *key_p = k;
    *len_p = len;
    return true;
}
