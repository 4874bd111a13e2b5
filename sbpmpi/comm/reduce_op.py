"""Reduction operators, as torch.distributed names them."""

from __future__ import annotations

import enum

__all__ = ["ReduceOp"]


class ReduceOp(enum.Enum):
    """Elementwise reduction used by reduce, all_reduce and reduce_scatter."""

    SUM = "sum"
    PROD = "prod"
    MAX = "max"
    MIN = "min"
    AVG = "avg"

    def __repr__(self) -> str:
        return f"ReduceOp.{self.name}"
