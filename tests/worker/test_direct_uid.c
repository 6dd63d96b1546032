/*
 * A worker under another uid than the kvstore, with no group in common,
 * gets direct reads on one host, through the public API: ri-kvstore runs as
 * KVS_UID, the worker (a child of this test) as WORKER_UID with the
 * transports ri-worker picks by default (GW_UCX_TLS_LOCAL).  It prefills,
 * decodes, and must have read layer-steps in place (direct_steps), with the
 * outputs of an in-process kn_wave on the same K/V to 1e-6.  Against the
 * code before the regions were memory files handed over a unix socket (the
 * kvstore offering UCX shared memory) it failed at ri_session_create (exit
 * 11): the worker's data plane could not connect, "shmat(shmid=...) failed:
 * Permission denied".  The prompt is long enough (2,500 tokens) for an
 * index: at 1,024 nothing was read in place, whatever the uids.  Needs
 * root (to run both as other uids): exit 77 otherwise.
 */
#define _GNU_SOURCE
#include <grp.h>
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmocka.h>

#include "gpuworker/client/gw_remote.h"
#include "kernels/kn_wave.h"
#include "retroinfer/retroinfer.h"
#include "wk_test_util.h"

#define NL 2
#define NQ 8
#define NKV 2
#define D 64
#define N0 2500
#define CAP 2800
#define STEPS 40
#define KVS_UID 64211
#define KVS_GID 64211
#define WORKER_UID 64212
#define WORKER_GID 64212

/* The worker's part, in the child (already WORKER_UID).  0, or the check
 * that failed. */
static int worker_main(const char *grpc)
{
    ri_client_params_t cp;
    ri_session_params_t sp;
    ri_client_h client = NULL;
    ri_session_h sess = NULL;
    kn_wave_t *w[NL];
    kn_wave_params_t wp;
    kn_shape_t shape = {.n_q_heads = NQ, .n_kv_heads = NKV, .head_dim = D};
    cm_fp16_t *k[NL], *v[NL], tk[NKV * D], tv[NKV * D];
    float q[NQ * D], o_rem[NQ * D], o_loc[NQ * D];
    ri_session_stats_t ss = {.struct_size = sizeof(ss)};
    size_t n = N0;
    double worst = 0;

    ri_client_params_init(&cp);
    cp.address = grpc;
    cp.timeout_ms = 5000;
    if (ri_client_connect(&cp, &client) != RI_OK)
        return 10;
    ri_session_params_init(&sp);
    kn_wave_params_default(&wp);
    sp.n_layers = NL;
    sp.n_q_heads = NQ;
    sp.n_kv_heads = NKV;
    sp.head_dim = D;
    sp.expected_tokens = CAP;
    /* as test_api_kept: the paper's cluster size, the share alone */
    sp.tokens_per_cluster = wp.tokens_per_cluster = 16;
    sp.retrieval_min_tokens = wp.retrieval_min_tokens = 0;
    sp.label = "other-uid";
    if (ri_session_create(client, &sp, &sess) != RI_OK)
        return 11;
    for (uint32_t l = 0; l < NL; l++) {
        k[l] = calloc((size_t)NKV * CAP * D, sizeof(cm_fp16_t));
        v[l] = calloc((size_t)NKV * CAP * D, sizeof(cm_fp16_t));
        if (k[l] == NULL || v[l] == NULL)
            return 12;
        wk_synth_kv(k[l], v[l], CAP, NKV, D, 0, CAP, l);
        ri_kv_view_t pv = {.struct_size = sizeof(pv), .k = k[l], .v = v[l], .n_tokens = n, .token_stride = D,
                           .head_stride = (size_t)CAP * D};
        kn_kv_view_t lv = {.k = k[l], .v = v[l], .n_tokens = n, .token_stride = D, .head_stride = (size_t)CAP * D};
        if (kn_wave_create(&shape, &wp, &w[l]) != RI_OK || kn_wave_build(w[l], &lv) != RI_OK ||
            ri_prefill_kept(sess, l, &pv) != RI_OK)
            return 13;
    }
    if (ri_prefill_wait(sess) != RI_OK)
        return 14;
    for (int step = 0; step < STEPS; step++) {
        n++;
        for (uint32_t l = 0; l < NL; l++) {
            kn_kv_view_t lv = {.k = k[l], .v = v[l], .n_tokens = n, .token_stride = D, .head_stride = (size_t)CAP * D};
            bool upd = false;
            for (uint32_t h = 0; h < NKV; h++) {
                memcpy(tk + h * D, k[l] + ((size_t)h * CAP + n - 1) * D, D * sizeof(cm_fp16_t));
                memcpy(tv + h * D, v[l] + ((size_t)h * CAP + n - 1) * D, D * sizeof(cm_fp16_t));
            }
            ri_kv_view_t nv = {.struct_size = sizeof(nv), .k = tk, .v = tv, .n_tokens = 1, .token_stride = NKV * D,
                               .head_stride = D};
            wk_synth_q(q, NQ, D, (uint64_t)step * NL + l);
            if (kn_wave_update(w[l], &lv, &upd) != RI_OK || kn_wave_decode(w[l], q, &lv, o_loc, NULL, NULL) != RI_OK ||
                ri_decode_token(&sess, 1, l, q, &nv, o_rem) != RI_OK)
                return 15;
            double e = wk_rel_err(o_rem, o_loc, NQ, D);
            worst = e > worst ? e : worst;
        }
    }
    if (ri_session_stats(sess, &ss) != RI_OK)
        return 16;
    printf("worker uid %d (kvstore uid %d): %llu of %llu layer-steps read in place, worst rel err vs in-process "
           "%.3g\n", (int)getuid(), KVS_UID, (unsigned long long)ss.direct_steps, (unsigned long long)ss.steps, worst);
    fflush(stdout);
    ri_session_close(sess);
    ri_client_close(client);
    for (uint32_t l = 0; l < NL; l++) {
        kn_wave_destroy(w[l]);
        free(k[l]);
        free(v[l]);
    }
    if (ss.direct_steps == 0)
        return 17;
    return worst <= 1e-6 ? 0 : 18;
}

static void test_other_uid_reads_direct(void **state)
{
    kvs_test_daemon_t d = {0};
    int rc, st = 0;
    pid_t pid;
    (void)state;

    if (geteuid() != 0) {
        fprintf(stderr, "skipped: needs root to run the kvstore and the worker as other uids\n");
        exit(77);
    }
    unsetenv("UCX_TLS"); /* the kvstore's defaults */
    rc = kvs_test_daemon_start_as(&d, NULL, KVS_UID, KVS_GID, NULL);
    if (rc == 77)
        exit(77);
    assert_int_equal(rc, 0);
    fflush(stdout);
    pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) {
        if (setgroups(0, NULL) != 0 || setgid(WORKER_GID) != 0 || setuid(WORKER_UID) != 0)
            _exit(2);
        prctl(PR_SET_PDEATHSIG, SIGKILL);
        setenv("UCX_TLS", GW_UCX_TLS_LOCAL, 1); /* what ri-worker uses on one host */
        _exit(worker_main(d.grpc));
    }
    assert_int_equal(waitpid(pid, &st, 0), pid);
    kvs_test_daemon_stop(&d, SIGTERM, 5000);
    kvs_test_daemon_cleanup(&d);
    assert_true(WIFEXITED(st));
    assert_int_equal(WEXITSTATUS(st), 0);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_other_uid_reads_direct),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
