"""sm.amp.GradScaler at n = 1..4: an inf in one rank's gradient makes every rank skip the
step and halve the scale; finite gradients grow the scale after growth_interval steps;
the unscaled gradients and the step equal NumPy's; the state round-trips through
sm.save_state / sm.load_state."""

from __future__ import annotations

import numpy as np
import pytest
from mpi4py import MPI

import sbpmpi as sm

comm = MPI.COMM_WORLD
rank, size = comm.Get_rank(), comm.Get_size()


def _model(sbp):
    pl = sm.placement("cpu", list(range(size)))
    w = sm.tensor(np.arange(10, dtype=np.float32).reshape(5, 2) / 8, placement=pl, sbp=sbp,
                  requires_grad=True)
    return pl, w


def _backward(scaler, w, x_val):
    pl = w.placement
    x = sm.tensor(x_val, placement=pl, sbp=sm.sbp.broadcast)
    loss = (w * x).sum()
    scaler.scale(loss).backward()


@pytest.mark.mpi(min_size=1)
@pytest.mark.parametrize("sbp", [sm.sbp.split(0), sm.sbp.broadcast], ids=["split", "bcast"])
def test_finite_steps_unscale_and_grow_after_the_interval(sbp):
    pl, w = _model(sbp)
    opt = sm.optim.SGD([w], lr=0.5)
    scaler = sm.amp.GradScaler(init_scale=8.0, growth_interval=3)
    x = np.full((5, 2), 0.25, np.float32)
    w0 = w.numpy()
    scales = []
    for _ in range(4):
        opt.zero_grad()
        _backward(scaler, w, x)
        scaler.unscale_(opt)
        np.testing.assert_array_equal(w.grad.numpy(), x)  # the true gradient
        scaler.step(opt)
        scaler.update()
        scales.append(scaler.get_scale())
    assert scales == [8.0, 8.0, 16.0, 16.0]
    np.testing.assert_allclose(w.numpy(), w0 - 4 * 0.5 * x)


@pytest.mark.mpi(min_size=1)
@pytest.mark.parametrize("sbp", [sm.sbp.split(0), sm.sbp.broadcast], ids=["split", "bcast"])
@pytest.mark.parametrize("bad", [np.inf, np.nan], ids=["inf", "nan"])
def test_a_nonfinite_gradient_on_one_rank_skips_the_step_everywhere(sbp, bad):
    pl, w = _model(sbp)
    opt = sm.optim.SGD([w], lr=0.5)
    scaler = sm.amp.GradScaler(init_scale=1024.0, growth_interval=1)
    x = np.full((5, 2), 0.25, np.float32)
    w0 = w.numpy()
    opt.zero_grad()
    _backward(scaler, w, x)
    # poison the last rank's shard only (its own rows of a split gradient, or its copy of
    # a broadcast one): the other ranks see finite gradients
    if rank == size - 1 and w.grad.to_local().size:
        local = w.grad.to_local().copy()
        local.reshape(-1)[0] = bad
        w.grad._set_data(local)
    assert scaler.step(opt) is None  # skipped on every rank
    scaler.update()
    assert scaler.get_scale() == 512.0  # halved on every rank
    np.testing.assert_array_equal(w.numpy(), w0)  # untouched
    assert comm.allgather(scaler.get_scale()) == [512.0] * size
    # the next, finite, step is taken and grows the scale (growth_interval=1)
    opt.zero_grad()
    _backward(scaler, w, x)
    scaler.step(opt)
    scaler.update()
    assert scaler.get_scale() == 1024.0
    np.testing.assert_allclose(w.numpy(), w0 - 0.5 * x)


@pytest.mark.mpi(min_size=1)
def test_the_inf_check_is_one_small_all_reduce():
    pl, w = _model(sm.sbp.split(0))
    opt = sm.optim.SGD([w], lr=0.5)
    scaler = sm.amp.GradScaler()
    _backward(scaler, w, np.ones((5, 2), np.float32))
    with sm.trace() as t:
        scaler.unscale_(opt)
    assert t.ops() == ["all_reduce"] and t.nbytes() == 8


@pytest.mark.mpi(min_size=1)
def test_state_round_trips_through_a_checkpoint(shared_dir):
    scaler = sm.amp.GradScaler(init_scale=256.0, growth_factor=4.0, backoff_factor=0.25,
                               growth_interval=7)
    pl, w = _model(sm.sbp.split(0))
    opt = sm.optim.SGD([w], lr=0.1)
    for _ in range(3):  # the growth tracker moves to 3
        opt.zero_grad()
        _backward(scaler, w, np.ones((5, 2), np.float32))
        scaler.step(opt)
        scaler.update()
    sm.save_state(scaler.state_dict(), f"{shared_dir}/scaler")
    other = sm.amp.GradScaler()
    other.load_state_dict(sm.load_state(f"{shared_dir}/scaler"))
    assert other.get_scale() == 256.0
    assert {k: float(v.numpy()) for k, v in other.state_dict().items()} == {
        "scale": 256.0, "growth_factor": 4.0, "backoff_factor": 0.25, "growth_interval": 7.0,
        "_growth_tracker": 3.0}


def test_disabled_is_a_pass_through_and_bad_arguments():
    s = sm.amp.GradScaler(enabled=False)
    assert s.get_scale() == 1.0 and s.state_dict() == {} and not s.is_enabled()
    for kw, err in [({"init_scale": 0}, ValueError), ({"growth_factor": 1.0}, ValueError),
                    ({"backoff_factor": 1.5}, ValueError), ({"growth_interval": 0}, ValueError),
                    ({"enabled": "yes"}, TypeError)]:
        with pytest.raises(err, match="GradScaler"):
            sm.amp.GradScaler(**kw)


@pytest.mark.mpi(min_size=1)
@pytest.mark.parametrize("dt", [np.float16, sm.bfloat16], ids=["float16", "bfloat16"])
def test_a_half_width_loss_is_scaled_in_float32(dt):
    """As torch (``outputs * scale``, its scale a 0-d float32 tensor): a float16 loss of
    2.0 times the default 2**16 is 131072 in float32, not float16's inf; the backward
    reaches the half-width loss and its parameters in their own dtype."""
    pl = sm.placement("cpu", list(range(size)))
    loss = sm.tensor(np.asarray(2.0, dtype=dt), placement=pl, sbp=sm.sbp.broadcast)
    scaled = sm.amp.GradScaler().scale(loss)
    assert scaled.dtype == np.float32
    assert scaled.numpy() == np.float32(2.0 * 2**16)
    # the backward: w of 7 elements split unevenly, loss = sum(w * w) in dt
    w_val = np.arange(7, dtype=np.float32).astype(dt)
    w = sm.tensor(w_val, placement=pl, sbp=sm.sbp.split(0), requires_grad=True)
    scaler = sm.amp.GradScaler(init_scale=1024.0)
    out = scaler.scale((w * w).sum())
    assert out.dtype == np.float32
    out.backward()
    assert w.grad.dtype == np.dtype(dt)
    want = (1024.0 * 2 * w_val.astype(np.float64)).astype(dt)  # exact: small integers
    np.testing.assert_array_equal(w.grad.numpy(), want)


@pytest.mark.mpi(min_size=1)
def test_scaled_outputs_take_torchs_promotion_with_a_float32_scale():
    """float32 and float64 losses keep their dtype; an array of more dimensions keeps its
    half width (a 0-d float32 operand does not widen it in torch's promotion)."""
    pl = sm.placement("cpu", list(range(size)))
    scaler = sm.amp.GradScaler(init_scale=4.0)
    for dt in (np.float32, np.float64):
        loss = sm.tensor(np.asarray(1.5, dtype=dt), placement=pl, sbp=sm.sbp.broadcast)
        assert scaler.scale(loss).dtype == dt and scaler.scale(loss).numpy() == 6.0
    v = sm.tensor(np.arange(5, dtype=np.float16), placement=pl, sbp=sm.sbp.split(0))
    got = scaler.scale(v)
    assert got.dtype == np.float16
    np.testing.assert_array_equal(got.numpy(), np.arange(5, dtype=np.float16) * 4)
    a, b = scaler.scale([loss, v])
    assert a.dtype == np.float64 and b.dtype == np.float16
