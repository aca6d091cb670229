"""teraio.core.Plan.build: one entry point (tio_plan_build), the fast
planner by default."""
from pathlib import Path

import pytest

from teraio.core import Lifetime, Plan, Trace

DATA = Path(__file__).resolve().parents[1] / "data"


def fixture():
    trace = Trace.load(str(DATA / "llama-tiny.tio"))
    return trace, Lifetime(trace)


def test_default_planner_is_the_old_fast_planners_plan(tmp_path):
    # tests/data/llama-tiny-cap0.3-fast.plan is what tio_plan_build_fast
    # (default options) made for this trace before the API became one entry
    # point; Plan.build without `planner` must give it back byte for byte.
    trace, lt = fixture()
    plan = Plan.build(trace, lt, 1095663, ssd_read_gbps=1.0, ssd_write_gbps=1.0)
    plan.save(str(tmp_path / "p.plan"))
    assert (tmp_path / "p.plan").read_bytes() == (DATA / "llama-tiny-cap0.3-fast.plan").read_bytes()
    assert plan.fits and plan.planned_peak_bytes == 1083908


def test_alg1_is_the_reference_and_differs_here():
    trace, lt = fixture()
    ref = Plan.build(trace, lt, 1095663, ssd_read_gbps=1.0, ssd_write_gbps=1.0, planner="alg1")
    assert not ref.fits and ref.planned_peak_bytes == 1099268
    fast = Plan.build(trace, lt, 1095663, ssd_read_gbps=1.0, ssd_write_gbps=1.0, planner="teraio")
    assert fast.migrations() != ref.migrations()


def test_unknown_planner_is_refused():
    trace, lt = fixture()
    with pytest.raises(ValueError, match="planner must be one of"):
        Plan.build(trace, lt, 1095663, ssd_read_gbps=1.0, ssd_write_gbps=1.0, planner="fast")
