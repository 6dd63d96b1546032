/*
 * CUDA attn_decode (full attention, flash-decoding split-K) and attn_pages
 * (exact attention of one GQA group over a page list).  Decode is memory
 * bound: every K and V row is read once and used by the g query heads of its
 * group.
 *
 * Kernel: one block per work item (sequence, KV head, run of 256..1024
 * tokens sized so every SM gets ~16 blocks; for pages: one page or a
 * 1024-token run of a long page).  A second kernel merges the partials of
 * each group by log-sum-exp.  Supported: g <= 8, d <= 256; other shapes
 * fall back through the wrappers.  Two kernels do the first part:
 *
 *   vec (d = 64, 128, 256; rows and pointers 16-byte aligned): a lane holds
 *     8 dims of a row, loaded as one 16-byte load, so d / 8 lanes cover a
 *     token and a warp takes 32 / (d / 8) tokens at once; each lane group
 *     loads U tokens' K and V rows before any arithmetic (U x 32 bytes in
 *     flight per lane), reduces the g dot products over its d / 8 lanes
 *     only, and rescales its online softmax once per U tokens.  On an H200
 *     the first kernel below reached 12-23% of HBM bandwidth: one token per
 *     warp, 2-byte loads and g full-warp reductions per token made it
 *     issue-bound.
 *   general (every other d): each warp walks every KN_CU_WARPS-th token of
 *     the item (lane i holds d/32 consecutive dims, 1, 2, 4 or 8), keeps an
 *     online softmax per query head.
 *
 * In both the warps merge in shared memory into one (o, lse) partial.
 */
#include <stdlib.h>
#include <string.h>

#include "kernels/cuda/kn_cuda_vec.cuh"

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

/* The vec kernel (kn_cuda_vec.cuh): one item a block, LPT = d / 8. */
template <int G, int LPT, int U>
static __global__ void __launch_bounds__(32 * KN_CU_WARPS)
kn_cu_decode_vec_kernel(const kn_cu_item *items, const float *q, float scale, float *part_o,
                        float *part_lse)
{
    typedef kn_cu_vacc<G, LPT, U> acc_t;
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int slot = lane / LPT, c0 = (lane % LPT) * 8;
    const kn_cu_item it = items[blockIdx.x];
    __shared__ kn_cu_vshared<G, acc_t::D> sh;
    acc_t a;

    a.init(q + (size_t)it.q_row * acc_t::D, scale, c0);
    for (int base = warp * acc_t::TPW * U; base < it.n; base += KN_CU_WARPS * acc_t::TPW * U) {
        const __half *kp[U], *vp[U];
        bool ok[U];
        for (int u = 0; u < U; u++) {
            const int t = base + u * acc_t::TPW + slot;
            ok[u] = t < it.n;
            kp[u] = it.k + (size_t)(ok[u] ? t : 0) * it.stride + c0;
            vp[u] = it.v + (size_t)(ok[u] ? t : 0) * it.stride + c0;
        }
        a.round(kp, vp, ok);
    }
    a.finish(sh, lane, warp, c0, part_o, part_lse, (size_t)it.part);
}

/* Merge n_split partials per group row: partial rows [(first + s) * g + h]
 * (one block a (group, head); kn_cu_merge_parts). */
static __global__ void __launch_bounds__(KN_CU_MERGE_THREADS)
kn_cu_split_merge_kernel(const float *part_o, const float *part_lse, const int *first, const int *n_split,
                         int g, int d, float *out, float *lse)
{
    const int grp = blockIdx.x, h = blockIdx.y;
    const kn_cu_parts p = {part_o, part_lse, (size_t)first[grp] * g + h, (size_t)g, n_split[grp]};
    kn_cu_merge_parts(&p, 1, d, out + ((size_t)grp * g + h) * d, lse + (size_t)grp * g + h);
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

template <int G>
static void kn_cu_launch_vec_g(int d, int n_items, const kn_cu_item *items, const float *q,
                               float scale, float *po, float *pl, cudaStream_t st)
{
    constexpr int U = KN_CU_VEC_U(G);
    dim3 grid(n_items), block(32 * KN_CU_WARPS);
    switch (d) {
    case 64: kn_cu_decode_vec_kernel<G, 8, U><<<grid, block, 0, st>>>(items, q, scale, po, pl); break;
    case 128: kn_cu_decode_vec_kernel<G, 16, U><<<grid, block, 0, st>>>(items, q, scale, po, pl); break;
    default: kn_cu_decode_vec_kernel<G, 32, U><<<grid, block, 0, st>>>(items, q, scale, po, pl); break;
    }
}

/* The vec kernel takes d = 64, 128, 256 with every row 16-byte aligned. */
static bool kn_cu_vec_ok(int d, const kn_cu_item *items, size_t n_items)
{
    if (!kn_cu_vec_dim(d))
        return false;
    for (size_t i = 0; i < n_items; i++)
        if (((uintptr_t)items[i].k | (uintptr_t)items[i].v) % 16 != 0 || items[i].stride % 8 != 0)
            return false;
    return true;
}

static void kn_cu_launch_vec(int g, int d, int n_items, const kn_cu_item *items, const float *q,
                             float scale, float *po, float *pl, cudaStream_t st)
{
    switch (g) {
    case 1: kn_cu_launch_vec_g<1>(d, n_items, items, q, scale, po, pl, st); break;
    case 2: kn_cu_launch_vec_g<2>(d, n_items, items, q, scale, po, pl, st); break;
    case 3: kn_cu_launch_vec_g<3>(d, n_items, items, q, scale, po, pl, st); break;
    case 4: kn_cu_launch_vec_g<4>(d, n_items, items, q, scale, po, pl, st); break;
    case 5: kn_cu_launch_vec_g<5>(d, n_items, items, q, scale, po, pl, st); break;
    case 6: kn_cu_launch_vec_g<6>(d, n_items, items, q, scale, po, pl, st); break;
    case 7: kn_cu_launch_vec_g<7>(d, n_items, items, q, scale, po, pl, st); break;
    default: kn_cu_launch_vec_g<8>(d, n_items, items, q, scale, po, pl, st); break;
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
 * [n_groups][g][d] and lse [n_groups][g] (NULL: not wanted), host or device.
 * The items, the split table and a host query travel in one copy, and the
 * device scratch is one allocation: each runtime call costs microseconds,
 * which is the whole budget of a short decode. */
static void kn_cu_run(kn_cu_call_t *c, int g, int d, float scale, const float *q, size_t q_rows,
                      const kn_cu_item *items, size_t n_items, const int *first,
                      const int *n_split, size_t n_groups, float *out, float *lse)
{
    const bool q_dev = kn_cu_on_device(q);
    const size_t b_items = (n_items * sizeof(kn_cu_item) + 15) / 16 * 16;
    const size_t b_tab = (n_groups * sizeof(int) + 15) / 16 * 16;
    const size_t b_q = q_dev ? 0 : q_rows * d * sizeof(float);
    const size_t n_in = b_items + 2 * b_tab + b_q;
    const size_t n_po = (n_items + 1) * g * d, n_pl = (n_items + 1) * g;
    const size_t n_out = n_groups * g * d, n_lse = n_groups * g;
    char *blob = (char *)malloc(n_in + 1);
    const char *din;
    float *scr;

    if (blob == NULL) {
        c->st = RI_ERR_NOMEM;
        return;
    }
    memcpy(blob, items, n_items * sizeof(kn_cu_item));
    memcpy(blob + b_items, first, n_groups * sizeof(int));
    memcpy(blob + b_items + b_tab, n_split, n_groups * sizeof(int));
    if (!q_dev)
        memcpy(blob + b_items + 2 * b_tab, q, b_q);
    din = (const char *)kn_cu_in(c, blob, n_in);
    scr = (float *)kn_cu_alloc(c, (n_po + n_pl + n_out + n_lse) * sizeof(float));
    if (c->st == RI_OK && n_groups > 0) {
        const kn_cu_item *ditems = (const kn_cu_item *)din;
        const int *dfirst = (const int *)(din + b_items), *dns = (const int *)(din + b_items + b_tab);
        const float *dq = q_dev ? q : (const float *)(din + b_items + 2 * b_tab);
        float *po = scr, *pl = po + n_po, *dout = pl + n_pl, *dlse = dout + n_out;
        if (n_items > 0 && kn_cu_vec_ok(d, items, n_items))
            kn_cu_launch_vec(g, d, (int)n_items, ditems, dq, scale, po, pl, c->s);
        else if (n_items > 0)
            kn_cu_launch(g, kn_cu_dpl(d), (int)n_items, ditems, dq, d, scale, po, pl, c->s);
        kn_cu_split_merge_kernel<<<dim3((unsigned)n_groups, (unsigned)g), KN_CU_MERGE_THREADS, 0, c->s>>>(
            po, pl, dfirst, dns, g, d, dout, dlse);
        kn_cu_check_launch(c, "decode launch");
        kn_cu_out(c, out, dout, n_out * sizeof(float));
        if (lse != NULL)
            kn_cu_out(c, lse, dlse, n_lse * sizeof(float));
    }
    /* the copy in is asynchronous from pageable memory only after the
     * runtime has staged it, so the host blob may go now */
    free(blob);
}

bool kn_cuda_attn_shape_ok(const kn_shape_t *shape)
{
    return shape != NULL && kn_shape_valid(shape) &&
           shape->n_q_heads / shape->n_kv_heads <= KN_CU_MAXG && shape->head_dim <= 256;
}

/* Blocks of the vec kernel for (g, d) that fit on one SM at once. */
template <int G>
static int kn_cu_vec_resident_g(int d)
{
    constexpr int U = KN_CU_VEC_U(G);
    int n = 0;
    cudaError_t e = d == 64    ? cudaOccupancyMaxActiveBlocksPerMultiprocessor(&n, kn_cu_decode_vec_kernel<G, 8, U>,
                                                                              32 * KN_CU_WARPS, 0)
                  : d == 128 ? cudaOccupancyMaxActiveBlocksPerMultiprocessor(&n, kn_cu_decode_vec_kernel<G, 16, U>,
                                                                              32 * KN_CU_WARPS, 0)
                             : cudaOccupancyMaxActiveBlocksPerMultiprocessor(&n, kn_cu_decode_vec_kernel<G, 32, U>,
                                                                              32 * KN_CU_WARPS, 0);
    if (e != cudaSuccess) {
        cudaGetLastError();
        return 2;
    }
    return n > 0 ? n : 1;
}

static int kn_cu_vec_resident(int g, int d)
{
    static int cache[KN_CU_MAXG + 1][3];  /* racing threads compute the same value */
    const int di = d == 64 ? 0 : (d == 128 ? 1 : 2);
    if (cache[g][di] == 0) {
        int n;
        switch (g) {
        case 1: n = kn_cu_vec_resident_g<1>(d); break;
        case 2: n = kn_cu_vec_resident_g<2>(d); break;
        case 3: n = kn_cu_vec_resident_g<3>(d); break;
        case 4: n = kn_cu_vec_resident_g<4>(d); break;
        case 5: n = kn_cu_vec_resident_g<5>(d); break;
        case 6: n = kn_cu_vec_resident_g<6>(d); break;
        case 7: n = kn_cu_vec_resident_g<7>(d); break;
        default: n = kn_cu_vec_resident_g<8>(d); break;
        }
        cache[g][di] = n;
    }
    return cache[g][di];
}

/* Tokens per decode item.  The vec kernel: as many items as fit on the
 * device at once (one wave, every SM full), so that each streams a long
 * run and the merge has few partials a head: the 256..1024-token items it
 * had first gave 256 to 1024 partials a head, and the merge of those took
 * 48 to 180 us of a 128K..1M decode on an H200.  The general kernel: short
 * enough that every SM gets about 16 blocks, at most KN_CU_SPLIT. */
static size_t kn_cu_split(size_t work, size_t groups, int g, int d)
{
    static int sms;
    size_t split;
    if (sms == 0 && cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0) != cudaSuccess) {
        cudaGetLastError();
        sms = 1;
    }
    if (kn_cu_vec_dim(d)) {
        /* each group's last item may be short: keep one slot a group spare,
         * so that the items never spill into a second, near-empty wave */
        const size_t slots = (size_t)sms * kn_cu_vec_resident(g, d);
        const size_t room = slots > 2 * groups ? slots - groups : slots / 2;
        split = (work + room - 1) / room;
        split = (split + 63) / 64 * 64;
        return split < KN_CU_SPLIT_MIN ? KN_CU_SPLIT_MIN : split;
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
    sp = kn_cu_split(work, n_groups, g, d);
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
