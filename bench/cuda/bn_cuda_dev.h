/*
 * Device helpers of ri-bench-cuda (bn_cuda_dev.cu), callable from C: device
 * memory, copies, the HBM bandwidth reference and the device's description.
 * Every function returns 0 or -1 (the CUDA error printed).
 */
#ifndef BN_CUDA_DEV_H
#define BN_CUDA_DEV_H

#include <stddef.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Device name, memory (GiB), SM count and clock of device 0. */
int bn_cu_describe(char *name, size_t name_len, double *mem_gib, int *sms, int *clock_mhz);

/* Device memory of bytes; caller frees with bn_cu_free. */
int bn_cu_alloc(void **p, size_t bytes);
void bn_cu_free(void *p);

/* Host -> device copy. */
int bn_cu_upload(void *dst, const void *src, size_t bytes);

/* HBM bandwidth of `bytes` of device memory, GB/s (1e9 bytes/s), median of
 * reps timed with events: a streaming read kernel (16-byte loads, one sum per
 * thread so the loads are not dropped) and a device-to-device cudaMemcpy
 * (read + write bytes counted). */
int bn_cu_hbm_bw(size_t bytes, int reps, double *read_gbs, double *copy_gbs);

/* Evict the device's L2 (a 256 MiB streaming read), as the CPU bench flushes
 * its caches before each timed call. */
int bn_cu_flush(void);

#ifdef __cplusplus
}
#endif

#endif /* BN_CUDA_DEV_H */
