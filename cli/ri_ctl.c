/*
 * ri-ctl: talks to a ri-kvstore's control API for the `ri status`, `ri stats`,
 * `ri sessions`, `ri drain` and `ri prefixes` commands (cli/ri_main.c passes the command name
 * as argv[1]).  Human-readable output; exit 0 on success, 1 when the call
 * failed (the message names the address), 2 for bad usage.
 */
#define _GNU_SOURCE
#include <ctype.h>
#include <errno.h>
#include <stdbool.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "common/cm_alloc.h"
#include "common/cm_file.h"
#include "gpuworker/client/gw_ctl.h"

#define RI_CTL_DEFAULT_ADDR "127.0.0.1:7070"

static void ri_ctl_usage(FILE *out)
{
    fprintf(out,
            "usage: ri status|stats|sessions|drain|prefixes [--addr HOST:PORT] [--token T | --token-file F]\n"
            "          [--timeout-ms N] [--tls-ca PEM [--tls-cert PEM --tls-key PEM]] [--drop KEYHEX [--tenant T]]\n"
            "  status    call Health (no token needed)\n"
            "  stats     pool, session and cache counters of your tenant\n"
            "  sessions  list your tenant's sessions\n"
            "  drain     stop the kvstore accepting new sessions (admin token)\n"
            "  prefixes  list your tenant's prefix blocks (an admin token: everyone's); --drop KEYHEX drops one\n"
            "            (64 hex digits; an admin may name --tenant, else every tenant's block under the key)\n"
            "defaults: --addr $RI_KVS_ADDR or %s; token from $RI_KVS_TOKEN; --tls-ca/--tls-cert/--tls-key from $RI_CTL_TLS_CA/$RI_CTL_TLS_CERT/$RI_CTL_TLS_KEY\n",
            RI_CTL_DEFAULT_ADDR);
}

static void ri_ctl_bytes(uint64_t b, char *buf, size_t len)
{
    static const char *const units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
    double v = (double)b;
    unsigned u = 0;
    while (v >= 1024.0 && u + 1 < sizeof(units) / sizeof(units[0])) {
        v /= 1024.0;
        u++;
    }
    if (u == 0)
        snprintf(buf, len, "%" PRIu64 " B", b);
    else
        snprintf(buf, len, "%.1f %s", v, units[u]);
}

/* The token of a token file (cm_file_read_token: its first word that is not a
 * comment, so a kvstore tokens file works too), or a message and -1. */
static int ri_ctl_read_token(const char *path, char *buf, size_t len)
{
    ri_status_t st = cm_file_read_token(path, buf, len);
    if (st == RI_OK)
        return 0;
    fprintf(stderr, "ri: token file %s: %s\n", path, st == RI_ERR_FORMAT ? "holds no token" : ri_status_str(st));
    return -1;
}

static int ri_ctl_fail(const char *what, const char *addr, ri_status_t st, const gw_ctl_error_t *err)
{
    fprintf(stderr, "ri: %s on %s failed: %s (%s)\n", what, addr, err->message[0] ? err->message : ri_status_str(st),
            gw_ctl_grpc_code_name(err->grpc_code));
    if (st == RI_ERR_UNAUTHENTICATED)
        fprintf(stderr, "ri: this kvstore wants a token: --token T, --token-file F or $RI_KVS_TOKEN\n");
    else if (st == RI_ERR_UNREACHABLE)
        fprintf(stderr, "ri: is ri-kvstore running there? (--addr HOST:PORT or $RI_KVS_ADDR; plaintext vs --tls-ca)\n");
    return 1;
}

static int ri_ctl_status(gw_ctl_t *ctl, const char *addr, uint32_t timeout_ms)
{
    gw_ctl_health_t h;
    gw_ctl_error_t err = {0};
    ri_status_t st = gw_ctl_health(ctl, timeout_ms, &h, &err);
    if (st != RI_OK)
        return ri_ctl_fail("Health", addr, st, &err);
    printf("ri-kvstore at %s: %s\n", addr, h.status == 1 ? "SERVING" : h.status == 2 ? "DRAINING" : "UNKNOWN");
    printf("  version     %s\n", h.version);
    printf("  uptime      %.1f s\n", (double)h.uptime_ms / 1000.0);
    printf("  dataplane   %s\n", h.dataplane_address[0] ? h.dataplane_address : "(none)");
    printf("  auth        %s\n", h.auth_mode[0] ? h.auth_mode : "(unknown)");
    return 0;
}

static int ri_ctl_stats(gw_ctl_t *ctl, const char *addr, uint32_t timeout_ms)
{
    gw_ctl_stats_t s;
    gw_ctl_error_t err = {0};
    char a[32], b[32], c[32], d[32];
    ri_status_t st = gw_ctl_stats(ctl, timeout_ms, &s, &err);
    if (st != RI_OK)
        return ri_ctl_fail("Stats", addr, st, &err);
    ri_ctl_bytes(s.pool_bytes_used, a, sizeof(a));
    ri_ctl_bytes(s.pool_bytes_total, b, sizeof(b));
    ri_ctl_bytes(s.disk_bytes_used, c, sizeof(c));
    ri_ctl_bytes(s.bytes_sent, d, sizeof(d));
    uint64_t looked = s.cache_hits + s.cache_misses;
    printf("ri-kvstore at %s (up %.1f s)\n", addr, (double)s.uptime_ms / 1000.0);
    printf("  pool         %s used of %s (%.1f%%)\n", a, b,
           s.pool_bytes_total ? 100.0 * (double)s.pool_bytes_used / (double)s.pool_bytes_total : 0.0);
    printf("  disk         %s\n", c);
    printf("  sessions     %" PRIu32 " yours, %" PRIu32 " in all\n", s.sessions, s.sessions_all);
    printf("  clusters     %" PRIu64 " yours\n", s.clusters);
    printf("  fetches      %" PRIu64 "\n", s.fetches);
    printf("  cache        %" PRIu64 " hits, %" PRIu64 " misses", s.cache_hits, s.cache_misses);
    if (looked > 0)
        printf(" (hit ratio %.3f)", (double)s.cache_hits / (double)looked);
    printf("\n  sent         %s\n", d);
    printf("  errors       %" PRIu64 "\n", s.errors);
    {
        char mem[32], disk[32];
        ri_ctl_bytes(s.prefix.bytes_memory, mem, sizeof(mem));
        ri_ctl_bytes(s.prefix.bytes_disk, disk, sizeof(disk));
        printf("  prefixes     %" PRIu64 " in memory (%s), %" PRIu64 " on disk (%s); attached %" PRIu64
               " keys (%" PRIu64 " tokens), missed %" PRIu64 "; published %" PRIu64 " new, %" PRIu64
               " existing, %" PRIu64 " refused; %" PRIu64 " evicted, %" PRIu64 " spilled, %" PRIu64 " corrupt\n",
               s.prefix.blocks_memory, mem, s.prefix.blocks_disk, disk, s.prefix.attach_hits,
               s.prefix.tokens_attached, s.prefix.attach_misses, s.prefix.publishes_new, s.prefix.publishes_existing,
               s.prefix.publishes_refused, s.prefix.evictions, s.prefix.spills, s.prefix.corrupt);
    }
    return 0;
}

static int ri_ctl_sessions(gw_ctl_t *ctl, const char *addr, uint32_t timeout_ms)
{
    gw_ctl_session_info_t *infos = NULL;
    size_t n = 0;
    gw_ctl_error_t err = {0};
    ri_status_t st = gw_ctl_list_sessions(ctl, timeout_ms, &infos, &n, &err);
    if (st != RI_OK)
        return ri_ctl_fail("ListSessions", addr, st, &err);
    printf("%zu session(s) at %s\n", n, addr);
    if (n > 0)
        printf("%-20s %-12s %-18s %-5s %10s %10s %9s  %-19s %s\n", "ID", "TENANT", "LAYERSxHEADSxDIM", "TYPE",
               "POOL", "DISK", "CLUSTERS", "CREATED (UTC)", "LABEL");
    for (size_t i = 0; i < n; i++) {
        const gw_ctl_session_info_t *s = &infos[i];
        char geo[40], pool[32], disk[32], when[32];
        struct tm tm;
        time_t t = (time_t)(s->created_unix_ms / 1000u);
        gmtime_r(&t, &tm);
        strftime(when, sizeof(when), "%Y-%m-%d %H:%M:%S", &tm);
        snprintf(geo, sizeof(geo), "%ux%ux%u", s->geometry.layers, s->geometry.kv_heads, s->geometry.head_dim);
        ri_ctl_bytes(s->bytes_in_pool, pool, sizeof(pool));
        ri_ctl_bytes(s->bytes_on_disk, disk, sizeof(disk));
        printf("%-20" PRIu64 " %-12s %-18s %-5s %10s %10s %9" PRIu64 "  %-19s %s\n", s->session_id, s->tenant, geo,
               s->geometry.dtype == 2 ? "bf16" : "f16", pool, disk, s->clusters, when, s->label);
    }
    cm_free(infos);
    return 0;
}

static int ri_ctl_drain(gw_ctl_t *ctl, const char *addr, uint32_t timeout_ms)
{
    uint32_t open = 0;
    gw_ctl_error_t err = {0};
    ri_status_t st = gw_ctl_drain(ctl, timeout_ms, &open, &err);
    if (st != RI_OK)
        return ri_ctl_fail("Drain", addr, st, &err);
    printf("ri-kvstore at %s is draining: no new sessions; %u session(s) still open\n", addr, open);
    return 0;
}

static const char *g_drop_hex;    /* prefixes --drop KEYHEX */
static const char *g_drop_tenant; /* prefixes --tenant T (admin) */

/* 64 hex digits into 32 bytes; false when it is not that. */
static bool ri_ctl_key_parse(const char *hex, uint8_t key[32])
{
    if (strlen(hex) != 64)
        return false;
    for (int i = 0; i < 32; i++) {
        unsigned v;
        if (sscanf(hex + 2 * i, "%2x", &v) != 1 || !isxdigit((unsigned char)hex[2 * i]) ||
            !isxdigit((unsigned char)hex[2 * i + 1]))
            return false;
        key[i] = (uint8_t)v;
    }
    return true;
}

static int ri_ctl_prefix_drop(gw_ctl_t *ctl, const char *addr, uint32_t timeout_ms)
{
    uint8_t key[32];
    uint32_t dropped = 0;
    uint64_t freed = 0;
    char fb[32];
    gw_ctl_error_t err = {0};
    ri_status_t st;

    if (!ri_ctl_key_parse(g_drop_hex, key)) {
        fprintf(stderr, "ri: --drop wants a key of 64 hex digits (as `ri prefixes` lists it)\n");
        return 2;
    }
    st = gw_ctl_drop_prefix(ctl, timeout_ms, key, g_drop_tenant, &dropped, &freed, &err);
    if (st != RI_OK)
        return ri_ctl_fail("DropPrefix", addr, st, &err);
    ri_ctl_bytes(freed, fb, sizeof(fb));
    printf("dropped %u prefix block(s) at %s; %s freed now (attached ones go when their last session ends)\n",
           dropped, addr, fb);
    return 0;
}

static int ri_ctl_prefixes(gw_ctl_t *ctl, const char *addr, uint32_t timeout_ms)
{
    gw_ctl_prefix_info_t *infos = NULL;
    size_t n = 0;
    gw_ctl_error_t err = {0};
    ri_status_t st;

    if (g_drop_hex != NULL)
        return ri_ctl_prefix_drop(ctl, addr, timeout_ms);
    st = gw_ctl_list_prefixes(ctl, timeout_ms, &infos, &n, &err);
    if (st != RI_OK)
        return ri_ctl_fail("ListPrefixes", addr, st, &err);
    printf("%zu prefix block(s) at %s\n", n, addr);
    if (n > 0)
        printf("%-64s %-12s %-6s %10s %7s %8s  %s\n", "KEY", "TENANT", "TIER", "BYTES", "TOKENS", "SESSIONS",
               "CREATED (UTC)");
    for (size_t i = 0; i < n; i++) {
        const gw_ctl_prefix_info_t *p = &infos[i];
        char hex[65], bytes[32], when[32];
        struct tm tm;
        time_t t = (time_t)(p->created_unix_ms / 1000u);
        for (int j = 0; j < 32; j++)
            snprintf(hex + 2 * j, 3, "%02x", p->key[j]);
        gmtime_r(&t, &tm);
        strftime(when, sizeof(when), "%Y-%m-%d %H:%M:%S", &tm);
        ri_ctl_bytes(p->bytes, bytes, sizeof(bytes));
        printf("%-64s %-12s %-6s %10s %7u %8u  %s\n", hex, p->tenant, p->on_disk ? "disk" : "memory", bytes,
               p->tokens, p->sessions, when);
    }
    cm_free(infos);
    return 0;
}

/* An environment variable, NULL when unset or empty. */
static const char *ri_ctl_env(const char *name)
{
    const char *v = getenv(name);
    return v != NULL && v[0] != '\0' ? v : NULL;
}

int main(int argc, char **argv)
{
    const char *cmd = argc > 1 ? argv[1] : "";
    const char *addr = getenv("RI_KVS_ADDR");
    const char *token = getenv("RI_KVS_TOKEN");
    const char *token_file = NULL;
    char tokbuf[512];
    uint32_t timeout_ms = 5000;
    /* Not RI_KVS_TLS_CA: that is the daemon's own setting (client CAs for
     * mutual TLS), and exported in a shell it would also change a daemon
     * started from there. */
    gw_ctl_tls_t tls = {.ca_file = ri_ctl_env("RI_CTL_TLS_CA"), .cert_file = ri_ctl_env("RI_CTL_TLS_CERT"),
                        .key_file = ri_ctl_env("RI_CTL_TLS_KEY")};
    gw_ctl_t *ctl = NULL;
    int rc;

    if (addr == NULL || addr[0] == '\0')
        addr = RI_CTL_DEFAULT_ADDR;
    if (strcmp(cmd, "help") == 0 || strcmp(cmd, "--help") == 0 || strcmp(cmd, "-h") == 0) {
        ri_ctl_usage(stdout);
        return 0;
    }
    if (cmd[0] == '-') {
        fprintf(stderr, "ri: '%s' before the command: write ri status|stats|sessions|drain [options]\n", cmd);
        return 2;
    }
    for (int i = 2; i < argc; i++) {
        const char *a = argv[i];
        const char *v = (i + 1 < argc) ? argv[i + 1] : NULL;
        if (strcmp(a, "--help") == 0 || strcmp(a, "-h") == 0) {
            ri_ctl_usage(stdout);
            return 0;
        }
        if ((strcmp(a, "--addr") == 0 || strcmp(a, "--token") == 0 || strcmp(a, "--token-file") == 0 ||
             strcmp(a, "--timeout-ms") == 0 || strcmp(a, "--tls-ca") == 0 || strcmp(a, "--tls-cert") == 0 ||
             strcmp(a, "--tls-key") == 0 || strcmp(a, "--drop") == 0 || strcmp(a, "--tenant") == 0) &&
            v == NULL) {
            fprintf(stderr, "ri: %s needs a value\n", a);
            return 2;
        }
        if (strcmp(a, "--tls-ca") == 0 || strcmp(a, "--tls-cert") == 0 || strcmp(a, "--tls-key") == 0) {
            const char **dst = strcmp(a, "--tls-ca") == 0     ? &tls.ca_file
                               : strcmp(a, "--tls-cert") == 0 ? &tls.cert_file
                                                              : &tls.key_file;
            *dst = v;
            i++;
        } else if ((strcmp(a, "--drop") == 0 || strcmp(a, "--tenant") == 0) && strcmp(cmd, "prefixes") == 0) {
            *(strcmp(a, "--drop") == 0 ? &g_drop_hex : &g_drop_tenant) = v;
            i++;
        } else if (strcmp(a, "--addr") == 0) {
            addr = v;
            i++;
        } else if (strncmp(a, "--addr=", 7) == 0) {
            addr = a + 7;
        } else if (strcmp(a, "--token") == 0) {
            token = v;
            i++;
        } else if (strncmp(a, "--token=", 8) == 0) {
            token = a + 8;
        } else if (strcmp(a, "--token-file") == 0) {
            token_file = v;
            i++;
        } else if (strncmp(a, "--token-file=", 13) == 0) {
            token_file = a + 13;
        } else if (strcmp(a, "--timeout-ms") == 0 || strncmp(a, "--timeout-ms=", 13) == 0) {
            const char *t = a[12] == '=' ? a + 13 : v;
            char *end;
            unsigned long ms = strtoul(t, &end, 10);
            if (*t == '\0' || *end != '\0' || ms == 0 || ms > 600000) {
                fprintf(stderr, "ri: --timeout-ms must be 1..600000\n");
                return 2;
            }
            timeout_ms = (uint32_t)ms;
            if (a[12] != '=')
                i++;
        } else {
            fprintf(stderr, "ri: unknown option '%s'\n", a);
            ri_ctl_usage(stderr);
            return 2;
        }
    }
    if (token_file != NULL) {
        if (ri_ctl_read_token(token_file, tokbuf, sizeof(tokbuf)) != 0)
            return 2;
        token = tokbuf;
    }
    int (*fn)(gw_ctl_t *, const char *, uint32_t) = NULL;
    if (strcmp(cmd, "status") == 0)
        fn = ri_ctl_status;
    else if (strcmp(cmd, "stats") == 0)
        fn = ri_ctl_stats;
    else if (strcmp(cmd, "sessions") == 0)
        fn = ri_ctl_sessions;
    else if (strcmp(cmd, "drain") == 0)
        fn = ri_ctl_drain;
    else if (strcmp(cmd, "prefixes") == 0)
        fn = ri_ctl_prefixes;
    if (fn == NULL) {
        fprintf(stderr, "ri: '%s' is not a control command\n", cmd);
        ri_ctl_usage(stderr);
        return 2;
    }
    if (tls.ca_file == NULL && (tls.cert_file != NULL || tls.key_file != NULL)) {
        fprintf(stderr, "ri: --tls-cert/--tls-key need --tls-ca (the CA of the server's certificate)\n");
        return 2;
    }
    ri_status_t cst = gw_ctl_create_tls(addr, token, tls.ca_file ? &tls : NULL, &ctl);
    if (cst != RI_OK) {
        fprintf(stderr, "ri: cannot set up a channel to %s: %s (check the address, token and TLS files)\n", addr,
                ri_status_str(cst));
        return 2;
    }
    rc = fn(ctl, addr, timeout_ms);
    gw_ctl_destroy(ctl);
    explicit_bzero(tokbuf, sizeof(tokbuf));
    return rc;
}
