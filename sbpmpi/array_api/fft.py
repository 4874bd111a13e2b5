"""The ``fft`` extension of the Array API standard (2024.12): ``sbpmpi.array_api.fft``.

Distributed algorithm (the pencil, or transpose, method). A transform needs the axes it
transforms whole on each rank. Axes no mesh axis splits are transformed first, locally;
then each mesh axis that splits an axis still to transform moves its split to another
axis (an all-to-all through ``to_global``, that is ``runtime.redistribute``: ``S(a)`` to
``S(b)``), and the rest is transformed locally. The kernels are the backend's own
(``numpy.fft`` on CPU, ``cupy.fft`` on CUDA: the module a kernel receives as ``xp``).

Layout of a result:

- it keeps the input's SBP where no split had to move; a split that moved stays on the
  axis it moved to (the transposed layout of the pencil method: ``fft2`` of an array
  split on axis 0 comes back split on axis 1). The target is an axis not transformed
  later, not split already, and the largest such;
- a 1-D array (or a mesh axis with no other axis to move to) is gathered: every rank
  holds the whole transformed axis, then the result takes the input's split again (a
  local slice, nothing is sent);
- partial inputs are reduced first.

``fftfreq`` and ``rfftfreq`` create arrays (``device`` is the placement; the layout is the
namespace default); ``fftshift`` and ``ifftshift`` are :func:`~sbpmpi.array_api.roll`
along axes held whole as above.
"""

from __future__ import annotations

from collections.abc import Sequence
from types import ModuleType
from typing import Any, NamedTuple

import numpy as np

from ..core.sbp import SBP, Split, broadcast
from ..ops.local import axis_op
from ..tensor import GlobalTensor
from ._device import from_value
from ._dtypes import dtype_arg
from ._local import array_arg
from ._manipulation import roll

__all__ = ["fft", "ifft", "fftn", "ifftn", "rfft", "irfft", "rfftn", "irfftn", "hfft", "ihfft",
           "fftfreq", "rfftfreq", "fftshift", "ifftshift"]

NORMS = ("backward", "ortho", "forward")


class Kind(NamedTuple):
    """A one-axis transform: the input dtypes it takes and the output length of ``n``."""

    takes: str  # "complex": floating input, complex output; "real": real input only
    out: str  # "complex" or "real"
    halves: bool  # the output has n // 2 + 1 points (rfft, ihfft)


#: The backend's transforms by name (``xp.fft.<name>``).
KINDS: dict[str, Kind] = {
    "fft": Kind("complex", "complex", False),
    "ifft": Kind("complex", "complex", False),
    "rfft": Kind("real", "complex", True),
    "ihfft": Kind("real", "complex", True),
    "irfft": Kind("complex", "real", False),
    "hfft": Kind("complex", "real", False),
}


class AxisLength(NamedTuple):
    """An axis to transform and the number of input points ``n`` to use along it."""

    axis: int
    n: int


def _x(name: str, x: Any) -> GlobalTensor:
    if array_arg(name, x).ndim == 0:
        raise ValueError(f"{name}: x must have at least one dim, got a 0-d array")
    return x


def _out_dtype(name: str, x: GlobalTensor, kind: Kind) -> np.dtype:
    """Complex64/float32 in single precision, complex128/float64 in double."""
    k = x.dtype.kind
    if kind.takes == "real" and k != "f":
        raise TypeError(f"{name}: x must have a real floating-point dtype, got {x.dtype}")
    if k not in "fc":
        raise TypeError(f"{name}: x must have a floating-point dtype, got {x.dtype}")
    single = x.dtype in (np.dtype(np.float32), np.dtype(np.complex64))
    if kind.out == "complex":
        return np.dtype(np.complex64 if single else np.complex128)
    return np.dtype(np.float32 if single else np.float64)


def _norm(name: str, norm: Any) -> str:
    if norm not in NORMS:
        raise ValueError(f"{name}: norm must be one of {', '.join(map(repr, NORMS))}, got "
                         f"{norm!r}")
    return str(norm)


def _axis(name: str, axis: Any, ndim: int, what: str = "axis") -> int:
    if isinstance(axis, (bool, np.bool_)) or not isinstance(axis, (int, np.integer)):
        raise TypeError(f"{name}: {what} must be an int, got {axis!r}")
    if not -ndim <= axis < ndim:
        raise IndexError(f"{name}: {what} {axis} is out of range for an array of {ndim} dims")
    return int(axis) % ndim


def _length(name: str, n: Any, default: int, what: str = "n") -> int:
    """``n`` checked (None or -1: ``default``); at least one point."""
    if n is None:
        n = default
    if isinstance(n, (bool, np.bool_)) or not isinstance(n, (int, np.integer)):
        raise TypeError(f"{name}: {what} must be an int or None, got {n!r}")
    if n == -1:
        n = default
    if n < 1:
        raise ValueError(f"{name}: {what}={n} must be at least 1 (the number of points of "
                         f"the transform)")
    return int(n)


def _axes(name: str, axes: Any, ndim: int, what: str = "axes") -> tuple[int, ...]:
    """``axes`` (None: all; an int or a sequence of ints) as non-negative axes, in order."""
    if axes is None:
        return tuple(range(ndim))
    items: Sequence[Any] = (axes,) if isinstance(axes, (int, np.integer)) else axes
    if not isinstance(items, Sequence):
        raise TypeError(f"{name}: {what} must be a sequence of ints or None, got {axes!r}")
    out = tuple(_axis(name, a, ndim, what) for a in items)
    if len(set(out)) != len(out):
        raise ValueError(f"{name}: {what} {axes!r} names an axis more than once")
    return out


def _out_length(kind: Kind, n: int) -> int:
    return n // 2 + 1 if kind.halves else n


def _holding_whole(x: GlobalTensor, axes: set[int], later: set[int]) -> GlobalTensor:
    """``x`` with no mesh axis splitting one of ``axes``: each such split moves to another
    axis (one not in ``later``, not split already, the largest), or is gathered when there
    is none (collective; nothing moves when no split is in the way)."""
    sbp = list(x.sbp)
    if not any(isinstance(s, Split) and s.dim in axes for s in sbp):
        return x
    taken = {s.dim for s in sbp if isinstance(s, Split) and s.dim not in axes}
    for i, s in enumerate(sbp):
        if not (isinstance(s, Split) and s.dim in axes):
            continue
        free = [d for d in range(x.ndim) if d not in axes and d not in taken]
        if free:
            mesh = x.placement.hierarchy[i]
            target = min(free, key=lambda d: (d in later, x.shape[d] < mesh, -x.shape[d], d))
            sbp[i] = Split(target)
            taken.add(target)
        else:
            sbp[i] = broadcast
    return x.to_global(sbp=tuple(sbp))


def _split_again(out: GlobalTensor, sbp: tuple[SBP, ...]) -> GlobalTensor:
    """``out`` with the input's splits back on the mesh axes that had to gather (a local
    slice of a broadcast value: nothing is sent)."""
    if out.placement.ndim != len(sbp):
        return out
    back = tuple(s if o == broadcast and isinstance(s, Split) else o
                 for s, o in zip(sbp, out.sbp))
    return out if back == tuple(out.sbp) else out.to_global(sbp=back)


def _step(name: str, x: GlobalTensor, kind_name: str, group: Sequence[AxisLength],
          later: set[int], norm: str, dtype: np.dtype) -> GlobalTensor:
    """One local transform of the axes ``group`` (held whole on each rank first)."""
    kind = KINDS[kind_name]
    axes = tuple(g.axis for g in group)
    x = _holding_whole(x, set(axes), later)
    shape = list(x.shape)
    for g in group:
        shape[g.axis] = _out_length(kind, g.n)

    def kernel(xp: ModuleType, a: Any) -> Any:
        local = list(a.shape)
        for g in group:
            local[g.axis] = _out_length(kind, g.n)
        if a.size == 0:  # an empty shard (an uneven split), or nothing to transform
            return xp.zeros(tuple(local), dtype=dtype)
        if len(group) > 1:  # only fft and ifft take several axes at once
            f = xp.fft.fftn if kind_name == "fft" else xp.fft.ifftn
            return f(a, s=tuple(g.n for g in group), axes=axes, norm=norm)
        (g,) = group
        return getattr(xp.fft, kind_name)(a, n=g.n, axis=g.axis, norm=norm)

    return axis_op(name, x, axes, kernel, tuple(shape), dtype,
                   {d: d for d in range(x.ndim) if d not in axes})


def _transform(name: str, x: GlobalTensor, kind_name: str, todo: Sequence[AxisLength],
               norm: str, dtype: np.dtype, after: frozenset[int] = frozenset()
               ) -> GlobalTensor:
    """Transform the axes ``todo`` (any order: fft and ifft are separable), the axes held
    whole first, then the others after their splits moved (not to ``after``: axes the
    caller transforms next)."""
    remaining = list(todo)
    while remaining:
        split_dims = {s.dim for s in x.sbp if isinstance(s, Split)}
        group = [g for g in remaining if g.axis not in split_dims] or remaining
        remaining = [g for g in remaining if g not in group]
        x = _step(name, x, kind_name, group, {g.axis for g in remaining} | after, norm, dtype)
    return x


def _one_axis(name: str, kind_name: str, x: Any, n: Any, axis: Any, norm: Any
              ) -> GlobalTensor:
    _x(name, x)
    kind = KINDS[kind_name]
    dtype = _out_dtype(name, x, kind)
    d = _axis(name, axis, x.ndim)
    default = 2 * (x.shape[d] - 1) if kind.out == "real" else x.shape[d]
    length = _length(name, n, default)
    out = _step(name, x, kind_name, [AxisLength(d, length)], set(), _norm(name, norm), dtype)
    return _split_again(out, x.sbp)


def fft(x: GlobalTensor, /, *, n: int | None = None, axis: int = -1,
        norm: str = "backward") -> GlobalTensor:
    """The one-dimensional discrete Fourier transform along ``axis`` (``n`` points:
    trimmed or zero-padded; complex output of the input's precision)."""
    return _one_axis("fft", "fft", x, n, axis, norm)


def ifft(x: GlobalTensor, /, *, n: int | None = None, axis: int = -1,
         norm: str = "backward") -> GlobalTensor:
    """The one-dimensional inverse discrete Fourier transform along ``axis``."""
    return _one_axis("ifft", "ifft", x, n, axis, norm)


def rfft(x: GlobalTensor, /, *, n: int | None = None, axis: int = -1,
         norm: str = "backward") -> GlobalTensor:
    """The transform of a real ``x`` along ``axis``: ``n // 2 + 1`` complex points."""
    return _one_axis("rfft", "rfft", x, n, axis, norm)


def irfft(x: GlobalTensor, /, *, n: int | None = None, axis: int = -1,
          norm: str = "backward") -> GlobalTensor:
    """The inverse of :func:`rfft`: ``n`` real points (default ``2 * (m - 1)`` for ``m``
    input points)."""
    return _one_axis("irfft", "irfft", x, n, axis, norm)


def hfft(x: GlobalTensor, /, *, n: int | None = None, axis: int = -1,
         norm: str = "backward") -> GlobalTensor:
    """The transform of a Hermitian-symmetric signal (given by its first half): ``n`` real
    points (default ``2 * (m - 1)``)."""
    return _one_axis("hfft", "hfft", x, n, axis, norm)


def ihfft(x: GlobalTensor, /, *, n: int | None = None, axis: int = -1,
          norm: str = "backward") -> GlobalTensor:
    """The inverse of :func:`hfft` for a real ``x``: ``n // 2 + 1`` complex points."""
    return _one_axis("ihfft", "ihfft", x, n, axis, norm)


def _axes_lengths(name: str, x: GlobalTensor, s: Any, axes: Any, last_real: bool
                  ) -> list[AxisLength]:
    """``s`` and ``axes`` checked as (axis, input points) pairs; ``last_real``: the last
    axis gives real output (its default is ``2 * (m - 1)``)."""
    if s is not None and axes is None:
        raise ValueError(f"{name}: s={s!r} needs axes (the standard asks for both)")
    ax = _axes(name, axes, x.ndim)
    if not ax:
        raise ValueError(f"{name}: axes must name at least one axis")
    if s is None:
        sizes: list[Any] = [None] * len(ax)
    else:
        if not isinstance(s, Sequence):
            raise TypeError(f"{name}: s must be a sequence of ints or None, got {s!r}")
        sizes = list(s)
        if len(sizes) != len(ax):
            raise ValueError(f"{name}: s={s!r} and axes={axes!r} must have the same length")
    out = []
    for i, (a, n) in enumerate(zip(ax, sizes)):
        default = 2 * (x.shape[a] - 1) if last_real and i == len(ax) - 1 else x.shape[a]
        out.append(AxisLength(a, _length(name, n, default, f"s[{i}]")))
    return out


def _n_axes(name: str, kind_name: str, x: Any, s: Any, axes: Any, norm: Any) -> GlobalTensor:
    _x(name, x)
    dtype = _out_dtype(name, x, KINDS[kind_name])
    todo = _axes_lengths(name, x, s, axes, last_real=False)
    return _split_again(_transform(name, x, kind_name, todo, _norm(name, norm), dtype), x.sbp)


def fftn(x: GlobalTensor, /, *, s: Sequence[int] | None = None,
         axes: Sequence[int] | None = None, norm: str = "backward") -> GlobalTensor:
    """The n-dimensional discrete Fourier transform over ``axes`` (all by default) with
    ``s[i]`` points along ``axes[i]``."""
    return _n_axes("fftn", "fft", x, s, axes, norm)


def ifftn(x: GlobalTensor, /, *, s: Sequence[int] | None = None,
          axes: Sequence[int] | None = None, norm: str = "backward") -> GlobalTensor:
    """The n-dimensional inverse discrete Fourier transform."""
    return _n_axes("ifftn", "ifft", x, s, axes, norm)


def rfftn(x: GlobalTensor, /, *, s: Sequence[int] | None = None,
          axes: Sequence[int] | None = None, norm: str = "backward") -> GlobalTensor:
    """The n-dimensional transform of a real ``x``: :func:`rfft` along the last of
    ``axes``, then :func:`fftn` along the others."""
    _x("rfftn", x)
    dtype = _out_dtype("rfftn", x, KINDS["rfft"])
    todo = _axes_lengths("rfftn", x, s, axes, last_real=False)
    nrm = _norm("rfftn", norm)
    rest = {g.axis for g in todo[:-1]}
    half = _step("rfftn", x, "rfft", todo[-1:], rest, nrm, dtype)
    out = _transform("rfftn", half, "fft", todo[:-1], nrm, dtype)
    return _split_again(out, x.sbp)


def irfftn(x: GlobalTensor, /, *, s: Sequence[int] | None = None,
           axes: Sequence[int] | None = None, norm: str = "backward") -> GlobalTensor:
    """The inverse of :func:`rfftn`: :func:`ifftn` along all of ``axes`` but the last,
    then :func:`irfft` along the last (``s[-1]`` real points, default ``2 * (m - 1)``)."""
    _x("irfftn", x)
    dtype = _out_dtype("irfftn", x, KINDS["irfft"])
    todo = _axes_lengths("irfftn", x, s, axes, last_real=True)
    nrm = _norm("irfftn", norm)
    complex_dtype = np.result_type(dtype, np.complex64)
    mixed = _transform("irfftn", x, "ifft", todo[:-1], nrm, complex_dtype,
                       frozenset({todo[-1].axis}))
    out = _step("irfftn", mixed, "irfft", todo[-1:], set(), nrm, dtype)
    return _split_again(out, x.sbp)


def _freq_args(name: str, n: Any, d: Any, dtype: Any) -> tuple[int, float, np.dtype]:
    if isinstance(n, (bool, np.bool_)) or not isinstance(n, (int, np.integer)):
        raise TypeError(f"{name}: n must be an int, got {n!r}")
    if n < 1:
        raise ValueError(f"{name}: n={n} must be at least 1")
    if isinstance(d, (bool, np.bool_)) or not isinstance(d, (int, float, np.integer,
                                                              np.floating)):
        raise TypeError(f"{name}: d must be a float, got {d!r}")
    dt = np.dtype(np.float64) if dtype is None else dtype_arg(dtype)
    if dt.kind != "f":
        raise ValueError(f"{name}: dtype must be a real floating-point dtype, got {dt}")
    return int(n), float(d), dt


def fftfreq(n: int, /, *, d: float = 1.0, dtype: Any = None, device: Any = None
            ) -> GlobalTensor:
    """The sample frequencies of an ``n``-point transform with spacing ``d`` (float64 by
    default), on ``device`` with the namespace's default layout (nothing is sent)."""
    size, spacing, dt = _freq_args("fftfreq", n, d, dtype)
    return from_value(np.fft.fftfreq(size, spacing).astype(dt), device)


def rfftfreq(n: int, /, *, d: float = 1.0, dtype: Any = None, device: Any = None
             ) -> GlobalTensor:
    """The ``n // 2 + 1`` non-negative sample frequencies of :func:`rfft`."""
    size, spacing, dt = _freq_args("rfftfreq", n, d, dtype)
    return from_value(np.fft.rfftfreq(size, spacing).astype(dt), device)


def _shift(name: str, x: Any, axes: Any, inverse: bool) -> GlobalTensor:
    _x(name, x)
    ax = _axes(name, axes, x.ndim)
    if not ax:
        return x
    shift = tuple(-(x.shape[a] // 2) if inverse else x.shape[a] // 2 for a in ax)
    whole = _holding_whole(x, set(ax), set())
    return _split_again(roll(whole, shift, axis=ax), x.sbp)


def fftshift(x: GlobalTensor, /, *, axes: int | Sequence[int] | None = None
             ) -> GlobalTensor:
    """``x`` with the zero frequency moved to the center along ``axes`` (all by default)."""
    return _shift("fftshift", x, axes, inverse=False)


def ifftshift(x: GlobalTensor, /, *, axes: int | Sequence[int] | None = None
              ) -> GlobalTensor:
    """The inverse of :func:`fftshift`."""
    return _shift("ifftshift", x, axes, inverse=True)
