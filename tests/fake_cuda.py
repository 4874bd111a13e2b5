"""A stand-in for a CUDA array over host memory, for testing the GPU code path without a GPU.

It exposes ``__cuda_array_interface__`` (version 3) pointing at a NumPy array it owns,
as mpi4py's own test suite does. ``backend.register_host_backed`` tells sbpmpi that
copies to and from it may use ``ctypes.memmove``; with a CUDA-aware setting mpi4py hands
its pointer to MPI directly (which works, since it is host memory).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from sbpmpi import backend


@backend.register_host_backed
class FakeCudaArray:
    """Host memory that looks like a CUDA array (no arithmetic, like a foreign GPU array)."""

    def __init__(self, host: np.ndarray) -> None:
        self._host = host  # may be a strided view; owns or references the memory

    @classmethod
    def from_numpy(cls, a: Any) -> FakeCudaArray:
        return cls(np.array(a, copy=True))

    @classmethod
    def zeros(cls, shape: Any, dtype: Any) -> FakeCudaArray:
        return cls(np.zeros(shape, dtype=dtype))

    @property
    def __cuda_array_interface__(self) -> dict[str, Any]:
        h = self._host
        return {
            "shape": h.shape,
            "typestr": h.dtype.str,
            "data": (h.ctypes.data if h.size else 0, False),
            "strides": None if h.flags.c_contiguous else h.strides,
            "version": 3,
            "stream": None,
        }

    @property
    def shape(self) -> tuple[int, ...]:
        return self._host.shape

    @property
    def dtype(self) -> np.dtype:
        return self._host.dtype

    @property
    def size(self) -> int:
        return self._host.size

    def __getitem__(self, key: Any) -> FakeCudaArray:
        return FakeCudaArray(self._host[key])

    def copy_contiguous(self) -> FakeCudaArray:
        return FakeCudaArray(np.ascontiguousarray(self._host))

    def get(self) -> np.ndarray:
        """A host copy of the values (as ``cupy.ndarray.get``)."""
        return self._host.copy()


def fake_cupy_module(calls: list[tuple[str, int]], gpus: int = 1) -> Any:
    """A stand-in for the ``cupy`` module's device queries, recording in ``calls`` every
    ``("use", id)`` (binding a device: CUDA creates a context there) and
    ``("properties", id)``; no arrays."""
    import types

    def device(i: int = 0) -> Any:
        return types.SimpleNamespace(id=i, use=lambda: calls.append(("use", i)))

    def properties(i: int) -> dict[str, Any]:
        calls.append(("properties", i))
        return {"name": b"Stand-in GPU"}

    runtime = types.SimpleNamespace(getDeviceCount=lambda: gpus, getDeviceProperties=properties)
    return types.SimpleNamespace(__name__="cupy", __version__="0-stand-in",
                                 cuda=types.SimpleNamespace(runtime=runtime, Device=device))
