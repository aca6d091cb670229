"""The ctypes mirrors in teraio._lib match the C headers field by field.

A C program built here from include/teraio/*.h prints sizeof and offsetof of
every struct the adapter mirrors; a header change that the Python side missed
fails this test instead of corrupting memory at run time."""
import ctypes
import shutil
import subprocess
from pathlib import Path

import pytest

from teraio import _lib as L

ROOT = Path(__file__).resolve().parents[2]

MIRRORS = {
    "tio_trace_tensor": (L.TraceTensor, {"global_": "global"}),
    "tio_trace_kernel": (L.TraceKernel, {}),
    "tio_trace_access": (L.TraceAccess, {}),
    "tio_trace": (L.Trace, {}),
    "tio_lifetime": (L.Lifetime, {}),
    "tio_plan_options": (L.PlanOptions, {}),
    "tio_migration": (L.Migration, {}),
    "tio_plan": (L.Plan, {}),
    "tio_hw": (L.Hw, {}),
    "tio_sim_calibration": (L.SimCalibration, {}),
    "tio_sim_fit": (L.SimFit, {}),
    "tio_engine_options": (L.EngineOptions, {}),
    "tio_extent": (L.Extent, {}),
    "tio_runtime_callbacks": (L.RuntimeCallbacks, {}),
    "tio_runtime_stats": (L.RuntimeStats, {}),
}


@pytest.mark.skipif(shutil.which("cc") is None, reason="needs a C compiler")
def test_ctypes_layouts_match_the_headers(tmp_path):
    lines = ['#include <stddef.h>', '#include <stdio.h>', '#include "teraio/teraio.h"', "int main(void) {"]
    for cname, (cls, rename) in MIRRORS.items():
        lines.append(f'printf("{cname} size %zu\\n", sizeof({cname}));')
        for pyname, _ in cls._fields_:
            field = rename.get(pyname, pyname)
            lines.append(f'printf("{cname}.{pyname} %zu\\n", offsetof({cname}, {field}));')
    lines.append("return 0; }")
    src = tmp_path / "abi.c"
    src.write_text("\n".join(lines))
    exe = tmp_path / "abi"
    subprocess.run(["cc", "-std=gnu17", "-I", str(ROOT / "include"), str(src), "-o", str(exe)], check=True)
    out = subprocess.run([str(exe)], capture_output=True, text=True, check=True).stdout.split("\n")
    c = dict(line.rsplit(" ", 1) for line in out if line)
    for cname, (cls, _) in MIRRORS.items():
        assert int(c[f"{cname} size"]) == ctypes.sizeof(cls), f"{cname}: size differs"
        for pyname, _ in cls._fields_:
            assert int(c[f"{cname}.{pyname}"]) == getattr(cls, pyname).offset, f"{cname}.{pyname}"
