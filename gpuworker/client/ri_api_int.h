/*
 * The worker's own way into libretroinfer (not exported): the model
 * runtime's "retroinfer-remote" backend hands a session the wave index
 * settings whole, as kernels' kn_wave_params_t, rather than through the
 * public struct's mirror of a subset of them, and reads back what the
 * session's index runs with.  The public API stays the only way for
 * engines outside the project.
 */
#ifndef RI_API_INT_H
#define RI_API_INT_H

#include "kernels/kn_wave.h"
#include "retroinfer/retroinfer.h"

/* ri_session_create with the wave settings taken from wave (copied) in place
 * of params' wave fields; params gives the geometry, the block cache, the
 * kvstore hints, deadline_us and flags.  Errors as ri_session_create. */
ri_status_t gw_api_session_create(ri_client_h client, const ri_session_params_t *params,
                                  const kn_wave_params_t *wave, ri_session_h *session_p);

/* The settings layer's index runs with (borrowed, valid while the session
 * lives; tokens_per_cluster resolved once the layer is built), or NULL for
 * a bad session or layer. */
const kn_wave_params_t *gw_api_session_wave(ri_session_h session, uint32_t layer);

/* The wave index of (layer, kv_head) once built (borrowed, valid until
 * the next build or update), NULL before or for bad arguments: what a
 * worker publishes prefix blocks from. */
const kn_index_t *gw_api_session_index(ri_session_h session, uint32_t layer, uint32_t kv_head);

/* The kvstore session id the session uses now (0 for NULL). */
uint64_t gw_api_session_id(ri_session_h session);

/* The client's control channel (borrowed: valid until ri_client_close;
 * thread-safe) and its call deadline, for the prefix-only sessions of
 * gw_prefix_seq.h. */
struct gw_ctl;
struct gw_ctl *gw_api_client_ctl(ri_client_h client, uint32_t *timeout_ms_p);

#endif /* RI_API_INT_H */
