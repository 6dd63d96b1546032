/*
 * Prefix blocks through the real model (no daemon): sequence A prefills a
 * 1,536-token prompt and decodes; its leading blocks are built into "RIPB"
 * blocks (gw_pfx_block_build), parsed back into a set, and sequence B
 * preloads their K/V and imports their wave-index pieces, then prefills
 * only the rest.  B's logits after the prefill are within 1e-5 of the
 * logits' range of A's, greedy decoding gives the same tokens, and with
 * "retroinfer" B's index equals A's bit for bit.  argv[1]: the model name
 * (smollm2-135m, gemma3-270m: sliding-window layers without an index);
 * skipped (77) when it is not installed.
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
#include "gpuworker/client/gw_prefix.h"
#include "gpuworker/model/mdl_model.h"
#include "kernels/kn_wave.h"
#include "tests/model/tm_util.h"

#define TP_N   1536u /* prompt tokens */
#define TP_GEN 12u   /* greedy tokens compared */

static mdl_model_t *tp_model;
static int32_t tp_prompt[TP_N];
static const char *tp_name = "smollm2-135m";

static int tp_setup(void **state)
{
    char err[512], path[4096], text[64 * 1024];
    size_t len = 0, n = 0;
    int32_t *ids = NULL;
    (void)state;
    tm_runtime_setup();
    if (mdl_model_resolve(tp_name, path, sizeof(path)) != RI_OK) {
        fprintf(stderr, "skip: no model %s at %s\n", tp_name, path);
        exit(77);
    }
    if (mdl_model_load(path, &tp_model, err, sizeof(err)) != RI_OK) {
        fprintf(stderr, "cannot load %s: %s\n", path, err);
        return -1;
    }
    for (int i = 0; len + 128 < sizeof(text); i++)
        len += (size_t)snprintf(text + len, sizeof(text) - len,
                                "Ledger line %d: barrel %d went by cart to village %d. ", i, i * 53 % 1000, i * 7 % 89);
    if (mdl_tok_encode_prompt(mdl_model_tok(tp_model), text, len, &ids, &n) != RI_OK || n < TP_N) {
        cm_free(ids);
        return -1;
    }
    memcpy(tp_prompt, ids, sizeof(tp_prompt));
    cm_free(ids);
    return 0;
}

static int tp_teardown(void **state)
{
    (void)state;
    mdl_model_destroy(tp_model);
    return 0;
}

static size_t tp_argmax(const float *x, size_t n)
{
    size_t b = 0;
    for (size_t i = 1; i < n; i++)
        if (x[i] > x[b])
            b = i;
    return b;
}

/* Greedy decode of TP_GEN tokens after the prefill's logits. */
static void tp_greedy(mdl_seq_t *s, const float *logits0, int32_t *out, float *scratch, size_t nv)
{
    out[0] = (int32_t)tp_argmax(logits0, nv);
    for (uint32_t i = 1; i < TP_GEN; i++) {
        assert_int_equal(mdl_decode(tp_model, &s, &out[i - 1], 1, scratch), RI_OK);
        out[i] = (int32_t)tp_argmax(scratch, nv);
    }
}

static const kn_index_t *tp_index(void *ctx, uint32_t layer, uint32_t kv_head)
{
    return mdl_seq_wave_index(ctx, layer, kv_head);
}

static void tp_expect_index_equal(const kn_index_t *a, const kn_index_t *b)
{
    assert_true((a == NULL) == (b == NULL));
    if (a == NULL)
        return;
    assert_int_equal(a->n_clusters, b->n_clusters);
    assert_int_equal(a->n_tokens, b->n_tokens);
    assert_memory_equal(a->sizes, b->sizes, a->n_clusters * sizeof(uint32_t));
    assert_memory_equal(a->perm, b->perm, a->n_tokens * sizeof(uint32_t));
    assert_memory_equal(a->centroids, b->centroids, (size_t)a->n_clusters * a->head_dim);
    assert_memory_equal(a->cscale, b->cscale, a->n_clusters * sizeof(float));
    assert_memory_equal(a->vq, b->vq, (size_t)a->n_clusters * a->head_dim);
    assert_memory_equal(a->vscale, b->vscale, a->n_clusters * sizeof(float));
}

static void tp_run(const char *method)
{
    const mdl_hparams_t *hp = mdl_model_hparams(tp_model);
    size_t nv = hp->n_vocab;
    bool retro = strcmp(method, "retroinfer") == 0;
    mdl_attn_cfg_t cfg;
    mdl_seq_t *a, *b;
    gw_pfx_layout_t lay;
    gw_pfx_set_t *set = NULL;
    uint8_t *bufs[16] = { 0 };
    float *la = malloc(nv * sizeof(float)), *lb = malloc(nv * sizeof(float)), *scratch = malloc(nv * sizeof(float));
    int32_t ga[TP_GEN], gb[TP_GEN];

    assert_non_null(la);
    assert_non_null(lb);
    assert_non_null(scratch);
    mdl_attn_cfg_default(&cfg);
    gw_pfx_layout_init(hp, &cfg.wave, retro,
                       kn_wave_cluster_tokens(&cfg.wave, TP_N - cfg.wave.sink_tokens - cfg.wave.window_tokens), 1,
                       &lay);
    uint32_t nb = gw_pfx_max_blocks(&lay, cfg.wave.window_tokens, TP_N);
    size_t pre = (size_t)nb * lay.block_tokens;
    assert_true(nb >= 4 && nb <= 16);

    assert_int_equal(mdl_seq_create(tp_model, mdl_attn_find(method), &cfg, TP_N + TP_GEN + 1, &a), RI_OK);
    assert_int_equal(mdl_prefill(tp_model, a, tp_prompt, TP_N, la, NULL, NULL, NULL), RI_OK);
    tp_greedy(a, la, ga, scratch, nv); /* the first step builds the index */

    gw_pfx_src_t src = { mdl_seq_kv(a), a, retro ? tp_index : NULL };
    assert_int_equal(gw_pfx_set_create(&lay, nb, &set), RI_OK);
    for (uint32_t i = 0; i < nb; i++) {
        uint64_t len = 0;
        assert_int_equal(gw_pfx_block_build(&lay, &src, i, &bufs[i], &len), RI_OK);
        assert_int_equal(gw_pfx_set_add(set, bufs[i], len), RI_OK);
    }
    mdl_prefix_src_t psrc = { .ctx = set, .n_tokens = pre, .pieces = gw_pfx_set_pieces };
    cfg.prefix = &psrc;
    assert_int_equal(mdl_seq_create(tp_model, mdl_attn_find(method), &cfg, TP_N + TP_GEN + 1, &b), RI_OK);
    assert_int_equal(mdl_seq_preload(b, pre, gw_pfx_set_fill, set), RI_OK);
    assert_int_equal(mdl_prefill(tp_model, b, tp_prompt + pre, TP_N - pre, lb, NULL, NULL, NULL), RI_OK);

    float lo = la[0], hi = la[0], diff = 0;
    for (size_t i = 0; i < nv; i++) {
        lo = fminf(lo, la[i]);
        hi = fmaxf(hi, la[i]);
        diff = fmaxf(diff, fabsf(la[i] - lb[i]));
    }
    fprintf(stderr, "%s, %s: %u blocks (%zu tokens) preloaded; logits differ by %g (range %g)\n", tp_name, method, nb,
            pre, diff, hi - lo);
    assert_true(diff <= 1e-5f * (hi - lo));
    tp_greedy(b, lb, gb, scratch, nv);
    assert_memory_equal(ga, gb, sizeof(ga));
    if (retro) {
        uint32_t indexed = 0;
        for (uint32_t l = 0; l < hp->n_layers; l++)
            for (uint32_t h = 0; h < hp->n_kv_heads; h++) {
                indexed += mdl_seq_wave_index(a, l, h) != NULL;
                tp_expect_index_equal(mdl_seq_wave_index(a, l, h), mdl_seq_wave_index(b, l, h));
            }
        assert_true(indexed > 0);
    }
    mdl_seq_destroy(b);
    mdl_seq_destroy(a);
    gw_pfx_set_destroy(set);
    for (uint32_t i = 0; i < nb; i++)
        cm_free(bufs[i]);
    free(la);
    free(lb);
    free(scratch);
}

static void test_full(void **state)
{
    (void)state;
    tp_run("full");
}

static void test_retroinfer(void **state)
{
    (void)state;
    tp_run("retroinfer");
}

int main(int argc, char **argv)
{
    if (argc > 1)
        tp_name = argv[1];
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_full),
        cmocka_unit_test(test_retroinfer),
    };
    return cmocka_run_group_tests(tests, tp_setup, tp_teardown);
}
