/*
 * Tokenizer on the real vocabulary (round trips of mixed Unicode, special
 * tokens, the chat template, stop tokens) and sampling (greedy, seeded
 * reproducibility, top-p, temperature).  The tokenizer part exits 77 without
 * the model; the sampling part always runs.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "common/cm_alloc.h"
#include "gpuworker/model/mdl_model.h"
#include "tm_util.h"
#include "gpuworker/model/mdl_sample.h"

static mdl_model_t *model;

static void roundtrip(const mdl_tok_t *tok, const char *s)
{
    int32_t *ids;
    size_t n;
    char *back;
    assert_int_equal(mdl_tok_encode(tok, s, strlen(s), false, &ids, &n), RI_OK);
    assert_int_equal(mdl_tok_decode(tok, ids, n, false, &back), RI_OK);
    if (strcmp(back, s) != 0)
        fail_msg("round trip of '%s' gave '%s'", s, back);
    cm_free(back);
    cm_free(ids);
}

static void test_roundtrip_unicode(void **state)
{
    (void)state;
    if (model == NULL)
        skip();
    const mdl_tok_t *tok = mdl_model_tok(model);
    static const char *const texts[] = {
        "Hello, world!",
        "  leading and trailing spaces  ",
        "tabs\tand\nnew\n\nlines\r\n",
        "numbers 1234567890 and 3.14159, -42",
        "ünïcödé çàfé naïve Ωμέγα Привет мир",
        "日本語のテキスト、中文字符。한국어",
        "emoji 🎉🚀 and symbols ©®™ €£¥ → ∞ ≠",
        "code: for (int i = 0; i < n; i++) { x += a[i]; }",
        "it's we're they've I'm you'll he'd",
        "<|im_start|> looks special but is plain text here",
        "",
    };
    for (size_t i = 0; i < sizeof(texts) / sizeof(texts[0]); i++)
        roundtrip(tok, texts[i]);
}

static void test_specials_and_chat(void **state)
{
    (void)state;
    if (model == NULL)
        skip();
    const mdl_tok_t *tok = mdl_model_tok(model);
    int32_t *ids;
    size_t n;
    const char *s = "<|im_start|>user\nhi<|im_end|>";
    assert_int_equal(mdl_tok_encode(tok, s, strlen(s), true, &ids, &n), RI_OK);
    assert_int_equal(ids[0], 1);          /* <|im_start|> */
    assert_int_equal(ids[n - 1], 2);      /* <|im_end|> */
    cm_free(ids);
    assert_int_equal(mdl_tok_encode(tok, s, strlen(s), false, &ids, &n), RI_OK);
    assert_int_not_equal(ids[0], 1);      /* plain text when specials are off */
    cm_free(ids);
    assert_true(mdl_tok_is_stop(tok, 2));
    assert_true(mdl_tok_is_stop(tok, mdl_tok_eos(tok)));
    assert_false(mdl_tok_is_stop(tok, 100));

    assert_int_equal(mdl_tok_chat(tok, NULL, "What is 2+2?", &ids, &n), RI_OK);
    char *text;
    assert_int_equal(mdl_tok_decode(tok, ids, n, false, &text), RI_OK);
    assert_string_equal(text, "<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging "
                              "Face<|im_end|>\n<|im_start|>user\nWhat is 2+2?<|im_end|>\n<|im_start|>assistant\n");
    cm_free(text);
    assert_int_equal(ids[0], 1);
    cm_free(ids);
    /* a user message cannot forge a turn */
    assert_int_equal(mdl_tok_chat(tok, "sys", "<|im_end|>", &ids, &n), RI_OK);
    size_t specials = 0;
    for (size_t i = 0; i < n; i++)
        specials += ids[i] == 1 || ids[i] == 2;
    assert_int_equal(specials, 5);   /* 3 opens, 2 closes from the template only */
    cm_free(ids);
    /* bytes without a token (0xFF never occurs in UTF-8) do not crash */
    assert_int_equal(mdl_tok_encode(tok, "a\xff\xfe b", 5, false, &ids, &n), RI_OK);
    cm_free(ids);
    char buf[8];
    assert_int_equal(mdl_tok_piece(tok, -1, buf, sizeof(buf)), -1);
    assert_int_equal(mdl_tok_piece(tok, 1 << 30, buf, sizeof(buf)), -1);
}

static void test_sampling(void **state)
{
    (void)state;
    float logits[1000];
    for (int i = 0; i < 1000; i++)
        logits[i] = (float)((i * 7919) % 1000) / 100.0f;
    int32_t best = mdl_argmax(logits, 1000);
    assert_true(logits[best] >= logits[0]);
    mdl_sampler_t *s;
    mdl_sampler_cfg_t greedy = {.temperature = 0, .top_p = 1, .seed = 1};
    assert_int_equal(mdl_sampler_create(&greedy, 1000, &s), RI_OK);
    assert_int_equal(mdl_sample(s, logits), best);
    mdl_sampler_destroy(s);
    /* tiny top-p keeps only the best */
    mdl_sampler_cfg_t nucleus = {.temperature = 1, .top_p = 0.001f, .seed = 7};
    assert_int_equal(mdl_sampler_create(&nucleus, 1000, &s), RI_OK);
    for (int i = 0; i < 20; i++)
        assert_int_equal(mdl_sample(s, logits), best);
    mdl_sampler_destroy(s);
    /* same seed, same sequence; a hot temperature spreads over many tokens */
    mdl_sampler_cfg_t hot = {.temperature = 5, .top_p = 1, .seed = 42};
    mdl_sampler_t *a, *b;
    assert_int_equal(mdl_sampler_create(&hot, 1000, &a), RI_OK);
    assert_int_equal(mdl_sampler_create(&hot, 1000, &b), RI_OK);
    int distinct = 0, seen[1000] = {0};
    for (int i = 0; i < 200; i++) {
        int32_t x = mdl_sample(a, logits), y = mdl_sample(b, logits);
        assert_int_equal(x, y);
        assert_true(x >= 0 && x < 1000);
        if (!seen[x]++)
            distinct++;
    }
    assert_true(distinct > 20);
    mdl_sampler_destroy(a);
    mdl_sampler_destroy(b);
    mdl_sampler_destroy(NULL);
    mdl_sampler_cfg_t bad = {.temperature = -1, .top_p = 1};
    assert_int_equal(mdl_sampler_create(&bad, 10, &s), RI_ERR_INVALID);
    bad.temperature = 1, bad.top_p = 0;
    assert_int_equal(mdl_sampler_create(&bad, 10, &s), RI_ERR_INVALID);
}

int main(void)
{
    char path[4096];
    char err[512];
    tm_runtime_setup();
    if (mdl_model_default_path(path, sizeof(path)) == RI_OK && mdl_model_load(path, &model, err, sizeof(err)) != RI_OK)
        fprintf(stderr, "cannot load %s: %s\n", path, err);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_roundtrip_unicode),
        cmocka_unit_test(test_specials_and_chat),
        cmocka_unit_test(test_sampling),
    };
    int rc = cmocka_run_group_tests(tests, NULL, NULL);
    bool skipped = model == NULL;
    mdl_model_destroy(model);
    if (rc == 0 && skipped) {
        /* a cmocka skip() alone reports Passed; the tokenizer checks did not run */
        fprintf(stderr, "skipped: the default model %s is not installed (./ri setup), tokenizer tests did not run\n",
                path);
        return 77;
    }
    return rc;
}
