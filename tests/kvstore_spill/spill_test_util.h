/*
 * Helpers shared by the spill tier tests: temporary directories, payloads
 * that can be regenerated from their key (so a test can check gigabytes
 * without keeping them in memory), configurations for the io_uring and the
 * pread/pwrite path, and a fault-injecting system-call table.
 */
#ifndef SPILL_TEST_UTIL_H
#define SPILL_TEST_UTIL_H

#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "kvstore/spill/kvs_spill.h"

/* Make a fresh directory under $TMPDIR (or /tmp); returns a static-lifetime
 * string the caller frees with free(). */
char *st_tmpdir(void);

/* Remove a directory tree. */
void st_rmtree(const char *path);

/* Fill buf with bytes derived from key and salt. */
void st_fill(void *buf, size_t len, const kvs_spill_key_t *key, uint32_t salt);

/* Does buf hold what st_fill would write? */
bool st_check(const void *buf, size_t len, const kvs_spill_key_t *key, uint32_t salt);

/* "uring" or "pread" from argv[1] (default uring). */
bool st_mode_uring(int argc, char **argv);

/* A test configuration: small segments, no background compaction. */
void st_config(kvs_spill_config_t *cfg, const char *dir, bool uring);

/* Exit 77 (skip) when this machine cannot run the configuration: O_DIRECT
 * refused, or io_uring wanted but unavailable.  Returns the created store. */
kvs_spill_t *st_create_or_skip(const kvs_spill_config_t *cfg);

/* Which call a fault hits. */
typedef enum st_fault_op {
    ST_F_NONE = 0,
    ST_F_PWRITE,      /* pwrite returns err or a short count */
    ST_F_PREAD,       /* pread returns err or a short count */
    ST_F_FSYNC,
    ST_F_FALLOCATE,
    ST_F_RENAME,
    ST_F_OPEN,
    ST_F_URING_INIT,
    ST_F_CQE,         /* an io_uring completion: res replaced by err / short, or lost */
} st_fault_op_t;

typedef enum st_fault_kind {
    ST_K_ERR = 0,     /* fail with errno err */
    ST_K_SHORT,       /* transfer half */
    ST_K_LOST,        /* (CQE only) the completion never arrives */
    ST_K_RETAIN,      /* (PWRITE only) succeed, and keep a copy in memory (tag
                         "test.spill.retained"), as a tier that never lets go of
                         what it spilled would; freed by st_fault_off */
} st_fault_kind_t;

/* Fault state read by the injecting table; set fields, then arm. */
typedef struct st_fault {
    _Atomic int op;          /* st_fault_op_t; NONE = off */
    int kind;                /* st_fault_kind_t */
    int err;                 /* errno for ST_K_ERR */
    _Atomic int skip;        /* matching calls to let through first */
    _Atomic int times;       /* matching calls to fail (-1 = all) */
    _Atomic int hits;        /* faults injected */
} st_fault_t;

/* The fault-injecting ops table; its arg points at the global fault state. */
const kvs_io_ops_t *st_fault_ops(void);
st_fault_t *st_fault(void);

/* Arm a fault: skip `skip` matching calls, then fail `times` (-1 = forever). */
void st_fault_arm(st_fault_op_t op, st_fault_kind_t kind, int err, int skip, int times);
void st_fault_off(void);

#endif /* SPILL_TEST_UTIL_H */
