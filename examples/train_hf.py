"""examples/train_hf.py — a Hugging Face model trained from teraio's loader in a plain loop.

    .venv/bin/python examples/train_hf.py --steps 20                    # a GPT-2 from a small config
    .venv/bin/python examples/train_hf.py --steps 20 --offload 0.6      # its tensors offloaded by teraio

The data: ``teraio.data.StreamingDataset`` over a folder of JSONL sub-datasets
(``--data``; without it, ``OUT/corpus`` is written from the docstrings of the
running Python's standard library), tokenized on the fly with GPT-2's
encoding (r50k_base, whose ``<|endoftext|>`` 50256 ends every document),
``labels="hf"`` (Hugging Face models shift the labels themselves) and
batched by ``teraio.data.collate``.  With ``--offload C`` the step runs under
``teraio.torch.offload(model, optimizer, capacity=C)``: two profiled steps,
then planned ones, with the losses of the run without it.  Prints one line
per step (loss as an exact float) and, offloaded, what moved.  The capacity
cannot go below the plan's working-set floor, 0.40 of the peak here: what
the loss's backward touches (three 2 x 128 x 50257 logits-sized tensors).
What the loop holds after its last use (the tied embedding's gradient until
``zero_grad``) moves out then (docs/runtime.md).
"""
from __future__ import annotations

import argparse
import contextlib
import importlib
import json
import pkgutil
import sys
from pathlib import Path

import torch

from teraio.data import StreamingDataset, collate


def write_corpus(root: Path, n_modules: int = 60) -> None:
    """One sub-dataset, ``docs``: the docstrings of standard-library modules."""
    (root / "docs").mkdir(parents=True, exist_ok=True)
    names = sorted(m.name for m in pkgutil.iter_modules() if m.name in sys.stdlib_module_names
                   and not m.name.startswith("_"))[:n_modules]
    with open(root / "docs" / "stdlib.jsonl", "w") as f:
        for name in names:
            try:
                doc = importlib.import_module(name).__doc__
            except Exception:  # noqa: BLE001 (a module that does not import here)
                continue
            if doc and doc.strip():
                f.write(json.dumps({"text": doc.strip()}) + "\n")


def gpt2(seq_len: int):
    """The examples' model: transformers' GPT-2 from a small configuration (4 layers,
    width 256, GPT-2's vocabulary), with a fixed initialisation."""
    from transformers import GPT2Config, GPT2LMHeadModel
    torch.manual_seed(0)
    return GPT2LMHeadModel(GPT2Config(n_layer=4, n_embd=256, n_head=4, n_positions=seq_len))


def corpus(out: Path, data: str | None) -> Path:
    """The dataset root: `data`, or OUT/corpus, written when absent."""
    root = Path(data) if data else out / "corpus"
    if not data and not root.exists():
        write_corpus(root)
    return root


def stream(root: Path, seq_len: int, seed: int = 0) -> StreamingDataset:
    """The examples' loader: r50k_base on the fly, labels for a Hugging Face model."""
    return StreamingDataset(root, seq_len=seq_len, tokenizer="r50k_base", labels="hf", seed=seed,
                            logical_shards=8)


def summary(r: dict) -> str:
    """The line a run under teraio ends with: its steps, what moved, and the
    resident peak against the capacity (with several plans, the worst plan's
    ratio of its own peak to its own capacity)."""
    line = (f"offloaded: {r['profiled_iterations']} profiled, {r['planned_iterations']} planned and "
            f"{r['diverged_iterations']} diverged steps, {r['bytes_offloaded'] / 2**20:.1f} MiB to SSD, "
            f"peak resident {r['peak_resident_bytes'] / 2**20:.1f} MiB of {r['capacity_bytes'] / 2**20:.1f} MiB, "
            f"{r['over_capacity_kernels']} kernels over")
    if len(r["plans"]) > 1 and r["peak_to_capacity_max"] is not None:
        line += f" ({len(r['plans'])} plans, worst peak/capacity {r['peak_to_capacity_max']:.3f})"
    return line


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", default="build/train-hf", help="corpus and SSD files (default %(default)s)")
    ap.add_argument("--data", help="dataset root (default: OUT/corpus, written when absent)")
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--batch-size", type=int, default=2)
    ap.add_argument("--seq-len", type=int, default=128)
    ap.add_argument("--offload", type=float, metavar="C", help="offload with teraio at capacity C (0 < C <= 1)")
    a = ap.parse_args(argv)
    out = Path(a.out)
    model = gpt2(a.seq_len)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    ds = stream(corpus(out, a.data), a.seq_len)
    loader = torch.utils.data.DataLoader(ds, batch_size=a.batch_size, collate_fn=collate)
    off = None
    if a.offload is not None:
        import teraio.torch
        from teraio.torch.session import NoPlan
        (out / "ssd").mkdir(parents=True, exist_ok=True)
        off = teraio.torch.offload(model, opt, capacity=a.offload, ssd=str(out / "ssd"))
    for step, batch in zip(range(1, a.steps + 1), loader):
        try:
            with off.step() if off is not None else contextlib.nullcontext():
                loss = model(input_ids=batch["input_ids"], position_ids=batch["position_ids"],
                             labels=batch["labels"]).loss
                loss.backward()
                opt.step()
                opt.zero_grad()
        except ValueError as e:  # the first plan refused: a capacity below the working-set floor
            if off is None or not isinstance(e.__cause__, NoPlan):
                raise
            print(f"step {step} loss {loss.item()!r}", flush=True)  # the step ran; its plan was refused
            print(f"train_hf.py: {e}", file=sys.stderr)
            off.close()
            ds.close()
            return 2
        print(f"step {step} loss {loss.item()!r}", flush=True)
    if off is not None:
        r = off.report()
        print(summary(r))
        off.close()
    ds.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
