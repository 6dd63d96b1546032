/* Declarative configuration: defaults, INI file (libinih), environment, flags. */
#include "common/cm_config.h"

#include <ctype.h>
#include <errno.h>
#include <ini.h>
#include <inttypes.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "common/cm_alloc.h"

static CM_ALLOC_TAG(cm_config_tag, "cm.config");

static const cm_config_item_t *cm_config_find(const cm_config_table_t *table, const char *name)
{
    for (size_t i = 0; i < table->n_items; i++) {
        const char *a = table->items[i].name;
        const char *b = name;
        /* '-' and '_' are the same in names, so file keys may use either. */
        while (*a && *b && (*a == *b || ((*a == '-' || *a == '_') && (*b == '-' || *b == '_')))) {
            a++;
            b++;
        }
        if (*a == '\0' && *b == '\0')
            return &table->items[i];
    }
    return NULL;
}

static ri_status_t cm_config_parse_bool(const char *s, bool *v)
{
    static const char *const yes[] = {"1", "true", "yes", "on"};
    static const char *const no[] = {"0", "false", "no", "off"};
    for (size_t i = 0; i < 4; i++) {
        if (strcasecmp(s, yes[i]) == 0) {
            *v = true;
            return RI_OK;
        }
        if (strcasecmp(s, no[i]) == 0) {
            *v = false;
            return RI_OK;
        }
    }
    return RI_ERR_INVALID;
}

ri_status_t cm_config_parse_size(const char *text, uint64_t *bytes_p)
{
    static const struct {
        const char *unit;
        uint64_t mult;
    } units[] = {
        {"", 1},           {"b", 1},
        {"k", 1ull << 10}, {"kib", 1ull << 10}, {"kb", 1000ull},
        {"m", 1ull << 20}, {"mib", 1ull << 20}, {"mb", 1000000ull},
        {"g", 1ull << 30}, {"gib", 1ull << 30}, {"gb", 1000000000ull},
        {"t", 1ull << 40}, {"tib", 1ull << 40}, {"tb", 1000000000000ull},
    };
    char *end;
    if (text == NULL || !isdigit((unsigned char)text[0]))
        return RI_ERR_INVALID;
    errno = 0;
    double v = strtod(text, &end);
    if (errno != 0 || v < 0)
        return RI_ERR_INVALID;
    while (*end == ' ')
        end++;
    for (size_t i = 0; i < sizeof(units) / sizeof(units[0]); i++) {
        if (strcasecmp(end, units[i].unit) == 0) {
            double bytes = v * (double)units[i].mult;
            if (bytes >= 18446744073709551615.0 || bytes != floor(bytes))
                return RI_ERR_INVALID;
            *bytes_p = (uint64_t)bytes;
            return RI_OK;
        }
    }
    return RI_ERR_INVALID;
}

static bool cm_config_out_of_bounds(const cm_config_item_t *it, double v)
{
    return it->min != it->max && (v < it->min || v > it->max);
}

/* A copy of value, "~/..." with $HOME (or "/" without one) put in for the
 * "~".  Caller frees; NULL when out of memory. */
static char *cm_config_expand_home(const char *value)
{
    if (value[0] != '~' || value[1] != '/')
        return cm_strdup(&cm_config_tag, value);
    const char *home = getenv("HOME");
    if (home == NULL || home[0] == '\0')
        home = "";
    size_t len = strlen(home) + strlen(value);   /* '~' dropped, NUL added */
    char *copy = cm_malloc(&cm_config_tag, len);
    if (copy != NULL)
        snprintf(copy, len, "%s%s", home, value + 1);
    return copy;
}

ri_status_t cm_config_set(const cm_config_table_t *table, void *obj, const char *name, const char *value,
                          const char *source, char *err, size_t errlen)
{
    const cm_config_item_t *it = cm_config_find(table, name);
    char *field;
    char *end;

    if (it == NULL) {
        snprintf(err, errlen, "%s: unknown setting '%s'", source, name);
        return RI_ERR_INVALID;
    }
    if (value == NULL)
        value = "";
    field = (char *)obj + it->offset;
    switch (it->type) {
    case CM_CFG_BOOL: {
        bool b;
        if (cm_config_parse_bool(value, &b) != RI_OK)
            goto err_bad;
        *(bool *)field = b;
        return RI_OK;
    }
    case CM_CFG_INT: {
        errno = 0;
        long long v = strtoll(value, &end, 0);
        if (errno != 0 || end == value || *end != '\0')
            goto err_bad;
        if (cm_config_out_of_bounds(it, (double)v))
            goto err_range;
        *(int64_t *)field = v;
        return RI_OK;
    }
    case CM_CFG_SIZE: {
        uint64_t v;
        if (cm_config_parse_size(value, &v) != RI_OK)
            goto err_bad;
        if (cm_config_out_of_bounds(it, (double)v))
            goto err_range;
        *(uint64_t *)field = v;
        return RI_OK;
    }
    case CM_CFG_DOUBLE: {
        errno = 0;
        double v = strtod(value, &end);
        if (errno != 0 || end == value || *end != '\0' || !isfinite(v))
            goto err_bad;
        if (cm_config_out_of_bounds(it, v))
            goto err_range;
        *(double *)field = v;
        return RI_OK;
    }
    case CM_CFG_STRING: {
        char *copy = cm_config_expand_home(value);
        if (copy == NULL) {
            snprintf(err, errlen, "%s: out of memory for '%s'", source, it->name);
            return RI_ERR_NOMEM;
        }
        cm_free(*(char **)field);
        *(char **)field = copy;
        return RI_OK;
    }
    }
err_bad:
    snprintf(err, errlen, "%s: setting '%s': bad value '%s'", source, it->name, value);
    return RI_ERR_INVALID;
err_range:
    snprintf(err, errlen, "%s: setting '%s': value '%s' outside [%g, %g]", source, it->name, value, it->min,
             it->max);
    return RI_ERR_RANGE;
}

ri_status_t cm_config_defaults(const cm_config_table_t *table, void *obj, char *err, size_t errlen)
{
    /* The struct may hold garbage: clear string fields before cm_config_set
     * frees the old value. */
    for (size_t i = 0; i < table->n_items; i++) {
        if (table->items[i].type == CM_CFG_STRING)
            *(char **)((char *)obj + table->items[i].offset) = NULL;
    }
    for (size_t i = 0; i < table->n_items; i++) {
        const cm_config_item_t *it = &table->items[i];
        if (it->type == CM_CFG_STRING && it->defval == NULL) {
            *(char **)((char *)obj + it->offset) = NULL;
            continue;
        }
        ri_status_t st = cm_config_set(table, obj, it->name, it->defval ? it->defval : "", "default", err, errlen);
        if (st != RI_OK)
            return st;
    }
    return RI_OK;
}

typedef struct cm_config_ini_ctx {
    const cm_config_table_t *table;
    void *obj;
    const char *path;
    char *err;
    size_t errlen;
    ri_status_t st;
} cm_config_ini_ctx_t;

static int cm_config_ini_handler(void *user, const char *section, const char *name, const char *value)
{
    cm_config_ini_ctx_t *ctx = user;
    (void)section;
    if (ctx->st != RI_OK)
        return 0;
    ctx->st = cm_config_set(ctx->table, ctx->obj, name, value, ctx->path, ctx->err, ctx->errlen);
    return ctx->st == RI_OK;
}

ri_status_t cm_config_load_file(const cm_config_table_t *table, void *obj, const char *path, char *err,
                                size_t errlen)
{
    cm_config_ini_ctx_t ctx = {table, obj, path, err, errlen, RI_OK};
    int rc = ini_parse(path, cm_config_ini_handler, &ctx);
    if (rc == -1) {
        snprintf(err, errlen, "cannot open config file '%s': %s", path, strerror(errno));
        return RI_ERR_NOT_FOUND;
    }
    if (ctx.st != RI_OK)
        return ctx.st;
    if (rc != 0) {
        snprintf(err, errlen, "%s:%d: syntax error", path, rc);
        return RI_ERR_INVALID;
    }
    return RI_OK;
}

ri_status_t cm_config_load_env(const cm_config_table_t *table, void *obj, char *err, size_t errlen)
{
    char var[256];
    for (size_t i = 0; i < table->n_items; i++) {
        const char *name = table->items[i].name;
        size_t n = (size_t)snprintf(var, sizeof(var), "%s", table->env_prefix ? table->env_prefix : "");
        for (const char *c = name; *c && n + 1 < sizeof(var); c++)
            var[n++] = *c == '-' ? '_' : (char)toupper((unsigned char)*c);
        var[n] = '\0';
        const char *v = getenv(var);
        if (v == NULL && table->items[i].env_alias != NULL) {
            v = getenv(table->items[i].env_alias);
            if (v != NULL)
                snprintf(var, sizeof(var), "%s", table->items[i].env_alias);   /* for the message */
        }
        if (v == NULL)
            continue;
        ri_status_t st = cm_config_set(table, obj, name, v, var, err, errlen);
        if (st != RI_OK)
            return st;
    }
    return RI_OK;
}

/* Split "--name=value" / "--name value" / "--no-name" at argv[*i]. */
static ri_status_t cm_config_flag(const cm_config_table_t *table, void *obj, int argc, char **argv, int *i,
                                  char *err, size_t errlen)
{
    char name[128];
    const char *arg = argv[*i] + 2;
    const char *eq = strchr(arg, '=');
    size_t len = eq ? (size_t)(eq - arg) : strlen(arg);
    const char *value;

    if (len >= sizeof(name)) {
        snprintf(err, errlen, "flag '%s' is too long", argv[*i]);
        return RI_ERR_INVALID;
    }
    memcpy(name, arg, len);
    name[len] = '\0';
    const cm_config_item_t *it = cm_config_find(table, name);
    if (it == NULL && strncmp(name, "no-", 3) == 0 && eq == NULL) {
        it = cm_config_find(table, name + 3);
        if (it != NULL && it->type == CM_CFG_BOOL)
            return cm_config_set(table, obj, it->name, "false", "command line", err, errlen);
        it = NULL;
    }
    if (it == NULL) {
        snprintf(err, errlen, "unknown flag '--%s' (see --help)", name);
        return RI_ERR_INVALID;
    }
    if (eq != NULL) {
        value = eq + 1;
    } else if (it->type == CM_CFG_BOOL) {
        /* "--chat false" reads as chat on plus a stray word "false": the
         * writer meant the opposite, so refuse it instead of guessing. */
        bool b;
        if (*i + 1 < argc && cm_config_parse_bool(argv[*i + 1], &b) == RI_OK) {
            snprintf(err, errlen, "boolean flag '--%s' followed by '%s': write --%s=%s or --%s%s", name, argv[*i + 1],
                     name, argv[*i + 1], b ? "" : "no-", name);
            return RI_ERR_INVALID;
        }
        value = "true";
    } else if (*i + 1 < argc) {
        value = argv[++*i];
    } else {
        snprintf(err, errlen, "flag '--%s' needs a value", name);
        return RI_ERR_INVALID;
    }
    return cm_config_set(table, obj, it->name, value, "command line", err, errlen);
}

/* True when flag is "--name" (no '=') of a non-boolean setting, so the next
 * argument is its value. */
static bool cm_config_takes_next(const cm_config_table_t *table, const char *flag)
{
    if (strchr(flag, '=') != NULL)
        return false;
    const cm_config_item_t *it = cm_config_find(table, flag + 2);
    return it != NULL && it->type != CM_CFG_BOOL;
}

static ri_status_t cm_config_load_all(const cm_config_table_t *table, void *obj, int argc, char **argv,
                                      cm_config_result_t *result_p, char *err, size_t errlen)
{
    cm_config_result_t res = {.first_arg = argc};
    const char *config_path = NULL;
    ri_status_t st;
    int i;

    st = cm_config_defaults(table, obj, err, errlen);
    if (st != RI_OK)
        return st;
    /* First pass: the config file and the meta flags. */
    for (i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--") == 0 || argv[i][0] != '-' || argv[i][1] != '-')
            break;
        if (strcmp(argv[i], "--config") == 0 && i + 1 < argc)
            config_path = argv[++i];
        else if (strncmp(argv[i], "--config=", 9) == 0)
            config_path = argv[i] + 9;
        else if (strcmp(argv[i], "--dump-config") == 0)
            res.dump = true;
        else if (strcmp(argv[i], "--help") == 0)
            res.help = true;
        else if (cm_config_takes_next(table, argv[i]))
            i++;
    }
    if (config_path != NULL) {
        st = cm_config_load_file(table, obj, config_path, err, errlen);
        if (st != RI_OK)
            return st;
    }
    st = cm_config_load_env(table, obj, err, errlen);
    if (st != RI_OK)
        return st;
    for (i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--") == 0) {
            i++;
            break;
        }
        if (argv[i][0] != '-' || argv[i][1] != '-')
            break;
        if (strcmp(argv[i], "--config") == 0) {
            i++;
            continue;
        }
        if (strncmp(argv[i], "--config=", 9) == 0 || strcmp(argv[i], "--dump-config") == 0 ||
            strcmp(argv[i], "--help") == 0)
            continue;
        st = cm_config_flag(table, obj, argc, argv, &i, err, errlen);
        if (st != RI_OK)
            return st;
    }
    /* Positional arguments come last: a flag after one means the command line
     * is not what its writer thinks (e.g. "--chat false --max-tokens 8", where
     * "false" is not the value of the boolean --chat and --max-tokens would
     * be dropped).  Name the argument instead of guessing. */
    if (i < argc && (i == 0 || strcmp(argv[i - 1], "--") != 0)) {
        for (int j = i + 1; j < argc; j++) {
            if (strcmp(argv[j], "--") == 0)
                break;
            if (argv[j][0] == '-' && argv[j][1] == '-') {
                snprintf(err, errlen,
                         "unexpected argument '%s' before the flag '%s' (arguments go after all flags; "
                         "a boolean flag takes its value as --name=true|false)",
                         argv[i], argv[j]);
                return RI_ERR_INVALID;
            }
        }
    }
    if (argc - i > table->max_args) {
        if (table->max_args == 0)
            snprintf(err, errlen, "unexpected argument '%s' (%s takes no arguments, only --flags)", argv[i],
                     table->program);
        else
            snprintf(err, errlen, "unexpected argument '%s' (%s takes at most %d: %s)", argv[i + table->max_args],
                     table->program, table->max_args, table->args_usage ? table->args_usage : "");
        return RI_ERR_INVALID;
    }
    res.first_arg = i;
    if (result_p != NULL)
        *result_p = res;
    return RI_OK;
}

ri_status_t cm_config_load(const cm_config_table_t *table, void *obj, int argc, char **argv,
                           cm_config_result_t *result_p, char *err, size_t errlen)
{
    /* Every string field is NULL before the defaults run, so that a failure
     * at any step can free exactly what was set. */
    for (size_t i = 0; i < table->n_items; i++)
        if (table->items[i].type == CM_CFG_STRING)
            *(char **)((char *)obj + table->items[i].offset) = NULL;
    ri_status_t st = cm_config_load_all(table, obj, argc, argv, result_p, err, errlen);
    if (st != RI_OK)
        cm_config_free(table, obj);
    return st;
}

static void cm_config_print_value(const cm_config_item_t *it, const void *obj, FILE *out)
{
    const char *field = (const char *)obj + it->offset;
    switch (it->type) {
    case CM_CFG_BOOL: fprintf(out, "%s", *(const bool *)field ? "true" : "false"); break;
    case CM_CFG_INT: fprintf(out, "%" PRId64, *(const int64_t *)field); break;
    case CM_CFG_SIZE: fprintf(out, "%" PRIu64, *(const uint64_t *)field); break;
    case CM_CFG_DOUBLE: fprintf(out, "%.17g", *(const double *)field); break;
    case CM_CFG_STRING: {
        const char *s = *(char *const *)field;
        fprintf(out, "%s", s ? s : "");
        break;
    }
    }
}

void cm_config_dump(const cm_config_table_t *table, const void *obj, FILE *out)
{
    fprintf(out, "# effective settings of %s\n", table->program);
    for (size_t i = 0; i < table->n_items; i++) {
        const cm_config_item_t *it = &table->items[i];
        fprintf(out, "# %s\n%s = ", it->help, it->name);
        cm_config_print_value(it, obj, out);
        fputc('\n', out);
    }
}

void cm_config_usage(const cm_config_table_t *table, FILE *out)
{
    static const char *const types[] = {"bool", "int", "size", "number", "text"};
    fprintf(out, "usage: %s [--config FILE] [--dump-config] [--help] [--SETTING=VALUE ...]%s%s\n\nsettings "
                 "(environment: %sNAME; a boolean is --NAME, --no-NAME or --NAME=true|false):\n",
            table->program, table->max_args > 0 ? " " : "", table->max_args > 0 && table->args_usage ? table->args_usage : "",
            table->env_prefix ? table->env_prefix : "");
    for (size_t i = 0; i < table->n_items; i++) {
        const cm_config_item_t *it = &table->items[i];
        fprintf(out, "  --%-24s %-6s %s (default: %s)\n", it->name, types[it->type], it->help,
                it->defval ? it->defval : "");
    }
}

void cm_config_free(const cm_config_table_t *table, void *obj)
{
    for (size_t i = 0; i < table->n_items; i++) {
        if (table->items[i].type == CM_CFG_STRING) {
            char **field = (char **)((char *)obj + table->items[i].offset);
            cm_free(*field);
            *field = NULL;
        }
    }
}
