"""MPI-IO: each rank writes or reads its own block of one array file in one collective call.

The file holds a header of ``offset`` bytes followed by the array's raw bytes in C
(or Fortran) order, as in a ``.npy`` file. A rank's block is described to MPI as a
subarray file view (``Create_subarray(global shape, local shape, starts)``), so the
library turns every rank's part into one collective ``Write_at_all`` /
``Read_at_all``; no rank ever holds more than its own block. A rank with nothing to
move still joins the collective with zero elements.

Elements are moved as opaque runs of ``itemsize`` bytes: any NumPy dtype works and
bytes land on disk exactly as in memory.

The ranks fail together. Every step (open, header, view, data, sync, close) ends with
one small all-reduce on whether it succeeded on every rank
(:func:`sbpmpi.comm.agreement.raise_if_any`), before any rank goes on to the next
collective call: a rank whose step failed would otherwise skip a collective that the
others wait in forever. A failure on any rank then raises, on every rank, the same
``OSError`` subclass (MPI's errors are turned into ``OSError`` with the matching errno)
naming the step, the path and the failing rank; the file is closed on every rank that
holds it, and the datatypes freed, first.

:func:`set_fault_hook` is the seam of the fault tests: a hook that raises after a step
on one rank stands for that step failing there (the I/O itself is done, so the
collective calls all complete as they would on a real failure).
"""

from __future__ import annotations

import errno
import os
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
from mpi4py import MPI

from . import agreement, watchdog
from .call import call
from .group import Group

__all__ = ["write_blocks", "read_blocks", "bytes_view", "FaultHook", "set_fault_hook",
           "fault_point", "STEPS", "STEP_LABEL", "os_error"]

#: The steps a fault hook sees: those of this module, then the checkpoint's own
#: (renaming the temporary file into place, writing a state directory's index).
STEPS = ("open", "header", "view", "data", "sync", "close", "rename", "index")

#: The watch label of the agreement that ends each step.
STEP_LABEL = "MPI-IO step agreement"

FaultHook = Callable[[str, str], None]
_fault_hook: FaultHook | None = None

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
    """For fault tests: call ``hook(step, path)`` on each rank after each step of
    :data:`STEPS` it performs; an exception it raises is that step failing on that rank.
    None removes it. Returns the hook it replaces."""
    global _fault_hook
    previous, _fault_hook = _fault_hook, hook
    return previous


def fault_point(step: str, path: str) -> None:
    """Where a fault hook may fail ``step`` of ``path`` (a no-op without a hook)."""
    if _fault_hook is not None:
        _fault_hook(step, path)


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
    """One collectively opened file: runs each step, then agrees on it across the ranks."""

    def __init__(self, name: str, group: Group | None, path: str, what: str) -> None:
        self.c = call(name, group)
        self.group = group
        self.path = path
        self.what = what
        self.fh: Any = MPI.FILE_NULL
        self.types: list[Any] = []

    def step(self, step: str, fn: Callable[[], Any], label: str, mine: bool = True) -> None:
        """Run ``fn`` (this rank's part of ``step``), then agree: raise on every rank,
        after the cleanup, if it failed on any. ``mine``: this rank performs the step
        (its fault point follows ``fn``)."""
        error: BaseException | None = None
        try:
            # every rank enters the watch, also one with nothing to do: the exit watch
            # numbers a group's watched calls alike on every rank
            with watchdog.watch(f"MPI-IO {label} {self.path!r}", self.c.ranks):
                if mine:
                    fn()
            if mine:
                fault_point(step, self.path)
        except Exception as e:
            error = os_error(e)
        try:
            agreement.raise_if_any(error, f"{self.what}: MPI-IO {step} ({label} "
                                          f"{self.path!r})", self.group, label=STEP_LABEL)
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


def write_blocks(path: str, header: bytes, local: np.ndarray | None,
                 global_shape: Sequence[int], starts: Sequence[int], dtype: Any,
                 group: Group | None = None, what: str = "write") -> None:
    """Collective: write ``header`` then each rank's block of a C-order array to ``path``.

    Parameters
    ----------
    path : str
        A new file (an existing one is overwritten but not truncated).
    header : bytes
        Written by the group's first rank at offset 0 (other ranks' headers are ignored).
    local : ndarray or None
        This rank's block (host memory); None or empty to write nothing.
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
        step fails on any: ``"<what>: MPI-IO <step> of '<path>': rank R: <cause>"``.
    """
    dt = np.dtype(dtype)
    if local is None:
        local = np.empty((0,) * max(len(global_shape), 1), dtype=dt)
    local = _c_order(local)
    if local.dtype != dt:
        raise TypeError(f"block dtype {local.dtype} differs from the file dtype {dt}")
    nbytes = _count(global_shape) * dt.itemsize
    s = _Session("write_blocks", group, path, what)
    amode = MPI.MODE_WRONLY | MPI.MODE_CREATE

    def open_() -> None:
        s.fh = MPI.File.Open(s.c.comm, path, amode)

    s.step("open", open_, "open for writing")
    s.step("header", lambda: s.fh.Write_at(0, np.frombuffer(header, dtype=np.uint8)),
           "write the header of", mine=s.c.comm.Get_rank() == 0)
    if nbytes:
        def view() -> None:
            s.types += _types(dt.itemsize, global_shape, local.shape, starts, False)
            s.fh.Set_view(len(header), s.types[0], s.types[1])

        s.step("view", view, "set the view of")
        s.step("data", lambda: s.fh.Write_at_all(0, [bytes_view(local), local.size,
                                                     s.types[0]]), "write")
    s.step("sync", lambda: s.fh.Sync(), "sync")
    s.step("close", lambda: s.fh.Close(), "close")
    _free(*s.types)


def read_blocks(path: str, offset: int, dtype: Any, global_shape: Sequence[int],
                starts: Sequence[int] | None, local_shape: Sequence[int],
                fortran_order: bool = False, group: Group | None = None,
                what: str = "read") -> np.ndarray:
    """Collective: read this rank's block of the array stored in ``path`` after ``offset`` bytes.

    ``starts`` None (or an empty ``local_shape``) reads nothing: the rank only joins the
    collective. Returns a C-contiguous array of ``local_shape`` and ``dtype``. Errors
    are raised on every rank alike, as by :func:`write_blocks`.
    """
    dt = np.dtype(dtype)
    lshape = tuple(int(n) for n in local_shape)
    count = _count(lshape) if starts is not None else 0
    buf = np.empty(lshape if count else (0,), dtype=dt, order="F" if fortran_order else "C")
    total = _count(global_shape)
    s = _Session("read_blocks", group, path, what)

    def open_() -> None:
        s.fh = MPI.File.Open(s.c.comm, path, MPI.MODE_RDONLY)

    s.step("open", open_, "open for reading")
    if total:
        def view() -> None:
            s.types += _types(dt.itemsize, global_shape, lshape if count else (0,),
                              starts or (), fortran_order)
            s.fh.Set_view(int(offset), s.types[0], s.types[1])

        def data() -> None:
            status = MPI.Status()
            s.fh.Read_at_all(0, [bytes_view(buf), count, s.types[0]], status)
            got = status.Get_count(s.types[0])
            if got != count:
                raise OSError(errno.EIO, f"read {got} of {count} elements: the file is "
                                         f"shorter than its header says")

        s.step("view", view, "set the view of")
        s.step("data", data, "read")
    s.step("close", lambda: s.fh.Close(), "close")
    _free(*s.types)
    if not count:
        return np.empty(lshape, dtype=dt)
    return _c_order(buf)
