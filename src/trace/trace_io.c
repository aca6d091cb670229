/*
 * trace/trace_io.c — the trace file, "teraio-trace" versions 1 to 3
 * (docs/formats.md).
 *
 *   teraio-trace 3
 *   model llama3-8b batch 32 seq 2048
 *   counts <n_tensors> <n_kernels> <n_accesses> <n_frees>
 *   tensor <id> <bytes> <kind> <global|intermediate> [name]      (n_tensors lines)
 *   kernel <index> <duration_ns> <name> <r:|w:|rw:><tensor>...   (n_kernels lines)
 *   free <tensor> <kernel>                                       (n_frees lines)
 *
 * Version 2 added the free records, any number of them; version 3 counts
 * them on the counts line and ends in a newline, so a file cut after or
 * inside a free record is refused like one cut anywhere else.  The writer uses version 1 when a
 * trace has no free records (readable by every build), else version 3.
 *
 * Why a hand-written scanner: a paper-scale trace has ~100k kernel lines and
 * ~1M access tokens, and the reader must load it in well under a second.
 * The whole file is read into memory, lines are found with memchr, tokens
 * are delimited by blanks and numbers are converted digit by digit with an
 * overflow check; nothing is copied except names.  The counts line lets the
 * reader allocate every array once, at its final size; the allocation is
 * also capped by what the remaining bytes could possibly hold, so a lying
 * counts line cannot make a small file allocate gigabytes.
 *
 * Strictness: ids must be sequential, counts must match, every tensor must
 * be accessed, a kernel lists a tensor at most once, integers must fit their
 * field.  Every error names "origin:line: field 'x'" and what was expected,
 * so a loaded trace always passes tio_trace_validate.
 */
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>

#include "common/util.h"
#include "teraio/trace.h"
#include "trace/trace_internal.h"

#define TRACE_MAGIC "teraio-trace"

/* ---- scanner ---------------------------------------------------------- */

typedef struct {
    const char *origin;
    const char *next, *end;   /* unread input */
    const char *cur, *eol;    /* cursor in the current line, its end (no \r\n) */
    uint32_t line;            /* 1-based number of the current line */
} scanner;

/* Move to the next physical line.  False at end of input. */
static bool next_line(scanner *s)
{
    if (s->next >= s->end)
        return false;
    const char *nl = memchr(s->next, '\n', (size_t)(s->end - s->next));
    const char *eol = nl ? nl : s->end;
    s->cur = s->next;
    s->next = nl ? nl + 1 : s->end;
    if (eol > s->cur && eol[-1] == '\r')
        eol--;
    s->eol = eol;
    s->line++;
    return true;
}

static void skip_blanks(scanner *s)
{
    while (s->cur < s->eol && (*s->cur == ' ' || *s->cur == '\t'))
        s->cur++;
}

/* Move to the next line that is neither blank nor a '#' comment. */
static bool next_record(scanner *s)
{
    while (next_line(s)) {
        skip_blanks(s);
        if (s->cur < s->eol && *s->cur != '#')
            return true;
    }
    return false;
}

/* The next blank-delimited token of the current line.  False at its end. */
static bool next_token(scanner *s, const char **tok, size_t *len)
{
    skip_blanks(s);
    if (s->cur >= s->eol)
        return false;
    const char *b = s->cur;
    while (s->cur < s->eol && *s->cur != ' ' && *s->cur != '\t')
        s->cur++;
    *tok = b;
    *len = (size_t)(s->cur - b);
    return true;
}

static bool token_is(const char *tok, size_t len, const char *word)
{
    size_t n = strlen(word);
    return len == n && memcmp(tok, word, n) == 0;
}

/* Decimal digits only, no sign; false if empty, not a number or > max. */
static bool to_uint(const char *t, size_t len, uint64_t max, uint64_t *out)
{
    if (len == 0)
        return false;
    uint64_t v = 0;
    for (size_t i = 0; i < len; i++) {
        unsigned d = (unsigned)((unsigned char)t[i] - '0');
        if (d > 9 || v > (max - d) / 10)
            return false;
        v = v * 10 + d;
    }
    *out = v;
    return true;
}

static bool all_digits(const char *t, size_t len)
{
    for (size_t i = 0; i < len; i++)
        if ((unsigned)((unsigned char)t[i] - '0') > 9)
            return false;
    return len > 0;
}

/* ---- errors ----------------------------------------------------------- */

/* A token as it appears in a message: at most 40 bytes, unprintable bytes
 * shown as '?'. */
static const char *shown(const char *tok, size_t len, char buf[64])
{
    size_t n = len < 40 ? len : 40, j = 0;
    for (size_t i = 0; i < n; i++) {
        unsigned char c = (unsigned char)tok[i];
        buf[j++] = (c < 0x20 || c == 0x7f || c == '\'') ? '?' : (char)c;
    }
    if (n < len) {
        memcpy(buf + j, "...", 3);
        j += 3;
    }
    buf[j] = '\0';
    return buf;
}

/* "origin:line: field 'field': <message>". */
static int fail_at(const scanner *s, int code, uint32_t line, const char *field,
                   const char *fmt, ...) __attribute__((format(printf, 5, 6)));
static int fail_at(const scanner *s, int code, uint32_t line, const char *field,
                   const char *fmt, ...)
{
    char msg[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    return tio_fail(code, "%s:%u: field '%s': %s", s->origin, line, field, msg);
}

/* "...: expected <expected>, got 'token'" (or "got end of line" if tok is NULL). */
static int fail_got(const scanner *s, int code, const char *field, const char *expected,
                    const char *tok, size_t len)
{
    char buf[64];
    if (!tok)
        return fail_at(s, code, s->line, field, "expected %s, got end of line", expected);
    return fail_at(s, code, s->line, field, "expected %s, got '%s'", expected,
                   shown(tok, len, buf));
}

static int fail_eof(const scanner *s, const char *field, const char *expected)
{
    return fail_at(s, TIO_EPARSE, s->line + 1, field, "expected %s, got end of file", expected);
}

/* Read an unsigned integer token no larger than `max` into *out. */
static int need_uint(scanner *s, const char *field, uint64_t max, uint64_t *out)
{
    const char *tok = NULL;
    size_t len = 0;
    if (!next_token(s, &tok, &len))
        return fail_got(s, TIO_EPARSE, field, "an unsigned integer", NULL, 0);
    if (to_uint(tok, len, max, out))
        return 0;
    if (all_digits(tok, len))
        return fail_got(s, TIO_EPARSE, field,
                        max == UINT64_MAX ? "an unsigned integer below 2^64"
                                          : "an unsigned integer below 2^32",
                        tok, len);
    return fail_got(s, TIO_EPARSE, field, "an unsigned integer", tok, len);
}

static int need_end_of_line(scanner *s, const char *field)
{
    const char *tok = NULL;
    size_t len = 0;
    if (next_token(s, &tok, &len))
        return fail_got(s, TIO_EPARSE, field, "end of line", tok, len);
    return 0;
}

/* ---- parser ----------------------------------------------------------- */

typedef struct {
    scanner s;
    tio_trace *trace;
    uint32_t n_tensors, n_kernels, n_accesses; /* declared on the counts line */
    uint32_t n_frees, seen_frees;              /* declared (version 3) and read */
    uint32_t counts_line;
    uint32_t *tensor_line; /* [n_tensors] line of each tensor record */
    uint32_t *last_kernel; /* [n_tensors] last kernel accessing it, UINT32_MAX: none */
    uint64_t total_bytes, total_ns;
    uint32_t version;      /* of the file being read */
} parser;

static char *copy_token(const char *tok, size_t len)
{
    char *p = malloc(len + 1);
    if (p) {
        memcpy(p, tok, len);
        p[len] = '\0';
    }
    return p;
}

#define HEADERS "'" TRACE_MAGIC " <version>' (1 to 3)"

static int parse_header(parser *p)
{
    scanner *s = &p->s;
    const char *tok = NULL;
    size_t len = 0;
    uint64_t version;
    if (!next_line(s))
        return fail_eof(s, "header", HEADERS);
    if (!next_token(s, &tok, &len) || !token_is(tok, len, TRACE_MAGIC))
        return fail_got(s, TIO_EPARSE, "header", HEADERS, tok, len);
    int rc = need_uint(s, "version", UINT32_MAX, &version);
    if (rc)
        return rc;
    if (version < 1 || version > TIO_TRACE_VERSION)
        return fail_at(s, TIO_EVERSION, s->line, "version",
                       "expected 1 to %d (the versions this build reads), got '%llu'",
                       TIO_TRACE_VERSION, (unsigned long long)version);
    p->version = (uint32_t)version;
    return need_end_of_line(s, "header");
}

#define COUNTS "'counts <n_tensors> <n_kernels> <n_accesses>'"
#define COUNTS_V3 "'counts <n_tensors> <n_kernels> <n_accesses> <n_frees>'"

/* Optional "model <text>" line, then "counts <tensors> <kernels> <accesses>"
 * (version 3: and "<frees>"). */
static int parse_preamble(parser *p)
{
    scanner *s = &p->s;
    const char *tok = NULL;
    size_t len = 0;
    if (!next_record(s))
        return fail_eof(s, "counts", p->version >= 3 ? COUNTS_V3 : COUNTS);
    next_token(s, &tok, &len);
    if (token_is(tok, len, "model")) {
        /* The text is the rest of the line after one separating blank. */
        if (s->cur < s->eol)
            s->cur++;
        size_t n = (size_t)(s->eol - s->cur);
        if (!tio_trace_model_ok(s->cur, n))
            return fail_at(s, TIO_EPARSE, s->line, "model",
                           "expected text without control characters");
        if (!(p->trace->model = copy_token(s->cur, n)))
            return tio_fail(-ENOMEM, "%s: out of memory", s->origin);
        if (!next_record(s))
            return fail_eof(s, "counts", p->version >= 3 ? COUNTS_V3 : COUNTS);
        next_token(s, &tok, &len);
    }
    if (!token_is(tok, len, "counts"))
        return fail_got(s, TIO_EPARSE, "record", "'counts'", tok, len);
    p->counts_line = s->line;
    uint64_t nt = 0, nk = 0, na = 0;
    int rc = need_uint(s, "n_tensors", UINT32_MAX, &nt);
    if (!rc)
        rc = need_uint(s, "n_kernels", UINT32_MAX, &nk);
    if (!rc && nk > TIO_TRACE_MAX_KERNELS)
        rc = fail_at(s, TIO_EPARSE, s->line, "n_kernels", "expected at most %u, got '%llu'",
                     TIO_TRACE_MAX_KERNELS, (unsigned long long)nk);
    if (!rc)
        rc = need_uint(s, "n_accesses", UINT32_MAX, &na);
    uint64_t nf = 0;
    if (!rc && p->version >= 3)
        rc = need_uint(s, "n_frees", UINT32_MAX, &nf);
    p->n_frees = (uint32_t)nf;
    if (!rc)
        rc = need_end_of_line(s, "counts");
    p->n_tensors = (uint32_t)nt;
    p->n_kernels = (uint32_t)nk;
    p->n_accesses = (uint32_t)na;
    return rc;
}

static uint32_t min_u32(uint32_t a, uint64_t b) { return a < b ? a : (uint32_t)b; }

/* Allocate every array at the declared size, but never more than the rest
 * of the input could hold: a tensor line takes at least 16 bytes, a kernel
 * line 8 and an access 3 (so a truncated or lying file cannot make us
 * allocate gigabytes; its records run out first and the count check fails). */
static int allocate(parser *p)
{
    tio_trace *t = p->trace;
    uint64_t rest = (uint64_t)(p->s.end - p->s.next);
    uint32_t ct = min_u32(p->n_tensors, rest / 16 + 1);
    uint32_t ck = min_u32(p->n_kernels, rest / 8 + 1);
    uint32_t ca = min_u32(p->n_accesses, rest / 3 + 1);
    t->tensors = malloc((size_t)(ct ? ct : 1) * sizeof *t->tensors);
    t->kernels = malloc((size_t)(ck ? ck : 1) * sizeof *t->kernels);
    t->accesses = malloc((size_t)(ca ? ca : 1) * sizeof *t->accesses);
    p->tensor_line = malloc((size_t)(ct ? ct : 1) * sizeof *p->tensor_line);
    p->last_kernel = malloc((size_t)(ct ? ct : 1) * sizeof *p->last_kernel);
    if (!t->tensors || !t->kernels || !t->accesses || !p->tensor_line || !p->last_kernel)
        return tio_fail(-ENOMEM, "%s: out of memory for %u tensors, %u kernels, %u accesses",
                        p->s.origin, p->n_tensors, p->n_kernels, p->n_accesses);
    t->cap_tensors = ct ? ct : 1;
    t->cap_kernels = ck ? ck : 1;
    t->cap_accesses = ca ? ca : 1;
    return 0;
}

static int parse_kind(scanner *s, tio_tensor_kind *kind)
{
    const char *tok = NULL;
    size_t len = 0;
    if (next_token(s, &tok, &len))
        for (int k = TIO_KIND_PARAMETER; k <= TIO_KIND_TEMPORARY; k++)
            if (token_is(tok, len, tio_tensor_kind_name((tio_tensor_kind)k))) {
                *kind = (tio_tensor_kind)k;
                return 0;
            }
    return fail_got(s, TIO_EPARSE, "kind",
                    "one of parameter, gradient, optimizer_state, activation, temporary", tok,
                    len);
}

/* tensor <id> <bytes> <kind> <global|intermediate> [name] */
static int parse_tensor(parser *p, uint32_t i)
{
    scanner *s = &p->s;
    tio_trace *t = p->trace;
    const char *tok = NULL;
    size_t len = 0;
    char expected[64];
    snprintf(expected, sizeof expected, "'tensor' (tensor %u of %u)", i, p->n_tensors);
    if (!next_record(s))
        return fail_eof(s, "tensor", expected);
    if (!next_token(s, &tok, &len) || !token_is(tok, len, "tensor"))
        return fail_got(s, TIO_EPARSE, "record", expected, tok, len);
    uint64_t id, bytes;
    int rc = need_uint(s, "id", UINT32_MAX, &id);
    if (rc)
        return rc;
    if (id != i) {
        snprintf(expected, sizeof expected, "%u (ids are sequential)", i);
        return fail_at(s, TIO_EPARSE, s->line, "id", "expected %s, got '%llu'", expected,
                       (unsigned long long)id);
    }
    if ((rc = need_uint(s, "bytes", UINT64_MAX, &bytes)))
        return rc;
    if (bytes == 0)
        return fail_at(s, TIO_EPARSE, s->line, "bytes", "expected a size > 0, got '0'");
    if (__builtin_add_overflow(p->total_bytes, bytes, &p->total_bytes))
        return fail_at(s, TIO_EPARSE, s->line, "bytes",
                       "expected tensor sizes summing below 2^64, got '%llu'",
                       (unsigned long long)bytes);
    tio_tensor_kind kind = TIO_KIND_PARAMETER;
    if ((rc = parse_kind(s, &kind)))
        return rc;
    bool global;
    tok = NULL;
    if (next_token(s, &tok, &len) && token_is(tok, len, "global"))
        global = true;
    else if (tok && token_is(tok, len, "intermediate"))
        global = false;
    else
        return fail_got(s, TIO_EPARSE, "scope", "'global' or 'intermediate'", tok, len);
    char *name = NULL;
    if (next_token(s, &tok, &len)) {
        if (!tio_trace_name_ok(tok, len))
            return fail_got(s, TIO_EPARSE, "name", "a name without control characters", tok,
                            len);
        if ((rc = need_end_of_line(s, "tensor")))
            return rc;
        if (!(name = copy_token(tok, len)))
            return tio_fail(-ENOMEM, "%s: out of memory", s->origin);
    }
    t->tensors[i] = (tio_trace_tensor){.id = i, .bytes = bytes, .kind = kind, .global = global,
                                       .name = name, .free_kernel = 0};
    t->n_tensors = i + 1;
    p->tensor_line[i] = s->line;
    p->last_kernel[i] = UINT32_MAX;
    return 0;
}

/* One access token: r:<id>, w:<id> or rw:<id>. */
static int parse_access(parser *p, uint32_t k, const char *tok, size_t len)
{
    scanner *s = &p->s;
    tio_trace *t = p->trace;
    uint8_t mode;
    size_t skip;
    if (len > 2 && tok[0] == 'r' && tok[1] == ':')
        mode = TIO_ACCESS_READ, skip = 2;
    else if (len > 2 && tok[0] == 'w' && tok[1] == ':')
        mode = TIO_ACCESS_WRITE, skip = 2;
    else if (len > 3 && tok[0] == 'r' && tok[1] == 'w' && tok[2] == ':')
        mode = TIO_ACCESS_READ | TIO_ACCESS_WRITE, skip = 3;
    else
        return fail_got(s, TIO_EPARSE, "access", "r:<tensor>, w:<tensor> or rw:<tensor>", tok,
                        len);
    uint64_t id;
    if (!to_uint(tok + skip, len - skip, UINT32_MAX, &id))
        return fail_got(s, TIO_EPARSE, "access", "an unsigned integer tensor id", tok, len);
    if (id >= p->n_tensors) {
        char expected[64];
        snprintf(expected, sizeof expected, "a tensor id below %u", p->n_tensors);
        return fail_got(s, TIO_EPARSE, "access", expected, tok, len);
    }
    if (p->last_kernel[id] == k)
        return fail_got(s, TIO_EPARSE, "access", "each tensor at most once per kernel", tok, len);
    if (t->n_accesses == p->n_accesses) {
        char expected[80];
        snprintf(expected, sizeof expected, "at most %u accesses in all (counts line %u)",
                 p->n_accesses, p->counts_line);
        return fail_got(s, TIO_EPARSE, "access", expected, tok, len);
    }
    p->last_kernel[id] = k;
    t->accesses[t->n_accesses++] = (tio_trace_access){.tensor = (uint32_t)id, .mode = mode};
    t->kernels[k].n_accesses++;
    return 0;
}

/* kernel <index> <duration_ns> <name> <access>... */
static int parse_kernel(parser *p, uint32_t k)
{
    scanner *s = &p->s;
    tio_trace *t = p->trace;
    const char *tok = NULL;
    size_t len = 0;
    char expected[64];
    snprintf(expected, sizeof expected, "'kernel' (kernel %u of %u)", k, p->n_kernels);
    if (!next_record(s))
        return fail_eof(s, "kernel", expected);
    if (!next_token(s, &tok, &len) || !token_is(tok, len, "kernel"))
        return fail_got(s, TIO_EPARSE, "record", expected, tok, len);
    uint64_t index, duration;
    int rc = need_uint(s, "index", UINT32_MAX, &index);
    if (rc)
        return rc;
    if (index != k)
        return fail_at(s, TIO_EPARSE, s->line, "index",
                       "expected %u (indices are sequential), got '%llu'", k,
                       (unsigned long long)index);
    if ((rc = need_uint(s, "duration_ns", UINT64_MAX, &duration)))
        return rc;
    if (__builtin_add_overflow(p->total_ns, duration, &p->total_ns))
        return fail_at(s, TIO_EPARSE, s->line, "duration_ns",
                       "expected durations summing below 2^64, got '%llu'",
                       (unsigned long long)duration);
    tok = NULL;
    if (!next_token(s, &tok, &len) || !tio_trace_name_ok(tok, len))
        return fail_got(s, TIO_EPARSE, "name", "a kernel name without control characters", tok,
                        len);
    char *name = copy_token(tok, len);
    if (!name)
        return tio_fail(-ENOMEM, "%s: out of memory", s->origin);
    t->kernels[k] = (tio_trace_kernel){.name = name, .duration_ns = duration,
                                       .first_access = t->n_accesses, .n_accesses = 0};
    t->n_kernels = k + 1;
    while (next_token(s, &tok, &len))
        if ((rc = parse_access(p, k, tok, len)))
            return rc;
    return 0;
}

/* free <tensor> <kernel>, the current line's first token already read. */
static int parse_free(parser *p)
{
    scanner *s = &p->s;
    tio_trace *t = p->trace;
    uint64_t id, kernel;
    int rc = need_uint(s, "tensor", UINT32_MAX, &id);
    if (rc)
        return rc;
    if (id >= p->n_tensors)
        return fail_at(s, TIO_EPARSE, s->line, "tensor", "expected a tensor id below %u, got '%llu'",
                       p->n_tensors, (unsigned long long)id);
    if (t->tensors[id].global)
        return fail_at(s, TIO_EPARSE, s->line, "tensor",
                       "expected an intermediate tensor, tensor %llu is global",
                       (unsigned long long)id);
    if (t->tensors[id].free_kernel)
        return fail_at(s, TIO_EPARSE, s->line, "tensor",
                       "expected one free record per tensor, tensor %llu has two",
                       (unsigned long long)id);
    if ((rc = need_uint(s, "kernel", UINT32_MAX, &kernel)))
        return rc;
    uint32_t last = p->last_kernel[id];
    if (last == UINT32_MAX)
        return fail_at(s, TIO_EPARSE, p->tensor_line[id], "id",
                       "tensor %llu is never accessed by any kernel", (unsigned long long)id);
    if (kernel <= last || kernel > p->n_kernels)
        return fail_at(s, TIO_EPARSE, s->line, "kernel",
                       "expected a kernel in (%u, %u] (after the tensor's last access), got '%llu'",
                       last, p->n_kernels, (unsigned long long)kernel);
    t->tensors[id].free_kernel = (uint32_t)kernel;
    return need_end_of_line(s, "free");
}

/* After the last kernel: free records (version 2) and comments; counts and
 * uses add up. */
static int parse_end(parser *p)
{
    scanner *s = &p->s;
    const char *tok = NULL;
    size_t len = 0;
    while (next_record(s)) {
        tok = NULL;
        next_token(s, &tok, &len);
        if (p->version < 2 || !token_is(tok, len, "free"))
            return fail_got(s, TIO_EPARSE, "record",
                            p->version < 2 ? "end of file after the last kernel"
                                           : "'free' or end of file after the last kernel",
                            tok, len);
        int rc = parse_free(p);
        if (rc)
            return rc;
        p->seen_frees++;
    }
    if (p->version >= 3 && s->end[-1] != '\n')
        return fail_at(s, TIO_EPARSE, s->line, "end",
                       "expected a newline at the end of the file (a version 3 file ends in "
                       "one; this one may be cut short)");
    if (p->version >= 3 && p->seen_frees != p->n_frees)
        return fail_at(s, TIO_EPARSE, p->counts_line, "n_frees",
                       "expected %u (the free records the file has), got '%u'", p->seen_frees,
                       p->n_frees);
    if (p->trace->n_accesses != p->n_accesses)
        return fail_at(s, TIO_EPARSE, p->counts_line, "n_accesses",
                       "expected %u (the accesses the kernels list), got '%u'",
                       p->trace->n_accesses, p->n_accesses);
    for (uint32_t i = 0; i < p->n_tensors; i++)
        if (p->last_kernel[i] == UINT32_MAX)
            return fail_at(s, TIO_EPARSE, p->tensor_line[i], "id",
                           "tensor %u is never accessed by any kernel", i);
    return 0;
}

int tio_trace_parse(const char *text, size_t len, const char *origin, tio_trace **out)
{
    if (!out || (!text && len))
        return tio_fail(-EINVAL, "tio_trace_parse: NULL argument");
    *out = NULL;
    parser p = {.s = {.origin = origin ? origin : "<memory>", .next = text, .end = text + len}};
    if (!(p.trace = calloc(1, sizeof *p.trace)))
        return tio_fail(-ENOMEM, "%s: out of memory", p.s.origin);
    int rc = parse_header(&p);
    if (!rc)
        rc = parse_preamble(&p);
    if (!rc)
        rc = allocate(&p);
    for (uint32_t i = 0; !rc && i < p.n_tensors; i++)
        rc = parse_tensor(&p, i);
    for (uint32_t k = 0; !rc && k < p.n_kernels; k++)
        rc = parse_kernel(&p, k);
    if (!rc)
        rc = parse_end(&p);
    free(p.tensor_line);
    free(p.last_kernel);
    if (rc) {
        tio_trace_destroy(p.trace);
        return rc;
    }
    *out = p.trace;
    return 0;
}

int tio_trace_load(const char *path, tio_trace **out)
{
    if (!path || !out)
        return tio_fail(-EINVAL, "tio_trace_load: NULL argument");
    *out = NULL;
    char *text;
    size_t len;
    int rc = tio_read_file(path, &text, &len);
    if (rc)
        return rc;
    rc = tio_trace_parse(text, len, path, out);
    free(text);
    return rc;
}

/* ---- writer ----------------------------------------------------------- */

/* Output is assembled in a 64 KiB buffer with a hand-rolled integer
 * formatter: fprintf per access token would dominate the save time of a
 * million-access trace.  Write errors stick in the FILE and are caught by
 * tio_atomic_commit. */
typedef struct {
    FILE *f;
    size_t n;
    char buf[1 << 16];
} writer;

static void put_flush(writer *w)
{
    if (w->n)
        fwrite(w->buf, 1, w->n, w->f);
    w->n = 0;
}

static void put_mem(writer *w, const char *s, size_t n)
{
    if (n > sizeof w->buf - w->n) {
        put_flush(w);
        if (n > sizeof w->buf) {
            fwrite(s, 1, n, w->f);
            return;
        }
    }
    memcpy(w->buf + w->n, s, n);
    w->n += n;
}

static void put_str(writer *w, const char *s) { put_mem(w, s, strlen(s)); }

static void put_u64(writer *w, uint64_t v)
{
    char tmp[20];
    int i = 20;
    do {
        tmp[--i] = (char)('0' + v % 10);
        v /= 10;
    } while (v);
    put_mem(w, tmp + i, (size_t)(20 - i));
}

static void write_trace(writer *w, const tio_trace *t)
{
    uint32_t n_frees = 0;
    for (uint32_t i = 0; i < t->n_tensors; i++)
        n_frees += t->tensors[i].free_kernel != 0;
    bool any_free = n_frees > 0;
    put_str(w, any_free ? TRACE_MAGIC " 3\n" : TRACE_MAGIC " 1\n");
    if (t->model) {
        put_str(w, "model ");
        put_str(w, t->model);
        put_str(w, "\n");
    }
    put_str(w, "counts ");
    put_u64(w, t->n_tensors);
    put_str(w, " ");
    put_u64(w, t->n_kernels);
    put_str(w, " ");
    put_u64(w, t->n_accesses);
    if (any_free) {
        put_str(w, " ");
        put_u64(w, n_frees);
    }
    put_str(w, "\n# tensor <id> <bytes> <kind> <global|intermediate> [name]\n");
    for (uint32_t i = 0; i < t->n_tensors; i++) {
        const tio_trace_tensor *ts = &t->tensors[i];
        put_str(w, "tensor ");
        put_u64(w, i);
        put_str(w, " ");
        put_u64(w, ts->bytes);
        put_str(w, " ");
        put_str(w, tio_tensor_kind_name(ts->kind));
        put_str(w, ts->global ? " global" : " intermediate");
        if (ts->name) {
            put_str(w, " ");
            put_str(w, ts->name);
        }
        put_str(w, "\n");
    }
    put_str(w, "# kernel <index> <duration_ns> <name> <r|w|rw>:<tensor>...\n");
    static const char *const mode_prefix[] = {"", " r:", " w:", " rw:"};
    for (uint32_t k = 0; k < t->n_kernels; k++) {
        const tio_trace_kernel *kern = &t->kernels[k];
        put_str(w, "kernel ");
        put_u64(w, k);
        put_str(w, " ");
        put_u64(w, kern->duration_ns);
        put_str(w, " ");
        put_str(w, kern->name);
        const tio_trace_access *a = t->accesses + kern->first_access;
        for (uint32_t i = 0; i < kern->n_accesses; i++) {
            put_str(w, mode_prefix[a[i].mode]);
            put_u64(w, a[i].tensor);
        }
        put_str(w, "\n");
    }
    if (any_free)
        put_str(w, "# free <tensor> <kernel>: freed before that kernel\n");
    for (uint32_t i = 0; i < t->n_tensors; i++) {
        if (!t->tensors[i].free_kernel)
            continue;
        put_str(w, "free ");
        put_u64(w, i);
        put_str(w, " ");
        put_u64(w, t->tensors[i].free_kernel);
        put_str(w, "\n");
    }
    put_flush(w);
}

int tio_trace_save(const tio_trace *trace, const char *path)
{
    if (!trace || !path)
        return tio_fail(-EINVAL, "tio_trace_save: NULL argument");
    int rc = tio_trace_validate(trace);
    if (rc)
        return rc;
    writer *w = malloc(sizeof *w);
    if (!w)
        return tio_fail(-ENOMEM, "%s: out of memory", path);
    tio_atomic_file af;
    if ((rc = tio_atomic_open(&af, path))) {
        free(w);
        return rc;
    }
    w->f = af.f;
    w->n = 0;
    write_trace(w, trace);
    free(w);
    return tio_atomic_commit(&af);
}
