/*
 * Seeded random numbers, a growable string and the prose generator of the
 * RULER-style suite (see rl_text.h).  The prose is grammatical enough to
 * read as English, and every sentence differs, so a model cannot learn to
 * skip the haystack the way it skips a repeated filler sentence.
 */
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include "bench/ruler/rl_text.h"
#include "common/cm_alloc.h"

static CM_ALLOC_TAG(rl_text_tag, "bench.ruler.text");

void rl_rng_seed(rl_rng_t *r, uint64_t seed)
{
    r->s = seed;
}

uint64_t rl_rng_next(rl_rng_t *r)
{
    uint64_t z = (r->s += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

uint32_t rl_rng_below(rl_rng_t *r, uint32_t n)
{
    return (uint32_t)((rl_rng_next(r) >> 32) % n);
}

uint64_t rl_seed_mix(uint64_t a, uint64_t b, uint64_t c, uint64_t d)
{
    rl_rng_t r = {a};
    uint64_t h = rl_rng_next(&r);
    r.s = h ^ b;
    h = rl_rng_next(&r);
    r.s = h ^ c;
    h = rl_rng_next(&r);
    r.s = h ^ d;
    return rl_rng_next(&r);
}

void rl_buf_printf(rl_buf_t *b, const char *fmt, ...)
{
    if (b->oom)
        return;
    va_list ap;
    va_start(ap, fmt);
    int need = vsnprintf(NULL, 0, fmt, ap);
    va_end(ap);
    if (need < 0)
        return;
    if (b->len + (size_t)need + 1 > b->cap) {
        size_t cap = b->cap ? b->cap : 4096;
        while (cap < b->len + (size_t)need + 1)
            cap *= 2;
        char *s = cm_realloc(&rl_text_tag, b->s, cap);
        if (s == NULL) {
            b->oom = true;
            return;
        }
        b->s = s;
        b->cap = cap;
    }
    va_start(ap, fmt);
    vsnprintf(b->s + b->len, b->cap - b->len, fmt, ap);
    va_end(ap);
    b->len += (size_t)need;
}

void rl_buf_clear(rl_buf_t *b)
{
    b->len = 0;
    b->oom = false;
    if (b->s != NULL)
        b->s[0] = '\0';
}

void rl_buf_free(rl_buf_t *b)
{
    cm_free(b->s);
    *b = (rl_buf_t){0};
}

/* Sentence templates.  Slots: %A adjective, %N noun, %V past verb, %B base
 * verb, %D adverb, %P place, %F first name, %L family name, %T time phrase,
 * %R preposition, %W day or season. */
static const char *const rl_templates[] = {
    "The %A %N %V %R the %N of %P.",
    "%F %L %V %T, and nobody asked why.",
    "In %P, people say the %N %V %D %T.",
    "Every %W the %A %N %V %R the %N.",
    "Nobody in %P could explain why the %N %V so %D.",
    "%F and %F walked past the %A %N and %V %D.",
    "It was a %A %W, and the %N of %P looked %A.",
    "A %A %N is rarely seen %R the %N, yet %F saw one %T.",
    "The %N %V %D, while the %A %N waited %R the %N.",
    "%F wrote a long letter about the %A %N and sent it to %P.",
    "The old %N %R the %N %V again %T.",
    "When the %N %V, %F %V %D.",
    "There was once a %A %N that would %B %R the %N of %P.",
    "According to %F %L, the %N of %P %V %D last %W.",
    "The %A %N and the %A %N were the talk of %P for a week.",
    "%F liked to %B %R the %N %T, when the %N was %A.",
    "Travelers from %P often stop to %B by the %A %N.",
    "Before the %N %V, the %N had been %A and %A.",
    "Some said the %N would %B %D, but %F was not so sure.",
    "The %N in %P is %A, and its %N is even more %A.",
};

void rl_text_sentence(rl_rng_t *r, rl_buf_t *b)
{
    const char *t = rl_templates[rl_rng_below(r, (uint32_t)(sizeof(rl_templates) / sizeof(rl_templates[0])))];
    while (*t) {
        if (*t != '%') {
            size_t n = strcspn(t, "%");
            rl_buf_printf(b, "%.*s", (int)n, t);
            t += n;
            continue;
        }
        rl_wordlist_t w;
        switch (t[1]) {
        case 'A': w = RL_ADJ; break;
        case 'N': w = RL_NOUN; break;
        case 'V': w = RL_VERB; break;
        case 'B': w = RL_VERB_BASE; break;
        case 'D': w = RL_ADV; break;
        case 'P': w = RL_PLACE; break;
        case 'F': w = RL_FIRST; break;
        case 'L': w = RL_LAST; break;
        case 'T': w = RL_TIME; break;
        case 'R': w = RL_PREP; break;
        default: w = RL_DAY; break;
        }
        rl_buf_printf(b, "%s", rl_word(r, w));
        t += 2;
    }
}
