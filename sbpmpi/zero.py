"""Deprecated: ZeRO moved to :mod:`sbpmpi.parallel.zero` (``sm.nn.shard`` is unchanged).
This alias warns on import and goes in the next release."""

from __future__ import annotations

import warnings

from .parallel.zero import GatherAfterStep, ShardedOptimizer, ZeroModule, shard

__all__ = ["shard", "ShardedModule", "ShardedOptimizer", "GatherAfterStep"]

#: the stages' common base: ``isinstance(model, ShardedModule)`` keeps working
ShardedModule = ZeroModule

warnings.warn("sbpmpi.zero moved to sbpmpi.parallel.zero (sm.nn.shard is unchanged); the "
              "old name goes in the next release", DeprecationWarning, stacklevel=2)
