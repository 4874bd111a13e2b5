"""One tensor, one ``.npy`` file: ``sm.save`` and ``sm.load`` with MPI-IO.

``sm.save`` writes the global value: rank 0 writes the header, every rank holding a
block writes it in one collective call (:mod:`sbpmpi.comm.file_io`), no rank gathers
the whole tensor, and the file is renamed into place once every rank has succeeded
(:mod:`.atomic_write`). ``sm.load`` reads any ``.npy`` file into any placement and
SBP, each rank only its own slice, after rank 0 has checked the header
(:mod:`.header`). Every error of either is raised on every rank alike and names the file.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import Any

import numpy as np

from .. import backend
from ..comm import agreement, file_io
from ..core.dtypes import as_dtype
from ..core.layout import Layout
from ..core.placement import Placement
from ..core.reduction import identity_value
from ..core.sbp import SBP, Broadcast, Partial, Split
from ..env import get_rank
from ..runtime import consistency
from ..tensor import GlobalTensor
from . import atomic_write, checksum
from .arguments import path_arg, placement_arg, sbp_arg, tensor_arg
from .header import element_count, native, npy_header, read_header

__all__ = ["save", "load", "write_tensor", "read_tensor", "read_tensor_sized"]


def save(x: GlobalTensor, path: str | os.PathLike[str]) -> None:
    """Write the global value of ``x`` to ``path`` as a ``.npy`` file (collective).

    Each rank writes its own block with MPI-IO in one collective call; the file appears
    under ``path`` only once every rank has written its part (atomic rename).

    Parameters
    ----------
    x : GlobalTensor
        Any placement and SBP; partial tensors are reduced first.
    path : str or PathLike
        The file to create or replace; ``numpy.load(path)`` returns ``x.numpy()``.
    """
    x = tensor_arg(x, "sm.save")
    p = path_arg(path)
    consistency.check_collective("sm.save", (p, x))
    write_tensor(x, p)


def write_tensor(x: GlobalTensor, path: str, what: str = "sm.save", crc32: bool = False,
                 mode: int | None = None) -> int | None:
    """:func:`save` after its argument checks and consistency check (collective).

    For callers that have checked ``x`` and ``path`` and agreed on them across ranks
    already (``sm.save_state``), so that one tensor costs no exchange of its own for that.
    ``crc32``: return the file's CRC-32 (:mod:`.checksum`, computed from the written file
    before it is renamed into place). ``mode``: the file's permission bits (by default
    those of the file it replaces).
    """
    y = _reduced(x)
    layout = y.layout
    me = get_rank()
    writes = _writes(layout, me)
    ranges = layout.local_ranges(me) if writes else None
    starts: Sequence[int] = () if ranges is None else [a for a, _ in ranges]

    def block() -> np.ndarray | None:
        # a device-to-host copy, which can fail on one rank: file_io makes it with the rest
        # of every rank's part and agrees on them all before the file is opened
        return np.asarray(backend.asnumpy(y.to_local())) if writes else None

    header = npy_header(y.dtype, y.shape)
    crc: list[int] = []

    def write(tmp: str) -> None:
        file_io.write_blocks(tmp, header, block, y.shape, starts, y.dtype,
                             what=f"{what} {path!r}")
        if crc32:
            crc.append(checksum.file_crc32(tmp, len(header) + element_count(y.shape)
                                           * y.dtype.itemsize, f"{what} {path!r}"))

    atomic_write.write_collectively(path, what, write, mode)
    return crc[0] if crc else None


def _reduced(x: GlobalTensor) -> GlobalTensor:
    """``x`` without partial mesh axes: each becomes a split of the largest dim (or broadcast)."""
    if not any(isinstance(s, Partial) for s in x.sbp):
        return x
    repl: SBP = Split(int(np.argmax(x.shape))) if x.ndim else Broadcast()
    return x.to_global(sbp=tuple(repl if isinstance(s, Partial) else s for s in x.sbp))


def _writes(layout: Layout, rank: int) -> bool:
    """True when ``rank`` writes its shard: in the placement, at index 0 of broadcast axes."""
    c = layout.placement.coord_of(rank)
    return c is not None and all(c[a] == 0 for a, s in enumerate(layout.sbp)
                                 if isinstance(s, Broadcast))


def load(path: str | os.PathLike[str], *, placement: Placement | None = None,
         sbp: SBP | Sequence[SBP] | None = None, dtype: Any = None) -> GlobalTensor:
    """Read a ``.npy`` file into a global tensor with ``placement`` and ``sbp`` (collective).

    Any world size, mesh or SBP works, whatever wrote the file. Each rank reads only its
    own slice; under a partial SBP the first rank of each partial axis holds the value
    and the others the reduction's identity. Big-endian files are converted to native
    byte order. ``dtype``: the values converted to it after reading (a bfloat16 or
    float16 file read into float32, say); None keeps the file's.

    Raises
    ------
    FileNotFoundError
        On every rank, when ``path`` does not exist.
    CheckpointError
        On every rank, when the file is not a valid ``.npy`` file or is truncated.
    """
    p = path_arg(path)
    pl = placement_arg(placement, "sm.load")
    sbp = sbp_arg(sbp, "sm.load")
    try:
        want = None if dtype is None else as_dtype(dtype)
    except TypeError:
        raise TypeError(f"sm.load: dtype {dtype!r} is not a NumPy dtype") from None
    consistency.check_collective("sm.load", (p, pl, sbp, want))
    x = read_tensor(p, pl, sbp)
    return x if want is None or x.dtype == want else x.astype(want)


def read_tensor(path: str, pl: Placement, sbp: Any, what: str = "sm.load") -> GlobalTensor:
    """:func:`load` after its argument checks and consistency check (collective).

    For callers that have checked the arguments and agreed on them across ranks already
    (``sm.load_state``). The exchanges: rank 0's verdict on the header, the read's
    steps (:func:`sbpmpi.comm.file_io.read_blocks`), and one on whether every rank
    placed its slice. Every error names the file: ``"<what> '<path>': ..."``.
    """
    return read_tensor_sized(path, pl, sbp, what)[0]


def read_tensor_sized(path: str, pl: Placement, sbp: Any, what: str = "sm.load"
                      ) -> tuple[GlobalTensor, int]:
    """:func:`read_tensor`, and the file's size as its header gives it."""
    label = f"{what} {path!r}"
    shape, dtype, fortran, offset = agreement.decide_on_root(lambda: read_header(path), what)
    try:
        layout = Layout.make(shape, pl, sbp)
        nat = native(dtype)
        _check_identities(layout, nat, what)
    except (TypeError, ValueError) as e:  # the same on every rank: shape and dtype agree
        raise type(e)(f"{label}: {e}") from None
    me = get_rank()
    member = me in pl
    op = layout.identity_op(me) if member else None
    reads = member and op is None
    ranges = layout.local_ranges(me) if reads else None
    lshape = layout.local_shape(me)
    buf = file_io.read_blocks(path, offset, dtype, shape,
                              None if ranges is None else [a for a, _ in ranges],
                              lshape if reads else (0,), fortran_order=fortran,
                              what=label)
    error: BaseException | None = None
    local: Any = None
    try:
        if not member:
            local = np.empty(lshape, dtype=nat)
        elif op is not None:
            xp = backend.get_xp(pl.type)
            local = xp.full(lshape, identity_value(op, nat), dtype=nat)
        else:
            if buf.dtype != nat:
                buf = buf.astype(nat)
            local = backend.to_device(buf, pl.type)
    except Exception as e:
        error = e
    agreement.raise_if_any(error, label)
    return GlobalTensor(local, layout, nat), offset + element_count(shape) * dtype.itemsize


def _check_identities(layout: Layout, dtype: np.dtype, what: str) -> None:
    for a in layout.partial_axes():
        s = layout.sbp[a]
        assert isinstance(s, Partial)
        try:
            identity_value(s.op, dtype)
        except TypeError as e:
            raise TypeError(f"{what}: cannot lay out dtype {dtype} as {s!r}: {e}") from None
