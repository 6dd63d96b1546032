/*
 * Every wave index setting reaches both engines, against the real
 * ri-kvstore: the in-process "retroinfer" backend (model settings ->
 * kn_wave) and "retroinfer-remote" (model settings -> libretroinfer session
 * -> gw_remote -> kn_wave), and the public API's mirror of them
 * (ri_session_params_t -> the session's index).  Each field is set to a
 * value no default has, a prompt is indexed, and the settings are read back
 * from the engine's own kn_wave (the backends' wave_params op,
 * ri_session_params_get): a field dropped on any path fails.  With
 * tokens_per_cluster 0 (auto) every engine reports the size its index chose
 * (kn_wave_cluster_tokens), the figure bench rows record.  A caller built
 * against API 2 (a struct_size without flags) still creates a session, and
 * ri_session_params_get writes no byte past the caller's struct_size.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "gpuworker/model/mdl_attn.h"
#include "gpuworker/client/gw_attn_remote.h"
#include "kernels/kn_wave.h"
#include "retroinfer/retroinfer.h"
#include "wk_test_util.h"

#define NL 2
#define NQ 4
#define NKV 2
#define D 32
#define N 1200 /* prompt tokens: over sink + window + update_tokens, both settings */

/* A field added to kn_wave_params_t must be added to wave_odd and
 * wave_equal below (and reach both engines): this fails the build until
 * then (unless the field fits the padding before .build). */
_Static_assert(sizeof(kn_wave_params_t) == 80 && offsetof(kn_wave_params_t, build) == 48,
               "kn_wave_params_t changed: update wave_odd and wave_equal");

static wk_env_t env;

/* Every field off its default (kn_wave_params_default) and off every other
 * field's value, so that a swapped pair shows too. */
static void wave_odd(kn_wave_params_t *w)
{
    kn_wave_params_default(w);
    w->sink_tokens = 6;
    w->window_tokens = 40;
    w->tokens_per_cluster = 12;
    w->segment_tokens = 512;
    w->retrieval_frac = 0.05f;
    w->estimation_frac = 0.3f;
    w->retrieval_min_tokens = 96;
    w->estimation_min_tokens = 48;
    w->adapt_tau = 0.25f;
    w->update_tokens = 128;
    w->update_clusters = 20;
    w->build.iters = 3;
    w->build.stop_moved = 0.25f;
    w->build.final_neighbours = 1;
    w->build.seed = 77;
}

static void wave_equal(const kn_wave_params_t *want, const kn_wave_params_t *got)
{
    assert_int_equal(got->sink_tokens, want->sink_tokens);
    assert_int_equal(got->window_tokens, want->window_tokens);
    assert_int_equal(got->tokens_per_cluster, want->tokens_per_cluster);
    assert_int_equal(got->segment_tokens, want->segment_tokens);
    assert_true(got->retrieval_frac == want->retrieval_frac);
    assert_true(got->estimation_frac == want->estimation_frac);
    assert_int_equal(got->retrieval_min_tokens, want->retrieval_min_tokens);
    assert_int_equal(got->estimation_min_tokens, want->estimation_min_tokens);
    assert_true(got->adapt_tau == want->adapt_tau);
    assert_int_equal(got->update_tokens, want->update_tokens);
    assert_int_equal(got->update_clusters, want->update_clusters);
    assert_int_equal(got->build.iters, want->build.iters);
    assert_true(got->build.stop_moved == want->build.stop_moved);
    assert_int_equal(got->build.final_neighbours, want->build.final_neighbours);
    assert_int_equal(got->build.seed, want->build.seed);
}

/* A sequence's K/V of N synthetic tokens. */
static mdl_kv_t *kv_make(void)
{
    mdl_attn_geom_t g = {.n_layers = NL, .n_heads = NQ, .n_kv_heads = NKV, .head_dim = D};
    mdl_kv_t *kv = NULL;
    assert_int_equal(mdl_kv_create(&g, N + 8, MDL_KV_HEAD_MAJOR, &kv), RI_OK);
    for (uint32_t l = 0; l < NL; l++)
        wk_synth_kv_strided(kv->k[l], kv->v[l], kv->token_stride, kv->head_stride, NKV, D, 0, N, l);
    kv->len = N;
    return kv;
}

/* Create a sequence on backend name with cfg, index its prompt, and read
 * back every layer's settings into got[NL]. */
static void backend_settings(const char *name, const mdl_attn_cfg_t *cfg, kn_wave_params_t got[NL])
{
    const mdl_attn_ops_t *ops = mdl_attn_find(name);
    mdl_kv_t *kv = kv_make();
    void *state = NULL;
    assert_non_null(ops);
    assert_non_null(ops->wave_params);
    assert_int_equal(ops->create(cfg, kv, &state), RI_OK);
    for (uint32_t l = 0; l < NL; l++) {
        assert_int_equal(ops->prefill_end(state, l), RI_OK);
        assert_true(ops->wave_params(state, l, &got[l]));
    }
    assert_false(ops->wave_params(state, NL, &got[0])); /* no such layer */
    mdl_attn_stats_t st;
    ops->stats(state, &st);
    assert_int_equal(st.tokens_per_cluster, got[0].tokens_per_cluster);
    ops->destroy(state);
    mdl_kv_destroy(kv);
}

static void test_every_setting_reaches_both_backends(void **state)
{
    mdl_attn_cfg_t cfg;
    kn_wave_params_t got[NL];
    (void)state;

    mdl_attn_cfg_default(&cfg);
    wave_odd(&cfg.wave);
    const char *names[] = {"retroinfer", GW_ATTN_REMOTE_NAME};
    for (size_t i = 0; i < 2; i++) {
        memset(got, 0, sizeof(got));
        backend_settings(names[i], &cfg, got);
        for (uint32_t l = 0; l < NL; l++)
            wave_equal(&cfg.wave, &got[l]);
    }
}

static void test_auto_cluster_size_is_reported_resolved(void **state)
{
    mdl_attn_cfg_t cfg;
    kn_wave_params_t in[NL], re[NL];
    (void)state;

    mdl_attn_cfg_default(&cfg);
    cfg.wave.update_tokens = 256; /* N indexes something with the default steady zone */
    assert_int_equal(cfg.wave.tokens_per_cluster, 0u);
    backend_settings("retroinfer", &cfg, in);
    backend_settings(GW_ATTN_REMOTE_NAME, &cfg, re);
    uint32_t want = kn_wave_cluster_tokens(&cfg.wave, N - cfg.wave.sink_tokens - cfg.wave.window_tokens);
    assert_int_equal(want, KN_WAVE_TINY_TOKENS_PER_CLUSTER);
    for (uint32_t l = 0; l < NL; l++) {
        assert_int_equal(in[l].tokens_per_cluster, want);
        assert_int_equal(re[l].tokens_per_cluster, want);
        assert_int_equal(re[l].update_clusters, in[l].update_clusters);
        assert_int_equal(in[l].update_clusters, cfg.wave.update_tokens / want);
    }
}

/* A session through the public API with p, its prompt indexed. */
static ri_session_h api_session(ri_client_h client, const ri_session_params_t *p, mdl_kv_t *kv)
{
    ri_session_h s = NULL;
    assert_int_equal(ri_session_create(client, p, &s), RI_OK);
    for (uint32_t l = 0; l < NL; l++) {
        ri_kv_view_t v = {.struct_size = sizeof(v), .k = kv->k[l], .v = kv->v[l], .n_tokens = N,
                          .token_stride = kv->token_stride, .head_stride = kv->head_stride};
        assert_int_equal(ri_prefill(s, l, &v), RI_OK);
    }
    assert_int_equal(ri_prefill_wait(s), RI_OK);
    return s;
}

static void api_geometry(ri_session_params_t *p)
{
    p->n_layers = NL;
    p->n_q_heads = NQ;
    p->n_kv_heads = NKV;
    p->head_dim = D;
    p->expected_tokens = N + 8;
}

static void test_public_params_reach_the_session(void **state)
{
    ri_client_params_t cp;
    ri_client_h client = NULL;
    ri_session_params_t sp, got;
    kn_wave_params_t w;
    mdl_kv_t *kv = kv_make();
    (void)state;

    ri_client_params_init(&cp);
    cp.address = env.daemon.grpc;
    assert_int_equal(ri_client_connect(&cp, &client), RI_OK);

    /* every public wave field (and the appended ones) off its default */
    wave_odd(&w);
    ri_session_params_init(&sp);
    api_geometry(&sp);
    sp.sink_tokens = w.sink_tokens;
    sp.window_tokens = w.window_tokens;
    sp.tokens_per_cluster = w.tokens_per_cluster;
    sp.update_tokens = w.update_tokens;
    sp.update_clusters = w.update_clusters;
    sp.retrieval_frac = w.retrieval_frac;
    sp.estimation_frac = w.estimation_frac;
    sp.retrieval_min_tokens = w.retrieval_min_tokens;
    sp.estimation_min_tokens = w.estimation_min_tokens;
    sp.adapt_tau = w.adapt_tau;
    sp.cache_frac = 0.2f;
    sp.cache_pages = 100;
    sp.deadline_us = 1234;
    sp.flags = RI_SESSION_TWO_SIDED | RI_SESSION_NO_PREDICT;
    ri_session_h s = api_session(client, &sp, kv);
    memset(&got, 0xab, sizeof(got));
    got.struct_size = sizeof(got);
    assert_int_equal(ri_session_params_get(s, &got), RI_OK);
    sp.label = NULL;
    /* every field up to the last, compared as bytes: a dropped one reads as its default */
    assert_memory_equal(&got, &sp, offsetof(ri_session_params_t, flags) + sizeof(sp.flags));
    ri_session_close(s);

    /* auto: the size the index chose */
    ri_session_params_init(&sp);
    api_geometry(&sp);
    sp.update_tokens = 256;
    s = api_session(client, &sp, kv);
    got.struct_size = sizeof(got);
    assert_int_equal(ri_session_params_get(s, &got), RI_OK);
    assert_int_equal(got.tokens_per_cluster, KN_WAVE_TINY_TOKENS_PER_CLUSTER);
    assert_int_equal(got.update_clusters, 256 / KN_WAVE_TINY_TOKENS_PER_CLUSTER);
    ri_session_close(s);

    /* an API-2 caller: no flags field; the getter writes up to its size only */
    ri_session_params_init(&sp);
    api_geometry(&sp);
    sp.flags = 0xffffffffu; /* beyond the caller's struct: never read */
    sp.struct_size = offsetof(ri_session_params_t, flags);
    s = api_session(client, &sp, kv);
    memset(&got, 0xab, sizeof(got));
    got.struct_size = offsetof(ri_session_params_t, flags);
    assert_int_equal(ri_session_params_get(s, &got), RI_OK);
    assert_int_equal(got.n_layers, NL);
    assert_int_equal(got.flags, 0xababababu); /* untouched */
    got.struct_size = sizeof(got);
    assert_int_equal(ri_session_params_get(s, &got), RI_OK);
    assert_int_equal(got.flags, 0u);          /* the default, not the stray bits */
    ri_session_close(s);

    assert_int_equal(ri_session_params_get(NULL, &got), RI_ERR_INVALID);
    ri_client_close(client);
    mdl_kv_destroy(kv);
}

static int setup(void **state)
{
    char err[256];
    (void)state;
    int rc = wk_env_start(&env, 64);
    if (rc == 77) {
        printf("test_settings_reach: SKIPPED: no kvstore environment (see above)\n");
        fflush(stdout);
        exit(77);
    }
    if (rc != 0)
        return -1;
    gw_attn_remote_cfg_t rc_cfg = {.address = env.daemon.grpc, .timeout_ms = 5000};
    if (gw_attn_remote_configure(&rc_cfg, err, sizeof(err)) != RI_OK) {
        fprintf(stderr, "cannot configure %s: %s\n", GW_ATTN_REMOTE_NAME, err);
        return -1;
    }
    return 0;
}

static int teardown(void **state)
{
    (void)state;
    gw_attn_remote_shutdown();
    wk_env_stop(&env);
    return 0;
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_every_setting_reaches_both_backends),
        cmocka_unit_test(test_auto_cluster_size_is_reported_resolved),
        cmocka_unit_test(test_public_params_reach_the_session),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
