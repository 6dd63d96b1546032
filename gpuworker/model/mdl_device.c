/*
 * The decode devices of this build (mdl_device.h).  MDL_HAVE_DEV is set when
 * the device engine (ri_model_dev) is built and linked: this file is the one
 * place that asks.  Without it only the CPU exists, so every function that
 * takes a non-NULL device is unreachable.
 */
#include "gpuworker/model/mdl_device.h"

#include <stdio.h>
#include <string.h>

#include "common/cm_alloc.h"
#include "common/cm_log.h"
#include "common/cm_status.h"
#include "gpuworker/model/mdl_attn.h"
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

bool mdl_device_takes(const char *name, const char *attn)
{
    if (name == NULL || strcmp(name, "cpu") == 0)
        return true;
    if (strcmp(name, "cuda") != 0 || attn == NULL)
        return false;
    if (strcmp(attn, "full") == 0 || strcmp(attn, "retroinfer") == 0)
        return true;
    const mdl_attn_ops_t *ops = mdl_attn_find(attn); /* a registered backend that reads device memory */
    return ops != NULL && ops->device_ok;
}

const char *mdl_device_attns(const char *name)
{
    static _Thread_local char buf[512];
    if (name == NULL || strcmp(name, "cpu") == 0)
        return "every backend";
    /* the engine's own two, then the registered backends that declare
     * device_ok (mdl_attn_names: comma-separated) */
    size_t n = (size_t)snprintf(buf, sizeof(buf), "full, retroinfer");
    const char *all = mdl_attn_names();
    while (all != NULL && *all != '\0' && n < sizeof(buf)) {
        const char *end = strchr(all, ',');
        size_t len = end != NULL ? (size_t)(end - all) : strlen(all);
        char one[64];
        if (len > 0 && len < sizeof(one)) {
            memcpy(one, all, len);
            one[len] = '\0';
            const mdl_attn_ops_t *ops = mdl_attn_find(one);
            if (ops != NULL && ops->device_ok)
                n += (size_t)snprintf(buf + n, sizeof(buf) - n, ", %s", one);
        }
        all = end != NULL ? end + 1 : NULL;
        while (all != NULL && *all == ' ')
            all++;
    }
    return buf;
}

ri_status_t mdl_device_seq_adopt(mdl_device_t *dev, const mdl_seq_t *cpu, const char *attn,
                                 const mdl_attn_cfg_t *cfg, void **dseq_p)
{
    *dseq_p = NULL;
    if (dev == NULL)
        return RI_OK;
    void *ds = NULL;
    ri_status_t st = mdl_device_seq_new(dev, attn, cfg, mdl_seq_cap(cpu), &ds);
#ifdef MDL_HAVE_DEV
    if (st == RI_OK && (st = mdl_dev_seq_upload(dev->d, ds, cpu)) != RI_OK)
        mdl_dev_seq_destroy(ds);
#else
    (void)cpu;
#endif
    if (st == RI_OK)
        *dseq_p = ds;
    return st;
}

ri_status_t mdl_device_seq_new(mdl_device_t *dev, const char *attn, const mdl_attn_cfg_t *cfg, size_t cap,
                               void **dseq_p)
{
    *dseq_p = NULL;
    if (dev == NULL)
        return RI_OK;
#ifdef MDL_HAVE_DEV
    char err[256] = "";
    mdl_dev_seq_t *ds = NULL;
    ri_status_t st = mdl_dev_seq_create_attn(dev->d, cap, attn, cfg, &ds, err, sizeof(err));
    if (st != RI_OK && err[0] != '\0')
        cm_error("%s device sequence: %s", dev->name, err);
    if (st == RI_OK)
        *dseq_p = ds;
    return st;
#else
    (void)attn;
    (void)cfg;
    (void)cap;
    return RI_ERR_NO_DEVICE;
#endif
}

ri_status_t mdl_device_seq_load(mdl_device_t *dev, void *dseq, const mdl_seq_t *cpu)
{
    if (dev == NULL || dseq == NULL)
        return RI_ERR_INVALID;
#ifdef MDL_HAVE_DEV
    return mdl_dev_seq_load(dev->d, dseq, cpu);
#else
    (void)cpu;
    return RI_ERR_NO_DEVICE;
#endif
}

ri_status_t mdl_device_prefill(mdl_device_t *dev, void *dseq, const int32_t *tokens, size_t n, float *logits)
{
    if (dev == NULL || dseq == NULL)
        return RI_ERR_INVALID;
#ifdef MDL_HAVE_DEV
    return mdl_dev_prefill(dev->d, dseq, tokens, n, logits);
#else
    (void)tokens;
    (void)n;
    (void)logits;
    return RI_ERR_NO_DEVICE;
#endif
}

ri_status_t mdl_device_seq_download(mdl_device_t *dev, const void *dseq, mdl_seq_t *cpu)
{
    if (dev == NULL || dseq == NULL)
        return RI_ERR_INVALID;
#ifdef MDL_HAVE_DEV
    return mdl_dev_seq_download(dev->d, dseq, cpu);
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
