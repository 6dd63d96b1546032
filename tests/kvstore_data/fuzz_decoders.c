/*
 * libFuzzer target: every decoder the daemon runs on bytes from the network.
 * The first input byte picks the decoder, the rest is the message:
 *   0 the 64-byte data-plane header (cm_wire_decode), with and without a
 *     whole-message length;
 *   1-4 the data-plane meta blocks (clusters, register, fetch, fetch reply);
 *     after a successful decode every element the view promises is read, so
 *     an over-read of what the decoder checked shows under ASan;
 *   5-10 the gRPC request messages (protobuf-c unpack, as the handlers call it);
 *   11-13 the direct-read meta blocks (MAP reply, LOCATE, TOUCH), every
 *     promised byte read as for 1-4;
 *   14-17 the prefix-block decoders (a whole block, PREFIX_ATTACH request
 *     and reply, PREFIX_PUT / PREFIX_GET metas), every promised byte read.
 * Built with clang -fsanitize=fuzzer,address,undefined (tests/kvstore_data).
 *
 * Mutation check: built again with -DFZ_MUTANT_SLACK=1 (fuzz_decoders_mutant),
 * the data-plane decoders (0-4, 11-17) are told every message is one byte longer than
 * the bytes that exist, which is what a decoder with a bounds check off by one
 * believes: it then reads the byte past the message.  The real decoders run
 * unchanged on that wrong length, so the over-read happens in their code, and
 * test_kvs_fuzz_decoders_mutant passes only when the fuzzer reports it.
 */
#include <stddef.h>
#include <stdint.h>

#include "common/cm_dp_direct.h"
#include "common/cm_dp_prefix.h"
#include "common/cm_dp_proto.h"
#include "common/cm_wire.h"
#include "retroinfer.pb-c.h"

#ifndef FZ_MUTANT_SLACK
#define FZ_MUTANT_SLACK 0 /* bytes a decoder is told exist past the message (0: the real target) */
#endif

static volatile uint64_t sink;

static void fz_wire(const uint8_t *p, size_t n)
{
    cm_wire_limits_t lim = {.max_meta_len = 1u << 20, .max_data_len = 1ull << 30};
    cm_wire_hdr_t h;
    if (cm_wire_decode(p, n, 0, &lim, &h) == RI_OK)
        sink += h.meta_len + h.data_len;
    if (cm_wire_decode(p, n, n, &lim, &h) == RI_OK)
        sink += h.op;
}

static void fz_clusters(const uint8_t *p, size_t n)
{
    cm_dp_clusters_view_t v;
    if (cm_dp_clusters_decode(p, n, &v) != RI_OK)
        return;
    uint64_t total = 0;
    for (uint32_t i = 0; i < v.n_heads; i++)
        total += cm_dp_clusters_head(&v, i) + cm_dp_clusters_count(&v, i);
    for (uint64_t k = 0; k < v.total_clusters; k++)
        total += cm_dp_clusters_tokens(&v, k);
    sink += total;
}

static void fz_register(const uint8_t *p, size_t n)
{
    cm_dp_register_t r;
    if (cm_dp_register_decode(p, n, &r) != RI_OK)
        return;
    uint64_t s = r.capacity_pages + r.recv_len;
    for (size_t i = 0; i < r.rkey_len; i++)
        s += ((const uint8_t *)r.rkey)[i];
    sink += s;
}

static void fz_fetch(const uint8_t *p, size_t n)
{
    cm_dp_fetch_view_t v;
    if (cm_dp_fetch_decode(p, n, &v) != RI_OK)
        return;
    uint64_t s = 0;
    for (uint32_t i = 0; i < v.n_heads; i++)
        s += cm_dp_get32(v.heads + 8u * i) + cm_dp_get32(v.heads + 8u * i + 4);
    for (uint64_t k = 0; k < v.total_ids; k++)
        s += cm_dp_get32(v.ids + 4u * k);
    sink += s;
}

static void fz_fetch_reply(const uint8_t *p, size_t n)
{
    cm_dp_fetch_reply_view_t v;
    if (cm_dp_fetch_reply_decode(p, n, &v) != RI_OK)
        return;
    uint64_t s = 0;
    for (uint32_t i = 0; i < v.n_heads; i++)
        s += cm_dp_reply_head(&v, i) + cm_dp_reply_head_ids(&v, i);
    for (uint32_t i = 0; i < v.n_entries; i++) {
        cm_dp_entry_t e;
        cm_dp_reply_entry(&v, i, &e);
        /* the decoder promises the pages of listed entries (hits and
         * admissions) only: a plain miss has none, its page_index unchecked,
         * and no consumer reads it */
        for (uint32_t k = 0; (e.flags & (CM_DP_F_HIT | CM_DP_F_ADMITTED)) && k < e.n_pages; k++)
            s += cm_dp_reply_page(&v, e.page_index + k);
    }
    for (uint32_t i = 0; i < v.n_evicted; i++) {
        cm_dp_evict_t e;
        cm_dp_reply_evicted(&v, i, &e);
        s += e.cluster;
    }
    sink += s;
}

static void fz_direct(uint8_t which, const uint8_t *p, size_t n)
{
    uint64_t s = 0;
    if (which == 11) {
        cm_dp_map_t m;
        uint64_t sid;
        uint32_t object;
        const uint8_t *secret;
        if (cm_dp_map_decode(p, n, &m) == RI_OK)
            for (uint32_t i = 0; i < m.name_len; i++)
                s += (uint8_t)m.name[i];
        if (cm_dp_handover_req_decode(p, n, &sid, &secret, &object) == RI_OK)
            s += sid + secret[CM_WIRE_SECRET_SIZE - 1] + object;
    } else if (which == 12) {
        cm_dp_locate_t l;
        if (cm_dp_locate_decode(p, n, &l) == RI_OK)
            s += l.layer + l.head + l.first + l.count;
    } else {
        uint32_t cnt, layer, head, id;
        if (cm_dp_touch_decode(p, n, &cnt) == RI_OK)
            for (uint32_t i = 0; i < cnt; i++) {
                cm_dp_touch_entry(p, i, &layer, &head, &id);
                s += layer + head + id;
            }
    }
    sink += s;
}

static void fz_prefix(uint8_t which, const uint8_t *p, size_t n)
{
    uint64_t s = 0;
    if (which == 14) {
        cm_pfx_view_t v;
        if (cm_pfx_decode(p, n, &v) == RI_OK) {
            for (uint32_t t = 0; t < v.n_tables; t++)
                s += cm_dp_get32(v.counts + 4u * t);
            for (uint64_t k = 0; k < v.total_clusters; k++)
                s += cm_dp_get32(v.sizes + 4u * k);
            /* sections are multiples of 8 bytes: their last word */
            if (v.hdr.worker_bytes > 0)
                s += cm_dp_get32(v.worker + v.hdr.worker_bytes - 4);
            if (v.hdr.pages_bytes > 0)
                s += cm_dp_get32(v.pages + v.hdr.pages_bytes - 4);
        }
    } else if (which == 15) {
        uint32_t cnt;
        const uint8_t *keys;
        uint32_t aflags = 0;
        if (cm_pfx_attach_req_decode(p, n, &cnt, &aflags, &keys) == RI_OK)
            s += cm_dp_get32(keys + (size_t)cnt * CM_PFX_KEY_SIZE - 4);
    } else if (which == 16) {
        cm_pfx_attached_t a[8];
        uint32_t cnt;
        if (cm_pfx_attach_rep_decode(p, n, 8, a, &cnt) == RI_OK)
            for (uint32_t i = 0; i < cnt; i++)
                s += a[i].slot + a[i].n_tokens + a[i].block_bytes;
    } else {
        cm_pfx_get_t g;
        uint32_t slot, flags;
        uint64_t bytes, off;
        if (cm_pfx_get_decode(p, n, &g) == RI_OK)
            s += g.slot + g.offset + g.length;
        if (cm_pfx_put_rep_decode(p, n, &slot, &flags, &bytes) == RI_OK)
            s += slot + flags + bytes;
        if (cm_pfx_get_rep_decode(p, n, &bytes, &off) == RI_OK)
            s += bytes + off;
    }
    sink += s;
}

/* Unpack and free, as a gRPC handler does with a request body. */
#define FZ_PB(Type, name, p, n)                                                        \
    do {                                                                               \
        Retroinfer__V1__##Type *m = retroinfer__v1__##name##__unpack(NULL, (n), (p));  \
        if (m != NULL)                                                                 \
            retroinfer__v1__##name##__free_unpacked(m, NULL);                          \
    } while (0)

static void fz_proto(uint8_t which, const uint8_t *p, size_t n)
{
    switch (which) {
    case 5: {
        Retroinfer__V1__CreateSessionRequest *m = retroinfer__v1__create_session_request__unpack(NULL, n, p);
        if (m != NULL) {
            if (m->geometry != NULL)
                sink += m->geometry->layers + m->geometry->kv_heads + m->geometry->head_dim;
            if (m->label != NULL)
                for (const char *c = m->label; *c; c++)
                    sink += (uint8_t)*c;
            retroinfer__v1__create_session_request__free_unpacked(m, NULL);
        }
        break;
    }
    case 6: FZ_PB(DropSessionRequest, drop_session_request, p, n); break;
    case 7: FZ_PB(ListSessionsRequest, list_sessions_request, p, n); break;
    case 8: FZ_PB(StatsRequest, stats_request, p, n); break;
    case 9: FZ_PB(HealthRequest, health_request, p, n); break;
    default: /* the two messages without their own selector value share one */
        FZ_PB(DrainRequest, drain_request, p, n);
        FZ_PB(KeepAliveRequest, keep_alive_request, p, n);
        break;
    }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size == 0)
        return 0;
    const uint8_t *p = data + 1;
    size_t n = size - 1;
    size_t claimed = n + FZ_MUTANT_SLACK; /* the length the data-plane decoders are given */
    uint8_t which = (uint8_t)(data[0] % 18);
    switch (which) {
    case 0: fz_wire(p, claimed); break;
    case 1: fz_clusters(p, claimed); break;
    case 2: fz_register(p, claimed); break;
    case 3: fz_fetch(p, claimed); break;
    case 4: fz_fetch_reply(p, claimed); break;
    case 11: case 12: case 13: fz_direct(which, p, claimed); break;
    case 14: case 15: case 16: case 17: fz_prefix(which, p, claimed); break;
    default: fz_proto(which, p, n); break;
    }
    return 0;
}
