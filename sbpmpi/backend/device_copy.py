"""GPU arrays handed to MPI: their metadata, pointers, stream synchronisation and copies
between device and host memory (used by ``sbpmpi.comm`` to stage or pass GPU data)."""

from __future__ import annotations

import ctypes
from typing import Any

import numpy as np

from .. import backend as arrays  # the module, so that tests can stand in for CuPy there
from .memory import BlockPool

__all__ = [
    "device_array_meta",
    "device_pointer",
    "sync_for_transfer",
    "ascontiguous_device",
    "copy_device_to_host",
    "copy_host_to_device",
    "empty_pinned",
    "pinned_pool",
    "cupy_allocator_name",
]


def device_array_meta(a: Any) -> tuple[np.dtype, tuple[int, ...], bool]:
    """(dtype, shape, C-contiguous) of a GPU array, from CuPy or ``__cuda_array_interface__``."""
    if arrays.is_cupy_array(a):
        return a.dtype, tuple(a.shape), bool(a.flags.c_contiguous)
    cai = a.__cuda_array_interface__
    dtype = np.dtype(cai["typestr"])
    shape = tuple(int(n) for n in cai["shape"])
    strides = cai.get("strides")
    contiguous = strides is None or _c_contiguous(shape, tuple(strides), dtype.itemsize)
    if cai.get("mask") is not None:
        raise TypeError(f"masked CUDA arrays are not supported, got {type(a).__name__}")
    return dtype, shape, contiguous


def _c_contiguous(shape: tuple[int, ...], strides: tuple[int, ...], itemsize: int) -> bool:
    expected = itemsize
    for n, st in zip(reversed(shape), reversed(strides)):
        if n == 0:
            return True
        if n != 1 and st != expected:
            return False
        expected *= n
    return True


def device_pointer(a: Any) -> int:
    """Address of the first element of a GPU array."""
    if arrays.is_cupy_array(a):
        return int(a.data.ptr)
    return int(a.__cuda_array_interface__["data"][0])


def sync_for_transfer(a: Any) -> None:
    """Wait until pending GPU work that produces ``a`` is done, before MPI (or a staging
    copy) reads or writes it.

    The work may have run on any stream of the process (CuPy's current one, a non-blocking
    stream, a PyTorch stream), and neither a CuPy array nor ``cudaMemcpy`` says which, so
    this waits for the whole device (``cudaDeviceSynchronize``). Host-backed stand-ins need
    nothing.
    """
    if type(a) in arrays._HOST_BACKED:
        return
    cp = arrays._cupy()
    if cp is None:
        return
    cp.cuda.runtime.deviceSynchronize()


def ascontiguous_device(a: Any) -> Any:
    """Return a C-contiguous GPU array with the values of ``a`` (a copy if needed)."""
    if type(a) in arrays._HOST_BACKED:  # a stand-in over host memory never reaches CuPy
        if hasattr(a, "copy_contiguous"):
            return a.copy_contiguous()
        raise ValueError(f"cannot make a contiguous copy of the host-backed stand-in "
                         f"{type(a).__name__}: it has no copy_contiguous()")
    cp = arrays._cupy()
    if cp is not None:
        return cp.ascontiguousarray(cp.asarray(a))
    raise ValueError(
        f"cannot make a contiguous copy of a non-contiguous {type(a).__name__} without CuPy; "
        "pass a contiguous array")


def _memcpy(dst: int, src: int, nbytes: int, host_backed: bool) -> None:
    if nbytes == 0:
        return
    if host_backed:
        ctypes.memmove(dst, src, nbytes)
        return
    cp = arrays._cupy()
    if cp is None:
        raise RuntimeError("copying a CUDA array needs CuPy, which is not available")
    cp.cuda.runtime.memcpy(dst, src, nbytes, 4)  # cudaMemcpyDefault (unified addressing)


def copy_device_to_host(src: Any, dst: np.ndarray) -> None:
    """Copy the contiguous GPU array ``src`` into the contiguous host array ``dst`` (bytes)."""
    _memcpy(dst.ctypes.data, device_pointer(src), dst.nbytes, type(src) in arrays._HOST_BACKED)


def copy_host_to_device(src: np.ndarray, dst: Any) -> None:
    """Copy the contiguous host array ``src`` into the contiguous GPU array ``dst`` (bytes)."""
    _memcpy(device_pointer(dst), src.ctypes.data, src.nbytes, type(dst) in arrays._HOST_BACKED)


def empty_pinned(nbytes: int) -> np.ndarray:
    """A page-locked host byte buffer when CuPy is available, else an ordinary one."""
    cp = arrays._cupy()
    if cp is not None:
        import cupyx

        return cupyx.empty_pinned((nbytes,), dtype=np.uint8)
    return np.empty(nbytes, dtype=np.uint8)


def pinned_pool(keep: int = 4, min_bytes: int = 4096) -> BlockPool[np.ndarray]:
    """Reusable page-locked host buffers (:func:`empty_pinned`), one free list per
    power-of-two size of at least ``min_bytes``, at most ``keep`` idle buffers per size:
    ``acquire(nbytes)`` returns a buffer of at least ``nbytes``, ``release(buf)`` gives
    it back."""
    def size_class(nbytes: int) -> int:
        return max(min_bytes, 1 << max(0, nbytes - 1).bit_length())

    # empty_pinned looked up at each call: a test stands in for it
    return BlockPool(lambda n: empty_pinned(n), size_class, lambda b: int(b.nbytes),
                     per_size=keep)


def cupy_allocator_name() -> str | None:
    """Name of CuPy's current device allocator (None without CuPy).

    ``"MemoryPool"`` is CuPy's default; ``"MemoryAsyncPool"`` (stream-ordered) breaks the
    CUDA IPC that CUDA-aware MPI libraries use between processes on one node.
    """
    cp = arrays._cupy()
    if cp is None:
        return None
    alloc = cp.cuda.get_allocator()
    owner = getattr(alloc, "__self__", None)
    return type(owner).__name__ if owner is not None else getattr(alloc, "__name__", str(alloc))
