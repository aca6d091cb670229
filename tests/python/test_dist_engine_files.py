"""Two torchrun ranks given the same SSD directory never touch each other's bytes.

Each rank opens an engine over one shared directory and writes its own pattern into
the same extents (both engines hand out offsets from 0); after the other rank has
written, each reads its extents back and finds its own bytes.  The backing files are
two, one per process, private (mode 0600, the process id in the name), and gone after
the engines close.

The test runs this file as the torchrun worker (``python -m torch.distributed.run
--nproc-per-node 2 --standalone test_dist_engine_files.py SHARED OUT``)."""
import ctypes
import json
import os
import stat
import subprocess
import sys
from pathlib import Path

EXTENTS, EXTENT_BYTES = 16, 64 << 10


def pattern(rank, i):
    return bytes([(rank * 97 + i * 13 + j) & 0xFF for j in range(256)]) * (EXTENT_BYTES // 256)


def worker(shared, out):
    import torch.distributed as dist

    from teraio import _lib as L
    from teraio.core import Engine

    dist.init_process_group("gloo")
    rank = dist.get_rank()
    backing_path = L.lib.tio_engine_backing_path
    backing_path.restype, backing_path.argtypes = ctypes.c_char_p, [ctypes.c_void_p, ctypes.c_uint32]
    engine = Engine([shared], 4 * EXTENTS * EXTENT_BYTES)
    path = backing_path(engine._p, 0).decode()
    extents = []
    for i in range(EXTENTS):
        ext = L.Extent()
        L.check(L.tio_engine_alloc(engine._p, EXTENT_BYTES, ctypes.byref(ext)))
        extents.append(ext)
    # rank 0 writes, then rank 1 writes the same extents of its own engine
    for turn in (0, 1):
        if turn == rank:
            for i, ext in enumerate(extents):
                buf = ctypes.create_string_buffer(pattern(rank, i), EXTENT_BYTES)
                L.check(L.tio_engine_write(engine._p, ctypes.byref(ext), buf, EXTENT_BYTES))
        dist.barrier()
    mine = 0
    for i, ext in enumerate(extents):
        buf = ctypes.create_string_buffer(EXTENT_BYTES)
        L.check(L.tio_engine_read(engine._p, ctypes.byref(ext), buf, EXTENT_BYTES))
        mine += buf.raw == pattern(rank, i)
    st = os.stat(path)
    Path(out, f"rank{rank}.json").write_text(json.dumps(
        {"pid": os.getpid(), "path": path, "mode": stat.S_IMODE(st.st_mode), "ino": st.st_ino,
         "mine": mine, "offsets": [e.offset for e in extents]}))
    dist.barrier()                   # both files exist while both engines are open
    engine.close()
    dist.destroy_process_group()


def test_two_ranks_same_directory_private_files(tmp_path):
    shared, out = tmp_path / "ssd", tmp_path / "out"
    shared.mkdir()
    out.mkdir()
    env = dict(os.environ, OMP_NUM_THREADS="1", TMPDIR=str(tmp_path))
    r = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2",
                        "--standalone", __file__, str(shared), str(out)], env=env,
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    got = [json.loads((out / f"rank{i}.json").read_text()) for i in (0, 1)]
    assert [g["mine"] for g in got] == [EXTENTS, EXTENTS]       # every extent kept its bytes
    assert got[0]["offsets"] == got[1]["offsets"]                # the same places, in ...
    assert got[0]["path"] != got[1]["path"] and got[0]["ino"] != got[1]["ino"]   # ... two files
    for g in got:
        assert Path(g["path"]).parent == shared
        assert str(g["pid"]) in Path(g["path"]).name
        assert g["mode"] == 0o600
    assert list(shared.iterdir()) == []                          # removed at close


if __name__ == "__main__":
    worker(*sys.argv[1:3])
