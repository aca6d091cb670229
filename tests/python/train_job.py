"""Helpers for the tests of examples/train.py: a small JSONL corpus whose
documents' token counts are known, torchrun launches of the example, and its
per-rank metrics."""
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
EXAMPLE = REPO / "examples" / "train.py"
TOKENIZER = "r50k_base"
# A model and batch small enough for 3 ranks on 2 cores: each step is well under a second.
SMALL = ["--seq-len", "32", "--batch-size", "2", "--dim", "32", "--layers", "2", "--heads", "2",
         "--ffn", "64", "--lr", "1e-2", "--logical-shards", "6", "--shuffle-buffer", "4"]
WORDS = ("loader shard rank epoch token sample offload prefetch kernel tensor plan capacity "
         "engine stream checkpoint resume mixing weight document span").split()


def prose(i):
    n = 6 + (i * 7) % 23
    return " ".join(WORDS[(i * 3 + j * j) % len(WORDS)] for j in range(n)).capitalize() + "."


def code(i):
    return f"def f{i}(x):\n    return x * {i} + {(i * 13) % 7}\n" * (1 + i % 3)


def write_corpus(root):
    """Two sub-datasets of one JSONL file each; returns {(sub, 0, doc): packed tokens}
    with sub the index in sorted name order (code 0, prose 1) and the EOS counted."""
    from teraio.tok import Tokenizer
    docs = {"code": [code(i) for i in range(14)], "prose": [prose(i) for i in range(18)]}
    sizes = {}
    with Tokenizer.encoding(TOKENIZER) as tok:
        for sub, (name, texts) in enumerate(sorted(docs.items())):
            (root / name).mkdir(parents=True)
            with open(root / name / "part.jsonl", "w") as f:
                for d, text in enumerate(texts):
                    f.write(json.dumps({"text": text}) + "\n")
                    sizes[(sub, 0, d)] = len(tok.encode(text)) + 1
    return sizes


def torchrun(nproc, *args, tmp, expect_rc=0, env=None, nnodes_args=None):
    """Run the example under torchrun; returns the CompletedProcess."""
    tmp = Path(tmp)
    tmp.mkdir(parents=True, exist_ok=True)
    # torchelastic leaves its scratch folders in TMPDIR: keep them in the test's
    # faulthandler: a worker that dies of a signal prints its Python stacks
    # TERAIO_TRAIN_WATCHDOG_S: a rank still running after 240 s prints its Python stacks
    # and exits, so a hang shows where it is before the 300 s timeout
    full_env = dict(os.environ, OMP_NUM_THREADS="1", TMPDIR=str(tmp), PYTHONFAULTHANDLER="1",
                    TERAIO_TRAIN_WATCHDOG_S="240", **(env or {}))
    launch = nnodes_args if nnodes_args is not None else ["--standalone"]
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", str(nproc), *launch,
           str(EXAMPLE), *map(str, args)]
    try:
        r = subprocess.run(cmd, env=full_env, capture_output=True, text=True, timeout=300)
    except subprocess.TimeoutExpired as e:
        err = e.stderr.decode(errors="replace") if isinstance(e.stderr, bytes) else e.stderr or ""
        raise AssertionError(f"torchrun timed out after 300 s: {cmd}\n{err[-12000:]}") from None
    if expect_rc is not None:
        assert (r.returncode == 0) == (expect_rc == 0), (r.returncode, r.stdout[-2000:],
                                                         r.stderr[-12000:])
    return r


def metrics(out, rank):
    """The example's metrics lines of `rank` (one dict per step)."""
    path = Path(out) / "metrics" / f"rank{rank}.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines()]


def assert_epoch_delivered_once(spans, sizes, epoch=0):
    """The spans (sub, file, doc, offset, length, epoch) of `epoch` cover every document
    of `sizes` ({(sub, file, doc): packed tokens}) exactly once: no token repeated or missing."""
    cover = {}
    for sub, f, d, off, n, e in spans:
        if e == epoch:
            cover.setdefault((sub, f, d), []).append((off, n))
    assert set(cover) == set(sizes)
    for key, pieces in cover.items():
        at = 0
        for off, n in sorted(pieces):
            assert off == at, (key, pieces)     # no token repeated, none skipped
            at += n
        assert at == sizes[key], (key, pieces)


@pytest.fixture(scope="session")
def job(tmp_path_factory):
    """(folder, {(sub, file, doc): packed tokens}, the arguments every run shares)."""
    base = tmp_path_factory.mktemp("train")
    sizes = write_corpus(base / "corpus")
    return base, sizes, ["--data", base / "corpus", "--provenance", *SMALL]


@pytest.fixture(scope="session")
def run_a(job):
    """The uninterrupted run: 2 ranks (FSDP2), steps 1-6, checkpoints at steps 3 and 6."""
    base, _, common = job
    torchrun(2, "--out", base / "A", "--steps", 6, "--ckpt-every", 3, *common, tmp=base / "tmp")
    return base / "A"
