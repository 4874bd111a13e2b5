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

import contextlib
import time
from collections.abc import Callable, Iterator, Sequence
from typing import Any, NamedTuple

import numpy as np

from ..capture.recorder import GraphBreak, user_line
from ..comm import trace as comm_trace
from ..conversion import destination
from ..core.layout import Layout
from ..core.modes import current_modes
from ..core.placement import Placement
from ..core.sbp import broadcast
from ..errors import PeerAbortedError
from ..grad_mode import is_grad_enabled, no_grad
from ..ops import cat
from ..runtime.consistency import check_step
from ..runtime.redistribution import PendingConversion, start_redistribute
from ..runtime.step_checks import conversion_check
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

        Under ``sm.no_grad()`` the step is forward-only, as :meth:`eval`.

        A step that raises (on every rank alike, as a ``loss_fn`` given a mis-shaped
        target does) first completes the transfers between stages it started, so that
        no message is left posted on a buffer it frees and the next step starts clean.
        """
        if not is_grad_enabled():
            return self._forward_only("step", inputs, target, losses)
        split, targets = self._prepare("step", inputs, target, losses)
        try:
            mb_losses = self._run(split, targets)
        finally:
            for s in self.stages:
                s.release()
        if losses is not None:
            losses.extend(mb_losses)
        with no_grad():
            total = mb_losses[0]
            for loss in mb_losses[1:]:
                total = total + loss
            mean = total / len(mb_losses)
            return mean.to_global(placement=self.job_placement,
                                  sbp=(broadcast,) * self.job_placement.ndim)

    def eval(self, *inputs: Any, target: Any = None,
             losses: list[Any] | None = None) -> GlobalTensor:
        """A forward-only step (torch's ``eval``; also ``step`` under ``sm.no_grad()``).

        Runs each micro-batch's forwards in the schedule's order, under ``sm.no_grad()``
        (nothing is held for a backward, no ``.grad`` changes), and returns the last
        stage's outputs concatenated along dim 0 (a GlobalTensor on its placement), as
        torch's ``step`` returns the merged outputs. ``losses``, when a list, gets each
        micro-batch's ``loss_fn(output, target_m)``; without it ``loss_fn`` is not called.
        """
        return self._forward_only("eval", inputs, target, losses)

    def _prepare(self, what: str, inputs: tuple[Any, ...], target: Any,
                 losses: list[Any] | None) -> tuple[list[tuple[Any, ...]], list[Any]]:
        """Check the arguments of a step (the same on every rank, before any
        communication); the micro-batches' inputs and targets."""
        name = f"{type(self).__name__}.{what}"
        # every rank of the capture: the same decision everywhere
        if current_modes().recorder is not None:
            raise GraphBreak(f"sm.graph: {name} at {user_line()} cannot be captured: its "
                             f"transfers between stages are started and waited for apart "
                             f"(runtime.start_redistribute), which a graph cannot replay; "
                             f"call the step outside sm.graph")
        if not inputs:
            raise TypeError(f"{name}: needs at least one input")
        first, last = self.stages[0], self.stages[-1]
        for i, x in enumerate(inputs):
            if not isinstance(x, GlobalTensor) or x.placement != first.placement:
                where = x.placement if isinstance(x, GlobalTensor) else type(x).__name__
                raise ValueError(f"{name}: input {i} must be a GlobalTensor on stage "
                                 f"0's placement {first.placement}, got {where}")
        rows = {batch_size(x, f"input {i}") for i, x in enumerate(inputs)}
        if target is not None:
            rows.add(batch_size(target, "target"))
            if isinstance(target, GlobalTensor) and target.placement != last.placement:
                raise ValueError(f"{name}: target must live on the last stage's "
                                 f"placement {last.placement}, got {target.placement}")
        if len(rows) != 1:
            raise ValueError(f"{name}: inputs and target must have the same batch "
                             f"size along dim 0, got {sorted(rows)}")
        if losses is not None and not isinstance(losses, list):
            raise TypeError(f"{name}: losses must be a list or None, got "
                            f"{type(losses).__name__}")
        bounds = microbatch_bounds(rows.pop(), self.n_microbatches)
        split = [split_microbatches(x, bounds) for x in inputs]
        for s in self.stages:
            s.reset()
        return [tuple(col) for col in zip(*split)], split_microbatches(target, bounds)

    def _forward_only(self, what: str, inputs: tuple[Any, ...], target: Any,
                      losses: list[Any] | None) -> GlobalTensor:
        """:meth:`eval`: the forwards of the program, the outputs concatenated."""
        split, targets = self._prepare(what, inputs, target, losses)
        with no_grad():
            outs, mb_losses = self._run_forward(split, targets, losses is not None)
            if losses is not None:
                losses.extend(mb_losses)
            return outs[0] if len(outs) == 1 else cat(outs, dim=0)

    def _loss(self, out: GlobalTensor, target: Any) -> GlobalTensor:
        loss = self.loss_fn(out, target)
        if not isinstance(loss, GlobalTensor) or loss.shape != ():
            raise TypeError(f"{type(self).__name__}: loss_fn must return a 0-d "
                            f"GlobalTensor, got {getattr(loss, 'shape', loss)!r}")
        return loss

    def _run(self, inputs: list[tuple[Any, ...]], targets: list[Any]) -> list[GlobalTensor]:
        """Run the program; the micro-batches' losses (detached), in order."""
        scale = 1.0 / self.n_microbatches
        flight = _Transfers()
        mb_losses: dict[int, GlobalTensor] = {}
        with flight.settled_on_error():
            for a in self.program:
                stage = self.stages[a.stage]
                m = a.microbatch
                if a.kind == "F":
                    args = inputs[m] if a.stage == 0 else (flight.arrive("F", a, stage),)
                    out = stage.forward_one(m, args)
                    if stage.is_last:
                        loss = self._loss(out, targets[m])
                        stage.hold_root(m, loss * scale)
                        mb_losses[m] = loss.detach()
                    else:
                        nxt = self.stages[a.stage + 1]
                        flight.start("F", a.stage + 1, m, out.detach(), nxt.placement,
                                     _input_sbp(out, nxt), stage)
                else:
                    # a stage whose output needs no gradient (a first stage without
                    # parameters) was sent none: the same metadata on every rank
                    g = None if stage.is_last or not stage.output_of(m).requires_grad \
                        else flight.arrive("B", a, stage)
                    gin = stage.backward_one(m, g)
                    if gin is not None:
                        out_prev = self.stages[a.stage - 1].output_of(m)
                        if out_prev.requires_grad:
                            flight.start("B", a.stage - 1, m, gin, out_prev.placement,
                                         out_prev.sbp, stage)
            flight.check_used()
        return [mb_losses[m] for m in range(len(inputs))]

    def _run_forward(self, inputs: list[tuple[Any, ...]], targets: list[Any],
                     with_losses: bool) -> tuple[list[GlobalTensor], list[GlobalTensor]]:
        """The forwards of the program (no_grad): the last stage's outputs and, when
        ``with_losses``, their losses, per micro-batch in order."""
        flight = _Transfers()
        outs: dict[int, GlobalTensor] = {}
        mb_losses: dict[int, GlobalTensor] = {}
        with flight.settled_on_error():
            for a in self.program:
                if a.kind != "F":
                    continue
                stage = self.stages[a.stage]
                m = a.microbatch
                args = inputs[m] if a.stage == 0 else (flight.arrive("F", a, stage),)
                out = stage.forward_only(m, args)
                if stage.is_last:
                    outs[m] = out
                    if with_losses:
                        mb_losses[m] = self._loss(out, targets[m])
                else:
                    nxt = self.stages[a.stage + 1]
                    flight.start("F", a.stage + 1, m, out, nxt.placement,
                                 _input_sbp(out, nxt), stage)
            flight.check_used()
        order = range(len(inputs))
        return [outs[m] for m in order], [mb_losses[m] for m in order if m in mb_losses]


class _Transfers:
    """The transfers between stages a step started and has not waited for yet, by
    direction (``"F"`` activations, ``"B"`` gradients), receiving stage and micro-batch.

    :meth:`settled_on_error`: a step that raises completes every transfer still in flight
    before the error leaves it. Every rank started the same transfers (the program is
    the same everywhere), so each posted receive has its send posted and waiting ends;
    cancelling instead would leave a message whose receive was cancelled (or the other
    way round) to match a later step's transfer between the same ranks. Until then the
    transfers hold their buffers: MPI still writes into them.
    """

    def __init__(self) -> None:
        self._open: dict[tuple[str, int, int], _InFlight] = {}

    def start(self, kind: str, stage: int, microbatch: int, x: GlobalTensor,
              placement: Placement, sbp: Any, sender: PipelineStage) -> None:
        self._open[(kind, stage, microbatch)] = _send(x, placement, sbp, sender, microbatch)

    def arrive(self, kind: str, a: Action, stage: PipelineStage) -> GlobalTensor:
        """The tensor of transfer ``kind`` into ``a``'s stage and micro-batch (waits)."""
        return self._open.pop((kind, a.stage, a.microbatch)).wait(stage, a.microbatch)

    def check_used(self) -> None:
        assert not self._open, f"the program left transfers unused: {sorted(self._open)}"

    @contextlib.contextmanager
    def settled_on_error(self) -> Iterator[None]:
        try:
            yield
        except BaseException:
            self._settle()
            raise

    def _settle(self) -> None:
        """Wait for every open transfer (in the order they were started). A peer that
        aborts the job meanwhile ends the wait: its buffers are kept, the job ends."""
        while self._open:
            key = next(iter(self._open))
            t = self._open[key]
            try:
                t.pending.wait()
            except PeerAbortedError:
                _UNSETTLED.append(self._open)  # MPI may still write into them
                self._open = {}
                raise
            except Exception:  # noqa: BLE001 - the step's own error is the one to raise
                pass
            del self._open[key]


# the transfers of a step ended by a peer's abort before they completed: kept alive until
# the abort ends this process, so that MPI never writes into freed memory
_UNSETTLED: list[dict[Any, Any]] = []


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
