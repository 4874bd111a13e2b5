"""The scoped modes: one context-local state with a named field per mode.

As JAX's configuration state (``jax/_src/config.py``: one thread-local state, context
managers over it), every mode that a ``with`` block turns on or off (grad, autocast, lazy
partial outputs, a graph capture, an activation recomputation's tape, array reuse,
``no_sync``) is a field of one immutable :class:`Modes`, held by one
:class:`contextvars.ContextVar`: read it with :func:`current_modes` (one C call, as cheap
as a module attribute), change one field for a block with :func:`enter` and
:func:`leave` (a token restores the state, also when the block raises).

A context variable is per thread (and per asyncio task): a thread started anywhere
begins with the defaults, as a new thread in torch starts with grad mode on, and a
mode turned on in one thread is never seen by another.

Adding a mode: a field here with its default, a context manager in the module that owns
the mode (``enter``/``leave``), and readers that test ``current_modes().field``
(docs/architecture.md, "Adding a mode").
"""

from __future__ import annotations

from contextvars import ContextVar, Token
from dataclasses import dataclass
from typing import Any, NamedTuple

import numpy as np

__all__ = ["AutocastState", "DEFAULT_MODES", "Modes", "Scope", "current_modes", "enter", "leave"]


@dataclass(frozen=True, slots=True)
class AutocastState:
    """Whether autocast is on, and its low dtype (``sm.autocast``, :mod:`sbpmpi.ops.autocast`)."""

    enabled: bool = False
    dtype: np.dtype | None = None  # the low dtype while enabled


class Modes(NamedTuple):
    """The modes in force in this thread or task (the defaults: outside every block)."""

    #: ops record the tape (False inside ``sm.no_grad()``: :mod:`sbpmpi.grad_mode`)
    grad: bool = True
    #: ``sm.autocast``'s state (:mod:`sbpmpi.ops.autocast`)
    autocast: AutocastState = AutocastState()
    #: op inference charges nothing for a partial output's later reduction
    #: (:func:`sbpmpi.ops.inference.lazy_partial_outputs`)
    lazy_partials: bool = False
    #: the recorder of the ``sm.graph`` capture that runs (a
    #: :class:`sbpmpi.runtime.recording.Recorder`), or None
    recorder: Any = None
    #: the list the tape appends its nodes to during an activation recomputation's
    #: forward (:func:`sbpmpi.tape.capturing`), or None
    tape_capture: list[Any] | None = None
    #: the :class:`sbpmpi.backend.Reuse` that ``backend.empty`` takes arrays from (a
    #: captured graph's conversion), or None
    reuse: Any = None
    #: inside ``DataParallel.no_sync()``: gradients accumulate locally
    #: (:mod:`sbpmpi.parallel.reducer`)
    no_sync: bool = False


_INDEX: dict[str, int] = {name: i for i, name in enumerate(Modes._fields)}
#: The state outside every block (one object: a state equal to it is this one), so
#: ``current_modes() is DEFAULT_MODES`` is the cheapest test that no mode is on, made by
#: the per-op path before it reads the fields.
DEFAULT_MODES = Modes()
_MODES: ContextVar[Modes] = ContextVar("sbpmpi_modes", default=DEFAULT_MODES)

#: The :class:`Modes` in force: ``current_modes().grad``, ... (the context variable's
#: own ``get``, so a read costs no Python frame: the ops read it on every call).
current_modes = _MODES.get


class Scope(NamedTuple):
    """One :func:`enter`: the field it set, the state before and after, and the token."""

    position: int
    before: Modes
    after: Modes
    token: Token[Modes]


def _with(state: Modes, index: int, value: Any) -> Modes:
    """``state`` with field ``index`` set to ``value`` (faster than ``_replace``: modes
    are entered per backward rule and per replayed conversion)."""
    fields = list(state)
    fields[index] = value
    new = tuple.__new__(Modes, fields)
    return DEFAULT_MODES if new == DEFAULT_MODES else new


def enter(field: str, value: Any) -> Scope:
    """Set mode ``field`` to ``value`` until :func:`leave` of the returned scope."""
    index = _INDEX[field]
    before = _MODES.get()
    after = _with(before, index, value)
    return Scope(index, before, after, _MODES.set(after))


def leave(scope: Scope) -> None:
    """Undo :func:`enter`: the field it set gets its value from before again.

    Scopes left in the reverse order of entry (``with`` blocks) restore the state with
    their token; a field changed since without a scope of its own
    (``sm.set_grad_enabled(False)`` as a function, inside an ``sm.autocast`` block) keeps
    its change, as it does in torch, so then only this scope's field is restored.
    """
    now = _MODES.get()
    if now is scope.after:
        try:
            _MODES.reset(scope.token)
            return
        except ValueError:  # entered in another context (a copy of this one)
            pass
    _MODES.set(_with(now, scope.position, scope.before[scope.position]))
