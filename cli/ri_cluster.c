/*
 * `ri cluster`: what the cluster directory in etcd (common/cm_cluster.h)
 * says now: the live ri-kvstore nodes (name, address, host, pool, sessions,
 * epoch, recovered) and the owner record of every session (node, session
 * id, worker, label).  One read each; no watch.
 *
 *   ri cluster [--cluster etcd://HOST:PORT[,...]] [--cluster-name NAME] [--timeout-ms MS]
 *
 * --cluster defaults to $RI_CLUSTER, else etcd://127.0.0.1:2379.  Exit 0,
 * 1 when the directory cannot be read, 2 on bad arguments.
 */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/cm_alloc.h"
#include "common/cm_cluster.h"
#include "common/cm_etcd.h"
#include "common/cm_status.h"

#define RI_CLUSTER_DEFAULT_URL "etcd://127.0.0.1:2379"

static void ri_cluster_usage(FILE *f)
{
    fprintf(f, "usage: ri cluster [--cluster etcd://HOST:PORT[,HOST:PORT]] [--cluster-name NAME] [--timeout-ms MS]\n"
               "  lists the live kvstore nodes of the cluster directory and the owner of every session\n"
               "  (--cluster defaults to $RI_CLUSTER, else " RI_CLUSTER_DEFAULT_URL "; --cluster-name to default)\n");
}

static void ri_cluster_print_nodes(const cm_cluster_node_t *nodes, size_t n, bool stale)
{
    printf("nodes: %zu%s\n", n, stale ? " (stale: etcd does not answer)" : "");
    if (n == 0)
        return;
    printf("  %-24s %-22s %-16s %10s %10s %8s %14s %s\n", "NODE", "ADDR", "HOST", "POOL_USED", "POOL_TOTAL", "SESSIONS",
           "EPOCH", "RECOVERED");
    for (size_t i = 0; i < n; i++) {
        const cm_cluster_node_t *d = &nodes[i];
        printf("  %-24s %-22s %-16s %10" PRIu64 " %10" PRIu64 " %8u %14" PRIu64 " %s\n", d->name, d->addr, d->host,
               d->pool_used, d->pool_total, d->sessions, d->epoch, d->recovered ? "yes" : "no");
    }
}

static void ri_cluster_print_sessions(const cm_cluster_session_t *s, size_t n)
{
    printf("sessions: %zu\n", n);
    if (n == 0)
        return;
    printf("  %-24s %-16s %-24s %s\n", "NODE", "SESSION", "WORKER", "LABEL");
    for (size_t i = 0; i < n; i++)
        printf("  %-24s %016" PRIx64 " %-24s %s\n", s[i].node, s[i].session_id, s[i].worker, s[i].label);
}

int main(int argc, char **argv)
{
    const char *url = getenv("RI_CLUSTER"), *name = "default";
    uint32_t timeout_ms = 2000;
    cm_cluster_t *c = NULL;
    cm_cluster_node_t *nodes = NULL;
    cm_cluster_session_t *sess = NULL;
    size_t n_nodes = 0, n_sess = 0;
    bool stale = false;
    ri_status_t st;

    if (url == NULL || url[0] == '\0')
        url = RI_CLUSTER_DEFAULT_URL;
    /* `ri cluster` passes the command name first (as for ri-ctl) */
    int first = argc > 1 && strcmp(argv[1], "cluster") == 0 ? 2 : 1;
    for (int i = first; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (strcmp(a, "--help") == 0 || strcmp(a, "-h") == 0) {
            ri_cluster_usage(stdout);
            return 0;
        }
        if (strcmp(a, "--cluster") != 0 && strcmp(a, "--cluster-name") != 0 && strcmp(a, "--timeout-ms") != 0) {
            fprintf(stderr, "ri cluster: unknown option '%s'\n", a);
            ri_cluster_usage(stderr);
            return 2;
        }
        if (v == NULL) {
            fprintf(stderr, "ri cluster: %s needs a value\n", a);
            return 2;
        }
        i++;
        if (strcmp(a, "--cluster") == 0) {
            url = v;
        } else if (strcmp(a, "--cluster-name") == 0) {
            name = v;
        } else {
            char *end;
            unsigned long ms = strtoul(v, &end, 10);
            if (*v == '\0' || *end != '\0' || ms == 0 || ms > 600000) {
                fprintf(stderr, "ri cluster: --timeout-ms must be 1..600000\n");
                return 2;
            }
            timeout_ms = (uint32_t)ms;
        }
    }
    if (!cm_etcd_endpoints_valid(url)) {
        fprintf(stderr, "ri cluster: --cluster %s: want etcd://HOST:PORT[,HOST:PORT...]\n", url);
        return 2;
    }
    if (!cm_cluster_name_valid(name)) {
        fprintf(stderr, "ri cluster: --cluster-name '%s': 1 to 63 characters of A-Z a-z 0-9 . _ : -\n", name);
        return 2;
    }
    st = cm_cluster_open(url, name, timeout_ms, &c);
    if (st == RI_OK)
        st = cm_cluster_nodes(c, &nodes, &n_nodes, &stale);
    if (st == RI_OK)
        st = cm_cluster_sessions(c, "", &sess, &n_sess);
    if (st != RI_OK) {
        fprintf(stderr, "ri cluster: cannot read cluster '%s' at %s: %s%s%s\n", name, url, ri_status_str(st),
                cm_etcd_last_error()[0] ? ": " : "", cm_etcd_last_error());
        cm_cluster_close(c);
        return 1;
    }
    printf("cluster %s at %s\n", name, url);
    ri_cluster_print_nodes(nodes, n_nodes, stale);
    ri_cluster_print_sessions(sess, n_sess);
    cm_free(nodes);
    cm_free(sess);
    cm_cluster_close(c);
    return 0;
}
