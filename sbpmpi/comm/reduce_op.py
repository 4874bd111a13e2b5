"""Reduction operators, as torch.distributed names them, and their MPI ops per dtype.

=========  ==========  =========  ==========  ==========  ======================
op         bool        integers   floats      complex     float16 / bfloat16
=========  ==========  =========  ==========  ==========  ======================
SUM        LOR         SUM        SUM         SUM         user op (NumPy add)
PROD       LAND        PROD       PROD        PROD        user op (multiply)
MAX        LOR         MAX        MAX         TypeError   user op (maximum)
MIN        LAND        MIN        MIN         TypeError   user op (minimum)
AVG        TypeError   TypeError  SUM, / n    SUM, / n    user op, / n
=========  ==========  =========  ==========  ==========  ======================

bool follows NumPy (``a + b`` is ``a | b``); AVG needs a floating or complex dtype,
since a mean of integers is not an integer. User-defined ops run on host memory, so
GPU data reduced with them is staged through host buffers even with a CUDA-aware MPI.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import Any

import numpy as np
from mpi4py import MPI

from ..core.reduction import REDUCTIONS
from .dtypes import BOOL, COMPLEX, EMULATED, FLOAT, INT, DtypeInfo

__all__ = ["ReduceOp", "MPIReduction", "mpi_reduction"]


class ReduceOp(enum.Enum):
    """Elementwise reduction used by reduce, all_reduce and reduce_scatter."""

    SUM = "sum"
    PROD = "prod"
    MAX = "max"
    MIN = "min"
    AVG = "avg"

    def __repr__(self) -> str:
        return f"ReduceOp.{self.name}"


@dataclass(frozen=True)
class MPIReduction:
    """The MPI op for one (ReduceOp, dtype) pair.

    ``average``: divide the result by the group size afterwards; ``host_only``: the op
    is user-defined (Python) and must see host memory.
    """

    op: MPI.Op
    average: bool = False
    host_only: bool = False


_BUILTIN = {ReduceOp.SUM: MPI.SUM, ReduceOp.PROD: MPI.PROD, ReduceOp.MAX: MPI.MAX,
            ReduceOp.MIN: MPI.MIN, ReduceOp.AVG: MPI.SUM}
_LOGICAL = {ReduceOp.SUM: MPI.LOR, ReduceOp.PROD: MPI.LAND, ReduceOp.MAX: MPI.LOR,
            ReduceOp.MIN: MPI.LAND}
# The partial kinds' ufuncs come from the reduction table; PROD is comm's own.
UFUNCS = {ReduceOp.PROD: np.multiply,
          **{ReduceOp[r.reduce_op]: r.ufunc_of(np) for r in REDUCTIONS.values()}}
# The ops that compare values (MAX, MIN): undefined for complex, and NaN needs care.
ORDERED = tuple(ReduceOp[r.reduce_op] for r in REDUCTIONS.values() if r.ordered)


def user_op(ufunc: np.ufunc, dtype: np.dtype) -> MPI.Op:
    """A commutative MPI op that applies ``ufunc`` to host buffers of ``dtype``."""

    def apply(inbuf: Any, inoutbuf: Any, datatype: MPI.Datatype) -> None:
        a = np.frombuffer(inbuf, dtype=dtype)
        b = np.frombuffer(inoutbuf, dtype=dtype)
        ufunc(a, b, out=b)

    return MPI.Op.Create(apply, commute=True)


_user_ops: list[MPI.Op] = []


def _build(op: ReduceOp, info: DtypeInfo) -> MPIReduction:
    cat, dt = info.category, info.dtype
    avg = op is ReduceOp.AVG
    if cat == BOOL:
        if avg:
            raise TypeError("ReduceOp.AVG needs a floating or complex dtype, got bool")
        return MPIReduction(_LOGICAL[op])
    if cat == INT:
        if avg:
            raise TypeError(
                f"ReduceOp.AVG needs a floating or complex dtype, got {dt} (the mean of "
                "integers is not an integer; cast to a float dtype first)")
        return MPIReduction(_BUILTIN[op])
    if cat == FLOAT:
        return MPIReduction(_BUILTIN[op], average=avg)
    if cat == COMPLEX:
        if op in ORDERED:
            raise TypeError(f"ReduceOp.{op.name} is not defined for complex dtype {dt} "
                            "(complex numbers are not ordered)")
        return MPIReduction(_BUILTIN[op], average=avg)
    if cat == EMULATED:
        if avg:  # the SUM op, then a division
            return MPIReduction(mpi_reduction(ReduceOp.SUM, info).op, average=True,
                                host_only=True)
        mop = user_op(UFUNCS[op], dt)
        _user_ops.append(mop)
        return MPIReduction(mop, average=avg, host_only=True)
    raise TypeError(f"cannot reduce arrays of dtype {dt}: reductions need a numeric dtype "
                    "(bool, integer, floating or complex) in native byte order")


def mpi_reduction(op: ReduceOp, info: DtypeInfo) -> MPIReduction:
    """The cached MPI op for ``op`` on ``info.dtype``; TypeError where it is not defined."""
    if not isinstance(op, ReduceOp):
        raise TypeError(f"op must be a ReduceOp (SUM, PROD, MAX, MIN, AVG), got {op!r}")
    red = info.reductions.get(op._value_)
    if red is None:
        red = info.reductions[op._value_] = _build(op, info)
    return red

