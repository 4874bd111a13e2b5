"""Non-finite values with partial inputs, and NaN in max/min.

A partial operand holds the reduction's identity on some ranks; combined with inf or NaN
that used to give NaN where NumPy gives inf, and MPI's MAX/MIN dropped NaN (differently
on different ranks). Every result is compared with NumPy on every rank, bit for bit
(NaN included), and must be the same on every rank.
"""

from __future__ import annotations

import numpy as np
import pytest
from mpi4py import MPI

import sbpmpi as sm
from sbpmpi import comm as smcomm

comm = MPI.COMM_WORLD
rank, size = comm.Get_rank(), comm.Get_size()
pytestmark = pytest.mark.filterwarnings("ignore::RuntimeWarning")  # inf * 0 and friends
P, PMAX, PMIN, B = sm.sbp.partial_sum, sm.sbp.partial_max, sm.sbp.partial_min, sm.sbp.broadcast


def placements():
    out = [sm.placement("cpu", list(range(size)))]
    if size > 2:
        out.append(sm.placement("cpu", list(range(size))[::-1]))
    if size == 4:
        out.append(sm.placement("cpu", [[0, 1], [2, 3]]))
    return out


def same_as_numpy(got: np.ndarray, want) -> None:
    """Equal to NumPy's result (NaN where NumPy has NaN), and equal on every rank."""
    want = np.asarray(want)
    np.testing.assert_array_equal(got, want)  # NaN == NaN here
    everyone = comm.allgather(np.asarray(got).tobytes())
    assert all(b == everyone[0] for b in everyone), "ranks got different values"


@pytest.mark.mpi(min_size=1)
def test_partial_sum_times_or_over_non_finite_broadcast_gives_numpys_inf():
    xv = np.array([1.0, -2.0, 0.0, 3.0])
    for pl in placements():
        x = sm.tensor(xv, placement=pl, sbp=(P,) * pl.ndim)
        for yv in (np.zeros(4), np.array([np.inf, -np.inf, np.inf, 1.0]),
                   np.array([np.nan, 1.0, 0.0, -np.inf])):
            y = sm.tensor(yv, placement=pl, sbp=(B,) * pl.ndim)
            same_as_numpy((x / y).numpy(), xv / yv)
            same_as_numpy((x * y).numpy(), xv * yv)
            same_as_numpy((y * x).numpy(), yv * xv)
        if size > 1:  # finite partners keep the cheap rows: no reduction before the op
            y = sm.tensor(np.arange(1.0, 5.0), placement=pl, sbp=(B,) * pl.ndim)
            assert (x * y).sbp == (P,) * pl.ndim and (x / y).sbp == (P,) * pl.ndim
            assert (x * 2.0).sbp == (P,) * pl.ndim
        for s in (np.inf, -np.inf, np.nan, 0.0, 2.0):
            same_as_numpy((x * s).numpy(), xv * s)
            same_as_numpy((x / s).numpy(), xv / s)


@pytest.mark.mpi(min_size=1)
def test_partial_max_min_plus_minus_infinity_gives_numpys_result():
    mv = np.array([1.0, 2.0, -3.0])
    for pl in placements():
        for kind in (PMAX, PMIN):
            m = sm.tensor(mv, placement=pl, sbp=(kind,) * pl.ndim)
            for s in (np.inf, -np.inf, np.nan, 1.5):
                same_as_numpy((m + s).numpy(), mv + s)
                same_as_numpy((s + m).numpy(), s + mv)
                same_as_numpy((m - s).numpy(), mv - s)
                same_as_numpy((s - m).numpy(), s - mv)
            bv = np.array([np.inf, -np.inf, 0.0])
            b = sm.tensor(bv, placement=pl, sbp=(B,) * pl.ndim)
            same_as_numpy((m + b).numpy(), mv + bv)
            same_as_numpy((b - m).numpy(), bv - mv)


@pytest.mark.mpi(min_size=1)
def test_matmul_of_partial_and_an_infinite_weight_gives_inf():
    xv = np.array([[1.0, -2.0], [0.5, 3.0]])
    wv = np.array([[np.inf, 1.0], [1.0, 2.0]])
    for pl in placements():
        x = sm.tensor(xv, placement=pl, sbp=(P,) * pl.ndim)
        w = sm.tensor(wv, placement=pl, sbp=(B,) * pl.ndim)
        same_as_numpy((x @ w).numpy(), xv @ wv)
        same_as_numpy((w @ x).numpy(), wv @ xv)
    # integer products keep the partial rows (0 * anything is exact)
    xi = sm.tensor(np.array([[1, 2]]), placement=placements()[0], sbp=P)
    wi = sm.tensor(np.array([[3], [4]]), placement=placements()[0], sbp=B)
    y = xi @ wi
    same_as_numpy(y.numpy(), np.array([[11]]))
    if size > 1:
        assert y.sbp == (P,)


@pytest.mark.mpi(min_size=1)
def test_max_min_of_split_data_with_nan_is_nan_on_every_rank():
    a = np.array([1.0, np.nan, 3.0, 2.0, 0.5])
    for pl in placements():
        for sbp in [(sm.sbp.split(0),) * pl.ndim, (PMAX,) * pl.ndim, (B,) * pl.ndim]:
            x = sm.tensor(a, placement=pl, sbp=sbp)
            if sbp[0] == PMAX:
                same_as_numpy(x.numpy(), a)  # the NaN survives the partial_max reduction
                same_as_numpy(x.to_global(sbp=(sm.sbp.split(0),) * pl.ndim).numpy(), a)
                continue
            same_as_numpy(x.max().numpy(), np.max(a))
            same_as_numpy(x.min().numpy(), np.min(a))
        m = sm.tensor(np.array([np.nan, -1.0, 2.0]), placement=pl, sbp=(PMIN,) * pl.ndim)
        same_as_numpy(m.numpy(), np.array([np.nan, -1.0, 2.0]))


@pytest.mark.mpi(min_size=1)
def test_shards_with_nan_on_some_ranks_only_reduce_to_nan_everywhere():
    # each rank holds its own shard: NaN on the last rank only, finite elsewhere
    pl = placements()[0]
    local = np.array([float(rank), -float(rank), np.nan if rank == size - 1 else 1.0])
    shards = comm.allgather(local)
    for kind, f in ((PMAX, np.max), (PMIN, np.min)):
        x = sm.to_global(local.copy(), placement=pl, sbp=kind)
        same_as_numpy(x.numpy(), f(np.stack(shards), axis=0))
    for op, f in ((smcomm.ReduceOp.MAX, np.max), (smcomm.ReduceOp.MIN, np.min)):
        buf = local.copy()
        smcomm.all_reduce(buf, op)
        same_as_numpy(buf, f(np.stack(shards), axis=0))
    m = sm.to_global(np.array([np.nan, 1.0]) if rank == 0 else np.array([2.0, 3.0]),
                     placement=pl, sbp=PMAX)
    same_as_numpy(m.max().numpy(), np.nan)
