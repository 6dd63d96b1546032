/*
 * Synthetic K/V generator (kn_synth.h; the model is written up in
 * docs/synthetic-kv.md).  Per KV head h, with logit scale 1/sqrt(d):
 *
 *   k_t = mu_h + C_LR * U_h z_t + SIGMA * eps_t + b(t) * u_h   (ordinary tokens;
 *         heavy hitters keep only (1 - hh_coherence) of the U_h z_t term)
 *   k_t = mu_h + 2 (b1 + 2) s                                 (t < n_sinks; logit b1 + 2)
 *   z_t = rho z_{t-1} + sqrt(1 - rho^2) xi_t                    (slow drift)
 *   q   = sqrt(d) * (u_h + 0.15 p + 0.5 o_h + 0.5 s)            (per query head)
 *
 * u_h is the head's "relevant" direction (mostly outside span(U_h)), s the
 * sink direction shared by all heads, o_h a query offset direction that keys
 * only vary along through noise (queries out of the key distribution).
 * b(t) is a per-token boost in logit units: b1 for a tier-1 heavy hitter,
 * b2 for tier 2, 0 otherwise, derived so that the tiers hold the requested
 * softmax mass in expectation (the base logit noise is shared by all tiers
 * and cancels).  Diffuse heads get no boosts.  Needles get b1 + 6 (above any heavy hitter plus its noise).
 */
#include <math.h>
#include <string.h>

#include "common/cm_status.h"
#include "kernels/kn_internal.h"
#include "kernels/kn_synth.h"

#define KN_SYN_RANK 8
#define KN_SYN_C_LR 8.0f
#define KN_SYN_SIGMA 0.7f

void kn_synth_params_default(kn_synth_params_t *p)
{
    memset(p, 0, sizeof(*p));
    p->n_q_heads = 32;
    p->n_kv_heads = 8;
    p->head_dim = 128;
    p->n_tokens = 8192;
    p->seed = 1;
    p->tier1_frac = 0.01f;
    p->tier1_mass = 0.90f;
    p->tier2_frac = 0.02f;
    p->tier12_mass = 0.97f;
    p->diffuse_frac = 0.25f;
    p->hh_coherence = 0.7f;
    p->drift = 1.0f / 2048.0f;
    p->n_sinks = 4;
}

/* Approximately standard normal: sum of four 16-bit uniforms (Irwin-Hall),
 * cheap and deterministic. */
static inline float kn_gauss(uint64_t *st)
{
    uint64_t r = kn_splitmix64(st);
    float s = (float)(r & 0xFFFF) + (float)((r >> 16) & 0xFFFF) + (float)((r >> 32) & 0xFFFF) +
              (float)(r >> 48);
    return (s / 65536.0f - 2.0f) * 1.7320508f;
}

static void kn_rand_unit(uint64_t *st, float *x, uint32_t d)
{
    double n = 0.0;
    for (uint32_t i = 0; i < d; i++) {
        x[i] = kn_gauss(st);
        n += (double)x[i] * x[i];
    }
    for (uint32_t i = 0; i < d; i++)
        x[i] = (float)(x[i] / sqrt(n));
}

/* x -= frac * (x . e) e, then normalise. */
static void kn_remove(float *x, const float *e, uint32_t d, float frac)
{
    double dot = 0.0, n = 0.0;
    for (uint32_t i = 0; i < d; i++)
        dot += (double)x[i] * e[i];
    for (uint32_t i = 0; i < d; i++) {
        x[i] -= (float)(frac * dot) * e[i];
        n += (double)x[i] * x[i];
    }
    for (uint32_t i = 0; i < d; i++)
        x[i] = (float)(x[i] / sqrt(n));
}

static uint64_t kn_stream(uint64_t seed, uint64_t a, uint64_t b)
{
    uint64_t st = seed ^ (a * 0xD6E8FEB86659FD93ull) ^ (b * 0xA0761D6478BD642Full);
    return kn_splitmix64(&st);
}

/* Directions of KV head h (all derived from the seed): s, u, o, U[r]. */
typedef struct kn_syn_head {
    float *s, *u, *o, *mu, *U;  /* U: [rank][d] */
    float b1, b2;               /* boosts (0 for a diffuse head) */
} kn_syn_head_t;

bool kn_synth_head_diffuse(const kn_synth_params_t *p, uint32_t h)
{
    /* spread the diffuse heads evenly: head h is diffuse when the running
     * count floor((h+1)*frac) steps up at h */
    return floorf((float)(h + 1) * p->diffuse_frac) > floorf((float)h * p->diffuse_frac);
}

static void kn_syn_head_make(const kn_synth_params_t *p, uint32_t h, kn_syn_head_t *hd)
{
    uint32_t d = p->head_dim;
    uint64_t st = kn_stream(p->seed, 0x51AC, 0);
    float f0 = 1.0f - p->tier1_frac - p->tier2_frac, rest = 1.0f - p->tier12_mass, spread;

    kn_rand_unit(&st, hd->s, d);  /* shared by all heads: same stream */
    st = kn_stream(p->seed, 0x4EAD, h);
    for (uint32_t r = 0; r < KN_SYN_RANK; r++)
        kn_rand_unit(&st, hd->U + (size_t)r * d, d);
    kn_rand_unit(&st, hd->u, d);
    for (uint32_t r = 0; r < KN_SYN_RANK; r++)
        kn_remove(hd->u, hd->U + (size_t)r * d, d, 0.8f);
    kn_remove(hd->u, hd->s, d, 1.0f);
    kn_rand_unit(&st, hd->o, d);
    for (uint32_t r = 0; r < KN_SYN_RANK; r++)
        kn_remove(hd->o, hd->U + (size_t)r * d, d, 1.0f);
    kn_remove(hd->o, hd->u, d, 1.0f);
    kn_remove(hd->o, hd->s, d, 1.0f);
    for (uint32_t i = 0; i < d; i++)
        hd->mu[i] = kn_gauss(&st);
    if (kn_synth_head_diffuse(p, h)) {
        hd->b1 = hd->b2 = 0.0f;
        return;
    }
    /* Heavy hitters keep less of the low-rank term, so their logits vary
     * less: E[e^x] is smaller by exp(v_lr (1 - (1-c)^2) / 2), where v_lr is
     * the variance the low-rank term adds to a logit.  Add that back so the
     * tiers hold the requested mass. */
    double v_lr = 0.0, keep = 1.0 - p->hh_coherence;
    for (uint32_t r = 0; r < KN_SYN_RANK; r++) {
        double dot = 0.0;
        for (uint32_t i = 0; i < d; i++)
            dot += (double)hd->U[(size_t)r * d + i] * (hd->u[i] + 0.5 * hd->o[i] + 0.5 * hd->s[i]);
        v_lr += (double)KN_SYN_C_LR * KN_SYN_C_LR * dot * dot;
    }
    hd->b1 = logf(p->tier1_mass * f0 / (rest * p->tier1_frac)) + (float)(v_lr * (1 - keep * keep) / 2);
    hd->b2 = logf((p->tier12_mass - p->tier1_mass) * f0 / (rest * p->tier2_frac)) +
             (float)(v_lr * (1 - keep * keep) / 2);
    /* sparse heads vary around the median one: factor 0.85 .. 1.15 */
    spread = p->n_kv_heads > 1 ? 0.85f + 0.3f * (float)h / (float)(p->n_kv_heads - 1) : 1.0f;
    hd->b1 *= spread;
    hd->b2 *= spread;
}

size_t kn_synth_needle_pos(const kn_synth_params_t *p, uint32_t i)
{
    size_t pos = (size_t)((double)p->needle_depths[i] * (double)p->n_tokens);
    pos = CM_MAX(pos, (size_t)p->n_sinks);
    return CM_MIN(pos, p->n_tokens ? p->n_tokens - 1 : 0);
}

typedef struct kn_syn_job {
    const kn_synth_params_t *p;
    cm_fp16_t *k, *v;
    size_t ts, hs;
    _Atomic int status;
} kn_syn_job_t;

static void kn_syn_task(void *arg, size_t begin, size_t end, unsigned worker)
{
    kn_syn_job_t *job = arg;
    const kn_synth_params_t *p = job->p;
    uint32_t d = p->head_dim;
    float rho = 1.0f - p->drift, innov = sqrtf(1.0f - rho * rho);
    (void)worker;
    for (size_t h = begin; h < end; h++) {
        float *buf = cm_malloc(&kn_tag, (size_t)(5 + KN_SYN_RANK) * d * sizeof(float) +
                                            KN_SYN_RANK * sizeof(float));
        kn_syn_head_t hd;
        float *row, *z;
        uint64_t st;
        if (buf == NULL) {
            atomic_store(&job->status, RI_ERR_NOMEM);
            return;
        }
        hd.s = buf;
        hd.u = buf + d;
        hd.o = buf + 2 * d;
        hd.mu = buf + 3 * d;
        row = buf + 4 * d;
        hd.U = buf + 5 * d;
        z = hd.U + (size_t)KN_SYN_RANK * d;
        kn_syn_head_make(p, (uint32_t)h, &hd);
        st = kn_stream(p->seed, 0x70CE, h);
        for (uint32_t r = 0; r < KN_SYN_RANK; r++)
            z[r] = kn_gauss(&st);
        for (size_t t = 0; t < p->n_tokens; t++) {
            cm_fp16_t *kr = job->k + h * job->hs + t * job->ts;
            cm_fp16_t *vr = job->v + h * job->hs + t * job->ts;
            uint64_t tr = kn_splitmix64(&st);
            float u01 = (float)(tr >> 40) / (float)(1u << 24), b;
            for (uint32_t r = 0; r < KN_SYN_RANK; r++)
                z[r] = rho * z[r] + innov * kn_gauss(&st);
            b = u01 < p->tier1_frac ? hd.b1 : (u01 < p->tier1_frac + p->tier2_frac ? hd.b2 : 0.0f);
            float lrw = KN_SYN_C_LR * (b > 0.0f ? 1.0f - p->hh_coherence : 1.0f);
            if (t < p->n_sinks) {
                for (uint32_t i = 0; i < d; i++)
                    row[i] = hd.mu[i] + 2.0f * (hd.b1 + 2.0f) * hd.s[i] + 0.1f * kn_gauss(&st);
            } else {
                for (uint32_t i = 0; i < d; i++) {
                    float lr = 0.0f;
                    for (uint32_t r = 0; r < KN_SYN_RANK; r++)
                        lr += hd.U[(size_t)r * d + i] * z[r];
                    row[i] = hd.mu[i] + lrw * lr + KN_SYN_SIGMA * kn_gauss(&st) + b * hd.u[i];
                }
            }
            cm_f32_to_fp16_n(kr, row, d);
            for (uint32_t i = 0; i < d; i++)
                row[i] = kn_gauss(&st);
            cm_f32_to_fp16_n(vr, row, d);
        }
        /* needles: a key far along u (above every heavy hitter), a loud value */
        for (uint32_t i = 0; i < p->n_needles; i++) {
            size_t t = kn_synth_needle_pos(p, i);
            cm_fp16_t *kr = job->k + h * job->hs + t * job->ts;
            cm_fp16_t *vr = job->v + h * job->hs + t * job->ts;
            float nb = (hd.b1 > 0 ? hd.b1 : logf((float)p->n_tokens)) + 6.0f;
            for (uint32_t j = 0; j < d; j++)
                row[j] = hd.mu[j] + nb * hd.u[j] + 0.1f * kn_gauss(&st);
            cm_f32_to_fp16_n(kr, row, d);
            for (uint32_t j = 0; j < d; j++)
                row[j] = (j + i) % 2 ? 4.0f : -4.0f;
            cm_f32_to_fp16_n(vr, row, d);
        }
        cm_free(buf);
    }
}

static bool kn_synth_valid(const kn_synth_params_t *p)
{
    kn_shape_t sh = {p ? p->n_q_heads : 0, p ? p->n_kv_heads : 0, p ? p->head_dim : 0, 0};
    return p && kn_shape_valid(&sh) && p->tier1_frac > 0 && p->tier2_frac > 0 &&
           p->tier1_frac + p->tier2_frac < 1 && p->tier1_mass > 0 &&
           p->tier12_mass > p->tier1_mass && p->tier12_mass < 1 && p->drift > 0 && p->drift < 1 &&
           p->hh_coherence >= 0 && p->hh_coherence <= 1 &&
           (p->n_needles == 0 || p->needle_depths != NULL);
}

ri_status_t kn_synth_kv(const kn_synth_params_t *p, cm_fp16_t *k, cm_fp16_t *v,
                        size_t token_stride, size_t head_stride)
{
    kn_syn_job_t job = {.p = p, .k = k, .v = v, .ts = token_stride, .hs = head_stride};
    if (!kn_synth_valid(p) || (p->n_tokens && (!k || !v)) || token_stride < p->head_dim)
        return RI_ERR_INVALID;
    atomic_init(&job.status, RI_OK);
    cm_pool_parallel_for(kn_pool(), p->n_kv_heads, 1, kn_syn_task, &job);
    return (ri_status_t)atomic_load(&job.status);
}

ri_status_t kn_synth_query(const kn_synth_params_t *p, uint64_t step, float *q)
{
    uint32_t d, g;
    float *buf;
    if (!kn_synth_valid(p) || q == NULL)
        return RI_ERR_INVALID;
    d = p->head_dim;
    g = p->n_q_heads / p->n_kv_heads;
    buf = cm_malloc(&kn_tag, (size_t)(5 + KN_SYN_RANK) * d * sizeof(float) + KN_SYN_RANK * sizeof(float));
    if (buf == NULL)
        return RI_ERR_NOMEM;
    for (uint32_t h = 0; h < p->n_kv_heads; h++) {
        kn_syn_head_t hd = {.s = buf, .u = buf + d, .o = buf + 2 * d, .mu = buf + 3 * d,
                            .U = buf + 5 * d};
        float *pert = buf + 4 * d, sq = sqrtf((float)d);
        kn_syn_head_make(p, h, &hd);
        for (uint32_t j = 0; j < g; j++) {
            uint64_t st = kn_stream(p->seed ^ 0x9u, step + 1, (uint64_t)h * g + j);
            float *qr = q + ((size_t)h * g + j) * d;
            kn_rand_unit(&st, pert, d);
            for (uint32_t i = 0; i < d; i++)
                qr[i] = sq * (hd.u[i] + 0.15f * pert[i] + 0.5f * hd.o[i] + 0.5f * hd.s[i]);
        }
    }
    cm_free(buf);
    return RI_OK;
}
