/*
 * The decode devices of this build (mdl_device.h).  MDL_HAVE_DEV is set when
 * the device engine (ri_model_dev) is built and linked: this file is the one
 * place that asks.  Without it only the CPU exists, so every function that
 * takes a non-NULL device is unreachable.
 */
#include "gpuworker/model/mdl_device.h"

#include <string.h>

#include "common/cm_alloc.h"
#include "common/cm_status.h"
#ifdef MDL_HAVE_DEV
#include "gpuworker/model/mdl_dev.h"
#endif

static CM_ALLOC_TAG(mdl_device_tag, "model.device");

struct mdl_device {
    const char *name;
#ifdef MDL_HAVE_DEV
    mdl_dev_t *d; /* owned */
#endif
};

bool mdl_device_built(const char *name)
{
#ifdef MDL_HAVE_DEV
    if (strcmp(name, "cuda") == 0)
        return true;
#endif
    return strcmp(name, "cpu") == 0;
}

const char *mdl_device_name(const mdl_device_t *dev)
{
    return dev != NULL ? dev->name : "cpu";
}

ri_status_t mdl_device_open(const char *name, const mdl_model_t *m, mdl_device_t **dev_p, char *err, size_t errlen)
{
    if (strcmp(name, "cpu") == 0) {
        *dev_p = NULL;
        return RI_OK;
    }
    if (strcmp(name, "cuda") != 0)
        return mdl_errf(err, errlen, RI_ERR_INVALID, "%.64s: unknown device (cpu or cuda)", name);
    if (!mdl_device_built(name))
        return mdl_errf(err, errlen, RI_ERR_UNSUPPORTED,
                        "cuda: this program was built without CUDA (configure with -DRI_CUDA=ON where nvcc is "
                        "installed)");
    mdl_device_t *dev = cm_calloc(&mdl_device_tag, 1, sizeof(*dev));
    if (dev == NULL)
        return RI_ERR_NOMEM;
    dev->name = "cuda";
    ri_status_t st = RI_ERR_UNSUPPORTED;
#ifdef MDL_HAVE_DEV
    st = mdl_dev_create(m, &dev->d, err, errlen);
#else
    (void)m;
#endif
    if (st != RI_OK) {
        cm_free(dev);
        return st;
    }
    *dev_p = dev;
    return RI_OK;
}

void mdl_device_close(mdl_device_t *dev)
{
    if (dev == NULL)
        return;
#ifdef MDL_HAVE_DEV
    mdl_dev_destroy(dev->d);
#endif
    cm_free(dev);
}

uint64_t mdl_device_weight_bytes(const mdl_device_t *dev)
{
#ifdef MDL_HAVE_DEV
    if (dev != NULL)
        return mdl_dev_weight_bytes(dev->d);
#else
    (void)dev;
#endif
    return 0;
}

ri_status_t mdl_device_seq_adopt(mdl_device_t *dev, const mdl_seq_t *cpu, void **dseq_p)
{
    *dseq_p = NULL;
    if (dev == NULL)
        return RI_OK;
#ifdef MDL_HAVE_DEV
    mdl_dev_seq_t *ds = NULL;
    ri_status_t st = mdl_dev_seq_create(dev->d, mdl_seq_cap(cpu), &ds);
    if (st == RI_OK && (st = mdl_dev_seq_upload(dev->d, ds, cpu)) != RI_OK)
        mdl_dev_seq_destroy(ds);
    if (st == RI_OK)
        *dseq_p = ds;
    return st;
#else
    (void)cpu;
    return RI_ERR_NO_DEVICE;
#endif
}

void mdl_device_seq_free(mdl_device_t *dev, void *dseq)
{
    (void)dev;
#ifdef MDL_HAVE_DEV
    mdl_dev_seq_destroy(dseq);
#else
    (void)dseq;
#endif
}

size_t mdl_device_seq_len(const mdl_device_t *dev, const void *dseq)
{
    (void)dev;
#ifdef MDL_HAVE_DEV
    if (dseq != NULL)
        return mdl_dev_seq_len(dseq);
#else
    (void)dseq;
#endif
    return 0;
}

ri_status_t mdl_device_decode(mdl_device_t *dev, void *const *dseqs, const int32_t *tokens, size_t n, float *logits)
{
    if (dev == NULL)
        return RI_ERR_INVALID;
#ifdef MDL_HAVE_DEV
    return mdl_dev_decode(dev->d, (mdl_dev_seq_t *const *)dseqs, tokens, n, logits);
#else
    (void)dseqs;
    (void)tokens;
    (void)n;
    (void)logits;
    return RI_ERR_NO_DEVICE;
#endif
}
