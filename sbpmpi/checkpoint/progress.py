"""``verbose=True`` of ``sm.save_state`` / ``sm.load_state``: rank 0 reports each tensor."""

from __future__ import annotations

import sys
import time
from collections.abc import Sequence
from typing import Any

import numpy as np

from ..env import get_rank

__all__ = ["Progress", "size_text"]


def size_text(n: float) -> str:
    """``n`` bytes for people: ``"1.5 MiB"``, ``"176 B"``."""
    for unit, k in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= k:
            return f"{n / k:.1f} {unit}"
    return f"{int(n)} B"


def _is_terminal(stream: Any) -> bool:
    try:
        return bool(stream.isatty())
    except (OSError, ValueError):  # closed
        return False


class Progress:
    """Rank 0's per-tensor report for ``verbose=True``: a line per tensor on stderr, or a
    tqdm bar (by bytes) when stderr is a terminal and tqdm is installed.

    The report is best effort: rank 0 alone writes it, so a write that fails (stderr
    closed or full) turns the report off instead of failing rank 0 alone in the middle
    of a collective save or load, where the other ranks would wait for it.
    """

    def __init__(self, what: str, total_bytes: int, count: int, on: bool) -> None:
        self.what, self.count, self.done = what, count, 0
        self.on = on and get_rank() == 0
        self.bar: Any = None
        self.t0 = time.perf_counter()
        if not self.on:
            return
        if _is_terminal(sys.stderr):
            try:
                from tqdm import tqdm

                self.bar = tqdm(total=total_bytes, unit="B", unit_scale=True,
                                unit_divisor=1024, desc=what, file=sys.stderr)
            except ImportError:
                self.bar = None
        if self.bar is None:
            self._say(f"{what}: {count} tensor(s), {size_text(total_bytes)}")

    def _say(self, line: str) -> None:
        try:
            print(line, file=sys.stderr, flush=True)
        except (OSError, ValueError):  # ValueError: I/O operation on closed file
            self.on = False

    def tensor(self, name: str, shape: Sequence[int], dtype: np.dtype, seconds: float) -> None:
        """One tensor done: ``shape`` of ``dtype`` in ``seconds``."""
        if not self.on:
            return
        self.done += 1
        nbytes = int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
        if self.bar is not None:
            try:
                self.bar.set_postfix_str(name, refresh=False)
                self.bar.update(nbytes)
            except (OSError, ValueError):
                self.on = False
            return
        rate = f", {nbytes / seconds / 1e6:.0f} MB/s" if seconds > 0 and nbytes else ""
        self._say(f"{self.what}: [{self.done}/{self.count}] {name!r} {tuple(shape)} {dtype} "
                  f"{size_text(nbytes)} in {seconds:.2f} s{rate}")

    def close(self) -> None:
        """All done: close the bar, or print the total time."""
        if not self.on:
            return
        if self.bar is not None:
            try:
                self.bar.close()
            except (OSError, ValueError):
                self.on = False
        else:
            self._say(f"{self.what}: done in {time.perf_counter() - self.t0:.2f} s")
