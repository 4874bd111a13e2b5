"""Gradient buckets reduced in half width (``sm.nn.MixedPrecision(reduce_dtype=...)`` under
``sm.nn.DataParallel``) at n = 1..4 with an uneven batch split: the float32 masters'
gradients equal a NumPy reference computed the same way (each rank's part cast to the half
dtype, summed in float32, the sum cast to the half dtype), the reduction hands MPI half
the bytes of float32's, and an inf (or a float16 overflow) on one rank makes every rank's
GradScaler skip the step."""

from __future__ import annotations

import ml_dtypes  # noqa: F401 - NumPy's bfloat16
import numpy as np
import pytest
from mpi4py import MPI

import sbpmpi as sm

S, B = sm.sbp.split, sm.sbp.broadcast
comm = MPI.COMM_WORLD
rank, size = comm.Get_rank(), comm.Get_size()
D_IN, D_OUT, BATCH = 6, 4, 11  # 11 rows: an uneven split at 2, 3 and 4 ranks
HALVES = [sm.bfloat16, sm.float16]


def world() -> sm.Placement:
    return sm.placement("cpu", list(range(size)))


def linear(reduce_dtype, param_dtype=np.float32) -> tuple[sm.nn.Module, sm.nn.DataParallel]:
    sm.manual_seed(1)
    net = sm.nn.Linear(D_IN, D_OUT, placement=world(), dtype=np.float32)
    mp = sm.nn.MixedPrecision(param_dtype=param_dtype, reduce_dtype=reduce_dtype)
    return net, sm.nn.DataParallel(net, mixed_precision=mp)


def integer_batch(seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """x (BATCH, D_IN) and the loss's weights c (BATCH, D_OUT): integers, so every rank's
    float32 gradient part is exact and only the half-width casts round."""
    rng = np.random.default_rng(seed)
    return (rng.integers(-40, 41, (BATCH, D_IN)).astype(np.float32),
            rng.integers(-40, 41, (BATCH, D_OUT)).astype(np.float32))


def loss_of(model, x: np.ndarray, c: np.ndarray) -> sm.GlobalTensor:
    """sum(model(x) * c): the weight's gradient is x.T @ c, the bias's c summed."""
    xt = sm.tensor(x, placement=world(), sbp=S(0))
    ct = sm.tensor(c, placement=world(), sbp=S(0))
    return (model(xt) * ct).sum()


def row_ranges(x: np.ndarray) -> list[tuple[int, int]]:
    """Each rank's rows of ``x`` split on dim 0 (from the ranks' own shards)."""
    n = sm.tensor(x, placement=world(), sbp=S(0)).to_local().shape[0]
    counts = comm.allgather(n)
    starts = np.cumsum([0] + counts)
    return [(int(starts[r]), int(starts[r + 1])) for r in range(size)]


def half_reduced(parts: list[np.ndarray], dt) -> np.ndarray:
    """The reference: each part cast to ``dt``, summed in float32, the sum cast to ``dt``."""
    acc = np.zeros_like(parts[0], dtype=np.float32)
    for p in parts:
        acc += p.astype(dt).astype(np.float32)
    return acc.astype(dt).astype(np.float32)


@pytest.mark.mpi(min_size=1)
@pytest.mark.parametrize("dt", HALVES, ids=["bfloat16", "float16"])
def test_half_reduced_gradients_equal_the_numpy_reference(dt):
    x, c = integer_batch()
    net, dp = linear(dt)
    loss_of(dp, x, c).backward()
    ranges = row_ranges(x)
    w_parts = [x[lo:hi].T @ c[lo:hi] for lo, hi in ranges]  # weight (in, out)
    b_parts = [c[lo:hi].sum(0) for lo, hi in ranges]
    want_w, want_b = half_reduced(w_parts, dt), half_reduced(b_parts, dt)
    assert not np.array_equal(want_w, x.T @ c)  # the casts round: the test can tell
    assert net.weight.grad.dtype == np.float32 and net.bias.grad.dtype == np.float32
    np.testing.assert_array_equal(net.weight.grad.numpy(), want_w)
    np.testing.assert_array_equal(net.bias.grad.numpy(), want_b)


@pytest.mark.mpi(min_size=1)
def test_float32_reduce_dtype_keeps_the_exact_sums():
    x, c = integer_batch()
    net, dp = linear(sm.float32)
    loss_of(dp, x, c).backward()
    np.testing.assert_array_equal(net.weight.grad.numpy(), x.T @ c)
    np.testing.assert_array_equal(net.bias.grad.numpy(), c.sum(0))


def traced_step(reduce_dtype, param_dtype) -> sm.comm.trace.Trace:
    x, c = integer_batch(1)
    _, dp = linear(reduce_dtype, param_dtype)
    loss_of(dp, x, c).backward()  # the first step agrees on the buckets' layouts
    dp.zero_grad()
    with sm.trace() as t:
        loss_of(dp, x, c).backward()
    return t


@pytest.mark.mpi(min_size=1)
@pytest.mark.parametrize("dt", HALVES, ids=["bfloat16", "float16"])
def test_half_reduction_hands_mpi_half_the_bytes(dt):
    full = traced_step(sm.float32, dt)
    half = traced_step(dt, dt)
    # float32: one non-blocking all-reduce of the bucket; half: its all-to-all and
    # all-gather in the half dtype, nothing else
    grads = D_OUT * D_IN + D_OUT
    if size == 1:
        assert full.nbytes() == half.nbytes() == 0
        return
    assert [(r.op, r.nbytes, r.dtype, r.nonblocking) for r in full] == [
        ("all_reduce", 4 * grads, "float32", True)]
    name = np.dtype(dt).name
    assert {(r.op, r.dtype) for r in half} == {("all_to_all_v", name), ("all_gather_v", name)}
    assert half.nbytes() == 2 * grads == full.nbytes() // 2


@pytest.mark.mpi(min_size=1)
@pytest.mark.parametrize("bad", [np.inf, 1e6], ids=["inf", "overflows-float16"])
def test_an_inf_on_one_rank_skips_the_step_on_every_rank(bad):
    """Rank 0's rows hold ``bad``: its gradient part is inf, or finite in float32 but past
    float16's range; the float16 reduction hands every rank an inf, and every rank's
    GradScaler skips the step and halves the scale."""
    x, c = integer_batch()
    x[0, 0] = bad  # row 0 is rank 0's
    net, dp = linear(sm.float16, sm.float16)
    opt = sm.optim.SGD(net.parameters(), lr=0.1)
    scaler = sm.amp.GradScaler(init_scale=2.0**4)
    before = [p.numpy().copy() for p in net.parameters()]
    scaler.scale(loss_of(dp, x, c)).backward()
    assert not np.isfinite(net.weight.grad.numpy()).all()  # on every rank
    scaler.step(opt)
    scaler.update()
    assert scaler.get_scale() == 8.0
    for p, b in zip(net.parameters(), before):
        np.testing.assert_array_equal(p.numpy(), b)
    x, c = integer_batch()  # finite and small: the step is taken
    opt.zero_grad()
    scaler.scale(loss_of(dp, x / 64, c / 64)).backward()
    scaler.step(opt)
    scaler.update()
    assert scaler.get_scale() == 8.0
    assert not np.array_equal(net.weight.numpy(), before[0])


def test_policy_reduce_dtype_is_a_half_or_float32():
    assert sm.nn.MixedPrecision(reduce_dtype=sm.float16).reduce_dtype == sm.float16
    with pytest.raises(ValueError, match="reduce_dtype must be one of"):
        sm.nn.MixedPrecision(reduce_dtype=np.int32)
