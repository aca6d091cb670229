#!/usr/bin/env python3
"""bench/run_tokenizer.py — encoding speed of teraio's tokenizer through its
Python API beside tiktoken, bpe-openai, tokendagger and Hugging Face
tokenizers, measured in the same run on the same text.

Text: the Python standard library sources (*.py, site-packages excluded),
one document per file, as str.  Encoding: cl100k_base, single thread, every
implementation at its best configuration:
  - teraio: Tokenizer.encode(str) -> list[int] (the rank file shipped with
    teraio);
  - tiktoken 0.14: Encoding.encode_ordinary with tiktoken's own cl100k_base
    definition (its pattern and the same rank file, read offline), and with
    the pattern as tiktoken 0.7 spelled it (the one teraio uses), which
    tiktoken runs faster: each round's ratio is against the faster of the
    two;
  - bpe-openai: its Rust tokenizer called directly (the Python wrapper
    refuses long inputs), with its own copy of the ranks;
  - tokendagger: Encoding(...).encode_ordinary with either pattern, the
    faster counting, as for tiktoken;
  - tokenizers: Tokenizer.encode of a tokenizer.json made from the same
    ranks, Llama-3 style (Split(cl100k regex) + ByteLevel, ignore_merges).
All must give tiktoken's ids on a sample of the documents before anything
is timed.  Also timed, for the record: teraio.encode(bytes) of the same
documents as UTF-8, and tio_tok_encode through ctypes with the ids left in
a buffer (no Python list: the cost of the Python boundary).

Rounds: each round encodes all documents once with every implementation, in
an order shuffled from round to round (seeded), and keeps every result (as a
caller would).  The machine is shared and its speed drifts, so the ratios are
taken within a round and the median over the rounds is reported, with
their range; MB/s (1e6 bytes of UTF-8 per second) are medians too.

Then the batch API: Tokenizer.encode_batch_flat (tio_tok_encode_batch, ids
in one array) on 1 and 2 threads, in side-by-side pairs of alternating
order; the scaling is the median of the pairs' ratios.

Runs in its own venv, build/bench-tokenizer/venv, made once from
bench/run_tokenizer-requirements.txt (the peers are not project
dependencies).  Writes $TERAIO_BENCH_DIR/tokenizer.json (default
build/bench), which bench/summary.py gathers into make bench's summary.
Environment: BENCH_TOK_MB (default 8) caps the text, BENCH_TOK_ROUNDS (7),
BENCH_TOK_PAIRS (11).
"""
from __future__ import annotations

import ctypes
import gc
import json
import os
import random
import statistics
import sys
import sysconfig
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
VENV = REPO / "build" / "bench-tokenizer" / "venv"
REQUIREMENTS = REPO / "bench" / "run_tokenizer-requirements.txt"
SHIPPED = REPO / "python" / "teraio" / "tokenizers"
OUT = Path(os.environ.get("TERAIO_BENCH_DIR", REPO / "build" / "bench")) / "tokenizer.json"
NAME = "cl100k_base"


def in_bench_venv() -> None:
    """Re-run this script with the bench venv's Python, making it first."""
    if Path(sys.prefix).resolve() == VENV.resolve():
        return
    sys.path.insert(0, str(REPO / "bench"))
    from benchenv import own_venv
    py = own_venv(VENV.parent, VENV.name, REQUIREMENTS, "run_tokenizer")
    os.execv(str(py), [str(py), str(Path(__file__).resolve()), *sys.argv[1:]])


def stdlib_docs(limit_bytes: float) -> list[str]:
    root = Path(sysconfig.get_paths()["stdlib"])
    docs, size = [], 0
    for p in sorted(root.rglob("*.py")):
        if "site-packages" in p.parts:
            continue
        try:
            text = p.read_text(encoding="utf-8")
        except (UnicodeDecodeError, OSError):
            continue
        docs.append(text)
        size += len(text.encode())
        if size >= limit_bytes:
            break
    return docs


def hf_tokenizer(enc, ranks: dict[bytes, int]):
    """A Llama-3-style tokenizer.json of the ranks, split by enc's pattern
    (also used by bench/run_parquet.py)."""
    import tokenizers
    from tokenizers import decoders, models, pre_tokenizers

    bs = list(range(33, 127)) + list(range(161, 173)) + list(range(174, 256))
    cs, n = bs[:], 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    b2u = {b: chr(c) for b, c in zip(bs, cs)}
    vocab = {"".join(b2u[x] for x in tok): r for tok, r in ranks.items()}
    merges = []
    for tok, _ in sorted(ranks.items(), key=lambda kv: kv[1]):
        local = [(tok[:k], tok[k:]) for k in range(1, len(tok)) if tok[:k] in ranks and tok[k:] in ranks]
        local.sort(key=lambda ab: (ranks[ab[0]], ranks[ab[1]]))
        merges += [("".join(b2u[x] for x in a), "".join(b2u[x] for x in b)) for a, b in local]
    t = tokenizers.Tokenizer(models.BPE(vocab, merges, ignore_merges=True))
    t.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(tokenizers.Regex(enc._pat_str), behavior="isolated", invert=False),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
    t.decoder = decoders.ByteLevel()
    return t


def implementations(docs: list[str]):
    """name -> (function encoding every document, the documents it takes)."""
    import bpe_openai._bindings
    import tiktoken
    import tiktoken.load
    import tiktoken_ext.openai_public as openai_public
    import tokendagger

    from teraio import _lib as L
    from teraio.tok import Tokenizer

    ranks = tiktoken.load.load_tiktoken_bpe(str(SHIPPED / f"{NAME}.tiktoken"))
    # tiktoken's own definition of the encoding, its rank file read offline.
    openai_public.load_tiktoken_bpe = lambda *args, **kwargs: ranks
    spec = getattr(openai_public, NAME)()
    old_pattern = json.loads((SHIPPED / "encodings.json").read_text())[NAME]["pat_str"]
    ref = tiktoken.Encoding(**spec)
    ref_old = tiktoken.Encoding(f"{NAME}-0.7", pat_str=old_pattern, mergeable_ranks=ranks,
                                special_tokens=spec["special_tokens"])
    dagger, dagger_old = (tokendagger.Encoding(NAME, pat_str=pat, mergeable_ranks=ranks,
                                               special_tokens=spec["special_tokens"])
                          for pat in (spec["pat_str"], old_pattern))
    bpe = bpe_openai._bindings.tokenizer_for_encoding(NAME)
    hf = hf_tokenizer(ref_old, ranks)
    tok = Tokenizer.encoding(NAME, SHIPPED)
    raw = [d.encode() for d in docs]
    buf = (ctypes.c_uint32 * max(len(r) for r in raw))()
    n_ids = ctypes.c_size_t()

    def c_only(texts):
        for r in texts:
            L.tio_tok_encode(tok._h, r, len(r), 0, buf, len(r), ctypes.byref(n_ids))

    impls = {
        "teraio": (lambda texts: [tok.encode(d) for d in texts], docs),
        "tiktoken": (lambda texts: [ref.encode_ordinary(d) for d in texts], docs),
        "tiktoken 0.7 pattern": (lambda texts: [ref_old.encode_ordinary(d) for d in texts], docs),
        "bpe-openai": (lambda texts: [bpe.encode(d) for d in texts], docs),
        "tokendagger": (lambda texts: [dagger.encode_ordinary(d) for d in texts], docs),
        "tokendagger 0.7 pattern": (lambda texts: [dagger_old.encode_ordinary(d) for d in texts], docs),
        "tokenizers": (lambda texts: [hf.encode(d, add_special_tokens=False).ids for d in texts], docs),
        "teraio bytes": (lambda texts: [tok.encode(r) for r in texts], raw),
        "teraio C": (c_only, raw),
    }
    # Same ids first, so the speeds compare the same work.
    sample = docs[:: max(1, len(docs) // 60)]
    want = [ref.encode_ordinary(d) for d in sample]
    for name, (fn, _) in impls.items():
        if name == "teraio C":
            continue
        texts = [d.encode() for d in sample] if name == "teraio bytes" else sample
        got = fn(texts)
        bad = [i for i, (g, w) in enumerate(zip(got, want)) if list(g) != w]
        if bad:
            sys.exit(f"run_tokenizer: {name} gives other ids than tiktoken on {len(bad)} of "
                     f"{len(sample)} documents")
    versions = {"tiktoken": tiktoken.__version__ if hasattr(tiktoken, "__version__") else "",
                "tokendagger": tokendagger.__version__,
                "bpe-openai": bpe_openai.__version__}
    return impls, tok, raw, versions


def seconds(fn, texts) -> float:
    t0 = time.perf_counter()
    kept = fn(texts)
    dt = time.perf_counter() - t0
    del kept
    return dt


def median_range(values: list[float]) -> tuple[float, float, float]:
    return statistics.median(values), min(values), max(values)


def main() -> int:
    in_bench_venv()
    sys.path.insert(0, str(REPO / "python"))
    lib = REPO / "build" / "lib" / "libteraio.so"
    if "TERAIO_LIBRARY" not in os.environ and lib.exists():
        os.environ["TERAIO_LIBRARY"] = str(lib)
    os.environ.setdefault("TIKTOKEN_CACHE_DIR", "")  # the rank files are local
    mb = float(os.environ.get("BENCH_TOK_MB", "8"))
    rounds = int(os.environ.get("BENCH_TOK_ROUNDS", "7"))
    pairs = int(os.environ.get("BENCH_TOK_PAIRS", "11"))

    docs = stdlib_docs(mb * 1e6)
    total = sum(len(d.encode()) for d in docs)
    impls, tok, raw, versions = implementations(docs)
    names = list(impls)
    print(f"text: {len(docs)} Python stdlib files, {total / 1e6:.1f} MB; encoding {NAME}; "
          f"single thread; {rounds} rounds, order shuffled each round; same ids checked first")

    rates: dict[str, list[float]] = {k: [] for k in names}
    for r in range(rounds):
        order = names[:]
        random.Random(r).shuffle(order)  # no implementation always follows the same one
        for name in order:
            gc.collect()
            fn, texts = impls[name]
            rates[name].append(total / seconds(fn, texts) / 1e6)
        print(f"  round {r + 1}: " + "  ".join(f"{k} {rates[k][-1]:.1f}" for k in names) + " MB/s")

    # Each peer at its best configuration: per round, its faster variant.
    variants = {"tiktoken": ["tiktoken", "tiktoken 0.7 pattern"], "bpe-openai": ["bpe-openai"],
                "tokendagger": ["tokendagger", "tokendagger 0.7 pattern"], "tokenizers": ["tokenizers"]}
    peers = list(variants)
    ratios = {p: [rates["teraio"][r] / max(rates[v][r] for v in variants[p]) for r in range(rounds)]
              for p in peers}
    out = {"text_bytes": total, "documents": len(docs), "encoding": NAME, "rounds": rounds,
           "versions": versions, "mb_per_s": {}, "teraio_over": {}}
    print(f"\n{'implementation':<40} {'MB/s median (min-max)':>24} "
          f"{'teraio / best of it, median (min-max)':>40}")
    for name in names:
        med, lo, hi = median_range(rates[name])
        out["mb_per_s"][name] = med
        label = {"teraio": "teraio Tokenizer.encode(str)",
                 "teraio bytes": "teraio Tokenizer.encode(bytes)",
                 "teraio C": "teraio tio_tok_encode, no list (ctypes)",
                 "tiktoken": f"tiktoken {versions['tiktoken']} encode_ordinary",
                 "tiktoken 0.7 pattern": "  the same, tiktoken 0.7's pattern",
                 "bpe-openai": f"bpe-openai {versions['bpe-openai']} (Rust, direct)",
                 "tokendagger": f"tokendagger {versions['tokendagger']} encode_ordinary",
                 "tokendagger 0.7 pattern": "  the same, tiktoken 0.7's pattern",
                 "tokenizers": "tokenizers encode"}[name]
        ratio = ""
        if name in ratios:
            rm, rlo, rhi = median_range(ratios[name])
            out["teraio_over"][name] = {"median": rm, "min": rlo, "max": rhi}
            ratio = f"{rm:.2f} ({rlo:.2f}-{rhi:.2f})"
        print(f"{label:<40} {f'{med:.1f} ({lo:.1f}-{hi:.1f})':>24} {ratio:>40}")

    # Batch scaling: 1 and 2 threads back to back, alternating which goes
    # first, so a slow spell of the shared machine hits both sides alike.
    scalings, cpu_ratios, batch = [], [], {1: [], 2: []}
    for p in range(pairs):
        pair, cpu = {}, {}
        for threads in ((1, 2) if p % 2 == 0 else (2, 1)):
            t0, c0 = time.perf_counter(), time.process_time()
            tok.encode_batch_flat(raw, threads=threads)
            cpu[threads] = time.process_time() - c0
            pair[threads] = total / (time.perf_counter() - t0) / 1e6
            batch[threads].append(pair[threads])
        scalings.append(pair[2] / pair[1])
        cpu_ratios.append(cpu[1] / cpu[2])
    sm, slo, shi = median_range(scalings)
    out["batch"] = {"threads_1_mb_per_s": statistics.median(batch[1]),
                    "threads_2_mb_per_s": statistics.median(batch[2]),
                    "scaling_median": sm, "scaling_min": slo, "scaling_max": shi, "pairs": pairs,
                    "cpu_1_over_2_median": statistics.median(cpu_ratios)}
    print(f"\nbatch (encode_batch_flat): 1 thread {out['batch']['threads_1_mb_per_s']:.1f} MB/s, "
          f"2 threads {out['batch']['threads_2_mb_per_s']:.1f} MB/s (medians); 2 vs 1 thread "
          f"{sm:.2f} ({slo:.2f}-{shi:.2f}) over {pairs} pairs; CPU time 1/2 threads "
          f"{out['batch']['cpu_1_over_2_median']:.2f}; {os.cpu_count()} CPUs, load average "
          f"{os.getloadavg()[0]:.1f}")
    ratios = [{"name": f"encode vs {p} (median of {rounds} rounds)",
               "value": out["teraio_over"][p]["median"], "higher_is_better": True} for p in peers]
    ratios.append({"name": f"batch 2 threads vs 1 (median of {pairs} pairs)", "value": sm,
                   "higher_is_better": True})
    OUT.parent.mkdir(parents=True, exist_ok=True)
    OUT.write_text(json.dumps({
        "bench": "tokenizer",
        "title": f"{NAME} through the Python API, single thread, {total / 1e6:.1f} MB of stdlib source",
        "reference": "tiktoken, bpe-openai, tokendagger, tokenizers in the same run, same ids",
        "ratios": ratios, "details": out}, indent=1) + "\n")
    print(f"wrote {OUT}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
