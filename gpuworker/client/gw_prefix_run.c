/*
 * Prefix reuse around an in-process model sequence (gw_prefix_run.h): one
 * prefix-only kvstore session per request, a lookup before the prefill and
 * one publish once the index is built.  The session lives as long as the
 * sequence, except a remote sequence's, which ends at the publish (its
 * own session holds the blocks it reads).
 */
#include "gpuworker/client/gw_prefix_run.h"

#include <stdio.h>
#include <string.h>

#include "common/cm_alloc.h"
#include "common/cm_log.h"
#include "common/cm_status.h"
#include "gpuworker/client/gw_attn_remote.h"
#include "gpuworker/client/gw_remote.h"

static CM_ALLOC_TAG(gw_pfx_run_tag, "gw.prefix.run");

struct gw_pfx_run {
    gw_pfx_ctx_t *ctx; /* borrowed */
    gw_pfx_layout_t lay;
    gw_pfx_conn_t *conn;  /* owned; NULL when the kvstore could not be reached, and
                             for a remote sequence once it published */
    gw_pfx_seq_t *seq;    /* owned; NULL when no conn was opened (its dp is conn's:
                             unused once published) */
    mdl_prefix_src_t src; /* what the sequence's build reads (cfg.prefix) */
    mdl_attn_cfg_t cfg;   /* the sequence's settings, prefix set */
    bool published;       /* publish ran */
    bool release_window;  /* the caller's cfg.release_window: back on once published */
    bool remote;          /* "retroinfer-remote": the backend attaches the keys and
                             calls src.built, where the run publishes */
    const mdl_seq_t *mseq; /* the sequence (the caller's), for src.built */
    char node[CM_CLUSTER_NAME_MAX]; /* in a cluster: the node chosen for the request ("" = none) */
};

bool gw_pfx_run_supports(const mdl_attn_ops_t *attn)
{
    return attn != NULL && (strcmp(attn->name, "full") == 0 || strcmp(attn->name, "retroinfer") == 0 ||
                            strcmp(attn->name, GW_ATTN_REMOTE_NAME) == 0);
}

static const kn_wave_pieces_t *gw_pfx_run_pieces(void *ctx, uint32_t layer)
{
    gw_pfx_run_t *run = ctx;
    return gw_pfx_seq_cached(run->seq) > 0 ? gw_pfx_set_pieces(gw_pfx_seq_set(run->seq), layer) : NULL;
}

static void gw_pfx_run_publish(gw_pfx_run_t *run, const mdl_seq_t *seq);

/* src.built of a remote backend: its K/V and index are whole now, and
 * about to be given back. */
static void gw_pfx_run_built(void *ctx)
{
    gw_pfx_run_t *run = ctx;
    if (run->mseq != NULL)
        gw_pfx_run_publish(run, run->mseq);
}

/* What the sequence starts from: the cached blocks (their keys for a
 * remote backend, which attaches them itself) and, for a remote backend,
 * the publish hook, also when nothing is cached. */
static void gw_pfx_run_src(gw_pfx_run_t *run)
{
    size_t cached = gw_pfx_seq_cached(run->seq);
    run->cfg.prefix = NULL;
    if (cached == 0 && !(run->remote && run->seq != NULL))
        return;
    run->src = (mdl_prefix_src_t){.ctx = run, .n_tokens = cached, .pieces = gw_pfx_run_pieces};
    if (run->remote) {
        run->src.keys = cached > 0 ? gw_pfx_seq_keys(run->seq) : NULL;
        run->src.n_keys = (uint32_t)(cached / run->lay.block_tokens);
        run->src.built = gw_pfx_run_built;
    }
    run->cfg.prefix = &run->src;
}

/* The prompt's layout: the wave's cluster size for this prompt and the
 * kvstore page size a remote session of it would use (so that in-process
 * and remote RetroInfer workers name the same blocks alike). */
static bool gw_pfx_run_layout(const mdl_model_t *m, const mdl_attn_ops_t *attn, const mdl_attn_cfg_t *cfg, size_t n,
                              gw_pfx_layout_t *lay)
{
    const kn_wave_params_t *w = &cfg->wave;
    bool indexed = strcmp(attn->name, "full") != 0;
    uint32_t cs = 0, pt = 1;

    if (indexed) {
        if (n < (size_t)w->sink_tokens + w->window_tokens + w->update_tokens)
            return false; /* too short to index: nothing to import or publish */
        gw_remote_params_t g;
        gw_remote_params_default(&g);
        g.wave = *w; /* as configured: a session's pages are chosen before its index resolves an
                        auto cluster size (1-token pages then, whatever the prompt) */
        cs = kn_wave_cluster_tokens(w, n - w->sink_tokens - w->window_tokens);
        pt = gw_remote_page_tokens(&g);
    }
    kn_wave_params_t wb = *w;
    if (wb.segment_tokens == 0)
        wb.segment_tokens = KN_WAVE_SEGMENT_TOKENS;
    gw_pfx_layout_init(mdl_model_hparams(m), &wb, indexed, cs, pt, lay);
    return true;
}

/* Preload seq from the run's blocks; false (the sequence stays empty) on
 * a failure. */
static bool gw_pfx_run_preload(gw_pfx_run_t *run, mdl_seq_t *seq)
{
    gw_pfx_set_t *set = gw_pfx_seq_set(run->seq);
    ri_status_t st = mdl_seq_preload(seq, gw_pfx_seq_cached(run->seq), gw_pfx_set_fill, set);
    if (st != RI_OK)
        cm_warn("prefix: preload of %zu tokens failed (%s): the prompt is prefilled whole", gw_pfx_seq_cached(run->seq),
                ri_status_str(st));
    return st == RI_OK;
}

/* Cluster mode: the node of this request, chosen from the prompt's block
 * keys (prefix-aware, missing blocks copied there), and its channel. */
static gw_ctl_t *gw_pfx_run_place(gw_pfx_ctx_t *ctx, const gw_pfx_layout_t *lay, const int32_t *ids, uint32_t n_blocks,
                                  uint32_t *timeout_ms_p)
{
    uint8_t *keys = cm_malloc(&gw_pfx_run_tag, (size_t)n_blocks * CM_PFX_KEY_SIZE);
    bool have = keys != NULL && gw_pfx_keys(&ctx->keyer, lay, ids, n_blocks, keys) == RI_OK;
    gw_ctl_t *ctl = gw_attn_remote_place(lay, have ? keys : NULL, have ? n_blocks : 0, timeout_ms_p);
    cm_free(keys);
    return ctl;
}

ri_status_t gw_pfx_run_create(gw_pfx_ctx_t *ctx, mdl_model_t *m, const mdl_attn_ops_t *attn, const mdl_attn_cfg_t *cfg,
                              size_t cap, const int32_t *ids, size_t n, gw_pfx_run_t **run_p, mdl_seq_t **seq_p)
{
    gw_pfx_run_t *run = cm_calloc(&gw_pfx_run_tag, 1, sizeof(*run));
    mdl_seq_t *seq = NULL;
    ri_status_t st;

    if (run == NULL)
        return RI_ERR_NOMEM;
    run->ctx = ctx;
    run->cfg = *cfg;
    run->cfg.prefix = NULL;
    /* a published block reads every token of its layers: keep them until
     * the publish (gw_pfx_run_prefilled turns the caller's choice back on) */
    run->release_window = cfg->release_window;
    run->cfg.release_window = false;
    /* In a cluster the prefix-only session and the sequence's session must
     * share a node (an attach is node-local): the node is chosen here, once
     * for the request, and the remote backend places the sequence there. */
    gw_ctl_t *ctl = ctx->ctl;
    uint32_t timeout_ms = ctx->timeout_ms;
    bool placed = ctl == NULL && gw_attn_remote_clustered();
    ri_status_t open_st = RI_ERR_NOT_FOUND;   /* of the prefix session, when one was tried */
    run->remote = strcmp(attn->name, GW_ATTN_REMOTE_NAME) == 0;
    /* no kvstore session for a prompt with no attachable block (most chats) */
    if (gw_pfx_run_layout(m, attn, cfg, n, &run->lay) && gw_pfx_max_blocks(&run->lay, cfg->wave.window_tokens, n) > 0 &&
        (!placed || (ctl = gw_pfx_run_place(ctx, &run->lay, ids, gw_pfx_max_blocks(&run->lay, cfg->wave.window_tokens,
                                                                                   n), &timeout_ms)) != NULL) &&
        (open_st = gw_pfx_conn_open(ctl, timeout_ms, &run->lay, &run->conn)) == RI_OK) {
        if (placed)
            snprintf(run->node, sizeof(run->node), "%s", gw_attn_remote_placed_node());
        st = gw_pfx_seq_begin(run->conn->dp, &ctx->keyer, &run->lay, cfg->wave.window_tokens, ids, n, &ctx->stats,
                              &run->seq);
        if (st != RI_OK)
            goto err_free;
    } else if (run->conn == NULL && run->lay.block_tokens != 0 &&
               gw_pfx_max_blocks(&run->lay, cfg->wave.window_tokens, n) > 0) {
        atomic_fetch_add(&ctx->stats.fallbacks, 1); /* the kvstore could not be reached */
        if (run->remote && !placed && open_st == RI_ERR_UNREACHABLE) {
            /* The remote sequence needs that kvstore too.  Fail now rather
             * than create it without the prefix session when the kvstore
             * comes back a moment later (a restart: a sequence rebuilt after
             * a crash would then never publish its blocks); the caller's
             * retry finds both. */
            st = RI_ERR_UNREACHABLE;
            goto err_free;
        }
    }
    gw_pfx_run_src(run);
    st = mdl_seq_create(m, attn, &run->cfg, cap, &seq);
    if (gw_pfx_seq_cached(run->seq) > 0 && (st != RI_OK || !gw_pfx_run_preload(run, seq))) {
        /* a remote backend could not attach every block, or the preload
         * failed: prefill the prompt whole (and still publish) */
        if (st == RI_OK)
            mdl_seq_destroy(seq);
        seq = NULL;
        gw_pfx_seq_drop(run->seq);
        gw_pfx_run_src(run);
        st = mdl_seq_create(m, attn, &run->cfg, cap, &seq);
    }
    if (placed)
        gw_attn_remote_place_clear();
    if (st != RI_OK)
        goto err_free;
    /* A remote backend attached and parsed the blocks on its own session
     * (its build imports those): ours served the preload only. */
    if (run->remote)
        gw_pfx_seq_release(run->seq);
    run->mseq = seq;
    *run_p = run;
    *seq_p = seq;
    return RI_OK;
err_free:
    if (placed)
        gw_attn_remote_place_clear();
    gw_pfx_run_destroy(run);
    return st;
}

size_t gw_pfx_run_cached(const gw_pfx_run_t *run)
{
    return run != NULL && run->cfg.prefix != NULL ? run->src.n_tokens : 0;
}

static const kn_index_t *gw_pfx_run_index(void *ctx, uint32_t layer, uint32_t kv_head)
{
    return mdl_seq_wave_index(ctx, layer, kv_head);
}

static void gw_pfx_run_publish(gw_pfx_run_t *run, const mdl_seq_t *seq)
{
    if (run == NULL || run->seq == NULL || run->published)
        return;
    run->published = true;
    gw_pfx_src_t src = { mdl_seq_kv(seq), (void *)seq, run->lay.indexed ? gw_pfx_run_index : NULL };
    uint32_t published = 0;
    (void)gw_pfx_seq_publish(run->seq, &src, &published);
    /* In a cluster, copies on other nodes (--prefix-replicas): a sequence
     * rebuilt after its node died attaches them there, not prefilling */
    uint32_t held = (uint32_t)(gw_pfx_seq_cached(run->seq) / run->lay.block_tokens) + published;
    if (run->node[0] != '\0' && held > 0)
        gw_attn_remote_replicate(&run->lay, gw_pfx_seq_keys(run->seq), held, run->node);
    /* A remote sequence's own session attached the blocks it reads and
     * holds their references; the prefix-only session served the lookup
     * and this publish, and nothing reads through it again.  Ending it now
     * rather than with the sequence saves each decoding sequence a second
     * kvstore session and UCX connection (about 0.35 MiB of the worker's
     * memory, and a session's reservation in the kvstore's pool). */
    if (run->remote) {
        gw_pfx_conn_close(run->conn);
        run->conn = NULL;
    }
}

static void gw_pfx_run_publish_now(gw_pfx_run_t *run, mdl_model_t *m, mdl_seq_t *seq);

void gw_pfx_run_prefilled(gw_pfx_run_t *run, mdl_model_t *m, mdl_seq_t *seq)
{
    if (run == NULL)
        return;
    if (run->seq != NULL) {
        gw_pfx_seq_prefilled(run->seq);
        gw_pfx_run_publish_now(run, m, seq);
    }
    /* published (or nothing to publish): the sliding-window layers' old
     * K/V may go now, as without prefix reuse (Gemma 3 at 32K: 0.5 GB a
     * sequence otherwise) */
    if (run->release_window && (run->published || run->seq == NULL))
        mdl_seq_set_release_window(seq, true);
}

/* Build the index if the backend builds it later, and publish. */
static void gw_pfx_run_publish_now(gw_pfx_run_t *run, mdl_model_t *m, mdl_seq_t *seq)
{
    if (run->published)
        return;
    /* The wave backends build their index at the first decode step, which
     * a request that ends at its first token (max_tokens 1, a stop) never
     * takes: build it now, the same index from the same K/V, so that such
     * a request (a cache warm-up) publishes too. */
    ri_status_t st = run->lay.indexed ? mdl_seq_build(m, seq) : RI_OK;
    if (st != RI_OK) {
        /* the first decode step tries the build again and reports it; a
         * remote backend still publishes from src.built then */
        cm_warn("prefix: index build after the prefill failed (%s): blocks not published yet", ri_status_str(st));
        return;
    }
    gw_pfx_run_publish(run, seq);
    /* built: the index imported the blocks' pieces and holds its own copy,
     * and no later step builds again (mdl_seq_build) */
    gw_pfx_seq_release(run->seq);
}

void gw_pfx_run_destroy(gw_pfx_run_t *run)
{
    if (run == NULL)
        return;
    gw_pfx_seq_destroy(run->seq);
    gw_pfx_conn_close(run->conn);
    cm_free(run);
}
