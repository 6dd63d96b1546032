/*
 * CUDA attn_decode (full attention, flash-decoding split-K) and attn_pages
 * (exact attention of one GQA group over a page list).  Decode is memory
 * bound: every K and V row is read once and used by the g query heads of its
 * group.
 *
 * Kernel: one block per work item (sequence, KV head, run of 256..1024
 * tokens sized so every SM gets ~16 blocks; for pages: one page or a
 * 1024-token run of a long page).  Each
 * warp walks every KN_CU_WARPS-th token of the item (lane i holds d/32
 * consecutive dims), keeps an online softmax per query head, and the warps
 * merge in shared memory into one (o, lse) partial.  A second kernel merges
 * the partials of each group by log-sum-exp.  Supported: g <= 8, d <= 256
 * (a lane holds 1, 2, 4 or 8 dims; a d between those widths leaves the top
 * lanes' extra dims idle); other shapes fall back through the wrappers.
 */
#include <stdlib.h>
#include <string.h>

#include "kernels/cuda/kn_cuda_common.cuh"

#define KN_CU_WARPS 4
#define KN_CU_SPLIT 1024  /* longest run of one item (pages, and the decode split's cap) */
#define KN_CU_SPLIT_MIN 256

struct kn_cu_item {
    const __half *k, *v;  /* row of the first token of the item, this KV head */
    long long stride;     /* elements between tokens */
    int n;                /* tokens in the item */
    int q_row;            /* first query row of the group */
    int part;             /* partial index (partial rows part*G .. +G) */
};

template <int G, int DPL>
static __global__ void kn_cu_decode_kernel(const kn_cu_item *items, const float *q, int d,
                                           float scale, float *part_o, float *part_lse)
{
    /* lane holds dims lane*DPL .. +DPL; those at or past d (d < 32*DPL) are
     * zero in q and never loaded or stored */
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, c0 = lane * DPL;
    const kn_cu_item it = items[blockIdx.x];
    float qr[G][DPL], acc[G][DPL], m[G], l[G];
    __shared__ float sh_m[KN_CU_WARPS][G], sh_l[KN_CU_WARPS][G];
    __shared__ float sh_acc[KN_CU_WARPS][G][DPL * 32];

    for (int h = 0; h < G; h++) {
        for (int i = 0; i < DPL; i++) {
            qr[h][i] = c0 + i < d ? q[(size_t)(it.q_row + h) * d + c0 + i] * scale : 0.0f;
            acc[h][i] = 0.0f;
        }
        m[h] = -INFINITY;
        l[h] = 0.0f;
    }
    /* the next row's loads are issued before this row's arithmetic, so each
     * warp keeps two K/V rows in flight */
    float kf[DPL], vf[DPL], kn[DPL], vn[DPL];
    if (warp < it.n)
        for (int i = 0; i < DPL; i++) {
            kn[i] = c0 + i < d ? __half2float(it.k[(size_t)warp * it.stride + c0 + i]) : 0.0f;
            vn[i] = c0 + i < d ? __half2float(it.v[(size_t)warp * it.stride + c0 + i]) : 0.0f;
        }
    for (int t = warp; t < it.n; t += KN_CU_WARPS) {
        const int tn = t + KN_CU_WARPS;
        for (int i = 0; i < DPL; i++) {
            kf[i] = kn[i];
            vf[i] = vn[i];
        }
        if (tn < it.n)
            for (int i = 0; i < DPL; i++) {
                kn[i] = c0 + i < d ? __half2float(it.k[(size_t)tn * it.stride + c0 + i]) : 0.0f;
                vn[i] = c0 + i < d ? __half2float(it.v[(size_t)tn * it.stride + c0 + i]) : 0.0f;
            }
        for (int h = 0; h < G; h++) {
            float s = 0.0f;
            for (int i = 0; i < DPL; i++)
                s += qr[h][i] * kf[i];
            s = kn_cu_warp_sum(s);
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
            if (c0 + i < d)
                part_o[((size_t)it.part * G + h) * d + c0 + i] = den > 0.0f ? o[i] / den : 0.0f;
        if (lane == 0)
            part_lse[(size_t)it.part * G + h] = den > 0.0f ? mm + logf(den) : -INFINITY;
    }
}

/* Merge n_split partials per group row: partial rows [(first + s) * g + h]. */
static __global__ void kn_cu_split_merge_kernel(const float *part_o, const float *part_lse,
                                                const int *first, const int *n_split, int g,
                                                int d, float *out, float *lse)
{
    const int grp = blockIdx.x, h = blockIdx.y;
    const int f = first[grp], ns = n_split[grp];
    float mm = -INFINITY, den = 0.0f;
    for (int s = 0; s < ns; s++)
        mm = fmaxf(mm, part_lse[(size_t)(f + s) * g + h]);
    if (mm != -INFINITY)
        for (int s = 0; s < ns; s++) {
            float x = part_lse[(size_t)(f + s) * g + h];
            den += x == -INFINITY ? 0.0f : __expf(x - mm);
        }
    for (int i = threadIdx.x; i < d; i += blockDim.x) {
        float o = 0.0f;
        if (mm != -INFINITY)
            for (int s = 0; s < ns; s++) {
                float x = part_lse[(size_t)(f + s) * g + h];
                if (x != -INFINITY)
                    o += __expf(x - mm) * part_o[((size_t)(f + s) * g + h) * d + i];
            }
        out[((size_t)grp * g + h) * d + i] = den > 0.0f ? o / den : 0.0f;
    }
    if (threadIdx.x == 0)
        lse[(size_t)grp * g + h] = den > 0.0f ? mm + logf(den) : -INFINITY;
}

template <int G>
static void kn_cu_launch_g(int dpl, int n_items, const kn_cu_item *items, const float *q, int d,
                           float scale, float *po, float *pl, cudaStream_t st)
{
    dim3 grid(n_items), block(32 * KN_CU_WARPS);
    switch (dpl) {
    case 1: kn_cu_decode_kernel<G, 1><<<grid, block, 0, st>>>(items, q, d, scale, po, pl); break;
    case 2: kn_cu_decode_kernel<G, 2><<<grid, block, 0, st>>>(items, q, d, scale, po, pl); break;
    case 4: kn_cu_decode_kernel<G, 4><<<grid, block, 0, st>>>(items, q, d, scale, po, pl); break;
    default: kn_cu_decode_kernel<G, 8><<<grid, block, 0, st>>>(items, q, d, scale, po, pl); break;
    }
}

static void kn_cu_launch(int g, int dpl, int n_items, const kn_cu_item *items, const float *q,
                         int d, float scale, float *po, float *pl, cudaStream_t st)
{
    switch (g) {
    case 1: kn_cu_launch_g<1>(dpl, n_items, items, q, d, scale, po, pl, st); break;
    case 2: kn_cu_launch_g<2>(dpl, n_items, items, q, d, scale, po, pl, st); break;
    case 3: kn_cu_launch_g<3>(dpl, n_items, items, q, d, scale, po, pl, st); break;
    case 4: kn_cu_launch_g<4>(dpl, n_items, items, q, d, scale, po, pl, st); break;
    case 5: kn_cu_launch_g<5>(dpl, n_items, items, q, d, scale, po, pl, st); break;
    case 6: kn_cu_launch_g<6>(dpl, n_items, items, q, d, scale, po, pl, st); break;
    case 7: kn_cu_launch_g<7>(dpl, n_items, items, q, d, scale, po, pl, st); break;
    default: kn_cu_launch_g<8>(dpl, n_items, items, q, d, scale, po, pl, st); break;
    }
}

/* Dims per lane: the smallest instantiated width that covers d (<= 256). */
static int kn_cu_dpl(int d)
{
    return d <= 32 ? 1 : (d <= 64 ? 2 : (d <= 128 ? 4 : 8));
}

/* Run the split-K kernels over items described on the host (pointers
 * already on the device) and write (o, lse) of n_groups groups to out
 * [n_groups][g][d] and lse [n_groups][g] (NULL: not wanted), host or device. */
static void kn_cu_run(kn_cu_call_t *c, int g, int d, float scale, const float *q, size_t q_rows,
                      const kn_cu_item *items, size_t n_items, const int *first,
                      const int *n_split, size_t n_groups, float *out, float *lse)
{
    const float *dq = (const float *)kn_cu_in(c, q, q_rows * d * sizeof(float));
    float *po = (float *)kn_cu_alloc(c, (n_items + 1) * g * d * sizeof(float));
    float *pl = (float *)kn_cu_alloc(c, (n_items + 1) * g * sizeof(float));
    float *dout = (float *)kn_cu_alloc(c, n_groups * g * d * sizeof(float));
    float *dlse = (float *)kn_cu_alloc(c, n_groups * g * sizeof(float));
    const kn_cu_item *ditems = (const kn_cu_item *)kn_cu_in(c, items, n_items * sizeof(kn_cu_item));
    const int *dfirst = (const int *)kn_cu_in(c, first, n_groups * sizeof(int));
    const int *dns = (const int *)kn_cu_in(c, n_split, n_groups * sizeof(int));

    if (c->st != RI_OK || n_groups == 0)
        return;
    if (n_items > 0)
        kn_cu_launch(g, kn_cu_dpl(d), (int)n_items, ditems, dq, d, scale, po, pl, c->s);
    kn_cu_split_merge_kernel<<<dim3((unsigned)n_groups, (unsigned)g), 128, 0, c->s>>>(
        po, pl, dfirst, dns, g, d, dout, dlse);
    kn_cu_check_launch(c, "decode launch");
    kn_cu_out(c, out, dout, n_groups * g * d * sizeof(float));
    if (lse != NULL)
        kn_cu_out(c, lse, dlse, n_groups * g * sizeof(float));
}

bool kn_cuda_attn_shape_ok(const kn_shape_t *shape)
{
    return shape != NULL && kn_shape_valid(shape) &&
           shape->n_q_heads / shape->n_kv_heads <= KN_CU_MAXG && shape->head_dim <= 256;
}

/* Tokens per decode item: short enough that every SM gets about 16 blocks
 * (a 128K-token, 8-head layer in 1024-token items fills an H200's 132 SMs
 * only 8 deep), long enough that an item streams, at most KN_CU_SPLIT. */
static size_t kn_cu_split(size_t work)
{
    static int sms;
    size_t split;
    if (sms == 0 && cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0) != cudaSuccess) {
        cudaGetLastError();
        sms = 1;
    }
    split = work / ((size_t)sms * 16 + 1);
    split = (split + 63) / 64 * 64;
    return split < KN_CU_SPLIT_MIN ? KN_CU_SPLIT_MIN : (split > KN_CU_SPLIT ? KN_CU_SPLIT : split);
}

ri_status_t kn_cuda_attn_decode(const kn_shape_t *shape, size_t n_seq, const float *q,
                                const kn_kv_view_t *kv, float *out, float *lse)
{
    int d = (int)shape->head_dim, nkv = (int)shape->n_kv_heads, g = (int)(shape->n_q_heads / nkv);
    size_t n_items = 0, n_groups = n_seq * nkv, it = 0, work = 0, sp;
    int *first = (int *)calloc(n_groups + 1, sizeof(int)), *ns = (int *)calloc(n_groups + 1, sizeof(int));
    kn_cu_item *items = NULL;
    kn_cu_call_t c;

    kn_cu_begin(&c);
    for (size_t s = 0; s < n_seq; s++)
        work += kv[s].n_tokens * nkv;
    sp = kn_cu_split(work);
    for (size_t s = 0; s < n_seq; s++)
        n_items += (size_t)nkv * ((kv[s].n_tokens + sp - 1) / sp + 1);
    items = (kn_cu_item *)calloc(n_items + 1, sizeof(kn_cu_item));
    if (!first || !ns || !items) {
        c.st = RI_ERR_NOMEM;
        goto out;
    }
    for (size_t s = 0; s < n_seq && c.st == RI_OK; s++) {
        size_t span = kv[s].n_tokens ? (kv[s].n_tokens - 1) * kv[s].token_stride +
                                           (size_t)(nkv - 1) * kv[s].head_stride + d : 0;
        const __half *dk = (const __half *)kn_cu_in(&c, kv[s].k, span * sizeof(cm_fp16_t));
        const __half *dv = (const __half *)kn_cu_in(&c, kv[s].v, span * sizeof(cm_fp16_t));
        for (int h = 0; h < nkv && c.st == RI_OK; h++) {
            size_t n = kv[s].n_tokens, nsplit = n ? (n + sp - 1) / sp : 0;
            size_t grp = s * nkv + h;
            first[grp] = (int)it;
            ns[grp] = (int)nsplit;  /* 0 splits: the merge writes o = 0, lse = -inf */
            for (size_t i = 0; i < nsplit; i++, it++) {
                size_t t0 = i * sp, t1 = n < t0 + sp ? n : t0 + sp;
                size_t off = (size_t)h * kv[s].head_stride + t0 * kv[s].token_stride;
                items[it].k = dk + off;
                items[it].v = dv + off;
                items[it].stride = (long long)kv[s].token_stride;
                items[it].n = (int)(t1 - t0);
                items[it].q_row = (int)(s * shape->n_q_heads + (size_t)h * g);
                items[it].part = (int)it;
            }
        }
    }
    kn_cu_run(&c, g, d, kn_shape_scale(shape), q, n_seq * shape->n_q_heads, items, it, first, ns,
              n_groups, out, lse);
out:
    kn_cu_end(&c);
    free(first);
    free(ns);
    free(items);
    return c.st;
}

/* Device pages are read where they are (one or more items per page); host
 * pages are gathered on the host into one contiguous span first (a GPU
 * worker's execution buffer would play that role on the device).  Checking
 * where each page lives costs a driver lookup per page; on_device_known
 * skips it for callers that know all pages are device memory. */
static ri_status_t kn_cu_attn_pages(const kn_shape_t *grp, const float *q, const kn_page_t *pages,
                                    size_t n_pages, bool on_device_known, float *o, float *lse)
{
    size_t n = 0, n_items = 0, it = 0, r = 0, d = grp->head_dim;
    bool on_dev = true;
    kn_cu_item *items = NULL;
    cm_fp16_t *hk = NULL, *hv = NULL;
    int first = 0, ns;
    kn_cu_call_t c;

    kn_cu_begin(&c);
    for (size_t p = 0; p < n_pages; p++) {
        n += pages[p].n_tokens;
        n_items += (pages[p].n_tokens + KN_CU_SPLIT - 1) / KN_CU_SPLIT;
        if (pages[p].n_tokens && on_dev && !on_device_known)
            on_dev = kn_cu_on_device(pages[p].k) && kn_cu_on_device(pages[p].v);
    }
    if (!on_dev)
        n_items = (n + KN_CU_SPLIT - 1) / KN_CU_SPLIT;
    items = (kn_cu_item *)calloc(n_items + 1, sizeof(kn_cu_item));
    if (items == NULL) {
        c.st = RI_ERR_NOMEM;
        goto out;
    }
    if (on_dev) {
        for (size_t p = 0; p < n_pages; p++)
            for (uint32_t t0 = 0; t0 < pages[p].n_tokens; t0 += KN_CU_SPLIT, it++) {
                uint32_t t1 = pages[p].n_tokens - t0 < KN_CU_SPLIT ? pages[p].n_tokens : t0 + KN_CU_SPLIT;
                items[it].k = (const __half *)pages[p].k + (size_t)t0 * pages[p].stride;
                items[it].v = (const __half *)pages[p].v + (size_t)t0 * pages[p].stride;
                items[it].stride = pages[p].stride;
                items[it].n = (int)(t1 - t0);
                items[it].part = (int)it;
            }
    } else {
        const __half *dk, *dv;
        hk = (cm_fp16_t *)malloc((n + 1) * d * sizeof(cm_fp16_t));
        hv = (cm_fp16_t *)malloc((n + 1) * d * sizeof(cm_fp16_t));
        if (hk == NULL || hv == NULL) {
            c.st = RI_ERR_NOMEM;
            goto out;
        }
        for (size_t p = 0; p < n_pages; p++)
            for (uint32_t i = 0; i < pages[p].n_tokens; i++, r++) {
                memcpy(hk + r * d, pages[p].k + (size_t)i * pages[p].stride, d * sizeof(cm_fp16_t));
                memcpy(hv + r * d, pages[p].v + (size_t)i * pages[p].stride, d * sizeof(cm_fp16_t));
            }
        dk = (const __half *)kn_cu_in(&c, hk, n * d * sizeof(cm_fp16_t));
        dv = (const __half *)kn_cu_in(&c, hv, n * d * sizeof(cm_fp16_t));
        for (size_t t0 = 0; t0 < n && c.st == RI_OK; t0 += KN_CU_SPLIT, it++) {
            size_t t1 = n - t0 < KN_CU_SPLIT ? n : t0 + KN_CU_SPLIT;
            items[it].k = dk + t0 * d;
            items[it].v = dv + t0 * d;
            items[it].stride = (long long)d;
            items[it].n = (int)(t1 - t0);
            items[it].part = (int)it;
        }
    }
    ns = (int)it;
    kn_cu_run(&c, (int)grp->n_q_heads, (int)d, kn_shape_scale(grp), q, grp->n_q_heads, items, it,
              &first, &ns, 1, o, lse);
out:
    kn_cu_end(&c);  /* waits before the host copies are freed */
    free(hk);
    free(hv);
    free(items);
    return c.st;
}

ri_status_t kn_cuda_attn_pages(const kn_shape_t *grp, const float *q, const kn_page_t *pages,
                               size_t n_pages, float *o, float *lse)
{
    return kn_cu_attn_pages(grp, q, pages, n_pages, false, o, lse);
}

extern "C" ri_status_t kn_cuda_attn_pages_device(const kn_shape_t *grp, const float *q,
                                                 const kn_page_t *pages, size_t n_pages, float *o,
                                                 float *lse)
{
    if (!kn_cuda_attn_shape_ok(grp) || grp->n_kv_heads != 1 || !q || !o || !lse ||
        (n_pages && !pages))
        return RI_ERR_INVALID;
    return kn_cu_attn_pages(grp, q, pages, n_pages, true, o, lse);
}
