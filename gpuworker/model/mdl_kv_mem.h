/*
 * What of a sequence's K/V cache is really in memory, and giving back the
 * part a backend no longer reads.  The retroinfer-remote backend uploads the
 * retrieval zone of each layer to the kvstore (after prefill, and every
 * update) and from then on reads only the steady zone (sinks and the recent
 * tokens); the pages holding the uploaded tokens are returned to the system,
 * so the worker keeps the steady zone, not the whole K/V.  The arrays keep
 * their addresses (views stay valid): a released token reads as zeros, so
 * only a backend that never reads those tokens again may release them.
 */
#ifndef MDL_KV_MEM_H
#define MDL_KV_MEM_H

#include <stddef.h>
#include <stdint.h>

#include "gpuworker/model/mdl_attn.h"

/* Give back the memory of tokens [t0, t1) of layer (every KV head, K and
 * V): the whole pages inside that range.  Returns the bytes given back. */
uint64_t mdl_kv_release(mdl_kv_t *kv, uint32_t layer, size_t t0, size_t t1);

/* Bytes of the cache's K and V arrays resident in memory now (the kernel's
 * page table, not our bookkeeping). */
uint64_t mdl_kv_resident_bytes(const mdl_kv_t *kv);

#endif /* MDL_KV_MEM_H */
