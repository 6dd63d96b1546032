/*
 * The generation rules of mdl_gen (the one loop every program uses), on the
 * real SmolLM2: a stop token ends the reply unseen; any other token counts,
 * then max_tokens or a full sequence ends it, and the last counted token is
 * not decoded (steps = tokens - 1); the sequence never grows past its
 * capacity; mdl_generate and a caller's own pick / decode loop (the
 * scheduler's way) give the same tokens.  Skipped (77) without the model.
 */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <cmocka.h>

#include "common/cm_alloc.h"
#include "gpuworker/model/mdl_gen.h"
#include "gpuworker/model/mdl_model.h"
#include "tm_util.h"

#define TG_MAX 32

typedef struct tg_ids {
    int32_t id[TG_MAX];
    size_t n;
} tg_ids_t;

static void tg_collect(void *arg, int32_t id)
{
    tg_ids_t *t = arg;
    assert_true(t->n < TG_MAX);
    t->id[t->n++] = id;
}

static mdl_model_t *tg_model;
static int32_t *tg_prompt;
static size_t tg_n;

static int tg_setup(void **state)
{
    char err[512];
    (void)state;
    const char *path = tm_model_path_or_skip();
    if (mdl_model_load(path, &tg_model, err, sizeof(err)) != RI_OK) {
        fprintf(stderr, "cannot load %s: %s\n", path, err);
        return -1;
    }
    const char *text = "The capital of France is";
    return mdl_tok_encode_prompt(mdl_model_tok(tg_model), text, strlen(text), &tg_prompt, &tg_n) == RI_OK ? 0 : -1;
}

static int tg_teardown(void **state)
{
    (void)state;
    cm_free(tg_prompt);
    mdl_model_destroy(tg_model);
    return 0;
}

/* max_tokens ends it: 6 tokens, 5 decode steps; the step API agrees. */
static void test_length_and_step_api(void **state)
{
    (void)state;
    size_t nv = mdl_model_hparams(tg_model)->n_vocab;
    float *logits = malloc(nv * sizeof(float));
    mdl_seq_t *a, *b;
    assert_int_equal(mdl_seq_create(tg_model, mdl_attn_find("full"), NULL, tg_n + 16, &a), RI_OK);
    assert_int_equal(mdl_seq_create(tg_model, mdl_attn_find("full"), NULL, tg_n + 16, &b), RI_OK);

    tg_ids_t got = {0};
    mdl_gen_cfg_t cfg = {.max_tokens = 6, .on_token = tg_collect, .token_arg = &got};
    mdl_gen_result_t res;
    assert_int_equal(mdl_generate(tg_model, a, tg_prompt, tg_n, logits, &cfg, &res), RI_OK);
    assert_int_equal(res.end, MDL_GEN_LENGTH); /* " Paris..." has no stop token in 6 */
    assert_int_equal(res.n_gen, 6);
    assert_int_equal(got.n, 6);
    assert_int_equal(res.steps, 5);
    assert_int_equal(mdl_seq_len(a), tg_n + 5);

    /* the scheduler's way: prefill, then pick / decode itself */
    tg_ids_t own = {0};
    assert_int_equal(mdl_prefill(tg_model, b, tg_prompt, tg_n, logits, NULL, NULL, NULL), RI_OK);
    mdl_gen_t g;
    mdl_gen_init(&g, mdl_model_tok(tg_model), NULL, nv, 6, mdl_seq_len(b), mdl_seq_cap(b));
    for (;;) {
        int32_t id;
        mdl_gen_end_t end = mdl_gen_pick(&g, logits, &id);
        if (end == MDL_GEN_STOP)
            break;
        tg_collect(&own, id);
        if (end == MDL_GEN_LENGTH)
            break;
        assert_int_equal(mdl_decode(tg_model, &b, &id, 1, logits), RI_OK);
    }
    assert_int_equal(own.n, got.n);
    assert_memory_equal(own.id, got.id, got.n * sizeof(int32_t));
    mdl_seq_destroy(b);
    mdl_seq_destroy(a);
    free(logits);
}

/* A full sequence ends it: capacity prompt + 2 takes 3 tokens (the third is
 * counted, not decoded) and the sequence stops at its capacity. */
static void test_full_sequence(void **state)
{
    (void)state;
    float *logits = malloc(mdl_model_hparams(tg_model)->n_vocab * sizeof(float));
    mdl_seq_t *s;
    assert_int_equal(mdl_seq_create(tg_model, mdl_attn_find("full"), NULL, tg_n + 2, &s), RI_OK);
    tg_ids_t got = {0};
    mdl_gen_cfg_t cfg = {.max_tokens = 100, .on_token = tg_collect, .token_arg = &got};
    mdl_gen_result_t res;
    assert_int_equal(mdl_generate(tg_model, s, tg_prompt, tg_n, logits, &cfg, &res), RI_OK);
    assert_int_equal(res.end, MDL_GEN_LENGTH);
    assert_int_equal(res.n_gen, 3);
    assert_int_equal(res.steps, 2);
    assert_int_equal(mdl_seq_len(s), mdl_seq_cap(s));
    mdl_seq_destroy(s);
    free(logits);
}

/* The stop token ends it unseen (nothing counted, nothing delivered); with
 * max_tokens 1 any other token counts and ends it. */
static void test_stop_token_unseen(void **state)
{
    (void)state;
    const mdl_tok_t *tok = mdl_model_tok(tg_model);
    size_t nv = mdl_model_hparams(tg_model)->n_vocab;
    int32_t stop = -1;
    for (size_t i = 0; i < nv && stop < 0; i++)
        if (mdl_tok_is_stop(tok, (int32_t)i))
            stop = (int32_t)i;
    assert_true(stop >= 0);
    float *logits = calloc(nv, sizeof(float));
    logits[stop] = 10;
    mdl_gen_t g;
    int32_t id;
    mdl_gen_init(&g, tok, NULL, nv, 4, 10, 100);
    assert_int_equal(mdl_gen_pick(&g, logits, &id), MDL_GEN_STOP);
    assert_int_equal(id, stop);
    assert_int_equal(g.n_gen, 0);
    logits[stop] = 0;
    logits[stop == 0 ? 1 : 0] = 10;
    mdl_gen_init(&g, tok, NULL, nv, 1, 10, 100);
    assert_int_equal(mdl_gen_pick(&g, logits, &id), MDL_GEN_LENGTH);
    assert_int_equal(g.n_gen, 1);
    free(logits);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_length_and_step_api),
        cmocka_unit_test(test_full_sequence),
        cmocka_unit_test(test_stop_token_unseen),
    };
    return cmocka_run_group_tests(tests, tg_setup, tg_teardown);
}
