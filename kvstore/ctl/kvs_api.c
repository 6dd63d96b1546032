/*
 * The control API handlers (docs/architecture.md): Health, Stats,
 * CreateSession, DropSession, ListSessions, Drain, KeepAlive.  Each one unpacks its
 * request with protobuf-c, validates every field (INVALID_ARGUMENT with a
 * message naming the field), calls the data side and packs the answer.  The
 * caller's tenant was established by kvs_grpc before we run; every data-side
 * call is scoped to it.
 */
#define _GNU_SOURCE
#include <inttypes.h>
#include <stdio.h>
#include <string.h>

#include "common/cm_alloc.h"
#include "common/cm_log.h"
#include "common/cm_status.h"
#include "common/cm_time.h"
#include "kvstore/ctl/kvs_cluster.h"
#include "kvstore/ctl/kvs_ctl.h"
#include "retroinfer.pb-c.h"

#define KVS_API_MAX_TOKENS (1ull << 30) /* expected_tokens upper bound */
#define KVS_API_SESSION_TABLE 4096u     /* sessions of all tenants the store holds (its table size) */
#define KVS_API_MAX_PREFIX_KEYS 65536u  /* keys of one LookupPrefix (CM_PFX_MAX_KEYS) */

static CM_ALLOC_TAG(kvs_api_tag, "kvs.api");

static void *kvs_pb_alloc(void *data, size_t size)
{
    (void)data;
    return cm_malloc(&kvs_api_tag, size ? size : 1);
}

static void kvs_pb_free(void *data, void *ptr)
{
    (void)data;
    cm_free(ptr);
}

/* protobuf-c allocations are counted under the "kvs.api" tag. */
static ProtobufCAllocator kvs_pb_allocator = {kvs_pb_alloc, kvs_pb_free, NULL};

static ri_status_t kvs_api_pack(const ProtobufCMessage *msg, kvs_reply_t *reply)
{
    size_t len = protobuf_c_message_get_packed_size(msg);
    uint8_t *buf = cm_malloc(&kvs_api_tag, len ? len : 1);
    if (buf == NULL) {
        snprintf(reply->msg, sizeof(reply->msg), "out of memory packing the response");
        return RI_ERR_NOMEM;
    }
    reply->len = protobuf_c_message_pack(msg, buf);
    reply->buf = buf;
    return RI_OK;
}

static ri_status_t kvs_api_bad_message(const char *method, kvs_reply_t *reply)
{
    snprintf(reply->msg, sizeof(reply->msg), "%s: request is not a valid protobuf message", method);
    return RI_ERR_PROTOCOL;
}

static uint64_t kvs_api_uptime_ms(const kvs_ctl_t *ctl)
{
    return (cm_time_ns() - ctl->start_ns) / 1000000u;
}

static ri_status_t kvs_api_health(void *app, const kvs_caller_t *caller, const uint8_t *req, size_t len,
                                  kvs_reply_t *reply)
{
    kvs_ctl_t *ctl = app;
    (void)caller;
    Retroinfer__V1__HealthRequest *in = retroinfer__v1__health_request__unpack(&kvs_pb_allocator, len, req);
    if (in == NULL)
        return kvs_api_bad_message("Health", reply);
    retroinfer__v1__health_request__free_unpacked(in, &kvs_pb_allocator);

    Retroinfer__V1__HealthResponse out = RETROINFER__V1__HEALTH_RESPONSE__INIT;
    out.status = atomic_load(&ctl->draining) ? RETROINFER__V1__HEALTH_RESPONSE__SERVING_STATUS__DRAINING
                                             : RETROINFER__V1__HEALTH_RESPONSE__SERVING_STATUS__SERVING;
    out.version = (char *)KVS_VERSION;
    out.uptime_ms = kvs_api_uptime_ms(ctl);
    out.dataplane_address = (char *)kvs_data_address(ctl->data, 0);
    out.auth_mode = (char *)(ctl->tokens_mode ? "tokens" : "single-tenant");
    return kvs_api_pack(&out.base, reply);
}

static ri_status_t kvs_api_stats(void *app, const kvs_caller_t *caller, const uint8_t *req, size_t len,
                                 kvs_reply_t *reply)
{
    kvs_ctl_t *ctl = app;
    kvs_data_stats_t s;
    Retroinfer__V1__StatsRequest *in = retroinfer__v1__stats_request__unpack(&kvs_pb_allocator, len, req);
    if (in == NULL)
        return kvs_api_bad_message("Stats", reply);
    retroinfer__v1__stats_request__free_unpacked(in, &kvs_pb_allocator);

    memset(&s, 0, sizeof(s));
    kvs_data_stats(ctl->data, caller->tenant, &s);
    Retroinfer__V1__StatsResponse out = RETROINFER__V1__STATS_RESPONSE__INIT;
    out.pool_bytes_total = s.pool_bytes_total;
    out.pool_bytes_used = s.pool_bytes_used;
    out.disk_bytes_used = s.disk_bytes_used;
    out.sessions = s.sessions_tenant;
    out.sessions_all = s.sessions_all;
    out.clusters = s.clusters_tenant;
    out.fetches = s.fetches;
    out.cache_hits = s.cache_hits;
    out.cache_misses = s.cache_misses;
    out.bytes_sent = s.bytes_sent;
    out.errors = s.errors;
    out.uptime_ms = kvs_api_uptime_ms(ctl);
    out.prefix_blocks_memory = s.prefix.blocks_memory;
    out.prefix_bytes_memory = s.prefix.bytes_memory;
    out.prefix_blocks_disk = s.prefix.blocks_disk;
    out.prefix_bytes_disk = s.prefix.bytes_disk;
    out.prefix_attach_hits = s.prefix.attach_hits;
    out.prefix_attach_misses = s.prefix.attach_misses;
    out.prefix_tokens_attached = s.prefix.tokens_attached;
    out.prefix_publishes_new = s.prefix.publishes_new;
    out.prefix_publishes_existing = s.prefix.publishes_existing;
    out.prefix_publishes_refused = s.prefix.publishes_refused;
    out.prefix_evictions = s.prefix.evictions;
    out.prefix_spills = s.prefix.spills;
    out.prefix_corrupt = s.prefix.corrupt;
    return kvs_api_pack(&out.base, reply);
}

/* Validate a CreateSession request into geometry; message names the field. */
static ri_status_t kvs_api_check_create(const Retroinfer__V1__CreateSessionRequest *in, kvs_geometry_t *g,
                                        kvs_reply_t *reply)
{
    const Retroinfer__V1__Geometry *pg = in->geometry;
    char *m = reply->msg;
    size_t ml = sizeof(reply->msg);

    if (pg == NULL) {
        snprintf(m, ml, "CreateSession: geometry is required");
        return RI_ERR_INVALID;
    }
    if (pg->layers < 1 || pg->layers > 1024) {
        snprintf(m, ml, "CreateSession: geometry.layers must be 1..1024 (got %" PRIu32 ")", pg->layers);
        return RI_ERR_INVALID;
    }
    if (pg->kv_heads < 1 || pg->kv_heads > 256) {
        snprintf(m, ml, "CreateSession: geometry.kv_heads must be 1..256 (got %" PRIu32 ")", pg->kv_heads);
        return RI_ERR_INVALID;
    }
    if (pg->head_dim < 16 || pg->head_dim > 512 || pg->head_dim % 8 != 0) {
        snprintf(m, ml, "CreateSession: geometry.head_dim must be 16..512 and a multiple of 8 (got %" PRIu32 ")",
                 pg->head_dim);
        return RI_ERR_INVALID;
    }
    if (pg->dtype != RETROINFER__V1__DTYPE__DTYPE_F16 && pg->dtype != RETROINFER__V1__DTYPE__DTYPE_BF16) {
        snprintf(m, ml, "CreateSession: geometry.dtype must be DTYPE_F16 or DTYPE_BF16 (got %d)", (int)pg->dtype);
        return RI_ERR_INVALID;
    }
    if (pg->page_tokens > 256) {
        snprintf(m, ml, "CreateSession: geometry.page_tokens must be 1..256, or 0 for 8 (got %" PRIu32 ")",
                 pg->page_tokens);
        return RI_ERR_INVALID;
    }
    if (in->expected_tokens < 1 || in->expected_tokens > KVS_API_MAX_TOKENS) {
        snprintf(m, ml, "CreateSession: expected_tokens must be 1..%llu (got %" PRIu64 ")",
                 (unsigned long long)KVS_API_MAX_TOKENS, in->expected_tokens);
        return RI_ERR_INVALID;
    }
    size_t ll = in->label ? strlen(in->label) : 0;
    if (ll >= KVS_LABEL_MAX) {
        snprintf(m, ml, "CreateSession: label must be at most %d bytes (got %zu)", KVS_LABEL_MAX - 1, ll);
        return RI_ERR_INVALID;
    }
    for (size_t i = 0; i < ll; i++) {
        unsigned char c = (unsigned char)in->label[i];
        if (c < 0x20 || c == 0x7f) {
            snprintf(m, ml, "CreateSession: label must not contain control characters (byte %zu)", i);
            return RI_ERR_INVALID;
        }
    }
    g->layers = pg->layers;
    g->kv_heads = pg->kv_heads;
    g->head_dim = pg->head_dim;
    g->dtype = pg->dtype == RETROINFER__V1__DTYPE__DTYPE_F16 ? KVS_DTYPE_F16 : KVS_DTYPE_BF16;
    g->page_tokens = pg->page_tokens ? pg->page_tokens : 8;
    return RI_OK;
}

/* Per-tenant session count (max-sessions-per-tenant): one tenant must not
 * fill the shared session table.  Checked before the store is asked, so the
 * error names this limit; concurrent creates of one tenant may overshoot it
 * by at most the number of gRPC threads. */
static ri_status_t kvs_api_check_session_count(kvs_ctl_t *ctl, const char *tenant, kvs_reply_t *reply)
{
    kvs_data_stats_t s;
    memset(&s, 0, sizeof(s));
    kvs_data_stats(ctl->data, tenant, &s);
    if (ctl->cfg.max_sessions_per_tenant > 0 && s.sessions_tenant >= (uint64_t)ctl->cfg.max_sessions_per_tenant) {
        atomic_fetch_add(&ctl->session_limit_refusals, 1);
        snprintf(reply->msg, sizeof(reply->msg),
                 "CreateSession: tenant '%s' already holds %u session(s), its limit (max-sessions-per-tenant=%lld); "
                 "drop some first",
                 tenant, s.sessions_tenant, (long long)ctl->cfg.max_sessions_per_tenant);
        return RI_ERR_QUOTA;
    }
    if (s.sessions_all >= KVS_API_SESSION_TABLE) {
        atomic_fetch_add(&ctl->table_full_refusals, 1);
        snprintf(reply->msg, sizeof(reply->msg),
                 "CreateSession: the kvstore's session table is full (%u sessions of all tenants)", s.sessions_all);
        return RI_ERR_NOSPACE;
    }
    return RI_OK;
}

static ri_status_t kvs_api_create_session(void *app, const kvs_caller_t *caller, const uint8_t *req, size_t len,
                                          kvs_reply_t *reply)
{
    kvs_ctl_t *ctl = app;
    kvs_geometry_t g;
    uint64_t id = 0;
    uint8_t secret[CM_WIRE_SECRET_SIZE];
    ri_status_t st;

    Retroinfer__V1__CreateSessionRequest *in =
        retroinfer__v1__create_session_request__unpack(&kvs_pb_allocator, len, req);
    if (in == NULL)
        return kvs_api_bad_message("CreateSession", reply);
    st = kvs_api_check_create(in, &g, reply);
    if (st != RI_OK)
        goto out_free;
    if (atomic_load(&ctl->draining)) {
        st = RI_ERR_SHUTDOWN;
        snprintf(reply->msg, sizeof(reply->msg), "CreateSession: the kvstore is draining; no new sessions");
        goto out_free;
    }
    st = kvs_api_check_session_count(ctl, caller->tenant, reply);
    if (st != RI_OK)
        goto out_free;
    st = kvs_data_session_create(ctl->data, caller->tenant, &g, in->expected_tokens, in->label ? in->label : "",
                                 &id, secret);
    if (st == RI_ERR_NOSPACE || st == RI_ERR_IO) {
        /* The session manifest could not be written: nothing was created. */
        snprintf(reply->msg, sizeof(reply->msg),
                 "CreateSession: the spill directory could not record the session (%s%s); nothing was created",
                 ri_status_str(st), st == RI_ERR_NOSPACE ? ": the disk is full" : "");
    } else if (st == RI_ERR_QUOTA) {
        /* Workers of a cluster try the next node on this refusal: name this one. */
        snprintf(reply->msg, sizeof(reply->msg),
                 "CreateSession: %" PRIu64 " tokens of %ux%ux%u would exceed the memory quota of tenant '%s' or "
                 "of the kvstore (node %.80s)",
                 in->expected_tokens, g.layers, g.kv_heads, g.head_dim, caller->tenant,
                 ctl->cluster != NULL ? kvs_cluster_node_name(ctl->cluster) : ctl->grpc_addr);
    } else if (st == RI_ERR_SHUTDOWN) {
        snprintf(reply->msg, sizeof(reply->msg), "CreateSession: the kvstore is draining; no new sessions");
    } else if (st == RI_ERR_INVALID) {
        snprintf(reply->msg, sizeof(reply->msg), "CreateSession: the store refused the geometry or label");
    } else if (st != RI_OK) {
        snprintf(reply->msg, sizeof(reply->msg), "CreateSession: %s", ri_status_str(st));
    }
    if (st != RI_OK)
        goto out_free;

    Retroinfer__V1__CreateSessionResponse out = RETROINFER__V1__CREATE_SESSION_RESPONSE__INIT;
    out.session_id = id;
    out.dataplane_address = (char *)kvs_data_address(ctl->data, id);
    out.session_secret.data = secret;
    out.session_secret.len = sizeof(secret);
    st = kvs_api_pack(&out.base, reply);
    explicit_bzero(secret, sizeof(secret));
    if (st != RI_OK) { /* do not leave a session nobody knows the secret of */
        uint64_t ignored;
        kvs_data_session_drop(ctl->data, caller->tenant, id, &ignored);
        goto out_free;
    }
    cm_debug("session %" PRIu64 " created for tenant %s (%ux%ux%u, %" PRIu64 " tokens, '%s')", id, caller->tenant,
            g.layers, g.kv_heads, g.head_dim, in->expected_tokens, in->label ? in->label : "");

out_free:
    retroinfer__v1__create_session_request__free_unpacked(in, &kvs_pb_allocator);
    return st;
}

static ri_status_t kvs_api_drop_session(void *app, const kvs_caller_t *caller, const uint8_t *req, size_t len,
                                        kvs_reply_t *reply)
{
    kvs_ctl_t *ctl = app;
    uint64_t freed = 0;
    Retroinfer__V1__DropSessionRequest *in = retroinfer__v1__drop_session_request__unpack(&kvs_pb_allocator, len, req);
    if (in == NULL)
        return kvs_api_bad_message("DropSession", reply);
    uint64_t id = in->session_id;
    retroinfer__v1__drop_session_request__free_unpacked(in, &kvs_pb_allocator);
    if (id == 0) {
        snprintf(reply->msg, sizeof(reply->msg), "DropSession: session_id is required (ids start at 1)");
        return RI_ERR_INVALID;
    }
    /* An admin may drop any tenant's session (e.g. one left by a tenant
     * whose token was removed); everyone else only their own. */
    ri_status_t st = kvs_data_session_drop(ctl->data, caller->admin ? NULL : caller->tenant, id, &freed);
    if (st == RI_ERR_NOT_FOUND) {
        if (caller->admin)
            snprintf(reply->msg, sizeof(reply->msg), "DropSession: no session %" PRIu64, id);
        else
            snprintf(reply->msg, sizeof(reply->msg), "DropSession: no session %" PRIu64 " for tenant '%s'", id,
                     caller->tenant);
        return st;
    }
    if (st != RI_OK) {
        snprintf(reply->msg, sizeof(reply->msg), "DropSession: %s", ri_status_str(st));
        return st;
    }
    cm_debug("session %" PRIu64 " of tenant %s dropped (%" PRIu64 " bytes freed)", id, caller->tenant, freed);
    Retroinfer__V1__DropSessionResponse out = RETROINFER__V1__DROP_SESSION_RESPONSE__INIT;
    out.bytes_freed = freed;
    return kvs_api_pack(&out.base, reply);
}

static ri_status_t kvs_api_list_sessions(void *app, const kvs_caller_t *caller, const uint8_t *req, size_t len,
                                         kvs_reply_t *reply)
{
    kvs_ctl_t *ctl = app;
    kvs_session_info_t *infos = NULL;
    size_t n = 0;
    ri_status_t st;
    Retroinfer__V1__SessionInfo *items = NULL, **ptrs = NULL;
    Retroinfer__V1__Geometry *geos = NULL;

    Retroinfer__V1__ListSessionsRequest *in =
        retroinfer__v1__list_sessions_request__unpack(&kvs_pb_allocator, len, req);
    if (in == NULL)
        return kvs_api_bad_message("ListSessions", reply);
    retroinfer__v1__list_sessions_request__free_unpacked(in, &kvs_pb_allocator);

    /* An admin sees every tenant's sessions (each names its tenant). */
    st = kvs_data_session_list(ctl->data, caller->admin ? NULL : caller->tenant, &infos, &n);
    if (st != RI_OK) {
        snprintf(reply->msg, sizeof(reply->msg), "ListSessions: %s", ri_status_str(st));
        return st;
    }
    if (n > 0) {
        items = cm_calloc(&kvs_api_tag, n, sizeof(*items));
        ptrs = cm_calloc(&kvs_api_tag, n, sizeof(*ptrs));
        geos = cm_calloc(&kvs_api_tag, n, sizeof(*geos));
        if (items == NULL || ptrs == NULL || geos == NULL) {
            st = RI_ERR_NOMEM;
            snprintf(reply->msg, sizeof(reply->msg), "ListSessions: out of memory");
            goto out_free;
        }
    }
    for (size_t i = 0; i < n; i++) {
        const kvs_session_info_t *s = &infos[i];
        retroinfer__v1__geometry__init(&geos[i]);
        geos[i].layers = s->geometry.layers;
        geos[i].kv_heads = s->geometry.kv_heads;
        geos[i].head_dim = s->geometry.head_dim;
        geos[i].dtype = s->geometry.dtype == KVS_DTYPE_BF16 ? RETROINFER__V1__DTYPE__DTYPE_BF16
                                                            : RETROINFER__V1__DTYPE__DTYPE_F16;
        geos[i].page_tokens = s->geometry.page_tokens;
        retroinfer__v1__session_info__init(&items[i]);
        items[i].session_id = s->id;
        items[i].tenant = (char *)s->tenant;
        items[i].geometry = &geos[i];
        items[i].label = (char *)s->label;
        items[i].bytes_in_pool = s->bytes_in_pool;
        items[i].bytes_on_disk = s->bytes_on_disk;
        items[i].clusters = s->clusters;
        items[i].created_unix_ms = s->created_unix_ms;
        items[i].dataplane_address = (char *)kvs_data_address(ctl->data, s->id);
        ptrs[i] = &items[i];
    }
    Retroinfer__V1__ListSessionsResponse out = RETROINFER__V1__LIST_SESSIONS_RESPONSE__INIT;
    out.n_sessions = n;
    out.sessions = ptrs;
    st = kvs_api_pack(&out.base, reply);

out_free:
    cm_free(geos);
    cm_free(ptrs);
    cm_free(items);
    cm_free(infos);
    return st;
}

static ri_status_t kvs_api_drain(void *app, const kvs_caller_t *caller, const uint8_t *req, size_t len,
                                 kvs_reply_t *reply)
{
    kvs_ctl_t *ctl = app;
    Retroinfer__V1__DrainRequest *in = retroinfer__v1__drain_request__unpack(&kvs_pb_allocator, len, req);
    if (in == NULL)
        return kvs_api_bad_message("Drain", reply);
    retroinfer__v1__drain_request__free_unpacked(in, &kvs_pb_allocator);
    if (!caller->admin) {
        if (ctl->tokens_mode)
            snprintf(reply->msg, sizeof(reply->msg), "Drain: tenant '%s' is not an admin (mark its token 'admin')",
                     caller->tenant);
        else
            snprintf(reply->msg, sizeof(reply->msg),
                     "Drain: admin calls need a tokens-file with an admin token (or start with --insecure-admin)");
        return RI_ERR_PERMISSION;
    }
    atomic_store(&ctl->draining, true);
    kvs_cluster_poke(ctl->cluster); /* publish "draining" now: workers stop placing sessions here */
    uint32_t open = kvs_data_drain(ctl->data);
    cm_info("drain requested by tenant %s: %u session(s) still open", caller->tenant, open);
    Retroinfer__V1__DrainResponse out = RETROINFER__V1__DRAIN_RESPONSE__INIT;
    out.sessions_open = open;
    return kvs_api_pack(&out.base, reply);
}

/* Renew leases: cheap (one pass over the session table per id, under the
 * catalog lock), so a client may call it every few seconds. */
static ri_status_t kvs_api_keepalive(void *app, const kvs_caller_t *caller, const uint8_t *req, size_t len,
                                     kvs_reply_t *reply)
{
    kvs_ctl_t *ctl = app;
    uint32_t renewed = 0;
    ri_status_t st;
    Retroinfer__V1__KeepAliveRequest *in = retroinfer__v1__keep_alive_request__unpack(&kvs_pb_allocator, len, req);
    if (in == NULL)
        return kvs_api_bad_message("KeepAlive", reply);
    if (in->n_session_ids > KVS_API_SESSION_TABLE) {
        snprintf(reply->msg, sizeof(reply->msg), "KeepAlive: %zu session ids, at most %u", in->n_session_ids,
                 KVS_API_SESSION_TABLE);
        st = RI_ERR_INVALID;
        goto out_free;
    }
    /* Like DropSession: an admin may keep any tenant's sessions, others only their own. */
    st = kvs_data_session_keepalive(ctl->data, caller->admin ? NULL : caller->tenant, in->session_ids,
                                    in->n_session_ids, &renewed);
    if (st != RI_OK) {
        snprintf(reply->msg, sizeof(reply->msg), "KeepAlive: %s", ri_status_str(st));
        goto out_free;
    }
    Retroinfer__V1__KeepAliveResponse out = RETROINFER__V1__KEEP_ALIVE_RESPONSE__INIT;
    out.renewed = renewed;
    out.lease_ms = (uint64_t)ctl->cfg.session_lease_ms;
    st = kvs_api_pack(&out.base, reply);
out_free:
    retroinfer__v1__keep_alive_request__free_unpacked(in, &kvs_pb_allocator);
    return st;
}

/* --- prefix blocks --- */

static ri_status_t kvs_api_lookup_prefix(void *app, const kvs_caller_t *caller, const uint8_t *req, size_t len,
                                         kvs_reply_t *reply)
{
    kvs_ctl_t *ctl = app;
    uint8_t *keys = NULL;
    uint32_t cached = 0;
    uint64_t tokens = 0;
    ri_status_t st = RI_OK;
    Retroinfer__V1__LookupPrefixRequest *in =
        retroinfer__v1__lookup_prefix_request__unpack(&kvs_pb_allocator, len, req);
    if (in == NULL)
        return kvs_api_bad_message("LookupPrefix", reply);
    if (in->n_keys > KVS_API_MAX_PREFIX_KEYS) {
        snprintf(reply->msg, sizeof(reply->msg), "LookupPrefix: %zu keys, at most %u", in->n_keys,
                 KVS_API_MAX_PREFIX_KEYS);
        st = RI_ERR_INVALID;
        goto out_free;
    }
    keys = cm_malloc(&kvs_api_tag, (in->n_keys ? in->n_keys : 1) * KVS_PFX_KEY);
    if (keys == NULL) {
        snprintf(reply->msg, sizeof(reply->msg), "LookupPrefix: out of memory");
        st = RI_ERR_NOMEM;
        goto out_free;
    }
    for (size_t i = 0; i < in->n_keys; i++) {
        if (in->keys[i].len != KVS_PFX_KEY) {
            snprintf(reply->msg, sizeof(reply->msg), "LookupPrefix: key %zu has %zu bytes, keys have %u", i,
                     in->keys[i].len, KVS_PFX_KEY);
            st = RI_ERR_INVALID;
            goto out_free;
        }
        memcpy(keys + i * KVS_PFX_KEY, in->keys[i].data, KVS_PFX_KEY);
    }
    /* Always the caller's own tenant: a lookup never sees another's blocks. */
    st = kvs_data_prefix_lookup(ctl->data, caller->tenant, keys, in->n_keys, &cached, &tokens);
    if (st != RI_OK) {
        snprintf(reply->msg, sizeof(reply->msg), "LookupPrefix: %s", ri_status_str(st));
        goto out_free;
    }
    Retroinfer__V1__LookupPrefixResponse out = RETROINFER__V1__LOOKUP_PREFIX_RESPONSE__INIT;
    out.cached = cached;
    out.tokens = tokens;
    st = kvs_api_pack(&out.base, reply);
out_free:
    cm_free(keys);
    retroinfer__v1__lookup_prefix_request__free_unpacked(in, &kvs_pb_allocator);
    return st;
}

static ri_status_t kvs_api_list_prefixes(void *app, const kvs_caller_t *caller, const uint8_t *req, size_t len,
                                         kvs_reply_t *reply)
{
    kvs_ctl_t *ctl = app;
    kvs_prefix_info_t *infos = NULL;
    Retroinfer__V1__PrefixInfo *items = NULL, **ptrs = NULL;
    size_t n = 0;
    ri_status_t st;
    Retroinfer__V1__ListPrefixesRequest *in =
        retroinfer__v1__list_prefixes_request__unpack(&kvs_pb_allocator, len, req);
    if (in == NULL)
        return kvs_api_bad_message("ListPrefixes", reply);
    retroinfer__v1__list_prefixes_request__free_unpacked(in, &kvs_pb_allocator);
    st = kvs_data_prefix_list(ctl->data, caller->admin ? NULL : caller->tenant, &infos, &n);
    if (st != RI_OK) {
        snprintf(reply->msg, sizeof(reply->msg), "ListPrefixes: %s", ri_status_str(st));
        return st;
    }
    if (n > 0) {
        items = cm_calloc(&kvs_api_tag, n, sizeof(*items));
        ptrs = cm_calloc(&kvs_api_tag, n, sizeof(*ptrs));
        if (items == NULL || ptrs == NULL) {
            st = RI_ERR_NOMEM;
            snprintf(reply->msg, sizeof(reply->msg), "ListPrefixes: out of memory");
            goto out_free;
        }
    }
    for (size_t i = 0; i < n; i++) {
        retroinfer__v1__prefix_info__init(&items[i]);
        items[i].key.data = infos[i].key;
        items[i].key.len = KVS_PFX_KEY;
        items[i].tenant = infos[i].tenant;
        items[i].bytes = infos[i].bytes;
        items[i].tokens = infos[i].tokens;
        items[i].sessions = infos[i].refs;
        items[i].created_unix_ms = infos[i].created_unix_ms;
        items[i].on_disk = infos[i].on_disk;
        ptrs[i] = &items[i];
    }
    Retroinfer__V1__ListPrefixesResponse out = RETROINFER__V1__LIST_PREFIXES_RESPONSE__INIT;
    out.n_prefixes = n;
    out.prefixes = ptrs;
    st = kvs_api_pack(&out.base, reply);
out_free:
    cm_free(ptrs);
    cm_free(items);
    cm_free(infos);
    return st;
}

static ri_status_t kvs_api_drop_prefix(void *app, const kvs_caller_t *caller, const uint8_t *req, size_t len,
                                       kvs_reply_t *reply)
{
    kvs_ctl_t *ctl = app;
    const char *scope;
    uint32_t dropped = 0;
    uint64_t freed = 0;
    ri_status_t st;
    Retroinfer__V1__DropPrefixRequest *in = retroinfer__v1__drop_prefix_request__unpack(&kvs_pb_allocator, len, req);
    if (in == NULL)
        return kvs_api_bad_message("DropPrefix", reply);
    if (in->key.len != KVS_PFX_KEY) {
        snprintf(reply->msg, sizeof(reply->msg), "DropPrefix: the key has %zu bytes, keys have %u", in->key.len,
                 KVS_PFX_KEY);
        st = RI_ERR_INVALID;
        goto out_free;
    }
    /* An admin names any tenant (or none: every tenant's); others only their own. */
    scope = in->tenant != NULL && in->tenant[0] != '\0' ? in->tenant : NULL;
    if (!caller->admin && scope != NULL && strcmp(scope, caller->tenant) != 0) {
        snprintf(reply->msg, sizeof(reply->msg), "DropPrefix: tenant '%s' may not drop tenant '%s''s blocks",
                 caller->tenant, scope);
        st = RI_ERR_PERMISSION;
        goto out_free;
    }
    if (!caller->admin)
        scope = caller->tenant;
    st = kvs_data_prefix_drop(ctl->data, scope, in->key.data, &dropped, &freed);
    if (st != RI_OK) {
        snprintf(reply->msg, sizeof(reply->msg), "DropPrefix: %s",
                 st == RI_ERR_NOT_FOUND ? "no such prefix block" : ri_status_str(st));
        goto out_free;
    }
    Retroinfer__V1__DropPrefixResponse out = RETROINFER__V1__DROP_PREFIX_RESPONSE__INIT;
    out.dropped = dropped;
    out.bytes_freed = freed;
    st = kvs_api_pack(&out.base, reply);
out_free:
    retroinfer__v1__drop_prefix_request__free_unpacked(in, &kvs_pb_allocator);
    return st;
}

#define KVS_API_PATH(m) "/retroinfer.v1.KvStore/" m

const kvs_method_t kvs_ctl_methods[] = {
    {"Health", KVS_API_PATH("Health"), false, kvs_api_health},
    {"Stats", KVS_API_PATH("Stats"), true, kvs_api_stats},
    {"CreateSession", KVS_API_PATH("CreateSession"), true, kvs_api_create_session},
    {"DropSession", KVS_API_PATH("DropSession"), true, kvs_api_drop_session},
    {"ListSessions", KVS_API_PATH("ListSessions"), true, kvs_api_list_sessions},
    {"Drain", KVS_API_PATH("Drain"), true, kvs_api_drain},
    {"KeepAlive", KVS_API_PATH("KeepAlive"), true, kvs_api_keepalive},
    {"LookupPrefix", KVS_API_PATH("LookupPrefix"), true, kvs_api_lookup_prefix},
    {"ListPrefixes", KVS_API_PATH("ListPrefixes"), true, kvs_api_list_prefixes},
    {"DropPrefix", KVS_API_PATH("DropPrefix"), true, kvs_api_drop_prefix},
};
const size_t kvs_ctl_n_methods = CM_ARRAY_LEN(kvs_ctl_methods);
