"""The schedules: which stage runs which micro-batch's forward or backward, in what order.

Each schedule says, for each placement of the pipeline, the order of its actions
(:meth:`_Schedule.orders`: GPipe, 1F1B, interleaved 1F1B); :func:`merge_orders` weaves
them into one program that every rank runs (SPMD), each placement's actions in its own
order, each action after the ones it needs. A rank computes only its own stages' actions
(elsewhere its shards are empty), and waits only where a transfer it needs has not
arrived: activations go forward and gradients backward as non-blocking conversions
(``runtime.start_redistribute``) started as soon as the tensor exists and waited for
where it is used, so the placements work on different micro-batches at once.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from typing import Any, NamedTuple

import numpy as np

from ..comm import trace as comm_trace
from ..conversion import destination
from ..core.layout import Layout
from ..core.placement import Placement
from ..core.sbp import broadcast
from ..grad_mode import no_grad
from ..runtime.consistency import check_step, conversion_check
from ..runtime.redistribution import PendingConversion, start_redistribute
from ..tensor import GlobalTensor
from .microbatch import batch_size, microbatch_bounds, split_microbatches
from .stage import PipelineStage

__all__ = ["Action", "merge_orders", "ScheduleGPipe", "Schedule1F1B",
           "ScheduleInterleaved1F1B"]

LossFn = Callable[[GlobalTensor, Any], GlobalTensor]


class Action(NamedTuple):
    """One stage's forward (``"F"``) or backward (``"B"``) of one micro-batch."""

    kind: str
    stage: int
    microbatch: int

    def __str__(self) -> str:
        return f"{self.kind}{self.stage}.{self.microbatch}"


def _needs(a: Action, num_stages: int) -> tuple[Action, ...]:
    """The actions whose results ``a`` uses."""
    if a.kind == "F":
        return () if a.stage == 0 else (Action("F", a.stage - 1, a.microbatch),)
    last = a.stage == num_stages - 1
    return ((Action("F", a.stage, a.microbatch),) if last else
            (Action("F", a.stage, a.microbatch), Action("B", a.stage + 1, a.microbatch)))


def merge_orders(orders: Sequence[Sequence[Action]], num_stages: int) -> list[Action]:
    """One program from the placements' orders: in rounds, each placement's next action
    if what it needs is done (as if each action took one tick). Raises RuntimeError when
    the orders cannot all finish (a schedule that would deadlock)."""
    pos = [0] * len(orders)
    done: set[Action] = set()
    program: list[Action] = []
    total = sum(len(o) for o in orders)
    while len(program) < total:
        ready = [o[pos[i]] for i, o in enumerate(orders)
                 if pos[i] < len(o) and all(n in done for n in _needs(o[pos[i]], num_stages))]
        if not ready:
            stuck = [str(o[pos[i]]) for i, o in enumerate(orders) if pos[i] < len(o)]
            raise RuntimeError(f"pipeline schedule cannot proceed: the next actions "
                               f"{stuck} each wait for another")
        for a in ready:
            i = next(i for i, o in enumerate(orders) if pos[i] < len(o) and o[pos[i]] == a)
            pos[i] += 1
        done.update(ready)
        program.extend(ready)
    return program


class _Schedule:
    """What every schedule shares: arguments, the program, and :meth:`step`."""

    def __init__(self, stages: Sequence[PipelineStage], n_microbatches: int,
                 loss_fn: LossFn) -> None:
        stages = list(stages) if isinstance(stages, (list, tuple)) else stages
        if not isinstance(stages, list) or not stages or not all(
                isinstance(s, PipelineStage) for s in stages):
            raise TypeError(f"{type(self).__name__}: stages must be a non-empty list of "
                            f"PipelineStage, got {stages!r}")
        n = len(stages)
        for i, s in enumerate(stages):
            if s.stage_index != i or s.num_stages != n:
                raise ValueError(f"{type(self).__name__}: stages must be every stage in "
                                 f"order; position {i} holds stage {s.stage_index} of "
                                 f"{s.num_stages}, expected stage {i} of {n}")
        if not isinstance(n_microbatches, int) or isinstance(n_microbatches, bool) \
                or n_microbatches < 1:
            raise ValueError(f"{type(self).__name__}: n_microbatches must be a positive "
                             f"int, got {n_microbatches!r}")
        if not callable(loss_fn):
            raise TypeError(f"{type(self).__name__}: loss_fn must be callable, got "
                            f"{type(loss_fn).__name__}")
        types = {s.placement.type for s in stages}
        if len(types) != 1:
            raise ValueError(f"{type(self).__name__}: the stages' placements must have one "
                             f"device type, got {sorted(types)}")
        self.stages = stages
        self.n_microbatches = n_microbatches
        self.loss_fn = loss_fn
        self.placements = self._placements()
        ranks = sorted({int(r) for s in stages for r in s.placement.ranks.reshape(-1)})
        #: the whole job's placement: every rank of every stage (the loss lives here)
        self.job_placement = Placement(types.pop(), ranks)
        self.program = merge_orders(self.orders(), n)

    def _placements(self) -> list[Placement]:
        """The distinct placements, one per stage here (interleaved: stage i on i mod p)."""
        return [s.placement for s in self.stages]

    def orders(self) -> list[list[Action]]:
        """Each placement's actions in its order."""
        raise NotImplementedError

    # -- the step ----------------------------------------------------------------------------

    def step(self, *inputs: Any, target: Any = None,
             losses: list[Any] | None = None) -> GlobalTensor:
        """Forward and backward of one global batch in micro-batches.

        ``inputs`` (GlobalTensors on stage 0's placement) and ``target`` (a GlobalTensor
        on the last stage's placement or a NumPy array, the same on every rank) are split
        along dim 0 as ``np.array_split`` does. The gradient of the mean of the
        micro-batch losses ``loss_fn(output, target_m)`` is accumulated into every
        parameter's ``.grad`` in its own layout (zero them first, as in torch). Returns
        that mean, 0-d and broadcast on the whole job's placement; ``losses``, when a
        list, gets each micro-batch's loss (0-d, on the last stage's placement).
        """
        name = type(self).__name__
        if not inputs:
            raise TypeError(f"{name}.step: needs at least one input")
        first, last = self.stages[0], self.stages[-1]
        for i, x in enumerate(inputs):
            if not isinstance(x, GlobalTensor) or x.placement != first.placement:
                where = x.placement if isinstance(x, GlobalTensor) else type(x).__name__
                raise ValueError(f"{name}.step: input {i} must be a GlobalTensor on stage "
                                 f"0's placement {first.placement}, got {where}")
        rows = {batch_size(x, f"input {i}") for i, x in enumerate(inputs)}
        if target is not None:
            rows.add(batch_size(target, "target"))
            if isinstance(target, GlobalTensor) and target.placement != last.placement:
                raise ValueError(f"{name}.step: target must live on the last stage's "
                                 f"placement {last.placement}, got {target.placement}")
        if len(rows) != 1:
            raise ValueError(f"{name}.step: inputs and target must have the same batch "
                             f"size along dim 0, got {sorted(rows)}")
        if losses is not None and not isinstance(losses, list):
            raise TypeError(f"{name}.step: losses must be a list or None, got "
                            f"{type(losses).__name__}")
        bounds = microbatch_bounds(rows.pop(), self.n_microbatches)
        split = [split_microbatches(x, bounds) for x in inputs]
        targets = split_microbatches(target, bounds)
        for s in self.stages:
            s.reset()
        try:
            mb_losses = self._run([tuple(col) for col in zip(*split)], targets)
        finally:
            for s in self.stages:
                s._held.clear()
        if losses is not None:
            losses.extend(mb_losses)
        with no_grad():
            total = mb_losses[0]
            for loss in mb_losses[1:]:
                total = total + loss
            mean = total / len(mb_losses)
            return mean.to_global(placement=self.job_placement,
                                  sbp=(broadcast,) * self.job_placement.ndim)

    def _run(self, inputs: list[tuple[Any, ...]], targets: list[Any]) -> list[GlobalTensor]:
        """Run the program; the micro-batches' losses (detached), in order."""
        scale = 1.0 / self.n_microbatches
        acts: dict[tuple[int, int], _InFlight] = {}  # (stage, mb) -> its input in flight
        grads: dict[tuple[int, int], _InFlight] = {}  # (stage, mb) -> its output's grad
        mb_losses: dict[int, GlobalTensor] = {}
        for a in self.program:
            stage = self.stages[a.stage]
            m = a.microbatch
            if a.kind == "F":
                args = inputs[m] if a.stage == 0 else (acts.pop((a.stage, m)).wait(stage, m),)
                out = stage.forward_one(m, args)
                if stage.is_last:
                    loss = self.loss_fn(out, targets[m])
                    if not isinstance(loss, GlobalTensor) or loss.shape != ():
                        raise TypeError(f"{type(self).__name__}: loss_fn must return a 0-d "
                                        f"GlobalTensor, got {getattr(loss, 'shape', loss)!r}")
                    stage.hold_root(m, loss * scale)
                    mb_losses[m] = loss.detach()
                else:
                    nxt = self.stages[a.stage + 1]
                    acts[(a.stage + 1, m)] = _send(out.detach(), nxt.placement,
                                                   _input_sbp(out, nxt), stage, m)
            else:
                g = None if stage.is_last else grads.pop((a.stage, m)).wait(stage, m)
                gin = stage.backward_one(m, g)
                if gin is not None:
                    prev = self.stages[a.stage - 1]
                    out_prev = prev.output_of(m)
                    grads[(a.stage - 1, m)] = _send(gin, out_prev.placement, out_prev.sbp,
                                                    stage, m)
        assert not acts and not grads, "the program left transfers unused"
        return [mb_losses[m] for m in range(len(inputs))]


def _input_sbp(out: GlobalTensor, nxt: PipelineStage) -> Any:
    """The SBP of ``out`` on the next stage: its ``input_sbp``, else ``out``'s own SBP
    where the meshes have as many axes, else broadcast."""
    if nxt.input_sbp is not None:
        return nxt.input_sbp
    if nxt.placement.ndim == out.placement.ndim:
        return out.sbp
    return (broadcast,) * nxt.placement.ndim


class _InFlight(NamedTuple):
    """A tensor on its way to another placement: the conversion and its destination."""

    pending: PendingConversion
    layout: Layout
    dtype: np.dtype

    def wait(self, stage: PipelineStage, microbatch: int) -> GlobalTensor:
        t0 = time.perf_counter()
        local = self.pending.wait()
        if comm_trace.ACTIVE and stage.is_member:
            comm_trace.record_interval(comm_trace.Interval(
                "wait", stage.stage_index, microbatch, t0, time.perf_counter()))
        return GlobalTensor(local, self.layout, self.dtype)


def _send(x: GlobalTensor, placement: Placement, sbp: Any, stage: PipelineStage,
          microbatch: int) -> _InFlight:
    """Start moving ``x`` to ``placement`` with ``sbp`` (collective on every rank, in
    program order; the same check as ``x.to_global``)."""
    t0 = time.perf_counter()
    check_step("to_global", conversion_check(x, placement, sbp))
    dst = destination(x, placement, sbp)
    pending = start_redistribute(x.to_local(), x.layout, dst, x.dtype)
    if comm_trace.ACTIVE and stage.is_member:
        comm_trace.record_interval(comm_trace.Interval(
            "send", stage.stage_index, microbatch, t0, time.perf_counter()))
    return _InFlight(pending, dst, x.dtype)


class ScheduleGPipe(_Schedule):
    """GPipe: every micro-batch's forward, then every backward; a stage holds all ``M``
    micro-batches' activations at once. Bubble ``(p - 1) / (M + p - 1)``."""

    def orders(self) -> list[list[Action]]:
        m = self.n_microbatches
        return [[Action("F", s, i) for i in range(m)] + [Action("B", s, i) for i in range(m)]
                for s in range(len(self.stages))]


class Schedule1F1B(_Schedule):
    """1F1B: stage ``s`` of ``p`` runs ``p - 1 - s`` forwards, then alternates one forward
    and one backward, then the remaining backwards; a stage holds at most ``p - s``
    micro-batches' activations. Same bubble as GPipe."""

    def orders(self) -> list[list[Action]]:
        m, p = self.n_microbatches, len(self.stages)
        out = []
        for s in range(p):
            warm = min(p - 1 - s, m)
            order = [Action("F", s, i) for i in range(warm)]
            for i in range(m - warm):
                order += [Action("F", s, warm + i), Action("B", s, i)]
            order += [Action("B", s, i) for i in range(m - warm, m)]
            out.append(order)
        return out


class ScheduleInterleaved1F1B(_Schedule):
    """Interleaved 1F1B (Megatron's virtual stages): ``v`` stages per placement, stage
    ``i`` on placement ``i mod p``; each placement runs its chunks' forwards in groups of
    ``p`` micro-batches, warms up with ``2 (p - 1 - r) + (v - 1) p`` forwards, then
    alternates. ``n_microbatches`` must be a multiple of ``p``. Bubble
    ``(p - 1) / (v M + p - 1)``."""

    def _placements(self) -> list[Placement]:
        n = len(self.stages)
        ps: list[Placement] = []
        for s in self.stages:  # the distinct placements, in their first stages' order
            if s.placement not in ps:
                ps.append(s.placement)
        p = len(ps)
        name = type(self).__name__
        if n % p:
            raise ValueError(f"{name}: {n} stages on {p} placements: the number of stages "
                             f"must be a multiple of the number of placements")
        for i, s in enumerate(self.stages):
            if s.placement != ps[i % p]:
                raise ValueError(f"{name}: stage {i} must live on placement {i % p} "
                                 f"({ps[i % p]}), got {s.placement}")
        if len({tuple(pl.rank_list) for pl in ps}) != p or len(
                {r for pl in ps for r in pl.rank_list}) != sum(pl.size for pl in ps):
            raise ValueError(f"{name}: the {p} placements must not share ranks")
        if self.n_microbatches % p:
            raise ValueError(f"{name}: n_microbatches must be a multiple of the number of "
                             f"placements {p}, got {self.n_microbatches}")
        return ps

    def orders(self) -> list[list[Action]]:
        m, p = self.n_microbatches, len(self.placements)
        v = len(self.stages) // p
        total = m * v

        def chunk_mb(k: int, forward: bool) -> tuple[int, int]:
            chunk = (k // p) % v
            return (chunk if forward else v - 1 - chunk), (k // (p * v)) * p + k % p

        out = []
        for r in range(p):
            warm = min((p - 1 - r) * 2 + (v - 1) * p, total)
            fwd = [Action("F", c * p + r, mb) for c, mb in
                   (chunk_mb(k, True) for k in range(total))]
            bwd = [Action("B", c * p + r, mb) for c, mb in
                   (chunk_mb(k, False) for k in range(total))]
            order = fwd[:warm]
            for i in range(total - warm):
                order += [fwd[warm + i], bwd[i]]
            order += bwd[total - warm:]
            out.append(order)
        return out
