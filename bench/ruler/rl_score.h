/*
 * Scoring of the RULER-style suite: RULER's string-match rule (an expected
 * item counts when the generated text contains it, case-insensitively),
 * with word boundaries (the item must not be part of a longer word or
 * number: "1234567" is not found in "12345678"); a trial passes when every
 * expected item is found.  Also the 95% Wilson interval of a pass rate and
 * the greedy-token agreement of a method with full attention.
 */
#ifndef RL_SCORE_H
#define RL_SCORE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* True when item occurs in text, case-insensitively, not inside a longer
 * run of letters or digits. */
bool rl_score_contains(const char *text, const char *item);

/* How many of the n items occur in text. */
int rl_score_found(const char *text, const char (*items)[48], int n);

/* 95% Wilson score interval of k successes in n trials (n > 0). */
void rl_score_wilson(int k, int n, double *lo_p, double *hi_p);

/* Agreement of tokens b with the reference a (full attention's): the
 * number of leading positions where they are equal (*prefix_p) and of all
 * positions i < na with a[i] == b[i] (*same_p); both out of na. */
void rl_score_agree(const int32_t *a, size_t na, const int32_t *b, size_t nb, size_t *prefix_p, size_t *same_p);

#endif /* RL_SCORE_H */
