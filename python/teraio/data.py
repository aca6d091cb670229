"""teraio.data — the streaming, stateful, rescalable data loader (ctypes over libteraio).

    ds = StreamingDataset("/data/root", seq_len=4096, weights={"web": 0.7, "code": 0.3},
                          tokenizer="r50k_base")          # eos_id: its <|endoftext|>, 50256
    loader = torch.utils.data.DataLoader(ds, batch_size=8, collate_fn=collate)  # num_workers=0
    for batch in loader:         # input_ids, labels, position_ids [8, 4096]; cu_seqlens
        ...
    ds.save(ckpt_dir)            # this rank's position after the last sample delivered
    ds2 = StreamingDataset(...); ds2.resume(ckpt_dir)   # any old world size

Everything (reading, tokenizing, shuffling, mixing, packing, prefetching, the
state format) happens in C; see include/teraio/data.h and docs/loader.md.
``rank``/``world_size`` are the *data-parallel* rank and size: tensor- and
pipeline-parallel peers pass the same values and get identical samples.
"""
from __future__ import annotations

import ctypes
import logging
import math
import threading
from ctypes import POINTER, byref, c_char_p, c_double, c_size_t, c_void_p
from pathlib import Path

import torch

from . import _lib as L
from ._args import U32, U64, env_rank, integer
from ._lib import TeraioError, check

log = logging.getLogger("teraio.data")

# end-of-document tokens of tokenizer.json files, in the order they are looked for
_EOS_TEXTS = ("<|endoftext|>", "<|end_of_text|>", "</s>", "<eos>", "<|eot_id|>")
LABELS = ("next", "hf")


def _default_eos(tok, spec: str) -> int:
    """The end-of-document id of the opened data tokenizer `tok` when eos_id
    is not given: 0 for bytes, else its <|endoftext|> (or </s>, ...), looked
    up in the BPE it already loaded (its ctx is the tio_tok)."""
    if tok.contents.name.decode() == "bytes":
        return 0
    for text in _EOS_TEXTS:
        rc = L.tio_tok_special_id(tok.contents.ctx, text.encode())
        if rc >= 0:
            return rc
    raise ValueError(f"StreamingDataset: tokenizer {spec} has none of the special tokens {', '.join(_EOS_TEXTS)}: "
                     f"give eos_id, the id that ends a document")


def collate(samples: list[dict]) -> dict:
    """``collate_fn`` for ``torch.utils.data.DataLoader``: a batch of samples
    whatever their documents.  ``input_ids``, ``labels`` and
    ``position_ids`` are stacked (``[batch, seq_len]``; positions restart at
    every document, as Hugging Face's ``position_ids`` packing expects);
    ``cu_seqlens`` (int32, ``[segments + 1]``) are the document boundaries
    over the batch flattened to ``batch * seq_len`` tokens, as flash-attn's
    varlen kernels take them, with ``max_seqlen`` the longest segment;
    ``provenance`` (with ``provenance=True``) is concatenated with the
    sample's index in the batch as a first column."""
    if not samples:
        raise ValueError("collate: no samples")
    seq_len = samples[0]["input_ids"].numel()
    provenance = "provenance" in samples[0]
    for b, s in enumerate(samples):
        if s["input_ids"].numel() != seq_len or int(s["cu_seqlens"][-1]) != seq_len:
            raise ValueError(f"collate: sample {b} holds {s['input_ids'].numel()} tokens, sample 0 {seq_len}")
        if ("provenance" in s) != provenance:
            raise ValueError(f"collate: sample {b} {'has' if 'provenance' in s else 'lacks'} provenance, "
                             f"sample 0 {'has' if provenance else 'lacks'} it")
    out = {k: torch.stack([s[k] for s in samples]) for k in ("input_ids", "labels", "position_ids")}
    bounds = [torch.zeros(1, dtype=torch.int32)]
    for b, s in enumerate(samples):
        bounds.append(s["cu_seqlens"][1:] + b * seq_len)
    cu = torch.cat(bounds)
    out["cu_seqlens"] = cu
    out["max_seqlen"] = int((cu[1:] - cu[:-1]).max())
    if provenance:
        out["provenance"] = torch.cat([torch.cat([torch.full((len(s["provenance"]), 1), b, dtype=torch.int64),
                                                  s["provenance"]], dim=1) for b, s in enumerate(samples)])
    return out


def _take(buf: c_void_p, n: c_size_t) -> bytes:
    try:
        return ctypes.string_at(buf, n.value)
    finally:
        L.tio_free(buf)


def _copy_u32(ptr, n):
    """n uint32 values at ptr (owned by the loader until its next call) as a new tensor."""
    t = torch.empty(n, dtype=torch.int32)
    ctypes.memmove(t.data_ptr(), ptr, 4 * n)
    return t.view(torch.uint32)




def _weight(name, value):
    try:
        w = float(value)
    except (TypeError, ValueError):
        raise ValueError(f"weight of {name!r} must be a number, got {value!r}") from None
    if not (math.isfinite(w) and 0 <= w <= 1e300):
        raise ValueError(f"weight of {name!r} is {value!r}: it must be a number from 0 to 1e300")
    return w


def parquet_available():
    """(True, "") when Parquet files can be read, else (False, the reason)."""
    why = c_char_p()
    ok = L.tio_data_parquet_available(byref(why))
    return bool(ok), (why.value or b"").decode()


def state_file(directory, rank: int) -> Path:
    """The state file of `rank` inside a checkpoint directory."""
    return Path(directory) / f"loader-rank{rank:05d}.state"


def _mesh_dp(mesh, dim):
    sub = mesh[dim] if dim is not None else mesh
    return sub.get_local_rank(), sub.size()


class StreamingDataset(torch.utils.data.IterableDataset):
    """Packed samples of ``seq_len + 1`` tokens from a dataset root, as dicts of tensors:
    ``input_ids``, ``labels`` (int64, ``[seq_len]``), ``position_ids`` (int64, ``[seq_len]``),
    ``cu_seqlens`` (int32, ``[segments + 1]``) and, with ``provenance=True``, ``provenance``
    (int64, ``[spans, 6]``: sub-dataset, file, document, offset, length, epoch; the names
    are in :attr:`subdatasets`).  Batch them with :func:`collate`.

    ``labels``: ``"next"`` (default) gives each position the token that follows it
    (``labels[i] == input_ids[i + 1]``; the loss needs no shift), for models that take
    their targets as they are; ``"hf"`` gives ``labels == input_ids``, for Hugging Face
    models, which shift the labels themselves (``model(input_ids=..., labels=...)``): with
    ``"next"`` such a model would train on the token two ahead.  ``eos_id``, the id put
    after every document: by default 0 for ``tokenizer="bytes"`` and the tokenizer's
    ``<|endoftext|>`` (or ``</s>``, ...) otherwise (50256 for r50k_base and p50k_base).

    ``rank``/``world_size`` default to torchrun's ``RANK``/``WORLD_SIZE``, or to the
    ``mesh_dim`` dimension of ``device_mesh``.  The stream never ends (epochs loop).

    Text (JSONL, Parquet text columns) is tokenized by ``tokenizer``: ``"bytes"``
    (default), a built-in BPE encoding (``"cl100k_base"``, ...; rank files looked up in
    ``tokenizers_dir`` or ``TERAIO_TOKENIZERS_DIR``) or the path of a Hugging Face
    ``tokenizer.json``; its name enters the state fingerprint.  Text is tokenized on
    ``tokenizer_threads`` threads (0: up to 4) window by window (about 8 MiB of a JSONL
    file, a Parquet row group) as it is read.  A JSONL line or Parquet text value longer
    than ``max_line_bytes`` (None: 64 MiB) is an error naming file and line; each reader
    keeps decoded windows up to ``cache_bytes`` (None: 256 MiB).  ``fill_threads``
    threads read the tokens of prefetched samples (None: the library's default, 2 on
    machines of 8 or more CPUs).

    torch DataLoader workers are refused (``num_workers`` must be 0): the loader already
    reads, tokenizes and packs in its own C threads, a C thread does not survive the
    fork that starts a worker, and the state of a dataset copy inside a worker is not
    the state the main process would save.
    """

    def __init__(self, root, seq_len, rank=None, world_size=None, seed=0, logical_shards=2048,
                 weights=None, provenance=False, shuffle_buffer=64, eos_id=None, bos_id=None,
                 prefetch=8, text_field="text", skip_bad_lines=False, device_mesh=None,
                 mesh_dim=None, tokenizer="bytes", tokenizers_dir=None, tokenizer_threads=0,
                 fill_threads=None, max_line_bytes=None, cache_bytes=None, labels="next"):
        super().__init__()
        if device_mesh is not None and (rank is None or world_size is None):
            rank, world_size = _mesh_dp(device_mesh, mesh_dim)
        if rank is None:
            rank = env_rank("RANK")
        if world_size is None:
            world_size = env_rank("WORLD_SIZE", 1)
        self.root = str(root)
        self.seq_len = integer("seq_len", seq_len, 1, U32 - 2)
        self.world_size = integer("world_size", world_size, 1, U32)
        self.rank = integer("rank", rank, 0, self.world_size - 1)
        seed = integer("seed", seed, 0, U64)
        logical_shards = integer("logical_shards", logical_shards, 1, U32)
        shuffle_buffer = integer("shuffle_buffer", shuffle_buffer, 0, U32)
        if labels not in LABELS:
            raise ValueError(f"StreamingDataset: labels={labels!r}: 'next' (the next token) or 'hf' "
                             f"(the input ids, for models that shift them)")
        self.labels = labels
        if eos_id is not None:
            eos_id = integer("eos_id", eos_id, 0, U32)
        prefetch = integer("prefetch", prefetch, 0, U32)
        tokenizer_threads = integer("tokenizer_threads", tokenizer_threads, 0, U32)
        if bos_id is not None:
            bos_id = integer("bos_id", bos_id, 0, U32)
        if fill_threads is not None:
            fill_threads = integer("fill_threads", fill_threads, 0, U32)
        if max_line_bytes is not None:
            max_line_bytes = integer("max_line_bytes", max_line_bytes, 1, U64)
        if cache_bytes is not None:
            cache_bytes = integer("cache_bytes", cache_bytes, 1, U64)
        weights = {str(k): _weight(k, v) for k, v in dict(weights or {}).items()}
        self.provenance = provenance
        # One lock around every use of the C loader, which one thread at a time may use:
        # two threads iterating the same dataset share one stream, each sample going to
        # exactly one of them.
        self._lock = threading.RLock()
        self._closed = False
        self._states = None
        self._loader = None
        self._ds = None
        self._tok = None
        self._started = False
        tok = POINTER(L.DataTokenizer)()
        check(L.tio_data_tokenizer_open(str(tokenizer).encode(), None if tokenizers_dir is None else
                        str(tokenizers_dir).encode(), byref(tok)))
        self._tok = tok
        self.tokenizer = tok.contents.name.decode()
        if eos_id is None:           # the tokenizer opened: its end-of-text id
            eos_id = _default_eos(tok, str(tokenizer))
        self.eos_id = eos_id
        dopts = L.DatasetOptions()
        L.tio_dataset_options_default(byref(dopts))
        dopts.tokenizer = tok
        dopts.tokenizer_threads = int(tokenizer_threads)
        self._text_field = text_field.encode()
        dopts.text_field = self._text_field
        dopts.jsonl_errors = 1 if skip_bad_lines else 0
        if max_line_bytes is not None:
            dopts.max_line_bytes = max_line_bytes
        if cache_bytes is not None:
            dopts.cache_bytes = cache_bytes
        ds = c_void_p()
        check(L.tio_dataset_open(self.root.encode(), byref(dopts), byref(ds)))
        self._ds = ds
        self.subdatasets = []
        for i in range(L.tio_dataset_n_subdatasets(ds)):
            info = L.SubdatasetInfo()
            check(L.tio_dataset_info(ds, i, byref(info)))
            self.subdatasets.append(info.name.decode())
        o = L.LoaderOptions()
        L.tio_loader_options_default(byref(o))
        o.seq_len, o.rank, o.world_size, o.seed = self.seq_len, self.rank, self.world_size, seed
        o.logical_shards, o.shuffle_buffer, o.eos_id, o.prefetch = (logical_shards, shuffle_buffer,
                                                                    eos_id, prefetch)
        if bos_id is not None:
            o.bos, o.bos_id = True, bos_id
        if fill_threads is not None:
            o.fill_threads = int(fill_threads)
        self._wnames = (c_char_p * max(1, len(weights)))(*[k.encode() for k in weights])
        self._wvals = (c_double * max(1, len(weights)))(*[float(v) for v in weights.values()])
        o.n_weights = len(weights)
        o.weight_names = ctypes.cast(self._wnames, POINTER(c_char_p))
        o.weights = ctypes.cast(self._wvals, POINTER(c_double))
        self._opts = o
        # Validate the options now, not at the first sample.
        self._create([])
        self._destroy_loader()

    # -- lifetime ------------------------------------------------------------------
    def _create(self, states):
        bufs = [ctypes.create_string_buffer(s, len(s)) for s in states]
        ptrs = (c_void_p * max(1, len(bufs)))(*[ctypes.cast(b, c_void_p) for b in bufs])
        lens = (c_size_t * max(1, len(bufs)))(*[len(s) for s in states])
        ld = c_void_p()
        check(L.tio_loader_create(self._ds, byref(self._opts), ptrs, lens, len(bufs), byref(ld)))
        self._loader = ld

    def _destroy_loader(self):
        if self._loader:
            L.tio_loader_destroy(self._loader)
            self._loader = None

    def close(self):
        """Stop the loader's threads and free everything; every method raises after."""
        lock = getattr(self, "_lock", None)
        if lock is None:   # __init__ failed before the lock existed
            return
        with lock:
            self._closed = True
            self._destroy_loader()
            if getattr(self, "_ds", None):
                L.tio_dataset_destroy(self._ds)
                self._ds = None
            if getattr(self, "_tok", None):
                L.tio_data_tokenizer_close(self._tok)
                self._tok = None

    def __del__(self):
        try:
            self.close()
        except Exception:
            pass

    def _check_open(self):
        if self._closed or not self._ds:
            raise RuntimeError("StreamingDataset is closed")

    def _live_loader(self):
        """The C loader, created on first use (under the lock); RuntimeError once closed."""
        self._check_open()
        if self._loader is None:
            self._create(self._states or [])
        return self._loader

    # -- iteration -----------------------------------------------------------------
    def __iter__(self):
        if torch.utils.data.get_worker_info() is not None:
            raise RuntimeError("teraio.data.StreamingDataset reads, tokenizes and prefetches in its "
                               "own C threads: use DataLoader(num_workers=0) (a worker process "
                               "would neither keep those threads nor report its position to "
                               "the main process's state_dict)")
        with self._lock:
            fresh = self._loader is None
            self._live_loader()
            if fresh:
                self._log_position("resumed" if self._states else "starts")
        return self

    def __next__(self):
        with self._lock:
            if self._loader is None:
                iter(self)
            return self._next_sample()

    def _next_sample(self):
        self._started = True
        sp = POINTER(L.DataSample)()
        check(L.tio_loader_next(self._live_loader(), byref(sp)))
        s = sp.contents
        n = s.seq_len
        toks = _copy_u32(s.tokens, n + 1).to(torch.int64)   # ids up to 2^32 - 1
        labels = toks[1:].clone() if self.labels == "next" else toks[:-1].clone()
        out = {"input_ids": toks[:-1], "labels": labels, "position_ids":
               _copy_u32(s.position_ids, n).to(torch.int64),
               "cu_seqlens": _copy_u32(s.cu_seqlens, s.n_segments + 1).view(torch.int32)}
        if self.provenance:
            out["provenance"] = torch.tensor(
                [[x.subdataset, x.file, x.doc, x.offset, x.length, x.epoch]
                 for x in (s.spans[i] for i in range(s.n_spans))], dtype=torch.int64).reshape(-1, 6)
        return out

    # -- state ---------------------------------------------------------------------
    def state_dict(self):
        """This rank's state (after the last sample delivered) as ``{"rank", "world_size",
        "state": bytes}``."""
        with self._lock:
            buf, n = c_void_p(), c_size_t()
            check(L.tio_loader_state(self._live_loader(), byref(buf), byref(n)))
            return {"rank": self.rank, "world_size": self.world_size, "state": _take(buf, n)}

    def load_state_dict(self, state):
        """Load this rank's state, or a list of the states of every rank of an earlier run
        (any world size).  Not allowed once a sample has been delivered."""
        with self._lock:
            self._check_open()
            if self._started:
                raise RuntimeError("load_state_dict() after a sample was delivered: the state "
                                   "would be ignored; load it before the first sample")
            states = state if isinstance(state, (list, tuple)) else [state]
            raw = [s["state"] if isinstance(s, dict) else bytes(s) for s in states]
            self._destroy_loader()
            self._create(raw)  # validates now: a bad state fails here, loudly
            self._states = raw
            self._log_position("resumed")

    def save(self, directory):
        """Write this rank's state atomically to ``directory/loader-rankNNNNN.state``."""
        with self._lock:
            ld = self._live_loader()
            Path(directory).mkdir(parents=True, exist_ok=True)
            check(L.tio_loader_save(ld, str(state_file(directory, self.rank)).encode()))

    def resume(self, directory):
        """Load the states saved by every rank of an earlier run into this rank."""
        with self._lock:
            self._check_open()
        files = sorted(Path(directory).glob("loader-rank*.state"))
        if not files:
            raise TeraioError(-2, f"{directory}: no loader-rank*.state files")
        raw = []
        for f in files:
            buf, n = c_void_p(), c_size_t()
            check(L.tio_loader_state_read(str(f).encode(), byref(buf), byref(n)))
            raw.append(_take(buf, n))
        self.load_state_dict(raw)

    def position(self):
        """Per sub-dataset: epoch, documents consumed/total on this rank, tokens packed."""
        with self._lock:
            ld = self._live_loader()
            out = {}
            for i, name in enumerate(self.subdatasets):
                p = L.DataPosition()
                check(L.tio_loader_position(ld, i, byref(p)))
                out[name] = {"epoch": p.epoch, "docs_consumed": p.docs_consumed,
                             "docs_total": p.docs_total, "tokens_packed": p.tokens_packed}
            return out

    def subdataset_info(self, name):
        """What the dataset knows of sub-dataset `name`: files, documents, tokens (token
        files), bytes, lines_skipped (bad text documents read as empty with
        skip_bad_lines) and empty_documents (skipped by the loader; text files counted
        as they are tokenized)."""
        with self._lock:
            self._check_open()
            info = L.SubdatasetInfo()
            check(L.tio_dataset_info(self._ds, self.subdatasets.index(name), byref(info)))
            return {"files": info.n_files, "documents": info.n_docs, "tokens": info.n_tokens,
                    "bytes": info.bytes, "lines_skipped": info.lines_skipped,
                    "empty_documents": info.n_empty_docs}

    def locate(self, subdataset, file, doc):
        """Where the document of a provenance row (its sub-dataset, file and document
        columns) is: ``{"path", "format", "unit", "row"}``, the path relative to the root;
        for Parquet ``unit`` is the row group and ``row`` the row within it."""
        with self._lock:
            self._check_open()
            sub = integer("subdataset", subdataset, 0, U32)
            f = integer("file", file, 0, U32)
            unit, row = ctypes.c_uint64(), ctypes.c_uint64()
            check(L.tio_dataset_doc_location(self._ds, sub, f, integer("doc", doc, 0, U64),
                                             byref(unit), byref(row)))
            return {"path": L.tio_dataset_file_path(self._ds, sub, f).decode(),
                    "format": L.tio_dataset_file_format(self._ds, sub, f).decode(),
                    "unit": unit.value, "row": row.value}

    def _log_position(self, what):
        for name, p in self.position().items():
            log.info("rank %d/%d %s %s: epoch %d, %d/%d documents, %d tokens packed", self.rank,
                     self.world_size, what, name, p["epoch"], p["docs_consumed"], p["docs_total"],
                     p["tokens_packed"])
