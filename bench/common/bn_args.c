/*
 * Bench command lines through cm_config tables (see bn_args.h).
 */
#include "bench/common/bn_args.h"

#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int bn_args_load(const cm_config_table_t *table, void *obj, int argc, char **argv, int *first_arg_p)
{
    cm_config_result_t res;
    char err[512] = "";
    if (cm_config_load(table, obj, argc, argv, &res, err, sizeof(err)) != RI_OK) {
        fprintf(stderr, "%s: %s\n", table->program, err);
        return 2;
    }
    if (res.help || res.dump) {
        if (res.help)
            cm_config_usage(table, stdout);
        else
            cm_config_dump(table, obj, stdout);
        cm_config_free(table, obj);
        return 0;
    }
    if (first_arg_p != NULL)
        *first_arg_p = res.first_arg;
    return -1;
}

int bn_args_main(const cm_config_table_t *table, void *obj, int argc, char **argv, bn_args_main_fn_t run)
{
    int rc = bn_args_load(table, obj, argc, argv, NULL);
    if (rc >= 0)
        return rc;
    rc = run(obj, argv[0]);
    cm_config_free(table, obj);
    return rc;
}

size_t bn_args_list(const char *text, double *out, size_t max)
{
    size_t n = 0;
    const char *p = text;
    while (p != NULL && *p != '\0') {
        char *end;
        double v = strtod(p, &end);
        if (end == p || (*end != ',' && *end != '\0') || n == max)
            return 0;
        out[n++] = v;
        p = *end == ',' ? end + 1 : end;
    }
    return n;
}

size_t bn_args_counts(const char *text, size_t *out, size_t max)
{
    size_t n = 0;
    const char *p = text;
    while (p != NULL && *p != '\0') {
        char *end;
        if (*p < '0' || *p > '9') /* strtoull would take a sign or blanks */
            return 0;
        errno = 0;
        unsigned long long v = strtoull(p, &end, 10);
        unsigned long long scale = *end == 'K' || *end == 'k'   ? 1ull << 10
                                   : *end == 'M' || *end == 'm' ? 1ull << 20
                                                                : 1;
        end += scale > 1;
        if (errno != 0 || v == 0 || v > SIZE_MAX / scale || (*end != ',' && *end != '\0') || n == max)
            return 0;
        out[n++] = (size_t)(v * scale);
        p = *end == ',' ? end + 1 : end;
    }
    return n;
}

int bn_args_take_all(int *argc, char **argv, const char *name, const char **out, size_t max)
{
    size_t nl = strlen(name), n = 0;
    /* first pass: count and check, so that a failure takes nothing */
    for (int i = 1; i < *argc; i++) {
        const char *a = argv[i];
        if (strcmp(a, "--") == 0)
            break;
        if (strncmp(a, "--", 2) != 0 || strncmp(a + 2, name, nl) != 0)
            continue;
        if (a[2 + nl] == '=') {
            n++;
        } else if (a[2 + nl] == '\0') {
            if (i + 1 >= *argc)
                return -1;
            n++, i++;
        }
    }
    if (n > max)
        return -1;
    n = 0;
    int w = 1, i = 1;
    for (; i < *argc; i++) {
        const char *a = argv[i];
        if (strcmp(a, "--") == 0)
            break;
        if (strncmp(a, "--", 2) == 0 && strncmp(a + 2, name, nl) == 0 && a[2 + nl] == '=') {
            out[n++] = a + 3 + nl;
            continue;
        }
        if (strncmp(a, "--", 2) == 0 && strncmp(a + 2, name, nl) == 0 && a[2 + nl] == '\0') {
            out[n++] = argv[++i];
            continue;
        }
        argv[w++] = argv[i];
    }
    for (; i < *argc; i++)
        argv[w++] = argv[i];
    *argc = w;
    argv[w] = NULL;
    return (int)n;
}
