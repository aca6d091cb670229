/*
 * engine/engine_test.h — the engine's test hooks: fault injection and forced
 * probe refusals, handed to tio_engine_create_test explicitly.
 *
 * They exist so that tests can drive every error path of the I/O code (a
 * failing, short or late chunk; a file system that refuses O_DIRECT, a
 * kernel that refuses io_uring, a memlock limit that refuses registration)
 * on an ordinary disk.  They are not part of the public API: nothing outside
 * tests sets them, tio_engine_create passes none, and nothing in the engine
 * reads them from the environment.
 */
#ifndef TERAIO_ENGINE_TEST_H
#define TERAIO_ENGINE_TEST_H

#include "teraio/engine.h"

/* What happens to the chosen chunk. */
enum { TIO_FAULT_NONE = 0, TIO_FAULT_EIO, TIO_FAULT_ENOSPC, TIO_FAULT_SHORT, TIO_FAULT_DELAY };

/* Probe refusals (bit mask). */
enum { TIO_PROBE_FAIL_ODIRECT = 1, TIO_PROBE_FAIL_URING = 2, TIO_PROBE_FAIL_MEMLOCK = 4 };

typedef struct {
    /* The fault_nth chunk (1-based, counted per engine in submission order
     * among chunks of direction fault_op; a chunk is one piece of a
     * request, at most request_bytes, within one stripe unit) fails with
     * -EIO or -ENOSPC without touching the disk, or (SHORT) reports half
     * its bytes moved, which the retry logic must then complete, or (DELAY)
     * starts fault_delay_ms late while other chunks keep moving. */
    uint8_t fault;            /* TIO_FAULT_*; NONE: no fault */
    uint8_t fault_op;         /* TIO_OP_READ or TIO_OP_WRITE (engine_internal.h) */
    uint64_t fault_nth;       /* >= 1 when fault is set */
    uint32_t fault_delay_ms;  /* DELAY only: 1..60000; 0 means 100 */
    /* Make the probe behave as if the file system refused O_DIRECT
     * (EINVAL), the kernel refused io_uring (EPERM), or buffer registration
     * hit RLIMIT_MEMLOCK (ENOMEM). */
    uint32_t probe_fail;      /* TIO_PROBE_FAIL_* bits */
} tio_engine_test_options;

/* tio_engine_create with test hooks (`test` NULL: none, the same as
 * tio_engine_create).  Returns what create returns, or -EINVAL for test
 * options out of range (message names the field). */
int tio_engine_create_test(const tio_engine_options *opt, const tio_engine_test_options *test,
                           tio_engine **out);

/* Fill *out from "<eio|enospc|short|delay>:<read|write>:<N>[:<MS>]" (the
 * tests' shorthand; MS for delay only).  Returns 0 or -EINVAL naming the
 * spec. */
int tio_engine_test_options_parse(const char *spec, tio_engine_test_options *out);

#endif
