/*
 * common/env.c — the one rule for teraio's environment variables in C:
 * TERAIO_<NAME>, the prefix the Python side and the documentation use, and,
 * when that is unset, TIO_<NAME>, the older prefix, still read so that
 * existing scripts keep working (util.h, tio_env).
 *
 * Every getenv of a teraio variable goes through here, so that the two
 * prefixes are tried in the same order everywhere.
 */
#include <stdlib.h>
#include <string.h>

#include "common/util.h"

const char *tio_env(const char *suffix)
{
    char name[128];
    if (strlen(suffix) > sizeof name - sizeof "TERAIO_")
        return NULL;
    snprintf(name, sizeof name, "TERAIO_%s", suffix);
    const char *v = getenv(name);
    if (v)
        return v;
    snprintf(name, sizeof name, "TIO_%s", suffix);
    return getenv(name);
}
