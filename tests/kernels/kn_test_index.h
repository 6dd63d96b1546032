/*
 * What the wave-index tests share: two indexes equal field by field
 * (counts, tables and the rows of every cluster), the piece of one prefix
 * block cut out of a built index, one head's synthetic K/V, and freeing a
 * hand-made index.  Include
 * after <cmocka.h>.
 */
#ifndef KN_TEST_INDEX_H
#define KN_TEST_INDEX_H

#include <stdlib.h>

#include "kernels/kn_ops.h"
#include "kernels/kn_synth.h"
#include "kernels/kn_wave.h"

/* Free the arrays of an index made by hand with malloc/calloc (every
 * array field; those left NULL are skipped by free). */
static inline void kn_test_index_free(kn_index_t *idx)
{
    free(idx->centroids);
    free(idx->cscale);
    free(idx->vsum);
    free(idx->sizes);
    free(idx->offsets);
    free(idx->perm);
    free(idx->vq);
    free(idx->vscale);
}

/* Synthetic K/V of one KV head, n tokens of d dims, rows contiguous
 * (kn_synth's defaults): *k_p and *v_p are the caller's to free(). */
static inline void kn_test_one_head_kv(uint32_t d, uint32_t n, cm_fp16_t **k_p, cm_fp16_t **v_p)
{
    kn_synth_params_t sp;
    *k_p = malloc((size_t)n * d * sizeof(cm_fp16_t));
    *v_p = malloc((size_t)n * d * sizeof(cm_fp16_t));
    assert_non_null(*k_p);
    assert_non_null(*v_p);
    kn_synth_params_default(&sp);
    sp.n_kv_heads = 1;
    sp.n_q_heads = 1;
    sp.head_dim = d;
    sp.n_tokens = n;
    assert_int_equal(kn_synth_kv(&sp, *k_p, *v_p, d, d), RI_OK);
}

static inline void kn_expect_index_equal(const kn_index_t *a, const kn_index_t *b)
{
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

/* The piece of the block [first_pos, first_pos + B) of idx, whose clusters
 * start at lo (past the sinks in block 0): views into idx, as an exporter
 * hands them to kn_wave_build_pieces. */
static inline ri_status_t kn_test_block_piece(const kn_index_t *idx, uint32_t first_pos, uint32_t lo, uint32_t B,
                                              kn_wave_piece_t *pc)
{
    uint32_t j0, j1;
    ri_status_t st = kn_wave_block_clusters(idx, lo, first_pos + B - lo, &j0, &j1);
    if (st != RI_OK)
        return st;
    *pc = (kn_wave_piece_t){ .first_pos = first_pos,
                             .n_clusters = j1 - j0,
                             .sizes = idx->sizes + j0,
                             .perm = idx->perm + idx->offsets[j0],
                             .centroids = idx->centroids + (size_t)j0 * idx->head_dim,
                             .cscale = idx->cscale + j0,
                             .vq = idx->vq + (size_t)j0 * idx->head_dim,
                             .vscale = idx->vscale + j0 };
    return RI_OK;
}

#endif /* KN_TEST_INDEX_H */
