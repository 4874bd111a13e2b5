"""Packing helpers of the compiled steps: contiguous buffers, filled arrays, and the
blocks of a split dim laid one after another (the layout of a v-collective's buffer).

One strided copy per run of equal blocks; the same code for NumPy and CuPy.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

from .. import backend

__all__ = ["contiguous", "full", "pack", "unpack", "counts", "displs"]


def contiguous(xp: Any, a: Any) -> Any:
    """``a`` itself when C-contiguous, else a C-contiguous copy of the same shape."""
    if a.flags.c_contiguous:
        return a
    out = backend.empty(xp, a.shape, a.dtype)
    out[...] = a
    return out


def full(xp: Any, shape: tuple[int, ...], value: Any, dtype: Any) -> Any:
    """A new array of ``shape`` filled with ``value`` (from ``backend.empty``)."""
    out = backend.empty(xp, shape, dtype)
    out.fill(value)
    return out


def pack(x: Any, dim: int, sizes: Sequence[int], flat: Any, skip: int = -1) -> None:
    """Write the blocks of ``x`` along ``dim`` (of ``sizes``) one after another into ``flat``,
    leaving out block ``skip`` (none by default)."""
    _blocks(x, dim, sizes, flat, skip, True)


def unpack(flat: Any, dim: int, sizes: Sequence[int], out: Any, skip: int = -1) -> None:
    """Inverse of :func:`_pack`: ``out`` along ``dim`` is the blocks of ``flat`` in turn
    (block ``skip`` of ``out`` is left as it is)."""
    _blocks(out, dim, sizes, flat, skip, False)


def _blocks(x: Any, dim: int, sizes: Sequence[int], flat: Any, skip: int, pack: bool) -> None:
    """Copy the blocks of ``x`` along ``dim`` but ``skip`` to (``pack``) or from ``flat``,
    where they lie one after another, each in C order."""
    shape = x.shape
    pre, n, post = math.prod(shape[:dim]), shape[dim], math.prod(shape[dim + 1:])
    x3 = x.reshape(pre, n, post)
    p = len(sizes)
    if n % p == 0 and all(s == n // p for s in sizes):  # one strided copy per run of blocks
        b = n // p
        blocks = x3.reshape(pre, p, b, post).transpose(1, 0, 2, 3)
        pairs: tuple[tuple[Any, Any], ...]
        if 0 <= skip < p:  # the blocks before and after the one left out
            f4 = flat[:(p - 1) * pre * b * post].reshape(p - 1, pre, b, post)
            pairs = ((f4[:skip], blocks[:skip]), (f4[skip:], blocks[skip + 1:]))
        else:
            pairs = ((flat[:p * pre * b * post].reshape(p, pre, b, post), blocks),)
        for f, blk in pairs:
            if pack:
                f[...] = blk
            else:
                blk[...] = f
        return
    off = o = 0
    for q, s in enumerate(sizes):
        if q != skip:
            cnt = pre * s * post
            f3 = flat[off:off + cnt].reshape(pre, s, post)
            if pack:
                f3[...] = x3[:, o:o + s, :]
            else:
                x3[:, o:o + s, :] = f3
            off += cnt
        o += s


def counts(shape: Sequence[int], dim: int, sizes: Sequence[int]) -> list[int]:
    """Elements of each block when ``shape`` is cut into ``sizes`` along ``dim``."""
    rest = math.prod(n for i, n in enumerate(shape) if i != dim)
    return [rest * s for s in sizes]


def displs(counts: Sequence[int]) -> list[int]:
    """Offsets of blocks of ``counts`` elements laid one after another."""
    out, o = [], 0
    for c in counts:
        out.append(o)
        o += c
    return out


