"""The bad input matrix: every public function refuses bad arguments the same way on every rank.

Each row is one bad call across the public API (placements, SBPs, creation, to_global,
conversion, comm, checkpoints, ops) with the error type and a message fragment it must
raise. Under MPI (n = 1..4) every rank runs the call; the test asserts that every rank
raised the same error (type and message), that it is the expected one, and, since a
rank that raised while others entered a collective would hang the run, the per-test
timeout guards that too. Rows for code that does not exist yet skip with the reason.
"""

from __future__ import annotations

import importlib
import os
import shutil
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest
from mpi4py import MPI

import sbpmpi as sm
from sbpmpi.errors import CheckpointError

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


def _rank_dependent(c: Any, same: Any, last: Any) -> Any:
    """``last`` on the last rank, ``same`` elsewhere: a mistake made on one rank only."""
    return last if rank == size - 1 else same


def _comm_checked(fn: Callable[[], Any]) -> Any:
    """Run ``fn`` in comm's checked mode: root-only arguments are checked on every rank."""
    with sm.config.override(comm_check=True):
        return fn()


def _no_cupy() -> None:
    from sbpmpi import backend

    if backend.cupy_available():
        pytest.skip("CuPy and a GPU are present: nothing to refuse")


S, B, P = sm.sbp.split, sm.sbp.broadcast, sm.sbp.partial_sum

ROWS = [
    # -- placement and SBP ------------------------------------------------------------------------
    Row("placement-type", lambda c: sm.placement("tpu", [0]), ValueError,
        "placement type 'tpu' is not supported"),
    Row("placement-empty", lambda c: sm.placement("cpu", []), ValueError,
        "must name at least one rank"),
    Row("placement-out-of-range", lambda c: sm.placement("cpu", [0, size]), ValueError,
        f"placement ranks [{size}] are out of range for a world of {size}"),
    Row("placement-negative-rank", lambda c: sm.placement("cpu", [-1]), ValueError,
        "out of range"),
    Row("placement-duplicate", lambda c: sm.placement("cpu", [0, 0]), ValueError,
        "must be distinct"),
    Row("placement-float-rank", lambda c: sm.placement("cpu", [0.5]), TypeError,
        "placement ranks must be integers, got float 0.5"),
    Row("placement-ragged", lambda c: sm.placement("cpu", [[0], [0, 0]]), (ValueError, TypeError),
        "[[0], [0, 0]]"),
    Row("split-float-dim", lambda c: S(1.5), TypeError, "split dim must be an int, got float 1.5"),
    Row("split-str-dim", lambda c: S("0"), TypeError, "split dim must be an int, got str '0'"),
    Row("partial-op", lambda c: sm.sbp.Partial("avg"), ValueError,
        "partial op 'avg' is not one of 'sum', 'max', 'min'"),
    # -- creation -------------------------------------------------------------------------------
    Row("create-split-dim-out-of-range", lambda c: sm.zeros(2, 3, placement=c.pl, sbp=S(2)),
        ValueError, "split dim 2 is out of range for a tensor of 2 dims"),
    Row("create-too-many-sbps", lambda c: sm.zeros(2, 3, placement=c.pl, sbp=(S(0), B)),
        ValueError, "give one SBP per mesh axis"),
    Row("create-no-placement", lambda c: sm.zeros(2, 3, sbp=B), TypeError,
        "placement= is required"),
    Row("create-no-sbp", lambda c: sm.ones(2, 3, placement=c.pl), TypeError, "sbp= is required"),
    Row("create-placement-not-placement", lambda c: sm.zeros(2, placement="cpu", sbp=B),
        TypeError, "placement must be an sm.placement, got str"),
    Row("create-sbp-string", lambda c: sm.zeros(2, placement=c.pl, sbp="split"), TypeError,
        "sbp must be an SBP"),
    Row("create-sbp-entry-int", lambda c: sm.zeros(2, placement=c.pl, sbp=[0]), TypeError,
        "sbp entry 0 is not an SBP"),
    Row("create-negative-size", lambda c: sm.zeros(2, -1, placement=c.pl, sbp=B), ValueError,
        "has a negative size -1"),
    Row("create-float-size", lambda c: sm.randn(2.5, placement=c.pl, sbp=B), TypeError,
        "shape entries must be ints, got float 2.5"),
    Row("randn-int-dtype", lambda c: sm.randn(3, placement=c.pl, sbp=B, dtype=np.int32),
        TypeError, "randn needs a floating dtype, got int32"),
    Row("rand-bad-dtype", lambda c: sm.rand(3, placement=c.pl, sbp=B, dtype="nodtype"),
        TypeError, "dtype 'nodtype' is not a NumPy dtype"),
    Row("arange-zero-step", lambda c: sm.arange(0, 5, 0, placement=c.pl, sbp=B), ValueError,
        "arange step must not be zero"),
    Row("tensor-of-global", lambda c: sm.tensor(c.x, placement=c.pl, sbp=B), TypeError,
        "sm.tensor takes the whole global value"),
    Row("full-partial-max-complex",
        lambda c: sm.full((2,), 1j, placement=c.pl, sbp=sm.sbp.partial_max), TypeError,
        "partial_max is not defined for dtype complex64"),
    Row("full-value-shape",
        lambda c: sm.full((2,), [1.0, 2.0, 3.0], placement=c.pl0, sbp=B), TypeError, "(3,)"),
    Row("tensor-unconvertible-data",
        lambda c: sm.tensor(np.array(["a", "b"]), placement=c.pl0, sbp=B, dtype=np.float32),
        ValueError, "could not convert string to float"),
    Row("create-cuda-without-gpu",
        lambda c: _no_cupy() or sm.zeros(3, placement=sm.placement("cuda", [0]), sbp=B),
        RuntimeError, "placement type 'cuda' needs CuPy and a GPU"),
    Row("arange-infinite", lambda c: sm.arange(0, float("inf"), placement=c.pl, sbp=B),
        ValueError, "arange"),
    Row("seed-str", lambda c: sm.manual_seed("1"), TypeError, "seed must be an int"),
    # -- local -> global ----------------------------------------------------------------------------
    Row("to_global-no-placement", lambda c: sm.to_global(c.local, sbp=S(0)), TypeError,
        "placement= must be an sm.placement"),
    Row("to_global-no-sbp", lambda c: sm.to_global(c.local, placement=c.pl), TypeError,
        "sbp= is required"),
    Row("to_global-split-dim", lambda c: sm.to_global(c.local, placement=c.pl, sbp=S(2)),
        ValueError, "split dim 2 is out of range for a tensor of 2 dims"),
    Row("to_global-shapes-differ",
        lambda c: sm.to_global(np.zeros((2, _rank_dependent(c, 3, 4))), placement=c.pl,
                               sbp=S(0)),
        ValueError, "cannot form one global tensor", min_size=2),
    Row("to_global-dtypes-differ",
        lambda c: sm.to_global(np.zeros(2, dtype=_rank_dependent(c, np.float64, np.float32)),
                               placement=c.pl, sbp=S(0)),
        TypeError, "local arrays must share one dtype", min_size=2),
    Row("to_global-ndims-differ",
        lambda c: sm.to_global(np.zeros(_rank_dependent(c, (2, 3), (6,))), placement=c.pl,
                               sbp=S(0)),
        ValueError, "must have the same number of dims", min_size=2),
    Row("to_global-missing-local",
        lambda c: sm.to_global(_rank_dependent(c, c.local, None), placement=c.pl, sbp=S(0)),
        TypeError, "passed no local array", min_size=2),
    Row("to_global-unusable-local",
        lambda c: sm.to_global(_rank_dependent(c, c.local, [[1], [1, 2]]), placement=c.pl,
                               sbp=S(0)),
        TypeError, f"to_global: rank {size - 1} could not use its local array", min_size=2),
    Row("to_global-string", lambda c: sm.to_global("abc", placement=c.pl, sbp=B), TypeError,
        "got str"),
    # -- global -> global ------------------------------------------------------------------------
    Row("x.to_global-cuda-without-gpu",
        lambda c: _no_cupy() or c.x.to_global(placement=sm.placement("cuda", [0])),
        RuntimeError, "placement type 'cuda' needs CuPy and a GPU"),
    Row("x.to_global-placement-str", lambda c: c.x.to_global(placement="cpu"), TypeError,
        "placement must be an sm.placement, got str"),
    Row("x.to_global-split-dim", lambda c: c.x.to_global(sbp=S(5)), ValueError,
        "split dim 5 is out of range for a tensor of 2 dims"),
    Row("x.to_global-mesh-change-needs-sbp",
        lambda c: c.x.to_global(placement=sm.placement("cpu", [[r] for r in range(size)])),
        ValueError, "sbp is required when the mesh changes from 1-d to 2-d"),
    Row("x.to_global-partial-max-complex",
        lambda c: sm.tensor(np.ones(3, np.complex64), placement=c.pl, sbp=B).to_global(
            sbp=sm.sbp.partial_max),
        TypeError, "partial_max is not defined for dtype complex64"),
    Row("item-many-elements", lambda c: c.x.item(), ValueError,
        "item() needs a tensor of one element, got shape (4, 6)"),
    Row("len-0d", lambda c: len(sm.zeros((), placement=c.pl, sbp=B)), TypeError,
        "len() of a 0-d global tensor"),
    # -- comm ---------------------------------------------------------------------------------
    Row("comm-broadcast-src", lambda c: sm.comm.broadcast(np.zeros(2), src=size), ValueError,
        f"src={size} is not a rank of the group"),
    Row("comm-broadcast-list", lambda c: sm.comm.broadcast([1.0], src=0), TypeError,
        "arr must be a NumPy or CuPy array, got list"),
    Row("comm-all_reduce-op-str", lambda c: sm.comm.all_reduce(np.zeros(2), op="sum"),
        TypeError, "op must be a ReduceOp"),
    Row("comm-send-out-of-range", lambda c: sm.comm.send(np.zeros(2), dst=size), ValueError,
        f"dst={size} is not a rank of the group", needs="sbpmpi.comm:send"),
    Row("comm-all_reduce-noncontiguous",
        lambda c: sm.comm.all_reduce(np.zeros((4, 4))[:, 0]), ValueError, "C-contiguous"),
    Row("comm-new_group-duplicate", lambda c: sm.comm.new_group([0, 0]), ValueError,
        "group ranks must be distinct"),
    Row("comm-get_group-out-of-range", lambda c: sm.comm.get_group([size]), ValueError,
        f"group ranks [{size}] are out of range for a world of {size}"),
    Row("comm-gather-list-length-checked",
        lambda c: _comm_checked(lambda: sm.comm.gather(np.zeros(2), [np.zeros(2)] * (size + 1),
                                                       dst=0)),
        ValueError, f"gather_list has {size + 1} arrays", needs="sbpmpi.comm:gather"),
    # -- checkpoints ----------------------------------------------------------------------------
    Row("save-not-global", lambda c: sm.save(np.zeros(3), c.path("a.npy")), TypeError,
        "sm.save needs a GlobalTensor, got ndarray"),
    Row("save-path-int", lambda c: sm.save(c.x, 123), TypeError,
        "path must be a str or os.PathLike, got int 123"),
    Row("save-missing-directory", lambda c: sm.save(c.x, c.path("no/such/dir/a.npy")),
        FileNotFoundError, "does not exist"),
    Row("tensor-object-dtype",
        lambda c: sm.save(sm.tensor(np.array([None, 1], dtype=object), placement=c.pl, sbp=B),
                          c.path("o.npy")),
        TypeError, "data must be numeric"),
    Row("load-missing-file", lambda c: sm.load(c.path("nope.npy"), placement=c.pl, sbp=B),
        FileNotFoundError, "sm.load: no such file"),
    Row("load-truncated", lambda c: sm.load(c.truncated, placement=c.pl, sbp=S(0)),
        CheckpointError, "is truncated: the header says shape (4, 6) float64"),
    Row("load-no-placement", lambda c: sm.load(c.good, sbp=B), TypeError,
        "sm.load: placement= is required"),
    Row("load-no-sbp", lambda c: sm.load(c.good, placement=c.pl), TypeError,
        "sm.load: sbp= is required"),
    Row("load-split-dim", lambda c: sm.load(c.good, placement=c.pl, sbp=S(3)), ValueError,
        "split dim 3 is out of range for a tensor of 2 dims"),
    Row("load-partial-max-complex",
        lambda c: sm.load(c.complex, placement=c.pl, sbp=sm.sbp.partial_max), TypeError,
        "cannot lay out dtype complex128 as partial_max"),
    Row("save_state-not-dict", lambda c: sm.save_state([c.x], c.path("st")), TypeError,
        "sm.save_state needs a dict of name -> GlobalTensor, got list"),
    Row("save_state-int-name", lambda c: sm.save_state({1: c.x}, c.path("st")), TypeError,
        "tensor names must be non-empty str, got 1"),
    Row("save_state-local-value", lambda c: sm.save_state({"w": np.zeros(2)}, c.path("st")),
        TypeError, "sm.save_state: tensor 'w' needs a GlobalTensor"),
    Row("load_state-missing", lambda c: sm.load_state(c.path("none")), FileNotFoundError,
        "sm.load_state: no such state directory"),
    # -- ops ------------------------------------------------------------------------------------
    Row("matmul-shapes",
        lambda c: sm.matmul(c.x, sm.zeros(5, 2, placement=c.pl, sbp=B)), ValueError,
        "matmul: a has shape (4, 6) and b has shape (5, 2)", needs="sbpmpi.ops:matmul"),
    Row("matmul-0d", lambda c: sm.matmul(c.x, sm.zeros((), placement=c.pl, sbp=B)),
        ValueError, "matmul needs at least 1 dim", needs="sbpmpi.ops:matmul"),
    Row("add-broadcast-shapes", lambda c: c.x + sm.zeros(5, placement=c.pl, sbp=B), ValueError,
        "cannot be broadcast together", needs="sbpmpi.ops:add"),
    Row("sum-dim-out-of-range", lambda c: c.x.sum(dim=2), ValueError,
        "dim 2 is out of range for a tensor of 2 dims", needs="sbpmpi.ops:sum"),
    Row("reshape-size", lambda c: c.x.reshape(5, 5), ValueError,
        "cannot reshape a tensor of shape (4, 6)", needs="sbpmpi.ops:reshape"),
    Row("transpose-axes", lambda c: c.x.transpose(0, 0), ValueError, "transpose: axes",
        needs="sbpmpi.ops:transpose"),
    Row("getitem-out-of-bounds", lambda c: c.x[7], IndexError,
        "index 7 is out of bounds for dim 0 of size 4", needs="sbpmpi.ops:getitem"),
    Row("cat-empty", lambda c: sm.cat([], 0), ValueError, "cat: needs at least one tensor",
        needs="sbpmpi.ops:cat"),
    Row("softmax-dim", lambda c: sm.softmax(c.x, 3), ValueError, "out of range",
        needs="sbpmpi.ops:softmax"),
]


@pytest.fixture(scope="module")
def ctx():
    """Shared objects: a placement over all ranks, a tensor, local shards, files."""
    d = tempfile.mkdtemp(prefix="sbpmpi-bad-") if rank == 0 else None
    d = comm.bcast(d, root=0)
    pl = sm.placement("cpu", list(range(size)))
    value = np.arange(24, dtype=np.float64).reshape(4, 6)
    c = SimpleNamespace(
        pl=pl, pl0=sm.placement("cpu", [0]), x=sm.tensor(value, placement=pl, sbp=S(0)),
        local=np.zeros((2, 3)),
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


def test_the_table_is_big_enough():
    assert len(ROWS) >= 30
    assert len({r.id for r in ROWS}) == len(ROWS)


@pytest.mark.mpi(min_size=1)
@pytest.mark.parametrize("row", ROWS, ids=[r.id for r in ROWS])
def test_bad_input_raises_the_same_error_on_every_rank(ctx, row, request):
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
