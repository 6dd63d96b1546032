/*
 * Gemma 3 270M against an independent numpy reference
 * (tests/model/ref_gemma3.py, reading the GGUF through the `gguf` package):
 *  - logits of three prompts x 8 positions (chunked prefill, and the last
 *    position again through the decode path): max |delta logit| <= 1e-2 of
 *    the reference's logit range at that position, same argmax;
 *  - the last 8 positions of a prompt longer than the 512-token sliding
 *    window, where local and global layers differ (prefill and decode);
 *  - our SentencePiece ids (bos, digits, user-defined newline tokens, byte
 *    fallback, non-ASCII, and 24 KB of this repository's prose) equal to the
 *    reference tokenizer's.
 * Skipped (77) without the model file, python3, numpy or gguf.
 */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>

#include <cmocka.h>

#include "common/cm_alloc.h"
#include "gpuworker/model/mdl_model.h"
#include "tm_util.h"
#include "gpuworker/model/mdl_sample.h"

#define NPOS 8
#define NPROMPT 4   /* three short, one past the window */

static const char *const prompts[] = {
    "The capital of France is Paris, and the capital of Germany is",
    "def fibonacci(n):\n    if n < 2:\n        return n\n\n    return fibonacci(n - 1)",
    "Once upon a time, in a small village of 42 houses, there lived a girl who",
};
/* tokenizer-only cases: byte fallback, non-ASCII, tabs, runs of spaces */
static const char *const tok_only[] = {
    "naïve café — 東京\tdone.  Two  spaces\n\n\nend \x01\x7f",
    "    indented\r\n\t\tcode();  // ok?!",
};

static char tmpdir[256];
static char long_prompt[16384];

static int run_ref(const char *args)
{
    char cmd[8192];
    const char *src = getenv("RI_SOURCE_DIR");
    snprintf(cmd, sizeof(cmd), "python3 %s/tests/model/ref_gemma3.py %s", src ? src : ".", args);
    int rc = system(cmd);
    return rc == -1 || !WIFEXITED(rc) ? -1 : WEXITSTATUS(rc);
}

/* ~700 tokens of varied sentences: longer than the 512-token window. */
static void make_long_prompt(void)
{
    static const char *const names[] = {"Anna", "Ben", "Chloe", "David", "Emma", "Felix"};
    static const char *const things[] = {"apples", "books", "stones", "letters", "coins", "maps"};
    size_t len = 0;
    for (int i = 0; i < 60; i++)
        len += (size_t)snprintf(long_prompt + len, sizeof(long_prompt) - len,
                                "%s found %d %s near the old river. ", names[i % 6], i * 7 % 50, things[i / 6 % 6]);
    snprintf(long_prompt + len, sizeof(long_prompt) - len, "How many apples did Anna find? Anna found");
}

static void write_text(const char *path, const char *text)
{
    FILE *f = fopen(path, "w");
    assert_non_null(f);
    fputs(text, f);
    fclose(f);
}

/* Real prose with markdown, code and non-ASCII: this repository's
 * docs/architecture.md, its first 24 KB cut at a line end (NULL if absent). */
static char *read_prose(void)
{
    char path[4096];
    const char *src = getenv("RI_SOURCE_DIR");
    snprintf(path, sizeof(path), "%s/docs/architecture.md", src ? src : ".");
    FILE *f = fopen(path, "rb");
    if (f == NULL)
        return NULL;
    char *buf = calloc(1, 24577);
    size_t n = buf ? fread(buf, 1, 24576, f) : 0;
    fclose(f);
    while (n > 0 && buf[n - 1] != '\n')
        buf[--n] = '\0';
    return buf;
}

static void test_tokenizer_matches_reference(void **state)
{
    mdl_model_t *m = *state;
    char *prose = read_prose();
    const char *texts[6] = {prompts[0], prompts[1], prompts[2], tok_only[0], tok_only[1], prose};
    int nt = prose != NULL ? 6 : 5;
    char args[4096], *a = args;
    a += snprintf(args, sizeof(args), "'%s' tokenize", getenv("RI_T_PATH"));
    for (int p = 0; p < nt; p++) {
        char in[300];
        snprintf(in, sizeof(in), "%s/text%d.txt", tmpdir, p);
        write_text(in, texts[p]);
        a += snprintf(a, sizeof(args) - (size_t)(a - args), " '%s' '%s/ids%d.txt'", in, tmpdir, p);
    }
    int rc = run_ref(args);
    if (rc == 77)
        skip();
    assert_int_equal(rc, 0);
    for (int p = 0; p < nt; p++) {
        char out[300];
        snprintf(out, sizeof(out), "%s/ids%d.txt", tmpdir, p);
        int32_t *ids;
        size_t n, k = 0;
        assert_int_equal(mdl_tok_encode_prompt(mdl_model_tok(m), texts[p], strlen(texts[p]), &ids, &n), RI_OK);
        FILE *f = fopen(out, "r");
        assert_non_null(f);
        int v;
        while (fscanf(f, "%d", &v) == 1) {
            if (k >= n || ids[k] != v)
                fail_msg("text %d token %zu: ours %d, reference %d", p, k, k < n ? ids[k] : -1, v);
            k++;
        }
        fclose(f);
        assert_int_equal(k, n);
        char *back;   /* and back to the same text (bos skipped as a control token) */
        assert_int_equal(mdl_tok_decode(mdl_model_tok(m), ids, n, true, &back), RI_OK);
        assert_string_equal(back, texts[p]);
        cm_free(back);
        if (p == 5)
            printf("prose: %zu bytes, %zu tokens, equal to the reference\n", strlen(texts[p]), n);
        cm_free(ids);
    }
    free(prose);
}

/* Max |a - b| over V as a share of b's range; fails on another argmax. */
static double check_row(const float *a, const float *b, size_t V, const char *what, size_t p, size_t pos)
{
    float lo = b[0], hi = b[0];
    double md = 0;
    for (size_t i = 0; i < V; i++) {
        lo = fminf(lo, b[i]), hi = fmaxf(hi, b[i]);
        md = fmax(md, fabs((double)a[i] - b[i]));
    }
    double rel = md / (hi - lo);
    if (!(rel <= 1e-2) || mdl_argmax(a, V) != mdl_argmax(b, V))
        fail_msg("prompt %zu pos %zu (%s): max|dlogit| %.4f = %.5f of range %.2f, argmax %d vs %d", p, pos, what, md,
                 rel, hi - lo, mdl_argmax(a, V), mdl_argmax(b, V));
    return rel;
}

/* Our logits of the last NPOS tokens of ids: prefill (chunks of 4) and the
 * last one again through one decode step. */
static void our_logits(mdl_model_t *m, const int32_t *ids, size_t n, float *pre, float *dec)
{
    mdl_seq_t *s;
    assert_int_equal(mdl_seq_create(m, mdl_attn_find("full"), NULL, n, &s), RI_OK);
    assert_int_equal(mdl_prefill(m, s, ids, n - NPOS, NULL, NULL, NULL, NULL), RI_OK);
    mdl_model_set_chunk(m, 4);   /* the checked positions in two chunks: chunked prefill is what is checked */
    assert_int_equal(mdl_prefill(m, s, ids + n - NPOS, NPOS, NULL, pre, NULL, NULL), RI_OK);
    mdl_model_set_chunk(m, 64);
    mdl_seq_destroy(s);
    assert_int_equal(mdl_seq_create(m, mdl_attn_find("full"), NULL, n, &s), RI_OK);
    assert_int_equal(mdl_prefill(m, s, ids, n - 1, NULL, NULL, NULL, NULL), RI_OK);
    mdl_seq_t *one[1] = {s};
    assert_int_equal(mdl_decode(m, one, &ids[n - 1], 1, dec), RI_OK);
    mdl_seq_destroy(s);
}

static void test_logits_match_reference(void **state)
{
    mdl_model_t *m = *state;
    size_t V = mdl_model_hparams(m)->n_vocab;
    float *ours = malloc(NPROMPT * NPOS * V * sizeof(float)), *ref = malloc(NPROMPT * NPOS * V * sizeof(float));
    float *dec = malloc(NPROMPT * V * sizeof(float));
    assert_true(ours && ref && dec);
    char in[300], out[300], args[1024];
    snprintf(in, sizeof(in), "%s/tokens.txt", tmpdir);
    snprintf(out, sizeof(out), "%s/logits.bin", tmpdir);
    FILE *f = fopen(in, "w");
    assert_non_null(f);
    for (size_t p = 0; p < NPROMPT; p++) {
        const char *text = p < 3 ? prompts[p] : long_prompt;
        int32_t *ids;
        size_t n;
        assert_int_equal(mdl_tok_encode_prompt(mdl_model_tok(m), text, strlen(text), &ids, &n), RI_OK);
        assert_true(n >= NPOS);
        n = p < 3 ? NPOS : n;
        if (p == 3)
            assert_true(n > 600);   /* past the window */
        for (size_t i = 0; i < n; i++)
            fprintf(f, "%d%c", ids[i], i + 1 == n ? '\n' : ' ');
        our_logits(m, ids, n, ours + p * NPOS * V, dec + p * V);
        cm_free(ids);
    }
    fclose(f);
    snprintf(args, sizeof(args), "'%s' logits '%s' '%s' %d", getenv("RI_T_PATH"), in, out, NPOS);
    int rc = run_ref(args);
    if (rc == 77)
        skip();
    assert_int_equal(rc, 0);
    f = fopen(out, "rb");
    assert_non_null(f);
    assert_int_equal(fread(ref, sizeof(float), NPROMPT * NPOS * V, f), NPROMPT * NPOS * V);
    fclose(f);
    double worst = 0;
    for (size_t p = 0; p < NPROMPT; p++) {
        for (size_t i = 0; i < NPOS; i++)
            worst = fmax(worst, check_row(ours + (p * NPOS + i) * V, ref + (p * NPOS + i) * V, V, "prefill", p, i));
        double r = check_row(dec + p * V, ref + (p * NPOS + NPOS - 1) * V, V, "decode", p, NPOS - 1);
        printf("prompt %zu: decode step max |dlogit| / range %.2e\n", p, r);
        worst = fmax(worst, r);
    }
    printf("max |dlogit| / range over %d positions: %.2e (limit 1e-2)\n", NPROMPT * (NPOS + 1), worst);
    free(ours), free(ref), free(dec);
}

int main(void)
{
    static char path[4096];
    tm_runtime_setup();
    const char *env = getenv("RI_TEST_GEMMA");
    if (env != NULL && env[0] != '\0')
        snprintf(path, sizeof(path), "%s", env);
    else if (mdl_model_resolve("gemma3-270m", path, sizeof(path)) != RI_OK) {
        fprintf(stderr, "skip: no Gemma 3 model at %s (deps/setup.d/11-model-gemma3.sh installs it)\n", path);
        return 77;
    }
    if (system("python3 -c 'import numpy, gguf' 2>/dev/null") != 0) {
        fprintf(stderr, "skip: python3 with numpy and gguf is needed (./ri setup installs them)\n");
        return 77;
    }
    setenv("RI_T_PATH", path, 1);
    char err[512];
    mdl_model_t *m;
    if (mdl_model_load(path, &m, err, sizeof(err)) != RI_OK) {
        fprintf(stderr, "cannot load %s: %s\n", path, err);
        return 1;
    }
    make_long_prompt();
    snprintf(tmpdir, sizeof(tmpdir), "/tmp/ri-test-gemma3-ref-XXXXXX");
    if (mkdtemp(tmpdir) == NULL)
        return 1;
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_prestate(test_tokenizer_matches_reference, m),
        cmocka_unit_test_prestate(test_logits_match_reference, m),
    };
    int rc = cmocka_run_group_tests(tests, NULL, NULL);
    char cmd[400];
    snprintf(cmd, sizeof(cmd), "rm -rf '%s'", tmpdir);
    if (system(cmd) != 0)
        fprintf(stderr, "could not remove %s\n", tmpdir);
    mdl_model_destroy(m);
    return rc;
}
