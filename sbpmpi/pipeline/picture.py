"""The measured schedule: the bubble fraction of a step's intervals and the classic
pipeline picture (one row per stage, time across), from ``sm.trace``'s intervals.

The intervals of the ranks of a step are gathered by the caller (``sm.comm.
all_gather_object(trace.intervals)``); their clocks (``time.perf_counter``) are the
machine's monotonic clock, comparable between the processes of one node.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from ..comm.trace import Interval

__all__ = ["bubble_fraction", "plot_schedule"]

COMPUTE = ("forward", "backward")


def _by_stage(iv: Interval) -> int:
    return iv.stage


def _unique(intervals: Sequence[Interval]) -> list[Interval]:
    """One copy of each interval (the ranks of a stage's placement record the same
    compute, each on its own clock): the first rank's, by (kind, stage, micro-batch)."""
    seen: dict[tuple[str, int, int], Interval] = {}
    for iv in intervals:
        seen.setdefault((iv.kind, iv.stage, iv.microbatch), iv)
    return list(seen.values())


def bubble_fraction(intervals: Sequence[Interval],
                    row_of: Callable[[Interval], int] = _by_stage) -> float:
    """The mean over rows (stages, or what ``row_of`` maps an interval to: a placement in
    an interleaved schedule) of the time a row is not computing (forward or backward),
    as a fraction of the span from the first interval's start to the last one's end."""
    comp = [iv for iv in _unique(intervals) if iv.kind in COMPUTE]
    if not comp:
        raise ValueError("bubble_fraction: no forward or backward intervals")
    t0 = min(iv.start for iv in comp)
    span = max(iv.end for iv in comp) - t0
    busy: dict[int, float] = {}
    for iv in comp:
        busy[row_of(iv)] = busy.get(row_of(iv), 0.0) + iv.seconds
    if span <= 0:
        return 0.0
    return 1.0 - sum(busy.values()) / (len(busy) * span)


def plot_schedule(intervals: Sequence[Interval], path: str, title: str = "",
                  row_of: Callable[[Interval], int] = _by_stage) -> float:
    """Draw one row per stage (or ``row_of`` row): forwards in blue, backwards in green,
    each labelled with its micro-batch, waits hatched; save to ``path`` (matplotlib) and
    return the bubble fraction shown in the title."""
    try:
        import matplotlib
    except ImportError as e:
        raise ImportError("plot_schedule needs matplotlib: pip install 'sbpmpi[plot]'") from e
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    ivs = _unique(intervals)
    bubble = bubble_fraction(ivs, row_of)
    t0 = min(iv.start for iv in ivs)
    rows = sorted({row_of(iv) for iv in ivs})
    colors: dict[str, Any] = {"forward": "#4c72b0", "backward": "#55a868"}
    fig, ax = plt.subplots(figsize=(10, 0.6 * len(rows) + 1.2))
    for iv in ivs:
        y = rows.index(row_of(iv))
        left, width = (iv.start - t0) * 1e3, iv.seconds * 1e3
        if iv.kind in colors:
            ax.barh(y, width, left=left, color=colors[iv.kind], edgecolor="black",
                    linewidth=0.3)
            ax.text(left + width / 2, y, str(iv.microbatch), ha="center", va="center",
                    fontsize=7, color="white")
        elif iv.kind == "wait" and width > 0:
            ax.barh(y, width, left=left, color="none", edgecolor="grey", hatch="//",
                    linewidth=0.3)
    ax.set_yticks(range(len(rows)), [f"stage {r}" for r in rows])
    ax.invert_yaxis()
    ax.set_xlabel("ms")
    ax.set_title(f"{title}  (blue: forward, green: backward; bubble {bubble:.1%})")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return bubble
