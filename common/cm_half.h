/*
 * IEEE fp16 and bfloat16 conversion.  Scalar conversions are exact (round to
 * nearest even, inf/nan/subnormals preserved); the bulk versions use F16C when
 * the CPU has it (checked once at run time) and give the same bits.
 */
#ifndef CM_HALF_H
#define CM_HALF_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

typedef uint16_t cm_fp16_t;  /* IEEE 754 binary16 bits */
typedef uint16_t cm_bf16_t;  /* bfloat16 bits */

float cm_fp16_to_f32(cm_fp16_t h);
cm_fp16_t cm_f32_to_fp16(float f);
float cm_bf16_to_f32(cm_bf16_t h);
cm_bf16_t cm_f32_to_bf16(float f);

/* Bulk conversions; src and dst must not overlap. */
void cm_fp16_to_f32_n(float *dst, const cm_fp16_t *src, size_t n);
void cm_f32_to_fp16_n(cm_fp16_t *dst, const float *src, size_t n);
void cm_bf16_to_f32_n(float *dst, const cm_bf16_t *src, size_t n);
void cm_f32_to_bf16_n(cm_bf16_t *dst, const float *src, size_t n);

/* True when the bulk fp16 paths use F16C on this CPU. */
bool cm_half_have_f16c(void);

#endif /* CM_HALF_H */
