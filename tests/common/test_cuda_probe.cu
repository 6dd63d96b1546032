/*
 * Device probe: runs a tiny kernel and checks its result when a CUDA device is
 * present; exits 77 (skipped) when none is (no driver -> cudaErrorInsufficientDriver,
 * or zero devices), which is the signal every CUDA test uses to fall back.
 */
#include <cstdio>
#include <cuda_runtime.h>

static __global__ void ri_probe_kernel(float *out, int n)
{
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n)
        out[i] = 2.0f * (float)i + 1.0f;
}

int main(void)
{
    int count = 0;
    cudaError_t err = cudaGetDeviceCount(&count);
    if (err != cudaSuccess || count == 0) {
        printf("no CUDA device (%s): skipped\n", err != cudaSuccess ? cudaGetErrorString(err) : "0 devices");
        return 77;
    }
    const int n = 1000;
    float *d = nullptr, h[n];
    if (cudaMalloc(&d, n * sizeof(float)) != cudaSuccess)
        return 1;
    ri_probe_kernel<<<(n + 255) / 256, 256>>>(d, n);
    if (cudaMemcpy(h, d, sizeof(h), cudaMemcpyDeviceToHost) != cudaSuccess)
        return 1;
    cudaFree(d);
    for (int i = 0; i < n; i++) {
        if (h[i] != 2.0f * (float)i + 1.0f) {
            printf("wrong value at %d: %f\n", i, h[i]);
            return 1;
        }
    }
    printf("CUDA device ok (%d devices)\n", count);
    return 0;
}
