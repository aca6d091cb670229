"""teraio.data — the streaming, stateful, rescalable data loader (ctypes over libteraio).

    ds = StreamingDataset("/data/root", seq_len=4096, weights={"web": 0.7, "code": 0.3})
    for batch in torch.utils.data.DataLoader(ds, batch_size=8):   # num_workers=0
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
import os
from ctypes import POINTER, byref, c_char_p, c_double, c_size_t, c_void_p
from pathlib import Path

import torch

from . import _lib as L
from ._lib import TeraioError, check

log = logging.getLogger("teraio.data")


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
    are in :attr:`subdatasets`).

    ``rank``/``world_size`` default to torchrun's ``RANK``/``WORLD_SIZE``, or to the
    ``mesh_dim`` dimension of ``device_mesh``.  The stream never ends (epochs loop).

    JSONL text is tokenized by ``tokenizer``: ``"bytes"`` (default), a built-in BPE
    encoding (``"cl100k_base"``, ...; rank files looked up in ``tokenizers_dir`` or
    ``TERAIO_TOKENIZERS_DIR``) or the path of a Hugging Face ``tokenizer.json``; its name
    enters the state fingerprint.  Each JSONL file is tokenized on ``tokenizer_threads``
    threads (0: up to 4) when first read.  ``fill_threads`` threads read the tokens of
    prefetched samples (None: the library's default, 2 on machines of 8 or more CPUs).

    torch DataLoader workers are refused (``num_workers`` must be 0): the loader already
    reads, tokenizes and packs in its own C threads, a C thread does not survive the
    fork that starts a worker, and the state of a dataset copy inside a worker is not
    the state the main process would save.
    """

    def __init__(self, root, seq_len, rank=None, world_size=None, seed=0, logical_shards=2048,
                 weights=None, provenance=False, shuffle_buffer=64, eos_id=0, bos_id=None,
                 prefetch=8, text_field="text", skip_bad_lines=False, device_mesh=None,
                 mesh_dim=None, tokenizer="bytes", tokenizers_dir=None, tokenizer_threads=0,
                 fill_threads=None):
        super().__init__()
        if device_mesh is not None and (rank is None or world_size is None):
            rank, world_size = _mesh_dp(device_mesh, mesh_dim)
        if rank is None:
            rank = int(os.environ.get("RANK", "0"))
        if world_size is None:
            world_size = int(os.environ.get("WORLD_SIZE", "1"))
        self.root = str(root)
        self.seq_len = int(seq_len)
        self.rank, self.world_size = int(rank), int(world_size)
        self.provenance = provenance
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
        dopts = L.DatasetOptions()
        L.tio_dataset_options_default(byref(dopts))
        dopts.tokenizer = tok
        dopts.tokenizer_threads = int(tokenizer_threads)
        self._text_field = text_field.encode()
        dopts.text_field = self._text_field
        dopts.jsonl_errors = 1 if skip_bad_lines else 0
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
        weights = dict(weights or {})
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

    # -- iteration -----------------------------------------------------------------
    def __iter__(self):
        if torch.utils.data.get_worker_info() is not None:
            raise RuntimeError("teraio.data.StreamingDataset reads, tokenizes and prefetches in its "
                               "own C threads: use DataLoader(num_workers=0) (a worker process "
                               "would neither keep those threads nor report its position to "
                               "the main process's state_dict)")
        if self._loader is None:
            self._create(self._states or [])
            self._log_position("resumed" if self._states else "starts")
        return self

    def __next__(self):
        if self._loader is None:
            iter(self)
        self._started = True
        sp = POINTER(L.DataSample)()
        check(L.tio_loader_next(self._loader, byref(sp)))
        s = sp.contents
        n = s.seq_len
        toks = _copy_u32(s.tokens, n + 1).to(torch.int64)   # ids up to 2^32 - 1
        out = {"input_ids": toks[:-1], "labels": toks[1:].clone(), "position_ids":
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
        if self._loader is None:
            self._create(self._states or [])
        buf, n = c_void_p(), c_size_t()
        check(L.tio_loader_state(self._loader, byref(buf), byref(n)))
        return {"rank": self.rank, "world_size": self.world_size, "state": _take(buf, n)}

    def load_state_dict(self, state):
        """Load this rank's state, or a list of the states of every rank of an earlier run
        (any world size).  Not allowed once a sample has been delivered."""
        if self._started:
            raise RuntimeError("load_state_dict() after a sample was delivered: the state would be "
                               "ignored; load it before the first sample")
        states = state if isinstance(state, (list, tuple)) else [state]
        raw = [s["state"] if isinstance(s, dict) else bytes(s) for s in states]
        self._destroy_loader()
        self._create(raw)  # validates now: a bad state fails here, loudly
        self._states = raw
        self._log_position("resumed")

    def save(self, directory):
        """Write this rank's state atomically to ``directory/loader-rankNNNNN.state``."""
        Path(directory).mkdir(parents=True, exist_ok=True)
        if self._loader is None:
            self._create(self._states or [])
        check(L.tio_loader_save(self._loader, str(state_file(directory, self.rank)).encode()))

    def resume(self, directory):
        """Load the states saved by every rank of an earlier run into this rank."""
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
        if self._loader is None:
            self._create(self._states or [])
        out = {}
        for i, name in enumerate(self.subdatasets):
            p = L.DataPosition()
            check(L.tio_loader_position(self._loader, i, byref(p)))
            out[name] = {"epoch": p.epoch, "docs_consumed": p.docs_consumed,
                         "docs_total": p.docs_total, "tokens_packed": p.tokens_packed}
        return out

    def _log_position(self, what):
        for name, p in self.position().items():
            log.info("rank %d/%d %s %s: epoch %d, %d/%d documents, %d tokens packed", self.rank,
                     self.world_size, what, name, p["epoch"], p["docs_consumed"], p["docs_total"],
                     p["tokens_packed"])
