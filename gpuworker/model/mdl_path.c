/* Where the default model lives (see mdl_model.h: mdl_model_default_path). */
#include <stdio.h>
#include <stdlib.h>
#include <sys/stat.h>

#include "gpuworker/model/mdl_model.h"

ri_status_t mdl_model_default_path(char *buf, size_t len)
{
    const char *dir = getenv("RI_MODEL_DIR");
    const char *home = getenv("HOME");
    int n;
    if (dir != NULL && dir[0] != '\0')
        n = snprintf(buf, len, "%s/%s", dir, MDL_DEFAULT_MODEL_FILE);
    else
        n = snprintf(buf, len, "%s/.cache/retroinfer/models/%s", home ? home : "/root", MDL_DEFAULT_MODEL_FILE);
    if (n < 0 || (size_t)n >= len)
        return RI_ERR_RANGE;
    struct stat sb;
    return stat(buf, &sb) == 0 ? RI_OK : RI_ERR_NOT_FOUND;
}
