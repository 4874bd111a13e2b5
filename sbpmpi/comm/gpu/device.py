"""The device operations the CUDA IPC transport needs, and their CUDA implementation.

:class:`Device` is the whole interface: the IPC protocol (:mod:`.ipc`) is written against
it, so that a stand-in over host memory (``tests/comm/gpu/fake_ipc.py``) can drive the protocol
on a machine without a GPU. :class:`CupyDevice` implements it with CuPy's runtime API
(``ipcGetMemHandle`` / ``ipcOpenMemHandle`` / ``ipcCloseMemHandle``, ``memcpyAsync``) and
the driver's ``cuMemGetAddressRange_v2`` / ``cuPointerGetAttribute`` (through ctypes:
CuPy does not expose them). CuPy's memory pool packs arrays into shared allocations and
views are interior pointers, so a buffer is exported as the handle of its *allocation*
plus the offset of the data in it.

Streams: the work that produced a buffer may run on any stream of the process (CuPy's
current one, a non-blocking stream, a PyTorch stream), so :meth:`CupyDevice.synchronize`
waits for the whole device (``cudaDeviceSynchronize``), not for one stream: only then may
a peer read the buffer through its mapping.
"""

from __future__ import annotations

import ctypes
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np

from ... import backend
from ...backend.memory import Block
from ..reduce_op import UFUNCS, ReduceOp

__all__ = ["Allocation", "Device", "CupyDevice", "HANDLE_BYTES", "ufunc_name"]

HANDLE_BYTES = 64  # sizeof(cudaIpcMemHandle_t)

# ReduceOp -> the elementwise function done on the device. On bool, add/multiply/maximum/
# minimum are or/and/or/and: what the MPI path does (LOR, LAND). AVG sums, then divides.
# (The names come from comm's ufunc table, whose sum/max/min rows are core.reduction's.)
_UFUNC = {ReduceOp.AVG: "add", **{op: u.__name__ for op, u in UFUNCS.items()}}


def ufunc_name(op: ReduceOp) -> str:
    """The NumPy/CuPy ufunc that reduces two buffers for ``op``."""
    return _UFUNC[op]


@dataclass(frozen=True)
class Allocation:
    """The device allocation a pointer lies in: its base, size and a process-unique id."""

    base: int
    size: int
    id: int


class Device(Protocol):
    """What the IPC transport asks of a device. Pointers are ints; copies and reductions
    are queued in order on one stream and complete at :meth:`synchronize`."""

    name: str

    def owns(self, a: Any) -> bool:
        """True when the array ``a`` lives in memory this device can export."""

    def pointer(self, a: Any) -> int:
        """Address of the first element of ``a``."""

    def allocation(self, ptr: int) -> Allocation | None:
        """The allocation holding ``ptr``, or None when it cannot be shared by IPC."""

    def export(self, base: int) -> bytes:
        """The IPC handle of the allocation at ``base`` (at most HANDLE_BYTES bytes)."""

    def open(self, handle: bytes) -> int:
        """Map a peer's allocation into this process; returns its base here."""

    def close(self, mapped: int) -> None:
        """Unmap an allocation opened with :meth:`open`."""

    def copy(self, dst: int, src: int, nbytes: int) -> None:
        """Queue a copy of ``nbytes`` from ``src`` to ``dst``."""

    def reduce(self, dst: int, src: int, nbytes: int, dtype: np.dtype, op: ReduceOp) -> None:
        """Queue ``dst = op(dst, src)`` elementwise over ``nbytes`` of ``dtype``."""

    def divide(self, dst: int, nbytes: int, dtype: np.dtype, by: int) -> None:
        """Queue ``dst /= by`` (for AVG)."""

    def scratch(self, nbytes: int) -> Block:
        """A local buffer of at least ``nbytes`` (its address, and the array that keeps it)."""

    def synchronize(self) -> None:
        """Wait until the queued work, and all work producing the buffers (on any stream of
        this process), is done."""


_CU_POINTER_ATTRIBUTE_BUFFER_ID = 7
_CU_POINTER_ATTRIBUTE_IS_LEGACY_CUDA_IPC_CAPABLE = 10
_CUDA_IPC_MEM_LAZY_ENABLE_PEER_ACCESS = 1
_CUDA_MEMCPY_DEFAULT = 4


class CupyDevice:
    """:class:`Device` on CuPy arrays of the current GPU (needs CuPy and ``libcuda.so.1``)."""

    name = "cuda"

    def __init__(self) -> None:
        import cupy as cp

        self.cp = cp
        drv = ctypes.CDLL("libcuda.so.1")
        self._range = drv.cuMemGetAddressRange_v2
        self._range.argtypes = [ctypes.POINTER(ctypes.c_uint64), ctypes.POINTER(ctypes.c_size_t),
                                ctypes.c_uint64]
        self._range.restype = ctypes.c_int
        self._attr = drv.cuPointerGetAttribute
        self._attr.argtypes = [ctypes.c_void_p, ctypes.c_int, ctypes.c_uint64]
        self._attr.restype = ctypes.c_int
        self.device_id = int(cp.cuda.Device().id)

    def owns(self, a: Any) -> bool:
        """A CuPy array of this device in memory that IPC can share (not stream-ordered or
        managed memory: :meth:`allocation` says)."""
        if not backend.is_cupy_array(a) or int(a.device.id) != self.device_id:
            return False
        return a.size == 0 or self.allocation(self.pointer(a)) is not None

    def pointer(self, a: Any) -> int:
        return int(a.data.ptr)

    def allocation(self, ptr: int) -> Allocation | None:
        base, size = ctypes.c_uint64(0), ctypes.c_size_t(0)
        if self._range(ctypes.byref(base), ctypes.byref(size), ptr) != 0:
            return None
        capable = ctypes.c_int(1)
        if self._attr(ctypes.byref(capable), _CU_POINTER_ATTRIBUTE_IS_LEGACY_CUDA_IPC_CAPABLE,
                      ptr) == 0 and not capable.value:
            return None  # e.g. stream-ordered (cudaMallocAsync) memory
        bid = ctypes.c_uint64(0)
        if self._attr(ctypes.byref(bid), _CU_POINTER_ATTRIBUTE_BUFFER_ID, ptr) != 0:
            # an old driver: (base, size) stands in for the id (a freed and reallocated
            # range of the same size then looks unchanged: handles are re-exported per call)
            return Allocation(int(base.value), int(size.value), -1)
        return Allocation(int(base.value), int(size.value), int(bid.value))

    def export(self, base: int) -> bytes:
        return bytes(self.cp.cuda.runtime.ipcGetMemHandle(base))

    def open(self, handle: bytes) -> int:
        return int(self.cp.cuda.runtime.ipcOpenMemHandle(
            handle, _CUDA_IPC_MEM_LAZY_ENABLE_PEER_ACCESS))

    def close(self, mapped: int) -> None:
        self.cp.cuda.runtime.ipcCloseMemHandle(mapped)

    def copy(self, dst: int, src: int, nbytes: int) -> None:
        stream = self.cp.cuda.get_current_stream().ptr
        self.cp.cuda.runtime.memcpyAsync(dst, src, nbytes, _CUDA_MEMCPY_DEFAULT, stream)

    def _view(self, ptr: int, nbytes: int, dtype: np.dtype) -> Any:
        cp = self.cp
        mem = cp.cuda.UnownedMemory(ptr, nbytes, None, self.device_id)
        return cp.ndarray((nbytes // dtype.itemsize,), dtype, cp.cuda.MemoryPointer(mem, 0))

    def reduce(self, dst: int, src: int, nbytes: int, dtype: np.dtype, op: ReduceOp) -> None:
        d = self._view(dst, nbytes, dtype)
        getattr(self.cp, ufunc_name(op))(d, self._view(src, nbytes, dtype), out=d)

    def divide(self, dst: int, nbytes: int, dtype: np.dtype, by: int) -> None:
        d = self._view(dst, nbytes, dtype)
        d /= by

    def scratch(self, nbytes: int) -> Block:
        buf = self.cp.empty(max(nbytes, 1), dtype=np.uint8)
        return Block(int(buf.data.ptr), buf)

    def synchronize(self) -> None:
        # the whole device: the buffers may come from any stream (module docstring)
        self.cp.cuda.runtime.deviceSynchronize()
