/*
 * data/jsonl.c — JSONL files: text extraction from a line, streaming
 * decompression (.gz via zlib, .zst via libzstd) through a fixed buffer, and
 * the JSONL format's operations: counting lines and cutting the file into
 * windows of about TIO_JSONL_WINDOW_BYTES when it is opened, and decoding
 * one window (its lines read, their text tokenized) for a reader.  Memory is
 * bounded by the window and the longest line (max_line_bytes), never by the
 * decompressed size of the file.
 *
 * The JSON reader is deliberately minimal: it walks one line's top-level
 * object, skips every value it does not need (nested objects and arrays,
 * numbers, literals, strings) and unescapes only the wanted string field
 * (RFC 8259 escapes, \uXXXX with surrogate pairs to UTF-8).  It validates the
 * structure it walks, so a malformed line is an error with the column.
 */
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "common/util.h"
#include "data/data_internal.h"
#include "teraio_config.h"

#if TIO_HAVE_ZLIB
#include <zlib.h>
#endif
#if TIO_HAVE_ZSTD
#include <zstd.h>
#endif

typedef struct {
    const char *s;
    size_t n, i;
    const char *where;
} jcur;

static int jerr(const jcur *c, const char *what)
{
    return tio_fail(TIO_EPARSE, "%s: column %zu: %s", c->where, c->i + 1, what);
}

static void jws(jcur *c)
{
    while (c->i < c->n && (c->s[c->i] == ' ' || c->s[c->i] == '\t' || c->s[c->i] == '\r' ||
                           c->s[c->i] == '\n'))
        c->i++;
}

static int hex4(const jcur *c, size_t at, uint32_t *v)
{
    if (at + 4 > c->n)
        return -1;
    *v = 0;
    for (int k = 0; k < 4; k++) {
        char ch = c->s[at + k];
        int d = ch >= '0' && ch <= '9' ? ch - '0' : ch >= 'a' && ch <= 'f' ? ch - 'a' + 10
              : ch >= 'A' && ch <= 'F' ? ch - 'A' + 10 : -1;
        if (d < 0)
            return -1;
        *v = *v * 16 + (uint32_t)d;
    }
    return 0;
}

static size_t put_utf8(char *o, uint32_t cp)
{
    if (cp < 0x80) {
        o[0] = (char)cp;
        return 1;
    }
    if (cp < 0x800) {
        o[0] = (char)(0xC0 | (cp >> 6));
        o[1] = (char)(0x80 | (cp & 0x3F));
        return 2;
    }
    if (cp < 0x10000) {
        o[0] = (char)(0xE0 | (cp >> 12));
        o[1] = (char)(0x80 | ((cp >> 6) & 0x3F));
        o[2] = (char)(0x80 | (cp & 0x3F));
        return 3;
    }
    o[0] = (char)(0xF0 | (cp >> 18));
    o[1] = (char)(0x80 | ((cp >> 12) & 0x3F));
    o[2] = (char)(0x80 | ((cp >> 6) & 0x3F));
    o[3] = (char)(0x80 | (cp & 0x3F));
    return 4;
}

/* Parse a string at c->i (the opening quote).  With `out` non-NULL, write the
 * unescaped bytes there (room for the raw length suffices: no escape grows). */
static int jstring(jcur *c, char *out, size_t *out_len)
{
    if (c->i >= c->n || c->s[c->i] != '"')
        return jerr(c, "expected a string");
    c->i++;
    size_t o = 0;
    while (c->i < c->n) {
        unsigned char ch = (unsigned char)c->s[c->i];
        if (ch == '"') {
            c->i++;
            if (out_len)
                *out_len = o;
            return 0;
        }
        if (ch < 0x20)
            return jerr(c, "control character in a string");
        if (ch != '\\') {
            if (out)
                out[o] = (char)ch;
            o++;
            c->i++;
            continue;
        }
        if (c->i + 1 >= c->n)
            break;
        char e = c->s[c->i + 1];
        const char *simple = strchr("\"\\/bfnrt", e);
        if (e && simple) {
            static const char map[] = "\"\\/\b\f\n\r\t";
            if (out)
                out[o] = map[simple - "\"\\/bfnrt"];
            o++;
            c->i += 2;
            continue;
        }
        if (e != 'u')
            return jerr(c, "bad escape");
        uint32_t cp;
        if (hex4(c, c->i + 2, &cp) != 0)
            return jerr(c, "bad \\u escape");
        c->i += 6;
        if (cp >= 0xD800 && cp <= 0xDBFF) {
            uint32_t lo;
            if (c->i + 1 < c->n && c->s[c->i] == '\\' && c->s[c->i + 1] == 'u' &&
                hex4(c, c->i + 2, &lo) == 0 && lo >= 0xDC00 && lo <= 0xDFFF) {
                cp = 0x10000 + ((cp - 0xD800) << 10) + (lo - 0xDC00);
                c->i += 6;
            } else {
                cp = 0xFFFD; /* lone high surrogate */
            }
        } else if (cp >= 0xDC00 && cp <= 0xDFFF) {
            cp = 0xFFFD;
        }
        char tmp[4];
        size_t k = put_utf8(tmp, cp);
        if (out)
            memcpy(out + o, tmp, k);
        o += k;
    }
    return jerr(c, "unterminated string");
}

static int jvalue(jcur *c, int depth);

static int jcontainer(jcur *c, int depth, char close)
{
    c->i++;
    jws(c);
    if (c->i < c->n && c->s[c->i] == close) {
        c->i++;
        return 0;
    }
    for (;;) {
        jws(c);
        if (close == '}') {
            int rc = jstring(c, NULL, NULL);
            if (rc)
                return rc;
            jws(c);
            if (c->i >= c->n || c->s[c->i] != ':')
                return jerr(c, "expected ':'");
            c->i++;
        }
        int rc = jvalue(c, depth + 1);
        if (rc)
            return rc;
        jws(c);
        if (c->i < c->n && c->s[c->i] == ',') {
            c->i++;
            continue;
        }
        if (c->i < c->n && c->s[c->i] == close) {
            c->i++;
            return 0;
        }
        return jerr(c, close == '}' ? "expected ',' or '}'" : "expected ',' or ']'");
    }
}

static int jvalue(jcur *c, int depth)
{
    if (depth > 64)
        return jerr(c, "nesting deeper than 64");
    jws(c);
    if (c->i >= c->n)
        return jerr(c, "expected a value");
    char ch = c->s[c->i];
    if (ch == '"')
        return jstring(c, NULL, NULL);
    if (ch == '{')
        return jcontainer(c, depth, '}');
    if (ch == '[')
        return jcontainer(c, depth, ']');
    static const char *lits[] = {"true", "false", "null"};
    for (int k = 0; k < 3; k++) {
        size_t l = strlen(lits[k]);
        if (c->n - c->i >= l && !memcmp(c->s + c->i, lits[k], l)) {
            c->i += l;
            return 0;
        }
    }
    size_t start = c->i;
    if (c->s[c->i] == '-')
        c->i++;
    size_t digits = 0;
    while (c->i < c->n && ((c->s[c->i] >= '0' && c->s[c->i] <= '9') || c->s[c->i] == '.' ||
                           c->s[c->i] == 'e' || c->s[c->i] == 'E' || c->s[c->i] == '+' ||
                           c->s[c->i] == '-')) {
        digits += c->s[c->i] >= '0' && c->s[c->i] <= '9';
        c->i++;
    }
    if (!digits) {
        c->i = start;
        return jerr(c, "expected a value");
    }
    return 0;
}

int tio_jsonl_text(const char *line, size_t len, const char *field, const char *where,
                   char **out, size_t *out_len)
{
    *out = NULL;
    *out_len = 0;
    jcur c = {line, len, 0, where};
    jws(&c);
    if (c.i >= c.n || c.s[c.i] != '{')
        return jerr(&c, "expected '{'");
    c.i++;
    size_t flen = strlen(field);
    bool found = false;
    jws(&c);
    if (c.i < c.n && c.s[c.i] == '}') {
        c.i++;
    } else {
        for (;;) {
            jws(&c);
            size_t kstart = c.i;
            int rc = jstring(&c, NULL, NULL);
            if (rc)
                goto fail;
            /* Compare the raw key: field names with escapes never match. */
            bool is_field = c.i - kstart - 2 == flen && !memcmp(line + kstart + 1, field, flen);
            jws(&c);
            if (c.i >= c.n || c.s[c.i] != ':') {
                rc = jerr(&c, "expected ':'");
                goto fail;
            }
            c.i++;
            jws(&c);
            if (is_field && !found) {
                if (c.i >= c.n || c.s[c.i] != '"') {
                    rc = tio_fail(TIO_EPARSE, "%s: column %zu: field '%s' is not a string", where,
                                  c.i + 1, field);
                    goto fail;
                }
                char *buf = malloc(len + 1);
                if (!buf)
                    return tio_fail(-ENOMEM, "%s: out of memory", where);
                size_t n = 0;
                if ((rc = jstring(&c, buf, &n)) != 0) {
                    free(buf);
                    goto fail;
                }
                buf[n] = '\0';
                *out = buf;
                *out_len = n;
                found = true;
            } else if ((rc = jvalue(&c, 1)) != 0) {
                goto fail;
            }
            jws(&c);
            if (c.i < c.n && c.s[c.i] == ',') {
                c.i++;
                continue;
            }
            if (c.i < c.n && c.s[c.i] == '}') {
                c.i++;
                break;
            }
            rc = jerr(&c, "expected ',' or '}'");
        fail:
            free(*out);
            *out = NULL;
            *out_len = 0;
            return rc;
        }
    }
    jws(&c);
    if (c.i != c.n) {
        free(*out);
        *out = NULL;
        *out_len = 0;
        return jerr(&c, "text after the object");
    }
    if (!found)
        return tio_fail(TIO_EPARSE, "%s: no string field '%s'", where, field);
    return 0;
}

/* ---- streaming decompression ------------------------------------------------ */

enum { STREAM_IN = 1 << 17 };

struct tio_text_stream {
    char *path;
    int comp, fd;
    uint64_t pos;      /* decompressed bytes handed out */
    uint64_t in_total; /* compressed bytes read */
    bool in_eof, done;
    bool member_open;  /* inside a gzip member or zstd frame */
    char *in;
    size_t in_len, in_pos;
#if TIO_HAVE_ZLIB
    z_stream z;
    bool z_live;
#endif
#if TIO_HAVE_ZSTD
    ZSTD_DStream *zs;
#endif
};

void tio_text_stream_close(tio_text_stream *s)
{
    if (!s)
        return;
#if TIO_HAVE_ZLIB
    if (s->z_live)
        inflateEnd(&s->z);
#endif
#if TIO_HAVE_ZSTD
    ZSTD_freeDStream(s->zs);
#endif
    if (s->fd >= 0)
        close(s->fd);
    free(s->in);
    free(s->path);
    free(s);
}

int tio_text_stream_open(const char *path, int comp, tio_text_stream **out)
{
    *out = NULL;
    tio_text_stream *s = calloc(1, sizeof *s);
    if (!s)
        return tio_fail(-ENOMEM, "%s: out of memory", path);
    s->fd = -1;
    s->comp = comp;
    if (!(s->path = strdup(path)) || (comp != COMP_NONE && !(s->in = malloc(STREAM_IN)))) {
        tio_text_stream_close(s);
        return tio_fail(-ENOMEM, "%s: out of memory", path);
    }
    int rc = 0;
    if (comp == COMP_GZ) {
#if TIO_HAVE_ZLIB
        if (inflateInit2(&s->z, 15 + 32) != Z_OK)
            rc = tio_fail(-ENOMEM, "%s: inflateInit failed", path);
        s->z_live = rc == 0;
#else
        rc = tio_fail(-ENOTSUP, "%s: built without zlib", path);
#endif
    } else if (comp == COMP_ZST) {
#if TIO_HAVE_ZSTD
        if (!(s->zs = ZSTD_createDStream()))
            rc = tio_fail(-ENOMEM, "%s: out of memory", path);
#else
        rc = tio_fail(-ENOTSUP, "%s: built without zstd", path);
#endif
    }
    if (!rc && (s->fd = open(path, O_RDONLY | O_CLOEXEC)) < 0)
        rc = tio_fail(-errno, "%s: cannot open: %s", path, strerror(errno));
    if (rc) {
        tio_text_stream_close(s);
        return rc;
    }
    *out = s;
    return 0;
}

/* Read up to `cap` raw bytes. */
static int64_t raw_read(tio_text_stream *s, char *buf, size_t cap)
{
    for (;;) {
        ssize_t r = read(s->fd, buf, cap);
        if (r >= 0)
            return r;
        if (errno != EINTR)
            return tio_fail(-errno, "%s: read failed: %s", s->path, strerror(errno));
    }
}

/* Refill the compressed input when it is used up. */
static int refill(tio_text_stream *s)
{
    if (s->in_pos < s->in_len || s->in_eof)
        return 0;
    int64_t r = raw_read(s, s->in, STREAM_IN);
    if (r < 0)
        return (int)r;
    s->in_len = (size_t)r;
    s->in_pos = 0;
    s->in_total += (uint64_t)r;
    s->in_eof = r == 0;
    return 0;
}

#if TIO_HAVE_ZLIB
static int64_t gz_read(tio_text_stream *s, char *buf, size_t cap)
{
    size_t got = 0;
    while (got < cap && !s->done) {
        int rc = refill(s);
        if (rc)
            return rc;
        if (s->z.avail_in == 0 && s->in_pos < s->in_len) {
            s->z.next_in = (Bytef *)s->in + s->in_pos;
            s->z.avail_in = (uInt)(s->in_len - s->in_pos);
            s->in_pos = s->in_len;
        }
        if (s->z.avail_in == 0 && s->in_eof) {
            if (s->member_open)
                return tio_fail(TIO_EPARSE, "%s: truncated gzip stream", s->path);
            s->done = true; /* the end, right after a member (or an empty file) */
            break;
        }
        s->z.next_out = (Bytef *)buf + got;
        s->z.avail_out = (uInt)(cap - got);
        s->member_open = true;
        int zr = inflate(&s->z, Z_NO_FLUSH);
        got = cap - s->z.avail_out;
        if (zr == Z_STREAM_END) {
            inflateReset(&s->z); /* concatenated gzip members */
            s->member_open = false;
        } else if (zr != Z_OK && zr != Z_BUF_ERROR) {
            return tio_fail(TIO_EPARSE, "%s: gzip error near input byte %llu: %s", s->path,
                            (unsigned long long)(s->in_total - s->z.avail_in),
                            s->z.msg ? s->z.msg : "corrupt data");
        }
    }
    return (int64_t)got;
}
#endif

#if TIO_HAVE_ZSTD
static int64_t zst_read(tio_text_stream *s, char *buf, size_t cap)
{
    ZSTD_outBuffer ob = {buf, cap, 0};
    while (ob.pos < ob.size && !s->done) {
        int rc = refill(s);
        if (rc)
            return rc;
        if (s->in_eof && s->in_total == 0) { /* an empty file */
            s->done = true;
            break;
        }
        ZSTD_inBuffer in = {s->in, s->in_len, s->in_pos};
        size_t out_before = ob.pos, in_before = in.pos;
        size_t hint = ZSTD_decompressStream(s->zs, &ob, &in);
        s->in_pos = in.pos;
        if (ZSTD_isError(hint))
            return tio_fail(TIO_EPARSE, "%s: zstd error near input byte %llu: %s", s->path,
                            (unsigned long long)(s->in_total - (s->in_len - s->in_pos)),
                            ZSTD_getErrorName(hint));
        bool progress = ob.pos != out_before || in.pos != in_before;
        if (progress)
            s->member_open = hint != 0; /* 0: a frame is complete and flushed */
        else if (s->in_eof) {
            if (s->member_open)
                return tio_fail(TIO_EPARSE, "%s: truncated zstd stream", s->path);
            s->done = true;
        }
    }
    return (int64_t)ob.pos;
}
#endif

int64_t tio_text_stream_read(tio_text_stream *s, char *buf, size_t cap)
{
    int64_t n;
    if (s->comp == COMP_NONE)
        n = raw_read(s, buf, cap);
#if TIO_HAVE_ZLIB
    else if (s->comp == COMP_GZ)
        n = gz_read(s, buf, cap);
#endif
#if TIO_HAVE_ZSTD
    else if (s->comp == COMP_ZST)
        n = zst_read(s, buf, cap);
#endif
    else
        n = tio_fail(-ENOTSUP, "%s: compression not built in", s->path);
    if (n > 0)
        s->pos += (uint64_t)n;
    return n;
}

int tio_text_stream_skip(tio_text_stream *s, uint64_t n)
{
    if (s->comp == COMP_NONE) {
        if (lseek(s->fd, (off_t)(s->pos + n), SEEK_SET) < 0)
            return tio_fail(-errno, "%s: seek failed: %s", s->path, strerror(errno));
        s->pos += n;
        return 0;
    }
    char buf[1 << 14];
    while (n) {
        int64_t r = tio_text_stream_read(s, buf, n < sizeof buf ? (size_t)n : sizeof buf);
        if (r < 0)
            return (int)r;
        if (r == 0)
            return tio_fail(TIO_EPARSE, "%s: the file changed: it ends before byte %llu", s->path,
                            (unsigned long long)(s->pos + n));
        n -= (uint64_t)r;
    }
    return 0;
}

uint64_t tio_text_stream_pos(const tio_text_stream *s) { return s->pos; }

/* ---- lines ------------------------------------------------------------------
 * Lines are read through a buffer that holds the longest line allowed
 * (max_line_bytes) plus one read; a longer line is an error naming the file
 * and the line.  Blank lines (spaces, tabs, CR only) are not documents. */

enum { LINE_READ = 1 << 20 };

typedef struct {
    tio_text_stream *s;
    const char *rel;
    uint64_t max_line;
    char *buf;
    size_t cap, start, end; /* unread bytes are buf[start, end) */
    bool eof;
    uint64_t lineno;        /* lines returned so far (1-based number of the last) */
    uint64_t line_offset;   /* decompressed offset of the last line */
    uint64_t buf_offset;    /* decompressed offset of buf[0] */
} line_reader;

static int lines_init(line_reader *lr, tio_text_stream *s, const tio_dataset *ds, const char *rel)
{
    memset(lr, 0, sizeof *lr);
    lr->s = s;
    lr->rel = rel;
    lr->max_line = ds->opts.max_line_bytes ? ds->opts.max_line_bytes : (64u << 20);
    lr->buf_offset = tio_text_stream_pos(s);
    return 0;
}

static void lines_free(line_reader *lr) { free(lr->buf); }

/* The next line (without its newline) as [*line, *line + *len); false at
 * the end.  *rc is 0 or the error. */
static bool next_line(line_reader *lr, const char **line, size_t *len, int *rc)
{
    *rc = 0;
    for (;;) {
        char *nl = lr->end > lr->start ? memchr(lr->buf + lr->start, '\n', lr->end - lr->start)
                                       : NULL;
        if (nl || (lr->eof && lr->end > lr->start)) {
            size_t e = nl ? (size_t)(nl - lr->buf) : lr->end;
            *line = lr->buf + lr->start;
            *len = e - lr->start;
            lr->line_offset = lr->buf_offset + lr->start;
            lr->lineno++;
            lr->start = nl ? e + 1 : e;
            if (*len > lr->max_line) {
                *rc = tio_fail(TIO_EPARSE, "%s: line %llu is longer than the limit of %llu bytes "
                               "(max_line_bytes)", lr->rel, (unsigned long long)lr->lineno,
                               (unsigned long long)lr->max_line);
                return false;
            }
            return true;
        }
        if (lr->eof)
            return false;
        if (lr->end - lr->start > lr->max_line) {
            *rc = tio_fail(TIO_EPARSE, "%s: line %llu is longer than the limit of %llu bytes "
                           "(max_line_bytes)", lr->rel, (unsigned long long)lr->lineno + 1,
                           (unsigned long long)lr->max_line);
            return false;
        }
        /* keep the unread part, then read more after it */
        if (lr->start)
            memmove(lr->buf, lr->buf + lr->start, lr->end - lr->start);
        lr->buf_offset += lr->start;
        lr->end -= lr->start;
        lr->start = 0;
        if (lr->cap - lr->end < LINE_READ) {
            size_t nc = lr->end + LINE_READ;
            char *p = realloc(lr->buf, nc);
            if (!p) {
                *rc = tio_fail(-ENOMEM, "%s: out of memory reading line %llu", lr->rel,
                               (unsigned long long)lr->lineno + 1);
                return false;
            }
            lr->buf = p;
            lr->cap = nc;
        }
        int64_t r = tio_text_stream_read(lr->s, lr->buf + lr->end, lr->cap - lr->end);
        if (r < 0) {
            *rc = (int)r;
            return false;
        }
        lr->end += (size_t)r;
        lr->eof = r == 0;
    }
}

static bool blank(const char *line, size_t len)
{
    for (size_t i = 0; i < len; i++)
        if (line[i] != ' ' && line[i] != '\t' && line[i] != '\r')
            return false;
    return true;
}

/* ---- the JSONL format ------------------------------------------------------- */

/* Count the documents, cut the windows, and find out whether a document
 * has text (until one is found: an all-empty sub-dataset is refused). */
static int jsonl_open(tio_dataset *ds, tio_data_file *f)
{
    tio_text_stream *s;
    int rc = tio_text_stream_open(f->path, f->comp, &s);
    if (rc)
        return rc;
    line_reader lr;
    lines_init(&lr, s, ds, f->rel);
    uint32_t cap = 0;
    uint64_t docs = 0, window_start = 0;
    const char *line;
    size_t len;
    f->n_windows = 0;
    while (next_line(&lr, &line, &len, &rc)) {
        if (blank(line, len))
            continue;
        if (docs == 0 || lr.line_offset - window_start >= TIO_JSONL_WINDOW_BYTES) {
            if ((rc = tio_grow((void **)&f->windows, &cap, f->n_windows + 1, sizeof *f->windows)))
                break;
            f->windows[f->n_windows++] = (tio_data_window){docs, 0, lr.line_offset, lr.lineno - 1};
            window_start = lr.line_offset;
        }
        f->windows[f->n_windows - 1].count++;
        docs++;
        if (!f->has_tokens) {
            char *text = NULL;
            size_t tlen = 0;
            if (tio_jsonl_text(line, len, ds->text_field, f->rel, &text, &tlen) == 0)
                f->has_tokens = tlen > 0;
            tio_clear_error();
            free(text);
        }
    }
    lines_free(&lr);
    tio_text_stream_close(s);
    if (rc)
        return rc;
    f->n_docs = docs;
    return 0;
}

static void jsonl_close(tio_data_file *f)
{
    free(f->windows);
    f->windows = NULL;
    f->n_windows = 0;
}

/* A window's lines, read into one buffer, for the tokenizer threads. */
typedef struct {
    const tio_dataset *ds;
    const tio_data_file *f;
    char *buf;
    uint64_t *lines; /* start, end per document */
    uint64_t first;
    uint64_t *linenos;
} jsonl_window;

static int jsonl_text(void *ctx, uint64_t i, const char **text, size_t *len, char **owned)
{
    jsonl_window *jw = ctx;
    char where[4200];
    snprintf(where, sizeof where, "%s: line %llu (document %llu)", jw->f->rel,
             (unsigned long long)jw->linenos[i], (unsigned long long)(jw->first + i));
    int rc = tio_jsonl_text(jw->buf + jw->lines[2 * i], jw->lines[2 * i + 1] - jw->lines[2 * i],
                            jw->ds->text_field, where, owned, len);
    *text = *owned;
    return rc;
}

/* Where a reader's last window of a file ended: the stream and its line
 * reader standing at the start of the next window, so that windows read in
 * order (a whole-file scan, ingest) decompress the file once; a jump
 * elsewhere starts again from the beginning of the file. */
typedef struct {
    tio_text_stream *s;
    line_reader lr;
    uint32_t next;      /* the window that starts where it stands */
    uint64_t line_base; /* lines before the one lr counts as its first */
} jsonl_cursor;

static void jsonl_cursor_free(void *p)
{
    jsonl_cursor *c = p;
    if (!c)
        return;
    lines_free(&c->lr);
    tio_text_stream_close(c->s);
    free(c);
}

/* Move a line reader forward to decompressed offset `at` (>= where it is). */
static int lines_skip_to(line_reader *lr, uint64_t at)
{
    if (at <= lr->buf_offset + lr->end) {
        lr->start = (size_t)(at - lr->buf_offset);
        return 0;
    }
    int rc = tio_text_stream_skip(lr->s, at - (lr->buf_offset + lr->end));
    lr->buf_offset = at;
    lr->start = lr->end = 0;
    lr->eof = false;
    return rc;
}

static int cursor_at(tio_dataset *ds, tio_data_file *f, uint32_t wi, jsonl_cursor **cursor)
{
    jsonl_cursor *old = *cursor;
    if (old && old->next == wi)
        return 0;
    if (old && old->next < wi) { /* forward: go on from here rather than from the start */
        int rc = lines_skip_to(&old->lr, f->windows[wi].offset);
        if (rc)
            return rc;
        old->lr.lineno = 0;
        old->line_base = f->windows[wi].line;
        old->next = wi;
        return 0;
    }
    jsonl_cursor_free(*cursor);
    *cursor = NULL;
    jsonl_cursor *c = calloc(1, sizeof *c);
    if (!c)
        return tio_fail(-ENOMEM, "%s: out of memory", f->rel);
    int rc = tio_text_stream_open(f->path, f->comp, &c->s);
    if (!rc)
        rc = tio_text_stream_skip(c->s, f->windows[wi].offset);
    if (rc) {
        tio_text_stream_close(c->s);
        free(c);
        return rc;
    }
    lines_init(&c->lr, c->s, ds, f->rel);
    c->next = wi;
    c->line_base = f->windows[wi].line;
    *cursor = c;
    return 0;
}

/* Read window wi's lines through the cursor into jw. */
static int read_window(tio_data_file *f, uint32_t wi, jsonl_cursor *c, jsonl_window *jw)
{
    const tio_data_window *win = &f->windows[wi];
    uint64_t end = wi + 1 < f->n_windows ? f->windows[wi + 1].offset : UINT64_MAX;
    size_t used = 0, cap = 0;
    uint64_t n = 0;
    int rc = 0;
    jw->lines = malloc((win->count ? win->count : 1) * 2 * sizeof *jw->lines);
    jw->linenos = malloc((win->count ? win->count : 1) * sizeof *jw->linenos);
    if (!jw->lines || !jw->linenos)
        return tio_fail(-ENOMEM, "%s: out of memory", f->rel);
    line_reader *lr = &c->lr;
    const char *line;
    size_t len;
    while (!rc && lr->buf_offset + lr->start < end && next_line(lr, &line, &len, &rc)) {
        if (blank(line, len))
            continue;
        if (n == win->count)
            return tio_fail(TIO_EPARSE, "%s: the file changed since it was opened (more lines)",
                            f->rel);
        if (used + len + 1 > cap) {
            size_t nc = (used + len + 1) * 2;
            char *p = realloc(jw->buf, nc);
            if (!p)
                return tio_fail(-ENOMEM, "%s: out of memory", f->rel);
            jw->buf = p;
            cap = nc;
        }
        memcpy(jw->buf + used, line, len);
        jw->lines[2 * n] = used;
        jw->lines[2 * n + 1] = used + len;
        used += len + 1;
        jw->linenos[n++] = c->line_base + lr->lineno;
    }
    if (!rc && n != win->count)
        rc = tio_fail(TIO_EPARSE, "%s: the file changed since it was opened (%llu lines in a "
                      "window that had %llu)", f->rel, (unsigned long long)n,
                      (unsigned long long)win->count);
    return rc;
}

static int jsonl_window_load(tio_dataset *ds, tio_data_file *f, uint32_t wi, tio_window_ids *out,
                             void **cursor)
{
    jsonl_cursor *c = *cursor;
    int rc = cursor_at(ds, f, wi, &c);
    if (rc) {
        jsonl_cursor_free(c);
        *cursor = NULL;
        return rc;
    }
    *cursor = c;
    jsonl_window jw = {ds, f, NULL, NULL, f->windows[wi].first, NULL};
    if ((rc = read_window(f, wi, c, &jw)) == 0) {
        c->next = wi + 1;
        tio_window_source src = {&jw, jsonl_text, NULL};
        rc = tio_window_fill(ds, f, &src, f->windows[wi].first, f->windows[wi].count, out);
    } else {
        jsonl_cursor_free(c);
        *cursor = NULL;
    }
    free(jw.buf);
    free(jw.lines);
    free(jw.linenos);
    return rc;
}

const tio_data_format tio_format_jsonl = {"JSONL", jsonl_open, jsonl_close, NULL, NULL, NULL,
                                          jsonl_window_load, jsonl_cursor_free};
