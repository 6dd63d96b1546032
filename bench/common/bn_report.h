/*
 * Shared benchmark plumbing (docs/bench-format.md): the machine block (CPU model,
 * cores, memory read bandwidth measured in this run), the git commit, rows
 * collected as cJSON objects, a printed table and the JSON file.
 *
 *   bn_report_t *r = bn_report_create("kernels");
 *   cJSON *row = bn_report_row(r);          // borrowed; fill with cJSON_Add*
 *   bn_report_skip(r, "N=1M", "needs 40 GiB");
 *   bn_report_finish(r, json_path_or_NULL); // writes JSON, frees r
 */
#ifndef BN_REPORT_H
#define BN_REPORT_H

#include <cjson/cJSON.h>
#include <stddef.h>

typedef struct bn_report bn_report_t;

/* Start a report; measures memory bandwidth (about 0.5 s).  NULL on OOM. */
bn_report_t *bn_report_create(const char *bench);

/* Memory read bandwidth measured at create, GB/s (1e9 bytes/s). */
double bn_report_mem_bw_gbs(const bn_report_t *r);

/* A new row object appended to "rows"; borrowed, owned by the report. */
cJSON *bn_report_row(bn_report_t *r);

/* Record a case that could not run and why. */
void bn_report_skip(bn_report_t *r, const char *case_name, const char *why);

/* The top-level object, to add extra fields; borrowed. */
cJSON *bn_report_root(bn_report_t *r);

/* Write JSON to path (if not NULL), free the report.  Returns 0 or -1 (message printed). */
int bn_report_finish(bn_report_t *r, const char *json_path);

/* Measure single-pass streaming read bandwidth of `bytes` bytes with nthreads
 * threads (0 = all CPUs), best of `reps`; GB/s. */
double bn_measure_read_bw(size_t bytes, unsigned nthreads, int reps);


/* The 1-, 5- and 15-minute load averages (/proc/loadavg); zeros if unreadable.
 * The report records them at create ("machine.load_avg"), at finish
 * ("machine.load_avg_end") and in every row ("load_avg"). */
void bn_loadavg(double la[3]);

/* Share the CPU the way a busy server does: start n processes that spin until
 * bn_hog_stop (they die with the caller too).  Returns 0, or -1 (message
 * printed).  At most 64. */
int bn_hog_start(unsigned n);
void bn_hog_stop(void);

/* Median of n doubles (sorts a copy). */
double bn_median(const double *v, size_t n);

/* Percentile p in [0,100] of n doubles (nearest rank on a sorted copy). */
double bn_percentile(const double *v, size_t n, double p);

#endif /* BN_REPORT_H */
