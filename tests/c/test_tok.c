/*
 * tests/c/test_tok.c — the byte-level BPE tokenizer against ids a reader can
 * check: the known "hello world" vectors of the OpenAI encodings (the rank
 * files shipped in python/teraio/tokenizers), where the rank files are found
 * and their SHA-256 check, and a toy vocabulary worked out by hand:
 *
 *   ranks 0..255: the single bytes (rank = byte value)
 *   256 "ab", 257 "bc", 258 "abc", 259 "  " (two spaces)
 *   split regex: \S+|\s+ ; special token "<|x|>" = 300
 *
 *   "abc"      whole-piece hit             -> [258]
 *   "abcab"    ab,c,a,b -> ab,c,ab -> abc,ab -> [258, 256]
 *   "ca"       no pair merges              -> ['c', 'a'] = [99, 97]
 *   "abc"x30   90 bytes: the heap merge    -> [258] x 30
 */
#include <errno.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include <cmocka.h>
#include <dirent.h>

#include "common/util.h"
#include "teraio/tok.h"
#include "tok/tok_internal.h"

/* The rank files shipped with teraio, in the source tree. */
static const char *shipped_dir(void)
{
    static char dir[4096];
    const char *src = tio_env("SOURCE_DIR");
    assert_non_null(src); /* set by CTest */
    snprintf(dir, sizeof dir, "%s/python/teraio/tokenizers", src);
    return dir;
}

/* Only the shipped copy: no caller directory, no variable, no tiktoken cache. */
static void lookup_env_clear(void)
{
    unsetenv("TERAIO_TOKENIZERS_DIR");
    unsetenv("DATA_GYM_CACHE_DIR");
    setenv("TIKTOKEN_CACHE_DIR", "", 1);
}

/* The toy rank file above, base64 per line. */
static char *toy_ranks(size_t *len)
{
    static const char b64[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    size_t cap = 256 * 16 + 256, n = 0;
    char *s = malloc(cap);
    for (int b = 0; b < 256; b++) {
        /* one byte: 6 bits, 2 bits + "==" */
        n += (size_t)snprintf(s + n, cap - n, "%c%c== %d\n", b64[b >> 2], b64[(b & 3) << 4], b);
    }
    n += (size_t)snprintf(s + n, cap - n, "YWI= 256\nYmM= 257\nYWJj 258\nICA= 259\n");
    *len = n;
    return s;
}

static const tio_tok_special toy_specials[] = {{"<|x|>", 300}};

static tio_tok *toy(void)
{
    size_t len;
    char *ranks = toy_ranks(&len);
    tio_tok *tok = NULL;
    assert_int_equal(tio_tok_parse_tiktoken(&tok, ranks, len, "\\S+|\\s+", toy_specials, 1), 0);
    free(ranks);
    return tok;
}

static size_t enc(const tio_tok *tok, const char *s, size_t len, int special, uint32_t *ids)
{
    size_t n = 99;
    assert_int_equal(tio_tok_encode(tok, s, len, special, ids, len + 1, &n), 0);
    return n;
}

static void check_ids(const uint32_t *got, size_t n, const uint32_t *want, size_t n_want)
{
    assert_int_equal(n, n_want);
    for (size_t i = 0; i < n; i++)
        assert_int_equal(got[i], want[i]);
}

static void test_toy_merges(void **state)
{
    tio_tok *tok = toy();
    uint32_t ids[128];
    check_ids(ids, enc(tok, "abc", 3, 0, ids), (uint32_t[]){258}, 1);
    check_ids(ids, enc(tok, "abcab", 5, 0, ids), (uint32_t[]){258, 256}, 2);
    check_ids(ids, enc(tok, "ca", 2, 0, ids), (uint32_t[]){99, 97}, 2);
    check_ids(ids, enc(tok, "ab  bc", 6, 0, ids), (uint32_t[]){256, 259, 257}, 3);
    char big[91];
    for (int i = 0; i < 30; i++)
        memcpy(big + 3 * i, "abc", 3);
    size_t n = enc(tok, big, 90, 0, ids);
    assert_int_equal(n, 30);
    for (size_t i = 0; i < n; i++)
        assert_int_equal(ids[i], 258);
    /* the same piece again comes from the per-thread cache */
    check_ids(ids, enc(tok, "abcab", 5, 0, ids), (uint32_t[]){258, 256}, 2);
    assert_int_equal(tio_tok_vocab_size(tok), 301);
    tio_tok_destroy(tok);
}

static void test_toy_special_modes(void **state)
{
    tio_tok *tok = toy();
    uint32_t ids[64];
    const char *s = "ab<|x|>bc";
    /* text: "<|x|>" is BPE'd bytes, one piece "ab<|x|>bc" */
    size_t n = enc(tok, s, strlen(s), TIO_TOK_SPECIAL_TEXT, ids);
    check_ids(ids, n, (uint32_t[]){256, '<', '|', 'x', '|', '>', 257}, 7);
    n = enc(tok, s, strlen(s), TIO_TOK_SPECIAL_ALLOW, ids);
    check_ids(ids, n, (uint32_t[]){256, 300, 257}, 3);
    size_t m;
    assert_int_equal(tio_tok_encode(tok, s, strlen(s), TIO_TOK_SPECIAL_REJECT, ids, 64, &m), TIO_EPARSE);
    assert_non_null(strstr(tio_last_error(), "at byte 2"));
    assert_int_equal(tio_tok_encode(tok, "abc", 3, TIO_TOK_SPECIAL_REJECT, ids, 64, &m), 0);
    assert_int_equal(tio_tok_encode(tok, "abc", 3, 7, ids, 64, &m), -EINVAL);
    assert_int_equal(tio_tok_special_id(tok, "<|x|>"), 300);
    assert_int_equal(tio_tok_special_id(tok, "<|y|>"), -ENOENT);
    tio_tok_destroy(tok);
}

static void test_toy_decode_and_invalid_utf8(void **state)
{
    tio_tok *tok = toy();
    /* invalid bytes, a truncated sequence, a surrogate, an overlong */
    const char s[] = "ab \xff\xfe abc \xc3 \xed\xa0\x80 \xc0\xaf\xe2\x82";
    size_t len = sizeof s - 1;
    uint32_t ids[64];
    size_t n = enc(tok, s, len, 0, ids);
    char out[64];
    size_t nb = 0;
    assert_int_equal(tio_tok_decode(tok, ids, n, out, sizeof out, &nb), 0);
    assert_int_equal(nb, len);
    assert_memory_equal(out, s, len);
    /* decode: too small, unknown id */
    assert_int_equal(tio_tok_decode(tok, ids, n, out, 3, &nb), -ENOSPC);
    assert_int_equal(nb, len);
    uint32_t bad[] = {97, 299};
    assert_int_equal(tio_tok_decode(tok, bad, 2, out, sizeof out, &nb), -ENOENT);
    assert_non_null(strstr(tio_last_error(), "index 1"));
    const void *bytes;
    size_t blen;
    assert_int_equal(tio_tok_token_bytes(tok, 258, &bytes, &blen), 0);
    assert_int_equal(blen, 3);
    assert_memory_equal(bytes, "abc", 3);
    /* encode into too small an output */
    assert_int_equal(tio_tok_encode(tok, "ca ca", 5, 0, ids, 2, &n), -ENOSPC);
    assert_int_equal(n, 2);
    tio_tok_destroy(tok);
}

static void test_toy_batch(void **state)
{
    tio_tok *tok = toy();
    const char *texts[] = {"abcab", "", "ca", "ab  bc", "abc"};
    size_t lens[5], total = 0;
    for (int i = 0; i < 5; i++)
        total += lens[i] = strlen(texts[i]);
    uint32_t ids[64];
    size_t offsets[6];
    assert_int_equal(tio_tok_encode_batch(tok, (const void *const *)texts, lens, 5, 0, 2, ids, total,
                                          offsets),
                     0);
    size_t want_off[] = {0, 2, 2, 4, 7, 8};
    for (int i = 0; i < 6; i++)
        assert_int_equal(offsets[i], want_off[i]);
    check_ids(ids, 8, (uint32_t[]){258, 256, 99, 97, 256, 259, 257, 258}, 8);
    assert_int_equal(tio_tok_encode_batch(tok, (const void *const *)texts, lens, 5, 0, 2, ids, total - 1,
                                          offsets),
                     -ENOSPC);
    tio_tok_destroy(tok);
}

static void expect_parse_error(const char *ranks, int code, const char *needle)
{
    tio_tok *tok = (tio_tok *)1;
    assert_int_equal(tio_tok_parse_tiktoken(&tok, ranks, strlen(ranks), "\\S+", NULL, 0), code);
    assert_null(tok);
    if (!strstr(tio_last_error(), needle))
        fail_msg("message '%s' lacks '%s'", tio_last_error(), needle);
}

static void test_rank_file_errors(void **state)
{
    expect_parse_error("YQ== 0\nYQ=x 1\n", TIO_EPARSE, "<memory>:2: token");
    expect_parse_error("YQ== 0\nYg== zero\n", TIO_EPARSE, "<memory>:2: rank");
    expect_parse_error("YQ== 0\nYg== 0\n", TIO_EPARSE, "rank 0 appears twice");
    expect_parse_error("YQ== 0\nYQ== 1\n", TIO_EPARSE, "same bytes");
    expect_parse_error("YQ==\n", TIO_EPARSE, "<memory>:1: expected");
    expect_parse_error("YQ== 0\n", TIO_EPARSE, "byte 0x00 has no token");
    expect_parse_error("YQ== 99999999\n", TIO_EPARSE, "rank: expected an integer below");
    expect_parse_error("", TIO_EPARSE, "no tokens");
    size_t len;
    char *ranks = toy_ranks(&len);
    tio_tok *tok;
    assert_int_equal(tio_tok_parse_tiktoken(&tok, ranks, len, "(unclosed", NULL, 0), -EINVAL);
    assert_non_null(strstr(tio_last_error(), "does not compile"));
    tio_tok_special clash[] = {{"<s>", 65}};
    assert_int_equal(tio_tok_parse_tiktoken(&tok, ranks, len, "\\S+", clash, 1), TIO_EPARSE);
    tio_tok_special empty[] = {{"", 400}};
    assert_int_equal(tio_tok_parse_tiktoken(&tok, ranks, len, "\\S+", empty, 1), TIO_EPARSE);
    free(ranks);
    assert_int_equal(tio_tok_load_tiktoken(&tok, "/nonexistent/x.tiktoken", "\\S+", NULL, 0), -ENOENT);
}

/* GPT-2's byte -> character map, as UTF-8, for building a tokenizer.json. */
static void byte_char(int b, char *out)
{
    int cp = b, k = 0;
    bool printable = (b >= 33 && b <= 126) || (b >= 161 && b <= 172) || (b >= 174 && b <= 255);
    if (!printable) {
        for (int x = 0; x < b; x++)
            k += !((x >= 33 && x <= 126) || (x >= 161 && x <= 172) || (x >= 174 && x <= 255));
        cp = 256 + k;
    }
    if (cp == '"' || cp == '\\')
        sprintf(out, "\\%c", cp);
    else if (cp < 0x80)
        sprintf(out, "%c", cp);
    else
        sprintf(out, "%c%c", 0xc0 | (cp >> 6), 0x80 | (cp & 0x3f));
}

static char *toy_json(const char *pre_tokenizer, bool ignore_merges)
{
    size_t cap = 1 << 16, n = 0;
    char *s = malloc(cap);
    n += (size_t)snprintf(s + n, cap - n,
                          "{\"version\": \"1.0\", \"normalizer\": null, \"added_tokens\": "
                          "[{\"id\": 300, \"content\": \"<|x|>\", \"special\": true}],"
                          " \"pre_tokenizer\": %s, \"model\": {\"type\": \"BPE\", \"ignore_merges\": %s,"
                          " \"vocab\": {",
                          pre_tokenizer, ignore_merges ? "true" : "false");
    for (int b = 0; b < 256; b++) {
        char c[8];
        byte_char(b, c);
        n += (size_t)snprintf(s + n, cap - n, "\"%s\": %d, ", c, b);
    }
    /* "Ġa" = " a" (space is byte 32 -> U+0120) */
    n += (size_t)snprintf(s + n, cap - n,
                          "\"ab\": 256, \"bc\": 257, \"abc\": 258, \"\xc4\xa0" "a\": 259, \"ca\": 260},"
                          " \"merges\": [\"a b\", [\"b\", \"c\"], \"ab c\", \"\xc4\xa0 a\"]}}");
    return s;
}

static void test_hf_json(void **state)
{
    const char *bl = "{\"type\": \"ByteLevel\", \"add_prefix_space\": false, \"use_regex\": true}";
    char *json = toy_json(bl, false);
    tio_tok *tok;
    int rc = tio_tok_parse_hf(&tok, json, strlen(json));
    if (rc)
        fail_msg("parse_hf: %d %s", rc, tio_last_error());
    uint32_t ids[64];
    /* GPT-2 regex: "abc", " abc" ( a + b -> ' a' has rank 3, 'ab' rank 0:
     * ab first, then abc, leaving ' ' alone), "<|x|>" always special. */
    const char *s = "abc abc<|x|>ca";
    size_t n = enc(tok, s, strlen(s), TIO_TOK_SPECIAL_TEXT, ids);
    check_ids(ids, n, (uint32_t[]){258, 32, 258, 300, 'c', 'a'}, 6);
    /* "ca" is in the vocabulary but no merge builds it: not a whole-piece hit
     * without ignore_merges ... */
    tio_tok_destroy(tok);
    free(json);
    /* ... and a hit with it. */
    json = toy_json(bl, true);
    assert_int_equal(tio_tok_parse_hf(&tok, json, strlen(json)), 0);
    n = enc(tok, "ca", 2, 0, ids);
    check_ids(ids, n, (uint32_t[]){260}, 1);
    tio_tok_destroy(tok);
    free(json);
    json = toy_json("{\"type\": \"ByteLevel\", \"add_prefix_space\": true}", false);
    assert_int_equal(tio_tok_parse_hf(&tok, json, strlen(json)), 0);
    n = enc(tok, "a", 1, 0, ids);
    check_ids(ids, n, (uint32_t[]){259}, 1);
    tio_tok_destroy(tok);
    free(json);
}

/* Found with the new fuzz_tok_json seeds: with add_prefix_space, "c" is
 * " c", two ids from one byte, so encode into len ids (what the Python
 * binding, the CLI and the batch allotted) failed with -ENOSPC.  The bound is
 * tio_tok_max_ids. */
static void test_prefix_space_needs_one_more_id(void **state)
{
    char *json = toy_json("{\"type\": \"ByteLevel\", \"add_prefix_space\": true}", false);
    tio_tok *tok;
    assert_int_equal(tio_tok_parse_hf(&tok, json, strlen(json)), 0);
    assert_int_equal(tio_tok_max_ids(tok, 0), 0);
    assert_int_equal(tio_tok_max_ids(tok, 1), 2);
    assert_int_equal(tio_tok_max_ids(tok, 10), 11);
    uint32_t ids[16];
    size_t n;
    assert_int_equal(tio_tok_encode(tok, "c", 1, 0, ids, 1, &n), -ENOSPC);
    assert_int_equal(tio_tok_encode(tok, "c", 1, 0, ids, tio_tok_max_ids(tok, 1), &n), 0);
    check_ids(ids, n, (uint32_t[]){' ', 'c'}, 2);
    const char *texts[] = {"c", "c<|x|>c"};
    size_t lens[] = {1, 7}, offsets[3];
    assert_int_equal(tio_tok_encode_batch(tok, (const void *const *)texts, lens, 2, 0, 2, ids, 8, offsets), -ENOSPC);
    assert_int_equal(tio_tok_encode_batch(tok, (const void *const *)texts, lens, 2, 0, 2, ids,
                                          tio_tok_max_ids(tok, 1) + tio_tok_max_ids(tok, 7), offsets),
                     0);
    check_ids(ids, offsets[2], (uint32_t[]){' ', 'c', ' ', 'c', 300, ' ', 'c'}, 7);
    tio_tok_destroy(tok);
    free(json);
    /* tiktoken encodings: len ids */
    tok = toy();
    assert_int_equal(tio_tok_max_ids(tok, 5), 5);
    tio_tok_destroy(tok);
}

static void expect_hf_error(const char *pre, int code, const char *needle)
{
    char *json = toy_json(pre, false);
    tio_tok *tok = (tio_tok *)1;
    assert_int_equal(tio_tok_parse_hf(&tok, json, strlen(json)), code);
    assert_null(tok);
    if (!strstr(tio_last_error(), needle))
        fail_msg("message '%s' lacks '%s'", tio_last_error(), needle);
    free(json);
}

static void test_hf_errors(void **state)
{
    expect_hf_error("{\"type\": \"Whitespace\"}", -ENOTSUP, "pre_tokenizer type 'Whitespace'");
    expect_hf_error("{\"type\": \"Split\", \"pattern\": {\"String\": \" \"}, \"behavior\": \"Isolated\"}",
                    -ENOTSUP, "Regex");
    expect_hf_error("{\"type\": \"Split\", \"pattern\": {\"Regex\": \"\\\\S+\"}, \"behavior\": \"Isolated\"}",
                    -ENOTSUP, "no ByteLevel");
    expect_hf_error("{\"type\": \"ByteLevel\", \"use_regex\": 3}", TIO_EPARSE, "use_regex");
    tio_tok *tok;
    const char *bad = "{\"model\": {\"vocab\": {}, \"merges\": []";
    assert_int_equal(tio_tok_parse_hf(&tok, bad, strlen(bad)), TIO_EPARSE);
    assert_non_null(strstr(tio_last_error(), "not valid JSON"));
    const char *wp = "{\"model\": {\"type\": \"WordPiece\"}}";
    assert_int_equal(tio_tok_parse_hf(&tok, wp, strlen(wp)), -ENOTSUP);
    const char *trail = "{} x";
    assert_int_equal(tio_tok_parse_hf(&tok, trail, strlen(trail)), TIO_EPARSE);
    assert_int_equal(tio_tok_load_hf(&tok, "/nonexistent/tokenizer.json"), -ENOENT);
}

static void test_known_vectors(void **state)
{
    lookup_env_clear();
    static const struct {
        const char *name;
        uint32_t ids[2];
    } cases[] = {
        {"r50k_base", {31373, 995}},
        {"p50k_base", {31373, 995}},
        {"cl100k_base", {15339, 1917}},
        {"o200k_base", {24912, 2375}},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        tio_tok *tok;
        int rc = tio_tok_load_encoding(&tok, cases[i].name, NULL);
        if (rc)
            fail_msg("%s: %s", cases[i].name, tio_last_error());
        uint32_t ids[16];
        check_ids(ids, enc(tok, "hello world", 11, 0, ids), cases[i].ids, 2);
        tio_tok_destroy(tok);
    }
}

static void test_cl100k_details(void **state)
{
    tio_tok *tok;
    assert_int_equal(tio_tok_load_encoding(&tok, "cl100k_base", shipped_dir()), 0);
    uint32_t ids[256];
    /* specials: allowed -> their ids; as text -> BPE of '<', '|', ... */
    const char *s = "<|endoftext|>";
    check_ids(ids, enc(tok, s, strlen(s), TIO_TOK_SPECIAL_ALLOW, ids), (uint32_t[]){100257}, 1);
    assert_true(enc(tok, s, strlen(s), TIO_TOK_SPECIAL_TEXT, ids) > 1);
    /* round trip of mixed scripts, emoji with ZWJ and skin tone, combining marks */
    const char *mixed = "Grüße, 世界! 👩🏽‍💻 e\xcc\x81 don't  \n\n 12345";
    size_t n = enc(tok, mixed, strlen(mixed), 0, ids);
    char out[128];
    size_t nb;
    assert_int_equal(tio_tok_decode(tok, ids, n, out, sizeof out, &nb), 0);
    assert_int_equal(nb, strlen(mixed));
    assert_memory_equal(out, mixed, nb);
    tio_tok_destroy(tok);
}

/* Issue 12 item 19: the seeds of fuzz_tok_json did not parse (they failed
 * at merges[3]), so the fuzzer never got past the parser.  Every seed must
 * load and encode a text. */
static void test_fuzz_tok_json_seeds_load(void **state)
{
    char dir[4200];
    snprintf(dir, sizeof dir, "%s/fuzz/corpus/fuzz_tok_json", tio_env("SOURCE_DIR"));
    DIR *d = opendir(dir);
    assert_non_null(d);
    int seeds = 0;
    for (struct dirent *ent; (ent = readdir(d));) {
        if (ent->d_name[0] == '.')
            continue;
        char path[4500];
        snprintf(path, sizeof path, "%s/%s", dir, ent->d_name);
        FILE *f = fopen(path, "rb");
        assert_non_null(f);
        static char json[1 << 20];
        size_t len = fread(json, 1, sizeof json, f);
        fclose(f);
        tio_tok *tok = NULL;
        if (tio_tok_parse_hf(&tok, json, len) != 0)
            fail_msg("%s: %s", ent->d_name, tio_last_error());
        uint32_t ids[64];
        assert_true(enc(tok, "Hello, world! don't 123", 23, TIO_TOK_SPECIAL_TEXT, ids) > 0);
        tio_tok_destroy(tok);
        seeds++;
    }
    closedir(d);
    assert_true(seeds >= 3);
}

/* ---- the built-in splitter (split_builtin.h) against PCRE2 ------------- */

static tio_tok *toy_with(const char *pattern)
{
    size_t len;
    char *ranks = toy_ranks(&len);
    tio_tok *tok = NULL;
    assert_int_equal(tio_tok_parse_tiktoken(&tok, ranks, len, pattern, toy_specials, 1), 0);
    free(ranks);
    return tok;
}

/* The pieces of text by the built-in splitter and by PCRE2: equal ends. */
static void same_pieces(const tio_tok *tok, const char *text, size_t len, size_t *fast, size_t *ref)
{
    size_t nf, nr;
    assert_int_equal(tok_split_pieces(tok, false, text, len, fast, len + 1, &nf), 0);
    assert_int_equal(tok_split_pieces(tok, true, text, len, ref, len + 1, &nr), 0);
    size_t i = 0;
    while (i < nf && i < nr && fast[i] == ref[i])
        i++;
    if (i < nf || i < nr) {
        size_t at = i ? fast[i - 1] : 0;
        fail_msg("piece %zu at byte %zu ('%.12s'): built-in ends at %zd, PCRE2 at %zd", i, at,
                 text + at, i < nf ? (ssize_t)fast[i] : -1, i < nr ? (ssize_t)ref[i] : -1);
    }
}

/* text splits into the pieces `want` (NULL-terminated), by both. */
static void expect_pieces(const tio_tok *tok, const char *text, const char *const *want)
{
    size_t len = strlen(text), fast[64], ref[64], at = 0, k = 0;
    assert_true(len < 63);
    same_pieces(tok, text, len, fast, ref);
    for (; want[k]; k++) {
        size_t n = strlen(want[k]);
        if (fast[k] != at + n || memcmp(text + at, want[k], n))
            fail_msg("'%s': piece %zu is '%.*s', expected '%s'", text, k, (int)(fast[k] - at),
                     text + at, want[k]);
        at += n;
    }
    assert_int_equal(at, len);
}

#define PIECES(tok, text, ...) expect_pieces(tok, text, (const char *const[]){__VA_ARGS__, NULL})

static void test_split_gpt2_cases(void **state)
{
    tio_tok *tok = toy_with(TOK_PATTERN_GPT2);
    assert_int_equal(tok->stages[0].builtin, TOK_SPLIT_GPT2);
    PIECES(tok, "I'm you'll we're", "I", "'m", " you", "'ll", " we", "'re");
    PIECES(tok, "I'M 'x", "I", "'", "M", " '", "x"); /* contractions are lower-case only */
    PIECES(tok, "  hello", " ", " hello");
    PIECES(tok, "a \n b", "a", " \n", " b");          /* \s+(?!\S) leaves the last space */
    PIECES(tok, "a  \n", "a", "  \n");                /* ... except at the end */
    PIECES(tok, "\n\nx", "\n", "\n", "x");
    PIECES(tok, "12345 678", "12345", " 678");        /* no {1,3} here */
    PIECES(tok, "\xc2\xa0" "a", "\xc2\xa0", "a");     /* U+00A0 is space, not ' ' */
    PIECES(tok, "x?!  ", "x", "?!", "  ");
    tio_tok_destroy(tok);
}

static void test_split_cl100k_cases(void **state)
{
    tio_tok *tok = toy_with(TOK_PATTERN_CL100K);
    assert_int_equal(tok->stages[0].builtin, TOK_SPLIT_CL100K);
    PIECES(tok, "I'M He'Ll", "I", "'M", " He", "'Ll");
    PIECES(tok, "'\xc5\xbf" "a", "'\xc5\xbf", "a"); /* U+017F LONG S folds to s */
    PIECES(tok, "'sup", "'s", "up");
    PIECES(tok, "12345", "123", "45");
    PIECES(tok, "\xd9\xa1\xd9\xa2\xd9\xa3\xd9\xa4", "\xd9\xa1\xd9\xa2\xd9\xa3", "\xd9\xa4"); /* Nd */
    PIECES(tok, "\r\n\r\n  x", "\r\n\r\n", " ", " x");
    PIECES(tok, "x  \n\t y", "x", "  \n", "\t", " y");
    PIECES(tok, "foo)\n\n", "foo", ")\n\n");
    PIECES(tok, " (\nx", " (\n", "x");
    PIECES(tok, "\tword \xe3\x80\x80\xe4\xb8\xad", "\tword", " ", "\xe3\x80\x80\xe4\xb8\xad");
    PIECES(tok, "e\xcc\x81", "e", "\xcc\x81"); /* a mark is not a letter */
    PIECES(tok, "$x 1a", "$x", " ", "1", "a");
    tio_tok_destroy(tok);
}

static void test_split_o200k_cases(void **state)
{
    tio_tok *tok = toy_with(TOK_PATTERN_O200K);
    assert_int_equal(tok->stages[0].builtin, TOK_SPLIT_O200K);
    PIECES(tok, "HelloWorld HELLOworld ABC", "Hello", "World", " HELLOworld", " ABC");
    PIECES(tok, "don't DON'T ABC's", "don't", " DON'T", " ABC's");
    PIECES(tok, "\xe4\xb8\xad" "A", "\xe4\xb8\xad", "A"); /* Lo is in both classes */
    PIECES(tok, "e\xcc\x81" "A", "e\xcc\x81", "A");
    PIECES(tok, "a/b x)\n/", "a", "/b", " x", ")\n/");
    PIECES(tok, "12345", "123", "45");
    PIECES(tok, "\n\n \t\n  x", "\n\n \t\n", " ", " x");
    tio_tok_destroy(tok);
}

/* Invalid UTF-8 cuts the text; each valid run is split as a whole text. */
static void test_split_invalid_utf8(void **state)
{
    const char *patterns[] = {TOK_PATTERN_GPT2, TOK_PATTERN_CL100K, TOK_PATTERN_O200K};
    for (int p = 0; p < 3; p++) {
        tio_tok *tok = toy_with(patterns[p]);
        PIECES(tok, "ab\xff\xfe" "cd  \xc3", "ab", "\xff\xfe", "cd", "  ", "\xc3");
        PIECES(tok, "a \xed\xa0\x80 b", "a", " ", "\xed\xa0\x80", " b"); /* a surrogate */
        tio_tok_destroy(tok);
    }
}

/* Every code point (the table of unicode_class.h) against PCRE2 (split.c's
 * Unicode 16.0 classes), for each pattern: in contexts that tell each class
 * apart (letter, number, space, o200k's two letter classes) all of them; in
 * the contexts of the other rules (contractions, marks, prefixes) those
 * below U+0800 and every 61st after.  Under sanitizers every 61st only. */
static void test_split_every_code_point(void **state)
{
    static const char *contexts[] = {
        /* every code point */
        "a%s", "1%s2", " %s ", "ab%sCD", "AB%scd",
        /* sampled */
        "%s", "A%sb", "%sa", "'%s", "'%sa", "a'%s", "(%s", "%s\n ", "\xcc\x81%s", "%s\xcc\x81",
        "\xe4\xb8\xad%sA", "%s%s"};
    const size_t n_full = 5;
    const char *patterns[] = {TOK_PATTERN_GPT2, TOK_PATTERN_CL100K, TOK_PATTERN_O200K};
#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
    const bool sanitized = true;
#else
    const bool sanitized = false;
#endif
    size_t cap = (size_t)0x110000 * 16 + 64;
    char *text = malloc(cap);
    size_t *fast = malloc(cap * sizeof *fast), *ref = malloc(cap * sizeof *ref);
    assert_true(text && fast && ref);
    for (int p = 0; p < 3; p++) {
        tio_tok *tok = toy_with(patterns[p]);
        for (size_t c = 0; c < sizeof contexts / sizeof contexts[0]; c++) {
            size_t n = 0;
            bool sampled = sanitized || c >= n_full;
            for (uint32_t cp = 0; cp < 0x110000; cp += sampled && cp >= 0x800 ? 61 : 1) {
                if ((cp >= 0xd800 && cp < 0xe000) || (sanitized && cp % 61))
                    continue;
                unsigned char u[5] = {0};
                if (cp < 0x80) {
                    u[0] = (unsigned char)cp;
                } else if (cp < 0x800) {
                    u[0] = (unsigned char)(0xc0 | cp >> 6), u[1] = (unsigned char)(0x80 | (cp & 63));
                } else if (cp < 0x10000) {
                    u[0] = (unsigned char)(0xe0 | cp >> 12);
                    u[1] = (unsigned char)(0x80 | ((cp >> 6) & 63)), u[2] = (unsigned char)(0x80 | (cp & 63));
                } else {
                    u[0] = (unsigned char)(0xf0 | cp >> 18), u[1] = (unsigned char)(0x80 | ((cp >> 12) & 63));
                    u[2] = (unsigned char)(0x80 | ((cp >> 6) & 63)), u[3] = (unsigned char)(0x80 | (cp & 63));
                }
                if (cp == 0)
                    u[0] = 0x7f; /* "%s" cannot hold NUL; DEL is of the same class */
                n += (size_t)snprintf(text + n, cap - n, contexts[c], (char *)u, (char *)u);
                text[n++] = 0x7f; /* a separator of class "other" */
            }
            same_pieces(tok, text, n, fast, ref);
        }
        tio_tok_destroy(tok);
    }
    free(text);
    free(fast);
    free(ref);
}

/* Scratch folders under $TIO_TEST_TMPDIR, made empty; removed by
 * scratch_remove(). */
static char scratch_dirs[4][4096];
static int n_scratch;

static const char *scratch(const char *name)
{
    const char *base = tio_env("TEST_TMPDIR");
    assert_true(n_scratch < 4);
    char *d = scratch_dirs[n_scratch++];
    snprintf(d, sizeof scratch_dirs[0], "%s/tok-%s-%d", base ? base : "/tmp", name, (int)getpid());
    char cmd[4200];
    snprintf(cmd, sizeof cmd, "rm -rf '%s' && mkdir -p '%s'", d, d);
    assert_int_equal(system(cmd), 0);
    return d;
}

static void scratch_remove(void)
{
    for (; n_scratch > 0; n_scratch--) {
        char cmd[4200];
        snprintf(cmd, sizeof cmd, "rm -rf '%s'", scratch_dirs[n_scratch - 1]);
        assert_int_equal(system(cmd), 0);
    }
}

/* Copy the shipped rank file of `encoding` to dir/name; with flip_at >= 0,
 * the byte there is changed. */
static void put_rank_file(const char *encoding, const char *dir, const char *name, long flip_at)
{
    char src[4200], dst[4200];
    snprintf(src, sizeof src, "%s/%s.tiktoken", shipped_dir(), encoding);
    snprintf(dst, sizeof dst, "%s/%s", dir, name);
    FILE *in = fopen(src, "rb"), *out = fopen(dst, "wb");
    assert_non_null(in);
    assert_non_null(out);
    int c;
    for (long at = 0; (c = fgetc(in)) != EOF; at++)
        fputc(at == flip_at ? (c == 'A' ? 'B' : 'A') : c, out);
    fclose(in);
    assert_int_equal(fclose(out), 0);
}

static void expect_path(const char *dir, const char *want_dir, const char *want_file)
{
    char path[4200], want[4300];
    assert_int_equal(tio_tok_encoding_path("cl100k_base", dir, path, sizeof path), 0);
    snprintf(want, sizeof want, "%s/%s", want_dir, want_file);
    assert_string_equal(path, want);
}

#define CL100K_CACHE_KEY "9b5ad71b2ce5302211f9c61530b329a4922fc6a4" /* sha1 of its URL */

/* Look-up order: the directory given, $TERAIO_TOKENIZERS_DIR, tiktoken's
 * cache ($TIKTOKEN_CACHE_DIR, $DATA_GYM_CACHE_DIR, $TMPDIR/data-gym-cache),
 * then the shipped copy (build/tokenizers beside this test's build/bin). */
static void test_encoding_path_order(void **state)
{
    char path[4200];
    assert_int_equal(tio_tok_encoding_path("nope", "/tmp", path, sizeof path), -ENOENT);
    assert_non_null(strstr(tio_last_error(), "unknown encoding"));
    char tiny[8];
    assert_int_equal(tio_tok_encoding_path("cl100k_base", "/nonexistent", tiny, sizeof tiny), -ENAMETOOLONG);

    lookup_env_clear();
    assert_int_equal(tio_tok_encoding_path("cl100k_base", "/nonexistent", path, sizeof path), 0);
    const char *tail = "/tokenizers/cl100k_base.tiktoken";
    assert_true(strlen(path) > strlen(tail));
    assert_string_equal(path + strlen(path) - strlen(tail), tail);

    const char *given = scratch("given"), *env = scratch("env"), *cache = scratch("cache"),
               *tmp = scratch("tmp");
    put_rank_file("cl100k_base", given, "cl100k_base.tiktoken", -1);
    put_rank_file("cl100k_base", env, "cl100k_base.tiktoken", -1);
    put_rank_file("cl100k_base", cache, CL100K_CACHE_KEY, -1);
    char gym[4200];
    snprintf(gym, sizeof gym, "%s/data-gym-cache", tmp);
    assert_int_equal(mkdir(gym, 0700), 0);
    put_rank_file("cl100k_base", gym, CL100K_CACHE_KEY, -1);

    setenv("TERAIO_TOKENIZERS_DIR", env, 1);
    setenv("TIKTOKEN_CACHE_DIR", cache, 1);
    expect_path(given, given, "cl100k_base.tiktoken");
    expect_path(NULL, env, "cl100k_base.tiktoken");
    expect_path("/nonexistent", env, "cl100k_base.tiktoken");
    unsetenv("TERAIO_TOKENIZERS_DIR");
    expect_path(NULL, cache, CL100K_CACHE_KEY);
    unsetenv("TIKTOKEN_CACHE_DIR");
    setenv("DATA_GYM_CACHE_DIR", cache, 1);
    expect_path(NULL, cache, CL100K_CACHE_KEY);
    unsetenv("DATA_GYM_CACHE_DIR");
    char *old_tmp = getenv("TMPDIR") ? strdup(getenv("TMPDIR")) : NULL;
    setenv("TMPDIR", tmp, 1);
    expect_path(NULL, gym, CL100K_CACHE_KEY);
    tio_tok *tok;
    assert_int_equal(tio_tok_load_encoding(&tok, "cl100k_base", NULL), 0); /* from tiktoken's cache */
    tio_tok_destroy(tok);
    if (old_tmp)
        setenv("TMPDIR", old_tmp, 1);
    else
        unsetenv("TMPDIR");
    free(old_tmp);
    lookup_env_clear();
    scratch_remove();
}

/* A rank file with one byte changed is refused wherever it is found, naming
 * the file and both digests; a rank file of another encoding under this
 * encoding's name too. */
static void test_encoding_sha256_mismatch(void **state)
{
    lookup_env_clear();
    const char *dir = scratch("flip");
    put_rank_file("cl100k_base", dir, "cl100k_base.tiktoken", 1000);
    tio_tok *tok = (tio_tok *)1;
    assert_int_equal(tio_tok_load_encoding(&tok, "cl100k_base", dir), TIO_ECORRUPT);
    assert_null(tok);
    char want[4200];
    snprintf(want, sizeof want, "%s/cl100k_base.tiktoken: sha256 ", dir);
    assert_non_null(strstr(tio_last_error(), want));
    assert_non_null(strstr(tio_last_error(),
                           "223921b76ee99bde995b7ff738513eef100fb51d18c93597a113bcffe865b2a7"));
    setenv("TIKTOKEN_CACHE_DIR", dir, 1);
    put_rank_file("r50k_base", dir, CL100K_CACHE_KEY, -1);
    assert_int_equal(tio_tok_load_encoding(&tok, "cl100k_base", NULL), TIO_ECORRUPT);
    assert_non_null(strstr(tio_last_error(), CL100K_CACHE_KEY ": sha256 "));
    lookup_env_clear();
    scratch_remove();
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_toy_merges),
        cmocka_unit_test(test_toy_special_modes),
        cmocka_unit_test(test_toy_decode_and_invalid_utf8),
        cmocka_unit_test(test_toy_batch),
        cmocka_unit_test(test_rank_file_errors),
        cmocka_unit_test(test_hf_json),
        cmocka_unit_test(test_hf_errors),
        cmocka_unit_test(test_prefix_space_needs_one_more_id),
        cmocka_unit_test(test_known_vectors),
        cmocka_unit_test(test_cl100k_details),
        cmocka_unit_test(test_fuzz_tok_json_seeds_load),
        cmocka_unit_test(test_split_gpt2_cases),
        cmocka_unit_test(test_split_cl100k_cases),
        cmocka_unit_test(test_split_o200k_cases),
        cmocka_unit_test(test_split_invalid_utf8),
        cmocka_unit_test(test_split_every_code_point),
        cmocka_unit_test(test_encoding_path_order),
        cmocka_unit_test(test_encoding_sha256_mismatch),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
