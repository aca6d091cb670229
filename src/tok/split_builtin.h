/*
 * tok/split_builtin.h — the split regexes of the built-in encodings, written
 * out by hand: GPT-2's (r50k_base, p50k_base, Hugging Face ByteLevel),
 * cl100k_base's (also Llama 3's) and o200k_base's.  A JIT-compiled PCRE2
 * match costs about 200 instructions per byte of text, most of the encoding
 * time; these functions find the same pieces in a few per byte.  PCRE2
 * stays the engine for every other pattern and the reference the tests and
 * fuzz_tok_split compare these with (tok_split_pieces).
 *
 * Each piece_* function returns the end of the piece that starts at s[i]
 * (i < n) of valid UTF-8 s[0..n).  With these patterns every position
 * starts a non-empty match, so pieces tile the text and the leftmost match
 * from i always starts at i.  What each alternative matches under PCRE2's
 * (and fancy-regex's) leftmost-first backtracking, where it is not obvious:
 *   - `\s+(?!\S)`: a run of White_Space, less its last character unless
 *     the run ends the text; a run of one character fails, and `\s+` then
 *     takes it;
 *   - `\s*[\r\n]+` (cl100k, o200k, tried first): the run up to and
 *     including its last CR or LF;
 *   - `X?[U]*[W]+` (o200k, U and W overlapping classes): [U]* gives back
 *     characters until a W follows, so the match ends after the first W
 *     after the U run or, failing that, after the last W inside it;
 *   - the optional prefix `[^\r\n\p{L}\p{N}]?` is tried consumed first,
 *     then not, before the next alternative;
 *   - `(?i:'s|...)` folds as Unicode simple case folding does: 'S' and
 *     U+017F LATIN SMALL LETTER LONG S match 's'.
 * Code point classes come from unicode_class.h (Unicode 16.0, generated).
 */
#ifndef TERAIO_TOK_SPLIT_BUILTIN_H
#define TERAIO_TOK_SPLIT_BUILTIN_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include "tok/unicode_class.h"

#define UC_L 1u     /* \p{L} */
#define UC_N 2u     /* \p{N} */
#define UC_WS 4u    /* White_Space: the patterns' \s */
#define UC_UP 8u    /* [\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}] */
#define UC_LO 16u   /* [\p{Ll}\p{Lm}\p{Lo}\p{M}] */
#define UC_CRLF 32u /* \r or \n */
#define UC_HI 64u   /* uc_byte only: a byte from 0x80, look the code point up */

/* Flags of the code point at s (valid UTF-8, s[0] >= 0x80); *k gets its
 * length in bytes. */
static inline unsigned uc_class_hi(const uint8_t *s, size_t *k)
{
    uint32_t c = s[0], cp;
    if (c < 0xe0) {
        *k = 2;
        cp = (c & 0x1f) << 6 | (s[1] & 0x3fu);
    } else if (c < 0xf0) {
        *k = 3;
        cp = (c & 0x0f) << 12 | (s[1] & 0x3fu) << 6 | (s[2] & 0x3fu);
    } else {
        *k = 4;
        cp = (c & 0x07) << 18 | (s[1] & 0x3fu) << 12 | (s[2] & 0x3fu) << 6 | (s[3] & 0x3fu);
    }
    return uc_rows[uc_block[cp >> 8]][cp & 0xff];
}

/* Flags of the code point at s (valid UTF-8); *k gets its length in bytes. */
static inline unsigned uc_class(const uint8_t *s, size_t *k)
{
    if (s[0] < 0x80) {
        *k = 1;
        return uc_byte[s[0]];
    }
    return uc_class_hi(s, k);
}

/* Bit 7 of each byte of x that lies in [lo, hi] (1 <= lo <= hi < 0x80),
 * x's bytes below 0x80 (SWAR: one add per bound, no carry between bytes). */
static inline uint64_t swar_in(uint64_t x, unsigned lo, unsigned hi)
{
    const uint64_t ones = 0x0101010101010101ull;
    return (x + ones * (0x80 - lo)) & ~(x + ones * (0x7f - hi)) & (ones << 7);
}

/* The ASCII letters of a run of `mask` (UC_L: a-z A-Z, UC_LO: a-z,
 * UC_UP: A-Z) from s[i], eight bytes at a time while they last: words end
 * without a branch per letter. */
static inline size_t ascii_letters(const uint8_t *s, size_t n, size_t i, unsigned mask)
{
    const uint64_t high = 0x8080808080808080ull;
    while (n - i >= 8) {
        uint64_t v, x;
        memcpy(&v, s + i, 8);
        x = (mask == UC_L ? v | 0x2020202020202020ull : v) & ~high;
        uint64_t in = swar_in(x, mask == UC_UP ? 'A' : 'a', mask == UC_UP ? 'Z' : 'z') & ~v;
        uint64_t stop = ~in & high;
        if (stop)
            return i + ((size_t)__builtin_ctzll(stop) >> 3);
        i += 8;
    }
    return i;
}

/* End of the run from s[i] of code points that have a flag of `mask`
 * (when `in`) or none of them (when !in).  ASCII bytes cost one table test
 * each (a byte from 0x80 has only UC_HI, which ends the inner loop), or
 * less for letters. */
static inline size_t uc_run(const uint8_t *s, size_t n, size_t i, unsigned mask, bool in)
{
    for (;;) {
        if (in && (mask == UC_L || mask == UC_LO || mask == UC_UP))
            i = ascii_letters(s, n, i, mask);
        if (in)
            while (i < n && (uc_byte[s[i]] & mask))
                i++;
        else
            while (i < n && !(uc_byte[s[i]] & (mask | UC_HI)))
                i++;
        if (i >= n || s[i] < 0x80)
            return i;
        size_t k;
        if (((uc_class_hi(s + i, &k) & mask) != 0) != in)
            return i;
        i += k;
    }
}

/* \p{N}{1,3} from s[i], whose first code point (k bytes) is a number. */
static inline size_t uc_digits3(const uint8_t *s, size_t n, size_t i, size_t k)
{
    size_t e = i + k;
    for (int count = 1; count < 3 && e < n; count++) {
        if (!(uc_class(s + e, &k) & UC_N))
            break;
        e += k;
    }
    return e;
}

/* Bytes of the contraction 's 't 're 've 'm 'll 'd at s[i], 0 if none;
 * `fold`: case-insensitively ((?i:...)). */
static inline size_t contraction(const uint8_t *s, size_t n, size_t i, bool fold)
{
    if (i + 1 >= n || s[i] != '\'')
        return 0;
    uint8_t a = s[i + 1];
    if (fold) {
        if (a == 0xc5 && i + 2 < n && s[i + 2] == 0xbf) /* U+017F */
            return 3;
        a = a >= 'A' && a <= 'Z' ? (uint8_t)(a + 32) : a;
    }
    if (a == 's' || a == 't' || a == 'm' || a == 'd')
        return 2;
    if (i + 2 >= n)
        return 0;
    uint8_t b = s[i + 2];
    b = fold && b >= 'A' && b <= 'Z' ? (uint8_t)(b + 32) : b;
    return ((a == 'r' || a == 'v') && b == 'e') || (a == 'l' && b == 'l') ? 3 : 0;
}

/* A White_Space run from s[i]: `\s*[\r\n]+` when `crlf` (cl100k, o200k),
 * then `\s+(?!\S)`, then `\s+`. */
static inline size_t ws_piece(const uint8_t *s, size_t n, size_t i, bool crlf)
{
    size_t last = i, e = i, crlf_end = 0;
    while (e < n) {
        size_t k;
        unsigned f = uc_class(s + e, &k);
        if (!(f & UC_WS))
            break;
        if (f & UC_CRLF)
            crlf_end = e + 1;
        last = e;
        e += k;
    }
    if (crlf && crlf_end)
        return crlf_end;
    return e == n || last == i ? e : last;
}

/* ` ?[^\s\p{L}\p{N}]+` and then [\r\n]* (cl100k) or, with `slash`,
 * [\r\n/]* (o200k); 0 when s[i] (flags f, k bytes) starts no such match. */
static inline size_t other_piece(const uint8_t *s, size_t n, size_t i, unsigned f, size_t k,
                                 bool slash)
{
    size_t j = i;
    if (s[i] == ' ' && i + 1 < n) {
        j = i + 1;
        f = uc_class(s + j, &k);
    }
    if (f & (UC_WS | UC_L | UC_N))
        return 0;
    size_t e = uc_run(s, n, j + k, UC_WS | UC_L | UC_N, false);
    while (e < n && (s[e] == '\r' || s[e] == '\n' || (slash && s[e] == '/')))
        e++;
    return e;
}

/* 's|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+ */
static inline size_t piece_gpt2(const uint8_t *s, size_t n, size_t i)
{
    size_t m = contraction(s, n, i, false);
    if (m)
        return i + m;
    size_t j = i + (s[i] == ' ' && i + 1 < n), k;
    unsigned f = uc_class(s + j, &k);
    if (f & UC_L)
        return uc_run(s, n, j + k, UC_L, true);
    if (f & UC_N)
        return uc_run(s, n, j + k, UC_N, true);
    if (!(f & UC_WS))
        return uc_run(s, n, j + k, UC_WS | UC_L | UC_N, false);
    return ws_piece(s, n, i, false);
}

/* (?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}
 * | ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+ */
static inline size_t piece_cl100k(const uint8_t *s, size_t n, size_t i)
{
    size_t m = contraction(s, n, i, true);
    if (m)
        return i + m;
    size_t k;
    unsigned f = uc_class(s + i, &k);
    if (f & UC_L)
        return uc_run(s, n, i + k, UC_L, true);
    if (!(f & (UC_N | UC_CRLF)) && i + k < n) {
        size_t k2;
        if (uc_class(s + i + k, &k2) & UC_L)
            return uc_run(s, n, i + k + k2, UC_L, true);
    }
    if (f & UC_N)
        return uc_digits3(s, n, i, k);
    size_t e = other_piece(s, n, i, f, k, false);
    return e ? e : ws_piece(s, n, i, true);
}

/* [\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+ from s[p]: its
 * end, 0 if it does not match. */
static inline size_t o200k_lower(const uint8_t *s, size_t n, size_t p)
{
    size_t last_lo = 0;
    while (p < n) {
        size_t k;
        unsigned f = uc_class(s + p, &k);
        if (!(f & UC_UP))
            return f & UC_LO ? uc_run(s, n, p + k, UC_LO, true) : last_lo;
        p += k;
        if (f & UC_LO)
            last_lo = p;
    }
    return last_lo;
}

/* [\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]* from s[p]: its
 * end, 0 if it does not match. */
static inline size_t o200k_upper(const uint8_t *s, size_t n, size_t p)
{
    size_t k;
    if (p >= n || !(uc_class(s + p, &k) & UC_UP))
        return 0;
    return uc_run(s, n, uc_run(s, n, p + k, UC_UP, true), UC_LO, true);
}

/* [^\r\n\p{L}\p{N}]?[U]*[W]+(?i:'s|'t|'re|'ve|'m|'ll|'d)?
 * |[^\r\n\p{L}\p{N}]?[U]+[W]*(?i:'s|'t|'re|'ve|'m|'ll|'d)?
 * |\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+
 * (U, W: the classes of o200k_lower) */
static inline size_t piece_o200k(const uint8_t *s, size_t n, size_t i)
{
    size_t k, e = 0;
    unsigned f = uc_class(s + i, &k);
    bool prefix = !(f & (UC_L | UC_N | UC_CRLF));
    if (prefix)
        e = o200k_lower(s, n, i + k);
    if (!e && (f & (UC_UP | UC_LO)))
        e = o200k_lower(s, n, i);
    if (!e && prefix)
        e = o200k_upper(s, n, i + k);
    if (!e && (f & UC_UP))
        e = o200k_upper(s, n, i);
    if (e)
        return e + contraction(s, n, e, true);
    if (f & UC_N)
        return uc_digits3(s, n, i, k);
    e = other_piece(s, n, i, f, k, true);
    return e ? e : ws_piece(s, n, i, true);
}

#endif
