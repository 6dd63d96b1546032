/* The process-wide settings a program passes to the model and the layers
 * under it (see mdl_model.h: mdl_runtime_apply). */
#include <stdio.h>
#include <string.h>

#include "gpuworker/model/mdl_gguf.h"
#include "gpuworker/model/mdl_model.h"
#include "gpuworker/model/mdl_quant.h"
#include "gpuworker/model/mdl_vec.h"
#include "kernels/kn_ops.h"

static ri_status_t mdl_runtime_act(const char *name, mdl_act_mode_t *mode_p)
{
    static const struct {
        const char *name;
        mdl_act_mode_t mode;
    } modes[] = {{"f32", MDL_ACT_F32}, {"i16", MDL_ACT_I16}, {"i8", MDL_ACT_I8}};
    if (name == NULL || name[0] == '\0') {
        *mode_p = MDL_ACT_I16;
        return RI_OK;
    }
    for (size_t i = 0; i < sizeof(modes) / sizeof(modes[0]); i++) {
        if (strcmp(name, modes[i].name) == 0) {
            *mode_p = modes[i].mode;
            return RI_OK;
        }
    }
    return RI_ERR_INVALID;
}

ri_status_t mdl_runtime_apply(const cm_runtime_t *rt, char *err, size_t errlen)
{
    mdl_act_mode_t act;
    ri_status_t st;

    if (mdl_runtime_act(rt->model_act, &act) != RI_OK) {
        snprintf(err, errlen, "model-act (RI_MODEL_ACT) '%s' is not one of f32, i16, i8", rt->model_act);
        return RI_ERR_INVALID;
    }
    bool load_map = rt->model_load != NULL && strcmp(rt->model_load, "map") == 0;
    if (rt->model_load != NULL && rt->model_load[0] != '\0' && !load_map && strcmp(rt->model_load, "read") != 0) {
        snprintf(err, errlen, "model-load (RI_MODEL_LOAD) '%s' is not one of read, map", rt->model_load);
        return RI_ERR_INVALID;
    }
    if (mdl_model_set_dir(rt->model_dir) != RI_OK) {
        snprintf(err, errlen, "model-dir (RI_MODEL_DIR) is too long");
        return RI_ERR_RANGE;
    }
    st = cm_runtime_apply(rt, err, errlen);
    if (st != RI_OK)
        return st;
    st = kn_runtime_apply(rt, err, errlen);
    if (st != RI_OK)
        return st;
    mdl_quant_set_act(act);
    mdl_quant_set_avx512(rt->model_avx512);
    mdl_vec_set_avx512(rt->model_avx512);
    mdl_quant_set_par_min((size_t)rt->model_par_min);
    mdl_gguf_set_load_map(load_map);
    return RI_OK;
}
