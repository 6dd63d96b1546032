/*
 * Process-wide settings shared by the programs: compute threads, log level,
 * kernel backend and the model runtime's knobs.  Libraries never read the
 * environment; a program declares these settings in its cm_config table
 * (CM_RUNTIME_LOG_ITEM, CM_RUNTIME_KERNEL_ITEMS or CM_RUNTIME_COMPUTE_ITEMS),
 * loads them with the rest
 * of its configuration and passes them down once at start-up
 * (cm_runtime_apply here, mdl_runtime_apply for the model layers).  Each
 * item also honours its historic unprefixed environment name (RI_THREADS,
 * RI_LOG_LEVEL, RI_KERNELS, RI_KERNELS_NO_SIMD, RI_MODEL_DIR,
 * RI_MODEL_AVX512, RI_MODEL_ACT, RI_MODEL_PAR_MIN), kept for compatibility;
 * the program's prefixed name and flags win over it.
 */
#ifndef CM_RUNTIME_H
#define CM_RUNTIME_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "common/cm_config.h"
#include "retroinfer/status.h"

typedef struct cm_runtime {
    int64_t threads;       /* compute threads of the default pool, caller included (0 = every CPU) */
    int64_t pool_spin_us;  /* the default pool's busy wait between loops (cm_pool_set_spin_us) */
    char *log_level;       /* error|warn|info|debug|trace ("" = leave the level as it is) */
    char *kernels;         /* kernel backend: ref|cpu|cuda ("" = best available) */
    bool kernels_no_simd;  /* CPU kernels without AVX2 (A/B checks) */
    char *model_dir;       /* directory of the named models */
    bool model_avx512;     /* AVX-512 decode products where the CPU has them */
    char *model_act;       /* activations of decode products: f32|i16|i8 */
    int64_t model_par_min; /* products under this many multiply-adds stay on the caller's thread */
    char *model_load;      /* how a model file is opened: read (huge pages) | map (shared page cache) */
} cm_runtime_t;

/* The items, for a program whose config struct `type` holds a cm_runtime_t
 * named `member`.  Apply what the table declares: cm_runtime_apply (log
 * item), with kn_runtime_apply (kernel items), or mdl_runtime_apply (all
 * items). */
#define CM_RUNTIME_ITEM_(type, member, name, ctype, def, help, field, lo, hi, env) \
    {name, ctype, def, help, offsetof(type, member) + offsetof(cm_runtime_t, field), lo, hi, env}

#define CM_RUNTIME_LOG_ITEM(type, member)                                                              \
    CM_RUNTIME_ITEM_(type, member, "log-level", CM_CFG_STRING, "",                                     \
                     "error, warn, info, debug or trace (empty = info)", log_level, 0, 0, "RI_LOG_LEVEL")

/* Threads and kernel backend: the settings of programs that run kernels. */
#define CM_RUNTIME_KERNEL_ITEMS(type, member)                                                          \
    CM_RUNTIME_ITEM_(type, member, "threads", CM_CFG_INT, "0",                                         \
                     "compute threads, the caller included (0 = every CPU)", threads, 0, 1024,         \
                     "RI_THREADS"),                                                                    \
    CM_RUNTIME_ITEM_(type, member, "pool-spin-us", CM_CFG_INT, "100",                                  \
                     "microseconds a compute thread busy-waits for the next parallel loop before it "  \
                     "sleeps, while the machine has a core to spare (0 = sleep at once)", pool_spin_us, \
                     0, 100000, "RI_POOL_SPIN_US"),                                                    \
    CM_RUNTIME_ITEM_(type, member, "kernels", CM_CFG_STRING, "",                                       \
                     "kernel backend: ref, cpu or cuda (empty = cuda where built and present, else cpu)", \
                     kernels, 0, 0, "RI_KERNELS"),                                                     \
    CM_RUNTIME_ITEM_(type, member, "kernels-no-simd", CM_CFG_BOOL, "false",                            \
                     "CPU kernels without AVX2 (comparisons)", kernels_no_simd, 0, 0,                  \
                     "RI_KERNELS_NO_SIMD")

/* The kernel items and the model runtime's: programs that run the model. */
#define CM_RUNTIME_COMPUTE_ITEMS(type, member)                                                         \
    CM_RUNTIME_KERNEL_ITEMS(type, member),                                                             \
    CM_RUNTIME_ITEM_(type, member, "model-dir", CM_CFG_STRING, "~/.cache/retroinfer/models",           \
                     "directory of the named models (--model smollm2-135m, gemma3-270m)", model_dir,   \
                     0, 0, "RI_MODEL_DIR"),                                                            \
    CM_RUNTIME_ITEM_(type, member, "model-avx512", CM_CFG_BOOL, "true",                                \
                     "AVX-512 decode products where the CPU has them", model_avx512, 0, 0,             \
                     "RI_MODEL_AVX512"),                                                               \
    CM_RUNTIME_ITEM_(type, member, "model-act", CM_CFG_STRING, "i16",                                  \
                     "activations of decode products: f32, i16 or i8", model_act, 0, 0,                \
                     "RI_MODEL_ACT"),                                                                  \
    CM_RUNTIME_ITEM_(type, member, "model-par-min", CM_CFG_INT, "524288",                              \
                     "products under this many multiply-adds (a quarter while the pool spins) stay "   \
                     "on the calling thread",                                                          \
                     model_par_min, 1, 1e12, "RI_MODEL_PAR_MIN"),                                     \
    CM_RUNTIME_ITEM_(type, member, "model-load", CM_CFG_STRING, "read",                                \
                     "how a model file is opened: read (a private copy on huge pages, faster decode) " \
                     "or map (the page cache, shared between processes)", model_load, 0, 0,           \
                     "RI_MODEL_LOAD")

/* For programs without a settings table of their own (tests, small tools):
 * defaults, then the RI_* environment names above.  On error (a bad value,
 * named in err) *rt holds no strings; on success free with cm_runtime_free. */
ri_status_t cm_runtime_from_env(cm_runtime_t *rt, char *err, size_t errlen);

/* Free the strings of rt (the struct is the caller's). */
void cm_runtime_free(cm_runtime_t *rt);

/* Apply what common/ owns: the log level (when set) and the size of the
 * default pool (before its first use).  RI_ERR_INVALID for a bad level,
 * RI_ERR_BUSY when the default pool already runs with another size; err
 * says which.  Nothing is changed on error. */
ri_status_t cm_runtime_apply(const cm_runtime_t *rt, char *err, size_t errlen);

/* How a program applies the settings: cm_runtime_apply, kn_runtime_apply
 * or mdl_runtime_apply (each applies the layers below it too, except
 * kn_runtime_apply: pair it with cm_runtime_apply). */
typedef ri_status_t (*cm_runtime_apply_fn_t)(const cm_runtime_t *rt, char *err, size_t errlen);

/* cm_runtime_from_env, apply, cm_runtime_free: the start-up of a program
 * without a settings table.  Errors as those calls (err says which). */
ri_status_t cm_runtime_setup_from_env(cm_runtime_apply_fn_t apply, char *err, size_t errlen);

#endif /* CM_RUNTIME_H */
