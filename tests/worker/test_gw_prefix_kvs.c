/* gw_prefix_seq against the real ri-kvstore: a sequence's blocks published
 * on one prefix-only session are found, read and parsed on another; the
 * longest cached run stops at the first block that differs; another tenant
 * salt finds nothing; a block that passes the kvstore's checks but not the
 * worker's falls back to no cache, counted.  Skipped (77) without the
 * daemon. */
#define _GNU_SOURCE
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <cmocka.h>

#include "common/cm_alloc.h"
#include "common/cm_crc32c.h"
#include "gpuworker/client/gw_prefix_seq.h"
#include "wk_test_util.h"

#define L_   2u
#define H_   2u
#define D_   16u
#define B_   32u
#define NTOK 128u
#define WIN  16u

static wk_env_t env;
static int env_rc;

typedef struct fx {
    mdl_kv_t *kv;
    kn_wave_t *w[L_];
    gw_pfx_layout_t lay;
    gw_pfx_keyer_t kr;
    int32_t ids[NTOK];
    gw_pfx_stats_t stats;
} fx_t;

static const kn_index_t *fx_index(void *ctx, uint32_t l, uint32_t h)
{
    fx_t *f = ctx;
    return kn_wave_index(f->w[l], h);
}

static int fx_setup(void **state)
{
    fx_t *f = calloc(1, sizeof(*f));
    mdl_attn_geom_t g = { L_, 4, H_, D_ };
    mdl_hparams_t hp = {
        .n_layers = L_, .n_kv_heads = H_, .head_dim = D_, .n_rot = D_, .rope_theta = 1e4f, .rope_scale = 1.f
    };
    kn_shape_t shape = { 4, H_, D_, 0 };
    kn_wave_params_t w;

    if (env_rc != 0)
        skip();
    assert_non_null(f);
    assert_int_equal(mdl_kv_create(&g, NTOK, MDL_KV_TOKEN_MAJOR, &f->kv), RI_OK);
    f->kv->len = NTOK;
    kn_wave_params_default(&w);
    w.sink_tokens = 4;
    w.window_tokens = WIN;
    w.tokens_per_cluster = 4;
    w.segment_tokens = B_;
    w.update_tokens = 16;
    for (uint32_t l = 0; l < L_; l++) {
        wk_synth_kv_strided(f->kv->k[l], f->kv->v[l], f->kv->token_stride, f->kv->head_stride, H_, D_, 0, NTOK, l);
        kn_kv_view_t kv = mdl_kv_view(f->kv, l, 0, NTOK);
        assert_int_equal(kn_wave_create(&shape, &w, &f->w[l]), RI_OK);
        assert_int_equal(kn_wave_build(f->w[l], &kv), RI_OK);
    }
    gw_pfx_layout_init(&hp, &w, true, 4, 1, &f->lay);
    assert_int_equal(gw_pfx_model_digest("model-a", 7, f->kr.model), RI_OK);
    assert_int_equal(gw_pfx_tenant_salt("tenant-a", NULL, f->kr.salt), RI_OK);
    for (uint32_t i = 0; i < NTOK; i++)
        f->ids[i] = (int32_t)(1000 + i);
    *state = f;
    return 0;
}

static int fx_teardown(void **state)
{
    fx_t *f = *state;
    for (uint32_t l = 0; l < L_; l++)
        kn_wave_destroy(f->w[l]);
    mdl_kv_destroy(f->kv);
    free(f);
    return 0;
}

/* Look ids up on a new prefix-only session; the cached tokens, and (when
 * check) every cached position's K/V against the fixture's. */
static size_t lookup(fx_t *f, const gw_pfx_keyer_t *kr, const int32_t *ids, bool check)
{
    gw_pfx_conn_t *c = NULL;
    gw_pfx_seq_t *s = NULL;
    assert_int_equal(gw_pfx_conn_open(env.ctl, 5000, &f->lay, &c), RI_OK);
    assert_int_equal(gw_pfx_seq_begin(c->dp, kr, &f->lay, WIN, ids, NTOK, &f->stats, &s), RI_OK);
    size_t n = gw_pfx_seq_cached(s);
    if (check && n > 0) {
        cm_fp16_t *k = calloc(n * D_, 2), *v = calloc(n * D_, 2);
        for (uint32_t l = 0; l < L_; l++) {
            assert_non_null(gw_pfx_set_pieces(gw_pfx_seq_set(s), l));
            for (uint32_t h = 0; h < H_; h++) {
                assert_int_equal(gw_pfx_set_fill(gw_pfx_seq_set(s), l, h, 0, n, k, v, D_), RI_OK);
                for (size_t i = 0; i < n; i++) {
                    assert_memory_equal(k + i * D_, mdl_kv_krow(f->kv, l, h, i), D_ * 2);
                    assert_memory_equal(v + i * D_, mdl_kv_vrow(f->kv, l, h, i), D_ * 2);
                }
            }
        }
        free(k);
        free(v);
    }
    gw_pfx_seq_destroy(s);
    gw_pfx_conn_close(c);
    return n;
}

static void test_publish_attach(void **state)
{
    fx_t *f = *state;
    gw_pfx_src_t src = { f->kv, f, fx_index };
    gw_pfx_conn_t *c = NULL;
    gw_pfx_seq_t *s = NULL;
    uint32_t published = 0;

    assert_int_equal(gw_pfx_conn_open(env.ctl, 5000, &f->lay, &c), RI_OK);
    assert_int_equal(gw_pfx_seq_begin(c->dp, &f->kr, &f->lay, WIN, f->ids, NTOK, &f->stats, &s), RI_OK);
    assert_int_equal(gw_pfx_seq_cached(s), 0);
    assert_int_equal(gw_pfx_seq_publish(s, &src, &published), RI_OK);
    assert_int_equal(published, (NTOK - WIN) / B_);
    gw_pfx_seq_destroy(s);
    gw_pfx_conn_close(c); /* the blocks outlive their publisher's session */

    assert_int_equal(lookup(f, &f->kr, f->ids, true), (size_t)published * B_);
    int32_t ids2[NTOK];
    memcpy(ids2, f->ids, sizeof(ids2));
    ids2[B_ + 5]++; /* block 1 differs: only block 0 is found */
    assert_int_equal(lookup(f, &f->kr, ids2, true), B_);
    gw_pfx_keyer_t other = f->kr;
    assert_int_equal(gw_pfx_tenant_salt("tenant-a", "another salt", other.salt), RI_OK);
    assert_int_equal(lookup(f, &other, f->ids, false), 0);
    assert_int_equal(atomic_load(&f->stats.fallbacks), 0);
    assert_int_equal(atomic_load(&f->stats.published_blocks), published);
}

/* A block whose structure and CRC the kvstore accepts but whose worker
 * section covers a token twice: the lookup falls back, counted. */
static void test_bad_block_falls_back(void **state)
{
    fx_t *f = *state;
    gw_pfx_src_t src = { f->kv, f, fx_index };
    gw_pfx_conn_t *c = NULL;
    uint8_t *buf = NULL, key[CM_PFX_KEY_SIZE];
    uint64_t len = 0;
    int32_t ids[NTOK];
    uint32_t slot, flags;

    for (uint32_t i = 0; i < NTOK; i++)
        ids[i] = (int32_t)(5000 + i);
    assert_int_equal(gw_pfx_keys(&f->kr, &f->lay, ids, 1, key), RI_OK);
    assert_int_equal(gw_pfx_block_build(&f->lay, &src, 0, &buf, &len), RI_OK);
    uint8_t *perm = buf + CM_PFX_HDR_SIZE + cm_dp_get64(buf + 40) + 8; /* table 0's perm */
    memcpy(perm, perm + 4, 4);                                         /* a token twice */
    cm_dp_put32(buf + 36, cm_crc32c(0, buf + CM_PFX_HDR_SIZE, (size_t)(len - CM_PFX_HDR_SIZE)));
    assert_int_equal(gw_pfx_conn_open(env.ctl, 5000, &f->lay, &c), RI_OK);
    assert_int_equal(gw_dp_prefix_put(c->dp, key, buf, len, &slot, &flags), RI_OK);
    gw_pfx_conn_close(c);
    cm_free(buf);
    uint64_t before = atomic_load(&f->stats.fallbacks);
    assert_int_equal(lookup(f, &f->kr, ids, false), 0);
    assert_int_equal(atomic_load(&f->stats.fallbacks), before + 1);
}

int main(void)
{
    env_rc = wk_env_start(&env, 256);
    if (env_rc == 77)
        return 77;
    if (env_rc != 0)
        return 1;
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_publish_attach, fx_setup, fx_teardown),
        cmocka_unit_test_setup_teardown(test_bad_block_falls_back, fx_setup, fx_teardown),
    };
    int rc = cmocka_run_group_tests(tests, NULL, NULL);
    wk_env_stop(&env);
    return rc;
}
