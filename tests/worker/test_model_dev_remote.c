/*
 * "retroinfer-remote" on the device engine (mdl_dev.h) against the CPU
 * runtime's in-process "retroinfer-remote", both over a real ri-kvstore on
 * loopback: a synthetic llama and a synthetic Gemma 3 at head_dim 64
 * (tm_synth_shape_wave), small wave settings (the prompt indexes, the steps
 * update), 64 greedy steps; per step the same argmax and logits within
 * 1e-3 of the CPU's range, and the same layer-steps decoded (over the host
 * stand-ins also the same tokens attended exactly).  Two device sequences: one uploaded from
 * the CPU's K/V (indexed at upload), one prefilled on the device (indexed
 * at its first decode step).
 *
 * test_model_dev_remote_host links the engine's C files with the host
 * stand-ins of its kernels (tests/model/mdl_dev_host_kern.c): the cpu table
 * is registered as "cuda" and its memory space is the host's, so the
 * session's cache space and every copy are the host's too.  It checks the
 * engine's and the backend's host side, nothing of the CUDA kernels or of
 * device memory.  test_model_dev_remote (CUDA builds) is the same file
 * over the real engine: there the cache view, the block cache and the
 * execution buffers are device memory; exits 77 without a CUDA device.
 * Both exit 77 when the kvstore cannot start here.
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
#include <unistd.h>

#include <cmocka.h>

#include "gpuworker/client/gw_attn_remote.h"
#include "gpuworker/model/mdl_attn.h"
#include "gpuworker/model/mdl_dev.h"
#include "gpuworker/model/mdl_model.h"
#include "gpuworker/model/mdl_sample.h"
#include "kernels/kn_ops.h"
#include "tm_synth.h"
#include "tm_util.h"
#include "wk_test_util.h"

#define TR_STEPS 64
#define TR_PROMPT 100
#define TR_TOL 1e-3 /* fp16 weights on both sides */

static wk_env_t tr_env;

/* One CPU sequence and one device sequence from the same prompt, 64
 * greedy steps fed the CPU's argmax; on_device: the device sequence is
 * prefilled on the device, else uploaded from the CPU's. */
static void tr_run(mdl_model_t *m, mdl_dev_t *d, bool on_device)
{
    const mdl_attn_ops_t *be = mdl_attn_find(GW_ATTN_REMOTE_NAME);
    const mdl_hparams_t *hp = mdl_model_hparams(m);
    size_t V = hp->n_vocab, cap = TR_PROMPT + TR_STEPS + 1;
    mdl_attn_cfg_t cfg;
    mdl_seq_t *cpu = NULL;
    mdl_dev_seq_t *dev = NULL;
    char err[512] = "";
    float *lc = malloc(V * sizeof(float)), *lg = malloc(V * sizeof(float));
    int32_t ids[TR_PROMPT];
    double worst = 0;

    assert_non_null(be);
    assert_true(be->device_ok);
    assert_true(lc != NULL && lg != NULL);
    tm_synth_wave_cfg(&cfg);
    for (size_t i = 0; i < TR_PROMPT; i++)
        ids[i] = (int32_t)((i * 37 + 5) % V);
    assert_int_equal(mdl_seq_create(m, be, &cfg, cap, &cpu), RI_OK);
    assert_int_equal(mdl_prefill(m, cpu, ids, TR_PROMPT, lc, NULL, NULL, NULL), RI_OK);
    ri_status_t st = mdl_dev_seq_create_attn(d, cap, GW_ATTN_REMOTE_NAME, &cfg, &dev, err, sizeof(err));
    if (st != RI_OK)
        fprintf(stderr, "mdl_dev_seq_create_attn: %s\n", err);
    assert_int_equal(st, RI_OK);
    if (on_device) {
        assert_int_equal(mdl_dev_prefill(d, dev, ids, TR_PROMPT, lg), RI_OK);
        assert_true(tm_logit_ratio(lc, lg, V) <= TR_TOL);
        /* The CPU decodes on from the device's K/V bits: the prefills' K/V
         * differ in a last fp16 bit here and there, which the index's int8
         * value means round to a whole step now and then (test_model_dev.c,
         * td_prefill_on); the decode paths are what is compared here. */
        mdl_seq_t *down = NULL;
        assert_int_equal(mdl_seq_create(m, be, &cfg, cap, &down), RI_OK);
        assert_int_equal(mdl_dev_seq_download(d, dev, down), RI_OK);
        mdl_seq_destroy(cpu);
        cpu = down;
    } else {
        assert_int_equal(mdl_dev_seq_upload(d, dev, cpu), RI_OK);
    }
    int32_t tok = mdl_argmax(lc, V);
    for (int s = 0; s < TR_STEPS; s++) {
        assert_int_equal(mdl_decode(m, &cpu, &tok, 1, lc), RI_OK);
        assert_int_equal(mdl_dev_decode(d, &dev, &tok, 1, lg), RI_OK);
        double r = tm_logit_ratio(lc, lg, V);
        int32_t ac = mdl_argmax(lc, V), ag = mdl_argmax(lg, V);
        if (s % 16 == 0 || r > TR_TOL || ac != ag)
            printf("  step %d: ratio %.2e, argmax cpu %d device %d\n", s, r, ac, ag);
        worst = r > worst || isnan(r) ? r : worst;
        assert_false(isnan(r));
        assert_true(r <= TR_TOL);
        assert_int_equal(ac, ag);
        tok = ac;
    }
    mdl_attn_stats_t cs, ds;
    mdl_seq_attn_stats(cpu, &cs);
    mdl_dev_seq_attn_stats(dev, &ds);
    uint64_t dense = 0; /* what full attention reads over the same layer-steps */
    for (int s = 0; s < TR_STEPS; s++)
        dense += TR_PROMPT + (uint64_t)s + 1;
    dense *= ds.decode_steps / TR_STEPS;
    printf("retroinfer-remote on the device (%s): %llu layer-steps (CPU %llu), %llu tokens exact "
           "(CPU %llu; full would read %llu), cluster size %u; worst ratio %.2e over %d steps\n",
           on_device ? "prefilled on the device" : "uploaded", (unsigned long long)ds.decode_steps,
           (unsigned long long)cs.decode_steps, (unsigned long long)ds.exact_tokens,
           (unsigned long long)cs.exact_tokens, (unsigned long long)dense, ds.tokens_per_cluster, worst, TR_STEPS);
    assert_int_equal(ds.decode_steps, cs.decode_steps);
    assert_true(ds.decode_steps > 0 && ds.exact_tokens < dense);
    assert_int_equal(ds.tokens_per_cluster, 4);
#ifdef TR_HOST_KERNELS
    assert_int_equal(ds.exact_tokens, cs.exact_tokens); /* the same K/V bits, index and sets */
#endif
    mdl_dev_seq_destroy(dev);
    mdl_seq_destroy(cpu);
    free(lc);
    free(lg);
}

static void tr_model(bool gemma)
{
    char path[] = "/tmp/ri-test-dev-remote-XXXXXX", err[512] = "";
    mdl_model_t *m = NULL;
    mdl_dev_t *d = NULL;
    int fd = mkstemp(path);
    assert_true(fd >= 0);
    close(fd);
    printf("synthetic %s\n", gemma ? "gemma3" : "llama");
    assert_true(tm_synth_write_shape(path, gemma, tm_synth_shape_wave(gemma)));
    if (mdl_model_load(path, &m, err, sizeof(err)) != RI_OK)
        fprintf(stderr, "%s: %s\n", path, err);
    assert_non_null(m);
    if (mdl_dev_create(m, &d, err, sizeof(err)) != RI_OK)
        fprintf(stderr, "mdl_dev_create: %s\n", err);
    assert_non_null(d);
    tr_run(m, d, false);
    tr_run(m, d, true);

    /* still refused: a backend that reads host K/V only */
    mdl_attn_cfg_t cfg;
    mdl_dev_seq_t *none = NULL;
    tm_synth_wave_cfg(&cfg);
    assert_int_equal(mdl_dev_seq_create_attn(d, 64, "quest", &cfg, &none, err, sizeof(err)), RI_ERR_UNSUPPORTED);
    assert_null(none);
    mdl_dev_destroy(d);
    mdl_model_destroy(m);
    unlink(path);
}

static void test_llama_remote_on_device_matches_cpu(void **state)
{
    (void)state;
    tr_model(false);
}

/* Gemma 3: its sliding-window layers attend exactly on the device, only
 * the global ones go through the backend (as on the CPU). */
static void test_gemma3_remote_on_device_matches_cpu(void **state)
{
    (void)state;
    tr_model(true);
}

int main(void)
{
    char err[256];
    tm_runtime_setup();
    /* the CPU side's kernels stay the cpu table (mdl_dev_create makes the
     * "cuda" one the default) */
    (void)kn_ops_select("cpu");
    cm_fp16_t w = cm_f32_to_fp16(1.0f);
    float x = 1.0f, y = 0.0f;
    if (mdl_dev_gemv_host(&w, 1, 1, &x, 1, &y) == RI_ERR_NO_DEVICE) {
        fprintf(stderr, "skip: no CUDA device\n");
        return 77;
    }
    int rc = wk_env_start(&tr_env, 256);
    if (rc == 77) {
        printf("test_model_dev_remote: SKIPPED: no kvstore environment (see above)\n");
        return 77;
    }
    if (rc != 0)
        return 1;
    gw_attn_remote_cfg_t rc_cfg = {.address = tr_env.daemon.grpc, .timeout_ms = 5000};
    if (gw_attn_remote_configure(&rc_cfg, err, sizeof(err)) != RI_OK) {
        fprintf(stderr, "cannot configure %s: %s\n", GW_ATTN_REMOTE_NAME, err);
        wk_env_stop(&tr_env);
        return 1;
    }
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_llama_remote_on_device_matches_cpu),
        cmocka_unit_test(test_gemma3_remote_on_device_matches_cpu),
    };
    rc = cmocka_run_group_tests(tests, NULL, NULL);
    gw_attn_remote_shutdown();
    wk_env_stop(&tr_env);
    return rc;
}
