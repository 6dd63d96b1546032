/*
 * Long prompts for the model benchmarks: the passkey retrieval prompt of the
 * long-context literature (instructions, repeated filler sentences, the key
 * at a chosen depth, the question) sized to a token count.
 */
#ifndef BN_FILLER_H
#define BN_FILLER_H

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/cm_alloc.h"
#include "gpuworker/model/mdl_tok.h"

#define BN_FILLER " The grass is green. The sky is blue. The sun is yellow. Here we go. There and back again."
#define BN_INTRO                                                                                       \
    "There is an important info hidden inside a lot of irrelevant text. Find it and memorize it. I " \
    "will quiz you about the important information there."
#define BN_QUESTION " What is the pass key? The pass key is"

static size_t bn_count_tokens(const mdl_tok_t *tok, const char *s)
{
    int32_t *ids;
    size_t n = 0;
    if (mdl_tok_encode(tok, s, strlen(s), false, &ids, &n) != RI_OK)
        return 0;
    cm_free(ids);
    return n;
}

/* A prompt of about n_tokens tokens with "The pass key is KEY. Remember it.
 * KEY is the pass key." at depth (0..1) of the filler; key < 0 leaves the
 * needle out (plain filler, for speed benchmarks).  Encoded into *ids_p
 * (caller frees with cm_free). */
static ri_status_t bn_passkey_prompt(const mdl_tok_t *tok, size_t n_tokens, double depth, int key, int32_t **ids_p,
                                     size_t *n_p)
{
    char needle[160] = "";
    if (key >= 0)
        snprintf(needle, sizeof(needle), " The pass key is %d. Remember it. %d is the pass key.", key, key);
    size_t per = bn_count_tokens(tok, BN_FILLER);
    size_t fixed = bn_count_tokens(tok, BN_INTRO) + bn_count_tokens(tok, BN_QUESTION) +
                   (key >= 0 ? bn_count_tokens(tok, needle) : 0);
    if (per == 0)
        return RI_ERR_INTERNAL;
    size_t reps = n_tokens > fixed ? (n_tokens - fixed) / per : 0;
    size_t at = (size_t)(depth * (double)reps + 0.5);
    size_t len = strlen(BN_INTRO) + strlen(BN_QUESTION) + strlen(needle) + reps * strlen(BN_FILLER) + 1;
    static CM_ALLOC_TAG(bn_filler_tag, "bench.filler");
    char *text = cm_malloc(&bn_filler_tag, len);
    if (text == NULL)
        return RI_ERR_NOMEM;
    char *p = text;
    p += sprintf(p, "%s", BN_INTRO);
    for (size_t i = 0; i < reps; i++) {
        if (i == at)
            p += sprintf(p, "%s", needle);
        p += sprintf(p, "%s", BN_FILLER);
    }
    if (at >= reps)
        p += sprintf(p, "%s", needle);
    sprintf(p, "%s", BN_QUESTION);
    ri_status_t st = mdl_tok_encode_prompt(tok, text, strlen(text), ids_p, n_p);   /* bos where the model wants it */
    cm_free(text);
    return st;
}

#endif /* BN_FILLER_H */
