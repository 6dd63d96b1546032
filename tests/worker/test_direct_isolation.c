/*
 * Direct reads do not widen what a worker can read.  Against the real
 * ri-kvstore with two tenants (alice, bob), each with a session holding one
 * cluster of bytes only it knows:
 *   - alice maps her session's region and reads her cluster in place, and
 *     through her key with a one-sided get (so the key works);
 *   - a process holding alice's key and connection (this binary, re-run as
 *     the attacker) aims a one-sided get at bob's cluster, at bob's region
 *     address, and must not come back with bob's bytes: it is refused, reads
 *     something else, or dies trying;
 *   - the same from a process whose UCX has TCP only (another host, or a
 *     worker that chose to): the key cannot be mapped, and a one-sided get
 *     through it is not served (the kvstore's UCX context has no RMA; with
 *     it, UCX answered such gets in software from any address: bob's bytes
 *     came back, which is why it is off);
 *   - alice's secret does not connect her to bob's session at all.
 * The key covers one session's region, allocated for that session alone, so
 * no address makes it reach another's.  And the direct-read ops refuse bad
 * input with a clear status, changing nothing: LOCATE out of range, TOUCH
 * with one bad record among good ones; a second MAP of a session gives the
 * same region.
 */
#include <inttypes.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "common/cm_dp_direct.h"
#include "gpuworker/ctl/gw_ctl.h"
#include "gpuworker/dp/gw_dp.h"
#include "kvs_test_daemon.h"

#define TOK_ALICE "tok-alice-0123456789abcdef"
#define TOK_BOB "tok-bob-0123456789abcdef00"
#define D 64
#define TOKENS 8                       /* one page */
#define PAGE_BYTES (4u * TOKENS * D)   /* K and V, fp16 */

typedef struct party {
    gw_ctl_t *ctl;
    gw_ctl_session_t sess;
    gw_dp_t *dp;
    uint8_t page[PAGE_BYTES];          /* the cluster it uploaded */
    uint8_t *local;                    /* its region, mapped */
    uint64_t bytes, remote, off;       /* region size, kvstore address, cluster offset */
} party_t;

static kvs_test_daemon_t daemon_;
static party_t alice_, bob_;
static const char *self_;

static void hex(const uint8_t *b, size_t n, char *out)
{
    for (size_t i = 0; i < n; i++)
        sprintf(out + 2 * i, "%02x", b[i]);
}

static int unhex(const char *s, uint8_t *b, size_t n)
{
    for (size_t i = 0; i < n; i++)
        if (sscanf(s + 2 * i, "%2hhx", &b[i]) != 1)
            return -1;
    return 0;
}

/* The attacker: connect to alice's session with her secret, map her region
 * (her key), then get len bytes at raddr.  Prints the bytes in hex; exit 0
 * when the get returned, 3 when it was refused. */
static int attacker_main(char **argv)
{
    uint8_t secret[CM_WIRE_SECRET_SIZE], buf[PAGE_BYTES], *local;
    char out[2 * PAGE_BYTES + 1];
    uint64_t bytes, raddr = strtoull(argv[4], NULL, 16);
    gw_dp_options_t o = {.timeout_ms = 3000};
    gw_dp_t *dp = NULL;
    ri_status_t st;

    if (unhex(argv[3], secret, sizeof(secret)) != 0)
        return 2;
    st = gw_dp_connect(argv[1], strtoull(argv[2], NULL, 10), secret, &o, &dp);
    if (st == RI_OK)
        st = gw_dp_map(dp, &local, &bytes, NULL);
    if (st == RI_ERR_UNSUPPORTED)
        st = RI_OK; /* not mappable here (TCP only): try the key one-sided anyway */
    if (st == RI_OK)
        st = gw_dp_direct_get(dp, raddr, buf, sizeof(buf));
    if (st != RI_OK) {
        printf("refused: %s\n", ri_status_str(st));
        gw_dp_close(dp);
        return 3;
    }
    hex(buf, sizeof(buf), out);
    printf("HEX:%s\n", out);
    fflush(stdout);
    gw_dp_close(dp);
    return 0;
}

static int party_setup(party_t *p, const char *token, const char *label, uint8_t seed)
{
    gw_ctl_geometry_t g = {.layers = 1, .kv_heads = 1, .head_dim = D, .dtype = 1, .page_tokens = TOKENS};
    gw_ctl_error_t err;
    uint32_t head = 0, count = 1, tokens = TOKENS, first = 0;

    for (size_t i = 0; i < PAGE_BYTES; i++)
        p->page[i] = (uint8_t)(seed + i * 131u + (i >> 7));
    if (gw_ctl_create(daemon_.grpc, token, &p->ctl) != RI_OK ||
        gw_ctl_create_session(p->ctl, 5000, &g, 1024, label, &p->sess, &err) != RI_OK)
        return -1;
    if (gw_dp_connect(p->sess.dataplane_address, p->sess.session_id, p->sess.secret, NULL, &p->dp) != RI_OK)
        return -1;
    /* MAP first: the region must exist before the upload for it to land there. */
    if (gw_dp_map(p->dp, &p->local, &p->bytes, &p->remote) != RI_OK)
        return 77;
    if (gw_dp_upload(p->dp, false, 0, 1, &head, &count, &tokens, p->page, PAGE_BYTES, &first) != RI_OK ||
        gw_dp_locate(p->dp, 0, 0, first, 1, &p->off) != RI_OK || p->off == CM_DP_NOT_DIRECT)
        return -1;
    return 0;
}

static int group_setup(void **state)
{
    char path[600], flag[700];
    int rc;
    (void)state;
    setenv("UCX_TLS", "posix,sysv,cma,tcp,self", 0); /* one host: shared memory */
    if (kvs_test_daemon_prepare(&daemon_) != 0 ||
        kvs_test_daemon_write_file(&daemon_, "tokens", TOK_ALICE " alice\n" TOK_BOB " bob\n", path, sizeof(path)) != 0)
        return -1;
    snprintf(flag, sizeof(flag), "--tokens-file=%s", path);
    const char *extra[] = {flag, NULL};
    rc = kvs_test_daemon_start(&daemon_, extra, NULL);
    if (rc != 0)
        return rc == 77 ? (fprintf(stderr, "skipped: no ri-kvstore\n"), exit(77), 0) : -1;
    rc = party_setup(&alice_, TOK_ALICE, "alice", 1);
    if (rc == 0)
        rc = party_setup(&bob_, TOK_BOB, "bob", 97);
    if (rc == 77) {
        fprintf(stderr, "skipped: the kvstore's regions cannot be mapped here (no shared memory)\n");
        exit(77);
    }
    return rc;
}

static int group_teardown(void **state)
{
    (void)state;
    party_t *ps[] = {&alice_, &bob_};
    for (int i = 0; i < 2; i++) {
        gw_dp_close(ps[i]->dp);
        gw_ctl_destroy(ps[i]->ctl);
    }
    kvs_test_daemon_stop(&daemon_, 15, 5000);
    kvs_test_daemon_cleanup(&daemon_);
    return 0;
}

/* Run the attacker with alice's session; out gets what it printed. */
static int attack(uint64_t raddr, char *out, size_t len)
{
    char sid[32], secret[2 * CM_WIRE_SECRET_SIZE + 1], addr[32];
    snprintf(sid, sizeof(sid), "%" PRIu64, alice_.sess.session_id);
    hex(alice_.sess.secret, CM_WIRE_SECRET_SIZE, secret);
    snprintf(addr, sizeof(addr), "%" PRIx64, raddr);
    const char *argv[] = {self_, "--attack", alice_.sess.dataplane_address, sid, secret, addr, NULL};
    return kvs_test_run(argv, out, len, 20000);
}

static void test_own_cluster_readable(void **state)
{
    uint8_t got[PAGE_BYTES];
    char out[4 * PAGE_BYTES];
    (void)state;
    /* in place, through the mapping */
    assert_memory_equal(alice_.local + alice_.off, alice_.page, PAGE_BYTES);
    assert_memory_equal(bob_.local + bob_.off, bob_.page, PAGE_BYTES);
    /* through the key, from another process: the attacker's tool works */
    assert_int_equal(attack(alice_.remote + alice_.off, out, sizeof(out)), 0);
    assert_int_equal(unhex(strstr(out, "HEX:") + 4, got, PAGE_BYTES), 0);
    assert_memory_equal(got, alice_.page, PAGE_BYTES);
    printf("alice reads her own cluster in place and through her key (regions at %#" PRIx64 " and %#" PRIx64
           ", %" PRIu64 " bytes each)\n", alice_.remote, bob_.remote, alice_.bytes);
}

static void test_key_does_not_reach_other_tenant(void **state)
{
    uint8_t got[PAGE_BYTES];
    char out[4 * PAGE_BYTES];
    int rc;
    (void)state;
    rc = attack(bob_.remote + bob_.off, out, sizeof(out));
    if (rc == 0) {
        assert_non_null(strstr(out, "HEX:"));
        assert_int_equal(unhex(strstr(out, "HEX:") + 4, got, PAGE_BYTES), 0);
        assert_memory_not_equal(got, bob_.page, PAGE_BYTES);
        printf("alice's key aimed at bob's cluster: read bytes that are not bob's\n");
    } else {
        printf("alice's key aimed at bob's cluster: the attacker got nothing (exit %d: %.60s)\n", rc, out);
    }
    /* bob's cluster lies outside anything alice's key was made for */
    assert_true(bob_.remote + bob_.off < alice_.remote || bob_.remote + bob_.off >= alice_.remote + alice_.bytes);
    /* The kvstore took no part in it: bob is served as before. */
    assert_int_equal(gw_dp_ping(bob_.dp), RI_OK);
    assert_memory_equal(bob_.local + bob_.off, bob_.page, PAGE_BYTES);
}

static void test_tcp_key_does_not_reach_other_tenant(void **state)
{
    uint8_t got[PAGE_BYTES];
    char out[4 * PAGE_BYTES];
    const char *tls = getenv("UCX_TLS");
    char saved[256];
    int rc;
    (void)state;
    snprintf(saved, sizeof(saved), "%s", tls ? tls : "");
    setenv("UCX_TLS", "tcp,self", 1); /* the attacker's UCX only (ours is up already) */
    rc = attack(bob_.remote + bob_.off, out, sizeof(out));
    setenv("UCX_TLS", saved, 1);
    if (rc == 0) {
        assert_non_null(strstr(out, "HEX:"));
        assert_int_equal(unhex(strstr(out, "HEX:") + 4, got, PAGE_BYTES), 0);
        assert_memory_not_equal(got, bob_.page, PAGE_BYTES);
        printf("alice's key over TCP aimed at bob's cluster: read bytes that are not bob's\n");
    } else {
        printf("alice's key over TCP aimed at bob's cluster: refused (exit %d: %.80s)\n", rc,
               strstr(out, "refused") ? strstr(out, "refused") : out);
    }
    assert_int_equal(gw_dp_ping(bob_.dp), RI_OK);
    assert_memory_equal(bob_.local + bob_.off, bob_.page, PAGE_BYTES);
}

static void test_secret_does_not_open_other_session(void **state)
{
    gw_dp_t *dp = NULL;
    gw_dp_options_t o = {.timeout_ms = 1000};
    (void)state;
    assert_int_not_equal(gw_dp_connect(bob_.sess.dataplane_address, bob_.sess.session_id, alice_.sess.secret, &o, &dp),
                         RI_OK);
    assert_null(dp);
}

static void test_bad_requests_refused(void **state)
{
    uint64_t off = 0, bytes, remote;
    uint8_t *local;
    uint32_t good_bad[6] = {0, 0, 0, /* a real cluster */ 0, 0, 99 /* no such cluster */};
    gw_dp_t *dp2 = NULL;
    (void)state;
    assert_int_equal(gw_dp_locate(alice_.dp, 0, 0, 1, 1, &off), RI_ERR_RANGE);  /* one cluster only */
    assert_int_equal(gw_dp_locate(alice_.dp, 5, 0, 0, 1, &off), RI_ERR_RANGE);  /* one layer only */
    assert_int_equal(gw_dp_locate(alice_.dp, 0, 3, 0, 1, &off), RI_ERR_RANGE);  /* one head only */
    assert_int_equal(gw_dp_touch(alice_.dp, good_bad, 2), RI_ERR_RANGE);
    assert_int_equal(gw_dp_touch(alice_.dp, good_bad, 1), RI_OK);
    /* the connection is still good, and the cluster where it was */
    assert_int_equal(gw_dp_locate(alice_.dp, 0, 0, 0, 1, &off), RI_OK);
    assert_int_equal(off, alice_.off);
    /* a second connection of the same session maps the same region */
    assert_int_equal(gw_dp_connect(alice_.sess.dataplane_address, alice_.sess.session_id, alice_.sess.secret, NULL,
                                   &dp2), RI_OK);
    assert_int_equal(gw_dp_map(dp2, &local, &bytes, &remote), RI_OK);
    assert_int_equal(remote, alice_.remote);
    assert_int_equal(bytes, alice_.bytes);
    assert_memory_equal(local + alice_.off, alice_.page, PAGE_BYTES);
    gw_dp_close(dp2);
}

int main(int argc, char **argv)
{
    self_ = argv[0];
    if (argc == 6 && strcmp(argv[1], "--attack") == 0)
        return attacker_main(argv + 1);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_own_cluster_readable),
        cmocka_unit_test(test_key_does_not_reach_other_tenant),
        cmocka_unit_test(test_tcp_key_does_not_reach_other_tenant),
        cmocka_unit_test(test_secret_does_not_open_other_session),
        cmocka_unit_test(test_bad_requests_refused),
    };
    return cmocka_run_group_tests(tests, group_setup, group_teardown);
}
