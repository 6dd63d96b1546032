/*
 * Declarative configuration.  A program describes its settings once, as a
 * table of items (name, type, default, help, where in its config struct), and
 * this module fills the struct from, in order: defaults, an INI file
 * (--config FILE, parsed with libinih; section names are ignored), the
 * environment (PREFIX + NAME upper-cased, '-' as '_', e.g. RI_KVS_MEMORY) and
 * command-line flags (--name=value, --name value, --no-name for booleans).
 * Later sources win.  --dump-config prints the effective settings; --help
 * prints the table.  Bad values and unknown names are errors with a message
 * that names the setting and the source.  A text value that starts with
 * "~/" has the "~" replaced by $HOME (INI files and the environment get no
 * shell expansion).  This module is the one place of the libraries that
 * reads the environment: programs load their settings here and pass them
 * down (tools/check_getenv.sh keeps it so).
 */
#ifndef CM_CONFIG_H
#define CM_CONFIG_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "retroinfer/status.h"

typedef enum cm_config_type {
    CM_CFG_BOOL,    /* bool: true/false/yes/no/on/off/1/0 */
    CM_CFG_INT,     /* int64_t, optional [min, max] */
    CM_CFG_SIZE,    /* uint64_t bytes: 123, 4k, 8MiB, 2GB (K=KiB=1024, KB=1000) */
    CM_CFG_DOUBLE,  /* double, optional [min, max] */
    CM_CFG_STRING,  /* char *, owned by the struct; freed by cm_config_free */
} cm_config_type_t;

typedef struct cm_config_item {
    const char *name;       /* flag and file key: lower-case with '-' */
    cm_config_type_t type;  /* how to parse it */
    const char *defval;     /* default, as text (NULL for an empty string) */
    const char *help;       /* one line */
    size_t offset;          /* offsetof(struct, field) */
    double min, max;        /* bounds for INT/SIZE/DOUBLE; min == max means none */
    /* A second environment name read when PREFIX + NAME is unset (NULL:
     * none).  The process-wide settings of cm_runtime.h use it to keep their
     * historic unprefixed names (RI_THREADS, RI_LOG_LEVEL, ...). */
    const char *env_alias;
} cm_config_item_t;

typedef struct cm_config_table {
    const char *program;            /* for --help */
    const char *env_prefix;         /* e.g. "RI_KVS_" */
    const cm_config_item_t *items;  /* the settings */
    size_t n_items;
    /* Positional arguments the program takes after its flags: at most
     * max_args of them, shown in --help as args_usage (e.g. "[PROMPT]").
     * Zero (a table that leaves these out) means none: a stray word is an
     * error that names it rather than something silently ignored. */
    int max_args;
    const char *args_usage;
} cm_config_table_t;

/* What cm_config_load found besides settings. */
typedef struct cm_config_result {
    bool dump;        /* --dump-config was given */
    bool help;        /* --help was given */
    int first_arg;    /* index of the first positional argument (argc if none) */
} cm_config_result_t;

/* Set every item of obj to its default (obj may be uninitialised: string
 * fields are reset, not freed).  Errors only if a default is bad. */
ri_status_t cm_config_defaults(const cm_config_table_t *table, void *obj, char *err, size_t errlen);

/* Parse value into the named item.  source names where it came from (for
 * messages).  On error obj is unchanged and err holds the message. */
ri_status_t cm_config_set(const cm_config_table_t *table, void *obj, const char *name, const char *value,
                          const char *source, char *err, size_t errlen);

/* Load an INI file; unknown keys are errors. */
ri_status_t cm_config_load_file(const cm_config_table_t *table, void *obj, const char *path, char *err,
                                size_t errlen);

/* Apply PREFIX* environment variables that name known settings, and the
 * items' env_alias names where the prefixed one is unset. */
ri_status_t cm_config_load_env(const cm_config_table_t *table, void *obj, char *err, size_t errlen);

/* Defaults, then --config file, environment, flags.  Options stop at "--" or
 * the first non-option argument.  Errors (RI_ERR_INVALID, naming the word):
 * a flag after a positional argument, more positional arguments than the
 * table's max_args, and a boolean flag followed by a boolean word
 * ("--chat false": write --chat=false or --no-chat).  On failure nothing
 * is left allocated in obj (its strings are NULL); on success the caller
 * frees obj with cm_config_free. */
ri_status_t cm_config_load(const cm_config_table_t *table, void *obj, int argc, char **argv,
                           cm_config_result_t *result_p, char *err, size_t errlen);

/* Print "name = value" lines (with help as comments), parseable as INI. */
void cm_config_dump(const cm_config_table_t *table, const void *obj, FILE *out);

/* Print usage and each setting's help. */
void cm_config_usage(const cm_config_table_t *table, FILE *out);

/* Free the strings held by obj; the struct itself is the caller's. */
void cm_config_free(const cm_config_table_t *table, void *obj);

/* Parse a size with an optional unit ("8GiB") into bytes. */
ri_status_t cm_config_parse_size(const char *text, uint64_t *bytes_p);

#endif /* CM_CONFIG_H */
