/*
 * libFuzzer target for the GGUF parser: any byte string must parse or fail
 * with a message, never crash or read out of bounds (built with
 * -fsanitize=fuzzer,address,undefined by clang; see CMakeLists.txt).  What
 * parses is walked: every tensor extent must lie inside the input.
 */
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>

#include "gpuworker/model/mdl_gguf.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    mdl_gguf_t *g = NULL;
    char err[256];
    if (mdl_gguf_open_mem(data, size, &g, err, sizeof(err)) != RI_OK)
        return 0;
    for (uint64_t i = 0; i < g->n_tensors; i++) {
        const uint8_t *p = g->tensors[i].data;
        if (p < data || p + g->tensors[i].n_bytes > data + size)
            abort();
    }
    for (uint64_t i = 0; i < g->n_kv; i++)
        if (g->kv[i].arr_str != NULL)
            for (uint64_t j = 0; j < g->kv[i].arr_n; j++)
                if ((const uint8_t *)g->kv[i].arr_str[j].ptr + g->kv[i].arr_str[j].len > data + size)
                    abort();
    mdl_gguf_close(g);
    return 0;
}
