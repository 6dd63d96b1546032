/*
 * The wave build's blocks and their import (prefix reuse): a block's
 * clusters depend on its own K/V only (two prompts sharing leading blocks
 * build identical pieces for them); pieces exported from one build and
 * imported into another over the same K/V give a bit-identical index and
 * decode; a store's append is told which clusters were imported; a bad
 * piece is refused and leaves the wave as it was.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <cmocka.h>

#include "kernels/kn_ops.h"
#include "kernels/kn_synth.h"
#include "kernels/kn_wave.h"
#include "tests/kernels/kn_test_index.h"

#define PC_NKV 2u
#define PC_G 3u
#define PC_D 64u
#define PC_B 256u

typedef struct pc_kv {
    kn_shape_t shape;
    cm_fp16_t *k, *v;
    kn_kv_view_t kv;
} pc_kv_t;

/* Token-major synthetic cache of n tokens. */
static void pc_make(pc_kv_t *x, size_t n, uint64_t seed)
{
    kn_synth_params_t sp;
    kn_synth_params_default(&sp);
    sp.n_kv_heads = PC_NKV;
    sp.n_q_heads = PC_NKV * PC_G;
    sp.head_dim = PC_D;
    sp.n_tokens = n;
    sp.seed = seed;
    x->shape = (kn_shape_t){PC_NKV * PC_G, PC_NKV, PC_D, 0};
    x->k = malloc(n * PC_NKV * PC_D * sizeof(cm_fp16_t));
    x->v = malloc(n * PC_NKV * PC_D * sizeof(cm_fp16_t));
    assert_non_null(x->k);
    assert_non_null(x->v);
    assert_int_equal(kn_synth_kv(&sp, x->k, x->v, (size_t)PC_NKV * PC_D, PC_D), RI_OK);
    x->kv = (kn_kv_view_t){x->k, x->v, n, (size_t)PC_NKV * PC_D, PC_D};
}

static void pc_free(pc_kv_t *x)
{
    free(x->k);
    free(x->v);
}

static void pc_params(kn_wave_params_t *wp)
{
    kn_wave_params_default(wp);
    assert_int_equal(wp->segment_tokens, PC_B);  /* the default block */
}

static kn_wave_t *pc_build(const pc_kv_t *x)
{
    kn_wave_params_t wp;
    kn_wave_t *w;
    pc_params(&wp);
    assert_int_equal(kn_wave_create(&x->shape, &wp, &w), RI_OK);
    assert_int_equal(kn_wave_build(w, &x->kv), RI_OK);
    return w;
}

/* The piece of block b of head h of idx. */
static void pc_export(const kn_index_t *idx, uint32_t sink, uint32_t b, kn_wave_piece_t *pc)
{
    assert_int_equal(kn_test_block_piece(idx, b * PC_B, b == 0 ? sink : b * PC_B, PC_B, pc), RI_OK);
    assert_true(pc->n_clusters > 0);
}

static void pc_expect_piece_equal(const kn_wave_piece_t *a, const kn_wave_piece_t *b)
{
    uint64_t n = 0;
    assert_int_equal(a->first_pos, b->first_pos);
    assert_int_equal(a->n_clusters, b->n_clusters);
    assert_memory_equal(a->sizes, b->sizes, a->n_clusters * sizeof(uint32_t));
    for (uint32_t j = 0; j < a->n_clusters; j++)
        n += a->sizes[j];
    assert_memory_equal(a->perm, b->perm, n * sizeof(uint32_t));
    assert_memory_equal(a->centroids, b->centroids, (size_t)a->n_clusters * PC_D);
    assert_memory_equal(a->cscale, b->cscale, a->n_clusters * sizeof(float));
    assert_memory_equal(a->vq, b->vq, (size_t)a->n_clusters * PC_D);
    assert_memory_equal(a->vscale, b->vscale, a->n_clusters * sizeof(float));
}

/* Blocks cut at absolute multiples of B, each its own clusters; two prompts
 * sharing the first k blocks (different lengths, different rest) build the
 * same pieces for them. */
static void test_blocks_independent_of_surroundings(void **state)
{
    pc_kv_t x, y;
    const uint32_t k = 5;
    (void)state;
    pc_make(&x, 3000, 11);
    pc_make(&y, 2600, 12);
    memcpy(y.k, x.k, (size_t)k * PC_B * PC_NKV * PC_D * sizeof(cm_fp16_t));
    memcpy(y.v, x.v, (size_t)k * PC_B * PC_NKV * PC_D * sizeof(cm_fp16_t));
    kn_wave_t *wx = pc_build(&x), *wy = pc_build(&y);
    uint32_t sink = kn_wave_params(wx)->sink_tokens;

    for (uint32_t h = 0; h < PC_NKV; h++) {
        const kn_index_t *ix = kn_wave_index(wx, h), *iy = kn_wave_index(wy, h);
        /* every cluster non-empty and inside one block */
        for (uint32_t j = 0; j < ix->n_clusters; j++) {
            uint32_t a = ix->perm[ix->offsets[j]], e = ix->perm[ix->offsets[j + 1] - 1];
            assert_true(ix->sizes[j] > 0);
            assert_int_equal(a / PC_B, e / PC_B);
            assert_true(a >= sink);
        }
        for (uint32_t b = 0; b < k; b++) {
            kn_wave_piece_t px, py;
            pc_export(ix, sink, b, &px);
            pc_export(iy, sink, b, &py);
            pc_expect_piece_equal(&px, &py);
        }
        /* block 5 differs (other K/V); the tail [2816, 2936) of x is its own block */
        uint32_t j0, j1;
        assert_int_equal(kn_wave_block_clusters(ix, 11 * PC_B, 3000 - 64 - 11 * PC_B, &j0, &j1), RI_OK);
        assert_int_equal(j1, ix->n_clusters);
        assert_true(j0 < j1);
        /* a range that cuts a block's clusters is refused */
        assert_int_equal(kn_wave_block_clusters(ix, PC_B + 7, PC_B, &j0, &j1), RI_ERR_INVALID);
    }
    kn_wave_destroy(wx);
    kn_wave_destroy(wy);
    pc_free(&x);
    pc_free(&y);
}

/* The pieces of an exporting wave, served through kn_wave_pieces_t. */
typedef struct pc_src {
    const kn_wave_t *w;
    uint32_t sink;
    int corrupt;            /* which fault to inject (0 none) */
    uint32_t perm_copy[PC_B];
    uint32_t size_copy[PC_B];
} pc_src_t;

enum { PC_OK = 0, PC_FIRST_POS, PC_PERM_OUT, PC_PERM_DUP, PC_SIZES_SUM, PC_ZERO_SIZE, PC_NULL, PC_GET_FAILS };

static ri_status_t pc_get(void *ctx, uint32_t block, uint32_t kv_head, kn_wave_piece_t *pc)
{
    pc_src_t *s = ctx;
    pc_export(kn_wave_index(s->w, kv_head), s->sink, block, pc);
    if (block != 1 || kv_head != 1 || s->corrupt == PC_OK)
        return RI_OK;
    uint32_t nt = 0;
    for (uint32_t j = 0; j < pc->n_clusters; j++)
        nt += pc->sizes[j];
    memcpy(s->perm_copy, pc->perm, nt * sizeof(uint32_t));
    memcpy(s->size_copy, pc->sizes, pc->n_clusters * sizeof(uint32_t));
    switch (s->corrupt) {
    case PC_FIRST_POS:
        pc->first_pos += 1;
        break;
    case PC_PERM_OUT:
        s->perm_copy[nt - 1] = 2 * PC_B;  /* the next block's first token */
        break;
    case PC_PERM_DUP:
        s->perm_copy[1] = s->perm_copy[0];
        break;
    case PC_SIZES_SUM:
        s->size_copy[0] -= 1;
        break;
    case PC_ZERO_SIZE:
        s->size_copy[1] += s->size_copy[0];
        s->size_copy[0] = 0;
        break;
    case PC_NULL:
        pc->vscale = NULL;
        break;
    case PC_GET_FAILS:
        return RI_ERR_IO;
    }
    pc->perm = s->perm_copy;
    pc->sizes = s->size_copy;
    return RI_OK;
}

/* Import of exported pieces == a fresh build, bit for bit: index arrays,
 * budgets, decode outputs. */
static void test_import_equals_fresh_build(void **state)
{
    pc_kv_t x;
    kn_wave_params_t wp;
    kn_wave_t *fresh, *imp;
    (void)state;
    pc_make(&x, 3000, 21);
    fresh = pc_build(&x);
    pc_params(&wp);
    pc_src_t src = {.w = fresh, .sink = wp.sink_tokens};
    for (uint32_t k = 1; k <= 11; k += 5) {  /* 11 blocks: every whole block of [4, 2936) */
        kn_wave_pieces_t pieces = {.ctx = &src, .n_blocks = k, .get = pc_get};
        assert_int_equal(kn_wave_create(&x.shape, &wp, &imp), RI_OK);
        assert_int_equal(kn_wave_build_pieces(imp, &x.kv, &pieces), RI_OK);
        for (uint32_t h = 0; h < PC_NKV; h++)
            kn_expect_index_equal(kn_wave_index(fresh, h), kn_wave_index(imp, h));
        assert_int_equal(kn_wave_indexed_end(imp), kn_wave_indexed_end(fresh));
        uint32_t r0, e0, r1, e1;
        kn_wave_budget(fresh, &r0, &e0);
        kn_wave_budget(imp, &r1, &e1);
        assert_int_equal(r0, r1);
        assert_int_equal(e0, e1);
        assert_int_equal(kn_wave_params(imp)->tokens_per_cluster, kn_wave_params(fresh)->tokens_per_cluster);
        for (uint32_t step = 0; step < 3; step++) {
            kn_synth_params_t sp;
            float q[PC_NKV * PC_G * PC_D], o0[PC_NKV * PC_G * PC_D], o1[PC_NKV * PC_G * PC_D];
            float l0[PC_NKV * PC_G], l1[PC_NKV * PC_G];
            kn_synth_params_default(&sp);
            sp.n_kv_heads = PC_NKV;
            sp.n_q_heads = PC_NKV * PC_G;
            sp.head_dim = PC_D;
            sp.n_tokens = x.kv.n_tokens;
            sp.seed = 21;
            assert_int_equal(kn_synth_query(&sp, step, q), RI_OK);
            assert_int_equal(kn_wave_decode(fresh, q, &x.kv, o0, l0, NULL), RI_OK);
            assert_int_equal(kn_wave_decode(imp, q, &x.kv, o1, l1, NULL), RI_OK);
            assert_memory_equal(o0, o1, sizeof(o0));
            assert_memory_equal(l0, l1, sizeof(l0));
        }
        kn_wave_destroy(imp);
    }
    kn_wave_destroy(fresh);
    pc_free(&x);
}

typedef struct pc_store {
    uint32_t calls;
    uint32_t first[PC_NKV];
    uint32_t n[PC_NKV];
} pc_store_t;

static ri_status_t pc_append(void *ctx, const kn_index_t *idx, const uint32_t *first, const kn_kv_view_t *kv)
{
    pc_store_t *s = ctx;
    (void)kv;
    s->calls++;
    for (uint32_t h = 0; h < PC_NKV; h++) {
        s->first[h] = first[h];
        s->n[h] = idx[h].n_clusters;
    }
    return RI_OK;
}

/* With a store: one append, first[h] = the clusters imported for head h. */
static void test_store_sees_imported_counts(void **state)
{
    pc_kv_t x;
    kn_wave_params_t wp;
    kn_wave_t *fresh, *w;
    pc_store_t rec = {0};
    kn_wave_store_t store = {.ctx = &rec, .append = pc_append};
    (void)state;
    pc_make(&x, 2000, 31);
    fresh = pc_build(&x);
    pc_params(&wp);
    pc_src_t src = {.w = fresh, .sink = wp.sink_tokens};
    kn_wave_pieces_t pieces = {.ctx = &src, .n_blocks = 3, .get = pc_get};
    assert_int_equal(kn_wave_create_store(&x.shape, &wp, &store, &w), RI_OK);
    assert_int_equal(kn_wave_build_pieces(w, &x.kv, &pieces), RI_OK);
    assert_int_equal(rec.calls, 1);
    for (uint32_t h = 0; h < PC_NKV; h++) {
        const kn_index_t *ix = kn_wave_index(fresh, h);
        uint32_t j0, j1;
        assert_int_equal(kn_wave_block_clusters(ix, 0, 3 * PC_B, &j0, &j1), RI_OK);
        assert_int_equal(j0, 0);
        assert_int_equal(rec.first[h], j1);
        assert_int_equal(rec.n[h], ix->n_clusters);
        kn_expect_index_equal(ix, kn_wave_index(w, h));
    }
    kn_wave_destroy(w);
    kn_wave_destroy(fresh);
    pc_free(&x);
}

/* Bad pieces: RI_ERR_INVALID (or the callback's error) and the wave as it
 * was; a good build afterwards still works. */
static void test_bad_pieces_refused(void **state)
{
    pc_kv_t x;
    kn_wave_params_t wp;
    kn_wave_t *fresh, *w;
    (void)state;
    pc_make(&x, 2000, 41);
    fresh = pc_build(&x);
    pc_params(&wp);
    pc_src_t src = {.w = fresh, .sink = wp.sink_tokens};
    kn_wave_pieces_t pieces = {.ctx = &src, .n_blocks = 3, .get = pc_get};
    assert_int_equal(kn_wave_create(&x.shape, &wp, &w), RI_OK);
    for (int c = PC_FIRST_POS; c <= PC_GET_FAILS; c++) {
        src.corrupt = c;
        assert_int_equal(kn_wave_build_pieces(w, &x.kv, &pieces), c == PC_GET_FAILS ? RI_ERR_IO : RI_ERR_INVALID);
        assert_int_equal(kn_wave_index(w, 0)->n_clusters, 0);
        assert_int_equal(kn_wave_index(w, 1)->n_clusters, 0);
        assert_int_equal(kn_wave_indexed_end(w), wp.sink_tokens);
    }
    src.corrupt = PC_OK;
    /* a block reaching past the indexed range [4, 1936): block 7 ends at 2048 */
    pieces.n_blocks = 8;
    assert_int_equal(kn_wave_build_pieces(w, &x.kv, &pieces), RI_ERR_INVALID);
    /* a prompt too short to index takes no pieces */
    kn_kv_view_t shortkv = x.kv;
    shortkv.n_tokens = 1000;
    pieces.n_blocks = 1;
    assert_int_equal(kn_wave_build_pieces(w, &shortkv, &pieces), RI_ERR_INVALID);
    assert_int_equal(kn_wave_index(w, 0)->n_clusters, 0);
    /* unchanged: the good import still gives the fresh index */
    pieces.n_blocks = 3;
    assert_int_equal(kn_wave_build_pieces(w, &x.kv, &pieces), RI_OK);
    kn_expect_index_equal(kn_wave_index(fresh, 1), kn_wave_index(w, 1));
    /* and a built wave takes no second build */
    assert_int_equal(kn_wave_build_pieces(w, &x.kv, &pieces), RI_ERR_INVALID);
    kn_wave_destroy(w);
    kn_wave_destroy(fresh);
    pc_free(&x);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_blocks_independent_of_surroundings),
        cmocka_unit_test(test_import_equals_fresh_build),
        cmocka_unit_test(test_store_sees_imported_counts),
        cmocka_unit_test(test_bad_pieces_refused),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
