/*
 * The synthetic model's weight generator (mdl_synth.h): w = f(seed, tensor,
 * index), a counter-based draw that the CPU (GGUF writer, embedding rows)
 * and the CUDA fill kernel (gpuworker/model/cuda/mdl_dev_synth.cu) both
 * include, so that they produce the same bits.  Integer hashing and one
 * int -> float conversion and one float product (both exact or rounded to
 * nearest in C and in CUDA, with no libm and nothing an FMA contraction
 * could change); the per-tensor scale is computed once on the host and
 * passed in.
 */
#ifndef MDL_SYNTH_GEN_H
#define MDL_SYNTH_GEN_H

#include <stdint.h>

#ifdef __CUDACC__
#define MDL_SYNTH_FN static __host__ __device__ __forceinline__
#else
#define MDL_SYNTH_FN static inline
#endif

/* Draws are integers in [-2^23, 2^23): exact in a float. */
#define MDL_SYNTH_DRAW_HALF 8388608

/* splitmix64's output function of state z (the state advanced once). */
MDL_SYNTH_FN uint64_t mdl_synth_mix(uint64_t z)
{
    z += 0x9e3779b97f4a7c15ull;
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

/* Draw i of the stream key: splitmix64 of the counter key + i, its top 24
 * bits centred. */
MDL_SYNTH_FN int32_t mdl_synth_draw(uint64_t key, uint64_t i)
{
    return (int32_t)(mdl_synth_mix(key + i) >> 40) - MDL_SYNTH_DRAW_HALF;
}

/* Weight i (row-major index r * cols + c) of a matrix: draw * scale, scale
 * = amplitude / 2^23 (mdl_synth_scale). */
MDL_SYNTH_FN float mdl_synth_weight(uint64_t key, uint64_t i, float scale)
{
    return (float)mdl_synth_draw(key, i) * scale;
}

/* Element i of a norm: 1 + u / 4 with u uniform in [-1, 1) (the product is
 * exact, so one rounding). */
MDL_SYNTH_FN float mdl_synth_norm(uint64_t key, uint64_t i)
{
    return 1.0f + (float)mdl_synth_draw(key, i) * (0.25f / 8388608.0f);
}

#endif /* MDL_SYNTH_GEN_H */
