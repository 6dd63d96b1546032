/* Worker test helpers (see wk_test_util.h). */
#include "wk_test_util.h"

#include <math.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define WK_DIRS 24  /* key directions per head */

static uint64_t wk_rng(uint64_t *s)
{
    uint64_t z = (*s += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

static float wk_unif(uint64_t *s)
{
    return (float)((wk_rng(s) >> 11) * (1.0 / 9007199254740992.0)) * 2.0f - 1.0f;
}

/* Direction i of the key space (shared by keys and queries). */
static float wk_dir(uint32_t i, uint32_t c)
{
    uint64_t s = 1000 + (uint64_t)i * 7919 + c;
    return wk_unif(&s);
}

int wk_env_start(wk_env_t *env, unsigned memory_mb)
{
    char mem[64];
    const char *extra[2] = {mem, NULL};
    int ex = 0, rc;

    memset(env, 0, sizeof(*env));
    setenv("UCX_TLS", "posix,sysv,cma,tcp,self", 0); /* daemon and test: shared memory */
    snprintf(mem, sizeof(mem), "--memory=%uMiB", memory_mb);
    rc = kvs_test_daemon_start(&env->daemon, extra, &ex);
    if (rc != 0) {
        fprintf(stderr, "ri-kvstore did not start (rc %d, exit %d)\n", rc, ex);
        kvs_test_daemon_cleanup(&env->daemon);
        return rc == 77 ? 77 : -1;
    }
    if (env->daemon.dataplane[0] == '\0') {
        fprintf(stderr, "skip: ri-kvstore runs without a data plane here\n");
        wk_env_stop(env);
        return 77;
    }
    if (gw_ctl_create(env->daemon.grpc, NULL, &env->ctl) != RI_OK) {
        wk_env_stop(env);
        return -1;
    }
    return 0;
}

void wk_env_stop(wk_env_t *env)
{
    gw_ctl_destroy(env->ctl);
    env->ctl = NULL;
    if (env->daemon.pid > 0)
        kvs_test_daemon_stop(&env->daemon, SIGTERM, 5000);
    kvs_test_daemon_cleanup(&env->daemon);
}

int wk_env_session(wk_env_t *env, uint32_t layers, uint32_t kv_heads, uint32_t head_dim, uint32_t page_tokens,
                   gw_ctl_session_t *s)
{
    gw_ctl_geometry_t g = {.layers = layers, .kv_heads = kv_heads, .head_dim = head_dim, .dtype = 1,
                           .page_tokens = page_tokens};
    gw_ctl_error_t err;
    ri_status_t st = gw_ctl_create_session(env->ctl, 5000, &g, 8192, "worker-test", s, &err);
    if (st != RI_OK) {
        fprintf(stderr, "CreateSession: %s (%s)\n", ri_status_str(st), err.message);
        return -1;
    }
    return 0;
}

void wk_synth_kv(cm_fp16_t *k, cm_fp16_t *v, size_t cap, uint32_t n_kv, uint32_t d, size_t t0, size_t t1,
                 uint32_t layer)
{
    wk_synth_kv_strided(k, v, d, cap * d, n_kv, d, t0, t1, layer);
}

void wk_synth_kv_strided(cm_fp16_t *k, cm_fp16_t *v, size_t token_stride, size_t head_stride, uint32_t n_kv,
                         uint32_t d, size_t t0, size_t t1, uint32_t layer)
{
    for (uint32_t h = 0; h < n_kv; h++)
        for (size_t t = t0; t < t1; t++) {
            uint64_t s = ((uint64_t)layer << 48) ^ ((uint64_t)h << 40) ^ (t * 2654435761u);
            uint32_t dir = (uint32_t)(wk_rng(&s) % WK_DIRS);
            float amp = 1.0f + 0.5f * wk_unif(&s);
            cm_fp16_t *kr = k + t * token_stride + h * head_stride, *vr = v + t * token_stride + h * head_stride;
            for (uint32_t c = 0; c < d; c++) {
                kr[c] = cm_f32_to_fp16(amp * wk_dir(dir + h, c) + 0.3f * wk_unif(&s));
                vr[c] = cm_f32_to_fp16(wk_unif(&s));
            }
        }
}

void wk_synth_q(float *q, uint32_t n_q, uint32_t d, uint64_t step)
{
    uint64_t s = 77 + step * 31;
    for (uint32_t h = 0; h < n_q; h++) {
        uint32_t dir = (uint32_t)(wk_rng(&s) % WK_DIRS);
        for (uint32_t c = 0; c < d; c++)
            q[(size_t)h * d + c] = 2.5f * wk_dir(dir, c) + 0.2f * wk_unif(&s);
    }
}

double wk_rel_err(const float *a, const float *b, size_t n_rows, uint32_t d)
{
    double worst = 0;
    for (size_t r = 0; r < n_rows; r++) {
        double num = 0, den = 0;
        for (uint32_t c = 0; c < d; c++) {
            double x = (double)a[r * d + c] - b[r * d + c];
            num += x * x;
            den += (double)b[r * d + c] * b[r * d + c];
        }
        double e = sqrt(num) / (sqrt(den) + 1e-30);
        if (e > worst)
            worst = e;
    }
    return worst;
}
