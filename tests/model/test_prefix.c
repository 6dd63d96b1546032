/*
 * Prefix reuse in the model runtime, on the real SmolLM2: sequence A
 * prefills a 1,536-token prompt; sequence B preloads A's K/V of the first
 * three 256-token blocks (mdl_seq_preload), is handed A's wave-index pieces
 * of those blocks (cfg.prefix), and prefills only the rest.  B's logits
 * after the prefill equal A's, greedy decoding gives the same 16 tokens,
 * and with "retroinfer" B's wave index (imported blocks + its own) equals
 * A's bit for bit.  Skipped (77) without the model.
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
#include "gpuworker/model/mdl_model.h"
#include "kernels/kn_wave.h"
#include "tests/kernels/kn_test_index.h"
#include "tm_util.h"

#define TP_N 1536u      /* prompt tokens */
#define TP_BLOCKS 3u    /* leading blocks taken from A */
#define TP_GEN 16u      /* greedy tokens compared */

static mdl_model_t *tp_model;
static int32_t tp_prompt[TP_N];

static int tp_setup(void **state)
{
    char err[512], text[64 * 1024];
    size_t len = 0, n = 0;
    int32_t *ids = NULL;
    (void)state;
    const char *path = tm_model_path_or_skip();
    if (mdl_model_load(path, &tp_model, err, sizeof(err)) != RI_OK) {
        fprintf(stderr, "cannot load %s: %s\n", path, err);
        return -1;
    }
    for (int i = 0; len + 128 < sizeof(text); i++)
        len += (size_t)snprintf(text + len, sizeof(text) - len,
                                "Entry %d of the ledger: crate %d left the harbour for town %d. ", i, i * 37 % 1000,
                                i * 11 % 97);
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
    assert_int_equal(mdl_decode(tp_model, &s, &out[TP_GEN - 1], 1, scratch), RI_OK); /* index built in any case */
}

/* A's K/V as B's preload. */
static ri_status_t tp_fill(void *arg, uint32_t layer, uint32_t kv_head, size_t pos0, size_t n, cm_fp16_t *k,
                           cm_fp16_t *v, size_t token_stride)
{
    const mdl_kv_t *kv = mdl_seq_kv(arg);
    size_t d = kv->geom.head_dim;
    for (size_t t = 0; t < n; t++) {
        memcpy(k + t * token_stride, mdl_kv_krow(kv, layer, kv_head, pos0 + t), d * sizeof(cm_fp16_t));
        memcpy(v + t * token_stride, mdl_kv_vrow(kv, layer, kv_head, pos0 + t), d * sizeof(cm_fp16_t));
    }
    return RI_OK;
}

/* A's wave-index pieces of the leading blocks, per layer. */
typedef struct tp_layer_src {
    const mdl_seq_t *a;
    uint32_t layer, sink, block;
    unsigned *gets;
    kn_wave_pieces_t pieces;
} tp_layer_src_t;

static ri_status_t tp_get(void *ctx, uint32_t b, uint32_t kv_head, kn_wave_piece_t *pc)
{
    tp_layer_src_t *ls = ctx;
    const kn_index_t *idx = mdl_seq_wave_index(ls->a, ls->layer, kv_head);
    ri_status_t st;
    if (idx == NULL)
        return RI_ERR_NOT_FOUND;
    if ((st = kn_test_block_piece(idx, b * ls->block, b == 0 ? ls->sink : b * ls->block, ls->block, pc)) != RI_OK)
        return st;
    (*ls->gets)++;
    return RI_OK;
}

static const kn_wave_pieces_t *tp_pieces(void *ctx, uint32_t layer)
{
    tp_layer_src_t *ls = (tp_layer_src_t *)ctx + layer;
    return mdl_seq_wave_index(ls->a, layer, 0) != NULL ? &ls->pieces : NULL;
}

static void tp_expect_index_equal(const kn_index_t *a, const kn_index_t *b)
{
    assert_non_null(a);
    assert_non_null(b);
    assert_int_equal(a->n_clusters, b->n_clusters);
    assert_int_equal(a->n_tokens, b->n_tokens);
    assert_memory_equal(a->sizes, b->sizes, a->n_clusters * sizeof(uint32_t));
    assert_memory_equal(a->offsets, b->offsets, (a->n_clusters + 1) * sizeof(uint32_t));
    assert_memory_equal(a->perm, b->perm, a->n_tokens * sizeof(uint32_t));
    assert_memory_equal(a->centroids, b->centroids, (size_t)a->n_clusters * a->head_dim);
    assert_memory_equal(a->cscale, b->cscale, a->n_clusters * sizeof(float));
    assert_memory_equal(a->vq, b->vq, (size_t)a->n_clusters * a->head_dim);
    assert_memory_equal(a->vscale, b->vscale, a->n_clusters * sizeof(float));
}

static void tp_run(const char *method)
{
    const mdl_hparams_t *hp = mdl_model_hparams(tp_model);
    size_t nv = hp->n_vocab, pre;
    mdl_attn_cfg_t cfg;
    mdl_seq_t *a, *b;
    float *la = malloc(nv * sizeof(float)), *lb = malloc(nv * sizeof(float)), *scratch = malloc(nv * sizeof(float));
    int32_t ga[TP_GEN], gb[TP_GEN];
    unsigned gets = 0;
    tp_layer_src_t *ls = calloc(hp->n_layers, sizeof(*ls));
    bool retro = strcmp(method, "retroinfer") == 0;

    assert_non_null(la);
    assert_non_null(lb);
    assert_non_null(scratch);
    assert_non_null(ls);
    mdl_attn_cfg_default(&cfg);
    pre = (size_t)TP_BLOCKS * cfg.wave.segment_tokens;
    assert_int_equal(mdl_seq_create(tp_model, mdl_attn_find(method), &cfg, TP_N + TP_GEN + 1, &a), RI_OK);
    assert_int_equal(mdl_prefill(tp_model, a, tp_prompt, TP_N, la, NULL, NULL, NULL), RI_OK);
    tp_greedy(a, la, ga, scratch, nv);
    assert_true(retro == (mdl_seq_wave_index(a, 0, 0) != NULL));

    for (uint32_t l = 0; l < hp->n_layers; l++)
        ls[l] = (tp_layer_src_t){.a = a, .layer = l, .sink = cfg.wave.sink_tokens, .block = cfg.wave.segment_tokens,
                                 .gets = &gets, .pieces = {.ctx = &ls[l], .n_blocks = TP_BLOCKS, .get = tp_get}};
    mdl_prefix_src_t src = {.ctx = ls, .n_tokens = pre, .pieces = tp_pieces};
    cfg.prefix = &src;
    assert_int_equal(mdl_seq_create(tp_model, mdl_attn_find(method), &cfg, TP_N + TP_GEN + 1, &b), RI_OK);
    assert_int_equal(mdl_seq_preload(b, pre, tp_fill, a), RI_OK);
    assert_int_equal(mdl_seq_len(b), pre);
    assert_int_equal(mdl_seq_preload(b, pre, tp_fill, a), RI_ERR_INVALID); /* not empty any more */
    assert_int_equal(mdl_prefill(tp_model, b, tp_prompt + pre, TP_N - pre, lb, NULL, NULL, NULL), RI_OK);
    assert_int_equal(mdl_seq_len(b), TP_N);

    float lo = la[0], hi = la[0], diff = 0;
    for (size_t i = 0; i < nv; i++) {
        lo = fminf(lo, la[i]);
        hi = fmaxf(hi, la[i]);
        diff = fmaxf(diff, fabsf(la[i] - lb[i]));
    }
    if (!(diff <= 1e-5f * (hi - lo)))
        fprintf(stderr, "%s: logits differ by %g (range %g)\n", method, diff, hi - lo);
    assert_true(diff <= 1e-5f * (hi - lo));
    tp_greedy(b, lb, gb, scratch, nv);
    assert_memory_equal(ga, gb, sizeof(ga));
    if (retro) {
        assert_int_equal(gets, hp->n_layers * hp->n_kv_heads * TP_BLOCKS); /* imported, not clustered again */
        for (uint32_t l = 0; l < hp->n_layers; l++)
            for (uint32_t h = 0; h < hp->n_kv_heads; h++)
                tp_expect_index_equal(mdl_seq_wave_index(a, l, h), mdl_seq_wave_index(b, l, h));
    } else {
        assert_int_equal(gets, 0);
        assert_null(mdl_seq_wave_index(b, 0, 0));
    }
    mdl_seq_destroy(b);
    mdl_seq_destroy(a);
    free(ls);
    free(la);
    free(lb);
    free(scratch);
}

static void test_prefix_full(void **state)
{
    (void)state;
    tp_run("full");
}

static void test_prefix_retroinfer(void **state)
{
    (void)state;
    tp_run("retroinfer");
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_prefix_full),
        cmocka_unit_test(test_prefix_retroinfer),
    };
    return cmocka_run_group_tests(tests, tp_setup, tp_teardown);
}
