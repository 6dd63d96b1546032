/*
 * OpenAI-compatible HTTP service of ri-worker (see gw_http.h): routing,
 * request validation, the JSON and server-sent-event shapes, /metrics.
 */
#define _GNU_SOURCE
#include "gpuworker/server/gw_http.h"

#include <arpa/inet.h>
#include <cjson/cJSON.h>
#include <math.h>
#include <netinet/in.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include <microhttpd.h>

#include "common/cm_alloc.h"
#include "common/cm_hist.h"
#include "common/cm_log.h"
#include "common/cm_net.h"
#include "common/cm_status.h"
#include "common/cm_time.h"
#include "gpuworker/model/mdl_tok.h"
#include "gpuworker/client/gw_attn_cluster.h"
#include "gpuworker/client/gw_attn_remote.h"
#include "gpuworker/client/gw_meta_share.h"
#include "gpuworker/client/gw_prefix_seq.h"
#include "gpuworker/client/gw_transport.h"
#include "gpuworker/server/gw_http_guard.h"

static CM_ALLOC_TAG(gw_http_tag, "worker.http");

#define GW_HTTP_MAX_BODY (8u << 20)  /* a request body; a context's worth of text is far less */
#define GW_HTTP_IDLE_S 30u           /* a connection that moves no byte this long is closed */
#define GW_HTTP_RESERVE_MS 1000u     /* a request on a reserve slot must arrive within this */
#define GW_HTTP_PING_MS 5000u        /* a waiting stream sends a comment this often (finds gone clients) */
#define GW_HTTP_MAX_STOP 4           /* stop strings per request, as OpenAI allows */
#define GW_HTTP_MAX_TOKENS (1u << 20)

/* Endpoints and status codes counted for /metrics. */
typedef enum gw_ep {
    GW_EP_COMPLETIONS,
    GW_EP_CHAT,
    GW_EP_MODELS,
    GW_EP_HEALTH,
    GW_EP_METRICS,
    GW_EP_TOKENIZE,
    GW_EP_DETOKENIZE,
    GW_EP_OTHER,
    GW_EP_N
} gw_ep_t;
static const char *const gw_ep_name[GW_EP_N] = {"/v1/completions", "/v1/chat/completions", "/v1/models",
                                                "/health", "/metrics", "/tokenize", "/detokenize", "other"};
static const unsigned gw_codes[] = {200, 400, 401, 404, 405, 413, 429, 500, 503};
#define GW_N_CODES (CM_ARRAY_LEN(gw_codes) + 1) /* + any other */

struct gw_http {
    struct MHD_Daemon *mhd;       /* owned */
    gw_guard_t *guard;            /* owned: connection deadlines and slots */
    mdl_model_t *m;               /* borrowed */
    const mdl_tok_t *tok;         /* borrowed from m */
    gw_sched_t *sched;            /* borrowed */
    gw_http_cfg_t cfg;            /* strings point at the copies below */
    char *model_id;               /* owned copies */
    char *allow_attn;
    const mdl_attn_ops_t *default_attn;
    char addr[300];               /* bound "host:port" */
    long created;                 /* start time, for /v1/models */
    _Atomic uint64_t counts[GW_EP_N][GW_N_CODES];
    _Atomic int inflight;         /* generation requests whose answer is not all sent */
    pthread_rwlock_t keys_lock;   /* keys: read by every request, written by a reload */
    cm_keys_t *keys;              /* owned; NULL = no authentication */
};

/* What a connection accumulates: the request body. */
typedef struct gw_conn {
    char *body;      /* cm_malloc, NUL-terminated */
    size_t len, cap;
    bool too_large;  /* over GW_HTTP_MAX_BODY: answered 413 */
    bool inflight;   /* counted in gw_http_t.inflight until the answer is sent */
} gw_conn_t;

/* An error answer, OpenAI's shape. */
typedef struct gw_err {
    unsigned status;       /* HTTP status */
    const char *type;      /* "invalid_request_error", ... */
    const char *param;     /* the offending field or NULL */
    const char *code;      /* machine-readable code or NULL */
    unsigned retry_after;  /* seconds, 0 = no header */
    char msg[512];
} gw_err_t;

/* A validated generation request. */
typedef struct gw_gen {
    bool chat;
    bool stream;
    bool include_usage;                   /* stream_options.include_usage */
    int32_t *ids;                         /* prompt tokens, cm_malloc */
    size_t n_ids;
    size_t max_tokens;
    mdl_sampler_cfg_t sampler;
    const mdl_attn_ops_t *attn;
    const char *stop[GW_HTTP_MAX_STOP];   /* borrowed from the parsed body */
    size_t n_stop;
    bool ignore_eos;                      /* vLLM's and llama-server's extension */
} gw_gen_t;

/* Makes the seeds of requests without one differ even within a nanosecond. */
static _Atomic uint64_t gw_seed_seq;

static bool gw_err_set(gw_err_t *e, unsigned status, const char *type, const char *param, const char *code,
                       const char *fmt, ...) __attribute__((format(printf, 6, 7)));
static bool gw_err_set(gw_err_t *e, unsigned status, const char *type, const char *param, const char *code,
                       const char *fmt, ...)
{
    va_list ap;
    e->status = status;
    e->type = type;
    e->param = param;
    e->code = code;
    e->retry_after = 0;
    va_start(ap, fmt);
    vsnprintf(e->msg, sizeof(e->msg), fmt, ap);
    va_end(ap);
    return false;
}

#define GW_BAD(e, param, ...) gw_err_set((e), 400, "invalid_request_error", (param), NULL, __VA_ARGS__)

static void gw_http_count(gw_http_t *h, gw_ep_t ep, unsigned code)
{
    size_t k = CM_ARRAY_LEN(gw_codes);
    for (size_t i = 0; i < CM_ARRAY_LEN(gw_codes); i++)
        if (gw_codes[i] == code)
            k = i;
    atomic_fetch_add(&h->counts[ep][k], 1);
}

/* ---- responses ---- */

static enum MHD_Result gw_http_send(gw_http_t *h, struct MHD_Connection *conn, gw_ep_t ep, unsigned code,
                                    const char *body, size_t len, const char *ctype, unsigned retry_after)
{
    struct MHD_Response *resp = MHD_create_response_from_buffer(len, (void *)body, MHD_RESPMEM_MUST_COPY);
    if (resp == NULL)
        return MHD_NO;
    MHD_add_response_header(resp, "Content-Type", ctype);
    if (code == MHD_HTTP_UNAUTHORIZED)
        MHD_add_response_header(resp, "WWW-Authenticate", "Bearer realm=\"ri-worker\"");
    if (retry_after > 0) {
        char ra[16];
        snprintf(ra, sizeof(ra), "%u", retry_after);
        MHD_add_response_header(resp, "Retry-After", ra);
    }
    enum MHD_Result ret = MHD_queue_response(conn, code, resp);
    MHD_destroy_response(resp);
    gw_http_count(h, ep, code);
    return ret;
}

/* Send obj as JSON (takes ownership of obj). */
static enum MHD_Result gw_http_json(gw_http_t *h, struct MHD_Connection *conn, gw_ep_t ep, unsigned code,
                                    cJSON *obj, unsigned retry_after)
{
    char *s = obj ? cJSON_PrintUnformatted(obj) : NULL;
    cJSON_Delete(obj);
    if (s == NULL)
        return MHD_NO;
    enum MHD_Result ret = gw_http_send(h, conn, ep, code, s, strlen(s), "application/json", retry_after);
    cJSON_free(s);
    return ret;
}

static cJSON *gw_err_json(const gw_err_t *e)
{
    cJSON *o = cJSON_CreateObject(), *er = cJSON_AddObjectToObject(o, "error");
    cJSON_AddStringToObject(er, "message", e->msg);
    cJSON_AddStringToObject(er, "type", e->type);
    if (e->param != NULL)
        cJSON_AddStringToObject(er, "param", e->param);
    else
        cJSON_AddNullToObject(er, "param");
    if (e->code != NULL)
        cJSON_AddStringToObject(er, "code", e->code);
    else
        cJSON_AddNullToObject(er, "code");
    return o;
}

static enum MHD_Result gw_http_fail(gw_http_t *h, struct MHD_Connection *conn, gw_ep_t ep, const gw_err_t *e)
{
    return gw_http_json(h, conn, ep, e->status, gw_err_json(e), e->retry_after);
}

/* A copy of s[0, n) that is valid UTF-8 (JSON text must be): a byte that
 * does not belong to a well-formed sequence, or a NUL, becomes U+FFFD.
 * Caller frees with cm_free; NULL when out of memory. */
static char *gw_utf8_clean(const char *s, size_t n)
{
    char *o = cm_malloc(&gw_http_tag, 3 * n + 1);
    size_t k = 0;
    if (o == NULL)
        return NULL;
    for (size_t i = 0; i < n;) {
        unsigned char c = (unsigned char)s[i];
        size_t len = c >= 0x01 && c < 0x80 ? 1 : c >= 0xC2 && c < 0xE0 ? 2 : c >= 0xE0 && c < 0xF0 ? 3
                   : c >= 0xF0 && c < 0xF5 ? 4 : 0;
        bool ok = len > 0 && i + len <= n;
        for (size_t j = 1; ok && j < len; j++)
            ok = ((unsigned char)s[i + j] & 0xC0) == 0x80;
        if (ok) {
            memcpy(o + k, s + i, len);
            k += len;
            i += len;
        } else {
            memcpy(o + k, "\xEF\xBF\xBD", 3);
            k += 3;
            i++;
        }
    }
    o[k] = '\0';
    return o;
}

static void gw_http_new_id(const char *prefix, char *buf, size_t len)
{
    uint8_t r[12];
    if (getrandom(r, sizeof(r), GRND_NONBLOCK) != (ssize_t)sizeof(r)) {
        uint64_t t = cm_time_ns();
        memcpy(r, &t, 8);
        memset(r + 8, 0, 4);
    }
    size_t k = (size_t)snprintf(buf, len, "%s", prefix);
    for (size_t i = 0; i < sizeof(r) && k + 2 < len; i++, k += 2)
        snprintf(buf + k, len - k, "%02x", r[i]);
}

/* ---- request validation ---- */

#define GW_HTTP_MAX_DEPTH 64  /* JSON nesting of a body; ours needs 4 */

/* Length of the well-formed UTF-8 sequence at p[0, n) (RFC 3629: no
 * overlong forms, no surrogates, nothing above U+10FFFF), 0 if it is not
 * one. */
static size_t gw_utf8_len(const unsigned char *p, size_t n)
{
    unsigned char c = p[0];
    size_t len = c < 0x80 ? 1 : c >= 0xC2 && c < 0xE0 ? 2 : c >= 0xE0 && c < 0xF0 ? 3 : c >= 0xF0 && c < 0xF5 ? 4 : 0;
    if (len == 0 || len > n)
        return 0;
    for (size_t j = 1; j < len; j++)
        if ((p[j] & 0xC0) != 0x80)
            return 0;
    if ((c == 0xE0 && p[1] < 0xA0) || (c == 0xED && p[1] >= 0xA0) || (c == 0xF0 && p[1] < 0x90) ||
        (c == 0xF4 && p[1] >= 0x90))
        return 0;
    return len;
}

/* What a body must be before cJSON parses it, checked in one cheap pass:
 * UTF-8 text, no NUL (raw or escaped as \u0000: the tokenizer takes C
 * strings, so a NUL would cut the prompt silently), at most
 * GW_HTTP_MAX_DEPTH levels, and no list of more than max_elems elements (a
 * prompt of a million token ids is refused here, before cJSON builds a
 * node for each).  Returns false with e set (400). */
static bool gw_body_check(const char *body, size_t n, size_t max_elems, gw_err_t *e)
{
    const unsigned char *s = (const unsigned char *)body;
    size_t commas[GW_HTTP_MAX_DEPTH];
    bool is_list[GW_HTTP_MAX_DEPTH], in_str = false;
    size_t depth = 0;
    for (size_t i = 0; i < n;) {
        unsigned char c = s[i];
        if (c == 0)
            return GW_BAD(e, NULL, "the body contains a NUL byte (at byte %zu)", i);
        if (c >= 0x80) {
            size_t len = gw_utf8_len(s + i, n - i);
            if (len == 0)
                return GW_BAD(e, NULL, "the body is not valid UTF-8 (at byte %zu)", i);
            i += len;
            continue;
        }
        if (in_str) {
            if (c == '\\' && i + 5 < n && s[i + 1] == 'u' && memcmp(s + i + 2, "0000", 4) == 0)
                return GW_BAD(e, NULL, "a string contains U+0000 (NUL, at byte %zu): text with NUL characters is "
                              "not accepted", i);
            in_str = c != '"';
            i += c == '\\' ? 2 : 1;
            continue;
        }
        if (c == '"') {
            in_str = true;
        } else if (c == '[' || c == '{') {
            if (depth == GW_HTTP_MAX_DEPTH)
                return GW_BAD(e, NULL, "the body nests deeper than %d levels", GW_HTTP_MAX_DEPTH);
            is_list[depth] = c == '[';
            commas[depth++] = 0;
        } else if ((c == ']' || c == '}') && depth > 0) {
            depth--;
        } else if (c == ',' && depth > 0 && is_list[depth - 1] && ++commas[depth - 1] >= max_elems) {
            return gw_err_set(e, 400, "invalid_request_error", NULL, "context_length_exceeded",
                              "a list in the body has more than %zu elements, more than this model's context of "
                              "%zu tokens can hold", max_elems, max_elems);
        }
        i++;
    }
    return true;
}

/* The field, or NULL when absent or JSON null. */
static const cJSON *gw_field(const cJSON *o, const char *name)
{
    const cJSON *it = cJSON_GetObjectItemCaseSensitive(o, name);
    return it == NULL || cJSON_IsNull(it) ? NULL : it;
}

static bool gw_is_int(const cJSON *it)
{
    return cJSON_IsNumber(it) && it->valuedouble == floor(it->valuedouble) && fabs(it->valuedouble) < 9.0e15;
}

/* Is name one of the comma-separated words of list? */
static bool gw_in_list(const char *list, const char *name)
{
    size_t n = strlen(name);
    for (const char *p = list; p != NULL && *p != '\0';) {
        const char *q = strchr(p, ',');
        size_t l = q ? (size_t)(q - p) : strlen(p);
        while (l > 0 && (*p == ' ')) {
            p++;
            l--;
        }
        while (l > 0 && p[l - 1] == ' ')
            l--;
        if (l == n && strncmp(p, name, n) == 0)
            return true;
        p = q ? q + 1 : NULL;
    }
    return false;
}

/* Sampling values, lengths, stop strings, streaming, the backend. */
static bool gw_parse_options(gw_http_t *h, const cJSON *b, gw_gen_t *g, bool *has_max_p, gw_err_t *e)
{
    const cJSON *it;
    g->sampler = (mdl_sampler_cfg_t){.temperature = 1.0f, .top_p = 1.0f};
    if ((it = gw_field(b, "temperature")) != NULL) {
        if (!cJSON_IsNumber(it) || !(it->valuedouble >= 0 && it->valuedouble <= 2))
            return GW_BAD(e, "temperature", "temperature must be a number from 0 to 2");
        g->sampler.temperature = (float)it->valuedouble;
    }
    if ((it = gw_field(b, "top_p")) != NULL) {
        if (!cJSON_IsNumber(it) || !(it->valuedouble > 0 && it->valuedouble <= 1))
            return GW_BAD(e, "top_p", "top_p must be a number in (0, 1]");
        g->sampler.top_p = (float)it->valuedouble;
    }
    g->sampler.seed = cm_time_ns() ^ (atomic_fetch_add(&gw_seed_seq, 1) * 0x9E3779B97F4A7C15ull);
    if ((it = gw_field(b, "seed")) != NULL) {
        if (!gw_is_int(it))
            return GW_BAD(e, "seed", "seed must be an integer");
        g->sampler.seed = (uint64_t)(int64_t)it->valuedouble;
    }
    /* ignore_eos (an extension vLLM and llama-server share): generate
     * exactly max_tokens, the stop token counting like any other, for
     * benchmarks that must compare runs of one length. */
    if ((it = gw_field(b, "ignore_eos")) != NULL) {
        if (!cJSON_IsBool(it))
            return GW_BAD(e, "ignore_eos", "ignore_eos must be true or false");
        g->ignore_eos = cJSON_IsTrue(it);
    }
    const char *mt_name = "max_tokens";
    if ((it = gw_field(b, "max_tokens")) == NULL && g->chat && (it = gw_field(b, "max_completion_tokens")) != NULL)
        mt_name = "max_completion_tokens";
    *has_max_p = it != NULL;
    if (it != NULL) {
        if (!gw_is_int(it) || it->valuedouble < 1 || it->valuedouble > GW_HTTP_MAX_TOKENS)
            return GW_BAD(e, mt_name, "%s must be an integer from 1 to %u", mt_name, GW_HTTP_MAX_TOKENS);
        g->max_tokens = (size_t)it->valuedouble;
    }
    if ((it = gw_field(b, "n")) != NULL) {
        if (!gw_is_int(it) || it->valuedouble < 1)
            return GW_BAD(e, "n", "n must be a positive integer");
        if (it->valuedouble > 1)
            return gw_err_set(e, 400, "invalid_request_error", "n", "unsupported_value",
                              "n > 1 is not supported by this server: send one request per choice");
    }
    if ((it = gw_field(b, "best_of")) != NULL && !(gw_is_int(it) && it->valuedouble == 1))
        return gw_err_set(e, 400, "invalid_request_error", "best_of", "unsupported_value",
                          "best_of other than 1 is not supported");
    if ((it = gw_field(b, "stream")) != NULL) {
        if (!cJSON_IsBool(it))
            return GW_BAD(e, "stream", "stream must be true or false");
        g->stream = cJSON_IsTrue(it);
    }
    if ((it = gw_field(b, "stream_options")) != NULL) {
        const cJSON *iu = cJSON_IsObject(it) ? gw_field(it, "include_usage") : NULL;
        if (!cJSON_IsObject(it) || (iu != NULL && !cJSON_IsBool(iu)))
            return GW_BAD(e, "stream_options", "stream_options must be an object like {\"include_usage\": true}");
        if (!g->stream)
            return GW_BAD(e, "stream_options", "stream_options is only allowed with stream: true");
        g->include_usage = cJSON_IsTrue(iu);
    }
    if ((it = gw_field(b, "stop")) != NULL) {
        if (cJSON_IsString(it)) {
            g->stop[g->n_stop++] = it->valuestring;
        } else if (cJSON_IsArray(it) && cJSON_GetArraySize(it) <= GW_HTTP_MAX_STOP) {
            const cJSON *s;
            cJSON_ArrayForEach(s, it)
            {
                if (!cJSON_IsString(s))
                    return GW_BAD(e, "stop", "stop must be a string or a list of strings");
                g->stop[g->n_stop++] = s->valuestring;
            }
        } else {
            return GW_BAD(e, "stop", "stop must be a string or a list of up to %d strings", GW_HTTP_MAX_STOP);
        }
    }
    /* What we do not implement is refused rather than silently ignored. */
    if ((it = gw_field(b, "logprobs")) != NULL && !(cJSON_IsFalse(it) || (gw_is_int(it) && it->valuedouble == 0)))
        return gw_err_set(e, 400, "invalid_request_error", "logprobs", "unsupported_value",
                          "logprobs are not supported by this server");
    if (gw_field(b, "top_logprobs") != NULL)
        return gw_err_set(e, 400, "invalid_request_error", "top_logprobs", "unsupported_value",
                          "top_logprobs are not supported by this server");
    if ((it = gw_field(b, "echo")) != NULL && !cJSON_IsFalse(it))
        return gw_err_set(e, 400, "invalid_request_error", "echo", "unsupported_value", "echo is not supported");
    if ((it = gw_field(b, "suffix")) != NULL && !(cJSON_IsString(it) && it->valuestring[0] == '\0'))
        return gw_err_set(e, 400, "invalid_request_error", "suffix", "unsupported_value", "suffix is not supported");
    static const char *const penalties[] = {"presence_penalty", "frequency_penalty"};
    for (size_t i = 0; i < CM_ARRAY_LEN(penalties); i++)
        if ((it = gw_field(b, penalties[i])) != NULL && !(cJSON_IsNumber(it) && it->valuedouble == 0))
            return gw_err_set(e, 400, "invalid_request_error", penalties[i], "unsupported_value",
                              "%s other than 0 is not supported", penalties[i]);
    if ((it = gw_field(b, "logit_bias")) != NULL && !(cJSON_IsObject(it) && it->child == NULL))
        return gw_err_set(e, 400, "invalid_request_error", "logit_bias", "unsupported_value",
                          "logit_bias is not supported");
    if ((it = gw_field(b, "tools")) != NULL && !(cJSON_IsArray(it) && it->child == NULL))
        return gw_err_set(e, 400, "invalid_request_error", "tools", "unsupported_value", "tools are not supported");
    g->attn = h->default_attn;
    if ((it = gw_field(b, "attn")) != NULL) {
        if (!cJSON_IsString(it))
            return GW_BAD(e, "attn", "attn must be a string (one of: %s)", h->allow_attn);
        const mdl_attn_ops_t *ops = mdl_attn_find(it->valuestring);
        if (!gw_in_list(h->allow_attn, it->valuestring) || ops == NULL)
            return GW_BAD(e, "attn", "attn '%.64s' is not available on this server (allowed: %s)", it->valuestring,
                          h->allow_attn);
        g->attn = ops;
    }
    return true;
}

/* Text of a chat message's content: a string, or a list of {"type": "text",
 * "text": ...} parts joined (*owned_p is then a new buffer, cm_free). */
static bool gw_content_text(const cJSON *c, size_t i, const char **text_p, char **owned_p, gw_err_t *e)
{
    *owned_p = NULL;
    if (c == NULL) {
        *text_p = "";
        return true;
    }
    if (cJSON_IsString(c)) {
        *text_p = c->valuestring;
        return true;
    }
    if (!cJSON_IsArray(c))
        return GW_BAD(e, "messages", "messages[%zu].content must be a string or a list of text parts", i);
    size_t len = 0;
    const cJSON *p;
    cJSON_ArrayForEach(p, c)
    {
        const cJSON *ty = cJSON_GetObjectItemCaseSensitive(p, "type"), *tx = cJSON_GetObjectItemCaseSensitive(p, "text");
        if (!cJSON_IsString(ty) || strcmp(ty->valuestring, "text") != 0 || !cJSON_IsString(tx))
            return GW_BAD(e, "messages", "messages[%zu].content: only {\"type\": \"text\", \"text\": ...} parts "
                          "are supported", i);
        len += strlen(tx->valuestring);
    }
    char *buf = cm_malloc(&gw_http_tag, len + 1);
    if (buf == NULL)
        return gw_err_set(e, 500, "server_error", NULL, NULL, "out of memory");
    size_t k = 0;
    cJSON_ArrayForEach(p, c)
    {
        const char *tx = cJSON_GetObjectItemCaseSensitive(p, "text")->valuestring;
        memcpy(buf + k, tx, strlen(tx));
        k += strlen(tx);
    }
    buf[k] = '\0';
    *text_p = *owned_p = buf;
    return true;
}

/* messages -> the chat template's tokens. */
static bool gw_parse_messages(gw_http_t *h, const cJSON *b, gw_gen_t *g, gw_err_t *e)
{
    const cJSON *msgs = gw_field(b, "messages"), *m;
    if (msgs == NULL)
        return GW_BAD(e, "messages", "you must provide messages");
    int n = cJSON_IsArray(msgs) ? cJSON_GetArraySize(msgs) : 0;
    if (n == 0)
        return GW_BAD(e, "messages", "messages must be a non-empty list of {\"role\", \"content\"} objects");
    mdl_chat_msg_t *cm = cm_calloc(&gw_http_tag, (size_t)n, sizeof(*cm));
    char **owned = cm_calloc(&gw_http_tag, (size_t)n, sizeof(*owned));
    bool ok = cm != NULL && owned != NULL;
    size_t i = 0;
    if (!ok)
        gw_err_set(e, 500, "server_error", NULL, NULL, "out of memory");
    cJSON_ArrayForEach(m, msgs)
    {
        if (!ok)
            break;
        const cJSON *role = cJSON_IsObject(m) ? cJSON_GetObjectItemCaseSensitive(m, "role") : NULL;
        if (!cJSON_IsString(role)) {
            ok = GW_BAD(e, "messages", "messages[%zu] must be an object with a string role", i);
            break;
        }
        const char *r = role->valuestring;
        if (strcmp(r, "developer") == 0)
            r = "system"; /* OpenAI's newer name for the system turn */
        if (strcmp(r, "system") != 0 && strcmp(r, "user") != 0 && strcmp(r, "assistant") != 0) {
            ok = GW_BAD(e, "messages", "messages[%zu].role '%.32s' is not one of system, developer, user, assistant",
                        i, role->valuestring);
            break;
        }
        const cJSON *c = gw_field(m, "content");
        if (c == NULL && strcmp(r, "assistant") != 0) {
            ok = GW_BAD(e, "messages", "messages[%zu].content is missing", i);
            break;
        }
        cm[i].role = r;
        if (!(ok = gw_content_text(c, i, &cm[i].content, &owned[i], e)))
            break;
        i++;
    }
    if (ok) {
        ri_status_t st = mdl_tok_chat_msgs(h->tok, cm, (size_t)n, &g->ids, &g->n_ids);
        if (st != RI_OK)
            ok = gw_err_set(e, 500, "server_error", NULL, NULL, "cannot tokenize the messages: %s", ri_status_str(st));
    }
    for (int k = 0; owned != NULL && k < n; k++)
        cm_free(owned[k]);
    cm_free(owned);
    cm_free(cm);
    return ok;
}

/* prompt: a string, a list of one string, a list of token ids (or a list
 * of one such list). */
static bool gw_parse_prompt(gw_http_t *h, const cJSON *b, gw_gen_t *g, gw_err_t *e)
{
    const cJSON *p = gw_field(b, "prompt");
    size_t n_vocab = mdl_tok_vocab(h->tok);
    if (p == NULL)
        return GW_BAD(e, "prompt", "you must provide a prompt");
    if (cJSON_IsArray(p) && cJSON_GetArraySize(p) == 1 && (cJSON_IsString(p->child) || cJSON_IsArray(p->child)))
        p = p->child;
    if (cJSON_IsString(p)) {
        /* with the model's bos when it wants one (Gemma does, SmolLM2 not) */
        ri_status_t st = mdl_tok_encode_prompt(h->tok, p->valuestring, strlen(p->valuestring), &g->ids, &g->n_ids);
        if (st != RI_OK)
            return gw_err_set(e, 500, "server_error", NULL, NULL, "cannot tokenize the prompt: %s", ri_status_str(st));
        return true;
    }
    int n = cJSON_IsArray(p) ? cJSON_GetArraySize(p) : 0;
    if (n > 1 && (cJSON_IsString(p->child) || cJSON_IsArray(p->child)))
        return gw_err_set(e, 400, "invalid_request_error", "prompt", "unsupported_value",
                          "several prompts in one request are not supported: send one request per prompt");
    if (n == 0)
        return GW_BAD(e, "prompt", "prompt must be a string, a list of one string, or a list of token ids "
                      "(several prompts in one request are not supported)");
    if ((g->ids = cm_malloc(&gw_http_tag, (size_t)n * sizeof(int32_t))) == NULL)
        return gw_err_set(e, 500, "server_error", NULL, NULL, "out of memory");
    const cJSON *t;
    cJSON_ArrayForEach(t, p)
    {
        if (!gw_is_int(t) || t->valuedouble < 0 || t->valuedouble >= (double)n_vocab)
            return GW_BAD(e, "prompt", "prompt token ids must be integers from 0 to %zu", n_vocab - 1);
        g->ids[g->n_ids++] = (int32_t)t->valuedouble;
    }
    return true;
}

/* The whole body of a completion or chat completion request. */
static bool gw_parse_gen(gw_http_t *h, const cJSON *b, gw_gen_t *g, gw_err_t *e)
{
    bool has_max = false;
    if (!cJSON_IsObject(b))
        return GW_BAD(e, NULL, "the body must be a JSON object");
    const cJSON *model = gw_field(b, "model");
    if (model == NULL)
        return GW_BAD(e, "model", "you must provide a model parameter");
    if (!cJSON_IsString(model))
        return GW_BAD(e, "model", "model must be a string");
    if (strcmp(model->valuestring, h->model_id) != 0)
        return gw_err_set(e, 404, "invalid_request_error", "model", "model_not_found",
                          "the model '%.128s' does not exist on this server (it serves '%s')", model->valuestring,
                          h->model_id);
    if (!gw_parse_options(h, b, g, &has_max, e))
        return false;
    if (!(g->chat ? gw_parse_messages(h, b, g, e) : gw_parse_prompt(h, b, g, e)))
        return false;
    const char *what = g->chat ? "messages" : "prompt";
    if (g->n_ids == 0)
        return GW_BAD(e, what, "the %s is empty (no tokens)", what);
    if (g->n_ids >= h->cfg.ctx)
        return gw_err_set(e, 400, "invalid_request_error", what, "context_length_exceeded",
                          "this model's context is %zu tokens; the %s has %zu, which leaves no room to generate",
                          h->cfg.ctx, what, g->n_ids);
    if (!has_max)
        g->max_tokens = CM_MIN(h->cfg.default_max_tokens, h->cfg.ctx - g->n_ids);
    else if (g->n_ids + g->max_tokens > h->cfg.ctx)
        return gw_err_set(e, 400, "invalid_request_error", what, "context_length_exceeded",
                          "this model's context is %zu tokens; the %s has %zu and max_tokens asks for %zu more",
                          h->cfg.ctx, what, g->n_ids, g->max_tokens);
    return true;
}

/* ---- answers ---- */

/* The fields every completion object starts with. */
static cJSON *gw_head(gw_http_t *h, const char *id, const char *object, long created)
{
    cJSON *o = cJSON_CreateObject();
    cJSON_AddStringToObject(o, "id", id);
    cJSON_AddStringToObject(o, "object", object);
    cJSON_AddNumberToObject(o, "created", (double)created);
    cJSON_AddStringToObject(o, "model", h->model_id);
    return o;
}

static void gw_add_usage(cJSON *o, const gw_req_view_t *v)
{
    cJSON *u = cJSON_AddObjectToObject(o, "usage");
    cJSON_AddNumberToObject(u, "prompt_tokens", (double)v->prompt_tokens);
    cJSON_AddNumberToObject(u, "completion_tokens", (double)v->completion_tokens);
    cJSON_AddNumberToObject(u, "total_tokens", (double)(v->prompt_tokens + v->completion_tokens));
    cJSON *d = cJSON_AddObjectToObject(u, "prompt_tokens_details");
    cJSON_AddNumberToObject(d, "cached_tokens", (double)v->cached_tokens);
}

/* One choice: text (completion) or message/delta (chat); text NULL = none. */
static void gw_add_choice(cJSON *choices, bool chat, bool delta, bool role, const char *text, const char *finish)
{
    cJSON *c = cJSON_CreateObject();
    cJSON_AddNumberToObject(c, "index", 0);
    if (chat) {
        cJSON *m = cJSON_AddObjectToObject(c, delta ? "delta" : "message");
        if (role)
            cJSON_AddStringToObject(m, "role", "assistant");
        if (text != NULL)
            cJSON_AddStringToObject(m, "content", text);
    } else {
        cJSON_AddStringToObject(c, "text", text ? text : "");
    }
    cJSON_AddNullToObject(c, "logprobs");
    if (finish != NULL)
        cJSON_AddStringToObject(c, "finish_reason", finish);
    else
        cJSON_AddNullToObject(c, "finish_reason");
    cJSON_AddItemToArray(choices, c);
}

/* A finished request that did not end by stop or length, as an error. */
static void gw_view_err(const gw_req_view_t *v, gw_err_t *e)
{
    if (v->finish == GW_FINISH_CANCELLED && v->status == RI_ERR_SHUTDOWN) {
        gw_err_set(e, 503, "server_error", NULL, "shutting_down", "%s", v->error);
        e->retry_after = 5;
    } else {
        gw_err_set(e, 500, "server_error", NULL, NULL, "generation failed: %s",
                   v->error[0] ? v->error : ri_status_str(v->status));
    }
}

/* A streaming answer: server-sent events, one per piece of text. */
typedef struct gw_stream {
    gw_http_t *h;
    gw_req_t *req;       /* own reference */
    bool chat;
    bool include_usage;
    bool role_sent;      /* chat: the first chunk (role) is out */
    bool ended;          /* everything up to [DONE] is in pend */
    char id[64];
    long created;
    size_t from;         /* text bytes sent */
    char *pend;          /* bytes to send (cm_malloc) */
    size_t pend_len, pend_off;
} gw_stream_t;

/* Append raw bytes to the stream's pending bytes. */
static void gw_stream_raw(gw_stream_t *s, const char *text)
{
    size_t n = strlen(text);
    char *p = cm_realloc(&gw_http_tag, s->pend, s->pend_len + n + 1);
    if (p == NULL)
        return; /* the event is lost; the stream goes on */
    memcpy(p + s->pend_len, text, n + 1);
    s->pend = p;
    s->pend_len += n;
}

/* Append the event "data: <obj>\n\n" (takes ownership of obj). */
static void gw_stream_event(gw_stream_t *s, cJSON *obj)
{
    char *js = cJSON_PrintUnformatted(obj);
    cJSON_Delete(obj);
    if (js == NULL)
        return;
    gw_stream_raw(s, "data: ");
    gw_stream_raw(s, js);
    gw_stream_raw(s, "\n\n");
    cJSON_free(js);
}

static cJSON *gw_stream_chunk(gw_stream_t *s, const char *text, const char *finish, bool role)
{
    cJSON *o = gw_head(s->h, s->id, s->chat ? "chat.completion.chunk" : "text_completion", s->created);
    gw_add_choice(cJSON_AddArrayToObject(o, "choices"), s->chat, true, role, text, finish);
    return o;
}

/* Wait for the next piece and turn it into events. */
static void gw_stream_fill(gw_stream_t *s)
{
    char *text = NULL;
    size_t n = 0;
    gw_req_view_t v;
    s->pend_len = s->pend_off = 0;
    if (s->chat && !s->role_sent) {
        gw_stream_event(s, gw_stream_chunk(s, "", NULL, true));
        s->role_sent = true;
        return;
    }
    ri_status_t st = gw_req_take(s->req, s->from, GW_HTTP_PING_MS, &text, &n, &v);
    if (st == RI_ERR_TIMEOUT) {
        gw_stream_raw(s, ": waiting\n\n"); /* a comment: clients skip it, a closed socket shows */
        return;
    }
    if (n > 0) {
        char *clean = gw_utf8_clean(text, n);
        if (clean != NULL)
            gw_stream_event(s, gw_stream_chunk(s, clean, NULL, false));
        cm_free(clean);
        s->from += n;
    }
    cm_free(text);
    if (st != RI_OK && st != RI_ERR_TIMEOUT) {
        gw_err_t e;
        gw_err_set(&e, 500, "server_error", NULL, NULL, "%s", ri_status_str(st));
        gw_stream_event(s, gw_err_json(&e));
        gw_stream_raw(s, "data: [DONE]\n\n");
        s->ended = true;
        return;
    }
    if (!v.done)
        return;
    const char *fin = gw_finish_str(v.finish);
    if (fin == NULL) {
        /* Headers are out with 200: the failure goes in an error event. */
        gw_err_t e;
        gw_view_err(&v, &e);
        gw_stream_event(s, gw_err_json(&e));
    } else {
        gw_stream_event(s, gw_stream_chunk(s, NULL, fin, false));
        if (s->include_usage) {
            cJSON *o = gw_head(s->h, s->id, s->chat ? "chat.completion.chunk" : "text_completion", s->created);
            cJSON_AddArrayToObject(o, "choices");
            gw_add_usage(o, &v);
            gw_stream_event(s, o);
        }
    }
    gw_stream_raw(s, "data: [DONE]\n\n");
    s->ended = true;
}

static ssize_t gw_stream_read(void *cls, uint64_t pos, char *buf, size_t max)
{
    gw_stream_t *s = cls;
    (void)pos;
    for (;;) {
        if (s->pend_off < s->pend_len) {
            size_t n = CM_MIN(max, s->pend_len - s->pend_off);
            memcpy(buf, s->pend + s->pend_off, n);
            s->pend_off += n;
            return (ssize_t)n;
        }
        if (s->ended)
            return MHD_CONTENT_READER_END_OF_STREAM;
        gw_stream_fill(s);
    }
}

/* The response is done with (sent, or the client went away): a request
 * still running is cancelled, so that it leaves the batch. */
static void gw_stream_free(void *cls)
{
    gw_stream_t *s = cls;
    gw_req_cancel(s->req);
    gw_req_release(s->req);
    cm_free(s->pend);
    cm_free(s);
}

static enum MHD_Result gw_http_stream(gw_http_t *h, struct MHD_Connection *conn, gw_ep_t ep, const gw_gen_t *g,
                                      gw_req_t *req)
{
    gw_stream_t *s = cm_calloc(&gw_http_tag, 1, sizeof(*s));
    if (s == NULL) {
        gw_req_cancel(req);
        gw_req_release(req);
        return MHD_NO;
    }
    s->h = h;
    s->req = req;
    s->chat = g->chat;
    s->include_usage = g->include_usage;
    s->created = (long)time(NULL);
    gw_http_new_id(g->chat ? "chatcmpl-" : "cmpl-", s->id, sizeof(s->id));
    struct MHD_Response *resp = MHD_create_response_from_callback(MHD_SIZE_UNKNOWN, 16 * 1024, gw_stream_read, s,
                                                                  gw_stream_free);
    if (resp == NULL) {
        gw_stream_free(s);
        return MHD_NO;
    }
    MHD_add_response_header(resp, "Content-Type", "text/event-stream");
    MHD_add_response_header(resp, "Cache-Control", "no-cache");
    enum MHD_Result ret = MHD_queue_response(conn, MHD_HTTP_OK, resp);
    MHD_destroy_response(resp);
    gw_http_count(h, ep, MHD_HTTP_OK);
    return ret;
}

/* Wait for the whole text, then answer in one JSON object. */
static enum MHD_Result gw_http_whole(gw_http_t *h, struct MHD_Connection *conn, gw_ep_t ep, const gw_gen_t *g,
                                     gw_req_t *req)
{
    char *all = NULL;
    size_t len = 0;
    gw_req_view_t v;
    gw_err_t e;
    /* No idle timeout while the connection waits for the model (setting
     * one again afterwards restarts its clock). */
    MHD_set_connection_option(conn, MHD_CONNECTION_OPTION_TIMEOUT, 0u);
    for (;;) {
        char *text = NULL;
        size_t n = 0;
        ri_status_t st = gw_req_take(req, len, 1000, &text, &n, &v);
        if (st != RI_OK && st != RI_ERR_TIMEOUT) {
            cm_free(all);
            gw_req_cancel(req);
            gw_req_release(req);
            MHD_set_connection_option(conn, MHD_CONNECTION_OPTION_TIMEOUT, GW_HTTP_IDLE_S);
            gw_err_set(&e, 500, "server_error", NULL, NULL, "%s", ri_status_str(st));
            return gw_http_fail(h, conn, ep, &e);
        }
        if (n > 0) {
            char *a = cm_realloc(&gw_http_tag, all, len + n + 1);
            if (a != NULL) {
                memcpy(a + len, text, n);
                len += n;
                a[len] = '\0';
                all = a;
            }
        }
        cm_free(text);
        if (v.done)
            break;
    }
    MHD_set_connection_option(conn, MHD_CONNECTION_OPTION_TIMEOUT, GW_HTTP_IDLE_S);
    gw_req_release(req);
    const char *fin = gw_finish_str(v.finish);
    if (fin == NULL) {
        cm_free(all);
        gw_view_err(&v, &e);
        return gw_http_fail(h, conn, ep, &e);
    }
    char *clean = gw_utf8_clean(all ? all : "", len);
    cm_free(all);
    char id[64];
    gw_http_new_id(g->chat ? "chatcmpl-" : "cmpl-", id, sizeof(id));
    cJSON *o = gw_head(h, id, g->chat ? "chat.completion" : "text_completion", (long)time(NULL));
    gw_add_choice(cJSON_AddArrayToObject(o, "choices"), g->chat, false, true, clean ? clean : "", fin);
    gw_add_usage(o, &v);
    cm_free(clean);
    return gw_http_json(h, conn, ep, MHD_HTTP_OK, o, 0);
}

static enum MHD_Result gw_http_generate(gw_http_t *h, struct MHD_Connection *conn, gw_ep_t ep, gw_conn_t *c)
{
    gw_gen_t g = {.chat = ep == GW_EP_CHAT};
    gw_err_t e;
    gw_req_t *req = NULL;
    enum MHD_Result ret;
    cJSON *body = NULL;

    if (c->body != NULL && !gw_body_check(c->body, c->len, h->cfg.ctx, &e))
        goto fail;
    if (c->body != NULL)
        body = cJSON_ParseWithLength(c->body, c->len);
    if (body == NULL) {
        GW_BAD(&e, NULL, "we could not parse the JSON body of your request (it must be a JSON object)");
        goto fail;
    }
    if (!gw_parse_gen(h, body, &g, &e))
        goto fail;
    gw_req_params_t p = {.ids = g.ids, .n_ids = g.n_ids, .max_tokens = g.max_tokens, .sampler = g.sampler,
                         .attn = g.attn, .stop = g.stop, .n_stop = g.n_stop, .ignore_eos = g.ignore_eos};
    ri_status_t st = gw_req_create(&p, &req);
    if (st != RI_OK) {
        gw_err_set(&e, 500, "server_error", NULL, NULL, "cannot create the request: %s", ri_status_str(st));
        goto fail;
    }
    st = gw_sched_submit(h->sched, req);
    if (st == RI_ERR_BUSY) {
        gw_err_set(&e, 429, "requests", NULL, "rate_limit_exceeded",
                   "the worker's queue is full; retry after a moment");
        e.retry_after = 1;
        goto fail;
    }
    if (st != RI_OK) {
        gw_err_set(&e, 503, "server_error", NULL, "shutting_down", "the worker is shutting down");
        e.retry_after = 5;
        goto fail;
    }
    cJSON_Delete(body);
    cm_free(g.ids);
    /* the request's reference passes to the answer */
    return g.stream ? gw_http_stream(h, conn, ep, &g, req) : gw_http_whole(h, conn, ep, &g, req);
fail:
    gw_req_release(req);
    ret = gw_http_fail(h, conn, ep, &e);
    cJSON_Delete(body);
    cm_free(g.ids);
    return ret;
}

/* ---- /tokenize, /detokenize (llama-server's shapes) ---- */

/* {"content": TEXT, "add_special": BOOL, "parse_special": BOOL} ->
 * {"tokens": [ids]}: by default the text as /v1/completions tokenizes a
 * string prompt (special token texts stay plain text), without bos.
 * add_special puts the model's bos first when it wants one; parse_special
 * turns special token texts ("<|im_start|>") into their ids, so a client can
 * apply a chat template itself and send the ids as the prompt.  Both default
 * to false (llama-server's parse_special defaults to true: here the default
 * is what a completion does).  *out_p is new (caller deletes). */
static bool gw_tokenize(gw_http_t *h, const cJSON *b, cJSON **out_p, gw_err_t *e)
{
    const cJSON *content = gw_field(b, "content"), *add = gw_field(b, "add_special"),
                *parse = gw_field(b, "parse_special");
    if (content == NULL || !cJSON_IsString(content))
        return GW_BAD(e, "content", "content must be a string (the text to tokenize)");
    if (add != NULL && !cJSON_IsBool(add))
        return GW_BAD(e, "add_special", "add_special must be true or false");
    if (parse != NULL && !cJSON_IsBool(parse))
        return GW_BAD(e, "parse_special", "parse_special must be true or false");
    int32_t *ids = NULL;
    size_t n = 0;
    const char *text = content->valuestring;
    bool bos = add != NULL && cJSON_IsTrue(add) && mdl_tok_add_bos(h->tok);
    ri_status_t st = mdl_tok_encode(h->tok, text, strlen(text), parse != NULL && cJSON_IsTrue(parse), &ids, &n);
    if (st != RI_OK)
        return gw_err_set(e, 500, "server_error", NULL, NULL, "cannot tokenize the content: %s", ri_status_str(st));
    cJSON *o = cJSON_CreateObject(), *arr = cJSON_AddArrayToObject(o, "tokens");
    bool ok = arr != NULL;
    if (ok && bos)
        ok = cJSON_AddItemToArray(arr, cJSON_CreateNumber(mdl_tok_bos(h->tok)));
    for (size_t i = 0; ok && i < n; i++)
        ok = cJSON_AddItemToArray(arr, cJSON_CreateNumber(ids[i]));
    cm_free(ids);
    if (!ok) {
        cJSON_Delete(o);
        return gw_err_set(e, 500, "server_error", NULL, NULL, "out of memory");
    }
    *out_p = o;
    return true;
}

/* {"tokens": [ids]} -> {"content": TEXT}: special tokens give their text;
 * bytes that are not UTF-8 (a cut multi-byte character) become U+FFFD.
 * *out_p is new (caller deletes). */
static bool gw_detokenize(gw_http_t *h, const cJSON *b, cJSON **out_p, gw_err_t *e)
{
    const cJSON *toks = gw_field(b, "tokens"), *t;
    size_t n_vocab = mdl_tok_vocab(h->tok), n = 0;
    if (toks == NULL || !cJSON_IsArray(toks))
        return GW_BAD(e, "tokens", "tokens must be a list of token ids");
    int32_t *ids = cm_malloc(&gw_http_tag, ((size_t)cJSON_GetArraySize(toks) + 1) * sizeof(int32_t));
    if (ids == NULL)
        return gw_err_set(e, 500, "server_error", NULL, NULL, "out of memory");
    cJSON_ArrayForEach(t, toks)
    {
        if (!gw_is_int(t) || t->valuedouble < 0 || t->valuedouble >= (double)n_vocab) {
            cm_free(ids);
            return GW_BAD(e, "tokens", "token ids must be integers from 0 to %zu", n_vocab - 1);
        }
        ids[n++] = (int32_t)t->valuedouble;
    }
    char *text = NULL;
    ri_status_t st = mdl_tok_decode(h->tok, ids, n, false, &text);
    cm_free(ids);
    if (st != RI_OK)
        return gw_err_set(e, 500, "server_error", NULL, NULL, "cannot detokenize: %s", ri_status_str(st));
    char *clean = gw_utf8_clean(text, strlen(text));
    cm_free(text);
    if (clean == NULL)
        return gw_err_set(e, 500, "server_error", NULL, NULL, "out of memory");
    cJSON *o = cJSON_CreateObject();
    cJSON_AddStringToObject(o, "content", clean);
    cm_free(clean);
    *out_p = o;
    return true;
}

static enum MHD_Result gw_http_tokens(gw_http_t *h, struct MHD_Connection *conn, gw_ep_t ep, const gw_conn_t *c)
{
    gw_err_t e;
    cJSON *body = NULL, *out = NULL;
    /* a list as long as the body allows: ids are at least 2 bytes each ("1,") */
    if (c->body != NULL && !gw_body_check(c->body, c->len, GW_HTTP_MAX_BODY / 2, &e))
        return gw_http_fail(h, conn, ep, &e);
    if (c->body != NULL)
        body = cJSON_ParseWithLength(c->body, c->len);
    if (body == NULL || !cJSON_IsObject(body)) {
        cJSON_Delete(body);
        GW_BAD(&e, NULL, "we could not parse the JSON body of your request (it must be a JSON object)");
        return gw_http_fail(h, conn, ep, &e);
    }
    bool ok = ep == GW_EP_TOKENIZE ? gw_tokenize(h, body, &out, &e) : gw_detokenize(h, body, &out, &e);
    cJSON_Delete(body);
    return ok ? gw_http_json(h, conn, ep, MHD_HTTP_OK, out, 0) : gw_http_fail(h, conn, ep, &e);
}

static cJSON *gw_model_obj(gw_http_t *h)
{
    cJSON *m = cJSON_CreateObject();
    cJSON_AddStringToObject(m, "id", h->model_id);
    cJSON_AddStringToObject(m, "object", "model");
    cJSON_AddNumberToObject(m, "created", (double)h->created);
    cJSON_AddStringToObject(m, "owned_by", "retroinfer");
    return m;
}

/* ---- /metrics ---- */

static void gw_metric(FILE *f, const char *name, const char *type, const char *help, double v)
{
    fprintf(f, "# HELP %s %s\n# TYPE %s %s\n%s %.17g\n", name, help, name, type, name, v);
}

/* Prefix reuse's counters (gw_prefix_seq.h). */
static void gw_http_prefix_metrics(FILE *f, gw_pfx_stats_t *p)
{
    double hit = (double)atomic_load(&p->hit_tokens);
    gw_metric(f, "ri_worker_prefix_lookups_total", "counter", "Prompts looked up in the prefix cache.",
              (double)atomic_load(&p->lookups));
    gw_metric(f, "ri_worker_prefix_hit_tokens_total", "counter", "Prompt tokens served from cached prefix blocks.",
              hit);
    gw_metric(f, "ri_worker_prefix_miss_tokens_total", "counter", "Prompt tokens prefilled after a lookup.",
              (double)atomic_load(&p->miss_tokens));
    gw_metric(f, "ri_worker_prefix_published_blocks_total", "counter", "Prefix blocks published to the kvstore.",
              (double)atomic_load(&p->published_blocks));
    gw_metric(f, "ri_worker_prefix_attached_bytes_total", "counter", "Bytes of the prefix blocks attached.",
              (double)atomic_load(&p->attached_bytes));
    gw_metric(f, "ri_worker_prefix_fallbacks_total", "counter",
              "Prefix lookups or publishes that failed (the prompt prefilled whole / blocks not published).",
              (double)atomic_load(&p->fallbacks));
    gw_metric(f, "ri_worker_prefill_tokens_saved_total", "counter",
              "Prompt tokens not prefilled thanks to the prefix cache.", hit);
    uint32_t copies = 0;
    uint64_t bytes = 0;
    gw_meta_stats(&copies, &bytes);
    gw_metric(f, "ri_worker_prefix_meta_shared_copies", "gauge",
              "Attached prefixes whose meta index the process holds once for every sequence reading it.",
              (double)copies);
    gw_metric(f, "ri_worker_prefix_meta_shared_bytes", "gauge", "Bytes of those shared meta indexes.",
              (double)bytes);
}

static void gw_http_cluster_metrics(FILE *f);

static void gw_http_alloc_line(const cm_alloc_tag_t *tag, void *arg)
{
    fprintf(arg, "ri_worker_alloc_bytes{tag=\"%s\"} %zu\n", tag->name, atomic_load(&tag->bytes));
}

/* Live heap bytes by allocation tag (common/cm_alloc), the kvstore's
 * ri_kvs_alloc_bytes on this side: where a sequence's memory goes. */
static void gw_http_alloc_metrics(FILE *f)
{
    fprintf(f, "# HELP ri_worker_alloc_bytes Live heap bytes by allocation tag.\n"
               "# TYPE ri_worker_alloc_bytes gauge\n");
    cm_alloc_visit(gw_http_alloc_line, f);
}

/* K/V bytes of one token in a sequence's cache: every layer, K and V, fp16
 * (the only K/V type the kernels implement). */
static uint64_t gw_http_kv_token_bytes(const mdl_model_t *m)
{
    const mdl_hparams_t *hp = mdl_model_hparams(m);
    return (uint64_t)hp->n_layers * hp->n_kv_heads * hp->head_dim * 2u * sizeof(cm_fp16_t);
}

static void gw_http_render_metrics(gw_http_t *h, FILE *f)
{
    gw_sched_stats_t st;
    gw_sched_stats(h->sched, &st);
    fprintf(f, "# HELP ri_worker_requests_total HTTP requests answered, by endpoint and status code.\n"
               "# TYPE ri_worker_requests_total counter\n");
    for (size_t e = 0; e < GW_EP_N; e++)
        for (size_t k = 0; k < GW_N_CODES; k++) {
            uint64_t n = atomic_load(&h->counts[e][k]);
            char code[16];
            if (k < CM_ARRAY_LEN(gw_codes))
                snprintf(code, sizeof(code), "%u", gw_codes[k]);
            else
                snprintf(code, sizeof(code), "other");
            if (n > 0 || (k == 0 && e < GW_EP_METRICS))
                fprintf(f, "ri_worker_requests_total{endpoint=\"%s\",code=\"%s\"} %llu\n", gw_ep_name[e], code,
                        (unsigned long long)n);
        }
    gw_guard_stats_t gs;
    gw_guard_stats(h->guard, &gs);
    fprintf(f, "# HELP ri_worker_http_connections_closed_total Connections the worker closed before their request "
               "arrived, by reason.\n# TYPE ri_worker_http_connections_closed_total counter\n");
    for (size_t i = 0; i < GW_GUARD_N_REASONS; i++)
        fprintf(f, "ri_worker_http_connections_closed_total{reason=\"%s\"} %llu\n", gw_guard_reason_name[i],
                (unsigned long long)gs.closed[i]);
    gw_metric(f, "ri_worker_http_connections", "gauge", "Connections holding a slot.", (double)gs.open);
    gw_metric(f, "ri_worker_http_reserve_connections", "gauge", "Of them, on the slots kept for short requests.",
              (double)gs.reserve_open);
    fprintf(f, "# HELP ri_worker_requests_finished_total Generation requests ended, by reason.\n"
               "# TYPE ri_worker_requests_finished_total counter\n");
    static const char *const reasons[] = {"none", "stop", "length", "error", "cancelled"};
    for (size_t i = 1; i < CM_ARRAY_LEN(reasons); i++)
        fprintf(f, "ri_worker_requests_finished_total{reason=\"%s\"} %llu\n", reasons[i],
                (unsigned long long)st.finished[i]);
    gw_metric(f, "ri_worker_prompt_tokens_total", "counter", "Prompt tokens prefilled.", (double)st.prompt_tokens);
    gw_metric(f, "ri_worker_kv_bytes_per_token", "gauge",
              "K/V bytes one token takes in a sequence's cache (every layer, keys and values, fp16): what a "
              "sequence's steady zone costs a token.",
              (double)gw_http_kv_token_bytes(h->m));
    fprintf(f, "# HELP ri_worker_device_transport How misses reach a block cache in device memory (ucx-cuda, "
               "pinned-staging or host), from the build and the machine.\n"
               "# TYPE ri_worker_device_transport gauge\nri_worker_device_transport{transport=\"%s\"} 1\n",
            gw_transport_current());
    gw_metric(f, "ri_worker_generated_tokens_total", "counter", "Tokens generated.", (double)st.generated_tokens);
    gw_metric(f, "ri_worker_sequences_rebuilt_total", "counter",
              "Sequences rebuilt by prefilling their tokens again after the kvstore lost them.", (double)st.rebuilt);
    gw_metric(f, "ri_worker_decode_steps_total", "counter", "Batched decode steps.", (double)st.decode_steps);
    gw_metric(f, "ri_worker_queue_rejected_total", "counter", "Requests refused with 429 (queue full).",
              (double)st.rejected_busy);
    gw_metric(f, "ri_worker_dense_requests_total", "counter",
              "retroinfer-remote requests shorter than --dense-below, decoded with full attention in the worker.",
              (double)st.dense_requests);
    gw_metric(f, "ri_worker_queue_depth", "gauge", "Requests waiting for a batch slot.", (double)st.queued);
    gw_metric(f, "ri_worker_running_requests", "gauge", "Requests in the batch (prefilling or decoding).",
              (double)st.running);
    gw_metric(f, "ri_worker_batch_size", "gauge", "Sequences in the last decode step.", (double)st.batch_now);
    gw_metric(f, "ri_worker_batch_size_max", "gauge", "The largest decode step so far.", (double)st.batch_max);
    cm_hist_write_prom(&st.batch, f, "ri_worker_decode_batch_size", "Sequences per decode step.", NULL);
    cm_hist_write_prom(&st.ttft_s, f, "ri_worker_time_to_first_token_seconds",
                       "From a request's arrival to its first token.", NULL);
    cm_hist_write_prom(&st.itl_s, f, "ri_worker_inter_token_latency_seconds", "Between two tokens of one request.",
                       NULL);
    if (h->cfg.prefix != NULL)
        gw_http_prefix_metrics(f, h->cfg.prefix);
    gw_http_alloc_metrics(f);
    if (h->cfg.kvstore) {
        gw_attn_remote_totals_t t;
        gw_attn_remote_totals(&t);
        gw_metric(f, "ri_worker_kvstore_layer_steps_total", "counter", "Layer-steps decoded through the kvstore.",
                  (double)t.steps);
        gw_metric(f, "ri_worker_kvstore_cache_hits_total", "counter", "Retrieved clusters found in the block cache.",
                  (double)t.hits);
        gw_metric(f, "ri_worker_kvstore_cache_misses_total", "counter", "Retrieved clusters fetched from the kvstore.",
                  (double)t.misses);
        gw_metric(f, "ri_worker_kvstore_fetched_bytes_total", "counter", "Bytes received for misses.",
                  (double)t.fetched_bytes);
        gw_metric(f, "ri_worker_kvstore_uploaded_bytes_total", "counter", "Cluster bytes uploaded.",
                  (double)t.uploaded_bytes);
        gw_metric(f, "ri_worker_kvstore_direct_clusters_total", "counter",
                  "Retrieved clusters read in place from the kvstore's region (no request).",
                  (double)t.direct_clusters);
        gw_metric(f, "ri_worker_kvstore_released_bytes_total", "counter",
                  "Engine K/V bytes given back once the kvstore held them.", (double)t.released_bytes);
        gw_metric(f, "ri_worker_kvstore_fetch_wait_seconds_total", "counter", "Decode time spent waiting for the "
                  "kvstore.", t.fetch_wait_s);
        gw_metric(f, "ri_worker_kvstore_late_steps_total", "counter", "Layer-steps that went on without some misses.",
                  (double)t.late_steps);
        gw_metric(f, "ri_worker_kvstore_late_clusters_total", "counter", "Retrieved clusters estimated because late.",
                  (double)t.late_clusters);
        gw_metric(f, "ri_worker_kvstore_recoveries_total", "counter", "Sessions re-created after a kvstore failure.",
                  (double)t.recoveries);
        gw_metric(f, "ri_worker_kvstore_failures_total", "counter", "Decode steps that failed.", (double)t.failures);
        gw_http_cluster_metrics(f);
    }
}

/* Cluster mode's figures (nothing outside it). */
static void gw_http_cluster_metrics(FILE *f)
{
    gw_cl_stats_t cs;
    if (!gw_attn_remote_cluster_stats(&cs))
        return;
    gw_metric(f, "ri_worker_cluster_nodes", "gauge", "Live kvstore nodes in the cluster directory (the last known "
              "list while it is stale).", (double)cs.live_nodes);
    gw_metric(f, "ri_worker_cluster_directory_stale", "gauge", "1 while the directory's watch is cut off from etcd.",
              cs.stale ? 1.0 : 0.0);
    gw_metric(f, "ri_worker_cluster_failovers_total", "counter", "Sessions lost with their node (their sequences "
              "rebuilt on another).", (double)cs.failovers);
    gw_metric(f, "ri_worker_prefix_remote_copies_total", "counter", "Prefix blocks copied from the node holding "
              "them to the request's node instead of being prefilled.", (double)cs.prefix_copies);
    gw_metric(f, "ri_worker_prefix_remote_copy_bytes_total", "counter", "Bytes of those blocks.",
              (double)cs.prefix_copy_bytes);
    gw_metric(f, "ri_worker_prefix_replica_blocks_total", "counter", "Published prefix blocks copied to another node "
              "(--prefix-replicas).", (double)cs.replica_blocks);
    gw_metric(f, "ri_worker_prefix_replica_bytes_total", "counter", "Bytes of those blocks.", (double)cs.replica_bytes);
    gw_metric(f, "ri_worker_prefix_replica_dropped_total", "counter", "Replications dropped: their queue was full.",
              (double)cs.replica_dropped);
    fprintf(f, "# HELP ri_worker_cluster_placements_total Sessions placed, by node.\n"
               "# TYPE ri_worker_cluster_placements_total counter\n");
    for (size_t i = 0; i < cs.n_nodes; i++)
        fprintf(f, "ri_worker_cluster_placements_total{node=\"%s\"} %llu\n", cs.nodes[i].name,
                (unsigned long long)cs.nodes[i].placements);
    fprintf(f, "# HELP ri_worker_cluster_refusals_total Sessions a node refused (quota, no space, shutting down), "
               "by node.\n# TYPE ri_worker_cluster_refusals_total counter\n");
    for (size_t i = 0; i < cs.n_nodes; i++)
        fprintf(f, "ri_worker_cluster_refusals_total{node=\"%s\"} %llu\n", cs.nodes[i].name,
                (unsigned long long)cs.nodes[i].refusals);
    cm_free(cs.nodes);
}

/* ---- routing ---- */

static gw_ep_t gw_ep_of(const char *url)
{
    if (strcmp(url, "/v1/completions") == 0)
        return GW_EP_COMPLETIONS;
    if (strcmp(url, "/v1/chat/completions") == 0)
        return GW_EP_CHAT;
    if (strcmp(url, "/v1/models") == 0 || strncmp(url, "/v1/models/", 11) == 0)
        return GW_EP_MODELS;
    if (strcmp(url, "/health") == 0)
        return GW_EP_HEALTH;
    if (strcmp(url, "/metrics") == 0)
        return GW_EP_METRICS;
    if (strcmp(url, "/tokenize") == 0)
        return GW_EP_TOKENIZE;
    if (strcmp(url, "/detokenize") == 0)
        return GW_EP_DETOKENIZE;
    return GW_EP_OTHER;
}

static enum MHD_Result gw_http_get(gw_http_t *h, struct MHD_Connection *conn, gw_ep_t ep, const char *url)
{
    gw_err_t e;
    if (ep == GW_EP_MODELS && strcmp(url, "/v1/models") == 0) {
        cJSON *o = cJSON_CreateObject();
        cJSON_AddStringToObject(o, "object", "list");
        cJSON_AddItemToArray(cJSON_AddArrayToObject(o, "data"), gw_model_obj(h));
        return gw_http_json(h, conn, ep, MHD_HTTP_OK, o, 0);
    }
    if (ep == GW_EP_MODELS) {
        if (strcmp(url + 11, h->model_id) == 0)
            return gw_http_json(h, conn, ep, MHD_HTTP_OK, gw_model_obj(h), 0);
        gw_err_set(&e, 404, "invalid_request_error", "model", "model_not_found",
                   "the model '%.128s' does not exist on this server (it serves '%s')", url + 11, h->model_id);
        return gw_http_fail(h, conn, ep, &e);
    }
    if (ep == GW_EP_HEALTH) {
        bool draining = gw_sched_draining(h->sched);
        cJSON *o = cJSON_CreateObject();
        cJSON_AddStringToObject(o, "status", draining ? "draining" : "ok");
        cJSON_AddStringToObject(o, "model", h->model_id);
        return gw_http_json(h, conn, ep, draining ? MHD_HTTP_SERVICE_UNAVAILABLE : MHD_HTTP_OK, o, 0);
    }
    /* /metrics */
    char *page = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&page, &len);
    if (f == NULL)
        return MHD_NO;
    gw_http_render_metrics(h, f);
    fclose(f);
    enum MHD_Result ret = gw_http_send(h, conn, ep, MHD_HTTP_OK, page, len, "text/plain; version=0.0.4; charset=utf-8",
                                       0);
    free(page); /* open_memstream's buffer comes from malloc */
    return ret;
}

/* Does conn carry one of the API keys (or are there none)?  e is set
 * (401, OpenAI's shape) when not. */
static bool gw_http_authorized(gw_http_t *h, struct MHD_Connection *conn, gw_err_t *e)
{
    const char *hdr = MHD_lookup_connection_value(conn, MHD_HEADER_KIND, MHD_HTTP_HEADER_AUTHORIZATION), *key;
    size_t len = 0;
    bool bearer = cm_keys_bearer(hdr, &key, &len), ok;
    pthread_rwlock_rdlock(&h->keys_lock);
    ok = h->keys == NULL || (bearer && cm_keys_match(h->keys, key, len));
    pthread_rwlock_unlock(&h->keys_lock);
    if (ok)
        return true;
    if (hdr == NULL)
        return gw_err_set(e, 401, "invalid_request_error", NULL, "invalid_api_key",
                          "you didn't provide an API key: send it in the header Authorization: Bearer KEY");
    return gw_err_set(e, 401, "invalid_request_error", NULL, "invalid_api_key",
                      bearer ? "incorrect API key provided" : "the Authorization header must be 'Bearer KEY'");
}

static enum MHD_Result gw_http_answer(void *cls, struct MHD_Connection *conn, const char *url, const char *method,
                                      const char *version, const char *upload_data, size_t *upload_size,
                                      void **con_cls)
{
    gw_http_t *h = cls;
    gw_conn_t *c = *con_cls;
    gw_err_t e;
    (void)version;

    if (c == NULL) {
        /* the headers are in: refuse a missing key before reading a body */
        gw_ep_t ep = gw_ep_of(url);
        if (ep != GW_EP_HEALTH && !gw_http_authorized(h, conn, &e)) {
            gw_guard_arrived(h->guard, conn);
            return gw_http_fail(h, conn, ep, &e);
        }
        if ((c = cm_calloc(&gw_http_tag, 1, sizeof(*c))) == NULL)
            return MHD_NO;
        *con_cls = c;
        return MHD_YES;
    }
    if (*upload_size > 0) {
        size_t n = *upload_size;
        *upload_size = 0;
        if (c->too_large || c->len + n > GW_HTTP_MAX_BODY) {
            c->too_large = true;
            return MHD_YES;
        }
        if (c->len + n + 1 > c->cap) {
            size_t cap = CM_MAX(c->cap * 2, c->len + n + 1);
            char *b = cm_realloc(&gw_http_tag, c->body, cap);
            if (b == NULL)
                return MHD_NO;
            c->body = b;
            c->cap = cap;
        }
        memcpy(c->body + c->len, upload_data, n);
        c->len += n;
        c->body[c->len] = '\0';
        return MHD_YES;
    }
    gw_guard_arrived(h->guard, conn);
    gw_ep_t ep = gw_ep_of(url);
    bool post = strcmp(method, "POST") == 0, get = strcmp(method, "GET") == 0 || strcmp(method, "HEAD") == 0;
    if (ep == GW_EP_OTHER) {
        gw_err_set(&e, 404, "invalid_request_error", NULL, "not_found",
                   "no such endpoint: %s %.128s (have: POST /v1/completions, POST /v1/chat/completions, "
                   "POST /tokenize, POST /detokenize, GET /v1/models, GET /health, GET /metrics)", method, url);
        return gw_http_fail(h, conn, ep, &e);
    }
    bool gen = ep == GW_EP_COMPLETIONS || ep == GW_EP_CHAT;
    bool tokens = ep == GW_EP_TOKENIZE || ep == GW_EP_DETOKENIZE;
    if (((gen || tokens) && !post) || (!gen && !tokens && !get)) {
        gw_err_set(&e, 405, "invalid_request_error", NULL, "method_not_allowed", "%s is not allowed on %s; use %s",
                   method, url, gen || tokens ? "POST" : "GET");
        return gw_http_fail(h, conn, ep, &e);
    }
    if (c->too_large) {
        gw_err_set(&e, 413, "invalid_request_error", NULL, "request_too_large",
                   "the request body is over %u bytes", GW_HTTP_MAX_BODY);
        return gw_http_fail(h, conn, ep, &e);
    }
    if (tokens)
        return gw_http_tokens(h, conn, ep, c);
    if (!gen)
        return gw_http_get(h, conn, ep, url);
    c->inflight = true;
    atomic_fetch_add(&h->inflight, 1);
    return gw_http_generate(h, conn, ep, c);
}

static void gw_http_completed(void *cls, struct MHD_Connection *conn, void **con_cls,
                              enum MHD_RequestTerminationCode toe)
{
    gw_http_t *h = cls;
    gw_conn_t *c = *con_cls;
    (void)toe;
    gw_guard_answered(h->guard, conn);
    if (c != NULL) {
        if (c->inflight)
            atomic_fetch_sub(&h->inflight, 1);
        cm_free(c->body);
        cm_free(c);
        *con_cls = NULL;
    }
}

/* The words of list that name registered backends, comma-separated (so a
 * request is told what it can really have: retroinfer-remote exists only
 * with a kvstore).  Caller frees with free(); NULL when out of memory. */
static char *gw_allowed(const char *list)
{
    char *out = calloc(1, strlen(list) + 1), *copy = strdup(list), *save = NULL;
    if (out == NULL || copy == NULL) {
        free(out);
        free(copy);
        return NULL;
    }
    for (char *w = strtok_r(copy, ", ", &save); w != NULL; w = strtok_r(NULL, ", ", &save))
        if (mdl_attn_find(w) != NULL && !gw_in_list(out, w)) {
            if (out[0] != '\0')
                strcat(out, ",");
            strcat(out, w);
        }
    free(copy);
    return out;
}

ri_status_t gw_http_start(const gw_http_cfg_t *cfg, mdl_model_t *m, gw_sched_t *s, gw_http_t **h_p, char *err,
                          size_t errlen)
{
    char host[256];
    unsigned port = 0;
    struct sockaddr_storage ss;
    unsigned flags = MHD_USE_THREAD_PER_CONNECTION | MHD_USE_INTERNAL_POLLING_THREAD | MHD_USE_POLL | MHD_USE_ITC;
    ri_status_t st;

    /* probe the transport once now, not in the first /metrics request */
    (void)gw_transport_current();
    bool v6 = false;
    st = cm_net_parse_numeric(cfg->listen, &ss, host, sizeof(host), &port, &v6);
    if (st != RI_OK) {
        cm_keys_destroy(cfg->keys);
        if (st == RI_ERR_INVALID)
            snprintf(err, errlen, "listen '%s' is not host:port", cfg->listen);
        else
            snprintf(err, errlen, "listen '%s': the host must be a numeric IPv4 or IPv6 address", cfg->listen);
        return RI_ERR_INVALID;
    }
    if (v6)
        flags |= MHD_USE_IPv6;
    const mdl_attn_ops_t *def = mdl_attn_find(cfg->default_attn);
    if (def == NULL) {
        cm_keys_destroy(cfg->keys);
        snprintf(err, errlen, "default attn '%s' is not a backend (have: %s)", cfg->default_attn, mdl_attn_names());
        return RI_ERR_INVALID;
    }
    gw_http_t *h = cm_calloc(&gw_http_tag, 1, sizeof(*h));
    if (h == NULL) {
        cm_keys_destroy(cfg->keys);
        snprintf(err, errlen, "out of memory");
        return RI_ERR_NOMEM;
    }
    pthread_rwlock_init(&h->keys_lock, NULL);
    h->keys = cfg->keys;
    h->cfg.keys = NULL;
    h->m = m;
    h->tok = mdl_model_tok(m);
    h->sched = s;
    h->cfg = *cfg;
    h->cfg.keys = NULL; /* h->keys holds them */
    h->default_attn = def;
    h->created = (long)time(NULL);
    h->model_id = strdup(cfg->model_id);
    h->allow_attn = gw_allowed(cfg->allow_attn ? cfg->allow_attn : "");
    if (h->model_id == NULL || h->allow_attn == NULL) {
        snprintf(err, errlen, "out of memory");
        st = RI_ERR_NOMEM;
        goto err_free;
    }
    h->cfg.model_id = h->model_id;
    h->cfg.allow_attn = h->allow_attn;
    h->cfg.listen = NULL;
    gw_guard_cfg_t gcfg = {.max_conn = cfg->max_conn, .reserve = cfg->reserve_conn, .per_addr = cfg->max_conn_per_addr,
                           .request_ms = cfg->request_ms, .reserve_ms = CM_MIN(GW_HTTP_RESERVE_MS, cfg->request_ms)};
    if ((st = gw_guard_create(&gcfg, &h->guard)) != RI_OK) {
        snprintf(err, errlen, "connection limits: %s (the reserve must be below the connection limit)",
                 ri_status_str(st));
        goto err_free;
    }
    h->mhd = MHD_start_daemon(flags, (uint16_t)port, NULL, NULL, gw_http_answer, h, MHD_OPTION_SOCK_ADDR,
                              (struct sockaddr *)&ss, MHD_OPTION_CONNECTION_LIMIT, gw_guard_mhd_limit(h->guard),
                              MHD_OPTION_PER_IP_CONNECTION_LIMIT, gw_guard_mhd_per_addr(h->guard),
                              MHD_OPTION_CONNECTION_TIMEOUT, GW_HTTP_IDLE_S, MHD_OPTION_NOTIFY_COMPLETED,
                              gw_http_completed, h, MHD_OPTION_NOTIFY_CONNECTION, gw_guard_notify, h->guard,
                              MHD_OPTION_END);
    if (h->mhd == NULL) {
        snprintf(err, errlen, "cannot listen on %s (address in use?)", cfg->listen);
        st = RI_ERR_TRANSPORT;
        goto err_free;
    }
    const union MHD_DaemonInfo *info = MHD_get_daemon_info(h->mhd, MHD_DAEMON_INFO_BIND_PORT);
    unsigned bound = info ? info->port : port;
    if (strchr(host, ':') != NULL)
        snprintf(h->addr, sizeof(h->addr), "[%s]:%u", host, bound);
    else
        snprintf(h->addr, sizeof(h->addr), "%s:%u", host, bound);
    *h_p = h;
    return RI_OK;
err_free:
    gw_http_destroy(h);
    return st;
}

const char *gw_http_address(const gw_http_t *h)
{
    return h->addr;
}

const char *gw_http_allowed(const gw_http_t *h)
{
    return h->allow_attn;
}

ri_status_t gw_http_set_keys(gw_http_t *h, cm_keys_t *keys)
{
    cm_keys_t *old = keys;
    ri_status_t st = RI_ERR_INVALID;
    pthread_rwlock_wrlock(&h->keys_lock);
    if (h->keys != NULL && keys != NULL) {
        old = h->keys;
        h->keys = keys;
        st = RI_OK;
    }
    pthread_rwlock_unlock(&h->keys_lock);
    cm_keys_destroy(old);
    return st;
}

void gw_http_destroy(gw_http_t *h)
{
    if (h == NULL)
        return;
    if (h->mhd != NULL) {
        /* Stop accepting, then let answers that are complete but not yet
         * sent go out (the scheduler is drained, so none still waits for
         * text; a stuck client cannot hold the stop for more than 10 s). */
        MHD_socket lfd = MHD_quiesce_daemon(h->mhd);
        for (int i = 0; i < 1000 && atomic_load(&h->inflight) > 0; i++)
            cm_time_sleep_ns(10 * 1000000ull);
        MHD_stop_daemon(h->mhd);
        if (lfd != MHD_INVALID_SOCKET)
            close(lfd);
    }
    gw_guard_destroy(h->guard);
    cm_keys_destroy(h->keys);
    pthread_rwlock_destroy(&h->keys_lock);
    free(h->model_id);
    free(h->allow_attn);
    cm_free(h);
}
