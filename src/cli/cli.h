/*
 * cli/cli.h — shared pieces of the `teraio` command: the subcommand table
 * entries and argument helpers.  Every subcommand returns the process exit
 * status; on failure it has printed exactly one line to stderr
 * ("teraio <cmd>: <what went wrong>").
 */
#ifndef TERAIO_CLI_H
#define TERAIO_CLI_H

#include <stdint.h>
#include <stdio.h>
#include <stdbool.h>

#include "common/util.h"

int cmd_version(int argc, char **argv);
int cmd_analyze(int argc, char **argv);
int cmd_plan(int argc, char **argv);
int cmd_tokenize(int argc, char **argv);
int cmd_eval(int argc, char **argv);
int cmd_advise(int argc, char **argv);
int cmd_bench(int argc, char **argv);
int cmd_check(int argc, char **argv);
int cmd_data(int argc, char **argv);
int cmd_data_bench(int argc, char **argv); /* teraio data bench (cmd_data_bench.c) */

/* Print "teraio <cmd>: <message>" on stderr; returns exit status 1. */
int cli_error(const char *cmd, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

/* A usage mistake: "teraio <cmd>: <message> (try 'teraio <cmd> --help')" on
 * stderr; returns exit status 2. */
int cli_usage_error(const char *cmd, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

/* Same as cli_error, for a library error code: appends tio_last_error() or tio_strerror(rc). */
int cli_lib_error(const char *cmd, int rc);

/* Parse a byte count: a decimal number (digits, optional fraction and
 * exponent: "512", "1.5", "2e9"; no sign, blanks or hex) with an optional
 * suffix K/M/G/T (powers of 1024, also KiB/MiB/GiB/TiB) or KB/MB/GB/TB
 * (powers of 1000).  Plain integers are exact up to 2^64 - 1; a fraction is
 * rounded to the nearest byte.  Returns true and stores it in *out, false if
 * malformed or not below 2^64. */
bool cli_parse_bytes(const char *s, uint64_t *out);

/* Parse a finite positive decimal number (same syntax as the number part
 * of cli_parse_bytes). */
bool cli_parse_positive(const char *s, double *out);

/* Write `s` as a JSON string (quotes, backslashes, control characters
 * escaped; bytes that are not UTF-8 become U+FFFD, so the output parses). */
void cli_json_string(FILE *f, const char *s);

/* Parse a decimal integer in [lo, hi] (digits only, no sign or blanks). */
bool cli_parse_u32(const char *s, uint32_t lo, uint32_t hi, uint32_t *out);

/* Byte counts are printed with tio_format_bytes (common/util.h). */

#endif
