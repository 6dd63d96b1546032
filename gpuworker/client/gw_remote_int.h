/*
 * Private to gw_remote*.c: the remote state of one sequence (gw_remote.h)
 * and the functions its three files share.  gw_remote.c: creation, upload,
 * the index (kn_wave with an uploading store), reconnect, stats;
 * gw_remote_mirror.c: the block cache, the mirror of the kvstore's cache
 * directory and the checking of fetch answers; gw_remote_decode.c: a step.
 */
#ifndef GW_REMOTE_INT_H
#define GW_REMOTE_INT_H

#include <stdatomic.h>
#include <string.h>

#include "common/cm_dp_proto.h"
#include "gpuworker/client/gw_copier.h"
#include "gpuworker/client/gw_cpg.h"
#include "gpuworker/client/gw_direct.h"
#include "gpuworker/client/gw_io.h"
#include "gpuworker/client/gw_meta_share.h"
#include "gpuworker/client/gw_prefix.h"
#include "gpuworker/client/gw_remote.h"

#define GW_NO_ID UINT32_MAX
#define GW_GMAX 64u   /* query heads per group handled on the stack */

/* What is remote of one KV head of a layer. */
typedef struct gw_head {
    uint32_t base;         /* ids [0, base) are the imported attached clusters, the same
                              local and kvstore id: not stored in rid and lid (an attached
                              prefix's clusters are most of a sequence's; gw_rid, gw_lid) */
    uint32_t *rid;         /* local cluster id j >= base -> kvstore id, at [j - base]
                              (GW_NO_ID: empty, never uploaded) */
    uint32_t rcap;         /* ids known: [0, rcap); rid and lid allocated for [base, rcap) */
    uint32_t n_remote;     /* clusters the kvstore holds for the head */
    uint32_t max_pages;    /* pages of the largest cluster */
    uint32_t n_attached;   /* clusters of attached prefix blocks: kvstore ids [0, n_attached),
                              local ids the same once the build imported them */
    uint32_t *lid;         /* kvstore id i >= base -> local cluster id, at [i - base] */
    gw_cpg_t cpg;          /* local cluster id -> its cache pages, for the cached ones only:
                              our mirror of the kvstore's directory (owned) */
} gw_head_t;

/* Index state of one layer, all KV heads.  The index, its budgets and its
 * build/update schedule are kn_wave's (one engine for in-process and remote);
 * the layer's store (gw_store_append) uploads what it clusters. */
typedef struct gw_layer {
    kn_wave_t *wave;       /* index, budgets, schedule; clusters kept by our store */
    kn_wave_store_t store; /* ctx = this layer */
    struct gw_remote *r;   /* owner, for the store */
    uint32_t layer;
    bool appendable;       /* the store's next upload is an APPEND (the layer was indexed,
                              or its tables hold attached prefix blocks) */
    bool adopted;          /* the build's store call mapped the imported clusters */
    const kn_index_t *idx; /* [n_kv] the wave's meta index (borrowed) */
    gw_head_t *hd;         /* [n_kv] what is remote of each KV head */
} gw_layer_t;

/* One decode step in flight (between decode_begin and decode_end). */
typedef struct gw_step {
    bool active;           /* begin done, end not yet */
    bool fetching;         /* job submitted */
    uint32_t layer;
    const float *q;        /* borrowed [n_q][d] */
    kn_kv_view_t kv;       /* copy of the caller's view */
    uint32_t n_r, n_e;     /* requested budgets */
    uint32_t want;         /* room per head in ids */
    size_t cap_ids;        /* allocated: n_kv * want */
    uint32_t *ids;         /* [n_kv][want] local cluster ids from kn_rank */
    uint32_t *req;         /* [n_kv * want] kvstore ids, head by head */
    uint32_t *lids;        /* [n_kv * want] the same clusters' local ids */
    uint32_t *nr, *ne;     /* [n_kv] counts from kn_rank */
    uint32_t *heads;       /* [n_kv] heads sent */
    uint32_t *counts;      /* [n_kv] ids per head sent */
    uint32_t *ent0;        /* [n_kv] first reply entry of each head */
    float *part;           /* [n_kv][2 g (d + 1)] exact and estimated parts */
    gw_io_job_t job;       /* the fetch */
    bool predicted;        /* every retrieved cluster was in the mirror: no wait */
    bool direct;           /* every retrieved cluster read from the kvstore's region: no fetch */
    bool estimated;        /* the estimation zone was computed at begin, with the ranking */
    bool degraded;         /* an earlier fetch is late: no fetch, mirror hits only */
    uint64_t submit_ns;    /* when the fetch was submitted (its deadline counts from here) */
    uint32_t *nl;          /* [n_kv] late clusters per head (after the retrieved ones in ids) */
    /* the fetch's own copies of what it asked (the io thread reads them, and
     * a late answer is checked against them after later steps reused ids) */
    uint32_t *jheads, *jcounts, *jreq, *jlids;
    size_t cap_j;
    uint32_t jn_heads;
    const uint8_t **paddr; /* page addresses of every entry, in entry order */
    uint32_t *eoff;        /* [entries] first page of each entry in paddr */
    uint32_t *etok;        /* [entries] tokens of each entry */
    size_t cap_paddr, cap_ent;
    _Atomic int status;    /* first failure of a parallel part */
    _Atomic uint64_t exact, retrieved, bytes;
    float *out, *lse;      /* decode_end's outputs */
    /* per KV head: the execution buffer its retrieved clusters are gathered
     * into when the kernel cannot read them in place, in the cache's space
     * (r->mem), grown by gw_step_resolve (NULL until a step needs one) */
    cm_fp16_t **xbuf;      /* [n_kv], each owned (r->mem->free) */
    size_t *xcap;          /* [n_kv] bytes of each */
    size_t *xgather;       /* [n_kv] tokens this step gathers into each */
} gw_step_t;

#define GW_PEND_MAX 64u

/* A predicted step's fetch and what we expect of its answer. */
typedef struct gw_pend {
    gw_io_job_t job;
    uint32_t layer;
    uint32_t *heads, *counts;  /* [n_kv] */
    uint32_t *ids;             /* kvstore ids sent */
    uint32_t *pages;           /* expected cache pages, entry after entry */
    size_t cap_ids, cap_pages;
} gw_pend_t;

struct gw_remote {
    kn_shape_t shape;        /* one layer */
    uint32_t n_layers, n_kv, g, d;
    gw_remote_params_t p;
    const kn_ops_t *ops;
    gw_io_t *io;             /* the connection and its thread */
    gw_direct_t *direct;     /* the session's region mapped here, or NULL (two-sided) */
    gw_layer_t *layers;      /* [n_layers] */
    uint64_t pages_uploaded; /* over all layers */
    uint32_t P;              /* tokens per page (gw_remote_page_tokens) */
    size_t page_bytes;       /* 4 * P * d */
    /* wave buffer */
    bool registered;
    uint32_t cache_id;
    uint32_t cache_pages;
    uint8_t *cache;          /* [cache_pages][page_bytes], in mem */
    const kn_mem_t *mem;     /* the cache's memory space (borrowed) */
    const kn_mem_t *kvm;     /* the space ops reads (kn_mem_of): where the caller's K/V may be;
                                the upload copies it down through this space */
    gw_copier_t *copier;     /* moves admitted misses from recv into cache pages */
    gw_ticket_t admit_t;     /* the last admission copy queued (GW_TICKET_NONE: none) */
    uint8_t *recv;           /* receive buffer (UCX-registered) */
    size_t recv_len;
    void **old_recv;         /* earlier receive buffers, registered until close */
    size_t n_old;
    gw_step_t step;
    /* fetches sent for their LRU effect only (predicted all-hit steps), not
     * waited for; checked in order once done */
    gw_pend_t pend[GW_PEND_MAX];
    uint32_t pend_first, pend_n;
    /* a fetch that missed its step's deadline, still in flight in step.job;
     * no new fetch is sent until it is applied (its misses sit in recv) */
    bool late;
    uint32_t late_layer;
    ri_status_t err;         /* sticky */
    gw_remote_stats_t st;
    /* prefix blocks attached to the session (gw_remote_prefix.c) */
    gw_pfx_set_t *pfx;       /* parsed, in block order (owned); NULL = none, or released
                                once every layer's build imported it (gw_prefix_built) */
    uint8_t **pfx_copies;    /* [pfx_cap] PREFIX_GET copies (blocks not mappable here), owned,
                                freed with pfx */
    uint32_t pfx_cap;
    uint32_t pfx_blocks;     /* blocks attached (stays after the release) */
    uint32_t pfx_built;      /* layers whose build imported pfx */
    gw_meta_homes_t *meta;   /* the attached prefix's rows shared with the process's other
                                sequences (gw_meta_share.h), or NULL: the index's own */
};

static inline uint32_t gw_pages(const gw_remote_t *r, uint32_t tokens)
{
    return (tokens + r->P - 1) / r->P;
}

static inline bool gw_kv_valid(const kn_kv_view_t *kv)
{
    return kv != NULL && (kv->n_tokens == 0 || (kv->k != NULL && kv->v != NULL)) && kv->n_tokens < UINT32_MAX / 2;
}

/* A ranked fetch of layer for n_heads heads (arrays borrowed by the job
 * until it is done), into the cache registered now. */
static inline void gw_fetch_job_init(gw_io_job_t *job, const gw_remote_t *r, uint32_t layer, uint32_t n_heads,
                                     uint32_t *heads, uint32_t *counts, const uint32_t *ids)
{
    memset(job, 0, sizeof(*job));
    job->kind = GW_IO_FETCH;
    job->cache_id = r->cache_id;
    job->layer = layer;
    job->n_heads = n_heads;
    job->heads = heads;
    job->counts = counts;
    job->ids = ids;
    job->recv_offset = 0;
    job->timeout_ms = r->p.timeout_ms;
}

/* Room for ids [0, want) in H's rid and lid. */
ri_status_t gw_head_reserve(gw_head_t *H, uint32_t want);

/* The kvstore id of H's local cluster j (j < rcap). */
static inline uint32_t gw_rid(const gw_head_t *H, uint32_t j)
{
    return j < H->base ? j : H->rid[j - H->base];
}

/* The local id of H's kvstore cluster i (i < rcap). */
static inline uint32_t gw_lid(const gw_head_t *H, uint32_t i)
{
    return i < H->base ? i : H->lid[i - H->base];
}

/* Local cluster j is kvstore cluster i (both >= base, < rcap); i GW_NO_ID:
 * j is empty, never uploaded. */
static inline void gw_ids_set(gw_head_t *H, uint32_t j, uint32_t i)
{
    H->rid[j - H->base] = i;
    if (i != GW_NO_ID)
        H->lid[i - H->base] = j;
}

/* Store every id again (base 0): before a re-fill renumbers them all. */
ri_status_t gw_head_unbase(gw_head_t *H);

/* --- gw_remote_prefix.c --- */

/* The build's store call of layer L: map the first[h] clusters the build
 * imported (ids [0, first[h]) local and remote) before the new ones are
 * queued.  RI_ERR_INTERNAL when they are not the attached ones. */
ri_status_t gw_prefix_adopt(gw_remote_t *r, gw_layer_t *L, const uint32_t *first);

/* The wave-index pieces of layer's attached blocks, or NULL. */
const kn_wave_pieces_t *gw_prefix_pieces(gw_remote_t *r, uint32_t layer);

/* Layer's build (kn_wave_build_pieces) succeeded: once every layer's did,
 * the blocks' parse and copies are no longer read (the indexes hold the
 * imported pieces, the kvstore the clusters), so they are freed rather
 * than kept for the sequence's life. */
void gw_prefix_built(gw_remote_t *r, uint32_t layer);

/* Free the attached blocks' parse and copies. */
void gw_prefix_free(gw_remote_t *r);

/* --- gw_remote_mirror.c --- */

/* Forget every cached cluster (a new connection's cache starts empty). */
void gw_mirror_clear(gw_remote_t *r);

/* Record what a checked answer did to the directory: admissions, evictions. */
ri_status_t gw_mirror_apply(gw_remote_t *r, uint32_t layer, const cm_dp_fetch_reply_view_t *v, const uint32_t *lids);

/* Predicted steps' fetches: send one (its answer checked later), check those
 * that are in (block: wait for all), and wait for all of them. */
ri_status_t gw_pend_submit(gw_remote_t *r, uint32_t layer, uint32_t n_heads, uint64_t k);
ri_status_t gw_pend_reap(gw_remote_t *r, bool block);
ri_status_t gw_pend_complete(gw_remote_t *r);

/* Register (or re-register, emptying the cache) a receive buffer of at
 * least need bytes. */
ri_status_t gw_remote_register(gw_remote_t *r, size_t need);

/* Check step.job's answer against what it asked; count hits and misses. */
ri_status_t gw_fetch_check(gw_remote_t *r, uint32_t layer);

/* Apply the late fetch once it is in (block: wait for it), between steps. */
ri_status_t gw_late_reap(gw_remote_t *r, bool block);

/* Queue the copies of the admitted misses of step.job's answer into their
 * cache pages (they land asynchronously: gw_admit_wait).  A copier error
 * breaks the object and forgets the mirror (no cluster is left claimed by
 * pages whose bytes did not land). */
ri_status_t gw_step_admit(gw_remote_t *r);

/* Wait for the queued admissions: before the cache is read, the receive
 * buffer reused or either freed.  Errors as gw_step_admit. */
ri_status_t gw_admit_wait(gw_remote_t *r);

#endif /* GW_REMOTE_INT_H */
