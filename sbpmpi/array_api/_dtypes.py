"""Data types of the namespace (NumPy dtypes) and the data type functions.

``result_type`` and ``can_cast`` follow the standard's promotion table; mixed kinds the
standard leaves open (an integer and a float array, a signed and an unsigned 64-bit
integer) follow NumPy.
"""

from __future__ import annotations

import builtins
from typing import Any

import numpy as np

from .. import ops
from ..core.standard_dtypes import DTYPES, dtype_arg, promote
from ..tensor import GlobalTensor

__all__ = [
    "bool", "int8", "int16", "int32", "int64", "uint8", "uint16", "uint32", "uint64",
    "float32", "float64", "complex64", "complex128",
    "astype", "can_cast", "finfo", "iinfo", "isdtype", "result_type", "DTYPES", "dtype_arg",
]

bool = np.dtype("bool")  # noqa: A001
int8, int16, int32, int64 = (np.dtype(f"int{n}") for n in (8, 16, 32, 64))
uint8, uint16, uint32, uint64 = (np.dtype(f"uint{n}") for n in (8, 16, 32, 64))
float32, float64 = np.dtype("float32"), np.dtype("float64")
complex64, complex128 = np.dtype("complex64"), np.dtype("complex128")

#: isdtype's kinds: name -> the dtype kinds (NumPy's ``dtype.kind``) it covers.
KINDS: dict[str, str] = {
    "bool": "b", "signed integer": "i", "unsigned integer": "u", "integral": "iu",
    "real floating": "f", "complex floating": "c", "numeric": "iufc",
}


def isdtype(dtype: Any, kind: Any) -> Any:
    """Whether ``dtype`` is ``kind``: a dtype, a kind name (``"integral"``, ...) or a tuple."""
    dt = dtype_arg(dtype)
    if isinstance(kind, tuple):
        return any(isdtype(dt, k) for k in kind)
    if isinstance(kind, str):
        if kind not in KINDS:
            raise ValueError(f"isdtype: kind {kind!r} is not one of {', '.join(KINDS)}")
        return dt.kind in KINDS[kind]
    return dt == dtype_arg(kind, "kind")


def _dtype_of(x: Any) -> np.dtype | None:
    if isinstance(x, GlobalTensor):
        return x.dtype
    if isinstance(x, (int, float, complex)):
        return None  # a Python scalar: takes the other operands' dtype
    return dtype_arg(x, "result_type argument")


def result_type(*arrays_and_dtypes: Any) -> np.dtype:
    """The dtype of an operation on these arrays, dtypes and Python scalars."""
    if not arrays_and_dtypes:
        raise ValueError("result_type: at least one array or dtype is required")
    dts = [d for d in map(_dtype_of, arrays_and_dtypes) if d is not None]
    scalars = [x for x in arrays_and_dtypes if _dtype_of(x) is None]
    if not dts:
        raise ValueError("result_type: at least one array or dtype is required (got Python "
                         "scalars only)")
    out = promote(*dts)
    for s in scalars:
        out = _with_scalar(out, s)
    return out


def _with_scalar(dt: np.dtype, s: Any) -> np.dtype:
    """The standard's rule: a Python scalar takes the array's dtype, of a kind that holds it
    (a complex scalar makes a float array complex)."""
    if isinstance(s, builtins.bool):
        if dt.kind != "b" and dt.kind not in "iufc":
            raise TypeError(f"result_type: a Python bool does not combine with {dt}")
        return dt
    if isinstance(s, int):
        if dt.kind == "b":
            raise TypeError(f"result_type: a Python int does not combine with {dt}")
        return dt
    if isinstance(s, float):
        if dt.kind in "bui":
            raise TypeError(f"result_type: a Python float does not combine with {dt}")
        return dt
    if dt.kind == "f":
        return np.result_type(dt, np.complex64)
    if dt.kind != "c":
        raise TypeError(f"result_type: a Python complex does not combine with {dt}")
    return dt



def can_cast(from_: Any, to: Any, /) -> Any:
    """Whether ``from_`` (a dtype or an array) may become ``to`` without loss: as the
    promotion of :func:`result_type` (bool only to bool)."""
    src = from_.dtype if isinstance(from_, GlobalTensor) else dtype_arg(from_, "from_")
    dst = dtype_arg(to, "to")
    if src.kind == "b" or dst.kind == "b":
        return src == dst  # bool promotes with nothing
    return np.can_cast(src, dst, casting="safe")  # integers to floats: where NumPy promotes


def astype(x: GlobalTensor, dtype: Any, /, *, copy: Any = True, device: Any = None
           ) -> GlobalTensor:
    """``x`` cast to ``dtype`` (and moved to ``device``, when one is given)."""
    from ._device import to_device

    if not isinstance(x, GlobalTensor):
        raise TypeError(f"astype: x must be a global array, got {type(x).__name__}")
    dt = dtype_arg(dtype)
    out = x if dt == x.dtype and not copy else ops.astype(x, dt)
    return out if device is None else to_device(out, device)


class finfo_object:
    """Machine limits of a floating dtype (the standard's ``finfo`` fields)."""

    def __init__(self, dtype: np.dtype) -> None:
        info = np.finfo(dtype)
        self.bits = int(info.bits)
        self.eps = float(info.eps)
        self.max = float(info.max)
        self.min = float(info.min)
        self.smallest_normal = float(info.smallest_normal)
        self.dtype = np.dtype(info.dtype)

    def __repr__(self) -> str:
        return f"finfo(dtype={self.dtype}, bits={self.bits})"


class iinfo_object:
    """Limits of an integer dtype (the standard's ``iinfo`` fields)."""

    def __init__(self, dtype: np.dtype) -> None:
        info = np.iinfo(dtype)
        self.bits, self.max, self.min = int(info.bits), int(info.max), int(info.min)
        self.dtype = np.dtype(dtype)

    def __repr__(self) -> str:
        return f"iinfo(dtype={self.dtype}, bits={self.bits})"


def finfo(type: Any, /) -> finfo_object:  # noqa: A002
    """Limits of a floating dtype (or of an array's); complex dtypes give their parts'."""
    dt = type.dtype if isinstance(type, GlobalTensor) else dtype_arg(type, "type")
    if dt.kind not in "fc":
        raise TypeError(f"finfo: {dt} is not a floating dtype")
    return finfo_object(dt)


def iinfo(type: Any, /) -> iinfo_object:  # noqa: A002
    """Limits of an integer dtype (or of an array's)."""
    dt = type.dtype if isinstance(type, GlobalTensor) else dtype_arg(type, "type")
    if dt.kind not in "iu":
        raise TypeError(f"iinfo: {dt} is not an integer dtype")
    return iinfo_object(dt)
