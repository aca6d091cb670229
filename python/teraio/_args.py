"""Checks of what Python callers hand to libteraio, in one place.

* :func:`integer` — every integer that crosses ctypes into a fixed-width C
  field goes through it: ctypes would wrap it without a word (a capacity of
  -1 became 2^64 - 1, a sequence length of 2^32 + 16 became 16).
* :func:`env` — teraio's environment variables are named ``TERAIO_*``; the
  older ``TIO_*`` names are still read when the new one is unset (the C
  library follows the same rule, ``tio_env`` in src/common).
* :func:`env_rank` — torchrun's ``RANK``/``LOCAL_RANK``/``WORLD_SIZE``.
"""
from __future__ import annotations

import operator
import os

U32, U64 = 2**32 - 1, 2**64 - 1


def integer(name: str, value, lo: int = 0, hi: int = U64) -> int:
    """`value` as an int in [lo, hi], else ValueError naming `name`.  A bool
    or a float (even an integral one) is not an integer here: the float
    options of teraio mean something else (a capacity share)."""
    if isinstance(value, bool):
        raise ValueError(f"{name} must be an integer, got {value!r}")
    try:
        v = operator.index(value)
    except TypeError:
        raise ValueError(f"{name} must be an integer, got {value!r}") from None
    if not lo <= v <= hi:
        raise ValueError(f"{name} must be an integer in [{lo}, {hi}], got {value!r}")
    return v


def env(suffix: str, default: str | None = None) -> str | None:
    """``TERAIO_<suffix>``, else the old ``TIO_<suffix>``, else `default`
    (an empty value counts as unset)."""
    for prefix in ("TERAIO_", "TIO_"):
        v = os.environ.get(prefix + suffix)
        if v:
            return v
    return default


def env_rank(name: str, default: int = 0) -> int:
    """torchrun's environment variable `name` (RANK, LOCAL_RANK, WORLD_SIZE)
    as an integer >= 0, `default` when unset; ValueError naming it when it
    is not one."""
    v = os.environ.get(name)
    if v is None or v == "":
        return default
    try:
        r = int(v)
    except ValueError:
        r = -1
    if r < 0:
        raise ValueError(f"environment variable {name}={v!r} is not a rank (an integer >= 0)")
    return r
