"""``sm.graph`` on the GPT of examples/train_gpt.py: captured and eager steps give
bit-identical losses and parameters over 50 steps in every layout that fits the world;
a replay makes exactly the eager step's collectives (``sm.trace``)."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest
from mpi4py import MPI

import sbpmpi as sm

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "examples"))
import train_gpt  # noqa: E402

size = MPI.COMM_WORLD.Get_size()
SMALL = ["--layers", "1", "--heads", "4", "--dim", "8", "--seq", "8", "--batch", "5",
         "--clip", "0", "--steps", "50", "--warmup", "3"]


def fitting_layouts() -> list[str]:
    return ["dp", "tp", "sp"] + (["2d"] if size % 2 == 0 else [])


def step_of(trainer):
    def step(ids, targets):
        trainer.optimizer.zero_grad()
        loss = trainer.loss(ids, targets)
        loss.backward()
        trainer.optimizer.step()
        trainer.scheduler.step()
        return loss
    return step


def train(layout: str, captured: bool, steps: int = 50, dtype: str = "float64",
          buckets: str = "on", extra: tuple[str, ...] = ()):
    args = train_gpt.parse(SMALL + ["--layout", layout, "--dtype", dtype,
                                    "--buckets", buckets, *extra])
    trainer = train_gpt.build(args, layout)
    data = train_gpt.load_corpus()
    step = step_of(trainer)
    if captured:
        step = sm.graph(step)
    losses = []
    for t in range(steps):
        ids, targets = train_gpt.batch_at(data, t, args.batch, args.seq, args.seed)
        losses.append(step(ids, targets).numpy())
    params = {k: p.numpy() for k, p in trainer.model.named_parameters()}
    return np.array(losses), params, step


@pytest.mark.mpi(min_size=1)
@pytest.mark.parametrize("layout", ["dp", "tp", "sp", "2d", "dp-unbucketed"])
def test_captured_gpt_steps_are_bit_identical_to_eager(layout):
    """dp and 2d with the example's gradient buckets (sm.nn.DataParallel), and dp
    without (one all-reduce per parameter when backward reaches it)."""
    layout, _, unbucketed = layout.partition("-")
    if layout not in fitting_layouts():
        pytest.skip(f"{layout} does not fit {size} ranks")
    buckets = "off" if unbucketed else "on"
    want, pw, _ = train(layout, False, buckets=buckets)
    got, pg, step = train(layout, True, buckets=buckets)
    assert np.array_equal(got, want), (got - want)
    for k in pw:
        assert np.array_equal(pg[k], pw[k]), k
    assert step.explain().signatures[0][1].startswith("replayed 48 time(s)")
    assert np.isfinite(want).all() and want[-1] < want[0]  # it trains


@pytest.mark.mpi(min_size=1)
def test_captured_gpt_float32_is_bit_identical():
    layout = "2d" if size % 2 == 0 else "tp"
    want, pw, _ = train(layout, False, steps=6, dtype="float32")
    got, pg, _ = train(layout, True, steps=6, dtype="float32")
    assert np.array_equal(got, want)
    assert all(np.array_equal(pg[k], pw[k]) for k in pw)


@pytest.mark.mpi(min_size=1)
@pytest.mark.parametrize("layout", ["dp", "tp", "sp", "2d"])
@pytest.mark.parametrize("how", ["bfloat16", "float16", "recompute-full",
                                 "recompute-selective"])
def test_captured_mixed_precision_and_recomputation_are_bit_identical(how, layout):
    """The example's half-width forward (float32 masters under ``sm.autocast``; the
    step without a loss scaler, whose check for infinities reads the host) and its
    blocks under ``sm.nn.checkpoint``, captured: the eager step's losses and parameters,
    bit for bit, over 8 steps."""
    if layout not in fitting_layouts():
        pytest.skip(f"{layout} does not fit {size} ranks")
    if how.startswith("recompute"):
        extra = ("--recompute", how.split("-")[1])
        dtype = "float64"
    else:
        extra, dtype = (), how
    want, pw, _ = train(layout, False, steps=8, dtype=dtype, extra=extra)
    got, pg, step = train(layout, True, steps=8, dtype=dtype, extra=extra)
    assert np.array_equal(got, want), (got, want)
    for k in pw:
        assert np.array_equal(pg[k], pw[k]), k
    assert step.explain().signatures[0][1].startswith("replayed 6 time(s)")


@pytest.mark.mpi(min_size=1)
@pytest.mark.parametrize("layout", ["dp", "tp", "sp"])
def test_a_replay_makes_exactly_the_eager_steps_collectives(layout):
    args = train_gpt.parse(SMALL + ["--layout", layout])  # dp: with buckets
    data = train_gpt.load_corpus()
    counts = []
    for captured in (False, True):
        trainer = train_gpt.build(args, layout)
        step = step_of(trainer)
        if captured:
            step = sm.graph(step)
        for t in range(3):  # two captures, then a replay
            ids, targets = train_gpt.batch_at(data, t, args.batch, args.seq, args.seed)
            with sm.trace() as tr:
                step(ids, targets)
        counts.append([(r.op, r.nbytes, r.group_ranks, r.nonblocking) for r in tr.records])
    assert counts[1] == counts[0]
    if size > 1:
        assert counts[0]  # the layouts communicate
