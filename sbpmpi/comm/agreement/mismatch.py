"""The message of ranks that disagree on a collective step, built in one place.

Every cross-rank check that finds the ranks doing different things (the consistency
check of :mod:`sbpmpi.runtime.consistency`, comm's checked mode in :mod:`.checks`, a
conversion's own agreement in checked mode and the exit-time agreement of
:mod:`..lifecycle.exit_agreement`) raises or prints the same shape of message::

    ranks disagree on a collective step:
      rank 0: x.numpy(tensor((4,), float64, sbp=(S(0)), placement=cpu[0, 1, 2]))
      ranks 1, 2: reached the end of the program
    Every rank must call the same operations, ...

:func:`mismatch_message` builds it; the callers supply what each rank was doing and the
advice that fits their kind of step. Pure text, no communication.
"""

from __future__ import annotations

from collections.abc import Sequence

__all__ = ["HEADER", "SAME_CALLS", "group_lines", "mismatch_message"]

#: The first line of every mismatch message.
HEADER = "ranks disagree on a collective step:"

#: The advice after a mismatch of op-level steps (ops, conversions, saves and loads).
SAME_CALLS = ("Every rank must call the same operations, on tensors of the same shape, "
              "dtype, SBP and placement, in the same order.")


def group_lines(texts: Sequence[str], ranks: Sequence[int], limit: int = 8) -> list[str]:
    """``rank(s) R: text`` lines, ranks with the same text merged, in rank order."""
    order: dict[str, list[int]] = {}
    for r, t in zip(ranks, texts):
        order.setdefault(t, []).append(r)
    lines = []
    for t, rs in order.items():
        who = f"rank {rs[0]}" if len(rs) == 1 else f"ranks {', '.join(map(str, rs))}"
        lines.append(f"  {who}: {t}")
    if len(lines) > limit:
        lines = lines[:limit] + [f"  ... and {len(lines) - limit} more"]
    return lines


def mismatch_message(texts: Sequence[str], ranks: Sequence[int], advice: str = "") -> str:
    """The message naming what each of ``ranks`` was doing (``texts``, in the same order).

    Parameters
    ----------
    texts : sequence of str
        What each rank was doing, one text per rank of ``ranks``.
    ranks : sequence of int
        The world ranks of the group that disagreed.
    advice : str, optional
        A last line telling the user what every rank must do (none when empty).
    """
    lines = [HEADER, *group_lines([str(t) for t in texts], ranks)]
    if advice:
        lines.append(advice)
    return "\n".join(lines)
