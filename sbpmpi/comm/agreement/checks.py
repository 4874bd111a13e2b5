"""Argument agreement across ranks (opt-in checked mode).

By default each call validates its arguments locally, before any communication; an
error that every rank makes the same way (the usual SPMD case) is raised on every rank.
In checked mode (``SBPMPI_COMM_CHECK=1``, or ``sm.config.update(comm_check=True)``: the
setting :data:`sbpmpi.config.comm_check`) every collective first
agrees on its local verdict and a signature (dtype, sizes, root, op) through
:func:`.exchange.agree` (one 16-byte all-reduce of their fingerprint; the signatures are
gathered only when they differ), so that an error made on one rank only, or ranks that
disagree on sizes, raise the same clear error on every rank instead of hanging or
corrupting data.

Inside :func:`agreed` (a layout conversion whose ranks already agreed on the whole
conversion) the calls skip their own exchange: their arguments follow from the agreed
layouts.

A call whose route the group decides together (the ``ipc`` GPU transport:
:mod:`..gpu.route`) carries its rank's vote in the same exchange (:func:`agree_flag`).
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

from ... import config
from ...errors import CollectiveMismatchError
from ..group import Group
from . import exchange as agreement
from .mismatch import mismatch_message

__all__ = ["checking", "agree", "agree_flag", "agreed", "within_agreed", "disagreement"]

@dataclass
class CheckedMode:
    """Checked mode's state on this rank: the flag the calls test first (the setting, off
    inside :func:`agreed`) and how deep in :func:`agreed` blocks the rank is."""

    enabled: bool = False
    agreed_depth: int = 0

    def refresh(self, _: object = None) -> None:
        """Follow the setting (the hook :func:`sbpmpi.config.on_update` calls)."""
        self.enabled = bool(config.comm_check.value) and not self.agreed_depth

    def enter_agreed(self) -> None:
        self.agreed_depth += 1
        self.refresh()

    def leave_agreed(self) -> None:
        self.agreed_depth -= 1
        self.refresh()


MODE = CheckedMode()
MODE.refresh()
config.on_update("comm_check", MODE.refresh)


def checking() -> bool:
    """True in checked mode (the setting :data:`sbpmpi.config.comm_check`, outside
    :func:`agreed`)."""
    return MODE.enabled


def within_agreed() -> bool:
    """True inside :func:`agreed`: the ranks agreed on the whole step, its layouts included
    (so every rank's arrays are where the agreed placement says: host arrays on every rank,
    or device arrays on every rank)."""
    return MODE.agreed_depth > 0


@contextmanager
def agreed() -> Iterator[None]:
    """Within the block, calls skip checked mode's exchange (the ranks agreed on the step
    that makes them, e.g. one layout conversion, in one exchange before it)."""
    MODE.enter_agreed()
    try:
        yield
    finally:
        MODE.leave_agreed()


def _fmt(sig: Sequence[tuple[str, Any]]) -> str:
    return ", ".join(f"{k}={v}" for k, v in sig)


def agree(group: Group, op: str, err: BaseException | None,
          sig: Sequence[tuple[str, Any]] = (), extra: Any = None) -> list[tuple[Any, Any]]:
    """Raise ``err`` (on every rank in checked mode) or check that all ranks agree on ``sig``.

    ``sig`` is a sequence of (name, value) that must be equal on every rank; ``extra`` is
    exchanged as it is (an all-gather, after the agreement). Returns ``(sig, extra)`` of
    every rank in checked mode (``[]`` otherwise), for checks across ranks that give the
    same verdict everywhere.
    """
    if not MODE.enabled:
        if err is not None:
            raise err
        return []
    mine = None if err is None else (type(err).__name__, str(err))
    full = (("call", op),) + tuple(sig)
    text = f"{op}({_fmt(sig)})" if mine is None else f"{op}: {mine[0]}: {mine[1]}"
    fp = agreement.fingerprint_of(repr((mine, full)))
    everyone = agreement.agree(fp, op, text, lambda: (text, (mine, full)), group)
    if everyone is not None:
        _explain(everyone, group)
    if mine is not None:  # the same error on every rank
        n = len(group.ranks)
        others = f" (and {n - 1} other ranks)" if n > 1 else ""
        raise _error(mine, f"{mine[1]} [raised on group rank 0{others}]")
    if extra is None:
        return [(full[1:], None)] * len(group.ranks)
    return [(full[1:], x) for x in agreement.gather(extra, op, group)]


def agree_flag(group: Group, op: str, sig: Sequence[tuple[str, Any]], flag: bool) -> bool:
    """Checked mode's agreement on ``sig`` (as :func:`agree` for arguments that were valid
    here), carrying one flag of every rank in the same exchange: True when some rank of
    ``group`` raised ``flag``."""
    full = (("call", op),) + tuple(sig)
    text = f"{op}({_fmt(sig)})"
    fp = agreement.fingerprint_of(repr((None, full)))
    got = agreement.agree_flagged(fp, op, text, lambda: (text, (None, full)), group, flag)
    if got.explanations is not None:
        _explain(got.explanations, group)
        return True  # compared in full without a verdict: taken as raised, on every rank
    return got.any_flag


def _error(mine: tuple[str, str], text: str) -> Exception:
    return TypeError(text) if mine[0] == "TypeError" else ValueError(text)


def _explain(everyone: list[Any], group: Group) -> None:
    """Raise the error that explains the signatures and verdicts ``everyone`` gathered."""
    details = [d for _, d in everyone]
    if not all(isinstance(d, tuple) and len(d) == 2 and isinstance(d[1], tuple)
               and d[1][:1] and d[1][0][:1] == ("call",) for d in details):
        # some rank is in another kind of agreement (an op's consistency check)
        raise CollectiveMismatchError(mismatch_message(
            [t for t, _ in everyone], group.ranks,
            "Every rank must make the same sbpmpi calls, in the same order."))
    bad = [(r, e) for r, (e, _) in enumerate(details) if e is not None]
    if bad:
        r, (tname, msg) = bad[0]
        others = f" (and {len(bad) - 1} other ranks)" if len(bad) > 1 else ""
        raise _error((tname, msg), f"{msg} [raised on group rank {r}{others}]")
    sigs = [s for _, s in details]
    for r, s in enumerate(sigs):
        if s != sigs[0]:
            raise ValueError(disagreement(sigs[0], r, s))


def disagreement(sig0: Sequence[tuple[str, Any]], r: int, sig: Sequence[tuple[str, Any]]) -> str:
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
