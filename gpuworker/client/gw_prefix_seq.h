/*
 * Prefix reuse of one sequence (docs/prefix.md): the one flow libretroinfer
 * and ri-worker share.  Before prefill, gw_pfx_seq_begin computes the
 * prompt's block keys, attaches the longest cached run of them on a
 * kvstore connection, reads the blocks (mapped in place on the kvstore's
 * host, else PREFIX_GET) and parses them into a set the model preloads
 * from (gw_pfx_set_fill) and the wave build imports (gw_pfx_set_pieces);
 * the caller prefills only the rest.  Once the sequence's index is built,
 * gw_pfx_seq_publish PUTs the prompt's new attachable blocks.
 *
 * The connection is the caller's: a prefix-only kvstore session held for
 * the sequence's life (gw_pfx_conn_open: the "full" and in-process
 * "retroinfer" backends) or a remote session's own.  Attached blocks stay
 * referenced by that session until it ends; the set borrows the mappings
 * (owned by the connection), so the seq must be destroyed before it closes.
 *
 * A failure anywhere is never the request's: begin falls back to no
 * cached tokens, publish stops at the first block it cannot publish; both
 * count what happened in the caller's gw_pfx_stats_t.
 */
#ifndef GW_PREFIX_SEQ_H
#define GW_PREFIX_SEQ_H

#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "gpuworker/client/gw_ctl.h"
#include "gpuworker/client/gw_dp.h"
#include "gpuworker/client/gw_prefix.h"
#include "retroinfer/status.h"

/* Process-wide counters (atomics: any thread may add). */
typedef struct gw_pfx_stats {
    _Atomic uint64_t lookups;          /* sequences that looked their prompt up */
    _Atomic uint64_t hit_tokens;       /* prompt tokens served from attached blocks (prefill saved) */
    _Atomic uint64_t miss_tokens;      /* prompt tokens prefilled by a sequence that looked up */
    _Atomic uint64_t published_blocks; /* blocks PUT (new or already there) */
    _Atomic uint64_t attached_bytes;   /* bytes of the blocks attached by lookups */
    _Atomic uint64_t fallbacks;        /* lookups or publishes that failed (full prefill / not published) */
} gw_pfx_stats_t;

/* A worker's prefix reuse: one per loaded model, for the process's life. */
typedef struct gw_pfx_ctx {
    gw_pfx_keyer_t keyer; /* model digest and tenant salt */
    gw_ctl_t *ctl;        /* borrowed: the kvstore's control channel */
    uint32_t timeout_ms;  /* its calls' deadline */
    gw_pfx_stats_t stats;
} gw_pfx_ctx_t;

/* A prefix-only kvstore session. */
typedef struct gw_pfx_conn {
    gw_ctl_t *ctl; /* borrowed: outlives the connection */
    uint32_t timeout_ms;
    uint64_t session_id;
    gw_dp_t *dp; /* owned */
} gw_pfx_conn_t;

/* CreateSession for lay's geometry with a small expected size (the blocks
 * are not counted in it) and connect its data plane.  Caller closes with
 * gw_pfx_conn_close.  Errors: those of CreateSession and gw_dp_connect. */
ri_status_t gw_pfx_conn_open(gw_ctl_t *ctl, uint32_t timeout_ms, const gw_pfx_layout_t *lay, gw_pfx_conn_t **conn_p);
/* Disconnect and DropSession (the kvstore drops its references to the
 * attached blocks).  NULL is a no-op. */
void gw_pfx_conn_close(gw_pfx_conn_t *conn);

typedef struct gw_pfx_seq gw_pfx_seq_t;

/* Look the prompt ids[0..n) up on dp (borrowed; must outlive the seq) under
 * keyer / lay (window: the wave's recent window, for the attachable
 * blocks).  Never fails for a kvstore or block problem (cached 0, counted
 * as a fallback); RI_ERR_NOMEM only when nothing could be allocated.
 * Caller frees with gw_pfx_seq_destroy. */
ri_status_t gw_pfx_seq_begin(gw_dp_t *dp, const gw_pfx_keyer_t *keyer, const gw_pfx_layout_t *lay, uint32_t window,
                             const int32_t *ids, size_t n, gw_pfx_stats_t *stats, gw_pfx_seq_t **seq_p);

/* Prompt tokens [0, cached) the attached blocks hold (a multiple of B). */
size_t gw_pfx_seq_cached(const gw_pfx_seq_t *seq);

/* The prompt's block keys (attachable blocks x CM_PFX_KEY_SIZE bytes,
 * block order; borrowed from seq); the first gw_pfx_seq_cached / B of them
 * are the attached ones.  NULL when the prompt has no attachable block. */
const uint8_t *gw_pfx_seq_keys(const gw_pfx_seq_t *seq);

/* The parsed blocks (gw_pfx_set_fill / gw_pfx_set_pieces read them);
 * borrowed from seq; NULL when nothing is cached. */
gw_pfx_set_t *gw_pfx_seq_set(gw_pfx_seq_t *seq);

/* The preload failed after all: count a fallback and forget the blocks
 * (cached becomes 0; the prompt is prefilled whole). */
void gw_pfx_seq_drop(gw_pfx_seq_t *seq);

/* The blocks' contents are where they go (preloaded into the sequence's
 * K/V and, for an in-process index, imported by its build): free their
 * parse and PREFIX_GET copies, which every attached sequence would
 * otherwise hold for its whole life (the permutations alone are 4 bytes a
 * token and table).  cached and the keys stay (publish needs them);
 * gw_pfx_seq_set is NULL from here on.  NULL and a second call are no-ops. */
void gw_pfx_seq_release(gw_pfx_seq_t *seq);

/* The prompt's prefill is done (the caller prefilled n - cached tokens):
 * count the hit and miss tokens. */
void gw_pfx_seq_prefilled(gw_pfx_seq_t *seq);

/* PUT the prompt's attachable blocks past the cached ones, built from src
 * (the sequence's K/V and index), in block order; stops at the first one
 * that cannot be built or that the kvstore refuses.  *published_p (may be
 * NULL) gets how many went in.  Never an error for the request: returns
 * RI_OK unless nothing could be allocated. */
ri_status_t gw_pfx_seq_publish(gw_pfx_seq_t *seq, const gw_pfx_src_t *src, uint32_t *published_p);

void gw_pfx_seq_destroy(gw_pfx_seq_t *seq);

#endif /* GW_PREFIX_SEQ_H */
