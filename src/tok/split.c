/*
 * tok/split.c — the split (pre-tokenization) regex: a tiktoken or Hugging
 * Face pattern compiled with PCRE2 in UTF mode and JIT-compiled.
 *
 * tiktoken runs its patterns with Rust's `fancy-regex`, which hands
 * everything but look-around and backreferences to the `regex` crate.  The
 * syntax of the patterns in use (\p{..} classes, (?i:...), possessive and
 * counted repeats, (?!...)) means the same in PCRE2 with two exceptions,
 * both fixed here before compiling:
 *   - `\s`: Rust means the Unicode White_Space property; PCRE2 (with UCP)
 *     means \p{Z} plus \h and \v, which adds U+180E MONGOLIAN VOWEL
 *     SEPARATOR.  `\s` and `\S` are rewritten to explicit White_Space sets.
 *   - `$`: Rust's `$` (no multi-line flag) matches only at the very end;
 *     PCRE2's also before a final newline unless PCRE2_DOLLAR_ENDONLY.
 * Both engines pick the first alternative that matches (leftmost-first), so
 * the pieces are the same.
 */
#include <errno.h>
#include <stdlib.h>

#include "common/util.h"
#include "tok/tok_internal.h"

#if TIO_HAVE_PCRE2

/* Unicode White_Space, as ranges inside a character class. */
static const char white_space[] =
    "\\x{9}-\\x{d}\\x{20}\\x{85}\\x{a0}\\x{1680}\\x{2000}-\\x{200a}"
    "\\x{2028}\\x{2029}\\x{202f}\\x{205f}\\x{3000}";

typedef struct {
    char *s;
    size_t len, cap;
} strbuf;

static int put(strbuf *b, const char *s, size_t n)
{
    if (b->len + n + 1 > b->cap) {
        size_t cap = b->cap ? b->cap : 256;
        while (cap < b->len + n + 1)
            cap *= 2;
        char *p = realloc(b->s, cap);
        if (!p)
            return tio_fail(-ENOMEM, "out of memory rewriting a regex");
        b->s = p;
        b->cap = cap;
    }
    memcpy(b->s + b->len, s, n);
    b->len += n;
    b->s[b->len] = '\0';
    return 0;
}

/* Rewrite \s and \S (see the top of the file).  Tracks whether the scan is
 * inside a character class, where \s becomes bare ranges; \S inside a class
 * has no such spelling and is refused. */
static int rewrite_pattern(const char *pat, size_t len, strbuf *out)
{
    bool in_class = false;
    int rc = 0;
    for (size_t i = 0; i < len && rc == 0; i++) {
        char c = pat[i];
        if (c == '\\' && i + 1 < len) {
            char e = pat[i + 1];
            i++;
            if (e == 's') {
                rc = in_class ? put(out, white_space, sizeof white_space - 1)
                              : (put(out, "[", 1) ?: put(out, white_space, sizeof white_space - 1) ?: put(out, "]", 1));
            } else if (e == 'S') {
                if (in_class)
                    return tio_fail(-ENOTSUP, "regex: \\S inside a character class is not supported");
                rc = put(out, "[^", 2) ?: put(out, white_space, sizeof white_space - 1) ?: put(out, "]", 1);
            } else {
                rc = put(out, pat + i - 1, 2);
            }
            continue;
        }
        if (!in_class && c == '[') {
            in_class = true;
            rc = put(out, &c, 1);
            /* A ']' right after '[' or '[^' is a literal. */
            if (i + 1 < len && pat[i + 1] == '^')
                rc = rc ?: put(out, &pat[++i], 1);
            if (i + 1 < len && pat[i + 1] == ']')
                rc = rc ?: put(out, &pat[++i], 1);
            continue;
        }
        if (in_class && c == '[' && i + 1 < len && pat[i + 1] == ':') {
            const char *end = memmem(pat + i + 2, len - i - 2, ":]", 2);
            if (end) {
                size_t n = (size_t)(end + 2 - (pat + i));
                rc = put(out, pat + i, n);
                i += n - 1;
                continue;
            }
        }
        if (in_class && c == ']')
            in_class = false;
        rc = put(out, &c, 1);
    }
    return rc;
}

int tok_add_stage(tio_tok *tok, const char *pattern, size_t len, bool keep_gaps)
{
    if (tok->n_stages >= TOK_MAX_STAGES)
        return tio_fail(-ENOTSUP, "more than %d split regexes", TOK_MAX_STAGES);
    strbuf b = {0};
    int rc = rewrite_pattern(pattern, len, &b);
    if (rc == 0 && !b.s)
        rc = put(&b, "", 0);
    if (rc < 0) {
        free(b.s);
        return rc;
    }
    pcre2_compile_context *cc = pcre2_compile_context_create(NULL);
    if (!cc) {
        free(b.s);
        return tio_fail(-ENOMEM, "out of memory compiling a regex");
    }
    pcre2_set_newline(cc, PCRE2_NEWLINE_LF);
    int err = 0;
    PCRE2_SIZE err_off = 0;
    pcre2_code *code = pcre2_compile((PCRE2_SPTR)b.s, b.len,
                                     PCRE2_UTF | PCRE2_UCP | PCRE2_DOLLAR_ENDONLY, &err, &err_off, cc);
    pcre2_compile_context_free(cc);
    free(b.s);
    if (!code) {
        PCRE2_UCHAR msg[256];
        pcre2_get_error_message(err, msg, sizeof msg);
        return tio_fail(-EINVAL, "split regex does not compile: %s (near offset %zu)", (char *)msg,
                        (size_t)err_off);
    }
    tok_stage *st = &tok->stages[tok->n_stages++];
    st->code = code;
    st->jit = pcre2_jit_compile(code, PCRE2_JIT_COMPLETE) == 0;
    if (!st->jit)
        tio_log(TIO_LOG_WARN, "tokenizer: PCRE2 JIT unavailable, split regex is interpreted");
    st->keep_gaps = keep_gaps;
    return 0;
}

void tok_free_stages(tio_tok *tok)
{
    for (int i = 0; i < tok->n_stages; i++)
        pcre2_code_free(tok->stages[i].code);
    tok->n_stages = 0;
}

#else

int tok_add_stage(tio_tok *tok, const char *pattern, size_t len, bool keep_gaps)
{
    return tio_fail(-ENOTSUP, "teraio was built without PCRE2: no split regex");
}

void tok_free_stages(tio_tok *tok) {}

#endif
