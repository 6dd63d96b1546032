/*
 * Prefix blocks end to end (common/cm_dp_prefix.h, docs/kvstore-data.md
 * "Prefix blocks"): the real ri-kvstore on loopback with two tenants, and
 * the worker's client calls (gw_dp) against it.  Blocks are built here from
 * synthetic tables and pages (the worker's section is opaque bytes to the
 * kvstore).  Exits 77 when the daemon or UCX cannot run here.
 */
#define _GNU_SOURCE
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <fcntl.h>
#include <pthread.h>
#include <time.h>
#include <unistd.h>

#include <cmocka.h>

#include "common/cm_alloc.h"
#include "common/cm_crc32c.h"
#include "common/cm_dp_direct.h"
#include "common/cm_dp_prefix.h"
#include "common/cm_status.h"
#include "gpuworker/client/gw_ctl.h"
#include "gpuworker/client/gw_dp.h"
#ifdef PFX_HAVE_DIRECT
#include "gpuworker/client/gw_direct.h"
#endif
#include "tests/kvstore_data/kvs_spawn.h"

#define LAYERS 2u
#define HEADS 2u
#define DIM 16u
#define PT 8u
#define PAGE_BYTES (4u * PT * DIM)
#define NT (LAYERS * HEADS)
#define BLOCK_TOKENS 32u
#define CAP_BLOCKS 4u   /* --prefix-max-bytes in blocks of the eviction test */

static kvs_spawn_t g_sp;      /* pid of the daemon of the running test */
static char g_grpc[200];
static char g_tokens[256];
static int g_skipped;
static char g_spill_dir[64]; /* removed by the teardown */
static uint64_t g_expected = 4096; /* expected_tokens of the sessions made */
static const char *g_memory = "--memory=64MiB"; /* the daemon's pool */

/* --- blocks ----------------------------------------------------------------- */

typedef struct blk {
    uint8_t *buf;
    uint64_t len;
} blk_t;

/* A block of (layer, head) tables with two clusters each (sizes a, b),
 * pages filled from seed, a small worker section; CRC set. */
static blk_t make_block(uint32_t seed, uint32_t a, uint32_t b)
{
    uint32_t sizes[2] = {a, b};
    uint64_t pages = 0, tables = cm_pfx_tables_bytes(NT, 2u * NT), worker = 64;
    cm_pfx_hdr_t h = {.layers = LAYERS, .kv_heads = HEADS, .head_dim = DIM, .dtype = 1, .page_tokens = PT,
                      .first_pos = 0, .n_tokens = BLOCK_TOKENS};
    blk_t k;
    uint8_t *p;

    for (int i = 0; i < 2; i++)
        pages += (sizes[i] + PT - 1) / PT;
    pages *= NT;
    h.tables_bytes = tables;
    h.worker_bytes = worker;
    h.pages_bytes = pages * PAGE_BYTES;
    k.len = CM_PFX_HDR_SIZE + tables + worker + h.pages_bytes;
    k.buf = calloc(1, k.len);
    assert_non_null(k.buf);
    p = k.buf + CM_PFX_HDR_SIZE;
    for (uint32_t t = 0; t < NT; t++)
        cm_dp_put32(p + 4u * t, 2);
    for (uint32_t t = 0; t < NT; t++)
        for (int i = 0; i < 2; i++)
            cm_dp_put32(p + 4u * NT + 4u * (2u * t + (uint32_t)i), sizes[i]);
    uint64_t x = 0x9e3779b97f4a7c15ull * (seed + 1u); /* xorshift: windows of bytes unique to the block */
    for (uint64_t i = 0; i < worker + h.pages_bytes; i++) {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        k.buf[CM_PFX_HDR_SIZE + tables + i] = (uint8_t)x;
    }
    h.crc = cm_crc32c(0, k.buf + CM_PFX_HDR_SIZE, k.len - CM_PFX_HDR_SIZE);
    cm_pfx_hdr_encode(k.buf, &h);
    return k;
}

/* Offset of cluster j of table t in a block made by make_block. */
static uint64_t cluster_off(const blk_t *k, uint32_t t, uint32_t j)
{
    cm_pfx_view_t v;
    uint64_t off;
    const uint8_t *sz;

    assert_int_equal(cm_pfx_decode(k->buf, k->len, &v), RI_OK);
    off = (uint64_t)(v.pages - k->buf);
    sz = v.sizes;
    for (uint32_t i = 0; i < t * 2u + j; i++, sz += 4)
        off += (cm_dp_get32(sz) + PT - 1) / PT * PAGE_BYTES;
    return off;
}

static void key_of(uint8_t key[CM_PFX_KEY_SIZE], uint32_t n)
{
    memset(key, 0, CM_PFX_KEY_SIZE);
    cm_dp_put32(key, n * 2654435761u);
    cm_dp_put32(key + 28, n);
}

/* Publish block k under key n on dp; its slot there. */
static uint32_t put_key(gw_dp_t *dp, const blk_t *k, uint32_t n)
{
    uint8_t key[CM_PFX_KEY_SIZE];
    uint32_t slot = 0, flags = 0;
    key_of(key, n);
    assert_int_equal(gw_dp_prefix_put(dp, key, k->buf, k->len, &slot, &flags), RI_OK);
    return slot;
}

/* --- daemon ------------------------------------------------------------------ */

/* Start ri-kvstore with --prefix-max-bytes=prefix_max and up to two more
 * options (NULL: none). */
static int daemon_start2(const char *prefix_max, const char *opt1, const char *opt2)
{
    const char *bdir = getenv("RI_BUILD_DIR");
    char path[512], portfile[256], pmax[64], line[512];
    struct timespec ts = {0, 20 * 1000 * 1000};
    FILE *f = NULL;
    int fd;

    snprintf(path, sizeof(path), "%s/bin/ri-kvstore", bdir ? bdir : ".");
    if (access(path, X_OK) != 0)
        return 77;
    snprintf(g_tokens, sizeof(g_tokens), "/tmp/ri-pfx-tokens-%d", (int)getpid());
    fd = open(g_tokens, O_WRONLY | O_CREAT | O_TRUNC, 0600);
    assert_true(fd >= 0);
    static const char toks[] = "tok-alice alice\ntok-bob-1 bob\ntok-root-1 root - admin\n";
    assert_int_equal(write(fd, toks, sizeof(toks) - 1), (ssize_t)(sizeof(toks) - 1));
    close(fd);
    snprintf(portfile, sizeof(portfile), "/tmp/ri-pfx-ports-%d", (int)getpid());
    unlink(portfile);
    snprintf(pmax, sizeof(pmax), "--prefix-max-bytes=%s", prefix_max);
    memset(&g_sp, 0, sizeof(g_sp));
    g_sp.pid = fork();
    if (g_sp.pid == 0) {
        int devnull = open("/dev/null", O_WRONLY);
        prctl(PR_SET_PDEATHSIG, SIGTERM);
        if (devnull >= 0)
            dup2(devnull, 1);
        execl(path, path, "--listen=127.0.0.1:0", "--dataplane-listen=127.0.0.1:0", "--metrics-listen=off",
              g_memory, "--hugepages=false", "--port-file", portfile, "--drain-timeout-ms=2000",
              "--tokens-file", g_tokens, pmax, opt1, opt2, (char *)NULL);
        _exit(127);
    }
    for (int i = 0; i < 500 && f == NULL; i++) {
        int status;
        if (waitpid(g_sp.pid, &status, WNOHANG) == g_sp.pid) {
            g_sp.pid = 0; /* 77: it cannot run here (UCX); anything else is a failure */
            return WIFEXITED(status) && WEXITSTATUS(status) == 77 ? 77 : -1;
        }
        f = fopen(portfile, "r");
        if (f == NULL)
            nanosleep(&ts, NULL);
    }
    if (f == NULL)
        return -1;
    g_grpc[0] = '\0';
    while (fgets(line, sizeof(line), f) != NULL)
        if (strncmp(line, "grpc=", 5) == 0)
            sscanf(line + 5, "%199s", g_grpc);
    fclose(f);
    unlink(portfile);
    return g_grpc[0] != '\0' ? 0 : -1;
}

static int daemon_start(const char *prefix_max)
{
    return daemon_start2(prefix_max, NULL, NULL);
}

static int teardown_daemon(void **state)
{
    (void)state;
    if (g_sp.pid > 0)
        kvs_spawn_stop(&g_sp, SIGTERM, 5000);
    unlink(g_tokens);
    if (g_spill_dir[0] != '\0') { /* segment files are preallocated: do not leave them */
        char cmd[128];
        snprintf(cmd, sizeof(cmd), "rm -rf '%s'", g_spill_dir);
        if (system(cmd) != 0)
            fprintf(stderr, "could not remove %s\n", g_spill_dir);
        g_spill_dir[0] = '\0';
    }
    return 0;
}

/* A session of the token's tenant, connected; NULL (and the test skipped)
 * when the data plane cannot run here. */
typedef struct sess {
    gw_ctl_session_t s;
    gw_dp_t *dp;
} sess_t;

static int open_session(const char *token, sess_t *out)
{
    gw_ctl_t *ctl = NULL;
    gw_ctl_geometry_t g = {.layers = LAYERS, .kv_heads = HEADS, .head_dim = DIM, .dtype = 1, .page_tokens = PT};
    gw_ctl_error_t err = {0};
    ri_status_t st = gw_ctl_create(g_grpc, token, &ctl);

    if (st == RI_OK)
        st = gw_ctl_create_session(ctl, 5000, &g, g_expected, "pfx-test", &out->s, &err);
    gw_ctl_destroy(ctl);
    assert_int_equal(st, RI_OK);
    if (out->s.dataplane_address[0] == '\0')
        return 77;
    st = gw_dp_connect(out->s.dataplane_address, out->s.session_id, out->s.secret, NULL, &out->dp);
    if (st == RI_ERR_TRANSPORT || st == RI_ERR_TIMEOUT)
        return 77;
    assert_int_equal(st, RI_OK);
    return 0;
}

static void drop_session(const char *token, sess_t *s)
{
    gw_ctl_t *ctl = NULL;
    gw_ctl_error_t err = {0};

    gw_dp_close(s->dp);
    s->dp = NULL;
    assert_int_equal(gw_ctl_create(g_grpc, token, &ctl), RI_OK);
    assert_int_equal(gw_ctl_drop_session(ctl, 5000, s->s.session_id, NULL, &err), RI_OK);
    gw_ctl_destroy(ctl);
}

#define START_OR_SKIP(pmax)                                                 \
    do {                                                                    \
        int rc_ = daemon_start(pmax);                                       \
        if (rc_ == 77) {                                                    \
            g_skipped = 1;                                                  \
            return;                                                         \
        }                                                                   \
        assert_int_equal(rc_, 0);                                           \
    } while (0)

#define START_OR_SKIP2(pmax, o1, o2)                                        \
    do {                                                                    \
        int rc_ = daemon_start2(pmax, o1, o2);                              \
        if (rc_ == 77) {                                                    \
            g_skipped = 1;                                                  \
            return;                                                         \
        }                                                                   \
        assert_int_equal(rc_, 0);                                           \
    } while (0)

#define OPEN_OR_SKIP(tok, s)                                                \
    do {                                                                    \
        if (open_session(tok, s) == 77) {                                   \
            g_skipped = 1;                                                  \
            return;                                                         \
        }                                                                   \
    } while (0)

/* --- tests ------------------------------------------------------------------- */

/* Publish, attach, read back three ways; a second session sees the same
 * bytes and its own appends stay its own. */
static void test_publish_attach_share(void **state)
{
    sess_t a, b, c;
    blk_t k = make_block(1, 10, 12);
    uint8_t key[CM_PFX_KEY_SIZE], keys[2 * CM_PFX_KEY_SIZE], *got = malloc(k.len);
    uint32_t slot = 99, flags = 99, n_att = 0;
    cm_pfx_attached_t att[2];
    const uint8_t *map = NULL;
    uint64_t map_bytes = 0, offs[4];
    (void)state;

    START_OR_SKIP("0");
    OPEN_OR_SKIP("tok-alice", &a);
    key_of(key, 1);
    assert_int_equal(gw_dp_prefix_put(a.dp, key, k.buf, k.len, &slot, &flags), RI_OK);
    assert_int_equal(slot, 0);
    assert_int_equal(flags, 0);
    /* PREFIX_GET, whole and a piece */
    assert_int_equal(gw_dp_prefix_get(a.dp, 0, 0, got, k.len), RI_OK);
    assert_memory_equal(got, k.buf, k.len);
    assert_int_equal(gw_dp_prefix_get(a.dp, 0, 100, got, 64), RI_OK);
    assert_memory_equal(got, k.buf + 100, 64);
    assert_int_equal(gw_dp_prefix_get(a.dp, 0, k.len - 8, got, 64), RI_ERR_RANGE);
    assert_int_equal(gw_dp_prefix_get(a.dp, 1, 0, got, 8), RI_ERR_RANGE);

    /* A second session of the tenant attaches it (the second key misses). */
    OPEN_OR_SKIP("tok-alice", &b);
    memcpy(keys, key, CM_PFX_KEY_SIZE);
    key_of(keys + CM_PFX_KEY_SIZE, 2);
    assert_int_equal(gw_dp_prefix_attach(b.dp, keys, 2, att, &n_att), RI_OK);
    assert_int_equal(n_att, 1);
    assert_int_equal(att[0].slot, 0);
    assert_int_equal(att[0].n_tokens, BLOCK_TOKENS);
    assert_int_equal(att[0].block_bytes, k.len);

    /* FETCH_RANKED of its clusters: the block's pages. */
    {
        static uint8_t recv[64 * PAGE_BYTES];
        uint32_t cache_id, heads[2] = {0, 1}, counts[2] = {2, 1}, ids[3] = {0, 1, 1};
        uint64_t pb;
        gw_dp_fetch_result_t res = {0};
        assert_int_equal(gw_dp_register_cache(b.dp, 64, recv, sizeof(recv), &cache_id, &pb), RI_OK);
        assert_int_equal(pb, PAGE_BYTES);
        assert_int_equal(gw_dp_fetch_ranked(b.dp, cache_id, 1, 2, heads, counts, ids, 0, 0, &res), RI_OK);
        /* layer 1: tables 2 (head 0) and 3 (head 1); misses land back to back */
        uint64_t o = 0;
        const uint32_t tab[3] = {2, 2, 3}, cl[3] = {0, 1, 1}, sz[2] = {10, 12};
        for (int i = 0; i < 3; i++) {
            uint64_t len = (sz[cl[i]] + PT - 1) / PT * PAGE_BYTES;
            assert_memory_equal(recv + o, k.buf + cluster_off(&k, tab[i], cl[i]), len);
            o += len;
        }
        gw_dp_fetch_result_free(&res);
    }

    /* LOCATE answers tagged offsets; the mapped block has the same bytes. */
    assert_int_equal(gw_dp_locate(b.dp, 0, 1, 0, 2, offs), RI_OK);
    for (uint32_t j = 0; j < 2; j++) {
        assert_true(cm_pfx_loc_is_block(offs[j]));
        assert_int_equal(cm_pfx_loc_slot(offs[j]), 0);
        assert_int_equal(cm_pfx_loc_off(offs[j]), cluster_off(&k, 1, j));
    }
    ri_status_t st = gw_dp_map_block(b.dp, 0, &map, &map_bytes);
    if (st != RI_ERR_UNSUPPORTED) {
        const uint8_t *again = NULL;
        uint64_t again_bytes = 0;
        assert_int_equal(st, RI_OK);
        assert_int_equal(map_bytes, k.len);
        assert_memory_equal(map, k.buf, k.len);
        assert_memory_equal(map + cm_pfx_loc_off(offs[1]), k.buf + cluster_off(&k, 1, 1), 2 * PAGE_BYTES);
        assert_int_equal(gw_dp_map_block(b.dp, 0, &again, &again_bytes), RI_OK);
        assert_ptr_equal(again, map);
        /* no such slot: refused like any other unknown object */
        assert_int_equal(gw_dp_map_block(b.dp, 7, &again, &again_bytes), RI_ERR_UNAUTHENTICATED);
#ifdef PFX_HAVE_DIRECT
        /* the worker's direct reads: a tagged answer reads the block's mapping */
        gw_direct_t *d = NULL;
        assert_int_equal(gw_direct_open(b.dp, LAYERS, HEADS, PAGE_BYTES, &d), RI_OK);
        assert_int_equal(gw_direct_record(d, 0, 1, 0, 2, offs), RI_OK);
        assert_null(gw_direct_pages(d, 0, 1, 1, 2)); /* block not mapped in d yet: fetch it */
        assert_int_equal(gw_direct_set_block(d, 0, map, map_bytes), RI_OK);
        assert_ptr_equal(gw_direct_pages(d, 0, 1, 1, 2), map + cluster_off(&k, 1, 1));
        assert_null(gw_direct_pages(d, 0, 1, 1, 4096)); /* past the block: never read */
        gw_direct_close(d);
#endif
    }
    /* TOUCH of attached clusters is accepted like the session's own. */
    {
        uint32_t recs[3] = {0, 1, 1};
        assert_int_equal(gw_dp_touch(b.dp, recs, 1), RI_OK);
    }

    /* b appends its own cluster after the attached ones; a does not see it. */
    {
        uint32_t head = 0, cnt = 1, tok = 5, first = 0;
        uint8_t page[PAGE_BYTES];
        memset(page, 0x5a, sizeof(page));
        assert_int_equal(gw_dp_upload(b.dp, false, 0, 1, &head, &cnt, &tok, page, sizeof(page), &first),
                         RI_ERR_EXISTS); /* UPLOAD needs empty tables */
        assert_int_equal(gw_dp_upload(b.dp, true, 0, 1, &head, &cnt, &tok, page, sizeof(page), &first), RI_OK);
        assert_int_equal(first, 2);
        assert_int_equal(gw_dp_locate(b.dp, 0, 0, 2, 1, offs), RI_OK);
        assert_false(cm_pfx_loc_is_block(offs[0]));
        assert_int_equal(gw_dp_locate(a.dp, 0, 0, 2, 1, offs), RI_ERR_RANGE);
        /* a block attached after its own cluster (a PUT after the APPEND)
         * takes the next ids: (layer 0, head 0) has 2 clusters in it */
        assert_int_equal(put_key(b.dp, &k, 4), 1);
        assert_int_equal(gw_dp_locate(b.dp, 0, 0, 2, 3, offs), RI_OK);
        assert_false(cm_pfx_loc_is_block(offs[0]));
        for (uint32_t j = 1; j < 3; j++) {
            assert_true(cm_pfx_loc_is_block(offs[j]));
            assert_int_equal(cm_pfx_loc_slot(offs[j]), 1);
            assert_int_equal(cm_pfx_loc_off(offs[j]), cluster_off(&k, 0, j - 1));
        }
        assert_int_equal(gw_dp_locate(b.dp, 0, 0, 5, 1, offs), RI_ERR_RANGE);
    }

    /* A session that reads blocks by slot only (a worker's prefix session):
     * the block attaches and reads as before, but its tables stay empty,
     * for the blocks it publishes later too; an unknown flag is refused. */
    OPEN_OR_SKIP("tok-alice", &c);
    assert_int_equal(gw_dp_prefix_attach_flags(c.dp, key, 1, 0x2u, att, &n_att), RI_ERR_PROTOCOL);
    assert_int_equal(gw_dp_prefix_attach_flags(c.dp, key, 1, CM_PFX_ATTACH_F_SLOTS, att, &n_att), RI_OK);
    assert_int_equal(n_att, 1);
    assert_int_equal(att[0].block_bytes, k.len);
    assert_int_equal(gw_dp_prefix_get(c.dp, att[0].slot, 0, got, k.len), RI_OK);
    assert_memory_equal(got, k.buf, k.len);
    assert_int_equal(gw_dp_locate(c.dp, 0, 1, 0, 1, offs), RI_ERR_RANGE);
    assert_int_equal(put_key(c.dp, &k, 3), 1);
    assert_int_equal(gw_dp_locate(c.dp, 0, 1, 0, 1, offs), RI_ERR_RANGE);
    gw_dp_close(c.dp);

    /* The block outlives the session that published it. */
    drop_session("tok-alice", &a);
    assert_int_equal(gw_dp_prefix_get(b.dp, 0, 0, got, k.len), RI_OK);
    assert_memory_equal(got, k.buf, k.len);
    gw_dp_close(b.dp);
    free(got);
    free(k.buf);
}

/* PUT of an existing key: equal tables attach (EXISTED), other tables are
 * refused and change nothing; another tenant never sees the block. */
static void test_put_existing_and_tenants(void **state)
{
    sess_t a, b, c;
    blk_t k = make_block(2, 10, 12), same = make_block(2, 10, 12), other = make_block(2, 9, 12),
          repaged = make_block(3, 10, 12);
    uint8_t key[CM_PFX_KEY_SIZE];
    uint32_t slot, flags, n_att = 9;
    cm_pfx_attached_t att[1];
    uint64_t offs[5];
    (void)state;

    START_OR_SKIP("0");
    OPEN_OR_SKIP("tok-alice", &a);
    OPEN_OR_SKIP("tok-alice", &b);
    OPEN_OR_SKIP("tok-bob-1", &c);
    key_of(key, 7);
    assert_int_equal(gw_dp_prefix_put(a.dp, key, k.buf, k.len, &slot, &flags), RI_OK);
    assert_int_equal(flags, 0);
    /* equal header and tables: the stored block is attached */
    assert_int_equal(gw_dp_prefix_put(b.dp, key, same.buf, same.len, &slot, &flags), RI_OK);
    assert_int_equal(flags, CM_PFX_F_EXISTED);
    assert_int_equal(slot, 0);
    {
        uint8_t *got = malloc(k.len);
        assert_int_equal(gw_dp_prefix_get(b.dp, 0, 0, got, k.len), RI_OK);
        assert_memory_equal(got, k.buf, k.len); /* the stored block stands */
        free(got);
    }
    /* equal tables, other pages (another worker's rounding): the stored block
     * is attached and stands */
    assert_int_equal(gw_dp_prefix_put(b.dp, key, repaged.buf, repaged.len, &slot, &flags), RI_OK);
    assert_int_equal(flags, CM_PFX_F_EXISTED);
    assert_int_equal(slot, 1);
    {
        uint8_t *got = malloc(k.len);
        assert_int_equal(gw_dp_prefix_get(b.dp, 1, 0, got, k.len), RI_OK);
        assert_memory_equal(got, k.buf, k.len);
        free(got);
    }
    /* other tables: refused, b's tables unchanged (two attached blocks) */
    assert_int_equal(gw_dp_prefix_put(b.dp, key, other.buf, other.len, &slot, &flags), RI_ERR_EXISTS);
    assert_int_equal(gw_dp_locate(b.dp, 0, 0, 0, 4, offs), RI_OK);
    assert_int_equal(gw_dp_locate(b.dp, 0, 0, 0, 5, offs), RI_ERR_RANGE);

    /* bob: a miss on attach; his own block under the same key is his own */
    assert_int_equal(gw_dp_prefix_attach(c.dp, key, 1, att, &n_att), RI_OK);
    assert_int_equal(n_att, 0);
    assert_int_equal(gw_dp_prefix_put(c.dp, key, other.buf, other.len, &slot, &flags), RI_OK);
    assert_int_equal(flags, 0);

    /* the control API: each tenant sees its own; bob cannot drop alice's */
    {
        gw_ctl_t *alice = NULL, *bob = NULL, *root = NULL;
        gw_ctl_error_t err = {0};
        gw_ctl_prefix_info_t *infos = NULL;
        size_t n = 0;
        uint32_t cached = 9, dropped = 0;
        uint64_t tokens = 0, freed = 9;
        uint8_t keys[2 * CM_PFX_KEY_SIZE];
        assert_int_equal(gw_ctl_create(g_grpc, "tok-alice", &alice), RI_OK);
        assert_int_equal(gw_ctl_create(g_grpc, "tok-bob-1", &bob), RI_OK);
        assert_int_equal(gw_ctl_create(g_grpc, "tok-root-1", &root), RI_OK);
        memcpy(keys, key, CM_PFX_KEY_SIZE);
        key_of(keys + CM_PFX_KEY_SIZE, 8);
        assert_int_equal(gw_ctl_lookup_prefix(alice, 5000, keys, 2, &cached, &tokens, &err), RI_OK);
        assert_int_equal(cached, 1);
        assert_int_equal(tokens, BLOCK_TOKENS);
        assert_int_equal(gw_ctl_list_prefixes(alice, 5000, &infos, &n, &err), RI_OK);
        assert_int_equal(n, 1);
        assert_string_equal(infos[0].tenant, "alice");
        assert_memory_equal(infos[0].key, key, CM_PFX_KEY_SIZE);
        assert_int_equal(infos[0].bytes, k.len);
        assert_int_equal(infos[0].sessions, 3); /* a once, b twice (two slots) */
        cm_free(infos);
        assert_int_equal(gw_ctl_list_prefixes(bob, 5000, &infos, &n, &err), RI_OK);
        assert_int_equal(n, 1);
        assert_string_equal(infos[0].tenant, "bob");
        cm_free(infos);
        assert_int_equal(gw_ctl_list_prefixes(root, 5000, &infos, &n, &err), RI_OK);
        assert_int_equal(n, 2); /* an admin sees every tenant's */
        cm_free(infos);
        assert_int_equal(gw_ctl_drop_prefix(bob, 5000, key, "alice", NULL, NULL, &err), RI_ERR_PERMISSION);
        assert_int_equal(gw_ctl_drop_prefix(bob, 5000, key, NULL, &dropped, NULL, &err), RI_OK); /* his own */
        assert_int_equal(dropped, 1);
        assert_int_equal(gw_ctl_drop_prefix(bob, 5000, key, NULL, NULL, NULL, &err), RI_ERR_NOT_FOUND);
        assert_int_equal(gw_ctl_lookup_prefix(alice, 5000, keys, 1, &cached, &tokens, &err), RI_OK);
        assert_int_equal(cached, 1); /* alice's stands */
        /* alice drops hers while two sessions hold it: gone from the
         * catalog now, still readable by them, freed when they end */
        assert_int_equal(gw_ctl_drop_prefix(alice, 5000, key, NULL, &dropped, &freed, &err), RI_OK);
        assert_int_equal(dropped, 1);
        assert_int_equal(freed, 0);
        assert_int_equal(gw_ctl_lookup_prefix(alice, 5000, keys, 1, &cached, &tokens, &err), RI_OK);
        assert_int_equal(cached, 0);
        {
            uint8_t *got = malloc(k.len);
            assert_int_equal(gw_dp_prefix_get(a.dp, 0, 0, got, k.len), RI_OK);
            assert_memory_equal(got, k.buf, k.len);
            free(got);
        }
        assert_int_equal(gw_dp_prefix_attach(b.dp, key, 1, att, &n_att), RI_OK);
        assert_int_equal(n_att, 0);
        gw_ctl_destroy(alice);
        gw_ctl_destroy(bob);
        gw_ctl_destroy(root);
    }
    gw_dp_close(a.dp);
    gw_dp_close(b.dp);
    gw_dp_close(c.dp);
    free(k.buf);
    free(same.buf);
    free(other.buf);
    free(repaged.buf);
}

/* Over --prefix-max-bytes a PUT evicts the least recently used unreferenced
 * block; attached blocks stay; a block over the cap alone is refused. */
static void test_eviction_under_cap(void **state)
{
    sess_t x, y, z, w;
    blk_t k[6];
    uint8_t key[CM_PFX_KEY_SIZE];
    uint32_t slot, flags, n_att;
    cm_pfx_attached_t att[1];
    char pmax[32];
    uint64_t charge;
    (void)state;

    for (uint32_t i = 0; i < 6; i++)
        k[i] = make_block(10 + i, 10, 12);
    charge = (k[0].len + 4095u) / 4096u * 4096u;
    snprintf(pmax, sizeof(pmax), "%llu", (unsigned long long)(CAP_BLOCKS * charge));
    START_OR_SKIP(pmax);
    OPEN_OR_SKIP("tok-alice", &x);
    OPEN_OR_SKIP("tok-alice", &y);
    OPEN_OR_SKIP("tok-alice", &z);
    key_of(key, 100);
    assert_int_equal(gw_dp_prefix_put(x.dp, key, k[0].buf, k[0].len, &slot, &flags), RI_OK); /* stays attached */
    for (uint32_t i = 1; i <= 2; i++) {
        key_of(key, 100 + i);
        assert_int_equal(gw_dp_prefix_put(y.dp, key, k[i].buf, k[i].len, &slot, &flags), RI_OK);
    }
    drop_session("tok-alice", &y); /* 101 and 102 are unreferenced now, 101 the older */
    for (uint32_t i = 3; i <= 4; i++) {
        key_of(key, 100 + i);
        assert_int_equal(gw_dp_prefix_put(z.dp, key, k[i].buf, k[i].len, &slot, &flags), RI_OK);
    }
    OPEN_OR_SKIP("tok-alice", &w);
    const uint32_t want[5] = {1, 0, 1, 1, 1}; /* 101 went for 104 */
    for (uint32_t i = 0; i < 5; i++) {
        key_of(key, 100 + i);
        assert_int_equal(gw_dp_prefix_attach(w.dp, key, 1, att, &n_att), RI_OK);
        assert_int_equal(n_att, want[i]);
    }
    /* everything is referenced now: one more is refused */
    key_of(key, 105);
    assert_int_equal(gw_dp_prefix_put(z.dp, key, k[5].buf, k[5].len, &slot, &flags), RI_ERR_QUOTA);
    gw_dp_close(x.dp);
    gw_dp_close(z.dp);
    gw_dp_close(w.dp);
    for (uint32_t i = 0; i < 6; i++)
        free(k[i].buf);
}

/* --prefix-tenant-max-bytes: over it a PUT evicts the tenant's own
 * unreferenced blocks, never another tenant's; with all its own attached it
 * is refused (QUOTA) while another tenant still publishes. */
static void test_tenant_cap(void **state)
{
    sess_t a1, a2, b1, w;
    blk_t k[6];
    uint8_t key[CM_PFX_KEY_SIZE];
    uint32_t slot, flags, n_att;
    cm_pfx_attached_t att[1];
    char tmax[64];
    uint64_t charge;
    (void)state;

    for (uint32_t i = 0; i < 6; i++)
        k[i] = make_block(40 + i, 10, 12);
    charge = (k[0].len + 4095u) / 4096u * 4096u;
    snprintf(tmax, sizeof(tmax), "--prefix-tenant-max-bytes=%llu", (unsigned long long)(2 * charge));
    START_OR_SKIP2("0", tmax, NULL);
    OPEN_OR_SKIP("tok-alice", &a1);
    OPEN_OR_SKIP("tok-bob-1", &b1);
    for (uint32_t i = 0; i < 2; i++) {
        key_of(key, 300 + i);
        assert_int_equal(gw_dp_prefix_put(a1.dp, key, k[i].buf, k[i].len, &slot, &flags), RI_OK);
    }
    key_of(key, 302);
    assert_int_equal(gw_dp_prefix_put(a1.dp, key, k[2].buf, k[2].len, &slot, &flags), RI_ERR_QUOTA);
    for (uint32_t i = 3; i < 5; i++) { /* bob has a cap of his own */
        key_of(key, 300 + i);
        assert_int_equal(gw_dp_prefix_put(b1.dp, key, k[i].buf, k[i].len, &slot, &flags), RI_OK);
    }
    drop_session("tok-alice", &a1); /* 300, 301 unreferenced */
    drop_session("tok-bob-1", &b1); /* 303, 304 unreferenced, older than nothing of alice's next */
    OPEN_OR_SKIP("tok-alice", &a2);
    key_of(key, 305);
    assert_int_equal(gw_dp_prefix_put(a2.dp, key, k[5].buf, k[5].len, &slot, &flags), RI_OK); /* 300 goes */
    OPEN_OR_SKIP("tok-alice", &w);
    const uint32_t want_alice[3] = {0, 1, 1}, keys_alice[3] = {300, 301, 305};
    for (uint32_t i = 0; i < 3; i++) {
        key_of(key, keys_alice[i]);
        assert_int_equal(gw_dp_prefix_attach(w.dp, key, 1, att, &n_att), RI_OK);
        assert_int_equal(n_att, want_alice[i]);
    }
    gw_dp_close(w.dp);
    OPEN_OR_SKIP("tok-bob-1", &w);
    for (uint32_t i = 3; i < 5; i++) { /* bob's stayed */
        key_of(key, 300 + i);
        assert_int_equal(gw_dp_prefix_attach(w.dp, key, 1, att, &n_att), RI_OK);
        assert_int_equal(n_att, 1);
    }
    gw_dp_close(w.dp);
    gw_dp_close(a2.dp);
    for (uint32_t i = 0; i < 6; i++)
        free(k[i].buf);
}

/* Pool pressure: when a session's upload finds the pool full, unreferenced
 * blocks are evicted (least recently used first) before the upload fails;
 * attached blocks stay. */
static void test_pool_pressure(void **state)
{
    sess_t a, b;
    blk_t k = make_block(60, 10, 12);
    uint8_t key[CM_PFX_KEY_SIZE];
    uint32_t slot, flags, n_att, n = 0;
    cm_pfx_attached_t att[1];
    ri_status_t st = RI_OK;
    (void)state;

    /* blocks may fill the whole (1 MiB) pool; sessions reserve little */
    g_expected = 64;
    g_memory = "--memory=1MiB";
    START_OR_SKIP2("1MiB", NULL, NULL);
    OPEN_OR_SKIP("tok-alice", &a);
    OPEN_OR_SKIP("tok-alice", &b);
    while (st == RI_OK && n < 1000) {
        key_of(key, 400 + n);
        st = gw_dp_prefix_put(a.dp, key, k.buf, k.len, &slot, &flags);
        n += st == RI_OK;
    }
    /* the cap is the pool here: blocks fill it but for less than a block */
    assert_true(st == RI_ERR_QUOTA || st == RI_ERR_NOSPACE);
    assert_true(n > 10);
    /* b holds the first one; a lets go of the rest */
    key_of(key, 400);
    assert_int_equal(gw_dp_prefix_attach(b.dp, key, 1, att, &n_att), RI_OK);
    assert_int_equal(n_att, 1);
    drop_session("tok-alice", &a);
    /* b's own upload (16 pages, more than the pool has left): the pool is
     * full of blocks, the least recently used unreferenced one goes */
    {
        uint32_t head = 1, cnt = 1, tok = 128, first = 0;
        static uint8_t pages[16 * PAGE_BYTES];
        memset(pages, 0x3c, sizeof(pages));
        assert_int_equal(gw_dp_upload(b.dp, true, 0, 1, &head, &cnt, &tok, pages, sizeof(pages), &first), RI_OK);
        assert_int_equal(first, 2);
    }
    key_of(key, 400);
    assert_int_equal(gw_dp_prefix_attach(b.dp, key, 1, att, &n_att), RI_OK);
    assert_int_equal(n_att, 1); /* attached: stayed */
    key_of(key, 401);
    assert_int_equal(gw_dp_prefix_attach(b.dp, key, 1, att, &n_att), RI_OK);
    assert_int_equal(n_att, 0); /* the least recently used unreferenced one went */
    key_of(key, 402);
    assert_int_equal(gw_dp_prefix_attach(b.dp, key, 1, att, &n_att), RI_OK);
    assert_int_equal(n_att, 1);
    gw_dp_close(b.dp);
    free(k.buf);
    g_expected = 4096;
    g_memory = "--memory=64MiB";
}

/* Send a PREFIX_PUT with this meta and data through the raw path. */
static ri_status_t raw_put(gw_dp_t *dp, const void *meta, uint32_t meta_len, const void *data, uint64_t len)
{
    cm_wire_hdr_t h, rep;
    uint8_t hb[CM_WIRE_HDR_SIZE], *body = malloc(meta_len + len + 1);
    ri_status_t st;

    memcpy(body, meta, meta_len);
    if (len > 0)
        memcpy(body + meta_len, data, len);
    gw_dp_header(dp, CM_WIRE_OP_PREFIX_PUT, meta_len, len, &h);
    cm_wire_encode(&h, hb);
    st = gw_dp_raw(dp, hb, sizeof(hb), body, meta_len + len, 5000, &rep);
    free(body);
    return st != RI_OK ? st : (ri_status_t)rep.status;
}

/* Malformed bodies: a clear error each, nothing published, the daemon lives. */
static void test_malformed(void **state)
{
    sess_t a;
    blk_t k = make_block(4, 10, 12);
    uint8_t key[CM_PFX_KEY_SIZE], *bad = malloc(k.len);
    uint32_t n_att = 9, rnd = 12345;
    cm_pfx_attached_t att[1];
    (void)state;

    START_OR_SKIP("0");
    OPEN_OR_SKIP("tok-alice", &a);
    key_of(key, 9);
    /* truncated: every short length is refused */
    for (uint64_t len = 0; len < k.len; len += len < 128 ? 1 : 997)
        assert_int_not_equal(raw_put(a.dp, key, CM_PFX_KEY_SIZE, k.buf, len), RI_OK);
    /* meta of the wrong length */
    assert_int_equal(raw_put(a.dp, key, 8, k.buf, k.len), RI_ERR_TRUNCATED);
    /* a flipped byte past the header: CORRUPT */
    memcpy(bad, k.buf, k.len);
    bad[k.len - 3] ^= 0x40;
    assert_int_equal(raw_put(a.dp, key, CM_PFX_KEY_SIZE, bad, k.len), RI_ERR_CORRUPT);
    /* a table count that does not add up; a cluster of size 0 */
    memcpy(bad, k.buf, k.len);
    cm_dp_put32(bad + CM_PFX_HDR_SIZE, 3);
    assert_int_equal(raw_put(a.dp, key, CM_PFX_KEY_SIZE, bad, k.len), RI_ERR_PROTOCOL);
    memcpy(bad, k.buf, k.len);
    cm_dp_put32(bad + CM_PFX_HDR_SIZE + 4u * NT, 0);
    assert_int_equal(raw_put(a.dp, key, CM_PFX_KEY_SIZE, bad, k.len), RI_ERR_PROTOCOL);
    /* another geometry (head_dim 32 with the same bytes: pages do not add up,
     * or they would be refused as INVALID) */
    memcpy(bad, k.buf, k.len);
    cm_dp_put32(bad + 16, 32);
    assert_int_not_equal(raw_put(a.dp, key, CM_PFX_KEY_SIZE, bad, k.len), RI_OK);
    /* random bytes after a valid header */
    for (int r = 0; r < 200; r++) {
        memcpy(bad, k.buf, k.len);
        for (int j = 0; j < 4; j++) {
            rnd = rnd * 1103515245u + 12345u;
            bad[CM_PFX_HDR_SIZE + (rnd >> 8) % (uint32_t)(cm_pfx_tables_bytes(NT, 2u * NT))] ^= (uint8_t)(rnd >> 3);
        }
        (void)raw_put(a.dp, key, CM_PFX_KEY_SIZE, bad, k.len); /* any verdict; the daemon must live */
    }
    /* nothing was published under the key by any of those, unless a mutation
     * left a valid block with a right CRC (it cannot: the tables are under the CRC) */
    assert_int_equal(gw_dp_prefix_attach(a.dp, key, 1, att, &n_att), RI_OK);
    assert_int_equal(n_att, 0);
    /* bad ATTACH and GET metas */
    {
        cm_wire_hdr_t h, rep;
        uint8_t hb[CM_WIRE_HDR_SIZE], meta[CM_PFX_ATTACH_FIXED] = {0};
        gw_dp_header(a.dp, CM_WIRE_OP_PREFIX_ATTACH, sizeof(meta), 0, &h);
        cm_wire_encode(&h, hb);
        assert_int_equal(gw_dp_raw(a.dp, hb, sizeof(hb), meta, sizeof(meta), 5000, &rep), RI_OK);
        assert_int_equal(rep.status, RI_ERR_PROTOCOL); /* n = 0 */
        gw_dp_header(a.dp, CM_WIRE_OP_PREFIX_GET, 8, 0, &h);
        cm_wire_encode(&h, hb);
        assert_int_equal(gw_dp_raw(a.dp, hb, sizeof(hb), meta, 8, 5000, &rep), RI_OK);
        assert_int_equal(rep.status, RI_ERR_TRUNCATED);
    }
    assert_int_equal(gw_dp_ping(a.dp), RI_OK);
    /* and the valid block still publishes */
    assert_int_equal(gw_dp_prefix_put(a.dp, key, k.buf, k.len, NULL, NULL), RI_OK);
    gw_dp_close(a.dp);
    free(bad);
    free(k.buf);
}

/* Flip one byte of every copy of needle (len bytes) in the spill
 * directory's segment files (a block written twice has a dead copy too);
 * returns the copies flipped. */
static int flip_on_disk(const char *dir, const uint8_t *needle, size_t len)
{
    char path[512];
    int flipped = 0;

    for (int seg = 0; seg < 64; seg++) {
        struct stat sb;
        uint8_t *buf;
        FILE *f;
        snprintf(path, sizeof(path), "%s/seg-%08d.dat", dir, seg);
        f = fopen(path, "r+b");
        if (f == NULL)
            continue;
        assert_int_equal(fstat(fileno(f), &sb), 0);
        buf = malloc((size_t)sb.st_size);
        assert_non_null(buf);
        assert_int_equal(fread(buf, 1, (size_t)sb.st_size, f), (size_t)sb.st_size);
        for (uint8_t *p = buf, *hit; (hit = memmem(p, (size_t)(buf + sb.st_size - p), needle, len)) != NULL;
             p = hit + len) {
            uint8_t c = (uint8_t)(hit[len / 2] ^ 0x10);
            fseek(f, (long)(hit - buf) + (long)len / 2, SEEK_SET);
            assert_int_equal(fwrite(&c, 1, 1, f), 1);
            flipped++;
        }
        free(buf);
        fclose(f);
    }
    return flipped;
}

/* With a spill directory: an evicted block goes to disk and comes back at
 * attach; kill -9 keeps what was spilled and --recover finds it; a clean
 * stop writes resident blocks out; a record with a flipped byte is a miss,
 * never served. */
static void test_spill_recover(void **state)
{
    sess_t a, b, c, d;
    blk_t k[6];
    uint8_t key[CM_PFX_KEY_SIZE], *got;
    uint32_t slot, flags, n_att;
    cm_pfx_attached_t att[1];
    char *dir = g_spill_dir, pmax[32], sdir[96];
    uint64_t charge;
    (void)state;

    for (uint32_t i = 0; i < 6; i++)
        k[i] = make_block(20 + i, 10, 12);
    got = malloc(k[0].len);
    charge = (k[0].len + 4095u) / 4096u * 4096u;
    snprintf(pmax, sizeof(pmax), "%llu", (unsigned long long)(2 * charge));
    snprintf(g_spill_dir, sizeof(g_spill_dir), "/tmp/ri-pfx-spill-XXXXXX");
    assert_non_null(mkdtemp(g_spill_dir));
    snprintf(sdir, sizeof(sdir), "--spill-dir=%s", dir);
    START_OR_SKIP2(pmax, sdir, NULL);
    OPEN_OR_SKIP("tok-alice", &a);
    for (uint32_t i = 1; i <= 2; i++) {
        key_of(key, 200 + i);
        assert_int_equal(gw_dp_prefix_put(a.dp, key, k[i].buf, k[i].len, &slot, &flags), RI_OK);
    }
    drop_session("tok-alice", &a); /* 201, 202 unreferenced */
    OPEN_OR_SKIP("tok-alice", &b);
    key_of(key, 203);
    assert_int_equal(gw_dp_prefix_put(b.dp, key, k[3].buf, k[3].len, &slot, &flags), RI_OK); /* 201 to disk */
    OPEN_OR_SKIP("tok-alice", &c);
    key_of(key, 201);
    assert_int_equal(gw_dp_prefix_attach(c.dp, key, 1, att, &n_att), RI_OK); /* read back; 202 to disk */
    assert_int_equal(n_att, 1);
    assert_int_equal(gw_dp_prefix_get(c.dp, att[0].slot, 0, got, k[1].len), RI_OK);
    assert_memory_equal(got, k[1].buf, k[1].len);
    gw_dp_close(b.dp);
    gw_dp_close(c.dp);

    /* kill -9: 202 was on disk; 201 and 203 were in memory only */
    kvs_spawn_stop(&g_sp, SIGKILL, 2000);
    START_OR_SKIP2(pmax, sdir, "--recover");
    OPEN_OR_SKIP("tok-alice", &d);
    const uint32_t want[3] = {0, 1, 0};
    for (uint32_t i = 0; i < 3; i++) {
        key_of(key, 201 + i);
        assert_int_equal(gw_dp_prefix_attach(d.dp, key, 1, att, &n_att), RI_OK);
        assert_int_equal(n_att, want[i]);
    }
    assert_int_equal(gw_dp_prefix_get(d.dp, 0, 0, got, k[2].len), RI_OK);
    assert_memory_equal(got, k[2].buf, k[2].len);
    key_of(key, 204);
    assert_int_equal(gw_dp_prefix_put(d.dp, key, k[4].buf, k[4].len, &slot, &flags), RI_OK);
    gw_dp_close(d.dp);

    /* Stats and ListPrefixes say where the blocks are */
    {
        gw_ctl_t *ctl = NULL;
        gw_ctl_error_t err = {0};
        gw_ctl_stats_t st;
        gw_ctl_prefix_info_t *infos = NULL;
        size_t n = 0;
        assert_int_equal(gw_ctl_create(g_grpc, "tok-alice", &ctl), RI_OK);
        assert_int_equal(gw_ctl_stats(ctl, 5000, &st, &err), RI_OK);
        assert_int_equal(st.prefix.blocks_memory, 2); /* 202 read back, 204 new */
        assert_int_equal(st.prefix.blocks_disk, 0);
        assert_int_equal(st.prefix.publishes_new, 1);
        assert_int_equal(gw_ctl_list_prefixes(ctl, 5000, &infos, &n, &err), RI_OK);
        assert_int_equal(n, 2);
        assert_false(infos[0].on_disk);
        cm_free(infos);
        gw_ctl_destroy(ctl);
    }

    /* a clean stop writes 202 and 204 out; then a byte of 202 flips on disk */
    assert_int_equal(kvs_spawn_stop(&g_sp, SIGTERM, 10000), 0);
    assert_true(flip_on_disk(dir, k[2].buf + k[2].len - 200, 64) > 0);
    START_OR_SKIP2(pmax, sdir, "--recover");
    OPEN_OR_SKIP("tok-alice", &d);
    key_of(key, 202);
    assert_int_equal(gw_dp_prefix_attach(d.dp, key, 1, att, &n_att), RI_OK);
    assert_int_equal(n_att, 0); /* never served */
    assert_int_equal(gw_dp_prefix_attach(d.dp, key, 1, att, &n_att), RI_OK);
    assert_int_equal(n_att, 0); /* and dropped */
    {
        gw_ctl_t *ctl = NULL;
        gw_ctl_error_t err = {0};
        gw_ctl_stats_t st;
        gw_ctl_prefix_info_t *infos = NULL;
        size_t n = 0;
        assert_int_equal(gw_ctl_create(g_grpc, "tok-alice", &ctl), RI_OK);
        assert_int_equal(gw_ctl_list_prefixes(ctl, 5000, &infos, &n, &err), RI_OK);
        assert_int_equal(n, 1); /* 204, on disk until attached */
        assert_true(infos[0].on_disk);
        cm_free(infos);
        assert_int_equal(gw_ctl_stats(ctl, 5000, &st, &err), RI_OK);
        assert_int_equal(st.prefix.corrupt, 1);
        assert_int_equal(st.prefix.attach_misses, 2);
        gw_ctl_destroy(ctl);
    }
    key_of(key, 204);
    assert_int_equal(gw_dp_prefix_attach(d.dp, key, 1, att, &n_att), RI_OK);
    assert_int_equal(n_att, 1);
    assert_int_equal(gw_dp_prefix_get(d.dp, att[0].slot, 0, got, k[4].len), RI_OK);
    assert_memory_equal(got, k[4].buf, k[4].len);
    gw_dp_close(d.dp);

    for (uint32_t i = 0; i < 6; i++)
        free(k[i].buf);
    free(got);
}

/* One session's attach of one key, run by a thread at the barrier. */
typedef struct racer {
    sess_t s;
    uint32_t key_n;
    const blk_t *want;
    pthread_barrier_t *go;
    ri_status_t st;
    uint32_t n_att;
    bool same; /* an attached block read back with the bytes published */
} racer_t;

static void *racer_main(void *arg)
{
    racer_t *r = arg;
    uint8_t key[CM_PFX_KEY_SIZE];
    cm_pfx_attached_t att[1];
    uint8_t *got = malloc(r->want->len);

    key_of(key, r->key_n);
    pthread_barrier_wait(r->go);
    r->st = gw_dp_prefix_attach(r->s.dp, key, 1, att, &r->n_att);
    r->same = r->st == RI_OK && r->n_att == 1 && got != NULL &&
              gw_dp_prefix_get(r->s.dp, att[0].slot, 0, got, r->want->len) == RI_OK &&
              memcmp(got, r->want->buf, r->want->len) == 0;
    free(got);
    return NULL;
}

/* Sessions (on their own connections, so on the daemon's lanes) attach a
 * block on disk at once: its read-back runs without the catalog lock, with
 * the block pinned.  All get the block's bytes; a DropPrefix racing the
 * read-backs leaves each attach a hit with the right bytes or a miss, and
 * the block gone afterwards. */
static void test_spill_readback_race(void **state)
{
    enum { N = 4 };
    sess_t a;
    racer_t r[N];
    pthread_t th[N];
    pthread_barrier_t go;
    blk_t k[5];
    uint8_t key[CM_PFX_KEY_SIZE];
    uint32_t slot, flags, n_att;
    cm_pfx_attached_t att[1];
    char pmax[32], sdir[96];
    uint64_t charge;
    gw_ctl_t *ctl = NULL;
    gw_ctl_error_t err = {0};
    gw_ctl_stats_t st;
    (void)state;

    for (uint32_t i = 0; i < 5; i++)
        k[i] = make_block(40 + i, 10, 12);
    charge = (k[0].len + 4095u) / 4096u * 4096u;
    snprintf(pmax, sizeof(pmax), "%llu", (unsigned long long)(2 * charge));
    snprintf(g_spill_dir, sizeof(g_spill_dir), "/tmp/ri-pfx-spill-XXXXXX");
    assert_non_null(mkdtemp(g_spill_dir));
    snprintf(sdir, sizeof(sdir), "--spill-dir=%s", g_spill_dir);
    START_OR_SKIP2(pmax, sdir, NULL);
    for (uint32_t i = 0; i < 5; i++) { /* each unreferenced once published: 301..303 go to disk */
        OPEN_OR_SKIP("tok-alice", &a);
        key_of(key, 301 + i);
        assert_int_equal(gw_dp_prefix_put(a.dp, key, k[i].buf, k[i].len, &slot, &flags), RI_OK);
        drop_session("tok-alice", &a);
    }
    assert_int_equal(gw_ctl_create(g_grpc, "tok-alice", &ctl), RI_OK);
    assert_int_equal(gw_ctl_stats(ctl, 5000, &st, &err), RI_OK);
    assert_int_equal(st.prefix.blocks_disk, 3);

    /* N sessions read 301 back at once: every one attaches it */
    for (uint32_t round = 0; round < 2; round++) {
        assert_int_equal(pthread_barrier_init(&go, NULL, N + 1), 0);
        for (uint32_t i = 0; i < N; i++) {
            r[i] = (racer_t){.key_n = 301 + round, .want = &k[round], .go = &go};
            OPEN_OR_SKIP("tok-alice", &r[i].s);
            assert_int_equal(pthread_create(&th[i], NULL, racer_main, &r[i]), 0);
        }
        pthread_barrier_wait(&go);
        if (round == 1) { /* 302: dropped while the sessions read it back */
            key_of(key, 302);
            assert_int_equal(gw_ctl_drop_prefix(ctl, 5000, key, NULL, NULL, NULL, &err), RI_OK);
        }
        for (uint32_t i = 0; i < N; i++) {
            assert_int_equal(pthread_join(th[i], NULL), 0);
            assert_int_equal(r[i].st, RI_OK);
            if (round == 0)
                assert_int_equal(r[i].n_att, 1);
            if (r[i].n_att == 1)
                assert_true(r[i].same);
        }
        pthread_barrier_destroy(&go);
        for (uint32_t i = 0; i < N; i++)
            drop_session("tok-alice", &r[i].s);
    }
    OPEN_OR_SKIP("tok-alice", &a);
    key_of(key, 302);
    assert_int_equal(gw_dp_prefix_attach(a.dp, key, 1, att, &n_att), RI_OK);
    assert_int_equal(n_att, 0); /* dropped for good */
    key_of(key, 303);
    assert_int_equal(gw_dp_prefix_attach(a.dp, key, 1, att, &n_att), RI_OK);
    assert_int_equal(n_att, 1); /* the daemon serves on */
    drop_session("tok-alice", &a);
    assert_int_equal(gw_ctl_stats(ctl, 5000, &st, &err), RI_OK);
    assert_int_equal(st.prefix.corrupt, 0);
    gw_ctl_destroy(ctl);
    for (uint32_t i = 0; i < 5; i++)
        free(k[i].buf);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_teardown(test_publish_attach_share, teardown_daemon),
        cmocka_unit_test_teardown(test_put_existing_and_tenants, teardown_daemon),
        cmocka_unit_test_teardown(test_eviction_under_cap, teardown_daemon),
        cmocka_unit_test_teardown(test_tenant_cap, teardown_daemon),
        cmocka_unit_test_teardown(test_pool_pressure, teardown_daemon),
        cmocka_unit_test_teardown(test_malformed, teardown_daemon),
        cmocka_unit_test_teardown(test_spill_recover, teardown_daemon),
        cmocka_unit_test_teardown(test_spill_readback_race, teardown_daemon),
    };
    int rc = cmocka_run_group_tests(tests, NULL, NULL);
    return rc == 0 && g_skipped ? 77 : rc;
}
