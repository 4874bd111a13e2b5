"""A printable account of a conversion: the chosen plan and the candidates it beat."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .cost import CostTable
from .plan import Plan, PlanChoice, format_seconds, ranks_text, sbp_text

__all__ = ["Explanation"]


@dataclass(frozen=True)
class Explanation:
    """What ``x.to_global(...)`` would run: ``plan`` (chosen) and ``rejected`` candidates.

    ``str()`` gives a table: the hosts of the ranks where they span several, one row per
    step (mesh axis, collective, communicators -- inside and across hosts for a
    hierarchical step --, bytes per rank, estimated time), then the rejected candidates
    with their costs.
    """

    choice: PlanChoice
    dtype: np.dtype
    table: CostTable

    @property
    def plan(self) -> Plan:
        """The plan that runs."""
        return self.choice.chosen

    @property
    def rejected(self) -> tuple[Plan, ...]:
        """The candidates not chosen, cheapest first."""
        return self.choice.rejected

    @property
    def seconds(self) -> float:
        """Modelled time of the chosen plan."""
        return self.plan.seconds

    @property
    def steps(self) -> tuple:
        return self.plan.steps

    def __str__(self) -> str:
        p = self.plan
        src, dst = p.src, p.dst
        lines = [
            f"boxing {src.shape} {np.dtype(self.dtype)}: {sbp_text(src.sbp)} on "
            f"{ranks_text(src.placement)} -> {sbp_text(dst.sbp)} on {ranks_text(dst.placement)}",
        ]
        hosts = self.hosts_text()
        if hosts:
            lines.append(hosts)
        lines += [
            f"chosen plan ({len(p.steps)} step{'s' if len(p.steps) != 1 else ''}, "
            f"est. {format_seconds(p.seconds)}):",
            p.table(),
        ]
        if self.rejected:
            lines.append(f"rejected candidates ({len(self.rejected)}):")
            lines.append(f"  {'est. time':>10}  steps")
            for r in self.rejected:
                lines.append(f"  {format_seconds(r.seconds):>10}  {r.summary()}")
        else:
            lines.append("rejected candidates: none")
        lines.append(f"cost model: {self.table.source} (sm.boxing.calibrate() measures this "
                     f"machine; see sm.boxing.get_cost_table())")
        return "\n".join(lines)

    def hosts_text(self) -> str | None:
        """``hosts: node 0 ranks 0,1; node 1 ranks 2,3`` for the ranks of the conversion,
        when they span hosts of the table's topology; else None."""
        topo = self.table.topology
        if topo is None:
            return None
        p = self.plan
        by: dict[int, list[int]] = {}
        for r in sorted(set(p.src.placement.rank_list) | set(p.dst.placement.rank_list)):
            by.setdefault(topo.nodes[r], []).append(r)
        if len(by) < 2:
            return None
        return "hosts: " + "; ".join(f"node {k} ranks {','.join(str(r) for r in rs)}"
                                     for k, rs in sorted(by.items()))

    def __repr__(self) -> str:
        return f"<Explanation {self.plan.summary()} est. {format_seconds(self.seconds)}>"
