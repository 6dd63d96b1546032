/*
 * ri-worker: our own inference engine as a worker process.  Loads the model
 * (default: the installed SmolLM2), connects to a ri-kvstore (--kvstore
 * ADDR: the "retroinfer-remote" attention backend; or --cluster URL: the
 * nodes of a kvstore cluster in etcd, docs/worker.md), and serves generation
 * requests, one JSON object per line on stdin, one JSON reply per line on
 * stdout (docs/worker.md):
 *
 *   {"id": 1, "prompt": "...", "max_tokens": 32, "attn": "retroinfer-remote",
 *    "compare_attn": "full", "chat": false}
 *
 * Each line's request goes through the scheduler of gw_sched.h (the HTTP
 * service's: prefix reuse, rebuild of a lost kvstore session, cluster
 * failover) and is answered before the next line is read.  compare_attn
 * runs a second backend on a copy of the same prefill, so that two methods
 * answer the same prompt for the cost of one prefill.  With --prompt-file
 * the worker answers that one request and exits (no stdin).
 *
 * A request that fails (kvstore gone and not back) gets {"ok": false,
 * "error": ...}; the process stays up, and the next request opens a new
 * kvstore session (the gRPC channel reconnects by itself).
 *
 * With --listen HOST:PORT it is a service instead: an OpenAI-compatible
 * HTTP API (gw_http.h) over continuous batching (gw_sched.h), until SIGTERM
 * or SIGINT, which drain it (bounded by --drain-timeout-ms); SIGHUP reloads
 * its API keys (--api-keys-file).
 *
 * --device cuda decodes on the GPU, in every mode (mdl_dev.h: prefill on
 * the CPU, then the K/V goes to the device; attention "full",
 * "retroinfer", whose wave index then lives on the device, or
 * "retroinfer-remote" (with --kvstore), whose block cache does;
 * docs/cuda.md "GPU decode path": its kernels ran on an H200, this binary
 * has not).
 */
#define _GNU_SOURCE
#include <cjson/cJSON.h>
#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "common/cm_alloc.h"
#include "common/cm_cluster.h"
#include "common/cm_config.h"
#include "common/cm_etcd.h"
#include "common/cm_runtime.h"
#include "common/cm_file.h"
#include "common/cm_keys.h"
#include "common/cm_net.h"
#include "common/cm_log.h"
#include "common/cm_status.h"
#include "common/cm_thread.h"
#include "common/cm_time.h"
#include "gpuworker/model/mdl_device.h"
#ifdef WK_HAVE_GW_CUDA
#include "gpuworker/client/cuda/gw_cuda.h"
#endif
#include "gpuworker/model/mdl_model.h"
#include "gpuworker/client/gw_attn_remote.h"
#include "gpuworker/client/gw_prefix_seq.h"
#include "gpuworker/server/gw_http.h"
#include "gpuworker/client/gw_remote.h"
#include "gpuworker/server/gw_sched.h"
#include "retroinfer/retroinfer.h"

static CM_ALLOC_TAG(wk_tag, "ri-worker");

typedef struct wk_cfg {
    char *model;         /* GGUF path; empty = the default model */
    char *kvstore;       /* ri-kvstore gRPC address; empty = no kvstore */
    char *token;         /* bearer token */
    char *token_file;    /* bearer token read from this file (a secret mounted in a container) */
    char *tls_ca;        /* TLS of the kvstore connection: CA, client certificate, key */
    char *tls_cert;
    char *tls_key;
    int64_t timeout_ms;  /* kvstore deadline */
    double cache_frac;   /* block cache share */
    bool compare_full;   /* record attention error vs exact */
    int64_t deadline_us; /* per layer-step wait bound for the kvstore's misses */
    int64_t retrieval_min; /* retroinfer(-remote): retrieval floor in tokens */
    double adapt_tau;    /* retroinfer(-remote): per-head cut (0 = off) */
    int64_t cluster_tokens; /* retroinfer(-remote): tokens per cluster (0 = auto) */
    double estimation_frac; /* retroinfer(-remote): share of the clusters estimated */
    int64_t dense_below; /* retroinfer-remote: shorter requests decode with full attention here */
    bool direct;         /* retroinfer-remote: read clusters in place on the kvstore's host */
    bool predict;        /* retroinfer-remote: cached steps do not wait for their fetch */
    bool fetch_async;    /* retroinfer-remote: fetch on the io thread */
    bool keep_kv;        /* retroinfer-remote: keep the K/V the kvstore holds */
    cm_runtime_t rt;     /* threads, log level, kernels, model dir and knobs (cm_runtime.h) */
    char *prompt_file;   /* one-shot request */
    char *attn;          /* one-shot: backend */
    char *compare_attn;  /* one-shot: second backend */
    int64_t max_tokens;  /* one-shot: tokens */
    bool chat;           /* one-shot: chat template */
    char *listen;        /* HTTP service address; empty = stdin requests */
    char *port_file;     /* HTTP service: write the bound address here */
    char *model_name;    /* HTTP service: the model's id; empty = the file name without .gguf */
    int64_t max_batch;   /* HTTP service: requests decoded together */
    int64_t queue_size;  /* HTTP service: requests waiting before 429 */
    int64_t prefill_chunk; /* HTTP service: prompt tokens per scheduler round */
    int64_t ctx;         /* HTTP service: context limit; 0 = the model's */
    char *allow_attn;    /* HTTP service: backends a request may choose */
    int64_t http_max_conn; /* HTTP service: connections at once */
    int64_t http_reserve_conn; /* HTTP service: of them, kept for short requests; 0 = auto */
    int64_t http_max_conn_per_addr; /* HTTP service: connections of one client address; 0 = auto */
    int64_t http_request_timeout_ms; /* HTTP service: a request must arrive within this */
    int64_t drain_timeout_ms; /* HTTP service: shutdown waits this long for running requests */
    char *device;        /* where decode runs: cpu or cuda */
    char *api_keys_file; /* HTTP service: API keys clients must send; empty = none */
    bool insecure;       /* HTTP service: allow a non-loopback --listen without API keys */
    bool prefix_cache;   /* HTTP service with a kvstore: reuse and publish prompt prefix blocks */
    char *prefix_salt;   /* extra salt of the prefix block keys (workers share blocks only with the same) */
    char *cluster;       /* etcd endpoints of a kvstore cluster (in place of --kvstore); empty = none */
    char *cluster_name;  /* the cluster's name in the directory */
    char *placement;     /* local-first, most-free or round-robin */
    char *worker_name;   /* this worker in the session records; empty = host:port or host:pid */
    char *cluster_host;  /* host identity for local-first; empty = gethostname() */
    int64_t cluster_lease_ms; /* the worker's lease in the directory */
    int64_t prefix_replicas;  /* nodes that should hold each published prefix block */
} wk_cfg_t;

#define WK_ITEM(n, t, d, h, f) {n, t, d, h, offsetof(wk_cfg_t, f), 0, 0, NULL}
static const cm_config_item_t wk_items[] = {
    WK_ITEM("model", CM_CFG_STRING, NULL,
            "model name (smollm2-135m, gemma3-270m) or GGUF file (default: smollm2-135m)", model),
    WK_ITEM("kvstore", CM_CFG_STRING, NULL, "ri-kvstore gRPC address host:port (enables retroinfer-remote)", kvstore),
    WK_ITEM("cluster", CM_CFG_STRING, NULL, "etcd endpoints etcd://HOST:PORT[,HOST:PORT] of a ri-kvstore cluster: "
            "sessions go to its live nodes (enables retroinfer-remote; excludes --kvstore)", cluster),
    WK_ITEM("cluster-name", CM_CFG_STRING, "default", "the cluster's name in the directory", cluster_name),
    WK_ITEM("placement", CM_CFG_STRING, "local-first", "cluster: node of a new session: local-first (a node on this "
            "host, else the most free memory), most-free, round-robin", placement),
    WK_ITEM("worker-name", CM_CFG_STRING, NULL, "cluster: this worker's name in the session records (default: "
            "hostname:HTTP port, or hostname:pid)", worker_name),
    WK_ITEM("cluster-host", CM_CFG_STRING, NULL, "cluster: host identity for local-first (default: hostname)",
            cluster_host),
    {"cluster-lease-ms", CM_CFG_INT, "5000", "cluster: lease of the worker's session records (gone this long after "
     "the worker dies)", offsetof(wk_cfg_t, cluster_lease_ms), 2000, 600000, NULL},
    {"prefix-replicas", CM_CFG_INT, "1", "cluster: nodes that should hold each published prefix block; above 1 the "
     "worker copies new blocks to other nodes in the background, so a sequence rebuilt after its node died attaches "
     "them instead of prefilling them", offsetof(wk_cfg_t, prefix_replicas), 1, 8, NULL},
    WK_ITEM("token", CM_CFG_STRING, NULL, "bearer token for the kvstore", token),
    WK_ITEM("token-file", CM_CFG_STRING, NULL, "read the bearer token from this file: the first word of its first "
            "line that is not blank or a # comment (a kvstore tokens file gives its first token)", token_file),
    WK_ITEM("tls-ca", CM_CFG_STRING, NULL, "PEM CA of the kvstore's TLS certificate (empty = plaintext gRPC)", tls_ca),
    WK_ITEM("tls-cert", CM_CFG_STRING, NULL, "PEM client certificate for a kvstore with mutual TLS", tls_cert),
    WK_ITEM("tls-key", CM_CFG_STRING, NULL, "PEM private key of tls-cert", tls_key),
    {"timeout-ms", CM_CFG_INT, "5000", "kvstore call deadline", offsetof(wk_cfg_t, timeout_ms), 100, 600000, NULL},
    {"cache-frac", CM_CFG_DOUBLE, "0.05", "block cache size as a share of a sequence's KV pages",
     offsetof(wk_cfg_t, cache_frac), 0.0001, 1.0, NULL},
    WK_ITEM("compare-full", CM_CFG_BOOL, "false",
            "retroinfer-remote also computes exact attention and reports the error", compare_full),
    {"deadline-us", CM_CFG_INT, "0",
     "retroinfer-remote: a layer-step waits at most this for the kvstore's misses; late clusters are attended "
     "through their centroid estimate and counted (0 = always wait: exact)",
     offsetof(wk_cfg_t, deadline_us), 0, 10000000, NULL},
    {"retrieval-min", CM_CFG_INT, "256",
     "retroinfer and retroinfer-remote: floor of the retrieval zone in tokens (the 1.8% share starves short "
     "contexts)", offsetof(wk_cfg_t, retrieval_min), 0, 1 << 24, NULL},
    {"adapt-tau", CM_CFG_DOUBLE, "0",
     "retroinfer and retroinfer-remote: output-aware per-head cut, the estimated mass a head may leave to "
     "estimation (0 = off)", offsetof(wk_cfg_t, adapt_tau), 0, 0.99, NULL},
    {"cluster-tokens", CM_CFG_INT, "0",
     "retroinfer and retroinfer-remote: tokens per cluster (0 = auto: 4 up to 16K indexed tokens, 8 up to "
     "32K, 16 beyond)", offsetof(wk_cfg_t, cluster_tokens), 0, 4096, NULL},
    {"estimation-frac", CM_CFG_DOUBLE, "0.232",
     "retroinfer and retroinfer-remote: share of the clusters attended through their centroids",
     offsetof(wk_cfg_t, estimation_frac), 0, 1, NULL},
    {"dense-below", CM_CFG_INT, "0",
     "retroinfer-remote: a request whose prompt + max_tokens is below this many tokens decodes with full attention "
     "in the worker (below the remote path's break-even; 0 = never)",
     offsetof(wk_cfg_t, dense_below), 0, 1 << 24, NULL},
    WK_ITEM("direct", CM_CFG_BOOL, "true",
            "retroinfer-remote: read retrieved clusters in place from the kvstore's memory when on its host "
            "(false: every read is a request)", direct),
    WK_ITEM("predict", CM_CFG_BOOL, "true",
            "retroinfer-remote: a step whose clusters are all cached does not wait for its fetch", predict),
    WK_ITEM("fetch-async", CM_CFG_BOOL, "false",
            "retroinfer-remote: fetch on the io thread while the estimation zone is computed", fetch_async),
    WK_ITEM("keep-kv", CM_CFG_BOOL, "false",
            "retroinfer-remote: keep the K/V the kvstore holds (a session it loses is re-filled, not rebuilt)",
            keep_kv),
    WK_ITEM("prefix-cache", CM_CFG_BOOL, "true",
            "with --kvstore or --cluster: attach the cached leading 256-token blocks of a prompt instead of "
            "prefilling them, and publish the new ones (full and retroinfer; docs/prefix.md)", prefix_cache),
    WK_ITEM("prefix-salt", CM_CFG_STRING, NULL,
            "extra salt of the prefix block keys: only workers with the same salt (and kvstore token) share blocks",
            prefix_salt),
    CM_RUNTIME_LOG_ITEM(wk_cfg_t, rt),
    CM_RUNTIME_COMPUTE_ITEMS(wk_cfg_t, rt),
    WK_ITEM("prompt-file", CM_CFG_STRING, NULL, "answer this prompt once and exit (no stdin requests)", prompt_file),
    WK_ITEM("attn", CM_CFG_STRING, NULL, "backend of the one-shot request (default: retroinfer-remote with "
            "--kvstore, else full)", attn),
    WK_ITEM("compare-attn", CM_CFG_STRING, NULL, "one-shot: also answer with this backend on the same prefill",
            compare_attn),
    {"max-tokens", CM_CFG_INT, "32", "tokens to generate (one-shot; stdin and HTTP requests without max_tokens)",
     offsetof(wk_cfg_t, max_tokens), 1, 1 << 20, NULL},
    WK_ITEM("chat", CM_CFG_BOOL, "false", "one-shot: apply the chat template", chat),
    WK_ITEM("listen", CM_CFG_STRING, NULL, "serve the OpenAI-compatible HTTP API on host:port (port 0 = any free "
            "port) instead of reading stdin", listen),
    WK_ITEM("port-file", CM_CFG_STRING, NULL, "HTTP service: write http=HOST:PORT and pid=N here once serving",
            port_file),
    WK_ITEM("model-name", CM_CFG_STRING, NULL, "HTTP service: the model id requests name (default: the model file's "
            "name without .gguf)", model_name),
    {"max-batch", CM_CFG_INT, "8", "HTTP service: requests decoded together (continuous batching)",
     offsetof(wk_cfg_t, max_batch), 1, 64, NULL},
    {"queue-size", CM_CFG_INT, "32", "HTTP service: requests waiting for a batch slot; more get 429",
     offsetof(wk_cfg_t, queue_size), 1, 1000000, NULL},
    {"prefill-chunk", CM_CFG_INT, "256", "prompt tokens prefilled between two decode steps "
     "(a multiple of 64)", offsetof(wk_cfg_t, prefill_chunk), 64, 1 << 20, NULL},
    {"ctx", CM_CFG_INT, "0", "HTTP service: prompt + max_tokens limit (0 = the model's trained context)",
     offsetof(wk_cfg_t, ctx), 0, 1 << 24, NULL},
    WK_ITEM("allow-attn", CM_CFG_STRING, "full,retroinfer,retroinfer-remote",
            "HTTP service: backends a request's \"attn\" may choose (retroinfer-remote needs --kvstore or "
            "--cluster)", allow_attn),
    {"http-max-conn", CM_CFG_INT, "256", "HTTP service: connections at once (one thread each)",
     offsetof(wk_cfg_t, http_max_conn), 4, 65536, NULL},
    {"http-reserve-conn", CM_CFG_INT, "0", "HTTP service: of http-max-conn, slots kept for short requests such as "
     "/health: any client gets one, with a 1 s deadline (0 = http-max-conn / 16, at least 2)",
     offsetof(wk_cfg_t, http_reserve_conn), 0, 65535, NULL},
    {"http-max-conn-per-addr", CM_CFG_INT, "0", "HTTP service: connections one client address may hold beside the "
     "reserve (0 = a quarter of http-max-conn)", offsetof(wk_cfg_t, http_max_conn_per_addr), 0, 65536, NULL},
    {"http-request-timeout-ms", CM_CFG_INT, "30000", "HTTP service: a request (headers and body) must arrive within "
     "this from the connection's accept or its previous answer, else the connection is closed",
     offsetof(wk_cfg_t, http_request_timeout_ms), 100, 3600000, NULL},
    {"drain-timeout-ms", CM_CFG_INT, "10000", "HTTP service: on SIGTERM/SIGINT, running requests get this long to "
     "finish before they are cancelled", offsetof(wk_cfg_t, drain_timeout_ms), 0, 3600000, NULL},
    WK_ITEM("api-keys-file", CM_CFG_STRING, NULL, "HTTP service: every endpoint but /health wants "
            "'Authorization: Bearer KEY' with a key of this file (one per line: KEY [NAME]; # comments; not "
            "group/world writable); SIGHUP reloads it", api_keys_file),
    WK_ITEM("insecure", CM_CFG_BOOL, "false", "HTTP service: serve a non-loopback --listen without "
            "--api-keys-file (something in front must authenticate)", insecure),
    WK_ITEM("device", CM_CFG_STRING, "cpu", "where decode runs: cpu, or cuda (attn full, retroinfer, or "
            "retroinfer-remote with --kvstore; prefill runs there too; needs a CUDA build and a GPU)", device),
};
static const cm_config_table_t wk_table = {"ri-worker", "RI_WORKER_", wk_items, CM_ARRAY_LEN(wk_items), 0, NULL};

static mdl_device_t *wk_dev; /* where decode runs, chosen once by main (--device; owned); NULL = the CPU */

/* The device's name for replies, and whether it can decode with backend
 * ops (mdl_device_takes: cuda decodes full, retroinfer and
 * retroinfer-remote). */
static const char *wk_device_name(void)
{
    return mdl_device_name(wk_dev);
}

static bool wk_device_takes(const mdl_attn_ops_t *ops)
{
    return mdl_device_takes(wk_device_name(), ops->name);
}

typedef struct wk_req {
    const char *prompt;
    const char *attn;
    const char *compare_attn;
    size_t max_tokens;
    bool chat;
} wk_req_t;

static void wk_add_remote_stats(cJSON *run, const gw_attn_remote_totals_t *t, size_t steps)
{
    cJSON_AddNumberToObject(run, "hit_ratio", t->hits + t->misses ? (double)t->hits / (double)(t->hits + t->misses)
                                                                  : 0);
    cJSON_AddNumberToObject(run, "cache_hits", (double)t->hits);
    cJSON_AddNumberToObject(run, "cache_misses", (double)t->misses);
    cJSON_AddNumberToObject(run, "fetched_bytes", (double)t->fetched_bytes);
    cJSON_AddNumberToObject(run, "fetched_bytes_per_token", steps ? (double)t->fetched_bytes / (double)steps : 0);
    cJSON_AddNumberToObject(run, "uploaded_bytes", (double)t->uploaded_bytes);
    cJSON_AddNumberToObject(run, "index_build_s", t->build_s);
    cJSON_AddNumberToObject(run, "fetch_wait_s", t->fetch_wait_s);
    cJSON_AddNumberToObject(run, "max_wait_ms", t->max_wait_s * 1e3);
    cJSON_AddNumberToObject(run, "late_steps", (double)t->late_steps);
    cJSON_AddNumberToObject(run, "late_clusters", (double)t->late_clusters);
    cJSON_AddNumberToObject(run, "direct_steps", (double)t->direct_steps);
    cJSON_AddNumberToObject(run, "direct_clusters", (double)t->direct_clusters);
    cJSON_AddNumberToObject(run, "compare_s", t->compare_s);
    cJSON_AddNumberToObject(run, "recoveries", (double)t->recoveries);
    if (t->n_err > 0) {
        cJSON_AddNumberToObject(run, "attn_rel_err_median", t->err_median);
        cJSON_AddNumberToObject(run, "attn_rel_err_p90", t->err_p90);
        cJSON_AddNumberToObject(run, "attn_rel_err_p99", t->err_p99);
        cJSON_AddNumberToObject(run, "attn_rel_err_max", t->err_max);
        cJSON_AddNumberToObject(run, "attn_err_samples", (double)t->n_err);
    }
}

/* One run's object of the reply: its text (its tokens decoded at once),
 * decode figures, K/V memory (the sequence's whole K/V in fp16, what of the
 * engine's arrays was resident, plus the remote backend's own bytes: block
 * cache, receive buffer, meta index) and the remote backend's totals. */
static void wk_add_run(mdl_model_t *m, gw_req_t *req, const gw_run_stats_t *rs, size_t i, cJSON *runs)
{
    const mdl_hparams_t *hp = mdl_model_hparams(m);
    cJSON *run = cJSON_CreateObject();
    int32_t *ids = NULL;
    size_t n = 0;
    char *text = NULL;

    cJSON_AddItemToArray(runs, run);
    cJSON_AddStringToObject(run, "attn", rs->attn->name);
    if (gw_req_run_ids(req, i, &ids, &n) == RI_OK && mdl_tok_decode(mdl_model_tok(m), ids, n, true, &text) == RI_OK)
        cJSON_AddStringToObject(run, "text", text);
    cm_free(text);
    cm_free(ids);
    cJSON_AddNumberToObject(run, "tokens", (double)rs->n_gen);
    cJSON_AddNumberToObject(run, "decode_steps", (double)rs->steps);
    cJSON_AddNumberToObject(run, "decode_s", rs->decode_s);
    cJSON_AddNumberToObject(run, "first_step_s", rs->first_step_s);
    /* steady-state speed: without the first step (index build), and
     * without the exact pass of --compare-full, which is not the method's */
    double rest = rs->decode_s - rs->first_step_s;
    if (rs->remote && rs->steps > 1 && rs->remote_totals.compare_s > 0) {
        double r2 = rest - rs->remote_totals.compare_s / (double)rs->steps * (double)(rs->steps - 1);
        rest = r2 > 0 ? r2 : rest;
    }
    cJSON_AddNumberToObject(run, "decode_tok_s", rs->steps > 1 ? (double)(rs->steps - 1) / rest : 0.0);
    cJSON_AddStringToObject(run, "device", wk_device_name());
    double engine = (double)rs->kv_resident_bytes;
    cJSON_AddNumberToObject(run, "full_kv_bytes", (double)rs->seq_len * hp->n_layers * hp->n_kv_heads *
                                                      hp->head_dim * 2.0 * sizeof(cm_fp16_t));
    cJSON_AddNumberToObject(run, "engine_kv_resident_bytes", engine);
    cJSON_AddNumberToObject(run, "worker_kv_bytes",
                            engine + (rs->remote ? (double)rs->remote_totals.resident_bytes : 0));
    if (rs->remote)
        wk_add_remote_stats(run, &rs->remote_totals, rs->steps);
}

/* The reply of a request the scheduler finished: prompt and prefill
 * figures, then its runs, then ok or the error. */
static void wk_reply(mdl_model_t *m, gw_req_t *req, const gw_req_view_t *v, size_t n_ids, cJSON *reply)
{
    gw_req_figures_t f;
    gw_req_figures(req, &f);
    cJSON_AddNumberToObject(reply, "prompt_tokens", (double)n_ids);
    cJSON_AddNumberToObject(reply, "cached_tokens", (double)f.cached_tokens);
    if (f.n_runs > 0) {
        cJSON_AddNumberToObject(reply, "prefill_s", f.prefill_s);
        cJSON_AddNumberToObject(reply, "prefill_tok_s", f.prefill_s > 0 ? (double)n_ids / f.prefill_s : 0.0);
        if (f.rebuilt > 0)
            cJSON_AddNumberToObject(reply, "rebuilt", (double)f.rebuilt);
        cJSON *runs = cJSON_AddArrayToObject(reply, "runs");
        for (size_t i = 0; i < f.n_runs; i++)
            wk_add_run(m, req, &f.runs[i], i, runs);
    }
    bool ok = v->finish == GW_FINISH_STOP || v->finish == GW_FINISH_LENGTH;
    cJSON_AddBoolToObject(reply, "ok", ok);
    if (!ok)
        cJSON_AddStringToObject(reply, "error", v->error[0] ? v->error : ri_status_str(v->status));
}

/* Serve one request through the scheduler (submitted, then waited for: the
 * lines are answered in order); the reply (ok or error) goes into reply. */
static void wk_serve(mdl_model_t *m, gw_sched_t *sched, const wk_req_t *rq, cJSON *reply)
{
    const mdl_tok_t *tok = mdl_model_tok(m);
    const mdl_attn_ops_t *ops[2] = {mdl_attn_find(rq->attn), NULL};
    gw_req_t *req = NULL;
    int32_t *ids = NULL;
    size_t n_ids = 0, n_runs = 1;
    char err[512] = "";
    ri_status_t st;

    if (ops[0] == NULL) {
        snprintf(err, sizeof(err), "unknown attn '%s' (have: %s)", rq->attn, mdl_attn_names());
        goto fail;
    }
    if (rq->compare_attn != NULL && rq->compare_attn[0] != '\0') {
        if ((ops[1] = mdl_attn_find(rq->compare_attn)) == NULL) {
            snprintf(err, sizeof(err), "unknown compare_attn '%s' (have: %s)", rq->compare_attn, mdl_attn_names());
            goto fail;
        }
        n_runs = 2;
    }
    for (size_t r = 0; r < n_runs; r++)
        if (!wk_device_takes(ops[r])) {
            snprintf(err, sizeof(err), "attn %s does not run with --device %s (the device decodes %s)",
                     ops[r]->name, wk_device_name(), mdl_device_attns(wk_device_name()));
            goto fail;
        }
    st = rq->chat ? mdl_tok_chat(tok, NULL, rq->prompt, &ids, &n_ids)
                  : mdl_tok_encode_prompt(tok, rq->prompt, strlen(rq->prompt), &ids, &n_ids);
    if (st != RI_OK || n_ids == 0) {
        snprintf(err, sizeof(err), "cannot tokenize the prompt: %s", st ? ri_status_str(st) : "it is empty");
        goto fail;
    }
    gw_req_params_t p = {.ids = ids, .n_ids = n_ids, .max_tokens = rq->max_tokens, .attn = ops[0],
                         .sampler = {.temperature = 0, .top_p = 1}, .compare_attn = ops[1], .figures = true};
    if ((st = gw_req_create(&p, &req)) != RI_OK || (st = gw_sched_submit(sched, req)) != RI_OK) {
        snprintf(err, sizeof(err), "cannot queue the request: %s", ri_status_str(st));
        goto fail;
    }
    gw_req_view_t v;
    do {
        char *text = NULL;
        size_t len = 0;
        /* the text is read from the runs' tokens at the end: take nothing
         * (from the end of the text) until done */
        st = gw_req_take(req, SIZE_MAX, 60000, &text, &len, &v);
        cm_free(text);
    } while (!v.done && (st == RI_OK || st == RI_ERR_TIMEOUT));
    if (!v.done) {
        gw_req_cancel(req);
        snprintf(err, sizeof(err), "waiting for the request: %s", ri_status_str(st));
        goto fail;
    }
    wk_reply(m, req, &v, n_ids, reply);
    goto out;
fail:
    cJSON_AddBoolToObject(reply, "ok", false);
    cJSON_AddStringToObject(reply, "error", err);
out:
    gw_req_release(req);
    cm_free(ids);
}

static char *wk_read_file(const char *path)
{
    FILE *f = fopen(path, "rb");
    char *buf = NULL;
    long n;
    if (f == NULL)
        return NULL;
    if (fseek(f, 0, SEEK_END) == 0 && (n = ftell(f)) >= 0 && fseek(f, 0, SEEK_SET) == 0 &&
        (buf = cm_malloc(&wk_tag, (size_t)n + 1)) != NULL) {
        if (fread(buf, 1, (size_t)n, f) != (size_t)n) {
            cm_free(buf);
            buf = NULL;
        } else {
            buf[n] = '\0';
        }
    }
    fclose(f);
    return buf;
}

static void wk_emit(cJSON *reply)
{
    char *s = cJSON_PrintUnformatted(reply);
    if (s != NULL) {
        fprintf(stdout, "%s\n", s);
        fflush(stdout);
        cJSON_free(s);
    }
}

/* The settings of every sequence this worker creates, from its flags. */
static void wk_attn_cfg(const wk_cfg_t *cfg, mdl_attn_cfg_t *acfg)
{
    mdl_attn_cfg_default(acfg);
    acfg->wave.retrieval_min_tokens = (uint32_t)cfg->retrieval_min;
    acfg->wave.adapt_tau = (float)cfg->adapt_tau;
    acfg->wave.tokens_per_cluster = (uint32_t)cfg->cluster_tokens;
    acfg->wave.estimation_frac = (float)cfg->estimation_frac;
    acfg->release_window = true; /* a server keeps what it reads */
}

/* The scheduler of either mode, from the flags: batch, queue, prefill
 * chunk, sequence settings, the device, prefix reuse (NULL = off).
 * Caller frees with gw_sched_destroy. */
static ri_status_t wk_sched_start(mdl_model_t *model, const wk_cfg_t *cfg, gw_pfx_ctx_t *prefix, gw_sched_t **s_p)
{
    gw_sched_cfg_t scfg = {.max_batch = (size_t)cfg->max_batch, .queue_size = (size_t)cfg->queue_size,
                           .prefill_chunk = (size_t)cfg->prefill_chunk,
                           .dense_below = (size_t)cfg->dense_below};
    wk_attn_cfg(cfg, &scfg.attn);
    scfg.dev = wk_dev;
    scfg.prefix = prefix;
    ri_status_t st = gw_sched_create(model, &scfg, s_p);
    if (st != RI_OK)
        fprintf(stderr, "ri-worker: cannot start the scheduler: %s\n", ri_status_str(st));
    return st;
}

/* One request line -> one reply line.  Returns whether the reply says ok,
 * so that the exit status can tell a caller (a script, a pipe) that
 * something failed. */
static bool wk_handle_line(mdl_model_t *m, gw_sched_t *sched, const wk_cfg_t *cfg, const char *line,
                           const char *default_attn)
{
    cJSON *rq = cJSON_Parse(line), *reply = cJSON_CreateObject(), *it;
    char *file_text = NULL;
    wk_req_t r = {.attn = default_attn, .max_tokens = (size_t)cfg->max_tokens};

    if (rq == NULL || !cJSON_IsObject(rq)) {
        cJSON_AddBoolToObject(reply, "ok", false);
        cJSON_AddStringToObject(reply, "error", "request is not a JSON object");
        goto out;
    }
    if ((it = cJSON_GetObjectItem(rq, "id")) != NULL)
        cJSON_AddItemToObject(reply, "id", cJSON_Duplicate(it, true));
    if ((it = cJSON_GetObjectItem(rq, "prompt")) != NULL && cJSON_IsString(it))
        r.prompt = it->valuestring;
    if ((it = cJSON_GetObjectItem(rq, "prompt_file")) != NULL && cJSON_IsString(it)) {
        if ((file_text = wk_read_file(it->valuestring)) == NULL) {
            cJSON_AddBoolToObject(reply, "ok", false);
            cJSON_AddStringToObject(reply, "error", "cannot read prompt_file");
            goto out;
        }
        r.prompt = file_text;
    }
    if ((it = cJSON_GetObjectItem(rq, "attn")) != NULL && cJSON_IsString(it))
        r.attn = it->valuestring;
    if ((it = cJSON_GetObjectItem(rq, "compare_attn")) != NULL && cJSON_IsString(it))
        r.compare_attn = it->valuestring;
    if ((it = cJSON_GetObjectItem(rq, "max_tokens")) != NULL && cJSON_IsNumber(it) && it->valuedouble >= 1 &&
        it->valuedouble <= 1 << 20)
        r.max_tokens = (size_t)it->valuedouble;
    r.chat = cJSON_IsTrue(cJSON_GetObjectItem(rq, "chat"));
    if (r.prompt == NULL) {
        cJSON_AddBoolToObject(reply, "ok", false);
        cJSON_AddStringToObject(reply, "error", "no prompt");
        goto out;
    }
    wk_serve(m, sched, &r, reply);
out:;
    bool ok = cJSON_IsTrue(cJSON_GetObjectItem(reply, "ok"));
    wk_emit(reply);
    cJSON_Delete(reply);
    cJSON_Delete(rq);
    cm_free(file_text);
    return ok;
}

/* Write the bound address to path atomically (tmp file + rename), as
 * ri-kvstore's port file, so that a reader sees all of it or nothing. */
static ri_status_t wk_write_port_file(const char *path, const char *addr)
{
    char tmp[4096];
    if (snprintf(tmp, sizeof(tmp), "%s.tmp.%d", path, (int)getpid()) >= (int)sizeof(tmp))
        return RI_ERR_RANGE;
    FILE *f = fopen(tmp, "we");
    if (f == NULL) {
        fprintf(stderr, "ri-worker: port-file %s: %s\n", tmp, strerror(errno));
        return RI_ERR_IO;
    }
    fprintf(f, "http=%s\npid=%d\n", addr, (int)getpid());
    if (fclose(f) != 0 || rename(tmp, path) != 0) {
        fprintf(stderr, "ri-worker: port-file %s: %s\n", path, strerror(errno));
        unlink(tmp);
        return RI_ERR_IO;
    }
    return RI_OK;
}

/* SIGHUP: read the API keys file again; a file that does not load leaves
 * the keys in force (and says why). */
static void wk_reload_keys(gw_http_t *http, const wk_cfg_t *cfg)
{
    char err[512] = "";
    cm_keys_t *keys = NULL;
    if (cfg->api_keys_file == NULL || cfg->api_keys_file[0] == '\0') {
        fprintf(stderr, "ri-worker: SIGHUP: no --api-keys-file to reload\n");
        return;
    }
    if (cm_keys_load(cfg->api_keys_file, &keys, err, sizeof(err)) != RI_OK) {
        fprintf(stderr, "ri-worker: SIGHUP: %s; the keys loaded before stay in force\n", err);
        return;
    }
    size_t n = cm_keys_count(keys);
    if (gw_http_set_keys(http, keys) == RI_OK)
        fprintf(stderr, "ri-worker: SIGHUP: %zu API key(s) loaded from %s\n", n, cfg->api_keys_file);
}

/* A non-loopback --listen needs API keys or --insecure: 0, or 2 after
 * saying why. */
static int wk_listen_check(const wk_cfg_t *cfg)
{
    struct sockaddr_storage ss;
    char host[256];
    unsigned port;
    bool v6 = false;
    if ((cfg->api_keys_file != NULL && cfg->api_keys_file[0] != '\0') || cfg->insecure)
        return 0;
    if (cm_net_parse_numeric(cfg->listen, &ss, host, sizeof(host), &port, &v6) != RI_OK)
        return 0; /* gw_http_start says what is wrong with it */
    bool loopback = v6 ? IN6_IS_ADDR_LOOPBACK(&((struct sockaddr_in6 *)&ss)->sin6_addr)
                       : (ntohl(((struct sockaddr_in *)&ss)->sin_addr.s_addr) >> 24) == 127;
    if (loopback)
        return 0;
    fprintf(stderr, "ri-worker: --listen %s is not a loopback address, and without --api-keys-file anyone who can "
            "reach it may use the worker: give --api-keys-file, or --insecure when something in front "
            "authenticates\n", cfg->listen);
    return 2;
}

/* The HTTP service, until SIGTERM/SIGINT (blocked by main before any
 * thread started, so that only sigwait sees them).  Returns the exit
 * status: 0 after a clean stop, 1 when it could not start. */
/* Prefix reuse's keys for the loaded model: the model file's digest (once:
 * about 0.1 s per 100 MB), the tenant salt from the kvstore token and
 * --prefix-salt; the prefix-only sessions go through the remote backend's
 * control channel.  false (reuse off) when that is not there. */
static bool wk_prefix_setup(const mdl_model_t *model, const wk_cfg_t *cfg, const char *token, gw_pfx_ctx_t *ctx)
{
    const mdl_gguf_t *g = mdl_model_gguf(model);
    double t0 = cm_time_s();
    ri_status_t st;

    memset(ctx, 0, sizeof(*ctx));
    ctx->ctl = gw_attn_remote_ctl(&ctx->timeout_ms); /* NULL in a cluster: each run picks its node */
    if (ctx->ctl == NULL && !gw_attn_remote_clustered())
        return false;
    st = gw_pfx_model_digest(g->base, g->size, ctx->keyer.model);
    if (st == RI_OK)
        st = gw_pfx_tenant_salt(token, cfg->prefix_salt, ctx->keyer.salt);
    if (st != RI_OK) {
        fprintf(stderr, "ri-worker: prefix cache off: cannot hash the model: %s\n", ri_status_str(st));
        return false;
    }
    cm_info("prefix cache on: model digest of %zu bytes in %.3f s", g->size, cm_time_s() - t0);
    return true;
}

/* The JSON-lines mode: the --prompt-file request, else one request per
 * line of stdin, each through the scheduler and answered before the next
 * line is read.  Returns the exit status: 0 when every request succeeded,
 * 1 when any failed (each failure answered on its line) or the scheduler
 * could not start. */
static int wk_serve_lines(mdl_model_t *model, const wk_cfg_t *cfg, const char *default_attn, gw_pfx_ctx_t *prefix)
{
    gw_sched_t *sched = NULL;
    size_t failed = 0;
    int rc = 1;

    if (wk_sched_start(model, cfg, prefix, &sched) != RI_OK)
        return 1;
    if (cfg->prompt_file != NULL && cfg->prompt_file[0] != '\0') {
        cJSON *rq = cJSON_CreateObject();
        cJSON_AddStringToObject(rq, "prompt_file", cfg->prompt_file);
        cJSON_AddStringToObject(rq, "attn", default_attn);
        if (cfg->compare_attn != NULL && cfg->compare_attn[0] != '\0')
            cJSON_AddStringToObject(rq, "compare_attn", cfg->compare_attn);
        cJSON_AddNumberToObject(rq, "max_tokens", (double)cfg->max_tokens);
        cJSON_AddBoolToObject(rq, "chat", cfg->chat);
        char *line = cJSON_PrintUnformatted(rq);
        bool ok = line != NULL && wk_handle_line(model, sched, cfg, line, default_attn);
        cJSON_free(line);
        cJSON_Delete(rq);
        rc = ok ? 0 : 1;
        goto out;
    }
    fprintf(stderr, "ri-worker: ready: one JSON request per line on stdin\n");
    char *line = NULL;
    size_t cap = 0;
    while (getline(&line, &cap, stdin) > 0) {
        if (line[strspn(line, " \t\r\n")] == '\0')
            continue;
        if (!wk_handle_line(model, sched, cfg, line, default_attn))
            failed++;
    }
    free(line);
    /* Every request was answered (failures in their replies); the status
     * says whether all of them succeeded. */
    if (failed > 0)
        fprintf(stderr, "ri-worker: %zu request(s) failed\n", failed);
    rc = failed > 0 ? 1 : 0;
out:
    gw_sched_destroy(sched);
    return rc;
}

static int wk_serve_http(mdl_model_t *model, const wk_cfg_t *cfg, const char *path, const char *default_attn,
                         bool have_kvs, gw_pfx_ctx_t *prefix, const sigset_t *sigs)
{
    char err[512] = "", name[4096];
    gw_sched_t *sched = NULL;
    gw_http_t *http = NULL;
    int rc = 1, sig = 0;

    if (cfg->model_name != NULL && cfg->model_name[0] != '\0') {
        snprintf(name, sizeof(name), "%s", cfg->model_name);
    } else {
        const char *base = strrchr(path, '/');
        snprintf(name, sizeof(name), "%s", base ? base + 1 : path);
        size_t l = strlen(name);
        if (l > 5 && strcmp(name + l - 5, ".gguf") == 0)
            name[l - 5] = '\0';
    }
    const mdl_hparams_t *hp = mdl_model_hparams(model);
    size_t ctx = cfg->ctx > 0 ? (size_t)cfg->ctx : hp->n_ctx;
    if (wk_sched_start(model, cfg, prefix, &sched) != RI_OK)
        goto out;
    const char *allow = cfg->allow_attn ? cfg->allow_attn : "";
    /* the device decodes only some backends (main refused any other
     * default): a request that asks for another is refused at validation
     * (400, param "attn"), not failed later; the serving line below says so */
    if (wk_dev != NULL)
        allow = mdl_device_attns(wk_device_name());
    unsigned max_conn = (unsigned)cfg->http_max_conn;
    unsigned reserve = cfg->http_reserve_conn > 0 ? (unsigned)cfg->http_reserve_conn : CM_MAX(max_conn / 16, 2u);
    unsigned per_addr = cfg->http_max_conn_per_addr > 0 ? (unsigned)cfg->http_max_conn_per_addr
                                                        : CM_MAX(max_conn / 4, 1u);
    if (reserve >= max_conn) {
        fprintf(stderr, "ri-worker: --http-reserve-conn %u must be below --http-max-conn %u\n", reserve, max_conn);
        goto out;
    }
    bool have_keys = cfg->api_keys_file != NULL && cfg->api_keys_file[0] != '\0';
    cm_keys_t *keys = NULL;
    if (have_keys && cm_keys_load(cfg->api_keys_file, &keys, err, sizeof(err)) != RI_OK) {
        fprintf(stderr, "ri-worker: %s\n", err);
        goto out;
    }
    gw_http_cfg_t hcfg = {.listen = cfg->listen, .model_id = name, .default_attn = default_attn,
                          .allow_attn = allow, .ctx = ctx,
                          .default_max_tokens = (size_t)cfg->max_tokens, .max_conn = max_conn,
                          .reserve_conn = reserve, .max_conn_per_addr = per_addr,
                          .request_ms = (uint32_t)cfg->http_request_timeout_ms, .kvstore = have_kvs,
                          .keys = keys, .prefix = prefix != NULL ? &prefix->stats : NULL};
    if (gw_http_start(&hcfg, model, sched, &http, err, sizeof(err)) != RI_OK) {
        fprintf(stderr, "ri-worker: cannot serve HTTP: %s\n", err);
        goto out;
    }
    if (cfg->port_file != NULL && cfg->port_file[0] != '\0' &&
        wk_write_port_file(cfg->port_file, gw_http_address(http)) != RI_OK)
        goto out;
    fprintf(stderr, "ri-worker: serving http://%s (model '%s', context %zu, batch %lld, queue %lld, attn %s; "
            "a request's attn may be: %s; %s)\n", gw_http_address(http), name, ctx, (long long)cfg->max_batch,
            (long long)cfg->queue_size, default_attn, gw_http_allowed(http),
            have_keys ? "API keys required" : "no API keys");
    for (;;) {
        int e = sigwait(sigs, &sig);
        if (e == 0 && sig == SIGHUP) {
            wk_reload_keys(http, cfg);
            continue;
        }
        if (e == 0)
            break;
        if (e != EINTR) {
            fprintf(stderr, "ri-worker: sigwait: %s\n", strerror(e));
            break;
        }
    }
    fprintf(stderr, "ri-worker: %s: draining (up to %lld ms)\n", sig ? strsignal(sig) : "stop",
            (long long)cfg->drain_timeout_ms);
    size_t cancelled = gw_sched_drain(sched, (uint32_t)cfg->drain_timeout_ms);
    if (cancelled > 0)
        fprintf(stderr, "ri-worker: %zu request(s) cancelled at the drain deadline\n", cancelled);
    rc = 0;
out:
    gw_http_destroy(http); /* after the drain: no connection still waits for text */
    gw_sched_destroy(sched);
    if (cfg->port_file != NULL && cfg->port_file[0] != '\0' && rc == 0)
        unlink(cfg->port_file);
    return rc;
}

static bool wk_set(const char *s)
{
    return s != NULL && s[0] != '\0';
}

/* The cluster settings: 0, or 2 after saying what is wrong.  *cl filled
 * (its strings borrow cfg's, and names / host, which the caller keeps). */
static int wk_cluster_check(const wk_cfg_t *cfg, gw_attn_remote_cluster_t *cl, char *worker, char *host)
{
    memset(cl, 0, sizeof(*cl));
    if (!wk_set(cfg->cluster))
        return 0;
    if (wk_set(cfg->kvstore)) {
        fprintf(stderr, "ri-worker: --cluster and --kvstore exclude each other (try --help)\n");
        return 2;
    }
    if (!cm_etcd_endpoints_valid(cfg->cluster)) {
        fprintf(stderr, "ri-worker: --cluster %s: want etcd://HOST:PORT[,HOST:PORT...]\n", cfg->cluster);
        return 2;
    }
    if (!cm_cluster_policy_parse(cfg->placement, &cl->policy)) {
        fprintf(stderr, "ri-worker: --placement %s: want local-first, most-free or round-robin\n", cfg->placement);
        return 2;
    }
    if (!cm_cluster_name_valid(cfg->cluster_name)) {
        fprintf(stderr, "ri-worker: --cluster-name '%s': 1 to 63 characters of A-Z a-z 0-9 . _ : -\n",
                cfg->cluster_name);
        return 2;
    }
    char hn[CM_CLUSTER_NAME_MAX] = "localhost";
    (void)gethostname(hn, sizeof(hn) - 1);
    hn[sizeof(hn) - 1] = '\0';
    snprintf(host, CM_CLUSTER_NAME_MAX, "%s", wk_set(cfg->cluster_host) ? cfg->cluster_host : hn);
    if (wk_set(cfg->worker_name)) {
        snprintf(worker, CM_CLUSTER_NAME_MAX, "%s", cfg->worker_name);
    } else {
        /* the HTTP port names a service; a stdin worker has its pid */
        const char *colon = wk_set(cfg->listen) ? strrchr(cfg->listen, ':') : NULL;
        long port = colon != NULL ? strtol(colon + 1, NULL, 10) : 0;
        snprintf(worker, CM_CLUSTER_NAME_MAX, "%.40s:%ld", hn, port > 0 ? port : (long)getpid());
    }
    const char *bad = !cm_cluster_name_valid(worker) ? "--worker-name" : !cm_cluster_name_valid(host) ? "--cluster-host"
                                                                                                       : NULL;
    if (bad != NULL) {
        fprintf(stderr, "ri-worker: %s '%s': 1 to 63 characters of A-Z a-z 0-9 . _ : -%s\n", bad,
                bad[2] == 'w' ? worker : host, wk_set(bad[2] == 'w' ? cfg->worker_name : cfg->cluster_host) ? ""
                : " (the host name does not fit: give it)");
        return 2;
    }
    cl->url = cfg->cluster;
    cl->name = cfg->cluster_name;
    cl->worker = worker;
    cl->host = host;
    cl->lease_ms = (uint32_t)cfg->cluster_lease_ms;
    cl->prefix_replicas = (uint32_t)cfg->prefix_replicas;
    return 0;
}

/* --device: 0 when this build has it, else 2 after saying why. */
static int wk_device_check(const char *device)
{
    if (mdl_device_built(device))
        return 0;
    char err[256] = "";
    mdl_device_t *none = NULL;
    ri_status_t st = mdl_device_open(device, NULL, &none, err, sizeof(err)); /* fails: says why */
    fprintf(stderr, "ri-worker: --device %s\n", st != RI_OK && err[0] ? err : "unknown device (cpu or cuda)");
    return 2;
}

/* --device: the device for model (wk_dev); 0, or 2 after saying why (no
 * device, a geometry the device does not take). */
static int wk_device_open(mdl_model_t *model, const char *name)
{
    char err[512] = "";
    double t0 = cm_time_s();
    ri_status_t st = mdl_device_open(name, model, &wk_dev, err, sizeof(err));
    if (st != RI_OK) {
        fprintf(stderr, "ri-worker: --device %s: %s\n", name, err[0] ? err : ri_status_str(st));
        return 2;
    }
    fprintf(stderr, "ri-worker: decoding on the %s device: %.0f MB of fp16 weights uploaded in %.1f s; attn %s\n",
            mdl_device_name(wk_dev), (double)mdl_device_weight_bytes(wk_dev) / 1e6, cm_time_s() - t0,
            mdl_device_attns(mdl_device_name(wk_dev)));
#ifdef WK_HAVE_GW_CUDA
    /* the CUDA space is registered now: its copy engine and pinned staging
     * memory go with it (the block cache's transport, /metrics) */
    if (gw_cuda_init() != RI_OK)
        fprintf(stderr, "ri-worker: no CUDA copy engine for the block cache\n");
#endif
    return 0;
}

int main(int argc, char **argv)
{
    wk_cfg_t cfg;
    cm_config_result_t res;
    char err[512] = "", path[4096];
    mdl_model_t *model = NULL;
    int rc = 1;

    /* Same-host kvstore: let UCX use shared memory (with the daemon started
     * the same way, a round trip is ~10x shorter than over its tcp default
     * here).  An explicit UCX_TLS wins. */
    setenv("UCX_TLS", GW_UCX_TLS_LOCAL, 0);
    if (cm_config_load(&wk_table, &cfg, argc, argv, &res, err, sizeof(err)) != RI_OK) {
        fprintf(stderr, "ri-worker: %s (try --help)\n", err);
        return 2;
    }
    if (res.help || res.dump) {
        if (res.help)
            cm_config_usage(&wk_table, stdout);
        else
            cm_config_dump(&wk_table, &cfg, stdout);
        cm_config_free(&wk_table, &cfg);
        return 0;
    }
    bool serve = cfg.listen != NULL && cfg.listen[0] != '\0';
    const char *device = cfg.device != NULL && cfg.device[0] != '\0' ? cfg.device : "cpu";
    bool on_cuda = strcmp(device, "cuda") == 0;
    if ((rc = wk_device_check(device)) != 0) {
        cm_config_free(&wk_table, &cfg);
        return rc;
    }
    rc = 1;
    if (cfg.prefill_chunk % 64 != 0) {
        fprintf(stderr, "ri-worker: --prefill-chunk %lld is not a multiple of 64 (the model's chunk)\n",
                (long long)cfg.prefill_chunk);
        cm_config_free(&wk_table, &cfg);
        return 2;
    }
    sigset_t sigs;
    sigemptyset(&sigs);
    if (serve) {
        if (cfg.prompt_file != NULL && cfg.prompt_file[0] != '\0') {
            fprintf(stderr, "ri-worker: --listen and --prompt-file exclude each other (try --help)\n");
            cm_config_free(&wk_table, &cfg);
            return 2;
        }
        if ((rc = wk_listen_check(&cfg)) != 0) {
            cm_config_free(&wk_table, &cfg);
            return rc;
        }
        rc = 1;
        /* Before any thread exists (thread pool, gRPC, HTTP): every thread
         * inherits the mask, so the signals reach only sigwait. */
        sigaddset(&sigs, SIGTERM);
        sigaddset(&sigs, SIGINT);
        sigaddset(&sigs, SIGHUP); /* reloads the API keys */
        pthread_sigmask(SIG_BLOCK, &sigs, NULL);
        signal(SIGPIPE, SIG_IGN);
    }
    if (mdl_runtime_apply(&cfg.rt, err, sizeof(err)) != RI_OK) {
        fprintf(stderr, "ri-worker: %s (try --help)\n", err);
        cm_config_free(&wk_table, &cfg);
        return 2;
    }
    static char wk_worker[CM_CLUSTER_NAME_MAX], wk_host[CM_CLUSTER_NAME_MAX]; /* the backend copies them */
    gw_attn_remote_cluster_t cluster;
    if ((rc = wk_cluster_check(&cfg, &cluster, wk_worker, wk_host)) != 0) {
        cm_config_free(&wk_table, &cfg);
        return rc;
    }
    rc = 1;
    bool have_kvs = wk_set(cfg.kvstore) || cluster.url != NULL;
    char file_token[512];
    if (cfg.token_file != NULL && cfg.token_file[0] != '\0') {
        ri_status_t st = cm_file_read_token(cfg.token_file, file_token, sizeof(file_token));
        if (st != RI_OK) {
            fprintf(stderr, "ri-worker: token file %s: %s\n", cfg.token_file,
                    st == RI_ERR_FORMAT ? "holds no token" : ri_status_str(st));
            goto out;
        }
        if (cfg.token != NULL && cfg.token[0] != '\0') {
            fprintf(stderr, "ri-worker: --token and --token-file exclude each other (try --help)\n");
            rc = 2;
            goto out;
        }
    }
    const char *token = cfg.token_file && cfg.token_file[0] ? file_token : cfg.token && cfg.token[0] ? cfg.token : NULL;
    const char *default_attn = cfg.attn && cfg.attn[0] ? cfg.attn : have_kvs ? GW_ATTN_REMOTE_NAME : "full";
    if (have_kvs) {
        gw_attn_remote_cfg_t rc_cfg = {.address = cfg.kvstore, .token = token,
                                       .timeout_ms = (uint32_t)cfg.timeout_ms, .cache_frac = (float)cfg.cache_frac,
                                       .compare_full = cfg.compare_full, .deadline_us = (uint32_t)cfg.deadline_us,
                                       .tls_ca = cfg.tls_ca, .tls_cert = cfg.tls_cert, .tls_key = cfg.tls_key,
                                       .session_flags = (cfg.direct ? 0 : RI_SESSION_TWO_SIDED) |
                                                        (cfg.fetch_async ? RI_SESSION_FETCH_ASYNC : 0) |
                                                        (cfg.predict ? 0 : RI_SESSION_NO_PREDICT),
                                       .keep_kv = cfg.keep_kv, .cluster = cluster};
        ri_status_t st = gw_attn_remote_configure(&rc_cfg, err, sizeof(err));
        if (st != RI_OK && cluster.url != NULL) {
            fprintf(stderr, "ri-worker: cannot use the cluster at %s: %s\n", cluster.url, err);
            goto out;
        }
        if (st != RI_OK) {
            fprintf(stderr, "ri-worker: cannot use the kvstore at %s: %s\n", cfg.kvstore, err);
            goto out;
        }
        if (cluster.url != NULL)
            fprintf(stderr, "ri-worker: cluster '%s' at %s, placement %s, worker %s, host %s\n", cluster.name,
                    cluster.url, cm_cluster_policy_name(cluster.policy), cluster.worker, cluster.host);
    }
    /* a missing default is exit 3; a named or given file that is missing fails to load below (exit 1) */
    ri_status_t pst = mdl_model_resolve(cfg.model, path, sizeof(path));
    if (pst != RI_OK && !(pst == RI_ERR_NOT_FOUND && cfg.model != NULL && cfg.model[0] != '\0')) {
        fprintf(stderr,
                "ri-worker: no model at %s; run `./ri model fetch` (or ./ri setup) or pass --model NAME|PATH\n", path);
        rc = 3;
        goto out;
    }
    if (mdl_model_load(path, &model, err, sizeof(err)) != RI_OK) {
        fprintf(stderr, "ri-worker: cannot load %s: %s\n", path, err);
        goto out;
    }
    if (on_cuda && !have_kvs && strcmp(default_attn, GW_ATTN_REMOTE_NAME) == 0) {
        fprintf(stderr, "ri-worker: --device cuda: attn %s needs --kvstore (or --cluster)\n", default_attn);
        rc = 2;
        goto out;
    }
    if (on_cuda && !mdl_device_takes(device, default_attn)) {
        fprintf(stderr, "ri-worker: --device cuda: attn %s does not run on the device (it decodes %s; pass --attn "
                "full, retroinfer, or %s with --kvstore)\n", default_attn, mdl_device_attns(device),
                GW_ATTN_REMOTE_NAME);
        rc = 2;
        goto out;
    }
    if (on_cuda && (rc = wk_device_open(model, device)) != 0)
        goto out;
    rc = 1;
    fprintf(stderr, "ri-worker: model %s, %u threads, kvstore %s, default attn %s; backends: %s\n",
            mdl_model_name(model), cm_pool_size(cm_pool_default()),
            cluster.url != NULL ? "(cluster)" : have_kvs ? cfg.kvstore : "(none)", default_attn,
            mdl_attn_names());

    static gw_pfx_ctx_t prefix; /* outlives the scheduler */
    bool pfx_on = have_kvs && cfg.prefix_cache && wk_prefix_setup(model, &cfg, token, &prefix);
    if (serve)
        rc = wk_serve_http(model, &cfg, path, default_attn, have_kvs, pfx_on ? &prefix : NULL, &sigs);
    else
        rc = wk_serve_lines(model, &cfg, default_attn, pfx_on ? &prefix : NULL);
out:
    mdl_device_close(wk_dev); /* before the model: the engine reads its embedding */
    mdl_model_destroy(model);
    gw_attn_remote_shutdown();
    cm_config_free(&wk_table, &cfg);
    return rc;
}
