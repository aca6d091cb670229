/*
 * engine/fault.c — the test hooks of engine_test.h: checking them, picking
 * the chunk a fault hits, and the fault's effect on that chunk's transfer.
 *
 * A fault travels the same path as a real failure: the backend still runs
 * the chunk (as a NOP on io_uring, without a syscall on psync), and
 * tio_chunk_account sees the injected result instead of the real one, so
 * the retry and error logic under test is the production code.
 */
#include <stdlib.h>
#include <string.h>

#include "engine/engine_internal.h"

#define TIO_FAULT_DELAY_DEFAULT_MS 100u
#define TIO_FAULT_DELAY_MAX_MS 60000u

/* Check `in` and store it, with defaults filled in, as the engine's hooks. */
int tio_engine_test_check(const tio_engine_test_options *in, tio_engine_test_options *out)
{
    memset(out, 0, sizeof *out);
    if (!in)
        return 0;
    *out = *in;
    if (in->fault > TIO_FAULT_DELAY)
        return tio_fail(-EINVAL, "engine test options: unknown fault %u", in->fault);
    if (in->probe_fail & ~(uint32_t)(TIO_PROBE_FAIL_ODIRECT | TIO_PROBE_FAIL_URING |
                                     TIO_PROBE_FAIL_MEMLOCK))
        return tio_fail(-EINVAL, "engine test options: unknown probe_fail bits 0x%x",
                        in->probe_fail);
    if (in->fault == TIO_FAULT_NONE)
        return 0;
    if (in->fault_op != TIO_OP_READ && in->fault_op != TIO_OP_WRITE)
        return tio_fail(-EINVAL, "engine test options: fault_op %u is neither read nor write",
                        in->fault_op);
    if (in->fault_nth == 0)
        return tio_fail(-EINVAL, "engine test options: fault_nth must be >= 1");
    if (in->fault_delay_ms && in->fault != TIO_FAULT_DELAY)
        return tio_fail(-EINVAL, "engine test options: fault_delay_ms is for delay faults only");
    if (in->fault_delay_ms > TIO_FAULT_DELAY_MAX_MS)
        return tio_fail(-EINVAL, "engine test options: fault_delay_ms %u exceeds %u",
                        in->fault_delay_ms, TIO_FAULT_DELAY_MAX_MS);
    if (in->fault == TIO_FAULT_DELAY && in->fault_delay_ms == 0)
        out->fault_delay_ms = TIO_FAULT_DELAY_DEFAULT_MS;
    tio_log(TIO_LOG_WARN, "engine: test fault armed: kind %u on %s chunk %llu", in->fault,
            in->fault_op == TIO_OP_WRITE ? "write" : "read", (unsigned long long)in->fault_nth);
    return 0;
}

int tio_engine_test_options_parse(const char *spec, tio_engine_test_options *out)
{
    static const char *const kinds[] = {"", "eio", "enospc", "short", "delay"};
    memset(out, 0, sizeof *out);
    char kind[16], op[16];
    unsigned long long nth, ms = 0;
    int pos = 0;
    if (!spec || sscanf(spec, "%15[a-z]:%15[a-z]:%llu%n", kind, op, &nth, &pos) != 3)
        goto bad;
    if (spec[pos] == ':') {
        char *end;
        const char *digits = spec + pos + 1;
        ms = strtoull(digits, &end, 10);
        if (strcmp(kind, "delay") != 0 || end == digits || *end || *digits == '-' ||
            ms == 0 || ms > TIO_FAULT_DELAY_MAX_MS)
            goto bad;
    } else if (spec[pos]) {
        goto bad;
    }
    for (uint8_t k = TIO_FAULT_EIO; k <= TIO_FAULT_DELAY; k++)
        if (!strcmp(kind, kinds[k]))
            out->fault = k;
    if (!out->fault || nth == 0 || (strcmp(op, "read") && strcmp(op, "write")))
        goto bad;
    out->fault_op = strcmp(op, "write") == 0 ? TIO_OP_WRITE : TIO_OP_READ;
    out->fault_nth = nth;
    out->fault_delay_ms = (uint32_t)ms;
    return 0;
bad:
    memset(out, 0, sizeof *out);
    return tio_fail(-EINVAL, "fault '%s': expected <eio|enospc|short|delay>:<read|write>:<N> "
                    "with N >= 1 (delay: optionally :<MS> from 1 to 60000)", spec ? spec : "");
}

void tio_fault_arm(tio_engine *e, tio_chunk *c)
{
    if (e->test.fault && e->test.fault_op == c->op && ++e->chunk_count[c->op] == e->test.fault_nth)
        c->fault = e->test.fault;
}

bool tio_fault_apply(tio_chunk *c, int64_t *res)
{
    uint8_t fault = c->fault;
    c->fault = TIO_FAULT_NONE;
    if (fault == TIO_FAULT_EIO)
        *res = -EIO;
    else if (fault == TIO_FAULT_ENOSPC)
        *res = -ENOSPC;
    else if (fault == TIO_FAULT_SHORT && *res > 0)
        *res = (*res + 1) / 2;
    return fault == TIO_FAULT_DELAY; /* the delay is over: now do the transfer */
}
