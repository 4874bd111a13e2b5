"""MPI-IO: each rank writes or reads its own block of one array file in one collective call.

The file holds a header of ``offset`` bytes followed by the array's raw bytes in C
(or Fortran) order, as in a ``.npy`` file. A rank's block is described to MPI as a
subarray file view (``Create_subarray(global shape, local shape, starts)``), so the
library turns every rank's part into one collective ``Write_at_all`` /
``Read_at_all``; no rank ever holds more than its own block. A rank with nothing to
move still joins the collective with zero elements.

Elements are moved as opaque runs of ``itemsize`` bytes: any NumPy dtype works and
bytes land on disk exactly as in memory.

The ranks fail together. Everything a rank can fail at happens before the collective
call it feeds, then one agreement, then the call: first each rank makes all it will
need (the bytes of its block: a device-to-host copy or a contiguous copy of a large shard
may not fit; the file view's datatypes; rank 0's header), and the ranks agree on that
before the file is opened; after that, each collective call (open, view, data, sync,
close) is preceded by one small all-reduce on whether everything since the previous one
succeeded on every rank, rank 0's header write included
(:func:`sbpmpi.comm.agreement.raise_if_any`), and one more follows the close. A rank
whose work failed would otherwise skip a collective that the others wait in forever. A
failure on any rank then raises, on every rank, the same ``OSError`` subclass (MPI's
errors are turned into ``OSError`` with the matching errno; a ``MemoryError`` stays one)
``"<what>: rank R: MPI-IO <step> (<what the step does> '<path>'): <cause>"``; the file is
closed on every rank that holds it, and the datatypes freed, first.

:func:`set_fault_hook` is the seam of the fault tests: a hook that raises on one rank at
a step stands for that step failing there: after the step (the I/O itself is done, so the
collective calls all complete as they would on a real failure), or before its call
(``"before <step>"``: where the rank makes what the call needs).
"""

from __future__ import annotations

import errno
import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
from mpi4py import MPI

from .agreement import exchange as agreement
from .call import call
from .group import Group
from .lifecycle import watchdog

__all__ = ["write_blocks", "read_blocks", "bytes_view", "FaultHook", "set_fault_hook",
           "fault_point", "FILE_STEPS", "STEPS", "BEFORE_STEPS", "FAULT_POINTS", "STEP_LABEL",
           "os_error"]

#: The MPI-IO steps of a file, in their order (the header: rank 0 alone, when writing).
FILE_STEPS = ("open", "header", "view", "data", "sync", "close")
#: The steps a fault hook sees once they are done: those of this module, then the
#: checkpoint's own (renaming the temporary file into place, writing a state directory's
#: index).
STEPS = FILE_STEPS + ("rename", "index")
#: The points a fault hook sees before each call of this module: where a rank makes what
#: the call needs (open, header, view, data: before the first agreement), or for a call
#: that needs nothing made (sync, close), just before the agreement that precedes it.
BEFORE_STEPS = tuple(f"before {step}" for step in FILE_STEPS)
#: Every point a fault hook sees.
FAULT_POINTS = STEPS + BEFORE_STEPS

#: The watch label of the agreement before each collective call (and after the close).
STEP_LABEL = "MPI-IO step agreement"

FaultHook = Callable[[str, str], None]


@dataclass
class FaultSeam:
    """The fault tests' hook (None: no fault)."""

    hook: FaultHook | None = None


_FAULTS = FaultSeam()

# MPI error classes of I/O -> errno, so that OSError(errno, ...) takes the matching
# subclass (FileNotFoundError, PermissionError, FileExistsError, ...)
_ERRNO = {
    MPI.ERR_NO_SUCH_FILE: errno.ENOENT, MPI.ERR_ACCESS: errno.EACCES,
    MPI.ERR_READ_ONLY: errno.EROFS, MPI.ERR_NO_SPACE: errno.ENOSPC,
    MPI.ERR_QUOTA: errno.EDQUOT, MPI.ERR_FILE_EXISTS: errno.EEXIST,
    MPI.ERR_FILE_IN_USE: errno.EBUSY, MPI.ERR_BAD_FILE: errno.EINVAL,
    MPI.ERR_AMODE: errno.EINVAL, MPI.ERR_IO: errno.EIO,
}


def set_fault_hook(hook: FaultHook | None) -> FaultHook | None:
    """For fault tests: call ``hook(point, path)`` on each rank at each point of
    :data:`FAULT_POINTS` it reaches: after each step of :data:`STEPS` it performs, and
    before each call of :data:`FILE_STEPS` it makes (``"before <step>"``). An exception it
    raises is that step failing on that rank. None removes it. Returns the hook it
    replaces."""
    previous, _FAULTS.hook = _FAULTS.hook, hook
    return previous


def fault_point(step: str, path: str) -> None:
    """Where a fault hook may fail ``step`` of ``path`` (a no-op without a hook)."""
    hook = _FAULTS.hook
    if hook is not None:
        hook(step, path)


# what ROMIO appends to an "Other I/O error" (MPI_ERR_IO): the system's own message
_STRERROR = {os.strerror(code): code for code in (
    errno.EFBIG, errno.ENOSPC, errno.EDQUOT, errno.EROFS, errno.EACCES, errno.EPERM,
    errno.ENOENT, errno.EISDIR, errno.ENOTDIR, errno.ENAMETOOLONG, errno.ESTALE)}


def os_error(e: BaseException) -> BaseException:
    """``e`` itself, or for an ``mpi4py.MPI.Exception`` the ``OSError`` it stands for
    (the subclass of its errno: from the MPI error class, or for ``MPI_ERR_IO`` from the
    system's message at the end of MPI's error stack; ``EIO`` otherwise)."""
    if not isinstance(e, MPI.Exception):
        return e
    cls = e.Get_error_class()
    head, _, stack = e.Get_error_string().partition(", error stack:")
    lines = stack.strip().splitlines()
    # the last line of the stack is the innermost cause: "ADIOI_...(80)...: <text>"
    detail = (lines[-1].split(":", 1)[-1] if lines else head).strip() or head.strip()
    code = _ERRNO.get(cls, errno.EIO)
    if code == errno.EIO:
        code = next((c for text, c in _STRERROR.items() if detail.endswith(text)), code)
    return OSError(code, f"{detail} (MPI error class {cls})")


class _Session:
    """One collectively opened file: runs each rank's part of its steps and agrees once
    before each collective call on everything since the previous one.

    ``error`` holds this rank's first failure since the last agreement; a rank that has
    one does no further work of its own until then, but still enters every watch and
    every agreement, as the others do.
    """

    def __init__(self, name: str, group: Group | None, path: str, what: str) -> None:
        self.c = call(name, group)
        self.group = group
        self.path = path
        self.what = what
        self.fh: Any = MPI.FILE_NULL
        self.types: list[Any] = []
        self.error: BaseException | None = None
        self.prepared: set[str] = set()  # steps whose "before" point has been passed

    def prepare(self, step: str, label: str, fn: Callable[[], Any] | None = None) -> None:
        """Make what ``step``'s call needs (``fn``: local work, no MPI-IO call), before the
        agreement that precedes the first collective call."""
        self.prepared.add(step)
        self._attempt(step, f"preparing to {label}", fn, f"before {step}")

    def run(self, step: str, label: str, fn: Callable[[], Any], mine: bool = True,
            collective: bool = True) -> None:
        """This rank's part of ``step`` (``mine``: it performs the step): when the step is
        ``collective``, after the agreement on everything since the previous one (raised on
        every rank, after the cleanup, if anything failed on any rank)."""
        if mine and step not in self.prepared:
            self._attempt(step, f"preparing to {label}", None, f"before {step}")
        if collective:
            self.agree()
        # every rank enters the watch, also one with nothing to do: the exit watch
        # numbers a group's watched calls alike on every rank
        with watchdog.watch(f"MPI-IO {label} {self.path!r}", self.c.ranks):
            if mine:
                self._attempt(step, label, fn, step)

    def _attempt(self, step: str, label: str, fn: Callable[[], Any] | None, point: str) -> None:
        """Run ``fn`` then the fault point ``point``, unless an earlier part failed here;
        keep a failure, named ``MPI-IO <step> (<label> '<path>')``, for the agreement."""
        if self.error is not None:
            return
        try:
            if fn is not None:
                fn()
            fault_point(point, self.path)
        except Exception as e:
            self.error = _labelled(os_error(e), f"MPI-IO {step} ({label} {self.path!r})")

    def agree(self) -> None:
        """Collective: raise on every rank, after the cleanup, if any rank failed since the
        previous agreement."""
        error, self.error = self.error, None
        try:
            agreement.raise_if_any(error, self.what, self.group, label=STEP_LABEL)
        except Exception:
            self.cleanup()
            raise

    def cleanup(self) -> None:
        """After an agreed failure (collective): close the file where every rank holds
        it, free the types. A rank without the file cannot join MPI_File_close (which is
        collective), so when one lacks it the others leave theirs open rather than hang."""
        if agreement.all_ok(self.fh != MPI.FILE_NULL, self.group):
            try:
                self.fh.Close()
            except MPI.Exception:
                pass
        _free(*self.types)
        self.types.clear()


def _labelled(e: BaseException, text: str) -> BaseException:
    """An error of ``e``'s type (where one can be built from a message) saying
    ``"<text>: <e>"``, caused by ``e``: what the other ranks will raise names the step."""
    cause = str(e) or type(e).__name__  # a bare MemoryError() says nothing
    out = agreement.build_error(type(e).__module__, type(e).__qualname__, f"{text}: {cause}")
    out.__cause__ = e
    return out


def _types(itemsize: int, global_shape: Sequence[int], local_shape: Sequence[int],
           starts: Sequence[int], fortran: bool) -> tuple[Any, Any]:
    """(element type, file type): the block as a subarray, or one element if it is empty."""
    elem = MPI.BYTE.Create_contiguous(itemsize).Commit()
    if _count(local_shape) == 0:
        return elem, elem
    gshape = [int(n) for n in global_shape] or [1]
    lshape = [int(n) for n in local_shape] or [1]
    st = [int(s) for s in starts] or [0]
    order = MPI.ORDER_FORTRAN if fortran else MPI.ORDER_C
    ftype = elem.Create_subarray(gshape, lshape, st, order=order).Commit()
    return elem, ftype


def _count(shape: Sequence[int]) -> int:
    """The number of elements of ``shape``, in Python integers (no int64 wrap)."""
    n = 1
    for d in shape:
        n *= int(d)
    return n


def _free(*types: Any) -> None:
    seen = set()
    for t in types:
        if id(t) not in seen and t != MPI.DATATYPE_NULL:
            seen.add(id(t))
            t.Free()


def _c_order(a: np.ndarray) -> np.ndarray:
    """``a`` itself if C-contiguous, else a C-ordered copy (0-d arrays stay 0-d)."""
    return a if a.flags.c_contiguous else np.array(a, order="C")


def bytes_view(a: np.ndarray) -> np.ndarray:
    """The bytes of the contiguous array ``a`` as a flat ``uint8`` view (what the file
    calls write and read; a fault test replaces it to stop a rank mid-write)."""
    return a.reshape(-1, order="A").view(np.uint8) if a.size else np.empty(0, np.uint8)


def write_blocks(path: str, header: bytes,
                 local: np.ndarray | Callable[[], np.ndarray | None] | None,
                 global_shape: Sequence[int], starts: Sequence[int], dtype: Any, *,
                 group: Group | None = None, what: str = "write") -> None:
    """Collective: write ``header`` then each rank's block of a C-order array to ``path``.

    Parameters
    ----------
    path : str
        A new file (an existing one is overwritten but not truncated).
    header : bytes
        Written by the group's first rank at offset 0 (other ranks' headers are ignored).
    local : ndarray, callable or None
        This rank's block (host memory), or a function that makes it (a device-to-host
        copy, say: it runs with the rest of the preparation, so that its failure on one
        rank is agreed on like theirs); None or empty to write nothing.
    global_shape, starts : sequence of int
        The whole array's shape and where ``local`` starts in it.
    dtype : numpy dtype
        The element type (the same on every rank).
    group : comm.Group, optional
        The ranks that write (WORLD by default).
    what : str
        What the write is for, at the start of an error's message (``"sm.save 'x.npy'"``).

    Raises
    ------
    OSError
        On every rank of the group alike (the type of the lowest failing rank), when a
        step fails on any: ``"<what>: rank R: MPI-IO <step> (<label> '<path>'): <cause>"``.
        A failure to make a rank's part (``MemoryError``, a block of the wrong dtype)
        raises the same way, before the file is opened.
    """
    dt = np.dtype(dtype)
    nbytes = _count(global_shape) * dt.itemsize
    s = _Session("write_blocks", group, path, what)
    root = s.c.comm.Get_rank() == 0
    head = np.empty(0, np.uint8)
    data = np.empty(0, np.uint8)
    count = 0
    shape: tuple[int, ...] = ()  # the block's, once made
    amode = MPI.MODE_WRONLY | MPI.MODE_CREATE

    def make_header() -> None:
        nonlocal head
        head = np.frombuffer(header, dtype=np.uint8)

    def make_types() -> None:
        s.types += _types(dt.itemsize, global_shape, shape, starts, False)

    def make_block() -> None:
        nonlocal data, count, shape
        block = local() if callable(local) else local
        if block is None:
            block = np.empty((0,) * max(len(global_shape), 1), dtype=dt)
        block = _c_order(block)  # a copy when it is not C-contiguous: may not fit
        if block.dtype != dt:
            raise TypeError(f"block dtype {block.dtype} differs from the file dtype {dt}")
        shape = block.shape
        data, count = bytes_view(block), block.size

    s.prepare("open", "open for writing")
    if root:
        s.prepare("header", "write the header of", make_header)
    if nbytes:
        s.prepare("data", "write", make_block)  # the block's shape feeds the view
        s.prepare("view", "set the view of", make_types)

    def open_() -> None:
        s.fh = MPI.File.Open(s.c.comm, path, amode)

    s.run("open", "open for writing", open_)
    # rank 0 alone, independent: agreed on together with the open, before the view
    s.run("header", "write the header of", lambda: s.fh.Write_at(0, head), mine=root,
          collective=False)
    if nbytes:
        s.run("view", "set the view of", lambda: s.fh.Set_view(len(header), s.types[0],
                                                               s.types[1]))
        s.run("data", "write", lambda: s.fh.Write_at_all(0, [data, count, s.types[0]]))
    s.run("sync", "sync", lambda: s.fh.Sync())
    s.run("close", "close", lambda: s.fh.Close())
    s.agree()
    _free(*s.types)


def read_blocks(path: str, offset: int, dtype: Any, global_shape: Sequence[int],
                starts: Sequence[int] | None, local_shape: Sequence[int], *,
                fortran_order: bool = False, group: Group | None = None,
                what: str = "read") -> np.ndarray:
    """Collective: read this rank's block of the array stored in ``path`` after ``offset`` bytes.

    ``starts`` None (or an empty ``local_shape``) reads nothing: the rank only joins the
    collective. Returns a C-contiguous array of ``local_shape`` and ``dtype``. Errors
    are raised on every rank alike, as by :func:`write_blocks`; the buffer the block is
    read into is allocated before the file is opened, and a failure there (a
    ``MemoryError``) is agreed on in the same way.
    """
    dt = np.dtype(dtype)
    lshape = tuple(int(n) for n in local_shape)
    count = _count(lshape) if starts is not None else 0
    total = _count(global_shape)
    s = _Session("read_blocks", group, path, what)
    buf = np.empty(0, dtype=dt)
    data = np.empty(0, np.uint8)

    def make_buffer() -> None:
        nonlocal buf, data
        buf = np.empty(lshape if count else (0,), dtype=dt,
                       order="F" if fortran_order else "C")
        data = bytes_view(buf)

    def make_types() -> None:
        s.types += _types(dt.itemsize, global_shape, lshape if count else (0,),
                          starts or (), fortran_order)

    def open_() -> None:
        s.fh = MPI.File.Open(s.c.comm, path, MPI.MODE_RDONLY)

    def read() -> None:
        status = MPI.Status()
        s.fh.Read_at_all(0, [data, count, s.types[0]], status)
        got = status.Get_count(s.types[0])
        if got != count:
            raise OSError(errno.EIO, f"read {got} of {count} elements: the file is "
                                     f"shorter than its header says")

    s.prepare("open", "open for reading")
    if total:
        s.prepare("view", "set the view of", make_types)
        s.prepare("data", "read", make_buffer)
    s.run("open", "open for reading", open_)
    if total:
        s.run("view", "set the view of", lambda: s.fh.Set_view(int(offset), s.types[0],
                                                               s.types[1]))
        s.run("data", "read", read)
    s.run("close", "close", lambda: s.fh.Close())
    s.agree()
    _free(*s.types)
    if not count:
        return np.empty(lshape, dtype=dt)
    return _c_order(buf)
