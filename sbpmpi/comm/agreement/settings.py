"""The settings agree across ranks: compared once, when sbpmpi is imported.

A setting that differs between ranks sends them down different paths (``SBPMPI_CHECK=0``
on one rank: it skips the consistency check the others wait in), and a variable one rank
cannot read used to stop that rank at import while the others waited in their first
collective. So :mod:`sbpmpi.config` does not raise at import; :func:`check` (called by
``import sbpmpi`` on every rank) compares every setting that is not ``per_rank``
(:func:`sbpmpi.config.comparison`) in one 16-byte all-reduce of a fingerprint
(:func:`sbpmpi.comm.agreement.agree`); only when they differ are the tables gathered.
Every rank then raises the same ``ValueError``, naming each variable and the ranks on
each side; a variable that no rank can read (the same text everywhere) raises its own
message on every rank.
"""

from __future__ import annotations

import json
from typing import NamedTuple

from ... import config
from . import exchange as agreement

__all__ = ["check", "message"]


class RankSettings(NamedTuple):
    """What one rank reports when the settings differ."""

    values: dict[str, str]  # variable -> value as spelled, or "<text> (not understood)"
    errors: dict[str, str]  # variable -> why its text was not understood


def check() -> None:
    """Collective over the world: raise ``ValueError`` on every rank when the settings
    differ between ranks or cannot be read (no exchange for a world of one process)."""
    mine = RankSettings(config.comparison(), config.startup_errors())
    fp = agreement.fingerprint_of(json.dumps(mine.values, sort_keys=True), b"settings")
    every = agreement.agree(fp, "import sbpmpi (comparing the SBPMPI_* settings)",
                            "import sbpmpi", lambda: mine)
    if every is not None:
        raise ValueError(message([RankSettings(*r) for r in every]))
    if mine.errors:  # the same on every rank
        raise ValueError("; ".join(mine.errors.values()))


def message(every: list[RankSettings]) -> str:
    """The error text for the settings of every rank (world order) when they differ."""
    lines = ["the SBPMPI_* settings differ across ranks; set each alike on every rank:"]
    for var in every[0].values:
        seen: dict[str, list[int]] = {}
        for rank, r in enumerate(every):
            seen.setdefault(r.values.get(var, "unset"), []).append(rank)
        if len(seen) == 1 and not any(var in r.errors for r in every):
            continue
        sides = [f"{_ranks(ranks)}: {value}" for value, ranks in seen.items()]
        lines.append(f"  {var}: " + "; ".join(sides))
        why = next((r.errors[var] for r in every if var in r.errors), None)
        if why is not None:
            lines.append(f"    ({why})")
    return "\n".join(lines)


def _ranks(ranks: list[int]) -> str:
    return f"rank {ranks[0]}" if len(ranks) == 1 else f"ranks {', '.join(map(str, ranks))}"
