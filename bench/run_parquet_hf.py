#!/usr/bin/env python3
"""bench/run_parquet_hf.py — the Hugging Face side of bench/run_parquet.py, run in the
bench's own venv: `datasets`' streaming IterableDataset over the Parquet files,
tokenized with `tokenizers` (encode_batch_fast, no offsets, batches of 1000 rows: its
fastest use).
Prints one JSON line: tokens and tokens/s of the best of RUNS passes.

usage: run_parquet_hf.py DATA_GLOB TOKENIZER_JSON RUNS"""
import json
import sys
import time

from datasets import load_dataset
from tokenizers import Tokenizer


def main():
    files, tok_path, runs = sys.argv[1], sys.argv[2], int(sys.argv[3])
    tok = Tokenizer.from_file(tok_path)
    encode = getattr(tok, "encode_batch_fast", tok.encode_batch)
    best, tokens = 0.0, 0
    for _ in range(runs):
        ds = load_dataset("parquet", data_files=files, split="train", streaming=True)
        t0 = time.perf_counter()
        n = 0
        for batch in ds.iter(batch_size=1000):
            for enc in encode(batch["text"], add_special_tokens=False):
                n += len(enc.ids) + 1          # + EOS, as the loaders pack it
        rate = n / (time.perf_counter() - t0)
        best, tokens = max(best, rate), n
    print(json.dumps({"tokens": tokens, "tokens_per_s": best}))


if __name__ == "__main__":
    main()
