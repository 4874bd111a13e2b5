"""The Array API standard's dtypes and its rules on them, shared by the namespace
(``sbpmpi.array_api``) and ``sm.linalg``: which dtypes an argument may name, how array
dtypes promote, and the dtype a sum accumulates in.
"""

from __future__ import annotations

from typing import Any

import numpy as np

__all__ = ["DTYPES", "dtype_arg", "promote", "sum_dtype"]

#: Every dtype of the standard, by name.
DTYPES: dict[str, np.dtype] = {n: np.dtype(n) for n in (
    "bool", "int8", "int16", "int32", "int64", "uint8", "uint16", "uint32", "uint64",
    "float32", "float64", "complex64", "complex128")}


def dtype_arg(dtype: Any, what: str = "dtype") -> np.dtype:
    """``dtype`` as one of the namespace's dtypes (TypeError otherwise)."""
    try:
        dt = np.dtype(dtype)
    except TypeError:
        dt = None
    if dt is None or str(dt) not in DTYPES or isinstance(dtype, str):
        raise TypeError(f"{what} must be a dtype of the namespace ({', '.join(DTYPES)}), "
                        f"got {dtype!r}")
    return dt


def promote(*dtypes: np.dtype) -> np.dtype:
    """The dtype arrays of ``dtypes`` promote to: NumPy's, but bool promotes with no other
    kind (the standard's table)."""
    kinds = {d.kind for d in dtypes}
    if "b" in kinds and len(kinds) > 1:
        raise TypeError(f"result_type: bool does not promote with "
                        f"{', '.join(map(str, dtypes))}")
    return np.result_type(*dtypes)


def sum_dtype(dtype: np.dtype, requested: Any = None) -> np.dtype:
    """The standard's default dtype of sum, prod and the cumulative ones over ``dtype``:
    integers widen to the default (u)int64, floats keep theirs; ``requested`` (checked
    by :func:`dtype_arg`) when given."""
    if requested is not None:
        return dtype_arg(requested)
    k = dtype.kind
    if k == "b" or k == "i":
        return np.dtype(np.int64)
    if k == "u":
        return np.dtype(np.uint64)
    return dtype
