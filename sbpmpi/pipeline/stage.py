"""``PipelineStage``: a module whose parameters live on one placement, one stage of a
pipeline, and what it holds for each micro-batch between its forward and its backward."""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from .. import creation
from ..comm import trace as comm_trace
from ..core.placement import Placement
from ..core.sbp import SBP
from ..env import get_rank
from ..nn.module import Module
from ..tensor import GlobalTensor

__all__ = ["PipelineStage"]


@dataclass
class _Held:
    """What a stage keeps of one micro-batch from its forward to its backward: the input
    leaves whose gradients go back to the previous stage, and the output (or, on the last
    stage, the scaled loss) that backward starts from."""

    inputs: tuple[Any, ...]
    output: GlobalTensor
    nbytes: int
    root: GlobalTensor | None = None


def _local_nbytes(xs: Sequence[Any]) -> int:
    return sum(int(x.to_local().nbytes) for x in xs if isinstance(x, GlobalTensor))


class PipelineStage:
    """Stage ``stage_index`` of ``num_stages``: ``module``, whose parameters all live on
    ``placement`` (a sub-mesh of the job's mesh).

    Built alike on every rank (SPMD): every rank runs every stage's forward and backward
    in the schedule's order, and the ranks outside ``placement`` hold empty shards there,
    so they skip the stage's compute but not its program. Stage ``0`` takes the
    schedule's inputs; every other stage takes one tensor, the previous stage's output
    moved to ``placement`` with the SBP ``input_sbp`` (default: the previous output's SBP
    where the two meshes have the same number of axes, else broadcast); a stage returns
    one ``GlobalTensor`` (the last stage's goes to the schedule's ``loss_fn``).

    ``peak_held`` and ``peak_held_bytes`` say how many micro-batches' activations the
    stage held at once in the last ``step`` and their boundary tensors' bytes on this
    rank (the input and output of each, not the tape's saved tensors in between).
    """

    def __init__(self, module: Module, stage_index: int, num_stages: int,
                 placement: Placement, *, input_sbp: SBP | Sequence[SBP] | None = None
                 ) -> None:
        if not isinstance(module, Module):
            raise TypeError(f"PipelineStage: module must be an sm.nn.Module, got "
                            f"{type(module).__name__}")
        for name, value in (("stage_index", stage_index), ("num_stages", num_stages)):
            if not isinstance(value, int) or isinstance(value, bool):
                raise TypeError(f"PipelineStage: {name} must be an int, got {value!r}")
        if num_stages < 1 or not 0 <= stage_index < num_stages:
            raise ValueError(f"PipelineStage: stage_index must be in [0, num_stages), got "
                             f"stage_index={stage_index}, num_stages={num_stages}")
        if not isinstance(placement, Placement):
            raise TypeError(f"PipelineStage: placement must be an sm.Placement, got "
                            f"{type(placement).__name__}")
        for name, p in module.named_parameters():
            if p.placement != placement:
                raise ValueError(f"PipelineStage {stage_index}: parameter {name!r} lives on "
                                 f"{p.placement}, not on the stage's placement {placement}")
        self.module = module
        self.stage_index = stage_index
        self.num_stages = num_stages
        self.placement = placement
        self.input_sbp = input_sbp
        self._held: dict[int, _Held] = {}
        self.peak_held = 0
        self.peak_held_bytes = 0

    @property
    def is_first(self) -> bool:
        return self.stage_index == 0

    @property
    def is_last(self) -> bool:
        return self.stage_index == self.num_stages - 1

    @property
    def is_member(self) -> bool:
        """Whether this rank computes the stage (is in its placement)."""
        return get_rank() in self.placement

    def __repr__(self) -> str:
        return (f"PipelineStage({type(self.module).__name__}, stage {self.stage_index} of "
                f"{self.num_stages}, on {self.placement.ranks.tolist()})")

    # -- the schedule's calls ----------------------------------------------------------------

    def reset(self) -> None:
        """Forget held micro-batches (a failed step) and the peaks (a new step)."""
        self._held.clear()
        self.peak_held = 0
        self.peak_held_bytes = 0

    def release(self) -> None:
        """Forget held micro-batches (the step ended), keeping the peaks."""
        self._held.clear()

    def forward_one(self, microbatch: int, args: tuple[Any, ...]) -> GlobalTensor:
        """The stage's output for one micro-batch; its activations are held for backward.
        A non-first stage's input becomes a leaf whose gradient :meth:`backward_one`
        returns."""
        if not self.is_first:
            args = tuple(a.requires_grad_() if isinstance(a, GlobalTensor) else a
                         for a in args)
        out = self._run_forward(microbatch, args)
        nbytes = _local_nbytes(args) + _local_nbytes((out,))
        self._held[microbatch] = _Held(args, out, nbytes)
        self.peak_held = max(self.peak_held, len(self._held))
        self.peak_held_bytes = max(self.peak_held_bytes,
                                   sum(h.nbytes for h in self._held.values()))
        return out

    def forward_only(self, microbatch: int, args: tuple[Any, ...]) -> GlobalTensor:
        """The stage's output for one micro-batch of a forward-only step (run under
        ``sm.no_grad()``): nothing is held."""
        return self._run_forward(microbatch, args)

    def _run_forward(self, microbatch: int, args: tuple[Any, ...]) -> GlobalTensor:
        """The module's output for ``args``, checked to be one tensor, its interval
        recorded."""
        t0 = time.perf_counter()
        out = self.module(*args)
        if not isinstance(out, GlobalTensor):
            raise TypeError(f"PipelineStage {self.stage_index}: forward must return one "
                            f"GlobalTensor, got {type(out).__name__}")
        self._record("forward", microbatch, t0)
        return out

    def hold_root(self, microbatch: int, root: GlobalTensor) -> None:
        """Backward of ``microbatch`` starts from ``root`` (the last stage's scaled loss)."""
        self._held[microbatch].root = root

    def output_of(self, microbatch: int) -> GlobalTensor:
        return self._held[microbatch].output

    def backward_one(self, microbatch: int, gradient: GlobalTensor | None
                     ) -> GlobalTensor | None:
        """Backward of one micro-batch, from its held loss (``gradient`` None on the last
        stage) or from its output with ``gradient`` (None: its output needs no
        gradient); the parameters' gradients accumulate into their ``.grad``. Returns
        the gradient of the stage's input (None on the first stage) and forgets the
        micro-batch."""
        held = self._held.pop(microbatch)
        t0 = time.perf_counter()
        if gradient is None:
            if held.root is None and self.is_last:
                raise RuntimeError(f"PipelineStage {self.stage_index}: backward of "
                                   f"micro-batch {microbatch} without a gradient or loss")
            root = held.root if held.root is not None else held.output
        else:
            root = held.output
        # nothing to do where nothing needs a gradient (a first stage without parameters
        # whose inputs do not require grad): its output was sent no gradient
        if root.requires_grad:
            root.backward(gradient)
        self._record("backward", microbatch, t0)
        if self.is_first:
            return None
        x = held.inputs[0]
        if x.grad is None:  # the output does not depend on the input
            return creation.zeros(*x.shape, placement=x.placement, sbp=x.sbp, dtype=x.dtype)
        return x.grad

    def _record(self, kind: str, microbatch: int, t0: float) -> None:
        if comm_trace.ACTIVE and self.is_member:
            comm_trace.record_interval(comm_trace.Interval(
                kind, self.stage_index, microbatch, t0, time.perf_counter()))
