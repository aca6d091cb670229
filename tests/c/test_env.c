/*
 * tests/c/test_env.c — tio_env, the one rule for teraio's environment
 * variables in C (src/common/env.c): TERAIO_<NAME> first, the older
 * TIO_<NAME> when that is unset.
 *
 * Proves, on a name no one sets (ENV_PROBE): TERAIO_ wins over TIO_, even
 * when empty; TIO_ alone is read; neither gives NULL; a name too long for
 * the helper gives NULL rather than a truncated name's value.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <cmocka.h>

#include "common/util.h"

static int clear_probe(void **state)
{
    (void)state;
    unsetenv("TERAIO_ENV_PROBE");
    unsetenv("TIO_ENV_PROBE");
    return 0;
}

static void test_teraio_wins(void **state)
{
    (void)state;
    setenv("TIO_ENV_PROBE", "old", 1);
    setenv("TERAIO_ENV_PROBE", "new", 1);
    assert_string_equal(tio_env("ENV_PROBE"), "new");
    setenv("TERAIO_ENV_PROBE", "", 1); /* set, though empty: still the one read */
    assert_string_equal(tio_env("ENV_PROBE"), "");
}

static void test_tio_alone(void **state)
{
    (void)state;
    setenv("TIO_ENV_PROBE", "old", 1);
    assert_string_equal(tio_env("ENV_PROBE"), "old");
}

static void test_neither(void **state)
{
    (void)state;
    assert_null(tio_env("ENV_PROBE"));
}

static void test_name_too_long(void **state)
{
    (void)state;
    char suffix[200];
    memset(suffix, 'X', sizeof suffix - 1);
    suffix[sizeof suffix - 1] = '\0';
    char name[sizeof suffix + 8] = "TIO_";
    strcat(name, suffix);
    setenv(name, "old", 1);
    assert_null(tio_env(suffix));
    unsetenv(name);
    suffix[120] = '\0'; /* TERAIO_ + 120 bytes: the longest it reads */
    strcpy(name + 4, suffix);
    setenv(name, "old", 1);
    assert_string_equal(tio_env(suffix), "old");
    unsetenv(name);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_teraio_wins, clear_probe, clear_probe),
        cmocka_unit_test_setup_teardown(test_tio_alone, clear_probe, clear_probe),
        cmocka_unit_test_setup_teardown(test_neither, clear_probe, clear_probe),
        cmocka_unit_test(test_name_too_long),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
