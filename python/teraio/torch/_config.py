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
from decimal import Decimal

from .session import check_capacity, missing_dir, ssd_dirs

_UNITS = {"": 1, "b": 1, "kb": 10**3, "mb": 10**6, "gb": 10**9, "tb": 10**12,
          "kib": 1 << 10, "mib": 1 << 20, "gib": 1 << 30, "tib": 1 << 40}
# ASCII digits only (re's \d takes any script's)
_BYTES = re.compile(r"\s*([0-9]+(?:\.[0-9]+)?)\s*([a-zA-Z]*)\s*", re.ASCII)
_SHARE = re.compile(r"\s*([0-9]*\.[0-9]+|[0-9]+\.)\s*", re.ASCII)
_TRUE, _FALSE = ("1", "true", "yes", "on"), ("0", "false", "no", "off")


def _var(suffix: str) -> tuple[str, str] | None:
    """(the variable's name, its value) for TERAIO_<suffix>, else the old
    TIO_<suffix>; None when neither is set (an empty value counts as unset)."""
    for prefix in ("TERAIO_", "TIO_"):
        v = os.environ.get(prefix + suffix)
        if v:
            return prefix + suffix, v
    return None


def parse_bytes(name: str, text: str, zero: bool = False) -> int:
    """``text`` as bytes ("123", "12GiB", "1.5GB"), exactly; ValueError naming
    `name`.  0 is refused unless `zero`."""
    m = _BYTES.fullmatch(text)
    unit = _UNITS.get(m.group(2).lower()) if m else None
    if not m or unit is None or ("." in m.group(1) and unit == 1):
        raise ValueError(f"{name}={text!r} is not bytes (an integer, or a number with a unit: "
                         f"B, KB, MB, GB, TB, KiB, MiB, GiB, TiB)")
    exact = Decimal(m.group(1)) * unit
    if exact != int(exact):
        raise ValueError(f"{name}={text!r} is not a whole number of bytes")
    n = int(exact)
    if not (0 if zero else 1) <= n < 2**64:
        raise ValueError(f"{name}={text!r} must be {'>= 0' if zero else '> 0'} bytes and < 2^64")
    return n


def parse_capacity(text: str, name: str = "TERAIO_CAPACITY") -> int | float:
    """A share of the peak (a number with a point, in (0, 1]), else bytes (an
    integer, or a number with a unit), as offload()'s float and int."""
    m = _SHARE.fullmatch(text)
    if m:
        exact = Decimal(m.group(1))
        if not 0 < exact <= 1:
            raise ValueError(f"{name}={text!r}: a share of the peak must be in (0, 1]")
        return float(exact)
    if not _BYTES.fullmatch(text):
        raise ValueError(f"{name}={text!r} is neither a share of the peak (a number in (0, 1] such as 0.5) "
                         f"nor bytes (an integer, or a number with a unit such as 12GiB)")
    return parse_bytes(name, text)


def parse_flag(name: str, text: str) -> bool:
    s = text.strip().lower()
    if s in _TRUE:
        return True
    if s in _FALSE:
        return False
    raise ValueError(f"{name}={text!r} is not a switch (1/0, true/false, yes/no, on/off)")


def resolve(capacity=None, ssd=None, compile=None, options: dict | None = None, *, who: str):
    """(capacity, ssd, compile, options) with the environment filling what
    the caller left None, checked now (capacity, ssd's form; offload()
    checks the rest).  `who` names the integration in the errors."""
    options = dict(options or {})
    if capacity is None:
        var = _var("CAPACITY")
        capacity = parse_capacity(var[1], var[0]) if var else 0.5
    source = "ssd"
    if ssd is None:
        var = _var("SSD")
        if var is None:
            raise ValueError(f"{who}: no SSD directory: pass ssd=... or set TERAIO_SSD "
                             f"(directories separated by '{os.pathsep}')")
        ssd = [d for d in var[1].split(os.pathsep) if d]
        if not ssd:
            raise ValueError(f"{var[0]}={var[1]!r} names no directory")
        source = f"{var[0]}={var[1]!r}"
    if compile is None:
        var = _var("COMPILE")
        compile = parse_flag(var[0], var[1]) if var else False
    elif not isinstance(compile, bool):
        raise TypeError(f"{who}: compile must be True or False, got {compile!r}")
    if "host_cap_bytes" not in options:
        var = _var("HOST_CAP_BYTES")
        if var:
            options["host_cap_bytes"] = parse_bytes(var[0], var[1], zero=True)
    try:
        check_capacity(capacity)
        dirs = ssd_dirs(ssd)
    except (TypeError, ValueError) as e:
        raise type(e)(f"{who}: {e}") from None
    missing = missing_dir(dirs)
    if missing is not None:  # offload() would refuse it only at on_train_begin, after the Trainer's set-up
        raise ValueError(f"{who}: {source}: directory {missing!r} does not exist or is not a directory")
    return capacity, ssd, compile, options


def inner_optimizer(optimizer):
    """The torch optimizer inside Accelerate's AcceleratedOptimizer (and any
    wrapper that keeps it as ``.optimizer``)."""
    seen = 0
    while hasattr(optimizer, "optimizer") and seen < 8 and type(optimizer).__module__.startswith("accelerate"):
        optimizer = optimizer.optimizer
        seen += 1
    return optimizer
