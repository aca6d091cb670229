"""teraio._lib, the one bindings module, matches the C headers.

Structs: a C program built here from include/teraio/*.h prints sizeof and
offsetof of every struct _lib mirrors (every ctypes Structure there names its C
type in ``_c_name``), so a header change that the Python side missed fails
this test instead of corrupting memory at run time.

Functions: every ``tio_*`` function _lib declares is declared in a header
with the same number of arguments, and the same scalar type for each scalar
argument and return value (pointers only need to be pointers on both sides)."""
import ctypes
import re
import subprocess
from pathlib import Path

from teraio import _lib as L

ROOT = Path(__file__).resolve().parents[2]


def _mirrors():
    out = {}
    for value in vars(L).values():
        if isinstance(value, type) and issubclass(value, ctypes.Structure) and value is not ctypes.Structure:
            assert hasattr(value, "_c_name"), f"{value.__name__} has no _c_name"
            out[value._c_name] = value
    return out


def test_every_struct_mirror_matches_its_header(tmp_path):
    mirrors = _mirrors()
    assert {"tio_trace", "tio_plan", "tio_runtime_stats", "tio_loader_options", "tio_tok_special"} <= set(mirrors)
    lines = ['#include <stddef.h>', '#include <stdio.h>', '#include "teraio/teraio.h"',
             '#include "teraio/data.h"', '#include "teraio/tok.h"', "int main(void) {"]
    for cname, cls in mirrors.items():
        rename = getattr(cls, "_c_fields", {})
        lines.append(f'printf("{cname} size %zu\\n", sizeof({cname}));')
        for pyname, _ in cls._fields_:
            lines.append(f'printf("{cname}.{pyname} %zu\\n", offsetof({cname}, {rename.get(pyname, pyname)}));')
    lines.append("return 0; }")
    src = tmp_path / "abi.c"
    src.write_text("\n".join(lines))
    exe = tmp_path / "abi"
    subprocess.run(["cc", "-std=gnu17", "-I", str(ROOT / "include"), str(src), "-o", str(exe)], check=True)
    out = subprocess.run([str(exe)], capture_output=True, text=True, check=True).stdout.split("\n")
    c = dict(line.rsplit(" ", 1) for line in out if line)
    for cname, cls in mirrors.items():
        assert int(c[f"{cname} size"]) == ctypes.sizeof(cls), f"{cname}: size differs"
        for pyname, _ in cls._fields_:
            assert int(c[f"{cname}.{pyname}"]) == getattr(cls, pyname).offset, f"{cname}.{pyname}"


SCALARS = {"int": ctypes.c_int, "unsigned": ctypes.c_uint, "bool": ctypes.c_bool, "double": ctypes.c_double,
           "size_t": ctypes.c_size_t, "uint8_t": ctypes.c_uint8, "uint32_t": ctypes.c_uint32,
           "uint64_t": ctypes.c_uint64, "int64_t": ctypes.c_int64}


def _declarations():
    """name -> (return type, [argument types]) of every TIO_API function; enum
    typedefs are added to SCALARS as int."""
    decls = {}
    for header in sorted((ROOT / "include" / "teraio").glob("*.h")):
        text = re.sub(r"/\*.*?\*/", "", header.read_text(), flags=re.S)
        for enum in re.findall(r"typedef\s+enum\s*\w*\s*\{[^}]*\}\s*(\w+)\s*;", text):
            SCALARS[enum] = ctypes.c_int
        for ret, name, args in re.findall(r"TIO_API\s+([^;()]*?)\b(tio_\w+)\s*\(([^)]*)\)\s*;", text):
            params = [] if args.strip() in ("", "void") else [a.strip() for a in args.split(",")]
            decls[name] = (" ".join(ret.split()), params)
    return decls


def _c_type(decl):
    """The type part of a parameter declaration ("const char *name" -> "const char *")."""
    if "*" in decl:
        return "pointer"
    words = decl.replace("const ", "").split()
    return words[0] if len(words) == 1 else " ".join(words[:-1])


def _same(c_type, py_type):
    if c_type == "void":
        return py_type is None
    if c_type == "pointer" or c_type not in SCALARS:  # pointers and opaque handles
        return py_type is ctypes.c_void_p or py_type is ctypes.c_char_p or (
            py_type is not None and issubclass(py_type, (ctypes._Pointer, ctypes._CFuncPtr)))
    return py_type is SCALARS[c_type]


def test_every_function_prototype_matches_its_header():
    decls = _declarations()
    bound = {name: f for name, f in vars(L).items() if name.startswith("tio_") and hasattr(f, "argtypes")}
    assert len(bound) > 60
    for name, f in bound.items():
        assert name in decls, f"{name} is not declared in include/teraio"
        ret, params = decls[name]
        assert len(f.argtypes) == len(params), f"{name}: {len(f.argtypes)} arguments, the header has {len(params)}"
        assert _same(_c_type(ret + " r") if "*" not in ret else "pointer", f.restype), f"{name}: return type"
        for i, (decl, py) in enumerate(zip(params, f.argtypes)):
            assert _same(_c_type(decl), py), f"{name}: argument {i} is '{decl}' in C, {py} in Python"
