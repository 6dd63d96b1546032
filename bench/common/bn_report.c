/* Benchmark report: machine facts, rows, JSON (cJSON). */
#define _GNU_SOURCE
#include "bench/common/bn_report.h"

#include <pthread.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "common/cm_thread.h"
#include "common/cm_time.h"
#include "ri_git.h" /* RI_GIT_COMMIT, generated at build time */

struct bn_report {
    cJSON *root;     /* the whole object */
    cJSON *rows;     /* borrowed from root */
    cJSON *skipped;  /* borrowed from root */
    double mem_bw;   /* GB/s */
};

typedef struct bn_bw_arg {
    const uint64_t *buf;
    size_t words;
    uint64_t sink;
} bn_bw_arg_t;

static void *bn_bw_thread(void *p)
{
    bn_bw_arg_t *a = p;
    uint64_t s0 = 0, s1 = 0, s2 = 0, s3 = 0;
    for (size_t i = 0; i + 4 <= a->words; i += 4) {
        s0 += a->buf[i];
        s1 += a->buf[i + 1];
        s2 += a->buf[i + 2];
        s3 += a->buf[i + 3];
    }
    a->sink = s0 ^ s1 ^ s2 ^ s3;
    return NULL;
}

double bn_measure_read_bw(size_t bytes, unsigned nthreads, int reps)
{
    if (nthreads == 0)
        nthreads = cm_cpu_count();
    size_t words = bytes / 8;
    uint64_t *buf = malloc(words * 8);
    pthread_t th[256];
    bn_bw_arg_t args[256];
    double best = 0;
    if (buf == NULL || nthreads > 256)
        return 0;
    for (size_t i = 0; i < words; i++)
        buf[i] = i * 2654435761u;
    for (int r = 0; r < reps; r++) {
        size_t per = words / nthreads;
        double t0 = cm_time_s();
        for (unsigned t = 0; t < nthreads; t++) {
            args[t].buf = buf + per * t;
            args[t].words = per;
            pthread_create(&th[t], NULL, bn_bw_thread, &args[t]);
        }
        for (unsigned t = 0; t < nthreads; t++)
            pthread_join(th[t], NULL);
        double dt = cm_time_s() - t0;
        double gbs = (double)(per * nthreads * 8) / dt / 1e9;
        if (gbs > best)
            best = gbs;
    }
    free(buf);
    return best;
}

static void bn_cpu_model(char *out, size_t len)
{
    FILE *f = fopen("/proc/cpuinfo", "r");
    char line[512];
    snprintf(out, len, "unknown");
    if (f == NULL)
        return;
    while (fgets(line, sizeof(line), f)) {
        if (strncmp(line, "model name", 10) == 0) {
            char *c = strchr(line, ':');
            if (c) {
                c += 2;
                c[strcspn(c, "\n")] = '\0';
                snprintf(out, len, "%s", c);
            }
            break;
        }
    }
    fclose(f);
}

/* The commit this benchmark was built from (cmake/RiGitHead.cmake writes it
 * at every build); a build outside a repository asks git at run time, in
 * $RI_SOURCE_DIR or else the tree this binary was built from, and says
 * "unknown" only when neither knows. */
static void bn_git_sha(char *out, size_t len)
{
    if (RI_GIT_COMMIT[0] != '\0') {
        snprintf(out, len, "%s", RI_GIT_COMMIT);
        return;
    }
    snprintf(out, len, "unknown");
    const char *src = getenv("RI_SOURCE_DIR");
    char cmd[1024];
    snprintf(cmd, sizeof(cmd), "git -C '%s' rev-parse HEAD 2>/dev/null", src ? src : BN_SOURCE_DIR);
    FILE *p = popen(cmd, "r");
    if (p == NULL)
        return;
    if (fgets(out, (int)len, p) != NULL)
        out[strcspn(out, "\n")] = '\0';
    else
        snprintf(out, len, "unknown");
    pclose(p);
}

void bn_loadavg(double la[3])
{
    la[0] = la[1] = la[2] = 0;
    FILE *f = fopen("/proc/loadavg", "r");
    if (f == NULL)
        return;
    if (fscanf(f, "%lf %lf %lf", &la[0], &la[1], &la[2]) != 3)
        la[0] = la[1] = la[2] = 0;
    fclose(f);
}

static pid_t bn_hogs[64];
static unsigned bn_n_hogs;

int bn_hog_start(unsigned n)
{
    if (n > 64 || bn_n_hogs != 0) {
        fprintf(stderr, "bench: at most 64 CPU hogs, started once\n");
        return -1;
    }
    for (unsigned i = 0; i < n; i++) {
        pid_t p = fork();
        if (p < 0) {
            perror("bench: fork of a CPU hog");
            bn_hog_stop();
            return -1;
        }
        if (p == 0) {
            /* Dies with the benchmark, whatever way it ends. */
            prctl(PR_SET_PDEATHSIG, SIGKILL);
            volatile uint64_t x = 0;
            for (;;)
                x = x * 6364136223846793005ull + 1;
        }
        bn_hogs[bn_n_hogs++] = p;
    }
    return 0;
}

void bn_hog_stop(void)
{
    for (unsigned i = 0; i < bn_n_hogs; i++) {
        kill(bn_hogs[i], SIGKILL);
        waitpid(bn_hogs[i], NULL, 0);
    }
    bn_n_hogs = 0;
}

bn_report_t *bn_report_create(const char *bench)
{
    bn_report_t *r = calloc(1, sizeof(*r));
    char buf[256];
    if (r == NULL)
        return NULL;
    r->root = cJSON_CreateObject();
    cJSON_AddStringToObject(r->root, "bench", bench);
    bn_git_sha(buf, sizeof(buf));
    cJSON_AddStringToObject(r->root, "git", buf);
    cJSON *m = cJSON_AddObjectToObject(r->root, "machine");
    bn_cpu_model(buf, sizeof(buf));
    cJSON_AddStringToObject(m, "cpu", buf);
    cJSON_AddNumberToObject(m, "cores", cm_cpu_count());
    double la[3];
    bn_loadavg(la);
    cJSON_AddNumberToObject(m, "load_avg", la[0]);
    r->mem_bw = bn_measure_read_bw((size_t)512 << 20, 0, 3);
    cJSON_AddNumberToObject(m, "mem_bw_gbs", r->mem_bw);
    printf("machine: %s, %u cores, memory read %.1f GB/s, load average %.2f %.2f %.2f\n", buf, cm_cpu_count(),
           r->mem_bw, la[0], la[1], la[2]);
    r->rows = cJSON_AddArrayToObject(r->root, "rows");
    r->skipped = cJSON_AddArrayToObject(r->root, "skipped");
    return r;
}

double bn_report_mem_bw_gbs(const bn_report_t *r)
{
    return r->mem_bw;
}

cJSON *bn_report_row(bn_report_t *r)
{
    cJSON *row = cJSON_CreateObject();
    double la[3];
    bn_loadavg(la);
    cJSON_AddItemToArray(r->rows, row);
    cJSON_AddNumberToObject(row, "load_avg", la[0]);
    return row;
}

void bn_report_skip(bn_report_t *r, const char *case_name, const char *why)
{
    cJSON *s = cJSON_CreateObject();
    cJSON_AddStringToObject(s, "case", case_name);
    cJSON_AddStringToObject(s, "why", why);
    cJSON_AddItemToArray(r->skipped, s);
    printf("skipped: %s (%s)\n", case_name, why);
}

cJSON *bn_report_root(bn_report_t *r)
{
    return r->root;
}

int bn_report_finish(bn_report_t *r, const char *json_path)
{
    int rc = 0;
    double la[3];
    bn_loadavg(la);
    cJSON_AddNumberToObject(cJSON_GetObjectItem(r->root, "machine"), "load_avg_end", la[0]);
    printf("load average at the end: %.2f %.2f %.2f\n", la[0], la[1], la[2]);
    if (json_path != NULL) {
        char *text = cJSON_Print(r->root);
        FILE *f = fopen(json_path, "w");
        if (f == NULL || text == NULL || fputs(text, f) < 0) {
            fprintf(stderr, "cannot write %s\n", json_path);
            rc = -1;
        } else {
            printf("wrote %s\n", json_path);
        }
        if (f)
            fclose(f);
        free(text);
    }
    cJSON_Delete(r->root);
    free(r);
    return rc;
}

static int bn_cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

double bn_percentile(const double *v, size_t n, double p)
{
    if (n == 0)
        return 0;
    double *c = malloc(n * sizeof(double));
    if (c == NULL)
        return 0;
    memcpy(c, v, n * sizeof(double));
    qsort(c, n, sizeof(double), bn_cmp_double);
    size_t idx = (size_t)(p / 100.0 * (double)(n - 1) + 0.5);
    if (idx >= n)
        idx = n - 1;
    double out = c[idx];
    free(c);
    return out;
}

double bn_median(const double *v, size_t n)
{
    return bn_percentile(v, n, 50);
}
