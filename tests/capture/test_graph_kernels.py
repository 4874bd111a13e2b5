"""The composite kernels in a captured step: GELU (both forms), layer norm, softmax and
log_softmax, cross-entropy with ignored rows (classes whole, and split: the vocab-parallel
loss), embedding with a row-split table, forward and backward, and ``sm.tensor`` of the
step's host arrays with a dtype cast. A replay writes each into its planned buffer with
temporaries the plan keeps; over calls with new data it must give the eager step's losses
and parameters bit for bit, and the first loss must be NumPy's on the whole arrays."""

from __future__ import annotations

import math

import numpy as np
import pytest
from mpi4py import MPI

import sbpmpi as sm

S, B = sm.sbp.split, sm.sbp.broadcast
size = MPI.COMM_WORLD.Get_size()
VOCAB, DIM, ROWS = 11, 6, 9  # uneven over 2, 3 and 4 ranks
IGNORE = -100


def make(vocab_split: bool, approximate: str):
    pl = sm.placement("cpu", list(range(size)))
    sm.manual_seed(3)
    rows = (S(0),) if vocab_split else (B,)
    table = sm.randn(VOCAB, DIM, placement=pl, sbp=rows, dtype=np.float64, requires_grad=True)
    head = sm.randn(DIM, VOCAB, placement=pl, sbp=(S(1),) if vocab_split else (B,),
                    dtype=np.float64, requires_grad=True)
    opt = sm.optim.SGD([table, head], lr=0.1)

    def step(ids_host, labels_host):
        opt.zero_grad()
        ids = sm.tensor(ids_host, placement=pl, sbp=(S(0),), dtype=np.int64)
        labels = sm.tensor(labels_host, placement=pl, sbp=(S(0),), dtype=np.int64)
        h = sm.nn.layer_norm(sm.nn.gelu(sm.nn.embedding(ids, table), approximate))
        logits = sm.matmul(h, head)
        extra = (sm.nn.softmax(h, -1) * sm.nn.log_softmax(h, -1)).sum()
        loss = sm.nn.cross_entropy(logits, labels, ignore_index=IGNORE) + 0.25 * extra
        loss.backward()
        opt.step()
        return loss
    return step, table, head


def batches(n: int):
    rng = np.random.default_rng(7)
    out = []
    for _ in range(n):
        ids = rng.integers(0, VOCAB, ROWS).astype(np.int32)  # cast by sm.tensor
        labels = rng.integers(0, VOCAB, ROWS).astype(np.int32)
        labels[rng.random(ROWS) < 0.3] = IGNORE
        out.append((ids, labels))
    return out


def _gelu(x, approximate):
    if approximate == "tanh":
        return 0.5 * x * (1 + np.tanh(math.sqrt(2 / math.pi) * (x + 0.044715 * x ** 3)))
    erf = np.vectorize(math.erf)
    return 0.5 * x * (1 + erf(x / math.sqrt(2)))


def reference_loss(table, head, ids, labels, approximate):
    e = _gelu(table[ids], approximate)
    h = (e - e.mean(-1, keepdims=True)) / np.sqrt(e.var(-1, keepdims=True) + 1e-5)
    logits = h @ head
    z = logits - logits.max(1, keepdims=True)
    logp = z - np.log(np.exp(z).sum(1, keepdims=True))
    keep = labels != IGNORE
    ce = -logp[np.arange(ROWS)[keep], labels[keep]].sum() / max(int(keep.sum()), 1)
    hz = h - h.max(-1, keepdims=True)
    p = np.exp(hz) / np.exp(hz).sum(-1, keepdims=True)
    lp = hz - np.log(np.exp(hz).sum(-1, keepdims=True))
    return ce + 0.25 * (p * lp).sum()


@pytest.mark.mpi(min_size=1)
@pytest.mark.parametrize("approximate", ["none", "tanh"])
@pytest.mark.parametrize("vocab_split", [False, True], ids=["classes-whole", "vocab-split"])
def test_composite_kernels_replay_bit_identical_to_eager(vocab_split, approximate):
    data = batches(6)
    step, table, head = make(vocab_split, approximate)
    t0, h0 = table.numpy(), head.numpy()
    want = [step(i, y).numpy() for i, y in data]
    want_params = (table.numpy(), head.numpy())
    np.testing.assert_allclose(want[0], reference_loss(t0, h0, data[0][0], data[0][1],
                                                       approximate), rtol=1e-12)

    step, table, head = make(vocab_split, approximate)
    f = sm.graph(step)
    got = [f(i, y).numpy() for i, y in data]
    assert f.explain().signatures[0][1].startswith("replayed 4 time(s)")
    assert np.array_equal(np.array(got), np.array(want)), np.array(got) - np.array(want)
    assert np.array_equal(table.numpy(), want_params[0])
    assert np.array_equal(head.numpy(), want_params[1])
    (plan,) = f._plans.values()
    assert plan.scratch.nbytes > 0  # the temporaries were kept for the next replay
