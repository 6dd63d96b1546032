/*
 * Injected faults through the spill tier's system-call table: EIO (transient
 * and persistent), ENOSPC on writes and on segment preallocation, short
 * writes and reads, lost io_uring completions, io_uring refused at setup,
 * manifest write failures, open failures and out-of-memory.  Each must end in
 * a retry that succeeds or a clear per-entry error: no crash, no hang, no
 * wrong data.  argv[1]: uring|pread (data-path faults are injected at the
 * io_uring completion on the first, at pread/pwrite on the second).
 */
#define _GNU_SOURCE
#include <errno.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <cmocka.h>

#include "common/cm_alloc.h"
#include "common/cm_time.h"
#include "kvstore/spill/kvs_spill.h"
#include "spill_test_util.h"

static bool g_uring = true;
static bool g_mutant_swallow = false;   /* argv[2] = mutant-swallow-nomem */

/* The mutation: a write batch that reports success for the entries that ran
 * out of memory, as a store that ignored a failed index insert would. */
static void swallow_nomem(ri_status_t *ret, ri_status_t *st, uint32_t n)
{
    for (uint32_t i = 0; i < n; i++)
        if (st[i] == RI_ERR_NOMEM)
            st[i] = RI_OK;
    if (*ret == RI_ERR_NOMEM)
        *ret = RI_OK;
}

typedef struct fixture {
    char *dir;
    kvs_spill_config_t cfg;
    kvs_spill_t *sp;
} fixture_t;

static int setup(void **state)
{
    fixture_t *f = calloc(1, sizeof(*f));
    f->dir = st_tmpdir();
    st_config(&f->cfg, f->dir, g_uring);
    f->cfg.ops = st_fault_ops();
    f->cfg.io_timeout_ms = 300;
    f->cfg.io_contexts = 1;
    st_fault_off();
    f->sp = st_create_or_skip(&f->cfg);
    kvs_spill_stats_t s;
    kvs_spill_stats(f->sp, &s);
    if (g_uring && !s.uring) {
        fprintf(stderr, "skip: io_uring unavailable here\n");
        exit(77);
    }
    *state = f;
    return 0;
}

static int teardown(void **state)
{
    fixture_t *f = *state;
    st_fault_off();
    kvs_spill_destroy(f->sp);
    st_rmtree(f->dir);
    free(f->dir);
    free(f);
    return 0;
}

static kvs_spill_key_t key(uint32_t c) { return (kvs_spill_key_t){.session = 9, .layer = 0, .head = 0, .cluster = c}; }

/* The data-path fault point of this mode. */
static st_fault_op_t data_op(bool write)
{
    if (g_uring)
        return ST_F_CQE;
    return write ? ST_F_PWRITE : ST_F_PREAD;
}

/* Write clusters [from, from+n) with salt; statuses into st_p (may be NULL). */
static ri_status_t put(kvs_spill_t *sp, uint32_t from, uint32_t n, uint32_t salt, ri_status_t *st_p)
{
    kvs_spill_wreq_t w[64];
    static uint8_t buf[64][8192];
    assert_true(n <= 64);
    for (uint32_t i = 0; i < n; i++) {
        kvs_spill_key_t k = key(from + i);
        st_fill(buf[i], 8192, &k, salt);
        w[i] = (kvs_spill_wreq_t){.key = k, .dtype = 1, .tokens = 16, .payload = buf[i], .payload_bytes = 8192};
    }
    ri_status_t st = kvs_spill_write(sp, w, n);
    for (uint32_t i = 0; st_p && i < n; i++)
        st_p[i] = w[i].status;
    return st;
}

/* Read clusters [from, from+n); statuses into st_p; every RI_OK entry is
 * checked bit-exact against salt. */
static ri_status_t get(kvs_spill_t *sp, uint32_t from, uint32_t n, uint32_t salt, ri_status_t *st_p)
{
    kvs_spill_rreq_t r[64];
    static uint8_t buf[64][8192];
    assert_true(n <= 64);
    for (uint32_t i = 0; i < n; i++)
        r[i] = (kvs_spill_rreq_t){.key = key(from + i), .buf = buf[i], .buf_bytes = 8192};
    ri_status_t st = kvs_spill_read(sp, r, n);
    for (uint32_t i = 0; i < n; i++) {
        if (r[i].status == RI_OK)
            assert_true(st_check(buf[i], 8192, &r[i].key, salt));
        if (st_p)
            st_p[i] = r[i].status;
    }
    return st;
}

static void test_transient_eio_is_retried(void **state)
{
    fixture_t *f = *state;
    st_fault_arm(data_op(true), ST_K_ERR, EIO, 3, 2);
    assert_int_equal(put(f->sp, 0, 16, 1, NULL), RI_OK);
    assert_int_equal(st_fault()->hits, 2);
    st_fault_arm(data_op(false), ST_K_ERR, EIO, 5, 1);
    assert_int_equal(get(f->sp, 0, 16, 1, NULL), RI_OK);
    assert_int_equal(st_fault()->hits, 1);
    kvs_spill_stats_t s;
    kvs_spill_stats(f->sp, &s);
    assert_int_equal(s.io_retries, 3);
    assert_int_equal(s.io_errors, 0);
}

static void test_persistent_eio(void **state)
{
    fixture_t *f = *state;
    assert_int_equal(put(f->sp, 0, 4, 1, NULL), RI_OK);
    /* Rewriting cluster 0..3 fails for good: the old versions stay. */
    ri_status_t st[4];
    st_fault_arm(data_op(true), ST_K_ERR, EIO, 0, -1);
    assert_int_equal(put(f->sp, 0, 4, 2, st), RI_ERR_IO);
    for (int i = 0; i < 4; i++)
        assert_int_equal(st[i], RI_ERR_IO);
    st_fault_off();
    assert_int_equal(get(f->sp, 0, 4, 1, NULL), RI_OK);
    /* Reads that keep failing: RI_ERR_IO, nothing served, record kept. */
    st_fault_arm(data_op(false), ST_K_ERR, EIO, 0, -1);
    assert_int_equal(get(f->sp, 0, 4, 1, st), RI_ERR_IO);
    for (int i = 0; i < 4; i++)
        assert_int_equal(st[i], RI_ERR_IO);
    st_fault_off();
    assert_int_equal(get(f->sp, 0, 4, 1, NULL), RI_OK);
    kvs_spill_stats_t s;
    kvs_spill_stats(f->sp, &s);
    assert_int_equal(s.io_errors, 8);
    assert_int_equal(s.lost_records, 0);
}

static void test_enospc(void **state)
{
    fixture_t *f = *state;
    ri_status_t st[8];
    st_fault_arm(data_op(true), ST_K_ERR, ENOSPC, 2, 1);
    assert_int_equal(put(f->sp, 0, 8, 1, st), RI_ERR_NOSPACE);
    int nospace = 0;
    for (int i = 0; i < 8; i++)
        nospace += st[i] == RI_ERR_NOSPACE;
    assert_int_equal(nospace, 1);   /* not retried, only that entry */
    st_fault_off();
    ri_status_t rs[8];
    get(f->sp, 0, 8, 1, rs);
    for (int i = 0; i < 8; i++)
        assert_int_equal(rs[i], st[i] == RI_OK ? RI_OK : RI_ERR_NOT_FOUND);

    /* A full disk when a new segment is preallocated (4 MiB segments hold
     * 341 records): the entries past the boundary get RI_ERR_NOSPACE. */
    for (uint32_t b = 0; b < 320; b += 64)
        assert_int_equal(put(f->sp, 100 + b, 64, 1, NULL), RI_OK);
    st_fault_arm(ST_F_FALLOCATE, ST_K_ERR, ENOSPC, 0, -1);
    ri_status_t w[64];
    assert_int_equal(put(f->sp, 500, 64, 1, w), RI_ERR_NOSPACE);
    int ok = 0;
    for (int i = 0; i < 64; i++) {
        assert_true(w[i] == RI_OK || w[i] == RI_ERR_NOSPACE);
        ok += w[i] == RI_OK;
    }
    assert_true(ok > 0 && ok < 64);
    st_fault_off();
    assert_int_equal(put(f->sp, 500, 64, 3, NULL), RI_OK);
    assert_int_equal(get(f->sp, 500, 64, 3, NULL), RI_OK);
}

static void test_short_transfers(void **state)
{
    fixture_t *f = *state;
    st_fault_arm(data_op(true), ST_K_SHORT, 0, 1, 1);
    assert_int_equal(put(f->sp, 0, 8, 1, NULL), RI_OK);
    assert_int_equal(st_fault()->hits, 1);
    st_fault_arm(data_op(false), ST_K_SHORT, 0, 1, 1);
    assert_int_equal(get(f->sp, 0, 8, 1, NULL), RI_OK);
    assert_int_equal(st_fault()->hits, 1);

    ri_status_t st[8];
    st_fault_arm(data_op(true), ST_K_SHORT, 0, 0, -1);
    assert_int_equal(put(f->sp, 100, 2, 1, st), RI_ERR_IO);
    st_fault_arm(data_op(false), ST_K_SHORT, 0, 0, -1);
    assert_int_equal(get(f->sp, 0, 8, 1, st), RI_ERR_EOF);
    for (int i = 0; i < 8; i++)
        assert_int_equal(st[i], RI_ERR_EOF);
    st_fault_off();
    assert_int_equal(get(f->sp, 0, 8, 1, NULL), RI_OK);   /* not marked lost */
    assert_int_equal(get(f->sp, 100, 2, 1, st), RI_ERR_NOT_FOUND);
}

static void test_lost_completion(void **state)
{
    fixture_t *f = *state;
    assert_int_equal(put(f->sp, 0, 32, 1, NULL), RI_OK);
    ri_status_t st[32];
    st_fault_arm(ST_F_CQE, ST_K_LOST, 0, 5, 1);
    uint64_t t0 = cm_time_ns();
    assert_int_equal(get(f->sp, 0, 32, 1, st), RI_ERR_TIMEOUT);
    double secs = (double)(cm_time_ns() - t0) * 1e-9;
    assert_true(secs < 3 * 0.3 + 1.0);   /* bounded: timeout, cancel, timeout */
    int timeouts = 0;
    for (int i = 0; i < 32; i++) {
        assert_true(st[i] == RI_OK || st[i] == RI_ERR_TIMEOUT);
        timeouts += st[i] == RI_ERR_TIMEOUT;
    }
    assert_int_equal(timeouts, 1);
    kvs_spill_stats_t s;
    kvs_spill_stats(f->sp, &s);
    assert_int_equal(s.io_timeouts, 1);
    assert_false(s.uring);   /* the context fell back to pread/pwrite */
    st_fault_off();
    /* The store keeps working, and serves right data. */
    assert_int_equal(get(f->sp, 0, 32, 1, NULL), RI_OK);
    assert_int_equal(put(f->sp, 40, 16, 2, NULL), RI_OK);
    assert_int_equal(get(f->sp, 40, 16, 2, NULL), RI_OK);

    /* A lost write completion: that entry fails, the rest are stored. */
    kvs_spill_destroy(f->sp);
    f->sp = st_create_or_skip(&f->cfg);
    st_fault_arm(ST_F_CQE, ST_K_LOST, 0, 2, 1);
    assert_int_equal(put(f->sp, 0, 8, 3, st), RI_ERR_TIMEOUT);
    st_fault_off();
    ri_status_t rs[8];
    get(f->sp, 0, 8, 3, rs);
    for (int i = 0; i < 8; i++)
        assert_int_equal(rs[i], st[i] == RI_OK ? RI_OK : RI_ERR_NOT_FOUND);
}

static void test_uring_refused(void **state)
{
    fixture_t *f = *state;
    kvs_spill_destroy(f->sp);
    st_fault_arm(ST_F_URING_INIT, ST_K_ERR, EPERM, 0, -1);   /* seccomp says no */
    kvs_spill_config_t c = f->cfg;
    c.use_uring = true;
    assert_int_equal(kvs_spill_create(&c, &f->sp), RI_OK);
    st_fault_off();
    kvs_spill_stats_t s;
    kvs_spill_stats(f->sp, &s);
    assert_false(s.uring);
    assert_int_equal(put(f->sp, 0, 32, 1, NULL), RI_OK);
    assert_int_equal(get(f->sp, 0, 32, 1, NULL), RI_OK);
}

static void test_manifest_failures(void **state)
{
    fixture_t *f = *state;
    assert_int_equal(put(f->sp, 0, 10, 1, NULL), RI_OK);
    st_fault_arm(ST_F_FSYNC, ST_K_ERR, EIO, 0, 1);
    assert_int_equal(kvs_spill_sync(f->sp), RI_ERR_IO);
    st_fault_arm(ST_F_RENAME, ST_K_ERR, EACCES, 0, 1);
    assert_int_not_equal(kvs_spill_sync(f->sp), RI_OK);
    st_fault_arm(ST_F_OPEN, ST_K_ERR, EMFILE, 0, 1);
    assert_int_not_equal(kvs_spill_sync(f->sp), RI_OK);
    st_fault_off();
    assert_int_equal(get(f->sp, 0, 10, 1, NULL), RI_OK);
    assert_int_equal(put(f->sp, 10, 10, 1, NULL), RI_OK);
    assert_int_equal(kvs_spill_sync(f->sp), RI_OK);
    kvs_spill_destroy(f->sp);
    kvs_spill_recover_report_t rep;
    assert_int_equal(kvs_spill_recover(&f->cfg, true, &rep, &f->sp), RI_OK);
    assert_int_equal(rep.records, 20);
    assert_int_equal(get(f->sp, 0, 20, 1, NULL), RI_OK);
}

static void test_open_fails_at_create(void **state)
{
    fixture_t *f = *state;
    kvs_spill_destroy(f->sp);
    f->sp = NULL;
    kvs_spill_t *sp = NULL;
    st_fault_arm(ST_F_OPEN, ST_K_ERR, EACCES, 0, -1);
    assert_int_equal(kvs_spill_create(&f->cfg, &sp), RI_ERR_PERMISSION);
    assert_null(sp);
    st_fault_arm(ST_F_FALLOCATE, ST_K_ERR, ENOSPC, 0, -1);
    assert_int_equal(kvs_spill_create(&f->cfg, &sp), RI_ERR_NOSPACE);
    st_fault_off();
    f->sp = st_create_or_skip(&f->cfg);
}

/* A store of BASE records (salt 1) whose index and last segment are almost
 * full, so that the OOM batch below allocates in the middle: a new segment
 * after its 7th record, a bigger index and hash table at its 13th. */
enum { OOM_BASE = 1016, OOM_REWRITE = 4, OOM_BATCH = 16 };

static kvs_spill_t *oom_store(fixture_t *f)
{
    kvs_spill_t *sp = st_create_or_skip(&f->cfg);
    for (uint32_t c = 0; c < OOM_BASE; c += 64)
        assert_int_equal(put(sp, c, OOM_BASE - c < 64 ? OOM_BASE - c : 64, 1, NULL), RI_OK);
    return sp;
}

/* What cluster c must read after the batch, given its entry's status: the new
 * version (salt 2) when written, else the old one (salt 1) or nothing. */
static void oom_check_entry(kvs_spill_t *sp, uint32_t c, ri_status_t st)
{
    static uint8_t buf[8192];
    kvs_spill_rreq_t r = {.key = key(c), .buf = buf, .buf_bytes = sizeof(buf)};
    kvs_spill_read(sp, &r, 1);
    if (st == RI_OK) {
        if (r.status != RI_OK || !st_check(buf, sizeof(buf), &r.key, 2))
            fail_msg("cluster %u: the batch said written, a read says %s%s", c, ri_status_str(r.status),
                     r.status == RI_OK ? " with other contents" : "");
    } else if (c < OOM_BASE) {
        if (r.status != RI_OK || !st_check(buf, sizeof(buf), &r.key, 1))
            fail_msg("cluster %u: a failed rewrite lost the old version (%s)", c, ri_status_str(r.status));
    } else if (r.status != RI_ERR_NOT_FOUND) {
        fail_msg("cluster %u: a failed write of a new record left %s", c, ri_status_str(r.status));
    }
}

/* Out of memory at every allocation point of a write batch and of a read
 * batch, in turn: the batch reports NOMEM (never swallows it), each entry's
 * status says what the store now holds, an entry that failed keeps its old
 * version, and the store works and recovers afterwards.  Also checks that
 * some point falls mid-batch (entries before it written, after it not). */
static void test_out_of_memory(void **state)
{
    fixture_t *f = *state;
    kvs_spill_destroy(f->sp);
    f->sp = NULL;
    st_rmtree(f->dir);
    int points = 0, mid_batch = 0;
    uint64_t n;
    for (n = 1; n <= 64; n++) {
        kvs_spill_t *sp = oom_store(f);
        kvs_spill_stats_t s0, s1;
        kvs_spill_stats(sp, &s0);
        ri_status_t st[OOM_BATCH];
        cm_alloc_fail_after(n);
        ri_status_t w = put(sp, OOM_BASE - OOM_REWRITE, OOM_BATCH, 2, st);
        bool fired = cm_alloc_fail_pending() == 0;
        cm_alloc_fail_after(0);
        if (g_mutant_swallow)
            swallow_nomem(&w, st, OOM_BATCH);
        uint32_t ok = 0, first_bad = OOM_BATCH, new_ok = 0;
        for (uint32_t i = 0; i < OOM_BATCH; i++) {
            uint32_t c = OOM_BASE - OOM_REWRITE + i;
            if (st[i] == RI_OK) {
                ok++;
                new_ok += c >= OOM_BASE;
            } else {
                assert_int_equal(st[i], RI_ERR_NOMEM);
                if (first_bad == OOM_BATCH)
                    first_bad = i;
            }
            oom_check_entry(sp, c, st[i]);
        }
        kvs_spill_stats(sp, &s1);
        assert_int_equal(s1.records, s0.records + new_ok);
        if (!fired) {
            /* Every allocation of the batch passed: the sweep is complete. */
            assert_int_equal(w, RI_OK);
            assert_int_equal(ok, OOM_BATCH);
            kvs_spill_destroy(sp);
            break;
        }
        points++;
        assert_int_equal(w, RI_ERR_NOMEM);
        assert_true(ok < OOM_BATCH);
        if (first_bad > 0)
            mid_batch++;
        /* A read batch that runs out of memory fails whole and changes
         * nothing; the next one serves everything. */
        ri_status_t rst[OOM_BATCH];
        cm_alloc_fail_after(1);
        ri_status_t r = get(sp, 0, OOM_BATCH, 1, rst);
        assert_int_equal(cm_alloc_fail_pending(), 0);
        cm_alloc_fail_after(0);
        assert_int_equal(r, RI_ERR_NOMEM);
        for (uint32_t i = 0; i < OOM_BATCH; i++)
            assert_int_equal(rst[i], RI_ERR_NOMEM);
        assert_int_equal(get(sp, 0, OOM_BATCH, 1, NULL), RI_OK);
        /* Recovery: the failed entries can be written again, and all of it
         * survives a restart. */
        assert_int_equal(put(sp, OOM_BASE - OOM_REWRITE, OOM_BATCH, 2, NULL), RI_OK);
        assert_int_equal(kvs_spill_sync(sp), RI_OK);
        kvs_spill_destroy(sp);
        kvs_spill_recover_report_t rep;
        assert_int_equal(kvs_spill_recover(&f->cfg, true, &rep, &sp), RI_OK);
        assert_int_equal(rep.records, OOM_BASE - OOM_REWRITE + OOM_BATCH);
        assert_int_equal(get(sp, OOM_BASE - OOM_REWRITE, OOM_BATCH, 2, NULL), RI_OK);
        kvs_spill_destroy(sp);
        st_rmtree(f->dir);
    }
    printf("# out-of-memory points in the write batch: %d (%d mid-batch), sweep ended at %llu\n", points,
           mid_batch, (unsigned long long)n);
    assert_true(n <= 64);
    assert_true(points >= 3);
    assert_true(mid_batch >= 1);
    st_rmtree(f->dir);
    f->sp = st_create_or_skip(&f->cfg);
}

int main(int argc, char **argv)
{
    g_uring = st_mode_uring(argc, argv);
    g_mutant_swallow = argc > 2 && strcmp(argv[2], "mutant-swallow-nomem") == 0;
    if (g_mutant_swallow)
        printf("mutation on: out-of-memory entries of a write batch report success (this run must fail)\n");
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_transient_eio_is_retried, setup, teardown),
        cmocka_unit_test_setup_teardown(test_persistent_eio, setup, teardown),
        cmocka_unit_test_setup_teardown(test_enospc, setup, teardown),
        cmocka_unit_test_setup_teardown(test_short_transfers, setup, teardown),
        cmocka_unit_test_setup_teardown(test_uring_refused, setup, teardown),
        cmocka_unit_test_setup_teardown(test_manifest_failures, setup, teardown),
        cmocka_unit_test_setup_teardown(test_open_fails_at_create, setup, teardown),
        cmocka_unit_test_setup_teardown(test_out_of_memory, setup, teardown),
        /* last: a lost completion exists only on the io_uring path, so the
         * pread run does not register it (rather than skip() and pass) */
        cmocka_unit_test_setup_teardown(test_lost_completion, setup, teardown),
    };
    size_t n = sizeof(tests) / sizeof(tests[0]) - (g_uring ? 0 : 1);
    if (!g_uring)
        printf("pread path: test_lost_completion does not apply (io_uring only)\n");
    return _cmocka_run_group_tests("test_spill_faults", tests, n, NULL, NULL);
}
