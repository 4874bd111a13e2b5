"""Edge cases across the layers, at n = 1..4 where they communicate.

- every rank of an all-to-all makes the same MPI call (even or v-variant), and checked
  mode names the fields in which ranks differ;
- read-only and memory-mapped arrays are valid broadcast sources and split shards;
- ``sm.to_global`` never writes into the caller's (DLPack) array;
- ``rand`` stays in [0, 1) for every float dtype;
- ``sm.to_global`` refuses partial_max/min of complex at creation, like ``sm.tensor``;
- signature choice on 3-D meshes and 4-D tensors prunes its search.
"""

from __future__ import annotations

import numpy as np
import pytest
from conftest import assert_same_on_all_ranks, errors_of
from mpi4py import MPI

import sbpmpi as sm
from sbpmpi.comm import checks
from sbpmpi.testing import SMALL_SEARCH, signature_search_cases

comm = MPI.COMM_WORLD
rank, size = comm.Get_rank(), comm.Get_size()


# -- 6: one decision per collective --------------------------------------------------------------

_P2P = ("send", "recv", "isend", "irecv")


@pytest.mark.mpi(min_size=1)
def test_split_to_split_with_empty_ranks_makes_one_mpi_call_per_group():
    pl = sm.placement("cpu", list(range(size)))
    shapes = [(max(size - 1, 1), max(size - 1, 1), 3000), (2, 2, 4000), (size + 1, 3, 5)]
    # in checked mode, ranks that call different MPI collectives raise
    with sm.config.override(comm_check=True):
        for shape in shapes:
            a = np.arange(np.prod(shape), dtype=np.float64).reshape(shape)
            for i, j in ((0, 1), (1, 0), (0, 2), (2, 1)):
                x = sm.tensor(a, placement=pl, sbp=sm.sbp.split(i))
                with sm.trace() as t:
                    y = x.to_global(sbp=sm.sbp.split(j))
                # checked mode agrees on the conversion once; its calls skip their own
                # exchange, so compare them across ranks here: the same collectives
                # everywhere (point-to-point steps involve the ranks that hold data only)
                assert len(t.agreements) == (size > 1), t.agreements
                assert_same_on_all_ranks([(r.op, r.group_ranks, r.dtype) for r in t
                                          if r.op not in _P2P])
                np.testing.assert_array_equal(y.numpy(), a)


def test_comm_check_message_names_the_differing_fields():
    msg = checks.disagreement((("call", "all_to_all_v"), ("dtype", "<f8"), ("counts", (1, 2))),
                               2, (("call", "all_to_all_v"), ("dtype", "<f8"),
                                   ("counts", (0, 0))))
    assert msg.startswith("all_to_all_v: ranks disagree on counts: ")
    msg = checks.disagreement((("call", "all_to_all_v"), ("dtype", "<f8"), ("counts", (1, 2))),
                               2, (("call", "all_to_all"), ("dtype", "<f8"), ("block", 0)))
    assert "ranks called different collectives" in msg
    assert "group rank 0 called all_to_all_v(dtype=<f8, counts=(1, 2))" in msg
    assert "group rank 2 called all_to_all(dtype=<f8, block=0)" in msg


@pytest.mark.mpi(min_size=2)
def test_ranks_calling_different_collectives_get_one_clear_error_in_checked_mode():
    with sm.config.override(comm_check=True):
        out = np.zeros(size)
        src = np.ones(size)
        if rank == 0:
            fn = lambda: sm.comm.all_to_all_v(out, [1] * size, src, [1] * size)  # noqa: E731
        else:
            fn = lambda: sm.comm.all_to_all(out, src)  # noqa: E731
        kind, msg = errors_of(fn)
        assert kind == "ValueError" and "ranks called different collectives" in msg, msg


# -- 7 and 8: read-only, memory-mapped and foreign inputs ----------------------------------------

def _meshes():
    out = [sm.placement("cpu", list(range(size)))]
    if size == 4:
        out.append(sm.placement("cpu", [[0, 1], [2, 3]]))
    return out


@pytest.mark.mpi(min_size=1)
def test_read_only_array_is_a_valid_broadcast_source_and_split_shard():
    ref = np.arange(6.0).reshape(2, 3)
    for pl in _meshes():
        sbps = [(sm.sbp.broadcast,) * pl.ndim]
        if pl.ndim == 2:
            sbps.append((sm.sbp.broadcast, sm.sbp.split(0)))
        for sbp in sbps:
            a = ref.copy()
            a.setflags(write=False)
            local = a if sbp[-1] == sm.sbp.broadcast else a[rank % 2:rank % 2 + 1]
            x = sm.to_global(local, placement=pl, sbp=sbp)
            np.testing.assert_array_equal(x.numpy(), ref)
            np.testing.assert_array_equal(a, ref)
        a = np.arange(3.0) + 3 * rank
        a.setflags(write=False)
        x = sm.to_global(a, placement=pl, sbp=(sm.sbp.split(0),) * pl.ndim) if pl.ndim == 1 \
            else None
        if x is not None:
            np.testing.assert_array_equal(x.numpy(), np.arange(3.0 * size))
            y = x * 2  # the shard is usable by ops
            np.testing.assert_array_equal(y.numpy(), 2 * np.arange(3.0 * size))


@pytest.mark.mpi(min_size=1)
def test_memory_mapped_weights_are_a_valid_broadcast_source(tmp_path_factory):
    d = tmp_path_factory.mktemp(f"mmap{rank}")
    ref = np.arange(12.0).reshape(3, 4)
    np.save(d / "w.npy", ref)
    w = np.load(d / "w.npy", mmap_mode="r")
    pl = sm.placement("cpu", list(range(size)))
    x = sm.to_global(w, placement=pl, sbp=sm.sbp.broadcast)
    np.testing.assert_array_equal(x.numpy(), ref)
    np.testing.assert_array_equal(np.load(d / "w.npy"), ref)


class _Foreign:
    """A non-NumPy array type seen only through DLPack (as a torch tensor would be)."""

    def __init__(self, a: np.ndarray) -> None:
        self._a = a

    def __dlpack__(self, **kw):
        return self._a.__dlpack__(**kw)

    def __dlpack_device__(self):
        return self._a.__dlpack_device__()


@pytest.mark.mpi(min_size=1)
def test_to_global_never_writes_into_the_callers_dlpack_array():
    for pl in _meshes():
        mine = np.full((2, 3), float(rank))
        obj = _Foreign(mine)
        x = sm.to_global(obj, placement=pl, sbp=(sm.sbp.broadcast,) * pl.ndim)
        np.testing.assert_array_equal(mine, np.full((2, 3), float(rank)))  # unchanged
        first = pl.rank_list[0]
        np.testing.assert_array_equal(x.numpy(), np.full((2, 3), float(first)))
        mine2 = np.full((2, 3), float(rank))
        x = sm.to_global(mine2, placement=pl, sbp=(sm.sbp.broadcast,) * pl.ndim)
        np.testing.assert_array_equal(mine2, np.full((2, 3), float(rank)))


# -- 9: rand in [0, 1) ------------------------------------------------------------------------------

@pytest.mark.mpi(min_size=1)
@pytest.mark.parametrize("dtype", [np.float16, np.float32, np.float64, np.longdouble])
def test_rand_is_below_one_for_every_float_dtype(dtype):
    pl = sm.placement("cpu", list(range(size)))
    sm.manual_seed(0)
    x = sm.rand(100_000, placement=pl, sbp=sm.sbp.split(0), dtype=dtype)
    v = x.numpy()
    assert v.dtype == np.dtype(dtype)
    assert v.min() >= 0 and v.max() < 1, (dtype, int((v >= 1).sum()))
    assert_same_on_all_ranks(v.tobytes())
    # the same values whatever the layout, and as NumPy casts the float64 draw (but < 1)
    sm.manual_seed(0)
    u = sm.rand(100_000, placement=pl, sbp=sm.sbp.broadcast, dtype=np.float64).numpy()
    below = np.nextafter(np.ones((), dtype), np.zeros((), dtype))
    np.testing.assert_array_equal(v, np.minimum(u.astype(dtype), below))
    assert 0.49 < float(v.astype(np.float64).mean()) < 0.51


# -- 10: creation-time dtype check ------------------------------------------------------------------

@pytest.mark.mpi(min_size=1)
@pytest.mark.parametrize("kind", ["partial_max", "partial_min"])
def test_to_global_refuses_complex_partial_max_min_at_creation(kind):
    pl = sm.placement("cpu", list(range(size)))
    sbp = getattr(sm.sbp, kind)
    want = errors_of(lambda: sm.tensor(np.ones(3, dtype=np.complex128), placement=pl, sbp=sbp))
    got = errors_of(lambda: sm.to_global(np.ones(3, dtype=np.complex128), placement=pl, sbp=sbp))
    assert got[0] == want[0] == "TypeError", got
    assert "complex" in got[1] and kind in got[1]


# -- 11: signature choice on large meshes ---------------------------------------------------------

@pytest.mark.parametrize("name", [n for n in signature_search_cases() if n != SMALL_SEARCH])
def test_large_signature_searches_are_pruned_and_choose_well(name):
    from sbpmpi.ops import inference

    call = signature_search_cases()[name]()
    inference.clear_cache()
    pruned = inference.infer(call)
    assert pruned.estimated and len(pruned.candidates) <= inference.PRUNE_KEEP
    assert "large search" in str(pruned)
    # against the exhaustive search (every combination planned exactly)
    saved = inference.PRUNE_ABOVE
    inference.PRUNE_ABOVE = 10**9
    try:
        inference.clear_cache()
        full = inference.infer(call)
    finally:
        inference.PRUNE_ABOVE = saved
        inference.clear_cache()
    assert not full.estimated and len(full.candidates) > inference.PRUNE_ABOVE
    exact = {c.signature: c.total for c in full.candidates}
    assert exact[pruned.best.signature] <= 1.5 * full.best.total + 1e-12


def test_small_searches_stay_exhaustive():
    from sbpmpi.ops import inference

    call = signature_search_cases()[SMALL_SEARCH]()
    inference.clear_cache()
    inf = inference.infer(call)
    assert not inf.estimated and "large search" not in str(inf)
