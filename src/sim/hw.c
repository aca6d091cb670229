/*
 * sim/hw.c — hardware profiles: the "key = value" file (format in
 * include/teraio/sim.h) and the channel bandwidths derived from it.
 *
 * The reader is strict like the trace and plan readers: every key known,
 * none twice, every value checked, required keys present, and an error
 * names "origin:line: field 'key': expected ...".  It never relies on the
 * input being NUL-terminated (fuzz/fuzz_hw.c feeds raw bytes).
 */
#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "common/util.h"
#include "teraio/sim.h"

typedef enum { F_NAME, F_U64, F_U32, F_POS, F_NONNEG } field_type;

typedef struct {
    const char *key;
    field_type type;
    bool required;
    size_t offset;
} field;

#define FIELD(k, t, req) {#k, t, req, offsetof(tio_hw, k)}
static const field FIELDS[] = {
    FIELD(name, F_NAME, true),
    FIELD(capacity_bytes, F_U64, true),
    FIELD(pcie_h2d_gbps, F_POS, true),
    FIELD(pcie_d2h_gbps, F_POS, true),
    FIELD(ssd_count, F_U32, true),
    FIELD(ssd_read_gbps, F_POS, true),
    FIELD(ssd_write_gbps, F_POS, true),
    FIELD(ssd_array_read_gbps, F_POS, false),
    FIELD(ssd_array_write_gbps, F_POS, false),
    FIELD(ssd_latency_us, F_NONNEG, true),
    FIELD(host_latency_us, F_NONNEG, true),
    FIELD(host_cap_bytes, F_U64, true),
    FIELD(cpu_adam_params_per_s, F_POS, true),
    FIELD(gpu_matmul_tflops, F_POS, false),
    FIELD(gpu_vector_tflops, F_POS, false),
    FIELD(gpu_mem_gbps, F_POS, false),
    FIELD(matmul_efficiency, F_POS, false),
    FIELD(mem_efficiency, F_POS, false),
    FIELD(kernel_overhead_us, F_NONNEG, false),
    FIELD(host_overhead_us, F_NONNEG, false),
    FIELD(migration_host_ns_per_byte, F_NONNEG, false),
    FIELD(gpu_matmul_16bit_tflops, F_POS, false),
};
#define N_FIELDS (sizeof FIELDS / sizeof FIELDS[0])

static bool is_space(char c) { return c == ' ' || c == '\t' || c == '\r'; }

/* Trim [*s, *e) of blanks. */
static void trim(const char **s, const char **e)
{
    while (*s < *e && is_space(**s))
        (*s)++;
    while (*e > *s && is_space((*e)[-1]))
        (*e)--;
}

static int bad(const char *origin, unsigned line, const char *key, const char *want,
               const char *v, size_t vlen)
{
    return tio_fail(TIO_EPARSE, "%s:%u: field '%s': expected %s, found '%.*s'", origin, line,
                    key, want, (int)(vlen > 40 ? 40 : vlen), v);
}

static int set_value(const field *f, tio_hw *hw, const char *v, size_t vlen, const char *origin,
                     unsigned line)
{
    char buf[64];
    if (vlen == 0 || vlen >= sizeof buf)
        return bad(origin, line, f->key, f->type == F_NAME ? "a name of 1-63 characters"
                                                         : "a number", v, vlen);
    memcpy(buf, v, vlen);
    buf[vlen] = '\0';
    char *end = NULL;
    void *dst = (char *)hw + f->offset;
    switch (f->type) {
    case F_NAME:
        for (size_t i = 0; i < vlen; i++)
            if ((unsigned char)buf[i] <= ' ' || buf[i] == 0x7f)
                return bad(origin, line, f->key, "one token without blanks", v, vlen);
        memcpy(dst, buf, vlen + 1);
        return 0;
    case F_U64:
    case F_U32: {
        if (buf[0] < '0' || buf[0] > '9')
            return bad(origin, line, f->key, "an unsigned integer", v, vlen);
        errno = 0;
        unsigned long long x = strtoull(buf, &end, 10);
        if (errno || *end)
            return bad(origin, line, f->key, "an unsigned integer", v, vlen);
        if (f->type == F_U32) {
            if (x == 0 || x > 1024)
                return bad(origin, line, f->key, "an integer in 1..1024", v, vlen);
            *(uint32_t *)dst = (uint32_t)x;
        } else {
            if (!strcmp(f->key, "capacity_bytes") && x == 0)
                return bad(origin, line, f->key, "a positive integer", v, vlen);
            *(uint64_t *)dst = x;
        }
        return 0;
    }
    case F_POS:
    case F_NONNEG: {
        errno = 0;
        double x = strtod(buf, &end);
        bool ok = !errno && *end == '\0' && end != buf && isfinite(x) &&
                  (f->type == F_POS ? x > 0 : x >= 0) && x < 1e12;
        if (!ok)
            return bad(origin, line, f->key,
                       f->type == F_POS ? "a finite number > 0" : "a finite number >= 0", v,
                       vlen);
        *(double *)dst = x;
        return 0;
    }
    }
    return 0;
}

int tio_hw_parse(const char *text, size_t len, const char *origin, tio_hw *out)
{
    if (!text || !out)
        return tio_fail(-EINVAL, "tio_hw_parse: text and out are required");
    if (!origin)
        origin = "<hw>";
    tio_hw hw;
    memset(&hw, 0, sizeof hw);
    bool seen[N_FIELDS] = {false};
    const char *p = text, *end = text + len;
    unsigned line = 0;
    while (p < end) {
        line++;
        const char *eol = memchr(p, '\n', (size_t)(end - p));
        const char *le = eol ? eol : end;
        const char *s = p, *e = le;
        p = eol ? eol + 1 : end;
        const char *hash = memchr(s, '#', (size_t)(e - s));
        if (hash)
            e = hash;
        trim(&s, &e);
        if (s == e)
            continue;
        const char *eq = memchr(s, '=', (size_t)(e - s));
        if (!eq)
            return tio_fail(TIO_EPARSE, "%s:%u: expected 'key = value', found '%.*s'", origin,
                            line, (int)(e - s > 40 ? 40 : e - s), s);
        const char *ks = s, *ke = eq, *vs = eq + 1, *ve = e;
        trim(&ks, &ke);
        trim(&vs, &ve);
        size_t klen = (size_t)(ke - ks);
        size_t i = 0;
        while (i < N_FIELDS && (strlen(FIELDS[i].key) != klen || memcmp(FIELDS[i].key, ks, klen)))
            i++;
        if (i == N_FIELDS)
            return tio_fail(TIO_EPARSE, "%s:%u: unknown key '%.*s'", origin, line,
                            (int)(klen > 40 ? 40 : klen), ks);
        if (seen[i])
            return tio_fail(TIO_EPARSE, "%s:%u: field '%s': given twice", origin, line,
                            FIELDS[i].key);
        seen[i] = true;
        int rc = set_value(&FIELDS[i], &hw, vs, (size_t)(ve - vs), origin, line);
        if (rc)
            return rc;
    }
    for (size_t i = 0; i < N_FIELDS; i++)
        if (FIELDS[i].required && !seen[i])
            return tio_fail(TIO_EPARSE, "%s: field '%s': missing (required)", origin,
                            FIELDS[i].key);
    if (hw.matmul_efficiency > 1 || hw.mem_efficiency > 1)
        return tio_fail(TIO_EPARSE, "%s: field '%s': expected a share of the peak in (0, 1], "
                        "got %g", origin, hw.matmul_efficiency > 1 ? "matmul_efficiency"
                        : "mem_efficiency", hw.matmul_efficiency > 1 ? hw.matmul_efficiency
                        : hw.mem_efficiency);
    *out = hw;
    return 0;
}

int tio_hw_load(const char *path, tio_hw *out)
{
    if (!path || !out)
        return tio_fail(-EINVAL, "tio_hw_load: path and out are required");
    char *text;
    size_t len;
    int rc = tio_read_file(path, &text, &len);
    if (rc)
        return rc;
    rc = tio_hw_parse(text, len, path, out);
    free(text);
    return rc;
}

static double min_pos(double a, double b) { return b > 0 && b < a ? b : a; }

tio_hw_bandwidth tio_hw_channels(const tio_hw *hw)
{
    tio_hw_bandwidth bw;
    bw.ssd_read = min_pos(min_pos(hw->ssd_count * hw->ssd_read_gbps, hw->ssd_array_read_gbps),
                          hw->pcie_h2d_gbps);
    bw.ssd_write = min_pos(min_pos(hw->ssd_count * hw->ssd_write_gbps, hw->ssd_array_write_gbps),
                           hw->pcie_d2h_gbps);
    bw.host_read = hw->pcie_h2d_gbps - bw.ssd_read;
    bw.host_write = hw->pcie_d2h_gbps - bw.ssd_write;
    if (bw.host_read < 0.1 * hw->pcie_h2d_gbps)
        bw.host_read = 0.1 * hw->pcie_h2d_gbps;
    if (bw.host_write < 0.1 * hw->pcie_d2h_gbps)
        bw.host_write = 0.1 * hw->pcie_d2h_gbps;
    return bw;
}

void tio_hw_plan_options(const tio_hw *hw, tio_plan_options *opt)
{
    tio_plan_options_default(opt);
    tio_hw_bandwidth bw = tio_hw_channels(hw);
    opt->capacity_bytes = hw->capacity_bytes;
    opt->ssd_read_gbps = bw.ssd_read;
    opt->ssd_write_gbps = bw.ssd_write;
    opt->host_to_device_gbps = bw.host_read;
    opt->device_to_host_gbps = bw.host_write;
    opt->host_cap_bytes = hw->host_cap_bytes;
}
