"""teraio.core.Engine: its options, its life cycle, and what a damaged
backing file does to a live run (issue 12, items 2, 6, 8)."""
import glob
import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest

from teraio import _lib as L
from teraio._lib import TeraioError
from teraio.core import Engine

from conftest import TinyJob
from test_offload import profiled_runtime


def backing_file(ssd_dir):
    files = glob.glob(os.path.join(ssd_dir, "teraio.*.data"))
    assert len(files) == 1, files
    return files[0]


def test_engine_methods_after_close_raise(ssd_dir):
    """Issue 12, item 8: Engine.backend after close() segfaulted."""
    engine = Engine([ssd_dir], space_bytes=1 << 20)
    assert engine.backend in ("io_uring", "psync")
    assert engine.crc is True
    engine.close()
    engine.close()  # idempotent
    for use in (lambda: engine.backend, lambda: engine.backend_reason, lambda: engine.measure_gbps(4096),
                lambda: engine.__enter__()):
        with pytest.raises(ValueError, match="Engine is closed"):
            use()
    assert glob.glob(os.path.join(ssd_dir, "teraio.*")) == []


def test_engine_options_are_checked(ssd_dir):
    with Engine([ssd_dir], space_bytes=1 << 20, crc=False) as e:
        assert e.crc is False
        read, write = e.measure_gbps(1 << 20)
        assert read > 0 and write > 0
    with Engine([ssd_dir], space_bytes=1 << 20) as e:
        # one 16 MiB chunk at most in memory; a chunk of 1 byte was 65,536 rounds for 64 KiB (a
        # breaker's "hang"), one the engine has no room for allocated its buffer first (1 GiB)
        with pytest.raises(ValueError, match=r"chunk_bytes must be an integer in \[4096, "):
            e.measure_gbps(1 << 20, chunk_bytes=1)
        with pytest.raises(ValueError, match="nbytes must be an integer in"):
            e.measure_gbps(1 << 63)
        with pytest.raises(TeraioError, match="no free extent"):
            e.measure_gbps(1 << 40, chunk_bytes=1 << 40)
        read, write = e.measure_gbps(3 << 18, chunk_bytes=1 << 18)  # three rounds through one chunk
        assert read > 0 and write > 0
    with pytest.raises(ValueError, match="crc must be True or False"):
        Engine([ssd_dir], space_bytes=1 << 20, crc="yes")
    with pytest.raises(ValueError, match="backend must be one of auto, io_uring, psync"):
        Engine([ssd_dir], space_bytes=1 << 20, backend="spdk")
    with pytest.raises(TeraioError, match="does not exist"):
        Engine([os.path.join(ssd_dir, "missing")], space_bytes=1 << 20)


def test_engine_closed_while_runtime_bound(ssd_dir):
    """Issue 12, item 6: Engine.close() while an OffloadRuntime still used it,
    then rt.iteration(), was a heap use-after-free that lost the offloaded
    bytes.  The runtime keeps the engine alive; training goes on with
    identical losses, and the backing file goes with the runtime."""
    ref = TinyJob()
    ref_losses = [ref.step(i).item() for i in range(len(ref.batches))]
    job = TinyJob()
    rt, _plan, _lt, losses, engine = profiled_runtime(job, ssd_dir)
    with rt.iteration():
        losses.append(job.step(2).item())
    engine.close()
    with pytest.raises(ValueError, match="Engine is closed"):
        engine.backend
    assert os.path.exists(backing_file(ssd_dir))
    for i in range(3, len(job.batches)):
        with rt.iteration():
            losses.append(job.step(i).item())
    stats = rt.stats()
    rt.close()
    assert losses == ref_losses
    assert stats["bytes_prefetched"] > 0
    assert glob.glob(os.path.join(ssd_dir, "teraio.*")) == []


@pytest.mark.parametrize("damage", ["zeros", "truncate"])
def test_backing_file_damaged_during_live_run(ssd_dir, damage):
    """Issue 12, item 2: a backing file truncated to 0 or overwritten with
    zeros while a run was live gave different losses and no error.  With the
    engine's default CRC32C, the next read of a damaged tensor raises an
    error naming the tensor and the file."""
    job = TinyJob()
    rt, _plan, _lt, _losses, engine = profiled_runtime(job, ssd_dir)
    with rt.iteration():
        job.step(2)
    assert rt._released, "the plan keeps some tensor on SSD across the iteration boundary"
    path = backing_file(ssd_dir)
    size = os.path.getsize(path)
    with open(path, "r+b") as f:
        if damage == "zeros":
            f.write(bytes(size))
        else:
            f.truncate(0)
    with pytest.raises(TeraioError) as err:
        for i in range(3, len(job.batches)):
            with rt.iteration():
                job.step(i)
    msg = str(err.value)
    assert "tensor " in msg and path in msg
    if damage == "zeros":
        assert "CRC32C mismatch" in msg
    rt._guard_off()  # the guard between iterations off the mode stack (a later compile would run eagerly)
    L.tio_runtime_destroy(rt._p)  # its tensors are lost: no fetch_all
    rt._p = None
    engine.close()
    assert glob.glob(os.path.join(ssd_dir, "teraio.*")) == []


@pytest.mark.skipif(shutil.which("fio") is None, reason="needs fio (scripts/deps installs it)")
def test_bench_io_reports_fio_default_and_best(tmp_path):
    """Issue 17: `teraio bench io --json` reports fio_default and fio_best for
    every pass, says how fio_best got its memory, and leaves no file behind."""
    teraio = Path(__file__).resolve().parents[2] / "build" / "bin" / "teraio"
    before = Path("/proc/sys/vm/nr_hugepages").read_text()
    out = subprocess.run([str(teraio), "bench", "io", "--dir", str(tmp_path), "--size", "8MiB", "--runs", "1",
                          "--rand-size", "1MiB", "--json"], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    j = json.loads(out.stdout)
    names = [p["name"] for p in j["passes"]]
    assert names == ["write_1024k", "read_1024k", "randread_4k", "randread_32k", "randread_128k",
                     "stripe2_write", "stripe2_read", "stripe4_write", "stripe4_read"]
    for p in j["passes"]:
        for side in ("engine", "fio_default", "fio_best"):
            assert p[side]["gbps"] > 0 and p[side]["cpu_s_per_gib"] >= 0
        assert p["ratio"] == pytest.approx(p["engine"]["gbps"] / p["fio_best"]["gbps"], rel=1e-2)
        assert ("engine_crc" in p) == p["name"].endswith("1024k")
    assert j["fio_best_memory"] and j["fio_best_iomem"]
    assert Path("/proc/sys/vm/nr_hugepages").read_text() == before
    assert "target" not in out.stdout
    assert list(tmp_path.iterdir()) == []
