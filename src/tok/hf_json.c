/*
 * tok/hf_json.c — Hugging Face tokenizer.json files whose model is
 * byte-level BPE (GPT-2, Llama 3, StarCoder/Granite style), parsed with
 * json-c.
 *
 * The vocabulary's strings are in GPT-2's byte-to-unicode alphabet
 * (`bytes_to_unicode` in openai/gpt-2 encoder.py: printable Latin-1 bytes map
 * to themselves, the other 68 to U+0100 onwards in byte order); they are
 * mapped back to raw bytes here, so encoding works on bytes exactly as for
 * tiktoken.  A merge "a b" at position i of the merge list is the pair
 * (vocab[a], vocab[b]) -> vocab[a+b] with rank i (a later duplicate wins, as
 * in the Rust `tokenizers` HashMap).  Without `ignore_merges`, HF never looks
 * a whole word up, so the whole-piece fast path keeps only tokens that the
 * merges rebuild from their own bytes (tok_prune_unreachable): the ids stay
 * the same, only faster.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>

#include "common/util.h"
#include "tok/tok_internal.h"

#if TIO_HAVE_JSONC && TIO_HAVE_PCRE2
#include <json-c/json.h>

/* Code point -> byte of GPT-2's alphabet; -1 when not in it. */
static int byte_of_char(uint32_t cp)
{
    if ((cp >= 33 && cp <= 126) || (cp >= 161 && cp <= 172) || (cp >= 174 && cp <= 255))
        return (int)cp;
    if (cp < 256 || cp >= 256 + 68)
        return -1;
    int k = (int)(cp - 256); /* k-th byte outside the printable ranges */
    for (int b = 0; b < 256; b++) {
        if ((b >= 33 && b <= 126) || (b >= 161 && b <= 172) || (b >= 174 && b <= 255))
            continue;
        if (k-- == 0)
            return b;
    }
    return -1;
}

/* Map a vocabulary string to raw bytes (out has room for len bytes).
 * Returns the byte count, or -1 if a character is outside the alphabet or
 * the string is not UTF-8. */
static long unmap_bytes(const uint8_t *s, size_t len, const int *table, uint8_t *out)
{
    size_t o = 0;
    for (size_t i = 0; i < len;) {
        uint32_t cp;
        uint8_t c = s[i];
        if (c < 0x80) {
            cp = c;
            i++;
        } else if ((c & 0xe0) == 0xc0 && i + 1 < len) {
            cp = (uint32_t)(c & 0x1f) << 6 | (s[i + 1] & 0x3f);
            i += 2;
        } else {
            return -1; /* the alphabet ends at U+0143: two bytes at most */
        }
        if (cp >= 512 || table[cp] < 0)
            return -1;
        out[o++] = (uint8_t)table[cp];
    }
    return (long)o;
}

typedef struct {
    tio_tok *tok;
    const char *where;
    int table[512];
    uint8_t *scratch; /* room for the longest string mapped */
    size_t scratch_cap;
} hf_loader;

static int type_error(const char *where, const char *field, const char *want)
{
    return tio_fail(TIO_EPARSE, "%s: field '%s': expected %s", where, field, want);
}

static json_object *get(json_object *o, const char *key)
{
    json_object *v = NULL;
    if (o && json_object_is_type(o, json_type_object) && json_object_object_get_ex(o, key, &v))
        return v;
    return NULL;
}

static bool is_null_or_absent(json_object *o) { return !o || json_object_is_type(o, json_type_null); }

/* A boolean field: absent/null reads as `dflt`. */
static int get_bool(hf_loader *L, json_object *o, const char *key, bool dflt, bool *out)
{
    json_object *v = get(o, key);
    if (is_null_or_absent(v)) {
        *out = dflt;
        return 0;
    }
    if (!json_object_is_type(v, json_type_boolean))
        return type_error(L->where, key, "true or false");
    *out = json_object_get_boolean(v);
    return 0;
}

static bool is_string(json_object *o, const char *s)
{
    return o && json_object_is_type(o, json_type_string) && !strcmp(json_object_get_string(o), s);
}

static int need_scratch(hf_loader *L, size_t n)
{
    if (n <= L->scratch_cap)
        return 0;
    uint8_t *p = realloc(L->scratch, n);
    if (!p)
        return tio_fail(-ENOMEM, "out of memory reading %s", L->where);
    L->scratch = p;
    L->scratch_cap = n;
    return 0;
}

static int check_model(hf_loader *L, json_object *model, bool *ignore_merges)
{
    json_object *type = get(model, "type");
    if (type && !is_string(type, "BPE"))
        return tio_fail(-ENOTSUP, "%s: model type '%s': only byte-level BPE is supported", L->where,
                        json_object_get_string(type));
    json_object *v;
    if (!is_null_or_absent(v = get(model, "dropout")))
        return tio_fail(-ENOTSUP, "%s: model.dropout is set: BPE dropout is not supported", L->where);
    const char *affixes[] = {"continuing_subword_prefix", "end_of_word_suffix"};
    for (int i = 0; i < 2; i++) {
        v = get(model, affixes[i]);
        if (!is_null_or_absent(v) && !is_string(v, ""))
            return tio_fail(-ENOTSUP, "%s: model.%s is set: not supported", L->where, affixes[i]);
    }
    bool fallback;
    int rc = get_bool(L, model, "byte_fallback", false, &fallback);
    if (rc)
        return rc;
    if (fallback)
        return tio_fail(-ENOTSUP, "%s: model.byte_fallback: not supported (not byte-level BPE)", L->where);
    return get_bool(L, model, "ignore_merges", false, ignore_merges);
}

/* Stages of the pre-tokenizer; *byte_level says whether one was ByteLevel. */
static int add_pre_tokenizer(hf_loader *L, json_object *pt, bool first, bool *byte_level)
{
    json_object *type = get(pt, "type");
    if (is_string(type, "Sequence")) {
        json_object *list = get(pt, "pretokenizers");
        if (!list || !json_object_is_type(list, json_type_array))
            return type_error(L->where, "pre_tokenizer.pretokenizers", "an array");
        size_t n = json_object_array_length(list);
        for (size_t i = 0; i < n; i++) {
            int rc = add_pre_tokenizer(L, json_object_array_get_idx(list, i), first && i == 0, byte_level);
            if (rc)
                return rc;
        }
        return 0;
    }
    if (is_string(type, "ByteLevel")) {
        bool prefix, use_regex;
        int rc = get_bool(L, pt, "add_prefix_space", false, &prefix);
        if (!rc)
            rc = get_bool(L, pt, "use_regex", true, &use_regex);
        if (rc)
            return rc;
        if (prefix && !first)
            return tio_fail(-ENOTSUP, "%s: ByteLevel add_prefix_space after another pre-tokenizer: not supported",
                            L->where);
        L->tok->add_prefix_space = prefix;
        *byte_level = true;
        return use_regex ? tok_add_stage(L->tok, TOK_PATTERN_GPT2, strlen(TOK_PATTERN_GPT2), true) : 0;
    }
    if (is_string(type, "Split")) {
        json_object *pat = get(get(pt, "pattern"), "Regex");
        if (!pat || !json_object_is_type(pat, json_type_string))
            return tio_fail(-ENOTSUP, "%s: Split pre-tokenizer: only {\"Regex\": ...} patterns are supported",
                            L->where);
        if (!is_string(get(pt, "behavior"), "Isolated"))
            return tio_fail(-ENOTSUP, "%s: Split pre-tokenizer: only behavior \"Isolated\" is supported",
                            L->where);
        bool invert;
        int rc = get_bool(L, pt, "invert", false, &invert);
        if (rc)
            return rc;
        if (invert)
            return tio_fail(-ENOTSUP, "%s: Split pre-tokenizer: invert is not supported", L->where);
        rc = tok_add_stage(L->tok, json_object_get_string(pat), (size_t)json_object_get_string_len(pat), true);
        return rc ? tok_fail_at(rc, L->where, "") : 0;
    }
    return tio_fail(-ENOTSUP, "%s: pre_tokenizer type '%s': supported are ByteLevel, Split, Sequence",
                    L->where, type ? json_object_get_string(type) : "(none)");
}

/* Vocabulary: fills ids; strings outside the byte alphabet are kept for
 * decoding (their UTF-8) and flagged in *unmapped. */
static int read_vocab(hf_loader *L, json_object *vocab, json_object *added, uint8_t **unmapped)
{
    tio_tok *tok = L->tok;
    if (!vocab || !json_object_is_type(vocab, json_type_object))
        return type_error(L->where, "model.vocab", "an object");
    uint64_t n_ids = 0;
    json_object_object_foreach(vocab, key, val) {
        (void)key;
        if (!json_object_is_type(val, json_type_int) || json_object_get_int64(val) < 0 ||
            json_object_get_int64(val) >= TIO_TOK_MAX_IDS)
            return tio_fail(TIO_EPARSE, "%s: model.vocab['%.64s']: expected an id in [0, %u)", L->where, key,
                            TIO_TOK_MAX_IDS);
        if ((uint64_t)json_object_get_int64(val) + 1 > n_ids)
            n_ids = (uint64_t)json_object_get_int64(val) + 1;
    }
    size_t n_added = added ? json_object_array_length(added) : 0;
    for (size_t i = 0; i < n_added; i++) {
        json_object *id = get(json_object_array_get_idx(added, i), "id");
        if (!id || !json_object_is_type(id, json_type_int) || json_object_get_int64(id) < 0 ||
            json_object_get_int64(id) >= TIO_TOK_MAX_IDS)
            return tio_fail(TIO_EPARSE, "%s: added_tokens[%zu].id: expected an id in [0, %u)", L->where, i,
                            TIO_TOK_MAX_IDS);
        if ((uint64_t)json_object_get_int64(id) + 1 > n_ids)
            n_ids = (uint64_t)json_object_get_int64(id) + 1;
    }
    int rc = tok_set_ids(tok, (uint32_t)n_ids);
    if (rc)
        return rc;
    *unmapped = calloc(n_ids ? n_ids : 1, 1);
    if (!*unmapped)
        return tio_fail(-ENOMEM, "out of memory reading %s", L->where);
    json_object_object_foreach(vocab, k2, v2) {
        uint32_t id = (uint32_t)json_object_get_int64(v2);
        size_t len = strlen(k2);
        if ((rc = need_scratch(L, len + 1)) < 0)
            return rc;
        if (tok->tok_off[id] != TOK_NONE)
            return tio_fail(TIO_EPARSE, "%s: model.vocab: id %u appears twice", L->where, id);
        long nb = unmap_bytes((const uint8_t *)k2, len, L->table, L->scratch);
        if (nb <= 0) {
            (*unmapped)[id] = 1;
            nb = (long)len;
            memcpy(L->scratch, k2, len);
        }
        if ((rc = tok_arena_add(tok, L->scratch, (size_t)nb, &tok->tok_off[id])) < 0)
            return tok_fail_at(rc, L->where, "");
        tok->tok_len[id] = (uint32_t)nb;
    }
    return 0;
}

static int read_merges(hf_loader *L, json_object *vocab, json_object *merges)
{
    if (!merges || !json_object_is_type(merges, json_type_array))
        return type_error(L->where, "model.merges", "an array");
    size_t n = json_object_array_length(merges);
    int rc = tok_pairs_init(L->tok, n);
    if (rc)
        return rc;
    for (size_t i = 0; i < n; i++) {
        json_object *m = json_object_array_get_idx(merges, i);
        const char *a, *b;
        size_t la, lb;
        if (json_object_is_type(m, json_type_string)) {
            a = json_object_get_string(m);
            const char *sp = strchr(a, ' ');
            if (!sp || strchr(sp + 1, ' '))
                return tio_fail(TIO_EPARSE, "%s: model.merges[%zu]: expected \"left right\"", L->where, i);
            la = (size_t)(sp - a);
            b = sp + 1;
            lb = strlen(b);
        } else if (json_object_is_type(m, json_type_array) && json_object_array_length(m) == 2 &&
                   json_object_is_type(json_object_array_get_idx(m, 0), json_type_string) &&
                   json_object_is_type(json_object_array_get_idx(m, 1), json_type_string)) {
            a = json_object_get_string(json_object_array_get_idx(m, 0));
            b = json_object_get_string(json_object_array_get_idx(m, 1));
            la = strlen(a);
            lb = strlen(b);
        } else {
            return tio_fail(TIO_EPARSE, "%s: model.merges[%zu]: expected \"left right\" or [left, right]",
                            L->where, i);
        }
        if ((rc = need_scratch(L, la + lb + 1)) < 0)
            return rc;
        char *key = (char *)L->scratch;
        json_object *ia, *ib, *it;
        memcpy(key, a, la);
        key[la] = '\0';
        bool ok = json_object_object_get_ex(vocab, key, &ia);
        memcpy(key, b, lb);
        key[lb] = '\0';
        ok = ok && json_object_object_get_ex(vocab, key, &ib);
        memcpy(key, a, la);
        memcpy(key + la, b, lb);
        key[la + lb] = '\0';
        ok = ok && json_object_object_get_ex(vocab, key, &it);
        if (!ok)
            return tio_fail(TIO_EPARSE, "%s: model.merges[%zu]: '%.*s' + '%.*s': token not in the vocabulary",
                            L->where, i, (int)(la > 64 ? 64 : la), a, (int)(lb > 64 ? 64 : lb), b);
        tok_pair_put(L->tok, (uint32_t)json_object_get_int64(ia), (uint32_t)json_object_get_int64(ib),
                     (uint32_t)i, (uint32_t)json_object_get_int64(it));
    }
    return 0;
}

static int read_added(hf_loader *L, json_object *added, uint8_t *not_piece, tok_special **out,
                      uint32_t *n_out)
{
    tio_tok *tok = L->tok;
    size_t n = added ? json_object_array_length(added) : 0;
    if (n > UINT16_MAX)
        return tio_fail(-E2BIG, "%s: %zu added tokens: more than %u", L->where, n, UINT16_MAX);
    tok_special *list = calloc(n + 1, sizeof *list);
    if (!list)
        return tio_fail(-ENOMEM, "out of memory reading %s", L->where);
    *out = list;
    *n_out = (uint32_t)n;
    for (size_t i = 0; i < n; i++) {
        json_object *t = json_object_array_get_idx(added, i);
        json_object *content = get(t, "content");
        if (!content || !json_object_is_type(content, json_type_string) || !json_object_get_string_len(content))
            return tio_fail(TIO_EPARSE, "%s: added_tokens[%zu].content: expected a non-empty string", L->where, i);
        const char *opts[] = {"lstrip", "rstrip", "single_word"};
        for (int k = 0; k < 3; k++) {
            bool on;
            int rc = get_bool(L, t, opts[k], false, &on);
            if (rc)
                return rc;
            if (on)
                return tio_fail(-ENOTSUP, "%s: added_tokens[%zu].%s: not supported", L->where, i, opts[k]);
        }
        uint32_t id = (uint32_t)json_object_get_int64(get(t, "id"));
        size_t len = (size_t)json_object_get_string_len(content);
        uint32_t off;
        int rc = tok_arena_add(tok, json_object_get_string(content), len, &off);
        if (rc)
            return tok_fail_at(rc, L->where, "");
        if (tok->tok_off[id] == TOK_NONE) { /* not in the vocabulary: decodes as its text */
            tok->tok_off[id] = off;
            tok->tok_len[id] = (uint32_t)len;
            not_piece[id] = 1;
        } else if (tok->tok_len[id] != len || memcmp(tok->arena + tok->tok_off[id], tok->arena + off, len)) {
            return tio_fail(TIO_EPARSE, "%s: added_tokens[%zu]: id %u is a different vocabulary token",
                            L->where, i, id);
        }
        list[i] = (tok_special){off, (uint32_t)len, id};
    }
    return 0;
}

static int build_hf(tio_tok *tok, const char *json, size_t len, const char *where)
{
    hf_loader L = {.tok = tok, .where = where};
    for (int c = 0; c < 512; c++)
        L.table[c] = -1;
    for (uint32_t cp = 0; cp < 512; cp++)
        L.table[cp] = byte_of_char(cp);

    json_tokener *jt = json_tokener_new_ex(64);
    if (!jt)
        return tio_fail(-ENOMEM, "out of memory parsing %s", where);
    json_object *root = len > INT32_MAX ? NULL : json_tokener_parse_ex(jt, json, (int)len);
    enum json_tokener_error jerr = json_tokener_get_error(jt);
    size_t end = json_tokener_get_parse_end(jt);
    json_tokener_free(jt);
    int rc = 0;
    uint8_t *unmapped = NULL;
    tok_special *specials = NULL;
    uint32_t n_specials = 0;
    if (len > INT32_MAX) {
        rc = tio_fail(-E2BIG, "%s: larger than 2 GiB", where);
        goto out;
    }
    if (!root || jerr != json_tokener_success) {
        rc = tio_fail(TIO_EPARSE, "%s: byte %zu: not valid JSON (%s)", where, end,
                      jerr == json_tokener_continue ? "unexpected end" : json_tokener_error_desc(jerr));
        goto out;
    }
    for (size_t i = end; i < len; i++)
        if (json[i] != ' ' && json[i] != '\n' && json[i] != '\r' && json[i] != '\t') {
            rc = tio_fail(TIO_EPARSE, "%s: byte %zu: text after the JSON value", where, i);
            goto out;
        }
    json_object *model = get(root, "model");
    if (!model || !json_object_is_type(model, json_type_object)) {
        rc = type_error(where, "model", "an object");
        goto out;
    }
    if (!is_null_or_absent(get(root, "normalizer"))) {
        rc = tio_fail(-ENOTSUP, "%s: normalizer is set: only null is supported", where);
        goto out;
    }
    bool ignore_merges = false, byte_level = false;
    if ((rc = check_model(&L, model, &ignore_merges)) < 0)
        goto out;
    json_object *pt = get(root, "pre_tokenizer");
    if (is_null_or_absent(pt)) {
        rc = tio_fail(-ENOTSUP, "%s: no pre_tokenizer: not byte-level BPE", where);
        goto out;
    }
    if ((rc = add_pre_tokenizer(&L, pt, true, &byte_level)) < 0)
        goto out;
    if (!byte_level) {
        rc = tio_fail(-ENOTSUP, "%s: no ByteLevel pre-tokenizer: not byte-level BPE", where);
        goto out;
    }
    json_object *added = get(root, "added_tokens");
    if (!is_null_or_absent(added) && !json_object_is_type(added, json_type_array)) {
        rc = type_error(where, "added_tokens", "an array");
        goto out;
    }
    if (is_null_or_absent(added))
        added = NULL;
    json_object *vocab = get(model, "vocab");
    if ((rc = read_vocab(&L, vocab, added, &unmapped)) < 0 ||
        (rc = read_added(&L, added, unmapped, &specials, &n_specials)) < 0 ||
        (rc = read_merges(&L, vocab, get(model, "merges"))) < 0)
        goto out;
    if ((rc = tok_build_pieces(tok, unmapped)) < 0) {
        rc = tok_fail_at(rc, where, "");
        goto out;
    }
    if ((rc = tok_find_byte_ids(tok, where)) < 0 || (rc = tok_index_byte_pairs(tok)) < 0 ||
        (rc = tok_set_specials(tok, specials, n_specials)) < 0)
        goto out;
    if (!ignore_merges && (rc = tok_prune_unreachable(tok)) < 0)
        goto out;
    tok->always_special = true;
    rc = tok_init_ctxs(tok);
out:
    if (root)
        json_object_put(root);
    free(L.scratch);
    free(unmapped);
    free(specials);
    return rc;
}

int tio_tok_parse_hf_named(tio_tok **out, const void *json, size_t len, const char *name)
{
    if (!out || (!json && len))
        return tio_fail(-EINVAL, "tio_tok_parse_hf: NULL argument");
    *out = NULL;
    tio_tok *tok;
    int rc = tok_new(&tok);
    if (rc == 0)
        rc = build_hf(tok, json ? json : "", len, name ? name : "<memory>");
    if (rc) {
        tio_tok_destroy(tok);
        return rc;
    }
    *out = tok;
    return 0;
}

int tio_tok_parse_hf(tio_tok **out, const void *json, size_t len)
{
    return tio_tok_parse_hf_named(out, json, len, NULL);
}

int tio_tok_load_hf(tio_tok **out, const char *path)
{
    if (!out || !path)
        return tio_fail(-EINVAL, "tio_tok_load_hf: NULL argument");
    *out = NULL;
    char *text;
    size_t len;
    int rc = tio_read_file(path, &text, &len);
    if (rc)
        return rc;
    tio_tok *tok;
    rc = tok_new(&tok);
    if (rc == 0)
        rc = build_hf(tok, text, len, path);
    free(text);
    if (rc) {
        tio_tok_destroy(tok);
        return rc;
    }
    *out = tok;
    return 0;
}

#else

int tio_tok_parse_hf(tio_tok **out, const void *json, size_t len)
{
    if (out)
        *out = NULL;
    return tio_fail(-ENOTSUP, "teraio was built without json-c or PCRE2: tokenizer.json is not supported");
}

int tio_tok_parse_hf_named(tio_tok **out, const void *json, size_t len, const char *name)
{
    (void)name;
    return tio_tok_parse_hf(out, json, len);
}

int tio_tok_load_hf(tio_tok **out, const char *path)
{
    return tio_tok_parse_hf(out, NULL, 0);
}

#endif
