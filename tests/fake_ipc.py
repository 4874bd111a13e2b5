"""A stand-in device for the CUDA IPC protocol, over host memory shared between processes.

"Device memory" is a set of allocations, each a file in a temporary directory mapped with
``mmap``; an IPC handle is the file's path, and a peer "opens" it by mapping the file.
Like CuPy's memory pool, :meth:`FakeIpcDevice.array` packs small arrays into shared
4 MiB allocations, so an array's pointer is interior and the protocol must send base
handle + offset. Arrays are :class:`fake_cuda.FakeCudaArray` views of the mapped bytes.
Every call is logged in ``log`` so tests can check the order of synchronisations,
barriers and reads.

It keeps CUDA's IPC rules, so that a protocol that breaks them fails here as on a GPU:

- a process cannot open the same handle twice while the first mapping is open
  (``cudaIpcOpenMemHandle`` refuses it), nor open a handle of its own allocations;
- closing a mapping that is not open (e.g. twice) fails (``cudaIpcCloseMemHandle``);
- freeing an allocation that a peer still maps (CUDA leaves it undefined; in practice
  the memory stays with the peer, out of reach of ``free_all_blocks``) is recorded in
  :attr:`FakeIpcDevice.violations`: each open leaves a marker file beside the exporter's
  allocation, each close removes it, and :meth:`FakeIpcDevice.free` looks for them.
"""

from __future__ import annotations

import ctypes
import glob
import itertools
import mmap
import os
import tempfile
from typing import Any

import numpy as np
from fake_cuda import FakeCudaArray

from sbpmpi.comm.gpu.device import Allocation, ufunc_name
from sbpmpi.comm.reduce_op import ReduceOp

CHUNK = 4 << 20
ALIGN = 256


def _view(ptr: int, nbytes: int, dtype: np.dtype) -> np.ndarray:
    if nbytes == 0:
        return np.empty(0, dtype)
    return np.frombuffer((ctypes.c_char * nbytes).from_address(ptr), dtype=dtype)


class _Alloc:
    def __init__(self, path: str, size: int, aid: int) -> None:
        self.path, self.size, self.id = path, size, aid
        with open(path, "wb") as f:
            f.truncate(size)
        with open(path, "r+b") as f:
            self.mm = mmap.mmap(f.fileno(), size)
        self.bytes = np.frombuffer(self.mm, dtype=np.uint8)
        self.base = int(self.bytes.ctypes.data)
        self.used = 0


class FakeIpcDevice:
    """The :class:`sbpmpi.comm.gpu.device.Device` interface over shared host memory."""

    name = "fake"
    _ids = itertools.count(1)

    def __init__(self, tag: str = "", chunk: int = CHUNK) -> None:
        self.dir = tempfile.mkdtemp(prefix=f"sbpmpi-fake-ipc-{tag}-{os.getpid()}-")
        self.chunk = chunk
        self.allocs: list[_Alloc] = []
        self.opened: dict[int, tuple[mmap.mmap, np.ndarray, str]] = {}  # base -> map, path
        self.open_paths: dict[str, int] = {}  # handle (path) -> base: one open per handle
        self.violations: list[str] = []  # CUDA IPC rules broken by this process or its peers
        self.token = f"{os.getpid()}-{id(self):x}"  # this "process" in marker names
        self.log: list[tuple[Any, ...]] = []
        self._cur: _Alloc | None = None

    # -- allocation (as a pooled allocator) ---------------------------------------------------

    def _new(self, size: int) -> _Alloc:
        aid = next(self._ids)
        a = _Alloc(os.path.join(self.dir, f"a{aid}"), size, aid)
        self.allocs.append(a)
        return a

    def empty(self, shape: Any, dtype: Any) -> FakeCudaArray:
        dt = np.dtype(dtype)
        n = int(np.prod(shape)) * dt.itemsize
        if n > self.chunk // 2:
            a = self._new(max(n, ALIGN))  # large arrays get their own allocation
            a.used = n
            off = 0
        else:
            if self._cur is None or self._cur.used + n > self._cur.size:
                self._cur = self._new(self.chunk)
            a, off = self._cur, self._cur.used
            a.used += -(-max(n, 1) // ALIGN) * ALIGN
        return FakeCudaArray(a.bytes[off:off + n].view(dt).reshape(shape))

    def array(self, values: Any, offset_pad: int = 0) -> FakeCudaArray:
        v = np.asarray(values)
        if offset_pad:  # leave a gap first so the data sits deeper into the allocation
            self.empty(offset_pad, np.uint8)
        out = self.empty(v.shape, v.dtype)
        out._host[...] = v
        return out

    def free(self) -> None:
        """Free every allocation (the files go; new arrays get new allocations), as
        ``free_all_blocks`` does once the arrays are gone. An allocation that a peer still
        maps is recorded in :attr:`violations`."""
        for a in self.allocs:
            holders = sorted(m.rsplit(".map-", 1)[1] for m in glob.glob(a.path + ".map-*"))
            if holders:
                self.violations.append(f"allocation a{a.id} freed while mapped by {holders}")
            os.unlink(a.path)
        self.allocs, self._cur = [], None

    def mapped_by_peers(self) -> list[str]:
        """The markers of peers' open mappings of this device's allocations."""
        return sorted(os.path.basename(m) for a in self.allocs
                      for m in glob.glob(a.path + ".map-*"))

    def cleanup(self) -> None:
        for base in list(self.opened):
            self.close(base)
        for a in self.allocs:
            if os.path.exists(a.path):
                os.unlink(a.path)
        for m in glob.glob(os.path.join(self.dir, "*.map-*")):
            os.unlink(m)
        try:
            os.rmdir(self.dir)
        except OSError:
            pass

    # -- the Device interface -----------------------------------------------------------------

    def owns(self, a: Any) -> bool:
        if not isinstance(a, FakeCudaArray):
            return False
        if a.size == 0:
            return True
        return self.allocation(self.pointer(a)) is not None

    def pointer(self, a: Any) -> int:
        return int(a.__cuda_array_interface__["data"][0])

    def allocation(self, ptr: int) -> Allocation | None:
        for a in self.allocs:
            if a.base <= ptr < a.base + a.size:
                return Allocation(a.base, a.size, a.id)
        return None

    def export(self, base: int) -> bytes:
        for a in self.allocs:
            if a.base == base:
                self.log.append(("export", a.id))
                return a.path.encode()
        raise ValueError(f"no allocation at {base:#x}")

    def open(self, handle: bytes) -> int:
        path = handle.rstrip(b"\0").decode()
        if os.path.dirname(path) == self.dir:
            raise RuntimeError(f"cudaIpcOpenMemHandle: {os.path.basename(path)} is this "
                               "process's own allocation (stand-in of CUDA's rule)")
        if path in self.open_paths:
            raise RuntimeError(f"cudaIpcOpenMemHandle: the handle of {os.path.basename(path)} "
                               "is already open in this process (CUDA refuses a second open; "
                               "stand-in)")
        with open(path, "r+b") as f:
            mm = mmap.mmap(f.fileno(), 0)
        arr = np.frombuffer(mm, dtype=np.uint8)
        base = int(arr.ctypes.data)
        self.opened[base] = (mm, arr, path)
        self.open_paths[path] = base
        open(f"{path}.map-{self.token}", "w").close()
        self.log.append(("open", os.path.basename(path)))
        return base

    def close(self, mapped: int) -> None:
        if mapped not in self.opened:
            raise RuntimeError(f"cudaIpcCloseMemHandle: {mapped:#x} is not an open mapping "
                               "(closed twice?) (stand-in of CUDA's rule)")
        mm, arr, path = self.opened.pop(mapped)
        del self.open_paths[path], arr
        try:
            os.unlink(f"{path}.map-{self.token}")
        except FileNotFoundError:  # the exporter's cleanup already removed it
            pass
        self.log.append(("close", mapped))
        try:
            mm.close()
        except BufferError:  # a view is still alive somewhere: the GC unmaps it later
            pass

    def copy(self, dst: int, src: int, nbytes: int) -> None:
        self.log.append(("copy", nbytes))
        ctypes.memmove(dst, src, nbytes)

    def reduce(self, dst: int, src: int, nbytes: int, dtype: np.dtype, op: ReduceOp) -> None:
        self.log.append(("reduce", nbytes))
        d = _view(dst, nbytes, dtype)
        getattr(np, ufunc_name(op))(d, _view(src, nbytes, dtype), out=d)

    def divide(self, dst: int, nbytes: int, dtype: np.dtype, by: int) -> None:
        d = _view(dst, nbytes, dtype)
        np.divide(d, by, out=d)

    def scratch(self, nbytes: int) -> tuple[int, Any]:
        buf = np.empty(max(nbytes, 1), np.uint8)
        return int(buf.ctypes.data), buf

    def synchronize(self) -> None:
        self.log.append(("sync",))
