"""The bad input matrix: every public function refuses bad arguments the same way on every rank.

Each row is one bad call across the public API with the error type and a message fragment
it must raise. The rows live in the test files of their subjects (placements and SBPs in
core/, creation, to_global and conversion in tensor/, comm/, checkpoint/, ops/), each
table with a test that calls :func:`check_row` on every row;
tests/test_bad_input_matrix.py checks that together they stay a matrix. Under MPI
(n = 1..4) every rank runs the call; :func:`check_row` asserts that every rank raised the
same error (type and message), that it is the expected one, and, since a rank that raised
while others entered a collective would hang the run, the per-test timeout guards that
too. Rows for code that does not exist yet skip with the reason.

The rows call on the objects of :func:`context` (the conftest fixture ``bad_input_ctx``).
"""

from __future__ import annotations

import importlib
import os
import shutil
import tempfile
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest
from mpi4py import MPI

import sbpmpi as sm

comm = MPI.COMM_WORLD
rank, size = comm.Get_rank(), comm.Get_size()


@dataclass(frozen=True)
class Row:
    id: str
    call: Callable[[Any], Any]
    exc: type[BaseException] | tuple[type[BaseException], ...]
    fragment: str
    min_size: int = 1
    needs: str = ""  # "module:attr" that must exist, else the row skips
    gap: str = ""  # a known validation gap: expected to fail
    gap_min_size: int = 1  # ... from this world size on

    def __repr__(self) -> str:
        return self.id


def rank_dependent(c: Any, same: Any, last: Any) -> Any:
    """``last`` on the last rank, ``same`` elsewhere: a mistake made on one rank only."""
    return last if rank == size - 1 else same


def comm_checked(fn: Callable[[], Any]) -> Any:
    """Run ``fn`` in comm's checked mode: root-only arguments are checked on every rank."""
    with sm.config.override(comm_check=True):
        return fn()


def no_cupy() -> None:
    from sbpmpi import backend

    if backend.cupy_available():
        pytest.skip("CuPy and a GPU are present: nothing to refuse")


def context() -> Iterator[SimpleNamespace]:
    """Shared objects: a placement over all ranks, a tensor, local shards, files."""
    d = tempfile.mkdtemp(prefix="sbpmpi-bad-") if rank == 0 else None
    d = comm.bcast(d, root=0)
    pl = sm.placement("cpu", list(range(size)))
    value = np.arange(24, dtype=np.float64).reshape(4, 6)
    c = SimpleNamespace(
        pl=pl, pl0=sm.placement("cpu", [0]),
        x=sm.tensor(value, placement=pl, sbp=sm.sbp.split(0)), local=np.zeros((2, 3)),
        dir=d, path=lambda name: os.path.join(d, name),
    )
    c.good = c.path("good.npy")
    c.truncated = c.path("truncated.npy")
    c.complex = c.path("complex.npy")
    if rank == 0:
        np.save(c.good, value)
        with open(c.truncated, "wb") as f:
            f.write(open(c.good, "rb").read()[:-5])
        np.save(c.complex, value.astype(np.complex128))
    comm.Barrier()
    yield c
    comm.Barrier()
    if rank == 0:
        shutil.rmtree(d, ignore_errors=True)


def _missing(needs: str) -> str | None:
    if not needs:
        return None
    mod, _, attr = needs.partition(":")
    try:
        m = importlib.import_module(mod)
    except ImportError as e:
        return f"{mod} is not there yet ({e})"
    if attr and not hasattr(m, attr):
        return f"{mod}.{attr} is not there yet"
    return None


def check_row(row: Row, ctx: SimpleNamespace, request: pytest.FixtureRequest) -> None:
    """Run ``row``'s call on every rank: the same error everywhere, the one expected."""
    if row.gap and size >= row.gap_min_size:
        request.applymarker(pytest.mark.xfail(strict=True, reason=row.gap))
    if size < row.min_size:
        pytest.skip(f"needs {row.min_size} ranks")
    why = _missing(row.needs)
    if why:
        pytest.skip(why)
    try:
        row.call(ctx)
    except Exception as e:
        got = (type(e).__name__, str(e), isinstance(e, row.exc))
    else:
        got = ("no error", "", False)
    everyone = comm.allgather(got)
    assert all(g == everyone[0] for g in everyone), (
        "ranks raised different errors:\n" + "\n".join(f"  rank {r}: {g[0]}: {g[1]}"
                                                        for r, g in enumerate(everyone)))
    name, msg, ok = got
    expected = row.exc.__name__ if isinstance(row.exc, type) else \
        " or ".join(t.__name__ for t in row.exc)
    assert ok, f"expected {expected} containing {row.fragment!r}, got {name}: {msg}"
    assert row.fragment in msg, f"expected {row.fragment!r} in the message, got {name}: {msg}"
