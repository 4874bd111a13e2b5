"""Argument agreement across ranks (opt-in checked mode).

By default each call validates its arguments locally, before any communication; an
error that every rank makes the same way (the usual SPMD case) is raised on every rank.
In checked mode (``SBPMPI_COMM_CHECK=1`` or :func:`set_checking`) every collective first
exchanges its local verdict and a signature (dtype, sizes, root, op) with one small
all-gather, so that an error made on one rank only, or ranks that disagree on sizes,
raise the same clear error on every rank instead of hanging or corrupting data.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import Any

from mpi4py import MPI

__all__ = ["checking", "set_checking", "agree"]

_enabled = os.environ.get("SBPMPI_COMM_CHECK", "0").strip().lower() in ("1", "true", "yes", "on")


def checking() -> bool:
    """True in checked mode."""
    return _enabled


def set_checking(enabled: bool) -> bool:
    """Turn checked mode on or off (on every rank alike); returns the previous setting."""
    global _enabled
    prev, _enabled = _enabled, bool(enabled)
    return prev


def _fmt(sig: Sequence[tuple[str, Any]]) -> str:
    return ", ".join(f"{k}={v}" for k, v in sig)


def agree(comm: MPI.Intracomm, op: str, err: BaseException | None,
          sig: Sequence[tuple[str, Any]] = (), extra: Any = None) -> list[tuple[Any, Any]]:
    """Raise ``err`` (on every rank in checked mode) or check that all ranks agree on ``sig``.

    ``sig`` is a sequence of (name, value) that must be equal on every rank; ``extra`` is
    exchanged as it is. Returns ``(sig, extra)`` of every rank in checked mode (``[]``
    otherwise), for checks across ranks that give the same verdict everywhere.
    """
    if not _enabled:
        if err is not None:
            raise err
        return []
    mine = None if err is None else (type(err).__name__, str(err))
    everyone = comm.allgather((mine, ((("call", op),) + tuple(sig)), extra))
    bad = [(r, e) for r, (e, _, _) in enumerate(everyone) if e is not None]
    if bad:
        r, (tname, msg) = bad[0]
        others = f" (and {len(bad) - 1} other ranks)" if len(bad) > 1 else ""
        exc = TypeError if tname == "TypeError" else ValueError
        raise exc(f"{msg} [raised on group rank {r}{others}]")
    sigs = [s for _, s, _ in everyone]
    for r, s in enumerate(sigs):
        if s != sigs[0]:
            raise ValueError(_disagreement(sigs[0], r, s))
    return [(s[1:], x) for _, s, x in everyone]


def _disagreement(sig0: Sequence[tuple[str, Any]], r: int, sig: Sequence[tuple[str, Any]]) -> str:
    """The message for group rank ``r`` whose ``sig`` (("call", name) first) differs from rank 0's."""
    a, b = dict(sig0), dict(sig)
    diff = [k for k in dict.fromkeys([*a, *b]) if a.get(k, _MISSING) != b.get(k, _MISSING)]
    op0, op = a["call"], b["call"]
    if op0 != op:
        return (f"ranks called different collectives: group rank 0 called {op0}("
                f"{_fmt(sig0[1:])}) but group rank {r} called {op}({_fmt(sig[1:])}); "
                f"every rank of a group must make the same call")
    return (f"{op}: ranks disagree on {', '.join(diff)}: group rank 0 passed "
            f"{_fmt(sig0[1:])} but group rank {r} passed {_fmt(sig[1:])}")


_MISSING = object()

