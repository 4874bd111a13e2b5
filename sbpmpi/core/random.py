"""Counter-based random numbers (Philox4x32-10) evaluated on global element indices.

A value depends only on (seed, call number, global flat index), so the same seed
gives the same global tensor whatever the placement, SBP, world size or backend.
Every rank advances the call number on every random creation, in or out of the
placement (SPMD), so calls stay in step.
"""

from __future__ import annotations

from collections.abc import Sequence
from types import ModuleType
from typing import Any

__all__ = ["manual_seed", "initial_seed", "next_stream", "get_state", "set_state", "philox4x32", "uniform", "normal"]

_M0 = 0xD2511F53
_M1 = 0xCD9E8D57
_W0 = 0x9E3779B9
_W1 = 0xBB67AE85
_MASK = 0xFFFFFFFF



class _Streams:
    """Where the random streams stand: the seed and the number of random creations made
    with it (process-wide, as torch's default generator)."""

    __slots__ = ("seed", "calls")

    def __init__(self) -> None:
        self.seed = 0
        self.calls = 0


_STREAMS = _Streams()


def manual_seed(seed: int) -> None:
    """Set the seed of all random creation and restart its call counter."""
    if isinstance(seed, bool) or not isinstance(seed, int):
        raise TypeError(f"seed must be an int, got {type(seed).__name__} {seed!r}")
    set_state((int(seed) & 0xFFFFFFFFFFFFFFFF, 0))


def initial_seed() -> int:
    """Return the current seed."""
    return _STREAMS.seed


def get_state() -> tuple[int, int]:
    """``(seed, call counter)``: where the random streams stand (an activation
    recomputation replays its forward's draws from here)."""
    return _STREAMS.seed, _STREAMS.calls


def set_state(state: tuple[int, int]) -> None:
    """Put the random streams back to ``state`` (from :func:`get_state`)."""
    _STREAMS.seed, _STREAMS.calls = int(state[0]), int(state[1])


def next_stream() -> tuple[int, int]:
    """Return ``(seed, call number)`` for the next random tensor and advance the counter."""
    c = _STREAMS.calls
    _STREAMS.calls = c + 1
    return _STREAMS.seed, c


def philox4x32(xp: ModuleType, ctr: Sequence[Any], key: tuple[int, int]) -> list[Any]:
    """Philox4x32-10 of counter words ``ctr`` (uint64 arrays holding 32-bit values)."""
    c0, c1, c2, c3 = (xp.asarray(c, dtype=xp.uint64) for c in ctr)
    k0, k1 = key
    m0, m1, mask = xp.uint64(_M0), xp.uint64(_M1), xp.uint64(_MASK)
    s32 = xp.uint64(32)
    for _ in range(10):
        p0 = c0 * m0
        p1 = c2 * m1
        hi0, lo0 = p0 >> s32, p0 & mask
        hi1, lo1 = p1 >> s32, p1 & mask
        c0, c1, c2, c3 = (
            hi1 ^ c1 ^ xp.uint64(k0),
            lo1,
            hi0 ^ c3 ^ xp.uint64(k1),
            lo0,
        )
        k0 = (k0 + _W0) & _MASK
        k1 = (k1 + _W1) & _MASK
    return [c0, c1, c2, c3]


def _words(xp: ModuleType, shape: Sequence[int], ranges: Sequence[tuple[int, int]],
           seed: int, call: int) -> list[Any]:
    """Four uint64 arrays (32-bit values) for the block ``ranges`` of a tensor of ``shape``."""
    idx = xp.zeros((1,) * len(shape), dtype=xp.uint64)
    stride = 1
    for d in range(len(shape) - 1, -1, -1):
        a, b = ranges[d]
        ax = xp.arange(a, b, dtype=xp.uint64) * xp.uint64(stride)
        idx = idx + ax.reshape((1,) * d + (b - a,) + (1,) * (len(shape) - d - 1))
        stride *= int(shape[d])
    out_shape = tuple(b - a for a, b in ranges)
    idx = xp.broadcast_to(idx, out_shape)
    mask = xp.uint64(_MASK)
    ctr = (idx & mask, idx >> xp.uint64(32),
           xp.full(out_shape, call & _MASK, dtype=xp.uint64),
           xp.full(out_shape, (call >> 32) & _MASK, dtype=xp.uint64))
    key = (seed & _MASK, (seed >> 32) & _MASK)
    return philox4x32(xp, ctr, key)


def _unit(xp: ModuleType, hi: Any, lo: Any) -> Any:
    """53-bit uniform doubles in [0, 1) from two 32-bit words."""
    return ((hi >> xp.uint64(5)).astype(xp.float64) * 67108864.0
            + (lo >> xp.uint64(6)).astype(xp.float64)) / 9007199254740992.0


def uniform(xp: ModuleType, shape: Sequence[int], ranges: Sequence[tuple[int, int]],
            seed: int, call: int, dtype: Any = None) -> Any:
    """Uniform [0, 1) values of block ``ranges`` of a global tensor of ``shape``.

    float64 by default; with a narrower float ``dtype`` the doubles that round up to 1.0
    in the cast become the largest value of ``dtype`` below 1, so the range stays [0, 1).
    """
    w = _words(xp, shape, ranges, seed, call)
    u = _unit(xp, w[0], w[1])
    if dtype is None or xp.dtype(dtype) == xp.float64:
        return u
    out = u.astype(dtype)
    below_one = xp.nextafter(xp.asarray(1, dtype=dtype), xp.asarray(0, dtype=dtype))
    return xp.where(out >= 1, below_one, out)


def normal(xp: ModuleType, shape: Sequence[int], ranges: Sequence[tuple[int, int]],
           seed: int, call: int) -> Any:
    """Standard normal float64 values (Box-Muller) of block ``ranges``."""
    w = _words(xp, shape, ranges, seed, call)
    u1 = 1.0 - _unit(xp, w[0], w[1])  # (0, 1]
    u2 = _unit(xp, w[2], w[3])
    return xp.sqrt(-2.0 * xp.log(u1)) * xp.cos(2.0 * xp.pi * u2)
