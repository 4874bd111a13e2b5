"""An op call as data: operands, signature table, dim matches, output shape and dtype, kernel.

Builders (one per op) check the arguments and return an :class:`OpCall`; nothing here
communicates, so a bad argument raises the same error on every rank before any
collective.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ..core.dtypes import accumulation_dtype, float32, is_floating, is_half
from ..tensor import GlobalTensor
from .kernel import Kernel
from .signature import DimMatch, Signature

__all__ = ["OpCall", "Kernel", "is_scalar", "operand", "tensor_arg", "shape_of", "probe_dtype",
           "norm_dim", "norm_dims", "arg_summary"]


@dataclass(frozen=True, eq=False)
class OpCall:
    """Everything inference and execution need to know about one op call.

    Attributes
    ----------
    name : str
        Op name, e.g. ``"matmul"``.
    operands : tuple
        GlobalTensors and Python/NumPy scalars, in the op's argument order.
    table : tuple of Signature
        The op's signature table (one mesh axis).
    dims : mapping of str to tuple of DimMatch
        The dims each wildcard dim set ranges over for these operands.
    out_shape, out_dtype
        Global shape and dtype of the result.
    kernel : Kernel
        Computes this rank's output shard from its input shards.
    params : str
        Readable non-tensor arguments (for ``sm.explain``).
    labels : tuple of str
        Operand names (for ``sm.explain``).
    view : bool
        Whether the result is a view of operand 0, as NumPy's basic indexing gives one:
        where that operand is used in its own layout, the kernel's result (a view of its
        shard, strides and all) is kept as it is, and the result is marked a view of it;
        where the operand had to move, the result is marked a copy (writes into it are
        refused). Any other op's result owns its memory.
    """

    name: str
    operands: tuple[Any, ...]
    table: tuple[Signature, ...]
    dims: Mapping[str, tuple[DimMatch, ...]]
    out_shape: tuple[int, ...]
    out_dtype: np.dtype
    kernel: Kernel
    params: str = ""
    labels: tuple[str, ...] = field(default=())
    view: bool = False

    @property
    def tensors(self) -> tuple[GlobalTensor, ...]:
        return tuple(o for o in self.operands if isinstance(o, GlobalTensor))

    def label(self, i: int) -> str:
        if i < len(self.labels):
            return self.labels[i]
        return "abcdefgh"[i] if i < 8 else f"x{i}"


_SCALARS = (bool, int, float, complex, np.generic)


def is_scalar(x: Any) -> bool:
    """True for Python and NumPy scalars (and 0-d NumPy arrays)."""
    return isinstance(x, _SCALARS) or (isinstance(x, np.ndarray) and x.ndim == 0)


def arg_summary(x: Any) -> str:
    """Short description of an argument for error messages."""
    if isinstance(x, GlobalTensor):
        return f"GlobalTensor of shape {x.shape}"
    if isinstance(x, np.ndarray) or hasattr(x, "__array_interface__") \
            or hasattr(x, "__cuda_array_interface__"):
        return f"{type(x).__name__} of shape {tuple(getattr(x, 'shape', ()))}"
    return f"{type(x).__name__} {x!r}"


def operand(op: str, x: Any, what: str) -> Any:
    """``x`` as an operand: a GlobalTensor, or a scalar (0-d arrays become NumPy scalars)."""
    if isinstance(x, GlobalTensor):
        return x
    if isinstance(x, np.ndarray) and x.ndim == 0:
        return x[()]
    if isinstance(x, _SCALARS):
        return x
    raise TypeError(
        f"{op}: {what} must be a GlobalTensor or a scalar, got {arg_summary(x)}; make a global "
        f"tensor of an array with sm.tensor(value, placement=..., sbp=...)")


def tensor_arg(op: str, x: Any, what: str = "x") -> GlobalTensor:
    """``x`` if it is a GlobalTensor, else a TypeError naming ``op`` and the argument: the
    one check of a tensor argument, in ops/ and in the array API namespace alike."""
    if not isinstance(x, GlobalTensor):
        raise TypeError(f"{op}: {what} must be a GlobalTensor, got {arg_summary(x)}")
    return x


def shape_of(x: Any) -> tuple[int, ...]:
    """The global shape of an operand: a GlobalTensor's, ``()`` for a scalar."""
    return x.shape if isinstance(x, GlobalTensor) else ()


def probe_dtype(op: str, fn: Callable[..., Any], *args: Any) -> np.dtype:
    """Result dtype of ``fn`` on NumPy stand-ins (GlobalTensors become 0-d arrays of ones).

    Errors NumPy raises for the dtypes (e.g. integers to negative integer powers) are
    re-raised as TypeError/ValueError naming ``op``.
    """
    stand = [np.ones((), dtype=a.dtype) if isinstance(a, GlobalTensor) else a for a in args]
    try:
        with warnings.catch_warnings(), np.errstate(all="ignore"):
            warnings.simplefilter("ignore")
            dtype = np.dtype(np.asarray(fn(*stand)).dtype)
    except (TypeError, ValueError) as e:
        dts = ", ".join(str(a.dtype) if isinstance(a, GlobalTensor) else arg_summary(a)
                        for a in args)
        raise type(e)(f"{op}: not defined for operands of dtype {dts}: {e}") from None
    # ml_dtypes' loops (matmul, bfloat16 times a Python float) widen bfloat16 to float32
    # where NumPy's float16 keeps its width: a half-width tensor's result stays half width
    # when no operand is wider (as torch's type promotion does)
    half = {a.dtype for a in args if isinstance(a, GlobalTensor) and is_floating(a.dtype)}
    if dtype == float32 and len(half) == 1 and is_half(next(iter(half))):
        return next(iter(half))
    return dtype


def float_dtype(op: str, *xs: Any) -> np.dtype:
    """The floating result dtype of ``xs`` promoted together (integers give float64); a
    TypeError naming ``op`` for complex or other non-real values."""
    dtype = probe_dtype(op, lambda *z: sum(z) * 0.5, *xs)
    if not is_floating(dtype):
        raise TypeError(f"{op}: needs real values, got dtype "
                        f"{', '.join(str(x.dtype) for x in xs)}")
    return dtype


def as_dtype(a: Any, dtype: Any) -> Any:
    """``a`` itself when it has ``dtype``, else a copy in it (a kernel's input cast); for a
    half-width ``dtype``, in float32, which such a kernel computes in (:mod:`.precision`)."""
    target = accumulation_dtype(dtype)
    return a if a.dtype == target else a.astype(target)


def check_eps(op: str, eps: Any) -> float:
    """``eps`` as a float; a ValueError naming ``op`` unless it is a number >= 0."""
    if isinstance(eps, (bool, np.bool_)) or not isinstance(eps, (int, float, np.floating)) \
            or not eps >= 0:
        raise ValueError(f"{op}: eps must be a number >= 0, got {eps!r}")
    return float(eps)


def norm_dim(op: str, dim: Any, ndim: int, what: str = "dim") -> int:
    """``dim`` made non-negative; errors name ``op`` and say what was expected."""
    if isinstance(dim, (bool, np.bool_)) or not isinstance(dim, (int, np.integer)):
        raise TypeError(f"{op}: {what} must be an int, got {type(dim).__name__} {dim!r}")
    if not -ndim <= dim < ndim:
        raise ValueError(f"{op}: {what} {dim} is out of range for a tensor of {ndim} dims")
    return int(dim) % ndim


def norm_dims(op: str, dim: Any, ndim: int) -> tuple[int, ...]:
    """``None`` (all dims), an int or a sequence of ints as a sorted tuple of distinct dims."""
    if dim is None:
        return tuple(range(ndim))
    if isinstance(dim, (list, tuple)):
        dims = [norm_dim(op, d, ndim) for d in dim]
        if len(set(dims)) != len(dims):
            raise ValueError(f"{op}: dim {tuple(dim)} names a dim more than once")
        return tuple(sorted(dims))
    return (norm_dim(op, dim, ndim),)
