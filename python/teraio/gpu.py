"""teraio.gpu: CUDA device memory through the engine (include/teraio/gpu.h).

:func:`cuda_info` and :func:`cufile_info` say what this process can use and,
when it cannot, why.  :func:`attach` gives an :class:`teraio.core.Engine` a
GPU: from then on the engine takes CUDA device pointers and moves them through
its pinned staging ring or GPUDirect Storage, ordered after the compute stream
named with :func:`set_stream`.  Everything runs in C; this module only passes
options and reads results.

Library search: libcudart is the one PyTorch loaded, when it has; libcufile is
looked for beside it and in the ``nvidia-cufile`` Python package, whose
``lib/`` folder :func:`attach` passes on through ``TIO_CUFILE_LIBRARY`` when
that variable is not set (before the first GPU call of the process).
"""
from __future__ import annotations

import ctypes
import importlib.util
import os
from pathlib import Path

from . import _lib as L
from ._args import env

DEFAULT_PINNED_BYTES = 256 << 20


def _info_dict(info) -> dict:
    return {name: (v.decode(errors="replace") if isinstance(v := getattr(info, name), bytes) else v)
            for name, _ in info._fields_} | {"state": L.GPU_STATES[info.state]}


def cuda_info() -> dict:
    """The CUDA runtime here: state ("not built", "unavailable", "available"),
    devices, versions, library, reason."""
    info = L.CudaInfo()
    L.tio_cuda_info_get(ctypes.byref(info))
    return _info_dict(info)


def cufile_info() -> dict:
    """cuFile here: state, version, compat_mode, batch, library, reason
    (opens cuFile's driver, which needs a CUDA device)."""
    _point_at_cufile_package()
    info = L.CufileInfo()
    L.tio_cufile_info_get(ctypes.byref(info))
    return _info_dict(info)


def unavailable_reason() -> str | None:
    """None when CUDA is usable from teraio, else why not (for skips and logs)."""
    info = cuda_info()
    return None if info["state"] == "available" else f"CUDA {info['state']}: {info['reason']}"


def _point_at_cufile_package() -> None:
    """TERAIO_CUFILE_LIBRARY from the nvidia-cufile package when it (and the
    old name TIO_CUFILE_LIBRARY) is unset."""
    if env("CUFILE_LIBRARY"):
        return
    for name in ("nvidia.cu13", "nvidia.cufile"):
        try:
            spec = importlib.util.find_spec(name)
        except (ImportError, ValueError):
            continue
        for root in (spec.submodule_search_locations or []) if spec else []:
            lib = Path(root) / "lib" / "libcufile.so.0"
            if lib.exists():
                os.environ["TERAIO_CUFILE_LIBRARY"] = str(lib)
                return


def attach(engine, device: int = -1, pinned_bytes: int = DEFAULT_PINNED_BYTES, chunk_bytes: int = 0,
           path: str = "auto", probe_bytes: int = 0) -> None:
    """Attach CUDA device `device` (-1: the current one; it must be current)
    to `engine`; see tio_engine_gpu_attach for the options and every error
    (raised as TeraioError with the library's message)."""
    if path not in L.GPU_PATHS:
        raise ValueError(f"path must be one of {', '.join(L.GPU_PATHS)}, got {path!r}")
    if path != "staging":
        _point_at_cufile_package()
    opt = L.EngineGpuOptions()
    L.tio_engine_gpu_options_default(ctypes.byref(opt))
    opt.device = int(device)
    opt.pinned_bytes = int(pinned_bytes)
    opt.chunk_bytes = int(chunk_bytes)
    opt.path = L.GPU_PATHS[path]
    opt.probe_bytes = int(probe_bytes)
    L.check(L.tio_engine_gpu_attach(engine._handle(), ctypes.byref(opt)))


def set_stream(engine, stream: int | None) -> None:
    """Order the engine's device requests after work queued on `stream`
    (a cudaStream_t as an integer, e.g. torch.cuda.current_stream().cuda_stream)."""
    L.check(L.tio_engine_gpu_set_stream(engine._handle(), stream or None))


def reason(engine) -> str:
    """Why each directory moves device memory the way it does ("" without a GPU)."""
    return (L.tio_engine_gpu_reason(engine._handle()) or b"").decode(errors="replace")


def dir_paths(engine, n_dirs: int) -> list[str]:
    """The path of each directory: "staging" or "cufile" ("auto": no GPU)."""
    p = engine._handle()
    return [L.tio_gpu_path_name(L.tio_engine_gpu_dir_path(p, i)).decode() for i in range(n_dirs)]


def stats(engine) -> dict:
    """Counters since attach (tio_engine_gpu_stats)."""
    s = L.EngineGpuStats()
    L.tio_engine_gpu_get_stats(engine._handle(), ctypes.byref(s))
    return {name: getattr(s, name) for name, _ in L.EngineGpuStats._fields_}
