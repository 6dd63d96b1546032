/*
 * Gemma 3's sliding-window layers read only their last 512 tokens, so a
 * sequence with cfg.release_window gives the older K/V of those layers back
 * as it decodes.  One exact prefill of a 1,000-token prompt, then two forks
 * decode 24 greedy steps: one keeps everything, one releases.  Their logits
 * must be equal to the bit (the released tokens are never read), and the
 * releasing one must hold less of the K/V in memory (mincore): at least the
 * 15 local layers' tokens before the window.  A build that releases inside
 * the window changes the logits; one that releases nothing keeps the bytes.
 * Skipped (77) without the Gemma 3 model.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <cmocka.h>

#include "gpuworker/model/mdl_kv_mem.h"
#include "gpuworker/model/mdl_model.h"
#include "tm_util.h"
#include "gpuworker/model/mdl_sample.h"

#define GW_PROMPT 1000
#define GW_STEPS 24

static void test_release_keeps_logits(void **state)
{
    char path[4096], err[512];
    mdl_model_t *m;
    mdl_seq_t *base, *keep, *rel;
    mdl_attn_cfg_t cfg;
    (void)state;

    if (mdl_model_resolve("gemma3-270m", path, sizeof(path)) != RI_OK) {
        fprintf(stderr, "skip: no Gemma 3 model at %s (./ri setup installs it)\n", path);
        exit(77);
    }
    assert_int_equal(mdl_model_load(path, &m, err, sizeof(err)), RI_OK);
    const mdl_hparams_t *hp = mdl_model_hparams(m);
    uint32_t win = 0, n_local = 0;
    for (uint32_t l = 0; l < hp->n_layers; l++) {
        uint32_t w = mdl_model_layer_window(m, l);
        win = w > win ? w : win;
        n_local += w > 0;
    }
    assert_true(win > 0 && win + 256 < GW_PROMPT);
    int32_t *ids = malloc(GW_PROMPT * sizeof(int32_t));
    for (size_t i = 0; i < GW_PROMPT; i++)
        ids[i] = (int32_t)(1000 + (i * 7919) % 20000); /* any tokens: the check is equality */
    float *lg = malloc(hp->n_vocab * sizeof(float)), *lk = malloc(hp->n_vocab * sizeof(float)),
          *lr = malloc(hp->n_vocab * sizeof(float));
    assert_int_equal(mdl_seq_create(m, mdl_attn_find("full"), NULL, GW_PROMPT + GW_STEPS + 1, &base), RI_OK);
    assert_int_equal(mdl_prefill(m, base, ids, GW_PROMPT, lg, NULL, NULL, NULL), RI_OK);
    mdl_attn_cfg_default(&cfg);
    assert_int_equal(mdl_seq_fork(base, mdl_attn_find("full"), &cfg, &keep), RI_OK);
    cfg.release_window = true;
    assert_int_equal(mdl_seq_fork(base, mdl_attn_find("full"), &cfg, &rel), RI_OK);
    int32_t tk = mdl_argmax(lg, hp->n_vocab), tr = tk;
    for (int s = 0; s < GW_STEPS; s++) {
        mdl_seq_t *a[1] = {keep}, *b[1] = {rel};
        assert_int_equal(mdl_decode(m, a, &tk, 1, lk), RI_OK);
        assert_int_equal(mdl_decode(m, b, &tr, 1, lr), RI_OK);
        assert_memory_equal(lk, lr, hp->n_vocab * sizeof(float));
        tk = mdl_argmax(lk, hp->n_vocab);
        tr = mdl_argmax(lr, hp->n_vocab);
    }
    uint64_t bk = mdl_kv_resident_bytes(mdl_seq_kv(keep)), br = mdl_kv_resident_bytes(mdl_seq_kv(rel));
    /* K and V of the local layers' tokens before the window, less a page a head at each end */
    uint64_t expect = (uint64_t)n_local * hp->n_kv_heads * 2 * (GW_PROMPT - win - 256) * hp->head_dim * 2;
    printf("resident K/V after %d steps: %llu KiB kept, %llu KiB with the windows released (%.0f%%; at least "
           "%llu KiB expected back)\n", GW_STEPS, (unsigned long long)(bk >> 10), (unsigned long long)(br >> 10),
           100.0 * (double)br / (double)bk, (unsigned long long)(expect >> 10));
    assert_true(bk > br && bk - br >= expect);
    mdl_seq_destroy(keep);
    mdl_seq_destroy(rel);
    mdl_seq_destroy(base);
    free(ids);
    free(lg);
    free(lk);
    free(lr);
    mdl_model_destroy(m);
}

int main(void)
{
    tm_runtime_setup();
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_release_keeps_logits),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
