/*
 * kill -9 under load: a child process spills batches as fast as it can,
 * syncing now and then and reporting over a pipe how many records were
 * acknowledged and how many synced; the parent kills it mid-write, recovers
 * the directory and checks that every acknowledged record is there and
 * bit-exact, and that nothing else served is wrong.  argv[1]: uring|pread.
 */
#define _GNU_SOURCE
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>
#include <cmocka.h>

#include "kvstore/spill/kvs_spill.h"
#include "spill_test_util.h"

static bool g_uring = true;

enum { BATCH = 64, SYNC_EVERY = 8, KILL_AFTER = 6000, MAX_REC = 200000 };

static kvs_spill_key_t key(uint32_t i) { return (kvs_spill_key_t){.session = 1 + i % 3, .layer = i % 30, .head = 0, .cluster = i}; }

/* Progress message from the child. */
typedef struct progress {
    uint32_t acked;    /* records [0, acked) written OK */
    uint32_t synced;   /* records [0, synced) covered by a manifest */
} progress_t;

static void child(const kvs_spill_config_t *cfg, int fd)
{
    kvs_spill_t *sp = NULL;
    if (kvs_spill_create(cfg, &sp) != RI_OK)
        _exit(3);
    static uint8_t buf[BATCH][8192];
    kvs_spill_wreq_t w[BATCH];
    progress_t p = {0, 0};
    for (uint32_t b = 0; b < MAX_REC; b += BATCH) {
        for (uint32_t i = 0; i < BATCH; i++) {
            kvs_spill_key_t k = key(b + i);
            st_fill(buf[i], 8192, &k, 1);
            w[i] = (kvs_spill_wreq_t){.key = k, .dtype = 1, .tokens = 16, .payload = buf[i], .payload_bytes = 8192};
        }
        if (kvs_spill_write(sp, w, BATCH) != RI_OK)
            _exit(4);
        p.acked = b + BATCH;
        if ((b / BATCH) % SYNC_EVERY == SYNC_EVERY - 1) {
            if (kvs_spill_sync(sp) != RI_OK)
                _exit(5);
            p.synced = p.acked;
        }
        if (write(fd, &p, sizeof(p)) != (ssize_t)sizeof(p))
            _exit(6);
    }
    _exit(0);
}

static void test_kill9_then_recover(void **state)
{
    char *dir = st_tmpdir();
    kvs_spill_config_t cfg;
    st_config(&cfg, dir, g_uring);
    cfg.segment_bytes = 16u << 20;
    /* Probe once here so that an unsupported machine skips cleanly. */
    kvs_spill_t *probe = st_create_or_skip(&cfg);
    kvs_spill_destroy(probe);

    int pfd[2];
    assert_int_equal(pipe(pfd), 0);
    pid_t pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) {
        close(pfd[0]);
        child(&cfg, pfd[1]);
    }
    close(pfd[1]);
    progress_t p = {0, 0}, got;
    while (p.acked < KILL_AFTER && read(pfd[0], &got, sizeof(got)) == (ssize_t)sizeof(got))
        p = got;
    /* Land the kill anywhere: mid-batch, mid-sync, between batches. */
    srand((unsigned)getpid() ^ (unsigned)time(NULL));
    usleep((useconds_t)(rand() % 30000));
    kill(pid, SIGKILL);
    /* Progress written before the kill still counts. */
    while (read(pfd[0], &got, sizeof(got)) == (ssize_t)sizeof(got))
        p = got;
    int wst;
    waitpid(pid, &wst, 0);
    close(pfd[0]);
    assert_true(WIFSIGNALED(wst) && WTERMSIG(wst) == SIGKILL);
    assert_true(p.acked >= KILL_AFTER && p.synced > 0);

    kvs_spill_recover_report_t rep;
    kvs_spill_t *sp = NULL;
    assert_int_equal(kvs_spill_recover(&cfg, true, &rep, &sp), RI_OK);
    assert_int_equal(rep.corrupt, 0);
    assert_true(rep.records >= p.acked);
    /* Everything acknowledged is back and exact; whatever else came back
     * (writes in flight at the kill) is exact too. */
    uint32_t upto = p.acked + 4 * BATCH;
    static uint8_t buf[BATCH][8192];
    uint32_t present = 0;
    for (uint32_t b = 0; b < upto; b += BATCH) {
        kvs_spill_rreq_t r[BATCH];
        for (uint32_t i = 0; i < BATCH; i++)
            r[i] = (kvs_spill_rreq_t){.key = key(b + i), .buf = buf[i], .buf_bytes = 8192};
        kvs_spill_read(sp, r, BATCH);
        for (uint32_t i = 0; i < BATCH; i++) {
            if (b + i < p.acked)
                assert_int_equal(r[i].status, RI_OK);
            else
                assert_true(r[i].status == RI_OK || r[i].status == RI_ERR_NOT_FOUND);
            if (r[i].status == RI_OK) {
                assert_true(st_check(buf[i], 8192, &r[i].key, 1));
                present++;
            }
        }
    }
    assert_int_equal(present, rep.records);
    printf("# killed after %u acknowledged (%u synced); recovered %llu (%llu by scan)\n", p.acked, p.synced,
           (unsigned long long)rep.records, (unsigned long long)rep.records_from_scan);
    kvs_spill_destroy(sp);
    st_rmtree(dir);
    free(dir);
}

int main(int argc, char **argv)
{
    g_uring = st_mode_uring(argc, argv);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_kill9_then_recover),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
