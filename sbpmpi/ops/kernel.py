"""The local result of an op's kernel, as its output layout expects it.

Both ways of running an op (the full path of :func:`sbpmpi.ops.op.run_call` and the
dispatch fast path of :class:`sbpmpi.ops.dispatch.Fast`) hand the kernel's result to
:func:`local_result`: an array of the op's dtype, C-contiguous, of this rank's shard
shape, or an internal error naming the op.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from types import ModuleType
from typing import Any

import numpy as np

from ..backend.memory import FRESH, Scratch
from ..core.dtypes import HALF, float32
from ..core.layout import Layout
from ..core.modes import DEFAULT_MODES, current_modes
from ..env import get_rank
from .precision import needs_widening, widen

__all__ = ["Kernel", "Into", "Scratch", "FRESH", "with_into", "written_into", "take_into",
           "zero_d", "local_result"]

#: An op's local computation, the one type of every kernel: ``kernel(xp, operands,
#: out_local_shape) -> array-like``, tensor operands given as this rank's shards.
Kernel = Callable[[ModuleType, Sequence[Any], tuple[int, ...]], Any]

#: A kernel's form that writes its result into a given array: ``into(xp, operands,
#: out_local_shape, out) -> None`` (bit-identical to the kernel's result), or with
#: ``scratch`` also ``into(xp, operands, out_local_shape, out, scratch)`` taking its
#: temporaries from a :class:`~sbpmpi.backend.memory.Scratch` (:data:`FRESH`, new ones
#: each call, in the eager kernels; one kept per plan in a replay). A kernel that has one
#: carries it as its ``into`` attribute (:func:`with_into`); a captured graph replays it
#: into a buffer planned once (:mod:`sbpmpi.capture.replay`).
Into = Callable[..., None]


def with_into(kernel: Kernel, into: Into, scratch: bool = False) -> Kernel:
    """``kernel`` carrying ``into``, its form that writes into a given array (``scratch``:
    ``into`` takes a :class:`Scratch` as its fifth argument)."""
    kernel.into = into  # type: ignore[attr-defined]
    kernel.into_scratch = scratch  # type: ignore[attr-defined]
    return kernel


def written_into(into: Into, dtype: Any) -> Kernel:
    """The kernel of an ``into`` form that takes a :class:`Scratch`, carrying it: its
    result in a new array of ``dtype``, its temporaries new (the same arithmetic as a
    replay's, so both are bit-identical)."""
    def kernel(xp: ModuleType, operands: Sequence[Any], shape: tuple[int, ...]) -> Any:
        out = xp.empty(shape, dtype=dtype)
        into(xp, operands, shape, out, FRESH)
        return out

    return with_into(kernel, into, scratch=True)


def zero_d(xp: ModuleType, value: Any, dtype: Any) -> Any:
    """``value`` as a 0-d array of ``dtype``, made once per (value, dtype, module): an
    operand that makes no array per call (a Python scalar is made into a new 0-d array by
    every ufunc call). Equal to the scalar NumPy's promotion makes of it when ``dtype``
    is what the scalar promotes to with the other operand (NEP 50: a Python scalar takes
    the array's dtype)."""
    key = (value, dtype if isinstance(dtype, np.dtype) else np.dtype(dtype), xp.__name__)
    z = _ZERO_D.get(key)
    if z is None:
        if len(_ZERO_D) > 256:
            _ZERO_D.clear()
        z = _ZERO_D[key] = xp.asarray(value, dtype=dtype)
    return z


_ZERO_D: dict[tuple[Any, np.dtype, str], Any] = {}


def take_into(xp: ModuleType, a: Any, indices: Any, out: Any, axis: int | None = None) -> Any:
    """``take(a, indices, axis)`` written into ``out``, for indices known to be in range
    (NumPy's default mode checks them through a buffer it allocates; "clip" does not)."""
    if xp is np:
        return np.take(a, indices, axis=axis, out=out, mode="clip")
    return xp.take(a, indices, axis=axis, out=out)


def _arrays(args: Any) -> tuple[Any, ...]:
    """The arrays among a kernel's arguments (a replay's operands, for the bounds check)."""
    return tuple(a for a in args if hasattr(a, "__array_interface__")
                 or hasattr(a, "__cuda_array_interface__"))


def local_result(name: str, kernel: Kernel, xp: ModuleType, args: Any,
                 shape: tuple[int, ...], dtype: np.dtype, layout: Layout, *,
                 shards: Sequence[Any] = (), view: bool = False,
                 widened: bool | None = None) -> Any:
    """``kernel(xp, args, shape)`` as an ``xp`` array of ``dtype`` and ``shape``: a
    C-contiguous array in its own memory, or with ``view`` the kernel's view of an operand's
    shard as it is (basic indexing: its strides kept, so writes reach the operand).

    ``widened``: whether half-width operands are computed in float32
    (:func:`.precision.needs_widening`; None: decided here). ``shards``: the operands' own
    shards (before any conversion; scalars among them are passed over). A result that shares
    memory with one of them is copied, unless it is the ``view``: a kernel that returns a
    view (``reshape``, a transpose that is contiguous on this rank only) would otherwise
    tie the result to its operand on some ranks and not on others, and a later write
    into either would reach the other on those ranks only.

    Raises
    ------
    RuntimeError
        When the kernel's result has another shape than ``layout`` gives this rank (an
        internal error of op ``name``).
    """
    if widened is None:
        widened = needs_widening(name, args)
    res = xp.asarray(kernel(xp, widen(args) if widened else args, shape))
    if widened and res.dtype in HALF:
        # the one rounding to the half dtype is the astype below: a kernel that rounds
        # its float32 work itself (casting back, or summing into a half-width out) has
        # accumulated in half width somewhere
        raise RuntimeError(f"{name}: internal error: its kernel computed a {res.dtype} "
                           f"result from float32 operands (it must return its float32 "
                           f"result, rounded once here)")
    into: Into | None = getattr(kernel, "into", None)
    computed = res.dtype
    if res.dtype != dtype:
        if not widened:
            into = None  # its own dtype cast to the op's: replayed as it ran
        res = res.astype(dtype)
    if view:
        pass
    elif not res.flags.c_contiguous:
        res = res.copy()
    elif res.base is not None and any(xp.may_share_memory(res, a) for a in _arrays(shards)):
        res = res.copy()  # a fresh array has no base: only views need the bounds check
    if res.shape != shape and tuple(res.shape) != shape:
        raise RuntimeError(f"{name}: internal error: local result has shape "
                           f"{tuple(res.shape)}, layout {layout} expects {shape} on rank "
                           f"{get_rank()}")
    # a step being captured as a graph (sm.graph): replayed as this call
    modes = current_modes()  # outside every mode (the common case): one identity test
    if modes is not DEFAULT_MODES and (recorder := modes.recorder) is not None:
        recorder.kernel(name, (name, kernel, shape, dtype, layout),
                        lambda a: local_result(name, kernel, xp, a, shape, dtype, layout,
                                               shards=a, view=view),
                        args, res, None if into is None or view else
                        _bound(into, xp, shape, getattr(kernel, "into_scratch", False),
                               computed if widened else None))
    return res


def _bound(into: Into, xp: ModuleType, shape: tuple[int, ...], scratch: bool,
           widened: np.dtype | None = None) -> Callable[[list[Any], Any, Scratch], None]:
    """``into`` as a recorded call's ``into(args, out, scratch)``; ``widened``: the dtype
    the kernel computed in from half-width operands (see :func:`_widened_into`)."""
    if widened is not None:
        return _widened_into(into, xp, shape, scratch, widened)
    if scratch:
        return lambda a, out, s: into(xp, a, shape, out, s)
    return lambda a, out, s: into(xp, a, shape, out)


def _widened_into(into: Into, xp: ModuleType, shape: tuple[int, ...], scratch: bool,
                  computed: np.dtype) -> Callable[[list[Any], Any, Scratch], None]:
    """A widened kernel's replay: its half-width operands copied into float32 temporaries,
    the kernel's ``into`` form computing into a temporary of ``computed``, rounded once
    into ``out`` (the eager kernel's ``widen``, its result and ``astype``: the same bits).
    The temporaries' numbers (99 and up) are above those of the kernels' own forms."""
    def run(a: list[Any], out: Any, s: Scratch) -> None:
        wide = [_wide_copy(xp, x, s, 100 + i) if getattr(x, "dtype", None) in HALF else x
                for i, x in enumerate(a)]
        tmp = s.get(xp, shape, computed, 99)
        if scratch:
            into(xp, wide, shape, tmp, s)
        else:
            into(xp, wide, shape, tmp)
        out[...] = tmp
    return run


def _wide_copy(xp: ModuleType, x: Any, s: Scratch, k: int) -> Any:
    """``x`` (half-width) as float32, in temporary ``k``."""
    w = s.get(xp, x.shape, float32, k)
    w[...] = x
    return w
