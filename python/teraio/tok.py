"""teraio's byte-level BPE tokenizer (libteraio ``tio_tok_*``) through ctypes.

Thin on purpose: loading, encoding and decoding all happen in C
(include/teraio/tok.h is the manual).  Ids equal tiktoken's for the OpenAI
encodings and Hugging Face ``tokenizers``' for byte-level BPE
``tokenizer.json`` files (without the post-processor).

>>> tok = Tokenizer.encoding("cl100k_base")
>>> tok.encode("hello world")
[15339, 1917]
"""
from __future__ import annotations

import ctypes
import os
import threading
from array import array
from ctypes import c_char_p, c_size_t, c_uint32, c_void_p
from typing import Iterable, Sequence

from teraio import _lib as L
from teraio._args import U32, integer
from teraio._lib import check

SPECIAL_TEXT = 0    #: special-token strings are ordinary text (tiktoken encode_ordinary)
SPECIAL_ALLOW = 1   #: recognised as their ids (tiktoken allowed_special="all")
SPECIAL_REJECT = 2  #: raise if one occurs (tiktoken's default encode)

_KEEP_IDS = 16 << 20  # a thread keeps an output buffer of up to 64 MiB of ids


def encoding_names() -> list[str]:
    """Names of the built-in encodings (r50k_base, p50k_base, ...)."""
    out, i = [], 0
    while (name := L.tio_tok_encoding_name(i)) is not None:
        out.append(name.decode())
        i += 1
    return out


def _as_bytes(text: str | bytes) -> bytes:
    """The UTF-8 of a str, or the bytes of a bytes-like object; anything else
    (an int would make that many NUL bytes) is a TypeError."""
    if isinstance(text, str):
        return text.encode("utf-8")
    if isinstance(text, (bytes, bytearray, memoryview)):
        return bytes(text)
    raise TypeError(f"expected str or bytes to tokenize, got {type(text).__name__}")


class Tokenizer:
    """A loaded tokenizer.  Thread-safe for encode/decode; close() frees it."""

    def __init__(self, handle: c_void_p):
        self._h = handle
        self._local = threading.local()

    @classmethod
    def encoding(cls, name: str, directory: str | os.PathLike | None = None) -> "Tokenizer":
        """Built-in encoding ``name``.  Its rank file is looked for in
        ``directory``, then $TERAIO_TOKENIZERS_DIR, then tiktoken's download
        cache, then the copy shipped with teraio (``teraio/tokenizers``), and
        checked against the encoding's SHA-256 (TeraioError naming the file on
        a mismatch)."""
        h = c_void_p()
        d = os.fsencode(directory) if directory is not None else None
        check(L.tio_tok_load_encoding(ctypes.byref(h), name.encode(), d))
        return cls(h)

    @classmethod
    def tiktoken(cls, path: str | os.PathLike, pat_str: str,
                 special_tokens: dict[str, int] | None = None) -> "Tokenizer":
        """A tiktoken rank file with the given split regex and special tokens."""
        specials = list((special_tokens or {}).items())
        arr = (L.TokSpecial * max(1, len(specials)))(*[L.TokSpecial(t.encode(), i) for t, i in specials])
        h = c_void_p()
        check(L.tio_tok_load_tiktoken(ctypes.byref(h), os.fsencode(path), pat_str.encode(), arr, len(specials)))
        return cls(h)

    @classmethod
    def huggingface(cls, path: str | os.PathLike) -> "Tokenizer":
        """A Hugging Face tokenizer.json (byte-level BPE)."""
        h = c_void_p()
        check(L.tio_tok_load_hf(ctypes.byref(h), os.fsencode(path)))
        return cls(h)

    @classmethod
    def huggingface_json(cls, text: str | bytes) -> "Tokenizer":
        """A Hugging Face tokenizer.json given as its text."""
        data = _as_bytes(text)
        h = c_void_p()
        check(L.tio_tok_parse_hf(ctypes.byref(h), data, len(data)))
        return cls(h)

    def close(self) -> None:
        if self._h:
            L.tio_tok_destroy(self._h)
            self._h = None

    def _handle(self):
        """The C tokenizer; every method of a closed Tokenizer raises."""
        if not self._h:
            raise ValueError("Tokenizer is closed")
        return self._h

    def __del__(self):
        self.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    @property
    def vocab_size(self) -> int:
        return L.tio_tok_vocab_size(self._handle())

    def special_id(self, text: str) -> int:
        return check(L.tio_tok_special_id(self._handle(), text.encode()))

    def _buffer(self, cap: int):
        """This thread's output buffer of at least cap ids (reused: encode is
        called once per document, and allocating per call costs more than
        the tokenization of a short document).  The ids are copied out of it
        before a call returns, so reuse never aliases results."""
        local = self._local
        buf = getattr(local, "buf", None)
        if buf is None or len(buf) < cap:
            buf = (c_uint32 * max(cap, 4096))()
            local.buf = buf
            local.view = memoryview(buf).cast("B").cast("I")
        return buf, local.view

    def encode(self, text: str | bytes, special: int = SPECIAL_TEXT) -> list[int]:
        """Ids of ``text`` (str: its UTF-8; bytes: as given, any bytes)."""
        data = _as_bytes(text)
        cap = max(1, L.tio_tok_max_ids(self._handle(), len(data)))
        out, view = self._buffer(cap)
        n = c_size_t()
        check(L.tio_tok_encode(self._h, data, len(data), special, out, cap, ctypes.byref(n)))
        return view[:n.value].tolist()

    def _encode_batch(self, texts: Sequence[str | bytes], special: int, threads: int):
        if isinstance(texts, (str, bytes, bytearray, memoryview)):
            raise TypeError("texts must be a sequence of str or bytes, not one "
                            f"{type(texts).__name__} (use encode for a single text)")
        if not isinstance(threads, int) or not 0 <= threads <= 4096:
            raise ValueError(f"threads must be an integer from 0 (one per CPU) to 4096, got {threads!r}")
        self._handle()
        data = [_as_bytes(t) for t in texts]
        n = len(data)
        ptrs = (c_char_p * max(1, n))(*data)
        lens = (c_size_t * max(1, n))(*[len(d) for d in data])
        cap = max(1, sum(L.tio_tok_max_ids(self._h, len(d)) for d in data))
        # The reused buffer's pages are already mapped: a fresh one would be
        # faulted in by the encoding threads, which serialise on the kernel.
        if cap <= _KEEP_IDS:
            out, view = self._buffer(cap)
        else:  # too big to keep around
            out = (c_uint32 * cap)()
            view = memoryview(out).cast("B").cast("I")
        offs = (c_size_t * (n + 1))()
        check(L.tio_tok_encode_batch(self._h, ptrs, lens, n, special, threads, out, cap, offs))
        return view, memoryview(offs).cast("B").cast("N")

    def encode_batch(self, texts: Sequence[str | bytes], special: int = SPECIAL_TEXT,
                     threads: int = 0) -> list[list[int]]:
        """Ids of each text, encoded on ``threads`` threads (0: one per CPU)."""
        view, offs = self._encode_batch(texts, special, threads)
        return [view[offs[i]:offs[i + 1]].tolist() for i in range(len(offs) - 1)]

    def encode_batch_flat(self, texts: Sequence[str | bytes], special: int = SPECIAL_TEXT,
                          threads: int = 0) -> tuple[array, array]:
        """The ids of all texts concatenated, and where each text's begin:
        text i's ids are ``ids[offsets[i]:offsets[i + 1]]`` (``offsets`` has
        len(texts) + 1 entries).  Both are ``array.array`` (typecodes 'I' and
        'Q'), which ``numpy.frombuffer`` / ``torch.frombuffer`` take without a
        copy.  No Python int per id is made, so this is the form for bulk
        tokenization: the ids of a few MB as lists cost more time than
        encoding them on two threads."""
        view, offs = self._encode_batch(texts, special, threads)
        ids = array("I")
        ids.frombytes(view[:offs[len(offs) - 1]].cast("B"))
        return ids, array("Q", offs)

    def decode_bytes(self, ids: Iterable[int]) -> bytes:
        """The bytes of `ids`.  An id that is not a 32-bit unsigned integer is a
        ValueError here (ctypes would wrap 2**32 + 464 to 464 and -1 to
        4294967295); one the vocabulary lacks, a TeraioError from the library."""
        h = self._handle()
        ids = list(ids)
        if not all(type(x) is int and 0 <= x <= U32 for x in ids):
            ids = [integer(f"token id at position {i}", x, 0, U32) for i, x in enumerate(ids)]
        arr = (c_uint32 * max(1, len(ids)))(*ids)
        need = c_size_t()
        rc = L.tio_tok_decode(h, arr, len(ids), None, 0, ctypes.byref(need))
        if rc < 0 and need.value == 0 and ids:
            check(rc)
        buf = ctypes.create_string_buffer(max(1, need.value))
        check(L.tio_tok_decode(h, arr, len(ids), buf, need.value, ctypes.byref(need)))
        return buf.raw[:need.value]

    def decode(self, ids: Iterable[int], errors: str = "replace") -> str:
        return self.decode_bytes(ids).decode("utf-8", errors=errors)
