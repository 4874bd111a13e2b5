"""SBP descriptors: how a global tensor maps onto the ranks of one mesh axis.

``split(d)`` cuts dim ``d`` into balanced blocks, ``broadcast`` replicates the
whole tensor, ``partial_sum`` / ``partial_max`` / ``partial_min`` hold
operands whose elementwise reduction is the global value.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from .reduction import NAMES, REDUCTIONS, identity_value

__all__ = [
    "SBP",
    "Split",
    "Broadcast",
    "Partial",
    "split",
    "broadcast",
    "partial_sum",
    "partial_max",
    "partial_min",
    "NdSbp",
    "normalize_nd_sbp",
    "check_partials",
]


@dataclass(frozen=True)
class Split:
    """Split along tensor dim ``dim``."""

    dim: int

    def __repr__(self) -> str:
        return f"split({self.dim})"

    def __str__(self) -> str:
        return f"S({self.dim})"


@dataclass(frozen=True)
class Broadcast:
    """Every rank holds the whole tensor."""

    def __repr__(self) -> str:
        return "broadcast"

    def __str__(self) -> str:
        return "B"


@dataclass(frozen=True)
class Partial:
    """Every rank holds an operand; the global value is their reduction by ``op``."""

    op: str  # "sum" | "max" | "min"

    def __post_init__(self) -> None:
        if self.op not in tuple(REDUCTIONS):
            raise ValueError(f"partial op {self.op!r} is not one of {NAMES}")

    def __repr__(self) -> str:
        return f"partial_{self.op}"

    def __str__(self) -> str:
        return REDUCTIONS[self.op].display


SBP = Split | Broadcast | Partial
NdSbp = tuple[SBP, ...]

broadcast = Broadcast()
#: One Partial per row of the reduction table, in its order (sum, max, min).
PARTIALS: dict[str, Partial] = {name: Partial(name) for name in REDUCTIONS}
partial_sum, partial_max, partial_min = PARTIALS["sum"], PARTIALS["max"], PARTIALS["min"]


def split(dim: int) -> Split:
    """Return the SBP that splits tensor dim ``dim`` (negative dims allowed)."""
    if isinstance(dim, bool) or not isinstance(dim, int):
        raise TypeError(f"split dim must be an int, got {type(dim).__name__} {dim!r}")
    return Split(int(dim))


def normalize_nd_sbp(sbp: SBP | Sequence[SBP], mesh_ndim: int, tensor_ndim: int) -> NdSbp:
    """Return ``sbp`` as a tuple with one entry per mesh axis, split dims made non-negative.

    Raises
    ------
    TypeError
        An entry is not an SBP.
    ValueError
        The count does not match the mesh, or a split dim is out of range.
    """
    if isinstance(sbp, (Split, Broadcast, Partial)):
        items: tuple = (sbp,)
    elif isinstance(sbp, (list, tuple)):
        items = tuple(sbp)
    else:
        raise TypeError(
            f"sbp must be an SBP (sm.sbp.split(d), broadcast, partial_sum, ...) or a sequence "
            f"of them, got {type(sbp).__name__} {sbp!r}"
        )
    if len(items) != mesh_ndim:
        raise ValueError(
            f"sbp has {len(items)} entr{'y' if len(items) == 1 else 'ies'} {tuple(items)!r} but "
            f"the placement's mesh has {mesh_ndim} ax{'is' if mesh_ndim == 1 else 'es'}; "
            f"give one SBP per mesh axis"
        )
    out = []
    for s in items:
        if not isinstance(s, (Split, Broadcast, Partial)):
            raise TypeError(
                f"sbp entry {s!r} is not an SBP; expected sm.sbp.split(d), broadcast, "
                f"partial_sum, partial_max or partial_min"
            )
        if isinstance(s, Split):
            d = s.dim
            if not -tensor_ndim <= d < tensor_ndim:
                raise ValueError(
                    f"split dim {d} is out of range for a tensor of {tensor_ndim} dims"
                )
            s = Split(d % tensor_ndim)
        out.append(s)
    return tuple(out)


def check_partials(sbp: Sequence[SBP], dtype: Any) -> None:
    """Raise TypeError (the same on every rank) when ``dtype`` has no reduction for a partial
    kind in ``sbp`` (partial_max/min of complex, say)."""
    for s in sbp:
        if isinstance(s, Partial):
            identity_value(s.op, dtype)
