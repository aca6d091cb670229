/*
 * tests/c/engine_create.h — an engine for a test, with test hooks: the one
 * place of the rule that a machine refusing io_uring (a container without
 * it) skips an io_uring test with its reason, and that any other failure
 * fails the test with the library's message.  Include after <cmocka.h>.
 */
#ifndef TIO_TESTS_ENGINE_CREATE_H
#define TIO_TESTS_ENGINE_CREATE_H

#include <errno.h>

#include "engine/engine_test.h"
#include "teraio/common.h"

static inline tio_engine *engine_create_or_skip(const tio_engine_options *opt,
                                                const tio_engine_test_options *test)
{
    tio_engine *e = NULL;
    int rc = tio_engine_create_test(opt, test, &e);
    if (rc == -EPROTONOSUPPORT && opt->backend == TIO_BACKEND_IO_URING) {
        print_message("io_uring refused here, test skipped: %s\n", tio_last_error());
        skip();
    }
    if (rc)
        print_error("create: %s\n", tio_last_error());
    assert_int_equal(rc, 0);
    return e;
}

#endif
