"""``Module``: the base class of models and layers (parameters found by walking attributes),
with torch's forward hooks (code that runs around a module's forward without changing
its class: ZeRO stage 3 gathers a layer's parameters there)."""

from __future__ import annotations

import itertools
import warnings
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any, NamedTuple

import numpy as np

from ..autograd.hooks import HookHandle
from ..grad_mode import no_grad
from ..tensor import GlobalTensor

__all__ = ["Module", "ForwardPreHook", "ForwardHook"]

#: ``hook(module, args) -> None or new args``
ForwardPreHook = Callable[["Module", tuple[Any, ...]], Any]
#: ``hook(module, args, output) -> None or new output``
ForwardHook = Callable[["Module", tuple[Any, ...], Any], Any]

_HOOK_IDS = itertools.count()  # handle keys, unique per process: never reset


class _PostHook(NamedTuple):
    hook: ForwardHook
    always: bool  # also when forward raises


@dataclass(eq=False)
class _ForwardHooks:
    """One module's forward hooks, in registration order."""

    pre: dict[int, ForwardPreHook] = field(default_factory=dict)
    post: dict[int, _PostHook] = field(default_factory=dict)

    def call(self, module: Module, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        """``module.forward(*args, **kwargs)`` with the hooks around it."""
        for pre in tuple(self.pre.values()):
            new = pre(module, args)
            if new is not None:
                args = new if isinstance(new, tuple) else (new,)
        try:
            out = module.forward(*args, **kwargs)
        except BaseException:
            for post in tuple(self.post.values()):
                if post.always:
                    try:
                        post.hook(module, args, None)
                    except Exception as e:  # forward's own error is the one to see
                        warnings.warn(f"a forward hook with always_call=True raised {e!r} "
                                      f"after forward raised; silenced", RuntimeWarning,
                                      stacklevel=3)
            raise
        for post in tuple(self.post.values()):
            new = post.hook(module, args, out)
            if new is not None:
                out = new
        return out


class Module:
    """Base class: parameters are the GlobalTensor attributes that require grad, found
    recursively through attributes that are modules (or lists/tuples of modules).

    ``training`` (True until :meth:`eval`) switches layers such as :class:`Dropout`;
    :meth:`train` and :meth:`eval` set it on the module and every submodule.
    """

    #: whether the module is in training mode (a class default: subclasses need not call
    #: ``super().__init__()``)
    training: bool = True

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        raise NotImplementedError

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        hooks = self.__dict__.get("_forward_hooks")
        if hooks is None:
            return self.forward(*args, **kwargs)
        return hooks.call(self, args, kwargs)

    # -- forward hooks (torch's names) ------------------------------------------------------

    def _forward_hook_table(self) -> _ForwardHooks:
        hooks = self.__dict__.get("_forward_hooks")
        if hooks is None:  # made on first use: subclasses need not call __init__
            hooks = self.__dict__["_forward_hooks"] = _ForwardHooks()
        return hooks

    def register_forward_pre_hook(self, hook: ForwardPreHook) -> HookHandle:
        """Call ``hook(module, args)`` before each forward (through ``module(...)``); a
        result other than None replaces the positional arguments (a tuple, or one value).
        Returns a handle whose ``remove()`` unregisters it."""
        if not callable(hook):
            raise TypeError(f"register_forward_pre_hook: hook must be callable, got "
                            f"{type(hook).__name__}")
        key = next(_HOOK_IDS)
        table = self._forward_hook_table().pre
        table[key] = hook
        return HookHandle(lambda: table.pop(key, None))

    def register_forward_hook(self, hook: ForwardHook, *, always_call: bool = False
                              ) -> HookHandle:
        """Call ``hook(module, args, output)`` after each forward; a result other than None
        replaces the output. ``always_call``: also when forward raises (``output`` is
        None, the result ignored, and forward's error propagates; an error of the hook
        then is a warning). Returns a handle whose ``remove()`` unregisters it."""
        if not callable(hook):
            raise TypeError(f"register_forward_hook: hook must be callable, got "
                            f"{type(hook).__name__}")
        if not isinstance(always_call, (bool, np.bool_)):
            raise TypeError(f"register_forward_hook: always_call must be a bool, got "
                            f"{type(always_call).__name__} {always_call!r}")
        key = next(_HOOK_IDS)
        table = self._forward_hook_table().post
        table[key] = _PostHook(hook, bool(always_call))
        return HookHandle(lambda: table.pop(key, None))

    def _members(self) -> Iterator[tuple[str, Any]]:
        """``(name, value)`` of the attributes that may hold parameters or submodules."""
        return iter(vars(self).items())

    def named_children(self) -> Iterator[tuple[str, Module]]:
        """``(name, submodule)`` of the direct submodules, in attribute order (an entry
        of a list attribute ``blocks`` is named ``blocks.0``, ``blocks.1``, ...)."""
        for k, v in self._members():
            if isinstance(v, Module):
                yield k, v
            elif isinstance(v, (list, tuple)):
                for i, m in enumerate(v):
                    if isinstance(m, Module):
                        yield f"{k}.{i}", m

    def named_modules(self, prefix: str = "") -> Iterator[tuple[str, Module]]:
        """``(dotted path, module)`` of this module (path ``prefix``) and every submodule,
        each once, parents first, in attribute order: the path of a parameter
        ``"blocks.0.weight"`` is that of its module, ``"blocks.0"``."""
        seen: set[int] = set()
        stack: list[tuple[str, Module]] = [(prefix, self)]
        while stack:
            path, m = stack.pop()
            if id(m) in seen:
                continue
            seen.add(id(m))
            yield path, m
            stack.extend(reversed([(f"{path}.{k}" if path else k, c)
                                   for k, c in m.named_children()]))

    def children(self) -> Iterator[Module]:
        """The direct submodules."""
        for _, m in self.named_children():
            yield m

    def modules(self) -> Iterator[Module]:
        """This module and every submodule, each once, parents first."""
        seen: set[int] = set()
        stack: list[Module] = [self]
        while stack:
            m = stack.pop()
            if id(m) in seen:
                continue
            seen.add(id(m))
            yield m
            stack.extend(reversed(list(m.children())))

    def train(self, mode: bool = True) -> Module:
        """Set training mode on this module and every submodule; returns ``self``."""
        if not isinstance(mode, (bool, np.bool_)):
            raise TypeError(f"train: mode must be a bool, got {type(mode).__name__} {mode!r}")
        for m in self.modules():
            m.training = bool(mode)
        return self

    def eval(self) -> Module:
        """Set evaluation mode (``train(False)``); returns ``self``."""
        return self.train(False)

    def named_parameters(self, prefix: str = "", remove_duplicate: bool = True
                         ) -> Iterator[tuple[str, GlobalTensor]]:
        """``(dotted name, parameter)`` in attribute order.

        A parameter reachable under several names (a tied weight) is listed once, under
        its first name, unless ``remove_duplicate`` is False.
        """
        return self._named_parameters(prefix, set() if remove_duplicate else None)

    def _named_parameters(self, prefix: str, seen: set[int] | None
                          ) -> Iterator[tuple[str, GlobalTensor]]:
        for k, v in self._members():
            if isinstance(v, GlobalTensor) and v.requires_grad:
                if seen is not None:
                    if id(v) in seen:
                        continue
                    seen.add(id(v))
                yield prefix + k, v
            elif isinstance(v, Module):
                yield from v._named_parameters(f"{prefix}{k}.", seen)
            elif isinstance(v, (list, tuple)):
                for i, m in enumerate(v):
                    if isinstance(m, Module):
                        yield from m._named_parameters(f"{prefix}{k}.{i}.", seen)

    def parameters(self) -> list[GlobalTensor]:
        """The parameters, in attribute order (give them to an optimizer)."""
        return [p for _, p in self.named_parameters()]

    def zero_grad(self) -> None:
        for p in self.parameters():
            p._set_grad(None)

    def state_dict(self) -> dict[str, GlobalTensor]:
        """Parameters by dotted name (save with ``sm.save_state``)."""
        return dict(self.named_parameters())

    def load_state_dict(self, state: Mapping[str, GlobalTensor]) -> None:
        """Copy values into the parameters, boxed to each one's layout (collective).

        The parameter objects stay the same, so an optimizer holding them keeps working.
        """
        params = dict(self.named_parameters())
        missing = sorted(set(params) - set(state))
        if missing:
            raise KeyError(f"load_state_dict: state lacks {missing}")
        for k, p in params.items():
            v = state[k]
            if not isinstance(v, GlobalTensor) or v.shape != p.shape:
                raise ValueError(f"load_state_dict: {k!r} must be a GlobalTensor of shape "
                                 f"{p.shape}, got {getattr(v, 'shape', type(v).__name__)}")
        for k, p in params.items():
            with no_grad():
                v = state[k].astype(p.dtype) if state[k].dtype != p.dtype else state[k]
                v = v.to_global(placement=p.placement, sbp=p.sbp)
            local = p.to_local()
            if local.size:
                local[...] = v.to_local()
