/*
 * teraio/tok.h — byte-level BPE tokenizers: tiktoken encodings and Hugging
 * Face tokenizer.json files, encoding to exactly the ids of those libraries.
 *
 * The algorithm is byte-level byte-pair encoding: BPE for subwords as in
 * Sennrich, Haddow & Birch, "Neural Machine Translation of Rare Words with
 * Subword Units" (ACL 2016), applied to the UTF-8 bytes of the text as in
 * GPT-2 (Radford et al., "Language Models are Unsupervised Multitask
 * Learners", 2019).  Encoding a text is three steps:
 *
 *   1. special tokens: with TIO_TOK_SPECIAL_ALLOW, occurrences of the special
 *      (added) token strings are cut out of the text, leftmost first and, at
 *      one position, longest first, and become their ids;
 *   2. pre-tokenization: each remaining stretch of text is cut into pieces by
 *      the encoding's split regex: for the patterns of the built-in
 *      encodings (also GPT-2's ByteLevel and Llama 3's Split), code written
 *      for each that finds the same pieces; for any other, PCRE2 with JIT,
 *      in UTF mode, with `\s` and `\S` rewritten to Unicode White_Space as
 *      the Rust `regex` crate under tiktoken's `fancy-regex` defines them;
 *   3. BPE: a piece that is itself a token is that token; otherwise it starts
 *      as one token per byte and the adjacent pair with the lowest merge rank
 *      is merged, leftmost first on ties, until no pair can merge.
 *
 * Formats:
 *   - tiktoken (`.tiktoken` rank files): one line per token, "<base64 bytes>
 *     <rank>", the rank being both the token id and the merge priority (a
 *     pair merges when the concatenation of its bytes is a token; the lower
 *     the resulting rank, the earlier).  The split regex and special tokens
 *     are not in the file: they come from the caller or, for r50k_base,
 *     p50k_base, cl100k_base and o200k_base, from the built-in table (the
 *     values tiktoken ships).  Text not covered by any regex match is
 *     dropped, as in tiktoken (none is, with the built-in patterns).
 *   - Hugging Face tokenizer.json with model type "BPE" over the ByteLevel
 *     alphabet: pre_tokenizer ByteLevel (use_regex true or false,
 *     add_prefix_space), Split (Regex, behavior "Isolated", not inverted),
 *     or a Sequence of Splits optionally followed by ByteLevel; normalizer
 *     null; merges as "a b" strings or ["a", "b"] pairs (priority = position
 *     in the list); ignore_merges; added tokens (special or not) without the
 *     lstrip/rstrip/single_word options.  Text between regex matches is kept
 *     as pieces (HF's "Isolated" behaviour).  The post-processor is not
 *     applied: ids are those of `Tokenizer.encode(text,
 *     add_special_tokens=False)`.  Added tokens are always recognised (HF
 *     does not let them be text), whatever the `special` mode says, except
 *     that TIO_TOK_SPECIAL_REJECT still rejects them.  Anything else fails
 *     to load with -ENOTSUP and a message naming the field.
 *
 * Invalid UTF-8: never an error.  The text is split into maximal valid UTF-8
 * runs and maximal runs of bytes that belong to no valid sequence; each
 * valid run is pre-tokenized as if it were a whole text, and each invalid run
 * is one piece, BPE-encoded over its bytes.  So encoding is lossless for
 * every byte string (decode(encode(x)) == x with the built-in encodings, and
 * with any encoding whose regex covers all text), and valid UTF-8 gives
 * exactly the reference ids.
 *
 * Ids: a tio_tok's ids lie in [0, tio_tok_vocab_size()); there may be gaps
 * (p50k_base has one), which decode rejects.  At most 4,194,304 ids, tokens
 * of at most 65,535 bytes.
 *
 * Thread-safety: a loaded tio_tok is read-only; encode, decode and the
 * queries may run concurrently on one tio_tok from any number of threads.
 * Each thread that encodes gets its own scratch state (regex match data, a
 * bounded piece cache of TIO_TOK_CACHE_ENTRIES entries, merge buffers),
 * created on its first call and freed when the thread exits or by
 * tio_tok_destroy, whichever comes first.  destroy must not run
 * concurrently with any other call on the same tio_tok, nor with the exit
 * of a thread that used it.  Each live tio_tok holds one pthread key (the
 * system allows at least 128).
 *
 * Errors: every function returns 0 or a negative code (teraio/common.h);
 * tio_last_error() names the file, line and field of a parse error.
 *
 * Building: needs PCRE2 (libpcre2-8); tokenizer.json needs json-c.  Without
 * them the load functions return -ENOTSUP.
 */
#ifndef TERAIO_TOK_H
#define TERAIO_TOK_H

#include "teraio/common.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct tio_tok tio_tok;

/* Highest id count a tokenizer may have, and the longest token in bytes. */
#define TIO_TOK_MAX_IDS (1u << 22)
#define TIO_TOK_MAX_TOKEN_BYTES 65535u
/* Pieces of at most this many bytes that are not whole tokens have their
 * BPE result kept in a per-thread direct-mapped cache of this many slots. */
#define TIO_TOK_CACHE_ENTRIES 4096
#define TIO_TOK_CACHE_PIECE_BYTES 24

/* How special-token strings in the text are treated by encode. */
enum {
    /* Ordinary text, BPE-encoded like the rest (tiktoken's encode_ordinary;
     * for tokenizer.json files, added tokens are still recognised). */
    TIO_TOK_SPECIAL_TEXT = 0,
    /* Recognised and emitted as their ids (tiktoken's
     * allowed_special="all"; tokenizer.json's always). */
    TIO_TOK_SPECIAL_ALLOW = 1,
    /* The call fails with TIO_EPARSE, naming the token and its byte offset,
     * if any occurs (tiktoken's default encode, which raises ValueError). */
    TIO_TOK_SPECIAL_REJECT = 2,
};

/* A special token: its text (UTF-8, NUL-terminated) and id. */
typedef struct {
    const char *text;
    uint32_t id;
} tio_tok_special;

/* ---- loading ---------------------------------------------------------- */

/* Load a tiktoken rank file (`path`, "<base64> <rank>" per line, blank
 * lines ignored) with split regex `pat_str` (PCRE2 syntax, the tiktoken
 * pattern as given) and `n_specials` special tokens (ids must not collide
 * with ranks or each other; texts must be non-empty and distinct).
 * All 256 single bytes must be tokens.  The tio_tok copies what it needs.
 * Returns 0 and *out, or: -ENOENT/-EACCES/-EIO reading the file;
 * TIO_EPARSE (bad base64, rank, duplicate token or rank, missing byte token,
 * colliding special; message "PATH:LINE: ..."); -EINVAL (NULL argument,
 * regex that does not compile: the message gives PCRE2's reason and offset);
 * -E2BIG (ids or token length over the limits above); -ENOMEM;
 * -ENOTSUP (built without PCRE2). */
TIO_API int tio_tok_load_tiktoken(tio_tok **out, const char *path, const char *pat_str,
                                  const tio_tok_special *specials, size_t n_specials);

/* Same, from `len` bytes of rank-file text in memory (messages name the
 * file "<memory>"). */
TIO_API int tio_tok_parse_tiktoken(tio_tok **out, const void *data, size_t len,
                                   const char *pat_str, const tio_tok_special *specials,
                                   size_t n_specials);

/* Name of the i-th built-in encoding ("r50k_base", "p50k_base",
 * "cl100k_base", "o200k_base"), NULL when i is past the end. */
TIO_API const char *tio_tok_encoding_name(size_t i);

/* Path of the rank file of built-in encoding `name`, written NUL-terminated
 * into path[cap].  Searched in order, the first readable file wins:
 *   1. `dir`/<name>.tiktoken, when `dir` is not NULL;
 *   2. $TERAIO_TOKENIZERS_DIR/<name>.tiktoken, when that variable is set;
 *   3. tiktoken's download cache: $TIKTOKEN_CACHE_DIR, else
 *      $DATA_GYM_CACHE_DIR, else <tmp>/data-gym-cache (<tmp>: $TMPDIR, $TEMP,
 *      $TMP or /tmp, as Python's tempfile.gettempdir()), the file named by
 *      the SHA-1 of the encoding's public URL, as tiktoken names it (an empty
 *      TIKTOKEN_CACHE_DIR turns this place off, as in tiktoken);
 *   4. the copy shipped with teraio: "tokenizers" beside the folder of the
 *      binary holding libteraio (<package>/tokenizers of an installed wheel;
 *      build/tokenizers, a link to python/teraio/tokenizers, in a source build).
 * Returns 0, -ENOENT (unknown name, or not found: the message lists every
 * path tried), -ENAMETOOLONG (cap too small).  Thread-safe. */
TIO_API int tio_tok_encoding_path(const char *name, const char *dir, char *path, size_t cap);

/* Load built-in encoding `name` (pattern, special tokens and the rank file's
 * SHA-256 compiled in, the rank file found with tio_tok_encoding_path(name,
 * dir)).  Errors: those of tio_tok_encoding_path and tio_tok_load_tiktoken;
 * TIO_ECORRUPT when the file's SHA-256 is not the encoding's (the message
 * names the file and both digests; nothing is loaded) or its rank count
 * differs from the encoding's. */
TIO_API int tio_tok_load_encoding(tio_tok **out, const char *name, const char *dir);

/* Load a Hugging Face tokenizer.json (byte-level BPE, see the top of this
 * file for what is supported).  Returns 0 and *out, or: -ENOENT/-EIO
 * reading; TIO_EPARSE (not JSON: message with the byte offset; a field of
 * the wrong type; a merge or added token not in the vocabulary);
 * -ENOTSUP (a model, normalizer, pre-tokenizer or option not supported,
 * named in the message; built without json-c or PCRE2); -EINVAL; -E2BIG;
 * -ENOMEM. */
TIO_API int tio_tok_load_hf(tio_tok **out, const char *path);

/* Same, from `len` bytes of JSON in memory. */
TIO_API int tio_tok_parse_hf(tio_tok **out, const void *json, size_t len);

/* Free a tokenizer and every thread's scratch state for it.  NULL is a
 * no-op.  No other call on `tok` may be running or follow. */
TIO_API void tio_tok_destroy(tio_tok *tok);

/* ---- queries ---------------------------------------------------------- */

/* One past the highest id (tokens and special tokens). */
TIO_API uint32_t tio_tok_vocab_size(const tio_tok *tok);

/* Id of the special (added) token whose text is `text`, or -ENOENT. */
TIO_API int tio_tok_special_id(const tio_tok *tok, const char *text);

/* The bytes of token `id`: *bytes points into the tokenizer (valid until
 * destroy), *len their count.  Returns 0 or -ENOENT (no such id). */
TIO_API int tio_tok_token_bytes(const tio_tok *tok, uint32_t id, const void **bytes, size_t *len);

/* ---- encoding and decoding --------------------------------------------- */

/* Encode `len` bytes of `text` (any bytes; see "Invalid UTF-8" above) into
 * ids[cap].  `special` is one of TIO_TOK_SPECIAL_*.  cap >=
 * tio_tok_max_ids(tok, len) always suffices (len, but for a tokenizer.json
 * with add_prefix_space).  *n_ids receives the count; entries of ids past
 * it may have been written.
 * Returns 0; -ENOSPC when cap is too small (ids[] then holds a prefix and
 * *n_ids its length); TIO_EPARSE (a special token under
 * TIO_TOK_SPECIAL_REJECT); -EINVAL (NULL pointer, bad mode); -ENOMEM;
 * -EIO (the regex engine failed, e.g. its JIT stack limit: message gives
 * PCRE2's reason).  Thread-safe. */
TIO_API int tio_tok_encode(const tio_tok *tok, const void *text, size_t len, int special,
                           uint32_t *ids, size_t cap, size_t *n_ids);

/* The most ids a text of `len` bytes can encode to: len (every token covers
 * at least one byte), except with a tokenizer.json whose ByteLevel
 * pre-tokenizer adds a prefix space to each stretch between added tokens:
 * len + 1, or 2 * len where an added token has a single byte.  0 for a
 * NULL tok.  Thread-safe. */
TIO_API size_t tio_tok_max_ids(const tio_tok *tok, size_t len);

/* Encode n_texts texts on `n_threads` threads (0: one per online CPU;
 * never more threads than texts).  Text i is texts[i][0..lens[i]).  Ids of
 * text i are written to ids[offsets[i] .. offsets[i+1]) (offsets has
 * n_texts + 1 entries, offsets[0] = 0), packed in order.  cap >= the sum
 * of tio_tok_max_ids(tok, lens[i]) always suffices (and is needed: each text
 * is first encoded at that offset).  Texts are handed to threads dynamically, longest
 * first, so one long text does not hold up the rest and the threads finish
 * together.  Returns 0 or the first error
 * (by text index) of the codes of tio_tok_encode, its message "text I of
 * the batch: " and that text's own message; or -EAGAIN when a thread cannot
 * be started.  Thread-safe. */
TIO_API int tio_tok_encode_batch(const tio_tok *tok, const void *const *texts, const size_t *lens,
                                 size_t n_texts, int special, unsigned n_threads, uint32_t *ids,
                                 size_t cap, size_t *offsets);

/* Decode n ids into out[cap] (the concatenated token bytes: not
 * necessarily valid UTF-8 when the ids cut a character).  *n_bytes gets the
 * byte count.  Returns 0; -ENOSPC when cap is too small (nothing written,
 * *n_bytes = bytes needed); -ENOENT (an id that is not a token: message
 * gives the id and its index); -EINVAL (NULL pointer).  Thread-safe. */
TIO_API int tio_tok_decode(const tio_tok *tok, const uint32_t *ids, size_t n, void *out,
                           size_t cap, size_t *n_bytes);

#ifdef __cplusplus
}
#endif
#endif
