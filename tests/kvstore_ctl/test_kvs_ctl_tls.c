/*
 * gRPC over TLS and mutual TLS with the real daemon (certificates made by
 * make_test_certs.sh in the daemon's temporary folder): a TLS client that
 * trusts the CA is served; a plaintext client or one trusting another CA is
 * not; with tls-ca the daemon also demands a client certificate.
 */
#define _GNU_SOURCE
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <cmocka.h>

#include "gpuworker/client/gw_ctl.h"
#include "kvs_test_daemon.h"

static kvs_test_daemon_t daemon_;
static char path_[8][700];

enum { CA, SRV_CERT, SRV_KEY, CLI_CERT, CLI_KEY, OTHER_CA };

static const char *pem(int which)
{
    static const char *const names[] = {"ca.pem", "server.pem", "server.key", "client.pem", "client.key", "other.pem"};
    snprintf(path_[which], sizeof(path_[which]), "%s/%s", daemon_.dir, names[which]);
    return path_[which];
}

static int make_certs(void)
{
    char script[700], out[4096];
    const char *src = getenv("RI_SOURCE_DIR");
    snprintf(script, sizeof(script), "%s/tests/kvstore_ctl/make_test_certs.sh", src ? src : ".");
    const char *argv[] = {"/bin/sh", script, daemon_.dir, NULL};
    int rc = kvs_test_run(argv, out, sizeof(out), 30000);
    if (rc != 0)
        fprintf(stderr, "make_test_certs.sh: exit %d: %s\n", rc, out);
    return rc;
}

static ri_status_t health_with(const gw_ctl_tls_t *tls, gw_ctl_error_t *err)
{
    gw_ctl_t *c = NULL;
    gw_ctl_health_t h;
    ri_status_t st = gw_ctl_create_tls(daemon_.grpc, NULL, tls, &c);
    if (st != RI_OK)
        return st;
    st = gw_ctl_health(c, 3000, &h, err);
    gw_ctl_destroy(c);
    return st;
}

static void test_tls(void **state)
{
    (void)state;
    char f1[800], f2[800];
    gw_ctl_error_t err;
    snprintf(f1, sizeof(f1), "--tls-cert=%s", pem(SRV_CERT));
    snprintf(f2, sizeof(f2), "--tls-key=%s", pem(SRV_KEY));
    const char *extra[] = {f1, f2, NULL};
    assert_int_equal(kvs_test_daemon_start(&daemon_, extra, NULL), 0);

    gw_ctl_tls_t good = {.ca_file = pem(CA)};
    assert_int_equal(health_with(&good, &err), RI_OK);
    gw_ctl_tls_t wrong_ca = {.ca_file = pem(OTHER_CA)};
    assert_int_not_equal(health_with(&wrong_ca, &err), RI_OK);
    assert_int_not_equal(health_with(NULL, &err), RI_OK); /* plaintext to a TLS port */

    /* ri status over TLS */
    char bin[512], out[4096], addrflag[400];
    kvs_test_bin("ri", bin, sizeof(bin));
    snprintf(addrflag, sizeof(addrflag), "--addr=%s", daemon_.grpc);
    const char *argv[] = {bin, "status", addrflag, "--tls-ca", pem(CA), NULL};
    assert_int_equal(kvs_test_run(argv, out, sizeof(out), 10000), 0);
    assert_non_null(strstr(out, "SERVING"));
    assert_int_equal(kvs_test_daemon_stop(&daemon_, SIGTERM, 10000), 0);
}

static void test_mutual_tls(void **state)
{
    (void)state;
    char f1[800], f2[800], f3[800];
    gw_ctl_error_t err;
    snprintf(f1, sizeof(f1), "--tls-cert=%s", pem(SRV_CERT));
    snprintf(f2, sizeof(f2), "--tls-key=%s", pem(SRV_KEY));
    snprintf(f3, sizeof(f3), "--tls-ca=%s", pem(CA));
    const char *extra[] = {f1, f2, f3, NULL};
    assert_int_equal(kvs_test_daemon_start(&daemon_, extra, NULL), 0);

    gw_ctl_tls_t no_cert = {.ca_file = pem(CA)};
    assert_int_not_equal(health_with(&no_cert, &err), RI_OK);
    gw_ctl_tls_t with_cert = {.ca_file = pem(CA), .cert_file = pem(CLI_CERT), .key_file = pem(CLI_KEY)};
    assert_int_equal(health_with(&with_cert, &err), RI_OK);
    /* a certificate without its key is refused by the client library */
    gw_ctl_tls_t half = {.ca_file = pem(CA), .cert_file = pem(CLI_CERT)};
    gw_ctl_t *c = NULL;
    assert_int_equal(gw_ctl_create_tls(daemon_.grpc, NULL, &half, &c), RI_ERR_INVALID);
    assert_int_equal(kvs_test_daemon_stop(&daemon_, SIGTERM, 10000), 0);
}

static void test_bad_tls_settings(void **state)
{
    (void)state;
    char f1[800], f2[800];
    int code = 0;
    kvs_test_daemon_t d;
    /* cert without key: a settings error (2) */
    snprintf(f1, sizeof(f1), "--tls-cert=%s", pem(SRV_CERT));
    const char *only_cert[] = {f1, NULL};
    assert_int_equal(kvs_test_daemon_prepare(&d), 0);
    assert_int_equal(kvs_test_daemon_start(&d, only_cert, &code), -1);
    assert_int_equal(code, 2);
    /* a key file that is not PEM: cannot start (1) */
    snprintf(f2, sizeof(f2), "--tls-key=%s/ports-not-pem", daemon_.dir);
    char p[700];
    assert_int_equal(kvs_test_daemon_write_file(&daemon_, "ports-not-pem", "hello\n", p, sizeof(p)), 0);
    const char *bad_key[] = {f1, f2, NULL};
    assert_int_equal(kvs_test_daemon_start(&d, bad_key, &code), -1);
    assert_int_equal(code, 1);
    kvs_test_daemon_cleanup(&d);
}

static int group_setup(void **state)
{
    (void)state;
    if (kvs_test_daemon_prepare(&daemon_) != 0)
        return -1;
    return make_certs();
}

static int group_teardown(void **state)
{
    (void)state;
    kvs_test_daemon_cleanup(&daemon_);
    return 0;
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_tls),
        cmocka_unit_test(test_mutual_tls),
        cmocka_unit_test(test_bad_tls_settings),
    };
    char bin[512];
    if (access(kvs_test_bin("ri-kvstore", bin, sizeof(bin)), X_OK) != 0 || access("/usr/bin/openssl", X_OK) != 0)
        return 77;
    return cmocka_run_group_tests(tests, group_setup, group_teardown);
}
