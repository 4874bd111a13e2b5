"""``sort`` and ``argsort`` of ``sbpmpi.array_api`` along a split axis, against NumPy, at n = 1..4.

Cases are drawn with Hypothesis (derandomized, no database: every rank draws the same):
1-D arrays (lengths below the number of ranks included, so blocks are uneven or empty),
duplicates, NaN, signed zeros, ints, bools and floats, ascending and descending, split on
all ranks, on a sub-placement, or on both axes of a 2 x 2 mesh; 2-D arrays whose other
axis cannot take the split; rows sorted side by side (fibers); complex values. The
reference is NumPy's stable sort on the whole array (descending: flipped, as the
namespace's kernel; argsort descending keeps equal elements in their original order).
Every rank checks the gathered value, that the result keeps the input's layout, and that
the sort made one all-to-all (a sample sort), whatever the number of ranks.
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from mpi4py import MPI

import sbpmpi as sm
from sbpmpi import array_api as xp
from sbpmpi.core.sbp import broadcast, partial_sum, split

world = MPI.COMM_WORLD
rank, size = world.Get_rank(), world.Get_size()

SETTINGS = dict(derandomize=True, database=None, deadline=None, print_blob=False,
                suppress_health_check=list(HealthCheck))
SOME = settings(max_examples=30, **SETTINGS)
DTYPES = [np.float64, np.float32, np.int64, np.int8, np.uint8, np.bool_]
POINT_TO_POINT = {"isend", "irecv"}
#: a sample sort: samples gathered on one rank, splitters broadcast, piece bounds by one
#: all-to-all, bucket sizes all-gathered, one all-to-all of the data
COLLECTIVES = {"gather_v": 1, "broadcast": 1, "all_to_all": 1, "all_gather": 1,
               "all_to_all_v": 1}


def reference(a: np.ndarray, axis: int, descending: bool, indices: bool) -> np.ndarray:
    """The namespace kernel's answer on the whole array (NumPy's stable sort)."""
    if indices:
        if not descending:
            return np.argsort(a, axis=axis, kind="stable")
        n = a.shape[axis]
        return n - 1 - np.flip(np.argsort(np.flip(a, axis=axis), axis=axis, kind="stable"),
                               axis=axis)
    out = np.sort(a, axis=axis, kind="stable")
    return np.flip(out, axis=axis) if descending else out


def layouts() -> list[str]:
    out = ["split"]
    if size > 1:
        out.append("sub")
    if size == 4:
        out.append("mesh")
    return out


def place(value: np.ndarray, how: str) -> sm.GlobalTensor:
    if how == "sub":
        return sm.tensor(value, placement=sm.placement("cpu", list(range(1, size))),
                         sbp=split(0))
    if how == "mesh":
        return sm.tensor(value, placement=sm.placement("cpu", [[0, 1], [2, 3]]),
                         sbp=(split(0), split(0)))
    return sm.tensor(value, placement=sm.placement("cpu", list(range(size))), sbp=split(0))


@st.composite
def values(draw, ndim: int = 1) -> np.ndarray:
    """A small array with many duplicates, NaN and signed zeros in float dtypes."""
    dtype = np.dtype(draw(st.sampled_from(DTYPES)))
    shape = (draw(st.integers(0, 13)),) + (draw(st.integers(1, 2)),) * (ndim - 1)
    rng = np.random.default_rng(draw(st.integers(0, 2**16)))
    a = rng.integers(-3, 4, size=shape)
    if dtype.kind == "b":
        return (a > 0).astype(dtype)
    if dtype.kind == "u":
        return np.abs(a).astype(dtype)
    if dtype.kind == "i":
        return a.astype(dtype)
    out = a.astype(dtype)
    special = np.array([np.nan, -0.0, 0.0, np.inf, -np.inf, 0.5], dtype=dtype)
    mask = rng.random(shape) < 0.4
    out[mask] = rng.choice(special, size=int(mask.sum()))
    return out


def same(got: np.ndarray, want: np.ndarray) -> bool:
    """Equal values, dtypes, NaN positions and signs of zeros."""
    if got.dtype != want.dtype or got.shape != want.shape:
        return False
    if got.dtype.kind == "c":
        return same(got.real, want.real) and same(got.imag, want.imag)
    if got.dtype.kind == "f":
        return bool(np.array_equal(got, want, equal_nan=True)
                    and np.array_equal(np.signbit(got), np.signbit(want)))
    return bool(np.array_equal(got, want))


def chain_of(x) -> tuple[int, ...]:
    """The ranks splitting the sorted dim 0 with this rank's other mesh coordinates."""
    from sbpmpi.array_api._sort import Chain
    return Chain(x.layout, 0, rank).ranks


def check_messages(trace, x) -> None:
    """Five collectives over the ranks that split the sorted axis (one of them the
    all-to-all of the data), then point-to-point messages among those ranks only; none at all where
    one rank holds the axis or the ranks' blocks are all empty."""
    chain = chain_of(x)
    if len(chain) == 1 or x.shape[0] == 0 or 0 in x.to_local().shape[1:]:
        assert len(trace) == 0, trace.ops()
        return
    collectives = {op: trace.count(op) for op in COLLECTIVES}
    assert collectives == COLLECTIVES, trace.ops()
    for r in trace.records:
        if r.op in POINT_TO_POINT:
            assert r.peer in chain and r.peer != rank, (r, chain)
        else:
            assert r.op in COLLECTIVES and r.group_ranks == chain, (r, chain)


@pytest.mark.mpi
@SOME
@given(values(), st.sampled_from(layouts()), st.booleans(), st.booleans())
def test_sort_1d_matches_numpy_and_keeps_layout(a, how, descending, indices):
    x = place(a, how)
    fn = xp.argsort if indices else xp.sort
    with sm.trace() as t:
        out = fn(x, descending=descending)
    want = reference(a, 0, descending, indices)
    got = out.numpy()
    assert same(got, want.astype(np.int64) if indices else want), (a, how, got, want)
    assert out.layout == x.layout
    assert out.to_local().shape == x.to_local().shape
    if rank in x.placement.rank_list:
        check_messages(t, x)


@pytest.mark.mpi
@SOME
@given(values(ndim=2), st.booleans(), st.booleans())
def test_sort_2d_split_axis_no_other_axis_can_take(a, descending, indices):
    # the other axis (1 or 2 long) is shorter than the ranks or split already: sample sort
    pl = sm.placement("cpu", list(range(size)))
    x = sm.tensor(a, placement=pl, sbp=split(0))
    fn = xp.argsort if indices else xp.sort
    with sm.trace() as t:
        out = fn(x, axis=0, descending=descending)
    want = reference(a, 0, descending, indices)
    assert same(out.numpy(), want.astype(np.int64) if indices else want)
    if size > a.shape[1]:
        assert out.layout == x.layout
        check_messages(t, x)


@pytest.mark.mpi
@pytest.mark.parametrize("how", layouts())
def test_sort_every_length_reversed_and_rotated(how):
    # uneven and empty blocks, long runs of ties that the splitters must cut
    for n in range(4 * size + 2):
        for a in (np.arange(n)[::-1].copy(), np.roll(np.arange(n), n // 2),
                  np.arange(n) % 3):
            x = place(a.astype(np.float64), how)
            for descending in (False, True):
                got = xp.sort(x, descending=descending).numpy()
                assert same(got, reference(a.astype(np.float64), 0, descending, False)), (n, a)
                got = xp.argsort(x, descending=descending).numpy()
                assert same(got, reference(a, 0, descending, True).astype(np.int64)), (n, a)


@pytest.mark.mpi
@pytest.mark.skipif(size != 4, reason="a 2 x 2 mesh needs 4 ranks")
@SOME
@given(values(ndim=2), st.booleans(), st.booleans())
def test_sort_on_a_mesh_runs_per_group_of_the_other_mesh_axis(a, descending, indices):
    # mesh axis 0 splits the sorted axis, mesh axis 1 the other one: a sort per column
    x = sm.tensor(a, placement=sm.placement("cpu", [[0, 1], [2, 3]]), sbp=(split(0), split(1)))
    fn = xp.argsort if indices else xp.sort
    with sm.trace() as t:
        out = fn(x, axis=0, descending=descending)
    want = reference(a, 0, descending, indices)
    assert same(out.numpy(), want.astype(np.int64) if indices else want)
    assert out.layout == x.layout
    column = {0: (0, 2), 2: (0, 2), 1: (1, 3), 3: (1, 3)}[rank]
    assert chain_of(x) == column
    check_messages(t, x)


@pytest.mark.mpi
@pytest.mark.parametrize("indices", [False, True])
def test_sort_makes_one_all_to_all_whatever_the_ranks(indices):
    # issue 43: merge-split took p rounds of whole blocks; a sample sort makes one
    # all-to-all of the data, small collectives of O(p) elements per rank, and sends
    # each element twice
    a = np.random.default_rng(3).normal(size=64 * size + 3).round(1)
    x = place(a, "split")
    fn = xp.argsort if indices else xp.sort
    with sm.trace() as t:
        out = fn(x)
    want = reference(a, 0, False, indices)
    assert np.array_equal(out.numpy(), want.astype(np.int64) if indices else want)
    check_messages(t, x)
    if size == 1:
        return
    block = x.to_local().size
    # the all-to-all carries this rank's block once (argsort: values and int64 indices)
    assert t.nbytes("all_to_all_v") == block * (8 + (8 if indices else 0))
    # the exchange back to the layout sends at most one bucket: balanced to within
    # a few blocks by the samples (at most 2 * 64 + 3 of 64 * size + 3 here)
    assert t.nbytes("isend") <= 3 * block * 8
    # the samples: at most OVERSAMPLE * p per rank
    from sbpmpi.array_api._sort import OVERSAMPLE
    assert t.nbytes("gather_v") <= OVERSAMPLE * size * 16


def small_phase_bytes(trace) -> dict[str, int]:
    """Bytes this rank handed to MPI in the sample, splitter and count phases, per
    collective (comm's records: a rooted call's buffer counts on its root only)."""
    return {op: trace.nbytes(op) for op in ("gather_v", "broadcast", "all_to_all",
                                            "all_gather")}


@pytest.mark.mpi
@pytest.mark.parametrize("indices", [False, True])
def test_sample_sort_small_phases_grow_linearly_with_the_ranks(indices):
    # issue 43: the samples were all-gathered (16 p samples from every rank to every
    # rank) and the cut positions too (p ints to every rank): O(p^2) per rank. Now the
    # samples go to one rank, which broadcasts p - 1 splitters, and the counts travel by
    # one all-to-all of two ints per pair: bytes per rank at most c * p.
    a = np.random.default_rng(11).normal(size=40 * size + 1)
    x = place(a, "split")
    chain = chain_of(x)
    with sm.trace() as t:
        out = (xp.argsort if indices else xp.sort)(x)
    want = reference(a, 0, False, indices)
    assert np.array_equal(out.numpy(), want.astype(np.int64) if indices else want)
    if size == 1:
        assert len(t) == 0
        return
    check_messages(t, x)
    from sbpmpi.array_api._sort import OVERSAMPLE
    sent = small_phase_bytes(t)
    row = 8 + 8  # a sample or splitter: its float64 value and its int64 key
    assert sent["gather_v"] <= OVERSAMPLE * size * row  # own samples only
    root = chain[0]
    assert sent["broadcast"] == ((size - 1) * row if rank == root else 0)
    assert sent["all_to_all"] == 2 * 8 * size  # (start, count) per destination
    assert sent["all_gather"] == 8  # its bucket's size
    assert sum(sent.values()) <= (OVERSAMPLE + 4) * row * size
    # received: the rooted calls name their root, the others their group; nothing of
    # O(p) arrives from every rank at every rank but the one int of all_gather
    gathers = [r for r in t.records if r.op == "gather_v"]
    assert len(gathers) == 1 and gathers[0].peer == root
    bcasts = [r for r in t.records if r.op == "broadcast"]
    assert len(bcasts) == 1 and bcasts[0].peer == root


@pytest.mark.mpi
@SOME
@given(values(ndim=2), st.booleans(), st.booleans(), st.integers(1, 3))
def test_sample_sort_of_rows_side_by_side(a, descending, indices, width):
    # several fibers (rows along the sorted axis) in one sample sort: splitters and
    # buckets cross from one fiber to the next
    from sbpmpi.array_api._sort import sample_sort
    a = np.concatenate([a] * width, axis=1) if a.shape[1] else a
    a = a * np.where(np.arange(a.shape[1]) % 2, -1, 1).astype(a.dtype) if a.dtype.kind in "fi" \
        else a
    x = place(a, "split")
    with sm.trace() as t:
        out = sample_sort(x, 0, descending, indices)
    want = reference(a, 0, descending, indices)
    assert same(out.numpy(), want.astype(np.int64) if indices else want), (a, out.numpy())
    assert out.layout == x.layout
    check_messages(t, x)


@pytest.mark.mpi
@pytest.mark.parametrize("indices", [False, True])
def test_sort_of_complex_values_by_sample_sort(indices):
    # NumPy's lexicographic complex order, NaN in either part last
    rng = np.random.default_rng(5)
    n = 7 * size + 2
    a = rng.integers(-2, 3, size=n) + 1j * rng.integers(-1, 2, size=n)
    a[rng.random(n) < 0.2] = complex(np.nan, 1)
    a[rng.random(n) < 0.2] = complex(1, np.nan)
    x = place(a, "split")
    for descending in (False, True):
        with sm.trace() as t:
            out = (xp.argsort if indices else xp.sort)(x, descending=descending)
        want = reference(a, 0, descending, indices)
        assert same(out.numpy(), want.astype(np.int64) if indices else want), descending
        assert out.layout == x.layout
        check_messages(t, x)


@pytest.mark.mpi
def test_sort_of_partial_input_reduces_first():
    a = np.array([5, -2, 7, 0, 3, 3, -9], dtype=np.int64)
    pl = sm.placement("cpu", list(range(size)))
    x = sm.tensor(a, placement=pl, sbp=partial_sum)
    assert np.array_equal(xp.sort(x).numpy(), np.sort(a))
    assert np.array_equal(xp.argsort(x, descending=True).numpy(),
                          reference(a, 0, True, True))


@pytest.mark.mpi
def test_sort_moves_split_to_another_axis_where_one_can_take_it():
    a = np.random.default_rng(0).normal(size=(5, 4 * size))
    pl = sm.placement("cpu", list(range(size)))
    x = sm.tensor(a, placement=pl, sbp=split(0))
    out = xp.sort(x, axis=0)
    assert np.array_equal(out.numpy(), np.sort(a, axis=0))
    assert out.sbp == (split(1),)  # the result stays split on the axis that took it
    y = sm.tensor(a, placement=pl, sbp=broadcast)
    assert np.array_equal(xp.argsort(y, axis=1, descending=True).numpy(),
                          reference(a, 1, True, True))


@pytest.mark.mpi
def test_sort_rejects_bad_arguments_before_communicating():
    x = place(np.arange(5.0), "split")
    with sm.trace() as t:
        with pytest.raises(TypeError, match="descending must be a bool"):
            xp.sort(x, descending="yes")
        with pytest.raises(IndexError, match="axis 1 is out of range"):
            xp.argsort(x, axis=1)
    assert len(t) == 0


def numpy_unique_all(a: np.ndarray) -> tuple[np.ndarray, ...]:
    """The standard's ``unique_all`` by NumPy on the whole array (every NaN distinct)."""
    v, i, inv, c = np.unique(a, return_index=True, return_inverse=True, return_counts=True,
                             equal_nan=False)
    return v, i.astype(np.int64), inv.astype(np.int64), c.astype(np.int64)


@pytest.mark.mpi
@SOME
@given(values())
def test_unique_of_a_split_vector_by_sample_sort(a):
    # issue 43: unique_* of a split 1-D array sort it (sample sort) instead of gathering
    x = place(a, "split")
    v, i, inv, c = numpy_unique_all(a)
    with sm.trace() as t:
        u = xp.unique_all(x)
    for got, want in zip(u, (v, i, inv, c)):
        assert same(got.numpy(), want), (a, got.numpy(), want)
    default = sm.tensor(v, placement=x.placement, sbp=split(0)).layout
    assert u.values.layout == u.indices.layout == u.counts.layout == default
    assert u.inverse_indices.layout == x.layout
    assert same(xp.unique_values(x).numpy(), v)
    uc, ui = xp.unique_counts(x), xp.unique_inverse(x)
    assert same(uc.values.numpy(), v) and same(uc.counts.numpy(), c)
    assert same(ui.values.numpy(), v) and same(ui.inverse_indices.numpy(), inv)
    if size > 1 and a.size:
        # the sort's all-to-all, then the inverse's; gathers of O(p) elements only
        assert t.count("all_to_all_v") == 2, t.ops()
        assert set(t.ops()) <= set(COLLECTIVES) | POINT_TO_POINT
        from sbpmpi.array_api._sort import OVERSAMPLE
        assert t.nbytes("gather_v") <= OVERSAMPLE * size * 16
        assert t.nbytes("all_gather") <= 3 * 16


@pytest.mark.mpi
def test_unique_of_complex_and_one_value_vectors():
    rng = np.random.default_rng(7)
    for a in (np.full(3 * size + 1, 2.5), np.full(size - 1 or 1, np.nan),
              (rng.integers(-1, 2, 5 * size) + 1j * rng.integers(0, 2, 5 * size)),
              np.array([0.0, -0.0] * size + [np.nan])):
        x = place(a, "split")
        for got, want in zip(xp.unique_all(x), numpy_unique_all(a)):
            assert same(got.numpy(), want), (a, got.numpy(), want)
