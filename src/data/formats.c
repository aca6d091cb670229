/*
 * data/formats.c — parsers of the token file formats the loader reads in
 * place (memory-mapped): Megatron MMIDIDX v1 indexes, llm.c shard headers and
 * Arrow IPC files (flatbuffer metadata decoded here; no Arrow library),
 * and the table of per-format operations the dataset's readers dispatch
 * through (open, document length, address, read).
 *
 * Every parser bounds-checks each read against the buffer it was given and
 * reports the first problem as TIO_EPARSE naming the file and byte offset.
 *
 * Sources: megatron/core/datasets/indexed_dataset.py (_IndexWriter: magic
 * "MMIDIDX\0\0", u64 version 1, u8 dtype, u64 sequence count, u64 document
 * count, int32 lengths, int64 byte pointers, int64 document indices);
 * karpathy/llm.c dev/data/data_common.py (256 int32 header: magic, version,
 * token count); Arrow columnar format spec, "Serialization and IPC"
 * (arrow.apache.org/docs/format/Columnar.html) and format/Message.fbs,
 * Schema.fbs, File.fbs.
 */
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <sys/mman.h>
#include <sys/stat.h>

#include "common/util.h"
#include "data/data_internal.h"

static uint64_t rd64(const uint8_t *p)
{
    uint64_t v;
    memcpy(&v, p, 8);
    return v;
}
static uint32_t rd32(const uint8_t *p)
{
    uint32_t v;
    memcpy(&v, p, 4);
    return v;
}
static uint16_t rd16(const uint8_t *p)
{
    uint16_t v;
    memcpy(&v, p, 2);
    return v;
}

/* ---- Megatron MMIDIDX ----------------------------------------------------- */

int tio_mmidx_dtype_size(uint8_t code)
{
    /* 1 uint8, 2 int8, 3 int16, 4 int32, 5 int64, 6 float64, 7 float32, 8 uint16 */
    static const int sizes[9] = {0, 1, 1, 2, 4, 8, 8, 4, 2};
    return code >= 1 && code <= 8 ? sizes[code] : 0;
}

int tio_mmidx_parse(const uint8_t *buf, size_t len, uint64_t bin_bytes, const char *name,
                    tio_mmidx *out)
{
    static const uint8_t magic[9] = {'M', 'M', 'I', 'D', 'I', 'D', 'X', 0, 0};
    memset(out, 0, sizeof *out);
    if (len < 34)
        return tio_fail(TIO_EPARSE, "%s: truncated header (%zu bytes, expected 34)", name, len);
    if (memcmp(buf, magic, 9) != 0)
        return tio_fail(TIO_EPARSE, "%s: bad magic (expected \"MMIDIDX\\0\\0\")", name);
    uint64_t version = rd64(buf + 9);
    if (version != 1)
        return tio_fail(TIO_EVERSION, "%s: version %llu (only version 1 is supported)", name,
                        (unsigned long long)version);
    out->dtype = buf[17];
    int w = tio_mmidx_dtype_size(out->dtype);
    if (!w)
        return tio_fail(TIO_EPARSE, "%s: offset 17: unknown dtype code %u (expected 1..8)", name,
                        out->dtype);
    out->n_seqs = rd64(buf + 18);
    uint64_t n_doc_idx = rd64(buf + 26);
    if (n_doc_idx == 0)
        return tio_fail(TIO_EPARSE, "%s: offset 26: document count 0 (expected >= 1)", name);
    uint64_t avail = len - 34;
    if (out->n_seqs > avail / 12 || n_doc_idx > (avail - out->n_seqs * 12) / 8)
        return tio_fail(TIO_EPARSE, "%s: truncated: %llu sequences and %llu document indices "
                        "need more than %zu bytes", name, (unsigned long long)out->n_seqs,
                        (unsigned long long)n_doc_idx, len);
    out->lengths = buf + 34;
    out->pointers = out->lengths + 4 * out->n_seqs;
    out->doc_index = out->pointers + 8 * out->n_seqs;
    out->n_docs = n_doc_idx - 1;
    uint64_t prev = 0;
    for (uint64_t i = 0; i <= out->n_docs; i++) {
        uint64_t d = rd64(out->doc_index + 8 * i);
        if ((i == 0 && d != 0) || d < prev || d > out->n_seqs || (i == out->n_docs && d != out->n_seqs))
            return tio_fail(TIO_EPARSE, "%s: document index %llu is %lld (expected non-decreasing "
                            "from 0 to %llu)", name, (unsigned long long)i, (long long)d,
                            (unsigned long long)out->n_seqs);
        prev = d;
    }
    for (uint64_t i = 0; i < out->n_seqs; i++) {
        int32_t l = (int32_t)rd32(out->lengths + 4 * i);
        int64_t p = (int64_t)rd64(out->pointers + 8 * i);
        if (l < 0 || p < 0)
            return tio_fail(TIO_EPARSE, "%s: sequence %llu: negative length or pointer", name,
                            (unsigned long long)i);
        if (bin_bytes != UINT64_MAX &&
            ((uint64_t)p > bin_bytes || (uint64_t)l * (uint64_t)w > bin_bytes - (uint64_t)p))
            return tio_fail(TIO_EPARSE, "%s: sequence %llu ends at byte %llu past the end of the "
                            ".bin (%llu bytes)", name, (unsigned long long)i,
                            (unsigned long long)((uint64_t)p + (uint64_t)l * (uint64_t)w),
                            (unsigned long long)bin_bytes);
    }
    return 0;
}

/* ---- llm.c ---------------------------------------------------------------- */

int tio_llmc_parse_header(const uint8_t *buf, size_t len, const char *name, int *width,
                          uint64_t *n_tokens, uint32_t *default_delim)
{
    if (len < 1024)
        return tio_fail(TIO_EPARSE, "%s: truncated llm.c header (%zu bytes, expected 1024)", name, len);
    uint32_t magic = rd32(buf), version = rd32(buf + 4);
    if (magic == 20240520 && version == 1) {
        *width = 2;
        *default_delim = 50256;
    } else if (magic == 20240801 && version == 7) {
        *width = 4;
        *default_delim = 128000;
    } else {
        return tio_fail(TIO_EPARSE, "%s: llm.c header magic %u version %u (expected 20240520 v1 "
                        "or 20240801 v7)", name, magic, version);
    }
    int32_t n = (int32_t)rd32(buf + 8);
    if (n < 0 || (uint64_t)n * (uint64_t)*width > len - 1024)
        return tio_fail(TIO_EPARSE, "%s: header says %d tokens but the file holds %zu token bytes",
                        name, n, len - 1024);
    *n_tokens = (uint64_t)n;
    return 0;
}

/* ---- flatbuffers (read side) ---------------------------------------------- */

typedef struct {
    const uint8_t *b;
    size_t len;
    const char *name;
    size_t base; /* file offset of b[0], for messages */
} fb;

static int fb_err(const fb *f, size_t at, const char *what)
{
    return tio_fail(TIO_EPARSE, "%s: offset %zu: %s", f->name, f->base + at, what);
}

/* Table at `t`: returns vtable field `id`'s absolute position, 0 if absent,
 * or SIZE_MAX on a bounds error (message set). */
static size_t fb_field(const fb *f, size_t t, unsigned id, size_t size)
{
    if (t > f->len || f->len - t < 4) {
        fb_err(f, t, "flatbuffer table out of bounds");
        return SIZE_MAX;
    }
    int64_t vt = (int64_t)t - (int32_t)rd32(f->b + t);
    if (vt < 0 || (uint64_t)vt + 4 > f->len) {
        fb_err(f, t, "flatbuffer vtable out of bounds");
        return SIZE_MAX;
    }
    uint16_t vsize = rd16(f->b + vt);
    if (vsize < 4 || (uint64_t)vt + vsize > f->len || vsize % 2) {
        fb_err(f, (size_t)vt, "bad flatbuffer vtable size");
        return SIZE_MAX;
    }
    if (4 + 2u * id + 2 > vsize)
        return 0;
    uint16_t off = rd16(f->b + vt + 4 + 2 * id);
    if (!off)
        return 0;
    if (t + off + size > f->len) {
        fb_err(f, t, "flatbuffer field out of bounds");
        return SIZE_MAX;
    }
    return t + off;
}

/* Follow the uoffset at position `p` (a table, vector or string). */
static size_t fb_deref(const fb *f, size_t p)
{
    uint32_t o = rd32(f->b + p);
    if (p + (uint64_t)o + 4 > f->len) {
        fb_err(f, p, "flatbuffer offset out of bounds");
        return SIZE_MAX;
    }
    return p + o;
}

/* Vector at `v` with `elem`-byte elements: returns count or -1. */
static int64_t fb_vector(const fb *f, size_t v, size_t elem)
{
    uint32_t n = rd32(f->b + v);
    if ((uint64_t)n * elem > f->len - v - 4) {
        fb_err(f, v, "flatbuffer vector out of bounds");
        return -1;
    }
    return n;
}

/* ---- Arrow IPC ------------------------------------------------------------ */

enum { ARROW_TYPE_NULL = 1, ARROW_TYPE_INT = 2 };
enum { ARROW_MSG_SCHEMA = 1, ARROW_MSG_DICT = 2, ARROW_MSG_BATCH = 3 };

/* Buffers a field of type union tag `tag` has in a record batch body, or -1
 * for types whose layout (nested, variadic) this reader does not walk. */
static int arrow_buffer_count(uint8_t tag)
{
    switch (tag) {
    case 1: return 0;                      /* Null */
    case 2: case 3: case 6: case 7: case 8: case 9: case 10: case 11: case 15: case 18:
        return 2;                          /* Int, Float, Bool, Decimal, Date, Time,
                                              Timestamp, Interval, FixedSizeBinary, Duration */
    case 4: case 5: case 19: case 20:      /* Binary, Utf8, LargeBinary, LargeUtf8 */
        return 3;
    default: return -1;
    }
}

typedef struct {
    int column;        /* index of the tokens field */
    int buffer_index;  /* index of its data buffer in a batch's buffer list */
    int width;
    bool is_signed;
} arrow_schema;

static int arrow_parse_schema(const fb *f, size_t schema, const char *column, arrow_schema *s)
{
    size_t p = fb_field(f, schema, 1, 4);
    if (p == SIZE_MAX)
        return TIO_EPARSE;
    if (!p)
        return fb_err(f, schema, "schema without fields");
    size_t v = fb_deref(f, p);
    if (v == SIZE_MAX)
        return TIO_EPARSE;
    int64_t n = fb_vector(f, v, 4);
    if (n < 0)
        return TIO_EPARSE;
    int buffers = 0;
    s->column = -1;
    for (int64_t i = 0; i < n; i++) {
        size_t field = fb_deref(f, v + 4 + 4 * (size_t)i);
        if (field == SIZE_MAX)
            return TIO_EPARSE;
        size_t pn = fb_field(f, field, 0, 4), pt = fb_field(f, field, 2, 1),
               pty = fb_field(f, field, 3, 4);
        if (pn == SIZE_MAX || pt == SIZE_MAX || pty == SIZE_MAX)
            return TIO_EPARSE;
        uint8_t tag = pt ? f->b[pt] : 0;
        bool match = false;
        if (pn) {
            size_t str = fb_deref(f, pn);
            if (str == SIZE_MAX)
                return TIO_EPARSE;
            int64_t sl = fb_vector(f, str, 1);
            if (sl < 0)
                return TIO_EPARSE;
            match = (size_t)sl == strlen(column) && !memcmp(f->b + str + 4, column, (size_t)sl);
        }
        if (match) {
            if (tag != ARROW_TYPE_INT || !pty)
                return fb_err(f, field, "the tokens column is not of an integer type");
            size_t ty = fb_deref(f, pty);
            if (ty == SIZE_MAX)
                return TIO_EPARSE;
            size_t pw = fb_field(f, ty, 0, 4), ps = fb_field(f, ty, 1, 1);
            if (pw == SIZE_MAX || ps == SIZE_MAX)
                return TIO_EPARSE;
            int32_t bits = pw ? (int32_t)rd32(f->b + pw) : 0;
            if (bits != 8 && bits != 16 && bits != 32 && bits != 64)
                return fb_err(f, ty, "integer bit width not 8, 16, 32 or 64");
            s->column = (int)i;
            s->buffer_index = buffers + 1;
            s->width = bits / 8;
            s->is_signed = ps && f->b[ps];
            return 0;
        }
        size_t pc = fb_field(f, field, 5, 4);
        if (pc == SIZE_MAX)
            return TIO_EPARSE;
        int nb = arrow_buffer_count(tag);
        if (nb < 0 || pc) {
            /* children present: a nested column before the tokens column */
            if (pc) {
                size_t cv = fb_deref(f, pc);
                if (cv == SIZE_MAX)
                    return TIO_EPARSE;
                int64_t nc = fb_vector(f, cv, 4);
                if (nc < 0)
                    return TIO_EPARSE;
                if (nc > 0 || nb < 0)
                    return fb_err(f, field, "a nested or variadic column precedes the tokens column");
            } else {
                return fb_err(f, field, "a nested or variadic column precedes the tokens column");
            }
        }
        buffers += nb;
    }
    return tio_fail(TIO_EPARSE, "%s: no column named '%s'", f->name, column);
}

static int arrow_parse_batch(const fb *f, size_t batch, const arrow_schema *s, uint64_t body_off,
                             uint64_t body_len, tio_arrow_batch *out)
{
    size_t pnodes = fb_field(f, batch, 1, 4), pbufs = fb_field(f, batch, 2, 4),
           pcomp = fb_field(f, batch, 3, 4);
    if (pnodes == SIZE_MAX || pbufs == SIZE_MAX || pcomp == SIZE_MAX)
        return TIO_EPARSE;
    if (pcomp)
        return fb_err(f, batch, "compressed record batches are not supported");
    if (!pnodes || !pbufs)
        return fb_err(f, batch, "record batch without nodes or buffers");
    size_t nv = fb_deref(f, pnodes), bv = fb_deref(f, pbufs);
    if (nv == SIZE_MAX || bv == SIZE_MAX)
        return TIO_EPARSE;
    int64_t nn = fb_vector(f, nv, 16), nb = fb_vector(f, bv, 16);
    if (nn < 0 || nb < 0)
        return TIO_EPARSE;
    if (s->column >= nn || s->buffer_index >= nb)
        return fb_err(f, batch, "record batch has fewer columns than the schema");
    uint64_t count = rd64(f->b + nv + 4 + 16 * (size_t)s->column);
    uint64_t nulls = rd64(f->b + nv + 4 + 16 * (size_t)s->column + 8);
    if (nulls)
        return fb_err(f, batch, "the tokens column has nulls");
    uint64_t boff = rd64(f->b + bv + 4 + 16 * (size_t)s->buffer_index);
    uint64_t blen = rd64(f->b + bv + 4 + 16 * (size_t)s->buffer_index + 8);
    if (count > (UINT64_MAX / 8) || blen < count * (uint64_t)s->width || boff > body_len ||
        blen > body_len - boff)
        return fb_err(f, batch, "tokens buffer out of the message body");
    out->offset = body_off + boff;
    out->count = count;
    return 0;
}

void tio_arrow_index_free(tio_arrow_index *ix)
{
    free(ix->batches);
    memset(ix, 0, sizeof *ix);
}

/* Walk the encapsulated messages from `pos`: <0xFFFFFFFF> <int32 metadata
 * length> <flatbuffer Message> <body>, until end-of-stream (length 0) or the
 * end of the buffer (the file format's footer follows end-of-stream). */
int tio_arrow_parse(const uint8_t *buf, size_t len, const char *column, const char *name,
                    tio_arrow_index *out)
{
    memset(out, 0, sizeof *out);
    size_t pos = 0;
    if (len >= 8 && !memcmp(buf, "ARROW1\0\0", 8))
        pos = 8;
    arrow_schema schema = {.column = -1};
    uint32_t cap = 0;
    int rc = 0;
    while (pos + 4 <= len) {
        uint32_t mlen = rd32(buf + pos);
        size_t start = pos;
        pos += 4;
        if (mlen == 0xFFFFFFFFu) {
            if (pos + 4 > len) {
                rc = tio_fail(TIO_EPARSE, "%s: offset %zu: truncated message length", name, pos);
                break;
            }
            mlen = rd32(buf + pos);
            pos += 4;
        }
        if (mlen == 0)
            break;
        if (mlen > len - pos) {
            rc = tio_fail(TIO_EPARSE, "%s: offset %zu: message metadata of %u bytes past the end",
                          name, start, mlen);
            break;
        }
        fb f = {buf + pos, mlen, name, pos};
        if (mlen < 4) {
            rc = fb_err(&f, 0, "message too short");
            break;
        }
        size_t msg = fb_deref(&f, 0);
        size_t ptype = msg == SIZE_MAX ? SIZE_MAX : fb_field(&f, msg, 1, 1);
        size_t phdr = ptype == SIZE_MAX ? SIZE_MAX : fb_field(&f, msg, 2, 4);
        size_t pbody = phdr == SIZE_MAX ? SIZE_MAX : fb_field(&f, msg, 3, 8);
        if (pbody == SIZE_MAX) {
            rc = TIO_EPARSE;
            break;
        }
        uint8_t type = ptype ? f.b[ptype] : 0;
        int64_t body_len = pbody ? (int64_t)rd64(f.b + pbody) : 0;
        size_t hdr = phdr ? fb_deref(&f, phdr) : SIZE_MAX;
        pos += mlen;
        if (body_len < 0 || (uint64_t)body_len > len - pos) {
            rc = tio_fail(TIO_EPARSE, "%s: offset %zu: message body of %lld bytes past the end",
                          name, start, (long long)body_len);
            break;
        }
        if (!phdr || hdr == SIZE_MAX) {
            rc = phdr ? TIO_EPARSE : fb_err(&f, 0, "message without header");
            break;
        }
        if (type == ARROW_MSG_SCHEMA) {
            if (schema.column >= 0) {
                rc = fb_err(&f, 0, "second schema message");
                break;
            }
            if ((rc = arrow_parse_schema(&f, hdr, column, &schema)) != 0)
                break;
        } else if (type == ARROW_MSG_BATCH) {
            if (schema.column < 0) {
                rc = fb_err(&f, 0, "record batch before the schema");
                break;
            }
            if ((rc = tio_grow((void **)&out->batches, &cap, out->n_batches + 1,
                               sizeof *out->batches)) != 0)
                break;
            if ((rc = arrow_parse_batch(&f, hdr, &schema, pos, (uint64_t)body_len,
                                        &out->batches[out->n_batches])) != 0)
                break;
            out->n_batches++;
        } else if (type == ARROW_MSG_DICT) {
            rc = fb_err(&f, 0, "dictionary batches are not supported");
            break;
        } else {
            rc = fb_err(&f, 0, "unexpected message type (expected schema or record batch)");
            break;
        }
        pos += (size_t)body_len;
    }
    if (!rc && schema.column < 0)
        rc = tio_fail(TIO_EPARSE, "%s: no schema message (not an Arrow IPC file?)", name);
    if (rc) {
        tio_arrow_index_free(out);
        return rc;
    }
    out->width = schema.width;
    out->is_signed = schema.is_signed;
    return 0;
}

/* ---- operations of the token formats ----------------------------------------
 * Token files are memory-mapped and read in place; their document tables
 * come from the parsers above. */

int tio_data_map(const char *path, uint8_t **map, size_t *len)
{
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return tio_fail(-errno, "%s: cannot open: %s", path, strerror(errno));
    struct stat st;
    if (fstat(fd, &st) != 0) {
        int e = errno;
        close(fd);
        return tio_fail(-e, "%s: cannot stat: %s", path, strerror(e));
    }
    *len = (size_t)st.st_size;
    *map = NULL;
    if (*len) {
        void *p = mmap(NULL, *len, PROT_READ, MAP_SHARED, fd, 0);
        if (p == MAP_FAILED) {
            int e = errno;
            close(fd);
            return tio_fail(-e, "%s: cannot map: %s", path, strerror(e));
        }
        *map = p;
    }
    close(fd);
    return 0;
}

static void unmap(tio_data_file *f)
{
    if (f->map)
        munmap(f->map, f->map_len);
    if (f->idx_map)
        munmap(f->idx_map, f->idx_len);
    f->map = f->idx_map = NULL;
}

/* Convert `n` values of Megatron dtype `code` at `p` to ids. */
static int convert(const uint8_t *p, int code, uint64_t n, uint32_t *dst, const char *rel,
                   uint64_t doc)
{
    if (code == 8) { /* unsigned: every value is an id */
        for (uint64_t i = 0; i < n; i++)
            dst[i] = rd16(p + 2 * i);
        return 0;
    }
    if (code == 1) {
        for (uint64_t i = 0; i < n; i++)
            dst[i] = p[i];
        return 0;
    }
    if (code == 4) { /* copy and check the sign bits in one pass */
        uint32_t neg = 0;
        for (uint64_t i = 0; i < n; i++) {
            uint32_t x = rd32(p + 4 * i);
            neg |= x;
            dst[i] = x;
        }
        if (!(neg >> 31))
            return 0;
    }
    for (uint64_t i = 0; i < n; i++) {
        int64_t v;
        double d = 0;
        bool is_float = false;
        switch (code) {
        case 1: v = p[i]; break;
        case 2: v = (int8_t)p[i]; break;
        case 3: v = (int16_t)rd16(p + 2 * i); break;
        case 4: v = (int32_t)rd32(p + 4 * i); break;
        case 5: v = (int64_t)rd64(p + 8 * i); break;
        case 6: { memcpy(&d, p + 8 * i, 8); is_float = true; v = 0; break; }
        case 7: { float x; memcpy(&x, p + 4 * i, 4); d = x; is_float = true; v = 0; break; }
        default: v = rd16(p + 2 * i); break;
        }
        if (is_float) {
            if (!(d >= 0 && d <= 4294967295.0) || d != (double)(int64_t)d)
                return tio_fail(TIO_EPARSE, "%s: document %llu: token %g is not an id", rel,
                                (unsigned long long)doc, d);
            v = (int64_t)d;
        }
        if (v < 0 || v > (int64_t)UINT32_MAX)
            return tio_fail(TIO_EPARSE, "%s: document %llu: token %lld is not an id", rel,
                            (unsigned long long)doc, (long long)v);
        dst[i] = (uint32_t)v;
    }
    return 0;
}

static uint64_t megatron_doc_len(const tio_data_file *f, uint64_t doc)
{
    uint64_t a = tio_mmidx_u64(f->idx.doc_index, doc), b = tio_mmidx_u64(f->idx.doc_index, doc + 1);
    uint64_t t = 0;
    for (uint64_t s = a; s < b; s++)
        t += tio_mmidx_u32(f->idx.lengths, s);
    return t;
}

/* Megatron: the .bin mapped, the .idx mapped and parsed. */
static int megatron_open(tio_dataset *ds, tio_data_file *f)
{
    (void)ds;
    int rc = tio_data_map(f->path, &f->map, &f->map_len);
    if (rc)
        return rc;
    char *idx = strdup(f->path);
    if (!idx)
        return tio_fail(-ENOMEM, "out of memory");
    memcpy(idx + strlen(idx) - 4, ".idx", 4);
    rc = tio_data_map(idx, &f->idx_map, &f->idx_len);
    free(idx);
    if (rc)
        return rc;
    char name[4096];
    snprintf(name, sizeof name, "%.*s.idx", (int)(strlen(f->rel) - 4), f->rel);
    if ((rc = tio_mmidx_parse(f->idx_map, f->idx_len, f->map_len, name, &f->idx)) != 0)
        return rc;
    f->n_docs = f->idx.n_docs;
    uint64_t tok = 0;
    for (uint64_t i = 0; i < f->idx.n_seqs; i++)
        tok += tio_mmidx_u32(f->idx.lengths, i);
    f->n_tokens = tok;
    for (uint64_t d = 0; d < f->n_docs; d++)
        f->n_empty += megatron_doc_len(f, d) == 0;
    return 0;
}

static const uint8_t *megatron_doc_addr(const tio_data_file *f, uint64_t doc, uint64_t off)
{
    uint64_t s = tio_mmidx_u64(f->idx.doc_index, doc);
    if (s >= f->idx.n_seqs)
        return NULL;
    return f->map + tio_mmidx_u64(f->idx.pointers, s) +
           off * (uint64_t)tio_mmidx_dtype_size(f->idx.dtype);
}

static int megatron_doc_read(const tio_data_file *f, uint64_t doc, uint64_t off, uint64_t n,
                             uint32_t *dst)
{
    int w = tio_mmidx_dtype_size(f->idx.dtype);
    uint64_t a = tio_mmidx_u64(f->idx.doc_index, doc), b = tio_mmidx_u64(f->idx.doc_index, doc + 1);
    for (uint64_t s = a; s < b && n; s++) {
        uint64_t l = tio_mmidx_u32(f->idx.lengths, s);
        if (off >= l) {
            off -= l;
            continue;
        }
        uint64_t take = l - off < n ? l - off : n;
        const uint8_t *p = f->map + tio_mmidx_u64(f->idx.pointers, s) + off * (uint64_t)w;
        int rc = convert(p, f->idx.dtype, take, dst, f->rel, doc);
        if (rc)
            return rc;
        dst += take;
        n -= take;
        off = 0;
    }
    return 0;
}

/* llm.c: document boundaries are the runs between delimiter tokens. */
static int llmc_index(tio_data_file *f, uint64_t n_tok, uint32_t delim)
{
    const uint8_t *t = f->map + 1024;
    uint32_t cap = 0, n = 0;
    uint64_t start = 0;
    for (uint64_t i = 0; i <= n_tok; i++) {
        uint32_t v = i == n_tok ? 0 : f->width == 2 ? rd16(t + 2 * i) : rd32(t + 4 * i);
        if (i == n_tok || v == delim) {
            if (i > start) {
                if ((uint64_t)n + 2 > UINT32_MAX)
                    return tio_fail(-EOVERFLOW, "%s: too many documents", f->rel);
                int rc = tio_grow((void **)&f->doc_starts, &cap, n + 2, sizeof *f->doc_starts);
                if (rc)
                    return rc;
                f->doc_starts[n++] = start;
                f->doc_starts[n++] = i;
            }
            start = i + 1;
        }
    }
    f->n_docs = n / 2;
    f->n_tokens = n_tok;
    return 0;
}

static int llmc_open(tio_dataset *ds, tio_data_file *f)
{
    int rc = tio_data_map(f->path, &f->map, &f->map_len);
    if (rc)
        return rc;
    uint64_t n_tok;
    uint32_t delim;
    if ((rc = tio_llmc_parse_header(f->map, f->map_len, f->rel, &f->width, &n_tok, &delim)) != 0)
        return rc;
    if (ds->opts.llmc_delimiter >= 0)
        delim = (uint32_t)ds->opts.llmc_delimiter;
    return llmc_index(f, n_tok, delim);
}

static void llmc_close(tio_data_file *f)
{
    unmap(f);
    free(f->doc_starts);
    f->doc_starts = NULL;
}

static uint64_t llmc_doc_len(const tio_data_file *f, uint64_t doc)
{
    return f->doc_starts[2 * doc + 1] - f->doc_starts[2 * doc];
}

static const uint8_t *llmc_doc_addr(const tio_data_file *f, uint64_t doc, uint64_t off)
{
    return f->map + 1024 + (f->doc_starts[2 * doc] + off) * (uint64_t)f->width;
}

static int llmc_doc_read(const tio_data_file *f, uint64_t doc, uint64_t off, uint64_t n,
                         uint32_t *dst)
{
    const uint8_t *p = llmc_doc_addr(f, doc, off);
    if (f->width == 4) {
        memcpy(dst, p, n * 4);
    } else {
        for (uint64_t i = 0; i < n; i++)
            dst[i] = rd16(p + 2 * i);
    }
    return 0;
}

/* Arrow IPC: one record batch per document. */
static int arrow_open(tio_dataset *ds, tio_data_file *f)
{
    (void)ds;
    int rc = tio_data_map(f->path, &f->map, &f->map_len);
    if (rc)
        return rc;
    if ((rc = tio_arrow_parse(f->map, f->map_len, "tokens", f->rel, &f->arrow)) != 0)
        return rc;
    f->n_docs = f->arrow.n_batches;
    uint64_t tok = 0;
    for (uint32_t i = 0; i < f->arrow.n_batches; i++) {
        tok += f->arrow.batches[i].count;
        f->n_empty += f->arrow.batches[i].count == 0;
    }
    f->n_tokens = tok;
    return 0;
}

static void arrow_close(tio_data_file *f)
{
    unmap(f);
    tio_arrow_index_free(&f->arrow);
}

static uint64_t arrow_doc_len(const tio_data_file *f, uint64_t doc)
{
    return f->arrow.batches[doc].count;
}

static const uint8_t *arrow_doc_addr(const tio_data_file *f, uint64_t doc, uint64_t off)
{
    return f->map + f->arrow.batches[doc].offset + off * (uint64_t)f->arrow.width;
}

static int arrow_doc_read(const tio_data_file *f, uint64_t doc, uint64_t off, uint64_t n,
                          uint32_t *dst)
{
    int w = f->arrow.width;
    const uint8_t *p = arrow_doc_addr(f, doc, off);
    if (w == 4 && !f->arrow.is_signed) {
        memcpy(dst, p, n * 4);
        return 0;
    }
    if (w == 8 && !f->arrow.is_signed) {
        for (uint64_t i = 0; i < n; i++) {
            uint64_t x = rd64(p + 8 * i);
            if (x > UINT32_MAX)
                return tio_fail(TIO_EPARSE, "%s: document %llu: token %llu is not an id", f->rel,
                                (unsigned long long)doc, (unsigned long long)x);
            dst[i] = (uint32_t)x;
        }
        return 0;
    }
    /* Megatron codes of the same layout: 1 u8, 2 i8, 3 i16, 8 u16, 4 i32, 5 i64 */
    int code = w == 1 ? (f->arrow.is_signed ? 2 : 1) : w == 2 ? (f->arrow.is_signed ? 3 : 8)
             : w == 4 ? 4 : 5;
    return convert(p, code, n, dst, f->rel, doc);
}

const tio_data_format tio_format_megatron = {"Megatron", megatron_open, unmap, megatron_doc_len,
                                             megatron_doc_addr, megatron_doc_read, NULL, NULL};
const tio_data_format tio_format_llmc = {"llm.c", llmc_open, llmc_close, llmc_doc_len,
                                         llmc_doc_addr, llmc_doc_read, NULL, NULL};
const tio_data_format tio_format_arrow = {"Arrow", arrow_open, arrow_close, arrow_doc_len,
                                          arrow_doc_addr, arrow_doc_read, NULL, NULL};

const tio_data_format *tio_data_format_of(int format)
{
    static const tio_data_format *const table[FMT_COUNT] = {
        [FMT_MEGATRON] = &tio_format_megatron, [FMT_LLMC] = &tio_format_llmc,
        [FMT_ARROW] = &tio_format_arrow, [FMT_JSONL] = &tio_format_jsonl,
        [FMT_PARQUET] = &tio_format_parquet};
    return table[format];
}
