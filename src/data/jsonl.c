/*
 * data/jsonl.c — JSONL text extraction and whole-file decompression (.gz via
 * zlib, .zst via libzstd).
 *
 * The JSON reader is deliberately minimal: it walks one line's top-level
 * object, skips every value it does not need (nested objects and arrays,
 * numbers, literals, strings) and unescapes only the wanted string field
 * (RFC 8259 escapes, \uXXXX with surrogate pairs to UTF-8).  It validates the
 * structure it walks, so a malformed line is an error with the column.
 */
#include <stdlib.h>
#include <string.h>

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

/* ---- decompression -------------------------------------------------------- */

static int grow_buf(char **buf, size_t *cap, size_t need, const char *path)
{
    if (need <= *cap)
        return 0;
    size_t n = *cap ? *cap : 1 << 16;
    while (n < need)
        n *= 2;
    char *p = realloc(*buf, n + 1);
    if (!p)
        return tio_fail(-ENOMEM, "%s: out of memory decompressing", path);
    *buf = p;
    *cap = n;
    return 0;
}

int tio_decompress_file(const char *path, int comp, char **buf, size_t *len)
{
    if (comp == COMP_NONE)
        return tio_read_file(path, buf, len);
    char *raw = NULL;
    size_t raw_len = 0;
    int rc = tio_read_file(path, &raw, &raw_len);
    if (rc)
        return rc;
    char *out = NULL;
    size_t cap = 0, n = 0;
    if (comp == COMP_GZ) {
#if TIO_HAVE_ZLIB
        z_stream z;
        memset(&z, 0, sizeof z);
        if (inflateInit2(&z, 15 + 32) != Z_OK) {
            free(raw);
            return tio_fail(-ENOMEM, "%s: inflateInit failed", path);
        }
        z.next_in = (Bytef *)raw;
        z.avail_in = (uInt)raw_len;
        for (;;) {
            if ((rc = grow_buf(&out, &cap, n + (1 << 16), path)) != 0)
                break;
            z.next_out = (Bytef *)out + n;
            z.avail_out = (uInt)(cap - n);
            int zr = inflate(&z, Z_NO_FLUSH);
            n = cap - z.avail_out;
            if (zr == Z_STREAM_END) {
                if (z.avail_in == 0)
                    break;
                inflateReset(&z); /* concatenated gzip members */
                continue;
            }
            if (zr != Z_OK && zr != Z_BUF_ERROR) {
                rc = tio_fail(TIO_EPARSE, "%s: gzip error at input byte %lu: %s", path,
                              (unsigned long)z.total_in, z.msg ? z.msg : "corrupt data");
                break;
            }
            if (zr == Z_BUF_ERROR && z.avail_in == 0) {
                rc = tio_fail(TIO_EPARSE, "%s: truncated gzip stream", path);
                break;
            }
        }
        inflateEnd(&z);
#else
        rc = tio_fail(-ENOTSUP, "%s: built without zlib", path);
#endif
    } else {
#if TIO_HAVE_ZSTD
        ZSTD_DStream *zs = ZSTD_createDStream();
        if (!zs) {
            free(raw);
            return tio_fail(-ENOMEM, "%s: out of memory", path);
        }
        ZSTD_inBuffer in = {raw, raw_len, 0};
        size_t last = 0;
        while (in.pos < in.size || last != 0) {
            if ((rc = grow_buf(&out, &cap, n + (1 << 16), path)) != 0)
                break;
            ZSTD_outBuffer ob = {out, cap, n};
            size_t before = in.pos;
            last = ZSTD_decompressStream(zs, &ob, &in);
            if (ZSTD_isError(last)) {
                rc = tio_fail(TIO_EPARSE, "%s: zstd error at input byte %zu: %s", path, in.pos,
                              ZSTD_getErrorName(last));
                break;
            }
            bool progress = ob.pos != n || in.pos != before;
            n = ob.pos;
            if (!progress && in.pos == in.size) {
                rc = tio_fail(TIO_EPARSE, "%s: truncated zstd stream", path);
                break;
            }
        }
        ZSTD_freeDStream(zs);
#else
        rc = tio_fail(-ENOTSUP, "%s: built without zstd", path);
#endif
    }
    free(raw);
    if (rc) {
        free(out);
        return rc;
    }
    if (!out && (rc = grow_buf(&out, &cap, 1, path)) != 0)
        return rc;
    out[n] = '\0';
    *buf = out;
    *len = n;
    return 0;
}
