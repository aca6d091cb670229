/*
 * cli/util.c — argument parsing and error printing shared by subcommands.
 */
#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

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

int cli_lib_error(const char *cmd, int rc)
{
    const char *msg = tio_last_error();
    if (msg && *msg)
        return cli_error(cmd, "%s", msg);
    return cli_error(cmd, "%s", tio_strerror(rc));
}

bool cli_parse_bytes(const char *s, uint64_t *out)
{
    if (!s || !*s || *s == '-')
        return false;
    errno = 0;
    char *end;
    double v = strtod(s, &end);
    if (errno || end == s || !isfinite(v) || v < 0)
        return false;
    /* Binary units (K, KiB, k) are powers of 1024; KB/MB/GB/TB are decimal. */
    static const struct { const char *suffix; double mult; } units[] = {
        {"", 1}, {"B", 1},
        {"K", 1024.0}, {"k", 1024.0}, {"KiB", 1024.0}, {"KB", 1e3},
        {"M", 1048576.0}, {"m", 1048576.0}, {"MiB", 1048576.0}, {"MB", 1e6},
        {"G", 1073741824.0}, {"g", 1073741824.0}, {"GiB", 1073741824.0}, {"GB", 1e9},
        {"T", 1099511627776.0}, {"t", 1099511627776.0}, {"TiB", 1099511627776.0}, {"TB", 1e12},
    };
    for (size_t i = 0; i < sizeof units / sizeof units[0]; i++) {
        if (strcmp(end, units[i].suffix) == 0) {
            double b = v * units[i].mult;
            if (b >= 18446744073709551615.0)
                return false;
            *out = (uint64_t)llround(b);
            return true;
        }
    }
    return false;
}

bool cli_parse_positive(const char *s, double *out)
{
    if (!s || !*s)
        return false;
    errno = 0;
    char *end;
    double v = strtod(s, &end);
    if (errno || *end || !isfinite(v) || v <= 0)
        return false;
    *out = v;
    return true;
}

char *cli_format_bytes(uint64_t bytes, char *buf)
{
    static const char *units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
    double v = (double)bytes;
    int u = 0;
    while (v >= 1024.0 && u < 4) {
        v /= 1024.0;
        u++;
    }
    if (u == 0)
        snprintf(buf, 32, "%llu B", (unsigned long long)bytes);
    else
        snprintf(buf, 32, "%.2f %s", v, units[u]);
    return buf;
}
