"""Array buffers on their way to MPI: checks, contiguous copies, GPU staging.

Host (NumPy) arrays go to MPI as they are (a contiguous copy for non-contiguous
inputs). GPU arrays go directly when the MPI library is CUDA-aware, after the stream
that produced them is synchronised; otherwise, and for user-defined reductions, they
are staged through pinned host buffers taken from a pool that is reused across calls.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from ..backend import device_copy
from .cuda_aware import is_cuda_aware

__all__ = ["ArrayMeta", "array_meta", "output_array_meta", "check_output", "check_same_dtype",
           "HostStager", "HOST", "Stager", "stager", "PinnedPool", "POOL"]

# (dtype, number of elements, C-contiguous, on GPU)
ArrayMeta = tuple[np.dtype, int, bool, bool]


def array_meta(a: Any, arg: str, op: str) -> ArrayMeta:
    """(dtype, size, C-contiguous, on GPU) of a NumPy or GPU array; TypeError otherwise."""
    if isinstance(a, np.ndarray):
        return a.dtype, a.size, a.flags.c_contiguous, False
    if hasattr(a, "__cuda_array_interface__"):
        dt, shape, contig = device_copy.device_array_meta(a)
        return dt, math.prod(shape), contig, True
    raise TypeError(f"{op}: {arg} must be a NumPy or CuPy array, got {type(a).__name__}")


def output_array_meta(a: Any, arg: str, op: str) -> ArrayMeta:
    """:func:`array_meta` plus :func:`check_output`, fast for writable contiguous NumPy arrays."""
    if isinstance(a, np.ndarray):
        f = a.flags
        if f.c_contiguous and f.writeable:
            return a.dtype, a.size, True, False
    m = array_meta(a, arg, op)
    check_output(a, m, arg, op)
    return m


def check_output(a: Any, m: ArrayMeta, arg: str, op: str) -> None:
    """ValueError unless the buffer ``a`` can receive data in place."""
    if not m[2]:
        raise ValueError(
            f"{op}: {arg} receives data and must be C-contiguous, got a non-contiguous array "
            f"of shape {tuple(getattr(a, 'shape', ()))}; pass np.ascontiguousarray(...) and copy back")
    if not m[3] and not a.flags.writeable:
        raise ValueError(f"{op}: {arg} receives data but is read-only")


def check_same_dtype(m: ArrayMeta, ref: ArrayMeta, arg: str, ref_arg: str, op: str) -> None:
    """TypeError unless two buffers share a dtype."""
    if m[0] != ref[0]:
        raise TypeError(f"{op}: {arg} has dtype {m[0]} but {ref_arg} has dtype {ref[0]}; "
                        "they must match")


class PinnedPool:
    """Reusable page-locked host buffers, one free list per power-of-two size.

    ``acquire`` returns a buffer of at least the asked size; ``release`` gives it back.
    At most ``keep`` free buffers are kept per size.
    """

    def __init__(self, keep: int = 4, min_bytes: int = 4096) -> None:
        self.keep = keep
        self.min_bytes = min_bytes
        self._free: dict[int, list[np.ndarray]] = {}
        self.allocations = 0
        self.reuses = 0
        self.bytes_allocated = 0

    def acquire(self, nbytes: int) -> np.ndarray:
        cap = max(self.min_bytes, 1 << max(0, nbytes - 1).bit_length())
        free = self._free.get(cap)
        if free:
            self.reuses += 1
            return free.pop()
        self.allocations += 1
        self.bytes_allocated += cap
        return device_copy.empty_pinned(cap)

    def release(self, buf: np.ndarray) -> None:
        free = self._free.setdefault(buf.nbytes, [])
        if len(free) < self.keep:
            free.append(buf)

    def cached_bytes(self) -> int:
        return sum(b.nbytes for free in self._free.values() for b in free)

    def clear(self) -> None:
        self._free.clear()


POOL = PinnedPool()


class HostStager:
    """The buffers of a call whose arrays are all on the host: nothing to stage."""

    __slots__ = ()
    staged = False

    def inp(self, a: Any, m: ArrayMeta) -> Any:
        """The buffer MPI reads ``a`` from (a contiguous copy if needed)."""
        return a if m[2] else np.ascontiguousarray(a)

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
        buf = POOL.acquire(nbytes)
        self._held.append(buf)
        return buf[:nbytes].view(dtype)

    def inp(self, a: Any, m: ArrayMeta) -> Any:
        """The buffer MPI reads ``a`` from."""
        if not m[3]:
            return a if m[2] else np.ascontiguousarray(a)
        if not m[2]:
            a = device_copy.ascontiguous_device(a)
        device_copy.sync_for_transfer(a)
        if self._direct():
            return a
        h = self._host(m[0], m[1])
        device_copy.copy_device_to_host(a, h)
        return h

    def out(self, a: Any, m: ArrayMeta, copy_in: bool = False) -> Any:
        """The buffer MPI writes the result for ``a`` into (reads it first if ``copy_in``)."""
        if not m[3]:
            return a
        device_copy.sync_for_transfer(a)
        if self._direct():
            return a
        h = self._host(m[0], m[1])
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
            POOL.release(buf)
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
