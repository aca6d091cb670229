/*
 * data/parquet_shim.cc — libteraio_parquet: Parquet files read through
 * Apache Arrow's libparquet (never a decoder of our own), behind the C
 * interface of parquet_shim.h.
 *
 * Why a shim loaded by dlopen: libparquet is C++ and comes with pyarrow's
 * wheel (headers and libraries under pyarrow.get_include() and
 * get_library_dirs()); Debian packages none.  Built as its own library
 * against them, it keeps the C core free of any Arrow dependency and lets
 * the C threads of the loader read Parquet without Python or its GIL.
 *
 * A file's footer is parsed once, at open; each reader of a row group's rows
 * (tio_pq_rows) opens its own file reader over that footer (no shared
 * mutable state), single-threaded (use_threads off), and decodes a batch of
 * rows at a time, so several loader threads may read at once and none holds
 * more than the rows it was asked for.  Arrow
 * errors (a truncated file, a footer that lies, a bad page) come back as
 * TIO_EPARSE with Arrow's message, prefixed by file, row group and column.
 */
#include "data/parquet_shim.h"

#include <arrow/api.h>
#include <arrow/io/api.h>
#include <parquet/arrow/reader.h>
#include <parquet/arrow/schema.h>
#include <parquet/exception.h>
#include <parquet/file_reader.h>
#include <parquet/metadata.h>

#include <algorithm>
#include <cerrno>
#include <cstdarg>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <type_traits>
#include <vector>

namespace {

constexpr int kParseError = -5001; /* TIO_EPARSE */

struct Handle {
    std::string path, name;
    std::shared_ptr<arrow::Buffer> buffer; /* a file in memory (fuzzing) */
    std::shared_ptr<parquet::FileMetaData> meta;
    std::vector<int> leaves; /* Parquet leaf columns of the column read */
    int field = -1;          /* its index among the top-level fields */
    int kind = 0;
    std::string column;
};

int fail(char *err, size_t cap, int code, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    if (cap)
        vsnprintf(err, cap, fmt, ap);
    va_end(ap);
    /* One line: Arrow's messages span several ("...\nIn ../src/..."). */
    if (cap) {
        std::string line;
        for (const char *c = err; *c; c++) {
            if (*c != '\n' && *c != '\r')
                line += *c;
            else if (c[1] && c[1] != '\n' && c[1] != '\r')
                line += "; ";
        }
        snprintf(err, cap, "%s", line.c_str());
    }
    return code;
}

arrow::Result<std::shared_ptr<arrow::io::RandomAccessFile>> source(const Handle &h)
{
    if (h.buffer)
        return std::make_shared<arrow::io::BufferReader>(h.buffer);
    ARROW_ASSIGN_OR_RAISE(auto f, arrow::io::ReadableFile::Open(h.path));
    return std::static_pointer_cast<arrow::io::RandomAccessFile>(f);
}

void collect_leaves(const parquet::arrow::SchemaField &f, std::vector<int> *out)
{
    if (f.column_index >= 0)
        out->push_back(f.column_index);
    for (const auto &c : f.children)
        collect_leaves(c, out);
}

/* Which column to read, and as what. */
int choose_column(Handle *h, const parquet::arrow::FileReader &r, const char *text_column,
                  char *err, size_t cap)
{
    const auto &fields = r.manifest().schema_fields;
    auto find = [&](const char *name) -> int {
        for (size_t i = 0; i < fields.size(); i++)
            if (fields[i].field->name() == name)
                return (int)i;
        return -1;
    };
    int t = find(text_column);
    if (t >= 0) {
        auto type = fields[t].field->type();
        if (type->id() == arrow::Type::DICTIONARY) /* a pandas categorical: its values' type */
            type = static_cast<const arrow::DictionaryType &>(*type).value_type();
        auto id = type->id();
        if (id != arrow::Type::STRING && id != arrow::Type::LARGE_STRING &&
            id != arrow::Type::STRING_VIEW)
            return fail(err, cap, kParseError, "%s: column '%s' is %s, not a string", h->name.c_str(),
                        text_column, fields[t].field->type()->ToString().c_str());
        h->field = t;
        h->kind = TIO_PQ_TEXT;
        h->column = text_column;
    } else {
        for (const char *name : {"tokens", "input_ids"}) {
            int k = find(name);
            if (k < 0)
                continue;
            const auto &type = *fields[k].field->type();
            bool list = type.id() == arrow::Type::LIST || type.id() == arrow::Type::LARGE_LIST;
            if (!list || !arrow::is_integer(type.field(0)->type()->id()))
                return fail(err, cap, kParseError, "%s: column '%s' is %s, not a list of integers",
                            h->name.c_str(), name, type.ToString().c_str());
            h->field = k;
            h->kind = TIO_PQ_TOKENS;
            h->column = name;
            break;
        }
        if (h->field < 0)
            return fail(err, cap, kParseError, "%s: no column '%s' (text) nor 'tokens' or "
                        "'input_ids' (lists of token ids)", h->name.c_str(), text_column);
    }
    collect_leaves(fields[h->field], &h->leaves);
    return 0;
}

int pq_open(const char *path, const void *buf, size_t len, const char *name,
            const char *text_column, tio_pq **out, tio_pq_meta *meta, char *err, size_t cap)
{
    *out = nullptr;
    try {
        auto h = std::make_unique<Handle>();
        h->path = path ? path : "";
        h->name = name;
        if (buf)
            h->buffer = std::make_shared<arrow::Buffer>(static_cast<const uint8_t *>(buf),
                                                        (int64_t)len);
        auto src = source(*h);
        if (!src.ok())
            return fail(err, cap, -ENOENT, "%s: cannot open: %s", name,
                        src.status().message().c_str());
        std::unique_ptr<parquet::ParquetFileReader> pf;
        pf = parquet::ParquetFileReader::Open(*src);
        h->meta = pf->metadata();
        parquet::ArrowReaderProperties aprops;
        aprops.set_use_threads(false);
        auto r = parquet::arrow::FileReader::Make(arrow::default_memory_pool(), std::move(pf),
                                                  aprops);
        if (!r.ok())
            return fail(err, cap, kParseError, "%s: %s", name, r.status().message().c_str());
        int rc = choose_column(h.get(), **r, text_column, err, cap);
        if (rc)
            return rc;
        int64_t rows = 0;
        for (int g = 0; g < h->meta->num_row_groups(); g++) {
            int64_t n = h->meta->RowGroup(g)->num_rows();
            if (n < 0)
                return fail(err, cap, kParseError, "%s: row group %d: %lld rows in the footer",
                            name, g, (long long)n);
            rows += n;
        }
        if (rows != h->meta->num_rows())
            return fail(err, cap, kParseError, "%s: the footer says %lld rows, its row groups "
                        "hold %lld", name, (long long)h->meta->num_rows(), (long long)rows);
        meta->n_rows = rows;
        meta->n_row_groups = h->meta->num_row_groups();
        meta->kind = h->kind;
        snprintf(meta->column, sizeof meta->column, "%s", h->column.c_str());
        *out = reinterpret_cast<tio_pq *>(h.release());
        return 0;
    } catch (const std::bad_alloc &) {
        return fail(err, cap, -ENOMEM, "%s: out of memory", name);
    } catch (const std::exception &e) {
        return fail(err, cap, kParseError, "%s: %s", name, e.what());
    }
}

int64_t row_group_rows(const tio_pq *f, int32_t rg)
{
    const Handle *h = reinterpret_cast<const Handle *>(f);
    return rg >= 0 && rg < h->meta->num_row_groups() ? h->meta->RowGroup(rg)->num_rows() : -1;
}

void column_free(tio_pq_column *c)
{
    free(c->offsets);
    free(c->data);
    free(c->valid);
    memset(c, 0, sizeof *c);
}

/* Text rows of one chunk appended at row `at`. */
template <typename A>
int append_text(const Handle &h, int rg, int64_t base, const A &a, int64_t at, uint64_t max_bytes,
                std::string *data, tio_pq_column *out, char *err, size_t cap)
{
    for (int64_t i = 0; i < a.length(); i++) {
        int64_t row = at + i;
        out->valid[row] = !a.IsNull(i);
        if (out->valid[row]) {
            auto v = a.GetView(i);
            if (v.size() > max_bytes)
                return fail(err, cap, kParseError, "%s: row group %d, row %lld: column '%s' holds "
                            "%zu bytes, more than the limit of %llu (max_line_bytes)",
                            h.name.c_str(), rg, (long long)(base + row), h.column.c_str(), v.size(),
                            (unsigned long long)max_bytes);
            data->append(v.data(), v.size());
        }
        out->offsets[row + 1] = (int64_t)data->size();
    }
    return 0;
}

/* Text rows of a dictionary-typed chunk (a pandas categorical) appended at
 * row `at`: each row is its index's value of the dictionary. */
template <typename A>
int append_dict_text(const Handle &h, int rg, int64_t base, const arrow::DictionaryArray &a,
                     const A &dict, int64_t at, uint64_t max_bytes, std::string *data,
                     tio_pq_column *out, char *err, size_t cap)
{
    for (int64_t i = 0; i < a.length(); i++) {
        int64_t row = at + i;
        out->valid[row] = !a.IsNull(i);
        if (out->valid[row]) {
            int64_t k = a.GetValueIndex(i);
            if (k < 0 || k >= dict.length() || dict.IsNull(k)) {
                out->valid[row] = 0;
            } else {
                auto v = dict.GetView(k);
                if (v.size() > max_bytes)
                    return fail(err, cap, kParseError, "%s: row group %d, row %lld: column '%s' holds "
                                "%zu bytes, more than the limit of %llu (max_line_bytes)",
                                h.name.c_str(), rg, (long long)(base + row), h.column.c_str(),
                                v.size(), (unsigned long long)max_bytes);
                data->append(v.data(), v.size());
            }
        }
        out->offsets[row + 1] = (int64_t)data->size();
    }
    return 0;
}

/* Token rows of one list chunk appended at row `at`, its values of type V. */
template <typename L, typename V>
int append_ids(const Handle &h, int rg, int64_t base, const L &a, const V &values, int64_t at,
               std::vector<uint32_t> *ids, tio_pq_column *out, char *err, size_t cap)
{
    for (int64_t i = 0; i < a.length(); i++) {
        int64_t row = at + i;
        out->valid[row] = !a.IsNull(i);
        for (int64_t k = a.value_offset(i); out->valid[row] && k < a.value_offset(i + 1); k++) {
            if (values.IsNull(k))
                return fail(err, cap, kParseError, "%s: row group %d, row %lld: column '%s' has a "
                            "null token", h.name.c_str(), rg, (long long)(base + row),
                            h.column.c_str());
            auto x = values.Value(k);
            bool bad = (uint64_t)x > UINT32_MAX;
            if constexpr (std::is_signed_v<decltype(x)>)
                bad = x < 0 || (int64_t)x > (int64_t)UINT32_MAX;
            if (bad && std::is_signed_v<decltype(x)>)
                return fail(err, cap, kParseError, "%s: row group %d, row %lld: column '%s': "
                            "token %lld is not an id", h.name.c_str(), rg, (long long)(base + row),
                            h.column.c_str(), (long long)x);
            if (bad)
                return fail(err, cap, kParseError, "%s: row group %d, row %lld: column '%s': "
                            "token %llu is not an id", h.name.c_str(), rg, (long long)(base + row),
                            h.column.c_str(), (unsigned long long)x);
            ids->push_back((uint32_t)x);
        }
        out->offsets[row + 1] = (int64_t)ids->size();
    }
    return 0;
}

template <typename L>
int append_tokens(const Handle &h, int rg, int64_t base, const L &a, int64_t at,
                  std::vector<uint32_t> *ids, tio_pq_column *out, char *err, size_t cap)
{
    const arrow::Array &v = *a.values();
#define TIO_PQ_IDS(T, A) \
    case arrow::Type::T: \
        return append_ids(h, rg, base, a, static_cast<const arrow::A &>(v), at, ids, out, err, cap);
    switch (v.type_id()) {
        TIO_PQ_IDS(INT8, Int8Array)
        TIO_PQ_IDS(UINT8, UInt8Array)
        TIO_PQ_IDS(INT16, Int16Array)
        TIO_PQ_IDS(UINT16, UInt16Array)
        TIO_PQ_IDS(INT32, Int32Array)
        TIO_PQ_IDS(UINT32, UInt32Array)
        TIO_PQ_IDS(INT64, Int64Array)
        TIO_PQ_IDS(UINT64, UInt64Array)
    default:
        return fail(err, cap, kParseError, "%s: row group %d: column '%s' holds %s, not integers",
                    h.name.c_str(), rg, h.column.c_str(), v.type()->ToString().c_str());
    }
#undef TIO_PQ_IDS
}

int64_t row_group_bytes(const tio_pq *f, int32_t rg)
{
    const Handle *h = reinterpret_cast<const Handle *>(f);
    if (rg < 0 || rg >= h->meta->num_row_groups())
        return -1;
    auto g = h->meta->RowGroup(rg);
    int64_t bytes = 0;
    for (int leaf : h->leaves)
        bytes += std::max<int64_t>(0, g->ColumnChunk(leaf)->total_uncompressed_size());
    return bytes;
}

} // namespace

/* A row group's column read a batch at a time: the FileReader must outlive
 * its RecordBatchReader; `pending` is the batch being handed out, from row
 * `pos` of it. */
struct tio_pq_rows {
    Handle *h;
    int rg;
    int64_t rows;   /* the footer's */
    int64_t at = 0; /* rows handed out or skipped */
    std::unique_ptr<parquet::arrow::FileReader> file;
    std::unique_ptr<arrow::RecordBatchReader> batches;
    std::shared_ptr<arrow::Array> pending;
    int64_t pos = 0;
};

namespace {

int rows_open(tio_pq *f, int32_t rg, int64_t batch_rows, tio_pq_rows **out, char *err, size_t cap)
{
    Handle &h = *reinterpret_cast<Handle *>(f);
    *out = nullptr;
    try {
        if (rg < 0 || rg >= h.meta->num_row_groups())
            return fail(err, cap, -EINVAL, "%s: row group %d out of range", h.name.c_str(), rg);
        auto src = source(h);
        if (!src.ok())
            return fail(err, cap, -ENOENT, "%s: cannot open: %s", h.name.c_str(),
                        src.status().message().c_str());
        std::unique_ptr<parquet::ParquetFileReader> pf;
        try {
            pf = parquet::ParquetFileReader::Open(*src, parquet::default_reader_properties(), h.meta);
        } catch (const parquet::ParquetException &e) {
            return fail(err, cap, kParseError, "%s: row group %d: %s", h.name.c_str(), rg, e.what());
        }
        parquet::ArrowReaderProperties aprops;
        aprops.set_use_threads(false);
        aprops.set_batch_size(std::max<int64_t>(1, batch_rows));
        auto file = parquet::arrow::FileReader::Make(arrow::default_memory_pool(), std::move(pf),
                                                     aprops);
        if (!file.ok())
            return fail(err, cap, kParseError, "%s: row group %d: %s", h.name.c_str(), rg,
                        file.status().message().c_str());
        auto r = std::make_unique<tio_pq_rows>();
        r->h = &h;
        r->rg = rg;
        r->rows = h.meta->RowGroup(rg)->num_rows();
        r->file = std::move(*file);
        auto batches = r->file->GetRecordBatchReader({rg}, h.leaves);
        if (!batches.ok())
            return fail(err, cap, kParseError, "%s: row group %d, column '%s': %s", h.name.c_str(),
                        rg, h.column.c_str(), batches.status().message().c_str());
        r->batches = std::move(*batches);
        *out = r.release();
        return 0;
    } catch (const std::bad_alloc &) {
        return fail(err, cap, -ENOMEM, "%s: row group %d: out of memory", h.name.c_str(), rg);
    } catch (const std::exception &e) {
        return fail(err, cap, kParseError, "%s: row group %d, column '%s': %s", h.name.c_str(), rg,
                    h.column.c_str(), e.what());
    }
}

/* The batch rows are handed out from, read if the last one is used up;
 * false at the end of the row group's pages. */
int next_pending(tio_pq_rows *r, bool *more, char *err, size_t cap)
{
    const Handle &h = *r->h;
    *more = true;
    if (r->pending && r->pos < r->pending->length())
        return 0;
    std::shared_ptr<arrow::RecordBatch> b;
    auto st = r->batches->ReadNext(&b);
    if (!st.ok())
        return fail(err, cap, kParseError, "%s: row group %d, column '%s': %s", h.name.c_str(),
                    r->rg, h.column.c_str(), st.message().c_str());
    r->pending = b ? b->column(0) : nullptr;
    r->pos = 0;
    *more = r->pending && r->pending->length() > 0;
    return 0;
}

int rows_skip(tio_pq_rows *r, int64_t n, char *err, size_t cap)
{
    try {
        while (n > 0) {
            bool more;
            if (int rc = next_pending(r, &more, err, cap))
                return rc;
            if (!more)
                return fail(err, cap, kParseError, "%s: row group %d, column '%s': the footer says "
                            "%lld rows, the pages hold %lld", r->h->name.c_str(), r->rg,
                            r->h->column.c_str(), (long long)r->rows, (long long)r->at);
            int64_t take = std::min(n, r->pending->length() - r->pos);
            r->pos += take;
            r->at += take;
            n -= take;
        }
        return 0;
    } catch (const std::bad_alloc &) {
        return fail(err, cap, -ENOMEM, "%s: row group %d: out of memory", r->h->name.c_str(), r->rg);
    } catch (const std::exception &e) {
        return fail(err, cap, kParseError, "%s: row group %d, column '%s': %s", r->h->name.c_str(),
                    r->rg, r->h->column.c_str(), e.what());
    }
}

/* Rows [at, at + a.length()) of the output from array `a`. */
int append(const tio_pq_rows &r, const arrow::Array &a, int64_t base, int64_t at,
           uint64_t max_value, std::string *text, std::vector<uint32_t> *ids, tio_pq_column *out,
           char *err, size_t cap)
{
    const Handle &h = *r.h;
    switch (a.type_id()) {
    case arrow::Type::STRING:
        return append_text(h, r.rg, base, static_cast<const arrow::StringArray &>(a), at, max_value,
                           text, out, err, cap);
    case arrow::Type::LARGE_STRING:
        return append_text(h, r.rg, base, static_cast<const arrow::LargeStringArray &>(a), at,
                           max_value, text, out, err, cap);
    case arrow::Type::STRING_VIEW:
        return append_text(h, r.rg, base, static_cast<const arrow::StringViewArray &>(a), at,
                           max_value, text, out, err, cap);
    case arrow::Type::DICTIONARY: {
        const auto &d = static_cast<const arrow::DictionaryArray &>(a);
        const arrow::Array &dict = *d.dictionary();
        switch (dict.type_id()) {
        case arrow::Type::STRING:
            return append_dict_text(h, r.rg, base, d, static_cast<const arrow::StringArray &>(dict),
                                    at, max_value, text, out, err, cap);
        case arrow::Type::LARGE_STRING:
            return append_dict_text(h, r.rg, base, d,
                                    static_cast<const arrow::LargeStringArray &>(dict), at,
                                    max_value, text, out, err, cap);
        default:
            break;
        }
        break;
    }
    case arrow::Type::LIST:
        return append_tokens(h, r.rg, base, static_cast<const arrow::ListArray &>(a), at, ids, out,
                             err, cap);
    case arrow::Type::LARGE_LIST:
        return append_tokens(h, r.rg, base, static_cast<const arrow::LargeListArray &>(a), at, ids,
                             out, err, cap);
    default:
        break;
    }
    return fail(err, cap, kParseError, "%s: row group %d, column '%s': unexpected type %s",
                h.name.c_str(), r.rg, h.column.c_str(), a.type()->ToString().c_str());
}

int rows_read(tio_pq_rows *r, int64_t n, uint64_t max_value, uint64_t max_bytes,
              tio_pq_column *out, char *err, size_t cap)
{
    const Handle &h = *r->h;
    const char *name = h.name.c_str(), *col = h.column.c_str();
    memset(out, 0, sizeof *out);
    try {
        out->n_rows = n;
        out->offsets = static_cast<int64_t *>(calloc((size_t)n + 1, sizeof *out->offsets));
        out->valid = static_cast<uint8_t *>(calloc((size_t)n + 1, 1));
        if (!out->offsets || !out->valid) {
            column_free(out);
            return fail(err, cap, -ENOMEM, "%s: row group %d: out of memory", name, r->rg);
        }
        std::string text;
        std::vector<uint32_t> ids;
        int64_t base = r->at, got = 0;
        int rc = 0;
        while (!rc && got < n) {
            bool more;
            if ((rc = next_pending(r, &more, err, cap)))
                break;
            if (!more) {
                rc = fail(err, cap, kParseError, "%s: row group %d, column '%s': the footer says "
                          "%lld rows, the pages hold %lld", name, r->rg, col, (long long)r->rows,
                          (long long)r->at);
                break;
            }
            int64_t take = std::min(n - got, r->pending->length() - r->pos);
            rc = append(*r, *r->pending->Slice(r->pos, take), base, got, max_value, &text, &ids, out,
                        err, cap);
            r->pos += take;
            r->at += take;
            got += take;
            size_t bytes = h.kind == TIO_PQ_TEXT ? text.size() : ids.size() * sizeof(uint32_t);
            if (!rc && bytes > max_bytes)
                rc = fail(err, cap, kParseError, "%s: row group %d, rows %lld to %lld: column '%s' "
                          "holds more than %llu bytes, the most one window may decode (the footer "
                          "declared %lld bytes for the row group; rewrite the file with smaller "
                          "row groups, or raise cache_bytes)", name, r->rg, (long long)base,
                          (long long)(r->at - 1), col, (unsigned long long)max_bytes,
                          (long long)row_group_bytes(reinterpret_cast<tio_pq *>(r->h), r->rg));
        }
        if (!rc && r->at == r->rows) { /* the last row: the pages must end here too */
            bool more;
            if (!(rc = next_pending(r, &more, err, cap)) && more)
                rc = fail(err, cap, kParseError, "%s: row group %d, column '%s': the footer says "
                          "%lld rows, the pages hold more", name, r->rg, col, (long long)r->rows);
        }
        if (rc) {
            column_free(out);
            return rc;
        }
        size_t bytes = h.kind == TIO_PQ_TEXT ? text.size() : ids.size() * sizeof(uint32_t);
        out->data = malloc(bytes ? bytes : 1);
        if (!out->data) {
            column_free(out);
            return fail(err, cap, -ENOMEM, "%s: row group %d: out of memory", name, r->rg);
        }
        if (bytes)
            memcpy(out->data, h.kind == TIO_PQ_TEXT ? (const void *)text.data()
                                                    : (const void *)ids.data(), bytes);
        return 0;
    } catch (const std::bad_alloc &) {
        column_free(out);
        return fail(err, cap, -ENOMEM, "%s: row group %d: out of memory", name, r->rg);
    } catch (const std::exception &e) {
        column_free(out);
        return fail(err, cap, kParseError, "%s: row group %d, column '%s': %s", name, r->rg, col,
                    e.what());
    }
}

void rows_close(tio_pq_rows *r)
{
    delete r;
}

void pq_close(tio_pq *f)
{
    delete reinterpret_cast<Handle *>(f);
}

const tio_pq_api api = {TIO_PQ_ABI,   ARROW_VERSION_STRING, pq_open,    row_group_rows,
                        row_group_bytes, rows_open,       rows_skip,  rows_read,
                        rows_close,   column_free,          pq_close};

} // namespace

extern "C" __attribute__((visibility("default"))) const tio_pq_api *tio_parquet_shim(void)
{
    return &api;
}
