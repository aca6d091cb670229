/*
 * plan/plan_io.c — the plan file ("teraio-plan", version 1) and the check
 * of a plan against the trace it is applied to.
 *
 * The file is line-oriented text so that a person can read and edit it
 * (format in docs/format-plan.md):
 *
 *   teraio-plan 1
 *   kernels 8 tensors 5 capacity 4000
 *   offload 4 0 1 ssd 500
 *   prefetch 4 5 6 ssd 500
 *
 * The reader is strict — every field is checked and an error names
 * "origin:line: field 'name': expected ..., found '...'" — because a plan
 * that is silently misread moves the wrong bytes at the wrong time.  It
 * never relies on the input being NUL-terminated (the fuzzer feeds raw
 * bytes).  Blank lines and lines starting with '#' are skipped.
 *
 * tio_plan_check then proves the plan safe for a trace: tensors and kernels
 * exist, sizes match, every offload pairs with a prefetch of the same
 * tensor and tier (but an intermediate's last offload in its tail period,
 * lifetime.h, which has none), and each pair keeps its tensor off the
 * device only inside one of its inactive periods.  It derives M' from the pairs with a
 * difference array, so it costs O(kernels + migrations log migrations).
 */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "common/util.h"
#include "plan/plan_internal.h"

const char *tio_tier_name(tio_tier tier)
{
    switch (tier) {
    case TIO_TIER_DEVICE: return "device";
    case TIO_TIER_HOST: return "host";
    case TIO_TIER_SSD: return "ssd";
    }
    return NULL;
}

/* ---- writing ------------------------------------------------------------- */

int tio_plan_save(const tio_plan *plan, const char *path)
{
    if (!plan || !path)
        return tio_fail(-EINVAL, "tio_plan_save: plan and path are required");
    if (plan->n_kernels == 0 || plan->n_kernels > INT32_MAX)
        return tio_fail(-EINVAL, "%s: a plan file holds 1 to %d kernels, this plan has %u", path,
                        INT32_MAX, plan->n_kernels);
    for (uint32_t i = 0; i < plan->n_migrations; i++) {
        const tio_migration *m = &plan->migrations[i];
        if ((m->tier != TIO_TIER_SSD && m->tier != TIO_TIER_HOST) ||
            (m->kind != TIO_MIGRATION_OFFLOAD && m->kind != TIO_MIGRATION_PREFETCH))
            return tio_fail(-EINVAL, "%s: migration %u of tensor %u has no valid kind and tier",
                            path, i, m->tensor);
    }
    tio_atomic_file af;
    int rc = tio_atomic_open(&af, path);
    if (rc)
        return rc;
    fprintf(af.f, "teraio-plan %d\n", TIO_PLAN_VERSION);
    fprintf(af.f, "kernels %u tensors %u capacity %llu\n", plan->n_kernels, plan->n_tensors,
            (unsigned long long)plan->capacity_bytes);
    for (uint32_t i = 0; i < plan->n_migrations; i++) {
        const tio_migration *m = &plan->migrations[i];
        fprintf(af.f, "%s %u %u %u %s %llu\n",
                m->kind == TIO_MIGRATION_OFFLOAD ? "offload" : "prefetch", m->tensor,
                m->trigger_kernel, m->deadline_kernel, tio_tier_name(m->tier),
                (unsigned long long)m->bytes);
    }
    return tio_atomic_commit(&af);
}

/* ---- reading ------------------------------------------------------------- */

typedef struct {
    const char *origin;
    const char *p, *end;     /* unread input */
    unsigned line;           /* number of the current line, 1-based */
    const char *lp, *lend;   /* unread part of the current line */
} reader;

typedef struct {
    const char *s;
    size_t len;              /* 0: end of line */
} token;

/* Advance to the next line; false at end of input. */
static bool next_line(reader *r)
{
    if (r->p >= r->end)
        return false;
    const char *nl = memchr(r->p, '\n', (size_t)(r->end - r->p));
    const char *stop = nl ? nl : r->end;
    r->lp = r->p;
    r->lend = stop;
    if (r->lend > r->lp && r->lend[-1] == '\r')
        r->lend--;
    r->p = nl ? nl + 1 : r->end;
    r->line++;
    return true;
}

/* Advance to the next line that is neither blank nor a '#' comment. */
static bool next_content_line(reader *r)
{
    while (next_line(r)) {
        const char *s = r->lp;
        while (s < r->lend && (*s == ' ' || *s == '\t'))
            s++;
        if (s < r->lend && *s != '#')
            return true;
    }
    return false;
}

static token next_token(reader *r)
{
    while (r->lp < r->lend && (*r->lp == ' ' || *r->lp == '\t'))
        r->lp++;
    token t = {r->lp, 0};
    while (r->lp < r->lend && *r->lp != ' ' && *r->lp != '\t')
        r->lp++;
    t.len = (size_t)(r->lp - t.s);
    return t;
}

static bool token_is(token t, const char *word)
{
    return t.len == strlen(word) && memcmp(t.s, word, t.len) == 0;
}

/* Record "origin:line: field 'f': expected <what>, found '<tok>'". */
static int field_error(const reader *r, const char *field, const char *what, token t, bool eof)
{
    char found[48];
    if (eof) {
        snprintf(found, sizeof found, "end of file");
    } else if (t.len == 0) {
        snprintf(found, sizeof found, "end of line");
    } else {
        size_t n = t.len < 32 ? t.len : 32, o = 0;
        found[o++] = '\'';
        for (size_t i = 0; i < n; i++) {
            unsigned char c = (unsigned char)t.s[i];
            found[o++] = (c >= 0x20 && c < 0x7f) ? (char)c : '?';
        }
        if (t.len > n) {
            memcpy(found + o, "...", 3);
            o += 3;
        }
        found[o++] = '\'';
        found[o] = '\0';
    }
    return tio_fail(TIO_EPARSE, "%s:%u: field '%s': expected %s, found %s", r->origin,
                    eof ? r->line + 1 : r->line, field, what, found);
}

/* Decimal digits only, no sign, no overflow, value in [lo, hi]. */
static bool parse_u64(token t, uint64_t lo, uint64_t hi, uint64_t *out)
{
    if (t.len == 0 || t.len > 20)
        return false;
    uint64_t v = 0;
    for (size_t i = 0; i < t.len; i++) {
        unsigned d = (unsigned char)t.s[i] - '0';
        if (d > 9 || v > (UINT64_MAX - d) / 10)
            return false;
        v = v * 10 + d;
    }
    if (v < lo || v > hi)
        return false;
    *out = v;
    return true;
}

static int expect_number(reader *r, const char *field, const char *what, uint64_t lo,
                         uint64_t hi, uint64_t *out)
{
    token t = next_token(r);
    if (!parse_u64(t, lo, hi, out))
        return field_error(r, field, what, t, false);
    return 0;
}

static int expect_end(reader *r, const char *after)
{
    token t = next_token(r);
    if (t.len == 0)
        return 0;
    return field_error(r, after, "end of line after it", t, false);
}

static int parse_header(reader *r, tio_plan *plan)
{
    token t = {NULL, 0};
    if (!next_line(r))
        return field_error(r, "magic", "'teraio-plan'", t, true);
    t = next_token(r);
    if (!token_is(t, "teraio-plan"))
        return field_error(r, "magic", "'teraio-plan'", t, false);
    t = next_token(r);
    uint64_t version;
    if (!parse_u64(t, 0, UINT64_MAX, &version))
        return field_error(r, "version", "an unsigned integer", t, false);
    if (version != TIO_PLAN_VERSION)
        return tio_fail(TIO_EVERSION, "%s:%u: plan format version %llu is not supported "
                        "(this build reads version %d)", r->origin, r->line,
                        (unsigned long long)version, TIO_PLAN_VERSION);
    int rc = expect_end(r, "version");
    if (rc)
        return rc;

    static const char *keys[] = {"kernels", "tensors", "capacity"};
    static const char *what[] = {"a kernel count from 1 to 2147483647",
                                 "a tensor count below 2^32",
                                 "a capacity in bytes, at least 1"};
    static const uint64_t lo[] = {1, 0, 1};
    static const uint64_t hi[] = {INT32_MAX, UINT32_MAX, UINT64_MAX};
    uint64_t v[3];
    t = (token){NULL, 0};
    if (!next_content_line(r))
        return field_error(r, keys[0], "'kernels'", t, true);
    for (int i = 0; i < 3; i++) {
        t = next_token(r);
        if (!token_is(t, keys[i])) {
            char quoted[16];
            snprintf(quoted, sizeof quoted, "'%s'", keys[i]);
            return field_error(r, keys[i], quoted, t, false);
        }
        rc = expect_number(r, keys[i], what[i], lo[i], hi[i], &v[i]);
        if (rc)
            return rc;
    }
    plan->n_kernels = (uint32_t)v[0];
    plan->n_tensors = (uint32_t)v[1];
    plan->capacity_bytes = v[2];
    return expect_end(r, "capacity");
}

static int parse_migration(reader *r, const tio_plan *plan, tio_migration *m)
{
    token t = next_token(r);
    if (token_is(t, "offload"))
        m->kind = TIO_MIGRATION_OFFLOAD;
    else if (token_is(t, "prefetch"))
        m->kind = TIO_MIGRATION_PREFETCH;
    else
        return field_error(r, "kind", "'offload' or 'prefetch'", t, false);
    char kernel_what[64];
    snprintf(kernel_what, sizeof kernel_what, "a kernel index below %u", plan->n_kernels);
    uint64_t tensor = 0, trigger = 0, deadline = 0, bytes = 0;
    int rc = expect_number(r, "tensor", "a tensor id below 2^32", 0, UINT32_MAX, &tensor);
    if (!rc)
        rc = expect_number(r, "trigger", kernel_what, 0, plan->n_kernels - 1, &trigger);
    if (!rc)
        rc = expect_number(r, "deadline", kernel_what, 0, plan->n_kernels - 1, &deadline);
    if (rc)
        return rc;
    t = next_token(r);
    if (token_is(t, "ssd"))
        m->tier = TIO_TIER_SSD;
    else if (token_is(t, "host"))
        m->tier = TIO_TIER_HOST;
    else
        return field_error(r, "tier", "'ssd' or 'host'", t, false);
    rc = expect_number(r, "bytes", "a size in bytes, at least 1", 1, UINT64_MAX, &bytes);
    if (rc)
        return rc;
    m->tensor = (uint32_t)tensor;
    m->trigger_kernel = (uint32_t)trigger;
    m->deadline_kernel = (uint32_t)deadline;
    m->bytes = bytes;
    return expect_end(r, "bytes");
}

/* Totals that follow from the migrations alone. */
static void sum_offloads(tio_plan *plan)
{
    plan->bytes_to_ssd = plan->bytes_to_host = 0;
    for (uint32_t i = 0; i < plan->n_migrations; i++) {
        const tio_migration *m = &plan->migrations[i];
        if (m->kind != TIO_MIGRATION_OFFLOAD)
            continue;
        if (m->tier == TIO_TIER_SSD)
            plan->bytes_to_ssd += m->bytes;
        else
            plan->bytes_to_host += m->bytes;
    }
}

int tio_plan_parse(const char *text, size_t len, const char *origin, tio_plan **out)
{
    if (!out || (!text && len))
        return tio_fail(-EINVAL, "tio_plan_parse: text and out are required");
    *out = NULL;
    reader r = {.origin = origin ? origin : "<plan>", .p = text, .end = text + len};
    tio_plan *plan = calloc(1, sizeof *plan);
    if (!plan)
        return tio_fail(-ENOMEM, "%s: out of memory", r.origin);
    int rc = parse_header(&r, plan);
    uint32_t cap = 0;
    while (!rc && next_content_line(&r)) {
        if (plan->n_migrations == UINT32_MAX) {
            rc = tio_fail(TIO_EPARSE, "%s:%u: more than %u migrations", r.origin, r.line,
                          UINT32_MAX - 1);
            break;
        }
        rc = tio_grow((void **)&plan->migrations, &cap, plan->n_migrations + 1,
                      sizeof *plan->migrations);
        if (!rc)
            rc = parse_migration(&r, plan, &plan->migrations[plan->n_migrations]);
        if (!rc)
            plan->n_migrations++;
    }
    if (!rc)
        rc = tio_plan_sort_migrations(plan->migrations, plan->n_migrations);
    if (rc) {
        tio_plan_destroy(plan);
        return rc;
    }
    sum_offloads(plan);
    *out = plan;
    return 0;
}

int tio_plan_load(const char *path, tio_plan **out)
{
    if (!path || !out)
        return tio_fail(-EINVAL, "tio_plan_load: path and out are required");
    *out = NULL;
    char *text;
    size_t len;
    int rc = tio_read_file(path, &text, &len);
    if (rc)
        return rc;
    rc = tio_plan_parse(text, len, path, out);
    free(text);
    return rc;
}

/* ---- checking against a trace -------------------------------------------- */

/* One end of a non-resident interval: the offload's deadline or the
 * prefetch's trigger, at which the tensor's memory is released or retaken. */
typedef struct {
    uint32_t tensor;
    uint32_t kernel;
    uint32_t index;          /* into plan->migrations */
    tio_migration_kind kind;
} edge;

static int cmp_edge(const void *x, const void *y)
{
    const edge *a = x, *b = y;
    if (a->tensor != b->tensor)
        return a->tensor < b->tensor ? -1 : 1;
    if (a->kernel != b->kernel)
        return a->kernel < b->kernel ? -1 : 1;
    return a->index < b->index ? -1 : a->index > b->index;
}

/* Kernel x (in [0, n)) as the first index after a: in (a, a + n]. */
static uint64_t unwrap(uint64_t x, uint64_t a, uint32_t n)
{
    return x > a ? x : x + n;
}

/* Add `delta` to diff[] over the unwrapped range [from, to), to <= from + n.
 * Unsigned wrap-around in diff[] is harmless: every prefix sum is a true
 * byte count below 2^64 (pairs of one tensor never overlap, and the trace
 * keeps its total size below 2^64). */
static void add_range(uint64_t *diff, uint32_t n, uint64_t from, uint64_t to, uint64_t delta)
{
    uint64_t f = from % n, len = to - from;
    if (len == 0)
        return;
    if (f + len <= n) {
        diff[f] += delta;
        diff[f + len] -= delta;
    } else {
        diff[f] += delta;
        diff[n] -= delta;
        diff[0] += delta;
        diff[f + len - n] -= delta;
    }
}

/* Is [off, pre) of tensor t (offload issued at `issue`, prefetch due at
 * `due`) inside one inactive period?  On success the unwrapped kernels are
 * stored relative to that period's last use, and the period's index in
 * *period. */
static bool inside_period(const tio_lifetime *lt, uint32_t t, const tio_migration *o,
                          const tio_migration *p, uint64_t ks[4], uint32_t *period)
{
    uint32_t n = lt->n_kernels, lo = 0, hi = lt->n_periods;
    while (lo < hi) {
        uint32_t mid = lo + (hi - lo) / 2;
        if (lt->periods[mid].tensor < t)
            lo = mid + 1;
        else
            hi = mid;
    }
    for (uint32_t i = lo; i < lt->n_periods && lt->periods[i].tensor == t; i++) {
        uint64_t a = lt->periods[i].last_use, b = lt->periods[i].next_use;
        uint64_t issue = unwrap(o->trigger_kernel, a, n), off = unwrap(o->deadline_kernel, a, n);
        uint64_t pre = unwrap(p->trigger_kernel, a, n), due = unwrap(p->deadline_kernel, a, n);
        if (issue <= off && off < pre && pre <= due && due <= b) {
            ks[0] = issue, ks[1] = off, ks[2] = pre, ks[3] = due;
            *period = i;
            return true;
        }
    }
    return false;
}

static int check_migrations(const tio_plan *plan, const tio_trace *trace)
{
    if (plan->n_kernels != trace->n_kernels)
        return tio_fail(TIO_EPARSE, "plan is for %u kernels, trace has %u", plan->n_kernels,
                        trace->n_kernels);
    for (uint32_t i = 0; i < plan->n_migrations; i++) {
        const tio_migration *m = &plan->migrations[i];
        if (m->tensor >= trace->n_tensors)
            return tio_fail(TIO_EUNKNOWN, "plan names unknown tensor %u (trace has %u tensors)",
                            m->tensor, trace->n_tensors);
        if (m->trigger_kernel >= trace->n_kernels || m->deadline_kernel >= trace->n_kernels)
            return tio_fail(TIO_EUNKNOWN, "migration %u of tensor %u names kernel %u (trace "
                            "has %u kernels)", i, m->tensor,
                            m->trigger_kernel >= trace->n_kernels ? m->trigger_kernel
                                                                  : m->deadline_kernel,
                            trace->n_kernels);
        if ((m->tier != TIO_TIER_SSD && m->tier != TIO_TIER_HOST) ||
            (m->kind != TIO_MIGRATION_OFFLOAD && m->kind != TIO_MIGRATION_PREFETCH))
            return tio_fail(TIO_EPARSE, "migration %u of tensor %u has no valid kind and tier",
                            i, m->tensor);
        if (m->bytes != trace->tensors[m->tensor].bytes)
            return tio_fail(TIO_EPARSE, "plan moves %llu bytes of tensor %u, trace says %llu",
                            (unsigned long long)m->bytes, m->tensor,
                            (unsigned long long)trace->tensors[m->tensor].bytes);
    }
    if (plan->n_tensors != trace->n_tensors)
        return tio_fail(TIO_EPARSE, "plan was built for a trace with %u tensors, this trace "
                        "has %u", plan->n_tensors, trace->n_tensors);
    return 0;
}

/* The kernels one offload/prefetch pair spans, from the offload's issue to
 * the prefetch's deadline, unwrapped relative to its inactive period. */
typedef struct {
    uint32_t period;         /* index into lt->periods */
    uint64_t issue, off, pre, due;
    uint32_t offload, prefetch; /* indices into plan->migrations */
} span;

static int cmp_span(const void *x, const void *y)
{
    const span *a = x, *b = y;
    if (a->period != b->period)
        return a->period < b->period ? -1 : 1;
    if (a->issue != b->issue)
        return a->issue < b->issue ? -1 : 1;
    if (a->due != b->due)
        return a->due < b->due ? -1 : 1;
    return a->offload < b->offload ? -1 : a->offload > b->offload;
}

/* Two pairs of one tensor inside the same inactive period must follow each
 * other: the tensor is back (prefetch due) at a kernel before the one where
 * it is written out again (offload issued).  Otherwise the second offload
 * finds the tensor away or still arriving and the runtime skips it, so the
 * M' derived here would never happen.  (At a shared kernel the runtime
 * issues offloads before prefetches, so the bound is strict.)  Pairs in
 * different periods cannot overlap: a pair lies within (last use, next use]
 * of its period, and the next period starts after that use. */
static int check_spans(const tio_plan *plan, span *s, uint32_t n)
{
    qsort(s, n, sizeof *s, cmp_span);
    for (uint32_t i = 1; i < n; i++) {
        if (s[i].period != s[i - 1].period || s[i - 1].due < s[i].issue)
            continue;
        const tio_migration *p = &plan->migrations[s[i - 1].prefetch];
        const tio_migration *o = &plan->migrations[s[i].offload];
        return tio_fail(TIO_EPARSE, "offload of tensor %u issued at kernel %u overlaps its "
                        "earlier prefetch due at kernel %u (the tensor must be back first)",
                        o->tensor, o->trigger_kernel, p->deadline_kernel);
    }
    return 0;
}

/* The tail period of intermediate tensor t (lifetime.h), or NULL. */
static const tio_inactive_period *tail_of(const tio_lifetime *lt, uint32_t t)
{
    uint32_t lo = 0, hi = lt->n_periods;
    while (lo < hi) { /* the first period of a tensor above t */
        uint32_t mid = lo + (hi - lo) / 2;
        if (lt->periods[mid].tensor <= t)
            lo = mid + 1;
        else
            hi = mid;
    }
    const tio_inactive_period *p = lo ? &lt->periods[lo - 1] : NULL;
    return p && p->tensor == t && p->tail ? p : NULL;
}

/* An offload with no prefetch: it must be the last of an intermediate
 * tensor, inside its tail period, and issued after the prefetch of the
 * tensor's pair before it is due (`after`, the largest prefetch deadline of
 * the tensor, or -1): a pair may lie in the tail period too, and an offload
 * issued while the tensor is away or arriving is skipped by the runtime.
 * Its ranges go to the difference arrays. */
static int lone_offload(const tio_plan *plan, const tio_lifetime *lt, const edge *x,
                        int64_t after, uint64_t *resident, uint64_t *host)
{
    const tio_migration *o = &plan->migrations[x->index];
    const tio_inactive_period *per = tail_of(lt, o->tensor);
    if (!per || o->trigger_kernel <= per->last_use || o->deadline_kernel < o->trigger_kernel ||
        o->deadline_kernel >= per->next_use)
        return tio_fail(TIO_EPARSE, "offload of tensor %u (trigger %u, deadline %u) has no matching "
                        "prefetch, and is no lone offload of a tail period either (an "
                        "intermediate's, issued after its last use, due before its free)",
                        o->tensor, o->trigger_kernel, o->deadline_kernel);
    if ((int64_t)o->trigger_kernel <= after)
        return tio_fail(TIO_EPARSE, "offload of tensor %u issued at kernel %u overlaps its "
                        "earlier prefetch due at kernel %lld (the tensor must be back first)",
                        o->tensor, o->trigger_kernel, (long long)after);
    add_range(resident, plan->n_kernels, o->deadline_kernel, per->next_use, o->bytes);
    if (o->tier == TIO_TIER_HOST)
        add_range(host, plan->n_kernels, o->trigger_kernel, per->next_use, o->bytes);
    return 0;
}

/* Pair the edges of one tensor (e[0..m), sorted by kernel): around the
 * iteration they must alternate offload, prefetch, but for an
 * intermediate's last offload in its tail period, which has none.  Each
 * pair's ranges are added to the difference arrays; `spans` has room for
 * m / 2 pairs. */
static int pair_tensor(const tio_plan *plan, const tio_lifetime *lt, const edge *e, uint32_t m,
                       uint64_t *resident, uint64_t *host, span *spans)
{
    uint32_t n = plan->n_kernels;
    if (m % 2 && e[m - 1].kind == TIO_MIGRATION_OFFLOAD && tail_of(lt, e[m - 1].tensor)) {
        int rc = m > 1 ? pair_tensor(plan, lt, e, m - 1, resident, host, spans) : 0;
        int64_t after = -1;
        for (uint32_t i = 0; i + 1 < m; i++)
            if (e[i].kind == TIO_MIGRATION_PREFETCH &&
                (int64_t)plan->migrations[e[i].index].deadline_kernel > after)
                after = plan->migrations[e[i].index].deadline_kernel;
        return rc ? rc : lone_offload(plan, lt, &e[m - 1], after, resident, host);
    }
    for (uint32_t i = 0; i < m; i++) {
        const edge *x = &e[i], *y = &e[(i + 1) % m];
        if (m == 1 || x->kind == y->kind) {
            if (x->kind == TIO_MIGRATION_OFFLOAD)
                return tio_fail(TIO_EPARSE, "offload of tensor %u (deadline kernel %u) has no "
                                "matching prefetch", x->tensor, x->kernel);
            return tio_fail(TIO_EPARSE, "prefetch of tensor %u (trigger kernel %u) has no "
                            "matching offload", y->tensor, y->kernel);
        }
        if (x->kernel == y->kernel)
            return tio_fail(TIO_EPARSE, "tensor %u is both released and retaken at kernel %u",
                            x->tensor, x->kernel);
    }
    uint32_t first = e[0].kind == TIO_MIGRATION_OFFLOAD ? 0 : 1, n_spans = 0;
    for (uint32_t i = first; i < m + first; i += 2) {
        const tio_migration *o = &plan->migrations[e[i % m].index];
        const tio_migration *p = &plan->migrations[e[(i + 1) % m].index];
        uint64_t ks[4];
        uint32_t period;
        if (o->tier != p->tier)
            return tio_fail(TIO_EPARSE, "offload and prefetch of tensor %u (kernels %u and %u) "
                            "disagree on the tier", o->tensor, o->deadline_kernel,
                            p->trigger_kernel);
        if (!inside_period(lt, o->tensor, o, p, ks, &period))
            return tio_fail(TIO_EPARSE, "tensor %u is not idle from kernel %u (offload issued) "
                            "to kernel %u (prefetch due)", o->tensor, o->trigger_kernel,
                            p->deadline_kernel);
        spans[n_spans++] = (span){period, ks[0], ks[1], ks[2], ks[3], e[i % m].index,
                                  e[(i + 1) % m].index};
    }
    int rc = check_spans(plan, spans, n_spans);
    for (uint32_t i = 0; !rc && i < n_spans; i++) {
        const tio_migration *o = &plan->migrations[spans[i].offload];
        add_range(resident, n, spans[i].off, spans[i].pre, o->bytes);
        if (o->tier == TIO_TIER_HOST)
            add_range(host, n, spans[i].issue, spans[i].due, o->bytes);
    }
    return rc;
}

static int check_pairs(tio_plan *plan, const tio_lifetime *lt)
{
    uint32_t n = plan->n_kernels, nm = plan->n_migrations;
    edge *e = malloc(((size_t)nm + 1) * sizeof *e);
    span *spans = malloc(((size_t)nm / 2 + 1) * sizeof *spans);
    uint64_t *offloaded = calloc((size_t)n + 1, sizeof *offloaded);
    uint64_t *host = calloc((size_t)n + 1, sizeof *host);
    uint64_t *planned = malloc((size_t)n * sizeof *planned);
    int rc = 0;
    if (!e || !spans || !offloaded || !host || !planned) {
        rc = tio_fail(-ENOMEM, "out of memory checking a plan of %u migrations", nm);
        goto out;
    }
    for (uint32_t i = 0; i < nm; i++) {
        const tio_migration *m = &plan->migrations[i];
        e[i] = (edge){m->tensor,
                      m->kind == TIO_MIGRATION_OFFLOAD ? m->deadline_kernel : m->trigger_kernel,
                      i, m->kind};
    }
    qsort(e, nm, sizeof *e, cmp_edge);
    for (uint32_t i = 0, j; !rc && i < nm; i = j) {
        for (j = i + 1; j < nm && e[j].tensor == e[i].tensor; j++)
            ;
        rc = pair_tensor(plan, lt, e + i, j - i, offloaded, host, spans);
    }
    if (rc)
        goto out;
    uint64_t away = 0, parked = 0, peak = 0, peak_host = 0;
    for (uint32_t k = 0; k < n; k++) {
        away += offloaded[k];
        parked += host[k];
        if (away > lt->memory_bytes[k]) {
            rc = tio_fail(TIO_EPARSE, "plan offloads %llu bytes at kernel %u, more than the "
                          "%llu bytes live there", (unsigned long long)away, k,
                          (unsigned long long)lt->memory_bytes[k]);
            goto out;
        }
        planned[k] = lt->memory_bytes[k] - away;
        peak = planned[k] > peak ? planned[k] : peak;
        peak_host = parked > peak_host ? parked : peak_host;
    }
    if (!plan->planned_memory_bytes) {
        plan->planned_memory_bytes = planned;
        planned = NULL;
        plan->planned_peak_bytes = peak;
        plan->peak_host_bytes = peak_host;
        plan->fits = peak <= plan->capacity_bytes;
        sum_offloads(plan);
    }
out:
    free(e);
    free(spans);
    free(offloaded);
    free(host);
    free(planned);
    return rc;
}

int tio_plan_check(tio_plan *plan, const tio_trace *trace, const tio_lifetime *lt)
{
    if (!plan || !trace)
        return tio_fail(-EINVAL, "tio_plan_check: plan and trace are required");
    int rc = check_migrations(plan, trace);
    if (rc)
        return rc;
    tio_lifetime *own = NULL;
    if (!lt) {
        rc = tio_lifetime_analyze(trace, &own);
        if (rc)
            return rc;
        lt = own;
    }
    if (lt->n_kernels != trace->n_kernels || lt->n_tensors != trace->n_tensors)
        rc = tio_fail(-EINVAL, "lifetime analysis (%u kernels, %u tensors) is not of this "
                      "trace (%u kernels, %u tensors)", lt->n_kernels, lt->n_tensors,
                      trace->n_kernels, trace->n_tensors);
    else if (plan->n_kernels > 0)
        rc = check_pairs(plan, lt);
    tio_lifetime_destroy(own);
    return rc;
}
