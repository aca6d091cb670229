/*
 * tests/c/test_data_alloc_faults.c — every allocation of tio_loader_create
 * failing in turn (SQLite-style fault injection): each attempt returns 0 or
 * -ENOMEM, the loader of a failed create is cleaned up without a crash (issue
 * 12 item 7: destroy walked a slot array that failed to allocate), and the
 * attempt after the last injectable allocation succeeds and delivers.
 *
 * malloc, calloc and realloc of this program are wrapped: when armed on the
 * calling thread, the N-th call fails.  The sanitizers bring their own
 * allocator, so there the test is skipped.
 */
#include <errno.h>
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <cmocka.h>

#include "common/util.h"
#include "teraio/data.h"

#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
#define WRAPPED 0
#else
#define WRAPPED 1
extern void *__libc_malloc(size_t);
extern void *__libc_calloc(size_t, size_t);
extern void *__libc_realloc(void *, size_t);

static _Thread_local long fail_at;  /* 0: not armed; else the call that fails */
static _Thread_local long calls;

static bool inject(void)
{
    if (!fail_at || ++calls != fail_at)
        return false;
    errno = ENOMEM; /* as malloc does: glibc's own callers check it */
    return true;
}

void *malloc(size_t n) { return inject() ? NULL : __libc_malloc(n); }
void *calloc(size_t n, size_t m) { return inject() ? NULL : __libc_calloc(n, m); }
void *realloc(void *p, size_t n) { return inject() ? NULL : __libc_realloc(p, n); }
#endif

static void test_loader_create_every_allocation_failing(void **state)
{
    (void)state;
#if !WRAPPED
    skip();
#else
    char root[512], cmd[1200];
    const char *base = tio_env("TEST_TMPDIR");
    snprintf(root, sizeof root, "%s/data-faults-%d", base ? base : "/tmp", (int)getpid());
    snprintf(cmd, sizeof cmd, "mkdir -p '%s/a' && for i in 1 2 3 4 5 6; do echo "
             "\"{\\\"text\\\": \\\"doc $i\\\"}\"; done > '%s/a/x.jsonl'", root, root);
    assert_int_equal(system(cmd), 0);
    tio_dataset *ds;
    assert_int_equal(tio_dataset_open(root, NULL, &ds), 0);
    tio_loader_options o;
    tio_loader_options_default(&o);
    o.seq_len = 8;
    o.logical_shards = 4;
    o.prefetch = 4;
    long n;
    int rc = -ENOMEM;
    for (n = 1; n < 100000 && rc; n++) {
        tio_loader *ld = NULL;
        calls = 0;
        fail_at = n;
        rc = tio_loader_create(ds, &o, NULL, NULL, 0, &ld);
        fail_at = 0;
        if (rc) {
            if (rc != -ENOMEM && rc != -EAGAIN)
                fail_msg("allocation %ld failing: %d %s", n, rc, tio_last_error());
            assert_null(ld);
            continue;
        }
        const tio_data_sample *s;
        assert_int_equal(tio_loader_next(ld, &s), 0);
        tio_loader_destroy(ld);
    }
    assert_int_equal(rc, 0);
    assert_true(n > 5); /* allocations were failed on the way */
    tio_dataset_destroy(ds);
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", root);
    assert_int_equal(system(cmd), 0);
#endif
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_loader_create_every_allocation_failing),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
