"""Pipeline parallelism: stages on placements, micro-batches and the schedules that
overlap them (torch.distributed.pipelining's names).

- :mod:`.stage`: ``PipelineStage(module, stage_index, num_stages, placement)``.
- :mod:`.schedules`: ``ScheduleGPipe``, ``Schedule1F1B``, ``ScheduleInterleaved1F1B``
  (``stages, n_microbatches, loss_fn``), their ``step(*inputs, target=None, losses=None)``,
  and ``merge_orders``, which makes the one program every rank runs.
- :mod:`.microbatch`: the batch split along dim 0 as ``np.array_split`` does.
- :mod:`.picture`: the measured schedule (``sm.trace``'s intervals) as the classic
  pipeline picture, and its bubble fraction.
"""

from __future__ import annotations

from .microbatch import microbatch_bounds
from .picture import bubble_fraction, plot_schedule
from .schedules import (
    Action,
    Schedule1F1B,
    ScheduleGPipe,
    ScheduleInterleaved1F1B,
    merge_orders,
)
from .stage import PipelineStage

__all__ = ["PipelineStage", "ScheduleGPipe", "Schedule1F1B", "ScheduleInterleaved1F1B",
           "Action", "merge_orders", "microbatch_bounds", "bubble_fraction", "plot_schedule"]
