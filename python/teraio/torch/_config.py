"""Offloading configured from the environment, for the integrations
(teraio.torch.trainer, teraio.torch.accelerate) that a user turns on
without writing the call:

``TERAIO_CAPACITY``
    a share of the peak (a number with a point, in (0, 1]: ``0.5``) or bytes
    (an integer, or a number with a unit: ``12GiB``, ``512MiB``, ``8GB``),
    as offload()'s float and int.  Default 0.5.
``TERAIO_SSD``
    one or more directories, separated by ``os.pathsep`` (``:``), with
    ``{rank}`` and ``{local_rank}`` as in :func:`teraio.torch.ssd_dirs`.
``TERAIO_COMPILE``
    ``1`` (or ``true``/``yes``/``on``): the compiled path; ``0`` (or
    ``false``/``no``/``off``, the default): eager.
``TERAIO_HOST_CAP_BYTES``
    the capped host tier, bytes as TERAIO_CAPACITY.

An argument given in code wins over its variable.  A variable that does not
parse is a ValueError that names it and its value; nothing is guessed.
"""
from __future__ import annotations

import os
import re

from .._args import env

_UNITS = {"": 1, "b": 1, "kb": 10**3, "mb": 10**6, "gb": 10**9, "tb": 10**12,
          "kib": 1 << 10, "mib": 1 << 20, "gib": 1 << 30, "tib": 1 << 40}
_BYTES = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([a-zA-Z]*)\s*$")
_TRUE, _FALSE = ("1", "true", "yes", "on"), ("0", "false", "no", "off")


def parse_bytes(name: str, text: str) -> int:
    """``text`` as bytes ("123", "12GiB", "1.5GB"); ValueError naming `name`."""
    m = _BYTES.match(text)
    unit = m and _UNITS.get(m.group(2).lower())
    if not m or unit is None or ("." in m.group(1) and unit == 1):
        raise ValueError(f"{name}={text!r} is not bytes (an integer, or a number with a unit: "
                         f"B, KB, MB, GB, TB, KiB, MiB, GiB, TiB)")
    n = int(float(m.group(1)) * unit) if "." in m.group(1) else int(m.group(1)) * unit
    if not 0 < n < 2**64:
        raise ValueError(f"{name}={text!r} must be > 0 bytes and < 2^64")
    return n


def parse_capacity(text: str) -> int | float:
    """TERAIO_CAPACITY: a share of the peak (a number with a point, in (0, 1]),
    else bytes (an integer, or a number with a unit), as offload()'s float and int."""
    if re.fullmatch(r"\s*\d*\.\d+\s*|\s*\d+\.\s*", text):
        share = float(text)
        if not 0 < share <= 1:
            raise ValueError(f"TERAIO_CAPACITY={text!r}: a share of the peak must be in (0, 1]")
        return share
    try:
        return parse_bytes("TERAIO_CAPACITY", text)
    except ValueError:
        raise ValueError(f"TERAIO_CAPACITY={text!r} is neither a share of the peak (a number in (0, 1] "
                         f"such as 0.5) nor bytes (an integer, or a number with a unit such as 12GiB)") from None


def parse_flag(name: str, text: str) -> bool:
    s = text.strip().lower()
    if s in _TRUE:
        return True
    if s in _FALSE:
        return False
    raise ValueError(f"{name}={text!r} is not a switch (1/0, true/false, yes/no, on/off)")


def resolve(capacity=None, ssd=None, compile=None, options: dict | None = None, *, who: str):
    """(capacity, ssd, compile, options) with the environment filling what
    the caller left None.  `who` names the integration in the error when no
    SSD directory is given either way."""
    options = dict(options or {})
    if capacity is None:
        text = env("CAPACITY")
        capacity = parse_capacity(text) if text is not None else 0.5
    if ssd is None:
        text = env("SSD")
        if text is None:
            raise ValueError(f"{who}: no SSD directory: pass ssd=... or set TERAIO_SSD "
                             f"(directories separated by '{os.pathsep}')")
        ssd = [d for d in text.split(os.pathsep) if d]
        if not ssd:
            raise ValueError(f"TERAIO_SSD={text!r} names no directory")
    if compile is None:
        text = env("COMPILE")
        compile = parse_flag("TERAIO_COMPILE", text) if text is not None else False
    if "host_cap_bytes" not in options:
        text = env("HOST_CAP_BYTES")
        if text is not None:
            options["host_cap_bytes"] = parse_bytes("TERAIO_HOST_CAP_BYTES", text)
    return capacity, ssd, compile, options


def inner_optimizer(optimizer):
    """The torch optimizer inside Accelerate's AcceleratedOptimizer (and any
    wrapper that keeps it as ``.optimizer``)."""
    seen = 0
    while hasattr(optimizer, "optimizer") and seen < 8 and type(optimizer).__module__.startswith("accelerate"):
        optimizer = optimizer.optimizer
        seen += 1
    return optimizer
