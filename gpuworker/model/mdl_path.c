/* Where the models live, and the names --model takes (see mdl_model.h:
 * mdl_model_default_path, mdl_model_resolve). */
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "gpuworker/model/mdl_model.h"

/* Names --model takes instead of a path, and their files in the model
 * directory (the setup hooks install them there). */
static const struct {
    const char *name;
    const char *file;
} mdl_known[] = {
    {"smollm2-135m", MDL_DEFAULT_MODEL_FILE},
    {"gemma3-270m", MDL_GEMMA3_MODEL_FILE},
};

static char mdl_model_dir[PATH_MAX];   /* mdl_model_set_dir; "" = none set */

ri_status_t mdl_model_set_dir(const char *dir)
{
    if (dir == NULL)
        dir = "";
    if (strlen(dir) >= sizeof(mdl_model_dir))
        return RI_ERR_RANGE;
    snprintf(mdl_model_dir, sizeof(mdl_model_dir), "%s", dir);
    return RI_OK;
}

static ri_status_t mdl_model_dir_path(const char *file, char *buf, size_t len)
{
    int n = snprintf(buf, len, "%s/%s", mdl_model_dir[0] ? mdl_model_dir : "(no model dir set)", file);
    if (n < 0 || (size_t)n >= len)
        return RI_ERR_RANGE;
    if (mdl_model_dir[0] == '\0')
        return RI_ERR_NOT_FOUND;
    struct stat sb;
    return stat(buf, &sb) == 0 ? RI_OK : RI_ERR_NOT_FOUND;
}

ri_status_t mdl_model_default_path(char *buf, size_t len)
{
    return mdl_model_dir_path(MDL_DEFAULT_MODEL_FILE, buf, len);
}

ri_status_t mdl_model_resolve(const char *name, char *buf, size_t len)
{
    if (name == NULL || name[0] == '\0')
        return mdl_model_default_path(buf, len);
    for (size_t i = 0; i < sizeof(mdl_known) / sizeof(mdl_known[0]); i++)
        if (strcmp(name, mdl_known[i].name) == 0)
            return mdl_model_dir_path(mdl_known[i].file, buf, len);
    int n = snprintf(buf, len, "%s", name);
    if (n < 0 || (size_t)n >= len)
        return RI_ERR_RANGE;
    struct stat sb;
    return stat(buf, &sb) == 0 ? RI_OK : RI_ERR_NOT_FOUND;
}

const char *mdl_model_names(void)
{
    return "smollm2-135m (default), gemma3-270m";
}
