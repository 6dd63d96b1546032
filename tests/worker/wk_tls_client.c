/*
 * A libretroinfer client over TLS, for test_worker_tls.sh: connect with the
 * TLS files given (ri_client_params_t.tls_*), create and close one small
 * session (a real authenticated call, not only Health).  Exit 0 on success,
 * 1 with ri_last_error on stderr otherwise.
 *   wk-tls-client ADDR [CA|-] [CERT KEY]
 */
#include <stdio.h>
#include <string.h>

#include "retroinfer/retroinfer.h"

int main(int argc, char **argv)
{
    ri_client_params_t cp;
    ri_session_params_t sp;
    ri_client_h c = NULL;
    ri_session_h s = NULL;
    ri_status_t st;

    if (argc < 2) {
        fprintf(stderr, "usage: wk-tls-client ADDR [CA|-] [CERT KEY]\n");
        return 2;
    }
    ri_client_params_init(&cp);
    cp.address = argv[1];
    cp.timeout_ms = 3000;
    if (argc > 2 && strcmp(argv[2], "-") != 0)
        cp.tls_ca_file = argv[2];
    if (argc > 4) {
        cp.tls_cert_file = argv[3];
        cp.tls_key_file = argv[4];
    }
    st = ri_client_connect(&cp, &c);
    if (st != RI_OK)
        goto out;
    ri_session_params_init(&sp);
    sp.n_layers = 1;
    sp.n_q_heads = 2;
    sp.n_kv_heads = 1;
    sp.head_dim = 64;
    st = ri_session_create(c, &sp, &s);
out:
    if (st != RI_OK)
        fprintf(stderr, "wk-tls-client: %s: %s\n", ri_status_str(st), ri_last_error());
    ri_session_close(s);
    ri_client_close(c);
    return st == RI_OK ? 0 : 1;
}
