"""The floating dtypes sbpmpi names, and the facts about them every layer asks.

``float16`` is NumPy's; ``bfloat16`` is ``ml_dtypes.bfloat16`` (the type CuPy also accepts
when ``ml_dtypes`` is installed). NumPy reports bfloat16 as kind ``"V"``, so code that
asks "is this a real floating dtype" asks :func:`is_floating` here rather than
``dtype.kind == "f"``. The half-width dtypes (:data:`HALF`) are stored in half width
but summed in float32 (:func:`accumulation_dtype`), as every mixed-precision stack does.

``ml_dtypes`` is imported on first use, not with this module: its extension takes 0.4-4 s
to load, which every rank of every job would pay at ``import sbpmpi``. Nothing here loads
it to answer a question about an ordinary dtype: a bfloat16 dtype is recognised by its
kind and name (it can only exist once ``ml_dtypes`` is loaded), and ``bfloat16`` itself
(this module's attribute, ``sm.bfloat16``) or a name NumPy does not know yet
(:func:`as_dtype` of ``"bfloat16"``) loads it.
"""

from __future__ import annotations

import importlib
import sys
from collections.abc import Iterator, Set
from types import ModuleType
from typing import Any

import numpy as np

__all__ = ["float16", "bfloat16", "float32", "float64", "HALF", "is_floating", "is_half",
           "is_bfloat16", "as_dtype", "descr_to_dtype", "accumulation_dtype", "eps",
           "dtype_name"]

float16: np.dtype = np.dtype(np.float16)
float32: np.dtype = np.dtype(np.float32)
float64: np.dtype = np.dtype(np.float64)
bfloat16: np.dtype  # ml_dtypes.bfloat16's dtype, made on first access (__getattr__ below)


def ml_dtypes() -> ModuleType:
    """The ``ml_dtypes`` module, imported on the first call (it registers bfloat16 and
    its other types' names with NumPy)."""
    return importlib.import_module("ml_dtypes")


def __getattr__(name: str) -> Any:
    if name == "bfloat16":
        value = np.dtype(ml_dtypes().bfloat16)
        globals()[name] = value  # later lookups find it without this function
        return value
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def is_bfloat16(dtype: Any) -> bool:
    """Whether ``dtype`` (a NumPy dtype) is ``ml_dtypes.bfloat16``, without importing it:
    NumPy gives ml_dtypes' types kind ``"V"`` and their own names."""
    return (isinstance(dtype, np.dtype) and dtype.kind == "V" and dtype.name == "bfloat16"
            and dtype.isnative)


def _is_half_dtype(dt: np.dtype) -> bool:
    return dt == float16 or is_bfloat16(dt)


class HalfWidth(Set[np.dtype]):
    """The set of half-width floating dtypes, float16 and bfloat16 (:data:`HALF`).

    ``dtype in HALF`` answers without importing ``ml_dtypes`` (as a frozenset of the two
    dtypes would need); like a frozenset of dtypes it holds only ``np.dtype`` objects, so
    ``None`` or a Python type is not in it. Iterating it loads ``ml_dtypes``."""

    def __contains__(self, dtype: object) -> bool:
        return isinstance(dtype, np.dtype) and _is_half_dtype(dtype)

    def __iter__(self) -> Iterator[np.dtype]:
        return iter((float16, __getattr__("bfloat16")))

    def __len__(self) -> int:
        return 2

    def __repr__(self) -> str:
        return "HalfWidth({float16, bfloat16})"


#: The half-width floating dtypes: stored in 16 bits, accumulated in float32.
HALF: HalfWidth = HalfWidth()


def as_dtype(dtype: Any) -> np.dtype:
    """``np.dtype(dtype)``, also for a name ``ml_dtypes`` registers (``"bfloat16"``):
    NumPy knows those names only once ``ml_dtypes`` is imported, so a name NumPy does not
    understand imports it and is read again. TypeError (NumPy's) if it names no dtype."""
    if isinstance(dtype, np.dtype):
        return dtype
    try:
        return np.dtype(dtype)
    except TypeError:
        if not isinstance(dtype, str) or "ml_dtypes" in sys.modules:
            raise
    ml_dtypes()
    return np.dtype(dtype)  # NumPy's TypeError again if ml_dtypes has no such name either


def descr_to_dtype(descr: Any) -> np.dtype:
    """``numpy.lib.format.descr_to_dtype`` (the dtype a ``.npy`` header's descr names),
    also for the names ``ml_dtypes`` registers (``'bfloat16'``, as :func:`as_dtype`)."""
    from numpy.lib import format as npy_format

    try:
        return npy_format.descr_to_dtype(descr)
    except TypeError:
        if not isinstance(descr, (str, list)) or "ml_dtypes" in sys.modules:
            raise
    ml_dtypes()
    return npy_format.descr_to_dtype(descr)  # type: ignore[arg-type]  # str or fields


def is_half(dtype: Any) -> bool:
    """Whether ``dtype`` is float16 or bfloat16."""
    try:
        return _is_half_dtype(as_dtype(dtype))
    except TypeError:
        return False


def is_floating(dtype: Any) -> bool:
    """Whether ``dtype`` is a real floating dtype (bfloat16 included)."""
    dt = as_dtype(dtype)
    return dt.kind == "f" or is_bfloat16(dt)


def accumulation_dtype(dtype: Any) -> np.dtype:
    """The dtype sums of ``dtype`` run in: float32 for the half-width dtypes, itself else."""
    dt = as_dtype(dtype)
    return float32 if _is_half_dtype(dt) else dt


def _finfo(dt: np.dtype) -> Any:
    # a floating dtype of kind "V" is one of ml_dtypes' (loaded, since it exists)
    return ml_dtypes().finfo(dt) if dt.kind == "V" else np.finfo(dt)


def eps(dtype: Any) -> float:
    """The machine epsilon of a floating ``dtype`` (bfloat16: 2**-7)."""
    return float(_finfo(as_dtype(dtype)).eps)


def below_one(dtype: Any) -> Any:
    """The largest value of floating ``dtype`` below 1 (``1 - epsneg``), as a scalar of it."""
    dt = as_dtype(dtype)
    return np.asarray(1.0 - float(_finfo(dt).epsneg)).astype(dt)[()]


def dtype_name(dtype: Any) -> str:
    """``"bfloat16"``, ``"float32"``, ...: the name messages use."""
    return as_dtype(dtype).name
