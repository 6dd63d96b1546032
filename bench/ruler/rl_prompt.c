/*
 * Prompt encoding and sizing (rl_prompt.h).  Sizing encodes the whole
 * prompt a few times (a 32K-token prompt: a few tens of ms each): a
 * secant step on the haystack size, kept inside the bracket of sizes known
 * to fit and known not to.
 */
#include <string.h>

#include "bench/ruler/rl_prompt.h"
#include "common/cm_alloc.h"

static CM_ALLOC_TAG(rl_prompt_tag, "bench.ruler.prompt");

bool rl_prompt_chat(const mdl_tok_t *tok)
{
    return mdl_tok_has_chat(tok);
}

const char *rl_prompt_prefix(const mdl_tok_t *tok, const rl_sample_t *s)
{
    return !rl_prompt_chat(tok) && s->prefix_base[0] ? s->prefix_base : s->prefix;
}

ri_status_t rl_prompt_encode(const mdl_tok_t *tok, const char *user, const char *prefix, int32_t **ids_p,
                             size_t *n_p)
{
    if (!rl_prompt_chat(tok)) {
        rl_buf_t b = {0};
        rl_buf_printf(&b, "%s\n%s", user, prefix);
        ri_status_t st = b.oom ? RI_ERR_NOMEM : mdl_tok_encode_prompt(tok, b.s, b.len, ids_p, n_p);
        rl_buf_free(&b);
        return st;
    }
    int32_t *chat = NULL, *pre = NULL;
    size_t n_chat = 0, n_pre = 0;
    ri_status_t st = mdl_tok_chat(tok, NULL, user, &chat, &n_chat);
    if (st == RI_OK)
        st = mdl_tok_encode(tok, prefix, strlen(prefix), false, &pre, &n_pre);
    if (st == RI_OK) {
        int32_t *ids = cm_malloc(&rl_prompt_tag, (n_chat + n_pre) * sizeof(*ids));
        if (ids == NULL) {
            st = RI_ERR_NOMEM;
        } else {
            memcpy(ids, chat, n_chat * sizeof(*ids));
            memcpy(ids + n_chat, pre, n_pre * sizeof(*ids));
            *ids_p = ids;
            *n_p = n_chat + n_pre;
        }
    }
    cm_free(chat);
    cm_free(pre);
    return st;
}

/* Build and encode the sample of n_units; *n_p tokens. */
static ri_status_t rl_prompt_try(const mdl_tok_t *tok, rl_task_t t, uint64_t seed, double depth, size_t n_units,
                                 rl_sample_t *s, int32_t **ids_p, size_t *n_p)
{
    ri_status_t st = rl_task_make(t, seed, n_units, depth, s);
    if (st != RI_OK)
        return st;
    return rl_prompt_encode(tok, s->user.s, rl_prompt_prefix(tok, s), ids_p, n_p);
}

ri_status_t rl_prompt_fit(const mdl_tok_t *tok, rl_task_t t, uint64_t seed, double depth, size_t max_tokens,
                          rl_sample_t *s, int32_t **ids_p, size_t *n_p)
{
    size_t lo = 0, hi = 0;   /* lo fits; hi does not (0: none known) */
    bool have_lo = false;
    size_t tol = max_tokens / 200 > 16 ? max_tokens / 200 : 16;
    size_t u = (size_t)((double)max_tokens * rl_task_units_per_token(t));
    for (int it = 0; it < 24; it++) {
        int32_t *ids = NULL;
        size_t n = 0;
        ri_status_t st = rl_prompt_try(tok, t, seed, depth, u, s, &ids, &n);
        if (st != RI_OK)
            return st;
        cm_free(ids);
        if (n <= max_tokens) {
            lo = u, have_lo = true;
            if (max_tokens - n <= tol)
                break;
        } else {
            hi = u;
            if (u == 0)
                return RI_ERR_RANGE;
        }
        if (hi != 0 && have_lo && hi - lo <= 1)
            break;
        /* secant through the origin-free estimate: units scale with tokens */
        size_t next = (size_t)((double)u * (double)max_tokens / (double)(n ? n : 1));
        if (have_lo && next <= lo)
            next = hi ? lo + (hi - lo) / 2 : lo + 1;
        if (hi != 0 && next >= hi)
            next = have_lo ? lo + (hi - lo) / 2 : hi / 2;
        if (next == u)
            break;
        u = next;
    }
    if (!have_lo)   /* searched down without a fit: try an empty haystack */
        lo = 0;
    ri_status_t st = rl_prompt_try(tok, t, seed, depth, lo, s, ids_p, n_p);
    if (st == RI_OK && *n_p > max_tokens) {
        cm_free(*ids_p);
        *ids_p = NULL;
        return RI_ERR_RANGE;
    }
    return st;
}
