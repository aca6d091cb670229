"""The paper tracer (teraio.paper) on a 2-layer Llama built by Hugging Face
transformers on the meta device: gradients found, sharding and M accounting,
and the suite directory that `teraio eval paper --traces` reads."""
import json
import subprocess
from pathlib import Path

import pytest

pytest.importorskip("transformers")

from teraio import paper  # noqa: E402
from teraio.core import Lifetime, Trace  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]

TINY = dict(cls="llama", hidden_size=64, intermediate_size=128, num_hidden_layers=2,
            num_attention_heads=4, num_key_value_heads=2, vocab_size=256,
            max_position_embeddings=64, rope_theta=10000.0, tie_word_embeddings=False,
            params=0)


@pytest.fixture
def tiny(monkeypatch, tmp_path):
    monkeypatch.setitem(paper.MODELS, "tiny", TINY)
    hw = tmp_path / "hw.conf"
    hw.write_text((ROOT / "hw" / "h100-nvl-paper.conf").read_text().replace(
        "capacity_bytes = 94000000000", "capacity_bytes = 2000000"))
    return str(hw)


def param_bytes():
    return sum(p.numel() * 4 for p in paper.build_model("tiny").parameters())


@pytest.mark.parametrize("shards", [1, 2])
def test_trace_accounts_every_global_and_gradient(tiny, tmp_path, monkeypatch, shards):
    monkeypatch.setitem(paper.SHARDS, "tiny", shards)
    out = tmp_path / "t.tio"
    info = paper.trace_config("tiny", 4, 32, tiny, str(out))
    assert info["shards"] == shards and info["micro_batch"] == 4  # 8192 tokens // 32, <= batch
    pb = param_bytes()
    n_params = len(list(paper.build_model("tiny").parameters()))
    tr = Trace.load(str(out))
    lt = Lifetime(tr)
    # parameters and both AdamW moments (and one 4-byte step counter per
    # parameter) are global: resident at every kernel, this GPU's share
    globals_ = sum(-(-b // shards) for b in (pb, pb, pb))
    assert min(lt.memory_curve()) >= globals_ - n_params * shards
    # gradients exist at the peak on top of them (the last one is born in backward)
    assert lt.peak_bytes > globals_


def test_shard_and_prune_names_gradients_and_halves_the_optimizer():
    # tensors: (bytes, kind, global, name); kernels: (name, ns, [(id, mode)])
    tensors = [(400, "parameter", True, "w"), (400, "optimizer_state", True, "w.exp_avg"),
               (400, "optimizer_state", True, "w.exp_avg_sq"), (400, "temporary", False, None),
               (100, "activation", False, None), (400, "temporary", False, None)]
    kernels = [("aten.mm.default", 1000, [(0, 1), (4, 2)]),          # forward
               ("aten.view.default", 0, [(4, 1)]),                   # dropped
               ("aten.mm.default", 1000, [(4, 1), (3, 2)]),          # backward: gradient 3
               ("aten.lerp_.Scalar", 800, [(1, 3), (3, 1)]),         # optimizer step
               ("aten.sqrt.default", 800, [(2, 1), (5, 2)]),         # temporary 5
               ("aten.addcdiv_.default", 800, [(0, 3), (1, 1), (5, 1)])]
    t, k = paper.shard_and_prune(tensors, kernels, shards=2)
    assert [x[1] for x in t] == ["parameter", "optimizer_state", "optimizer_state", "gradient",
                                 "activation", "temporary"]
    assert [x[0] for x in t] == [200, 200, 200, 200, 100, 400]
    assert [x[0] for x in k] == ["aten.mm.default", "aten.mm.default", "aten.lerp_.Scalar",
                                 "aten.sqrt.default", "aten.addcdiv_.default"]
    assert [x[1] for x in k] == [1000, 1000, 400, 400, 400]


def test_paper_configurations_list_and_m_targets():
    runs = paper.PAPER_RUNS
    assert len(runs) == 18
    for m, b, s in runs:
        assert (m, b, s) in paper.MICRO_BATCH
        lo, hi = paper.PAPER_M_RANGE[m]
        assert lo <= paper.paper_m(m, b, s) <= hi


def test_roofline_needs_its_constants(tmp_path):
    hw = tmp_path / "hw.conf"
    hw.write_text("\n".join(line for line in (ROOT / "hw" / "h100-nvl-paper.conf").read_text().splitlines()
                            if not line.startswith("gpu_mem_gbps")))
    with pytest.raises(ValueError, match="lacks the roofline constants gpu_mem_gbps"):
        paper.Roofline(paper.read_hw(str(hw)))


def test_suite_directory_is_what_eval_paper_reads(tiny, tmp_path, monkeypatch):
    # Two configurations of one trace and one of another: the suite holds two
    # trace files, the profile, and the index; a second run traces nothing.
    monkeypatch.setitem(paper.SHARDS, "tiny", 1)
    monkeypatch.setattr(paper, "PAPER_RUNS", [("tiny", 4, 32), ("tiny", 4, 32), ("tiny", 2, 16)])
    monkeypatch.setattr(paper, "PAPER_M_RANGE", {"tiny": (100, 200)})
    monkeypatch.setattr(paper, "REFERENCES", [("all", "teraio-alg1", 0.8)])
    out = tmp_path / "suite"
    paper.write_suite(str(out), tiny)
    lines = (out / "suite.txt").read_text().splitlines()
    assert lines[:2] == ["teraio-suite 1", "hw h100-nvl-paper"]
    configs = [x.split() for x in lines if x.startswith("config ")]
    assert [c[1:4] for c in configs] == [["tiny", "4", "32"], ["tiny", "4", "32"], ["tiny", "2", "16"]]
    assert configs[0][7] == configs[1][7] == "tiny-s32-mb4-x1-t2.tio" and configs[2][7] == "tiny-s16-mb2-x1-t2.tio"
    assert "reference all teraio-alg1 0.8" in lines
    assert sorted(p.name for p in out.iterdir()) == ["hw.conf", "suite.txt", "tiny-s16-mb2-x1-t2.tio",
                                                    "tiny-s32-mb4-x1-t2.tio"]
    stamp = (out / "tiny-s32-mb4-x1-t2.tio").stat().st_mtime_ns
    paper.write_suite(str(out), tiny)
    assert (out / "tiny-s32-mb4-x1-t2.tio").stat().st_mtime_ns == stamp  # cached
    other = tmp_path / "other.conf"
    other.write_text(Path(tiny).read_text() + "host_overhead_us = 1\n")
    with pytest.raises(SystemExit, match="holds traces for another profile"):
        paper.write_suite(str(out), str(other))
    exe = ROOT / "build" / "bin" / "teraio"
    if exe.exists():  # the C step reads what the Python step wrote
        r = subprocess.run([str(exe), "eval", "paper", "--traces", str(out), "--json",
                            "--alg1-seconds", "0"], capture_output=True, text=True, timeout=120)
        assert r.returncode == 0, r.stderr
        doc = json.loads(r.stdout)
        assert [c["seq"] for c in doc["configs"]] == [32, 32, 16]
        assert doc["configs"][0]["results"] == doc["configs"][1]["results"]
        assert doc["fidelity"][0]["model"] == "all" and doc["fidelity"][0]["paper"] == 0.8
