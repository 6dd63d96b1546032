/*
 * Accuracy metrics of approximate attention against exact attention, on the
 * same K/V and query (docs/architecture.md): relative L2 error and cosine of
 * the output, Recall@k of the true top-k tokens, softmax mass recovered by the
 * exactly attended set, |delta lse|; and summaries (median/p90/p99/max).
 * Scores and masses are per GQA group: the true group score of token t is
 * sum over the g query heads of softmax(scale*q.k_t), averaged to a mass.
 */
#ifndef KN_METRICS_H
#define KN_METRICS_H

#include "kernels/kn_ops.h"

/* ||o - ref|| / ||ref|| over n values (0 when both are zero). */
double kn_metric_rel_l2(const float *o, const float *ref, size_t n);

/* cos(o, ref) over n values (1 when both are zero). */
double kn_metric_cosine(const float *o, const float *ref, size_t n);

/* True group probabilities of one KV head: prob[t] = (1/g) sum_h
 * softmax_t(scale*q_h.k_t), rows k + t*stride, n tokens; q [g][d].
 * prob has n entries.  Errors: RI_ERR_NOMEM. */
ri_status_t kn_true_probs(const kn_shape_t *grp, const float *q, const cm_fp16_t *k,
                          size_t stride, size_t n, double *prob);

/* Fraction of the true top-k tokens (by prob) inside the selected set
 * (mask[t] != 0).  k is cut to n; 1 when k == 0. */
double kn_metric_recall(const double *prob, size_t n, const uint8_t *mask, size_t k);

/* Sum of prob over the selected set. */
double kn_metric_mass(const double *prob, size_t n, const uint8_t *mask);

/* Mark the B tokens of largest prob in mask (others 0): the oracle set. */
ri_status_t kn_oracle_mask(const double *prob, size_t n, size_t B, uint8_t *mask);

/* Distribution summary (nearest rank).  Errors are bad when high (read
 * p90/p99/max); recall and mass are bad when low (read p10/p1/min). */
typedef struct kn_summary {
    double median, p90, p99, max;
    double p10, p1, min;
    size_t n;
} kn_summary_t;

/* Summarise n values (NaN counts as +inf: a broken case must show). */
void kn_summarise(const double *v, size_t n, kn_summary_t *s);

#endif /* KN_METRICS_H */
