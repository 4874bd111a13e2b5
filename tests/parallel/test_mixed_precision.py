"""sm.nn.MixedPrecision with DataParallel and sm.nn.shard at n = 1..4: float32 master
weights (and, under ZeRO, sharded masters and optimizer states), the forward in the low
dtype (matmul outputs), gradients of the masters in float32; the losses and weights equal
those of the unwrapped model run under sm.autocast by hand; checkpoints hold float32."""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest
from mpi4py import MPI

import sbpmpi as sm

S, B = sm.sbp.split, sm.sbp.broadcast
comm = MPI.COMM_WORLD
size = comm.Get_size()


def world():
    return sm.placement("cpu", list(range(size)))


class MLP(sm.nn.Module):
    def __init__(self):
        sm.manual_seed(5)
        self.l1 = sm.nn.Linear(7, 8, placement=world())
        self.ln = sm.nn.LayerNorm(8, placement=world())
        self.l2 = sm.nn.Linear(8, 3, placement=world())
        self.seen = []

    def forward(self, x):
        h = self.l1(x)
        self.seen.append(h.dtype)
        return self.l2(sm.nn.relu(self.ln(h)))


def _cast_params(model, dt):
    """FSDP's ``param_dtype`` by hand: every parameter of ``model`` replaced, for one
    forward, by its cast to ``dt`` (a tape op: the float32 masters get the gradients);
    returns the undo."""
    owners = dict(model.named_modules())
    saved = []
    for name, p in list(model.named_parameters()):
        path, _, attr = name.rpartition(".")
        saved.append((owners[path], attr, p))
        setattr(owners[path], attr, p.astype(dt))
    return lambda: [setattr(m, a, p) for m, a, p in saved]


def _steps(model, opt, n=3, by_hand=None, cast_params=False):
    losses = []
    for s in range(n):
        rng = np.random.default_rng(s)
        x = sm.tensor(rng.standard_normal((11, 7)).astype(np.float32), placement=world(),
                      sbp=S(0))
        y = rng.integers(0, 3, 11)
        opt.zero_grad()
        if by_hand is not None:
            undo = _cast_params(model, by_hand) if cast_params else lambda: None
            with sm.autocast(dtype=by_hand):
                out = model(x)
            undo()
        else:
            out = model(x)
        loss = sm.nn.cross_entropy(out.astype(np.float32), y)
        loss.backward()
        opt.step()
        losses.append(float(loss.numpy()))
    return losses


@pytest.mark.mpi(min_size=1)
@pytest.mark.parametrize("dt", [sm.bfloat16, sm.float16], ids=["bfloat16", "float16"])
@pytest.mark.parametrize("wrap", ["dp", "zero1", "zero2", "zero3"])
def test_masters_stay_float32_and_the_forward_runs_low(dt, wrap, shared_dir):
    ref = MLP()
    ref_opt = sm.optim.Adam(ref.parameters(), lr=0.01)
    # ZeRO 3 gathers every parameter in the low dtype (layer norms' too), as FSDP2
    want = _steps(ref, ref_opt, by_hand=dt, cast_params=wrap == "zero3")
    net = MLP()
    opt = sm.optim.Adam(net.parameters(), lr=0.01)
    mp = sm.nn.MixedPrecision(param_dtype=dt, output_dtype=np.float32)
    if wrap == "dp":
        model = sm.nn.DataParallel(net, mixed_precision=mp)
    else:
        model, opt = sm.nn.shard(net, opt, stage=int(wrap[-1]), mixed_precision=mp)
    got = _steps(model, opt)
    assert net.seen and all(d == dt for d in net.seen)  # compute in the low dtype
    assert all(p.dtype == np.float32 for p in model.parameters())  # masters
    # ZeRO reduce-scatters the float32 gradients where the reference all-reduces them: sums
    # in another order, a last-bit difference in a master. Under ZeRO 3 every parameter is
    # rounded to the half width at the next gather (layer norms' too), where such a
    # difference may flip one rounding: a relative change of at most half the dtype's
    # epsilon in that parameter (seen: 1.5e-5 in float16's third loss at n = 4)
    rtol = float(ml_dtypes.finfo(dt).eps) / 2 if wrap == "zero3" else 1e-6
    np.testing.assert_allclose(got, want, rtol=rtol)
    if wrap == "zero3":
        assert all(p.sbp == (S(0),) for p in model.parameters())  # sharded masters
    sm.save_state(dict(model.named_parameters()), f"{shared_dir}/mp")
    back = sm.load_state(f"{shared_dir}/mp")
    assert all(v.dtype == np.float32 for v in back.values())


def test_policy_arguments():
    mp = sm.nn.MixedPrecision()
    assert mp.param_dtype == sm.bfloat16 and mp.reduce_dtype == sm.float32
    assert mp.output_dtype is None
    with pytest.raises(ValueError, match="param_dtype must be one of"):
        sm.nn.MixedPrecision(param_dtype=np.int32)
    for rd in (sm.bfloat16, sm.float16):  # DataParallel reduces in half width
        assert sm.nn.MixedPrecision(reduce_dtype=rd).reduce_dtype == rd
    with pytest.raises(ValueError, match="reduce_dtype must be one of"):
        sm.nn.MixedPrecision(reduce_dtype=np.float64)
    net = MLP()
    with pytest.raises(ValueError, match="reduce_dtype must be sm.float32 .*got bfloat16"):
        sm.nn.shard(net, sm.optim.Adam(net.parameters()), stage=2,
                    mixed_precision=sm.nn.MixedPrecision(reduce_dtype=sm.bfloat16))
    with pytest.raises(TypeError, match="mixed_precision must be"):
        sm.nn.DataParallel(MLP(), mixed_precision="bf16")


@pytest.mark.mpi(min_size=1)
@pytest.mark.parametrize("bucketed", [True, False], ids=["flat", "per-parameter"])
def test_zero3_gathers_the_parameters_in_param_dtype(bucketed):
    """Under ZeRO 3 a half param_dtype gathers half-width parameters: the same gathers
    as float32's, in the half dtype, half the bytes; the masters stay float32 shards."""
    gathers = {}
    for dt in (sm.float32, sm.bfloat16):
        net = MLP()
        model, opt = sm.nn.shard(net, sm.optim.Adam(net.parameters(), lr=0.01), stage=3,
                                 bucketed=bucketed,
                                 mixed_precision=sm.nn.MixedPrecision(param_dtype=dt))
        _steps(model, opt, n=1)
        x = sm.tensor(np.ones((11, 7), np.float32), placement=world(), sbp=S(0))
        with sm.trace() as t:
            model(x)
        gathers[dt] = [(r.op, r.nbytes, r.dtype) for r in t if r.op.startswith("all_gather")]
        assert all(p.dtype == np.float32 and p.sbp == (S(0),) for p in model.parameters())
    full, half = gathers[sm.float32], gathers[sm.bfloat16]
    assert len(full) == len(half) == (0 if size == 1 else 3 if bucketed else 6)
    assert all(d == "float32" for _, _, d in full) and all(d == "bfloat16" for _, _, d in half)
    assert [(op, n // 2) for op, n, _ in full] == [(op, n) for op, n, _ in half]
