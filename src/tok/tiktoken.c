/*
 * tok/tiktoken.c — tiktoken rank files and the built-in encodings.
 *
 * A rank file is text, one token per line: the token's bytes in standard
 * base64 (with padding), whitespace, its rank in decimal.  The rank is the
 * token id and the merge priority.  tiktoken reads it with
 * `dict(base64.b64decode(tok), int(rank))`; we are stricter and reject
 * what tiktoken would silently overwrite (a repeated token or rank) or
 * mis-decode (characters outside the base64 alphabet).
 *
 * The built-in table holds the split regex (pat_str), special tokens, rank
 * count and rank-file SHA-256 that tiktoken 0.x ships for each OpenAI
 * encoding (python/teraio/tokenizers/encodings.json; the hashes are
 * tiktoken's `expected_hash`).  The rank files themselves are read from
 * disk: a directory the caller names, $TERAIO_TOKENIZERS_DIR, tiktoken's own
 * download cache, or the copy shipped with teraio (python/teraio/tokenizers,
 * installed as <package>/tokenizers beside <package>/_lib and <package>/_bin).
 * Whichever is found is checked against its SHA-256 before it is parsed, so
 * every place gives the same ids or an error, never a different vocabulary.
 */
#include <dlfcn.h>
#include <errno.h>
#include <limits.h>
#include <openssl/evp.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

#include "common/util.h"
#include "tok/tok_internal.h"

/* ---- built-in encodings ------------------------------------------------- */

static const tio_tok_special r50k_specials[] = {{"<|endoftext|>", 50256}};
static const tio_tok_special cl100k_specials[] = {
    {"<|endoftext|>", 100257}, {"<|fim_prefix|>", 100258}, {"<|fim_middle|>", 100259},
    {"<|fim_suffix|>", 100260}, {"<|endofprompt|>", 100276},
};
static const tio_tok_special o200k_specials[] = {{"<|endoftext|>", 199999},
                                                 {"<|endofprompt|>", 200018}};

/* sha256: of the rank file, as tiktoken_ext/openai_public.py expects it.
 * cache_key: the name tiktoken gives the file in its download cache, the
 * SHA-1 of its URL https://openaipublic.blob.core.windows.net/encodings/<name>.tiktoken */
static const struct {
    const char *name;
    uint32_t n_ranks;
    const char *sha256;
    const char *cache_key;
    const char *pat_str;
    const tio_tok_special *specials;
    size_t n_specials;
} encodings[] = {
    {"r50k_base", 50256, "306cd27f03c1a714eca7108e03d66b7dc042abe8c258b44c199a7ed9838dd930",
     "0ea1e91bbb3a60f729a8dc8f777fd2fc07cd8df4", TOK_PATTERN_GPT2, r50k_specials, 1},
    {"p50k_base", 50280, "94b5ca7dff4d00767bc256fdd1b27e5b17361d7b8a5f968547f9f23eb70d2069",
     "ec7223a39ce59f226a68acc30dc1af2788490e15", TOK_PATTERN_GPT2, r50k_specials, 1},
    {"cl100k_base", 100256, "223921b76ee99bde995b7ff738513eef100fb51d18c93597a113bcffe865b2a7",
     "9b5ad71b2ce5302211f9c61530b329a4922fc6a4",
     TOK_PATTERN_CL100K, cl100k_specials, 5},
    {"o200k_base", 199998, "446a9538cb6c348e3516120d7c08b09f57c36495e2acfffe59a5bf8b0cfb1a2d",
     "fb374d419588a4632f3f557e76b4b70aebbca790",
     TOK_PATTERN_O200K, o200k_specials, 2},
};
#define N_ENCODINGS (sizeof encodings / sizeof encodings[0])

const char *tio_tok_encoding_name(size_t i) { return i < N_ENCODINGS ? encodings[i].name : NULL; }

/* ---- rank file parsing --------------------------------------------------- */

static int b64_value(uint8_t c)
{
    if (c >= 'A' && c <= 'Z')
        return c - 'A';
    if (c >= 'a' && c <= 'z')
        return c - 'a' + 26;
    if (c >= '0' && c <= '9')
        return c - '0' + 52;
    if (c == '+')
        return 62;
    if (c == '/')
        return 63;
    return -1;
}

/* Decode standard padded base64 s[0..n) into out (room for 3n/4 bytes).
 * Returns the byte count, or -1 if malformed. */
static long b64_decode(const uint8_t *s, size_t n, uint8_t *out)
{
    if (n % 4)
        return -1;
    size_t o = 0;
    for (size_t i = 0; i < n; i += 4) {
        int v[4], pad = 0;
        for (int k = 0; k < 4; k++) {
            if (s[i + k] == '=' && i + 4 == n && k >= 2) {
                v[k] = 0;
                pad++;
                continue;
            }
            if (pad)
                return -1; /* data after '=' */
            v[k] = b64_value(s[i + k]);
            if (v[k] < 0)
                return -1;
        }
        uint32_t w = (uint32_t)v[0] << 18 | (uint32_t)v[1] << 12 | (uint32_t)v[2] << 6 | (uint32_t)v[3];
        out[o++] = (uint8_t)(w >> 16);
        if (pad < 2)
            out[o++] = (uint8_t)(w >> 8);
        if (pad < 1)
            out[o++] = (uint8_t)w;
    }
    return (long)o;
}

typedef struct {
    uint32_t rank, off, len;
} rank_entry;

static int parse_ranks(tio_tok *tok, const uint8_t *data, size_t len, const char *where,
                       rank_entry **entries_out, uint32_t *n_out, uint32_t *max_rank)
{
    rank_entry *entries = NULL;
    uint32_t n = 0, cap = 0;
    uint8_t *buf = NULL;
    size_t buf_cap = 0;
    int rc = 0;
    size_t line = 0;
    *max_rank = 0;
    for (size_t pos = 0; pos < len && rc == 0;) {
        line++;
        const uint8_t *nl = memchr(data + pos, '\n', len - pos);
        size_t end = nl ? (size_t)(nl - data) : len;
        const uint8_t *s = data + pos, *e = data + end;
        pos = end + 1;
        while (e > s && (e[-1] == '\r' || e[-1] == ' ' || e[-1] == '\t'))
            e--;
        if (s == e)
            continue;
        const uint8_t *sp = s;
        while (sp < e && *sp != ' ' && *sp != '\t')
            sp++;
        const uint8_t *r = sp;
        while (r < e && (*r == ' ' || *r == '\t'))
            r++;
        if (sp == s || r == e || r == sp) {
            rc = tio_fail(TIO_EPARSE, "%s:%zu: expected '<base64 token> <rank>'", where, line);
            break;
        }
        uint64_t rank = 0;
        for (const uint8_t *d = r; d < e; d++) {
            if (*d < '0' || *d > '9' || rank >= TIO_TOK_MAX_IDS) {
                rc = tio_fail(TIO_EPARSE, "%s:%zu: rank: expected an integer below %u", where, line,
                              TIO_TOK_MAX_IDS);
                break;
            }
            rank = rank * 10 + (uint64_t)(*d - '0');
        }
        if (rc)
            break;
        if (rank >= TIO_TOK_MAX_IDS) {
            rc = tio_fail(TIO_EPARSE, "%s:%zu: rank: expected an integer below %u", where, line,
                          TIO_TOK_MAX_IDS);
            break;
        }
        size_t n64 = (size_t)(sp - s);
        if (buf_cap < n64) {
            uint8_t *b = realloc(buf, n64);
            if (!b) {
                rc = tio_fail(-ENOMEM, "out of memory reading %s", where);
                break;
            }
            buf = b;
            buf_cap = n64;
        }
        long nb = b64_decode(s, n64, buf);
        if (nb <= 0) {
            rc = tio_fail(TIO_EPARSE, "%s:%zu: token: expected non-empty padded base64", where, line);
            break;
        }
        if ((rc = tio_grow((void **)&entries, &cap, n + 1, sizeof *entries)) < 0)
            break;
        entries[n].rank = (uint32_t)rank;
        entries[n].len = (uint32_t)nb;
        if ((rc = tok_arena_add(tok, buf, (size_t)nb, &entries[n].off)) < 0) {
            char at[64];
            snprintf(at, sizeof at, ":%zu", line);
            rc = tok_fail_at(rc, where, at);
            break;
        }
        if (rank > *max_rank)
            *max_rank = (uint32_t)rank;
        n++;
        if (n == UINT32_MAX)
            rc = tio_fail(-E2BIG, "%s: too many lines", where);
    }
    free(buf);
    if (rc == 0 && n == 0)
        rc = tio_fail(TIO_EPARSE, "%s: no tokens", where);
    if (rc) {
        free(entries);
        return rc;
    }
    *entries_out = entries;
    *n_out = n;
    return 0;
}

static int build_tiktoken(tio_tok *tok, const uint8_t *data, size_t len, const char *where,
                          const char *pat_str, const tio_tok_special *specials, size_t n_specials)
{
    if (!pat_str || (!specials && n_specials))
        return tio_fail(-EINVAL, "tiktoken: NULL pattern or special tokens");
    if (n_specials > UINT16_MAX)
        return tio_fail(-E2BIG, "%zu special tokens: more than %u", n_specials, UINT16_MAX);
    rank_entry *entries = NULL;
    uint32_t n = 0, max_rank = 0;
    int rc = parse_ranks(tok, data, len, where, &entries, &n, &max_rank);
    if (rc)
        return rc;
    uint64_t n_ids = (uint64_t)max_rank + 1;
    for (size_t i = 0; i < n_specials; i++)
        if ((uint64_t)specials[i].id + 1 > n_ids)
            n_ids = (uint64_t)specials[i].id + 1;
    uint8_t *is_special = NULL;
    tok_special *special_list = NULL;
    if (n_ids > TIO_TOK_MAX_IDS) {
        rc = tio_fail(-E2BIG, "%s: id %llu: more than the limit of %u ids", where,
                      (unsigned long long)n_ids - 1, TIO_TOK_MAX_IDS);
        goto out;
    }
    if ((rc = tok_set_ids(tok, (uint32_t)n_ids)) < 0)
        goto out;
    for (uint32_t i = 0; i < n; i++) {
        if (tok->tok_off[entries[i].rank] != TOK_NONE) {
            rc = tio_fail(TIO_EPARSE, "%s: rank %u appears twice", where, entries[i].rank);
            goto out;
        }
        tok->tok_off[entries[i].rank] = entries[i].off;
        tok->tok_len[entries[i].rank] = entries[i].len;
    }
    is_special = calloc(n_ids, 1);
    special_list = calloc(n_specials + 1, sizeof *special_list);
    if (!is_special || !special_list) {
        rc = tio_fail(-ENOMEM, "out of memory for special tokens");
        goto out;
    }
    for (size_t i = 0; i < n_specials; i++) {
        uint32_t id = specials[i].id;
        size_t tlen = specials[i].text ? strlen(specials[i].text) : 0;
        if (!tlen) {
            rc = tio_fail(TIO_EPARSE, "special token %u: empty or NULL text", id);
            goto out;
        }
        if (tok->tok_off[id] != TOK_NONE) {
            rc = tio_fail(TIO_EPARSE, "special token '%s': id %u is already a token", specials[i].text, id);
            goto out;
        }
        if ((rc = tok_arena_add(tok, specials[i].text, tlen, &tok->tok_off[id])) < 0)
            goto out;
        tok->tok_len[id] = (uint32_t)tlen;
        is_special[id] = 1;
        special_list[i] = (tok_special){tok->tok_off[id], (uint32_t)tlen, id};
    }
    if ((rc = tok_build_pieces(tok, is_special)) < 0) {
        rc = tok_fail_at(rc, where, "");
        goto out;
    }
    if ((rc = tok_find_byte_ids(tok, where)) < 0 || (rc = tok_pairs_from_ranks(tok)) < 0 ||
        (rc = tok_index_byte_pairs(tok)) < 0 ||
        (rc = tok_set_specials(tok, special_list, (uint32_t)n_specials)) < 0 ||
        (rc = tok_add_stage(tok, pat_str, strlen(pat_str), false)) < 0 || (rc = tok_init_ctxs(tok)) < 0)
        goto out;
out:
    free(entries);
    free(is_special);
    free(special_list);
    return rc;
}

int tio_tok_parse_tiktoken(tio_tok **out, const void *data, size_t len, const char *pat_str,
                           const tio_tok_special *specials, size_t n_specials)
{
    if (!out || (!data && len))
        return tio_fail(-EINVAL, "tio_tok_parse_tiktoken: NULL argument");
    *out = NULL;
    tio_tok *tok;
    int rc = tok_new(&tok);
    if (rc)
        return rc;
    rc = build_tiktoken(tok, data, len, "<memory>", pat_str, specials, n_specials);
    if (rc) {
        tio_tok_destroy(tok);
        return rc;
    }
    *out = tok;
    return 0;
}

static int sha256_hex(const void *data, size_t len, char hex[65]);

/* Read and build the rank file at `path`; when `sha256` is not NULL the
 * file must have that digest (encoding `name`'s). */
static int load_rank_file(tio_tok **out, const char *path, const char *name, const char *sha256,
                          const char *pat_str, const tio_tok_special *specials, size_t n_specials)
{
    *out = NULL;
    char *text;
    size_t len;
    int rc = tio_read_file(path, &text, &len);
    if (rc)
        return rc;
    char hex[65];
    if (sha256 && (rc = sha256_hex(text, len, hex)) == 0 && strcmp(hex, sha256) != 0)
        rc = tio_fail(TIO_ECORRUPT, "%s: sha256 %s, but encoding %s's rank file has sha256 %s "
                      "(a changed or damaged file)", path, hex, name, sha256);
    tio_tok *tok = NULL;
    if (rc == 0 && (rc = tok_new(&tok)) == 0)
        rc = build_tiktoken(tok, (const uint8_t *)text, len, path, pat_str, specials, n_specials);
    free(text);
    if (rc) {
        tio_tok_destroy(tok);
        return rc;
    }
    *out = tok;
    return 0;
}

int tio_tok_load_tiktoken(tio_tok **out, const char *path, const char *pat_str,
                          const tio_tok_special *specials, size_t n_specials)
{
    if (!out || !path)
        return tio_fail(-EINVAL, "tio_tok_load_tiktoken: NULL argument");
    return load_rank_file(out, path, NULL, NULL, pat_str, specials, n_specials);
}

/* ---- finding and loading built-in encodings ----------------------------- */

static int find_encoding(const char *name)
{
    for (size_t i = 0; i < N_ENCODINGS; i++)
        if (!strcmp(encodings[i].name, name))
            return (int)i;
    return -1;
}

/* Directory of the copy shipped with teraio: "tokenizers" beside the folder
 * of the binary holding this code (<package>/_lib/libteraio.so or
 * <package>/_bin/teraio of a wheel; build/lib or build/bin of a source
 * build, where CMake links build/tokenizers to python/teraio/tokenizers). */
static bool shipped_dir(char *out, size_t cap)
{
    char bin[PATH_MAX];
    Dl_info info;
    bool found = false;
    if (dladdr((void *)shipped_dir, &info) && info.dli_fname && strchr(info.dli_fname, '/'))
        found = realpath(info.dli_fname, bin) != NULL;
    if (!found) { /* statically linked into a program started through $PATH */
        ssize_t n = readlink("/proc/self/exe", bin, sizeof bin - 1);
        if (n <= 0)
            return false;
        bin[n] = '\0';
    }
    char *slash = strrchr(bin, '/');
    if (!slash)
        return false;
    *slash = '\0';
    int n = snprintf(out, cap, "%s/../tokenizers", bin);
    return n > 0 && (size_t)n < cap;
}

/* tiktoken's download cache, as tiktoken.load.read_file_cached finds it:
 * $TIKTOKEN_CACHE_DIR, else $DATA_GYM_CACHE_DIR, else <tmp>/data-gym-cache
 * with <tmp> as Python's tempfile.gettempdir() (TMPDIR, TEMP, TMP, /tmp).
 * An empty setting turns the cache off, as in tiktoken. */
static bool tiktoken_cache_dir(char *out, size_t cap)
{
    const char *dir = getenv("TIKTOKEN_CACHE_DIR");
    if (!dir)
        dir = getenv("DATA_GYM_CACHE_DIR");
    if (dir) {
        int n = snprintf(out, cap, "%s", dir);
        return *dir && n > 0 && (size_t)n < cap;
    }
    const char *tmp = NULL;
    static const char *const vars[] = {"TMPDIR", "TEMP", "TMP"};
    for (size_t i = 0; i < 3 && !tmp; i++)
        if (getenv(vars[i]) && *getenv(vars[i]))
            tmp = getenv(vars[i]);
    int n = snprintf(out, cap, "%s/data-gym-cache", tmp ? tmp : "/tmp");
    return n > 0 && (size_t)n < cap;
}

enum { N_PLACES = 4 };

/* The places a built-in encoding's rank file is looked for, in order; a
 * place that does not apply is "".  file[i] is the file name in dirs[i]. */
static void encoding_places(int e, const char *dir, char dirs[N_PLACES][PATH_MAX],
                            const char *file[N_PLACES], char *own_name, size_t own_cap)
{
    const char *env = getenv("TERAIO_TOKENIZERS_DIR");
    snprintf(own_name, own_cap, "%s.tiktoken", encodings[e].name);
    snprintf(dirs[0], PATH_MAX, "%s", dir ? dir : "");
    snprintf(dirs[1], PATH_MAX, "%s", env ? env : "");
    if (!tiktoken_cache_dir(dirs[2], PATH_MAX))
        dirs[2][0] = '\0';
    if (!shipped_dir(dirs[3], PATH_MAX))
        dirs[3][0] = '\0';
    for (int i = 0; i < N_PLACES; i++)
        file[i] = i == 2 ? encodings[e].cache_key : own_name;
}

int tio_tok_encoding_path(const char *name, const char *dir, char *path, size_t cap)
{
    if (!name || !path)
        return tio_fail(-EINVAL, "tio_tok_encoding_path: NULL argument");
    int e = find_encoding(name);
    if (e < 0)
        return tio_fail(-ENOENT, "unknown encoding '%s' (known: r50k_base, p50k_base, cl100k_base, o200k_base)",
                        name);
    char dirs[N_PLACES][PATH_MAX], own[64];
    const char *file[N_PLACES];
    encoding_places(e, dir, dirs, file, own, sizeof own);
    char tried[1024] = "";
    for (int i = 0; i < N_PLACES; i++) {
        if (!dirs[i][0])
            continue;
        int n = snprintf(path, cap, "%s/%s", dirs[i], file[i]);
        if (n < 0 || (size_t)n >= cap)
            return tio_fail(-ENAMETOOLONG, "path of encoding '%s' in '%s' is too long", name, dirs[i]);
        if (access(path, R_OK) == 0)
            return 0;
        size_t t = strlen(tried);
        snprintf(tried + t, sizeof tried - t, "%s%s", t ? ", " : "", path);
    }
    if (cap)
        path[0] = '\0';
    return tio_fail(-ENOENT, "encoding '%s': no readable rank file (looked for %s)", name, tried);
}

/* SHA-256 of data[0..len) as 64 lowercase hex digits in hex[65]. */
static int sha256_hex(const void *data, size_t len, char hex[65])
{
    unsigned char md[EVP_MAX_MD_SIZE];
    unsigned int md_len = 0;
    if (!EVP_Digest(data, len, md, &md_len, EVP_sha256(), NULL) || md_len != 32)
        return tio_fail(-EIO, "SHA-256: OpenSSL's digest failed");
    for (unsigned i = 0; i < 32; i++)
        snprintf(hex + 2 * i, 3, "%02x", md[i]);
    return 0;
}

int tio_tok_load_encoding(tio_tok **out, const char *name, const char *dir)
{
    if (!out || !name)
        return tio_fail(-EINVAL, "tio_tok_load_encoding: NULL argument");
    *out = NULL;
    char path[PATH_MAX + 64];
    int rc = tio_tok_encoding_path(name, dir, path, sizeof path);
    if (rc)
        return rc;
    int e = find_encoding(name);
    tio_tok *tok;
    rc = load_rank_file(&tok, path, name, encodings[e].sha256, encodings[e].pat_str,
                        encodings[e].specials, encodings[e].n_specials);
    if (rc)
        return rc;
    uint32_t n_ranks = 0;
    for (uint32_t id = 0; id < tok->n_ids; id++)
        n_ranks += tok->tok_off[id] != TOK_NONE;
    n_ranks -= (uint32_t)encodings[e].n_specials;
    if (n_ranks != encodings[e].n_ranks) {
        tio_tok_destroy(tok);
        return tio_fail(TIO_ECORRUPT, "%s: %u ranks, encoding %s has %u", path, n_ranks, name,
                        encodings[e].n_ranks);
    }
    *out = tok;
    return 0;
}
