/*
 * Fixed homes for a wave index's arrays (kn_wave_place): a shared prefix's
 * centroids, value means, sizes, offsets and perm mapped at the homes'
 * head, as docs/prefix.md "Shared meta index" does.  Here the homes are
 * the test's own: the prefix's bytes in a memory file mapped copy-on-write
 * at their heads as the worker maps them, so that any write there (even of
 * the same bytes, which copies a shared page) shows in /proc/self/pagemap
 * as an anonymous page.  Checked:
 *   - a placed index builds, imports, updates and decodes bit for bit as an
 *     unplaced one, at its homes, counting none of them as its own bytes;
 *   - growing past either room copies all six arrays to the heap with
 *     their contents, and leaves the homes alone;
 *   - a failed build keeps the homes, and the next one writes no head page;
 *   - bad arguments give RI_ERR_INVALID and change nothing.
 */
#define _GNU_SOURCE /* memfd_create */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>
#include <cmocka.h>

#include "kernels/kn_ops.h"
#include "kernels/kn_synth.h"
#include "kernels/kn_wave.h"
#include "tests/kernels/kn_test_index.h"

#define WP_NKV 2u
#define WP_G   3u
#define WP_D   64u
#define WP_B   256u
#define WP_N   6500u /* the whole cache: the build sees WP_N0 tokens of it */
#define WP_N0  5400u /* indexed [4, 5336): 20 whole blocks, one update due at WP_N */
#define WP_K   20u   /* blocks imported: over a page of sizes (4-token clusters) */

typedef struct wp_kv {
    kn_shape_t shape;
    cm_fp16_t *k, *v;
    kn_kv_view_t kv; /* n tokens set per use */
} wp_kv_t;

/* One head's homes: six page-aligned ranges, the prefix's bytes at their
 * heads, the head's whole pages read-only. */
typedef struct wp_homes {
    kn_index_homes_t h;
    void *map[7];
    size_t len[7];
    uint32_t n_c, n_t; /* the prefix laid out at the heads */
} wp_homes_t;

static void wp_make(wp_kv_t *x, uint64_t seed)
{
    kn_synth_params_t sp;
    kn_synth_params_default(&sp);
    sp.n_kv_heads = WP_NKV;
    sp.n_q_heads = WP_NKV * WP_G;
    sp.head_dim = WP_D;
    sp.n_tokens = WP_N;
    sp.seed = seed;
    x->shape = (kn_shape_t){ WP_NKV * WP_G, WP_NKV, WP_D, 0 };
    x->k = malloc((size_t)WP_N * WP_NKV * WP_D * sizeof(cm_fp16_t));
    x->v = malloc((size_t)WP_N * WP_NKV * WP_D * sizeof(cm_fp16_t));
    assert_non_null(x->k);
    assert_non_null(x->v);
    assert_int_equal(kn_synth_kv(&sp, x->k, x->v, (size_t)WP_NKV * WP_D, WP_D), RI_OK);
    x->kv = (kn_kv_view_t){ x->k, x->v, WP_N0, (size_t)WP_NKV * WP_D, WP_D };
}

static kn_wave_t *wp_wave(const wp_kv_t *x)
{
    kn_wave_params_t wp;
    kn_wave_t *w;
    kn_wave_params_default(&wp);
    assert_int_equal(kn_wave_create(&x->shape, &wp, &w), RI_OK);
    return w;
}

static size_t wp_page(void)
{
    return (size_t)sysconf(_SC_PAGESIZE);
}

/* A range of room bytes with src's n bytes at its head, mapped
 * copy-on-write from a memory file as the shared meta index maps a
 * prefix's (gw_meta_share.c), the rest private anonymous pages. */
static void *wp_range(size_t room, const void *src, size_t n, size_t *len_p)
{
    size_t pg = wp_page(), len = (room + pg - 1) / pg * pg, head = (n + pg - 1) / pg * pg;
    uint8_t *p = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    assert_true(p != MAP_FAILED);
    if (n > 0) {
        int fd = memfd_create("wp-head", MFD_CLOEXEC);
        assert_true(fd >= 0);
        assert_int_equal(ftruncate(fd, (off_t)head), 0);
        assert_int_equal(pwrite(fd, src, n, 0), (ssize_t)n);
        assert_true(mmap(p, head, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_FIXED, fd, 0) == p);
        close(fd);
    }
    *len_p = len;
    return p;
}

/* Are the whole pages of the n bytes at p still the memory file's (a write,
 * even of the same bytes, makes a page an anonymous copy)?  pagemap's bit
 * 61: file page; bit 63: present. */
static void wp_expect_file_pages(const void *p, size_t n, const char *what)
{
    size_t pg = wp_page();
    FILE *f = fopen("/proc/self/pagemap", "rb");
    assert_non_null(f);
    for (size_t a = 0; a + pg <= n; a += pg) {
        uint64_t e = 0;
        assert_int_equal(fseeko(f, (off_t)(((uintptr_t)p + a) / pg * sizeof(e)), SEEK_SET), 0);
        assert_int_equal(fread(&e, sizeof(e), 1, f), 1);
        if (((e >> 63) & 1) && !((e >> 61) & 1))
            printf("%s: page %zu of the shared head written (an anonymous copy now)\n", what, a / pg);
        assert_false(((e >> 63) & 1) && !((e >> 61) & 1));
    }
    fclose(f);
}

/* Homes with room for cap_c clusters and cap_t tokens, holding the first
 * n_c clusters of ref (n_c 0: empty homes). */
static void wp_homes(wp_homes_t *m, const kn_index_t *ref, uint32_t n_c, uint32_t cap_c, uint32_t cap_t)
{
    size_t row = WP_D, u = sizeof(uint32_t); /* int8 centroid rows */
    uint32_t n_t = n_c ? ref->offsets[n_c] : 0, zero = 0;
    memset(m, 0, sizeof(*m));
    if (n_c > 0) /* a whole head page in each of the seven, or the test proves less */
        assert_true(n_c * u >= wp_page());
    m->n_c = n_c;
    m->n_t = n_t;
    m->map[0] = wp_range(cap_c * row, ref->centroids, n_c * row, &m->len[0]);
    m->map[1] = wp_range(cap_c * WP_D, ref->vq, n_c * WP_D, &m->len[1]);
    m->map[5] = wp_range(cap_c * sizeof(float), ref->vscale, n_c * sizeof(float), &m->len[5]);
    m->map[6] = wp_range(cap_c * sizeof(float), ref->cscale, n_c * sizeof(float), &m->len[6]);
    m->map[2] = wp_range(cap_c * u, ref->sizes, n_c * u, &m->len[2]);
    m->map[3] = wp_range((cap_c + 1) * u, n_c ? ref->offsets : &zero, (n_c + 1) * u, &m->len[3]);
    m->map[4] = wp_range(cap_t * u, ref->perm, n_t * u, &m->len[4]);
    m->h = (kn_index_homes_t){ .centroids = m->map[0],
                               .cscale = m->map[6],
                               .vq = m->map[1],
                               .vscale = m->map[5],
                               .sizes = m->map[2],
                               .offsets = m->map[3],
                               .perm = m->map[4],
                               .cap_clusters = cap_c,
                               .cap_tokens = cap_t };
}

static void wp_homes_free(wp_homes_t *m)
{
    for (int i = 0; i < 7; i++)
        munmap(m->map[i], m->len[i]);
}

/* The homes' heads still hold ref's first clusters, in the memory file's
 * pages: nothing wrote them. */
static void wp_expect_heads(const wp_homes_t *m, const kn_index_t *ref)
{
    size_t row = WP_D, u = sizeof(uint32_t);
    wp_expect_file_pages(m->h.centroids, m->n_c * row, "centroids");
    wp_expect_file_pages(m->h.cscale, m->n_c * sizeof(float), "cscale");
    wp_expect_file_pages(m->h.vq, m->n_c * WP_D, "vq");
    wp_expect_file_pages(m->h.vscale, m->n_c * sizeof(float), "vscale");
    wp_expect_file_pages(m->h.sizes, m->n_c * u, "sizes");
    wp_expect_file_pages(m->h.offsets, (m->n_c + 1) * u, "offsets");
    wp_expect_file_pages(m->h.perm, m->n_t * u, "perm");
    assert_memory_equal(m->h.centroids, ref->centroids, m->n_c * row);
    assert_memory_equal(m->h.cscale, ref->cscale, m->n_c * sizeof(float));
    assert_memory_equal(m->h.vq, ref->vq, m->n_c * WP_D);
    assert_memory_equal(m->h.vscale, ref->vscale, m->n_c * sizeof(float));
    assert_memory_equal(m->h.sizes, ref->sizes, m->n_c * u);
    assert_memory_equal(m->h.offsets, ref->offsets, (m->n_c + 1) * u);
    assert_memory_equal(m->h.perm, ref->perm, m->n_t * u);
}

/* Is the index at the homes (true) or on its own heap (false)? */
static bool wp_at_homes(const kn_index_t *idx, const wp_homes_t *m)
{
    bool at = idx->centroids == m->h.centroids;
    assert_true(at == (idx->cscale == m->h.cscale) && at == (idx->vq == m->h.vq) &&
                at == (idx->vscale == m->h.vscale) && at == (idx->sizes == m->h.sizes) &&
                at == (idx->offsets == m->h.offsets) && at == (idx->perm == m->h.perm));
    assert_true(at == (idx->fixed_clusters != 0));
    return at;
}

/* The pieces of the leading blocks of a built wave (its index exported). */
typedef struct wp_src {
    const kn_wave_t *w;
    int fail; /* answer RI_ERR_IO for block 1 of head 1 */
} wp_src_t;

static ri_status_t wp_get(void *ctx, uint32_t b, uint32_t h, kn_wave_piece_t *pc)
{
    const wp_src_t *s = ctx;
    const kn_index_t *idx = kn_wave_index(s->w, h);
    uint32_t sink = kn_wave_params(s->w)->sink_tokens;
    if (s->fail && b == 1 && h == 1)
        return RI_ERR_IO;
    assert_int_equal(kn_test_block_piece(idx, b * WP_B, b == 0 ? sink : b * WP_B, WP_B, pc), RI_OK);
    return RI_OK;
}

/* Clusters of the first WP_K blocks in head h of a built wave. */
static uint32_t wp_prefix_clusters(const kn_wave_t *w, uint32_t h)
{
    uint32_t j0, j1;
    assert_int_equal(kn_wave_block_clusters(kn_wave_index(w, h), 0, WP_K * WP_B, &j0, &j1), RI_OK);
    assert_int_equal(j0, 0);
    return j1;
}

/* Decode step `step` of both waves over kv: bit for bit the same. */
static void wp_expect_same_decode(kn_wave_t *a, kn_wave_t *b, const kn_kv_view_t *kv, uint32_t step)
{
    kn_synth_params_t sp;
    float q[WP_NKV * WP_G * WP_D], o0[WP_NKV * WP_G * WP_D], o1[WP_NKV * WP_G * WP_D];
    float l0[WP_NKV * WP_G], l1[WP_NKV * WP_G];
    kn_synth_params_default(&sp);
    sp.n_kv_heads = WP_NKV;
    sp.n_q_heads = WP_NKV * WP_G;
    sp.head_dim = WP_D;
    sp.n_tokens = kv->n_tokens;
    sp.seed = 77;
    assert_int_equal(kn_synth_query(&sp, step, q), RI_OK);
    assert_int_equal(kn_wave_decode(a, q, kv, o0, l0, NULL), RI_OK);
    assert_int_equal(kn_wave_decode(b, q, kv, o1, l1, NULL), RI_OK);
    assert_memory_equal(o0, o1, sizeof(o0));
    assert_memory_equal(l0, l1, sizeof(l0));
}

/* Build w over WP_N0 tokens (importing WP_K blocks when pieces is set):
 * the same index and decode as ref, built unplaced. */
static void wp_expect_build(kn_wave_t *ref, kn_wave_t *w, const wp_kv_t *x, const kn_wave_pieces_t *pieces)
{
    kn_kv_view_t kv = x->kv;
    kv.n_tokens = WP_N0;
    assert_int_equal(kn_wave_build_pieces(w, &kv, pieces), RI_OK);
    for (uint32_t h = 0; h < WP_NKV; h++)
        kn_expect_index_equal(kn_wave_index(ref, h), kn_wave_index(w, h));
    wp_expect_same_decode(ref, w, &kv, 0);
}

/* Update both to WP_N tokens (one update due): the same index and decode. */
static void wp_expect_update(kn_wave_t *ref, kn_wave_t *w, const wp_kv_t *x)
{
    kn_kv_view_t kv = x->kv;
    bool up0 = false, up1 = false;
    kv.n_tokens = WP_N;
    assert_int_equal(kn_wave_update(ref, &kv, &up0), RI_OK);
    assert_int_equal(kn_wave_update(w, &kv, &up1), RI_OK);
    assert_true(up0 && up1);
    for (uint32_t h = 0; h < WP_NKV; h++)
        kn_expect_index_equal(kn_wave_index(ref, h), kn_wave_index(w, h));
    wp_expect_same_decode(ref, w, &kv, 1);
}

/* An unplaced wave built over WP_N0 tokens, and a second one as the
 * pieces' source (never updated). */
static kn_wave_t *wp_reference(const wp_kv_t *x, kn_wave_t **built_p)
{
    kn_wave_t *ref = wp_wave(x), *built = wp_wave(x);
    kn_kv_view_t kv = x->kv;
    kv.n_tokens = WP_N0;
    assert_int_equal(kn_wave_build(ref, &kv), RI_OK);
    assert_int_equal(kn_wave_build(built, &kv), RI_OK);
    *built_p = built;
    return ref;
}

/* The three waves of a test and the homes of its n heads, freed (the
 * homes after the waves that point into them). */
static void wp_done(kn_wave_t *w, kn_wave_t *ref, kn_wave_t *built, wp_homes_t *m, uint32_t n)
{
    kn_wave_destroy(w);
    kn_wave_destroy(ref);
    kn_wave_destroy(built);
    for (uint32_t h = 0; h < n; h++)
        wp_homes_free(&m[h]);
}

/* Placed, with the prefix at the heads (read-only) and ample room: build
 * with import, update and decode as the unplaced wave, at the homes, none
 * of the arrays counted as the index's own bytes.  With empty homes (no
 * prefix), a plain build the same. */
static void test_placed_equals_unplaced(void **state)
{
    wp_kv_t x;
    wp_homes_t m[WP_NKV];
    (void)state;
    wp_make(&x, 5);

    for (int with_prefix = 1; with_prefix >= 0; with_prefix--) {
        kn_wave_t *built, *ref = wp_reference(&x, &built), *w = wp_wave(&x);
        wp_src_t src = { .w = built };
        kn_wave_pieces_t pieces = { .ctx = &src, .n_blocks = WP_K, .get = wp_get };
        for (uint32_t h = 0; h < WP_NKV; h++) {
            const kn_index_t *bi = kn_wave_index(built, h);
            uint32_t n_c = with_prefix ? wp_prefix_clusters(built, h) : 0;
            wp_homes(&m[h], bi, n_c, bi->n_clusters + 4096, bi->n_tokens + 8192);
            assert_int_equal(kn_wave_place(w, h, &m[h].h), RI_OK);
        }
        wp_expect_build(ref, w, &x, with_prefix ? &pieces : NULL);
        wp_expect_update(ref, w, &x);
        for (uint32_t h = 0; h < WP_NKV; h++) {
            const kn_index_t *idx = kn_wave_index(w, h);
            assert_true(wp_at_homes(idx, &m[h]));
            assert_int_equal(kn_index_resident_bytes(idx), 0); /* the homes are the caller's */
            assert_true(kn_index_resident_bytes(kn_wave_index(ref, h)) > 0);
            wp_expect_heads(&m[h], kn_wave_index(built, h));
        }
        wp_done(w, ref, built, m, WP_NKV);
    }
    free(x.k);
    free(x.v);
}

/* Past the room (clusters or tokens): all six arrays on the heap, contents
 * kept (the same index and decode as unplaced), the homes untouched. */
static void test_growing_past_room_keeps_contents(void **state)
{
    wp_kv_t x;
    wp_homes_t m[WP_NKV];
    (void)state;
    wp_make(&x, 6);

    for (int which = 0; which < 2; which++) {
        kn_wave_t *built, *ref = wp_reference(&x, &built), *w = wp_wave(&x);
        wp_src_t src = { .w = built };
        kn_wave_pieces_t pieces = { .ctx = &src, .n_blocks = WP_K, .get = wp_get };
        for (uint32_t h = 0; h < WP_NKV; h++) {
            const kn_index_t *bi = kn_wave_index(built, h);
            uint32_t n_c = wp_prefix_clusters(built, h);
            /* room for the build but not the update: clusters (0), tokens (1) */
            uint32_t cap_c = which == 0 ? bi->n_clusters + 1 : bi->n_clusters + 4096;
            uint32_t cap_t = which == 1 ? bi->n_tokens + 1 : bi->n_tokens + 8192;
            wp_homes(&m[h], bi, n_c, cap_c, cap_t);
            assert_int_equal(kn_wave_place(w, h, &m[h].h), RI_OK);
        }
        wp_expect_build(ref, w, &x, &pieces);
        for (uint32_t h = 0; h < WP_NKV; h++)
            assert_true(wp_at_homes(kn_wave_index(w, h), &m[h])); /* the build fits */
        wp_expect_update(ref, w, &x);
        for (uint32_t h = 0; h < WP_NKV; h++) {
            const kn_index_t *idx = kn_wave_index(w, h);
            assert_false(wp_at_homes(idx, &m[h]));
            assert_true(kn_index_resident_bytes(idx) > 0);
            wp_expect_heads(&m[h], kn_wave_index(built, h));
        }
        wp_done(w, ref, built, m, WP_NKV);
    }
    free(x.k);
    free(x.v);
}

/* A failed build keeps the homes; the next one writes no head page and
 * gives the unplaced index. */
static void test_failed_build_keeps_homes(void **state)
{
    wp_kv_t x;
    kn_wave_t *built, *ref, *w;
    wp_homes_t m[WP_NKV];
    (void)state;
    wp_make(&x, 7);
    ref = wp_reference(&x, &built);
    w = wp_wave(&x);
    for (uint32_t h = 0; h < WP_NKV; h++) {
        const kn_index_t *bi = kn_wave_index(built, h);
        wp_homes(&m[h], bi, wp_prefix_clusters(built, h), bi->n_clusters + 4096, bi->n_tokens + 8192);
        assert_int_equal(kn_wave_place(w, h, &m[h].h), RI_OK);
    }
    wp_src_t src = { .w = built, .fail = 1 };
    kn_wave_pieces_t pieces = { .ctx = &src, .n_blocks = WP_K, .get = wp_get };
    kn_kv_view_t kv = x.kv;
    kv.n_tokens = WP_N0;
    assert_int_equal(kn_wave_build_pieces(w, &kv, &pieces), RI_ERR_IO);
    for (uint32_t h = 0; h < WP_NKV; h++) {
        assert_int_equal(kn_wave_index(w, h)->n_clusters, 0);
        assert_true(wp_at_homes(kn_wave_index(w, h), &m[h]));
    }
    src.fail = 0;
    wp_expect_build(ref, w, &x, &pieces);
    wp_expect_update(ref, w, &x);
    for (uint32_t h = 0; h < WP_NKV; h++) {
        assert_true(wp_at_homes(kn_wave_index(w, h), &m[h]));
        wp_expect_heads(&m[h], kn_wave_index(built, h));
    }
    wp_done(w, ref, built, m, WP_NKV);
    free(x.k);
    free(x.v);
}

/* Bad arguments: RI_ERR_INVALID, and the index as it was. */
static void test_bad_arguments_change_nothing(void **state)
{
    wp_kv_t x;
    kn_wave_t *built, *ref, *w;
    wp_homes_t m;
    kn_index_homes_t bad[11];
    (void)state;
    wp_make(&x, 8);
    ref = wp_reference(&x, &built);
    w = wp_wave(&x);
    wp_homes(&m, kn_wave_index(built, 0), 0, 64, 256);

    for (int i = 0; i < 11; i++)
        bad[i] = m.h;
    bad[0].centroids = NULL;
    bad[1].vq = NULL;
    bad[9].vscale = NULL;
    bad[10].cscale = NULL;
    bad[2].sizes = NULL;
    bad[3].offsets = NULL;
    bad[4].perm = NULL;
    bad[5].cap_clusters = 0;
    bad[6].cap_tokens = 0;
    bad[7].cap_clusters = UINT32_MAX / 2 + 1;
    bad[8].cap_tokens = UINT32_MAX / 2 + 1;
    for (int i = 0; i < 11; i++) {
        assert_int_equal(kn_wave_place(w, 0, &bad[i]), RI_ERR_INVALID);
        assert_null(kn_wave_index(w, 0)->sizes);
        assert_int_equal(kn_wave_index(w, 0)->fixed_clusters, 0);
    }
    assert_int_equal(kn_wave_place(NULL, 0, &m.h), RI_ERR_INVALID);
    assert_int_equal(kn_wave_place(w, WP_NKV, &m.h), RI_ERR_INVALID);
    assert_int_equal(kn_wave_place(w, 0, &m.h), RI_OK);
    assert_int_equal(kn_wave_place(w, 0, &m.h), RI_ERR_INVALID); /* placed already */
    assert_true(wp_at_homes(kn_wave_index(w, 0), &m));
    assert_int_equal(kn_wave_place(w, 0, NULL), RI_OK); /* given back before a build */
    assert_null(kn_wave_index(w, 0)->offsets);
    assert_int_equal(kn_wave_place(w, 0, &m.h), RI_OK);
    /* built: no placing, no giving back; the index as it was */
    kn_kv_view_t kv = x.kv;
    kv.n_tokens = WP_N0;
    assert_int_equal(kn_wave_build(w, &kv), RI_OK);
    const kn_index_t before = *kn_wave_index(w, 0);
    assert_int_equal(kn_wave_place(w, 0, NULL), RI_ERR_INVALID);
    assert_int_equal(kn_wave_place(w, 1, &m.h), RI_ERR_INVALID);
    assert_memory_equal(&before, kn_wave_index(w, 0), sizeof(before));
    assert_int_equal(kn_wave_index(w, 1)->fixed_clusters, 0);
    kn_expect_index_equal(kn_wave_index(ref, 0), kn_wave_index(w, 0));
    wp_done(w, ref, built, &m, 1);
    free(x.k);
    free(x.v);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_placed_equals_unplaced),
        cmocka_unit_test(test_growing_past_room_keeps_contents),
        cmocka_unit_test(test_failed_build_keeps_homes),
        cmocka_unit_test(test_bad_arguments_change_nothing),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
