"""The backward engine's hooks: how code above autograd (data parallelism) takes part in a
backward pass while the engine knows nothing of it (as torch's DDP reducer does through
autograd hooks).

- **Leaf-gradient hook** (:func:`register_leaf_hook`, per leaf): ``hook(leaf, grad,
  last)`` is called for each gradient contribution backward makes for ``leaf`` (a
  parameter used twice gets two), and with ``grad=None`` for each one that does not come
  (a rule gave no gradient for that input, or backward never reached the op), so that
  the count of calls is the same whatever the rules produce; ``last`` is True on the
  final call of this backward. A hook that returns True takes the gradient over: the
  engine then does not add it to ``leaf.grad``.
- **End-of-backward hook** (:func:`register_backward_end_hook`): ``hook(failed)`` is
  called once at the end of every backward, after the last rule, ``failed`` True when a
  rule (or an earlier end hook) raised: the place to wait for what is in flight.
- **Between-rules poll** (:func:`register_poll_hook`): ``hook()`` is called before each
  backward rule. MPI promises no progress in the background, so a hook with
  non-blocking collectives in flight tests them there (the buckets' all-reduces then
  advance while backward computes).

Each ``register_*`` returns a :class:`HookHandle`; ``handle.remove()`` unregisters. The
hooks are read when a backward starts: one registered or removed during a backward
takes effect at the next.
"""

from __future__ import annotations

import functools
import itertools
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

from ..core.modes import current_modes
from ..tape import Node
from ..tensor import GlobalTensor

__all__ = ["HookHandle", "LeafHook", "EndHook", "PollHook", "register_leaf_hook",
           "register_backward_end_hook", "register_poll_hook", "leaf_hooks", "HookTable",
           "LeafCalls", "HOOKS", "run_hook"]

#: ``hook(leaf, grad or None, last) -> took_over``
LeafHook = Callable[[GlobalTensor, "GlobalTensor | None", bool], bool]
#: ``hook(failed)``
EndHook = Callable[[bool], None]
#: ``hook()``
PollHook = Callable[[], None]


class HookHandle:
    """Unregisters one hook: ``handle.remove()`` (a second call does nothing)."""

    __slots__ = ("_remove",)

    def __init__(self, remove: Callable[[], object]) -> None:
        self._remove: Callable[[], object] | None = remove

    def remove(self) -> None:
        if self._remove is not None:
            self._remove()
            self._remove = None


def run_hook(hook: Callable[..., Any], *args: Any) -> Any:
    """``hook(*args)``; while a step is captured as a graph (``sm.graph``) the call is
    recorded and replayed as it is (the data-parallel reducer's writes into its buckets
    and its non-blocking all-reduces with it)."""
    if (recorder := current_modes().recorder) is not None:
        with recorder.host_call(hook, args, ()):
            return hook(*args)
    return hook(*args)


@dataclass(eq=False)
class LeafCalls:
    """The calls one backward owes the hooks of one leaf: the hooks (as registered when
    the backward started) and how many calls are left."""

    hooks: tuple[LeafHook, ...]
    left: int

    def call(self, leaf: GlobalTensor, grad: GlobalTensor | None) -> bool:
        """One contribution (or a missing one, ``grad`` None): every hook sees it; True
        when one took it over."""
        self.left -= 1
        last = self.left == 0
        taken = False
        for hook in self.hooks:
            taken = bool(run_hook(hook, leaf, grad, last)) or taken
        return taken


@dataclass(eq=False)
class _LeafEntry:
    """A leaf's hooks, holding the leaf so that its id stays its own."""

    leaf: GlobalTensor
    hooks: dict[int, LeafHook]


class HookTable:
    """The hooks registered with the engine, by kind, in registration order."""

    def __init__(self) -> None:
        self._ids = itertools.count()
        self._leaf: dict[int, _LeafEntry] = {}
        self._end: dict[int, EndHook] = {}
        self._poll: dict[int, PollHook] = {}

    # -- registering ----------------------------------------------------------------------

    def add_leaf_hook(self, leaf: GlobalTensor, hook: LeafHook) -> HookHandle:
        entry = self._leaf.get(id(leaf))
        if entry is None:
            entry = self._leaf[id(leaf)] = _LeafEntry(leaf, {})
        key = next(self._ids)
        entry.hooks[key] = hook

        def remove() -> None:
            entry.hooks.pop(key, None)
            if not entry.hooks and self._leaf.get(id(leaf)) is entry:
                del self._leaf[id(leaf)]
        return HookHandle(remove)

    def add_end_hook(self, hook: EndHook) -> HookHandle:
        key = next(self._ids)
        self._end[key] = hook
        return HookHandle(functools.partial(self._end.pop, key, None))

    def add_poll_hook(self, hook: PollHook) -> HookHandle:
        key = next(self._ids)
        self._poll[key] = hook
        return HookHandle(functools.partial(self._poll.pop, key, None))

    def leaf_hooks(self, leaf: GlobalTensor) -> tuple[LeafHook, ...]:
        entry = self._leaf.get(id(leaf))
        return () if entry is None else tuple(entry.hooks.values())

    # -- what one backward asks -----------------------------------------------------------

    def leaf_calls(self, order: Iterable[Node]) -> dict[int, LeafCalls]:
        """For the tape nodes ``order`` (a backward's), the calls each hooked leaf is owed:
        one per (node, input) that needs its gradient. Empty when no leaf has a hook."""
        out: dict[int, LeafCalls] = {}
        table = self._leaf
        if not table:
            return out
        for node in order:
            for x, need in zip(node.inputs, node.needs):
                if need and isinstance(x, GlobalTensor) and x._node is None:
                    calls = out.get(id(x))
                    if calls is not None:
                        calls.left += 1
                        continue
                    entry = table.get(id(x))
                    if entry is not None and entry.hooks:
                        out[id(x)] = LeafCalls(tuple(entry.hooks.values()), 1)
        return out

    def root_calls(self, root: GlobalTensor) -> dict[int, LeafCalls]:
        """The calls owed when backward starts at a leaf: its one gradient."""
        hooks = self.leaf_hooks(root)
        return {id(root): LeafCalls(hooks, 1)} if hooks else {}

    def polls(self) -> tuple[PollHook, ...]:
        return tuple(self._poll.values())

    def end_backward(self, failed: bool) -> None:
        """Call every end hook with ``failed``. A hook that raises makes the later ones see
        ``failed=True``; the first such error is raised after all have run, unless the
        backward had already failed (its own error propagates)."""
        error: BaseException | None = None
        for hook in tuple(self._end.values()):
            try:
                run_hook(hook, failed or error is not None)
            except BaseException as e:  # every hook runs: none leaves a request behind
                if error is None:
                    error = e
        if error is not None and not failed:
            raise error


#: The engine's hooks (one engine per process).
HOOKS = HookTable()


def register_leaf_hook(leaf: GlobalTensor, hook: LeafHook) -> HookHandle:
    """Call ``hook(leaf, grad, last)`` for each gradient backward makes for ``leaf`` (see
    the module docstring); a True result takes the gradient over."""
    if not isinstance(leaf, GlobalTensor):
        raise TypeError(f"register_leaf_hook: leaf must be a GlobalTensor, got "
                        f"{type(leaf).__name__}")
    if not (leaf.is_leaf and leaf.requires_grad):
        raise ValueError(f"register_leaf_hook: leaf must be a leaf that requires grad "
                         f"(shape {leaf.shape}, requires_grad={leaf.requires_grad}, "
                         f"is_leaf={leaf.is_leaf})")
    if not callable(hook):
        raise TypeError(f"register_leaf_hook: hook must be callable, got {type(hook).__name__}")
    return HOOKS.add_leaf_hook(leaf, hook)


def register_backward_end_hook(hook: EndHook) -> HookHandle:
    """Call ``hook(failed)`` once at the end of every backward (see the module docstring)."""
    if not callable(hook):
        raise TypeError(f"register_backward_end_hook: hook must be callable, got "
                        f"{type(hook).__name__}")
    return HOOKS.add_end_hook(hook)


def register_poll_hook(hook: PollHook) -> HookHandle:
    """Call ``hook()`` before each backward rule (see the module docstring)."""
    if not callable(hook):
        raise TypeError(f"register_poll_hook: hook must be callable, got {type(hook).__name__}")
    return HOOKS.add_poll_hook(hook)


def leaf_hooks(leaf: Any) -> tuple[LeafHook, ...]:
    """The leaf hooks registered for ``leaf``, in registration order."""
    return HOOKS.leaf_hooks(leaf) if isinstance(leaf, GlobalTensor) else ()
