/*
 * trace/trace_internal.h — rules shared by the trace builder (trace.c) and
 * the trace file reader/writer (trace_io.c).
 *
 * The file format is whitespace-separated, so a name that the builder
 * accepts must be one token on a line; keeping the rule in one place means
 * every trace that can be built can also be saved and loaded back.
 */
#ifndef TERAIO_TRACE_INTERNAL_H
#define TERAIO_TRACE_INTERNAL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* Most kernels a trace may have: a wrap-around period's next_use is
 * first_use + n_kernels, which must fit in uint32_t. */
#define TIO_TRACE_MAX_KERNELS ((uint32_t)INT32_MAX)

/* A kernel or tensor name: non-empty, no byte <= 0x20 (space, tab, newline,
 * control characters) and no DEL.  UTF-8 is fine. */
static inline bool tio_trace_name_ok(const char *s, size_t len)
{
    if (len == 0)
        return false;
    for (size_t i = 0; i < len; i++) {
        unsigned char c = (unsigned char)s[i];
        if (c <= 0x20 || c == 0x7f)
            return false;
    }
    return true;
}

/* The model text: one line, no control characters except tab. */
static inline bool tio_trace_model_ok(const char *s, size_t len)
{
    for (size_t i = 0; i < len; i++) {
        unsigned char c = (unsigned char)s[i];
        if ((c < 0x20 && c != '\t') || c == 0x7f)
            return false;
    }
    return true;
}

#endif
