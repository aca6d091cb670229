"""The GPU path from Python: teraio.gpu, the engine on CUDA memory, offloading CUDA models.

Without a GPU (this machine): the state and reason teraio reports, ``teraio
version``'s cuda/cufile lines, and the bindings driven end to end against the
stand-in libcudart and libcufile the C tests build (a child process, since
the libraries are looked up once per process).  With a CUDA device
(scripts/device-check): real device tensors through the staging ring and
through cuFile, a tiny model trained on CUDA with offloading, its losses
identical to training without, its resident peak within the capacity, and
two ranks under torchrun with their own plans and directories.  Those skip
here with a reason starting "needs a CUDA device".
"""
import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch

from teraio import _lib as L
from teraio import gpu
from teraio.core import Engine

ROOT = Path(__file__).resolve().parents[2]
BUILD = Path(L._find_library()).resolve().parents[1]  # build/, or the one TERAIO_LIBRARY names
STANDIN = BUILD / "test-lib"
HAS_CUDA = torch.cuda.is_available() and gpu.unavailable_reason() is None
needs_cuda = pytest.mark.skipif(not HAS_CUDA, reason="needs a CUDA device: " + (
    "torch.cuda.is_available() is False" if not torch.cuda.is_available() else str(gpu.unavailable_reason())))


# ---- without a GPU --------------------------------------------------------------

def test_cuda_state_and_reason_here():
    info = gpu.cuda_info()
    if HAS_CUDA:
        assert info["state"] == "available" and info["devices"] == torch.cuda.device_count()
        assert info["reason"] == ""
    else:
        assert info["state"] in ("unavailable", "not built")
        assert info["reason"]  # it says why
        assert info["devices"] == 0
        assert gpu.unavailable_reason() == f"CUDA {info['state']}: {info['reason']}"


def test_attach_is_refused_with_the_reason_or_works(tmp_path):
    info = gpu.cuda_info()
    with Engine([str(tmp_path)], 8 << 20) as engine:
        if HAS_CUDA:
            gpu.attach(engine, path="staging", pinned_bytes=4 << 20)
            assert gpu.dir_paths(engine, 1) == ["staging"]
            return
        with pytest.raises(L.TeraioError) as e:
            gpu.attach(engine)
        assert e.value.code == (-95 if info["state"] == "not built" else -19)  # EOPNOTSUPP / ENODEV
        assert info["reason"] in str(e.value)
        assert gpu.reason(engine) == ""
        assert gpu.dir_paths(engine, 1) == ["auto"]
        with pytest.raises(L.TeraioError, match="no GPU attached"):
            gpu.set_stream(engine, None)
        with pytest.raises(ValueError, match="path must be one of auto, staging, cufile"):
            gpu.attach(engine, path="gds")


def test_version_lists_cuda_and_cufile():
    out = subprocess.run([str(BUILD / "bin" / "teraio"), "version"], capture_output=True,
                         text=True, check=True).stdout.splitlines()
    cuda = [line for line in out if line.startswith("cuda: ")]
    cufile = [line for line in out if line.startswith("cufile: ")]
    assert len(cuda) == 1 and len(cufile) == 1
    info = gpu.cuda_info()
    assert cuda[0].startswith(f"cuda: {info['state']} (")
    if info["state"] != "available":
        assert cuda[0] == f"cuda: {info['state']} ({info['reason']})"
    assert cufile[0].split(" (")[0] in ("cufile: available", "cufile: unavailable", "cufile: not built")


STANDIN_SCRIPT = textwrap.dedent("""
    import ctypes, json, sys
    from teraio import _lib as L, gpu
    from teraio.core import Engine
    rt = ctypes.CDLL(sys.argv[2])
    out = {"cuda": gpu.cuda_info()["state"], "cufile_info": gpu.cufile_info(), "runs": {}}
    n = 3 * (1 << 20) + 77
    host = (ctypes.c_ubyte * n).from_buffer_copy(bytes((i * 7 + 3) % 251 for i in range(n)))
    src, dst = ctypes.c_void_p(), ctypes.c_void_p()
    assert rt.cudaMalloc(ctypes.byref(src), ctypes.c_size_t(n)) == 0
    assert rt.cudaMalloc(ctypes.byref(dst), ctypes.c_size_t(n)) == 0
    assert rt.cudaMemcpy(src, host, ctypes.c_size_t(n), 1) == 0
    for path in ("staging", "cufile"):
        back = (ctypes.c_ubyte * n)()
        assert rt.cudaMemcpy(dst, back, ctypes.c_size_t(n), 1) == 0  # zeros
        with Engine([sys.argv[1]], 16 << 20) as e:
            gpu.attach(e, pinned_bytes=2 << 20, path=path)
            gpu.set_stream(e, None)
            ext = L.Extent()
            L.check(L.tio_engine_alloc(e._handle(), n, ctypes.byref(ext)))
            L.check(L.tio_engine_write(e._handle(), ctypes.byref(ext), src, n))
            L.check(L.tio_engine_read(e._handle(), ctypes.byref(ext), dst, n))
            assert rt.cudaMemcpy(back, dst, ctypes.c_size_t(n), 2) == 0
            out["runs"][path] = {"same": bytes(back) == bytes(host), "stats": gpu.stats(e),
                                 "reason": gpu.reason(e), "paths": gpu.dir_paths(e, 1)}
    print(json.dumps(out))
""")


def test_bindings_drive_the_standins(tmp_path):
    """Engine + teraio.gpu from Python over the stand-ins: both paths move
    the bytes, and the counters and reasons come back through ctypes."""
    cudart, cufile = STANDIN / "libtio_standin_cudart.so", STANDIN / "libtio_standin_cufile.so"
    assert cudart.exists() and cufile.exists(), "make build builds the stand-ins"
    env = dict(os.environ, TIO_CUDART_LIBRARY=str(cudart), TIO_CUFILE_LIBRARY=str(cufile))
    r = subprocess.run([sys.executable, "-c", STANDIN_SCRIPT, str(tmp_path), str(cudart)], env=env,
                       capture_output=True, text=True)
    if gpu.cuda_info()["state"] == "not built":
        assert r.returncode != 0 and "built without CUDA" in r.stderr
        return
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    n = 3 * (1 << 20) + 77
    assert out["cuda"] == "available"
    info = out["cufile_info"]
    assert info["state"] == "available" and info["batch"] and not info["compat_mode"]
    assert info["version"] == 1150 and info["library"] == str(cufile)
    staging, cuf = out["runs"]["staging"], out["runs"]["cufile"]
    assert staging["same"] and staging["paths"] == ["staging"]
    assert staging["stats"]["staged_offload_bytes"] == n == staging["stats"]["staged_prefetch_bytes"]
    assert staging["stats"]["copies"] == 8  # 4 chunks of at most 1 MiB, each way
    assert staging["reason"].startswith("staging ring: 2 slot(s) of 1.00 MiB (1 offload, 1 prefetch)")
    assert cuf["same"] and cuf["paths"] == ["cufile"]
    assert cuf["stats"]["cufile_write_bytes"] == n == cuf["stats"]["cufile_read_bytes"]
    assert cuf["stats"]["unchecked_bytes"] == 2 * n and cuf["stats"]["batches"] >= 2
    assert "cufile for every directory (requested)" in cuf["reason"]


# ---- with a CUDA device ---------------------------------------------------------

def _cuda_job(seed=0, iterations=6):
    from conftest import TINY
    from teraio.models.llama import Llama
    torch.manual_seed(seed)
    model = Llama(TINY).cuda()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3, foreach=False)
    g = torch.Generator().manual_seed(seed + 1)
    batches = [torch.randint(0, 256, (4, TINY.max_seq_len + 1), generator=g).cuda() for _ in range(iterations)]

    def step(i):
        opt.zero_grad(set_to_none=False)
        loss = model(batches[i][:, :-1], batches[i][:, 1:])
        loss.backward()
        opt.step()
        return loss
    return model, opt, step, iterations


@needs_cuda
@pytest.mark.parametrize("path", ["staging", "cufile"])
def test_cuda_tensors_round_trip(tmp_path, path):
    if path == "cufile" and gpu.cufile_info()["state"] != "available":
        pytest.skip(f"needs a GPU with cuFile: {gpu.cufile_info()['reason']}")
    n = (5 << 20) + 123
    src = torch.randint(0, 256, (n,), dtype=torch.uint8, device="cuda")
    dst = torch.zeros_like(src)
    with Engine([str(tmp_path)], 32 << 20) as e:
        gpu.attach(e, pinned_bytes=8 << 20, path=path)
        gpu.set_stream(e, torch.cuda.current_stream().cuda_stream)
        ext = L.Extent()
        L.check(L.tio_engine_alloc(e._handle(), n, ext))
        L.check(L.tio_engine_write(e._handle(), ext, src.data_ptr(), n))
        L.check(L.tio_engine_read(e._handle(), ext, dst.data_ptr(), n))
        assert torch.equal(src, dst)
        s = gpu.stats(e)
        key = "staged_prefetch_bytes" if path == "staging" else "cufile_read_bytes"
        assert s[key] == n


@needs_cuda
@pytest.mark.parametrize("fraction", [0.5, 0.25])
def test_cuda_model_offloaded_identical_losses(tmp_path, fraction):
    from teraio.core import Lifetime, Plan
    from teraio.torch import OffloadRuntime, Profiler
    torch.use_deterministic_algorithms(True)
    os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
    model, opt, step, iters = _cuda_job()
    ref = [step(i).item() for i in range(iters)]
    model, opt, step, iters = _cuda_job()
    prof = Profiler(model, opt)
    losses = []
    for i in range(2):
        with prof.iteration():
            losses.append(step(i).item())
    trace = prof.trace()
    lt = Lifetime(trace)
    cap = int(lt.peak_bytes * fraction)
    plan = Plan.build(trace, lt, cap, ssd_read_gbps=2.0, ssd_write_gbps=2.0)
    with Engine([str(tmp_path)], 2 * lt.peak_bytes + (64 << 20)) as engine:
        rt = OffloadRuntime(model, opt, trace, plan, engine)
        assert not rt.staging  # the engine moves CUDA memory itself
        for i in range(2, iters):
            with rt.iteration():
                losses.append(step(i).item())
        stats = rt.stats()
        g = gpu.stats(engine)
        rt.close()
    assert losses == ref
    assert stats["bytes_offloaded"] > 0 and stats["bytes_prefetched"] > 0
    assert g["staged_offload_bytes"] + g["cufile_write_bytes"] > 0
    if plan.fits:
        assert stats["peak_resident_bytes"] <= cap


TORCHRUN_WORKER = textwrap.dedent("""
    import json, os, sys, torch
    sys.path.insert(0, sys.argv[2])
    from teraio import gpu
    from teraio.core import Engine, Lifetime, Plan
    from teraio.torch import OffloadRuntime, Profiler
    import test_gpu
    rank = int(os.environ["RANK"])
    torch.cuda.set_device(int(os.environ["LOCAL_RANK"]) % torch.cuda.device_count())
    model, opt, step, iters = test_gpu._cuda_job(seed=rank)
    prof = Profiler(model, opt)
    for i in range(2):
        with prof.iteration():
            step(i)
    trace = prof.trace()
    lt = Lifetime(trace)
    plan = Plan.build(trace, lt, lt.peak_bytes // 2, ssd_read_gbps=2.0, ssd_write_gbps=2.0)
    d = os.path.join(sys.argv[1], f"rank{rank}")
    os.makedirs(d)
    with Engine([d], 2 * lt.peak_bytes + (64 << 20)) as engine:
        rt = OffloadRuntime(model, opt, trace, plan, engine)
        for i in range(2, iters):
            with rt.iteration():
                step(i)
        files = os.listdir(d)
        out = {"rank": rank, "device": torch.cuda.current_device(), "files": files,
               "offloaded": rt.stats()["bytes_offloaded"], "staged": gpu.stats(engine)["staged_offload_bytes"]}
        rt.close()
    with open(os.path.join(sys.argv[1], f"rank{rank}.json"), "w") as f:
        json.dump(out, f)
""")


@needs_cuda
def test_cuda_two_ranks_under_torchrun(tmp_path):
    """One process per GPU (both on GPU 0 when there is one): each rank has
    its own plan, engine and backing file, and offloads through its own ring."""
    worker = tmp_path / "worker.py"
    worker.write_text(TORCHRUN_WORKER)
    r = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2", "--standalone",
                        str(worker), str(tmp_path), str(Path(__file__).parent)], capture_output=True, text=True,
                       timeout=300)
    assert r.returncode == 0, r.stdout + r.stderr
    outs = [json.loads((tmp_path / f"rank{i}.json").read_text()) for i in range(2)]
    for o in outs:
        assert o["offloaded"] > 0 and o["staged"] > 0
        assert len(o["files"]) == 1 and o["files"][0].startswith("teraio.")
    assert outs[0]["files"] != outs[1]["files"]
    if torch.cuda.device_count() > 1:
        assert {o["device"] for o in outs} == {0, 1}
