/*
 * A bench's command line through a cm_config table (common/cm_config.h):
 * one declaration of each option gives its parsing, default, bounds and
 * --help line; --config FILE, RI_BENCH_<BENCH>_<NAME> variables and
 * --dump-config come with it.
 *
 *   static const cm_config_item_t items[] = {
 *       BN_ARG_JSON(opts_t, json),
 *       BN_ARG(opts_t, "iters", CM_CFG_INT, "200", "fetches per case", iters, 1, 1 << 30), ...};
 *   static const cm_config_table_t table = {"ri-bench-x", "RI_BENCH_X_", items, CM_ARRAY_LEN(items), 0, NULL};
 *   int main(int argc, char **argv) { opts_t o; return bn_args_main(&table, &o, argc, argv, x_main); }
 */
#ifndef BN_ARGS_H
#define BN_ARGS_H

#include <stddef.h>

#include "common/cm_config.h"
#include "common/cm_status.h" /* CM_ARRAY_LEN for the tables */

/* One option of a table over struct t: flag name n, cm_config type ty,
 * default d (text), help h, field f, bounds lo..hi (lo == hi: none). */
#define BN_ARG(t, n, ty, d, h, f, lo, hi) {n, ty, d, h, offsetof(t, f), lo, hi, NULL}

/* The --json PATH option every bench has (a char * field of type t). */
#define BN_ARG_JSON(t, field) BN_ARG(t, "json", CM_CFG_STRING, NULL, "write the report as JSON to this file", field, 0, 0)

/* Fill obj from table and argv.  Returns -1 when the bench should run (the
 * caller frees obj's strings with cm_config_free), else the status main
 * should exit with: 0 after --help or --dump-config (printed on stdout), 2
 * after a bad option (cm_config's message on stderr; nothing
 * left allocated).  first_arg_p (may be NULL) gets the index of the first
 * positional argument, for tables that take some. */
int bn_args_load(const cm_config_table_t *table, void *obj, int argc, char **argv, int *first_arg_p);

/* A bench's body: opts is the filled table struct, argv0 the program path
 * (to find the daemons next to it).  Returns the exit status. */
typedef int (*bn_args_main_fn_t)(const void *opts, const char *argv0);

/* The whole main of a bench with a table: bn_args_load, then run (unless
 * --help, --dump-config or a bad option ended it), then cm_config_free.
 * obj is the caller's storage for the table struct. */
int bn_args_main(const cm_config_table_t *table, void *obj, int argc, char **argv, bn_args_main_fn_t run);

/* Take every "--NAME VALUE" / "--NAME=VALUE" of a repeatable option out of
 * argv (cm_config keeps one value per setting) before bn_args_load: up to
 * max values into out (borrowed from argv), in order; argc and argv are
 * compacted.  Returns how many, or -1 when there are more than max or the
 * last --NAME lacks its value (nothing is taken then).  List the option in
 * the table too (a string) so that --help shows it. */
int bn_args_take_all(int *argc, char **argv, const char *name, const char **out, size_t max);

/* Parse a comma list of numbers ("1024,2048", "0.1,0.5") into out [max].
 * Returns how many, or 0 when text is empty, has a word that is not a
 * number, or has more than max of them. */
size_t bn_args_list(const char *text, double *out, size_t max);

/* Parse a comma list of counts >= 1, each with an optional K (x1024) or M
 * (x1024^2) suffix, either case ("4K,8192,1M"), into out [max].  Returns
 * how many, or 0 when text is empty, has a word that is not such a count,
 * or has more than max of them. */
size_t bn_args_counts(const char *text, size_t *out, size_t max);

#endif /* BN_ARGS_H */
