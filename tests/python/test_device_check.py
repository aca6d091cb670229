"""scripts/device-check: the parts that run without a GPU.

The script itself runs on a machine with an NVIDIA GPU (docs/gpu.md).  Here:
without a device it refuses with exit status 2 and a reason starting "needs a
CUDA device" (and says so in its JSON); --dry-run finds the carried build and
writes its plan; and its demo and PyTorch-activation-offloading steps, run on
the CPU with a tiny model (--rehearse-on-cpu), give identical losses with and
without offloading, a resident peak within the capacity, and PyTorch's pass
offloading activations, so the driver's own code is exercised before it
spends device time.
"""
import json
import subprocess
import sys
from pathlib import Path

import torch

from teraio import gpu

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "scripts" / "device-check"
HAS_CUDA = torch.cuda.is_available() and gpu.unavailable_reason() is None


def run(*args, timeout=600):
    return subprocess.run([sys.executable, str(SCRIPT), *map(str, args)], capture_output=True, text=True,
                          timeout=timeout)


def test_dry_run_finds_the_build_and_writes_the_plan(tmp_path):
    r = run("--dry-run", tmp_path)
    assert r.returncode == 0, r.stdout + r.stderr
    out = json.loads((tmp_path / "device-check.json").read_text())
    assert out["dry_run"] and out["missing"] == []
    assert out["plan"] == ["machine", "build", "tests", "bandwidth", "demo", "advise",
                           "torch_activation_offloading", "demo_compiled"]
    assert ("cuda" in out["teraio_features"].split()) == (gpu.cuda_info()["state"] != "not built")
    assert "device-check: dry run: build complete" in r.stdout


def test_refuses_without_a_device(tmp_path):
    if HAS_CUDA:  # the real run is the device check itself; here only that it would start
        assert run("--dry-run", tmp_path).returncode == 0
        return
    r = run(tmp_path)
    assert r.returncode == 2
    assert r.stderr.startswith("device-check: needs a CUDA device: ")
    out = json.loads((tmp_path / "device-check.json").read_text())
    assert out["refused"].startswith("needs a CUDA device: ")


def test_rehearsal_on_cpu(tmp_path):
    r = run("--rehearse-on-cpu", "demo,advise,torch_activation_offloading", "--iterations", "4",
            tmp_path)
    assert r.returncode == 0, r.stdout + r.stderr
    out = json.loads((tmp_path / "device-check.json").read_text())
    demo = out["demo"]
    assert demo["ok"] and len(demo["reference"]["losses"]) == 4
    for frac in ("0.5", "0.25"):
        run_ = demo[f"capacity_{frac}"]
        assert run_["losses"] == demo["reference"]["losses"]
        assert run_["peak_resident_bytes"] <= run_["capacity_bytes"]
        assert run_["planned_iterations"] == 2 and run_["bytes_offloaded"] > 0
    adv = out["advise"]  # teraio advise's prediction for the demo's runs (on a GPU: its error)
    assert adv["ideal"]["predicted_s"] > 0 and adv["ideal"]["measured_s"] > 0
    assert all(adv[f"capacity_{f}"]["predicted_s"] > 0 for f in ("0.5", "0.25"))
    ao = out["torch_activation_offloading"]
    assert ao["compiled"]["activations_offloaded"] == 0
    assert ao["compiled_activation_offloading"]["activations_offloaded"] > 0
    assert ao["losses_identical"]
    table = (tmp_path / "device-check.md").read_text()
    assert "teraio advise (h100-nvl-paper.conf" in table
    assert "| teraio capacity 0.25 |" in table and "| torch.compile + activation offloading |" in table
