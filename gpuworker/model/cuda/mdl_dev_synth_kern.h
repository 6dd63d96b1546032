/*
 * The device kernels of the synthetic model (mdl_dev_synth.c drives them,
 * mdl_dev_synth.cu implements them; tests/model/mdl_dev_host_kern.c has
 * host stand-ins).  Same conventions as mdl_dev_kern.h: queued on the
 * calling thread's stream, pointers to device memory.
 */
#ifndef MDL_DEV_SYNTH_KERN_H
#define MDL_DEV_SYNTH_KERN_H

#include <stddef.h>
#include <stdint.h>

#include "retroinfer/status.h"

#ifdef __cplusplus
extern "C" {
#endif

/* w [rows][ld] fp16: element (r, c < cols) = fp16(mdl_synth_weight(key,
 * r * cols + c, scale)) rounded to nearest even, the tail of each row
 * zero; mdl_synth_fill_ref is the same on the host.  Returns without
 * waiting. */
void mdl_dk_synth_fill(uint16_t *w, size_t rows, size_t cols, size_t ld, uint64_t key, float scale);

/* bytes from device src to device dst (not overlapping); queued. */
ri_status_t mdl_dk_d2d(void *dst, const void *src, size_t bytes);

#ifdef __cplusplus
}
#endif

#endif /* MDL_DEV_SYNTH_KERN_H */
