"""A memory limit for a run: a fresh memory cgroup (v1 or v2) below this
process's own, the CPU's stand-in for a GPU's memory (over the limit the
kernel kills the process, as a GPU raises out-of-memory).

Making one needs root or a delegated cgroup; :class:`MemoryCgroup` raises
OSError saying why where it cannot.  A process joins it by writing its pid
to ``cgroup.procs`` (:meth:`MemoryCgroup.join`, first thing in a child);
memory it touched before joining stays charged where it was.  The peak is
the cgroup's own count (v1 ``memory.max_usage_in_bytes``, v2
``memory.peak``): anonymous memory and the page cache the run brings in.
Used by the demo and by tests/python/test_cgroup.py.
"""
from __future__ import annotations

import os
import pathlib
import uuid


def _own_path(controller: str) -> str:
    """This process's cgroup path for `controller` ("" for v2's)."""
    for line in pathlib.Path("/proc/self/cgroup").read_text().splitlines():
        _, ctrls, path = line.split(":", 2)
        if (controller and controller in ctrls.split(",")) or (not controller and ctrls == ""):
            return path
    return "/"


class MemoryCgroup:
    """A fresh memory cgroup; :meth:`remove` it when done."""

    def __init__(self, prefix: str = "teraio"):
        name = f"{prefix}-{os.getpid()}-{uuid.uuid4().hex[:8]}"
        v1 = pathlib.Path("/sys/fs/cgroup/memory")
        if (v1 / "memory.limit_in_bytes").exists():
            self.path, self.v2 = v1 / _own_path("memory").lstrip("/") / name, False
            self.path.mkdir()
            return
        for root in (pathlib.Path("/sys/fs/cgroup"), pathlib.Path("/sys/fs/cgroup/unified")):
            ctrl = root / "cgroup.controllers"
            if ctrl.exists() and "memory" in ctrl.read_text().split():
                base = root / _own_path("").lstrip("/")
                self.path, self.v2 = base / name, True
                self.path.mkdir()
                if not (self.path / "memory.max").exists():
                    self.path.rmdir()
                    raise OSError(f"the memory controller is not enabled below {base}")
                return
        raise OSError("no memory cgroup controller is mounted")

    @property
    def version(self) -> int:
        return 2 if self.v2 else 1

    def set_limit(self, nbytes: int | None) -> None:
        """Limit the cgroup to `nbytes` (None: no limit), swap included."""
        if self.v2:
            (self.path / "memory.max").write_text("max" if nbytes is None else str(nbytes))
            swap = self.path / "memory.swap.max"
            if swap.exists():
                swap.write_text("0")
        else:
            sw = self.path / "memory.memsw.limit_in_bytes"
            if nbytes is None:
                if sw.exists():
                    sw.write_text("-1")
                (self.path / "memory.limit_in_bytes").write_text("-1")
            else:
                (self.path / "memory.limit_in_bytes").write_text(str(nbytes))
                if sw.exists():
                    sw.write_text(str(nbytes))

    def reset_peak(self) -> None:
        f = self.path / ("memory.peak" if self.v2 else "memory.max_usage_in_bytes")
        try:
            f.write_text("0")
        except OSError:
            pass  # v2 before Linux 6.12: the peak cannot be reset (a fresh cgroup per run then)

    def peak_bytes(self) -> int:
        f = self.path / ("memory.peak" if self.v2 else "memory.max_usage_in_bytes")
        return int(f.read_text().split()[0])

    def join(self, pid: int | None = None) -> None:
        (self.path / "cgroup.procs").write_text(str(pid or os.getpid()))

    def remove(self) -> None:
        try:
            self.path.rmdir()
        except OSError:
            pass


def usage_bytes() -> int | None:
    """The memory this process's own cgroup counts now (None: unreadable)."""
    for path in (pathlib.Path("/sys/fs/cgroup/memory") / _own_path("memory").lstrip("/") / "memory.usage_in_bytes",
                 pathlib.Path("/sys/fs/cgroup") / _own_path("").lstrip("/") / "memory.current"):
        try:
            return int(path.read_text().split()[0])
        except (OSError, ValueError):
            continue
    return None
