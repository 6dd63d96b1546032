/*
 * CUDA index_build: the segmented spherical k-means of kn_index.c on the
 * device, same contract and same algorithm step by step, so that its index
 * differs from the reference only where fp32 dot products break a near-tie
 * differently (the harness allows 1% of tokens, as for the cpu backend).
 * Workloads: prefill (up to 1M tokens per KV head: 128 segments of 8192
 * tokens, 512 clusters each) and the decode-time update (1024 tokens into 64
 * clusters, one segment).
 *
 *   centre     mu = mean(K) in double: per-chunk partial sums, then the
 *              chunks summed in order; x = K - mu in fp32
 *   init       centroid j of a segment = normalised x of the segment's
 *              token t0 + j*nt/nc (zero for a segment without tokens)
 *   assign     argmax_j x_t . c_j over the token's own segment (k-means) or
 *              its final range (all, or own segment +- final_neighbours):
 *              64 tokens x 64 centroids per block, 4x4 per thread, d in
 *              chunks of 32 through shared memory; ties go to the smaller j
 *   group      a stable radix sort of (cluster, token) (CUB): members of a
 *              cluster come out in token order, so every sum below has a
 *              fixed order and the build is deterministic (no float atomics)
 *   update     one block per cluster: sum of the members in double,
 *              c = sum / |sum|; an empty cluster keeps its centroid
 *   finish     after the final assignment: centroid = mean of the real keys
 *              (fp32 here; the host quantizes it to int8 + a scale with
 *              kn_vq_quantize, as kn_index.c does)
 *              (double, + mu), value sums in fp32 in token order (as the
 *              cpu backend), sizes, the cluster-major permutation
 *
 * All segments run in the same launches.  n == 0 (nothing to cluster: C
 * empty clusters) is filled on the host by the reference.
 */
#include <cub/device/device_radix_sort.cuh>
#include <stdlib.h>
#include <string.h>

#include "kernels/cuda/kn_cuda_common.cuh"

#define KN_CU_MEAN_CHUNK 1024
#define KN_CU_TM 64   /* tokens per assign block */
#define KN_CU_TN 64   /* centroids per tile */
#define KN_CU_TK 32   /* dims per shared-memory chunk */

/* One assign block: tokens [t0, t0+nt) against centroids [c0, c0+nc). */
struct kn_cu_asg {
    int t0, nt, c0, nc;
};

/* part[chunk][i] = sum over the chunk's tokens of K[t][i] (double). */
static __global__ void kn_cu_mean_part_kernel(const __half *k, long long stride, int n, int d,
                                              double *part)
{
    const int t0 = blockIdx.x * KN_CU_MEAN_CHUNK, t1 = min(n, t0 + KN_CU_MEAN_CHUNK);
    for (int i = threadIdx.x; i < d; i += blockDim.x) {
        double s = 0.0;
        for (int t = t0; t < t1; t++)
            s += (double)__half2float(k[(size_t)t * stride + i]);
        part[(size_t)blockIdx.x * d + i] = s;
    }
}

static __global__ void kn_cu_mean_kernel(const double *part, int chunks, int n, int d, double *mu)
{
    for (int i = threadIdx.x; i < d; i += blockDim.x) {
        double s = 0.0;
        for (int c = 0; c < chunks; c++)
            s += part[(size_t)c * d + i];
        mu[i] = s / n;
    }
}

static __global__ void kn_cu_centre_kernel(const __half *k, long long stride, int n, int d,
                                           const double *mu, float *x)
{
    size_t e = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (e >= (size_t)n * d)
        return;
    size_t t = e / d, i = e % d;
    x[e] = (float)((double)__half2float(k[t * stride + i]) - mu[i]);
}

/* cent[j] = normalised x[init[j]], or zero when init[j] < 0 (one block per cluster). */
static __global__ void kn_cu_init_kernel(const float *x, const int *init, int d, float *cent)
{
    const int j = blockIdx.x, t = init[j];
    float *c = cent + (size_t)j * d;
    double ss = 0.0;
    for (int i = threadIdx.x; i < d; i += blockDim.x) {
        float v = t < 0 ? 0.0f : x[(size_t)t * d + i];
        ss += (double)v * v;
    }
    ss = kn_cu_block_sum_d(ss);
    for (int i = threadIdx.x; i < d; i += blockDim.x) {
        float v = t < 0 ? 0.0f : x[(size_t)t * d + i];
        c[i] = ss > 0.0 ? v * (float)(1.0 / sqrt(ss)) : v;
    }
}

/* assign[t] = c0 + argmax over the block's centroid range (ties: lowest j). */
static __global__ void __launch_bounds__(256) kn_cu_assign_kernel(const float *x, const float *cent,
                                                                  int d, const kn_cu_asg *items,
                                                                  uint32_t *assign)
{
    __shared__ float xs[KN_CU_TK][KN_CU_TM + 1], cs[KN_CU_TK][KN_CU_TN + 1];
    const kn_cu_asg it = items[blockIdx.x];
    const int tx = threadIdx.x & 15, ty = threadIdx.x >> 4;
    float best[4];
    int bj[4];
    for (int a = 0; a < 4; a++) {
        best[a] = -INFINITY;
        bj[a] = 0;
    }
    for (int j0 = 0; j0 < it.nc; j0 += KN_CU_TN) {
        float acc[4][4];
        for (int a = 0; a < 4; a++)
            for (int b = 0; b < 4; b++)
                acc[a][b] = 0.0f;
        for (int k0 = 0; k0 < d; k0 += KN_CU_TK) {
            /* 64 rows x 32 dims of tokens and of centroids, zero-padded */
            for (int e = threadIdx.x; e < KN_CU_TM * KN_CU_TK; e += blockDim.x) {
                int r = e / KN_CU_TK, kk = e % KN_CU_TK, i = k0 + kk;
                xs[kk][r] = (r < it.nt && i < d) ? x[(size_t)(it.t0 + r) * d + i] : 0.0f;
                cs[kk][r] = (j0 + r < it.nc && i < d) ? cent[(size_t)(it.c0 + j0 + r) * d + i] : 0.0f;
            }
            __syncthreads();
            for (int kk = 0; kk < KN_CU_TK; kk++) {
                float xa[4], cb[4];
                for (int a = 0; a < 4; a++)
                    xa[a] = xs[kk][ty * 4 + a];
                for (int b = 0; b < 4; b++)
                    cb[b] = cs[kk][tx * 4 + b];
                for (int a = 0; a < 4; a++)
                    for (int b = 0; b < 4; b++)
                        acc[a][b] = fmaf(xa[a], cb[b], acc[a][b]);
            }
            __syncthreads();
        }
        /* ascending j within the thread: strict > keeps the lowest on ties */
        for (int b = 0; b < 4; b++) {
            int j = j0 + tx * 4 + b;
            if (j >= it.nc)
                break;
            for (int a = 0; a < 4; a++)
                if (acc[a][b] > best[a]) {
                    best[a] = acc[a][b];
                    bj[a] = j;
                }
        }
    }
    /* the 16 threads of a token row are 16 consecutive lanes of one warp */
    for (int a = 0; a < 4; a++) {
        float s = best[a];
        int j = bj[a];
        for (int off = 8; off > 0; off >>= 1) {
            float s2 = __shfl_xor_sync(0xffffffffu, s, off);
            int j2 = __shfl_xor_sync(0xffffffffu, j, off);
            if (s2 > s || (s2 == s && j2 < j)) {
                s = s2;
                j = j2;
            }
        }
        int r = ty * 4 + a;
        if (tx == 0 && r < it.nt)
            assign[it.t0 + r] = (uint32_t)(it.c0 + j);
    }
}

static __global__ void kn_cu_iota_kernel(uint32_t *v, int n)
{
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n)
        v[i] = (uint32_t)i;
}

/* start[c] / end[c] of each cluster's run in the sorted keys (both zeroed before). */
static __global__ void kn_cu_bounds_kernel(const uint32_t *key, int n, uint32_t *start,
                                           uint32_t *end)
{
    int p = blockIdx.x * blockDim.x + threadIdx.x;
    if (p >= n)
        return;
    if (p == 0 || key[p] != key[p - 1])
        start[key[p]] = (uint32_t)p;
    if (p == n - 1 || key[p] != key[p + 1])
        end[key[p]] = (uint32_t)p + 1;
}

/* Spherical update: c_j = sum / |sum| over the members, in token order. */
static __global__ void kn_cu_update_kernel(const float *x, const uint32_t *tok,
                                           const uint32_t *start, const uint32_t *end, int d,
                                           float *cent)
{
    const int j = blockIdx.x;
    const uint32_t s0 = start[j], s1 = end[j];
    double sum[KN_CU_MAXD / 64], nn = 0.0;
    if (s1 <= s0)
        return;  /* empty: keeps its centroid */
    for (int k = 0; k < KN_CU_MAXD / 64; k++) {
        int i = threadIdx.x + k * 64;
        sum[k] = 0.0;
        if (i < d)
            for (uint32_t p = s0; p < s1; p++)
                sum[k] += x[(size_t)tok[p] * d + i];
        nn += sum[k] * sum[k];
    }
    nn = kn_cu_block_sum_d(nn);
    if (nn == 0.0)
        return;
    for (int k = 0; k < KN_CU_MAXD / 64; k++) {
        int i = threadIdx.x + k * 64;
        if (i < d)
            cent[(size_t)j * d + i] = (float)(sum[k] / sqrt(nn));
    }
}

/* Final statistics of cluster j: centroid = mean of the real keys (fp32),
 * value sum (fp32, token order), size; perm[p] = token_base + token. */
static __global__ void kn_cu_finish_kernel(const float *x, const __half *v, long long stride, const uint32_t *tok,
                                           const uint32_t *start, const uint32_t *end, const double *mu, int d,
                                           float *cent_out, float *vsum_out, uint32_t *size_out)
{
    const int j = blockIdx.x;
    const uint32_t s0 = start[j], s1 = end[j], cnt = s1 > s0 ? s1 - s0 : 0;
    for (int i = threadIdx.x; i < d; i += blockDim.x) {
        double cs = 0.0;
        float vs = 0.0f;
        for (uint32_t p = s0; p < s0 + cnt; p++) {
            cs += x[(size_t)tok[p] * d + i];
            vs += __half2float(v[(size_t)tok[p] * stride + i]);
        }
        cent_out[(size_t)j * d + i] = cnt ? (float)(cs / cnt + mu[i]) : 0.0f;
        vsum_out[(size_t)j * d + i] = vs;
    }
    if (threadIdx.x == 0)
        size_out[j] = cnt;
}

static __global__ void kn_cu_perm_kernel(const uint32_t *tok, int n, uint32_t base, uint32_t *perm)
{
    int p = blockIdx.x * blockDim.x + threadIdx.x;
    if (p < n)
        perm[p] = base + tok[p];
}

/* Device state of one build. */
typedef struct kn_cu_build {
    kn_cu_call_t *c;
    int n, d, C;
    float *x, *cent;
    uint32_t *assign, *key_s, *iota, *tok, *start, *end;
    void *sort_tmp;
    size_t sort_bytes;
    int key_bits;
} kn_cu_build_t;

/* Items of 64 tokens for segments; range of segment s: [c0[s], c1[s]). */
static kn_cu_asg *kn_cu_items(uint32_t n, uint32_t S, const uint32_t *c0, const uint32_t *c1,
                              size_t *n_items_p)
{
    size_t cnt = 0, w = 0;
    kn_cu_asg *items;
    for (uint32_t s = 0; s < S; s++) {
        uint32_t t0 = (uint32_t)((uint64_t)s * n / S), t1 = (uint32_t)((uint64_t)(s + 1) * n / S);
        cnt += (t1 - t0 + KN_CU_TM - 1) / KN_CU_TM;
    }
    items = (kn_cu_asg *)malloc((cnt + 1) * sizeof(*items));
    if (items == NULL)
        return NULL;
    for (uint32_t s = 0; s < S; s++) {
        uint32_t t0 = (uint32_t)((uint64_t)s * n / S), t1 = (uint32_t)((uint64_t)(s + 1) * n / S);
        if (c1[s] <= c0[s])
            continue;  /* no centroids: only possible for a segment without tokens */
        for (uint32_t t = t0; t < t1; t += KN_CU_TM, w++) {
            items[w].t0 = (int)t;
            items[w].nt = (int)(t1 - t < KN_CU_TM ? t1 - t : KN_CU_TM);
            items[w].c0 = (int)c0[s];
            items[w].nc = (int)(c1[s] - c0[s]);
        }
    }
    *n_items_p = w;
    return items;
}

/* Assign with the given items, then group the tokens by cluster. */
static void kn_cu_assign_group(kn_cu_build_t *b, const kn_cu_asg *ditems, size_t n_items)
{
    kn_cu_call_t *c = b->c;
    if (c->st != RI_OK)
        return;
    if (n_items > 0)
        kn_cu_assign_kernel<<<(unsigned)n_items, 256, 0, c->s>>>(b->x, b->cent, b->d, ditems,
                                                                 b->assign);
    kn_cu_check_launch(c, "assign launch");
    if (c->st != RI_OK)
        return;
    c->st = kn_cu_status(cub::DeviceRadixSort::SortPairs(b->sort_tmp, b->sort_bytes, b->assign,
                                                         b->key_s, b->iota, b->tok, b->n, 0,
                                                         b->key_bits, c->s),
                         "radix sort");
    kn_cu_zero(c, b->start, (size_t)b->C * sizeof(uint32_t));
    kn_cu_zero(c, b->end, (size_t)b->C * sizeof(uint32_t));
    if (c->st != RI_OK)
        return;
    kn_cu_bounds_kernel<<<(b->n + 255) / 256, 256, 0, c->s>>>(b->key_s, b->n, b->start, b->end);
    kn_cu_check_launch(c, "bounds launch");
}

/* Upload an item list (scratch of the call). */
static const kn_cu_asg *kn_cu_items_in(kn_cu_call_t *c, uint32_t n, uint32_t S,
                                       const uint32_t *c0, const uint32_t *c1, size_t *n_items_p)
{
    kn_cu_asg *items = kn_cu_items(n, S, c0, c1, n_items_p);
    const kn_cu_asg *d;
    if (items == NULL) {
        if (c->st == RI_OK)
            c->st = RI_ERR_NOMEM;
        return NULL;
    }
    d = (const kn_cu_asg *)kn_cu_in(c, items, *n_items_p * sizeof(*items));
    if (c->st == RI_OK)  /* the copy from pageable memory is done when it returns */
        c->st = kn_cu_status(cudaStreamSynchronize(c->s), "sync");
    free(items);
    return d;
}

ri_status_t kn_cuda_index_build(const kn_build_params_t *p, const cm_fp16_t *k,
                                const cm_fp16_t *v, size_t stride, uint32_t n,
                                uint32_t token_base, uint32_t n_clusters, uint32_t n_segments,
                                kn_index_t *idx)
{
    const uint32_t d = idx->head_dim, C = n_clusters, S = n_segments;
    const size_t span = n ? ((size_t)n - 1) * stride + d : 0;
    uint32_t *c0 = NULL, *c1 = NULL, *f0 = NULL, *f1 = NULL, *sizes = NULL;
    float *cent = NULL; /* [C][d] the fp32 means, quantized on the host */
    int *init = NULL;
    size_t n_items = 0, n_fitems = 0;
    kn_cu_build_t b;
    kn_cu_call_t c;
    ri_status_t st;

    if (n == 0)
        return kn_cuda_glue_ref_index_build(p, k, v, stride, n, token_base, n_clusters, n_segments, idx);
    st = kn_cuda_glue_index_reserve(idx, C, n);
    if (st != RI_OK)
        return st;
    kn_cu_begin(&c);
    memset(&b, 0, sizeof(b));
    b.c = &c;
    b.n = (int)n;
    b.d = (int)d;
    b.C = (int)C;
    for (b.key_bits = 1; b.key_bits < 32 && (1u << b.key_bits) < C; b.key_bits++)
        ;
    c0 = (uint32_t *)malloc(4 * ((size_t)S + 1) * sizeof(uint32_t));
    init = (int *)malloc(((size_t)C + 1) * sizeof(int));
    sizes = (uint32_t *)malloc(((size_t)C + 1) * sizeof(uint32_t));
    cent = (float *)malloc(((size_t)C * d + 1) * sizeof(float));
    if (c0 == NULL || init == NULL || sizes == NULL || cent == NULL) {
        c.st = RI_ERR_NOMEM;
        goto out;
    }
    c1 = c0 + S + 1;
    f0 = c1 + S + 1;
    f1 = f0 + S + 1;
    /* the plan of kn_index.c: segment s holds tokens [t0, t1) and clusters [c0, c1) */
    for (uint32_t s = 0; s < S; s++) {
        uint32_t t0 = (uint32_t)((uint64_t)s * n / S), t1 = (uint32_t)((uint64_t)(s + 1) * n / S);
        uint32_t slo = 0, shi = S;
        c0[s] = (uint32_t)((uint64_t)s * C / S);
        c1[s] = (uint32_t)((uint64_t)(s + 1) * C / S);
        for (uint32_t j = c0[s]; j < c1[s]; j++)
            init[j] = t1 > t0 ? (int)(t0 + (uint32_t)((uint64_t)(j - c0[s]) * (t1 - t0) / (c1[s] - c0[s]))) : -1;
        if (p->final_neighbours >= 0) {
            slo = s > (uint32_t)p->final_neighbours ? s - (uint32_t)p->final_neighbours : 0;
            shi = CM_MIN(S, s + (uint32_t)p->final_neighbours + 1);
        }
        f0[s] = (uint32_t)((uint64_t)slo * C / S);
        f1[s] = (uint32_t)((uint64_t)shi * C / S);
    }
    {
        const __half *dk = (const __half *)kn_cu_in(&c, k, span * sizeof(cm_fp16_t));
        const __half *dv = (const __half *)kn_cu_in(&c, v, span * sizeof(cm_fp16_t));
        const int *dinit = (const int *)kn_cu_in(&c, init, (size_t)C * sizeof(int));
        int chunks = ((int)n + KN_CU_MEAN_CHUNK - 1) / KN_CU_MEAN_CHUNK;
        double *part = (double *)kn_cu_alloc(&c, (size_t)chunks * d * sizeof(double));
        double *mu = (double *)kn_cu_alloc(&c, (size_t)d * sizeof(double));
        float *cent_f = (float *)kn_cu_alloc(&c, (size_t)C * d * sizeof(float));
        float *vsum = (float *)kn_cu_alloc(&c, (size_t)C * d * sizeof(float));
        uint32_t *dsizes = (uint32_t *)kn_cu_alloc(&c, (size_t)C * sizeof(uint32_t));
        uint32_t *perm = (uint32_t *)kn_cu_alloc(&c, (size_t)n * sizeof(uint32_t));
        const kn_cu_asg *items, *fitems;

        b.x = (float *)kn_cu_alloc(&c, (size_t)n * d * sizeof(float));
        b.cent = (float *)kn_cu_alloc(&c, (size_t)C * d * sizeof(float));
        b.assign = (uint32_t *)kn_cu_alloc(&c, (size_t)n * sizeof(uint32_t));
        b.key_s = (uint32_t *)kn_cu_alloc(&c, (size_t)n * sizeof(uint32_t));
        b.iota = (uint32_t *)kn_cu_alloc(&c, (size_t)n * sizeof(uint32_t));
        b.tok = (uint32_t *)kn_cu_alloc(&c, (size_t)n * sizeof(uint32_t));
        b.start = (uint32_t *)kn_cu_alloc(&c, (size_t)C * sizeof(uint32_t));
        b.end = (uint32_t *)kn_cu_alloc(&c, (size_t)C * sizeof(uint32_t));
        if (c.st != RI_OK)
            goto out;
        cub::DeviceRadixSort::SortPairs(NULL, b.sort_bytes, b.assign, b.key_s, b.iota, b.tok,
                                        b.n, 0, b.key_bits, c.s);
        b.sort_tmp = kn_cu_alloc(&c, b.sort_bytes);
        items = kn_cu_items_in(&c, n, S, c0, c1, &n_items);
        fitems = kn_cu_items_in(&c, n, S, f0, f1, &n_fitems);
        if (c.st != RI_OK)
            goto out;

        /* 1. centre */
        kn_cu_mean_part_kernel<<<chunks, 128, 0, c.s>>>(dk, (long long)stride, (int)n, (int)d, part);
        kn_cu_mean_kernel<<<1, 256, 0, c.s>>>(part, chunks, (int)n, (int)d, mu);
        kn_cu_centre_kernel<<<(unsigned)(((size_t)n * d + 255) / 256), 256, 0, c.s>>>(
            dk, (long long)stride, (int)n, (int)d, mu, b.x);
        kn_cu_iota_kernel<<<(n + 255) / 256, 256, 0, c.s>>>(b.iota, (int)n);
        /* 2-3. strided init, segmented spherical k-means */
        kn_cu_init_kernel<<<C, 64, 0, c.s>>>(b.x, dinit, (int)d, b.cent);
        kn_cu_check_launch(&c, "centre launch");
        for (uint32_t it = 0; it < p->iters && c.st == RI_OK; it++) {
            kn_cu_assign_group(&b, items, n_items);
            if (c.st == RI_OK)
                kn_cu_update_kernel<<<C, 64, 0, c.s>>>(b.x, b.tok, b.start, b.end, (int)d, b.cent);
        }
        /* 4. final reassignment, statistics, permutation */
        kn_cu_assign_group(&b, fitems, n_fitems);
        if (c.st != RI_OK)
            goto out;
        kn_cu_finish_kernel<<<C, 64, 0, c.s>>>(b.x, dv, (long long)stride, b.tok, b.start, b.end,
                                               mu, (int)d, cent_f, vsum, dsizes);
        kn_cu_perm_kernel<<<(n + 255) / 256, 256, 0, c.s>>>(b.tok, (int)n, token_base, perm);
        kn_cu_check_launch(&c, "finish launch");
        kn_cu_out(&c, cent, cent_f, (size_t)C * d * sizeof(float));
        kn_cu_out(&c, idx->vsum + (size_t)idx->n_clusters * d, vsum, (size_t)C * d * sizeof(float));
        kn_cu_out(&c, sizes, dsizes, (size_t)C * sizeof(uint32_t));
        kn_cu_out(&c, idx->perm + idx->n_tokens, perm, (size_t)n * sizeof(uint32_t));
    }
out:
    kn_cu_end(&c);
    if (c.st == RI_OK) {
        /* sizes and offsets appended; the sorted order is cluster-major */
        uint32_t pos = idx->n_tokens;
        for (uint32_t j = 0; j < C; j++) {
            uint32_t gj = idx->n_clusters + j;
            kn_vq_quantize(cent + (size_t)j * d, 1.0f, d, idx->centroids + (size_t)gj * d, &idx->cscale[gj]);
            idx->sizes[gj] = sizes[j];
            if (idx->offsets[gj] != pos) /* j == 0: already n_tokens, maybe a shared home's page */
                idx->offsets[gj] = pos;
            pos += sizes[j];
            idx->offsets[gj + 1] = pos;
        }
        idx->n_clusters += C;
        idx->n_tokens += n;
    }
    free(c0);
    free(init);
    free(sizes);
    free(cent);
    return c.st;
}
