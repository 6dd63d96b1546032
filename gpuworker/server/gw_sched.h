/*
 * Continuous batching of generation requests over the model runtime's batched
 * decode (ri-worker's HTTP service, docs/worker.md "HTTP service").
 *
 * One scheduler thread owns the model (the runtime takes one model call at a
 * time per process) and runs rounds: admit waiting requests into free batch
 * slots, prefill one chunk of one newly admitted prompt, then one decode step
 * for every admitted request that has its prompt in, all sequences in one
 * mdl_decode call.  So a request joins the batch at a step boundary and
 * leaves it when it is done, and a long prompt delays the others' tokens by
 * one chunk at a time, not by its whole prefill.  Any thread submits requests
 * and waits for their text (gw_req_take); the scheduler appends text as the
 * tokens come, holding back bytes that may still turn into a stop string or
 * that end inside a UTF-8 sequence.
 *
 * ri-worker's JSON-lines mode submits here too, one request at a time, and
 * asks for each request's figures (gw_req_params_t.figures: prefill and
 * decode times, K/V memory, the remote backend's totals) and optionally a
 * second run on a copy of the prefill with another backend
 * (gw_req_params_t.compare_attn), read back with gw_req_figures and
 * gw_req_run_ids once the request is done.
 *
 * Workload: a few to a few dozen concurrent requests, prompts of up to the
 * model's context, tens to hundreds of generated tokens each.
 */
#ifndef GW_SCHED_H
#define GW_SCHED_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "common/cm_hist.h"
#include "gpuworker/client/gw_attn_remote.h"
#include "gpuworker/model/mdl_model.h"
#include "gpuworker/model/mdl_sample.h"
#include "retroinfer/status.h"

typedef struct gw_sched gw_sched_t;
typedef struct gw_req gw_req_t;

typedef struct gw_sched_cfg {
    size_t max_batch;      /* requests decoded together (>= 1) */
    size_t queue_size;     /* requests waiting for a batch slot before submit says busy (>= 1) */
    size_t prefill_chunk;  /* prompt tokens prefilled per round (a multiple of 64, the model's chunk) */
    struct mdl_device *dev; /* decode on this device (mdl_device.h, borrowed), prefill staying on
                               the CPU; full attention only.  NULL = the CPU */
    mdl_attn_cfg_t attn;   /* settings of every sequence it creates (mdl_attn_cfg_default's
                              unless the program sets them) */
    struct gw_pfx_ctx *prefix; /* prefix reuse of the "full" and "retroinfer" sequences
                                  (gw_prefix_run.h; borrowed, outlives the scheduler);
                                  NULL = off */
    size_t dense_below;    /* a "retroinfer-remote" request whose prompt + max_tokens is below
                              this many tokens decodes with full attention in the worker
                              instead (its K/V stays here, none goes to the kvstore): below the
                              remote path's break-even, its first step (index build and upload)
                              and its steps cost more than dense attention (docs/worker.md).
                              0 = never */
} gw_sched_cfg_t;

/* Why a request ended. */
typedef enum gw_finish {
    GW_FINISH_NONE = 0,    /* still running */
    GW_FINISH_STOP,        /* end-of-turn token or a stop string */
    GW_FINISH_LENGTH,      /* max_tokens or the sequence's capacity */
    GW_FINISH_ERROR,       /* the model failed (status and error say why) */
    GW_FINISH_CANCELLED,   /* gw_req_cancel, or cancelled by a shutdown */
} gw_finish_t;

/* What a request asks for.  Everything is copied by gw_req_create. */
typedef struct gw_req_params {
    const int32_t *ids;            /* prompt tokens (>= 1) */
    size_t n_ids;
    size_t max_tokens;             /* tokens to generate (>= 1) */
    mdl_sampler_cfg_t sampler;     /* temperature 0 = greedy */
    const mdl_attn_ops_t *attn;    /* attention backend (registered, lives for the process) */
    const char *const *stop;       /* stop strings (not part of the text), n_stop of them */
    size_t n_stop;
    bool ignore_eos;               /* the model's stop token does not end the generation */
    const mdl_attn_ops_t *compare_attn; /* NULL, or a second run: after the first run ends (stop or
                                           length) this backend generates again from a copy of the
                                           same prefill (mdl_seq_fork; no second prefill).  Its
                                           tokens are not part of the text: read them with
                                           gw_req_run_ids */
    bool figures;                  /* keep per-run figures (gw_req_figures).  Resets the remote
                                      backend's process-wide totals at each run's start, so only
                                      for a request that runs alone (the JSON-lines mode) */
} gw_req_params_t;

/* A snapshot of a request's progress. */
typedef struct gw_req_view {
    bool done;                 /* finished: text is complete */
    gw_finish_t finish;        /* why, once done */
    ri_status_t status;        /* RI_OK, or the error of GW_FINISH_ERROR / _CANCELLED */
    char error[256];           /* message for a failure */
    bool started;              /* admitted into the batch */
    size_t prompt_tokens;      /* tokens of the prompt */
    size_t cached_tokens;      /* of them, preloaded from cached prefix blocks (not prefilled) */
    size_t completion_tokens;  /* tokens generated so far */
} gw_req_view_t;

/* What one run of a request did. */
typedef struct gw_run_stats {
    const mdl_attn_ops_t *attn;    /* its backend */
    bool started;                  /* it got to its first token pick */
    ri_status_t status;            /* RI_OK, or why it failed */
    size_t n_gen;                  /* tokens generated */
    size_t steps;                  /* decode steps run (a rebuild's prefill not counted) */
    double decode_s;               /* wall time from the first pick to the end */
    double first_step_s;           /* wall time to the end of the first decode step (builds a sparse index) */
    size_t seq_len;                /* tokens in its CPU sequence at the end (the prompt's, with a device) */
    size_t kv_resident_bytes;      /* the engine's resident K/V bytes at the end (mdl_kv_resident_bytes) */
    bool remote;                   /* the backend is retroinfer-remote (with figures: remote_totals
                                      holds its totals) */
    gw_attn_remote_totals_t remote_totals; /* over the run (reset at its start), taken at its end */
} gw_run_stats_t;

/* A request's figures once done.  The K/V memory and the remote totals
 * only with gw_req_params_t.figures; the rest always. */
typedef struct gw_req_figures {
    double prefill_s;              /* wall time of the prompt's prefill (the chunks not cached, and the
                                      prefix publish) */
    size_t cached_tokens;          /* prompt tokens preloaded from cached prefix blocks */
    uint64_t rebuilt;              /* times a lost sequence was rebuilt */
    size_t n_runs;                 /* runs started: 1, or 2 with compare_attn */
    gw_run_stats_t runs[2];
} gw_req_figures_t;

/* Scheduler figures for /metrics (cumulative unless said otherwise). */
typedef struct gw_sched_stats {
    size_t queued;                /* now: requests waiting for a slot */
    size_t running;               /* now: requests admitted (prefilling or decoding) */
    size_t batch_now;             /* sequences in the last decode step */
    size_t batch_max;             /* the largest decode step so far */
    uint64_t submitted;           /* requests accepted by submit */
    uint64_t rejected_busy;       /* submits refused because the queue was full */
    uint64_t dense_requests;      /* retroinfer-remote requests run dense (cfg.dense_below) */
    uint64_t finished[5];         /* requests ended, by gw_finish_t */
    uint64_t prompt_tokens;       /* prompt tokens prefilled */
    uint64_t generated_tokens;    /* tokens generated */
    uint64_t rebuilt;             /* sequences rebuilt by prefilling their tokens again (kvstore lost them) */
    uint64_t decode_steps;        /* mdl_decode calls */
    cm_hist_t batch;              /* sequences per decode step */
    cm_hist_t ttft_s;            /* submit to first generated token, seconds */
    cm_hist_t itl_s;              /* between two tokens of one request, seconds */
} gw_sched_stats_t;

/* A new request with one reference (the caller's).  Errors: RI_ERR_INVALID
 * (no prompt, max_tokens 0, no backend), RI_ERR_NOMEM.  Release with
 * gw_req_release. */
ri_status_t gw_req_create(const gw_req_params_t *p, gw_req_t **req_p);

/* Drop one reference; the last frees.  NULL is a no-op. */
void gw_req_release(gw_req_t *req);

/* The figures of a done request into *f_p (all zero before it is done).
 * Any thread. */
void gw_req_figures(gw_req_t *req, gw_req_figures_t *f_p);

/* A copy of the token ids run `run` (0, or 1 for compare_attn) generated,
 * once the request is done: *ids_p (caller frees with cm_free; NULL when
 * none) and *n_p.  Errors: RI_ERR_INVALID (not done, or no such run),
 * RI_ERR_NOMEM. */
ri_status_t gw_req_run_ids(gw_req_t *req, size_t run, int32_t **ids_p, size_t *n_p);

/* Ask the scheduler to stop the request at the next step boundary (it ends
 * GW_FINISH_CANCELLED unless it ended first).  Any thread. */
void gw_req_cancel(gw_req_t *req);

/* Wait until the request has text beyond byte `from`, or is done, or
 * timeout_ms passed; then *text_p gets a new copy of the text from `from`
 * to what is ready (caller frees with cm_free; NULL when empty), *len_p its
 * length, and *view_p the progress.  Errors: RI_ERR_TIMEOUT (outputs still
 * written, text empty), RI_ERR_NOMEM. */
ri_status_t gw_req_take(gw_req_t *req, size_t from, uint32_t timeout_ms, char **text_p, size_t *len_p,
                        gw_req_view_t *view_p);

/* Start the scheduler thread over a loaded model (borrowed: it must outlive
 * the scheduler, and no other thread may call the model meanwhile).
 * Errors: RI_ERR_INVALID (bad cfg), RI_ERR_NOMEM.  Caller frees with
 * gw_sched_destroy. */
ri_status_t gw_sched_create(mdl_model_t *m, const gw_sched_cfg_t *cfg, gw_sched_t **s_p);

/* Queue a request; the scheduler takes its own reference.  The request
 * counts for TTFT from now.  Errors: RI_ERR_BUSY (the queue is full: try
 * later), RI_ERR_SHUTDOWN (draining), RI_ERR_INVALID (already submitted). */
ri_status_t gw_sched_submit(gw_sched_t *s, gw_req_t *req);

/* Stop taking requests, let the admitted and queued ones finish for up to
 * timeout_ms, then cancel what is left (status RI_ERR_SHUTDOWN) and wait
 * for the scheduler to let go of them.  Returns the number cancelled. */
size_t gw_sched_drain(gw_sched_t *s, uint32_t timeout_ms);

/* True once gw_sched_drain has started. */
bool gw_sched_draining(gw_sched_t *s);

/* Copy the figures (any thread). */
void gw_sched_stats(gw_sched_t *s, gw_sched_stats_t *st_p);

/* Stop the thread (cancelling whatever is left) and free.  NULL is a no-op. */
void gw_sched_destroy(gw_sched_t *s);

/* "stop", "length", or NULL for the others (not an OpenAI reason). */
const char *gw_finish_str(gw_finish_t f);

#endif /* GW_SCHED_H */
