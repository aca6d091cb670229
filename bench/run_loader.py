#!/usr/bin/env python3
"""bench/run_loader.py — the teraio data loader against memcpy and MosaicML Streaming.

1. Writes a dataset root of two sub-datasets ("web" 3/4, "code" 1/4 of the tokens) as
   Megatron MMIDIDX files of int32 tokens (a 128K vocabulary, documents of exponentially
   distributed length, mean 1000 tokens).
2. `teraio data bench ROOT --json`: packed tokens/s (seq_len 4096, shuffle buffer 64, both
   sub-datasets mixed, prefetch thread) beside memcpy of the same token bytes, from the
   page cache, in the same run.
3. The same token stream (documents + EOS, cut into samples of seq_len + 1 tokens, as
   teraio packs them) written with Streaming's own MDSWriter, read by its
   StreamingDataset with shuffling on, in a venv of its own (bench/run_loader-requirements.txt:
   mosaicml-streaming pins numpy and transformers versions the project's .venv does not
   have); beside it teraio.data.StreamingDataset in Python over the same files.
   Reported: samples/s of each and teraio/streaming.

Environment: BENCH_LOADER_DIR (default build/bench-loader), TERAIO_BIN (default
build/bin/teraio), BENCH_LOADER_TOKENS (default 16M), BENCH_LOADER_SECONDS (default 2).
"""
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parent.parent
SEQ_LEN = 4096
EOS = 128001


def write_dataset(root, tokens):
    rng = np.random.default_rng(0)
    meta = {}
    for sub, share in [("web", 0.75), ("code", 0.25)]:
        (root / sub).mkdir(parents=True, exist_ok=True)
        for part in range(4):
            n = int(tokens * share / 4)
            lens = (rng.exponential(1000, size=n // 500 + 8).astype(np.int64) + 1)
            lens = lens[: np.searchsorted(np.cumsum(lens), n) + 1].astype(np.int32)
            toks = rng.integers(0, 128000, size=int(lens.sum()), dtype=np.int32)
            prefix = root / sub / f"part{part}"
            toks.tofile(f"{prefix}.bin")
            ptr = np.concatenate([[0], np.cumsum(lens[:-1].astype(np.int64) * 4)]).astype(np.int64)
            with open(f"{prefix}.idx", "wb") as f:
                f.write(b"MMIDIDX\x00\x00" + np.array([1], np.int64).tobytes() + bytes([4]))
                f.write(np.array([len(lens), len(lens) + 1], np.int64).tobytes())
                f.write(lens.tobytes() + ptr.tobytes())
                f.write(np.arange(len(lens) + 1, dtype=np.int64).tobytes())
            meta[str(prefix)] = int(lens.sum())
    return meta


def packed_samples(root):
    """The dataset's documents + EOS, concatenated and cut into seq_len + 1 tokens."""
    stream = []
    for idx in sorted(root.glob("*/*.idx")):
        raw = idx.read_bytes()
        n = int(np.frombuffer(raw[18:26], np.int64)[0])
        lens = np.frombuffer(raw[34:34 + 4 * n], np.int32)
        toks = np.fromfile(idx.with_suffix(".bin"), np.int32)
        ends = np.cumsum(lens)
        stream.append(np.insert(toks, ends, EOS))
    s = np.concatenate(stream)
    k = len(s) // (SEQ_LEN + 1)
    return s[: k * (SEQ_LEN + 1)].reshape(k, SEQ_LEN + 1)


def teraio_python(root, seconds):
    sys.path.insert(0, str(REPO / "python"))
    from teraio.data import StreamingDataset
    ds = StreamingDataset(str(root), seq_len=SEQ_LEN, eos_id=EOS, rank=0, world_size=1)
    it = iter(ds)
    for _ in range(50):
        next(it)
    n, t0 = 0, time.perf_counter()
    while time.perf_counter() - t0 < seconds:
        next(it)["input_ids"]
        n += 1
    rate = n / (time.perf_counter() - t0)
    ds.close()
    return rate


def streaming_venv(base):
    sys.path.insert(0, str(REPO / "bench"))
    from benchenv import own_venv
    return own_venv(base, "venv-streaming", REPO / "bench" / "run_loader-requirements.txt",
                    "run_loader")


def main():
    base = Path(os.environ.get("BENCH_LOADER_DIR", REPO / "build" / "bench-loader")).resolve()
    teraio = os.environ.get("TERAIO_BIN", str(REPO / "build" / "bin" / "teraio"))
    tokens = int(float(os.environ.get("BENCH_LOADER_TOKENS", 16e6)))
    seconds = float(os.environ.get("BENCH_LOADER_SECONDS", 2))
    root, mds = base / "teraio", base / "mds"
    stamp = base / f".written-{tokens}"
    if not stamp.exists():
        subprocess.run(["rm", "-rf", str(root), str(mds)], check=True)
        write_dataset(root, tokens)
        samples = packed_samples(root)
        mds.mkdir(parents=True)
        np.save(mds / "samples.npy", samples)
        stamp.touch()
    py = streaming_venv(base)
    # Streaming: write with MDSWriter (once), then read with shuffling on
    r = subprocess.run([str(py), str(REPO / "bench" / "run_loader_streaming.py"), str(mds),
                        str(seconds)], capture_output=True, text=True)
    if r.returncode:
        sys.exit(f"run_loader: the Streaming side failed:\n{r.stderr[-3000:]}")
    streaming = json.loads(r.stdout.strip().splitlines()[-1])
    r = subprocess.run([teraio, "data", "bench", str(root), "--seq-len", str(SEQ_LEN),
                        "--seconds", str(seconds), "--json"], capture_output=True, text=True)
    if r.returncode:
        sys.exit(f"run_loader: teraio data bench failed: {r.stderr.strip()}")
    c = json.loads(r.stdout)
    py_rate = teraio_python(root, seconds)
    out = {"tokens": tokens, "seq_len": SEQ_LEN,
           "tokens_per_s": c["tokens_per_s"], "memcpy_tokens_per_s": c["memcpy_tokens_per_s"],
           "ratio": c["ratio"],
           "teraio_c_samples_per_s": c["samples_per_s"],
           "teraio_python_samples_per_s": py_rate,
           "streaming_samples_per_s": streaming["samples_per_s"],
           "teraio_over_streaming": py_rate / streaming["samples_per_s"],
           "teraio_c_over_streaming": c["samples_per_s"] / streaming["samples_per_s"]}
    if "--json" in sys.argv:
        print(json.dumps(out))
        return
    print(f"loader  {out['tokens_per_s'] / 1e6:10.1f} M packed tokens/s (seq_len {SEQ_LEN}, "
          f"shuffle + mixing)")
    print(f"memcpy  {out['memcpy_tokens_per_s'] / 1e6:10.1f} M tokens/s of the same bytes")
    print(f"ratio   {out['ratio']:10.3f}   (loader / memcpy)")
    print(f"teraio (Python adapter) {py_rate:10.1f} samples/s, (C) {c['samples_per_s']:10.1f}")
    print(f"Streaming (shuffle on)  {streaming['samples_per_s']:10.1f} samples/s")
    print(f"teraio/streaming        {out['teraio_over_streaming']:10.2f}   (Python adapter; "
          f"C side {out['teraio_c_over_streaming']:.2f})")


if __name__ == "__main__":
    main()
