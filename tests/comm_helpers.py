"""Helpers for the sbpmpi.comm tests: rank-dependent data, NumPy references, a checker.

A failed comparison on one rank must not make that rank skip the collectives the
others still run (they would hang), so comparisons are collected by ``chk`` and
raised on every rank when the test ends.
"""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np
from mpi4py import MPI

from sbpmpi.comm import ReduceOp

world = MPI.COMM_WORLD

NUMERIC = [np.bool_, np.int8, np.uint8, np.int16, np.uint16, np.int32, np.uint32, np.int64,
           np.uint64, np.float16, np.float32, np.float64, np.longdouble, np.complex64,
           np.complex128, np.clongdouble]
OPAQUE = ["datetime64[s]", "U3", [("a", "i4"), ("b", "f8")], ">f8"]
UFUNC = {ReduceOp.SUM: np.add, ReduceOp.PROD: np.multiply, ReduceOp.MAX: np.maximum,
         ReduceOp.MIN: np.minimum, ReduceOp.AVG: np.add}


def data(r: int, n: int, dtype, seed: int = 0) -> np.ndarray:
    """Rank ``r``'s input: small integer values, so sums and products are exact."""
    dt = np.dtype(dtype)
    rng = np.random.default_rng([seed, r, n, 7])
    if dt.kind == "b":
        return rng.random(n) < 0.5
    if dt.kind == "u":
        return rng.integers(0, 4, n).astype(dt)
    if dt.kind in "if":
        return rng.integers(-3, 4, n).astype(dt)
    if dt.kind == "c":
        return (rng.integers(-3, 4, n) + 1j * rng.integers(-3, 4, n)).astype(dt)
    if dt.kind == "M":
        return rng.integers(0, 10**9, n).astype(dt)
    if dt.kind == "U":
        return np.array([f"{r}{v}" for v in rng.integers(0, 99, n)], dtype=dt)
    if dt.fields is not None:
        out = np.zeros(n, dtype=dt)
        out["a"] = rng.integers(-99, 99, n)
        out["b"] = rng.random(n) + r
        return out
    return rng.integers(-9, 9, n).astype(dt)


def reference(stack: np.ndarray, op: ReduceOp, p: int) -> np.ndarray:
    """The reduction of ``stack`` over axis 0, as NumPy computes it in the same dtype."""
    dt = stack.dtype
    out = UFUNC[op].reduce(stack, axis=0, dtype=dt)
    if op is ReduceOp.AVG:
        out = out / dt.type(p)
    return out


def reduction_ok(dt, op) -> bool:
    dt = np.dtype(dt)
    if op is ReduceOp.AVG and dt.kind in "biu":
        return False
    return not (op in (ReduceOp.MAX, ReduceOp.MIN) and dt.kind == "c")


def _native(dt: np.dtype) -> np.dtype:
    return dt.newbyteorder("=") if dt.fields is None else dt


def assert_same(got, want, msg: str = "") -> None:
    got, want = np.asarray(got), np.asarray(want)
    assert _native(got.dtype) == _native(want.dtype), f"{msg}: dtype {got.dtype} != {want.dtype}"
    assert got.shape == want.shape, f"{msg}: shape {got.shape} != {want.shape}"
    np.testing.assert_array_equal(got, want, err_msg=msg)


class Checker:
    """Collects failed comparisons; ``close()`` raises them on every rank."""

    def __init__(self) -> None:
        self.fails: list[str] = []

    def same(self, got, want, msg: str = "") -> None:
        try:
            assert_same(got, want, msg)
        except AssertionError as e:
            self.fails.append(f"rank {world.Get_rank()}: {e}")

    def true(self, cond: bool, msg: str) -> None:
        if not cond:
            self.fails.append(f"rank {world.Get_rank()}: {msg}")

    def close(self) -> None:
        every = world.allgather(self.fails)
        bad = [f for fails in every for f in fails]
        self.fails = []
        assert not bad, "\n".join(bad[:8])


def checker() -> Iterator[Checker]:
    """Body of the ``chk`` fixture: a Checker whose failures are raised at teardown."""
    c = Checker()
    yield c
    c.close()
