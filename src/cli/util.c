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

/* Length of the well-formed UTF-8 sequence at p (1 to 4), 0 if it is not
 * one (stray continuation byte, overlong form, surrogate, above U+10FFFF). */
static int utf8_length(const unsigned char *p)
{
    int n = p[0] < 0x80 ? 1 : p[0] < 0xc2 ? 0 : p[0] < 0xe0 ? 2 : p[0] < 0xf0 ? 3 : p[0] < 0xf5 ? 4 : 0;
    for (int i = 1; i < n; i++)
        if ((p[i] & 0xc0) != 0x80)
            return 0;
    if ((n == 3 && ((p[0] == 0xe0 && p[1] < 0xa0) || (p[0] == 0xed && p[1] >= 0xa0))) ||
        (n == 4 && ((p[0] == 0xf0 && p[1] < 0x90) || (p[0] == 0xf4 && p[1] >= 0x90))))
        return 0;
    return n;
}

/* A JSON string; bytes that are not UTF-8 (a trace's model text may hold
 * any) become U+FFFD, so the output always parses. */
void cli_json_string(FILE *f, const char *s)
{
    fputc('"', f);
    for (const unsigned char *p = (const unsigned char *)s; *p;) {
        int n = utf8_length(p);
        if (n == 0) {
            fputs("\\ufffd", f);
            p++;
            continue;
        }
        if (*p == '"' || *p == '\\')
            fprintf(f, "\\%c", *p);
        else if (*p < 0x20)
            fprintf(f, "\\u%04x", *p);
        else
            fwrite(p, 1, (size_t)n, f);
        p += n;
    }
    fputc('"', f);
}

bool cli_parse_u32(const char *s, uint32_t lo, uint32_t hi, uint32_t *out)
{
    char *end;
    if (!s || *s < '0' || *s > '9')
        return false;
    errno = 0;
    unsigned long long v = strtoull(s, &end, 10);
    if (errno || *end || v < lo || v > hi)
        return false;
    *out = (uint32_t)v;
    return true;
}
