"""The ctypes mirrors in teraio.data match include/teraio/data.h field by field (the
same check as test_abi.py, for the data loader's structs): a C program built from the
header prints sizeof and offsetof of each mirrored struct."""
import ctypes
import shutil
import subprocess
from pathlib import Path

import pytest

from teraio import data as D

ROOT = Path(__file__).resolve().parents[2]

MIRRORS = {
    "tio_data_tokenizer": D._Tokenizer,
    "tio_dataset_options": D._DatasetOptions,
    "tio_loader_options": D._LoaderOptions,
    "tio_data_span": D._Span,
    "tio_data_sample": D._Sample,
    "tio_data_subdataset_info": D._SubInfo,
    "tio_data_position": D._Position,
}


@pytest.mark.skipif(shutil.which("cc") is None, reason="needs a C compiler")
def test_data_ctypes_layouts_match_the_header(tmp_path):
    lines = ['#include <stddef.h>', '#include <stdio.h>', '#include "teraio/data.h"', "int main(void) {"]
    for cname, cls in MIRRORS.items():
        lines.append(f'printf("{cname} size %zu\\n", sizeof({cname}));')
        for name, _ in cls._fields_:
            lines.append(f'printf("{cname}.{name} %zu\\n", offsetof({cname}, {name}));')
    lines.append("return 0; }")
    src = tmp_path / "abi.c"
    src.write_text("\n".join(lines))
    exe = tmp_path / "abi"
    subprocess.run(["cc", "-std=gnu17", "-I", str(ROOT / "include"), str(src), "-o", str(exe)], check=True)
    out = subprocess.run([str(exe)], capture_output=True, text=True, check=True).stdout.split("\n")
    c = dict(line.rsplit(" ", 1) for line in out if line)
    for cname, cls in MIRRORS.items():
        assert int(c[f"{cname} size"]) == ctypes.sizeof(cls), f"{cname}: size differs"
        for name, _ in cls._fields_:
            assert int(c[f"{cname}.{name}"]) == getattr(cls, name).offset, f"{cname}.{name}"
