"""A replay of a captured step in the steady state allocates nothing but the returned
loss's array, measured with a NumPy memory handler that sees every data allocation
(:mod:`numpy_allocations`) and cross-checked with ``tracemalloc``'s NumPy domain; it
makes exactly the eager step's collectives (``sm.trace``; the MLP's:
test_graph_capture.py); a returned loss the caller keeps does not change at the next
call, while ``.grad`` is overwritten in place (the documented rule, docs/graph.md)."""

from __future__ import annotations

import math
import sys
import tracemalloc
from collections import Counter
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from mpi4py import MPI
from numpy_allocations import counting, handler_works
from test_graph_capture import _inputs, make

import sbpmpi as sm
from sbpmpi.capture.recorder import Call, HostCall
from sbpmpi.capture.replay import Fresh, _output_slots

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "examples"))
import train_gpt  # noqa: E402
from test_graph_gpt import SMALL, fitting_layouts, step_of  # noqa: E402

size = MPI.COMM_WORLD.Get_size()

def _plan(f: Any) -> Any:
    (plan,) = f._plans.values()
    return plan


def replay_allocations(f: Any, *args: Any) -> tuple[Counter, Counter, int, Any]:
    """One call of ``f`` (a replay): bytes allocated per node label (the nodes making a
    returned tensor labelled ``output ...``), bytes allocated outside every node, and the
    result. The nodes' functions are wrapped for the call and restored after."""
    plan = _plan(f)
    outs = _output_slots(plan.output)
    per: Counter = Counter()
    counts: Counter = Counter()
    wrapped: list[tuple[Any, str, Any]] = []
    log: list[int] = []

    def wrap(obj: Any, attr: str, label: str) -> None:
        fn = getattr(obj, attr)
        if fn is None:
            return

        def counted(*a: Any) -> Any:
            with counting() as sizes:
                r = fn(*a)
            per[label] += sum(sizes)
            counts[label] += len(sizes)
            log.extend(sizes)  # the outer count sees none of them
            return r
        wrapped.append((obj, attr, fn))
        setattr(obj, attr, counted)

    for n in plan.nodes:
        if isinstance(n, Call):
            label = ("output " if n.out in outs else "") + f"{n.kind} {n.name}"
            wrap(n, "fn", label)
            wrap(n, "into", label)
        elif isinstance(n, HostCall):
            wrap(n, "fn", f"host call {getattr(n.fn, '__qualname__', n.fn)}")
    try:
        with counting() as outside:
            out = f(*args)
    finally:
        for obj, attr, fn in wrapped:
            setattr(obj, attr, fn)
    return per, counts, sum(outside), out


def _loss_bytes(out: Any) -> int:
    return int(out.to_local().nbytes)


def _outside_bytes(f: Any) -> int:
    """What a replay may allocate outside its nodes: the new arrays of the returned
    tensors it writes into (the caller may keep them), nothing more (checked mode's one
    agreement per replay exchanges its fingerprints in a buffer made once)."""
    return sum(math.prod(b.shape) * b.dtype.itemsize for b in _plan(f).buffers
               if isinstance(b, Fresh))


@pytest.fixture(autouse=True)
def _handler() -> None:
    if not handler_works():
        pytest.skip("NumPy's memory handler API (NEP 49) is not reachable here")


@pytest.mark.mpi(min_size=1)
@pytest.mark.parametrize("optim", ["sgd", "adam"])
@pytest.mark.parametrize("kind", ["dp", "tp"])
def test_mlp_replay_allocates_only_the_known_kernels_and_the_returned_loss(kind, optim):
    lay, model, step = make(kind, optim)
    f = sm.graph(step)
    x, y = _inputs(lay, 64)
    for _ in range(5):  # two captures, three replays: the buffers planned and in use
        f(x, y)
    per, counts, outside, out = replay_allocations(f, x, y)
    # outside the nodes (the replay loop, checked mode's agreement, .grad, the
    # optimizer's update): the returned loss's new array of its own size (the node
    # making it writes into it), nothing more; inside them, nothing
    assert _outside_bytes(f) == _loss_bytes(out)
    assert outside == _outside_bytes(f), (outside, per)
    assert not {k: v for k, v in per.items() if v}, per

    # tracemalloc's NumPy domain agrees: after a replay, the only NumPy memory it left
    # alive that was not there before is the returned loss (the previous one is dropped)
    domain = tracemalloc.DomainFilter(True, np.lib.tracemalloc_domain)
    del out
    tracemalloc.start()
    try:
        before = tracemalloc.take_snapshot().filter_traces([domain])
        out = f(x, y)
        after = tracemalloc.take_snapshot().filter_traces([domain])
    finally:
        tracemalloc.stop()
    grown = sum(s.size_diff for s in after.compare_to(before, "filename"))
    assert grown == _loss_bytes(out), grown


@pytest.mark.mpi(min_size=1)
def test_eager_step_allocates_and_the_replay_does_not_recreate_its_buffers():
    """The eager step's allocations (the reference the docs' numbers compare with) are
    many more than a replay's; a replay's buffers are the same arrays call after call."""
    lay, model, step = make("dp", "adam")
    x, y = _inputs(lay, 64)
    step(x, y)
    with counting() as eager:
        step(x, y)
    f = sm.graph(step)
    for _ in range(4):
        f(x, y)
    with counting() as replay:
        f(x, y)
    plan = _plan(f)
    bufs = [id(b) for b in plan.buffers if b is not None]
    f(x, y)
    assert bufs == [id(b) for b in plan.buffers if b is not None]
    assert len(bufs) > 0
    # what is left is the returned loss
    assert replay == [_loss_bytes(f(x, y))], replay
    assert len(eager) > 50, eager


@pytest.mark.mpi(min_size=1)
@pytest.mark.parametrize("kind", ["dp", "tp"])
def test_a_kept_loss_stays_and_grads_are_overwritten_in_place(kind):
    lay, model, step = make(kind, "sgd")
    f = sm.graph(step)
    x, y = _inputs(lay, 16)
    for _ in range(4):
        f(x, y)
    loss_k = f(x, y)
    kept = loss_k.numpy().copy()
    g_k = model.fc1.weight.grad
    loss_k1 = f(x, y)
    assert np.array_equal(loss_k.numpy(), kept)  # the loss of step k as it was
    assert loss_k1.to_local() is not loss_k.to_local()
    # .grad is the planned buffer, overwritten in place by the next replay (as the
    # parameters are): the tensor of step k holds step k + 1's gradient
    assert g_k.to_local() is model.fc1.weight.grad.to_local()


@pytest.mark.mpi(min_size=1)
@pytest.mark.parametrize("layout", ["dp", "tp", "sp", "2d"])
def test_gpt_replay_allocates_nothing_but_the_loss(layout):
    """The GPT of examples/train_gpt.py in each layout (dp and 2d with gradient buckets):
    every kernel (the composite ones: GELU, layer norm, softmax, cross-entropy and the
    vocab-split loss, embedding, forward and backward), every conversion, the host
    batch's shards, the gradient buckets' reductions (and the gradients that arrive
    already reduced: dp at 3 ranks, 2d at 2), checked mode's agreement and the AdamW
    update allocate nothing; the returned loss is one new array."""
    if layout not in fitting_layouts():
        pytest.skip(f"{layout} does not fit {size} ranks")
    args = train_gpt.parse(SMALL + ["--layout", layout])
    trainer = train_gpt.build(args, layout)
    data = train_gpt.load_corpus()
    f = sm.graph(step_of(trainer))
    for t in range(5):
        ids, targets = train_gpt.batch_at(data, t, args.batch, args.seq, args.seed)
        with sm.trace() as tr:
            f(ids, targets)
    replayed = [(r.op, r.nbytes, r.group_ranks, r.nonblocking) for r in tr.records]
    per, counts, outside, out = replay_allocations(f, ids, targets)
    assert outside == _outside_bytes(f), (outside, per)
    assert not {k: v for k, v in per.items() if v}, per
    # the same collectives as the eager step's
    eager_trainer = train_gpt.build(args, layout)
    step = step_of(eager_trainer)
    for t in range(5):
        ids, targets = train_gpt.batch_at(data, t, args.batch, args.seq, args.seed)
        with sm.trace() as tr:
            step(ids, targets)
    assert replayed == [(r.op, r.nbytes, r.group_ranks, r.nonblocking) for r in tr.records]


@pytest.mark.mpi(min_size=1)
@pytest.mark.parametrize("layout", ["dp", "tp"])
@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_gpt_half_width_replay(dtype, layout):
    """The example's half-width forward (float32 masters under ``sm.autocast``, dp's
    buckets reduced in the half width): the kernels that compute in float32 copy their
    operands into float32 temporaries the plan keeps and round once into their buffer,
    the buckets' half-width reduction and the half-width partial sums of conversions use
    arrays made once. float16: nothing but the loss. bfloat16: ml_dtypes' cast loops
    allocate a few bytes per call (two or four), nothing of an array's size."""
    args = train_gpt.parse(SMALL + ["--layout", layout, "--dtype", dtype])
    trainer = train_gpt.build(args, layout)
    data = train_gpt.load_corpus()
    f = sm.graph(step_of(trainer))
    for t in range(5):
        ids, targets = train_gpt.batch_at(data, t, args.batch, args.seq, args.seed)
        f(ids, targets)
    per, counts, outside, out = replay_allocations(f, ids, targets)
    assert outside == _outside_bytes(f) == _loss_bytes(out), (outside, per)
    if dtype == "float16":
        assert not {k: v for k, v in per.items() if v}, per
        return
    with counting() as sizes:
        f(ids, targets)
    assert max(sizes) <= 4 and sum(sizes) < 2048, sorted(sizes)[-5:]
