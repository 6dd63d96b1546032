/*
 * The forward pass against an independent numpy reference
 * (tests/model/ref_llama.py, reading the GGUF through the `gguf` package):
 * three prompts, the first 8 positions each, max |delta logit| <= 1e-2 of the
 * reference's logit range at that position and the same argmax.  Also our
 * tokenizer's ids against the reference's ASCII BPE on the same prompts.
 * Skipped (77) without the model, python3, numpy or gguf.
 */
#include <math.h>
#include <stdbool.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmocka.h>

#include "common/cm_alloc.h"
#include "gpuworker/model/mdl_model.h"
#include "gpuworker/model/mdl_quant.h"
#include "gpuworker/model/mdl_sample.h"
#include "tm_util.h"

#define NPOS 8

static const char *const prompts[] = {
    "The capital of France is Paris, and the capital of Germany is",
    "def fibonacci(n):\n    if n < 2:\n        return n\n    return fibonacci(n - 1)",
    "Once upon a time, in a small village of 42 houses, there lived a girl who",
};

static char tmpdir[256];

static int run_ref(const char *model, const char *mode, const char *in, const char *out)
{
    char cmd[8192];
    const char *src = getenv("RI_SOURCE_DIR");
    snprintf(cmd, sizeof(cmd), "python3 %s/tests/model/ref_llama.py '%s' %s '%s' '%s'", src ? src : ".", model, mode,
             in, out);
    int rc = system(cmd);
    if (rc == -1 || !WIFEXITED(rc))
        return -1;
    return WEXITSTATUS(rc);
}

static void test_tokenizer_matches_reference(void **state)
{
    const char *path = *state;
    char err[512];
    mdl_model_t *m;
    size_t np = sizeof(prompts) / sizeof(prompts[0]);
    assert_int_equal(mdl_model_load(path, &m, err, sizeof(err)), RI_OK);
    /* one reference run for every prompt: loading the vocabulary costs seconds */
    char args[4096] = "";
    for (size_t p = 0; p < np; p++) {
        char in[300];
        snprintf(in, sizeof(in), "%s/text%zu.txt", tmpdir, p);
        FILE *f = fopen(in, "w");
        assert_non_null(f);
        fputs(prompts[p], f);
        fclose(f);
        size_t l = strlen(args);
        snprintf(args + l, sizeof(args) - l, "%s'%s' '%s/ids%zu.txt'", p ? " " : "", in, tmpdir, p);
    }
    char cmd[8192];
    const char *src = getenv("RI_SOURCE_DIR");
    snprintf(cmd, sizeof(cmd), "python3 %s/tests/model/ref_llama.py '%s' tokenize %s", src ? src : ".", path, args);
    int rc = system(cmd);
    rc = rc == -1 || !WIFEXITED(rc) ? -1 : WEXITSTATUS(rc);
    if (rc == 77)
        skip();
    assert_int_equal(rc, 0);
    for (size_t p = 0; p < np; p++) {
        char out[300];
        snprintf(out, sizeof(out), "%s/ids%zu.txt", tmpdir, p);
        int32_t *ids;
        size_t n;
        assert_int_equal(mdl_tok_encode(mdl_model_tok(m), prompts[p], strlen(prompts[p]), false, &ids, &n), RI_OK);
        FILE *f = fopen(out, "r");
        assert_non_null(f);
        size_t k = 0;
        int v;
        while (fscanf(f, "%d", &v) == 1) {
            assert_true(k < n);
            assert_int_equal(ids[k], v);
            k++;
        }
        fclose(f);
        assert_int_equal(k, n);
        char *back;
        assert_int_equal(mdl_tok_decode(mdl_model_tok(m), ids, n, false, &back), RI_OK);
        assert_string_equal(back, prompts[p]);
        cm_free(back);
        cm_free(ids);
    }
    mdl_model_destroy(m);
}

static void test_logits_match_reference(void **state)
{
    const char *path = *state;
    char err[512];
    mdl_model_t *m;
    assert_int_equal(mdl_model_load(path, &m, err, sizeof(err)), RI_OK);
    const mdl_hparams_t *hp = mdl_model_hparams(m);
    size_t np = sizeof(prompts) / sizeof(prompts[0]), V = hp->n_vocab;
    float *ours = malloc(np * NPOS * V * sizeof(float));
    float *ref = malloc(np * NPOS * V * sizeof(float));
    float *dec = malloc(np * V * sizeof(float));   /* position NPOS-1 through the decode path */
    float *dec8 = malloc(np * V * sizeof(float));  /* the same with int8 activations */
    assert_non_null(dec);
    assert_non_null(dec8);
    assert_non_null(ours);
    assert_non_null(ref);
    char in[300], out[300];
    snprintf(in, sizeof(in), "%s/tokens.txt", tmpdir);
    snprintf(out, sizeof(out), "%s/logits.bin", tmpdir);
    FILE *f = fopen(in, "w");
    assert_non_null(f);
    for (size_t p = 0; p < np; p++) {
        int32_t *ids;
        size_t n;
        assert_int_equal(mdl_tok_encode(mdl_model_tok(m), prompts[p], strlen(prompts[p]), false, &ids, &n), RI_OK);
        assert_true(n >= NPOS);
        for (size_t i = 0; i < NPOS; i++)
            fprintf(f, "%d%c", ids[i], i + 1 == NPOS ? '\n' : ' ');
        mdl_seq_t *s;
        assert_int_equal(mdl_seq_create(m, mdl_attn_find("full"), NULL, NPOS, &s), RI_OK);
        /* two chunks of 4, so that chunked prefill is what is checked */
        mdl_model_set_chunk(m, 4);
        assert_int_equal(mdl_prefill(m, s, ids, NPOS, NULL, ours + p * NPOS * V, NULL, NULL), RI_OK);
        mdl_seq_destroy(s);
        /* the same last position through prefill of NPOS-1 + one decode step
         * (int16 activations, the kernels' flash decode) */
        assert_int_equal(mdl_seq_create(m, mdl_attn_find("full"), NULL, NPOS, &s), RI_OK);
        assert_int_equal(mdl_prefill(m, s, ids, NPOS - 1, NULL, NULL, NULL, NULL), RI_OK);
        mdl_seq_t *one[1] = {s};
        assert_int_equal(mdl_decode(m, one, &ids[NPOS - 1], 1, dec + p * V), RI_OK);
        mdl_seq_destroy(s);
        /* and with int8 activations (opt-in fast decode): same argmax, looser bound */
        mdl_quant_q8_activations(true);
        assert_int_equal(mdl_seq_create(m, mdl_attn_find("full"), NULL, NPOS, &s), RI_OK);
        assert_int_equal(mdl_prefill(m, s, ids, NPOS - 1, NULL, NULL, NULL, NULL), RI_OK);
        one[0] = s;
        assert_int_equal(mdl_decode(m, one, &ids[NPOS - 1], 1, dec8 + p * V), RI_OK);
        mdl_seq_destroy(s);
        mdl_quant_q8_activations(false);
        cm_free(ids);
    }
    fclose(f);
    int rc = run_ref(path, "logits", in, out);
    if (rc == 77)
        skip();
    assert_int_equal(rc, 0);
    f = fopen(out, "rb");
    assert_non_null(f);
    assert_int_equal(fread(ref, sizeof(float), np * NPOS * V, f), np * NPOS * V);
    fclose(f);
    double worst = 0;
    for (size_t r = 0; r < np * (NPOS + 1); r++) {
        /* rows np*NPOS.. are the decode-path rows, checked against the last position */
        bool is_dec = r >= np * NPOS;
        size_t rr = is_dec ? (r - np * NPOS) * NPOS + NPOS - 1 : r;
        const float *a = is_dec ? dec + (r - np * NPOS) * V : ours + r * V, *b = ref + rr * V;
        float lo = b[0], hi = b[0];
        double md = 0;
        for (size_t i = 0; i < V; i++) {
            lo = b[i] < lo ? b[i] : lo;
            hi = b[i] > hi ? b[i] : hi;
            double d = fabs((double)a[i] - b[i]);
            md = d > md ? d : md;
        }
        double rel = md / (hi - lo);
        worst = rel > worst ? rel : worst;
        if (rel > 1e-2 || mdl_argmax(a, V) != mdl_argmax(b, V))
            fail_msg("prompt %zu pos %zu%s: max|dlogit| %.4f = %.5f of range %.2f, argmax %d vs %d", rr / NPOS,
                     rr % NPOS, is_dec ? " (decode)" : "", md, rel, hi - lo, mdl_argmax(a, V), mdl_argmax(b, V));
        if (is_dec)
            printf("prompt %zu decode step: max |dlogit| / range %.2e\n", rr / NPOS, rel);
    }
    printf("max |dlogit| / range over %zu positions: %.2e (limit 1e-2)\n", np * (NPOS + 1), worst);
    for (size_t p = 0; p < np; p++) {
        const float *a = dec8 + p * V, *b = ref + (p * NPOS + NPOS - 1) * V;
        float lo = b[0], hi = b[0];
        double md = 0;
        for (size_t i = 0; i < V; i++) {
            lo = b[i] < lo ? b[i] : lo;
            hi = b[i] > hi ? b[i] : hi;
            md = fmax(md, fabs((double)a[i] - b[i]));
        }
        printf("prompt %zu decode step, int8 activations: max |dlogit| / range %.2e (limit 3e-2)\n", p,
               md / (hi - lo));
        assert_true(md / (hi - lo) <= 3e-2);
        assert_int_equal(mdl_argmax(a, V), mdl_argmax(b, V));
    }
    free(dec8);
    free(dec);
    free(ours);
    free(ref);
    mdl_model_destroy(m);
}

/* A batch of sequences decodes as each one alone (same positions, same logits). */
static void test_batch_decode_matches_single(void **state)
{
    const char *path = *state;
    char err[512];
    mdl_model_t *m;
    assert_int_equal(mdl_model_load(path, &m, err, sizeof(err)), RI_OK);
    size_t V = mdl_model_hparams(m)->n_vocab, nb = 5;
    mdl_seq_t *batch[5], *one[1];
    int32_t next[5];
    float *lb = malloc(nb * V * sizeof(float)), *l1 = malloc(V * sizeof(float));
    for (size_t b = 0; b < nb; b++) {
        const char *p = prompts[b % 3];
        int32_t *ids;
        size_t n;
        assert_int_equal(mdl_tok_encode(mdl_model_tok(m), p, strlen(p), false, &ids, &n), RI_OK);
        n = n > 4 + b ? 4 + b : n;   /* different lengths */
        assert_int_equal(mdl_seq_create(m, mdl_attn_find("full"), NULL, n + 4, &batch[b]), RI_OK);
        assert_int_equal(mdl_prefill(m, batch[b], ids, n, l1, NULL, NULL, NULL), RI_OK);
        next[b] = mdl_argmax(l1, V);
        cm_free(ids);
    }
    assert_int_equal(mdl_decode(m, batch, next, nb, lb), RI_OK);
    for (size_t b = 0; b < nb; b++) {
        /* the same step alone, on a copy taken before the step */
        mdl_seq_t *s;
        assert_int_equal(mdl_seq_create(m, mdl_attn_find("full"), NULL, mdl_seq_cap(batch[b]), &s), RI_OK);
        assert_int_equal(mdl_kv_copy((mdl_kv_t *)mdl_seq_kv(s), mdl_seq_kv(batch[b]), mdl_seq_len(batch[b]) - 1),
                         RI_OK);
        one[0] = s;
        assert_int_equal(mdl_decode(m, one, &next[b], 1, l1), RI_OK);
        double md = 0;
        for (size_t i = 0; i < V; i++)
            md = fmax(md, fabs((double)l1[i] - lb[b * V + i]));
        printf("batch row %zu: max |dlogit| vs alone %.2e\n", b, md);
        assert_true(md < 2e-2);   /* batch products sum in another order (3x4 blocks) */
        assert_int_equal(mdl_argmax(l1, V), mdl_argmax(lb + b * V, V));
        mdl_seq_destroy(s);
    }
    /* the same sequence twice in one batch is refused */
    mdl_seq_t *dup[2] = {batch[0], batch[0]};
    assert_int_equal(mdl_decode(m, dup, next, 2, lb), RI_ERR_INVALID);
    for (size_t b = 0; b < nb; b++)
        mdl_seq_destroy(batch[b]);
    free(lb), free(l1);
    mdl_model_destroy(m);
}

int main(void)
{
    const char *path = tm_model_path_or_skip();
    if (system("python3 -c 'import numpy, gguf' 2>/dev/null") != 0) {
        fprintf(stderr, "skip: python3 with numpy and gguf is needed (./ri setup installs them)\n");
        return 77;
    }
    snprintf(tmpdir, sizeof(tmpdir), "/tmp/ri-test-model-ref-XXXXXX");
    if (mkdtemp(tmpdir) == NULL)
        return 1;
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_prestate(test_tokenizer_matches_reference, (void *)path),
        cmocka_unit_test_prestate(test_logits_match_reference, (void *)path),
        cmocka_unit_test_prestate(test_batch_decode_matches_single, (void *)path),
    };
    int rc = cmocka_run_group_tests(tests, NULL, NULL);
    char cmd[400];
    snprintf(cmd, sizeof(cmd), "rm -rf '%s'", tmpdir);
    if (system(cmd) != 0)
        fprintf(stderr, "could not remove %s\n", tmpdir);
    return rc;
}
