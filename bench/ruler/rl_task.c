/*
 * Sample generation for the six tasks (rl_task.h).  Three random streams
 * per sample, all from the seed: one for keys, values and needle depths
 * (independent of the haystack size, so answers stay fixed while the
 * prompt is sized), one for the prose, one for the cwe list order.  The
 * wording of instructions, questions and answer openers follows RULER's
 * templates.
 */
#include <stdio.h>
#include <string.h>

#include "bench/ruler/rl_task.h"
#include "common/cm_alloc.h"

static CM_ALLOC_TAG(rl_task_tag, "bench.ruler.task");

#define RL_MAX_NEEDLES 16
#define RL_PARAGRAPH 10   /* sentences per paragraph of the prose */

static const char *const rl_task_names[RL_N_TASKS] = {"niah_single", "niah_multikey", "niah_multivalue",
                                                      "vt",          "cwe",           "qa"};

const char *rl_task_name(rl_task_t t)
{
    return (unsigned)t < RL_N_TASKS ? rl_task_names[t] : NULL;
}

bool rl_task_parse(const char *name, rl_task_t *t_p)
{
    for (int t = 0; t < RL_N_TASKS; t++)
        if (strcmp(name, rl_task_names[t]) == 0) {
            *t_p = (rl_task_t)t;
            return true;
        }
    return false;
}

int rl_task_max_gen(rl_task_t t)
{
    static const int gen[RL_N_TASKS] = {16, 16, 48, 40, 64, 16};
    return (unsigned)t < RL_N_TASKS ? gen[t] : 16;
}

double rl_task_units_per_token(rl_task_t t)
{
    return t == RL_CWE ? 1.0 / 4.5 : 1.0 / 14.0;
}

/* A sentence placed before haystack unit `at`. */
typedef struct rl_needle {
    size_t at;        /* 0 .. n_units */
    char text[200];   /* the sentence */
} rl_needle_t;

/* A unit index for a depth fraction. */
static size_t rl_at(double frac, size_t n_units)
{
    size_t at = (size_t)(frac * (double)n_units + 0.5);
    return at > n_units ? n_units : at;
}

/* Prose of n_units sentences in paragraphs, with the needles (kept in the
 * order given where they share a unit) placed before their units. */
static void rl_haystack(rl_rng_t *hay, size_t n_units, const rl_needle_t *nd, size_t n_nd, rl_buf_t *b)
{
    const char *sep = "";
    for (size_t i = 0; i <= n_units; i++) {
        for (size_t k = 0; k < n_nd; k++)
            if (nd[k].at == i) {
                rl_buf_printf(b, "%s%s", sep, nd[k].text);
                sep = " ";
            }
        if (i == n_units)
            break;
        if (i > 0 && i % RL_PARAGRAPH == 0)
            sep = "\n\n";
        rl_buf_printf(b, "%s", sep);
        rl_text_sentence(hay, b);
        sep = " ";
    }
}

static void rl_answer(rl_sample_t *s, const char *fmt_one)
{
    if (s->n_answers < RL_MAX_ANSWERS)
        snprintf(s->answers[s->n_answers++], RL_ANSWER_LEN, "%s", fmt_one);
}

/* "adjective-noun", distinct from the n_used keys already drawn. */
static void rl_key(rl_rng_t *r, char keys[][64], size_t n_used)
{
    for (;;) {
        snprintf(keys[n_used], 64, "%s-%s", rl_word(r, RL_ADJ), rl_word(r, RL_NOUN));
        bool dup = false;
        for (size_t i = 0; i < n_used && !dup; i++)
            dup = strcmp(keys[i], keys[n_used]) == 0;
        if (!dup)
            return;
    }
}

static void rl_make_niah(rl_task_t t, rl_rng_t *ans, rl_rng_t *hay, size_t n_units, double depth, rl_sample_t *s)
{
    char keys[4][64], val[16];
    rl_needle_t nd[4];
    size_t n_nd = t == RL_NIAH_SINGLE ? 1 : 4;
    for (size_t k = 0; k < (t == RL_NIAH_MULTIKEY ? 4u : 1u); k++)
        rl_key(ans, keys, k);
    for (size_t i = 0; i < n_nd; i++) {
        const char *key = keys[t == RL_NIAH_MULTIKEY ? i : 0];
        snprintf(val, sizeof(val), "%u", 1000000u + rl_rng_below(ans, 9000000u));
        /* the needle asked about at the trial's depth, the others anywhere */
        double frac = i == 0 ? depth : (double)rl_rng_below(ans, 1000) / 1000.0;
        nd[i].at = rl_at(frac, n_units);
        snprintf(nd[i].text, sizeof(nd[i].text), "One of the special magic numbers for %.63s is: %.15s.", key, val);
        if (i == 0 || t == RL_NIAH_MULTIVALUE)
            rl_answer(s, val);
    }
    rl_buf_printf(&s->user, "Some special magic numbers are hidden within the following text. Make sure to "
                            "memorize it. I will quiz you about the numbers afterwards.\n");
    rl_haystack(hay, n_units, nd, n_nd, &s->user);
    if (t == RL_NIAH_MULTIVALUE) {
        rl_buf_printf(&s->user, "\nWhat are all the special magic numbers for %s mentioned in the provided text?",
                      keys[0]);
        snprintf(s->prefix, sizeof(s->prefix), "The special magic numbers for %s mentioned in the provided text are",
                 keys[0]);
        s->max_gen = rl_task_max_gen(t);
    } else {
        rl_buf_printf(&s->user, "\nWhat is the special magic number for %s mentioned in the provided text?", keys[0]);
        snprintf(s->prefix, sizeof(s->prefix), "The special magic number for %s mentioned in the provided text is",
                 keys[0]);
        s->max_gen = rl_task_max_gen(t);
    }
}

/* Five uppercase letters, distinct from the n_used names drawn. */
static void rl_varname(rl_rng_t *r, char names[][8], size_t n_used)
{
    for (;;) {
        for (int c = 0; c < 5; c++)
            names[n_used][c] = (char)('A' + rl_rng_below(r, 26));
        names[n_used][5] = '\0';
        bool dup = false;
        for (size_t i = 0; i < n_used && !dup; i++)
            dup = strcmp(names[i], names[n_used]) == 0;
        if (!dup)
            return;
    }
}

static void rl_make_vt(rl_rng_t *ans, rl_rng_t *hay, size_t n_units, rl_sample_t *s)
{
    enum { RL_VT_VARS = 5 };
    char names[RL_VT_VARS][8];
    rl_needle_t nd[RL_VT_VARS];
    unsigned value = 10000u + rl_rng_below(ans, 90000u);
    /* the chain in order at increasing depths: one per fifth of the text */
    for (size_t i = 0; i < RL_VT_VARS; i++) {
        rl_varname(ans, names, i);
        double frac = ((double)i + (double)rl_rng_below(ans, 1000) / 1000.0) / RL_VT_VARS;
        nd[i].at = rl_at(frac, n_units);
        if (i == 0)
            snprintf(nd[i].text, sizeof(nd[i].text), "VAR %s = %u.", names[i], value);
        else
            snprintf(nd[i].text, sizeof(nd[i].text), "VAR %s = VAR %s.", names[i], names[i - 1]);
        rl_answer(s, names[i]);
    }
    rl_buf_printf(&s->user, "Memorize and track the chain(s) of variable assignment hidden in the following text.\n\n");
    rl_haystack(hay, n_units, nd, RL_VT_VARS, &s->user);
    rl_buf_printf(&s->user, "\nQuestion: Find all variables that are assigned the value %u in the text above.", value);
    snprintf(s->prefix, sizeof(s->prefix),
             "Answer: According to the chain(s) of variable assignment in the text above, %d variables are assigned "
             "the value %u, they are:",
             RL_VT_VARS, value);
    s->max_gen = rl_task_max_gen(RL_VT);
}

/* n_units list entries: ten common words c times each, the others u times
 * (RULER's 30 and 3).  A short list (under 600 entries) takes c = n/20, so
 * that the ten fill half of it, and u = c/3 (at least 1); a list that
 * outruns the vocabulary raises u, and c to 3u, so that the ten stay at
 * least three times as frequent as any other word. */
static void rl_make_cwe(rl_rng_t *ans, rl_rng_t *hay, size_t n_units, rl_sample_t *s)
{
    enum { RL_CWE_TOP = 10 };
    size_t n_words;
    const char *const *words = rl_words_distinct(&n_words);
    size_t order[512];
    size_t nw = n_words < 512 ? n_words : 512;
    for (size_t i = 0; i < nw; i++)
        order[i] = i;
    for (size_t i = nw - 1; i > 0; i--) {   /* which words are common: the seed's choice */
        size_t j = rl_rng_below(ans, (uint32_t)(i + 1)), x = order[i];
        order[i] = order[j];
        order[j] = x;
    }
    size_t c = 30, u = 3, n_rare = nw - RL_CWE_TOP;
    if (n_units < 2 * RL_CWE_TOP * c) {
        c = n_units / (2 * RL_CWE_TOP) > 2 ? n_units / (2 * RL_CWE_TOP) : 2;
        u = c / 3 > 1 ? (c / 3 < 3 ? c / 3 : 3) : 1;
    } else {
        for (int it = 0; it < 4; it++) {
            size_t rest = n_units > RL_CWE_TOP * c ? n_units - RL_CWE_TOP * c : 0;
            u = rest / n_rare + (rest % n_rare != 0);
            u = u < 3 ? 3 : u;
            c = 3 * u > 30 ? 3 * u : 30;
        }
    }
    size_t rest = n_units > RL_CWE_TOP * c ? n_units - RL_CWE_TOP * c : 0, n_list = RL_CWE_TOP * c + rest;
    const char **list = cm_malloc(&rl_task_tag, n_list * sizeof(*list));
    if (list == NULL) {
        s->user.oom = true;
        return;
    }
    size_t n = 0;
    for (size_t i = 0; i < RL_CWE_TOP; i++) {
        rl_answer(s, words[order[i]]);
        for (size_t k = 0; k < c; k++)
            list[n++] = words[order[i]];
    }
    for (size_t i = 0; n < n_list; i++)   /* the rare words, u times each, until the list is full */
        list[n++] = words[order[RL_CWE_TOP + (i / u) % n_rare]];
    for (size_t i = n_list - 1; i > 0; i--) {
        size_t j = rl_rng_below(hay, (uint32_t)(i + 1));
        const char *x = list[i];
        list[i] = list[j];
        list[j] = x;
    }
    rl_buf_printf(&s->user, "Below is a numbered list of words. In these words, some appear more often than others. "
                            "Memorize the ones that appear most often.\n");
    for (size_t i = 0; i < n_list; i++)
        rl_buf_printf(&s->user, "%s%zu. %s", i ? " " : "", i + 1, list[i]);
    cm_free(list);
    rl_buf_printf(&s->user, "\nQuestion: What are the 10 most common words in the above list?");
    snprintf(s->prefix, sizeof(s->prefix), "Answer: The top 10 words that appear most often in the list are:");
    s->max_gen = rl_task_max_gen(RL_CWE);
}

/* One fact of kind k about town p: statement, question, answer, and an
 * answer opener that paraphrases the statement (the model completes it). */
static void rl_fact(int k, const char *p, rl_rng_t *r, char *stmt, char *q, char *a, char *op)
{
    char f[64];
    switch (k) {
    case 0:
        snprintf(f, sizeof(f), "%s", rl_word(r, RL_NOUN));
        snprintf(a, RL_ANSWER_LEN, "%s", rl_word(r, RL_MONTH));
        snprintf(stmt, 200, "The annual %s festival of %s is always held in %s.", f, p, a);
        snprintf(q, 200, "In which month is the annual %s festival of %s held?", f, p);
        snprintf(op, 200, "Answer: The annual %s festival of %s takes place in", f, p);
        break;
    case 1:
        snprintf(a, RL_ANSWER_LEN, "%s", rl_word(r, RL_COLOR));
        snprintf(stmt, 200, "The old bridge at %s was painted %s by the town council.", p, a);
        snprintf(q, 200, "What color was the old bridge at %s painted?", p);
        snprintf(op, 200, "Answer: The color of the old bridge at %s is", p);
        break;
    case 2:
        snprintf(a, RL_ANSWER_LEN, "%s %s", rl_word(r, RL_FIRST), rl_word(r, RL_LAST));
        snprintf(stmt, 200, "The public library of %s was founded by %s.", p, a);
        snprintf(q, 200, "Who founded the public library of %s?", p);
        snprintf(op, 200, "Answer: The founder of the public library of %s was", p);
        break;
    case 3:
        snprintf(a, RL_ANSWER_LEN, "%s", rl_word(r, RL_ANIMAL));
        snprintf(stmt, 200, "The mayor of %s keeps a pet %s in the town hall.", p, a);
        snprintf(q, 200, "What kind of pet does the mayor of %s keep?", p);
        snprintf(op, 200, "Answer: The pet that the mayor of %s keeps is a", p);
        break;
    default:
        snprintf(a, RL_ANSWER_LEN, "%s", rl_word(r, RL_NUMWORD));
        snprintf(stmt, 200, "The morning train to %s always leaves from platform %s.", p, a);
        snprintf(q, 200, "From which platform does the morning train to %s leave?", p);
        snprintf(op, 200, "Answer: The morning train to %s departs from platform", p);
        break;
    }
}

static void rl_make_qa(rl_rng_t *ans, rl_rng_t *hay, size_t n_units, double depth, rl_sample_t *s)
{
    enum { RL_QA_FACTS = 6 };
    rl_needle_t nd[RL_QA_FACTS];
    char q[200], op[200], a[RL_ANSWER_LEN], first_q[200] = "", first_op[200] = "", first_a[RL_ANSWER_LEN] = "";
    size_t n_places = rl_words_n(RL_PLACE), p0 = rl_rng_below(ans, (uint32_t)n_places);
    int kind = (int)rl_rng_below(ans, 5);
    /* the fact asked about, two of its kind about other towns, three others */
    for (size_t i = 0; i < RL_QA_FACTS; i++) {
        const char *place = rl_word_at(RL_PLACE, p0 + i * 7);   /* distinct towns (32 places, step 7) */
        int k = i < 3 ? kind : (kind + 1 + (int)rl_rng_below(ans, 4)) % 5;
        for (;;) {
            rl_fact(k, place, ans, nd[i].text, q, a, op);
            if (i == 0 || strcmp(a, first_a) != 0)   /* a distractor never shares the answer */
                break;
        }
        if (i == 0) {
            snprintf(first_q, sizeof(first_q), "%s", q);
            snprintf(first_op, sizeof(first_op), "%s", op);
            snprintf(first_a, sizeof(first_a), "%s", a);
        }
        nd[i].at = rl_at(i == 0 ? depth : (double)rl_rng_below(ans, 1000) / 1000.0, n_units);
    }
    rl_answer(s, first_a);
    static const char instr[] =
        "Answer the question based on the given documents. Only give me the answer and do not output any other words.";
    rl_buf_printf(&s->user, "%s\n\nThe following are given documents.\n\n", instr);
    rl_haystack(hay, n_units, nd, RL_QA_FACTS, &s->user);
    rl_buf_printf(&s->user, "\n\n%s\n\nQuestion: %s", instr, first_q);
    snprintf(s->prefix, sizeof(s->prefix), "Answer:");   /* RULER's; a base model completes a paraphrase */
    snprintf(s->prefix_base, sizeof(s->prefix_base), "%s", first_op);
    s->max_gen = rl_task_max_gen(RL_QA);
}

ri_status_t rl_task_make(rl_task_t t, uint64_t seed, size_t n_units, double depth, rl_sample_t *s)
{
    rl_buf_clear(&s->user);
    s->prefix[0] = '\0';
    s->prefix_base[0] = '\0';
    s->n_answers = 0;
    rl_rng_t ans, hay;
    rl_rng_seed(&ans, rl_seed_mix(seed, 1, 0, 0));
    rl_rng_seed(&hay, rl_seed_mix(seed, 2, 0, 0));
    switch (t) {
    case RL_NIAH_SINGLE:
    case RL_NIAH_MULTIKEY:
    case RL_NIAH_MULTIVALUE: rl_make_niah(t, &ans, &hay, n_units, depth, s); break;
    case RL_VT: rl_make_vt(&ans, &hay, n_units, s); break;
    case RL_CWE: rl_make_cwe(&ans, &hay, n_units, s); break;
    case RL_QA: rl_make_qa(&ans, &hay, n_units, depth, s); break;
    default: return RI_ERR_INVALID;
    }
    return s->user.oom ? RI_ERR_NOMEM : RI_OK;
}

void rl_sample_free(rl_sample_t *s)
{
    rl_buf_free(&s->user);
}
