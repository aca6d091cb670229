"""4 processes launched with torchrun (gloo) each read their share and save; 3 processes
resume from the 4 states and read to the end of the epoch: every document chunk of the
epoch is delivered exactly once, none repeated, none missing.

The test writes a Megatron dataset, then runs this file as the torchrun worker twice
(``python -m torch.distributed.run --nproc-per-node N --standalone test_data_dist.py
PHASE ROOT CKPT OUT``); each worker writes the spans (provenance) it delivered."""
import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np

SEQ_LEN, L, SEED, STEPS = 40, 12, 3, 6


def doc_len(f, d):
    return 1 + (d * 29 + f * 7) % 90


def write_dataset(root):
    """Two sub-datasets of Megatron MMIDIDX v1 files (int32 tokens, one sequence each)."""
    for sub, files in [("web", 3), ("code", 2)]:
        (root / sub).mkdir(parents=True)
        for f in range(files):
            lens = np.array([doc_len(f, d) for d in range(40 + 10 * f)], dtype=np.int32)
            np.arange(int(lens.sum()), dtype=np.int32).tofile(root / sub / f"{f}.bin")
            ptr = np.concatenate([[0], np.cumsum(lens[:-1].astype(np.int64) * 4)]).astype(np.int64)
            with open(root / sub / f"{f}.idx", "wb") as out:
                out.write(b"MMIDIDX\x00\x00" + np.array([1], np.int64).tobytes() + bytes([4]))
                out.write(np.array([len(lens), len(lens) + 1], np.int64).tobytes())
                out.write(lens.tobytes() + ptr.tobytes() + np.arange(len(lens) + 1).astype(np.int64).tobytes())


def worker(phase, root, ckpt, out):
    import torch
    import torch.distributed as dist
    from teraio.data import StreamingDataset

    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    ds = StreamingDataset(root, seq_len=SEQ_LEN, logical_shards=L, seed=SEED, provenance=True,
                          eos_id=0)   # rank and world size from torchrun's RANK/WORLD_SIZE
    assert (ds.rank, ds.world_size) == (rank, world)
    spans = []
    if phase == "save":
        it = iter(ds)
        for _ in range(STEPS):
            spans += [s for s in next(it)["provenance"].tolist() if s[5] == 0]
        ds.save(ckpt)
    else:
        ds.resume(ckpt)
        done = torch.tensor([int(json.loads(Path(out, "need").read_text()))])
        it = iter(ds)
        while True:
            spans += [s for s in next(it)["provenance"].tolist() if s[5] == 0]
            got = torch.tensor([sum(s[4] for s in spans)])
            dist.all_reduce(got)
            if got.item() >= done.item():
                break
    Path(out, f"{phase}-{rank}.json").write_text(json.dumps(spans))
    dist.barrier()
    dist.destroy_process_group()


def torchrun(n, *args, tmp):
    # torchelastic leaves its scratch folders in TMPDIR: keep them in the test's
    env = dict(os.environ, OMP_NUM_THREADS="1", TMPDIR=str(tmp))
    r = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", str(n),
                        "--standalone", __file__, *map(str, args)], env=env, capture_output=True,
                       text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]


def test_torchrun_4_save_3_resume(tmp_path):
    root, ckpt, out = tmp_path / "root", tmp_path / "ckpt", tmp_path / "out"
    write_dataset(root)
    out.mkdir()
    (tmp_path / "tmp").mkdir()
    torchrun(4, "save", root, ckpt, out, tmp=tmp_path / "tmp")
    assert sorted(p.name for p in ckpt.iterdir()) == [f"loader-rank{r:05d}.state" for r in range(4)]
    before = sum((json.loads((out / f"save-{r}.json").read_text()) for r in range(4)), [])
    docs = {(s, f, d): doc_len(f, d) + 1 for s, files in [(0, 2), (1, 3)]
            for f in range(files) for d in range(40 + 10 * f)}   # "code" sorts first
    (out / "need").write_text(str(sum(docs.values()) - sum(s[4] for s in before)))
    torchrun(3, "resume", root, ckpt, out, tmp=tmp_path / "tmp")
    after = sum((json.loads((out / f"resume-{r}.json").read_text()) for r in range(3)), [])
    cover = {}
    for sub, f, d, off, n, _ in before + after:
        cover.setdefault((sub, f, d), []).append((off, n))
    assert set(cover) == set(docs)
    for key, pieces in cover.items():
        at = 0
        for off, n in sorted(pieces):
            assert off == at, (key, pieces)    # no chunk repeated, no gap
            at += n
        assert at == docs[key], key


if __name__ == "__main__":
    worker(*sys.argv[1:5])
