/*
 * The six tasks of the RULER-style suite, after RULER (Hsieh et al., 2024):
 *
 *   niah_single      one "special magic number" needle for a word key in
 *                    prose; the question asks for it
 *   niah_multikey    four needles with distinct keys (three distractors);
 *                    the question asks for one
 *   niah_multivalue  four needles with one key; all four values are wanted
 *   vt               variable tracking: VAR A = 12345, VAR B = VAR A, ...
 *                    (one chain of five) in prose; name all five
 *   cwe              common words: a numbered list where ten words appear
 *                    much more often than the others; name the ten
 *   qa               a question over a prose document in which the answer
 *                    is stated once, next to facts of the same kind about
 *                    other towns (distractors)
 *
 * A sample is a pure function of (task, seed, n_units, depth): n_units is
 * the haystack size in sentences (list entries for cwe), which the caller
 * searches to fit a token count; the needles, keys and answers depend on
 * the seed alone, so a sample keeps its answers while it is resized.
 */
#ifndef RL_TASK_H
#define RL_TASK_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "bench/ruler/rl_text.h"
#include "retroinfer/status.h"

typedef enum rl_task {
    RL_NIAH_SINGLE = 0,
    RL_NIAH_MULTIKEY,
    RL_NIAH_MULTIVALUE,
    RL_VT,
    RL_CWE,
    RL_QA,
    RL_N_TASKS
} rl_task_t;

#define RL_MAX_ANSWERS 10
#define RL_ANSWER_LEN 48

/* One prompt and what a correct answer must contain. */
typedef struct rl_sample {
    rl_buf_t user;                               /* instruction, haystack with needles, question */
    char prefix[256];                            /* answer opener the model continues */
    char prefix_base[256];                       /* the opener for a base model, when it differs ("": prefix) */
    char answers[RL_MAX_ANSWERS][RL_ANSWER_LEN]; /* every one must appear in the output */
    int n_answers;                               /* 1 .. RL_MAX_ANSWERS */
    int max_gen;                                 /* tokens to generate */
} rl_sample_t;

/* "niah_single", ...; NULL for an invalid value. */
const char *rl_task_name(rl_task_t t);
/* true and *t_p set when name is a task name. */
bool rl_task_parse(const char *name, rl_task_t *t_p);
/* Tokens a sample of task t generates at most. */
int rl_task_max_gen(rl_task_t t);
/* Sentences (entries) per token, roughly: the first guess of the sizing. */
double rl_task_units_per_token(rl_task_t t);

/* Fill s (zeroed or reused after rl_sample_free) for task t.  depth in
 * [0, 1] places the needle that is asked about (niah tasks, qa).  Errors:
 * RI_ERR_NOMEM. */
ri_status_t rl_task_make(rl_task_t t, uint64_t seed, size_t n_units, double depth, rl_sample_t *s);
void rl_sample_free(rl_sample_t *s);

#endif /* RL_TASK_H */
