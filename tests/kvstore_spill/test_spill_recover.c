/*
 * Restart recovery and corruption: clean restart, crash states (records after
 * the last manifest, drops, compaction leftovers), damaged manifest, flipped
 * bytes in records (detected, reported, never served).  argv[1]: uring|pread.
 */
#define _GNU_SOURCE
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <fcntl.h>
#include <unistd.h>
#include <cmocka.h>

#include "kvstore/spill/kvs_spill.h"
#include "spill_test_util.h"

static bool g_uring = true;

#define REC 12288u   /* on-disk size of an 8 KiB payload record */

typedef struct fixture {
    char *dir;
    char *crash;   /* copy of dir taken mid-run: what a crash leaves */
    kvs_spill_config_t cfg;
} fixture_t;

static int setup(void **state)
{
    fixture_t *f = calloc(1, sizeof(*f));
    f->dir = st_tmpdir();
    f->crash = st_tmpdir();
    st_config(&f->cfg, f->dir, g_uring);
    *state = f;
    return 0;
}

static int teardown(void **state)
{
    fixture_t *f = *state;
    st_rmtree(f->dir);
    st_rmtree(f->crash);
    free(f->dir);
    free(f->crash);
    free(f);
    return 0;
}

static kvs_spill_key_t key(uint64_t s, uint32_t c) { return (kvs_spill_key_t){.session = s, .layer = 1, .head = 2, .cluster = c}; }

static void put(kvs_spill_t *sp, uint64_t s, uint32_t from, uint32_t n, uint32_t salt)
{
    kvs_spill_wreq_t *w = calloc(n, sizeof(*w));
    uint8_t *buf = malloc((size_t)n * 8192);
    for (uint32_t i = 0; i < n; i++) {
        kvs_spill_key_t k = key(s, from + i);
        st_fill(buf + (size_t)i * 8192, 8192, &k, salt);
        w[i] = (kvs_spill_wreq_t){.key = k, .dtype = 1, .tokens = 16, .payload = buf + (size_t)i * 8192,
                                  .payload_bytes = 8192};
    }
    assert_int_equal(kvs_spill_write(sp, w, n), RI_OK);
    free(buf);
    free(w);
}

/* Read keys [from, from+n) of session s; expect RI_OK with salt, or
 * `expect` for every entry. */
static void get(kvs_spill_t *sp, uint64_t s, uint32_t from, uint32_t n, uint32_t salt, ri_status_t expect)
{
    kvs_spill_rreq_t *r = calloc(n, sizeof(*r));
    uint8_t *buf = malloc((size_t)n * 8192);
    for (uint32_t i = 0; i < n; i++)
        r[i] = (kvs_spill_rreq_t){.key = key(s, from + i), .buf = buf + (size_t)i * 8192, .buf_bytes = 8192};
    kvs_spill_read(sp, r, n);
    for (uint32_t i = 0; i < n; i++) {
        assert_int_equal(r[i].status, expect);
        if (expect == RI_OK)
            assert_true(st_check(r[i].buf, 8192, &r[i].key, salt));
    }
    free(buf);
    free(r);
}

/* cp -a of the spill files: the state a kill -9 would leave (O_DIRECT data is
 * in the files; nothing is buffered in the process). */
static void snapshot_dir(const char *from, const char *to)
{
    char cmd[8192];
    snprintf(cmd, sizeof(cmd), "rm -rf '%s' && cp -a '%s' '%s'", to, from, to);
    assert_int_equal(system(cmd), 0);
}

static void flip_byte(const char *dir, uint32_t seg, uint64_t off)
{
    char path[4200];
    snprintf(path, sizeof(path), "%s/seg-%08u.dat", dir, seg);
    int fd = open(path, O_RDWR);
    assert_true(fd >= 0);
    uint8_t b;
    assert_int_equal(pread(fd, &b, 1, (off_t)off), 1);
    b ^= 0x40;
    assert_int_equal(pwrite(fd, &b, 1, (off_t)off), 1);
    fsync(fd);
    close(fd);
}

static kvs_spill_t *recover(kvs_spill_config_t *cfg, bool verify, kvs_spill_recover_report_t *rep)
{
    kvs_spill_t *sp = NULL;
    assert_int_equal(kvs_spill_recover(cfg, verify, rep, &sp), RI_OK);
    return sp;
}

static void test_clean_restart(void **state)
{
    fixture_t *f = *state;
    kvs_spill_t *sp = st_create_or_skip(&f->cfg);
    put(sp, 1, 0, 500, 1);      /* ~6 MiB: two segments */
    put(sp, 2, 0, 100, 2);
    put(sp, 1, 10, 5, 3);       /* replace five */
    kvs_spill_destroy(sp);

    kvs_spill_recover_report_t rep;
    sp = recover(&f->cfg, true, &rep);
    assert_true(rep.manifest_found);
    assert_int_equal(rep.records, 600);
    assert_int_equal(rep.corrupt, 0);
    get(sp, 1, 0, 10, 1, RI_OK);
    get(sp, 1, 10, 5, 3, RI_OK);
    get(sp, 1, 15, 485, 1, RI_OK);
    get(sp, 2, 0, 100, 2, RI_OK);
    /* Keep going after a recovery, then restart again. */
    put(sp, 3, 0, 50, 4);
    kvs_spill_destroy(sp);
    sp = recover(&f->cfg, false, &rep);
    assert_int_equal(rep.records, 650);
    get(sp, 3, 0, 50, 4, RI_OK);
    get(sp, 2, 0, 100, 2, RI_OK);
    kvs_spill_destroy(sp);
}

static void test_crash_after_sync(void **state)
{
    fixture_t *f = *state;
    kvs_spill_t *sp = st_create_or_skip(&f->cfg);
    put(sp, 1, 0, 200, 1);
    put(sp, 2, 0, 200, 2);
    assert_int_equal(kvs_spill_sync(sp), RI_OK);
    assert_int_equal(kvs_spill_drop_session(sp, 2, NULL), RI_OK);   /* writes a manifest */
    put(sp, 1, 200, 150, 1);    /* after the last manifest */
    put(sp, 1, 0, 20, 9);       /* newer versions of manifest records */
    snapshot_dir(f->dir, f->crash);
    kvs_spill_destroy(sp);

    kvs_spill_config_t c = f->cfg;
    c.dir = f->crash;
    kvs_spill_recover_report_t rep;
    sp = recover(&c, true, &rep);
    assert_true(rep.manifest_found);
    assert_int_equal(rep.records_from_scan, 170);
    assert_int_equal(rep.records, 350);
    get(sp, 1, 0, 20, 9, RI_OK);
    get(sp, 1, 20, 330, 1, RI_OK);
    get(sp, 2, 0, 200, 0, RI_ERR_NOT_FOUND);   /* the drop stays dropped */
    kvs_spill_destroy(sp);
}

static void test_crash_after_compaction(void **state)
{
    fixture_t *f = *state;
    kvs_spill_t *sp = st_create_or_skip(&f->cfg);
    for (uint32_t b = 0; b < 600; b += 50) {   /* interleaved over ~3 segments */
        put(sp, 1, b, 50, 1);
        put(sp, 2, b, 50, 2);
    }
    char seg0[4200], keep[4200];
    snprintf(seg0, sizeof(seg0), "%s/seg-00000000.dat", f->dir);
    snprintf(keep, sizeof(keep), "%s/old-seg0", f->crash);
    char cmd[9000];
    snprintf(cmd, sizeof(cmd), "cp '%s' '%s'", seg0, keep);
    assert_int_equal(system(cmd), 0);
    assert_int_equal(kvs_spill_drop_session(sp, 1, NULL), RI_OK);
    uint64_t reclaimed = 0;
    assert_int_equal(kvs_spill_compact(sp, &reclaimed), RI_OK);
    assert_true(reclaimed > 0);
    assert_int_equal(access(seg0, F_OK), -1);   /* segment 0 was compacted away */
    /* A crash between the manifest and the unlink leaves the old file: put
     * it back; recovery must treat it as stale, not resurrect session 1. */
    snprintf(cmd, sizeof(cmd), "cp '%s' '%s'", keep, seg0);
    assert_int_equal(system(cmd), 0);
    snapshot_dir(f->dir, f->crash);
    kvs_spill_destroy(sp);

    kvs_spill_config_t c = f->cfg;
    c.dir = f->crash;
    kvs_spill_recover_report_t rep;
    sp = recover(&c, true, &rep);
    assert_int_equal(rep.stale_segments, 1);
    assert_int_equal(rep.records, 600);
    get(sp, 2, 0, 600, 2, RI_OK);
    get(sp, 1, 0, 50, 0, RI_ERR_NOT_FOUND);
    kvs_spill_destroy(sp);
}

static void test_damaged_manifest(void **state)
{
    fixture_t *f = *state;
    kvs_spill_t *sp = st_create_or_skip(&f->cfg);
    put(sp, 4, 0, 300, 1);
    kvs_spill_destroy(sp);
    char path[4200];
    snprintf(path, sizeof(path), "%s/MANIFEST", f->dir);
    int fd = open(path, O_RDWR);
    assert_true(fd >= 0);
    assert_int_equal(pwrite(fd, "garbage!", 8, 60), 8);
    close(fd);
    kvs_spill_recover_report_t rep;
    sp = recover(&f->cfg, true, &rep);
    assert_false(rep.manifest_found);
    assert_int_equal(rep.records, 300);
    assert_int_equal(rep.records_from_scan, 300);
    get(sp, 4, 0, 300, 1, RI_OK);
    kvs_spill_destroy(sp);
}

static void test_corrupt_while_running(void **state)
{
    fixture_t *f = *state;
    kvs_spill_t *sp = st_create_or_skip(&f->cfg);
    put(sp, 5, 0, 10, 1);
    flip_byte(f->dir, 0, 3 * REC + 64 + 1000);   /* payload of record 3 */
    flip_byte(f->dir, 0, 6 * REC + 32);          /* cluster id in record 6's header */
    kvs_spill_rreq_t r[10];
    uint8_t buf[10][8192];
    for (uint32_t i = 0; i < 10; i++) {
        memset(buf[i], 0xAB, 8192);
        r[i] = (kvs_spill_rreq_t){.key = key(5, i), .buf = buf[i], .buf_bytes = 8192};
    }
    assert_int_equal(kvs_spill_read(sp, r, 10), RI_ERR_CORRUPT);
    for (uint32_t i = 0; i < 10; i++) {
        if (i == 3 || i == 6) {
            assert_int_equal(r[i].status, RI_ERR_CORRUPT);
            /* nothing wrong served: the buffer was not touched */
            for (int b = 0; b < 8192; b++)
                assert_int_equal(buf[i][b], 0xAB);
        } else {
            assert_int_equal(r[i].status, RI_OK);
            assert_true(st_check(buf[i], 8192, &r[i].key, 1));
        }
    }
    /* Lost stays lost (no second disk read), and it is counted. */
    get(sp, 5, 3, 1, 0, RI_ERR_CORRUPT);
    kvs_spill_info_t info;
    assert_int_equal(kvs_spill_stat(sp, &r[3].key, &info), RI_OK);
    assert_true(info.lost);
    kvs_spill_stats_t s;
    kvs_spill_stats(sp, &s);
    assert_int_equal(s.checksum_failures, 2);
    assert_int_equal(s.lost_records, 2);
    assert_int_equal(s.records, 8);
    char *text = NULL;
    size_t len = 0;
    FILE *out = open_memstream(&text, &len);
    kvs_spill_metrics_write(sp, out);
    fclose(out);
    assert_non_null(strstr(text, "\nkvs_spill_checksum_failures_total 2\n"));
    free(text);
    /* Writing the cluster again heals it. */
    put(sp, 5, 3, 1, 7);
    get(sp, 5, 3, 1, 7, RI_OK);
    kvs_spill_stats(sp, &s);
    assert_int_equal(s.lost_records, 1);
    assert_int_equal(s.records, 9);
    kvs_spill_destroy(sp);
}

static void test_corrupt_found_at_recovery(void **state)
{
    fixture_t *f = *state;
    kvs_spill_t *sp = st_create_or_skip(&f->cfg);
    put(sp, 6, 0, 20, 1);
    kvs_spill_destroy(sp);
    flip_byte(f->dir, 0, 11 * REC + 64 + 8191);   /* last payload byte of record 11 */
    kvs_spill_recover_report_t rep;
    sp = recover(&f->cfg, true, &rep);
    assert_int_equal(rep.corrupt, 1);
    assert_int_equal(rep.records, 19);
    get(sp, 6, 0, 11, 1, RI_OK);
    get(sp, 6, 11, 1, 0, RI_ERR_CORRUPT);
    get(sp, 6, 12, 8, 1, RI_OK);
    kvs_spill_destroy(sp);
    /* Without verification at start, the first read catches it instead. */
    sp = recover(&f->cfg, false, &rep);
    assert_int_equal(rep.records, 19);
    get(sp, 6, 11, 1, 0, RI_ERR_CORRUPT);   /* lost stays lost across restarts */
    get(sp, 6, 0, 11, 1, RI_OK);
    kvs_spill_destroy(sp);
}

int main(int argc, char **argv)
{
    g_uring = st_mode_uring(argc, argv);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_clean_restart, setup, teardown),
        cmocka_unit_test_setup_teardown(test_crash_after_sync, setup, teardown),
        cmocka_unit_test_setup_teardown(test_crash_after_compaction, setup, teardown),
        cmocka_unit_test_setup_teardown(test_damaged_manifest, setup, teardown),
        cmocka_unit_test_setup_teardown(test_corrupt_while_running, setup, teardown),
        cmocka_unit_test_setup_teardown(test_corrupt_found_at_recovery, setup, teardown),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
