/*
 * cli/util.c — argument parsing and error printing shared by subcommands.
 */
#include <errno.h>
#include <limits.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <sys/stat.h>

#include "cli/cli.h"
#include "teraio/common.h"

int cli_error(const char *cmd, const char *fmt, ...)
{
    va_list ap;
    fprintf(stderr, "teraio %s: ", cmd);
    va_start(ap, fmt);
    vfprintf(stderr, fmt, ap);
    va_end(ap);
    fputc('\n', stderr);
    return 1;
}

int cli_usage_error(const char *cmd, const char *fmt, ...)
{
    va_list ap;
    fprintf(stderr, "teraio %s: ", cmd);
    va_start(ap, fmt);
    vfprintf(stderr, fmt, ap);
    va_end(ap);
    fprintf(stderr, " (try 'teraio %s --help')\n", cmd);
    return 2;
}

int cli_lib_error(const char *cmd, int rc)
{
    const char *msg = tio_last_error();
    if (msg && *msg)
        return cli_error(cmd, "%s", msg);
    return cli_error(cmd, "%s", tio_strerror(rc));
}

/* Length of the decimal number at the start of s: digits, optionally a
 * fraction and an exponent ("12", "1.5", ".5", "2e9", "1.5E+3"); 0 if there
 * is none.  Sets *exact when it is digits only. */
static size_t decimal_prefix(const char *s, bool *exact)
{
    static const char digits[] = "0123456789";
    size_t n = strspn(s, digits), frac = 0;
    *exact = true;
    if (s[n] == '.') {
        frac = strspn(s + n + 1, digits);
        n += 1 + frac;
        *exact = false;
    }
    if (n == 0 || (n == 1 && s[0] == '.'))
        return 0;
    if (s[n] == 'e' || s[n] == 'E') {
        size_t sign = s[n + 1] == '+' || s[n + 1] == '-';
        size_t exp = strspn(s + n + 1 + sign, digits);
        if (exp == 0)
            return 0;
        n += 1 + sign + exp;
        *exact = false;
    }
    return n;
}

bool cli_parse_bytes(const char *s, uint64_t *out)
{
    if (!s)
        return false;
    bool exact;
    size_t n = decimal_prefix(s, &exact);
    if (n == 0)
        return false;
    /* Binary units (K, KiB, k) are powers of 1024; KB/MB/GB/TB are decimal. */
    static const struct { const char *suffix; uint64_t mult; } units[] = {
        {"", 1}, {"B", 1},
        {"K", 1ull << 10}, {"k", 1ull << 10}, {"KiB", 1ull << 10}, {"KB", 1000ull},
        {"M", 1ull << 20}, {"m", 1ull << 20}, {"MiB", 1ull << 20}, {"MB", 1000000ull},
        {"G", 1ull << 30}, {"g", 1ull << 30}, {"GiB", 1ull << 30}, {"GB", 1000000000ull},
        {"T", 1ull << 40}, {"t", 1ull << 40}, {"TiB", 1ull << 40}, {"TB", 1000000000000ull},
    };
    const uint64_t *mult = NULL;
    for (size_t i = 0; i < sizeof units / sizeof units[0] && !mult; i++)
        if (strcmp(s + n, units[i].suffix) == 0)
            mult = &units[i].mult;
    if (!mult)
        return false;
    errno = 0;
    if (exact) {
        /* Integers are converted exactly: a double holds only 53 bits. */
        unsigned long long v = strtoull(s, NULL, 10);
        uint64_t b;
        if (errno || __builtin_mul_overflow((uint64_t)v, *mult, &b))
            return false;
        *out = b;
        return true;
    }
    double b = round(strtod(s, NULL) * (double)*mult);
    if (errno || !(b < 18446744073709551616.0)) /* 2^64 */
        return false;
    *out = (uint64_t)b;
    return true;
}

bool cli_parse_positive(const char *s, double *out)
{
    bool exact;
    size_t n = s ? decimal_prefix(s, &exact) : 0;
    if (n == 0 || s[n] != '\0')
        return false;
    errno = 0;
    double v = strtod(s, NULL);
    if (errno || !isfinite(v) || v <= 0)
        return false;
    *out = v;
    return true;
}
