"""Grad mode: whether ops on tensors that require grad are recorded on the tape.

The mode is the ``grad`` field of the scoped modes (:mod:`sbpmpi.core.modes`): per thread,
as in torch (a new thread starts with grad on), restored by every block on exit.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from types import TracebackType
from typing import Any, TypeVar

from .core.modes import Scope, current_modes, enter, leave

__all__ = ["is_grad_enabled", "set_grad_enabled", "no_grad", "enable_grad"]

_F = TypeVar("_F", bound=Callable[..., Any])


def is_grad_enabled() -> bool:
    """True when ops record the tape (the default; False inside ``sm.no_grad()``)."""
    return current_modes().grad


class set_grad_enabled:  # noqa: N801 - used as a function and a context manager, as in torch
    """Turn recording on or off now; as a context manager, restore the old mode on exit."""

    def __init__(self, mode: bool) -> None:
        if not isinstance(mode, bool):
            raise TypeError(f"set_grad_enabled: mode must be a bool, got {type(mode).__name__} "
                            f"{mode!r}")
        self._scope = enter("grad", mode)

    def __enter__(self) -> None:
        return None

    def __exit__(self, typ: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        leave(self._scope)


class _Mode:
    _mode = True

    def __init__(self) -> None:
        self._scopes: list[Scope] = []  # one per entry: an instance may be entered nested

    def __enter__(self) -> None:
        self._scopes.append(enter("grad", self._mode))

    def __exit__(self, typ: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        leave(self._scopes.pop())

    def __call__(self, fn: _F) -> _F:
        """Use as a decorator: run ``fn`` in this mode."""
        mode = self._mode

        @functools.wraps(fn)
        def wrapped(*args: Any, **kwargs: Any) -> Any:
            scope = enter("grad", mode)
            try:
                return fn(*args, **kwargs)
            finally:
                leave(scope)

        return wrapped  # type: ignore[return-value]


class no_grad(_Mode):  # noqa: N801 - the torch / OneFlow name
    """``with sm.no_grad():`` ops record nothing and their results do not require grad."""

    _mode = False


class enable_grad(_Mode):  # noqa: N801
    """``with sm.enable_grad():`` recording on again (inside a ``no_grad`` block)."""

    _mode = True
