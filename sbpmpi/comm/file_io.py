"""MPI-IO: each rank writes or reads its own block of one array file in one collective call.

The file holds a header of ``offset`` bytes followed by the array's raw bytes in C
(or Fortran) order, as in a ``.npy`` file. A rank's block is described to MPI as a
subarray file view (``Create_subarray(global shape, local shape, starts)``), so the
library turns every rank's part into one collective ``Write_at_all`` /
``Read_at_all``; no rank ever holds more than its own block. A rank with nothing to
move still joins the collective with zero elements.

Elements are moved as opaque runs of ``itemsize`` bytes: any NumPy dtype works and
bytes land on disk exactly as in memory.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Sequence
from typing import Any

import numpy as np
from mpi4py import MPI

from . import watchdog
from .call import call
from .group import Group

__all__ = ["write_blocks", "read_blocks", "bytes_view"]


@contextlib.contextmanager
def _opened(name: str, group: Group | None, path: str, amode: int,
            purpose: str) -> Iterator[tuple[Any, Any, list[Any]]]:
    """Open ``path`` collectively over ``group`` (WORLD for None) for ``purpose``; yields
    (file, the call, a list for the MPI types to free). The file is closed on every rank,
    and the types freed, before an error of the block is raised on the rank of the error."""
    c = call(name, group)
    with watchdog.watch(f"MPI-IO open {path!r} for {purpose}", c.ranks):
        fh = MPI.File.Open(c.comm, path, amode)
    types: list[Any] = []
    try:
        yield fh, c, types
    finally:
        with watchdog.watch(f"MPI-IO close {path!r}", c.ranks):
            fh.Close()
        _free(*types)


def _types(itemsize: int, global_shape: Sequence[int], local_shape: Sequence[int],
           starts: Sequence[int], fortran: bool) -> tuple[Any, Any]:
    """(element type, file type): the block as a subarray, or one element if it is empty."""
    elem = MPI.BYTE.Create_contiguous(itemsize).Commit()
    if int(np.prod(local_shape, dtype=np.int64)) == 0:
        return elem, elem
    gshape = [int(n) for n in global_shape] or [1]
    lshape = [int(n) for n in local_shape] or [1]
    st = [int(s) for s in starts] or [0]
    order = MPI.ORDER_FORTRAN if fortran else MPI.ORDER_C
    ftype = elem.Create_subarray(gshape, lshape, st, order=order).Commit()
    return elem, ftype


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
                 group: Group | None = None) -> None:
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

    A failure raises on the rank where it happened, after every rank has closed the file.
    """
    dt = np.dtype(dtype)
    if local is None:
        local = np.empty((0,) * max(len(global_shape), 1), dtype=dt)
    local = _c_order(local)
    if local.dtype != dt:
        raise TypeError(f"block dtype {local.dtype} differs from the file dtype {dt}")
    nbytes = int(np.prod(global_shape, dtype=np.int64)) * dt.itemsize
    amode = MPI.MODE_WRONLY | MPI.MODE_CREATE
    with _opened("write_blocks", group, path, amode, "writing") as (fh, c, types):
        with watchdog.watch(f"MPI-IO write {path!r}", c.ranks):
            if c.comm.Get_rank() == 0:
                fh.Write_at(0, np.frombuffer(header, dtype=np.uint8))
            if nbytes:
                elem, ftype = _types(dt.itemsize, global_shape, local.shape, starts, False)
                types += (elem, ftype)
                fh.Set_view(len(header), elem, ftype)
                fh.Write_at_all(0, [bytes_view(local), local.size, elem])
            fh.Sync()


def read_blocks(path: str, offset: int, dtype: Any, global_shape: Sequence[int],
                starts: Sequence[int] | None, local_shape: Sequence[int],
                fortran_order: bool = False, group: Group | None = None) -> np.ndarray:
    """Collective: read this rank's block of the array stored in ``path`` after ``offset`` bytes.

    ``starts`` None (or an empty ``local_shape``) reads nothing: the rank only joins the
    collective. Returns a C-contiguous array of ``local_shape`` and ``dtype``.
    """
    dt = np.dtype(dtype)
    lshape = tuple(int(n) for n in local_shape)
    count = int(np.prod(lshape, dtype=np.int64)) if starts is not None else 0
    buf = np.empty(lshape if count else (0,), dtype=dt, order="F" if fortran_order else "C")
    total = int(np.prod(global_shape, dtype=np.int64))
    with _opened("read_blocks", group, path, MPI.MODE_RDONLY, "reading") as (fh, c, types):
        if total:
            with watchdog.watch(f"MPI-IO read {path!r}", c.ranks):
                elem, ftype = _types(dt.itemsize, global_shape, lshape if count else (0,),
                                     starts or (), fortran_order)
                types += (elem, ftype)
                fh.Set_view(int(offset), elem, ftype)
                status = MPI.Status()
                fh.Read_at_all(0, [bytes_view(buf), count, elem], status)
                got = status.Get_count(elem)
                if got != count:
                    raise OSError(f"read {got} of {count} elements of {path!r}: the file is "
                                  f"shorter than its header says")
    if not count:
        return np.empty(lshape, dtype=dt)
    return _c_order(buf)
