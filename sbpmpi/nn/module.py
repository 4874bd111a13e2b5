"""``Module``: the base class of models and layers (parameters found by walking attributes)."""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any

import numpy as np

from ..grad_mode import no_grad
from ..tensor import GlobalTensor

__all__ = ["Module"]


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
        return self.forward(*args, **kwargs)

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
