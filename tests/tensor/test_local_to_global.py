"""``sm.to_global`` of local arrays: the plan (pure) and the result under MPI.

The plan (:mod:`sbpmpi.boxing.assembly`) is checked without MPI: the row moves of uneven
split arrays cover every row once and send a rank only the rows it must hold; the checks
name the ranks and their values. Under MPI every case builds each rank's array from a
seed that every rank knows, so each rank computes the expected global value with NumPy
(the arrays concatenated along split axes, the first along broadcast axes, reduced along
partial axes) and compares it with ``x.numpy()`` and its own shard. ``sm.trace`` measures
the bytes each rank receives: at most the rows it must hold.
"""

from __future__ import annotations

import itertools

import numpy as np
import pytest
from conftest import agree, errors_of
from mpi4py import MPI

import sbpmpi as sm
from sbpmpi import backend
from sbpmpi.boxing.assembly import (
    LocalShard,
    RowMove,
    check_shards,
    global_shape,
    plan_assembly,
    row_moves,
)
from sbpmpi.core.layout import Layout, balanced_sizes
from sbpmpi.core.sbp import Broadcast, Partial, Split, normalize_nd_sbp
from sbpmpi.runtime.execute import rank_moves

world = MPI.COMM_WORLD
rank, size = world.Get_rank(), world.Get_size()

W = 8  # world size of the placements of the pure tests


def pl(ranks, type="cpu", world_size=W):
    return sm.placement(type, ranks, world_size=world_size)


def shards(shapes, dtype=np.float32):
    return tuple(LocalShard(tuple(s), np.dtype(dtype).str) for s in shapes)


# -- row moves (pure) ----------------------------------------------------------------------

COUNTS = [(3,), (0,), (2, 2), (5, 0, 0), (0, 0, 7), (1, 0, 3, 9), (4, 4, 4, 0), (0, 0),
          (9, 1, 0, 0, 5, 2, 0, 1), (1, 1, 1, 1, 1, 1, 1, 1), (0, 13, 0, 0, 0, 0, 0, 0)]


@pytest.mark.parametrize("counts", COUNTS)
def test_row_moves_deliver_every_row_once_from_its_holder_to_its_owner(counts):
    targets = balanced_sizes(sum(counts), len(counts))
    moves = row_moves(counts, targets)
    held = np.repeat(np.arange(len(counts)), counts)  # position holding each row
    owner = np.repeat(np.arange(len(targets)), targets)  # position that must hold it
    got = np.full(sum(counts), -1)
    for m in moves:
        assert isinstance(m, RowMove) and m.start < m.stop
        assert (held[m.start:m.stop] == m.src).all() and (owner[m.start:m.stop] == m.dst).all()
        assert (got[m.start:m.stop] == -1).all()  # no row twice
        got[m.start:m.stop] = m.dst
    np.testing.assert_array_equal(got, owner)  # every row once
    # in row order, and at most one move per boundary of either side
    assert [m.start for m in moves] == sorted(m.start for m in moves)
    assert len(moves) <= len(counts) + len(targets) - 1


def test_row_moves_of_equal_sides_keep_every_row_in_place():
    assert all(m.src == m.dst for m in row_moves((3, 0, 2), (3, 0, 2)))
    assert row_moves((0, 0), (0, 0)) == ()
    with pytest.raises(ValueError, match="5 rows held but 4 wanted"):
        row_moves((2, 3), (2, 2))


# -- the plan (pure) ------------------------------------------------------------------------

def test_balanced_arrays_stay_where_they_are():
    p = pl([[0, 1], [2, 3]])
    sbp = (Broadcast(), Split(1))
    plan = plan_assembly(p, sbp, shards([(4, 3), (4, 2)] * 2))
    assert plan.layout == Layout((4, 5), p, sbp)
    assert not plan.rebalanced and plan.moves == () and plan.broadcast_axes == (0,)
    assert plan.source_box(1) == ((0, 4), (3, 5)) and plan.source_box(5) is None
    # a broadcast axis of one rank has nothing to send
    one = plan_assembly(pl([[0], [1]]), (Split(0), Broadcast()), shards([(1,), (1,)]))
    assert one.broadcast_axes == ()


def test_uneven_split_plans_moves_of_only_the_rows_each_rank_lacks():
    p = pl([5, 2, 0])
    plan = plan_assembly(p, Split(1), shards([(2, 7), (2, 0), (2, 1)], np.int16))
    assert plan.layout == Layout.make((2, 8), p, Split(1)) and plan.dtype == np.int16
    assert plan.rebalanced
    assert [plan.source_box(r) for r in (5, 2, 0)] == [((0, 2), (0, 7)), ((0, 2), (7, 7)),
                                                       ((0, 2), (7, 8))]
    # balanced: 3, 3, 2 columns. Rank 5 keeps 0..3 and sends 3..6 to rank 2, 6..7 to 0
    want = {(5, 5, ((0, 2), (0, 3))), (5, 2, ((0, 2), (3, 6))), (5, 0, ((0, 2), (6, 7))),
            (0, 0, ((0, 2), (7, 8)))}
    assert {(t.src, t.dst, t.box) for t in plan.moves} == want
    for r in p.rank_list:  # what a rank receives: its shard less what it keeps
        mine = rank_moves(plan.moves, r, plan.source_box(r), plan.layout.local_ranges(r))
        got = sum(int(np.prod(rv.shape)) for rv in mine.receives)
        kept = sum(int(np.prod([s.stop - s.start for s in c.dst_at])) for c in mine.copies)
        assert got + kept == int(np.prod(plan.layout.local_shape(r)))
        assert {s.peer for s in mine.sends} <= set(p.rank_list) - {r}


def test_global_shape_adds_split_extents_along_their_mesh_axes():
    p = pl([[0, 1, 2], [3, 4, 5]])
    nd = normalize_nd_sbp((Split(0), Split(0)), 2, 2)
    lay = Layout((11, 3), p, nd)
    shapes = [lay.local_shape(r) for r in p.rank_list]
    assert global_shape(p, nd, shapes) == (11, 3)
    nd = normalize_nd_sbp((Partial("sum"), Split(1)), 2, 2)
    assert global_shape(p, nd, [(4, 2), (4, 2), (4, 1)] * 2) == (4, 5)


@pytest.mark.parametrize("shapes, sbp, err, text", [
    ([(2, 3), (2, 3)], Split(0), TypeError,
     "local arrays must share one dtype, but rank 0 has float32 and rank 1 has float64"),
    ([(2, 3), (6,)], Split(0), ValueError,
     "must have the same number of dims, got shapes [(2, 3), (6,)] on ranks [0, 1]"),
    ([(2, 3), (2, 4)], Split(0), ValueError,
     "rank 1 has shape (2, 4) but rank 0 has (2, 3) (dim 1 is not split"),
    ([(2, 3), (3, 3)], Broadcast(), ValueError,
     "rank 1 has shape (3, 3) but rank 0 has (2, 3) (dim 0 is not split"),
    ([(2, 3), (2, 3)], Split(2), ValueError, "split dim 2 is out of range"),
])
def test_bad_shards_raise_naming_the_ranks_and_their_values(shapes, sbp, err, text):
    dtypes = [np.float32, np.float64] if err is TypeError else [np.float32] * 2
    metas = tuple(LocalShard(s, np.dtype(d).str) for s, d in zip(shapes, dtypes))
    with pytest.raises(err) as e:
        plan_assembly(pl([0, 1]), sbp, metas)
    assert text in str(e.value)


def test_partial_max_of_complex_and_uneven_nd_shards_are_refused():
    with pytest.raises(TypeError, match="partial_max"):
        plan_assembly(pl([0, 1]), Partial("max"), shards([(3,), (3,)], np.complex64))
    with pytest.raises(ValueError, match=r"shard shapes \[\(1,\), \(2,\), \(1,\), \(2,\)\] on "
                                         r"ranks \[0, 1, 2, 3\] do not form a balanced"):
        plan_assembly(pl([[0, 1], [2, 3]]), (Broadcast(), Split(0)),
                      shards([(1,), (2,), (1,), (2,)]))
    check_shards(pl([0, 1]), shards([(1,), (5,)]))  # the same dtype and ndim: accepted


# -- under MPI: equal to NumPy -------------------------------------------------------------

REDUCE = {"sum": np.add, "max": np.maximum, "min": np.minimum}


def expected(placement, nd_sbp, arrays):
    """The global value of the world's arrays (``arrays[r]``, world rank r) laid out as
    ``nd_sbp``: from the last mesh axis to the first, the arrays along an axis are
    concatenated (split), the first one taken (broadcast) or reduced (partial)."""
    grid = np.empty(placement.hierarchy, dtype=object)
    for r in placement.rank_list:
        grid[placement.coord_of(r)] = arrays[r]
    for axis in reversed(range(placement.ndim)):
        s = nd_sbp[axis]
        out = np.empty(grid.shape[:-1], dtype=object)
        for idx in np.ndindex(*grid.shape[:-1]):
            parts = list(grid[idx])
            if isinstance(s, Split):
                out[idx] = np.concatenate(parts, axis=s.dim)
            elif isinstance(s, Broadcast):
                out[idx] = parts[0]
            else:
                # in the arrays' dtype (np.add.reduce would widen small integers)
                out[idx] = REDUCE[s.op].reduce(np.stack(parts), axis=0, dtype=parts[0].dtype)
        grid = out
    return grid[()]


def placements(device_type):
    out = [sm.placement(device_type, list(range(size))),
           sm.placement(device_type, list(reversed(range(size)))),
           sm.placement(device_type, [size - 1])]
    if size >= 3:
        out.append(sm.placement(device_type, [2, 0]))
    if size >= 4:
        out += [sm.placement(device_type, [[0, 1], [2, 3]]),
                sm.placement(device_type, [[3, 1], [0, 2]])]
    if size >= 2:
        out.append(sm.placement(device_type, [[r] for r in range(size)]))
    return out


def uneven(n_ranks, pattern):
    """Per-position row counts: uneven (zeros included), every rank empty, one rank all."""
    if pattern == "mixed":
        return [(3 * k + 1) % 4 for k in range(n_ranks)]
    if pattern == "empty":
        return [0] * n_ranks
    return [7] + [0] * (n_ranks - 1)


def arrays_for(case_seed, shapes, dtype):
    """``shapes[r]``-shaped arrays of every world rank r (None for no shape), from seeds
    every rank knows; integer values, so sums are exact in every dtype."""
    out = {}
    for r, shape in shapes.items():
        g = np.random.default_rng([case_seed, r])
        v = g.integers(-3, 4, size=shape)
        out[r] = (v > 0) if np.dtype(dtype) == np.bool_ else v.astype(dtype)
    return out


def cases(placement, ndim):
    """(sbp, per-world-rank local shapes) of the cases on ``placement``."""
    ranks = placement.rank_list
    base = (5, 3, 2)[:ndim]
    one = [Broadcast(), Partial("sum"), Partial("max"), Partial("min")]
    one += [Split(d) for d in range(ndim)]
    for nd in itertools.product(one, repeat=placement.ndim):
        lay = Layout(base, placement, nd)
        yield nd, {r: lay.local_shape(r) for r in ranks}  # balanced
    if placement.ndim == 1:
        for d, pattern in itertools.product(range(ndim), ("mixed", "empty", "one")):
            counts = uneven(len(ranks), pattern)
            shapes = {r: base[:d] + (c,) + base[d + 1:] for r, c in zip(ranks, counts)}
            yield (Split(d),), shapes


def check_case(x, placement, nd, shapes, arrays, local, mine):
    """Assert ``x`` (``sm.to_global`` of ``local``, a copy of ``mine``) is the NumPy value."""
    want = expected(placement, nd, arrays)
    ctx = f"{placement} {nd} {shapes}"
    assert x.shape == want.shape and x.dtype == want.dtype, ctx
    np.testing.assert_array_equal(x.numpy(), want, err_msg=ctx)
    assert x.to_local().shape == x.layout.local_shape(rank), ctx
    if local is None:
        return
    np.testing.assert_array_equal(backend.asnumpy(local), mine, err_msg=ctx)  # unchanged
    if not any(isinstance(s, Partial) for s in nd):
        np.testing.assert_array_equal(backend.asnumpy(x.to_local()),
                                      want[x.layout.local_slice(rank)], err_msg=ctx)


@pytest.mark.mpi(min_size=1)
def test_local_arrays_to_global_equal_numpy(device_type):
    xp = backend.get_xp(device_type)
    failures: list[str] = []
    n_cases = 0
    for k, placement in enumerate(placements(device_type)):
        for ndim in (1, 2, 3) if placement.ndim == 1 else (1, 2):
            for c, (nd, shapes) in enumerate(cases(placement, ndim)):
                arrays = arrays_for([k, ndim, c], shapes, np.float64)
                mine = arrays.get(rank)
                local = None if mine is None else xp.asarray(mine.copy())
                x = sm.to_global(local, placement=placement, sbp=nd)
                try:
                    check_case(x, placement, nd, shapes, arrays, local, mine)
                except AssertionError as e:
                    failures.append(str(e))
                n_cases += 1
    agree_none_failed(failures)
    assert n_cases >= 60


def agree_none_failed(failures):
    """Fail on every rank if a case failed on some rank (after every collective ran)."""
    def check():
        assert not failures, f"{len(failures)} cases failed, the first: {failures[0]}"

    agree(check)


@pytest.mark.mpi(min_size=1)
@pytest.mark.parametrize("dtype", [np.bool_, np.int8, np.uint16, np.int32, np.int64, np.float16,
                                   np.float32, np.complex64, np.complex128])
def test_every_dtype_keeps_its_values(dtype):
    placement = sm.placement("cpu", list(range(size)))
    counts = uneven(size, "mixed")
    kinds = [(Split(1),), (Broadcast(),)]
    if dtype != np.bool_:
        kinds.append((Partial("sum"),))
        if np.dtype(dtype).kind != "c":
            kinds += [(Partial("max"),), (Partial("min"),)]

    failures: list[str] = []
    for k, nd in enumerate(kinds):
        shapes = {r: (2, counts[r] if isinstance(nd[0], Split) else 4, 3) for r in range(size)}
        arrays = arrays_for([99, k], shapes, dtype)
        x = sm.to_global(arrays[rank].copy(), placement=placement, sbp=nd)
        try:
            check_case(x, placement, nd, shapes, arrays, arrays[rank], arrays[rank])
        except AssertionError as e:
            failures.append(str(e))
    agree_none_failed(failures)


# -- under MPI: the bytes each rank receives ----------------------------------------------------

def _received_bytes(t):
    """Bytes each world rank receives in the traced calls: the sum of the sends addressed
    to it, over every rank's trace (the sender's record counts the bytes)."""
    mine = [(rec.peer, rec.nbytes) for rec in t.records if rec.op in ("send", "isend")]
    got = np.zeros(size, dtype=np.int64)
    for sends in world.allgather(mine):
        for peer, n in sends:
            got[peer] += n
    return got


@pytest.mark.mpi(min_size=1)
@pytest.mark.parametrize("pattern", ["mixed", "one", "reversed"])
@pytest.mark.parametrize("dim", [0, 1])
def test_each_rank_receives_at_most_the_rows_it_must_hold(pattern, dim):
    ranks = list(range(size))
    placement = sm.placement("cpu", ranks)
    counts = [size - k for k in ranks] if pattern == "reversed" else uneven(size, pattern)
    counts = [c * 50 for c in counts]
    cols = 64
    shape = (counts[rank], cols) if dim == 0 else (cols, counts[rank])
    local = np.full(shape, rank, dtype=np.float64)
    with sm.trace() as t:
        x = sm.to_global(local, placement=placement, sbp=sm.sbp.split(dim))
    got = _received_bytes(t)
    value = x.numpy()
    total = sum(counts)
    row_bytes = cols * 8
    starts = np.concatenate([[0], np.cumsum(counts)])
    targets = balanced_sizes(total, size)
    ends = np.concatenate([[0], np.cumsum(targets)])

    def check():
        assert not {r.op for r in t.records} - {"isend", "irecv", "all_gather_object"}, t.ops()
        assert t.nbytes("all_gather_object") < 1024  # the metadata exchange only
        for r in ranks:
            must = targets[r] * row_bytes
            kept = max(0, min(starts[r + 1], ends[r + 1]) - max(starts[r], ends[r])) * row_bytes
            assert got[r] <= must, (r, got[r], must)
            assert got[r] == must - kept, (r, got[r], must, kept)
        want = np.concatenate([np.full((c, cols) if dim == 0 else (cols, c), float(r))
                               for r, c in enumerate(counts)], axis=dim)
        np.testing.assert_array_equal(value, want)

    agree(check)


@pytest.mark.mpi(min_size=2)
def test_mismatched_arrays_raise_on_every_rank_naming_ranks_and_values():
    placement = sm.placement("cpu", list(range(size)))
    last = size - 1
    kind, msg = errors_of(lambda: sm.to_global(
        np.zeros(2, dtype=np.float32 if rank == last else np.float64), placement=placement,
        sbp=sm.sbp.split(0)))
    assert kind == "TypeError"
    assert f"rank 0 has float64 and rank {last} has float32" in msg, msg
    kind, msg = errors_of(lambda: sm.to_global(
        np.zeros((1 + rank, 3 + (rank == last))), placement=placement, sbp=sm.sbp.split(0)))
    assert kind == "ValueError"
    assert f"rank {last} has shape ({1 + last}, 4) but rank 0 has (1, 3) (dim 1 is not split" \
        in msg, msg
    if size >= 4:
        mesh = sm.placement("cpu", [[0, 1], [2, 3]])
        kind, msg = errors_of(lambda: sm.to_global(
            np.zeros(1 + rank % 2) if rank < 4 else None, placement=mesh,
            sbp=(sm.sbp.broadcast, sm.sbp.split(0))))
        assert kind == "ValueError" and "on an N-d mesh shards must be balanced" in msg, msg


@pytest.mark.mpi(min_size=1)
def test_uneven_strided_and_read_only_arrays_move_without_being_written():
    placement = sm.placement("cpu", list(range(size)))
    counts = uneven(size, "mixed")
    shapes = {r: (3, counts[r]) for r in range(size)}  # split(1) of the transposed views
    arrays = arrays_for([7], {r: (c, 3) for r, (_, c) in shapes.items()}, np.float64)
    base = arrays[rank].copy()
    base.setflags(write=False)
    x = sm.to_global(base.T, placement=placement, sbp=sm.sbp.split(1))
    want = np.concatenate([arrays[r].T for r in range(size)], axis=1)
    value = x.numpy()

    def check():
        np.testing.assert_array_equal(value, want)
        np.testing.assert_array_equal(base, arrays[rank])
        local = x.to_local()
        np.testing.assert_array_equal(local, want[x.layout.local_slice(rank)])
        assert local.flags.writeable

    agree(check)
