/*
 * The wave index of one layer of one sequence kept where a kernels backend
 * reads it, stepped with that backend's wave_step op (docs/cuda.md
 * "Tripartite attention on the device").  Library ri_model, built with
 * kernels/.
 *
 * A kn_wave object made with a store (kn_wave_create_store) keeps the
 * build/update schedule, the budgets and the host index (ranking happens
 * in the backend, but the schedule and the budget are the wave's); this
 * object is that store: after each build or update it copies the new
 * clusters' meta (int8 centroids and value means + their scales, sizes, first rows) and
 * their K/V rows, cluster-major, into arrays of a memory space (kn_mem.h),
 * the layout of kn_wave_head_t.  A step is then ONE ops->wave_step for every
 * KV head of the layer: the retrieval and estimation budgets of the wave,
 * the steady zone (the sinks [0, sink) and [indexed_end, n)) read from the
 * sequence's K/V, which lies in the same space.
 *
 * With the host space and the ref or cpu table it runs anywhere, which is
 * how its logic is tested; with the cuda space and table it is the device
 * decode of "retroinfer" (mdl_dev.h).  Every pointer in a kn_kv_view_t
 * given here is memory of the object's space.
 *
 * Not thread-safe per object.
 */
#ifndef MDL_DWAVE_H
#define MDL_DWAVE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "kernels/kn_mem.h"
#include "kernels/kn_ops.h"
#include "kernels/kn_wave.h"
#include "retroinfer/status.h"

typedef struct mdl_dwave mdl_dwave_t;

/* Figures summed over steps (mdl_attn_stats_t's meaning). */
typedef struct mdl_dwave_stats {
    uint64_t steps;          /* steps taken */
    uint64_t exact_tokens;   /* tokens attended exactly, per KV head (steady + retrieved) */
    uint64_t bytes_read;     /* K/V + meta bytes the steps read (as kn_wave_decode counts) */
    uint64_t index_bytes;    /* bytes held in the space now (meta + cluster-major K/V) */
    double build_s;          /* seconds in builds and updates */
} mdl_dwave_stats_t;

/* An empty index for one layer of geometry shape, settings params (its ops
 * field is ignored: ops is used), run with ops over memory of mem (both
 * borrowed, static lifetime as kn_ops_* / kn_mem_* give them).  Errors:
 * RI_ERR_UNSUPPORTED for settings wave_step does not do (adapt_tau > 0, or
 * a shape ops' wave_step does not take), RI_ERR_INVALID for a bad shape or
 * params, RI_ERR_NOMEM; err (may be NULL) says why.  Caller frees with
 * mdl_dwave_destroy. */
ri_status_t mdl_dwave_create(const kn_shape_t *shape, const kn_wave_params_t *params, const kn_ops_t *ops,
                             const kn_mem_t *mem, mdl_dwave_t **w_p, char *err, size_t errlen);
void mdl_dwave_destroy(mdl_dwave_t *w);

/* Index the prompt, kv's tokens (kn_wave_build: a prompt shorter than
 * sink + window + update_tokens indexes nothing).  Once, on an empty
 * object.  On error nothing is indexed. */
ri_status_t mdl_dwave_build(mdl_dwave_t *w, const kn_kv_view_t *kv);

/* Cluster the oldest steady tokens when due (kn_wave_update); *updated_p
 * (may be NULL) tells whether anything was added. */
ri_status_t mdl_dwave_update(mdl_dwave_t *w, const kn_kv_view_t *kv, bool *updated_p);

/* One decode step of every KV head: q [n_q][d] -> out [n_q][d], both in
 * memory ops reads (host, or the space's).  kv covers every token so far.
 * ids (host, may be NULL) gets per head n_r + n_e slots of the step's
 * budget (mdl_dwave_budget): the retrieved ids then the estimated ones,
 * each set ascending; counts (host, may be NULL) per head {retrieved,
 * estimated}.  Before anything is indexed the step is exact attention over
 * kv (ids and counts then get nothing: counts all 0). */
ri_status_t mdl_dwave_step(mdl_dwave_t *w, const float *q, const kn_kv_view_t *kv, float *out, uint32_t *ids,
                           uint32_t *counts);

/* The budget a step uses now (kn_wave_budget). */
void mdl_dwave_budget(const mdl_dwave_t *w, uint32_t *n_r_p, uint32_t *n_e_p);

/* The wave that keeps the schedule and the host index (borrowed). */
const kn_wave_t *mdl_dwave_wave(const mdl_dwave_t *w);

void mdl_dwave_stats(const mdl_dwave_t *w, mdl_dwave_stats_t *st_p);

#endif /* MDL_DWAVE_H */
