/*
 * What the wave-index tests share: two indexes equal field by field
 * (counts, tables and the fp16 rows of every cluster).  Include after
 * <cmocka.h>.
 */
#ifndef KN_TEST_INDEX_H
#define KN_TEST_INDEX_H

#include "kernels/kn_ops.h"

static inline void kn_expect_index_equal(const kn_index_t *a, const kn_index_t *b)
{
    size_t row = (size_t)a->head_dim * sizeof(cm_fp16_t);
    assert_int_equal(a->n_clusters, b->n_clusters);
    assert_int_equal(a->n_tokens, b->n_tokens);
    assert_memory_equal(a->sizes, b->sizes, a->n_clusters * sizeof(uint32_t));
    assert_memory_equal(a->offsets, b->offsets, (a->n_clusters + 1) * sizeof(uint32_t));
    assert_memory_equal(a->perm, b->perm, a->n_tokens * sizeof(uint32_t));
    assert_memory_equal(a->centroids, b->centroids, a->n_clusters * row);
    assert_memory_equal(a->vq, b->vq, (size_t)a->n_clusters * a->head_dim);
    assert_memory_equal(a->vscale, b->vscale, a->n_clusters * sizeof(float));
}

#endif /* KN_TEST_INDEX_H */
