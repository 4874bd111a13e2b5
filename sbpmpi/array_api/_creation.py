"""Creation functions. ``device`` is a placement (default: every rank of the world); the
SBP is the namespace default (``sm.config.array_api_sbp``).

Constant arrays, ``arange`` and ``eye`` fill each rank's shard from global indices
(sbpmpi's creation functions: nothing is communicated); ``linspace``, ``eye``, ``tril``
and ``triu`` are elementwise functions of global index arrays.
"""

from __future__ import annotations

import math
from types import ModuleType
from typing import Any

import numpy as np

from .. import creation
from ..core.placement import Placement
from ..ops.local import default_sbp, index_along
from ..tensor import GlobalTensor
from ._device import device_arg, from_value, to_device
from ._dtypes import dtype_arg
from ._local import elementwise

__all__ = ["asarray", "zeros", "ones", "empty", "full", "zeros_like", "ones_like",
           "empty_like", "full_like", "arange", "linspace", "eye", "tril", "triu", "meshgrid",
           "from_dlpack"]


def _shape(shape: Any) -> tuple[int, ...]:
    items = (shape,) if isinstance(shape, (int, np.integer)) else tuple(shape)
    for n in items:
        if isinstance(n, (bool, np.bool_)) or not isinstance(n, (int, np.integer)):
            raise TypeError(f"shape entries must be ints, got {shape!r}")
        if n < 0:
            raise ValueError(f"shape {shape!r} has a negative size")
    return tuple(int(n) for n in items)


def _default_dtype(value: Any) -> np.dtype:
    if isinstance(value, (bool, np.bool_)):
        return np.dtype(np.bool_)
    if isinstance(value, (int, np.integer)):
        return np.dtype(np.int64)
    if isinstance(value, complex):
        return np.dtype(np.complex128)
    return np.dtype(np.float64)


def _full(shape: tuple[int, ...], value: Any, dtype: np.dtype, device: Placement
          ) -> GlobalTensor:
    return creation.full(shape, value, placement=device, sbp=default_sbp(len(shape), device),
                         dtype=dtype)


def full(shape: Any, fill_value: Any, *, dtype: Any = None, device: Any = None
         ) -> GlobalTensor:
    """An array of ``shape`` filled with ``fill_value`` (dtype from the value by default:
    bool, int64, float64 or complex128)."""
    if not isinstance(fill_value, (bool, int, float, complex, np.generic)):
        raise TypeError(f"full: fill_value must be a Python scalar, got {fill_value!r}")
    dt = _default_dtype(fill_value) if dtype is None else dtype_arg(dtype)
    return _full(_shape(shape), fill_value, dt, device_arg(device))


def zeros(shape: Any, *, dtype: Any = None, device: Any = None) -> GlobalTensor:
    """An array of zeros (float64 by default)."""
    dt = np.dtype(np.float64) if dtype is None else dtype_arg(dtype)
    return _full(_shape(shape), 0, dt, device_arg(device))


def ones(shape: Any, *, dtype: Any = None, device: Any = None) -> GlobalTensor:
    """An array of ones (float64 by default)."""
    dt = np.dtype(np.float64) if dtype is None else dtype_arg(dtype)
    return _full(_shape(shape), 1, dt, device_arg(device))


def empty(shape: Any, *, dtype: Any = None, device: Any = None) -> GlobalTensor:
    """An array of ``shape`` (its values are zeros here)."""
    return zeros(shape, dtype=dtype, device=device)


def _like(name: str, x: Any, value: Any, dtype: Any, device: Any) -> GlobalTensor:
    if not isinstance(x, GlobalTensor):
        raise TypeError(f"{name}: x must be a global array, got {type(x).__name__}")
    dt = x.dtype if dtype is None else dtype_arg(dtype)
    return _full(x.shape, value, dt, x.placement if device is None else device_arg(device))


def zeros_like(x: GlobalTensor, /, *, dtype: Any = None, device: Any = None) -> GlobalTensor:
    """Zeros of the shape of ``x`` (its dtype and device by default)."""
    return _like("zeros_like", x, 0, dtype, device)


def ones_like(x: GlobalTensor, /, *, dtype: Any = None, device: Any = None) -> GlobalTensor:
    """Ones of the shape of ``x`` (its dtype and device by default)."""
    return _like("ones_like", x, 1, dtype, device)


def empty_like(x: GlobalTensor, /, *, dtype: Any = None, device: Any = None) -> GlobalTensor:
    """An array of the shape of ``x`` (zeros here)."""
    return _like("empty_like", x, 0, dtype, device)


def full_like(x: GlobalTensor, /, fill_value: Any, *, dtype: Any = None, device: Any = None
              ) -> GlobalTensor:
    """``fill_value`` in the shape of ``x`` (its dtype and device by default)."""
    return _like("full_like", x, fill_value, dtype, device)


def asarray(obj: Any, /, *, dtype: Any = None, device: Any = None, copy: Any = None
            ) -> GlobalTensor:
    """A global array of ``obj``: a global array (cast and moved as asked), or a value the
    same on every rank (a Python scalar, a nested sequence, a NumPy array or any object
    NumPy converts), laid out with the namespace default."""
    dt = None if dtype is None else dtype_arg(dtype)
    if isinstance(obj, GlobalTensor):
        if copy is False and dt is not None and dt != obj.dtype:
            raise ValueError("asarray: copy=False but casting to another dtype needs a copy")
        out = obj if dt is None or dt == obj.dtype else creation_astype(obj, dt)
        if device is not None and device_arg(device) != obj.placement:
            if copy is False:
                raise ValueError("asarray: copy=False but moving to another device copies")
            out = to_device(out, device)
        if copy and out is obj:
            out = creation_astype(obj, obj.dtype)
        return out
    if copy is False and not isinstance(obj, np.ndarray):
        raise ValueError("asarray: copy=False cannot make a global array of "
                         f"{type(obj).__name__} without a copy")
    if dt is None and isinstance(obj, (bool, int, float, complex)):
        dt = _default_dtype(obj)
    if dt is None and isinstance(obj, (list, tuple)):
        value = np.asarray(obj)
        if value.dtype.kind == "f":
            value = value.astype(np.float64)
    else:
        value = np.asarray(obj, dtype=dt)
    if value.dtype == object or str(value.dtype) not in ("bool",) and \
            value.dtype.kind not in "biufc":
        raise TypeError(f"asarray: cannot make a global array of {type(obj).__name__} "
                        f"(dtype {value.dtype})")
    return from_value(value if dt is None else value.astype(dt), device_arg(device))


def creation_astype(x: GlobalTensor, dt: np.dtype) -> GlobalTensor:
    """A new array: ``x`` cast to ``dt``."""
    from .. import ops

    return ops.astype(x, dt)  # type: ignore[no-any-return]


def from_dlpack(x: Any, /, *, device: Any = None, copy: Any = None) -> GlobalTensor:
    """A global array of a DLPack-capable array (the same on every rank)."""
    if isinstance(x, GlobalTensor):
        return asarray(x, device=device, copy=copy)
    return asarray(np.from_dlpack(x), device=device, copy=copy)


def arange(start: Any, /, stop: Any = None, step: Any = 1, *, dtype: Any = None,
           device: Any = None) -> GlobalTensor:
    """``start, start + step, ...`` below ``stop`` (int64 for int arguments, else
    float64)."""
    if stop is None:
        start, stop = 0, start
    ints = all(isinstance(v, (int, np.integer)) and not isinstance(v, bool)
               for v in (start, stop, step))
    dt = (np.dtype(np.int64) if ints else np.dtype(np.float64)) if dtype is None \
        else dtype_arg(dtype)
    if step == 0:
        raise ValueError("arange: step must not be zero")
    n = max(0, math.ceil((stop - start) / step))
    dev = device_arg(device)
    idx = creation.arange(n, placement=dev, sbp=default_sbp(1, dev), dtype=np.int64)
    # NumPy's arithmetic: start + i * (the first step taken), in the result dtype
    first = np.asarray(start, dtype=dt)
    delta = np.asarray(np.asarray(start + step, dtype=dt) - first)

    def kernel(xp: ModuleType, i: Any) -> Any:
        return first + i.astype(dt) * delta

    return elementwise("arange", kernel, idx, dtype=dt)


def linspace(start: Any, stop: Any, /, num: int, *, dtype: Any = None, device: Any = None,
             endpoint: bool = True) -> GlobalTensor:
    """``num`` evenly spaced values from ``start`` to ``stop`` (NumPy's arithmetic)."""
    if isinstance(num, (bool, np.bool_)) or not isinstance(num, (int, np.integer)) or num < 0:
        raise ValueError(f"linspace: num must be a non-negative int, got {num!r}")
    cplx = any(isinstance(v, complex) for v in (start, stop))
    dt = (np.dtype(np.complex128) if cplx else np.dtype(np.float64)) if dtype is None \
        else dtype_arg(dtype)
    dev = device_arg(device)
    idx = creation.arange(num, placement=dev, sbp=default_sbp(1, dev), dtype=np.int64)
    div = (num - 1) if endpoint else num
    work = np.result_type(dt, np.float64)
    delta = np.asarray(stop, dtype=work) - np.asarray(start, dtype=work)
    step = delta / div if div > 0 else None

    def kernel(xp: ModuleType, i: Any) -> Any:
        y = i.astype(work)
        if step is None or step == 0:
            y = y / div * delta if div > 0 else y * delta
        else:
            y = y * step
        y = y + xp.asarray(start, dtype=work)
        if endpoint and num > 1:
            y = xp.where(i == num - 1, xp.asarray(stop, dtype=work), y)
        return y

    return elementwise("linspace", kernel, idx, dtype=dt)


def eye(n_rows: int, n_cols: int | None = None, /, *, k: int = 0, dtype: Any = None,
        device: Any = None) -> GlobalTensor:
    """Ones on the ``k``-th diagonal, zeros elsewhere (float64 by default)."""
    m = n_rows if n_cols is None else n_cols
    dt = np.dtype(np.float64) if dtype is None else dtype_arg(dtype)
    dev = device_arg(device)
    return elementwise("eye", lambda xp, r, c: (c - r == k), index_along(n_rows, dev, True),
                       index_along(m, dev, False), dtype=dt)


def _triangle(name: str, x: GlobalTensor, k: int, lower: bool) -> GlobalTensor:
    if not isinstance(x, GlobalTensor) or x.ndim < 2:
        raise ValueError(f"{name}: x must be a global array of at least 2 dims")
    r = index_along(x.shape[-2], x.placement, True)
    c = index_along(x.shape[-1], x.placement, False)

    def kernel(xp: ModuleType, a: Any, i: Any, j: Any) -> Any:
        keep = (j - i <= k) if lower else (j - i >= k)
        return xp.where(keep, a, xp.zeros((), dtype=a.dtype))

    return elementwise(name, kernel, x, r, c, dtype=x.dtype)


def tril(x: GlobalTensor, /, *, k: int = 0) -> GlobalTensor:
    """``x`` with the elements above the ``k``-th diagonal zeroed."""
    return _triangle("tril", x, k, lower=True)


def triu(x: GlobalTensor, /, *, k: int = 0) -> GlobalTensor:
    """``x`` with the elements below the ``k``-th diagonal zeroed."""
    return _triangle("triu", x, k, lower=False)


def meshgrid(*arrays: GlobalTensor, indexing: str = "xy") -> list[GlobalTensor]:
    """Coordinate arrays from 1-D arrays (``indexing`` "xy" or "ij")."""
    from ._manipulation import broadcast_to, reshape

    if indexing not in ("xy", "ij"):
        raise ValueError(f"meshgrid: indexing must be 'xy' or 'ij', got {indexing!r}")
    for a in arrays:
        if not isinstance(a, GlobalTensor) or a.ndim != 1:
            raise ValueError("meshgrid: arrays must be 1-D global arrays")
    dts = {a.dtype for a in arrays}
    if len(dts) > 1:
        raise ValueError(f"meshgrid: arrays must have one dtype, got {sorted(map(str, dts))}")
    n = len(arrays)
    sizes = [a.shape[0] for a in arrays]
    if indexing == "xy" and n > 1:
        sizes[0], sizes[1] = sizes[1], sizes[0]
    out = []
    for i, a in enumerate(arrays):
        pos = i
        if indexing == "xy" and n > 1 and i < 2:
            pos = 1 - i
        shape = tuple(a.shape[0] if d == pos else 1 for d in range(n))
        out.append(broadcast_to(reshape(a, shape), tuple(sizes)))
    return out
