/*
 * The wave index of one layer of one sequence, all its KV heads, and the
 * tripartite decode (docs/architecture.md) as one object, for the model
 * runtime's "retroinfer" attention backend and for the benchmarks.
 *
 * The caller owns the K/V cache of the sequence (any kn_kv_view_t layout) and
 * passes a view of it, covering every token so far, to each call.  The wave
 * object keeps the meta index per KV head (int8 centroids and value means + their scales,
 * sizes, cluster-major permutation) and its own cluster-major copy of the
 * indexed K/V (the layout the kvstore holds), so that the retrieval zone is
 * read as one contiguous page per cluster.
 *
 *   token positions: [0, sink) sinks | [sink, indexed_end) indexed | rest steady
 *
 * Use:
 *   kn_wave_create(&shape, &params, &w);
 *   kn_wave_build(w, &kv);            // after prefill (may index nothing if short)
 *   per decode step, after appending the new token's K/V to the cache:
 *     kn_wave_update(w, &kv);         // clusters 1024 old steady tokens when due
 *     kn_wave_decode(w, q, &kv, out, NULL);
 *   kn_wave_destroy(w);
 *
 * Not thread-safe per object; different objects may be used concurrently only
 * with different pools (kn_set_pool) or from one thread.
 */
#ifndef KN_WAVE_H
#define KN_WAVE_H

#include "kernels/kn_ops.h"

/* The paper's shares of the clusters: retrieved exactly / estimated.  The
 * one place they are written down (the budget-matched baselines of the
 * model runtime use the retrieval share too). */
#define KN_WAVE_RETRIEVAL_FRAC 0.018f
#define KN_WAVE_ESTIMATION_FRAC 0.232f
/* The floor under the retrieval share, in tokens: at 2K the share gives 2
 * clusters (32 tokens), too few to hold a needle the model needs (the
 * accuracy-vs-budget curve in docs/accuracy.md chose it). */
#define KN_WAVE_RETRIEVAL_MIN_TOKENS 256u
/* Cluster size when tokens_per_cluster is 0 (auto): 4 up to
 * KN_WAVE_TINY_CONTEXT indexed tokens, 8 up to KN_WAVE_SMALL_CONTEXT, the
 * paper's 16 beyond.  Below ~14K tokens (256 / 1.8%) a step's retrieval is
 * held at the floor, a fixed number of tokens, and just past it the share is
 * still a few hundred: smaller clusters spend them on more, better aimed
 * clusters, and on real needles that decides.  On RULER's own prompts
 * (docs/accuracy.md) 4 tokens keep full attention's pass counts where 8 and
 * 16 lose some: SmolLM2 at 8K, Gemma 3 at 4K, and Gemma 3 at 16K, where 8
 * tokens passed 15 of 20 niah_single_2 prompts against 19 at 4 and full's
 * 20, and no prompt that 4 failed.  What 4 costs there is small beside the
 * prefill (index build and upload about 2.6% of it, decode 2-4% slower than
 * with 8, docs/results/worker.md).
 * At 32K (Gemma 3, niah_single_2, 20 prompts) 16 tokens passed 9 against
 * full's 16, below full's interval, failing 7 prompts full passed and none
 * it failed; 8 passed 12 and 4 passed 13, with 3 and 2 prompts the other
 * lost, so the two are level there.  8 costs what 16 costs at 32K (decode
 * through the kvstore 1.23-1.26x full against 1.20-1.26x) where 4 is 3-7%
 * slower with a first step half as long again, hence 8.  Past 32K nothing
 * here measures accuracy (no model of ours reads further), so the size stays
 * the paper's 16 there. */
#define KN_WAVE_TOKENS_PER_CLUSTER 16u
#define KN_WAVE_TINY_TOKENS_PER_CLUSTER 4u
#define KN_WAVE_TINY_CONTEXT 16384u
#define KN_WAVE_SMALL_TOKENS_PER_CLUSTER 8u
#define KN_WAVE_SMALL_CONTEXT 32768u

/* The build's block when segment_tokens is 0. */
#define KN_WAVE_SEGMENT_TOKENS 256u

/* Settings (defaults in docs/architecture.md). */
typedef struct kn_wave_params {
    uint32_t sink_tokens;        /* attention sinks kept exact (4) */
    uint32_t window_tokens;      /* recent tokens kept exact (64) */
    uint32_t tokens_per_cluster; /* 0 = auto (4 up to KN_WAVE_TINY_CONTEXT, 8
                                    up to KN_WAVE_SMALL_CONTEXT, 16 beyond);
                                    else ~this */
    uint32_t segment_tokens;     /* B, the build's block (256): the indexed range is cut
                                    at absolute multiples of B and each block clustered
                                    on its own, so that a block's clusters depend on its
                                    K/V alone (prefix reuse, docs/prefix.md); 0 = 256 */
    float retrieval_frac;        /* R = max(round(frac*C), 1) (0.018) */
    float estimation_frac;       /* E = min(round(frac*C), C-R) (0.232) */
    uint32_t retrieval_min_tokens;  /* R is at least this many tokens' worth of
                                       clusters (ceil(tokens / tokens_per_cluster));
                                       the shares starve short contexts (256) */
    uint32_t estimation_min_tokens; /* the same floor for E (0) */
    float adapt_tau;             /* output-aware per-head retrieval: 0 = off
                                    (every head retrieves R); > 0: each head
                                    ranks 2R candidates and retrieves the
                                    fewest (at least R/4) whose leftover share
                                    of the candidates' estimated attention mass
                                    is <= adapt_tau; the rest is estimated */
    uint32_t update_tokens;      /* tokens clustered per update (1024) */
    uint32_t update_clusters;    /* clusters per update; 0 = update_tokens /
                                    tokens per cluster (64 at 16) */
    kn_build_params_t build;     /* k-means settings */
    const kn_ops_t *ops;         /* backend; NULL = kn_ops_default() */
} kn_wave_params_t;

void kn_wave_params_default(kn_wave_params_t *p);

/* The cluster size an index of n_idx tokens gets under p: p's own, or the
 * auto rule's when it is 0. */
uint32_t kn_wave_cluster_tokens(const kn_wave_params_t *p, size_t n_idx);

/* The budget rule, shared by every engine that keeps a wave index (in
 * process and remote): after C clusters were added (a build or an update)
 * to an index now of `total` clusters, R grows by max(round(retrieval_frac *
 * C), 1) and E by round(estimation_frac * C), R capped at total and E at
 * total - R. */
void kn_wave_budget_grow(const kn_wave_params_t *p, uint32_t C, uint32_t total, uint32_t *n_r, uint32_t *n_e);

/* The decode budget of an index of `total` clusters of about tpc tokens each,
 * from the share-based counts n_r, n_e (kn_wave_budget_grow): each raised to
 * its minimum in tokens, R capped at total and E at total - R. */
void kn_wave_budget_floor(const kn_wave_params_t *p, uint32_t total, uint32_t n_r, uint32_t n_e, uint32_t *r_p,
                          uint32_t *e_p);

/* What a decode step ranks for a budget (n_r, n_e): (n_r, n_e) itself, or,
 * with adapt_tau > 0, 2 n_r candidates for retrieval (capped at total) and
 * n_e after them. */
void kn_wave_rank_counts(const kn_wave_params_t *p, uint32_t total, uint32_t n_r, uint32_t n_e, uint32_t *rank_r_p,
                         uint32_t *rank_e_p);

/* The output-aware cut, after kn_wave_rank_estimate (or kn_rank) ranked the
 * counts of kn_wave_rank_counts into ids: with adapt_tau > 0, keep in
 * ids[0, *nr) the fewest retrieval candidates (at least max(n_r / 4, 1)) that
 * leave at most adapt_tau of the candidates' estimated mass (centroid logit
 * + ln size, softmax per query head, averaged over the group) outside, and
 * move the rest to the front of the estimation zone (*ne grows by as many).
 * When o_e / l_e hold the estimate of the old estimation zone, the moved
 * clusters' estimate is merged into them; pass NULL when the estimation zone
 * is estimated later.  The kept ids are left in ascending order.  A no-op
 * with adapt_tau == 0. */
ri_status_t kn_wave_adapt(const kn_wave_params_t *p, const kn_ops_t *ops, const kn_shape_t *grp, const float *q,
                          const kn_index_t *idx, uint32_t n_r, uint32_t *ids, uint32_t *nr, uint32_t *ne, float *o_e,
                          float *l_e);

/* The first phase of a decode step for one KV head group, shared by every
 * engine: rank the index's clusters for q (grp: g query heads, one KV head)
 * into the retrieval zone ids[0, *nr) and the estimation zone ids[*nr,
 * *nr + *ne), and attend the estimation zone through its centroids into
 * (o_e [g][d], l_e [g]).  One pass over the centroids on the CPU backend
 * (rank and estimate fused), two elsewhere.  ids has room for n_r + n_e. */
ri_status_t kn_wave_rank_estimate(const kn_ops_t *ops, const kn_shape_t *grp, const float *q, const kn_index_t *idx,
                                  uint32_t n_r, uint32_t n_e, uint32_t *ids, uint32_t *nr, uint32_t *ne, float *o_e,
                                  float *l_e);

typedef struct kn_wave kn_wave_t;

/* The second phase of a decode step for KV head h of a wave's layer, shared
 * by every engine: exact attention over the steady zone (the sinks and the
 * tokens from the indexed end on, read from kv) and the retrieval zone's
 * pages, which the caller supplies wherever they are (ret, n_ret pages, in
 * rank order), into (o_x [g][d], l_x [g]); then the log-sum-exp merge of
 * that with the caller's n_parts other parts (the estimation zone, and the
 * remote engine's late clusters) into out [g][d] and lse [g] (may be NULL).
 * *exact_p (may be NULL) gets the tokens attended exactly. */
ri_status_t kn_wave_exact_merge(const kn_wave_t *w, uint32_t h, const float *q, const kn_kv_view_t *kv,
                                const kn_page_t *ret, size_t n_ret, float *o_x, float *l_x,
                                const float *const *part_o, const float *const *part_l, uint32_t n_parts,
                                float *out, float *lse, uint64_t *exact_p);

/* Where a wave keeps its clusters' K/V.  Without one (kn_wave_create) the
 * wave keeps its own cluster-major copy and decodes in process; with one
 * (kn_wave_create_store: the remote store of gpuworker/client) the store
 * keeps them wherever it likes, and the wave is the index, the budgets and
 * the build/update schedule, while the caller decodes with
 * kn_wave_rank_estimate over kn_wave_index. */
typedef struct kn_wave_store {
    void *ctx;
    /* After a build or an update clustered every head: clusters
     * [first[h], idx[h].n_clusters) of each head h are new (their tokens are
     * idx[h].perm[idx[h].offsets[c] ...], positions in kv).  Caller's thread;
     * an error fails the build or update. */
    ri_status_t (*append)(void *ctx, const kn_index_t *idx, const uint32_t *first, const kn_kv_view_t *kv);
} kn_wave_store_t;

/* Per-step figures (summed over KV heads). */
typedef struct kn_wave_stats {
    uint64_t exact_tokens;     /* steady + retrieved tokens attended exactly */
    uint64_t retrieved_tokens; /* tokens of the retrieval zone */
    uint64_t est_clusters;     /* clusters in the estimation zone */
    uint64_t bytes_read;       /* K/V + meta bytes the step read */
} kn_wave_stats_t;

/* Create an empty object for one layer.  Caller frees with kn_wave_destroy.
 * Errors: RI_ERR_INVALID (shape/params), RI_ERR_NOMEM. */
ri_status_t kn_wave_create(const kn_shape_t *shape, const kn_wave_params_t *params,
                           kn_wave_t **wave_p);

/* The same with the clusters kept by store (borrowed: it must outlive the
 * wave).  kn_wave_decode then answers RI_ERR_INVALID (the caller decodes). */
ri_status_t kn_wave_create_store(const kn_shape_t *shape, const kn_wave_params_t *params,
                                 const kn_wave_store_t *store, kn_wave_t **wave_p);

void kn_wave_destroy(kn_wave_t *wave);

/* Index tokens [sink, n - window) of kv (the prompt).  Called once, on an
 * empty object; with fewer than update_tokens indexable tokens nothing is
 * indexed and decode stays dense until the first update.  The range is cut
 * into blocks at absolute multiples of B = segment_tokens (block b =
 * positions [b B, (b+1) B), block 0 from the sink on, the last one possibly
 * partial) and each block is clustered on its own (one k-means segment,
 * kn_index_plan of its token count at the index's cluster size): the same
 * K/V in a block gives bit-identical clusters whatever surrounds it.  Empty
 * clusters are dropped, so every cluster holds at least one token and a
 * block's clusters are a contiguous run of the index (kn_wave_block_clusters);
 * the budget grows once (kn_wave_budget_grow) on the total cluster count. */
ri_status_t kn_wave_build(kn_wave_t *wave, const kn_kv_view_t *kv);

/* One block's clusters of one KV head of one layer, as an index holds them
 * (borrowed from whoever supplies it). */
typedef struct kn_wave_piece {
    uint32_t first_pos;          /* absolute position of the block's first token (b * B) */
    uint32_t n_clusters;         /* clusters of the block */
    const uint32_t *sizes;       /* [n_clusters] tokens per cluster (each >= 1) */
    const uint32_t *perm;        /* [sum sizes] ABSOLUTE token positions, cluster-major,
                                    ascending inside a cluster */
    const int8_t *centroids;     /* [n_clusters][d] int8 centroids */
    const float *cscale;         /* [n_clusters] their scales */
    const int8_t *vq;            /* [n_clusters][d] int8 value means */
    const float *vscale;         /* [n_clusters] their scales */
} kn_wave_piece_t;

/* The pieces of one layer's leading blocks.  get fills *piece_p with the
 * piece of (block, kv_head), pointers valid until the build that asked
 * returns; an error from it fails that build. */
typedef struct kn_wave_pieces {
    void *ctx;
    uint32_t n_blocks;           /* blocks [0, n_blocks) have pieces */
    ri_status_t (*get)(void *ctx, uint32_t block, uint32_t kv_head, kn_wave_piece_t *piece_p);
} kn_wave_pieces_t;

/* kn_wave_build, but the blocks b < pieces->n_blocks are imported: their
 * pieces are appended as given (no k-means; an in-process wave copies their
 * tokens' K/V from kv), and every other block of the indexed range is
 * clustered on its own as kn_wave_build does.  Each imported block must lie
 * wholly inside the indexed range [sink, n - window), the sinks excluded
 * (block 0's piece covers [sink, B)); its sizes must sum to the block's
 * indexed tokens and its perm name each of them once.  With a store,
 * store->append is called once with first[h] = the clusters imported for
 * head h (the store holds those already): clusters [first[h], n) are new.
 * pieces NULL or n_blocks 0 = kn_wave_build.  Pieces exported from a build
 * of the same K/V (kn_wave_block_clusters) give a bit-identical index.
 * Errors: RI_ERR_INVALID (a piece outside the indexed range, or a prompt too
 * short to index at all, inconsistent sizes / perm, NULL arrays), the get
 * callback's error, RI_ERR_NOMEM; on error the wave is unchanged. */
ri_status_t kn_wave_build_pieces(kn_wave_t *wave, const kn_kv_view_t *kv, const kn_wave_pieces_t *pieces);

/* The contiguous cluster range [*j0_p, *j1_p) of idx whose tokens lie in
 * [first_pos, first_pos + n_tokens): a block's piece is clusters [j0, j1)
 * (sizes, offsets into perm, centroids, cscale, vq, vscale).  Relies on the build's
 * order (a block's clusters before the next block's); j0 == j1 when none
 * lies there.  RI_ERR_INVALID when a cluster straddles the range's bounds
 * (the index was not cut there) or for NULL arguments. */
ri_status_t kn_wave_block_clusters(const kn_index_t *idx, uint32_t first_pos, uint32_t n_tokens, uint32_t *j0_p,
                                   uint32_t *j1_p);

/* If the steady zone holds sink + window + update_tokens tokens or more,
 * cluster the update_tokens oldest non-sink steady tokens into
 * update_clusters clusters and append them (repeats while due).
 * *updated_p (may be NULL) tells whether anything was appended. */
ri_status_t kn_wave_update(kn_wave_t *wave, const kn_kv_view_t *kv, bool *updated_p);

/* One decode step for all heads: q [n_q][d] -> out [n_q][d]; lse [n_q] or
 * NULL; stats_p may be NULL.  kv must cover every token indexed so far. */
ri_status_t kn_wave_decode(kn_wave_t *wave, const float *q, const kn_kv_view_t *kv, float *out,
                           float *lse, kn_wave_stats_t *stats_p);

/* Decode with retrieval / estimation counts forced per head (n_r, n_e are
 * capped at the clusters available); for invariant tests and sweeps. */
ri_status_t kn_wave_decode_budget(kn_wave_t *wave, const float *q, const kn_kv_view_t *kv,
                                  uint32_t n_r, uint32_t n_e, float *out, float *lse,
                                  kn_wave_stats_t *stats_p);

/* Mark in mask [kv->n_tokens] the tokens KV head kv_head attends exactly for
 * query q [n_q][d] with n_r retrieved clusters (steady zone + retrieval zone);
 * for accuracy metrics.  Errors: RI_ERR_INVALID, RI_ERR_NOMEM. */
ri_status_t kn_wave_exact_mask(kn_wave_t *wave, const float *q, const kn_kv_view_t *kv,
                               uint32_t kv_head, uint32_t n_r, uint8_t *mask);

/* Give KV head kv_head's index fixed homes for all its arrays (centroids,
 * their scales, value means and theirs, sizes, offsets, perm: kn_index_homes_t, room for
 * cap_clusters clusters and cap_tokens perm entries), before anything is
 * indexed.  The caller owns them and frees them after kn_wave_destroy; the
 * wave never moves or frees them (past either room it copies all seven to
 * its own heap arrays, contents kept, and leaves the homes alone).  What
 * for: a prefix's rows and tables shared by several sequences, mapped
 * copy-on-write at the homes' head (docs/prefix.md "Shared meta index"):
 * an imported piece whose bytes the homes hold already (rows, sizes,
 * offsets from 0, absolute positions in perm) is not written again, so
 * those pages stay shared, and the sequence's own clusters land after them
 * (the build, the updates and kn_wave_drop_empty write only past the
 * imported clusters).  offsets[0] must be (or is made) 0.  NULL homes give
 * placed homes back (before any build, or after a failed one).  Errors:
 * RI_ERR_INVALID (a home NULL, a room 0 or over UINT32_MAX / 2; a head
 * indexed, or placed already); on error nothing changes. */
ri_status_t kn_wave_place(kn_wave_t *wave, uint32_t kv_head, const kn_index_homes_t *homes);

/* The index of KV head h (borrowed, valid until the next build/update). */
const kn_index_t *kn_wave_index(const kn_wave_t *wave, uint32_t kv_head);

/* First token position after the indexed range. */
size_t kn_wave_indexed_end(const kn_wave_t *wave);

/* Does a view of n_tokens hold every token the index refers to?  Decode and
 * update need it.  Before anything is indexed any length is fine, a
 * sequence shorter than the sink included (a one-token prompt): its tokens
 * are all sink and attended densely. */
bool kn_wave_covers(const kn_wave_t *wave, size_t n_tokens);

/* Retrieval and estimation counts per head for the current index (the
 * shares with their minimums: kn_wave_budget_floor). */
void kn_wave_budget(const kn_wave_t *wave, uint32_t *n_r_p, uint32_t *n_e_p);

/* The wave's settings (borrowed). */
const kn_wave_params_t *kn_wave_params(const kn_wave_t *wave);

#endif /* KN_WAVE_H */
