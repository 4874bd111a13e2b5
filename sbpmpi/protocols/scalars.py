"""Python's protocols of GlobalTensor: ``bool(x)``, ``float(x)``, ``int(x)``,
``complex(x)``, ``operator.index(x)``, ``np.asarray(x)`` and ``iter(x)``, as NumPy answers
them (collective where they need the value)."""

from __future__ import annotations

import operator
from collections.abc import Iterator
from typing import Any

import numpy as np

from ..tensor import GlobalTensor

__all__ = ["to_bool", "to_scalar", "to_index", "array", "iterate"]


def _value(x: GlobalTensor) -> Any:
    return x.numpy().reshape(()).item()


def to_bool(x: GlobalTensor) -> bool:
    """``bool(x)`` as NumPy: one element -> its truth value (collective); else ValueError."""
    if x.size == 0:
        raise ValueError(f"The truth value of an empty global tensor (shape {x.shape}) is "
                         f"ambiguous. Use `x.size > 0` to check that a tensor is not empty.")
    if x.size > 1:
        raise ValueError(f"The truth value of a global tensor with more than one element "
                         f"(shape {x.shape}) is ambiguous. Use (x != 0).max() for any() or "
                         f"(x != 0).min() for all().")
    return bool(_value(x))


def to_scalar(x: GlobalTensor, kind: type) -> Any:
    """``float(x)``, ``int(x)``, ``complex(x)`` as NumPy: 0-d only (collective)."""
    if x.ndim != 0:
        raise TypeError(f"only 0-dimensional global tensors can be converted to Python "
                        f"scalars, got shape {x.shape} ({kind.__name__}(x)); use "
                        f"x.reshape(()) for a one-element tensor, or x.item()")
    return kind(_value(x))


def to_index(x: GlobalTensor) -> int:
    """``operator.index(x)`` as NumPy: a 0-d integer tensor only (collective)."""
    if x.ndim != 0 or x.dtype.kind not in "iu":
        raise TypeError(f"only integer scalar global tensors can be converted to a scalar "
                        f"index, got shape {x.shape} and dtype {x.dtype}")
    return operator.index(_value(x))


def array(x: GlobalTensor, dtype: Any = None, copy: Any = None) -> np.ndarray:
    """``np.asarray(x)``: the global value on every rank (collective); ``copy=False`` raises."""
    if copy is False:
        raise ValueError("np.asarray(x, copy=False): a GlobalTensor cannot be viewed as a NumPy "
                         "array without a copy (its value is spread over the ranks); use "
                         "x.numpy() (collective) or copy=None")
    a = x.numpy()
    return a if dtype is None or np.dtype(dtype) == a.dtype else a.astype(dtype)


def iterate(x: GlobalTensor) -> Iterator[GlobalTensor]:
    """``iter(x)``: ``x[0]``, ``x[1]``, ... as NumPy iterates over dim 0 (``x`` has a dim).

    Where no mesh axis splits dim 0 each item is a view of ``x`` (no communication). Where
    one does, the rows are gathered once on the first step (one conversion of dim 0's
    splits to broadcast, instead of one per item) and each item is a write-through copy of
    ``x[i]``: a write into it reaches ``x`` as a view's would."""
    from ..core.sbp import Split, broadcast

    if not any(isinstance(s, Split) and s.dim == 0 for s in x.sbp):
        for i in range(x.shape[0]):
            yield x[i]
        return
    rows = x.to_global(sbp=[broadcast if isinstance(s, Split) and s.dim == 0 else s
                            for s in x.sbp])
    for i in range(x.shape[0]):
        item = rows[i]
        item._mark_write_through(x, i)
        yield item
