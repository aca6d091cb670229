"""examples/train.py under torchrun (FSDP2, gloo, 2 and 3 ranks): checkpoints with
torch.distributed.checkpoint, resume on the same and on another world size, and a
rank killed in the middle of a checkpoint.

Runs (each a torchrun job on a small JSONL corpus tokenized with r50k_base):
  A  2 ranks, steps 1-6, checkpoints at steps 3 and 6          (the uninterrupted run)
  K  as A, but rank 1 SIGKILLs itself in the checkpoint of step 6
  B  2 ranks resume K's checkpoint folder (its step 3), steps 4-6
  C  3 ranks resume A's step 3, steps 4-12 (epoch 0 ends at step 10)
"""
import math
import shutil

import pytest

from train_job import SMALL, assert_epoch_delivered_once, job, metrics, run_a, torchrun  # noqa: F401


@pytest.fixture(scope="module")
def run_k(job):
    base, _, common = job
    r = torchrun(2, "--out", base / "K", "--steps", 6, "--ckpt-every", 3,
                 "--kill-in-checkpoint", "6:1", *common, tmp=base / "tmp", expect_rc=1)
    assert "SIGKILL" in r.stderr, r.stderr[-3000:]
    return base / "K"


def test_two_ranks_checkpoint_every_three_steps(run_a):
    ckpts = sorted(p.name for p in (run_a / "ckpt").iterdir())
    assert ckpts == ["run.json", "step-00000003", "step-00000006"]
    for rank in (0, 1):
        rows = metrics(run_a, rank)
        assert [r["step"] for r in rows] == [1, 2, 3, 4, 5, 6]
        assert all(math.isfinite(r["loss"]) for r in rows)
    # ranks read different samples, so their losses differ; the mean is one value
    a0, a1 = metrics(run_a, 0), metrics(run_a, 1)
    assert [r["loss"] for r in a0] != [r["loss"] for r in a1]
    assert [r["loss_mean"] for r in a0] == [r["loss_mean"] for r in a1]


def test_kill_in_checkpoint_leaves_previous_complete(run_a, run_k):
    # K trained steps 1-6 exactly like A before rank 1 died in checkpoint 6
    for rank in (0, 1):
        assert [r["loss"] for r in metrics(run_k, rank)] == [r["loss"] for r in metrics(run_a, rank)]
    names = sorted(p.name for p in (run_k / "ckpt").iterdir())
    assert names == ["run.json", "step-00000003", "step-00000006.partial"]
    partial = run_k / "ckpt" / "step-00000006.partial"
    assert not (partial / ".metadata").exists()          # never completed
    assert (run_k / "ckpt" / "step-00000003" / ".metadata").is_file()


def test_resume_two_ranks_bit_identical(job, run_a, run_k):
    """From K's checkpoint folder (newest complete: step 3) on 2 ranks, steps 4-6 give
    A's losses bit for bit on every rank."""
    base, _, common = job
    out = base / "B"
    r = torchrun(2, "--out", out, "--steps", 6, "--resume", run_k / "ckpt", *common, tmp=base / "tmp")
    assert "step-00000003 (step 3, saved by 2 ranks) on 2" in r.stdout, r.stdout
    for rank in (0, 1):
        got = metrics(out, rank)
        want = metrics(run_a, rank)[3:]
        assert [g["step"] for g in got] == [4, 5, 6]
        assert [g["loss"] for g in got] == [w["loss"] for w in want]
        assert [g["spans"] for g in got] == [w["spans"] for w in want]


def test_resume_three_ranks_every_token_once(job, run_a):
    """From A's step 3 on 3 ranks: every document token of epoch 0 is delivered exactly
    once by A's steps 1-3 and the resumed run together; training goes on."""
    base, sizes, common = job
    out = base / "C"
    torchrun(3, "--out", out, "--steps", 12, "--resume", run_a / "ckpt" / "step-00000003", *common,
             tmp=base / "tmp")
    before = [row for rank in (0, 1) for row in metrics(run_a, rank)[:3]]
    after = [row for rank in (0, 1, 2) for row in metrics(out, rank)]
    assert_epoch_delivered_once([s for row in before + after for s in row["spans"]], sizes)
    # the model and optimizer were loaded: the first resumed loss is already below the
    # untrained model's, and it keeps falling
    rows = metrics(out, 0)
    assert [r["step"] for r in rows] == list(range(4, 13))
    losses = [r["loss_mean"] for r in rows]
    assert all(math.isfinite(x) for x in losses)
    start = metrics(run_a, 0)[0]["loss_mean"]
    assert losses[0] < start - 0.5, (start, losses)
    half = len(losses) // 2
    assert sum(losses[half:]) / (len(losses) - half) < sum(losses[:half]) / half, losses


def test_plain_process_writes_its_own_corpus(tmp_path):
    """Without --data and without torchrun (a group of one, DDP) the example writes a
    corpus from the standard library and trains on it."""
    import subprocess
    import sys

    from train_job import EXAMPLE
    out = tmp_path / "run"
    r = subprocess.run([sys.executable, str(EXAMPLE), "--out", str(out), "--steps", "2",
                        "--parallel", "ddp", "--corpus-files", "3", *SMALL],
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    for sub in ("code", "prose"):
        lines = (out / "corpus" / sub / "stdlib.jsonl").read_text().splitlines()
        assert len(lines) > 3, sub
    assert [row["step"] for row in metrics(out, 0)] == [1, 2]
    assert r.stdout.startswith("train: steps 1-2 on 1 rank (ddp, gloo)"), r.stdout
    shutil.rmtree(out / "tmp", ignore_errors=True)


def test_checkpoints_belong_to_their_run(job, run_a, tmp_path):
    """Issue 26 item 8: a fresh run in another run's --out replaced its step 3 and kept
    its step 6, and --resume then continued the other run.  Now each checkpoint names
    its run (a random id and the settings' hash), a fresh run refuses a folder of
    another run's checkpoints, and --overwrite replaces them."""
    import json
    base, _, common = job
    saved = json.loads((run_a / "ckpt" / "step-00000003" / "train.json").read_text())
    run = json.loads((run_a / "ckpt" / "run.json").read_text())
    assert len(saved["run_id"]) == 32 and saved["run_id"] == run["run_id"]
    assert saved["config_hash"] == run["config_hash"] and saved["config"]["lr"] == 1e-2
    out = tmp_path / "A2"
    shutil.copytree(run_a / "ckpt", out / "ckpt")
    r = torchrun(2, "--out", out, "--steps", 3, "--ckpt-every", 3, *common, tmp=base / "tmp", expect_rc=1)
    assert f"{out / 'ckpt'} holds another run's checkpoints (run {saved['run_id']}, step-00000006): " \
           f"pass --resume {out / 'ckpt'} to continue that run, --overwrite to replace them" in r.stderr, \
        r.stderr[-3000:]
    # nothing of run A was touched
    assert sorted(p.name for p in (out / "ckpt").iterdir()) == ["run.json", "step-00000003", "step-00000006"]
    assert json.loads((out / "ckpt" / "step-00000003" / "train.json").read_text()) == saved
    r = torchrun(2, "--out", out, "--steps", 3, "--ckpt-every", 3, "--overwrite", *common, tmp=base / "tmp")
    assert sorted(p.name for p in (out / "ckpt").iterdir()) == ["run.json", "step-00000003"]
    mine = json.loads((out / "ckpt" / "step-00000003" / "train.json").read_text())
    assert mine["run_id"] != saved["run_id"]
    assert mine["run_id"] == json.loads((out / "ckpt" / "run.json").read_text())["run_id"]


def test_damaged_newest_checkpoint_falls_back_or_is_refused(job, run_a, tmp_path):
    """Issue 26 item 9: one rank's .distcp missing from the newest checkpoint gave 7 DCP
    tracebacks and the complete previous checkpoint was not used.  Now --resume names
    the damage in one line and resumes step 3 (A's losses after it, bit for bit);
    --resume-strict refuses in one line."""
    base, _, common = job
    ckpt = tmp_path / "ckpt"
    shutil.copytree(run_a / "ckpt", ckpt)
    (ckpt / "step-00000006" / "__1_0.distcp").unlink()
    out = tmp_path / "R"
    r = torchrun(2, "--out", out, "--steps", 6, "--resume", ckpt, "--resume-strict", *common,
                 tmp=base / "tmp", expect_rc=1)
    line = (f"train.py: {ckpt / 'step-00000006'}: damaged checkpoint: __1_0.distcp is missing "
            f"(--resume-strict; without it the newest complete one is resumed)")
    assert line in r.stderr, r.stderr[-3000:]
    assert r.stderr.count("Traceback") == 1, r.stderr[-6000:]    # torchrun's own, none from the ranks
    r = torchrun(2, "--out", out, "--steps", 6, "--resume", ckpt, *common, tmp=base / "tmp")
    assert (f"train.py: {ckpt / 'step-00000006'} is damaged (__1_0.distcp is missing): resuming "
            f"step-00000003, the newest complete checkpoint") in r.stderr, r.stderr[-3000:]
    for rank in (0, 1):
        got = metrics(out, rank)
        assert [g["step"] for g in got] == [4, 5, 6]
        assert [g["loss"] for g in got] == [w["loss"] for w in metrics(run_a, rank)[3:]]
    # a short file is damage too, named with its sizes
    f = ckpt / "step-00000003" / "__0_0.distcp"
    f.write_bytes(f.read_bytes()[:100])
    r = torchrun(2, "--out", out, "--steps", 6, "--resume", ckpt / "step-00000003", *common,
                 tmp=base / "tmp", expect_rc=1)
    assert "damaged checkpoint: __0_0.distcp holds 100 bytes, the metadata needs" in r.stderr, r.stderr[-3000:]
