"""Autocast: ops that run in a low dtype (or in float32) inside ``sm.autocast(...)``.

As ``torch.autocast``: inside ``with sm.autocast(dtype=sm.bfloat16):`` the ops of
:data:`LOW` (matrix products) cast their float32 operands to the low dtype and return it,
so the weights stay float32 (their half-width copies are made per call, recorded on the
tape, and their gradients cast back to float32 by the engine); the ops of :data:`FLOAT32`
(softmax and log_softmax, layer norm's ``normalize``, the losses and the reductions) cast
half-width operands to float32 and return float32. Every other op runs in the dtypes it
is given (NumPy's promotion). float64 operands are never cast (as in torch).
``enabled=False`` nested inside turns it off; outside any ``autocast`` nothing changes.

Backward follows the forward's dtypes: the rules read the tensors the forward used (the
half-width copies), and the engine casts each gradient to its input's dtype. The engine
runs the rules with autocast suspended (:func:`suspended`), so a ``backward()`` called
inside the block computes the same gradients as one outside it.

The state is the ``autocast`` field of the scoped modes (:mod:`sbpmpi.core.modes`, an
:class:`AutocastState`; read it with :func:`current`), so an activation recomputation can
rerun a forward under the state it first ran in (:func:`using`).
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from types import TracebackType
from typing import Any

import numpy as np

from ..core.dtypes import HALF, as_dtype, float32, is_floating
from ..core.modes import AutocastState, Scope, current_modes, enter, leave
from ..tensor import GlobalTensor

__all__ = ["LOW", "FLOAT32", "AutocastState", "autocast", "current", "using", "suspended",
           "cast_operands", "low_dtype"]

#: Ops that run in the low dtype inside autocast.
LOW: frozenset[str] = frozenset({"matmul"})
#: Ops that run in, and return, float32 inside autocast.
FLOAT32: frozenset[str] = frozenset({
    "softmax", "log_softmax", "sum_exp", "softmax_finish",
    "normalize",
    "cross_entropy", "vocab_stats", "vocab_loss",
    "sum", "mean", "var",
})


_OFF = AutocastState()


def current() -> AutocastState:
    """The autocast state in force."""
    return current_modes().autocast


def low_dtype() -> np.dtype | None:
    """The low dtype while autocast is on, else None."""
    s = current_modes().autocast
    return s.dtype if s.enabled else None


@contextmanager
def using(state: AutocastState) -> Iterator[None]:
    """Run the block under ``state`` (a recomputation under its forward's state)."""
    scope = enter("autocast", state)
    try:
        yield
    finally:
        leave(scope)


def suspended() -> Any:
    """Autocast off for the block (the backward engine's rules)."""
    return using(_OFF)


class autocast:  # noqa: N801 - torch's name
    """``sm.autocast(dtype=sm.bfloat16, enabled=True)``: a context manager, as ``torch.autocast``.

    Inside it matmul, batched matmul and ``sm.nn.Linear`` (bias included) compute in and
    return ``dtype`` (float16 or bfloat16) while float32 weights stay float32; softmax,
    log_softmax, layer norm, the losses and the reductions run in and return float32.
    ``enabled=False`` turns it off for a nested block. Usable as a decorator too.
    """

    def __init__(self, dtype: Any = "bfloat16", enabled: bool = True) -> None:
        if not isinstance(enabled, (bool, np.bool_)):
            raise TypeError(f"autocast: enabled must be a bool, got {type(enabled).__name__} "
                            f"{enabled!r}")
        try:
            dt = as_dtype(dtype)
        except TypeError:
            raise TypeError(f"autocast: dtype must be sm.bfloat16 or sm.float16, got "
                            f"{dtype!r}") from None
        if dt not in HALF:
            raise ValueError(f"autocast: dtype must be sm.bfloat16 or sm.float16, got {dt}")
        self.state = AutocastState(bool(enabled), dt)
        self._scopes: list[Scope] = []  # one per entry: a decorator may recurse

    def __enter__(self) -> autocast:
        self._scopes.append(enter("autocast", self.state))
        return self

    def __exit__(self, typ: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        leave(self._scopes.pop())

    def __call__(self, fn: Any) -> Any:
        import functools

        @functools.wraps(fn)
        def wrapped(*args: Any, **kwargs: Any) -> Any:
            with self:
                return fn(*args, **kwargs)
        return wrapped

    def __repr__(self) -> str:
        return f"autocast(dtype={self.state.dtype}, enabled={self.state.enabled})"


def _cast(x: Any, to: np.dtype, half_only: bool) -> Any:
    if not isinstance(x, GlobalTensor) or x.dtype == to or not is_floating(x.dtype):
        return x
    if x.dtype == np.float64:
        return x  # float64 is never autocast (as torch)
    if half_only and x.dtype not in HALF:
        return x
    return x.astype(to)


def cast_operands(name: str, args: tuple[Any, ...], kwargs: dict[str, Any]
                  ) -> tuple[tuple[Any, ...], dict[str, Any]]:
    """``args`` and ``kwargs`` of op ``name`` cast as autocast says (unchanged when off or
    when the op is on neither list)."""
    s = current_modes().autocast
    if not s.enabled:
        return args, kwargs
    if name in LOW:
        assert s.dtype is not None  # an enabled state has its dtype
        to, half_only = s.dtype, False
    elif name in FLOAT32:
        to, half_only = float32, True
    else:
        return args, kwargs
    return (tuple(_cast(a, to, half_only) for a in args),
            {k: _cast(v, to, half_only) for k, v in kwargs.items()})
