/*
 * Prefix reuse of one sequence: lookup before prefill, publish after the
 * index build (gw_prefix_seq.h).  One lookup and at most one publish per
 * request; the blocks are a few MB each, read in place when mapped.
 */
#include "gpuworker/client/gw_prefix_seq.h"

#include <string.h>

#include "common/cm_alloc.h"
#include "common/cm_log.h"
#include "common/cm_status.h"

static CM_ALLOC_TAG(gw_pfx_seq_tag, "gw.prefix.seq");

/* The expected size of a prefix-only session: it uploads nothing itself,
 * so it reserves as little as the kvstore allows (a session with no
 * expected size gets no direct region, and mapping its blocks needs one:
 * MAP names the handover socket).  Every request holds one of these while
 * it lives; sixteen requests on one document must not reserve sixteen
 * blocks' worth. */
#define GW_PFX_CONN_EXPECTED_TOKENS 1u

struct gw_pfx_seq {
    gw_dp_t *dp; /* borrowed */
    gw_pfx_layout_t lay;
    gw_pfx_stats_t *stats; /* borrowed */
    size_t n;              /* prompt tokens */
    uint32_t max_blocks;   /* attachable blocks of the prompt */
    uint8_t *keys;         /* [max_blocks][32] */
    uint32_t n_cached;     /* blocks attached (and parsed until gw_pfx_seq_release) */
    gw_pfx_set_t *set;     /* owned; NULL when nothing is cached or once released */
    uint8_t **copies;      /* [max_blocks] PREFIX_GET copies (another host), owned */
};

ri_status_t gw_pfx_conn_open(gw_ctl_t *ctl, uint32_t timeout_ms, const gw_pfx_layout_t *lay, gw_pfx_conn_t **conn_p)
{
    gw_ctl_geometry_t geo = { .layers = lay->n_layers,
                              .kv_heads = lay->n_kv_heads,
                              .head_dim = lay->head_dim,
                              .dtype = lay->dtype,
                              .page_tokens = lay->page_tokens };
    gw_ctl_session_t sess;
    gw_ctl_error_t err = { 0 };
    gw_dp_options_t dopt = { .timeout_ms = timeout_ms };
    gw_pfx_conn_t *c;
    ri_status_t st;

    c = cm_calloc(&gw_pfx_seq_tag, 1, sizeof(*c));
    if (c == NULL)
        return RI_ERR_NOMEM;
    c->ctl = ctl;
    c->timeout_ms = timeout_ms;
    st = gw_ctl_create_session(ctl, timeout_ms, &geo, GW_PFX_CONN_EXPECTED_TOKENS, "prefix", &sess, &err);
    if (st != RI_OK) {
        cm_warn("prefix: CreateSession: %s (%s)", ri_status_str(st), err.message);
        goto err_free;
    }
    c->session_id = sess.session_id;
    st = gw_dp_connect(sess.dataplane_address, sess.session_id, sess.secret, &dopt, &c->dp);
    if (st != RI_OK) {
        cm_warn("prefix: data plane of session %llu: %s", (unsigned long long)sess.session_id, ri_status_str(st));
        goto err_drop;
    }
    *conn_p = c;
    return RI_OK;
err_drop:
    (void)gw_ctl_drop_session(ctl, timeout_ms, sess.session_id, NULL, NULL);
err_free:
    cm_free(c);
    return st;
}

void gw_pfx_conn_close(gw_pfx_conn_t *conn)
{
    if (conn == NULL)
        return;
    gw_dp_close(conn->dp);
    (void)gw_ctl_drop_session(conn->ctl, conn->timeout_ms, conn->session_id, NULL, NULL);
    cm_free(conn);
}

/* The bytes of attached block i (slot a->slot): in place when the kvstore
 * maps it here, else a PREFIX_GET copy owned by seq. */
static ri_status_t gw_pfx_seq_read(gw_pfx_seq_t *seq, uint32_t i, const cm_pfx_attached_t *a, const uint8_t **buf_p,
                                   uint64_t *len_p)
{
    const uint8_t *base = NULL;
    uint64_t bytes = 0;
    ri_status_t st = gw_dp_map_block(seq->dp, a->slot, &base, &bytes);

    if (st == RI_OK) {
        if (bytes < a->block_bytes)
            return RI_ERR_TRUNCATED;
        *buf_p = base;
        *len_p = a->block_bytes;
        return RI_OK;
    }
    if (st != RI_ERR_UNSUPPORTED)
        return st;
    if (a->block_bytes == 0 || a->block_bytes > CM_PFX_MAX_BLOCK_BYTES)
        return RI_ERR_PROTOCOL;
    seq->copies[i] = cm_malloc_aligned(&gw_pfx_seq_tag, (size_t)a->block_bytes, 64);
    if (seq->copies[i] == NULL)
        return RI_ERR_NOMEM;
    st = gw_dp_prefix_get(seq->dp, a->slot, 0, seq->copies[i], a->block_bytes);
    if (st != RI_OK)
        return st;
    *buf_p = seq->copies[i];
    *len_p = a->block_bytes;
    return RI_OK;
}

/* Attach and parse the longest cached run of the prompt's blocks. */
static ri_status_t gw_pfx_seq_lookup(gw_pfx_seq_t *seq)
{
    cm_pfx_attached_t *att = cm_calloc(&gw_pfx_seq_tag, seq->max_blocks, sizeof(*att));
    uint32_t n_att = 0;
    uint64_t bytes = 0;
    ri_status_t st;

    if (att == NULL)
        return RI_ERR_NOMEM;
    /* by slot only: the sequence's own session attaches the blocks for
     * their clusters (a remote backend), or nothing reads them by id */
    st = gw_dp_prefix_attach_flags(seq->dp, seq->keys, seq->max_blocks, CM_PFX_ATTACH_F_SLOTS, att, &n_att);
    if (st == RI_OK && n_att > 0)
        st = gw_pfx_set_create(&seq->lay, n_att, &seq->set);
    for (uint32_t i = 0; i < n_att && st == RI_OK; i++) {
        const uint8_t *buf = NULL;
        uint64_t len = 0;
        if (att[i].slot != i || att[i].n_tokens != seq->lay.block_tokens) {
            st = RI_ERR_PROTOCOL; /* a prefix-only session's slots are its blocks */
            break;
        }
        st = gw_pfx_seq_read(seq, i, &att[i], &buf, &len);
        if (st == RI_OK)
            st = gw_pfx_set_add(seq->set, buf, len);
        if (st == RI_OK)
            bytes += len;
    }
    cm_free(att);
    if (st != RI_OK)
        cm_warn("prefix: lookup of %u blocks failed (%s): the prompt is prefilled whole", seq->max_blocks,
                ri_status_str(st));
    else
        seq->n_cached = n_att;
    atomic_fetch_add(&seq->stats->attached_bytes, bytes);
    return st;
}

ri_status_t gw_pfx_seq_begin(gw_dp_t *dp, const gw_pfx_keyer_t *keyer, const gw_pfx_layout_t *lay, uint32_t window,
                             const int32_t *ids, size_t n, gw_pfx_stats_t *stats, gw_pfx_seq_t **seq_p)
{
    gw_pfx_seq_t *seq = cm_calloc(&gw_pfx_seq_tag, 1, sizeof(*seq));
    ri_status_t st = RI_OK;

    if (seq == NULL)
        return RI_ERR_NOMEM;
    seq->dp = dp;
    seq->lay = *lay;
    seq->stats = stats;
    seq->n = n;
    seq->max_blocks = gw_pfx_max_blocks(lay, window, n);
    atomic_fetch_add(&stats->lookups, 1);
    if (seq->max_blocks > 0) {
        seq->keys = cm_malloc(&gw_pfx_seq_tag, (size_t)seq->max_blocks * CM_PFX_KEY_SIZE);
        seq->copies = cm_calloc(&gw_pfx_seq_tag, seq->max_blocks, sizeof(*seq->copies));
        if (seq->keys == NULL || seq->copies == NULL) {
            gw_pfx_seq_destroy(seq);
            return RI_ERR_NOMEM;
        }
        st = gw_pfx_keys(keyer, lay, ids, seq->max_blocks, seq->keys);
        if (st == RI_OK)
            st = gw_pfx_seq_lookup(seq);
    }
    if (st != RI_OK)
        gw_pfx_seq_drop(seq);
    *seq_p = seq;
    return RI_OK;
}

size_t gw_pfx_seq_cached(const gw_pfx_seq_t *seq)
{
    return seq != NULL ? (size_t)seq->n_cached * seq->lay.block_tokens : 0;
}

const uint8_t *gw_pfx_seq_keys(const gw_pfx_seq_t *seq)
{
    return seq != NULL ? seq->keys : NULL;
}

gw_pfx_set_t *gw_pfx_seq_set(gw_pfx_seq_t *seq)
{
    return seq != NULL && seq->n_cached > 0 ? seq->set : NULL;
}

/* Free the parse and the copies it reads (the set borrows them). */
static void gw_pfx_seq_free_blocks(gw_pfx_seq_t *seq)
{
    gw_pfx_set_destroy(seq->set);
    seq->set = NULL;
    for (uint32_t i = 0; seq->copies != NULL && i < seq->max_blocks; i++) {
        cm_free(seq->copies[i]);
        seq->copies[i] = NULL;
    }
}

void gw_pfx_seq_release(gw_pfx_seq_t *seq)
{
    if (seq != NULL)
        gw_pfx_seq_free_blocks(seq);
}

void gw_pfx_seq_drop(gw_pfx_seq_t *seq)
{
    atomic_fetch_add(&seq->stats->fallbacks, 1);
    seq->n_cached = 0;
    gw_pfx_seq_free_blocks(seq);
}

void gw_pfx_seq_prefilled(gw_pfx_seq_t *seq)
{
    size_t hit = gw_pfx_seq_cached(seq);
    atomic_fetch_add(&seq->stats->hit_tokens, hit);
    atomic_fetch_add(&seq->stats->miss_tokens, seq->n - hit);
}

ri_status_t gw_pfx_seq_publish(gw_pfx_seq_t *seq, const gw_pfx_src_t *src, uint32_t *published_p)
{
    uint32_t done = 0;
    ri_status_t st = RI_OK;

    /* Blocks past a cached run that stopped short are not attachable by
     * anyone before the missing one is published: go in block order. */
    for (uint32_t b = seq->n_cached; b < seq->max_blocks; b++) {
        uint8_t *buf = NULL;
        uint64_t len = 0;
        uint32_t slot = 0, flags = 0;
        st = gw_pfx_block_build(&seq->lay, src, b, &buf, &len);
        if (st == RI_OK)
            st = gw_dp_prefix_put(seq->dp, seq->keys + (size_t)b * CM_PFX_KEY_SIZE, buf, len, &slot, &flags);
        cm_free(buf);
        if (st != RI_OK)
            break;
        done++;
    }
    atomic_fetch_add(&seq->stats->published_blocks, done);
    if (st != RI_OK) {
        atomic_fetch_add(&seq->stats->fallbacks, 1);
        cm_info("prefix: published %u of %u new blocks, then %s", done, seq->max_blocks - seq->n_cached,
                ri_status_str(st));
    }
    if (published_p != NULL)
        *published_p = done;
    return st == RI_ERR_NOMEM && done == 0 ? RI_ERR_NOMEM : RI_OK;
}

void gw_pfx_seq_destroy(gw_pfx_seq_t *seq)
{
    if (seq == NULL)
        return;
    gw_pfx_seq_free_blocks(seq);
    cm_free(seq->copies);
    cm_free(seq->keys);
    cm_free(seq);
}
