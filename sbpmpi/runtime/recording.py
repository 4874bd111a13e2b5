"""The hook through which a step is recorded for :mod:`sbpmpi.capture` (``sm.graph``).

While a capture runs, the ``recorder`` field of the scoped modes
(:func:`sbpmpi.core.modes.current_modes`) holds its recorder (at most one; None outside);
the doors where a step's work happens tell it what they did, each behind one test of
that field:

- ``ops.kernel.local_result``: an op's local kernel ran (:meth:`Recorder.kernel`, with
  the kernel's form that writes into a given array where it has one);
- ``runtime.redistribute``: a conversion ran (:meth:`Recorder.conversion`, which runs it);
- ``GlobalTensor._set_grad``: a leaf's ``.grad`` was set (:meth:`Recorder.set_grad`);
- ``sm.tensor``: a global tensor was made from a host array (:meth:`Recorder.created`);
- ``conversion.gather_global``: a host read of a value (:meth:`Recorder.host_read`, which
  raises: a graph cannot hold it);
- the optimizers' ``step``/``zero_grad`` and the schedulers' ``step``
  (:meth:`Recorder.host_call`: replayed as a call).

Nothing here knows what a recorder does with it: :class:`Recorder` is the protocol,
:mod:`sbpmpi.capture.recorder` the implementation.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from contextlib import AbstractContextManager
from typing import Any, Protocol

__all__ = ["Recorder"]


class Recorder(Protocol):
    """What the doors tell a capture (see the module docstring)."""

    def kernel(self, name: str, key: tuple[Any, ...], fn: Callable[[list[Any]], Any],
               args: Sequence[Any], out: Any,
               into: Callable[[list[Any], Any, Any], None] | None = None) -> None: ...

    def conversion(self, key: tuple[Any, ...], run: Callable[[Any], Any],
                   replay: Callable[[Any], Any], local: Any) -> Any: ...

    def set_grad(self, leaf: Any, grad: Any) -> None: ...

    def created(self, key: tuple[Any, ...], fn: Callable[[Any], Any], data: Any,
                out: Any, into: Callable[[list[Any], Any, Any], None] | None = None
                ) -> None: ...

    def host_read(self, what: str) -> None: ...

    def host_call(self, fn: Callable[..., Any], args: tuple[Any, ...],
                  mutated: Sequence[tuple[Any, Any]]) -> AbstractContextManager[None]: ...

