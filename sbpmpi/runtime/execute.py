"""Executor: compiles a boxing plan into this rank's program, run through :mod:`sbpmpi.comm` only.

Each step of a plan is compiled once per rank into a closure with its counts, shapes,
slices and communicator worked out (:mod:`.collective_steps`: the per-axis steps;
:mod:`.p2p_steps`: the steps between placements, whose blocks are this rank's own,
O(its peers)); running a plan then calls the closures in turn. Outputs are allocated
once and filled in place (large host outputs and scratch buffers reuse pooled memory,
see ``backend.empty``); every step leaves its input untouched. The code is the same for
NumPy and CuPy (``backend.get_xp``). :func:`sbpmpi.runtime.redistribute` is the one door
that runs programs.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from ..boxing.plan import Plan, Step
from ..core.layout import empty_shape
from .collective_steps import AXIS_COMPILERS, OWN_BLOCK_BYTES, AxisSetup
from .p2p_steps import (
    MAX_COUNT,
    P2P_COMPILERS,
    TAG,
    LocalCopy,
    Moves,
    Receive,
    Send,
    StartableFn,
    rank_moves,
    run_moves,
)

__all__ = ["Program", "compile_plan", "TAG", "MAX_COUNT", "OWN_BLOCK_BYTES", "AxisSetup",
           "Receive", "Send", "LocalCopy", "Moves", "rank_moves", "run_moves"]

Fn = Callable[[Any], Any]

class Program:
    """A plan compiled for one rank: call it with the rank's shard, get the new shard."""

    __slots__ = ("plan", "fns", "out_shape", "member")

    def __init__(self, plan: Plan, fns: Sequence[Fn], out_shape: tuple[int, ...],
                 member: bool) -> None:
        self.plan = plan
        self.fns = tuple(fns)
        self.out_shape = out_shape
        self.member = member

    def __call__(self, local: Any) -> Any:
        a = local
        for f in self.fns:
            a = f(a)
        if not self.member:
            return np.empty(self.out_shape, dtype=local.dtype)
        return a

    def start(self, local: Any) -> Callable[[], Any] | None:
        """Post the messages of a program whose only step on this rank is point-to-point
        (``send_recv``) and return the function that waits and returns the new shard;
        None for any other program (run it by calling it)."""
        if len(self.fns) != 1 or not isinstance(self.fns[0], StartableFn):
            return None
        finish = self.fns[0].start(local)
        if self.member:
            return finish
        shape, dtype = self.out_shape, local.dtype

        def finish_empty() -> Any:
            finish()
            return np.empty(shape, dtype=dtype)

        return finish_empty


def compile_plan(plan: Plan, me: int) -> Program:
    """Compile ``plan`` for world rank ``me`` (creates the communicators it needs)."""
    fns: list[Fn] = []
    for st in plan.steps:
        f = _COMPILERS[st.kind](st, me)
        if f is not None:
            fns.append(f)
    dst = plan.dst
    member = me in dst.placement
    return Program(plan, fns, dst.local_shape(me) if member else empty_shape(len(dst.shape)),
                   member)


_COMPILERS: dict[str, Callable[[Step, int], Fn | None]] = {**AXIS_COMPILERS, **P2P_COMPILERS}
