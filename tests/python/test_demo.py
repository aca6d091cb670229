"""The demo end to end on a small model, and its bad-input paths."""
import json
import subprocess
import sys

SMALL = ["--iterations", "5", "--dim", "192", "--layers", "2", "--heads", "4", "--ffn-dim", "512",
         "--seq-len", "128", "--batch", "4"]


def run_demo(*args):
    return subprocess.run([sys.executable, "-m", "teraio.demo", *args], capture_output=True, text=True,
                          timeout=600)


def test_small_demo_meets_the_foundation_criteria(tmp_path):
    out = tmp_path / "demo"
    r = run_demo("--out", str(out), *SMALL)
    assert r.returncode == 0, r.stderr
    s = json.loads((out / "summary.json").read_text())
    assert s["losses_identical"] is True
    assert s["iterations_compared"] == 5
    assert s["losses_no_offload"] == s["losses_offload"]
    assert s["capacity_bytes"] <= 0.5 * s["peak_bytes_no_offload"] + 1
    assert s["peak_resident_bytes"] <= 1.05 * s["capacity_bytes"]
    assert s["bytes_offloaded"] > 0 and s["bytes_prefetched"] > 0
    assert s["backend"] in ("io_uring", "psync")
    svg = (out / "memory.svg").read_text()
    assert svg.startswith("<svg") and svg.count("<polyline") == 4


def test_missing_ssd_directory_is_one_line(tmp_path):
    r = run_demo("--out", str(tmp_path / "d"), "--ssd", str(tmp_path / "nope"), *SMALL)
    assert r.returncode == 1
    assert r.stderr.strip().count("\n") == 0
    assert "does not exist" in r.stderr and "nope" in r.stderr


def test_unusable_ssd_directory_is_one_line(tmp_path):
    r = run_demo("--out", str(tmp_path / "d"), "--ssd", "/proc", *SMALL)
    assert r.returncode == 1
    assert r.stderr.strip().count("\n") == 0
    assert r.stderr.startswith("teraio demo:") and "/proc" in r.stderr


def test_capacity_below_a_kernel_need_is_one_line(tmp_path):
    r = run_demo("--out", str(tmp_path / "d"), "--capacity-fraction", "0.001", *SMALL)
    assert r.returncode == 1
    assert r.stderr.strip().count("\n") == 0
    assert "below kernel" in r.stderr
