/*
 * Prefix reuse through the public API against the real ri-kvstore.  A
 * session that uploaded a whole prompt itself publishes its leading blocks
 * (built from its K/V and its index, as ri-worker does); a second session
 * attaches them by key (ri_session_attach_prefix), preloads their K/V
 * (ri_session_prefix_kv: equal to the first's, bit for bit), prefills only
 * the rest, and then decodes within 1e-5 of the first on the same queries:
 * with direct reads (the attached clusters read in the blocks' mappings)
 * and two-sided (the kvstore serves them).  It uploads only its own
 * clusters, and a misuse (attach after a prefill, a second attach, keys of
 * nothing) is refused or attaches nothing, changing nothing.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "common/cm_alloc.h"
#include "gpuworker/client/gw_prefix.h"
#include "gpuworker/client/gw_prefix_seq.h"
#include "gpuworker/client/ri_api_int.h"
#include "kernels/kn_wave.h"
#include "retroinfer/retroinfer.h"
#include "wk_api_prefix.h"
#include "wk_test_util.h"

#define NL 2
#define NQ 8
#define NKV 2
#define D 64
#define N 1700 /* >= sink + window + 1024: indexed; 6 attachable blocks of 256, 100 tokens past them */
#define CAP 1800
#define B 256u
#define STEPS 24

typedef struct fx {
    wk_env_t env;
    ri_client_h client;
    mdl_kv_t *kv; /* the prompt's K/V, [layer][CAP][head][D] (the model's token-major cache) */
} fx_t;

static ri_session_h open_session(fx_t *f, uint32_t flags, const char *label)
{
    ri_session_params_t sp;
    ri_session_h s = NULL;
    ri_session_params_init(&sp);
    sp.n_layers = NL;
    sp.n_q_heads = NQ;
    sp.n_kv_heads = NKV;
    sp.head_dim = D;
    sp.expected_tokens = CAP;
    sp.block_tokens = B;
    sp.flags = flags;
    sp.label = label;
    assert_int_equal(ri_session_create(f->client, &sp, &s), RI_OK);
    return s;
}

static ri_kv_view_t view_of(cm_fp16_t *k, cm_fp16_t *v, size_t n)
{
    return (ri_kv_view_t){.struct_size = sizeof(ri_kv_view_t), .k = k, .v = v, .n_tokens = n,
                          .token_stride = (size_t)NKV * D, .head_stride = D};
}

/* Publish blocks [0, nb) of session s's prompt (f->kv) under keys. */
static void publish(fx_t *f, ri_session_h s, const uint8_t *keys, uint32_t nb)
{
    wk_api_publish(f->client, s, f->kv, NL, NKV, D, B, keys, nb);
}

/* A session that attaches the blocks, preloads their K/V, prefills the
 * rest; decodes as ref on the same queries. */
static void attach_and_compare(fx_t *f, ri_session_h ref, const uint8_t *keys, uint32_t nb, uint32_t flags)
{
    ri_session_h s = open_session(f, flags, "prefix-attach");
    uint32_t n_att = 0;
    size_t cached = 0;
    cm_fp16_t *k[NL], *v[NL];
    float q[NQ * D], o_ref[NQ * D], o[NQ * D];
    double worst = 0;

    assert_int_equal(ri_session_attach_prefix(s, keys, nb, &n_att), RI_OK);
    assert_int_equal(n_att, nb);
    assert_int_equal(ri_session_attach_prefix(s, keys, nb, &n_att), RI_ERR_INVALID); /* once */
    assert_int_equal(ri_session_prefix_tokens(s, &cached), RI_OK);
    assert_int_equal(cached, (size_t)nb * B);
    for (uint32_t l = 0; l < NL; l++) {
        k[l] = calloc((size_t)NKV * CAP * D, sizeof(cm_fp16_t));
        v[l] = calloc((size_t)NKV * CAP * D, sizeof(cm_fp16_t));
        const size_t ts = (size_t)NKV * D, head = cached * ts, all = (size_t)CAP * ts;
        for (uint32_t h = 0; h < NKV; h++)
            assert_int_equal(ri_session_prefix_kv(s, l, h, 0, cached, k[l] + h * D, v[l] + h * D, ts), RI_OK);
        assert_memory_equal(k[l], f->kv->k[l], head * sizeof(cm_fp16_t));
        assert_memory_equal(v[l], f->kv->v[l], head * sizeof(cm_fp16_t));
        /* the engine computes the rest itself */
        memcpy(k[l] + head, f->kv->k[l] + head, (all - head) * sizeof(cm_fp16_t));
        memcpy(v[l] + head, f->kv->v[l] + head, (all - head) * sizeof(cm_fp16_t));
        assert_int_equal(ri_session_prefix_kv(s, l, 0, cached - 1, 2, k[l], v[l], ts), RI_ERR_RANGE);
        ri_kv_view_t pv = view_of(k[l], v[l], N);
        assert_int_equal(ri_prefill(s, l, &pv), RI_OK);
    }
    assert_int_equal(ri_prefill_wait(s), RI_OK);
    /* every layer imported the blocks: their parse is given back, the
     * count stays */
    assert_int_equal(ri_session_prefix_tokens(s, &cached), RI_OK);
    assert_int_equal(cached, (size_t)nb * B);
    assert_int_equal(ri_session_prefix_kv(s, 0, 0, 0, 1, k[0], v[0], D), RI_ERR_INVALID);
    for (int step = 0; step < STEPS; step++)
        for (uint32_t l = 0; l < NL; l++) {
            ri_kv_view_t rv = view_of(f->kv->k[l], f->kv->v[l], N + (size_t)step + 1);
            ri_kv_view_t sv = view_of(k[l], v[l], N + (size_t)step + 1);
            wk_synth_q(q, NQ, D, (uint64_t)step * NL + l + 7);
            assert_int_equal(ri_decode(&ref, 1, l, q, &rv, o_ref), RI_OK);
            assert_int_equal(ri_decode(&s, 1, l, q, &sv, o), RI_OK);
            double e = wk_rel_err(o, o_ref, NQ, D);
            worst = e > worst ? e : worst;
        }
    ri_session_stats_t rs = {.struct_size = sizeof(rs)}, ss = {.struct_size = sizeof(ss)};
    assert_int_equal(ri_session_stats(ref, &rs), RI_OK);
    assert_int_equal(ri_session_stats(s, &ss), RI_OK);
    printf("attached %u blocks (%s): worst rel err vs the uploading session %.3g; uploaded %.0f KiB vs %.0f KiB; "
           "%llu of %llu layer-steps read in place, %llu hits + %llu misses\n",
           nb, flags ? "two-sided" : "direct", worst, ss.uploaded_bytes / 1024.0, rs.uploaded_bytes / 1024.0,
           (unsigned long long)ss.direct_steps, (unsigned long long)ss.steps, (unsigned long long)ss.hits,
           (unsigned long long)ss.misses);
    assert_true(worst <= 1e-5);
    /* the blocks hold [4, 1536) of the indexed [4, 1636): only the last 100 tokens are ours */
    assert_true(ss.uploaded_bytes > 0 && ss.uploaded_bytes < rs.uploaded_bytes / 4);
    if (flags == 0)
        assert_true(ss.direct_steps > 0);
    else
        assert_true(ss.misses > 0);
    assert_int_equal(ri_session_status(s), RI_OK);
    ri_session_close(s);
    for (uint32_t l = 0; l < NL; l++) {
        free(k[l]);
        free(v[l]);
    }
}

static void test_attach_decodes_the_same(void **state)
{
    fx_t f;
    ri_client_params_t cp;
    mdl_attn_geom_t geom = {.n_layers = NL, .n_heads = NQ, .n_kv_heads = NKV, .head_dim = D};
    uint8_t keys[8 * CM_PFX_KEY_SIZE], other[CM_PFX_KEY_SIZE];
    uint32_t nb = (N - 64) / B, n_att = 99;
    (void)state;

    memset(&f, 0, sizeof(f));
    if (wk_env_start(&f.env, 256) != 0)
        skip();
    ri_client_params_init(&cp);
    cp.address = f.env.daemon.grpc;
    assert_int_equal(ri_client_connect(&cp, &f.client), RI_OK);
    assert_int_equal(mdl_kv_create(&geom, CAP, MDL_KV_TOKEN_MAJOR, &f.kv), RI_OK);
    for (uint32_t l = 0; l < NL; l++)
        wk_synth_kv_strided(f.kv->k[l], f.kv->v[l], f.kv->token_stride, f.kv->head_stride, NKV, D, 0, CAP, l);
    f.kv->len = N;
    for (size_t i = 0; i < sizeof(keys); i++)
        keys[i] = (uint8_t)(i * 131u + 7u);
    memset(other, 0x5a, sizeof(other));

    /* the first session uploads everything itself, then publishes */
    ri_session_h ref = open_session(&f, 0, "prefix-ref");
    for (uint32_t l = 0; l < NL; l++) {
        ri_kv_view_t pv = view_of(f.kv->k[l], f.kv->v[l], N);
        assert_int_equal(ri_prefill(ref, l, &pv), RI_OK);
    }
    assert_int_equal(ri_prefill_wait(ref), RI_OK);
    assert_int_equal(ri_session_attach_prefix(ref, keys, nb, &n_att), RI_ERR_INVALID); /* after a prefill */
    assert_int_equal(n_att, 99u);
    publish(&f, ref, keys, nb);

    /* keys of nothing: nothing attached, the session works as before */
    ri_session_h none = open_session(&f, 0, "prefix-none");
    assert_int_equal(ri_session_attach_prefix(none, other, 1, &n_att), RI_OK);
    assert_int_equal(n_att, 0u);
    ri_session_close(none);

    attach_and_compare(&f, ref, keys, nb, 0);
    attach_and_compare(&f, ref, keys, nb, RI_SESSION_TWO_SIDED);

    ri_session_close(ref);
    ri_client_close(f.client);
    mdl_kv_destroy(f.kv);
    wk_env_stop(&f.env);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_attach_decodes_the_same),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
