/*
 * A minimal program on the public API of libretroinfer: connect to a
 * ri-kvstore, create a session for a small 2-layer model geometry, hand it
 * the "prompt" K/V of each layer (synthetic here; an engine passes its own
 * post-RoPE fp16 cache), then run decode steps and print the cache figures.
 *
 *   cc example.c $(pkg-config --cflags --libs retroinfer) -o example
 *   ./example 127.0.0.1:7070 [token]
 */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <retroinfer/retroinfer.h>

enum { LAYERS = 2, QH = 8, KVH = 2, D = 64, PROMPT = 2048, STEPS = 16, CAP = PROMPT + STEPS };

/* float -> IEEE half (round to nearest even; values here are small and normal) */
static uint16_t to_half(float f)
{
    uint32_t x;
    memcpy(&x, &f, 4);
    uint32_t sign = (x >> 16) & 0x8000u, mant = x & 0x7fffffu;
    int exp = (int)((x >> 23) & 0xff) - 127 + 15;
    if (exp <= 0)
        return (uint16_t)sign;
    if (exp >= 31)
        return (uint16_t)(sign | 0x7c00u);
    uint32_t h = sign | ((uint32_t)exp << 10) | (mant >> 13), rest = mant & 0x1fffu;
    if (rest > 0x1000u || (rest == 0x1000u && (h & 1u)))
        h++;
    return (uint16_t)h;
}

static float rnd(uint64_t *s)
{
    *s = *s * 6364136223846793005ull + 1442695040888963407ull;
    return (float)((*s >> 40) & 0xffffff) / 8388608.0f - 1.0f;
}

int main(int argc, char **argv)
{
    ri_client_params_t cp;
    ri_session_params_t sp;
    ri_session_stats_t st = {.struct_size = sizeof(st)};
    ri_client_h client = NULL;
    ri_session_h sess = NULL;
    ri_kv_view_t kv[LAYERS];
    uint16_t *k[LAYERS], *v[LAYERS];
    float q[QH * D], out[QH * D];
    uint64_t seed = 42;
    ri_status_t rc;

    if (argc < 2) {
        fprintf(stderr, "usage: %s KVSTORE_ADDRESS [TOKEN]\n", argv[0]);
        return 2;
    }
    /* RI_THREADS / RI_LOG_LEVEL, if set (the library reads no environment
     * on its own). */
    if ((rc = ri_config_from_env()) != RI_OK) {
        fprintf(stderr, "settings: %s: %s\n", ri_status_str(rc), ri_last_error());
        return 2;
    }
    ri_client_params_init(&cp);
    cp.address = argv[1];
    cp.token = argc > 2 ? argv[2] : NULL;
    if ((rc = ri_client_connect(&cp, &client)) != RI_OK) {
        fprintf(stderr, "connect: %s: %s\n", ri_status_str(rc), ri_last_error());
        return 1;
    }
    ri_session_params_init(&sp);
    sp.n_layers = LAYERS;
    sp.n_q_heads = QH;
    sp.n_kv_heads = KVH;
    sp.head_dim = D;
    sp.label = "docs/example";
    if ((rc = ri_session_create(client, &sp, &sess)) != RI_OK) {
        fprintf(stderr, "session: %s: %s\n", ri_status_str(rc), ri_last_error());
        ri_client_close(client);
        return 1;
    }
    /* head-major K/V [KVH][CAP][D] per layer, every position filled up front */
    for (int l = 0; l < LAYERS; l++) {
        k[l] = malloc(sizeof(uint16_t) * KVH * CAP * D);
        v[l] = malloc(sizeof(uint16_t) * KVH * CAP * D);
        for (size_t i = 0; i < (size_t)KVH * CAP * D; i++) {
            k[l][i] = to_half(rnd(&seed));
            v[l][i] = to_half(rnd(&seed));
        }
        kv[l] = (ri_kv_view_t){.struct_size = sizeof(ri_kv_view_t), .k = k[l], .v = v[l], .n_tokens = PROMPT,
                               .token_stride = D, .head_stride = (size_t)CAP * D};
        if ((rc = ri_prefill(sess, (uint32_t)l, &kv[l])) != RI_OK)
            goto fail;
    }
    if ((rc = ri_prefill_wait(sess)) != RI_OK)
        goto fail;
    for (int step = 0; step < STEPS; step++) {
        for (int l = 0; l < LAYERS; l++) {
            kv[l].n_tokens = PROMPT + (size_t)step + 1;  /* the new token's K/V is in place */
            for (int i = 0; i < QH * D; i++)
                q[i] = 4.0f * rnd(&seed);
            if ((rc = ri_decode(&sess, 1, (uint32_t)l, q, &kv[l], out)) != RI_OK)
                goto fail;
        }
    }
    ri_session_stats(sess, &st);
    printf("example: %llu layer-steps, %llu hits, %llu misses, %.1f KiB fetched, cache %u pages: ok\n",
           (unsigned long long)st.steps, (unsigned long long)st.hits, (unsigned long long)st.misses,
           (double)st.fetched_bytes / 1024.0, st.cache_pages);
    ri_session_close(sess);
    ri_client_close(client);
    for (int l = 0; l < LAYERS; l++) {
        free(k[l]);
        free(v[l]);
    }
    return isfinite(out[0]) ? 0 : 1;

fail:
    fprintf(stderr, "error: %s: %s\n", ri_status_str(rc), ri_last_error());
    ri_session_close(sess);
    ri_client_close(client);
    return 1;
}
