"""The demo end to end on a small model, and its bad-input paths."""
import json
import os
import math
import subprocess
import sys

import pytest

from teraio._lib import TeraioError
from teraio.core import Lifetime, Plan, Trace, fit_host_costs

SMALL = ["--iterations", "5", "--dim", "192", "--layers", "2", "--heads", "4", "--ffn-dim", "512",
         "--seq-len", "128", "--batch", "4"]


def run_demo(*args):
    return subprocess.run([sys.executable, "-m", "teraio.demo", *args], capture_output=True, text=True,
                          timeout=600)


def test_small_demo_meets_the_foundation_criteria(tmp_path):
    out = tmp_path / "demo"
    r = run_demo("--out", str(out), *SMALL, "--validate-iterations", "3")
    assert r.returncode == 0, r.stderr
    s = json.loads((out / "summary.json").read_text())
    assert s["losses_identical"] is True
    assert s["iterations_compared"] == 5
    assert s["losses_no_offload"] == s["losses_offload"]
    assert s["capacity_bytes"] <= 0.5 * s["peak_bytes_no_offload"] + 1
    assert s["peak_resident_bytes"] <= 1.05 * s["capacity_bytes"]
    assert s["bytes_offloaded"] > 0 and s["bytes_prefetched"] > 0
    assert s["backend"] in ("io_uring", "psync")
    # the same job inside a memory limit it does not fit in: killed without teraio, trained with it
    ml = s["memory_limit"]
    if "skipped" in ml:
        assert os.geteuid() != 0 or "too small" in ml["skipped"], ml
    else:
        assert ml["a_killed"] and ml["b_trained"] and ml["b_losses_identical"], ml
        assert ml["peak_b_limited_bytes"] <= ml["limit_bytes"] and ml["b_over_capacity_kernels"] == 0
    svg = (out / "memory.svg").read_text()
    # no offloading, as planned, as measured, the process's RSS above Python+PyTorch, the capacity
    assert svg.startswith("<svg") and svg.count("<polyline") == 5
    assert "process RSS" in svg and s["rss_above_base_peak_bytes"] > 0
    # the simulator check: one iteration under each of its three plans
    assert s["validation_iterations_per_plan"] == 1
    assert all(len(s["validation_times_s"][k]) == 1 for k in "ECR")
    assert s["validation_bytes_moved_cal"] > 0 and s["validation_bytes_moved_offload"] > 0
    assert s["validation_capacity_bytes"] == s["capacity_bytes"]
    # The simulator check ran in-process (fit_host_costs).  One iteration
    # per plan on a shared machine: the fit may be impossible (the
    # calibration plan measured faster than its own simulation), which the
    # check must then say.
    check = s["validation_sim_check"]
    if "error" in check:
        assert "no host cost per byte fits" in check["error"]
    else:
        assert abs(check["measured_s"] - s["validation_iter_time_offload_s"]) < 1e-9
        assert check["host_overhead_us"] >= 0 and check["migration_host_ns_per_byte"] >= 0
        assert check["simulated_s"] > 0 and math.isfinite(check["sim_vs_measured_error"])
    # The fit, checked on times far above any kernel time: the dispatch per
    # kernel is what makes the empty plan's 10 s, and the calibration plan's
    # 20 s needs a host cost per moved byte, which the demo's plan then pays
    # too.
    trace = Trace.load(str(out / "trace_v.tio"))
    lt = Lifetime(trace)
    cal = Plan.load(str(out / "plan_v_cal.tio"), trace, lt)
    plan = Plan.load(str(out / "plan_v.tio"), trace, lt)
    fit = fit_host_costs(trace, lt, cal, plan, calibration_capacity_bytes=s["validation_capacity_cal_bytes"],
                         capacity_bytes=s["capacity_bytes"], empty_s=10.0, calibration_s=20.0,
                         measured_s=s["validation_iter_time_offload_s"],
                         ssd_read_gbps=s["validation_ssd_read_gbps"],
                         ssd_write_gbps=s["validation_ssd_write_gbps"])
    want_us = (10.0 - fit["kernels_s"]) * 1e6 / fit["n_kernels"]
    assert abs(fit["host_overhead_us"] - want_us) < 2e-3
    assert fit["kernel_scale"] == 1 and fit["migration_host_ns_per_byte"] > 0
    assert fit["simulated_s"] > 10.0
    with pytest.raises(TeraioError, match="measured iteration times must be in"):
        fit_host_costs(trace, lt, cal, plan, calibration_capacity_bytes=1, capacity_bytes=1,
                       empty_s=float("inf"), calibration_s=20.0, measured_s=1.0,
                       ssd_read_gbps=1.0, ssd_write_gbps=1.0)


def test_missing_ssd_directory_is_one_line(tmp_path):
    r = run_demo("--out", str(tmp_path / "d"), "--ssd", str(tmp_path / "nope"), *SMALL)
    assert r.returncode == 1
    assert r.stderr.strip().count("\n") == 0
    assert "does not exist" in r.stderr and "nope" in r.stderr
    assert not (tmp_path / "d").exists()   # nothing made for a refused run


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


TINY = ["--dim", "64", "--layers", "1", "--heads", "4", "--ffn-dim", "128", "--seq-len", "32", "--batch", "2",
        "--iterations", "4", "--validate-iterations", "0"]


def test_capacity_sweep(tmp_path):
    """--sweep: every share of the peak from 0.9 down runs under its plan,
    or is skipped because it lies below the working-set floor.  Each run
    keeps the losses bit for bit, measures exactly the planned peak, stays
    within the capacity where the plan fits, and the exit code says whether
    every plan fitted."""
    out = tmp_path / "sweep"
    r = run_demo("--out", str(out), *TINY, "--sweep", "--sweep-iterations", "1")
    s = json.loads((out / "sweep.json").read_text())
    rows = s["rows"]
    assert [row["share"] for row in rows] == [0.9, 0.8, 0.7, 0.6, 0.5, 0.4, 0.3, 0.2, 0.1]
    ran = [row for row in rows if "skipped" not in row]
    assert ran and all(row["capacity_bytes"] >= s["floor_bytes"] for row in ran)
    assert all(row["capacity_bytes"] < s["floor_bytes"] for row in rows if "skipped" in row)
    for row in ran:
        assert row["losses_identical"], row
        assert row["peak_resident_bytes"] == row["planned_peak_bytes"], row
        assert row["diverged_iterations"] == 0
        if row["fits"]:
            assert row["peak_resident_bytes"] <= row["capacity_bytes"] and row["over_capacity_kernels"] == 0
    assert r.returncode == (0 if all(row["fits"] for row in ran) else 1), r.stderr
    table = (out / "sweep.md").read_text()
    assert table.count("\n") == 2 + len(rows) and "| True |" in table
    svg = (out / "sweep.svg").read_text()
    assert svg.startswith("<svg") and svg.count("<circle") >= len(ran)
