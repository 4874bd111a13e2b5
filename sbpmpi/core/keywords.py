"""Keyword aliases: NumPy's ``axis=`` and ``keepdims=`` for torch's ``dim=`` and ``keepdim=``.

PyTorch's argument parser takes ``axis`` for every ``dim`` parameter and ``keepdims``
for every ``keepdim`` (``x.sum(axis=0)``, ``torch.cat(ts, axis=1)``), since NumPy users
write those first. sbpmpi does the same, both ways: an op or method whose parameter is
``dim`` takes ``axis``, one whose parameter is ``axis`` (the Array API's spelling, as in
``x.argmax``) takes ``dim``. Giving a name and its alias at once is a TypeError, as in
torch. A function of names only: no arrays, no MPI.
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, TypeVar

__all__ = ["ALIASES", "KeywordAliases", "accepting_aliases"]

#: alias -> the parameter name it stands for (both spellings are aliases of each other)
ALIASES: Mapping[str, str] = {"axis": "dim", "keepdims": "keepdim",
                              "dim": "axis", "keepdim": "keepdims"}

F = TypeVar("F", bound=Callable[..., Any])


@dataclass(frozen=True)
class KeywordAliases:
    """The aliases one function takes: ``renames`` maps each alias it accepts to its own
    parameter (only for a parameter it has and an alias it does not also have)."""

    where: str  # the function's name, for messages
    renames: Mapping[str, str]

    @classmethod
    def of(cls, fn: Callable[..., Any], where: str) -> KeywordAliases:
        """The aliases of ``fn``'s parameters."""
        params = inspect.signature(fn).parameters
        return cls(where, {alias: name for alias, name in ALIASES.items()
                           if name in params and alias not in params})

    def canonical(self, kwargs: dict[str, Any]) -> dict[str, Any]:
        """``kwargs`` with each alias renamed to the parameter it stands for (the same
        dict when it holds none). TypeError when a parameter is given under both names."""
        if not self.renames or kwargs.keys().isdisjoint(self.renames):
            return kwargs
        out = dict(kwargs)
        for alias, name in self.renames.items():
            if alias in out:
                if name in out:
                    raise TypeError(f"{self.where}() got both {name}= and its alias "
                                    f"{alias}= (give one)")
                out[name] = out.pop(alias)
        return out


def accepting_aliases(fn: F) -> F:
    """``fn`` taking the aliases of its ``dim``/``keepdim`` (or ``axis``/``keepdims``)
    parameters as keywords; ``fn`` itself when it has none of them."""
    aliases = KeywordAliases.of(fn, fn.__name__)
    if not aliases.renames:
        return fn

    @functools.wraps(fn)
    def wrapped(*args: Any, **kwargs: Any) -> Any:
        return fn(*args, **aliases.canonical(kwargs))

    return wrapped  # type: ignore[return-value]
