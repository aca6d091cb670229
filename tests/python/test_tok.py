"""teraio's tokenizer against the references: PyPI tiktoken (built offline from
the rank files shipped in python/teraio/tokenizers) and Hugging Face tokenizers.

Default run (make test): a deterministic ~5 MB sample of real text per
encoding, the stress strings, every code point of the Basic Multilingual
Plane, invalid UTF-8, and tokenizer.json files built here with `tokenizers`.
Full run (TERAIO_TOK_FULL=1, see docs/tokenizer.md): >= 50 MB of real text
per encoding and every code point of all planes.
"""
from __future__ import annotations

import functools
import json
import os
import sys
import sysconfig
from pathlib import Path

import pytest

tiktoken = pytest.importorskip("tiktoken")
# The rank files are local: no copies of them in tiktoken's /tmp cache.
os.environ.setdefault("TIKTOKEN_CACHE_DIR", "")
import tiktoken.load  # noqa: E402

import teraio  # noqa: E402
from teraio._lib import TeraioError  # noqa: E402
from teraio.tok import SPECIAL_ALLOW, SPECIAL_REJECT, SPECIAL_TEXT, Tokenizer  # noqa: E402

REPO = Path(__file__).resolve().parents[2]
SHIPPED = Path(teraio.__file__).resolve().parent / "tokenizers"
FULL = os.environ.get("TERAIO_TOK_FULL") == "1"
ENCODINGS = ["r50k_base", "cl100k_base", "o200k_base"]


TIO_EPARSE = -5001


@functools.lru_cache(maxsize=None)
def reference(name: str) -> "tiktoken.Encoding":
    spec = json.loads((SHIPPED / "encodings.json").read_text())[name]
    return tiktoken.Encoding(name, pat_str=spec["pat_str"],
                             mergeable_ranks=tiktoken.load.load_tiktoken_bpe(str(SHIPPED / f"{name}.tiktoken")),
                             special_tokens=spec["special_tokens"])


@functools.lru_cache(maxsize=None)
def teraio_encoding(name: str) -> Tokenizer:
    return Tokenizer.encoding(name)  # found by the library: the shipped copy


def _text_files():
    """Real text on this machine, in a fixed order: the Python standard
    library sources, then documentation, then C headers."""
    stdlib = Path(sysconfig.get_paths()["stdlib"])
    yield from sorted(p for p in stdlib.rglob("*.py") if "site-packages" not in p.parts)
    doc = Path("/usr/share/doc")
    if doc.is_dir():
        yield from sorted(p for p in doc.rglob("*")
                          if p.is_file() and not p.is_symlink() and p.suffix in ("", ".txt", ".md", ".rst"))
    inc = Path("/usr/include")
    if inc.is_dir():
        yield from sorted(p for p in inc.rglob("*.h") if p.is_file() and not p.is_symlink())


def corpus(total_bytes: int, stride: int = 1) -> list[str]:
    """Documents (whole files, valid UTF-8) adding up to about total_bytes;
    every stride-th file, so a small sample still spans the sources."""
    docs, size = [], 0
    for i, p in enumerate(_text_files()):
        if i % stride:
            continue
        try:
            text = p.read_bytes().decode("utf-8")
        except (UnicodeDecodeError, OSError):
            continue
        docs.append(text)
        size += len(text.encode())
        if size >= total_bytes:
            break
    return docs


STRESS = [
    "hello world", "Hello, World!", "", " ", "  ", "\n", "\n\n\n", " \n \n", "\t\t x", "\r\n\r\n",
    "a  b   c    d", "trailing spaces   ", "   leading", "x\u3000\u3000y", "\u00a0nbsp\u00a0 \u2009thin",
    "I'm you're he's we'd they'll I've can't DON'T It'S WE'RE", "'s 's'S'", "'ll'll", "o'clock",
    "1234567890", "1 12 123 1234 12345", "3.14159 2,718 1e10 0x1F 1_000_000", "٣٤٥ ١٢ ௧௨௩ 一二三",
    "日本語のテキストです。東京は首都。", "中文文本，包含标点符号！", "한국어 텍스트입니다", "ภาษาไทย ไม่มีช่องว่าง",
    "emoji 👍🏽 👩‍👩‍👧‍👦 🏳️‍🌈 🇺🇸🇫🇷 ❤️ ✊🏿 🧑🏻‍💻", "😀😃😄😁😆😅🤣😂", "e\u0301 a\u0300\u0316 ñ n\u0303 Å A\u030a",
    "Z\u0351\u036b\u0343\u036a\u0302\u036b\u033d\u034f\u0334\u0319\u0324\u031e\u0349\u035a\u032f\u031e\u0320\u034dA\u0334\u0335\u035c",
    "Ελληνικά кириллица עברית العربية हिन्दी বাংলা", "mixed日本english한국어123عربي",
    "\u200b\u200c\u200d\ufeff zero width", "\u180e mongolian vowel separator \u180e", "\u0085 NEL \u2028 LS \u2029 PS",
    "def f(x):\n    return x ** 2\n\n\n# comment\n", "    \n        \n", "{\"key\": [1, 2, {\"a\": null}]}",
    "<html><body class='x'>&amp;&lt;</body></html>", "https://example.com/path?q=1&r=2#frag",
    "/usr/local/bin//", "a/b/c/d.e", "=====\n-----\n*****", "!!!???...,,,;;;", "$$$ €€€ £££ ¥¥¥",
    "ſ ſs ſſ 'ſ K K", "İstanbul ıi ß ẞ ǅ ǈ", "ＦＵＬＬＷＩＤＴＨ ｶﾀｶﾅ", "𝔘𝔫𝔦𝔠𝔬𝔡𝔢 𝟙𝟚𝟛",
    "\U0001F9D1\u1c89 \u0558 Ꟑ \U000105C0", "x" * 5000, " " * 3000 + "x", "\n" * 2000, "ab" * 3000,
    "🤖" * 500, "1" * 1001, "a'" * 700, "\U00010000\U0010FFFD\ue000",
]


@pytest.mark.parametrize("name", ENCODINGS)
def test_hello_world(name):
    want = {"r50k_base": [31373, 995], "cl100k_base": [15339, 1917], "o200k_base": [24912, 2375]}[name]
    assert teraio_encoding(name).encode("hello world") == want


@pytest.mark.parametrize("name", ENCODINGS)
def test_stress_strings(name):
    ref, tok = reference(name), teraio_encoding(name)
    for s in STRESS:
        ids = tok.encode(s)
        assert ids == ref.encode_ordinary(s), repr(s[:80])
        assert tok.decode_bytes(ids) == s.encode()


# The corners of the split patterns that src/tok/split_builtin.h writes out
# by hand (tests/c/test_tok.c checks the same against PCRE2): contractions in
# any case and U+017F LONG S, which folds to s; `\s+(?!\S)` leaving a
# space to the next word but not at the end; digits in threes; CR/LF runs
# inside spaces; the optional prefix before letters; letters and marks of
# o200k's two classes (Lu/Lt/Lm/Lo/M then Ll/Lm/Lo/M); White_Space beyond
# ASCII; a category new in Unicode 15-16 (U+1E5D0 Lo).
SPLIT_EDGES = [
    "I'M He'Ll we'RE they'Ve 'ſa 'ſ x's", "don't DON'T ABC's ABCs'",
    "a  b   c    \n", "a \n b", "a  \t\n", "   ", " \n ", "x\r\n\r\n  y\n\n\t z\r\r\n",
    "12345 1234567 ١٢٣٤ 1,234.5", "$x (a) \tword \u3000中文 \u00a0a \u2028b",
    "HelloWorld HELLOworld ABC 中A e\u0301A \u0301A ǅungla ʰa", "a/b x)\n/ ../..\n\n//",
    "\U0001e5d0\U0001e5d1 x\U00016100", "tab\there\x0b\x0c\x1c\x85end",
]


@pytest.mark.parametrize("name", ENCODINGS)
def test_split_edges_match_tiktoken(name):
    ref, tok = reference(name), teraio_encoding(name)
    for s in SPLIT_EDGES:
        assert tok.encode(s) == ref.encode_ordinary(s), repr(s)
        for cut in range(1, len(s)):  # each prefix ends the text somewhere else
            assert tok.encode(s[:cut]) == ref.encode_ordinary(s[:cut]), repr(s[:cut])


@pytest.mark.parametrize("name", ENCODINGS)
def test_special_tokens(name):
    ref, tok = reference(name), teraio_encoding(name)
    s = "a<|endoftext|>b <|endoftext|><|endoftext|> c<|endofprompt|>"
    assert tok.encode(s, SPECIAL_ALLOW) == ref.encode(s, allowed_special="all")
    assert tok.encode(s, SPECIAL_TEXT) == ref.encode_ordinary(s)
    with pytest.raises(ValueError):
        ref.encode(s)
    with pytest.raises(TeraioError) as err:
        tok.encode(s, SPECIAL_REJECT)
    assert err.value.code == TIO_EPARSE
    assert tok.encode("plain", SPECIAL_REJECT) == ref.encode("plain")


def _compare_corpus(name: str, docs: list[str]) -> int:
    ref, tok = reference(name), teraio_encoding(name)
    got = tok.encode_batch(docs, threads=2)
    n_bytes = 0
    for doc, ids in zip(docs, got):
        want = ref.encode_ordinary(doc)
        if ids != want:
            i = next((k for k, (a, b) in enumerate(zip(ids, want)) if a != b), min(len(ids), len(want)))
            pytest.fail(f"{name}: first difference at token {i}: teraio {ids[i:i + 5]} tiktoken "
                        f"{want[i:i + 5]} near {ref.decode(want[max(0, i - 5):i + 5])!r}")
        n_bytes += len(doc.encode())
    return n_bytes


@pytest.mark.parametrize("name", ENCODINGS)
def test_real_text_sample(name):
    docs = corpus(5_000_000, stride=5)
    assert _compare_corpus(name, docs) >= 5_000_000
    tok = teraio_encoding(name)
    for doc in docs[:50]:
        assert tok.decode(tok.encode(doc)) == doc


@pytest.mark.skipif(not FULL, reason="opt-in: the full run, set TERAIO_TOK_FULL=1")
@pytest.mark.parametrize("name", ENCODINGS)
def test_real_text_full(name):
    docs = corpus(50_000_000)
    n = _compare_corpus(name, docs)
    print(f"\n{name}: identical ids on {n / 1e6:.1f} MB in {len(docs)} files", file=sys.stderr)
    assert n >= 50_000_000


def _code_point_snippet(c: str) -> str:
    return f"x{c}x A{c}b 1{c}2 {c}{c} ,{c}. {c}\n{c}'s\t{c} \n"


@pytest.mark.parametrize("name", ENCODINGS)
def test_every_code_point(name):
    """Each code point in contexts where its class (letter, mark, number,
    space, other) decides the split; compared in groups, then one by one."""
    ref, tok = reference(name), teraio_encoding(name)
    top = 0x110000 if FULL else 0x10000
    cps = [c for c in range(top) if not 0xD800 <= c < 0xE000]
    bad = []
    for g in range(0, len(cps), 1024):
        group = cps[g:g + 1024]
        text = "".join(_code_point_snippet(chr(c)) for c in group)
        if tok.encode(text) != ref.encode_ordinary(text):
            bad += [c for c in group
                    if tok.encode(_code_point_snippet(chr(c))) != ref.encode_ordinary(_code_point_snippet(chr(c)))]
    assert not bad, [hex(c) for c in bad[:20]]


def _runs(data: bytes):
    """Maximal valid UTF-8 runs and maximal runs of bytes that start no
    valid sequence, in order: (is_valid, bytes)."""
    out, i = [], 0
    while i < len(data):
        try:
            data[i:].decode("utf-8")
            out.append((True, data[i:]))
            break
        except UnicodeDecodeError as e:
            if e.start:
                out.append((True, data[i:i + e.start]))
            j = i + e.start
            bad_start = j
            while j < len(data):
                try:
                    data[j:j + 4].decode("utf-8")
                    break
                except UnicodeDecodeError as e2:
                    if e2.start > 0:
                        break
                    if e2.reason == "unexpected end of data" and e2.end == len(data[j:j + 4]) and j + 4 < len(data):
                        j += e2.end
                        continue
                    j += e2.end
            out.append((False, data[bad_start:j]))
            i = j
    return out


@pytest.mark.parametrize("name", ENCODINGS)
def test_invalid_utf8(name):
    """Documented behaviour: each valid run is encoded as a text of its own,
    each invalid run is one piece (tiktoken's _encode_single_piece);
    decode gives the input back byte for byte."""
    ref, tok = reference(name), teraio_encoding(name)
    cases = [b"abc \xff\xfe def", b"\xc3", b"tail \xe4\xb8", b"\xed\xa0\x80 surrogate", b"\xc0\xaf overlong",
             b"\xf4\x90\x80\x80 too big", b"ok\x80\x80\x80ok", "日本".encode() + b"\xff" + "語".encode(),
             bytes(range(256)), b"\xff" * 100, b"x\n\xfe\n  y"]
    for data in cases:
        ids = tok.encode(data)
        assert tok.decode_bytes(ids) == data
        want = []
        for valid, chunk in _runs(data):
            want += ref.encode_ordinary(chunk.decode()) if valid else ref._encode_single_piece(chunk)
        assert ids == want, data


def _bytes_to_unicode() -> dict[int, str]:
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), ord("ÿ") + 1))
    cs, n = bs[:], 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return {b: chr(c) for b, c in zip(bs, cs)}


def _hf_from_ranks(name: str, path: Path, llama3_style: bool) -> "tokenizers.Tokenizer":
    """A byte-level BPE tokenizer.json from tiktoken ranks, the way
    transformers converts them: vocab in GPT-2's byte alphabet; for each
    token every split into two tokens, merges ordered by the token's rank."""
    tokenizers = pytest.importorskip("tokenizers")
    from tokenizers import decoders, models, pre_tokenizers, AddedToken

    enc = reference(name)
    ranks = tiktoken.load.load_tiktoken_bpe(str(SHIPPED / f"{name}.tiktoken"))
    b2u = _bytes_to_unicode()
    vocab = {"".join(b2u[b] for b in tok): rank for tok, rank in ranks.items()}
    merges = []
    for tok, rank in sorted(ranks.items(), key=lambda kv: kv[1]):
        local = [(tok[:k], tok[k:]) for k in range(1, len(tok)) if tok[:k] in ranks and tok[k:] in ranks]
        local.sort(key=lambda ab: (ranks[ab[0]], ranks[ab[1]]))
        merges += [("".join(b2u[x] for x in a), "".join(b2u[x] for x in b)) for a, b in local]
    model = models.BPE(vocab, merges, ignore_merges=llama3_style)
    t = tokenizers.Tokenizer(model)
    if llama3_style:
        t.pre_tokenizer = pre_tokenizers.Sequence([
            pre_tokenizers.Split(tokenizers.Regex(enc._pat_str), behavior="isolated", invert=False),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
    else:
        t.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    t.decoder = decoders.ByteLevel()
    t.add_special_tokens([AddedToken(s, special=True, normalized=False) for s in enc._special_tokens])
    return t


@pytest.mark.parametrize("name,llama3_style", [("r50k_base", False), ("cl100k_base", True)])
def test_huggingface_tokenizer_json(tmp_path, name, llama3_style):
    hf = _hf_from_ranks(name, SHIPPED, llama3_style)
    path = tmp_path / "tokenizer.json"
    hf.save(str(path))
    tok = Tokenizer.huggingface(path)
    docs = STRESS + ["a<|endoftext|>b <|endoftext|>"] + corpus(500_000, stride=37)
    for doc in docs:
        want = hf.encode(doc, add_special_tokens=False).ids
        assert tok.encode(doc) == want, repr(doc[:80])
    assert tok.decode(tok.encode("Grüße 👋 world")) == "Grüße 👋 world"
    if name == "r50k_base":
        # GPT-2's merges reproduce its ranks: same ids as tiktoken on text.
        ref = reference(name)
        for doc in docs[-20:]:
            assert tok.encode(doc) == ref.encode_ordinary(doc)


def test_fuzz_tok_json_seeds_match_tokenizers():
    """Issue 12 item 19: the fuzz_tok_json seeds are real tokenizer.json files
    (scripts/gen-tok-json-seeds) that load in both libraries and give the
    same ids."""
    import tokenizers
    seeds = sorted((REPO / "fuzz" / "corpus" / "fuzz_tok_json").glob("*.json"))
    assert len(seeds) >= 3
    docs = STRESS + SPLIT_EDGES + corpus(100_000, stride=97)
    for seed in seeds:
        hf, tok = tokenizers.Tokenizer.from_file(str(seed)), Tokenizer.huggingface(seed)
        for doc in docs:
            assert tok.encode(doc) == hf.encode(doc, add_special_tokens=False).ids, (seed.name, doc[:80])


def test_batch_matches_single():
    tok = teraio_encoding("cl100k_base")
    docs = STRESS + corpus(300_000, stride=101)
    want = [tok.encode(d) for d in docs]
    for threads in (1, 2, 3):
        assert tok.encode_batch(docs, threads=threads) == want
    # The flat form: the same ids, concatenated, with offsets per text.
    docs = docs + ["", "x"]
    want += [[], tok.encode("x")]
    ids, offsets = tok.encode_batch_flat(docs, threads=2)
    assert ids.typecode == "I" and offsets.typecode == "Q"
    assert len(offsets) == len(docs) + 1 and offsets[0] == 0
    assert [ids[offsets[i]:offsets[i + 1]].tolist() for i in range(len(docs))] == want
    ids, offsets = tok.encode_batch_flat([], threads=2)
    assert len(ids) == 0 and offsets.tolist() == [0]
    # a failing text is named with its own reason, as encode gives it
    with pytest.raises(TeraioError) as err:
        tok.encode_batch_flat(["plain", "text", "x <|endoftext|> y", "after"], SPECIAL_REJECT,
                              threads=2)
    assert "text 2 of the batch" in str(err.value) and "special token" in str(err.value)
    # what is not text is refused, not tokenized as something else
    with pytest.raises(TypeError):
        tok.encode_batch_flat(["a", 5, "b"])
    with pytest.raises(TypeError):
        tok.encode_batch("hello")
    with pytest.raises(TypeError):
        tok.encode(5)
    for threads in (-1, 2**40, 1.5):
        with pytest.raises(ValueError):
            tok.encode_batch_flat(["a"], threads=threads)


def test_errors(tmp_path):
    with pytest.raises(TeraioError) as err:
        Tokenizer.encoding("gpt-5", SHIPPED)
    assert "unknown encoding" in str(err.value)
    bad = tmp_path / "bad.tiktoken"
    bad.write_bytes(b"YQ== 0\nnot base64 1\n")
    with pytest.raises(TeraioError) as err:
        Tokenizer.tiktoken(bad, r"\S+")
    assert err.value.code == TIO_EPARSE and "bad.tiktoken:2" in str(err.value)
    with pytest.raises(TeraioError):
        Tokenizer.huggingface_json('{"model": {"type": "Unigram"}}')
    tok = teraio_encoding("r50k_base")
    with pytest.raises(TeraioError):
        tok.decode([50257 + 10])


def test_rank_file_with_one_byte_changed_is_refused(tmp_path):
    data = bytearray((SHIPPED / "cl100k_base.tiktoken").read_bytes())
    data[1000] ^= 0x01
    (tmp_path / "cl100k_base.tiktoken").write_bytes(bytes(data))
    with pytest.raises(TeraioError) as err:
        Tokenizer.encoding("cl100k_base", tmp_path)
    msg = str(err.value)
    assert f"{tmp_path}/cl100k_base.tiktoken: sha256 " in msg
    assert "223921b76ee99bde995b7ff738513eef100fb51d18c93597a113bcffe865b2a7" in msg


def test_encoding_found_from_any_working_directory(tmp_path, monkeypatch):
    """No directory, no variable: the shipped copy, wherever the process runs."""
    monkeypatch.chdir("/")
    monkeypatch.delenv("TERAIO_TOKENIZERS_DIR", raising=False)
    monkeypatch.setenv("TIKTOKEN_CACHE_DIR", "")
    assert Tokenizer.encoding("o200k_base").encode("hello world") == [24912, 2375]


def test_ids_outside_the_vocabulary_are_refused_not_wrapped():
    """Issue 26 item 11: decode([2**32]) gave id 0's text and 2**32 + 464 id
    464's (ctypes wrapped them); -1 was reported as "id 4294967295"; a
    closed Tokenizer reported a vocabulary of 0."""
    tok = Tokenizer.encoding("r50k_base")
    assert tok.decode([464]) == "The"
    for bad in (2**32, 2**32 + 464, -1, True, 4.0):
        with pytest.raises(ValueError, match=r"token id at position 1 must be an integer"):
            tok.decode([464, bad])
    with pytest.raises(TeraioError):  # in 32 bits, not in the vocabulary: the library says so
        tok.decode([464, tok.vocab_size])
    import numpy as np
    assert tok.decode(np.array([464, 383], dtype=np.int64)) == tok.decode([464, 383])
    tok.close()
    for call in (lambda: tok.vocab_size, lambda: tok.decode([464]), lambda: tok.encode("x"),
                 lambda: tok.encode_batch(["x"]), lambda: tok.special_id("<|endoftext|>")):
        with pytest.raises(ValueError, match="Tokenizer is closed"):
            call()
