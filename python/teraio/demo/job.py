"""The demo's training job: model, data, one step, and the process set-up
that makes its memory measurable.

The model is a Llama-style decoder (teraio.models.llama) trained with AdamW
from a fixed random initialisation on byte-level tokens of the Python
standard library's sources (a fixed, sorted file list).
"""
from __future__ import annotations

import ctypes
import os
import struct
import sys
import sysconfig
from pathlib import Path

TTY = sys.stderr.isatty()


def progress(msg: str, final: bool = False) -> None:
    """A progress line on a terminal (rewritten in place; an empty message
    clears it); silent when piped."""
    if TTY:
        sys.stderr.write("\r\033[K" + msg + ("\n" if final and msg else ""))
        sys.stderr.flush()


def say(msg: str) -> None:
    if TTY:
        sys.stderr.write("\r\033[K")
    print(msg, flush=True)


def stdlib_corpus(min_bytes: int) -> bytes:
    """Concatenated sources of the running Python's standard library, in
    sorted path order, at least `min_bytes` long (all of it if shorter)."""
    root = Path(sysconfig.get_paths()["stdlib"])
    files = sorted(p for p in root.rglob("*.py")
                   if "site-packages" not in p.parts and "dist-packages" not in p.parts)
    buf = bytearray()
    for p in files:
        try:
            buf += p.read_bytes()
        except OSError:
            continue
        if len(buf) >= min_bytes:
            break
    if len(buf) < 1 << 20:
        raise SystemExit(f"teraio demo: standard library at {root} has too little text ({len(buf)} bytes)")
    return bytes(buf)


def setup_process() -> None:
    """Make memory measurable and results reproducible: large allocations are
    mmap'ed (so freeing them returns memory to the OS at once, and RSS shows
    it), fixed thread count, deterministic kernels."""
    libc = ctypes.CDLL("libc.so.6")
    M_TRIM_THRESHOLD, M_MMAP_THRESHOLD = -1, -3
    libc.mallopt(M_MMAP_THRESHOLD, 64 * 1024)
    libc.mallopt(M_TRIM_THRESHOLD, 128 * 1024)
    import torch
    torch.set_num_threads(max(1, min(2, os.cpu_count() or 1)))
    torch.use_deterministic_algorithms(True)


def reset_peak_rss() -> bool:
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
        return True
    except OSError:
        return False


def peak_rss_bytes() -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
    import resource
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def loss_bits(x: float) -> str:
    return struct.pack("<d", x).hex()


class Job:
    """The model, its optimizer and `args.iterations` batches, the same in
    every run of the demo."""

    def __init__(self, args):
        import torch
        from ..models.llama import Llama, LlamaConfig
        self.cfg = LlamaConfig(dim=args.dim, n_layers=args.layers, n_heads=args.heads,
                               ffn_dim=args.ffn_dim, max_seq_len=args.seq_len)
        torch.manual_seed(args.seed)
        self.model = Llama(self.cfg)
        self.opt = torch.optim.AdamW(self.model.parameters(), lr=3e-4, weight_decay=0.1, foreach=False)
        need = args.iterations * args.batch * (args.seq_len + 1)
        data = torch.frombuffer(bytearray(stdlib_corpus(max(8 << 20, need))), dtype=torch.uint8).long()
        g = torch.Generator().manual_seed(args.seed + 1)
        starts = torch.randint(0, data.numel() - args.seq_len - 1, (args.iterations, args.batch), generator=g)
        offs = torch.arange(args.seq_len + 1)
        self.batches = [data[s[:, None] + offs] for s in starts]
        self.corpus_bytes = data.numel()
        self.n_params = sum(p.numel() for p in self.model.parameters())

    def step(self, i: int):
        """One iteration; returns the loss tensor (read it outside any mode)."""
        b = self.batches[i]
        self.opt.zero_grad(set_to_none=False)
        loss = self.model(b[:, :-1], b[:, 1:])
        loss.backward()
        self.opt.step()
        return loss
