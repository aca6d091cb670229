"""Train what does not fit: a Hugging Face GPT-2 inside a memory cgroup that
its plain run does not fit in.

A cgroup's memory limit is the CPU's stand-in for a GPU's memory: over it
the kernel kills the job, as a GPU raises out-of-memory.  Each run is a
process of its own (cgroup_job.py) placed in a fresh cgroup before it
starts.  First the plain job runs without a limit, to measure its peak
(the cgroup's own count, max_usage); then the limit is set at 0.6 of that
peak.  The plain job is killed there, which proves the limit binds; under
``teraio.torch.offload(capacity=0.25)`` the same job trains, with the plain
run's losses and final parameters, bit for bit, and a peak under the limit.

Making a cgroup needs root (or a delegated cgroup); where it cannot be
made the test skips and says why (conftest admits that reason only when
not root).
"""
import json
import os
import pathlib
import signal
import subprocess
import sys

import pytest

from teraio.demo import limit

JOB = pathlib.Path(__file__).with_name("cgroup_job.py")
LIMIT_SHARE = 0.6
OVERHEAD_BYTES = 32 << 20  # docs/runtime.md, "The profiled steps keep the capacity"
COMPILED_PROGRAM_BYTES = 256 << 20  # docs/compile.md: what the compiled program holds (measured 163-175 MiB)


class MemoryCgroup(limit.MemoryCgroup):
    """teraio.demo.limit's cgroup, running cgroup_job.py inside it."""

    def run(self, args, timeout=900, ranks=0) -> subprocess.CompletedProcess:
        """cgroup_job.py with `args`; with `ranks`, under torchrun (the launcher
        and every rank inside the cgroup)."""
        env = {**os.environ, "OMP_NUM_THREADS": "1"}
        launch = ([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", str(ranks)]
                  if ranks else [sys.executable])
        return subprocess.run([*launch, str(JOB), *args], preexec_fn=self.join, capture_output=True,
                              text=True, timeout=timeout, env=env)


@pytest.fixture
def cgroup():
    try:
        cg = MemoryCgroup("teraio-test")
    except OSError as e:
        pytest.skip(f"cgroups cannot be made here: {e}")
    yield cg
    cg.remove()


def _job(cg, tmp_path, name, *args, ranks=0):
    out = tmp_path / f"{name}.json"
    cg.reset_peak()
    r = cg.run([str(out), *args], ranks=ranks)
    peak = cg.peak_bytes()
    if ranks:
        outs = [tmp_path / f"{name}.rank{i}.json" for i in range(ranks)]
        result = [json.loads(o.read_text()) for o in outs] if all(o.exists() for o in outs) else None
    else:
        result = json.loads(out.read_text()) if out.exists() else None
    return r, result, peak


@pytest.mark.parametrize("kind", ["activations", "globals", "compiled"])
def test_a_job_that_does_not_fit_trains_under_teraio(cgroup, tmp_path, kind):
    """activations: GPT-2 (6 layers, width 256, batch 8 x 256) at 0.6 of its
    peak; globals: GPT-2 (8 layers, width 1024, batch 4 x 64), whose
    parameters, gradients and AdamW states are most of its peak, at 0.5;
    compiled: the activations case compiled (plain: ``model.compile``;
    teraio: ``offload(compile=True)``), at 0.6 of the compiled plain run's
    peak.  The profiled steps keep the capacity through the pager (compiled:
    Inductor's code paged statement by statement, compile.paging), the
    planned ones through the plan."""
    extra = {"activations": [], "globals": ["--globals"], "compiled": ["--compile", "--batch", "16"]}[kind]
    share = 0.5 if kind == "globals" else LIMIT_SHARE
    ssd = tmp_path / "ssd"
    ssd.mkdir()
    cgroup.set_limit(None)
    r, plain, plain_peak = _job(cgroup, tmp_path, "plain", "plain", *extra)
    assert r.returncode == 0, r.stderr[-3000:]
    limit = int(share * plain_peak)
    cgroup.set_limit(limit)
    # the limit binds: the plain job is killed in it
    r, _, _ = _job(cgroup, tmp_path, "plain_limited", "plain", *extra)
    assert r.returncode == -signal.SIGKILL, (r.returncode, r.stderr[-2000:])
    r, got, peak = _job(cgroup, tmp_path, "teraio", "teraio", "--capacity", "0.25", "--ssd", str(ssd), *extra)
    assert r.returncode == 0, (r.returncode, plain_peak, limit, peak, r.stderr[-3000:])
    assert got["losses"] == plain["losses"]                      # bit for bit
    assert got["params_sha256"] == plain["params_sha256"]
    assert peak < limit, (peak, limit, plain_peak)
    rep = got["report"]
    assert rep["profiled_iterations"] == 2 and rep["planned_iterations"] == 3
    assert rep["over_capacity_kernels"] == 0
    assert rep["profiling"]["evictions"] > 0
    # the offloaded steps' RSS (sampled at each kernel): at most the RSS before the first step plus
    # the capacity plus the stated overhead (docs/runtime.md); compiled, plus what the process
    # holds once compiled beyond its tensors (Dynamo's, AOTAutograd's and Inductor's graphs and
    # kernels, teraio's variants of them, the engine made in the first step), measured after it
    program = 0
    if kind == "compiled":
        program = got["rss_after_first_bytes"] - got["tensor_bytes_after_first"] - got["rss_before_bytes"]
        assert 0 < program < COMPILED_PROGRAM_BYTES, program
    assert rep["peak_process_rss_bytes"] <= got["rss_before_bytes"] + program + rep["capacity_bytes"] + OVERHEAD_BYTES
    print(f"{kind}: plain peak {plain_peak / 2**20:.0f} MiB, limit {limit / 2**20:.0f} MiB, "
          f"teraio peak {peak / 2**20:.0f} MiB, capacity {rep['capacity_bytes'] / 2**20:.0f} MiB, "
          f"compiled program {program / 2**20:.0f} MiB, offloaded steps' RSS "
          f"{rep['peak_process_rss_bytes'] / 2**20:.0f} MiB over {got['rss_before_bytes'] / 2**20:.0f} before")


def test_a_ddp_job_that_does_not_fit_trains_under_teraio(cgroup, tmp_path):
    """Two torchrun ranks (DDP, gloo), each the GPT-2 of the activations case on
    batches of its own, in one cgroup at 0.6 of the plain job's peak (the
    launcher's and both ranks' memory).  The plain job is killed there; under
    teraio (capacity 0.25 of each rank's peak, three profiled steps) every
    rank's profiled steps keep the capacity through the pager, whose
    collectives' buffers stay put while gloo's threads read them, and every
    rank's losses and final parameters are the plain run's, bit for bit."""
    ssd = tmp_path / "ssd"
    ssd.mkdir()
    cgroup.set_limit(None)
    r, plain, plain_peak = _job(cgroup, tmp_path, "plain", "plain", "--ddp", ranks=2)
    assert r.returncode == 0, r.stderr[-3000:]
    limit = int(LIMIT_SHARE * plain_peak)
    cgroup.set_limit(limit)
    r, _, _ = _job(cgroup, tmp_path, "plain_limited", "plain", "--ddp", ranks=2)
    assert r.returncode != 0 and "Signal 9 (SIGKILL)" in r.stderr, (r.returncode, r.stderr[-2000:])
    r, got, peak = _job(cgroup, tmp_path, "teraio", "teraio", "--ddp", "--capacity", "0.25", "--ssd", str(ssd),
                        ranks=2)
    assert r.returncode == 0, (r.returncode, r.stderr[-3000:])
    assert peak < limit, (peak, limit, plain_peak)
    for rank in (0, 1):
        assert got[rank]["losses"] == plain[rank]["losses"], rank          # bit for bit
        assert got[rank]["params_sha256"] == plain[rank]["params_sha256"], rank
        rep = got[rank]["report"]
        assert rep["profiled_iterations"] == 3 and rep["planned_iterations"] == 2, rank
        assert rep["over_capacity_kernels"] == 0, rank
        assert rep["profiling"]["evictions"] > 0, rank
        assert rep["peak_process_rss_bytes"] <= got[rank]["rss_before_bytes"] + rep["capacity_bytes"] + OVERHEAD_BYTES
    assert plain[0]["losses"] != plain[1]["losses"]           # the ranks trained on batches of their own
    print(f"ddp: plain peak {plain_peak / 2**20:.0f} MiB, limit {limit / 2**20:.0f} MiB, "
          f"teraio peak {peak / 2**20:.0f} MiB")
