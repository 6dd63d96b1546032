/*
 * Fixed-bucket histograms and their Prometheus text (see cm_hist.h).
 */
#include "common/cm_hist.h"

#include <string.h>

void cm_hist_init(cm_hist_t *h, const double *le, size_t n_le)
{
    memset(h, 0, sizeof(*h));
    h->le = le;
    h->n_le = n_le < CM_HIST_MAX_LE ? n_le : CM_HIST_MAX_LE;
    for (size_t i = 0; i <= CM_HIST_MAX_LE; i++)
        atomic_init(&h->count[i], 0);
    atomic_init(&h->sum, 0.0);
}

void cm_hist_add(cm_hist_t *h, double v)
{
    size_t b = 0;
    while (b < h->n_le && v > h->le[b])
        b++;
    atomic_fetch_add_explicit(&h->count[b], 1, memory_order_relaxed);
    double old = atomic_load_explicit(&h->sum, memory_order_relaxed);
    while (!atomic_compare_exchange_weak_explicit(&h->sum, &old, old + v, memory_order_relaxed,
                                                  memory_order_relaxed))
        ;
}

uint64_t cm_hist_count(const cm_hist_t *h)
{
    uint64_t n = 0;
    for (size_t b = 0; b <= h->n_le; b++)
        n += atomic_load_explicit(&h->count[b], memory_order_relaxed);
    return n;
}

void cm_hist_copy(cm_hist_t *dst, const cm_hist_t *src)
{
    cm_hist_init(dst, src->le, src->n_le);
    for (size_t b = 0; b <= src->n_le; b++)
        atomic_store_explicit(&dst->count[b], atomic_load_explicit(&src->count[b], memory_order_relaxed),
                              memory_order_relaxed);
    atomic_store_explicit(&dst->sum, atomic_load_explicit(&src->sum, memory_order_relaxed), memory_order_relaxed);
}

void cm_hist_write_prom(const cm_hist_t *h, FILE *out, const char *name, const char *help, const char *labels)
{
    const char *lb = labels != NULL ? labels : "", *sep = labels != NULL && labels[0] != '\0' ? "," : "";
    uint64_t cum = 0;
    if (help != NULL)
        fprintf(out, "# HELP %s %s\n# TYPE %s histogram\n", name, help, name);
    for (size_t b = 0; b <= h->n_le; b++) {
        cum += atomic_load_explicit(&h->count[b], memory_order_relaxed);
        if (b < h->n_le)
            fprintf(out, "%s_bucket{%s%sle=\"%g\"} %llu\n", name, lb, sep, h->le[b], (unsigned long long)cum);
        else
            fprintf(out, "%s_bucket{%s%sle=\"+Inf\"} %llu\n", name, lb, sep, (unsigned long long)cum);
    }
    double sum = atomic_load_explicit(&h->sum, memory_order_relaxed);
    if (lb[0] != '\0')
        fprintf(out, "%s_sum{%s} %.9f\n%s_count{%s} %llu\n", name, lb, sum, name, lb, (unsigned long long)cum);
    else
        fprintf(out, "%s_sum %.9f\n%s_count %llu\n", name, sum, name, (unsigned long long)cum);
}
