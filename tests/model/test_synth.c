/*
 * The synthetic model (mdl_synth.h) on the CPU:
 *  - the generator is deterministic and equals a plain scalar splitmix64
 *    written out here, at sampled indices of every kind of tensor; seeds
 *    and tensors give different streams; values stay within their bounds;
 *  - the tiny preset's GGUF loads with the preset's hyper-parameters, and
 *    every tensor the CPU model reads equals the device fill kernel's
 *    arithmetic on the host (mdl_synth_fill_ref) and the norm generator;
 *  - the RoPE angles the device engine computes for a synthetic model are
 *    bit for bit the CPU model's;
 *  - the model decodes: finite logits, the same greedy tokens on two loads;
 *  - a preset too large for a file is refused and writes nothing.
 */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>

#include "common/cm_status.h"
#include "gpuworker/model/mdl_backend.h"
#include "gpuworker/model/mdl_quant.h"
#include "gpuworker/model/mdl_sample.h"
#include "gpuworker/model/mdl_synth.h"
#include "gpuworker/model/mdl_synth_gen.h"
#include "tm_util.h"

#define TS_SEED 42u

/* splitmix64 as its authors write it: state += golden; mix. */
static uint64_t ts_splitmix(uint64_t state)
{
    uint64_t z = state + 0x9e3779b97f4a7c15ull;
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

/* The weight as a plain double computation: top 24 bits, centred, scaled. */
static double ts_ref_weight(uint64_t key, uint64_t i, size_t cols)
{
    int64_t draw = (int64_t)(ts_splitmix(key + i) >> 40) - (1 << 23);
    return (double)draw / 8388608.0 * sqrt(3.0 / (double)cols);
}

static void test_generator_matches_reference(void **state)
{
    (void)state;
    const char *names[] = {"token_embd.weight", "blk.0.attn_q.weight", "blk.31.ffn_down.weight", "output.weight"};
    size_t cols[] = {4096, 4096, 14336, 4096};
    for (size_t t = 0; t < 4; t++) {
        uint64_t key = mdl_synth_tensor_key(TS_SEED, names[t]);
        assert_true(key == mdl_synth_tensor_key(TS_SEED, names[t]));            /* deterministic */
        assert_true(key != mdl_synth_tensor_key(TS_SEED + 1, names[t]));        /* seeded */
        float scale = mdl_synth_scale(cols[t]), amp = (float)sqrt(3.0 / (double)cols[t]);
        double sum = 0, sq = 0;
        for (uint64_t k = 0; k < 20000; k++) {
            uint64_t i = k * 7919u * 104729u % (128256ull * 4096ull);   /* spread over a large matrix */
            float w = mdl_synth_weight(key, i, scale);
            double ref = ts_ref_weight(key, i, cols[t]);
            assert_true(fabs(w - ref) <= 1e-6 * fabs(ref) + 1e-12);   /* one float rounding */
            assert_true(w >= -amp && w < amp);
            sum += w;
            sq += (double)w * w;
        }
        /* uniform on [-a, a): mean 0, variance a^2 / 3 = 1 / cols */
        assert_true(fabs(sum / 20000) < 0.02 * amp);
        assert_true(fabs(sq / 20000 * (double)cols[t] - 1.0) < 0.05);
    }
    assert_true(mdl_synth_tensor_key(TS_SEED, "blk.0.attn_q.weight") !=
                mdl_synth_tensor_key(TS_SEED, "blk.1.attn_q.weight"));
    uint64_t nk = mdl_synth_tensor_key(TS_SEED, "blk.0.attn_norm.weight");
    for (uint64_t i = 0; i < 1000; i++) {
        float v = mdl_synth_norm(nk, i);
        assert_true(v >= 0.75f && v < 1.25f);
        assert_true(v == (float)(1.0 + ((double)(int64_t)(ts_splitmix(nk + i) >> 40) - 8388608.0) / 33554432.0));
    }
}

static void test_presets(void **state)
{
    (void)state;
    const mdl_synth_preset_t *p = mdl_synth_preset_find("llama3-8b");
    assert_non_null(p);
    assert_int_equal(p->n_embd, 4096);
    assert_int_equal(p->n_layers, 32);
    assert_int_equal(p->n_heads, 32);
    assert_int_equal(p->n_kv_heads, 8);
    assert_int_equal(p->head_dim, 128);
    assert_int_equal(p->n_ff, 14336);
    assert_int_equal(p->n_vocab, 128256);
    assert_true(p->rope_theta == 500000.0f && p->eps == 1e-5f);
    assert_non_null(mdl_synth_preset_find("tiny"));
    assert_null(mdl_synth_preset_find("llama3-70b"));
    assert_null(mdl_synth_preset_find(NULL));
    /* 8B: 16 GB of fp16, no file */
    assert_true(mdl_synth_gguf_bytes(p) > 15000000000ull);
    char path[] = "/tmp/ri-test-synth-big-XXXXXX", err[256];
    int fd = mkstemp(path);
    assert_true(fd >= 0);
    close(fd);
    unlink(path);
    assert_int_equal(mdl_synth_write_gguf(p, TS_SEED, path, err, sizeof(err)), RI_ERR_RANGE);
    assert_true(strstr(err, "llama3-8b") != NULL);
    assert_int_equal(access(path, F_OK), -1);
}

/* The tiny preset written under seed to a temporary file, loaded. */
static mdl_model_t *ts_load_tiny(uint64_t seed, char *path)
{
    char err[256];
    mdl_model_t *m = NULL;
    strcpy(path, "/tmp/ri-test-synth-XXXXXX");
    int fd = mkstemp(path);
    assert_true(fd >= 0);
    close(fd);
    const mdl_synth_preset_t *p = mdl_synth_preset_find("tiny");
    assert_int_equal(mdl_synth_write_gguf(p, seed, path, err, sizeof(err)), RI_OK);
    FILE *f = fopen(path, "rb");
    assert_non_null(f);
    fseek(f, 0, SEEK_END);
    assert_int_equal((uint64_t)ftell(f), mdl_synth_gguf_bytes(p));
    fclose(f);
    if (mdl_model_load(path, &m, err, sizeof(err)) != RI_OK)
        fail_msg("load %s: %s", path, err);
    return m;
}

/* Tensor name ([rows][cols] fp16) as the CPU model reads it equals the fill
 * kernel's arithmetic on the host. */
static void ts_check_matrix(const mdl_model_t *m, const char *name, size_t rows, size_t cols)
{
    mdl_weight_t w;
    char err[256];
    assert_int_equal(mdl_model_weight(m, name, rows, cols, &w, err, sizeof(err)), RI_OK);
    size_t ld = (cols + 7) / 8 * 8;
    uint16_t *dev = calloc(rows * ld, sizeof(uint16_t));
    float *row = malloc(cols * sizeof(float)), *hook = malloc(cols * sizeof(float));
    assert_true(dev != NULL && row != NULL && hook != NULL);
    uint64_t key = mdl_synth_tensor_key(TS_SEED, name);
    mdl_synth_fill_ref(dev, rows, cols, ld, key, mdl_synth_scale(cols));
    for (size_t r = 0; r < rows; r++) {
        mdl_dequant_row(&w, r, row);
        mdl_synth_row(key, mdl_synth_scale(cols), r, cols, hook);
        for (size_t c = 0; c < cols; c++) {
            assert_true(cm_fp16_to_f32(dev[r * ld + c]) == row[c]);
            assert_true(hook[c] == row[c]);
        }
        for (size_t c = cols; c < ld; c++)
            assert_int_equal(dev[r * ld + c], 0);
    }
    free(dev);
    free(row);
    free(hook);
}

static void test_gguf_equals_device_fill(void **state)
{
    (void)state;
    char path[64], nm[96], err[256];
    mdl_model_t *m = ts_load_tiny(TS_SEED, path);
    const mdl_hparams_t *hp = mdl_model_hparams(m);
    mdl_hparams_t want;
    mdl_synth_hparams(mdl_synth_preset_find("tiny"), &want);
    assert_int_equal(hp->arch, want.arch);
    assert_int_equal(hp->n_layers, want.n_layers);
    assert_int_equal(hp->n_embd, want.n_embd);
    assert_int_equal(hp->n_ff, want.n_ff);
    assert_int_equal(hp->n_heads, want.n_heads);
    assert_int_equal(hp->n_kv_heads, want.n_kv_heads);
    assert_int_equal(hp->head_dim, want.head_dim);
    assert_int_equal(hp->n_rot, want.n_rot);
    assert_int_equal(hp->n_vocab, want.n_vocab);
    assert_int_equal(hp->n_swa, 0);
    assert_true(hp->rope_theta == want.rope_theta && hp->eps == want.eps && hp->rope_scale == want.rope_scale);
    assert_true(hp->embd_scale == want.embd_scale && hp->logit_softcap == 0 && !hp->rope_neox && !hp->qk_norm);
    ts_check_matrix(m, "token_embd.weight", hp->n_vocab, hp->n_embd);
    ts_check_matrix(m, "output.weight", hp->n_vocab, hp->n_embd);
    for (uint32_t l = 0; l < hp->n_layers; l++) {
        for (int w = 0; w < MDL_W_N; w++) {
            mdl_block_tensor_name(l, &mdl_block_weights[w], nm, sizeof(nm));
            ts_check_matrix(m, nm, mdl_dim_size(hp, mdl_block_weights[w].rows),
                            mdl_dim_size(hp, mdl_block_weights[w].cols));
        }
        mdl_block_tensor_name(l, &mdl_block_norms[MDL_N_ATTN], nm, sizeof(nm));
        mdl_weight_t w;
        float got[128], gen[128];
        assert_int_equal(mdl_model_weight(m, nm, 1, hp->n_embd, &w, err, sizeof(err)), RI_OK);
        mdl_dequant_row_ref(&w, 0, got);
        mdl_synth_norm_vec(mdl_synth_tensor_key(TS_SEED, nm), hp->n_embd, gen);
        assert_memory_equal(got, gen, hp->n_embd * sizeof(float));
    }
    /* the synthetic engine's RoPE angles are the model's, bit for bit */
    float a[64], b[64];
    size_t pos[] = {0, 1, 17, 4095, 131071, 524287};
    for (size_t i = 0; i < CM_ARRAY_LEN(pos); i++) {
        mdl_model_rope_angles(m, false, pos[i], a);
        mdl_synth_rope_angles(hp, pos[i], b);
        assert_memory_equal(a, b, hp->n_rot * sizeof(float));
    }
    mdl_model_destroy(m);
    unlink(path);
}

#define TS_PROMPT 20
#define TS_STEPS 8

/* Prefill a fixed prompt, then greedy steps: tokens into toks. */
static void ts_greedy(int32_t *toks)
{
    char path[64];
    mdl_model_t *m = ts_load_tiny(TS_SEED, path);
    const mdl_hparams_t *hp = mdl_model_hparams(m);
    mdl_seq_t *s = NULL;
    float *lg = malloc(hp->n_vocab * sizeof(float));
    int32_t prompt[TS_PROMPT];
    assert_non_null(lg);
    for (int i = 0; i < TS_PROMPT; i++)
        prompt[i] = (int32_t)((i * 37 + 5) % hp->n_vocab);
    assert_int_equal(mdl_seq_create(m, mdl_attn_find("full"), NULL, TS_PROMPT + TS_STEPS + 1, &s), RI_OK);
    assert_int_equal(mdl_prefill(m, s, prompt, TS_PROMPT, lg, NULL, NULL, NULL), RI_OK);
    for (int k = 0; k < TS_STEPS; k++) {
        float lo = INFINITY, hi = -INFINITY;
        for (uint32_t v = 0; v < hp->n_vocab; v++) {
            assert_true(isfinite(lg[v]));
            lo = fminf(lo, lg[v]);
            hi = fmaxf(hi, lg[v]);
        }
        assert_true(hi > lo);   /* not a constant */
        toks[k] = mdl_argmax(lg, hp->n_vocab);
        assert_int_equal(mdl_decode(m, &s, &toks[k], 1, lg), RI_OK);
    }
    mdl_seq_destroy(s);
    mdl_model_destroy(m);
    free(lg);
    unlink(path);
}

static void test_decodes_stably(void **state)
{
    (void)state;
    int32_t a[TS_STEPS], b[TS_STEPS];
    ts_greedy(a);
    ts_greedy(b);
    assert_memory_equal(a, b, sizeof(a));
    printf("greedy tokens:");
    for (int k = 0; k < TS_STEPS; k++)
        printf(" %d", a[k]);
    printf("\n");
}

int main(void)
{
    tm_runtime_setup();
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_generator_matches_reference),
        cmocka_unit_test(test_presets),
        cmocka_unit_test(test_gguf_equals_device_fill),
        cmocka_unit_test(test_decodes_stably),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
