/* gw_prefix: block keys and the worker section of a prefix block, as pure
 * functions: a block built from a sequence's K/V and wave index parses back
 * into the same K/V and the same clusters; bad blocks are refused. */
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
#include "gpuworker/client/gw_prefix.h"

#define L_   3u  /* layers; layer 1 has no index (a sliding-window layer) */
#define H_   2u  /* kv heads */
#define D_   8u  /* head dim */
#define B_   32u /* block tokens */
#define CS   4u  /* tokens per cluster */
#define SINK 4u
#define NTOK 96u /* three blocks of K/V */

/* A sequence: K/V and a hand-made index per (layer, head) that clusters
 * every block past the sinks in shuffled clusters of CS tokens. */
typedef struct fx {
    mdl_kv_t *kv;
    kn_index_t idx[L_][H_];
    uint32_t sizes[L_][H_][NTOK], offsets[L_][H_][NTOK + 1], perm[L_][H_][NTOK];
    int8_t cent[L_][H_][NTOK * D_];
    float cscale[L_][H_][NTOK];
    int8_t vq[L_][H_][NTOK * D_];
    float vscale[L_][H_][NTOK];
    gw_pfx_layout_t lay;
} fx_t;

static uint32_t rnd(uint32_t *s)
{
    *s = *s * 1664525u + 1013904223u;
    return *s >> 8;
}

static const kn_index_t *fx_index(void *ctx, uint32_t l, uint32_t h)
{
    fx_t *f = ctx;
    return l == 1 ? NULL : &f->idx[l][h];
}

static void fx_index_build(fx_t *f, uint32_t l, uint32_t h, uint32_t *seed)
{
    kn_index_t *x = &f->idx[l][h];
    uint32_t n = 0, C = 0;
    kn_index_init(x, D_);
    for (uint32_t b0 = 0; b0 < NTOK; b0 += B_) {
        uint32_t lo = b0 < SINK ? SINK : b0, pos[B_], m = 0;
        for (uint32_t p = lo; p < b0 + B_; p++)
            pos[m++] = p;
        for (uint32_t i = m; i > 1; i--) { /* shuffle inside the block */
            uint32_t j = rnd(seed) % i, t = pos[i - 1];
            pos[i - 1] = pos[j];
            pos[j] = t;
        }
        for (uint32_t i = 0; i < m; i += CS) {
            f->sizes[l][h][C] = m - i < CS ? m - i : CS;
            f->offsets[l][h][C] = n;
            for (uint32_t k = 0; k < f->sizes[l][h][C]; k++)
                f->perm[l][h][n++] = pos[i + k];
            C++;
        }
    }
    f->offsets[l][h][C] = n;
    for (uint32_t i = 0; i < C * D_; i++) {
        f->cent[l][h][i] = (int8_t)rnd(seed);
        f->vq[l][h][i] = (int8_t)rnd(seed);
    }
    for (uint32_t j = 0; j < C; j++) {
        f->cscale[l][h][j] = (float)(rnd(seed) % 1000u) / 991.0f;
        f->vscale[l][h][j] = (float)(rnd(seed) % 1000u) / 997.0f;
    }
    x->n_clusters = C;
    x->n_tokens = n;
    x->sizes = f->sizes[l][h];
    x->offsets = f->offsets[l][h];
    x->perm = f->perm[l][h];
    x->centroids = f->cent[l][h];
    x->cscale = f->cscale[l][h];
    x->vq = f->vq[l][h];
    x->vscale = f->vscale[l][h];
}

static int fx_setup(void **state)
{
    fx_t *f = calloc(1, sizeof(*f));
    mdl_attn_geom_t g = { L_, 4, H_, D_ };
    mdl_hparams_t hp = {
        .n_layers = L_, .n_kv_heads = H_, .head_dim = D_, .n_rot = D_, .rope_theta = 10000.f, .rope_scale = 1.f
    };
    kn_wave_params_t w;
    uint32_t seed = 12345;

    assert_non_null(f);
    assert_int_equal(mdl_kv_create(&g, NTOK + 8, MDL_KV_TOKEN_MAJOR, &f->kv), RI_OK);
    f->kv->len = NTOK;
    for (uint32_t l = 0; l < L_; l++)
        for (size_t i = 0; i < (size_t)H_ * f->kv->cap * D_; i++) {
            f->kv->k[l][i] = cm_f32_to_fp16((float)(rnd(&seed) % 2001) / 1000.f - 1.f);
            f->kv->v[l][i] = cm_f32_to_fp16((float)(rnd(&seed) % 2001) / 1000.f - 1.f);
        }
    for (uint32_t l = 0; l < L_; l++)
        for (uint32_t h = 0; h < H_; h++)
            fx_index_build(f, l, h, &seed);
    kn_wave_params_default(&w);
    w.sink_tokens = SINK;
    w.segment_tokens = B_;
    gw_pfx_layout_init(&hp, &w, true, CS, 2, &f->lay);
    *state = f;
    return 0;
}

static int fx_teardown(void **state)
{
    fx_t *f = *state;
    mdl_kv_destroy(f->kv);
    free(f);
    return 0;
}

/* Build and parse block b; check the K/V of every (layer, head) and the
 * clusters of the indexed layers against the sequence's. */
static void roundtrip(fx_t *f, uint32_t b)
{
    gw_pfx_src_t src = { f->kv, f, fx_index };
    gw_pfx_block_t pb;
    uint8_t *buf = NULL;
    uint64_t len = 0;
    cm_fp16_t k[(B_ + 2) * 2 * D_], v[(B_ + 2) * 2 * D_];

    assert_int_equal(gw_pfx_block_build(&f->lay, &src, b, &buf, &len), RI_OK);
    assert_int_equal(gw_pfx_block_parse(&f->lay, b, buf, len, &pb), RI_OK);
    assert_int_equal(pb.first_pos, b * B_);
    for (uint32_t l = 0; l < L_; l++) {
        for (uint32_t h = 0; h < H_; h++) {
            const gw_pfx_table_t *T = &pb.tables[l * H_ + h];
            /* one position before and after the block: left alone */
            memset(k, 0xAB, sizeof(k));
            memset(v, 0xCD, sizeof(v));
            gw_pfx_block_fill(&pb, l, h, (size_t)b * B_ - (b > 0), B_ + 2 - (b == 0), k, v, 2 * D_);
            for (uint32_t i = 0; i < B_; i++) {
                size_t p = (size_t)b * B_ + i, r = i + (b > 0);
                assert_memory_equal(k + r * 2 * D_, mdl_kv_krow(f->kv, l, h, p), D_ * sizeof(cm_fp16_t));
                assert_memory_equal(v + r * 2 * D_, mdl_kv_vrow(f->kv, l, h, p), D_ * sizeof(cm_fp16_t));
            }
            if (b > 0)
                assert_int_equal(k[0], 0xABAB);
            assert_int_equal(k[(B_ + (b > 0)) * 2 * D_], 0xABAB);
            if (l == 1) {
                assert_int_equal(T->n_clusters, 0);
                assert_int_equal(pb.loose[l].n, B_);
                continue;
            }
            assert_int_equal(pb.loose[l].n, b == 0 ? SINK : 0);
            /* the block's clusters, in index order, with absolute positions */
            const kn_index_t *x = &f->idx[l][h];
            uint32_t j0 = 0;
            while (x->perm[x->offsets[j0]] < b * B_ || x->perm[x->offsets[j0]] >= (b + 1) * B_)
                j0++;
            assert_int_equal(T->n_clusters, (B_ - (b == 0 ? SINK : 0)) / CS);
            assert_memory_equal(T->sizes, x->sizes + j0, T->n_clusters * 4);
            assert_memory_equal(T->perm, x->perm + x->offsets[j0], (B_ - (b == 0 ? SINK : 0)) * 4);
            assert_memory_equal(T->centroids, x->centroids + (size_t)j0 * D_, T->n_clusters * D_);
            assert_memory_equal(T->cscale, x->cscale + j0, T->n_clusters * 4);
            assert_memory_equal(T->vq, x->vq + (size_t)j0 * D_, T->n_clusters * D_);
            assert_memory_equal(T->vscale, x->vscale + j0, T->n_clusters * 4);
        }
    }
    gw_pfx_block_release(&pb);
    cm_free(buf);
}

static void test_roundtrip(void **state)
{
    fx_t *f = *state;
    roundtrip(f, 0);
    roundtrip(f, 1);
    roundtrip(f, 2);
}

/* A full (unindexed) layout: every token loose, no clusters, no pages. */
static void test_roundtrip_unindexed(void **state)
{
    fx_t *f = *state;
    gw_pfx_layout_t lay = f->lay;
    gw_pfx_src_t src = { f->kv, NULL, NULL };
    gw_pfx_block_t pb;
    uint8_t *buf = NULL;
    uint64_t len = 0;
    cm_fp16_t k[B_ * D_], v[B_ * D_];

    lay.indexed = 0;
    lay.cluster_tokens = 0;
    lay.page_tokens = 1;
    assert_int_equal(gw_pfx_block_build(&lay, &src, 1, &buf, &len), RI_OK);
    assert_int_equal(gw_pfx_block_parse(&lay, 1, buf, len, &pb), RI_OK);
    assert_int_equal(pb.view.hdr.pages_bytes, 0);
    gw_pfx_block_fill(&pb, 2, 1, B_, B_, k, v, D_);
    for (uint32_t i = 0; i < B_; i++) {
        assert_memory_equal(k + i * D_, mdl_kv_krow(f->kv, 2, 1, B_ + i), D_ * sizeof(cm_fp16_t));
        assert_memory_equal(v + i * D_, mdl_kv_vrow(f->kv, 2, 1, B_ + i), D_ * sizeof(cm_fp16_t));
    }
    gw_pfx_block_release(&pb);
    /* a block parsed under another layout (or as another block) is refused */
    assert_int_equal(gw_pfx_block_parse(&f->lay, 1, buf, len, &pb), RI_ERR_INVALID);
    assert_int_equal(gw_pfx_block_parse(&lay, 2, buf, len, &pb), RI_ERR_INVALID);
    cm_free(buf);
}

/* Bad blocks: a flipped byte fails the CRC; a cluster across the block's
 * edge cannot be published; a K/V cache too short is refused. */
static void test_bad_blocks(void **state)
{
    fx_t *f = *state;
    gw_pfx_src_t src = { f->kv, f, fx_index };
    gw_pfx_block_t pb;
    uint8_t *buf = NULL;
    uint64_t len = 0;

    assert_int_equal(gw_pfx_block_build(&f->lay, &src, 1, &buf, &len), RI_OK);
    /* past the tables (a flipped count fails the structure check first) */
    for (uint64_t at = CM_PFX_HDR_SIZE + cm_dp_get64(buf + 40); at < len; at += len / 7) {
        buf[at] ^= 0x10;
        memset(&pb, 0x5A, sizeof(pb));
        assert_int_equal(gw_pfx_block_parse(&f->lay, 1, buf, len, &pb), RI_ERR_CORRUPT);
        assert_int_equal(pb.first_pos, 0x5A5A5A5A); /* output untouched */
        buf[at] ^= 0x10;
    }
    assert_int_not_equal(gw_pfx_block_parse(&f->lay, 1, buf, len - 8, &pb), RI_OK);
    cm_free(buf);
    assert_int_equal(gw_pfx_block_build(&f->lay, &src, 3, &buf, &len), RI_ERR_INVALID);
    /* swap one token of block 1 with one of block 2 in layer 0 head 1 */
    kn_index_t *x = &f->idx[0][1];
    uint32_t a = 0, c = x->n_tokens - 1, t;
    while (x->perm[a] < B_)
        a++;
    t = x->perm[a];
    x->perm[a] = x->perm[c];
    x->perm[c] = t;
    assert_int_equal(gw_pfx_block_build(&f->lay, &src, 1, &buf, &len), RI_ERR_UNSUPPORTED);
    x->perm[c] = x->perm[a];
    x->perm[a] = t;
}

/* A block whose worker section has another version (the int8 centroids
 * came with version 3, the int8 means with version 2; version 1 held fp16
 * means, version 2 fp16 centroids) is refused, its CRC good:
 * RI_ERR_PROTOCOL, the output untouched, and a set does not take it (the
 * sequence prefills the prompt instead: a miss, never served). */
static void test_old_version_refused(void **state)
{
    fx_t *f = *state;
    gw_pfx_src_t src = { f->kv, f, fx_index };
    gw_pfx_block_t pb;
    gw_pfx_set_t *set = NULL;
    uint8_t *buf = NULL, *w;
    uint64_t len = 0;

    assert_int_equal(gw_pfx_block_build(&f->lay, &src, 0, &buf, &len), RI_OK);
    w = buf + CM_PFX_HDR_SIZE + cm_dp_get64(buf + 40);
    assert_int_equal(cm_dp_get32(w), GW_PFX_WMAGIC);
    assert_int_equal(cm_dp_get32(w + 4), 3);
    for (uint32_t v = 1; v <= 4; v += v == 2 ? 2 : 1) { /* 1, 2 and 4 */
        cm_dp_put32(w + 4, v);
        cm_dp_put32(buf + 36, cm_crc32c(0, buf + CM_PFX_HDR_SIZE, (size_t)(len - CM_PFX_HDR_SIZE)));
        memset(&pb, 0x5A, sizeof(pb));
        assert_int_equal(gw_pfx_block_parse(&f->lay, 0, buf, len, &pb), RI_ERR_PROTOCOL);
        assert_int_equal(pb.first_pos, 0x5A5A5A5A);
        assert_int_equal(gw_pfx_set_create(&f->lay, 1, &set), RI_OK);
        assert_int_equal(gw_pfx_set_add(set, buf, len), RI_ERR_PROTOCOL);
        assert_int_equal(gw_pfx_set_blocks(set), 0);
        assert_null(gw_pfx_set_pieces(set, 0));
        gw_pfx_set_destroy(set);
    }
    cm_dp_put32(w + 4, GW_PFX_WVERSION); /* and back: taken */
    cm_dp_put32(buf + 36, cm_crc32c(0, buf + CM_PFX_HDR_SIZE, (size_t)(len - CM_PFX_HDR_SIZE)));
    assert_int_equal(gw_pfx_block_parse(&f->lay, 0, buf, len, &pb), RI_OK);
    gw_pfx_block_release(&pb);
    cm_free(buf);
}

/* The kernels' own index: blocks exported from a real build and imported
 * through the parsed set give a bit-identical index, and the preload fill
 * restores every prefix position. */
static void test_wave_import(void **state)
{
    fx_t *f = *state;
    kn_shape_t shape = { 4, H_, D_, 0 };
    kn_wave_params_t w;
    kn_wave_t *w1[L_] = { 0 }, *w2[L_] = { 0 };
    uint8_t *bufs[2] = { 0 };
    uint64_t lens[2];
    gw_pfx_set_t *set = NULL;
    const uint32_t window = 16;

    kn_wave_params_default(&w);
    w.sink_tokens = SINK;
    w.window_tokens = window;
    w.tokens_per_cluster = CS;
    w.segment_tokens = B_;
    w.update_tokens = 16;
    assert_int_equal(gw_pfx_max_blocks(&f->lay, window, NTOK), 2);
    for (uint32_t l = 0; l < L_; l += 2) {
        kn_kv_view_t kv = mdl_kv_view(f->kv, l, 0, NTOK);
        assert_int_equal(kn_wave_create(&shape, &w, &w1[l]), RI_OK);
        assert_int_equal(kn_wave_build(w1[l], &kv), RI_OK);
        for (uint32_t h = 0; h < H_; h++)
            f->idx[l][h] = *kn_wave_index(w1[l], h); /* the fixture's index() answers these */
    }
    gw_pfx_src_t src = { f->kv, f, fx_index };
    assert_int_equal(gw_pfx_set_create(&f->lay, 2, &set), RI_OK);
    for (uint32_t b = 0; b < 2; b++) {
        assert_int_equal(gw_pfx_block_build(&f->lay, &src, b, &bufs[b], &lens[b]), RI_OK);
        assert_int_equal(gw_pfx_set_add(set, bufs[b], lens[b]), RI_OK);
    }
    assert_null(gw_pfx_set_pieces(set, 1));
    for (uint32_t l = 0; l < L_; l += 2) {
        kn_kv_view_t kv = mdl_kv_view(f->kv, l, 0, NTOK);
        const kn_wave_pieces_t *pc = gw_pfx_set_pieces(set, l);
        assert_non_null(pc);
        assert_int_equal(pc->n_blocks, 2);
        assert_int_equal(kn_wave_create(&shape, &w, &w2[l]), RI_OK);
        assert_int_equal(kn_wave_build_pieces(w2[l], &kv, pc), RI_OK);
        for (uint32_t h = 0; h < H_; h++) {
            const kn_index_t *a = kn_wave_index(w1[l], h), *b = kn_wave_index(w2[l], h);
            assert_true(a->n_clusters > 2 * B_ / CS);
            assert_int_equal(a->n_clusters, b->n_clusters);
            assert_int_equal(a->n_tokens, b->n_tokens);
            assert_memory_equal(a->sizes, b->sizes, a->n_clusters * 4);
            assert_memory_equal(a->perm, b->perm, a->n_tokens * 4);
            assert_memory_equal(a->centroids, b->centroids, (size_t)a->n_clusters * D_);
            assert_memory_equal(a->cscale, b->cscale, a->n_clusters * 4);
            assert_memory_equal(a->vq, b->vq, (size_t)a->n_clusters * D_);
            assert_memory_equal(a->vscale, b->vscale, a->n_clusters * 4);
        }
    }
    /* the preload: every position of the two blocks, every layer and head */
    cm_fp16_t *k = calloc(2 * B_ * D_, 2), *v = calloc(2 * B_ * D_, 2);
    for (uint32_t l = 0; l < L_; l++)
        for (uint32_t h = 0; h < H_; h++) {
            assert_int_equal(gw_pfx_set_fill(set, l, h, 0, 2 * B_, k, v, D_), RI_OK);
            for (uint32_t i = 0; i < 2 * B_; i++) {
                assert_memory_equal(k + i * D_, mdl_kv_krow(f->kv, l, h, i), D_ * 2);
                assert_memory_equal(v + i * D_, mdl_kv_vrow(f->kv, l, h, i), D_ * 2);
            }
        }
    assert_int_equal(gw_pfx_set_fill(set, 0, 0, 1, 2 * B_, k, v, D_), RI_ERR_RANGE);
    free(k);
    free(v);
    gw_pfx_set_destroy(set);
    for (uint32_t l = 0; l < L_; l++) {
        kn_wave_destroy(w1[l]);
        kn_wave_destroy(w2[l]);
    }
    cm_free(bufs[0]);
    cm_free(bufs[1]);
}

static void test_keys(void **state)
{
    fx_t *f = *state;
    gw_pfx_keyer_t kr, kr2;
    int32_t toks[3 * B_];
    uint8_t k1[3 * 32], k2[3 * 32];
    gw_pfx_layout_t lay = f->lay;

    for (uint32_t i = 0; i < 3 * B_; i++)
        toks[i] = (int32_t)(i * 7 + 1);
    assert_int_equal(gw_pfx_model_digest("model bytes", 11, kr.model), RI_OK);
    assert_int_equal(gw_pfx_tenant_salt("token-a", NULL, kr.salt), RI_OK);
    assert_int_equal(gw_pfx_keys(&kr, &lay, toks, 3, k1), RI_OK);
    assert_int_equal(gw_pfx_keys(&kr, &lay, toks, 3, k2), RI_OK);
    assert_memory_equal(k1, k2, sizeof(k1)); /* deterministic */
    assert_memory_not_equal(k1, k1 + 32, 32);
    toks[B_ + 3]++; /* block 1 changes: keys 1, 2 do */
    assert_int_equal(gw_pfx_keys(&kr, &lay, toks, 3, k2), RI_OK);
    assert_memory_equal(k1, k2, 32);
    assert_memory_not_equal(k1 + 32, k2 + 32, 32);
    assert_memory_not_equal(k1 + 64, k2 + 64, 32);
    toks[B_ + 3]--;
    kr2 = kr; /* another tenant */
    assert_int_equal(gw_pfx_tenant_salt("token-b", NULL, kr2.salt), RI_OK);
    assert_int_equal(gw_pfx_keys(&kr2, &lay, toks, 1, k2), RI_OK);
    assert_memory_not_equal(k1, k2, 32);
    assert_int_equal(gw_pfx_tenant_salt("token-a", "x", kr2.salt), RI_OK); /* an extra salt */
    assert_memory_not_equal(kr.salt, kr2.salt, 32);
    lay.cluster_tokens = 8; /* another layout */
    assert_int_equal(gw_pfx_keys(&kr, &lay, toks, 1, k2), RI_OK);
    assert_memory_not_equal(k1, k2, 32);
    /* SHA-256("abc"), FIPS 180-2 */
    static const uint8_t abc[32] = { 0xba, 0x78, 0x16, 0xbf, 0x8f, 0x01, 0xcf, 0xea, 0x41, 0x41, 0x40,
                                     0xde, 0x5d, 0xae, 0x22, 0x23, 0xb0, 0x03, 0x61, 0xa3, 0x96, 0x17,
                                     0x7a, 0x9c, 0xb4, 0x10, 0xff, 0x61, 0xf2, 0x00, 0x15, 0xad };
    assert_int_equal(gw_pfx_model_digest("abc", 3, kr2.model), RI_OK);
    assert_memory_equal(kr2.model, abc, 32);
    /* attachable blocks */
    assert_int_equal(gw_pfx_max_blocks(&f->lay, 64, 64 + 2 * B_), 2);
    assert_int_equal(gw_pfx_max_blocks(&f->lay, 64, 64 + 2 * B_ - 1), 1);
    lay.indexed = 0;
    assert_int_equal(gw_pfx_max_blocks(&lay, 64, 2 * B_), 1);
    assert_int_equal(gw_pfx_max_blocks(&lay, 64, 2 * B_ + 1), 2);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_roundtrip, fx_setup, fx_teardown),
        cmocka_unit_test_setup_teardown(test_roundtrip_unindexed, fx_setup, fx_teardown),
        cmocka_unit_test_setup_teardown(test_bad_blocks, fx_setup, fx_teardown),
        cmocka_unit_test_setup_teardown(test_old_version_refused, fx_setup, fx_teardown),
        cmocka_unit_test_setup_teardown(test_wave_import, fx_setup, fx_teardown),
        cmocka_unit_test_setup_teardown(test_keys, fx_setup, fx_teardown),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
