/* Helpers shared by the model runtime tests: find the model or skip (77). */
#ifndef TM_UTIL_H
#define TM_UTIL_H

#include <stdio.h>
#include <stdlib.h>

#include "common/cm_runtime.h"
#include "gpuworker/model/mdl_model.h"

/* What a program does at start-up: the RI_* settings (RI_THREADS,
 * RI_KERNELS, RI_MODEL_DIR, ...) read through cm_config and passed to the
 * layers.  Exits 1 on a bad value. */
static inline void tm_runtime_setup(void)
{
    char err[256];
    if (cm_runtime_setup_from_env(mdl_runtime_apply, err, sizeof(err)) != RI_OK) {
        fprintf(stderr, "bad setting: %s\n", err);
        exit(1);
    }
}

/* Path of the model under test ($RI_TEST_MODEL or the installed default);
 * exits 77 (skipped) when it is not installed. */
static inline const char *tm_model_path_or_skip(void)
{
    static char path[4096];
    tm_runtime_setup();
    const char *env = getenv("RI_TEST_MODEL");
    if (env != NULL && env[0] != '\0') {
        snprintf(path, sizeof(path), "%s", env);
        return path;
    }
    if (mdl_model_default_path(path, sizeof(path)) != RI_OK) {
        fprintf(stderr, "skip: no model at %s (run ./ri setup or ./ri model fetch)\n", path);
        exit(77);
    }
    return path;
}

#endif /* TM_UTIL_H */
