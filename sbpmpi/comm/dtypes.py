"""NumPy dtypes as MPI datatypes, and which reductions MPI can do on them.

Every fixed-size dtype without Python object references can be moved: numeric dtypes
map to MPI's predefined types; the rest (float16, bfloat16, strings, datetimes,
non-native byte order, structured types) move as same-sized unsigned integers or bytes.
Reductions are possible on the categories below (see :mod:`.reduce_op`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np
from mpi4py import MPI

__all__ = ["DtypeInfo", "dtype_info", "BOOL", "INT", "FLOAT", "COMPLEX", "EMULATED", "OPAQUE"]

# categories
BOOL = "bool"          # MPI logical ops only (LAND, LOR)
INT = "int"            # MPI integer arithmetic
FLOAT = "float"        # MPI floating arithmetic
COMPLEX = "complex"    # MPI SUM/PROD only
EMULATED = "emulated"  # floats MPI cannot add (float16, bfloat16): user-defined MPI ops
OPAQUE = "opaque"      # moved as bytes; no reductions


@dataclass(frozen=True)
class DtypeInfo:
    """How one dtype goes to MPI: the datatype for moving it and its reduction category.

    ``reductions`` caches the MPI op per ReduceOp value (filled by :mod:`.reduce_op`).
    """

    dtype: np.dtype
    mpi: MPI.Datatype
    category: str
    reductions: dict[str, Any] = field(default_factory=dict, compare=False, repr=False)


_INTS = {1: MPI.INT8_T, 2: MPI.INT16_T, 4: MPI.INT32_T, 8: MPI.INT64_T}
_UINTS = {1: MPI.UINT8_T, 2: MPI.UINT16_T, 4: MPI.UINT32_T, 8: MPI.UINT64_T}
_FLOATS = {np.dtype(np.float32).itemsize: MPI.FLOAT, np.dtype(np.float64).itemsize: MPI.DOUBLE}
_COMPLEX = {8: MPI.C_FLOAT_COMPLEX, 16: MPI.C_DOUBLE_COMPLEX}
_EMULATED_NAMES = ("float16", "bfloat16")
_derived: list[MPI.Datatype] = []


def _blob(itemsize: int) -> MPI.Datatype:
    """A datatype of ``itemsize`` opaque bytes (a predefined one where the size allows)."""
    if itemsize in _UINTS:
        return _UINTS[itemsize]
    t = MPI.BYTE.Create_contiguous(itemsize).Commit()
    _derived.append(t)
    return t


def _build(dtype: np.dtype) -> DtypeInfo:
    if dtype.hasobject:
        raise TypeError(
            f"arrays of dtype {dtype} hold Python object references and cannot be sent as "
            "buffers; use all_gather_object / broadcast_object")
    if dtype.itemsize == 0:
        raise TypeError(f"dtype {dtype} has no fixed item size and cannot be sent as a buffer")
    kind, size = dtype.kind, dtype.itemsize
    if dtype.isnative and dtype.fields is None and dtype.subdtype is None:
        if kind == "b":
            return DtypeInfo(dtype, MPI.C_BOOL, BOOL)
        if kind == "i" and size in _INTS:
            return DtypeInfo(dtype, _INTS[size], INT)
        if kind == "u" and size in _UINTS:
            return DtypeInfo(dtype, _UINTS[size], INT)
        if kind == "f":
            if size in _FLOATS:
                return DtypeInfo(dtype, _FLOATS[size], FLOAT)
            if dtype == np.longdouble and MPI.LONG_DOUBLE != MPI.DATATYPE_NULL:
                return DtypeInfo(dtype, MPI.LONG_DOUBLE, FLOAT)
            if size == 2:
                return DtypeInfo(dtype, _blob(2), EMULATED)
        if kind == "c":
            if size in _COMPLEX:
                return DtypeInfo(dtype, _COMPLEX[size], COMPLEX)
            if dtype == np.clongdouble and MPI.C_LONG_DOUBLE_COMPLEX != MPI.DATATYPE_NULL:
                return DtypeInfo(dtype, MPI.C_LONG_DOUBLE_COMPLEX, COMPLEX)
        if kind == "V" and dtype.name in _EMULATED_NAMES:  # ml_dtypes.bfloat16
            return DtypeInfo(dtype, _blob(size), EMULATED)
    return DtypeInfo(dtype, _blob(size), OPAQUE)


_CACHE: dict[np.dtype, DtypeInfo] = {}


def dtype_info(dtype: np.dtype) -> DtypeInfo:
    """The (cached) :class:`DtypeInfo` of ``dtype``; TypeError for dtypes MPI cannot carry."""
    info = _CACHE.get(dtype)
    if info is None:
        info = _CACHE[dtype] = _build(np.dtype(dtype))
    return info
