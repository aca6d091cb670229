#!/usr/bin/env python3
"""bench/run_parquet.py — tokens/s of the teraio loader reading Parquet text with the
tokenizer on, beside JSONL of the same text and beside Hugging Face `datasets`' streaming
IterableDataset of the same Parquet files tokenized with HF `tokenizers`.

1. Writes BENCH_PARQUET_MB (default 24) MiB of text (documents of Zipf-distributed words,
   mean about 2 KB) as Parquet in the hub's layout (wiki/data/train-*.parquet, row groups
   of 1000 rows, snappy) and as JSONL (wiki/*.jsonl), the same documents in both.
2. teraio (Python adapter, r50k_base = GPT-2's vocabulary, seq_len 2048, shuffling on):
   time to deliver one epoch's packed tokens from a fresh dataset (every document read
   and tokenized once), for Parquet and for JSONL.
3. HF: `load_dataset("parquet", streaming=True)`, rows tokenized by `tokenizers` with
   the same vocabulary (a tokenizer.json built from the r50k ranks), encode_batch_fast over
   batches of 1000 rows, in a venv of its own (bench/run_parquet-requirements.txt).
Each side runs BENCH_PARQUET_RUNS (default 3) times; the best run of each counts.
Prints tokens/s of each and the ratios; --json for one JSON line.

Environment: BENCH_PARQUET_DIR (default build/bench-parquet), BENCH_PARQUET_MB,
BENCH_PARQUET_RUNS.
"""
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "bench"))
from benchenv import own_venv  # noqa: E402

SEQ_LEN, EOS = 2048, 50256


def corpus(mb):
    rng = np.random.default_rng(1)
    words = [("".join(chr(97 + c) for c in rng.integers(0, 26, size=1 + k % 9)))
             for k in range(20000)]
    p = 1.0 / np.arange(1, len(words) + 1)
    p /= p.sum()
    docs, size = [], 0
    while size < mb << 20:
        n = int(rng.exponential(350)) + 5
        doc = " ".join(words[i] for i in rng.choice(len(words), size=n, p=p)).capitalize() + "."
        docs.append(doc)
        size += len(doc)
    return docs


def write(base, docs):
    pqdir, jdir = base / "parquet" / "wiki" / "data", base / "jsonl" / "wiki"
    pqdir.mkdir(parents=True)
    jdir.mkdir(parents=True)
    shards = 4
    for s in range(shards):
        part = docs[s::shards]
        pq.write_table(pa.table({"text": part}), pqdir / f"train-{s:05d}-of-{shards:05d}.parquet",
                       row_group_size=1000)
        with open(jdir / f"train-{s:05d}.jsonl", "w") as f:
            f.writelines(json.dumps({"text": d}) + "\n" for d in part)
    (base / "parquet" / "wiki" / "README.md").write_text("# bench corpus\n")


def hf_tokenizer_json(path):
    """GPT-2's tokenizer.json from the shipped r50k ranks (run_tokenizer.py's conversion:
    tiktoken's pattern split, then byte-level BPE with whole-token lookups first)."""
    os.environ.setdefault("TIKTOKEN_CACHE_DIR", "")
    import tiktoken
    import tiktoken.load
    from run_tokenizer import hf_tokenizer
    shipped = REPO / "python" / "teraio" / "tokenizers"
    spec = json.loads((shipped / "encodings.json").read_text())["r50k_base"]
    ranks = tiktoken.load.load_tiktoken_bpe(str(shipped / "r50k_base.tiktoken"))
    enc = tiktoken.Encoding("r50k_base", pat_str=spec["pat_str"], mergeable_ranks=ranks,
                            special_tokens=spec["special_tokens"])
    hf_tokenizer(enc, ranks).save(str(path))


def teraio_epoch(root, runs):
    """Best tokens/s over `runs` fresh datasets, each delivering one epoch's tokens."""
    sys.path.insert(0, str(REPO / "python"))
    from teraio.data import StreamingDataset
    best, total = 0.0, 0
    for _ in range(runs):
        t0 = time.perf_counter()
        ds = StreamingDataset(str(root), seq_len=SEQ_LEN, eos_id=EOS, tokenizer="r50k_base",
                              provenance=True)
        total = delivered = 0
        it = iter(ds)
        while True:
            s = next(it)
            done = s["provenance"][:, 5] == 0
            delivered += int(s["provenance"][done, 4].sum())
            if not bool(done.all()):
                break
        rate = delivered / (time.perf_counter() - t0)
        best, total = max(best, rate), delivered
        ds.close()
    return best, total


def main():
    base = Path(os.environ.get("BENCH_PARQUET_DIR", REPO / "build" / "bench-parquet")).resolve()
    mb = int(os.environ.get("BENCH_PARQUET_MB", 24))
    runs = int(os.environ.get("BENCH_PARQUET_RUNS", 3))
    stamp = base / f".written-{mb}"
    if not stamp.exists():
        subprocess.run(["rm", "-rf", str(base / "parquet"), str(base / "jsonl")], check=True)
        base.mkdir(parents=True, exist_ok=True)
        write(base, corpus(mb))
        stamp.touch()
    tok_json = base / "gpt2-tokenizer.json"
    if not tok_json.exists():
        hf_tokenizer_json(tok_json)
    py = own_venv(base, "venv-hf", REPO / "bench" / "run_parquet-requirements.txt", "run_parquet")
    r = subprocess.run([str(py), str(REPO / "bench" / "run_parquet_hf.py"),
                        str(base / "parquet" / "wiki" / "data" / "*.parquet"), str(tok_json),
                        str(runs)], capture_output=True, text=True)
    if r.returncode:
        sys.exit(f"run_parquet: the Hugging Face side failed:\n{r.stderr[-3000:]}")
    hf = json.loads(r.stdout.strip().splitlines()[-1])
    pq_rate, pq_tokens = teraio_epoch(base / "parquet", runs)
    js_rate, js_tokens = teraio_epoch(base / "jsonl", runs)
    out = {"text_mib": mb, "runs": runs, "epoch_tokens": pq_tokens,
           "teraio_parquet_tokens_per_s": pq_rate, "teraio_jsonl_tokens_per_s": js_rate,
           "hf_datasets_tokens_per_s": hf["tokens_per_s"], "hf_tokens": hf["tokens"],
           "parquet_over_jsonl": pq_rate / js_rate,
           "parquet_over_hf": pq_rate / hf["tokens_per_s"]}
    if "--json" in sys.argv:
        print(json.dumps(out))
        return
    print(f"teraio Parquet text   {pq_rate / 1e6:8.2f} M tokens/s  (one epoch, {pq_tokens} tokens, "
          f"r50k_base, best of {runs})")
    print(f"teraio JSONL          {js_rate / 1e6:8.2f} M tokens/s  (the same text)")
    print(f"HF datasets streaming {hf['tokens_per_s'] / 1e6:8.2f} M tokens/s  (tokenizers "
          f"encode_batch_fast, {hf['tokens']} tokens)")
    print(f"Parquet / JSONL       {out['parquet_over_jsonl']:8.2f}")
    print(f"Parquet / HF          {out['parquet_over_hf']:8.2f}")


if __name__ == "__main__":
    main()
