/*
 * ri bench load --worker: a real ri-kvstore and a real ri-worker on loopback
 * under HTTP clients that stream, abort and get SIGKILLed, slowloris
 * connections and a /health prober (docs/kvstore.md, "Load through the worker").
 */
#ifndef BN_LOAD_WORKER_H
#define BN_LOAD_WORKER_H

/* Run the worker mode with argv (its options; --help lists them).  Returns
 * the process exit status: 0, 1 (a process did not serve at the end) or 2
 * (bad options). */
int bl_worker_main(int argc, char **argv);

#endif /* BN_LOAD_WORKER_H */
