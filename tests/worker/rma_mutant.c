/*
 * Mutant for test_direct_isolation (test_direct_isolation_rma_mutant):
 * preloaded into ri-kvstore, it turns RMA back on in every UCX context the
 * daemon makes.  With RMA on, UCX over TCP answers a peer's one-sided get
 * from whatever address it names, so the test's TCP-only attacker reads
 * alice's cluster with a key of its own making, and the test must fail.
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <string.h>
#include <ucp/api/ucp.h>

typedef ucs_status_t (*rma_mutant_init_t)(unsigned, unsigned, const ucp_params_t *, const ucp_config_t *,
                                          ucp_context_h *);

ucs_status_t ucp_init_version(unsigned api_major_version, unsigned api_minor_version, const ucp_params_t *params,
                              const ucp_config_t *config, ucp_context_h *context_p);

ucs_status_t ucp_init_version(unsigned api_major_version, unsigned api_minor_version, const ucp_params_t *params,
                              const ucp_config_t *config, ucp_context_h *context_p)
{
    rma_mutant_init_t real;
    void *sym = dlsym(RTLD_NEXT, "ucp_init_version");
    ucp_params_t p = *params;

    memcpy(&real, &sym, sizeof(real));
    if (real == NULL)
        return UCS_ERR_UNSUPPORTED;
    if (p.field_mask & UCP_PARAM_FIELD_FEATURES)
        p.features |= UCP_FEATURE_RMA;
    return real(api_major_version, api_minor_version, &p, config, context_p);
}
