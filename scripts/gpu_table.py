"""The GPU table of docs/gpu.md from the timing files of scripts/gpu_check.sh.

    python scripts/gpu_table.py OUT/bench-staged-n2.json OUT/bench-ipc-n2.json ...

Each file is the JSON of ``python -m sbpmpi bench --device cuda``, named
``bench-<transport>-n<ranks>.json``. Prints a Markdown table per number of ranks: each
conversion and size, the milliseconds of every transport, the device-to-device copy of
the bytes a rank receives (the proxy), and the ``ipc`` row's targets: within 3x of the copy
for S(0)->B and P->S(0) at 64 MiB (5x for P->B), under 100 us at 1 MiB, never slower than
``staged``.
"""

from __future__ import annotations

import json
import re
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any, NamedTuple

CONVERSIONS = ("S(0)->B", "P->B", "P->S(0)", "S(0)->S(1)")
NAME = re.compile(r"bench-(?P<transport>\w+)-n(?P<ranks>\d+)\.json$")
# the ipc targets: conversion -> most times the device copy at 64 MiB
COPY_TARGET = {"S(0)->B": 3.0, "P->S(0)": 3.0, "P->B": 5.0}
SMALL_US = 100.0  # at 1 MiB


class Timing(NamedTuple):
    """One file: its transport, number of ranks and document."""

    transport: str
    ranks: int
    doc: dict[str, Any]


def read(paths: Sequence[str]) -> list[Timing]:
    out = []
    for p in paths:
        m = NAME.search(Path(p).name)
        if m is None:
            raise SystemExit(f"gpu_table: {p} is not named bench-<transport>-n<ranks>.json")
        with open(p) as f:
            out.append(Timing(m["transport"], int(m["ranks"]), json.load(f)))
    return out


def _fmt(ms: float | None) -> str:
    return "-" if ms is None else f"{ms:.3f}"


def targets(conv: str, mib: float, ipc: float | None, staged: float | None,
            copy: float | None) -> str:
    """The ipc row's targets met (ok) or missed (MISS), as text."""
    if ipc is None:
        return ""
    notes = []
    if mib == 64 and conv in COPY_TARGET and copy:
        lim = COPY_TARGET[conv]
        notes.append(f"{'ok' if ipc <= lim * copy else 'MISS'} <= {lim:g}x copy")
    if mib == 1:
        notes.append(f"{'ok' if ipc * 1e3 < SMALL_US else 'MISS'} < {SMALL_US:g} us")
    if staged is not None:
        notes.append(f"{'ok' if ipc <= staged else 'MISS'} <= staged")
    return ", ".join(notes)


def table(timings: Sequence[Timing], ranks: int) -> str:
    rank_of = {"staged": 0, "ipc": 1, "mpi": 2}
    mine = sorted((t for t in timings if t.ranks == ranks),
                  key=lambda t: (rank_of.get(t.transport, 3), t.transport))
    names = [t.transport for t in mine]
    rows: dict[tuple[str, float], dict[str, float]] = {}
    copy: dict[tuple[str, float], float] = {}
    for t in mine:
        for r in t.doc.get("results", []):
            key = (r["conversion"], float(r["mib"]))
            if r["conversion"] not in CONVERSIONS:
                continue
            rows.setdefault(key, {})[t.transport] = float(r["sbpmpi_ms"])
            if r.get("proxy_ms") is not None:
                copy.setdefault(key, float(r["proxy_ms"]))
    first = mine[0].doc
    lines = [f"**{ranks} ranks**, {first.get('gpu', '?')}, {first.get('mpi', '?')}, "
             f"{first.get('host', '?')}, {first.get('date', '?')}", "",
             "| conversion | MiB | " + " | ".join(f"{n} ms" for n in names)
             + " | copy ms | ipc targets |",
             "|---|---|" + "---|" * len(names) + "---|---|"]
    order = {c: i for i, c in enumerate(CONVERSIONS)}
    for (conv, mib), ms in sorted(rows.items(), key=lambda kv: (order[kv[0][0]], kv[0][1])):
        c = copy.get((conv, mib))
        lines.append(f"| {conv} | {mib:g} | " + " | ".join(_fmt(ms.get(n)) for n in names)
                     + f" | {_fmt(c)} | {targets(conv, mib, ms.get('ipc'), ms.get('staged'), c)} |")
    return "\n".join(lines)


def main(argv: Sequence[str]) -> int:
    if not argv:
        print(__doc__)
        return 2
    timings = read(argv)
    for ranks in sorted({t.ranks for t in timings}):
        print(table(timings, ranks))
        print()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
