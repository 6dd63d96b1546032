/*
 * Shared helpers of the worker tests: a real ri-kvstore on ephemeral ports
 * (tests/kvstore_ctl's kvs_test_daemon), a session on it, and synthetic K/V
 * with clustered keys (a few directions per head plus noise, so that the
 * wave index has structure and queries have heavy hitters).
 */
#ifndef WK_TEST_UTIL_H
#define WK_TEST_UTIL_H

#include <stddef.h>
#include <stdint.h>

#include "common/cm_half.h"
#include "gpuworker/client/gw_ctl.h"
#include "kernels/kn_ops.h"
#include "kvs_test_daemon.h"

typedef struct wk_env {
    kvs_test_daemon_t daemon;   /* the ri-kvstore child */
    gw_ctl_t *ctl;              /* control client */
} wk_env_t;

/* Start ri-kvstore (pool of memory_mb) and a control client.  0, 77 (skip:
 * daemon not built or cannot start here) or -1. */
int wk_env_start(wk_env_t *env, unsigned memory_mb);
void wk_env_stop(wk_env_t *env);

/* CreateSession with this geometry (fp16, page_tokens-token pages: the
 * remote's gw_remote_page_tokens). */
int wk_env_session(wk_env_t *env, uint32_t layers, uint32_t kv_heads, uint32_t head_dim, uint32_t page_tokens,
                   gw_ctl_session_t *s);

/* Head-major K/V of cap tokens, n_kv heads, d: fill tokens [t0, t1) of one
 * layer (seeded by layer). */
void wk_synth_kv(cm_fp16_t *k, cm_fp16_t *v, size_t cap, uint32_t n_kv, uint32_t d, size_t t0, size_t t1,
                 uint32_t layer);

/* The same rows in any layout: row (t, h) at t * token_stride + h * head_stride
 * (a model cache: mdl_kv_t's strides). */
void wk_synth_kv_strided(cm_fp16_t *k, cm_fp16_t *v, size_t token_stride, size_t head_stride, uint32_t n_kv,
                         uint32_t d, size_t t0, size_t t1, uint32_t layer);

/* A query [n_q][d] for step (seeded), aligned with one of the key directions. */
void wk_synth_q(float *q, uint32_t n_q, uint32_t d, uint64_t step);

/* max over rows of ||a - b|| / ||b|| for n_rows rows of d. */
double wk_rel_err(const float *a, const float *b, size_t n_rows, uint32_t d);

#endif /* WK_TEST_UTIL_H */
