"""The array backend: NumPy for placement type ``"cpu"``, CuPy for ``"cuda"``.

This package is the only code that knows which array library holds a shard. This module
chooses the library and moves arrays between them; :mod:`.device_copy` hands GPU arrays
to MPI (used by ``sbpmpi.comm``); :mod:`.host_pool` reuses large host buffers;
:mod:`.node` holds this process's place on its machine (told by ``import sbpmpi``:
the backend makes no MPI call).
"""

from __future__ import annotations

import functools
import importlib
from types import ModuleType
from typing import Any

import numpy as np

from .host_pool import Reuse, empty
from .node import local_ranks

__all__ = [
    "get_xp",
    "check_device_available",
    "cupy_available",
    "cuda_device_count",
    "bind_device",
    "device_to_bind",
    "device_type_of",
    "is_device_array",
    "asnumpy",
    "from_dlpack",
    "to_device",
    "synchronize",
    "is_cupy_array",
    "register_host_backed",
    "is_host_backed",
    "current_device",
    "empty",
    "Reuse",
]


@functools.cache
def _cupy() -> ModuleType | None:
    try:
        cp = importlib.import_module("cupy")
        if cp.cuda.runtime.getDeviceCount() < 1:
            return None
        return cp
    except Exception:
        return None


def cupy_available() -> bool:
    """True when CuPy imports and sees at least one GPU."""
    return _cupy() is not None


def cuda_device_count() -> int:
    """Number of GPUs this process sees (0 without CuPy)."""
    cp = _cupy()
    return 0 if cp is None else int(cp.cuda.runtime.getDeviceCount())


class _Binding:
    """The GPU this process bound with :func:`bind_device` (None before): bound once."""

    __slots__ = ("device",)

    def __init__(self) -> None:
        self.device: int | None = None


_BINDING = _Binding()


def device_to_bind() -> int:
    """The GPU :func:`bind_device` binds this process to (``local_rank % device_count``),
    without binding it: naming the GPU must not create a CUDA context."""
    if _BINDING.device is not None:
        return _BINDING.device
    cp = _cupy()
    if cp is None:
        raise RuntimeError("no CUDA device: CuPy is not installed or sees no GPU")
    return local_ranks().rank % cp.cuda.runtime.getDeviceCount()


def bind_device() -> int:
    """Bind this process to GPU ``local_rank % device_count`` once; return the device id."""
    if _BINDING.device is None:
        dev = device_to_bind()
        _cupy().cuda.Device(dev).use()  # type: ignore[union-attr]
        _BINDING.device = dev
    return _BINDING.device


def get_xp(device_type: str) -> ModuleType:
    """Return the array module for ``device_type`` (``numpy`` or ``cupy``)."""
    if device_type == "cpu":
        return np
    if device_type == "cuda":
        cp = _cupy()
        if cp is None:
            raise RuntimeError(
                "placement type 'cuda' needs CuPy and a GPU: install sbpmpi[cuda12] or "
                "sbpmpi[cuda13] and run on a GPU node, or use placement type 'cpu'"
            )
        bind_device()
        return cp
    raise ValueError(f"device type {device_type!r} is not one of ('cpu', 'cuda')")


def current_device() -> int | None:
    """The GPU this process bound with :func:`bind_device`, or None."""
    return _BINDING.device


def is_device_array(a: Any) -> bool:
    """True for arrays in GPU memory (exposing ``__cuda_array_interface__``)."""
    return not isinstance(a, np.ndarray) and hasattr(a, "__cuda_array_interface__")


def device_type_of(a: Any) -> str:
    """``"cuda"`` for GPU arrays, ``"cpu"`` otherwise."""
    return "cuda" if is_device_array(a) else "cpu"


def asnumpy(a: Any) -> np.ndarray:
    """Return ``a`` as a NumPy array (a device-to-host copy for GPU arrays)."""
    if isinstance(a, np.ndarray):
        return a
    cp = _cupy()
    if cp is not None and isinstance(a, cp.ndarray):
        return cp.asnumpy(a)
    return np.asarray(a)


def from_dlpack(a: Any) -> Any:
    """Return ``a`` as a NumPy or CuPy array without copying where DLPack allows."""
    if isinstance(a, np.ndarray):
        return a
    cp = _cupy()
    if cp is not None and isinstance(a, cp.ndarray):
        return a
    if hasattr(a, "__dlpack_device__"):
        dev_type, _ = a.__dlpack_device__()
        if int(dev_type) in (2, 3, 13):  # kDLCUDA, kDLCUDAHost, kDLCUDAManaged
            if cp is None:
                raise RuntimeError("got a CUDA DLPack array, but CuPy is not available")
            return cp.from_dlpack(a)
        return np.from_dlpack(a)
    if hasattr(a, "__cuda_array_interface__"):
        if type(a) in _HOST_BACKED:
            return a  # a stand-in over host memory: CuPy would take its pointer for a GPU's
        if cp is None:
            raise RuntimeError("got a CUDA array, but CuPy is not available")
        return cp.asarray(a)
    return np.asarray(a)


def is_host_backed(a: Any) -> bool:
    """True for CUDA-array stand-ins over host memory (see :func:`register_host_backed`)."""
    return type(a) in _HOST_BACKED


def to_device(a: Any, device_type: str) -> Any:
    """Return ``a`` on ``device_type`` (copying across host and device when needed)."""
    xp = get_xp(device_type)
    if device_type == "cpu":
        return asnumpy(a)
    return xp.asarray(a)


def synchronize(a: Any = None) -> None:
    """Wait for pending GPU work on the current stream (no-op for host arrays)."""
    if a is not None and not is_device_array(a):
        return
    cp = _cupy()
    if cp is not None:
        cp.cuda.get_current_stream().synchronize()


# Array types whose ``__cuda_array_interface__`` points at host memory (test stand-ins):
# copies to and from them go through ctypes.memmove instead of the CUDA runtime.
_HOST_BACKED: set[type] = set()


def register_host_backed(cls: type) -> type:
    """Mark ``cls`` as a CUDA-array stand-in over host memory (usable as a class decorator)."""
    _HOST_BACKED.add(cls)
    return cls


def is_cupy_array(a: Any) -> bool:
    """True for CuPy arrays (False without CuPy)."""
    cp = _cupy()
    return cp is not None and isinstance(a, cp.ndarray)


def check_device_available(placement: Any) -> None:
    """Raise on every rank (not only members) when a "cuda" placement has no GPU backend."""
    if placement.type == "cuda" and not cupy_available():
        raise RuntimeError(
            f"placement type 'cuda' needs CuPy and a GPU on every rank ({placement!r}): install "
            "sbpmpi[cuda12] or sbpmpi[cuda13] and run on GPU nodes, or use placement type 'cpu'")
