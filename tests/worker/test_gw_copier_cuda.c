/* The CUDA copy engine and pinned staging ring against a real device: a
 * split put through a small ring (wrap-around, reuse after completion)
 * lands byte for byte in device memory, copies to one place land in
 * submission order, waits with a deadline complete, and the transport
 * choice sees the device space.  Exits 77 without a device (CUDA builds on
 * machines without a GPU). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <cmocka.h>

#include "common/cm_time.h"
#include "gpuworker/client/cuda/gw_cuda.h"
#include "gpuworker/client/gw_copier.h"
#include "gpuworker/client/gw_stage.h"
#include "gpuworker/client/gw_transport.h"
#include "kernels/cuda/kn_cuda.h"
#include "kernels/kn_mem.h"

static void fill(uint8_t *p, size_t n, uint32_t seed)
{
    for (size_t i = 0; i < n; i++) {
        seed = seed * 1664525u + 1013904223u;
        p[i] = (uint8_t)(seed >> 24);
    }
}

static void test_cuda_stage_put(void **state)
{
    (void)state;
    enum { BYTES = (1 << 20) + 123, SLOT = 64 << 10 };
    const kn_mem_t *mem = kn_mem_of(NULL);
    uint8_t *src = malloc(BYTES), *back = malloc(BYTES);
    void *dev = NULL;
    gw_copier_t *c;
    gw_stage_t *s;
    gw_ticket_t t = 0;
    assert_true(mem->device);
    assert_non_null(src);
    assert_non_null(back);
    fill(src, BYTES, 3);
    assert_int_equal(mem->alloc(&dev, BYTES), RI_OK);
    assert_int_equal(gw_copier_create(mem, &c), RI_OK);
    assert_string_equal(gw_copier_name(c), "cuda");
    assert_int_equal(gw_stage_create(c, mem, 4, SLOT, &s), RI_OK);
    assert_true(gw_stage_pinned(s));
    assert_int_equal(gw_stage_put(s, dev, src, BYTES, cm_time_ns() + 10000000000u, &t), RI_OK);
    assert_int_equal(t, (gw_ticket_t)(BYTES + SLOT - 1) / SLOT);
    assert_int_equal(gw_copier_wait(c, t, cm_time_ns() + 10000000000u), RI_OK);
    assert_true(gw_copier_done(c, t));
    assert_int_equal(mem->copy(back, dev, BYTES), RI_OK);
    assert_memory_equal(back, src, BYTES);
    /* two copies to one place: the later one wins */
    uint8_t a[4096], b[4096];
    fill(a, sizeof(a), 7);
    fill(b, sizeof(b), 8);
    gw_ticket_t ta, tb;
    assert_int_equal(gw_stage_put(s, dev, a, sizeof(a), GW_NO_DEADLINE, &ta), RI_OK);
    assert_int_equal(gw_stage_put(s, dev, b, sizeof(b), GW_NO_DEADLINE, &tb), RI_OK);
    assert_int_equal(gw_copier_drain(c), RI_OK);
    assert_int_equal(mem->copy(back, dev, sizeof(b)), RI_OK);
    assert_memory_equal(back, b, sizeof(b));
    gw_stage_destroy(s);
    gw_copier_destroy(c);
    mem->free(dev);
    free(src);
    free(back);
}

static void test_cuda_transport(void **state)
{
    (void)state;
    gw_transport_caps_t caps;
    gw_transport_probe(&caps);
    assert_true(caps.device_space);
    printf("transport on this machine: %s (UCX CUDA memory: %s)\n", gw_transport_current(),
           caps.ucx_cuda ? "yes" : "no");
    assert_int_not_equal(gw_transport_choose(&caps), GW_TRANSPORT_HOST);
}

int main(void)
{
    if (kn_cuda_init() != RI_OK || gw_cuda_init() != RI_OK) {
        fprintf(stderr, "skipped: no CUDA device\n");
        return 77;
    }
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_cuda_stage_put),
        cmocka_unit_test(test_cuda_transport),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
