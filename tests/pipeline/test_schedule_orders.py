"""The schedules' programs, without data: each placement runs its actions in its
schedule's order, every action after what it needs; 1F1B's and interleaved 1F1B's warm-up;
an order that would deadlock is refused."""

from __future__ import annotations

import numpy as np
import pytest

import sbpmpi as sm
from sbpmpi.pipeline import (
    Action,
    PipelineStage,
    Schedule1F1B,
    ScheduleGPipe,
    ScheduleInterleaved1F1B,
    merge_orders,
)
from sbpmpi.pipeline.microbatch import microbatch_bounds


class Empty(sm.nn.Module):
    def forward(self, x):
        return x


def stages(n: int) -> list[PipelineStage]:
    pl = sm.placement("cpu", [0])
    return [PipelineStage(Empty(), i, n, pl) for i in range(n)]


def valid(program: list[Action], n: int, m: int) -> None:
    """Every action once; F after the previous stage's F, B after its F and the next
    stage's B."""
    at = {a: i for i, a in enumerate(program)}
    assert len(at) == len(program) == 2 * n * m
    for a, i in at.items():
        if a.kind == "F" and a.stage:
            assert at[Action("F", a.stage - 1, a.microbatch)] < i
        if a.kind == "B":
            assert at[Action("F", a.stage, a.microbatch)] < i
            if a.stage < n - 1:
                assert at[Action("B", a.stage + 1, a.microbatch)] < i


@pytest.mark.parametrize("n, m", [(1, 1), (2, 3), (4, 8), (4, 2), (3, 5)])
def test_gpipe_and_1f1b_programs(n, m):
    for cls in (ScheduleGPipe, Schedule1F1B):
        sched = cls(stages(n), m, lambda y, t: y)
        valid(sched.program, n, m)
        for s, order in enumerate(sched.orders()):
            assert [a for a in sched.program if a.stage == s] == order


def test_1f1b_order_of_a_stage():
    sched = Schedule1F1B(stages(4), 6, lambda y, t: y)
    got = [str(a) for a in sched.orders()[1]]
    assert got == ["F1.0", "F1.1", "F1.2", "B1.0", "F1.3", "B1.1", "F1.4", "B1.2", "F1.5",
                   "B1.3", "B1.4", "B1.5"]


def test_interleaved_program_on_one_placement():
    sched = ScheduleInterleaved1F1B(stages(4), 4, lambda y, t: y)
    valid(sched.program, 4, 4)


def test_merge_refuses_a_deadlock():
    orders = [[Action("B", 0, 0), Action("F", 0, 0)], [Action("F", 1, 0), Action("B", 1, 0)]]
    with pytest.raises(RuntimeError, match="cannot proceed"):
        merge_orders(orders, 2)


def test_microbatch_bounds_are_array_splits():
    for batch, n in [(11, 3), (8, 8), (7, 2), (5, 1)]:
        got = [b - a for a, b in microbatch_bounds(batch, n)]
        assert got == [len(c) for c in np.array_split(np.arange(batch), n)]
    with pytest.raises(ValueError, match="at least one row"):
        microbatch_bounds(3, 4)
