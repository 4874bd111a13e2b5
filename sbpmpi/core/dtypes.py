"""The floating dtypes sbpmpi names, and the facts about them every layer asks.

``float16`` is NumPy's; ``bfloat16`` is ``ml_dtypes.bfloat16`` (the type CuPy also accepts
when ``ml_dtypes`` is installed). NumPy reports bfloat16 as kind ``"V"``, so code that
asks "is this a real floating dtype" asks :func:`is_floating` here rather than
``dtype.kind == "f"``. The half-width dtypes (:data:`HALF`) are stored in half width
but summed in float32 (:func:`accumulation_dtype`), as every mixed-precision stack does.
"""

from __future__ import annotations

from typing import Any

import ml_dtypes
import numpy as np

__all__ = ["float16", "bfloat16", "float32", "float64", "HALF", "is_floating", "is_half",
           "accumulation_dtype", "eps", "dtype_name"]

float16: np.dtype = np.dtype(np.float16)
bfloat16: np.dtype = np.dtype(ml_dtypes.bfloat16)
float32: np.dtype = np.dtype(np.float32)
float64: np.dtype = np.dtype(np.float64)

#: The half-width floating dtypes: stored in 16 bits, accumulated in float32.
HALF: frozenset[np.dtype] = frozenset({float16, bfloat16})


def is_half(dtype: Any) -> bool:
    """Whether ``dtype`` is float16 or bfloat16."""
    try:
        return np.dtype(dtype) in HALF
    except TypeError:
        return False


def is_floating(dtype: Any) -> bool:
    """Whether ``dtype`` is a real floating dtype (bfloat16 included)."""
    dt = np.dtype(dtype)
    return dt.kind == "f" or dt == bfloat16


def accumulation_dtype(dtype: Any) -> np.dtype:
    """The dtype sums of ``dtype`` run in: float32 for the half-width dtypes, itself else."""
    dt = np.dtype(dtype)
    return float32 if dt in HALF else dt


def eps(dtype: Any) -> float:
    """The machine epsilon of a floating ``dtype`` (bfloat16: 2**-7)."""
    dt = np.dtype(dtype)
    if dt == bfloat16:
        return float(ml_dtypes.finfo(bfloat16).eps)
    return float(np.finfo(dt).eps)


def below_one(dtype: Any) -> Any:
    """The largest value of floating ``dtype`` below 1 (``1 - epsneg``), as a scalar of it."""
    dt = np.dtype(dtype)
    return np.asarray(1.0 - float(ml_dtypes.finfo(dt).epsneg)).astype(dt)[()]


def dtype_name(dtype: Any) -> str:
    """``"bfloat16"``, ``"float32"``, ...: the name messages use."""
    return np.dtype(dtype).name
