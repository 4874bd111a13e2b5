"""Appending comm calls to the active :mod:`sbpmpi.comm.trace` traces."""

from __future__ import annotations

from .group import Group
from .trace import ACTIVE, CommRecord, record

__all__ = ["ACTIVE", "note"]


def note(op: str, nbytes: int, g: Group, dtype: object = "", peer: int | None = None,
         device: bool = False, staged: bool = False, nonblocking: bool = False) -> None:
    """Record one call (callers test ``if ACTIVE:`` first, so this costs nothing untraced)."""
    record(CommRecord(op, int(nbytes), g.size, str(dtype), g.ranks, peer,
                      "cuda" if device else "cpu", staged, nonblocking))
