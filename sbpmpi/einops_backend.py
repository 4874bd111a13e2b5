"""einops' backend for global tensors: ``einops.rearrange``, ``reduce``, ``repeat``,
``einsum``, ``pack`` and ``unpack`` of a :class:`~sbpmpi.GlobalTensor`.

einops finds a backend by its subclasses of ``einops._backends.AbstractBackend`` (their
``framework_name`` must be an imported module, ``is_appropriate_type`` must accept the
tensor). :func:`register` defines ours once; ``sbpmpi/__init__`` calls it at import when
einops is installed, so nothing is imported when it is not. Each method is a function of
``sbpmpi.array_api`` (the layouts and the communication are theirs); ``einsum`` is
:func:`sbpmpi.contraction.einsum`.
"""

from __future__ import annotations

import functools
import importlib.util
from typing import Any

from .tensor import GlobalTensor

__all__ = ["register", "BACKEND_NAME"]

#: The backend's ``framework_name``: the module einops checks is imported.
BACKEND_NAME = "sbpmpi"

def _xp() -> Any:
    from . import array_api

    return array_api


@functools.cache
def register() -> type | None:
    """Define the einops backend of GlobalTensor (once); None when einops is not installed."""
    if importlib.util.find_spec("einops") is None:
        return None
    from einops._backends import AbstractBackend

    class SbpmpiBackend(AbstractBackend):  # type: ignore[misc]
        """einops on GlobalTensors, through ``sbpmpi.array_api``."""

        framework_name = BACKEND_NAME

        def is_appropriate_type(self, tensor: Any) -> bool:
            return isinstance(tensor, GlobalTensor)

        def from_numpy(self, x: Any) -> Any:
            return _xp().asarray(x)

        def to_numpy(self, x: Any) -> Any:
            return x.numpy()

        def arange(self, start: int, stop: int) -> Any:
            return _xp().arange(start, stop)

        def shape(self, x: Any) -> Any:
            return x.shape

        def reshape(self, x: Any, shape: Any) -> Any:
            return _xp().reshape(x, tuple(shape))

        def transpose(self, x: Any, axes: Any) -> Any:
            return _xp().permute_dims(x, tuple(axes))

        def reduce(self, x: Any, operation: str, axes: Any) -> Any:
            return getattr(_xp(), operation)(x, axis=tuple(axes))

        def stack_on_zeroth_dimension(self, tensors: list[Any]) -> Any:
            return _xp().stack(tensors)

        def add_axis(self, x: Any, new_position: int) -> Any:
            return _xp().expand_dims(x, axis=new_position)

        def tile(self, x: Any, repeats: Any) -> Any:
            return _xp().tile(x, tuple(repeats))

        def concat(self, tensors: list[Any], axis: int) -> Any:
            return _xp().concat(tensors, axis=axis)

        def is_float_type(self, x: Any) -> bool:
            return bool(x.dtype.kind == "f")  # as the NumPy backend: mean of floats only

        def einsum(self, pattern: str, *x: Any) -> Any:
            from .contraction import einsum

            return einsum(pattern, *x)

    return SbpmpiBackend
