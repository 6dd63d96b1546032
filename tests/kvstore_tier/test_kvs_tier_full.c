/*
 * A full spill disk through the real daemon: the spill directory is a small
 * tmpfs of its own (a private mount namespace, so nothing else sees it).
 * With the disk filled, CreateSession fails with a clear error and creates
 * nothing, instead of answering OK for a session --recover would not know;
 * the daemon stopped and restarted with --recover while the disk is still too
 * full for a new segment starts, serves the recovered session (same id and
 * secret), and creates sessions again once space is freed.  Needs root (to
 * mount); skipped (77) otherwise.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <sched.h>
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mount.h>
#include <unistd.h>
#include <cmocka.h>

#include "common/cm_alloc.h"
#include "gpuworker/client/gw_ctl.h"
#include "gpuworker/client/gw_dp.h"
#include "kvs_test_daemon.h"

/* 256 MiB is the daemon's spill segment: one fits, a second does not. */
#define FS_MIB 300

static char g_mnt[256];
static kvs_test_daemon_t g_d;

static const gw_ctl_geometry_t geo = {.layers = 2, .kv_heads = 2, .head_dim = 64, .dtype = 1, .page_tokens = 8};

/* A private tmpfs of FS_MIB at a new temporary directory; 77 when we may not. */
static int mount_small_fs(void)
{
    char opts[64];
    const char *base = getenv("TMPDIR") ? getenv("TMPDIR") : "/tmp";
    if (unshare(CLONE_NEWNS) != 0) {
        printf("skip: cannot make a mount namespace (%s): needs root\n", strerror(errno));
        return 77;
    }
    if (mount(NULL, "/", NULL, MS_REC | MS_PRIVATE, NULL) != 0)
        return -1;
    snprintf(g_mnt, sizeof(g_mnt), "%s/ri-full-XXXXXX", base);
    if (mkdtemp(g_mnt) == NULL)
        return -1;
    snprintf(opts, sizeof(opts), "size=%dm,mode=0700", FS_MIB);
    if (mount("tmpfs", g_mnt, "tmpfs", 0, opts) != 0) {
        printf("skip: cannot mount a tmpfs (%s)\n", strerror(errno));
        rmdir(g_mnt);
        return 77;
    }
    return 0;
}

static int start(bool recover)
{
    char flag[400];
    snprintf(flag, sizeof(flag), "--spill-dir=%s/spill", g_mnt);
    const char *extra[] = {"--memory=16MiB", flag, recover ? "--recover" : NULL, NULL};
    return kvs_test_daemon_start(&g_d, extra, NULL);
}

/* Write a filler file until the filesystem is full; returns its path. */
static void fill_disk(char *path, size_t len)
{
    static char block[1 << 20];
    snprintf(path, len, "%s/filler", g_mnt);
    int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC, 0600);
    assert_true(fd >= 0);
    memset(block, 0x5a, sizeof(block));
    for (int i = 0; i < FS_MIB * 2; i++) {
        ssize_t w = write(fd, block, sizeof(block));
        if (w < (ssize_t)sizeof(block))
            break;
    }
    /* then the last few bytes a block could not take */
    while (write(fd, block, 512) == 512) {
    }
    close(fd);
}

/* Is session s listed?  Then s->dataplane_address becomes the address the
 * daemon lists for it (it changes when the daemon restarts). */
static bool listed(gw_ctl_t *c, gw_ctl_session_t *s)
{
    gw_ctl_session_info_t *infos = NULL;
    size_t n = 0;
    bool found = false;
    assert_int_equal(gw_ctl_list_sessions(c, 5000, &infos, &n, NULL), RI_OK);
    for (size_t i = 0; i < n; i++)
        if (infos[i].session_id == s->session_id) {
            found = true;
            snprintf(s->dataplane_address, sizeof(s->dataplane_address), "%s", infos[i].dataplane_address);
        }
    cm_free(infos);
    return found;
}

static void test_full_disk(void **state)
{
    (void)state;
    gw_ctl_t *c = NULL;
    gw_ctl_session_t a, b;
    gw_ctl_error_t err;
    gw_dp_t *dp = NULL;
    char filler[400];

    assert_int_equal(start(false), 0);
    assert_int_equal(gw_ctl_create(g_d.grpc, NULL, &c), RI_OK);
    assert_int_equal(gw_ctl_create_session(c, 5000, &geo, 256, "before-full", &a, &err), RI_OK);

    /* Disk full: the session cannot be recorded, so none is created. */
    fill_disk(filler, sizeof(filler));
    ri_status_t st = gw_ctl_create_session(c, 5000, &geo, 256, "while-full", &b, &err);
    if (st == RI_OK)
        fail_msg("CreateSession answered OK (session %llu) although its manifest could not be written",
                 (unsigned long long)b.session_id);
    assert_int_equal(err.grpc_code, 8); /* RESOURCE_EXHAUSTED */
    assert_non_null(strstr(err.message, "could not record the session"));
    assert_true(listed(c, &a));
    gw_ctl_session_info_t *infos = NULL;
    size_t n = 0;
    assert_int_equal(gw_ctl_list_sessions(c, 5000, &infos, &n, NULL), RI_OK);
    cm_free(infos);
    assert_int_equal(n, 1);
    gw_ctl_destroy(c);
    c = NULL;

    /* Restart with --recover, the disk still too full for a new segment. */
    assert_int_equal(kvs_test_daemon_stop(&g_d, SIGTERM, 15000), 0);
    fill_disk(filler, sizeof(filler)); /* what the stop released */
    int rc = start(true);
    if (rc != 0)
        fail_msg("--recover did not start on a full disk (rc %d)", rc);
    assert_int_equal(gw_ctl_create(g_d.grpc, NULL, &c), RI_OK);
    assert_true(listed(c, &a));
    /* the secret still works, at the restarted daemon's data-plane port */
    assert_int_equal(gw_dp_connect(a.dataplane_address, a.session_id, a.secret, NULL, &dp), RI_OK);
    assert_int_equal(gw_dp_ping(dp), RI_OK);
    gw_dp_close(dp);

    /* Space back: sessions can be created (and recorded) again. */
    assert_int_equal(unlink(filler), 0);
    assert_int_equal(gw_ctl_create_session(c, 5000, &geo, 256, "after-full", &b, &err), RI_OK);
    assert_true(listed(c, &b));
    gw_ctl_destroy(c);
    assert_int_equal(kvs_test_daemon_stop(&g_d, SIGTERM, 15000), 0);
}

int main(void)
{
    char bin[512];
    if (access(kvs_test_bin("ri-kvstore", bin, sizeof(bin)), X_OK) != 0)
        return 77;
    int m = mount_small_fs();
    if (m != 0)
        return m == 77 ? 77 : 1;
    if (kvs_test_daemon_prepare(&g_d) != 0)
        return 1;
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_full_disk),
    };
    int rc = cmocka_run_group_tests(tests, NULL, NULL);
    if (g_d.pid > 0)
        kvs_test_daemon_stop(&g_d, SIGKILL, 5000);
    kvs_test_daemon_cleanup(&g_d);
    umount2(g_mnt, MNT_DETACH);
    rmdir(g_mnt);
    return rc;
}
