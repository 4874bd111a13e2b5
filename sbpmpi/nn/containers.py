"""Containers of modules: ``ModuleList`` and ``Sequential`` (torch's names and naming)."""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import Any

from .module import Module

__all__ = ["ModuleList", "Sequential"]


def _module_items(owner: str, modules: Iterable[Any]) -> list[Module]:
    items = list(modules)
    for i, m in enumerate(items):
        if not isinstance(m, Module):
            raise TypeError(f"{owner}: entry {i} must be an sm.nn.Module, got "
                            f"{type(m).__name__}")
    return items



class ModuleList(Module):
    """A list of modules whose parameters are named ``0.weight``, ``1.bias``, ... (as torch).

    Index it, iterate it, ``append``/``extend`` it; it has no ``forward``.
    """

    def __init__(self, modules: Iterable[Module] | None = None) -> None:
        self._items = _module_items("ModuleList", modules or ())

    def _members(self) -> Iterator[tuple[str, Any]]:
        return ((str(i), m) for i, m in enumerate(self._items))

    def __len__(self) -> int:
        return len(self._items)

    def __iter__(self) -> Iterator[Module]:
        return iter(self._items)

    def __getitem__(self, index: int | slice) -> Any:
        if isinstance(index, slice):
            return type(self)(self._items[index])
        return self._items[index]

    def __setitem__(self, index: int, module: Module) -> None:
        self._items[index] = _module_items(type(self).__name__, [module])[0]

    def append(self, module: Module) -> ModuleList:
        """Add ``module`` at the end; returns ``self``."""
        self._items += _module_items(type(self).__name__, [module])
        return self

    def extend(self, modules: Iterable[Module]) -> ModuleList:
        """Add ``modules`` at the end; returns ``self``."""
        self._items += _module_items(type(self).__name__, modules)
        return self

    def __repr__(self) -> str:
        inner = "".join(f"\n  ({i}): {m!r}" for i, m in enumerate(self._items))
        return f"{type(self).__name__}({inner}{chr(10) if inner else ''})"



class Sequential(ModuleList):
    """Modules applied in order: ``Sequential(a, b)(x) == b(a(x))``; parameters are named
    by position (``0.weight``), as torch."""

    def __init__(self, *modules: Module) -> None:
        super().__init__(_module_items("Sequential", modules))

    def forward(self, x: Any) -> Any:
        for m in self._items:
            x = m(x)
        return x
