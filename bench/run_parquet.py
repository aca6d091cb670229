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
    """GPT-2's tokenizer.json from the shipped r50k ranks (as transformers converts them)."""
    import tiktoken.load
    import tokenizers
    from tokenizers import decoders, models, pre_tokenizers
    ranks = tiktoken.load.load_tiktoken_bpe(str(REPO / "python" / "teraio" / "tokenizers" /
                                                "r50k_base.tiktoken"))
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(0xA1, 0xAD)) + list(range(0xAE, 0x100))
    cs, n = bs[:], 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    b2u = {b: chr(c) for b, c in zip(bs, cs)}
    vocab = {"".join(b2u[b] for b in tok): rank for tok, rank in ranks.items()}
    merges = []
    for tok, rank in sorted(ranks.items(), key=lambda kv: kv[1]):
        local = [(tok[:k], tok[k:]) for k in range(1, len(tok)) if tok[:k] in ranks and tok[k:] in ranks]
        local.sort(key=lambda ab: (ranks[ab[0]], ranks[ab[1]]))
        merges += [("".join(b2u[x] for x in a), "".join(b2u[x] for x in b)) for a, b in local]
    t = tokenizers.Tokenizer(models.BPE(vocab, merges))
    t.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    t.decoder = decoders.ByteLevel()
    t.save(str(path))


def hf_venv(base):
    venv = base / "venv-hf"
    py = venv / "bin" / "python"
    req = REPO / "bench" / "run_parquet-requirements.txt"
    stamp = venv / ".requirements"
    if not py.exists() or not stamp.exists() or stamp.read_text() != req.read_text():
        print("run_parquet: creating the Hugging Face venv (once)", file=sys.stderr)
        subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
        subprocess.run([str(py), "-m", "pip", "install", "-q", "--disable-pip-version-check",
                        "-r", str(req)], check=True)
        stamp.write_text(req.read_text())
    return py


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
    py = hf_venv(base)
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
