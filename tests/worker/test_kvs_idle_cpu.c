/*
 * A kvstore whose connected worker is busy computing (a prefill, say) and so
 * not progressing its UCX worker must not burn the CPU that worker needs.
 * Over shared memory UCX keeps trying to send its keepalive into the peer's
 * full FIFO; each try reads /proc/PID/stat and leaves the lane's wake-up
 * unarmable, and a lane that answered that by spinning took a whole core at
 * nice -10 (seen: a 4K prefill beside it 10x slower).  Here the session
 * decodes through the real daemon over the one-host transports, then the
 * client stays away from the library for a few seconds while the daemon's
 * CPU time is measured: it must stay under a tenth of a core.
 *
 * Second case: a worker that asks between steps of computing (two-sided
 * reads, a fetch every layer-step, 3 ms of "compute" in between) must not
 * find the daemon's lane polling through its compute either: with the
 * default --dataplane-spin-us 0 the lane sleeps on its worker's event after
 * each answer.  The mutant entry (test_kvs_idle_cpu_mutant_spin) runs the
 * same with a 5 ms spin and must fail.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include <cmocka.h>

#include "gpuworker/client/gw_remote.h"
#include "retroinfer/retroinfer.h"
#include "wk_test_util.h"

#define NL 2
#define NQ 8
#define NKV 2
#define D 64
#define N0 2000
#define CAP 2100
#define QUIET_S 4
#define PACED_STEPS 90 /* N0 + this stays under CAP */
#define PACED_GAP_US 3000

/* utime + stime of a process, in clock ticks; -1 when unreadable */
static long long ic_cpu_ticks(pid_t pid)
{
    char path[64], buf[2048];
    snprintf(path, sizeof(path), "/proc/%d/stat", (int)pid);
    FILE *f = fopen(path, "r");
    if (f == NULL)
        return -1;
    size_t n = fread(buf, 1, sizeof(buf) - 1, f);
    fclose(f);
    buf[n] = '\0';
    const char *p = strrchr(buf, ')'); /* the name may hold spaces */
    unsigned long long ut = 0, st = 0;
    if (p == NULL || sscanf(p + 2, "%*c %*d %*d %*d %*d %*d %*u %*u %*u %*u %*u %llu %llu", &ut, &st) != 2)
        return -1;
    return (long long)(ut + st);
}

static double ic_now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* A session of NL layers over N0 synthetic tokens (k, v: [NL] arrays of
 * NKV x CAP x D, allocated here, freed by the caller), prefilled. */
static void ic_session(const wk_env_t *env, uint32_t flags, ri_client_h *client_p, ri_session_h *sess_p,
                       cm_fp16_t **k, cm_fp16_t **v)
{
    ri_client_params_t cp;
    ri_session_params_t sp;
    ri_client_params_init(&cp);
    cp.address = env->daemon.grpc;
    cp.timeout_ms = 5000;
    assert_int_equal(ri_client_connect(&cp, client_p), RI_OK);
    ri_session_params_init(&sp);
    sp.n_layers = NL;
    sp.n_q_heads = NQ;
    sp.n_kv_heads = NKV;
    sp.head_dim = D;
    sp.expected_tokens = CAP;
    sp.label = "idle-cpu-test";
    sp.flags = flags;
    assert_int_equal(ri_session_create(*client_p, &sp, sess_p), RI_OK);
    for (uint32_t l = 0; l < NL; l++) {
        k[l] = calloc((size_t)NKV * CAP * D, sizeof(cm_fp16_t));
        v[l] = calloc((size_t)NKV * CAP * D, sizeof(cm_fp16_t));
        assert_non_null(k[l]);
        assert_non_null(v[l]);
        wk_synth_kv(k[l], v[l], CAP, NKV, D, 0, CAP, l);
        ri_kv_view_t pv = {.struct_size = sizeof(pv), .k = k[l], .v = v[l], .n_tokens = N0, .token_stride = D,
                           .head_stride = (size_t)CAP * D};
        assert_int_equal(ri_prefill_kept(*sess_p, l, &pv), RI_OK);
    }
    assert_int_equal(ri_prefill_wait(*sess_p), RI_OK);
}

static void test_daemon_sleeps_while_worker_computes(void **state)
{
    wk_env_t env;
    ri_client_h client = NULL;
    ri_session_h sess = NULL;
    cm_fp16_t *k[NL], *v[NL], tk[NKV * D], tv[NKV * D];
    float q[NQ * D], o[NQ * D];
    size_t n = N0;
    (void)state;

    setenv("UCX_TLS", GW_UCX_TLS_LOCAL, 0); /* what ri-worker and the benches use on one host */
    /* UCX's keepalive every 10 ms instead of 20 s (both processes read it):
     * an idle peer's 64-slot FIFO fills in under a second, not 21 minutes */
    setenv("UCX_KEEPALIVE_INTERVAL", "10ms", 1);
    if (wk_env_start(&env, 256) != 0)
        fail_msg("daemon did not start");
    ic_session(&env, 0, &client, &sess, k, v);
    for (int step = 0; step < 40; step++, n++)
        for (uint32_t l = 0; l < NL; l++) {
            for (uint32_t h = 0; h < NKV; h++) {
                memcpy(tk + h * D, k[l] + ((size_t)h * CAP + n) * D, D * sizeof(cm_fp16_t));
                memcpy(tv + h * D, v[l] + ((size_t)h * CAP + n) * D, D * sizeof(cm_fp16_t));
            }
            ri_kv_view_t nv = {.struct_size = sizeof(nv), .k = tk, .v = tv, .n_tokens = 1, .token_stride = NKV * D,
                               .head_stride = D};
            wk_synth_q(q, NQ, D, (uint64_t)step * NL + l);
            assert_int_equal(ri_decode_token(&sess, 1, l, q, &nv, o), RI_OK);
        }

    /* the worker "computes": nothing calls the library for QUIET_S seconds */
    long long t0 = ic_cpu_ticks(env.daemon.pid);
    sleep(QUIET_S);
    long long t1 = ic_cpu_ticks(env.daemon.pid);
    assert_true(t0 >= 0 && t1 >= t0);
    double share = (double)(t1 - t0) / (double)sysconf(_SC_CLK_TCK) / QUIET_S;
    printf("daemon CPU while its connected worker computed: %.1f%% of a core over %d s\n", 100.0 * share, QUIET_S);
    assert_true(share < 0.10);

    /* and it still answers at once afterwards */
    for (uint32_t l = 0; l < NL; l++) {
        ri_kv_view_t nv = {.struct_size = sizeof(nv), .k = tk, .v = tv, .n_tokens = 1, .token_stride = NKV * D,
                           .head_stride = D};
        assert_int_equal(ri_decode_token(&sess, 1, l, q, &nv, o), RI_OK);
    }
    ri_session_close(sess);
    ri_client_close(client);
    for (uint32_t l = 0; l < NL; l++) {
        free(k[l]);
        free(v[l]);
    }
    wk_env_stop(&env);
}

static void test_daemon_sleeps_between_paced_fetches(void **state)
{
    wk_env_t env;
    ri_client_h client = NULL;
    ri_session_h sess = NULL;
    cm_fp16_t *k[NL], *v[NL], tk[NKV * D], tv[NKV * D];
    float q[NQ * D], o[NQ * D];
    (void)state;

    setenv("UCX_TLS", GW_UCX_TLS_LOCAL, 0);
    if (wk_env_start(&env, 256) != 0)
        fail_msg("daemon did not start");
    ic_session(&env, RI_SESSION_TWO_SIDED, &client, &sess, k, v);
    for (uint32_t h = 0; h < NKV; h++) { /* one new token, the same each step: the K/V do not matter here */
        memcpy(tk + h * D, k[0] + ((size_t)h * CAP + N0) * D, D * sizeof(cm_fp16_t));
        memcpy(tv + h * D, v[0] + ((size_t)h * CAP + N0) * D, D * sizeof(cm_fp16_t));
    }
    ri_kv_view_t nv = {.struct_size = sizeof(nv), .k = tk, .v = tv, .n_tokens = 1, .token_stride = NKV * D,
                       .head_stride = D};
    long long t0 = ic_cpu_ticks(env.daemon.pid);
    double w0 = ic_now_s();
    for (int step = 0; step < PACED_STEPS; step++)
        for (uint32_t l = 0; l < NL; l++) {
            wk_synth_q(q, NQ, D, (uint64_t)step * NL + l);
            assert_int_equal(ri_decode_token(&sess, 1, l, q, &nv, o), RI_OK);
            usleep(PACED_GAP_US); /* the worker computes */
        }
    long long t1 = ic_cpu_ticks(env.daemon.pid);
    double wall = ic_now_s() - w0;
    ri_session_stats_t st = {.struct_size = sizeof(st)};
    assert_int_equal(ri_session_stats(sess, &st), RI_OK);
    double share = (double)(t1 - t0) / (double)sysconf(_SC_CLK_TCK) / wall;
    printf("daemon CPU while a worker fetched every %d us (%llu fetches): %.1f%% of a core over %.1f s\n",
           PACED_GAP_US, (unsigned long long)st.misses, 100.0 * share, wall);
    assert_true(st.misses >= PACED_STEPS); /* it did ask the lane, step after step */
    assert_true(share < 0.25);
    ri_session_close(sess);
    ri_client_close(client);
    for (uint32_t l = 0; l < NL; l++) {
        free(k[l]);
        free(v[l]);
    }
    wk_env_stop(&env);
}

int main(int argc, char **argv)
{
    if (argc > 1 && strcmp(argv[1], "mutant-spin") == 0)
        setenv("RI_KVS_DATAPLANE_SPIN_US", "5000", 1); /* the daemon inherits it */
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_daemon_sleeps_while_worker_computes),
        cmocka_unit_test(test_daemon_sleeps_between_paced_fetches),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
