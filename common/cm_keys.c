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
    size_t n, cap;
};

bool cm_keys_secret_valid(const char *s, size_t len, size_t min, size_t max)
{
    if (len < min || len > max)
        return false;
    for (size_t i = 0; i < len; i++)
        if ((unsigned char)s[i] <= 0x20 || (unsigned char)s[i] >= 0x7f)
            return false;
    return true;
}

bool cm_keys_equal_ct(const char *stored, size_t slen, const char *given, size_t glen)
{
    /* every byte of the stored secret is compared; the length last */
    unsigned char diff = 0;
    for (size_t j = 0; j < slen; j++)
        diff |= (unsigned char)(stored[j] ^ (j < glen ? given[j] : 0));
    diff |= (unsigned char)(slen != glen);
    return diff == 0;
}

ri_status_t cm_keys_each_line(const char *text, const char *name, cm_keys_line_fn_t fn, void *arg, char *err,
                              size_t errlen)
{
    ri_status_t st = RI_OK;
    unsigned lineno = 0;
    char *copy = cm_strdup(&cm_keys_tag, text);
    if (copy == NULL) {
        snprintf(err, errlen, "%s: out of memory", name);
        return RI_ERR_NOMEM;
    }
    for (char *line = copy, *next; line != NULL && st == RI_OK; line = next) {
        char *nl = strchr(line, '\n');
        next = nl ? nl + 1 : NULL;
        if (nl)
            *nl = '\0';
        lineno++;
        line[strcspn(line, "\r")] = '\0';
        char *p = line + strspn(line, " \t");
        if (*p == '\0' || *p == '#')
            continue;
        const char *why = "bad line";
        if ((st = fn(arg, p, &why)) != RI_OK)
            snprintf(err, errlen, "%s:%u: %s", name, lineno, why);
    }
    explicit_bzero(copy, strlen(text));
    cm_free(copy);
    return st;
}

/* Append the key of one line to keys (cm_keys_line_fn_t). */
static ri_status_t cm_keys_add(void *arg, char *line, const char **why_p)
{
    cm_keys_t *keys = arg;
    size_t len = strcspn(line, " \t");
    if (!cm_keys_secret_valid(line, len, CM_KEYS_KEY_MIN, CM_KEYS_KEY_MAX)) {
        *why_p = "a key must be 16..256 printable characters without spaces";
        return RI_ERR_FORMAT;
    }
    for (size_t i = 0; i < keys->n; i++)
        if (cm_keys_equal_ct(keys->keys[i].key, keys->keys[i].len, line, len)) {
            *why_p = "duplicate key (also on an earlier line)";
            return RI_ERR_FORMAT;
        }
    if (keys->n == keys->cap) {
        size_t ncap = keys->cap ? keys->cap * 2 : 8;
        cm_key_t *nk = cm_realloc(&cm_keys_tag, keys->keys, ncap * sizeof(*nk));
        if (nk == NULL) {
            *why_p = "out of memory";
            return RI_ERR_NOMEM;
        }
        keys->keys = nk;
        keys->cap = ncap;
    }
    cm_key_t *k = &keys->keys[keys->n++];
    memcpy(k->key, line, len);
    k->key[len] = '\0';
    k->len = len;
    return RI_OK;
}

ri_status_t cm_keys_parse(const char *text, const char *name, cm_keys_t **keys_p, char *err, size_t errlen)
{
    ri_status_t st;
    cm_keys_t *keys = cm_calloc(&cm_keys_tag, 1, sizeof(*keys));
    if (keys == NULL) {
        snprintf(err, errlen, "%s: out of memory", name);
        return RI_ERR_NOMEM;
    }
    if ((st = cm_keys_each_line(text, name, cm_keys_add, keys, err, errlen)) != RI_OK)
        goto err_free_keys;
    if (keys->n == 0) {
        st = RI_ERR_FORMAT;
        snprintf(err, errlen, "%s: no keys (one per line: KEY [NAME])", name);
        goto err_free_keys;
    }
    *keys_p = keys;
    return RI_OK;
err_free_keys:
    cm_keys_destroy(keys);
    return st;
}

ri_status_t cm_keys_read_file(const char *path, const char *what, char **text_p, char *err, size_t errlen)
{
    ri_status_t st;
    struct stat sb;
    char *text = NULL;
    size_t got = 0;
    FILE *f = fopen(path, "re");

    if (f == NULL) {
        snprintf(err, errlen, "%s %s: %s", what, path, strerror(errno));
        return cm_status_from_errno(errno);
    }
    if (fstat(fileno(f), &sb) != 0 || sb.st_size > CM_KEYS_FILE_MAX) {
        snprintf(err, errlen, "%s %s: too large or unreadable", what, path);
        st = RI_ERR_TOO_LARGE;
        goto err_close;
    }
    if (sb.st_mode & (S_IWOTH | S_IWGRP)) {
        snprintf(err, errlen, "%s %s is writable by %s (mode %04o); refused: chmod 600 it", what, path,
                 (sb.st_mode & S_IWOTH) ? "every user" : "its group", (unsigned)(sb.st_mode & 07777));
        st = RI_ERR_PERMISSION;
        goto err_close;
    }
    if (sb.st_mode & S_IROTH)
        cm_warn("%s %s is readable by every user; chmod 600 it", what, path);
    if ((text = cm_calloc(&cm_keys_tag, 1, (size_t)sb.st_size + 1)) == NULL) {
        snprintf(err, errlen, "%s %s: out of memory", what, path);
        st = RI_ERR_NOMEM;
        goto err_close;
    }
    got = fread(text, 1, (size_t)sb.st_size, f);
    if (ferror(f)) {
        snprintf(err, errlen, "%s %s: read failed", what, path);
        st = RI_ERR_IO;
        goto err_free_text;
    }
    if (memchr(text, '\0', got) != NULL) {
        snprintf(err, errlen, "%s %s: contains NUL bytes", what, path);
        st = RI_ERR_FORMAT;
        goto err_free_text;
    }
    fclose(f);
    *text_p = text;
    return RI_OK;
err_free_text:
    cm_keys_text_free(text);
err_close:
    fclose(f);
    return st;
}

void cm_keys_text_free(char *text)
{
    if (text == NULL)
        return;
    explicit_bzero(text, strlen(text));
    cm_free(text);
}

ri_status_t cm_keys_load(const char *path, cm_keys_t **keys_p, char *err, size_t errlen)
{
    char *text = NULL;
    ri_status_t st = cm_keys_read_file(path, "keys file", &text, err, errlen);
    if (st != RI_OK)
        return st;
    st = cm_keys_parse(text, path, keys_p, err, errlen);
    cm_keys_text_free(text);
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
    for (size_t i = 0; i < keys->n; i++)
        found |= cm_keys_equal_ct(keys->keys[i].key, keys->keys[i].len, key, len);
    return found != 0;
}

bool cm_keys_bearer_n(const char *value, size_t len, const char **key_p, size_t *len_p)
{
    if (value == NULL || len < 7 || strncasecmp(value, "Bearer ", 7) != 0)
        return false;
    size_t off = 7;
    while (off < len && value[off] == ' ')
        off++;
    size_t end = off;
    while (end < len && value[end] != ' ' && value[end] != '\t')
        end++;
    if (end == off)
        return false;
    for (size_t i = end; i < len; i++)
        if (value[i] != ' ' && value[i] != '\t')
            return false;
    *key_p = value + off;
    *len_p = end - off;
    return true;
}

bool cm_keys_bearer(const char *value, const char **key_p, size_t *len_p)
{
    return value != NULL && cm_keys_bearer_n(value, strlen(value), key_p, len_p);
}
