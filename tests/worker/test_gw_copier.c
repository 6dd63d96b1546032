/* The block cache's host-side pieces on the CPU: the host copy engine
 * (tickets, ordering, waiting with a deadline, sticky errors), the staging
 * ring (reuse only after its copy completed, wrap-around, splitting, the
 * acquire deadline, a failed copy, out-of-memory) and the transport's
 * fallback order.  The copies run over test memory spaces (kn_mem_t) whose
 * copy is slowed, gated, recorded or failed at the function boundary; the
 * copier's own thread still does every copy. */
#define _GNU_SOURCE
#include <pthread.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <cmocka.h>

#include "common/cm_alloc.h"
#include "common/cm_status.h"
#include "common/cm_time.h"
#include "gpuworker/client/gw_copier.h"
#include "gpuworker/client/gw_stage.h"
#include "gpuworker/client/gw_transport.h"

/* ---- test spaces: host memory whose copy is observed ---- */

static atomic_uint t_copies;          /* copies made so far */
static atomic_uint t_fail_at;         /* the n-th copy (1-based) fails; 0 none */
static atomic_uint t_sleep_us;        /* each copy sleeps first */
static atomic_bool t_gate_closed;     /* copies wait while it is set */
static uint8_t *t_order[256];         /* dst of each copy, in the order made */

static ri_status_t t_copy(void *dst, const void *src, size_t bytes)
{
    unsigned n = atomic_fetch_add(&t_copies, 1) + 1;
    while (atomic_load(&t_gate_closed))
        cm_time_sleep_ns(100000);
    if (atomic_load(&t_sleep_us) > 0)
        cm_time_sleep_ns((uint64_t)atomic_load(&t_sleep_us) * 1000u);
    if (n == atomic_load(&t_fail_at))
        return RI_ERR_DEVICE;
    if (n <= 256)
        t_order[n - 1] = dst;
    memmove(dst, src, bytes);
    return RI_OK;
}

static kn_mem_t t_space;

static int t_reset(void **state)
{
    (void)state;
    t_space = *kn_mem_host();
    t_space.name = "test";
    t_space.copy = t_copy;
    atomic_store(&t_copies, 0);
    atomic_store(&t_fail_at, 0);
    atomic_store(&t_sleep_us, 0);
    atomic_store(&t_gate_closed, false);
    memset(t_order, 0, sizeof(t_order));
    return 0;
}

static void fill(uint8_t *p, size_t n, uint32_t seed)
{
    for (size_t i = 0; i < n; i++) {
        seed = seed * 1664525u + 1013904223u;
        p[i] = (uint8_t)(seed >> 24);
    }
}

/* ---- copier ---- */

/* Copies land in submission order; a ticket done means all before it are. */
static void test_copier_order(void **state)
{
    (void)state;
    enum { N = 40 };
    uint8_t src[N][64], dst[N][64];
    gw_ticket_t t[N];
    gw_copier_t *c;
    atomic_store(&t_sleep_us, 200);
    atomic_store(&t_gate_closed, true); /* nothing lands until the test says so */
    assert_int_equal(gw_copier_host_create(&t_space, &c), RI_OK);
    assert_string_equal(gw_copier_name(c), "host");
    for (int i = 0; i < N; i++) {
        fill(src[i], 64, (uint32_t)i + 1);
        memset(dst[i], 0, 64);
        assert_int_equal(gw_copier_submit(c, dst[i], src[i], 64, &t[i]), RI_OK);
        assert_int_equal(t[i], (gw_ticket_t)i + 1);
    }
    /* asynchronous: submit returned while the copies are held up */
    assert_false(gw_copier_done(c, t[0]));
    assert_false(gw_copier_done(c, t[N - 1]));
    atomic_store(&t_gate_closed, false);
    assert_int_equal(gw_copier_wait(c, t[N / 2], GW_NO_DEADLINE), RI_OK);
    for (int i = 0; i <= N / 2; i++) {
        assert_true(gw_copier_done(c, t[i]));
        assert_memory_equal(dst[i], src[i], 64);
    }
    assert_int_equal(gw_copier_drain(c), RI_OK);
    for (int i = 0; i < N; i++) {
        assert_ptr_equal(t_order[i], dst[i]);
        assert_memory_equal(dst[i], src[i], 64);
    }
    /* bytes 0 copies nothing and needs no wait; an unissued ticket is refused */
    gw_ticket_t z = 99;
    assert_int_equal(gw_copier_submit(c, dst[0], src[0], 0, &z), RI_OK);
    assert_int_equal(z, GW_TICKET_NONE);
    assert_int_equal(gw_copier_wait(c, GW_TICKET_NONE, 0), RI_OK);
    assert_int_equal(gw_copier_wait(c, gw_copier_last(c) + 1, GW_NO_DEADLINE), RI_ERR_INVALID);
    gw_copier_destroy(c);
    gw_copier_destroy(NULL);
}

/* A wait with a deadline returns RI_ERR_TIMEOUT while the copy is held up,
 * and the same ticket completes later. */
static void test_copier_deadline(void **state)
{
    (void)state;
    uint8_t src[32], dst[32] = {0};
    gw_ticket_t t;
    gw_copier_t *c;
    fill(src, sizeof(src), 7);
    atomic_store(&t_gate_closed, true);
    assert_int_equal(gw_copier_host_create(&t_space, &c), RI_OK);
    assert_int_equal(gw_copier_submit(c, dst, src, sizeof(src), &t), RI_OK);
    uint64_t t0 = cm_time_ns();
    assert_int_equal(gw_copier_wait(c, t, t0 + 20000000u), RI_ERR_TIMEOUT);
    assert_true(cm_time_ns() - t0 >= 20000000u);
    assert_false(gw_copier_done(c, t));
    atomic_store(&t_gate_closed, false);
    assert_int_equal(gw_copier_wait(c, t, cm_time_ns() + 5000000000u), RI_OK);
    assert_memory_equal(dst, src, sizeof(src));
    gw_copier_destroy(c);
}

/* The first failed copy is sticky: later copies are not made, waits on
 * tickets from it on report it, earlier ones succeed, submit refuses. */
static void test_copier_error_sticky(void **state)
{
    (void)state;
    uint8_t src[4][16], dst[4][16];
    gw_ticket_t t[4];
    gw_copier_t *c;
    atomic_store(&t_fail_at, 3);
    assert_int_equal(gw_copier_host_create(&t_space, &c), RI_OK);
    for (int i = 0; i < 4; i++) {
        fill(src[i], 16, (uint32_t)i + 11);
        memset(dst[i], 0xEE, 16);
        assert_int_equal(gw_copier_submit(c, dst[i], src[i], 16, &t[i]), RI_OK);
    }
    assert_int_equal(gw_copier_wait(c, t[1], GW_NO_DEADLINE), RI_OK);
    assert_int_equal(gw_copier_wait(c, t[2], GW_NO_DEADLINE), RI_ERR_DEVICE);
    assert_int_equal(gw_copier_wait(c, t[3], GW_NO_DEADLINE), RI_ERR_DEVICE);
    assert_int_equal(gw_copier_error(c), RI_ERR_DEVICE);
    assert_int_equal(gw_copier_drain(c), RI_ERR_DEVICE);
    assert_memory_equal(dst[0], src[0], 16);
    assert_memory_equal(dst[1], src[1], 16);
    for (int i = 2; i < 4; i++)
        for (int b = 0; b < 16; b++)
            assert_int_equal(dst[i][b], 0xEE); /* neither the failed nor the later copy landed */
    gw_ticket_t t5 = 0;
    assert_int_equal(gw_copier_submit(c, dst[0], src[1], 16, &t5), RI_ERR_DEVICE);
    assert_int_equal(t5, 0);
    assert_int_equal(gw_copier_last(c), t[3]);
    gw_copier_destroy(c);
}

/* Out of memory at any allocation of create: a clean error, nothing kept. */
static void test_copier_stage_nomem(void **state)
{
    (void)state;
    size_t before = cm_alloc_total_bytes();
    for (uint64_t n = 1; n < 16; n++) {
        gw_copier_t *c = NULL;
        gw_stage_t *s = NULL;
        cm_alloc_fail_after(n);
        ri_status_t st = gw_copier_host_create(&t_space, &c);
        if (st == RI_OK)
            st = gw_stage_create(c, &t_space, 4, 4096, &s);
        bool fired = cm_alloc_fail_pending() == 0;
        cm_alloc_fail_after(0);
        if (fired) {
            assert_int_equal(st, RI_ERR_NOMEM);
            assert_null(s);
        } else {
            assert_int_equal(st, RI_OK);
        }
        gw_stage_destroy(s);
        gw_copier_destroy(c);
        assert_int_equal(cm_alloc_total_bytes(), before);
        if (!fired)
            break;
    }
}

/* A device space without a registered device copier is refused. */
static void test_copier_no_device(void **state)
{
    (void)state;
    kn_mem_t dev = *kn_mem_host();
    gw_copier_t *c = NULL;
    dev.name = "fake-device";
    dev.device = true;
    assert_int_equal(gw_copier_create(&dev, &c), RI_ERR_UNSUPPORTED);
    assert_null(c);
    assert_int_equal(gw_copier_create(kn_mem_host(), &c), RI_OK);
    assert_string_equal(gw_copier_name(c), "host");
    gw_copier_destroy(c);
}

/* ---- staging ring ---- */

/* A slot is handed out again only after its copy completed: with the copy
 * held up the acquire times out, and the bytes copied are the slot's
 * contents at submission, not what the next fill wrote. */
static void test_stage_reuse_after_completion(void **state)
{
    (void)state;
    uint8_t src[2][256], dst[2][256] = {{0}};
    gw_copier_t *c;
    gw_stage_t *s;
    uint32_t slot;
    uint8_t *buf;
    gw_ticket_t t[2];
    assert_int_equal(gw_copier_host_create(&t_space, &c), RI_OK);
    assert_int_equal(gw_stage_create(c, &t_space, 2, 256, &s), RI_OK);
    assert_false(gw_stage_pinned(s)); /* no pinned allocator registered */
    atomic_store(&t_gate_closed, true);
    for (int i = 0; i < 2; i++) {
        fill(src[i], 256, (uint32_t)i + 21);
        assert_int_equal(gw_stage_acquire(s, GW_NO_DEADLINE, &slot, &buf), RI_OK);
        assert_int_equal(slot, (uint32_t)i);
        memcpy(buf, src[i], 256);
        assert_int_equal(gw_stage_submit(s, slot, dst[i], 256, &t[i]), RI_OK);
    }
    /* both slots in flight: the third acquire (slot 0 again) must wait */
    assert_int_equal(gw_stage_acquire(s, cm_time_ns() + 20000000u, &slot, &buf), RI_ERR_TIMEOUT);
    atomic_store(&t_gate_closed, false);
    assert_int_equal(gw_stage_acquire(s, GW_NO_DEADLINE, &slot, &buf), RI_OK);
    assert_int_equal(slot, 0u);
    assert_true(gw_copier_done(c, t[0]));
    assert_true(gw_stage_waits(s) >= 1);
    memset(buf, 0x55, 256); /* refill: must not reach dst[0] */
    gw_stage_release(s, slot);
    assert_int_equal(gw_copier_wait(c, t[1], GW_NO_DEADLINE), RI_OK);
    assert_memory_equal(dst[0], src[0], 256);
    assert_memory_equal(dst[1], src[1], 256);
    gw_stage_destroy(s);
    gw_copier_destroy(c);
}

/* Many puts through a small ring: the slots wrap around many times, each
 * piece lands where it belongs, in order. */
static void test_stage_wrap_and_split(void **state)
{
    (void)state;
    enum { SLOT = 1000, BYTES = 37 * 1024 + 5 };
    uint8_t *src = malloc(BYTES), *dst = calloc(1, BYTES);
    gw_copier_t *c;
    gw_stage_t *s;
    gw_ticket_t t = 0;
    assert_non_null(src);
    assert_non_null(dst);
    fill(src, BYTES, 99);
    atomic_store(&t_sleep_us, 50); /* copies lag the fills: acquires wait */
    assert_int_equal(gw_copier_host_create(&t_space, &c), RI_OK);
    assert_int_equal(gw_stage_create(c, &t_space, 3, SLOT, &s), RI_OK);
    assert_int_equal(gw_stage_slots(s), 3u);
    assert_int_equal(gw_stage_slot_bytes(s), (size_t)SLOT);
    /* one cluster larger than a slot: split into ceil(BYTES / SLOT) pieces */
    assert_int_equal(gw_stage_put(s, dst, src, BYTES, GW_NO_DEADLINE, &t), RI_OK);
    assert_int_equal(t, (gw_ticket_t)(BYTES + SLOT - 1) / SLOT);
    assert_int_equal(gw_copier_wait(c, t, GW_NO_DEADLINE), RI_OK);
    assert_memory_equal(dst, src, BYTES);
    /* pieces of several puts, each smaller than a slot, keep wrapping */
    memset(dst, 0, BYTES);
    for (size_t off = 0; off < BYTES; off += 333)
        assert_int_equal(gw_stage_put(s, dst + off, src + off, CM_MIN((size_t)333, BYTES - off), GW_NO_DEADLINE, &t),
                         RI_OK);
    assert_int_equal(gw_copier_drain(c), RI_OK);
    assert_memory_equal(dst, src, BYTES);
    gw_stage_destroy(s);
    gw_copier_destroy(c);
    free(src);
    free(dst);
}

/* Refusals: a held slot is not handed out twice, a piece larger than a
 * slot or a slot not held is refused, an empty put queues nothing. */
static void test_stage_refusals(void **state)
{
    (void)state;
    uint8_t dst[64];
    gw_copier_t *c;
    gw_stage_t *s;
    uint32_t slot, slot2;
    uint8_t *buf;
    gw_ticket_t t = 7;
    assert_int_equal(gw_copier_host_create(&t_space, &c), RI_OK);
    assert_int_equal(gw_stage_create(c, &t_space, 0, 64, &s), RI_ERR_INVALID);
    assert_int_equal(gw_stage_create(c, &t_space, 1, 0, &s), RI_ERR_INVALID);
    assert_int_equal(gw_stage_create(c, &t_space, 1, 64, &s), RI_OK);
    assert_int_equal(gw_stage_acquire(s, GW_NO_DEADLINE, &slot, &buf), RI_OK);
    assert_int_equal(gw_stage_acquire(s, GW_NO_DEADLINE, &slot2, &buf), RI_ERR_BUSY);
    assert_int_equal(gw_stage_submit(s, slot, dst, 65, &t), RI_ERR_INVALID);
    assert_int_equal(gw_stage_submit(s, slot + 1, dst, 8, &t), RI_ERR_INVALID);
    gw_stage_release(s, slot);
    assert_int_equal(gw_stage_submit(s, slot, dst, 8, &t), RI_ERR_INVALID); /* released: not held */
    assert_int_equal(gw_stage_put(s, dst, dst, 0, GW_NO_DEADLINE, &t), RI_OK);
    assert_int_equal(t, GW_TICKET_NONE);
    assert_int_equal(gw_copier_last(c), GW_TICKET_NONE);
    gw_stage_destroy(s);
    gw_copier_destroy(c);
}

/* A copy that fails in the middle of a split cluster: the error is
 * reported (by the put, or by the wait on its last ticket), the copier is
 * broken, the pieces after the failed one never land, and the ring refuses
 * further work. */
static void test_stage_copy_error(void **state)
{
    (void)state;
    enum { SLOT = 128, BYTES = 5 * SLOT };
    uint8_t src[BYTES], dst[BYTES];
    gw_copier_t *c;
    gw_stage_t *s;
    gw_ticket_t t = 0;
    uint32_t slot;
    uint8_t *buf;
    fill(src, BYTES, 5);
    memset(dst, 0xAB, BYTES);
    atomic_store(&t_fail_at, 2);
    assert_int_equal(gw_copier_host_create(&t_space, &c), RI_OK);
    assert_int_equal(gw_stage_create(c, &t_space, 8, SLOT, &s), RI_OK);
    ri_status_t st = gw_stage_put(s, dst, src, BYTES, GW_NO_DEADLINE, &t);
    if (st == RI_OK)
        st = gw_copier_wait(c, t, GW_NO_DEADLINE);
    assert_int_equal(st, RI_ERR_DEVICE);
    assert_int_equal(gw_copier_error(c), RI_ERR_DEVICE);
    assert_memory_equal(dst, src, SLOT); /* the first piece landed */
    for (size_t i = SLOT; i < BYTES; i++)
        assert_int_equal(dst[i], 0xAB);  /* nothing from the failed piece on */
    assert_int_equal(gw_stage_acquire(s, GW_NO_DEADLINE, &slot, &buf), RI_ERR_DEVICE);
    gw_stage_destroy(s);
    gw_copier_destroy(c);
}

/* ---- transport ---- */

static void test_transport_fallbacks(void **state)
{
    (void)state;
    gw_transport_caps_t caps = {.device_space = true, .ucx_cuda = true};
    assert_int_equal(gw_transport_choose(&caps), GW_TRANSPORT_UCX_CUDA);
    caps.ucx_cuda = false;
    assert_int_equal(gw_transport_choose(&caps), GW_TRANSPORT_PINNED_STAGING);
    caps.device_space = false;
    assert_int_equal(gw_transport_choose(&caps), GW_TRANSPORT_HOST);
    caps.ucx_cuda = true; /* UCX could receive into device memory, but there are no device pages */
    assert_int_equal(gw_transport_choose(&caps), GW_TRANSPORT_HOST);
    assert_int_equal(gw_transport_choose(NULL), GW_TRANSPORT_HOST);
    assert_string_equal(gw_transport_name(GW_TRANSPORT_UCX_CUDA), "ucx-cuda");
    assert_string_equal(gw_transport_name(GW_TRANSPORT_PINNED_STAGING), "pinned-staging");
    assert_string_equal(gw_transport_name(GW_TRANSPORT_HOST), "host");
    /* this process: Debian's UCX and no CUDA space registered -> host */
    gw_transport_probe(&caps);
    assert_false(caps.device_space);
    assert_int_equal(gw_transport_choose(&caps), GW_TRANSPORT_HOST);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup(test_copier_order, t_reset),
        cmocka_unit_test_setup(test_copier_deadline, t_reset),
        cmocka_unit_test_setup(test_copier_error_sticky, t_reset),
        cmocka_unit_test_setup(test_copier_stage_nomem, t_reset),
        cmocka_unit_test_setup(test_copier_no_device, t_reset),
        cmocka_unit_test_setup(test_stage_reuse_after_completion, t_reset),
        cmocka_unit_test_setup(test_stage_wrap_and_split, t_reset),
        cmocka_unit_test_setup(test_stage_refusals, t_reset),
        cmocka_unit_test_setup(test_stage_copy_error, t_reset),
        cmocka_unit_test_setup(test_transport_fallbacks, t_reset),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
