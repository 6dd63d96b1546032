/*
 * The CUDA backend's table (library ri_kernels_cuda): every op on the
 * device, one .cu file per op family (kn_cuda_decode.cu, kn_cuda_rank.cu,
 * kn_cuda_merge.cu, kn_cuda_index.cu, kn_cuda_quest.cu, kn_cuda_wave.cu), and what each
 * takes.  kn_cuda_init() registers the table with kn_ops_register_cuda()
 * when a device is present; without one it stays out of the table and the
 * CUDA tests exit 77.  Checked on an H200 (docs/cuda.md).
 */
#include "kernels/cuda/kn_cuda_common.cuh"

extern "C" {
#include "common/cm_log.h"
#include "kernels/cuda/kn_cuda.h"
#include "kernels/kn_mem.h"
}

/* fp16 everywhere; g <= 8 and d <= 256 (registers and shared memory) for
 * every op; anything else falls back to the cpu backend through the
 * wrappers. */
static bool kn_cuda_supports(kn_op_t op, const kn_shape_t *shape, kn_dtype_t dtype)
{
    if (dtype != KN_DTYPE_F16 || shape == NULL || !kn_shape_valid(shape))
        return false;
    switch (op) {
    case KN_OP_ATTN_DECODE:
    case KN_OP_ATTN_PAGES:
        return kn_cuda_attn_shape_ok(shape);
    case KN_OP_MERGE:
    case KN_OP_INDEX_BUILD:
        return shape->head_dim <= KN_CU_MAXD;
    case KN_OP_RANK:
    case KN_OP_ESTIMATE:
    case KN_OP_QUEST_SCORE:
        return shape->n_q_heads / shape->n_kv_heads <= KN_CU_MAXG && shape->head_dim <= KN_CU_MAXD;
    case KN_OP_WAVE_STEP: /* kn_cuda_wave_step's head dims */
        return shape->n_q_heads / shape->n_kv_heads <= KN_CU_MAXG &&
               (shape->head_dim == 64 || shape->head_dim == 128 || shape->head_dim == 256);
    default:
        return false;
    }
}

static const kn_ops_t kn_cuda_table = {
    "cuda",
    kn_cuda_supports,
    kn_cuda_attn_decode,
    kn_cuda_attn_pages,
    kn_cuda_rank,
    kn_cuda_estimate,
    kn_cuda_merge,
    kn_cuda_index_build,
    kn_cuda_quest_score,
    kn_cuda_wave_step,
};

/* The ops take their scratch from the device's default pool
 * (cudaMallocAsync).  Its default release threshold is 0: every wait hands
 * the pool's memory back to the driver, and the next call maps it again,
 * a cost every decode step would pay.  Keep what the pool has grown to
 * instead (it stays at the largest step's scratch). */
static void kn_cu_keep_pool(void)
{
    cudaMemPool_t pool;
    uint64_t keep = UINT64_MAX;
    int dev = 0;
    if (cudaGetDevice(&dev) != cudaSuccess || cudaDeviceGetDefaultMemPool(&pool, dev) != cudaSuccess ||
        cudaMemPoolSetAttribute(pool, cudaMemPoolAttrReleaseThreshold, &keep) != cudaSuccess)
        cudaGetLastError();  /* no pools: kn_cu_alloc falls back to cudaMalloc */
}

/* The cuda memory space (kn_mem.h): what the table's wave_step reads. */
static const kn_mem_t kn_cuda_mem = {
    "cuda", true, kn_cuda_malloc, kn_cuda_free, kn_cuda_copy, kn_cuda_zero,
};

extern "C" ri_status_t kn_cuda_init(void)
{
    int count = 0, driver = 0, runtime = 0;
    cudaError_t e = cudaGetDeviceCount(&count);
    if (e != cudaSuccess || count == 0) {
        /* Say why when a driver is installed: one older than the runtime
         * (linked statically) would otherwise look like no GPU at all.  No
         * driver (version 0): a machine without GPU, nothing to say. */
        cudaDriverGetVersion(&driver);
        cudaRuntimeGetVersion(&runtime);
        if (driver != 0 && e != cudaSuccess)
            cm_warn("CUDA backend not registered: %s (driver API %d, runtime %d)",
                    cudaGetErrorString(e), driver, runtime);
        cudaGetLastError();
        return RI_ERR_NO_DEVICE;
    }
    kn_cu_keep_pool();
    kn_mem_register_cuda(&kn_cuda_mem);
    kn_ops_register_cuda(&kn_cuda_table);
    kn_ops_register_cuda_fused(kn_cuda_rank_estimate); /* kn_wave reads the centroids once */
    return RI_OK;
}
