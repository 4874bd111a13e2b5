"""Public names that a package shows but a package above it defines, installed from above.

``sm.nn.DataParallel`` is torch's name, but ``DataParallel`` is the parallel wing's
(:mod:`sbpmpi.parallel`), which builds on ``sm.nn``: ``nn`` may not import it. The
composition root (``sbpmpi/__init__``, which Python runs before any subpackage) installs
such names here, as JAX's ``jax.numpy`` sets the array methods on the array type from
above; the package's ``__getattr__`` asks :func:`load` on first use. The package names no
layer above it, and importing it loads none of them.
"""

from __future__ import annotations

import importlib
from typing import Any

#: package -> {public name: the module above that defines it}; written by the
#: composition root at import, read by the packages' ``__getattr__``.
_INSTALLED: dict[str, dict[str, str]] = {}


def install(package: str, names: dict[str, str]) -> None:
    """Show each of ``names`` (name -> the module that defines it) in ``package``."""
    table = _INSTALLED.setdefault(package, {})
    for name, module in names.items():
        if table.get(name, module) != module:
            raise ValueError(f"{package}.{name} is installed from {table[name]!r} already, "
                             f"not {module!r}")
        table[name] = module


def names(package: str) -> frozenset[str]:
    """The names installed in ``package`` (for its ``__dir__`` and ``__getattr__``)."""
    return frozenset(_INSTALLED.get(package, ()))


def load(package: str, name: str) -> Any:
    """The value of ``package.name``, imported from the module above that defines it."""
    module = _INSTALLED.get(package, {}).get(name)
    if module is None:
        raise AttributeError(f"module {package!r} has no attribute {name!r}")
    return getattr(importlib.import_module(module), name)
