/*
 * The CUDA backend of kernels/ (library ri_kernels_cuda): full decode
 * (flash-decoding split-K) and exact attention over pages on the device;
 * merge, rank, estimation, index build and Quest scores stay on the CPU
 * backend (the table points at them), as they are small or run at prefill.
 * Not yet run on a device (none on the development machine): the harness
 * runs it wherever one is present.
 *
 * Inputs may live in host or device memory: device (or managed) pointers are
 * used as they are; host K/V spans are staged through device buffers, so the
 * cross-check harness runs the same cases on every backend.  kn_cuda_init()
 * registers the backend with kn_ops_register_cuda() when a device is
 * present; without one it stays out of the table and its tests exit 77.
 *
 * Kernel: one block per (sequence, KV head, token split); each warp walks
 * the split's tokens (lane i holds d/32 consecutive dims), keeps an online
 * softmax per query head of the group, and the warps merge in shared memory.
 * A second kernel merges the splits by log-sum-exp.
 */
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

extern "C" {
#include "common/cm_log.h"
#include "kernels/cuda/kn_cuda.h"
#include "kernels/kn_ops.h"
}

#define KN_CU_WARPS 4
#define KN_CU_MAXG 8
#define KN_CU_MAXDPL 8  /* d <= 256 */

struct kn_cu_item {
    const __half *k, *v;  /* row of the first token of the split, this KV head */
    long long stride;     /* elements between tokens */
    int n;                /* tokens in the split */
    int q_row;            /* first query row of the group */
    int part;             /* partial index (group rows part*g .. +g) */
};

template <int G, int DPL>
static __global__ void kn_cu_decode_kernel(const kn_cu_item *items, const float *q, float scale,
                                           float *part_o, float *part_lse)
{
    const int d = DPL * 32, lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const kn_cu_item it = items[blockIdx.x];
    float qr[G][DPL], acc[G][DPL], m[G], l[G];
    __shared__ float sh_m[KN_CU_WARPS][G], sh_l[KN_CU_WARPS][G];
    __shared__ float sh_acc[KN_CU_WARPS][G][KN_CU_MAXDPL * 32];

    for (int h = 0; h < G; h++) {
        for (int i = 0; i < DPL; i++) {
            qr[h][i] = q[(size_t)(it.q_row + h) * d + lane * DPL + i] * scale;
            acc[h][i] = 0.0f;
        }
        m[h] = -INFINITY;
        l[h] = 0.0f;
    }
    for (int t = warp; t < it.n; t += KN_CU_WARPS) {
        const __half *kr = it.k + (size_t)t * it.stride + lane * DPL;
        const __half *vr = it.v + (size_t)t * it.stride + lane * DPL;
        float kf[DPL], vf[DPL];
        for (int i = 0; i < DPL; i++) {
            kf[i] = __half2float(kr[i]);
            vf[i] = __half2float(vr[i]);
        }
        for (int h = 0; h < G; h++) {
            float s = 0.0f;
            for (int i = 0; i < DPL; i++)
                s += qr[h][i] * kf[i];
            for (int off = 16; off > 0; off >>= 1)
                s += __shfl_xor_sync(0xffffffffu, s, off);
            if (s > m[h]) {
                float c = m[h] == -INFINITY ? 0.0f : __expf(m[h] - s);
                for (int i = 0; i < DPL; i++)
                    acc[h][i] *= c;
                l[h] *= c;
                m[h] = s;
            }
            float p = __expf(s - m[h]);
            l[h] += p;
            for (int i = 0; i < DPL; i++)
                acc[h][i] += p * vf[i];
        }
    }
    for (int h = 0; h < G; h++) {
        if (lane == 0) {
            sh_m[warp][h] = m[h];
            sh_l[warp][h] = l[h];
        }
        for (int i = 0; i < DPL; i++)
            sh_acc[warp][h][lane * DPL + i] = acc[h][i];
    }
    __syncthreads();
    if (warp != 0)
        return;
    for (int h = 0; h < G; h++) {
        float mm = -INFINITY, den = 0.0f;
        for (int w = 0; w < KN_CU_WARPS; w++)
            mm = fmaxf(mm, sh_m[w][h]);
        float o[DPL];
        for (int i = 0; i < DPL; i++)
            o[i] = 0.0f;
        if (mm != -INFINITY) {
            for (int w = 0; w < KN_CU_WARPS; w++) {
                float c = sh_m[w][h] == -INFINITY ? 0.0f : __expf(sh_m[w][h] - mm);
                den += c * sh_l[w][h];
                for (int i = 0; i < DPL; i++)
                    o[i] += c * sh_acc[w][h][lane * DPL + i];
            }
        }
        for (int i = 0; i < DPL; i++)
            part_o[((size_t)it.part * G + h) * d + lane * DPL + i] = den > 0.0f ? o[i] / den : 0.0f;
        if (lane == 0)
            part_lse[(size_t)it.part * G + h] = den > 0.0f ? mm + logf(den) : -INFINITY;
    }
}

/* Merge n_split partials per group row: part rows [(first + s) * G + h]. */
static __global__ void kn_cu_merge_kernel(const float *part_o, const float *part_lse,
                                          const int *first, const int *n_split, int g, int d,
                                          float *out, float *lse)
{
    const int grp = blockIdx.x, h = blockIdx.y;
    const int f = first[grp], ns = n_split[grp];
    float mm = -INFINITY, den = 0.0f;
    for (int s = 0; s < ns; s++)
        mm = fmaxf(mm, part_lse[(size_t)(f + s) * g + h]);
    for (int i = threadIdx.x; i < d; i += blockDim.x) {
        float o = 0.0f;
        den = 0.0f;
        if (mm != -INFINITY)
            for (int s = 0; s < ns; s++) {
                float x = part_lse[(size_t)(f + s) * g + h];
                float c = x == -INFINITY ? 0.0f : __expf(x - mm);
                den += c;
                o += c * part_o[((size_t)(f + s) * g + h) * d + i];
            }
        out[((size_t)grp * g + h) * d + i] = den > 0.0f ? o / den : 0.0f;
    }
    if (threadIdx.x == 0) {
        den = 0.0f;
        if (mm != -INFINITY)
            for (int s = 0; s < ns; s++) {
                float x = part_lse[(size_t)(f + s) * g + h];
                den += x == -INFINITY ? 0.0f : __expf(x - mm);
            }
        lse[(size_t)grp * g + h] = den > 0.0f ? mm + logf(den) : -INFINITY;
    }
}

template <int G>
static void kn_cu_launch_g(int dpl, int n_items, const kn_cu_item *items, const float *q, float scale,
                           float *po, float *pl, cudaStream_t st)
{
    dim3 grid(n_items), block(32 * KN_CU_WARPS);
    switch (dpl) {
    case 1: kn_cu_decode_kernel<G, 1><<<grid, block, 0, st>>>(items, q, scale, po, pl); break;
    case 2: kn_cu_decode_kernel<G, 2><<<grid, block, 0, st>>>(items, q, scale, po, pl); break;
    case 4: kn_cu_decode_kernel<G, 4><<<grid, block, 0, st>>>(items, q, scale, po, pl); break;
    default: kn_cu_decode_kernel<G, 8><<<grid, block, 0, st>>>(items, q, scale, po, pl); break;
    }
}

static void kn_cu_launch(int g, int dpl, int n_items, const kn_cu_item *items, const float *q,
                         float scale, float *po, float *pl, cudaStream_t st)
{
    switch (g) {
    case 1: kn_cu_launch_g<1>(dpl, n_items, items, q, scale, po, pl, st); break;
    case 2: kn_cu_launch_g<2>(dpl, n_items, items, q, scale, po, pl, st); break;
    case 3: kn_cu_launch_g<3>(dpl, n_items, items, q, scale, po, pl, st); break;
    case 4: kn_cu_launch_g<4>(dpl, n_items, items, q, scale, po, pl, st); break;
    case 5: kn_cu_launch_g<5>(dpl, n_items, items, q, scale, po, pl, st); break;
    case 6: kn_cu_launch_g<6>(dpl, n_items, items, q, scale, po, pl, st); break;
    case 7: kn_cu_launch_g<7>(dpl, n_items, items, q, scale, po, pl, st); break;
    default: kn_cu_launch_g<8>(dpl, n_items, items, q, scale, po, pl, st); break;
    }
}

static ri_status_t kn_cu_status(cudaError_t e, const char *what)
{
    if (e == cudaSuccess)
        return RI_OK;
    cm_error("CUDA %s: %s", what, cudaGetErrorString(e));
    return e == cudaErrorMemoryAllocation ? RI_ERR_NOMEM : RI_ERR_DEVICE;
}

static bool kn_cu_on_device(const void *p)
{
    cudaPointerAttributes a;
    if (cudaPointerGetAttributes(&a, p) != cudaSuccess) {
        cudaGetLastError();  /* clear: plain host memory on old runtimes */
        return false;
    }
    return a.type == cudaMemoryTypeDevice || a.type == cudaMemoryTypeManaged;
}

/* Device view of `elems` fp16 values at host or device p; *tmp_p gets a
 * buffer to free when staged. */
static ri_status_t kn_cu_stage(const cm_fp16_t *p, size_t elems, const __half **dev_p, void **tmp_p)
{
    *tmp_p = NULL;
    if (elems == 0 || kn_cu_on_device(p)) {
        *dev_p = (const __half *)p;
        return RI_OK;
    }
    ri_status_t st = kn_cu_status(cudaMalloc(tmp_p, elems * sizeof(cm_fp16_t)), "malloc");
    if (st != RI_OK)
        return st;
    st = kn_cu_status(cudaMemcpy(*tmp_p, p, elems * sizeof(cm_fp16_t), cudaMemcpyHostToDevice), "copy");
    *dev_p = (const __half *)*tmp_p;
    return st;
}

/* Run the split-K decode over groups described on the host and bring (o, lse)
 * back to host buffers out [n_groups][g][d], lse [n_groups][g] (may be NULL). */
static ri_status_t kn_cu_run(int g, int d, float scale, const float *q_host, size_t q_rows,
                             kn_cu_item *items, size_t n_items, const int *first,
                             const int *n_split, size_t n_groups, float *out, float *lse)
{
    float *dq = NULL, *po = NULL, *pl = NULL, *dout = NULL, *dlse = NULL;
    kn_cu_item *ditems = NULL;
    int *dfirst = NULL, *dns = NULL;
    ri_status_t st;

    st = kn_cu_status(cudaMalloc(&dq, q_rows * d * sizeof(float)), "malloc");
    if (st == RI_OK)
        st = kn_cu_status(cudaMalloc(&po, n_items * g * d * sizeof(float)), "malloc");
    if (st == RI_OK)
        st = kn_cu_status(cudaMalloc(&pl, n_items * g * sizeof(float)), "malloc");
    if (st == RI_OK)
        st = kn_cu_status(cudaMalloc(&dout, n_groups * g * d * sizeof(float)), "malloc");
    if (st == RI_OK)
        st = kn_cu_status(cudaMalloc(&dlse, n_groups * g * sizeof(float)), "malloc");
    if (st == RI_OK)
        st = kn_cu_status(cudaMalloc(&ditems, n_items * sizeof(kn_cu_item)), "malloc");
    if (st == RI_OK)
        st = kn_cu_status(cudaMalloc(&dfirst, n_groups * sizeof(int)), "malloc");
    if (st == RI_OK)
        st = kn_cu_status(cudaMalloc(&dns, n_groups * sizeof(int)), "malloc");
    if (st == RI_OK)
        st = kn_cu_status(cudaMemcpy(dq, q_host, q_rows * d * sizeof(float), cudaMemcpyHostToDevice), "copy");
    if (st == RI_OK)
        st = kn_cu_status(cudaMemcpy(ditems, items, n_items * sizeof(kn_cu_item), cudaMemcpyHostToDevice), "copy");
    if (st == RI_OK)
        st = kn_cu_status(cudaMemcpy(dfirst, first, n_groups * sizeof(int), cudaMemcpyHostToDevice), "copy");
    if (st == RI_OK)
        st = kn_cu_status(cudaMemcpy(dns, n_split, n_groups * sizeof(int), cudaMemcpyHostToDevice), "copy");
    if (st == RI_OK && n_items > 0) {
        kn_cu_launch(g, d / 32, (int)n_items, ditems, dq, scale, po, pl, 0);
        kn_cu_merge_kernel<<<dim3((unsigned)n_groups, (unsigned)g), 128>>>(po, pl, dfirst, dns, g, d, dout, dlse);
        st = kn_cu_status(cudaGetLastError(), "launch");
    }
    if (st == RI_OK)
        st = kn_cu_status(cudaMemcpy(out, dout, n_groups * g * d * sizeof(float), cudaMemcpyDeviceToHost), "copy");
    if (st == RI_OK && lse != NULL)
        st = kn_cu_status(cudaMemcpy(lse, dlse, n_groups * g * sizeof(float), cudaMemcpyDeviceToHost), "copy");
    cudaFree(dq);
    cudaFree(po);
    cudaFree(pl);
    cudaFree(dout);
    cudaFree(dlse);
    cudaFree(ditems);
    cudaFree(dfirst);
    cudaFree(dns);
    return st;
}

static bool kn_cu_supports(kn_op_t op, const kn_shape_t *shape, kn_dtype_t dtype)
{
    if (op != KN_OP_ATTN_DECODE && op != KN_OP_ATTN_PAGES)
        return kn_ops_cpu()->supports(op, shape, dtype);
    if (dtype != KN_DTYPE_F16 || shape == NULL || !kn_shape_valid(shape))
        return false;
    uint32_t g = shape->n_q_heads / shape->n_kv_heads, dpl = shape->head_dim / 32;
    return g <= KN_CU_MAXG && shape->head_dim % 32 == 0 &&
           (dpl == 1 || dpl == 2 || dpl == 4 || dpl == 8);
}

#define KN_CU_SPLIT 1024

static ri_status_t kn_cu_attn_decode(const kn_shape_t *shape, size_t n_seq, const float *q,
                                     const kn_kv_view_t *kv, float *out, float *lse)
{
    int d = (int)shape->head_dim, nkv = (int)shape->n_kv_heads, g = (int)(shape->n_q_heads / nkv);
    size_t n_items = 0, n_groups = n_seq * nkv, it = 0;
    void **tmp = (void **)calloc(2 * n_seq + 1, sizeof(void *));
    const __half **dk = (const __half **)calloc(n_seq + 1, sizeof(void *));
    const __half **dv = (const __half **)calloc(n_seq + 1, sizeof(void *));
    int *first = (int *)calloc(n_groups + 1, sizeof(int)), *ns = (int *)calloc(n_groups + 1, sizeof(int));
    kn_cu_item *items = NULL;
    ri_status_t st = RI_ERR_NOMEM;

    if (!tmp || !dk || !dv || !first || !ns)
        goto out;
    for (size_t s = 0; s < n_seq; s++)
        n_items += (size_t)nkv * ((kv[s].n_tokens + KN_CU_SPLIT - 1) / KN_CU_SPLIT + 1);
    items = (kn_cu_item *)calloc(n_items + 1, sizeof(kn_cu_item));
    if (items == NULL)
        goto out;
    st = RI_OK;
    for (size_t s = 0; s < n_seq && st == RI_OK; s++) {
        size_t span = kv[s].n_tokens ? (kv[s].n_tokens - 1) * kv[s].token_stride +
                                           (size_t)(nkv - 1) * kv[s].head_stride + d : 0;
        st = kn_cu_stage(kv[s].k, span, &dk[s], &tmp[2 * s]);
        if (st == RI_OK)
            st = kn_cu_stage(kv[s].v, span, &dv[s], &tmp[2 * s + 1]);
        for (int h = 0; h < nkv && st == RI_OK; h++) {
            size_t n = kv[s].n_tokens, nsplit = n ? (n + KN_CU_SPLIT - 1) / KN_CU_SPLIT : 1;
            size_t grp = s * nkv + h;
            first[grp] = (int)it;
            ns[grp] = (int)nsplit;
            for (size_t i = 0; i < nsplit; i++, it++) {
                size_t t0 = i * KN_CU_SPLIT, t1 = n < t0 + KN_CU_SPLIT ? n : t0 + KN_CU_SPLIT;
                size_t off = (size_t)h * kv[s].head_stride + t0 * kv[s].token_stride;
                items[it].k = dk[s] ? dk[s] + off : NULL;
                items[it].v = dv[s] ? dv[s] + off : NULL;
                items[it].stride = (long long)kv[s].token_stride;
                items[it].n = (int)(t1 > t0 ? t1 - t0 : 0);
                items[it].q_row = (int)(s * shape->n_q_heads + (size_t)h * g);
                items[it].part = (int)it;
            }
        }
    }
    if (st == RI_OK)
        st = kn_cu_run(g, d, kn_shape_scale(shape), q, n_seq * shape->n_q_heads, items, it, first,
                       ns, n_groups, out, lse);
out:
    for (size_t i = 0; tmp && i < 2 * n_seq; i++)
        cudaFree(tmp[i]);
    free(tmp);
    free(dk);
    free(dv);
    free(first);
    free(ns);
    free(items);
    return st;
}

/* Pages: gathered on the host into one contiguous span (the worker's
 * execution buffer plays this role on a real device), then one group. */
static ri_status_t kn_cu_attn_pages(const kn_shape_t *grp, const float *q, const kn_page_t *pages,
                                    size_t n_pages, float *o, float *lse)
{
    size_t n = 0, r = 0, d = grp->head_dim;
    cm_fp16_t *k, *v;
    kn_kv_view_t kv;
    ri_status_t st;
    for (size_t p = 0; p < n_pages; p++)
        n += pages[p].n_tokens;
    k = (cm_fp16_t *)malloc((n + 1) * d * sizeof(cm_fp16_t));
    v = (cm_fp16_t *)malloc((n + 1) * d * sizeof(cm_fp16_t));
    if (k == NULL || v == NULL) {
        free(k);
        free(v);
        return RI_ERR_NOMEM;
    }
    for (size_t p = 0; p < n_pages; p++)
        for (uint32_t i = 0; i < pages[p].n_tokens; i++, r++) {
            memcpy(k + r * d, pages[p].k + (size_t)i * pages[p].stride, d * sizeof(cm_fp16_t));
            memcpy(v + r * d, pages[p].v + (size_t)i * pages[p].stride, d * sizeof(cm_fp16_t));
        }
    kv.k = k;
    kv.v = v;
    kv.n_tokens = n;
    kv.token_stride = d;
    kv.head_stride = d;
    st = kn_cu_attn_decode(grp, 1, q, &kv, o, lse);
    free(k);
    free(v);
    return st;
}

static kn_ops_t kn_cuda_table;

extern "C" ri_status_t kn_cuda_init(void)
{
    int count = 0;
    if (cudaGetDeviceCount(&count) != cudaSuccess || count == 0) {
        cudaGetLastError();
        return RI_ERR_NO_DEVICE;
    }
    kn_cuda_table = *kn_ops_cpu();
    kn_cuda_table.name = "cuda";
    kn_cuda_table.supports = kn_cu_supports;
    kn_cuda_table.attn_decode = kn_cu_attn_decode;
    kn_cuda_table.attn_pages = kn_cu_attn_pages;
    kn_ops_register_cuda(&kn_cuda_table);
    return RI_OK;
}
