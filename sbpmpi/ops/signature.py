"""SBP signatures of ops: plain-data tables and their resolution against operand shapes.

A :class:`Signature` says which SBP (on one mesh axis) each input must have for the op
to run on local shards, and which SBP the output then has. Tables use concrete SBPs
(``split(-2)`` counts from the end of that operand's dims) and the wildcard
:class:`AnySplit` ``S(d)``, "a split of any dim of the op's dim set ``d``", which the
op call fills in with a :class:`DimMatch` per dim (e.g. a split of output dim 0 of an
elementwise op is a split of dim 0 of each full-size input and broadcast for an input
that is broadcast along it). Everything here is metadata: no MPI, no arrays.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from ..core.dtypes import is_half
from ..core.reduction import reduction
from ..core.sbp import PARTIALS, SBP, Broadcast, Partial, Split, broadcast

__all__ = [
    "AnySplit",
    "Pattern",
    "Signature",
    "DimMatch",
    "Resolved",
    "resolve",
    "admissible",
    "format_table",
    "B",
    "P",
    "PMAX",
    "PMIN",
    "S",
    "S_D",
]


@dataclass(frozen=True)
class AnySplit:
    """Wildcard ``S(name)``: a split of any dim in the op's dim set ``name``."""

    name: str = "d"

    def __str__(self) -> str:
        return f"S({self.name})"

    __repr__ = __str__


Pattern = Split | Broadcast | Partial | AnySplit

#: Short names used by the tables.
B = broadcast
P, PMAX, PMIN = PARTIALS["sum"], PARTIALS["max"], PARTIALS["min"]
S_D = AnySplit("d")


def S(dim: int) -> Split:  # noqa: N802 - reads like the notation S(0)
    """Concrete ``split(dim)``; a negative dim counts from the end of the operand's dims."""
    return Split(dim)


@dataclass(frozen=True)
class Signature:
    """One row of an op's table: input SBPs -> output SBP on one mesh axis.

    ``when="float"`` restricts the row to floating dtypes (it is only exact when the
    reduction identities are infinities, e.g. ``P(max) + B -> P(max)``).
    """

    inputs: tuple[Pattern, ...]
    output: Pattern
    when: str = ""

    def __post_init__(self) -> None:
        if self.when not in ("", "float"):
            raise ValueError(f"signature condition {self.when!r} is not '' or 'float'")
        names = {p.name for p in (*self.inputs, self.output) if isinstance(p, AnySplit)}
        if len(names) > 1:
            raise ValueError(f"a signature may use one wildcard dim set, got {sorted(names)}")

    @property
    def wildcard(self) -> str | None:
        """Name of the dim set the row ranges over, None for a concrete row."""
        for p in (*self.inputs, self.output):
            if isinstance(p, AnySplit):
                return p.name
        return None

    def __str__(self) -> str:
        ins = ", ".join(str(p) for p in self.inputs)
        if len(self.inputs) == 1:
            ins += ","
        cond = f"  [{self.when}]" if self.when else ""
        return f"({ins}) -> {self.output}{cond}"


@dataclass(frozen=True)
class DimMatch:
    """One dim the op carries: its index in each input and in the output.

    None for an input means that input is broadcast along this dim (its size is 1
    there, or it lacks the dim), so it must be broadcast on the mesh axis that splits
    the dim; None for the output means the dim is reduced away.
    """

    inputs: tuple[int | None, ...]
    output: int | None


@dataclass(frozen=True)
class Resolved:
    """A table row made concrete for given operands: one SBP per input and the output."""

    inputs: tuple[SBP, ...]
    output: SBP
    row: int
    source: Signature

    def __str__(self) -> str:
        ins = ", ".join(str(s) for s in self.inputs)
        if len(self.inputs) == 1:
            ins += ","
        return f"({ins}) -> {self.output}"


def _concrete(p: Pattern, ndim: int) -> SBP | None:
    if isinstance(p, Split):
        if not -ndim <= p.dim < ndim:
            return None
        return Split(p.dim % ndim)
    assert not isinstance(p, AnySplit)
    return p


def resolve(table: Sequence[Signature], dims: Mapping[str, Sequence[DimMatch]],
            in_ndims: Sequence[int], out_ndim: int,
            fixed: Sequence[bool] = ()) -> tuple[Resolved, ...]:
    """All concrete signatures of ``table`` for operands of ``in_ndims`` dims.

    A wildcard row gives one signature per :class:`DimMatch` of its dim set (in the
    order given); a row naming a dim an operand lacks gives none. ``fixed[i]`` marks
    an operand that cannot be boxed (a Python scalar): only rows where it is broadcast
    are kept. Rows whose output is split but no input is are dropped (the local result
    would be the whole tensor). Duplicates keep their first occurrence.
    """
    fixed = tuple(fixed) or (False,) * len(in_ndims)
    out: list[Resolved] = []
    seen: set[tuple[tuple[SBP, ...], SBP]] = set()
    for row, sig in enumerate(table):
        if len(sig.inputs) != len(in_ndims):
            raise ValueError(f"signature {sig} has {len(sig.inputs)} inputs, the op "
                             f"call has {len(in_ndims)}")
        name = sig.wildcard
        matches: Sequence[DimMatch | None] = [None] if name is None else dims.get(name, ())
        for m in matches:
            ins: list[SBP] = []
            ok = True
            for i, p in enumerate(sig.inputs):
                s: SBP | None
                if isinstance(p, AnySplit):
                    assert m is not None
                    d = m.inputs[i]
                    s = broadcast if d is None else Split(d)
                else:
                    s = _concrete(p, in_ndims[i])
                if s is None or (fixed[i] and not isinstance(s, Broadcast)):
                    ok = False
                    break
                ins.append(s)
            if not ok:
                continue
            o: SBP | None
            if isinstance(sig.output, AnySplit):
                assert m is not None
                o = None if m.output is None else Split(m.output)
            else:
                o = _concrete(sig.output, out_ndim)
            if o is None:
                continue
            if isinstance(o, Split) and not any(isinstance(s, Split) for s in ins):
                continue
            key = (tuple(ins), o)
            if key in seen:
                continue
            seen.add(key)
            out.append(Resolved(tuple(ins), o, row, sig))
    return tuple(out)


def widens_exactly(src: Any, dst: Any) -> bool:
    """Whether casting ``src`` to ``dst`` is exact for every value and keeps a pending sum:
    float16/bfloat16 to float32 or float64. The parts of a half-width ``partial_sum`` cast
    to float32 sum to the value the parts stand for, without the rounding to half width a
    reduction first would add (a half-width gradient cast to its float32 weight's dtype
    is then reduced in float32, as ``reduce_dtype=float32`` means)."""
    return is_half(src) and np.dtype(dst) in (np.dtype(np.float32), np.dtype(np.float64))


def admissible(r: Resolved, in_dtypes: Sequence[np.dtype | None], out_dtype: np.dtype) -> bool:
    """Whether ``r`` gives exact values for these dtypes.

    A partial-sum input must keep its dtype through the op (a promotion would change
    the arithmetic of the pending sum, e.g. integer wrap-around or bool "or" versus
    integer "+"). Rows marked ``float`` need floating partial inputs and output;
    ``P(max)``/``P(min)`` rows need ordered (not complex) dtypes.
    """
    dts = [np.dtype(d) for d in (*in_dtypes, out_dtype) if d is not None]
    if any(isinstance(s, Partial) and not all(map(reduction(s.op).defined_for, dts))
           for s in (*r.inputs, r.output)):
        return False  # partial_max/min need ordered dtypes
    for s, dt in zip(r.inputs, in_dtypes):
        if isinstance(s, Partial) and dt is not None:
            if s.op == "sum" and np.dtype(dt) != np.dtype(out_dtype) \
                    and not widens_exactly(dt, out_dtype):
                return False
            if r.source.when == "float" and np.dtype(dt).kind != "f":
                return False
    if r.source.when == "float" and np.dtype(out_dtype).kind != "f":
        return False
    return True


def format_table(name: str, table: Sequence[Signature]) -> str:
    """The table as readable lines, one signature per line."""
    lines = [f"{name}:"]
    lines += [f"  {i:>2}  {sig}" for i, sig in enumerate(table)]
    return "\n".join(lines)
