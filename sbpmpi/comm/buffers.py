"""Array buffers on their way to MPI: checks, contiguous copies, GPU staging.

Host (NumPy) arrays go to MPI as they are (a contiguous copy for non-contiguous
inputs). GPU arrays go directly when the MPI library is CUDA-aware, after the stream
that produced them is synchronised; otherwise, and for user-defined reductions, they
are staged through pinned host buffers taken from a pool that is reused across calls.
"""

from __future__ import annotations

import math
from typing import Any, NamedTuple

import numpy as np

from ..backend import device_copy
from .cuda_aware import is_cuda_aware

__all__ = ["ArrayMeta", "array_meta", "output_array_meta", "check_output", "check_same_dtype",
           "HostStager", "HOST", "Stager", "stager", "PINNED_POOL"]


class ArrayMeta(NamedTuple):
    """What a call needs to know of a buffer, read once per buffer by :func:`array_meta`."""

    dtype: np.dtype
    size: int  #: number of elements
    contiguous: bool  #: C-contiguous
    on_gpu: bool  #: in GPU memory (``__cuda_array_interface__``)
    nbytes: int  #: bytes of the elements, ``size * dtype.itemsize``

    @classmethod
    def of(cls, dtype: np.dtype, size: int, contiguous: bool, on_gpu: bool) -> ArrayMeta:
        """The metadata of ``size`` elements of ``dtype`` (``nbytes`` computed)."""
        return cls(dtype, size, contiguous, on_gpu, size * dtype.itemsize)


# The ArrayMeta of host arrays by (dtype, size, C-contiguous), built once: building a named
# tuple costs more than the rest of a call's checks, and repeated calls pass the same kinds
# of arrays. The values are immutable, so every call may share them.
_HOST_METAS: dict[tuple[np.dtype, int, bool], ArrayMeta] = {}


def _host_meta(dtype: np.dtype, size: int, contiguous: bool) -> ArrayMeta:
    key = (dtype, size, contiguous)
    m = _HOST_METAS.get(key)
    if m is None:
        if len(_HOST_METAS) >= 4096:
            _HOST_METAS.clear()
        m = _HOST_METAS[key] = ArrayMeta.of(dtype, size, contiguous, False)
    return m


def array_meta(a: Any, arg: str, op: str) -> ArrayMeta:
    """The :class:`ArrayMeta` of a NumPy or GPU array; TypeError otherwise."""
    if isinstance(a, np.ndarray):
        return _host_meta(a.dtype, a.size, a.flags.c_contiguous)
    if hasattr(a, "__cuda_array_interface__"):
        dt, shape, contig = device_copy.device_array_meta(a)
        return ArrayMeta.of(dt, math.prod(shape), contig, True)
    raise TypeError(f"{op}: {arg} must be a NumPy or CuPy array, got {type(a).__name__}")


def output_array_meta(a: Any, arg: str, op: str) -> ArrayMeta:
    """:func:`array_meta` plus :func:`check_output`, fast for writable contiguous NumPy arrays."""
    if isinstance(a, np.ndarray):
        f = a.flags
        if f.c_contiguous and f.writeable:
            m = _HOST_METAS.get((a.dtype, a.size, True))
            return m if m is not None else _host_meta(a.dtype, a.size, True)
    m = array_meta(a, arg, op)
    check_output(a, m, arg, op)
    return m


def check_output(a: Any, m: ArrayMeta, arg: str, op: str) -> None:
    """ValueError unless the buffer ``a`` can receive data in place."""
    if not m.contiguous:
        raise ValueError(
            f"{op}: {arg} receives data and must be C-contiguous, got a non-contiguous array "
            f"of shape {tuple(getattr(a, 'shape', ()))}; pass np.ascontiguousarray(...) and copy back")
    if not m.on_gpu and not a.flags.writeable:
        raise ValueError(f"{op}: {arg} receives data but is read-only")


def check_same_dtype(m: ArrayMeta, ref: ArrayMeta, arg: str, ref_arg: str, op: str) -> None:
    """TypeError unless two buffers share a dtype."""
    if m.dtype != ref.dtype:
        raise TypeError(f"{op}: {arg} has dtype {m.dtype} but {ref_arg} has dtype {ref.dtype}; "
                        "they must match")


#: Page-locked host buffers for staging, reused across calls
#: (:func:`sbpmpi.backend.device_copy.pinned_pool`).
PINNED_POOL = device_copy.pinned_pool()


class HostStager:
    """The buffers of a call whose arrays are all on the host: nothing to stage."""

    __slots__ = ()
    staged = False

    def inp(self, a: Any, m: ArrayMeta) -> Any:
        """The buffer MPI reads ``a`` from (a contiguous copy if needed)."""
        return a if m.contiguous else np.ascontiguousarray(a)

    def out(self, a: Any, m: ArrayMeta, copy_in: bool = False) -> Any:
        """The buffer MPI writes the result for ``a`` into."""
        return a

    def finish(self) -> None:
        """Copy staged results into their GPU arrays (nothing here)."""

    def release(self) -> None:
        """Return staging buffers to the pool (nothing here)."""

    def __enter__(self) -> HostStager:
        return self

    def __exit__(self, et: Any, e: Any, tb: Any) -> None:
        """Nothing to copy back or release on the host."""


HOST = HostStager()


class Stager(HostStager):
    """Turns the arrays of one call with GPU arrays into buffers for MPI.

    Use ``inp``/``out`` before the MPI call, ``finish()`` after it succeeded and
    ``release()`` in a ``finally``; as a context manager (``with stager(...) as st:``) it
    calls ``finish()`` when the block succeeds and ``release()`` always. GPU arrays go directly when the MPI is CUDA-aware and
    the reduction is not ``host_only``, else through pooled pinned host buffers.
    """

    __slots__ = ("direct", "staged", "_back", "_held")

    def __init__(self, host_only: bool = False) -> None:
        self.direct: bool | None = None if not host_only else False
        self.staged = False
        self._back: list[tuple[np.ndarray, Any]] = []
        self._held: list[np.ndarray] = []

    def _direct(self) -> bool:
        if self.direct is None:
            self.direct = is_cuda_aware()
        return self.direct

    def _host(self, dtype: np.dtype, size: int) -> np.ndarray:
        self.staged = True
        nbytes = size * dtype.itemsize
        if nbytes == 0:
            return np.empty(size, dtype=dtype)
        buf = PINNED_POOL.acquire(nbytes)
        self._held.append(buf)
        return buf[:nbytes].view(dtype)

    def inp(self, a: Any, m: ArrayMeta) -> Any:
        """The buffer MPI reads ``a`` from."""
        if not m.on_gpu:
            return a if m.contiguous else np.ascontiguousarray(a)
        if not m.contiguous:
            a = device_copy.ascontiguous_device(a)
        device_copy.sync_for_transfer(a)
        if self._direct():
            return a
        h = self._host(m.dtype, m.size)
        device_copy.copy_device_to_host(a, h)
        return h

    def out(self, a: Any, m: ArrayMeta, copy_in: bool = False) -> Any:
        """The buffer MPI writes the result for ``a`` into (reads it first if ``copy_in``)."""
        if not m.on_gpu:
            return a
        device_copy.sync_for_transfer(a)
        if self._direct():
            return a
        h = self._host(m.dtype, m.size)
        if copy_in:
            device_copy.copy_device_to_host(a, h)
        self._back.append((h, a))
        return h

    def finish(self) -> None:
        """Copy staged results into their GPU arrays."""
        for h, a in self._back:
            device_copy.copy_host_to_device(h, a)
        self._back.clear()

    def release(self) -> None:
        """Return the staging buffers to the pool."""
        for buf in self._held:
            PINNED_POOL.release(buf)
        self._held.clear()

    def __exit__(self, et: Any, e: Any, tb: Any) -> None:
        try:
            if et is None:
                self.finish()
        finally:
            self.release()


def stager(on_device: bool, host_only: bool = False) -> HostStager:
    """:data:`HOST` for host-only calls, else a new :class:`Stager`."""
    return Stager(host_only) if on_device else HOST
