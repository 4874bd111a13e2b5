"""sm.nn.checkpoint (activation recomputation) at n = 1..4: gradients bit-identical to the
run without it for policy full, selective and a callable, under several layouts, with
dropout (same masks, the random stream after backward unchanged), inside autocast, with
DataParallel's gradient buckets and under ZeRO stage 3; the tape keeps only the regions'
inputs (sbpmpi.tape.held_bytes)."""

from __future__ import annotations

import numpy as np
import pytest
from mpi4py import MPI

import sbpmpi as sm
from sbpmpi.core import random as smrandom
from sbpmpi.tape import held_bytes

S, B = sm.sbp.split, sm.sbp.broadcast
comm = MPI.COMM_WORLD
rank, size = comm.Get_rank(), comm.Get_size()
POLICIES = ["full", "selective", lambda name: name in ("gelu", "normalize")]
POLICY_IDS = ["full", "selective", "callable"]


def world():
    return sm.placement("cpu", list(range(size)))


class Block(sm.nn.Module):
    def __init__(self, d, tp=False, p=0.25, dtype=np.float64):
        pl = world()
        self.ln = sm.nn.LayerNorm(d, placement=pl, dtype=dtype)
        # tp: column- then row-parallel weights (a Megatron MLP), else broadcast
        self.fc = sm.nn.Linear(d, 2 * d, placement=pl, dtype=dtype,
                               sbp=S(1) if tp else None, bias_sbp=S(0) if tp else None)
        self.proj = sm.nn.Linear(2 * d, d, placement=pl, dtype=dtype,
                                 sbp=S(0) if tp else None)
        self.drop = sm.nn.Dropout(p)

    def forward(self, x):
        return x + self.proj(self.drop(sm.nn.gelu(self.fc(self.ln(x)))))


class Net(sm.nn.Module):
    def __init__(self, d=6, depth=3, tp=False, recompute=None, dtype=np.float64):
        sm.manual_seed(21)
        self.blocks = sm.nn.ModuleList([Block(d, tp, dtype=dtype) for _ in range(depth)])
        self.recompute = recompute

    def forward(self, x):
        for b in self.blocks:
            x = b(x) if self.recompute is None else sm.nn.checkpoint(b, x,
                                                                    policy=self.recompute)
        return x


def _run(net, x_val, sbp, autocast=None):
    x = sm.tensor(x_val, placement=world(), sbp=sbp, requires_grad=True)
    for p in net.parameters():
        p.grad = None
    sm.manual_seed(99)
    if autocast is not None:
        with sm.autocast(dtype=autocast):
            y = net(x)
            loss = (y.astype(np.float32) ** 2).sum()
    else:
        y = net(x)
        loss = (y * y).sum()
    held = held_bytes(loss)
    loss.backward()
    return (float(loss.numpy()), [p.grad.numpy() for p in net.parameters()], x.grad.numpy(),
            smrandom.get_state(), held)


def _same(a, b):
    assert a[0] == b[0]
    for g, h in zip(a[1], b[1]):
        np.testing.assert_array_equal(g, h)
    np.testing.assert_array_equal(a[2], b[2])
    assert a[3] == b[3]  # the random stream stands where it would without recomputation


X = np.random.default_rng(0).standard_normal((9, 6))


@pytest.mark.mpi(min_size=1)
@pytest.mark.parametrize("policy", POLICIES, ids=POLICY_IDS)
@pytest.mark.parametrize("tp, sbp", [(False, S(0)), (False, B), (True, B)],
                         ids=["data-split", "broadcast", "tensor-parallel"])
def test_gradients_are_bit_identical(policy, tp, sbp):
    base = _run(Net(tp=tp), X, sbp)
    got = _run(Net(tp=tp, recompute=policy), X, sbp)
    _same(base, got)
    if policy == "full":
        # the tape keeps the regions' inputs only: the first is a leaf (not counted), so
        # depth - 1 block inputs, each at most one shard of X
        assert got[4] <= (3 - 1) * X.nbytes < base[4]
    else:
        assert got[4] < base[4]


@pytest.mark.mpi(min_size=1)
@pytest.mark.parametrize("dt", [sm.bfloat16, sm.float16], ids=["bfloat16", "float16"])
def test_inside_autocast(dt):
    base = _run(Net(dtype=np.float32), X.astype(np.float32), S(0), autocast=dt)
    got = _run(Net(dtype=np.float32, recompute="full"), X.astype(np.float32), S(0),
               autocast=dt)
    _same(base, got)


@pytest.mark.mpi(min_size=1)
def test_the_rerun_uses_the_forwards_autocast_state():
    # the forward under autocast, backward outside it: the rerun must cast as the forward
    net, ref = Net(dtype=np.float32, recompute="full"), Net(dtype=np.float32)
    out = []
    for m in (ref, net):
        x = sm.tensor(X.astype(np.float32), placement=world(), sbp=S(0), requires_grad=True)
        sm.manual_seed(99)
        with sm.autocast():
            loss = (m(x).astype(np.float32) ** 2).sum()
        loss.backward()  # outside the block
        out.append(x.grad.numpy())
    np.testing.assert_array_equal(out[0], out[1])


def _three_steps(model, opt) -> list[float]:
    """Three SGD/Adam steps on seeded inputs; the losses."""
    losses = []
    for s in range(3):
        opt.zero_grad()
        sm.manual_seed(s)
        x = sm.tensor(X + s, placement=world(), sbp=S(0))
        loss = (model(x) ** 2).sum()
        loss.backward()
        opt.step()
        losses.append(float(loss.numpy()))
    return losses


@pytest.mark.mpi(min_size=1)
@pytest.mark.parametrize("policy", ["full", "selective"])
def test_with_data_parallel_buckets(policy):
    res = []
    for rc in (None, policy):
        model = sm.nn.DataParallel(Net(recompute=rc), bucket_cap_mb=0.0001,
                                   first_bucket_mb=0.0001)
        opt = sm.optim.SGD(model.parameters(), lr=0.1)
        losses = _three_steps(model, opt)
        res.append((losses, [p.numpy() for p in model.parameters()]))
    assert res[0][0] == res[1][0]
    for p, q in zip(res[0][1], res[1][1]):
        np.testing.assert_array_equal(p, q)


@pytest.mark.mpi(min_size=1)
def test_under_zero_stage_3():
    res = []
    for rc in (None, "full"):
        net = Net(recompute=rc)
        opt = sm.optim.Adam(net.parameters(), lr=0.01)
        model, opt = sm.nn.shard(net, opt, stage=3)
        losses = _three_steps(model, opt)
        res.append(losses)
    assert res[0] == res[1]


def test_bad_policy():
    with pytest.raises(ValueError, match="policy must be"):
        sm.nn.checkpoint(lambda x: x, 1.0, policy="some")
    with pytest.raises(TypeError, match="fn must be callable"):
        sm.nn.checkpoint(3, 1.0)


@pytest.mark.mpi(min_size=1)
def test_held_bytes_counts_arrays_over_pooled_memory():
    """A conversion's result of 1 MiB or more lives over a block of the host pool
    (``backend.empty``) whose base is the pool's lease, no array: the tape's bytes still
    count it, as its ``nbytes`` (here a broadcast tensor's rows, copied out of the whole
    shard so that the result owns its memory)."""
    from sbpmpi.backend.host_pool import MIN_POOLED_BYTES
    rows, cols = 4 * size, MIN_POOLED_BYTES // (4 * 8) + 8  # 4 rows a rank: over 1 MiB
    xv = np.arange(rows * cols, dtype=np.float64).reshape(rows, cols) % 7
    x = sm.tensor(xv, placement=world(), sbp=B, requires_grad=True)
    y = x.to_global(sbp=S(0))  # this rank's rows, copied out of the whole shard
    if size > 1:
        assert not isinstance(y.to_local().base, np.ndarray)  # the pool's lease
    loss = (y * y).sum()
    held = held_bytes(loss)
    assert held >= y.to_local().nbytes, held  # at least y's shard, saved for backward
    loss.backward()
    np.testing.assert_array_equal(x.grad.numpy(), 2 * xv)
