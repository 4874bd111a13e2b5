"""Optimizers that update each rank's parameter shards in place, with no communication.

``p.grad`` has p's placement and SBP (backward boxes it there), so shard ``i`` of the
gradient belongs to shard ``i`` of the parameter and every update is local; the state
tensors (momentum, Adam moments) live in the parameter's layout too. Broadcast copies
stay identical because every rank applies the same arithmetic to the same values.

A parameter with a partial SBP is refused: its value is a sum (or max) over ranks, and
updates such as Adam's are not linear in the shards. Make such a tensor broadcast or
split first (``p.to_global(sbp=...)``) and use that as the parameter.

The rooms: :mod:`.optimizer` (the base class, its parameter groups, state and
``state_dict``; ``recorded_step``), :mod:`.sgd`, :mod:`.adam` (Adam and AdamW, and the
moment updates they share). Learning-rate schedules (torch's names and formulas) are
``sm.optim.lr_scheduler`` (:mod:`sbpmpi.optim.lr_scheduler`).
"""

from __future__ import annotations

from . import lr_scheduler
from .adam import Adam, AdamW
from .optimizer import Optimizer
from .optimizer import recorded_step as recorded_step  # the ZeRO wrappers' step
from .sgd import SGD

__all__ = ["Optimizer", "SGD", "Adam", "AdamW", "lr_scheduler"]
