"""Appending comm calls to the active :mod:`sbpmpi.safety.trace` traces."""

from __future__ import annotations

from ..safety.trace import ACTIVE, CommRecord, record
from .group import Group

__all__ = ["ACTIVE", "note"]


def note(op: str, nbytes: int, g: Group, dtype: object = "", peer: int | None = None,
         device: bool = False, staged: bool = False) -> None:
    """Record one call (callers test ``if ACTIVE:`` first, so this costs nothing untraced)."""
    record(CommRecord(op, int(nbytes), g.size, str(dtype), g.ranks, peer,
                      "cuda" if device else "cpu", staged))
