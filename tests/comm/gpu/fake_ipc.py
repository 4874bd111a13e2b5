"""A stand-in device for the CUDA IPC protocol, over host memory shared between processes.

"Device memory" is a set of allocations, each a file in a temporary directory mapped with
``mmap``; an IPC handle is the file's path (and its host), and a peer "opens" it by
mapping the file. Like CuPy's memory pool, :meth:`FakeIpcDevice.array` packs small arrays
into shared 4 MiB allocations, and carves new arrays out of blocks given back
(:meth:`FakeIpcDevice.give_back`), so an array's pointer is interior and two arrays can
share one allocation: the protocol must send base handle + offset. Arrays are
:class:`fake_cuda.FakeCudaArray` views of the mapped bytes. Every call is logged in
``log`` so tests can check the order of synchronisations, barriers and reads.

It keeps CUDA's rules, so that a protocol that breaks them fails here as on a GPU:

- copies and reductions are *queued* (one stream) and happen at :meth:`synchronize`:
  reading a result before synchronising sees the old bytes, and closing a mapping while a
  queued copy still reads or writes it is recorded in :attr:`FakeIpcDevice.violations`
  (the copy is dropped: on a GPU it would fault or read freed memory);
- a second open of a handle that is open in this process returns the same mapping and
  adds a reference, and each close drops one: the mapping goes at the last
  (``cudaIpcOpenMemHandle`` / ``cudaIpcCloseMemHandle`` in one context);
  :attr:`FakeIpcDevice.most_refs` is the most references one mapping has held;
- a process cannot open a handle of its own allocations, nor a handle made on another
  host (``host``: a test gives each pseudo-node its own);
- closing a mapping that is not open (e.g. once more than it was opened) fails
  (``cudaIpcCloseMemHandle``); :attr:`FakeIpcDevice.failing_closes` makes the next closes
  fail *without* closing, as a close that returns an error leaves its reference open;
- freeing an allocation that a peer still maps (CUDA leaves it undefined; in practice
  the memory stays with the peer, out of reach of ``free_all_blocks``) is recorded in
  :attr:`FakeIpcDevice.violations`: each open leaves a marker file beside the exporter's
  allocation, each close removes it, and :meth:`FakeIpcDevice.free` looks for them;
- an allocation made with ``ipc=False`` (as ``cudaMallocAsync`` or managed memory) cannot
  be shared: :meth:`FakeIpcDevice.allocation` says None for it.
"""

from __future__ import annotations

import ctypes
import glob
import hashlib
import itertools
import mmap
import os
import socket
import tempfile
from typing import Any, NamedTuple

import numpy as np
from fake_cuda import FakeCudaArray

from sbpmpi.backend.memory import Block
from sbpmpi.comm.gpu.device import Allocation, ufunc_name
from sbpmpi.comm.reduce_op import ReduceOp

CHUNK = 4 << 20
ALIGN = 256


def _view(ptr: int, nbytes: int, dtype: np.dtype) -> np.ndarray:
    if nbytes == 0:
        return np.empty(0, dtype)
    return np.frombuffer((ctypes.c_char * nbytes).from_address(ptr), dtype=dtype)


def host_tag(host: str) -> str:
    """The short tag of a host name carried in handles."""
    return hashlib.blake2b(host.encode(), digest_size=4).hexdigest()


class _Alloc:
    def __init__(self, path: str, size: int, aid: int, ipc: bool = True) -> None:
        self.path, self.size, self.id, self.ipc = path, size, aid, ipc
        with open(path, "wb") as f:
            f.truncate(size)
        with open(path, "r+b") as f:
            self.mm = mmap.mmap(f.fileno(), size)
        self.bytes = np.frombuffer(self.mm, dtype=np.uint8)
        self.base = int(self.bytes.ctypes.data)
        self.used = 0


class _Block(NamedTuple):
    """A free block of an allocation (given back), to be carved again."""

    alloc: _Alloc
    off: int
    size: int


class _Opened(NamedTuple):
    """A peer's allocation mapped in this process."""

    mm: mmap.mmap
    bytes: np.ndarray
    path: str


class _Queued(NamedTuple):
    """A copy or reduction queued on the stream."""

    kind: str
    dst: int
    src: int
    nbytes: int
    dtype: np.dtype | None = None
    op: ReduceOp | None = None

    def touches(self, base: int, size: int) -> bool:
        return any(base < p + self.nbytes and p < base + size for p in (self.dst, self.src))


class FakeIpcDevice:
    """The :class:`sbpmpi.comm.gpu.device.Device` interface over shared host memory."""

    name = "fake"
    _ids = itertools.count(1)

    def __init__(self, tag: str = "", chunk: int = CHUNK, host: str | None = None) -> None:
        self.dir = tempfile.mkdtemp(prefix=f"sbf-{tag}-")
        self.chunk = chunk
        self.host = host if host is not None else socket.gethostname()
        self.allocs: list[_Alloc] = []
        self.free_blocks: list[_Block] = []
        self.opened: dict[int, _Opened] = {}  # by its base here
        self.open_paths: dict[str, int] = {}  # handle (path) -> base: one mapping per handle
        self.refs: dict[int, int] = {}  # base -> the opens not closed yet
        self.most_refs = 0
        self.violations: list[str] = []  # CUDA rules broken by this process or its peers
        self.token = f"{os.getpid()}-{id(self):x}"  # this "process" in marker names
        self.log: list[tuple[Any, ...]] = []
        self.queue: list[_Queued] = []  # the stream: copies and reductions not yet done
        self.failing_closes = 0  # the next closes fail and leave the mapping open
        self._cur: _Alloc | None = None

    # -- allocation (as a pooled allocator) ---------------------------------------------------

    def _new(self, size: int, ipc: bool = True) -> _Alloc:
        aid = next(self._ids)
        a = _Alloc(os.path.join(self.dir, f"a{aid}"), size, aid, ipc)
        self.allocs.append(a)
        return a

    def _carve(self, n: int) -> tuple[_Alloc, int] | None:
        """A block given back, of at least ``n`` bytes, split as CuPy's pool splits one."""
        need = -(-max(n, 1) // ALIGN) * ALIGN
        for i, b in enumerate(self.free_blocks):
            if b.size >= need:
                del self.free_blocks[i]
                if b.size > need:
                    self.free_blocks.insert(i, _Block(b.alloc, b.off + need, b.size - need))
                return b.alloc, b.off
        return None

    def empty(self, shape: Any, dtype: Any, ipc: bool = True) -> FakeCudaArray:
        """An uninitialised array: carved from a block given back, else packed into the
        current shared allocation, else (large) in an allocation of its own. ``ipc=False``:
        in an allocation that cannot be shared (stream-ordered or managed memory)."""
        dt = np.dtype(dtype)
        n = int(np.prod(shape)) * dt.itemsize
        got = self._carve(n) if ipc else None
        if got is not None:
            a, off = got
        elif n > self.chunk // 2 or not ipc:
            a = self._new(max(n, ALIGN), ipc)  # large arrays get their own allocation
            a.used = n
            off = 0
        else:
            if self._cur is None or self._cur.used + n > self._cur.size:
                self._cur = self._new(self.chunk)
            a, off = self._cur, self._cur.used
            a.used += -(-max(n, 1) // ALIGN) * ALIGN
        return FakeCudaArray(a.bytes[off:off + n].view(dt).reshape(shape))

    def array(self, values: Any, offset_pad: int = 0, ipc: bool = True) -> FakeCudaArray:
        v = np.asarray(values)
        if offset_pad:  # leave a gap first so the data sits deeper into the allocation
            self.empty(offset_pad, np.uint8)
        out = self.empty(v.shape, v.dtype, ipc)
        out._host[...] = v
        return out

    def give_back(self, arr: FakeCudaArray) -> None:
        """``arr`` is gone: its block goes back to the pool (its allocation stays)."""
        ptr, n = self.pointer(arr), arr.size * arr.dtype.itemsize
        for a in self.allocs:
            if a.base <= ptr < a.base + a.size:
                self.free_blocks.append(_Block(a, ptr - a.base, -(-max(n, 1) // ALIGN) * ALIGN))
                return
        raise ValueError("the array is not in an allocation of this device")

    def free(self) -> None:
        """Free every allocation (the files go; new arrays get new allocations), as
        ``free_all_blocks`` does once the arrays are gone. An allocation that a peer still
        maps is recorded in :attr:`violations`."""
        for a in self.allocs:
            holders = sorted(m.rsplit(".map-", 1)[1] for m in glob.glob(a.path + ".map-*"))
            if holders:
                self.violations.append(f"allocation a{a.id} freed while mapped by {holders}")
            os.unlink(a.path)
        self.allocs, self._cur, self.free_blocks = [], None, []

    def mapped_by_peers(self) -> list[str]:
        """The markers of peers' open mappings of this device's allocations."""
        return sorted(os.path.basename(m) for a in self.allocs
                      for m in glob.glob(a.path + ".map-*"))

    def cleanup(self) -> None:
        self.queue.clear()
        self.failing_closes = 0
        for base in list(self.opened):
            while base in self.opened:
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
                return Allocation(a.base, a.size, a.id) if a.ipc else None
        return None

    def export(self, base: int) -> bytes:
        for a in self.allocs:
            if a.base == base:
                self.log.append(("export", a.id))
                return f"{host_tag(self.host)}|{a.path}".encode()
        raise ValueError(f"no allocation at {base:#x}")

    def open(self, handle: bytes) -> int:
        tag, _, path = handle.rstrip(b"\0").decode().partition("|")
        if tag != host_tag(self.host):
            raise RuntimeError(f"cudaIpcOpenMemHandle: the handle of {os.path.basename(path)} "
                               f"was made on another host (stand-in: CUDA IPC works within "
                               f"one node; this is {self.host})")
        if os.path.dirname(path) == self.dir:
            raise RuntimeError(f"cudaIpcOpenMemHandle: {os.path.basename(path)} is this "
                               "process's own allocation (stand-in of CUDA's rule)")
        base = self.open_paths.get(path)
        if base is not None:  # CUDA: the same pointer, one more reference
            self.refs[base] += 1
            self.most_refs = max(self.most_refs, self.refs[base])
            self.log.append(("open", os.path.basename(path)))
            return base
        with open(path, "r+b") as f:
            mm = mmap.mmap(f.fileno(), 0)
        arr = np.frombuffer(mm, dtype=np.uint8)
        base = int(arr.ctypes.data)
        self.opened[base] = _Opened(mm, arr, path)
        self.open_paths[path] = base
        self.refs[base] = 1
        self.most_refs = max(self.most_refs, 1)
        open(f"{path}.map-{self.token}", "w").close()
        self.log.append(("open", os.path.basename(path)))
        return base

    def close(self, mapped: int) -> None:
        if mapped not in self.opened:
            raise RuntimeError(f"cudaIpcCloseMemHandle: {mapped:#x} is not an open mapping "
                               "(closed twice?) (stand-in of CUDA's rule)")
        if self.failing_closes:
            self.failing_closes -= 1
            self.log.append(("close-failed", mapped))
            raise RuntimeError("cudaIpcCloseMemHandle failed (injected): the mapping stays open")
        self.log.append(("close", mapped))
        self.refs[mapped] -= 1
        if self.refs[mapped]:  # other opens still hold it: nothing is unmapped
            return
        del self.refs[mapped]
        m = self.opened.pop(mapped)
        size = m.bytes.nbytes
        in_flight = [q for q in self.queue if q.touches(mapped, size)]
        if in_flight:
            self.violations.append(f"the mapping of {os.path.basename(m.path)} closed while "
                                   f"{len(in_flight)} queued copies still use it")
            self.queue = [q for q in self.queue if not q.touches(mapped, size)]
        del self.open_paths[m.path]
        try:
            os.unlink(f"{m.path}.map-{self.token}")
        except FileNotFoundError:  # the exporter's cleanup already removed it
            pass
        mm = m.mm
        del m  # the view of the bytes goes with it, so that the map can close
        try:
            mm.close()
        except BufferError:  # a view is still alive somewhere: the GC unmaps it later
            pass

    def copy(self, dst: int, src: int, nbytes: int) -> None:
        self.log.append(("copy", nbytes))
        self.queue.append(_Queued("copy", dst, src, nbytes))

    def reduce(self, dst: int, src: int, nbytes: int, dtype: np.dtype, op: ReduceOp) -> None:
        self.log.append(("reduce", nbytes))
        self.queue.append(_Queued("reduce", dst, src, nbytes, dtype, op))

    def divide(self, dst: int, nbytes: int, dtype: np.dtype, by: int) -> None:
        self._run_queue()  # in stream order, after what is queued
        d = _view(dst, nbytes, dtype)
        np.divide(d, by, out=d)

    def scratch(self, nbytes: int) -> Block:
        buf = np.empty(max(nbytes, 1), np.uint8)
        return Block(int(buf.ctypes.data), buf)

    def synchronize(self) -> None:
        self.log.append(("sync",))
        self._run_queue()

    def _run_queue(self) -> None:
        queue, self.queue = self.queue, []
        for q in queue:
            if q.kind == "copy":
                ctypes.memmove(q.dst, q.src, q.nbytes)
            else:
                assert q.dtype is not None and q.op is not None
                d = _view(q.dst, q.nbytes, q.dtype)
                getattr(np, ufunc_name(q.op))(d, _view(q.src, q.nbytes, q.dtype), out=d)
