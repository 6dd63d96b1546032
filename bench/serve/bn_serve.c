/*
 * ri bench serve: load on ri-worker's OpenAI-compatible HTTP service
 * (docs/worker.md, "HTTP service"), as its users see it.
 *
 * Each attention backend (the request extension "attn": full, retroinfer,
 * retroinfer-remote) is first warmed up with one unmeasured request.  Then,
 * for each client count N (1, 4, 16), --requests rounds run; in each round
 * every backend in turn has N threads send one streaming completion each (a
 * long prompt, --max-tokens tokens), so the backends are interleaved and a
 * drift of a shared machine touches them alike.  It times what arrives: time
 * to first token (request sent -> first event with text; queueing and prefill
 * included), inter-token latency (between two events with text: the server
 * sends one per decode step while the client keeps up), end-to-end tokens/s
 * (the usage chunks' completion tokens / the rounds' wall time, prefill and
 * first step included) and decode tokens/s (every token but each request's
 * first / the time from a round's first text event to its last).  Rows
 * "serve" (docs/bench-format.md).
 *
 * Unless --worker URL is given it starts its own ri-kvstore and
 * `ri-worker --listen 127.0.0.1:0 --kvstore ...` (the default model) and
 * stops them at the end.  --hog runs one spinning process per core for the
 * whole run: the CPU shared, as on a busy server.  Bounded: a case starts no
 * round once its rounds took --seconds, and a read waits at most 300 s.
 *
 *   ri bench serve [--json PATH] [--clients 1,4,16] [--attn full,retroinfer,retroinfer-remote]
 *                  [--requests 3] [--max-tokens 32] [--prompt-words 1100] [--seconds 300]
 *                  [--max-batch 8] [--hog] [--worker http://HOST:PORT] [--model PATH]
 *   (--help lists them)
 *
 * Exit status: 0, 1 when a request failed or nothing ran, 2 for bad flags,
 * 3 when the worker it starts has no model.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <netdb.h>
#include <pthread.h>
#include <signal.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <sys/wait.h>
#include <unistd.h>

#include "bench/common/bn_args.h"
#include "bench/common/bn_daemon.h"
#include "bench/common/bn_report.h"
#include "common/cm_status.h" /* CM_MIN */
#include "common/cm_time.h"
#include "gpuworker/client/gw_remote.h" /* GW_UCX_TLS_LOCAL */

#define SV_MAX_LIST 8
#define SV_MAX_CLIENTS 64
#define SV_READ_TIMEOUT_S 300

typedef struct sv_opts {
    size_t clients[SV_MAX_LIST], n_clients;
    const char *attn[SV_MAX_LIST];
    size_t n_attn;
    size_t requests;      /* rounds: requests per client and backend */
    size_t max_tokens;
    size_t prompt_words;  /* filler words; ~1.3 tokens each */
    double seconds;       /* a case starts no request after this */
    size_t max_batch;     /* the worker we start: --max-batch */
    bool hog;
    char host[256], port[16]; /* the worker */
    char model[256];      /* the model id /v1/models lists */
} sv_opts_t;

/* What one streaming request saw. */
typedef struct sv_result {
    double t_start, t_first, t_last, t_end;
    double *itl;          /* gaps between text events, seconds (malloc) */
    size_t n_itl, cap_itl;
    size_t tokens;        /* usage.completion_tokens (else text events) */
    size_t prompt_tokens;
    size_t events;
    int status;           /* HTTP status; 0 = no answer */
    bool error;
    bool done;            /* [DONE] seen */
    char why[200];
} sv_result_t;

/* ---- a small HTTP/1.1 client: one request per connection ---- */

static int sv_connect(const char *host, const char *port)
{
    struct addrinfo hints = {.ai_socktype = SOCK_STREAM, .ai_flags = AI_NUMERICHOST | AI_NUMERICSERV}, *ai;
    if (getaddrinfo(host, port, &hints, &ai) != 0)
        return -1;
    int fd = socket(ai->ai_family, SOCK_STREAM | SOCK_CLOEXEC, 0);
    /* A server that stops answering fails the request instead of hanging the bench. */
    struct timeval tv = {.tv_sec = SV_READ_TIMEOUT_S};
    if (fd >= 0 && (setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv)) != 0 ||
                    connect(fd, ai->ai_addr, ai->ai_addrlen) != 0)) {
        close(fd);
        fd = -1;
    }
    freeaddrinfo(ai);
    return fd;
}

static void sv_fail(sv_result_t *r, const char *fmt, const char *arg)
{
    if (!r->error)
        snprintf(r->why, sizeof(r->why), fmt, arg);
    r->error = true;
}

/* One server-sent event's data: text, usage, an error, or [DONE]. */
static void sv_event(sv_result_t *r, const char *data)
{
    if (strcmp(data, "[DONE]") == 0) {
        r->done = true;
        return;
    }
    cJSON *o = cJSON_Parse(data);
    if (o == NULL) {
        sv_fail(r, "bad event: %.100s", data);
        return;
    }
    cJSON *err = cJSON_GetObjectItem(o, "error"), *usage = cJSON_GetObjectItem(o, "usage");
    cJSON *ch = cJSON_GetArrayItem(cJSON_GetObjectItem(o, "choices"), 0);
    cJSON *text = cJSON_GetObjectItem(ch, "text");
    if (err != NULL)
        sv_fail(r, "error event: %.150s", cJSON_GetStringValue(cJSON_GetObjectItem(err, "message")));
    if (cJSON_IsString(text) && text->valuestring[0] != '\0') {
        double now = cm_time_s();
        if (r->events == 0) {
            r->t_first = now;
        } else {
            if (r->n_itl == r->cap_itl) {
                size_t cap = r->cap_itl ? 2 * r->cap_itl : 64;
                double *p = realloc(r->itl, cap * sizeof(double));
                if (p == NULL) {
                    sv_fail(r, "%s", "out of memory");
                    cJSON_Delete(o);
                    return;
                }
                r->itl = p;
                r->cap_itl = cap;
            }
            r->itl[r->n_itl++] = now - r->t_last;
        }
        r->t_last = now;
        r->events++;
    }
    if (cJSON_IsObject(usage)) {
        r->tokens = (size_t)cJSON_GetNumberValue(cJSON_GetObjectItem(usage, "completion_tokens"));
        r->prompt_tokens = (size_t)cJSON_GetNumberValue(cJSON_GetObjectItem(usage, "prompt_tokens"));
    }
    cJSON_Delete(o);
}

/* The body's bytes, as they come, parsed as server-sent events: "data:"
 * lines gather (joined by newlines) until a blank line ends the event; lines
 * starting with ':' are comments.  Strict on purpose: a server that ends
 * events wrongly runs two events together, which then fail to parse. */
typedef struct sv_sse {
    char line[1 << 16];   /* the line being read */
    size_t len;
    char data[1 << 16];   /* the event's data so far */
    size_t dlen;
    bool has_data;
} sv_sse_t;

static void sv_sse_line(sv_sse_t *s, sv_result_t *r)
{
    if (s->len == 0) { /* blank line: dispatch */
        if (s->has_data) {
            s->data[s->dlen] = '\0';
            sv_event(r, s->data);
        }
        s->dlen = 0;
        s->has_data = false;
        return;
    }
    if (strncmp(s->line, "data:", 5) != 0)
        return; /* a comment (": waiting") or a field we do not use */
    const char *v = s->line + 5 + (s->line[5] == ' ');
    size_t n = strlen(v);
    if (s->has_data && s->dlen + 1 < sizeof(s->data))
        s->data[s->dlen++] = '\n';
    if (s->dlen + n < sizeof(s->data)) {
        memcpy(s->data + s->dlen, v, n);
        s->dlen += n;
    }
    s->has_data = true;
}

static void sv_sse_feed(sv_sse_t *s, sv_result_t *r, const char *p, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        if (p[i] != '\n') {
            if (s->len + 1 < sizeof(s->line))
                s->line[s->len++] = p[i];
            continue;
        }
        if (s->len > 0 && s->line[s->len - 1] == '\r')
            s->len--;
        s->line[s->len] = '\0';
        sv_sse_line(s, r);
        s->len = 0;
    }
}

/* Decode a chunked body incrementally (the server streams with chunks). */
typedef struct sv_chunked {
    size_t left;          /* bytes of the current chunk still to come */
    bool in_chunk, crlf;  /* inside a chunk; its trailing CRLF is due */
    bool end;             /* the 0-size chunk was seen */
} sv_chunked_t;

/* Consume what it can of buf[0..*len) (moving the rest to the front). */
static void sv_chunked_feed(sv_chunked_t *c, sv_sse_t *s, sv_result_t *r, char *buf, size_t *len)
{
    size_t off = 0;
    while (off < *len && !c->end) {
        if (c->in_chunk) {
            size_t n = *len - off < c->left ? *len - off : c->left;
            sv_sse_feed(s, r, buf + off, n);
            off += n;
            c->left -= n;
            if (c->left == 0) {
                c->in_chunk = false;
                c->crlf = true;
            }
            continue;
        }
        char *eol = memmem(buf + off, *len - off, "\r\n", 2);
        if (eol == NULL)
            break;
        if (c->crlf) {
            c->crlf = false;
        } else {
            c->left = strtoul(buf + off, NULL, 16);
            c->in_chunk = c->left > 0;
            c->end = c->left == 0;
        }
        off = (size_t)(eol + 2 - buf);
    }
    memmove(buf, buf + off, *len - off);
    *len -= off;
}

/* Send one streaming completion and read it to the end. */
static void sv_request(const sv_opts_t *o, const char *body, sv_result_t *r)
{
    char head[1024], buf[1 << 16];
    size_t len = 0, blen = strlen(body);
    sv_sse_t *sse = calloc(1, sizeof(*sse));
    sv_chunked_t ck = {0};
    bool chunked = false, in_body = false;
    int fd = sv_connect(o->host, o->port);
    r->t_start = cm_time_s();
    if (fd < 0 || sse == NULL) {
        sv_fail(r, "cannot connect to %.100s", o->host);
        goto out;
    }
    int hl = snprintf(head, sizeof(head),
                      "POST /v1/completions HTTP/1.1\r\nHost: %s:%s\r\nContent-Type: application/json\r\n"
                      "Accept: text/event-stream\r\nContent-Length: %zu\r\nConnection: close\r\n\r\n",
                      o->host, o->port, blen);
    if (send(fd, head, (size_t)hl, MSG_NOSIGNAL) != hl || send(fd, body, blen, MSG_NOSIGNAL) != (ssize_t)blen) {
        sv_fail(r, "send: %s", strerror(errno));
        goto out;
    }
    for (;;) {
        ssize_t n = recv(fd, buf + len, sizeof(buf) - len - 1, 0);
        if (n < 0 && errno == EINTR)
            continue;
        if (n <= 0) {
            if (n < 0)
                sv_fail(r, "recv: %s", strerror(errno));
            break;
        }
        len += (size_t)n;
        buf[len] = '\0';
        if (!in_body) {
            char *end = strstr(buf, "\r\n\r\n");
            if (end == NULL)
                continue;
            *end = '\0';
            r->status = strlen(buf) > 9 ? atoi(buf + 9) : 0; /* "HTTP/1.1 200 OK" */
            chunked = strcasestr(buf, "\r\ntransfer-encoding: chunked") != NULL;
            in_body = true;
            len -= (size_t)(end + 4 - buf);
            memmove(buf, end + 4, len);
            buf[len] = '\0';
            if (r->status != 200)
                continue; /* the error body comes next */
        }
        if (r->status != 200)
            continue;
        if (chunked) {
            sv_chunked_feed(&ck, sse, r, buf, &len);
        } else {
            sv_sse_feed(sse, r, buf, len);
            len = 0;
        }
        if (r->done || ck.end)
            break;
    }
    if (r->status != 200) {
        char code[16];
        snprintf(code, sizeof(code), "%d", r->status);
        sv_fail(r, "HTTP %s", code);
        /* The JSON error body's message, for the skip list and the log. */
        char *m = strstr(buf, "\"message\":\"");
        if (m != NULL)
            snprintf(r->why + strlen(r->why), sizeof(r->why) - strlen(r->why), ": %.*s",
                     (int)CM_MIN(strcspn(m + 11, "\""), (size_t)150), m + 11);
    } else if (!r->done) {
        sv_fail(r, "%s", "the stream ended before [DONE]");
    }
    if (r->tokens == 0)
        r->tokens = r->events;
out:
    r->t_end = cm_time_s();
    free(sse);
    if (fd >= 0)
        close(fd);
}

/* ---- one case: N clients, over the rounds ---- */

/* Every request of one (backend, client count) case, gathered over the
 * rounds: each round, each of the N clients sends one request. */
typedef struct sv_case {
    const char *attn;
    size_t n_clients;
    sv_result_t *res;     /* n_clients x --requests (calloc) */
    size_t n_res;
    size_t rounds;
    double seconds;       /* the rounds' wall times, summed */
    double decode_s;      /* per round, first text event to last, summed */
    bool refused;         /* a request got 400: the server has no such backend */
} sv_case_t;

typedef struct sv_client {
    const sv_opts_t *o;
    const char *attn;
    size_t id, k;         /* client, round: the prompt's opening */
    sv_result_t *res;
    pthread_t th;
} sv_client_t;

/* The prompt of request k of client c: a varied opening (no two requests share
 * a prefix a server could reuse) and filler long enough to index. */
static char *sv_prompt_body(const sv_opts_t *o, const char *attn, size_t c, size_t k)
{
    static const char *const words[] = {"river", "stone", "lamp", "garden", "window", "cloud", "bridge",
                                        "letter", "forest", "candle", "harbor", "mountain"};
    size_t cap = o->prompt_words * 12 + 512, n = 0;
    char *p = malloc(cap), *body = NULL;
    if (p == NULL)
        return NULL;
    n += (size_t)snprintf(p, cap, "Notes %zu-%zu.", c, k);
    for (size_t i = 0; i < o->prompt_words && n + 16 < cap; i++)
        n += (size_t)snprintf(p + n, cap - n, " %s%s", words[(i * 7 + c * 3 + k) % 12], i % 9 == 8 ? "." : "");
    snprintf(p + n, cap - n, " Now tell a long story about the %s:", words[(c + k) % 12]);
    cJSON *b = cJSON_CreateObject();
    cJSON_AddStringToObject(b, "model", o->model);
    cJSON_AddStringToObject(b, "prompt", p);
    cJSON_AddNumberToObject(b, "max_tokens", (double)o->max_tokens);
    cJSON_AddNumberToObject(b, "temperature", 0);
    cJSON_AddBoolToObject(b, "stream", true);
    cJSON_AddBoolToObject(cJSON_AddObjectToObject(b, "stream_options"), "include_usage", true);
    cJSON_AddStringToObject(b, "attn", attn);
    body = cJSON_PrintUnformatted(b);
    cJSON_Delete(b);
    free(p);
    return body;
}

static void *sv_client_run(void *arg)
{
    sv_client_t *cl = arg;
    char *body = sv_prompt_body(cl->o, cl->attn, cl->id, cl->k);
    if (body == NULL) {
        sv_fail(cl->res, "%s", "out of memory");
        return NULL;
    }
    sv_request(cl->o, body, cl->res);
    cJSON_free(body);
    return NULL;
}

/* One round of a case: its N clients send one request each, at once. */
static void sv_round(const sv_opts_t *o, sv_case_t *cs, size_t k)
{
    sv_client_t cl[SV_MAX_CLIENTS];
    double t0 = cm_time_s(), t1 = t0, first = 0, last = 0;
    sv_result_t *res = cs->res + cs->n_res;
    for (size_t c = 0; c < cs->n_clients; c++) {
        cl[c] = (sv_client_t){.o = o, .attn = cs->attn, .id = c, .k = k, .res = &res[c]};
        if (pthread_create(&cl[c].th, NULL, sv_client_run, &cl[c]) != 0) {
            cl[c].th = 0;
            sv_fail(&res[c], "%s", "cannot start a client thread");
        }
    }
    for (size_t c = 0; c < cs->n_clients; c++) {
        if (cl[c].th != 0)
            pthread_join(cl[c].th, NULL);
        sv_result_t *r = &res[c];
        t1 = r->t_end > t1 ? r->t_end : t1;
        cs->refused |= r->error && r->status == 400;
        if (r->error || r->events == 0)
            continue;
        first = first == 0 || r->t_first < first ? r->t_first : first;
        last = r->t_last > last ? r->t_last : last;
    }
    cs->n_res += cs->n_clients;
    cs->rounds++;
    cs->seconds += t1 - t0;
    cs->decode_s += last - first;
}

/* The case's row (and table line), from every round's requests. */
static void sv_case_report(bn_report_t *rep, const sv_opts_t *o, const sv_case_t *cs)
{
    size_t n_itl = 0, n_ttft = 0, tokens = 0, dtokens = 0, ptok = 0, errors = 0;
    double la[3];
    for (size_t i = 0; i < cs->n_res; i++)
        n_itl += cs->res[i].n_itl;
    double *ttft = calloc(cs->n_res + 1, sizeof(double)), *itl = calloc(n_itl + 1, sizeof(double));
    n_itl = 0;
    for (size_t i = 0; i < cs->n_res; i++) {
        const sv_result_t *r = &cs->res[i];
        if (r->error) {
            if (errors++ == 0)
                fprintf(stderr, "ri-bench-serve: %s, %zu clients: %s\n", cs->attn, cs->n_clients, r->why);
        } else if (ttft != NULL && itl != NULL) {
            ttft[n_ttft++] = r->t_first - r->t_start;
            memcpy(itl + n_itl, r->itl, r->n_itl * sizeof(double));
            n_itl += r->n_itl;
            tokens += r->tokens;
            dtokens += r->tokens > 0 ? r->tokens - 1 : 0; /* the first comes from the prefill */
            ptok = r->prompt_tokens;
        }
    }
    double e2e = cs->seconds > 0 ? (double)tokens / cs->seconds : 0;
    double dec = cs->decode_s > 0 ? (double)dtokens / cs->decode_s : 0;
    double tp50 = n_ttft ? 1e3 * bn_percentile(ttft, n_ttft, 50) : 0, tp99 = n_ttft ? 1e3 * bn_percentile(ttft, n_ttft, 99) : 0;
    double ip50 = n_itl ? 1e3 * bn_percentile(itl, n_itl, 50) : 0, ip99 = n_itl ? 1e3 * bn_percentile(itl, n_itl, 99) : 0;
    bn_loadavg(la);
    cJSON *row = bn_report_row(rep);
    cJSON_AddStringToObject(row, "attn", cs->attn);
    cJSON_AddNumberToObject(row, "clients", (double)cs->n_clients);
    cJSON_AddNumberToObject(row, "rounds", (double)cs->rounds);
    cJSON_AddNumberToObject(row, "requests", (double)cs->n_res);
    cJSON_AddNumberToObject(row, "e2e_tok_s", e2e);
    cJSON_AddNumberToObject(row, "decode_tok_s", dec);
    cJSON_AddNumberToObject(row, "ttft_p50_ms", tp50);
    cJSON_AddNumberToObject(row, "ttft_p99_ms", tp99);
    cJSON_AddNumberToObject(row, "itl_p50_ms", ip50);
    cJSON_AddNumberToObject(row, "itl_p99_ms", ip99);
    cJSON_AddNumberToObject(row, "errors", (double)errors);
    cJSON_AddNumberToObject(row, "tokens", (double)tokens);
    cJSON_AddNumberToObject(row, "prompt_tokens", (double)ptok);
    cJSON_AddNumberToObject(row, "max_tokens", (double)o->max_tokens);
    cJSON_AddNumberToObject(row, "seconds", cs->seconds);
    cJSON_AddNumberToObject(row, "decode_seconds", cs->decode_s);
    cJSON_AddBoolToObject(row, "hog", o->hog);
    printf("%-18s %7zu %8zu %9.1f %9.1f %9.0f %9.0f %8.1f %8.1f %6zu %6.2f\n", cs->attn, cs->n_clients, cs->n_res,
           e2e, dec, tp50, tp99, ip50, ip99, errors, la[0]);
    fflush(stdout);
    free(ttft);
    free(itl);
}

/* One unmeasured request per backend before any round: the first request of
 * a backend pays for the model's pages, the kvstore session set-up and the
 * allocator's first touches.  False when the server refused it (400). */
static bool sv_warmup(const sv_opts_t *o, const char *attn)
{
    sv_result_t r = {0};
    sv_client_t cl = {.o = o, .attn = attn, .id = SV_MAX_CLIENTS, .k = 0, .res = &r};
    sv_client_run(&cl);
    free(r.itl);
    if (r.error)
        fprintf(stderr, "ri-bench-serve: warm-up of %s: %s\n", attn, r.why);
    return !(r.error && r.status == 400);
}

/* Every case of one client count, the backends interleaved round by round
 * (a slow drift of the machine then touches every backend alike); false
 * when a backend was refused (the run fails against our own worker). */
static bool sv_cases(bn_report_t *rep, const sv_opts_t *o, const bool *skip, size_t n_clients)
{
    sv_case_t cs[SV_MAX_LIST] = {{0}};
    bool ok = true;
    for (size_t a = 0; a < o->n_attn; a++) {
        cs[a] = (sv_case_t){.attn = o->attn[a], .n_clients = n_clients};
        cs[a].res = calloc(n_clients * o->requests, sizeof(sv_result_t));
        if (cs[a].res == NULL)
            ok = false;
    }
    for (size_t k = 0; ok && k < o->requests; k++)
        for (size_t a = 0; a < o->n_attn; a++)
            if (!skip[a] && !cs[a].refused && cs[a].seconds < o->seconds)
                sv_round(o, &cs[a], k);
    for (size_t a = 0; a < o->n_attn; a++) {
        if (ok && !skip[a] && cs[a].refused) {
            char c[64];
            snprintf(c, sizeof(c), "attn=%s, %zu clients", o->attn[a], n_clients);
            bn_report_skip(rep, c, "the server refused the backend (400)"); /* prints it too */
            ok = false;
        } else if (ok && !skip[a]) {
            sv_case_report(rep, o, &cs[a]);
        }
        for (size_t i = 0; i < cs[a].n_res; i++)
            free(cs[a].res[i].itl);
        free(cs[a].res);
    }
    return ok;
}

/* ---- the processes it starts ---- */

typedef struct sv_worker {
    pid_t pid;
    char dir[256];
} sv_worker_t;

/* Start ri-worker --listen on a free port, wait for its port file (model
 * loading takes seconds).  Fills o->host/o->port.  0, 3 when the worker found
 * no model (its exit status), or -1 (message printed). */
static int sv_worker_start(sv_worker_t *w, sv_opts_t *o, const char *argv0, const char *kvs, const char *model)
{
    char bin[PATH_MAX], pf[300], log[300], mb[16], line[512];
    const char *bd = getenv("RI_BUILD_DIR");
    if (bd != NULL) {
        snprintf(bin, sizeof(bin), "%s/bin/ri-worker", bd);
    } else { /* next to this program */
        snprintf(bin, sizeof(bin), "%s", argv0);
        char *slash = strrchr(bin, '/');
        snprintf(slash ? slash + 1 : bin, sizeof(bin) - (size_t)(slash ? slash + 1 - bin : 0), "ri-worker");
    }
    snprintf(w->dir, sizeof(w->dir), "%s/ri-serve-XXXXXX", getenv("TMPDIR") ? getenv("TMPDIR") : "/tmp");
    if (mkdtemp(w->dir) == NULL) {
        perror("ri-bench-serve: mkdtemp");
        return -1;
    }
    snprintf(pf, sizeof(pf), "%s/port", w->dir);
    snprintf(log, sizeof(log), "%s/worker.log", w->dir);
    snprintf(mb, sizeof(mb), "%zu", o->max_batch);
    w->pid = fork();
    if (w->pid == 0) {
        int fd = open(log, O_WRONLY | O_CREAT | O_TRUNC, 0644);
        if (fd >= 0) {
            dup2(fd, 1);
            dup2(fd, 2);
        }
        if (model != NULL)
            execl(bin, bin, "--listen", "127.0.0.1:0", "--port-file", pf, "--kvstore", kvs, "--max-batch", mb,
                  "--model", model, (char *)NULL);
        else
            execl(bin, bin, "--listen", "127.0.0.1:0", "--port-file", pf, "--kvstore", kvs, "--max-batch", mb,
                  (char *)NULL);
        _exit(127);
    }
    for (int i = 0; i < 12000 && w->pid > 0; i++) { /* 120 s */
        FILE *f = fopen(pf, "r");
        while (f != NULL && fgets(line, sizeof(line), f)) {
            char *colon = strrchr(line, ':');
            if (strncmp(line, "http=", 5) == 0 && colon != NULL) {
                *colon = '\0';
                snprintf(o->host, sizeof(o->host), "%.*s", (int)sizeof(o->host) - 1, line + 5);
                snprintf(o->port, sizeof(o->port), "%.*s", (int)strcspn(colon + 1, "\n"), colon + 1);
            }
        }
        if (f != NULL)
            fclose(f);
        if (o->port[0])
            return 0;
        int status;
        if (waitpid(w->pid, &status, WNOHANG) == w->pid) {
            fprintf(stderr, "ri-bench-serve: ri-worker exited (status %d; exit 3 = no model: ./ri setup); log %s\n",
                    WIFEXITED(status) ? WEXITSTATUS(status) : -1, log);
            w->pid = 0;
            return WIFEXITED(status) && WEXITSTATUS(status) == 3 ? 3 : -1;
        }
        usleep(10000);
    }
    fprintf(stderr, "ri-bench-serve: ri-worker did not serve within 120 s (log %s)\n", log);
    return -1;
}

/* SIGTERM (it drains), at most 30 s, then SIGKILL; removes its folder. */
static void sv_worker_stop(sv_worker_t *w)
{
    char p[300];
    if (w->pid > 0) {
        kill(w->pid, SIGTERM);
        for (int i = 0; i < 300 && waitpid(w->pid, NULL, WNOHANG) != w->pid; i++)
            usleep(100000);
        kill(w->pid, SIGKILL);
        waitpid(w->pid, NULL, 0);
        w->pid = 0;
    }
    if (w->dir[0]) {
        snprintf(p, sizeof(p), "%s/port", w->dir);
        unlink(p);
        snprintf(p, sizeof(p), "%s/worker.log", w->dir);
        unlink(p);
        rmdir(w->dir);
    }
}

/* The model id the server lists (GET /v1/models). */
static int sv_model_id(sv_opts_t *o)
{
    char buf[8192];
    size_t len = 0;
    int fd = sv_connect(o->host, o->port);
    if (fd < 0)
        return -1;
    const char *req = "GET /v1/models HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n";
    ssize_t n = send(fd, req, strlen(req), MSG_NOSIGNAL);
    while (n > 0 && len + 1 < sizeof(buf) && (n = recv(fd, buf + len, sizeof(buf) - len - 1, 0)) > 0)
        len += (size_t)n;
    close(fd);
    buf[len] = '\0';
    char *id = strstr(buf, "\"id\":\"");
    if (id == NULL)
        return -1;
    snprintf(o->model, sizeof(o->model), "%.*s", (int)strcspn(id + 6, "\""), id + 6);
    return 0;
}

/* The command line (a cm_config table); sv_main turns it into sv_opts_t. */
typedef struct sv_args {
    char *json;
    char *clients;       /* comma list of client counts */
    char *attn;          /* comma list of backends */
    int64_t requests;
    int64_t max_tokens;
    int64_t prompt_words;
    double seconds;
    int64_t max_batch;
    bool hog;
    char *worker;        /* http://HOST:PORT; empty = start our own */
    char *model;         /* for the worker we start */
} sv_args_t;

static const cm_config_item_t sv_items[] = {
    BN_ARG_JSON(sv_args_t, json),
    BN_ARG(sv_args_t, "clients", CM_CFG_STRING, "1,4,16", "concurrent client counts, one case each (1-64 each)",
           clients, 0, 0),
    BN_ARG(sv_args_t, "attn", CM_CFG_STRING, "full,retroinfer,retroinfer-remote", "attention backends, interleaved",
           attn, 0, 0),
    BN_ARG(sv_args_t, "requests", CM_CFG_INT, "3", "rounds: requests per client and backend", requests, 1, 16),
    BN_ARG(sv_args_t, "max-tokens", CM_CFG_INT, "32", "tokens per request", max_tokens, 1, 1 << 20),
    BN_ARG(sv_args_t, "prompt-words", CM_CFG_INT, "1100", "filler words of the prompt (~1.3 tokens each)", prompt_words,
           0, 1 << 24),
    BN_ARG(sv_args_t, "seconds", CM_CFG_DOUBLE, "300", "a case starts no round after this", seconds, 0.001, 1e9),
    BN_ARG(sv_args_t, "max-batch", CM_CFG_INT, "8", "the worker we start: its --max-batch", max_batch, 1, 64),
    BN_ARG(sv_args_t, "hog", CM_CFG_BOOL, "false", "run a spinning process on every core meanwhile", hog, 0, 0),
    BN_ARG(sv_args_t, "worker", CM_CFG_STRING, NULL, "measure this worker (http://HOST:PORT) instead of starting one",
           worker, 0, 0),
    BN_ARG(sv_args_t, "model", CM_CFG_STRING, NULL, "model of the worker we start (empty: the worker's default)", model,
           0, 0),
};
static const cm_config_table_t sv_table = {"ri-bench-serve", "RI_BENCH_SERVE_", sv_items, CM_ARRAY_LEN(sv_items), 0,
                                           NULL};

static int sv_main(const void *arg, const char *argv0)
{
    const sv_args_t *args = arg;
    const char *json = args->json;
    const char *worker = args->worker != NULL && args->worker[0] ? args->worker : NULL;
    const char *model = args->model != NULL && args->model[0] ? args->model : NULL;
    static char attn_buf[256];
    sv_opts_t o = {.requests = (size_t)args->requests, .max_tokens = (size_t)args->max_tokens,
                   .prompt_words = (size_t)args->prompt_words, .seconds = args->seconds,
                   .max_batch = (size_t)args->max_batch, .hog = args->hog};
    bn_daemon_t d = {0};
    sv_worker_t w = {0};
    int rc = 1;

    double cl[SV_MAX_LIST];
    o.n_clients = bn_args_list(args->clients, cl, SV_MAX_LIST);
    for (size_t i = 0; i < o.n_clients; i++)
        o.clients[i] = cl[i] >= 1 ? (size_t)cl[i] : 0;
    snprintf(attn_buf, sizeof(attn_buf), "%s", args->attn != NULL ? args->attn : "");
    for (char *s = strtok(attn_buf, ","); s != NULL && o.n_attn < SV_MAX_LIST; s = strtok(NULL, ","))
        o.attn[o.n_attn++] = s;
    bool bad = o.n_clients == 0 || o.n_attn == 0;
    for (size_t i = 0; i < o.n_clients; i++)
        bad |= o.clients[i] < 1 || o.clients[i] > SV_MAX_CLIENTS;
    if (bad) {
        fprintf(stderr, "ri-bench-serve: --clients wants counts 1-64 (N[,N...]), --attn at least one backend\n");
        return 2;
    }
    if (worker != NULL) {
        /* http://HOST:PORT (or HOST:PORT; [v6]:PORT) */
        const char *h = strstr(worker, "://") ? strstr(worker, "://") + 3 : worker, *colon = strrchr(h, ':');
        if (colon == NULL) {
            fprintf(stderr, "ri-bench-serve: --worker wants http://HOST:PORT\n");
            return 2;
        }
        bool v6 = h[0] == '[';
        snprintf(o.host, sizeof(o.host), "%.*s", (int)(colon - h - (v6 ? 2 : 0)), h + (v6 ? 1 : 0));
        snprintf(o.port, sizeof(o.port), "%.*s", (int)strcspn(colon + 1, "/"), colon + 1);
    } else {
        setenv("UCX_TLS", GW_UCX_TLS_LOCAL, 0); /* same host: shared memory, for both children */
        if (bn_daemon_start(&d, argv0, "2GiB") != 0)
            return 1;
        int ws = sv_worker_start(&w, &o, argv0, d.grpc, model);
        if (ws != 0) {
            rc = ws == 3 ? 3 : 1; /* 3: no model, as ri-worker says it */
            goto out;
        }
    }
    if (sv_model_id(&o) != 0) {
        fprintf(stderr, "ri-bench-serve: no model listed by http://%s:%s/v1/models\n", o.host, o.port);
        goto out;
    }
    bn_report_t *rep = bn_report_create("serve");
    if (rep == NULL)
        goto out;
    cJSON *root = bn_report_root(rep);
    cJSON_AddStringToObject(root, "worker", worker ? worker : "started by the bench");
    cJSON_AddStringToObject(root, "model", o.model);
    cJSON_AddBoolToObject(root, "hog", o.hog);
    cJSON_AddNumberToObject(root, "max_tokens", (double)o.max_tokens);
    cJSON_AddNumberToObject(root, "requests_per_client", (double)o.requests);
    if (worker == NULL)
        cJSON_AddNumberToObject(root, "max_batch", (double)o.max_batch);
    long cores = sysconf(_SC_NPROCESSORS_ONLN);
    if (o.hog && bn_hog_start(cores > 0 && cores <= 64 ? (unsigned)cores : 1) != 0) {
        bn_report_finish(rep, NULL);
        goto out;
    }
    printf("model %s at http://%s:%s, %zu round(s) after a warm-up, max_tokens %zu, ~%zu prompt words%s\n", o.model,
           o.host, o.port, o.requests, o.max_tokens, o.prompt_words, o.hog ? ", CPU hog on every core" : "");
    printf("%-18s %7s %8s %9s %9s %9s %9s %8s %8s %6s %6s\n", "attn", "clients", "requests", "e2e", "decode",
           "ttft p50", "ttft p99", "itl p50", "itl p99", "errors", "load");
    printf("%-18s %7s %8s %9s %9s %9s %9s %8s %8s %6s %6s\n", "", "", "", "tok/s", "tok/s", "ms", "ms", "ms", "ms", "",
           "1 min");
    rc = 0;
    bool skip[SV_MAX_LIST] = {false};
    for (size_t a = 0; a < o.n_attn; a++)
        if (!sv_warmup(&o, o.attn[a])) {
            char c[64];
            snprintf(c, sizeof(c), "attn=%s", o.attn[a]);
            bn_report_skip(rep, c, "the server refused the backend (400)"); /* prints it too */
            skip[a] = true;
        }
    for (size_t c = 0; c < o.n_clients; c++)
        sv_cases(rep, &o, skip, o.clients[c]);
    bn_hog_stop();
    cJSON *rows = cJSON_GetObjectItem(root, "rows"), *row;
    /* Our own worker offers every backend: a refusal there is a failure. */
    if (worker == NULL && cJSON_GetArraySize(cJSON_GetObjectItem(root, "skipped")) > 0)
        rc = 1;
    if (cJSON_GetArraySize(rows) == 0) {
        fprintf(stderr, "ri-bench-serve: no case ran\n");
        rc = 1;
    }
    cJSON_ArrayForEach(row, rows)
        if (cJSON_GetNumberValue(cJSON_GetObjectItem(row, "errors")) > 0)
            rc = 1; /* failed requests: the figures are not to be trusted */
    if (bn_report_finish(rep, json) != 0)
        rc = 1;
out:
    bn_hog_stop();
    sv_worker_stop(&w);
    if (d.pid > 0 || d.dir[0])
        bn_daemon_stop(&d);
    return rc;
}

int main(int argc, char **argv)
{
    sv_args_t o;
    return bn_args_main(&sv_table, &o, argc, argv, sv_main);
}
