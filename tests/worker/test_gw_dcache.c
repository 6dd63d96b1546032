/*
 * The block cache's pages in a memory space, against the real ri-kvstore
 * (ephemeral loopback ports): a two-sided remote whose cache is small
 * enough that steps keep admitting and the kvstore keeps evicting.  After
 * every layer-step (its admissions waited for) the worker's mirror of the
 * kvstore's directory and the pages agree: every cluster the mirror calls
 * cached sits, byte for byte, in the pages it names (packed from the K/V,
 * zero-padded), and no page is named twice.  The cache lives in a test
 * space -- host memory whose copy is counted -- so the admissions are seen
 * to go through the space's copy engine.  A copy that fails leaves nothing
 * half-admitted: the object is broken with the copy's error and its mirror
 * names no cluster.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "gpuworker/client/gw_remote_int.h"
#include "wk_test_util.h"

#define NL 2      /* layers */
#define NQ 4      /* query heads */
#define NKV 2     /* KV heads */
#define D 32      /* head dim */
#define N0 2000   /* prompt tokens */

/* ---- the test space: host memory, copies counted, one may fail ---- */

static atomic_uint t_copies, t_fail_at;

static ri_status_t t_copy(void *dst, const void *src, size_t bytes)
{
    unsigned n = atomic_fetch_add(&t_copies, 1) + 1;
    if (n == atomic_load(&t_fail_at))
        return RI_ERR_DEVICE;
    memmove(dst, src, bytes);
    return RI_OK;
}

static kn_mem_t t_space;

typedef struct fx {
    wk_env_t env;
    cm_fp16_t *k[NL], *v[NL];
    kn_shape_t shape;
} fx_t;

static kn_kv_view_t fx_view(const fx_t *f, uint32_t l)
{
    return (kn_kv_view_t){.k = f->k[l], .v = f->v[l], .n_tokens = N0, .token_stride = D, .head_stride = N0 * D};
}

static int fx_setup(void **state)
{
    fx_t *f = calloc(1, sizeof(*f));
    *state = f;
    int rc = wk_env_start(&f->env, 128);
    if (rc == 77) {
        fprintf(stderr, "skipped: no ri-kvstore here\n");
        exit(77);
    }
    if (rc != 0)
        return -1;
    f->shape = (kn_shape_t){.n_q_heads = NQ, .n_kv_heads = NKV, .head_dim = D};
    for (uint32_t l = 0; l < NL; l++) {
        f->k[l] = calloc((size_t)NKV * N0 * D, sizeof(cm_fp16_t));
        f->v[l] = calloc((size_t)NKV * N0 * D, sizeof(cm_fp16_t));
        wk_synth_kv(f->k[l], f->v[l], N0, NKV, D, 0, N0, l);
    }
    t_space = *kn_mem_host();
    t_space.name = "test";
    t_space.copy = t_copy;
    return 0;
}

static int fx_teardown(void **state)
{
    fx_t *f = *state;
    for (uint32_t l = 0; l < NL; l++) {
        free(f->k[l]);
        free(f->v[l]);
    }
    wk_env_stop(&f->env);
    free(f);
    return 0;
}

/* A remote over a fresh session, cache of cache_pages pages in space,
 * kernels ops (NULL: the default), every layer built and uploaded. */
static gw_remote_t *fx_remote_in(fx_t *f, uint32_t cache_pages, const kn_mem_t *space, const kn_ops_t *ops,
                                 bool direct)
{
    gw_ctl_session_t sess;
    gw_remote_params_t p;
    gw_remote_t *r = NULL;
    gw_remote_params_default(&p);
    p.direct = direct;
    p.predict = false;
    p.cache_pages = cache_pages;
    p.min_cache_pages = 1;
    p.cache_space = space;
    p.wave.ops = ops;
    p.wave.retrieval_min_tokens = 0;
    assert_int_equal(wk_env_session(&f->env, NL, NKV, D, gw_remote_page_tokens(&p), &sess), 0);
    assert_int_equal(gw_remote_create(sess.dataplane_address, sess.session_id, sess.secret, &f->shape, NL, &p, &r),
                     RI_OK);
    for (uint32_t l = 0; l < NL; l++) {
        kn_kv_view_t kv = fx_view(f, l);
        assert_int_equal(gw_remote_build(r, l, &kv), RI_OK);
    }
    assert_int_equal(gw_remote_sync(r), RI_OK);
    return r;
}

/* A two-sided remote, its cache in the test space. */
static gw_remote_t *fx_remote(fx_t *f, uint32_t cache_pages)
{
    return fx_remote_in(f, cache_pages, &t_space, NULL, false);
}

/* Every cluster the mirror names is in its pages; no page named twice.
 * Returns the clusters checked. */
static uint32_t check_mirror(fx_t *f, gw_remote_t *r)
{
    uint8_t *want = malloc(64 * r->page_bytes), *seen = calloc(r->cache_pages ? r->cache_pages : 1, 1);
    size_t row = (size_t)r->d * sizeof(cm_fp16_t);
    uint32_t checked = 0;
    assert_non_null(want);
    assert_non_null(seen);
    assert_int_equal(gw_admit_wait(r), RI_OK);
    for (uint32_t l = 0; l < NL; l++) {
        kn_kv_view_t kv = fx_view(f, l);
        for (uint32_t h = 0; h < NKV; h++) {
            const kn_index_t *idx = gw_remote_index(r, l, h);
            const gw_head_t *H = &r->layers[l].hd[h];
            for (uint32_t j = 0; j < idx->n_clusters && j < H->rcap; j++) {
                const uint32_t *cp = gw_cpg_get(&H->cpg, j);
                if (cp == NULL)
                    continue;
                uint32_t n = idx->sizes[j], np = gw_pages(r, n);
                const uint32_t *perm = idx->perm + idx->offsets[j];
                assert_true(np <= 64);
                /* the upload's page format: K rows then V rows, zero-padded */
                memset(want, 0, (size_t)np * r->page_bytes);
                for (uint32_t i = 0; i < n; i++) {
                    uint8_t *pg = want + (size_t)(i / r->P) * r->page_bytes;
                    size_t src = (size_t)h * kv.head_stride + (size_t)perm[i] * kv.token_stride;
                    memcpy(pg + (size_t)(i % r->P) * row, kv.k + src, row);
                    memcpy(pg + (size_t)(r->P + i % r->P) * row, kv.v + src, row);
                }
                for (uint32_t p = 0; p < np; p++) {
                    uint32_t pg = cp[p];
                    assert_true(pg < r->cache_pages);
                    assert_int_equal(seen[pg], 0); /* one cluster per page */
                    seen[pg] = 1;
                    assert_memory_equal(r->cache + (size_t)pg * r->page_bytes, want + (size_t)p * r->page_bytes,
                                        r->page_bytes);
                }
                checked++;
            }
        }
    }
    free(want);
    free(seen);
    return checked;
}

static void test_mirror_matches_pages(void **state)
{
    fx_t *f = *state;
    float q[NQ * D], o[NQ * D];
    uint32_t checked = 0;
    gw_remote_stats_t st;
    atomic_store(&t_copies, 0);
    atomic_store(&t_fail_at, 0);
    gw_remote_t *r = fx_remote(f, 48);
    for (int step = 0; step < 25; step++)
        for (uint32_t l = 0; l < NL; l++) {
            kn_kv_view_t kv = fx_view(f, l);
            wk_synth_q(q, NQ, D, 31000 + (uint64_t)step * NL + l);
            assert_int_equal(gw_remote_decode(r, l, q, &kv, o, NULL), RI_OK);
            checked += check_mirror(f, r);
        }
    gw_remote_stats(r, &st);
    printf("mirror vs pages: %u cached clusters checked over %llu layer-steps; %llu admitted, %llu evicted, "
           "%u copies, cache %u pages\n",
           checked, (unsigned long long)st.steps, (unsigned long long)st.admitted, (unsigned long long)st.evicted,
           atomic_load(&t_copies), st.cache_pages);
    assert_true(st.admitted > 0);
    assert_true(st.evicted > 0);   /* the directory changed both ways */
    assert_true(checked > 0);
    assert_true(atomic_load(&t_copies) > 0); /* through the space's copy engine */
    assert_int_equal(gw_remote_error(r), RI_OK);
    gw_remote_destroy(r);
}

/* The third admission copy fails: the step that queued it still returns its
 * output, the object is broken with the copy's error from then on, and the
 * mirror names no cluster (none is left claimed by pages that did not land). */
static void test_copy_error_admits_nothing(void **state)
{
    fx_t *f = *state;
    float q[NQ * D], o[NQ * D];
    ri_status_t st = RI_OK;
    atomic_store(&t_copies, 0);
    atomic_store(&t_fail_at, 3);
    gw_remote_t *r = fx_remote(f, 48);
    for (int step = 0; step < 25 && st == RI_OK; step++)
        for (uint32_t l = 0; l < NL && st == RI_OK; l++) {
            kn_kv_view_t kv = fx_view(f, l);
            wk_synth_q(q, NQ, D, 52000 + (uint64_t)step * NL + l);
            st = gw_remote_decode(r, l, q, &kv, o, NULL);
        }
    assert_int_equal(st, RI_ERR_DEVICE);
    assert_int_equal(gw_remote_error(r), RI_ERR_DEVICE);
    for (uint32_t l = 0; l < NL; l++)
        for (uint32_t h = 0; h < NKV; h++) {
            const gw_head_t *H = &r->layers[l].hd[h];
            for (uint32_t j = 0; j < H->rcap; j++)
                assert_null(gw_cpg_get(&H->cpg, j));
        }
    kn_kv_view_t kv = fx_view(f, 0);
    assert_int_equal(gw_remote_decode(r, 0, q, &kv, o, NULL), RI_ERR_DEVICE); /* sticky */
    gw_remote_destroy(r);
}

/* A device space that the kernels do not read (cpu ops read the host's) is
 * refused: the step reads the cache's pages through them in place. */
static void test_device_space_refused(void **state)
{
    fx_t *f = *state;
    gw_ctl_session_t sess;
    gw_remote_params_t p;
    gw_remote_t *r = NULL;
    kn_mem_t dev = t_space;
    dev.device = true;
    gw_remote_params_default(&p);
    p.cache_space = &dev;
    assert_int_equal(wk_env_session(&f->env, NL, NKV, D, gw_remote_page_tokens(&p), &sess), 0);
    assert_int_equal(gw_remote_create(sess.dataplane_address, sess.session_id, sess.secret, &f->shape, NL, &p, &r),
                     RI_ERR_UNSUPPORTED);
    assert_null(r);
}

/* The copy engine of the test's device space: the host engine over the
 * test space (its copies counted). */
static ri_status_t t_dev_copier(gw_copier_t **c_p)
{
    return gw_copier_create(&t_space, c_p);
}

/* The device path of a step on the CPU: a space that says it is device
 * memory (the test space, device = true, registered as the cuda space)
 * and the cpu kernels under the name "cuda" (kn_mem_of then gives that
 * space).  Every read of the K/V view (the upload's packing), of cache
 * pages and of the receive buffer or mapped region (the gather) goes
 * through the space's copy, and the outputs are those of the host space,
 * bit for bit, two-sided and direct. */
static void test_device_space_matches_host(void **state)
{
    fx_t *f = *state;
    float q[NQ * D], o_h[NQ * D], o_d[NQ * D];
    static kn_mem_t dev;
    static kn_ops_t cuda;
    dev = t_space;
    dev.device = true;
    cuda = *kn_ops_cpu();
    cuda.name = "cuda";
    gw_copier_register_device(t_dev_copier);
    atomic_store(&t_fail_at, 0);
    for (int direct = 0; direct < 2; direct++) {
        /* the same ops on both sides (the cpu table's fused rank is not
         * taken under another name): the host remote made while no cuda
         * space is registered, so that its kernels read the host's */
        kn_mem_register_cuda(NULL);
        gw_remote_t *h = fx_remote_in(f, 48, kn_mem_host(), &cuda, direct);
        kn_mem_register_cuda(&dev);
        atomic_store(&t_copies, 0);
        gw_remote_t *d = fx_remote_in(f, 48, &dev, &cuda, direct);
        unsigned built = atomic_load(&t_copies);
        for (int step = 0; step < 25; step++)
            for (uint32_t l = 0; l < NL; l++) {
                kn_kv_view_t kv = fx_view(f, l);
                wk_synth_q(q, NQ, D, 77000 + (uint64_t)step * NL + l);
                assert_int_equal(gw_remote_decode(h, l, q, &kv, o_h, NULL), RI_OK);
                assert_int_equal(gw_remote_decode(d, l, q, &kv, o_d, NULL), RI_OK);
                assert_memory_equal(o_h, o_d, sizeof(o_h));
            }
        gw_remote_stats_t sh, sd;
        gw_remote_stats(h, &sh);
        gw_remote_stats(d, &sd);
        printf("device space (%s): %u copies at the build, %u in all; %llu/%llu retrieved tokens, "
               "%llu direct steps\n", direct ? "direct" : "two-sided", built, atomic_load(&t_copies),
               (unsigned long long)sd.retrieved_tokens, (unsigned long long)sh.retrieved_tokens,
               (unsigned long long)sd.direct_steps);
        assert_true(built >= 2u * NL * NKV); /* K and V of each head came down through the space */
        assert_true(atomic_load(&t_copies) > built);
        assert_int_equal(sd.retrieved_tokens, sh.retrieved_tokens);
        assert_int_equal(sd.direct_steps, sh.direct_steps);
        gw_remote_destroy(d);
        gw_remote_destroy(h);
    }
    gw_copier_register_device(NULL);
    kn_mem_register_cuda(NULL);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_mirror_matches_pages),
        cmocka_unit_test(test_copy_error_admits_nothing),
        cmocka_unit_test(test_device_space_refused),
        cmocka_unit_test(test_device_space_matches_host),
    };
    return cmocka_run_group_tests(tests, fx_setup, fx_teardown);
}
