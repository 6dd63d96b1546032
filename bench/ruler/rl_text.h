/*
 * Text for the RULER-style suite (bench/ruler): a seeded random generator,
 * a growable string, and English-like prose made from sentence templates
 * over a small vocabulary written for this suite (rl_vocab.c).  Everything
 * is a pure function of the seed, so a rerun builds the same prompts.
 *
 * Workload: haystacks of 4K to 32K tokens (a few hundred to a few thousand
 * sentences) built a handful of times per prompt while it is sized.
 */
#ifndef RL_TEXT_H
#define RL_TEXT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* splitmix64: small, fast, and the same on every machine. */
typedef struct rl_rng {
    uint64_t s;  /* state */
} rl_rng_t;

void rl_rng_seed(rl_rng_t *r, uint64_t seed);
uint64_t rl_rng_next(rl_rng_t *r);
/* Uniform in [0, n); n > 0. */
uint32_t rl_rng_below(rl_rng_t *r, uint32_t n);
/* Mix several numbers into one seed. */
uint64_t rl_seed_mix(uint64_t a, uint64_t b, uint64_t c, uint64_t d);

/* A growable NUL-terminated string; oom is set (and text kept as it was)
 * when an append cannot allocate. */
typedef struct rl_buf {
    char *s;     /* text (NULL until the first append) */
    size_t len;  /* bytes, without the NUL */
    size_t cap;  /* allocated */
    bool oom;    /* an append failed */
} rl_buf_t;

void rl_buf_printf(rl_buf_t *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
void rl_buf_clear(rl_buf_t *b);
void rl_buf_free(rl_buf_t *b);

/* Word lists (rl_vocab.c). */
typedef enum rl_wordlist {
    RL_NOUN,     /* singular nouns */
    RL_ADJ,      /* adjectives */
    RL_VERB,     /* past-tense verbs */
    RL_VERB_BASE,/* the same verbs, base form (same index) */
    RL_ADV,      /* adverbs */
    RL_PLACE,    /* invented town names */
    RL_FIRST,    /* first names */
    RL_LAST,     /* family names */
    RL_TIME,     /* time phrases ("that evening") */
    RL_PREP,     /* place prepositions */
    RL_DAY,      /* days and seasons */
    RL_MONTH,    /* months */
    RL_COLOR,    /* colours */
    RL_ANIMAL,   /* animals */
    RL_NUMWORD,  /* "three" .. "nineteen" */
    RL_N_WORDLISTS
} rl_wordlist_t;

/* Size of a list, and its word i (borrowed, static). */
size_t rl_words_n(rl_wordlist_t w);
const char *rl_word_at(rl_wordlist_t w, size_t i);
/* A random word of a list. */
const char *rl_word(rl_rng_t *r, rl_wordlist_t w);

/* Every distinct single word of the noun, adjective and base-verb lists
 * (for the common-words task): *n_p words, borrowed, static. */
const char *const *rl_words_distinct(size_t *n_p);

/* Append one prose sentence (no leading space). */
void rl_text_sentence(rl_rng_t *r, rl_buf_t *b);

#endif /* RL_TEXT_H */
