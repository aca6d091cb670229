/*
 * sim/suite.c — evaluation suites: a directory of traces with an index,
 * and every strategy simulated on each (`teraio eval paper`).
 *
 * The index (DIR/suite.txt, format in include/teraio/sim.h) is written by
 * the Python step that makes the traces (python -m teraio.paper trace DIR);
 * this file reads it strictly, like the other readers — every line's
 * fields checked, errors naming "origin:line: field 'name': expected ...",
 * no reliance on a NUL terminator (fuzz/fuzz_suite.c feeds raw bytes).
 * Configurations that name the same trace file are simulated once and
 * share the results.
 */
#include <errno.h>
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/util.h"
#include "sim/sim_internal.h"

enum { MAX_TOKENS = 9, MAX_CONFIGS = 4096 };

typedef struct {
    const char *s;
    size_t n;
} token;

typedef struct {
    const char *origin;
    unsigned line;
} where;

static int bad(const where *w, const char *field, const char *want, token t)
{
    return tio_fail(TIO_EPARSE, "%s:%u: field '%s': expected %s, got '%.*s'", w->origin, w->line,
                    field, want, (int)(t.n > 40 ? 40 : t.n), t.s);
}

/* Split [s, e) at blanks into at most MAX_TOKENS tokens; returns the count
 * (MAX_TOKENS + 1 if there are more). */
static unsigned split(const char *s, const char *e, token *t)
{
    unsigned n = 0;
    while (s < e) {
        while (s < e && (*s == ' ' || *s == '\t' || *s == '\r'))
            s++;
        if (s == e)
            break;
        const char *b = s;
        while (s < e && *s != ' ' && *s != '\t' && *s != '\r')
            s++;
        if (n == MAX_TOKENS)
            return MAX_TOKENS + 1;
        t[n++] = (token){b, (size_t)(s - b)};
    }
    return n;
}

static bool is(token t, const char *word) { return t.n == strlen(word) && !memcmp(t.s, word, t.n); }

/* A name: 1..max-1 characters of [A-Za-z0-9._+-], not "." or "..". */
static bool name_ok(token t, size_t max)
{
    if (t.n == 0 || t.n >= max || is(t, ".") || is(t, ".."))
        return false;
    for (size_t i = 0; i < t.n; i++) {
        char c = t.s[i];
        if (!((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
              c == '.' || c == '_' || c == '-' || c == '+'))
            return false;
    }
    return true;
}

static int get_name(const where *w, const char *field, token t, char *out, size_t max)
{
    if (!name_ok(t, max))
        return bad(w, field, "a name of letters, digits and . _ + - (no '/')", t);
    memcpy(out, t.s, t.n);
    out[t.n] = '\0';
    return 0;
}

static int get_u32(const where *w, const char *field, token t, uint32_t *out)
{
    uint64_t v = 0;
    bool ok = t.n > 0 && t.n <= 10;
    for (size_t i = 0; ok && i < t.n; i++) {
        ok = t.s[i] >= '0' && t.s[i] <= '9';
        v = v * 10 + (uint64_t)(t.s[i] - '0');
    }
    if (!ok || v == 0 || v > UINT32_MAX)
        return bad(w, field, "an integer in [1, 2^32)", t);
    *out = (uint32_t)v;
    return 0;
}

static int get_double(const where *w, const char *field, token t, double lo, double hi,
                      double *out)
{
    char buf[64];
    if (t.n == 0 || t.n >= sizeof buf)
        return bad(w, field, "a number", t);
    memcpy(buf, t.s, t.n);
    buf[t.n] = '\0';
    char *end;
    double v = strtod(buf, &end);
    bool digits = buf[0] >= '0' && buf[0] <= '9';
    if (*end || !digits || !isfinite(v) || v < lo || v > hi) {
        char want[96];
        snprintf(want, sizeof want, "a decimal number in [%g, %g]", lo, hi);
        return bad(w, field, want, t);
    }
    *out = v;
    return 0;
}

static int parse_config(const where *w, const token *t, unsigned n, tio_sim_suite_config *c)
{
    if (n != 8)
        return tio_fail(TIO_EPARSE, "%s:%u: expected 'config MODEL BATCH SEQ MICRO_BATCH SHARDS "
                        "REFERENCE_M_PCT TRACE' (8 fields), got %u", w->origin, w->line, n);
    int rc;
    if ((rc = get_name(w, "model", t[1], c->model, sizeof c->model)) ||
        (rc = get_u32(w, "batch", t[2], &c->batch)) || (rc = get_u32(w, "seq", t[3], &c->seq)) ||
        (rc = get_u32(w, "micro_batch", t[4], &c->micro_batch)) ||
        (rc = get_u32(w, "shards", t[5], &c->shards)) ||
        (rc = get_double(w, "reference_m_pct", t[6], 0, 1e6, &c->reference_m_pct)) ||
        (rc = get_name(w, "trace", t[7], c->trace, sizeof c->trace)))
        return rc;
    return 0;
}

static int parse_reference(const where *w, const token *t, unsigned n, tio_sim_suite_reference *r)
{
    if (n != 4)
        return tio_fail(TIO_EPARSE, "%s:%u: expected 'reference MODEL STRATEGY FRACTION' (4 "
                        "fields), got %u", w->origin, w->line, n);
    char name[32];
    int rc;
    if ((rc = get_name(w, "model", t[1], r->model, sizeof r->model)) ||
        (rc = get_name(w, "strategy", t[2], name, sizeof name)))
        return rc;
    if (tio_sim_strategy_parse(name, &r->strategy))
        return bad(w, "strategy", "a strategy name (ideal, teraio-alg1, teraio, zero-offload, "
                   "zero-infinity, flashneuron, lru)", t[2]);
    return get_double(w, "fraction_of_ideal", t[3], 0, 1, &r->fraction_of_ideal);
}

/* One content line (after the header). */
static int parse_line(tio_sim_suite *s, const where *w, const token *t, unsigned n,
                      bool *have_hw)
{
    if (n > MAX_TOKENS)
        return tio_fail(TIO_EPARSE, "%s:%u: too many fields", w->origin, w->line);
    if (is(t[0], "hw")) {
        if (*have_hw)
            return tio_fail(TIO_EPARSE, "%s:%u: field 'hw': given twice", w->origin, w->line);
        if (n != 2)
            return tio_fail(TIO_EPARSE, "%s:%u: expected 'hw NAME'", w->origin, w->line);
        *have_hw = true;
        return get_name(w, "hw", t[1], s->hw_name, sizeof s->hw_name);
    }
    bool config = is(t[0], "config");
    if (!config && !is(t[0], "reference"))
        return bad(w, "record", "'hw', 'config' or 'reference'", t[0]);
    uint32_t *count = config ? &s->n_configs : &s->n_references;
    if (*count >= MAX_CONFIGS)
        return tio_fail(TIO_EPARSE, "%s:%u: more than %d %s lines", w->origin, w->line,
                        MAX_CONFIGS, config ? "config" : "reference");
    uint32_t cap = config ? s->cap_configs : s->cap_references;
    int rc = config ? tio_grow((void **)&s->configs, &cap, *count + 1, sizeof *s->configs)
                    : tio_grow((void **)&s->references, &cap, *count + 1, sizeof *s->references);
    if (rc)
        return rc;
    if (config) {
        s->cap_configs = cap;
        rc = parse_config(w, t, n, &s->configs[*count]);
    } else {
        s->cap_references = cap;
        rc = parse_reference(w, t, n, &s->references[*count]);
    }
    if (!rc)
        (*count)++;
    return rc;
}

int tio_sim_suite_parse(const char *text, size_t len, const char *origin, tio_sim_suite **out)
{
    if (!out || (!text && len) || !origin)
        return tio_fail(-EINVAL, "tio_sim_suite_parse: text, origin and out are required");
    *out = NULL;
    tio_sim_suite *s = calloc(1, sizeof *s);
    if (!s)
        return tio_fail(-ENOMEM, "out of memory for a suite");
    where w = {origin, 0};
    const char *p = text, *end = text + len;
    bool header = false, have_hw = false;
    int rc = 0;
    while (!rc && p < end) {
        const char *e = memchr(p, '\n', (size_t)(end - p));
        if (!e)
            e = end;
        w.line++;
        token t[MAX_TOKENS];
        unsigned n = split(p, e, t);
        p = e + 1;
        if (!header) {
            if (n != 2 || !is(t[0], "teraio-suite"))
                rc = tio_fail(TIO_EPARSE, "%s:1: expected 'teraio-suite 1'", origin);
            else if (!is(t[1], "1"))
                rc = tio_fail(TIO_EVERSION, "%s:1: field 'version': expected 1 (the version "
                              "this build reads), got '%.*s'", origin,
                              (int)(t[1].n > 20 ? 20 : t[1].n), t[1].s);
            header = true;
            continue;
        }
        if (n == 0 || t[0].s[0] == '#')
            continue;
        rc = parse_line(s, &w, t, n, &have_hw);
    }
    if (!rc && !header)
        rc = tio_fail(TIO_EPARSE, "%s:1: expected 'teraio-suite 1', got an empty file", origin);
    if (!rc && !have_hw)
        rc = tio_fail(TIO_EPARSE, "%s: field 'hw': missing (required)", origin);
    if (!rc && s->n_configs == 0)
        rc = tio_fail(TIO_EPARSE, "%s: no 'config' lines: the suite has nothing to evaluate",
                      origin);
    if (rc) {
        tio_sim_suite_destroy(s);
        return rc;
    }
    *out = s;
    return 0;
}

int tio_sim_suite_load(const char *dir, tio_sim_suite **out)
{
    if (!dir || !out)
        return tio_fail(-EINVAL, "tio_sim_suite_load: dir and out are required");
    *out = NULL;
    char path[PATH_MAX];
    if (snprintf(path, sizeof path, "%s/suite.txt", dir) >= (int)sizeof path)
        return tio_fail(-ENAMETOOLONG, "%s: path too long", dir);
    char *text = NULL;
    size_t len = 0;
    int rc = tio_read_file(path, &text, &len);
    rc = rc ? rc : tio_sim_suite_parse(text, len, path, out);
    free(text);
    return rc;
}

void tio_sim_suite_destroy(tio_sim_suite *s)
{
    if (!s)
        return;
    free(s->configs);
    free(s->references);
    free(s);
}

/* ---- running a suite -------------------------------------------------------- */

static int copy_report(const tio_sim_report *from, tio_sim_report *to)
{
    *to = *from;
    to->memory_bytes = malloc((size_t)(from->n_kernels ? from->n_kernels : 1) *
                              sizeof *to->memory_bytes);
    if (!to->memory_bytes)
        return tio_fail(-ENOMEM, "out of memory for a report of %u kernels", from->n_kernels);
    memcpy(to->memory_bytes, from->memory_bytes, (size_t)from->n_kernels * sizeof *to->memory_bytes);
    return 0;
}

/* Load config i's trace, analyse it and simulate every strategy. */
static int run_config(const tio_sim_suite *s, const char *dir, const tio_hw *hw, uint32_t i,
                      tio_sim_progress_fn progress, void *ctx, tio_sim_suite_result *r)
{
    char path[PATH_MAX];
    if (snprintf(path, sizeof path, "%s/%s", dir, s->configs[i].trace) >= (int)sizeof path)
        return tio_fail(-ENAMETOOLONG, "%s: path too long", dir);
    tio_trace *trace = NULL;
    tio_lifetime *lt = NULL;
    int rc = tio_trace_load(path, &trace);
    if (!rc)
        rc = tio_lifetime_analyze(trace, &lt);
    for (int st = 0; st < TIO_SIM_N_STRATEGIES && !rc; st++) {
        if (progress)
            progress(ctx, i, tio_sim_strategy_name((tio_sim_strategy)st));
        rc = tio_sim_run(trace, lt, hw, (tio_sim_strategy)st, &r->rep[st], NULL);
    }
    if (!rc)
        r->traced_m_pct = 100.0 * (double)lt->peak_bytes / (double)hw->capacity_bytes;
    tio_lifetime_destroy(lt);
    tio_trace_destroy(trace);
    return rc;
}

int tio_sim_suite_run(const tio_sim_suite *s, const char *dir, const tio_hw *hw,
                      tio_sim_progress_fn progress, void *ctx, tio_sim_suite_result **out)
{
    if (!s || !dir || !hw || !out)
        return tio_fail(-EINVAL, "tio_sim_suite_run: suite, dir, profile and out are required");
    *out = NULL;
    tio_sim_suite_result *r = calloc(s->n_configs, sizeof *r);
    if (!r)
        return tio_fail(-ENOMEM, "out of memory for %u results", s->n_configs);
    int rc = 0;
    for (uint32_t i = 0; i < s->n_configs && !rc; i++) {
        uint32_t j = 0;
        while (j < i && strcmp(s->configs[j].trace, s->configs[i].trace))
            j++;
        r[i].same_as = j;
        if (j == i) {
            rc = run_config(s, dir, hw, i, progress, ctx, &r[i]);
            continue;
        }
        r[i].traced_m_pct = r[j].traced_m_pct;
        for (int st = 0; st < TIO_SIM_N_STRATEGIES && !rc; st++)
            rc = copy_report(&r[j].rep[st], &r[i].rep[st]);
    }
    if (rc) {
        tio_sim_suite_results_free(r, s->n_configs);
        return rc;
    }
    *out = r;
    return 0;
}

void tio_sim_suite_results_free(tio_sim_suite_result *r, uint32_t n)
{
    if (!r)
        return;
    for (uint32_t i = 0; i < n; i++)
        for (int st = 0; st < TIO_SIM_N_STRATEGIES; st++)
            tio_sim_report_free(&r[i].rep[st]);
    free(r);
}
