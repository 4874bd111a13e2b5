"""The CRC-32 of a whole file, computed by every rank together.

A state directory's index records each tensor file's CRC-32 (zlib's, the one of
``zlib.crc32(open(f, "rb").read())``: anyone can check it without sbpmpi), and
``sm.load_state`` verifies it, so that damage that keeps a file's size (a flipped byte)
raises instead of loading silently. The ``.npy`` format has no checksum of its own.

Each rank reads one contiguous share of the file (``zlib.crc32``, the standard library's
CRC-32: no dependency) and the shares' CRCs are combined in rank order
(:func:`crc32_combine`, zlib's method, written out because Python's ``zlib`` does not
expose it). That is one extra read pass over the file, split across the ranks, and one
small all-gather.
"""

from __future__ import annotations

import zlib
from typing import NamedTuple

from ..comm import agreement
from ..env import get_rank, get_world_size
from .regular_file import open_regular

__all__ = ["crc32_combine", "file_crc32"]

_POLY = 0xEDB88320  # CRC-32 (IEEE 802.3), reflected
_CHUNK = 16 << 20  # bytes read at a time


def _multmodp(a: int, b: int) -> int:
    """``a * b`` modulo the CRC polynomial (reflected bit order)."""
    m, p = 1 << 31, 0
    while True:
        if a & m:
            p ^= b
            if a & (m - 1) == 0:
                return p
        m >>= 1
        b = (b >> 1) ^ _POLY if b & 1 else b >> 1


def _x2n_table() -> list[int]:
    """``x^(2^n)`` modulo the polynomial, n = 0..31."""
    table, p = [], 1 << 30  # x^1
    for _ in range(32):
        table.append(p)
        p = _multmodp(p, p)
    return table


_X2N = _x2n_table()


def _x8nmodp(n: int) -> int:
    """``x^(8 n)`` modulo the polynomial: appending ``n`` zero bytes, as a factor."""
    p, k = 1 << 31, 3  # x^0; 8 n = n * 2^3
    while n:
        if n & 1:
            p = _multmodp(_X2N[k & 31], p)
        n >>= 1
        k += 1
    return p


def crc32_combine(crc1: int, crc2: int, len2: int) -> int:
    """The CRC-32 of ``A + B`` from ``crc32(A)``, ``crc32(B)`` and ``len(B)`` (zlib's
    ``crc32_combine``)."""
    return _multmodp(_x8nmodp(len2), crc1) ^ crc2


class _Share(NamedTuple):
    """One rank's share of a file: its CRC and length, or why it could not be read."""

    crc: int
    length: int
    error: str | None


def _share(path: str, start: int, stop: int) -> _Share:
    crc, done = 0, 0
    with open_regular(path) as f:
        f.seek(start)
        while start + done < stop:
            block = f.read(min(_CHUNK, stop - start - done))
            if not block:
                break
            crc = zlib.crc32(block, crc)
            done += len(block)
    if start + done < stop:
        return _Share(crc, done, f"the file ends at byte {start + done}, before its "
                                 f"expected size of {stop} bytes")
    return _Share(crc, done, None)


def file_crc32(path: str, size: int, what: str) -> int:
    """Collective over the world: the CRC-32 of the first ``size`` bytes of ``path`` (its
    whole content: ``size`` is the size the caller expects, the same on every rank).

    Raises, on every rank alike, when some rank cannot read its share.
    """
    n, me = get_world_size(), get_rank()
    start, stop = size * me // n, size * (me + 1) // n
    error: Exception | None = None
    try:
        mine = _share(path, start, stop)
    except Exception as e:
        error = e
        mine = _Share(0, 0, str(e))
    shares = agreement.gather(mine, f"{what}: CRC-32 of {path!r}")
    if any(s.error is not None for s in shares):
        if error is None and mine.error is not None:
            error = OSError(mine.error)
        agreement.raise_if_any(error, f"{what}: CRC-32 of {path!r}")
    crc = 0
    for s in shares:
        crc = crc32_combine(crc, s.crc, s.length)
    return crc
