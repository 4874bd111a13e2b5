"""The namespace's elementwise function of global arrays and Python scalars (the standard's
scalar promotion), on local shards through :func:`sbpmpi.ops.local.run_local`.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable
from types import ModuleType
from typing import Any

import numpy as np

from ..ops.call import shape_of, tensor_arg
from ..ops.elementwise import broadcast_matches
from ..ops.local import run_local
from ..tensor import GlobalTensor
from ._dtypes import result_type

__all__ = ["elementwise", "array_arg"]


def elementwise(name: str, f: Callable[..., Any], *args: Any,
                dtype: np.dtype | None = None, scalar_dtype: np.dtype | None = None
                ) -> GlobalTensor:
    """``f(xp, *args)`` elementwise with broadcasting, on global arrays and Python scalars;
    the result dtype is ``dtype``, else NumPy's for the promoted operands. Python scalars
    become ``scalar_dtype``, else the dtype the arguments promote to."""
    if not any(isinstance(a, GlobalTensor) for a in args):
        raise TypeError(f"{name}: at least one argument must be a global array")
    for a in args:
        if not isinstance(a, (GlobalTensor, int, float, complex, np.generic)):
            raise TypeError(f"{name}: arguments must be global arrays or Python scalars, got "
                            f"{type(a).__name__} {a!r}")
    shapes = [shape_of(a) for a in args]
    try:
        out_shape = tuple(int(n) for n in np.broadcast_shapes(*shapes))
    except ValueError:
        raise ValueError(f"{name}: shapes {', '.join(map(str, shapes))} cannot be broadcast "
                         f"together") from None
    # a Python scalar takes the arrays' dtype (the standard's rule), as a NumPy scalar
    common = result_type(*args) if scalar_dtype is None else scalar_dtype
    operands = [a if isinstance(a, GlobalTensor) else np.asarray(a).astype(common)[()]
                for a in args]
    if dtype is None:
        stand = [np.ones((), dtype=a.dtype) if isinstance(a, GlobalTensor) else a
                 for a in operands]
        with np.errstate(all="ignore"), warnings.catch_warnings():
            warnings.simplefilter("ignore")
            dtype = np.asarray(f(np, *stand)).dtype

    def kernel(xp: ModuleType, *local: Any) -> Any:
        return f(xp, *local)

    return run_local(name, operands, kernel, out_shape, np.dtype(dtype),
                     broadcast_matches(shapes, out_shape))


def array_arg(name: str, x: Any) -> GlobalTensor:
    """``x`` if it is a global array, else a TypeError naming ``name`` (the ops' one check,
    :func:`sbpmpi.ops.call.tensor_arg`)."""
    return tensor_arg(name, x)


